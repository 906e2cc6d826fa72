//! Uninstall-on-exit `when-deleted`: on SIGTERM, whether the DaemonSet that runs this
//! agent is going away (then the agent removes what interlock added) or stays (a rollout,
//! a pod deletion, a node drain: everything stays, so no pod starts unprotected while the
//! next agent comes up).
//!
//! [`decide`] is the decision (pure); [`ask`] reads the agent's own Pod (its controlling
//! ownerReference) and that DaemonSet, within [`EXIT_CHECK_DEADLINE`] all told. Anything
//! it cannot find out is an error, on which the agent keeps everything: a config left
//! behind keeps pods protected, one removed by mistake opens a window.

use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::Client;

/// The longest the whole check may take (the pod, then its DaemonSet). The kubelet gives
/// the agent `terminationGracePeriodSeconds` (30 s in the manifests) to stop, and the
/// guard's own stop takes up to [`crate::STOP_GRACE`] alongside it.
pub const EXIT_CHECK_DEADLINE: Duration = Duration::from_secs(5);

/// The DaemonSet that controls the agent's pod, as the pod's ownerReference names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The DaemonSet's namespace (the pod's).
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID when the pod was created (or adopted).
    pub uid: String,
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DaemonSet {}/{} (UID {})",
            self.namespace, self.name, self.uid
        )
    }
}

/// What the API says of that DaemonSet now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// No DaemonSet of that name (404).
    Gone,
    /// A DaemonSet of that name.
    Present {
        /// Its UID.
        uid: String,
        /// Its `deletionTimestamp`, if it is being deleted (foreground deletion, or
        /// finalizers pending).
        deleting_since: Option<String>,
    },
}

/// What the agent does with interlock's files as it exits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitDecision {
    /// The DaemonSet is going away: remove what interlock added. Says why.
    Uninstall(String),
    /// The DaemonSet stays: keep everything. Says why.
    Keep(String),
}

/// Whether the DaemonSet `owner` is going away, from what the API `found`: gone, another
/// object of the same name (the one that ran this agent was deleted and re-created), or
/// marked for deletion → uninstall; the same object, not being deleted → keep.
pub fn decide(owner: &Owner, found: &Found) -> ExitDecision {
    match found {
        Found::Gone => ExitDecision::Uninstall(format!("{owner} is gone from the API")),
        Found::Present { uid, .. } if *uid != owner.uid => ExitDecision::Uninstall(format!(
            "{owner} was deleted: the DaemonSet of that name now is another one (UID {uid})"
        )),
        Found::Present {
            deleting_since: Some(at),
            ..
        } => ExitDecision::Uninstall(format!("{owner} is being deleted (since {at})")),
        Found::Present { .. } => ExitDecision::Keep(format!(
            "{owner} stays (a rollout, a pod deletion or a node drain)"
        )),
    }
}

/// The controlling DaemonSet of `pod`, from its ownerReferences; an error naming the pod
/// when it has none (an agent not run by a DaemonSet).
pub fn owner_of(pod: &Pod) -> Result<Owner, String> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| {
            o.controller == Some(true)
                && o.kind == "DaemonSet"
                && o.api_version.split('/').next() == Some("apps")
        })
        .map(|o| Owner {
            namespace: namespace.clone(),
            name: o.name.clone(),
            uid: o.uid.clone(),
        })
        .ok_or_else(|| {
            format!(
                "pod {namespace}/{name} is not controlled by a DaemonSet (no such ownerReference)"
            )
        })
}

/// Asks the API whether the DaemonSet that runs pod `namespace/name` (this agent) is
/// going away: reads the pod, then its controlling DaemonSet, within
/// [`EXIT_CHECK_DEADLINE`] all told. `Err` says why that could not be found out.
pub async fn ask(client: Client, namespace: &str, name: &str) -> Result<ExitDecision, String> {
    ask_within(client, namespace, name, EXIT_CHECK_DEADLINE).await
}

/// [`ask`] with another deadline.
pub async fn ask_within(
    client: Client,
    namespace: &str,
    name: &str,
    deadline: Duration,
) -> Result<ExitDecision, String> {
    let check = async {
        let pod = Api::<Pod>::namespaced(client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(|e| failed(&format!("reading this agent's pod {namespace}/{name}"), &e))?
            .ok_or_else(|| {
                format!(
                    "this agent's pod {namespace}/{name} is gone from the API already, so its \
                     DaemonSet is unknown"
                )
            })?;
        let owner = owner_of(&pod)?;
        let ds = Api::<DaemonSet>::namespaced(client, &owner.namespace)
            .get_opt(&owner.name)
            .await
            .map_err(|e| {
                failed(
                    &format!("reading DaemonSet {}/{}", owner.namespace, owner.name),
                    &e,
                )
            })?;
        let found = match ds {
            None => Found::Gone,
            Some(ds) => Found::Present {
                uid: ds.metadata.uid.unwrap_or_default(),
                deleting_since: ds.metadata.deletion_timestamp.map(|t| t.0.to_string()),
            },
        };
        Ok::<ExitDecision, String>(decide(&owner, &found))
    };
    match tokio::time::timeout(deadline, check).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "the Kubernetes API did not answer within {deadline:?}"
        )),
    }
}

/// One failed call, for the log: what was being read, and for a 403 which grant is
/// missing.
fn failed(doing: &str, e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 403 => format!(
            "{doing}: forbidden ({}); the agent needs get on pods and on apps/daemonsets in its \
             namespace (the Role and ClusterRole `interlock manifests` renders)",
            s.message
        ),
        _ => format!("{doing}: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    fn owner() -> Owner {
        Owner {
            namespace: "interlock-system".into(),
            name: "interlock-node".into(),
            uid: "u1".into(),
        }
    }

    #[test]
    fn uninstalls_only_when_the_daemonset_goes_away() {
        let o = owner();
        assert!(matches!(
            decide(&o, &Found::Gone),
            ExitDecision::Uninstall(w) if w.contains("is gone")
        ));
        assert!(matches!(
            decide(&o, &Found::Present { uid: "u2".into(), deleting_since: None }),
            ExitDecision::Uninstall(w) if w.contains("another one (UID u2)")
        ));
        assert!(matches!(
            decide(&o, &Found::Present { uid: "u1".into(), deleting_since: Some("2026-01-01T00:00:00Z".into()) }),
            ExitDecision::Uninstall(w) if w.contains("being deleted")
        ));
        assert!(matches!(
            decide(&o, &Found::Present { uid: "u1".into(), deleting_since: None }),
            ExitDecision::Keep(w) if w.contains("rollout")
        ));
    }

    #[test]
    fn the_owner_is_the_controlling_daemonset() {
        let reference = |kind: &str, api: &str, controller: Option<bool>| OwnerReference {
            api_version: api.into(),
            kind: kind.into(),
            name: "interlock-node".into(),
            uid: format!("{kind}-{controller:?}"),
            controller,
            ..Default::default()
        };
        let pod = |refs: Vec<OwnerReference>| Pod {
            metadata: ObjectMeta {
                namespace: Some("interlock-system".into()),
                name: Some("interlock-node-x".into()),
                owner_references: Some(refs),
                ..Default::default()
            },
            ..Default::default()
        };
        let p = pod(vec![
            reference("DaemonSet", "apps/v1", None),
            reference("ReplicaSet", "apps/v1", Some(true)),
            reference("DaemonSet", "apps/v1", Some(true)),
        ]);
        assert_eq!(
            owner_of(&p).unwrap(),
            Owner {
                namespace: "interlock-system".into(),
                name: "interlock-node".into(),
                uid: "DaemonSet-Some(true)".into()
            }
        );
        let e = owner_of(&pod(vec![reference(
            "DaemonSet",
            "extensions/v1beta1",
            None,
        )]))
        .unwrap_err();
        assert!(e.contains("interlock-system/interlock-node-x"), "{e}");
        assert!(owner_of(&pod(vec![])).is_err());
    }
}

//! The sandboxes half of `check node`: every ready sandbox on the node, listed over CRI,
//! with the verdict the agent's audit would give it. Read-only: nothing is repaired,
//! stopped or written.
//!
//! The decision is the audit's own: the pod's mesh decision
//! ([`interlock_redirect::decision::decide`] on the annotations the runtime holds, the
//! same the plugin got at ADD), the read-back of a meshed sandbox's netns cross-checked
//! with the plugin's record ([`interlock_agent::audit::inspect`]), and the verdict
//! ([`interlock_agent::audit::decide::judge`]).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use interlock_agent::audit::{self, Inspection};
use interlock_agent::audit::{decide, guarded};
use interlock_contract::config::{BackendChoice, PluginConfig};
use interlock_contract::pod::PodFacts;
use interlock_cri::{CriClient, SandboxFilter, SandboxState, SandboxStatus, Timeouts};
use interlock_redirect::backend::BackendKind;
use interlock_redirect::decision::Decision;
use serde::Serialize;

/// What listing the node's sandboxes gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxesSeen {
    /// Not asked (`--cri-endpoint none`).
    NotAsked,
    /// The runtime could not be asked: why.
    Unreachable(String),
    /// Every ready sandbox, with its verdict.
    Listed(Vec<SandboxDoc>),
}

/// A sandbox's verdict as `check` spells it (`-o json`: kebab-case).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SandboxVerdict {
    /// Meshed, and exactly its rules are in its netns.
    Protected,
    /// Meshed, and its rules are missing or differ.
    Unprotected,
    /// Not meshed, or excluded.
    NotMeshed,
    /// Could not be decided.
    Unknown,
}

impl SandboxVerdict {
    /// The word in the table.
    pub fn word(self) -> &'static str {
        match self {
            SandboxVerdict::Protected => "protected",
            SandboxVerdict::Unprotected => "UNPROTECTED",
            SandboxVerdict::NotMeshed => "not meshed",
            SandboxVerdict::Unknown => "unknown",
        }
    }
}

/// One sandbox in the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxDoc {
    /// The sandbox ID.
    pub id: String,
    /// `namespace/name` of its pod.
    pub pod: String,
    /// Its netns file, when the runtime named one.
    pub netns: Option<String>,
    /// The verdict.
    pub verdict: SandboxVerdict,
    /// Why, in words.
    pub reason: String,
}

/// The sandbox's entry from the audit's verdict.
pub fn doc(id: &str, pod: &str, netns: Option<&Path>, v: &decide::Verdict) -> SandboxDoc {
    let (verdict, reason) = match v {
        decide::Verdict::Protected => (
            SandboxVerdict::Protected,
            "meshed; its redirection reads back exactly as its spec".to_string(),
        ),
        decide::Verdict::Unprotected { reason } => (SandboxVerdict::Unprotected, reason.clone()),
        decide::Verdict::NotMeshed { reason } => (SandboxVerdict::NotMeshed, reason.clone()),
        decide::Verdict::Unknown { reason } => (SandboxVerdict::Unknown, reason.clone()),
    };
    SandboxDoc {
        id: id.to_string(),
        pod: pod.to_string(),
        netns: netns.map(|p| p.display().to_string()),
        verdict,
        reason,
    }
}

/// The backend to read a netns with when the plugin recorded none for it: the configured
/// one, or the node's detected one for `auto` (detected here, without writing the
/// agent's cache: `check` writes nothing).
pub(crate) fn backend_for(plugin: &PluginConfig) -> BackendKind {
    match plugin.backend {
        BackendChoice::Auto => interlock_redirect::backend::detect().kind,
        fixed => interlock_attach::protect::resolve_backend(fixed, &plugin.state_dir).0,
    }
}

/// The pod's mesh decision as the audit makes it: a host-network sandbox has no netns of
/// its own to redirect in, and a profile that reads the pod's spec (which the runtime
/// does not keep) is judged by the spec the plugin recorded when it installed the rules,
/// else by the spec's `facts` when the caller read them from the API ([`api_facts`]).
pub(crate) fn decision_of(
    plugin: &PluginConfig,
    s: &SandboxStatus,
    facts: Option<&PodFacts>,
) -> Decision {
    let meta = &s.metadata;
    interlock_redirect::decision::decide_sandbox(
        plugin,
        &meta.namespace,
        &meta.name,
        s.host_network,
        &s.annotations,
        facts,
    )
    .or_recorded(|| audit::recorded_spec(&plugin.state_dir, s.netns_path()?))
}

/// The decisions of `statuses`: [`decision_of`] each, and for those that need their pod's
/// spec and have no record of it, one read of their pods from the Kubernetes API (the
/// agent's credentials: in its pod, or `$KUBECONFIG`). A pod the API cannot give stays
/// [`Decision::NeedsPodSpec`], its reason saying why.
pub(crate) fn decisions_of(plugin: &PluginConfig, statuses: &[&SandboxStatus]) -> Vec<Decision> {
    let mut decisions: Vec<Decision> = statuses
        .iter()
        .map(|s| decision_of(plugin, s, None))
        .collect();
    let wanted: Vec<PodKey> = statuses
        .iter()
        .zip(&decisions)
        .filter(|(_, d)| matches!(d, Decision::NeedsPodSpec { .. }))
        .map(|(s, _)| PodKey::of(s))
        .collect();
    if wanted.is_empty() {
        return decisions;
    }
    let read = api_facts(&wanted);
    for (s, d) in statuses.iter().zip(decisions.iter_mut()) {
        let Decision::NeedsPodSpec { profile, reason } = d else {
            continue;
        };
        *d = match &read {
            Ok(found) => match found.get(&PodKey::of(s)) {
                Some(Ok(facts)) => decision_of(plugin, s, Some(facts)),
                Some(Err(why)) => Decision::NeedsPodSpec {
                    profile: *profile,
                    reason: format!("{reason}; the API: {why}"),
                },
                None => continue,
            },
            Err(why) => Decision::NeedsPodSpec {
                profile: *profile,
                reason: format!("{reason}; the API: {why}"),
            },
        };
    }
    decisions
}

/// A pod as its sandbox names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct PodKey {
    namespace: String,
    name: String,
    uid: String,
}

impl PodKey {
    fn of(s: &SandboxStatus) -> PodKey {
        PodKey {
            namespace: s.metadata.namespace.clone(),
            name: s.metadata.name.clone(),
            uid: s.metadata.uid.clone(),
        }
    }
}

/// How long reading the pods' specs from the API may take in all.
const API_BUDGET: Duration = Duration::from_secs(10);

/// The spec facts of `pods`, read from the API one GET each; per pod, why there are none
/// (gone, or another pod now has the name: its UID differs); the whole read fails when
/// there are no credentials or the API does not answer in [`API_BUDGET`].
pub(crate) fn api_facts(
    pods: &[PodKey],
) -> Result<BTreeMap<PodKey, Result<PodFacts, String>>, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    rt.block_on(async {
        let read = async {
            let Some((client, creds)) = interlock_agent::kubernetes::connect().await? else {
                return Err(
                    "no Kubernetes credentials to read the pod's spec with (not in a pod, no \
                     $KUBECONFIG, no ~/.kube/config)"
                        .to_string(),
                );
            };
            Ok(read_facts(client, &creds.to_string(), pods).await)
        };
        tokio::time::timeout(API_BUDGET, read)
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "the API did not answer within {} s",
                    API_BUDGET.as_secs()
                ))
            })
    })
}

/// [`api_facts`] with a client: one GET per pod. The pod is the sandbox's when its UID
/// is the sandbox's, or it is the mirror of that static pod (the agent's own test,
/// [`interlock_agent::kubernetes::pods::is_that_pod`]).
async fn read_facts(
    client: kube::Client,
    creds: &str,
    pods: &[PodKey],
) -> BTreeMap<PodKey, Result<PodFacts, String>> {
    use k8s_openapi::api::core::v1::Pod;
    use kube::Api;
    let mut out = BTreeMap::new();
    for key in pods {
        let api: Api<Pod> = Api::namespaced(client.clone(), &key.namespace);
        let got = match api.get_opt(&key.name).await {
            Ok(Some(pod))
                if key.uid.is_empty()
                    || interlock_agent::kubernetes::pods::is_that_pod(&pod, &key.uid) =>
            {
                Ok(interlock_agent::kubernetes::pods::pod_facts(&pod))
            }
            Ok(Some(_)) => {
                Err("the pod of that name is another pod now (its UID differs)".to_string())
            }
            Ok(None) => Err("the pod is gone".to_string()),
            Err(e) => Err(format!(
                "reading pod {}/{} with {creds}: {e}",
                key.namespace, key.name
            )),
        };
        out.insert(key.clone(), got);
    }
    out
}

/// A sandbox's status, or why it could not be read.
pub(crate) type StatusRead = Result<SandboxStatus, String>;

/// The status (verbose: with the netns) of every ready sandbox at `endpoint`, or only of
/// pod `(namespace, name)`'s; a sandbox gone since the list is left out, one whose status
/// cannot be read carries the error. Fails when the runtime cannot be asked.
pub(crate) fn ready_statuses(
    endpoint: &str,
    pod: Option<(&str, &str)>,
) -> Result<Vec<(String, StatusRead)>, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    let timeouts = Timeouts {
        connect: Duration::from_secs(2),
        call: Duration::from_secs(5),
        ..Timeouts::default()
    };
    rt.block_on(async {
        let cri = CriClient::connect_with(endpoint, timeouts).await?;
        let listed = cri.list_sandboxes(&SandboxFilter::ready()).await?;
        let mut out = Vec::with_capacity(listed.len());
        for s in listed.into_iter().filter(|s| {
            pod.is_none_or(|(ns, name)| s.metadata.namespace == ns && s.metadata.name == name)
        }) {
            match cri.sandbox_status(&s.id, true).await {
                Ok(st) => out.push((s.id, Ok(st))),
                // Gone between the list and the status: not on the node any more.
                Err(e) if e.is_not_found() => {}
                Err(e) => out.push((s.id, Err(e.to_string()))),
            }
        }
        Ok::<_, interlock_cri::CriError>(out)
    })
    .map_err(|e| e.to_string())
}

/// Lists the ready sandboxes at `endpoint` and judges each with `plugin` (the entry the
/// agent writes). Never fails: an unreachable runtime is [`SandboxesSeen::Unreachable`].
pub fn list(endpoint: &str, plugin: &PluginConfig) -> SandboxesSeen {
    let statuses = match ready_statuses(endpoint, None) {
        Ok(s) => s,
        Err(e) => return SandboxesSeen::Unreachable(e),
    };
    let backend = backend_for(plugin);
    let mut docs = Vec::new();
    let mut ready = Vec::new();
    for (id, status) in statuses {
        match status {
            Ok(s) => {
                if s.state == SandboxState::Ready && s.verbose.netns_closed != Some(true) {
                    ready.push((id, s));
                }
            }
            Err(e) => docs.push(doc(&id, "", None, &decide::Verdict::Unknown { reason: e })),
        }
    }
    if let Some(g) = guarded::GuardAudit::of(plugin) {
        docs.extend(guarded_docs(&g, &ready));
        return SandboxesSeen::Listed(sorted(docs));
    }
    let decisions = decisions_of(plugin, &ready.iter().map(|(_, s)| s).collect::<Vec<_>>());
    for ((id, status), decision) in ready.iter().zip(decisions) {
        let id = id.as_str();
        let pod = format!("{}/{}", status.metadata.namespace, status.metadata.name);
        let netns = status.netns_path();
        let verdict = match (&decision, netns) {
            (Decision::Meshed { spec, .. }, Some(path)) => {
                let spec = spec.as_installed();
                match audit::inspect(path, &spec, &plugin.state_dir, backend, id) {
                    Inspection::Gone => continue,
                    Inspection::Seen { rules, .. } => decide::judge(&decision, Some(&rules)),
                }
            }
            _ => decide::judge(&decision, None),
        };
        docs.push(doc(id, &pod, netns, &verdict));
    }
    SandboxesSeen::Listed(sorted(docs))
}

/// Worst first, then by pod: the table reads from what needs attention.
fn sorted(mut docs: Vec<SandboxDoc>) -> Vec<SandboxDoc> {
    docs.sort_by(|a, b| {
        rank(a.verdict)
            .cmp(&rank(b.verdict))
            .then_with(|| a.pod.cmp(&b.pod))
            .then_with(|| a.id.cmp(&b.id))
    });
    docs
}

/// Guard mode: the mesh's own plugin wrote the rules, in its own shape, so each sandbox
/// gets the verdict guard mode's audit gives it ([`guarded::judge_sandbox`]): recognised
/// as the mesh's plugin recognises it (the spec read from the API when it can be), and
/// proven captured by a connection once its proxy listens (with the port free only past
/// [`guarded::LISTEN_GRACE`], so as never to take a starting proxy's port); until then
/// unknown, "not probed yet".
fn guarded_docs(g: &guarded::GuardAudit, ready: &[(String, SandboxStatus)]) -> Vec<SandboxDoc> {
    let keys: Vec<PodKey> = ready
        .iter()
        .filter(|(_, s)| !s.host_network)
        .map(|(_, s)| PodKey::of(s))
        .collect();
    // Without the API the mesh's plugin decides on the annotations alone, as it does.
    let facts = if keys.is_empty() {
        BTreeMap::new()
    } else {
        api_facts(&keys).unwrap_or_default()
    };
    ready
        .iter()
        .filter_map(|(id, s)| {
            let f = facts.get(&PodKey::of(s)).and_then(|r| r.as_ref().ok());
            let judged = guarded::judge_sandbox(g, s, &s.annotations, f)?;
            let pod = format!("{}/{}", s.metadata.namespace, s.metadata.name);
            let mut d = doc(id, &pod, s.netns_path(), &judged.verdict);
            if d.verdict == SandboxVerdict::Protected {
                d.reason = format!(
                    "meshed by {}; a connection from inside the pod landed on its proxy's port",
                    g.mesh.plugin_type()
                );
            }
            Some(d)
        })
        .collect()
}

fn rank(v: SandboxVerdict) -> u8 {
    match v {
        SandboxVerdict::Unprotected => 0,
        SandboxVerdict::Unknown => 1,
        SandboxVerdict::Protected => 2,
        SandboxVerdict::NotMeshed => 3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn docs_carry_the_audits_verdicts_in_kebab_case() {
        let d = doc(
            "abc",
            "shop/web",
            Some(Path::new("/var/run/netns/x")),
            &decide::Verdict::Unprotected {
                reason: "meshed (istio) but …".into(),
            },
        );
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(v["verdict"], "unprotected");
        assert_eq!(v["netns"], "/var/run/netns/x");
        let n = doc(
            "abc",
            "shop/web",
            None,
            &decide::Verdict::NotMeshed { reason: "x".into() },
        );
        assert_eq!(serde_json::to_value(&n).unwrap()["verdict"], "not-meshed");
        assert!(rank(SandboxVerdict::Unprotected) < rank(SandboxVerdict::Protected));
    }

    #[test]
    fn host_network_sandboxes_are_not_meshed_whatever_their_annotations() {
        let mut a = BTreeMap::new();
        a.insert("interlock.dev/redirect".to_string(), "enabled".to_string());
        let status = |host_network, a: &BTreeMap<String, String>| SandboxStatus {
            id: "s".into(),
            metadata: interlock_cri::SandboxMetadata {
                name: "web".into(),
                namespace: "shop".into(),
                uid: "u".into(),
                attempt: 0,
            },
            state: SandboxState::Ready,
            created_at_nanos: 0,
            annotations: a.clone(),
            ips: vec![],
            host_network,
            runtime_handler: String::new(),
            verbose: Default::default(),
            info: BTreeMap::new(),
            labels: BTreeMap::new(),
        };
        let p = PluginConfig::default();
        assert!(matches!(
            decision_of(&p, &status(true, &a), None),
            Decision::NotMeshed { .. }
        ));
        assert!(matches!(
            decision_of(&p, &status(false, &a), None),
            Decision::Meshed { .. }
        ));
        // An Istio pod's spec is not in the runtime's copy: without a record of what the
        // plugin installed, the decision says so.
        a.insert("sidecar.istio.io/status".to_string(), "{}".to_string());
        a.remove("interlock.dev/redirect");
        assert!(matches!(
            decision_of(&p, &status(false, &a), None),
            Decision::NeedsPodSpec { .. }
        ));
    }

    /// A static pod's sandbox carries the kubelet's UID for it; the API holds its mirror,
    /// which names that UID in `kubernetes.io/config.mirror`: the same pod, not "another".
    #[test]
    fn a_static_pods_mirror_is_that_pod() {
        use interlock_testkit_node::kubeapi::KubeApi;
        let api = KubeApi::start().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kc = dir.path().join("kubeconfig");
        api.write_kubeconfig(&kc).unwrap();
        let pod = |name: &str, annotations: serde_json::Value| {
            api.put_object(serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "shop", "annotations": annotations},
                "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}]}}))
        };
        pod(
            "gate-n1",
            serde_json::json!({"kubernetes.io/config.mirror": "static-uid-1"}),
        );
        pod("web", serde_json::json!({}));
        let key = |name: &str, uid: &str| PodKey {
            namespace: "shop".into(),
            name: name.into(),
            uid: uid.into(),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let got = rt.block_on(async {
            let config = interlock_agent::kubernetes::config_from_kubeconfig(kc.to_str().unwrap())
                .await
                .unwrap();
            let client = kube::Client::try_from(config).unwrap();
            read_facts(
                client,
                "test",
                &[key("gate-n1", "static-uid-1"), key("web", "old-uid")],
            )
            .await
        });
        assert!(got[&key("gate-n1", "static-uid-1")].is_ok(), "{got:?}");
        let other = got[&key("web", "old-uid")].as_ref().unwrap_err();
        assert!(other.contains("another pod"), "{other}");
    }
}

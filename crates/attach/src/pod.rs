//! The decision input: which pod an attachment belongs to, and its annotations.
//!
//! `K8S_POD_NAMESPACE`, `K8S_POD_NAME` and `K8S_POD_UID` come from `CNI_ARGS` (pairs in
//! no fixed order, unknown keys ignored). Annotations come from
//! `runtimeConfig["io.kubernetes.cri.pod-annotations"]`, which containerd fills only for
//! entries declaring that capability, with `null` for a pod without annotations.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use interlock_contract::config::POD_ANNOTATIONS_CAPABILITY;
use interlock_contract::pod::PodFacts;

/// Who the pod is, as far as the runtime told us.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PodIdentity {
    /// `K8S_POD_NAMESPACE` (empty when not a Kubernetes pod).
    pub namespace: String,
    /// `K8S_POD_NAME`.
    pub name: String,
    /// `K8S_POD_UID` (older runtimes do not send it).
    pub uid: String,
    /// All pod annotations. `None`: the runtime did not pass them (capability not
    /// declared or runtime without support), so they are unknown; `Some(empty)`: the
    /// pod has none (containerd sends `null`).
    pub annotations: Option<BTreeMap<String, String>>,
    /// The facts of the pod's spec the profiles read, when the agent told them (the
    /// runtime never passes the spec).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub facts: Option<PodFacts>,
}

/// A decision input that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct IdentityError {
    /// Where: `runtimeConfig.io.kubernetes.cri.pod-annotations.<key>`, `CNI_ARGS`…
    pub field: String,
    /// What is wrong.
    pub problem: String,
}

/// Splits `CNI_ARGS` (`K=V;K=V`) into pairs; the value is everything after the first
/// `=`. Segments without `=` are returned as keys with an empty value.
pub fn parse_cni_args(args: &str) -> Vec<(String, String)> {
    args.split(';')
        .filter(|s| !s.is_empty())
        .map(|s| match s.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (s.to_string(), String::new()),
        })
        .collect()
}

impl PodIdentity {
    /// Reads the pod identity from `CNI_ARGS` and the stdin config's `runtimeConfig`.
    pub fn from_cni(
        cni_args: &str,
        config: &Map<String, Value>,
    ) -> Result<PodIdentity, IdentityError> {
        let mut id = PodIdentity::default();
        for (k, v) in parse_cni_args(cni_args) {
            match k.as_str() {
                "K8S_POD_NAMESPACE" => id.namespace = v,
                "K8S_POD_NAME" => id.name = v,
                "K8S_POD_UID" => id.uid = v,
                _ => {}
            }
        }
        id.annotations = annotations_from(config)?;
        Ok(id)
    }

    /// True when the runtime named a Kubernetes pod.
    pub fn is_kubernetes_pod(&self) -> bool {
        !self.namespace.is_empty() && !self.name.is_empty()
    }

    /// `namespace/name`, for messages.
    pub fn display_name(&self) -> String {
        if self.is_kubernetes_pod() {
            format!("{}/{}", self.namespace, self.name)
        } else {
            "(not a Kubernetes pod)".to_string()
        }
    }
}

fn annotations_from(
    config: &Map<String, Value>,
) -> Result<Option<BTreeMap<String, String>>, IdentityError> {
    let rc = match config.get("runtimeConfig") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(rc)) => rc,
        Some(other) => {
            return Err(IdentityError {
                field: "runtimeConfig".into(),
                problem: format!("expected an object, found {other}"),
            })
        }
    };
    let field = format!("runtimeConfig.{POD_ANNOTATIONS_CAPABILITY}");
    match rc.get(POD_ANNOTATIONS_CAPABILITY) {
        None => Ok(None),
        Some(Value::Null) => Ok(Some(BTreeMap::new())),
        Some(Value::Object(m)) => {
            let mut out = BTreeMap::new();
            for (k, v) in m {
                match v {
                    Value::String(s) => {
                        out.insert(k.clone(), s.clone());
                    }
                    other => {
                        return Err(IdentityError {
                            field: format!("{field}.{k}"),
                            problem: format!("expected a string, found {other}"),
                        })
                    }
                }
            }
            Ok(Some(out))
        }
        Some(other) => Err(IdentityError {
            field,
            problem: format!("expected an object or null, found {other}"),
        }),
    }
}

/// Where the annotations the decision used came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// The runtime passed them (or no lookup was needed).
    RuntimeConfig,
    /// The node agent's socket.
    Agent,
    /// Nothing answered.
    None,
    /// A source of an earlier version (the Kubernetes API), in state it recorded.
    #[serde(other)]
    Other,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Source::RuntimeConfig => "runtimeConfig",
            Source::Agent => "the agent",
            Source::Other => "an earlier version's source",
            Source::None => "no source",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn reads_containerd_style_args_and_annotations() {
        let conf = json!({"runtimeConfig": {"io.kubernetes.cri.pod-annotations": {"sidecar.istio.io/status": "{}", "a": "b"}}});
        let id = PodIdentity::from_cni(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=cart-0;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u-1",
            conf.as_object().unwrap(),
        )
        .unwrap();
        assert_eq!(
            (id.namespace.as_str(), id.name.as_str(), id.uid.as_str()),
            ("shop", "cart-0", "u-1")
        );
        assert_eq!(id.annotations.as_ref().unwrap()["a"], "b");
        assert!(id.is_kubernetes_pod());
        assert_eq!(id.display_name(), "shop/cart-0");
    }

    #[test]
    fn null_absent_and_invalid_annotations() {
        let null = json!({"runtimeConfig": {"io.kubernetes.cri.pod-annotations": null}});
        assert_eq!(
            PodIdentity::from_cni("", null.as_object().unwrap())
                .unwrap()
                .annotations,
            Some(BTreeMap::new())
        );
        let absent = json!({"runtimeConfig": {"portMappings": []}});
        assert_eq!(
            PodIdentity::from_cni("", absent.as_object().unwrap())
                .unwrap()
                .annotations,
            None
        );
        assert_eq!(
            PodIdentity::from_cni("", &Map::new()).unwrap().annotations,
            None
        );
        let bad = json!({"runtimeConfig": {"io.kubernetes.cri.pod-annotations": {"x": 1}}});
        let e = PodIdentity::from_cni("", bad.as_object().unwrap()).unwrap_err();
        assert_eq!(e.field, "runtimeConfig.io.kubernetes.cri.pod-annotations.x");
        let bad = json!({"runtimeConfig": {"io.kubernetes.cri.pod-annotations": []}});
        assert!(PodIdentity::from_cni("", bad.as_object().unwrap()).is_err());
    }

    #[test]
    fn values_may_contain_equals_and_junk_is_ignored() {
        let pairs = parse_cni_args("A=b=c;;junk;K8S_POD_NAME=x");
        assert_eq!(pairs[0], ("A".to_string(), "b=c".to_string()));
        let id = PodIdentity::from_cni("junk;K8S_POD_NAME=x;;", &Map::new()).unwrap();
        assert_eq!(id.name, "x");
        assert!(!id.is_kubernetes_pod());
    }

    proptest! {
        #[test]
        fn any_order_and_unknown_keys(
            ns in "[a-z0-9-]{1,20}", name in "[a-z0-9.-]{1,30}", uid in "[a-f0-9-]{0,36}",
            extra in prop::collection::vec(("[A-Z_]{1,12}", "[a-zA-Z0-9=._-]{0,12}"), 0..5),
            seed in any::<u64>(),
        ) {
            let mut pairs: Vec<(String, String)> = extra
                .into_iter()
                .filter(|(k, _)| !k.starts_with("K8S_POD_"))
                .collect();
            pairs.push(("K8S_POD_NAMESPACE".into(), ns.clone()));
            pairs.push(("K8S_POD_NAME".into(), name.clone()));
            pairs.push(("K8S_POD_UID".into(), uid.clone()));
            // Deterministic shuffle from the seed.
            let mut s = seed;
            for i in (1..pairs.len()).rev() {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                pairs.swap(i, (s >> 33) as usize % (i + 1));
            }
            let args = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(";");
            let id = PodIdentity::from_cni(&args, &Map::new()).unwrap();
            prop_assert_eq!(id.namespace, ns);
            prop_assert_eq!(id.name, name);
            prop_assert_eq!(id.uid, uid);
        }
    }
}

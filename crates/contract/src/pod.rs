//! What a mesh profile reads from a pod besides its annotations.
//!
//! The runtime hands the plugin the pod's annotations (the
//! `io.kubernetes.cri.pod-annotations` capability), never its spec. Some meshes' own CNI
//! plugins read the spec too — istio-cni takes the proxy's UID and GID from the
//! `istio-proxy` container's `securityContext`, DNS capture from its environment, and
//! skips pods that carry `istio-init`; linkerd-cni acts only on pods with a
//! `linkerd-proxy` container — so a profile that must equal its mesh needs those facts.
//! Only the agent has them (its pod cache); it sends them in the agent socket's `found`
//! answer as [`PodFacts`], cut down to what the profiles read so the message stays small
//! and the plugin parses little.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Containers whose security context, environment and first arguments the profiles read
/// (every other container is named only).
pub const PROXY_CONTAINERS: [&str; 2] = ["istio-proxy", "linkerd-proxy"];

/// Environment variables of a proxy container that the profiles read (istio-cni reads
/// these four from `istio-proxy`; only literal `value`s count, as there).
pub const PROXY_ENV: [&str; 4] = [
    "ISTIO_META_DNS_CAPTURE",
    "INVALID_DROP",
    "DISABLE_ENVOY",
    "ISTIO_DUAL_STACK",
];

/// Pod labels the profiles read.
pub const POD_LABELS: [&str; 2] = [
    "sidecar.istio.io/inject",
    "linkerd.io/control-plane-component",
];

/// How many of a proxy container's arguments are kept (istio-cni looks at two).
pub const PROXY_ARGS: usize = 2;

/// The facts of a pod's spec that the profiles read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodFacts {
    /// The pod's labels named in [`POD_LABELS`] that it carries.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Every container and init container, in spec order (init containers first).
    #[serde(default)]
    pub containers: Vec<ContainerFacts>,
}

/// One container of a pod.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerFacts {
    /// The container's name.
    pub name: String,
    /// An init container (native sidecars are init containers too).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub init: bool,
    /// `securityContext.runAsUser` of the container itself (proxy containers only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as_user: Option<i64>,
    /// `securityContext.runAsGroup` of the container itself (proxy containers only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as_group: Option<i64>,
    /// Literal values of the variables in [`PROXY_ENV`] (proxy containers only).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The first [`PROXY_ARGS`] arguments (proxy containers only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
}

impl PodFacts {
    /// The container (or init container) named `name`, if the pod has one.
    pub fn container(&self, name: &str) -> Option<&ContainerFacts> {
        self.containers.iter().find(|c| c.name == name)
    }

    /// True when the pod has a container or init container named `name`.
    pub fn has_container(&self, name: &str) -> bool {
        self.container(name).is_some()
    }
}

impl ContainerFacts {
    /// A container known by name only (what the facts keep of a non-proxy container).
    pub fn named(name: impl Into<String>, init: bool) -> ContainerFacts {
        ContainerFacts {
            name: name.into(),
            init,
            ..ContainerFacts::default()
        }
    }

    /// True when the container's facts beyond its name are kept.
    pub fn is_proxy(&self) -> bool {
        PROXY_CONTAINERS.contains(&self.name.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_round_trip_and_stay_small() {
        let facts = PodFacts {
            labels: [("sidecar.istio.io/inject".to_string(), "true".to_string())].into(),
            containers: vec![
                ContainerFacts::named("istio-validation", true),
                ContainerFacts::named("app", false),
                ContainerFacts {
                    name: "istio-proxy".into(),
                    run_as_user: Some(1337),
                    env: [("ISTIO_META_DNS_CAPTURE".to_string(), "true".to_string())].into(),
                    args: vec!["proxy".into(), "sidecar".into()],
                    ..ContainerFacts::default()
                },
            ],
        };
        let json = serde_json::to_string(&facts).unwrap();
        assert!(!json.contains("runAsGroup"), "{json}");
        assert!(json.contains(r#"{"name":"app"}"#), "{json}");
        let back: PodFacts = serde_json::from_str(&json).unwrap();
        assert_eq!(back, facts);
        assert!(back.has_container("istio-validation"));
        assert!(back.container("istio-proxy").unwrap().is_proxy());
        assert!(!back.has_container("istio-init"));
        // Unknown fields from a newer agent are ignored.
        let newer: PodFacts =
            serde_json::from_str(r#"{"containers":[{"name":"a","futureField":1}],"x":2}"#).unwrap();
        assert_eq!(newer.containers[0].name, "a");
    }
}

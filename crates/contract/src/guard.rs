//! Guard mode: interlock keeps a mesh's *own* CNI plugin (istio-cni, linkerd-cni,
//! consul-cni, kuma-cni) in the effective chain and writes no redirection rules itself.
//!
//! What the plugin, the agent and the CLI share about a guarded mesh: its name
//! ([`GuardedMesh`]), the plugin `type` that must run, the static facts of its installer
//! and proxy that guard mode depends on, and `interlock-cni`'s guard role in the chain
//! ([`GuardRole`]).
//!
//! The facts come from each mesh's own sources:
//! - istio/istio `cni/pkg/install/{install.go,cniconfig.go}`, `cni/pkg/plugin/plugin.go`,
//!   `tools/istio-iptables/pkg/constants/constants.go`;
//! - linkerd/linkerd2-proxy-init `internal/cni/*.go`, `cni-plugin/main.go`, and
//!   linkerd/linkerd2 `charts/linkerd2-cni/values.yaml`;
//! - hashicorp/consul-k8s `control-plane/subcommand/install-cni/*.go`,
//!   `control-plane/cni/main.go`, `sdk/iptables` of hashicorp/consul;
//! - kumahq/kuma `app/cni/pkg/install/*.go`, `app/cni/pkg/cni/*.go`,
//!   `pkg/transparentproxy/config/config.go`.

use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A mesh whose own CNI plugin interlock can guard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GuardedMesh {
    /// Istio in sidecar mode, plugin `istio-cni`.
    Istio,
    /// Linkerd, plugin `linkerd-cni`.
    Linkerd,
    /// consul-k8s transparent proxy, plugin `consul-cni`.
    Consul,
    /// Kuma, plugin `kuma-cni`.
    Kuma,
}

/// Where a mesh's installer puts its plugin entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstallerTarget {
    /// The first valid config file when the installer process starts; that file stays its
    /// target for the life of the process (istio-cni).
    FirstValidAtStart,
    /// Every `.conf`/`.conflist` file in the directory, again whenever one changes
    /// (linkerd-cni).
    EveryFile,
    /// The first valid file, chosen again on every directory event (consul-cni).
    FirstValidEachEvent,
    /// One file named in the mesh's chart (kuma-cni, `cni.confName`).
    NamedFile,
}

impl GuardedMesh {
    /// Every guarded mesh.
    pub const ALL: [GuardedMesh; 4] = [
        GuardedMesh::Istio,
        GuardedMesh::Linkerd,
        GuardedMesh::Consul,
        GuardedMesh::Kuma,
    ];

    /// The name used in configuration and flags (`istio`, `linkerd`, `consul`, `kuma`).
    pub fn as_str(self) -> &'static str {
        match self {
            GuardedMesh::Istio => "istio",
            GuardedMesh::Linkerd => "linkerd",
            GuardedMesh::Consul => "consul",
            GuardedMesh::Kuma => "kuma",
        }
    }

    /// The `type` (and binary name) of the mesh's CNI plugin.
    pub fn plugin_type(self) -> &'static str {
        match self {
            GuardedMesh::Istio => "istio-cni",
            GuardedMesh::Linkerd => "linkerd-cni",
            GuardedMesh::Consul => "consul-cni",
            GuardedMesh::Kuma => "kuma-cni",
        }
    }

    /// The mesh whose plugin has this `type`.
    pub fn from_plugin_type(t: &str) -> Option<GuardedMesh> {
        GuardedMesh::ALL.into_iter().find(|m| m.plugin_type() == t)
    }

    /// Where the installer writes its entry.
    pub fn installer_target(self) -> InstallerTarget {
        match self {
            GuardedMesh::Istio => InstallerTarget::FirstValidAtStart,
            GuardedMesh::Linkerd => InstallerTarget::EveryFile,
            GuardedMesh::Consul => InstallerTarget::FirstValidEachEvent,
            GuardedMesh::Kuma => InstallerTarget::NamedFile,
        }
    }

    /// True when the installer insists on its entry being the last plugin of the list
    /// and rewrites the file otherwise (consul-k8s). The others append last but accept
    /// any position.
    pub fn must_be_last(self) -> bool {
        self == GuardedMesh::Consul
    }

    /// True when the mesh's CNI DaemonSet runs with `hostNetwork`, so its own pod needs
    /// no CNI ADD to start. Only istio-cni's does: a hold that refused every pod would
    /// keep the other three installers off the node for good.
    pub fn installer_host_network(self) -> bool {
        self == GuardedMesh::Istio
    }

    /// The proxy's outbound capture port when nothing in the pod or entry says otherwise.
    pub fn default_outbound_port(self) -> u16 {
        match self {
            GuardedMesh::Istio | GuardedMesh::Consul | GuardedMesh::Kuma => 15001,
            GuardedMesh::Linkerd => 4140,
        }
    }

    /// The proxy's inbound capture port when nothing in the pod or entry says otherwise.
    pub fn default_inbound_port(self) -> u16 {
        match self {
            GuardedMesh::Istio | GuardedMesh::Kuma => 15006,
            GuardedMesh::Linkerd => 4143,
            GuardedMesh::Consul => 20000,
        }
    }

    /// The proxy's UID when nothing in the pod or entry says otherwise.
    pub fn default_proxy_uid(self) -> u32 {
        match self {
            GuardedMesh::Istio => 1337,
            GuardedMesh::Linkerd => 2102,
            GuardedMesh::Consul => 5995,
            GuardedMesh::Kuma => 5678,
        }
    }
}

impl std::fmt::Display for GuardedMesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A mesh name that is not one interlock can guard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownMesh(pub String);

impl std::fmt::Display for UnknownMesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "unknown guarded mesh {:?}: expected istio, linkerd, consul or kuma",
            self.0
        )
    }
}

impl std::error::Error for UnknownMesh {}

impl FromStr for GuardedMesh {
    type Err = UnknownMesh;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        GuardedMesh::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| UnknownMesh(s.to_string()))
    }
}

/// `interlock-cni`'s role in a guard-mode chain (the entry's `guard` field): it writes no
/// rules; it holds meshed pods back ("try again later") while the mesh's plugin cannot
/// run, and lets every other pod through, the mesh's own installer pod included.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GuardRole {
    /// The mesh whose plugin follows in the chain.
    pub mesh: GuardedMesh,
    /// True while the mesh's plugin is not in the chain: meshed pods are refused.
    #[serde(default)]
    pub hold: bool,
    /// Why the chain is held, for the error a refused pod gets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Namespaces the mesh's plugin never touches (copied from its entry).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude_namespaces: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for m in GuardedMesh::ALL {
            assert_eq!(m.as_str().parse::<GuardedMesh>().unwrap(), m);
            assert_eq!(GuardedMesh::from_plugin_type(m.plugin_type()), Some(m));
            let v = serde_json::to_value(m).unwrap();
            assert_eq!(v, serde_json::Value::String(m.as_str().into()));
        }
        let e = "cilium".parse::<GuardedMesh>().unwrap_err();
        assert!(e.to_string().contains("cilium"));
        assert_eq!(GuardedMesh::from_plugin_type("interlock-cni"), None);
    }

    #[test]
    fn role_serialises_with_camel_case_and_omits_empty_fields() {
        let r = GuardRole {
            mesh: GuardedMesh::Consul,
            hold: true,
            reason: Some("consul-cni binary missing".into()),
            exclude_namespaces: vec![],
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"mesh": "consul", "hold": true, "reason": "consul-cni binary missing"})
        );
        let back: GuardRole = serde_json::from_value(
            serde_json::json!({"mesh": "kuma", "excludeNamespaces": ["kube-system"]}),
        )
        .unwrap();
        assert!(!back.hold);
        assert_eq!(back.exclude_namespaces, vec!["kube-system".to_string()]);
    }
}

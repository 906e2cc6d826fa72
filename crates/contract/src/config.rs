//! `interlock-cni`'s own entry in the chain: [`PluginConfig`], its defaults, and the
//! fields an operator may set ([`SETTABLE_FIELDS`]).
//!
//! The field names are a public contract (the agent writes them, operators read them).
//! Parsing goes field by field so that an error names the field that is wrong; unknown
//! fields (the runtime's `name`, `cniVersion`, `prevResult`, `runtimeConfig`, anything a
//! newer agent adds) are ignored.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The plugin binary's name and `type`.
pub const PLUGIN_TYPE: &str = "interlock-cni";

use crate::guard::GuardRole;
pub use crate::layout::DEFAULT_STATE_DIR;
use crate::profile::ProfileName;

/// The capability through which containerd hands over all pod annotations.
pub const POD_ANNOTATIONS_CAPABILITY: &str = "io.kubernetes.cri.pod-annotations";

/// What to do when a pod that may need protection cannot be protected or decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailurePolicy {
    /// Fail the ADD (the runtime retries): never a silent pass. The default.
    #[default]
    Closed,
    /// Log and let the pod start without redirection.
    Open,
}

/// Which netfilter backend writes the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackendChoice {
    /// Detect from the host.
    #[default]
    Auto,
    /// In-process nf_tables.
    Nftables,
    /// `iptables-restore`, nft flavour.
    IptablesNft,
    /// `iptables-restore`, legacy flavour.
    IptablesLegacy,
}

/// Which mechanism programs the rules (what `backend: auto` resolves to, and what the
/// state records).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackendKind {
    /// nf_tables over netlink, in process.
    Nftables,
    /// `iptables-restore` of the nft flavour.
    IptablesNft,
    /// `iptables-restore` of the legacy flavour.
    IptablesLegacy,
}

impl BackendKind {
    /// Every kind.
    pub const ALL: [BackendKind; 3] = [
        BackendKind::Nftables,
        BackendKind::IptablesNft,
        BackendKind::IptablesLegacy,
    ];

    /// The configuration spelling (`nftables`, `iptables-nft`, `iptables-legacy`).
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Nftables => "nftables",
            BackendKind::IptablesNft => "iptables-nft",
            BackendKind::IptablesLegacy => "iptables-legacy",
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A backend name that is not one of the known spellings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownBackend(pub String);

impl std::fmt::Display for UnknownBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "unknown redirect backend {:?}: expected auto, nftables, iptables-nft or iptables-legacy",
            self.0
        )
    }
}

impl std::error::Error for UnknownBackend {}

impl std::str::FromStr for BackendKind {
    type Err = UnknownBackend;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        BackendKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| UnknownBackend(s.to_string()))
    }
}

/// How much the plugin logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    /// Failures only.
    Error,
    /// Failures and surprising situations.
    Warn,
    /// One line per verb (default).
    #[default]
    Info,
    /// Everything, including the decision input.
    Debug,
}

/// `interlock-cni`'s plugin entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginConfig {
    /// `type`: the binary name, `interlock-cni`.
    #[serde(rename = "type")]
    pub plugin_type: String,
    /// Where per-attachment state and the agent's readiness marker live.
    pub state_dir: PathBuf,
    /// Log file (appended to); stderr when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_file: Option<PathBuf>,
    /// Log level.
    #[serde(default)]
    pub log_level: LogLevel,
    /// Namespaces whose pods are never touched (e.g. `kube-system`).
    #[serde(default)]
    pub exclude_namespaces: Vec<String>,
    /// What to do when protection cannot be applied or decided.
    #[serde(default)]
    pub failure_policy: FailurePolicy,
    /// The agent's Unix socket (for pods whose annotations the runtime did not pass).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_socket: Option<PathBuf>,
    /// Netfilter backend.
    #[serde(default)]
    pub backend: BackendChoice,
    /// Mesh profiles to recognise, in priority order.
    #[serde(default = "default_profiles")]
    pub profiles: Vec<ProfileName>,
    /// Capabilities declared to the runtime (`io.kubernetes.cri.pod-annotations`).
    #[serde(default)]
    pub capabilities: BTreeMap<String, bool>,
    /// Guard mode: the plugin writes no rules and guards the mesh plugin that follows it
    /// in the chain. Absent in interlock's own (redirecting) role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guard: Option<GuardRole>,
}

fn default_profiles() -> Vec<ProfileName> {
    ProfileName::ALL.to_vec()
}

impl Default for PluginConfig {
    fn default() -> Self {
        PluginConfig {
            plugin_type: PLUGIN_TYPE.to_string(),
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
            log_file: None,
            log_level: LogLevel::default(),
            exclude_namespaces: Vec::new(),
            failure_policy: FailurePolicy::default(),
            agent_socket: None,
            backend: BackendChoice::default(),
            profiles: default_profiles(),
            capabilities: BTreeMap::from([(POD_ANNOTATIONS_CAPABILITY.to_string(), true)]),
            guard: None,
        }
    }
}

/// A field of the plugin entry that has the wrong type or value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The field name as written in the config (`failurePolicy`).
    pub field: String,
    /// What is wrong.
    pub problem: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "invalid interlock-cni config field {}: {}",
            self.field, self.problem
        )
    }
}

impl std::error::Error for ConfigError {}

/// The fields an operator may set in the entry (the agent's `--plugin-config`); `type`,
/// `stateDir` and the capability are the agent's own.
pub const SETTABLE_FIELDS: [&str; 8] = [
    "logFile",
    "logLevel",
    "excludeNamespaces",
    "failurePolicy",
    "agentSocket",
    "backend",
    "profiles",
    "capabilities",
];

fn field<T: DeserializeOwned>(
    map: &Map<String, Value>,
    key: &str,
) -> Result<Option<T>, ConfigError> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => T::deserialize(v).map(Some).map_err(|e| ConfigError {
            field: key.to_string(),
            problem: format!("{e} (found {v})"),
        }),
    }
}

fn non_empty_path(map: &Map<String, Value>, key: &str) -> Result<Option<PathBuf>, ConfigError> {
    match field::<PathBuf>(map, key)? {
        Some(p) if p.as_os_str().is_empty() => Err(ConfigError {
            field: key.to_string(),
            problem: "must not be empty".to_string(),
        }),
        other => Ok(other),
    }
}

impl PluginConfig {
    /// Reads the plugin entry from the stdin object; every error names its field.
    pub fn from_map(map: &Map<String, Value>) -> Result<PluginConfig, ConfigError> {
        let d = PluginConfig::default();
        let plugin_type = match field::<String>(map, "type")? {
            Some(t) if !t.is_empty() => t,
            _ => {
                return Err(ConfigError {
                    field: "type".into(),
                    problem: "missing".into(),
                })
            }
        };
        let state_dir = non_empty_path(map, "stateDir")?.unwrap_or(d.state_dir);
        if !state_dir.is_absolute() {
            return Err(ConfigError {
                field: "stateDir".into(),
                problem: format!("{} is not an absolute path", state_dir.display()),
            });
        }
        let profiles: Vec<ProfileName> = field(map, "profiles")?.unwrap_or(d.profiles);
        if map.contains_key("kubeconfig") {
            // Said out loud rather than ignored: a config relying on it would otherwise
            // leave pods undecidable without saying why.
            return Err(ConfigError {
                field: "kubeconfig".into(),
                problem: "is no longer supported: interlock-cni carries no Kubernetes client; \
                          declare the io.kubernetes.cri.pod-annotations capability (the \
                          runtime passes the annotations) or set agentSocket"
                    .into(),
            });
        }
        Ok(PluginConfig {
            plugin_type,
            state_dir,
            log_file: non_empty_path(map, "logFile")?,
            log_level: field(map, "logLevel")?.unwrap_or_default(),
            exclude_namespaces: field(map, "excludeNamespaces")?.unwrap_or_default(),
            failure_policy: field(map, "failurePolicy")?.unwrap_or_default(),
            agent_socket: non_empty_path(map, "agentSocket")?,
            backend: field(map, "backend")?.unwrap_or_default(),
            profiles,
            capabilities: field(map, "capabilities")?.unwrap_or_default(),
            guard: field(map, "guard")?,
        })
    }

    /// True when pods in `namespace` are never touched.
    pub fn is_excluded(&self, namespace: &str) -> bool {
        self.exclude_namespaces.iter().any(|n| n == namespace)
    }

    /// True when the entry declares the pod-annotations capability, so containerd passes
    /// the annotations in `runtimeConfig`.
    pub fn wants_pod_annotations(&self) -> bool {
        self.capabilities.get(POD_ANNOTATIONS_CAPABILITY) == Some(&true)
    }

    /// The entry as JSON (for writing a conflist).
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<PluginConfig, ConfigError> {
        PluginConfig::from_map(v.as_object().unwrap())
    }

    #[test]
    fn defaults_and_full_config() {
        let c = parse(json!({"type": "interlock-cni"})).unwrap();
        assert_eq!(c.state_dir, PathBuf::from("/var/run/interlock"));
        assert_eq!(c.failure_policy, FailurePolicy::Closed);
        assert_eq!(c.backend, BackendChoice::Auto);
        assert_eq!(c.profiles, ProfileName::ALL.to_vec());
        assert_eq!(c.guard, None);
        let g = parse(json!({"type": "interlock-cni", "guard": {"mesh": "istio", "hold": true}}))
            .unwrap();
        let role = g.guard.clone().unwrap();
        assert_eq!(role.mesh, crate::guard::GuardedMesh::Istio);
        assert!(role.hold);
        assert_eq!(
            PluginConfig::from_map(g.to_value().as_object().unwrap()).unwrap(),
            g
        );
        let c = parse(json!({
            "type": "interlock-cni", "name": "k8s", "cniVersion": "1.0.0", "someFutureField": 1,
            "stateDir": "/run/il", "logFile": "/var/log/il.log", "logLevel": "debug",
            "excludeNamespaces": ["kube-system"], "failurePolicy": "open",
            "agentSocket": "/run/il/agent.sock",
            "backend": "iptables-legacy", "profiles": ["linkerd"],
            "capabilities": {"io.kubernetes.cri.pod-annotations": true}
        }))
        .unwrap();
        assert_eq!(c.failure_policy, FailurePolicy::Open);
        assert_eq!(c.backend, BackendChoice::IptablesLegacy);
        assert_eq!(c.log_level, LogLevel::Debug);
        assert!(c.is_excluded("kube-system") && !c.is_excluded("default"));
        assert!(c.wants_pod_annotations());
        assert_eq!(c.profiles, vec![ProfileName::Linkerd]);
        // Serialising gives the same public names back.
        let back = PluginConfig::from_map(c.to_value().as_object().unwrap()).unwrap();
        assert_eq!(back, c);
        assert!(c.to_value().get("failurePolicy").is_some());
    }

    /// The settable fields are exactly the serialized names, minus the agent's own.
    #[test]
    fn settable_fields_are_the_serialized_names() {
        let mut c = PluginConfig {
            log_file: Some("/x".into()),
            agent_socket: Some("/s".into()),
            ..PluginConfig::default()
        };
        c.capabilities.clear();
        let v = c.to_value();
        let mut names: Vec<&str> = v
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .filter(|k| *k != "type" && *k != "stateDir")
            .collect();
        names.sort_unstable();
        let mut settable = SETTABLE_FIELDS.to_vec();
        settable.sort_unstable();
        assert_eq!(names, settable);
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (json!({}), "type"),
            (json!({"type": "interlock-cni", "stateDir": 3}), "stateDir"),
            (
                json!({"type": "interlock-cni", "stateDir": "relative"}),
                "stateDir",
            ),
            (
                json!({"type": "interlock-cni", "failurePolicy": "maybe"}),
                "failurePolicy",
            ),
            (
                json!({"type": "interlock-cni", "backend": "ebpf"}),
                "backend",
            ),
            (
                json!({"type": "interlock-cni", "logLevel": "loud"}),
                "logLevel",
            ),
            (
                json!({"type": "interlock-cni", "excludeNamespaces": "kube-system"}),
                "excludeNamespaces",
            ),
            (
                json!({"type": "interlock-cni", "profiles": ["cilium"]}),
                "profiles",
            ),
            (
                json!({"type": "interlock-cni", "capabilities": {"x": "yes"}}),
                "capabilities",
            ),
            (json!({"type": "interlock-cni", "logFile": ""}), "logFile"),
            (
                json!({"type": "interlock-cni", "agentSocket": false}),
                "agentSocket",
            ),
            (
                json!({"type": "interlock-cni", "kubeconfig": "/etc/kubeconfig"}),
                "kubeconfig",
            ),
            (
                json!({"type": "interlock-cni", "guard": {"mesh": "cilium"}}),
                "guard",
            ),
        ];
        for (doc, expected) in cases {
            let e = parse(doc.clone()).unwrap_err();
            assert_eq!(e.field, expected, "{doc}: {e}");
            assert!(e.to_string().contains(expected));
        }
    }
}

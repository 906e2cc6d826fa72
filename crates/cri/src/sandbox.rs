//! Pod sandboxes as this crate hands them out: plain Rust types converted from the CRI
//! messages, so callers never match on protobuf enums encoded as `i32`.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_cri::v1 as cri;

use crate::info::{NetnsPath, VerboseInfo};

/// A sandbox's identity in Kubernetes terms (the kubelet's `PodSandboxMetadata`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxMetadata {
    /// The pod's name.
    pub name: String,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's UID (shared by every sandbox the pod ever had).
    pub uid: String,
    /// How many sandboxes the kubelet created for this pod before this one.
    pub attempt: u32,
}

impl SandboxMetadata {
    pub(crate) fn from_cri(m: Option<cri::PodSandboxMetadata>) -> SandboxMetadata {
        let m = m.unwrap_or_default();
        SandboxMetadata {
            name: m.name,
            namespace: m.namespace,
            uid: m.uid,
            attempt: m.attempt,
        }
    }
}

/// Whether a sandbox is running (`SANDBOX_READY`) or not (`SANDBOX_NOTREADY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxState {
    /// Its process runs and its network is set up.
    Ready,
    /// Stopped, or failed half-way; it may still hold a netns until removed.
    NotReady,
}

impl SandboxState {
    pub(crate) fn from_cri(state: i32) -> SandboxState {
        // The CRI says an unknown value means not ready.
        match cri::PodSandboxState::try_from(state) {
            Ok(cri::PodSandboxState::SandboxReady) => SandboxState::Ready,
            _ => SandboxState::NotReady,
        }
    }

    pub(crate) fn to_cri(self) -> cri::PodSandboxState {
        match self {
            SandboxState::Ready => cri::PodSandboxState::SandboxReady,
            SandboxState::NotReady => cri::PodSandboxState::SandboxNotready,
        }
    }
}

/// Which sandboxes `ListPodSandbox` returns; the default returns all of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxFilter {
    /// Only sandboxes in this state.
    pub state: Option<SandboxState>,
    /// Only sandboxes carrying every one of these labels with these values.
    pub labels: BTreeMap<String, String>,
}

impl SandboxFilter {
    /// Only ready sandboxes (what an audit looks at).
    pub fn ready() -> SandboxFilter {
        SandboxFilter {
            state: Some(SandboxState::Ready),
            ..SandboxFilter::default()
        }
    }

    /// Adds a label the sandboxes must carry.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> SandboxFilter {
        self.labels.insert(key.into(), value.into());
        self
    }

    pub(crate) fn to_cri(&self) -> cri::PodSandboxFilter {
        cri::PodSandboxFilter {
            id: String::new(),
            state: self.state.map(|s| cri::PodSandboxStateValue {
                state: s.to_cri() as i32,
            }),
            label_selector: self.labels.clone().into_iter().collect(),
        }
    }
}

/// One entry of `ListPodSandbox`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxSummary {
    /// The runtime's sandbox ID (what CNI sees as `CNI_CONTAINERID`).
    pub id: String,
    /// The pod it belongs to.
    pub metadata: SandboxMetadata,
    /// Ready or not.
    pub state: SandboxState,
    /// Creation time in nanoseconds since the Unix epoch.
    pub created_at_nanos: i64,
    /// Labels copied from the pod at creation.
    pub labels: BTreeMap<String, String>,
    /// Annotations copied from the pod at creation (the pod's current ones may differ).
    pub annotations: BTreeMap<String, String>,
    /// The runtime handler (`""` for the default).
    pub runtime_handler: String,
}

impl SandboxSummary {
    pub(crate) fn from_cri(s: cri::PodSandbox) -> SandboxSummary {
        SandboxSummary {
            id: s.id,
            metadata: SandboxMetadata::from_cri(s.metadata),
            state: SandboxState::from_cri(s.state),
            created_at_nanos: s.created_at,
            labels: sorted(s.labels),
            annotations: sorted(s.annotations),
            runtime_handler: s.runtime_handler,
        }
    }

    /// The creation time.
    pub fn created_at(&self) -> SystemTime {
        time_from_nanos(self.created_at_nanos)
    }
}

/// `PodSandboxStatus` of one sandbox, with the verbose info already read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxStatus {
    /// The runtime's sandbox ID.
    pub id: String,
    /// The pod it belongs to.
    pub metadata: SandboxMetadata,
    /// Ready or not.
    pub state: SandboxState,
    /// Creation time in nanoseconds since the Unix epoch.
    pub created_at_nanos: i64,
    /// Labels copied from the pod at creation.
    pub labels: BTreeMap<String, String>,
    /// Annotations copied from the pod at creation.
    pub annotations: BTreeMap<String, String>,
    /// The pod's IPs as the runtime reports them: the primary first. Empty for a
    /// host-network sandbox or one whose netns is closed.
    pub ips: Vec<IpAddr>,
    /// True when the sandbox uses the node's network namespace.
    pub host_network: bool,
    /// The runtime handler (`""` for the default).
    pub runtime_handler: String,
    /// What the verbose info says (netns path, closed flag, PID); empty when the status
    /// was asked for without `verbose`.
    pub verbose: VerboseInfo,
    /// The raw verbose info map, for what [`VerboseInfo`] does not model.
    pub info: BTreeMap<String, String>,
}

impl SandboxStatus {
    /// The network namespace file, if the runtime named one.
    pub fn netns(&self) -> Option<&NetnsPath> {
        self.verbose.netns.as_ref()
    }

    /// The network namespace file's path, if the runtime named one.
    pub fn netns_path(&self) -> Option<&Path> {
        self.verbose.netns.as_ref().map(|n| n.path.as_path())
    }

    /// The creation time.
    pub fn created_at(&self) -> SystemTime {
        time_from_nanos(self.created_at_nanos)
    }
}

/// What `RunPodSandbox` creates: the parts of a `PodSandboxConfig` a node component or a
/// test sets. Everything else takes the kubelet's defaults for an unprivileged pod (own
/// network, PID and IPC namespaces, seccomp and AppArmor unconfined as the kubelet
/// sends when the pod asks for nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxConfig {
    /// Pod name, namespace, UID and attempt.
    pub metadata: SandboxMetadata,
    /// The sandbox's hostname (the kubelet uses the pod name).
    pub hostname: String,
    /// Where the runtime puts container logs; `None` leaves it empty.
    pub log_directory: Option<PathBuf>,
    /// Labels to copy onto the sandbox.
    pub labels: BTreeMap<String, String>,
    /// Annotations to copy onto the sandbox (and hand to CNI as
    /// `io.kubernetes.cri.pod-annotations`).
    pub annotations: BTreeMap<String, String>,
    /// The cgroup parent; `None` lets the runtime choose.
    pub cgroup_parent: Option<String>,
    /// The runtime handler; `""` for the default.
    pub runtime_handler: String,
    /// Use the node's network namespace (no CNI call).
    pub host_network: bool,
}

impl SandboxConfig {
    /// A sandbox for pod `namespace/name` with UID `uid`, hostname `name`, attempt 0.
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        uid: impl Into<String>,
    ) -> SandboxConfig {
        let name = name.into();
        SandboxConfig {
            hostname: name.clone(),
            metadata: SandboxMetadata {
                name,
                namespace: namespace.into(),
                uid: uid.into(),
                attempt: 0,
            },
            log_directory: None,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            cgroup_parent: None,
            runtime_handler: String::new(),
            host_network: false,
        }
    }

    /// Adds a label.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> SandboxConfig {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Adds an annotation.
    pub fn annotation(mut self, key: impl Into<String>, value: impl Into<String>) -> SandboxConfig {
        self.annotations.insert(key.into(), value.into());
        self
    }

    /// Sets the attempt number (the kubelet counts up on every new sandbox of a pod).
    pub fn attempt(mut self, attempt: u32) -> SandboxConfig {
        self.metadata.attempt = attempt;
        self
    }

    /// Sets the log directory.
    pub fn log_directory(mut self, dir: impl Into<PathBuf>) -> SandboxConfig {
        self.log_directory = Some(dir.into());
        self
    }

    /// `namespace/name`, how errors name a sandbox that has no ID yet.
    pub fn pod_name(&self) -> String {
        format!("{}/{}", self.metadata.namespace, self.metadata.name)
    }

    pub(crate) fn to_cri(&self) -> cri::PodSandboxConfig {
        let pod_or_node = if self.host_network {
            cri::NamespaceMode::Node
        } else {
            cri::NamespaceMode::Pod
        };
        let unconfined = || cri::SecurityProfile {
            profile_type: cri::security_profile::ProfileType::Unconfined as i32,
            localhost_ref: String::new(),
        };
        cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: self.metadata.name.clone(),
                uid: self.metadata.uid.clone(),
                namespace: self.metadata.namespace.clone(),
                attempt: self.metadata.attempt,
            }),
            hostname: if self.host_network {
                String::new()
            } else {
                self.hostname.clone()
            },
            log_directory: self
                .log_directory
                .as_ref()
                .map(|d| d.to_string_lossy().into_owned())
                .unwrap_or_default(),
            labels: self.labels.clone().into_iter().collect(),
            annotations: self.annotations.clone().into_iter().collect(),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: self.cgroup_parent.clone().unwrap_or_default(),
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(cri::NamespaceOption {
                        network: pod_or_node as i32,
                        pid: cri::NamespaceMode::Container as i32,
                        ipc: cri::NamespaceMode::Pod as i32,
                        ..Default::default()
                    }),
                    seccomp: Some(unconfined()),
                    apparmor: Some(unconfined()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

pub(crate) fn sorted(map: HashMap<String, String>) -> BTreeMap<String, String> {
    map.into_iter().collect()
}

fn time_from_nanos(nanos: i64) -> SystemTime {
    if nanos >= 0 {
        UNIX_EPOCH + Duration::from_nanos(nanos as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(nanos.unsigned_abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_run_config_carries_identity_labels_annotations_and_pod_namespaces() {
        let c = SandboxConfig::new("ns", "web", "uid-1")
            .label("app", "web")
            .annotation("sidecar.istio.io/status", "{}")
            .attempt(2)
            .log_directory("/var/log/pods/x")
            .to_cri();
        let m = c.metadata.unwrap();
        assert_eq!(
            (
                m.namespace.as_str(),
                m.name.as_str(),
                m.uid.as_str(),
                m.attempt
            ),
            ("ns", "web", "uid-1", 2)
        );
        assert_eq!(c.hostname, "web");
        assert_eq!(c.log_directory, "/var/log/pods/x");
        assert_eq!(c.labels["app"], "web");
        assert_eq!(c.annotations["sidecar.istio.io/status"], "{}");
        let ns = c
            .linux
            .unwrap()
            .security_context
            .unwrap()
            .namespace_options
            .unwrap();
        assert_eq!(ns.network, cri::NamespaceMode::Pod as i32);
    }

    #[test]
    fn host_network_sandboxes_ask_for_the_node_namespace() {
        let mut c = SandboxConfig::new("kube-system", "agent", "u");
        c.host_network = true;
        let cri = c.to_cri();
        let ns = cri
            .linux
            .unwrap()
            .security_context
            .unwrap()
            .namespace_options
            .unwrap();
        assert_eq!(ns.network, cri::NamespaceMode::Node as i32);
        assert_eq!(cri.hostname, "");
    }

    #[test]
    fn unknown_states_read_as_not_ready() {
        assert_eq!(SandboxState::from_cri(0), SandboxState::Ready);
        assert_eq!(SandboxState::from_cri(1), SandboxState::NotReady);
        assert_eq!(SandboxState::from_cri(7), SandboxState::NotReady);
    }

    #[test]
    fn the_filter_sends_state_and_labels() {
        let f = SandboxFilter::ready().label("a", "b").to_cri();
        assert_eq!(
            f.state.unwrap().state,
            cri::PodSandboxState::SandboxReady as i32
        );
        assert_eq!(f.label_selector["a"], "b");
        assert!(SandboxFilter::default().to_cri().state.is_none());
    }

    #[test]
    fn creation_times_convert_from_nanoseconds() {
        assert_eq!(
            time_from_nanos(1_500_000_000),
            UNIX_EPOCH + Duration::from_millis(1500)
        );
    }
}

//! Where `interlock-cni` learns a pod's annotations when the runtime did not hand them over.
//!
//! containerd passes every pod annotation to plugins that declare the
//! `io.kubernetes.cri.pod-annotations` capability, so this is off the hot path. When it is
//! missing (another runtime, an entry without the capability), the plugin asks, in order,
//! the node agent over its Unix socket ([`agent`]: a one-line JSON protocol defined here,
//! client and server side) and the Kubernetes API with a kubeconfig ([`kube`]). A pod whose
//! mesh status cannot be decided is a failure for the caller, never a pass.

use std::collections::BTreeMap;

pub mod agent;
pub mod kube;

pub use interlock_contract::agent_socket::PodRef;

/// A source's answer about one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodLookup {
    /// The pod exists; these are its annotations (empty when it has none).
    Found {
        /// The pod's UID as the source knows it.
        uid: Option<String>,
        /// All of the pod's annotations.
        annotations: BTreeMap<String, String>,
    },
    /// The source is authoritative and has no such pod (or one with another UID).
    NotFound,
}

/// Why a source could not answer.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    /// The agent socket could not be reached or answered badly.
    #[error("agent socket {socket}: {msg}")]
    Agent {
        /// Socket path.
        socket: String,
        /// What went wrong.
        msg: String,
    },
    /// The agent answered but does not know (its cache is not synced, no API access).
    #[error("agent socket {socket} could not decide for pod {pod}: {reason}")]
    AgentUndecided {
        /// Socket path.
        socket: String,
        /// The pod.
        pod: String,
        /// The agent's reason.
        reason: String,
    },
    /// The kubeconfig could not be read or is not usable.
    #[error("kubeconfig {path}: {msg}")]
    Kubeconfig {
        /// Kubeconfig path.
        path: String,
        /// What is wrong with it.
        msg: String,
    },
    /// The Kubernetes API request failed.
    #[error("Kubernetes API {url}: {msg}")]
    Api {
        /// Request URL.
        url: String,
        /// What went wrong.
        msg: String,
    },
}

/// Keeps a lookup result only when the UIDs agree (or one side does not know it).
pub fn match_uid(pod: &PodRef, found_uid: Option<&str>) -> bool {
    match (pod.uid.as_deref(), found_uid) {
        (Some(want), Some(have)) => want.is_empty() || want == have,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uid_mismatch_means_another_pod() {
        let mut pod = PodRef {
            namespace: "a".into(),
            name: "p".into(),
            uid: Some("u1".into()),
        };
        assert!(match_uid(&pod, Some("u1")));
        assert!(!match_uid(&pod, Some("u2")));
        assert!(match_uid(&pod, None));
        pod.uid = None;
        assert!(match_uid(&pod, Some("u2")));
        assert_eq!(pod.to_string(), "a/p");
    }
}

//! Where a pod's annotations come from when the runtime did not pass them in
//! `runtimeConfig` (an entry without the `io.kubernetes.cri.pod-annotations` capability,
//! or a runtime without it). Never used when the runtime passed them: no network call on
//! the hot path.
//!
//! Sources, in order (each only if configured):
//! 1. the node agent over `agentSocket` ([`interlock_podinfo::agent`], [`AGENT_TIMEOUT`]);
//! 2. the Kubernetes API with `kubeconfig` ([`interlock_podinfo::kube`], [`API_TIMEOUT`]).
//!
//! What counts as an answer:
//! - `found` from either source: its annotations decide (a source that reports another
//!   UID than `K8S_POD_UID` reports a different pod, which counts as not found).
//! - The API's 404 (or another UID) is **authoritative**: the pod does not exist (any more),
//!   so the sandbox is not a meshed pod's and the pod is treated as not meshed.
//! - The agent's `notFound` is **not authoritative**: its pod cache is a watch scoped to
//!   its node that may lag behind the kubelet, and the pod being added exists by
//!   definition. The plugin moves on to the API, as it does when the agent is unreachable,
//!   slow, or answers `undecided`.
//!
//! When no source gives an answer the result is [`Resolved::Undecided`] listing every
//! source and why it did not answer; the caller fails closed (code 11).

use std::collections::BTreeMap;
use std::time::Duration;

use interlock_podinfo::{agent, kube, PodLookup, PodRef};
use serde::{Deserialize, Serialize};

use crate::identity::PodIdentity;
use interlock_contract::config::PluginConfig;

/// How long the agent may take to answer (it answers from memory).
pub const AGENT_TIMEOUT: Duration = Duration::from_millis(300);
/// How long the Kubernetes API may take to answer.
pub const API_TIMEOUT: Duration = Duration::from_secs(2);

/// Where the annotations the decision used came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// The runtime passed them (or no lookup was needed).
    RuntimeConfig,
    /// The node agent's socket.
    Agent,
    /// The Kubernetes API.
    KubernetesApi,
    /// Nothing answered.
    None,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Source::RuntimeConfig => "runtimeConfig",
            Source::Agent => "the agent",
            Source::KubernetesApi => "the Kubernetes API",
            Source::None => "no source",
        })
    }
}

/// The outcome of [`resolve`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// A source knows the pod: its annotations.
    Found {
        /// All of the pod's annotations.
        annotations: BTreeMap<String, String>,
        /// Who said so.
        source: Source,
    },
    /// An authoritative source says the pod does not exist.
    NotFound {
        /// Who said so.
        source: Source,
        /// Details for the log and state.
        detail: String,
    },
    /// No source could answer.
    Undecided {
        /// One entry per source: what was tried and why it did not answer.
        tried: Vec<String>,
    },
}

/// Asks the configured sources about `pod` (see the module docs for order and authority).
pub fn resolve(config: &PluginConfig, pod: &PodIdentity) -> Resolved {
    let pod_ref = PodRef {
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        uid: (!pod.uid.is_empty()).then(|| pod.uid.clone()),
    };
    let mut tried = Vec::new();
    match &config.agent_socket {
        None => tried.push("agent: agentSocket not configured".to_string()),
        Some(socket) => match agent::query(socket, &pod_ref, AGENT_TIMEOUT) {
            Ok(PodLookup::Found { annotations, .. }) => {
                return Resolved::Found {
                    annotations,
                    source: Source::Agent,
                }
            }
            Ok(PodLookup::NotFound) => tried.push(format!(
                "agent {}: pod {pod_ref} not in its cache (not authoritative: the cache may lag \
                 behind the kubelet)",
                socket.display()
            )),
            Err(e) => tried.push(format!("agent: {e}")),
        },
    }
    match &config.kubeconfig {
        None => tried.push("Kubernetes API: kubeconfig not configured".to_string()),
        Some(path) => {
            match kube::Kubeconfig::load(path).and_then(|kc| kc.fetch_pod(&pod_ref, API_TIMEOUT)) {
                Ok(PodLookup::Found { annotations, .. }) => {
                    return Resolved::Found {
                        annotations,
                        source: Source::KubernetesApi,
                    }
                }
                Ok(PodLookup::NotFound) => {
                    return Resolved::NotFound {
                        source: Source::KubernetesApi,
                        detail: format!(
                            "no pod {pod_ref}{} (HTTP 404 or another UID)",
                            pod_ref
                                .uid
                                .as_deref()
                                .map(|u| format!(" with UID {u}"))
                                .unwrap_or_default()
                        ),
                    }
                }
                Err(e) => tried.push(format!("Kubernetes API: {e}")),
            }
        }
    }
    Resolved::Undecided { tried }
}

//! Where a pod's annotations come from when the runtime did not pass them in
//! `runtimeConfig` (an entry without the `io.kubernetes.cri.pod-annotations` capability,
//! or a runtime without it), and its spec's facts when a profile reads them (Istio,
//! Linkerd: the runtime never passes the spec). Not used for a pod the annotations alone
//! decide: no network call on that path.
//!
//! The one other source is the node agent over `agentSocket` ([`crate::agent_client`],
//! [`AGENT_TIMEOUT`]), which answers from its Kubernetes watch cache; the plugin itself
//! carries no Kubernetes client and no TLS stack. What counts as an answer:
//! - `found`: its annotations decide (an answer about another UID than `K8S_POD_UID` is
//!   about a different pod, and counts as not found).
//! - `notFound` is **not authoritative**: the agent's pod cache is a watch scoped to its
//!   node that may lag behind the kubelet, and the pod being added exists by definition.
//!
//! Anything else — no socket configured, unreachable or untrusted, slow, `undecided`,
//! `notFound` — is [`Resolved::Undecided`] saying why; the caller fails closed (code 11)
//! and the runtime retries.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::agent_client::{self, AddTarget, PodLookup, PodRef};

use interlock_attach::pod::PodIdentity;
use interlock_contract::config::PluginConfig;
use interlock_contract::pod::PodFacts;

/// How long the agent may take to answer (it answers from memory).
pub const AGENT_TIMEOUT: Duration = Duration::from_millis(300);

use interlock_attach::pod::Source;

/// The outcome of [`resolve`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// A source knows the pod: its annotations.
    Found {
        /// All of the pod's annotations.
        annotations: BTreeMap<String, String>,
        /// Its spec's facts, when the source has the spec.
        facts: Option<PodFacts>,
        /// The agent took the lookup as the ADD's note.
        noted: bool,
        /// Who said so.
        source: Source,
    },
    /// No source could answer.
    Undecided {
        /// One entry per source: what was tried and why it did not answer.
        tried: Vec<String>,
    },
}

/// Asks the configured sources about `pod` (see the module docs for order and authority);
/// `add` names the ADD the lookup is for.
pub fn resolve(config: &PluginConfig, pod: &PodIdentity, add: Option<&AddTarget>) -> Resolved {
    let pod_ref = PodRef {
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        uid: (!pod.uid.is_empty()).then(|| pod.uid.clone()),
    };
    let mut tried = Vec::new();
    match &config.agent_socket {
        None => tried.push("agent: agentSocket not configured".to_string()),
        Some(socket) => match agent_client::query(socket, &pod_ref, add, AGENT_TIMEOUT) {
            Ok(PodLookup::Found {
                annotations,
                facts,
                noted,
                ..
            }) => {
                return Resolved::Found {
                    annotations,
                    facts,
                    source: Source::Agent,
                    noted,
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
    Resolved::Undecided { tried }
}

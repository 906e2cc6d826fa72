//! Is a pod meshed, and with which rules — the one decision the plugin (at ADD) and the
//! agent (when it audits running sandboxes) both make, from the plugin configuration,
//! the pod's namespace, its annotations and, where a profile reads the pod's spec, the
//! spec's facts. Pure: no I/O.

use std::collections::BTreeMap;

use interlock_contract::config::PluginConfig;
use serde::{Deserialize, Serialize};

use crate::{PodFacts, PodView, ProfileName, RedirectSpec, SpecError};

/// What to do with a pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "kebab-case")]
pub enum Decision {
    /// Not interlock's business (excluded namespace, not a Kubernetes pod).
    Skip {
        /// Why.
        reason: String,
    },
    /// The pod is not meshed: pass through.
    NotMeshed {
        /// Why.
        reason: String,
    },
    /// The pod is meshed: its traffic must be redirected.
    Meshed {
        /// The profile that claimed it.
        profile: ProfileName,
        /// The rules it needs (from the profile).
        spec: Box<RedirectSpec>,
    },
    /// The pod's mesh status cannot be known.
    Undecided {
        /// Why, and what to do.
        reason: String,
    },
    /// The pod is a profile's, whose rules depend on the pod's spec, and its spec facts
    /// are not known: ask the agent (the plugin), or judge by what was recorded at ADD.
    NeedsPodSpec {
        /// The profile that claims the pod.
        profile: ProfileName,
        /// Why, and what to do.
        reason: String,
    },
    /// The pod's mesh annotations cannot be turned into rules.
    Invalid {
        /// The error, naming the annotation.
        reason: String,
    },
}

impl Decision {
    /// A short label for logs and state (`skip`, `not-meshed`, `meshed`, …).
    pub fn label(&self) -> &'static str {
        match self {
            Decision::Skip { .. } => "skip",
            Decision::NotMeshed { .. } => "not-meshed",
            Decision::Meshed { .. } => "meshed",
            Decision::Undecided { .. } => "undecided",
            Decision::NeedsPodSpec { .. } => "needs-pod-spec",
            Decision::Invalid { .. } => "invalid",
        }
    }
}

impl Decision {
    /// A decision that needs the pod's spec, settled by the spec recorded when the
    /// sandbox's rules were installed (the plugin decided then with the spec's facts);
    /// any other decision as it is. `recorded` is only asked when needed.
    pub fn or_recorded(self, recorded: impl FnOnce() -> Option<RedirectSpec>) -> Decision {
        match self {
            Decision::NeedsPodSpec { profile, reason } => match recorded() {
                Some(spec) => Decision::Meshed {
                    profile,
                    spec: Box::new(spec),
                },
                None => Decision::NeedsPodSpec { profile, reason },
            },
            other => other,
        }
    }
}

/// Decides for a running sandbox of pod `namespace`/`name` with `annotations` (and the
/// spec's `facts`, when known): a host-network sandbox has no pod netns to redirect in,
/// so it is never meshed, whatever its annotations; any other is [`decide`]d. The agent's
/// audit and `interlock check` judge sandboxes by this one rule.
pub fn decide_sandbox(
    config: &PluginConfig,
    namespace: &str,
    name: &str,
    host_network: bool,
    annotations: &BTreeMap<String, String>,
    facts: Option<&PodFacts>,
) -> Decision {
    if host_network {
        return Decision::NotMeshed {
            reason: "host-network sandbox: no pod netns to redirect in".into(),
        };
    }
    decide(
        config,
        namespace,
        &format!("{namespace}/{name}"),
        Some(annotations),
        facts,
    )
}

/// Decides for the pod `namespace`/`name` (`pod` is how messages name it). `annotations`
/// is `None` when they are unknown: the pod is then [`Decision::Undecided`] unless its
/// namespace is excluded. `facts` are the pod spec's facts, when known.
pub fn decide(
    config: &PluginConfig,
    namespace: &str,
    pod: &str,
    annotations: Option<&BTreeMap<String, String>>,
    facts: Option<&PodFacts>,
) -> Decision {
    if config.is_excluded(namespace) {
        return Decision::Skip {
            reason: format!("namespace {namespace} is in excludeNamespaces"),
        };
    }
    let Some(annotations) = annotations else {
        return Decision::Undecided {
            reason: format!(
                "the runtime did not pass the annotations of pod {pod} (declare capability \
                 io.kubernetes.cri.pod-annotations in the interlock-cni entry)"
            ),
        };
    };
    match crate::spec_for(&PodView { annotations, facts }, &config.profiles) {
        Ok(Some((profile, spec))) => Decision::Meshed {
            profile,
            spec: Box::new(spec),
        },
        Ok(None) => Decision::NotMeshed {
            reason: format!(
                "no enabled profile ({}) claims the pod",
                config
                    .profiles
                    .iter()
                    .map(|p| p.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        },
        Err(e @ SpecError::PodSpecNeeded { profile, .. }) => Decision::NeedsPodSpec {
            profile,
            reason: format!("pod {pod}: {e}"),
        },
        Err(e) => Decision::Invalid {
            reason: e.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_network_sandbox_is_never_meshed_and_any_other_is_decided_as_a_pod() {
        let config = PluginConfig::default();
        let mut istio = BTreeMap::new();
        istio.insert(
            "sidecar.istio.io/status".to_string(),
            r#"{"containers":["istio-proxy"]}"#.to_string(),
        );
        let host = decide_sandbox(&config, "shop", "web", true, &istio, None);
        assert!(
            matches!(&host, Decision::NotMeshed { reason } if reason.contains("host-network")),
            "{host:?}"
        );
        for annotations in [istio, BTreeMap::new()] {
            assert_eq!(
                decide_sandbox(&config, "shop", "web", false, &annotations, None),
                decide(&config, "shop", "shop/web", Some(&annotations), None)
            );
        }
    }
}

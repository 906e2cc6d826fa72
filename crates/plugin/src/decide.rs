//! The ADD pipeline's two seams: [`decide`] (is this pod meshed?) and [`protect`] (make
//! it so, provably).
//!
//! `decide` is pure: configuration + [`PodIdentity`] in, [`Decision`] out, using the mesh
//! profiles of `interlock_redirect`. `protect` is where the next step slots in — apply the
//! redirection inside the pod netns (`interlock_redirect::protect`), verify it, prove it
//! with a probe — and report a [`Protection`]. At this stage it passes a meshed pod through
//! and says so in the state and the log.

use interlock_redirect::{ProfileName, RedirectSpec};
use serde::{Deserialize, Serialize};

use crate::config::PluginConfig;
use crate::identity::PodIdentity;

/// What to do with an attachment.
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
    /// The pod is meshed: its traffic must be redirected before ADD succeeds.
    Meshed {
        /// The profile that claimed it.
        profile: ProfileName,
        /// The rules it needs.
        spec: Box<RedirectSpec>,
    },
    /// The pod's mesh status cannot be known from what the runtime passed.
    Undecided {
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
            Decision::Invalid { .. } => "invalid",
        }
    }
}

/// Decides from the configuration and the pod identity alone (no I/O).
pub fn decide(config: &PluginConfig, pod: &PodIdentity) -> Decision {
    if !pod.is_kubernetes_pod() {
        return Decision::Skip {
            reason: "CNI_ARGS names no Kubernetes pod (K8S_POD_NAMESPACE/K8S_POD_NAME missing)"
                .into(),
        };
    }
    if config.is_excluded(&pod.namespace) {
        return Decision::Skip {
            reason: format!("namespace {} is in excludeNamespaces", pod.namespace),
        };
    }
    let Some(annotations) = &pod.annotations else {
        return Decision::Undecided {
            reason: format!(
                "the runtime did not pass the annotations of pod {} (declare capability \
                 io.kubernetes.cri.pod-annotations in the interlock-cni entry; agent and API \
                 lookups are not available yet)",
                pod.display_name()
            ),
        };
    };
    match interlock_redirect::decide(annotations, &config.profiles) {
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
        Err(e) => Decision::Invalid {
            reason: e.to_string(),
        },
    }
}

/// What `protect` did for the attachment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "protection", rename_all = "kebab-case")]
pub enum Protection {
    /// Nothing to protect (skip / not meshed).
    NotNeeded,
    /// Meshed but passed through without rules (this stage; or failurePolicy open).
    PassedThrough {
        /// Why no rules were applied.
        reason: String,
    },
}

/// Makes a meshed pod's redirection real. At this stage: passes through, with a reason.
pub fn protect(
    _config: &PluginConfig,
    pod: &PodIdentity,
    _netns: &str,
    decision: &Decision,
) -> Protection {
    match decision {
        Decision::Meshed { profile, .. } => Protection::PassedThrough {
            reason: format!(
                "pod {} is meshed ({profile}); redirection is not applied by this build yet",
                pod.display_name()
            ),
        },
        _ => Protection::NotNeeded,
    }
}

/// Undoes [`protect`] for an attachment being deleted. `state` is what ADD recorded (or
/// `None` after a restart or a second DEL); `netns` may be empty (containerd's later
/// DELs), in which case there is nothing left to clean inside it. Must be idempotent.
/// At this stage `protect` never applies rules, so there is nothing to remove.
pub fn unprotect(
    _config: &PluginConfig,
    state: Option<&crate::state::AttachmentState>,
    _netns: &str,
) -> Result<(), String> {
    match state.map(|s| &s.protection) {
        None | Some(Protection::NotNeeded) | Some(Protection::PassedThrough { .. }) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn pod(ns: &str, annotations: Option<&[(&str, &str)]>) -> PodIdentity {
        PodIdentity {
            namespace: ns.into(),
            name: "p".into(),
            uid: "u".into(),
            annotations: annotations.map(|a| {
                a.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>()
            }),
        }
    }

    #[test]
    fn decisions() {
        let mut c = PluginConfig {
            exclude_namespaces: vec!["kube-system".into()],
            ..PluginConfig::default()
        };
        assert_eq!(decide(&c, &PodIdentity::default()).label(), "skip");
        assert_eq!(decide(&c, &pod("kube-system", Some(&[]))).label(), "skip");
        assert_eq!(decide(&c, &pod("shop", None)).label(), "undecided");
        assert_eq!(decide(&c, &pod("shop", Some(&[]))).label(), "not-meshed");
        let istio = [("sidecar.istio.io/status", "{}")];
        let d = decide(&c, &pod("shop", Some(&istio)));
        assert!(
            matches!(
                d,
                Decision::Meshed {
                    profile: ProfileName::Istio,
                    ..
                }
            ),
            "{d:?}"
        );
        assert!(matches!(
            protect(&c, &pod("shop", Some(&istio)), "/x", &d),
            Protection::PassedThrough { .. }
        ));
        // Profiles not enabled do not claim the pod.
        c.profiles = vec![ProfileName::Linkerd];
        assert_eq!(decide(&c, &pod("shop", Some(&istio))).label(), "not-meshed");
        let bad = [
            ("linkerd.io/proxy-version", "v1"),
            ("config.linkerd.io/skip-inbound-ports", "http"),
        ];
        assert_eq!(decide(&c, &pod("shop", Some(&bad))).label(), "invalid");
    }
}

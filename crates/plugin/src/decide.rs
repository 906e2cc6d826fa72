//! Is this pod meshed, and with which rules: [`decide`] (pure: configuration +
//! [`PodIdentity`] in, [`Decision`] out, using the mesh profiles of `interlock_redirect`)
//! and [`decide_with_lookup`] (the same, asking the agent first when the runtime passed
//! no annotations). Acting on the decision is [`crate::protect`]'s.

use interlock_redirect::{ProfileName, RedirectSpec};
use serde::{Deserialize, Serialize};

use crate::identity::PodIdentity;
use crate::lookup::{self, Resolved, Source};
use interlock_contract::config::PluginConfig;

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
        /// The rules it needs (from the profile).
        spec: Box<RedirectSpec>,
    },
    /// The pod's mesh status cannot be known.
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

/// True when `decide` would need the pod's annotations and the runtime did not pass them:
/// a Kubernetes pod, outside `excludeNamespaces`, with `annotations == None`.
pub fn needs_lookup(config: &PluginConfig, pod: &PodIdentity) -> bool {
    pod.is_kubernetes_pod() && !config.is_excluded(&pod.namespace) && pod.annotations.is_none()
}

/// Decides from the configuration and the pod identity alone (no I/O). A pod whose
/// annotations are unknown is [`Decision::Undecided`]; [`decide_with_lookup`] asks the
/// agent and the API first.
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
                 io.kubernetes.cri.pod-annotations in the interlock-cni entry)",
                pod.display_name()
            ),
        };
    };
    match interlock_redirect::spec_for(annotations, &config.profiles) {
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

/// [`decide`], but when the runtime passed no annotations ([`needs_lookup`]) they are
/// fetched first through [`lookup::resolve`] (the agent socket). The
/// pod identity is updated with what was found; the returned [`Source`] says where the
/// annotations came from. No network call is made when the runtime passed annotations.
pub fn decide_with_lookup(config: &PluginConfig, pod: &mut PodIdentity) -> (Decision, Source) {
    if !needs_lookup(config, pod) {
        return (decide(config, pod), Source::RuntimeConfig);
    }
    match lookup::resolve(config, pod) {
        Resolved::Found {
            annotations,
            source,
        } => {
            pod.annotations = Some(annotations);
            (decide(config, pod), source)
        }
        Resolved::Undecided { tried } => (
            Decision::Undecided {
                reason: format!(
                    "the runtime did not pass the annotations of pod {} and no source could \
                     tell them: {}",
                    pod.display_name(),
                    tried.join("; ")
                ),
            },
            Source::None,
        ),
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
        // Profiles not enabled do not claim the pod.
        c.profiles = vec![ProfileName::Linkerd];
        assert_eq!(decide(&c, &pod("shop", Some(&istio))).label(), "not-meshed");
        let bad = [
            ("linkerd.io/proxy-version", "v1"),
            ("config.linkerd.io/skip-inbound-ports", "http"),
        ];
        assert_eq!(decide(&c, &pod("shop", Some(&bad))).label(), "invalid");
    }

    #[test]
    fn lookup_only_when_annotations_are_missing() {
        let c = PluginConfig {
            exclude_namespaces: vec!["kube-system".into()],
            agent_socket: Some("/nonexistent/il-agent.sock".into()),
            ..PluginConfig::default()
        };
        assert!(!needs_lookup(&c, &pod("shop", Some(&[]))));
        assert!(!needs_lookup(&c, &pod("kube-system", None)));
        assert!(!needs_lookup(&c, &PodIdentity::default()));
        assert!(needs_lookup(&c, &pod("shop", None)));
        let mut p = pod("shop", None);
        let (d, source) = decide_with_lookup(&c, &mut p);
        assert_eq!(source, Source::None);
        let Decision::Undecided { reason } = d else {
            panic!("{d:?}")
        };
        assert!(reason.contains("/nonexistent/il-agent.sock"), "{reason}");
    }
}

//! Is this pod meshed, and with which rules: [`decide`] (pure: configuration +
//! [`PodIdentity`] in, [`Decision`] out, using the mesh profiles of `interlock_redirect`)
//! and [`decide_with_lookup`] (the same, asking the agent first when the runtime passed
//! no annotations, or when the pod's profile reads its spec). Acting on the decision is
//! [`interlock_attach::protect`]'s.

use crate::agent_client::AddTarget;
use crate::lookup::{self, Resolved};
use interlock_attach::pod::PodIdentity;
use interlock_attach::pod::Source;
use interlock_contract::config::PluginConfig;
use interlock_contract::guard::{GuardRole, Recognition};

pub use interlock_redirect::decision::Decision;

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
    interlock_redirect::decision::decide(
        config,
        &pod.namespace,
        &pod.display_name(),
        pod.annotations.as_ref(),
        pod.facts.as_ref(),
    )
}

/// What [`decide_for_add`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    /// The decision.
    pub decision: Decision,
    /// Where the pod's annotations came from.
    pub source: Source,
    /// The agent took the lookup as the ADD's note (no note needs to follow).
    pub noted: bool,
}

/// [`decide`], but when the runtime passed no annotations ([`needs_lookup`]) they are
/// fetched first through [`lookup::resolve`] (the agent socket). The
/// pod identity is updated with what was found; the returned [`Source`] says where the
/// annotations came from. No network call is made for a pod the runtime's annotations
/// decide alone.
///
/// A pod whose profile reads its spec (the decision needs the pod's spec) is asked about
/// too: the runtime's annotations stay, the agent adds the spec's facts. Without them the
/// decision stays [`Decision::NeedsPodSpec`], naming each source tried: the ADD fails
/// closed and the runtime retries.
pub fn decide_with_lookup(config: &PluginConfig, pod: &mut PodIdentity) -> (Decision, Source) {
    let d = decide_for_add(config, pod, None);
    (d.decision, d.source)
}

/// [`decide_with_lookup`] for the ADD of `add`: a lookup it needs carries `add`, which the
/// agent may take as the ADD's note ([`Decided::noted`]).
pub fn decide_for_add(
    config: &PluginConfig,
    pod: &mut PodIdentity,
    add: Option<&AddTarget>,
) -> Decided {
    let decided = |decision, source, noted| Decided {
        decision,
        source,
        noted,
    };
    if !needs_lookup(config, pod) {
        let d = decide(config, pod);
        let Decision::NeedsPodSpec { profile, reason } = d else {
            return decided(d, Source::RuntimeConfig, false);
        };
        return match lookup::resolve(config, pod, add) {
            Resolved::Found {
                facts: Some(facts),
                noted,
                ..
            } => {
                pod.facts = Some(facts);
                decided(decide(config, pod), Source::RuntimeConfig, noted)
            }
            Resolved::Found {
                facts: None, noted, ..
            } => decided(
                Decision::NeedsPodSpec {
                    profile,
                    reason: format!(
                        "{reason}; the agent knows the pod but not its spec (it runs without a Kubernetes API)"
                    ),
                },
                Source::RuntimeConfig,
                noted,
            ),
            Resolved::Undecided { tried } => decided(
                Decision::NeedsPodSpec {
                    profile,
                    reason: format!("{reason}; {}", tried.join("; ")),
                },
                Source::RuntimeConfig,
                false,
            ),
        };
    }
    match lookup::resolve(config, pod, add) {
        Resolved::Found {
            annotations,
            facts,
            source,
            noted,
        } => {
            pod.annotations = Some(annotations);
            pod.facts = facts;
            decided(decide(config, pod), source, noted)
        }
        Resolved::Undecided { tried } => decided(
            Decision::Undecided {
                reason: format!(
                    "the runtime did not pass the annotations of pod {} and no source could \
                     tell them: {}",
                    pod.display_name(),
                    tried.join("; ")
                ),
            },
            Source::None,
            false,
        ),
    }
}

/// What `interlock-cni` in its guard role does with an ADD (see [`guard_verdict`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuardVerdict {
    /// Let the pod through: the mesh's plugin, next in the chain, decides (why, for the
    /// log).
    Pass(String),
    /// Let a meshed pod through and tell the agent, whose audit then proves it captured.
    PassAndNote,
    /// Refuse with "try again later" (11): the message for the runtime.
    Hold(String),
    /// A pod hold would refuse, let through under `failurePolicy: open` (why, logged as
    /// an error).
    PassOpen(String),
}

/// The guard role's answer for a pod, from the entry's role and the pod's
/// [`Recognition`] (pure). Hold refuses only meshed pods, and pods it cannot tell
/// apart: every other pod passes, the mesh's own installer pod included (it needs a
/// pod network on three of the four meshes). Out of hold, an undecidable pod passes:
/// the mesh's plugin follows and decides for itself. With `failurePolicy: open`
/// (`open`) a pod hold would refuse passes instead, which the caller logs as an error,
/// as for the redirecting role.
pub fn guard_verdict(
    role: &GuardRole,
    pod: &str,
    recognition: &Recognition,
    open: bool,
) -> GuardVerdict {
    let t = role.mesh.plugin_type();
    let why = role
        .reason
        .as_deref()
        .filter(|r| !r.is_empty())
        .unwrap_or("no reason given");
    match (recognition, role.hold) {
        (Recognition::NotMeshed(r), _) => GuardVerdict::Pass(format!("not meshed: {r}")),
        (Recognition::Meshed, false) => GuardVerdict::PassAndNote,
        (Recognition::Meshed | Recognition::Undecidable(_), true) if open => {
            GuardVerdict::PassOpen(format!(
                "runs WITHOUT its traffic captured (failurePolicy open): {t} cannot run in \
                 this node's CNI chain now ({why}), and the pod is meshed by it or cannot be \
                 told apart ({})",
                recognition.label()
            ))
        }
        (Recognition::Undecidable(r), false) => GuardVerdict::Pass(format!("{t} decides ({r})")),
        (Recognition::Meshed, true) => GuardVerdict::Hold(format!(
            "pod {pod} is held: it is meshed by {t}, and {t} cannot run in this node's CNI \
             chain now ({why}); without it the pod would start with its traffic uncaptured, \
             so it waits (fail closed; the runtime retries)"
        )),
        (Recognition::Undecidable(r), true) => GuardVerdict::Hold(format!(
            "pod {pod} is held: {t} cannot run in this node's CNI chain now ({why}), and \
             whether the pod is meshed cannot be told ({r}), so it waits (fail closed; the \
             runtime retries)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use interlock_redirect::ProfileName;
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
            facts: None,
        }
    }

    fn istio_facts() -> interlock_contract::pod::PodFacts {
        interlock_contract::pod::PodFacts {
            labels: BTreeMap::new(),
            containers: vec![interlock_contract::pod::ContainerFacts::named(
                "istio-proxy",
                false,
            )],
        }
    }

    #[test]
    fn guard_verdicts() {
        use interlock_contract::guard::GuardedMesh;
        let role = |hold: bool| GuardRole {
            mesh: GuardedMesh::Consul,
            hold,
            reason: hold.then(|| "consul-cni binary missing from /opt/cni/bin".to_string()),
            exclude_namespaces: vec![],
        };
        let meshed = Recognition::Meshed;
        let not = Recognition::NotMeshed("no transparent-proxy-status".into());
        let unknown = Recognition::Undecidable("no annotations, no agent".into());
        let label = |v: &GuardVerdict| match v {
            GuardVerdict::Pass(_) => "pass",
            GuardVerdict::PassAndNote => "pass+note",
            GuardVerdict::Hold(_) => "hold",
            GuardVerdict::PassOpen(_) => "pass-open",
        };
        let cases = [
            (false, &meshed, "pass+note"),
            (false, &not, "pass"),
            (false, &unknown, "pass"),
            (true, &meshed, "hold"),
            (true, &not, "pass"),
            (true, &unknown, "hold"),
        ];
        for (hold, r, want) in cases {
            let v = guard_verdict(&role(hold), "shop/cart-0", r, false);
            assert_eq!(label(&v), want, "hold {hold}, {r:?}: {v:?}");
            if let GuardVerdict::Hold(m) = &v {
                assert!(
                    m.contains("shop/cart-0")
                        && m.contains("consul-cni")
                        && m.contains("binary missing from /opt/cni/bin"),
                    "{m}"
                );
            }
        }
        let GuardVerdict::Hold(m) = guard_verdict(&role(true), "shop/x", &unknown, false) else {
            panic!()
        };
        assert!(m.contains("no annotations, no agent"), "{m}");
        // failurePolicy open lets a held pod through, saying so; nothing else changes.
        for r in [&meshed, &unknown] {
            let v = guard_verdict(&role(true), "shop/x", r, true);
            let GuardVerdict::PassOpen(m) = &v else {
                panic!("{v:?}")
            };
            assert!(m.contains("WITHOUT") && m.contains("consul-cni"), "{m}");
        }
        assert_eq!(
            guard_verdict(&role(false), "shop/x", &meshed, true),
            GuardVerdict::PassAndNote
        );
        // A hold without a reason still says so.
        let mut bare = role(true);
        bare.reason = None;
        let GuardVerdict::Hold(m) = guard_verdict(&bare, "shop/x", &meshed, false) else {
            panic!()
        };
        assert!(m.contains("no reason given"), "{m}");
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
        // Istio's rules depend on the pod's spec: without its facts, the agent is needed.
        assert_eq!(
            decide(&c, &pod("shop", Some(&istio))).label(),
            "needs-pod-spec"
        );
        let mut with_facts = pod("shop", Some(&istio));
        with_facts.facts = Some(istio_facts());
        let d = decide(&c, &with_facts);
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
        c.profiles = vec![ProfileName::Generic];
        let bad = [
            ("interlock.dev/redirect", "enabled"),
            ("interlock.dev/exclude-inbound-ports", "http"),
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
        // An Istio pod whose annotations came from the runtime still asks for its spec,
        // and without an agent stays undecided, fail closed.
        let mut p = pod("shop", Some(&[("sidecar.istio.io/status", "{}")]));
        let (d, source) = decide_with_lookup(&c, &mut p);
        assert_eq!(source, Source::RuntimeConfig);
        let Decision::NeedsPodSpec { reason, .. } = d else {
            panic!("{d:?}")
        };
        assert!(reason.contains("/nonexistent/il-agent.sock"), "{reason}");
        assert!(reason.contains("istio-proxy"), "{reason}");
    }
}

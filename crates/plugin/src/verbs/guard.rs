//! The guard role (the entry's `guard`): `interlock-cni` sits between the primary plugin
//! and a mesh's own plugin T, writes no rules and keeps no state. ADD holds meshed pods
//! back while T cannot run (`hold`, set by the agent's config guard) and lets every
//! other pod through; a meshed pod that passes is announced to the agent, whose audit
//! proves it captured by a connection. DEL, CHECK and GC pass (DEL and GC still release
//! attachments an earlier, redirecting entry left); STATUS always succeeds: a hold is
//! not a state that fails STATUS (the node's network would go NotReady, and the
//! kubelet would then start no non-hostNetwork pod, the mesh's own installer pod
//! included on three of the four meshes); the agent's taint and condition say it.

use std::time::Instant;

use interlock_cni_types::{CniError, CniResult};
use interlock_contract::codes;
use interlock_contract::guard::{GuardPod, GuardRole, GuardedMesh, Recognition};

use super::{ms, Call};
use crate::decide::{guard_verdict, GuardVerdict};
use crate::lookup::{self, Resolved};
use interlock_attach::pod::{PodIdentity, Source};
use interlock_attach::protect::micros;
use interlock_attach::state::StateStore;

pub(super) fn add(call: &Call, role: &GuardRole) -> Result<CniResult, CniError> {
    let start = Instant::now();
    let prev = call.prev_result("ADD")?;
    let mut pod = PodIdentity::from_cni(call.inv.args(), &call.inv.conf)
        .map_err(|e| call.err(codes::INVALID_NETWORK_CONFIG, e.to_string()))?;
    let name = pod.display_name();
    if !pod.is_kubernetes_pod() {
        // Every guarded mesh's plugin skips such a call itself.
        call.log.info(&format!(
            "guard ({}): not a Kubernetes pod, passed to {}",
            role.mesh,
            role.mesh.plugin_type()
        ));
        return Ok(prev);
    }
    let add = crate::agent_client::AddTarget {
        sandbox: call.key().container_id.clone(),
        netns: call.inv.netns().to_string(),
    };
    let (recognition, source, noted) = recognise(call, role, &mut pod, &add);
    let open = call.config.failure_policy == interlock_contract::config::FailurePolicy::Open;
    let verdict = guard_verdict(role, &name, &recognition, open);
    let took = ms(micros(start.elapsed()));
    match verdict {
        GuardVerdict::Hold(msg) => {
            note_held(call, role, &pod, false);
            Err(call.err(codes::TRY_AGAIN_LATER, msg).with_details(format!(
                "the interlock agent sets hold while {} is missing from, or cannot run in, \
                 the effective CNI config; it lifts it once the plugin is back \
                 (annotations from {source}; {took})",
                role.mesh.plugin_type()
            )))
        }
        GuardVerdict::PassOpen(why) => {
            note_held(call, role, &pod, true);
            call.log.error(&format!(
                "pod {name}: guard ({}): {why}; annotations from {source}; total {took}",
                role.mesh
            ));
            Ok(prev)
        }
        GuardVerdict::Pass(why) => {
            call.log.info(&format!(
                "pod {name}: guard ({}): passed, {why}; annotations from {source}; total {took}",
                role.mesh
            ));
            Ok(prev)
        }
        GuardVerdict::PassAndNote => {
            call.log.info(&format!(
                "pod {name}: guard ({}): meshed, passed to {} (the agent's audit proves \
                 capture); annotations from {source}; total {took}",
                role.mesh,
                role.mesh.plugin_type()
            ));
            if let (Some(socket), false) = (&call.config.agent_socket, noted) {
                if let Err(e) = crate::agent_client::note_added(socket, &add.sandbox, &add.netns) {
                    call.log
                        .debug(&format!("pod {name}: the ADD note was not sent: {e}"));
                }
            }
            Ok(prev)
        }
    }
}

/// The pod's [`Recognition`], where its annotations came from, and whether the agent
/// took a lookup as the ADD's note. The agent is asked only when the answer needs it:
/// the runtime passed no annotations; or, in hold, the answer from the annotations alone
/// could change with the pod's containers (a meshed pod might be one whose init
/// container writes the rules; a Linkerd pod is meshed by its containers alone). No
/// call is made for a pod the runtime's annotations decide out of hold.
fn recognise(
    call: &Call,
    role: &GuardRole,
    pod: &mut PodIdentity,
    add: &crate::agent_client::AddTarget,
) -> (Recognition, Source, bool) {
    let display = pod.display_name();
    let judge = |pod: &PodIdentity| {
        role.mesh.recognise(
            &GuardPod {
                display: &display,
                namespace: &pod.namespace,
                annotations: pod.annotations.as_ref(),
                facts: pod.facts.as_ref(),
            },
            &role.exclude_namespaces,
        )
    };
    let first = judge(pod);
    let ask = match &first {
        Recognition::Undecidable(_) => true,
        // consul-cni decides on the annotations alone: nothing to ask.
        Recognition::Meshed => role.hold && pod.facts.is_none() && role.mesh != GuardedMesh::Consul,
        Recognition::NotMeshed(_) => {
            role.hold
                && pod.facts.is_none()
                && role.mesh == GuardedMesh::Linkerd
                && !role.exclude_namespaces.contains(&pod.namespace)
        }
    };
    if !ask {
        return (first, Source::RuntimeConfig, false);
    }
    match lookup::resolve(call.config, pod, Some(add)) {
        Resolved::Found {
            annotations,
            facts,
            noted,
            source,
        } => {
            let runtime_had = pod.annotations.is_some();
            if !runtime_had {
                pod.annotations = Some(annotations);
            }
            pod.facts = facts;
            let source = if runtime_had {
                Source::RuntimeConfig
            } else {
                source
            };
            (judge(pod), source, noted)
        }
        Resolved::Undecided { tried } => {
            let r = match first {
                Recognition::Undecidable(r) => {
                    Recognition::Undecidable(format!("{r}; {}", tried.join("; ")))
                }
                other => {
                    call.log.debug(&format!(
                        "pod {display}: the agent could not tell the containers ({}); \
                         deciding on the annotations",
                        tried.join("; ")
                    ));
                    other
                }
            };
            let source = if pod.annotations.is_some() {
                Source::RuntimeConfig
            } else {
                Source::None
            };
            (r, source, false)
        }
    }
}

/// Tells the agent a pod start was refused by the hold (counted as refused), or let
/// through unprotected under `failurePolicy: open` (`open`). Best effort.
fn note_held(call: &Call, role: &GuardRole, pod: &PodIdentity, open: bool) {
    use interlock_contract::agent_socket::{outcome, FailedNote, OP_FAILED, PROTOCOL_VERSION};
    let Some(socket) = &call.config.agent_socket else {
        return;
    };
    let note = FailedNote {
        v: PROTOCOL_VERSION,
        op: OP_FAILED.into(),
        sandbox: call.key().container_id.clone(),
        netns: call.inv.netns().to_string(),
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        outcome: if open {
            outcome::UNPROTECTED
        } else {
            outcome::REFUSED
        }
        .into(),
        reason: "guard-hold".into(),
        profile: role.mesh.as_str().into(),
        code: if open { 0 } else { codes::TRY_AGAIN_LATER },
    };
    if let Err(e) = crate::agent_client::note_failed(socket, &note) {
        call.log.debug(&format!(
            "pod {}: the hold note to the agent was not sent: {e}",
            pod.display_name()
        ));
    }
}

/// True when this attachment has state from an earlier, redirecting entry (or an opt-in
/// in-place repair), which the ordinary DEL releases; otherwise the guard role's DEL
/// has nothing to do.
pub(super) fn has_state(call: &Call) -> bool {
    !matches!(
        StateStore::new(&call.config.state_dir).load(&call.key()),
        Ok(None)
    )
}

/// CHECK in the guard role: nothing of interlock's to verify (T checks its own part).
pub(super) fn check(call: &Call, role: &GuardRole) -> Result<(), CniError> {
    call.prev_result("CHECK")?;
    call.log.debug(&format!(
        "guard ({}): nothing to check, {} follows",
        role.mesh,
        role.mesh.plugin_type()
    ));
    Ok(())
}

//! ADD: decide whether the pod is meshed, protect it (see [`interlock_attach::protect`]), record
//! the attachment's state and its reference on the netns, and return `prevResult`
//! (converted to the config's version by the skeleton). Any failure for a meshed pod
//! fails the ADD naming the pod, the step and the cause — unless `failurePolicy: open`,
//! which records the attachment as unprotected and logs at error level.

use std::time::Instant;

use interlock_cni_types::{CniError, CniResult};
use interlock_contract::codes::{self, Step};
use interlock_contract::config::FailurePolicy;

use super::{ms, Call};
use crate::decide::{self, Decision};
use interlock_attach::outcome::Protection;
use interlock_attach::pod::PodIdentity;
use interlock_attach::protect::{self, micros, Failure};
use interlock_attach::state::{AttachmentState, StateStore};

pub(super) fn add(call: &Call) -> Result<CniResult, CniError> {
    let start = Instant::now();
    let prev = call.prev_result("ADD")?;
    let mut pod = PodIdentity::from_cni(call.inv.args(), &call.inv.conf)
        .map_err(|e| call.err(codes::INVALID_NETWORK_CONFIG, e.to_string()))?;
    call.log.debug_with(|| format!("decision input: {pod:?}"));
    let netns = call.inv.netns();
    let add = crate::agent_client::AddTarget {
        sandbox: call.key().container_id.clone(),
        netns: netns.to_string(),
    };
    let decide::Decided {
        decision,
        source,
        noted,
    } = decide::decide_for_add(call.config, &mut pod, Some(&add));
    let decide_us = micros(start.elapsed());
    let name = pod.display_name();
    let ifname = call.inv.ifname();
    let open = call.config.failure_policy == FailurePolicy::Open;

    let store = StateStore::new(&call.config.state_dir);
    let outcome = match &decision {
        Decision::Invalid { reason } => Err(Failure::clean(Step::Spec, reason.clone())),
        Decision::Undecided { reason } => Err(Failure::clean(
            Step::Lookup,
            format!("cannot decide whether the pod is meshed: {reason}"),
        )),
        Decision::NeedsPodSpec { reason, .. } => Err(Failure::clean(
            Step::Lookup,
            format!("cannot tell the pod's redirection without its spec: {reason}"),
        )),
        _ => protect::protect(
            call.config,
            &store,
            &call.key(),
            netns,
            &decision,
            &prev,
            ifname,
        ),
    };
    let (protection, claim) = match outcome {
        Ok(p) => p,
        Err(f) if !open => {
            note_failure(call, &pod, netns, &decision, &f, false);
            return Err(f
                .to_cni_error(call.inv.version, &name)
                .with_details(failure_details(&f, netns)));
        }
        Err(f) => {
            note_failure(call, &pod, netns, &decision, &f, true);
            call.log.error(&format!(
                "pod {name} runs WITHOUT traffic redirection (failurePolicy open): step {} \
                 failed: {}",
                f.step, f.message
            ));
            (
                Protection::Unprotected {
                    step: f.step.to_string(),
                    reason: f.message,
                },
                None,
            )
        }
    };
    let mut state = AttachmentState {
        key: call.key(),
        netns: netns.to_string(),
        netns_id: claim.as_ref().map(|c| c.netns_id().to_string()),
        network: call.inv.network().to_string(),
        cni_version: call.inv.version.to_string(),
        pod: pod.clone(),
        annotations_source: source,
        decision: decision.clone(),
        protection: protection.clone(),
        added_at_ms: interlock_contract::time::now_ms(),
        add_us: 0,
    };
    state.add_us = micros(start.elapsed());
    for note in claim.iter().flat_map(|c| c.notes()) {
        call.log.info(&format!("pod {name}: {note}"));
    }
    let saved = store.save(&state).and_then(|()| match &claim {
        Some(c) => c.commit(),
        None => Ok(()),
    });
    if let Err(e) = saved {
        match (&protection, open) {
            // Nothing was done in the pod's netns: interlock's bookkeeping must not stop
            // a pod that needs no protection.
            (Protection::NotNeeded, _) => call.log.warn(&format!(
                "pod {name}: writing attachment state failed (nothing to protect, ADD continues): {e}"
            )),
            (_, false) => {
                let _ = store.remove(&call.key());
                let left = claim.and_then(protect::Claim::abort);
                let f = Failure {
                    leftover_rules: left,
                    ..Failure::clean(Step::State, format!("writing attachment state: {e}"))
                };
                note_failure(call, &pod, netns, &decision, &f, false);
                return Err(f
                    .to_cni_error(call.inv.version, &name)
                    .with_details(failure_details(&f, netns)));
            }
            (_, true) => {
                if let Some(c) = &claim {
                    let _ = c.commit();
                }
                call.log.error(&format!(
                    "pod {name}: writing attachment state failed (failurePolicy open, ADD continues): {e}"
                ))
            }
        }
    }
    let total = micros(start.elapsed());
    let what = match (&decision, &protection) {
        (Decision::Meshed { profile, .. }, Protection::Protected(p)) => format!(
            "meshed ({profile}), protected with {} ({}), spec {}, probe {}; decide {}, rules {}, probe {}",
            p.backend,
            p.backend_reason,
            &p.spec_hash[..12.min(p.spec_hash.len())],
            p.probe.len(),
            ms(decide_us),
            ms(p.timings.rules_us),
            ms(p.timings.probe_us),
        ),
        (_, Protection::Unprotected { step, .. }) => {
            format!("{}, UNPROTECTED (step {step} failed, failurePolicy open)", decision.label())
        }
        (Decision::Skip { reason } | Decision::NotMeshed { reason }, _) => {
            format!("{} ({reason})", decision.label())
        }
        _ => decision.label().to_string(),
    };
    call.log.info(&format!(
        "pod {name}: {what}; annotations from {source}; total {}",
        ms(total)
    ));
    // The agent learnt of this ADD from its lookup already when it says so.
    if let (Some(socket), Protection::Protected(_), false) =
        (&call.config.agent_socket, &protection, noted)
    {
        if let Err(e) = crate::agent_client::note_added(socket, &call.key().container_id, netns) {
            call.log.debug(&format!(
                "pod {name}: the ADD note to the agent was not sent: {e}"
            ));
        }
    }
    Ok(prev)
}

/// Tells the agent about a pod start this ADD did not protect, so it counts it
/// (`interlock_pod_starts_*_total`): refused (no decision, nothing touched), failed (a
/// protection step failed) or, with `failurePolicy: open` (`open`), unprotected. Only on
/// this path: a pod that starts protected sends nothing more. Best effort, and never
/// while the agent socket is unknown (`agentSocket` unset).
fn note_failure(
    call: &Call,
    pod: &PodIdentity,
    netns: &str,
    decision: &Decision,
    f: &Failure,
    open: bool,
) {
    use interlock_contract::agent_socket::{outcome, FailedNote, OP_FAILED, PROTOCOL_VERSION};
    let Some(socket) = &call.config.agent_socket else {
        return;
    };
    let (profile, refused) = match decision {
        Decision::Meshed { profile, .. } | Decision::NeedsPodSpec { profile, .. } => (
            profile.to_string(),
            matches!(decision, Decision::NeedsPodSpec { .. }),
        ),
        Decision::Undecided { .. } | Decision::Invalid { .. } => ("unknown".to_string(), true),
        _ => ("unknown".to_string(), false),
    };
    let note = FailedNote {
        v: PROTOCOL_VERSION,
        op: OP_FAILED.into(),
        sandbox: call.key().container_id.clone(),
        netns: netns.to_string(),
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        outcome: match (open, refused) {
            (true, _) => outcome::UNPROTECTED,
            (false, true) => outcome::REFUSED,
            (false, false) => outcome::FAILED,
        }
        .into(),
        reason: if refused {
            decision.label().to_string()
        } else {
            f.step.as_str().to_string()
        },
        profile,
        code: if open { 0 } else { f.code },
    };
    if let Err(e) = crate::agent_client::note_failed(socket, &note) {
        call.log.debug(&format!(
            "pod {}: the failure note to the agent was not sent: {e}",
            pod.display_name()
        ));
    }
}

/// The `details` of a failed ADD (failurePolicy closed): what happens next, and whether
/// interlock's rules were left in the netns.
pub(super) fn failure_details(f: &Failure, netns: &str) -> String {
    let closed = "failurePolicy is closed: the pod does not start until its traffic \
                  redirection is in place and proven (the runtime retries the ADD)";
    match &f.leftover_rules {
        None => format!("{closed}; no interlock rules were left in its network namespace"),
        Some(leftover) => format!(
            "{closed}; {leftover} in its network namespace {netns}: the CNI DEL that \
             follows a failed ADD retries removing them (every backend's rules)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_details_say_whether_rules_remain() {
        use interlock_redirect::backend::{BackendError, BackendKind};
        use interlock_redirect::EngineError;
        let kind = BackendKind::IptablesNft;
        let apply = |cleanup: Option<&str>| EngineError::Apply {
            netns: "/run/netns/ilpod".into(),
            backend: kind,
            source: Box::new(BackendError::Tool {
                backend: kind,
                op: Step::Apply,
                command: "iptables-nft-restore --noflush (IPv4)".into(),
                status: "exit status: 2".into(),
                stderr: "iptables-nft-restore failed".into(),
                input: None,
            }),
            cleanup: cleanup.map(String::from),
        };
        let clean = failure_details(&Failure::from(apply(None)), "/run/netns/ilpod");
        assert!(
            clean.contains("no interlock rules were left") && !clean.contains("may remain"),
            "{clean}"
        );
        let f = Failure::from(apply(Some("iptables-nft-restore: exit 4")));
        assert_eq!((f.step, f.code), (Step::Apply, 102));
        let dirty = failure_details(&f, "/run/netns/ilpod");
        assert!(
            !dirty.contains("no interlock rules were left")
                && dirty.contains("interlock's iptables-nft rules may remain")
                && dirty.contains("iptables-nft-restore: exit 4")
                && dirty.contains("/run/netns/ilpod")
                && dirty.contains("DEL")
                && dirty.contains("retries removing them"),
            "{dirty}"
        );
        // Failures before anything was applied leave nothing.
        let lookup = Failure::clean(Step::Lookup, "no agent");
        assert!(failure_details(&lookup, "/x").contains("no interlock rules were left"));
    }
}

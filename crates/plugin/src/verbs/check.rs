//! CHECK: re-read the recorded spec's rules in the netns and fail with every difference
//! when they are not exactly the expected ones (never re-apply or probe: the proxy owns
//! its port by then). Succeeds for pods that needed nothing; fails for a meshed pod
//! recorded as unprotected.

use std::time::Instant;

use interlock_cni_types::CniError;
use interlock_contract::codes;

use super::{ms, Call};
use interlock_attach::outcome::Protection;
use interlock_attach::protect::{self, micros};
use interlock_attach::state::StateStore;

pub(super) fn check(call: &Call) -> Result<(), CniError> {
    let start = Instant::now();
    call.prev_result("CHECK")?;
    let store = StateStore::new(&call.config.state_dir);
    let state = match store.load(&call.key()) {
        Ok(Some(state)) => state,
        Ok(None) => return Err(call.err(
            codes::UNKNOWN_CONTAINER,
            format!(
                "interlock-cni has no state for container {} interface {}: it was never added through interlock-cni",
                call.key().container_id,
                call.key().ifname
            ),
        )),
        Err(e) => return Err(call.err(codes::IO_FAILURE, format!("reading attachment state: {e}"))),
    };
    let name = state.pod.display_name();
    let netns = call.inv.netns();
    let verdict = match &state.protection {
        Protection::NotNeeded => format!("{}: nothing to verify", state.decision.label()),
        Protection::Protected(p) => {
            protect::check(p, netns).map_err(|f| {
                f.to_cni_error(call.inv.version, &name).with_details(
                    "re-run ADD (or let the agent repair the pod) to re-apply the rules",
                )
            })?;
            format!("rules verified exact ({})", p.backend)
        }
        Protection::Unprotected { step, reason } => {
            return Err(call.err(
                codes::VERIFY,
                format!(
                    "pod {name}: is meshed but was left WITHOUT redirection at ADD \
                     (failurePolicy open; step {step} failed: {reason})"
                ),
            ))
        }
    };
    call.log.info(&format!(
        "pod {name}: {verdict}; total {}",
        ms(micros(start.elapsed()))
    ));
    Ok(())
}

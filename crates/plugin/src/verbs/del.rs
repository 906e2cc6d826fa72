//! DEL: drop the attachment's reference on its netns, remove interlock's rules there
//! when no other live attachment relies on them (see [`interlock_attach::protect::release`]), then
//! the attachment's state. An empty `CNI_NETNS`, a netns that is gone and a second DEL
//! are success.

use std::time::Instant;

use interlock_cni_types::CniError;
use interlock_contract::codes::{self, Step};
use interlock_contract::layout;
use serde_json::Map;

use super::{ms, Call};
use interlock_attach::pod::PodIdentity;
use interlock_attach::protect::{self, micros, Failure, Undone};
use interlock_attach::state::StateStore;

pub(super) fn del(call: &Call) -> Result<(), CniError> {
    if call.inv.network() == layout::HOLDING_NETWORK {
        // Under the agent's holding config the runtime would run only this DEL, and
        // report the sandbox's network gone while the primary's part (its address in
        // IPAM, its interfaces) was never released. Fail like a node without any config
        // does, so the runtime retries once the primary's config is back and the whole
        // chain's DEL runs (interlock's part included).
        return Err(call.err(
            codes::TRY_AGAIN_LATER,
            "DEL refused: this node has no primary CNI config right now, so the primary's \
             teardown (its IP address, its interfaces) cannot run; the runtime retries, and \
             the DEL succeeds once the primary has written its config again",
        ));
    }
    let start = Instant::now();
    let store = StateStore::new(&call.config.state_dir);
    let key = call.key();
    let state = match store.load(&key) {
        Ok(s) => s,
        Err(e) => {
            call.log.error(&format!(
                "attachment state unreadable, removing every backend's rules: {e}"
            ));
            None
        }
    };
    let name = match &state {
        Some(s) => s.pod.display_name(),
        None => PodIdentity::from_cni(call.inv.args(), &Map::new())
            .map(|p| p.display_name())
            .unwrap_or_default(),
    };
    let netns = call.inv.netns();
    let undone = protect::release(
        &call.config.state_dir,
        &store,
        &key,
        state.as_ref(),
        netns,
        None,
    )
    .map_err(|f| {
        f.context("removing redirect rules")
            .to_cni_error(call.inv.version, &name)
    })?;
    let existed = store.remove(&key).map_err(|e| {
        Failure::clean(Step::State, format!("removing attachment state: {e}"))
            .to_cni_error(call.inv.version, &name)
    })?;
    let rules = match undone {
        Undone::Nothing if netns.is_empty() => "no netns given, no rules to remove".to_string(),
        other => other.to_string(),
    };
    call.log.info(&format!(
        "pod {name}: {rules}; {}; total {}",
        if existed {
            "state removed"
        } else {
            "no state (already deleted or never added)"
        },
        ms(micros(start.elapsed()))
    ));
    Ok(())
}

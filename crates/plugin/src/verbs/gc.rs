//! GC: what DEL does, for every attachment not in `cni.dev/valid-attachments` (only the
//! listed ones count as live references), and the sweep of temp files that killed
//! writers left in the state dir.

use std::collections::BTreeSet;
use std::time::Instant;

use interlock_cni_types::CniError;
use interlock_contract::codes;

use super::{ms, Call};
use crate::protect::{self, micros};
use crate::state::{AttachmentKey, StateStore};

pub(super) fn gc(call: &Call) -> Result<(), CniError> {
    let start = Instant::now();
    let (field, raw) =
        match call.inv.conf.get("cni.dev/valid-attachments") {
            Some(v) => ("cni.dev/valid-attachments", v),
            None => match call.inv.conf.get("cni.dev/attachments") {
                Some(v) => ("cni.dev/attachments", v),
                None => return Err(call.err(
                    codes::INVALID_NETWORK_CONFIG,
                    "cni.dev/valid-attachments: missing: GC needs the list of attachments to keep",
                )),
            },
        };
    let valid: Vec<AttachmentKey> = serde_json::from_value(raw.clone())
        .map_err(|e| call.err(codes::INVALID_NETWORK_CONFIG, format!("{field}: {e}")))?;
    let valid: BTreeSet<AttachmentKey> = valid.into_iter().collect();
    let store = StateStore::new(&call.config.state_dir);
    // Leftover rules of stale attachments whose netns still exists are removed first
    // (best effort: a failure is logged, the state goes anyway).
    let keys = store
        .keys()
        .map_err(|e| call.err(codes::IO_FAILURE, format!("GC of attachment state: {e}")))?;
    for key in keys.iter().filter(|k| !valid.contains(k)) {
        if let Ok(Some(state)) = store.load(key) {
            if let Err(f) = protect::release(
                &call.config.state_dir,
                &store,
                key,
                Some(&state),
                &state.netns,
                Some(&valid),
            ) {
                call.log.error(&format!(
                    "GC: pod {}: removing leftover rules in {} failed: {}",
                    state.pod.display_name(),
                    state.netns,
                    f.message
                ));
            }
        }
    }
    // Temp files of atomic writes whose writer was killed (an ADD killed mid-write);
    // the agent sweeps them too.
    let swept = crate::state::sweep_abandoned_temps(&[
        call.config.state_dir.clone(),
        store.dir().to_path_buf(),
        interlock_redirect::netns_record::NetnsStore::new(&call.config.state_dir)
            .dir()
            .to_path_buf(),
    ]);
    if !swept.is_empty() {
        call.log.info(&format!(
            "GC removed {} abandoned temp file(s) of killed writers",
            swept.len()
        ));
    }
    let removed = store
        .retain(&valid)
        .map_err(|e| call.err(codes::IO_FAILURE, format!("GC of attachment state: {e}")))?;
    call.log.info(&format!(
        "GC kept {} valid attachment(s), removed state of {}; total {}",
        valid.len(),
        removed.len(),
        ms(micros(start.elapsed()))
    ));
    Ok(())
}

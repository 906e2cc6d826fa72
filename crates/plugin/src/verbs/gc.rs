//! GC: what DEL does, for every attachment of this network not in
//! `cni.dev/valid-attachments`, and the sweep of temp files that killed writers left in
//! the state dir.
//!
//! The list is the valid attachments *of the network being collected* (the spec's
//! wording; libcni passes it per network list). The state dir is shared by every network
//! that chains interlock-cni (Multus): an attachment recorded under another network is
//! neither collected nor counted as dead here, and stays a live reference to its netns's
//! rules.

use std::collections::BTreeSet;
use std::time::Instant;

use interlock_cni_types::CniError;
use interlock_contract::codes;

use super::{ms, Call};
use interlock_attach::protect::{self, micros};
use interlock_attach::state::{AttachmentKey, StateStore};

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
    let network = call
        .inv
        .conf
        .get("name")
        .and_then(|n| n.as_str())
        .unwrap_or("");
    let store = StateStore::new(&call.config.state_dir);
    let keys = store
        .keys()
        .map_err(|e| call.err(codes::IO_FAILURE, format!("GC of attachment state: {e}")))?;
    // What stays: the valid attachments, and every attachment of another network (its own
    // GC decides about it). A state that cannot be read belongs to no network: it goes.
    let mut states = Vec::new();
    let mut keep = valid.clone();
    for key in &keys {
        match store.load(key) {
            Ok(Some(state)) if state.network != network => {
                keep.insert(key.clone());
            }
            Ok(Some(state)) if !valid.contains(key) => states.push((key, state)),
            _ => {}
        }
    }
    // Leftover rules of stale attachments whose netns still exists are removed first
    // (best effort: a failure is logged, the state goes anyway).
    for (key, state) in states {
        {
            if let Err(f) = protect::release(
                &call.config.state_dir,
                &store,
                key,
                Some(&state),
                &state.netns,
                Some(&keep),
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
    let swept = interlock_attach::state::sweep_abandoned_temps(&[
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
    // Netns lock files whose holder died before writing a record (the agent's audit
    // sweeps them too); one a live process holds is never removed.
    match interlock_redirect::netns_record::NetnsStore::new(&call.config.state_dir)
        .sweep_orphan_locks()
    {
        Ok(locks) if !locks.is_empty() => call.log.info(&format!(
            "GC removed {} netns lock file(s) left by holders that died",
            locks.len()
        )),
        Ok(_) => {}
        Err(e) => call.log.error(&format!(
            "GC: sweeping netns lock files left by dead holders: {e}"
        )),
    }
    let removed = store
        .retain(&keep)
        .map_err(|e| call.err(codes::IO_FAILURE, format!("GC of attachment state: {e}")))?;
    call.log.info(&format!(
        "GC of network {network:?} kept {} valid attachment(s) and {} of other networks, removed state of {}; total {}",
        valid.len(),
        keep.len() - valid.len(),
        removed.len(),
        ms(micros(start.elapsed()))
    ));
    Ok(())
}

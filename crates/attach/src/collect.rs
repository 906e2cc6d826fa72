//! Collecting the attachments of sandboxes that are gone: the agent's audit removes the
//! state (and the netns reference) of every attachment whose sandbox the runtime no
//! longer lists **and** whose network namespace no longer exists — what DEL would have
//! removed had interlock been in the chain when the runtime ran it. That happens to the
//! state an in-place repair writes: the sandbox was created, and is deleted, through a
//! chain without interlock, so no DEL and no GC of interlock's may ever come.
//!
//! Both conditions are required: a sandbox the runtime still lists (even stopped) keeps
//! its state for its own DEL, and an attachment whose netns exists may belong to an ADD
//! still in progress (its sandbox not listed yet). Removal is DEL's own
//! ([`crate::protect::release`] then [`StateStore::remove`]), except that no netns is
//! entered: the recorded one is gone, and its path may name another one by now.

use std::collections::BTreeSet;
use std::path::Path;

use interlock_redirect::netns::pod_netns_id;

use crate::protect::{release, Undone};
use crate::state::{AttachmentKey, AttachmentState, StateStore};

/// What the netns path an attachment recorded names now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetnsNow {
    /// The recorded netns (same identity, or no identity recorded and the path is one).
    Same,
    /// No network namespace behind the path any more.
    Gone,
    /// Another network namespace (the recorded one is gone).
    Replaced,
    /// It could not be told (why): counts as alive.
    Unknown(String),
}

/// What `state`'s netns path names now.
pub fn netns_now(state: &AttachmentState) -> NetnsNow {
    if state.netns.is_empty() {
        return NetnsNow::Unknown("no netns recorded".into());
    }
    match pod_netns_id(Path::new(&state.netns)) {
        Ok(id) => match &state.netns_id {
            Some(recorded) if *recorded != id.to_string() => NetnsNow::Replaced,
            _ => NetnsNow::Same,
        },
        Err(e) if e.is_gone() => NetnsNow::Gone,
        Err(e) => NetnsNow::Unknown(e.to_string()),
    }
}

/// Whether the attachment `key`, whose netns is `now`, belongs to a sandbox that is gone
/// (pure): its container ID is not among the sandboxes the runtime lists (`listed`, every
/// state) and its netns no longer exists.
pub fn is_dead(listed: &BTreeSet<String>, key: &AttachmentKey, now: &NetnsNow) -> bool {
    !listed.contains(&key.container_id) && matches!(now, NetnsNow::Gone | NetnsNow::Replaced)
}

/// One attachment collected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collected {
    /// Which.
    pub key: AttachmentKey,
    /// Its pod (`namespace/name`).
    pub pod: String,
    /// Its netns path, as recorded.
    pub netns: String,
    /// What became of its netns reference.
    pub undone: Undone,
}

/// Removes the state and netns reference of every attachment under `state_dir` that
/// [`is_dead`] given the sandbox IDs the runtime lists. Returns what was collected, and
/// one message per attachment that could not be (it stays for the next pass).
pub fn collect_dead(state_dir: &Path, listed: &BTreeSet<String>) -> (Vec<Collected>, Vec<String>) {
    let store = StateStore::new(state_dir);
    let mut done = Vec::new();
    let mut failed = Vec::new();
    let keys = match store.keys() {
        Ok(k) => k,
        Err(e) => return (done, vec![format!("listing attachment state: {e}")]),
    };
    for key in keys
        .into_iter()
        .filter(|k| !listed.contains(&k.container_id))
    {
        // Unreadable state tells no netns: left to the runtime's GC.
        let Ok(Some(state)) = store.load(&key) else {
            continue;
        };
        if !is_dead(listed, &key, &netns_now(&state)) {
            continue;
        }
        let undone = match release(state_dir, &store, &key, Some(&state), "", None) {
            Ok(u) => u,
            Err(f) => {
                failed.push(format!(
                    "attachment {}/{}: dropping its netns reference: {}",
                    key.container_id, key.ifname, f.message
                ));
                continue;
            }
        };
        match store.remove(&key) {
            Ok(_) => done.push(Collected {
                pod: state.pod.display_name(),
                netns: state.netns.clone(),
                key,
                undone,
            }),
            Err(e) => failed.push(format!(
                "attachment {}/{}: removing its state: {e}",
                key.container_id, key.ifname
            )),
        }
    }
    (done, failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> AttachmentKey {
        AttachmentKey {
            container_id: id.into(),
            ifname: "eth0".into(),
        }
    }

    #[test]
    fn only_unlisted_sandboxes_whose_netns_is_gone_are_dead() {
        let listed: BTreeSet<String> = ["running".to_string(), "stopped".to_string()].into();
        let unknown = NetnsNow::Unknown("EACCES".into());
        for now in [NetnsNow::Gone, NetnsNow::Replaced] {
            assert!(is_dead(&listed, &key("removed"), &now), "{now:?}");
            // Still listed (ready or not): its own DEL comes.
            assert!(!is_dead(&listed, &key("stopped"), &now), "{now:?}");
        }
        // A netns that still exists (an ADD in progress?) or cannot be told: alive.
        for now in [NetnsNow::Same, unknown] {
            assert!(!is_dead(&listed, &key("removed"), &now), "{now:?}");
            assert!(!is_dead(&listed, &key("running"), &now), "{now:?}");
        }
    }

    #[test]
    fn a_missing_or_empty_netns_path_is_told_apart() {
        let t = tempfile::tempdir().unwrap();
        let state = |netns: String| AttachmentState {
            key: key("c"),
            netns,
            netns_id: Some("1-2".into()),
            network: "n".into(),
            cni_version: "1.0.0".into(),
            pod: crate::pod::PodIdentity {
                namespace: "ns".into(),
                name: "p".into(),
                uid: String::new(),
                annotations: None,
                facts: None,
            },
            annotations_source: crate::pod::Source::Agent,
            decision: interlock_redirect::decision::Decision::NotMeshed { reason: "t".into() },
            protection: crate::outcome::Protection::NotNeeded,
            added_at_ms: 0,
            add_us: 0,
        };
        let missing = t.path().join("cni-gone").display().to_string();
        assert_eq!(netns_now(&state(missing)), NetnsNow::Gone);
        // A plain file where the bind mount was: no namespace behind it.
        let plain = t.path().join("cni-unmounted");
        std::fs::write(&plain, "").unwrap();
        assert_eq!(
            netns_now(&state(plain.display().to_string())),
            NetnsNow::Gone
        );
        assert!(matches!(
            netns_now(&state(String::new())),
            NetnsNow::Unknown(_)
        ));
    }
}

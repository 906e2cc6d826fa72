//! The `backend: auto` detection, remembered for a minute so that not every ADD runs it.
//!
//! On a host with legacy iptables tables, [`interlock_redirect::backend::detect`] starts
//! `iptables-legacy-save` and `iptables-nft-save` and counts the host's rules: two full
//! dumps per pod. The outcome changes only when the node's operators change how the host
//! is firewalled, so ADD reuses a detection younger than [`MAX_AGE`], recorded in
//! `<stateDir>/backend-detected.json` ([`FILE_NAME`]):
//!
//! ```json
//! {"backend": "nftables", "reason": "no legacy iptables tables on the host; using nf_tables", "detectedAtMs": 1795243128267}
//! ```
//!
//! The file is written atomically. A file that is missing, unreadable, corrupt, too old or
//! dated in the future (the clock went back) is ignored: detection runs and the file is
//! rewritten. A remembered detection never fails an ADD: a write failure only shows in the recorded
//! reason.

use std::path::{Path, PathBuf};
use std::time::Duration;

use interlock_contract::atomic::write_file_atomic;
use interlock_redirect::backend::{BackendKind, Detection};
use serde::{Deserialize, Serialize};

/// The file's name inside `stateDir`.
pub const FILE_NAME: &str = "backend-detected.json";

/// How long a detection is reused.
pub const MAX_AGE: Duration = Duration::from_secs(60);

/// One recorded detection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedDetection {
    /// The backend `auto` chose.
    pub backend: BackendKind,
    /// Why (the detection's own words).
    pub reason: String,
    /// When the detection ran (Unix ms).
    pub detected_at_ms: u64,
}

impl CachedDetection {
    /// True when the detection is at most `max_age` old at `now_ms`; a timestamp in the
    /// future is not fresh.
    pub fn is_fresh(&self, now_ms: u64, max_age: Duration) -> bool {
        now_ms >= self.detected_at_ms
            && u128::from(now_ms - self.detected_at_ms) < max_age.as_millis()
    }

    /// Parses a cache file's content; `None` when it is not a valid record.
    pub fn parse(bytes: &[u8]) -> Option<CachedDetection> {
        serde_json::from_slice(bytes).ok()
    }
}

/// The cache file for `state_dir`.
pub fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(FILE_NAME)
}

/// The backend for `auto` and why: a fresh cached detection from `state_dir` when there
/// is one, else `detect()`'s, which is then cached (see the module docs). `now_ms` is the
/// current Unix time in ms.
pub fn resolve_auto(
    state_dir: &Path,
    now_ms: u64,
    detect: impl FnOnce() -> Detection,
) -> (BackendKind, String) {
    let file = path(state_dir);
    if let Some(c) = std::fs::read(&file)
        .ok()
        .and_then(|b| CachedDetection::parse(&b))
        .filter(|c| c.is_fresh(now_ms, MAX_AGE))
    {
        return (
            c.backend,
            format!(
                "auto: {} (detected {} ms ago, cached in {})",
                c.reason,
                now_ms - c.detected_at_ms,
                file.display()
            ),
        );
    }
    let d = detect();
    let record = CachedDetection {
        backend: d.kind,
        reason: d.reason.clone(),
        detected_at_ms: now_ms,
    };
    let written = std::fs::create_dir_all(state_dir).and_then(|()| {
        let mut data = serde_json::to_vec(&record).map_err(std::io::Error::other)?;
        data.push(b'\n');
        write_file_atomic(&file, &data, Some(0o644))
    });
    match written {
        Ok(()) => (d.kind, format!("auto: {}", d.reason)),
        Err(e) => (
            d.kind,
            format!("auto: {} (detection not cached: {e})", d.reason),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detection(kind: BackendKind, reason: &str) -> Detection {
        Detection {
            kind,
            reason: reason.into(),
        }
    }

    #[test]
    fn freshness() {
        let c = CachedDetection {
            backend: BackendKind::Nftables,
            reason: "r".into(),
            detected_at_ms: 1_000_000,
        };
        assert!(c.is_fresh(1_000_000, MAX_AGE));
        assert!(c.is_fresh(1_059_999, MAX_AGE));
        assert!(!c.is_fresh(1_060_000, MAX_AGE));
        assert!(
            !c.is_fresh(999_999, MAX_AGE),
            "future timestamps are not fresh"
        );
        assert!(!c.is_fresh(u64::MAX, MAX_AGE));
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(
            json,
            r#"{"backend":"nftables","reason":"r","detectedAtMs":1000000}"#
        );
        assert_eq!(CachedDetection::parse(json.as_bytes()), Some(c));
        assert_eq!(CachedDetection::parse(b"{\"backend\":\"bpf\"}"), None);
        assert_eq!(CachedDetection::parse(b"\0garbage"), None);
    }

    #[test]
    fn reuses_fresh_detection_and_replaces_stale_or_corrupt_ones() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let t0 = 1_795_000_000_000;
        // No file (and no stateDir yet): detect, write.
        let (k, why) = resolve_auto(&state, t0, || {
            detection(BackendKind::IptablesLegacy, "legacy wins")
        });
        assert_eq!(
            (k, why.as_str()),
            (BackendKind::IptablesLegacy, "auto: legacy wins")
        );
        let c = CachedDetection::parse(&std::fs::read(path(&state)).unwrap()).unwrap();
        assert_eq!(c.detected_at_ms, t0);
        // Fresh: reused, detection does not run.
        let (k, why) = resolve_auto(&state, t0 + 5_000, || panic!("detection ran"));
        assert_eq!(k, BackendKind::IptablesLegacy);
        assert!(
            why.starts_with("auto: legacy wins (detected 5000 ms ago, cached in "),
            "{why}"
        );
        // Stale: detection runs again, file rewritten.
        let (k, _) = resolve_auto(&state, t0 + 61_000, || {
            detection(BackendKind::Nftables, "nft now")
        });
        assert_eq!(k, BackendKind::Nftables);
        let c = CachedDetection::parse(&std::fs::read(path(&state)).unwrap()).unwrap();
        assert_eq!(
            (c.backend, c.detected_at_ms),
            (BackendKind::Nftables, t0 + 61_000)
        );
        // Corrupt: ignored and rewritten.
        std::fs::write(path(&state), b"{\"backend\": \"nftab").unwrap();
        let (k, why) = resolve_auto(&state, t0 + 62_000, || {
            detection(BackendKind::IptablesNft, "again")
        });
        assert_eq!((k, why.as_str()), (BackendKind::IptablesNft, "auto: again"));
        assert!(CachedDetection::parse(&std::fs::read(path(&state)).unwrap()).is_some());
        // Unwritable: ADD still gets the detection, the reason says why it is not cached.
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, b"x").unwrap();
        let (k, why) = resolve_auto(&blocker.join("state"), t0, || {
            detection(BackendKind::Nftables, "r")
        });
        assert_eq!(k, BackendKind::Nftables);
        assert!(why.starts_with("auto: r (detection not cached: "), "{why}");
    }
}

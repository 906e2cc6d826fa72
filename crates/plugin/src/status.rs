//! The agent's readiness marker, read by the plugin's STATUS verb.
//!
//! Contract (TEAM.md): `<stateDir>/agent-ready.json`,
//! `{"ready", "reason", "updatedAtMs", "staleAfterMs", "pid", "configPath"}`, written
//! atomically by the agent and refreshed at least every `staleAfterMs / 3`.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use interlock_protocol::atomic::write_file_atomic;
use interlock_protocol::error::NOT_AVAILABLE;
use interlock_protocol::CniError;
use serde::{Deserialize, Serialize};

/// File name of the marker inside `stateDir`.
pub const MARKER_FILE: &str = "agent-ready.json";

/// The agent's statement about its readiness.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadinessMarker {
    /// True when the agent guarantees protection on this node.
    pub ready: bool,
    /// Why (especially when not ready).
    #[serde(default)]
    pub reason: String,
    /// When the agent last wrote the marker (Unix ms).
    pub updated_at_ms: u64,
    /// After how long without a refresh the marker means "agent gone".
    pub stale_after_ms: u64,
    /// The agent's PID.
    #[serde(default)]
    pub pid: u32,
    /// The CNI config file the agent guards.
    #[serde(default)]
    pub config_path: String,
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The marker's path under `state_dir`.
pub fn marker_path(state_dir: &Path) -> PathBuf {
    state_dir.join(MARKER_FILE)
}

impl ReadinessMarker {
    /// Reads a marker file.
    pub fn read(path: &Path) -> io::Result<ReadinessMarker> {
        let bytes = std::fs::read(path)?;
        serde_json::from_slice(&bytes).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        })
    }

    /// Writes the marker atomically (for the agent).
    pub fn write(&self, path: &Path) -> io::Result<()> {
        let data = serde_json::to_vec(self).map_err(io::Error::other)?;
        write_file_atomic(path, &data, Some(0o644))
    }

    /// True when the marker was refreshed within `staleAfterMs` of `now_ms`.
    pub fn is_fresh(&self, now_ms: u64) -> bool {
        now_ms.saturating_sub(self.updated_at_ms) <= self.stale_after_ms
    }
}

/// STATUS: `Ok` when the agent is ready and its marker fresh; otherwise code 50 with
/// the reason.
pub fn check_status(state_dir: &Path, now_ms: u64, cni_version: &str) -> Result<(), CniError> {
    let path = marker_path(state_dir);
    let marker = match ReadinessMarker::read(&path) {
        Ok(m) => m,
        Err(e) => {
            let what = if e.kind() == io::ErrorKind::NotFound {
                "missing".to_string()
            } else {
                format!("unreadable: {e}")
            };
            return Err(CniError::new(
                cni_version,
                NOT_AVAILABLE,
                format!("interlock agent has not reported readiness ({} {what})", path.display()),
            )
            .with_details("start the interlock agent on this node (it writes the marker when the CNI config is guarded)"));
        }
    };
    if !marker.is_fresh(now_ms) {
        return Err(CniError::new(
            cni_version,
            NOT_AVAILABLE,
            format!(
                "interlock agent gone: readiness marker {} last updated {} ms ago (stale after {} ms, agent pid {})",
                path.display(),
                now_ms.saturating_sub(marker.updated_at_ms),
                marker.stale_after_ms,
                marker.pid
            ),
        ));
    }
    if !marker.ready {
        return Err(CniError::new(
            cni_version,
            NOT_AVAILABLE,
            format!("interlock agent not ready: {}", marker.reason),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marker(ready: bool, at: u64) -> ReadinessMarker {
        ReadinessMarker {
            ready,
            reason: "config guarded".into(),
            updated_at_ms: at,
            stale_after_ms: 3000,
            pid: 42,
            config_path: "/etc/cni/net.d/00-interlock.conflist".into(),
        }
    }

    #[test]
    fn status_follows_the_marker() {
        let t = tempfile::tempdir().unwrap();
        let e = check_status(t.path(), 10_000, "1.1.0").unwrap_err();
        assert_eq!(e.code, 50);
        assert!(
            e.msg.contains("has not reported readiness") && e.msg.contains("missing"),
            "{}",
            e.msg
        );
        marker(true, 9_000).write(&marker_path(t.path())).unwrap();
        check_status(t.path(), 10_000, "1.1.0").unwrap();
        let e = check_status(t.path(), 20_000, "1.1.0").unwrap_err();
        assert!(e.msg.contains("agent gone"), "{}", e.msg);
        let mut m = marker(false, 9_000);
        m.reason = "10-calico.conflist sorts before interlock".into();
        m.write(&marker_path(t.path())).unwrap();
        let e = check_status(t.path(), 10_000, "1.1.0").unwrap_err();
        assert!(e.msg.contains("sorts before interlock"), "{}", e.msg);
        std::fs::write(marker_path(t.path()), "{").unwrap();
        let e = check_status(t.path(), 10_000, "1.1.0").unwrap_err();
        assert!(e.msg.contains("unreadable"), "{}", e.msg);
    }

    #[test]
    fn json_names_are_the_contract() {
        let v = serde_json::to_value(marker(true, 1)).unwrap();
        for k in [
            "ready",
            "reason",
            "updatedAtMs",
            "staleAfterMs",
            "pid",
            "configPath",
        ] {
            assert!(v.get(k).is_some(), "{k}");
        }
        assert!(marker(true, 1000).is_fresh(4000));
        assert!(!marker(true, 1000).is_fresh(4001));
    }
}

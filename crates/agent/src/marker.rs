//! The readiness marker `interlock-cni` STATUS reads: `<stateDir>/agent-ready.json`.
//!
//! Format (contract in TEAM.md): `{"ready", "reason", "updatedAtMs", "staleAfterMs",
//! "pid", "configPath"}`. Written atomically; refreshed at least every `staleAfterMs/3`
//! so a dead agent shows as stale.

use interlock_protocol::atomic::write_file_atomic;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// File name of the marker inside the state dir.
pub const MARKER_FILE: &str = "agent-ready.json";

/// The marker's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Marker {
    /// True while the effective config carries interlock and the binary is verified.
    pub ready: bool,
    /// Why not ready (or a short "ok").
    pub reason: String,
    /// When this was written, Unix milliseconds.
    pub updated_at_ms: u64,
    /// After how many milliseconds without a refresh readers treat it as stale.
    pub stale_after_ms: u64,
    /// The agent's process id.
    pub pid: u32,
    /// The config file the runtime loads.
    pub config_path: String,
}

/// Path of the marker in `state_dir`.
pub fn marker_path(state_dir: &Path) -> PathBuf {
    state_dir.join(MARKER_FILE)
}

/// Writes `m` atomically into `state_dir` (creating the directory).
pub fn write(state_dir: &Path, m: &Marker) -> std::io::Result<()> {
    std::fs::create_dir_all(state_dir)?;
    let mut data = serde_json::to_vec(m).expect("marker serialises");
    data.push(b'\n');
    write_file_atomic(&marker_path(state_dir), &data, Some(0o644))
}

/// Reads the marker in `state_dir`.
pub fn read(state_dir: &Path) -> std::io::Result<Marker> {
    let data = std::fs::read(marker_path(state_dir))?;
    serde_json::from_slice(&data)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_with_contract_field_names() {
        let d = tempfile::tempdir().unwrap();
        let m = Marker {
            ready: true,
            reason: "ok".into(),
            updated_at_ms: 5,
            stale_after_ms: 3000,
            pid: 7,
            config_path: "/etc/cni/net.d/00-interlock.conflist".into(),
        };
        write(d.path(), &m).unwrap();
        let raw: serde_json::Value =
            serde_json::from_slice(&std::fs::read(marker_path(d.path())).unwrap()).unwrap();
        for k in [
            "ready",
            "reason",
            "updatedAtMs",
            "staleAfterMs",
            "pid",
            "configPath",
        ] {
            assert!(raw.get(k).is_some(), "{k} missing in {raw}");
        }
        assert_eq!(read(d.path()).unwrap(), m);
    }
}

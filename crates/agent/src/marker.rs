//! The readiness marker `interlock-cni` STATUS reads: `<stateDir>/agent-ready.json`.
//!
//! The type is the plugin's own [`interlock_cni::status::ReadinessMarker`] (its JSON field
//! names are the contract, tested there), so writer and reader cannot drift apart. Written atomically; the guard
//! refreshes it every `staleAfterMs/3` so a dead agent shows as stale.

use std::path::{Path, PathBuf};

pub use interlock_cni::status::{ReadinessMarker as Marker, MARKER_FILE};

/// Path of the marker in `state_dir`.
pub fn marker_path(state_dir: &Path) -> PathBuf {
    interlock_cni::status::marker_path(state_dir)
}

/// Writes `m` atomically into `state_dir` (creating the directory).
pub fn write(state_dir: &Path, m: &Marker) -> std::io::Result<()> {
    std::fs::create_dir_all(state_dir)?;
    m.write(&marker_path(state_dir))
}

/// Reads the marker in `state_dir`.
pub fn read(state_dir: &Path) -> std::io::Result<Marker> {
    Marker::read(&marker_path(state_dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_the_plugins_json_and_reads_it_back() {
        let d = tempfile::tempdir().unwrap();
        let m = Marker {
            ready: true,
            reason: "ok".into(),
            updated_at_ms: 5,
            stale_after_ms: 3000,
            pid: 7,
            pid_namespace: None,
            config_path: "/etc/cni/net.d/00-interlock.conflist".into(),
        };
        write(d.path(), &m).unwrap();
        // The bytes on disk are the plugin's contract (field names: tested in the plugin).
        let raw: serde_json::Value =
            serde_json::from_slice(&std::fs::read(marker_path(d.path())).unwrap()).unwrap();
        assert_eq!(raw, serde_json::to_value(&m).unwrap());
        assert_eq!(read(d.path()).unwrap(), m);
        assert!(m.is_fresh(3005) && !m.is_fresh(3006));
    }
}

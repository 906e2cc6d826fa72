//! The readiness marker `interlock check` reads: `<stateDir>/agent-ready.json`.
//!
//! The type is the contract's [`interlock_contract::marker::ReadinessMarker`] (its JSON
//! field names are tested there), so writer and reader cannot drift apart. Written
//! atomically, root-owned 0644; the guard refreshes it every `staleAfterMs/3` so a dead
//! agent shows as stale.

use std::path::Path;

pub use interlock_contract::layout::{marker_path, MARKER_FILE};
pub use interlock_contract::marker::ReadinessMarker as Marker;

/// Writes `m` atomically into `state_dir` (creating the directory).
pub fn write(state_dir: &Path, m: &Marker) -> std::io::Result<()> {
    std::fs::create_dir_all(state_dir)?;
    interlock_contract::atomic::write_file_atomic(
        &marker_path(state_dir),
        &m.to_bytes(),
        Some(0o644),
    )
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
            runtime: Some("containerd".into()),
            cri_endpoint: Some("unix:///run/containerd/containerd.sock".into()),
            fight: None,
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

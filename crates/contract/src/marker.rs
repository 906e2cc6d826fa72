//! The agent's readiness marker: `<stateDir>/agent-ready.json`
//! ([`crate::layout::MARKER_FILE`]), `{"ready", "reason", "updatedAtMs", "staleAfterMs",
//! "pid", "pidNamespace", "configPath", "runtime", "criEndpoint", "fight"}`, written atomically by the agent (temp file and
//! rename, root-owned, mode 0644; [`ReadinessMarker::to_bytes`]) and refreshed at least
//! every `staleAfterMs / 3`; read by `interlock check`.
//!
//! Whoever can write it can claim the agent is healthy, so [`ReadinessMarker::read`]
//! accepts only a regular file (not a symlink: the agent replaces it by rename, never
//! through a link; not a FIFO or a device), of at most [`MAX_MARKER_BYTES`], owned by root
//! (or the reader) and not writable by group or others, in a directory that is the same
//! — so nobody else can swap the file between the checks and the read. And
//! [`ReadinessMarker::staleness`] bounds `staleAfterMs` by the reader's own
//! [`MAX_STALE_AFTER_MS`], treats a time in the future as stale, and requires the writer
//! to be alive when it wrote from the reader's PID namespace.

use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// The longest `staleAfterMs` a reader honours: a larger one is cut to this.
pub const MAX_STALE_AFTER_MS: u64 = 60_000;

/// The largest marker file read (a real one is about 200 bytes).
pub const MAX_MARKER_BYTES: u64 = 64 * 1024;

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
    /// After how long without a refresh the marker means "agent gone" (a reader honours
    /// at most [`MAX_STALE_AFTER_MS`]).
    pub stale_after_ms: u64,
    /// The agent's PID.
    #[serde(default)]
    pub pid: u32,
    /// The inode of the PID namespace `pid` is valid in; [`ReadinessMarker::to_bytes`]
    /// fills it in when `pid` is the writer's own. A reader in another PID namespace (the
    /// agent in a container without `hostPID`) cannot check the PID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_namespace: Option<u64>,
    /// The CNI config file the agent guards.
    #[serde(default)]
    pub config_path: String,
    /// Whose loading rules the agent applies (`containerd`, `crio`); absent from markers
    /// of older agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// The CRI endpoint the agent's audit lists sandboxes through, `none` when it runs
    /// without an audit (absent: an older agent), so `interlock check` asks the same
    /// runtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cri_endpoint: Option<String>,
    /// The latest fight over a config file the agent writes (another writer undoing its
    /// change again and again: an exclusive primary), going on or over; absent when
    /// there was none since the agent started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fight: Option<ConfigFight>,
}

/// A fight over a config file: another writer undid the agent's change to `file` so
/// often that the agent backed off (see the agent's `guard::conflict`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigFight {
    /// The file in the conf dir the agent writes and the other writer undoes.
    pub file: String,
    /// Times the other writer undid the agent's change during this fight.
    pub conflicts: u64,
    /// When the fight was recognised (Unix ms).
    pub started_at_ms: u64,
    /// The latest undo (Unix ms).
    pub last_conflict_at_ms: u64,
    /// When the agent declared it over (no undo for its forgiveness period); `None` while
    /// it goes on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at_ms: Option<u64>,
    /// The config file the runtime loaded when the fight was recognised: the primary,
    /// most likely the other writer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary: Option<String>,
    /// The plugin types of that file's chain, in order (the first is the primary's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub primary_types: Vec<String>,
}

/// The inode of this process's PID namespace.
fn own_pid_namespace() -> Option<u64> {
    std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino())
}

/// Whether `pid` names a running process in this process's PID namespace.
fn pid_alive(pid: u32) -> bool {
    pid != 0 && Path::new(&format!("/proc/{pid}")).exists()
}

/// The owners whose files a reader trusts: root, and the reader itself (a contributor's
/// test run); `/proc/self` belongs to the process's effective user.
fn trusted_owner(uid: u32) -> bool {
    uid == 0 || std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == uid)
}

fn refuse(path: &Path, why: String) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{}: {why}", path.display()),
    )
}

impl ReadinessMarker {
    /// Reads a marker file with the checks in the module docs; the error names the file
    /// and says which check failed.
    pub fn read(path: &Path) -> io::Result<ReadinessMarker> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        let d = std::fs::metadata(dir)?;
        if !trusted_owner(d.uid()) || d.mode() & 0o022 != 0 {
            return Err(refuse(
                path,
                format!(
                    "its directory is owned by uid {} with mode {:o}: anyone who can write it could forge the marker (make it root-owned, not group- or world-writable)",
                    d.uid(),
                    d.mode() & 0o7777
                ),
            ));
        }
        let m = std::fs::symlink_metadata(path)?;
        if m.file_type().is_symlink() {
            return Err(refuse(
                path,
                "is a symlink (the agent writes a regular file; refused)".into(),
            ));
        }
        if !m.is_file() {
            return Err(refuse(
                path,
                "is not a regular file (a FIFO, device or directory; refused)".into(),
            ));
        }
        if !trusted_owner(m.uid()) || m.mode() & 0o022 != 0 {
            return Err(refuse(
                path,
                format!(
                    "is owned by uid {} with mode {:o}: only a root-owned marker that group and others cannot write is trusted",
                    m.uid(),
                    m.mode() & 0o7777
                ),
            ));
        }
        if m.len() > MAX_MARKER_BYTES {
            return Err(refuse(
                path,
                format!(
                    "is {} bytes, more than a marker's {MAX_MARKER_BYTES}",
                    m.len()
                ),
            ));
        }
        let file = std::fs::File::open(path)?;
        let opened = file.metadata()?;
        if (opened.dev(), opened.ino()) != (m.dev(), m.ino()) {
            return Err(refuse(path, "was replaced while being read; retry".into()));
        }
        let mut bytes = Vec::with_capacity(m.len() as usize);
        file.take(MAX_MARKER_BYTES).read_to_end(&mut bytes)?;
        serde_json::from_slice(&bytes).map_err(|e| refuse(path, format!("is not a marker: {e}")))
    }

    /// The file content for the agent to write atomically (root-owned, mode 0644):
    /// records the writer's PID namespace when `pid` is the writer's own.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut m = self.clone();
        if m.pid_namespace.is_none() && m.pid == std::process::id() {
            m.pid_namespace = own_pid_namespace();
        }
        serde_json::to_vec(&m).unwrap_or_default()
    }

    /// Why the marker no longer speaks for a live agent at `now_ms` (see the module
    /// docs), or `None` when it is fresh.
    pub fn staleness(&self, now_ms: u64) -> Option<String> {
        if self.updated_at_ms > now_ms {
            return Some(format!(
                "it is dated {} ms in the future",
                self.updated_at_ms - now_ms
            ));
        }
        let bound = self.stale_after_ms.min(MAX_STALE_AFTER_MS);
        let age = now_ms - self.updated_at_ms;
        if age > bound {
            return Some(format!(
                "it was last updated {age} ms ago (stale after {bound} ms)"
            ));
        }
        if self.pid_namespace.is_some()
            && self.pid_namespace == own_pid_namespace()
            && !pid_alive(self.pid)
        {
            return Some(format!("its writer, pid {}, is not running", self.pid));
        }
        None
    }

    /// True when [`ReadinessMarker::staleness`] finds nothing.
    pub fn is_fresh(&self, now_ms: u64) -> bool {
        self.staleness(now_ms).is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn marker(ready: bool, at: u64) -> ReadinessMarker {
        ReadinessMarker {
            ready,
            reason: "config guarded".into(),
            updated_at_ms: at,
            stale_after_ms: 3000,
            pid: 42,
            pid_namespace: None,
            config_path: "/etc/cni/net.d/00-interlock.conflist".into(),
            runtime: Some("containerd".into()),
            cri_endpoint: Some("unix:///run/containerd/containerd.sock".into()),
            fight: None,
        }
    }

    #[test]
    fn a_fight_round_trips_and_old_markers_have_none() {
        let mut m = marker(false, 5);
        m.fight = Some(ConfigFight {
            file: "00-interlock.conflist".into(),
            conflicts: 7,
            started_at_ms: 1,
            last_conflict_at_ms: 4,
            ended_at_ms: None,
            primary: Some("05-cilium.conflist".into()),
            primary_types: vec!["cilium-cni".into()],
        });
        let v: serde_json::Value = serde_json::from_slice(&m.to_bytes()).unwrap();
        assert_eq!(v["fight"]["primaryTypes"][0], "cilium-cni");
        assert_eq!(v["fight"]["lastConflictAtMs"], 4);
        assert!(v["fight"].get("endedAtMs").is_none());
        let back: ReadinessMarker = serde_json::from_value(v).unwrap();
        assert_eq!(back.fight, m.fight);
        // A marker without the field (an older agent) reads as no fight.
        let old = r#"{"ready":true,"updatedAtMs":1,"staleAfterMs":3000}"#;
        let old: ReadinessMarker = serde_json::from_str(old).unwrap();
        assert_eq!(old.fight, None);
    }

    fn write(path: &Path, m: &ReadinessMarker) {
        std::fs::write(path, m.to_bytes()).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
    }

    #[test]
    fn staleness_cannot_be_forged() {
        assert!(marker(true, 1000).is_fresh(4000));
        assert!(!marker(true, 1000).is_fresh(4001));
        // A future date is stale, whatever staleAfterMs says.
        assert!(marker(true, 10_000)
            .staleness(5_000)
            .unwrap()
            .contains("future"));
        // A huge staleAfterMs is cut to the reader's bound.
        let mut forever = marker(true, 1);
        forever.stale_after_ms = u64::MAX;
        assert!(forever.is_fresh(MAX_STALE_AFTER_MS));
        assert!(forever
            .staleness(MAX_STALE_AFTER_MS + 2)
            .unwrap()
            .contains(&format!("stale after {MAX_STALE_AFTER_MS} ms")));
        // The writer must be alive (same PID namespace): this process is, a reaped
        // child is not.
        let mut mine = marker(true, 1000);
        mine.pid = std::process::id();
        mine.pid_namespace = own_pid_namespace();
        assert!(mine.is_fresh(1001));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        mine.pid = child.id();
        child.wait().unwrap();
        assert!(mine.staleness(1001).unwrap().contains("not running"));
        // Written from another PID namespace: the PID cannot be checked here.
        mine.pid_namespace = Some(1);
        assert!(mine.is_fresh(1001));
    }

    #[test]
    fn only_a_plain_trusted_marker_is_read() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join(crate::layout::MARKER_FILE);
        let mut m = marker(true, 9_000);
        m.pid = std::process::id();
        write(&path, &m);
        let back = ReadinessMarker::read(&path).unwrap();
        assert_eq!(
            back.pid_namespace,
            own_pid_namespace(),
            "the writer's namespace"
        );
        // Group- or world-writable: refused.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = ReadinessMarker::read(&path).unwrap_err().to_string();
        assert!(e.contains("mode 666") && e.contains("root-owned"), "{e}");
        // A symlink (to a real marker), a FIFO, a directory, a huge file: refused at once.
        std::fs::remove_file(&path).unwrap();
        let real = t.path().join("real.json");
        write(&real, &m);
        std::os::unix::fs::symlink(&real, &path).unwrap();
        assert!(ReadinessMarker::read(&path)
            .unwrap_err()
            .to_string()
            .contains("symlink"));
        std::fs::remove_file(&path).unwrap();
        let status = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .unwrap();
        assert!(status.success());
        assert!(ReadinessMarker::read(&path)
            .unwrap_err()
            .to_string()
            .contains("not a regular file"));
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, vec![b' '; MAX_MARKER_BYTES as usize + 1]).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(ReadinessMarker::read(&path)
            .unwrap_err()
            .to_string()
            .contains("more than a marker's"));
        // In a directory others can write: refused (anyone could have put it there).
        write(&path, &m);
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = ReadinessMarker::read(&path).unwrap_err().to_string();
        assert!(e.contains("its directory"), "{e}");
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        if std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0) {
            // Owned by another user: refused.
            let out = std::process::Command::new("chown")
                .args(["65534"])
                .arg(&path)
                .status()
                .unwrap();
            assert!(out.success());
            let e = ReadinessMarker::read(&path).unwrap_err().to_string();
            assert!(e.contains("uid 65534"), "{e}");
        }
    }

    #[test]
    fn json_names_are_the_contract() {
        let mut m = marker(true, 1);
        m.pid_namespace = Some(4026531836);
        let v = serde_json::to_value(m).unwrap();
        for k in [
            "ready",
            "reason",
            "updatedAtMs",
            "staleAfterMs",
            "pid",
            "pidNamespace",
            "configPath",
            "runtime",
            "criEndpoint",
        ] {
            assert!(v.get(k).is_some(), "{k}");
        }
    }
}

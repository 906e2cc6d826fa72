//! The STATUS verb, and the agent's readiness marker that `interlock check` reads.
//!
//! # STATUS
//!
//! A failing STATUS makes containerd (≥ 2.0.1, for a config list at cniVersion ≥ 1.1.0;
//! CRI-O likewise) report the node's network NotReady, and the node's ordinary pods are
//! evicted after 300 s. So [`check_status`] answers 50 only when an ADD on this node would
//! now fail, or leave a meshed pod unprotected: the backend cannot work here, the state
//! dir is unusable, or the pod lookup the entry depends on cannot work (no
//! `io.kubernetes.cri.pod-annotations` capability, and no reachable, trusted agent socket
//! or kubeconfig). The agent being down or not ready is *not* such a reason — the plugin
//! protects pods without it; the agent's taint and node condition say that.
//!
//! # The readiness marker
//!
//! `<stateDir>/agent-ready.json`, `{"ready", "reason", "updatedAtMs", "staleAfterMs",
//! "pid", "pidNamespace", "configPath"}`, written atomically by the agent and refreshed at
//! least every `staleAfterMs / 3`. Whoever can write it can claim the agent is healthy,
//! so [`ReadinessMarker::read`] accepts only a regular file (not a symlink: the agent
//! replaces it by rename, never through a link; not a FIFO or device: opened without
//! blocking), of at most [`MAX_MARKER_BYTES`], owned by root (or the reader) and not
//! writable by group or others; and [`ReadinessMarker::staleness`] bounds `staleAfterMs`
//! by the reader's own [`MAX_STALE_AFTER_MS`], treats a time in the future as stale, and
//! requires the writer to be alive (when it wrote from the reader's PID namespace).

use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use interlock_protocol::atomic::write_file_atomic;
use interlock_protocol::error::NOT_AVAILABLE;
use interlock_protocol::CniError;
use serde::{Deserialize, Serialize};

use crate::config::PluginConfig;

/// File name of the marker inside `stateDir`.
pub const MARKER_FILE: &str = "agent-ready.json";

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
    /// The inode of the PID namespace `pid` is valid in; [`ReadinessMarker::write`] fills
    /// it in when `pid` is the writer's own. A reader in another PID namespace (the agent
    /// in a container without `hostPID`) cannot check the PID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_namespace: Option<u64>,
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

/// The inode of this process's PID namespace.
fn own_pid_namespace() -> Option<u64> {
    std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino())
}

impl ReadinessMarker {
    /// Reads a marker file with the checks in the module docs; the error says which
    /// failed.
    pub fn read(path: &Path) -> io::Result<ReadinessMarker> {
        let refuse = |why: String| io::Error::new(io::ErrorKind::InvalidData, why);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) => {
                    refuse("is a symlink (the agent writes a regular file; refused)".to_string())
                }
                _ => e,
            })?;
        let m = file.metadata()?;
        if !m.is_file() {
            return Err(refuse(
                "is not a regular file (a FIFO, device or directory; refused)".into(),
            ));
        }
        let me = nix::unistd::geteuid().as_raw();
        if (m.uid() != 0 && m.uid() != me) || m.mode() & 0o022 != 0 {
            return Err(refuse(format!(
                "is owned by uid {} with mode {:o}: only a root-owned marker that group and others cannot write is trusted",
                m.uid(),
                m.mode() & 0o7777
            )));
        }
        if m.len() > MAX_MARKER_BYTES {
            return Err(refuse(format!(
                "is {} bytes, more than a marker's {MAX_MARKER_BYTES}",
                m.len()
            )));
        }
        let mut bytes = Vec::with_capacity(m.len() as usize);
        file.take(MAX_MARKER_BYTES).read_to_end(&mut bytes)?;
        serde_json::from_slice(&bytes).map_err(|e| refuse(format!("is not a marker: {e}")))
    }

    /// Writes the marker atomically (for the agent), root-readable, group and others not
    /// writing. Records the writer's PID namespace when `pid` is the writer's own.
    pub fn write(&self, path: &Path) -> io::Result<()> {
        let mut m = self.clone();
        if m.pid_namespace.is_none() && m.pid == std::process::id() {
            m.pid_namespace = own_pid_namespace();
        }
        let data = serde_json::to_vec(&m).map_err(io::Error::other)?;
        write_file_atomic(path, &data, Some(0o644))
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
        if self.pid_namespace.is_some() && self.pid_namespace == own_pid_namespace() {
            let pid = i32::try_from(self.pid).unwrap_or(0);
            let gone = pid <= 0
                || nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
                    == Err(nix::errno::Errno::ESRCH);
            if gone {
                return Some(format!("its writer, pid {}, is not running", self.pid));
            }
        }
        None
    }

    /// True when [`ReadinessMarker::staleness`] finds nothing.
    pub fn is_fresh(&self, now_ms: u64) -> bool {
        self.staleness(now_ms).is_none()
    }
}

/// STATUS: `Ok` when an ADD on this node can protect a meshed pod now; otherwise code 50
/// listing every reason (see the module docs).
pub fn check_status(config: &PluginConfig, cni_version: &str) -> Result<(), CniError> {
    let mut problems = Vec::new();
    let (kind, why) = crate::protect::resolve_backend(config.backend, &config.state_dir);
    if let Err(e) = interlock_redirect::backend::open(kind).and_then(|b| b.usable()) {
        problems.push(format!("the {kind} backend ({why}) cannot work here: {e}"));
    }
    for dir in [
        config.state_dir.join(crate::netns_state::DIR),
        crate::state::StateStore::new(&config.state_dir)
            .dir()
            .to_path_buf(),
    ] {
        let usable = std::fs::create_dir_all(&dir).and_then(|()| {
            nix::unistd::access(&dir, nix::unistd::AccessFlags::W_OK).map_err(io::Error::from)
        });
        if let Err(e) = usable {
            problems.push(format!(
                "the state dir {} is unusable ({}: {e})",
                config.state_dir.display(),
                dir.display()
            ));
            break;
        }
    }
    if !config.wants_pod_annotations() {
        let source = match (&config.agent_socket, &config.kubeconfig) {
            (Some(socket), _) => interlock_podinfo::agent::connect_trusted(socket)
                .map(drop)
                .map_err(|e| e.to_string()),
            (None, Some(path)) => interlock_podinfo::kube::Kubeconfig::load(path)
                .map(drop)
                .map_err(|e| e.to_string()),
            (None, None) => Err("neither agentSocket nor kubeconfig is configured".into()),
        };
        if let Err(e) = source {
            problems.push(format!(
                "the entry does not declare the io.kubernetes.cri.pod-annotations capability, so a pod's annotations must be looked up, and that cannot work: {e}"
            ));
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    Err(CniError::new(
        cni_version,
        NOT_AVAILABLE,
        format!(
            "interlock-cni cannot protect meshed pods on this node now: {}",
            problems.join("; ")
        ),
    )
    .with_details(
        "an ADD of a meshed pod would fail; fix the cause named above (the plugin needs no agent to be running)",
    ))
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
        }
    }

    #[test]
    fn staleness_cannot_be_forged() {
        assert!(marker(true, 1000).is_fresh(4000));
        assert!(!marker(true, 1000).is_fresh(4001));
        // A future date is stale, whatever staleAfterMs says.
        let future = marker(true, 10_000);
        assert!(future.staleness(5_000).unwrap().contains("future"));
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
        let dead = child.id();
        child.wait().unwrap();
        mine.pid = dead;
        assert!(mine.staleness(1001).unwrap().contains("not running"));
        // Written from another PID namespace: the PID cannot be checked here.
        mine.pid_namespace = Some(1);
        assert!(mine.is_fresh(1001));
    }

    #[test]
    fn only_a_plain_root_owned_marker_is_read() {
        let t = tempfile::tempdir().unwrap();
        let path = marker_path(t.path());
        let mut m = marker(true, 9_000);
        m.pid = std::process::id();
        m.write(&path).unwrap();
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
        // A symlink (to a real marker), a FIFO, /dev/zero, a huge file: refused at once.
        std::fs::remove_file(&path).unwrap();
        let real = t.path().join("real.json");
        m.write(&real).unwrap();
        std::os::unix::fs::symlink(&real, &path).unwrap();
        assert!(ReadinessMarker::read(&path)
            .unwrap_err()
            .to_string()
            .contains("symlink"));
        std::fs::remove_file(&path).unwrap();
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(ReadinessMarker::read(&path)
            .unwrap_err()
            .to_string()
            .contains("not a regular file"));
        assert!(ReadinessMarker::read(Path::new("/dev/zero"))
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
        if nix::unistd::geteuid().is_root() {
            // Owned by another user: refused.
            m.write(&path).unwrap();
            nix::unistd::chown(&path, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
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
        ] {
            assert!(v.get(k).is_some(), "{k}");
        }
    }
}

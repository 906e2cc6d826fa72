//! Per-attachment state, one file per (container ID, ifname) under
//! `<stateDir>/attachments/`.
//!
//! Each file is replaced atomically (`write_file_atomic`: temp file, fsync, rename), and
//! concurrent ADDs for different attachments touch different files, so any number of
//! plugin processes can run at once. A reader sees a whole old file or a whole new one.
//!
//! A file is named after its key, percent-encoded, unless that name would be longer than
//! [`MAX_NAME`] (a container ID may be any length, and `.` encodes as three bytes): then
//! it is named after the key's hash, and the key is read from the file itself. Either
//! way every ID gets a file a filesystem accepts, before any rule is applied.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use interlock_contract::atomic::write_file_atomic;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::outcome::Protection;
use crate::pod::PodIdentity;
use crate::pod::Source;
use interlock_redirect::decision::Decision;

pub use interlock_contract::state::AttachmentKey;

/// What interlock knows about one attachment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentState {
    /// Which attachment.
    #[serde(flatten)]
    pub key: AttachmentKey,
    /// `CNI_NETNS` at ADD.
    pub netns: String,
    /// The identity (`<dev>-<ino>`) of that netns, when ADD protected it: the key of its
    /// `interlock_contract::state::NetnsRecord`, which lists this attachment while it
    /// relies on the rules there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns_id: Option<String>,
    /// The network (list) name.
    pub network: String,
    /// The config's cniVersion.
    pub cni_version: String,
    /// The pod, as the runtime described it.
    pub pod: PodIdentity,
    /// Where the annotations behind the decision came from.
    #[serde(default = "default_source")]
    pub annotations_source: Source,
    /// The decision taken.
    pub decision: Decision,
    /// What was done about it.
    pub protection: Protection,
    /// When the ADD happened (Unix ms).
    pub added_at_ms: u64,
    /// How long the whole ADD took until the state was written (µs).
    #[serde(default)]
    pub add_us: u64,
}

fn default_source() -> Source {
    Source::RuntimeConfig
}

/// The largest state file read (a real one is a few KiB): like every file interlock
/// reads, a state file is read only when it is a regular file, without blocking, and
/// bounded, so a FIFO or a huge file planted in the state dir cannot stall DEL or GC.
const MAX_STATE_BYTES: u64 = 1 << 20;

/// Reads a state file with [`interlock_contract::bounded::read_regular`]; `None` when it
/// does not exist (a new pod's case: no message is built for it), an error naming the
/// file otherwise (`InvalidData` when it is refused: not regular, too large).
fn read_state(path: &Path) -> io::Result<Option<Vec<u8>>> {
    use interlock_contract::bounded::{read_regular, BoundedReadError};
    match read_regular(path, MAX_STATE_BYTES) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(match &e {
            BoundedReadError::Io { source, .. } => io::Error::new(source.kind(), e.to_string()),
            _ => io::Error::new(io::ErrorKind::InvalidData, e.to_string()),
        }),
    }
}

/// The longest encoded file name used as is (`NAME_MAX` is 255, and the atomic write's
/// temp name adds a dot, the PID and a counter).
pub const MAX_NAME: usize = 200;

/// The directory of attachment state files.
#[derive(Debug, Clone)]
pub struct StateStore {
    dir: PathBuf,
}

fn encode(part: &str) -> String {
    let mut s = String::with_capacity(part.len());
    for b in part.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            s.push(b as char);
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    s
}

fn decode(part: &str) -> Option<String> {
    let bytes = part.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = part.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

impl StateStore {
    /// The store under `state_dir` (`<state_dir>/attachments`).
    pub fn new(state_dir: &Path) -> StateStore {
        StateStore {
            dir: state_dir.join("attachments"),
        }
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file for `key`: `<containerID>+<ifname>.json`, each part percent-encoded so
    /// that any ID or ifname maps to exactly one safe file name; when that is longer than
    /// [`MAX_NAME`], `h-<sha256 of containerID NUL ifname>.json` (no `+`: never an encoded
    /// name).
    pub fn path_for(&self, key: &AttachmentKey) -> PathBuf {
        let name = format!("{}+{}.json", encode(&key.container_id), encode(&key.ifname));
        if name.len() <= MAX_NAME {
            return self.dir.join(name);
        }
        let mut h = Sha256::new();
        h.update(key.container_id.as_bytes());
        h.update([0]);
        h.update(key.ifname.as_bytes());
        self.dir
            .join(format!("h-{}.json", hex::encode(h.finalize())))
    }

    /// The key a file name stands for, if it is one of ours.
    pub fn key_of(file_name: &str) -> Option<AttachmentKey> {
        let stem = file_name.strip_suffix(".json")?;
        let (c, i) = stem.split_once('+')?;
        Some(AttachmentKey {
            container_id: decode(c)?,
            ifname: decode(i)?,
        })
    }

    /// Writes (replaces) the state of one attachment atomically.
    pub fn save(&self, state: &AttachmentState) -> io::Result<()> {
        let mut data = serde_json::to_vec_pretty(state).map_err(io::Error::other)?;
        data.push(b'\n');
        let path = self.path_for(&state.key);
        // Never through a symbolic link or into a directory another user can write
        // (redteam-3 L-3): root's state would land where they point it.
        let trusted = |dirs: &[&Path]| interlock_redirect::netns_record::check_trusted(dirs);
        if let Some(state_dir) = self.dir.parent() {
            trusted(&[state_dir, &self.dir])?;
        }
        // The directory exists after the first pod: make it only when it is missing.
        match write_file_atomic(&path, &data, Some(0o600)) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir_all(&self.dir).map_err(|e| {
                    io::Error::new(e.kind(), format!("creating {}: {e}", self.dir.display()))
                })?;
                trusted(&[&self.dir])?;
                write_file_atomic(&path, &data, Some(0o600))
            }
            done => done,
        }
    }

    /// Reads the state of one attachment; `Ok(None)` when there is none.
    pub fn load(&self, key: &AttachmentKey) -> io::Result<Option<AttachmentState>> {
        let path = self.path_for(key);
        let Some(bytes) = read_state(&path)? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is corrupt: {e}", path.display()),
            )
        })
    }

    /// Removes the state of one attachment; `Ok(false)` when there was none.
    pub fn remove(&self, key: &AttachmentKey) -> io::Result<bool> {
        let path = self.path_for(key);
        match fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io::Error::new(
                e.kind(),
                format!("removing {}: {e}", path.display()),
            )),
        }
    }

    /// Every attachment with a state file.
    pub fn keys(&self) -> io::Result<BTreeSet<AttachmentKey>> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(BTreeSet::new()),
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("reading {}: {e}", self.dir.display()),
                ))
            }
        };
        let mut keys = BTreeSet::new();
        for entry in entries {
            let name = entry?.file_name();
            let Some(name) = name.to_str() else { continue };
            if let Some(k) = StateStore::key_of(name) {
                keys.insert(k);
            } else if name.starts_with("h-") && name.ends_with(".json") {
                // A hashed name: the key is in the file (checked against the name, so a
                // stray file cannot stand for another attachment).
                if let Ok(Some(bytes)) = read_state(&self.dir.join(name)) {
                    if let Ok(s) = serde_json::from_slice::<AttachmentState>(&bytes) {
                        if self.path_for(&s.key).file_name().and_then(|n| n.to_str()) == Some(name)
                        {
                            keys.insert(s.key);
                        }
                    }
                }
            }
        }
        Ok(keys)
    }

    /// GC: removes the state of every attachment not in `valid`; returns what it removed.
    pub fn retain(&self, valid: &BTreeSet<AttachmentKey>) -> io::Result<Vec<AttachmentKey>> {
        let mut removed = Vec::new();
        for key in self.keys()? {
            if !valid.contains(&key) && self.remove(&key)? {
                removed.push(key);
            }
        }
        Ok(removed)
    }
}

/// How old a temp file must be to be swept even though a process with its PID runs (the
/// PID may have been reused); an atomic write takes milliseconds.
pub const TEMP_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(60);

/// Whether `name` is a temp file of an atomic write (`.<file>.<pid>.<n>.tmp`) that nobody
/// will finish: its writer is not running (by `alive`), or it is older than
/// [`TEMP_MAX_AGE`]. A writer killed mid-ADD leaves such files behind for good.
pub fn is_abandoned_temp(
    name: &str,
    age: std::time::Duration,
    alive: impl Fn(u32) -> bool,
) -> bool {
    let Some(inner) = name.strip_prefix('.').and_then(|n| n.strip_suffix(".tmp")) else {
        return false;
    };
    let mut parts = inner.rsplitn(3, '.');
    let (Some(n), Some(pid), Some(base)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let (Ok(_), Ok(pid)) = (n.parse::<u64>(), pid.parse::<u32>()) else {
        return false;
    };
    !base.is_empty() && (age > TEMP_MAX_AGE || !alive(pid))
}

/// Removes the abandoned temp files ([`is_abandoned_temp`]) in `dirs`; returns them.
pub fn sweep_abandoned_temps(dirs: &[PathBuf]) -> Vec<PathBuf> {
    let alive = |pid: u32| {
        i32::try_from(pid).is_ok_and(|p| {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), None)
                != Err(nix::errno::Errno::ESRCH)
        })
    };
    let mut removed = Vec::new();
    for dir in dirs {
        let Ok(entries) = fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let age = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .unwrap_or_default();
            if is_abandoned_temp(name, age, alive) && fs::remove_file(entry.path()).is_ok() {
                removed.push(entry.path());
            }
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_fifo_or_a_huge_file_in_place_of_a_state_file_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        fs::create_dir_all(store.dir()).unwrap();
        let key = state("fifo", "eth0").key;
        nix::unistd::mkfifo(
            &store.path_for(&key),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        // A blocking open of a FIFO with no writer would hang here forever.
        let e = store.load(&key).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("FIFO"), "{e}");
        let big = state("big", "eth0").key;
        let f = fs::File::create(store.path_for(&big)).unwrap();
        f.set_len(MAX_STATE_BYTES + 1).unwrap();
        let e = store.load(&big).unwrap_err();
        assert!(e.to_string().contains("bytes"), "{e}");
        assert!(store.load(&state("none", "eth0").key).unwrap().is_none());
    }

    fn state(cid: &str, ifname: &str) -> AttachmentState {
        AttachmentState {
            key: AttachmentKey {
                container_id: cid.into(),
                ifname: ifname.into(),
            },
            netns: "/var/run/netns/x".into(),
            netns_id: None,
            network: "net".into(),
            cni_version: "1.0.0".into(),
            pod: PodIdentity::default(),
            annotations_source: Source::RuntimeConfig,
            decision: Decision::Skip {
                reason: "test".into(),
            },
            protection: Protection::NotNeeded,
            added_at_ms: 1,
            add_us: 2,
        }
    }

    /// redteam-3 L-3: the plugin (root) writes no state into a directory another user
    /// can write, nor through a symbolic link they planted.
    #[test]
    fn state_goes_only_into_a_directory_only_root_can_write() {
        use std::os::unix::fs::PermissionsExt;
        let t = interlock_testkit::tempdir().unwrap();
        let store = StateStore::new(t.path());
        let st = state("c1", "eth0");
        fs::set_permissions(t.path(), fs::Permissions::from_mode(0o777)).unwrap();
        let e = store.save(&st).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        fs::set_permissions(t.path(), fs::Permissions::from_mode(0o700)).unwrap();
        let victim = interlock_testkit::tempdir().unwrap();
        std::os::unix::fs::symlink(victim.path(), store.dir()).unwrap();
        let e = store.save(&st).unwrap_err();
        assert!(e.to_string().contains("a symbolic link"), "{e}");
        assert_eq!(fs::read_dir(victim.path()).unwrap().count(), 0);
        fs::remove_file(store.dir()).unwrap();
        store.save(&st).unwrap();
    }

    #[test]
    fn save_load_remove_retain() {
        let t = tempfile::tempdir().unwrap();
        let s = StateStore::new(t.path());
        assert_eq!(s.load(&state("a", "eth0").key).unwrap(), None);
        for (c, i) in [("a", "eth0"), ("b", "eth0"), ("b", "net1")] {
            s.save(&state(c, i)).unwrap();
        }
        assert_eq!(
            s.load(&state("b", "net1").key).unwrap().unwrap(),
            state("b", "net1")
        );
        let valid: BTreeSet<_> = [state("b", "eth0").key].into();
        let removed = s.retain(&valid).unwrap();
        assert_eq!(removed.len(), 2);
        assert_eq!(s.keys().unwrap(), valid);
        assert!(s.remove(&state("b", "eth0").key).unwrap());
        assert!(!s.remove(&state("b", "eth0").key).unwrap());
        let mode =
            std::os::unix::fs::PermissionsExt::mode(&fs::metadata(s.dir()).unwrap().permissions());
        assert!(mode & 0o700 == 0o700);
    }

    #[test]
    fn abandoned_temps_are_recognised() {
        use std::time::Duration;
        let dead = |_| false;
        let alive = |_| true;
        let young = Duration::from_secs(1);
        for name in [
            ".c7+eth0.json.9335.0.tmp",
            ".backend-detected.json.12.3.tmp",
        ] {
            assert!(is_abandoned_temp(name, young, dead), "{name}");
            assert!(!is_abandoned_temp(name, young, alive), "{name}");
            assert!(is_abandoned_temp(name, TEMP_MAX_AGE * 2, alive), "{name}");
        }
        for name in [
            "c7+eth0.json",
            ".c7+eth0.json.tmp",
            ".x.y.z.tmp",
            "..1.2.tmp",
            ".a.1.2",
        ] {
            assert!(!is_abandoned_temp(name, TEMP_MAX_AGE * 2, dead), "{name}");
        }
    }

    /// IDs whose encoded name would pass the filesystem's limit get a hashed name that
    /// round-trips through keys(), so GC and DEL find them.
    #[test]
    fn long_ids_get_hashed_names() {
        let t = tempfile::tempdir().unwrap();
        let s = StateStore::new(t.path());
        for cid in [".".repeat(80), "b".repeat(300), "x".repeat(5000)] {
            let st = state(&cid, "eth0");
            let name = s
                .path_for(&st.key)
                .file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .to_string();
            assert!(name.starts_with("h-") && name.len() <= MAX_NAME, "{name}");
            s.save(&st).unwrap();
            assert_eq!(s.load(&st.key).unwrap().unwrap(), st);
            assert!(s.keys().unwrap().contains(&st.key));
            assert!(s.remove(&st.key).unwrap());
        }
        // At the limit: encoded as usual.
        let cid = "c".repeat(MAX_NAME - "+eth0.json".len());
        let name = s.path_for(&state(&cid, "eth0").key);
        assert!(name.ends_with(format!("{cid}+eth0.json")));
    }

    #[test]
    fn a_container_id_starting_with_h_dash_keeps_a_plain_reversible_name() {
        let s = StateStore::new(Path::new("/x"));
        let key = AttachmentKey {
            container_id: "h-".into(),
            ifname: String::new(),
        };
        let path = s.path_for(&key);
        let name = path.file_name().unwrap().to_str().unwrap();
        assert_eq!(StateStore::key_of(name), Some(key));
    }

    proptest! {
        #[test]
        fn file_names_are_safe_and_reversible(cid in "\\PC{0,40}", ifname in "\\PC{0,15}") {
            let s = StateStore::new(Path::new("/x"));
            let key = AttachmentKey { container_id: cid, ifname };
            let path = s.path_for(&key);
            let name = path.file_name().unwrap().to_str().unwrap();
            prop_assert!(!name.starts_with('.'));
            prop_assert!(!name.contains('/'));
            prop_assert_eq!(path.parent().unwrap(), Path::new("/x/attachments"));
            prop_assert!(name.len() <= MAX_NAME);
            // A plain name always has the `+` between its two parts; a hashed one
            // (`h-<sha256>.json`) never does, so the two cannot be confused even when a
            // container ID itself starts with `h-` (proptest found `h-`).
            if !name.contains('+') {
                // Hashed (the key is read from the file: long_ids_get_hashed_names).
                prop_assert!(name.starts_with("h-"));
                prop_assert_eq!(StateStore::key_of(name), None);
            } else {
                prop_assert_eq!(StateStore::key_of(name), Some(key));
            }
        }
    }
}

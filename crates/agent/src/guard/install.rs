//! The plugin binary in every bin dir: installed atomically, verified by checksum and by
//! its VERSION answer, put back when someone removes or replaces it. Also asks other
//! plugin binaries which spec versions they support (cached per binary identity).

use crate::error::AgentError;
use interlock_contract::atomic::write_file_atomic;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a plugin may take to answer VERSION (then it and its children are killed).
pub use interlock_libcni::exec::VERSION_TIMEOUT;

/// Identity of a file on disk, to notice replacement or a mode change without
/// re-hashing: `chmod -x` changes only the mode and ctime, and must be noticed on the
/// next event, not the next resync.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileIdentity {
    dev: u64,
    ino: u64,
    size: u64,
    mode: u32,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl FileIdentity {
    /// The identity of `path` (following symlinks), or `None` when it does not exist.
    pub fn of(path: &Path) -> Option<FileIdentity> {
        let m = std::fs::metadata(path).ok()?;
        Some(FileIdentity {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mode: m.mode(),
            mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
            ctime_ns: m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128,
        })
    }
}

/// Hex SHA-256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// Runs `binary` with `CNI_COMMAND=VERSION` (time-boxed, its process group killed
/// after) and returns its `supportedVersions`.
pub fn query_versions(binary: &Path) -> Result<Vec<String>, String> {
    let dirs: Vec<PathBuf> = binary.parent().map(Path::to_path_buf).into_iter().collect();
    interlock_libcni::exec::plugin_version_within(binary, &dirs, VERSION_TIMEOUT)
        .map(|i| i.supported_versions)
        .map_err(|e| e.to_string())
}

type Answer = Result<Vec<String>, String>;

/// VERSION answers keyed by binary identity (dev, inode, size, mode, mtime, ctime), asked
/// on a thread of their own so that a slow plugin never holds the guard: the guard waits
/// a bounded time ([`VersionCache::wait`]) and goes on without an answer that is late.
#[derive(Debug)]
pub struct VersionCache {
    bin_dirs: Vec<PathBuf>,
    answers: HashMap<PathBuf, (FileIdentity, Answer)>,
    /// Queries under way: the identity asked about, when, and where the answer comes.
    pending: HashMap<PathBuf, (FileIdentity, Instant, mpsc::Receiver<Answer>)>,
}

impl VersionCache {
    /// A cache for plugins found in `bin_dirs` (passed to them as `CNI_PATH`).
    pub fn new(bin_dirs: Vec<PathBuf>) -> VersionCache {
        VersionCache {
            bin_dirs,
            answers: HashMap::new(),
            pending: HashMap::new(),
        }
    }

    /// Starts asking `binary` unless the answer for its current identity is known or
    /// already being asked for.
    pub fn request(&mut self, binary: &Path) {
        let Some(id) = FileIdentity::of(binary) else {
            return;
        };
        if self.answers.get(binary).is_some_and(|(i, _)| *i == id)
            || self.pending.get(binary).is_some_and(|(i, _, _)| *i == id)
        {
            return;
        }
        let (tx, rx) = mpsc::channel();
        let (path, dirs) = (binary.to_path_buf(), self.bin_dirs.clone());
        let spawned = std::thread::Builder::new()
            .name("interlock-version".into())
            .spawn(move || {
                let answer =
                    interlock_libcni::exec::plugin_version_within(&path, &dirs, VERSION_TIMEOUT)
                        .map(|i| i.supported_versions)
                        .map_err(|e| e.to_string());
                let _ = tx.send(answer);
            });
        match spawned {
            Ok(_) => {
                self.pending
                    .insert(binary.to_path_buf(), (id, Instant::now(), rx));
            }
            Err(e) => {
                self.answers.insert(
                    binary.to_path_buf(),
                    (
                        id,
                        Err(format!("cannot ask {} for VERSION: {e}", binary.display())),
                    ),
                );
            }
        }
    }

    /// Waits until every pending query has answered or has been under way for
    /// `budget` (so a slow plugin costs one reconcile `budget` once, not every time).
    pub fn wait(&mut self, budget: Duration) {
        let paths: Vec<PathBuf> = self.pending.keys().cloned().collect();
        for p in paths {
            let got = match self.pending.get(&p) {
                Some((_, started, rx)) => {
                    let left = (*started + budget).saturating_duration_since(Instant::now());
                    rx.recv_timeout(left)
                }
                None => continue,
            };
            match got {
                Ok(answer) => {
                    if let Some((id, _, _)) = self.pending.remove(&p) {
                        self.answers.insert(p, (id, answer));
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    if let Some((id, _, _)) = self.pending.remove(&p) {
                        self.answers
                            .insert(p, (id, Err("VERSION query thread ended".into())));
                    }
                }
            }
        }
    }

    /// The answer for `binary` as it is now, if known (`None`: not asked, or still
    /// being asked).
    pub fn answer(&mut self, binary: &Path) -> Option<Answer> {
        self.wait(Duration::ZERO);
        let id = FileIdentity::of(binary)?;
        self.answers
            .get(binary)
            .filter(|(i, _)| *i == id)
            .map(|(_, a)| a.clone())
    }

    /// The versions `binary` supports, waiting for the answer up to `wait`.
    pub fn get(&mut self, binary: &Path, wait: Duration) -> Option<Answer> {
        self.request(binary);
        self.wait(wait);
        self.answer(binary)
    }
}

/// The largest plugin binary interlock accepts as `--plugin-source`.
pub const MAX_PLUGIN_BYTES: u64 = 512 << 20;

/// The plugin binary interlock installs, read once at start.
#[derive(Debug)]
pub struct PluginInstaller {
    source: PathBuf,
    data: std::sync::Arc<Vec<u8>>,
    /// SHA-256 of `data`, computed on a background thread (it only labels logs and
    /// metrics; verification compares the bytes themselves).
    sha256: std::sync::Arc<std::sync::OnceLock<String>>,
    /// Per bin dir: identity of the verified installed file.
    verified: HashMap<PathBuf, FileIdentity>,
    /// Versions the source answered (also what the installed copies answer).
    versions: Vec<String>,
}

/// The file name the plugin is installed under.
pub const PLUGIN_FILE: &str = "interlock-cni";

impl PluginInstaller {
    /// Reads `source` and checks that it answers VERSION.
    pub fn new(source: &Path) -> Result<PluginInstaller, AgentError> {
        // A regular file only (a FIFO would block the start), and not absurdly large.
        let data =
            interlock_contract::bounded::read_regular(source, MAX_PLUGIN_BYTES).map_err(|e| {
                AgentError::PluginSource {
                    path: source.to_path_buf(),
                    reason: e.to_string(),
                }
            })?;
        let versions = query_versions(source).map_err(|reason| AgentError::PluginSource {
            path: source.to_path_buf(),
            reason,
        })?;
        let data = std::sync::Arc::new(data);
        let sha256 = std::sync::Arc::new(std::sync::OnceLock::new());
        let (d, h) = (data.clone(), sha256.clone());
        std::thread::spawn(move || {
            let _ = h.set(sha256_hex(&d));
        });
        Ok(PluginInstaller {
            source: source.to_path_buf(),
            sha256,
            data,
            verified: HashMap::new(),
            versions,
        })
    }

    /// Hex SHA-256 of the plugin (`"pending"` until the background hash is done).
    pub fn sha256(&self) -> &str {
        self.sha256.get().map(String::as_str).unwrap_or("pending")
    }

    /// Size of the plugin in bytes.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// True for an empty plugin file (never a working plugin).
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The spec versions the plugin supports.
    pub fn versions(&self) -> &[String] {
        &self.versions
    }

    /// Where the plugin came from.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// Makes sure `dir/interlock-cni` is our binary, verified. Returns `Ok(true)` when it
    /// had to (re)install. `full` re-hashes even when the file identity is unchanged.
    pub fn ensure(&mut self, dir: &Path, full: bool) -> Result<bool, String> {
        let dest = dir.join(PLUGIN_FILE);
        let mut installed = false;
        // Someone may change the file while we verify it: verify until it holds still.
        for _ in 0..5 {
            let id = FileIdentity::of(&dest);
            if !full && !installed && id.is_some() && self.verified.get(dir) == id.as_ref() {
                return Ok(false);
            }
            self.verified.remove(dir);
            // Byte-for-byte equal to the source: stronger than the checksum, and cheap.
            let matches = same_content(&dest, &self.data)
                && std::fs::metadata(&dest).is_ok_and(|m| m.permissions().mode() & 0o111 != 0);
            if !matches {
                std::fs::create_dir_all(dir)
                    .map_err(|e| format!("creating bin dir {}: {e}", dir.display()))?;
                write_file_atomic(&dest, &self.data, Some(0o755))
                    .map_err(|e| format!("installing {}: {e}", dest.display()))?;
                installed = true;
                continue;
            }
            let answer = query_versions(&dest);
            if FileIdentity::of(&dest) != id {
                continue;
            }
            answer?;
            {
                if let Some(id) = id {
                    self.verified.insert(dir.to_path_buf(), id);
                }
                return Ok(installed);
            }
        }
        Err(format!(
            "{} keeps changing while interlock verifies it: another writer is replacing it",
            dest.display()
        ))
    }
}

/// True when `path` holds exactly `data`, read in small chunks: the periodic resync must not
/// allocate a second copy of the plugin (it would double the agent's peak memory). The one
/// test of "this is interlock's plugin": the guard's and `interlock check`'s.
pub fn same_content(path: &Path, data: &[u8]) -> bool {
    use std::io::Read;
    // Opened without blocking and only if it is a regular file of our size: anyone who
    // can write the bin dir could have put a FIFO there.
    let Ok((mut f, _)) = interlock_contract::bounded::open_regular(path, data.len() as u64) else {
        return false;
    };
    let mut buf = [0u8; 64 * 1024];
    let mut offset = 0;
    loop {
        match f.read(&mut buf) {
            Ok(0) => return offset == data.len(),
            Ok(n) => {
                if offset + n > data.len() || buf[..n] != data[offset..offset + n] {
                    return false;
                }
                offset += n;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}

#[cfg(test)]
mod same_content_tests {
    use super::same_content;

    #[test]
    fn compares_whole_files_in_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        assert!(same_content(&p, &data));
        let mut other = data.clone();
        other[150_000] ^= 1;
        assert!(!same_content(&p, &other));
        assert!(!same_content(&p, &data[..199_999]));
        assert!(!same_content(&dir.path().join("missing"), &data));
    }
}

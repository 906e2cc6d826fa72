//! The plugin binary in every bin dir: installed atomically, verified by checksum and by
//! its VERSION answer, put back when someone removes or replaces it. Also asks other
//! plugin binaries which spec versions they support (cached per binary identity).

use crate::error::AgentError;
use interlock_protocol::atomic::write_file_atomic;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a plugin may take to answer VERSION.
pub const VERSION_TIMEOUT: Duration = Duration::from_secs(3);

/// Identity of a file on disk, to notice replacement without re-hashing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileIdentity {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
}

impl FileIdentity {
    /// The identity of `path` (following symlinks), or `None` when it does not exist.
    pub fn of(path: &Path) -> Option<FileIdentity> {
        let m = std::fs::metadata(path).ok()?;
        Some(FileIdentity {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
        })
    }
}

/// Hex SHA-256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// Runs `binary` with `CNI_COMMAND=VERSION` and returns its `supportedVersions`.
pub fn query_versions(binary: &Path) -> Result<Vec<String>, String> {
    let mut child = Command::new(binary)
        .env_clear()
        .env("CNI_COMMAND", "VERSION")
        .env("CNI_PATH", binary.parent().unwrap_or(Path::new("/")))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", binary.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(br#"{"cniVersion":"0.4.0"}"#);
    }
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if start.elapsed() > VERSION_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{} did not answer VERSION within {VERSION_TIMEOUT:?}",
                    binary.display()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => return Err(format!("waiting for {}: {e}", binary.display())),
        }
    };
    let mut out = Vec::new();
    if let Some(mut s) = child.stdout.take() {
        let _ = s.read_to_end(&mut out);
    }
    if !status.success() {
        let mut err = String::new();
        if let Some(mut s) = child.stderr.take() {
            let _ = s.read_to_string(&mut err);
        }
        return Err(format!(
            "{} VERSION failed ({status}): {} {}",
            binary.display(),
            String::from_utf8_lossy(&out).trim(),
            err.trim()
        ));
    }
    let v: serde_json::Value = serde_json::from_slice(&out).map_err(|e| {
        format!(
            "{} answered VERSION with invalid JSON ({e}): {}",
            binary.display(),
            String::from_utf8_lossy(&out)
        )
    })?;
    let list = v
        .get("supportedVersions")
        .and_then(|s| s.as_array())
        .ok_or_else(|| {
            format!(
                "{} VERSION answer has no supportedVersions",
                binary.display()
            )
        })?;
    Ok(list
        .iter()
        .filter_map(|x| x.as_str().map(str::to_string))
        .collect())
}

/// Cache of VERSION answers keyed by binary identity, so a repair never waits for exec.
#[derive(Debug, Default)]
pub struct VersionCache {
    answers: HashMap<PathBuf, (FileIdentity, Result<Vec<String>, String>)>,
}

impl VersionCache {
    /// The versions `binary` supports, asking it only when it changed since last time.
    pub fn get(&mut self, binary: &Path) -> Result<Vec<String>, String> {
        let Some(id) = FileIdentity::of(binary) else {
            return Err(format!("{} not found", binary.display()));
        };
        if let Some((cached, answer)) = self.answers.get(binary) {
            if *cached == id {
                return answer.clone();
            }
        }
        let answer = query_versions(binary);
        self.answers
            .insert(binary.to_path_buf(), (id, answer.clone()));
        answer
    }
}

/// The first executable called `plugin_type` in `bin_dirs`.
pub fn find_plugin(bin_dirs: &[PathBuf], plugin_type: &str) -> Option<PathBuf> {
    if plugin_type.is_empty() || plugin_type.contains('/') {
        return None;
    }
    bin_dirs.iter().map(|d| d.join(plugin_type)).find(|p| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

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
        let data = std::fs::read(source).map_err(|e| AgentError::PluginSource {
            path: source.to_path_buf(),
            reason: e.to_string(),
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

    /// True when `dir`'s copy was verified and is unchanged since.
    pub fn is_verified(&self, dir: &Path) -> bool {
        let id = FileIdentity::of(&dir.join(PLUGIN_FILE));
        id.is_some() && self.verified.get(dir) == id.as_ref()
    }
}

/// True when `path` holds exactly `data`, read in small chunks: the periodic resync must not
/// allocate a second copy of the plugin (it would double the agent's peak memory).
fn same_content(path: &Path, data: &[u8]) -> bool {
    use std::io::Read;
    let Ok(mut f) = std::fs::File::open(path) else {
        return false;
    };
    if f.metadata()
        .map(|m| m.len() != data.len() as u64)
        .unwrap_or(true)
    {
        return false;
    }
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

//! Atomic file replacement: no reader — the runtime, the plugin, the agent, `interlock
//! check` — ever sees a partial config, state or marker file. Every file of the contract
//! is written through here.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Replaces `path` with `data`: write a temp file in the same directory under a name no
/// runtime loads (`.<name>.<pid>.<n>.tmp`), fsync it, rename it over `path`, fsync the
/// directory. Readers see the old content or the new one, never a mix. `mode` sets the
/// permission bits; `None` keeps the existing file's mode (0644 for a new file).
pub fn write_file_atomic(path: &Path, data: &[u8], mode: Option<u32>) -> io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: no file name", path.display()),
        )
    })?;
    let mode = match mode {
        Some(m) => m,
        None => fs::metadata(path)
            .map(|m| m.permissions().mode() & 0o7777)
            .unwrap_or(0o644),
    };
    let tmp = temp_path(dir, &name.to_string_lossy());
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(data)?;
        // create_new applies the umask; set the exact mode requested.
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("writing {} atomically: {e}", path.display()),
        )
    })
}

/// A temp name in `dir` that neither containerd nor CRI-O would load (it ends in `.tmp`).
pub fn temp_path(dir: &Path, base: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    dir.join(format!(".{base}.{}.{n}.tmp", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_content_and_keeps_mode() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("10-a.conflist");
        write_file_atomic(&p, b"one", Some(0o600)).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"one");
        write_file_atomic(&p, b"two", None).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "temp file left behind: {names:?}");
    }

    #[test]
    fn temp_names_are_ignored_by_runtimes() {
        let t = temp_path(Path::new("/x"), "00-interlock.conflist");
        let s = t.to_string_lossy();
        assert!(s.ends_with(".tmp"));
        assert!(!s.ends_with(".conf") && !s.ends_with(".conflist") && !s.ends_with(".json"));
    }
}

//! Atomic file replacement: no reader — the runtime, the plugin, the agent, `interlock
//! check` — ever sees a partial config, state or marker file. Every file of the contract
//! is written through here.
//!
//! On tmpfs (a node's `/run`, where the plugin's state lives) nothing survives a crash
//! anyway, so the fsyncs are skipped there: they would cost every pod ADD time for
//! nothing. The rename stays, and with it what readers see.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Whether writes in `dir` are fsynced: not on tmpfs (`statfs` `f_type` ==
/// `TMPFS_MAGIC`), where fsync persists nothing. Asked once per directory per process;
/// a directory that cannot be asked is synced.
pub fn syncs_in(dir: &Path) -> bool {
    static KNOWN: Mutex<Vec<(PathBuf, bool)>> = Mutex::new(Vec::new());
    let mut known = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, sync)) = known.iter().find(|(d, _)| d == dir) {
        return *sync;
    }
    let sync = !nix::sys::statfs::statfs(dir)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC);
    known.push((dir.to_path_buf(), sync));
    sync
}

/// Replaces `path` with `data`: write a temp file in the same directory under a name no
/// runtime loads (`.<name>.<pid>.<n>.tmp`), fsync it, rename it over `path`, fsync the
/// directory (no fsyncs on tmpfs: [`syncs_in`]). Readers see the old content or the new one, never a mix. `mode` sets the
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
    let sync = syncs_in(dir);
    let result = write_temp(dir, &name.to_string_lossy(), data, mode, sync).and_then(|tmp| {
        let renamed = fs::rename(&tmp, path);
        if renamed.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        renamed?;
        if sync {
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    });
    result.map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("writing {} atomically: {e}", path.display()),
        )
    })
}

/// Writes `data` to a new temp file in `dir` ([`temp_path`] for `base`) with exactly the
/// permission bits `mode`, synced when `sync`, and returns its path: complete before
/// anyone renames it anywhere. Nothing is left behind on failure.
pub fn write_temp(
    dir: &Path,
    base: &str,
    data: &[u8],
    mode: u32,
    sync: bool,
) -> io::Result<PathBuf> {
    let tmp = temp_path(dir, base);
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(data)?;
        // create_new applies the umask; set the exact mode requested.
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        if sync {
            f.sync_all()?;
        }
        Ok::<(), io::Error>(())
    })();
    match result {
        Ok(()) => Ok(tmp),
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            Err(e)
        }
    }
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
    fn tmpfs_is_not_synced_a_disk_is_and_both_replace_atomically() {
        let shm = Path::new("/dev/shm");
        if nix::sys::statfs::statfs(shm)
            .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
        {
            let d = tempfile::tempdir_in(shm).unwrap();
            assert!(!syncs_in(d.path()), "tmpfs is not synced");
            // Asked once: the answer is remembered for the directory.
            assert!(!syncs_in(d.path()));
            let p = d.path().join("state.json");
            write_file_atomic(&p, b"one", Some(0o600)).unwrap();
            write_file_atomic(&p, b"two", None).unwrap();
            assert_eq!(fs::read(&p).unwrap(), b"two");
            assert_eq!(
                fs::metadata(&p).unwrap().permissions().mode() & 0o777,
                0o600
            );
            assert_eq!(fs::read_dir(d.path()).unwrap().count(), 1, "temp file left");
        } else {
            eprintln!("/dev/shm is not a tmpfs here: the tmpfs half is not checked");
        }
        // The crate's own directory is on a disk (not tmpfs) in every build tree.
        let disk = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let on_disk = nix::sys::statfs::statfs(disk.path())
            .unwrap()
            .filesystem_type()
            != nix::sys::statfs::TMPFS_MAGIC;
        assert_eq!(syncs_in(disk.path()), on_disk);
        let p = disk.path().join("10-a.conflist");
        write_file_atomic(&p, b"one", None).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"one");
        // A directory that cannot be asked is synced (and the write fails cleanly).
        assert!(syncs_in(Path::new("/nonexistent/dir")));
        let e = write_file_atomic(Path::new("/nonexistent/dir/x"), b"x", None).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/dir/x"), "{e}");
    }

    #[test]
    fn temp_names_are_ignored_by_runtimes() {
        let t = temp_path(Path::new("/x"), "00-interlock.conflist");
        let s = t.to_string_lossy();
        assert!(s.ends_with(".tmp"));
        assert!(!s.ends_with(".conf") && !s.ends_with(".conflist") && !s.ends_with(".json"));
    }
}

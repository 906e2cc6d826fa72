//! Reading a file that anyone with write access to a directory may have planted: only a
//! regular file, never blocking, never more than a cap.
//!
//! A FIFO named like a config blocks an ordinary `open`+`read` forever; a symlink to
//! `/dev/zero` or a 100 MB stray file makes it allocate without bound. The runtimes read
//! such files anyway (Go's `os.ReadFile`); interlock cannot afford to, so it refuses them
//! with a reason and the callers treat the file as unreadable (fail closed).
//!
//! Symlinks are followed, as the runtimes follow them, but what decides is the opened
//! descriptor (`fstat`), not the name: a link swapped between two calls cannot make us
//! read a device.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

/// The most interlock reads of one CNI config: far above any real config (a few KiB),
/// far below what would hurt the agent's memory budget.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Why a file was not read.
#[derive(Debug, thiserror::Error)]
pub enum BoundedReadError {
    /// Not a regular file: interlock never opens or reads it.
    #[error("{path} is {kind}, not a regular file: interlock does not read it (a runtime would block or fail on it)")]
    NotRegular {
        /// The file.
        path: String,
        /// What it is (`a FIFO`, `a character device`, `a directory`…).
        kind: &'static str,
    },
    /// Larger than the cap.
    #[error("{path} is {size} bytes, over interlock's cap of {cap} bytes for this kind of file: not read (no real CNI config or state file is that large; remove or shrink it)")]
    TooLarge {
        /// The file.
        path: String,
        /// Its size (or the size reached while reading).
        size: u64,
        /// The cap.
        cap: u64,
    },
    /// The OS refused.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        source: io::Error,
    },
}

impl BoundedReadError {
    /// True when the file did not exist (vanished between listing and reading).
    pub fn is_not_found(&self) -> bool {
        matches!(self, BoundedReadError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

/// What kind of non-regular file a `FileType` is, in words.
pub fn kind_of(t: std::fs::FileType) -> &'static str {
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_symlink() {
        "a symbolic link"
    } else {
        "a regular file"
    }
}

/// Opens `path` (following symlinks) without blocking and checks on the descriptor that
/// it is a regular file of at most `cap` bytes. Returns the file and its metadata.
pub fn open_regular(path: &Path, cap: u64) -> Result<(File, std::fs::Metadata), BoundedReadError> {
    let shown = || crate::shown::shown_os(path.as_os_str());
    let io_err = |source| BoundedReadError::Io {
        path: shown(),
        source,
    };
    // Look before opening: opening some devices has effects of its own.
    let before = std::fs::metadata(path).map_err(io_err)?;
    if !before.is_file() {
        return Err(BoundedReadError::NotRegular {
            path: shown(),
            kind: kind_of(before.file_type()),
        });
    }
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)
        .map_err(io_err)?;
    let meta = f.metadata().map_err(io_err)?;
    if !meta.is_file() {
        return Err(BoundedReadError::NotRegular {
            path: shown(),
            kind: kind_of(meta.file_type()),
        });
    }
    if meta.size() > cap {
        return Err(BoundedReadError::TooLarge {
            path: shown(),
            size: meta.size(),
            cap,
        });
    }
    Ok((f, meta))
}

/// Reads a regular file of at most `cap` bytes (see the module docs). A file that grows
/// past the cap while being read is refused too.
pub fn read_regular(path: &Path, cap: u64) -> Result<Vec<u8>, BoundedReadError> {
    read_regular_with_meta(path, cap).map(|(content, _)| content)
}

/// [`read_regular`], also returning the opened file's metadata, taken before the read:
/// a change after it changes the metadata (ctime at least), so a cache keyed by it
/// never keeps content older than its key.
pub fn read_regular_with_meta(
    path: &Path,
    cap: u64,
) -> Result<(Vec<u8>, std::fs::Metadata), BoundedReadError> {
    let (f, meta) = open_regular(path, cap)?;
    let mut out = Vec::with_capacity(meta.size() as usize);
    f.take(cap + 1)
        .read_to_end(&mut out)
        .map_err(|source| BoundedReadError::Io {
            path: crate::shown::shown_os(path.as_os_str()),
            source,
        })?;
    if out.len() as u64 > cap {
        return Err(BoundedReadError::TooLarge {
            path: crate::shown::shown_os(path.as_os_str()),
            size: out.len() as u64,
            cap,
        });
    }
    Ok((out, meta))
}

/// [`read_regular`] with [`MAX_CONFIG_BYTES`].
pub fn read_config(path: &Path) -> Result<Vec<u8>, BoundedReadError> {
    read_regular(path, MAX_CONFIG_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_fifos_devices_and_large_files_without_blocking() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("x.conflist");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        let e = read_config(&fifo).unwrap_err();
        assert!(e.to_string().contains("a FIFO"), "{e}");
        assert!(e.to_string().contains("x.conflist"), "{e}");

        let zero = d.path().join("zero.json");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let e = read_config(&zero).unwrap_err();
        assert!(e.to_string().contains("character device"), "{e}");

        let big = d.path().join("big.json");
        let f = File::create(&big).unwrap();
        f.set_len(MAX_CONFIG_BYTES + 1).unwrap();
        let e = read_config(&big).unwrap_err();
        assert!(matches!(e, BoundedReadError::TooLarge { .. }), "{e}");
        assert!(e.to_string().contains("1048576"), "{e}");

        let ok = d.path().join("ok.conf");
        std::fs::write(&ok, b"{}").unwrap();
        let link = d.path().join("link.conf");
        std::os::unix::fs::symlink(&ok, &link).unwrap();
        assert_eq!(read_config(&link).unwrap(), b"{}");
        assert!(read_config(&d.path().join("gone"))
            .unwrap_err()
            .is_not_found());
        let e = read_config(d.path()).unwrap_err();
        assert!(e.to_string().contains("a directory"), "{e}");
    }
}

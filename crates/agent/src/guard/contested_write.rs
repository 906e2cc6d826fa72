//! Replacing a file that another writer also writes (the primary CNI's own config in chain
//! mode) without ever losing one of its writes.
//!
//! The guard decides what to write from the file as it read it. Renaming the result over
//! the name would throw away whatever the other writer put there in between: with a
//! primary rewriting its conflist 100 times a second, its last write was sometimes
//! replaced by interlock's insert into the write before. So the new content goes in with
//! `renameat2(RENAME_EXCHANGE)`, which swaps it with what is there in one step and leaves
//! that under the temp name, where it is compared byte for byte with what the decision
//! was made from. When it differs, someone wrote in between, and the loop goes on from
//! that newer content: the decision is made again from it and written the same way, or,
//! when there is nothing to write for it (it already carries our entry, or it does not
//! parse because its writer is still writing it in place), it is exchanged back under its
//! name. Each exchange is checked the same way, so a write that lands between two of ours
//! is caught too.
//!
//! Only two things are ever deleted: what this loop put in place itself and then took
//! out again unchanged, and a foreign version once what is in place was made from it (or
//! from a newer one). A writer that writes in place (`O_TRUNC`, same inode) and opened the
//! file before the exchange has truncated it already, so its version differs from the
//! one the decision saw; while it does not parse, it is exchanged back, and the rest of
//! its writes land under its name. Readers never see a partial file: every temp file is
//! complete (and synced, except on tmpfs) before it is exchanged in. The exchanges
//! themselves are not synced here: the caller syncs the directory once afterwards (the
//! guard off its thread, `crate::guard::DirSyncer`), since a sync does not change what
//! readers see, only what survives a crash.
//!
//! An in-place writer that resolved the name just before an exchange writes into the
//! file the exchange took out. Once it has the file open, the kernel refuses a read lease
//! on it, so what an exchange took out is read only when no one has it open for writing
//! (waiting up to [`WRITER_WAIT`] for a writer to finish): its write is seen and
//! followed, not thrown away with the file. A writer that resolved the name before the
//! exchange but opens it only after that check (a stall of its own inside `open`) can
//! still write into a file no longer under the name; its next write is followed.
//!
//! A file that did not exist when the decision was made is created with
//! `RENAME_NOREPLACE`, so a file someone created in between is never replaced. A
//! filesystem without `RENAME_EXCHANGE` gets the plain atomic rename (logged once).
//!
//! Left open: if the agent is killed in the microseconds between two exchanges of one
//! race, the newer foreign version is under the temp name, and the next start sweeps it
//! away as a dead writer's temp file; the primary's next write is followed as usual.

use interlock_contract::atomic::{self, syncs_in, write_file_atomic};
use interlock_contract::bounded;
use nix::errno::Errno;
use nix::fcntl::{renameat2, RenameFlags};
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tracing::warn;

/// How many newer foreign versions one replacement follows before it gives the file back
/// to its writer unchanged (a writer that outpaces two syscalls this many times in a row
/// is in a fight the conflict tracker handles).
pub const MAX_FOLLOWED: u32 = 64;

/// How long what an exchange took out may stay open for writing by someone else before
/// it is read anyway (a writer that keeps the file open for good must not stall the
/// guard). The unit tests wait longer, so a writer thread a loaded machine schedules
/// late still writes within it.
pub const WRITER_WAIT: Duration = if cfg!(test) {
    Duration::from_secs(20)
} else {
    Duration::from_millis(100)
};

/// Hard stop: rounds in which every exchange met a newer foreign version.
const MAX_ROUNDS: u32 = 10_000;

/// What a checked replacement did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replaced {
    /// `bytes` are in place, made from the newest version anyone wrote before they went
    /// in; `followed` newer versions were met on the way (0: none raced).
    Written {
        /// What is under the name now.
        bytes: Vec<u8>,
        /// Foreign versions that arrived after the decision and were followed.
        followed: u32,
    },
    /// Someone else's version is in place, untouched (it needs no write, or it changed
    /// faster than it could be followed, or the file was removed or created meanwhile);
    /// its own change event brings a new decision.
    Yielded {
        /// Why, for the log.
        why: String,
    },
}

/// Replaces `dir/name` with `bytes` (permission bits `mode`) unless someone changed it
/// since it held `base` (`None`: it did not exist). On a change, `rederive(newer)` says
/// what to write instead given the newer content (`None`: nothing, leave it as it is).
/// See the module docs.
pub fn replace_checked(
    dir: &Path,
    name: &str,
    mode: u32,
    base: Option<&[u8]>,
    bytes: Vec<u8>,
    rederive: &mut dyn FnMut(&[u8]) -> Option<Vec<u8>>,
) -> io::Result<Replaced> {
    let path = dir.join(name);
    let sync = syncs_in(dir);
    let Some(base) = base else {
        return create_new(dir, name, &path, mode, bytes, sync);
    };
    // What we believe is under the name (`None`: something we could not read, which
    // never compares equal), and the newest foreign version we took out of place and
    // have not yet replaced with something made from it.
    let mut expected: Option<Vec<u8>> = Some(base.to_vec());
    let mut held: Option<Held> = None;
    let mut next = Next::Fresh(bytes);
    let mut followed = 0u32;
    for _ in 0..MAX_ROUNDS {
        // Put in either a fresh file made from the newest version, or that version itself.
        let (tmp, put, fresh) = match next {
            Next::Fresh(b) => (write_temp(dir, name, &b, mode, sync)?, Some(b), true),
            Next::PutBack => match held.take() {
                Some(h) => (h.path, h.content, false),
                None => {
                    return Err(io::Error::other(format!(
                        "replacing {}: no version held to put back (internal error)",
                        path.display()
                    )))
                }
            },
        };
        if let Err(e) = renameat2(None, &tmp, None, &path, RenameFlags::RENAME_EXCHANGE) {
            if !fresh {
                // `tmp` is the held foreign version: never delete it.
                held = Some(Held {
                    path: tmp,
                    content: put.clone(),
                });
            } else {
                remove(&tmp);
            }
            match e {
                Errno::ENOENT => {
                    // The name is gone: its writer removed it, which is newer than any
                    // version we hold.
                    if let Some(h) = held.take() {
                        remove(&h.path);
                    }
                    return Ok(Replaced::Yielded {
                        why: format!("{name} was removed meanwhile"),
                    });
                }
                Errno::EINVAL | Errno::ENOSYS | Errno::EOPNOTSUPP if held.is_none() => {
                    return fallback(&path, put.unwrap_or_default(), mode);
                }
                e => {
                    return Err(held_error(
                        &path,
                        held.as_ref(),
                        io::Error::from(e),
                        "exchanging the new content in",
                    ))
                }
            }
        }
        // `tmp` now holds what was under the name. (The directory is synced by the
        // caller, once for the whole replacement: see the module docs.)
        let out = read_swapped_out(&tmp);
        if out.is_some() && out == expected {
            // Unchanged since we last knew it: what is in place now replaces it. A held
            // version is what `put` was made from.
            remove(&tmp);
            if let Some(h) = held.take() {
                remove(&h.path);
            }
            return Ok(match put {
                Some(bytes) if fresh => Replaced::Written { bytes, followed },
                _ => Replaced::Yielded {
                    why: format!("{name} changed meanwhile and is left as its writer wrote it"),
                },
            });
        }
        // A newer foreign version (or something that is not a readable file). A version
        // held before it is older: its writer replaced what we had made from it.
        if let Some(h) = held.take() {
            remove(&h.path);
        }
        followed += 1;
        next = match &out {
            Some(newer) if followed <= MAX_FOLLOWED => {
                rederive(newer).map_or(Next::PutBack, Next::Fresh)
            }
            _ => Next::PutBack,
        };
        held = Some(Held {
            path: tmp,
            content: out,
        });
        expected = put;
    }
    Err(held_error(
        &path,
        held.as_ref(),
        io::Error::other(format!(
            "it was rewritten faster than interlock could follow, {MAX_ROUNDS} times in a row"
        )),
        "following its writer",
    ))
}

/// A foreign version taken out of place by an exchange, under a temp name.
struct Held {
    path: PathBuf,
    /// Its content (`None`: not a regular file of a config's size).
    content: Option<Vec<u8>>,
}

/// What the next exchange puts in.
enum Next {
    /// A new file with these bytes.
    Fresh(Vec<u8>),
    /// The held foreign version, back under its name.
    PutBack,
}

/// Creates `name` with `bytes` unless it exists (someone created it since the decision).
fn create_new(
    dir: &Path,
    name: &str,
    path: &Path,
    mode: u32,
    bytes: Vec<u8>,
    sync: bool,
) -> io::Result<Replaced> {
    let tmp = write_temp(dir, name, &bytes, mode, sync)?;
    match renameat2(None, &tmp, None, path, RenameFlags::RENAME_NOREPLACE) {
        Ok(()) => {}
        Err(Errno::EEXIST) => {
            remove(&tmp);
            return Ok(Replaced::Yielded {
                why: format!("{name} was created meanwhile"),
            });
        }
        Err(Errno::EINVAL) | Err(Errno::ENOSYS) | Err(Errno::EOPNOTSUPP) => {
            remove(&tmp);
            return fallback(path, bytes, mode);
        }
        Err(e) => {
            remove(&tmp);
            return Err(io::Error::new(
                io::Error::from(e).kind(),
                format!("creating {}: {e}", path.display()),
            ));
        }
    }
    Ok(Replaced::Written { bytes, followed: 0 })
}

/// The plain atomic rename, for a filesystem without `renameat2`'s flags.
fn fallback(path: &Path, bytes: Vec<u8>, mode: u32) -> io::Result<Replaced> {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.swap(true, Ordering::Relaxed) {
        warn!(
            "the filesystem of {} does not support renameat2(RENAME_EXCHANGE/NOREPLACE): \
             writing with a plain rename, so a write another writer makes at the same \
             moment can be lost (it is followed again on its next write)",
            path.display()
        );
    }
    write_file_atomic(path, &bytes, Some(mode))?;
    Ok(Replaced::Written { bytes, followed: 0 })
}

/// A complete temp file with `bytes` next to `name` (a name no runtime loads).
fn write_temp(dir: &Path, name: &str, bytes: &[u8], mode: u32, sync: bool) -> io::Result<PathBuf> {
    atomic::write_temp(dir, name, bytes, mode, sync).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("writing a temp file for {}: {e}", dir.join(name).display()),
        )
    })
}

/// The content of what an exchange took out, when it is a regular file of a config's
/// size (anything else is someone's and goes back: it is never compared equal).
/// A writer that has it open is waited for (see the module docs).
fn read_swapped_out(tmp: &Path) -> Option<Vec<u8>> {
    let regular = fs::symlink_metadata(tmp).is_ok_and(|m| m.file_type().is_file());
    if !regular {
        return None;
    }
    if let Ok(f) = File::open(tmp) {
        let t0 = Instant::now();
        while open_for_writing(&f) == Some(true) && t0.elapsed() < WRITER_WAIT {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    bounded::read_config(tmp).ok()
}

/// Whether someone has `f`'s file open for writing, asked by taking a read lease and
/// dropping it at once: the kernel refuses one on a file open for writing. `None`: not
/// known (leases switched off, or the file is not ours to lease).
#[allow(unsafe_code)]
fn open_for_writing(f: &File) -> Option<bool> {
    use std::os::fd::AsRawFd;
    // Linux's `F_SETSIG` (asm-generic/fcntl.h), which the libc crate does not name.
    const F_SETSIG: libc::c_int = 10;
    let fd = f.as_raw_fd();
    // SAFETY: `fcntl` with integer arguments on a descriptor `f` keeps open. A writer
    // opening the file in the microseconds the lease is held waits for its release and
    // makes the kernel signal the holder: SIGURG, whose default action is to ignore it,
    // instead of SIGIO, whose default ends the process.
    unsafe {
        if libc::fcntl(fd, F_SETSIG, libc::SIGURG) == -1 {
            return None;
        }
        if libc::fcntl(fd, libc::F_SETLEASE, libc::F_RDLCK) == -1 {
            return (io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN))
                .then_some(true);
        }
        libc::fcntl(fd, libc::F_SETLEASE, libc::F_UNLCK);
    }
    Some(false)
}

fn remove(p: &Path) {
    let _ = fs::remove_file(p);
}

fn held_error(path: &Path, held: Option<&Held>, e: io::Error, doing: &str) -> io::Error {
    let kept = held.map_or(String::new(), |h| {
        format!(
            "; a newer version another writer wrote is kept as {} (move it back over {} if \
             it is the one the node needs)",
            h.path.display(),
            path.display()
        )
    });
    io::Error::new(
        e.kind(),
        format!("replacing {} ({doing}): {e}{kept}", path.display()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::sync::atomic::AtomicU32;
    use std::sync::Arc;

    fn names(d: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// What the guard would write for a version: the version plus our mark.
    fn ours(v: &[u8]) -> Option<Vec<u8>> {
        (!v.ends_with(b"+ours")).then(|| [v, b" +ours"].concat())
    }

    #[test]
    fn unchanged_file_is_replaced_and_nothing_is_left_behind() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("10-p.conflist"), "v1").unwrap();
        let r = replace_checked(
            d.path(),
            "10-p.conflist",
            0o640,
            Some(b"v1"),
            b"v1 +ours".to_vec(),
            &mut |_| panic!("nothing raced"),
        )
        .unwrap();
        assert_eq!(
            r,
            Replaced::Written {
                bytes: b"v1 +ours".to_vec(),
                followed: 0
            }
        );
        assert_eq!(
            fs::read(d.path().join("10-p.conflist")).unwrap(),
            b"v1 +ours"
        );
        let m = fs::metadata(d.path().join("10-p.conflist")).unwrap();
        assert_eq!(m.permissions().mode() & 0o7777, 0o640);
        assert_eq!(names(d.path()), ["10-p.conflist"]);
    }

    #[test]
    fn a_version_written_after_the_decision_is_followed_not_lost() {
        let d = tempfile::tempdir().unwrap();
        // The decision saw v1; the writer has written v2 since.
        fs::write(d.path().join("10-p.conflist"), "v2").unwrap();
        let mut seen = vec![];
        let r = replace_checked(
            d.path(),
            "10-p.conflist",
            0o644,
            Some(b"v1"),
            b"v1 +ours".to_vec(),
            &mut |v| {
                seen.push(v.to_vec());
                ours(v)
            },
        )
        .unwrap();
        assert_eq!(seen, [b"v2".to_vec()]);
        assert_eq!(
            r,
            Replaced::Written {
                bytes: b"v2 +ours".to_vec(),
                followed: 1
            }
        );
        assert_eq!(
            fs::read(d.path().join("10-p.conflist")).unwrap(),
            b"v2 +ours"
        );
        assert_eq!(names(d.path()), ["10-p.conflist"]);
    }

    /// An in-place writer that opened the file just before the exchange writes into what
    /// the exchange took out: its write is waited for and followed, not deleted with it.
    #[test]
    fn an_in_place_write_into_the_file_taken_out_is_followed() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("10-p.conflist");
        fs::write(&p, "v1").unwrap();
        let ino = fs::metadata(&p).unwrap().ino();
        // The writer has the file open (as `open(O_TRUNC)` would) before the exchange...
        let mut f = fs::OpenOptions::new().write(true).open(&p).unwrap();
        let p2 = p.clone();
        let writer = std::thread::spawn(move || {
            // ...and writes once the name no longer leads to it.
            let t0 = Instant::now();
            while fs::metadata(&p2).unwrap().ino() == ino {
                assert!(
                    t0.elapsed() < Duration::from_secs(30),
                    "no exchange happened"
                );
                std::thread::yield_now();
            }
            use std::io::Write;
            f.set_len(0).unwrap();
            f.write_all(b"v2").unwrap();
        });
        let r = replace_checked(
            d.path(),
            "10-p.conflist",
            0o644,
            Some(b"v1"),
            b"v1 +ours".to_vec(),
            &mut |v| ours(v),
        )
        .unwrap();
        writer.join().unwrap();
        assert_eq!(
            r,
            Replaced::Written {
                bytes: b"v2 +ours".to_vec(),
                followed: 1
            },
            "the write into the file taken out was lost"
        );
        assert_eq!(fs::read(&p).unwrap(), b"v2 +ours");
        assert_eq!(names(d.path()), ["10-p.conflist"]);
    }

    #[test]
    fn a_newer_version_that_needs_nothing_goes_back_as_the_same_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("10-p.conflist");
        // The writer's newer version: not yet parseable (written in place, half done), or
        // already carrying our entry. Either way it stays, as the very same inode, so an
        // in-place writer's remaining writes land under the name.
        fs::write(&p, "v2 half").unwrap();
        let ino = fs::metadata(&p).unwrap().ino();
        let r = replace_checked(
            d.path(),
            "10-p.conflist",
            0o644,
            Some(b"v1"),
            b"v1 +ours".to_vec(),
            &mut |_| None,
        )
        .unwrap();
        assert!(matches!(r, Replaced::Yielded { .. }), "{r:?}");
        assert_eq!(fs::read(&p).unwrap(), b"v2 half");
        assert_eq!(
            fs::metadata(&p).unwrap().ino(),
            ino,
            "not the writer's file"
        );
        assert_eq!(names(d.path()), ["10-p.conflist"]);
    }

    #[test]
    fn a_file_created_or_removed_meanwhile_is_left_to_its_writer() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("10-p.conflist");
        // Absent at the decision, created since: not replaced.
        fs::write(&p, "theirs").unwrap();
        let r = replace_checked(
            d.path(),
            "10-p.conflist",
            0o644,
            None,
            b"ours".to_vec(),
            &mut |_| panic!("no rederive for a create"),
        )
        .unwrap();
        assert!(matches!(r, Replaced::Yielded { .. }), "{r:?}");
        assert_eq!(fs::read(&p).unwrap(), b"theirs");
        // Present at the decision, removed since: not brought back.
        fs::remove_file(&p).unwrap();
        let r = replace_checked(
            d.path(),
            "10-p.conflist",
            0o644,
            Some(b"theirs"),
            b"theirs +ours".to_vec(),
            &mut ours,
        )
        .unwrap();
        assert!(matches!(r, Replaced::Yielded { .. }), "{r:?}");
        assert!(names(d.path()).is_empty(), "{:?}", names(d.path()));
        // Absent and still absent: created.
        let r = replace_checked(
            d.path(),
            "10-p.conflist",
            0o600,
            None,
            b"ours".to_vec(),
            &mut ours,
        )
        .unwrap();
        assert!(matches!(r, Replaced::Written { .. }), "{r:?}");
        assert_eq!(fs::read(&p).unwrap(), b"ours");
        assert_eq!(names(d.path()), ["10-p.conflist"]);
    }

    #[test]
    fn something_that_is_not_a_file_is_put_back_untouched() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("10-p.conflist");
        fs::create_dir(&p).unwrap();
        fs::write(p.join("inside"), "x").unwrap();
        let r = replace_checked(
            d.path(),
            "10-p.conflist",
            0o644,
            Some(b"v1"),
            b"v1 +ours".to_vec(),
            &mut ours,
        )
        .unwrap();
        assert!(matches!(r, Replaced::Yielded { .. }), "{r:?}");
        assert!(p.join("inside").exists());
        assert_eq!(names(d.path()), ["10-p.conflist"]);
    }

    /// A whole version as the writer below writes it (`v<n>`; `+ours` added by us).
    fn complete(v: &[u8]) -> bool {
        v.len() > 1 && v[0] == b'v' && v[1].is_ascii_digit()
    }

    /// A writer renaming or writing in place as fast as it can, and a guard-like loop
    /// that reads the file and replaces it from what it read: when the writer stops, the
    /// file is made from the writer's last version, and no temp file is left.
    #[test]
    fn a_racing_writer_never_loses_its_last_version() {
        for in_place in [false, true] {
            let d = tempfile::tempdir().unwrap();
            let dir = d.path().to_path_buf();
            let p = dir.join("10-p.conflist");
            fs::write(&p, "v0").unwrap();
            let last = Arc::new(AtomicU32::new(0));
            let stop = Arc::new(AtomicBool::new(false));
            let writer = {
                let (dir, last, stop) = (dir.clone(), last.clone(), stop.clone());
                std::thread::spawn(move || {
                    for i in 1..=3000u32 {
                        let body = format!("v{i}");
                        if in_place {
                            fs::write(dir.join("10-p.conflist"), &body).unwrap();
                        } else {
                            let tmp = dir.join(".writer.tmp");
                            fs::write(&tmp, &body).unwrap();
                            fs::rename(&tmp, dir.join("10-p.conflist")).unwrap();
                        }
                        last.store(i, Ordering::SeqCst);
                        if i % 7 == 0 {
                            std::thread::yield_now();
                        }
                    }
                    stop.store(true, Ordering::SeqCst);
                })
            };
            let mut followed = 0;
            let mut settled_reads = 0;
            loop {
                let Ok(now) = fs::read(&p) else { continue };
                // A half-written version (in place) does not parse: no decision from it.
                match ours(&now).filter(|_| complete(&now)) {
                    Some(bytes) => {
                        let mut rederive = |v: &[u8]| ours(v).filter(|_| complete(v));
                        if let Replaced::Written { followed: f, .. } = replace_checked(
                            &dir,
                            "10-p.conflist",
                            0o644,
                            Some(&now),
                            bytes,
                            &mut rederive,
                        )
                        .unwrap()
                        {
                            followed += f;
                        }
                    }
                    None if stop.load(Ordering::SeqCst) => {
                        // Read twice in a row made from some version: settled.
                        settled_reads += 1;
                        if settled_reads > 2 {
                            break;
                        }
                    }
                    None => {}
                }
            }
            writer.join().unwrap();
            let want = format!("v{} +ours", last.load(Ordering::SeqCst));
            assert_eq!(
                String::from_utf8_lossy(&fs::read(&p).unwrap()),
                want,
                "in place: {in_place}; the writer's last version was lost"
            );
            assert_eq!(names(&dir), ["10-p.conflist"], "in place: {in_place}");
            eprintln!("in place: {in_place}: {followed} newer versions followed");
        }
    }
}

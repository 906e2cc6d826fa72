//! The lock and record of one pod netns, the unit of protection
//! (`interlock_contract::state::NetnsRecord`): `<stateDir>/netns/<dev>-<ino>.json`,
//! changed only while holding `flock` on `<stateDir>/netns/<dev>-<ino>.lock`
//! ([`NetnsStore::lock`]). One lock per netns: work on different pods never waits.
//! The plugin takes it for ADD, DEL and GC; the agent takes it to repair a netns in place.
//!
//! Lock files are deleted with their record, while held; a locker that opened the file
//! before it was deleted notices (the path no longer names its file) and starts over.
//! A lock released with no record beside it (a verb that failed before writing one) goes
//! the same way, so a lock file outlives its holder only when the holder died holding it
//! (an agent SIGTERMed or killed mid-repair, a plugin killed mid-ADD): the flock went with
//! the process, and [`NetnsStore::sweep_orphan_locks`] (the agent's audit, the plugin's
//! GC) removes such a file once it can take the lock itself and still finds no record.

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use interlock_contract::atomic::write_file_atomic;
use interlock_contract::layout::NETNS_DIR;
use interlock_contract::state::NetnsRecord;
use nix::fcntl::{Flock, FlockArg};

use crate::netns::NetnsId;
use std::time::{Duration, Instant};

/// Why `dir` must not hold interlock's state, if it must not (`None` when it is missing:
/// it is created, then checked): a directory, not a symbolic link (whose target someone
/// else chose), owned by root or by this process's user, writable by neither group nor
/// others. Otherwise an unprivileged user could point the plugin's root writes anywhere,
/// or hold a netns lock to block every ADD and DEL of that pod.
pub fn untrusted_dir(dir: &Path) -> Option<String> {
    let m = match fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
        Err(e) => return Some(format!("{} cannot be inspected: {e}", dir.display())),
    };
    let mut why = vec![];
    if m.file_type().is_symlink() {
        why.push("a symbolic link".to_string());
    } else if !m.is_dir() {
        why.push("not a directory".to_string());
    }
    let me = nix::unistd::geteuid().as_raw();
    if m.uid() != 0 && m.uid() != me {
        why.push(format!("owned by uid {}", m.uid()));
    }
    if m.mode() & 0o022 != 0 && !m.file_type().is_symlink() {
        why.push(format!(
            "writable by group or others (mode {:04o})",
            m.mode() & 0o7777
        ));
    }
    (!why.is_empty()).then(|| {
        format!(
            "{} is {}: refusing to keep interlock's state there; make it a root-owned directory not writable by group or others",
            dir.display(),
            why.join(" and ")
        )
    })
}

/// [`untrusted_dir`] as an error, for each of `dirs`.
pub fn check_trusted(dirs: &[&Path]) -> io::Result<()> {
    match dirs.iter().find_map(|d| untrusted_dir(d)) {
        Some(why) => Err(io::Error::new(io::ErrorKind::PermissionDenied, why)),
        None => Ok(()),
    }
}

/// How long [`NetnsStore::lock`] waits for another holder of a netns's lock: an ADD, DEL
/// or GC holds it for milliseconds; a holder that keeps it longer fails the verb (the
/// runtime retries it) instead of blocking it forever.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// The records and locks under `<stateDir>/netns`.
#[derive(Debug, Clone)]
pub struct NetnsStore {
    dir: PathBuf,
}

/// The exclusive lock on one netns's record; released when dropped, and its file removed
/// then when no record is beside it (nothing to guard: see the module docs).
#[derive(Debug)]
pub struct NetnsLock {
    id: NetnsId,
    lock_path: PathBuf,
    record_path: PathBuf,
    _flock: Flock<File>,
}

/// `flock` without blocking, retried (1 ms, doubling to 50 ms) until `deadline`.
fn lock_until(
    mut file: File,
    path: &Path,
    deadline: Instant,
    timeout: Duration,
) -> io::Result<Flock<File>> {
    let mut wait = Duration::from_millis(1);
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(held) => return Ok(held),
            Err((f, nix::errno::Errno::EWOULDBLOCK)) => {
                if Instant::now() >= deadline {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "locking {}: another process has held it for over {timeout:?}",
                            path.display()
                        ),
                    ));
                }
                file = f;
                std::thread::sleep(wait.min(deadline.saturating_duration_since(Instant::now())));
                wait = (wait * 2).min(Duration::from_millis(50));
            }
            Err((_, e)) => {
                return Err(io::Error::new(
                    io::Error::from(e).kind(),
                    format!("locking {}: {e}", path.display()),
                ))
            }
        }
    }
}

impl NetnsStore {
    /// The store under `state_dir`.
    pub fn new(state_dir: &Path) -> NetnsStore {
        NetnsStore {
            dir: state_dir.join(NETNS_DIR),
        }
    }

    /// The directory holding records and locks.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Takes the lock of netns `id`, waiting for its holder (another ADD, DEL or GC of
    /// the same netns; never one of another netns) at most [`LOCK_TIMEOUT`].
    pub fn lock(&self, id: NetnsId) -> io::Result<NetnsLock> {
        self.lock_within(id, LOCK_TIMEOUT)
    }

    /// [`lock`](Self::lock) waiting at most `timeout`; refuses a state dir or netns dir
    /// that [`untrusted_dir`] refuses.
    pub fn lock_within(&self, id: NetnsId, timeout: Duration) -> io::Result<NetnsLock> {
        if let Some(state_dir) = self.dir.parent() {
            check_trusted(&[state_dir, &self.dir])?;
        }
        let deadline = Instant::now() + timeout;
        let lock_path = self.dir.join(format!("{id}.lock"));
        let open = || {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&lock_path)
        };
        loop {
            // The directory exists after the first ADD: make it only when it is missing.
            let file = match open() {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    fs::create_dir_all(&self.dir).map_err(|e| {
                        io::Error::new(e.kind(), format!("creating {}: {e}", self.dir.display()))
                    })?;
                    check_trusted(&[&self.dir])?;
                    open()
                }
                other => other,
            }
            .map_err(|e| {
                io::Error::new(e.kind(), format!("opening {}: {e}", lock_path.display()))
            })?;
            let held = lock_until(file, &lock_path, deadline, timeout)?;
            // The holder before us may have deleted the file (its last reference went):
            // then this lock guards nothing, start over on the path's current file.
            let mine = held.metadata()?.ino();
            match fs::symlink_metadata(&lock_path) {
                Ok(m) if m.ino() == mine => {
                    return Ok(NetnsLock {
                        id,
                        record_path: self.dir.join(format!("{id}.json")),
                        lock_path,
                        _flock: held,
                    })
                }
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Removes every lock file that has no record beside it and that no live process
    /// holds: what a holder killed before it wrote a record (or forgot one) leaves. Each
    /// is locked first without waiting — a lock someone holds is skipped, never removed —
    /// and removed only when the path still names the file locked and no record appeared
    /// (the same deletion under the lock as [`NetnsLock::forget`]'s, so a locker that
    /// opened it meanwhile starts over). Returns the files removed.
    pub fn sweep_orphan_locks(&self) -> io::Result<Vec<PathBuf>> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        if let Some(state_dir) = self.dir.parent() {
            check_trusted(&[state_dir, &self.dir])?;
        }
        let mut removed = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(id) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".lock"))
                .and_then(|s| s.parse::<NetnsId>().ok())
            else {
                continue;
            };
            let lock_path = entry.path();
            let record_path = self.dir.join(format!("{id}.json"));
            if record_path.exists() {
                continue;
            }
            let Ok(file) = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(&lock_path)
            else {
                continue;
            };
            // Held by a live process (an ADD, DEL, GC or repair in progress): its holder
            // removes it, or writes the record it guards.
            let Ok(held) = Flock::lock(file, FlockArg::LockExclusiveNonblock) else {
                continue;
            };
            let mine = held.metadata()?.ino();
            let still_mine =
                fs::symlink_metadata(&lock_path).is_ok_and(|m| m.is_file() && m.ino() == mine);
            if still_mine && !record_path.exists() && fs::remove_file(&lock_path).is_ok() {
                removed.push(lock_path);
            }
        }
        Ok(removed)
    }

    /// The ids of every netns with a record or a lock file.
    pub fn ids(&self) -> io::Result<BTreeSet<NetnsId>> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(BTreeSet::new()),
            Err(e) => return Err(e),
        };
        let mut ids = BTreeSet::new();
        for entry in entries {
            let name = entry?.file_name();
            let name = name.to_string_lossy();
            let stem = name
                .strip_suffix(".json")
                .or_else(|| name.strip_suffix(".lock"));
            if let Some(id) = stem.and_then(|s| s.parse().ok()) {
                ids.insert(id);
            }
        }
        Ok(ids)
    }
}

impl NetnsLock {
    /// The netns this lock is for.
    pub fn id(&self) -> NetnsId {
        self.id
    }

    /// The record, if there is one. A corrupt record counts as none (the references it
    /// held are then lost: their rules are re-verified or re-applied by the next ADD).
    ///
    /// Read only as a regular file of at most 1 MiB, opened without following a link and
    /// without blocking: a FIFO or a huge file planted in its place is refused, not
    /// waited on.
    pub fn load(&self) -> io::Result<Option<NetnsRecord>> {
        match read_bounded(&self.record_path) {
            Ok(bytes) => Ok(serde_json::from_slice(&bytes).ok()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io::Error::new(
                e.kind(),
                format!("reading {}: {e}", self.record_path.display()),
            )),
        }
    }

    /// Writes the record atomically.
    pub fn save(&self, record: &NetnsRecord) -> io::Result<()> {
        let mut data = serde_json::to_vec_pretty(record).map_err(io::Error::other)?;
        data.push(b'\n');
        write_file_atomic(&self.record_path, &data, Some(0o600))
    }

    /// Deletes the record and the lock file (no reference is left); the lock is released.
    pub fn forget(self) -> io::Result<()> {
        for p in [&self.record_path, &self.lock_path] {
            match fs::remove_file(p) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("removing {}: {e}", p.display()),
                    ))
                }
            }
        }
        Ok(())
    }
}

impl Drop for NetnsLock {
    /// Still holding the lock: with no record beside it, the file guards nothing and
    /// goes (see the module docs); a locker waiting on it starts over.
    ///
    /// Only while the path still names the file locked: after [`NetnsLock::forget`] it may
    /// name a file another locker created and holds (the path is only ever unlinked by
    /// the holder of the file it names, so it cannot change between the check and here).
    fn drop(&mut self) {
        let no_record = matches!(
            fs::symlink_metadata(&self.record_path),
            Err(e) if e.kind() == io::ErrorKind::NotFound
        );
        let mine = self._flock.metadata().map(|m| m.ino()).ok();
        let still_mine = fs::symlink_metadata(&self.lock_path).is_ok_and(|m| Some(m.ino()) == mine);
        if no_record && still_mine {
            let _ = fs::remove_file(&self.lock_path);
        }
    }
}

/// The largest record read (a real one is a few KiB).
const MAX_RECORD_BYTES: u64 = 1 << 20;

fn read_bounded(path: &Path) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() || meta.len() > MAX_RECORD_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} is not a regular file of at most {MAX_RECORD_BYTES} bytes: not read",
                path.display()
            ),
        ));
    }
    let mut out = Vec::with_capacity(meta.len() as usize);
    f.take(MAX_RECORD_BYTES).read_to_end(&mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use interlock_contract::config::BackendKind;
    use interlock_contract::state::AttachmentKey;
    use std::os::unix::process::CommandExt;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    /// redteam-3 L-3: a held netns lock fails the verb after the timeout instead of
    /// blocking it forever, and the state dir must be one only root can write.
    #[test]
    fn a_held_lock_times_out_and_an_untrusted_state_dir_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let t = interlock_testkit::tempdir().unwrap();
        let store = NetnsStore::new(t.path());
        let id = NetnsId { dev: 3, ino: 77 };
        let held = store.lock(id).unwrap();
        let t0 = Instant::now();
        let e = store
            .lock_within(id, Duration::from_millis(200))
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(e.to_string().contains("held it for over"), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(2));
        drop(held);
        drop(store.lock_within(id, Duration::from_millis(200)).unwrap());

        fs::set_permissions(t.path(), fs::Permissions::from_mode(0o777)).unwrap();
        let e = store.lock(id).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(
            e.to_string()
                .contains("writable by group or others (mode 0777)"),
            "{e}"
        );
        fs::set_permissions(t.path(), fs::Permissions::from_mode(0o755)).unwrap();
        // A netns dir that is a symbolic link to somewhere else.
        let elsewhere = interlock_testkit::tempdir().unwrap();
        fs::remove_dir_all(store.dir()).unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), store.dir()).unwrap();
        let e = store.lock(id).unwrap_err();
        assert!(e.to_string().contains("a symbolic link"), "{e}");
        assert_eq!(fs::read_dir(elsewhere.path()).unwrap().count(), 0);
    }

    fn record(id: NetnsId) -> NetnsRecord {
        let key = AttachmentKey {
            container_id: "a".into(),
            ifname: "eth0".into(),
        };
        NetnsRecord {
            netns_id: id.to_string(),
            netns: "/var/run/netns/x".into(),
            backend: BackendKind::Nftables,
            spec: "{}".into(),
            spec_hash: "h".into(),
            probe: vec![],
            proven_by: key.clone(),
            attachments: vec![key],
            updated_at_ms: 1,
            shape: interlock_contract::state::RULE_SHAPE,
        }
    }

    #[test]
    fn records_round_trip_and_are_forgotten() {
        let t = interlock_testkit::tempdir().unwrap();
        let store = NetnsStore::new(t.path());
        let id = NetnsId {
            dev: 4,
            ino: 4026532000,
        };
        let lock = store.lock(id).unwrap();
        assert_eq!(lock.load().unwrap(), None);
        let r = record(id);
        lock.save(&r).unwrap();
        assert_eq!(lock.load().unwrap(), Some(r));
        assert_eq!(store.ids().unwrap(), [id].into());
        lock.forget().unwrap();
        assert!(store.ids().unwrap().is_empty());
        assert_eq!(fs::read_dir(store.dir()).unwrap().count(), 0);
    }

    /// Lockers of one netns are serialised even while holders delete the lock file;
    /// another netns's lock is never waited for.
    #[test]
    fn a_fifo_in_place_of_the_record_is_refused_without_blocking() {
        let t = interlock_testkit::tempdir().unwrap();
        let store = NetnsStore::new(t.path());
        let id = NetnsId { dev: 4, ino: 7 };
        let lock = store.lock(id).unwrap();
        nix::unistd::mkfifo(
            &store.dir().join(format!("{id}.json")),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        // A blocking open of a FIFO with no writer would hang here forever.
        let e = lock.load().unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }

    /// A verb that fails after taking the lock and before writing a record (or that only
    /// looked) leaves no lock file; one that wrote a record keeps both.
    #[test]
    fn a_lock_released_without_a_record_leaves_no_file() {
        let t = interlock_testkit::tempdir().unwrap();
        let store = NetnsStore::new(t.path());
        let id = NetnsId { dev: 4, ino: 11 };
        drop(store.lock(id).unwrap());
        assert_eq!(fs::read_dir(store.dir()).unwrap().count(), 0);
        let lock = store.lock(id).unwrap();
        lock.save(&record(id)).unwrap();
        drop(lock);
        let mut names: Vec<String> = fs::read_dir(store.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, [format!("{id}.json"), format!("{id}.lock")]);
        assert_eq!(store.sweep_orphan_locks().unwrap(), Vec::<PathBuf>::new());
        store.lock(id).unwrap().forget().unwrap();
        assert_eq!(fs::read_dir(store.dir()).unwrap().count(), 0);
    }

    /// The soak's leak: an agent SIGTERMed mid-repair died holding a netns lock, before
    /// writing its record, and the sandbox was deleted through a chain without interlock.
    /// The sweep removes such a file once its holder is gone, and never one a live
    /// process holds (here `flock(1)`, a process of its own, then SIGKILLed), nor one
    /// guarding a record.
    #[test]
    fn a_lock_left_by_a_dead_holder_is_swept_and_a_held_one_is_not() {
        let t = interlock_testkit::tempdir().unwrap();
        let store = NetnsStore::new(t.path());
        let orphan = NetnsId { dev: 4, ino: 21 };
        let recorded = NetnsId { dev: 4, ino: 22 };
        let mine = NetnsId { dev: 4, ino: 23 };
        let lock = store.lock(recorded).unwrap();
        lock.save(&record(recorded)).unwrap();
        drop(lock);
        let held_here = store.lock(mine).unwrap();

        let path = store.dir().join(format!("{orphan}.lock"));
        // The file first (as a locker's open makes it), so that flock(1) locks the file
        // the path names. In a process group of its own: `sleep` inherits the locked
        // descriptor, and the whole group dies below.
        File::create(&path).unwrap();
        let mut holder = std::process::Command::new("flock")
            .arg(&path)
            .args(["sleep", "60"])
            .process_group(0)
            .spawn()
            .expect("flock(1) from util-linux");
        let held_elsewhere = || {
            let f = File::open(&path).unwrap();
            Flock::lock(f, FlockArg::LockExclusiveNonblock).is_err()
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !held_elsewhere() {
            assert!(Instant::now() < deadline, "flock(1) never took the lock");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(store.sweep_orphan_locks().unwrap(), Vec::<PathBuf>::new());
        assert!(path.exists(), "a lock a live process holds stays");

        nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(holder.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        holder.wait().unwrap();
        assert!(path.exists(), "the dead holder left its lock file");
        // Its `sleep` may take a moment to die: sweep until the lock is free.
        let deadline = Instant::now() + Duration::from_secs(10);
        while store.sweep_orphan_locks().unwrap().is_empty() && path.exists() {
            assert!(Instant::now() < deadline, "the lock was never released");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!path.exists(), "swept once its holder was gone");
        assert_eq!(store.ids().unwrap(), [recorded, mine].into());
        assert!(store.dir().join(format!("{recorded}.lock")).exists());
        // The lock still held here was left alone, and is usable.
        assert!(store.dir().join(format!("{mine}.lock")).exists());
        held_here.save(&record(mine)).unwrap();
        drop(held_here);
        assert_eq!(
            store.lock(mine).unwrap().load().unwrap(),
            Some(record(mine))
        );
    }

    #[test]
    fn one_holder_per_netns_through_deletions() {
        let t = interlock_testkit::tempdir().unwrap();
        let store = Arc::new(NetnsStore::new(t.path()));
        let id = NetnsId { dev: 4, ino: 1 };
        let inside = Arc::new(AtomicU32::new(0));
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let (store, inside) = (store.clone(), inside.clone());
                std::thread::spawn(move || {
                    for _ in 0..20 {
                        let lock = store.lock(id).unwrap();
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                        std::thread::sleep(Duration::from_micros(200));
                        inside.fetch_sub(1, Ordering::SeqCst);
                        if i % 2 == 0 {
                            lock.forget().unwrap();
                        }
                    }
                })
            })
            .collect();
        // Meanwhile another netns's lock is free.
        let other = store.lock(NetnsId { dev: 4, ino: 2 }).unwrap();
        drop(other);
        for h in handles {
            h.join().unwrap();
        }
    }
}

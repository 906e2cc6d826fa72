//! The lock and record of one pod netns, the unit of protection
//! (`interlock_contract::state::NetnsRecord`): `<stateDir>/netns/<dev>-<ino>.json`,
//! changed only while holding `flock` on `<stateDir>/netns/<dev>-<ino>.lock`
//! ([`NetnsStore::lock`]). One lock per netns: work on different pods never waits.
//! The plugin takes it for ADD, DEL and GC; the agent takes it to repair a netns in place.
//!
//! Lock files are deleted with their record, while held; a locker that opened the file
//! before it was deleted notices (the path no longer names its file) and starts over.

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

/// The records and locks under `<stateDir>/netns`.
#[derive(Debug, Clone)]
pub struct NetnsStore {
    dir: PathBuf,
}

/// The exclusive lock on one netns's record; released when dropped.
#[derive(Debug)]
pub struct NetnsLock {
    id: NetnsId,
    lock_path: PathBuf,
    record_path: PathBuf,
    _flock: Flock<File>,
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
    /// the same netns; never one of another netns).
    pub fn lock(&self, id: NetnsId) -> io::Result<NetnsLock> {
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
                    open()
                }
                other => other,
            }
            .map_err(|e| {
                io::Error::new(e.kind(), format!("opening {}: {e}", lock_path.display()))
            })?;
            let held = Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, e)| {
                io::Error::new(
                    io::Error::from(e).kind(),
                    format!("locking {}: {e}", lock_path.display()),
                )
            })?;
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
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

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

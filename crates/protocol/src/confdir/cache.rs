//! A conf dir read incrementally: the same [`Snapshot`] as [`super::read_until`], but a
//! long-lived reader (the agent's guard) re-reads only what changed, so its cost per
//! wake does not grow with the number of files in the directory.
//!
//! Two ways a change becomes known:
//!
//! - **Named** ([`DirCache::changed`]): inotify names the entry (create, write, rename,
//!   chmod, delete). A named entry is stat'ed again and its content re-read on next use,
//!   whatever its metadata says — a same-size rewrite within one timestamp tick is
//!   therefore never missed when it was named.
//! - **Keyed** ([`DirCache::resync`], the periodic full resync, and after lost events):
//!   the directory is listed and every entry stat'ed; content is kept only while
//!   (device, inode, size, mtime, ctime, mode, uid) is unchanged. An atomic rename gives
//!   a new inode; an in-place write changes ctime. Since Linux 6.13 (multigrain
//!   timestamps on ext4, xfs, btrfs, tmpfs) a change made after the timestamps were last
//!   queried always gets a distinguishable ctime, even within one tick; on older kernels
//!   or other filesystems a same-size in-place rewrite within one tick, *not named* by
//!   inotify (written through a hard link elsewhere, or lost with a queue overflow), is
//!   seen one full resync later.
//!
//! Symbolic links are stat'ed on every read (inotify does not see their targets
//! change). Failed reads other than a refusal (not a regular file, over the cap) are
//! never kept. The listing and the content rules are the same as [`super::read_until`]'s;
//! the tests check that a cached read equals a fresh one after every kind of change.

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::{DirEntry, ParseMemo, Snapshot};
use crate::bounded;

/// What identifies one version of a file without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileKey {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    mode: u32,
    uid: u32,
}

impl FileKey {
    fn of(m: &fs::Metadata) -> FileKey {
        FileKey {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
            mode: m.mode(),
            uid: m.uid(),
        }
    }
}

/// What a read of one entry gave, kept while its key holds.
#[derive(Debug, Clone)]
enum Read {
    /// The content, and its parse once someone asks (shared with every snapshot entry
    /// made from this read).
    Content(Vec<u8>, ParseMemo),
    /// Refused by [`bounded`] (not regular, too large): the reason.
    Refused(String),
}

#[derive(Debug, Clone)]
struct Cached {
    /// The entry as listed (content fields empty).
    entry: DirEntry,
    /// Metadata of what the name resolves to, when it could be stat'ed.
    key: Option<FileKey>,
    /// The last read and the key of the file it read.
    read: Option<(FileKey, Read)>,
}

/// Counters of the work a [`DirCache`] did (for tests and the agent's metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheWork {
    /// Directory listings.
    pub listings: u64,
    /// Entries stat'ed.
    pub stats: u64,
    /// File contents read.
    pub reads: u64,
}

/// A conf dir model kept up to date from named changes (see the module docs).
#[derive(Debug)]
pub struct DirCache {
    dir: PathBuf,
    /// By name in the runtime's (bytewise) order; `None` until listed.
    entries: Option<BTreeMap<Vec<u8>, Cached>>,
    /// Names changed since the last read.
    dirty: HashSet<OsString>,
    /// List again on the next read (the keys decide what is re-read).
    relist: bool,
    work: CacheWork,
}

impl DirCache {
    /// A cache of `dir`; the first read lists it.
    pub fn new(dir: &Path) -> DirCache {
        DirCache {
            dir: dir.to_path_buf(),
            entries: None,
            dirty: HashSet::new(),
            relist: true,
            work: CacheWork::default(),
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The entry `name` changed (created, written, renamed, chmod'ed or removed): stat it
    /// again and re-read its content on the next read.
    pub fn changed(&mut self, name: impl Into<OsString>) {
        self.dirty.insert(name.into());
    }

    /// Changes may have been missed (the event queue overflowed, the watch was lost, the
    /// periodic resync): list the directory again and re-read what the keys say changed.
    pub fn resync(&mut self) {
        self.relist = true;
    }

    /// The work done so far.
    pub fn work(&self) -> CacheWork {
        self.work
    }

    /// [`super::read`] through the cache.
    pub fn read(&mut self) -> io::Result<Snapshot> {
        self.read_until(&|_| false, None)
    }

    /// [`super::read_until`] through the cache: the same snapshot, re-reading only
    /// entries named by [`DirCache::changed`], symbolic links, and (after
    /// [`DirCache::resync`]) entries whose key changed.
    pub fn read_until(
        &mut self,
        also_read: &dyn Fn(&str) -> bool,
        stop: Option<&dyn Fn(&DirEntry) -> bool>,
    ) -> io::Result<Snapshot> {
        if self.relist || self.entries.is_none() || !self.restat_dirty() {
            if let Err(e) = self.list() {
                self.entries = None;
                return Err(e);
            }
        }
        self.dirty.clear();
        let dir = self.dir.clone();
        let work = &mut self.work;
        let entries = self.entries.get_or_insert_with(BTreeMap::new);
        // Symlink targets change without an event here.
        for c in entries.values_mut().filter(|c| c.entry.is_symlink) {
            work.stats += 1;
            let meta = stat(&dir.join(&c.entry.os_name)).ok();
            let fresh = listed(c.entry.os_name.clone(), c.entry.is_dir, true, meta.as_ref());
            let read = c.read.take().filter(|(k, _)| Some(*k) == fresh.key);
            *c = Cached { read, ..fresh };
        }
        let mut out = Vec::with_capacity(entries.len());
        let mut stopped = false;
        for c in entries.values_mut() {
            let mut entry = c.entry.clone();
            let extra = entry.utf8_name() && also_read(&entry.name);
            let config = entry.is_config() && !stopped;
            if entry.is_dir || !(config || extra) {
                out.push(entry);
                continue;
            }
            if c.read.is_none() {
                work.reads += 1;
                match bounded::read_regular_with_meta(
                    &dir.join(&entry.os_name),
                    bounded::MAX_CONFIG_BYTES,
                ) {
                    Ok((content, meta)) => {
                        c.read = Some((
                            FileKey::of(&meta),
                            Read::Content(content, ParseMemo::default()),
                        ))
                    }
                    Err(err) if err.is_not_found() => {
                        // Left out of this snapshot as if never listed (a dangling
                        // symlink, or a file removed since): kept in the cache, so a read
                        // that does not read it still lists it, as a fresh one does. The
                        // stop rule still sees it, as in a fresh read.
                        if config && stop.is_some_and(|f| f(&entry)) {
                            stopped = true;
                        }
                        continue;
                    }
                    Err(err) => {
                        let refused = matches!(
                            err,
                            bounded::BoundedReadError::NotRegular { .. }
                                | bounded::BoundedReadError::TooLarge { .. }
                        );
                        match (refused, c.key) {
                            (true, Some(key)) => {
                                c.read = Some((key, Read::Refused(err.to_string())));
                            }
                            // Not kept: the next read tries again, as a fresh read would.
                            _ => {
                                entry.unreadable = Some(err.to_string());
                                entry.refused = refused;
                            }
                        }
                    }
                }
            }
            match &c.read {
                Some((_, Read::Content(content, memo))) => {
                    entry.content = Some(content.clone());
                    entry.memo = memo.clone();
                }
                Some((_, Read::Refused(why))) => {
                    entry.unreadable = Some(why.clone());
                    entry.refused = true;
                }
                None => {}
            }
            if config && stop.is_some_and(|f| f(&entry)) {
                stopped = true;
            }
            out.push(entry);
        }
        Ok(Snapshot { dir, entries: out })
    }

    /// Lists the directory, keeping what was read of entries whose key is unchanged.
    fn list(&mut self) -> io::Result<()> {
        self.work.listings += 1;
        let rd = fs::read_dir(&self.dir).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("reading CNI config directory {}: {e}", self.dir.display()),
            )
        })?;
        let mut old = self.entries.take().unwrap_or_default();
        let mut fresh = BTreeMap::new();
        for e in rd {
            let e = e?;
            let os_name = e.file_name();
            let Ok(t) = e.file_type() else { continue };
            self.work.stats += 1;
            let meta = stat(&e.path()).ok();
            let mut c = listed(os_name.clone(), t.is_dir(), t.is_symlink(), meta.as_ref());
            let key = os_name.as_bytes().to_vec();
            if let Some(prev) = old.remove(&key) {
                let same_kind = prev.entry.is_dir == c.entry.is_dir
                    && prev.entry.is_symlink == c.entry.is_symlink;
                if same_kind && !self.dirty.contains(&os_name) {
                    c.read = prev.read.filter(|(k, _)| Some(*k) == c.key);
                }
            }
            fresh.insert(key, c);
        }
        self.entries = Some(fresh);
        self.relist = false;
        Ok(())
    }

    /// Stats the named entries again and forgets what was read of them; false when one
    /// could not be stat'ed for another reason than being gone (list the directory).
    fn restat_dirty(&mut self) -> bool {
        let Some(entries) = self.entries.as_mut() else {
            return false;
        };
        // Not drained: if this gives up, the listing must still know what was named.
        for name in &self.dirty {
            let path = self.dir.join(name);
            let key = name.as_bytes().to_vec();
            self.work.stats += 1;
            let l = match fs::symlink_metadata(&path) {
                Ok(l) => l,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    entries.remove(&key);
                    continue;
                }
                // A listing shows it without a stat: let the listing decide.
                Err(_) => return false,
            };
            let t = l.file_type();
            let meta = if t.is_symlink() {
                stat(&path).ok()
            } else {
                Some(l)
            };
            let meta = meta.or_else(|| fs::symlink_metadata(&path).ok());
            entries.insert(
                key,
                listed(name.clone(), t.is_dir(), t.is_symlink(), meta.as_ref()),
            );
        }
        true
    }
}

/// Metadata of what `path` resolves to, else of the link itself (as [`super::read_until`]).
fn stat(path: &Path) -> io::Result<fs::Metadata> {
    fs::metadata(path).or_else(|_| fs::symlink_metadata(path))
}

fn listed(
    os_name: OsString,
    is_dir: bool,
    is_symlink: bool,
    meta: Option<&fs::Metadata>,
) -> Cached {
    Cached {
        entry: DirEntry {
            name: os_name.to_string_lossy().into_owned(),
            os_name,
            is_dir,
            is_symlink,
            content: None,
            unreadable: None,
            refused: false,
            mode: meta.map_or(0, |m| m.permissions().mode() & 0o7777),
            uid: meta.map_or(0, MetadataExt::uid),
            memo: Default::default(),
        },
        key: meta.map(FileKey::of),
        read: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::confdir::read_until;
    use std::os::unix::fs::symlink;

    fn conflist(name: &str) -> String {
        format!(r#"{{"cniVersion":"1.0.0","name":"{name}","plugins":[{{"type":"bridge"}}]}}"#)
    }

    /// The kernel gives a change made after a stat a distinguishable ctime even within
    /// one timestamp tick (multigrain timestamps, Linux 6.13, on ext4/xfs/btrfs/tmpfs).
    fn multigrain_kernel() -> bool {
        let r = nix::sys::utsname::uname().unwrap();
        let rel = r.release().to_string_lossy().into_owned();
        let mut it = rel
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|p| p.parse::<u32>().ok());
        (it.next().unwrap_or(0), it.next().unwrap_or(0)) >= (6, 13)
    }

    type Stop = fn(&DirEntry) -> bool;
    type Also = fn(&str) -> bool;

    /// The reads every check makes: plain, with extra names, and stopping at the first
    /// config file that parses (as the guard and containerd do).
    fn variants() -> Vec<(Also, Option<Stop>)> {
        vec![
            (|_| false, None),
            (|n| n.ends_with(".orig"), None),
            (|n| n.ends_with(".orig"), Some(|e| e.parse().is_ok())),
        ]
    }

    /// Three caches — told every name (as inotify does), told nothing but resync'ed
    /// (keyed), and told the names *and* resync'ed — must each equal a fresh read.
    struct Caches {
        named: DirCache,
        keyed: DirCache,
        both: DirCache,
    }

    impl Caches {
        fn check(&mut self, dir: &Path, names: &[&str], what: &str) {
            for n in names {
                self.named.changed(*n);
                self.both.changed(*n);
            }
            self.keyed.resync();
            self.both.resync();
            for (i, (also, stop)) in variants().into_iter().enumerate() {
                let stop = stop.map(|f| Box::new(f) as Box<dyn Fn(&DirEntry) -> bool>);
                let fresh = read_until(dir, &also, stop.as_deref()).unwrap();
                for (which, c) in [
                    ("named", &mut self.named),
                    ("keyed", &mut self.keyed),
                    ("both", &mut self.both),
                ] {
                    let got = c.read_until(&also, stop.as_deref()).unwrap();
                    assert_eq!(got, fresh, "{which} cache after {what} (read variant {i})");
                }
            }
        }
    }

    #[test]
    fn a_cached_read_equals_a_fresh_read_after_every_kind_of_change() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("net.d");
        fs::create_dir(&d).unwrap();
        let outside = t.path().join("target.conflist");
        fs::write(&outside, conflist("target")).unwrap();
        let w = |n: &str, c: &str| fs::write(d.join(n), c).unwrap();
        w("10-a.conflist", &conflist("a"));
        w(
            "20-b.conf",
            r#"{"cniVersion":"1.0.0","name":"b","type":"bridge"}"#,
        );
        w("30-c.json", &conflist("c"));
        w("notes.txt", "not a config");
        w("10-a.conflist.orig", "backup");
        fs::create_dir(d.join("40-dir.conflist")).unwrap();
        symlink(&outside, d.join("15-link.conflist")).unwrap();
        let mut c = Caches {
            named: DirCache::new(&d),
            keyed: DirCache::new(&d),
            both: DirCache::new(&d),
        };
        c.check(&d, &[], "the first read");

        w("05-new.conflist", "{ broken");
        c.check(
            &d,
            &["05-new.conflist"],
            "a create (a broken file that sorts first)",
        );

        // Same size, same second, most likely the same timestamp tick.
        let a = fs::read(d.join("10-a.conflist")).unwrap();
        w("10-a.conflist", &conflist("A"));
        assert_eq!(
            a.len(),
            fs::metadata(d.join("10-a.conflist")).unwrap().len() as usize
        );
        if multigrain_kernel() {
            c.check(&d, &["10-a.conflist"], "a same-size rewrite in place");
        } else {
            // Only the name tells: the keyed cache may keep the old content until a
            // change of key.
            c.keyed = DirCache::new(&d);
            c.check(&d, &["10-a.conflist"], "a same-size rewrite in place");
        }

        // An installer's atomic write: a temp file renamed over the name.
        w(".tmp-x", &conflist("renamed"));
        fs::rename(d.join(".tmp-x"), d.join("05-new.conflist")).unwrap();
        c.check(&d, &[".tmp-x", "05-new.conflist"], "a rename over a file");

        fs::set_permissions(d.join("20-b.conf"), fs::Permissions::from_mode(0o600)).unwrap();
        c.check(&d, &["20-b.conf"], "a chmod");

        fs::write(&outside, conflist("TARGET")).unwrap();
        c.check(
            &d,
            &[],
            "a change of a symlink's target (no event in the dir)",
        );
        fs::remove_file(&outside).unwrap();
        c.check(&d, &[], "a symlink's target removed");

        fs::remove_file(d.join("05-new.conflist")).unwrap();
        c.check(&d, &["05-new.conflist"], "a delete");

        fs::remove_file(d.join("30-c.json")).unwrap();
        fs::create_dir(d.join("30-c.json")).unwrap();
        c.check(&d, &["30-c.json"], "a file replaced by a directory");

        fs::remove_file(d.join("20-b.conf")).unwrap();
        nix::unistd::mkfifo(
            &d.join("20-b.conf"),
            nix::sys::stat::Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        c.check(&d, &["20-b.conf"], "a file replaced by a FIFO");

        fs::File::options()
            .write(true)
            .open(d.join("10-a.conflist"))
            .unwrap()
            .set_len(bounded::MAX_CONFIG_BYTES + 1)
            .unwrap();
        c.check(&d, &["10-a.conflist"], "a file grown over the cap");
        w("10-a.conflist", &conflist("small again"));
        c.check(&d, &["10-a.conflist"], "a file shrunk under the cap");

        w("10-a.conflist.orig", "backup 2");
        c.check(
            &d,
            &["10-a.conflist.orig"],
            "an extra (non-config) file rewritten",
        );

        fs::remove_dir(d.join("30-c.json")).unwrap();
        c.check(&d, &["30-c.json"], "a directory removed");
    }

    #[test]
    fn a_named_change_rereads_only_that_file() {
        let t = tempfile::tempdir().unwrap();
        for i in 0..200 {
            fs::write(t.path().join(format!("50-f{i:03}.conflist")), conflist("f")).unwrap();
        }
        let mut c = DirCache::new(t.path());
        c.read().unwrap();
        assert_eq!(
            c.work(),
            CacheWork {
                listings: 1,
                stats: 200,
                reads: 200
            }
        );
        fs::write(t.path().join("50-f007.conflist"), conflist("g")).unwrap();
        c.changed("50-f007.conflist");
        let s = c.read().unwrap();
        assert_eq!(
            s.get("50-f007.conflist").unwrap().content,
            Some(conflist("g").into_bytes())
        );
        assert_eq!(
            c.work(),
            CacheWork {
                listings: 1,
                stats: 201,
                reads: 201
            },
            "one stat and one read for one named change"
        );
        // A resync lists and stats everything but reads nothing unchanged.
        c.resync();
        c.read().unwrap();
        assert_eq!(
            c.work(),
            CacheWork {
                listings: 2,
                stats: 401,
                reads: 201
            }
        );
        assert_eq!(
            c.read().unwrap(),
            read_until(t.path(), &|_| false, None).unwrap()
        );
    }

    #[test]
    fn a_missing_directory_is_an_error_until_it_is_back() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("net.d");
        let mut c = DirCache::new(&d);
        assert_eq!(c.read().unwrap_err().kind(), io::ErrorKind::NotFound);
        fs::create_dir(&d).unwrap();
        fs::write(d.join("a.conflist"), conflist("a")).unwrap();
        assert_eq!(c.read().unwrap(), read_until(&d, &|_| false, None).unwrap());
    }
}

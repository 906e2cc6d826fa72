//! A conf dir read incrementally: the same [`Snapshot`] as [`crate::read_until`], kept
//! between reads and updated in place, so that a long-lived reader (the agent's guard)
//! pays per wake for what changed, not for the number of files in the directory: no
//! entry is copied, stat'ed or read again unless it changed.
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
//! never kept. Which entries carry content follows [`crate::read_until`]'s rules on
//! every read: what sorts after the stop is held back (kept, not shown) and shown again
//! when the stop moves past it. The tests check that a cached read equals a fresh one
//! after every kind of change.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use interlock_contract::bounded;

use crate::{ConfigOrder, DirEntry, ParseMemo, Snapshot};

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

/// What a read of one entry gave, kept while the key it was read under holds.
#[derive(Debug)]
enum Kept {
    /// The content (and its parse memo) is in the snapshot's entry.
    Shown,
    /// Read, but held back from the snapshot (it sorts after the stop).
    Held(Vec<u8>, ParseMemo),
    /// Refused by [`bounded`] (not regular, too large): the reason.
    Refused(String),
}

/// The cache's side of one snapshot entry (same index).
#[derive(Debug)]
struct Slot {
    /// Metadata of what the name resolves to, when it could be stat'ed.
    key: Option<FileKey>,
    /// The last read and the key of the file it read.
    kept: Option<(FileKey, Kept)>,
    /// The entry is a config file (fixed by its name and kind).
    config: bool,
    /// The reader wants its content wherever it sorts (fixed by its name).
    extra: bool,
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
#[derive(Debug, Default)]
pub struct DirCache {
    dir: PathBuf,
    /// Which names' content is read wherever they sort ([`crate::read_until`]'s
    /// `also_read`; a property of the name, so it is fixed for the cache's life).
    also_read: Option<fn(&str) -> bool>,
    /// The directory as last read: entries in the runtime's (bytewise) order.
    snap: Snapshot,
    /// One per `snap.entries`, same order.
    slots: Vec<Slot>,
    /// The directory has been listed (since the last failure).
    listed: bool,
    /// Names changed since the last read.
    dirty: HashSet<OsString>,
    /// List again on the next read (the keys decide what is re-read).
    relist: bool,
    /// Entries whose content may not follow the rules yet: every one after a listing
    /// (`all`), else those (re)stat'ed since the last read.
    unsettled: Unsettled,
    /// After a read, every entry from this index on sorts after the stop (its content is
    /// shown only when it is an extra); `entries.len()` when nothing stopped.
    after_stop: usize,
    /// Symbolic links among the entries (stat'ed on every read).
    symlinks: usize,
    /// What the entries named since the last read held before (name, content, parse),
    /// until this read: one read back with the same content keeps its parse (our own
    /// write, read back after its event; a writer that rewrites the same bytes).
    prior: Vec<(OsString, Vec<u8>, ParseMemo)>,
    work: CacheWork,
}

/// See [`DirCache::unsettled`].
#[derive(Debug, Default)]
struct Unsettled {
    all: bool,
    names: HashSet<OsString>,
}

impl DirCache {
    /// A cache of `dir`; the first read lists it.
    pub fn new(dir: &Path) -> DirCache {
        DirCache::reading_also(dir, |_| false)
    }

    /// A cache of `dir` that also reads the content of entries for which
    /// `also_read(name)` is true, wherever they sort ([`crate::read_with`]).
    pub fn reading_also(dir: &Path, also_read: fn(&str) -> bool) -> DirCache {
        DirCache {
            dir: dir.to_path_buf(),
            also_read: Some(also_read),
            snap: Snapshot {
                dir: dir.to_path_buf(),
                entries: vec![],
                order: ConfigOrder::fresh(),
            },
            relist: true,
            ..DirCache::default()
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

    /// [`crate::read_with`] through the cache.
    pub fn read(&mut self) -> io::Result<&Snapshot> {
        self.read_until(None)
    }

    /// [`crate::read_until`] through the cache (with the `also_read` it was made with):
    /// the same snapshot, re-reading only entries named by [`DirCache::changed`],
    /// symbolic links, and (after [`DirCache::resync`]) entries whose key changed. The
    /// work beyond that is the entries up to the one `stop` stops at and those whose
    /// side of the stop changed: with the stop early, a read costs the same in a
    /// directory of 1,000 files as in one of two.
    pub fn read_until(
        &mut self,
        stop: Option<&dyn Fn(&DirEntry) -> bool>,
    ) -> io::Result<&Snapshot> {
        if self.relist || !self.listed || !self.restat_dirty() {
            if let Err(e) = self.list() {
                self.snap.entries.clear();
                self.snap.order = ConfigOrder::fresh();
                self.slots.clear();
                (self.listed, self.after_stop, self.symlinks) = (false, 0, 0);
                self.prior.clear();
                return Err(e);
            }
        }
        self.dirty.clear();
        self.restat_symlinks();
        self.settle(stop);
        self.prior.clear();
        Ok(&self.snap)
    }

    fn position(&self, name: &[u8]) -> Result<usize, usize> {
        self.snap
            .entries
            .binary_search_by(|e| e.os_name.as_bytes().cmp(name))
    }

    fn is_extra(&self, e: &DirEntry) -> bool {
        e.utf8_name() && self.also_read.is_some_and(|f| f(&e.name))
    }

    /// An entry as listed, nothing read.
    fn listed(
        &self,
        os_name: OsString,
        is_dir: bool,
        is_symlink: bool,
        meta: Option<&fs::Metadata>,
    ) -> (DirEntry, Slot) {
        let entry = DirEntry {
            name: os_name.to_string_lossy().into_owned(),
            os_name,
            is_dir,
            is_symlink,
            content: None,
            unreadable: None,
            refused: false,
            mode: meta.map_or(0, |m| m.permissions().mode() & 0o7777),
            uid: meta.map_or(0, MetadataExt::uid),
            memo: ParseMemo::default(),
        };
        let slot = Slot {
            key: meta.map(FileKey::of),
            kept: None,
            config: entry.is_config(),
            extra: self.is_extra(&entry),
        };
        (entry, slot)
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
        let mut fresh = vec![];
        for e in rd {
            let e = e?;
            let os_name = e.file_name();
            let Ok(t) = e.file_type() else { continue };
            self.work.stats += 1;
            let meta = stat(&e.path()).ok();
            fresh.push(self.listed(os_name, t.is_dir(), t.is_symlink(), meta.as_ref()));
        }
        fresh.sort_by(|a, b| a.0.os_name.as_bytes().cmp(b.0.os_name.as_bytes()));
        let old_entries = std::mem::take(&mut self.snap.entries);
        let old_slots = std::mem::take(&mut self.slots);
        let mut old = old_entries.into_iter().zip(old_slots).peekable();
        for (entry, slot) in fresh.iter_mut() {
            let name = entry.os_name.as_bytes();
            while old.next_if(|(o, _)| o.os_name.as_bytes() < name).is_some() {}
            let Some((mut prev, prev_slot)) = old.next_if(|(o, _)| o.os_name.as_bytes() == name)
            else {
                continue;
            };
            let same_kind = prev.is_dir == entry.is_dir && prev.is_symlink == entry.is_symlink;
            if same_kind && !self.dirty.contains(&entry.os_name) {
                slot.kept = held(&mut prev, prev_slot.kept).filter(|(k, _)| Some(*k) == slot.key);
            }
        }
        (self.snap.entries, self.slots) = fresh.into_iter().unzip();
        self.snap.order = ConfigOrder::fresh();
        self.symlinks = self.snap.entries.iter().filter(|e| e.is_symlink).count();
        self.unsettled.all = true;
        self.listed = true;
        self.relist = false;
        Ok(())
    }

    fn insert_at(&mut self, i: usize, entry: DirEntry, slot: Slot) {
        self.snap.order = ConfigOrder::fresh();
        self.symlinks += usize::from(entry.is_symlink);
        if i < self.after_stop {
            self.after_stop += 1;
        }
        self.snap.entries.insert(i, entry);
        self.slots.insert(i, slot);
    }

    fn remove_at(&mut self, i: usize) -> DirEntry {
        self.snap.order = ConfigOrder::fresh();
        let e = self.snap.entries.remove(i);
        self.slots.remove(i);
        self.symlinks -= usize::from(e.is_symlink);
        if i < self.after_stop {
            self.after_stop -= 1;
        }
        e
    }

    /// Stats the named entries again and forgets what was read of them; false when one
    /// could not be stat'ed for another reason than being gone (list the directory).
    fn restat_dirty(&mut self) -> bool {
        // Not drained: if this gives up, the listing must still know what was named.
        let names: Vec<OsString> = self.dirty.iter().cloned().collect();
        for name in names {
            let path = self.dir.join(&name);
            self.work.stats += 1;
            let at = self.position(name.as_bytes());
            let l = match fs::symlink_metadata(&path) {
                Ok(l) => l,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    if let Ok(i) = at {
                        self.remove_at(i);
                    }
                    continue;
                }
                // A listing shows it without a stat: let the listing decide.
                Err(_) => return false,
            };
            let t = l.file_type();
            let meta = if t.is_symlink() {
                stat(&path).ok().or(Some(l))
            } else {
                Some(l)
            };
            let (entry, slot) =
                self.listed(name.clone(), t.is_dir(), t.is_symlink(), meta.as_ref());
            match at {
                Ok(i) => {
                    // Same name: a config file still, unless it became a directory
                    // or stopped being one.
                    let old = &self.snap.entries[i];
                    if old.is_dir != entry.is_dir {
                        self.snap.order = ConfigOrder::fresh();
                    }
                    self.symlinks =
                        self.symlinks + usize::from(entry.is_symlink) - usize::from(old.is_symlink);
                    let mut old = std::mem::replace(&mut self.snap.entries[i], entry);
                    let old_slot = std::mem::replace(&mut self.slots[i], slot);
                    // Its last content and parse, in case it reads the same again.
                    if let Some((_, Kept::Held(content, memo))) = held(&mut old, old_slot.kept) {
                        self.prior.push((name.clone(), content, memo));
                    }
                }
                Err(i) => self.insert_at(i, entry, slot),
            }
            self.unsettled.names.insert(name);
        }
        true
    }

    /// Symlink targets change without an event here: stat them again, and forget what
    /// was read through a link whose target's key changed.
    fn restat_symlinks(&mut self) {
        if self.symlinks == 0 {
            return;
        }
        for (entry, slot) in self.snap.entries.iter_mut().zip(self.slots.iter_mut()) {
            if !entry.is_symlink {
                continue;
            }
            self.work.stats += 1;
            let meta = stat(&self.dir.join(&entry.os_name)).ok();
            slot.key = meta.as_ref().map(FileKey::of);
            entry.mode = meta.as_ref().map_or(0, |m| m.permissions().mode() & 0o7777);
            entry.uid = meta.as_ref().map_or(0, MetadataExt::uid);
            slot.kept = held(entry, slot.kept.take()).filter(|(k, _)| Some(*k) == slot.key);
            self.unsettled.names.insert(entry.os_name.clone());
        }
    }

    /// Shows the content of the entries `read_until`'s rules read (reading those not
    /// read yet) and holds back the others'. Visits the entries up to the stop, those
    /// between the previous stop and this one, and the unsettled ones: every other entry
    /// is where it was, on the same side of the stop, as it was left.
    fn settle(&mut self, stop: Option<&dyn Fn(&DirEntry) -> bool>) {
        let n = self.snap.entries.len();
        let all = std::mem::take(&mut self.unsettled.all);
        let names = std::mem::take(&mut self.unsettled.names);
        let mut gone = vec![];
        // Up to the stop: every entry (the stop rule may answer differently now, e.g.
        // once a plugin binary appears).
        let mut end = n;
        let mut walked = 0;
        if let Some(stop) = stop {
            for i in 0..n {
                walked = i + 1;
                if self.settle_one(i, true, &mut gone) && stop(&self.snap.entries[i]) {
                    end = i + 1;
                    break;
                }
            }
        }
        let mut visit: Vec<usize> = if all {
            (walked..n).collect()
        } else {
            let (lo, hi) = (end.min(self.after_stop), end.max(self.after_stop));
            let mut v: Vec<usize> = (lo.max(walked)..hi.min(n)).collect();
            v.extend(
                names
                    .iter()
                    .filter_map(|name| self.position(name.as_bytes()).ok())
                    .filter(|&i| i >= walked),
            );
            v.sort_unstable();
            v.dedup();
            v
        };
        for i in visit.drain(..) {
            self.settle_one(i, i < end, &mut gone);
        }
        self.after_stop = end;
        for i in gone.into_iter().rev() {
            let e = self.remove_at(i);
            // Named again, so that the next read finds it if it is still listed.
            self.dirty.insert(e.os_name);
        }
    }

    /// Makes entry `i` follow the rules (`before_stop`: a config file there is read);
    /// true when it is a config file the stop rule is to be asked about. An entry that
    /// is gone when read goes to `gone`.
    fn settle_one(&mut self, i: usize, before_stop: bool, gone: &mut Vec<usize>) -> bool {
        let (entry, slot) = (&mut self.snap.entries[i], &mut self.slots[i]);
        let config = slot.config && before_stop;
        if entry.is_dir || !(config || slot.extra) {
            slot.kept = held(entry, slot.kept.take());
            return false;
        }
        match slot.kept.take() {
            Some((k, Kept::Held(content, memo))) => {
                entry.content = Some(content);
                entry.memo = memo;
                slot.kept = Some((k, Kept::Shown));
            }
            Some((k, Kept::Refused(why))) => {
                entry.unreadable = Some(why.clone());
                entry.refused = true;
                slot.kept = Some((k, Kept::Refused(why)));
            }
            Some(shown) => slot.kept = Some(shown),
            None => {
                self.work.reads += 1;
                let path = self.dir.join(&entry.os_name);
                (entry.unreadable, entry.refused) = (None, false);
                match bounded::read_regular_with_meta(&path, bounded::MAX_CONFIG_BYTES) {
                    Ok((content, meta)) => {
                        // The same bytes as before its change keep their parse.
                        entry.memo = match self
                            .prior
                            .iter()
                            .position(|(n, c, _)| *n == entry.os_name && *c == content)
                        {
                            Some(at) => self.prior.swap_remove(at).2,
                            None => ParseMemo::default(),
                        };
                        entry.content = Some(content);
                        slot.kept = Some((FileKey::of(&meta), Kept::Shown));
                    }
                    // Left out of this snapshot as if never listed (a dangling symlink,
                    // or a file removed since), as in a fresh read. The stop rule still
                    // sees it, as in a fresh read.
                    Err(err) if err.is_not_found() => gone.push(i),
                    Err(err) => {
                        let refused = matches!(
                            err,
                            bounded::BoundedReadError::NotRegular { .. }
                                | bounded::BoundedReadError::TooLarge { .. }
                        );
                        entry.unreadable = Some(err.to_string());
                        entry.refused = refused;
                        // Not kept unless refused: the next read tries again, as a fresh
                        // read would.
                        match (refused, slot.key) {
                            (true, Some(key)) => {
                                slot.kept = Some((key, Kept::Refused(err.to_string())));
                            }
                            _ => {
                                self.unsettled.names.insert(entry.os_name.clone());
                            }
                        }
                    }
                }
            }
        }
        config
    }
}

/// Takes back into the cache what `entry` shows of `kept` (its content and parse), and
/// clears what a read left in it: the entry is then as listed, nothing read.
fn held(entry: &mut DirEntry, kept: Option<(FileKey, Kept)>) -> Option<(FileKey, Kept)> {
    entry.unreadable = None;
    entry.refused = false;
    let content = entry.content.take();
    match kept? {
        // The memo goes with the content (a fresh one costs an allocation: only here).
        (k, Kept::Shown) => content.map(|c| (k, Kept::Held(c, std::mem::take(&mut entry.memo)))),
        other => Some(other),
    }
}

/// Metadata of what `path` resolves to, else of the link itself (as [`crate::read_until`]).
fn stat(path: &Path) -> io::Result<fs::Metadata> {
    fs::metadata(path).or_else(|_| fs::symlink_metadata(path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read_until;
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

    /// The config files in the runtime's order, as the judgement sees them.
    fn cand_names(s: &Snapshot) -> Vec<String> {
        s.candidates()
            .iter()
            .map(|c| c.name().to_string())
            .collect()
    }

    type Stop = fn(&DirEntry) -> bool;
    type Also = fn(&str) -> bool;

    /// The reads every check makes: plain; with extra names, first without a stop, then
    /// stopping at the first config file that parses (as the guard and containerd do),
    /// then without again (held-back content shown again) — each in its own caches,
    /// since a cache's `also_read` is fixed.
    fn variants() -> Vec<(Also, Vec<Option<Stop>>)> {
        vec![
            (|_| false, vec![None]),
            (
                |n| n.ends_with(".orig"),
                vec![None, Some(|e| e.parse().is_ok()), None],
            ),
        ]
    }

    /// The named, keyed and both caches of one variant.
    type Three = [(&'static str, DirCache); 3];

    /// Per variant, three caches — told every name (as inotify does), told nothing but
    /// resync'ed (keyed), and told the names *and* resync'ed — must each equal a fresh
    /// read.
    struct Caches {
        sets: Vec<(Also, Vec<Option<Stop>>, Three)>,
    }

    impl Caches {
        fn new(dir: &Path) -> Caches {
            Caches {
                sets: variants()
                    .into_iter()
                    .map(|(also, stops)| {
                        let c = || DirCache::reading_also(dir, also);
                        (also, stops, [("named", c()), ("keyed", c()), ("both", c())])
                    })
                    .collect(),
            }
        }

        /// A fresh keyed cache (it may have missed an unnamed change).
        fn forget_keyed(&mut self, dir: &Path) {
            for (also, _, caches) in &mut self.sets {
                caches[1].1 = DirCache::reading_also(dir, *also);
            }
        }

        fn check(&mut self, dir: &Path, names: &[&str], what: &str) {
            for (also, stops, caches) in &mut self.sets {
                for (which, c) in caches.iter_mut() {
                    if *which != "keyed" {
                        names.iter().for_each(|n| c.changed(*n));
                    }
                    if *which != "named" {
                        c.resync();
                    }
                }
                for (i, stop) in stops.iter().enumerate() {
                    let stop = stop.map(|f| Box::new(f) as Box<dyn Fn(&DirEntry) -> bool>);
                    let fresh = read_until(dir, &*also, stop.as_deref()).unwrap();
                    for (which, c) in caches.iter_mut() {
                        let got = c.read_until(stop.as_deref()).unwrap();
                        assert_eq!(*got, fresh, "{which} cache after {what} (read {i})");
                        assert_eq!(
                            cand_names(got),
                            cand_names(&fresh),
                            "{which} cache's candidates after {what} (read {i})"
                        );
                    }
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
        let mut c = Caches::new(&d);
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
            c.forget_keyed(&d);
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
            *c.read().unwrap(),
            read_until(t.path(), &|_| false, None).unwrap()
        );
    }

    /// The parse memo an entry carries (the same `Arc` when the parse was kept).
    fn memo_of(s: &Snapshot, name: &str) -> std::sync::Arc<std::sync::OnceLock<crate::ParseOf>> {
        s.get(name).unwrap().memo.0.clone()
    }

    #[test]
    fn a_file_read_back_with_the_same_bytes_keeps_its_parse() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        let p = d.join("10-a.conflist");
        fs::write(&p, conflist("a")).unwrap();
        let mut c = DirCache::new(d);
        let before = memo_of(c.read().unwrap(), "10-a.conflist");
        assert!(c
            .read()
            .unwrap()
            .get("10-a.conflist")
            .unwrap()
            .parsed()
            .unwrap()
            .is_ok());
        // Rewritten with the same bytes (a new inode, as an atomic writer makes).
        fs::write(d.join(".tmp"), conflist("a")).unwrap();
        fs::rename(d.join(".tmp"), &p).unwrap();
        c.changed("10-a.conflist");
        c.changed(".tmp");
        let s = c.read().unwrap();
        assert!(
            std::sync::Arc::ptr_eq(&before, &memo_of(s, "10-a.conflist")),
            "the same bytes were parsed again"
        );
        assert_eq!(*s, read_until(d, &|_| false, None).unwrap());
        assert_eq!(c.work().reads, 2, "named, so read again");
        // Other bytes: a parse of its own, of the new content.
        fs::write(&p, conflist("b")).unwrap();
        c.changed("10-a.conflist");
        let s = c.read().unwrap();
        assert!(!std::sync::Arc::ptr_eq(
            &before,
            &memo_of(s, "10-a.conflist")
        ));
        let parsed = s.get("10-a.conflist").unwrap().parsed().unwrap().clone();
        assert_eq!(parsed.unwrap().list.name(), "b");
    }

    #[test]
    fn content_held_back_by_the_stop_is_shown_again_without_a_read() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        fs::write(d.join("10-primary.conflist"), conflist("p")).unwrap();
        for i in 0..50 {
            fs::write(d.join(format!("50-f{i:03}.conflist")), conflist("f")).unwrap();
        }
        let parses = |e: &DirEntry| e.parse().is_ok();
        let fresh =
            |stop: Option<&dyn Fn(&DirEntry) -> bool>| read_until(d, &|_| false, stop).unwrap();
        let mut c = DirCache::new(d);
        assert_eq!(*c.read_until(Some(&parses)).unwrap(), fresh(Some(&parses)));
        assert_eq!(c.work().reads, 1, "only the primary is read");
        assert_eq!(*c.read().unwrap(), fresh(None));
        assert_eq!(c.work().reads, 51);
        assert_eq!(*c.read_until(Some(&parses)).unwrap(), fresh(Some(&parses)));
        assert_eq!(*c.read().unwrap(), fresh(None));
        assert_eq!(
            c.work().reads,
            51,
            "held-back content is shown again, not read"
        );
        // The primary breaks: the stop moves to the next file, which was read before.
        fs::write(d.join("10-primary.conflist"), "{").unwrap();
        c.changed("10-primary.conflist");
        assert_eq!(*c.read_until(Some(&parses)).unwrap(), fresh(Some(&parses)));
        assert_eq!(c.work().reads, 52, "one read: the file named");
        assert_eq!(c.work().listings, 1);
    }

    #[derive(Debug, Clone, Copy)]
    enum Op {
        Valid,
        Broken,
        Remove,
        Mkdir,
        Link,
        Chmod,
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

        /// Any sequence of changes, each named as inotify names it, read with the stop
        /// rule changing from read to read: the cache always equals a fresh read.
        #[test]
        fn any_named_changes_under_any_stops_equal_a_fresh_read(
            steps in proptest::collection::vec(
                (0usize..7, proptest::sample::select(vec![
                    Op::Valid, Op::Broken, Op::Remove, Op::Mkdir, Op::Link, Op::Chmod,
                ]), 0usize..3),
                1..30,
            )
        ) {
            const NAMES: [&str; 7] = [
                "05-a.conflist", "10-b.conflist", "20-c.conf", "30-d.json",
                "40-e.conflist.orig", "50-f.conflist", "notes.txt",
            ];
            let stops: [Option<Stop>; 3] = [None, Some(|e| e.parse().is_ok()), Some(|_| true)];
            let t = tempfile::tempdir().unwrap();
            let d = t.path().join("net.d");
            fs::create_dir(&d).unwrap();
            let target = t.path().join("target.conflist");
            fs::write(&target, conflist("target")).unwrap();
            let also: Also = |n| n.ends_with(".orig");
            let mut named = DirCache::reading_also(&d, also);
            for (n, op, stop) in steps {
                let p = d.join(NAMES[n]);
                let clear = |p: &Path| {
                    let _ = fs::remove_dir(p);
                    let _ = fs::remove_file(p);
                };
                match op {
                    Op::Valid => {
                        clear(&p);
                        fs::write(&p, conflist(NAMES[n])).unwrap();
                    }
                    Op::Broken => {
                        clear(&p);
                        fs::write(&p, "{").unwrap();
                    }
                    Op::Remove => clear(&p),
                    Op::Mkdir => {
                        clear(&p);
                        fs::create_dir(&p).unwrap();
                    }
                    Op::Link => {
                        clear(&p);
                        symlink(&target, &p).unwrap();
                    }
                    Op::Chmod => {
                        let _ = fs::set_permissions(&p, fs::Permissions::from_mode(0o600));
                    }
                }
                named.changed(NAMES[n]);
                let stop = stops[stop].map(|f| Box::new(f) as Box<dyn Fn(&DirEntry) -> bool>);
                let fresh = read_until(&d, &also, stop.as_deref()).unwrap();
                let got = named.read_until(stop.as_deref()).unwrap();
                proptest::prop_assert_eq!(got, &fresh, "after {:?} of {}", op, NAMES[n]);
                proptest::prop_assert_eq!(cand_names(got), cand_names(&fresh));
                // A parse kept from before a change is the parse of what is there now.
                for (a, b) in got.entries.iter().zip(&fresh.entries) {
                    proptest::prop_assert_eq!(a.parsed(), b.parsed(), "{}", b.name);
                }
            }
        }
    }

    #[test]
    fn a_missing_directory_is_an_error_until_it_is_back() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("net.d");
        let mut c = DirCache::new(&d);
        assert_eq!(c.read().unwrap_err().kind(), io::ErrorKind::NotFound);
        fs::create_dir(&d).unwrap();
        fs::write(d.join("a.conflist"), conflist("a")).unwrap();
        assert_eq!(
            *c.read().unwrap(),
            read_until(&d, &|_| false, None).unwrap()
        );
    }
}

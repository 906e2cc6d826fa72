//! The config guard, the agent's loop that keeps interlock's entry in the config the
//! runtime loads and the plugin binary in its bin dirs ([`install`]).
//!
//! This file is its thin layer: reads the conf dir, asks [`plan`] what to do, does it
//! with atomic writes ([`contested_write`] for a file another writer also writes), and keeps
//! readiness and the STATUS marker ([`marker`]) truthful. The decisions are beside it
//! and pure: what to write ([`plan`]), which changes are conflicts and when to back off
//! ([`conflict`]), whether the node is ready ([`readiness`]); which file the runtime
//! loads is `interlock_confdir`.
//!
//! Nothing in the directory can stall it: reads are of regular files only, bounded
//! (`interlock_contract::bounded`), and stop at the primary in owned mode; plugin VERSION
//! questions are asked off this thread ([`VersionCache`]) and waited for at most
//! [`VERSION_WAIT`]. Every completed pass of the loop calls `Shared::tick()`.
//!
//! One dedicated thread runs [`Guard::run`]; an inotify thread wakes it whenever anything
//! in the conf dir or a bin dir changes, and a timer drives the periodic resync, the marker
//! heartbeat, retries and the end of back-offs. Our own writes wake it too; that
//! reconcile finds nothing to do, so there is no repair loop.
//!
//! The conf dir is read through a [`confdir::DirCache`], whose snapshot lives between
//! wakes and is updated in place: inotify names what changed and only that is stat'ed
//! and read again, and nothing is copied, so a wake costs the same with 1,000 foreign
//! files sorting after the primary as with two; the periodic resync (and a lost event)
//! lists the directory again and re-reads what changed by (inode, size, mtime, ctime).

pub mod conflict;
pub mod contested_write;
pub mod guarded;
pub mod install;
pub mod learn;
pub mod marker;
pub mod plan;
pub mod readiness;

use crate::health::shared::{FileConflict, Readiness, Shared};
use crate::AgentConfig;
use conflict::{conflicting_files, guard_conflicting_files, ConflictTracker, Verdict};
use contested_write::{replace_checked, Replaced};
use install::{PluginInstaller, VersionCache, PLUGIN_FILE};
use interlock_confdir::{self as confdir, Binaries, DirCache, Snapshot};
use interlock_contract::atomic::{syncs_in, write_temp};
use interlock_contract::marker::ConfigFight;
use interlock_contract::shown::shown;
use marker::Marker;
use plan::{Action, Facts, Settings, BACKUP_SUFFIX};
use std::collections::{BTreeSet, HashMap};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, error, info, warn};

/// How long one reconcile waits for plugin VERSION answers it does not have cached yet.
/// A plugin slower than this is answered in the background (and killed after
/// [`interlock_libcni::exec::VERSION_TIMEOUT`]); the repair goes ahead without it.
pub const VERSION_WAIT: Duration = Duration::from_millis(100);

/// Default of how long the guard waits for the primary's first config before it says
/// where else the runtime may read its configs from.
pub const PRIMARY_WAIT_HINT: Duration = Duration::from_secs(60);

/// Why the conf dir of `cfg` looks like one no runtime reads, from the runtime's own
/// config files (`interlock_confdir::runtime_config`); `None` when one of them reads it or
/// none is visible.
pub fn conf_dir_unread(cfg: &AgentConfig) -> Option<String> {
    use confdir::runtime_config;
    let configs = cfg
        .runtime_configs
        .clone()
        .unwrap_or_else(|| runtime_config::default_configs(cfg.runtime));
    let mut found = vec![];
    for r in runtime_config::read(cfg.runtime, &configs) {
        match r {
            Ok(f) => found.push(f),
            Err(e) => warn!("cannot tell which CNI conf dir the runtime reads: {e}"),
        }
    }
    runtime_config::unread(&cfg.conf_dir, &found)
}

/// What changed in the conf dir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfChange {
    /// These entries (as inotify named them).
    Names(Vec<OsString>),
    /// Unknown (events were lost, or the directory itself changed): list it again.
    Unknown,
}

/// Messages to the guard thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wake {
    /// Something in the conf dir changed.
    Conf(ConfChange),
    /// Something in a bin dir changed.
    Bin,
    /// Stop the loop.
    Stop,
}

/// Reads the conf dir ([`confdir::read`]: bounded reads of regular files only) with the
/// content of our backups too.
pub fn snapshot(dir: &Path) -> std::io::Result<Snapshot> {
    confdir::read_with(dir, &|n| n.ends_with(BACKUP_SUFFIX))
}

/// Entries whose content the guard reads wherever they sort: our backups and files named
/// like ours.
fn reads_also(name: &str) -> bool {
    name.ends_with(BACKUP_SUFFIX) || plan::is_owned_name(name)
}

/// Where the guard stops reading config files in the runtime's order: in owned mode at
/// the primary (the first foreign `.conflist` the runtime could use, not a meta plugin's)
/// — no decision of the guard looks past it. Chain mode, and a `.conf` primary (which may
/// be wrapped into the `.conflist` sorting after it), read them all (`None`).
fn stop_rule(cfg: &AgentConfig) -> Option<impl Fn(&confdir::DirEntry) -> bool + '_> {
    // Guard mode learns the mesh's entry from every file (Kuma's named file, Istio's
    // sticky target may sort after the primary).
    if matches!(cfg.mode, plan::ConfigMode::Chain | plan::ConfigMode::Guard) {
        return None;
    }
    let crio = cfg.runtime == confdir::Runtime::Crio;
    let dirs = &cfg.bin_dirs;
    Some(move |e: &confdir::DirEntry| {
        !plan::is_owned_name(&e.name)
            && e.name.ends_with(".conflist")
            && !cfg.allow_ahead.iter().any(|a| a.ends_with(&e.name))
            // The parse each version of a file keeps (not a copy of it).
            && matches!(e.parsed(), Some(Ok(p)) if {
                let types = p.list.plugin_types();
                !types.iter().any(|t| plan::META_PLUGIN_TYPES.contains(t))
                    && (!crio
                        || types
                            .iter()
                            .all(|t| interlock_libcni::exec::find_plugin(t, dirs).is_some()))
            })
    })
}

/// Reads the conf dir for the guard: like [`snapshot`], but in owned mode config files
/// sorting after the primary are not read ([`stop_rule`]) unless they are named like
/// ours.
pub fn snapshot_for(cfg: &AgentConfig) -> std::io::Result<Snapshot> {
    let stop = stop_rule(cfg);
    confdir::read_until(
        &cfg.conf_dir,
        &reads_also,
        stop.as_ref()
            .map(|f| f as &dyn Fn(&confdir::DirEntry) -> bool),
    )
}

/// [`snapshot_for`] through `cache` (made by [`guard_cache`]): the same snapshot, kept
/// between wakes and updated by what changed.
fn snapshot_cached<'c>(
    cfg: &AgentConfig,
    cache: &'c mut DirCache,
) -> std::io::Result<&'c Snapshot> {
    let stop = stop_rule(cfg);
    cache.read_until(
        stop.as_ref()
            .map(|f| f as &dyn Fn(&confdir::DirEntry) -> bool),
    )
}

/// The cache [`snapshot_cached`] reads `cfg`'s conf dir through.
fn guard_cache(cfg: &AgentConfig) -> DirCache {
    DirCache::reading_also(&cfg.conf_dir, reads_also)
}

/// Whether the runtime loads `cfg`'s entry from `snap` (`Ok(file)`) or why not: the
/// conf-dir half of the agent's readiness, by the same code as `interlock check`
/// ([`plan::check_effective_with`]), with the bin dirs looked up for real (CRI-O's rules)
/// and `accepts` the versions interlock-cni answered.
pub fn effective_verdict(
    cfg: &AgentConfig,
    snap: &Snapshot,
    accepts: &[String],
) -> Result<String, String> {
    with_bins(cfg, |bins| {
        plan::check_effective_with(snap, &cfg.settings(), bins, accepts)
    })
}

/// Runs `f` with `cfg`'s bin dirs looked up for real (interlock-cni counts as present).
fn with_bins<R>(cfg: &AgentConfig, f: impl FnOnce(&Binaries<'_>) -> R) -> R {
    let dirs = &cfg.bin_dirs;
    let present =
        |t: &str| t == plan::PLUGIN_TYPE || interlock_libcni::exec::find_plugin(t, dirs).is_some();
    f(&Binaries {
        dirs,
        present: &present,
        versions: None,
    })
}

/// One directory interlock depends on, as found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirFacts {
    /// What it is for (`conf dir`, `bin dir`, `state dir`).
    pub role: &'static str,
    /// Where.
    pub path: PathBuf,
    /// Permission bits.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
}

/// The directories that let someone other than root change what the runtime loads or
/// runs, each with why. Pure: the caller stats the directories (and warns, counts…).
pub fn writable_by_others(dirs: &[DirFacts]) -> Vec<String> {
    dirs.iter()
        .filter_map(|d| {
            let mut why = vec![];
            if d.uid != 0 {
                why.push(format!("owned by uid {}", d.uid));
            }
            if d.mode & 0o020 != 0 {
                why.push("writable by its group".to_string());
            }
            if d.mode & 0o002 != 0 {
                why.push("writable by others".to_string());
            }
            (!why.is_empty()).then(|| {
                format!(
                    "{} {} is {} (mode {:04o}): a non-root user can add or replace files there \
                     and change what the runtime loads or runs; make it root-owned and not \
                     writable by group or others",
                    d.role,
                    d.path.display(),
                    why.join(" and "),
                    d.mode
                )
            })
        })
        .collect()
}

/// Stats the conf, bin and state dirs of `cfg` for [`writable_by_others`].
pub fn dir_facts(cfg: &AgentConfig) -> Vec<DirFacts> {
    use std::os::unix::fs::MetadataExt;
    let mut dirs = vec![("conf dir", cfg.conf_dir.clone())];
    dirs.extend(cfg.bin_dirs.iter().map(|b| ("bin dir", b.clone())));
    dirs.push(("state dir", cfg.state_dir.clone()));
    dirs.into_iter()
        .filter_map(|(role, path)| {
            let m = std::fs::metadata(&path).ok()?;
            Some(DirFacts {
                role,
                mode: m.mode() & 0o7777,
                uid: m.uid(),
                path,
            })
        })
        .collect()
}

/// Executes one action in `dir`, the directory synced after it (where it is synced at
/// all: not on tmpfs).
pub fn apply(dir: &Path, a: &Action) -> std::io::Result<()> {
    apply_unsynced(dir, a)?;
    if syncs_in(dir) {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// [`apply`] without syncing the directory afterwards: a written file's content is synced
/// before it is renamed in (never a partial file), but the rename itself becomes durable
/// with the next sync of the directory ([`DirSyncer`]). The runtime sees the change as
/// soon as the rename is done; the directory's sync would only delay the next repair.
pub fn apply_unsynced(dir: &Path, a: &Action) -> std::io::Result<()> {
    match a {
        Action::Write { name, bytes, mode } => {
            let path = dir.join(name);
            write_temp(dir, name, bytes, *mode, syncs_in(dir))
                .and_then(|tmp| {
                    std::fs::rename(&tmp, &path).inspect_err(|_| {
                        let _ = std::fs::remove_file(&tmp);
                    })
                })
                .map_err(|e| {
                    std::io::Error::new(
                        e.kind(),
                        format!("writing {} atomically: {e}", path.display()),
                    )
                })
        }
        Action::Rename { from, to } => std::fs::rename(dir.join(from), dir.join(to)),
        Action::Remove { name } => match std::fs::remove_file(dir.join(name)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        },
    }
}

/// How long the conf dir's sync waits after the first change it is asked to make
/// durable, for more to come: a primary rewritten 100 times a second then costs 20
/// directory syncs a second, not 100.
pub const DIR_SYNC_DELAY: Duration = Duration::from_millis(50);

/// Syncs the conf dir after the guard's renames and removals, on a thread of its own:
/// off the repair's path, and once for every burst of writes (the requests that arrive
/// within [`DIR_SYNC_DELAY`] of the first, or while a sync runs, are answered by one
/// sync). A rename is durable at most [`DIR_SYNC_DELAY`] and two syncs after it is made;
/// what the runtime sees does not wait for it, and a written file's content is synced
/// before it is renamed in, so a crash never leaves a partial file, at worst the
/// directory as it was before the last repair (which the agent repairs again at start).
pub struct DirSyncer {
    dir: PathBuf,
    how: Syncing,
}

/// How a [`DirSyncer`] syncs, decided at its first request.
enum Syncing {
    /// No request yet.
    NotYet,
    /// On its thread, through this queue.
    Thread(std::sync::mpsc::Sender<()>),
    /// In place: the thread could not start.
    InPlace,
    /// Never: the directory is on tmpfs.
    Never,
}

impl DirSyncer {
    /// A syncer for `dir` (no thread until the first request).
    pub fn new(dir: &Path) -> DirSyncer {
        DirSyncer {
            dir: dir.to_path_buf(),
            how: Syncing::NotYet,
        }
    }

    /// The directory changed: sync it soon.
    pub fn request(&mut self) {
        if matches!(self.how, Syncing::NotYet) {
            self.how = if !syncs_in(&self.dir) {
                Syncing::Never
            } else if let Some(tx) = self.spawn() {
                Syncing::Thread(tx)
            } else {
                warn!("cannot start the conf dir's sync thread: syncing in place");
                Syncing::InPlace
            };
        }
        match &self.how {
            Syncing::Thread(tx) if tx.send(()).is_ok() => {}
            Syncing::Thread(_) | Syncing::InPlace => sync_dir(&self.dir),
            Syncing::NotYet | Syncing::Never => {}
        }
    }

    /// Syncs the directory now (on stop).
    pub fn now(&self) {
        if matches!(self.how, Syncing::Thread(_) | Syncing::InPlace) {
            sync_dir(&self.dir);
        }
    }

    fn spawn(&self) -> Option<std::sync::mpsc::Sender<()>> {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let dir = self.dir.clone();
        std::thread::Builder::new()
            .name("interlock-dirsync".into())
            .spawn(move || {
                while rx.recv().is_ok() {
                    std::thread::sleep(DIR_SYNC_DELAY);
                    // Whatever queued up meanwhile is covered by this sync.
                    while rx.try_recv().is_ok() {}
                    sync_dir(&dir);
                }
            })
            .ok()
            .map(|_| tx)
    }
}

/// Syncs `dir` (a failure is logged: the next sync tries again).
fn sync_dir(dir: &Path) {
    if let Err(e) = std::fs::File::open(dir).and_then(|f| f.sync_all()) {
        warn!("syncing {}: {e}", dir.display());
    }
}

/// A readable description of an action for the log (names escaped: a file name can
/// carry terminal escape sequences).
pub fn describe(a: &Action) -> String {
    match a {
        Action::Write { name, bytes, mode } => {
            format!(
                "wrote {} ({} bytes, mode {mode:04o})",
                shown(name),
                bytes.len()
            )
        }
        Action::Rename { from, to } => format!("renamed {} to {}", shown(from), shown(to)),
        Action::Remove { name } => format!("removed {}", shown(name)),
    }
}

/// True for a temp file left by a `write_file_atomic` of a process that is gone
/// (`.<name>.<pid>.<n>.tmp`).
pub fn is_stale_temp(name: &str) -> bool {
    let Some(inner) = name.strip_prefix('.').and_then(|n| n.strip_suffix(".tmp")) else {
        return false;
    };
    let mut parts = inner.rsplitn(3, '.');
    let (Some(n), Some(pid), Some(_base)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    if n.parse::<u64>().is_err() {
        return false;
    }
    match pid.parse::<u32>() {
        Ok(pid) => pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists(),
        Err(_) => false,
    }
}

/// Removes temp files that a killed writer left in `dir` (they are invisible to the
/// runtimes, but should not pile up).
pub fn sweep_stale_temps(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if is_stale_temp(&name) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// The guard's state.
pub struct Guard {
    cfg: AgentConfig,
    settings: Settings,
    installer: PluginInstaller,
    versions: VersionCache,
    shared: Arc<Shared>,
    /// What we last left in each file we touched (`None`: we left it absent).
    left: HashMap<String, Option<Vec<u8>>>,
    conflicts: ConflictTracker,
    binary_problem: Option<String>,
    retry_at: Option<Instant>,
    retries: u32,
    /// Readiness as last logged and written to the marker.
    published: Option<Readiness>,
    last_marker: Option<Instant>,
    /// The conf dir as last read, kept current from inotify's names.
    cache: DirCache,
    /// Where each plugin type's binary was found (`None`: in no bin dir), until a bin
    /// dir changes or the periodic resync: looked up once, not on every wake. (Only a
    /// change behind a symbolic link in a bin dir has no event of its own: it is seen at
    /// the next resync.)
    plugins: HashMap<String, Option<PathBuf>>,
    /// Why the state dir cannot be trusted with interlock's state, if it cannot: the node
    /// is then not ready (the plugin refuses to write there too).
    untrusted_state: Option<String>,
    /// The latest fight over one of our files (going on or over), for the marker.
    fight: Option<ConfigFight>,
    /// While a fight goes on: who the other writer most likely is and what to do, for
    /// the readiness reason.
    fight_detail: Option<String>,
    /// Why the runtime's own config says it reads another conf dir, if it does.
    conf_dir_unread: Option<String>,
    /// The agent created the conf dir (it did not exist: no runtime read it so far).
    created_conf_dir: bool,
    /// Since when the conf dir has had no primary config (the holding config is planned).
    waiting_since: Option<Instant>,
    /// What the wait for the primary's first config suggests, once it lasted
    /// `cfg.primary_wait_hint` (logged once per wait).
    wait_hint: Option<String>,
    /// Guard mode's state (`None` in owned and chain mode).
    guarded: Option<guarded::Guarded>,
    /// Syncs the conf dir after our writes, off the repair's path.
    dir_sync: DirSyncer,
}

/// The config file the runtime loads from `snap` and the plugin types of its chain: in a
/// fight, the primary that most likely is the other writer.
pub fn effective_primary(cfg: &AgentConfig, snap: &Snapshot) -> (Option<String>, Vec<String>) {
    match with_bins(cfg, |bins| {
        confdir::effective_outcome(snap, cfg.runtime, bins).0
    }) {
        Some(c) => (
            c.path.file_name().map(|n| n.to_string_lossy().into_owned()),
            c.list
                .plugin_types()
                .iter()
                .map(|t| t.to_string())
                .collect(),
        ),
        None => (None, vec![]),
    }
}

/// Why `state_dir` or its `attachments` and `netns` subdirs cannot hold interlock's
/// state (see `interlock_redirect::netns_record::untrusted_dir`, which the plugin applies
/// before every write).
pub fn untrusted_state_dir(state_dir: &Path) -> Option<String> {
    use interlock_contract::layout::NETNS_DIR;
    use interlock_redirect::netns_record::untrusted_dir;
    [
        state_dir.to_path_buf(),
        state_dir.join("attachments"),
        state_dir.join(NETNS_DIR),
    ]
    .iter()
    .find_map(|d| untrusted_dir(d))
}

/// `t`'s binary in `dirs`, through `known` (see [`Guard::plugins`]).
fn find_known(
    known: &mut HashMap<String, Option<PathBuf>>,
    t: &str,
    dirs: &[PathBuf],
) -> Option<PathBuf> {
    if let Some(found) = known.get(t) {
        return found.clone();
    }
    let found = interlock_libcni::exec::find_plugin(t, dirs);
    known.insert(t.to_string(), found.clone());
    found
}

impl Guard {
    /// A guard for `cfg` installing the binary from `installer`.
    pub fn new(cfg: AgentConfig, installer: PluginInstaller, shared: Arc<Shared>) -> Guard {
        let insecure = writable_by_others(&dir_facts(&cfg));
        for finding in &insecure {
            warn!("{finding}");
        }
        shared.insecure_dirs.set(insecure.len() as i64);
        let cfg_state_dir = cfg.state_dir.clone();
        let cfg_conf_dir = cfg.conf_dir.clone();
        let cfg_guard = cfg
            .guard
            .filter(|_| cfg.mode == plan::ConfigMode::Guard)
            .map(|mesh| {
                guarded::Guarded::new(mesh, &cfg.state_dir, &cfg.guard_host_root, &cfg.conf_dir)
            });
        Guard {
            settings: cfg.settings(),
            conflicts: ConflictTracker::new(
                cfg.conflict_window,
                cfg.conflict_threshold,
                cfg.conflict_forgive_after,
            ),
            versions: VersionCache::new(cfg.bin_dirs.clone()),
            cache: guard_cache(&cfg),
            plugins: HashMap::new(),
            cfg,
            installer,
            shared,
            left: HashMap::new(),
            untrusted_state: untrusted_state_dir(&cfg_state_dir),
            binary_problem: None,
            retry_at: None,
            retries: 0,
            published: None,
            last_marker: None,
            fight: None,
            fight_detail: None,
            conf_dir_unread: None,
            created_conf_dir: false,
            waiting_since: None,
            wait_hint: None,
            guarded: cfg_guard,
            dir_sync: DirSyncer::new(&cfg_conf_dir),
        }
        .with_conf_dir_checked()
    }

    fn with_conf_dir_checked(mut self) -> Guard {
        self.conf_dir_unread = conf_dir_unread(&self.cfg);
        if let Some(why) = &self.conf_dir_unread {
            warn!("{why}");
        }
        self
    }

    /// The agent created the conf dir: no runtime read configs from it so far, which the
    /// wait for the primary's first config says.
    pub fn created_conf_dir(&mut self) {
        self.created_conf_dir = true;
    }

    /// Follows the wait for the primary's first config (`waiting`: the plan writes the
    /// holding config): once it lasted `cfg.primary_wait_hint`, says once where else the
    /// runtime may read its configs from.
    fn follow_wait(&mut self, waiting: bool, now: Instant) {
        if !waiting {
            self.waiting_since = None;
            self.wait_hint = None;
            return;
        }
        let since = *self.waiting_since.get_or_insert(now);
        let waited = now.saturating_duration_since(since);
        if self.wait_hint.is_some() || waited < self.cfg.primary_wait_hint {
            return;
        }
        let dir = self.cfg.conf_dir.display();
        let created = if self.created_conf_dir {
            " (the agent created it: it did not exist, so no runtime read configs from it)"
        } else {
            ""
        };
        let hint = match &self.conf_dir_unread {
            Some(why) => format!("no primary CNI config has appeared in {dir}{created}: {why}"),
            None => format!(
                "no primary CNI config has appeared in {dir}{created}: if the runtime reads \
                 its CNI configs from another directory (containerd: conf_dir of its CRI \
                 plugin's cni table in config.toml; k3s: \
                 /var/lib/rancher/k3s/agent/etc/cni/net.d; CRI-O: network_dir in crio.conf), \
                 point --cni-conf-dir (INTERLOCK_CNI_CONF_DIR) there; otherwise the primary \
                 CNI (its DaemonSet) has not written its config yet"
            ),
        };
        warn!("waited {waited:.0?}: {hint}");
        self.wait_hint = Some(hint);
    }

    /// What a not-ready reason adds about the conf dir while waiting for the primary.
    fn conf_dir_note(&self) -> Option<&str> {
        self.waiting_since?;
        self.wait_hint
            .as_deref()
            .or(self.conf_dir_unread.as_deref())
    }

    fn check_binaries(&mut self, full: bool) {
        let mut problems = vec![];
        for dir in &self.cfg.bin_dirs {
            match self.installer.ensure(dir, full) {
                Ok(true) => {
                    self.shared.installs.inc();
                    info!(
                        "installed {} (sha256 {})",
                        dir.join(PLUGIN_FILE).display(),
                        self.installer.sha256()
                    );
                }
                Ok(false) => {}
                Err(e) => {
                    self.shared.errors.inc();
                    error!("plugin binary in {}: {e}", dir.display());
                    problems.push(e);
                }
            }
        }
        self.binary_problem = (!problems.is_empty()).then(|| problems.join("; "));
        if self.binary_problem.is_some() {
            self.schedule_retry();
        }
    }

    /// The plugin types the plan can look at (our files, and the foreign files up to the
    /// first one every runtime could use, plus the chain target) and what their binaries
    /// answer to VERSION — from the cache, or asked now for at most [`VERSION_WAIT`].
    fn facts(&mut self, snap: &Snapshot) -> Facts {
        let mut facts = Facts::default();
        // Sorted and deduplicated as they come (a large conf dir names the same few types
        // a thousand times).
        let mut types: BTreeSet<String> = BTreeSet::new();
        let target = self.settings.chain_target.as_deref();
        let mut reached_primary = false;
        // One lookup per plugin type, not per file naming it (a large conf dir names the
        // same few types a thousand times) nor per wake.
        let (plugins, bin_dirs) = (&mut self.plugins, &self.cfg.bin_dirs);
        let mut present =
            |t: &str| t == plan::PLUGIN_TYPE || find_known(plugins, t, bin_dirs).is_some();
        for c in snap.candidates_iter() {
            let owned = plan::is_owned_name(c.name());
            if reached_primary && !owned && target != Some(c.name()) {
                continue;
            }
            let Ok(p) = c.parsed() else { continue };
            let mut these = p.list.plugin_types();
            if let Some(d) = confdir::multus_delegate(&p.list) {
                these.extend(
                    d.get("plugins")
                        .and_then(|p| p.as_array())
                        .into_iter()
                        .flatten()
                        .filter_map(|p| p.get("type")?.as_str()),
                );
            }
            let all_present = these.iter().all(|t| present(t));
            for t in these {
                if !types.contains(t) {
                    types.insert(t.to_string());
                }
            }
            // containerd loads the first file that parses whatever the bin dirs hold, so
            // no decision looks past it; CRI-O skips files whose binaries are missing.
            let usable = all_present || self.cfg.runtime == confdir::Runtime::Containerd;
            if !owned && usable && target.is_none_or(|t| t == c.name()) {
                reached_primary = true;
            }
        }
        // Our own plugin is in every list we write, whether or not a file has it yet.
        types.insert(plan::PLUGIN_TYPE.to_string());
        // In guard mode so is the mesh's, once learnt.
        if let Some(g) = &self.guarded {
            types.insert(g.mesh.plugin_type().to_string());
        }
        let mut bins = vec![];
        for t in types {
            if t == plan::PLUGIN_TYPE {
                facts.present_types.insert(t.clone());
                facts.versions.insert(t, self.installer.versions().to_vec());
                continue;
            }
            if let Some(bin) = find_known(&mut self.plugins, &t, &self.cfg.bin_dirs) {
                facts.present_types.insert(t.clone());
                self.versions.request(&bin);
                bins.push((t, bin));
            }
        }
        self.versions.wait(VERSION_WAIT);
        for (t, bin) in bins {
            match self.versions.answer(&bin) {
                Some(Ok(v)) => {
                    facts.versions.insert(t, v);
                }
                Some(Err(e)) => warn!("{e}"),
                // Still asking: use the answer on a reconcile soon after it arrives.
                None => self.retry_soon(),
            }
        }
        facts
    }

    /// Whether the runtime loads our entry from `snap`, judged by the same code as
    /// `interlock check` (bin dirs looked up for real, for CRI-O's rules).
    fn verdict(&self, snap: &Snapshot, facts: &Facts) -> Result<String, String> {
        let accepts = plan::interlock_versions(facts);
        match &self.guarded {
            Some(g) => {
                let state = g.state.clone().unwrap_or(plan::GuardState::NoPrimary {
                    reason: String::new(),
                });
                with_bins(&self.cfg, |bins| {
                    plan::check_effective_guard(
                        snap,
                        &self.settings,
                        bins,
                        &accepts,
                        &state,
                        g.guard_file.as_deref(),
                    )
                })
            }
            // The guard's own settings (`effective_verdict` would build them again).
            None => with_bins(&self.cfg, |bins| {
                plan::check_effective_with(snap, &self.settings, bins, &accepts)
            }),
        }
    }

    /// Records conflicts for the files `plan` touches; returns the first file the guard
    /// must leave alone now (in back-off), if any. A conflict that starts a fight is
    /// reported once ([`Guard::start_fight`]); the conflicts of a fight after that are
    /// logged at debug level only.
    fn record_conflicts(
        &mut self,
        plan: &plan::Plan,
        snap: &Snapshot,
        now: Instant,
    ) -> Option<String> {
        let dir = self.cfg.conf_dir.clone();
        let files = if let Some(g) = &self.guarded {
            guard_conflicting_files(plan, snap, &self.left, g.mesh.plugin_type())
        } else {
            conflicting_files(plan, snap, &self.left, &self.settings.entry)
        };
        for f in files {
            if self.conflicts.in_backoff(f, now) {
                continue;
            }
            // Each one before a fight, not only the one that starts it: a lone conflict is
            // rare enough to log, and it names the other writer's effect when one is
            // investigated.
            let found = match snap.get(f) {
                None => "it is gone".to_string(),
                Some(e) => {
                    let runs_ours = e
                        .content
                        .as_deref()
                        .is_some_and(|b| plan::runs_type(b, plan::PLUGIN_TYPE));
                    let bytes = e.content.as_ref().map_or(0, Vec::len);
                    if runs_ours {
                        format!("an entry interlock left out is back ({bytes} bytes)")
                    } else {
                        format!("it no longer runs interlock-cni ({bytes} bytes)")
                    }
                }
            };
            if self.conflicts.in_fight(f, now) {
                debug!(
                    "{} in {} changed since interlock wrote it and {found}: one more conflict of the fight",
                    shown(f),
                    dir.display()
                );
            } else {
                info!(
                    "{} in {} changed since interlock wrote it and {found}: counted as a conflict",
                    shown(f),
                    dir.display()
                );
            }
            let verdict = self.conflicts.record_conflict(f, now);
            // Counted once: what is there now is the other writer's, and only undoing our
            // next write is a new conflict (after a back-off, the file is still as the
            // other writer left it).
            self.left.insert(
                f.to_string(),
                snap.get(f).map(|e| e.content.clone().unwrap_or_default()),
            );
            if let Some(fight) = self
                .fight
                .as_mut()
                .filter(|x| x.file == f && x.ended_at_ms.is_none())
            {
                fight.conflicts += 1;
                fight.last_conflict_at_ms = interlock_contract::time::now_ms();
            }
            match verdict {
                Verdict::Repair => {}
                Verdict::BackOff {
                    wait,
                    new_fight: true,
                } => self.start_fight(f, snap, wait),
                Verdict::BackOff {
                    wait,
                    new_fight: false,
                } => debug!(
                    "{} in {} was undone again: backing off for {wait:?}",
                    shown(f),
                    dir.display()
                ),
            }
        }
        plan.actions
            .iter()
            .map(Action::file)
            .find(|f| self.conflicts.in_backoff(f, now))
            .map(str::to_string)
    }

    /// A fight over `file` starts: names the primary the runtime loads meanwhile (most
    /// likely the other writer) and what to do, once — a WARN line, the fights counter,
    /// the node's Event — and records it for the marker (`interlock check`).
    fn start_fight(&mut self, file: &str, snap: &Snapshot, wait: Duration) {
        let (primary, types) = effective_primary(&self.cfg, snap);
        let hint = conflict::fight_hint(&types);
        let loads = match &primary {
            Some(p) => format!(
                "the runtime loads {} ({}) meanwhile",
                shown(p),
                types.join(", ")
            ),
            None => "the runtime has no network meanwhile".to_string(),
        };
        let forgive = self.cfg.conflict_forgive_after;
        let detail = format!(
            "{loads}; not ready until {} is left alone for {forgive:?} (fail closed: a pod \
             started meanwhile would run without its redirection); {hint}",
            shown(file)
        );
        let message = format!(
            "another writer undid interlock's change to {} in {} more than {} times within \
             {:?}: a fight, most likely with a primary CNI that removes every config but its \
             own; {detail}. Backing off for {wait:?}, doubling up to {:?} while it goes on",
            shown(file),
            self.cfg.conf_dir.display(),
            self.cfg.conflict_threshold,
            self.cfg.conflict_window,
            conflict::MAX_BACKOFF
        );
        warn!("{message}");
        self.shared.fight_started(file, &message);
        let now_ms = interlock_contract::time::now_ms();
        self.fight = Some(ConfigFight {
            file: file.to_string(),
            conflicts: u64::from(self.cfg.conflict_threshold) + 1,
            started_at_ms: now_ms,
            last_conflict_at_ms: now_ms,
            ended_at_ms: None,
            primary,
            primary_types: types,
        });
        self.fight_detail = Some(detail);
    }

    /// Ends the fights that were forgiven by `now` (logged once each).
    fn end_fights(&mut self, now: Instant) {
        for f in self.conflicts.take_ended(now) {
            info!(
                "the fight over {} in {} is over: nobody undid interlock's change for {:?}",
                shown(&f),
                self.cfg.conf_dir.display(),
                self.cfg.conflict_forgive_after
            );
            if let Some(fight) = self.fight.as_mut().filter(|x| x.file == f) {
                fight.ended_at_ms = Some(interlock_contract::time::now_ms());
            }
        }
        if self.conflicts.fighting(now).is_empty() {
            self.fight_detail = None;
        }
    }

    /// Executes `plan`, made from `snap`; true when something was written. A file that
    /// is not interlock's own (the primary's, in chain mode) is replaced only if it still
    /// holds what `snap` read, else the decision is made again from its newer content
    /// ([`crate::guard::contested_write`]): another writer's write is never lost to ours. When the
    /// newer content is left in place, the rest of the plan waits for the next reconcile.
    fn apply_plan(&mut self, plan: &plan::Plan, snap: &Snapshot, facts: &Facts) -> bool {
        let dir = self.cfg.conf_dir.clone();
        let mut changed = false;
        for a in &plan.actions {
            let done = match a {
                // In guard mode the guard file is shared with the mesh's installer: a
                // version it wrote after this snapshot is never overwritten; the next
                // reconcile learns from it and decides again.
                Action::Write { name, bytes, mode }
                    if !plan::is_owned_name(name) || self.guarded.is_some() =>
                {
                    let base = snap.get(name).map(|e| e.content.as_deref());
                    let guarded = self.guarded.is_some();
                    match base {
                        // Not read (refused, unreadable): nothing to compare with.
                        Some(None) => apply_unsynced(&dir, a).map(|()| Replaced::Written {
                            bytes: bytes.clone(),
                            followed: 0,
                        }),
                        base => {
                            let settings = &self.settings;
                            let mut rederive = |newer: &[u8]| {
                                if guarded {
                                    return None;
                                }
                                plan::rewrite_for(snap, settings, facts, name, newer)
                            };
                            replace_checked(
                                &dir,
                                name,
                                *mode,
                                base.flatten(),
                                bytes.clone(),
                                &mut rederive,
                            )
                        }
                    }
                }
                _ => apply_unsynced(&dir, a).map(|()| Replaced::Written {
                    bytes: a.leaves().map(<[u8]>::to_vec).unwrap_or_default(),
                    followed: 0,
                }),
            };
            // Whatever it did (written, put back, partly done), the directory changed.
            self.dir_sync.request();
            match done {
                Ok(Replaced::Written { bytes, followed }) => {
                    changed = true;
                    self.shared.writes.inc();
                    let leaves = a.leaves().map(|_| bytes);
                    self.left.insert(a.file().to_string(), leaves);
                    if let Action::Rename { to, .. } = a {
                        self.left.remove(to);
                    }
                    if followed > 0 {
                        info!(
                            "{} in {} (made from the newest of {followed} versions its \
                             writer wrote while interlock was writing it)",
                            describe(a),
                            dir.display()
                        );
                    } else {
                        info!("{} in {}", describe(a), dir.display());
                    }
                }
                Ok(Replaced::Yielded { why }) => {
                    info!(
                        "left {} in {} as its writer wrote it: {why}; deciding again",
                        shown(a.file()),
                        dir.display()
                    );
                    self.retry_soon();
                    break;
                }
                Err(e) => {
                    self.shared.errors.inc();
                    error!("{} in {} failed: {e}; retrying", describe(a), dir.display());
                    self.schedule_retry();
                    break;
                }
            }
        }
        changed
    }

    /// Guard mode: tells the learner what interlock itself left in the guard file, so
    /// that T left out by interlock (hold) is not taken for the installer's removal.
    fn note_guard_writes(&mut self, plan: &plan::Plan) {
        let Some(g) = self.guarded.as_mut() else {
            return;
        };
        for a in &plan.actions {
            if let Action::Write { name, .. } = a {
                if let Some(Some(bytes)) = self.left.get(name) {
                    if plan::is_owned_name(name) {
                        g.wrote(name, bytes);
                    }
                }
            }
        }
    }

    /// The runtime would load a config without us right now: /readyz says so for the
    /// duration of the repair (not logged, not marked: it lasts milliseconds).
    fn mark_repairing(&self, snap: &Snapshot, facts: &Facts) {
        // Judged only when there is a "ready" to take back.
        if !self.shared.readiness().ready {
            return;
        }
        if let Err(e) = self.verdict(snap, facts) {
            self.shared.set_readiness(Readiness {
                ready: false,
                reason: format!("repairing: {e}"),
                effective: None,
            });
        }
    }

    /// Counts a repair (`changed`) or, when there was nothing to do, resets the retries.
    fn count(&mut self, changed: bool, converged: bool, started: Instant) {
        if changed {
            self.shared.repairs.inc();
            self.shared.observe_repair(started.elapsed().as_secs_f64());
        } else if converged {
            self.retries = 0;
        }
    }

    /// One reconcile: read → plan → apply → count → publish. `full` also re-hashes the
    /// installed binaries.
    pub fn reconcile(&mut self, bins: bool, full: bool) {
        // The snapshot borrows the cache while the rest of the guard is in use.
        let mut cache = std::mem::take(&mut self.cache);
        self.reconcile_through(&mut cache, bins, full);
        self.cache = cache;
    }

    fn reconcile_through(&mut self, cache: &mut DirCache, bins: bool, full: bool) {
        let started = Instant::now();
        self.shared.reconciles.inc();
        if bins || full {
            self.check_binaries(full);
            self.plugins.clear();
        }
        let dir = self.cfg.conf_dir.clone();
        if full {
            cache.resync();
        }
        let snap = match snapshot_cached(&self.cfg, cache) {
            Ok(s) => s,
            Err(e) => {
                self.set_ready(Readiness {
                    ready: false,
                    reason: format!("cannot read conf dir {}: {e}", dir.display()),
                    effective: None,
                });
                self.schedule_retry();
                return;
            }
        };
        let facts = self.facts(snap);
        let plan = match self.guarded.as_mut() {
            Some(g) => {
                g.learn(snap, &self.shared);
                g.note_put_back(snap, &self.left);
                let t_type = g.mesh.plugin_type();
                // Looked up afresh (one stat per bin dir): a binary deleted since the
                // last bin-dir event must hold pods at once, with the right reason.
                let bin = interlock_libcni::exec::find_plugin(t_type, &self.cfg.bin_dirs);
                self.settings.guard = Some(g.input(bin.as_deref(), &self.cfg.bin_dirs));
                let (plan, state) = plan::plan_guard(snap, &self.settings, &facts);
                g.planned(state, plan.target.clone(), &self.shared);
                plan
            }
            None => plan::plan(snap, &self.settings, &facts),
        };
        let now = Instant::now();
        self.follow_wait(
            plan.problem
                .as_deref()
                .is_some_and(|p| p.starts_with(plan::WAITING_FOR_PRIMARY)),
            now,
        );
        self.end_fights(now);
        let blocked = self.record_conflicts(&plan, snap, now);
        let mut changed = false;
        // Readiness from the directory as it is now: this snapshot, unless we wrote.
        let mut verdict = None;
        if blocked.is_none() && !plan.actions.is_empty() {
            self.mark_repairing(snap, &facts);
            changed = self.apply_plan(&plan, snap, &facts);
            self.note_guard_writes(&plan);
            if !changed {
                verdict = Some(self.verdict(snap, &facts));
            }
            // Our writes are read back now, before inotify reports them.
            for a in &plan.actions {
                cache.changed(a.file());
                if let Action::Rename { to, .. } = a {
                    cache.changed(to.as_str());
                }
            }
        } else {
            verdict = Some(self.verdict(snap, &facts));
        }
        self.count(
            changed,
            blocked.is_none() && plan.actions.is_empty(),
            started,
        );
        self.publish_conflicts(now);
        let verdict = match verdict {
            Some(v) => v,
            None => snapshot_cached(&self.cfg, cache)
                .map_err(|e| format!("cannot read conf dir {}: {e}", dir.display()))
                .and_then(|s| self.verdict(s, &facts)),
        };
        let backing: Vec<String> = self
            .conflicts
            .backing_off(now)
            .into_iter()
            .map(|(f, _)| f)
            .collect();
        let fighting: Vec<String> = self
            .conflicts
            .fighting(now)
            .into_iter()
            .map(|(f, _)| f)
            .collect();
        let r = readiness::judge(&readiness::Observed {
            verdict: &verdict,
            binary_problem: self.binary_problem.as_deref(),
            backing_off: &backing,
            fighting: &fighting,
            fight_detail: self.fight_detail.as_deref(),
            plan: &plan,
            conf_dir: &dir,
            guard: self.guarded.as_ref().and_then(|g| g.state.as_ref()),
        });
        let r = match self.conf_dir_note() {
            Some(note) if !r.ready => Readiness {
                reason: format!("{}; {note}", r.reason),
                ..r
            },
            _ => r,
        };
        self.set_ready(r);
    }

    fn publish_conflicts(&self, now: Instant) {
        let backing: Vec<String> = self
            .conflicts
            .backing_off(now)
            .into_iter()
            .map(|(f, _)| f)
            .collect();
        self.shared.set_conflicts(
            self.conflicts
                .conflict_counts()
                .into_iter()
                .map(|(file, conflicts, _trips)| FileConflict {
                    backing_off: backing.contains(&file),
                    file,
                    undos: conflicts,
                })
                .collect(),
        );
    }

    /// Reconcile again shortly (without growing the retry back-off).
    fn retry_soon(&mut self) {
        let soon = Instant::now() + Duration::from_millis(20);
        self.retry_at = Some(self.retry_at.map_or(soon, |r| r.min(soon)));
    }

    fn schedule_retry(&mut self) {
        let d = Duration::from_millis(10u64 << self.retries.min(7));
        self.retries = self.retries.saturating_add(1);
        self.retry_at = Some(Instant::now() + d);
    }

    fn set_ready(&mut self, r: Readiness) {
        // A state dir another user can write is no protection (redteam-3 L-3): the
        // plugin refuses it, so meshed ADDs fail; say so instead of ready.
        let r = match &self.untrusted_state {
            Some(why) if r.ready => Readiness {
                ready: false,
                reason: format!("state dir {why}"),
                effective: None,
            },
            _ => r,
        };
        // Log and mark only real changes (a transient "repairing" state is neither). The
        // marker goes first, so STATUS never lags behind /readyz.
        if self.published.as_ref() != Some(&r) {
            let was = self.published.take().unwrap_or_default();
            if was.ready != r.ready || was.reason != r.reason {
                if r.ready {
                    info!(
                        "ready: the runtime loads {}",
                        r.effective.as_deref().unwrap_or("?")
                    );
                } else {
                    warn!("not ready: {}", r.reason);
                }
            }
            self.published = Some(r.clone());
            self.write_marker();
        }
        self.shared.set_readiness(r);
    }

    /// Writes the STATUS marker from the published readiness.
    pub fn write_marker(&mut self) {
        let r = self
            .published
            .clone()
            .unwrap_or_else(|| self.shared.readiness());
        let m = Marker {
            ready: r.ready,
            reason: r.reason,
            updated_at_ms: interlock_contract::time::now_ms(),
            stale_after_ms: self.cfg.marker_stale_after.as_millis() as u64,
            pid: std::process::id(),
            pid_namespace: None,
            config_path: r
                .effective
                .map(|e| self.cfg.conf_dir.join(e).display().to_string())
                .unwrap_or_default(),
            runtime: Some(self.cfg.runtime.to_string()),
            cri_endpoint: Some(
                self.cfg
                    .audit
                    .as_ref()
                    .map_or_else(|| "none".into(), |a| a.cri_endpoint.clone()),
            ),
            fight: self.fight.clone(),
        };
        if let Err(e) = marker::write(&self.cfg.state_dir, &m) {
            self.shared.errors.inc();
            error!(
                "cannot write readiness marker in {}: {e}",
                self.cfg.state_dir.display()
            );
        }
        self.last_marker = Some(Instant::now());
    }

    /// Runs until [`Wake::Stop`] arrives or the sender is dropped.
    pub fn run(mut self, rx: Receiver<Wake>) {
        let heartbeat = self.cfg.marker_stale_after / 3;
        let mut next_resync = Instant::now() + self.cfg.resync_interval;
        self.reconcile(true, true);
        self.write_marker();
        loop {
            self.shared.tick();
            let now = Instant::now();
            let mut deadline = next_resync.min(self.last_marker.unwrap_or(now) + heartbeat);
            if let Some(r) = self.retry_at {
                deadline = deadline.min(r);
            }
            let hint_at = self
                .waiting_since
                .filter(|_| self.wait_hint.is_none())
                .map(|s| s + self.cfg.primary_wait_hint);
            if let Some(h) = hint_at {
                deadline = deadline.min(h);
            }
            if let Some((_, until)) = self
                .conflicts
                .backing_off(now)
                .into_iter()
                .chain(self.conflicts.fighting(now))
                .min_by_key(|(_, t)| *t)
            {
                // (A fight ends just after its deadline: see `ConflictTracker::fighting`.)
                deadline = deadline.min(until + Duration::from_millis(1));
            }
            let wait = deadline.saturating_duration_since(now);
            let (mut conf, mut bins) = (false, false);
            let mut stop = false;
            let mut wake = |w: Wake, cache: &mut DirCache| match w {
                Wake::Stop => stop = true,
                Wake::Conf(change) => {
                    conf = true;
                    match change {
                        ConfChange::Names(names) => {
                            names.into_iter().for_each(|n| cache.changed(n))
                        }
                        ConfChange::Unknown => cache.resync(),
                    }
                }
                Wake::Bin => bins = true,
            };
            match rx.recv_timeout(wait) {
                Ok(w) => wake(w, &mut self.cache),
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {}
            }
            // Coalesce whatever else is queued.
            while let Ok(w) = rx.try_recv() {
                wake(w, &mut self.cache);
            }
            if stop {
                break;
            }
            let now = Instant::now();
            let full = now >= next_resync;
            if full {
                next_resync = now + self.cfg.resync_interval;
                self.shared.resyncs.inc();
                // Re-checked on every resync so the metric clears once an operator fixes
                // the modes (logged only at start: the finding does not change by itself).
                self.shared
                    .insecure_dirs
                    .set(writable_by_others(&dir_facts(&self.cfg)).len() as i64);
                self.untrusted_state = untrusted_state_dir(&self.cfg.state_dir);
            }
            let retry = self.retry_at.is_some_and(|r| now >= r);
            if retry {
                self.retry_at = None;
                bins |= self.binary_problem.is_some();
            }
            let backoff_ended = !self.conflicts.backing_off(now).is_empty()
                || self.shared.readiness().reason.starts_with("backing off");
            let fight_ended =
                self.fight_detail.is_some() && self.conflicts.fighting(now).is_empty();
            let hint_due = hint_at.is_some_and(|h| now >= h);
            if conf || bins || full || retry || backoff_ended || fight_ended || hint_due {
                self.reconcile(bins, full);
            }
            if self.last_marker.is_none_or(|t| t.elapsed() >= heartbeat) {
                self.write_marker();
            }
        }
        // What was renamed last is durable before the guard returns.
        self.dir_sync.now();
    }
}

/// Blocks until `ino` has events to read (EINTR: asks again).
fn wait_readable(ino: &inotify::Inotify) -> nix::Result<()> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    loop {
        let mut fds = [PollFd::new(ino.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::NONE) {
            Err(nix::Error::EINTR) => continue,
            other => return other.map(|_| ()),
        }
    }
}

/// Starts the inotify thread watching `conf_dir` and `bin_dirs` (as directories: writers
/// rename files in); it sends a [`Wake`] per batch of events until the receiver is gone.
/// A watched directory that is deleted or moved is watched again once it reappears.
pub fn spawn_watcher(
    conf_dir: &Path,
    bin_dirs: &[PathBuf],
    tx: std::sync::mpsc::Sender<Wake>,
) -> std::io::Result<()> {
    let watcher = Watcher::new(conf_dir, bin_dirs)?;
    std::thread::Builder::new()
        .name("interlock-watch".into())
        .spawn(move || watcher.run(&tx))?;
    Ok(())
}

/// A directory [`spawn_watcher`] watches.
struct WatchedDir {
    path: PathBuf,
    /// `None` while the directory is gone (removed or moved away).
    wd: Option<inotify::WatchDescriptor>,
    is_conf: bool,
}

/// The inotify thread's state.
struct Watcher {
    ino: inotify::Inotify,
    mask: inotify::WatchMask,
    watched: Vec<WatchedDir>,
    /// Conf dir names not yet sent (temp files wait for the next real change).
    names: Vec<OsString>,
    /// The conf dir changed in a way its names do not tell: read it in full.
    unknown: bool,
}

/// What a batch of events woke: the conf dir, the bin dirs.
#[derive(Default)]
struct Woken {
    conf: bool,
    bin: bool,
}

/// The outcome of one read of the inotify descriptor.
enum Read<'b> {
    Events(inotify::Events<'b>),
    /// Nothing to read yet.
    Nothing,
    /// The descriptor failed (logged): the periodic resync is all that is left.
    Failed,
}

impl Watcher {
    fn new(conf_dir: &Path, bin_dirs: &[PathBuf]) -> std::io::Result<Watcher> {
        use inotify::{Inotify, WatchMask};
        let ino = Inotify::init()?;
        let mask = WatchMask::CREATE
            | WatchMask::DELETE
            | WatchMask::MODIFY
            | WatchMask::CLOSE_WRITE
            | WatchMask::MOVED_TO
            | WatchMask::MOVED_FROM
            | WatchMask::ATTRIB
            | WatchMask::DELETE_SELF
            | WatchMask::MOVE_SELF;
        let mut watched = vec![WatchedDir {
            path: conf_dir.to_path_buf(),
            wd: Some(ino.watches().add(conf_dir, mask)?),
            is_conf: true,
        }];
        for b in bin_dirs {
            watched.push(WatchedDir {
                path: b.clone(),
                wd: Some(ino.watches().add(b, mask)?),
                is_conf: false,
            });
        }
        Ok(Watcher {
            ino,
            mask,
            watched,
            names: vec![],
            unknown: false,
        })
    }

    /// Sends a [`Wake`] per batch of events until the receiver is gone or inotify fails.
    fn run(mut self, tx: &std::sync::mpsc::Sender<Wake>) {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let Some(lost) = self.rewatch(tx) else {
                return;
            };
            let events = match self.read(&mut buf, lost) {
                Read::Events(ev) => ev,
                Read::Nothing => continue,
                Read::Failed => return,
            };
            let mut woken = Woken::default();
            for ev in events {
                self.note(ev, &mut woken);
            }
            if !self.send(woken, tx) {
                return;
            }
        }
    }

    /// Re-watches directories that went away, once they are back (each one back is a
    /// wake). Returns whether one is still missing; `None` once the receiver is gone.
    fn rewatch(&mut self, tx: &std::sync::mpsc::Sender<Wake>) -> Option<bool> {
        let mut lost = false;
        for dir in self.watched.iter_mut().filter(|d| d.wd.is_none()) {
            match self.ino.watches().add(&dir.path, self.mask) {
                Ok(w) => {
                    info!("watching {} again", dir.path.display());
                    dir.wd = Some(w);
                    let wake = if dir.is_conf {
                        Wake::Conf(ConfChange::Unknown)
                    } else {
                        Wake::Bin
                    };
                    if tx.send(wake).is_err() {
                        return None;
                    }
                }
                Err(_) => lost = true,
            }
        }
        Some(lost)
    }

    /// Reads the next batch of events: polling while a directory is missing, else waiting
    /// until there is one.
    fn read<'b>(&mut self, buf: &'b mut [u8], lost: bool) -> Read<'b> {
        if lost {
            // Poll while a directory is missing (the resync covers the gap).
            std::thread::sleep(Duration::from_millis(100));
        } else {
            // Wait with poll, then read without blocking: the crate's blocking read
            // clears and sets O_NONBLOCK around every read (4 fcntl calls a wake).
            if let Err(e) = wait_readable(&self.ino) {
                error!("inotify poll failed: {e}; relying on periodic resync");
                return Read::Failed;
            }
        }
        match self.ino.read_events(buf) {
            Ok(ev) => Read::Events(ev),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Read::Nothing,
            Err(e) => {
                error!("inotify read failed: {e}; relying on periodic resync");
                Read::Failed
            }
        }
    }

    /// Takes one event into `woken` (and the conf dir's pending names).
    fn note(&mut self, ev: inotify::Event<&std::ffi::OsStr>, woken: &mut Woken) {
        use inotify::EventMask;
        if ev.mask.contains(EventMask::Q_OVERFLOW) {
            warn!("inotify queue overflowed: reading the conf dir again in full");
            (woken.conf, woken.bin, self.unknown) = (true, true, true);
            return;
        }
        let Some(dir) = self
            .watched
            .iter_mut()
            .find(|d| d.wd.as_ref() == Some(&ev.wd))
        else {
            return;
        };
        if ev
            .mask
            .intersects(EventMask::IGNORED | EventMask::DELETE_SELF | EventMask::MOVE_SELF)
        {
            warn!(
                "{} was removed or moved; watching for it to come back",
                dir.path.display()
            );
            if ev.mask.contains(EventMask::MOVE_SELF) {
                let _ = self.ino.watches().remove(ev.wd.clone());
            }
            dir.wd = None;
        }
        if !dir.is_conf {
            woken.bin = true;
            return;
        }
        let Some(name) = ev.name else {
            // The directory itself (moved, removed, its attributes).
            (woken.conf, self.unknown) = (true, true);
            return;
        };
        // Temp files come and go on every atomic write: the rename that follows is what
        // matters (their names go with the next wake, so the guard's cache does not keep
        // a stale one).
        if !name.as_encoded_bytes().ends_with(b".tmp") {
            woken.conf = true;
        }
        if !self.names.iter().any(|n| n == name) {
            self.names.push(name.to_os_string());
        }
    }

    /// Sends the wakes of a batch; false once the receiver is gone.
    fn send(&mut self, woken: Woken, tx: &std::sync::mpsc::Sender<Wake>) -> bool {
        if woken.conf {
            let change = if self.unknown {
                self.names.clear();
                ConfChange::Unknown
            } else {
                ConfChange::Names(std::mem::take(&mut self.names))
            };
            self.unknown = false;
            if tx.send(Wake::Conf(change)).is_err() {
                return false;
            }
        }
        !(woken.bin && tx.send(Wake::Bin).is_err())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_temps_are_those_of_dead_writers() {
        // PIDs above pid_max never run.
        assert!(is_stale_temp(".00-interlock.conflist.99999999.3.tmp"));
        let mine = format!(".00-interlock.conflist.{}.0.tmp", std::process::id());
        assert!(!is_stale_temp(&mine), "our own temp file is not stale");
        assert!(
            !is_stale_temp(".00-interlock.conflist.1.0.tmp"),
            "pid 1 is alive"
        );
        for other in [
            "00-interlock.conflist",
            ".x.tmp",
            ".a.b.tmp",
            ".a.pid.3.tmp",
            "a.1.2.tmp",
        ] {
            assert!(!is_stale_temp(other), "{other}");
        }
    }

    #[test]
    fn apply_runs_each_action_kind() {
        let d = tempfile::tempdir().unwrap();
        apply(
            d.path(),
            &Action::Write {
                name: "a.conflist".into(),
                bytes: b"x".to_vec(),
                mode: 0o600,
            },
        )
        .unwrap();
        assert_eq!(std::fs::read(d.path().join("a.conflist")).unwrap(), b"x");
        apply(
            d.path(),
            &Action::Rename {
                from: "a.conflist".into(),
                to: "b.conflist".into(),
            },
        )
        .unwrap();
        assert!(d.path().join("b.conflist").exists() && !d.path().join("a.conflist").exists());
        apply(
            d.path(),
            &Action::Remove {
                name: "b.conflist".into(),
            },
        )
        .unwrap();
        apply(
            d.path(),
            &Action::Remove {
                name: "b.conflist".into(),
            },
        )
        .unwrap();
        let s = snapshot(d.path()).unwrap();
        assert!(s.entries.is_empty());
    }
}

#[cfg(test)]
mod pure_tests {
    use super::*;

    #[test]
    fn the_guard_does_not_read_configs_after_the_primary() {
        let d = tempfile::tempdir().unwrap();
        let w = |n: &str, c: &str| std::fs::write(d.path().join(n), c).unwrap();
        w("05-broken.conflist", "{");
        w(
            "10-primary.conflist",
            r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"}]}"#,
        );
        w(
            "50-later.conflist",
            r#"{"cniVersion":"1.0.0","name":"l","plugins":[{"type":"bridge"}]}"#,
        );
        w("90-interlock.conflist", "{}");
        w("10-x.conf.interlock-orig", "{}");
        let mut cfg = AgentConfig::new(PathBuf::from("/nonexistent"));
        cfg.conf_dir = d.path().to_path_buf();
        let snap = snapshot_for(&cfg).unwrap();
        let content = |n: &str| snap.get(n).unwrap().content.is_some();
        assert!(content("05-broken.conflist") && content("10-primary.conflist"));
        assert!(!content("50-later.conflist"), "read past the primary");
        assert!(content("90-interlock.conflist") && content("10-x.conf.interlock-orig"));
        // In chain mode, everything is read.
        cfg.mode = plan::ConfigMode::Chain;
        assert!(snapshot_for(&cfg)
            .unwrap()
            .get("50-later.conflist")
            .unwrap()
            .content
            .is_some());
    }

    #[test]
    fn log_lines_never_carry_raw_escape_sequences() {
        let a = Action::Remove {
            name: "05-\u{1b}[31mRED\u{1b}[0m.conflist".into(),
        };
        let line = describe(&a);
        assert!(!line.contains('\u{1b}'), "{line}");
        assert_eq!(line, "removed 05-\\x1b[31mRED\\x1b[0m.conflist");
    }

    #[test]
    fn directories_writable_by_non_root_are_reported() {
        let d = |role, mode, uid| DirFacts {
            role,
            path: PathBuf::from(format!("/x/{role}")),
            mode,
            uid,
        };
        let found = writable_by_others(&[
            d("conf dir", 0o755, 0),
            d("bin dir", 0o777, 0),
            d("state dir", 0o775, 1000),
            d("bin dir", 0o1777, 0),
        ]);
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(found[0].contains("/x/bin dir") && found[0].contains("writable by others"));
        assert!(found[0].contains("0777"), "{}", found[0]);
        assert!(
            found[1].contains("owned by uid 1000") && found[1].contains("writable by its group"),
            "{}",
            found[1]
        );
        // The sticky bit does not stop anyone from adding a file that sorts first.
        assert!(found[2].contains("1777"), "{}", found[2]);
    }
}

//! The config guard's thin layer: reads the conf dir, asks [`crate::plan`] what to do,
//! does it with atomic writes, and keeps readiness and the STATUS marker truthful.
//!
//! One dedicated thread runs [`Guard::run`]; an inotify thread wakes it whenever anything
//! in the conf dir or a bin dir changes, and a timer drives the periodic resync, the marker
//! heartbeat, retries and the end of back-offs. Our own writes wake it too; that
//! reconcile finds nothing to do, so there is no repair loop.

use crate::fight::{FightTracker, Verdict};
use crate::install::{find_plugin, PluginInstaller, VersionCache, PLUGIN_FILE};
use crate::marker::{self, Marker};
use crate::plan::{self, Action, Facts, Settings, BACKUP_SUFFIX};
use crate::status::{FileConflict, Readiness, Shared};
use crate::view::{is_candidate_name, parse_candidate, DirEntry, DirSnapshot};
use crate::AgentConfig;
use interlock_protocol::atomic::write_file_atomic;
use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{error, info, warn};

/// Messages to the guard thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// Something in the conf dir changed.
    Conf,
    /// Something in a bin dir changed.
    Bin,
    /// Stop the loop.
    Stop,
}

/// Reads the conf dir: every regular file, with content for candidates, owned files and
/// our backups (the names the planner looks at).
pub fn snapshot(dir: &Path) -> std::io::Result<DirSnapshot> {
    let mut entries = vec![];
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        let relevant = is_candidate_name(&name) || name.ends_with(BACKUP_SUFFIX);
        // Follows symlinks like the runtimes do; a file that vanished meanwhile is skipped.
        let Ok(meta) = std::fs::metadata(e.path()) else {
            continue;
        };
        if meta.is_dir() {
            continue;
        }
        let content = if relevant {
            match std::fs::read(e.path()) {
                Ok(c) => Some(c),
                Err(_) => continue,
            }
        } else {
            None
        };
        entries.push(DirEntry {
            name,
            content,
            mode: meta.permissions().mode() & 0o7777,
        });
    }
    Ok(DirSnapshot { entries })
}

/// Whether the runtime (by `interlock_protocol::confdir::load`) loads a config from `dir`
/// that runs exactly `entry`: `Ok(file name)`, or why not.
pub fn effective_with_entry(
    dir: &Path,
    cfg: &AgentConfig,
    entry: &serde_json::Map<String, serde_json::Value>,
) -> Result<String, String> {
    use interlock_protocol::confdir::{self, Runtime};
    let runtime = match cfg.runtime {
        crate::view::RuntimeKind::Containerd => Runtime::Containerd,
        crate::view::RuntimeKind::Crio => Runtime::Crio,
    };
    let eff = confdir::load(dir, runtime, &cfg.bin_dirs)
        .map_err(|e| format!("cannot load {}: {e}", dir.display()))?;
    let Some(chosen) = eff.chosen else {
        return Err(eff.summary);
    };
    let name = chosen
        .path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let want = serde_json::Value::Object(entry.clone());
    // A thin Multus config runs us inside its first inline delegate.
    let in_delegate = chosen
        .list
        .plugins()
        .first()
        .and_then(|p| {
            p.get("delegates")?
                .as_array()?
                .first()?
                .get("plugins")?
                .as_array()
        })
        .is_some_and(|p| p.contains(&want));
    if chosen.list.plugins().contains(&want) || in_delegate {
        // interlock-cni refuses a cniVersion it does not know (no version: 0.1.0).
        let version = if chosen.list.plugins().contains(&want) {
            chosen.list.cni_version_raw().unwrap_or("").to_string()
        } else {
            let meta = chosen.list.plugins().first();
            meta.and_then(|m| m.get("delegates")?.as_array()?.first()?.get("cniVersion"))
                .or_else(|| meta.and_then(|m| m.get("cniVersion")))
                .and_then(serde_json::Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        if version.parse::<interlock_protocol::CniVersion>().is_err() {
            return Err(format!(
                "the effective config {name} runs interlock-cni with cniVersion {}, which it \
                 refuses (it accepts {})",
                if version.is_empty() {
                    "none (meaning 0.1.0)"
                } else {
                    &version
                },
                interlock_protocol::CniVersion::all_strings().join(", ")
            ));
        }
        Ok(name)
    } else if chosen.list.plugin_types().contains(&plan::PLUGIN_TYPE) {
        Err(format!(
            "the effective config {name} has an interlock-cni entry that differs from ours"
        ))
    } else {
        Err(format!(
            "the effective config {name} does not contain interlock-cni"
        ))
    }
}

/// Executes one action in `dir`.
pub fn apply(dir: &Path, a: &Action) -> std::io::Result<()> {
    match a {
        Action::Write { name, bytes, mode } => {
            write_file_atomic(&dir.join(name), bytes, Some(*mode))
        }
        Action::Rename { from, to } => {
            std::fs::rename(dir.join(from), dir.join(to))?;
            std::fs::File::open(dir)?.sync_all()
        }
        Action::Remove { name } => match std::fs::remove_file(dir.join(name)) {
            Ok(()) => std::fs::File::open(dir)?.sync_all(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        },
    }
}

/// A readable description of an action for the log.
pub fn describe(a: &Action) -> String {
    match a {
        Action::Write { name, bytes, .. } => format!("wrote {name} ({} bytes)", bytes.len()),
        Action::Rename { from, to } => format!("renamed {from} to {to}"),
        Action::Remove { name } => format!("removed {name}"),
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
    fights: FightTracker,
    binary_problem: Option<String>,
    retry_at: Option<Instant>,
    retries: u32,
    /// Readiness as last logged and written to the marker.
    published: Option<Readiness>,
    last_marker: Option<Instant>,
}

impl Guard {
    /// A guard for `cfg` installing the binary from `installer`.
    pub fn new(cfg: AgentConfig, installer: PluginInstaller, shared: Arc<Shared>) -> Guard {
        Guard {
            settings: cfg.settings(),
            fights: FightTracker::new(cfg.conflict_window, cfg.conflict_threshold),
            cfg,
            installer,
            versions: VersionCache::default(),
            shared,
            left: HashMap::new(),
            binary_problem: None,
            retry_at: None,
            retries: 0,
            published: None,
            last_marker: None,
        }
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

    fn facts(&mut self, snap: &DirSnapshot) -> Facts {
        let mut facts = Facts::default();
        let mut types: Vec<String> = vec![];
        for c in snap.candidates() {
            if let Ok(p) = &c.parsed {
                types.extend(p.plugin_types());
            }
            if let Ok(p) = &c.parsed {
                if let Some(ds) = p.original.get("delegates").and_then(|d| d.as_array()) {
                    for d in ds {
                        if let Some(ps) = d.get("plugins").and_then(|p| p.as_array()) {
                            types.extend(
                                ps.iter()
                                    .filter_map(|p| p.get("type")?.as_str().map(str::to_string)),
                            );
                        }
                    }
                }
            }
        }
        // Our own plugin is in every list we write, whether or not a file has it yet.
        types.push(plan::PLUGIN_TYPE.to_string());
        types.sort();
        types.dedup();
        for t in types {
            if t == plan::PLUGIN_TYPE {
                facts.present_types.insert(t.clone());
                facts.versions.insert(t, self.installer.versions().to_vec());
                continue;
            }
            if let Some(bin) = find_plugin(&self.cfg.bin_dirs, &t) {
                facts.present_types.insert(t.clone());
                if let Ok(v) = self.versions.get(&bin) {
                    facts.versions.insert(t, v);
                }
            }
        }
        facts
    }

    /// One reconcile: converge the conf dir, then decide readiness. `full` also re-hashes
    /// the installed binaries.
    pub fn reconcile(&mut self, bins: bool, full: bool) {
        let started = Instant::now();
        self.shared.reconciles.inc();
        if bins || full {
            self.check_binaries(full);
        }
        let dir = self.cfg.conf_dir.clone();
        let snap = match snapshot(&dir) {
            Ok(s) => s,
            Err(e) => {
                self.set_ready(
                    false,
                    format!("cannot read conf dir {}: {e}", dir.display()),
                    None,
                );
                self.schedule_retry();
                return;
            }
        };
        let facts = self.facts(&snap);
        let plan = plan::plan(&snap, &self.settings, &facts);
        let now = Instant::now();
        let mut blocked: Option<String> = None;
        for a in &plan.actions {
            let f = a.file();
            if let Some(expected) = self.left.get(f) {
                let entry = snap.get(f);
                let current = entry.map(|e| e.content.as_deref().unwrap_or_default());
                // An undo is someone else taking interlock out of a file we fixed. A file
                // that changed but still carries our entry (a twin agent, a primary update
                // we already followed) is not a fight.
                let still_ours = current.is_some_and(|c| {
                    parse_candidate(f, c)
                        .is_ok_and(|p| plan::contains_entry(&p, &self.settings.entry))
                });
                if current != expected.as_deref() && !still_ours && !self.fights.in_backoff(f, now)
                {
                    match self.fights.record_undo(f, now) {
                        Verdict::Repair => {}
                        Verdict::BackOff(d) => warn!(
                            "{} in {} keeps being rewritten by another writer, undoing interlock's change; \
                             backing off for {d:?} and reporting not ready. Find the other writer \
                             (another CNI installer or a second interlock with different flags)",
                            f,
                            dir.display()
                        ),
                    }
                }
            }
            if self.fights.in_backoff(f, now) && blocked.is_none() {
                blocked = Some(f.to_string());
            }
        }
        let mut changed = false;
        if blocked.is_none() && !plan.actions.is_empty() {
            // The runtime would load a config without us right now: /readyz says so for
            // the duration of the repair (not logged, not marked: it lasts milliseconds).
            if let Err(e) = plan::check_effective(&snap, &self.settings, &facts) {
                if self.shared.readiness().ready {
                    self.shared.set_readiness(Readiness {
                        ready: false,
                        reason: format!("repairing: {e}"),
                        effective: None,
                    });
                }
            }
        }
        if blocked.is_none() {
            for a in &plan.actions {
                match apply(&dir, a) {
                    Ok(()) => {
                        changed = true;
                        self.shared.writes.inc();
                        self.left
                            .insert(a.file().to_string(), a.leaves().map(<[u8]>::to_vec));
                        if let Action::Rename { to, .. } = a {
                            self.left.remove(to);
                        }
                        info!("{} in {}", describe(a), dir.display());
                    }
                    Err(e) => {
                        self.shared.errors.inc();
                        error!("{} in {} failed: {e}; retrying", describe(a), dir.display());
                        self.schedule_retry();
                        break;
                    }
                }
            }
        }
        if changed {
            self.shared.repairs.inc();
            self.shared.observe_repair(started.elapsed().as_secs_f64());
        } else if blocked.is_none() && plan.actions.is_empty() {
            self.retries = 0;
        }
        self.publish_conflicts(now);
        // Readiness from the directory as it is now, judged by the reference loader
        // (`interlock_protocol::confdir`, the same code `interlock check` uses).
        let verdict = effective_with_entry(&dir, &self.cfg, &self.settings.entry);
        let backing: Vec<String> = self
            .fights
            .backing_off(now)
            .into_iter()
            .map(|(f, _)| f)
            .collect();
        let (ready, reason, effective) = match (&verdict, &self.binary_problem, backing.is_empty())
        {
            (_, _, false) => (
                false,
                format!(
                    "backing off: another writer keeps rewriting {} in {}",
                    backing.join(", "),
                    dir.display()
                ),
                verdict.as_ref().ok().cloned(),
            ),
            (Err(e), _, _) => (
                false,
                match &plan.problem {
                    Some(p) => format!("{e}: {p}"),
                    None => e.clone(),
                },
                None,
            ),
            (Ok(_), _, _) if plan.blocks_ready => (
                false,
                plan.problem.clone().unwrap_or_default(),
                verdict.as_ref().ok().cloned(),
            ),
            (Ok(_), Some(b), _) => (
                false,
                format!("plugin binary not verified: {b}"),
                verdict.as_ref().ok().cloned(),
            ),
            (Ok(n), None, true) => (true, "ok".to_string(), Some(n.clone())),
        };
        self.set_ready(ready, reason, effective);
    }

    fn publish_conflicts(&self, now: Instant) {
        let backing: Vec<String> = self
            .fights
            .backing_off(now)
            .into_iter()
            .map(|(f, _)| f)
            .collect();
        self.shared.set_conflicts(
            self.fights
                .undo_counts()
                .into_iter()
                .map(|(file, undos, _trips)| FileConflict {
                    backing_off: backing.contains(&file),
                    file,
                    undos,
                })
                .collect(),
        );
    }

    fn schedule_retry(&mut self) {
        let d = Duration::from_millis(10u64 << self.retries.min(7));
        self.retries = self.retries.saturating_add(1);
        self.retry_at = Some(Instant::now() + d);
    }

    fn set_ready(&mut self, ready: bool, reason: String, effective: Option<String>) {
        let r = Readiness {
            ready,
            reason,
            effective,
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
            if let Some((_, until)) = self
                .fights
                .backing_off(now)
                .into_iter()
                .min_by_key(|(_, t)| *t)
            {
                deadline = deadline.min(until);
            }
            let wait = deadline.saturating_duration_since(now);
            let (mut conf, mut bins) = (false, false);
            match rx.recv_timeout(wait) {
                Ok(Wake::Stop) | Err(RecvTimeoutError::Disconnected) => break,
                Ok(Wake::Conf) => conf = true,
                Ok(Wake::Bin) => bins = true,
                Err(RecvTimeoutError::Timeout) => {}
            }
            // Coalesce whatever else is queued.
            let mut stop = false;
            while let Ok(w) = rx.try_recv() {
                match w {
                    Wake::Stop => stop = true,
                    Wake::Conf => conf = true,
                    Wake::Bin => bins = true,
                }
            }
            if stop {
                break;
            }
            let now = Instant::now();
            let full = now >= next_resync;
            if full {
                next_resync = now + self.cfg.resync_interval;
                self.shared.resyncs.inc();
            }
            let retry = self.retry_at.is_some_and(|r| now >= r);
            if retry {
                self.retry_at = None;
                bins |= self.binary_problem.is_some();
            }
            let backoff_ended = !self.fights.backing_off(now).is_empty()
                || self.shared.readiness().reason.starts_with("backing off");
            if conf || bins || full || retry || backoff_ended {
                self.reconcile(bins, full);
            }
            if self.last_marker.map_or(true, |t| t.elapsed() >= heartbeat) {
                self.write_marker();
            }
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
    use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask};
    let mut ino = Inotify::init()?;
    let mask = WatchMask::CREATE
        | WatchMask::DELETE
        | WatchMask::MODIFY
        | WatchMask::CLOSE_WRITE
        | WatchMask::MOVED_TO
        | WatchMask::MOVED_FROM
        | WatchMask::ATTRIB
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF;
    // (directory, its watch, true for the conf dir)
    let mut watched: Vec<(PathBuf, Option<WatchDescriptor>, bool)> = vec![];
    watched.push((
        conf_dir.to_path_buf(),
        Some(ino.watches().add(conf_dir, mask)?),
        true,
    ));
    for b in bin_dirs {
        watched.push((b.clone(), Some(ino.watches().add(b, mask)?), false));
    }
    std::thread::Builder::new()
        .name("interlock-watch".into())
        .spawn(move || {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                // Re-watch directories that went away, once they are back.
                let mut lost = false;
                for (path, wd, is_conf) in watched.iter_mut() {
                    if wd.is_none() {
                        match ino.watches().add(&*path, mask) {
                            Ok(w) => {
                                info!("watching {} again", path.display());
                                *wd = Some(w);
                                let wake = if *is_conf { Wake::Conf } else { Wake::Bin };
                                if tx.send(wake).is_err() {
                                    return;
                                }
                            }
                            Err(_) => lost = true,
                        }
                    }
                }
                let events = if lost {
                    // Poll while a directory is missing (the resync covers the gap).
                    std::thread::sleep(Duration::from_millis(100));
                    match ino.read_events(&mut buf) {
                        Ok(ev) => ev,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                        Err(e) => {
                            error!("inotify read failed: {e}; relying on periodic resync");
                            return;
                        }
                    }
                } else {
                    match ino.read_events_blocking(&mut buf) {
                        Ok(ev) => ev,
                        Err(e) => {
                            error!("inotify read failed: {e}; relying on periodic resync");
                            return;
                        }
                    }
                };
                let (mut conf, mut bin) = (false, false);
                for ev in events {
                    let Some(entry) = watched
                        .iter_mut()
                        .find(|(_, wd, _)| wd.as_ref() == Some(&ev.wd))
                    else {
                        continue;
                    };
                    if ev.mask.intersects(
                        EventMask::IGNORED | EventMask::DELETE_SELF | EventMask::MOVE_SELF,
                    ) {
                        warn!(
                            "{} was removed or moved; watching for it to come back",
                            entry.0.display()
                        );
                        if ev.mask.contains(EventMask::MOVE_SELF) {
                            let _ = ino.watches().remove(ev.wd.clone());
                        }
                        entry.1 = None;
                    }
                    // Temp files come and go on every atomic write: the rename that
                    // follows is what matters.
                    if ev
                        .name
                        .is_some_and(|n| n.to_string_lossy().ends_with(".tmp"))
                    {
                        continue;
                    }
                    if entry.2 {
                        conf = true;
                    } else {
                        bin = true;
                    }
                }
                if (conf && tx.send(Wake::Conf).is_err()) || (bin && tx.send(Wake::Bin).is_err()) {
                    return;
                }
            }
        })?;
    Ok(())
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

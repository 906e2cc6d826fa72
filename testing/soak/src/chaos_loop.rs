//! The chaos loop: applies the plan's steps to a real node and undoes them, logging each
//! as a [`ChaosSpan`]; and the poller that records when the agent answered ready.
//!
//! Config changes are done as the writers they imitate do them: a primary that rewrites
//! its file renders it afresh (temp file and rename, every foreign entry dropped), a
//! second writer drops its own file in. What needs a process (the agent, containerd) goes
//! through [`NodeOps`].

use std::fs;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::chaos::{ChaosKind, ChaosPlan, ChaosStep, Variant};
use crate::checker::Clock;
use crate::ledger::{ChaosSpan, Ms};
use crate::sentinel::SentinelOutcome;

/// The name the primary writes (where Calico's sorts).
pub const PRIMARY: &str = "10-calico.conflist";
/// The installed plugin's file name in the bin dir.
pub const PLUGIN: &str = "interlock-cni";
/// How often a rewriting primary renders its file again during a rewrite step.
const REWRITE_EVERY: Duration = Duration::from_millis(25);
/// How long the agent may take to put a deleted plugin binary back before the loop
/// counts it as not reinstalled.
const REINSTALL_PATIENCE: Duration = Duration::from_secs(5);

/// What the chaos loop does to processes.
pub trait NodeOps: Send {
    /// SIGKILLs the agent (no cleanup of its own).
    fn kill_agent(&mut self) -> Result<(), String>;
    /// Starts a new agent (does not wait for it to be ready).
    fn start_agent(&mut self) -> Result<(), String>;
    /// Stops containerd and starts it again on the same state; returns once CRI answers.
    fn restart_containerd(&mut self) -> Result<(), String>;
    /// SIGTERMs the agent and waits for it to exit, as a rollout stops a pod.
    fn stop_agent(&mut self) -> Result<(), String>;
    /// Starts the agent of the other build (`other`) or of this one, from an image that
    /// holds that build's plugin, and waits until it answers ready (an error when it
    /// does not within its patience).
    fn start_build(&mut self, other: bool) -> Result<(), String>;
    /// Plants sentinel number `seq` ([`ChaosKind::Sentinel`]) and waits for what the API
    /// must show about it; leaves an agent running and the sentinel removed.
    fn sentinel(&mut self, seq: u32) -> Result<SentinelOutcome, String>;
    /// Guard mode: stops the mesh's installer, with SIGKILL (`kill`, no cleanup) or
    /// SIGTERM (its cleanup runs), and waits for it to exit.
    fn stop_installer(&mut self, kill: bool) -> Result<(), String> {
        let _ = kill;
        Err("no mesh installer on this node (not guard mode)".into())
    }
    /// Guard mode: starts a new installer of the mesh.
    fn start_installer(&mut self) -> Result<(), String> {
        Err("no mesh installer on this node (not guard mode)".into())
    }
    /// Between steps: restarts an installer that exited on its own (kuma-cni's does
    /// after a failed check, and the kubelet restarts it).
    fn tend(&mut self) {}
}

/// The files the chaos loop plays with.
#[derive(Debug, Clone)]
pub struct NodeFiles {
    /// The runtime's CNI conf dir.
    pub conf_dir: PathBuf,
    /// The runtime's CNI bin dir (where the agent installs the plugin).
    pub bin_dir: PathBuf,
    /// The primary's config as the primary renders it (no foreign entries).
    pub primary: Value,
    /// Guard mode: the guarded mesh's plugin binary name (its `type`) in the bin dir.
    pub mesh_plugin: Option<String>,
}

impl NodeFiles {
    fn path(&self, name: &str) -> PathBuf {
        self.conf_dir.join(name)
    }

    /// Writes `value` as `name` the way a DaemonSet does: temp file, then rename.
    fn render(&self, name: &str, value: &Value) -> io::Result<()> {
        let tmp = self.path(&format!(".{name}.soak.tmp"));
        fs::write(&tmp, serde_json::to_vec_pretty(value)?)?;
        fs::rename(&tmp, self.path(name))
    }

    /// The primary with a changed field (as a restart that renders a new generation).
    fn rerendered(&self, generation: u32) -> Value {
        let mut v = self.primary.clone();
        if let Some(plugins) = v.get_mut("plugins").and_then(Value::as_array_mut) {
            if let Some(first) = plugins.first_mut().and_then(Value::as_object_mut) {
                first.insert("mtu".into(), Value::from(1400 + (generation % 50)));
            }
        }
        v
    }

    /// The plugin binary's path.
    pub fn plugin(&self) -> PathBuf {
        self.bin_dir.join(PLUGIN)
    }
}

/// The name a second writer uses for a config sorting ahead.
pub fn ahead_name(variant: Variant) -> &'static str {
    match variant {
        // Before the agent's usual `00-interlock.conflist`.
        Variant::AheadOfOwned => "00-aws.conflist",
        // After it, before the primary.
        _ => "05-cilium.conflist",
    }
}

/// Where a renamed primary goes.
pub fn renamed_name(variant: Variant) -> String {
    match variant {
        // Runtimes ignore other extensions: the primary is gone for them.
        Variant::RenameAway => format!("{PRIMARY}.disabled"),
        _ => "90-calico.conflist".to_string(),
    }
}

/// What the chaos loop did.
#[derive(Debug, Default, Clone)]
pub struct ChaosLog {
    /// Every step, in order.
    pub spans: Vec<ChaosSpan>,
    /// Time the agent took to put a deleted plugin back, per deletion (`None`: it did
    /// not within the patience).
    pub plugin_reinstall_ms: Vec<Option<Ms>>,
    /// Steps that could not be done or undone, in words.
    pub errors: Vec<String>,
    /// Every sentinel planted.
    pub sentinels: Vec<SentinelOutcome>,
}

/// The running chaos loop; [`ChaosLoop::stop`] finishes (and undoes) the current step.
pub struct ChaosLoop<N: NodeOps + 'static> {
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<ChaosLog>>,
    thread: Option<JoinHandle<N>>,
}

impl<N: NodeOps + 'static> ChaosLoop<N> {
    /// Starts applying `plan` to the node on a thread of its own.
    pub fn start(
        mut node: N,
        files: NodeFiles,
        mut plan: ChaosPlan,
        clock: Clock,
    ) -> io::Result<ChaosLoop<N>> {
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(ChaosLog::default()));
        let (st, lg) = (stop.clone(), log.clone());
        let thread = std::thread::Builder::new()
            .name("soak-chaos".into())
            .spawn(move || {
                let mut seq = 0u32;
                while !st.load(Ordering::SeqCst) {
                    let Some(step) = plan.next() else {
                        sleep_unless(&st, Duration::from_millis(200));
                        continue;
                    };
                    node.tend();
                    if !sleep_unless(&st, step.gap) {
                        break;
                    }
                    node.tend();
                    seq += 1;
                    apply(&mut node, &files, step, seq, &clock, &lg, &st);
                }
                node
            })?;
        Ok(ChaosLoop {
            stop,
            log,
            thread: Some(thread),
        })
    }

    /// What happened so far.
    pub fn log(&self) -> ChaosLog {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Stops after the current step was undone; hands the node back.
    pub fn stop(mut self) -> (N, ChaosLog) {
        self.stop.store(true, Ordering::SeqCst);
        let node = self
            .thread
            .take()
            .expect("joined once")
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e));
        let log = self.log();
        (node, log)
    }
}

/// Sleeps `d` in slices; false when asked to stop meanwhile.
fn sleep_unless(stop: &AtomicBool, d: Duration) -> bool {
    let end = Instant::now() + d;
    while Instant::now() < end {
        if stop.load(Ordering::SeqCst) {
            return false;
        }
        std::thread::sleep(
            Duration::from_millis(20).min(end.saturating_duration_since(Instant::now())),
        );
    }
    true
}

fn apply<N: NodeOps>(
    node: &mut N,
    files: &NodeFiles,
    step: ChaosStep,
    seq: u32,
    clock: &Clock,
    log: &Mutex<ChaosLog>,
    stop: &AtomicBool,
) {
    let lock = || log.lock().unwrap_or_else(|e| e.into_inner());
    let index = {
        let mut l = lock();
        l.spans.push(ChaosSpan {
            seq,
            kind: step.kind,
            variant: step.variant,
            start_ms: clock.now_ms(),
            undone_ms: None,
        });
        l.spans.len() - 1
    };
    let mut errors = Vec::new();
    let mut note = |what: &str, r: Result<(), String>| {
        if let Err(e) = r {
            errors.push(format!("#{seq} {} ({what}): {e}", step.kind));
        }
    };
    let io = |r: io::Result<()>| r.map_err(|e| e.to_string());
    // Holds are not cut short by a stop: every change is undone as planned.
    let hold = || std::thread::sleep(step.hold);
    match step.kind {
        ChaosKind::AgentKill => {
            note("kill", node.kill_agent());
            hold();
            note("start", node.start_agent());
        }
        ChaosKind::PrimaryRewrite => {
            // A primary stuck in a restart loop: a fresh render every REWRITE_EVERY for
            // the hold, each dropping whatever the agent put back.
            let end = Instant::now() + step.hold;
            let mut generation = seq;
            while Instant::now() < end {
                note(
                    "rewrite",
                    io(files.render(PRIMARY, &files.rerendered(generation))),
                );
                generation = generation.wrapping_add(1);
                std::thread::sleep(REWRITE_EVERY);
            }
            note("restore", io(files.render(PRIMARY, &files.primary)));
        }
        ChaosKind::PrimaryRename => {
            let to = renamed_name(step.variant);
            note(
                "rename",
                io(fs::rename(files.path(PRIMARY), files.path(&to))),
            );
            hold();
            // Back as it was (with whatever the agent did to it meanwhile); a primary
            // that vanished is rendered afresh.
            let back = fs::rename(files.path(&to), files.path(PRIMARY))
                .or_else(|_| files.render(PRIMARY, &files.primary));
            note("rename back", io(back));
        }
        ChaosKind::PrimaryDelete => {
            note("delete", io(fs::remove_file(files.path(PRIMARY))));
            hold();
            note("restore", io(files.render(PRIMARY, &files.primary)));
        }
        ChaosKind::ConfigAhead => {
            let name = ahead_name(step.variant);
            note("add", io(files.render(name, &files.primary)));
            hold();
            note("remove", io(fs::remove_file(files.path(name))));
        }
        ChaosKind::PluginDelete => {
            let plugin = files.plugin();
            let t0 = Instant::now();
            note("delete", io(fs::remove_file(&plugin)));
            let back = wait_for_file(&plugin, REINSTALL_PATIENCE.max(step.hold), stop);
            lock()
                .plugin_reinstall_ms
                .push(back.then(|| t0.elapsed().as_millis() as Ms));
            if !back {
                note(
                    "reinstall",
                    Err(format!(
                        "the agent did not put {} back within {:?}",
                        plugin.display(),
                        REINSTALL_PATIENCE
                    )),
                );
            }
        }
        ChaosKind::ContainerdRestart => {
            note("restart", node.restart_containerd());
        }
        ChaosKind::Sentinel => match node.sentinel(seq) {
            Ok(outcome) => lock().sentinels.push(outcome),
            Err(e) => note("sentinel", Err(e)),
        },
        ChaosKind::InstallerRestart | ChaosKind::InstallerKill => {
            let kill = step.kind == ChaosKind::InstallerKill;
            note("stop", node.stop_installer(kill));
            hold();
            note("start", node.start_installer());
        }
        ChaosKind::TBinaryDelete => match &files.mesh_plugin {
            Some(t) => {
                note("delete", io(fs::remove_file(files.bin_dir.join(t))));
                hold();
                // The installer copies the binary when it starts.
                note("stop", node.stop_installer(false));
                note("start", node.start_installer());
            }
            None => note("delete", Err("no mesh plugin on this node".into())),
        },
        ChaosKind::Upgrade | ChaosKind::UpgradeContainerdRestart => {
            // To the other build, then back: each a rollout step with a gap of the hold.
            for other in [true, false] {
                note("stop", node.stop_agent());
                if step.kind == ChaosKind::UpgradeContainerdRestart {
                    note("containerd restart", node.restart_containerd());
                }
                hold();
                let what = if other { "upgrade" } else { "back" };
                note(what, node.start_build(other));
                if other {
                    hold();
                }
            }
        }
    }
    let mut l = lock();
    l.spans[index].undone_ms = Some(clock.now_ms());
    l.errors.extend(errors);
}

fn wait_for_file(path: &Path, within: Duration, stop: &AtomicBool) -> bool {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if path.exists() {
            return true;
        }
        if stop.load(Ordering::SeqCst) && Instant::now() + Duration::from_secs(1) > end {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    path.exists()
}

/// Where the current agent serves `/readyz` (each agent gets a port of its own).
pub type HealthAddr = Arc<Mutex<Option<SocketAddr>>>;

/// Stretches during which the agent answered ready: `(from, until)`, `until` `None`
/// while it still does.
pub type ReadyStretches = Vec<(Ms, Option<Ms>)>;

/// Polls the agent's `/readyz` and records the stretches it answered 200.
pub struct ReadinessPoller {
    stop: Arc<AtomicBool>,
    ready: Arc<Mutex<ReadyStretches>>,
    thread: Option<JoinHandle<()>>,
}

impl ReadinessPoller {
    /// Starts polling the agent at `addr` (none while no agent runs) every `period`.
    pub fn start(addr: HealthAddr, period: Duration, clock: Clock) -> io::Result<ReadinessPoller> {
        let stop = Arc::new(AtomicBool::new(false));
        let ready = Arc::new(Mutex::new(Vec::new()));
        let (st, rd) = (stop.clone(), ready.clone());
        let thread = std::thread::Builder::new()
            .name("soak-readyz".into())
            .spawn(move || {
                while !st.load(Ordering::SeqCst) {
                    let now = clock.now_ms();
                    let current = *addr.lock().unwrap_or_else(|e| e.into_inner());
                    let is_ready = current.is_some_and(|a| {
                        interlock_testkit::http::get(a, "/readyz", Duration::from_millis(200))
                            .is_some_and(|(code, _)| code == 200)
                    });
                    let mut r = rd.lock().unwrap_or_else(|e| e.into_inner());
                    let open = matches!(r.last(), Some((_, None)));
                    match (is_ready, open) {
                        (true, false) => r.push((now, None)),
                        (false, true) => {
                            if let Some(last) = r.last_mut() {
                                last.1 = Some(now);
                            }
                        }
                        _ => {}
                    }
                    drop(r);
                    std::thread::sleep(period);
                }
            })?;
        Ok(ReadinessPoller {
            stop,
            ready,
            thread: Some(thread),
        })
    }

    /// True when the last poll found the agent ready.
    pub fn is_ready(&self) -> bool {
        matches!(
            self.ready.lock().unwrap_or_else(|e| e.into_inner()).last(),
            Some((_, None))
        )
    }

    /// Stops polling; returns the ready stretches.
    pub fn stop(mut self) -> ReadyStretches {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        std::mem::take(&mut *self.ready.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Drop for ReadinessPoller {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chaos::ChaosTiming;
    use serde_json::json;

    /// Records what it was asked to do.
    #[derive(Default)]
    struct Recorder {
        calls: Vec<&'static str>,
    }

    impl NodeOps for Recorder {
        fn kill_agent(&mut self) -> Result<(), String> {
            self.calls.push("kill");
            Ok(())
        }
        fn start_agent(&mut self) -> Result<(), String> {
            self.calls.push("start");
            Ok(())
        }
        fn restart_containerd(&mut self) -> Result<(), String> {
            self.calls.push("restart");
            Err("no containerd here".into())
        }
        fn stop_agent(&mut self) -> Result<(), String> {
            self.calls.push("stop");
            Ok(())
        }
        fn start_build(&mut self, other: bool) -> Result<(), String> {
            self.calls
                .push(if other { "start other" } else { "start this" });
            Ok(())
        }
        fn sentinel(&mut self, seq: u32) -> Result<SentinelOutcome, String> {
            self.calls.push("sentinel");
            Ok(SentinelOutcome {
                pod: format!("default/sentinel{seq}"),
                ..SentinelOutcome::default()
            })
        }
        fn stop_installer(&mut self, kill: bool) -> Result<(), String> {
            self.calls.push(if kill {
                "installer kill"
            } else {
                "installer term"
            });
            Ok(())
        }
        fn start_installer(&mut self) -> Result<(), String> {
            self.calls.push("installer start");
            Ok(())
        }
    }

    fn files(dir: &Path) -> NodeFiles {
        let conf_dir = dir.join("net.d");
        let bin_dir = dir.join("bin");
        fs::create_dir_all(&conf_dir).unwrap();
        fs::create_dir_all(&bin_dir).unwrap();
        NodeFiles {
            conf_dir,
            bin_dir,
            primary: json!({"cniVersion": "0.3.1", "name": "k", "plugins": [{"type": "bridge"}]}),
            mesh_plugin: Some("istio-cni".into()),
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    fn step(kind: ChaosKind, variant: Variant) -> ChaosStep {
        ChaosStep {
            kind,
            variant,
            gap: Duration::ZERO,
            hold: Duration::from_millis(30),
        }
    }

    #[test]
    fn every_config_step_leaves_the_pristine_primary_and_nothing_else() {
        let tmp = tempfile_dir();
        let f = files(tmp.path());
        let clock = Clock::start();
        let cases = [
            (ChaosKind::PrimaryRewrite, Variant::Plain),
            (ChaosKind::PrimaryRename, Variant::RenameAway),
            (ChaosKind::PrimaryRename, Variant::RenameLater),
            (ChaosKind::PrimaryDelete, Variant::Plain),
            (ChaosKind::ConfigAhead, Variant::AheadOfOwned),
            (ChaosKind::ConfigAhead, Variant::AheadOfPrimary),
        ];
        for (i, (kind, variant)) in cases.into_iter().enumerate() {
            f.render(PRIMARY, &f.primary).unwrap();
            let log = Mutex::new(ChaosLog::default());
            let mut node = Recorder::default();
            apply(
                &mut node,
                &f,
                step(kind, variant),
                i as u32 + 1,
                &clock,
                &log,
                &AtomicBool::new(false),
            );
            assert_eq!(
                names(&f.conf_dir),
                vec![PRIMARY.to_string()],
                "{kind} {variant:?}"
            );
            let on_disk: Value =
                serde_json::from_slice(&fs::read(f.path(PRIMARY)).unwrap()).unwrap();
            assert_eq!(on_disk, f.primary, "{kind}");
            let log = log.into_inner().unwrap();
            assert!(log.errors.is_empty(), "{:?}", log.errors);
            let s = &log.spans[0];
            assert!(s.undone_ms.unwrap() >= s.start_ms + 30, "{s:?}");
            assert!(node.calls.is_empty());
        }
    }

    #[test]
    fn a_rewrite_changes_the_file_during_the_hold() {
        let f = files(tempfile_dir().path());
        assert_ne!(f.rerendered(3), f.primary);
        assert_eq!(f.rerendered(3)["plugins"][0]["mtu"], 1403);
    }

    #[test]
    fn process_steps_go_through_the_node_and_their_errors_are_logged() {
        let f = files(tempfile_dir().path());
        let clock = Clock::start();
        let log = Mutex::new(ChaosLog::default());
        let mut node = Recorder::default();
        let stop = AtomicBool::new(false);
        apply(
            &mut node,
            &f,
            step(ChaosKind::AgentKill, Variant::Plain),
            1,
            &clock,
            &log,
            &stop,
        );
        apply(
            &mut node,
            &f,
            step(ChaosKind::ContainerdRestart, Variant::Plain),
            2,
            &clock,
            &log,
            &stop,
        );
        apply(
            &mut node,
            &f,
            step(ChaosKind::Sentinel, Variant::Plain),
            3,
            &clock,
            &log,
            &stop,
        );
        assert_eq!(node.calls, ["kill", "start", "restart", "sentinel"]);
        let log = log.into_inner().unwrap();
        assert_eq!(log.sentinels.len(), 1);
        assert_eq!(log.sentinels[0].pod, "default/sentinel3");
        assert_eq!(log.errors.len(), 1);
        assert!(
            log.errors[0].contains("#2 containerd_restart"),
            "{:?}",
            log.errors
        );
    }

    #[test]
    fn installer_steps_stop_and_start_the_installer_and_a_deleted_binary_goes_first() {
        let tmp = tempfile_dir();
        let f = files(tmp.path());
        let t = f.bin_dir.join("istio-cni");
        fs::write(&t, b"x").unwrap();
        let clock = Clock::start();
        let log = Mutex::new(ChaosLog::default());
        let mut node = Recorder::default();
        let stop = AtomicBool::new(false);
        for (i, kind) in [
            ChaosKind::InstallerRestart,
            ChaosKind::InstallerKill,
            ChaosKind::TBinaryDelete,
        ]
        .into_iter()
        .enumerate()
        {
            apply(
                &mut node,
                &f,
                step(kind, Variant::Plain),
                i as u32 + 1,
                &clock,
                &log,
                &stop,
            );
        }
        assert_eq!(
            node.calls,
            [
                "installer term",
                "installer start",
                "installer kill",
                "installer start",
                "installer term",
                "installer start"
            ]
        );
        // The recorder copies nothing back: the step deleted T's binary.
        assert!(!t.exists());
        let l = log.into_inner().unwrap();
        assert!(l.errors.is_empty(), "{:?}", l.errors);
        assert_eq!(l.spans.len(), 3);
        // Without a guarded mesh there is no binary to delete: an error, not a panic.
        let mut plain = files(tmp.path());
        plain.mesh_plugin = None;
        let log = Mutex::new(ChaosLog::default());
        apply(
            &mut node,
            &plain,
            step(ChaosKind::TBinaryDelete, Variant::Plain),
            4,
            &clock,
            &log,
            &stop,
        );
        let l = log.into_inner().unwrap();
        assert!(l.errors[0].contains("no mesh plugin"), "{:?}", l.errors);
    }

    #[test]
    fn an_upgrade_goes_to_the_other_build_and_back_as_a_rollout() {
        let f = files(tempfile_dir().path());
        let clock = Clock::start();
        let log = Mutex::new(ChaosLog::default());
        let mut node = Recorder::default();
        let stop = AtomicBool::new(false);
        apply(
            &mut node,
            &f,
            step(ChaosKind::Upgrade, Variant::Plain),
            1,
            &clock,
            &log,
            &stop,
        );
        assert_eq!(node.calls, ["stop", "start other", "stop", "start this"]);
        node.calls.clear();
        apply(
            &mut node,
            &f,
            step(ChaosKind::UpgradeContainerdRestart, Variant::Plain),
            2,
            &clock,
            &log,
            &stop,
        );
        assert_eq!(
            node.calls,
            [
                "stop",
                "restart",
                "start other",
                "stop",
                "restart",
                "start this"
            ]
        );
        let log = log.into_inner().unwrap();
        // The recorder's containerd restart fails: both are logged, nothing else.
        assert_eq!(log.errors.len(), 2, "{:?}", log.errors);
        assert!(log.spans.iter().all(|s| s.undone_ms.is_some()));
    }

    #[test]
    fn a_deleted_plugin_put_back_is_timed_and_one_never_put_back_is_an_error() {
        let tmp = tempfile_dir();
        let f = files(tmp.path());
        let clock = Clock::start();
        let log = Mutex::new(ChaosLog::default());
        fs::write(f.plugin(), b"x").unwrap();
        let plugin = f.plugin();
        let restorer = std::thread::spawn(move || {
            while plugin.exists() {
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(40));
            fs::write(&plugin, b"x").unwrap();
        });
        let mut node = Recorder::default();
        apply(
            &mut node,
            &f,
            step(ChaosKind::PluginDelete, Variant::Plain),
            1,
            &clock,
            &log,
            &AtomicBool::new(false),
        );
        restorer.join().unwrap();
        let l = log.lock().unwrap().clone();
        assert!(l.errors.is_empty(), "{:?}", l.errors);
        assert!(
            matches!(l.plugin_reinstall_ms[..], [Some(ms)] if ms >= 40),
            "{l:?}"
        );
        // Nobody puts it back: a stop cuts the wait short, and it is an error.
        apply(
            &mut node,
            &f,
            step(ChaosKind::PluginDelete, Variant::Plain),
            2,
            &clock,
            &log,
            &AtomicBool::new(true),
        );
        let l = log.into_inner().unwrap();
        assert_eq!(l.plugin_reinstall_ms.len(), 2);
        assert_eq!(l.plugin_reinstall_ms[1], None);
        assert!(l.errors[0].contains("did not put"), "{:?}", l.errors);
    }

    #[test]
    fn the_loop_runs_its_plan_and_stops_after_undoing() {
        let tmp = tempfile_dir();
        let f = files(tmp.path());
        f.render(PRIMARY, &f.primary).unwrap();
        let timing = ChaosTiming {
            gap_ms: 1..5,
            hold_ms: 1..5,
        };
        let plan = ChaosPlan::new(9, &[ChaosKind::PrimaryDelete, ChaosKind::AgentKill], timing);
        let chaos = ChaosLoop::start(Recorder::default(), f.clone(), plan, Clock::start()).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let (node, log) = chaos.stop();
        assert!(log.spans.len() >= 4, "{log:?}");
        assert!(log.spans.iter().all(|s| s.undone_ms.is_some()));
        assert!(node.calls.contains(&"kill"));
        assert_eq!(names(&f.conf_dir), vec![PRIMARY.to_string()]);
    }

    fn tempfile_dir() -> interlock_testkit::TempDir {
        interlock_testkit::tempdir().unwrap()
    }
}

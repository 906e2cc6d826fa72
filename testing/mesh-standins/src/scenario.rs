//! The race scenarios on a node in a box (`interlock-testkit-node`: a private containerd
//! with the reference `bridge`/`host-local`/`portmap` primary, the fake Kubernetes API),
//! with a mesh's installer and plugin stand-ins, with or without interlock; every pod's
//! capture proven by a real connection ([`check_capture`]: a listener on the mesh's
//! outbound port inside the pod, a connection as a non-proxy UID to the node).
//!
//! [`run`] plays one [`Scenario`] on a [`MeshBed`] and returns an [`Observation`] per pod:
//! which [`Role`] it had (started while containerd's loaded chain lacked the mesh's plugin,
//! or carried it, or an unmeshed pod) and what happened to it ([`Outcome`]). The caller
//! asserts what it expects: without interlock, the window pods run uncaptured for good;
//! with guard mode (`Interlock::Agent` with `--config-mode guard --guard-mesh <m>`), they
//! must not.
//!
//! Windows are held open on purpose: the installer stand-in is stopped (SIGSTOP) while the
//! primary writes or rewrites its file, and continued afterwards. That is the window every
//! installer has between a primary's write and its own reaction (milliseconds for
//! istio-cni, linkerd-cni and consul-cni, a second plus a restart for kuma-cni), made wide
//! enough that a pod lands in it every time instead of by chance.
//!
//! # With guard mode
//! The bed runs the real binaries (`NodeOptions::new(interlock, interlock-cni)`) and
//! [`run`] takes `Interlock::Agent(AgentArgs::args(&["--config-mode", "guard",
//! "--guard-mesh", "<mesh>"]))`: the agent starts before the first scenario and stays.
//! Then a window is played differently, since the agent's hold refuses meshed pods while
//! the mesh's plugin cannot run: the plain pod starts first, then the meshed window pod
//! is retried as the kubelet retries a sandbox ([`Observation::refusals`]), the window is
//! held open at least [`HOLD`] while the Node's taint is watched ([`Window`]), and only
//! then is it closed (the installer released or started) while the retries go on, so
//! the held pod starts once the plugin is back.
//!
//! [`before_agent`] plays what the hold cannot prevent: a meshed pod that started before
//! the agent existed. The audit restarts it (stops its sandbox over CRI); the bed plays
//! the kubelet and creates its sandbox again, with a new netns.
//!
//! kuma-cni's plugin counts `/install-cni` processes host-wide: never run two Kuma beds
//! (or a Kuma bed and the Kuma plugin tests) at once.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use interlock_contract::guard::GuardedMesh;
use interlock_cri::SandboxConfig;
use interlock_testkit_node::node::{
    check_capture, AgentArgs, Capture, Node, NodeOptions, PrimaryWrite, Sandbox, CHECK_UID,
};

use crate::install::{self, InstallOptions};

/// One of the race scenarios.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// The mesh's installer runs first; the primary writes its file later.
    MeshFirst,
    /// The chain is right; the primary rewrites its file and drops the mesh's entry.
    PrimaryRewrite,
    /// Pods start on the primary's chain before the mesh's installer ever ran.
    PodsBeforeMesh,
    /// The chain is right; the mesh's installer restarts (a DaemonSet rollout): on SIGTERM
    /// it removes its entry and binary, and the new one puts them back.
    InstallerRestart,
}

impl Scenario {
    /// All of them, in the order the tests play them.
    pub const ALL: [Scenario; 4] = [
        Scenario::MeshFirst,
        Scenario::PrimaryRewrite,
        Scenario::PodsBeforeMesh,
        Scenario::InstallerRestart,
    ];
}

/// With or without interlock.
#[derive(Debug, Clone)]
pub enum Interlock {
    /// Only the mesh's own installer and plugin.
    Without,
    /// `interlock agent` on the node with these extra arguments (for guard mode:
    /// `--config-mode guard --guard-mesh <mesh>`), started before the scenario.
    Agent(AgentArgs),
}

/// What a pod was in the scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Meshed, created while containerd's loaded chain lacked the mesh's plugin.
    Window,
    /// Meshed, created while the loaded chain carried the mesh's plugin.
    Control,
    /// Not meshed.
    Plain,
}

/// What happened to a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It runs; the capture check's verdict.
    Started(Capture),
    /// The runtime refused it: the error.
    Refused(String),
}

/// One pod of a scenario, observed once.
#[derive(Debug, Clone)]
pub struct Observation {
    /// The scenario it belongs to.
    pub scenario: Scenario,
    /// What the pod was.
    pub role: Role,
    /// `namespace/name`.
    pub pod: String,
    /// When it was observed: `"at start"` or `"after the entry returned"`.
    pub when: &'static str,
    /// Its network namespace, when it started.
    pub netns: Option<PathBuf>,
    /// Its sandbox ID, when it started.
    pub sandbox: Option<String>,
    /// How many times the runtime refused it before the outcome (with interlock, whose
    /// hold refuses meshed pods while the mesh's plugin cannot run; 0 without).
    pub refusals: u32,
    /// The runtime's last refusal before the outcome, when there was one.
    pub refused_with: Option<String>,
    /// What happened to it.
    pub outcome: Outcome,
}

impl Observation {
    /// True when it runs and its connection reached the mesh's outbound port.
    pub fn captured(&self) -> bool {
        self.outcome == Outcome::Started(Capture::Redirected)
    }

    /// True when it runs and its connection went straight to the destination.
    pub fn uncaptured(&self) -> bool {
        self.outcome == Outcome::Started(Capture::NotRedirected)
    }
}

/// A node in a box with one mesh's stand-ins; see the module docs.
pub struct MeshBed {
    /// The node in a box.
    pub node: Node,
    /// The mesh whose stand-ins run on it.
    pub mesh: GuardedMesh,
    exe: PathBuf,
    opts: InstallOptions,
    installer: Option<Child>,
    held: bool,
    agent: bool,
    starts: u32,
    pods: Vec<Sandbox>,
}

/// Generous: a loaded 2-core machine.
const WAIT: Duration = Duration::from_secs(30);

impl MeshBed {
    /// Starts the node (with the fake API) and prepares `mesh`'s installer from the
    /// stand-in binary `exe`; nothing runs on it yet.
    pub fn start(mesh: GuardedMesh, exe: &Path, options: NodeOptions) -> std::io::Result<MeshBed> {
        let node = Node::start(options.with_kube())?;
        let api = node.api().expect("with_kube").url();
        let run_dir = node.containerd().dir().join("istio-cni-run");
        let opts = InstallOptions {
            mesh,
            conf_dir: node.conf_dir(),
            bin_dir: node.bin_dir(),
            source: exe.to_path_buf(),
            server: api,
            token: format!("{}-cni-token", mesh.as_str()),
            run_dir,
            conf_name: interlock_testkit_node::containerd::PRIMARY_CONFLIST.to_string(),
        };
        Ok(MeshBed {
            node,
            mesh,
            exe: exe.to_path_buf(),
            opts,
            installer: None,
            held: false,
            agent: false,
            starts: 0,
            pods: Vec::new(),
        })
    }

    /// The installer's options (paths the stand-ins use).
    pub fn install_options(&self) -> &InstallOptions {
        &self.opts
    }

    fn log(&self) -> PathBuf {
        self.node
            .containerd()
            .dir()
            .join(format!("install-{}-{}.log", self.mesh, self.starts))
    }

    /// Starts the mesh's installer process.
    pub fn start_installer(&mut self) -> Result<(), String> {
        self.starts += 1;
        let child = install::spawn(&self.exe, &self.opts, &self.log())
            .map_err(|e| format!("start the {} installer: {e}", self.mesh))?;
        self.installer = Some(child);
        Ok(())
    }

    /// SIGTERM to the installer (it cleans up as the real one does) and waits for it.
    pub fn stop_installer(&mut self) {
        self.release_installer();
        if let Some(mut c) = self.installer.take() {
            install::terminate(&mut c, Duration::from_secs(10));
        }
    }

    /// SIGKILL to the installer: no cleanup, so its entry and binary stay (for kuma-cni,
    /// whose plugin then fails every ADD for want of an `/install-cni` process).
    pub fn kill_installer(&mut self) {
        self.release_installer();
        if let Some(mut c) = self.installer.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops the installer process where it is (SIGSTOP): it sees nothing until released.
    pub fn hold_installer(&mut self) {
        if let Some(c) = &self.installer {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGSTOP,
            );
            self.held = true;
        }
    }

    /// Continues a held installer (SIGCONT).
    pub fn release_installer(&mut self) {
        if let (Some(c), true) = (&self.installer, self.held) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGCONT,
            );
        }
        self.held = false;
    }

    /// Restarts an installer that exited (kuma-cni exits after a failed check and the
    /// kubelet restarts it; a 1 s delay stands in for the crash-loop backoff).
    pub fn tend(&mut self) -> Result<(), String> {
        let exited = match &mut self.installer {
            Some(c) => c.try_wait().ok().flatten(),
            None => return Ok(()),
        };
        if exited.is_some() {
            self.installer = None;
            std::thread::sleep(Duration::from_secs(1));
            self.start_installer()?;
        }
        Ok(())
    }

    /// How many times the installer was started.
    pub fn installer_starts(&self) -> u32 {
        self.starts
    }

    /// Waits until containerd's loaded pod network does (`true`) or does not carry the
    /// mesh's plugin, restarting an exited installer meanwhile.
    pub fn wait_chain(&mut self, with_plugin: bool) -> Result<Vec<String>, String> {
        let t = self.mesh.plugin_type();
        let deadline = Instant::now() + WAIT;
        loop {
            self.tend()?;
            let step = Duration::from_millis(500);
            match self.node.wait_loaded_chain(
                |c| !c.is_empty() && c.iter().any(|x| x == t) == with_plugin,
                step,
            ) {
                Ok(c) => return Ok(c),
                Err(e) if Instant::now() > deadline => {
                    return Err(format!("{e}\ninstaller log:\n{}", self.installer_log()))
                }
                Err(_) => {}
            }
        }
    }

    /// Waits for the window: without interlock, until containerd's loaded chain lacks the
    /// mesh's plugin; with interlock (which may answer the change before containerd loads
    /// it, or hold the chain), until containerd has loaded the agent's file: the primary's
    /// plugins and interlock-cni, and with `held` (the agent cannot have the mesh's
    /// plugin: its installer stopped or not yet run) without that plugin, so that a chain
    /// containerd loaded before the scenario does not pass for it.
    pub fn wait_window(&mut self, interlock: &Interlock, held: bool) -> Result<(), String> {
        let t = self.mesh.plugin_type();
        match interlock {
            Interlock::Without => self.wait_chain(false).map(|_| ()),
            Interlock::Agent(_) => self
                .node
                .wait_loaded_chain(
                    |c| {
                        let has = |p: &str| c.iter().any(|x| x == p);
                        has("bridge") && has("interlock-cni") && !(held && has(t))
                    },
                    WAIT,
                )
                .map(|_| ()),
        }
    }

    /// The current installer's output.
    pub fn installer_log(&self) -> String {
        std::fs::read_to_string(self.log()).unwrap_or_default()
    }

    /// A pod's sandbox config: meshed with the mesh's default case's annotations, or plain.
    pub fn pod_config(&self, tag: &str, meshed: bool) -> SandboxConfig {
        let mut config = self.node.pod_config(tag, false);
        if meshed {
            let case = interlock_mesh_cases::default_case(
                crate::plugin::mesh_of(self.mesh.plugin_type()).expect("a mesh"),
            );
            for (k, v) in case.annotations {
                config = config.annotation(&k, &v);
            }
        }
        config
    }

    /// Runs a pod from [`MeshBed::pod_config`]; it is removed at the next reset.
    pub fn run_pod(&mut self, tag: &str, meshed: bool) -> Result<Sandbox, String> {
        let config = self.pod_config(tag, meshed);
        self.run_config(config)
    }

    /// Runs a pod from a config of the caller's; it is removed at the next reset.
    pub fn run_config(&mut self, config: SandboxConfig) -> Result<Sandbox, String> {
        let sb = self.node.run_config(config)?;
        self.pods.push(sb.clone());
        Ok(sb)
    }

    /// The capture check on a pod, at the mesh's outbound port.
    ///
    /// With guard mode the agent's audit probes a meshed pod by a connection of its own
    /// once a listener is on that port, and the check's listener is one: the probe's
    /// connection, redirected too, may reach it first and is reported as landing with
    /// another original destination. The check is then run again (a few times), so a
    /// wrong original destination of the check's own connection still fails it.
    pub fn capture(&self, sb: &Sandbox) -> Capture {
        let Some(n) = &sb.netns else {
            return Capture::NoNetwork;
        };
        let mut tries = 0;
        loop {
            tries += 1;
            let c = check_capture(
                n,
                self.mesh.default_outbound_port(),
                CHECK_UID,
                self.node.gateway(),
            );
            match &c {
                Capture::Failed(why)
                    if tries < 3 && why.starts_with("landed on the proxy port") =>
                {
                    std::thread::sleep(Duration::from_millis(500));
                }
                _ => return c,
            }
        }
    }

    /// Removes every pod, stops the installer (its cleanup runs) and deletes every config
    /// file but the agent's: the node as before a scenario.
    pub fn reset(&mut self) -> Result<(), String> {
        let mut errors = Vec::new();
        for sb in std::mem::take(&mut self.pods) {
            if let Err(e) = self.node.remove_pod(&sb) {
                errors.push(format!("remove {}: {e}", sb.name));
            }
        }
        self.stop_installer();
        // The agent's own file stays: deleting it is a conflict the agent backs off from.
        let mut kept = false;
        for f in crate::files::config_files(&self.node.conf_dir()) {
            if carries_interlock(&f) {
                kept = true;
            } else {
                let _ = std::fs::remove_file(f);
            }
        }
        // With the agent: until containerd has loaded its holding config (no primary, so
        // no `bridge`), lest a chain from before the reset pass for the next scenario's.
        if kept {
            if let Err(e) = self
                .node
                .wait_loaded_chain(|c| !c.is_empty() && !c.iter().any(|x| x == "bridge"), WAIT)
            {
                errors.push(format!("the agent's holding config: {e}"));
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }
}

/// Whether a config file has `interlock-cni` in its plugins (the agent's own file).
fn carries_interlock(path: &Path) -> bool {
    std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v["plugins"].as_array().cloned())
        .is_some_and(|ps| ps.iter().any(|p| p["type"] == "interlock-cni"))
}

impl Drop for MeshBed {
    fn drop(&mut self) {
        self.release_installer();
        if let Some(mut c) = self.installer.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// How long a refused pod is retried with interlock (after its window closed).
const RETRY: Duration = Duration::from_secs(60);

/// With interlock, how long a window is held open at least before it is closed: longer
/// than the agent's 3 s debounce before it taints the node again on a loss.
pub const HOLD: Duration = Duration::from_secs(6);

/// With interlock, the longest a window is held open waiting for the taint.
const HOLD_AT_MOST: Duration = Duration::from_secs(15);

/// What the Node showed around a window held open with interlock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// How long the window was held open before it was closed.
    pub held: Duration,
    /// Whether the Node carried the startup taint at some moment while it was held.
    pub tainted: bool,
    /// Whether `InterlockReady` was `False` at some moment while it was held.
    pub not_ready: bool,
    /// How long after the window closed the taint was gone and `InterlockReady` was
    /// `True` (`None`: not within the wait).
    pub untainted_after: Option<Duration>,
}

/// One scenario as played: each pod observed, and with interlock the window.
#[derive(Debug, Clone)]
pub struct Played {
    /// Every pod, at start and after the entry returned.
    pub observations: Vec<Observation>,
    /// With interlock: what the Node showed around the window.
    pub window: Option<Window>,
}

/// What ends a window: the installer released or started.
type Close = Box<dyn FnOnce(&mut MeshBed) -> Result<(), String>>;

/// The window while it is held open (with interlock).
struct Open {
    since: Instant,
    tainted: bool,
    not_ready: bool,
    close: Option<Close>,
    closed_at: Option<Instant>,
}

impl MeshBed {
    /// Whether the Node carries interlock's startup taint now.
    pub fn tainted(&self) -> bool {
        self.node
            .taints()
            .iter()
            .any(|t| t == interlock_contract::names::TAINT_NOT_READY)
    }

    /// `InterlockReady`'s status now (`None`: not written).
    pub fn interlock_ready(&self) -> Option<String> {
        self.node
            .condition()
            .and_then(|c| c["status"].as_str().map(str::to_string))
    }

    /// Waits until the taint is gone and `InterlockReady` is `True`; how long it took.
    pub fn wait_untainted(&self, timeout: Duration) -> Option<Duration> {
        let begin = Instant::now();
        while begin.elapsed() < timeout {
            if !self.tainted() && self.interlock_ready().as_deref() == Some("True") {
                return Some(begin.elapsed());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        None
    }

    /// Starts the agent once per bed with `args`.
    pub fn ensure_agent(&mut self, args: &AgentArgs) -> Result<(), String> {
        if !self.agent {
            self.node
                .start_agent(args.clone())
                .map_err(|e| format!("start the agent: {e}"))?;
            self.agent = true;
        }
        Ok(())
    }

    /// Stops and removes a sandbox over CRI and keeps its Pod in the API: what the
    /// kubelet does before it creates a stopped pod's sandbox again.
    pub fn remove_sandbox(&mut self, sb: &Sandbox) -> Result<(), String> {
        let cri = self.node.cri();
        let id = sb.id.clone();
        self.node.block_on(async move {
            cri.stop_sandbox(&id).await.map_err(|e| e.to_string())?;
            cri.remove_sandbox(&id).await.map_err(|e| e.to_string())
        })?;
        self.pods.retain(|p| p.id != sb.id);
        Ok(())
    }

    /// Whether the sandbox `id` is still listed and ready.
    pub fn sandbox_ready(&self, id: &str) -> Result<bool, String> {
        Ok(self
            .node
            .sandboxes()?
            .iter()
            .any(|s| s.id == id && s.state == interlock_cri::SandboxState::Ready))
    }
}

struct Recorder<'a> {
    bed: &'a mut MeshBed,
    /// Retry refused pods (with interlock).
    retry: bool,
    scenario: Scenario,
    seen: Vec<Observation>,
    started: Vec<(Role, Option<Sandbox>, String)>,
    open: Option<Open>,
}

impl Recorder<'_> {
    /// Runs a pod and observes it. With interlock the runtime's refusal is retried as the
    /// kubelet retries a sandbox (every second, the same pod each time), while an open
    /// window is held at least [`HOLD`] and then closed, and up to [`RETRY`] after that;
    /// without it, a refusal is the outcome.
    fn pod(&mut self, role: Role, tag: &str) -> Result<(), String> {
        let config = self.bed.pod_config(tag, role != Role::Plain);
        self.pod_from(role, config)
    }

    /// [`Recorder::pod`] with a config of the caller's.
    fn pod_from(&mut self, role: Role, config: SandboxConfig) -> Result<(), String> {
        let began = Instant::now();
        let mut refusals = 0;
        let mut refused_with = None;
        let (sb, outcome) = loop {
            let result = self.bed.run_config(config.clone());
            self.watch_window()?;
            match result {
                Ok(sb) => {
                    let c = self.bed.capture(&sb);
                    break (Some(sb), Outcome::Started(c));
                }
                Err(e) if !self.retry || self.retries_over(began) => {
                    break (None, Outcome::Refused(e))
                }
                Err(e) => {
                    refusals += 1;
                    refused_with = Some(e);
                    std::thread::sleep(Duration::from_secs(1));
                    // The kubelet restarts an installer that exited meanwhile (kuma-cni's,
                    // after a primary's rewrite dropped its entry).
                    self.bed.tend()?;
                }
            }
        };
        let name = format!("{}/{}", config.metadata.namespace, config.metadata.name);
        self.seen.push(Observation {
            scenario: self.scenario,
            role,
            pod: name.clone(),
            when: "at start",
            netns: sb.as_ref().and_then(|s| s.netns.clone()),
            sandbox: sb.as_ref().map(|s| s.id.clone()),
            refusals,
            refused_with,
            outcome,
        });
        self.started.push((role, sb, name));
        Ok(())
    }

    /// Retrying ends [`RETRY`] after the pod's first try and after the window closed;
    /// never while a window is held open (it closes itself, see `watch_window`).
    fn retries_over(&self, began: Instant) -> bool {
        let window_over = match &self.open {
            Some(o) if o.close.is_some() => false,
            Some(o) => o.closed_at.is_none_or(|t| t.elapsed() > RETRY),
            None => true,
        };
        window_over && began.elapsed() > RETRY
    }

    /// Samples the Node while the window is open, and closes it once it was held long
    /// enough ([`HOLD`], and the taint seen or [`HOLD_AT_MOST`] passed).
    fn watch_window(&mut self) -> Result<(), String> {
        let Some(o) = &mut self.open else {
            return Ok(());
        };
        if o.close.is_none() {
            return Ok(());
        }
        o.tainted |= self.bed.tainted();
        o.not_ready |= self.bed.interlock_ready().as_deref() == Some("False");
        let held = o.since.elapsed();
        if held >= HOLD && (o.tainted || held >= HOLD_AT_MOST) {
            self.close_window()?;
        }
        Ok(())
    }

    fn close_window(&mut self) -> Result<(), String> {
        if let Some(o) = &mut self.open {
            if let Some(close) = o.close.take() {
                o.closed_at = Some(Instant::now());
                close(self.bed)?;
            }
        }
        Ok(())
    }

    fn write_primary(&mut self) -> Result<(), String> {
        self.bed
            .node
            .write_primary()
            .map(|_| ())
            .map_err(|e| format!("write the primary: {e}"))
    }

    /// The installer runs and the chain carries its plugin: a control pod.
    fn installed(&mut self) -> Result<(), String> {
        self.bed.start_installer()?;
        self.bed.wait_chain(true)?;
        self.pod(Role::Control, "control")
    }

    /// In the window: a meshed pod and a plain one; `held`: the agent cannot have the
    /// mesh's plugin in it (see [`MeshBed::wait_window`]); `close` ends the window
    /// (releases or starts the installer). Without interlock both run in the window and it closes
    /// after them; with it the plain pod runs first and the window pod's retries hold
    /// the window open (see the module docs).
    fn in_window(
        &mut self,
        interlock: &Interlock,
        held: bool,
        close: impl FnOnce(&mut MeshBed) -> Result<(), String> + 'static,
    ) -> Result<(), String> {
        self.bed.wait_window(interlock, held)?;
        match interlock {
            Interlock::Without => {
                self.pod(Role::Window, "window")?;
                self.pod(Role::Plain, "plain")?;
                close(self.bed)
            }
            Interlock::Agent(_) => {
                self.open = Some(Open {
                    since: Instant::now(),
                    tainted: false,
                    not_ready: false,
                    close: Some(Box::new(close)),
                    closed_at: None,
                });
                self.pod(Role::Plain, "plain")?;
                self.pod(Role::Window, "window")?;
                // Started at once (the agent kept the plugin in the chain): the window
                // was never open.
                self.close_window()
            }
        }
    }

    /// Once the chain carries the plugin again: one more control pod, and every pod
    /// observed again.
    fn after_entry(&mut self, tag: &str) -> Result<(), String> {
        self.bed.wait_chain(true)?;
        self.pod(Role::Control, tag)?;
        self.again();
        Ok(())
    }

    /// Every earlier pod observed again, now that the entry is back.
    fn again(&mut self) {
        for (role, sb, name) in self.started.clone() {
            if let Some(sb) = sb {
                let c = self.bed.capture(&sb);
                self.seen.push(Observation {
                    scenario: self.scenario,
                    role,
                    pod: name,
                    when: "after the entry returned",
                    netns: sb.netns.clone(),
                    sandbox: Some(sb.id.clone()),
                    refusals: 0,
                    refused_with: None,
                    outcome: Outcome::Started(c),
                });
            }
        }
    }

    fn window(&self) -> Option<Window> {
        let o = self.open.as_ref()?;
        let closed = o.closed_at.unwrap_or_else(Instant::now);
        Some(Window {
            held: closed.duration_since(o.since),
            tainted: o.tainted,
            not_ready: o.not_ready,
            untainted_after: None,
        })
    }
}

/// Plays `scenario` on `bed` (reset first) and returns what each pod did; see the module
/// docs. Pods stay until the next [`run`] or [`MeshBed::reset`].
pub fn run(
    bed: &mut MeshBed,
    scenario: Scenario,
    interlock: &Interlock,
) -> Result<Vec<Observation>, String> {
    play(bed, scenario, interlock).map(|p| p.observations)
}

/// [`run`], with what the Node showed around the window (with interlock).
pub fn play(
    bed: &mut MeshBed,
    scenario: Scenario,
    interlock: &Interlock,
) -> Result<Played, String> {
    bed.reset()?;
    if let Interlock::Agent(args) = interlock {
        bed.ensure_agent(args)?;
    }
    let mut r = Recorder {
        retry: matches!(interlock, Interlock::Agent(_)),
        bed,
        scenario,
        seen: Vec::new(),
        started: Vec::new(),
        open: None,
    };
    let release = |b: &mut MeshBed| {
        b.release_installer();
        Ok(())
    };
    let start = |b: &mut MeshBed| b.start_installer();
    match scenario {
        Scenario::MeshFirst => {
            r.bed.start_installer()?;
            r.bed.hold_installer();
            r.write_primary()?;
            r.in_window(interlock, true, release)?;
            r.after_entry("control")?;
        }
        Scenario::PrimaryRewrite => {
            r.write_primary()?;
            r.installed()?;
            r.bed.hold_installer();
            r.bed
                .node
                .rewrite_primary(PrimaryWrite::Rename)
                .map_err(|e| format!("rewrite the primary: {e}"))?;
            r.in_window(interlock, false, release)?;
            r.after_entry("control-after")?;
        }
        Scenario::PodsBeforeMesh => {
            r.write_primary()?;
            r.in_window(interlock, true, start)?;
            r.after_entry("control")?;
        }
        Scenario::InstallerRestart => {
            r.write_primary()?;
            r.installed()?;
            r.bed.stop_installer();
            r.in_window(interlock, true, start)?;
            r.after_entry("control-after")?;
        }
    }
    let mut window = r.window();
    if let Some(w) = &mut window {
        w.untainted_after = r.bed.wait_untainted(WAIT);
    }
    Ok(Played {
        observations: r.seen,
        window,
    })
}

/// A meshed pod that started before the agent existed, and what guard mode did about it;
/// see [`before_agent`].
#[derive(Debug, Clone)]
pub struct Early {
    /// `namespace/name`.
    pub pod: String,
    /// The capture check on it before the agent started.
    pub at_start: Capture,
    /// How long after its sandbox was created it was stopped (the audit's restart).
    pub restarted_after: Option<Duration>,
    /// How long after the agent started it was stopped.
    pub restarted_after_agent: Option<Duration>,
    /// The Events on its pod once the `Restarted` one arrived (reason, note).
    pub events: Vec<(String, String)>,
    /// Its [`interlock_contract::names::LABEL_UNPROTECTED`] label then.
    pub label: Option<String>,
    /// The plain pod started next to it (before the agent).
    pub plain: Observation,
    /// Whether the plain pod's sandbox was still the same and ready at the end.
    pub plain_ready: bool,
    /// Its sandbox created again (the kubelet's part), as a window pod: refused while
    /// the node holds, started once the installer runs.
    pub again: Observation,
    /// What the Node showed while the recreated pod was held.
    pub window: Window,
}

/// How long the audit may take to restart a meshed pod that runs uncaptured: its first
/// pass, one full period (10 s by default) and a slow machine.
pub const AUDIT_BUDGET: Duration = Duration::from_secs(60);

/// Plays a meshed pod (and a plain one) started on the primary's chain before the agent
/// existed, with its proxy listening (so the audit probes it at once): the agent starts,
/// its audit proves the pod uncaptured by a connection and restarts it. Then the bed
/// plays the kubelet: the sandbox is created again, held (refused) while the mesh's
/// plugin cannot run, and started once the mesh's installer runs. Reset first; the pods
/// stay until the next reset.
pub fn before_agent(bed: &mut MeshBed, args: &AgentArgs) -> Result<Early, String> {
    bed.reset()?;
    bed.node
        .write_primary()
        .map_err(|e| format!("write the primary: {e}"))?;
    bed.node.wait_loaded_chain(|c| !c.is_empty(), WAIT)?;
    let created = Instant::now();
    let config = bed.pod_config("early", true);
    let early = bed.run_config(config.clone())?;
    let at_start = bed.capture(&early);
    let netns = early
        .netns
        .clone()
        .ok_or_else(|| format!("{}: no netns", early.name))?;
    let port = bed.mesh.default_outbound_port();
    // The pod's proxy, listening as a sidecar does.
    let proxy = proxy_listener(&netns, port)?;

    let mut r = Recorder {
        retry: true,
        bed,
        scenario: Scenario::PodsBeforeMesh,
        seen: Vec::new(),
        started: Vec::new(),
        open: None,
    };
    r.pod(Role::Plain, "early-plain")?;
    let plain = r.seen.pop().expect("observed");

    let agent_start = Instant::now();
    r.bed.ensure_agent(args)?;
    let deadline = Instant::now() + AUDIT_BUDGET;
    let (mut restarted_after, mut restarted_after_agent) = (None, None);
    while Instant::now() < deadline {
        if !r.bed.sandbox_ready(&early.id)? {
            restarted_after = Some(created.elapsed());
            restarted_after_agent = Some(agent_start.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(proxy);
    let deadline = Instant::now() + WAIT;
    let mut events = r.bed.node.pod_events(&early);
    while restarted_after.is_some()
        && !events.iter().any(|(reason, _)| reason == "Restarted")
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(200));
        events = r.bed.node.pod_events(&early);
    }
    let label = r.bed.node.pod_object(&early).and_then(|p| {
        p["metadata"]["labels"][interlock_contract::names::LABEL_UNPROTECTED]
            .as_str()
            .map(str::to_string)
    });

    // The kubelet: the stopped sandbox removed, the pod's sandbox created again.
    r.bed.remove_sandbox(&early)?;
    r.open = Some(Open {
        since: Instant::now(),
        tainted: false,
        not_ready: false,
        close: Some(Box::new(|b: &mut MeshBed| b.start_installer())),
        closed_at: None,
    });
    r.pod_from(Role::Window, config)?;
    r.close_window()?;
    let again = r.seen.pop().expect("observed");
    let mut window = r.window().expect("opened");
    window.untainted_after = r.bed.wait_untainted(WAIT);
    let plain_ready = match &plain.sandbox {
        Some(id) => r.bed.sandbox_ready(id)?,
        None => false,
    };
    Ok(Early {
        pod: format!("{}/{}", early.namespace, early.name),
        at_start,
        restarted_after,
        restarted_after_agent,
        events,
        label,
        plain,
        plain_ready,
        again,
        window,
    })
}

/// A listener on `port` in the pod's netns at `netns`, as its proxy would have (the
/// audit probes a meshed pod at once when one listens). Retried for a few seconds: the
/// capture check's own listener on that port may still be closing.
pub fn proxy_listener(netns: &Path, port: u16) -> Result<std::net::TcpListener, String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let bound = interlock_testkit_node::node::in_netns(netns, move || {
            std::net::TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, port))
        })
        .and_then(|r| r);
        match bound {
            Ok(l) => return Ok(l),
            Err(e) if Instant::now() > deadline => {
                return Err(format!(
                    "a proxy listener on {port} in {}: {e}",
                    netns.display()
                ))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// The observations as lines, for a failure message or the test's output.
pub fn describe(obs: &[Observation]) -> String {
    obs.iter()
        .map(|o| {
            format!(
                "{:?} {:?} {} ({}, refused {}x): {:?}",
                o.scenario, o.role, o.pod, o.when, o.refusals, o.outcome
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The nat rules in a pod's netns as `iptables-save` shows them (the nf_tables flavour,
/// which every stand-in writes with).
pub fn nat_rules(netns: &Path) -> Result<String, String> {
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .args(["iptables-save", "-t", "nat"])
        .output()
        .map_err(|e| format!("iptables-save in {}: {e}", netns.display()))?;
    if !out.status.success() {
        return Err(format!(
            "iptables-save in {}: {}",
            netns.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// How many rules each chain has in a restore file or `iptables-save` output.
pub fn rules_per_chain(table: &str) -> std::collections::BTreeMap<String, usize> {
    let mut m = std::collections::BTreeMap::new();
    for l in table.lines() {
        if let Some(rest) = l.strip_prefix("-A ") {
            if let Some(chain) = rest.split_whitespace().next() {
                *m.entry(chain.to_string()).or_insert(0) += 1;
            }
        }
    }
    m
}

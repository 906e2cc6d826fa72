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
//! # With guard mode (not yet written)
//! - Start the bed with the real binaries (`NodeOptions::new(interlock, interlock-cni)`)
//!   and play with `Interlock::Agent(AgentArgs::args(&["--config-mode", "guard",
//!   "--guard-mesh", "<mesh>"]))`: the agent starts before the first scenario and stays.
//! - Refusals are retried as the kubelet retries ([`Observation::refusals`] counts them);
//!   a window pod that is held shows up as refused `n` times, then started.
//! - A pod the audit restarts gets a new sandbox and netns: the observation "after the
//!   entry returned" still looks at the old netns (`NoNetwork` once it is gone), so look
//!   the pod up again by name ([`Node::sandboxes`]) before judging it.
//! - kuma-cni's plugin counts `/install-cni` processes host-wide: never run two Kuma beds
//!   (or a Kuma bed and the Kuma plugin tests) at once.

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
    /// How many times the runtime refused it before the outcome (with interlock, whose
    /// hold refuses meshed pods while the mesh's plugin cannot run; 0 without).
    pub refusals: u32,
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
    /// it, or hold the chain), until containerd has loaded any chain, and no longer than
    /// a few seconds.
    pub fn wait_window(&mut self, interlock: &Interlock) -> Result<(), String> {
        match interlock {
            Interlock::Without => self.wait_chain(false).map(|_| ()),
            Interlock::Agent(_) => {
                let _ = self
                    .node
                    .wait_loaded_chain(|c| !c.is_empty(), Duration::from_secs(5));
                Ok(())
            }
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
    pub fn capture(&self, sb: &Sandbox) -> Capture {
        match &sb.netns {
            Some(n) => check_capture(
                n,
                self.mesh.default_outbound_port(),
                CHECK_UID,
                self.node.gateway(),
            ),
            None => Capture::NoNetwork,
        }
    }

    /// Removes every pod, stops the installer (its cleanup runs) and deletes every config
    /// file: the node as before a scenario.
    pub fn reset(&mut self) -> Result<(), String> {
        let mut errors = Vec::new();
        for sb in std::mem::take(&mut self.pods) {
            if let Err(e) = self.node.remove_pod(&sb) {
                errors.push(format!("remove {}: {e}", sb.name));
            }
        }
        self.stop_installer();
        for f in crate::files::config_files(&self.node.conf_dir()) {
            let _ = std::fs::remove_file(f);
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }
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

/// How long a refused pod is retried with interlock.
const RETRY: Duration = Duration::from_secs(60);

struct Recorder<'a> {
    bed: &'a mut MeshBed,
    /// Retry refused pods (with interlock).
    retry: bool,
    scenario: Scenario,
    seen: Vec<Observation>,
    started: Vec<(Role, Option<Sandbox>, String)>,
}

impl Recorder<'_> {
    /// Runs a pod and observes it. With interlock the runtime's refusal is retried as the
    /// kubelet retries a sandbox (every second, up to [`RETRY`]), the same pod each time;
    /// without it, a refusal is the outcome.
    fn pod(&mut self, role: Role, tag: &str) {
        let config = self.bed.pod_config(tag, role != Role::Plain);
        let mut refusals = 0;
        let deadline = Instant::now() + RETRY;
        let (sb, outcome) = loop {
            match self.bed.run_config(config.clone()) {
                Ok(sb) => {
                    let c = self.bed.capture(&sb);
                    break (Some(sb), Outcome::Started(c));
                }
                Err(e) if !self.retry || Instant::now() > deadline => {
                    break (None, Outcome::Refused(e))
                }
                Err(_) => {
                    refusals += 1;
                    std::thread::sleep(Duration::from_secs(1));
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
            refusals,
            outcome,
        });
        self.started.push((role, sb, name));
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
        self.pod(Role::Control, "control");
        Ok(())
    }

    /// In the window: a meshed pod and a plain one.
    fn in_window(&mut self, interlock: &Interlock) -> Result<(), String> {
        self.bed.wait_window(interlock)?;
        self.pod(Role::Window, "window");
        self.pod(Role::Plain, "plain");
        Ok(())
    }

    /// Once the chain carries the plugin again: one more control pod, and every pod
    /// observed again.
    fn after_entry(&mut self, tag: &str) -> Result<(), String> {
        self.bed.wait_chain(true)?;
        self.pod(Role::Control, tag);
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
                    refusals: 0,
                    outcome: Outcome::Started(c),
                });
            }
        }
    }
}

/// Plays `scenario` on `bed` (reset first) and returns what each pod did; see the module
/// docs. Pods stay until the next [`run`] or [`MeshBed::reset`].
pub fn run(
    bed: &mut MeshBed,
    scenario: Scenario,
    interlock: &Interlock,
) -> Result<Vec<Observation>, String> {
    bed.reset()?;
    if let Interlock::Agent(args) = interlock {
        if bed.node.agent_ready().is_none() {
            bed.node
                .start_agent(args.clone())
                .map_err(|e| format!("start the agent: {e}"))?;
        }
    }
    let mut r = Recorder {
        retry: matches!(interlock, Interlock::Agent(_)),
        bed,
        scenario,
        seen: Vec::new(),
        started: Vec::new(),
    };
    match scenario {
        Scenario::MeshFirst => {
            r.bed.start_installer()?;
            r.bed.hold_installer();
            r.write_primary()?;
            r.in_window(interlock)?;
            r.bed.release_installer();
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
            r.in_window(interlock)?;
            r.bed.release_installer();
            r.after_entry("control-after")?;
        }
        Scenario::PodsBeforeMesh => {
            r.write_primary()?;
            r.in_window(interlock)?;
            r.bed.start_installer()?;
            r.after_entry("control")?;
        }
        Scenario::InstallerRestart => {
            r.write_primary()?;
            r.installed()?;
            r.bed.stop_installer();
            r.in_window(interlock)?;
            r.bed.start_installer()?;
            r.after_entry("control-after")?;
        }
    }
    Ok(r.seen)
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

//! One soak run from start to report: the node in a box with the agent, the checker, the
//! workload and the chaos loop together; then the end-of-run check, the teardown and the
//! leak checks.

use std::collections::BTreeMap;
use std::fs;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use interlock_contract::guard::GuardedMesh;
use interlock_cri::SandboxFilter;
use interlock_mesh_standins::install::{self, InstallOptions};
use interlock_testkit_node::node::{
    check_capture, AgentArgs, Capture, Node, NodeOptions, Sandbox, CHECK_UID, PROXY_OUTBOUND_PORT,
};

use crate::chaos::{ChaosKind, ChaosPlan, ChaosTiming};
use crate::chaos_loop::{ChaosLoop, HealthAddr, NodeFiles, NodeOps, ReadinessPoller};
use crate::checker::{Checker, CheckerConfig, CheckerState, Clock, Meshed, Stopping};
use crate::ledger::{judge, Budget, Ms, Timeline, Verdict, VerdictCounts, Violation};
use crate::probe::ProbeServer;
use crate::report::{
    AuditActions, Chaos, CheckerSummary, Distribution, Exposures, FinalCheck, Leaks, Report,
    Sandboxes, Settings,
};
use crate::sentinel::{self, SentinelOutcome};
use crate::workload::{sweep, Workload, WorkloadConfig};

/// Every setting of a run.
#[derive(Debug, Clone)]
pub struct SoakOptions {
    /// Creations to attempt.
    pub creations: u64,
    /// Parallel creators.
    pub workers: usize,
    /// Sandboxes running at once at most (residents aside).
    pub max_live: usize,
    /// Share of meshed creations.
    pub meshed_share: f64,
    /// Sandboxes kept until the end.
    pub resident: u64,
    /// How long the other sandboxes run, in milliseconds.
    pub lifetime_ms: Range<u64>,
    /// Seed of everything random.
    pub seed: u64,
    /// The agent's `--config-mode` (`owned` or `chain`).
    pub config_mode: String,
    /// The agent's `--audit-interval`, in seconds.
    pub audit_interval_s: f64,
    /// The checker's period.
    pub checker_period: Duration,
    /// Chaos kinds in play.
    pub chaos: Vec<ChaosKind>,
    /// The chaos plan's times.
    pub timing: ChaosTiming,
    /// The `interlock` binary.
    pub interlock: PathBuf,
    /// The `interlock-cni` binary.
    pub plugin: PathBuf,
    /// Run interlock at all. Without it (the control run) every meshed sandbox runs
    /// unprotected, and the soak must say so; steps that need the agent are left out.
    pub with_interlock: bool,
    /// Where to keep every agent's log (the node's directory goes at the end).
    pub agent_log: Option<PathBuf>,
    /// The other build the upgrade steps switch to and back from: its `interlock` and
    /// `interlock-cni` (e.g. the previous release, [`interlock_testkit::release`]).
    /// `None`: this build again, from another path (the rollout mechanics without a
    /// version change).
    pub other_build: Option<(PathBuf, PathBuf)>,
    /// Keep creating sandboxes until this much time has passed, even after `creations`.
    pub min_duration: Duration,
    /// Run the fake Kubernetes API (the agent with `--kube=auto`), where the sentinels'
    /// Events and labels are checked; without it the sentinel steps are left out.
    pub kube: bool,
    /// The agent's `--repair-policy`. Only `repair` keeps every sandbox protected, which
    /// the soak's invariants demand; the sentinel check knows what each policy promises.
    /// Guard mode takes `repair` as `restart` (it never repairs in place).
    pub repair_policy: String,
    /// Guard mode (`--config-mode guard --guard-mesh <mesh>`): the mesh's plugin and
    /// installer stand-ins run on the node and redirect; interlock only guards.
    pub guard_mesh: Option<GuardedMesh>,
    /// The stand-ins' binary (`mesh-standin`), for guard mode.
    pub mesh_standin: PathBuf,
}

impl SoakOptions {
    /// Defaults for `creations` creations with binaries from `bin_dir`.
    pub fn new(creations: u64, seed: u64, bin_dir: &Path) -> SoakOptions {
        SoakOptions {
            creations,
            workers: 4,
            max_live: 12,
            meshed_share: 0.6,
            resident: 8,
            lifetime_ms: 1500..4000,
            seed,
            config_mode: "owned".into(),
            audit_interval_s: 0.5,
            checker_period: Duration::from_millis(250),
            chaos: ChaosKind::OWN.to_vec(),
            timing: ChaosTiming::default(),
            interlock: bin_dir.join("interlock"),
            plugin: bin_dir.join("interlock-cni"),
            with_interlock: true,
            agent_log: None,
            other_build: None,
            min_duration: Duration::ZERO,
            kube: true,
            repair_policy: "repair".into(),
            guard_mesh: None,
            mesh_standin: bin_dir.join("mesh-standin"),
        }
    }

    /// Guard mode for `mesh`: its chaos kinds, and `restart` (guard mode's default).
    pub fn guard(mut self, mesh: GuardedMesh) -> SoakOptions {
        self.guard_mesh = Some(mesh);
        self.config_mode = "guard".into();
        self.chaos = ChaosKind::GUARD.to_vec();
        self.repair_policy = "restart".into();
        self
    }

    /// 2 s plus the audit interval; in guard mode plus the audit's wait for a proxy that
    /// never listens ([`GUARD_LISTEN_GRACE_MS`]) and its probe tried twice.
    pub fn repair_budget_ms(&self) -> Ms {
        let base = self.own_repair_budget_ms();
        match self.guard_mesh {
            Some(_) => base + GUARD_LISTEN_GRACE_MS + GUARD_PROBE_TWICE_MS,
            None => base,
        }
    }

    /// 2 s plus the audit interval: interlock's own modes' budget.
    fn own_repair_budget_ms(&self) -> Ms {
        2000 + (self.audit_interval_s * 1000.0).ceil() as Ms
    }

    /// The repair policy the agent acts by (guard mode takes `repair` as `restart`).
    pub fn effective_policy(&self) -> &str {
        match (&self.guard_mesh, self.repair_policy.as_str()) {
            (Some(_), "repair") => "restart",
            (_, p) => p,
        }
    }
}

/// Guard mode's audit probes a meshed sandbox whose proxy never listened this long
/// after its creation (docs/guard-mode.md, "Audit"); the soak's pause sandboxes have no
/// proxy, so this is when an uncaptured one is found.
pub const GUARD_LISTEN_GRACE_MS: Ms = 30_000;
/// Two probes of at most 1 s each, 500 ms apart (a failed probe is tried once more).
const GUARD_PROBE_TWICE_MS: Ms = 2_500;

/// The most of the agents' logs `--agent-log` keeps (the end).
const AGENT_LOG_MAX: usize = 64 << 20;

/// The directory holding `interlock` and `interlock-cni` next to (or one level above) the
/// running executable: `target/<profile>/` for both the soak binary and its tests.
pub fn default_bin_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    exe.ancestors()
        .skip(1)
        .take(2)
        .find(|d| d.join("interlock").is_file() && d.join("interlock-cni").is_file())
        .map(Path::to_path_buf)
}

/// The node as the chaos loop drives it.
struct SoakNode {
    node: Node,
    agent_args: AgentArgs,
    health: HealthAddr,
    /// The image's directory: its `interlock-cni` is every agent's `--plugin-source`.
    image: PathBuf,
    /// (`interlock`, `interlock-cni`) of this build and of the other one.
    builds: [(PathBuf, PathBuf); 2],
    /// The runtime's conf dir and the primary's config (a sentinel's chain).
    conf_dir: PathBuf,
    primary: serde_json::Value,
    /// The agent's repair policy (what a sentinel's pod must show).
    repair_policy: String,
    stopping: Stopping,
    clock: Clock,
    /// Guard mode: the mesh's installer stand-in.
    installer: Option<MeshInstaller>,
    /// What makes a sentinel meshed.
    meshed: Meshed,
    /// How long a sentinel's Event may take.
    sentinel_patience: Duration,
}

/// The mesh's installer stand-in as a process, as the kubelet runs its DaemonSet pod.
struct MeshInstaller {
    exe: PathBuf,
    opts: InstallOptions,
    child: Option<std::process::Child>,
    starts: u32,
    log_dir: PathBuf,
    /// Restarts after it exited on its own (kuma-cni after a failed check).
    exits: u32,
}

impl MeshInstaller {
    fn start(&mut self) -> Result<(), String> {
        if self.child.is_some() {
            return Err(format!("the {} installer runs already", self.opts.mesh));
        }
        self.starts += 1;
        let log = self
            .log_dir
            .join(format!("install-{}-{}.log", self.opts.mesh, self.starts));
        let child = install::spawn(&self.exe, &self.opts, &log)
            .map_err(|e| format!("starting the {} installer: {e}", self.opts.mesh))?;
        self.child = Some(child);
        Ok(())
    }

    fn stop(&mut self, kill: bool) -> Result<(), String> {
        let Some(mut child) = self.child.take() else {
            return Err(format!("no {} installer runs", self.opts.mesh));
        };
        if kill {
            let _ = child.kill();
            child.wait().map(drop).map_err(|e| e.to_string())
        } else {
            match install::terminate(&mut child, Duration::from_secs(10)) {
                Some(_) => Ok(()),
                None => Err(format!(
                    "the {} installer did not exit on SIGTERM",
                    self.opts.mesh
                )),
            }
        }
    }

    /// SIGSTOP (`true`) or SIGCONT: while stopped it writes nothing.
    fn pause(&self, stop: bool) {
        if let Some(c) = &self.child {
            let sig = if stop {
                nix::sys::signal::Signal::SIGSTOP
            } else {
                nix::sys::signal::Signal::SIGCONT
            };
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), sig);
        }
    }

    fn tend(&mut self) {
        let exited = self
            .child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_some());
        if exited {
            self.child = None;
            self.exits += 1;
            let _ = self.start();
        }
    }
}

impl Drop for MeshInstaller {
    /// A run that ends early (an error) leaves no installer behind; the run itself stops
    /// it with SIGTERM, so that its cleanup runs.
    fn drop(&mut self) {
        self.pause(false);
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// How long an upgraded (or downgraded) agent may take to be ready.
const BUILD_READY_PATIENCE: Duration = Duration::from_secs(30);

/// Puts `plugin` into the image dir `image` as `interlock-cni` (temp file and rename).
fn install_image(plugin: &Path, image: &Path) -> Result<(), String> {
    let tmp = image.join(".interlock-cni.tmp");
    fs::copy(plugin, &tmp)
        .and_then(|_| fs::rename(&tmp, image.join("interlock-cni")))
        .map_err(|e| format!("putting {} into the image: {e}", plugin.display()))
}

impl SoakNode {
    fn agent_running(&self) -> bool {
        self.health
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }
}

impl NodeOps for SoakNode {
    fn kill_agent(&mut self) -> Result<(), String> {
        *self.health.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.node.kill_agent();
        Ok(())
    }

    fn start_agent(&mut self) -> Result<(), String> {
        self.node
            .start_agent(self.agent_args.clone())
            .map_err(|e| format!("starting the agent: {e}"))?;
        let addr = self.node.agent(|a| a.health_addr());
        *self.health.lock().unwrap_or_else(|e| e.into_inner()) = Some(addr);
        Ok(())
    }

    fn restart_containerd(&mut self) -> Result<(), String> {
        self.node
            .restart_containerd()
            .map(drop)
            .map_err(|e| format!("restarting containerd: {e}"))
    }

    fn stop_agent(&mut self) -> Result<(), String> {
        *self.health.lock().unwrap_or_else(|e| e.into_inner()) = None;
        match self.node.stop_agent(Duration::from_secs(20)) {
            Some(status) if status.success() => Ok(()),
            other => Err(format!(
                "the agent did not exit cleanly on SIGTERM: {other:?}"
            )),
        }
    }

    fn start_build(&mut self, other: bool) -> Result<(), String> {
        let (agent, plugin) = self.builds[usize::from(other)].clone();
        install_image(&plugin, &self.image)?;
        self.node
            .start_agent_from(&agent, self.agent_args.clone())
            .map_err(|e| format!("starting {}: {e}", agent.display()))?;
        let addr = self.node.agent(|a| a.health_addr());
        *self.health.lock().unwrap_or_else(|e| e.into_inner()) = Some(addr);
        self.node
            .wait_agent_ready(BUILD_READY_PATIENCE)
            .map(drop)
            .map_err(|e| format!("{} not ready: {e}", agent.display()))
    }

    fn sentinel(&mut self, seq: u32) -> Result<SentinelOutcome, String> {
        // No agent may take the chain back while the sentinel starts, and no mesh
        // installer may put its entry into the sentinel's config.
        self.kill_agent()?;
        if let Some(i) = &self.installer {
            i.pause(true);
        }
        let planted = sentinel::start_unprotected_as(
            &self.node,
            &self.conf_dir,
            &self.primary,
            &format!("sentinel{seq}"),
            &self.meshed,
            &self.stopping,
            &self.clock,
        );
        if let Some(i) = &self.installer {
            i.pause(false);
        }
        let agent_started = Instant::now();
        let started = self.start_agent();
        let (sb, attempts) = planted?;
        let outcome = started.map(|()| {
            sentinel::await_report(
                &self.node,
                &sb,
                attempts,
                &self.repair_policy,
                agent_started,
                self.sentinel_patience,
            )
        });
        self.stopping.mark(&sb.id, self.clock.now_ms());
        let removed = self
            .node
            .remove_pod(&sb)
            .map_err(|e| format!("removing sentinel {}: {e}", sb.name));
        let outcome = outcome?;
        removed?;
        Ok(outcome)
    }

    fn stop_installer(&mut self, kill: bool) -> Result<(), String> {
        match &mut self.installer {
            Some(i) => i.stop(kill),
            None => Err("no mesh installer on this node (not guard mode)".into()),
        }
    }

    fn start_installer(&mut self) -> Result<(), String> {
        match &mut self.installer {
            Some(i) => i.start(),
            None => Err("no mesh installer on this node (not guard mode)".into()),
        }
    }

    fn tend(&mut self) {
        if let Some(i) = &mut self.installer {
            i.tend();
        }
    }
}

/// Runs the soak; the report says whether every invariant held. An `Err` means the soak
/// itself could not run (no containerd, no binaries).
pub fn run(opts: &SoakOptions) -> anyhow::Result<Report> {
    for bin in [&opts.interlock, &opts.plugin] {
        if !bin.is_file() {
            return Err(anyhow!(
                "{} missing: build it first (cargo build -p interlock -p interlock-cni)",
                bin.display()
            ));
        }
    }
    if let Some(mesh) = opts.guard_mesh {
        if !opts.mesh_standin.is_file() {
            return Err(anyhow!(
                "{} missing: guard mode runs {mesh}'s stand-ins from it (cargo build -p interlock-mesh-standins)",
                opts.mesh_standin.display()
            ));
        }
        if !opts.kube {
            return Err(anyhow!(
                "guard mode needs the fake Kubernetes API: {mesh}'s plugin reads every Pod from it"
            ));
        }
    }
    let guard = opts.guard_mesh;
    let meshed = match guard {
        Some(m) => Meshed::of_mesh(
            interlock_mesh_standins::plugin::mesh_of(m.plugin_type())
                .ok_or_else(|| anyhow!("no stand-in for {m}"))?,
        ),
        None => Meshed::interlock(),
    };
    let capture_port = guard.map_or(PROXY_OUTBOUND_PORT, GuardedMesh::default_outbound_port);
    let policy = opts.effective_policy().to_string();
    // The image the agent installs its plugin from: this build's, until an upgrade step
    // puts the other build's there (as a new image brings its own).
    let image = interlock_testkit::tempdir()?;
    install_image(&opts.plugin, image.path()).map_err(|e| anyhow!(e))?;
    let other = match &opts.other_build {
        Some(o) => o.clone(),
        None => {
            // This build again, under another path (a new image of the same build).
            let dir = image.path().join("same-build");
            fs::create_dir_all(&dir)?;
            let copy = |from: &Path, name: &str| -> anyhow::Result<PathBuf> {
                let to = dir.join(name);
                fs::copy(from, &to).with_context(|| format!("copying {}", from.display()))?;
                Ok(to)
            };
            (
                copy(&opts.interlock, "interlock")?,
                copy(&opts.plugin, "interlock-cni")?,
            )
        }
    };
    let mut node_options = NodeOptions::new(&opts.interlock, image.path().join("interlock-cni"));
    node_options.kube = opts.kube;
    let node = Node::start(node_options).context("starting the node in a box")?;
    node.write_primary()
        .context("writing the primary's config")?;
    let kit_dir = node.containerd().dir().to_path_buf();
    // Guard mode: the mesh's installer first (the mesh installed before interlock).
    let installer = match guard {
        Some(mesh) => {
            let api = node
                .api()
                .ok_or_else(|| anyhow!("guard mode without the fake API"))?
                .url();
            let mut i = MeshInstaller {
                exe: opts.mesh_standin.clone(),
                opts: InstallOptions {
                    mesh,
                    conf_dir: node.conf_dir(),
                    bin_dir: node.bin_dir(),
                    source: opts.mesh_standin.clone(),
                    server: api,
                    token: format!("{mesh}-cni-token"),
                    run_dir: kit_dir.join("istio-cni-run"),
                    conf_name: crate::chaos_loop::PRIMARY.to_string(),
                },
                child: None,
                starts: 0,
                log_dir: kit_dir.clone(),
                exits: 0,
            };
            i.start().map_err(|e| anyhow!(e))?;
            Some(i)
        }
        None => None,
    };
    let plugin_config = kit_dir.join("soak-plugin-config.json");
    let socket = node.state_dir().join("agent.sock");
    fs::write(
        &plugin_config,
        serde_json::to_vec(&serde_json::json!({
            "profiles": ["istio", "linkerd", "generic"],
            "agentSocket": socket,
        }))?,
    )?;
    let mut args = vec![
        "--config-mode".to_string(),
        opts.config_mode.clone(),
        "--audit-interval".to_string(),
        opts.audit_interval_s.to_string(),
        "--repair-policy".to_string(),
        policy.clone(),
    ];
    match guard {
        Some(mesh) => args.extend(["--guard-mesh".to_string(), mesh.as_str().to_string()]),
        None => args.extend([
            "--plugin-config".to_string(),
            plugin_config.display().to_string(),
        ]),
    }
    let agent_args = AgentArgs::args(&args);
    let files = NodeFiles {
        conf_dir: node.conf_dir(),
        bin_dir: node.bin_dir(),
        primary: node.primary_conflist(),
        mesh_plugin: guard.map(|m| m.plugin_type().to_string()),
    };
    let pod_api = match guard {
        Some(_) => node.api().map(|a| a.url()),
        None => None,
    };
    let endpoint = node.containerd().endpoint();
    let gateway = node.gateway();
    let state_dir = node.state_dir();
    let clock = Clock::start();
    let stopping = Stopping::default();
    let health: HealthAddr = Arc::new(Mutex::new(None));
    let poller = ReadinessPoller::start(health.clone(), Duration::from_millis(50), clock)?;
    let mut soak_node = SoakNode {
        node,
        agent_args,
        health,
        image: image.path().to_path_buf(),
        builds: [(opts.interlock.clone(), opts.plugin.clone()), other],
        conf_dir: files.conf_dir.clone(),
        primary: files.primary.clone(),
        repair_policy: policy.clone(),
        stopping: stopping.clone(),
        clock,
        installer,
        meshed: meshed.clone(),
        sentinel_patience: if guard.is_some() {
            sentinel::GUARD_PATIENCE
        } else {
            sentinel::PATIENCE
        },
    };
    if opts.with_interlock {
        soak_node.start_agent().map_err(|e| anyhow!(e))?;
        soak_node
            .node
            .wait_agent_ready(Duration::from_secs(30))
            .map_err(|e| anyhow!("the agent never became ready: {e}"))?;
    }
    soak_node
        .node
        .wait_network_ready(true, Duration::from_secs(10))
        .map_err(|e| anyhow!(e))?;

    let server = Arc::new(ProbeServer::start()?);
    let checker = Checker::start(
        CheckerConfig {
            cri_endpoint: endpoint.clone(),
            gateway,
            period: opts.checker_period,
            probe_timeout: Duration::from_millis(300),
            meshed: meshed.clone(),
        },
        clock,
        stopping.clone(),
        server.clone(),
    )?;
    let workload = Workload::new(
        WorkloadConfig {
            cri_endpoint: endpoint.clone(),
            workers: opts.workers,
            max_live: opts.max_live,
            creations: opts.creations,
            until_ms: clock.now_ms() + opts.min_duration.as_millis() as Ms,
            meshed_share: opts.meshed_share,
            lifetime_ms: opts.lifetime_ms.clone(),
            resident: opts.resident,
            seed: opts.seed,
            meshed: meshed.clone(),
            pod_api,
        },
        clock,
        stopping.clone(),
    );
    let kinds: Vec<ChaosKind> = opts
        .chaos
        .iter()
        .copied()
        .filter(|k| opts.with_interlock || !k.needs_the_agent())
        .filter(|k| opts.kube || *k != ChaosKind::Sentinel)
        .filter(|k| guard.is_some() || !k.guard_only())
        // An older release knows no guard mode: no upgrades to it.
        .filter(|k| {
            guard.is_none()
                || opts.other_build.is_none()
                || !matches!(k, ChaosKind::Upgrade | ChaosKind::UpgradeContainerdRestart)
        })
        .collect();
    let plan = ChaosPlan::new(opts.seed, &kinds, opts.timing.clone());
    let soak_began = clock.now_ms();
    let chaos = ChaosLoop::start(soak_node, files, plan, clock)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let progress = spawn_progress(workload.clone(), opts.creations);
    rt.block_on(workload.run());
    drop(progress);
    let (mut soak_node, chaos_log) = chaos.stop();
    let soak_ended = clock.now_ms();

    // The end: chaos stopped, the agent back, the repair budget passed.
    let mut violations = Vec::new();
    if opts.with_interlock && !soak_node.agent_running() {
        if let Err(e) = soak_node.start_agent() {
            violations.push(Violation::new("agent_not_running_at_end", e));
        }
    }
    if opts.with_interlock {
        if let Err(e) = soak_node.node.wait_agent_ready(Duration::from_secs(30)) {
            violations.push(Violation::new("agent_not_ready_at_end", e));
        }
    }
    // The repair budget passes; guard mode's (its audit's 30 s wait for a proxy
    // included) is cut short once the checker sees no meshed sandbox exposed: nothing is
    // left to repair, and the final check proves every one anyway.
    let settle = Instant::now();
    std::thread::sleep(Duration::from_millis(opts.own_repair_budget_ms() + 500));
    let full = Duration::from_millis(opts.repair_budget_ms() + 500);
    while settle.elapsed() < full {
        checker.wait_rounds(1, Duration::from_secs(10));
        if checker.with_state(|s| s.ledger.exposed_now().is_empty()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    checker.wait_rounds(2, Duration::from_secs(10));
    // Guard mode: the agent's audit probes a sandbox as soon as a listener appears on
    // its proxy's port, and the capture check's listener is one: the agent's connection
    // would land on it instead of the check's. interlock writes no rules in guard mode,
    // so the mesh's capture is checked with the agent stopped (SIGTERM, as a rollout).
    if guard.is_some() && soak_node.agent_running() {
        if let Err(e) = soak_node.stop_agent() {
            violations.push(Violation::new("agent_not_stopped_at_end", e));
        }
    }
    let (checked, final_check, found) = end_check_as(
        checker,
        &soak_node.node,
        &server,
        gateway,
        &meshed,
        capture_port,
    );
    violations.extend(found);
    let readiness = poller.stop();
    let mut ledger = checked.ledger;
    ledger.finish(clock.now_ms());

    // Teardown, counting what is left at each step.
    let mut leaks = Leaks::default();
    let (unswept, cleared_at_sweep, thawed_at_sweep) =
        rt.block_on(sweep(&endpoint, &stopping, &clock, Duration::from_secs(60)));
    leaks.sandboxes = unswept.len();
    leaks.details.extend(unswept);
    std::thread::sleep(Duration::from_millis(200));
    for f in soak_node.node.state_files() {
        leaks.attachment_state_files += 1;
        leaks.details.push(format!(
            "attachment state file {f} left after every sandbox was removed"
        ));
    }
    // The plugin's per-netns records (the node's leak check covers the attachments).
    for f in list_dir(&state_dir.join("netns")) {
        leaks.attachment_state_files += 1;
        leaks.details.push(format!(
            "netns record {} left after every sandbox was removed",
            f.display()
        ));
    }
    for ip in soak_node.node.ipam_addresses() {
        leaks.ipam_addresses += 1;
        leaks.details.push(format!("host-local still holds {ip}"));
    }
    if let Some(path) = &opts.agent_log {
        let logs = soak_node.node.agent_logs();
        // The tail is what a failure needs; keep the file bounded.
        let tail = &logs.as_bytes()[logs.len().saturating_sub(AGENT_LOG_MAX)..];
        if let Err(e) = fs::write(path, tail) {
            eprintln!(
                "interlock-soak: writing the agent logs to {}: {e}",
                path.display()
            );
        }
    }
    let audit = audit_actions(&soak_node.node);
    if audit.unmeshed_acted_on > 0 {
        violations.push(Violation::new(
            "unmeshed_acted_on",
            format!(
                "the audit acted on {} unmeshed pod(s): {:?}",
                audit.unmeshed_acted_on, audit.events_by_reason
            ),
        ));
    }
    // The installer's SIGTERM cleanup, as a drained node's DaemonSet pod does.
    let installer_exits = soak_node.installer.as_ref().map_or(0, |i| i.exits);
    if let Some(i) = &mut soak_node.installer {
        if i.child.is_some() {
            if let Err(e) = i.stop(false) {
                leaks.other += 1;
                leaks.details.push(format!("mesh installer: {e}"));
            }
        }
    }
    let footprint = soak_node
        .node
        .footprint()
        .with_netns(checked.netns_seen.iter().cloned());
    if soak_node.agent_running() {
        soak_node.node.stop_agent(Duration::from_secs(10));
    }
    let resident = workload.resident().len() as u64;
    let SoakNode { node, .. } = soak_node;
    if let Err(problems) = node.teardown() {
        for p in problems {
            leaks.other += 1;
            leaks.details.push(format!("teardown: {p}"));
        }
    }
    for left in footprint.leftovers() {
        if left.starts_with("netns ") {
            leaks.netns += 1;
        } else if left.starts_with("process ") {
            leaks.processes += 1;
        } else {
            leaks.other += 1;
        }
        leaks.details.push(left);
    }
    for (pid, cmdline) in processes_mentioning(&kit_dir) {
        leaks.processes += 1;
        leaks
            .details
            .push(format!("process {pid} still runs: {cmdline}"));
    }
    for table in interlock_nft_tables() {
        leaks.nft_tables += 1;
        leaks
            .details
            .push(format!("nft table {table} in the host's namespace"));
    }

    // Judgement.
    let budget = Budget {
        repair_ms: opts.repair_budget_ms(),
        settle_ms: 1000,
    };
    let timeline = Timeline {
        chaos: chaos_log.spans.clone(),
        agent_ready: readiness,
    };
    let (exposures, judged) = judge(&ledger, &timeline, budget);
    violations.extend(judged);
    for u in &final_check.unverified {
        violations.push(Violation::new("unverified_at_end", u.clone()));
    }
    for d in &leaks.details {
        violations.push(Violation::new("leak", d.clone()));
    }
    for o in &chaos_log.sentinels {
        if let Some(missing) = &o.missing {
            violations.push(Violation::new(
                "sentinel_not_reported",
                format!("sentinel {} (sandbox {}): {missing}", o.pod, o.sandbox),
            ));
        }
    }
    for e in &chaos_log.errors {
        violations.push(Violation::new("chaos_step_failed", e.clone()));
    }
    let mut probes: BTreeMap<&'static str, VerdictCounts> = BTreeMap::new();
    let mut seen: BTreeMap<&'static str, u64> = BTreeMap::new();
    for r in ledger.records() {
        let kind = if r.meshed { "meshed" } else { "plain" };
        probes.entry(kind).or_default().merge(&r.probes);
        *seen.entry(kind).or_default() += 1;
    }
    let plain = probes.get("plain").copied().unwrap_or_default();
    if plain.total() >= 10 && plain.direct == 0 {
        violations.push(Violation::new(
            "checker_blind",
            format!("no probe of a plain sandbox reached the server ({plain:?}): the checker proves nothing"),
        ));
    }
    let meshed = probes.get("meshed").copied().unwrap_or_default();
    if meshed.captured == 0 {
        violations.push(Violation::new(
            "vacuous",
            format!("no meshed sandbox was ever seen captured ({meshed:?})"),
        ));
    }
    let stats = workload.stats();
    if stats.gave_up {
        violations.push(Violation::new(
            "workload_gave_up",
            format!(
                "only {} of {} sandboxes started in {} attempts",
                stats.created_meshed + stats.created_plain,
                opts.creations,
                stats.attempted
            ),
        ));
    }
    let mut events: BTreeMap<ChaosKind, u64> = kinds.iter().map(|k| (*k, 0)).collect();
    for s in &chaos_log.spans {
        *events.entry(s.kind).or_default() += 1;
    }
    let reinstalls: Vec<Ms> = chaos_log
        .plugin_reinstall_ms
        .iter()
        .flatten()
        .copied()
        .collect();
    let elapsed = soak_ended.saturating_sub(soak_began);
    let sentinel_sandboxes: u64 = chaos_log
        .sentinels
        .iter()
        .map(|o| u64::from(o.attempts))
        .sum();
    Ok(Report {
        ok: violations.is_empty(),
        settings: Settings {
            seed: opts.seed,
            creations: opts.creations,
            workers: opts.workers,
            config_mode: opts.config_mode.clone(),
            audit_interval_s: opts.audit_interval_s,
            repair_budget_ms: opts.repair_budget_ms(),
            checker_period_ms: opts.checker_period.as_millis() as Ms,
            with_interlock: opts.with_interlock,
            chaos_kinds: kinds.clone(),
            other_build: opts.other_build.as_ref().map_or_else(
                || "this build".to_string(),
                |(a, _)| a.display().to_string(),
            ),
            min_duration_s: opts.min_duration.as_secs(),
            kube: opts.kube,
            repair_policy: policy.clone(),
            guard_mesh: guard.map(|m| {
                if installer_exits > 0 {
                    format!("{m} (its installer exited and was restarted {installer_exits}×)")
                } else {
                    m.to_string()
                }
            }),
        },
        duration_s: elapsed as f64 / 1000.0,
        sandboxes: Sandboxes {
            // Started by the runtime although RunPodSandbox answered an error (the
            // answer lost while containerd restarted): seen by the checker only.
            // Sentinels (every sandbox tried for one) are the chaos loop's, not these.
            started_without_answer: seen
                .values()
                .sum::<u64>()
                .saturating_sub(stats.created_meshed + stats.created_plain)
                .saturating_sub(sentinel_sandboxes),
            unreadable_cni_caches_cleared: stats
                .unreadable_cni_caches
                .iter()
                .chain(&cleared_at_sweep)
                .cloned()
                .collect(),
            stuck_freezers_thawed: stats
                .stuck_freezers_thawed
                .iter()
                .chain(&thawed_at_sweep)
                .cloned()
                .collect(),
            ..Sandboxes::from_stats(&stats, resident, elapsed)
        },
        chaos: Chaos {
            events,
            plugin_reinstall_ms: Distribution::of(&reinstalls),
            errors: chaos_log.errors.clone(),
            sentinels: chaos_log.sentinels.clone(),
        },
        checker: CheckerSummary {
            rounds: checked.rounds,
            longest_round_ms: checked.longest_round_ms,
            rounds_without_runtime: checked.list_failures,
            sandboxes_seen: seen.clone(),
            probes,
            dropped_probes: checked.dropped_probes,
        },
        exposures: Exposures::of(exposures),
        final_check,
        leaks,
        audit,
        violations,
    })
}

/// Prints progress to stderr every 30 s while the workload runs.
fn spawn_progress(workload: Workload, creations: u64) -> ProgressGuard {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s = stop.clone();
    let began = Instant::now();
    std::thread::spawn(move || {
        let mut last = Instant::now();
        while !s.load(std::sync::atomic::Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(200));
            if last.elapsed() >= Duration::from_secs(30) {
                last = Instant::now();
                let st = workload.stats();
                eprintln!(
                    "soak: {}/{} sandboxes started after {:.0} s ({} meshed + {} plain; {} creations failed)",
                    st.created_meshed + st.created_plain,
                    creations,
                    began.elapsed().as_secs_f64(),
                    st.created_meshed,
                    st.created_plain,
                    st.failed_meshed + st.failed_plain
                );
            }
        }
    });
    ProgressGuard(stop)
}

struct ProgressGuard(Arc<std::sync::atomic::AtomicBool>);

impl Drop for ProgressGuard {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The end-of-run check: stops the checker, then checks every sandbox still running,
/// twice and independently: the soak's own probe (exposed or not) and the kit's capture
/// check (redirected, with `SO_ORIGINAL_DST`). Returns what the checker learnt, the
/// check, and its violations (`left_unprotected`, `final_check_failed`).
///
/// The checker must be stopped first: the capture check listens on the proxy port inside
/// each meshed sandbox, and a checker probe of the same sandbox meanwhile is redirected
/// to that listener too; the check then sees a connection whose original destination is
/// the probe server and calls the sandbox unverified.
pub fn end_check(
    checker: Checker,
    node: &Node,
    server: &ProbeServer,
    gateway: std::net::Ipv4Addr,
) -> (CheckerState, FinalCheck, Vec<Violation>) {
    end_check_as(
        checker,
        node,
        server,
        gateway,
        &Meshed::interlock(),
        PROXY_OUTBOUND_PORT,
    )
}

/// [`end_check`] with sandboxes meshed by `meshed`, whose proxy's outbound port is
/// `capture_port` (guard mode: the mesh's).
pub fn end_check_as(
    checker: Checker,
    node: &Node,
    server: &ProbeServer,
    gateway: std::net::Ipv4Addr,
    meshed: &Meshed,
    capture_port: u16,
) -> (CheckerState, FinalCheck, Vec<Violation>) {
    let checked = checker.stop();
    let mut violations = Vec::new();
    let out = final_check(node, server, gateway, meshed, capture_port, &mut violations);
    (checked, out, violations)
}

/// Counts the Events about pods in the fake API by reason, and the pods the audit acted
/// on by kind: the workload's (namespace `soak`, named `…-m` meshed or `…-p` plain) and
/// the sentinels.
fn audit_actions(node: &Node) -> AuditActions {
    const ACTIONS: [&str; 5] = ["Restarted", "Repaired", "Evicted", "Deleted", "Unprotected"];
    let mut out = AuditActions::default();
    let Some(api) = node.api() else {
        return out;
    };
    let mut acted: std::collections::BTreeSet<(String, String)> = Default::default();
    for e in api.objects("events") {
        if e["regarding"]["kind"] != "Pod" {
            continue;
        }
        let reason = e["reason"].as_str().unwrap_or_default().to_string();
        *out.events_by_reason.entry(reason.clone()).or_default() += 1;
        if ACTIONS.contains(&reason.as_str()) {
            let ns = e["regarding"]["namespace"].as_str().unwrap_or_default();
            let name = e["regarding"]["name"].as_str().unwrap_or_default();
            acted.insert((ns.to_string(), name.to_string()));
        }
    }
    for (ns, name) in acted {
        if ns == "soak" && name.ends_with("-p") {
            out.unmeshed_acted_on += 1;
        } else if ns == "soak" {
            out.meshed_acted_on += 1;
        } else {
            out.sentinels_acted_on += 1;
        }
    }
    out
}

fn final_check(
    node: &Node,
    server: &ProbeServer,
    gateway: std::net::Ipv4Addr,
    meshed: &Meshed,
    capture_port: u16,
    violations: &mut Vec<Violation>,
) -> FinalCheck {
    let mut out = FinalCheck::default();
    let cri = node.cri();
    let listed = node.block_on(async move {
        let list = cri
            .list_sandboxes(&SandboxFilter::ready())
            .await
            .map_err(|e| e.to_string())?;
        let mut all = Vec::new();
        for s in list {
            let status = cri
                .sandbox_status(&s.id, true)
                .await
                .map_err(|e| e.to_string())?;
            all.push(Sandbox {
                id: s.id.clone(),
                namespace: s.metadata.namespace.clone(),
                name: s.metadata.name.clone(),
                uid: s.metadata.uid.clone(),
                meshed: meshed.matches(&s.annotations),
                netns: status.netns_path().map(Path::to_path_buf),
                ip: status.ips.first().copied(),
            });
        }
        Ok::<_, String>(all)
    });
    let sandboxes = match listed {
        Ok(s) => s,
        Err(e) => {
            violations.push(Violation::new(
                "final_check_failed",
                format!("listing the sandboxes at the end: {e}"),
            ));
            return out;
        }
    };
    for sb in &sandboxes {
        let own = sb.netns.as_deref().map_or(Verdict::NoConnection, |ns| {
            server.probe(ns, gateway, Duration::from_millis(500))
        });
        let kit = sb.netns.as_deref().map_or(Capture::NoNetwork, |ns| {
            check_capture(ns, capture_port, CHECK_UID, gateway)
        });
        if sb.meshed {
            out.meshed_running += 1;
            if own == Verdict::Direct || kit == Capture::NotRedirected {
                out.left_unprotected += 1;
                violations.push(Violation::new(
                    "left_unprotected",
                    format!(
                        "meshed sandbox {} ({}): probe {own:?}, capture check {kit:?}",
                        sb.id, sb.name
                    ),
                ));
            } else if kit == Capture::Redirected {
                out.meshed_redirected += 1;
            } else {
                out.unverified.push(format!(
                    "meshed sandbox {} ({}): probe {own:?}, capture check {kit:?}",
                    sb.id, sb.name
                ));
            }
        } else {
            out.plain_running += 1;
            if kit == Capture::NotRedirected && own == Verdict::Direct {
                out.plain_not_redirected += 1;
            } else {
                out.unverified.push(format!(
                    "plain sandbox {} ({}): probe {own:?}, capture check {kit:?}",
                    sb.id, sb.name
                ));
            }
        }
    }
    out
}

fn list_dir(dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(dir)
        .map(|r| r.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// Processes whose command line mentions `dir` (agents, plugins, shims of the node).
fn processes_mentioning(dir: &Path) -> Vec<(i32, String)> {
    let needle = dir.to_string_lossy().into_owned();
    let me = std::process::id() as i32;
    list_dir(Path::new("/proc"))
        .into_iter()
        .filter_map(|p| p.file_name()?.to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != me)
        .filter_map(|pid| {
            let raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
            cmdline
                .contains(&needle)
                .then_some((pid, cmdline.trim().to_string()))
        })
        .collect()
}

/// nft tables in the host's namespace whose name mentions interlock.
fn interlock_nft_tables() -> Vec<String> {
    std::process::Command::new("nft")
        .args(["list", "tables"])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| l.contains("interlock"))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_repair_budget_is_two_seconds_plus_the_audit_interval() {
        let mut o = SoakOptions::new(10, 1, Path::new("/x"));
        o.audit_interval_s = 0.5;
        assert_eq!(o.repair_budget_ms(), 2500);
        o.audit_interval_s = 1.25;
        assert_eq!(o.repair_budget_ms(), 3250);
        assert_eq!(o.interlock, Path::new("/x/interlock"));
    }

    #[test]
    fn guard_mode_waits_for_the_audit_grace_and_restarts_instead_of_repairing() {
        let mut o = SoakOptions::new(10, 1, Path::new("/x")).guard(GuardedMesh::Consul);
        o.audit_interval_s = 0.5;
        assert_eq!(o.repair_budget_ms(), 2500 + GUARD_LISTEN_GRACE_MS + 2500);
        assert_eq!(o.config_mode, "guard");
        assert_eq!(o.chaos, ChaosKind::GUARD);
        assert_eq!(o.effective_policy(), "restart");
        o.repair_policy = "repair".into();
        assert_eq!(o.effective_policy(), "restart");
        o.repair_policy = "report".into();
        assert_eq!(o.effective_policy(), "report");
        assert_eq!(o.mesh_standin, Path::new("/x/mesh-standin"));
        let own = SoakOptions::new(10, 1, Path::new("/x"));
        assert_eq!(own.effective_policy(), "repair");
        assert_eq!(own.chaos, ChaosKind::OWN);
    }
}

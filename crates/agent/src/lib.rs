//! The interlock node agent.
//!
//! Installs the plugin binary, writes the config the runtime actually loads, re-converges
//! it within milliseconds after anyone else touches the conf dir, and reports readiness
//! truthfully (health endpoints and the readiness marker `interlock check` reads).
//!
//! Layout: one folder per loop, each with its thin layer in `mod.rs` and its pure
//! decisions beside it. The conf dir as a runtime sees it is `interlock_confdir` (shared
//! with `interlock check`).
//!
//! - [`guard`], the config guard (one thread, woken by inotify): [`guard::plan`] decides
//!   what to write, [`guard::conflict`] when another writer is in conflict with us and
//!   when to back off, [`guard::readiness`] whether the node is ready (all pure);
//!   [`guard::contested_write`] writes a file another writer also writes without losing its
//!   writes, [`guard::install`] handles the plugin binary, and [`guard::marker`] is the
//!   readiness file `interlock check` reads. Guard mode (`--config-mode guard`) adds
//!   [`guard::learn`] (pure: which mesh plugin entry to keep) and [`guard::guarded`]
//!   (that entry kept in the state dir, whether it can run, the state metric).
//! - [`audit`], audit and repair (tokio, netns work on threads of its own): the sandbox
//!   audit acts, [`audit::decide`] decides (pure), and [`audit::socket`] serves the
//!   plugin's pod lookups and hands its ADD notes to the audit.
//! - [`kubernetes`], the Kubernetes side (tokio tasks): [`kubernetes::gate`] keeps the
//!   node's taint and condition in step with readiness, [`kubernetes::gating`] decides
//!   them (pure), [`kubernetes::pods`] caches this node's pods, and
//!   [`kubernetes::actions`] labels, reports on, deletes and evicts them for the audit.
//! - [`exit`], what the agent leaves on the node as it exits (uninstall-on-exit, with
//!   `when-deleted` asking the API whether the DaemonSet is going away), and
//!   [`uninstall`], which removes interlock's files (also for `interlock uninstall`).
//! - [`health`] serves `/healthz`, `/readyz` and `/metrics`: [`health::shared`] is the
//!   state the other loops share with it, [`health::metrics`] its Prometheus series,
//!   [`health::verdicts`] decides what the endpoints answer (pure), and
//!   [`health::telemetry`] sets up the logs.
//!
//! Tests: the pure decisions are tested beside them, the Kubernetes side against the fake
//! API in `crates/agent/tests/kube.rs`, guard mode's audit on a real containerd in
//! `crates/agent/tests/guarded_audit.rs`. The agent as a process (the built `interlock`
//! binary, which cargo builds only for its own crate's tests) is tested in
//! `crates/cli/tests/it/`: `agent.rs` (the guard and its files), `audit.rs` (audit and
//! repair on a real containerd), `kube_agent.rs` (gating and Events, against the fake API), `agent_socket*.rs`,
//! `crash.rs`, `stalled_guard.rs`, `health_flood.rs`, `node_scope.rs`, `upgrade.rs` and
//! `uninstall_on_exit.rs`.
//!
//! Readiness is one value with one path: [`guard::readiness`] decides it from what the
//! guard found, the guard publishes it in [`health::shared::Shared`] (and the marker),
//! [`health::verdicts`] turns it into `/readyz`'s answer (stale when the guard stops), and
//! [`kubernetes::gating`] into the node's taint and condition.
//!
//! Threads: the tokio runtime (health server, signals, the agent socket, the sandbox
//! audit, and the Kubernetes tasks), one guard thread, one inotify thread. The modules
//! depend one way: [`audit`] on [`kubernetes`] and [`health`], [`kubernetes`] and
//! [`guard`] on [`health`]; only this file wires them together.

pub mod audit;
pub mod error;
pub mod exit;
pub mod guard;
pub mod health;
pub mod kubernetes;
pub mod uninstall;

pub use error::AgentError;
pub use exit::UninstallOnExit;

use guard::plan::{ConfigMode, Settings};
use health::telemetry::Json;
use serde_json::{Map, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tracing::{error, info, warn};

pub use interlock_confdir::Runtime;

/// Whether to talk to the Kubernetes API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KubeMode {
    /// The in-cluster service account when present, else `$KUBECONFIG`; without either,
    /// as `None` (and the log says so).
    Auto,
    /// No Kubernetes API at all.
    None,
}

impl std::str::FromStr for KubeMode {
    type Err = String;

    fn from_str(s: &str) -> Result<KubeMode, String> {
        match s {
            "auto" => Ok(KubeMode::Auto),
            "none" => Ok(KubeMode::None),
            other => Err(format!(
                "unknown Kubernetes mode {other:?} (expected auto or none)"
            )),
        }
    }
}

/// Everything `interlock agent` is told on its command line.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The runtime's CNI conf dir.
    pub conf_dir: PathBuf,
    /// Bin dirs to install the plugin into (the first is where the runtime looks first).
    pub bin_dirs: Vec<PathBuf>,
    /// Where the readiness marker lives (also written into our plugin entry).
    pub state_dir: PathBuf,
    /// Owned or chain.
    pub mode: ConfigMode,
    /// Chain mode target file (name or path inside the conf dir).
    pub chain_target: Option<String>,
    /// Whose loading rules decide what is effective.
    pub runtime: Runtime,
    /// Kubernetes integration.
    pub kube: KubeMode,
    /// This node's name in the API (required when a Kubernetes client is found).
    pub node_name: Option<String>,
    /// The agent's own pod, `namespace` and `name` (`POD_NAMESPACE`, `POD_NAME` in the
    /// DaemonSet): uninstall-on-exit `when-deleted` reads its owner.
    pub pod: Option<(String, String)>,
    /// The startup taint's effect (`TaintEffect::None`: the condition only).
    pub taint_effect: kubernetes::gating::TaintEffect,
    /// Address of `/healthz`, `/readyz`, `/metrics`.
    pub health_addr: SocketAddr,
    /// A second listener with `/healthz` and `/readyz` only, for the kubelet's probes
    /// (`127.0.0.1:…` in the DaemonSet: nothing off the node reaches it, and a flood of
    /// the metrics port cannot fail a probe). `None`: the probes use `health_addr`.
    pub probe_addr: Option<SocketAddr>,
    /// The `interlock-cni` binary to install.
    pub plugin_source: PathBuf,
    /// Whether to remove what interlock added when the agent exits.
    pub uninstall_on_exit: UninstallOnExit,
    /// Files allowed to sort ahead of ours (we chain into them instead).
    pub allow_ahead: Vec<String>,
    /// Highest `cniVersion` to write (`None`: the highest every plugin supports).
    pub max_cni_version: Option<String>,
    /// Period of the full resync.
    pub resync_interval: Duration,
    /// Marker staleness limit written into the marker (refreshed every third of it).
    pub marker_stale_after: Duration,
    /// Operator settings merged into our plugin entry (`--plugin-config`), already
    /// validated by [`load_plugin_config`]. `type`, `stateDir` and the pod-annotations
    /// capability are always the agent's.
    pub plugin_config: Map<String, Value>,
    /// Conflicts on one file within `conflict_window` beyond which another writer is in a
    /// fight with the agent, which backs off (0: never).
    pub conflict_threshold: u32,
    /// Window for counting conflicts (another writer taking interlock out of a file).
    pub conflict_window: Duration,
    /// A fight is over once its file was left alone this long (the agent is not ready
    /// until then).
    pub conflict_forgive_after: Duration,
    /// The runtime's own config files, to tell whether it reads `conf_dir`
    /// (`interlock_confdir::runtime_config`); `None`: the usual paths of `runtime`.
    pub runtime_configs: Option<Vec<PathBuf>>,
    /// How long the agent waits for the primary's first config before it logs where else
    /// the runtime may read its configs from.
    pub primary_wait_hint: Duration,
    /// The sandbox audit (`--cri-endpoint`, `--audit-interval`, `--repair-policy`);
    /// `None`: no audit (`--cri-endpoint none`).
    pub audit: Option<audit::AuditSettings>,
    /// Guard mode (`--guard-mesh`): the mesh whose own CNI plugin the agent keeps in the
    /// chain, with `interlock-cni` in its guard role; `None`: interlock redirects itself.
    pub guard: Option<interlock_contract::guard::GuardedMesh>,
    /// Guard mode: where the host's root is mounted (`--guard-host-root`), to check the
    /// files the mesh's plugin entry names (its kubeconfig) as the plugin will see them.
    pub guard_host_root: PathBuf,
}

impl AgentConfig {
    /// A config with the documented defaults.
    pub fn new(plugin_source: PathBuf) -> AgentConfig {
        AgentConfig {
            conf_dir: "/etc/cni/net.d".into(),
            bin_dirs: vec!["/opt/cni/bin".into()],
            state_dir: "/var/run/interlock".into(),
            mode: ConfigMode::Owned,
            chain_target: None,
            runtime: Runtime::Containerd,
            kube: KubeMode::None,
            node_name: None,
            pod: None,
            taint_effect: kubernetes::gating::TaintEffect::NoSchedule,
            health_addr: "127.0.0.1:9102".parse().expect("valid address"),
            probe_addr: None,
            plugin_source,
            uninstall_on_exit: UninstallOnExit::Never,
            allow_ahead: vec![],
            max_cni_version: None,
            plugin_config: Map::new(),
            resync_interval: Duration::from_secs(10),
            marker_stale_after: Duration::from_secs(3),
            conflict_threshold: 5,
            conflict_window: Duration::from_secs(30),
            conflict_forgive_after: guard::conflict::FORGIVE_AFTER,
            runtime_configs: None,
            primary_wait_hint: guard::PRIMARY_WAIT_HINT,
            audit: Some(audit::AuditSettings::default()),
            guard: None,
            guard_host_root: "/".into(),
        }
    }

    /// Our plugin entry, exactly as it must appear in the effective config.
    pub fn entry(&self) -> Map<String, Value> {
        plugin_entry_with(&self.state_dir, &self.plugin_config)
    }

    /// The planner's view of this config.
    pub fn settings(&self) -> Settings {
        Settings {
            mode: self.mode,
            chain_target: self.chain_target.as_ref().map(|t| {
                Path::new(t)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| t.clone())
            }),
            allow_ahead: self
                .allow_ahead
                .iter()
                .map(|t| {
                    Path::new(t)
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_else(|| t.clone())
                })
                .collect(),
            runtime: self.runtime,
            entry: self.entry(),
            max_cni_version: self.max_cni_version.clone(),
            guard: self
                .guard
                .filter(|_| self.mode == ConfigMode::Guard)
                .map(|mesh| guard::plan::GuardInput {
                    mesh,
                    learned: None,
                    unusable: None,
                    installer_put_t_back: false,
                }),
        }
    }
}

/// The `interlock-cni` entry the agent writes for a plugin whose state lives in `state_dir`.
pub fn plugin_entry(state_dir: &Path) -> Map<String, Value> {
    let mut caps = Map::new();
    caps.insert(
        interlock_contract::POD_ANNOTATIONS_CAPABILITY.into(),
        Value::Bool(true),
    );
    // The agent serves its socket in the state dir; Istio's and Linkerd's pods need it
    // (their spec's facts come from the agent).
    let v = serde_json::json!({
        "type": guard::plan::PLUGIN_TYPE,
        "stateDir": state_dir.display().to_string(),
        "agentSocket": state_dir
            .join(interlock_contract::layout::AGENT_SOCKET_FILE)
            .display()
            .to_string(),
        "capabilities": caps,
    });
    match v {
        Value::Object(m) => m,
        _ => unreachable!("json! object literal"),
    }
}

/// Fields an operator may set with `--plugin-config` (interlock-cni's own settings).
pub use interlock_contract::config::SETTABLE_FIELDS as PLUGIN_CONFIG_FIELDS;

/// Our entry with the operator's `extra` settings merged in: `type` and `stateDir` first,
/// then `extra` in its order, and `capabilities` always declaring the pod annotations.
pub fn plugin_entry_with(state_dir: &Path, extra: &Map<String, Value>) -> Map<String, Value> {
    let mut out = plugin_entry(state_dir);
    let caps = out.remove("capabilities");
    for (k, v) in extra {
        if k != "type" && k != "stateDir" && k != "capabilities" {
            out.insert(k.clone(), v.clone());
        }
    }
    let mut caps = match caps {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    if let Some(Value::Object(theirs)) = extra.get("capabilities") {
        for (k, v) in theirs {
            caps.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    caps.insert(
        interlock_contract::POD_ANNOTATIONS_CAPABILITY.into(),
        Value::Bool(true),
    );
    out.insert("capabilities".into(), Value::Object(caps));
    out
}

/// Reads and validates a `--plugin-config` file: a JSON object of interlock-cni settings
/// ([`PLUGIN_CONFIG_FIELDS`]). The error names the file and the bad field.
pub fn load_plugin_config(path: &Path) -> Result<Map<String, Value>, AgentError> {
    let bad = |reason: String| AgentError::PluginConfig {
        path: path.to_path_buf(),
        reason,
    };
    let bytes = interlock_contract::bounded::read_config(path)
        .map_err(|e| bad(format!("cannot read: {e}")))?;
    let map = match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(m)) => m,
        Ok(other) => {
            return Err(bad(format!(
                "must be a JSON object of interlock-cni settings, found {}",
                match other {
                    Value::Array(_) => "an array",
                    Value::String(_) => "a string",
                    Value::Number(_) => "a number",
                    Value::Bool(_) => "a boolean",
                    _ => "null",
                }
            )))
        }
        Err(e) => return Err(bad(format!("not valid JSON: {e}"))),
    };
    for k in map.keys() {
        match k.as_str() {
            "type" => {
                return Err(bad(
                    "field type: set by the agent (always interlock-cni); remove it".into(),
                ))
            }
            "stateDir" => {
                return Err(bad(
                    "field stateDir: set by the agent; use --state-dir instead".into(),
                ))
            }
            f if PLUGIN_CONFIG_FIELDS.contains(&f) => {}
            f => {
                return Err(bad(format!(
                    "field {f}: not an interlock-cni setting (known: {})",
                    PLUGIN_CONFIG_FIELDS.join(", ")
                )))
            }
        }
    }
    let merged = plugin_entry_with(
        Path::new(interlock_contract::layout::DEFAULT_STATE_DIR),
        &map,
    );
    interlock_contract::PluginConfig::from_map(&merged).map_err(|e| bad(e.to_string()))?;
    Ok(map)
}

fn mkdir(p: &Path) -> Result<(), AgentError> {
    std::fs::create_dir_all(p).map_err(|e| AgentError::Dir {
        path: p.to_path_buf(),
        reason: format!("cannot create: {e}"),
    })
}

/// Descriptors kept for everything but the health server: the guard's reads, atomic
/// writes and VERSION execs, inotify, the marker, the runtime itself.
pub const RESERVED_DESCRIPTORS: u64 = 256;

/// How long SIGTERM waits for the guard thread to finish its pass before the agent exits
/// anyway (a guard blocked on a file must not keep the agent from stopping).
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (container runtimes often start
/// processes at 1024 soft) and returns the soft limit now in force.
pub fn raise_nofile_limit() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => {
                info!(from = soft, to = hard, "raised the open-file limit");
                hard
            }
            Err(e) => {
                warn!(soft, hard, error = %e, "cannot raise the open-file limit");
                soft
            }
        },
        Ok((soft, _)) => soft,
        Err(e) => {
            warn!(error = %e, "cannot read the open-file limit; assuming 1024");
            1024
        }
    }
}

/// Runs the agent until SIGTERM or SIGINT. The config stays in place on exit unless
/// `uninstall_on_exit` says otherwise ([`exit::decide`]).
pub fn run(cfg: AgentConfig) -> Result<(), AgentError> {
    // First of all: a SIGTERM from now on is the agent's to handle, also one that comes
    // while it is still starting (a rollout may stop an agent at any moment; without a
    // handler it would die of the signal). It is acted on once the runtime runs.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| AgentError::Runtime(format!("cannot start tokio: {e}")))?;
    let mut term = {
        let _in_runtime = rt.enter();
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| AgentError::Runtime(format!("cannot handle SIGTERM: {e}")))?
    };
    let created_conf_dir = prepare_dirs(&cfg)?;
    let nofile = raise_nofile_limit();
    let listeners = 1 + u64::from(cfg.probe_addr.is_some());
    let limits =
        health::ServerLimits::default().within_descriptors(nofile, RESERVED_DESCRIPTORS, listeners);
    let installer = guard::install::PluginInstaller::new(&cfg.plugin_source)?;
    log_start(&cfg, &installer);
    let shared = Arc::new(health::shared::Shared::default());
    let served = rt.block_on(serve_until_signal(
        &cfg,
        Started {
            installer,
            shared,
            limits,
            nofile,
            created_conf_dir,
        },
        &mut term,
    ));
    // A guard thread still blocked must not hold the process: drop the runtime without
    // waiting for it.
    rt.shutdown_background();
    let uninstall = served?;
    mark_stopped(&cfg);
    if uninstall {
        exit::uninstall(&cfg)?;
    }
    Ok(())
}

/// Creates the conf, bin and state dirs and sweeps the temp files a killed writer left.
/// Returns whether the conf dir had to be created.
fn prepare_dirs(cfg: &AgentConfig) -> Result<bool, AgentError> {
    // A conf dir that is not there was read by no runtime so far: said while waiting.
    let created_conf_dir = !cfg.conf_dir.exists();
    mkdir(&cfg.conf_dir)?;
    for b in &cfg.bin_dirs {
        mkdir(b)?;
    }
    mkdir(&cfg.state_dir)?;
    guard::sweep_stale_temps(&cfg.conf_dir);
    for b in &cfg.bin_dirs {
        guard::sweep_stale_temps(b);
    }
    Ok(created_conf_dir)
}

/// Logs what the agent starts with, and warns when `when-deleted` cannot work.
fn log_start(cfg: &AgentConfig, installer: &guard::install::PluginInstaller) {
    info!(
        version = env!("CARGO_PKG_VERSION"),
        conf_dir = %cfg.conf_dir.display(),
        bin_dirs = %Json(&cfg.bin_dirs),
        mode = %cfg.mode,
        runtime = %Json(cfg.runtime),
        plugin = %installer.source().display(),
        plugin_bytes = installer.len(),
        plugin_versions = %Json(installer.versions()),
        "interlock agent starting"
    );
    let entry = Value::Object(cfg.entry());
    info!(entry = %Json(&entry), "plugin entry");
    if cfg.uninstall_on_exit == UninstallOnExit::WhenDeleted {
        let problem = match (&cfg.pod, cfg.kube) {
            (_, KubeMode::None) => Some("the agent runs without a Kubernetes API (--kube none)"),
            (None, _) => Some(exit::POD_UNKNOWN),
            _ => None,
        };
        if let Some(p) = problem {
            warn!(
                "uninstall-on-exit=when-deleted cannot tell a deletion of the DaemonSet from a \
                 rollout: {p}. Every exit keeps interlock's CNI config and plugin binary"
            );
        }
    }
}

/// What [`run`] prepared before the runtime runs.
struct Started {
    installer: guard::install::PluginInstaller,
    shared: Arc<health::shared::Shared>,
    limits: health::ServerLimits,
    nofile: u64,
    created_conf_dir: bool,
}

/// Serves health, connects to the API, starts the audit, the agent socket and the guard,
/// then waits for SIGTERM or SIGINT and stops. Returns whether to uninstall.
async fn serve_until_signal(
    cfg: &AgentConfig,
    started: Started,
    term: &mut tokio::signal::unix::Signal,
) -> Result<bool, AgentError> {
    let Started {
        installer,
        shared,
        limits,
        nofile,
        created_conf_dir,
    } = started;
    serve_health(cfg, &shared, limits, nofile)?;
    // Before the guard writes anything: a missing node name stops the agent here. The
    // audit and the agent socket take the cluster (`None`: no Kubernetes API; the audit
    // then uses the sandboxes' own annotations and the socket cannot answer lookups).
    // A SIGTERM that came while the agent started (or comes while it connects to the
    // API) stops it here, before the guard ran: the config stays as it is unless
    // uninstall-on-exit says otherwise.
    let cluster = tokio::select! {
        c = start_kubernetes(cfg, &shared) => c?,
        _ = term.recv() => {
            info!(
                signal = "SIGTERM",
                "stopping during start-up, before the config guard ran"
            );
            return Ok(exit::decide(cfg, None).await);
        }
    };
    let client = cluster.as_ref().map(|c| c.client.clone());
    start_audit_and_socket(cfg, cluster, &shared)?;
    let (tx, done_rx) = start_guard(cfg, installer, &shared, created_conf_dir)?;
    let sig = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = tokio::signal::ctrl_c() => "SIGINT",
    };
    info!(
        signal = sig,
        uninstall_on_exit = %cfg.uninstall_on_exit,
        "stopping"
    );
    let _ = tx.send(guard::Wake::Stop);
    // The guard stops while the API is asked (`when-deleted`): both are bounded.
    let guard_stopped = async {
        if tokio::time::timeout(STOP_GRACE, done_rx).await.is_err() {
            error!(
                waited_seconds = STOP_GRACE.as_secs_f64(),
                since_last_pass_seconds = shared.since_tick().as_secs_f64(),
                "the config guard did not finish its pass; exiting without it"
            );
        }
    };
    let ((), uninstall) = tokio::join!(guard_stopped, exit::decide(cfg, client));
    Ok(uninstall)
}

/// Binds the health endpoints (and the kubelet probe endpoints, if asked) and serves them
/// on the runtime.
fn serve_health(
    cfg: &AgentConfig,
    shared: &Arc<health::shared::Shared>,
    limits: health::ServerLimits,
    nofile: u64,
) -> Result<(), AgentError> {
    let admin = health::Admin::new(
        shared.clone(),
        health::verdicts::VerdictWindows::for_marker(cfg.marker_stale_after),
    );
    let listen = |addr: SocketAddr| {
        health::bind(addr).map_err(|e| AgentError::Listen {
            addr: addr.to_string(),
            reason: e.to_string(),
        })
    };
    let listener = listen(cfg.health_addr)?;
    info!(
        addr = %listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default(),
        max_connections = limits.max_connections,
        open_file_limit = nofile,
        "health endpoints listening"
    );
    if let Some(addr) = cfg.probe_addr {
        let probes = listen(addr)?;
        info!(%addr, "kubelet probe endpoints (/healthz, /readyz) listening");
        tokio::spawn(health::serve(probes, admin.clone().probes_only(), limits));
    }
    tokio::spawn(health::serve(listener, admin, limits));
    Ok(())
}

/// Serves the agent socket and starts the sandbox audit (unless disabled), joined by the
/// queue of ADD notes.
fn start_audit_and_socket(
    cfg: &AgentConfig,
    cluster: Option<kubernetes::Cluster>,
    shared: &Arc<health::shared::Shared>,
) -> Result<(), AgentError> {
    let fallback = cfg.audit.as_ref().map(|a| audit::socket::CriFallback {
        endpoint: a.cri_endpoint.clone(),
    });
    // ADD notes go to the audit, through a bounded queue; without an audit there is
    // no queue and a note is answered `undecided` (nothing is kept).
    let (wake_tx, wake_rx) = match &cfg.audit {
        Some(_) => {
            let (tx, rx) = tokio::sync::mpsc::channel::<String>(audit::NOTE_QUEUE);
            (Some(tx), Some(rx))
        }
        None => (None, None),
    };
    serve_agent_socket(
        &cfg.state_dir,
        cluster.clone(),
        fallback,
        wake_tx,
        shared.starts.clone(),
    )?;
    if let (Some(settings), Some(wake_rx)) = (cfg.audit.clone(), wake_rx) {
        let mut plugin = interlock_contract::PluginConfig::from_map(&cfg.entry())
            .map_err(|e| AgentError::Runtime(format!("the plugin entry is invalid: {e}")))?;
        // Guard mode: the audit proves the mesh's own capture (audit::guarded).
        if let (Some(mesh), None) = (cfg.guard, &plugin.guard) {
            plugin.guard = Some(interlock_contract::guard::GuardRole {
                mesh,
                hold: false,
                reason: None,
                exclude_namespaces: Vec::new(),
            });
        }
        tokio::spawn(audit::run(
            settings,
            plugin,
            cluster,
            shared.audit.clone(),
            shared.audit_health.clone(),
            wake_rx,
        ));
    } else {
        info!("sandbox audit disabled (--cri-endpoint none)");
    }
    Ok(())
}

/// Starts the inotify watcher and the config guard's thread. Returns the guard's wake
/// channel and a receiver that resolves once the guard has stopped.
fn start_guard(
    cfg: &AgentConfig,
    installer: guard::install::PluginInstaller,
    shared: &Arc<health::shared::Shared>,
    created_conf_dir: bool,
) -> Result<
    (
        std::sync::mpsc::Sender<guard::Wake>,
        tokio::sync::oneshot::Receiver<()>,
    ),
    AgentError,
> {
    let (tx, rx) = std::sync::mpsc::channel();
    guard::spawn_watcher(&cfg.conf_dir, &cfg.bin_dirs, tx.clone()).map_err(|e| {
        AgentError::Dir {
            path: cfg.conf_dir.clone(),
            reason: format!("cannot watch with inotify: {e}"),
        }
    })?;
    let mut g = guard::Guard::new(cfg.clone(), installer, shared.clone());
    if created_conf_dir {
        g.created_conf_dir();
    }
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    // Configs may nest 10,000 deep (Go's limit, which the runtimes accept); the guard
    // clones, compares and writes them, all recursive.
    std::thread::Builder::new()
        .name("interlock-guard".into())
        .stack_size(interlock_libcni::gojson::DEEP_VALUE_STACK)
        .spawn(move || {
            g.run(rx);
            let _ = done_tx.send(());
        })
        .map_err(|e| AgentError::Runtime(format!("cannot start guard thread: {e}")))?;
    Ok((tx, done_rx))
}

/// Writes the readiness marker of an agent that stopped.
fn mark_stopped(cfg: &AgentConfig) {
    let stopped = guard::marker::Marker {
        ready: false,
        reason: format!("interlock agent (pid {}) stopped", std::process::id()),
        updated_at_ms: interlock_contract::time::now_ms(),
        stale_after_ms: cfg.marker_stale_after.as_millis() as u64,
        pid: std::process::id(),
        pid_namespace: None,
        config_path: String::new(),
        runtime: Some(cfg.runtime.to_string()),
        cri_endpoint: Some(
            cfg.audit
                .as_ref()
                .map_or_else(|| "none".into(), |a| a.cri_endpoint.clone()),
        ),
        fight: None,
    };
    if let Err(e) = guard::marker::write(&cfg.state_dir, &stopped) {
        error!(state_dir = %cfg.state_dir.display(), error = %e, "cannot mark the agent stopped");
    }
}

/// Serves `<state dir>/agent.sock`: pod lookups from the cluster's pod cache, else from
/// the runtime's sandboxes (else an `undecided` answer saying why), and the plugin's ADD
/// notes, sent on to the audit, and its failure notes, counted in `starts`.
fn serve_agent_socket(
    state_dir: &Path,
    cluster: Option<kubernetes::Cluster>,
    fallback: Option<audit::socket::CriFallback>,
    added: Option<audit::socket::AddedNotes>,
    starts: health::metrics::PodStartMetrics,
) -> Result<(), AgentError> {
    let path = audit::socket_path(state_dir);
    let listener = audit::socket::bind(&path).map_err(|e| AgentError::Runtime(e.to_string()))?;
    let source: Arc<dyn audit::socket::PodSource> = match cluster {
        Some(c) => Arc::new(c.pods),
        None => Arc::new(audit::socket::NoSource(
            "the agent runs without a Kubernetes API (--kube none): it cannot look up pod annotations"
                .into(),
        )),
    };
    info!(path = %path.display(), "agent socket listening");
    tokio::spawn(audit::socket::serve(
        listener,
        source,
        fallback,
        added,
        Some(starts),
    ));
    Ok(())
}

/// Connects to the Kubernetes API as `--kube` says and starts the pod watch and the node
/// gate; `None` when there is no API to talk to (logged). Only a missing node name stops
/// the agent: API failures later are logged and retried, never fatal.
pub async fn start_kubernetes(
    cfg: &AgentConfig,
    shared: &Arc<health::shared::Shared>,
) -> Result<Option<kubernetes::Cluster>, AgentError> {
    if cfg.kube == KubeMode::None {
        info!("Kubernetes integration off (--kube=none)");
        return Ok(None);
    }
    let (client, creds) = match kubernetes::connect().await {
        Ok(Some(c)) => c,
        Ok(None) => {
            info!("no Kubernetes credentials (no in-cluster service account, no $KUBECONFIG or ~/.kube/config); continuing without the API (as --kube=none)");
            return Ok(None);
        }
        Err(e) => {
            error!("cannot load Kubernetes credentials: {e}; continuing without the API (as --kube=none)");
            return Ok(None);
        }
    };
    let Some(node) = cfg.node_name.clone().filter(|n| !n.is_empty()) else {
        return Err(AgentError::Runtime(format!(
            "Kubernetes credentials found ({creds}) but no node name: pass --node-name or set NODE_NAME \
             (in a DaemonSet: env NODE_NAME from fieldRef spec.nodeName), or --kube=none"
        )));
    };
    info!(
        credentials = %creds,
        node = %node,
        taint_effect = cfg.taint_effect.as_api().unwrap_or("none"),
        "Kubernetes API: gating the node and watching its pods"
    );
    let settings = kubernetes::KubeSettings {
        node,
        effect: cfg.taint_effect,
        resync: cfg.resync_interval,
    };
    Ok(Some(kubernetes::start(client, &settings, shared.clone())))
}

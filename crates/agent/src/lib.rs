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
//!   readiness file `interlock check` reads.
//! - [`audit`], audit and repair (tokio, netns work on threads of its own): the sandbox
//!   audit acts, [`audit::decide`] decides (pure), and [`audit::socket`] serves the
//!   plugin's pod lookups and hands its ADD notes to the audit.
//! - [`kubernetes`], the Kubernetes side (tokio tasks): [`kubernetes::gate`] keeps the
//!   node's taint and condition in step with readiness, [`kubernetes::gating`] decides
//!   them (pure), [`kubernetes::pods`] caches this node's pods, and
//!   [`kubernetes::actions`] labels, reports on, deletes and evicts them for the audit.
//! - [`health`] serves `/healthz`, `/readyz` and `/metrics`: [`health::shared`] is the
//!   state the other loops share with it, [`health::metrics`] its Prometheus series,
//!   [`health::verdicts`] decides what the endpoints answer (pure), and
//!   [`health::telemetry`] sets up the logs.
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
pub mod guard;
pub mod health;
pub mod kubernetes;

pub use error::AgentError;

use guard::plan::{ConfigMode, Settings};
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
    /// Remove what interlock added when the agent exits.
    pub uninstall_on_exit: bool,
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
    /// Conflicts on one file within `conflict_window` that trigger a back-off (0: never).
    pub conflict_threshold: u32,
    /// Window for counting conflicts (another writer taking interlock out of a file).
    pub conflict_window: Duration,
    /// The sandbox audit (`--cri-endpoint`, `--audit-interval`, `--repair-policy`);
    /// `None`: no audit (`--cri-endpoint none`).
    pub audit: Option<audit::AuditSettings>,
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
            taint_effect: kubernetes::gating::TaintEffect::NoSchedule,
            health_addr: "127.0.0.1:9102".parse().expect("valid address"),
            probe_addr: None,
            plugin_source,
            uninstall_on_exit: false,
            allow_ahead: vec![],
            max_cni_version: None,
            plugin_config: Map::new(),
            resync_interval: Duration::from_secs(10),
            marker_stale_after: Duration::from_secs(3),
            conflict_threshold: 20,
            conflict_window: Duration::from_secs(1),
            audit: Some(audit::AuditSettings::default()),
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
/// `uninstall_on_exit` is set.
pub fn run(cfg: AgentConfig) -> Result<(), AgentError> {
    mkdir(&cfg.conf_dir)?;
    for b in &cfg.bin_dirs {
        mkdir(b)?;
    }
    mkdir(&cfg.state_dir)?;
    guard::sweep_stale_temps(&cfg.conf_dir);
    for b in &cfg.bin_dirs {
        guard::sweep_stale_temps(b);
    }
    let nofile = raise_nofile_limit();
    let listeners = 1 + u64::from(cfg.probe_addr.is_some());
    let limits =
        health::ServerLimits::default().within_descriptors(nofile, RESERVED_DESCRIPTORS, listeners);
    let installer = guard::install::PluginInstaller::new(&cfg.plugin_source)?;
    info!(
        version = env!("CARGO_PKG_VERSION"),
        conf_dir = %cfg.conf_dir.display(),
        bin_dirs = ?cfg.bin_dirs,
        mode = ?cfg.mode,
        runtime = ?cfg.runtime,
        plugin = %installer.source().display(),
        plugin_bytes = installer.len(),
        plugin_versions = ?installer.versions(),
        "interlock agent starting"
    );
    let entry = Value::Object(cfg.entry());
    info!(%entry, "plugin entry");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| AgentError::Runtime(format!("cannot start tokio: {e}")))?;
    let shared = Arc::new(health::shared::Shared::default());
    let admin = health::Admin::new(
        shared.clone(),
        health::verdicts::VerdictWindows::for_marker(cfg.marker_stale_after),
    );
    let served = rt.block_on(async {
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
        // Before the guard writes anything: a missing node name stops the agent here. The
        // audit and the agent socket take the cluster (`None`: no Kubernetes API; the audit
        // then uses the sandboxes' own annotations and the socket cannot answer lookups).
        let cluster = start_kubernetes(&cfg, &shared).await?;
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
        serve_agent_socket(&cfg.state_dir, cluster.clone(), fallback, wake_tx)?;
        if let (Some(settings), Some(wake_rx)) = (cfg.audit.clone(), wake_rx) {
            let plugin = interlock_contract::PluginConfig::from_map(&cfg.entry())
                .map_err(|e| AgentError::Runtime(format!("the plugin entry is invalid: {e}")))?;
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
        let (tx, rx) = std::sync::mpsc::channel();
        guard::spawn_watcher(&cfg.conf_dir, &cfg.bin_dirs, tx.clone()).map_err(|e| {
            AgentError::Dir {
                path: cfg.conf_dir.clone(),
                reason: format!("cannot watch with inotify: {e}"),
            }
        })?;
        let g = guard::Guard::new(cfg.clone(), installer, shared.clone());
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
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| AgentError::Runtime(format!("cannot handle SIGTERM: {e}")))?;
        let sig = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = tokio::signal::ctrl_c() => "SIGINT",
        };
        info!(
            signal = sig,
            "stopping (the CNI config stays in place{})",
            if cfg.uninstall_on_exit {
                " until uninstall"
            } else {
                ""
            }
        );
        let _ = tx.send(guard::Wake::Stop);
        if tokio::time::timeout(STOP_GRACE, done_rx).await.is_err() {
            error!(
                waited = ?STOP_GRACE,
                since_last_pass = ?shared.since_tick(),
                "the config guard did not finish its pass; exiting without it"
            );
        }
        Ok::<(), AgentError>(())
    });
    // A guard thread still blocked must not hold the process: drop the runtime without
    // waiting for it.
    rt.shutdown_background();
    served?;
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
    };
    if let Err(e) = guard::marker::write(&cfg.state_dir, &stopped) {
        error!(state_dir = %cfg.state_dir.display(), error = %e, "cannot mark the agent stopped");
    }
    if cfg.uninstall_on_exit {
        let opts = UninstallOptions {
            runtime: Some(cfg.runtime),
            own_socket: true,
            ..UninstallOptions::default()
        };
        let r = uninstall_node(&cfg.conf_dir, &cfg.bin_dirs, &cfg.state_dir, &opts);
        let lines = r.lines();
        info!(
            "uninstalled: {}",
            if lines.is_empty() {
                "nothing to remove".into()
            } else {
                lines.join("; ")
            }
        );
        for why in &r.incomplete {
            warn!("uninstall incomplete: {why}");
        }
        let errors = r.errors();
        if !errors.is_empty() {
            return Err(AgentError::Uninstall(errors));
        }
    }
    Ok(())
}

/// Serves `<state dir>/agent.sock`: pod lookups from the cluster's pod cache, else from
/// the runtime's sandboxes (else an `undecided` answer saying why), and the plugin's ADD
/// notes, sent on to the audit.
fn serve_agent_socket(
    state_dir: &Path,
    cluster: Option<kubernetes::Cluster>,
    fallback: Option<audit::socket::CriFallback>,
    added: Option<audit::socket::AddedNotes>,
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
    tokio::spawn(audit::socket::serve(listener, source, fallback, added));
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
        taint_effect = ?cfg.taint_effect,
        "Kubernetes API: gating the node and watching its pods"
    );
    let settings = kubernetes::KubeSettings {
        node,
        effect: cfg.taint_effect,
        resync: cfg.resync_interval,
    };
    Ok(Some(kubernetes::start(client, &settings, shared.clone())))
}

/// What one step of [`uninstall_node`] did or, in a dry run, would do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UninstallStep {
    /// `what` is removed.
    Remove {
        /// The file or directory.
        what: String,
        /// What it is, so that the reader knows why it goes.
        why: String,
    },
    /// The foreign config `what` is rewritten without interlock's entry.
    Rewrite {
        /// The file (`<name> in <conf dir>`).
        what: String,
    },
    /// The original `to` is put back from interlock's backup `from`.
    Restore {
        /// The backup's name.
        from: String,
        /// The original (`<name> in <conf dir>`).
        to: String,
    },
    /// `what` stays, on purpose.
    Keep {
        /// The file or directory.
        what: String,
        /// Why it stays, and what to do about it.
        why: String,
    },
    /// A step that failed (the others were still attempted).
    Failed {
        /// What was being done.
        doing: String,
        /// The error.
        error: String,
    },
}

impl UninstallStep {
    /// One line for people: what was done, or with `dry_run` what would be.
    pub fn line(&self, dry_run: bool) -> String {
        let verb = |done: &str, planned: &str| {
            if dry_run {
                format!("would {planned}")
            } else {
                done.to_string()
            }
        };
        match self {
            UninstallStep::Remove { what, why } => {
                format!("{} {what} ({why})", verb("removed", "remove"))
            }
            UninstallStep::Rewrite { what } => format!(
                "{} {what} without interlock's entry",
                verb("rewrote", "rewrite")
            ),
            UninstallStep::Restore { from, to } => {
                format!("{} {to} from {from}", verb("restored", "restore"))
            }
            UninstallStep::Keep { what, why } => format!("{} {what}: {why}", verb("kept", "keep")),
            UninstallStep::Failed { doing, error } => format!("FAILED {doing}: {error}"),
        }
    }

    /// The step as something to do (for the message when doing it failed).
    fn planned(&self) -> String {
        let l = self.line(true);
        l.strip_prefix("would ").unwrap_or(&l).to_string()
    }
}

/// How [`uninstall_node`] runs.
#[derive(Debug, Clone, Copy, Default)]
pub struct UninstallOptions {
    /// Change nothing: say what would be removed and what would stay.
    pub dry_run: bool,
    /// Remove the plugin binary even while something still needs it (a config that names
    /// it, or CRI-O pods set up through it).
    pub force: bool,
    /// The node's runtime; `None`: the one the agent's readiness marker names, if any.
    pub runtime: Option<Runtime>,
    /// The caller is the agent that served `agent.sock` (uninstall on exit): remove it
    /// without asking whether something listens (its own listener may not be closed yet).
    pub own_socket: bool,
}

/// Everything [`uninstall_node`] did, or would do, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UninstallReport {
    /// Nothing was changed.
    pub dry_run: bool,
    /// The steps, in the order they ran.
    pub steps: Vec<UninstallStep>,
    /// Why interlock is not gone from the node afterwards (empty: it is, apart from the
    /// records kept on purpose), one sentence each.
    pub incomplete: Vec<String>,
}

impl UninstallReport {
    /// One line per step.
    pub fn lines(&self) -> Vec<String> {
        self.steps.iter().map(|s| s.line(self.dry_run)).collect()
    }

    /// The failed steps, one line each.
    pub fn errors(&self) -> Vec<String> {
        self.steps
            .iter()
            .filter(|s| matches!(s, UninstallStep::Failed { .. }))
            .map(|s| s.line(self.dry_run))
            .collect()
    }
}

/// Removes exactly what interlock added, as the agent does on exit
/// (`--uninstall-on-exit`): [`uninstall_node`] without options; `Ok` with the report's
/// lines unless a step failed.
pub fn uninstall(
    conf_dir: &Path,
    bin_dirs: &[PathBuf],
    state_dir: &Path,
) -> Result<Vec<String>, AgentError> {
    let r = uninstall_node(conf_dir, bin_dirs, state_dir, &UninstallOptions::default());
    let errors = r.errors();
    if errors.is_empty() {
        Ok(r.lines())
    } else {
        Err(AgentError::Uninstall(errors))
    }
}

/// Removes exactly what interlock added to this node, in an order that never leaves a
/// config naming a plugin that is gone:
///
/// 1. the conf dir: owned config files, interlock's entries in foreign configs, wrapped
///    `.conf`s restored byte for byte ([`guard::plan::plan_uninstall_explained`]);
/// 2. the `interlock-cni` binary in each bin dir — unless a config file in the conf dir
///    still names it afterwards (a runtime loading that file could start no pod), or the
///    node runs CRI-O and pods set up through it still have attachment records (CRI-O
///    tears a pod down with the config it was set up with, so their DEL needs it); the
///    report says which, and `force` removes it anyway;
/// 3. the state dir: the readiness marker, the agent socket (when nothing listens), the
///    plugin's backend cache, and the `attachments/` and `netns/` directories when they
///    are empty. Records of pods still running stay (see [`UninstallStep::Keep`]'s
///    reasons), and so does anything else found there.
///
/// Every step is attempted; failures are [`UninstallStep::Failed`] steps. With
/// `dry_run` nothing is changed: the conf dir's outcome is computed in memory.
pub fn uninstall_node(
    conf_dir: &Path,
    bin_dirs: &[PathBuf],
    state_dir: &Path,
    opts: &UninstallOptions,
) -> UninstallReport {
    let mut r = UninstallReport {
        dry_run: opts.dry_run,
        ..UninstallReport::default()
    };
    let naming = uninstall_conf_dir(conf_dir, opts.dry_run, &mut r);
    let runtime = opts.runtime.or_else(|| {
        guard::marker::read(state_dir)
            .ok()
            .and_then(|m| m.runtime?.parse().ok())
    });
    let attachments = state_dir.join(interlock_contract::layout::ATTACHMENTS_DIR);
    let crio_pods = match runtime {
        Some(Runtime::Crio) => json_files(&attachments),
        _ => 0,
    };
    let mut blockers: Vec<(String, String)> = vec![];
    match &naming {
        Ok(files) if files.is_empty() => {}
        Ok(files) => {
            let one = files.len() == 1;
            let short = format!(
                "{} still {} interlock-cni as a plugin",
                files.join(", "),
                if one { "names" } else { "name" }
            );
            let long = format!(
                "{short}: a runtime that loads {} could start no pod without this binary. Remove \
                 the interlock-cni entry from {} (or the file itself) and run interlock uninstall \
                 again",
                if one { "it" } else { "one of them" },
                if one { "that file" } else { "those files" }
            );
            blockers.push((short, long));
        }
        Err(e) => blockers.push((
            format!(
                "whether a config in {} names it is unknown",
                conf_dir.display()
            ),
            format!(
                "whether a config in {} still names interlock-cni is unknown ({e})",
                conf_dir.display()
            ),
        )),
    }
    if crio_pods > 0 {
        let short = format!(
            "{crio_pods} pod attachment(s) recorded in {} were set up through it on CRI-O",
            attachments.display()
        );
        let long = format!(
            "{short}, which tears a pod down with the config it was set up with: without the \
             binary their DEL fails, and with it the primary plugin's teardown (their IP \
             addresses leak). Run `interlock uninstall --runtime crio` again once those pods \
             are gone (drain the node)"
        );
        blockers.push((short, long));
    }
    for b in bin_dirs {
        let p = b.join(guard::install::PLUGIN_FILE);
        match std::fs::symlink_metadata(&p) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                r.steps.push(UninstallStep::Failed {
                    doing: format!("inspecting {}", p.display()),
                    error: e.to_string(),
                });
                continue;
            }
        }
        if blockers.is_empty() {
            let why = format!(
                "the plugin binary; no config in {} names it any more",
                conf_dir.display()
            );
            remove_path(&mut r, &p, why, false);
        } else if opts.force {
            let shorts: Vec<&str> = blockers.iter().map(|(s, _)| s.as_str()).collect();
            let why = format!(
                "the plugin binary, removed on --force although {}",
                shorts.join(", and ")
            );
            remove_path(&mut r, &p, why, false);
        } else {
            let longs: Vec<&str> = blockers.iter().map(|(_, l)| l.as_str()).collect();
            let why = format!("{}; or pass --force", longs.join(". Also, "));
            r.incomplete.push(format!("{} stays: {why}", p.display()));
            r.steps.push(UninstallStep::Keep {
                what: p.display().to_string(),
                why,
            });
        }
    }
    uninstall_state_dir(state_dir, opts, &mut r);
    r
}

/// The conf dir's part of [`uninstall_node`]: returns the config files (`<name> in
/// <dir>`) that still name interlock-cni afterwards (in a dry run: would), or why that
/// is unknown.
fn uninstall_conf_dir(
    conf_dir: &Path,
    dry_run: bool,
    r: &mut UninstallReport,
) -> Result<Vec<String>, String> {
    use interlock_contract::shown::shown;
    let at = |name: &str| format!("{} in {}", shown(name), conf_dir.display());
    let snap = match guard::snapshot(conf_dir) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => {
            r.steps.push(UninstallStep::Failed {
                doing: format!("reading {}", conf_dir.display()),
                error: e.to_string(),
            });
            return Err(e.to_string());
        }
    };
    let up = guard::plan::plan_uninstall_explained(&snap);
    for n in &up.notes {
        // Notes say `kept <name>: <why>`.
        let step = match n.strip_prefix("kept ").and_then(|k| k.split_once(": ")) {
            Some((name, why)) => UninstallStep::Keep {
                what: format!("{name} in {}", conf_dir.display()),
                why: why.to_string(),
            },
            None => UninstallStep::Keep {
                what: conf_dir.display().to_string(),
                why: n.clone(),
            },
        };
        r.steps.push(step);
    }
    for a in &up.actions {
        let step = match a {
            guard::plan::Action::Write { name, .. } => UninstallStep::Rewrite { what: at(name) },
            guard::plan::Action::Rename { from, to } => UninstallStep::Restore {
                from: shown(from),
                to: at(to),
            },
            guard::plan::Action::Remove { name } => UninstallStep::Remove {
                what: at(name),
                why: match name.strip_suffix(guard::plan::BACKUP_SUFFIX) {
                    Some(orig) => format!(
                        "interlock's backup of {}, which the primary has written again since",
                        shown(orig)
                    ),
                    None if guard::plan::is_owned_name(name) => "interlock's own config".into(),
                    None => "interlock's .conflist wrapping the original restored above".into(),
                },
            },
        };
        if dry_run {
            r.steps.push(step);
            continue;
        }
        match guard::apply(conf_dir, a) {
            Ok(()) => r.steps.push(step),
            Err(e) => r.steps.push(UninstallStep::Failed {
                doing: step.planned(),
                error: e.to_string(),
            }),
        }
    }
    let after = if dry_run {
        simulate(&snap, &up.actions)
    } else {
        guard::snapshot(conf_dir).map_err(|e| e.to_string())?
    };
    let mut naming = vec![];
    for e in after.entries.iter().filter(|e| e.is_config()) {
        match &e.content {
            Some(bytes) if names_plugin(bytes) => naming.push(at(&e.shown())),
            Some(_) => {}
            None => r.steps.push(UninstallStep::Keep {
                what: at(&e.shown()),
                why: format!(
                    "not interlock's, and cannot be read ({}), so whether it names interlock-cni \
                     is unknown",
                    e.unreadable.as_deref().unwrap_or("not read")
                ),
            }),
        }
    }
    Ok(naming)
}

/// `snap` after `actions`, computed in memory (the dry run's conf dir).
fn simulate(
    snap: &interlock_confdir::Snapshot,
    actions: &[guard::plan::Action],
) -> interlock_confdir::Snapshot {
    use std::ffi::OsStr;
    let mut s = snap.clone();
    let at = |s: &interlock_confdir::Snapshot, name: &str| {
        s.entries
            .iter()
            .position(|e| e.os_name.as_os_str() == OsStr::new(name))
    };
    for a in actions {
        match a {
            guard::plan::Action::Write { name, bytes, mode } => {
                s.entries
                    .retain(|e| e.os_name.as_os_str() != OsStr::new(name));
                s.entries
                    .push(interlock_confdir::DirEntry::file(name, bytes, *mode));
            }
            guard::plan::Action::Remove { name } => {
                s.entries
                    .retain(|e| e.os_name.as_os_str() != OsStr::new(name));
            }
            guard::plan::Action::Rename { from, to } => {
                if let Some(i) = at(&s, from) {
                    let mut e = s.entries.remove(i);
                    s.entries
                        .retain(|x| x.os_name.as_os_str() != OsStr::new(to));
                    e.name = to.clone();
                    e.os_name = to.into();
                    s.entries.push(e);
                }
            }
        }
    }
    s
}

/// True when a config's bytes name interlock-cni as a plugin anywhere: in `plugins`, as
/// a single `.conf`'s own type, or inside a meta plugin's delegates (any object whose
/// `type` is interlock-cni). Bytes that are not JSON here are judged by the words, as a
/// runtime's parser might still read them.
fn names_plugin(bytes: &[u8]) -> bool {
    let Ok(v) = serde_json::from_slice::<Value>(bytes) else {
        return bytes
            .windows(guard::plan::PLUGIN_TYPE.len())
            .any(|w| w == guard::plan::PLUGIN_TYPE.as_bytes());
    };
    let mut stack = vec![&v];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(m) => {
                if m.get("type").and_then(Value::as_str) == Some(guard::plan::PLUGIN_TYPE) {
                    return true;
                }
                stack.extend(m.values());
            }
            Value::Array(a) => stack.extend(a.iter()),
            _ => {}
        }
    }
    false
}

/// How many `*.json` files `dir` holds (0 when it cannot be read).
fn json_files(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |rd| {
        rd.flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
            .count()
    })
}

/// Removes `path` (a directory with `dir`: only when empty) unless this is a dry run,
/// and records the step; true when it is (or would be) gone.
fn remove_path(r: &mut UninstallReport, path: &Path, why: String, dir: bool) -> bool {
    if !r.dry_run {
        let res = if dir {
            std::fs::remove_dir(path)
        } else {
            std::fs::remove_file(path)
        };
        match res {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                r.steps.push(UninstallStep::Failed {
                    doing: format!("removing {}", path.display()),
                    error: e.to_string(),
                });
                return false;
            }
        }
    }
    r.steps.push(UninstallStep::Remove {
        what: path.display().to_string(),
        why,
    });
    true
}

/// The state dir's part of [`uninstall_node`].
fn uninstall_state_dir(state_dir: &Path, opts: &UninstallOptions, r: &mut UninstallReport) {
    use interlock_contract::layout::{
        AGENT_SOCKET_FILE, ATTACHMENTS_DIR, BACKEND_CACHE_FILE, MARKER_FILE, NETNS_DIR,
    };
    use std::os::unix::fs::FileTypeExt;
    let mut names: Vec<std::ffi::OsString> = match std::fs::read_dir(state_dir) {
        Ok(rd) => rd.flatten().map(|e| e.file_name()).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(e) => {
            r.steps.push(UninstallStep::Failed {
                doing: format!("reading {}", state_dir.display()),
                error: e.to_string(),
            });
            return;
        }
    };
    names.sort();
    let leftover = "Small files (under /var/run, a tmpfs, by default: gone at reboot); delete \
                    them by hand once no pod started before the uninstall runs";
    for name in names {
        let path = state_dir.join(&name);
        let Some(n) = name.to_str() else {
            r.steps.push(UninstallStep::Keep {
                what: path.display().to_string(),
                why: "not a file interlock writes; left alone".into(),
            });
            continue;
        };
        match n {
            MARKER_FILE => {
                remove_path(r, &path, "the agent's readiness marker".into(), false);
            }
            AGENT_SOCKET_FILE => {
                let socket =
                    std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_socket());
                if !socket {
                    r.steps.push(UninstallStep::Keep {
                        what: path.display().to_string(),
                        why: "not a socket, so not the agent's; left alone".into(),
                    });
                } else if !opts.own_socket && std::os::unix::net::UnixStream::connect(&path).is_ok()
                {
                    r.steps.push(UninstallStep::Keep {
                        what: path.display().to_string(),
                        why:
                            "an agent still listens on it; run uninstall again once it has stopped"
                                .into(),
                    });
                } else {
                    remove_path(
                        r,
                        &path,
                        "the agent's socket; nothing listens on it any more".into(),
                        false,
                    );
                }
            }
            BACKEND_CACHE_FILE => {
                remove_path(
                    r,
                    &path,
                    "the plugin's cached detection of the host's netfilter backend; an ADD that \
                     still runs detects again"
                        .into(),
                    false,
                );
            }
            ATTACHMENTS_DIR | NETNS_DIR => {
                let entries = std::fs::read_dir(&path).map(|rd| rd.flatten().count());
                match entries {
                    Ok(0) => {
                        remove_path(r, &path, "empty: no pod's records".into(), true);
                    }
                    Ok(_) => {
                        let records = json_files(&path);
                        let why = if n == ATTACHMENTS_DIR {
                            format!(
                                "{records} record(s) of pods attached while interlock was \
                                 installed. Under CRI-O, which tears a pod down with the config \
                                 it was set up with, interlock-cni's DEL still runs for them and \
                                 reads these to remove exactly its rules; under containerd, DEL \
                                 runs the config loaded now, without interlock-cni, so the rules \
                                 go with the pod's network namespace and these are left over. \
                                 {leftover}"
                            )
                        } else {
                            format!(
                                "{records} record(s) of protected pod network namespaces, with \
                                 their locks: interlock-cni's DEL uses them to keep the rules \
                                 another attachment of the same namespace still relies on. \
                                 {leftover}"
                            )
                        };
                        r.steps.push(UninstallStep::Keep {
                            what: path.display().to_string(),
                            why,
                        });
                    }
                    Err(e) => r.steps.push(UninstallStep::Failed {
                        doing: format!("reading {}", path.display()),
                        error: e.to_string(),
                    }),
                }
            }
            _ if guard::is_stale_temp(n) => {
                remove_path(
                    r,
                    &path,
                    "a temporary file left by an interrupted write".into(),
                    false,
                );
            }
            _ => r.steps.push(UninstallStep::Keep {
                what: path.display().to_string(),
                why: "not a file interlock writes; left alone".into(),
            }),
        }
    }
}

//! `interlock agent` and `interlock uninstall`: flags (each mirrored by an environment
//! variable) turned into an `interlock_agent::AgentConfig`.

use anyhow::Context;
use clap::Args;
use interlock_agent::audit::decide::RepairPolicy;
use interlock_agent::audit::AuditSettings;
use interlock_agent::guard::plan::ConfigMode;
use interlock_agent::kubernetes::gating::TaintEffect;
use interlock_agent::{AgentConfig, KubeMode, Runtime, UninstallOnExit};
use interlock_contract::guard::GuardedMesh;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// Directories shared by `agent` and `uninstall`.
#[derive(Debug, Args)]
pub struct Dirs {
    /// The runtime's CNI config directory.
    #[arg(long, env = "INTERLOCK_CNI_CONF_DIR", default_value = "/etc/cni/net.d")]
    pub cni_conf_dir: PathBuf,
    /// A CNI bin dir interlock-cni is installed in (repeatable; in the environment
    /// variable, ':'-separated like CNI_PATH).
    #[arg(
        long = "cni-bin-dir",
        env = "INTERLOCK_CNI_BIN_DIR",
        value_delimiter = crate::BIN_DIR_DELIMITER,
        default_value = "/opt/cni/bin"
    )]
    pub cni_bin_dirs: Vec<PathBuf>,
    /// Where the readiness marker and plugin state live.
    #[arg(
        long,
        env = "INTERLOCK_STATE_DIR",
        default_value = "/var/run/interlock"
    )]
    pub state_dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct AgentArgs {
    #[command(flatten)]
    pub dirs: Dirs,
    /// owned: write our own config sorting first; chain: insert into the target in place;
    /// guard: keep the mesh named by --guard-mesh's own CNI plugin in the chain (a file of
    /// ours sorting first: the primary's plugins, interlock-cni holding meshed pods back
    /// while the mesh's plugin cannot run, then the mesh's plugin) and redirect nothing.
    #[arg(long, env = "INTERLOCK_CONFIG_MODE", default_value = "owned")]
    pub config_mode: ConfigMode,
    /// Guard mode: the mesh whose own CNI plugin is guarded: istio (istio-cni), linkerd
    /// (linkerd-cni), consul (consul-cni) or kuma (kuma-cni). Only with --config-mode guard.
    #[arg(long, env = "INTERLOCK_GUARD_MESH")]
    pub guard_mesh: Option<GuardedMesh>,
    /// Guard mode: where the host's root is mounted in the agent's container, to check the
    /// files the mesh's plugin needs at ADD (its kubeconfig) at the paths its entry names
    /// (a file in the host's conf dir is found in --cni-conf-dir whatever this says).
    #[arg(long, env = "INTERLOCK_GUARD_HOST_ROOT", default_value = "/")]
    pub guard_host_root: PathBuf,
    /// Chain mode: the file to chain into (default: the one the runtime loads).
    #[arg(long, env = "INTERLOCK_CHAIN_TARGET")]
    pub chain_target: Option<String>,
    /// Whose loading rules decide which config is effective: containerd or crio.
    #[arg(long, env = "INTERLOCK_RUNTIME", default_value = "containerd")]
    pub runtime: Runtime,
    #[command(flatten)]
    pub kube: KubeArgs,
    /// Address for /healthz, /readyz and /metrics.
    #[arg(long, env = "INTERLOCK_HEALTH_ADDR", default_value = "127.0.0.1:9102", value_parser = parse_listen_addr)]
    pub health_addr: SocketAddr,
    /// A second address with /healthz and /readyz only, for the kubelet's probes (e.g.
    /// 127.0.0.1:9103; empty: the probes use --health-addr).
    #[arg(long, env = "INTERLOCK_PROBE_ADDR", value_parser = parse_listen_addr)]
    pub probe_addr: Option<SocketAddr>,
    /// The interlock-cni binary to install (default: next to this binary).
    #[arg(long, env = "INTERLOCK_PLUGIN_SOURCE")]
    pub plugin_source: Option<PathBuf>,
    /// Remove what interlock added when the agent exits: false (everything stays), true
    /// (on every exit, a rollout's too), or when-deleted (only when the agent's DaemonSet is
    /// being deleted, as the Kubernetes API says on SIGTERM; needs --pod-name and
    /// --pod-namespace). The flag alone means true.
    #[arg(
        long,
        env = "INTERLOCK_UNINSTALL_ON_EXIT",
        value_name = "MODE",
        num_args = 0..=1,
        default_value = "false",
        default_missing_value = "true"
    )]
    pub uninstall_on_exit: UninstallOnExit,
    /// A config file allowed to sort ahead of ours; we chain into it instead (repeatable).
    #[arg(long, env = "INTERLOCK_ALLOW_AHEAD", value_delimiter = ',')]
    pub allow_ahead: Vec<String>,
    /// Highest cniVersion to write into the owned config (default: the highest every plugin supports).
    #[arg(long, env = "INTERLOCK_MAX_CNI_VERSION")]
    pub max_cni_version: Option<String>,
    /// JSON object of interlock-cni settings merged into the plugin entry the agent writes
    /// (failurePolicy, excludeNamespaces, logFile, logLevel, agentSocket, kubeconfig,
    /// backend, profiles, capabilities). Read and validated once at startup.
    #[arg(long, env = "INTERLOCK_PLUGIN_CONFIG")]
    pub plugin_config: Option<PathBuf>,
    /// Seconds between full resyncs.
    #[arg(
        long,
        env = "INTERLOCK_RESYNC_SECONDS",
        default_value_t = 10,
        hide = true
    )]
    pub resync_seconds: u64,
    /// Milliseconds after which the readiness marker counts as stale.
    #[arg(
        long,
        env = "INTERLOCK_MARKER_STALE_MS",
        default_value_t = 3000,
        hide = true
    )]
    pub marker_stale_ms: u64,
    /// Conflicts on one file (another writer undoing the agent's change) within
    /// --conflict-window-seconds beyond which the agent treats it as a fight and backs
    /// off (0: never).
    #[arg(
        long,
        env = "INTERLOCK_CONFLICT_THRESHOLD",
        default_value_t = 5,
        hide = true
    )]
    pub conflict_threshold: u32,
    /// The window conflicts are counted in, in seconds.
    #[arg(
        long,
        env = "INTERLOCK_CONFLICT_WINDOW_SECONDS",
        default_value_t = 30.0,
        hide = true
    )]
    pub conflict_window_seconds: f64,
    /// Seconds a file must be left alone before a fight over it is over (the agent stays
    /// not ready until then).
    #[arg(
        long,
        env = "INTERLOCK_CONFLICT_FORGIVE_SECONDS",
        default_value_t = 60.0,
        hide = true
    )]
    pub conflict_forgive_seconds: f64,
    /// The container runtime's own config file, to check that it reads --cni-conf-dir
    /// (repeatable; ':'-separated in the environment) [default: /etc/containerd/config.toml
    /// and k3s's and RKE2's for containerd, /etc/crio/crio.conf for crio; a missing file
    /// says nothing].
    #[arg(long = "runtime-config", env = "INTERLOCK_RUNTIME_CONFIG", value_delimiter = crate::BIN_DIR_DELIMITER)]
    pub runtime_configs: Vec<PathBuf>,
    /// Seconds without any primary config after which the agent logs where else the
    /// runtime may read its configs from.
    #[arg(
        long,
        env = "INTERLOCK_PRIMARY_WAIT_HINT_SECONDS",
        default_value_t = 60.0,
        hide = true
    )]
    pub primary_wait_hint_seconds: f64,
    // The sandbox audit.
    /// The runtime's CRI socket the audit lists sandboxes through (CRI-O's works the
    /// same); `none` turns the audit off.
    #[arg(
        long,
        env = "INTERLOCK_CRI_ENDPOINT",
        default_value = interlock_cri_default()
    )]
    pub cri_endpoint: String,
    /// Seconds between full audits of the node's sandboxes (also at start and at once
    /// after each ADD the plugin reports).
    #[arg(long, env = "INTERLOCK_AUDIT_INTERVAL", default_value_t = 10.0)]
    pub audit_interval: f64,
    /// What to do with a meshed sandbox running unprotected: repair (rules in place and
    /// its earlier connections ended), restart (stop the sandbox over CRI), delete, evict
    /// (need the Kubernetes API; without it: restart), report (only log, metric, label).
    #[arg(long, env = "INTERLOCK_REPAIR_POLICY", default_value = "repair")]
    pub repair_policy: RepairPolicy,
}

fn interlock_cri_default() -> &'static str {
    interlock_agent::audit::DEFAULT_CRI_ENDPOINT
}

/// The Kubernetes side of `interlock agent`.
#[derive(Debug, Args)]
pub struct KubeArgs {
    /// Kubernetes API: auto (in-cluster service account, else $KUBECONFIG; none when
    /// neither exists) or none.
    #[arg(long = "kube", env = "INTERLOCK_KUBE", default_value = "auto")]
    pub mode: KubeMode,
    /// This node's name in the API (required with a Kubernetes API; in a DaemonSet, from
    /// fieldRef spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// The agent's own pod's name (in a DaemonSet, from fieldRef metadata.name):
    /// --uninstall-on-exit when-deleted reads its owning DaemonSet.
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// The agent's own pod's namespace (in a DaemonSet, from fieldRef metadata.namespace).
    #[arg(long, env = "POD_NAMESPACE")]
    pub pod_namespace: Option<String>,
    /// Effect of the startup taint interlock.dev/not-ready: NoSchedule, PreferNoSchedule,
    /// NoExecute, or none (only the InterlockReady condition).
    #[arg(long, env = "INTERLOCK_TAINT_EFFECT", default_value = "NoSchedule")]
    pub taint_effect: TaintEffect,
}

/// `interlock uninstall`: this node's files, or with `--cluster` what the agents wrote
/// into the Kubernetes API.
#[derive(Debug, Args)]
pub struct UninstallArgs {
    #[command(flatten)]
    pub dirs: Dirs,
    /// Change nothing: list what would be removed and what would stay, and why (the exit
    /// code is the one a real run would have).
    #[arg(long)]
    pub dry_run: bool,
    /// Go ahead although an agent is running (it puts its files, or its node condition and
    /// labels, back at once), and remove the plugin binary although something still needs it.
    #[arg(long)]
    pub force: bool,
    /// The node's runtime, containerd or crio (CRI-O tears pods down with the config they
    /// were set up with, so their DEL needs the binary) [default: the one the agent's
    /// readiness marker names].
    #[arg(long, env = "INTERLOCK_RUNTIME")]
    pub runtime: Option<Runtime>,
    /// Clean the cluster instead of this node: remove the InterlockReady condition from
    /// every node and the interlock.dev/unprotected label from every pod (Kubernetes
    /// credentials as `check cluster`: in-cluster, $KUBECONFIG or ~/.kube/config).
    #[arg(long)]
    pub cluster: bool,
    /// With --cluster: also remove the startup taint interlock.dev/not-ready from the
    /// nodes that carry it (off by default: whoever registers the nodes may manage it).
    #[arg(long, requires = "cluster")]
    pub remove_taint: bool,
    /// With --cluster: the namespace the agent's DaemonSet runs in.
    #[arg(long, env = "INTERLOCK_NAMESPACE", default_value = crate::check::cluster::DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// With --cluster: the label selector of the agent's pods.
    #[arg(long, default_value = crate::check::cluster::DEFAULT_AGENT_SELECTOR)]
    pub agent_selector: String,
}

fn default_plugin_source() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find this binary's path")?;
    Ok(exe.with_file_name("interlock-cni"))
}

pub fn run_agent(a: AgentArgs) -> anyhow::Result<()> {
    let source = match a.plugin_source {
        Some(p) => p,
        None => default_plugin_source()?,
    };
    let mut cfg = AgentConfig::new(source);
    cfg.conf_dir = a.dirs.cni_conf_dir;
    cfg.bin_dirs = a.dirs.cni_bin_dirs;
    cfg.state_dir = a.dirs.state_dir;
    cfg.guard = guard_mesh(a.config_mode, a.guard_mesh, a.chain_target.as_deref())?;
    cfg.guard_host_root = a.guard_host_root;
    cfg.mode = a.config_mode;
    cfg.chain_target = a.chain_target;
    cfg.runtime = a.runtime;
    cfg.kube = a.kube.mode;
    cfg.node_name = a.kube.node_name;
    cfg.pod = match (a.kube.pod_namespace, a.kube.pod_name) {
        (Some(ns), Some(name)) if !ns.is_empty() && !name.is_empty() => Some((ns, name)),
        _ => None,
    };
    cfg.taint_effect = a.kube.taint_effect;
    cfg.health_addr = a.health_addr;
    cfg.probe_addr = a.probe_addr;
    cfg.uninstall_on_exit = a.uninstall_on_exit;
    cfg.allow_ahead = a.allow_ahead;
    cfg.max_cni_version = a.max_cni_version;
    if let Some(p) = &a.plugin_config {
        cfg.plugin_config = interlock_agent::load_plugin_config(p)?;
    }
    cfg.resync_interval = Duration::from_secs(a.resync_seconds.max(1));
    cfg.marker_stale_after = Duration::from_millis(a.marker_stale_ms.max(30));
    cfg.conflict_threshold = a.conflict_threshold;
    cfg.conflict_window = seconds("--conflict-window-seconds", a.conflict_window_seconds)?;
    cfg.conflict_forgive_after = seconds("--conflict-forgive-seconds", a.conflict_forgive_seconds)?;
    cfg.runtime_configs = (!a.runtime_configs.is_empty()).then_some(a.runtime_configs);
    cfg.primary_wait_hint = seconds("--primary-wait-hint-seconds", a.primary_wait_hint_seconds)?;
    cfg.audit = audit_settings(&a.cri_endpoint, a.audit_interval, a.repair_policy)?;
    interlock_agent::run(cfg).context("interlock agent failed")
}

/// The guarded mesh, checked against the config mode: guard mode needs a mesh, a mesh
/// needs guard mode, and guard mode has no chain target (it keeps a file of its own).
fn guard_mesh(
    mode: ConfigMode,
    mesh: Option<GuardedMesh>,
    chain_target: Option<&str>,
) -> anyhow::Result<Option<GuardedMesh>> {
    match (mode, mesh) {
        (ConfigMode::Guard, None) => anyhow::bail!(
            "--config-mode guard needs --guard-mesh (INTERLOCK_GUARD_MESH): the mesh whose CNI \
             plugin to guard (istio, linkerd, consul or kuma)"
        ),
        (ConfigMode::Guard, Some(_)) if chain_target.is_some() => anyhow::bail!(
            "--chain-target does not apply to --config-mode guard: guard mode keeps a file of \
             its own sorting first; remove --chain-target (INTERLOCK_CHAIN_TARGET)"
        ),
        (ConfigMode::Guard, Some(m)) => Ok(Some(m)),
        (other, Some(m)) => anyhow::bail!(
            "--guard-mesh {m} needs --config-mode guard (it is {other}): in {other} mode \
             interlock redirects traffic itself and guards no mesh's plugin"
        ),
        (_, None) => Ok(None),
    }
}

/// A positive, finite number of seconds from flag `flag` (at most a day).
fn seconds(flag: &str, v: f64) -> anyhow::Result<Duration> {
    if !(v.is_finite() && v > 0.0 && v <= 86_400.0) {
        anyhow::bail!("{flag} {v}: must be a number of seconds above 0 and at most 86400");
    }
    Ok(Duration::from_secs_f64(v))
}

fn audit_settings(
    endpoint: &str,
    interval: f64,
    policy: RepairPolicy,
) -> anyhow::Result<Option<AuditSettings>> {
    if endpoint == "none" {
        return Ok(None);
    }
    if !(interval.is_finite() && interval >= 0.1) {
        anyhow::bail!("--audit-interval {interval}: must be at least 0.1 seconds");
    }
    Ok(Some(AuditSettings {
        cri_endpoint: endpoint.to_string(),
        interval: Duration::from_secs_f64(interval),
        policy,
    }))
}

/// `interlock uninstall`: refuses while an agent runs on the state dir (unless
/// `--force`) and when the conf dir holds no CNI config at all (a wrong path would
/// otherwise "succeed"), then runs [`interlock_agent::uninstall::uninstall_node`] and prints every
/// step. Exit 0 when interlock is gone from the node (records kept on purpose aside), 1
/// when something stays that should not or a step failed.
pub fn run_uninstall(a: UninstallArgs) -> anyhow::Result<ExitCode> {
    if a.cluster {
        return cluster_uninstall::run(&a);
    }
    let d = &a.dirs;
    let mut refusal = None;
    match live_agent(&d.state_dir) {
        Ok(None) => {}
        Ok(Some(agent)) if a.force => eprintln!(
            "interlock uninstall: warning: {}; --force goes ahead, and the agent will put its \
             config and plugin binary back within milliseconds (stop it first; under the \
             DaemonSet: --uninstall-on-exit when-deleted, then delete the DaemonSet)",
            agent.describe()
        ),
        Ok(Some(agent)) => {
            let msg = format!(
                "{}; it would put its config and plugin binary back within milliseconds.\n  \
                 Under the DaemonSet: set INTERLOCK_UNINSTALL_ON_EXIT=when-deleted in the \
                 interlock-config ConfigMap (agent flag --uninstall-on-exit when-deleted), \
                 restart the agents (harmless in that mode), then delete the DaemonSet: each \
                 agent removes its files as it stops.\n  \
                 An agent started by hand: stop it (SIGTERM), then run interlock uninstall \
                 again.\n  \
                 --force goes ahead anyway (the running agent puts everything back)",
                agent.describe()
            );
            if !a.dry_run {
                anyhow::bail!("refusing to uninstall, nothing was changed: {msg}");
            }
            refusal = Some(msg);
        }
        Err(e) => eprintln!(
            "interlock uninstall: warning: cannot tell whether an agent runs on {}: {e}",
            d.state_dir.display()
        ),
    }
    if let Some(problem) = conf_dir_problem(&d.cni_conf_dir) {
        anyhow::bail!(
            "{problem}, so it is not the runtime's CNI config directory and nothing was removed \
             (not the plugin binary, not the readiness marker).{} Pass the runtime's directory \
             with --cni-conf-dir: containerd names it in config.toml (conf_dir in its CRI \
             plugin's cni section), CRI-O in crio.conf (network_dir in [crio.network]); k3s \
             uses /var/lib/rancher/k3s/agent/etc/cni/net.d",
            conf_dir_hints(&d.cni_conf_dir, &d.state_dir)
        );
    }
    let opts = interlock_agent::uninstall::UninstallOptions {
        dry_run: a.dry_run,
        force: a.force,
        runtime: a.runtime,
        own_socket: false,
    };
    let r = interlock_agent::uninstall::uninstall_node(
        &d.cni_conf_dir,
        &d.cni_bin_dirs,
        &d.state_dir,
        &opts,
    );
    if a.dry_run {
        println!("dry run: nothing was changed");
    }
    if r.steps.is_empty() {
        println!(
            "nothing of interlock's found in {}, {} or {}",
            d.cni_conf_dir.display(),
            d.cni_bin_dirs
                .iter()
                .map(|b| b.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            d.state_dir.display()
        );
    }
    for l in r.lines() {
        println!("{l}");
    }
    let errors = r.errors();
    let mut failed = false;
    if !errors.is_empty() {
        eprintln!("interlock uninstall: {} step(s) failed", errors.len());
        failed = true;
    }
    for why in &r.incomplete {
        eprintln!(
            "interlock uninstall: {}: {why}",
            if a.dry_run {
                "a real run would not be complete"
            } else {
                "not complete"
            }
        );
        failed = true;
    }
    if let Some(msg) = refusal {
        eprintln!("interlock uninstall: a real run would refuse: {msg}");
        failed = true;
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// An agent alive on a state dir, as its readiness marker says.
struct LiveAgent {
    pid: u32,
    marker: PathBuf,
    age_ms: u64,
    /// The PID was checked in this PID namespace (else the marker came from another one,
    /// and only its age says the agent is alive).
    pid_checked: bool,
}

impl LiveAgent {
    fn describe(&self) -> String {
        format!(
            "an interlock agent is running on this state dir: pid {}{} (its readiness marker {} \
             was written {} ms ago)",
            self.pid,
            if self.pid_checked {
                ""
            } else {
                " in another PID namespace"
            },
            self.marker.display(),
            self.age_ms
        )
    }
}

/// The agent alive on `state_dir`: its readiness marker is fresh and its writer's PID is
/// alive (when the marker comes from this PID namespace; `interlock check` judges it the
/// same way). `Err` when the marker exists but cannot be trusted.
fn live_agent(state_dir: &Path) -> Result<Option<LiveAgent>, String> {
    use interlock_contract::marker::ReadinessMarker;
    use std::os::unix::fs::MetadataExt;
    let path = interlock_contract::layout::marker_path(state_dir);
    let m = match ReadinessMarker::read(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let now = interlock_contract::time::now_ms();
    if m.staleness(now).is_some() {
        return Ok(None);
    }
    let own = std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino());
    let pid_checked = m.pid_namespace.is_some() && m.pid_namespace == own;
    if pid_checked && exited(m.pid) {
        return Ok(None);
    }
    Ok(Some(LiveAgent {
        pid: m.pid,
        marker: path,
        age_ms: now.saturating_sub(m.updated_at_ms),
        pid_checked,
    }))
}

/// True when `pid` has exited but was not reaped yet (a zombie: `/proc/<pid>` is still
/// there, which the marker's own liveness check counts as alive), or is gone.
fn exited(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // `pid (comm) S …`: the state follows the last `)` (comm may hold one).
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| matches!(state, 'Z' | 'X')),
        Err(_) => true,
    }
}

/// Why `conf_dir` cannot be the runtime's CNI config directory: it does not exist, or
/// holds no file a runtime would load (`*.conf`, `*.conflist`, `*.json`) and no backup
/// of interlock's. `None` when it holds one (or cannot be listed: the uninstall reports
/// that itself).
fn conf_dir_problem(conf_dir: &Path) -> Option<String> {
    let rd = match std::fs::read_dir(conf_dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Some(format!(
                "--cni-conf-dir {} does not exist",
                conf_dir.display()
            ))
        }
        Err(_) => return None,
    };
    let any = rd.flatten().any(|e| {
        let n = e.file_name();
        let n = n.to_string_lossy();
        interlock_confdir::is_config_name(&n)
            || n.ends_with(interlock_agent::guard::plan::BACKUP_SUFFIX)
    });
    (!any).then(|| {
        format!(
            "--cni-conf-dir {} holds no CNI config (no *.conf, *.conflist or *.json file)",
            conf_dir.display()
        )
    })
}

/// Where the runtime's conf dir may be instead of `conf_dir`: the directory of the
/// config the agent's marker names, and well-known directories on this host that hold
/// configs. Each hint starts with a space.
fn conf_dir_hints(conf_dir: &Path, state_dir: &Path) -> String {
    const KNOWN: [(&str, &str); 3] = [
        (
            interlock_contract::layout::DEFAULT_CNI_CONF_DIR,
            "the usual default",
        ),
        ("/var/lib/rancher/k3s/agent/etc/cni/net.d", "k3s"),
        ("/var/snap/microk8s/current/args/cni-network", "MicroK8s"),
    ];
    let mut out = String::new();
    let marker = interlock_contract::layout::marker_path(state_dir);
    if let Ok(m) = interlock_contract::marker::ReadinessMarker::read(&marker) {
        if let Some(dir) = Path::new(&m.config_path).parent() {
            if !dir.as_os_str().is_empty() && dir != conf_dir {
                out.push_str(&format!(
                    " The agent's readiness marker {} names {}: try --cni-conf-dir {}.",
                    marker.display(),
                    m.config_path,
                    dir.display()
                ));
            }
        }
    }
    let found: Vec<String> = KNOWN
        .iter()
        .filter(|(d, _)| Path::new(d) != conf_dir && conf_dir_problem(Path::new(d)).is_none())
        .filter(|(d, _)| Path::new(d).is_dir())
        .map(|(d, what)| format!("{d} ({what})"))
        .collect();
    if !found.is_empty() {
        out.push_str(&format!(
            " CNI configs found on this host in: {}.",
            found.join(", ")
        ));
    }
    out
}

/// A listen address: `ip:port`, `[ipv6]:port`, or a bare IPv6 address and a port
/// (`fd00::1:9102`, what `$(HOST_IP):9102` gives on an IPv6 node in the DaemonSet).
fn parse_listen_addr(s: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let bad = || format!("{s:?}: expected ip:port, e.g. 127.0.0.1:9102 or [fd00::1]:9102");
    let (host, port) = s.rsplit_once(':').ok_or_else(bad)?;
    let ip: std::net::Ipv6Addr = host.parse().map_err(|_| bad())?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    Ok(SocketAddr::from((ip, port)))
}

/// `interlock uninstall --cluster`: what the agents wrote into the Kubernetes API.
mod cluster_uninstall {
    use super::UninstallArgs;
    use interlock_agent::kubernetes::gating::{taints_edit, TaintEffect};
    use interlock_agent::kubernetes::{bounded, KubeError};
    use interlock_agent::uninstall::UninstallStep;
    use interlock_contract::names::{CONDITION_READY, LABEL_UNPROTECTED, TAINT_NOT_READY};
    use k8s_openapi::api::core::v1::{Node, Pod};
    use kube::api::{Api, ListParams, Patch, PatchParams};
    use kube::Client;
    use serde_json::json;
    use std::process::ExitCode;

    /// How many times a taint edit is recomputed after a conflict (another writer changed
    /// the node's taints between the read and the write).
    const CONFLICT_RETRIES: usize = 5;

    /// What node pools must do themselves; printed on every run.
    const REGISTRATION: &str = "Node pools that register their nodes with the startup taint \
        interlock.dev/not-ready (kubelet --register-with-taints, a node group's taints, a \
        Karpenter NodePool's startupTaints) must drop it from that registration when \
        interlock goes: with no agent left to remove it, every new node would keep it, and \
        pods without a toleration would never be scheduled there";

    pub fn run(a: &UninstallArgs) -> anyhow::Result<ExitCode> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(run_async(a))
    }

    async fn run_async(a: &UninstallArgs) -> anyhow::Result<ExitCode> {
        let (client, creds) = match interlock_agent::kubernetes::connect().await {
            Ok(Some(c)) => c,
            Ok(None) => anyhow::bail!(
                "no Kubernetes credentials: not in a pod, no $KUBECONFIG, no ~/.kube/config; \
                 nothing was changed"
            ),
            Err(e) => anyhow::bail!("{e}; nothing was changed"),
        };
        if a.dry_run {
            println!("dry run: nothing was changed");
        }
        println!("Kubernetes API through {creds}");
        let mut refusal = None;
        let agents = running_agents(&client, &a.namespace, &a.agent_selector).await?;
        if !agents.is_empty() {
            let msg = format!(
                "{} interlock agent pod(s) still run ({} in namespace {}, selected by {}): they \
                 would write the InterlockReady condition and the labels back. Delete the \
                 DaemonSet first (with uninstall-on-exit when-deleted, its agents remove their \
                 files from the nodes as they stop); --force goes ahead anyway",
                agents.len(),
                agents.join(", "),
                a.namespace,
                a.agent_selector
            );
            if a.force {
                eprintln!("interlock uninstall: warning: {msg}");
            } else if a.dry_run {
                refusal = Some(msg);
            } else {
                anyhow::bail!("refusing to uninstall: {msg}; nothing was changed");
            }
        }
        let mut steps = vec![];
        let nodes = bounded(
            || "listing nodes".into(),
            Api::<Node>::all(client.clone()).list(&ListParams::default()),
        )
        .await?;
        for node in &nodes.items {
            clean_node(&client, node, a, &mut steps).await;
        }
        let pods = bounded(
            || format!("listing pods labelled {LABEL_UNPROTECTED}"),
            Api::<Pod>::all(client.clone()).list(&ListParams::default().labels(LABEL_UNPROTECTED)),
        )
        .await?;
        for pod in &pods.items {
            unlabel(&client, pod, a.dry_run, &mut steps).await;
        }
        if steps.is_empty() {
            println!(
                "no node carries the InterlockReady condition or the taint {TAINT_NOT_READY}, \
                 and no pod the label {LABEL_UNPROTECTED}"
            );
        }
        for s in &steps {
            println!("{}", s.line(a.dry_run));
        }
        println!("{REGISTRATION}.");
        let failed = steps
            .iter()
            .filter(|s| matches!(s, UninstallStep::Failed { .. }))
            .count();
        if failed > 0 {
            eprintln!("interlock uninstall: {failed} step(s) failed");
        }
        if let Some(msg) = &refusal {
            eprintln!("interlock uninstall: a real run would refuse: {msg}");
        }
        Ok(if failed > 0 || refusal.is_some() {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        })
    }

    /// The agent pods that are not finished, as `name (node)`.
    async fn running_agents(
        client: &Client,
        namespace: &str,
        selector: &str,
    ) -> Result<Vec<String>, KubeError> {
        let pods = bounded(
            || format!("listing the agent pods ({selector} in {namespace})"),
            Api::<Pod>::namespaced(client.clone(), namespace)
                .list(&ListParams::default().labels(selector)),
        )
        .await?;
        Ok(pods
            .items
            .iter()
            .filter(|p| {
                let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
                !matches!(phase, Some("Succeeded" | "Failed"))
            })
            .map(|p| {
                let node = p.spec.as_ref().and_then(|s| s.node_name.as_deref());
                format!(
                    "{}{}",
                    p.metadata.name.as_deref().unwrap_or("?"),
                    node.map(|n| format!(" on {n}")).unwrap_or_default()
                )
            })
            .collect())
    }

    /// Removes the condition (and with `--remove-taint` the taint) from one node.
    async fn clean_node(
        client: &Client,
        node: &Node,
        a: &UninstallArgs,
        steps: &mut Vec<UninstallStep>,
    ) {
        let api = Api::<Node>::all(client.clone());
        let name = node.metadata.name.clone().unwrap_or_default();
        let condition = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == CONDITION_READY));
        if let Some(c) = condition {
            let what = format!("condition {CONDITION_READY} of node {name}");
            let why = format!(
                "the agent's: {}{}",
                c.status,
                c.reason
                    .as_deref()
                    .map(|r| format!(", {r}"))
                    .unwrap_or_default()
            );
            // Conditions merge by `type`: the directive deletes ours and nothing else.
            let patch =
                json!({"status": {"conditions": [{"type": CONDITION_READY, "$patch": "delete"}]}});
            let done = if a.dry_run {
                Ok(())
            } else {
                bounded(
                    || format!("removing {what}"),
                    api.patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch)),
                )
                .await
                .map(drop)
            };
            steps.push(match done {
                Ok(()) => UninstallStep::Remove { what, why },
                Err(e) => failed(e),
            });
        }
        let tainted = node_taints(node).iter().any(|t| t.key == TAINT_NOT_READY);
        if !tainted {
            return;
        }
        let effects: Vec<&str> = node_taints(node)
            .iter()
            .filter(|t| t.key == TAINT_NOT_READY)
            .map(|t| t.effect.as_str())
            .collect();
        let what = format!(
            "taint {TAINT_NOT_READY}:{} of node {name}",
            effects.join(",")
        );
        if !a.remove_taint {
            steps.push(UninstallStep::Keep {
                what,
                why: "taints may be managed by whoever registers the nodes; pass --remove-taint \
                      to remove it (no agent will, any more)"
                    .into(),
            });
            return;
        }
        let why = "the agent's startup taint".to_string();
        if a.dry_run {
            steps.push(UninstallStep::Remove { what, why });
            return;
        }
        steps.push(match remove_taint(&api, &name, node.clone()).await {
            Ok(()) => UninstallStep::Remove { what, why },
            Err(e) => failed(e),
        });
    }

    fn node_taints(node: &Node) -> &[k8s_openapi::api::core::v1::Taint] {
        node.spec
            .as_ref()
            .and_then(|s| s.taints.as_deref())
            .unwrap_or(&[])
    }

    /// Drops the startup taint, keeping every other taint in order: a merge patch of the
    /// whole list carrying the `resourceVersion` it was computed from, recomputed from a
    /// fresh read when another writer got there first (409).
    async fn remove_taint(api: &Api<Node>, name: &str, mut node: Node) -> Result<(), KubeError> {
        for attempt in 0..=CONFLICT_RETRIES {
            // Ready, whatever the effect: the edit only removes ours.
            let Some(next) = taints_edit(node_taints(&node), true, TaintEffect::NoSchedule) else {
                return Ok(());
            };
            let patch = json!({
                "metadata": {"resourceVersion": node.metadata.resource_version},
                "spec": {"taints": next},
            });
            match bounded(
                || format!("removing the taint {TAINT_NOT_READY} from node {name}"),
                api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)),
            )
            .await
            {
                Ok(_) => return Ok(()),
                Err(e) if e.source.code() == Some(409) && attempt < CONFLICT_RETRIES => {
                    node = bounded(|| format!("reading node {name}"), api.get(name)).await?;
                }
                Err(e) => return Err(e),
            }
        }
        unreachable!("the loop returns on its last attempt")
    }

    /// Removes the label from one pod (only that pod: the patch carries its UID).
    async fn unlabel(client: &Client, pod: &Pod, dry_run: bool, steps: &mut Vec<UninstallStep>) {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let value = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_UNPROTECTED))
            .cloned()
            .unwrap_or_default();
        let what = format!("label {LABEL_UNPROTECTED}={value} of pod {ns}/{name}");
        let why = "the agent's mark of a meshed pod found unprotected".to_string();
        if dry_run {
            steps.push(UninstallStep::Remove { what, why });
            return;
        }
        let api = Api::<Pod>::namespaced(client.clone(), &ns);
        let patch =
            json!({"metadata": {"uid": pod.metadata.uid, "labels": {LABEL_UNPROTECTED: null}}});
        let done = bounded(
            || format!("removing {what}"),
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)),
        )
        .await;
        steps.push(match done {
            Ok(_) => UninstallStep::Remove { what, why },
            // Gone, or another pod of that name now: nothing of ours to remove.
            Err(e) if matches!(e.source.code(), Some(404 | 409)) => UninstallStep::Keep {
                what,
                why: format!("the pod is gone or was replaced meanwhile ({e})"),
            },
            Err(e) => failed(e),
        });
    }

    fn failed(e: KubeError) -> UninstallStep {
        UninstallStep::Failed {
            doing: e.doing.clone(),
            error: e.source.to_string(),
        }
    }
}

#[cfg(test)]
mod guard_flag_tests {
    use super::*;

    #[test]
    fn guard_mode_and_mesh_go_together() {
        assert_eq!(
            guard_mesh(ConfigMode::Guard, Some(GuardedMesh::Kuma), None).unwrap(),
            Some(GuardedMesh::Kuma)
        );
        assert_eq!(guard_mesh(ConfigMode::Owned, None, None).unwrap(), None);
        let e = guard_mesh(ConfigMode::Guard, None, None).unwrap_err();
        assert!(e.to_string().contains("needs --guard-mesh"), "{e}");
        let e = guard_mesh(ConfigMode::Chain, Some(GuardedMesh::Istio), None).unwrap_err();
        assert!(
            e.to_string()
                .contains("--guard-mesh istio needs --config-mode guard"),
            "{e}"
        );
        let e = guard_mesh(
            ConfigMode::Guard,
            Some(GuardedMesh::Istio),
            Some("10-x.conflist"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("--chain-target"), "{e}");
    }
}

#[cfg(test)]
mod listen_addr_tests {
    use super::parse_listen_addr;

    #[test]
    fn listen_addresses_of_both_families() {
        assert_eq!(
            parse_listen_addr("10.0.0.7:9102").unwrap().to_string(),
            "10.0.0.7:9102"
        );
        assert_eq!(
            parse_listen_addr("[fd00::7]:9102").unwrap().to_string(),
            "[fd00::7]:9102"
        );
        assert_eq!(
            parse_listen_addr("fd00::7:9102").unwrap().to_string(),
            "[fd00::7]:9102"
        );
        assert!(parse_listen_addr(":9102").unwrap_err().contains("ip:port"));
        assert!(parse_listen_addr("node-1:9102").is_err());
    }
}

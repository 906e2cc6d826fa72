//! `interlock agent` and `interlock uninstall`: flags (each mirrored by an environment
//! variable) turned into an `interlock_agent::AgentConfig`.

use anyhow::Context;
use clap::Args;
use interlock_agent::audit::RepairPolicy;
use interlock_agent::gating::TaintEffect;
use interlock_agent::plan::ConfigMode;
use interlock_agent::sandbox_audit::AuditSettings;
use interlock_agent::{AgentConfig, KubeMode, Runtime};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// How `INTERLOCK_CNI_BIN_DIR` separates several bin dirs, for `agent`, `uninstall`
/// and `check` alike: ':' as in `CNI_PATH` and `PATH`.
pub const BIN_DIR_DELIMITER: char = ':';

/// Directories shared by `agent` and `uninstall`.
#[derive(Debug, Args)]
pub struct Dirs {
    /// The runtime's CNI config directory.
    #[arg(long, env = "INTERLOCK_CNI_CONF_DIR", default_value = "/etc/cni/net.d")]
    pub cni_conf_dir: PathBuf,
    /// A CNI bin dir to install interlock-cni into (repeatable; in the environment
    /// variable, ':'-separated like CNI_PATH).
    #[arg(
        long = "cni-bin-dir",
        env = "INTERLOCK_CNI_BIN_DIR",
        value_delimiter = BIN_DIR_DELIMITER,
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
    /// owned: write our own config sorting first; chain: insert into the target in place.
    #[arg(long, env = "INTERLOCK_CONFIG_MODE", default_value = "owned")]
    pub config_mode: ConfigMode,
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
    /// Remove what interlock added when the agent exits (default: the config stays).
    #[arg(long, env = "INTERLOCK_UNINSTALL_ON_EXIT")]
    pub uninstall_on_exit: bool,
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
    /// Conflicts on one file per second after which the agent backs off (0: never).
    #[arg(
        long,
        env = "INTERLOCK_CONFLICT_THRESHOLD",
        default_value_t = 20,
        hide = true
    )]
    pub conflict_threshold: u32,
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
    interlock_agent::sandbox_audit::DEFAULT_CRI_ENDPOINT
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
    /// Effect of the startup taint interlock.dev/not-ready: NoSchedule, PreferNoSchedule,
    /// NoExecute, or none (only the InterlockReady condition).
    #[arg(long, env = "INTERLOCK_TAINT_EFFECT", default_value = "NoSchedule")]
    pub taint_effect: TaintEffect,
}

#[derive(Debug, Args)]
pub struct UninstallArgs {
    #[command(flatten)]
    pub dirs: Dirs,
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
    cfg.mode = a.config_mode;
    cfg.chain_target = a.chain_target;
    cfg.runtime = a.runtime;
    cfg.kube = a.kube.mode;
    cfg.node_name = a.kube.node_name;
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
    cfg.audit = audit_settings(&a.cri_endpoint, a.audit_interval, a.repair_policy)?;
    interlock_agent::run(cfg).context("interlock agent failed")
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

pub fn run_uninstall(a: UninstallArgs) -> anyhow::Result<()> {
    let done = interlock_agent::uninstall(
        &a.dirs.cni_conf_dir,
        &a.dirs.cni_bin_dirs,
        &a.dirs.state_dir,
    )
    .context("interlock uninstall")?;
    if done.is_empty() {
        println!(
            "nothing of interlock's found in {}",
            a.dirs.cni_conf_dir.display()
        );
    }
    for d in done {
        println!("{d}");
    }
    Ok(())
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

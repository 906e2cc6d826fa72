//! `interlock check [node]`: what this node's runtime will load, and whether a pod started
//! now would be protected — as a table for people or as a versioned JSON document
//! (`-o json`, a public interface: [`report`]). Exit codes: 0 protected, 1 at risk,
//! 2 unprotected, 3 could not check (64, a usage error, comes from `main`).
//!
//! Settings come from the agent's own `INTERLOCK_*` environment (so `kubectl exec` into
//! the agent's pod needs no flags), then from the agent's readiness marker (the conf dir
//! it guards), then from the defaults. Gathering (files, binaries, the marker, `/readyz`,
//! what the agent would write) is kept apart from judging ([`judge::judge`], pure).

pub mod cluster;
pub mod judge;
pub mod report;
pub mod sandboxes;

use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use interlock_agent::guard::plan::{self, Action, ConfigMode, Facts};
use interlock_agent::AgentConfig;
use interlock_confdir::{self as confdir, Effective, Runtime};
use interlock_contract::config::PLUGIN_TYPE;
use interlock_contract::layout::marker_path;
use interlock_contract::marker::ReadinessMarker;
use interlock_contract::time::now_ms;
use judge::{chain_types, BinaryFacts, Content, Judgement, Observed, Readyz, Stale};
use report::{AgentDoc, BinaryDoc, EffectiveDoc, NodeReport, Parts, ReadyzDoc, Settings, Style};
use sandboxes::SandboxesSeen;
use serde_json::Value;

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// A table for people.
    Text,
    /// One JSON document for machines (schemaVersion 1).
    Json,
}

/// `interlock check`: `node` (the default).
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct CheckArgs {
    #[command(subcommand)]
    which: Option<CheckCommand>,
    #[command(flatten)]
    node: NodeArgs,
}

#[derive(Debug, Subcommand)]
enum CheckCommand {
    /// This node: the conf dir as the runtime loads it, the plugin binary, the agent
    /// (the default when no subcommand is given).
    Node(NodeArgs),
    /// The cluster through the Kubernetes API: per node the InterlockReady condition,
    /// the startup taint and the agent pod (restarts, crash loops); pods labelled
    /// unprotected; agents' versions; other meshes' CNI DaemonSets left installed.
    Cluster(cluster::ClusterArgs),
}

/// `interlock check node` flags; each defaults to the agent's own environment variable.
#[derive(Debug, Args)]
pub struct NodeArgs {
    /// The runtime's CNI conf dir [env: INTERLOCK_CNI_CONF_DIR; else the dir of the
    /// config the agent's marker names; else /etc/cni/net.d].
    #[arg(long)]
    cni_conf_dir: Option<PathBuf>,
    /// Where the runtime looks for plugin binaries (repeatable; in the environment
    /// variable, ':'-separated like CNI_PATH, the same as for `agent`).
    #[arg(
        long = "cni-bin-dir",
        env = "INTERLOCK_CNI_BIN_DIR",
        value_delimiter = crate::BIN_DIR_DELIMITER,
        default_value = "/opt/cni/bin"
    )]
    cni_bin_dirs: Vec<PathBuf>,
    /// The agent's state dir (readiness marker).
    #[arg(
        long,
        env = "INTERLOCK_STATE_DIR",
        default_value = "/var/run/interlock"
    )]
    state_dir: PathBuf,
    /// Whose loading rules decide what is effective: containerd or crio [else the
    /// runtime the agent's marker names; else containerd].
    #[arg(long, env = "INTERLOCK_RUNTIME")]
    runtime: Option<Runtime>,
    /// The agent's health address (`/readyz`; an unspecified address such as 0.0.0.0 is
    /// asked on loopback); `none` skips asking it.
    #[arg(long, env = "INTERLOCK_HEALTH_ADDR", default_value = "127.0.0.1:9102")]
    health_addr: String,
    /// The agent's config mode, to tell what it would write [default: owned when the
    /// loaded file is interlock's own, else chain].
    #[arg(long, env = "INTERLOCK_CONFIG_MODE")]
    config_mode: Option<ConfigMode>,
    /// As for `agent`: the file chain mode chains into.
    #[arg(long, env = "INTERLOCK_CHAIN_TARGET")]
    chain_target: Option<String>,
    /// As for `agent`: config files allowed to sort ahead of interlock's.
    #[arg(long, env = "INTERLOCK_ALLOW_AHEAD", value_delimiter = ',')]
    allow_ahead: Vec<String>,
    /// As for `agent`: the highest cniVersion the agent writes.
    #[arg(long, env = "INTERLOCK_MAX_CNI_VERSION")]
    max_cni_version: Option<String>,
    /// As for `agent`: the plugin settings the agent writes into its entry (without it,
    /// the entry found in the loaded file is taken as intended).
    #[arg(long, env = "INTERLOCK_PLUGIN_CONFIG")]
    plugin_config: Option<PathBuf>,
    /// The interlock-cni this interlock ships, to compare the installed one with
    /// [default: interlock-cni next to this binary].
    #[arg(long, env = "INTERLOCK_PLUGIN_SOURCE")]
    plugin_source: Option<PathBuf>,
    /// The runtime's CRI socket to list the node's sandboxes through; `none` skips
    /// them [env: INTERLOCK_CRI_ENDPOINT; else the endpoint the agent's marker names;
    /// else containerd's socket].
    #[arg(long)]
    cri_endpoint: Option<String>,
    /// As for `agent`: the runtime's own config file, to check that it reads the conf
    /// dir (repeatable; ':'-separated in the environment) [default: the usual paths of
    /// the runtime; a missing file says nothing].
    #[arg(long = "runtime-config", env = "INTERLOCK_RUNTIME_CONFIG", value_delimiter = crate::BIN_DIR_DELIMITER)]
    runtime_configs: Vec<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
    output: Output,
}

/// Runs `interlock check`; the exit code follows the verdict.
pub fn run(a: CheckArgs) -> anyhow::Result<std::process::ExitCode> {
    let now = now_ms();
    let args = match a.which {
        Some(CheckCommand::Node(n)) => n,
        Some(CheckCommand::Cluster(c)) => {
            let report = cluster::check_cluster(&c, now);
            return emit(&report, report.head.exit_code, c.output, |out, style| {
                cluster::render(out, &report, style)
            });
        }
        None => a.node,
    };
    let report = check_node(&args, now, &node_name());
    emit(&report, report.head.exit_code, args.output, |out, style| {
        report::render(out, &report, style)
    })
}

/// Prints `doc` as JSON or as the table `render` draws; the exit code is `code`.
pub fn emit<T: serde::Serialize>(
    doc: &T,
    code: u8,
    output: Output,
    render: impl FnOnce(&mut std::io::StdoutLock<'static>, Style) -> std::io::Result<()>,
) -> anyhow::Result<std::process::ExitCode> {
    let mut out = std::io::stdout().lock();
    let written = match output {
        // Indented only so deep that a 10,000-deep config stays its own size.
        Output::Json => out
            .write_all(&interlock_libcni::conf::pretty_json(doc))
            .and_then(|()| writeln!(out)),
        Output::Text => {
            let colour = std::io::stdout().is_terminal()
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
            render(&mut out, Style { colour })
        }
    };
    // A reader that stops early (`| head`) is not an error of ours.
    match written {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => return Err(e.into()),
        _ => {}
    }
    Ok(std::process::ExitCode::from(code))
}

/// `NODE_NAME` (the downward API in the agent's pod), else the host name.
fn node_name() -> String {
    std::env::var("NODE_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .unwrap_or_default()
}

fn runtime_word(r: Runtime) -> String {
    match r {
        Runtime::Containerd => "containerd".into(),
        Runtime::Crio => "crio".into(),
    }
}

/// Gathers everything about the node and judges it. Never fails: what could not be
/// looked at becomes a `could-not-check` report.
fn check_node(a: &NodeArgs, now: u64, node: &str) -> NodeReport {
    let mpath = marker_path(&a.state_dir);
    let marker = ReadinessMarker::read(&mpath).map_err(|e| format!("{}: {e}", mpath.display()));
    let (conf_dir, from) = resolve_conf_dir(a.cni_conf_dir.as_deref(), marker.as_ref().ok());
    let (cri_endpoint, cri_from) =
        resolve_cri_endpoint(a.cri_endpoint.as_deref(), marker.as_ref().ok());
    let runtime = a
        .runtime
        .or_else(|| {
            let m = marker.as_ref().ok()?;
            m.runtime.as_deref()?.parse().ok()
        })
        .unwrap_or(Runtime::Containerd);
    let settings = Settings {
        cni_conf_dir: conf_dir.clone(),
        cni_bin_dirs: a.cni_bin_dirs.clone(),
        state_dir: a.state_dir.clone(),
        runtime: runtime_word(runtime),
        health_addr: a.health_addr.clone(),
        cni_conf_dir_from: from,
        cri_endpoint: cri_endpoint.clone(),
        cri_endpoint_from: cri_from,
    };
    let binary = binary_facts(a);
    let readyz = ask_readyz(&a.health_addr);
    let agent_version = match &readyz {
        Readyz::Answered(_) => ask_agent_version(&a.health_addr),
        _ => None,
    };
    let agent = AgentDoc {
        marker: marker.as_ref().ok().cloned(),
        marker_error: marker.as_ref().err().cloned(),
        readyz: ReadyzDoc::new(&a.health_addr, &readyz),
    };
    let parts = |effective, binary: &Option<BinaryFacts>, sandboxes: &SandboxesSeen| Parts {
        node: node.to_string(),
        now_ms: now,
        settings: settings.clone(),
        effective,
        binary: binary.as_ref().map(BinaryDoc::from),
        agent,
        sandboxes: match sandboxes {
            SandboxesSeen::Listed(l) => Some(l.clone()),
            _ => None,
        },
    };
    let unread = conf_dir_unread(a, &conf_dir, runtime);
    if !conf_dir.is_dir() {
        let j = judge::could_not_check(
            "check.conf-dir-missing",
            format!(
                "CNI conf dir {} does not exist or is not a directory (from {from}): if it is the runtime's, the runtime has no network{}",
                conf_dir.display(),
                unread.as_deref().map(|u| format!("; {u}")).unwrap_or_default()
            ),
            "point check at the runtime's conf dir: INTERLOCK_CNI_CONF_DIR or --cni-conf-dir (in the agent's pod, its environment already does)",
        );
        return NodeReport::new(parts(None, &binary, &SandboxesSeen::NotAsked), j);
    }
    let effective = match confdir::load(&conf_dir, runtime, &a.cni_bin_dirs) {
        Ok(e) => e,
        Err(e) => {
            let j = judge::could_not_check(
                "check.conf-dir-unreadable",
                format!("reading {}: {e}", conf_dir.display()),
                "run check as root (the conf dir is root's), or fix the path",
            );
            return NodeReport::new(parts(None, &binary, &SandboxesSeen::NotAsked), j);
        }
    };
    let missing = missing_plugins(&effective, a);
    let stale = stale_copy(a, &conf_dir, &effective, binary.as_ref());
    let sandboxes = if cri_endpoint == "none" {
        SandboxesSeen::NotAsked
    } else {
        match audit_plugin_config(a.plugin_config.as_deref(), &a.state_dir, Some(&effective)) {
            Ok(mut plugin) => {
                // Guard mode: the config containerd loads says which mesh interlock-cni
                // guards, as the agent's `--guard-mesh` tells its audit.
                if plugin.guard.is_none() {
                    plugin.guard = judge::guard_role_of(&effective).map(|mut role| {
                        role.hold = false;
                        role.reason = None;
                        role
                    });
                }
                sandboxes::list(&cri_endpoint, &plugin)
            }
            Err(e) => SandboxesSeen::Unreachable(e),
        }
    };
    // In the agent's pod, hints name the namespace it runs in.
    let namespace = std::env::var("POD_NAMESPACE")
        .ok()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| cluster::DEFAULT_NAMESPACE.to_string());
    let j: Judgement = judge::judge(&Observed {
        effective: &effective,
        binary: binary.as_ref(),
        bin_dirs: &a.cni_bin_dirs,
        marker: marker.as_ref().map_err(Clone::clone),
        now_ms: now,
        readyz: &readyz,
        missing_plugins: &missing,
        stale: stale.as_ref(),
        sandboxes: &sandboxes,
        cri_endpoint: &cri_endpoint,
        namespace: &namespace,
        copied_from: copied_from(&effective).as_deref(),
        unread_conf_dir: unread.as_deref(),
        agent_version: agent_version.as_deref(),
    });
    let doc = EffectiveDoc::new(&effective, &missing, stale.as_ref());
    NodeReport::new(parts(Some(doc), &binary, &sandboxes), j)
}

/// Why `conf_dir` looks like a directory the runtime does not read, from the runtime's
/// own config files (`--runtime-config`, else the usual paths).
fn conf_dir_unread(a: &NodeArgs, conf_dir: &Path, runtime: Runtime) -> Option<String> {
    use interlock_confdir::runtime_config;
    let configs = if a.runtime_configs.is_empty() {
        runtime_config::default_configs(runtime)
    } else {
        a.runtime_configs.clone()
    };
    let found: Vec<_> = runtime_config::read(runtime, &configs)
        .into_iter()
        .flatten()
        .collect();
    runtime_config::unread(conf_dir, &found)
}

/// The file interlock's owned config was copied from, when the runtime loads that copy:
/// the other config of the conf dir (in the runtime's order) with the same network
/// name whose plugins are the copy's without interlock-cni. A changed primary (another
/// file sorting first, a stray one) shows here before anything else does.
pub fn copied_from(e: &Effective) -> Option<String> {
    let chosen = e.chosen.as_ref()?;
    let own = chosen.path.file_name()?.to_str()?;
    if !plan::is_owned_name(own) {
        return None;
    }
    let want: Vec<&str> = chosen
        .list
        .plugin_types()
        .into_iter()
        .filter(|t| *t != PLUGIN_TYPE)
        .collect();
    e.files.iter().find_map(|f| {
        let name = f.path.file_name()?.to_str()?;
        if plan::is_owned_name(name) {
            return None;
        }
        let bytes = interlock_contract::bounded::read_config(&f.path).ok()?;
        let v: Value = serde_json::from_slice(&bytes).ok()?;
        let types: Vec<&str> = match v.get("plugins").and_then(Value::as_array) {
            Some(ps) => ps.iter().filter_map(|p| p.get("type")?.as_str()).collect(),
            None => vec![v.get("type")?.as_str()?],
        };
        (v.get("name").and_then(Value::as_str) == Some(chosen.list.name()) && types == want)
            .then(|| name.to_string())
    })
}

/// The runtime's CNI conf dir and where the setting came from: the flag, else
/// `INTERLOCK_CNI_CONF_DIR`, else the dir of the config the agent's marker names, else
/// `/etc/cni/net.d`.
pub fn resolve_conf_dir(
    flag: Option<&Path>,
    marker: Option<&ReadinessMarker>,
) -> (PathBuf, &'static str) {
    match (flag, std::env::var_os("INTERLOCK_CNI_CONF_DIR")) {
        (Some(d), _) => (d.to_path_buf(), "flag"),
        (None, Some(d)) if !d.is_empty() => (PathBuf::from(d), "env"),
        _ => match marker
            .and_then(|m| Path::new(&m.config_path).parent().map(Path::to_path_buf))
            .filter(|p| p.is_absolute())
        {
            Some(d) => (d, "marker"),
            None => (PathBuf::from("/etc/cni/net.d"), "default"),
        },
    }
}

/// The CRI endpoint and where it came from: the flag, else `INTERLOCK_CRI_ENDPOINT`,
/// else the endpoint the agent's marker names (`none` when the agent audits nothing),
/// else containerd's socket.
pub fn resolve_cri_endpoint(
    flag: Option<&str>,
    marker: Option<&ReadinessMarker>,
) -> (String, &'static str) {
    match (flag, std::env::var("INTERLOCK_CRI_ENDPOINT")) {
        (Some(e), _) => (e.to_string(), "flag"),
        (None, Ok(e)) if !e.is_empty() => (e, "env"),
        _ => match marker.and_then(|m| m.cri_endpoint.clone()) {
            Some(e) => (e, "marker"),
            None => (interlock_cri::DEFAULT_ENDPOINT.to_string(), "default"),
        },
    }
}

/// The plugin settings the agent's audit judges sandboxes with: the entry the agent
/// writes (`--plugin-config` merged into its entry), else the interlock-cni entry the
/// runtime loads, else the agent's default entry.
pub fn audit_plugin_config(
    plugin_config: Option<&Path>,
    state_dir: &Path,
    e: Option<&Effective>,
) -> Result<interlock_contract::config::PluginConfig, String> {
    let entry = match plugin_config {
        Some(p) => {
            let extra = interlock_agent::load_plugin_config(p).map_err(|e| e.to_string())?;
            interlock_agent::plugin_entry_with(state_dir, &extra)
        }
        None => e
            .and_then(|e| e.chosen.as_ref())
            .and_then(|c| {
                let name = c.path.file_name()?.to_str()?.to_string();
                confdir::runs_plugin(&c.list, &name, PLUGIN_TYPE).ok()
            })
            .map(|r| r.entry.clone())
            .unwrap_or_else(|| interlock_agent::plugin_entry(state_dir)),
    };
    interlock_contract::config::PluginConfig::from_map(&entry)
        .map_err(|e| format!("the interlock-cni settings are invalid: {e}"))
}

/// The plugin this interlock ships: `--plugin-source`, else `interlock-cni` next to
/// this binary (where the image puts it, and where the agent takes it from).
fn plugin_source(a: &NodeArgs) -> Result<PathBuf, String> {
    let p = match &a.plugin_source {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .map_err(|e| format!("cannot find this binary's path: {e}"))?
            .with_file_name(interlock_agent::guard::install::PLUGIN_FILE),
    };
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!("no plugin source: {} does not exist", p.display()))
    }
}

/// The file at `interlock-cni` in the bin dirs: its VERSION answer, and whether it is
/// byte for byte the plugin this interlock ships (the agent's own content check).
fn binary_facts(a: &NodeArgs) -> Option<BinaryFacts> {
    let path = interlock_libcni::exec::find_plugin(PLUGIN_TYPE, &a.cni_bin_dirs)?;
    let answer = interlock_libcni::exec::plugin_version(&path, &a.cni_bin_dirs);
    let source = plugin_source(a);
    let mut digests = None;
    let content = match &source {
        Err(_) => Content::Unverified,
        Ok(src) => match interlock_contract::bounded::read_regular(
            src,
            interlock_agent::guard::install::MAX_PLUGIN_BYTES,
        ) {
            Ok(data) if interlock_agent::guard::install::same_content(&path, &data) => {
                Content::Matches
            }
            Ok(data) => {
                let installed = interlock_contract::bounded::read_regular(
                    &path,
                    interlock_agent::guard::install::MAX_PLUGIN_BYTES,
                );
                let hex = interlock_agent::guard::install::sha256_hex;
                digests = installed.ok().map(|i| (hex(&i), hex(&data)));
                Content::Differs
            }
            Err(_) => Content::Unverified,
        },
    };
    Some(BinaryFacts {
        versions: answer
            .as_ref()
            .map(|i| i.supported_versions.clone())
            .map_err(|e| e.to_string()),
        build: answer.ok().and_then(|i| i.interlock_version),
        content,
        source,
        path,
        digests,
    })
}

/// The agent's health address as a client asks it.
fn health_socket(addr: &str) -> Result<SocketAddr, String> {
    let mut sa: SocketAddr = addr
        .parse()
        .map_err(|e| format!("{addr:?} is not an address ({e})"))?;
    // The agent in its pod listens on 0.0.0.0; a client asks it on loopback.
    if sa.ip().is_unspecified() {
        sa.set_ip(if sa.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    Ok(sa)
}

/// The running agent's version from its `/metrics` (`None`: not known).
fn ask_agent_version(addr: &str) -> Option<String> {
    let sa = health_socket(addr).ok()?;
    interlock_agent::health::agent_version(sa, Duration::from_millis(500))
        .ok()
        .flatten()
}

fn ask_readyz(addr: &str) -> Readyz {
    if addr == "none" {
        return Readyz::NotAsked;
    }
    let sa = match health_socket(addr) {
        Ok(a) => a,
        Err(e) => return Readyz::Unreachable(e),
    };
    match interlock_agent::health::readyz_status(sa, Duration::from_millis(500)) {
        Ok(code) => Readyz::Answered(code),
        Err(e) => Readyz::Unreachable(format!("nobody answered at {sa}: {e}")),
    }
}

/// Plugin types of the loaded chain that no bin dir has, besides interlock-cni (its own
/// finding). containerd loads such a file and fails every ADD; CRI-O skips it (the
/// conf-dir judgement already says so).
fn missing_plugins(e: &Effective, a: &NodeArgs) -> Vec<String> {
    let Some(c) = &e.chosen else { return vec![] };
    let mut out: Vec<String> = chain_types(&c.list)
        .into_iter()
        .filter(|t| {
            t != PLUGIN_TYPE && interlock_libcni::exec::find_plugin(t, &a.cni_bin_dirs).is_none()
        })
        .collect();
    out.dedup();
    out
}

/// Whether the agent, with these settings, would rewrite the file the runtime loads:
/// the agent's own planner run on the conf dir as it is, with the binaries' VERSION
/// answers asked now.
fn stale_copy(
    a: &NodeArgs,
    conf_dir: &Path,
    e: &Effective,
    binary: Option<&BinaryFacts>,
) -> Option<Stale> {
    let chosen = e.chosen.as_ref()?;
    let name = chosen.path.file_name()?.to_str()?.to_string();
    let running = confdir::runs_plugin(&chosen.list, &name, PLUGIN_TYPE).ok()?;
    let mut cfg = AgentConfig::new(PathBuf::new());
    cfg.conf_dir = conf_dir.to_path_buf();
    cfg.bin_dirs = a.cni_bin_dirs.clone();
    cfg.state_dir = a.state_dir.clone();
    cfg.runtime = e.runtime;
    cfg.mode = a.config_mode.unwrap_or(if plan::is_owned_name(&name) {
        ConfigMode::Owned
    } else {
        ConfigMode::Chain
    });
    cfg.chain_target = a.chain_target.clone();
    cfg.allow_ahead = a.allow_ahead.clone();
    cfg.max_cni_version = a.max_cni_version.clone();
    let mut settings = match &a.plugin_config {
        Some(p) => {
            cfg.plugin_config = interlock_agent::load_plugin_config(p).ok()?;
            cfg.settings()
        }
        None => {
            let mut s = cfg.settings();
            s.entry = running.entry.clone();
            s
        }
    };
    settings.runtime = e.runtime;
    let snap = interlock_agent::guard::snapshot_for(&cfg).ok()?;
    let mut facts = Facts::default();
    let mut types: Vec<String> = snap
        .candidates()
        .iter()
        .filter_map(|c| c.parsed().as_ref().ok().map(|p| chain_types(&p.list)))
        .flatten()
        .collect();
    types.sort();
    types.dedup();
    for t in types {
        if t == PLUGIN_TYPE {
            let v = binary.and_then(|b| b.versions.as_ref().ok()).cloned()?;
            facts.present_types.insert(t.clone());
            facts.versions.insert(t, v);
        } else if let Some(bin) = interlock_libcni::exec::find_plugin(&t, &a.cni_bin_dirs) {
            facts.present_types.insert(t.clone());
            if let Ok(v) = interlock_agent::guard::install::query_versions(&bin) {
                facts.versions.insert(t, v);
            }
        }
    }
    let p = plan::plan(&snap, &settings, &facts);
    let bytes = p.actions.iter().find_map(|act| match act {
        Action::Write { name: n, bytes, .. } if *n == name => Some(bytes),
        _ => None,
    })?;
    let now: Value = serde_json::from_slice(snap.get(&name)?.content.as_ref()?).ok()?;
    let would: Value = serde_json::from_slice(bytes).ok()?;
    let source = (cfg.mode == ConfigMode::Owned)
        .then(|| {
            snap.candidates()
                .iter()
                .find(|c| !plan::is_owned_name(c.name()) && c.parsed().is_ok())
                .map(|c| c.name().to_string())
        })
        .flatten();
    Some(Stale {
        file: name,
        source,
        difference: first_difference("", &now, &would)
            .unwrap_or_else(|| "the same JSON, written differently".into()),
    })
}

/// The first place two JSON values differ, as `path: old → new`.
pub fn first_difference(at: &str, a: &Value, b: &Value) -> Option<String> {
    let here = |a: &Value, b: &Value| {
        let short = |v: &Value| {
            let s = v.to_string();
            if s.chars().count() > 60 {
                format!("{}…", s.chars().take(60).collect::<String>())
            } else {
                s
            }
        };
        let at = if at.is_empty() {
            "(the whole file)"
        } else {
            at
        };
        Some(format!("{at}: {} → {}", short(a), short(b)))
    };
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, v) in x {
                let p = if at.is_empty() {
                    k.clone()
                } else {
                    format!("{at}.{k}")
                };
                match y.get(k) {
                    Some(w) => {
                        if let Some(d) = first_difference(&p, v, w) {
                            return Some(d);
                        }
                    }
                    None => return Some(format!("{p}: {} → (none)", v)),
                }
            }
            y.iter().find(|(k, _)| !x.contains_key(*k)).map(|(k, w)| {
                let p = if at.is_empty() {
                    k.clone()
                } else {
                    format!("{at}.{k}")
                };
                format!("{p}: (none) → {w}")
            })
        }
        (Value::Array(x), Value::Array(y)) => {
            for (i, (v, w)) in x.iter().zip(y).enumerate() {
                if let Some(d) = first_difference(&format!("{at}[{i}]"), v, w) {
                    return Some(d);
                }
            }
            (x.len() != y.len()).then(|| format!("{at}: {} entries → {}", x.len(), y.len()))
        }
        _ if a == b => None,
        _ => here(a, b),
    }
}

#[cfg(test)]
mod tests;

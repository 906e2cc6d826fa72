//! `interlock-bench audit`: the sandbox audit's netns work on a node of `--pods` meshed
//! pod netns (plain `ip netns` namespaces on the benchmark's bridge, [`crate::topology`]).
//!
//! Each pod first runs unprotected with one established TCP connection to the node; the
//! agent's in-place repair (`interlock_agent::audit::repair_netns`: the plugin's
//! protect — apply, read back, probe —, its state and netns record, then `SOCK_DESTROY` of
//! the connection) is timed per pod; with `--proxy-listens` each pod's proxy already
//! listens on its outbound port, as in a running meshed pod. Then the audit's read-back of every pod
//! (`audit::inspect`, with the agent's concurrency) is timed per round, and every
//! verdict must be `protected`. Prints one JSON document (`"bench": "audit"`): `audit_ms`
//! (one pass over all pods), `repair_ms` (one pod), this process's peak RSS, and the
//! budgets as lines `{name, figure, budget, pass}`: one pass over 250 pods within 250 ms,
//! over 1,000 within 1 s (the budget of the count run; none above 1,000), one repair
//! within 50 ms at p99. Needs root.
//!
//! With `--agent-rss-sandboxes N` it runs a real agent instead (`--kube none`), on a
//! private containerd with N ready sandboxes, half of them annotated as Istio pods, and
//! reports its resident memory and the duration of its audit passes (from its log),
//! judged at N = 1,000: RSS ≤ 40 MiB, a pass ≤ 1 s. Without a Kubernetes API the istio
//! profile cannot decide the annotated pods (it needs the proxy's UID from the pod
//! spec): they are judged `unknown`, no netns is read and none repaired, so the pass
//! time is the CRI side and the decisions (`last_audit` has the verdict counts). The
//! kit's primary config is widened to a /22 for this (its /24 holds 253 pods).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use interlock_agent::audit::decide::RulesSeen;
use interlock_agent::audit::{self, Inspection, CONCURRENCY};
use interlock_contract::config::PluginConfig;
use interlock_redirect::backend::BackendKind;
use interlock_redirect::decision::Decision;
use interlock_redirect::netns::in_netns;
use serde_json::json;

use crate::stats::Summary;
use crate::topology::{Node, GATEWAY_V4};

/// `interlock-bench audit`'s flags.
#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Meshed pod netns on the node.
    #[arg(long, default_value_t = 250)]
    pub pods: usize,
    /// Timed audit passes over all of them.
    #[arg(long, default_value_t = 10)]
    pub rounds: usize,
    /// Pretty-print the JSON.
    #[arg(long)]
    pub pretty: bool,
    /// Give each pod a running proxy first (a listener of the proxy's UID on the outbound
    /// port), as real meshed pods have: the repair's probe then proves capture through
    /// it with sock_diag instead of binding the port.
    #[arg(long)]
    pub proxy_listens: bool,
    /// Instead: the resident memory and audit passes of a real agent auditing this many
    /// sandboxes of a private containerd (half of them annotated as Istio pods).
    #[arg(long)]
    pub agent_rss_sandboxes: Option<usize>,
    /// The `interlock` binary for `--agent-rss-sandboxes` (default: next to this one).
    #[arg(long)]
    pub interlock: Option<PathBuf>,
}

/// The audit of 250 sandboxes must take at most this long.
pub const AUDIT_BUDGET: Duration = Duration::from_millis(250);
/// The audit of 1,000 sandboxes must take at most this long.
pub const AUDIT_BUDGET_1000: Duration = Duration::from_secs(1);
/// One in-place repair must take at most this long.
pub const REPAIR_BUDGET: Duration = Duration::from_millis(50);
/// The agent auditing 1,000 sandboxes must stay within this resident memory.
pub const AGENT_RSS_BUDGET_MIB: f64 = 40.0;

/// The budget of one audit pass over `pods` sandboxes: the budget of the smallest
/// budgeted count that covers it (250 or 1,000); none above 1,000.
pub fn audit_budget(pods: usize) -> Option<Duration> {
    match pods {
        0..=250 => Some(AUDIT_BUDGET),
        251..=1000 => Some(AUDIT_BUDGET_1000),
        _ => None,
    }
}

/// A budget line as every bench document writes it (`interlock-bench budgets` reads
/// them): its figure, its limit and whether it holds (`at_most`: the figure must not
/// exceed the limit; otherwise it must reach it).
pub fn budget_line(
    name: &str,
    figure: Option<f64>,
    limit: f64,
    at_most: bool,
) -> serde_json::Value {
    let pass = figure.map(|f| if at_most { f <= limit } else { f >= limit });
    json!({
        "name": name,
        "figure": figure.map(|f| (f * 1000.0).round() / 1000.0),
        "budget": if at_most { format!("<= {limit}") } else { format!(">= {limit}") },
        "pass": pass,
    })
}

fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Runs the benchmark and prints its JSON.
pub fn run(a: AuditArgs) -> anyhow::Result<()> {
    if !interlock_testkit::is_root() {
        bail!("needs root (it creates network namespaces and netfilter rules)");
    }
    if let Some(n) = a.agent_rss_sandboxes {
        return agent_rss(n, a.interlock, a.pretty);
    }
    let state = tempfile::Builder::new()
        .prefix("il-bench-audit")
        .tempdir_in("/dev/shm")
        .context("creating the state dir")?;
    let entry = json!({"type": "interlock-cni", "stateDir": state.path(), "backend": "nftables"});
    let plugin = PluginConfig::from_map(entry.as_object().expect("object"))
        .map_err(|e| anyhow::anyhow!("plugin config: {e}"))?;
    let annotations = [("sidecar.istio.io/status".to_string(), "{}".to_string())].into();
    let facts = interlock_testkit::pods::istio_sidecar();
    let decision = interlock_redirect::decision::decide(
        &plugin,
        "bench",
        "bench/pod",
        Some(&annotations),
        Some(&facts),
    );
    let Decision::Meshed { spec, .. } = &decision else {
        bail!("the benchmark's pods are not meshed: {decision:?}");
    };
    let spec = spec.as_installed();

    let _neigh = NeighThresholds::raise_for(a.pods)?;
    eprintln!("creating {} pod netns …", a.pods);
    let node = Node::new()?;
    let pods = node.pods(a.pods)?;
    let node_path = PathBuf::from("/var/run/netns").join(node.name());
    let server = in_netns(&node_path, || TcpListener::bind((GATEWAY_V4, 0)))??;
    let port = server.local_addr()?.port();

    let _proxies = if a.proxy_listens {
        let port = spec.outbound.proxy_port;
        pods.iter()
            .map(|p| {
                interlock_testkit::traffic::listen_as(
                    &p.path(),
                    spec.proxy_uid,
                    SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, port)),
                )
            })
            .collect()
    } else {
        Vec::new()
    };

    eprintln!("repairing each in place (with one connection open) …");
    let mut repairs = Vec::with_capacity(pods.len());
    let mut ended = 0;
    for (i, pod) in pods.iter().enumerate() {
        let target = SocketAddr::new(GATEWAY_V4.into(), port);
        let client = in_netns(&pod.path(), move || {
            TcpStream::connect_timeout(&target, Duration::from_secs(10))
        })?
        .with_context(|| format!("pod {i} ({}): connecting to the node", pod.name()))?;
        let (_server_end, _) = server.accept()?;
        let meta = interlock_cri::SandboxMetadata {
            name: format!("pod-{i}"),
            namespace: "bench".into(),
            uid: format!("uid-{i}"),
            attempt: 0,
        };
        let t = Instant::now();
        let done = audit::repair_netns(&plugin, &format!("sb-{i}"), &meta, &decision, &pod.path())
            .map_err(|e| anyhow::anyhow!("repairing {}: {e}", pod.name()))?;
        repairs.push(t.elapsed());
        ended += done.ended;
        drop(client);
    }
    if ended != pods.len() {
        bail!("{ended} connections ended, expected {}", pods.len());
    }

    eprintln!("auditing {} rounds …", a.rounds);
    let mut audits = Vec::with_capacity(a.rounds);
    for _ in 0..a.rounds {
        let next = AtomicUsize::new(0);
        let bad = AtomicUsize::new(0);
        let t = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..CONCURRENCY.min(pods.len()) {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(pod) = pods.get(i) else { return };
                    let seen = audit::inspect(
                        &pod.path(),
                        &spec,
                        state.path(),
                        BackendKind::Nftables,
                        &format!("sb-{i}"),
                    );
                    if !matches!(
                        seen,
                        Inspection::Seen {
                            rules: RulesSeen::Exact,
                            ..
                        }
                    ) {
                        eprintln!("{}: {seen:?}", pod.name());
                        bad.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
        audits.push(t.elapsed());
        let bad = bad.load(Ordering::Relaxed);
        if bad > 0 {
            bail!("{bad} pods were not judged protected");
        }
    }
    let audit = Summary::of(&audits).expect("rounds > 0");
    let repair = Summary::of(&repairs).expect("pods > 0");
    let ms = |us: f64| us / 1000.0;
    let mut budgets = Vec::new();
    if let Some(limit) = audit_budget(pods.len()) {
        budgets.push(budget_line(
            &format!("audit_pass_{}_netns_ms", pods.len()),
            Some(ms(audit.median_us)),
            limit.as_secs_f64() * 1e3,
            true,
        ));
    }
    budgets.push(budget_line(
        "audit_repair_one_pod_p99_ms",
        Some(ms(repair.p99_us)),
        REPAIR_BUDGET.as_secs_f64() * 1e3,
        true,
    ));
    let out = json!({
        "bench": "audit",
        "variant": "netns",
        "pods": pods.len(),
        "proxy_listens": a.proxy_listens,
        "concurrency": CONCURRENCY,
        "audit_ms": audit.to_json_ms(),
        "repair_ms": repair.to_json_ms(),
        "connections_ended": ended,
        "budgets": budgets,
        "loadavg": loadavg(),
        "bench_peak_rss_kib": peak_rss_kib(),
    });
    println!(
        "{}",
        if a.pretty {
            serde_json::to_string_pretty(&out)?
        } else {
            out.to_string()
        }
    );
    Ok(())
}

fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmRSS:")
}

/// Host limits a node running many pods on one bridge raises, raised for the run (and
/// the old values put back): the kernel's neighbour table, shared by every netns, holds
/// 1,024 entries by default (`gc_thresh3`), which the node's entry per pod and each
/// pod's entry for its gateway overflow past about 500 pods; and every broadcast (an
/// ARP request, IPv6 router solicitations) is flooded to every port of the bridge, each
/// copy through a CPU's backlog of 1,000 packets (`netdev_max_backlog`), which then
/// drops the replies the bench's connections wait for.
struct NeighThresholds(Vec<(PathBuf, String)>);

impl NeighThresholds {
    fn raise_for(pods: usize) -> anyhow::Result<NeighThresholds> {
        let want = 4 * pods + 1024;
        let mut knobs = vec![("/proc/sys/net/core/netdev_max_backlog".to_string(), want)];
        for family in ["ipv4", "ipv6"] {
            for (knob, value) in [("gc_thresh2", want / 2), ("gc_thresh3", want)] {
                knobs.push((
                    format!("/proc/sys/net/{family}/neigh/default/{knob}"),
                    value,
                ));
            }
        }
        let mut old = Vec::new();
        for (path, value) in knobs {
            let path = PathBuf::from(path);
            let was = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            if was.trim().parse::<usize>().is_ok_and(|v| v >= value) {
                continue;
            }
            std::fs::write(&path, value.to_string())
                .with_context(|| format!("raising {}", path.display()))?;
            old.push((path, was));
        }
        Ok(NeighThresholds(old))
    }
}

impl Drop for NeighThresholds {
    fn drop(&mut self) {
        for (path, was) in self.0.iter().rev() {
            if let Err(e) = std::fs::write(path, was.trim()) {
                eprintln!("cannot restore {}: {e}", path.display());
            }
        }
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// `duration_ms` of an agent log line (tracing's `key=value` format).
fn duration_ms(line: &str) -> Option<f64> {
    let rest = &line[line.find("duration_ms=")? + "duration_ms=".len()..];
    rest.split(|c: char| c.is_whitespace() || c == ',')
        .next()?
        .parse()
        .ok()
}

/// The kit's primary config with a /22 of its own (10.95.0.0/22: 1,021 pods) instead of
/// the kit's /24, for more than 250 sandboxes.
fn wide_primary(kit: &interlock_testkit_node::containerd::Containerd) -> serde_json::Value {
    let mut conf = kit.primary_conflist();
    conf["plugins"][0]["ipam"]["ranges"] = json!([[{"subnet": WIDE_SUBNET}]]);
    conf
}

/// The subnet of [`wide_primary`] (unused by the kit, the other benches and the tests).
const WIDE_SUBNET: &str = "10.95.0.0/22";

/// A real agent on a private containerd with `n` ready sandboxes: its RSS after it has
/// audited (and repaired) them all, and after three more periodic audits, and how long
/// each of those passes took.
fn agent_rss(n: usize, interlock: Option<PathBuf>, pretty: bool) -> anyhow::Result<()> {
    use interlock_testkit_node::containerd::{Containerd, PRIMARY_CONFLIST};
    let interlock = match interlock {
        Some(p) => p,
        None => std::env::current_exe()?.with_file_name("interlock"),
    };
    if n > 1000 {
        bail!("--agent-rss-sandboxes {n}: the bench's primary holds at most 1,000 pods (one bridge, a /22)");
    }
    let kit = Containerd::start().context("starting containerd")?;
    kit.install_primary_plugins()?;
    if n > 250 {
        kit.write_conf(PRIMARY_CONFLIST, &wide_primary(&kit))?;
    } else {
        kit.write_primary_config()?;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    eprintln!("running {n} sandboxes …");
    let t = Instant::now();
    rt.block_on(async {
        let cri = kit.cri().await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cri.status().await?.network_ready() {
            if Instant::now() > deadline {
                bail!("containerd never loaded the primary's config");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let configs: Vec<_> = (0..n)
            .map(|i| {
                let c = kit.pod(&format!("rss{i}"));
                if i % 2 == 0 {
                    c.annotation("sidecar.istio.io/status", "{}")
                } else {
                    c
                }
            })
            .collect();
        let results: Vec<_> = futures::StreamExt::collect(futures::StreamExt::buffer_unordered(
            futures::stream::iter(configs.iter().map(|c| cri.run_sandbox(c))),
            8,
        ))
        .await;
        for r in results {
            r.context("running a sandbox")?;
        }
        anyhow::Ok(())
    })?;
    let started_in = t.elapsed();
    eprintln!("{n} sandboxes in {started_in:?}; starting the agent …");
    let state = tempfile::Builder::new()
        .prefix("il-bench-rss")
        .tempdir_in("/dev/shm")?;
    let log = state.path().join("agent.log");
    let mut child = std::process::Command::new(&interlock)
        .arg("agent")
        .arg("--cni-conf-dir")
        .arg(kit.conf_dir())
        .arg("--cni-bin-dir")
        .arg(kit.bin_dir())
        .arg("--state-dir")
        .arg(state.path().join("state"))
        .args([
            "--kube",
            "none",
            "--health-addr",
            "127.0.0.1:0",
            "--audit-interval",
            "1",
        ])
        .arg("--cri-endpoint")
        .arg(kit.endpoint())
        .arg("--plugin-source")
        .arg(interlock.with_file_name("interlock-cni"))
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .with_context(|| format!("starting {}", interlock.display()))?;
    let pid = child.id();
    let audits = |log: &std::path::Path| {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("audit done"))
            .count()
    };
    // A first pass that repairs takes tens of ms per sandbox on a loaded VM.
    let deadline =
        Instant::now() + Duration::from_secs(120) + Duration::from_millis(200) * n as u32;
    let mut first = None;
    let mut peak = 0;
    while audits(&log) < 4 {
        if first.is_none() && audits(&log) >= 1 {
            first = rss_kib(pid);
        }
        peak = peak.max(rss_kib(pid).unwrap_or(0));
        if Instant::now() > deadline || child.try_wait()?.is_some() {
            let _ = child.kill();
            bail!(
                "the agent did not audit 4 times; log:\n{}",
                std::fs::read_to_string(&log)?
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let after = rss_kib(pid);
    // The kernel's high-water mark catches a peak between two samples.
    peak = peak
        .max(after.unwrap_or(0))
        .max(status_kib(pid, "VmHWM:").unwrap_or(0));
    let text = std::fs::read_to_string(&log)?;
    let repaired = text
        .lines()
        .filter(|l| l.contains("audit action done"))
        .count();
    let passes: Vec<f64> = text
        .lines()
        .filter(|l| l.contains("audit done"))
        .filter_map(duration_ms)
        .collect();
    let last = text
        .lines()
        .rev()
        .find(|l| l.contains("audit done"))
        .unwrap_or("")
        .to_string();
    let _ = child.kill();
    let _ = child.wait();
    // The passes after the first (which repairs what it finds unprotected): what every
    // period costs.
    let steady = crate::stats::median(passes.get(1..).unwrap_or_default());
    let mib = |k: Option<u64>| k.map(|k| k as f64 / 1024.0);
    let budgets = if n >= 1000 {
        vec![
            budget_line(
                "agent_rss_auditing_1000_sandboxes_mib",
                mib(Some(peak)),
                AGENT_RSS_BUDGET_MIB,
                true,
            ),
            budget_line(
                "agent_audit_pass_1000_sandboxes_ms",
                steady,
                AUDIT_BUDGET_1000.as_secs_f64() * 1e3,
                true,
            ),
        ]
    } else {
        Vec::new()
    };
    let out = json!({
        "bench": "audit",
        "variant": "agent",
        "sandboxes": n,
        "sandboxes_started_in_s": (started_in.as_secs_f64() * 10.0).round() / 10.0,
        "repaired": repaired,
        "agent_rss_kib_after_first_audit": first,
        "agent_rss_kib_after_four_audits": after,
        "agent_rss_kib_peak": peak,
        "audit_passes_ms": passes,
        "audit_pass_ms_after_first": steady,
        "budgets": budgets,
        "budgets_judged_at": "1,000 sandboxes (none below)",
        "last_audit": last,
        "agent": interlock.display().to_string(),
        "loadavg": loadavg(),
    });
    println!(
        "{}",
        if pretty {
            serde_json::to_string_pretty(&out)?
        } else {
            out.to_string()
        }
    );
    drop(kit);
    Ok(())
}

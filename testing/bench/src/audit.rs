//! `interlock-bench audit`: the sandbox audit's netns work on a node of `--pods` meshed
//! pod netns (plain `ip netns` namespaces on the benchmark's bridge, [`crate::topology`]).
//!
//! Each pod first runs unprotected with one established TCP connection to the node; the
//! agent's in-place repair (`interlock_agent::audit::repair_netns`: the plugin's
//! protect — apply, read back, probe —, its state and netns record, then `SOCK_DESTROY` of
//! the connection) is timed per pod; with `--proxy-listens` each pod's proxy already
//! listens on its outbound port, as in a running meshed pod. Then the audit's read-back of every pod
//! (`audit::inspect`, with the agent's concurrency) is timed per round, and every
//! verdict must be `protected`. Prints one JSON document: `audit_ms` (one pass over all
//! pods), `repair_ms` (one pod), the budgets (250 ms, 50 ms) and whether they hold, and
//! this process's peak RSS. Needs root.

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
    /// Instead: the resident memory of a real agent auditing this many sandboxes of a
    /// private containerd (half of them meshed and unprotected: it repairs them).
    #[arg(long)]
    pub agent_rss_sandboxes: Option<usize>,
    /// The `interlock` binary for `--agent-rss-sandboxes` (default: next to this one).
    #[arg(long)]
    pub interlock: Option<PathBuf>,
}

/// The audit of 250 sandboxes must take at most this long.
pub const AUDIT_BUDGET: Duration = Duration::from_millis(250);
/// One in-place repair must take at most this long.
pub const REPAIR_BUDGET: Duration = Duration::from_millis(50);

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
            TcpStream::connect_timeout(&target, Duration::from_secs(2))
        })??;
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
    let out = json!({
        "pods": pods.len(),
        "proxy_listens": a.proxy_listens,
        "concurrency": CONCURRENCY,
        "audit_ms": audit.to_json_ms(),
        "repair_ms": repair.to_json_ms(),
        "connections_ended": ended,
        "budgets": {
            "audit_250_ms": AUDIT_BUDGET.as_millis() as u64,
            "audit_within": audit.median_us <= AUDIT_BUDGET.as_micros() as f64,
            "repair_ms": REPAIR_BUDGET.as_millis() as u64,
            "repair_p99_within": repair.p99_us <= REPAIR_BUDGET.as_micros() as f64,
        },
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

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// A real agent on a private containerd with `n` ready sandboxes: its RSS after it has
/// audited (and repaired) them all, and after three more periodic audits.
fn agent_rss(n: usize, interlock: Option<PathBuf>, pretty: bool) -> anyhow::Result<()> {
    use interlock_testkit_node::containerd::Containerd;
    let interlock = match interlock {
        Some(p) => p,
        None => std::env::current_exe()?.with_file_name("interlock"),
    };
    let kit = Containerd::start().context("starting containerd")?;
    kit.install_primary_plugins()?;
    kit.write_primary_config()?;
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
    eprintln!("{n} sandboxes in {:?}; starting the agent …", t.elapsed());
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
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut first = None;
    while audits(&log) < 4 {
        if first.is_none() && audits(&log) >= 1 {
            first = rss_kib(pid);
        }
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
    let text = std::fs::read_to_string(&log)?;
    let repaired = text
        .lines()
        .filter(|l| l.contains("audit action done"))
        .count();
    let last = text
        .lines()
        .rev()
        .find(|l| l.contains("audit done"))
        .unwrap_or("")
        .to_string();
    let _ = child.kill();
    let _ = child.wait();
    let out = json!({
        "sandboxes": n,
        "repaired": repaired,
        "agent_rss_kib_after_first_audit": first,
        "agent_rss_kib_after_four_audits": after,
        "budget_rss_kib": 40 * 1024,
        "rss_within": after.is_some_and(|r| r <= 40 * 1024),
        "last_audit": last,
        "agent": interlock.display().to_string(),
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

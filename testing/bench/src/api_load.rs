//! `interlock-bench api-load`: the Kubernetes API load the agents cause, per node, as the
//! cluster grows. N simulated agents (each the agent's own pod cache and node gate, on
//! its own kube client whose requests the fake API server counts under its node's name)
//! run against one fake API server (`interlock_testkit_node::kubeapi`) holding N nodes with
//! their pods, and the server's per-client counters give requests and bytes per node:
//!
//! - `steady`: every node ready, pods on every node changing at a constant rate per node
//!   (the cluster-wide churn grows with N, as in a real cluster), per minute;
//! - `flip`: every node loses protection past the debounce and gets it back (taints and
//!   conditions written, Events), per node for the whole flip;
//! - `restart`: the API server restarts and forgets its history (every watch gets 410
//!   and re-lists), per node until every watch is open again plus a settling window.
//!
//! The guarantee it shows: none of these grows with N per node (one field-selected pod
//! watch and one node watch per agent, writes only on change). Prints one JSON document.
//! Needs no root.

use anyhow::{bail, Context};
use clap::Args;
use interlock_agent::health::shared::{Readiness, Shared};
use interlock_agent::kubernetes::gating::{TaintEffect, LOSS_DEBOUNCE};
use interlock_agent::kubernetes::{self, Cluster, KubeSettings};
use interlock_contract::names::TAINT_NOT_READY;
use interlock_testkit_node::kubeapi::{ClientLoad, KubeApi, CLIENT_HEADER};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `interlock-bench api-load`'s flags.
#[derive(Debug, Args)]
pub struct ApiLoadArgs {
    /// Cluster sizes to run (simulated nodes, each with its agent).
    #[arg(long, value_delimiter = ',', default_value = "50,100,200")]
    pub nodes: Vec<usize>,
    /// Pods on each node.
    #[arg(long, default_value_t = 20)]
    pub pods_per_node: usize,
    /// Length of the steady-state window, in seconds (bookmarks come every 60 s).
    #[arg(long, default_value_t = 60)]
    pub steady_seconds: u64,
    /// Pod changes per node per minute during the steady window.
    #[arg(long, default_value_t = 6)]
    pub pod_changes_per_node_per_minute: u64,
    /// Pretty-print the JSON.
    #[arg(long)]
    pub pretty: bool,
}

fn node_name(i: usize) -> String {
    format!("node-{i:04}")
}

fn node(i: usize) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
           "metadata": {"name": node_name(i), "labels": {"kubernetes.io/hostname": node_name(i)}},
           "spec": {"taints": [{"key": TAINT_NOT_READY, "effect": "NoSchedule"}]},
           "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                      "message": "kubelet is posting ready status"}]}})
}

fn pod(i: usize, j: usize, generation: u64) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": format!("app-{i:04}-{j:03}"), "namespace": "apps",
                        "labels": {"app": format!("app-{j}")},
                        "annotations": {"sidecar.istio.io/status": "{\"initContainers\":null,\"containers\":[\"istio-proxy\"]}",
                                        "bench/generation": generation.to_string()}},
           "spec": {"nodeName": node_name(i),
                    "containers": [{"name": "app", "image": "registry.example/app:1"},
                                   {"name": "istio-proxy", "image": "registry.example/proxyv2:1"}]},
           "status": {"phase": "Running", "podIP": format!("10.{}.{}.{}", i / 250, i % 250, j + 2)}})
}

fn taints_of(api: &KubeApi, i: usize) -> usize {
    api.get_object("nodes", "", &node_name(i))
        .and_then(|n| n["spec"]["taints"].as_array().map(Vec::len))
        .unwrap_or(0)
}

struct Agents {
    shared: Vec<Arc<Shared>>,
    clusters: Vec<Cluster>,
}

fn readiness(ready: bool) -> Readiness {
    Readiness {
        ready,
        reason: if ready {
            "ok".into()
        } else {
            "the effective config !first.conflist does not run interlock-cni".into()
        },
        effective: ready.then(|| "00-interlock.conflist".into()),
    }
}

async fn start_agents(api: &KubeApi, n: usize) -> anyhow::Result<Agents> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("kubeconfig");
    api.write_kubeconfig(&path)?;
    let path = path.to_str().context("kubeconfig path")?.to_string();
    let mut agents = Agents {
        shared: vec![],
        clusters: vec![],
    };
    for i in 0..n {
        let mut config = kubernetes::config_from_kubeconfig(&path)
            .await
            .map_err(anyhow::Error::msg)?;
        config.headers.push((
            http::HeaderName::from_static(CLIENT_HEADER),
            http::HeaderValue::from_str(&node_name(i))?,
        ));
        let client = kube::Client::try_from(config)?;
        let shared = Arc::new(Shared::default());
        let settings = KubeSettings {
            node: node_name(i),
            effect: TaintEffect::NoSchedule,
            resync: Duration::from_secs(10),
        };
        agents
            .clusters
            .push(kubernetes::start(client, &settings, shared.clone()));
        agents.shared.push(shared);
    }
    Ok(agents)
}

async fn wait(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> anyhow::Result<()> {
    let end = Instant::now() + timeout;
    while !cond() {
        if Instant::now() > end {
            bail!("timed out after {timeout:?}: {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Per-node figures of one window: mean and max over the nodes, scaled by `scale`.
fn per_node(load: &BTreeMap<String, ClientLoad>, n: usize, scale: f64) -> Value {
    let nodes: Vec<ClientLoad> = (0..n)
        .map(|i| load.get(&node_name(i)).copied().unwrap_or_default())
        .collect();
    let stat = |f: &dyn Fn(&ClientLoad) -> u64| {
        let v: Vec<f64> = nodes.iter().map(|c| f(c) as f64 * scale).collect();
        let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
        let max = v.iter().cloned().fold(0.0, f64::max);
        json!({"mean": (mean * 100.0).round() / 100.0, "max": (max * 100.0).round() / 100.0})
    };
    let others: u64 = load
        .iter()
        .filter(|(k, _)| !k.starts_with("node-"))
        .map(|(_, c)| c.requests)
        .sum();
    json!({
        "requests": stat(&|c| c.requests),
        "lists": stat(&|c| c.lists),
        "watches": stat(&|c| c.watches),
        "writes": stat(&|c| c.writes),
        "bytes": stat(&|c| c.bytes_in + c.bytes_out),
        "bytes_out": stat(&|c| c.bytes_out),
        "requests_from_others": others,
    })
}

async fn one_size(n: usize, a: &ApiLoadArgs) -> anyhow::Result<Value> {
    let api = KubeApi::start()?;
    for i in 0..n {
        api.put_object(node(i));
        for j in 0..a.pods_per_node {
            api.put_object(pod(i, j, 0));
        }
    }
    let started = Instant::now();
    let agents = start_agents(&api, n).await?;
    for s in &agents.shared {
        s.set_readiness(readiness(true));
    }
    wait(
        "every node untainted and every pod cache synced",
        Duration::from_secs(120),
        || {
            (0..n).all(|i| taints_of(&api, i) == 0)
                && agents.clusters.iter().all(|c| c.pods.is_synced())
        },
    )
    .await?;
    let startup_load = api.load();
    let startup = per_node(&startup_load, n, 1.0);
    let startup_seconds = started.elapsed().as_secs_f64();
    eprintln!("api-load: N={n}: converged in {startup_seconds:.1} s");

    // Steady state: pods change at a constant rate per node.
    tokio::time::sleep(Duration::from_secs(1)).await;
    api.reset_load();
    let window = Duration::from_secs(a.steady_seconds.max(1));
    let changes = (a.pod_changes_per_node_per_minute * n as u64 * window.as_secs() / 60).max(1);
    let step = window / changes as u32;
    let t0 = Instant::now();
    let mut generation = 0u64;
    for k in 0..changes {
        generation += 1;
        let i = (k as usize * 7919) % n;
        let j = (k as usize / n) % a.pods_per_node.max(1);
        api.put_object(pod(i, j, generation));
        let due = t0 + step * (k as u32 + 1);
        tokio::time::sleep_until(due.into()).await;
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let steady = per_node(&api.load(), n, 60.0 / elapsed);
    eprintln!("api-load: N={n}: steady window {elapsed:.1} s, {changes} pod changes");

    // Mass readiness flip: every node loses protection past the debounce, then regains it.
    api.reset_load();
    let t0 = Instant::now();
    for s in &agents.shared {
        s.set_readiness(readiness(false));
    }
    wait(
        "every node tainted again",
        LOSS_DEBOUNCE + Duration::from_secs(120),
        || (0..n).all(|i| taints_of(&api, i) == 1),
    )
    .await?;
    for s in &agents.shared {
        s.set_readiness(readiness(true));
    }
    if let Err(e) = wait(
        "every node untainted after the flip",
        Duration::from_secs(120),
        || (0..n).all(|i| taints_of(&api, i) == 0),
    )
    .await
    {
        let stuck: Vec<String> = (0..n)
            .filter(|&i| taints_of(&api, i) != 0)
            .map(node_name)
            .collect();
        bail!("{e}; still tainted: {}", stuck.join(", "));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let flip_seconds = t0.elapsed().as_secs_f64();
    let flip = per_node(&api.load(), n, 1.0);

    // API server restart with its history gone: every watch gets 410 and re-lists.
    api.reset_load();
    let t0 = Instant::now();
    api.restart(true);
    // Both watches of every agent listed again (after their resume met 410).
    wait("every agent re-listed", Duration::from_secs(120), || {
        let load = api.load();
        (0..n).all(|i| load.get(&node_name(i)).is_some_and(|c| c.lists >= 2))
    })
    .await?;
    let reopened_seconds = t0.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let restart = per_node(&api.load(), n, 1.0);
    let restart_seconds = t0.elapsed().as_secs_f64();
    let complete = agents
        .clusters
        .iter()
        .enumerate()
        .filter(|(i, c)| {
            (0..a.pods_per_node)
                .all(|j| c.pods.get("apps", &format!("app-{i:04}-{j:03}")).is_some())
        })
        .count();
    drop(agents);
    Ok(json!({
        "nodes": n,
        "pods_per_node": a.pods_per_node,
        "startup": {"seconds": round(startup_seconds), "per_node": startup},
        "steady": {"seconds": round(elapsed), "pod_changes": changes, "per_node_per_minute": steady},
        "flip": {"seconds": round(flip_seconds), "per_node": flip},
        "restart": {"seconds": round(restart_seconds), "relisted_after_seconds": round(reopened_seconds),
                    "caches_complete": complete, "per_node": restart},
    }))
}

fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Runs every size in `a.nodes` and prints the JSON document.
pub fn run(a: ApiLoadArgs) -> anyhow::Result<()> {
    if a.nodes.is_empty() || a.nodes.contains(&0) {
        bail!("--nodes needs cluster sizes of at least 1");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut runs = vec![];
    for &n in &a.nodes {
        runs.push(rt.block_on(one_size(n, &a))?);
    }
    let doc = json!({
        "benchmark": "api-load",
        "what": "Kubernetes API requests and bytes per simulated node (pod cache + node gate per agent) against one fake API server",
        "steady_pod_changes_per_node_per_minute": a.pod_changes_per_node_per_minute,
        "runs": runs,
    });
    let text = if a.pretty {
        serde_json::to_string_pretty(&doc)?
    } else {
        doc.to_string()
    };
    println!("{text}");
    Ok(())
}

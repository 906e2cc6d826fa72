//! `interlock-bench sandbox`: what interlock adds to a pod's start on a real runtime.
//!
//! Nodes in a box (a private containerd each, the reference primary: `bridge` +
//! `host-local` + `portmap`), one per way of starting a pod:
//! - `primary`: the primary alone;
//! - `chained_noop`: the primary with a static C no-op chained after it (it reads its
//!   config and returns its prevResult): what chaining any plugin costs on this runtime;
//! - `interlock`: the primary with the real agent running, which installs
//!   `interlock-cni` and chains it (the shipped set-up, agent CPU included);
//! - `istio_standin`: the primary with the istio-cni stand-in chained after it
//!   ([`crate::build_istio_standin`]: a static plugin that runs `iptables-restore` per
//!   family in the pod with the rules interlock installs; a lower bound of istio-cni's
//!   cost, which also asks the API server about every pod);
//! - `interlock_no_note` (only with `--ways`): interlock, but the plugin's ADD notes go to
//!   a socket nobody serves, so the agent does not react to a start: with `interlock`,
//!   what that reaction costs.
//!
//! A sample is one `RunPodSandbox` (the pause container, the netns, the whole CNI chain:
//! the call returns when the pod's network is set up) timed from the call to its return;
//! `StopPodSandbox` (CNI DEL) is timed on the way down. Sequential samples (meshed pods;
//! unmeshed ones for `primary` and the interlock ways) and bursts of N concurrent starts
//! (pods per second: N over the burst's wall time) are interleaved: the sequential ones in
//! blocks of `--block` starts, the ways taking turns, the bursts round by round, the
//! order of the ways rotating, so a drift of the machine falls on every way alike. Before the
//! samples, one meshed pod per way is proven captured (or, for `primary`, not captured)
//! by a connection. Prints one JSON document with the budgets of issue 30: interlock adds
//! at most 2 % to the meshed start's median and 5 % to its p99 over the primary alone,
//! and sustains at least 95 % of its pods per second; next to them the chained no-op's
//! figures (`reference`) and where interlock's difference goes (`breakdown`). Needs root.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use interlock_contract::layout::ATTACHMENTS_DIR;
use interlock_redirect::backend::iptables::{self, Flavour, Tool};
use interlock_redirect::{PodView, ProfileName};
use interlock_testkit_node::node::{
    AgentArgs, Capture, Node, NodeOptions, MESHED_ANNOTATION, PRIMARY_CONFLIST,
};
use serde_json::{json, Map, Value};

use crate::stats::{median, Summary};

/// `interlock-bench sandbox`'s flags.
#[derive(Debug, Args)]
pub struct SandboxArgs {
    /// Sequential sandbox starts per way and kind (meshed, unmeshed) in each round.
    #[arg(long, default_value_t = 20)]
    pub samples: usize,
    /// Rounds the samples and bursts are interleaved in.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Sequential starts a way makes before the next way takes its turn.
    #[arg(long, default_value_t = 5)]
    pub block: usize,
    /// Burst sizes: this many meshed sandboxes started at once (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [8, 32])]
    pub bursts: Vec<usize>,
    /// A smoke run: 2 samples, 1 round, a burst of 4.
    #[arg(long)]
    pub quick: bool,
    /// The `interlock` binary the agent runs from (default: next to this executable).
    #[arg(long)]
    pub interlock: Option<PathBuf>,
    /// The `interlock-cni` binary the agent installs (default: next to `interlock`).
    #[arg(long)]
    pub plugin: Option<PathBuf>,
    /// Pretty-print the JSON.
    #[arg(long)]
    pub pretty: bool,
    /// Another `interlock` binary (an earlier build): adds the way `interlock_baseline`,
    /// interlock with the agent from that binary, to compare two agents in one run.
    #[arg(long)]
    pub baseline_interlock: Option<PathBuf>,
    /// The ways to run (comma-separated): primary, chained_noop, interlock,
    /// istio_standin, interlock_no_note.
    #[arg(long, value_delimiter = ',', default_values_t = WAYS.map(String::from))]
    pub ways: Vec<String>,
}

/// Budget: interlock's meshed sandbox start median over the primary alone's, in percent.
pub const BUDGET_P50_PCT: f64 = 2.0;
/// Budget: the same for p99.
pub const BUDGET_P99_PCT: f64 = 5.0;
/// Budget: interlock's pods per second in a burst, as a share of the primary alone's.
pub const BUDGET_RATE_SHARE: f64 = 0.95;

/// The ways a pod is started by default, in the order of the first round.
pub const WAYS: [&str; 4] = ["primary", "chained_noop", "interlock", "istio_standin"];
/// Every way: the default ones, `interlock_no_note` (interlock as shipped, but the
/// plugin's ADD notes go to a socket nobody serves, so the agent does not react to a
/// start: what its reaction costs a start) and `interlock_baseline` (with
/// `--baseline-interlock`).
pub const ALL_WAYS: [&str; 6] = [
    "primary",
    "chained_noop",
    "interlock",
    "istio_standin",
    "interlock_no_note",
    "interlock_baseline",
];

/// Whether `way` runs the agent.
fn runs_agent(way: &str) -> bool {
    way.starts_with("interlock")
}

/// One way's node and its samples.
struct Way {
    name: &'static str,
    node: Node,
    meshed: Vec<Duration>,
    unmeshed: Vec<Duration>,
    del: Vec<Duration>,
    /// The plugin's own ADD time of each meshed sequential start, from its attachment
    /// records (`addUs`: decide, rules, proof, up to the record): how much of the
    /// start's difference is the plugin's own work.
    plugin_add: Vec<Duration>,
    /// Per burst size: every start's latency and each burst's pods per second.
    bursts: Vec<(usize, Vec<Duration>, Vec<f64>)>,
    /// CPU time (user + system) of the agent and of containerd spent during the
    /// sequential starts, and how many starts that was: on a 2-core node the agent
    /// competes with the runtime for the CPU, and its CRI calls are the runtime's work.
    cpu: Option<(Duration, Duration, usize)>,
    /// The agent's `ListPodSandbox` calls during the sequential starts (and their stops),
    /// and how many starts that was.
    lists: Option<(f64, usize)>,
    /// The stand-in's build directory (kept while the node may exec it).
    _standin: Option<tempfile::TempDir>,
}

/// Runs the benchmark and prints its JSON document.
pub fn run(mut a: SandboxArgs) -> anyhow::Result<()> {
    if !interlock_testkit::is_root() {
        bail!("interlock-bench sandbox needs root (containerd, netns, netfilter)");
    }
    if a.quick {
        a.samples = 2;
        a.rounds = 1;
        a.bursts = vec![4];
    }
    let interlock = match a.interlock.take() {
        Some(p) => p,
        None => std::env::current_exe()?.with_file_name("interlock"),
    };
    let plugin = a
        .plugin
        .take()
        .unwrap_or_else(|| interlock.with_file_name("interlock-cni"));
    for (what, p) in [("interlock", &interlock), ("interlock-cni", &plugin)] {
        if !p.is_file() {
            bail!("no {what} at {} (build it, or pass its path)", p.display());
        }
    }
    let mut names = a.ways.clone();
    if a.baseline_interlock.is_some() {
        names.push("interlock_baseline".into());
    }
    let mut ways = Vec::new();
    for name in &names {
        let Some(&name) = ALL_WAYS.iter().find(|w| *w == name) else {
            bail!("unknown way {name} (known: {})", ALL_WAYS.join(", "));
        };
        eprintln!("starting the {name} node …");
        let agent = match (name, &a.baseline_interlock) {
            ("interlock_baseline", Some(baseline)) => baseline,
            _ => &interlock,
        };
        ways.push(start_way(name, agent, &plugin).with_context(|| format!("the {name} way"))?);
    }
    for way in &ways {
        prove(way)?;
    }
    for round in 0..a.rounds {
        let order: Vec<usize> = (0..ways.len()).map(|i| (i + round) % ways.len()).collect();
        eprintln!("round {} of {} …", round + 1, a.rounds);
        // The sequential samples in blocks, the ways taking turns: a drift of a shared
        // machine then falls on every way alike, while each way's starts still follow
        // one another (the agent's reaction to one start overlaps its way's next).
        let mut left = a.samples;
        while left > 0 {
            let n = left.min(a.block.max(1));
            left -= n;
            for &i in &order {
                sequential_block(&mut ways[i], n)?;
            }
        }
        for &n in &a.bursts {
            for &i in &order {
                burst(&mut ways[i], n)?;
            }
        }
    }
    let doc = report(&a, &ways, &interlock, &plugin);
    for way in ways {
        if let Err(problems) = way.node.teardown() {
            eprintln!("the {} node left: {}", way.name, problems.join("; "));
        }
    }
    println!(
        "{}",
        if a.pretty {
            serde_json::to_string_pretty(&doc)?
        } else {
            doc.to_string()
        }
    );
    Ok(())
}

/// A node set up for `name`, ready to start pods that way.
fn start_way(
    name: &'static str,
    interlock: &std::path::Path,
    plugin: &std::path::Path,
) -> anyhow::Result<Way> {
    let node = Node::start(NodeOptions::new(interlock, plugin)).context("starting containerd")?;
    node.write_primary()?;
    let mut standin = None;
    match name {
        "primary" => {}
        "interlock" | "interlock_baseline" => {
            node.start_agent(AgentArgs::default())?;
            node.wait_agent_ready(Duration::from_secs(60))
                .map_err(anyhow::Error::msg)?;
        }
        "interlock_no_note" => {
            // A root-owned directory without a socket: the plugin's note fails at
            // connect, as with an agent that is not running, while the agent runs.
            let nowhere = node.state_dir().with_file_name("no-agent");
            std::fs::create_dir_all(&nowhere).context("creating the unserved socket's dir")?;
            let config = node.state_dir().with_file_name("plugin-config.json");
            std::fs::write(
                &config,
                json!({"agentSocket": nowhere.join("agent.sock")}).to_string(),
            )
            .context("writing the plugin config")?;
            node.start_agent(AgentArgs::args(&[
                "--plugin-config".to_string(),
                config.display().to_string(),
            ]))?;
            node.wait_agent_ready(Duration::from_secs(60))
                .map_err(anyhow::Error::msg)?;
        }
        "istio_standin" => standin = Some(chain_static(&node, standin_binary()?, "istio-standin")?),
        "chained_noop" => {
            let built = crate::build_chained_noop().map_err(anyhow::Error::msg)?;
            standin = Some(chain_static(&node, built, "chained-noop")?)
        }
        other => bail!("unknown way {other}"),
    }
    node.wait_network_ready(true, Duration::from_secs(60))
        .map_err(anyhow::Error::msg)?;
    Ok(Way {
        name,
        node,
        meshed: Vec::new(),
        unmeshed: Vec::new(),
        del: Vec::new(),
        plugin_add: Vec::new(),
        bursts: Vec::new(),
        cpu: None,
        lists: None,
        _standin: standin,
    })
}

/// Installs the static plugin `built` in the node's bin dir as `name` and chains it after
/// the primary's plugins; returns its build directory (kept while the node may exec it).
fn chain_static(
    node: &Node,
    (dir, bin): (tempfile::TempDir, PathBuf),
    name: &str,
) -> anyhow::Result<tempfile::TempDir> {
    std::fs::copy(&bin, node.bin_dir().join(name)).with_context(|| format!("installing {name}"))?;
    let mut config = node.primary_conflist();
    let plugins = config["plugins"]
        .as_array_mut()
        .context("the primary's conflist has no plugins")?;
    plugins.push(json!({ "type": name }));
    node.write_sorting_first(PRIMARY_CONFLIST, &config)?;
    Ok(dir)
}

/// `n` meshed sequential starts of `way` (and `n` unmeshed ones for the primary and the
/// interlock ways), with the CPU and the agent's sandbox lists they cost.
fn sequential_block(way: &mut Way, n: usize) -> anyhow::Result<()> {
    let cpu_before = cpu_use(way);
    let lists_before = agent_lists(way);
    let meshed = sequential(way, n, true)?;
    let mut starts = meshed.len();
    way.meshed.extend(meshed);
    if way.name == "primary" || runs_agent(way.name) {
        let unmeshed = sequential(way, n, false)?;
        starts += unmeshed.len();
        way.unmeshed.extend(unmeshed);
    }
    if let (Some(before), Some(after)) = (cpu_before, cpu_use(way)) {
        let (agent, runtime, n) = way.cpu.get_or_insert((Duration::ZERO, Duration::ZERO, 0));
        *agent += after.0.saturating_sub(before.0);
        *runtime += after.1.saturating_sub(before.1);
        *n += starts;
    }
    if let (Some(before), Some(after)) = (lists_before, agent_lists(way)) {
        let (lists, n) = way.lists.get_or_insert((0.0, 0));
        *lists += after - before;
        *n += starts;
    }
    Ok(())
}

/// The istio-cni stand-in, fed the nft-flavoured restore input of the rules interlock
/// installs for the node's meshed pods (the `generic` profile of [`MESHED_ANNOTATION`]).
fn standin_binary() -> anyhow::Result<(tempfile::TempDir, PathBuf)> {
    let annotations = std::collections::BTreeMap::from([(
        MESHED_ANNOTATION.0.into(),
        MESHED_ANNOTATION.1.into(),
    )]);
    let (_, spec) = interlock_redirect::spec_for(
        &PodView {
            annotations: &annotations,
            facts: None,
        },
        &ProfileName::ALL,
    )
    .map_err(|e| anyhow::anyhow!("the meshed annotation: {e}"))?
    .context("no profile claims the node's meshed pods")?;
    let spec = spec.as_installed();
    let jobs: Vec<(PathBuf, String)> = spec
        .families()
        .into_iter()
        .map(|family| {
            (
                crate::tool_path(&Flavour::Nft.tool(family, Tool::Restore)),
                iptables::restore_text(&spec, family),
            )
        })
        .collect();
    crate::build_istio_standin(&jobs).map_err(anyhow::Error::msg)
}

/// One meshed pod per way, proven captured by a connection (for `primary`: proven not
/// captured), so every figure is of the work it claims.
fn prove(way: &Way) -> anyhow::Result<()> {
    let sandbox = way
        .node
        .run_pod("prove", true)
        .map_err(|e| anyhow::anyhow!("{}: a meshed pod would not start: {e}", way.name))?;
    let capture = way.node.capture(&sandbox);
    way.node
        .remove_pod(&sandbox)
        .map_err(|e| anyhow::anyhow!("{}: removing the proof pod: {e}", way.name))?;
    let want_captured = way.name != "primary" && way.name != "chained_noop";
    match (&capture, want_captured) {
        (Capture::Redirected, true) | (Capture::NotRedirected, false) => Ok(()),
        _ => bail!(
            "{}: a meshed pod's capture is {capture:?}, not what this way does",
            way.name
        ),
    }
}

/// `n` sandboxes started one after another (timed), then stopped (timed: CNI DEL) and
/// removed.
fn sequential(way: &mut Way, n: usize, meshed: bool) -> anyhow::Result<Vec<Duration>> {
    let cri = way.node.cri();
    let configs: Vec<_> = (0..n)
        .map(|_| way.node.pod_config("bench", meshed))
        .collect();
    let records = way.node.state_dir().join(ATTACHMENTS_DIR);
    let (starts, dels, plugin_add) = way.node.block_on(async move {
        let mut ids = Vec::new();
        let mut starts = Vec::new();
        for c in &configs {
            let t = Instant::now();
            let id = cri.run_sandbox(c).await.context("RunPodSandbox")?;
            starts.push(t.elapsed());
            ids.push(id);
        }
        // Before the DELs remove them.
        let plugin_add = add_times(&records);
        let mut dels = Vec::new();
        for id in &ids {
            let t = Instant::now();
            cri.stop_sandbox(id).await.context("StopPodSandbox")?;
            dels.push(t.elapsed());
            cri.remove_sandbox(id).await.context("RemovePodSandbox")?;
        }
        anyhow::Ok((starts, dels, plugin_add))
    })?;
    way.del.extend(dels);
    if meshed {
        way.plugin_add.extend(plugin_add);
    }
    Ok(starts)
}

/// The `addUs` of every attachment record in `dir` (none when there is no such dir:
/// no interlock on the node).
fn add_times(dir: &std::path::Path) -> Vec<Duration> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let v: Value = serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok()?;
            Some(Duration::from_micros(v.get("addUs")?.as_u64()?))
        })
        .collect()
}

/// `n` meshed sandboxes started at once; each start's latency and the pods per second.
fn burst(way: &mut Way, n: usize) -> anyhow::Result<()> {
    let cri = way.node.cri();
    let configs: Vec<_> = (0..n).map(|_| way.node.pod_config("burst", true)).collect();
    let (starts, wall) = way.node.block_on(async move {
        let t0 = Instant::now();
        let runs = futures::future::join_all(configs.iter().map(|c| {
            let cri = cri.clone();
            async move {
                let t = Instant::now();
                let id = cri.run_sandbox(c).await;
                (id, t.elapsed())
            }
        }))
        .await;
        let wall = t0.elapsed();
        let mut starts = Vec::new();
        let mut ids = Vec::new();
        let mut failed = None;
        for (id, took) in runs {
            match id {
                Ok(id) => {
                    ids.push(id);
                    starts.push(took);
                }
                Err(e) => failed = Some(e),
            }
        }
        futures::future::join_all(ids.iter().map(|id| {
            let cri = cri.clone();
            async move {
                let _ = cri.stop_sandbox(id).await;
                let _ = cri.remove_sandbox(id).await;
            }
        }))
        .await;
        if let Some(e) = failed {
            bail!("RunPodSandbox in a burst of {n}: {e}");
        }
        anyhow::Ok((starts, wall))
    })?;
    let rate = n as f64 / wall.as_secs_f64();
    match way.bursts.iter_mut().find(|(size, _, _)| *size == n) {
        Some((_, all, rates)) => {
            all.extend(starts);
            rates.push(rate);
        }
        None => way.bursts.push((n, starts, vec![rate])),
    }
    Ok(())
}

/// The CPU time the way's agent (zero without one) and its containerd have used so far
/// (`None`: containerd not running, or `/proc` unreadable).
fn cpu_use(way: &Way) -> Option<(Duration, Duration)> {
    let agent = if runs_agent(way.name) {
        crate::repair::cpu_time(way.node.agent(|a| a.pid()))?
    } else {
        Duration::ZERO
    };
    Some((agent, crate::repair::cpu_time(way.node.containerd_pid()?)?))
}

/// The agent's `ListPodSandbox` calls so far (`None`: no agent, or no answer).
fn agent_lists(way: &Way) -> Option<f64> {
    if !runs_agent(way.name) {
        return None;
    }
    way.node
        .agent(|a| a.metric("interlock_audit_sandbox_lists_total"))
}

fn ms(s: &Option<Summary>) -> Value {
    s.as_ref().map_or(Value::Null, Summary::to_json_ms)
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// The JSON document: per way the figures, then the budgets with pass or miss.
fn report(
    a: &SandboxArgs,
    ways: &[Way],
    interlock: &std::path::Path,
    plugin: &std::path::Path,
) -> Value {
    let by = |name: &str| ways.iter().find(|w| w.name == name);
    let mut per_way = Map::new();
    for w in ways {
        let mut bursts = Map::new();
        for (n, starts, rates) in &w.bursts {
            bursts.insert(
                n.to_string(),
                json!({
                    "start_ms": ms(&Summary::of(starts)),
                    "pods_per_s_each_round": rates.iter().map(|r| round2(*r)).collect::<Vec<_>>(),
                    "pods_per_s_median": median(rates).map(round2),
                }),
            );
        }
        per_way.insert(
            w.name.into(),
            json!({
                "meshed_start_ms": ms(&Summary::of(&w.meshed)),
                "unmeshed_start_ms": ms(&Summary::of(&w.unmeshed)),
                "del_ms": ms(&Summary::of(&w.del)),
                "plugin_own_add_ms": ms(&Summary::of(&w.plugin_add)),
                "cpu_ms_per_sequential_start": w.cpu.and_then(|(agent, runtime, n)| {
                    let per = |d: Duration| round2(d.as_secs_f64() * 1000.0 / n as f64);
                    (n > 0).then(|| json!({"agent": per(agent), "containerd": per(runtime)}))
                }),
                "agent_sandbox_lists_per_sequential_start": w.lists.and_then(|(lists, n)| {
                    (n > 0).then(|| round2(lists / n as f64))
                }),
                "bursts": bursts,
            }),
        );
    }
    let overhead = |pick: fn(&Summary) -> f64| {
        let p = Summary::of(&by("primary")?.meshed)?;
        let i = Summary::of(&by("interlock")?.meshed)?;
        Some(round2((pick(&i) / pick(&p) - 1.0) * 100.0))
    };
    let mut budgets = vec![
        budget(
            "interlock_meshed_start_p50_over_primary_pct",
            overhead(|s| s.median_us),
            BUDGET_P50_PCT,
            true,
        ),
        budget(
            "interlock_meshed_start_p99_over_primary_pct",
            overhead(|s| s.p99_us),
            BUDGET_P99_PCT,
            true,
        ),
    ];
    for n in &a.bursts {
        let rate = |name: &str| {
            by(name)?
                .bursts
                .iter()
                .find(|(size, _, _)| size == n)
                .and_then(|(_, _, r)| median(r))
        };
        let share = rate("interlock")
            .zip(rate("primary"))
            .map(|(i, p)| round2(i / p));
        budgets.push(budget(
            &format!("interlock_pods_per_s_share_of_primary_burst_{n}"),
            share,
            BUDGET_RATE_SHARE,
            false,
        ));
    }
    json!({
        "bench": "sandbox",
        "runtime": "containerd (private, CRI), the reference primary bridge + host-local + portmap",
        "samples_per_round": a.samples,
        "rounds": a.rounds,
        "block": a.block,
        "bursts": a.bursts,
        "ways": per_way,
        "budgets": budgets,
        "reference": reference(ways),
        "breakdown": breakdown(ways),
        "interlock": interlock.display().to_string(),
        "plugin": plugin.display().to_string(),
    })
}

/// The meshed starts' summary of the way `name` (`None`: not run, or no samples).
fn meshed(ways: &[Way], name: &str) -> Option<Summary> {
    Summary::of(&ways.iter().find(|w| w.name == name)?.meshed)
}

/// How much slower `a`'s meshed starts are than `b`'s at `pick`, in percent.
fn over_pct(ways: &[Way], a: &str, b: &str, pick: fn(&Summary) -> f64) -> Option<f64> {
    Some(round2(
        (pick(&meshed(ways, a)?) / pick(&meshed(ways, b)?) - 1.0) * 100.0,
    ))
}

/// What any chained plugin costs a start on this runtime, next to the budgets (judged
/// against the primary alone): the chained no-op over the primary, and interlock over
/// the chained no-op.
fn reference(ways: &[Way]) -> Vec<Value> {
    let line = |name: String, a: &str, b: &str, pick: fn(&Summary) -> f64| json!({"name": name, "figure": over_pct(ways, a, b, pick)});
    let mut out = Vec::new();
    for (q, pick) in [
        ("p50", (|s: &Summary| s.median_us) as fn(&Summary) -> f64),
        ("p99", |s: &Summary| s.p99_us),
    ] {
        out.push(line(
            format!("chained_noop_meshed_start_{q}_over_primary_pct"),
            "chained_noop",
            "primary",
            pick,
        ));
        out.push(line(
            format!("interlock_meshed_start_{q}_over_chained_noop_pct"),
            "interlock",
            "chained_noop",
            pick,
        ));
    }
    out
}

/// Where the difference between interlock's meshed start median and the primary's goes,
/// in ms: chaining any plugin (the chained no-op over the primary), the plugin's own ADD
/// (its `addUs`), the agent's reaction to the ADD note (`interlock` over
/// `interlock_no_note`, when that way ran) and the rest (exec and exit of the plugin,
/// state writes, the note, and the machine's noise: a difference of medians of samples
/// that ran at different times).
fn breakdown(ways: &[Way]) -> Value {
    let p50 = |name: &str| meshed(ways, name).map(|s| s.median_us / 1000.0);
    let diff = |a: &str, b: &str| Some(round2(p50(a)? - p50(b)?));
    let total = diff("interlock", "primary");
    let chaining = diff("chained_noop", "primary");
    let own_add = ways
        .iter()
        .find(|w| w.name == "interlock")
        .and_then(|w| Summary::of(&w.plugin_add))
        .map(|s| round2(s.median_us / 1000.0));
    let reaction = diff("interlock", "interlock_no_note");
    let rest = total.map(|t| {
        round2(t - chaining.unwrap_or(0.0) - own_add.unwrap_or(0.0) - reaction.unwrap_or(0.0))
    });
    json!({
        "of": "interlock's meshed start p50 minus the primary alone's, in ms",
        "total_ms": total,
        "chaining_any_plugin_ms": chaining,
        "plugin_own_add_ms": own_add,
        "agent_reaction_to_the_note_ms": reaction,
        "rest_ms": rest,
    })
}

/// A budget's line: its figure, its limit, and whether it holds (`at_most`: the figure
/// must not exceed the limit; otherwise it must reach it).
fn budget(name: &str, figure: Option<f64>, limit: f64, at_most: bool) -> Value {
    let pass = figure.map(|f| if at_most { f <= limit } else { f >= limit });
    json!({
        "name": name,
        "figure": figure,
        "budget": if at_most { format!("<= {limit}") } else { format!(">= {limit}") },
        "pass": pass,
    })
}

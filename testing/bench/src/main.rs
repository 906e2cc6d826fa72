//! `interlock-bench`: measures plugin ADD (meshed, per backend, and unmeshed), the
//! in-process engine, and the `iptables-restore` / per-rule `iptables` baselines on the
//! same rule set in throwaway netns, and prints one JSON document to stdout.
//! Progress goes to stderr. Needs root.
//!
//! `interlock-bench repair …` measures the agent's config repair instead
//! ([`interlock_bench::repair`]; no root needed); `interlock-bench audit` the sandbox
//! audit and the in-place repair of a pod ([`interlock_bench::audit`]); and
//! `interlock-bench api-load …` the Kubernetes API load per node
//! ([`interlock_bench::api_load`]; no root needed); `interlock-bench sandbox` what
//! interlock adds to a pod's start on a real runtime ([`interlock_bench::sandbox`]).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use interlock_bench::run::{self, Plan};
use interlock_bench::{report, Bench, Scenario};

/// Benchmarks interlock's plugin ADD against iptables baselines; prints JSON.
#[derive(Debug, Parser)]
#[command(
    name = "interlock-bench",
    version,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    add: Args,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Measure the agent's config repair, follow and /readyz latencies (one JSON line).
    Repair(interlock_bench::repair::RepairArgs),
    /// Measure the sandbox audit over many meshed netns and the in-place repair (JSON).
    Audit(interlock_bench::audit::AuditArgs),
    /// Measure the Kubernetes API load per node of N simulated agents (one JSON document).
    ApiLoad(interlock_bench::api_load::ApiLoadArgs),
    /// Measure what interlock adds to a sandbox's start on a private containerd (JSON).
    Sandbox(interlock_bench::sandbox::SandboxArgs),
    /// Judge every budget on the median of several runs' documents (JSON).
    Budgets(interlock_bench::budgets::BudgetsArgs),
}

/// The plugin ADD benchmark's flags.
#[derive(Debug, clap::Args)]
struct Args {
    /// The interlock-cni binary (default: interlock-cni next to this executable).
    #[arg(long)]
    plugin: Option<PathBuf>,
    /// Samples per scenario (the per-rule baseline takes --per-rule-samples).
    #[arg(long)]
    samples: Option<usize>,
    /// Samples of each per-rule iptables baseline (default 20, or samples/10 if smaller).
    #[arg(long)]
    per_rule_samples: Option<usize>,
    /// Rounds the samples are interleaved in.
    #[arg(long)]
    rounds: Option<usize>,
    /// A smoke run: a few samples of everything.
    #[arg(long)]
    quick: bool,
    /// Only these scenarios (comma-separated keys, e.g. add_meshed_nftables,add_unmeshed).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Parent directory of the plugin's stateDir (default /dev/shm: a tmpfs like a
    /// node's /run, where the plugin's default /var/run/interlock lives).
    #[arg(long)]
    state_parent: Option<PathBuf>,
    /// Concurrent ADD levels (comma-separated N; default 1,8,32,64 for a full run, none
    /// with --only; 0 for none).
    #[arg(long, value_delimiter = ',')]
    concurrency: Vec<usize>,
    /// Pretty-print the JSON.
    #[arg(long)]
    pretty: bool,
    /// Let the sequential samples run on any CPU (by default they run on one: see
    /// `interlock_bench::pin`).
    #[arg(long)]
    no_pin: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let done = |name: &str, r: anyhow::Result<()>| match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("interlock-bench {name}: {e:#}");
            ExitCode::FAILURE
        }
    };
    match cli.command {
        Some(Command::Audit(a)) => return done("audit", interlock_bench::audit::run(a)),
        Some(Command::ApiLoad(a)) => return done("api-load", interlock_bench::api_load::run(a)),
        Some(Command::Repair(a)) => return done("repair", interlock_bench::repair::run(a)),
        Some(Command::Sandbox(a)) => return done("sandbox", interlock_bench::sandbox::run(a)),
        Some(Command::Budgets(a)) => return done("budgets", interlock_bench::budgets::run(a)),
        None => {}
    }
    let args = cli.add;
    if !interlock_testkit::is_root() {
        eprintln!(
            "interlock-bench: needs root (it creates network namespaces and netfilter rules); run it with sudo"
        );
        return ExitCode::from(2);
    }
    let mut plan = if args.quick {
        Plan::quick()
    } else {
        Plan::standard()
    };
    if let Some(n) = args.samples {
        plan.samples = n.max(1);
        plan.per_rule_samples = plan.per_rule_samples.min((n / 10).max(1));
    }
    if let Some(n) = args.per_rule_samples {
        plan.per_rule_samples = n.max(1);
    }
    if let Some(r) = args.rounds {
        plan.rounds = r.max(1);
    }
    if !args.only.is_empty() {
        let mut picked = Vec::new();
        for key in &args.only {
            match Scenario::from_key(key) {
                Some(s) => picked.push(s),
                None => {
                    let known: Vec<String> = Scenario::all().iter().map(|s| s.key()).collect();
                    eprintln!(
                        "interlock-bench: unknown scenario {key:?}; known: {}",
                        known.join(", ")
                    );
                    return ExitCode::from(2);
                }
            }
        }
        plan.scenarios = picked;
    }
    let plugin = args
        .plugin
        .unwrap_or_else(interlock_bench::default_plugin_path);
    let loadavg = std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let state_parent = args
        .state_parent
        .unwrap_or_else(interlock_bench::default_state_parent);
    let bench = match Bench::with_state_parent(&plugin, &state_parent) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("interlock-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!(
        "interlock-bench: {} scenarios, {} samples ({} per-rule) in {} rounds, plugin {}",
        plan.scenarios.len(),
        plan.samples,
        plan.per_rule_samples,
        plan.rounds,
        plugin.display()
    );
    let pinned = if args.no_pin {
        None
    } else {
        interlock_bench::pin::Pinned::here()
    };
    let sequential_cpu = pinned.as_ref().map(|p| p.cpu);
    let collected = match run::run(&bench, &plan, &mut |line| {
        eprintln!("interlock-bench: {line}")
    }) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("interlock-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    drop(pinned);
    let levels: Vec<usize> = match args.concurrency.as_slice() {
        [] if args.quick => vec![1, 8],
        [] if args.only.is_empty() => interlock_bench::concurrent::LEVELS.to_vec(),
        given => given.iter().copied().filter(|n| *n > 0).collect(),
    };
    let concurrency = match interlock_bench::concurrent::run(&bench, &levels, &mut |line| {
        eprintln!("interlock-bench: {line}")
    }) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("interlock-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut doc = report::report(&bench, &plan, &collected, &loadavg, concurrency);
    doc["plan"]["sequential_cpu"] = sequential_cpu.map_or(
        serde_json::Value::String("any (unpinned)".into()),
        serde_json::Value::from,
    );
    let text = if args.pretty {
        serde_json::to_string_pretty(&doc)
    } else {
        serde_json::to_string(&doc)
    }
    .expect("JSON");
    println!("{text}");
    ExitCode::SUCCESS
}

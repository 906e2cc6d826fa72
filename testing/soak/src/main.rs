//! `interlock-soak`: runs the chaos soak, prints its JSON report on stdout and a summary
//! on stderr, and exits 1 when an invariant broke (2 when the soak could not run).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use interlock_contract::guard::GuardedMesh;
use interlock_soak::chaos::ChaosKind;
use interlock_soak::run::{default_bin_dir, run, SoakOptions};

/// A bounded chaos soak of interlock on a private containerd.
#[derive(Debug, Parser)]
#[command(name = "interlock-soak")]
struct Args {
    /// Sandboxes to start (failed creations are retried as new pods and counted apart).
    #[arg(long, default_value_t = 2000)]
    creations: u64,
    /// Sandboxes created in parallel.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Sandboxes running at once at most (residents aside).
    #[arg(long, default_value_t = 12)]
    max_live: usize,
    /// Seed of the chaos plan and the workload (default: random, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// The agent's --config-mode: owned or chain (--guard-mesh sets guard).
    #[arg(long, default_value = "owned")]
    config_mode: String,
    /// The agent's --audit-interval, in seconds.
    #[arg(long, default_value_t = 0.5)]
    audit_interval: f64,
    /// Chaos kinds in play, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    chaos: Vec<ChaosKind>,
    /// Meshed sandboxes kept running through the whole soak and checked at the end.
    #[arg(long, default_value_t = 8)]
    resident: u64,
    /// Directory of the `interlock` and `interlock-cni` binaries (default: next to this one).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// The control run: no agent, no plugin; every meshed sandbox runs unprotected and
    /// the soak must fail, which shows the checker sees it.
    #[arg(long)]
    without_interlock: bool,
    /// Keep every agent's log in this file (the node's directory is removed at the end).
    #[arg(long)]
    agent_log: Option<PathBuf>,
    /// Pretty-print the JSON report.
    #[arg(long)]
    pretty: bool,
    /// Keep creating sandboxes for at least this many seconds (even after --creations).
    #[arg(long, default_value_t = 0)]
    min_duration_s: u64,
    /// The release the upgrade steps switch to and back from (a git tag, built once per
    /// target dir by the test kit, offline); default: this build again from another path.
    #[arg(long, conflicts_with = "other_bin_dir")]
    other_release: Option<String>,
    /// Directory of the other build's `interlock` and `interlock-cni` (instead of
    /// --other-release).
    #[arg(long)]
    other_bin_dir: Option<PathBuf>,
    /// Without the fake Kubernetes API (the agent with --kube=none); the sentinel steps,
    /// which are checked through it, are left out.
    #[arg(long)]
    no_kube: bool,
    /// Guard mode: the mesh's plugin and installer stand-ins (`mesh-standin`, next to
    /// the other binaries) run on the node, and the agent with `--config-mode guard
    /// --guard-mesh <mesh>` guards them: istio, linkerd, consul or kuma. Its chaos adds
    /// installer_restart, installer_kill and t_binary_delete; config_ahead is left out,
    /// and the upgrades too when the other build is an older release.
    #[arg(long, conflicts_with_all = ["no_kube", "without_interlock"])]
    guard_mesh: Option<GuardedMesh>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let seed = args.seed.unwrap_or_else(rand::random);
    eprintln!("interlock-soak: seed {seed} (replay with --seed {seed})");
    let Some(bin_dir) = args.bin_dir.or_else(default_bin_dir) else {
        eprintln!("interlock-soak: interlock and interlock-cni not found next to this binary; pass --bin-dir");
        return ExitCode::from(2);
    };
    let mut opts = SoakOptions::new(args.creations, seed, &bin_dir);
    opts.config_mode = args.config_mode;
    if let Some(mesh) = args.guard_mesh {
        opts = opts.guard(mesh);
    }
    opts.workers = args.workers;
    opts.max_live = args.max_live;
    opts.audit_interval_s = args.audit_interval;
    opts.resident = args.resident;
    opts.with_interlock = !args.without_interlock;
    opts.agent_log = args.agent_log;
    if !args.chaos.is_empty() {
        opts.chaos = args.chaos;
    }
    opts.min_duration = std::time::Duration::from_secs(args.min_duration_s);
    opts.kube = !args.no_kube;
    if let Some(dir) = args.other_bin_dir {
        opts.other_build = Some((dir.join("interlock"), dir.join("interlock-cni")));
    }
    if let Some(tag) = args.other_release {
        eprintln!("interlock-soak: building {tag} (once per target dir; offline)");
        match interlock_testkit::release::build(&tag) {
            Ok(r) => {
                if let Some(t) = r.built_in {
                    eprintln!(
                        "interlock-soak: built {tag} ({}) in {:.0} s",
                        &r.commit[..12],
                        t.as_secs_f64()
                    );
                }
                opts.other_build = Some((r.interlock, r.plugin));
            }
            Err(e) => {
                eprintln!("interlock-soak: cannot build {tag}: {e}");
                return ExitCode::from(2);
            }
        }
    }
    match run(&opts) {
        Ok(report) => {
            let json = if args.pretty {
                serde_json::to_string_pretty(&report)
            } else {
                serde_json::to_string(&report)
            };
            println!("{}", json.expect("the report serialises"));
            eprint!("{}", report.summary());
            if report.ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("interlock-soak: the soak could not run (seed {seed}): {e:#}");
            ExitCode::from(2)
        }
    }
}

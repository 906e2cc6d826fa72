//! `interlock`: the node agent and the command line.
//!
//! This file only parses the command line and dispatches; the work lives in
//! `interlock_agent` (agent, uninstall) and in the modules named after each subcommand.

mod agent_cmd;
mod bench;
mod check;

use clap::{Parser, Subcommand};

/// interlock: race-free, verifiable service-mesh traffic redirection for Kubernetes nodes.
#[derive(Debug, Parser)]
#[command(name = "interlock", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the node agent: install the plugin, keep the runtime's CNI config carrying
    /// interlock, report readiness (/healthz, /readyz, /metrics and the STATUS marker).
    Agent(agent_cmd::AgentArgs),
    /// Remove exactly what interlock added to the CNI conf dir and bin dirs.
    Uninstall(agent_cmd::UninstallArgs),
    /// Explain what this node's runtime will load and whether a pod started now is
    /// protected (exit 0 protected, 1 not protected, 2 error).
    Check(check::CheckArgs),
    /// Measure config repair latency against a real agent (prints JSON).
    #[command(hide = true)]
    BenchRepair(bench::BenchArgs),
}

fn main() -> std::process::ExitCode {
    let command = Cli::parse().command;
    // `check` reserves 1 for "not protected"; its own failures exit 2.
    let error_code = if matches!(command, Command::Check(_)) {
        2
    } else {
        1
    };
    let result = match command {
        Command::Agent(a) => agent_cmd::run_agent(a).map(|()| std::process::ExitCode::SUCCESS),
        Command::Uninstall(a) => {
            agent_cmd::run_uninstall(a).map(|()| std::process::ExitCode::SUCCESS)
        }
        Command::BenchRepair(a) => bench::run(a).map(|()| std::process::ExitCode::SUCCESS),
        Command::Check(a) => check::run(a),
    };
    result.unwrap_or_else(|e| {
        eprintln!("interlock: {e:#}");
        std::process::ExitCode::from(error_code)
    })
}

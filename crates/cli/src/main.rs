//! `interlock`: the node agent and the command line.
//!
//! This file only parses the command line and dispatches; the work lives in
//! `interlock_agent` (agent, uninstall) and in the modules named after each subcommand.

mod agent_cmd;
mod bench;

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
    /// Measure config repair latency against a real agent (prints JSON).
    #[command(hide = true)]
    BenchRepair(bench::BenchArgs),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Agent(a) => agent_cmd::run_agent(a),
        Command::Uninstall(a) => agent_cmd::run_uninstall(a),
        Command::BenchRepair(a) => bench::run(a),
    }
}

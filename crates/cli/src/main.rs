//! `interlock`: the node agent and the command line.
//!
//! This file only parses the command line and dispatches; the work lives in
//! `interlock_agent` (agent, uninstall) and in the modules named after each subcommand.

mod agent_cmd;
mod check;
mod inspect;
mod manifests;
mod validate;

/// How `INTERLOCK_CNI_BIN_DIR` separates several bin dirs, for `agent`, `uninstall`
/// and `check` alike: ':' as in `CNI_PATH` and `PATH`.
pub const BIN_DIR_DELIMITER: char = ':';

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use interlock_agent::health::telemetry::{self, LogFormat};
use std::io::Write;

/// interlock: race-free, verifiable service-mesh traffic redirection for Kubernetes nodes.
#[derive(Debug, Parser)]
#[command(name = "interlock", version = interlock_buildinfo::VERSION, about)]
struct Cli {
    /// How log lines look (the filter comes from INTERLOCK_LOG or RUST_LOG, default info).
    #[arg(
        long,
        global = true,
        env = "INTERLOCK_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    log_format: LogFormatArg,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormatArg {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the node agent: install the plugin, keep the runtime's CNI config carrying
    /// interlock, report readiness (/healthz, /readyz, /metrics and the STATUS marker).
    Agent(agent_cmd::AgentArgs),
    /// Remove exactly what interlock added to this node (conf dir, bin dirs, state dir),
    /// refusing while an agent runs there; `--cluster`: the node condition and pod labels
    /// the agents wrote into the Kubernetes API. `--dry-run` lists what would go and what
    /// stays (exit 0 done, 1 refused, incomplete or failed, 64 usage).
    Uninstall(agent_cmd::UninstallArgs),
    /// Explain what this node's runtime will load and whether a pod started now is
    /// protected (exit 0 protected, 1 at risk, 2 unprotected, 3 could not check, 64 usage).
    Check(check::CheckArgs),
    /// One pod or netns on this node: the spec that applies, the rules present, the
    /// difference (exit 0 protected or not meshed, 2 unprotected, 3 could not decide).
    Inspect(inspect::InspectArgs),
    /// Init-container mode: prove from inside the pod's netns that its outbound traffic
    /// is redirected to the proxy (exit 0 proven or not meshed, 2 NOT protected, 3 could
    /// not validate, 64 usage). Run as a UID the rules capture, before the proxy.
    Validate(validate::ValidateArgs),
    /// Print the Kubernetes objects that install interlock (`| kubectl apply -f -`);
    /// settings from values files (`-f values.yaml`) and `--set key=value`.
    Manifests(manifests::ManifestsArgs),
    /// Print a completion script for a shell, generated from this command line
    /// (bash: `interlock completions bash > /etc/bash_completion.d/interlock`).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff), generated from this command line
    /// (`interlock man | man -l -`).
    Man,
}

/// The completion script for `shell`.
fn completions(shell: clap_complete::Shell, out: &mut dyn Write) {
    clap_complete::generate(shell, &mut Cli::command(), "interlock", out);
}

/// The man page: the command, then a section per subcommand with its own options.
fn man_page(out: &mut dyn Write) -> std::io::Result<()> {
    let cmd = Cli::command();
    clap_mangen::Man::new(cmd.clone()).render(out)?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let title = format!("INTERLOCK-{}", sub.get_name().to_uppercase());
        let sub = sub
            .clone()
            .bin_name(format!("interlock {}", sub.get_name()));
        let man = clap_mangen::Man::new(sub);
        // One page: the subcommand's own description, synopsis and options as sections
        // of this one.
        writeln!(out, ".SH \"{title}\"")?;
        man.render_description_section(out)?;
        man.render_synopsis_section(out)?;
        man.render_options_section(out)?;
    }
    Ok(())
}

/// The exit code of a command line that does not parse (sysexits' EX_USAGE), apart from
/// every verdict `check` can give.
const USAGE_ERROR: u8 = 64;

fn main() -> std::process::ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp
                | clap::error::ErrorKind::DisplayVersion
                | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                    std::process::ExitCode::SUCCESS
                }
                _ => std::process::ExitCode::from(USAGE_ERROR),
            };
        }
    };
    let format = match cli.log_format {
        LogFormatArg::Text => LogFormat::Text,
        LogFormatArg::Json => LogFormat::Json,
    };
    if let Err(e) = telemetry::init_logging(format) {
        eprintln!("interlock: {e}");
        return std::process::ExitCode::from(2);
    }
    let command = cli.command;
    // `check` answers every verdict itself (3: could not check); what is left is an
    // error writing its output.
    let error_code = match command {
        Command::Check(_) | Command::Inspect(_) | Command::Validate(_) => 3,
        // A refused `--set` is a usage error.
        Command::Manifests(_) => USAGE_ERROR,
        _ => 1,
    };
    let result = match command {
        Command::Agent(a) => agent_cmd::run_agent(a).map(|()| std::process::ExitCode::SUCCESS),
        Command::Uninstall(a) => agent_cmd::run_uninstall(a),
        Command::Check(a) => check::run(a),
        Command::Inspect(a) => inspect::run(a),
        Command::Validate(a) => validate::run(a),
        Command::Manifests(a) => manifests::run(a),
        Command::Completions { shell } => {
            completions(shell, &mut std::io::stdout().lock());
            Ok(std::process::ExitCode::SUCCESS)
        }
        Command::Man => man_page(&mut std::io::stdout().lock())
            .map(|()| std::process::ExitCode::SUCCESS)
            .map_err(Into::into),
    };
    result.unwrap_or_else(|e| {
        eprintln!("interlock: {e:#}");
        std::process::ExitCode::from(error_code)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUBCOMMANDS: [&str; 8] = [
        "agent",
        "uninstall",
        "check",
        "inspect",
        "validate",
        "manifests",
        "completions",
        "man",
    ];

    #[test]
    fn completions_are_generated_for_each_shell_and_know_every_subcommand() {
        for (shell, marker) in [
            (clap_complete::Shell::Bash, "complete -F"),
            (clap_complete::Shell::Zsh, "#compdef interlock"),
            (clap_complete::Shell::Fish, "complete -c interlock"),
        ] {
            let mut out = vec![];
            completions(shell, &mut out);
            let text = String::from_utf8(out).unwrap();
            assert!(text.contains(marker), "{shell}: {text}");
            for sub in SUBCOMMANDS {
                assert!(text.contains(sub), "{shell}: no {sub}");
            }
            // Subcommand flags too, and the values of a value enum (`-o text|json`).
            assert!(text.contains("cni-conf-dir"), "{shell}");
            assert!(text.contains("json"), "{shell}");
        }
    }

    #[test]
    fn the_man_page_has_every_subcommand_and_its_options() {
        let mut out = vec![];
        man_page(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with(".ie") || text.contains(".TH interlock"),
            "{text}"
        );
        assert!(text.contains(".TH interlock 1"), "{text}");
        for sub in SUBCOMMANDS {
            assert!(
                text.contains(&format!(".SH \"INTERLOCK-{}\"", sub.to_uppercase())),
                "no section for {sub}"
            );
        }
        // Options of a subcommand, with their environment variable.
        assert!(text.contains("cni\\-conf\\-dir"), "{text}");
        assert!(
            text.contains("INTERLOCK_CONFLICT_THRESHOLD")
                || text.contains("INTERLOCK_CNI_CONF_DIR")
        );
    }
}

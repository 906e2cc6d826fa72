//! Errors of the agent, each naming the file or address involved and what to do.

use std::path::PathBuf;

/// Everything that can stop the agent or an uninstall.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The plugin binary to install cannot be read or does not answer VERSION.
    #[error(
        "plugin source {path}: {reason}; pass --plugin-source with a working interlock-cni binary"
    )]
    PluginSource {
        /// The source path.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A directory the agent needs cannot be created, read or watched.
    #[error("{path}: {reason}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The health endpoint cannot listen.
    #[error("cannot listen on {addr} for /healthz, /readyz, /metrics: {reason}; choose another --health-addr")]
    Listen {
        /// The address asked for.
        addr: String,
        /// What went wrong.
        reason: String,
    },
    /// The `--plugin-config` file cannot be read or is not a valid interlock-cni config.
    #[error("plugin config {path}: {reason}; fix the file given with --plugin-config (INTERLOCK_PLUGIN_CONFIG)")]
    PluginConfig {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the field.
        reason: String,
    },
    /// Some uninstall steps failed (all were attempted).
    #[error("uninstall incomplete: {}", .0.join("; "))]
    Uninstall(Vec<String>),
    /// Anything else on the runtime side (threads, signals).
    #[error("{0}")]
    Runtime(String),
}

//! File names and the state dir's layout, shared by the plugin (which writes attachment
//! and netns state), the agent (which writes the marker and serves the socket) and the
//! CLI (which reads them).
//!
//! ```text
//! <stateDir>/                      default /var/run/interlock
//!   agent-ready.json               the agent's readiness marker (crate::marker)
//!   agent.sock                     the agent socket (crate::agent_socket)
//!   backend-detected.json          the plugin's cached `backend: auto` detection
//!   guard-entry.json               guard mode: the mesh plugin entry last learnt
//!   attachments/<id>+<ifname>.json one per attachment (or h-<sha256>.json for long ids)
//!   netns/<dev>-<ino>.json|.lock   one per protected pod netns, and its lock
//! ```

use std::path::{Path, PathBuf};

/// Default `stateDir` of the plugin and `--state-dir` of the agent.
pub const DEFAULT_STATE_DIR: &str = "/var/run/interlock";
/// The runtime's usual CNI config directory.
pub const DEFAULT_CNI_CONF_DIR: &str = "/etc/cni/net.d";
/// The runtime's usual CNI plugin directory.
pub const DEFAULT_CNI_BIN_DIR: &str = "/opt/cni/bin";

/// The network name of the config the agent keeps first while the node has no primary
/// CNI config: a chain of interlock-cni alone, whose ADD fails ("try again later"), so
/// that the moment the primary writes its file the runtime still loads a config that
/// holds pods back until the agent has chained interlock-cni after the primary.
pub const HOLDING_NETWORK: &str = "interlock-waiting-for-primary";

/// Guard mode: the mesh plugin entry the agent last learnt, kept in the state dir so a
/// restarted agent guards without a window.
pub const GUARD_ENTRY_FILE: &str = "guard-entry.json";

/// The readiness marker's file name in the state dir.
pub const MARKER_FILE: &str = "agent-ready.json";
/// The agent socket's file name in the state dir.
pub const AGENT_SOCKET_FILE: &str = "agent.sock";
/// The plugin's cached backend detection in the state dir.
pub const BACKEND_CACHE_FILE: &str = "backend-detected.json";
/// The directory of per-attachment state in the state dir.
pub const ATTACHMENTS_DIR: &str = "attachments";
/// The directory of per-netns records and locks in the state dir.
pub const NETNS_DIR: &str = "netns";

/// The marker's path under `state_dir`.
pub fn marker_path(state_dir: &Path) -> PathBuf {
    state_dir.join(MARKER_FILE)
}

//! The CNI protocol in Rust, both sides of it.
//!
//! Network configs and config lists (with every foreign field kept in order), results for
//! spec versions 0.3.0 to 1.1.0 and the conversions between them, the spec's error
//! object, conf-dir loading with containerd's and CRI-O's exact rules, the runtime
//! side — executing plugin binaries and whole chains — and the plugin side: the skeleton
//! a plugin's verbs plug into ([`skel`]).

/// Atomic file writes (the contract's: every interlock file is written the same way).
pub use interlock_contract::atomic;
pub mod bounded;
pub mod cache;
pub mod conf;
pub mod confdir;
pub mod error;
pub mod exec;
pub mod gojson;
mod netconf;
pub mod result;
pub mod skel;
pub mod version;

pub use conf::{
    parse_conf, parse_conflist, ConfError, ConfFormat, NetworkConfigList, PluginConf, Validation,
};
pub use error::CniError;
pub use result::CniResult;
pub use version::CniVersion;

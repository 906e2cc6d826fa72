//! The runtime side of CNI, in Rust: what libcni does for containerd and CRI-O.
//!
//! Config lists (`.conflist`) and single configs (`.conf`) read exactly as the runtimes
//! read them ([`conf`], with Go's `encoding/json` leniency in [`gojson`] and libcni's
//! struct decoding of a plugin entry in `netconf`), with every foreign field kept in
//! order; running one plugin binary or a whole chain ([`exec`]: ADD in order threading
//! `prevResult`, DEL in reverse, CHECK, GC, STATUS, VERSION time-boxed); and the result
//! cache a runtime keeps ([`result_cache`]).
//!
//! The agent uses it to ask plugins their VERSION and to edit config lists; the tests use
//! it to drive real plugin chains.

pub mod conf;
pub mod error;
pub mod exec;
pub mod gojson;
mod netconf;
pub mod result_cache;
pub mod runtime_conf;

pub use conf::{parse_conf, parse_conflist, ConfFormat, NetworkConfigList, PluginConf, Validation};
pub use error::ConfError;
pub use runtime_conf::RuntimeConf;

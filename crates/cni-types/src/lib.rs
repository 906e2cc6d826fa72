//! The CNI protocol as a plugin sees it: the verbs ([`verb`]), results for spec versions
//! 0.3.0 to 1.1.0 and the conversions between them ([`result`]), the spec's error object
//! and codes ([`error`]), spec versions ([`version`]), and the skeleton a plugin's verbs
//! plug into ([`skel`]: environment, stdin, version negotiation, error output).
//!
//! This is all a plugin links of the protocol. The runtime side (running plugins and
//! chains, the result cache, config lists as libcni parses them) is `interlock-libcni`;
//! which config file a runtime loads is `interlock-confdir`.

pub mod error;
pub mod result;
pub mod skel;
pub mod verb;
pub mod version;

pub use error::CniError;
pub use result::CniResult;
pub use verb::Command;
pub use version::CniVersion;

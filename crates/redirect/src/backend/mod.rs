//! Backends that apply a [`RedirectSpec`] inside the current network namespace.

use crate::spec::RedirectSpec;

pub mod nftables;

/// Which mechanism programs the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// nf_tables over netlink, in process.
    Nftables,
    /// `iptables-restore` of the nft flavour.
    IptablesNft,
    /// `iptables-restore` of the legacy flavour.
    IptablesLegacy,
}

/// What a read-back found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verification {
    /// Exactly the expected rules are present.
    Exact,
    /// Something differs; each entry says what.
    Mismatch(Vec<String>),
}

/// A failure of a backend operation.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The kernel or a tool refused an operation.
    #[error("{backend:?} {op}: {msg}")]
    Failed {
        /// Backend that failed.
        backend: BackendKind,
        /// Operation (apply, verify, remove).
        op: &'static str,
        /// What went wrong.
        msg: String,
    },
}

/// Applies, verifies and removes interlock's rules. Every method runs on a thread that is
/// already inside the pod's network namespace.
pub trait Backend {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;
    /// Installs exactly the rules for `spec` in one atomic transaction; a no-op when present.
    fn apply(&self, spec: &RedirectSpec) -> Result<(), BackendError>;
    /// Reads the rules back and compares them with what `spec` needs.
    fn verify(&self, spec: &RedirectSpec) -> Result<Verification, BackendError>;
    /// Removes everything interlock installed; succeeds when nothing is there.
    fn remove(&self) -> Result<(), BackendError>;
}

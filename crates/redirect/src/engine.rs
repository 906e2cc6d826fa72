//! What the plugin and the agent call: protect a pod's netns (apply → verify → probe),
//! check it (verify only), unprotect it (remove).
//!
//! Every function enters the netns on a dedicated thread ([`crate::netns::in_netns`]) and
//! creates the backend there (netlink sockets belong to the netns they are opened in).
//! Errors say which step failed, in which netns, with which backend, and why.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::backend::{self, BackendError, BackendKind, Verification};
use crate::netns::{in_netns, NetnsError};
use crate::probe::{self, ProbeError, ProbeReport};
use crate::spec::{RedirectSpec, SpecError};

/// Tuning for [`protect_with`].
#[derive(Debug, Clone)]
pub struct ProtectOptions {
    /// How long the probe waits for its connection.
    pub probe_timeout: Duration,
}

impl Default for ProtectOptions {
    fn default() -> Self {
        ProtectOptions {
            probe_timeout: probe::DEFAULT_TIMEOUT,
        }
    }
}

/// A netns whose rules were applied, verified and proven.
#[derive(Debug, Clone)]
pub struct Protection {
    /// Backend that installed the rules.
    pub backend: BackendKind,
    /// [`RedirectSpec::hash`] of the installed spec (record it in state).
    pub spec_hash: String,
    /// What the probe proved.
    pub probe: ProbeReport,
    /// Time spent applying and verifying the rules.
    pub rules_time: Duration,
    /// Time spent probing.
    pub probe_time: Duration,
}

/// Outcome of [`unprotect`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unprotected {
    /// interlock's rules were removed (or were not there).
    Removed,
    /// The netns no longer exists: nothing to remove (normal for a late CNI DEL).
    NetnsGone,
}

/// The step of [`protect`], [`check`] or [`unprotect`] that failed.
#[derive(Debug, thiserror::Error)]
pub enum ProtectError {
    /// The spec is invalid; nothing was touched.
    #[error("invalid redirect spec, nothing applied: {0}")]
    Spec(#[from] SpecError),
    /// The netns cannot be entered; nothing was touched.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// The backend cannot be used here.
    #[error("{backend} backend unavailable in {netns}: {source}")]
    Open {
        /// Netns file.
        netns: PathBuf,
        /// Backend.
        backend: BackendKind,
        /// Why.
        source: BackendError,
    },
    /// Applying the rules failed.
    #[error("applying redirect rules in {netns} with {backend} failed: {source}{}", cleanup_note(.cleanup))]
    Apply {
        /// Netns file.
        netns: PathBuf,
        /// Backend.
        backend: BackendKind,
        /// Why.
        source: BackendError,
        /// `None` when leftovers were removed, else why removing them failed too.
        cleanup: Option<String>,
    },
    /// Reading the rules back failed.
    #[error("reading back redirect rules in {netns} with {backend} failed: {source}{}", cleanup_note(.cleanup))]
    Verify {
        /// Netns file.
        netns: PathBuf,
        /// Backend.
        backend: BackendKind,
        /// Why.
        source: BackendError,
        /// `None` when leftovers were removed (or nothing was applied), else why removal failed.
        cleanup: Option<String>,
    },
    /// The rules read back are not exactly the expected ones.
    #[error("redirect rules in {netns} ({backend}) are not the expected ones: {}{}", .diffs.join("; "), cleanup_note(.cleanup))]
    Mismatch {
        /// Netns file.
        netns: PathBuf,
        /// Backend.
        backend: BackendKind,
        /// Every difference.
        diffs: Vec<String>,
        /// `None` when leftovers were removed (or nothing was applied), else why removal failed.
        cleanup: Option<String>,
    },
    /// The probe did not prove the redirection.
    #[error("proving the redirection in {netns} ({backend}) failed: {source}{}", cleanup_note(.cleanup))]
    Probe {
        /// Netns file.
        netns: PathBuf,
        /// Backend.
        backend: BackendKind,
        /// Why.
        source: ProbeError,
        /// `None` when the rules were removed again, else why removal failed.
        cleanup: Option<String>,
    },
    /// Removing the rules failed.
    #[error("removing redirect rules in {netns} with {backend} failed: {source}")]
    Remove {
        /// Netns file.
        netns: PathBuf,
        /// Backend.
        backend: BackendKind,
        /// Why.
        source: BackendError,
    },
}

fn cleanup_note(cleanup: &Option<String>) -> String {
    match cleanup {
        None => String::new(),
        Some(e) => format!("; removing the partial rules also failed: {e}"),
    }
}

impl ProtectError {
    /// The failed step: `spec`, `netns`, `open`, `apply`, `verify`, `probe` or `remove`.
    pub fn step(&self) -> &'static str {
        match self {
            ProtectError::Spec(_) => "spec",
            ProtectError::Netns(_) => "netns",
            ProtectError::Open { .. } => "open",
            ProtectError::Apply { .. } => "apply",
            ProtectError::Verify { .. } | ProtectError::Mismatch { .. } => "verify",
            ProtectError::Probe { .. } => "probe",
            ProtectError::Remove { .. } => "remove",
        }
    }
}

/// Applies `spec` in the netns at `netns` with `backend`, verifies the rules read back
/// are exactly the expected ones, and proves outbound capture with the probe (destinations
/// chosen from `probe_targets`, normally the pod's gateways). On any failure after the
/// apply began, interlock's rules are removed again, so the netns holds all or nothing.
pub fn protect(
    netns: &Path,
    spec: &RedirectSpec,
    backend: BackendKind,
    probe_targets: &[IpAddr],
) -> Result<Protection, ProtectError> {
    protect_with(
        netns,
        spec,
        backend,
        probe_targets,
        &ProtectOptions::default(),
    )
}

/// [`protect`] with explicit options.
pub fn protect_with(
    netns: &Path,
    spec: &RedirectSpec,
    kind: BackendKind,
    probe_targets: &[IpAddr],
    options: &ProtectOptions,
) -> Result<Protection, ProtectError> {
    spec.validate()?;
    let path = netns.to_path_buf();
    in_netns(netns, || {
        let backend = backend::open(kind).map_err(|source| ProtectError::Open {
            netns: path.clone(),
            backend: kind,
            source,
        })?;
        let cleanup = || backend.remove().err().map(|e| e.to_string());

        let t = Instant::now();
        match backend.apply_and_verify(spec) {
            Ok(Verification::Exact) => {}
            Ok(Verification::Mismatch(diffs)) => {
                return Err(ProtectError::Mismatch {
                    netns: path.clone(),
                    backend: kind,
                    diffs,
                    cleanup: cleanup(),
                })
            }
            Err(source) if source.op() == "verify" => {
                return Err(ProtectError::Verify {
                    netns: path.clone(),
                    backend: kind,
                    source,
                    cleanup: cleanup(),
                })
            }
            Err(source) => {
                return Err(ProtectError::Apply {
                    netns: path.clone(),
                    backend: kind,
                    source,
                    cleanup: cleanup(),
                })
            }
        }
        let rules_time = t.elapsed();

        let t = Instant::now();
        let report = match probe::probe(spec, probe_targets, options.probe_timeout) {
            Ok(r) => r,
            Err(source) => {
                return Err(ProtectError::Probe {
                    netns: path.clone(),
                    backend: kind,
                    source,
                    cleanup: cleanup(),
                })
            }
        };
        Ok(Protection {
            backend: kind,
            spec_hash: spec.hash(),
            probe: report,
            rules_time,
            probe_time: t.elapsed(),
        })
    })?
}

/// Reads the rules in `netns` back and compares them with `spec` (no traffic, no change).
pub fn check(
    netns: &Path,
    spec: &RedirectSpec,
    kind: BackendKind,
) -> Result<Verification, ProtectError> {
    spec.validate()?;
    let path = netns.to_path_buf();
    in_netns(netns, || {
        let backend = backend::open(kind).map_err(|source| ProtectError::Open {
            netns: path.clone(),
            backend: kind,
            source,
        })?;
        backend.verify(spec).map_err(|source| ProtectError::Verify {
            netns: path.clone(),
            backend: kind,
            source,
            cleanup: None,
        })
    })?
}

/// Removes interlock's rules from `netns`. A netns that no longer exists is
/// [`Unprotected::NetnsGone`], not an error (CNI DEL must succeed then).
pub fn unprotect(netns: &Path, kind: BackendKind) -> Result<Unprotected, ProtectError> {
    let path = netns.to_path_buf();
    let result = in_netns(netns, || {
        let backend = backend::open(kind).map_err(|source| ProtectError::Open {
            netns: path.clone(),
            backend: kind,
            source,
        })?;
        backend.remove().map_err(|source| ProtectError::Remove {
            netns: path.clone(),
            backend: kind,
            source,
        })
    });
    match result {
        Ok(Ok(())) => Ok(Unprotected::Removed),
        Ok(Err(e)) => Err(e),
        Err(e) if e.is_gone() => Ok(Unprotected::NetnsGone),
        Err(e) => Err(e.into()),
    }
}

/// Removes interlock's rules of every backend from `netns` (for a DEL without recorded
/// state, and for uninstall). Tries all backends even when one fails; the first error is
/// returned after the others ran. A vanished netns is [`Unprotected::NetnsGone`].
pub fn unprotect_all(netns: &Path) -> Result<Unprotected, ProtectError> {
    let mut first_error = None;
    for kind in BackendKind::ALL {
        match unprotect(netns, kind) {
            Ok(Unprotected::NetnsGone) => return Ok(Unprotected::NetnsGone),
            Ok(Unprotected::Removed) => {}
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        None => Ok(Unprotected::Removed),
        Some(e) => Err(e),
    }
}

//! The rules of a pod's netns, for the attachment layer (`interlock_attach::protect`): install
//! and prove them (apply → verify → probe), check them (verify only), remove them.
//!
//! Every function enters the netns on a dedicated thread ([`crate::netns::in_netns`]) and
//! creates the backend there (netlink sockets belong to the netns they are opened in).
//! Errors say which step failed, in which netns, with which backend, and why.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use interlock_contract::codes::Step;

use crate::backend::{self, BackendError, BackendKind, ToolLookup, Verification};
use crate::netns::{in_netns, NetnsError, PodNetns};
use crate::probe::{self, ProbeError, ProbeReport};
use crate::route::Rtnetlink;
use crate::spec::{Family, RedirectSpec, SpecError, PASSTHROUGH_SOURCE_V6};

/// Tuning for [`install_and_prove_with`].
#[derive(Debug, Clone)]
pub struct InstallOptions {
    /// How long the probe waits for its connection.
    pub probe_timeout: Duration,
    /// Remove interlock's rules again when a step after the apply fails (all or
    /// nothing). `false` when another attachment of the same netns relies on them: a
    /// failed ADD of one attachment must not strip another's protection.
    pub remove_on_failure: bool,
    /// The netns is believed to hold none of interlock's rules (nothing is recorded for
    /// it): the backend may skip its read before the change
    /// ([`crate::backend::Backend::create_and_verify`]). A wrong belief costs time, not
    /// correctness.
    pub new_netns: bool,
    /// Whether a running proxy may own its outbound port (the agent's in-place repair of
    /// a running pod), see [`probe::ProxyPort`].
    pub proxy_port: probe::ProxyPort,
    /// [`RedirectSpec::hash`] of the spec when the caller has it already (it recorded
    /// it): [`Installed::spec_hash`] then is this, not hashed again. It must be the
    /// spec's; `None` hashes the spec.
    pub spec_hash: Option<String>,
}

impl Default for InstallOptions {
    fn default() -> Self {
        InstallOptions {
            probe_timeout: probe::DEFAULT_TIMEOUT,
            remove_on_failure: true,
            new_netns: false,
            proxy_port: probe::ProxyPort::Free,
            spec_hash: None,
        }
    }
}

/// A netns whose rules were applied, verified and proven.
#[derive(Debug, Clone)]
pub struct Installed {
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

/// Outcome of [`remove_rules`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// interlock's rules were removed (or were not there).
    Removed,
    /// The netns no longer exists: nothing to remove (normal for a late CNI DEL).
    NetnsGone,
}

/// The step of [`install_and_prove`], [`check`] or [`remove_rules`] that failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
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
        source: Box<BackendError>,
    },
    /// Applying the rules failed.
    #[error("applying redirect rules in {netns} with {backend} failed: {source}{}", cleanup_note(.cleanup))]
    Apply {
        /// Netns file.
        netns: PathBuf,
        /// Backend.
        backend: BackendKind,
        /// Why.
        source: Box<BackendError>,
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
        source: Box<BackendError>,
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
        source: Box<BackendError>,
    },
    /// Removing the rules of every backend ([`remove_all_rules`]) failed for more than one
    /// backend; every failure is listed (the other backends were still tried).
    #[error("removing redirect rules in {netns} failed for {} backends: {}", .failures.len(), join_failures(.failures))]
    RemoveAll {
        /// Netns file.
        netns: PathBuf,
        /// Each backend's failure, in the order tried.
        failures: Vec<EngineError>,
    },
}

fn join_failures(failures: &[EngineError]) -> String {
    failures
        .iter()
        .enumerate()
        .map(|(i, e)| format!("({}) {e}", i + 1))
        .collect::<Vec<_>>()
        .join("; ")
}

fn cleanup_note(cleanup: &Option<String>) -> String {
    match cleanup {
        None => String::new(),
        Some(e) => format!("; removing the partial rules also failed: {e}"),
    }
}

impl EngineError {
    /// The failed step.
    pub fn step(&self) -> Step {
        match self {
            EngineError::Spec(_) => Step::Spec,
            EngineError::Netns(_) => Step::Netns,
            EngineError::Open { .. } => Step::Open,
            EngineError::Apply { .. } => Step::Apply,
            EngineError::Verify { .. } | EngineError::Mismatch { .. } => Step::Verify,
            EngineError::Probe { .. } => Step::Probe,
            EngineError::Remove { .. } | EngineError::RemoveAll { .. } => Step::Remove,
        }
    }

    /// For a failure after rules were (partly) applied: `Some(why)` when removing them
    /// again failed too, so interlock's rules may remain in the netns; `None` when the
    /// netns was left without interlock rules (or nothing was applied).
    pub fn cleanup_failure(&self) -> Option<&str> {
        match self {
            EngineError::Apply { cleanup, .. }
            | EngineError::Verify { cleanup, .. }
            | EngineError::Mismatch { cleanup, .. }
            | EngineError::Probe { cleanup, .. } => cleanup.as_deref(),
            _ => None,
        }
    }

    /// The backend involved, when the failure is about one backend.
    pub fn backend(&self) -> Option<BackendKind> {
        match self {
            EngineError::Open { backend, .. }
            | EngineError::Apply { backend, .. }
            | EngineError::Verify { backend, .. }
            | EngineError::Mismatch { backend, .. }
            | EngineError::Probe { backend, .. }
            | EngineError::Remove { backend, .. } => Some(*backend),
            _ => None,
        }
    }
}

/// Applies `spec` in the netns at `netns` with `backend`, verifies the rules read back
/// are exactly the expected ones, and proves outbound capture with the probe (destinations
/// chosen from `probe_targets`, normally the pod's gateways). On any failure after the
/// apply began, interlock's rules are removed again, so the netns holds all or nothing
/// (unless [`InstallOptions::remove_on_failure`] is off).
pub fn install_and_prove(
    netns: &Path,
    spec: &RedirectSpec,
    backend: BackendKind,
    probe_targets: &[IpAddr],
) -> Result<Installed, EngineError> {
    install_and_prove_with(
        netns,
        spec,
        backend,
        probe_targets,
        &InstallOptions::default(),
    )
}

/// Opens `kind` on the calling thread (already inside the netns at `netns`).
fn open_backend(
    kind: BackendKind,
    netns: &Path,
) -> Result<Box<dyn backend::Backend + Send + Sync>, EngineError> {
    backend::open(kind).map_err(|source| EngineError::Open {
        netns: netns.to_path_buf(),
        backend: kind,
        source: Box::new(source),
    })
}

/// [`install_and_prove`] with explicit options.
pub fn install_and_prove_with(
    netns: &Path,
    spec: &RedirectSpec,
    kind: BackendKind,
    probe_targets: &[IpAddr],
    options: &InstallOptions,
) -> Result<Installed, EngineError> {
    spec.validate()?;
    install_and_prove_in(&PodNetns::open(netns)?, spec, kind, probe_targets, options)
}

/// [`install_and_prove_with`] in a namespace the caller has opened already.
pub fn install_and_prove_in(
    pod: &PodNetns,
    spec: &RedirectSpec,
    kind: BackendKind,
    probe_targets: &[IpAddr],
    options: &InstallOptions,
) -> Result<Installed, EngineError> {
    spec.validate()?;
    let path = pod.path().to_path_buf();
    pod.run(|| {
        let backend = open_backend(kind, &path)?;
        let cleanup = || {
            if options.remove_on_failure {
                backend.remove().err().map(|e| e.to_string())
            } else {
                None
            }
        };

        let t = Instant::now();
        if let Err(source) = ensure_passthrough_source(spec) {
            return Err(EngineError::Apply {
                netns: path.clone(),
                backend: kind,
                source: Box::new(BackendError::Address {
                    what: format!("adding {PASSTHROUGH_SOURCE_V6}/128 to lo"),
                    source,
                }),
                cleanup: cleanup(),
            });
        }
        let applied = if options.new_netns {
            backend.create_and_verify(spec)
        } else {
            backend.apply_and_verify(spec)
        };
        match applied {
            Ok(Verification::Exact) => {}
            Ok(Verification::Mismatch(diffs)) => {
                return Err(EngineError::Mismatch {
                    netns: path.clone(),
                    backend: kind,
                    diffs,
                    cleanup: cleanup(),
                })
            }
            Err(source) if source.op() == Step::Verify => {
                return Err(EngineError::Verify {
                    netns: path.clone(),
                    backend: kind,
                    source: Box::new(source),
                    cleanup: cleanup(),
                })
            }
            Err(source) => {
                return Err(EngineError::Apply {
                    netns: path.clone(),
                    backend: kind,
                    source: Box::new(source),
                    cleanup: cleanup(),
                })
            }
        }
        let rules_time = t.elapsed();

        let t = Instant::now();
        let report = match probe::probe_with(
            spec,
            probe_targets,
            options.probe_timeout,
            options.proxy_port,
        ) {
            Ok(r) => r,
            Err(source) => {
                return Err(EngineError::Probe {
                    netns: path.clone(),
                    backend: kind,
                    source,
                    cleanup: cleanup(),
                })
            }
        };
        Ok(Installed {
            backend: kind,
            spec_hash: options.spec_hash.clone().unwrap_or_else(|| spec.hash()),
            probe: report,
            rules_time,
            probe_time: t.elapsed(),
        })
    })?
}

/// Envoy binds `::6` as the source of its IPv6 inbound passthrough, so a spec whose
/// passthrough source passes has it on `lo` (as istio-cni adds it). A netns with IPv6
/// turned off has no IPv6 traffic for it to serve.
fn ensure_passthrough_source(spec: &RedirectSpec) -> std::io::Result<()> {
    if !spec.loopback.passthrough_source || !spec.families().contains(&Family::V6) {
        return Ok(());
    }
    const LO_INDEX: u32 = 1;
    match Rtnetlink::open()?.add_address(LO_INDEX, PASSTHROUGH_SOURCE_V6.into(), 128) {
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => Ok(()),
        other => other,
    }
}

/// Reads the rules in `netns` back and compares them with `spec` (no traffic, no change).
pub fn check(
    netns: &Path,
    spec: &RedirectSpec,
    kind: BackendKind,
) -> Result<Verification, EngineError> {
    spec.validate()?;
    check_in(&PodNetns::open(netns)?, spec, kind)
}

/// [`check`] in a namespace the caller has opened already.
pub fn check_in(
    pod: &PodNetns,
    spec: &RedirectSpec,
    kind: BackendKind,
) -> Result<Verification, EngineError> {
    spec.validate()?;
    let path = pod.path().to_path_buf();
    pod.run(|| {
        let backend = open_backend(kind, &path)?;
        backend.verify(spec).map_err(|source| EngineError::Verify {
            netns: path.clone(),
            backend: kind,
            source: Box::new(source),
            cleanup: None,
        })
    })?
}

/// Proves by a connection, without changing anything, that the rules in the namespace
/// `pod` capture what `spec` needs captured (the probe of [`install_and_prove_in`] alone): how the
/// audit judges rules an older release wrote, which this build would render differently.
pub fn prove_in(
    pod: &PodNetns,
    spec: &RedirectSpec,
    kind: BackendKind,
    probe_targets: &[IpAddr],
    timeout: Duration,
    port: probe::ProxyPort,
) -> Result<ProbeReport, EngineError> {
    spec.validate()?;
    let path = pod.path().to_path_buf();
    pod.run(|| {
        probe::probe_with(spec, probe_targets, timeout, port).map_err(|source| EngineError::Probe {
            netns: path.clone(),
            backend: kind,
            source,
            cleanup: None,
        })
    })?
}

/// Removes interlock's rules from `netns`. A netns that no longer exists is
/// [`Removal::NetnsGone`], not an error (CNI DEL must succeed then).
pub fn remove_rules(netns: &Path, kind: BackendKind) -> Result<Removal, EngineError> {
    remove_rules_with(netns, kind, &ToolLookup::System)
}

/// [`remove_rules`], the iptables backends finding their programs with `tools`.
pub fn remove_rules_with(
    netns: &Path,
    kind: BackendKind,
    tools: &ToolLookup,
) -> Result<Removal, EngineError> {
    let path = netns.to_path_buf();
    let result = in_netns(netns, || {
        let backend = backend::open_with(kind, tools).map_err(|source| EngineError::Open {
            netns: path.clone(),
            backend: kind,
            source: Box::new(source),
        })?;
        backend.remove().map_err(|source| EngineError::Remove {
            netns: path.clone(),
            backend: kind,
            source: Box::new(source),
        })
    });
    match result {
        Ok(Ok(())) => Ok(Removal::Removed),
        Ok(Err(e)) => Err(e),
        Err(e) if e.is_gone() => Ok(Removal::NetnsGone),
        Err(e) => Err(e.into()),
    }
}

/// Removes interlock's rules of every backend from `netns` (for a DEL without recorded
/// state, and for uninstall). Every backend is tried even when one fails; one error then
/// lists every failure. A backend whose tools are not installed has none of its rules
/// there and counts as removed. A vanished netns is [`Removal::NetnsGone`].
pub fn remove_all_rules(netns: &Path) -> Result<Removal, EngineError> {
    remove_all_rules_with(netns, &ToolLookup::System)
}

/// [`remove_all_rules`], the iptables backends finding their programs with `tools`.
pub fn remove_all_rules_with(netns: &Path, tools: &ToolLookup) -> Result<Removal, EngineError> {
    collect_removals(
        netns,
        BackendKind::ALL
            .into_iter()
            .map(|kind| remove_rules_with(netns, kind, tools)),
    )
}

/// Folds the per-backend outcomes of [`remove_all_rules`] (consumed lazily, in order): the
/// first [`Removal::NetnsGone`] ends it; a netns that cannot be entered ends it with
/// that error (every backend would fail the same way); otherwise every outcome is
/// collected — no failure is `Removed`, one is returned as is, several become
/// [`EngineError::RemoveAll`] listing each.
fn collect_removals(
    netns: &Path,
    outcomes: impl IntoIterator<Item = Result<Removal, EngineError>>,
) -> Result<Removal, EngineError> {
    let mut failures = Vec::new();
    for outcome in outcomes {
        match outcome {
            Ok(Removal::NetnsGone) => return Ok(Removal::NetnsGone),
            Ok(Removal::Removed) => {}
            Err(e @ EngineError::Netns(_)) => return Err(e),
            Err(e) => failures.push(e),
        }
    }
    match failures.len() {
        0 => Ok(Removal::Removed),
        1 => Err(failures.remove(0)),
        _ => Err(EngineError::RemoveAll {
            netns: netns.to_path_buf(),
            failures,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remove_failure(kind: BackendKind, msg: &str) -> EngineError {
        EngineError::Remove {
            netns: PathBuf::from("/run/netns/ilpod"),
            backend: kind,
            source: Box::new(BackendError::Tool {
                backend: kind,
                op: Step::Remove,
                command: "restore".into(),
                status: "exit status: 4".into(),
                stderr: msg.to_string(),
                input: None,
            }),
        }
    }

    #[test]
    fn removal_failures_are_all_collected() {
        let ns = Path::new("/run/netns/ilpod");
        assert_eq!(
            collect_removals(ns, [Ok(Removal::Removed), Ok(Removal::Removed)]).unwrap(),
            Removal::Removed
        );
        // One failure: returned as is, the later backends were still tried.
        let mut tried = Vec::new();
        let one = collect_removals(
            ns,
            BackendKind::ALL.into_iter().map(|k| {
                tried.push(k);
                if k == BackendKind::Nftables {
                    Err(remove_failure(k, "netlink: EPERM"))
                } else {
                    Ok(Removal::Removed)
                }
            }),
        )
        .unwrap_err();
        assert_eq!(tried, BackendKind::ALL);
        assert!(matches!(
            one,
            EngineError::Remove {
                backend: BackendKind::Nftables,
                ..
            }
        ));
        assert_eq!(one.step(), Step::Remove);
        // Several: one error naming every backend and cause, in order.
        let all = collect_removals(
            ns,
            [
                Err(remove_failure(BackendKind::Nftables, "netlink: EPERM")),
                Ok(Removal::Removed),
                Err(remove_failure(
                    BackendKind::IptablesLegacy,
                    "restore: exit 4",
                )),
            ],
        )
        .unwrap_err();
        assert_eq!(all.step(), Step::Remove);
        let text = all.to_string();
        assert!(
            text.starts_with(
                "removing redirect rules in /run/netns/ilpod failed for 2 backends: (1) "
            ) && text.contains(
                "nftables failed: nftables remove: restore failed (exit status: 4): netlink: EPERM"
            ) && text
                .contains("(2) removing redirect rules in /run/netns/ilpod with iptables-legacy")
                && text.contains("restore: exit 4"),
            "{text}"
        );
        // A vanished netns ends it early, even after a failure.
        let mut calls = 0;
        let gone = collect_removals(
            ns,
            [
                Err(remove_failure(BackendKind::Nftables, "x")),
                Ok(Removal::NetnsGone),
                Err(remove_failure(BackendKind::IptablesLegacy, "y")),
            ]
            .into_iter()
            .inspect(|_| calls += 1),
        );
        assert_eq!(gone.unwrap(), Removal::NetnsGone);
        assert_eq!(calls, 2);
    }

    #[test]
    fn cleanup_failure_is_reported() {
        let kind = BackendKind::IptablesNft;
        let source = || BackendError::Tool {
            backend: kind,
            op: Step::Apply,
            command: "iptables-nft-restore --noflush (IPv4)".into(),
            status: "exit status: 1".into(),
            stderr: "boom".into(),
            input: None,
        };
        let clean = EngineError::Apply {
            netns: "/x".into(),
            backend: kind,
            source: Box::new(source()),
            cleanup: None,
        };
        assert_eq!(clean.cleanup_failure(), None);
        let dirty = EngineError::Apply {
            netns: "/x".into(),
            backend: kind,
            source: Box::new(source()),
            cleanup: Some("restore failed".into()),
        };
        assert_eq!(dirty.cleanup_failure(), Some("restore failed"));
        assert_eq!(dirty.backend(), Some(kind));
        assert!(dirty
            .to_string()
            .contains("removing the partial rules also failed: restore failed"));
    }
}

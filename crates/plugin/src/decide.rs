//! The ADD pipeline's seams: [`decide`] (is this pod meshed?), [`decide_with_lookup`]
//! (the same, asking the agent or the API when the runtime passed no annotations),
//! [`protect`] (make it so, provably), [`check`] and [`unprotect`].
//!
//! `decide` is pure: configuration + [`PodIdentity`] in, [`Decision`] out, using the mesh
//! profiles of `interlock_redirect`. `protect` applies the redirection inside the pod
//! netns through `interlock_redirect::engine` (apply → verify → probe; the engine removes
//! its rules again when a step fails, so the netns holds all or nothing) and reports a
//! [`Protection`] to record, or a [`Failure`] naming the step.

use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use interlock_protocol::CniResult;
use interlock_redirect::backend::{self, BackendKind};
use interlock_redirect::{
    engine, ProfileName, ProtectError, RedirectSpec, Unprotected, Verification,
};
use serde::{Deserialize, Serialize};

use crate::config::{BackendChoice, PluginConfig};
use crate::identity::PodIdentity;
use crate::lookup::{self, Resolved, Source};

/// What to do with an attachment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "kebab-case")]
pub enum Decision {
    /// Not interlock's business (excluded namespace, not a Kubernetes pod).
    Skip {
        /// Why.
        reason: String,
    },
    /// The pod is not meshed: pass through.
    NotMeshed {
        /// Why.
        reason: String,
    },
    /// The pod is meshed: its traffic must be redirected before ADD succeeds.
    Meshed {
        /// The profile that claimed it.
        profile: ProfileName,
        /// The rules it needs (from the profile).
        spec: Box<RedirectSpec>,
    },
    /// The pod's mesh status cannot be known.
    Undecided {
        /// Why, and what to do.
        reason: String,
    },
    /// The pod's mesh annotations cannot be turned into rules.
    Invalid {
        /// The error, naming the annotation.
        reason: String,
    },
}

impl Decision {
    /// A short label for logs and state (`skip`, `not-meshed`, `meshed`, …).
    pub fn label(&self) -> &'static str {
        match self {
            Decision::Skip { .. } => "skip",
            Decision::NotMeshed { .. } => "not-meshed",
            Decision::Meshed { .. } => "meshed",
            Decision::Undecided { .. } => "undecided",
            Decision::Invalid { .. } => "invalid",
        }
    }
}

/// True when `decide` would need the pod's annotations and the runtime did not pass them:
/// a Kubernetes pod, outside `excludeNamespaces`, with `annotations == None`.
pub fn needs_lookup(config: &PluginConfig, pod: &PodIdentity) -> bool {
    pod.is_kubernetes_pod() && !config.is_excluded(&pod.namespace) && pod.annotations.is_none()
}

/// Decides from the configuration and the pod identity alone (no I/O). A pod whose
/// annotations are unknown is [`Decision::Undecided`]; [`decide_with_lookup`] asks the
/// agent and the API first.
pub fn decide(config: &PluginConfig, pod: &PodIdentity) -> Decision {
    if !pod.is_kubernetes_pod() {
        return Decision::Skip {
            reason: "CNI_ARGS names no Kubernetes pod (K8S_POD_NAMESPACE/K8S_POD_NAME missing)"
                .into(),
        };
    }
    if config.is_excluded(&pod.namespace) {
        return Decision::Skip {
            reason: format!("namespace {} is in excludeNamespaces", pod.namespace),
        };
    }
    let Some(annotations) = &pod.annotations else {
        return Decision::Undecided {
            reason: format!(
                "the runtime did not pass the annotations of pod {} (declare capability \
                 io.kubernetes.cri.pod-annotations in the interlock-cni entry)",
                pod.display_name()
            ),
        };
    };
    match interlock_redirect::decide(annotations, &config.profiles) {
        Ok(Some((profile, spec))) => Decision::Meshed {
            profile,
            spec: Box::new(spec),
        },
        Ok(None) => Decision::NotMeshed {
            reason: format!(
                "no enabled profile ({}) claims the pod",
                config
                    .profiles
                    .iter()
                    .map(|p| p.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        },
        Err(e) => Decision::Invalid {
            reason: e.to_string(),
        },
    }
}

/// [`decide`], but when the runtime passed no annotations ([`needs_lookup`]) they are
/// fetched first through [`lookup::resolve`] (agent socket, then the Kubernetes API). The
/// pod identity is updated with what was found; the returned [`Source`] says where the
/// annotations came from. No network call is made when the runtime passed annotations.
pub fn decide_with_lookup(config: &PluginConfig, pod: &mut PodIdentity) -> (Decision, Source) {
    if !needs_lookup(config, pod) {
        return (decide(config, pod), Source::RuntimeConfig);
    }
    match lookup::resolve(config, pod) {
        Resolved::Found {
            annotations,
            source,
        } => {
            pod.annotations = Some(annotations);
            (decide(config, pod), source)
        }
        Resolved::NotFound { source, detail } => (
            Decision::NotMeshed {
                reason: format!("{source} says the pod does not exist: {detail}"),
            },
            source,
        ),
        Resolved::Undecided { tried } => (
            Decision::Undecided {
                reason: format!(
                    "the runtime did not pass the annotations of pod {} and no source could \
                     tell them: {}",
                    pod.display_name(),
                    tried.join("; ")
                ),
            },
            Source::None,
        ),
    }
}

/// Per-step timings of a protected ADD, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Timings {
    /// Applying and verifying the rules.
    pub rules_us: u64,
    /// The probe.
    pub probe_us: u64,
    /// The whole `protect` call (backend selection, netns entry, rules, probe).
    pub protect_us: u64,
}

/// A meshed attachment whose redirection was applied, verified and proven.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Protected {
    /// The profile that claimed the pod.
    pub profile: ProfileName,
    /// The backend that installed the rules (the one DEL and CHECK use).
    pub backend: BackendKind,
    /// Why that backend (configured, or what `auto` detected).
    pub backend_reason: String,
    /// The installed spec, as [`RedirectSpec::canonical_json`] (both address families).
    pub spec: String,
    /// [`RedirectSpec::hash`] of the installed spec.
    pub spec_hash: String,
    /// What the probe proved, one line per family (landed on the proxy, sealed without a
    /// route, or nothing captured and why).
    pub probe: Vec<String>,
    /// How long it took.
    pub timings: Timings,
}

impl Protected {
    /// The installed spec, read back from its canonical JSON; checks the recorded hash.
    pub fn installed_spec(&self) -> Result<RedirectSpec, String> {
        let spec: RedirectSpec = serde_json::from_str(&self.spec)
            .map_err(|e| format!("recorded spec is unreadable: {e}"))?;
        if spec.hash() != self.spec_hash {
            return Err(format!(
                "recorded spec does not match its recorded hash {} (state file edited or corrupt)",
                self.spec_hash
            ));
        }
        Ok(spec)
    }
}

/// What `protect` did for the attachment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "protection", rename_all = "kebab-case")]
pub enum Protection {
    /// Nothing to protect (skip / not meshed).
    NotNeeded,
    /// Rules applied, verified and proven.
    Protected(Box<Protected>),
    /// The pod should be meshed but runs WITHOUT redirection (only with
    /// `failurePolicy: open`).
    Unprotected {
        /// The step that failed (`lookup`, `spec`, `netns`, `apply`, `verify`, `probe`, …).
        step: String,
        /// Why.
        reason: String,
    },
}

impl Protection {
    /// A short label for logs.
    pub fn label(&self) -> &'static str {
        match self {
            Protection::NotNeeded => "not-needed",
            Protection::Protected(_) => "protected",
            Protection::Unprotected { .. } => "UNPROTECTED",
        }
    }
}

/// A failed step for a meshed pod: which, with which CNI error code, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The step (`spec`, `netns`, `open`, `apply`, `verify`, `probe`, `remove`, `state`).
    pub step: &'static str,
    /// The CNI error code for it (see the crate docs).
    pub code: u32,
    /// The full explanation.
    pub message: String,
    /// `Some(why)` when rules were applied and removing them again failed too, so
    /// interlock's rules may remain in the netns; `None` when none were left.
    pub leftover_rules: Option<String>,
}

impl Failure {
    /// A failure that left no interlock rules behind (nothing applied, or cleaned up).
    pub fn clean(step: &'static str, code: u32, message: impl Into<String>) -> Failure {
        Failure {
            step,
            code,
            message: message.into(),
            leftover_rules: None,
        }
    }
}

/// The CNI error code for a failed engine step (see the table in the crate docs).
pub fn code_for_step(step: &str) -> u32 {
    match step {
        "spec" => crate::ERR_INVALID_POD_ANNOTATIONS,
        "open" | "apply" => crate::ERR_APPLY,
        "verify" => crate::ERR_VERIFY,
        "probe" => crate::ERR_PROBE,
        "netns" => crate::ERR_NETNS,
        "remove" => crate::ERR_REMOVE,
        "state" => interlock_protocol::error::IO_FAILURE,
        _ => crate::ERR_INTERNAL,
    }
}

impl From<ProtectError> for Failure {
    fn from(e: ProtectError) -> Failure {
        let step = e.step();
        let leftover_rules = e.cleanup_failure().map(|why| {
            let backend = e.backend().map(|b| format!("{b} ")).unwrap_or_default();
            format!("interlock's {backend}rules may remain (removing them failed: {why})")
        });
        Failure {
            step,
            code: code_for_step(step),
            message: e.to_string(),
            leftover_rules,
        }
    }
}

/// The backend to use for `choice`, and why. `auto` runs the host detection (in the
/// plugin's own netns, which is the host's), or reuses a recent one cached under
/// `state_dir` ([`crate::backend_cache`]).
pub fn resolve_backend(choice: BackendChoice, state_dir: &Path) -> (BackendKind, String) {
    let fixed = |k: BackendKind| (k, format!("configured backend {k}"));
    match choice {
        BackendChoice::Nftables => fixed(BackendKind::Nftables),
        BackendChoice::IptablesNft => fixed(BackendKind::IptablesNft),
        BackendChoice::IptablesLegacy => fixed(BackendKind::IptablesLegacy),
        BackendChoice::Auto => {
            crate::backend_cache::resolve_auto(state_dir, crate::status::now_ms(), backend::detect)
        }
    }
}

/// The addresses and gateways `prev` gives the interface `ifname`.
pub fn pod_addresses(prev: &CniResult, ifname: &str) -> (Vec<IpAddr>, Vec<IpAddr>) {
    let ips = prev.ips_on(ifname);
    let addrs = ips.iter().filter_map(|ip| ip.ip()).collect();
    let mut gateways: Vec<IpAddr> = Vec::new();
    for gw in ips
        .iter()
        .filter_map(|ip| ip.gateway.parse::<IpAddr>().ok())
    {
        if !gateways.contains(&gw) {
            gateways.push(gw);
        }
    }
    (addrs, gateways)
}

/// Makes a meshed pod's redirection real: applies the profile's spec, for **both**
/// address families whatever `prev` lists (a veth always has an IPv6 link-local address,
/// and a primary may not list every address the pod gets), in `netns` with the
/// configured backend, verifies it, and proves every family the pod can route with the
/// probe (see `interlock_redirect::probe`), trying the pod's gateways from `prev` on
/// `ifname` first. Non-meshed decisions need nothing. On failure the engine has already
/// removed its rules.
pub fn protect(
    config: &PluginConfig,
    netns: &str,
    decision: &Decision,
    prev: &CniResult,
    ifname: &str,
) -> Result<Protection, Failure> {
    let Decision::Meshed { profile, spec } = decision else {
        return Ok(Protection::NotNeeded);
    };
    let start = Instant::now();
    let (_, gateways) = pod_addresses(prev, ifname);
    let mut spec = spec.as_ref().clone();
    spec.ipv4 = true;
    spec.ipv6 = true;
    let (kind, backend_reason) = resolve_backend(config.backend, &config.state_dir);
    let done = engine::protect(Path::new(netns), &spec, kind, &gateways)?;
    Ok(Protection::Protected(Box::new(Protected {
        profile: *profile,
        backend: done.backend,
        backend_reason,
        spec: spec.canonical_json(),
        spec_hash: done.spec_hash,
        probe: done.probe.lines(),
        timings: Timings {
            rules_us: micros(done.rules_time),
            probe_us: micros(done.probe_time),
            protect_us: micros(start.elapsed()),
        },
    })))
}

/// Microseconds, saturating.
pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Re-verifies a protected attachment's recorded spec in `netns` (reads rules back; never
/// applies, never probes: the proxy may own its port by now).
pub fn check(protected: &Protected, netns: &str) -> Result<(), Failure> {
    let spec = protected.installed_spec().map_err(|message| {
        Failure::clean("state", interlock_protocol::error::IO_FAILURE, message)
    })?;
    match engine::check(Path::new(netns), &spec, protected.backend)? {
        Verification::Exact => Ok(()),
        Verification::Mismatch(diffs) => Err(Failure::clean(
            "verify",
            crate::ERR_VERIFY,
            format!(
                "redirect rules in {netns} ({}) are not the recorded ones: {}",
                protected.backend,
                diffs.join("; ")
            ),
        )),
    }
}

/// What [`unprotect`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Undone {
    /// Nothing was ever applied (not meshed / skipped), or no netns was given.
    Nothing,
    /// Rules were removed (or were already absent) with this backend; `None`: every backend.
    Removed(Option<BackendKind>),
    /// The netns no longer exists.
    NetnsGone,
}

/// Undoes [`protect`] for an attachment being deleted. `state` is what ADD recorded (or
/// `None` after a lost state file or a second DEL); `netns` may be empty (containerd's
/// later DELs), in which case there is nothing left to clean inside it. Idempotent.
/// Recorded protection → remove with the recorded backend; no state, or a meshed pod left
/// unprotected (its cleanup may have failed) → remove every backend's rules.
pub fn unprotect(
    state: Option<&crate::state::AttachmentState>,
    netns: &str,
) -> Result<Undone, Failure> {
    if netns.is_empty() {
        return Ok(Undone::Nothing);
    }
    let path = Path::new(netns);
    let (result, kind) = match state.map(|s| &s.protection) {
        Some(Protection::NotNeeded) => return Ok(Undone::Nothing),
        Some(Protection::Protected(p)) => (engine::unprotect(path, p.backend), Some(p.backend)),
        Some(Protection::Unprotected { .. }) | None => (engine::unprotect_all(path), None),
    };
    match result? {
        Unprotected::Removed => Ok(Undone::Removed(kind)),
        Unprotected::NetnsGone => Ok(Undone::NetnsGone),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn pod(ns: &str, annotations: Option<&[(&str, &str)]>) -> PodIdentity {
        PodIdentity {
            namespace: ns.into(),
            name: "p".into(),
            uid: "u".into(),
            annotations: annotations.map(|a| {
                a.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>()
            }),
        }
    }

    #[test]
    fn decisions() {
        let mut c = PluginConfig {
            exclude_namespaces: vec!["kube-system".into()],
            ..PluginConfig::default()
        };
        assert_eq!(decide(&c, &PodIdentity::default()).label(), "skip");
        assert_eq!(decide(&c, &pod("kube-system", Some(&[]))).label(), "skip");
        assert_eq!(decide(&c, &pod("shop", None)).label(), "undecided");
        assert_eq!(decide(&c, &pod("shop", Some(&[]))).label(), "not-meshed");
        let istio = [("sidecar.istio.io/status", "{}")];
        let d = decide(&c, &pod("shop", Some(&istio)));
        assert!(
            matches!(
                d,
                Decision::Meshed {
                    profile: ProfileName::Istio,
                    ..
                }
            ),
            "{d:?}"
        );
        // Not meshed: protect needs nothing and touches nothing.
        let prev = CniResult::empty(interlock_protocol::CniVersion::V1_0_0);
        assert_eq!(
            protect(
                &c,
                "/nonexistent",
                &decide(&c, &pod("shop", Some(&[]))),
                &prev,
                "eth0"
            ),
            Ok(Protection::NotNeeded)
        );
        // Meshed with a netns that does not exist: the netns step fails with code 105.
        let f = protect(&c, "/nonexistent/il-netns", &d, &prev, "eth0").unwrap_err();
        assert_eq!((f.step, f.code), ("netns", crate::ERR_NETNS), "{f:?}");
        assert!(f.message.contains("/nonexistent/il-netns"), "{f:?}");
        // Profiles not enabled do not claim the pod.
        c.profiles = vec![ProfileName::Linkerd];
        assert_eq!(decide(&c, &pod("shop", Some(&istio))).label(), "not-meshed");
        let bad = [
            ("linkerd.io/proxy-version", "v1"),
            ("config.linkerd.io/skip-inbound-ports", "http"),
        ];
        assert_eq!(decide(&c, &pod("shop", Some(&bad))).label(), "invalid");
    }

    #[test]
    fn step_codes_and_addresses() {
        assert_eq!(code_for_step("spec"), 101);
        assert_eq!(code_for_step("open"), 102);
        assert_eq!(code_for_step("apply"), 102);
        assert_eq!(code_for_step("verify"), 103);
        assert_eq!(code_for_step("probe"), 104);
        assert_eq!(code_for_step("netns"), 105);
        assert_eq!(code_for_step("remove"), 106);
        assert_eq!(code_for_step("state"), 5);
        let prev = CniResult::from_value(
            serde_json::json!({"cniVersion": "1.0.0",
                "interfaces": [{"name": "cni0"}, {"name": "eth0", "sandbox": "/x"}, {"name": "net1", "sandbox": "/x"}],
                "ips": [
                    {"interface": 1, "address": "10.99.0.2/24", "gateway": "10.99.0.1"},
                    {"interface": 1, "address": "fd99::2/64", "gateway": "fd99::1"},
                    {"interface": 1, "address": "10.99.9.2/24", "gateway": "10.99.0.1"},
                    {"interface": 2, "address": "10.98.0.2/24", "gateway": "10.98.0.1"}
                ]}),
            None,
        )
        .unwrap();
        let (addrs, gws) = pod_addresses(&prev, "eth0");
        assert_eq!(addrs.len(), 3);
        assert_eq!(
            gws,
            [
                "10.99.0.1".parse::<IpAddr>().unwrap(),
                "fd99::1".parse().unwrap()
            ]
        );
        let (addrs, gws) = pod_addresses(&prev, "net1");
        assert_eq!((addrs.len(), gws.len()), (1, 1));
    }

    #[test]
    fn lookup_only_when_annotations_are_missing() {
        let c = PluginConfig {
            exclude_namespaces: vec!["kube-system".into()],
            agent_socket: Some("/nonexistent/il-agent.sock".into()),
            ..PluginConfig::default()
        };
        assert!(!needs_lookup(&c, &pod("shop", Some(&[]))));
        assert!(!needs_lookup(&c, &pod("kube-system", None)));
        assert!(!needs_lookup(&c, &PodIdentity::default()));
        assert!(needs_lookup(&c, &pod("shop", None)));
        let mut p = pod("shop", None);
        let (d, source) = decide_with_lookup(&c, &mut p);
        assert_eq!(source, Source::None);
        let Decision::Undecided { reason } = d else {
            panic!("{d:?}")
        };
        assert!(
            reason.contains("/nonexistent/il-agent.sock")
                && reason.contains("kubeconfig not configured"),
            "{reason}"
        );
    }
}

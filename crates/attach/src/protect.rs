//! Acting on a [`Decision`]: protect an attachment's netns ([`protect`]), re-verify it
//! ([`check`]), and let it go ([`release`]) — through `interlock_redirect::engine`, with
//! the netns as the unit of protection (`interlock_redirect::netns_record`,
//! `interlock_contract::state::NetnsRecord`).
//!
//! [`protect`] takes the netns's lock and either installs, reads back and proves the
//! rules (no other live attachment relies on that netns: on failure the engine removes
//! them again, all or nothing), or — when another live attachment already relies on
//! rules for the same spec — reads them back and shares them (re-applying and re-proving
//! them if they were altered, without ever removing them on failure). It returns a
//! [`Claim`] that keeps the lock until the caller has written the attachment's state, then
//! records the reference ([`Claim::commit`]) or undoes it ([`Claim::abort`]).
//! [`release`] (DEL, GC) drops the attachment's reference and removes the rules only when
//! no other live attachment is left.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use interlock_cni_types::{CniError, CniResult, CniVersion};
use interlock_contract::codes::{code_for_step, Step};
use interlock_contract::state::{NetnsRecord, RULE_SHAPE};
use interlock_redirect::backend::{self, BackendKind};
use interlock_redirect::netns::{pod_netns_id, NetnsError, NetnsId, PodNetns};
use interlock_redirect::netns_record::{NetnsLock, NetnsStore};
use interlock_redirect::probe::ProxyPort;
use interlock_redirect::{
    engine, EngineError, InstallOptions, RedirectSpec, Removal, Verification,
};

use interlock_redirect::decision::Decision;

use crate::outcome::{Protected, Protection, Timings};
use crate::state::{AttachmentKey, AttachmentState, StateStore};
use interlock_contract::config::{BackendChoice, PluginConfig};

/// A failed step for a meshed pod: which, with which CNI error code, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The step that failed.
    pub step: Step,
    /// The CNI error code for it (see the crate docs).
    pub code: u32,
    /// The full explanation.
    pub message: String,
    /// `Some(what)` when interlock's rules are in the netns after the failure: removing
    /// them failed, or they were kept because another attachment relies on them. `None`
    /// when none were left.
    pub leftover_rules: Option<String>,
}

impl Failure {
    /// A failure that left no interlock rules behind (nothing applied, or cleaned up).
    pub fn clean(step: Step, message: impl Into<String>) -> Failure {
        Failure {
            step,
            code: code_for_step(step),
            message: message.into(),
            leftover_rules: None,
        }
    }

    /// The CNI error for this failure about pod `pod` (`namespace/name`), in `version`:
    /// `pod <pod>: step <step> failed: <message>` with the step's code. Every failure
    /// about a pod is reported through here.
    pub fn to_cni_error(&self, version: CniVersion, pod: &str) -> CniError {
        CniError::new(
            version.as_str(),
            self.code,
            format!("pod {pod}: step {} failed: {}", self.step, self.message),
        )
    }

    /// The same failure, its message prefixed with what was being done.
    pub fn context(mut self, doing: &str) -> Failure {
        self.message = format!("{doing}: {}", self.message);
        self
    }

    fn state(message: impl Into<String>) -> Failure {
        Failure::clean(Step::State, message)
    }

    fn kept_for(mut self, others: &[AttachmentKey]) -> Failure {
        self.leftover_rules = Some(kept_note(others));
        self
    }
}

impl From<EngineError> for Failure {
    fn from(e: EngineError) -> Failure {
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

impl From<NetnsError> for Failure {
    fn from(e: NetnsError) -> Failure {
        Failure::from(EngineError::Netns(e))
    }
}

/// Why rules stay after a failure: `others` rely on them.
fn kept_note(others: &[AttachmentKey]) -> String {
    format!(
        "interlock's rules were kept: {} rel{} on them",
        names(others),
        if others.len() == 1 { "ies" } else { "y" }
    )
}

/// `attachment c/eth0`, `attachments c/eth0, c/net1`.
fn names(keys: &[AttachmentKey]) -> String {
    let list: Vec<String> = keys
        .iter()
        .map(|k| format!("{}/{}", k.container_id, k.ifname))
        .collect();
    format!(
        "attachment{} {}",
        if keys.len() == 1 { "" } else { "s" },
        list.join(", ")
    )
}

/// Whether an attachment referenced by `record` is live: its state exists, says
/// protected and records this netns, and the netns path it recorded still names this
/// very netns (and, with `keep` — GC —, it is listed there). The last check matters: the
/// kernel reuses a dead netns's inode for the next one at once, so a pod deleted without
/// a DEL would otherwise seem to share a new pod's netns.
fn is_live<'a>(
    store: &'a StateStore,
    record: &'a NetnsRecord,
    keep: Option<&'a BTreeSet<AttachmentKey>>,
) -> impl Fn(&AttachmentKey) -> bool + 'a {
    move |k| {
        keep.is_none_or(|v| v.contains(k))
            && store.load(k).ok().flatten().is_some_and(|s| {
                s.netns_id.as_deref() == Some(record.netns_id.as_str())
                    && matches!(s.protection, Protection::Protected(_))
                    && pod_netns_id(Path::new(&s.netns))
                        .is_ok_and(|id| id.to_string() == record.netns_id)
            })
    }
}

/// The backend to use for `choice`, and why. `auto` runs the host detection (in the
/// plugin's own netns, which is the host's), or reuses a recent one cached under
/// `state_dir` ([`crate::detected_backend`]).
pub fn resolve_backend(choice: BackendChoice, state_dir: &Path) -> (BackendKind, String) {
    let fixed = |k: BackendKind| (k, format!("configured backend {k}"));
    match choice {
        BackendChoice::Nftables => fixed(BackendKind::Nftables),
        BackendChoice::IptablesNft => fixed(BackendKind::IptablesNft),
        BackendChoice::IptablesLegacy => fixed(BackendKind::IptablesLegacy),
        BackendChoice::Auto => crate::detected_backend::resolve_auto(
            state_dir,
            interlock_contract::time::now_ms(),
            backend::detect,
        ),
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

/// Microseconds, saturating.
pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A protected attachment's hold on its netns: the lock, and the record to write once
/// the attachment's state is on disk.
#[derive(Debug)]
pub struct Claim {
    lock: NetnsLock,
    record: NetnsRecord,
    others: Vec<AttachmentKey>,
    notes: Vec<String>,
}

impl Claim {
    /// The netns this claim is on.
    pub fn netns_id(&self) -> NetnsId {
        self.lock.id()
    }

    /// What else was done, for the log (e.g. a previous backend's rules removed).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Records the attachment's reference; the lock is released.
    pub fn commit(&self) -> std::io::Result<()> {
        self.lock.save(&self.record)
    }

    /// The ADD failed after [`protect`] succeeded (its state could not be written):
    /// removes the rules unless another live attachment relies on them. Returns what is
    /// left in the netns, as [`Failure::leftover_rules`] says it.
    pub fn abort(self) -> Option<String> {
        if !self.others.is_empty() {
            return Some(kept_note(&self.others));
        }
        let left = engine::remove_rules(Path::new(&self.record.netns), self.record.backend)
            .err()
            .map(|e| format!("interlock's rules may remain (removing them failed: {e})"));
        let _ = self.lock.forget();
        left
    }
}

/// Makes a meshed attachment's redirection real, with its netns as the unit of
/// protection (see the module docs). The spec is the profile's, for **both** address
/// families whatever `prev` lists (a veth always has an IPv6 link-local address, and a
/// primary may not list every address the pod gets); the probe proves every family the
/// pod can route (see `interlock_redirect::probe`), trying the pod's gateways from `prev`
/// on `ifname` first. Non-meshed decisions need nothing and touch nothing.
///
/// For CNI ADD: no container of the pod runs yet, so the probe binds the proxy's port
/// ([`ProxyPort::Free`]).
pub fn protect(
    config: &PluginConfig,
    store: &StateStore,
    key: &AttachmentKey,
    netns: &str,
    decision: &Decision,
    prev: &CniResult,
    ifname: &str,
) -> Result<(Protection, Option<Claim>), Failure> {
    protect_pod(
        config,
        store,
        key,
        netns,
        decision,
        (prev, ifname),
        ProxyPort::Free,
    )
}

/// [`protect`] for a pod that is running (the agent's in-place repair): no CNI result
/// (the probe takes the pod's gateways from its routes), and the proxy may own its port
/// already: `proxy_port` says what the probe may assume (the agent passes
/// `ProxyPort::MaybeTaken`).
pub fn protect_running(
    config: &PluginConfig,
    store: &StateStore,
    key: &AttachmentKey,
    netns: &str,
    decision: &Decision,
    proxy_port: ProxyPort,
) -> Result<(Protection, Option<Claim>), Failure> {
    let prev = CniResult::empty(CniVersion::V1_0_0);
    protect_pod(
        config,
        store,
        key,
        netns,
        decision,
        (&prev, &key.ifname),
        proxy_port,
    )
}

fn protect_pod(
    config: &PluginConfig,
    store: &StateStore,
    key: &AttachmentKey,
    netns: &str,
    decision: &Decision,
    (prev, ifname): (&CniResult, &str),
    proxy_port: ProxyPort,
) -> Result<(Protection, Option<Claim>), Failure> {
    let Decision::Meshed { profile, spec } = decision else {
        return Ok((Protection::NotNeeded, None));
    };
    let start = Instant::now();
    // Opened and checked once: its identity keys the lock, and the engine enters it.
    let pod = PodNetns::open(Path::new(netns))?;
    let (lock, record) = lock_netns(config, &pod, netns)?;
    let others = record
        .as_ref()
        .map(|r| r.live_refs(key, is_live(store, r, None)))
        .unwrap_or_default();
    let spec = spec.as_installed();
    let (canonical, spec_hash) = spec.canonical_and_hash();
    let (_, gateways) = pod_addresses(prev, ifname);
    let target = Target {
        pod: &pod,
        netns,
        spec: &spec,
        spec_hash: &spec_hash,
        gateways: &gateways,
        proxy_port,
    };

    let mut notes = Vec::new();
    let rules = match record.as_ref().filter(|_| !others.is_empty()) {
        Some(r) => share_rules(&target, r, &others)?,
        None => {
            let (kind, reason) = resolve_backend(config.backend, &config.state_dir);
            // Nothing recorded for this netns: a new pod's, most likely empty.
            let rules = match install_rules(&target, kind, reason, record.is_none()) {
                Ok(rules) => rules,
                Err(e) => {
                    // No live reference: the record (if any) is stale.
                    let _ = lock.forget();
                    return Err(e);
                }
            };
            notes.extend(retire_previous_backend(
                store,
                key,
                record.as_ref(),
                netns,
                kind,
            ));
            rules
        }
    };
    let new_record = record_reference(record, &others, key, &target, &canonical, &rules);
    let protected = Protected {
        profile: *profile,
        backend: rules.backend,
        backend_reason: rules.backend_reason,
        spec: canonical,
        spec_hash,
        probe: rules.probe,
        timings: Timings {
            protect_us: micros(start.elapsed()),
            ..rules.timings
        },
    };
    Ok((
        Protection::Protected(Box::new(protected)),
        Some(Claim {
            lock,
            record: new_record,
            others,
            notes,
        }),
    ))
}

/// What [`protect_pod`] works on: the pod's netns and the rules it needs there.
struct Target<'a> {
    pod: &'a PodNetns,
    netns: &'a str,
    spec: &'a RedirectSpec,
    spec_hash: &'a str,
    /// Where the probe sends its traffic.
    gateways: &'a [IpAddr],
    proxy_port: ProxyPort,
}

/// The rules in the netns after [`share_rules`] or [`install_rules`].
struct Rules {
    backend: BackendKind,
    backend_reason: String,
    probe: Vec<String>,
    timings: Timings,
}

/// Takes the netns's lock and reads its record (none: no attachment relies on it yet).
fn lock_netns(
    config: &PluginConfig,
    pod: &PodNetns,
    netns: &str,
) -> Result<(NetnsLock, Option<NetnsRecord>), Failure> {
    let lock = NetnsStore::new(&config.state_dir)
        .lock(pod.id())
        .map_err(|e| Failure::state(format!("locking the state of netns {netns}: {e}")))?;
    let record = lock
        .load()
        .map_err(|e| Failure::state(format!("reading the state of netns {netns}: {e}")))?;
    Ok((lock, record))
}

/// Joins the rules that `others` (live, recorded in `r`) rely on: reads them back and, if
/// they were altered since, re-applies and re-proves them without ever removing them.
fn share_rules(
    target: &Target<'_>,
    r: &NetnsRecord,
    others: &[AttachmentKey],
) -> Result<Rules, Failure> {
    let netns = target.netns;
    if r.spec_hash != target.spec_hash {
        return Err(Failure::clean(
            Step::Apply,
            format!(
                "network namespace {netns} already holds interlock's rules for {} with \
                 another spec (installed {}, this attachment's {}): the interlock-cni \
                 entries of the pod's networks disagree (profiles?); make them equal",
                names(others),
                short_hash(&r.spec_hash),
                short_hash(target.spec_hash)
            ),
        )
        .kept_for(others));
    }
    let backend_reason = format!("shared with {} ({})", names(others), r.backend);
    let t = Instant::now();
    match engine::check_in(target.pod, target.spec, r.backend) {
        Ok(Verification::Exact) => Ok(Rules {
            backend: r.backend,
            backend_reason,
            probe: r
                .probe
                .iter()
                .map(|l| {
                    format!(
                        "{l} (proven by the ADD of {}/{})",
                        r.proven_by.container_id, r.proven_by.ifname
                    )
                })
                .collect(),
            timings: Timings {
                rules_us: micros(t.elapsed()),
                probe_us: 0,
                protect_us: 0,
            },
        }),
        // Altered since: re-apply and re-prove, never removing what the others
        // rely on.
        _ => {
            let options = InstallOptions {
                remove_on_failure: false,
                proxy_port: target.proxy_port,
                spec_hash: Some(target.spec_hash.to_string()),
                ..InstallOptions::default()
            };
            let done = engine::install_and_prove_in(
                target.pod,
                target.spec,
                r.backend,
                target.gateways,
                &options,
            )
            .map_err(|e| Failure::from(e).kept_for(others))?;
            Ok(Rules {
                backend: r.backend,
                backend_reason,
                probe: done.probe.lines(),
                timings: timings_of(&done),
            })
        }
    }
}

/// Installs, reads back and proves the rules with `kind` when no other attachment relies
/// on the netns (on failure the engine removes them again).
fn install_rules(
    target: &Target<'_>,
    kind: BackendKind,
    backend_reason: String,
    new_netns: bool,
) -> Result<Rules, Failure> {
    let options = InstallOptions {
        new_netns,
        proxy_port: target.proxy_port,
        spec_hash: Some(target.spec_hash.to_string()),
        ..InstallOptions::default()
    };
    let done =
        engine::install_and_prove_in(target.pod, target.spec, kind, target.gateways, &options)?;
    Ok(Rules {
        backend: kind,
        backend_reason,
        probe: done.probe.lines(),
        timings: timings_of(&done),
    })
}

/// The netns's record with `key`'s reference added: the shared one (kept to `others`,
/// re-proven if the rules were re-applied), or a new one for rules just installed.
fn record_reference(
    record: Option<NetnsRecord>,
    others: &[AttachmentKey],
    key: &AttachmentKey,
    target: &Target<'_>,
    canonical: &str,
    rules: &Rules,
) -> NetnsRecord {
    let mut new_record = match record.filter(|_| !others.is_empty()) {
        Some(mut r) => {
            r.attachments.retain(|k| others.contains(k));
            // Exact as this build renders them, or re-applied: this build's shape now.
            r.shape = RULE_SHAPE;
            if rules.timings.probe_us > 0 {
                r.probe.clone_from(&rules.probe);
                r.proven_by = key.clone();
            }
            r
        }
        None => NetnsRecord {
            netns_id: target.pod.id().to_string(),
            netns: target.netns.to_string(),
            backend: rules.backend,
            spec: canonical.to_string(),
            spec_hash: target.spec_hash.to_string(),
            probe: rules.probe.clone(),
            proven_by: key.clone(),
            attachments: Vec::new(),
            updated_at_ms: 0,
            shape: RULE_SHAPE,
        },
    };
    new_record.add_ref(key);
    new_record.updated_at_ms = interlock_contract::time::now_ms();
    new_record
}

/// The rule and probe times of an engine run (the whole ADD's is filled in later).
fn timings_of(done: &engine::Installed) -> Timings {
    Timings {
        rules_us: micros(done.rules_time),
        probe_us: micros(done.probe_time),
        protect_us: 0,
    }
}

fn short_hash(h: &str) -> &str {
    &h[..12.min(h.len())]
}

/// A repeated ADD of an attachment whose earlier protection used another backend (the
/// configured or detected backend changed in between) would leave that backend's rules
/// beside the new ones, recorded nowhere: remove them. Only called when no other
/// attachment relies on the netns.
fn retire_previous_backend(
    store: &StateStore,
    key: &AttachmentKey,
    record: Option<&NetnsRecord>,
    netns: &str,
    now: BackendKind,
) -> Option<String> {
    let from_state = || match store.load(key) {
        Ok(Some(AttachmentState {
            protection: Protection::Protected(p),
            netns: n,
            ..
        })) if n == netns => Some(p.backend),
        _ => None,
    };
    let before = record.map(|r| r.backend).or_else(from_state)?;
    if before == now {
        return None;
    }
    // A failure leaves rules that the next DEL (every backend without state) removes.
    Some(match engine::remove_rules(Path::new(netns), before) {
        Ok(_) => format!("removed the {before} rules of this attachment's previous ADD"),
        Err(e) => format!(
            "the {before} rules of this attachment's previous ADD may remain (removing them failed: {e})"
        ),
    })
}

/// Re-verifies a protected attachment's recorded spec in `netns` (reads rules back; never
/// applies, never probes: the proxy may own its port by now).
pub fn check(protected: &Protected, netns: &str) -> Result<(), Failure> {
    let spec = protected.installed_spec().map_err(Failure::state)?;
    match engine::check(Path::new(netns), &spec, protected.backend)? {
        Verification::Exact => Ok(()),
        Verification::Mismatch(diffs) => Err(Failure::clean(
            Step::Verify,
            format!(
                "redirect rules in {netns} ({}) are not the recorded ones: {}",
                protected.backend,
                diffs.join("; ")
            ),
        )),
    }
}

/// What [`release`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Undone {
    /// Nothing was ever applied (not meshed / skipped), or no netns was given.
    Nothing,
    /// Rules were removed (or were already absent) with this backend; `None`: every backend.
    Removed(Option<BackendKind>),
    /// The rules stay: these other live attachments rely on them.
    Kept(Vec<AttachmentKey>),
    /// The netns no longer exists.
    NetnsGone,
}

impl std::fmt::Display for Undone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Undone::Nothing => f.write_str("no rules to remove"),
            Undone::Removed(Some(kind)) => write!(f, "rules removed ({kind})"),
            Undone::Removed(None) => f.write_str("rules of every backend removed"),
            Undone::Kept(others) => write!(
                f,
                "rules kept: {} still rel{} on them",
                names(others),
                if others.len() == 1 { "ies" } else { "y" }
            ),
            Undone::NetnsGone => f.write_str("netns already gone"),
        }
    }
}

/// Undoes [`protect`] for an attachment being deleted (DEL) or collected (GC): drops its
/// reference on its netns, and removes interlock's rules there only when no other live
/// attachment relies on them. `state` is what ADD recorded (or `None` after a lost state
/// file or a second DEL); `netns` may be empty (containerd's later DELs) — then only the
/// reference is dropped. With `keep` (GC), only attachments in it count as live.
/// Recorded protection → remove with the recorded backend; no state, or a meshed pod left
/// unprotected → every backend's rules. Idempotent.
pub fn release(
    state_dir: &Path,
    store: &StateStore,
    key: &AttachmentKey,
    state: Option<&AttachmentState>,
    netns: &str,
    keep: Option<&BTreeSet<AttachmentKey>>,
) -> Result<Undone, Failure> {
    let kind = match state.map(|s| &s.protection) {
        Some(Protection::NotNeeded) => return Ok(Undone::Nothing),
        Some(Protection::Protected(p)) => Some(p.backend),
        Some(Protection::Unprotected { .. }) | None => None,
    };
    let path = Path::new(netns);
    // Which netns: the one the state recorded, else the one CNI_NETNS names now.
    let recorded = state
        .and_then(|s| s.netns_id.as_deref())
        .and_then(|s| s.parse::<NetnsId>().ok());
    let id = match recorded {
        Some(id) => Some(id),
        None if netns.is_empty() => None,
        None => match pod_netns_id(path) {
            Ok(id) => Some(id),
            Err(e) if e.is_gone() => return Ok(Undone::NetnsGone),
            Err(e) => return Err(Failure::from(e)),
        },
    };
    let netns_store = NetnsStore::new(state_dir);
    let lock = match id.map(|id| netns_store.lock(id)) {
        Some(Ok(lock)) => Some(lock),
        // No state, and no netns records can exist (their directory cannot even be
        // made, e.g. an unwritable state dir): nothing recorded relies on this netns, and
        // the DEL of a pod that needed nothing must not fail on interlock's bookkeeping.
        Some(Err(_)) if state.is_none() && !netns_store.dir().exists() => None,
        Some(Err(e)) => {
            return Err(Failure::state(format!(
                "locking the state of netns {netns}: {e}"
            )))
        }
        None => None,
    };
    if let Some(lock) = &lock {
        let record = lock
            .load()
            .map_err(|e| Failure::state(format!("reading the state of netns {netns}: {e}")))?;
        if let Some(mut r) = record {
            let others = r.live_refs(key, is_live(store, &r, keep));
            if !others.is_empty() {
                r.attachments.retain(|k| others.contains(k));
                r.updated_at_ms = interlock_contract::time::now_ms();
                lock.save(&r).map_err(|e| {
                    Failure::state(format!("writing the state of netns {netns}: {e}"))
                })?;
                return Ok(Undone::Kept(others));
            }
        }
    }
    if netns.is_empty() {
        if let Some(lock) = lock {
            let _ = lock.forget();
        }
        return Ok(Undone::Nothing);
    }
    let result = match kind {
        Some(kind) => engine::remove_rules(path, kind),
        None => engine::remove_all_rules(path),
    };
    let undone = match result? {
        Removal::Removed => Undone::Removed(kind),
        Removal::NetnsGone => Undone::NetnsGone,
    };
    if let Some(lock) = lock {
        let _ = lock.forget();
    }
    Ok(undone)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_of_an_interface() {
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
    fn not_meshed_touches_nothing_and_a_missing_netns_is_step_netns() {
        let t = tempfile::tempdir().unwrap();
        let c = PluginConfig {
            state_dir: t.path().to_path_buf(),
            ..PluginConfig::default()
        };
        let store = StateStore::new(t.path());
        let key = AttachmentKey {
            container_id: "c".into(),
            ifname: "eth0".into(),
        };
        let prev = CniResult::empty(interlock_cni_types::CniVersion::V1_0_0);
        let not = Decision::NotMeshed {
            reason: "test".into(),
        };
        let (p, claim) = protect(&c, &store, &key, "/nonexistent", &not, &prev, "eth0").unwrap();
        assert_eq!(p, Protection::NotNeeded);
        assert!(claim.is_none());
        let ann = [("interlock.dev/redirect".to_string(), "enabled".to_string())].into();
        let (profile, spec) = interlock_redirect::spec_for(
            &interlock_redirect::PodView::annotations_only(&ann),
            &c.profiles,
        )
        .unwrap()
        .unwrap();
        let meshed = Decision::Meshed {
            profile,
            spec: Box::new(spec),
        };
        let f = protect(
            &c,
            &store,
            &key,
            "/nonexistent/il-netns",
            &meshed,
            &prev,
            "eth0",
        )
        .unwrap_err();
        assert_eq!((f.step, f.code), (Step::Netns, 105), "{f:?}");
        assert!(f.message.contains("/nonexistent/il-netns"), "{f:?}");
        assert!(!t.path().join("netns").exists(), "nothing recorded");
    }
}

//! Audit and repair, the agent's loop that finds running pods left unprotected and acts
//! on them. [`decide`] decides (pure); [`socket`] is the agent socket, which answers the
//! plugin's pod lookups and passes its ADD notes on, so that a sandbox is audited at once.
//!
//! This file is the sandbox audit, the thin layer that acts: list the node's ready
//! sandboxes over CRI, read each meshed one's rules back inside its netns, and apply the
//! repair policy to every unprotected one.
//!
//! Everything is keyed by sandbox ID and netns identity (dev+inode), never by pod UID (a
//! replaced sandbox keeps its pod's UID). Statuses are fetched concurrently; netns work
//! runs on blocking threads (`PodNetns::run` enters the netns on a dedicated thread), never
//! across an `.await`. A sandbox that is gone, or whose netns is closed or gone, is skipped
//! quietly. Audits run one at a time ([`run`]): at start, on the interval, and
//! [`NOTE_RETRY`] after the plugin reports a sandbox over the agent socket.
//!
//! The in-place repair is the plugin's own ADD path
//! (`interlock_attach::protect::protect_running`: the netns lock, the same spec for both
//! families, apply, read back, probe — through the proxy's own listener when the pod's
//! proxy already owns its port, see `interlock_redirect::probe`) and writes
//! the plugin's own attachment state (`interlock_attach::state::AttachmentState`, key
//! `(sandbox ID, eth0)`) and netns record, so the plugin's CHECK, DEL and GC treat a
//! repaired netns exactly like one its ADD protected: the runtime's DEL of the sandbox
//! removes the rules and the records. Then it ends the connections opened before the
//! rules (`SOCK_DESTROY` inside the netns); a refusal or survivors escalate to a restart.
//!
//! In guard mode ([`guarded`]) the mesh's own plugin wrote the rules: a meshed sandbox is
//! judged by a connection alone, never by reading rules back, and is not repaired in
//! place (restarted by default).
//!
//! When that sandbox is later deleted through a chain that still lacks interlock, no DEL
//! of interlock's removes that state: every full pass therefore removes the state and
//! netns references of sandboxes the runtime no longer lists and whose netns is gone
//! (`interlock_attach::collect`), never of one it still lists.

pub mod decide;
pub mod guarded;
pub mod socket;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use interlock_attach::outcome::Protection;
use interlock_attach::pod::PodIdentity;
use interlock_attach::pod::Source;
use interlock_attach::state::{AttachmentKey, AttachmentState, StateStore};
use interlock_cni_types::CniVersion;
use interlock_contract::config::PluginConfig;
use interlock_contract::names::LABEL_UNPROTECTED;
use interlock_contract::state::NetnsRecord;
use interlock_cri::{CriClient, CriError, SandboxFilter, SandboxState, SandboxStatus};
use interlock_redirect::backend::BackendKind;
use interlock_redirect::decision::Decision;
use interlock_redirect::netns::{NetnsId, PodNetns};
use interlock_redirect::probe::ProxyPort;
use interlock_redirect::{engine, sockdiag, RedirectSpec, Verification};
use tokio::sync::mpsc;
use tracing::{error, info, warn};

use crate::health::metrics::AuditMetrics;
use crate::kubernetes::actions::Evicted;
use crate::kubernetes::pods::{PodKey, MIRROR_POD_ANNOTATION};
use crate::kubernetes::Cluster;
use decide::{RecordView, RepairAction, RepairHistory, RepairPolicy, RulesSeen, Verdict};

/// The interface name of the attachment an in-place repair records (the runtime's
/// `CNI_IFNAME` of a pod's primary network: its DEL then finds the state).
pub const REPAIR_IFNAME: &str = "eth0";
/// The network name recorded in the state of an in-place repair.
pub const REPAIR_NETWORK: &str = "interlock-audit";
/// Sandboxes whose status is fetched and whose netns is read at once.
pub const CONCURRENCY: usize = 32;
/// How long an action through the Kubernetes API waits for the pod cache's first sync
/// before it is left to a later pass.
pub const SYNC_PATIENCE: Duration = Duration::from_secs(2);

/// How long an action taken before the pod cache's first sync keeps its Event waiting
/// for the sync ([`ApiWork::after_sync`]).
pub const DEFERRED_EVENT_PATIENCE: Duration = Duration::from_secs(120);
/// How long an eviction may be blocked by a PodDisruptionBudget before it is reported.
pub const EVICT_BUDGET: Duration = Duration::from_secs(30);

/// containerd's CRI socket, the default of `--cri-endpoint`.
pub const DEFAULT_CRI_ENDPOINT: &str = interlock_cri::DEFAULT_ENDPOINT;

/// What the audit is told on the command line.
#[derive(Debug, Clone)]
pub struct AuditSettings {
    /// The CRI endpoint (`--cri-endpoint`).
    pub cri_endpoint: String,
    /// The period of the full audit (`--audit-interval`).
    pub interval: Duration,
    /// What to do with an unprotected sandbox (`--repair-policy`).
    pub policy: RepairPolicy,
}

impl Default for AuditSettings {
    fn default() -> AuditSettings {
        AuditSettings {
            cri_endpoint: interlock_cri::DEFAULT_ENDPOINT.to_string(),
            interval: Duration::from_secs(10),
            policy: RepairPolicy::Repair,
        }
    }
}

/// What was done about one unprotected sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionReport {
    /// The policy acted on (after fallbacks and escalation).
    pub policy: RepairPolicy,
    /// Why it is not the configured policy, when it is not.
    pub because: Option<String>,
    /// What happened (`Ok`: done, with details; `Err`: why it failed).
    pub result: Result<String, String>,
    /// How long it took.
    pub duration: Duration,
}

/// The audit of one sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxReport {
    /// The sandbox ID.
    pub sandbox: String,
    /// `namespace/name` of its pod.
    pub pod: String,
    /// Its netns identity (`<dev>-<ino>`), when it was read.
    pub netns_id: Option<String>,
    /// The verdict before any action.
    pub verdict: Verdict,
    /// What was done about it (unprotected sandboxes only).
    pub actions: Vec<ActionReport>,
}

/// The audit: a CRI client, the plugin's configuration (profiles, excluded namespaces,
/// state dir, backend) and what it remembers between passes.
pub struct Auditor {
    cri: CriClient,
    plugin: PluginConfig,
    backend: BackendKind,
    policy: RepairPolicy,
    cluster: Option<Cluster>,
    api: Option<ApiWork>,
    metrics: AuditMetrics,
    history: Mutex<RepairHistory>,
    older: Arc<OlderProofs>,
    guard: Option<guarded::GuardAudit>,
    /// Sandboxes whose uncaptured routed family was reported (once each).
    uncovered: Mutex<BTreeSet<String>>,
    /// The verbose status of every ready sandbox read so far, without its raw info map.
    /// What the audit reads from it (the pod, its netns, its annotations, host network)
    /// never changes for a sandbox ID, and asking the runtime for it is most of a pass's
    /// cost, so only new sandboxes are asked; one that stops leaves the list's ready set.
    known: Mutex<HashMap<String, Arc<SandboxStatus>>>,
}

/// What reading one netns showed ([`inspect`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inspection {
    /// The netns is gone (the sandbox is being torn down): skip quietly.
    Gone,
    /// Read.
    Seen {
        /// Its identity (`0-0` when it could not even be opened).
        netns_id: NetnsId,
        /// The read-back, cross-checked with the plugin's record.
        rules: RulesSeen,
    },
}

impl Auditor {
    /// An audit through `cri` of the pods `plugin` (the entry the agent writes) meshes.
    /// The backend to read rules with when the plugin recorded none for a netns is the
    /// one the plugin's `auto` would pick (the node's detected one) or the configured one.
    pub fn new(
        cri: CriClient,
        plugin: PluginConfig,
        policy: RepairPolicy,
        cluster: Option<Cluster>,
        metrics: AuditMetrics,
    ) -> Auditor {
        let (backend, why) =
            interlock_attach::protect::resolve_backend(plugin.backend, &plugin.state_dir);
        info!(%backend, reason = %why, "audit: backend for netns the plugin has not recorded");
        let guard = guarded::GuardAudit::of(&plugin);
        let policy = match (&guard, policy) {
            (Some(g), RepairPolicy::Repair) => {
                info!(
                    mesh = %g.mesh,
                    "audit: guard mode judges sandboxes by a connection only and does not repair \
                     the mesh's rules in place; unprotected sandboxes are restarted"
                );
                RepairPolicy::Restart
            }
            (_, p) => p,
        };
        Auditor {
            cri,
            plugin,
            backend,
            policy,
            guard,
            uncovered: Mutex::default(),
            known: Mutex::default(),
            api: cluster.clone().map(|c| ApiWork::new(c, metrics.clone())),
            cluster,
            metrics,
            history: Mutex::new(RepairHistory::default()),
            older: Arc::default(),
        }
    }

    /// The policy the loop guard counts escalation stages from: the configured one, or
    /// its fallback without a Kubernetes API.
    fn base_policy(&self) -> RepairPolicy {
        decide::choose(
            self.policy,
            self.cluster.is_some(),
            decide::LoopView::default(),
        )
        .policy
    }

    /// Audits every ready sandbox (or only those in `only`) and acts on the unprotected
    /// ones, with one `ListPodSandbox`. Fails only when the sandboxes cannot be listed.
    pub async fn audit(
        &self,
        only: Option<&BTreeSet<String>>,
    ) -> Result<Vec<SandboxReport>, CriError> {
        let start = Instant::now();
        // Every sandbox, ready or not: the ones not listed at all are gone (see
        // `collect_gone`).
        self.metrics.lists.inc();
        let listed = match self.cri.list_sandboxes(&SandboxFilter::default()).await {
            Ok(l) => {
                self.metrics.cri_up.set(1);
                l
            }
            Err(e) => {
                self.metrics.errors.inc();
                self.metrics.cri_up.set(0);
                return Err(e);
            }
        };
        let all: BTreeSet<String> = listed.iter().map(|s| s.id.clone()).collect();
        let ids: Vec<String> = listed
            .into_iter()
            .filter(|s| s.state == SandboxState::Ready)
            .map(|s| s.id)
            .filter(|id| only.is_none_or(|o| o.contains(id)))
            .collect();
        let reports: Vec<SandboxReport> = futures::stream::iter(ids.iter().cloned())
            .map(|id| self.audit_one(id))
            .buffer_unordered(CONCURRENCY)
            .filter_map(|r| async move { r })
            .collect()
            .await;
        if only.is_none() {
            let mut counts: BTreeMap<&'static str, i64> = BTreeMap::new();
            for r in &reports {
                *counts.entry(r.verdict.label()).or_default() += 1;
            }
            self.metrics.set_verdicts(&counts);
            lock(&self.history).forget_old(Instant::now());
            lock(&self.uncovered).retain(|id| all.contains(id));
            let ready: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
            lock(&self.known).retain(|id, _| ready.contains(id.as_str()));
            self.collect_gone(all).await;
            self.metrics.duration.observe(start.elapsed().as_secs_f64());
            info!(
                sandboxes = reports.len(),
                protected = counts.get("protected").copied().unwrap_or(0),
                unprotected = counts.get("unprotected").copied().unwrap_or(0),
                not_meshed = counts.get("not_meshed").copied().unwrap_or(0),
                unknown = counts.get("unknown").copied().unwrap_or(0),
                duration_ms = start.elapsed().as_secs_f64() * 1e3,
                "audit done"
            );
        }
        Ok(reports)
    }

    /// The sandbox's verbose status: the one kept from an earlier pass, or the runtime's.
    async fn status_of(&self, id: &str) -> Result<Arc<SandboxStatus>, CriError> {
        if let Some(s) = lock(&self.known).get(id) {
            return Ok(s.clone());
        }
        self.metrics.status_reads.inc();
        let mut status = self.cri.sandbox_status(id, true).await?;
        status.info = BTreeMap::new();
        let status = Arc::new(status);
        if status.state == SandboxState::Ready && status.verbose.netns_closed != Some(true) {
            lock(&self.known).insert(id.to_string(), status.clone());
        }
        Ok(status)
    }

    async fn audit_one(&self, id: String) -> Option<SandboxReport> {
        let status = match self.status_of(&id).await {
            Ok(s) => s,
            Err(e) if e.is_not_found() => return None,
            Err(e) => {
                self.metrics.errors.inc();
                warn!(sandbox = %id, error = %e, "audit: cannot read the sandbox's status");
                return Some(SandboxReport {
                    sandbox: id,
                    pod: String::new(),
                    netns_id: None,
                    verdict: Verdict::Unknown {
                        reason: e.to_string(),
                    },
                    actions: vec![],
                });
            }
        };
        if status.state != SandboxState::Ready || status.verbose.netns_closed == Some(true) {
            return None;
        }
        let meta = &status.metadata;
        let pod = format!("{}/{}", meta.namespace, meta.name);
        let current = self.cluster.as_ref().and_then(|c| {
            c.pods
                .annotations(&meta.namespace, &meta.name, Some(&meta.uid))
        });
        let (annotations, facts) = match current {
            Some((a, f)) => (a, Some(f)),
            None => (status.annotations.clone(), None),
        };
        if let Some(g) = &self.guard {
            let report = self
                .audit_guarded(g, &id, &status, &annotations, facts.as_ref())
                .await?;
            return Some(self.conclude(&status, None, report).await);
        }
        // Without the pod's spec (no Kubernetes API), a profile that reads it is judged
        // by the spec the plugin recorded when it installed the rules.
        let decision = interlock_redirect::decision::decide_sandbox(
            &self.plugin,
            &meta.namespace,
            &meta.name,
            status.host_network,
            &annotations,
            facts.as_ref(),
        )
        .or_recorded(|| recorded_spec(&self.plugin.state_dir, status.netns_path()?));
        let (verdict, netns_id) = match (&decision, status.netns_path()) {
            (Decision::Meshed { spec, .. }, Some(path)) => {
                let spec = spec.as_installed();
                let (path, state_dir, backend, sandbox, older) = (
                    path.to_path_buf(),
                    self.plugin.state_dir.clone(),
                    self.backend,
                    id.clone(),
                    self.older.clone(),
                );
                let seen = tokio::task::spawn_blocking(move || {
                    inspect_with(&path, &spec, &state_dir, backend, &sandbox, Some(&older))
                })
                .await;
                match seen {
                    Ok(Inspection::Gone) => return None,
                    Ok(Inspection::Seen { netns_id, rules }) => {
                        if matches!(rules, RulesSeen::Error(_)) {
                            self.metrics.errors.inc();
                        }
                        (
                            decide::judge(&decision, Some(&rules)),
                            Some(netns_id.to_string()),
                        )
                    }
                    Err(e) => {
                        self.metrics.errors.inc();
                        (
                            decide::judge(&decision, Some(&RulesSeen::Error(e.to_string()))),
                            None,
                        )
                    }
                }
            }
            _ => (decide::judge(&decision, None), None),
        };
        let report = SandboxReport {
            sandbox: id,
            pod,
            netns_id,
            verdict,
            actions: vec![],
        };
        Some(self.conclude(&status, Some(&decision), report).await)
    }

    /// Logs the verdict and acts on an unprotected sandbox (`decision`: the redirecting
    /// role's, for an in-place repair; `None` in guard mode).
    async fn conclude(
        &self,
        status: &SandboxStatus,
        decision: Option<&Decision>,
        mut report: SandboxReport,
    ) -> SandboxReport {
        match &report.verdict {
            Verdict::Unprotected { reason } => {
                warn!(
                    pod = %report.pod,
                    sandbox = %report.sandbox,
                    netns_id = report.netns_id.as_deref().unwrap_or(""),
                    reason = %reason,
                    "UNPROTECTED meshed sandbox"
                );
                report.actions = self.act(status, decision, reason).await;
            }
            Verdict::Unknown { reason } if guarded::is_waiting(&report.verdict) => {
                tracing::debug!(pod = %report.pod, sandbox = %report.sandbox, reason = %reason, "audit: not probed yet")
            }
            Verdict::Unknown { reason } => {
                warn!(pod = %report.pod, sandbox = %report.sandbox, reason = %reason, "audit: cannot decide")
            }
            Verdict::Protected => self.mark_repaired(status),
            Verdict::NotMeshed { .. } => {}
        }
        report
    }

    /// Guard mode: whether the guarded mesh's plugin would redirect the sandbox's pod,
    /// and if so whether a connection proves its traffic captured (see [`guarded`]).
    /// `None`: the sandbox is gone.
    async fn audit_guarded(
        &self,
        g: &guarded::GuardAudit,
        id: &str,
        status: &SandboxStatus,
        annotations: &BTreeMap<String, String>,
        facts: Option<&interlock_contract::pod::PodFacts>,
    ) -> Option<SandboxReport> {
        let meta = &status.metadata;
        let pod = format!("{}/{}", meta.namespace, meta.name);
        let netns_id = status
            .netns_path()
            .and_then(|p| interlock_redirect::netns::PodNetns::open(p).ok())
            .map(|p| p.id().to_string());
        let judged = {
            let (g, s, a, f) = (
                g.clone(),
                status.clone(),
                annotations.clone(),
                facts.cloned(),
            );
            tokio::task::spawn_blocking(move || guarded::judge_sandbox(&g, &s, &a, f.as_ref()))
                .await
        };
        let (verdict, netns_id) = match judged {
            Ok(None) => return None,
            Ok(Some(j)) => {
                if let Some(why) = &j.uncovered {
                    self.report_uncovered(status, &pod, why);
                }
                if let Some(lines) = &j.proof {
                    tracing::debug!(pod = %pod, sandbox = %id, listening = j.listening, proof = %lines.join("; "), "audit: capture proven by a connection");
                }
                // Only a sandbox judged in its netns names it.
                (j.verdict, netns_id.filter(|_| j.in_netns))
            }
            Err(e) => {
                self.metrics.errors.inc();
                let verdict = Verdict::Unknown {
                    reason: format!("the judging thread failed: {e}"),
                };
                (verdict, netns_id)
            }
        };
        Some(SandboxReport {
            sandbox: id.to_string(),
            pod,
            netns_id,
            verdict,
            actions: vec![],
        })
    }

    /// A routed family the guarded mesh leaves uncaptured: a warning once per sandbox,
    /// and an Event on its pod when the API knows it. Not a verdict (see [`guarded`]).
    fn report_uncovered(&self, status: &SandboxStatus, pod: &str, why: &str) {
        if !lock(&self.uncovered).insert(status.id.clone()) {
            return;
        }
        warn!(pod = %pod, sandbox = %status.id, "audit: {why}");
        let meta = &status.metadata;
        if let (Some(c), Some(w)) = (&self.cluster, &self.api) {
            if c.pods.pod(&meta.namespace, &meta.name, &meta.uid).is_some() {
                let key = PodKey {
                    namespace: meta.namespace.clone(),
                    name: meta.name.clone(),
                    uid: meta.uid.clone(),
                };
                w.publish(
                    &key,
                    true,
                    guarded::EVENT_FAMILY_UNCOVERED,
                    why.to_string(),
                    false,
                );
            }
        }
    }

    /// Applies the policy (with the loop guard) to an unprotected sandbox. Nothing here
    /// waits on the Kubernetes API: an in-place repair or a restart is done and reported
    /// at once, and the label, the Events, a delete or an eviction run as background
    /// tasks, each call bounded by `kubernetes::API_DEADLINE` (redteam-3 M-1).
    async fn act(
        &self,
        status: &SandboxStatus,
        decision: Option<&Decision>,
        reason: &str,
    ) -> Vec<ActionReport> {
        let now = Instant::now();
        let pod_key = PodKey {
            namespace: status.metadata.namespace.clone(),
            name: status.metadata.name.clone(),
            uid: status.metadata.uid.clone(),
        };
        let seen = lock(&self.history).view(&pod_key, self.base_policy(), now);
        let mut action = decide::choose(self.policy, self.cluster.is_some(), seen);
        if let Some(c) = &self.cluster {
            // The pod watch is usually seconds from its first sync at start-up: an API
            // policy waits for it a little rather than a whole audit period.
            let deadline = Instant::now() + SYNC_PATIENCE;
            while decide::wait_for_api(action.policy, decide::PodSeen::NotSynced).is_some()
                && !c.pods.is_synced()
                && Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        // Only the pod with the sandbox's UID: a pod created again under that name is
        // another pod, and nothing is done to it.
        let cached = self
            .cluster
            .as_ref()
            .and_then(|c| c.pods.pod(&pod_key.namespace, &pod_key.name, &pod_key.uid));
        let seen = match &self.cluster {
            None => decide::PodSeen::NoApi,
            Some(c) if !c.pods.is_synced() => decide::PodSeen::NotSynced,
            Some(_) => match &cached {
                None => decide::PodSeen::Gone,
                Some(p) if p.metadata.deletion_timestamp.is_some() => decide::PodSeen::Terminating,
                Some(_) => decide::PodSeen::Known,
            },
        };
        if let Some(why) = decide::wait_for_api(action.policy, seen) {
            info!(
                pod = %pod_key,
                sandbox = %status.id,
                policy = %action.policy,
                "audit: not acting on this pass: {why}"
            );
            return Vec::new();
        }
        if seen == decide::PodSeen::Gone {
            action = decide::for_gone_pod(action, &pod_key.uid);
        }
        if cached.as_ref().is_some_and(|p| {
            p.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(MIRROR_POD_ANNOTATION))
        }) {
            action = decide::for_mirror_pod(action);
        }
        if self.api.as_ref().is_some_and(|w| w.busy_with(&pod_key.uid)) {
            info!(pod = %pod_key, sandbox = %status.id, "audit: not acting on this pass: an API action on this pod is still running");
            return Vec::new();
        }
        // Only a pod the API has (with this UID) gets a label and Events.
        let api_pod = self.api.as_ref().filter(|_| cached.is_some());
        // Before the first sync nobody can tell whether the API has the pod. An action
        // that does not wait for it (a repair, a restart: the agent's first pass after an
        // outage) gets its Event once the cache has synced, if it holds the pod.
        let after_sync = self
            .api
            .as_ref()
            .filter(|_| seen == decide::PodSeen::NotSynced);
        let mut done = Vec::new();
        loop {
            let start = Instant::now();
            let pod_api = match (api_pod, after_sync) {
                (Some(w), _) => PodApi::Known(w),
                (None, Some(w)) => PodApi::AfterSync(w),
                (None, None) => PodApi::Unknown,
            };
            let result = self
                .perform(&action, status, &pod_key, pod_api, decision, reason)
                .await;
            let report = ActionReport {
                policy: action.policy,
                because: action.because.clone(),
                result: result.clone().map(Performed::text).map_err(|e| e.message),
                duration: start.elapsed(),
            };
            let escalate = match &result {
                Err(e) if e.escalate => Some(decide::after_failed_repair(&e.message)),
                _ => None,
            };
            if !matches!(&result, Ok(Performed::Dispatched(_))) {
                let outcome = match (&result, &escalate) {
                    (Ok(_), _) => "done",
                    (Err(_), Some(_)) => "escalated",
                    (Err(_), None) => "failed",
                };
                self.metrics.repaired(action.policy.as_str(), outcome);
                log_action(&pod_key, &status.id, &action, &report, &self.metrics);
                let event = decide::event_for(action.policy, result.is_ok(), escalate.is_some());
                if let (Some((reason_name, warning)), Some(w)) = (event, api_pod.or(after_sync)) {
                    let note = match &report.result {
                        Ok(what) => format!("{reason}: {what}"),
                        Err(why) => format!("{reason}: {} failed: {why}", action.policy),
                    };
                    let label = reason_name == "RepairFailed";
                    if api_pod.is_some() {
                        w.publish(&pod_key, warning, reason_name, note, label);
                    } else {
                        w.after_sync(&pod_key, move |w, pod| {
                            w.publish(pod, warning, reason_name, note, label)
                        });
                    }
                }
            }
            done.push(report);
            match escalate {
                Some(next) => action = next,
                None => break,
            }
        }
        // The harshest action taken counts for the loop guard (a failed repair that
        // became a restart is a restart).
        lock(&self.history).record(&pod_key, action.policy, now);
        done
    }

    async fn perform(
        &self,
        action: &RepairAction,
        status: &SandboxStatus,
        pod: &PodKey,
        pod_api: PodApi<'_>,
        decision: Option<&Decision>,
        reason: &str,
    ) -> Result<Performed, ActionError> {
        let api_pod = match pod_api {
            PodApi::Known(w) => Some(w),
            PodApi::AfterSync(_) | PodApi::Unknown => None,
        };
        match action.policy {
            RepairPolicy::Repair => {
                let Some(decision) = decision else {
                    return Err(ActionError::escalate(
                        "guard mode does not repair the mesh's rules in place",
                    ));
                };
                let Some(netns) = status.netns_path().map(Path::to_path_buf) else {
                    return Err(ActionError::escalate("the sandbox's netns path is unknown"));
                };
                let (plugin, id, meta, decision2) = (
                    self.plugin.clone(),
                    status.id.clone(),
                    status.metadata.clone(),
                    decision.clone(),
                );
                let done = tokio::task::spawn_blocking(move || {
                    repair_in_place(&plugin, &id, &meta, &decision2, &netns)
                })
                .await
                .map_err(|e| ActionError::escalate(format!("the repair thread failed: {e}")))??;
                self.metrics.connections_ended.inc_by(done.ended as u64);
                match pod_api {
                    PodApi::Known(w) => w.repaired(pod, None, Some(done.summary.clone())),
                    PodApi::AfterSync(w) => {
                        let how = done.summary.clone();
                        w.after_sync(pod, move |w, pod| w.repaired(pod, None, Some(how)));
                    }
                    PodApi::Unknown => {}
                }
                Ok(Performed::Done(done.summary))
            }
            RepairPolicy::Restart => {
                self.cri
                    .stop_sandbox(&status.id)
                    .await
                    .map_err(|e| ActionError::fail(e.to_string()))?;
                Ok(Performed::Done("sandbox stopped over CRI; the kubelet creates a new one through the current CNI config \
                    (a finished pod with restartPolicy Never is not recreated)"
                    .into()))
            }
            RepairPolicy::Delete | RepairPolicy::Evict => {
                let w = api_pod.ok_or_else(|| ActionError::fail("no Kubernetes API"))?;
                if !w.remove(pod, action.clone(), status.id.clone(), reason.to_string()) {
                    return Err(ActionError::fail(
                        "too many Kubernetes API actions are running; the next pass tries again",
                    ));
                }
                Ok(Performed::Dispatched(format!(
                    "{} requested (UID precondition); its outcome is logged when the API answers",
                    action.policy
                )))
            }
            RepairPolicy::Report => match api_pod {
                Some(w) => {
                    w.report(pod, reason.to_string());
                    Ok(Performed::Done(format!(
                        "reported: {LABEL_UNPROTECTED}=true and an Unprotected Event (sent in the background)"
                    )))
                }
                None => Ok(Performed::Done("reported (log and metrics only)".into())),
            },
        }
    }

    /// Removes the attachment state and netns references of sandboxes the runtime no
    /// longer lists (`listed`: every sandbox it does) and whose netns is gone: an
    /// in-place repair wrote them, and the sandbox's DEL ran through a chain without
    /// interlock (`interlock_attach::collect`).
    ///
    /// Then removes the netns lock files a holder that died left without a record (an
    /// agent stopped mid-repair; `NetnsStore::sweep_orphan_locks`: never one a live
    /// process holds) and the temp files of writers killed mid-write.
    async fn collect_gone(&self, listed: BTreeSet<String>) {
        let state_dir = self.plugin.state_dir.clone();
        let (done, mut failed, swept) = match tokio::task::spawn_blocking(move || {
            let (done, failed) = interlock_attach::collect::collect_dead(&state_dir, &listed);
            let netns = interlock_redirect::netns_record::NetnsStore::new(&state_dir);
            let swept = netns.sweep_orphan_locks();
            // Temp files of atomic writes whose writer was killed (a plugin or agent
            // killed mid-write), as the plugin's GC removes them.
            let temps = interlock_attach::state::sweep_abandoned_temps(&[
                StateStore::new(&state_dir).dir().to_path_buf(),
                netns.dir().to_path_buf(),
            ]);
            for t in temps {
                info!(file = %t.display(), "audit: removed a temp file its writer left when it died");
            }
            (done, failed, swept)
        })
        .await
        {
            Ok(r) => r,
            Err(e) => (
                vec![],
                vec![format!("the collecting thread failed: {e}")],
                Ok(vec![]),
            ),
        };
        match swept {
            Ok(files) => {
                for f in files {
                    info!(file = %f.display(), "audit: removed a netns lock file its holder left when it died (no record beside it)");
                }
            }
            Err(e) => failed.push(format!(
                "sweeping netns lock files left by dead holders: {e}"
            )),
        }
        for c in done {
            info!(
                pod = %c.pod,
                sandbox = %c.key.container_id,
                ifname = %c.key.ifname,
                netns = %c.netns,
                undone = %c.undone,
                "audit: removed the state of a sandbox that is gone (not listed by the runtime, its netns gone)"
            );
        }
        for why in failed {
            self.metrics.errors.inc();
            warn!(error = %why, "audit: cannot remove the state of a sandbox that is gone");
        }
    }

    /// With a Kubernetes API: removes the `unprotected` label of a pod that is protected
    /// now (in the background).
    fn mark_repaired(&self, status: &SandboxStatus) {
        let (Some(c), Some(w)) = (&self.cluster, &self.api) else {
            return;
        };
        let meta = &status.metadata;
        let Some(pod) = c.pods.pod(&meta.namespace, &meta.name, &meta.uid) else {
            return;
        };
        let labelled = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_UNPROTECTED))
            .is_some_and(|v| v == "true");
        if labelled {
            let key = PodKey {
                namespace: meta.namespace.clone(),
                name: meta.name.clone(),
                uid: meta.uid.clone(),
            };
            w.repaired(&key, pod.metadata.labels.clone(), None);
        }
    }
}

/// What `perform` did.
#[derive(Debug, Clone)]
enum Performed {
    /// Done, with details.
    Done(String),
    /// Sent to the Kubernetes API in the background, which logs and counts its outcome.
    Dispatched(String),
}

impl Performed {
    fn text(self) -> String {
        match self {
            Performed::Done(s) | Performed::Dispatched(s) => s,
        }
    }
}

fn log_action(
    pod: &PodKey,
    sandbox: &str,
    action: &RepairAction,
    report: &ActionReport,
    metrics: &AuditMetrics,
) {
    match &report.result {
        Ok(what) => info!(
            pod = %format!("{}/{}", pod.namespace, pod.name),
            uid = %pod.uid,
            sandbox = %sandbox,
            policy = %action.policy,
            because = action.because.as_deref().unwrap_or(""),
            result = %what,
            duration_ms = report.duration.as_secs_f64() * 1e3,
            "audit action done"
        ),
        Err(why) => {
            metrics.errors.inc();
            error!(
                pod = %format!("{}/{}", pod.namespace, pod.name),
                uid = %pod.uid,
                sandbox = %sandbox,
                policy = %action.policy,
                because = action.because.as_deref().unwrap_or(""),
                result = %why,
                duration_ms = report.duration.as_secs_f64() * 1e3,
                "audit action failed"
            )
        }
    }
}

/// The audit's Kubernetes work (labels, Events, delete, evict), run as background tasks
/// so that no audit pass waits on the API; every call in them is bounded by
/// `kubernetes::API_DEADLINE`. At most [`API_TASKS`] run at once: past that new work is
/// dropped with a warning (the next pass sees the pod again).
#[derive(Clone)]
pub struct ApiWork {
    cluster: Cluster,
    metrics: AuditMetrics,
    permits: std::sync::Arc<tokio::sync::Semaphore>,
    removing: std::sync::Arc<Mutex<BTreeSet<String>>>,
}

/// How an action reaches its pod through the Kubernetes API.
#[derive(Clone, Copy)]
enum PodApi<'a> {
    /// The API has the pod with the sandbox's UID: label and Events now.
    Known(&'a ApiWork),
    /// The pod cache has not synced yet: Events once it has, if it holds the pod.
    AfterSync(&'a ApiWork),
    /// No API, or it has no such pod: the log and the metrics only.
    Unknown,
}

/// Kubernetes tasks of the audit running at once.
pub const API_TASKS: usize = 16;

impl ApiWork {
    fn new(cluster: Cluster, metrics: AuditMetrics) -> ApiWork {
        ApiWork {
            cluster,
            metrics,
            permits: std::sync::Arc::new(tokio::sync::Semaphore::new(API_TASKS)),
            removing: std::sync::Arc::default(),
        }
    }

    fn spawn(
        &self,
        what: &str,
        job: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> bool {
        match self.permits.clone().try_acquire_owned() {
            Ok(permit) => {
                tokio::spawn(async move {
                    job.await;
                    drop(permit);
                });
                true
            }
            Err(_) => {
                self.metrics.errors.inc();
                warn!(what, running = API_TASKS, "audit: too many Kubernetes API calls are running (is the API slow?); dropped, the next pass tries again");
                false
            }
        }
    }

    /// Runs `then` once the pod cache has synced, if it then holds `pod` (by UID): an
    /// action taken before the first sync still gets its Event and label. Waits in the
    /// background, at most [`DEFERRED_EVENT_PATIENCE`]; the action itself never waits.
    fn after_sync(&self, pod: &PodKey, then: impl FnOnce(&ApiWork, &PodKey) + Send + 'static) {
        let (w, pod) = (self.clone(), pod.clone());
        tokio::spawn(async move {
            let deadline = Instant::now() + DEFERRED_EVENT_PATIENCE;
            while !w.cluster.pods.is_synced() {
                if Instant::now() > deadline {
                    w.metrics.errors.inc();
                    warn!(
                        pod = %pod,
                        waited_seconds = DEFERRED_EVENT_PATIENCE.as_secs(),
                        "audit: the pod cache never synced with the Kubernetes API; the action's Event is not sent"
                    );
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if w.cluster
                .pods
                .pod(&pod.namespace, &pod.name, &pod.uid)
                .is_some()
            {
                then(&w, &pod);
            }
        });
    }

    /// Whether a delete or an eviction of the pod with `uid` is still running.
    fn busy_with(&self, uid: &str) -> bool {
        lock(&self.removing).contains(uid)
    }

    /// An Event on `pod`, and with `label` the `unprotected` label too.
    fn publish(
        &self,
        pod: &PodKey,
        warning: bool,
        reason: &'static str,
        note: String,
        label: bool,
    ) {
        let (actions, pod) = (self.cluster.actions.clone(), pod.clone());
        let labels = self
            .cluster
            .pods
            .pod(&pod.namespace, &pod.name, &pod.uid)
            .and_then(|p| p.metadata.labels.clone());
        self.spawn(reason, async move {
            actions.event(&pod, warning, reason, &note).await;
            if label {
                if let Err(e) = actions.label(&pod, labels.as_ref(), true).await {
                    warn!(pod = %pod, error = %e, "cannot label the unprotected pod");
                }
            }
        });
    }

    /// The `unprotected` label removed and, with `how`, a `Repaired` Event.
    fn repaired(
        &self,
        pod: &PodKey,
        labels: Option<BTreeMap<String, String>>,
        how: Option<String>,
    ) {
        let (actions, pod, metrics) = (
            self.cluster.actions.clone(),
            pod.clone(),
            self.metrics.clone(),
        );
        let labels = labels.or_else(|| {
            self.cluster
                .pods
                .pod(&pod.namespace, &pod.name, &pod.uid)
                .and_then(|p| p.metadata.labels.clone())
        });
        self.spawn("Repaired", async move {
            match actions.label(&pod, labels.as_ref(), false).await {
                Ok(changed) => {
                    if changed || how.is_some() {
                        let note = how
                            .as_deref()
                            .unwrap_or("the pod's redirection is in place again");
                        actions.event(&pod, false, "Repaired", note).await;
                    }
                }
                Err(e) => {
                    metrics.errors.inc();
                    warn!(pod = %pod, error = %e, "cannot remove the unprotected label");
                }
            }
        });
    }

    /// The `report` policy: the label and an `Unprotected` Event.
    fn report(&self, pod: &PodKey, reason: String) {
        let (actions, pod, metrics) = (
            self.cluster.actions.clone(),
            pod.clone(),
            self.metrics.clone(),
        );
        let labels = self
            .cluster
            .pods
            .pod(&pod.namespace, &pod.name, &pod.uid)
            .and_then(|p| p.metadata.labels.clone());
        self.spawn("Unprotected", async move {
            if let Err(e) = actions.label(&pod, labels.as_ref(), true).await {
                metrics.errors.inc();
                warn!(pod = %pod, error = %e, "cannot label the unprotected pod");
            }
            actions.event(&pod, true, "Unprotected", &reason).await;
        });
    }

    /// A delete or an eviction of `pod` (UID precondition), its outcome logged, counted
    /// and published when the API answers. `false` when it could not be started.
    fn remove(&self, pod: &PodKey, action: RepairAction, sandbox: String, reason: String) -> bool {
        if !lock(&self.removing).insert(pod.uid.clone()) {
            return false;
        }
        let (actions, key, metrics, removing) = (
            self.cluster.actions.clone(),
            pod.clone(),
            self.metrics.clone(),
            self.removing.clone(),
        );
        let labels = self
            .cluster
            .pods
            .pod(&pod.namespace, &pod.name, &pod.uid)
            .and_then(|p| p.metadata.labels.clone());
        let started = self.spawn(action.policy.as_str(), async move {
            let start = Instant::now();
            let result = match action.policy {
                RepairPolicy::Delete => actions
                    .delete(&key)
                    .await
                    .map(|()| "pod deleted (UID precondition)".to_string())
                    .map_err(|e| e.to_string()),
                _ => match actions.evict(&key, EVICT_BUDGET).await {
                    Ok(Evicted::Done) => Ok("pod evicted (UID precondition)".into()),
                    Ok(Evicted::Blocked(why)) => {
                        Err(format!("eviction blocked by a PodDisruptionBudget: {why}"))
                    }
                    Err(e) => Err(e.to_string()),
                },
            };
            metrics.repaired(
                action.policy.as_str(),
                if result.is_ok() { "done" } else { "failed" },
            );
            let report = ActionReport {
                policy: action.policy,
                because: action.because.clone(),
                result: result.clone(),
                duration: start.elapsed(),
            };
            log_action(&key, &sandbox, &action, &report, &metrics);
            if let Some((name, warning)) = decide::event_for(action.policy, result.is_ok(), false) {
                let note = match &result {
                    Ok(what) => format!("{reason}: {what}"),
                    Err(why) => format!("{reason}: {} failed: {why}", action.policy),
                };
                actions.event(&key, warning, name, &note).await;
                if name == "RepairFailed" {
                    if let Err(e) = actions.label(&key, labels.as_ref(), true).await {
                        warn!(pod = %key, error = %e, "cannot label the unprotected pod");
                    }
                }
            }
            lock(&removing).remove(&key.uid);
        });
        if !started {
            lock(&self.removing).remove(&pod.uid);
        }
        started
    }
}

/// Why an action failed, and whether an in-place repair escalates to a restart.
#[derive(Debug, Clone)]
struct ActionError {
    message: String,
    escalate: bool,
}

impl ActionError {
    fn fail(m: impl Into<String>) -> ActionError {
        ActionError {
            message: m.into(),
            escalate: false,
        }
    }
    fn escalate(m: impl Into<String>) -> ActionError {
        ActionError {
            message: m.into(),
            escalate: true,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The spec the plugin installs for a meshed decision: the profile's, for both families.
/// Reads the plugin's record of netns `id` (without its lock: records are replaced
/// atomically). A missing or unreadable record counts as none, as for the plugin.
pub fn read_record(state_dir: &Path, id: NetnsId) -> Option<NetnsRecord> {
    let path = state_dir
        .join(interlock_contract::layout::NETNS_DIR)
        .join(format!("{id}.json"));
    let bytes = std::fs::read(path).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The spec the plugin recorded for the netns at `netns` when it installed its rules
/// (blocking: opens the netns file for its identity).
pub fn recorded_spec(state_dir: &Path, netns: &Path) -> Option<RedirectSpec> {
    let id = PodNetns::open(netns).ok()?.id();
    let record = read_record(state_dir, id)?;
    serde_json::from_str(&record.spec).ok()
}

/// Reads one netns's rules back against `spec` (blocking: enters the netns on a
/// dedicated thread) with the backend the plugin recorded for it, else `backend`, and
/// cross-checks the plugin's record for sandbox `sandbox`. Rules an older release wrote
/// that differ from this build's are proven by a connection instead
/// ([`decide::resolve_older`]).
pub fn inspect(
    path: &Path,
    spec: &RedirectSpec,
    state_dir: &Path,
    backend: BackendKind,
    sandbox: &str,
) -> Inspection {
    inspect_with(path, spec, state_dir, backend, sandbox, None)
}

/// The older-shape rules a connection has proven, so that each is proven once, not at
/// every pass: by netns, a digest of how the rules differ from this build's and of the
/// record. Damage changes the read-back and so the digest, and the next pass proves (or
/// repairs) again. It holds at most one entry per pod that ran before an upgrade.
#[derive(Debug, Default)]
pub struct OlderProofs(Mutex<HashMap<String, u64>>);

impl OlderProofs {
    fn digest(diffs: &[String], record_updated_ms: u64) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        diffs.hash(&mut h);
        record_updated_ms.hash(&mut h);
        h.finish()
    }
}

/// [`inspect`], remembering older-shape proofs in `proofs` (the agent's audit) or proving
/// every time (`None`: `check`, `inspect`).
pub fn inspect_with(
    path: &Path,
    spec: &RedirectSpec,
    state_dir: &Path,
    backend: BackendKind,
    sandbox: &str,
    proofs: Option<&OlderProofs>,
) -> Inspection {
    let pod = match PodNetns::open(path) {
        Ok(p) => p,
        Err(e) if e.is_gone() => return Inspection::Gone,
        Err(e) => {
            return Inspection::Seen {
                netns_id: NetnsId { dev: 0, ino: 0 },
                rules: RulesSeen::Error(e.to_string()),
            }
        }
    };
    let netns_id = pod.id();
    let record = read_record(state_dir, netns_id);
    let backend = record.as_ref().map_or(backend, |r| r.backend);
    let rules = match engine::check_in(&pod, spec, backend) {
        Ok(Verification::Exact) => RulesSeen::Exact,
        Ok(Verification::Mismatch(d)) => RulesSeen::Mismatch(d),
        Err(engine::EngineError::Netns(e)) if e.is_gone() => return Inspection::Gone,
        Err(e) => RulesSeen::Error(e.to_string()),
    };
    let view = record.as_ref().map(|r| RecordView {
        lists_sandbox: r.attachments.iter().any(|k| k.container_id == sandbox),
        spec_hash: &r.spec_hash,
        shape: r.shape,
    });
    let mut rules = decide::cross_check(rules, view, &spec.hash());
    if let RulesSeen::OlderShape { shape, diffs } = &rules {
        let key = netns_id.to_string();
        let digest = OlderProofs::digest(diffs, record.as_ref().map_or(0, |r| r.updated_at_ms));
        let known = proofs.is_some_and(|p| lock(&p.0).get(&key) == Some(&digest));
        let proof = if known {
            Ok("proven by a connection earlier, unchanged since".to_string())
        } else {
            // The pod runs: its proxy may own the port, and the probe then proves
            // capture through that listener, sending only to the pod's gateways.
            engine::prove_in(
                &pod,
                spec,
                backend,
                &[],
                PROOF_TIMEOUT,
                ProxyPort::MaybeTaken,
            )
            .map(|report| report.lines().join("; "))
            .map_err(|e| e.to_string())
        };
        if proof.is_ok() && !known {
            info!(
                netns_id = %key,
                sandbox,
                shape,
                "audit: rules an older interlock wrote still capture; left as written"
            );
            if let Some(p) = proofs {
                lock(&p.0).insert(key, digest);
            }
        }
        rules = decide::resolve_older(rules, proof);
    }
    Inspection::Seen { netns_id, rules }
}

/// How long the connection that proves an older release's rules may take.
const PROOF_TIMEOUT: Duration = Duration::from_secs(2);

/// What an in-place repair did.
#[derive(Debug, Clone)]
pub struct RepairDone {
    /// Connections ended.
    pub ended: usize,
    /// One line for the log and the Event.
    pub summary: String,
}

/// The in-place repair of one sandbox (blocking): the plugin's protect (lock, apply, read
/// back, probe), its attachment state and netns record written as its ADD writes them,
/// then the connections opened before the rules ended inside the netns. `Err` says why;
/// every failure escalates to a restart.
pub fn repair_netns(
    plugin: &PluginConfig,
    sandbox: &str,
    pod: &interlock_cri::SandboxMetadata,
    decision: &Decision,
    netns: &Path,
) -> Result<RepairDone, String> {
    repair_in_place(plugin, sandbox, pod, decision, netns).map_err(|e| e.message)
}

fn repair_in_place(
    plugin: &PluginConfig,
    sandbox: &str,
    meta: &interlock_cri::SandboxMetadata,
    decision: &Decision,
    netns: &Path,
) -> Result<RepairDone, ActionError> {
    let start = Instant::now();
    let netns_str = netns.to_string_lossy().into_owned();
    let store = StateStore::new(&plugin.state_dir);
    let key = AttachmentKey {
        container_id: sandbox.to_string(),
        ifname: REPAIR_IFNAME.to_string(),
    };
    // The pod runs: its proxy may listen on the outbound port already, and the probe
    // then proves capture through that listener (see `interlock_redirect::probe`).
    let (protection, claim) = interlock_attach::protect::protect_running(
        plugin,
        &store,
        &key,
        &netns_str,
        decision,
        ProxyPort::MaybeTaken,
    )
    .map_err(|f| ActionError::escalate(format!("applying the rules: {}", f.message)))?;
    let claim = claim.ok_or_else(|| ActionError::fail("the decision needed no rules"))?;
    let Protection::Protected(p) = &protection else {
        return Err(ActionError::fail("the decision needed no rules"));
    };
    let spec = p
        .installed_spec()
        .map_err(|e| ActionError::escalate(format!("reading back the installed spec: {e}")))?;
    let state = AttachmentState {
        key: key.clone(),
        netns: netns_str.clone(),
        netns_id: Some(claim.netns_id().to_string()),
        network: REPAIR_NETWORK.to_string(),
        cni_version: CniVersion::V1_0_0.as_str().to_string(),
        pod: PodIdentity {
            namespace: meta.namespace.clone(),
            name: meta.name.clone(),
            uid: meta.uid.clone(),
            annotations: None,
            facts: None,
        },
        annotations_source: Source::Agent,
        decision: decision.clone(),
        protection: protection.clone(),
        added_at_ms: interlock_contract::time::now_ms(),
        add_us: u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX),
    };
    if let Err(e) = store.save(&state) {
        let left = claim.abort();
        return Err(ActionError::escalate(format!(
            "writing the attachment state {}: {e}{}",
            store.path_for(&key).display(),
            left.map(|l| format!(" ({l})")).unwrap_or_default()
        )));
    }
    claim
        .commit()
        .map_err(|e| ActionError::escalate(format!("writing the netns record: {e}")))?;
    let uid = spec.proxy_uid;
    let ended = PodNetns::open(netns)
        .and_then(|pod| pod.run(move || sockdiag::end_connections(uid)))
        .map_err(|e| ActionError::escalate(format!("entering the netns to end connections: {e}")))?
        // A refusal (EPERM, EOPNOTSUPP), survivors or any other failure: the pod still
        // holds plaintext connections that bypass the rules, so it escalates.
        .map_err(|e| {
            ActionError::escalate(format!(
                "ending the connections opened before the rules{}: {e}",
                if e.is_refusal() { " (refused)" } else { "" }
            ))
        })?;
    Ok(RepairDone {
        ended: ended.ended.len(),
        summary: format!(
            "rules applied in place ({}, proven: {}), {} connection(s) opened before them ended{}, in {:.1} ms",
            p.backend,
            p.probe.join("; "),
            ended.ended.len(),
            ended_list(&ended),
            start.elapsed().as_secs_f64() * 1e3
        ),
    })
}

/// ` (a, b)` naming the ended connections, plus how many closed meanwhile.
fn ended_list(ended: &sockdiag::Ended) -> String {
    let mut parts: Vec<String> = ended.ended.iter().map(|s| s.to_string()).collect();
    if ended.already_gone > 0 {
        parts.push(format!("{} closed meanwhile", ended.already_gone));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join(", "))
    }
}

/// How long a sandbox named by an ADD note is looked for: the plugin sends the note from
/// inside `RunPodSandbox`, so the runtime lists the sandbox as ready only a little later.
pub const NOTE_PATIENCE: Duration = Duration::from_secs(5);
/// How soon after a note its sandbox is first looked for, and how soon noted sandboxes
/// that are not ready yet are looked for again; the wait doubles with each round that
/// finds none of them, up to [`NOTE_RETRY_MAX`]. Not at once: the plugin sends the note
/// from inside the sandbox's start, which the runtime finishes only afterwards, so a list
/// at once would never find it and only compete with that start for the CPU.
pub const NOTE_RETRY: Duration = Duration::from_millis(20);
/// The longest wait between two rounds of looking for noted sandboxes.
pub const NOTE_RETRY_MAX: Duration = Duration::from_millis(640);
/// Noted sandboxes looked for at once; notes past it are left to the periodic audit
/// (each round is one `ListPodSandbox` for all of them).
pub const MAX_PENDING_NOTES: usize = 1024;
/// ADD notes queued for the audit; past it a note is answered `undecided` (the plugin
/// only logs it) and the periodic audit covers the sandbox.
pub const NOTE_QUEUE: usize = 1024;

/// The wait before round `round` (0 first) of looking for noted sandboxes (pure).
pub fn note_retry(round: u32) -> Duration {
    NOTE_RETRY
        .saturating_mul(2u32.saturating_pow(round.min(16)))
        .min(NOTE_RETRY_MAX)
}

/// The shortest time between two audits woken by the pod watch (a burst of pod changes,
/// e.g. a rollout, costs one audit per spacing, not one per change).
const POD_CHANGE_SPACING: Duration = Duration::from_millis(500);

/// How soon the runtime is asked again after it could not be reached.
const CRI_RETRY: Duration = Duration::from_secs(1);

/// Runs the audit loop: connects to CRI (retrying every second until it answers),
/// audits at once, then on every `interval` tick, [`NOTE_RETRY`] after a sandbox ID
/// arrives on `wake` (the plugin's ADD notes: noted sandboxes not ready yet are looked for
/// again, all with one list per round, for up to [`NOTE_PATIENCE`]) and when the pod watch reports a
/// pod on this node added or changed (a full audit, at most once per
/// [`POD_CHANGE_SPACING`]), one audit at a time. What the runtime answers, and each
/// completed pass, go to `health` for `/readyz`.
pub async fn run(
    settings: AuditSettings,
    plugin: PluginConfig,
    cluster: Option<Cluster>,
    metrics: AuditMetrics,
    health: std::sync::Arc<crate::health::shared::AuditHealth>,
    mut wake: mpsc::Receiver<String>,
) {
    health.started(&settings.cri_endpoint, settings.interval);
    let mut tick = tokio::time::interval(settings.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut auditor: Option<Auditor> = None;
    let pod_changes = cluster.as_ref().map(|c| c.pods.changes());
    let mut parts = Some((plugin, cluster, metrics));
    let mut pending: BTreeMap<String, Instant> = BTreeMap::new();
    let mut rounds = 0u32;
    // When the noted sandboxes are looked for next (none pending: never). A deadline, not
    // a fresh wait per loop, so notes arriving faster than the wait cannot put it off.
    let mut next_look: Option<Instant> = None;
    // The pod watch (with a Kubernetes API) wakes a full audit when a pod on this node
    // appears or changes, at most once per POD_CHANGE_SPACING.
    let mut last_pod_audit: Option<Instant> = None;
    let mut cri_retry: Option<Instant> = None;
    loop {
        let retry = async {
            match next_look {
                Some(t) if !pending.is_empty() => tokio::time::sleep_until(t.into()).await,
                _ => std::future::pending::<()>().await,
            }
        };
        let pod_changed = async {
            match &pod_changes {
                Some(n) => {
                    n.notified().await;
                    if let Some(t) = last_pod_audit {
                        let next = t + POD_CHANGE_SPACING;
                        tokio::time::sleep_until(next.into()).await;
                    }
                }
                None => std::future::pending::<()>().await,
            }
        };
        let reconnect = async {
            match cri_retry {
                Some(t) => tokio::time::sleep_until(t.into()).await,
                None => std::future::pending::<()>().await,
            }
        };
        let noted: Option<bool> = tokio::select! {
            _ = tick.tick() => Some(false),
            () = reconnect => Some(false),
            () = pod_changed => {
                last_pod_audit = Some(Instant::now());
                Some(false)
            }
            Some(id) = wake.recv() => {
                if pending.len() < MAX_PENDING_NOTES || pending.contains_key(&id) {
                    pending.entry(id).or_insert_with(|| Instant::now() + NOTE_PATIENCE);
                    rounds = 0;
                }
                // Notes that came meanwhile join this round.
                while pending.len() < MAX_PENDING_NOTES {
                    match wake.try_recv() {
                        Ok(id) => {
                            pending.entry(id).or_insert_with(|| Instant::now() + NOTE_PATIENCE);
                        }
                        Err(_) => break,
                    }
                }
                let now = Instant::now();
                let first = now + NOTE_RETRY;
                next_look = Some(match next_look {
                    Some(t) if t > now => t.min(first),
                    _ => first,
                });
                None
            }
            () = retry => {
                rounds = rounds.saturating_add(1);
                next_look = Some(Instant::now() + note_retry(rounds));
                Some(true)
            }
        };
        // A note only sets when its sandbox is first looked for.
        let Some(noted) = noted else { continue };
        cri_retry = None;
        if auditor.is_none() {
            match CriClient::connect(&settings.cri_endpoint).await {
                Ok(cri) => {
                    if let Some((plugin, cluster, metrics)) = parts.take() {
                        info!(endpoint = %settings.cri_endpoint, policy = %settings.policy, interval_seconds = settings.interval.as_secs_f64(), "audit: connected to CRI");
                        auditor =
                            Some(Auditor::new(cri, plugin, settings.policy, cluster, metrics));
                    }
                }
                Err(e) => {
                    if let Some((_, _, m)) = &parts {
                        m.errors.inc();
                        m.cri_up.set(0);
                    }
                    health.runtime_failed(&e.to_string());
                    warn!(endpoint = %settings.cri_endpoint, error = %e, "audit: cannot reach the runtime over CRI; retrying in 1 s");
                    cri_retry = Some(Instant::now() + CRI_RETRY);
                    continue;
                }
            }
        }
        let Some(a) = &auditor else { continue };
        if !noted {
            match a.audit(None).await {
                Ok(_) => health.pass_done(),
                Err(e) => {
                    health.runtime_failed(&e.to_string());
                    cri_retry = Some(Instant::now() + CRI_RETRY);
                    warn!(error = %e, "audit: cannot list the sandboxes; retrying in 1 s");
                }
            }
            continue;
        }
        let ids: BTreeSet<String> = pending.keys().cloned().collect();
        match a.audit(Some(&ids)).await {
            Ok(reports) => {
                health.runtime_answered();
                for r in reports {
                    // Guard mode: a sandbox whose proxy does not listen yet is looked at
                    // again with the noted ones, so it is probed as soon as it does.
                    if guarded::is_waiting(&r.verdict) {
                        continue;
                    }
                    pending.remove(&r.sandbox);
                    info!(
                        pod = %r.pod,
                        sandbox = %r.sandbox,
                        verdict = r.verdict.label(),
                        "audited on the plugin's ADD note"
                    );
                }
            }
            Err(e) => {
                health.runtime_failed(&e.to_string());
                warn!(error = %e, "audit: cannot list the sandboxes");
            }
        }
        let now = Instant::now();
        pending.retain(|id, until| {
            let keep = *until > now;
            if !keep {
                info!(sandbox = %id, "audit: the sandbox of an ADD note never became ready (in guard mode: or its proxy never listened); the periodic audit covers it");
            }
            keep
        });
    }
}

/// The agent socket's path under `state_dir`.
pub fn socket_path(state_dir: &Path) -> PathBuf {
    state_dir.join(interlock_contract::layout::AGENT_SOCKET_FILE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_corrupt_record_is_none() {
        let t = interlock_testkit::tempdir().unwrap();
        let id = NetnsId { dev: 4, ino: 9 };
        assert!(read_record(t.path(), id).is_none());
        let dir = t.path().join(interlock_contract::layout::NETNS_DIR);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{id}.json")), "{not json").unwrap();
        assert!(read_record(t.path(), id).is_none());
    }

    /// redteam-3 L-2: noted sandboxes that do not appear are looked for with a wait
    /// that doubles, one list per round for all of them: about a dozen lists in
    /// NOTE_PATIENCE instead of 250 per note.
    #[test]
    fn noted_sandboxes_are_looked_for_less_and_less_often() {
        assert_eq!(note_retry(0), NOTE_RETRY);
        assert_eq!(note_retry(1), NOTE_RETRY * 2);
        assert_eq!(note_retry(10), NOTE_RETRY_MAX);
        let mut t = Duration::ZERO;
        let mut rounds = 0;
        while t < NOTE_PATIENCE {
            t += note_retry(rounds);
            rounds += 1;
        }
        assert!(rounds <= 15, "{rounds} lists in {NOTE_PATIENCE:?}");
    }

    #[test]
    fn settings_default_to_the_documented_values() {
        let s = AuditSettings::default();
        assert_eq!(s.cri_endpoint, "unix:///run/containerd/containerd.sock");
        assert_eq!(s.interval, Duration::from_secs(10));
        assert_eq!(s.policy, RepairPolicy::Repair);
    }
}

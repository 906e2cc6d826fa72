//! The agent's Kubernetes side, on kube-rs: the client, the node's gate (startup taint and
//! `InterlockReady` condition; [`gating`] makes its decisions, pure), the cache of the
//! pods on this node (one watch, field-selected to `spec.nodeName`: API load per node stays
//! constant however large the cluster), the `interlock.dev/unprotected` label, Events, and
//! the delete and evict repairs.
//!
//! Every write is a change: the node is read, the edit computed, and nothing is sent when
//! the node already says it. Taint edits carry the `resourceVersion` they were computed
//! from (a precondition: a stale list is refused with 409 instead of dropping another
//! component's taint) and are recomputed from a fresh read on conflict.

pub mod gating;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use interlock_contract::agent_socket::{PodRef, Response, PROTOCOL_VERSION};
use interlock_contract::names::{CONDITION_READY, EVENTS_REPORTER, LABEL_UNPROTECTED};
use interlock_contract::pod::{ContainerFacts, PodFacts};
use k8s_openapi::api::core::v1::{Node, NodeCondition, ObjectReference, Pod, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use serde_json::json;

use crate::health::status::Shared;
use gating::{
    condition_edit, node_state, taints_edit, Debounce, NodeState, TaintEffect, REASON_NOT_EFFECTIVE,
};

/// How many times a taint edit is recomputed after a conflict before giving up until the
/// next change.
const CONFLICT_RETRIES: usize = 5;

/// Which credentials the client uses, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// The pod's service account (`KUBERNETES_SERVICE_HOST` and the mounted token).
    InCluster,
    /// A kubeconfig file.
    Kubeconfig(String),
}

impl std::fmt::Display for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::InCluster => f.write_str("in-cluster service account"),
            Credentials::Kubeconfig(p) => write!(f, "kubeconfig {p}"),
        }
    }
}

/// A Kubernetes failure, naming what was being done.
#[derive(Debug, thiserror::Error)]
#[error("Kubernetes API: {doing}: {source}")]
pub struct KubeError {
    /// What was being done (`patching node n1`, …).
    pub doing: String,
    /// What went wrong.
    #[source]
    pub source: ApiFailure,
}

/// Why an API call failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiFailure {
    /// The client's error (an answer, or a failed connection).
    #[error(transparent)]
    Client(#[from] kube::Error),
    /// No answer within the call's deadline ([`API_DEADLINE`]).
    #[error("no answer within {0:?} (the call was abandoned)")]
    TimedOut(Duration),
    /// The pod of that name is another pod now (this UID): nothing was changed.
    #[error("the pod of that name is another pod now (UID {0}); nothing changed")]
    OtherPod(String),
}

impl ApiFailure {
    /// The HTTP status of an API answer, if that is what it was.
    pub fn code(&self) -> Option<u16> {
        match self {
            ApiFailure::Client(kube::Error::Api(e)) => Some(e.code),
            _ => None,
        }
    }
}

/// The longest any single (non-watch) API call may take: an API server that accepts a
/// request and never answers, or a half-open connection after a load balancer failover,
/// costs this much and no more (kube-client has no request timeout of its own).
pub const API_DEADLINE: Duration = Duration::from_secs(10);

/// Runs one API call with [`API_DEADLINE`].
pub async fn bounded<T>(
    doing: impl FnOnce() -> String,
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, KubeError> {
    match tokio::time::timeout(API_DEADLINE, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(KubeError {
            doing: doing(),
            source: e.into(),
        }),
        Err(_) => Err(KubeError {
            doing: doing(),
            source: ApiFailure::TimedOut(API_DEADLINE),
        }),
    }
}

/// The client for `--kube auto`: the in-cluster service account when the agent runs in a
/// pod, else `$KUBECONFIG` (or `~/.kube/config`); `Ok(None)` when there is neither.
pub async fn connect() -> Result<Option<(Client, Credentials)>, String> {
    let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
        && std::path::Path::new("/var/run/secrets/kubernetes.io/serviceaccount/token").exists();
    let (config, creds) = if in_cluster {
        let c = kube::Config::incluster().map_err(|e| format!("in-cluster config: {e}"))?;
        (c, Credentials::InCluster)
    } else {
        let path = std::env::var("KUBECONFIG").ok().or_else(|| {
            let home = std::env::var_os("HOME")?;
            let p = std::path::Path::new(&home).join(".kube/config");
            p.exists().then(|| p.display().to_string())
        });
        let Some(path) = path else { return Ok(None) };
        (
            config_from_kubeconfig(&path).await?,
            Credentials::Kubeconfig(path),
        )
    };
    let mut config = config;
    without_client_retries(&mut config);
    let client = Client::try_from(config).map_err(|e| format!("{creds}: {e}"))?;
    Ok(Some((client, creds)))
}

/// The client settings of kubeconfig `path` (its current context).
pub async fn config_from_kubeconfig(path: &str) -> Result<kube::Config, String> {
    let kc =
        kube::config::Kubeconfig::read_from(path).map_err(|e| format!("kubeconfig {path}: {e}"))?;
    let mut config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|e| format!("kubeconfig {path}: {e}"))?;
    without_client_retries(&mut config);
    Ok(config)
}

/// kube-rs retries 429, 503 and 504 inside every request by default (up to 15 times,
/// delays growing towards 1000 s): an eviction blocked by a PodDisruptionBudget would hold
/// the audit for minutes instead of being reported within its budget, and a gate write
/// would stall readiness changes behind it. The agent retries where it acts (the
/// watchers' back-off, the gate's back-off, the eviction's budget), so the client does
/// not.
///
/// Every call the agent makes is bounded by [`API_DEADLINE`] where it is made; the
/// client's own read timeout (none by default) only catches a watch whose connection
/// went silent: longer than the watcher's 290 s server-side timeout, so a healthy quiet
/// watch is never cut.
fn without_client_retries(config: &mut kube::Config) {
    config.default_retry = false;
    config.read_timeout = Some(WATCH_SILENCE);
}

/// How long a watch connection may stay silent before the client gives up on it (the
/// watcher asks the server to end each watch after 290 s).
const WATCH_SILENCE: Duration = Duration::from_secs(330);

/// The node's taint and condition, kept in step with the agent's readiness.
pub struct NodeGate {
    nodes: Api<Node>,
    name: String,
    effect: TaintEffect,
    debounce: Debounce,
    shown: Option<NodeState>,
    uid: Option<String>,
    recorder: Recorder,
}

/// What one [`NodeGate::observe`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GateWrites {
    /// The node was read from the API (the cached copy was not in step).
    pub read: bool,
    /// The taint list was written.
    pub taints: bool,
    /// The condition was written.
    pub condition: bool,
    /// When to call again (a loss younger than the debounce is pending).
    pub again_at: Option<Instant>,
}

fn our_condition(node: &Node) -> Option<&NodeCondition> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == CONDITION_READY))
}

fn node_taints(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
}

/// Whether `node` already shows `want` (taint and condition): nothing to write.
fn in_step(node: &Node, want: &NodeState, effect: TaintEffect) -> bool {
    taints_edit(node_taints(node), want.ready, effect).is_none()
        && condition_edit(
            our_condition(node),
            want,
            Time(k8s_openapi::jiff::Timestamp::now()),
        )
        .is_none()
}

impl NodeGate {
    /// The gate of node `name`.
    pub fn new(client: Client, name: &str, effect: TaintEffect) -> NodeGate {
        NodeGate {
            nodes: Api::all(client.clone()),
            name: name.to_string(),
            effect,
            debounce: Debounce::default(),
            shown: None,
            uid: None,
            recorder: recorder(client, name),
        }
    }

    /// The node's name.
    pub fn node(&self) -> &str {
        &self.name
    }

    /// Whether `node` (a cached copy) shows what the gate last published; `false` before
    /// the first publish.
    pub fn in_step(&self, node: &Node) -> bool {
        self.shown
            .as_ref()
            .is_some_and(|want| in_step(node, want, self.effect))
    }

    /// Feeds the agent's readiness; writes the taint and condition when they must change
    /// (and an Event when protection is lost or restored). `cached` is the node as the
    /// watch last saw it: when it already shows the state, nothing is read or written.
    pub async fn observe(
        &mut self,
        current: NodeState,
        now: Instant,
        cached: Option<&Node>,
    ) -> Result<GateWrites, KubeError> {
        let (shown, again_at) = self.debounce.observe(current, now);
        let mut writes = match cached {
            Some(node) if in_step(node, &shown, self.effect) => {
                if self.uid.is_none() {
                    self.uid = node.metadata.uid.clone();
                }
                GateWrites::default()
            }
            _ => self.converge(&shown).await?,
        };
        writes.again_at = again_at;
        if let Some(was) = self.shown.replace(shown.clone()) {
            if was.ready != shown.ready {
                let (reason, type_) = if shown.ready {
                    ("ProtectionRestored", EventType::Normal)
                } else {
                    ("ProtectionLost", EventType::Warning)
                };
                self.event(type_, reason, &shown.message).await;
            }
        }
        Ok(writes)
    }

    /// Publishes `ConfigTakenOver` on the node (another writer took first place or
    /// rewrote the config).
    pub async fn config_taken_over(&self, message: &str) {
        self.event(EventType::Warning, "ConfigTakenOver", message)
            .await;
    }

    async fn event(&self, type_: EventType, reason: &str, note: &str) {
        // Nodes are cluster-scoped: their Events live in `default`, as the kubelet's do.
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(self.name.clone()),
            uid: Some(self.uid.clone().unwrap_or_else(|| self.name.clone())),
            ..Default::default()
        };
        publish(&self.recorder, type_, reason, note, &reference).await;
    }

    /// Reads the node and writes what differs from `want`.
    async fn converge(&mut self, want: &NodeState) -> Result<GateWrites, KubeError> {
        let mut writes = GateWrites {
            read: true,
            ..GateWrites::default()
        };
        for attempt in 0..=CONFLICT_RETRIES {
            let mut node = bounded(
                || format!("reading node {}", self.name),
                self.nodes.get(&self.name),
            )
            .await?;
            self.uid = node.metadata.uid.clone();
            if !writes.condition {
                if let Some(cond) = condition_edit(
                    our_condition(&node),
                    want,
                    Time(k8s_openapi::jiff::Timestamp::now()),
                ) {
                    // Conditions merge by `type` in a strategic merge patch: no precondition
                    // is needed, nobody else's condition is touched. The node it returns is
                    // the one the taint edit starts from: its own resourceVersion moved.
                    let patch = json!({"status": {"conditions": [cond]}});
                    node = bounded(
                        || format!("writing condition {CONDITION_READY} on node {}", self.name),
                        self.nodes.patch_status(
                            &self.name,
                            &PatchParams::default(),
                            &Patch::Strategic(&patch),
                        ),
                    )
                    .await?;
                    writes.condition = true;
                }
            }
            let Some(next) = taints_edit(node_taints(&node), want.ready, self.effect) else {
                return Ok(writes);
            };
            // A merge patch replaces the list whole; the resourceVersion makes it apply only
            // to the node it was computed from.
            let patch = json!({
                "metadata": {"resourceVersion": node.metadata.resource_version},
                "spec": {"taints": next},
            });
            match bounded(
                || format!("writing the taints of node {}", self.name),
                self.nodes
                    .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch)),
            )
            .await
            {
                Ok(_) => {
                    writes.taints = true;
                    return Ok(writes);
                }
                Err(e) if e.source.code() == Some(409) && attempt < CONFLICT_RETRIES => {
                    tracing::debug!(node = %self.name, "taint edit conflicted; reading the node again");
                }
                Err(e) => return Err(e),
            }
        }
        unreachable!("the loop returns on its last attempt")
    }
}

/// The longest wait between retries after an API failure.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

fn backoff(failures: u32) -> Duration {
    (Duration::from_millis(200) * 2u32.saturating_pow(failures.min(8))).min(MAX_BACKOFF)
}

/// One watch of this node alone (`metadata.name`), so the gate notices another client
/// changing the taint or the condition, and the resync compares against a cached copy
/// instead of reading the API.
fn watch_node(
    client: Client,
    name: &str,
) -> (
    Store<Node>,
    Arc<tokio::sync::Notify>,
    impl std::future::Future<Output = ()> + Send,
) {
    let api: Api<Node> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let (store, writer) = reflector::store();
    let changed = Arc::new(tokio::sync::Notify::new());
    let notify = changed.clone();
    let run = async move {
        watcher(api, config)
            .default_backoff()
            .reflect(writer)
            .for_each(|event| {
                match event {
                    Ok(_) => notify.notify_one(),
                    Err(e) => {
                        tracing::warn!(error = %e, "node watch failed; it retries with back-off")
                    }
                }
                std::future::ready(())
            })
            .await;
    };
    (store, changed, run)
}

/// Keeps the node's taint and condition in step with the guard's readiness until the
/// agent stops: on every readiness change, when the debounce of a loss runs out, when the
/// node watch shows someone else changed them, and on every `resync` (comparing against
/// the watched copy: a node in step costs no request). Publishes `ConfigTakenOver` as the
/// guard reports takeovers. API failures are logged and retried with back-off; they never
/// reach the guard.
pub async fn run_gate(mut gate: NodeGate, client: Client, shared: Arc<Shared>, resync: Duration) {
    let mut readiness = shared.watch_readiness();
    let mut takeovers = shared.watch_takeovers();
    takeovers.mark_unchanged();
    let (store, node_changed, watch) = watch_node(client, gate.node());
    tokio::spawn(watch);
    let cached = |store: &Store<Node>, name: &str| store.get(&ObjectRef::new(name));
    let mut failures = 0u32;
    let mut converge_now = true;
    let mut again_at: Option<Instant> = None;
    let mut retry_at: Option<Instant> = None;
    let mut next_resync = Instant::now() + resync;
    let mut last_reason: Option<String> = None;
    loop {
        // A change that arrived while another branch woke the loop is taken here, as
        // `borrow_and_update` marks it seen and `changed()` will not report it again.
        converge_now |= readiness.has_changed().unwrap_or(false);
        let current = node_state(&readiness.borrow_and_update());
        // A foreign file taking first place (nothing the guard can repair) is reported at
        // once; the taint and condition follow the debounce.
        if current.reason == REASON_NOT_EFFECTIVE
            && last_reason
                .as_deref()
                .is_some_and(|r| r != REASON_NOT_EFFECTIVE && r != "Starting")
        {
            gate.config_taken_over(&current.message).await;
        }
        last_reason = Some(current.reason.clone());
        if converge_now {
            converge_now = false;
            let node = cached(&store, gate.node());
            match gate.observe(current, Instant::now(), node.as_deref()).await {
                Ok(w) => {
                    failures = 0;
                    retry_at = None;
                    again_at = w.again_at;
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    let wait = backoff(failures);
                    tracing::warn!(error = %e, retry_in = ?wait, "cannot update the node's taint and condition; retrying");
                    retry_at = Some(Instant::now() + wait);
                    // The retry covers a pending debounce: a deadline already past must
                    // not wake the loop again before the back-off.
                    again_at = None;
                }
            }
        }
        let wake = [again_at, retry_at, Some(next_resync)]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(next_resync);
        tokio::select! {
            r = readiness.changed() => {
                if r.is_err() {
                    return;
                }
                converge_now = true;
            }
            r = takeovers.changed() => {
                if r.is_err() {
                    return;
                }
                let latest = takeovers.borrow_and_update().clone();
                if let Some(t) = latest {
                    gate.config_taken_over(&format!(
                        "another writer undid interlock's change to {} ({} times since the agent started); \
                         find the other CNI installer",
                        t.file, t.undos
                    ))
                    .await;
                }
            }
            _ = node_changed.notified() => {
                converge_now = retry_at.is_none()
                    && cached(&store, gate.node()).is_some_and(|n| !gate.in_step(&n));
            }
            _ = tokio::time::sleep_until(wake.into()) => {
                let now = Instant::now();
                if again_at.is_some_and(|t| t <= now) || retry_at.is_some_and(|t| t <= now) {
                    converge_now = true;
                }
                if next_resync <= now {
                    next_resync = now + resync;
                    converge_now |= !cached(&store, gate.node()).is_some_and(|n| gate.in_step(&n));
                }
            }
        }
    }
}

/// What the Kubernetes side needs to know.
#[derive(Debug, Clone)]
pub struct KubeSettings {
    /// This node's name (`--node-name`).
    pub node: String,
    /// The startup taint's effect.
    pub effect: TaintEffect,
    /// The guard's full-resync period: the gate re-checks the node as often.
    pub resync: Duration,
}

/// Starts the Kubernetes side on the current tokio runtime (the pod watch and the node
/// gate run as tasks) and returns what the audit and the agent socket use.
pub fn start(client: Client, settings: &KubeSettings, shared: Arc<Shared>) -> Cluster {
    let (pods, watch) = PodCache::start(client.clone(), &settings.node);
    tokio::spawn(watch);
    let gate = NodeGate::new(client.clone(), &settings.node, settings.effect);
    tokio::spawn(run_gate(gate, client.clone(), shared, settings.resync));
    Cluster {
        pods,
        actions: Arc::new(PodActions::new(client, &settings.node)),
    }
}

fn recorder(client: Client, node: &str) -> Recorder {
    Recorder::new(
        client,
        Reporter {
            controller: EVENTS_REPORTER.to_string(),
            instance: Some(format!("{EVENTS_REPORTER}/{node}")),
        },
    )
}

async fn publish(
    recorder: &Recorder,
    type_: EventType,
    reason: &str,
    note: &str,
    reference: &ObjectReference,
) {
    let event = Event {
        type_,
        reason: reason.to_string(),
        // The API caps a note at 1 kB.
        note: Some(note.chars().take(1000).collect()),
        action: reason.to_string(),
        secondary: None,
    };
    match tokio::time::timeout(API_DEADLINE, recorder.publish(&event, reference)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(reason, error = %e, "cannot publish a Kubernetes Event"),
        Err(_) => tracing::warn!(
            reason,
            deadline = ?API_DEADLINE,
            "cannot publish a Kubernetes Event: no answer within the deadline"
        ),
    }
}

/// The pods on this node, from one field-selected watch.
#[derive(Clone)]
pub struct PodCache {
    store: Store<Pod>,
    synced: Arc<AtomicBool>,
    changed: Arc<tokio::sync::Notify>,
}

impl PodCache {
    /// Starts the watch of the pods on `node`; the returned future runs it (re-listing
    /// after a `410 Gone` or a dropped connection, with back-off) and must be spawned.
    pub fn start(
        client: Client,
        node: &str,
    ) -> (PodCache, impl std::future::Future<Output = ()> + Send) {
        let api: Api<Pod> = Api::all(client);
        let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        let (store, writer) = reflector::store();
        let synced = Arc::new(AtomicBool::new(false));
        let changed = Arc::new(tokio::sync::Notify::new());
        let cache = PodCache {
            store: store.clone(),
            synced: synced.clone(),
            changed: changed.clone(),
        };
        let run = async move {
            let flag = synced.clone();
            let ready = store.clone();
            tokio::spawn(async move {
                if ready.wait_until_ready().await.is_ok() {
                    flag.store(true, Ordering::Release);
                }
            });
            watcher(api, config)
                .default_backoff()
                .reflect(writer)
                .for_each(|event| {
                    let changed = changed.clone();
                    async move {
                        match event {
                            // A pod on this node was added or changed (its annotations may
                            // have too): whoever waits on `changed` audits now.
                            Ok(watcher::Event::Apply(_)) | Ok(watcher::Event::InitDone) => {
                                changed.notify_one()
                            }
                            Ok(_) => {}
                            Err(e) => {
                                tracing::warn!(error = %e, "pod watch failed; it retries with back-off")
                            }
                        }
                    }
                })
                .await;
        };
        (cache, run)
    }

    /// Signalled when a pod on this node is added or changes (and when a list completes);
    /// the sandbox audit waits on it to audit at once instead of at its next period.
    pub fn changes(&self) -> Arc<tokio::sync::Notify> {
        self.changed.clone()
    }

    /// Whether the first list has been received (before, answers are not authoritative).
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// The pod `namespace/name`, if cached, whatever its UID.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.store.get(&ObjectRef::new(name).within(namespace))
    }

    /// The pod `namespace/name` whose UID is `uid` (a sandbox's pod), if cached: a pod of
    /// that name with another UID is another pod (deleted and created again) and is not
    /// returned. A static pod's API copy (mirror) has a UID of its own and carries the
    /// kubelet's, which the sandbox has, in `kubernetes.io/config.mirror`.
    pub fn pod(&self, namespace: &str, name: &str, uid: &str) -> Option<Arc<Pod>> {
        self.get(namespace, name).filter(|p| is_that_pod(p, uid))
    }

    /// The current annotations of `namespace/name` with that `uid` (when given), and
    /// the facts of its spec the profiles read.
    pub fn annotations(
        &self,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
    ) -> Option<(BTreeMap<String, String>, PodFacts)> {
        let pod = match uid.filter(|u| !u.is_empty()) {
            Some(uid) => self.pod(namespace, name, uid)?,
            None => self.get(namespace, name)?,
        };
        Some((
            pod.metadata.annotations.clone().unwrap_or_default(),
            pod_facts(&pod),
        ))
    }

    /// The agent socket's answer about `pod` from this cache.
    pub fn answer(&self, pod: &PodRef) -> Response {
        if !self.is_synced() {
            return Response::Undecided {
                v: PROTOCOL_VERSION,
                reason: "the agent's pod cache has not synced with the Kubernetes API yet".into(),
            };
        }
        match self.get(&pod.namespace, &pod.name) {
            Some(p)
                if uid_matches(pod.uid.as_deref(), p.metadata.uid.as_deref())
                    || pod.uid.as_deref().is_some_and(|u| is_that_pod(&p, u)) =>
            {
                Response::Found {
                    v: PROTOCOL_VERSION,
                    uid: p.metadata.uid.clone(),
                    annotations: p.metadata.annotations.clone().unwrap_or_default(),
                    facts: Some(pod_facts(&p)),
                    noted: false,
                }
            }
            // A pod is bound to this node before its sandbox is created, so a synced cache
            // without it is authoritative.
            _ => Response::NotFound {
                v: PROTOCOL_VERSION,
            },
        }
    }
}

/// The facts of `pod`'s spec the mesh profiles read
/// ([`interlock_contract::pod`]): every container's name, and for the proxy containers
/// their own `runAsUser`/`runAsGroup`, the literal values of the variables profiles read,
/// and their first arguments; the labels profiles read.
pub fn pod_facts(pod: &Pod) -> PodFacts {
    use interlock_contract::pod::{POD_LABELS, PROXY_ARGS, PROXY_ENV};
    let labels = pod
        .metadata
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| POD_LABELS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let Some(spec) = &pod.spec else {
        return PodFacts {
            labels,
            containers: Vec::new(),
        };
    };
    let of = |c: &k8s_openapi::api::core::v1::Container, init: bool| {
        let mut f = ContainerFacts::named(c.name.clone(), init);
        if f.is_proxy() {
            let sc = c.security_context.as_ref();
            f.run_as_user = sc.and_then(|s| s.run_as_user);
            f.run_as_group = sc.and_then(|s| s.run_as_group);
            f.env = c
                .env
                .iter()
                .flatten()
                .filter(|e| PROXY_ENV.contains(&e.name.as_str()))
                .filter_map(|e| e.value.clone().map(|v| (e.name.clone(), v)))
                .collect();
            f.args = c.args.iter().flatten().take(PROXY_ARGS).cloned().collect();
        }
        f
    };
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| of(c, true))
        .chain(spec.containers.iter().map(|c| of(c, false)))
        .collect();
    PodFacts { labels, containers }
}

fn uid_matches(want: Option<&str>, have: Option<&str>) -> bool {
    match (want, have) {
        (Some(w), Some(h)) => w.is_empty() || w == h,
        _ => true,
    }
}

/// The annotation the kubelet puts on the API copy (mirror) of a static pod.
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Whether `pod` is the pod with UID `uid` as the runtime knows it: its own UID, or for a
/// mirror pod the static pod's UID it carries.
pub fn is_that_pod(pod: &Pod, uid: &str) -> bool {
    let own = pod.metadata.uid.as_deref() == Some(uid);
    let mirror = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(MIRROR_POD_ANNOTATION))
        .is_some_and(|h| h == uid);
    own || mirror
}

/// The reference an Event about the pod `namespace/name` with UID `uid` carries: always
/// the sandbox's pod, never whichever pod now has that name.
pub fn pod_reference(namespace: &str, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(namespace.to_string()),
        name: Some(name.to_string()),
        uid: Some(uid.to_string()),
        ..Default::default()
    }
}

/// The pod an action is about: its namespace, name and UID (a pod deleted and created
/// again under the same name is another pod; a restart's new sandbox is the same pod).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodKey {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
}

impl std::fmt::Display for PodKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} (uid {})", self.namespace, self.name, self.uid)
    }
}

/// What the agent holds of the cluster when it runs with a Kubernetes API: the pod cache
/// (current annotations for the audit and the agent socket) and the pod actions (label,
/// Events, delete, evict).
#[derive(Clone)]
pub struct Cluster {
    /// The pods on this node.
    pub pods: PodCache,
    /// Acting on them.
    pub actions: Arc<PodActions>,
}

/// Acting on pods: the `unprotected` label, Events, delete and evict.
pub struct PodActions {
    client: Client,
    recorder: Recorder,
}

/// The outcome of an eviction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Evicted {
    /// The eviction was accepted.
    Done,
    /// A PodDisruptionBudget blocked it every time within the retry budget (never turned
    /// into a delete).
    Blocked(String),
}

impl PodActions {
    /// Actions through `client`, reporting as the agent of `node`.
    pub fn new(client: Client, node: &str) -> PodActions {
        PodActions {
            recorder: recorder(client.clone(), node),
            client,
        }
    }

    /// Sets or removes `interlock.dev/unprotected=true` on the pod `namespace/name`
    /// whose UID is `uid`, only when its labels differ: `current` are its labels from the
    /// cache; `None` (not cached yet) reads the pod first. The patch carries the UID,
    /// which the API server checks: a pod created again under that name is refused
    /// (409), never labelled.
    pub async fn label(
        &self,
        pod: &PodKey,
        current: Option<&BTreeMap<String, String>>,
        unprotected: bool,
    ) -> Result<bool, KubeError> {
        let (namespace, name) = (&pod.namespace, &pod.name);
        let api = Api::<Pod>::namespaced(self.client.clone(), namespace);
        let read;
        let current = match current {
            Some(c) => Some(c),
            None => {
                read = bounded(|| format!("reading pod {namespace}/{name}"), api.get(name)).await?;
                if !is_that_pod(&read, &pod.uid) {
                    return Err(KubeError {
                        doing: format!("labelling pod {pod}"),
                        source: ApiFailure::OtherPod(read.metadata.uid.clone().unwrap_or_default()),
                    });
                }
                read.metadata.labels.as_ref()
            }
        };
        let has = current
            .and_then(|l| l.get(LABEL_UNPROTECTED))
            .is_some_and(|v| v == "true");
        if has == unprotected {
            return Ok(false);
        }
        let value = if unprotected {
            json!("true")
        } else {
            json!(null)
        };
        let patch = json!({"metadata": {"uid": pod.uid, "labels": {LABEL_UNPROTECTED: value}}});
        bounded(
            || format!("labelling pod {pod}"),
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)),
        )
        .await?;
        Ok(true)
    }

    /// Publishes an Event on the pod `pod` (by its UID; de-duplicated into a series by the
    /// recorder).
    pub async fn event(&self, pod: &PodKey, warning: bool, reason: &str, note: &str) {
        let type_ = if warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        let reference = pod_reference(&pod.namespace, &pod.name, &pod.uid);
        publish(&self.recorder, type_, reason, note, &reference).await;
    }

    /// Deletes the pod, only if it is still the one with `pod.uid`.
    pub async fn delete(&self, pod: &PodKey) -> Result<(), KubeError> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(pod.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        bounded(
            || format!("deleting pod {pod}"),
            Api::<Pod>::namespaced(self.client.clone(), &pod.namespace).delete(&pod.name, &params),
        )
        .await?;
        Ok(())
    }

    /// Evicts the pod through the Eviction subresource (PodDisruptionBudgets apply), only
    /// if it is still the one with `pod.uid`. A 429 is retried with back-off up to
    /// `budget`, then reported — never turned into a delete.
    ///
    /// The Eviction is built here: kube-core's `evict` sends its options under
    /// `delete_options`, a field the API server does not know and drops, so a UID
    /// precondition passed through `EvictParams` never reaches it.
    pub async fn evict(&self, pod: &PodKey, budget: Duration) -> Result<Evicted, KubeError> {
        let deadline = Instant::now() + budget;
        let mut wait = Duration::from_millis(200);
        let body = eviction_body(pod);
        loop {
            let url = format!(
                "/api/v1/namespaces/{}/pods/{}/eviction",
                pod.namespace, pod.name
            );
            let request = http::Request::post(url)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(body.clone())
                .map_err(|e| KubeError {
                    doing: format!("evicting pod {pod}"),
                    source: ApiFailure::Client(kube::Error::HttpError(e)),
                })?;
            let sent = bounded(
                || format!("evicting pod {pod}"),
                self.client.request::<serde_json::Value>(request),
            )
            .await;
            match sent {
                Ok(_) => return Ok(Evicted::Done),
                Err(KubeError {
                    source: ApiFailure::Client(kube::Error::Api(e)),
                    ..
                }) if e.code == 429 => {
                    if Instant::now() + wait > deadline {
                        return Ok(Evicted::Blocked(e.message));
                    }
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// The Eviction the agent sends for `pod` (policy/v1): its UID as a precondition.
pub fn eviction_body(pod: &PodKey) -> Vec<u8> {
    json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod.name, "namespace": pod.namespace},
        "deleteOptions": {"preconditions": {"uid": pod.uid}},
    })
    .to_string()
    .into_bytes()
}

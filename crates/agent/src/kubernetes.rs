//! The agent's Kubernetes side, on kube-rs: the client, the node's gate (startup taint and
//! `InterlockReady` condition, see [`crate::gating`] for the decisions), the cache of the
//! pods on this node (one watch, field-selected to `spec.nodeName`: API load per node stays
//! constant however large the cluster), the `interlock.dev/unprotected` label, Events, and
//! the delete and evict repairs.
//!
//! Every write is a change: the node is read, the edit computed, and nothing is sent when
//! the node already says it. Taint edits carry the `resourceVersion` they were computed
//! from (a precondition: a stale list is refused with 409 instead of dropping another
//! component's taint) and are recomputed from a fresh read on conflict.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use interlock_contract::agent_socket::{PodRef, Response, PROTOCOL_VERSION};
use interlock_contract::names::{EVENTS_REPORTER, LABEL_UNPROTECTED};
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, EvictParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource};
use serde_json::json;

use crate::gating::{condition_edit, taints_edit, Debounce, NodeState, TaintEffect};

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
    /// The client's error.
    #[source]
    pub source: kube::Error,
}

fn ctx(doing: impl FnOnce() -> String) -> impl FnOnce(kube::Error) -> KubeError {
    move |source| KubeError {
        doing: doing(),
        source,
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
        let kc = kube::config::Kubeconfig::read_from(&path)
            .map_err(|e| format!("kubeconfig {path}: {e}"))?;
        let c = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .map_err(|e| format!("kubeconfig {path}: {e}"))?;
        (c, Credentials::Kubeconfig(path))
    };
    let client = Client::try_from(config).map_err(|e| format!("{creds}: {e}"))?;
    Ok(Some((client, creds)))
}

/// The node's taint and condition, kept in step with the agent's readiness.
pub struct NodeGate {
    nodes: Api<Node>,
    name: String,
    effect: TaintEffect,
    debounce: Debounce,
    shown: Option<bool>,
    recorder: Recorder,
}

/// What one [`NodeGate::observe`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GateWrites {
    /// The taint list was written.
    pub taints: bool,
    /// The condition was written.
    pub condition: bool,
    /// When to call again (a loss younger than the debounce is pending).
    pub again_at: Option<Instant>,
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
            recorder: recorder(client),
        }
    }

    /// Feeds the agent's readiness; writes the taint and condition when they must change
    /// (and an Event when protection is lost or restored).
    pub async fn observe(
        &mut self,
        current: NodeState,
        now: Instant,
    ) -> Result<GateWrites, KubeError> {
        let (shown, again_at) = self.debounce.observe(current, now);
        let mut writes = self.converge(&shown).await?;
        writes.again_at = again_at;
        if let Some(was) = self.shown.replace(shown.ready) {
            if was != shown.ready {
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
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(self.name.clone()),
            uid: Some(self.name.clone()),
            ..Default::default()
        };
        publish(&self.recorder, type_, reason, note, &reference).await;
    }

    /// Reads the node and writes what differs from `want`.
    async fn converge(&self, want: &NodeState) -> Result<GateWrites, KubeError> {
        let mut writes = GateWrites::default();
        for attempt in 0..=CONFLICT_RETRIES {
            let node = self
                .nodes
                .get(&self.name)
                .await
                .map_err(ctx(|| format!("reading node {}", self.name)))?;
            if !writes.condition {
                let current = node
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .and_then(|cs| {
                        cs.iter()
                            .find(|c| c.type_ == interlock_contract::names::CONDITION_READY)
                    });
                if let Some(cond) =
                    condition_edit(current, want, Time(k8s_openapi::jiff::Timestamp::now()))
                {
                    // Conditions merge by `type` in a strategic merge patch: no precondition
                    // is needed, nobody else's condition is touched.
                    let patch = json!({"status": {"conditions": [cond]}});
                    self.nodes
                        .patch_status(
                            &self.name,
                            &PatchParams::default(),
                            &Patch::Strategic(&patch),
                        )
                        .await
                        .map_err(ctx(|| {
                            format!("writing condition InterlockReady on node {}", self.name)
                        }))?;
                    writes.condition = true;
                }
            }
            let taints = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default();
            let Some(next) = taints_edit(&taints, want.ready, self.effect) else {
                return Ok(writes);
            };
            // A merge patch replaces the list whole; the resourceVersion makes it apply only
            // to the node it was computed from.
            let patch = json!({
                "metadata": {"resourceVersion": node.metadata.resource_version},
                "spec": {"taints": next},
            });
            match self
                .nodes
                .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    writes.taints = true;
                    return Ok(writes);
                }
                Err(kube::Error::Api(e)) if e.code == 409 && attempt < CONFLICT_RETRIES => {
                    tracing::debug!(node = %self.name, "taint edit conflicted; reading the node again");
                }
                Err(e) => {
                    return Err(KubeError {
                        doing: format!("writing the taints of node {}", self.name),
                        source: e,
                    })
                }
            }
        }
        unreachable!("the loop returns on its last attempt")
    }
}

fn recorder(client: Client) -> Recorder {
    Recorder::new(
        client,
        Reporter {
            controller: EVENTS_REPORTER.to_string(),
            instance: std::env::var("NODE_NAME").ok(),
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
    if let Err(e) = recorder.publish(&event, reference).await {
        tracing::warn!(reason, error = %e, "cannot publish a Kubernetes Event");
    }
}

/// The pods on this node, from one field-selected watch.
#[derive(Clone)]
pub struct PodCache {
    store: Store<Pod>,
    synced: Arc<AtomicBool>,
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
        let cache = PodCache {
            store: store.clone(),
            synced: synced.clone(),
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
                .for_each(|event| async move {
                    if let Err(e) = event {
                        tracing::warn!(error = %e, "pod watch failed; it retries with back-off");
                    }
                })
                .await;
        };
        (cache, run)
    }

    /// Whether the first list has been received (before, answers are not authoritative).
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// The pod `namespace/name`, if cached.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.store.get(&ObjectRef::new(name).within(namespace))
    }

    /// The current annotations of `namespace/name` with that `uid` (when given).
    pub fn annotations(
        &self,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
    ) -> Option<BTreeMap<String, String>> {
        let pod = self.get(namespace, name)?;
        if let (Some(want), Some(have)) = (uid, pod.metadata.uid.as_deref()) {
            if !want.is_empty() && want != have {
                return None;
            }
        }
        Some(pod.metadata.annotations.clone().unwrap_or_default())
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
            Some(p) if uid_matches(pod.uid.as_deref(), p.metadata.uid.as_deref()) => {
                Response::Found {
                    v: PROTOCOL_VERSION,
                    uid: p.metadata.uid.clone(),
                    annotations: p.metadata.annotations.clone().unwrap_or_default(),
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

fn uid_matches(want: Option<&str>, have: Option<&str>) -> bool {
    match (want, have) {
        (Some(w), Some(h)) => w.is_empty() || w == h,
        _ => true,
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
    /// Actions through `client`.
    pub fn new(client: Client) -> PodActions {
        PodActions {
            recorder: recorder(client.clone()),
            client,
        }
    }

    /// Sets or removes `interlock.dev/unprotected=true` on the pod, only when its current
    /// labels (`current`, from the cache) differ.
    pub async fn label(
        &self,
        namespace: &str,
        name: &str,
        current: Option<&BTreeMap<String, String>>,
        unprotected: bool,
    ) -> Result<bool, KubeError> {
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
        let patch = json!({"metadata": {"labels": {LABEL_UNPROTECTED: value}}});
        Api::<Pod>::namespaced(self.client.clone(), namespace)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(ctx(|| format!("labelling pod {namespace}/{name}")))?;
        Ok(true)
    }

    /// Publishes an Event on a pod (de-duplicated into a series by the recorder).
    pub async fn event(&self, pod: &Pod, warning: bool, reason: &str, note: &str) {
        let type_ = if warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        publish(&self.recorder, type_, reason, note, &pod.object_ref(&())).await;
    }

    /// Deletes the pod, only if it is still the one with `uid`.
    pub async fn delete(&self, namespace: &str, name: &str, uid: &str) -> Result<(), KubeError> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        Api::<Pod>::namespaced(self.client.clone(), namespace)
            .delete(name, &params)
            .await
            .map_err(ctx(|| format!("deleting pod {namespace}/{name}")))?;
        Ok(())
    }

    /// Evicts the pod through the Eviction subresource (PodDisruptionBudgets apply). A 429
    /// is retried with back-off up to `budget`, then reported — never turned into a
    /// delete.
    pub async fn evict(
        &self,
        namespace: &str,
        name: &str,
        budget: Duration,
    ) -> Result<Evicted, KubeError> {
        let api = Api::<Pod>::namespaced(self.client.clone(), namespace);
        let deadline = Instant::now() + budget;
        let mut wait = Duration::from_millis(200);
        loop {
            match api.evict(name, &EvictParams::default()).await {
                Ok(_) => return Ok(Evicted::Done),
                Err(kube::Error::Api(e)) if e.code == 429 => {
                    if Instant::now() + wait > deadline {
                        return Ok(Evicted::Blocked(e.message));
                    }
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
                Err(e) => {
                    return Err(KubeError {
                        doing: format!("evicting pod {namespace}/{name}"),
                        source: e,
                    })
                }
            }
        }
    }
}

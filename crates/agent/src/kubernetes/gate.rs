//! The node's gate, the thin layer: the node's taint and `InterlockReady` condition kept
//! in step with the agent's readiness ([`super::gating`] decides what they say).
//!
//! Every write is a change: the node is read, the edit computed, and nothing is sent when
//! the node already says it. Taint edits carry the `resourceVersion` they were computed
//! from (a precondition: a stale list is refused with 409 instead of dropping another
//! component's taint) and are recomputed from a fresh read on conflict.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use interlock_contract::names::CONDITION_READY;
use k8s_openapi::api::core::v1::{Node, NodeCondition, ObjectReference, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use serde_json::json;

use super::gating::{
    condition_edit, node_state, taints_edit, Debounce, NodeState, TaintEffect, REASON_NOT_EFFECTIVE,
};
use super::{bounded, publish, recorder, KubeError};
use crate::health::shared::Shared;

/// How many times a taint edit is recomputed after a conflict before giving up until the
/// next change.
const CONFLICT_RETRIES: usize = 5;

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

    /// Publishes `ConfigFight` on the node (another writer keeps undoing interlock's
    /// config: a fight, with the primary named and what to do).
    pub async fn config_fight(&self, message: &str) {
        self.event(EventType::Warning, "ConfigFight", message).await;
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
/// guard reports takeovers, and `ConfigFight` once per fight. API failures are logged and retried with back-off; they never
/// reach the guard.
pub async fn run_gate(mut gate: NodeGate, client: Client, shared: Arc<Shared>, resync: Duration) {
    let mut readiness = shared.watch_readiness();
    let mut takeovers = shared.watch_takeovers();
    takeovers.mark_unchanged();
    // A fight that started before the gate did is published too.
    let mut fights = shared.watch_fights();
    if fights.borrow().is_some() {
        fights.mark_changed();
    }
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
                    tracing::warn!(error = %e, retry_in_seconds = wait.as_secs_f64(), "cannot update the node's taint and condition; retrying");
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
            r = fights.changed() => {
                if r.is_err() {
                    return;
                }
                let latest = fights.borrow_and_update().clone();
                if let Some(f) = latest {
                    gate.config_fight(&f.message).await;
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

//! The agent's Kubernetes side, on kube-rs. This file is the client (every call bounded
//! by [`API_DEADLINE`], no retries inside the client), the Events the agent publishes,
//! and [`start`], which runs the rest as tokio tasks:
//!
//! - [`gate`]: the node's gate, the startup taint and `InterlockReady` condition kept in
//!   step with readiness; [`gating`] makes its decisions (pure);
//! - [`pods`]: the cache of the pods on this node (one watch, field-selected to
//!   `spec.nodeName`: API load per node stays constant however large the cluster);
//! - [`actions`]: what the audit does to pods through the API: the
//!   `interlock.dev/unprotected` label, Events, and the delete and evict repairs;
//! - [`owner`]: on SIGTERM under uninstall-on-exit `when-deleted`, whether the agent's
//!   DaemonSet is going away ([`owner::decide`] is pure).

pub mod actions;
pub mod gate;
pub mod gating;
pub mod owner;
pub mod pods;

use std::sync::Arc;
use std::time::Duration;

use interlock_contract::names::EVENTS_REPORTER;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::Client;

use crate::health::shared::Shared;
use actions::PodActions;
use gate::{run_gate, NodeGate};
use gating::TaintEffect;
use pods::PodCache;

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
        actions: Arc::new(PodActions::new(client.clone(), &settings.node)),
        client,
    }
}

/// What the agent holds of the cluster when it runs with a Kubernetes API: the pod cache
/// (current annotations for the audit and the agent socket), the pod actions (label,
/// Events, delete, evict), and the client (the exit check, [`owner`]).
#[derive(Clone)]
pub struct Cluster {
    /// The pods on this node.
    pub pods: PodCache,
    /// Acting on them.
    pub actions: Arc<PodActions>,
    /// The API client everything above uses.
    pub client: Client,
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
            deadline_seconds = API_DEADLINE.as_secs_f64(),
            "cannot publish a Kubernetes Event: no answer within the deadline"
        ),
    }
}

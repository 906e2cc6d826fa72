//! The pods on this node, from one watch field-selected to `spec.nodeName` (API load per
//! node stays constant however large the cluster), and how a pod is known: [`PodKey`],
//! and [`is_that_pod`] for a static pod's API copy.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::StreamExt;
use interlock_contract::agent_socket::{PodRef, Response, PROTOCOL_VERSION};
use interlock_contract::pod::{ContainerFacts, PodFacts};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;

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

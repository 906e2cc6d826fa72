//! Acting on pods for the audit: the `interlock.dev/unprotected` label, Events, and the
//! delete and evict repairs, each bound to the pod's UID.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use interlock_contract::names::LABEL_UNPROTECTED;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::{EventType, Recorder};
use kube::Client;
use serde_json::json;

use super::pods::{is_that_pod, PodKey};
use super::{bounded, publish, recorder, ApiFailure, KubeError};

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

//! The agent's Kubernetes side through the real kube client against the fake API server
//! (`interlock_testkit_node::kubeapi`): node gating (taint, condition, debounce, concurrent
//! edits), the pod cache and its watch, labels, Events, delete and evict, the load it
//! causes, and the RBAC verbs its requests need.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use interlock_agent::health::shared::{FileConflict, Readiness, Shared};
use interlock_agent::kubernetes::actions::{Evicted, PodActions};
use interlock_agent::kubernetes::gate::NodeGate;
use interlock_agent::kubernetes::gating::{NodeState, TaintEffect, LOSS_DEBOUNCE};
use interlock_agent::kubernetes::pods::{PodCache, PodKey};
use interlock_agent::kubernetes::{self, owner, KubeSettings};
use interlock_contract::agent_socket::{PodRef, Response};
use interlock_contract::names::{CONDITION_READY, LABEL_UNPROTECTED, TAINT_NOT_READY};
use interlock_testkit_node::kubeapi::{KubeApi, RequestRecord, CLIENT_HEADER};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Value};

async fn client(api: &KubeApi, id: &str) -> kube::Client {
    let dir = interlock_testkit::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    api.write_kubeconfig(&path).unwrap();
    let mut config = kubernetes::config_from_kubeconfig(path.to_str().unwrap())
        .await
        .unwrap();
    config.headers.push((
        hyper::header::HeaderName::from_static(CLIENT_HEADER),
        hyper::header::HeaderValue::from_str(id).unwrap(),
    ));
    kube::Client::try_from(config).unwrap()
}

fn node(name: &str, taints: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
           "spec": {"taints": taints},
           "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"}]}})
}

/// The key of the stored pod `ns/name` (its UID as the API stamped it).
fn key(api: &KubeApi, ns: &str, name: &str) -> PodKey {
    let p = api.get_object("pods", ns, name).unwrap();
    PodKey {
        namespace: ns.into(),
        name: name.into(),
        uid: p["metadata"]["uid"].as_str().unwrap().into(),
    }
}

fn pod(ns: &str, name: &str, node: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": ns, "labels": {"app": "web"},
                        "annotations": {"sidecar.istio.io/status": "{}"}},
           "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
           "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})
}

fn ready(yes: bool) -> NodeState {
    NodeState {
        ready: yes,
        reason: if yes {
            "ConfigEffective"
        } else {
            "ConfigNotEffective"
        }
        .into(),
        message: if yes { "ok" } else { "lost" }.into(),
    }
}

fn readiness(yes: bool, reason: &str) -> Readiness {
    Readiness {
        ready: yes,
        reason: reason.into(),
        effective: yes.then(|| "00-interlock.conflist".into()),
    }
}

fn taint_keys(api: &KubeApi, name: &str) -> Vec<String> {
    api.get_object("nodes", "", name).unwrap()["spec"]["taints"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|t| t["key"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

fn condition(api: &KubeApi, name: &str) -> Option<Value> {
    api.get_object("nodes", "", name).unwrap()["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == CONDITION_READY)
        .cloned()
}

fn writes(reqs: &[RequestRecord]) -> Vec<String> {
    reqs.iter()
        .filter(|r| r.method != "GET")
        .map(|r| format!("{} {} {}", r.method, r.path, r.status))
        .collect()
}

/// Waits until the agent's writes of the step before have all arrived (none for 500 ms;
/// at most 10 s): on a loaded machine an Event of that step can land after its taint.
async fn writes_settled(api: &KubeApi) {
    let end = Instant::now() + Duration::from_secs(10);
    let mut seen = writes(&api.requests()).len();
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = writes(&api.requests()).len();
        if now == seen {
            return;
        }
        seen = now;
    }
}

async fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < end, "timed out after {timeout:?}: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn settings(node: &str, resync: Duration) -> KubeSettings {
    KubeSettings {
        node: node.into(),
        effect: TaintEffect::NoSchedule,
        resync,
    }
}

/// The gate, run from readiness changes as the agent runs it: the startup taint stays
/// while starting, goes on ready, stays through a loss shorter than the debounce, and
/// comes back (with the condition False) after a longer one.
#[tokio::test(flavor = "multi_thread")]
async fn taint_goes_on_ready_and_returns_only_after_the_debounce() {
    let api = KubeApi::start().unwrap();
    api.put_object(node("n1", json!([{"key": TAINT_NOT_READY, "effect": "NoSchedule"}, {"key": "gpu", "effect": "NoSchedule"}])));
    let shared = Arc::new(Shared::default());
    let c = client(&api, "agent").await;
    let _cluster = kubernetes::start(c, &settings("n1", Duration::from_secs(10)), shared.clone());
    wait_for(
        "condition False while starting",
        Duration::from_secs(5),
        || {
            condition(&api, "n1")
                .is_some_and(|c| c["status"] == "False" && c["reason"] == "Starting")
        },
    )
    .await;
    assert_eq!(taint_keys(&api, "n1"), [TAINT_NOT_READY, "gpu"]);

    shared.set_readiness(readiness(true, "ok"));
    wait_for("taint removed", Duration::from_secs(5), || {
        taint_keys(&api, "n1") == ["gpu"]
    })
    .await;
    wait_for("condition True", Duration::from_secs(5), || {
        condition(&api, "n1")
            .is_some_and(|c| c["status"] == "True" && c["reason"] == "ConfigEffective")
    })
    .await;

    // A short loss (a clobber the guard repairs): nothing is written.
    writes_settled(&api).await;
    api.clear_requests();
    shared.set_readiness(readiness(
        false,
        "repairing: the effective config 10-calico.conflist lacks interlock-cni",
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    shared.set_readiness(readiness(true, "ok"));
    tokio::time::sleep(LOSS_DEBOUNCE + Duration::from_millis(500)).await;
    assert_eq!(
        writes(&api.requests()),
        Vec::<String>::new(),
        "a short loss wrote to the API"
    );
    assert_eq!(taint_keys(&api, "n1"), ["gpu"]);

    // A lasting loss: the taint and the condition come back after the debounce, not before.
    let lost = Instant::now();
    shared.set_readiness(readiness(
        false,
        "the effective config !first.conflist does not run interlock-cni",
    ));
    wait_for("taint back", LOSS_DEBOUNCE + Duration::from_secs(3), || {
        taint_keys(&api, "n1") == ["gpu", TAINT_NOT_READY]
    })
    .await;
    let after = lost.elapsed();
    assert!(
        after >= LOSS_DEBOUNCE - Duration::from_millis(50),
        "taint back after {after:?}, before the debounce"
    );
    // The condition write moves the node's resourceVersion: the taint edit after it
    // starts from the node that write returned, not from a self-inflicted 409.
    let conflicts: Vec<String> = api
        .requests()
        .iter()
        .filter(|r| r.status == 409)
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert!(conflicts.is_empty(), "{conflicts:?}");
    let c = condition(&api, "n1").unwrap();
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("False"), Some("ConfigNotEffective"))
    );
    assert!(c["message"].as_str().unwrap().contains("!first.conflist"));
    // ProtectionLost on the node, once; and ConfigTakenOver for the foreign file.
    wait_for("node Events", Duration::from_secs(3), || {
        let reasons: Vec<String> = api
            .objects("events")
            .iter()
            .map(|e| e["reason"].as_str().unwrap_or("").to_string())
            .collect();
        reasons.contains(&"ProtectionLost".to_string())
            && reasons.contains(&"ConfigTakenOver".to_string())
    })
    .await;
    for e in api.objects("events") {
        assert_eq!(e["regarding"]["kind"], "Node");
        assert_eq!(e["regarding"]["name"], "n1");
        assert_eq!(e["reportingController"], "interlock.dev/agent");
    }
    // Kubelet's own condition untouched.
    let conds = api.get_object("nodes", "", "n1").unwrap()["status"]["conditions"].clone();
    assert!(
        conds
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True"),
        "{conds}"
    );
}

/// Another component adds its taint between our read and our write: our write (with the
/// resourceVersion of the read) is refused with 409, we read again, and its taint stays.
#[tokio::test(flavor = "multi_thread")]
async fn another_components_taint_survives_a_concurrent_edit() {
    let api = KubeApi::start().unwrap();
    let mut n = node(
        "n1",
        json!([{"key": "a", "effect": "NoSchedule"}, {"key": TAINT_NOT_READY, "effect": "NoSchedule"}]),
    );
    // The condition already says ready: the only write is the taint list.
    n["status"]["conditions"].as_array_mut().unwrap().push(json!({"type": CONDITION_READY, "status": "True", "reason": "ConfigEffective", "message": "ok", "lastTransitionTime": "2026-01-01T00:00:00Z"}));
    let stored = api.put_object(n);
    let mut theirs = stored.clone();
    theirs["spec"]["taints"]
        .as_array_mut()
        .unwrap()
        .push(json!({"key": "b", "effect": "NoExecute"}));
    api.put_before_next("PATCH", "/api/v1/nodes/n1", theirs);
    let mut gate = NodeGate::new(client(&api, "agent").await, "n1", TaintEffect::NoSchedule);
    let w = gate
        .observe(ready(true), Instant::now(), None)
        .await
        .unwrap();
    assert!(w.taints && !w.condition, "{w:?}");
    assert_eq!(taint_keys(&api, "n1"), ["a", "b"]);
    let patches: Vec<(u16, Value)> = api
        .requests()
        .iter()
        .filter(|r| r.method == "PATCH")
        .map(|r| (r.status, r.json()))
        .collect();
    assert_eq!(patches.len(), 2, "{patches:?}");
    assert_eq!(patches[0].0, 409);
    assert_eq!(patches[1].0, 200);
    // Each carried the resourceVersion it was computed from.
    assert_ne!(
        patches[0].1["metadata"]["resourceVersion"],
        patches[1].1["metadata"]["resourceVersion"]
    );
    assert_eq!(
        patches[1].1["spec"]["taints"],
        json!([{"key": "a", "effect": "NoSchedule"}, {"key": "b", "effect": "NoExecute"}])
    );
}

/// InterlockReady: False then True then False, reason as given, lastTransitionTime moves
/// only when the status flips; a node already showing the state is not written.
#[tokio::test(flavor = "multi_thread")]
async fn condition_transitions_move_the_transition_time_only_on_flips() {
    let api = KubeApi::start().unwrap();
    api.put_object(node("n1", json!([])));
    let mut gate = NodeGate::new(client(&api, "agent").await, "n1", TaintEffect::None);
    let t0 = Instant::now();
    gate.observe(
        NodeState {
            ready: false,
            reason: "Starting".into(),
            message: "starting".into(),
        },
        t0,
        None,
    )
    .await
    .unwrap();
    let c1 = condition(&api, "n1").unwrap();
    assert_eq!(
        (
            c1["status"].as_str(),
            c1["reason"].as_str(),
            c1["message"].as_str()
        ),
        (Some("False"), Some("Starting"), Some("starting"))
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // Same status, other reason: rewritten, transition time kept.
    gate.observe(ready(false), t0, None).await.unwrap();
    let c2 = condition(&api, "n1").unwrap();
    assert_eq!(c2["reason"], "ConfigNotEffective");
    assert_eq!(c2["lastTransitionTime"], c1["lastTransitionTime"]);
    // Nothing new: no write.
    api.clear_requests();
    let w = gate.observe(ready(false), t0, None).await.unwrap();
    assert!(!w.condition && !w.taints, "{w:?}");
    assert_eq!(writes(&api.requests()), Vec::<String>::new());
    // Flip: True, new transition time; no taint with effect none.
    gate.observe(ready(true), t0, None).await.unwrap();
    let c3 = condition(&api, "n1").unwrap();
    assert_eq!(c3["status"], "True");
    assert_ne!(c3["lastTransitionTime"], c1["lastTransitionTime"]);
    assert_eq!(taint_keys(&api, "n1"), Vec::<String>::new());
    // A loss past the debounce: False again.
    gate.observe(ready(false), t0 + Duration::from_secs(10), None)
        .await
        .unwrap();
    let c4 = gate
        .observe(
            ready(false),
            t0 + Duration::from_secs(10) + LOSS_DEBOUNCE,
            None,
        )
        .await
        .unwrap();
    assert!(c4.condition);
    assert_eq!(condition(&api, "n1").unwrap()["status"], "False");
    // The kubelet's Ready condition survives every strategic merge.
    let conds = api.get_object("nodes", "", "n1").unwrap()["status"]["conditions"].clone();
    assert_eq!(conds.as_array().unwrap().len(), 2, "{conds}");
}

/// Someone removes our taint while the node is not ready: the node watch notices and the
/// gate puts it back, without waiting for a readiness change.
#[tokio::test(flavor = "multi_thread")]
async fn a_removed_taint_is_put_back_from_the_node_watch() {
    let api = KubeApi::start().unwrap();
    api.put_object(node("n1", json!([])));
    let shared = Arc::new(Shared::default());
    let _cluster = kubernetes::start(
        client(&api, "agent").await,
        &settings("n1", Duration::from_secs(600)),
        shared.clone(),
    );
    wait_for("startup taint", Duration::from_secs(5), || {
        taint_keys(&api, "n1") == [TAINT_NOT_READY]
    })
    .await;
    let mut n = api.get_object("nodes", "", "n1").unwrap();
    n["spec"]["taints"] = json!([{"key": "other", "effect": "NoSchedule"}]);
    api.put_object(n);
    wait_for("taint put back", Duration::from_secs(5), || {
        taint_keys(&api, "n1") == ["other", TAINT_NOT_READY]
    })
    .await;
}

/// The guard's conflict records become `ConfigTakenOver` Events on the node, de-duplicated
/// into a series.
#[tokio::test(flavor = "multi_thread")]
async fn takeovers_become_a_config_taken_over_series() {
    let api = KubeApi::start().unwrap();
    api.put_object(node("n1", json!([])));
    let shared = Arc::new(Shared::default());
    let _cluster = kubernetes::start(
        client(&api, "agent").await,
        &settings("n1", Duration::from_secs(600)),
        shared.clone(),
    );
    wait_for("startup taint", Duration::from_secs(5), || {
        taint_keys(&api, "n1") == [TAINT_NOT_READY]
    })
    .await;
    for undos in 1..=3 {
        shared.set_conflicts(vec![FileConflict {
            file: "10-calico.conflist".into(),
            undos,
            backing_off: false,
        }]);
        wait_for("ConfigTakenOver", Duration::from_secs(5), || {
            api.objects("events").iter().any(|e| {
                e["reason"] == "ConfigTakenOver"
                    && (undos == 1 || e["series"]["count"] == json!(undos))
            })
        })
        .await;
    }
    let events = api.objects("events");
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(events[0]["note"]
        .as_str()
        .unwrap()
        .contains("10-calico.conflist"));
}

/// A fight the guard starts becomes one `ConfigFight` Event on the node, with the
/// guard's message, even when it started before the node gate did.
#[tokio::test(flavor = "multi_thread")]
async fn a_fight_becomes_a_config_fight_event_on_the_node() {
    let api = KubeApi::start().unwrap();
    api.put_object(node("n1", json!([])));
    let shared = Arc::new(Shared::default());
    shared.fight_started(
        "00-interlock.conflist",
        "a fight: the runtime loads 05-cilium.conflist (cilium-cni) meanwhile",
    );
    let _cluster = kubernetes::start(
        client(&api, "agent").await,
        &settings("n1", Duration::from_secs(600)),
        shared.clone(),
    );
    wait_for("ConfigFight", Duration::from_secs(5), || {
        api.objects("events")
            .iter()
            .any(|e| e["reason"] == "ConfigFight")
    })
    .await;
    let events: Vec<_> = api
        .objects("events")
        .into_iter()
        .filter(|e| e["reason"] == "ConfigFight")
        .collect();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["type"], "Warning");
    assert_eq!(events[0]["regarding"]["kind"], "Node");
    assert!(events[0]["note"]
        .as_str()
        .unwrap()
        .contains("05-cilium.conflist (cilium-cni)"));
    assert!(shared
        .render_metrics()
        .contains("interlock_config_fights_total{file=\"00-interlock.conflist\"} 1"));
}

/// The pod watch: only this node's pods, every pod collection request field-selected to
/// it, the cache answering the agent socket, and recovery after 410 Gone.
#[tokio::test(flavor = "multi_thread")]
async fn pod_watch_is_node_scoped_and_recovers_after_410() {
    let api = KubeApi::start().unwrap();
    api.put_object(pod("ns", "a", "n1"));
    api.put_object(pod("ns", "b", "n2"));
    let (cache, run) = PodCache::start(client(&api, "agent").await, "n1");
    assert!(matches!(
        cache.answer(&PodRef {
            namespace: "ns".into(),
            name: "a".into(),
            uid: None
        }),
        Response::Undecided { .. }
    ));
    tokio::spawn(run);
    wait_for("synced", Duration::from_secs(5), || cache.is_synced()).await;
    let a = cache.get("ns", "a").expect("pod a cached");
    assert!(
        cache.get("ns", "b").is_none(),
        "a pod of another node was cached"
    );
    match cache.answer(&PodRef {
        namespace: "ns".into(),
        name: "a".into(),
        uid: a.metadata.uid.clone(),
    }) {
        Response::Found { annotations, .. } => {
            assert!(annotations.contains_key("sidecar.istio.io/status"))
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        cache.answer(&PodRef {
            namespace: "ns".into(),
            name: "a".into(),
            uid: Some("other".into())
        }),
        Response::NotFound { .. }
    ));
    assert!(matches!(
        cache.answer(&PodRef {
            namespace: "ns".into(),
            name: "b".into(),
            uid: None
        }),
        Response::NotFound { .. }
    ));

    // History compacted and the server restarted: the watch's resume gets 410, it
    // re-lists, and sees what changed meanwhile.
    let lists_before = api
        .requests()
        .iter()
        .filter(|r| r.path == "/api/v1/pods" && !r.is_watch())
        .count();
    api.stop();
    api.put_object(pod("ns", "c", "n1"));
    api.delete_object("pods", "ns", "a");
    api.resume(true);
    wait_for(
        "c cached and a gone after the re-list",
        Duration::from_secs(20),
        || cache.get("ns", "c").is_some() && cache.get("ns", "a").is_none(),
    )
    .await;
    let reqs = api.requests();
    assert!(
        reqs.iter()
            .any(|r| r.path == "/api/v1/pods" && r.status == 410)
            || reqs
                .iter()
                .filter(|r| r.path == "/api/v1/pods" && !r.is_watch())
                .count()
                > lists_before,
        "no 410 and no re-list: {:?}",
        reqs.iter()
            .map(|r| format!("{} {}?{} {}", r.method, r.path, r.query, r.status))
            .collect::<Vec<_>>()
    );
    // Every pod request was a collection request field-selected to this node.
    let pod_reqs: Vec<&RequestRecord> = reqs.iter().filter(|r| r.path.contains("/pods")).collect();
    assert!(pod_reqs.len() >= 3);
    for r in pod_reqs {
        assert_eq!(r.path, "/api/v1/pods", "{} {}", r.method, r.path);
        assert_eq!(
            r.param("fieldSelector"),
            Some("spec.nodeName=n1"),
            "{}?{}",
            r.path,
            r.query
        );
    }
}

/// The label goes on once, is not rewritten while the cache shows it, and comes off.
#[tokio::test(flavor = "multi_thread")]
async fn unprotected_label_is_added_and_removed_only_on_change() {
    let api = KubeApi::start().unwrap();
    api.put_object(pod("ns", "a", "n1"));
    let actions = PodActions::new(client(&api, "agent").await, "n1");
    let a = key(&api, "ns", "a");
    // Not cached: read first, then written.
    assert!(actions.label(&a, None, true).await.unwrap());
    let labels = api.get_object("pods", "ns", "a").unwrap()["metadata"]["labels"].clone();
    assert_eq!(labels, json!({"app": "web", LABEL_UNPROTECTED: "true"}));
    // The cache already shows it: nothing sent.
    api.clear_requests();
    let cached: std::collections::BTreeMap<String, String> =
        serde_json::from_value(labels).unwrap();
    assert!(!actions.label(&a, Some(&cached), true).await.unwrap());
    assert!(api.requests().is_empty());
    assert!(actions.label(&a, Some(&cached), false).await.unwrap());
    assert_eq!(
        api.get_object("pods", "ns", "a").unwrap()["metadata"]["labels"],
        json!({"app": "web"})
    );
    assert!(!actions.label(&a, None, false).await.unwrap());
    assert_eq!(
        writes(&api.requests()),
        ["PATCH /api/v1/namespaces/ns/pods/a 200"]
    );
}

/// redteam-3 M-2: the label and the Events are bound to the pod's UID. A pod created
/// again under the same name (another UID) is neither labelled (the patch carries the
/// UID, which the server checks, and an uncached read is compared first) nor named by
/// the Event.
#[tokio::test(flavor = "multi_thread")]
async fn the_label_and_events_only_reach_the_pod_with_that_uid() {
    let api = KubeApi::start().unwrap();
    api.put_object(pod("ns", "a", "n1"));
    let actions = PodActions::new(client(&api, "agent").await, "n1");
    let old = PodKey {
        uid: "uid-of-the-deleted-pod".into(),
        ..key(&api, "ns", "a")
    };
    // Uncached: read, found to be another pod, nothing written.
    let err = actions.label(&old, None, true).await.unwrap_err();
    assert!(err.to_string().contains("another pod"), "{err}");
    // Cached labels of the old pod: the server refuses the patch (UID precondition).
    let err = actions
        .label(&old, Some(&Default::default()), true)
        .await
        .unwrap_err();
    assert_eq!(err.source.code(), Some(409), "{err}");
    assert_eq!(
        api.get_object("pods", "ns", "a").unwrap()["metadata"]["labels"],
        json!({"app": "web"})
    );
    actions.event(&old, true, "Unprotected", "no rules").await;
    let events = api.objects("events");
    assert_eq!(events[0]["regarding"]["uid"], "uid-of-the-deleted-pod");
    assert_eq!(events[0]["regarding"]["name"], "a");
}

/// A repeated Event is one object whose series counts the repeats (a loop cannot flood
/// the API with objects).
#[tokio::test(flavor = "multi_thread")]
async fn repeated_events_become_one_series() {
    let api = KubeApi::start().unwrap();
    api.put_object(pod("ns", "a", "n1"));
    let actions = PodActions::new(client(&api, "agent").await, "n1");
    let p: Pod = serde_json::from_value(api.get_object("pods", "ns", "a").unwrap()).unwrap();
    let k = key(&api, "ns", "a");
    for _ in 0..5 {
        actions
            .event(&k, true, "Unprotected", "pod ns/a has no redirection rules")
            .await;
    }
    actions
        .event(&k, false, "Repaired", "rules re-applied")
        .await;
    let events = api.objects("events");
    assert_eq!(events.len(), 2, "{events:#?}");
    let unprotected = events
        .iter()
        .find(|e| e["reason"] == "Unprotected")
        .unwrap();
    assert_eq!(unprotected["series"]["count"], 5);
    assert_eq!(unprotected["type"], "Warning");
    assert_eq!(
        unprotected["regarding"]["uid"],
        p.metadata.uid.clone().unwrap()
    );
    assert_eq!(unprotected["reportingController"], "interlock.dev/agent");
    assert_eq!(unprotected["reportingInstance"], "interlock.dev/agent/n1");
    let reqs = api.requests();
    let posts = reqs.iter().filter(|r| r.method == "POST").count();
    let patches = reqs.iter().filter(|r| r.method == "PATCH").count();
    assert_eq!((posts, patches), (2, 4));
}

fn pdb(allowed: i64) -> Value {
    json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
           "metadata": {"name": "web-pdb", "namespace": "ns", "generation": 1},
           "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}},
           "status": {"observedGeneration": 1, "disruptionsAllowed": allowed, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1}})
}

/// Eviction blocked by a PodDisruptionBudget: retried with back-off, reported, and never
/// turned into a delete; once the budget allows it, the eviction goes through.
#[tokio::test(flavor = "multi_thread")]
async fn eviction_429_is_retried_and_never_becomes_a_delete() {
    let api = KubeApi::start().unwrap();
    api.put_object(pod("ns", "a", "n1"));
    api.put_object(pdb(0));
    let actions = PodActions::new(client(&api, "agent").await, "n1");
    let a = key(&api, "ns", "a");
    let out = actions.evict(&a, Duration::from_millis(700)).await.unwrap();
    match out {
        Evicted::Blocked(why) => assert!(why.contains("disruption budget"), "{why}"),
        other => panic!("{other:?}"),
    }
    let reqs = api.requests();
    let evictions = reqs
        .iter()
        .filter(|r| r.path.ends_with("/eviction"))
        .count();
    assert!(evictions >= 2, "not retried: {evictions}");
    assert!(
        reqs.iter().all(|r| r.method != "DELETE"),
        "{:?}",
        writes(&reqs)
    );
    assert!(reqs
        .iter()
        .filter(|r| r.path.ends_with("/eviction"))
        .all(|r| r.status == 429 && r.method == "POST"));
    assert!(api.get_object("pods", "ns", "a").is_some());
    api.put_object(pdb(1));
    assert_eq!(
        actions.evict(&a, Duration::from_secs(2)).await.unwrap(),
        Evicted::Done
    );
    assert!(api.wait_until(Duration::from_secs(2), |a| a
        .get_object("pods", "ns", "a")
        .is_none()));
}

/// redteam-3 M-2: the Eviction carries the pod's UID as a precondition
/// (`deleteOptions`, a body built by the agent): a pod created again under the same name
/// (another UID, maybe on another node) is not evicted. kube-core's own `evict` sends its
/// options as `delete_options`, which the API server (and the fake, like it) drops as an
/// unknown field, so the same precondition through `EvictParams` evicts the wrong pod.
#[tokio::test(flavor = "multi_thread")]
async fn eviction_only_evicts_the_pod_with_that_uid() {
    let api = KubeApi::start().unwrap();
    api.put_object(pod("ns", "a", "n2"));
    let client = client(&api, "agent").await;
    let actions = PodActions::new(client.clone(), "n1");
    let old = PodKey {
        uid: "uid-of-the-deleted-pod".into(),
        ..key(&api, "ns", "a")
    };
    let err = actions
        .evict(&old, Duration::from_secs(2))
        .await
        .unwrap_err();
    assert_eq!(err.source.code(), Some(409), "{err}");
    assert!(
        api.get_object("pods", "ns", "a").is_some(),
        "the wrong pod was evicted"
    );
    let sent = api
        .requests()
        .into_iter()
        .rfind(|r| r.path.ends_with("/eviction"))
        .unwrap();
    assert_eq!(
        sent.json()["deleteOptions"]["preconditions"]["uid"],
        "uid-of-the-deleted-pod"
    );
    // The same precondition through kube-core's EvictParams never reaches the server.
    let params = kube::api::EvictParams {
        delete_options: Some(kube::api::DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: Some("uid-of-the-deleted-pod".into()),
                resource_version: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    kube::Api::<Pod>::namespaced(client, "ns")
        .evict("a", &params)
        .await
        .unwrap();
    let sent = api
        .requests()
        .into_iter()
        .rfind(|r| r.path.ends_with("/eviction"))
        .unwrap();
    assert!(sent.json().get("delete_options").is_some(), "{}", sent.body);
    assert!(api.wait_until(Duration::from_secs(2), |a| a
        .get_object("pods", "ns", "a")
        .is_none()));
}

/// Delete carries the UID precondition: a pod recreated under the same name is not
/// deleted.
#[tokio::test(flavor = "multi_thread")]
async fn delete_only_deletes_the_pod_with_that_uid() {
    let api = KubeApi::start().unwrap();
    let stored = api.put_object(pod("ns", "a", "n1"));
    let actions = PodActions::new(client(&api, "agent").await, "n1");
    let not_it = PodKey {
        uid: "not-the-uid".into(),
        ..key(&api, "ns", "a")
    };
    let err = actions.delete(&not_it).await.unwrap_err();
    assert!(err.to_string().contains("deleting pod ns/a"), "{err}");
    assert_eq!(err.source.code(), Some(409), "{err}");
    assert!(api.get_object("pods", "ns", "a").is_some());
    actions.delete(&key(&api, "ns", "a")).await.unwrap();
    let del = api
        .requests()
        .into_iter()
        .rfind(|r| r.method == "DELETE")
        .unwrap();
    assert_eq!(
        del.json()["preconditions"]["uid"],
        stored["metadata"]["uid"]
    );
    assert!(api.wait_until(Duration::from_secs(2), |a| a
        .get_object("pods", "ns", "a")
        .is_none()));
}

/// Once the node shows the state and the pods are cached, nothing is sent: the resync
/// compares against the watched node (writes only on change, never on a timer).
#[tokio::test(flavor = "multi_thread")]
async fn nothing_is_sent_while_nothing_changes() {
    let api = KubeApi::start().unwrap();
    api.put_object(node(
        "n1",
        json!([{"key": TAINT_NOT_READY, "effect": "NoSchedule"}]),
    ));
    api.put_object(pod("ns", "a", "n1"));
    let shared = Arc::new(Shared::default());
    shared.set_readiness(readiness(true, "ok"));
    let cluster = kubernetes::start(
        client(&api, "agent").await,
        &settings("n1", Duration::from_millis(300)),
        shared.clone(),
    );
    wait_for("converged", Duration::from_secs(5), || {
        taint_keys(&api, "n1").is_empty()
            && condition(&api, "n1").is_some()
            && cluster.pods.is_synced()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    api.clear_requests();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let reqs = api.requests();
    assert!(
        reqs.is_empty(),
        "requests while nothing changed (10 resync periods): {:?}",
        reqs.iter()
            .map(|r| format!("{} {}?{}", r.method, r.path, r.query))
            .collect::<Vec<_>>()
    );
    // The two watches stay open.
    assert_eq!(api.active_watches(), 2);
}

/// RBAC verb of one request: (group, resource, verb), or None for a non-resource path.
fn rbac_of(r: &RequestRecord) -> Option<(String, String, String)> {
    let parts: Vec<&str> = r.path.trim_start_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api", "v1", rest @ ..] => (String::new(), rest.to_vec()),
        ["apis", g, _v, rest @ ..] => (g.to_string(), rest.to_vec()),
        _ => return None,
    };
    let rest = match rest.as_slice() {
        ["namespaces", _ns, tail @ ..] if !tail.is_empty() => tail.to_vec(),
        other => other.to_vec(),
    };
    let (resource, named) = match rest.as_slice() {
        [res] => (res.to_string(), false),
        [res, _name] => (res.to_string(), true),
        [res, _name, sub] => (format!("{res}/{sub}"), true),
        _ => return None,
    };
    let verb = match (r.method.as_str(), named) {
        ("GET", true) => "get",
        ("GET", false) if r.is_watch() => "watch",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PATCH", _) => "patch",
        ("PUT", _) => "update",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => return None,
    };
    Some((group, resource, verb.to_string()))
}

/// Every verb the agent's requests use is granted by `AGENT_RULES`, and every granted verb
/// is used: one scenario through every code path (gate, node and pod watches, label,
/// Events and their series, delete, evict).
#[tokio::test(flavor = "multi_thread")]
async fn requests_use_exactly_the_granted_rbac_verbs() {
    let api = KubeApi::start().unwrap();
    api.put_object(node(
        "n1",
        json!([{"key": TAINT_NOT_READY, "effect": "NoSchedule"}]),
    ));
    api.put_object(pod("ns", "a", "n1"));
    api.put_object(pod("ns", "b", "n1"));
    api.put_object(pdb(5));
    agent_objects(&api);
    let shared = Arc::new(Shared::default());
    let cluster = kubernetes::start(
        client(&api, "agent").await,
        &settings("n1", Duration::from_secs(1)),
        shared.clone(),
    );
    shared.set_readiness(readiness(true, "ok"));
    wait_for("ready node", Duration::from_secs(5), || {
        taint_keys(&api, "n1").is_empty() && cluster.pods.is_synced()
    })
    .await;
    shared.set_conflicts(vec![FileConflict {
        file: "10-calico.conflist".into(),
        undos: 1,
        backing_off: false,
    }]);
    // The second takeover must come after the first is published, or the two collapse.
    wait_for("first ConfigTakenOver", Duration::from_secs(5), || {
        api.objects("events")
            .iter()
            .any(|e| e["reason"] == "ConfigTakenOver")
    })
    .await;
    shared.set_conflicts(vec![FileConflict {
        file: "10-calico.conflist".into(),
        undos: 2,
        backing_off: false,
    }]);
    assert!(cluster.pods.get("ns", "a").is_some());
    let a = key(&api, "ns", "a");
    cluster.actions.label(&a, None, true).await.unwrap();
    cluster.actions.event(&a, true, "Unprotected", "x").await;
    cluster.actions.event(&a, true, "Unprotected", "x").await;
    cluster.actions.delete(&a).await.unwrap();
    assert_eq!(
        cluster
            .actions
            .evict(&key(&api, "ns", "b"), Duration::from_secs(1))
            .await
            .unwrap(),
        Evicted::Done
    );
    wait_for("node series", Duration::from_secs(5), || {
        api.objects("events")
            .iter()
            .any(|e| e["reason"] == "ConfigTakenOver" && e["series"]["count"] == 2)
    })
    .await;

    // The exit check of uninstall-on-exit `when-deleted`.
    assert!(matches!(
        owner::ask(cluster.client.clone(), AGENT_NS, "interlock-node-x").await,
        Ok(owner::ExitDecision::Keep(_))
    ));

    let used: BTreeSet<(String, String, String)> =
        api.requests().iter().filter_map(rbac_of).collect();
    // The evict policy's grant is rendered with it alone; this test uses every action.
    // The namespace's Role is the agent's own namespace only (a namespaced path).
    let granted: BTreeSet<(String, String, String)> = interlock_contract::rbac::AGENT_RULES
        .iter()
        .chain(interlock_contract::rbac::EVICT_RULES)
        .chain(interlock_contract::rbac::AGENT_NAMESPACE_RULES)
        .flat_map(|r| {
            r.resources.iter().flat_map(move |res| {
                r.verbs
                    .iter()
                    .map(move |v| (r.group.to_string(), res.to_string(), v.to_string()))
            })
        })
        .collect();
    let not_granted: Vec<_> = used.difference(&granted).collect();
    let not_used: Vec<_> = granted.difference(&used).collect();
    assert!(
        not_granted.is_empty(),
        "requests need verbs AGENT_RULES does not grant: {not_granted:?}"
    );
    assert!(
        not_used.is_empty(),
        "AGENT_RULES grants verbs no code path uses: {not_used:?}"
    );
    // `grants` is the default ClusterRole alone; the eviction is the evict policy's grant,
    // reading the DaemonSet the namespace's Role's.
    for (g, res, v) in &used {
        assert!(
            interlock_contract::rbac::grants(g, res, v)
                || (res == "pods/eviction" && v == "create")
                || (g == "apps" && res == "daemonsets" && v == "get"),
            "{g} {res} {v}"
        );
    }
    // Every DaemonSet read is in the agent's own namespace.
    for r in api
        .requests()
        .iter()
        .filter(|r| r.path.contains("/daemonsets"))
    {
        assert!(
            r.path
                .starts_with(&format!("/apis/apps/v1/namespaces/{AGENT_NS}/daemonsets/")),
            "{}",
            r.path
        );
    }
}

/// API failures are retried with back-off (not in a loop, not given up on): three
/// failed writes during a pending debounce, then the edit lands.
#[tokio::test(flavor = "multi_thread")]
async fn api_failures_are_retried_with_back_off() {
    let api = KubeApi::start().unwrap();
    api.put_object(node("n1", json!([])));
    let shared = Arc::new(Shared::default());
    shared.set_readiness(readiness(true, "ok"));
    let _cluster = kubernetes::start(
        client(&api, "agent").await,
        &settings("n1", Duration::from_secs(600)),
        shared.clone(),
    );
    wait_for("condition True", Duration::from_secs(5), || {
        condition(&api, "n1").is_some_and(|c| c["status"] == "True")
    })
    .await;
    api.fail_next_matching(interlock_testkit_node::kubeapi::FailRule {
        remaining: 3,
        code: 500,
        method: Some("PATCH".into()),
        path_contains: Some("/api/v1/nodes/n1".into()),
    });
    api.clear_requests();
    shared.set_readiness(readiness(
        false,
        "the effective config !first.conflist does not run interlock-cni",
    ));
    wait_for("the first failure", Duration::from_secs(10), || {
        api.requests().iter().any(|r| r.status == 500)
    })
    .await;
    let first_failure = Instant::now();
    wait_for(
        "taint back after the failures",
        Duration::from_secs(15),
        || taint_keys(&api, "n1") == [TAINT_NOT_READY],
    )
    .await;
    // The fake logs a request just after its change is stored: the taint can show
    // before its PATCH is in the log (the flake of `[500, 500, 500, 200]`), and the
    // ready state's own PATCH can land in the log after `clear_requests` (the flake of
    // `[200, 500, …]`). The fail rule is armed before readiness changes, so every write
    // of the new state starts with a 500: the log from the first 500 on is what counts.
    let node_patches = |api: &KubeApi| {
        api.requests()
            .iter()
            .filter(|r| r.method == "PATCH" && r.path.starts_with("/api/v1/nodes/n1"))
            .map(|r| r.status)
            .skip_while(|&s| s != 500)
            .collect::<Vec<u16>>()
    };
    wait_for(
        "the taint's PATCH in the log",
        Duration::from_secs(5),
        || node_patches(&api).len() >= 5,
    )
    .await;
    // Back-off of 0.4 + 0.8 + 1.6 s; a loop without it would be done in milliseconds.
    assert!(
        first_failure.elapsed() >= Duration::from_secs(1),
        "retried without back-off: {:?}",
        first_failure.elapsed()
    );
    let patches = node_patches(&api);
    // Three failures, then the condition and the taint: no busy loop in between.
    assert_eq!(patches, [500, 500, 500, 200, 200], "{patches:?}");
}

/// Readiness flipping back while the gate is still writing the previous state (its own
/// writes then come back through the node watch): the new state is written, every round.
/// (The node watch's wake-up used to consume the readiness change unseen, leaving a
/// ready node tainted until the next change.)
#[tokio::test(flavor = "multi_thread")]
async fn a_flip_back_during_the_gates_writes_is_not_lost() {
    let api = KubeApi::start().unwrap();
    api.put_object(node("n1", json!([])));
    let shared = Arc::new(Shared::default());
    shared.set_readiness(readiness(true, "ok"));
    let _cluster = kubernetes::start(
        client(&api, "agent").await,
        &settings("n1", Duration::from_secs(600)),
        shared.clone(),
    );
    wait_for("condition True", Duration::from_secs(5), || {
        condition(&api, "n1").is_some_and(|c| c["status"] == "True")
    })
    .await;
    for round in 0..4 {
        shared.set_readiness(readiness(
            false,
            "the effective config !first.conflist does not run interlock-cni",
        ));
        // Back to ready the moment the taint lands, while the gate publishes its Event.
        wait_for("tainted", Duration::from_secs(10), || {
            taint_keys(&api, "n1") == [TAINT_NOT_READY]
        })
        .await;
        shared.set_readiness(readiness(true, "ok"));
        wait_for(
            &format!("untainted in round {round}"),
            Duration::from_secs(5),
            || taint_keys(&api, "n1").is_empty(),
        )
        .await;
    }
}

/// The pod watch tells the sandbox audit when a pod on this node is added or changes
/// (so it audits at once, not at its next period), and stays quiet about other nodes.
#[tokio::test(flavor = "multi_thread")]
async fn pod_changes_on_this_node_wake_the_audit() {
    let api = KubeApi::start().unwrap();
    let (cache, run) = PodCache::start(client(&api, "agent").await, "n1");
    let changes = cache.changes();
    tokio::spawn(run);
    wait_for("synced", Duration::from_secs(5), || cache.is_synced()).await;
    // Whatever the first list signalled is consumed here.
    let _ = tokio::time::timeout(Duration::from_millis(200), changes.notified()).await;
    api.put_object(pod("ns", "elsewhere", "n2"));
    assert!(
        tokio::time::timeout(Duration::from_millis(500), changes.notified())
            .await
            .is_err(),
        "a pod of another node woke the audit"
    );
    api.put_object(pod("ns", "new", "n1"));
    tokio::time::timeout(Duration::from_secs(5), changes.notified())
        .await
        .expect("a new pod on this node wakes the audit");
}

const AGENT_NS: &str = "interlock-system";
const AGENT_DS: &str = "interlock-node";

fn daemonset() -> Value {
    json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
           "metadata": {"name": AGENT_DS, "namespace": AGENT_NS},
           "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": "interlock"}},
                    "template": {"metadata": {"labels": {"app.kubernetes.io/name": "interlock"}},
                                 "spec": {"containers": [{"name": "agent", "image": "i"}]}}}})
}

/// The agent's pod `name` on node n1, controlled by the DaemonSet of UID `ds_uid`.
fn agent_pod(name: &str, ds_uid: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": AGENT_NS,
                        "labels": {"app.kubernetes.io/name": "interlock"},
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                             "name": AGENT_DS, "uid": ds_uid,
                                             "controller": true, "blockOwnerDeletion": true}]},
           "spec": {"nodeName": "n1", "containers": [{"name": "agent", "image": "i"}]},
           "status": {"phase": "Running"}})
}

/// The agent's DaemonSet and its pod `interlock-node-x`.
fn agent_objects(api: &KubeApi) {
    let ds = api.put_object(daemonset());
    api.put_object(agent_pod(
        "interlock-node-x",
        ds["metadata"]["uid"].as_str().unwrap(),
    ));
}

/// A client with the agent's service account token (`agent-token`).
async fn token_client(api: &KubeApi) -> kube::Client {
    let dir = interlock_testkit::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    api.write_kubeconfig_with_token(&path, "agent-token")
        .unwrap();
    let config = kubernetes::config_from_kubeconfig(path.to_str().unwrap())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

async fn exit_check(api: &KubeApi) -> Result<owner::ExitDecision, String> {
    owner::ask(client(api, "agent").await, AGENT_NS, "interlock-node-x").await
}

fn uninstalls(d: &Result<owner::ExitDecision, String>, why: &str) -> bool {
    matches!(d, Ok(owner::ExitDecision::Uninstall(w)) if w.contains(why))
}

/// Uninstall-on-exit `when-deleted` asks the API through the real client: a DaemonSet that
/// stays keeps everything; one deleted in the foreground (`kubectl delete
/// --cascade=foreground`: it stays, with `deletionTimestamp` and the `foregroundDeletion`
/// finalizer, while its pods are deleted), one gone (404: the default background
/// deletion removes it before its pods), and one of the same name re-created (another
/// UID) each uninstall.
#[tokio::test(flavor = "multi_thread")]
async fn the_exit_check_uninstalls_only_when_the_daemonset_goes_away() {
    use k8s_openapi::api::apps::v1::DaemonSet;
    use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
    let api = KubeApi::start().unwrap();
    agent_objects(&api);
    let d = exit_check(&api).await;
    assert!(
        matches!(&d, Ok(owner::ExitDecision::Keep(w)) if w.contains("stays")),
        "{d:?}"
    );

    let c = client(&api, "admin").await;
    let dss = Api::<DaemonSet>::namespaced(c.clone(), AGENT_NS);
    dss.delete(AGENT_DS, &DeleteParams::foreground())
        .await
        .unwrap();
    let held = api.get_object("daemonsets", AGENT_NS, AGENT_DS).unwrap();
    assert!(held["metadata"]["deletionTimestamp"].is_string(), "{held}");
    assert_eq!(
        held["metadata"]["finalizers"],
        json!(["foregroundDeletion"])
    );
    let d = exit_check(&api).await;
    assert!(uninstalls(&d, "is being deleted"), "{d:?}");

    // The garbage collector has deleted the pods and drops its finalizer: the DaemonSet
    // is gone.
    dss.patch(
        AGENT_DS,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(api.get_object("daemonsets", AGENT_NS, AGENT_DS).is_none());
    let d = exit_check(&api).await;
    assert!(uninstalls(&d, "is gone from the API"), "{d:?}");

    // Re-created under the same name (a delete and apply): the pod's owner is gone all
    // the same.
    let again: DaemonSet = serde_json::from_value(daemonset()).unwrap();
    let again = dss.create(&PostParams::default(), &again).await.unwrap();
    let new_uid = again.metadata.uid.unwrap();
    let d = exit_check(&api).await;
    assert!(
        uninstalls(&d, &format!("another one (UID {new_uid})")),
        "{d:?}"
    );

    // A default (background) deletion removes the object at once.
    dss.delete(AGENT_DS, &DeleteParams::background())
        .await
        .unwrap();
    assert!(api.get_object("daemonsets", AGENT_NS, AGENT_DS).is_none());
}

/// When the API cannot tell, the exit check says why (the agent then keeps everything):
/// a token without the namespace's Role (403, naming the grant), a pod with no
/// DaemonSet owner, a pod already gone, an API that accepts the connection and never
/// answers (bounded by the deadline), and the Role of `AGENT_NAMESPACE_RULES` is enough.
#[tokio::test(flavor = "multi_thread")]
async fn the_exit_check_fails_with_a_reason_when_the_api_cannot_tell() {
    use interlock_testkit_node::kubeapi::UserInfo;
    let api = KubeApi::start().unwrap();
    agent_objects(&api);
    let rule = |r: &interlock_contract::rbac::Rule| json!({"apiGroups": [r.group], "resources": r.resources, "verbs": r.verbs});
    let subject = json!([{"kind": "ServiceAccount", "name": "interlock", "namespace": AGENT_NS}]);
    api.put_object(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "interlock-agent"},
        "rules": interlock_contract::rbac::AGENT_RULES.iter().map(rule).collect::<Vec<_>>()}),
    );
    api.put_object(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "interlock-agent"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "interlock-agent"},
        "subjects": subject.clone()}));
    api.add_token(
        "agent-token",
        UserInfo::service_account(AGENT_NS, "interlock", Some("n1")),
    );
    let e = owner::ask(token_client(&api).await, AGENT_NS, "interlock-node-x")
        .await
        .unwrap_err();
    assert!(
        e.contains("forbidden") && e.contains("apps/daemonsets") && e.contains("Role"),
        "{e}"
    );
    // The namespace's Role, as the manifests render it from the contract: enough.
    api.put_object(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "interlock-agent", "namespace": AGENT_NS},
        "rules": interlock_contract::rbac::AGENT_NAMESPACE_RULES.iter().map(rule).collect::<Vec<_>>()}));
    api.put_object(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "interlock-agent", "namespace": AGENT_NS},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "interlock-agent"},
        "subjects": subject}));
    let d = owner::ask(token_client(&api).await, AGENT_NS, "interlock-node-x").await;
    assert!(matches!(&d, Ok(owner::ExitDecision::Keep(_))), "{d:?}");

    // A pod not run by a DaemonSet, and a pod that is gone already.
    let mut lone = agent_pod("lone", "x");
    lone["metadata"]["ownerReferences"] = json!([]);
    api.put_object(lone);
    let e = owner::ask(client(&api, "agent").await, AGENT_NS, "lone")
        .await
        .unwrap_err();
    assert!(e.contains("not controlled by a DaemonSet"), "{e}");
    let e = owner::ask(client(&api, "agent").await, AGENT_NS, "gone")
        .await
        .unwrap_err();
    assert!(e.contains("gone from the API already"), "{e}");

    // An API that takes the connection and never answers: the deadline ends the wait.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dir = interlock_testkit::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    api.write_kubeconfig(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap().replace(
        &api.url(),
        &format!("http://{}", silent.local_addr().unwrap()),
    );
    std::fs::write(&path, text).unwrap();
    let config = kubernetes::config_from_kubeconfig(path.to_str().unwrap())
        .await
        .unwrap();
    let t0 = Instant::now();
    let e = owner::ask_within(
        kube::Client::try_from(config).unwrap(),
        AGENT_NS,
        "interlock-node-x",
        Duration::from_secs(1),
    )
    .await
    .unwrap_err();
    assert!(e.contains("did not answer within 1s"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
}

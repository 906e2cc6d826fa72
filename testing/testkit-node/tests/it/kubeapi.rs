//! The fake Kubernetes API server through a real HTTP client (hyper): every behaviour the
//! agent and CLI rely on, asserted by the content of responses, watch streams and the
//! stored objects.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use interlock_testkit_node::kubeapi::{Config, FailRule, KubeApi, CLIENT_HEADER};
use serde_json::{json, Value};
use std::time::Duration;

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn call(
    api: &KubeApi,
    method: &str,
    path: &str,
    ct: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(format!("{}{path}", api.url()))
        .header(CLIENT_HEADER, "test-client");
    if let Some(ct) = ct {
        req = req.header("content-type", ct);
    }
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let resp = client()
        .request(req.body(Full::new(Bytes::from(body))).unwrap())
        .await
        .expect("request");
    let code = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

async fn get(api: &KubeApi, path: &str) -> (u16, Value) {
    call(api, "GET", path, None, None).await
}

/// Opens a watch and returns its event stream as parsed lines.
struct Watch {
    body: hyper::body::Incoming,
    buf: Vec<u8>,
}

impl Watch {
    async fn open(api: &KubeApi, path: &str) -> Watch {
        let req = hyper::Request::get(format!("{}{path}", api.url()))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = client().request(req).await.expect("watch");
        assert_eq!(
            resp.status(),
            200,
            "a watch answers 200, errors come as events"
        );
        Watch {
            body: resp.into_body(),
            buf: Vec::new(),
        }
    }

    /// The next event, or `None` when the server ended the stream (or 5 s passed).
    async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                return Some(serde_json::from_slice(&line).expect("each line is one JSON event"));
            }
            match tokio::time::timeout(Duration::from_secs(5), self.body.frame()).await {
                Ok(Some(Ok(f))) => {
                    if let Ok(d) = f.into_data() {
                        self.buf.extend_from_slice(&d);
                    }
                }
                _ => return None,
            }
        }
    }

    async fn next_n(&mut self, n: usize) -> Vec<Value> {
        let mut out = Vec::new();
        while out.len() < n {
            match self.next().await {
                Some(e) => out.push(e),
                None => break,
            }
        }
        out
    }
}

fn node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"pool": "a"}},
           "spec": {"taints": [{"key": "other.io/x", "effect": "NoSchedule"}]},
           "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}})
}

fn pod(ns: &str, name: &str, node: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": {"app": "web"}},
           "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
           "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})
}

fn rv(v: &Value) -> u64 {
    v["metadata"]["resourceVersion"]
        .as_str()
        .expect("resourceVersion")
        .parse()
        .expect("integer")
}

#[tokio::test(flavor = "multi_thread")]
async fn create_get_list_and_conflicts() {
    let api = KubeApi::start().unwrap();
    let (code, created) = call(
        &api,
        "POST",
        "/api/v1/nodes",
        Some("application/json"),
        Some(node("n1")),
    )
    .await;
    assert_eq!(code, 201);
    assert_eq!(created["kind"], "Node");
    assert_eq!(created["metadata"]["uid"].as_str().unwrap().len(), 36);
    assert!(created["metadata"]["creationTimestamp"]
        .as_str()
        .unwrap()
        .ends_with('Z'));
    assert_eq!(rv(&created), api.resource_version());
    assert!(
        created["metadata"].get("generation").is_none(),
        "nodes have no generation"
    );

    let (code, dup) = call(
        &api,
        "POST",
        "/api/v1/nodes",
        Some("application/json"),
        Some(node("n1")),
    )
    .await;
    assert_eq!(code, 409);
    assert_eq!(dup["kind"], "Status");
    assert_eq!(dup["reason"], "AlreadyExists");
    assert_eq!(dup["message"], "nodes \"n1\" already exists");
    assert_eq!(dup["details"], json!({"name": "n1", "kind": "nodes"}));

    let (code, got) = get(&api, "/api/v1/nodes/n1").await;
    assert_eq!((code, &got), (200, &created));
    let (code, missing) = get(&api, "/api/v1/nodes/nope").await;
    assert_eq!(code, 404);
    assert_eq!(missing["reason"], "NotFound");
    assert_eq!(missing["message"], "nodes \"nope\" not found");

    let (code, list) = get(&api, "/api/v1/nodes?limit=500").await;
    assert_eq!(code, 200);
    assert_eq!(list["kind"], "NodeList");
    assert_eq!(
        list["metadata"]["resourceVersion"],
        api.resource_version().to_string()
    );
    assert_eq!(list["items"][0]["metadata"]["name"], "n1");
    assert!(
        list["items"][0].get("kind").is_none(),
        "list items carry no kind, as on the wire"
    );

    // PUT with a stale resourceVersion is a conflict; with the current one it writes.
    let mut stale = created.clone();
    stale["metadata"]["labels"]["pool"] = json!("b");
    api.put_object(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"pool": "c"}}}));
    let (code, conflict) = call(
        &api,
        "PUT",
        "/api/v1/nodes/n1",
        Some("application/json"),
        Some(stale),
    )
    .await;
    assert_eq!(code, 409);
    assert_eq!(conflict["reason"], "Conflict");
    assert_eq!(
        conflict["message"],
        "Operation cannot be fulfilled on nodes \"n1\": the object has been modified; please apply your changes to the latest version and try again"
    );
    let (_, cur) = get(&api, "/api/v1/nodes/n1").await;
    let mut fresh = cur.clone();
    fresh["metadata"]["labels"]["pool"] = json!("b");
    let (code, put) = call(
        &api,
        "PUT",
        "/api/v1/nodes/n1",
        Some("application/json"),
        Some(fresh),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(put["metadata"]["labels"]["pool"], "b");
    assert!(rv(&put) > rv(&cur));
    assert_eq!(
        put["metadata"]["uid"], cur["metadata"]["uid"],
        "system fields survive a PUT"
    );

    // A write that changes nothing keeps the version and sends no event.
    let before = api.resource_version();
    let (code, same) = call(
        &api,
        "PATCH",
        "/api/v1/nodes/n1",
        Some("application/merge-patch+json"),
        Some(json!({"metadata": {"labels": {"pool": "b"}}})),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(rv(&same), rv(&put));
    assert_eq!(api.resource_version(), before);

    // A pod POST gets generation 1 and a reset status; a pod needs containers.
    let (code, p) = call(
        &api,
        "POST",
        "/api/v1/namespaces/ns/pods",
        Some("application/json"),
        Some(pod("ns", "p1", "n1")),
    )
    .await;
    assert_eq!(code, 201);
    assert_eq!(p["metadata"]["generation"], 1);
    assert_eq!(p["status"], json!({"phase": "Pending"}));
    let mut bad = pod("ns", "p2", "n1");
    bad["spec"]["containers"] = json!([]);
    let (code, inv) = call(
        &api,
        "POST",
        "/api/v1/namespaces/ns/pods",
        Some("application/json"),
        Some(bad),
    )
    .await;
    assert_eq!(code, 422);
    assert_eq!(inv["reason"], "Invalid");
    assert_eq!(
        inv["message"],
        "Pod \"p2\" is invalid: spec.containers: Required value"
    );
    let (code, wrong_ns) = call(
        &api,
        "POST",
        "/api/v1/namespaces/other/pods",
        Some("application/json"),
        Some(pod("ns", "p3", "n1")),
    )
    .await;
    assert_eq!(code, 400);
    assert_eq!(wrong_ns["reason"], "BadRequest");
}

#[tokio::test(flavor = "multi_thread")]
async fn discovery_documents() {
    let api = KubeApi::start().unwrap();
    let (_, v) = get(&api, "/version").await;
    assert_eq!(v["major"], "1");
    let (_, a) = get(&api, "/api").await;
    assert_eq!(a["versions"], json!(["v1"]));
    let (_, g) = get(&api, "/apis").await;
    let names: Vec<&str> = g["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "events.k8s.io",
            "rbac.authorization.k8s.io",
            "admissionregistration.k8s.io",
            "apps",
            "karpenter.sh",
            "policy"
        ]
    );
    let (_, core) = get(&api, "/api/v1").await;
    let rs: Vec<&str> = core["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        rs,
        [
            "nodes",
            "nodes/status",
            "pods",
            "pods/status",
            "pods/eviction",
            "configmaps"
        ]
    );
    let (_, ev) = get(&api, "/apis/events.k8s.io/v1").await;
    assert_eq!(ev["resources"][0]["kind"], "Event");
    let (_, apps) = get(&api, "/apis/apps/v1").await;
    assert_eq!(apps["resources"][0]["kind"], "DaemonSet");
    let (code, _) = get(&api, "/apis/batch/v1").await;
    assert_eq!(code, 404);
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_resource_version_semantics_and_selectors() {
    let api = KubeApi::start().unwrap();
    let p1 = api.put_object(pod("ns", "a", "n1"));
    api.put_object(pod("ns", "b", "n1"));
    api.put_object(pod("ns", "c", "n2"));

    // resourceVersion=0 and unset both begin with synthetic ADDED for the current state.
    for rv_param in ["&resourceVersion=0", ""] {
        let mut w = Watch::open(
            &api,
            &format!("/api/v1/pods?watch=1&fieldSelector=spec.nodeName%3Dn1{rv_param}"),
        )
        .await;
        let evs = w.next_n(2).await;
        let names: Vec<(&str, &str)> = evs
            .iter()
            .map(|e| {
                (
                    e["type"].as_str().unwrap(),
                    e["object"]["metadata"]["name"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(names, [("ADDED", "a"), ("ADDED", "b")], "{rv_param}");
        assert_eq!(
            evs[0]["object"]["kind"], "Pod",
            "watch objects carry their kind"
        );
    }

    // From a version: only what happened after it, with selection transitions.
    let from = api.resource_version();
    let mut w = Watch::open(&api, &format!("/api/v1/namespaces/ns/pods?watch=true&resourceVersion={from}&labelSelector=app%3Dweb&fieldSelector=spec.nodeName%3Dn1&timeoutSeconds=2")).await;
    let mut relabeled = p1.clone();
    relabeled["metadata"]["labels"]["app"] = json!("db");
    api.put_object(relabeled.clone());
    api.put_object(pod("ns", "d", "n2"));
    api.put_object(pod("ns", "e", "n1"));
    relabeled["metadata"]["labels"]["app"] = json!("web");
    api.put_object(relabeled);
    api.delete_object("pods", "ns", "b");
    let evs = w.next_n(4).await;
    let seen: Vec<(&str, &str)> = evs
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap(),
                e["object"]["metadata"]["name"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("DELETED", "a"),
            ("ADDED", "e"),
            ("ADDED", "a"),
            ("DELETED", "b")
        ]
    );
    assert_eq!(
        rv(&evs[3]["object"]),
        api.resource_version(),
        "a DELETED object carries the delete's version"
    );
    // timeoutSeconds ends the stream.
    let t = std::time::Instant::now();
    assert!(w.next().await.is_none());
    assert!(t.elapsed() < Duration::from_secs(4));

    // Unsupported field selector: the real 400 (for a watch too).
    let (code, e) = get(&api, "/api/v1/pods?watch=1&fieldSelector=spec.foo%3Dx").await;
    assert_eq!(code, 400);
    assert_eq!(e["message"], "field label not supported: spec.foo");
    let (code, e) = get(&api, "/api/v1/pods?labelSelector=app%20in%20web").await;
    assert_eq!(code, 400);
    assert_eq!(e["reason"], "BadRequest");
    let (_, l) = get(&api, "/api/v1/pods?labelSelector=app%20in%20(web)%2C!missing&fieldSelector=spec.nodeName%21%3Dn2").await;
    let names: Vec<&str> = l["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "e"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn expired_resource_version_is_410() {
    let api = KubeApi::start().unwrap();
    api.put_object(pod("ns", "a", "n1"));
    let old = api.resource_version();
    api.put_object(pod("ns", "b", "n1"));
    let (_, exact) = get(
        &api,
        &format!("/api/v1/pods?resourceVersion={old}&resourceVersionMatch=Exact"),
    )
    .await;
    assert_eq!(
        exact["items"].as_array().unwrap().len(),
        1,
        "an Exact list shows the state at that version"
    );

    api.compact_history();
    api.put_object(pod("ns", "c", "n1"));
    let mut w = Watch::open(&api, &format!("/api/v1/pods?watch=1&resourceVersion={old}")).await;
    let e = w.next().await.expect("an ERROR event");
    assert_eq!(e["type"], "ERROR");
    assert_eq!(e["object"]["kind"], "Status");
    assert_eq!(e["object"]["code"], 410);
    assert_eq!(e["object"]["reason"], "Expired");
    assert!(e["object"]["message"]
        .as_str()
        .unwrap()
        .starts_with(&format!("too old resource version: {old}")));
    assert!(w.next().await.is_none(), "the stream ends after the error");

    let (code, gone) = get(
        &api,
        &format!("/api/v1/pods?resourceVersion={old}&resourceVersionMatch=Exact"),
    )
    .await;
    assert_eq!(code, 410);
    assert_eq!(gone["reason"], "Expired");
    // A NotOlderThan list is served from the current state.
    let (code, l) = get(&api, &format!("/api/v1/pods?resourceVersion={old}")).await;
    assert_eq!(code, 200);
    assert_eq!(l["items"].as_array().unwrap().len(), 3);

    // The bounded window expires old versions by itself.
    api.set_history_limit(2);
    let mid = api.resource_version();
    for n in ["d", "e", "f"] {
        api.put_object(pod("ns", n, "n1"));
    }
    let mut w = Watch::open(&api, &format!("/api/v1/pods?watch=1&resourceVersion={mid}")).await;
    assert_eq!(w.next().await.unwrap()["object"]["code"], 410);
}

#[tokio::test(flavor = "multi_thread")]
async fn bookmarks_and_initial_events_end() {
    let api = KubeApi::start_with(Config {
        bookmark_interval: Duration::from_millis(200),
        ..Config::default()
    })
    .unwrap();
    api.put_object(node("n1"));
    let now = api.resource_version();
    let mut w = Watch::open(
        &api,
        &format!("/api/v1/nodes?watch=1&allowWatchBookmarks=true&resourceVersion={now}"),
    )
    .await;
    let b = w.next().await.unwrap();
    assert_eq!(b["type"], "BOOKMARK");
    assert_eq!(b["object"]["kind"], "Node");
    assert_eq!(b["object"]["metadata"]["resourceVersion"], now.to_string());

    let mut w = Watch::open(&api, "/api/v1/nodes?watch=1&allowWatchBookmarks=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan").await;
    let evs = w.next_n(2).await;
    assert_eq!(evs[0]["type"], "ADDED");
    assert_eq!(evs[1]["type"], "BOOKMARK");
    assert_eq!(
        evs[1]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    let (code, _) = get(&api, "/api/v1/nodes?watch=1&sendInitialEvents=true").await;
    assert_eq!(
        code, 422,
        "sendInitialEvents needs resourceVersionMatch=NotOlderThan"
    );

    // Without allowWatchBookmarks no bookmark comes.
    let mut w = Watch::open(
        &api,
        &format!("/api/v1/nodes?watch=1&resourceVersion={now}&timeoutSeconds=1"),
    )
    .await;
    assert!(w.next().await.is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn patches_by_content_type_and_status_subresource() {
    let api = KubeApi::start().unwrap();
    let mut n = node("n1");
    n["spec"]["taints"] = json!([{"key": "other.io/x", "effect": "NoSchedule"}, {"key": "interlock.dev/not-ready", "effect": "NoSchedule"}]);
    n["status"]["conditions"] = json!([{"type": "Ready", "status": "True"}, {"type": "InterlockReady", "status": "False", "reason": "Starting"}]);
    api.put_object(n);

    // Strategic merge: conditions merge by type (through /status).
    let (code, out) = call(&api, "PATCH", "/api/v1/nodes/n1/status", Some("application/strategic-merge-patch+json"),
        Some(json!({"status": {"conditions": [{"type": "InterlockReady", "status": "True", "reason": "Protected"}]}}))).await;
    assert_eq!(code, 200);
    assert_eq!(
        out["status"]["conditions"],
        json!([{"type": "Ready", "status": "True"}, {"type": "InterlockReady", "status": "True", "reason": "Protected"}])
    );
    // Taints have no merge key: the patch's list replaces the whole list.
    let (_, out) = call(
        &api,
        "PATCH",
        "/api/v1/nodes/n1",
        Some("application/strategic-merge-patch+json"),
        Some(json!({"spec": {"taints": [{"key": "other.io/x", "effect": "NoSchedule"}]}})),
    )
    .await;
    assert_eq!(
        out["spec"]["taints"],
        json!([{"key": "other.io/x", "effect": "NoSchedule"}])
    );
    // The main resource keeps status; the status subresource keeps labels.
    let (_, out) = call(
        &api,
        "PATCH",
        "/api/v1/nodes/n1",
        Some("application/merge-patch+json"),
        Some(json!({"status": {"conditions": []}, "metadata": {"labels": {"x": "1"}}})),
    )
    .await;
    assert_eq!(out["status"]["conditions"].as_array().unwrap().len(), 2);
    assert_eq!(out["metadata"]["labels"]["x"], "1");
    let (_, out) = call(
        &api,
        "PATCH",
        "/api/v1/nodes/n1/status",
        Some("application/merge-patch+json"),
        Some(json!({"metadata": {"labels": {"y": "1"}}})),
    )
    .await;
    assert!(out["metadata"]["labels"].get("y").is_none());

    // JSON patch with test: applies when it holds, 422 when it does not.
    let cur = api.get_object("nodes", "", "n1").unwrap();
    let ok = json!([{"op": "test", "path": "/spec/taints", "value": cur["spec"]["taints"]},
                    {"op": "add", "path": "/spec/taints/-", "value": {"key": "interlock.dev/not-ready", "effect": "NoSchedule"}}]);
    let (code, out) = call(
        &api,
        "PATCH",
        "/api/v1/nodes/n1",
        Some("application/json-patch+json"),
        Some(ok.clone()),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(out["spec"]["taints"].as_array().unwrap().len(), 2);
    let (code, e) = call(
        &api,
        "PATCH",
        "/api/v1/nodes/n1",
        Some("application/json-patch+json"),
        Some(ok),
    )
    .await;
    assert_eq!(code, 422, "the test no longer holds");
    assert_eq!(e["reason"], "Invalid");
    assert_eq!(
        e["message"],
        "the server rejected our request due to an error in our request"
    );
    assert_eq!(
        api.get_object("nodes", "", "n1").unwrap()["spec"]["taints"]
            .as_array()
            .unwrap()
            .len(),
        2,
        "nothing applied"
    );

    // resourceVersion in a patch body is a precondition.
    let (code, e) = call(
        &api,
        "PATCH",
        "/api/v1/nodes/n1",
        Some("application/merge-patch+json"),
        Some(json!({"metadata": {"resourceVersion": "1", "labels": {"z": "1"}}})),
    )
    .await;
    assert_eq!((code, e["reason"].as_str()), (409, Some("Conflict")));
    let cur = api.get_object("nodes", "", "n1").unwrap();
    let (code, out) = call(&api, "PATCH", "/api/v1/nodes/n1", Some("application/merge-patch+json"),
        Some(json!({"metadata": {"resourceVersion": cur["metadata"]["resourceVersion"], "labels": {"z": "1", "x": null}}}))).await;
    assert_eq!(code, 200);
    assert_eq!(out["metadata"]["labels"], json!({"pool": "a", "z": "1"}));

    let (code, _) = call(
        &api,
        "PATCH",
        "/api/v1/nodes/nope",
        Some("application/merge-patch+json"),
        Some(json!({})),
    )
    .await;
    assert_eq!(code, 404);
    let (code, e) = call(
        &api,
        "PATCH",
        "/api/v1/nodes/n1",
        Some("application/merge-patch+json"),
        Some(json!({"spec": {"taints": [{"key": "k", "effect": "Sometimes"}]}})),
    )
    .await;
    assert_eq!(code, 422, "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_with_preconditions_and_watch() {
    let api = KubeApi::start().unwrap();
    let p = api.put_object(pod("ns", "a", "n1"));
    let from = api.resource_version();
    let mut w = Watch::open(
        &api,
        &format!("/api/v1/namespaces/ns/pods?watch=1&resourceVersion={from}"),
    )
    .await;
    let (code, e) = call(&api, "DELETE", "/api/v1/namespaces/ns/pods/a", Some("application/json"),
        Some(json!({"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": "not-the-uid"}}))).await;
    assert_eq!(code, 409);
    assert_eq!(e["message"], format!("Operation cannot be fulfilled on pods \"a\": Precondition failed: UID in precondition: not-the-uid, UID in object meta: {}", p["metadata"]["uid"].as_str().unwrap()));
    let (code, e) = call(
        &api,
        "DELETE",
        "/api/v1/namespaces/ns/pods/a",
        None,
        Some(json!({"preconditions": {"resourceVersion": "1"}})),
    )
    .await;
    assert_eq!((code, e["reason"].as_str()), (409, Some("Conflict")));
    assert!(api.get_object("pods", "ns", "a").is_some());
    let (code, gone) = call(
        &api,
        "DELETE",
        "/api/v1/namespaces/ns/pods/a",
        Some("application/json"),
        Some(json!({"preconditions": {"uid": p["metadata"]["uid"]}})),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(gone["kind"], "Pod", "a pod DELETE answers with the pod");
    assert_eq!(
        gone["metadata"]["deletionGracePeriodSeconds"], 30,
        "a bound pod is deleted gracefully"
    );
    assert!(gone["metadata"]["deletionTimestamp"].is_string());
    // Marked Terminating first, then removed by the (simulated) kubelet.
    let evs = w.next_n(2).await;
    let seen: Vec<(&str, bool)> = evs
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap(),
                e["object"]["metadata"]["deletionTimestamp"].is_string(),
            )
        })
        .collect();
    assert_eq!(seen, [("MODIFIED", true), ("DELETED", true)]);
    assert!(api.wait_until(Duration::from_secs(2), |a| a
        .get_object("pods", "ns", "a")
        .is_none()));

    api.put_object(node("n1"));
    let (code, st) = call(&api, "DELETE", "/api/v1/nodes/n1", None, None).await;
    assert_eq!(code, 200);
    assert_eq!(
        (st["kind"].as_str(), st["status"].as_str()),
        (Some("Status"), Some("Success"))
    );
    let (code, _) = call(&api, "DELETE", "/api/v1/nodes/n1", None, None).await;
    assert_eq!(code, 404);
}

fn pdb(allowed: i64) -> Value {
    json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
           "metadata": {"name": "web-pdb", "namespace": "ns", "generation": 1},
           "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}},
           "status": {"observedGeneration": 1, "disruptionsAllowed": allowed, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1}})
}

#[tokio::test(flavor = "multi_thread")]
async fn eviction_blocked_by_pdb_is_429() {
    let api = KubeApi::start().unwrap();
    api.put_object(pod("ns", "a", "n1"));
    api.put_object(pdb(0));
    let eviction = json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "a", "namespace": "ns"}});
    let (code, e) = call(
        &api,
        "POST",
        "/api/v1/namespaces/ns/pods/a/eviction",
        Some("application/json"),
        Some(eviction.clone()),
    )
    .await;
    assert_eq!(code, 429);
    assert_eq!(e["reason"], "TooManyRequests");
    assert_eq!(
        e["message"],
        "Cannot evict pod as it would violate the pod's disruption budget."
    );
    assert_eq!(
        e["details"]["causes"],
        json!([{"reason": "DisruptionBudget", "message": "The disruption budget web-pdb needs 1 healthy pods and has 1 currently"}])
    );
    assert!(
        api.get_object("pods", "ns", "a").is_some(),
        "a blocked eviction deletes nothing"
    );

    // Once the budget allows one disruption, the eviction deletes the pod and spends it.
    api.put_object(pdb(1));
    let (code, ok) = call(
        &api,
        "POST",
        "/api/v1/namespaces/ns/pods/a/eviction",
        Some("application/json"),
        Some(eviction),
    )
    .await;
    assert_eq!(code, 201);
    assert_eq!(
        (ok["kind"].as_str(), ok["status"].as_str()),
        (Some("Status"), Some("Success"))
    );
    assert!(api.wait_until(Duration::from_secs(2), |a| a
        .get_object("pods", "ns", "a")
        .is_none()));
    let b = api
        .get_object("poddisruptionbudgets", "ns", "web-pdb")
        .unwrap();
    assert_eq!(b["status"]["disruptionsAllowed"], 0);
    assert!(b["status"]["disruptedPods"].get("a").is_some());

    // A pod no PDB selects, or a Pending one, is evicted at once; a missing pod is 404.
    let mut other = pod("ns", "b", "n1");
    other["metadata"]["labels"] = json!({"app": "db"});
    api.put_object(other);
    let (code, _) = call(
        &api,
        "POST",
        "/api/v1/namespaces/ns/pods/b/eviction",
        Some("application/json"),
        Some(json!({"metadata": {"name": "b"}})),
    )
    .await;
    assert_eq!(code, 201);
    let (code, _) = call(
        &api,
        "POST",
        "/api/v1/namespaces/ns/pods/zz/eviction",
        Some("application/json"),
        Some(json!({"metadata": {"name": "zz"}})),
    )
    .await;
    assert_eq!(code, 404);
    // Two budgets selecting one pod: the real server refuses with 500.
    api.put_object(pod("ns", "c", "n1"));
    let mut second = pdb(1);
    second["metadata"]["name"] = json!("second");
    api.put_object(second);
    let (code, e) = call(
        &api,
        "POST",
        "/api/v1/namespaces/ns/pods/c/eviction",
        Some("application/json"),
        Some(json!({"metadata": {"name": "c"}})),
    )
    .await;
    assert_eq!(code, 500, "{e}");
}

fn event(name: &str) -> Value {
    json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
           "metadata": {"name": name, "namespace": "ns"},
           "eventTime": "2026-11-24T07:00:00.000000Z", "reportingController": "interlock.dev/agent",
           "reportingInstance": "interlock-n1", "action": "Audit", "reason": "Unprotected", "type": "Warning",
           "note": "pod ns/a lost its redirect rules",
           "regarding": {"kind": "Pod", "namespace": "ns", "name": "a", "apiVersion": "v1"}})
}

#[tokio::test(flavor = "multi_thread")]
async fn events_are_validated_and_series_patched() {
    let api = KubeApi::start().unwrap();
    let (code, e) = call(
        &api,
        "POST",
        "/apis/events.k8s.io/v1/namespaces/ns/events",
        Some("application/json"),
        Some(event("ev1")),
    )
    .await;
    assert_eq!(code, 201, "{e}");
    let (code, _) = call(
        &api,
        "PATCH",
        "/apis/events.k8s.io/v1/namespaces/ns/events/ev1",
        Some("application/merge-patch+json"),
        Some(json!({"series": {"count": 2, "lastObservedTime": "2026-11-24T07:01:00.000000Z"}})),
    )
    .await;
    assert_eq!(code, 200);
    let stored = api.objects("events");
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0]["series"]["count"], 2);
    assert_eq!(stored[0]["reason"], "Unprotected");

    let mut bad = event("ev2");
    bad.as_object_mut().unwrap().remove("eventTime");
    bad["type"] = json!("Bad");
    let (code, e) = call(
        &api,
        "POST",
        "/apis/events.k8s.io/v1/namespaces/ns/events",
        Some("application/json"),
        Some(bad),
    )
    .await;
    assert_eq!(code, 422);
    assert!(e["message"].as_str().unwrap().starts_with("Event.events.k8s.io \"ev2\" is invalid: [eventTime: Required value, type: Unsupported value"), "{e}");
    let (code, _) = call(
        &api,
        "PATCH",
        "/apis/events.k8s.io/v1/namespaces/ns/events/ev1",
        Some("application/merge-patch+json"),
        Some(json!({"series": {"count": 1, "lastObservedTime": "2026-11-24T07:01:00.000000Z"}})),
    )
    .await;
    assert_eq!(code, 422, "series.count must be at least 2");
    // An event about a node (cluster-scoped) belongs in "default".
    let mut node_ev = event("ev3");
    node_ev["regarding"] = json!({"kind": "Node", "name": "n1", "apiVersion": "v1"});
    let (code, _) = call(
        &api,
        "POST",
        "/apis/events.k8s.io/v1/namespaces/ns/events",
        Some("application/json"),
        Some(node_ev.clone()),
    )
    .await;
    assert_eq!(code, 422);
    node_ev["metadata"]["namespace"] = json!("default");
    let (code, _) = call(
        &api,
        "POST",
        "/apis/events.k8s.io/v1/namespaces/default/events",
        Some("application/json"),
        Some(node_ev),
    )
    .await;
    assert_eq!(code, 201);
}

#[tokio::test(flavor = "multi_thread")]
async fn request_log_load_counters_and_injected_failures() {
    let api = KubeApi::start().unwrap();
    api.put_object(node("n1"));
    get(&api, "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1").await;
    let log = api.requests();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].method, "GET");
    assert_eq!(log[0].path, "/api/v1/pods");
    assert_eq!(log[0].param("fieldSelector"), Some("spec.nodeName=n1"));
    assert_eq!(log[0].client, "test-client");
    assert_eq!(log[0].status, 200);

    api.fail_next(1, 409);
    let patch = json!({"metadata": {"labels": {"k": "v"}}});
    let (code, e) = call(
        &api,
        "PATCH",
        "/api/v1/nodes/n1",
        Some("application/merge-patch+json"),
        Some(patch.clone()),
    )
    .await;
    assert_eq!((code, e["reason"].as_str()), (409, Some("Conflict")));
    assert!(
        api.get_object("nodes", "", "n1").unwrap()["metadata"]["labels"]
            .get("k")
            .is_none()
    );
    let (code, _) = call(
        &api,
        "PATCH",
        "/api/v1/nodes/n1",
        Some("application/merge-patch+json"),
        Some(patch.clone()),
    )
    .await;
    assert_eq!(code, 200, "only the next one failed");
    api.fail_next_matching(FailRule {
        remaining: 2,
        code: 503,
        method: Some("GET".into()),
        path_contains: Some("/nodes".into()),
    });
    assert_eq!(get(&api, "/api/v1/nodes").await.0, 503);
    assert_eq!(get(&api, "/api/v1/pods").await.0, 200);
    assert_eq!(get(&api, "/api/v1/nodes/n1").await.0, 503);
    assert_eq!(get(&api, "/api/v1/nodes/n1").await.0, 200);

    let load = api.load();
    let mine = load["test-client"];
    assert_eq!(mine.requests, 7);
    assert_eq!(mine.writes, 2);
    assert_eq!(mine.lists, 3, "a failed list counts too");
    assert_eq!(mine.bytes_in, 2 * patch.to_string().len() as u64);
    assert!(mine.bytes_out > 500);
    let log = api.requests();
    let p = log.iter().find(|r| r.method == "PATCH").unwrap();
    assert_eq!(
        p.content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    assert_eq!(p.json(), patch);
}

#[tokio::test(flavor = "multi_thread")]
async fn restart_drops_every_watch() {
    let api = KubeApi::start().unwrap();
    api.put_object(node("n1"));
    let from = api.resource_version();
    let mut w1 = Watch::open(
        &api,
        &format!("/api/v1/nodes?watch=1&resourceVersion={from}"),
    )
    .await;
    let mut w2 = Watch::open(&api, "/api/v1/pods?watch=1").await;
    assert!(api.wait_until(Duration::from_secs(2), |a| a.active_watches() == 2));
    api.put_object(node("n2"));
    assert_eq!(w1.next().await.unwrap()["object"]["metadata"]["name"], "n2");
    api.restart(true);
    assert!(w1.next().await.is_none());
    assert!(w2.next().await.is_none());
    assert!(api.wait_until(Duration::from_secs(2), |a| a.active_watches() == 0));
    // The history is gone: resuming from before the restart is 410.
    let mut w = Watch::open(
        &api,
        &format!("/api/v1/nodes?watch=1&resourceVersion={from}"),
    )
    .await;
    assert_eq!(w.next().await.unwrap()["object"]["code"], 410);
}

#[tokio::test(flavor = "multi_thread")]
async fn server_side_apply_and_field_ownership() {
    let api = KubeApi::start().unwrap();
    let mut n = node("n1");
    n.as_object_mut().unwrap().remove("status");
    let (code, created) = call(
        &api,
        "POST",
        "/api/v1/nodes?fieldManager=kubelet",
        Some("application/json"),
        Some(n),
    )
    .await;
    assert_eq!(code, 201);
    let mf = &created["metadata"]["managedFields"][0];
    assert_eq!(
        (mf["manager"].as_str(), mf["operation"].as_str()),
        (Some("kubelet"), Some("Update"))
    );
    assert_eq!(
        mf["fieldsV1"]["f:spec"],
        json!({"f:taints": {}}),
        "taints are owned whole"
    );

    // Applying a taint list without kubelet's taint conflicts: taints are atomic.
    let ours = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
                      "spec": {"taints": [{"key": "interlock.dev/not-ready", "effect": "NoSchedule"}]}});
    let apply = "application/apply-patch+yaml";
    let (code, e) = call(
        &api,
        "PATCH",
        "/api/v1/nodes/n1?fieldManager=interlock",
        Some(apply),
        Some(ours.clone()),
    )
    .await;
    assert_eq!(code, 409);
    assert_eq!(e["reason"], "Conflict");
    assert_eq!(
        e["message"],
        "Apply failed with 1 conflict: conflict with \"kubelet\" using v1: .spec.taints"
    );
    assert_eq!(
        e["details"]["causes"][0],
        json!({"reason": "FieldManagerConflict", "message": "conflict with \"kubelet\" using v1", "field": ".spec.taints"})
    );
    assert_eq!(
        api.get_object("nodes", "", "n1").unwrap()["spec"]["taints"][0]["key"],
        "other.io/x"
    );
    let (code, _) = call(
        &api,
        "PATCH",
        "/api/v1/nodes/n1",
        Some(apply),
        Some(ours.clone()),
    )
    .await;
    assert_eq!(code, 400, "an apply needs a fieldManager");
    // Forced, it takes the list (and kubelet's taint is gone: why the agent must not).
    let (code, forced) = call(
        &api,
        "PATCH",
        "/api/v1/nodes/n1?fieldManager=interlock&force=true",
        Some(apply),
        Some(ours),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(
        forced["spec"]["taints"],
        json!([{"key": "interlock.dev/not-ready", "effect": "NoSchedule"}])
    );

    // Conditions are keyed by type: applying ours through /status leaves Ready alone.
    api.put_object(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}));
    let cond = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2"},
                      "status": {"conditions": [{"type": "InterlockReady", "status": "True", "reason": "Protected"}]}});
    let (code, out) = call(
        &api,
        "PATCH",
        "/api/v1/nodes/n2/status?fieldManager=interlock",
        Some(apply),
        Some(cond),
    )
    .await;
    assert_eq!(code, 200, "{out}");
    let types: Vec<&str> = out["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["Ready", "InterlockReady"]);

    // Labels are granular; a label no longer applied is removed, others' stay.
    api.put_object(pod("ns", "p", "n1"));
    let label = |v: Value| json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns", "labels": v}});
    let (code, out) = call(
        &api,
        "PATCH",
        "/api/v1/namespaces/ns/pods/p?fieldManager=interlock",
        Some(apply),
        Some(label(json!({"interlock.dev/unprotected": "true"}))),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(
        out["metadata"]["labels"],
        json!({"app": "web", "interlock.dev/unprotected": "true"})
    );
    let (_, out) = call(
        &api,
        "PATCH",
        "/api/v1/namespaces/ns/pods/p?fieldManager=interlock",
        Some(apply),
        Some(label(json!({}))),
    )
    .await;
    assert_eq!(out["metadata"]["labels"], json!({"app": "web"}));

    // An apply to a missing object creates it.
    let (code, made) = call(&api, "PATCH", "/api/v1/nodes/n3?fieldManager=interlock", Some(apply),
        Some(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n3", "labels": {"a": "b"}}}))).await;
    assert_eq!(code, 201);
    assert_eq!(made["metadata"]["managedFields"][0]["operation"], "Apply");
}

#[tokio::test(flavor = "multi_thread")]
async fn paginated_lists_and_graceful_pod_deletion() {
    let api = KubeApi::start_with(Config {
        kubelet_deletes_after: None,
        ..Config::default()
    })
    .unwrap();
    for n in ["a", "b", "c", "d", "e"] {
        api.put_object(pod("ns", n, "n1"));
    }
    let (_, first) = get(&api, "/api/v1/pods?limit=2").await;
    assert_eq!(first["metadata"]["remainingItemCount"], 3);
    let token = first["metadata"]["continue"].as_str().unwrap().to_string();
    api.put_object(pod("ns", "aa", "n1"));
    let (_, second) = get(&api, &format!("/api/v1/pods?limit=2&continue={token}")).await;
    let names = |l: &Value| -> Vec<String> {
        l["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        names(&second),
        ["c", "d"],
        "later pages show the first page's snapshot"
    );
    assert_eq!(
        second["metadata"]["resourceVersion"],
        first["metadata"]["resourceVersion"]
    );
    let (_, third) = get(
        &api,
        &format!(
            "/api/v1/pods?limit=2&continue={}",
            second["metadata"]["continue"].as_str().unwrap()
        ),
    )
    .await;
    assert_eq!(names(&third), ["e"]);
    assert!(third["metadata"].get("continue").is_none());
    let (_, all) = get(&api, "/api/v1/pods?limit=2&resourceVersion=0").await;
    assert_eq!(
        all["items"].as_array().unwrap().len(),
        6,
        "resourceVersion=0 ignores limit"
    );
    api.compact_history();
    api.put_object(pod("ns", "f", "n1"));
    let (code, e) = get(&api, &format!("/api/v1/pods?limit=2&continue={token}")).await;
    assert_eq!((code, e["reason"].as_str()), (410, Some("Expired")));
    let (code, _) = get(&api, "/api/v1/pods?continue=zz").await;
    assert_eq!(code, 400);

    // With no kubelet, a deleted bound pod stays Terminating; grace 0 removes it.
    let (code, t) = call(
        &api,
        "DELETE",
        "/api/v1/namespaces/ns/pods/a?gracePeriodSeconds=5",
        None,
        None,
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(t["metadata"]["deletionGracePeriodSeconds"], 5);
    std::thread::sleep(Duration::from_millis(200));
    assert!(api.get_object("pods", "ns", "a").is_some());
    let rv_before = api.resource_version();
    let (code, _) = call(&api, "DELETE", "/api/v1/namespaces/ns/pods/a", None, None).await;
    assert_eq!(code, 200);
    assert_eq!(
        api.resource_version(),
        rv_before,
        "a longer grace period changes nothing"
    );
    let (code, _) = call(
        &api,
        "DELETE",
        "/api/v1/namespaces/ns/pods/a",
        Some("application/json"),
        Some(json!({"gracePeriodSeconds": 0})),
    )
    .await;
    assert_eq!(code, 200);
    assert!(api.get_object("pods", "ns", "a").is_none());
    // An unbound pod goes at once.
    let mut unbound = pod("ns", "u", "");
    unbound["spec"].as_object_mut().unwrap().remove("nodeName");
    api.put_object(unbound);
    call(&api, "DELETE", "/api/v1/namespaces/ns/pods/u", None, None).await;
    assert!(api.get_object("pods", "ns", "u").is_none());
}

//! The fake cross-checked with clients nobody here wrote: the official Python client
//! (`kubernetes` from PyPI, in the venv `scripts/install-deps.sh` makes) and kubectl.
//! Each client does its part; the test asserts what it printed and what the server holds.

use interlock_testkit_node::kubeapi::KubeApi;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The Python with the `kubernetes` package: `$INTERLOCK_KUBE_PYTHON`, else the venv
/// install-deps makes. `None` (with a skip message) when missing; a failure under CI.
fn kube_python(test: &str) -> Option<PathBuf> {
    let py = std::env::var_os("INTERLOCK_KUBE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| "/root".into());
            home.join(".cache/interlock/kube-python/bin/python")
        });
    let ok = Command::new(&py)
        .args(["-c", "import kubernetes"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        return Some(py);
    }
    let why = format!(
        "{test}: the Python Kubernetes client is not installed at {} (run scripts/install-deps.sh)",
        py.display()
    );
    if interlock_testkit::in_ci() {
        panic!("{why}; CI must run it");
    }
    eprintln!("SKIP {why}");
    None
}

fn pod(name: &str, node: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns", "labels": labels},
           "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
           "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})
}

const PY_SCRIPT: &str = r#"
import json, sys
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

config.load_kube_config(config_file=sys.argv[1])
old_rv = sys.argv[2]
v1 = client.CoreV1Api()
out = {}

# A watch from a compacted version: the client raises ApiException 410.
try:
    for ev in watch.Watch().stream(v1.list_pod_for_all_namespaces, field_selector="spec.nodeName=n1",
                                   resource_version=old_rv, timeout_seconds=5):
        out.setdefault("unexpected", []).append(ev["type"])
except ApiException as e:
    out["watch_error"] = e.status

# Re-list, then watch from the list's version and see our own change.
pods = v1.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1")
out["listed"] = sorted(p.metadata.name for p in pods.items)
rv = pods.metadata.resource_version
v1.patch_namespaced_pod("a", "ns", {"metadata": {"labels": {"interlock.dev/unprotected": "true"}}})
events = []
for ev in watch.Watch().stream(v1.list_pod_for_all_namespaces, field_selector="spec.nodeName=n1",
                               resource_version=rv, timeout_seconds=1):
    events.append([ev["type"], ev["object"].metadata.name, ev["object"].metadata.labels.get("interlock.dev/unprotected")])
out["events"] = events

# Strategic merge patch (a dict) of node conditions through nodes/status.
n = v1.patch_node_status("n1", {"status": {"conditions": [
    {"type": "InterlockReady", "status": "True", "reason": "Protected", "message": "rules in place"}]}})
out["conditions"] = [[c.type, c.status] for c in n.status.conditions]

# JSON patch (a list) whose test fails: 422, nothing applied.
try:
    v1.patch_node("n1", [{"op": "test", "path": "/spec/taints", "value": []},
                         {"op": "replace", "path": "/spec/taints", "value": []}])
    out["json_patch"] = "applied"
except ApiException as e:
    out["json_patch"] = e.status

# Optimistic concurrency: a replace with a stale resourceVersion is a 409.
node = v1.read_node("n1")
node.metadata.resource_version = "1"
try:
    v1.replace_node("n1", node)
except ApiException as e:
    out["stale_replace"] = [e.status, json.loads(e.body)["reason"]]

# Eviction blocked by a PDB: 429 with the DisruptionBudget cause.
try:
    v1.create_namespaced_pod_eviction("a", "ns", client.V1Eviction(
        metadata=client.V1ObjectMeta(name="a", namespace="ns")))
    out["eviction"] = "evicted"
except ApiException as e:
    body = json.loads(e.body)
    out["eviction"] = [e.status, body["reason"], body["details"]["causes"][0]["reason"]]

# Pages: limit and _continue.
page = v1.list_namespaced_pod("ns", limit=1)
names = [p.metadata.name for p in page.items]
while page.metadata._continue:
    page = v1.list_namespaced_pod("ns", limit=1, _continue=page.metadata._continue)
    names += [p.metadata.name for p in page.items]
out["paged"] = names

# A delete whose UID precondition does not hold: 409, the pod stays.
try:
    v1.delete_namespaced_pod("b", "ns", body=client.V1DeleteOptions(
        preconditions=client.V1Preconditions(uid="00000000-0000-4000-8000-000000000000")))
    out["delete_precondition"] = "deleted"
except ApiException as e:
    out["delete_precondition"] = e.status

# An event through events.k8s.io/v1.
ev = client.EventsV1Event(metadata=client.V1ObjectMeta(name="a.1", namespace="ns"),
    event_time="2026-11-24T07:00:00.000000Z", reporting_controller="interlock.dev/agent",
    reporting_instance="interlock-n1", action="Audit", reason="Unprotected", type="Warning",
    note="pod ns/a is unprotected", regarding=client.V1ObjectReference(kind="Pod", namespace="ns", name="a"))
out["event_uid"] = bool(client.EventsV1Api().create_namespaced_event("ns", ev).metadata.uid)

print(json.dumps(out))
"#;

#[test]
fn python_client_cross_check() {
    let Some(py) = kube_python("python_client_cross_check") else {
        return;
    };
    let api = KubeApi::start().unwrap();
    let dir = interlock_testkit::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    api.put_object(
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
        "spec": {"taints": [{"key": "other.io/x", "effect": "NoSchedule"}]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
    );
    api.put_object(pod("a", "n1", json!({"app": "web"})));
    api.put_object(pod("elsewhere", "n2", json!({"app": "web"})));
    api.put_object(json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "web-pdb", "namespace": "ns", "generation": 1},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}},
        "status": {"observedGeneration": 1, "disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1}}));
    let old = api.resource_version();
    api.put_object(pod("b", "n1", json!({"app": "db"})));
    api.compact_history();

    let script = dir.path().join("check.py");
    std::fs::write(&script, PY_SCRIPT).unwrap();
    let out = Command::new(&py)
        .arg(&script)
        .arg(&kubeconfig)
        .arg(old.to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));

    assert_eq!(got["watch_error"], 410, "{got}");
    assert!(got.get("unexpected").is_none(), "{got}");
    assert_eq!(got["listed"], json!(["a", "b"]));
    assert_eq!(got["events"], json!([["MODIFIED", "a", "true"]]));
    assert_eq!(
        got["conditions"],
        json!([["Ready", "True"], ["InterlockReady", "True"]])
    );
    assert_eq!(got["json_patch"], 422);
    assert_eq!(got["stale_replace"], json!([409, "Conflict"]));
    assert_eq!(
        got["eviction"],
        json!([429, "TooManyRequests", "DisruptionBudget"])
    );
    assert_eq!(got["event_uid"], true);
    assert_eq!(got["paged"], json!(["a", "b", "elsewhere"]));
    assert_eq!(got["delete_precondition"], 409);
    assert!(api.get_object("pods", "ns", "b").is_some());

    // The server's side of it.
    let node = api.get_object("nodes", "", "n1").unwrap();
    assert_eq!(
        node["spec"]["taints"],
        json!([{"key": "other.io/x", "effect": "NoSchedule"}]),
        "the failed JSON patch changed nothing"
    );
    assert_eq!(node["status"]["conditions"][1]["reason"], "Protected");
    assert!(
        api.get_object("pods", "ns", "a").is_some(),
        "the blocked eviction deleted nothing"
    );
    assert_eq!(api.objects("events")[0]["reason"], "Unprotected");
    let log = api.requests();
    let ct = |path: &str| {
        log.iter()
            .find(|r| r.method == "PATCH" && r.path == path)
            .and_then(|r| r.content_type.clone())
    };
    assert_eq!(
        ct("/api/v1/nodes/n1/status").as_deref(),
        Some("application/strategic-merge-patch+json")
    );
    assert_eq!(
        ct("/api/v1/nodes/n1").as_deref(),
        Some("application/json-patch+json")
    );
    for r in log.iter().filter(|r| r.path == "/api/v1/pods") {
        assert_eq!(r.param("fieldSelector"), Some("spec.nodeName=n1"), "{r:?}");
    }
}

fn kubectl(kubeconfig: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .expect("kubectl runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn kubectl_cross_check() {
    if Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_err()
    {
        // kubectl comes with the machine image, not from install-deps: skip when absent.
        eprintln!("SKIP kubectl_cross_check: no kubectl on PATH");
        return;
    }
    let api = KubeApi::start().unwrap();
    let dir = interlock_testkit::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kc).unwrap();
    api.put_object(
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
        "spec": {"taints": [{"key": "other.io/x", "effect": "NoSchedule"}]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
    );
    api.put_object(pod("a", "n1", json!({"app": "web"})));
    api.put_object(pod("b", "n2", json!({"app": "web"})));

    let (ok, out, err) = kubectl(&kc, &["get", "nodes", "-o", "json"]);
    assert!(ok, "{err}");
    let nodes: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(nodes["items"][0]["metadata"]["name"], "n1");

    let (ok, out, err) = kubectl(
        &kc,
        &[
            "get",
            "pods",
            "-A",
            "--field-selector",
            "spec.nodeName=n1",
            "-o",
            "name",
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "pod/a");
    let (ok, _, err) = kubectl(
        &kc,
        &["get", "pods", "-A", "--field-selector", "spec.bogus=x"],
    );
    assert!(!ok);
    assert!(
        err.contains("field label not supported: spec.bogus"),
        "{err}"
    );

    let (ok, _, err) = kubectl(
        &kc,
        &[
            "patch",
            "node",
            "n1",
            "--subresource=status",
            "--type=strategic",
            "-p",
            r#"{"status":{"conditions":[{"type":"InterlockReady","status":"False","reason":"Starting"}]}}"#,
        ],
    );
    assert!(ok, "{err}");
    let node = api.get_object("nodes", "", "n1").unwrap();
    assert_eq!(
        node["status"]["conditions"].as_array().unwrap().len(),
        2,
        "merged by type: {node}"
    );
    let (ok, _, err) = kubectl(
        &kc,
        &[
            "patch",
            "node",
            "n1",
            "--type=json",
            "-p",
            r#"[{"op":"test","path":"/spec/taints/0/key","value":"nope"},{"op":"remove","path":"/spec/taints/0"}]"#,
        ],
    );
    assert!(!ok);
    assert!(
        err.contains("the server rejected our request due to an error in our request"),
        "{err}"
    );
    let (ok, _, err) = kubectl(
        &kc,
        &[
            "label",
            "pod",
            "-n",
            "ns",
            "a",
            "interlock.dev/unprotected=true",
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(
        api.get_object("pods", "ns", "a").unwrap()["metadata"]["labels"]
            ["interlock.dev/unprotected"],
        "true"
    );

    // Server-side apply: kubectl's own manager conflicts on the taints it does not own.
    let applied = dir.path().join("node.json");
    std::fs::write(
        &applied,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
        "spec": {"taints": [{"key": "interlock.dev/not-ready", "effect": "NoSchedule"}]}})
        .to_string(),
    )
    .unwrap();
    let (ok, out, err) = kubectl(
        &kc,
        &[
            "apply",
            "--server-side",
            "--validate=false",
            "--field-manager=other",
            "-f",
            applied.to_str().unwrap(),
        ],
    );
    assert!(
        ok,
        "the first apply by a manager that owns nothing yet, on a seeded node: {out} {err}"
    );
    let (ok, _, err) = kubectl(
        &kc,
        &[
            "patch",
            "node",
            "n1",
            "--field-manager=kubelet",
            "--type=merge",
            "-p",
            r#"{"spec":{"taints":[{"key":"other.io/x","effect":"NoSchedule"}]}}"#,
        ],
    );
    assert!(ok, "{err}");
    let (ok, _, err) = kubectl(
        &kc,
        &[
            "apply",
            "--server-side",
            "--validate=false",
            "--field-manager=other",
            "-f",
            applied.to_str().unwrap(),
        ],
    );
    assert!(!ok);
    assert!(
        err.contains("conflict") && err.contains(".spec.taints"),
        "{err}"
    );

    // A field-selected watch sees a change made while it runs.
    let mut watch = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kc)
        .args([
            "get",
            "pods",
            "-A",
            "--field-selector",
            "spec.nodeName=n1",
            "--watch-only",
            "-o",
            "name",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        api.wait_until(Duration::from_secs(10), |a| a.active_watches() == 1),
        "kubectl opened its watch"
    );
    api.put_object(pod("c", "n1", json!({"app": "web"})));
    api.put_object(pod("d", "n2", json!({"app": "web"})));
    std::thread::sleep(Duration::from_millis(500));
    let _ = watch.kill();
    let out = watch.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "pod/c");
    let w = api.requests().into_iter().find(|r| r.is_watch()).unwrap();
    assert_eq!(w.param("fieldSelector"), Some("spec.nodeName=n1"));
}

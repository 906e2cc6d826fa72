//! `interlock check cluster` as a process against the fake Kubernetes API: nodes in
//! different states (ready, gated, without an agent, with a pod labelled unprotected, a
//! Windows node the DaemonSet does not select) get their verdicts and the exit code
//! follows the worst; an unreachable API is "could not check" with a document.

mod common;

use common::*;
use interlock_contract::names::{CONDITION_READY, LABEL_UNPROTECTED, TAINT_NOT_READY};
use interlock_testkit::kubeapi::KubeApi;
use serde_json::{json, Value};

fn node(api: &KubeApi, name: &str, ready: Option<&str>, tainted: bool, os: &str) {
    let mut n = json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/os": os}},
        "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
    if tainted {
        n["spec"]["taints"] = json!([{"key": TAINT_NOT_READY, "effect": "NoSchedule"}]);
    }
    if let Some(s) = ready {
        n["status"]["conditions"].as_array_mut().unwrap().push(
            json!({"type": CONDITION_READY, "status": s,
                "reason": if s == "True" { "Ready" } else { "ConfigNotEffective" },
                "message": "10-calico.conflist sorts ahead"}),
        );
    }
    api.put_object(n);
}

fn pod(api: &KubeApi, ns: &str, name: &str, node: &str, labels: Value, ready: bool) {
    api.put_object(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": if ready { "Running" } else { "Pending" },
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}}));
}

/// An agent pod labelled as the manifests label it, with `version`.
fn agent_pod_of(api: &KubeApi, node: &str, ready: bool, version: &str) {
    pod(
        api,
        "interlock-system",
        &format!("interlock-node-{node}"),
        node,
        json!({"app.kubernetes.io/name": "interlock", "app.kubernetes.io/version": version}),
        ready,
    );
}

/// An agent pod of this release.
fn agent_pod(api: &KubeApi, node: &str, ready: bool) {
    agent_pod_of(api, node, ready, interlock_buildinfo::CRATE_VERSION);
}

fn check_cluster(d: &Dirs, json_out: bool) -> (i32, String) {
    let mut cmd = std::process::Command::new(interlock());
    cmd.args(["check", "cluster"])
        .env("KUBECONFIG", d.tmp.path().join("kubeconfig"))
        .env_remove("KUBERNETES_SERVICE_HOST");
    if json_out {
        cmd.args(["-o", "json"]);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn check_cluster_judges_every_node_from_the_api() {
    let api = KubeApi::start().unwrap();
    let d = Dirs::new();
    api.write_kubeconfig(&d.tmp.path().join("kubeconfig"))
        .unwrap();
    node(&api, "n1-ready", Some("True"), false, "linux");
    agent_pod(&api, "n1-ready", true);
    node(&api, "n2-gated", Some("False"), true, "linux");
    // An agent of an older release, mid-rollout.
    agent_pod_of(&api, "n2-gated", false, "0.0.9");
    node(&api, "n3-no-agent", None, false, "linux");
    node(&api, "w1", None, false, "windows");
    pod(
        &api,
        "shop",
        "web",
        "n1-ready",
        json!({LABEL_UNPROTECTED: "true"}),
        true,
    );
    // A meshed pod that is fine: not labelled, not listed.
    pod(&api, "shop", "cart", "n1-ready", json!({}), true);

    let (code, text) = check_cluster(&d, true);
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(code, 2, "{v:#}");
    assert_eq!(v["kind"], "ClusterCheck");
    assert_eq!(v["schemaVersion"], 1);
    assert_eq!(v["verdict"], "unprotected");
    let nodes = v["nodes"].as_array().unwrap();
    let names: Vec<&str> = nodes.iter().map(|n| n["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["n1-ready", "n2-gated", "n3-no-agent"],
        "Linux nodes only"
    );
    let by = |n: &str| nodes.iter().find(|x| x["name"] == n).unwrap();
    // n1 runs a ready agent but a pod there is labelled unprotected.
    assert_eq!(by("n1-ready")["verdict"], "unprotected");
    assert_eq!(by("n1-ready")["unprotectedPods"], json!(["shop/web"]));
    assert_eq!(by("n1-ready")["agentPod"]["ready"], true);
    assert_eq!(by("n2-gated")["verdict"], "at-risk");
    assert_eq!(by("n2-gated")["interlockReady"], "False");
    assert_eq!(by("n2-gated")["taint"], "NoSchedule");
    assert_eq!(by("n2-gated")["agentPod"]["phase"], "Pending");
    assert_eq!(by("n3-no-agent")["verdict"], "unprotected");
    assert_eq!(by("n3-no-agent")["agentPod"], Value::Null);
    assert_eq!(
        v["unprotectedPods"],
        json!([{"namespace": "shop", "name": "web", "node": "n1-ready"}])
    );
    let ids: Vec<&str> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap())
        .collect();
    assert_eq!(by("n2-gated")["agentPod"]["version"], "0.0.9");
    for id in [
        "cluster.unprotected-pods",
        "cluster.no-agent",
        "cluster.agent-not-ready",
        "cluster.not-ready",
        "cluster.version-skew",
        "cluster.mixed-versions",
    ] {
        assert!(ids.contains(&id), "{id} in {ids:?}");
    }

    let (code, text) = check_cluster(&d, false);
    eprintln!("{text}");
    assert_eq!(code, 2, "{text}");
    assert!(
        text.lines()
            .any(|l| l.contains("n3-no-agent") && l.contains("NONE") && l.contains("UNPROTECTED")),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l.contains("n2-gated")
            && l.contains("False")
            && l.contains("NoSchedule")
            && l.contains("AT RISK")),
        "{text}"
    );

    // Fixed: the agent reaches n2 and n3, the labelled pod is gone: protected (0).
    api.put_object({
        let mut n = api.get_object("nodes", "", "n2-gated").unwrap();
        n["spec"]["taints"] = json!([]);
        n["status"]["conditions"][1]["status"] = json!("True");
        n
    });
    agent_pod(&api, "n2-gated", true);
    node(&api, "n3-no-agent", Some("True"), false, "linux");
    agent_pod(&api, "n3-no-agent", true);
    api.delete_object("pods", "shop", "web");
    let (code, text) = check_cluster(&d, true);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["protected"], true);
    assert!(
        v["summary"]
            .as_str()
            .unwrap()
            .contains("every Linux node (3)"),
        "{v:#}"
    );
}

#[test]
fn an_unreachable_api_is_could_not_check_with_a_document() {
    let d = Dirs::new();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::fs::write(
        d.tmp.path().join("kubeconfig"),
        format!("apiVersion: v1\nkind: Config\nclusters:\n- name: x\n  cluster:\n    server: http://127.0.0.1:{port}\nusers:\n- name: x\n  user:\n    token: t\ncontexts:\n- name: x\n  context:\n    cluster: x\n    user: x\ncurrent-context: x\n"),
    )
    .unwrap();
    let (code, text) = check_cluster(&d, true);
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(code, 3, "{v:#}");
    assert_eq!(v["verdict"], "could-not-check");
    assert_eq!(v["findings"][0]["id"], "check.api-unreachable");
    assert_eq!(v["nodes"], Value::Null);
}

//! `interlock check cluster` as a process against the fake Kubernetes API: nodes in
//! different states (ready, gated, without an agent, with a pod labelled unprotected, a
//! Windows node the DaemonSet does not select) get their verdicts and the exit code
//! follows the worst; an unreachable API is "could not check" with a document.

use crate::common;

use common::*;
use interlock_contract::names::{CONDITION_READY, LABEL_UNPROTECTED, TAINT_NOT_READY};
use interlock_testkit_node::kubeapi::KubeApi;
use serde_json::{json, Value};

/// A fake API server and throwaway dirs holding a kubeconfig for it.
fn cluster() -> (KubeApi, Dirs) {
    let api = KubeApi::start().unwrap();
    let d = Dirs::new();
    api.write_kubeconfig(&d.tmp.path().join("kubeconfig"))
        .unwrap();
    (api, d)
}

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
    let (api, d) = cluster();
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

/// A kubeconfig for a server on 127.0.0.1:`port` (plain HTTP, a token).
fn kubeconfig_for(port: u16) -> String {
    format!("apiVersion: v1\nkind: Config\nclusters:\n- name: x\n  cluster:\n    server: http://127.0.0.1:{port}\nusers:\n- name: x\n  user:\n    token: t\ncontexts:\n- name: x\n  context:\n    cluster: x\n    user: x\ncurrent-context: x\n")
}

#[test]
fn an_unreachable_api_is_could_not_check_with_a_document() {
    let d = Dirs::new();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::fs::write(d.tmp.path().join("kubeconfig"), kubeconfig_for(port)).unwrap();
    let (code, text) = check_cluster(&d, true);
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(code, 3, "{v:#}");
    assert_eq!(v["verdict"], "could-not-check");
    assert_eq!(v["findings"][0]["id"], "check.api-unreachable");
    assert_eq!(v["nodes"], Value::Null);
    // What failed, where, and what to do; no client log line, no debug text.
    let m = v["findings"][0]["message"].as_str().unwrap();
    assert!(
        m.contains(&format!("http://127.0.0.1:{port}")) && m.contains("connection refused"),
        "{m}"
    );
    assert!(v["findings"][0]["hint"]
        .as_str()
        .unwrap()
        .contains("--kubeconfig"));
    let (_, text, err) = check_cluster_with(&d, &[]);
    no_debug_text(&text);
    assert!(
        !err.contains("kube_client"),
        "a stray client log line: {err}"
    );
}

/// `check cluster` with extra arguments and the kubeconfig in `d`: (exit code, stdout,
/// stderr).
fn check_cluster_with(d: &Dirs, args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(interlock())
        .args(["check", "cluster"])
        .args(args)
        .env("KUBECONFIG", d.tmp.path().join("kubeconfig"))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn finding<'a>(v: &'a Value, id: &str) -> &'a Value {
    v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == id)
        .unwrap_or_else(|| panic!("no {id}: {v:#}"))
}

/// The finding `id` is there with `status`, its message containing `needle`.
fn expect_finding(v: &Value, id: &str, status: &str, needle: &str) {
    let f = finding(v, id);
    assert_eq!(f["status"], status, "{f}");
    assert!(
        f["message"].as_str().unwrap().contains(needle),
        "{needle:?} not in {f}"
    );
}

/// No Rust debug text in what an operator reads.
fn no_debug_text(text: &str) {
    for needle in [
        "Status {",
        "Some(",
        "ServiceError",
        "ApiError:",
        "HyperError",
    ] {
        assert!(!text.contains(needle), "{needle:?} in {text}");
    }
}

/// A crash-looping agent reads as such, with its restarts and how it last ended, in the
/// table and the document — never "(Running)".
#[test]
fn a_crash_looping_agent_is_named_with_its_last_termination() {
    let (api, d) = cluster();
    node(&api, "n1", Some("False"), true, "linux");
    api.put_object(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "interlock-node-aaaa", "namespace": "interlock-system",
            "labels": {"app.kubernetes.io/name": "interlock",
                "app.kubernetes.io/version": interlock_buildinfo::CRATE_VERSION}},
        "spec": {"nodeName": "n1", "containers": [{"name": "agent", "image": "x"}]},
        "status": {"phase": "Running",
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [{"name": "agent", "image": "x", "imageID": "", "ready": false,
                "restartCount": 7,
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m0s"}},
                "lastState": {"terminated": {"reason": "Error", "exitCode": 2,
                    "message": "plugin config /etc/interlock/plugin-config.json: field x: not an interlock-cni setting"}}}]}}));
    // Another node's agent is ready again after being OOM-killed once: a warning.
    node(&api, "n2", Some("True"), false, "linux");
    api.put_object(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "interlock-node-bbbb", "namespace": "interlock-system",
            "labels": {"app.kubernetes.io/name": "interlock",
                "app.kubernetes.io/version": interlock_buildinfo::CRATE_VERSION}},
        "spec": {"nodeName": "n2", "containers": [{"name": "agent", "image": "x"}]},
        "status": {"phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "agent", "image": "x", "imageID": "", "ready": true,
                "restartCount": 1, "state": {"running": {}},
                "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]}}));
    let (code, text, _) = check_cluster_with(&d, &[]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.lines()
            .any(|l| l.contains("interlock-node-bbbb (ready, 1 restart)")),
        "{text}"
    );
    let row = text
        .lines()
        .find(|l| l.contains("interlock-node-aaaa"))
        .unwrap();
    assert!(row.contains("(CrashLoopBackOff, 7 restarts)"), "{row}");
    assert!(!row.contains("Running"), "{row}");
    let (_, json_text, _) = check_cluster_with(&d, &["-o", "json"]);
    let v: Value = serde_json::from_str(&json_text).unwrap();
    let f = finding(&v, "cluster.agent-crashlooping");
    let m = f["message"].as_str().unwrap();
    assert!(
        m.contains("Error, exit code 2") && m.contains("field x: not an interlock-cni setting"),
        "{m}"
    );
    assert!(f["hint"].as_str().unwrap().contains("--previous"), "{f}");
    assert_eq!(v["nodes"][0]["agentPod"]["restarts"], 7);
    expect_finding(
        &v,
        "cluster.agent-restarted",
        "warn",
        "OOMKilled, exit code 137",
    );
    assert_eq!(v["nodes"][0]["agentPod"]["waiting"], "CrashLoopBackOff");
}

/// Leftover istio-cni and linkerd-cni DaemonSets, found by their charts' labels: on a
/// node with interlock's agent a hole, elsewhere a migration under way.
#[test]
fn leftover_mesh_cni_daemonsets_are_found() {
    let (api, d) = cluster();
    node(&api, "n1", Some("True"), false, "linux");
    agent_pod(&api, "n1", true);
    node(&api, "n2", None, true, "linux");
    let daemonset = |ns: &str, name: &str, labels: Value| {
        api.put_object(json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "install-cni", "image": "x"}]}}}}));
    };
    daemonset(
        "istio-system",
        "istio-cni-node",
        json!({"k8s-app": "istio-cni-node"}),
    );
    pod(
        &api,
        "istio-system",
        "istio-cni-node-x1",
        "n1",
        json!({"k8s-app": "istio-cni-node"}),
        true,
    );
    daemonset(
        "linkerd-cni",
        "linkerd-cni",
        json!({"k8s-app": "linkerd-cni"}),
    );
    pod(
        &api,
        "linkerd-cni",
        "linkerd-cni-y2",
        "n2",
        json!({"k8s-app": "linkerd-cni"}),
        true,
    );
    // A primary CNI's DaemonSet is no mesh's.
    daemonset(
        "kube-system",
        "calico-node",
        json!({"k8s-app": "calico-node"}),
    );
    let (code, text, _) = check_cluster_with(&d, &["-o", "json"]);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(code, 2, "{v:#}");
    expect_finding(
        &v,
        "cluster.other-mesh-cni",
        "fail",
        "istio-cni DaemonSet istio-system/istio-cni-node also runs on n1",
    );
    let elsewhere = finding(&v, "cluster.other-mesh-cni-elsewhere");
    assert_eq!(elsewhere["status"], "warn");
    assert!(elsewhere["message"]
        .as_str()
        .unwrap()
        .contains("linkerd-cni/linkerd-cni"));
    assert!(!text.contains("calico-node"), "{text}");
}

/// Guard mode (interlock's ConfigMap says so): the guarded mesh's CNI DaemonSet is not a
/// leftover; it must tolerate the startup taint and run on every agent's node. Consul's
/// chart tolerates `CriticalAddonsOnly` and every `NoExecute` taint only
/// (hashicorp/consul-k8s `charts/consul/templates/cni-daemonset.yaml`).
#[test]
fn a_guarded_mesh_cni_must_tolerate_the_taint_and_run_beside_every_agent() {
    let (api, d) = cluster();
    for n in ["n1", "n2"] {
        node(&api, n, Some("True"), false, "linux");
        agent_pod(&api, n, true);
    }
    api.put_object(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "interlock-config", "namespace": "interlock-system"},
        "data": {"INTERLOCK_CONFIG_MODE": "guard", "INTERLOCK_GUARD_MESH": "consul",
            "INTERLOCK_TAINT_EFFECT": "NoSchedule"}}));
    let labels = json!({"app": "consul", "component": "cni"});
    let consul_ds = |tolerations: Value| {
        api.put_object(json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "consul-cni", "namespace": "consul", "labels": labels},
            "spec": {"selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels},
                    "spec": {"tolerations": tolerations,
                        "containers": [{"name": "install-cni", "image": "x"}]}}}}));
    };
    consul_ds(json!([
        {"key": "CriticalAddonsOnly", "operator": "Exists"},
        {"effect": "NoExecute", "operator": "Exists"}
    ]));
    pod(&api, "consul", "consul-cni-a1", "n1", labels.clone(), true);
    let (code, text, _) = check_cluster_with(&d, &["-o", "json"]);
    let v: Value = serde_json::from_str(&text).unwrap();
    // At risk, not unprotected: the agents hold the pods the mesh cannot redirect.
    assert_eq!(code, 1, "{v:#}");
    assert_eq!(v["verdict"], "at-risk");
    assert!(
        !text.contains("cluster.other-mesh-cni"),
        "the guarded mesh is no leftover: {v:#}"
    );
    expect_finding(
        &v,
        "cluster.guarded-mesh-cni-untolerated",
        "fail",
        "consul-cni DaemonSet consul/consul-cni does not tolerate interlock.dev/not-ready:NoSchedule",
    );
    expect_finding(
        &v,
        "cluster.guarded-mesh-cni-absent",
        "fail",
        "no consul-cni pod on n2",
    );
    // Tolerating the taint and running on both nodes: nothing left to say.
    consul_ds(json!([{"key": TAINT_NOT_READY, "operator": "Exists"}]));
    pod(&api, "consul", "consul-cni-b2", "n2", labels.clone(), true);
    let (code, text, _) = check_cluster_with(&d, &["-o", "json"]);
    assert_eq!(code, 0, "{text}");
    assert!(!text.contains("cluster.guarded-mesh"), "{text}");
}

/// Hints name the namespace the agent was looked for in.
#[test]
fn hints_name_the_namespace_given() {
    let (api, d) = cluster();
    node(&api, "n1", None, false, "linux");
    let (code, text, _) = check_cluster_with(&d, &["--namespace", "mesh-guard", "-o", "json"]);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(code, 2, "{v:#}");
    let hint = finding(&v, "cluster.no-agent")["hint"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(hint.contains("kubectl -n mesh-guard get ds"), "{hint}");
    assert!(!text.contains("interlock-system"), "{text}");
}

/// --kubeconfig and --context choose the cluster; a missing file or context is named,
/// with the contexts there are.
#[test]
fn kubeconfig_and_context_flags_choose_the_cluster() {
    let api = KubeApi::start().unwrap();
    let d = Dirs::new();
    let good = d.tmp.path().join("good.yaml");
    api.write_kubeconfig(&good).unwrap();
    node(&api, "n1", Some("True"), false, "linux");
    agent_pod(&api, "n1", true);
    // $KUBECONFIG points at a dead server; --kubeconfig wins.
    std::fs::write(
        d.tmp.path().join("kubeconfig"),
        "apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n",
    )
    .unwrap();
    let (code, text, _) = check_cluster_with(&d, &["--kubeconfig", good.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    // Two contexts: the current one dead, the other the fake.
    let text = std::fs::read_to_string(&good).unwrap();
    let two = text.replace("current-context: fake", "current-context: dead") + "";
    let two = two.replace(
        "contexts:\n",
        "contexts:\n- name: dead\n  context:\n    cluster: dead\n    user: fake\n",
    );
    let two = two.replace(
        "clusters:\n",
        "clusters:\n- name: dead\n  cluster:\n    server: http://127.0.0.1:1\n",
    );
    let both = d.tmp.path().join("both.yaml");
    std::fs::write(&both, two).unwrap();
    let b = both.to_str().unwrap();
    let (code, text, _) = check_cluster_with(&d, &["--kubeconfig", b, "--context", "fake"]);
    assert_eq!(code, 0, "{text}");
    let (code, text, _) =
        check_cluster_with(&d, &["--kubeconfig", b, "--context", "nope", "-o", "json"]);
    assert_eq!(code, 3, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let m = finding(&v, "check.no-credentials")["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        m.contains("no context \"nope\"") && m.contains("dead, fake"),
        "{m}"
    );
    let (code, text, _) =
        check_cluster_with(&d, &["--kubeconfig", "/nonexistent/kc", "-o", "json"]);
    assert_eq!(code, 3, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let m = finding(&v, "check.no-credentials")["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        m.contains("kubeconfig /nonexistent/kc (from --kubeconfig) does not exist"),
        "{m}"
    );
    assert!(!m.contains("\\\""), "no double quoting: {m}");
}

/// 401 and 403 each get their own id, saying what to do; a 403 names the verb and the
/// resource that were refused. No debug structs.
#[test]
fn unauthorized_and_forbidden_say_what_to_fix() {
    use interlock_testkit_node::kubeapi::{FailRule, UserInfo};
    let (api, d) = cluster();
    node(&api, "n1", Some("True"), false, "linux");
    agent_pod(&api, "n1", true);
    api.fail_next_matching(FailRule {
        remaining: 1,
        code: 401,
        method: Some("GET".into()),
        path_contains: Some("/api/v1/nodes".into()),
    });
    let (code, text, err) = check_cluster_with(&d, &["-o", "json"]);
    assert_eq!(code, 3, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let f = finding(&v, "check.api-unauthorized");
    assert!(
        f["message"].as_str().unwrap().contains("401 Unauthorized"),
        "{f}"
    );
    assert!(f["hint"].as_str().unwrap().contains("renew"), "{f}");
    no_debug_text(&text);
    no_debug_text(&err);
    // Any other answer: the code, the reason and the call.
    api.fail_next_matching(FailRule {
        remaining: 1,
        code: 500,
        method: Some("GET".into()),
        path_contains: Some("/api/v1/nodes".into()),
    });
    let (code, text, _) = check_cluster_with(&d, &["-o", "json"]);
    assert_eq!(code, 3, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let m = finding(&v, "check.api-error")["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        m.contains("answered 500") && m.contains("to list nodes"),
        "{m}"
    );

    // A user RBAC lets list nodes and pods, but not DaemonSets: the check stands,
    // and says what it could not look at.
    api.add_token(
        "dev-token",
        UserInfo {
            username: "dev".into(),
            groups: vec!["system:authenticated".into()],
            extra: Default::default(),
        },
    );
    api.write_kubeconfig_with_token(&d.tmp.path().join("kubeconfig"), "dev-token")
        .unwrap();
    let (code, text, err) = check_cluster_with(&d, &["-o", "json"]);
    assert_eq!(code, 3, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let f = finding(&v, "check.api-forbidden");
    let m = f["message"].as_str().unwrap();
    assert!(
        m.contains("may not list nodes (403 Forbidden)") && m.contains("User \"dev\""),
        "{m}"
    );
    let h = f["hint"].as_str().unwrap();
    assert!(h.contains("kubectl auth can-i list nodes"), "{h}");
    no_debug_text(&text);
    no_debug_text(&err);

    api.put_object(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "viewer"},
        "rules": [{"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["list"]}]}),
    );
    api.put_object(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "dev-viewer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "viewer"},
        "subjects": [{"kind": "User", "name": "dev", "apiGroup": "rbac.authorization.k8s.io"}]}));
    let (code, text, _) = check_cluster_with(&d, &["-o", "json"]);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(code, 0, "a warning only: {v:#}");
    expect_finding(
        &v,
        "cluster.daemonsets-unreadable",
        "warn",
        "may not list daemonsets.apps in every namespace",
    );
    expect_finding(
        &v,
        "cluster.nodepools-unreadable",
        "warn",
        "may not list nodepools.karpenter.sh",
    );
}

/// Karpenter's NodePools (a cluster with its CRDs): one without the startup taint and one
/// with it among its permanent taints are named, one with it among its startup taints is
/// not; interlock's DaemonSet mid-rollout is counted as its controller counts it.
#[test]
fn node_pools_without_the_startup_taint_and_a_rollout_are_named() {
    let (api, d) = cluster();
    node(&api, "n1", Some("True"), false, "linux");
    agent_pod(&api, "n1", true);
    let taint = json!([{"key": TAINT_NOT_READY, "effect": "NoSchedule"}]);
    for (name, field) in [
        ("pool-startup", Some("startupTaints")),
        ("pool-bare", None),
        ("pool-permanent", Some("taints")),
    ] {
        let mut spec = json!({"nodeClassRef": {"group": "karpenter.k8s.aws",
            "kind": "EC2NodeClass", "name": "default"}, "requirements": []});
        if let Some(f) = field {
            spec[f] = taint.clone();
        }
        api.put_object(json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool",
            "metadata": {"name": name}, "spec": {"template": {"spec": spec}}}));
    }
    api.put_object(json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "interlock-node", "namespace": "interlock-system",
            "labels": {"app.kubernetes.io/name": "interlock"}},
        "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": "interlock"}},
            "template": {"metadata": {"labels": {"app.kubernetes.io/name": "interlock"}},
                "spec": {"containers": [{"name": "agent", "image": "x"}]}}},
        "status": {"desiredNumberScheduled": 3, "currentNumberScheduled": 3,
            "numberMisscheduled": 0, "numberReady": 2, "updatedNumberScheduled": 1}}));
    let (code, text, _) = check_cluster_with(&d, &["-o", "json"]);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(code, 0, "warnings only: {v:#}");
    let bare = finding(&v, "cluster.nodepool-no-startup-taint");
    assert_eq!(bare["status"], "warn");
    let m = bare["message"].as_str().unwrap();
    assert!(
        m.contains("pool-bare") && !m.contains("pool-startup"),
        "{m}"
    );
    assert!(bare["hint"].as_str().unwrap().contains("startupTaints"));
    expect_finding(
        &v,
        "cluster.nodepool-permanent-taint",
        "warn",
        "pool-permanent",
    );
    expect_finding(
        &v,
        "cluster.daemonset-rollout",
        "warn",
        "interlock-system/interlock-node: 3 desired, 2 ready, 1 up to date",
    );
    assert!(!text.contains("pool-startup"), "{text}");
}

/// A server that accepts and never answers: "did not answer within" the --timeout given,
/// well before the default 30 s.
#[test]
fn a_silent_api_server_times_out_at_the_timeout_given() {
    let d = Dirs::new();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let held = std::thread::spawn(move || {
        // Keep the connections open, silent, until the check gives up.
        let mut open = Vec::new();
        listener.set_nonblocking(true).unwrap();
        let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::time::Instant::now() < until && open.len() < 8 {
            match listener.accept() {
                Ok((s, _)) => open.push(s),
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(50)),
            }
        }
    });
    std::fs::write(d.tmp.path().join("kubeconfig"), kubeconfig_for(port)).unwrap();
    let started = std::time::Instant::now();
    let (code, text, _) = check_cluster_with(&d, &["--timeout", "1s", "-o", "json"]);
    let took = started.elapsed();
    assert_eq!(code, 3, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let m = finding(&v, "check.api-unreachable")["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        m.contains(&format!("127.0.0.1:{port} did not answer within 1 s")),
        "{m}"
    );
    assert!(took < std::time::Duration::from_secs(25), "took {took:?}");
    drop(held);
}

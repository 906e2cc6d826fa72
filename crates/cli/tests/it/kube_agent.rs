//! `interlock agent` as a process against the fake Kubernetes API server: the node keeps
//! its startup taint until the agent is ready, loses it, and gets it back (with
//! `InterlockReady=False`) when a foreign config takes first place for longer than the
//! debounce.

use crate::common;

use common::*;
use interlock_agent::kubernetes::gating::LOSS_DEBOUNCE;
use interlock_contract::names::{CONDITION_READY, TAINT_NOT_READY};
use interlock_testkit_node::kubeapi::KubeApi;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn taint_keys(api: &KubeApi) -> Vec<String> {
    api.get_object("nodes", "", "n1").unwrap()["spec"]["taints"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|t| t["key"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

fn condition(api: &KubeApi) -> Option<Value> {
    api.get_object("nodes", "", "n1").unwrap()["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == CONDITION_READY)
        .cloned()
}

#[test]
fn node_is_gated_by_the_agents_readiness() {
    let api = KubeApi::start().unwrap();
    // As a node pool registers it: with the startup taint (and another component's).
    api.put_object(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
        "spec": {"taints": [{"key": TAINT_NOT_READY, "effect": "NoSchedule"}, {"key": "gpu", "effect": "NoSchedule"}]}}));
    let d = Dirs::new();
    let kubeconfig = d.tmp.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    // No node name: a clear error, not a silent run without gating.
    let out = d
        .interlock("agent")
        .arg("--kube=auto")
        .arg("--plugin-source")
        .arg(plugin())
        .arg("--health-addr")
        .arg("127.0.0.1:0")
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("NODE_NAME")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--node-name") && err.contains("NODE_NAME"),
        "{err}"
    );
    assert_eq!(
        d.names(),
        Vec::<String>::new(),
        "the refused agent wrote a config"
    );

    // The primary's config is not there yet: the agent cannot be ready, the taint stays.
    let a = Agent::start_env(
        &d,
        &["--kube=auto", "--node-name", "n1"],
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
    );
    assert!(
        api.wait_until(Duration::from_secs(10), |api| condition(api).is_some()),
        "no condition written; log:\n{}",
        a.log_text()
    );
    assert_eq!(condition(&api).unwrap()["status"], "False");
    assert_eq!(taint_keys(&api), [TAINT_NOT_READY, "gpu"]);
    assert!(a.log_text().contains("kubeconfig"), "{}", a.log_text());

    d.write("10-calico.conflist", CALICO);
    wait_protected(&d, &a);
    assert!(
        api.wait_until(Duration::from_secs(5), |api| taint_keys(api) == ["gpu"]),
        "taint not removed on ready; log:\n{}",
        a.log_text()
    );
    assert!(api.wait_until(Duration::from_secs(5), |api| condition(api)
        .is_some_and(|c| c["status"] == "True")));

    // A foreign file takes first place and stays: after the debounce, the taint is back
    // and the condition says why.
    let t0 = Instant::now();
    d.rename_in("\u{1}first.conflist", CALICO);
    assert!(
        api.wait_until(LOSS_DEBOUNCE + Duration::from_secs(5), |api| taint_keys(
            api
        ) == [
            "gpu",
            TAINT_NOT_READY
        ]),
        "taint not back; log:\n{}",
        a.log_text()
    );
    assert!(
        t0.elapsed() >= LOSS_DEBOUNCE - Duration::from_millis(100),
        "taint back before the debounce: {:?}",
        t0.elapsed()
    );
    let c = condition(&api).unwrap();
    assert_eq!(c["status"], "False");
    assert!(
        c["message"].as_str().unwrap().contains("first.conflist"),
        "{c}"
    );
    // The Events follow the node's writes (published after them): wait for them.
    let reasons = |api: &KubeApi| -> Vec<String> {
        api.objects("events")
            .iter()
            .map(|e| e["reason"].as_str().unwrap_or("").into())
            .collect()
    };
    assert!(
        api.wait_until(Duration::from_secs(5), |api| {
            let r = reasons(api);
            r.iter().any(|x| x == "ProtectionLost") && r.iter().any(|x| x == "ConfigTakenOver")
        }),
        "{:?}",
        reasons(&api)
    );

    // Removed again: ready, the taint goes.
    std::fs::remove_file(d.conf.join("\u{1}first.conflist")).unwrap();
    assert!(api.wait_until(Duration::from_secs(5), |api| taint_keys(api) == ["gpu"]));
    // Every pod request was field-selected to this node.
    for r in api.requests().iter().filter(|r| r.path.contains("/pods")) {
        assert_eq!(
            r.param("fieldSelector"),
            Some("spec.nodeName=n1"),
            "{} {}?{}",
            r.method,
            r.path,
            r.query
        );
    }
    a.terminate();
}

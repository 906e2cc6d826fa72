//! Least privilege at cluster scope (redteam-3 M-4): the objects `interlock manifests`
//! renders (ClusterRole, its binding, the ValidatingAdmissionPolicy and its binding) are
//! loaded into the fake API server, which evaluates RBAC and the policy's own CEL
//! expressions for the agent's service account tokens, each bound to a node as a
//! Kubernetes ≥ 1.30 pod-bound token is (`authentication.kubernetes.io/node-name`). The
//! token of node A can taint only node A and change only node A's pods; it cannot taint
//! node B, evict or delete a pod on node B, or label it. The agent's own node gate and
//! Events work within the policy.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use interlock_agent::health::shared::{Readiness, Shared};
use interlock_agent::kubernetes::actions::PodActions;
use interlock_agent::kubernetes::pods::PodKey;
use interlock_agent::kubernetes::{self, KubeSettings};
use interlock_testkit_node::kubeapi::{KubeApi, UserInfo};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams};
use serde::Deserialize;
use serde_json::{json, Value};

fn manifests(set: &[&str]) -> Vec<Value> {
    let mut cmd = std::process::Command::new(common::interlock());
    cmd.arg("manifests");
    for s in set {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_yaml_ng::Deserializer::from_str(&String::from_utf8(out.stdout).unwrap())
        .map(|d| Value::deserialize(d).unwrap())
        .collect()
}

/// A fake API with the rendered access objects, nodes a and b, a pod on each, and one
/// token per node (plus one without the node claim).
fn cluster(set: &[&str]) -> KubeApi {
    let api = KubeApi::start().unwrap();
    let mut loaded = 0;
    for d in manifests(set) {
        let kind = d["kind"].as_str().unwrap_or("");
        if [
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ]
        .contains(&kind)
        {
            api.put_object(d);
            loaded += 1;
        }
    }
    assert!(loaded >= 6, "the manifests lack the access objects");
    for n in ["a", "b"] {
        api.put_object(
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n},
            "spec": {"taints": [{"key": "interlock.dev/not-ready", "effect": "NoSchedule"}]}}),
        );
        api.put_object(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("web-{n}"), "namespace": "shop", "labels": {"app": "web"}},
            "spec": {"nodeName": n, "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Running"}}));
        api.add_token(
            &format!("token-{n}"),
            UserInfo::service_account("interlock-system", "interlock", Some(n)),
        );
    }
    api.add_token(
        "token-unbound",
        UserInfo::service_account("interlock-system", "interlock", None),
    );
    api
}

async fn client(api: &KubeApi, token: &str) -> kube::Client {
    let dir = interlock_testkit::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    api.write_kubeconfig_with_token(&path, token).unwrap();
    let config = interlock_agent::kubernetes::config_from_kubeconfig(path.to_str().unwrap())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

fn pod_key(api: &KubeApi, name: &str) -> PodKey {
    PodKey {
        namespace: "shop".into(),
        name: name.into(),
        uid: api.get_object("pods", "shop", name).unwrap()["metadata"]["uid"]
            .as_str()
            .unwrap()
            .into(),
    }
}

async fn untaint(client: &kube::Client, node: &str) -> Result<Node, kube::Error> {
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": []}})),
        )
        .await
}

fn code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_token_cannot_taint_another_node_or_touch_its_pods() {
    let api = cluster(&[]);
    let a = client(&api, "token-a").await;
    let actions = PodActions::new(a.clone(), "a");

    // Node b: no taint edit, no condition, no eviction, no delete, no label.
    let e = untaint(&a, "b").await.unwrap_err();
    assert_eq!(code(&e), Some(422), "{e}");
    assert!(
        e.to_string().contains("may change only its own Node"),
        "{e}"
    );
    let status = Api::<Node>::all(a.clone())
        .patch_status(
            "b",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"status": {"conditions": [{"type": "InterlockReady", "status": "False"}]}}),
            ),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&status), Some(422), "{status}");
    let web_b = pod_key(&api, "web-b");
    let e = actions
        .evict(&web_b, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert_eq!(e.source.code(), Some(403), "{e}");
    let e = actions.delete(&web_b).await.unwrap_err();
    assert_eq!(e.source.code(), Some(422), "{e}");
    assert!(e.to_string().contains("pods bound to its node"), "{e}");
    let e = actions.label(&web_b, None, true).await.unwrap_err();
    assert_eq!(e.source.code(), Some(422), "{e}");
    assert_eq!(
        api.get_object("nodes", "", "b").unwrap()["spec"]["taints"][0]["key"],
        "interlock.dev/not-ready"
    );
    assert!(
        api.get_object("pods", "shop", "web-b").unwrap()["metadata"]["labels"]
            .get("interlock.dev/unprotected")
            .is_none()
    );
    // Nothing else of node b's was written.
    assert!(api.get_object("pods", "shop", "web-b").is_some());

    // Its own node and pods: allowed (eviction is not granted without the evict policy).
    untaint(&a, "a").await.unwrap();
    let web_a = pod_key(&api, "web-a");
    assert!(actions.label(&web_a, None, true).await.unwrap());
    assert_eq!(
        actions
            .evict(&web_a, Duration::from_secs(1))
            .await
            .unwrap_err()
            .source
            .code(),
        Some(403)
    );
    actions.delete(&web_a).await.unwrap();

    // A token without the node claim (a cluster before 1.30, or the feature off)
    // changes nothing, and says why.
    let unbound = client(&api, "token-unbound").await;
    let e = untaint(&unbound, "b").await.unwrap_err();
    assert!(e.to_string().contains("no node claim"), "{e}");
    // Reads are RBAC's alone (an admission policy sees only writes).
    assert!(Api::<Pod>::all(a).list(&Default::default()).await.is_ok());
}

/// Uninstall-on-exit `when-deleted` reads the agent's DaemonSet: the rendered Role lets
/// the agent's token get the DaemonSets of its own namespace, and no other namespace's
/// (nor list them across the cluster); the exit check works with exactly these grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_reads_daemonsets_in_its_own_namespace_only() {
    use interlock_agent::kubernetes::owner;
    use k8s_openapi::api::apps::v1::DaemonSet;
    let api = cluster(&[]);
    let ds = |ns: &str| {
        json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
               "metadata": {"name": "interlock-node", "namespace": ns},
               "spec": {"selector": {"matchLabels": {"app": "x"}},
                        "template": {"metadata": {"labels": {"app": "x"}},
                                     "spec": {"containers": [{"name": "c", "image": "i"}]}}}})
    };
    let ours = api.put_object(ds("interlock-system"));
    api.put_object(ds("kube-system"));
    api.put_object(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "interlock-node-a", "namespace": "interlock-system",
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                          "name": "interlock-node", "uid": ours["metadata"]["uid"],
                                          "controller": true}]},
        "spec": {"nodeName": "a", "containers": [{"name": "agent", "image": "i"}]}}));
    let a = client(&api, "token-a").await;
    Api::<DaemonSet>::namespaced(a.clone(), "interlock-system")
        .get("interlock-node")
        .await
        .unwrap();
    let e = Api::<DaemonSet>::namespaced(a.clone(), "kube-system")
        .get("interlock-node")
        .await
        .unwrap_err();
    assert_eq!(code(&e), Some(403), "{e}");
    let e = Api::<DaemonSet>::all(a.clone())
        .list(&Default::default())
        .await
        .unwrap_err();
    assert_eq!(code(&e), Some(403), "{e}");
    let d = owner::ask(a, "interlock-system", "interlock-node-a").await;
    assert!(matches!(d, Ok(owner::ExitDecision::Keep(_))), "{d:?}");
}

/// With `repairPolicy=evict` the Eviction grant is rendered, and what no admission
/// policy can narrow is as documented: the token may evict a pod on another node
/// (PodDisruptionBudgets still apply). Deletes and labels stay node-scoped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_evict_policys_grant_is_cluster_wide_as_documented() {
    let api = cluster(&["repairPolicy=evict"]);
    let a = client(&api, "token-a").await;
    let actions = PodActions::new(a, "a");
    let web_b = pod_key(&api, "web-b");
    assert_eq!(
        actions.delete(&web_b).await.unwrap_err().source.code(),
        Some(422)
    );
    actions.evict(&web_b, Duration::from_secs(1)).await.unwrap();
}

/// The agent's own Kubernetes side (node gate, its Events) works within the policy with
/// its node's token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_gate_and_events_work_within_the_policy() {
    let api = cluster(&[]);
    let shared = Arc::new(Shared::default());
    let _cluster = kubernetes::start(
        client(&api, "token-a").await,
        &KubeSettings {
            node: "a".into(),
            effect: interlock_agent::kubernetes::gating::TaintEffect::NoSchedule,
            resync: Duration::from_secs(600),
        },
        shared.clone(),
    );
    shared.set_readiness(Readiness {
        ready: true,
        reason: "ok".into(),
        effective: Some("00-interlock.conflist".into()),
    });
    let t0 = Instant::now();
    while api.get_object("nodes", "", "a").unwrap()["spec"]["taints"]
        .as_array()
        .is_some_and(|t| !t.is_empty())
    {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the gate could not untaint its own node: {:?}",
            api.requests()
                .iter()
                .filter(|r| r.status >= 400)
                .map(|r| format!("{} {} {}", r.method, r.path, r.status))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cond = api.get_object("nodes", "", "a").unwrap()["status"]["conditions"].clone();
    assert!(cond.to_string().contains("InterlockReady"), "{cond}");
    // Its Events are admitted (reported as its own node's agent).
    let web_a = pod_key(&api, "web-a");
    PodActions::new(client(&api, "token-a").await, "a")
        .event(&web_a, true, "Unprotected", "x")
        .await;
    assert!(api
        .objects("events")
        .iter()
        .any(|e| e["reason"] == "Unprotected"));
    // Reporting as another node's agent is refused.
    PodActions::new(client(&api, "token-a").await, "b")
        .event(&web_a, true, "Forged", "x")
        .await;
    assert!(!api
        .objects("events")
        .iter()
        .any(|e| e["reason"] == "Forged"));
    assert!(api
        .requests()
        .iter()
        .any(|r| r.path.contains("/events") && r.status == 422));
}

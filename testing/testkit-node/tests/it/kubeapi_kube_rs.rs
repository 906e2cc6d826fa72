//! kube-rs, the client the agent uses, against the fake: typed Api calls, and
//! `kube_runtime::watcher` + reflector recovering (re-list after 410) when the server
//! compacts its history and restarts.

use futures::StreamExt;
use interlock_testkit_node::kubeapi::KubeApi;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use serde_json::json;
use std::time::Duration;

async fn kube_client(api: &KubeApi) -> kube::Client {
    let dir = interlock_testkit::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    api.write_kubeconfig(&path).unwrap();
    let kc = Kubeconfig::read_from(&path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

fn pod(name: &str, node: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns"},
           "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
           "status": {"phase": "Running"}})
}

#[tokio::test(flavor = "multi_thread")]
async fn typed_api_calls() {
    let api = KubeApi::start().unwrap();
    let client = kube_client(&api).await;
    let nodes: Api<Node> = Api::all(client.clone());
    let n: Node = serde_json::from_value(json!({"metadata": {"name": "n1"}, "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]}})).unwrap();
    let created = nodes.create(&PostParams::default(), &n).await.unwrap();
    assert!(created.metadata.uid.is_some());
    let err = nodes.create(&PostParams::default(), &n).await.unwrap_err();
    match err {
        kube::Error::Api(s) => assert_eq!((s.code, s.reason.as_str()), (409, "AlreadyExists")),
        other => panic!("expected a 409, got {other}"),
    }
    let patched = nodes
        .patch_status(
            "n1",
            &PatchParams::default(),
            &Patch::Strategic(json!({"status": {"conditions": [{"type": "InterlockReady", "status": "True", "reason": "Protected", "message": "ok"}]}})),
        )
        .await
        .unwrap();
    let conds = patched.status.unwrap().conditions.unwrap();
    assert_eq!(conds[0].type_, "InterlockReady");
    // Server-side apply of a taint list that drops the creator's taint: a conflict.
    let ssa = PatchParams::apply("interlock");
    let ours = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
                      "spec": {"taints": [{"key": "interlock.dev/not-ready", "effect": "NoSchedule"}]}});
    match nodes
        .patch("n1", &ssa, &Patch::Apply(&ours))
        .await
        .unwrap_err()
    {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 409);
            assert!(s.message.contains(".spec.taints"), "{}", s.message);
        }
        other => panic!("expected a 409, got {other}"),
    }
    let forced = nodes
        .patch("n1", &ssa.clone().force(), &Patch::Apply(&ours))
        .await
        .unwrap();
    assert_eq!(
        forced.spec.unwrap().taints.unwrap()[0].key,
        "interlock.dev/not-ready"
    );
    let list = nodes.list(&Default::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(
        list.metadata.resource_version,
        Some(api.resource_version().to_string())
    );
    let log = api.requests();
    let p = log
        .iter()
        .find(|r| r.method == "PATCH" && r.path.ends_with("/status"))
        .unwrap();
    assert_eq!(p.path, "/api/v1/nodes/n1/status");
    assert_eq!(
        p.content_type.as_deref(),
        Some("application/strategic-merge-patch+json")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn watcher_and_reflector_recover_after_compaction_and_restart() {
    let api = KubeApi::start().unwrap();
    api.put_object(pod("a", "n1"));
    api.put_object(pod("other", "n2"));
    let client = kube_client(&api).await;
    let pods: Api<Pod> = Api::all(client);
    let (reader, writer) = reflector::store::<Pod>();
    // Pages of one item, so the re-list also walks continue tokens.
    let cfg = watcher::Config::default()
        .fields("spec.nodeName=n1")
        .page_size(1);
    let stream = reflector(writer, watcher(pods, cfg).default_backoff()).applied_objects();
    let task = tokio::spawn(async move {
        futures::pin_mut!(stream);
        while stream.next().await.is_some() {}
    });
    let names = |r: &reflector::Store<Pod>| {
        let mut v: Vec<String> = r
            .state()
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
        v.sort();
        v
    };
    let wait = |f: &dyn Fn() -> bool| {
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < end {
            if f() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    };
    assert!(
        wait(&|| names(&reader) == ["a"]),
        "initial list: {:?}",
        names(&reader)
    );
    assert!(api.wait_until(Duration::from_secs(5), |a| a.active_watches() == 1));
    api.put_object(pod("b", "n1"));
    assert!(
        wait(&|| names(&reader) == ["a", "b"]),
        "watch event: {:?}",
        names(&reader)
    );

    // The server goes down, pods change meanwhile, and it comes back without history:
    // the watcher's resume gets 410, so it must re-list to see the new state.
    api.clear_requests();
    api.stop();
    api.delete_object("pods", "ns", "a");
    api.put_object(pod("c", "n1"));
    api.resume(true);
    assert!(
        wait(&|| names(&reader) == ["b", "c"]),
        "after restart: {:?}",
        names(&reader)
    );
    let log = api.requests();
    let resumed = log
        .iter()
        .position(|r| r.is_watch() && r.param("resourceVersion").is_some_and(|v| v != "0"));
    assert!(resumed.is_some(), "the watcher tried to resume: {log:#?}");
    assert!(
        log[resumed.unwrap()..]
            .iter()
            .any(|r| !r.is_watch() && r.path == "/api/v1/pods"),
        "and then re-listed: {log:#?}"
    );

    // Compaction alone while the watch is open does not disturb it.
    api.compact_history();
    api.put_object(pod("d", "n1"));
    assert!(
        wait(&|| names(&reader) == ["b", "c", "d"]),
        "{:?}",
        names(&reader)
    );

    // Every pod request carried the node's field selector.
    for r in api.requests().iter().filter(|r| r.path.contains("pods")) {
        assert_eq!(r.param("fieldSelector"), Some("spec.nodeName=n1"), "{r:?}");
    }
    task.abort();
}

//! The agent socket answering the plugin's lookup from the pod cache: a `PodCache` fed by
//! the fake Kubernetes API server (a real kube-rs watch), served on a real socket by
//! `socket::serve`, asked by the plugin's own lookup code (`interlock_cni::decide`, with
//! its trust checks) for a pod whose annotations the runtime did not pass.

use std::sync::Arc;
use std::time::{Duration, Instant};

use interlock_agent::kubernetes::PodCache;
use interlock_agent::socket;
use interlock_cni::decide::{decide_with_lookup, Decision};
use interlock_cni::identity::PodIdentity;
use interlock_cni::lookup::Source;
use interlock_contract::config::PluginConfig;
use interlock_testkit::kubeapi::KubeApi;
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;

async fn kube_client(api: &KubeApi, dir: &std::path::Path) -> kube::Client {
    let path = dir.join("kubeconfig");
    api.write_kubeconfig(&path).unwrap();
    let kc = Kubeconfig::read_from(&path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

/// A pod on `node`; one Istio's injector marked (`sidecar.istio.io/status`) has the
/// `istio-proxy` container it adds, whose spec the agent passes on to the plugin.
fn pod(name: &str, node: &str, annotations: serde_json::Value) -> serde_json::Value {
    let mut containers = vec![json!({"name": "c", "image": "i"})];
    if annotations.get("sidecar.istio.io/status").is_some() {
        containers.push(json!({"name": "istio-proxy", "image": "proxyv2",
            "args": ["proxy", "sidecar"], "securityContext": {"runAsUser": 1337}}));
    }
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "shop", "annotations": annotations},
           "spec": {"nodeName": node, "containers": containers},
           "status": {"phase": "Running"}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugins_lookup_is_answered_from_the_pod_cache() {
    let api = KubeApi::start().unwrap();
    let web = api.put_object(pod("web-0", "n1", json!({"sidecar.istio.io/status": "{}"})));
    api.put_object(pod("db-0", "n1", json!({"team": "shop"})));
    api.put_object(pod(
        "elsewhere",
        "n2",
        json!({"sidecar.istio.io/status": "{}"}),
    ));
    let dir = interlock_testkit::tempdir().unwrap();
    let client = kube_client(&api, dir.path()).await;
    let (cache, watch) = PodCache::start(client, "n1");
    let watch = tokio::spawn(watch);
    let start = Instant::now();
    while !cache.is_synced() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the pod cache never synced"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let path = state.join("agent.sock");
    let server = tokio::spawn(socket::serve(
        socket::bind(&path).unwrap(),
        Arc::new(cache),
        None,
        None,
    ));

    let config = PluginConfig {
        agent_socket: Some(path.clone()),
        ..PluginConfig::default()
    };
    let uid = web["metadata"]["uid"].as_str().unwrap().to_string();
    let answers = tokio::task::spawn_blocking(move || {
        let ask = |name: &str, uid: &str| {
            let mut p = PodIdentity {
                namespace: "shop".into(),
                name: name.into(),
                uid: uid.into(),
                annotations: None,
                facts: None,
            };
            decide_with_lookup(&config, &mut p)
        };
        (
            ask("web-0", &uid),
            ask("db-0", ""),
            ask("elsewhere", ""),
            ask("web-0", "another-uid"),
        )
    })
    .await
    .unwrap();
    let (web, db, elsewhere, replaced) = answers;
    assert!(matches!(web.0, Decision::Meshed { .. }), "{web:?}");
    assert_eq!(web.1, Source::Agent);
    assert!(matches!(db.0, Decision::NotMeshed { .. }), "{db:?}");
    assert_eq!(db.1, Source::Agent);
    // Not on this node / another pod of the same name: the agent says "not found", and
    // the plugin fails closed rather than guess.
    for (what, d) in [("elsewhere", elsewhere), ("replaced", replaced)] {
        assert!(matches!(d.0, Decision::Undecided { .. }), "{what}: {d:?}");
    }
    server.abort();
    watch.abort();
}

/// The plugin's ADD note reaches the audit, and what it costs an ADD (printed: the
/// figure goes into the report, the bound is behavioural).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_notes_reach_the_audit_and_cost_an_add_little() {
    let dir = interlock_testkit::tempdir().unwrap();
    let path = dir.path().join("agent.sock");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let server = tokio::spawn(socket::serve(
        socket::bind(&path).unwrap(),
        Arc::new(socket::NoSource("no API".into())),
        None,
        Some(tx),
    ));
    let p = path.clone();
    let mut took = tokio::task::spawn_blocking(move || {
        (0..200)
            .map(|i| {
                let t = Instant::now();
                interlock_cni::agent_client::note_added(&p, &format!("sb-{i}"), "/x").unwrap();
                t.elapsed()
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    let mut got = std::collections::BTreeSet::new();
    for _ in 0..200 {
        let id = tokio::time::timeout(Duration::from_secs(2), rx.recv()).await;
        got.insert(id.unwrap().unwrap());
    }
    assert_eq!(got, (0..200).map(|i| format!("sb-{i}")).collect());
    took.sort();
    eprintln!(
        "ADD note: median {:?}, p99 {:?}, max {:?}",
        took[100], took[198], took[199]
    );
    assert!(took[100] < Duration::from_millis(200), "{took:?}");
    // Nobody listening: the note fails at once, and the ADD does not care.
    server.abort();
    let _ = server.await;
    let t = Instant::now();
    assert!(interlock_cni::agent_client::note_added(&path, "sb", "/x").is_err());
    assert!(t.elapsed() < Duration::from_millis(200));
}

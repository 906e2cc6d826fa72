//! Guard mode's audit on a real containerd (the test kit, primary `bridge` only, no mesh
//! plugin): three sandboxes of an Istio-guarded node. One is meshed and its rules are
//! the ones istio-cni writes (set by the test, as the mesh's plugin would), one is meshed
//! with no rules (it started before the mesh's plugin was in the chain), one is not
//! meshed. The audit, in guard mode, proves the first captured by a connection, restarts
//! the second (guard mode's default: `repair` is taken as `restart`) and leaves the third
//! alone. No rule of interlock's is written anywhere.

use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use interlock_agent::audit::decide::{RepairPolicy, Verdict};
use interlock_agent::audit::Auditor;
use interlock_agent::health::metrics::AuditMetrics;
use interlock_contract::guard::{GuardRole, GuardedMesh};
use interlock_contract::PluginConfig;
use interlock_cri::{CriClient, SandboxState};
use interlock_redirect::netns::in_netns;
use interlock_testkit::require_root;
use interlock_testkit_node::containerd::Containerd;

const ISTIO_STATUS: (&str, &str) = (
    "sidecar.istio.io/status",
    "{\"containers\":[\"istio-proxy\"]}",
);

async fn network_ready(cri: &CriClient) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cri.status().await.unwrap().network_ready() {
        assert!(Instant::now() < deadline, "NetworkReady never came");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The proxy's outbound listener, as Envoy binds it (kept open by the caller).
fn proxy_listener(netns: &Path) -> TcpListener {
    in_netns(netns, || TcpListener::bind("0.0.0.0:15001").unwrap()).unwrap()
}

/// The rules istio-cni writes for its default install (the shared cases), loaded into
/// the pod's netns as istio-cni would.
fn write_istio_rules(netns: &Path) {
    let case = interlock_mesh_cases::default_case(interlock_mesh_cases::Mesh::Istio);
    let interlock_mesh_cases::MeshRules::Restore(text) = case.rules(false) else {
        panic!("{}: no IPv4 rules", case.id())
    };
    interlock_testkit::traffic::restore_in(netns, "iptables-restore", text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_mode_restarts_the_uncaptured_and_leaves_the_captured() {
    require_root!();
    let kit = Containerd::start().unwrap();
    kit.install_primary_plugins().unwrap();
    kit.write_primary_config().unwrap();
    let cri = kit.cri().await;
    network_ready(&cri).await;

    let run = |tag: &'static str, meshed: bool| {
        let mut config = kit.pod(tag);
        if meshed {
            config = config.annotation(ISTIO_STATUS.0, ISTIO_STATUS.1);
        }
        let cri = &cri;
        async move {
            let id = cri.run_sandbox(&config).await.unwrap();
            let status = cri.sandbox_status(&id, true).await.unwrap();
            (id, status.netns_path().expect("netns path").to_path_buf())
        }
    };
    let (captured, captured_ns) = run("capt", true).await;
    let (bare, bare_ns) = run("bare", true).await;
    let (plain, _) = run("plain", false).await;
    write_istio_rules(&captured_ns);
    // Both meshed pods' proxies run, so both are probed at once.
    let proxies = (proxy_listener(&captured_ns), proxy_listener(&bare_ns));

    let state = interlock_testkit::tempdir().unwrap();
    let plugin = PluginConfig {
        state_dir: state.path().to_path_buf(),
        exclude_namespaces: vec!["kube-system".into()],
        guard: Some(GuardRole {
            mesh: GuardedMesh::Istio,
            hold: false,
            reason: None,
            exclude_namespaces: vec![],
        }),
        ..PluginConfig::default()
    };
    let metrics = AuditMetrics::register(&mut prometheus_client::registry::Registry::default());
    let auditor = Auditor::new(kit.cri().await, plugin, RepairPolicy::Repair, None, metrics);
    let reports = auditor.audit(None).await.unwrap();
    let of = |id: &str| {
        reports
            .iter()
            .find(|r| r.sandbox == id)
            .unwrap_or_else(|| panic!("no report for {id}: {reports:?}"))
    };

    assert_eq!(of(&captured).verdict, Verdict::Protected, "{reports:?}");
    assert!(of(&captured).actions.is_empty());

    let r = of(&bare);
    let Verdict::Unprotected { reason } = &r.verdict else {
        panic!("{r:?}")
    };
    assert!(
        reason.contains("istio-cni") && reason.contains("not captured"),
        "{reason}"
    );
    assert_eq!(r.actions.len(), 1, "{r:?}");
    assert_eq!(r.actions[0].policy, RepairPolicy::Restart, "{r:?}");
    assert!(r.actions[0].result.is_ok(), "{r:?}");
    assert_eq!(
        cri.sandbox_status(&bare, false).await.unwrap().state,
        SandboxState::NotReady
    );
    assert_eq!(
        cri.sandbox_status(&captured, false).await.unwrap().state,
        SandboxState::Ready
    );

    let Verdict::NotMeshed { reason } = &of(&plain).verdict else {
        panic!("{reports:?}")
    };
    assert!(reason.contains("sidecar.istio.io/status"), "{reason}");
    // Nothing of interlock's anywhere: no rules, no attachment state.
    let tables = in_netns(&captured_ns, || {
        std::process::Command::new("nft")
            .args(["list", "tables"])
            .output()
            .unwrap()
    })
    .unwrap();
    let tables = String::from_utf8_lossy(&tables.stdout);
    assert!(!tables.contains("interlock"), "{tables}");
    assert!(!state.path().join("attachments").exists());
    drop(proxies);
    kit.teardown().unwrap();
}

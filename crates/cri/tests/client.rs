//! The client against sockets that fail in each way a node's runtime can: absent, silent,
//! and a real containerd (from the test kit) answering errors and conditions.

use std::time::{Duration, Instant};

use interlock_cri::{CriClient, CriError, SandboxFilter, Timeouts};
use interlock_testkit::require_root;
use interlock_testkit_node::containerd::Containerd;

#[tokio::test]
async fn a_missing_socket_fails_to_connect_naming_the_endpoint() {
    let dir = interlock_testkit::tempdir().unwrap();
    let endpoint = format!("unix://{}/none.sock", dir.path().display());
    let err = CriClient::connect(&endpoint).await.unwrap_err();
    assert!(matches!(err, CriError::Connect { .. }), "{err:?}");
    assert!(err.to_string().contains(&endpoint), "{err}");
    let err = CriClient::connect("tcp://127.0.0.1:1").await.unwrap_err();
    assert!(matches!(err, CriError::InvalidEndpoint { .. }), "{err:?}");
}

/// A socket that accepts and then says nothing: connecting or the first call must give
/// up at its deadline instead of hanging the audit.
#[tokio::test]
async fn a_runtime_that_never_answers_hits_a_deadline() {
    let dir = interlock_testkit::tempdir().unwrap();
    let path = dir.path().join("silent.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        loop {
            let (conn, _) = listener.accept().await.unwrap();
            open.push(conn);
        }
    });
    let timeouts = Timeouts {
        connect: Duration::from_millis(300),
        call: Duration::from_millis(300),
        run_sandbox: Duration::from_millis(300),
    };
    let endpoint = path.display().to_string();
    let begin = Instant::now();
    let err = match CriClient::connect_with(&endpoint, timeouts).await {
        Err(e) => e,
        Ok(client) => client.sandbox_status("abc", true).await.unwrap_err(),
    };
    let took = begin.elapsed();
    match &err {
        CriError::ConnectTimeout { .. } => {}
        CriError::Deadline { site, .. } => {
            assert_eq!(site.call, "PodSandboxStatus");
            assert_eq!(site.sandbox.as_deref(), Some("abc"));
            assert!(err.to_string().contains("for sandbox abc"), "{err}");
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(err.to_string().contains(&endpoint), "{err}");
    assert!(took < Duration::from_secs(2), "gave up after {took:?}");
    held.abort();
}

#[tokio::test]
async fn containerd_reports_conditions_and_errors_per_sandbox() {
    require_root!();
    let kit = Containerd::start().unwrap();
    let cri = kit.cri().await;

    // No CNI config yet: the runtime is ready, the network is not, and says why.
    let status = cri.status().await.unwrap();
    assert!(status.runtime_ready(), "{status:?}");
    assert!(!status.network_ready(), "{status:?}");
    let network = status.condition("NetworkReady").unwrap();
    assert_eq!(network.reason, "NetworkPluginNotReady", "{network:?}");
    let pod = kit.pod("nonet");
    let err = cri.run_sandbox(&pod).await.unwrap_err();
    assert!(matches!(err, CriError::Rpc { .. }), "{err:?}");
    assert!(err.to_string().contains(&pod.pod_name()), "{err}");
    assert!(err.to_string().contains("RunPodSandbox"), "{err}");

    // An unknown sandbox is "not found", named, and distinguishable.
    let err = cri
        .sandbox_status("0123456789abcdef", true)
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err:?}");
    assert!(err.to_string().contains("0123456789abcdef"), "{err}");

    kit.install_primary_plugins().unwrap();
    kit.write_primary_config().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cri.status().await.unwrap().network_ready() {
        assert!(Instant::now() < deadline, "{}", kit.log_tail());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Whatever the failed run left (containerd cleans up itself) is not listed ready.
    let ready = cri.list_sandboxes(&SandboxFilter::ready()).await.unwrap();
    assert!(ready.is_empty(), "{ready:?}");
}

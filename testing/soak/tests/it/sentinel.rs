//! A sentinel — a meshed pod started unprotected on purpose (no agent, a config without
//! interlock ahead of all) — is what the soak's `sentinel` chaos step plants; here each
//! repair policy's promise about it is checked on its own node: under `report` the
//! `Unprotected` Event and the `interlock.dev/unprotected` label (the pod left as it is),
//! under `repair` the `Repaired` Event and the pod captured again.

use std::time::{Duration, Instant};

use interlock_soak::checker::{Clock, Stopping};
use interlock_soak::run::default_bin_dir;
use interlock_soak::sentinel::{await_report, start_unprotected, PATIENCE};
use interlock_testkit::require_root;
use interlock_testkit_node::kubeapi::FailRule;
use interlock_testkit_node::node::{AgentArgs, Capture, Node, NodeOptions};

/// Pod lists the API fails for the late-sync case: with the client's back-off, seconds.
const LATE_SYNC_FAILURES: usize = 3;

/// A sentinel under `policy`; with `late_sync`, the new agent's pod watch finds the API
/// failing its first lists, so its pod cache syncs seconds after its first audit pass
/// has acted (an agent back after an outage, with a slow API).
fn sentinel_under(
    policy: &str,
    late_sync: bool,
) -> (Node, interlock_soak::sentinel::SentinelOutcome, Capture) {
    let bin = default_bin_dir().expect("interlock and interlock-cni built next to the tests");
    let node =
        Node::start(NodeOptions::new(bin.join("interlock"), bin.join("interlock-cni")).with_kube())
            .expect("start the node in a box");
    node.write_primary().unwrap();
    let args = AgentArgs::args(&["--repair-policy", policy, "--audit-interval", "0.5"]);
    node.start_agent(args.clone()).unwrap();
    node.wait_agent_ready(Duration::from_secs(30)).unwrap();
    // A pod that starts protected, for contrast: nothing is said about it.
    let calm = node.run_pod("calm", true).unwrap();

    node.kill_agent();
    let (sb, attempts) = start_unprotected(
        &node,
        &node.conf_dir(),
        &node.primary_conflist(),
        "sentinel",
        &Stopping::default(),
        &Clock::start(),
    )
    .expect("a sentinel started unprotected");
    assert!(node.conf_files().iter().all(|f| !f.contains("sentinel")));
    if late_sync {
        node.api()
            .expect("the node has the fake API")
            .fail_next_matching(FailRule {
                remaining: LATE_SYNC_FAILURES,
                code: 500,
                method: Some("GET".into()),
                path_contains: Some("/pods".into()),
            });
    }
    let started = Instant::now();
    node.start_agent(args).unwrap();
    let outcome = await_report(&node, &sb, attempts, policy, started, PATIENCE);
    let capture = node.capture(&sb);
    assert!(
        node.pod_events(&calm).is_empty(),
        "{:?}",
        node.pod_events(&calm)
    );
    (node, outcome, capture)
}

#[test]
fn under_report_a_sentinel_gets_its_event_and_label_and_under_repair_its_repair() {
    let _turn = crate::one_at_a_time();
    require_root!();
    let (node, report, capture) = sentinel_under("report", false);
    assert_eq!(report.missing, None, "{report:?}");
    assert!(report.labelled, "{report:?}");
    assert!(
        report.events.iter().any(|r| r == "Unprotected"),
        "{report:?}"
    );
    assert_eq!(capture, Capture::NotRedirected, "report changes nothing");
    drop(node);

    let (_node, repair, capture) = sentinel_under("repair", false);
    assert_eq!(repair.missing, None, "{repair:?}");
    assert!(repair.events.iter().any(|r| r == "Repaired"), "{repair:?}");
    assert!(!repair.labelled, "{repair:?}");
    assert_eq!(capture, Capture::Redirected);
}

/// The soak's missing Event: a repair done by the agent's first pass, before its pod
/// cache has synced with the API, still gets its `Repaired` Event once the cache has
/// synced (the repair itself does not wait for it).
#[test]
fn a_repair_before_the_pod_cache_syncs_still_gets_its_event() {
    let _turn = crate::one_at_a_time();
    require_root!();
    let (node, repair, capture) = sentinel_under("repair", true);
    assert_eq!(repair.missing, None, "{repair:?}\n{}", node.agent_logs());
    assert!(repair.events.iter().any(|r| r == "Repaired"), "{repair:?}");
    assert_eq!(capture, Capture::Redirected);
    // The API did fail the watch's first lists: the cache synced late.
    let failed = node
        .api()
        .expect("the fake API")
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path.contains("/pods") && r.status == 500)
        .count();
    assert_eq!(failed, LATE_SYNC_FAILURES, "the pod lists did not fail");
}

//! The end-of-run check proves every running sandbox redirected (or not) with the kit's
//! capture check, which listens on the proxy port inside each meshed sandbox. The soak's
//! checker probes the same sandboxes all along, and its probes are redirected to that
//! port too: a 10-minute soak once called two protected sandboxes `unverified_at_end`
//! ("landed on the proxy port with original destination <probe server>"). The check
//! stops the checker first; shown here with a checker probing as fast as it can.

use std::sync::Arc;
use std::time::Duration;

use interlock_soak::checker::{Checker, CheckerConfig, Clock, Stopping};
use interlock_soak::probe::ProbeServer;
use interlock_soak::run::{default_bin_dir, end_check};
use interlock_testkit::require_root;
use interlock_testkit_node::node::{AgentArgs, Node, NodeOptions};

#[test]
fn the_end_check_is_not_disturbed_by_the_checker_probing_the_same_sandboxes() {
    let _turn = crate::one_at_a_time();
    require_root!();
    let bin = default_bin_dir().expect("interlock and interlock-cni built next to the tests");
    let node = Node::start(NodeOptions::new(
        bin.join("interlock"),
        bin.join("interlock-cni"),
    ))
    .expect("start the node in a box");
    node.write_primary().unwrap();
    node.start_agent(AgentArgs::default()).unwrap();
    node.wait_agent_ready(Duration::from_secs(30)).unwrap();
    let meshed: Vec<_> = (0..3)
        .map(|i| node.run_pod(&format!("endm{i}"), true).unwrap())
        .collect();
    node.run_pod("endp", false).unwrap();
    let server = Arc::new(ProbeServer::start().unwrap());
    for round in 0..3 {
        let checker = Checker::start(
            CheckerConfig {
                cri_endpoint: node.containerd().endpoint(),
                gateway: node.gateway(),
                // Back to back: a round every few milliseconds.
                period: Duration::ZERO,
                probe_timeout: Duration::from_millis(300),
                meshed: interlock_soak::checker::Meshed::interlock(),
            },
            Clock::start(),
            Stopping::default(),
            server.clone(),
        )
        .unwrap();
        assert!(checker.wait_rounds(3, Duration::from_secs(30)));
        let (checked, fin, violations) = end_check(checker, &node, &server, node.gateway());
        assert!(
            checked.ledger.records().any(|r| r.meshed),
            "the checker saw the sandboxes"
        );
        assert!(violations.is_empty(), "round {round}: {violations:?}");
        assert!(
            fin.unverified.is_empty(),
            "round {round}: {:?}",
            fin.unverified
        );
        assert_eq!(
            (
                fin.meshed_running,
                fin.meshed_redirected,
                fin.left_unprotected
            ),
            (meshed.len(), meshed.len(), 0),
            "round {round}: {fin:?}"
        );
        assert_eq!((fin.plain_running, fin.plain_not_redirected), (1, 1));
    }
}

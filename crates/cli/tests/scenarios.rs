//! The seed's scenarios on real containerd, each on its own node in a box
//! ([`interlock_testkit::node`]): a private containerd with the reference primary
//! (`bridge` + `host-local` + `portmap` as `10-calico.conflist`, cniVersion 0.3.1), the
//! real `interlock agent` and `interlock-cni`, and sandboxes created over CRI. Whether a
//! sandbox is protected is judged by the kit's independent capture check (a real
//! connection from inside the sandbox, no interlock code), never by the agent's word.

mod common;

use std::time::{Duration, Instant};

use interlock_testkit::node::{AgentArgs, Capture, Node, NodeOptions, Sandbox, MESHED_ANNOTATION};
use interlock_testkit::require_root;

/// The real plugin, built next to `interlock`; the scenarios mean nothing with a stand-in.
fn plugin() -> std::path::PathBuf {
    common::real_plugin().unwrap_or_else(|| {
        panic!(
            "{} missing: run `cargo build -p interlock-cni` (cargo test --workspace builds it)",
            common::interlock()
                .with_file_name("interlock-cni")
                .display()
        )
    })
}

fn node(kube: bool) -> Node {
    let mut options = NodeOptions::new(common::interlock(), plugin());
    options.kube = kube;
    Node::start(options).expect("start the node in a box")
}

/// Asserts each sandbox's capture verdict: meshed ones redirected, others not.
fn assert_protection(node: &Node, sandboxes: &[Sandbox]) {
    for sb in sandboxes {
        let got = node.capture(sb);
        let want = if sb.meshed {
            Capture::Redirected
        } else {
            Capture::NotRedirected
        };
        assert_eq!(
            got,
            want,
            "{} (meshed: {}, ip {:?}); agent logs:\n{}",
            sb.name,
            sb.meshed,
            sb.ip,
            node.agent_logs()
        );
    }
}

#[test]
fn the_kit_marks_meshed_pods_as_the_plugin_reads_them() {
    assert_eq!(
        MESHED_ANNOTATION.0,
        interlock_redirect::profile::istio_keys::STATUS
    );
}

/// Primary first, interlock second (the normal order): every meshed sandbox is
/// protected, plain ones are untouched.
#[test]
fn primary_first_then_interlock_protects_every_meshed_sandbox() {
    require_root!();
    let node = node(false);
    node.write_primary().unwrap();
    node.start_agent(AgentArgs::default()).unwrap();
    node.wait_agent_ready(Duration::from_secs(15)).unwrap();
    node.wait_network_ready(true, Duration::from_secs(5))
        .unwrap();
    let t0 = Instant::now();
    let mut sandboxes = Vec::new();
    for (i, meshed) in [true, false, true, true, false].into_iter().enumerate() {
        sandboxes.push(node.run_pod(&format!("p{i}"), meshed).unwrap());
    }
    eprintln!("5 sandboxes in {:?}", t0.elapsed());
    assert_protection(&node, &sandboxes);
    node.teardown().unwrap();
}

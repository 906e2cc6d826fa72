//! A rollout may stop an agent at any moment, also one still starting: the soak's
//! upgrade steps demand a clean exit on SIGTERM, and a short soak once saw an agent (with
//! the fake API, slower to start) die of the signal instead. SIGTERM is handled from the
//! start of the agent's run on: sent at several moments of its start-up (from 50 ms after
//! the exec, well before a debug build is ready), with and without the API, it always
//! ends in exit 0 and leaves the node protected by the config in place.

use std::time::Duration;

use interlock_soak::run::default_bin_dir;
use interlock_testkit::require_root;
use interlock_testkit_node::node::{AgentArgs, Node, NodeOptions};

#[test]
fn an_agent_stopped_while_it_starts_exits_cleanly() {
    require_root!();
    let bin = default_bin_dir().expect("interlock and interlock-cni built next to the tests");
    for kube in [true, false] {
        let mut options = NodeOptions::new(bin.join("interlock"), bin.join("interlock-cni"));
        options.kube = kube;
        let node = Node::start(options).expect("start the node in a box");
        node.write_primary().unwrap();
        node.start_agent(AgentArgs::default()).unwrap();
        node.wait_agent_ready(Duration::from_secs(30)).unwrap();
        let status = node.stop_agent(Duration::from_secs(20));
        assert!(status.is_some_and(|s| s.success()), "{status:?}");
        for after_ms in [50u64, 100, 200, 400, 800] {
            node.start_agent(AgentArgs::default()).unwrap();
            // From the exec of `interlock` on (the agent runs under setpriv, and no
            // program can handle a signal before it runs).
            let pid = node.agent(|a| a.pid());
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while std::fs::read_link(format!("/proc/{pid}/exe"))
                .map_or(true, |exe| !exe.ends_with("interlock"))
            {
                assert!(std::time::Instant::now() < deadline, "interlock never ran");
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(after_ms));
            let status = node.stop_agent(Duration::from_secs(20));
            assert!(
                status.is_some_and(|s| s.success()),
                "kube {kube}: SIGTERM {after_ms} ms after the start: {status:?}\n{}",
                node.agent_logs()
            );
        }
        // What a rollout relies on: the config stayed, and a pod still starts protected.
        let pod = node.run_pod("afterstop", true).unwrap();
        assert_eq!(
            node.capture(&pod),
            interlock_testkit_node::node::Capture::Redirected
        );
    }
}

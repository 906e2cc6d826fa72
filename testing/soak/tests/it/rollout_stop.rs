//! A rollout may stop an agent at any moment, also one still starting: the soak's
//! upgrade steps demand a clean exit on SIGTERM, and a short soak once saw an agent (with
//! the fake API, slower to start) die of the signal instead. SIGTERM is handled from the
//! start of the agent's run on: sent at several moments of its start-up (from 50 ms after
//! the handler is set, well before a debug build is ready), with and without the API, it
//! always ends in exit 0 and leaves the node protected by the config in place.

use std::time::Duration;

use interlock_soak::run::default_bin_dir;
use interlock_testkit::require_root;
use interlock_testkit_node::node::{AgentArgs, Node, NodeOptions};

#[test]
fn an_agent_stopped_while_it_starts_exits_cleanly() {
    let _turn = crate::one_at_a_time();
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
            // From the moment the agent catches SIGTERM on (no program can handle a
            // signal before its handler is set, and on a loaded machine a debug build
            // can take longer than 50 ms from the exec to its first line): the agent's
            // run sets it first, so what follows is all of its start-up.
            let pid = node.agent(|a| a.pid());
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while !catches_sigterm(pid) {
                assert!(
                    std::time::Instant::now() < deadline,
                    "interlock never set its SIGTERM handler\n{}",
                    node.agent_logs()
                );
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

/// Whether process `pid` is `interlock` and catches SIGTERM (its `SigCgt` mask in
/// `/proc/PID/status`; the agent runs under setpriv, which execs it).
fn catches_sigterm(pid: u32) -> bool {
    let is_interlock =
        std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe.ends_with("interlock"));
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let caught = status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .unwrap_or(0);
    // Signal n is bit n - 1; SIGTERM is 15.
    is_interlock && caught & (1 << (libc_sigterm() - 1)) != 0
}

fn libc_sigterm() -> u32 {
    nix::sys::signal::Signal::SIGTERM as u32
}

//! The node in a box without interlock: its capture check judges redirection set up by
//! hand with nft (redirected, redirected elsewhere, not redirected, no network), the
//! primary's helpers change what containerd loads, containerd restarts with its
//! sandboxes alive, the agent process is started, signalled and reaped, and the node
//! leaves nothing behind.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use interlock_cri::SandboxState;
use interlock_testkit::require_root;
use interlock_testkit_node::node::{
    AgentArgs, AgentProcess, Capture, Node, NodeOptions, PrimaryWrite, CHECK_UID,
    PROXY_OUTBOUND_PORT,
};

/// A node whose agent "binary" is `sh` (the tests here never need the real one).
fn node() -> Node {
    Node::start(NodeOptions::new("/bin/sh", "/bin/true")).unwrap()
}

/// Loads `rules` into the nft of the netns at `netns`.
fn nft(netns: &Path, rules: &str) {
    let mut child = Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .args(["nft", "-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(rules.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success(), "nft -f: {rules}");
}

/// An Istio-like outbound capture to `port`, the proxy's UID 1337 exempt.
fn redirect_to(port: u16) -> String {
    format!(
        "table ip ilcheck {{\n chain out {{\n  type nat hook output priority -100;\n  \
         meta skuid 1337 return\n  tcp dport {PROXY_OUTBOUND_PORT} return\n  \
         ip daddr 127.0.0.0/8 return\n  meta l4proto tcp redirect to :{port}\n }}\n}}\n"
    )
}

#[test]
fn the_capture_check_tells_redirected_from_not_redirected_and_no_network() {
    require_root!();
    assert_ne!(CHECK_UID, 1337, "the check must not connect as the proxy");
    let node = node();
    node.write_primary().unwrap();
    node.wait_network_ready(true, Duration::from_secs(5))
        .unwrap();
    let a = node.run_pod("chka", true).unwrap();
    let b = node.run_pod("chkb", false).unwrap();
    let c = node.run_pod("chkc", false).unwrap();
    assert!(a.meshed && !b.meshed);
    for sb in [&a, &b, &c] {
        assert!(
            sb.ip.is_some_and(|ip| node.containerd().in_subnet(ip)),
            "{sb:?}"
        );
        assert_eq!(node.capture(sb), Capture::NotRedirected, "{sb:?}");
    }
    nft(a.netns.as_ref().unwrap(), &redirect_to(PROXY_OUTBOUND_PORT));
    assert_eq!(node.capture(&a), Capture::Redirected);
    // Captured, but to a port where no proxy listens: neither verdict.
    nft(b.netns.as_ref().unwrap(), &redirect_to(15009));
    assert!(
        matches!(node.capture(&b), Capture::Failed(_)),
        "{:?}",
        node.capture(&b)
    );
    // A sandbox that is stopped has no network any more.
    node.stop_pod(&c.id).unwrap();
    assert_eq!(node.capture(&c), Capture::NoNetwork);
    assert_eq!(node.capture(&a), Capture::Redirected, "checks repeat");

    let footprint = node.footprint();
    node.teardown().unwrap();
    assert_eq!(footprint.leftovers(), Vec::<String>::new());
}

#[test]
fn the_primarys_helpers_change_what_containerd_loads() {
    require_root!();
    let node = node();
    assert_eq!(node.network_ready(), Some(false), "no config yet");
    node.write_primary().unwrap();
    node.wait_network_ready(true, Duration::from_secs(5))
        .unwrap();
    // Rewritten both ways: still loadable.
    node.rewrite_primary(PrimaryWrite::InPlace).unwrap();
    node.rewrite_primary(PrimaryWrite::Rename).unwrap();
    assert_eq!(node.conf_files(), ["10-calico.conflist"]);
    node.wait_network_ready(true, Duration::from_secs(5))
        .unwrap();
    // A half-written file sorting first fails the whole load; completed, it loads.
    node.write_half_written("00-half.conflist").unwrap();
    node.wait_network_ready(false, Duration::from_secs(5))
        .unwrap();
    let e = node.run_pod("half", false).unwrap_err();
    assert!(e.contains("cni plugin not initialized"), "{e}");
    node.complete_file("00-half.conflist").unwrap();
    node.wait_network_ready(true, Duration::from_secs(5))
        .unwrap();
    let sb = node.run_pod("completed", false).unwrap();
    assert!(sb.ip.is_some(), "{sb:?}");
    assert_eq!(node.ipam_addresses(), [sb.ip.unwrap()]);
    assert_eq!(node.state_files(), Vec::<String>::new());
    // Moved aside (a `.bak` is ignored) and deleted; the watch sees both go, and not
    // a file replaced by a rename onto it.
    let mut watch = node.watch_conf_dir().unwrap();
    node.rewrite_primary(PrimaryWrite::Rename).unwrap();
    std::fs::remove_file(node.conf_dir().join("00-half.conflist")).unwrap();
    node.rename_primary("10-calico.conflist.bak").unwrap();
    assert_eq!(
        watch.removed().unwrap(),
        [
            ".10-calico.conflist.tmp",
            "00-half.conflist",
            "10-calico.conflist"
        ]
    );
    assert_eq!(watch.removed().unwrap(), Vec::<String>::new());
    node.wait_network_ready(false, Duration::from_secs(5))
        .unwrap();
    node.write_sorting_first("05-other.conflist", &node.foreign_conflist("other"))
        .unwrap();
    node.wait_network_ready(true, Duration::from_secs(5))
        .unwrap();
    node.delete_primary().unwrap();
    node.delete_primary().unwrap();

    // containerd restarts; the sandbox survives.
    let took = node.restart_containerd().unwrap();
    eprintln!("containerd answered {took:?} after the restart");
    let listed = node.sandboxes().unwrap();
    assert!(
        listed
            .iter()
            .any(|s| s.id == sb.id && s.state == SandboxState::Ready),
        "{listed:?}"
    );
    assert_eq!(node.capture(&sb), Capture::NotRedirected);

    // interlock-cni: installed from the given path, removed.
    node.install_interlock_cni().unwrap();
    assert!(node.bin_dir().join("interlock-cni").exists());
    node.remove_interlock_cni().unwrap();
    node.remove_interlock_cni().unwrap();
    assert!(!node.bin_dir().join("interlock-cni").exists());

    node.stop_pod(&sb.id).unwrap();
    assert_eq!(node.ipam_addresses(), Vec::<std::net::IpAddr>::new());

    let footprint = node.footprint();
    node.teardown().unwrap();
    assert_eq!(footprint.leftovers(), Vec::<String>::new());
}

#[test]
fn the_agent_process_is_started_signalled_and_reaped() {
    require_root!();
    let node = node();
    // `sh agent --cni-conf-dir …` fails at once (no such script): it is reaped, with
    // its output in the log.
    node.start_agent(AgentArgs::default()).unwrap();
    let status = node.agent(|a| {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(s) = a.exited() {
                return s;
            }
            assert!(std::time::Instant::now() < deadline, "not reaped");
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    assert!(!status.success());
    assert!(node.agent_logs().contains("agent"), "{}", node.agent_logs());
    assert_eq!(node.agent_ready(), None);
    assert!(node.wait_agent_ready(Duration::from_millis(50)).is_err());
    node.teardown().unwrap();

    // A process that ignores SIGTERM is killed after the grace period.
    let dir = interlock_testkit::tempdir().unwrap();
    let log = dir.path().join("log");
    let mut p = AgentProcess::spawn(
        Path::new("/bin/sh"),
        &["-c".into(), "trap '' TERM; echo started; sleep 30".into()],
        &[],
        &log,
        "127.0.0.1:9".parse().unwrap(),
    )
    .unwrap();
    assert_eq!(p.exited(), None);
    std::thread::sleep(Duration::from_millis(100));
    let t0 = std::time::Instant::now();
    let status = p.terminate(Duration::from_millis(300)).unwrap();
    assert!(
        t0.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t0.elapsed()
    );
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9), "{status:?}");
    assert!(p.log_text().contains("started"));
}

/// The soak and the demo may drive a node from async code: its synchronous calls and its
/// drop work inside a tokio runtime, and its CRI client serves the caller's runtime.
#[tokio::test(flavor = "current_thread")]
async fn the_node_works_from_inside_a_runtime() {
    require_root!();
    let node = node();
    node.write_primary().unwrap();
    node.wait_network_ready(true, Duration::from_secs(5))
        .unwrap();
    let sb = node.run_pod("async", false).unwrap();
    let status = node.cri().sandbox_status(&sb.id, false).await.unwrap();
    assert_eq!(status.state, SandboxState::Ready);
    assert_eq!(node.capture(&sb), Capture::NotRedirected);
    drop(node);
}

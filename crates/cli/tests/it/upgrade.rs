//! Upgrade and downgrade as a DaemonSet rolling update does them, on a node in a box
//! (private containerd, the reference primary) with a real build of the previous release
//! (`v0.1.0`, built from git by [`interlock_testkit::release`]) and this build.
//!
//! The image is a directory holding `interlock-cni` that the agent installs from
//! (`--plugin-source`): a new image brings its own plugin, as in the DaemonSet. A rollout
//! step is SIGTERM to the running agent, a gap with no agent at all (kubelet starting the
//! new container), the new image's plugin in place, the new agent. Pods are created all
//! through the switch; meshed pods created before it hold connections their proxy
//! stand-in accepted (captured by the rules), plain pods hold direct ones.

use crate::common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::nft_in;
use interlock_cri::SandboxState;
use interlock_testkit::release::{self, Release, ReleaseError};
use interlock_testkit::require_root;
use interlock_testkit::traffic::{accept_within, listen_as};
use interlock_testkit_node::node::{in_netns, AgentArgs, Capture, Node, NodeOptions, Sandbox};

/// The generic profile's proxy UID and outbound port.
const PROXY_UID: u32 = 1337;
const PROXY_PORT: u16 = interlock_testkit_node::node::PROXY_OUTBOUND_PORT;
/// No agent runs between the old one's exit and the new one's start for this long (the
/// kubelet stopping one container and starting the next; seconds on a real node).
const SWITCH_GAP: Duration = Duration::from_secs(2);
/// The audit period of every agent of the test.
const AUDIT: [&str; 2] = ["--audit-interval", "1"];

/// The previous release, built once per target dir; `None` (after a message) when the
/// tag is missing and the test may skip (not under CI).
fn previous() -> Option<Release> {
    match release::build(release::PREVIOUS) {
        Ok(r) => {
            if let Some(t) = r.built_in {
                eprintln!(
                    "built {} ({}) in {:.1} s ({} artifacts seeded from this target)",
                    r.tag,
                    &r.commit[..12],
                    t.as_secs_f64(),
                    r.seeded
                );
            }
            Some(r)
        }
        Err(ReleaseError::Missing(m)) if !interlock_testkit::in_ci() => {
            eprintln!("SKIP: the previous release cannot be built: {m}");
            None
        }
        Err(e) => panic!("the previous release cannot be built: {e}"),
    }
}

/// This build's binaries (the real plugin: an upgrade means nothing with a stand-in).
fn current() -> (PathBuf, PathBuf) {
    let plugin = common::real_plugin().unwrap_or_else(|| {
        panic!("interlock-cni missing next to interlock: run `cargo build -p interlock-cni`")
    });
    (common::interlock(), plugin)
}

/// A meshed pod with its proxy stand-in and a connection the rules captured.
struct Meshed {
    sb: Sandbox,
    proxy: TcpListener,
    /// (the app's end inside the pod, the proxy's accepted end).
    conn: (TcpStream, TcpStream),
}

/// A plain pod with a direct connection to the test's server.
struct Plain {
    sb: Sandbox,
    conn: (TcpStream, TcpStream),
}

fn netns(sb: &Sandbox) -> &Path {
    sb.netns.as_deref().expect("a sandbox with a netns")
}

/// A connection from inside `sb` to `target`, as the app (root, not the proxy's UID).
fn connect_from(sb: &Sandbox, target: SocketAddr) -> TcpStream {
    in_netns(netns(sb), move || {
        TcpStream::connect_timeout(&target, Duration::from_secs(2))
    })
    .unwrap()
    .unwrap_or_else(|e| panic!("{}: connect {target}: {e}", sb.name))
}

/// Accepts on `l` (non-blocking) the connection from `peer`, skipping others.
fn accept_from(l: &TcpListener, peer: SocketAddr) -> Option<TcpStream> {
    let deadline = Instant::now() + Duration::from_secs(3);
    while let Some((s, from)) = accept_within(l, deadline.saturating_duration_since(Instant::now()))
    {
        if from == peer {
            s.set_nonblocking(false).unwrap();
            return Some(s);
        }
    }
    None
}

/// A new connection from `sb`'s app lands on its proxy's listener (the capture probe):
/// the rules redirect. Returns the connection (app end, proxy end).
fn capture_probe(
    sb: &Sandbox,
    proxy: &TcpListener,
    target: SocketAddr,
) -> Result<StreamPair, String> {
    let client = connect_from(sb, target);
    let local = client.local_addr().unwrap();
    match accept_from(proxy, local) {
        Some(accepted) => Ok((client, accepted)),
        None => Err(format!(
            "{}: a new connection did not reach the proxy",
            sb.name
        )),
    }
}

fn captured(m: &Meshed, target: SocketAddr) -> Result<(), String> {
    capture_probe(&m.sb, &m.proxy, target).map(drop)
}

type StreamPair = (TcpStream, TcpStream);

/// Data still flows both ways on `conn` (it was not ended).
fn alive(conn: &StreamPair) -> Result<(), String> {
    let (a, b) = conn;
    for (mut from, mut to) in [(a, b), (b, a)] {
        to.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        from.write_all(b"ping").map_err(|e| format!("write: {e}"))?;
        let mut buf = [0u8; 4];
        to.read_exact(&mut buf).map_err(|e| format!("read: {e}"))?;
        if &buf != b"ping" {
            return Err(format!("read {buf:?}"));
        }
    }
    Ok(())
}

fn run_meshed(node: &Node, tag: &str, target: SocketAddr) -> Meshed {
    let sb = node.run_pod(tag, true).unwrap();
    let proxy = listen_as(
        netns(&sb),
        PROXY_UID,
        SocketAddr::from((Ipv4Addr::UNSPECIFIED, PROXY_PORT)),
    );
    let conn =
        capture_probe(&sb, &proxy, target).unwrap_or_else(|e| panic!("{e}\n{}", node.agent_logs()));
    Meshed { sb, proxy, conn }
}

fn run_plain(node: &Node, tag: &str, server: &TcpListener, target: SocketAddr) -> Plain {
    let sb = node.run_pod(tag, false).unwrap();
    let client = connect_from(&sb, target);
    let local = client.local_addr().unwrap();
    let accepted = accept_from(server, local).expect("the plain pod's connection arrived");
    Plain {
        sb,
        conn: (client, accepted),
    }
}

/// The sum of the samples of the counter family `name` on the running agent's
/// `/metrics` whose line passes `keep`; the family must be declared there, so that 0
/// means "counted nothing", not "not exported".
fn counter_sum_where(node: &Node, name: &str, keep: impl Fn(&str) -> bool) -> f64 {
    let body = node
        .agent(|a| a.get("/metrics"))
        .map(|(_, b)| b)
        .unwrap_or_default();
    assert!(
        body.contains(&format!("# TYPE {name} counter")),
        "{name} is not on /metrics:\n{body}"
    );
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with([' ', '{']) || rest.starts_with("_total"))
        })
        .filter(|l| keep(l))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, |a, b| a + b)
}

/// Every sample of the counter family `name` (all label sets).
fn counter_sum(node: &Node, name: &str) -> f64 {
    counter_sum_where(node, name, |_| true)
}

/// Actions on sandboxes that changed something (`interlock_sandbox_repairs` of every
/// policy but `report`, which only reports).
fn repairs(node: &Node) -> f64 {
    counter_sum_where(node, "interlock_sandbox_repairs", |l| {
        !l.contains("policy=\"report\"")
    })
}

/// The running agent's `interlock_sandboxes{verdict="…"}`.
fn verdicts(node: &Node, verdict: &str) -> Option<f64> {
    node.agent(|a| a.metric(&format!("interlock_sandboxes{{verdict=\"{verdict}\"}}")))
}

/// The running agent's log.
fn agent_log(node: &Node) -> String {
    node.agent(|a| std::fs::read_to_string(a.log_path()).unwrap_or_default())
}

/// Waits until the running agent has logged `n` more full audit passes than `seen`.
fn wait_passes(node: &Node, n: usize) {
    let passes = || agent_log(node).matches("audit done").count();
    common::wait_until(
        Duration::from_secs(40),
        || passes() >= n,
        || format!("fewer than {n} audit passes; log:\n{}", agent_log(node)),
    );
}

/// A pod created during the switch: when its creation began and ended, and how.
struct Started {
    meshed: bool,
    began: Instant,
    ended: Instant,
    result: Result<Sandbox, String>,
}

/// What one rollout step measured.
struct Switch {
    /// SIGTERM sent → the old agent exited.
    stop: Duration,
    /// The old agent's exit → the new agent's `/readyz` 200.
    window: Duration,
    /// Pods created from before the SIGTERM to after the new agent's readiness.
    started: Vec<Started>,
    exited_at: Instant,
    ready_at: Instant,
}

/// The new image: its `interlock`, its `interlock-cni`, the agent's extra arguments.
struct Image<'a> {
    agent: &'a Path,
    plugin: &'a Path,
    args: &'a [&'a str],
}

/// One rollout step: SIGTERM, the gap (`in_gap` runs in it, no agent running), the new
/// image's plugin, the new agent; pods are created all the while.
fn roll(node: &Node, image: &Path, to: Image, tag: &str, in_gap: impl FnOnce()) -> Switch {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let creator = s.spawn(|| {
            let mut made = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let meshed = made.len() % 3 != 2;
                let began = Instant::now();
                let result = node.run_pod(&format!("{tag}{}", made.len()), meshed);
                made.push(Started {
                    meshed,
                    began,
                    ended: Instant::now(),
                    result,
                });
            }
            made
        });
        std::thread::sleep(Duration::from_millis(500));
        let t = Instant::now();
        let status = node.stop_agent(Duration::from_secs(20));
        let exited_at = Instant::now();
        assert!(
            status.is_some_and(|s| s.success()),
            "the old agent did not exit cleanly on SIGTERM: {status:?}\n{}",
            node.agent_logs()
        );
        in_gap();
        std::thread::sleep(SWITCH_GAP);
        install(to.plugin, image);
        node.start_agent_from(to.agent, AgentArgs::args(to.args))
            .unwrap();
        node.wait_agent_ready(Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("{e}\n{}", node.agent_logs()));
        let ready_at = Instant::now();
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::Relaxed);
        Switch {
            stop: exited_at - t,
            window: ready_at - exited_at,
            started: creator.join().unwrap(),
            exited_at,
            ready_at,
        }
    })
}

/// Puts `plugin` into the image dir as the agent's `--plugin-source`.
fn install(plugin: &Path, image: &Path) {
    let tmp = image.join(".interlock-cni.tmp");
    std::fs::copy(plugin, &tmp).unwrap();
    std::fs::rename(&tmp, image.join("interlock-cni")).unwrap();
}

/// Asserts that every pod created during the switch runs protected (meshed: redirected,
/// plain: not) or was refused; prints the window's figures. Returns the running ones.
fn judge_switch(node: &Node, what: &str, sw: &Switch) -> Vec<Sandbox> {
    let mut running = Vec::new();
    let (mut refused, mut in_window, mut in_window_ok) = (0, 0, 0);
    for p in &sw.started {
        let overlaps = p.began < sw.ready_at && p.ended > sw.exited_at;
        in_window += usize::from(overlaps);
        match &p.result {
            Err(e) => {
                refused += 1;
                eprintln!("{what}: a pod (meshed {}) was refused: {e}", p.meshed);
            }
            Ok(sb) => {
                let want = if p.meshed {
                    Capture::Redirected
                } else {
                    Capture::NotRedirected
                };
                assert_eq!(
                    node.capture(sb),
                    want,
                    "{what}: {} (meshed {}) created {} the agent switch runs unprotected; \
                     logs:\n{}",
                    sb.name,
                    p.meshed,
                    if overlaps { "during" } else { "around" },
                    node.agent_logs()
                );
                in_window_ok += usize::from(overlaps);
                running.push(sb.clone());
            }
        }
    }
    eprintln!(
        "{what}: SIGTERM to exit {:.0} ms; exit to the new agent's readiness {:.0} ms \
         ({:.1} s with no agent at all, then {:.0} ms from its start to ready); {} pods \
         created across the switch, {} of them started in that window ({} ran protected, \
         {} refused), 0 unprotected",
        sw.stop.as_secs_f64() * 1e3,
        sw.window.as_secs_f64() * 1e3,
        SWITCH_GAP.as_secs_f64(),
        sw.window.saturating_sub(SWITCH_GAP).as_secs_f64() * 1e3,
        sw.started.len(),
        in_window,
        in_window_ok,
        refused
    );
    assert!(in_window > 0, "{what}: no pod started in the window");
    running
}

/// Every sandbox of `pods` is Ready and none other was created in its place.
fn assert_not_restarted(node: &Node, what: &str, ids: &[&Sandbox]) {
    let listed = node.sandboxes().unwrap();
    for sb in ids {
        let s = listed
            .iter()
            .find(|s| s.id == sb.id)
            .unwrap_or_else(|| panic!("{what}: sandbox {} of {} is gone", sb.id, sb.name));
        assert_eq!(s.state, SandboxState::Ready, "{what}: {} stopped", sb.name);
        let same_pod = listed.iter().filter(|o| o.metadata.uid == sb.uid).count();
        assert_eq!(same_pod, 1, "{what}: {} got another sandbox", sb.name);
    }
}

/// After a rollout step: every connection of `meshed` and `plain` still carries data,
/// every meshed pod still captures a new connection, plain pods are not redirected, and
/// no sandbox of them restarted.
fn untouched<'a>(
    node: &Node,
    what: &str,
    meshed: impl Iterator<Item = &'a Meshed>,
    plain: &[Plain],
    target: SocketAddr,
) {
    let log = agent_log(node);
    let mut all = Vec::new();
    for m in meshed {
        alive(&m.conn).unwrap_or_else(|e| {
            panic!(
                "{what}: {}'s captured connection ended: {e}\n{log}",
                m.sb.name
            )
        });
        captured(m, target).unwrap_or_else(|e| panic!("{what}: {e}\n{log}"));
        all.push(&m.sb);
    }
    for p in plain {
        alive(&p.conn).unwrap_or_else(|e| panic!("{what}: {}: {e}", p.sb.name));
        assert_eq!(node.capture(&p.sb), Capture::NotRedirected, "{}", p.sb.name);
        all.push(&p.sb);
    }
    assert_not_restarted(node, what, &all);
}

/// The bytes of the installed plugin are `want`'s.
fn assert_plugin_is(node: &Node, want: &Path, what: &str) {
    assert!(
        std::fs::read(node.bin_dir().join("interlock-cni")).unwrap()
            == std::fs::read(want).unwrap(),
        "{what}: the installed interlock-cni is not {}",
        want.display()
    );
}

/// The upgrade from the previous release to this build, then the downgrade back, each a
/// rolling-update step while pods start: connections captured before the step stay open
/// and keep being captured, no sandbox restarts, plain pods stay plain, nothing is
/// repaired, and every pod started across the step is protected or refused.
#[test]
fn a_rolling_upgrade_and_downgrade_keep_every_connection() {
    require_root!();
    let Some(old) = previous() else { return };
    let (new_agent, new_plugin) = current();
    let image = tempfile::tempdir().unwrap();
    install(&old.plugin, image.path());
    let node = Node::start(NodeOptions::new(
        old.interlock.clone(),
        image.path().join("interlock-cni"),
    ))
    .expect("start the node in a box");
    node.write_primary().unwrap();
    node.start_agent(AgentArgs::args(&AUDIT)).unwrap();
    node.wait_agent_ready(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_plugin_is(&node, &old.plugin, "the old agent");
    let version = |node: &Node| {
        node.agent(|a| a.get("/metrics"))
            .map(|(_, b)| b)
            .unwrap_or_default()
    };
    assert!(version(&node).contains("0.1.0"), "not the old agent");

    let server = TcpListener::bind("0.0.0.0:0").unwrap();
    server.set_nonblocking(true).unwrap();
    let target = SocketAddr::new(node.gateway().into(), server.local_addr().unwrap().port());
    // The last one stands for rules 0.1.0 wrote that this build renders otherwise.
    let mut meshed: Vec<Meshed> = (0..4)
        .map(|i| run_meshed(&node, &format!("old{i}"), target))
        .collect();
    let plain: Vec<Plain> = (0..2)
        .map(|i| run_plain(&node, &format!("plain{i}"), &server, target))
        .collect();
    wait_passes(&node, 2);

    // ---- the upgrade ----
    let up = roll(
        &node,
        image.path(),
        Image {
            agent: &new_agent,
            plugin: &new_plugin,
            args: &AUDIT,
        },
        "up",
        // meshed[3]: rules 0.1.0 wrote that this build renders otherwise (one rule
        // more, capturing the same; its record is 0.1.0's, without a shape).
        || {
            nft_in(
                netns(&meshed[3].sb),
                &["add", "rule", "inet", "interlock", "output", "counter"],
            )
        },
    );
    assert_plugin_is(&node, &new_plugin, "after the upgrade");
    let made_up = judge_switch(&node, "upgrade", &up);
    wait_passes(&node, 3);
    let log = agent_log(&node);
    untouched(&node, "upgrade", meshed.iter(), &plain, target);
    let repaired = repairs(&node);
    let ended = counter_sum(&node, "interlock_connections_ended");
    eprintln!(
        "upgrade: {} captured + {} plain connections alive before and after; 0 sandboxes \
         restarted; repairs {repaired}, connections ended {ended} on the new agent's /metrics",
        meshed.len(),
        plain.len()
    );
    assert_eq!((repaired, ended), (0.0, 0.0), "{log}");
    assert!(!log.contains("UNPROTECTED"), "{log}");
    // The one whose rules differ was proven by a connection, once, and left as written;
    // the others read back as this build writes them.
    let proven: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("left as written"))
        .collect();
    assert!(
        proven.len() == 1 && proven[0].contains(&meshed[3].sb.id),
        "{log}"
    );
    let meshed_running = meshed.len() + made_up.iter().filter(|s| s.meshed).count();
    assert_eq!(
        verdicts(&node, "protected"),
        Some(meshed_running as f64),
        "{log}"
    );
    assert_eq!(verdicts(&node, "unprotected"), Some(0.0), "{log}");
    // Its rules are not 0.1.0's own any more: gone before the downgrade.
    let odd = meshed.pop().unwrap();
    node.remove_pod(&odd.sb).unwrap();
    drop(odd);

    // Meshed pods of the new release, with connections of their own.
    let newer: Vec<Meshed> = (0..2)
        .map(|i| run_meshed(&node, &format!("new{i}"), target))
        .collect();
    wait_passes(&node, agent_log(&node).matches("audit done").count() + 1);

    // ---- the downgrade ----
    // 0.1.0 predates the rule-shape contract: it judges every pod by its own rendering.
    // The generic profile's rules are rendered alike by both releases (the pods above);
    // newer[1] stands for a pod whose rules 0.2.0 renders otherwise than 0.1.0 (as for
    // profiles whose rules changed, e.g. Istio's): one rule more, capturing the same,
    // added while no agent runs.
    let differs = &newer[1];
    let down = roll(
        &node,
        image.path(),
        Image {
            agent: &old.interlock,
            plugin: &old.plugin,
            args: &[AUDIT[0], AUDIT[1], "--repair-policy", "report"],
        },
        "down",
        || {
            nft_in(
                netns(&differs.sb),
                &["add", "rule", "inet", "interlock", "output", "counter"],
            )
        },
    );
    assert_plugin_is(&node, &old.plugin, "after the downgrade");
    assert!(version(&node).contains("0.1.0"), "not the old agent");
    let made_down = judge_switch(&node, "downgrade", &down);
    wait_passes(&node, 3);
    // With `--repair-policy report` the older agent changes nothing: every connection
    // stays, the pod it reads as unprotected is only reported.
    let log = agent_log(&node);
    untouched(
        &node,
        "downgrade",
        meshed.iter().chain(&newer),
        &plain,
        target,
    );
    let repaired = repairs(&node);
    let ended = counter_sum(&node, "interlock_connections_ended");
    eprintln!(
        "downgrade (--repair-policy report): {} captured + {} plain connections alive \
         before and after; 0 sandboxes restarted; repairs {repaired}, connections ended \
         {ended} on the old agent's /metrics",
        meshed.len() + newer.len(),
        plain.len()
    );
    assert_eq!((repaired, ended), (0.0, 0.0), "{log}");
    let meshed_running = meshed.len()
        + newer.len()
        + made_up
            .iter()
            .chain(&made_down)
            .filter(|s| s.meshed)
            .count();
    assert_eq!(verdicts(&node, "unprotected"), Some(1.0), "{log}");
    assert_eq!(
        verdicts(&node, "protected"),
        Some(meshed_running as f64 - 1.0),
        "{log}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("UNPROTECTED") && l.contains(&differs.sb.id)),
        "{log}"
    );

    // What 0.1.0 does with its default policy: it rewrites rules it renders otherwise
    // and ends the connections they held, as it repairs any damage. The contract cannot
    // hold there; docs/operate.md says to downgrade with `--repair-policy report`.
    assert!(node
        .stop_agent(Duration::from_secs(20))
        .is_some_and(|s| s.success()));
    node.start_agent_from(&old.interlock, AgentArgs::args(&AUDIT))
        .unwrap();
    node.wait_agent_ready(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}"));
    common::wait_until(
        Duration::from_secs(30),
        || repairs(&node) >= 1.0,
        || format!("0.1.0 did not repair; log:\n{}", agent_log(&node)),
    );
    wait_passes(&node, agent_log(&node).matches("audit done").count() + 2);
    let log = agent_log(&node);
    assert!(
        alive(&differs.conn).is_err(),
        "0.1.0's repair left the connection open: the docs are wrong\n{log}"
    );
    captured(differs, target).unwrap_or_else(|e| panic!("{e}\n{log}"));
    untouched(
        &node,
        "0.1.0's repair",
        meshed.iter().chain(&newer[..1]),
        &plain,
        target,
    );
    assert_not_restarted(&node, "0.1.0's repair", &[&differs.sb]);
    eprintln!(
        "downgrade (0.1.0's default policy): repairs {}, connections ended {} — the pod \
         whose rules 0.1.0 renders otherwise lost its connection, the others kept theirs",
        repairs(&node),
        counter_sum(&node, "interlock_connections_ended")
    );
    assert_eq!(repairs(&node), 1.0, "{log}");
    assert!(
        counter_sum(&node, "interlock_connections_ended") >= 1.0,
        "{log}"
    );

    drop((meshed, newer, plain));
    let footprint = node.footprint();
    node.teardown().unwrap();
    assert_eq!(footprint.leftovers(), Vec::<String>::new());
}

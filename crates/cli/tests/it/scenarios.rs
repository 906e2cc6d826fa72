//! The three race scenarios on real containerd, each on its own node in a box
//! ([`interlock_testkit_node::node`]): a private containerd with the reference primary
//! (`bridge` + `host-local` + `portmap` as `10-calico.conflist`, cniVersion 0.3.1), the
//! real `interlock agent` and `interlock-cni`, and sandboxes created over CRI. Whether a
//! sandbox is protected is judged by the kit's independent capture check (a real
//! connection from inside the sandbox, no interlock code), never by the agent's word.

use crate::common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use interlock_agent::kubernetes::gating::LOSS_DEBOUNCE;
use interlock_cri::SandboxState;
use interlock_testkit::require_root;
use interlock_testkit_node::node::{
    in_netns, AgentArgs, Capture, Node, NodeOptions, PrimaryWrite, Sandbox, MESHED_ANNOTATION,
    TAINT_NOT_READY,
};
use serde_json::Value;

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

/// Tears the node down and asserts it left nothing: no process, mount, netns, bridge,
/// CNI cache entry or directory of it.
fn finish(node: Node) {
    let footprint = node.footprint();
    node.teardown().unwrap();
    assert_eq!(footprint.leftovers(), Vec::<String>::new());
}

#[test]
fn the_kit_marks_meshed_pods_as_the_plugin_reads_them() {
    assert_eq!(
        MESHED_ANNOTATION.0,
        interlock_redirect::profile::generic::keys::REDIRECT
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
    // Removing the pods leaves no attachment record and no address behind.
    assert_eq!(
        node.state_files().len(),
        sandboxes.len(),
        "one record per attachment"
    );
    for sb in &sandboxes {
        node.remove_pod(sb).unwrap();
    }
    assert_eq!(node.state_files(), Vec::<String>::new());
    assert_eq!(node.ipam_addresses(), Vec::<std::net::IpAddr>::new());
    finish(node);
}

/// Pods created by [`create_pods_until`], with whether each was meant to be meshed.
type Created = Vec<(bool, Result<Sandbox, String>)>;

/// Creates pods (the `pattern` of meshed/plain, repeated) until `stop` is set, at least
/// `min` of them.
fn create_pods_until(
    node: &Node,
    tag: &str,
    pattern: &[bool],
    min: usize,
    stop: &AtomicBool,
) -> Created {
    let mut made = Vec::new();
    while made.len() < min || !stop.load(Ordering::Relaxed) {
        let meshed = pattern[made.len() % pattern.len()];
        made.push((
            meshed,
            node.run_pod(&format!("{tag}{}", made.len()), meshed),
        ));
    }
    made
}

/// Asserts that no pod of `made` runs unprotected (meshed and not redirected) or runs
/// without an IP; returns the sandboxes that run. Failed creations are allowed (fail
/// closed) but printed.
fn assert_none_unprotected(node: &Node, what: &str, made: &Created) -> Vec<Sandbox> {
    let mut running = Vec::new();
    for (meshed, r) in made {
        match r {
            Err(e) => eprintln!("{what}: a pod (meshed {meshed}) failed: {e}"),
            Ok(sb) => {
                assert!(sb.ip.is_some(), "{what}: {sb:?} runs without an IP");
                running.push(sb.clone());
            }
        }
    }
    assert_protection(node, &running);
    running
}

/// The config containerd loads from the node's conf dir right now, as it decides: the
/// first `.conf`/`.conflist`/`.json` by name; `Err` when that one does not parse (the
/// whole load fails) or there is none. Read without any interlock code.
fn loaded_config(node: &Node) -> Result<(String, Value), String> {
    let dir = node.conf_dir();
    let first = node
        .conf_files()
        .into_iter()
        .find(|n| {
            [".conf", ".conflist", ".json"]
                .iter()
                .any(|x| n.ends_with(x))
        })
        .ok_or("no config")?;
    let bytes = std::fs::read(dir.join(&first)).map_err(|e| format!("{first}: {e}"))?;
    let v = serde_json::from_slice(&bytes).map_err(|e| format!("{first}: {e}"))?;
    Ok((first, v))
}

/// True when `config` (a conflist) runs interlock-cni after a primary.
fn runs_interlock(config: &Value) -> bool {
    let types: Vec<&str> = config["plugins"]
        .as_array()
        .map(|a| a.iter().filter_map(|p| p["type"].as_str()).collect())
        .unwrap_or_default();
    types.first() == Some(&"bridge") && types.contains(&"interlock-cni")
}

/// Polls the capture check until `sb` is redirected or `deadline` passes.
fn redirected_by(node: &Node, sb: &Sandbox, deadline: Instant) -> Result<(), Capture> {
    loop {
        match node.capture(sb) {
            Capture::Redirected => return Ok(()),
            other if Instant::now() > deadline => return Err(other),
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Interlock first, primary later: before the primary exists no meshed sandbox runs
/// unprotected (its creation fails, or it has no network); once the agent is ready
/// with the primary, every new pod gets an IP and its redirection — never a mesh-only
/// chain without an IP, never a primary-only one.
#[test]
fn interlock_first_then_primary_never_starts_a_pod_unprotected() {
    require_root!();
    let node = node(false);
    node.start_agent(AgentArgs::default()).unwrap();
    common::wait_until(
        Duration::from_secs(10),
        || node.agent_ready().is_some(),
        || format!("the agent never answered /readyz\n{}", node.agent_logs()),
    );
    // Not ready without a primary, and it stays so.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(node.agent_ready(), Some(false), "{}", node.agent_logs());
    for (i, meshed) in [true, true, false].into_iter().enumerate() {
        match node.run_pod(&format!("early{i}"), meshed) {
            // Before the agent's first pass containerd has no config at all; after it,
            // the agent's holding config refuses the ADD.
            Err(e) => assert!(
                e.contains("cni plugin not initialized")
                    || e.contains("this node has no primary CNI config yet"),
                "{e}"
            ),
            Ok(sb) => {
                assert_eq!(sb.ip, None, "{sb:?} got an IP without a primary");
                assert_eq!(node.capture(&sb), Capture::NoNetwork, "{sb:?}");
            }
        }
    }

    node.write_primary().unwrap();
    let took = node.wait_agent_ready(Duration::from_secs(10)).unwrap();
    eprintln!("agent ready {took:?} after the primary appeared");
    let mut sandboxes = Vec::new();
    for (i, meshed) in [true, false, true, true].into_iter().enumerate() {
        let sb = node
            .run_pod(&format!("late{i}"), meshed)
            .unwrap_or_else(|e| panic!("pod {i} after the primary: {e}\n{}", node.agent_logs()));
        assert!(
            sb.ip.is_some_and(|ip| node.containerd().in_subnet(ip)),
            "{sb:?}: no IP from the primary"
        );
        sandboxes.push(sb);
    }
    assert_protection(&node, &sandboxes);
    finish(node);
}

/// The moment the primary first appears: a meshed pod created right then must not run
/// with the primary alone. containerd loads a new `10-calico.conflist` within about a
/// millisecond and the agent's copy follows some 15 ms later; what closes that window is
/// the agent's holding config, which sorts first from the agent's first pass on and
/// refuses every ADD until it is replaced, in one rename, by the primary's chain plus
/// interlock-cni.
#[test]
fn a_pod_created_as_the_primary_appears_is_protected_at_once() {
    require_root!();
    let node = node(false);
    node.start_agent(AgentArgs::default()).unwrap();
    // The agent's first pass has put its holding config first (interlock-cni alone,
    // whose ADD fails until the primary exists).
    let holding = node.containerd().conf_dir().join("00-interlock.conflist");
    common::wait_until(
        Duration::from_secs(10),
        || {
            std::fs::read_to_string(&holding)
                .is_ok_and(|c| c.contains(interlock_contract::layout::HOLDING_NETWORK))
        },
        || node.agent_logs(),
    );
    let stop = AtomicBool::new(false);
    // Three creators, so that some ADD falls into the window.
    let made: Created = std::thread::scope(|s| {
        let creators: Vec<_> = (0..3)
            .map(|i| {
                let (node, stop) = (&node, &stop);
                s.spawn(move || create_pods_until(node, &format!("mid{i}x"), &[true], 2, stop))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        node.write_primary().unwrap();
        node.wait_agent_ready(Duration::from_secs(10)).unwrap();
        stop.store(true, Ordering::Relaxed);
        creators
            .into_iter()
            .flat_map(|c| c.join().unwrap())
            .collect()
    });
    assert_none_unprotected(&node, "as the primary appeared", &made);
    finish(node);
}

/// Pods before interlock (a node boot): sandboxes that started while only the primary
/// existed are repaired in place within 2 s of the agent becoming ready (the default
/// policy), the connections they opened before are ended, plain ones keep theirs; the
/// node carries the startup taint until the agent is ready.
#[test]
fn pods_started_before_interlock_are_repaired_and_the_node_stays_tainted() {
    require_root!();
    let node = node(true);
    node.write_primary().unwrap();
    node.wait_network_ready(true, Duration::from_secs(5))
        .unwrap();
    let mut pods = Vec::new();
    for (i, meshed) in [true, true, false, true, false].into_iter().enumerate() {
        pods.push(node.run_pod(&format!("boot{i}"), meshed).unwrap());
    }
    // Each pod holds a connection to the test's server on the bridge from before.
    let server = TcpListener::bind((node.gateway(), 0)).unwrap();
    let target = server.local_addr().unwrap();
    let mut conns = Vec::new();
    for sb in &pods {
        assert_eq!(
            node.capture(sb),
            Capture::NotRedirected,
            "{sb:?} before the agent"
        );
        let client = in_netns(sb.netns.as_ref().unwrap(), || {
            TcpStream::connect_timeout(&target, Duration::from_secs(2)).unwrap()
        })
        .unwrap();
        let (server_end, _) = server.accept().unwrap();
        conns.push((client, server_end));
    }
    assert_eq!(node.taints(), [TAINT_NOT_READY]);

    // A watcher samples the taint, then readiness, until the taint is gone: it may only
    // go once the agent says it is ready.
    let give_up = Instant::now() + Duration::from_secs(20);
    let (ready_at, untainted_at, samples) = std::thread::scope(|s| {
        let watcher = s.spawn(|| {
            let mut samples = 0;
            loop {
                let tainted = node.taints().contains(&TAINT_NOT_READY.to_string());
                let ready = node.agent_ready();
                samples += 1;
                if !tainted {
                    assert_eq!(
                        ready,
                        Some(true),
                        "the taint went before the agent was ready"
                    );
                    return (Some(Instant::now()), samples);
                }
                if Instant::now() > give_up {
                    return (None, samples);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        node.start_agent(AgentArgs::default()).unwrap();
        node.wait_agent_ready(Duration::from_secs(15)).unwrap();
        let ready_at = Instant::now();
        let (untainted_at, samples) = watcher.join().unwrap();
        (ready_at, untainted_at, samples)
    });
    let untainted_at =
        untainted_at.unwrap_or_else(|| panic!("the taint stayed\n{}", node.agent_logs()));
    // Not vacuous: the watcher saw the taint still on (at least two samples) before the
    // one that found it gone. (It was "more than 10": the agent now gets ready in about
    // 70 ms, and CI saw exactly 10 samples of a correct run.)
    assert!(
        samples >= 3,
        "the watcher never saw the node tainted ({samples} samples)"
    );
    let deadline = ready_at + Duration::from_secs(2);
    for sb in pods.iter().filter(|p| p.meshed) {
        redirected_by(&node, sb, deadline).unwrap_or_else(|c| {
            panic!(
                "{} not repaired within 2 s of ready: {c:?}\n{}",
                sb.name,
                node.agent_logs()
            )
        });
    }
    eprintln!(
        "every meshed sandbox redirected {:?} after the agent was ready; taint gone {:?} after ready",
        ready_at.elapsed(),
        untainted_at.saturating_duration_since(ready_at)
    );
    for (sb, (client, server_end)) in pods.iter().zip(&mut conns) {
        let used = client.write_all(b"after").and_then(|()| {
            let mut b = [0u8; 5];
            if sb.meshed {
                client.set_read_timeout(Some(Duration::from_secs(1)))?;
                client.read(&mut b).map(drop)
            } else {
                server_end.set_read_timeout(Some(Duration::from_secs(2)))?;
                server_end.read_exact(&mut b)
            }
        });
        if sb.meshed {
            let e = used.expect_err("a connection from before the repair still works");
            assert_eq!(
                e.kind(),
                std::io::ErrorKind::ConnectionAborted,
                "{}: {e:?}",
                sb.name
            );
        } else {
            used.unwrap_or_else(|e| panic!("{}: the plain pod's connection broke: {e}", sb.name));
        }
        if !sb.meshed {
            assert_eq!(
                node.capture(sb),
                Capture::NotRedirected,
                "{sb:?} after the agent"
            );
        }
    }
    // The API tells the same story: each repaired pod has its Repaired Event.
    for sb in &pods {
        if sb.meshed {
            common::wait_until(
                Duration::from_secs(5),
                || node.pod_events(sb).iter().any(|(r, _)| r == "Repaired"),
                || format!("{}: events {:?}", sb.name, node.pod_events(sb)),
            );
        } else {
            assert_eq!(
                node.pod_events(sb),
                Vec::<(String, String)>::new(),
                "{}",
                sb.name
            );
        }
    }
    let condition = node.condition().expect("no InterlockReady condition");
    assert_eq!(condition["status"], "True", "{condition}");
    finish(node);
}

/// The primary rewrites its file again and again, dropping whatever others added (by
/// rename like aws-node, or in place): no new sandbox starts unprotected.
#[test]
fn a_primary_rewriting_its_file_never_lets_a_pod_start_unprotected() {
    require_root!();
    let node = node(false);
    node.write_primary().unwrap();
    node.start_agent(AgentArgs::default()).unwrap();
    node.wait_agent_ready(Duration::from_secs(15)).unwrap();
    let stop = AtomicBool::new(false);
    let (made, rewrites) = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut n = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let how = if n.is_multiple_of(2) {
                    PrimaryWrite::Rename
                } else {
                    PrimaryWrite::InPlace
                };
                node.rewrite_primary(how).unwrap();
                n += 1;
                std::thread::sleep(Duration::from_millis(15));
            }
            n
        });
        let made = create_pods_until(&node, "rw", &[true, true, false], 6, &AtomicBool::new(true));
        stop.store(true, Ordering::Relaxed);
        (made, writer.join().unwrap())
    });
    eprintln!(
        "{rewrites} rewrites of the primary while {} pods were created",
        made.len()
    );
    assert!(rewrites > 10, "only {rewrites} rewrites");
    let running = assert_none_unprotected(&node, "while the primary rewrites", &made);
    assert!(
        running.iter().filter(|s| s.meshed).count() >= 3,
        "too few meshed pods ran"
    );
    assert_eq!(node.agent_ready(), Some(true), "{}", node.agent_logs());
    finish(node);
}

/// The agent is restarted (SIGTERM, new process) and upgraded (a new binary) while pods
/// are being created: the config containerd loads never loses interlock, and no sandbox
/// starts unprotected.
#[test]
fn an_agent_restart_and_upgrade_never_drop_the_config() {
    require_root!();
    let node = node(false);
    node.write_primary().unwrap();
    node.start_agent(AgentArgs::default()).unwrap();
    node.wait_agent_ready(Duration::from_secs(15)).unwrap();
    // The "new version": the same build at another path.
    let upgrade = node.containerd().dir().join("interlock-v2");
    std::os::unix::fs::symlink(common::interlock(), &upgrade).unwrap();
    // The watcher polls what containerd would load, and inotify tells it of any removal
    // of interlock's file between two polls.
    let (owned, v) = loaded_config(&node).unwrap();
    assert!(runs_interlock(&v), "{owned}: {v}");
    let mut watch = node.watch_conf_dir().unwrap();
    let stop = AtomicBool::new(false);
    let (made, lost, checks) = std::thread::scope(|s| {
        let watcher = s.spawn(|| {
            let (mut lost, mut checks) = (Vec::new(), 0u32);
            while !stop.load(Ordering::Relaxed) {
                match loaded_config(&node) {
                    Ok((_, v)) if runs_interlock(&v) => {}
                    other => lost.push(format!("{other:?}")),
                }
                let removed = watch.removed().unwrap();
                if removed.contains(&owned) {
                    lost.push(format!("{owned} removed ({removed:?})"));
                }
                checks += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            (lost, checks)
        });
        let creator = s.spawn(|| create_pods_until(&node, "up", &[true, false, true], 6, &stop));
        std::thread::sleep(Duration::from_millis(200));
        node.restart_agent().unwrap();
        node.wait_agent_ready(Duration::from_secs(15)).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        node.stop_agent(Duration::from_secs(10))
            .expect("the agent ended");
        node.start_agent_from(&upgrade, AgentArgs::default())
            .unwrap();
        node.wait_agent_ready(Duration::from_secs(15)).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        stop.store(true, Ordering::Relaxed);
        let made = creator.join().unwrap();
        let (lost, checks) = watcher.join().unwrap();
        (made, lost, checks)
    });
    assert!(checks > 100, "the watcher barely ran ({checks} checks)");
    assert!(
        lost.is_empty(),
        "the loaded config lost interlock {} times: {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    assert_none_unprotected(&node, "across the restart and upgrade", &made);
    assert!(
        made.iter().all(|(_, r)| r.is_ok()),
        "a pod failed across the restart"
    );
    finish(node);
}

/// A half-written foreign file sorting ahead of interlock's (containerd then fails the
/// whole load): the agent's readiness, the taint and the condition tell the truth, and
/// the node recovers once the file is completed. The file is one the operator lets sort
/// ahead (`--allow-ahead`, e.g. a meta plugin's), so once valid the agent chains into it;
/// a control character sorts before any name the agent could pick.
#[test]
fn a_half_written_file_sorting_first_is_reported_and_the_node_recovers() {
    require_root!();
    let half = "\u{1}half.conflist";
    let node = node(true);
    node.write_primary().unwrap();
    node.start_agent(AgentArgs::args(&[format!("--allow-ahead={half}")]))
        .unwrap();
    node.wait_agent_ready(Duration::from_secs(15)).unwrap();
    let api = node.api().unwrap();
    assert!(api.wait_until(Duration::from_secs(5), |_| node.taints().is_empty()));
    let owned = loaded_config(&node).unwrap().0;
    assert!(half < owned.as_str());
    let mut sandboxes = Vec::new();
    for (i, meshed) in [true, false, true].into_iter().enumerate() {
        sandboxes.push(node.run_pod(&format!("before{i}"), meshed).unwrap());
    }
    node.write_half_written(half).unwrap();
    let t0 = Instant::now();
    common::wait_until(
        Duration::from_secs(5),
        || node.network_ready() == Some(false),
        || format!("containerd still loads a config: {:?}", node.conf_files()),
    );
    common::wait_until(
        Duration::from_secs(5),
        || node.agent_ready() == Some(false),
        || {
            format!(
                "the agent still says ready with {half} first\n{}",
                node.agent_logs()
            )
        },
    );
    eprintln!(
        "agent not ready {:?} after the half-written file",
        t0.elapsed()
    );
    assert!(
        node.run_pod("during", true).is_err(),
        "a pod ran while containerd could not load its config"
    );
    assert!(
        api.wait_until(LOSS_DEBOUNCE + Duration::from_secs(5), |_| node.taints()
            == [TAINT_NOT_READY]),
        "the taint did not come back; {}",
        node.agent_logs()
    );
    let c = node.condition().unwrap();
    assert_eq!(c["status"], "False", "{c}");
    assert!(
        c["message"]
            .as_str()
            .unwrap_or("")
            .contains("half.conflist"),
        "{c}"
    );

    node.complete_file(half).unwrap();
    node.wait_agent_ready(Duration::from_secs(10)).unwrap();
    assert!(
        api.wait_until(Duration::from_secs(5), |_| node.taints().is_empty()),
        "the taint stayed after recovery; {}",
        node.agent_logs()
    );
    assert_eq!(node.condition().unwrap()["status"], "True");
    node.wait_network_ready(true, Duration::from_secs(5))
        .unwrap();
    let (loaded, v) = loaded_config(&node).unwrap();
    assert!(runs_interlock(&v), "{loaded} is loaded: {v}");
    // The sandboxes from before kept their protection; new ones get theirs.
    for (i, meshed) in [true, false, true].into_iter().enumerate() {
        sandboxes.push(node.run_pod(&format!("after{i}"), meshed).unwrap());
    }
    assert_protection(&node, &sandboxes);
    finish(node);
}

/// containerd restarts while interlock runs: the sandboxes survive, stay protected, and
/// the audit still sees them (its verdicts in /metrics, from audits after the restart).
#[test]
fn sandboxes_survive_a_containerd_restart_and_the_audit_still_sees_them() {
    require_root!();
    let node = node(false);
    node.write_primary().unwrap();
    node.start_agent(AgentArgs::args(&["--audit-interval", "1"]))
        .unwrap();
    node.wait_agent_ready(Duration::from_secs(15)).unwrap();
    let mut pods = Vec::new();
    for (i, meshed) in [true, false, true, true].into_iter().enumerate() {
        pods.push(node.run_pod(&format!("cr{i}"), meshed).unwrap());
    }
    let verdict =
        |v: &str| node.agent(|a| a.metric(&format!("interlock_sandboxes{{verdict=\"{v}\"}}")));
    let audits = || {
        node.agent(|a| a.metric("interlock_audit_duration_seconds_count"))
            .unwrap_or(0.0)
    };
    common::wait_until(
        Duration::from_secs(5),
        || verdict("protected") == Some(3.0) && verdict("not_meshed") == Some(1.0),
        || {
            node.agent(|a| a.get("/metrics"))
                .map(|m| m.1)
                .unwrap_or_default()
        },
    );

    let took = node.restart_containerd().unwrap();
    eprintln!("containerd answered again {took:?} after the restart");
    let before = audits();
    let listed = node.sandboxes().unwrap();
    for sb in &pods {
        let found = listed.iter().find(|s| s.id == sb.id);
        assert!(
            found.is_some_and(|s| s.state == SandboxState::Ready),
            "{} did not survive: {found:?}",
            sb.name
        );
    }
    assert_protection(&node, &pods);
    let late = node.run_pod("crlate", true).unwrap();
    assert_protection(&node, std::slice::from_ref(&late));
    common::wait_until(
        Duration::from_secs(5),
        || {
            audits() >= before + 2.0
                && verdict("protected") == Some(4.0)
                && verdict("not_meshed") == Some(1.0)
        },
        || {
            format!(
                "{}\n{}",
                node.agent(|a| a.get("/metrics"))
                    .map(|m| m.1)
                    .unwrap_or_default(),
                node.agent_logs()
            )
        },
    );
    assert_eq!(verdict("unprotected"), Some(0.0));
    assert_eq!(node.agent_ready(), Some(true));
    finish(node);
}

/// Without a Kubernetes API the agent socket answers the plugin's "annotations of pod X"
/// from the runtime's own sandboxes (what a runtime that hands the plugin no annotations
/// needs); a pod the runtime does not list stays undecided, never "not found".
#[test]
fn without_an_api_the_agent_socket_answers_from_the_runtimes_sandboxes() {
    require_root!();
    let node = node(false);
    node.write_primary().unwrap();
    node.start_agent(AgentArgs::default()).unwrap();
    node.wait_agent_ready(Duration::from_secs(10)).unwrap();
    let sb = node.run_pod("lookup", true).unwrap();
    let socket = node
        .state_dir()
        .join(interlock_contract::layout::AGENT_SOCKET_FILE);
    let ask = |namespace: &str, name: &str| -> serde_json::Value {
        use std::io::{BufRead, Write};
        let mut s = std::os::unix::net::UnixStream::connect(&socket).unwrap();
        let req = serde_json::json!({"v": 1, "op": "pod", "namespace": namespace, "name": name});
        s.write_all(format!("{req}\n").as_bytes()).unwrap();
        let mut out = String::new();
        std::io::BufReader::new(s).read_line(&mut out).unwrap();
        serde_json::from_str(&out).unwrap()
    };
    let got = ask(&sb.namespace, &sb.name);
    assert_eq!(got["status"], "found", "{got}\n{}", node.agent_logs());
    let (key, value) = interlock_testkit_node::node::MESHED_ANNOTATION;
    assert_eq!(got["annotations"][key], value, "{got}");
    let none = ask(&sb.namespace, "no-such-pod");
    assert_eq!(none["status"], "undecided", "{none}");
    assert!(
        none["reason"]
            .as_str()
            .unwrap()
            .contains("lists no sandbox"),
        "{none}"
    );
    finish(node);
}

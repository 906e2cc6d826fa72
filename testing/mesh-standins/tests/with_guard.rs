//! The race scenarios of `without_guard.rs` on a real containerd with each mesh's own
//! installer and plugin stand-ins, now with `interlock agent --config-mode guard
//! --guard-mesh <mesh>` (the real binary, the fake Kubernetes API): no meshed pod runs
//! uncaptured past the audit's budget, and none starts uncaptured at all once the agent
//! runs.
//!
//! - A meshed pod started before the agent existed runs uncaptured; the agent's audit
//!   proves that by a connection and restarts it (a `Restarted` Event); its sandbox,
//!   created again as the kubelet does, is held while the mesh's plugin cannot run and
//!   starts captured once the installer runs.
//! - In each scenario a meshed pod created in the window is refused ("try again later")
//!   and starts captured once the window closes; meshed pods started while the plugin
//!   runs are captured; no pod is restarted.
//! - Unmeshed pods start at once throughout, uncaptured, and are never restarted.
//! - The Node carries the startup taint (`InterlockReady=False`) while the window is held
//!   open longer than the agent's debounce, and loses it once the plugin is back.
//! - Guard mode writes no rules: nothing of interlock's in any pod's netns.
//! - At the end, with a proxy listening in each meshed pod still running, the audit
//!   proves every one captured by a connection (`interlock_sandboxes{verdict}`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use interlock_contract::guard::GuardedMesh;
use interlock_mesh_standins::scenario::{self, Interlock, MeshBed, Observation, Role, Scenario};
use interlock_testkit::require_root;
use interlock_testkit_node::node::{AgentArgs, Capture, NodeOptions};

const EXE: &str = env!("CARGO_BIN_EXE_mesh-standin");

/// Held by the Kuma tests: kuma-cni's plugin counts `/install-cni` processes host-wide.
static KUMA: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `interlock` and `interlock-cni` as built next to this test binary.
fn binaries() -> (PathBuf, PathBuf) {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe
        .ancestors()
        .skip(1)
        .take(2)
        .find(|d| d.join("interlock").is_file() && d.join("interlock-cni").is_file())
        .unwrap_or_else(|| {
            panic!(
                "interlock and interlock-cni are built next to {} \
                 (cargo build -p interlock -p interlock-cni)",
                exe.display()
            )
        })
        .to_path_buf();
    (dir.join("interlock"), dir.join("interlock-cni"))
}

/// The reasons of the Events about `namespace/name` in the fake API.
fn event_reasons(bed: &MeshBed, pod: &str) -> Vec<String> {
    let (ns, name) = pod.split_once('/').expect("namespace/name");
    bed.node
        .api()
        .expect("the fake API")
        .objects("events")
        .iter()
        .filter(|e| {
            e["regarding"]["kind"] == "Pod"
                && e["regarding"]["name"] == name
                && e["regarding"]["namespace"] == ns
        })
        .filter_map(|e| e["reason"].as_str().map(str::to_string))
        .collect()
}

/// Anything of interlock's redirection in a pod's netns (nftables table, iptables chain).
fn interlock_rules(netns: &Path) -> Option<String> {
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .args(["nft", "list", "ruleset"])
        .output()
        .expect("run nft");
    let nft = String::from_utf8_lossy(&out.stdout).into_owned();
    let nat = scenario::nat_rules(netns).expect("iptables-save");
    [nft, nat]
        .into_iter()
        .find(|t| t.to_ascii_lowercase().contains("interlock"))
}

/// The mesh's rules per chain, as its plugin writes them for the default case.
fn mesh_chains(mesh: GuardedMesh) -> std::collections::BTreeMap<String, usize> {
    let case = interlock_mesh_cases::default_case(
        interlock_mesh_standins::plugin::mesh_of(mesh.plugin_type()).expect("a mesh"),
    );
    let interlock_mesh_cases::MeshRules::Restore(want) = &case.v4 else {
        panic!("{}: IPv4 rules", case.id())
    };
    scenario::rules_per_chain(want)
}

/// What every started pod must show: meshed captured with the mesh's own rules, plain
/// not; nothing of interlock's in either.
fn check_started(mesh: GuardedMesh, o: &Observation, failures: &mut Vec<String>) {
    let s = o.scenario;
    let ok = match o.role {
        Role::Plain => o.uncaptured(),
        Role::Window | Role::Control => o.captured(),
    };
    if !ok {
        failures.push(format!(
            "{mesh} {s:?}: {:?} pod {} ({}, refused {}x): {:?}",
            o.role, o.pod, o.when, o.refusals, o.outcome
        ));
    }
    let Some(netns) = o.netns.as_ref().filter(|_| o.when == "at start") else {
        return;
    };
    if let Some(t) = interlock_rules(netns) {
        failures.push(format!(
            "{mesh} {s:?}: {} carries interlock's rules in guard mode:\n{t}",
            o.pod
        ));
    }
    if o.role != Role::Plain {
        let got = scenario::rules_per_chain(&scenario::nat_rules(netns).expect("iptables-save"));
        if got != mesh_chains(mesh) {
            failures.push(format!(
                "{mesh} {s:?}: {} rules per chain {got:?}, the mesh writes {:?}",
                o.pod,
                mesh_chains(mesh)
            ));
        }
    }
}

fn with_guard_mode(mesh: GuardedMesh) {
    let begin = Instant::now();
    let (interlock, plugin) = binaries();
    let mut bed = MeshBed::start(mesh, Path::new(EXE), NodeOptions::new(interlock, plugin))
        .expect("start the node");
    let args = AgentArgs::args(&["--config-mode", "guard", "--guard-mesh", mesh.as_str()]);
    let mut failures = Vec::new();
    let mut lines = Vec::new();

    // Before the agent: a meshed pod that runs uncaptured, restarted by the audit.
    match scenario::before_agent(&mut bed, &args) {
        Err(e) => failures.push(format!("{mesh} before the agent: {e}")),
        Ok(early) => {
            lines.push(format!("{mesh} before the agent: {early:?}"));
            if early.at_start != Capture::NotRedirected {
                failures.push(format!(
                    "{mesh}: {} before the agent: {:?}, want uncaptured",
                    early.pod, early.at_start
                ));
            }
            if early.restarted_after.is_none() {
                failures.push(format!(
                    "{mesh}: {} ran uncaptured and was not restarted within {:?} of the agent's start",
                    early.pod,
                    scenario::AUDIT_BUDGET
                ));
            }
            let restarted = early.events.iter().find(|(r, _)| r == "Restarted");
            match restarted {
                Some((_, note))
                    if note.contains(mesh.plugin_type())
                        && note.contains("not captured (proven by a connection)") => {}
                other => failures.push(format!(
                    "{mesh}: {}: a Restarted Event naming {} and the connection, got {other:?} (all: {:?})",
                    early.pod,
                    mesh.plugin_type(),
                    early.events
                )),
            }
            // The agent labels `interlock.dev/unprotected` only a pod it leaves
            // unprotected (a failed action, or the report policy); a restarted pod gets
            // the Event alone.
            if early.label.is_some() {
                failures.push(format!(
                    "{mesh}: {}: restarted, yet labelled unprotected={:?}",
                    early.pod, early.label
                ));
            }
            check_started(mesh, &early.plain, &mut failures);
            if early.plain.refusals != 0 || !early.plain_ready {
                failures.push(format!(
                    "{mesh}: the plain pod {} was refused {}x or restarted (ready at the end: {})",
                    early.plain.pod, early.plain.refusals, early.plain_ready
                ));
            }
            check_started(mesh, &early.again, &mut failures);
            if early.again.refusals == 0 {
                failures.push(format!(
                    "{mesh}: {} created again while the node holds was not refused",
                    early.again.pod
                ));
            }
            let w = &early.window;
            if !(w.tainted && w.not_ready && w.untainted_after.is_some()) {
                failures.push(format!(
                    "{mesh}: before the agent's installer: tainted while held, untainted after: {w:?}"
                ));
            }
        }
    }

    let mut last = Vec::new();
    for s in Scenario::ALL {
        let played = match scenario::play(&mut bed, s, &Interlock::Agent(args.clone())) {
            Ok(p) => p,
            Err(e) => {
                failures.push(format!("{mesh} {s:?}: {e}"));
                continue;
            }
        };
        let obs = &played.observations;
        let window = played.window.clone().expect("with interlock");
        lines.push(format!(
            "{mesh} {s:?}: {window:?}\n{}",
            scenario::describe(obs)
        ));
        for o in obs {
            check_started(mesh, o, &mut failures);
        }
        for o in obs.iter().filter(|o| o.when == "at start") {
            if o.role == Role::Plain && o.refusals != 0 {
                failures.push(format!(
                    "{mesh} {s:?}: the plain pod {} was refused {}x, last: {:?}",
                    o.pod, o.refusals, o.refused_with
                ));
            }
            // Nothing restarted: each sandbox still ready, no Restarted Event.
            let ready = o
                .sandbox
                .as_ref()
                .map(|id| bed.sandbox_ready(id).expect("list sandboxes"));
            let events = event_reasons(&bed, &o.pod);
            if ready != Some(true) || events.iter().any(|r| r == "Restarted") {
                failures.push(format!(
                    "{mesh} {s:?}: {:?} pod {} restarted (ready: {ready:?}, events {events:?})",
                    o.role, o.pod
                ));
            }
        }
        let window_pod = obs
            .iter()
            .find(|o| o.role == Role::Window && o.when == "at start")
            .expect("a window pod");
        // A primary's rewrite does not reach the agent's file: the plugin stays in the
        // chain and there is no window to hold (Kuma's installer restart may open one).
        let held = s != Scenario::PrimaryRewrite;
        if held && window_pod.refusals == 0 {
            failures.push(format!(
                "{mesh} {s:?}: {} created in the window was not refused",
                window_pod.pod
            ));
        }
        if window_pod.refusals > 0 && !(window.tainted && window.not_ready) {
            failures.push(format!(
                "{mesh} {s:?}: meshed pods held, yet the Node was not tainted (InterlockReady=False) during the window: {window:?}"
            ));
        }
        if window.untainted_after.is_none() {
            failures.push(format!(
                "{mesh} {s:?}: the plugin is back, yet the taint stayed: {window:?}"
            ));
        }
        last = played.observations;
    }
    // The last scenario's pods still run. With a proxy listening in each meshed one (the
    // audit then probes at once), the audit proves every one captured by its own
    // connection, and restarts none.
    let meshed: Vec<&Observation> = last
        .iter()
        .filter(|o| o.when == "at start" && o.role != Role::Plain && o.netns.is_some())
        .collect();
    let port = mesh.default_outbound_port();
    let proxies: Vec<_> = meshed
        .iter()
        .map(|o| {
            scenario::proxy_listener(o.netns.as_ref().expect("started"), port)
                .unwrap_or_else(|e| panic!("{}: {e}", o.pod))
        })
        .collect();
    let judged = Instant::now();
    let verdict = |v: &str| {
        bed.node
            .agent(|a| a.metric(&format!("interlock_sandboxes{{verdict=\"{v}\"}}")))
    };
    let mut seen = (None, None, None);
    while judged.elapsed() < Duration::from_secs(40) {
        seen = (
            verdict("protected"),
            verdict("unprotected"),
            verdict("unknown"),
        );
        if seen == (Some(meshed.len() as f64), Some(0.0), Some(0.0)) {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    lines.push(format!(
        "{mesh}: the audit judged {} meshed pods (protected, unprotected, unknown) = {seen:?} within {:.1} s",
        meshed.len(),
        judged.elapsed().as_secs_f64()
    ));
    if seen != (Some(meshed.len() as f64), Some(0.0), Some(0.0)) {
        failures.push(format!(
            "{mesh}: the audit's verdicts (protected, unprotected, unknown) {seen:?}, want {} protected",
            meshed.len()
        ));
    }
    drop(proxies);
    for o in last.iter().filter(|o| o.when == "at start") {
        let ready = o
            .sandbox
            .as_ref()
            .map(|id| bed.sandbox_ready(id).expect("list sandboxes"));
        if ready != Some(true) {
            failures.push(format!("{mesh}: {} restarted after the audit", o.pod));
        }
    }
    let elapsed = begin.elapsed();
    println!(
        "{mesh} with guard mode: {:.1} s, installer started {} times\n{}",
        elapsed.as_secs_f64(),
        bed.installer_starts(),
        lines.join("\n")
    );
    if !failures.is_empty() {
        eprintln!("agent logs:\n{}", bed.node.agent_logs());
    }
    let reset = bed.reset();
    let teardown = bed.node.containerd().dir().to_path_buf();
    drop(bed);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(reset.is_ok(), "{reset:?}");
    assert!(
        !teardown.exists(),
        "the kit directory {} is gone",
        teardown.display()
    );
}

#[test]
fn istio_with_guard_mode_no_meshed_pod_runs_uncaptured() {
    require_root!();
    with_guard_mode(GuardedMesh::Istio);
}

#[test]
fn consul_with_guard_mode_no_meshed_pod_runs_uncaptured() {
    require_root!();
    with_guard_mode(GuardedMesh::Consul);
}

#[test]
fn linkerd_with_guard_mode_no_meshed_pod_runs_uncaptured() {
    require_root!();
    with_guard_mode(GuardedMesh::Linkerd);
}

#[test]
fn kuma_with_guard_mode_no_meshed_pod_runs_uncaptured() {
    require_root!();
    let _one = KUMA.lock().unwrap_or_else(|e| e.into_inner());
    with_guard_mode(GuardedMesh::Kuma);
}

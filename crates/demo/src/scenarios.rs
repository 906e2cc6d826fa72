//! The seed's three scenarios, each replayed on two fresh nodes: "without interlock" (a
//! mesh CNI installed the usual way: its plugin entry written by an installer, no agent)
//! and "with interlock" (the agent running, the node registered with the startup taint).
//! Each side prints its timeline as it happens, then one line per pod, the node, and —
//! with interlock — `interlock check`.

use std::time::{Duration, Instant};

use crate::capture::{self, OpenConnection};
use crate::check_agrees::{self, Expected};
use crate::node_box::{Binaries, NodeInBox, RunningPod};
use crate::pods::{PodSpec, PODS};
use crate::report::{self, PodOutcome, Protection, ScenarioOutcome, SideOutcome, Started};

/// How long the demo waits for the agent to make a node ready.
const READY_WAIT: Duration = Duration::from_secs(10);
/// How long it waits for the audit to repair the pods that started before the agent
/// (the agent's budget is 2 s after it is ready).
const REPAIR_WAIT: Duration = Duration::from_secs(5);

/// Runs every scenario; `leftovers` collects what a node's teardown could not undo.
pub async fn run_all(
    bins: &Binaries,
    leftovers: &mut Vec<String>,
) -> Result<Vec<ScenarioOutcome>, String> {
    let mut out = Vec::new();
    out.push(scenario_1(bins, leftovers).await?);
    out.push(scenario_2(bins, leftovers).await?);
    out.push(scenario_3(bins, leftovers).await?);
    Ok(out)
}

/// Prints a side's timeline, in seconds since the side began.
struct Clock(Instant);

impl Clock {
    fn start() -> Clock {
        Clock(Instant::now())
    }

    fn say(&self, what: &str) {
        println!("    {:>6.2}s  {what}", self.0.elapsed().as_secs_f64());
    }
}

fn scenario_header(n: u32, title: &str, story: &str) {
    println!("\n━━ Scenario {n}: {title} ━━");
    for line in story.lines() {
        println!("  {line}");
    }
}

fn side_header(with: bool, how: &str) {
    let side = if with {
        "WITH interlock"
    } else {
        "WITHOUT interlock"
    };
    println!("\n  ▸ {side}: {how}");
}

/// A node named after its scenario and side.
async fn new_node(bins: &Binaries, scenario: u32, with: bool) -> Result<NodeInBox, String> {
    let name = format!("node-{scenario}{}", if with { "b" } else { "a" });
    NodeInBox::start(&name, bins, with).await
}

fn conf_dir_listing(node: &NodeInBox) -> String {
    let mut names: Vec<String> = std::fs::read_dir(node.conf_dir())
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with('.'))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    if names.is_empty() {
        "conf dir is empty".into()
    } else {
        format!(
            "conf dir: {} (containerd loads the first by name)",
            names.join(", ")
        )
    }
}

/// The kubelet starts every pod; says how that went in one line.
async fn start_pods(
    node: &NodeInBox,
    clock: &Clock,
    why: &str,
) -> Vec<(PodSpec, Result<RunningPod, String>)> {
    let mut started = Vec::new();
    for spec in PODS {
        started.push((spec, node.run_pod(&spec).await));
    }
    let ok = started.iter().filter(|(_, r)| r.is_ok()).count();
    clock.say(&format!(
        "{why}: {ok} of {} sandboxes running",
        started.len()
    ));
    started
}

/// The independent check of every running pod, and what the API says about each.
fn observe(
    node: &NodeInBox,
    started: &[(PodSpec, Result<RunningPod, String>)],
    mut earlier: Vec<(PodSpec, OpenConnection)>,
) -> Vec<PodOutcome> {
    started
        .iter()
        .map(|(spec, run)| {
            let (started, traffic) = match run {
                Ok(p) => (
                    Started::Running(p.ip.to_string()),
                    Some(capture::check(
                        &p.netns,
                        p.ip,
                        node.gateway(),
                        spec.mesh.proxy_ports(),
                    )),
                ),
                Err(e) => (Started::Failed(e.clone()), None),
            };
            let earlier_connection = earlier
                .iter_mut()
                .find(|(s, _)| s == spec)
                .map(|(_, c)| c.still_open().map_err(|e| ended_words(&e)));
            PodOutcome {
                spec: *spec,
                started,
                traffic,
                earlier_connection,
                view: node.pod_view(spec),
            }
        })
        .collect()
}

fn ended_words(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::ConnectionAborted => "ended (ECONNABORTED)".into(),
        std::io::ErrorKind::ConnectionReset => "ended (reset)".into(),
        _ => format!("ended ({e})"),
    }
}

fn print_pods(pods: &[PodOutcome]) {
    println!("{}", report::pod_header());
    for p in pods {
        println!("{}", report::pod_line(p));
    }
    for note in report::failure_notes(pods) {
        println!("{note}");
    }
}

/// Prints the pod table and the node line, and returns the side's outcome.
fn finish_side(
    node: &NodeInBox,
    with: bool,
    pods: Vec<PodOutcome>,
    highlight: Option<String>,
) -> SideOutcome {
    print_pods(&pods);
    let view = node.node_view();
    println!("{}", report::node_line(node.name(), &view));
    SideOutcome {
        with_interlock: with,
        pods,
        node: view,
        highlight,
        check_disagreements: Vec::new(),
    }
}

fn teardown(node: NodeInBox, leftovers: &mut Vec<String>) {
    let footprint = node.footprint();
    leftovers.extend(node.teardown());
    leftovers.extend(footprint.leftovers());
}

/// Starts the agent and waits until the node has lost its taint; says when.
async fn agent_until_ready(node: &mut NodeInBox, clock: &Clock) -> Result<(), String> {
    node.start_agent()?;
    clock.say("interlock agent starts (DaemonSet pod)");
    let t = Instant::now();
    if node
        .wait_node(READY_WAIT, |v| {
            !v.tainted && v.condition.as_ref().is_some_and(|c| c.0 == "True")
        })
        .await
    {
        clock.say(&format!(
            "agent ready after {} ms: taint removed, InterlockReady=True",
            t.elapsed().as_millis()
        ));
        Ok(())
    } else {
        clock.say(&format!(
            "node still tainted after {READY_WAIT:?} — the agent's log ends:\n{}",
            tail(&node.agent_log(), 8)
        ));
        Err(format!("the agent on {} did not become ready", node.name()))
    }
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| format!("              {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Runs `interlock check` as an operator would, prints it, and holds its JSON document
/// to what the connections showed (`pods`); returns where it contradicts them.
fn print_check(node: &NodeInBox, full: bool, pods: &[PodOutcome]) -> Vec<String> {
    match node.check() {
        Ok(run) => println!("{}", report::check_block(&run, full)),
        Err(e) => println!("    $ interlock check\n    could not run it: {e}"),
    }
    let meshed_all_redirected = pods
        .iter()
        .filter(|p| p.spec.mesh.meshed())
        .all(|p| p.protection() == Protection::Redirected);
    let expected = if meshed_all_redirected {
        Expected::Protected
    } else {
        Expected::Unprotected
    };
    let wrong = match node.check_json() {
        Ok(doc) => check_agrees::disagreements(&doc, expected, pods),
        Err(e) => vec![e],
    };
    if wrong.is_empty() {
        println!("    ✓ interlock check agrees with the connections");
    }
    for w in &wrong {
        println!("    ✗ CHECK WRONG: {w}");
    }
    wrong
}

async fn scenario_1(
    bins: &Binaries,
    leftovers: &mut Vec<String>,
) -> Result<ScenarioOutcome, String> {
    const TITLE: &str = "primary first, mesh second";
    scenario_header(
        1,
        TITLE,
        "The normal install: the primary CNI writes its config, then the mesh's CNI adds\n\
         its plugin, then pods are scheduled.",
    );

    side_header(
        false,
        "the mesh CNI's installer appends its plugin to the primary's file",
    );
    let node = new_node(bins, 1, false).await?;
    let clock = Clock::start();
    node.write_primary()?;
    clock.say("primary CNI writes 10-calico.conflist");
    node.append_mesh_entry_to_primary()?;
    clock.say("mesh CNI installer appends its plugin to 10-calico.conflist");
    node.wait_network_ready(Duration::from_secs(5)).await;
    clock.say(&conf_dir_listing(&node));
    let started = start_pods(&node, &clock, "pods scheduled").await;
    let pods = observe(&node, &started, Vec::new());
    let without = finish_side(&node, false, pods, None);
    teardown(node, leftovers);

    side_header(true, "the agent guards the config; the node starts tainted");
    let mut node = new_node(bins, 1, true).await?;
    let clock = Clock::start();
    node.write_primary()?;
    clock.say("primary CNI writes 10-calico.conflist");
    let ready = agent_until_ready(&mut node, &clock).await;
    clock.say(&conf_dir_listing(&node));
    let started = if ready.is_ok() {
        start_pods(&node, &clock, "scheduler places pods on the untainted node").await
    } else {
        not_scheduled()
    };
    let pods = observe(&node, &started, Vec::new());
    let mut with = finish_side(&node, true, pods, None);
    with.check_disagreements = print_check(&node, false, &with.pods);
    teardown(node, leftovers);

    Ok(ScenarioOutcome {
        number: 1,
        title: TITLE,
        without,
        with,
    })
}

/// Pods the scheduler never placed (the node kept its taint).
fn not_scheduled() -> Vec<(PodSpec, Result<RunningPod, String>)> {
    PODS.iter()
        .map(|p| {
            (
                *p,
                Err("not scheduled: the node kept its taint".to_string()),
            )
        })
        .collect()
}

async fn scenario_2(
    bins: &Binaries,
    leftovers: &mut Vec<String>,
) -> Result<ScenarioOutcome, String> {
    const TITLE: &str = "mesh first, primary later";
    scenario_header(
        2,
        TITLE,
        "The race at node start: the mesh's CNI is up before the primary has written\n\
         its config.",
    );

    side_header(false, "the mesh CNI finds no config and writes its own");
    let node = new_node(bins, 2, false).await?;
    let clock = Clock::start();
    let name = node.write_mesh_only_config()?;
    clock.say(&format!(
        "mesh CNI installer writes {name} (only its plugin: nothing gives pods an IP)"
    ));
    node.write_primary()?;
    clock.say("primary CNI writes 10-calico.conflist");
    node.wait_network_ready(Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    clock.say(&conf_dir_listing(&node));
    let started = start_pods(&node, &clock, "pods scheduled").await;
    let pods = observe(&node, &started, Vec::new());
    let without = finish_side(&node, false, pods, None);
    teardown(node, leftovers);

    side_header(
        true,
        "the agent starts before the primary; the node starts tainted",
    );
    let mut node = new_node(bins, 2, true).await?;
    let clock = Clock::start();
    node.start_agent()?;
    clock.say("interlock agent starts (DaemonSet pod); no primary config yet");
    // Give it the time to say what it thinks of an empty conf dir.
    node.wait_node(Duration::from_secs(3), |v| v.condition.is_some())
        .await;
    let v = node.node_view();
    clock.say(&format!(
        "agent not ready: node {}, InterlockReady={}",
        if v.tainted {
            "keeps its taint"
        } else {
            "UNTAINTED"
        },
        v.condition.as_ref().map_or("(none)", |c| c.0.as_str())
    ));
    clock.say(&conf_dir_listing(&node));
    match node.run_pod(&PODS[0]).await {
        Err(e) => clock.say(&format!(
            "a pod tolerating every taint starts anyway: refused ({e}); the kubelet retries"
        )),
        Ok(p) => {
            clock.say(&format!(
                "a pod tolerating every taint started before any config ({}): stopping it",
                p.sandbox
            ));
        }
    }
    node.write_primary()?;
    let primary_at = Instant::now();
    clock.say("primary CNI writes 10-calico.conflist");
    let ready = node
        .wait_node(READY_WAIT, |v| {
            !v.tainted && v.condition.as_ref().is_some_and(|c| c.0 == "True")
        })
        .await;
    let highlight = if ready {
        let ms = primary_at.elapsed().as_millis();
        clock.say(&format!(
            "agent writes its config and is ready {ms} ms after the primary: taint removed \
             (until then the taint kept pods away)"
        ));
        Some(format!("ready {ms} ms after the primary"))
    } else {
        clock.say(&format!(
            "node still tainted {READY_WAIT:?} after the primary — the agent's log ends:\n{}",
            tail(&node.agent_log(), 8)
        ));
        None
    };
    clock.say(&conf_dir_listing(&node));
    let started = if ready {
        start_pods(&node, &clock, "scheduler places pods on the untainted node").await
    } else {
        not_scheduled()
    };
    let pods = observe(&node, &started, Vec::new());
    let mut with = finish_side(&node, true, pods, highlight);
    with.check_disagreements = print_check(&node, false, &with.pods);
    teardown(node, leftovers);

    Ok(ScenarioOutcome {
        number: 2,
        title: TITLE,
        without,
        with,
    })
}

/// Each running meshed pod opens a connection that stays open (the app talking before
/// anyone protected it).
fn open_connections(
    node: &NodeInBox,
    started: &[(PodSpec, Result<RunningPod, String>)],
) -> Vec<(PodSpec, OpenConnection)> {
    started
        .iter()
        .filter(|(s, _)| s.mesh.meshed())
        .filter_map(|(s, r)| {
            let p = r.as_ref().ok()?;
            capture::open_connection(&p.netns, node.gateway())
                .ok()
                .map(|c| (*s, c))
        })
        .collect()
}

async fn scenario_3(
    bins: &Binaries,
    leftovers: &mut Vec<String>,
) -> Result<ScenarioOutcome, String> {
    const TITLE: &str = "pods before the mesh (node boot)";
    scenario_header(
        3,
        TITLE,
        "A node reboots: the primary is back at once and the kubelet restarts the pods\n\
         bound to it; the mesh's CNI comes up a second later.",
    );

    side_header(
        false,
        "the mesh CNI's installer appends its plugin once it runs",
    );
    let node = new_node(bins, 3, false).await?;
    let clock = Clock::start();
    node.write_primary()?;
    clock.say("primary CNI writes 10-calico.conflist");
    node.wait_network_ready(Duration::from_secs(5)).await;
    let started = start_pods(&node, &clock, "kubelet restarts the node's pods").await;
    let earlier = open_connections(&node, &started);
    clock.say(&format!(
        "{} meshed pods open a connection (in plaintext)",
        earlier.len()
    ));
    tokio::time::sleep(Duration::from_secs(1)).await;
    node.append_mesh_entry_to_primary()?;
    clock.say("mesh CNI installer appends its plugin to 10-calico.conflist (new pods only)");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pods = observe(&node, &started, earlier);
    let without = finish_side(&node, false, pods, None);
    teardown(node, leftovers);

    side_header(
        true,
        "the node registers tainted; the agent audits the running pods",
    );
    let mut node = new_node(bins, 3, true).await?;
    let clock = Clock::start();
    node.write_primary()?;
    clock.say("primary CNI writes 10-calico.conflist");
    node.wait_network_ready(Duration::from_secs(5)).await;
    let started = start_pods(
        &node,
        &clock,
        "kubelet restarts the node's pods (the taint only stops new scheduling)",
    )
    .await;
    let earlier = open_connections(&node, &started);
    clock.say(&format!(
        "{} meshed pods open a connection (in plaintext)",
        earlier.len()
    ));
    let before = observe(&node, &started, Vec::new());
    clock.say("before the agent runs, the connections show:");
    print_pods(&before);
    clock.say("an operator runs interlock check before the agent is up:");
    let mut wrong = print_check(&node, true, &before);
    let agent_at = Instant::now();
    let ready = agent_until_ready(&mut node, &clock).await;
    let meshed: Vec<PodSpec> = started
        .iter()
        .filter(|(s, r)| s.mesh.meshed() && r.is_ok())
        .map(|(s, _)| *s)
        .collect();
    let mut highlight = None;
    if ready.is_ok() {
        // The audit's action shows as an Event on each pod; the traffic is checked only
        // afterwards (a proxy listening during the audit would change its choice).
        let end = Instant::now() + REPAIR_WAIT;
        while Instant::now() < end && !meshed.iter().all(|s| !node.pod_view(s).events.is_empty()) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let acted = meshed
            .iter()
            .filter(|s| !node.pod_view(s).events.is_empty())
            .count();
        let ms = agent_at.elapsed().as_millis();
        clock.say(&format!(
            "agent's audit acted on {acted} of {} meshed pods within {ms} ms of its start",
            meshed.len()
        ));
        highlight = Some(format!("repaired within {ms} ms"));
    }
    let pods = observe(&node, &started, earlier);
    let mut with = finish_side(&node, true, pods, highlight);
    wrong.extend(print_check(&node, true, &with.pods));
    with.check_disagreements = wrong;
    teardown(node, leftovers);

    Ok(ScenarioOutcome {
        number: 3,
        title: TITLE,
        without,
        with,
    })
}

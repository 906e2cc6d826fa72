//! The three race scenarios, each replayed on two fresh nodes: "without interlock" (a
//! mesh CNI installed the usual way: its plugin entry written by an installer, no agent)
//! and "with interlock" (the agent running, the node registered with the startup taint).
//! Each side prints its timeline as it happens, then one line per pod, the node, and —
//! with interlock — `interlock check`.

use std::time::{Duration, Instant};

use interlock_contract::guard::GuardedMesh;
use interlock_testkit_node::node::{PrimaryWrite, Sandbox, PRIMARY_CONFLIST};

use crate::capture::{self, OpenConnection};
use crate::check_agrees::{self, Expected};
use crate::interrupt::{self, Interrupted};
use crate::node_box::{wait_until, Binaries, DemoNode};
use crate::pods::{PodSpec, GUARDED_PODS, PODS};
use crate::report::{self, PodOutcome, Protection, ScenarioOutcome, SideOutcome, Started};

/// How long the demo waits for the agent to make a node ready.
const READY_WAIT: Duration = Duration::from_secs(10);
/// How long it waits for the audit to repair the pods that started before the agent
/// (the agent's budget is 2 s after it is ready).
const REPAIR_WAIT: Duration = Duration::from_secs(5);

/// Why the demo stopped before its verdict.
#[derive(Debug)]
pub enum Stop {
    /// Ctrl-C or SIGTERM.
    Interrupted,
    /// Something the demo needs failed (not a verdict on interlock): what.
    Failed(String),
}

impl From<Interrupted> for Stop {
    fn from(_: Interrupted) -> Stop {
        Stop::Interrupted
    }
}

impl From<String> for Stop {
    fn from(e: String) -> Stop {
        Stop::Failed(e)
    }
}

/// Runs every scenario; `leftovers` collects what a node's teardown could not undo.
pub fn run_all(bins: &Binaries, leftovers: &mut Vec<String>) -> Result<Vec<ScenarioOutcome>, Stop> {
    Ok(vec![
        scenario_1(bins, leftovers)?,
        scenario_2(bins, leftovers)?,
        scenario_3(bins, leftovers)?,
        scenario_4(bins, leftovers)?,
    ])
}

/// Sleeps `d`, stopping early on Ctrl-C.
fn pause(d: Duration) -> Result<(), Interrupted> {
    wait_until(d, || false).map(drop)
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

/// A fresh node; with interlock it registers with the startup taint.
fn new_node(bins: &Binaries, with: bool) -> Result<DemoNode, Stop> {
    interrupt::check()?;
    Ok(DemoNode::start(bins, with)?)
}

fn conf_dir_listing(node: &DemoNode) -> String {
    let names: Vec<String> = node
        .conf_files()
        .into_iter()
        .filter(|n| !n.starts_with('.'))
        .collect();
    if names.is_empty() {
        "conf dir is empty".into()
    } else {
        format!(
            "conf dir: {} (containerd loads the first by name)",
            names.join(", ")
        )
    }
}

/// Each pod with its sandbox, or containerd's refusal.
type PodsStarted = Vec<(PodSpec, Result<Sandbox, String>)>;

/// The kubelet starts every pod; says how that went in one line.
fn start_pods(node: &DemoNode, clock: &Clock, why: &str) -> Result<PodsStarted, Interrupted> {
    start_pods_but(node, clock, why, Vec::new())
}

/// Like [`start_pods`], for the pods not in `running` (which run already).
fn start_pods_but(
    node: &DemoNode,
    clock: &Clock,
    why: &str,
    running: PodsStarted,
) -> Result<PodsStarted, Interrupted> {
    let mut started = Vec::new();
    for spec in PODS {
        interrupt::check()?;
        match running.iter().find(|(s, _)| *s == spec) {
            Some(already) => started.push(already.clone()),
            None => started.push((spec, node.run_pod(&spec))),
        }
    }
    let ok = started.iter().filter(|(_, r)| r.is_ok()).count();
    clock.say(&format!(
        "{why}: {ok} of {} sandboxes running",
        started.len()
    ));
    Ok(started)
}

/// The independent check of every running pod, and what the API says about each.
fn observe(
    node: &DemoNode,
    started: &[(PodSpec, Result<Sandbox, String>)],
    mut earlier: Vec<(PodSpec, OpenConnection)>,
) -> Vec<PodOutcome> {
    started
        .iter()
        .map(|(spec, run)| {
            let (started, traffic) = match run {
                Ok(Sandbox {
                    ip: Some(ip),
                    netns: Some(netns),
                    ..
                }) => (
                    Started::Running(ip.to_string()),
                    Some(capture::check(
                        netns,
                        *ip,
                        node.gateway(),
                        spec.mesh.proxy_ports(),
                    )),
                ),
                Ok(s) => (
                    Started::Failed(format!("sandbox {} has no IP or no netns", s.id)),
                    None,
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
    for note in report::notes(pods) {
        println!("{note}");
    }
}

/// Prints the pod table and the node line, and returns the side's outcome.
fn finish_side(
    node: &DemoNode,
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

fn teardown(node: DemoNode, leftovers: &mut Vec<String>) {
    let footprint = node.footprint();
    leftovers.extend(node.teardown());
    leftovers.extend(footprint.leftovers());
}

/// Starts the agent and waits until the node has lost its taint; says when, and
/// whether it happened.
fn agent_until_ready(node: &DemoNode, clock: &Clock) -> Result<bool, Stop> {
    node.start_agent()?;
    clock.say("interlock agent starts (DaemonSet pod)");
    let t = Instant::now();
    if node.wait_node(READY_WAIT, |v| v.ready())? {
        clock.say(&format!(
            "agent ready after {} ms: taint removed, InterlockReady=True",
            t.elapsed().as_millis()
        ));
        Ok(true)
    } else {
        clock.say(&format!(
            "node still tainted after {READY_WAIT:?}; the agent's log ends:\n{}",
            tail(&node.agent_log(), 8)
        ));
        Ok(false)
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
fn print_check(node: &DemoNode, full: bool, pods: &[PodOutcome]) -> Vec<String> {
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

fn scenario_1(bins: &Binaries, leftovers: &mut Vec<String>) -> Result<ScenarioOutcome, Stop> {
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
    let node = new_node(bins, false)?;
    let clock = Clock::start();
    node.write_primary()?;
    clock.say("primary CNI writes 10-calico.conflist");
    node.append_mesh_entry_to_primary()?;
    clock.say("mesh CNI installer appends its plugin to 10-calico.conflist");
    node.wait_network_ready(Duration::from_secs(5));
    clock.say(&conf_dir_listing(&node));
    let started = start_pods(&node, &clock, "pods scheduled")?;
    let pods = observe(&node, &started, Vec::new());
    let without = finish_side(&node, false, pods, None);
    teardown(node, leftovers);

    side_header(true, "the agent guards the config; the node starts tainted");
    let node = new_node(bins, true)?;
    let clock = Clock::start();
    node.write_primary()?;
    clock.say("primary CNI writes 10-calico.conflist");
    let ready = agent_until_ready(&node, &clock)?;
    clock.say(&conf_dir_listing(&node));
    let started = if ready {
        start_pods(&node, &clock, "scheduler places pods on the untainted node")?
    } else {
        not_scheduled_but(Vec::new())
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

/// Pods the scheduler never placed (the node kept its taint), but for those in
/// `running`, which run already.
fn not_scheduled_but(running: PodsStarted) -> PodsStarted {
    PODS.iter()
        .map(|p| match running.iter().find(|(s, _)| s == p) {
            Some(already) => already.clone(),
            None => (
                *p,
                Err("not scheduled: the node kept its taint".to_string()),
            ),
        })
        .collect()
}

fn scenario_2(bins: &Binaries, leftovers: &mut Vec<String>) -> Result<ScenarioOutcome, Stop> {
    const TITLE: &str = "mesh first, primary later";
    scenario_header(
        2,
        TITLE,
        "The race at node start: the mesh's CNI is up before the primary has written\n\
         its config.",
    );

    side_header(false, "the mesh CNI finds no config and writes its own");
    let node = new_node(bins, false)?;
    let clock = Clock::start();
    let name = node.write_mesh_only_config()?;
    clock.say(&format!(
        "mesh CNI installer writes {name} (only its plugin: nothing gives pods an IP)"
    ));
    node.write_primary()?;
    clock.say("primary CNI writes 10-calico.conflist");
    node.wait_network_ready(Duration::from_secs(5));
    pause(Duration::from_millis(50))?;
    clock.say(&conf_dir_listing(&node));
    let started = start_pods(&node, &clock, "pods scheduled")?;
    let pods = observe(&node, &started, Vec::new());
    let without = finish_side(&node, false, pods, None);
    teardown(node, leftovers);

    side_header(
        true,
        "the agent starts before the primary; the node starts tainted",
    );
    let node = new_node(bins, true)?;
    let clock = Clock::start();
    node.start_agent()?;
    clock.say("interlock agent starts (DaemonSet pod); no primary config yet");
    // Give it the time to say what it thinks of an empty conf dir.
    node.wait_node(Duration::from_secs(3), |v| v.condition.is_some())?;
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
    // The agent's first pass puts its holding config first: interlock-cni alone, whose
    // ADD is refused until the primary has written its config.
    let deadline = Instant::now() + Duration::from_secs(3);
    while !node
        .conf_files()
        .iter()
        .any(|n| n.ends_with("interlock.conflist"))
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    clock.say(&format!(
        "{} — the agent's holding config: every ADD is refused until the primary writes its config",
        conf_dir_listing(&node)
    ));
    let mut early = Vec::new();
    match node.run_pod(&PODS[0]) {
        Err(e) => clock.say(&format!(
            "a pod tolerating every taint starts anyway: refused ({e}); the kubelet retries"
        )),
        // Judged below with the others, in the sandbox it got now.
        Ok(p) => {
            clock.say(&format!(
                "a pod tolerating every taint STARTED before any config existed (sandbox {})",
                p.id
            ));
            early.push((PODS[0], Ok(p)));
        }
    }
    node.write_primary()?;
    let primary_at = Instant::now();
    clock.say("primary CNI writes 10-calico.conflist");
    let ready = node.wait_node(READY_WAIT, |v| v.ready())?;
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
        start_pods_but(
            &node,
            &clock,
            "scheduler places pods on the untainted node",
            early,
        )?
    } else {
        not_scheduled_but(early)
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
fn open_connections(node: &DemoNode, started: &PodsStarted) -> Vec<(PodSpec, OpenConnection)> {
    started
        .iter()
        .filter(|(s, _)| s.mesh.meshed())
        .filter_map(|(s, r)| {
            let netns = r.as_ref().ok()?.netns.as_ref()?;
            capture::open_connection(netns, node.gateway())
                .ok()
                .map(|c| (*s, c))
        })
        .collect()
}

fn scenario_3(bins: &Binaries, leftovers: &mut Vec<String>) -> Result<ScenarioOutcome, Stop> {
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
    let node = new_node(bins, false)?;
    let clock = Clock::start();
    node.write_primary()?;
    clock.say("primary CNI writes 10-calico.conflist");
    node.wait_network_ready(Duration::from_secs(5));
    let started = start_pods(&node, &clock, "kubelet restarts the node's pods")?;
    let earlier = open_connections(&node, &started);
    clock.say(&format!(
        "{} meshed pods open a connection (in plaintext)",
        earlier.len()
    ));
    pause(Duration::from_secs(1))?;
    node.append_mesh_entry_to_primary()?;
    clock.say("mesh CNI installer appends its plugin to 10-calico.conflist (new pods only)");
    pause(Duration::from_secs(1))?;
    let pods = observe(&node, &started, earlier);
    let without = finish_side(&node, false, pods, None);
    teardown(node, leftovers);

    side_header(
        true,
        "the node registers tainted; the agent audits the running pods",
    );
    let node = new_node(bins, true)?;
    let clock = Clock::start();
    node.write_primary()?;
    clock.say("primary CNI writes 10-calico.conflist");
    node.wait_network_ready(Duration::from_secs(5));
    let started = start_pods(
        &node,
        &clock,
        "kubelet restarts the node's pods (the taint only stops new scheduling)",
    )?;
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
    let ready = agent_until_ready(&node, &clock)?;
    let meshed: Vec<PodSpec> = started
        .iter()
        .filter(|(s, r)| s.mesh.meshed() && r.is_ok())
        .map(|(s, _)| *s)
        .collect();
    let mut highlight = None;
    if ready {
        // The audit's action shows as an Event on each pod; the traffic is checked only
        // afterwards (a proxy listening during the audit would change its choice).
        wait_until(REPAIR_WAIT, || {
            meshed.iter().all(|s| !node.pod_view(s).events.is_empty())
        })?;
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

/// How long the kubelet's retries of a held pod are followed.
const HELD_WAIT: Duration = Duration::from_secs(30);

/// Waits until containerd's loaded chain does (`true`) or does not carry istio-cni.
fn istio_in_chain(node: &mut DemoNode, carries: bool) -> Result<(), Stop> {
    interrupt::check()?;
    node.mesh()?.wait_chain(carries)?;
    Ok(())
}

/// The kubelet runs `spec`'s sandbox and, while the runtime refuses it, retries (every
/// 200 ms here, up to [`HELD_WAIT`]); returns the outcome and the refusals, oldest first.
fn run_retrying(
    node: &DemoNode,
    spec: &PodSpec,
) -> Result<(Result<Sandbox, String>, Vec<String>), Interrupted> {
    let deadline = Instant::now() + HELD_WAIT;
    let mut refusals = Vec::new();
    loop {
        interrupt::check()?;
        match node.run_pod(spec) {
            Ok(sb) => return Ok((Ok(sb), refusals)),
            Err(e) if Instant::now() >= deadline => return Ok((Err(e), refusals)),
            Err(e) => refusals.push(e),
        }
        pause(Duration::from_millis(200))?;
    }
}

fn scenario_4(bins: &Binaries, leftovers: &mut Vec<String>) -> Result<ScenarioOutcome, Stop> {
    const TITLE: &str = "a mesh keeps its own CNI (istio-cni)";
    const MESH: GuardedMesh = GuardedMesh::Istio;
    let [web, cart, db] = GUARDED_PODS;
    scenario_header(
        4,
        TITLE,
        "istio-cni redirects, as in most clusters: its installer (a DaemonSet) picks the\n\
         first config file once, for good, and appends its plugin there; the primary's\n\
         rewrite of that file drops it until the installer puts it back, and the installer\n\
         removes it whenever its pod restarts. Its windows are milliseconds long; here\n\
         the installer is paused (SIGSTOP) so that a pod lands in each window every time.\n\
         Pods: shop/web and shop/cart (Istio sidecar), shop/db (no mesh). With interlock,\n\
         the agent runs in guard mode (--config-mode guard --guard-mesh istio): interlock-cni\n\
         sits before istio-cni and writes no rules; istio-cni's plugin and installer are\n\
         stand-ins (mesh-standin) that write and remove what the real ones do.",
    );

    side_header(false, "istio-cni's installer and plugin, no agent");
    let mut node = DemoNode::start_guarded(bins, MESH, false)?;
    let clock = Clock::start();
    node.write_primary()?;
    clock.say("primary CNI writes 10-calico.conflist");
    node.mesh()?.start_installer()?;
    istio_in_chain(&mut node, true)?;
    clock.say(
        "istio-cni's installer picks 10-calico.conflist (the first file) as its target and appends istio-cni",
    );
    node.mesh()?.hold_installer();
    node.rewrite_primary(PrimaryWrite::Rename)?;
    istio_in_chain(&mut node, false)?;
    clock.say("primary CNI rewrites 10-calico.conflist: istio-cni's entry is gone (installer not yet back)");
    let mut started = vec![(web, node.run_pod(&web)), (db, node.run_pod(&db))];
    clock.say(&format!(
        "kubelet starts shop/web and shop/db: {}",
        started_words(&started)
    ));
    node.mesh()?.release_installer();
    istio_in_chain(&mut node, true)?;
    clock.say("istio-cni's installer puts its entry back (new pods only)");
    node.mesh()?.stop_installer();
    istio_in_chain(&mut node, false)?;
    clock.say(
        "istio-cni's pod restarts (a rollout): the old installer removes its entry and binary",
    );
    started.push((cart, node.run_pod(&cart)));
    clock.say(&format!(
        "kubelet starts shop/cart: {}",
        started_words(&started[2..])
    ));
    node.mesh()?.start_installer()?;
    istio_in_chain(&mut node, true)?;
    clock.say("the new installer appends istio-cni again (new pods only)");
    let started = in_order(started);
    let pods = observe(&node, &started, Vec::new());
    let without = finish_side(&node, false, pods, None);
    teardown(node, leftovers);

    side_header(
        true,
        "the agent in guard mode keeps istio-cni's entry in its guard file; the node starts tainted",
    );
    let mut node = DemoNode::start_guarded(bins, MESH, true)?;
    let clock = Clock::start();
    node.write_primary()?;
    clock.say("primary CNI writes 10-calico.conflist");
    node.start_agent()?;
    clock.say("interlock agent starts in guard mode (DaemonSet pod)");
    let guard_file = wait_for_guard_file(&node)?;
    let v = node.node_view();
    clock.say(&format!(
        "{} — the guard file: the primary's plugins, then interlock-cni holding meshed pods (no istio-cni yet); node {}",
        conf_dir_listing(&node),
        if v.tainted { "keeps its taint" } else { "UNTAINTED" },
    ));
    node.mesh()?.start_installer()?;
    let installer_at = Instant::now();
    clock.say("istio-cni's installer starts");
    let ready = node.wait_node(READY_WAIT, |v| v.ready())?;
    let mut highlight = Vec::new();
    if ready {
        let ms = installer_at.elapsed().as_millis();
        let target = if node.file_runs(PRIMARY_CONFLIST, MESH.plugin_type()) {
            format!("{PRIMARY_CONFLIST}, and the agent copies its entry into {guard_file}")
        } else {
            format!("{guard_file} (the first file)")
        };
        clock.say(&format!(
            "istio-cni appends itself to {target}; the agent adopts the entry and is ready {ms} ms after the installer started: taint removed"
        ));
    } else {
        clock.say(&format!(
            "node still tainted {READY_WAIT:?} after istio-cni's installer started — the agent's log ends:\n{}",
            tail(&node.agent_log(), 8)
        ));
    }
    node.mesh()?.hold_installer();
    node.rewrite_primary(PrimaryWrite::Rename)?;
    clock.say("primary CNI rewrites 10-calico.conflist (installer paused as before)");
    // The agent answers the rewrite from the new primary and the entry it keeps: the
    // chain containerd loads never lacks istio-cni.
    pause(Duration::from_millis(300))?;
    let mut started = vec![(web, node.run_pod(&web))];
    clock.say(&format!(
        "kubelet starts shop/web: {} — {guard_file} {}",
        started_words(&started),
        if node.file_runs(&guard_file, MESH.plugin_type()) {
            "still runs istio-cni"
        } else {
            "LOST istio-cni"
        }
    ));
    node.mesh()?.release_installer();
    node.mesh()?.stop_installer();
    clock.say("istio-cni's pod restarts: the old installer removes its entry from the guard file and its binary");
    if wait_until(READY_WAIT, || node.guard_holds(&guard_file))? {
        clock.say(&format!(
            "the agent has rewritten {guard_file} by the time the old installer exits: interlock-cni now holds meshed pods"
        ));
    }
    started.push((db, node.run_pod(&db)));
    clock.say(&format!(
        "kubelet starts shop/db (not meshed) during the hold: {}",
        started_words(&started[1..])
    ));
    let cart_first = node.run_pod(&cart);
    let mut held_pods = 0;
    let cart_run = match cart_first {
        Ok(sb) => {
            clock.say(&format!(
                "kubelet starts shop/cart: STARTED during the hold (sandbox {})",
                sb.id
            ));
            Ok(sb)
        }
        Err(e) => {
            held_pods += 1;
            clock.say(&format!(
                "kubelet starts shop/cart: held — {}",
                e.split("; ").next().unwrap_or(&e)
            ));
            // A not-ready that lasts under 3 s re-taints nothing (the agent's debounce);
            // the new installer is slow enough here to see the taint come back.
            let tainted = node.wait_node(READY_WAIT, |v| v.tainted)?;
            let v = node.node_view();
            clock.say(&format!(
                "node {}, InterlockReady={}",
                if tainted {
                    "tainted again (after 3 s not ready)"
                } else {
                    "NOT TAINTED"
                },
                v.condition.as_ref().map_or("(none)", |c| c.0.as_str()),
            ));
            node.mesh()?.start_installer()?;
            let restarted_at = Instant::now();
            clock.say("the new installer starts; the kubelet keeps retrying shop/cart");
            let (run, refusals) = run_retrying(&node, &cart)?;
            let ready = node.wait_node(READY_WAIT, |v| v.ready())?;
            clock.say(&format!(
                "istio-cni back in {guard_file}: node {}; shop/cart {} after {} more refusal(s), {} ms after the installer started",
                if ready { "ready again, taint removed" } else { "STILL TAINTED" },
                if run.is_ok() { "starts" } else { "STILL REFUSED" },
                refusals.len(),
                restarted_at.elapsed().as_millis()
            ));
            highlight.push(format!("{} held until istio-cni was back", held_pods));
            run
        }
    };
    if node.mesh()?.installer_starts() < 2 {
        node.mesh()?.start_installer()?;
        node.wait_node(READY_WAIT, |v| v.ready())?;
    }
    started.push((cart, cart_run));
    let started = in_order(started);
    let pods = observe(&node, &started, Vec::new());
    // Only now, after the connections above: a listening proxy is what guard mode's
    // audit (and check) probe through, and their probe must not meet the demo's own.
    let sidecars: Vec<_> = started
        .iter()
        .filter(|(s, _)| s.mesh.meshed())
        .filter_map(|(s, r)| {
            let netns = r.as_ref().ok()?.netns.as_ref()?;
            capture::proxy_listens(netns, s.mesh.proxy_ports()).ok()
        })
        .collect();
    clock.say(&format!(
        "the sidecar proxies start: {} meshed pods listen on their proxy's port",
        sidecars.len()
    ));
    let mut with = finish_side(
        &node,
        true,
        pods,
        (!highlight.is_empty()).then(|| highlight.join(", ")),
    );
    with.check_disagreements = print_check(&node, true, &with.pods);
    drop(sidecars);
    teardown(node, leftovers);

    Ok(ScenarioOutcome {
        number: 4,
        title: TITLE,
        without,
        with,
    })
}

/// The pods in [`GUARDED_PODS`]'s order.
fn in_order(mut started: PodsStarted) -> PodsStarted {
    started.sort_by_key(|(s, _)| GUARDED_PODS.iter().position(|p| p == s));
    started
}

/// `started, started` / `refused (why)` for each pod, in a few words.
fn started_words(started: &[(PodSpec, Result<Sandbox, String>)]) -> String {
    started
        .iter()
        .map(|(s, r)| match r {
            Ok(_) => format!("{} started", s.full_name()),
            Err(e) => format!("{} refused ({e})", s.full_name()),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Waits until the agent has written its guard file; returns its name.
fn wait_for_guard_file(node: &DemoNode) -> Result<String, Stop> {
    let mut name = None;
    wait_until(READY_WAIT, || {
        name = node
            .conf_files()
            .into_iter()
            .find(|n| n.ends_with("interlock.conflist"));
        name.is_some()
    })?;
    name.ok_or_else(|| {
        Stop::Failed(format!(
            "the agent wrote no guard file within {READY_WAIT:?}; its log ends:\n{}",
            tail(&node.agent_log(), 8)
        ))
    })
}

//! The race scenarios on a real containerd with each mesh's own installer and plugin
//! stand-ins and no interlock (what guard mode is for: without it the scenarios show the
//! failure): in each scenario a meshed pod that starts while containerd's chain lacks
//! the mesh's plugin runs with its connections uncaptured, and stays so after the entry
//! returns (nothing repairs it); a meshed pod started while the chain carries the plugin
//! is captured (the control), and an unmeshed pod is never captured. One node per mesh,
//! four scenarios on it.

use std::path::Path;
use std::time::Instant;

use interlock_contract::guard::GuardedMesh;
use interlock_mesh_standins::scenario::{self, Interlock, MeshBed, Role, Scenario};
use interlock_testkit::require_root;
use interlock_testkit_node::node::{Capture, NodeOptions};

const EXE: &str = env!("CARGO_BIN_EXE_mesh-standin");

/// Held by the Kuma tests: kuma-cni's plugin counts `/install-cni` processes host-wide, so
/// two Kuma installers at once would fail each other's pods.
static KUMA: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn without_guard_mode(mesh: GuardedMesh) {
    let begin = Instant::now();
    // No agent runs: its paths are never used.
    let options = NodeOptions::new("/nonexistent/interlock", "/nonexistent/interlock-cni");
    let mut bed = MeshBed::start(mesh, Path::new(EXE), options).expect("start the node");
    let mut failures = Vec::new();
    let mut all = Vec::new();
    for s in Scenario::ALL {
        let obs = match scenario::run(&mut bed, s, &Interlock::Without) {
            Ok(o) => o,
            Err(e) => {
                failures.push(format!("{mesh} {s:?}: {e}"));
                continue;
            }
        };
        for o in &obs {
            let ok = match o.role {
                Role::Window | Role::Plain => o.uncaptured(),
                Role::Control => o.captured(),
            };
            if !ok {
                failures.push(format!(
                    "{mesh} {s:?}: {:?} pod {} ({}): {:?}",
                    o.role, o.pod, o.when, o.outcome
                ));
            }
        }
        // The control pods carry the mesh's rules as its plugin writes them: every chain
        // of the default case with as many rules.
        let case = interlock_mesh_cases::default_case(
            interlock_mesh_standins::plugin::mesh_of(mesh.plugin_type()).expect("a mesh"),
        );
        let interlock_mesh_cases::MeshRules::Restore(want) = &case.v4 else {
            panic!("{}: IPv4 rules", case.id())
        };
        let want = scenario::rules_per_chain(want);
        assert!(want.len() >= 3, "{}: {want:?}", case.id());
        for o in obs
            .iter()
            .filter(|o| o.role == Role::Control && o.when == "at start")
        {
            let netns = o.netns.as_ref().expect("a started pod has a netns");
            let got =
                scenario::rules_per_chain(&scenario::nat_rules(netns).expect("iptables-save"));
            if got != want {
                failures.push(format!(
                    "{mesh} {s:?}: control pod {}: rules per chain {got:?}, {} writes {want:?}",
                    o.pod,
                    case.id()
                ));
            }
        }
        if mesh == GuardedMesh::Consul {
            // Silent: consul-cni marks the pods it redirected `complete`; a window pod keeps
            // the injector's `enabled`, and nothing reads either value.
            let api = bed.node.api().expect("the fake API");
            for o in obs
                .iter()
                .filter(|o| o.when == "at start" && o.role != Role::Plain)
            {
                let (ns, name) = o.pod.split_once('/').expect("namespace/name");
                let pod = api.get_object("pods", ns, name).expect("the pod object");
                let status = &pod["metadata"]["annotations"]
                    ["consul.hashicorp.com/transparent-proxy-status"];
                let want = if o.role == Role::Window {
                    "enabled"
                } else {
                    "complete"
                };
                if status != want {
                    failures.push(format!(
                        "{mesh} {s:?}: {:?} pod {}: transparent-proxy-status {status}, want {want}",
                        o.role, o.pod
                    ));
                }
            }
        }
        assert!(
            obs.iter()
                .any(|o| o.role == Role::Window && o.when == "after the entry returned"),
            "{mesh} {s:?}: the window pod was observed again after the entry returned:\n{}",
            scenario::describe(&obs)
        );
        all.extend(obs);
    }
    println!(
        "{mesh}: {} observations in {:.1} s, installer started {} times\n{}",
        all.len(),
        begin.elapsed().as_secs_f64(),
        bed.installer_starts(),
        scenario::describe(&all)
    );
    let reset = bed.reset();
    let teardown = bed.node.containerd().dir().to_path_buf();
    drop(bed);
    assert!(
        failures.is_empty(),
        "{}\n\nall:\n{}",
        failures.join("\n"),
        scenario::describe(&all)
    );
    assert!(reset.is_ok(), "{reset:?}");
    assert!(
        !teardown.exists(),
        "the kit directory {} is gone",
        teardown.display()
    );
}

#[test]
fn istio_without_guard_mode_leaves_window_pods_uncaptured() {
    require_root!();
    without_guard_mode(GuardedMesh::Istio);
}

#[test]
fn consul_without_guard_mode_leaves_window_pods_uncaptured() {
    require_root!();
    without_guard_mode(GuardedMesh::Consul);
}

#[test]
fn linkerd_without_guard_mode_leaves_window_pods_uncaptured() {
    require_root!();
    without_guard_mode(GuardedMesh::Linkerd);
}

#[test]
fn kuma_without_guard_mode_leaves_window_pods_uncaptured() {
    require_root!();
    let _one = KUMA.lock().unwrap_or_else(|e| e.into_inner());
    without_guard_mode(GuardedMesh::Kuma);
}

/// kuma-cni's installer killed without its cleanup (OOM, node pressure): its entry and
/// binary stay, and the plugin fails every ADD, unmeshed pods' too (the kuma CNI pod's own,
/// which is not hostNetwork), until an installer runs again.
#[test]
fn kuma_installer_killed_without_cleanup_refuses_every_pod() {
    require_root!();
    let _one = KUMA.lock().unwrap_or_else(|e| e.into_inner());
    let options = NodeOptions::new("/nonexistent/interlock", "/nonexistent/interlock-cni");
    let mut bed =
        MeshBed::start(GuardedMesh::Kuma, Path::new(EXE), options).expect("start the node");
    bed.node.write_primary().expect("write the primary");
    bed.start_installer().expect("start the installer");
    bed.wait_chain(true).expect("kuma-cni loaded");
    let control = bed
        .run_pod("control", true)
        .expect("a pod on the right chain");
    assert_eq!(bed.capture(&control), Capture::Redirected);
    bed.kill_installer();
    assert!(
        bed.node.bin_dir().join("kuma-cni").exists(),
        "the binary stays"
    );
    for meshed in [true, false] {
        match bed.run_pod("refused", meshed) {
            Err(e) => assert!(e.contains("/install-cni"), "meshed {meshed}: {e}"),
            Ok(sb) => panic!(
                "meshed {meshed}: {} started with no installer running",
                sb.name
            ),
        }
    }
    bed.start_installer().expect("restart the installer");
    let after = bed
        .run_pod("after", true)
        .expect("a pod once an installer runs");
    assert_eq!(bed.capture(&after), Capture::Redirected);
    bed.reset().expect("reset");
}

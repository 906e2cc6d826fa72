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
use interlock_testkit_node::node::NodeOptions;

const EXE: &str = env!("CARGO_BIN_EXE_mesh-standin");

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
    without_guard_mode(GuardedMesh::Kuma);
}

//! The plugin as it ships (`make plugin-static`: static glibc, its own start-up from
//! `crates/plugin/start/lean_start.c`, the hot-text order) protects pods like the build
//! every other test runs: the bench drives it through ADDs with every backend and for an
//! unmeshed pod, reads the rules back after them, and DELs every attachment. The start-up
//! skips glibc's CPU identification, so the string functions run their baseline variants:
//! this is where a mistake in that start-up would show (TLS, guards, IFUNCs, initialisers).

use std::path::PathBuf;
use std::process::Command;

use interlock_bench::run::{run, Plan};
use interlock_bench::{Bench, Scenario};
use interlock_redirect::BackendKind;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Builds the shipped plugin with the script `make plugin-static` runs; its path.
fn shipped_plugin() -> PathBuf {
    let triple = "x86_64-unknown-linux-gnu";
    let target_dir = repo().join("target/static");
    let status = Command::new(repo().join("scripts/plugin-static.sh"))
        .arg(triple)
        .arg(&target_dir)
        .arg("--quiet")
        .env("CARGO", env!("CARGO"))
        .status()
        .expect("running scripts/plugin-static.sh");
    assert!(status.success(), "building the shipped plugin failed");
    target_dir.join(triple).join("plugin/interlock-cni")
}

#[test]
fn the_shipped_plugin_protects_pods_with_every_backend() {
    interlock_testkit::require_root!();
    let plugin = shipped_plugin();
    let bench = Bench::new(&plugin).unwrap_or_else(|e| panic!("{e}"));
    let mut scenarios: Vec<Scenario> = BackendKind::ALL.map(Scenario::AddMeshed).to_vec();
    scenarios.extend([
        Scenario::AddMeshedAgentNote,
        Scenario::AddUnmeshed,
        Scenario::LeanFloor,
    ]);
    let plan = Plan {
        samples: 4,
        per_rule_samples: 0,
        rounds: 2,
        scenarios,
        warmup: true,
    };
    let collected = run(&bench, &plan, &mut |_| {}).unwrap_or_else(|e| panic!("{e}"));
    for kind in BackendKind::ALL {
        let w = collected.wiring_of(kind);
        assert!(
            w.wired() && w.exact == w.checked,
            "the shipped plugin's ADD with {kind} did not leave exactly the expected rules: {w:?}"
        );
        let meshed = collected.of(Scenario::AddMeshed(kind));
        assert!(
            meshed.len() == 4 && meshed.iter().all(|s| s.protect.is_some()),
            "{kind}: a meshed sample has no protection recorded by the plugin: {meshed:?}"
        );
    }
    assert_eq!(collected.of(Scenario::AddUnmeshed).len(), 4);
    assert_eq!(collected.of(Scenario::LeanFloor).len(), 4);
    assert!(
        collected.notes.is_empty(),
        "the run noted problems: {:?}",
        collected.notes
    );
    // Every ADD was DELed by the shipped plugin itself.
    assert_eq!(bench.release_attachments().unwrap(), 0);
}

//! The plugin as it ships (`make plugin-static`: static glibc, its own start-up from
//! `crates/lean-start`, the hot-text order) protects pods like the build every other test
//! runs, and so does the same build with glibc's own start-up (the fallback a glibc the
//! lean start-up was not checked against gets). For each: `--self-check` says which
//! start-up ran and that its invariants hold (TLS, guards, IRELATIVE slots, RELRO,
//! clocks), then the bench drives it through ADDs with every backend and for an unmeshed
//! pod, reads the rules back after them, and DELs every attachment. The lean start-up
//! skips glibc's CPU identification, so the string functions run their baseline variants:
//! this is where a mistake in that start-up would show.

use std::path::{Path, PathBuf};
use std::process::Command;

use interlock_bench::run::{run, Plan};
use interlock_bench::{Bench, Scenario};
use interlock_redirect::BackendKind;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Builds the plugin with the script `make plugin-static` runs, with `features` instead of
/// the shipped ones when given, into `target/<dir>`; its path.
fn static_plugin(dir: &str, features: Option<&str>) -> PathBuf {
    let triple = "x86_64-unknown-linux-gnu";
    let target_dir = repo().join("target").join(dir);
    let mut cmd = Command::new(repo().join("scripts/plugin-static.sh"));
    cmd.arg(triple)
        .arg(&target_dir)
        .arg("--quiet")
        .env("CARGO", env!("CARGO"));
    if let Some(f) = features {
        cmd.env("INTERLOCK_PLUGIN_FEATURES", f);
    }
    let status = cmd.status().expect("running scripts/plugin-static.sh");
    assert!(status.success(), "building the static plugin failed");
    target_dir.join(triple).join("plugin/interlock-cni")
}

/// `--self-check` must pass; its report.
fn self_check(plugin: &Path) -> String {
    let out = Command::new(plugin)
        .arg("--self-check")
        .output()
        .expect("running --self-check");
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && report.ends_with("PASS\n"),
        "{} --self-check failed:\n{report}{}",
        plugin.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    for check in interlock_lean_start::CHECKS {
        assert!(
            report
                .lines()
                .any(|l| l.starts_with("ok") && l.contains(check)),
            "no passing {check} check:\n{report}"
        );
    }
    assert!(
        report.contains("IRELATIVE slots hold what their resolver returns"),
        "a static build has IRELATIVE slots to check:\n{report}"
    );
    report
}

/// ADDs with every backend and for an unmeshed pod, the rules read back, every attachment
/// DELed by the plugin itself.
fn protects_pods(plugin: &Path, lean_floor: bool) {
    let bench = Bench::new(plugin).unwrap_or_else(|e| panic!("{e}"));
    let mut scenarios: Vec<Scenario> = BackendKind::ALL.map(Scenario::AddMeshed).to_vec();
    scenarios.extend([
        Scenario::AddGeneric(false),
        Scenario::AddGeneric(true),
        Scenario::AddUnmeshed,
    ]);
    if lean_floor {
        scenarios.push(Scenario::LeanFloor);
    }
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
            "the plugin's ADD with {kind} did not leave exactly the expected rules: {w:?}"
        );
        let meshed = collected.of(Scenario::AddMeshed(kind));
        assert!(
            meshed.len() == 4 && meshed.iter().all(|s| s.protect.is_some()),
            "{kind}: a meshed sample has no protection recorded by the plugin: {meshed:?}"
        );
    }
    assert_eq!(collected.of(Scenario::AddUnmeshed).len(), 4);
    if lean_floor {
        assert_eq!(collected.of(Scenario::LeanFloor).len(), 4);
    }
    assert!(
        collected.notes.is_empty(),
        "the run noted problems: {:?}",
        collected.notes
    );
    // Every ADD was DELed by the plugin itself.
    assert_eq!(bench.release_attachments().unwrap(), 0);
}

#[test]
fn the_shipped_plugin_protects_pods_with_every_backend() {
    let plugin = static_plugin("static", None);
    let report = self_check(&plugin);
    assert!(
        report.contains("build: lean start-up, checked against")
            && report.contains("interlock's lean start-up ran"),
        "the shipped build must run the lean start-up on the pinned glibc (if this machine's \
         glibc changed, see crates/lean-start/glibc.pin):\n{report}"
    );
    interlock_testkit::require_root!();
    protects_pods(&plugin, true);
}

#[test]
fn the_plugin_with_glibcs_own_start_up_protects_pods_too() {
    let plugin = static_plugin("static-glibc-start", Some("soft-sha256"));
    let report = self_check(&plugin);
    assert!(
        report.contains("build: glibc's own start-up")
            && report.contains("glibc's own start-up ran"),
        "{report}"
    );
    interlock_testkit::require_root!();
    protects_pods(&plugin, false);
}

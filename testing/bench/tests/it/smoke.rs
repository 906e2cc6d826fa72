//! Smoke test of the `interlock-bench` command: a `--quick` run prints one JSON document
//! with every scenario, positive and ordered statistics, ratios and budget verdicts.

use std::os::unix::process::CommandExt;
use std::process::Command;

use interlock_bench::report::TOP_LEVEL_KEYS;
use interlock_bench::Scenario;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_interlock-bench");

fn plugin() -> std::path::PathBuf {
    interlock_bench::plugin_or_build().unwrap_or_else(|e| panic!("{e}"))
}

fn positive(v: &Value, what: &str) -> f64 {
    let x = v
        .as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number: {v}"));
    assert!(x > 0.0, "{what} is not positive: {x}");
    x
}

#[test]
fn quick_run_prints_every_key_with_positive_numbers() {
    interlock_testkit::require_root!();
    let out = Command::new(BIN)
        .arg("--quick")
        .arg("--plugin")
        .arg(plugin())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "interlock-bench --quick failed: {stderr}"
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let doc: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {stdout}"));

    for key in TOP_LEVEL_KEYS {
        assert!(doc.get(key).is_some(), "missing top-level key {key}: {doc}");
    }
    assert!(doc["wired"].is_boolean());
    // Every sample ran the installed copy, never the file it was given.
    let given = plugin();
    assert_eq!(doc["plugin"], given.display().to_string());
    let installed = doc["plugin_installed"]["path"].as_str().unwrap_or_default();
    assert!(
        !installed.is_empty() && std::path::Path::new(installed) != given,
        "the bench ran the given file, not an installed copy: {}",
        doc["plugin_installed"]
    );
    positive(&doc["rule_set"]["rules_per_family"], "rules_per_family");
    positive(
        &doc["rule_set"]["iptables_calls_per_sample"],
        "iptables_calls_per_sample",
    );
    assert_eq!(
        doc["rule_set"]["families"],
        serde_json::json!(["ipv4", "ipv6"])
    );

    let results = &doc["results"];
    for s in Scenario::all() {
        let r = &results[s.key()];
        assert!(r.is_object(), "missing result {}: {results}", s.key());
        let n = r["samples"].as_u64().unwrap_or(0);
        assert!(n > 0, "{}: no samples", s.key());
        let min = positive(&r["min_us"], "min_us");
        let med = positive(&r["median_us"], "median_us");
        let p90 = positive(&r["p90_us"], "p90_us");
        let p99 = positive(&r["p99_us"], "p99_us");
        let max = positive(&r["max_us"], "max_us");
        assert!(
            min <= med && med <= p90 && p90 <= p99 && p99 <= max,
            "{}: statistics out of order: {r}",
            s.key()
        );
        match s {
            Scenario::AddMeshed(_) => {
                assert!(r["wired"].is_boolean(), "{}: {r}", s.key());
                assert!(r["wiring_checks"].as_u64().unwrap_or(0) > 0, "{r}");
                if r["wired"].as_bool().unwrap() {
                    // The plugin's own account of the ADD, read from its state.
                    for k in [
                        "plugin_reported_add_median_us",
                        "plugin_reported_protect_median_us",
                        "plugin_reported_apply_verify_median_us",
                        "plugin_reported_probe_median_us",
                    ] {
                        positive(&r[k], &format!("{}.{k}", s.key()));
                    }
                    assert_eq!(
                        r["rules_exact_after"],
                        r["wiring_checks"],
                        "{}: the plugin's rules are not the bench rule set: {doc}",
                        s.key()
                    );
                    // The istio pod's ADD cannot succeed without its spec lookup, and
                    // the lookup carried the note.
                    assert_eq!(
                        r["notes_taken"],
                        r["wiring_checks"],
                        "{}: a meshed ADD's lookup was not its note: {r}",
                        s.key()
                    );
                }
            }
            Scenario::AddGeneric(false) => {
                positive(
                    &r["plugin_reported_add_median_us"],
                    "add_generic_nftables.plugin_reported_add_median_us",
                );
                assert!(r.get("notes_checked").is_none(), "{r}");
            }
            Scenario::AddGeneric(true) => {
                // The plugin's own account is there as for any meshed ADD; the notes are
                // counted (a missed one is in the run's notes).
                positive(
                    &r["plugin_reported_add_median_us"],
                    "add_generic_nftables_agent_note.plugin_reported_add_median_us",
                );
                assert!(r["notes_checked"].as_u64().unwrap_or(0) > 0, "{r}");
                assert!(r["notes_taken"].as_u64().is_some(), "{r}");
                assert!(
                    doc["derived"]["agent_note_cost"]["median_us"].is_number(),
                    "no agent note cost: {}",
                    doc["derived"]
                );
            }
            Scenario::Engine(_) => {
                positive(&r["apply_verify_median_us"], "apply_verify_median_us");
                positive(&r["probe_median_us"], "probe_median_us");
            }
            _ => {}
        }
    }

    // Every baseline against every meshed path.
    let baselines: Vec<Scenario> = Scenario::all()
        .into_iter()
        .filter(|s| {
            matches!(
                s,
                Scenario::RestorePerFamily(_) | Scenario::PerRule(_) | Scenario::IstioStandIn
            )
        })
        .collect();
    let meshed: Vec<Scenario> = Scenario::all()
        .into_iter()
        .filter(|s| matches!(s, Scenario::AddMeshed(_) | Scenario::Engine(_)))
        .collect();
    for b in &baselines {
        for m in &meshed {
            positive(
                &doc["ratios"][b.key()][m.key()],
                &format!("ratio {} / {}", b.key(), m.key()),
            );
        }
    }

    // Budget verdicts: booleans, or null exactly for a meshed ADD that applied no rules.
    let budgets = &doc["budgets"];
    for name in [
        "meshed_add_median_le_2ms",
        "restore_per_family_ratio_ge_5x",
        "per_rule_ratio_ge_20x",
    ] {
        let by = budgets[name]["by_subject"]
            .as_object()
            .unwrap_or_else(|| panic!("budgets.{name}.by_subject missing: {budgets}"));
        for m in &meshed {
            let v = &by[&m.key()];
            let met = &v["met"];
            match m {
                Scenario::AddMeshed(_) if !results[m.key()]["wired"].as_bool().unwrap() => {
                    assert!(met.is_null(), "{name}/{}: {v}", m.key())
                }
                _ => assert!(met.is_boolean(), "{name}/{}: {v}", m.key()),
            }
        }
        let primary = &by["add_meshed_nftables"]["met"];
        assert_eq!(&budgets[name]["met"], primary, "{name}");
    }
    assert!(budgets["unmeshed_add_median_le_0_5ms"]["met"].is_boolean());
    positive(
        &budgets["unmeshed_add_median_le_0_5ms"]["median_us"],
        "unmeshed median",
    );

    let derived = &doc["derived"];
    assert!(
        derived["add_unmeshed_minus_spawn_floor_us"].is_number(),
        "{derived}"
    );
    // The restore budget is against istio-cni's way in full; the stand-in runs the same
    // restores as the restores-alone baseline plus a process of its own, so it costs more.
    assert_eq!(
        budgets["restore_per_family_ratio_ge_5x"]["baseline"],
        Scenario::IstioStandIn.key()
    );
    positive(
        &budgets["restore_per_family_ratio_ge_5x"]["restores_alone"]["primary"]["ratio"],
        "restores-alone ratio",
    );
    let both = &derived["restore_baseline_both_ways"];
    positive(&both["with_cni_exec_us"], "stand-in median");
    positive(&both["restores_alone_us"], "restores-alone median");
    // Which is larger is a measurement (a few samples on a loaded machine can order them
    // either way); that each figure comes from the scenario it names is not.
    let how = both["how"].as_str().unwrap_or_default();
    assert!(
        how.contains(Scenario::IstioStandIn.key().as_str())
            && how.contains("iptables_restore_per_family_nft"),
        "{both}"
    );
    if !budgets["subject_wired"].as_bool().unwrap() {
        let est = &derived["estimated_wired_add_meshed_nftables"];
        positive(&est["median_us"], "estimated wired ADD");
        positive(
            &est["ratio_iptables_restore_per_family_nft"],
            "estimated restore ratio",
        );
    }
}

#[test]
fn refuses_to_run_without_root() {
    interlock_testkit::require_root!();
    // Run it as nobody (needs root to switch).
    let out = match Command::new(BIN)
        .arg("--quick")
        .uid(65534)
        .gid(65534)
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            eprintln!("SKIP: cannot run {BIN} as nobody ({e})");
            return;
        }
    };
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("needs root"), "{stderr}");
    assert!(out.stdout.is_empty(), "no JSON without root");
}

/// The copy the bench runs is installed the way the agent installs the plugin: the same
/// bytes, executable, in a directory of its own beside the given file (the same disk), and
/// a new file rather than a link to the linker's output (see `install_plugin`). It goes
/// with the bench's directory.
#[test]
fn the_plugin_is_run_from_a_copy_installed_beside_it() {
    let given = plugin();
    let (dir, installed) = interlock_bench::install_plugin(&given).unwrap();
    assert_eq!(
        dir.path().parent(),
        given.parent(),
        "not beside {}",
        given.display()
    );
    assert_eq!(installed, dir.path().join("interlock-cni"));
    assert_eq!(
        std::fs::read(&installed).unwrap(),
        std::fs::read(&given).unwrap(),
        "the installed copy differs from {}",
        given.display()
    );
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let (a, b) = (
        std::fs::metadata(&installed).unwrap(),
        std::fs::metadata(&given).unwrap(),
    );
    assert_ne!(
        a.ino(),
        b.ino(),
        "the copy is a hard link to the given file"
    );
    assert_eq!(a.permissions().mode() & 0o777, 0o755);
    let kept = dir.path().to_path_buf();
    drop(dir);
    assert!(!kept.exists(), "{} outlived the bench", kept.display());
}

/// `interlock-bench sandbox --quick` on real containerd: one JSON document in which every
/// way's sandbox starts, DELs and burst were measured, and every budget has a figure and
/// a verdict (which way it goes is the bench's to say, not this test's).
#[test]
fn sandbox_quick_run_measures_every_way_and_judges_every_budget() {
    interlock_testkit::require_root!();
    let interlock = std::path::Path::new(BIN).with_file_name("interlock");
    let plugin = interlock.with_file_name("interlock-cni");
    if !interlock.is_file() || !plugin.is_file() {
        assert!(
            !interlock_testkit::in_ci(),
            "{} or {} missing: `make test` builds them first",
            interlock.display(),
            plugin.display()
        );
        eprintln!("SKIP: build the binaries first (`cargo build --workspace --bins`)");
        return;
    }
    let out = Command::new(BIN)
        .args(["sandbox", "--quick"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "interlock-bench sandbox --quick failed: {stderr}"
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let doc: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {stdout}"));
    for way in interlock_bench::sandbox::WAYS {
        let w = &doc["ways"][way];
        positive(
            &w["meshed_start_ms"]["p50_ms"],
            &format!("{way} meshed start"),
        );
        positive(&w["del_ms"]["p50_ms"], &format!("{way} DEL"));
        positive(
            &w["bursts"]["4"]["pods_per_s_median"],
            &format!("{way} burst rate"),
        );
        // Unmeshed starts only where they can differ from meshed ones.
        if way == "primary" || way == "interlock" {
            positive(
                &w["unmeshed_start_ms"]["p50_ms"],
                &format!("{way} unmeshed start"),
            );
        }
    }
    // The plugin's own ADD time, read from its records: only where it runs.
    positive(
        &doc["ways"]["interlock"]["plugin_own_add_ms"]["p50_ms"],
        "interlock-cni's own ADD",
    );
    assert!(
        doc["ways"]["primary"]["plugin_own_add_ms"].is_null(),
        "{doc}"
    );
    let budgets = doc["budgets"].as_array().expect("budgets");
    assert_eq!(budgets.len(), 3, "{doc}");
    for b in budgets {
        assert!(b["figure"].is_number(), "a budget without its figure: {b}");
        assert!(b["pass"].is_boolean(), "a budget without a verdict: {b}");
    }
    // The chained no-op's figures next to the budgets, and the breakdown of interlock's
    // difference (the agent's reaction only with `interlock_no_note`, not run here).
    let reference = doc["reference"].as_array().expect("reference");
    assert_eq!(reference.len(), 4, "{doc}");
    for r in reference {
        assert!(
            r["figure"].is_number(),
            "a reference without its figure: {r}"
        );
    }
    let breakdown = &doc["breakdown"];
    for part in ["total_ms", "chaining_any_plugin_ms", "rest_ms"] {
        assert!(breakdown[part].is_number(), "no {part}: {breakdown}");
    }
    positive(&breakdown["plugin_own_add_ms"], "the breakdown's own ADD");
    assert!(
        breakdown["agent_reaction_to_the_note_ms"].is_null(),
        "{breakdown}"
    );
}

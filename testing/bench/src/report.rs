//! The JSON document `interlock-bench` prints: per-scenario statistics, ratios of the
//! baselines to interlock, and the design's budget verdicts, all computed from one run.
//!
//! Budgets (docs/performance.md, "Budgets"): meshed plugin ADD median ≤ 2 ms including
//! the proof, ≥ 5× faster than istio-cni's way (a CNI plugin process running one
//! `iptables-restore` per family in the pod netns, each side paying its process start:
//! [`Scenario::IstioStandIn`]; the restores alone are reported next to it), ≥ 20× faster
//! than one `iptables` call per rule; unmeshed plugin ADD median ≤ 0.5 ms. The primary subject is
//! `add_meshed_nftables` (the plugin binary with the in-process netlink backend); every
//! other meshed path gets its verdicts too. A meshed ADD that did not install rules
//! (`wired: false`) gets `null` verdicts: its numbers measure a pass-through.

use std::time::Duration;

use interlock_redirect::backend::iptables::Flavour;
use interlock_redirect::spec::Family;
use interlock_redirect::BackendKind;
use serde_json::{json, Map, Value};

use crate::run::{Collected, Plan};
use crate::stats::Summary;
use crate::{Bench, Scenario};

/// Meshed ADD median budget (µs).
pub const MESHED_ADD_LIMIT_US: f64 = 2000.0;
/// Unmeshed ADD median budget (µs).
pub const UNMESHED_ADD_LIMIT_US: f64 = 500.0;
/// Minimum speed-up over one `iptables-restore` per family.
pub const RESTORE_RATIO_MIN: f64 = 5.0;
/// Minimum speed-up over one `iptables` call per rule.
pub const PER_RULE_RATIO_MIN: f64 = 20.0;
/// Budget: a meshed ADD within this much of the static exec floor (µs).
pub const MESHED_OVER_FLOOR_GOAL_US: f64 = 300.0;
/// Budget: an unmeshed ADD within this much of the static exec floor (µs).
pub const UNMESHED_OVER_FLOOR_LIMIT_US: f64 = 100.0;

/// Every top-level key of the document.
pub const TOP_LEVEL_KEYS: [&str; 21] = [
    "tool",
    "version",
    "unit",
    "build",
    "plugin",
    "plugin_installed",
    "state_dir",
    "host",
    "loadavg_start",
    "rule_set",
    "plan",
    "scenarios",
    "wired",
    "wired_by_backend",
    "results",
    "ratios",
    "budgets",
    "derived",
    "concurrency",
    "notes",
    "duration_s",
];

/// The budget subject: the plugin binary with the in-process nftables backend.
pub const PRIMARY_SUBJECT: Scenario = Scenario::AddMeshed(BackendKind::Nftables);

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn summary(c: &Collected, s: Scenario) -> Option<Summary> {
    let v: Vec<Duration> = c.of(s).iter().map(|x| x.total).collect();
    Summary::of(&v)
}

fn median_of(c: &Collected, s: Scenario) -> Option<f64> {
    summary(c, s).map(|x| x.median_us)
}

/// True when `s`'s numbers measure what they claim (a meshed ADD that installed rules).
fn valid(c: &Collected, s: Scenario) -> bool {
    match s {
        Scenario::AddMeshed(k) => c.wiring_of(k).wired(),
        _ => true,
    }
}

fn meshed_subjects(c: &Collected) -> Vec<Scenario> {
    c.samples
        .iter()
        .map(|(s, _)| *s)
        .filter(|s| matches!(s, Scenario::AddMeshed(_) | Scenario::Engine(_)))
        .collect()
}

fn baseline(f: Flavour, per_rule: bool) -> Scenario {
    if per_rule {
        Scenario::PerRule(f)
    } else {
        Scenario::RestorePerFamily(f)
    }
}

/// Every baseline the meshed paths are compared with.
fn baselines() -> Vec<Scenario> {
    let mut v: Vec<Scenario> = [Flavour::Nft, Flavour::Legacy]
        .into_iter()
        .flat_map(|f| [baseline(f, false), baseline(f, true)])
        .collect();
    v.push(Scenario::IstioStandIn);
    v
}

/// A "median ≤ limit" verdict for each subject.
fn le_verdict(c: &Collected, subjects: &[Scenario], limit_us: f64) -> Value {
    let mut by = Map::new();
    for &s in subjects {
        let Some(m) = median_of(c, s) else { continue };
        let met = valid(c, s).then_some(m <= limit_us);
        by.insert(s.key(), json!({ "median_us": round2(m), "met": met }));
    }
    Value::Object(by)
}

/// A "baseline median / subject median ≥ min" verdict for each subject.
fn ratio_verdict(c: &Collected, subjects: &[Scenario], base: Scenario, min: f64) -> Value {
    let mut by = Map::new();
    let Some(b) = median_of(c, base) else {
        return Value::Object(by);
    };
    for &s in subjects {
        let Some(m) = median_of(c, s) else { continue };
        if m <= 0.0 {
            continue;
        }
        let ratio = b / m;
        let met = valid(c, s).then_some(ratio >= min);
        by.insert(s.key(), json!({ "ratio": round2(ratio), "met": met }));
    }
    Value::Object(by)
}

fn primary_of(by: &Value, key: &str) -> Value {
    by.get(key).cloned().unwrap_or(Value::Null)
}

fn dedup(notes: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for n in notes {
        if !out.contains(n) {
            out.push(n.clone());
        }
    }
    out
}

fn host_info() -> Value {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    // Field 19 of /proc/self/stat (after the parenthesised command name) is the niceness.
    let stat = read("/proc/self/stat");
    let nice = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(16))
        .and_then(|n| n.parse::<i64>().ok());
    json!({
        "kernel": read("/proc/sys/kernel/osrelease"),
        "nice": nice,
        "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "loadavg": read("/proc/loadavg"),
    })
}

/// The JSON document for a finished run. `loadavg_start` is `/proc/loadavg` before it.
pub fn report(
    bench: &Bench,
    plan: &Plan,
    c: &Collected,
    loadavg_start: &str,
    concurrency: Value,
) -> Value {
    let subjects = meshed_subjects(c);
    let results = results(c);
    let ratios = ratios(c, &subjects);
    let budgets = budgets(c, &subjects);
    let derived = derived(c);
    let wired_by: Map<String, Value> = BackendKind::ALL
        .into_iter()
        .filter(|k| c.wiring_of(*k).checked > 0)
        .map(|k| (k.as_str().to_string(), c.wiring_of(k).wired().into()))
        .collect();
    let wired = !wired_by.is_empty() && wired_by.values().all(|v| v == &Value::Bool(true));
    let spec = bench.spec();
    json!({
        "tool": "interlock-bench",
        "version": env!("CARGO_PKG_VERSION"),
        "unit": "microseconds",
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
        "plugin": bench.plugin_source().display().to_string(),
        "plugin_installed": {
            "path": bench.plugin().display().to_string(),
            "how": "installed by the agent's installer (write, rename, VERSION check) next to the given file; every sample runs this copy, not the linker's output (see interlock_bench::install_plugin)",
        },
        "state_dir": bench.state_dir().display().to_string(),
        "host": host_info(),
        "loadavg_start": loadavg_start,
        "rule_set": {
            "profile": "istio",
            "families": spec.families().iter().map(|f| match f { Family::V4 => "ipv4", Family::V6 => "ipv6" }).collect::<Vec<_>>(),
            "rules_per_family": bench.rules_per_family(),
            "restore_calls_per_sample": spec.families().len(),
            "iptables_calls_per_sample": bench.per_rule_calls(),
            "spec_hash": spec.hash(),
        },
        "plan": {
            "samples": plan.samples,
            "per_rule_samples": plan.per_rule_samples,
            "rounds": plan.rounds,
            "warmup": plan.warmup,
        },
        "scenarios": c.samples.iter().map(|(s, _)| (s.key(), Value::from(s.describe()))).collect::<Map<String, Value>>(),
        "wired": wired,
        "wired_by_backend": wired_by,
        "results": results,
        "ratios": ratios,
        "budgets": budgets,
        "derived": derived,
        "concurrency": concurrency,
        "notes": dedup(&c.notes),
        "duration_s": round2(c.elapsed.as_secs_f64()),
    })
}

/// The baselines of the restore and per-rule budgets. The restore budget's baseline is
/// istio-cni's way in full (its process start included, as the plugin's is); the restores
/// alone are the conservative reading.
struct BudgetBaselines {
    restore: Scenario,
    restores_alone: Scenario,
    per_rule: Scenario,
}

impl BudgetBaselines {
    fn get() -> BudgetBaselines {
        BudgetBaselines {
            restore: Scenario::IstioStandIn,
            restores_alone: baseline(Flavour::Nft, false),
            per_rule: baseline(Flavour::Nft, true),
        }
    }
}

/// Per-scenario statistics, with each kind's own medians.
fn results(c: &Collected) -> Map<String, Value> {
    let mut results = Map::new();
    for (s, samples) in &c.samples {
        let Some(sum) = summary(c, *s) else { continue };
        let mut v = sum.to_json();
        let obj = v.as_object_mut().expect("object");
        scenario_medians(c, *s, samples, obj);
        results.insert(s.key(), v);
    }
    results
}

/// The medians that only some scenarios have (the plugin's own clock, the engine's
/// steps), and what a meshed ADD's checks saw.
fn scenario_medians(
    c: &Collected,
    s: Scenario,
    samples: &[crate::Sample],
    obj: &mut Map<String, Value>,
) {
    let med = |f: fn(&crate::Sample) -> Option<Duration>| {
        let v: Vec<Duration> = samples.iter().filter_map(f).collect();
        Summary::of(&v).map(|x| (x.median_us * 10.0).round() / 10.0)
    };
    // Plugin ADD: the part outside the plugin's own clock (exec, loading, exit, pipes).
    let outside: Vec<Duration> = samples
        .iter()
        .filter_map(|x| x.inside.map(|i| x.total.saturating_sub(i)))
        .collect();
    let outside = Summary::of(&outside).map(|x| (x.median_us * 10.0).round() / 10.0);
    let notes = |obj: &mut Map<String, Value>| {
        if let Some(n) = c.agent_notes.get(&s.key()) {
            obj.insert("notes_checked".into(), n.checked.into());
            obj.insert("notes_taken".into(), n.taken.into());
        }
    };
    match s {
        Scenario::AddMeshed(k) => {
            let w = c.wiring_of(k);
            obj.insert("wired".into(), w.wired().into());
            obj.insert("wiring_checks".into(), w.checked.into());
            obj.insert("rules_visible_after".into(), w.visible.into());
            obj.insert("rules_exact_after".into(), w.exact.into());
            notes(obj);
            obj.insert(
                "plugin_reported_add_median_us".into(),
                med(|x| x.inside).into(),
            );
            obj.insert(
                "plugin_reported_protect_median_us".into(),
                med(|x| x.protect).into(),
            );
            obj.insert(
                "plugin_reported_apply_verify_median_us".into(),
                med(|x| x.rules).into(),
            );
            obj.insert(
                "plugin_reported_probe_median_us".into(),
                med(|x| x.probe).into(),
            );
            obj.insert("outside_plugin_clock_median_us".into(), outside.into());
        }
        Scenario::AddGeneric(_) => {
            notes(obj);
            obj.insert(
                "plugin_reported_add_median_us".into(),
                med(|x| x.inside).into(),
            );
            obj.insert("outside_plugin_clock_median_us".into(), outside.into());
        }
        Scenario::AddUnmeshed => {
            obj.insert(
                "plugin_reported_add_median_us".into(),
                med(|x| x.inside).into(),
            );
            obj.insert("outside_plugin_clock_median_us".into(), outside.into());
        }
        Scenario::Engine(_) => {
            obj.insert("apply_verify_median_us".into(), med(|x| x.rules).into());
            obj.insert("probe_median_us".into(), med(|x| x.probe).into());
        }
        _ => {}
    }
}

/// Ratios: every baseline against every meshed path.
fn ratios(c: &Collected, subjects: &[Scenario]) -> Map<String, Value> {
    let mut ratios = Map::new();
    for base in baselines() {
        let Some(b) = median_of(c, base) else {
            continue;
        };
        let mut by = Map::new();
        for &s in subjects {
            if let Some(m) = median_of(c, s).filter(|m| *m > 0.0) {
                by.insert(s.key(), round2(b / m).into());
            }
        }
        ratios.insert(base.key(), Value::Object(by));
    }
    ratios
}

/// Budget verdicts.
fn budgets(c: &Collected, subjects: &[Scenario]) -> Value {
    let primary = PRIMARY_SUBJECT.key();
    let meshed = le_verdict(c, subjects, MESHED_ADD_LIMIT_US);
    let unmeshed = le_verdict(c, &[Scenario::AddUnmeshed], UNMESHED_ADD_LIMIT_US);
    let bases = BudgetBaselines::get();
    let restore = ratio_verdict(c, subjects, bases.restore, RESTORE_RATIO_MIN);
    let alone = ratio_verdict(c, subjects, bases.restores_alone, RESTORE_RATIO_MIN);
    let per_rule = ratio_verdict(c, subjects, bases.per_rule, PER_RULE_RATIO_MIN);
    let met = |v: &Value| v.get("met").cloned().unwrap_or(Value::Null);
    json!({
        "subject": primary,
        "subject_wired": valid(c, PRIMARY_SUBJECT),
        "meshed_add_median_le_2ms": {
            "limit_us": MESHED_ADD_LIMIT_US,
            "met": met(&primary_of(&meshed, &primary)),
            "by_subject": meshed,
        },
        "unmeshed_add_median_le_0_5ms": {
            "limit_us": UNMESHED_ADD_LIMIT_US,
            "met": met(&primary_of(&unmeshed, &Scenario::AddUnmeshed.key())),
            "median_us": primary_of(&unmeshed, &Scenario::AddUnmeshed.key()).get("median_us").cloned().unwrap_or(Value::Null),
        },
        "restore_per_family_ratio_ge_5x": {
            "baseline": bases.restore.key(),
            "min_ratio": RESTORE_RATIO_MIN,
            "met": met(&primary_of(&restore, &primary)),
            "by_subject": restore,
            "restores_alone": {
                "baseline": bases.restores_alone.key(),
                "how": "the two restores alone, run from a thread already inside the pod netns: no CNI process start on istio's side while the plugin's is counted (conservative)",
                "primary": primary_of(&alone, &primary),
            },
        },
        "per_rule_ratio_ge_20x": {
            "baseline": bases.per_rule.key(),
            "min_ratio": PER_RULE_RATIO_MIN,
            "met": met(&primary_of(&per_rule, &primary)),
            "by_subject": per_rule,
        },
    })
}

/// Derived numbers that help reading the budgets.
fn derived(c: &Collected) -> Map<String, Value> {
    let floor = median_of(c, Scenario::SpawnFloor);
    let unmeshed_med = median_of(c, Scenario::AddUnmeshed);
    let mut derived = Map::new();
    if let (Some(u), Some(f)) = (unmeshed_med, floor) {
        derived.insert(
            "add_unmeshed_minus_spawn_floor_us".into(),
            round2(u - f).into(),
        );
    }
    // Against the static no-op floor (the one the budgets mean).
    if let Some(f) = median_of(c, Scenario::StaticFloor) {
        over_static_floor(c, f, &mut derived);
    }
    if let Some(lean) = over_lean_floor(c) {
        derived.insert("over_lean_start_floor".into(), lean);
    }
    // What one round trip to a live agent socket adds to a meshed ADD (same run, same
    // backend, same rules).
    if let (Some(n), Some(m)) = (
        summary(c, Scenario::AddGeneric(true)),
        summary(c, Scenario::AddGeneric(false)),
    ) {
        derived.insert(
            "agent_note_cost".into(),
            json!({
                "median_us": round2(n.median_us - m.median_us),
                "p99_us": round2(n.p99_us - m.p99_us),
                "how": "add_generic_nftables_agent_note minus add_generic_nftables (median; p99): one round trip to a live agent socket, answered; an istio or linkerd pod's ADD pays it once, its spec lookup carrying the note",
            }),
        );
    }
    if !valid(c, PRIMARY_SUBJECT) {
        if let Some(est) = estimated_wired_add(c) {
            derived.insert("estimated_wired_add_meshed_nftables".into(), est);
        }
    }
    derived
}

/// The figures against the static no-op floor `f` (the one the budgets mean).
fn over_static_floor(c: &Collected, f: f64, derived: &mut Map<String, Value>) {
    if let Some(u) = median_of(c, Scenario::AddUnmeshed) {
        derived.insert(
            "add_unmeshed_over_static_floor".into(),
            json!({"us": round2(u - f), "limit_us": UNMESHED_OVER_FLOOR_LIMIT_US, "met": u - f <= UNMESHED_OVER_FLOOR_LIMIT_US}),
        );
    }
    if let Some(m) = median_of(c, PRIMARY_SUBJECT) {
        derived.insert(
            "add_meshed_nftables_over_static_floor".into(),
            json!({"us": round2(m - f), "goal_us": MESHED_OVER_FLOOR_GOAL_US, "met": valid(c, PRIMARY_SUBJECT).then_some(m - f <= MESHED_OVER_FLOOR_GOAL_US)}),
        );
    }
    if let Some(t) = median_of(c, Scenario::SpawnFloor) {
        derived.insert(
            "spawn_floor_true_over_static_us".into(),
            round2(t - f).into(),
        );
    }
    // The stand-in measured against the estimate it replaces (the restores plus a
    // static process start), to show what the stand-in's own work adds.
    let bases = BudgetBaselines::get();
    if let (Some(b), Some(m)) = (
        median_of(c, bases.restores_alone),
        median_of(c, PRIMARY_SUBJECT),
    ) {
        let standin = median_of(c, bases.restore);
        derived.insert(
            "restore_baseline_both_ways".into(),
            json!({
                "with_cni_exec_us": standin.map(round2),
                "with_cni_exec_ratio": standin.map(|x| round2(x / m)),
                "restores_alone_us": round2(b),
                "restores_alone_ratio": round2(b / m),
                "restores_plus_static_floor_us": round2(b + f),
                "restores_plus_static_floor_ratio": round2((b + f) / m),
                "subject": PRIMARY_SUBJECT.key(),
                "how": "with_cni_exec: istio_cni_standin_nft median (measured, the budget's baseline); restores_alone: iptables_restore_per_family_nft median; restores_plus_static_floor: that plus spawn_floor_static median (an estimate)",
            }),
        );
    }
}

/// Against a no-op that starts as the shipped plugin starts (no CPU identification):
/// the plugin's own work, start-up savings aside. Reported next to the budgets' floor.
fn over_lean_floor(c: &Collected) -> Option<Value> {
    let f = median_of(c, Scenario::LeanFloor)?;
    let mut lean = Map::new();
    for (key, s) in [
        ("add_meshed_nftables_us", PRIMARY_SUBJECT),
        ("add_unmeshed_us", Scenario::AddUnmeshed),
    ] {
        if let Some(m) = median_of(c, s) {
            lean.insert(key.into(), round2(m - f).into());
        }
    }
    if let Some(s) = median_of(c, Scenario::StaticFloor) {
        lean.insert(
            "static_floor_over_lean_floor_us".into(),
            round2(s - f).into(),
        );
    }
    lean.insert(
        "how".into(),
        "median minus spawn_floor_lean_start median: the no-op linked with the plugin's own start-up (crates/lean-start/c/lean_start.c), so what remains is the plugin's work after start-up; the budgets are measured against spawn_floor_static".into(),
    );
    Some(Value::Object(lean))
}

/// What a wired meshed ADD would cost when the primary subject did not install rules: the
/// binary's fixed cost plus the engine.
fn estimated_wired_add(c: &Collected) -> Option<Value> {
    let u = median_of(c, Scenario::AddUnmeshed)?;
    let e = median_of(c, Scenario::Engine(BackendKind::Nftables))?;
    let est = u + e;
    let mut o = Map::new();
    o.insert("median_us".into(), round2(est).into());
    o.insert(
        "how".into(),
        "add_unmeshed median + engine_protect_nftables median (the plugin ADD does not apply rules yet)".into(),
    );
    let bases = BudgetBaselines::get();
    for base in [bases.restore, bases.restores_alone, bases.per_rule] {
        if let Some(b) = median_of(c, base) {
            o.insert(format!("ratio_{}", base.key()), round2(b / est).into());
        }
    }
    Some(Value::Object(o))
}

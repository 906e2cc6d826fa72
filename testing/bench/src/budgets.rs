//! `interlock-bench budgets FILE…`: every budget of docs/performance.md that the given
//! bench documents measure, with its figure as the median over the runs, the spread
//! (lowest and highest run), the limit, and pass or miss (and for a miss, by how much) —
//! one JSON document that docs/performance.md quotes. A single run's figure moves with
//! the host (process start-up on a VM is most of the floor), so a budget is judged on the
//! median of several runs, and the spread says how close to the line it sits.
//!
//! The documents are recognised by their shape: the plugin bench's (`interlock-bench`,
//! `make bench-json`), the sandbox bench's (`interlock-bench sandbox`), the audit bench's
//! (`interlock-bench audit`, its netns and its real-agent variant: their `budgets` lines
//! are taken as they are), and a file of the repair bench's JSON lines (`interlock-bench
//! repair`, one line per scenario; one file is one run). From the repair lines: every
//! clobber line's p99 (≤ 5 ms), every writer line's agent CPU (≤ 10 % of a core), and the
//! agent's idle RSS (the highest line of the run, ≤ 20 MiB); a line is named by its
//! scenario, mode, any other short text field (where it ran, say) and its foreign files.
//! A repair line that carries its own limits (`"budget": {"p99_ms": 5}`, or `budgets`
//! lines) is judged by those instead, and fields the budgets do not use are ignored. Runs of the same kind are put together; a
//! budget no document measured is left out, and one that only some runs measured is an
//! error (runs with different plans do not add up).

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use serde_json::{json, Value};

use crate::stats::median;

/// `interlock-bench budgets`' flags.
#[derive(Debug, Args)]
pub struct BudgetsArgs {
    /// Bench documents (JSON), one run each.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Pretty-print the JSON.
    #[arg(long)]
    pub pretty: bool,
}

/// How a figure meets its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bound {
    AtMost,
    AtLeast,
}

/// One budget read out of one kind of document.
struct Budget {
    name: &'static str,
    /// `plugin` or `sandbox`: which documents carry it.
    kind: &'static str,
    unit: &'static str,
    bound: Bound,
    limit: f64,
    /// Where its figure is in such a document.
    figure: fn(&Value) -> Option<f64>,
}

/// One budget with its figure in each run of its kind (`None`: that run lacks it).
struct Judged {
    name: String,
    kind: String,
    unit: String,
    bound: Bound,
    limit: f64,
    runs: Vec<Option<f64>>,
}

/// A budget a document names: `(name, bound, limit, figure)`.
type Named = (String, Bound, f64, Option<f64>);

/// Repair after a clobber, p99 (docs/performance.md).
pub const REPAIR_P99_MS: f64 = 5.0;
/// The agent's CPU under a writer, share of one core.
pub const AGENT_CPU_PCT: f64 = 10.0;
/// The agent's resident memory when idle.
pub const AGENT_IDLE_RSS_MIB: f64 = 20.0;

fn at(v: &Value, pointer: &str) -> Option<f64> {
    v.pointer(pointer)?.as_f64()
}

/// The sandbox document's budget line named `name`.
fn sandbox_figure(v: &Value, name: &str) -> Option<f64> {
    v["budgets"]
        .as_array()?
        .iter()
        .find(|b| b["name"] == name)?["figure"]
        .as_f64()
}

/// Every budget, in docs/performance.md's order.
fn budgets() -> Vec<Budget> {
    vec![
        Budget {
            name: "meshed_add_over_exec_floor",
            kind: "plugin",
            unit: "us",
            bound: Bound::AtMost,
            limit: 500.0,
            figure: |v| at(v, "/derived/add_meshed_nftables_over_static_floor/us"),
        },
        Budget {
            name: "meshed_add_over_exec_floor_goal",
            kind: "plugin",
            unit: "us",
            bound: Bound::AtMost,
            limit: 300.0,
            figure: |v| at(v, "/derived/add_meshed_nftables_over_static_floor/us"),
        },
        Budget {
            name: "unmeshed_add_over_exec_floor",
            kind: "plugin",
            unit: "us",
            bound: Bound::AtMost,
            limit: 100.0,
            figure: |v| at(v, "/derived/add_unmeshed_over_static_floor/us"),
        },
        Budget {
            name: "meshed_add_faster_than_istio_cni_way",
            kind: "plugin",
            unit: "x",
            bound: Bound::AtLeast,
            limit: 5.0,
            figure: |v| at(v, "/derived/restore_baseline_both_ways/with_cni_exec_ratio"),
        },
        Budget {
            name: "meshed_add_faster_than_one_iptables_per_rule",
            kind: "plugin",
            unit: "x",
            bound: Bound::AtLeast,
            limit: 20.0,
            figure: |v| at(v, "/ratios/iptables_per_rule_nft/add_meshed_nftables"),
        },
        Budget {
            name: "sandbox_meshed_start_p50_over_primary",
            kind: "sandbox",
            unit: "%",
            bound: Bound::AtMost,
            limit: crate::sandbox::BUDGET_P50_PCT,
            figure: |v| sandbox_figure(v, "interlock_meshed_start_p50_over_primary_pct"),
        },
        Budget {
            name: "sandbox_meshed_start_p99_over_primary",
            kind: "sandbox",
            unit: "%",
            bound: Bound::AtMost,
            limit: crate::sandbox::BUDGET_P99_PCT,
            figure: |v| sandbox_figure(v, "interlock_meshed_start_p99_over_primary_pct"),
        },
        Budget {
            name: "sandbox_pods_per_s_share_burst_8",
            kind: "sandbox",
            unit: "share",
            bound: Bound::AtLeast,
            limit: crate::sandbox::BUDGET_RATE_SHARE,
            figure: |v| sandbox_figure(v, "interlock_pods_per_s_share_of_primary_burst_8"),
        },
        Budget {
            name: "sandbox_pods_per_s_share_burst_32",
            kind: "sandbox",
            unit: "share",
            bound: Bound::AtLeast,
            limit: crate::sandbox::BUDGET_RATE_SHARE,
            figure: |v| sandbox_figure(v, "interlock_pods_per_s_share_of_primary_burst_32"),
        },
    ]
}

/// Which kind of bench document `v` is (`audit_netns`, `audit_agent`: the two
/// variants of the audit bench, which measure different budgets).
fn kind_of(v: &Value) -> Option<String> {
    if v["bench"] == "sandbox" {
        Some("sandbox".into())
    } else if v["bench"] == "repair" && v["lines"].is_array() {
        Some("repair".into())
    } else if v["bench"] == "audit" {
        Some(format!(
            "audit_{}",
            v["variant"].as_str().unwrap_or("netns")
        ))
    } else if v["tool"] == "interlock-bench" && v.get("derived").is_some() {
        Some("plugin".into())
    } else {
        None
    }
}

/// `(bound, limit)` of a budget line's `"<= 5"` or `">= 0.95"`.
fn parse_limit(text: &str) -> Option<(Bound, f64)> {
    let text = text.trim();
    let (bound, rest) = if let Some(r) = text.strip_prefix("<=") {
        (Bound::AtMost, r)
    } else {
        (Bound::AtLeast, text.strip_prefix(">=")?)
    };
    Some((bound, rest.trim().parse().ok()?))
}

/// The unit a budget line's name ends in.
fn unit_of(name: &str) -> &'static str {
    [("_ms", "ms"), ("_mib", "MiB"), ("_pct", "%"), ("_x", "x")]
        .iter()
        .find(|(suffix, _)| name.ends_with(suffix))
        .map_or("", |(_, unit)| unit)
}

/// A document's budget lines (`{name, figure, budget: "<= X", pass}`), prefixed:
/// `name → (bound, limit, figure)`.
fn budget_lines(v: &Value, prefix: &str) -> Vec<Named> {
    let Some(lines) = v["budgets"].as_array() else {
        return Vec::new();
    };
    lines
        .iter()
        .filter_map(|l| {
            let name = l["name"].as_str()?;
            let (bound, limit) = parse_limit(l["budget"].as_str()?)?;
            Some((
                format!("{prefix}{name}"),
                bound,
                limit,
                l["figure"].as_f64(),
            ))
        })
        .collect()
}

/// A repair line's name: its scenario's mode, any other short text field (where it ran)
/// and its foreign files, e.g. `owned_tmpfs_1000_foreign`.
fn repair_line_key(line: &Value) -> String {
    let mut key = line["mode"].as_str().unwrap_or("unknown").to_string();
    if let Some(o) = line.as_object() {
        for (k, v) in o {
            let Some(text) = v.as_str() else { continue };
            let short = !text.is_empty()
                && text.len() <= 16
                && text
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
            if k != "mode" && k != "scenario" && short {
                key.push('_');
                key.push_str(text);
            }
        }
    }
    match line["foreign_files"].as_u64() {
        Some(n) if n > 0 => format!("{key}_{n}_foreign"),
        _ => key,
    }
}

/// The budgets one run's repair lines measure: `name → (bound, limit, figure)`.
fn repair_budgets(lines: &[Value]) -> Vec<Named> {
    let mut out = Vec::new();
    let mut idle_rss: Option<f64> = None;
    for line in lines {
        let scenario = line["scenario"].as_str().unwrap_or("");
        if let Some(kib) = line["idle_rss_kib"].as_f64() {
            idle_rss = Some(idle_rss.map_or(kib, |r| r.max(kib)));
        }
        let key = repair_line_key(line);
        let own = budget_lines(line, &format!("repair_{scenario}_{key}_"));
        if !own.is_empty() {
            out.extend(own);
            continue;
        }
        // The line's own limits (`"budget": {"p99_ms": 5}`), else the documented ones.
        let mut limits: Vec<(String, f64)> = line["budget"]
            .as_object()
            .map(|b| {
                b.iter()
                    .filter_map(|(field, limit)| Some((field.clone(), limit.as_f64()?)))
                    .collect()
            })
            .unwrap_or_default();
        if limits.is_empty() {
            match scenario {
                "clobber" => limits.push(("p99_ms".into(), REPAIR_P99_MS)),
                "writer" => limits.push(("agent_cpu_pct_of_core".into(), AGENT_CPU_PCT)),
                _ => {}
            }
        }
        for (field, limit) in limits {
            let name = match (scenario, field.as_str()) {
                ("clobber", "p99_ms") => format!("repair_p99_after_clobber_{key}_ms"),
                ("writer", "agent_cpu_pct_of_core") => format!(
                    "agent_cpu_writer_{}_per_s_{key}_pct",
                    line["writes_per_sec"].as_u64().unwrap_or(0)
                ),
                _ => format!("repair_{scenario}_{key}_{field}"),
            };
            out.push((name, Bound::AtMost, limit, line[field.as_str()].as_f64()));
        }
    }
    if !lines.is_empty() {
        out.push((
            "agent_idle_rss_mib".into(),
            Bound::AtMost,
            AGENT_IDLE_RSS_MIB,
            idle_rss.map(|k| k / 1024.0),
        ));
    }
    out
}

/// Every budget the documents measure, with its figure in each run of its kind.
fn judged(docs: &[Value]) -> Vec<Judged> {
    let kinds: Vec<Option<String>> = docs.iter().map(kind_of).collect();
    let of_kind = |kind: &str| -> Vec<&Value> {
        docs.iter()
            .zip(&kinds)
            .filter(|(_, k)| k.as_deref() == Some(kind))
            .map(|(d, _)| d)
            .collect()
    };
    let mut out = Vec::new();
    for b in budgets() {
        let runs: Vec<Option<f64>> = of_kind(b.kind).iter().map(|d| (b.figure)(d)).collect();
        out.push(Judged {
            name: b.name.into(),
            kind: b.kind.into(),
            unit: b.unit.into(),
            bound: b.bound,
            limit: b.limit,
            runs,
        });
    }
    // The audit's and the repair's budgets are named by their documents.
    let mut dynamic: Vec<&str> = Vec::new();
    for k in kinds.iter().flatten().map(String::as_str) {
        if (k.starts_with("audit_") || k == "repair") && !dynamic.contains(&k) {
            dynamic.push(k);
        }
    }
    for kind in dynamic {
        let per_run: Vec<Vec<Named>> = of_kind(kind)
            .iter()
            .map(|d| match d["lines"].as_array() {
                Some(lines) => repair_budgets(lines),
                None => budget_lines(d, ""),
            })
            .collect();
        let mut names: Vec<(String, Bound, f64)> = Vec::new();
        for (name, bound, limit, _) in per_run.iter().flatten() {
            if !names.iter().any(|(n, ..)| n == name) {
                names.push((name.clone(), *bound, *limit));
            }
        }
        for (name, bound, limit) in names {
            let runs = per_run
                .iter()
                .map(|run| {
                    run.iter()
                        .find(|(n, ..)| *n == name)
                        .and_then(|(_, _, _, f)| *f)
                })
                .collect();
            out.push(Judged {
                unit: unit_of(&name).into(),
                name,
                kind: kind.into(),
                bound,
                limit,
                runs,
            });
        }
    }
    out
}

/// The summary of `docs` (each a run's document): see the module docs.
pub fn summarize(docs: &[Value]) -> anyhow::Result<Value> {
    let mut out = Vec::new();
    for b in judged(docs) {
        let runs = &b.runs;
        if runs.is_empty() {
            continue;
        }
        let figures: Vec<f64> = runs.iter().flatten().copied().collect();
        if figures.is_empty() {
            // Not measured by these runs (a sandbox run without that burst size).
            continue;
        }
        if figures.len() != runs.len() {
            bail!(
                "budget {}: {} of {} {} documents lack its figure (an older or --only run?)",
                b.name,
                runs.len() - figures.len(),
                runs.len(),
                b.kind
            );
        }
        let pass = |f: f64| match b.bound {
            Bound::AtMost => f <= b.limit,
            Bound::AtLeast => f >= b.limit,
        };
        let runs_passing = figures.iter().filter(|f| pass(**f)).count();
        let lowest = figures.iter().copied().fold(f64::INFINITY, f64::min);
        let highest = figures.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let med = median(&figures).expect("figures is not empty");
        let round = |x: f64| (x * 100.0).round() / 100.0;
        let mut line = json!({
            "budget": b.name,
            "from": b.kind,
            "unit": b.unit,
            "limit": format!("{} {}", if b.bound == Bound::AtMost { "<=" } else { ">=" }, b.limit),
            "median": round(med),
            "lowest": round(lowest),
            "highest": round(highest),
            "runs": figures.len(),
            "runs_passing": runs_passing,
            "pass": pass(med),
        });
        if !pass(med) {
            line["missed_by"] = round((med - b.limit).abs()).into();
        }
        out.push(line);
    }
    if out.is_empty() {
        bail!("none of the documents is a plugin, sandbox, audit or repair bench document");
    }
    Ok(json!({ "budgets": out }))
}

/// Reads one file: one JSON document, or the repair bench's JSON lines (one run).
fn read_doc(path: &std::path::Path) -> anyhow::Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    if let Ok(v) = serde_json::from_str::<Value>(&text) {
        if v.get("scenario").is_none() {
            if kind_of(&v).is_none() {
                bail!(
                    "{}: not a plugin, sandbox, audit or repair bench document",
                    path.display()
                );
            }
            return Ok(v);
        }
    }
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        match serde_json::from_str::<Value>(line) {
            Ok(v) if v.get("scenario").is_some() => lines.push(v),
            _ => eprintln!(
                "interlock-bench budgets: {}:{}: not a repair bench line; skipped",
                path.display(),
                i + 1
            ),
        }
    }
    if lines.is_empty() {
        bail!(
            "{}: neither one bench document nor repair bench lines",
            path.display()
        );
    }
    Ok(json!({"bench": "repair", "lines": lines}))
}

/// Reads the files and prints the summary.
pub fn run(a: BudgetsArgs) -> anyhow::Result<()> {
    let mut docs = Vec::new();
    for f in &a.files {
        docs.push(read_doc(f)?);
    }
    let doc = summarize(&docs)?;
    println!(
        "{}",
        if a.pretty {
            serde_json::to_string_pretty(&doc)?
        } else {
            doc.to_string()
        }
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plugin_doc(over_floor: f64, ratio: f64) -> Value {
        json!({"tool": "interlock-bench", "derived": {
            "add_meshed_nftables_over_static_floor": {"us": over_floor},
            "add_unmeshed_over_static_floor": {"us": -20.0},
            "restore_baseline_both_ways": {"with_cni_exec_ratio": ratio}},
            "ratios": {"iptables_per_rule_nft": {"add_meshed_nftables": 30.0}}})
    }

    #[test]
    fn the_median_of_the_runs_decides_and_the_spread_is_shown() {
        let docs = [
            plugin_doc(280.0, 5.2),
            plugin_doc(320.0, 4.9),
            plugin_doc(900.0, 5.1),
        ];
        let s = summarize(&docs).unwrap();
        let by = |name: &str| {
            s["budgets"]
                .as_array()
                .unwrap()
                .iter()
                .find(|b| b["budget"] == name)
                .unwrap()
                .clone()
        };
        let floor = by("meshed_add_over_exec_floor");
        assert_eq!(floor["median"], 320.0);
        assert_eq!(
            (floor["lowest"].clone(), floor["highest"].clone()),
            (json!(280.0), json!(900.0))
        );
        assert_eq!(floor["pass"], true);
        assert_eq!(floor["runs_passing"], 2);
        let goal = by("meshed_add_over_exec_floor_goal");
        assert_eq!(goal["pass"], false);
        let istio = by("meshed_add_faster_than_istio_cni_way");
        assert_eq!(
            (istio["median"].clone(), istio["pass"].clone()),
            (json!(5.1), json!(true))
        );
        // No sandbox document: its budgets are left out, not failed.
        assert!(s["budgets"]
            .as_array()
            .unwrap()
            .iter()
            .all(|b| !b["budget"].as_str().unwrap().starts_with("sandbox")));
    }

    #[test]
    fn a_document_without_a_figure_is_an_error_naming_the_budget() {
        let mut partial = plugin_doc(300.0, 5.0);
        partial["derived"]
            .as_object_mut()
            .unwrap()
            .remove("restore_baseline_both_ways");
        let e = summarize(&[plugin_doc(300.0, 5.0), partial]).unwrap_err();
        assert!(
            e.to_string()
                .contains("meshed_add_faster_than_istio_cni_way"),
            "{e}"
        );
        assert!(summarize(&[json!({"x": 1})]).is_err());
    }

    fn repair_run(clobber_p99: f64, cpu: f64, rss_kib: u64) -> Value {
        json!({"bench": "repair", "lines": [
            {"p50_ms": 1.0, "p99_ms": clobber_p99, "n": 1000, "scenario": "clobber",
             "mode": "owned", "foreign_files": 0, "idle_rss_kib": 9000},
            {"p99_ms": 2.0, "scenario": "clobber", "mode": "owned", "fs": "tmpfs",
             "foreign_files": 1000, "idle_rss_kib": 9100, "a_field_of_tomorrow": [1, 2]},
            {"p99_ms": 40.0, "scenario": "follow", "mode": "chain", "idle_rss_kib": 9000},
            {"scenario": "writer", "mode": "owned", "foreign_files": 1000,
             "writes_per_sec": 100, "agent_cpu_pct_of_core": cpu, "idle_rss_kib": rss_kib},
        ]})
    }

    fn line<'a>(s: &'a Value, name: &str) -> &'a Value {
        s["budgets"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["budget"] == name)
            .unwrap_or_else(|| panic!("no budget {name} in {s:#}"))
    }

    #[test]
    fn the_agents_budgets_come_from_the_repair_lines_of_each_run() {
        let runs = [
            repair_run(4.0, 9.0, 14 * 1024),
            repair_run(7.5, 12.0, 15 * 1024),
            repair_run(6.0, 8.0, 13 * 1024),
        ];
        let s = summarize(&runs).unwrap();
        let clobber = line(&s, "repair_p99_after_clobber_owned_ms");
        assert_eq!(
            (
                clobber["median"].clone(),
                clobber["lowest"].clone(),
                clobber["highest"].clone()
            ),
            (json!(6.0), json!(4.0), json!(7.5))
        );
        assert_eq!(clobber["pass"], false);
        assert_eq!(clobber["missed_by"], 1.0);
        assert_eq!(clobber["runs_passing"], 1);
        assert_eq!(clobber["unit"], "ms");
        // A line that says where it ran is a budget of its own.
        let tmpfs = line(&s, "repair_p99_after_clobber_owned_tmpfs_1000_foreign_ms");
        assert_eq!(
            (tmpfs["median"].clone(), tmpfs["pass"].clone()),
            (json!(2.0), json!(true))
        );
        let cpu = line(&s, "agent_cpu_writer_100_per_s_owned_1000_foreign_pct");
        assert_eq!(
            (cpu["median"].clone(), cpu["pass"].clone()),
            (json!(9.0), json!(true))
        );
        assert_eq!(cpu["runs_passing"], 2);
        // The highest idle RSS of each run.
        let rss = line(&s, "agent_idle_rss_mib");
        assert_eq!(
            (rss["median"].clone(), rss["highest"].clone()),
            (json!(14.0), json!(15.0))
        );
        // Scenarios without a budget are not judged.
        assert!(!s.to_string().contains("follow"));
    }

    #[test]
    fn a_repair_line_with_budgets_of_its_own_is_judged_by_them() {
        let run = json!({"bench": "repair", "lines": [
            {"p99_ms": 6.0, "scenario": "clobber", "mode": "chain", "idle_rss_kib": 9000,
             "budgets": [{"name": "p99_ms", "figure": 6.0, "budget": "<= 5", "pass": false}]}]});
        let s = summarize(&[run]).unwrap();
        let own = line(&s, "repair_clobber_chain_p99_ms");
        assert_eq!(
            (own["limit"].clone(), own["pass"].clone()),
            (json!("<= 5"), json!(false))
        );
        assert!(!s.to_string().contains("repair_p99_after_clobber_chain"));
    }

    #[test]
    fn a_repair_lines_own_limit_and_filesystem_are_used() {
        let run = json!({"bench": "repair", "lines": [
            {"p99_ms": 3.0, "scenario": "clobber", "mode": "chain", "filesystem": "tmpfs",
             "budget": {"p99_ms": 2.5}, "pass": false, "idle_rss_kib": 9000},
            {"p99_ms": 30.0, "scenario": "return", "mode": "chain", "filesystem": "disk",
             "budget": {"p99_ms": 50}, "pass": true, "idle_rss_kib": 9000}]});
        let s = summarize(&[run]).unwrap();
        let own = line(&s, "repair_p99_after_clobber_chain_tmpfs_ms");
        assert_eq!(
            (own["limit"].clone(), own["pass"].clone()),
            (json!("<= 2.5"), json!(false))
        );
        let other = line(&s, "repair_return_chain_disk_p99_ms");
        assert_eq!(
            (other["median"].clone(), other["pass"].clone()),
            (json!(30.0), json!(true))
        );
    }

    #[test]
    fn the_audits_budget_lines_are_taken_as_they_are() {
        let netns = |ms: f64| {
            json!({"bench": "audit", "variant": "netns", "pods": 1000, "budgets": [
                {"name": "audit_pass_1000_netns_ms", "figure": ms, "budget": "<= 1000", "pass": ms <= 1000.0},
                {"name": "audit_repair_one_pod_p99_ms", "figure": 20.0, "budget": "<= 50", "pass": true}]})
        };
        let agent = json!({"bench": "audit", "variant": "agent", "sandboxes": 1000, "budgets": [
            {"name": "agent_rss_auditing_1000_sandboxes_mib", "figure": 41.0, "budget": "<= 40", "pass": false}]});
        let s = summarize(&[netns(900.0), netns(1200.0), agent, netns(800.0)]).unwrap();
        let pass = line(&s, "audit_pass_1000_netns_ms");
        assert_eq!(
            (
                pass["median"].clone(),
                pass["runs"].clone(),
                pass["pass"].clone()
            ),
            (json!(900.0), json!(3), json!(true))
        );
        let rss = line(&s, "agent_rss_auditing_1000_sandboxes_mib");
        assert_eq!(
            (
                rss["runs"].clone(),
                rss["pass"].clone(),
                rss["unit"].clone(),
                rss["from"].clone()
            ),
            (json!(1), json!(false), json!("MiB"), json!("audit_agent"))
        );
    }

    #[test]
    fn a_file_of_repair_lines_is_one_run_and_other_lines_are_skipped() {
        let t = interlock_testkit::tempdir().unwrap();
        let f = t.path().join("repair-1.jsonl");
        std::fs::write(
            &f,
            "{\"p99_ms\": 3.0, \"scenario\": \"clobber\", \"mode\": \"chain\", \"idle_rss_kib\": 9000}\n\
             warning: something else\n\n\
             {\"p99_ms\": 4.0, \"scenario\": \"clobber\", \"mode\": \"owned\", \"idle_rss_kib\": 9500}\n",
        )
        .unwrap();
        let v = read_doc(&f).unwrap();
        assert_eq!(kind_of(&v).as_deref(), Some("repair"));
        assert_eq!(v["lines"].as_array().unwrap().len(), 2);
        // One line alone is still a run of repair lines, not a document.
        let one = t.path().join("repair-2.jsonl");
        std::fs::write(
            &one,
            "{\"p99_ms\": 3.0, \"scenario\": \"clobber\", \"mode\": \"chain\"}\n",
        )
        .unwrap();
        assert_eq!(
            read_doc(&one).unwrap()["lines"].as_array().unwrap().len(),
            1
        );
        let junk = t.path().join("junk.json");
        std::fs::write(&junk, "{\"x\": 1}").unwrap();
        let e = read_doc(&junk).unwrap_err();
        assert!(e.to_string().contains("junk.json"), "{e}");
    }
}

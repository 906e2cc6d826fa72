//! `interlock-bench budgets FILE…`: every budget of docs/performance.md that the given
//! bench documents measure, with its figure as the median over the runs, the spread
//! (lowest and highest run), the limit, and pass or miss — one JSON document that
//! docs/performance.md quotes. A single run's figure moves with the host (process
//! start-up on a VM is most of the floor), so a budget is judged on the median of
//! several runs, and the spread says how close to the line it sits.
//!
//! The documents are recognised by their shape: the plugin bench's (`interlock-bench`,
//! `make bench-json`) and the sandbox bench's (`interlock-bench sandbox`). Runs of the
//! same kind are put together; a budget no document measured is left out, and one that
//! only some runs measured is an error (runs with different plans do not add up).

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

/// Which kind of bench document `v` is.
fn kind_of(v: &Value) -> Option<&'static str> {
    if v["bench"] == "sandbox" {
        Some("sandbox")
    } else if v["tool"] == "interlock-bench" && v.get("derived").is_some() {
        Some("plugin")
    } else {
        None
    }
}

/// The summary of `docs` (each a run's document): see the module docs.
pub fn summarize(docs: &[Value]) -> anyhow::Result<Value> {
    let mut out = Vec::new();
    for b in budgets() {
        let runs: Vec<Option<f64>> = docs
            .iter()
            .filter(|d| kind_of(d) == Some(b.kind))
            .map(|d| (b.figure)(d))
            .collect();
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
        out.push(json!({
            "budget": b.name,
            "unit": b.unit,
            "limit": format!("{} {}", if b.bound == Bound::AtMost { "<=" } else { ">=" }, b.limit),
            "median": (med * 100.0).round() / 100.0,
            "lowest": (lowest * 100.0).round() / 100.0,
            "highest": (highest * 100.0).round() / 100.0,
            "runs": figures.len(),
            "runs_passing": runs_passing,
            "pass": pass(med),
        }));
    }
    if out.is_empty() {
        bail!("none of the documents is a plugin or sandbox bench document");
    }
    Ok(json!({ "budgets": out }))
}

/// Reads the files and prints the summary.
pub fn run(a: BudgetsArgs) -> anyhow::Result<()> {
    let mut docs = Vec::new();
    for f in &a.files {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        let v: Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not one JSON document", f.display()))?;
        if kind_of(&v).is_none() {
            bail!("{}: not a plugin or sandbox bench document", f.display());
        }
        docs.push(v);
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
}

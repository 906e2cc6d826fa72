//! The soak's report: one JSON document and a short human summary, built from what the
//! workload, the chaos loop, the checker and the leak checks recorded.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::chaos::ChaosKind;
use crate::ledger::{quantile, Exposure, Ms, VerdictCounts, Violation};
use crate::sentinel::SentinelOutcome;
use crate::workload::WorkloadStats;

/// Quantiles of a set of durations, in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Distribution {
    /// How many values.
    pub count: usize,
    /// Median.
    pub p50: Option<Ms>,
    /// 90th percentile.
    pub p90: Option<Ms>,
    /// 99th percentile.
    pub p99: Option<Ms>,
    /// Largest.
    pub max: Option<Ms>,
}

impl Distribution {
    /// The quantiles of `values`.
    pub fn of(values: &[Ms]) -> Distribution {
        Distribution {
            count: values.len(),
            p50: quantile(values, 0.5),
            p90: quantile(values, 0.9),
            p99: quantile(values, 0.99),
            max: values.iter().copied().max(),
        }
    }
}

/// The run's settings, as the report repeats them.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    /// The seed of the chaos plan and the workload (replay with `--seed`).
    pub seed: u64,
    /// Creations planned.
    pub creations: u64,
    /// Parallel creators.
    pub workers: usize,
    /// The agent's `--config-mode`.
    pub config_mode: String,
    /// The agent's `--audit-interval`, in seconds.
    pub audit_interval_s: f64,
    /// 2 s plus the audit interval.
    pub repair_budget_ms: Ms,
    /// The checker's period.
    pub checker_period_ms: Ms,
    /// False for the control run without interlock.
    pub with_interlock: bool,
    /// Chaos kinds in play.
    pub chaos_kinds: Vec<ChaosKind>,
    /// The build the upgrade steps switch to and back from (`this build` when the same
    /// build is restarted from another path).
    pub other_build: String,
    /// The least time the workload runs, in seconds.
    pub min_duration_s: u64,
    /// The fake Kubernetes API ran (sentinels checked through it).
    pub kube: bool,
    /// The agent's `--repair-policy`.
    pub repair_policy: String,
    /// Guard mode: the mesh whose own plugin (a stand-in) redirects, next to its
    /// installer stand-in; `None` in interlock's own modes.
    pub guard_mesh: Option<String>,
}

/// What the agent's audit did to pods, as the fake API's Events say (read at the end).
#[derive(Debug, Clone, Default, Serialize)]
pub struct AuditActions {
    /// Events about pods, by reason.
    pub events_by_reason: BTreeMap<String, u64>,
    /// The workload's meshed pods the audit acted on (restarted, evicted, deleted,
    /// repaired or reported).
    pub meshed_acted_on: u64,
    /// The workload's unmeshed pods the audit acted on: must be 0.
    pub unmeshed_acted_on: u64,
    /// Sentinels the audit acted on.
    pub sentinels_acted_on: u64,
}

/// Sandboxes created and how.
#[derive(Debug, Clone, Serialize)]
pub struct Sandboxes {
    /// Creations attempted.
    pub attempted: u64,
    /// Started, by kind.
    pub created: BTreeMap<&'static str, u64>,
    /// Failed to start, by kind.
    pub failed_to_start: BTreeMap<&'static str, u64>,
    /// Failures by reason.
    pub failure_reasons: BTreeMap<String, u64>,
    /// One full error message per reason.
    pub failure_examples: BTreeMap<String, String>,
    /// Removed by the workers while the soak ran.
    pub removed: u64,
    /// Removals that had to be retried.
    pub remove_retries: u64,
    /// Not-ready sandboxes that failed creations left behind, removed as the kubelet's
    /// garbage collection does.
    pub collected_not_ready: u64,
    /// A runtime fault the soak cleared to tear sandboxes down: libcni result caches
    /// containerd left unreadable when it was killed while writing them (see
    /// `workload::clear_unreadable_cni_cache`). Not a violation: interlock's own state
    /// and addresses are still checked after the DEL that follows.
    pub unreadable_cni_caches_cleared: Vec<String>,
    /// Freezer cgroups a runtime deadlock left freezing, thawed so their sandboxes could
    /// be stopped (a runtime fault, see `workload::thaw_stuck_freezer`).
    pub stuck_freezers_thawed: Vec<String>,
    /// Sandboxes the checker saw running although their RunPodSandbox failed for the
    /// client (its answer lost in a containerd restart); swept at the end.
    pub started_without_answer: u64,
    /// Meshed sandboxes kept running through the whole soak (checked at the end).
    pub resident: u64,
    /// RunPodSandbox latency of the started ones.
    pub create_latency_ms: Distribution,
    /// Creations per second over the soak.
    pub creations_per_s: f64,
}

impl Sandboxes {
    /// From the workload's counts over `elapsed_ms`.
    pub fn from_stats(s: &WorkloadStats, resident: u64, elapsed_ms: Ms) -> Sandboxes {
        Sandboxes {
            attempted: s.attempted,
            created: BTreeMap::from([("meshed", s.created_meshed), ("plain", s.created_plain)]),
            failed_to_start: BTreeMap::from([
                ("meshed", s.failed_meshed),
                ("plain", s.failed_plain),
            ]),
            failure_reasons: s.failures_by_reason.clone(),
            failure_examples: s.failure_examples.clone(),
            removed: s.removed,
            started_without_answer: 0,
            remove_retries: s.remove_retries,
            collected_not_ready: s.collected_not_ready,
            unreadable_cni_caches_cleared: s.unreadable_cni_caches.clone(),
            stuck_freezers_thawed: s.stuck_freezers_thawed.clone(),
            resident,
            create_latency_ms: Distribution::of(&s.create_ms),
            creations_per_s: if elapsed_ms == 0 {
                0.0
            } else {
                (s.attempted as f64) * 1000.0 / elapsed_ms as f64
            },
        }
    }
}

/// What the chaos loop did.
#[derive(Debug, Clone, Serialize)]
pub struct Chaos {
    /// Steps, by kind.
    pub events: BTreeMap<ChaosKind, u64>,
    /// Time the agent took to reinstall a deleted plugin.
    pub plugin_reinstall_ms: Distribution,
    /// Steps that failed to apply or undo.
    pub errors: Vec<String>,
    /// Every sentinel planted: a meshed pod started unprotected on purpose, and what the
    /// API showed about it.
    pub sentinels: Vec<SentinelOutcome>,
}

/// What the checker did.
#[derive(Debug, Clone, Serialize)]
pub struct CheckerSummary {
    /// Rounds completed.
    pub rounds: u64,
    /// The longest round.
    pub longest_round_ms: Ms,
    /// Rounds in which containerd did not answer (restarting).
    pub rounds_without_runtime: u64,
    /// Sandboxes seen running, by kind.
    pub sandboxes_seen: BTreeMap<&'static str, u64>,
    /// Probe verdicts, by kind of sandbox.
    pub probes: BTreeMap<&'static str, VerdictCounts>,
    /// Probes dropped because the sandbox was being stopped.
    pub dropped_probes: u64,
}

/// Exposures of meshed sandboxes.
#[derive(Debug, Clone, Serialize)]
pub struct Exposures {
    /// Meshed sandboxes ever seen running unprotected.
    pub sandboxes: usize,
    /// Their windows (a sandbox may have several).
    pub windows: usize,
    /// The longest window.
    pub max_window_ms: Option<Ms>,
    /// The longest window in detail (which sandbox, which chaos step).
    pub longest: Option<Exposure>,
    /// All windows' lengths.
    pub distribution_ms: Distribution,
    /// Windows by the chaos kind that caused them (`unexplained` when none did).
    pub by_cause: BTreeMap<String, Distribution>,
    /// Windows that ended by repair (a captured probe) / by the sandbox's removal.
    pub ended_by: BTreeMap<&'static str, usize>,
    /// Windows that ended later than the repair budget allows.
    pub beyond_budget: usize,
    /// Every window, longest first (at most 50).
    pub list: Vec<Exposure>,
}

impl Exposures {
    /// Summarises `all`.
    pub fn of(mut all: Vec<Exposure>) -> Exposures {
        all.sort_by_key(|e| std::cmp::Reverse(e.duration_ms));
        let durations: Vec<Ms> = all.iter().map(|e| e.duration_ms).collect();
        let mut by_cause: BTreeMap<String, Vec<Ms>> = BTreeMap::new();
        for e in &all {
            let mut kinds: Vec<String> =
                e.cause_kinds.iter().map(|k| k.name().to_string()).collect();
            kinds.dedup();
            if kinds.is_empty() {
                kinds.push("unexplained".into());
            }
            by_cause
                .entry(kinds.join("+"))
                .or_default()
                .push(e.duration_ms);
        }
        let mut ended_by = BTreeMap::new();
        for e in &all {
            let key = match e.window.closed {
                crate::ledger::Closed::Captured => "repair",
                crate::ledger::Closed::Removed => "removal",
                crate::ledger::Closed::Open => "still_open",
            };
            *ended_by.entry(key).or_insert(0) += 1;
        }
        let mut sandboxes: Vec<&str> = all.iter().map(|e| e.sandbox.as_str()).collect();
        sandboxes.sort_unstable();
        sandboxes.dedup();
        Exposures {
            sandboxes: sandboxes.len(),
            windows: all.len(),
            max_window_ms: durations.iter().copied().max(),
            longest: all.first().cloned(),
            distribution_ms: Distribution::of(&durations),
            by_cause: by_cause
                .into_iter()
                .map(|(k, v)| (k, Distribution::of(&v)))
                .collect(),
            ended_by,
            beyond_budget: all.iter().filter(|e| !e.within_budget).count(),
            list: all.into_iter().take(50).collect(),
        }
    }
}

/// What was left on the host after the teardown (all must be 0).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Leaks {
    /// Sandbox netns files still present.
    pub netns: usize,
    /// Attachment state files (and netns records) in the agent's state dir after every
    /// sandbox was removed.
    pub attachment_state_files: usize,
    /// Addresses host-local still holds after every sandbox was removed.
    pub ipam_addresses: usize,
    /// nft tables of interlock in the host's namespace.
    pub nft_tables: usize,
    /// Processes of the node still running (agent, containerd, shims, pause).
    pub processes: usize,
    /// Sandboxes the final sweep could not remove.
    pub sandboxes: usize,
    /// Everything else the kit's teardown reported.
    pub other: usize,
    /// Each leak in words.
    pub details: Vec<String>,
}

impl Leaks {
    /// The sum of every count.
    pub fn total(&self) -> usize {
        self.netns
            + self.attachment_state_files
            + self.ipam_addresses
            + self.nft_tables
            + self.processes
            + self.sandboxes
            + self.other
    }
}

/// The end-of-run check of every sandbox still running after chaos stopped and the
/// repair budget passed.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FinalCheck {
    /// Meshed sandboxes running at the end.
    pub meshed_running: usize,
    /// Plain sandboxes running at the end.
    pub plain_running: usize,
    /// Meshed sandboxes found unprotected (must be 0).
    pub left_unprotected: usize,
    /// Meshed sandboxes proven redirected by the kit's capture check (`SO_ORIGINAL_DST`).
    pub meshed_redirected: usize,
    /// Plain sandboxes proven not redirected.
    pub plain_not_redirected: usize,
    /// Sandboxes whose check proved nothing, with why.
    pub unverified: Vec<String>,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// True when every invariant held.
    pub ok: bool,
    /// The run's settings.
    pub settings: Settings,
    /// How long the soak ran (creations until the last sandbox was removed).
    pub duration_s: f64,
    /// Sandboxes.
    pub sandboxes: Sandboxes,
    /// Chaos.
    pub chaos: Chaos,
    /// The checker.
    pub checker: CheckerSummary,
    /// Exposures of meshed sandboxes.
    pub exposures: Exposures,
    /// The end-of-run check.
    pub final_check: FinalCheck,
    /// Leftovers after the teardown.
    pub leaks: Leaks,
    /// What the audit did to pods (with the fake API).
    pub audit: AuditActions,
    /// Every broken invariant.
    pub violations: Vec<Violation>,
}

impl Report {
    /// A few lines for a human.
    pub fn summary(&self) -> String {
        let s = &self.sandboxes;
        let mut out = String::new();
        out.push_str(&format!(
            "interlock soak{} (seed {}, config mode {}{}, audit interval {} s): {}\n",
            if self.settings.with_interlock {
                ""
            } else {
                " WITHOUT interlock (control run)"
            },
            self.settings.seed,
            self.settings.config_mode,
            self.settings
                .guard_mesh
                .as_ref()
                .map_or(String::new(), |m| format!(" guarding {m}")),
            self.settings.audit_interval_s,
            if self.ok { "OK" } else { "FAILED" }
        ));
        out.push_str(&format!(
            "  sandboxes: {} creations attempted in {:.0} s ({:.2}/s); started {} meshed + {} plain; {} failed to start ({} left behind not ready, collected)\n",
            s.attempted,
            self.duration_s,
            s.creations_per_s,
            s.created["meshed"],
            s.created["plain"],
            s.failed_to_start.values().sum::<u64>(),
            s.collected_not_ready
        ));
        let events: Vec<String> = self
            .chaos
            .events
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        out.push_str(&format!(
            "  chaos: {} (upgrades to {} and back)\n",
            events.join(", "),
            self.settings.other_build
        ));
        let sentinels = &self.chaos.sentinels;
        if !sentinels.is_empty() {
            let reported: Vec<Ms> = sentinels
                .iter()
                .filter_map(|o| o.reported_after_ms)
                .collect();
            out.push_str(&format!(
                "  sentinels (meshed pods started unprotected on purpose, repair policy {}): {} planted, {} with the Event{} the policy promises in the fake API (max {} ms after the agent's start)\n",
                self.settings.repair_policy,
                sentinels.len(),
                reported.len(),
                if sentinels.iter().any(|o| o.labelled) { " and label" } else { "" },
                reported.iter().max().map_or("-".into(), |m| m.to_string())
            ));
        }
        if !s.unreadable_cni_caches_cleared.is_empty() {
            out.push_str(&format!(
                "  runtime fault cleared to tear down: {} libcni result cache(s) containerd left unreadable (killed while writing them): {}\n",
                s.unreadable_cni_caches_cleared.len(),
                s.unreadable_cni_caches_cleared.join(", ")
            ));
        }
        if !s.stuck_freezers_thawed.is_empty() {
            out.push_str(&format!(
                "  runtime fault cleared to tear down: {} freezer cgroup(s) runc left freezing (a sandbox stopped while its init exec'd), thawed: {}\n",
                s.stuck_freezers_thawed.len(),
                s.stuck_freezers_thawed.join(", ")
            ));
        }
        if !s.failure_reasons.is_empty() {
            let why: Vec<String> = s
                .failure_reasons
                .iter()
                .map(|(r, n)| format!("{n}× {r}"))
                .collect();
            out.push_str(&format!("  refused or failed: {}\n", why.join("; ")));
        }
        let a = &self.audit;
        if !a.events_by_reason.is_empty() {
            let reasons: Vec<String> = a
                .events_by_reason
                .iter()
                .map(|(r, n)| format!("{r} {n}"))
                .collect();
            out.push_str(&format!(
                "  audit: acted on {} meshed pods, {} sentinels, {} unmeshed pods (Events: {})\n",
                a.meshed_acted_on,
                a.sentinels_acted_on,
                a.unmeshed_acted_on,
                reasons.join(", ")
            ));
        }
        let e = &self.exposures;
        out.push_str(&format!(
            "  meshed sandboxes seen unprotected: {} ({} windows, max {} ms, p50 {} ms; {} beyond the {} ms repair budget)\n",
            e.sandboxes,
            e.windows,
            e.max_window_ms.map_or("-".into(), |m| m.to_string()),
            e.distribution_ms.p50.map_or("-".into(), |m| m.to_string()),
            e.beyond_budget,
            self.settings.repair_budget_ms
        ));
        if let Some(l) = &e.longest {
            out.push_str(&format!(
                "    longest: sandbox {} for {} ms, caused by {}\n",
                l.sandbox,
                l.duration_ms,
                if l.causes.is_empty() {
                    "nothing (unexplained)".to_string()
                } else {
                    l.causes.join(", ")
                }
            ));
        }
        out.push_str(&format!(
            "  at the end: {} meshed running, {} left unprotected; leaks: {} (netns {}, state files {}, IPAM {}, nft tables {}, processes {})\n",
            self.final_check.meshed_running,
            self.final_check.left_unprotected,
            self.leaks.total(),
            self.leaks.netns,
            self.leaks.attachment_state_files,
            self.leaks.ipam_addresses,
            self.leaks.nft_tables,
            self.leaks.processes
        ));
        for v in &self.violations {
            out.push_str(&format!("  VIOLATION {}: {}\n", v.invariant, v.detail));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{Closed, Window};

    fn exposure(
        sandbox: &str,
        duration: Ms,
        kinds: &[ChaosKind],
        closed: Closed,
        within: bool,
    ) -> Exposure {
        Exposure {
            sandbox: sandbox.into(),
            window: Window {
                start_ms: 0,
                from_creation: true,
                first_seen_ms: 10,
                last_seen_ms: 10,
                end_ms: duration,
                closed,
            },
            duration_ms: duration,
            causes: kinds
                .iter()
                .enumerate()
                .map(|(i, k)| format!("#{i} {k}"))
                .collect(),
            cause_kinds: kinds.to_vec(),
            agent_ready_ms: Some(0),
            deadline_ms: Some(2500),
            within_budget: within,
            explained: !kinds.is_empty(),
        }
    }

    #[test]
    fn exposures_are_grouped_by_cause_and_sorted_longest_first() {
        let e = Exposures::of(vec![
            exposure(
                "a",
                300,
                &[ChaosKind::PrimaryRewrite],
                Closed::Captured,
                true,
            ),
            exposure(
                "b",
                900,
                &[ChaosKind::ConfigAhead, ChaosKind::PrimaryRewrite],
                Closed::Removed,
                true,
            ),
            exposure(
                "a",
                100,
                &[ChaosKind::PrimaryRewrite],
                Closed::Captured,
                true,
            ),
            exposure("c", 4000, &[], Closed::Open, false),
        ]);
        assert_eq!(e.sandboxes, 3);
        assert_eq!(e.windows, 4);
        assert_eq!(e.max_window_ms, Some(4000));
        assert_eq!(e.longest.as_ref().unwrap().sandbox, "c");
        let order: Vec<Ms> = e.list.iter().map(|x| x.duration_ms).collect();
        assert_eq!(order, vec![4000, 900, 300, 100]);
        assert_eq!(e.by_cause["primary_rewrite"].count, 2);
        assert_eq!(e.by_cause["primary_rewrite"].max, Some(300));
        assert_eq!(e.by_cause["config_ahead+primary_rewrite"].count, 1);
        assert_eq!(e.by_cause["unexplained"].count, 1);
        assert_eq!(e.ended_by["repair"], 2);
        assert_eq!(e.ended_by["removal"], 1);
        assert_eq!(e.ended_by["still_open"], 1);
        assert_eq!(e.beyond_budget, 1);
        let none = Exposures::of(Vec::new());
        assert_eq!((none.sandboxes, none.max_window_ms), (0, None));
    }

    #[test]
    fn distributions_by_nearest_rank() {
        let d = Distribution::of(&[10, 20, 30, 40, 50, 60, 70, 80, 90, 100]);
        assert_eq!(
            (d.count, d.p50, d.p90, d.p99, d.max),
            (10, Some(50), Some(90), Some(100), Some(100))
        );
        assert_eq!(Distribution::of(&[]), Distribution::default());
    }
}

//! The checker's bookkeeping, and the verdict over a whole run — pure, on milliseconds
//! since the soak began.
//!
//! For every sandbox the checker saw running, the [`Ledger`] keeps what each probe found
//! and the *exposure windows*: from the last moment the sandbox was known not to be
//! exposed (its creation, or its last captured probe) until the first probe that found it
//! captured again (or its removal, or the end). [`judge`] then sets each window against
//! the [`Timeline`] of chaos steps and agent readiness:
//!
//! - a meshed sandbox may be exposed only if a step that changes the runtime's chain
//!   (or the time the agent needed to converge after it) overlapped its creation, and
//!   then only until the repair budget after the agent was ready again;
//! - a meshed sandbox once seen captured must never be seen exposed again;
//! - nothing may be left exposed at the end.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::chaos::{ChaosKind, Variant};

/// Milliseconds since the soak began.
pub type Ms = u64;

/// What one probe from inside a sandbox found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The connection reached the checker's server directly: no redirection.
    Direct,
    /// The connection was redirected inside the sandbox (refused by, or accepted on, a
    /// local port instead of reaching the server).
    Captured,
    /// No connection either way (no route, timeout, netns gone): proves nothing.
    NoConnection,
}

/// Probe counts by verdict.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct VerdictCounts {
    /// Probes that reached the server directly.
    pub direct: u64,
    /// Probes that were redirected.
    pub captured: u64,
    /// Probes without a connection.
    pub no_connection: u64,
}

impl VerdictCounts {
    fn add(&mut self, v: Verdict) {
        match v {
            Verdict::Direct => self.direct += 1,
            Verdict::Captured => self.captured += 1,
            Verdict::NoConnection => self.no_connection += 1,
        }
    }

    /// Adds `other` to these counts.
    pub fn merge(&mut self, other: &VerdictCounts) {
        self.direct += other.direct;
        self.captured += other.captured;
        self.no_connection += other.no_connection;
    }

    /// Every probe counted.
    pub fn total(&self) -> u64 {
        self.direct + self.captured + self.no_connection
    }
}

/// How an exposure window ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Closed {
    /// A later probe found the sandbox captured (repaired).
    Captured,
    /// The sandbox was stopped or removed while exposed.
    Removed,
    /// Still exposed when the run ended.
    Open,
}

/// One stretch of time a sandbox ran exposed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Window {
    /// The last moment it was known not to be exposed: its creation, or its last
    /// captured probe before this window.
    pub start_ms: Ms,
    /// True when the window starts at the sandbox's creation (it never was captured
    /// before).
    pub from_creation: bool,
    /// The first probe that found it exposed.
    pub first_seen_ms: Ms,
    /// The last probe that found it exposed.
    pub last_seen_ms: Ms,
    /// When it ended (first captured probe or removal); the run's end while open.
    pub end_ms: Ms,
    /// How it ended.
    pub closed: Closed,
}

impl Window {
    /// The window's length, conservatively (from the last proof of safety to the first
    /// proof of it again).
    pub fn duration_ms(&self) -> Ms {
        self.end_ms.saturating_sub(self.start_ms)
    }
}

/// One sandbox as the checker saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SandboxRecord {
    /// The runtime's sandbox ID.
    pub id: String,
    /// Whether its annotations ask for the mesh.
    pub meshed: bool,
    /// Its creation time as the runtime reports it.
    pub created_ms: Ms,
    /// When the checker first saw it running.
    pub first_seen_ms: Ms,
    /// When it was stopped or removed (or no longer listed).
    pub gone_ms: Option<Ms>,
    /// What the probes found.
    pub probes: VerdictCounts,
    /// Every exposure window, the open one last.
    pub windows: Vec<Window>,
    #[serde(skip)]
    last_captured_ms: Option<Ms>,
    #[serde(skip)]
    open: bool,
}

impl SandboxRecord {
    fn open_window(&mut self) -> Option<&mut Window> {
        if self.open {
            self.windows.last_mut()
        } else {
            None
        }
    }
}

/// Every sandbox the checker saw, by ID.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    sandboxes: BTreeMap<String, SandboxRecord>,
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Ledger {
        Ledger::default()
    }

    /// Records that sandbox `id` runs (first sighting only; later calls change nothing).
    pub fn seen(&mut self, id: &str, meshed: bool, created_ms: Ms, now: Ms) {
        self.sandboxes
            .entry(id.to_string())
            .or_insert_with(|| SandboxRecord {
                id: id.to_string(),
                meshed,
                created_ms: created_ms.min(now),
                first_seen_ms: now,
                gone_ms: None,
                probes: VerdictCounts::default(),
                windows: Vec::new(),
                last_captured_ms: None,
                open: false,
            });
    }

    /// True when `id` was seen and is not gone.
    pub fn is_running(&self, id: &str) -> bool {
        self.sandboxes.get(id).is_some_and(|r| r.gone_ms.is_none())
    }

    /// Records one probe of `id` at `now` (ignored for an unknown or gone sandbox).
    pub fn observe(&mut self, id: &str, now: Ms, verdict: Verdict) {
        let Some(r) = self.sandboxes.get_mut(id) else {
            return;
        };
        if r.gone_ms.is_some() {
            return;
        }
        r.probes.add(verdict);
        match verdict {
            Verdict::Direct => {
                if let Some(w) = r.open_window() {
                    w.last_seen_ms = now;
                    w.end_ms = now;
                } else {
                    let (start_ms, from_creation) = match r.last_captured_ms {
                        Some(t) => (t, false),
                        None => (r.created_ms, true),
                    };
                    r.windows.push(Window {
                        start_ms,
                        from_creation,
                        first_seen_ms: now,
                        last_seen_ms: now,
                        end_ms: now,
                        closed: Closed::Open,
                    });
                    r.open = true;
                }
            }
            Verdict::Captured => {
                if let Some(w) = r.open_window() {
                    w.end_ms = now;
                    w.closed = Closed::Captured;
                }
                r.open = false;
                r.last_captured_ms = Some(now);
            }
            Verdict::NoConnection => {}
        }
    }

    /// Records that `id` was stopped or removed at `now`; an open window ends there.
    pub fn gone(&mut self, id: &str, now: Ms) {
        let Some(r) = self.sandboxes.get_mut(id) else {
            return;
        };
        if r.gone_ms.is_some() {
            return;
        }
        r.gone_ms = Some(now);
        if let Some(w) = r.open_window() {
            w.end_ms = now;
            w.closed = Closed::Removed;
        }
        r.open = false;
    }

    /// Stretches every open window to `now` (the run's end).
    pub fn finish(&mut self, now: Ms) {
        for r in self.sandboxes.values_mut() {
            if let Some(w) = r.open_window() {
                w.end_ms = w.end_ms.max(now);
            }
        }
    }

    /// Every record, by ID.
    pub fn records(&self) -> impl Iterator<Item = &SandboxRecord> {
        self.sandboxes.values()
    }

    /// The record of `id`.
    pub fn record(&self, id: &str) -> Option<&SandboxRecord> {
        self.sandboxes.get(id)
    }

    /// IDs of running meshed sandboxes whose last probe found them exposed.
    pub fn exposed_now(&self) -> Vec<String> {
        self.sandboxes
            .values()
            .filter(|r| r.meshed && r.gone_ms.is_none() && r.open)
            .map(|r| r.id.clone())
            .collect()
    }
}

/// One chaos step as it happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChaosSpan {
    /// Its number in the run (from 1).
    pub seq: u32,
    /// What it did.
    pub kind: ChaosKind,
    /// Its shape.
    pub variant: Variant,
    /// When it was applied.
    pub start_ms: Ms,
    /// When it was undone (`None`: never, e.g. the run ended first).
    pub undone_ms: Option<Ms>,
}

impl ChaosSpan {
    /// `#<seq> <kind>`, as exposures name their cause.
    pub fn label(&self) -> String {
        format!("#{} {}", self.seq, self.kind)
    }
}

/// What happened to the node during the run, for [`judge`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Timeline {
    /// Every chaos step, in order.
    pub chaos: Vec<ChaosSpan>,
    /// Stretches during which the agent answered ready, in order: `(from, until)`,
    /// `until` `None` while it still is.
    pub agent_ready: Vec<(Ms, Option<Ms>)>,
}

impl Timeline {
    /// The first moment at or after `t` when the agent was ready.
    pub fn ready_at_or_after(&self, t: Ms) -> Option<Ms> {
        self.agent_ready
            .iter()
            .find_map(|&(from, until)| match until {
                Some(u) if u <= t => None,
                _ => Some(from.max(t)),
            })
    }

    /// The stretches the agent was not ready, in order: `(from, until)`, `until` `None`
    /// when it never was ready again.
    pub fn not_ready(&self) -> Vec<(Ms, Option<Ms>)> {
        let mut gaps = Vec::new();
        let mut from = 0;
        for &(ready_from, ready_until) in &self.agent_ready {
            if ready_from > from {
                gaps.push((from, Some(ready_from)));
            }
            match ready_until {
                Some(u) => from = u,
                None => return gaps,
            }
        }
        gaps.push((from, None));
        gaps
    }

    /// The time a chain-changing step may keep interlock out of the runtime's chain:
    /// from its start until `settle_ms` after it was undone (the agent's convergence and
    /// the runtime's reload), stretched over every time the agent was not ready that
    /// began before then (an agent that was down, or backing off, could not converge),
    /// plus `settle_ms` after it. Open-ended when it was never undone or no ready agent
    /// followed.
    pub fn influence(&self, span: &ChaosSpan, settle_ms: Ms) -> (Ms, Option<Ms>) {
        let Some(undone) = span.undone_ms else {
            return (span.start_ms, None);
        };
        let mut end = undone + settle_ms;
        for (from, until) in self.not_ready() {
            if from > end {
                break;
            }
            match until {
                None => return (span.start_ms, None),
                Some(u) if u >= undone => end = end.max(u + settle_ms),
                Some(_) => {}
            }
        }
        (span.start_ms, Some(end))
    }

    /// What happened around `t`: the chaos steps that began in the 10 s before it (or
    /// up to 1 s after) and the agent's ready stretches then, in words.
    pub fn context(&self, t: Ms) -> String {
        let from = t.saturating_sub(10_000);
        let steps: Vec<String> = self
            .chaos
            .iter()
            .filter(|s| s.start_ms >= from && s.start_ms <= t + 1000)
            .map(|s| {
                format!(
                    "{} {:?} {}..{:?} ms",
                    s.label(),
                    s.variant,
                    s.start_ms,
                    s.undone_ms
                )
            })
            .collect();
        let ready: Vec<String> = self
            .agent_ready
            .iter()
            .filter(|(f, u)| u.is_none_or(|u| u >= from) && *f <= t + 3000)
            .map(|(f, u)| format!("{f}..{u:?}"))
            .collect();
        format!(
            "chaos steps around it: [{}]; agent ready: [{}]",
            steps.join(", "),
            ready.join(", ")
        )
    }
}

/// Settings of [`judge`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Budget {
    /// How long after the agent is ready (or after the sandbox started, if later) an
    /// exposed meshed sandbox may stay exposed: 2 s plus the audit interval.
    pub repair_ms: Ms,
    /// Time the agent and the runtime get to converge after a chain change is undone.
    pub settle_ms: Ms,
}

/// A meshed sandbox's exposure window, judged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Exposure {
    /// The sandbox.
    pub sandbox: String,
    /// The window.
    pub window: Window,
    /// Its length (conservative).
    pub duration_ms: Ms,
    /// The chain-changing chaos steps that overlapped the window's start (the reason
    /// the sandbox started without its rules), as `#<seq> <kind>`.
    pub causes: Vec<String>,
    /// The kinds of those steps.
    #[serde(skip)]
    pub cause_kinds: Vec<ChaosKind>,
    /// When the agent was ready at or after the window's start.
    pub agent_ready_ms: Option<Ms>,
    /// The latest end the repair budget allows.
    pub deadline_ms: Option<Ms>,
    /// True when it ended (captured or removed) by the deadline.
    pub within_budget: bool,
    /// True when a chain-changing step explains it.
    pub explained: bool,
}

/// A broken invariant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// Which invariant: `exposed_beyond_budget`, `unexplained_exposure`,
    /// `protection_lost`, `left_unprotected`, `leak`, `checker_blind`, `vacuous`, ….
    pub invariant: String,
    /// What and where, in words.
    pub detail: String,
}

impl Violation {
    /// A violation of `invariant`.
    pub fn new(invariant: &str, detail: impl Into<String>) -> Violation {
        Violation {
            invariant: invariant.to_string(),
            detail: detail.into(),
        }
    }
}

/// Judges every window of every meshed sandbox; returns the exposures and the broken
/// invariants (exposure-related only; leaks and the final check are added by the run).
pub fn judge(
    ledger: &Ledger,
    timeline: &Timeline,
    budget: Budget,
) -> (Vec<Exposure>, Vec<Violation>) {
    let mut exposures = Vec::new();
    let mut violations = Vec::new();
    for r in ledger.records().filter(|r| r.meshed) {
        for w in &r.windows {
            // When the sandbox's chain ran: from its creation to its first sighting.
            // For a window after a captured probe, the moment protection was lost.
            let (from, until) = if w.from_creation {
                (r.created_ms, r.first_seen_ms)
            } else {
                (w.start_ms, w.first_seen_ms)
            };
            let causing: Vec<&ChaosSpan> = timeline
                .chaos
                .iter()
                .filter(|s| s.kind.touches_the_chain())
                .filter(|s| {
                    let (start, end) = timeline.influence(s, budget.settle_ms);
                    start <= until && end.is_none_or(|e| e >= from)
                })
                .collect();
            let agent_ready_ms = timeline.ready_at_or_after(w.start_ms);
            let deadline_ms = agent_ready_ms.map(|t| t + budget.repair_ms);
            let within_budget = match (w.closed, deadline_ms) {
                (Closed::Open, _) => false,
                (_, Some(d)) => w.end_ms <= d,
                // Removed before any agent was ready again.
                (Closed::Removed, None) => true,
                (Closed::Captured, None) => false,
            };
            let explained = w.from_creation && !causing.is_empty();
            let e = Exposure {
                sandbox: r.id.clone(),
                window: *w,
                duration_ms: w.duration_ms(),
                causes: causing.iter().map(|s| s.label()).collect(),
                cause_kinds: causing.iter().map(|s| s.kind).collect(),
                agent_ready_ms,
                deadline_ms,
                within_budget,
                explained,
            };
            let at = format!(
                "meshed sandbox {} exposed from {} ms (first seen {} ms) to {} ms ({:?}, {} ms)",
                r.id, w.start_ms, w.first_seen_ms, w.end_ms, w.closed, e.duration_ms
            );
            if !w.from_creation {
                violations.push(Violation::new(
                    "protection_lost",
                    format!("{at}: it had been seen captured before"),
                ));
            } else if !explained {
                violations.push(Violation::new(
                    "unexplained_exposure",
                    format!(
                        "{at}: no chain-changing chaos step overlapped its creation; {}",
                        timeline.context(w.start_ms)
                    ),
                ));
            }
            if w.closed != Closed::Open && !within_budget {
                violations.push(Violation::new(
                    "exposed_beyond_budget",
                    format!(
                        "{at}: agent ready at {:?} ms, deadline {:?} ms (repair budget {} ms)",
                        agent_ready_ms, deadline_ms, budget.repair_ms
                    ),
                ));
            }
            exposures.push(e);
        }
    }
    (exposures, violations)
}

/// The `q`-quantile (0..=1, nearest rank) of `values`; `None` when empty.
pub fn quantile(values: &[Ms], q: f64) -> Option<Ms> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_unstable();
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Some(v[rank - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUDGET: Budget = Budget {
        repair_ms: 2500,
        settle_ms: 500,
    };

    fn span(seq: u32, kind: ChaosKind, start: Ms, undone: Option<Ms>) -> ChaosSpan {
        ChaosSpan {
            seq,
            kind,
            variant: Variant::Plain,
            start_ms: start,
            undone_ms: undone,
        }
    }

    fn always_ready() -> Timeline {
        Timeline {
            chaos: Vec::new(),
            agent_ready: vec![(0, None)],
        }
    }

    #[test]
    fn a_sandbox_always_captured_has_no_window() {
        let mut l = Ledger::new();
        l.seen("a", true, 100, 150);
        for t in [200, 450, 700] {
            l.observe("a", t, Verdict::Captured);
        }
        l.observe("a", 950, Verdict::NoConnection);
        l.gone("a", 1000);
        let r = l.record("a").unwrap();
        assert!(r.windows.is_empty());
        assert_eq!(r.probes.captured, 3);
        assert_eq!(r.probes.no_connection, 1);
        assert_eq!(r.gone_ms, Some(1000));
        let (e, v) = judge(&l, &always_ready(), BUDGET);
        assert!(e.is_empty() && v.is_empty(), "{e:?} {v:?}");
    }

    #[test]
    fn a_window_from_creation_ends_at_the_first_captured_probe() {
        let mut l = Ledger::new();
        l.seen("a", true, 1000, 1100);
        l.observe("a", 1200, Verdict::Direct);
        l.observe("a", 1450, Verdict::NoConnection);
        l.observe("a", 1700, Verdict::Direct);
        l.observe("a", 1950, Verdict::Captured);
        l.observe("a", 2200, Verdict::Captured);
        let w = l.record("a").unwrap().windows.clone();
        assert_eq!(
            w,
            vec![Window {
                start_ms: 1000,
                from_creation: true,
                first_seen_ms: 1200,
                last_seen_ms: 1700,
                end_ms: 1950,
                closed: Closed::Captured,
            }]
        );
        assert_eq!(w[0].duration_ms(), 950);
        assert!(l.exposed_now().is_empty());
    }

    #[test]
    fn a_second_window_starts_at_the_last_captured_probe_and_is_protection_lost() {
        let mut l = Ledger::new();
        l.seen("a", true, 0, 10);
        l.observe("a", 100, Verdict::Captured);
        l.observe("a", 350, Verdict::Captured);
        l.observe("a", 600, Verdict::Direct);
        l.observe("a", 850, Verdict::Captured);
        let r = l.record("a").unwrap();
        assert_eq!(r.windows.len(), 1);
        assert_eq!(r.windows[0].start_ms, 350);
        assert!(!r.windows[0].from_creation);
        let mut t = always_ready();
        // Even with a chain change going on, rules that were there do not vanish.
        t.chaos
            .push(span(1, ChaosKind::PrimaryRewrite, 300, Some(400)));
        let (e, v) = judge(&l, &t, BUDGET);
        assert_eq!(e.len(), 1);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].invariant, "protection_lost");
    }

    #[test]
    fn removal_closes_an_open_window_and_later_probes_are_ignored() {
        let mut l = Ledger::new();
        l.seen("a", true, 0, 10);
        l.observe("a", 100, Verdict::Direct);
        assert_eq!(l.exposed_now(), vec!["a".to_string()]);
        l.gone("a", 300);
        l.observe("a", 350, Verdict::Direct);
        l.gone("a", 900);
        let r = l.record("a").unwrap();
        assert_eq!(r.gone_ms, Some(300));
        assert_eq!(r.probes.direct, 1);
        assert_eq!(r.windows[0].closed, Closed::Removed);
        assert_eq!(r.windows[0].end_ms, 300);
        assert!(l.exposed_now().is_empty());
        assert!(!l.is_running("a"));
    }

    #[test]
    fn an_open_window_lasts_until_the_end_and_breaks_no_budget_rule_by_itself() {
        let mut l = Ledger::new();
        l.seen("a", true, 0, 10);
        l.observe("a", 100, Verdict::Direct);
        l.finish(5000);
        let w = l.record("a").unwrap().windows[0];
        assert_eq!((w.end_ms, w.closed), (5000, Closed::Open));
        let mut t = always_ready();
        t.chaos.push(span(1, ChaosKind::ConfigAhead, 0, Some(50)));
        let (e, v) = judge(&l, &t, BUDGET);
        assert!(!e[0].within_budget);
        // Left-unprotected is the run's final check, not this one's.
        assert!(v.is_empty(), "{v:?}");
        assert_eq!(l.exposed_now(), vec!["a".to_string()]);
    }

    #[test]
    fn a_chain_change_overlapping_the_creation_explains_an_exposure_within_budget() {
        let mut l = Ledger::new();
        l.seen("a", true, 1000, 1300);
        l.observe("a", 1400, Verdict::Direct);
        l.observe("a", 2000, Verdict::Captured);
        let mut t = always_ready();
        t.chaos
            .push(span(4, ChaosKind::PrimaryRewrite, 900, Some(1100)));
        t.chaos.push(span(5, ChaosKind::AgentKill, 950, Some(1000)));
        let (e, v) = judge(&l, &t, BUDGET);
        assert!(v.is_empty(), "{v:?}");
        assert_eq!(e[0].causes, vec!["#4 primary_rewrite".to_string()]);
        assert!(e[0].explained && e[0].within_budget);
        assert_eq!(e[0].deadline_ms, Some(1000 + 2500));
        assert_eq!(e[0].duration_ms, 1000);
    }

    #[test]
    fn a_change_undone_before_the_creation_still_explains_it_until_the_agent_settled() {
        let mut l = Ledger::new();
        l.seen("a", true, 2000, 2100);
        l.observe("a", 2200, Verdict::Direct);
        l.observe("a", 2400, Verdict::Captured);
        // Undone at 1000, but the agent was down until 1800: influence until 2300.
        let t = Timeline {
            chaos: vec![span(1, ChaosKind::PrimaryDelete, 500, Some(1000))],
            agent_ready: vec![(0, Some(700)), (1800, None)],
        };
        let (e, v) = judge(&l, &t, BUDGET);
        assert!(v.is_empty(), "{v:?}");
        assert!(e[0].explained);
        // With the agent ready at 900 the step's influence ended at 1500: unexplained.
        let t = Timeline {
            chaos: t.chaos.clone(),
            agent_ready: vec![(0, Some(700)), (900, None)],
        };
        let (_, v) = judge(&l, &t, BUDGET);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].invariant, "unexplained_exposure");
    }

    #[test]
    fn steps_that_leave_the_chain_alone_explain_nothing() {
        for kind in [
            ChaosKind::AgentKill,
            ChaosKind::PluginDelete,
            ChaosKind::ContainerdRestart,
        ] {
            let mut l = Ledger::new();
            l.seen("a", true, 1000, 1100);
            l.observe("a", 1200, Verdict::Direct);
            l.observe("a", 1500, Verdict::Captured);
            let mut t = always_ready();
            t.chaos.push(span(1, kind, 900, Some(1300)));
            let (e, v) = judge(&l, &t, BUDGET);
            assert!(e[0].causes.is_empty(), "{kind}");
            assert_eq!(v.len(), 1, "{kind}: {v:?}");
            assert_eq!(v[0].invariant, "unexplained_exposure");
        }
    }

    #[test]
    fn the_budget_runs_from_the_agent_becoming_ready_again() {
        let mut l = Ledger::new();
        l.seen("a", true, 1000, 1100);
        l.observe("a", 1200, Verdict::Direct);
        l.observe("a", 6000, Verdict::Captured);
        let mut t = Timeline {
            chaos: vec![span(1, ChaosKind::PrimaryRewrite, 900, Some(1000))],
            agent_ready: vec![(0, Some(950)), (4000, None)],
        };
        let (e, v) = judge(&l, &t, BUDGET);
        assert_eq!(e[0].agent_ready_ms, Some(4000));
        assert_eq!(e[0].deadline_ms, Some(6500));
        assert!(e[0].within_budget && v.is_empty(), "{v:?}");
        // Ready all along: 5 s exposed is beyond the budget.
        t.agent_ready = vec![(0, None)];
        let (e, v) = judge(&l, &t, BUDGET);
        assert!(!e[0].within_budget);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].invariant, "exposed_beyond_budget");
        // Never ready again: a window closed by capture cannot be within budget.
        t.agent_ready = vec![(0, Some(950))];
        let (e, _) = judge(&l, &t, BUDGET);
        assert!(!e[0].within_budget);
    }

    #[test]
    fn removal_before_the_agent_returned_is_within_budget() {
        let mut l = Ledger::new();
        l.seen("a", true, 1000, 1100);
        l.observe("a", 1200, Verdict::Direct);
        l.gone("a", 1800);
        let t = Timeline {
            chaos: vec![span(1, ChaosKind::ConfigAhead, 900, Some(1500))],
            agent_ready: vec![(0, Some(950))],
        };
        let (e, v) = judge(&l, &t, BUDGET);
        assert!(e[0].within_budget, "{e:?}");
        assert!(v.is_empty(), "{v:?}");
    }

    #[test]
    fn plain_sandboxes_are_probed_but_never_judged() {
        let mut l = Ledger::new();
        l.seen("p", false, 0, 10);
        l.observe("p", 100, Verdict::Direct);
        assert_eq!(l.record("p").unwrap().probes.direct, 1);
        let (e, v) = judge(&l, &always_ready(), BUDGET);
        assert!(e.is_empty() && v.is_empty());
        assert!(l.exposed_now().is_empty());
    }

    #[test]
    fn a_creation_time_after_the_first_sighting_is_clamped() {
        let mut l = Ledger::new();
        // Clocks differ by a few ms: the runtime's stamp may land after our sighting.
        l.seen("a", true, 500, 480);
        l.seen("a", false, 0, 900);
        let r = l.record("a").unwrap();
        assert_eq!((r.created_ms, r.first_seen_ms, r.meshed), (480, 480, true));
        l.observe("unknown", 10, Verdict::Direct);
        assert!(l.record("unknown").is_none());
    }

    #[test]
    fn readiness_lookups() {
        let t = Timeline {
            chaos: Vec::new(),
            agent_ready: vec![(100, Some(200)), (500, None)],
        };
        assert_eq!(t.ready_at_or_after(0), Some(100));
        assert_eq!(t.ready_at_or_after(150), Some(150));
        assert_eq!(t.ready_at_or_after(200), Some(500));
        assert_eq!(t.ready_at_or_after(900), Some(900));
        let never = Timeline {
            chaos: Vec::new(),
            agent_ready: vec![(100, Some(200))],
        };
        assert_eq!(never.ready_at_or_after(300), None);
        let s = span(1, ChaosKind::PrimaryDelete, 50, Some(150));
        assert_eq!(t.influence(&s, 10), (50, Some(160)));
        let never_undone = span(2, ChaosKind::PrimaryDelete, 50, None);
        assert_eq!(t.influence(&never_undone, 10), (50, None));
        assert_eq!(t.not_ready(), vec![(0, Some(100)), (200, Some(500))]);
        assert_eq!(never.not_ready(), vec![(0, Some(100)), (200, None)]);
        // Undone at 150 while ready; not ready from 200 (within the settle time of
        // 100) until 500: the step's influence lasts until 600.
        assert_eq!(t.influence(&s, 100), (50, Some(600)));
        // Undone at 150 with the agent never ready again: open-ended.
        assert_eq!(never.influence(&s, 100), (50, None));
        let with_step = Timeline {
            chaos: vec![s.clone()],
            ..t.clone()
        };
        let c = with_step.context(160);
        assert!(
            c.contains("#1 primary_delete") && c.contains("100..Some(200)"),
            "{c}"
        );
    }

    #[test]
    fn an_agent_that_backs_off_after_a_change_extends_its_influence() {
        // Rewritten 1000..2000; the agent still answered ready at 2000 but went not
        // ready at 2300 (backing off) until 4000: a creation at 4200 is explained.
        let mut l = Ledger::new();
        l.seen("a", true, 4200, 4300);
        l.observe("a", 4400, Verdict::Direct);
        l.observe("a", 4900, Verdict::Captured);
        let t = Timeline {
            chaos: vec![span(1, ChaosKind::PrimaryRewrite, 1000, Some(2000))],
            agent_ready: vec![(0, Some(2300)), (4000, None)],
        };
        let (e, v) = judge(&l, &t, BUDGET);
        assert!(v.is_empty(), "{v:?}");
        assert!(e[0].explained);
        // Not ready only from 2600, after the settle time: not this step's doing.
        let t = Timeline {
            chaos: t.chaos.clone(),
            agent_ready: vec![(0, Some(2600)), (4000, None)],
        };
        let (_, v) = judge(&l, &t, BUDGET);
        assert_eq!(v[0].invariant, "unexplained_exposure");
        assert!(
            v[0].detail.contains("#1 primary_rewrite"),
            "{}",
            v[0].detail
        );
    }

    #[test]
    fn quantiles_by_nearest_rank() {
        assert_eq!(quantile(&[], 0.5), None);
        let v = [5, 1, 4, 2, 3];
        assert_eq!(quantile(&v, 0.5), Some(3));
        assert_eq!(quantile(&v, 1.0), Some(5));
        assert_eq!(quantile(&v, 0.0), Some(1));
        assert_eq!(quantile(&[7], 0.99), Some(7));
    }
}

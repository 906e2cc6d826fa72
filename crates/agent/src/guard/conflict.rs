//! Conflicts with another writer: when one is, when repeated ones are a *fight*, and how
//! long the guard backs off.
//!
//! A *conflict* is a repair needed on a file that someone else changed since we left
//! it, taking interlock out of it ([`conflicting_files`]). More than `threshold`
//! conflicts on one file within `window` are a *fight*: another writer undoes every
//! change interlock makes (a primary in exclusive mode, such as Cilium's default
//! `cni.exclusive`, removes every config but its own; or a second interlock with other
//! flags). A fight trips a back-off: the file is left alone for [`INITIAL_BACKOFF`];
//! while the fight goes on, the first conflict after each back-off trips the next one at
//! once, twice as long, up to [`MAX_BACKOFF`] — so over any period the conflicts are
//! bounded by the back-offs, whatever the other writer's pace. A fight is over once the
//! file was left alone for `forgive_after` after its last conflict and its back-off
//! (time in back-off does not count: nothing of ours is there to undo), and its back-off
//! starts again from the first step. Until then the agent is not ready (the config it needs cannot stay: fail
//! closed). Time is passed in, so all of this is pure.

use crate::guard::plan::{self, Plan};
use interlock_confdir::Snapshot;
use serde_json::{Map, Value};
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// First back-off period.
pub const INITIAL_BACKOFF: Duration = Duration::from_secs(1);
/// Longest back-off period (the cap of the doubling).
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Default: a file left alone by other writers this long is forgiven (the fight is over,
/// back-off resets).
pub const FORGIVE_AFTER: Duration = Duration::from_secs(60);

/// When the fight over `f` ends if no conflict comes first.
fn fight_end(f: &FileConflicts, forgive_after: Duration) -> Option<Instant> {
    let last = f.last_conflict?;
    Some(f.backoff_until.map_or(last, |b| b.max(last)) + forgive_after)
}

#[derive(Debug, Default)]
struct FileConflicts {
    conflicts: VecDeque<Instant>,
    backoff_until: Option<Instant>,
    next_backoff: Option<Duration>,
    last_conflict: Option<Instant>,
    /// True from the trip that starts a fight until it is forgiven.
    fighting: bool,
    total: u64,
    trips: u64,
}

/// Per-file conflict counting, fights and back-off.
#[derive(Debug)]
pub struct ConflictTracker {
    window: Duration,
    threshold: u32,
    forgive_after: Duration,
    files: HashMap<String, FileConflicts>,
}

/// What recording a conflict decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Keep repairing.
    Repair,
    /// Back off from this file for `wait`; `new_fight` when this conflict started the
    /// fight (the first trip since the file was last forgiven).
    BackOff {
        /// How long the file is left alone.
        wait: Duration,
        /// This trip starts a fight.
        new_fight: bool,
    },
}

impl ConflictTracker {
    /// More than `threshold` conflicts within `window` start a fight (`threshold == 0`:
    /// never); a file left alone for `forgive_after` ends it.
    pub fn new(window: Duration, threshold: u32, forgive_after: Duration) -> ConflictTracker {
        ConflictTracker {
            window,
            threshold,
            forgive_after,
            files: HashMap::new(),
        }
    }

    /// Records that someone else took interlock out of `file` at `now`.
    pub fn record_conflict(&mut self, file: &str, now: Instant) -> Verdict {
        let forgive_after = self.forgive_after;
        let f = self.files.entry(file.to_string()).or_default();
        if fight_end(f, forgive_after).is_some_and(|end| now > end) {
            f.next_backoff = None;
            f.fighting = false;
        }
        f.last_conflict = Some(now);
        f.total += 1;
        f.conflicts.push_back(now);
        while f
            .conflicts
            .front()
            .is_some_and(|t| now.duration_since(*t) > self.window)
        {
            f.conflicts.pop_front();
        }
        if self.threshold == 0 || (!f.fighting && (f.conflicts.len() as u32) <= self.threshold) {
            return Verdict::Repair;
        }
        let wait = f.next_backoff.unwrap_or(INITIAL_BACKOFF);
        f.next_backoff = Some((wait * 2).min(MAX_BACKOFF));
        f.backoff_until = Some(now + wait);
        f.conflicts.clear();
        f.trips += 1;
        let new_fight = !f.fighting;
        f.fighting = true;
        Verdict::BackOff { wait, new_fight }
    }

    /// True while `file` is in back-off at `now`.
    pub fn in_backoff(&self, file: &str, now: Instant) -> bool {
        self.files
            .get(file)
            .and_then(|f| f.backoff_until)
            .is_some_and(|t| now < t)
    }

    /// Files currently in back-off, with when it ends.
    pub fn backing_off(&self, now: Instant) -> Vec<(String, Instant)> {
        let mut v: Vec<_> = self
            .files
            .iter()
            .filter_map(|(n, f)| f.backoff_until.filter(|t| now < *t).map(|t| (n.clone(), t)))
            .collect();
        v.sort();
        v
    }

    /// True while `file` is in a fight at `now` (tripped, and not yet left alone for
    /// the forgiveness period).
    pub fn in_fight(&self, file: &str, now: Instant) -> bool {
        self.files.get(file).is_some_and(|f| self.fights(f, now))
    }

    fn fights(&self, f: &FileConflicts, now: Instant) -> bool {
        f.fighting && fight_end(f, self.forgive_after).is_some_and(|end| now <= end)
    }

    /// Files in a fight at `now`, with when it ends if no conflict comes before.
    pub fn fighting(&self, now: Instant) -> Vec<(String, Instant)> {
        let mut v: Vec<_> = self
            .files
            .iter()
            .filter(|(_, f)| self.fights(f, now))
            .filter_map(|(n, f)| Some((n.clone(), fight_end(f, self.forgive_after)?)))
            .collect();
        v.sort();
        v
    }

    /// Ends the fights that were forgiven by `now` and returns their files (each once).
    pub fn take_ended(&mut self, now: Instant) -> Vec<String> {
        let forgive_after = self.forgive_after;
        let mut v: Vec<String> = self
            .files
            .iter_mut()
            .filter(|(_, f)| f.fighting && fight_end(f, forgive_after).is_some_and(|end| now > end))
            .map(|(n, f)| {
                f.fighting = false;
                f.next_backoff = None;
                n.clone()
            })
            .collect();
        v.sort();
        v
    }

    /// Conflicts and back-offs per file (for metrics).
    pub fn conflict_counts(&self) -> Vec<(String, u64, u64)> {
        let mut v: Vec<_> = self
            .files
            .iter()
            .map(|(n, f)| (n.clone(), f.total, f.trips))
            .collect();
        v.sort();
        v
    }
}

/// Known primaries that remove other configs, by the plugin type their config runs:
/// what to tell the operator.
const EXCLUSIVE_PRIMARIES: &[(&str, &str)] = &[(
    "cilium-cni",
    "Cilium removes or renames (*.cilium_bak) every other CNI config while its \
     cni.exclusive setting is true, the default: set cni.exclusive=false (Helm \
     --set cni.exclusive=false, or cni-exclusive: \"false\" in the cilium-config \
     ConfigMap) and restart the Cilium agents",
)];

/// What to do about a fight with a primary whose chain runs `types` (the first is the
/// primary's), with the docs anchor: Cilium's `cni.exclusive` named when it is Cilium.
pub fn fight_hint(types: &[String]) -> String {
    let known = types
        .iter()
        .find_map(|t| EXCLUSIVE_PRIMARIES.iter().find(|(k, _)| k == t));
    let what = match (known, types.first()) {
        (Some((_, hint)), _) => (*hint).to_string(),
        (None, Some(t)) => format!(
            "find the writer that removes or rewrites interlock's config: most likely the \
             primary CNI ({t}) or its installer, configured to own the conf dir alone (make \
             it leave other configs in place), or a second interlock agent with other flags"
        ),
        (None, None) => "find the writer that removes or rewrites interlock's config: \
             another CNI installer, or a second interlock agent with other flags"
            .to_string(),
    };
    format!("{what}; see docs/install.md#primaries-that-remove-other-configs")
}

/// The files `plan` must touch that someone else changed since we left them (`left`:
/// what we last wrote, `None` for "we removed it") in a way that takes `entry` out: each
/// is a conflict. A file that changed but still runs our entry (a twin agent, a primary
/// update we already followed) is not one.
pub fn conflicting_files<'p>(
    plan: &'p Plan,
    snap: &Snapshot,
    left: &HashMap<String, Option<Vec<u8>>>,
    entry: &Map<String, Value>,
) -> Vec<&'p str> {
    let mut out: Vec<&str> = vec![];
    for a in &plan.actions {
        let f = a.file();
        let Some(expected) = left.get(f) else {
            continue;
        };
        let current = snap.get(f);
        let bytes = current.map(|e| e.content.as_deref().unwrap_or_default());
        let still_ours = current.is_some_and(|e| {
            e.parse()
                .is_ok_and(|p| plan::runs_entry(&p, f, entry).is_ok())
        });
        if bytes != expected.as_deref() && !still_ours && !out.contains(&f) {
            out.push(f);
        }
    }
    out
}

/// Guard mode's conflicts among the files `plan` touches: a file of ours that someone
/// deleted, or that no longer runs `interlock-cni` (nor parses). The mesh's installer
/// adding, replacing or removing its own entry (of type `t_type`) in the guard file keeps
/// `interlock-cni` there and is no conflict: it is the converging writer. An installer
/// that puts its entry back while the guard holds is converged with, not fought: the
/// plan keeps its entry from then on ([`plan::GuardInput::installer_put_t_back`]). Only a
/// plan that would strip it again (the flag not raised) counts that as a conflict, so a
/// loop the planner failed to see still trips the usual back-off.
pub fn guard_conflicting_files<'p>(
    plan: &'p Plan,
    snap: &Snapshot,
    left: &HashMap<String, Option<Vec<u8>>>,
    t_type: &str,
) -> Vec<&'p str> {
    let mut out: Vec<&str> = vec![];
    for a in &plan.actions {
        let f = a.file();
        let Some(expected) = left.get(f) else {
            continue;
        };
        let current = snap.get(f);
        let bytes = current.map(|e| e.content.as_deref().unwrap_or_default());
        if bytes == expected.as_deref() || out.contains(&f) {
            continue;
        }
        let has = plan::runs_type;
        let now = bytes.unwrap_or_default();
        let keeps_ours = current.is_some() && has(now, plan::PLUGIN_TYPE);
        let planned_t = a.leaves().is_some_and(|b| has(b, t_type));
        let left_t = expected.as_deref().is_some_and(|b| has(b, t_type));
        let put_back = a.leaves().is_some() && !planned_t && !left_t && has(now, t_type);
        if !keeps_ours || put_back {
            out.push(f);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracker(window_ms: u64, threshold: u32) -> ConflictTracker {
        ConflictTracker::new(Duration::from_millis(window_ms), threshold, FORGIVE_AFTER)
    }

    fn back_off(wait: Duration, new_fight: bool) -> Verdict {
        Verdict::BackOff { wait, new_fight }
    }

    #[test]
    fn a_fight_trips_after_threshold_then_every_conflict_doubles_up_to_the_cap() {
        let mut t = tracker(1000, 3);
        let t0 = Instant::now();
        for i in 0..3 {
            assert_eq!(
                t.record_conflict("a", t0 + Duration::from_millis(i)),
                Verdict::Repair
            );
        }
        assert!(!t.in_fight("a", t0));
        assert_eq!(
            t.record_conflict("a", t0 + Duration::from_millis(3)),
            back_off(INITIAL_BACKOFF, true)
        );
        assert!(t.in_fight("a", t0 + Duration::from_millis(3)));
        assert!(t.in_backoff("a", t0 + Duration::from_millis(500)));
        assert!(!t.in_backoff("b", t0));
        assert!(!t.in_backoff("a", t0 + Duration::from_millis(1004)));
        // In the fight, the first conflict after each back-off trips the next one,
        // twice as long, up to the cap: no threshold to reach again.
        let mut now = t0 + Duration::from_secs(2);
        let mut want = INITIAL_BACKOFF * 2;
        for _ in 0..8 {
            assert_eq!(t.record_conflict("a", now), back_off(want, false));
            now += want;
            want = (want * 2).min(MAX_BACKOFF);
        }
        assert_eq!(want, MAX_BACKOFF);
        assert_eq!(t.conflict_counts(), vec![("a".to_string(), 12, 9)]);
        assert_eq!(t.fighting(now).len(), 1);
    }

    #[test]
    fn conflicts_are_bounded_by_the_back_offs_whatever_the_pace() {
        // Another writer undoing every write at once: the guard writes whenever it is
        // not backing off, and each write is undone 1 ms later.
        let mut t = tracker(30_000, 5);
        let t0 = Instant::now();
        let mut now = t0;
        let mut conflicts = 0;
        while now < t0 + Duration::from_secs(60) {
            if !t.in_backoff("a", now) {
                now += Duration::from_millis(1);
                conflicts += 1;
                t.record_conflict("a", now);
            } else {
                now += Duration::from_millis(10);
            }
        }
        // 6 to start the fight, then one per back-off of 1, 2, 4, 8, 16, 30 s.
        assert!(conflicts <= 6 + 6, "{conflicts} conflicts in 60 s");
    }

    #[test]
    fn slow_conflicts_never_trip_and_zero_disables() {
        let mut t = tracker(1000, 3);
        let t0 = Instant::now();
        for i in 0..100 {
            assert_eq!(
                t.record_conflict("a", t0 + Duration::from_millis(400 * i)),
                Verdict::Repair
            );
        }
        let mut off = tracker(1000, 0);
        for i in 0..100 {
            assert_eq!(
                off.record_conflict("a", t0 + Duration::from_micros(i)),
                Verdict::Repair
            );
        }
        assert!(off.fighting(t0 + Duration::from_micros(100)).is_empty());
    }

    #[test]
    fn a_fight_is_forgiven_after_a_quiet_period_and_starts_over() {
        let mut t = tracker(1000, 1);
        let t0 = Instant::now();
        t.record_conflict("a", t0);
        assert_eq!(t.record_conflict("a", t0), back_off(INITIAL_BACKOFF, true));
        assert_eq!(
            t.record_conflict("a", t0 + Duration::from_secs(2)),
            back_off(INITIAL_BACKOFF * 2, false)
        );
        // Quiet from the end of the 2 s back-off on.
        let quiet = t0 + Duration::from_secs(4) + FORGIVE_AFTER;
        assert_eq!(t.fighting(quiet).len(), 1, "still within the period");
        assert!(t.take_ended(quiet).is_empty());
        let later = quiet + Duration::from_millis(1);
        assert!(!t.in_fight("a", later));
        assert_eq!(t.take_ended(later), ["a"]);
        assert!(t.take_ended(later).is_empty(), "ended once");
        // A new fight needs the threshold again and starts from the first step.
        assert_eq!(t.record_conflict("a", later), Verdict::Repair);
        assert_eq!(
            t.record_conflict("a", later),
            back_off(INITIAL_BACKOFF, true)
        );
        assert_eq!(
            t.backing_off(later),
            vec![("a".to_string(), later + INITIAL_BACKOFF)]
        );
    }

    #[test]
    fn the_hint_names_cilium_exclusive_for_cilium_and_the_primary_otherwise() {
        let cilium = fight_hint(&["cilium-cni".to_string()]);
        assert!(cilium.contains("cni.exclusive=false"), "{cilium}");
        assert!(cilium.contains("docs/install.md#"), "{cilium}");
        let other = fight_hint(&["acme-cni".to_string(), "portmap".to_string()]);
        assert!(
            other.contains("(acme-cni)") && !other.contains("cilium"),
            "{other}"
        );
        assert!(fight_hint(&[]).contains("second interlock agent"));
    }
}

#[cfg(test)]
mod conflicting_files_tests {
    use super::*;
    use crate::guard::plan::Action;
    use std::path::Path;

    fn entry() -> Map<String, Value> {
        crate::plugin_entry(Path::new("/run/il"))
    }

    fn with_entry(e: &Map<String, Value>) -> String {
        serde_json::json!({"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"}, e]})
            .to_string()
    }

    const PRIMARY: &str = r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"}]}"#;

    fn write_plan(name: &str) -> Plan {
        Plan {
            actions: vec![Action::Write {
                name: name.into(),
                bytes: b"x".to_vec(),
                mode: 0o644,
            }],
            ..Plan::default()
        }
    }

    #[test]
    fn a_conflict_is_someone_taking_our_entry_out_of_a_file_we_left() {
        let e = entry();
        let ours = with_entry(&e);
        let mut left = HashMap::new();
        left.insert(
            "00-interlock.conflist".to_string(),
            Some(ours.clone().into_bytes()),
        );
        let plan = write_plan("00-interlock.conflist");
        // Overwritten without our entry: a conflict.
        let snap = Snapshot::from_files(&[("00-interlock.conflist", PRIMARY)], 0o644);
        assert_eq!(
            conflicting_files(&plan, &snap, &left, &e),
            ["00-interlock.conflist"]
        );
        // Deleted: a conflict.
        let empty = Snapshot::from_files(&[], 0o644);
        assert_eq!(conflicting_files(&plan, &empty, &left, &e).len(), 1);
        // Changed but still ours (reformatted by a twin): not a conflict.
        let pretty =
            serde_json::to_string_pretty(&serde_json::from_str::<Value>(&ours).unwrap()).unwrap();
        let snap = Snapshot::from_files(&[("00-interlock.conflist", pretty.as_str())], 0o644);
        assert!(conflicting_files(&plan, &snap, &left, &e).is_empty());
        // Unchanged since we left it: not a conflict.
        let snap = Snapshot::from_files(&[("00-interlock.conflist", ours.as_str())], 0o644);
        assert!(conflicting_files(&plan, &snap, &left, &e).is_empty());
        // A file we never touched: not a conflict, whatever it holds.
        let other = write_plan("10-x.conflist");
        let snap = Snapshot::from_files(&[("10-x.conflist", PRIMARY)], 0o644);
        assert!(conflicting_files(&other, &snap, &left, &e).is_empty());
    }

    #[test]
    fn many_conflicts_back_off_and_the_file_stays_named() {
        // The rule the guard runs: conflicts recorded per reconcile until the tracker
        // backs off; while it does, the file is left alone.
        let e = entry();
        let mut left = HashMap::new();
        left.insert(
            "00-interlock.conflist".to_string(),
            Some(with_entry(&e).into_bytes()),
        );
        let plan = write_plan("00-interlock.conflist");
        let snap = Snapshot::from_files(&[("00-interlock.conflist", PRIMARY)], 0o644);
        let mut t = ConflictTracker::new(Duration::from_secs(1), 20, FORGIVE_AFTER);
        let t0 = Instant::now();
        let mut backed_off_at = None;
        for i in 0..30u64 {
            let now = t0 + Duration::from_millis(i * 10);
            for f in conflicting_files(&plan, &snap, &left, &e) {
                if !t.in_backoff(f, now) {
                    if let Verdict::BackOff { .. } = t.record_conflict(f, now) {
                        backed_off_at.get_or_insert(i);
                    }
                }
            }
        }
        assert_eq!(
            backed_off_at,
            Some(20),
            "the 21st conflict within 1 s backs off"
        );
        let now = t0 + Duration::from_millis(300);
        assert_eq!(t.backing_off(now)[0].0, "00-interlock.conflist");
        assert!(!t.in_backoff(
            "00-interlock.conflist",
            t0 + Duration::from_millis(200) + INITIAL_BACKOFF + Duration::from_millis(1)
        ));
    }
}

//! Conflicts with another writer: when one is, how many make the guard back off, and
//! for how long.
//!
//! A *conflict* is a repair needed on a file that someone else changed since we left
//! it, taking interlock out of it ([`conflicting_files`]). More than `threshold`
//! conflicts on one file within `window` trip a back-off: the file is left alone for a
//! while (doubling on each trip up to [`MAX_BACKOFF`]), the agent stays not-ready and
//! names the file. Time is passed in, so all of this is pure.
//!
//! (Earlier code called the same thing an undo, a fight and a back-off; it is one
//! concept, named *conflict* here, in the metrics and in the `--conflict-*` flags.)

use crate::guard::plan::{self, Plan};
use interlock_confdir::Snapshot;
use serde_json::{Map, Value};
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// First back-off period.
pub const INITIAL_BACKOFF: Duration = Duration::from_secs(1);
/// Longest back-off period.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A file left alone by other writers this long is forgiven (back-off resets).
pub const FORGIVE_AFTER: Duration = Duration::from_secs(60);

#[derive(Debug, Default)]
struct FileConflicts {
    conflicts: VecDeque<Instant>,
    backoff_until: Option<Instant>,
    next_backoff: Option<Duration>,
    last_conflict: Option<Instant>,
    total: u64,
    trips: u64,
}

/// Per-file conflict counting and back-off.
#[derive(Debug)]
pub struct ConflictTracker {
    window: Duration,
    threshold: u32,
    files: HashMap<String, FileConflicts>,
}

/// What recording a conflict decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Keep repairing.
    Repair,
    /// Back off from this file for the given time.
    BackOff(Duration),
}

impl ConflictTracker {
    /// `threshold` conflicts within `window` trip a back-off; `threshold == 0` never trips.
    pub fn new(window: Duration, threshold: u32) -> ConflictTracker {
        ConflictTracker {
            window,
            threshold,
            files: HashMap::new(),
        }
    }

    /// Records that someone else took interlock out of `file` at `now`.
    pub fn record_conflict(&mut self, file: &str, now: Instant) -> Verdict {
        let f = self.files.entry(file.to_string()).or_default();
        if f.last_conflict
            .is_some_and(|t| now.duration_since(t) > FORGIVE_AFTER)
        {
            f.next_backoff = None;
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
        if self.threshold == 0 || (f.conflicts.len() as u32) <= self.threshold {
            return Verdict::Repair;
        }
        let d = f.next_backoff.unwrap_or(INITIAL_BACKOFF);
        f.next_backoff = Some((d * 2).min(MAX_BACKOFF));
        f.backoff_until = Some(now + d);
        f.conflicts.clear();
        f.trips += 1;
        Verdict::BackOff(d)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trips_after_threshold_and_doubles() {
        let mut t = ConflictTracker::new(Duration::from_secs(1), 3);
        let t0 = Instant::now();
        for i in 0..3 {
            assert_eq!(
                t.record_conflict("a", t0 + Duration::from_millis(i)),
                Verdict::Repair
            );
        }
        assert_eq!(
            t.record_conflict("a", t0 + Duration::from_millis(3)),
            Verdict::BackOff(INITIAL_BACKOFF)
        );
        assert!(t.in_backoff("a", t0 + Duration::from_millis(500)));
        assert!(!t.in_backoff("b", t0));
        assert!(!t.in_backoff("a", t0 + Duration::from_millis(1004)));
        let t1 = t0 + Duration::from_secs(2);
        for i in 0..3 {
            t.record_conflict("a", t1 + Duration::from_millis(i));
        }
        assert_eq!(
            t.record_conflict("a", t1 + Duration::from_millis(4)),
            Verdict::BackOff(INITIAL_BACKOFF * 2)
        );
        assert_eq!(t.conflict_counts(), vec![("a".to_string(), 8, 2)]);
    }

    #[test]
    fn slow_conflicts_never_trip_and_zero_disables() {
        let mut t = ConflictTracker::new(Duration::from_secs(1), 3);
        let t0 = Instant::now();
        for i in 0..100 {
            assert_eq!(
                t.record_conflict("a", t0 + Duration::from_millis(400 * i)),
                Verdict::Repair
            );
        }
        let mut off = ConflictTracker::new(Duration::from_secs(1), 0);
        for i in 0..100 {
            assert_eq!(
                off.record_conflict("a", t0 + Duration::from_micros(i)),
                Verdict::Repair
            );
        }
    }

    #[test]
    fn forgiven_after_quiet_period() {
        let mut t = ConflictTracker::new(Duration::from_secs(1), 1);
        let t0 = Instant::now();
        t.record_conflict("a", t0);
        assert_eq!(
            t.record_conflict("a", t0),
            Verdict::BackOff(INITIAL_BACKOFF)
        );
        t.record_conflict("a", t0 + Duration::from_secs(2));
        assert_eq!(
            t.record_conflict("a", t0 + Duration::from_secs(2)),
            Verdict::BackOff(INITIAL_BACKOFF * 2)
        );
        let later = t0 + Duration::from_secs(200);
        t.record_conflict("a", later);
        assert_eq!(
            t.record_conflict("a", later),
            Verdict::BackOff(INITIAL_BACKOFF)
        );
        assert_eq!(
            t.backing_off(later),
            vec![("a".to_string(), later + INITIAL_BACKOFF)]
        );
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
        let mut t = ConflictTracker::new(Duration::from_secs(1), 20);
        let t0 = Instant::now();
        let mut backed_off_at = None;
        for i in 0..30u64 {
            let now = t0 + Duration::from_millis(i * 10);
            for f in conflicting_files(&plan, &snap, &left, &e) {
                if !t.in_backoff(f, now) {
                    if let Verdict::BackOff(_) = t.record_conflict(f, now) {
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

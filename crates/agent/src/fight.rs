//! Detecting another writer that keeps undoing our repairs, and backing off from it.
//!
//! An *undo* is a repair needed on a file whose current state differs from what we last
//! left there. More than `threshold` undos of one file within `window` trips a back-off:
//! the file is left alone for `backoff` (doubling on each trip up to [`MAX_BACKOFF`]),
//! the agent stays not-ready and names the file. Time is passed in, so this is pure.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// First back-off period.
pub const INITIAL_BACKOFF: Duration = Duration::from_secs(1);
/// Longest back-off period.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A file left alone by other writers this long is forgiven (back-off resets).
pub const FORGIVE_AFTER: Duration = Duration::from_secs(60);

#[derive(Debug, Default)]
struct FileFight {
    undos: VecDeque<Instant>,
    backoff_until: Option<Instant>,
    next_backoff: Option<Duration>,
    last_undo: Option<Instant>,
    total: u64,
    trips: u64,
}

/// Per-file undo counting and back-off.
#[derive(Debug)]
pub struct FightTracker {
    window: Duration,
    threshold: u32,
    files: HashMap<String, FileFight>,
}

/// What recording an undo decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Keep repairing.
    Repair,
    /// Back off from this file for the given time.
    BackOff(Duration),
}

impl FightTracker {
    /// `threshold` undos within `window` trip a back-off; `threshold == 0` never trips.
    pub fn new(window: Duration, threshold: u32) -> FightTracker {
        FightTracker {
            window,
            threshold,
            files: HashMap::new(),
        }
    }

    /// Records that `file` was undone by someone else at `now`.
    pub fn record_undo(&mut self, file: &str, now: Instant) -> Verdict {
        let f = self.files.entry(file.to_string()).or_default();
        if f.last_undo
            .is_some_and(|t| now.duration_since(t) > FORGIVE_AFTER)
        {
            f.next_backoff = None;
        }
        f.last_undo = Some(now);
        f.total += 1;
        f.undos.push_back(now);
        while f
            .undos
            .front()
            .is_some_and(|t| now.duration_since(*t) > self.window)
        {
            f.undos.pop_front();
        }
        if self.threshold == 0 || (f.undos.len() as u32) <= self.threshold {
            return Verdict::Repair;
        }
        let d = f.next_backoff.unwrap_or(INITIAL_BACKOFF);
        f.next_backoff = Some((d * 2).min(MAX_BACKOFF));
        f.backoff_until = Some(now + d);
        f.undos.clear();
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

    /// Total undos per file (for metrics).
    pub fn undo_counts(&self) -> Vec<(String, u64, u64)> {
        let mut v: Vec<_> = self
            .files
            .iter()
            .map(|(n, f)| (n.clone(), f.total, f.trips))
            .collect();
        v.sort();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trips_after_threshold_and_doubles() {
        let mut t = FightTracker::new(Duration::from_secs(1), 3);
        let t0 = Instant::now();
        for i in 0..3 {
            assert_eq!(
                t.record_undo("a", t0 + Duration::from_millis(i)),
                Verdict::Repair
            );
        }
        assert_eq!(
            t.record_undo("a", t0 + Duration::from_millis(3)),
            Verdict::BackOff(INITIAL_BACKOFF)
        );
        assert!(t.in_backoff("a", t0 + Duration::from_millis(500)));
        assert!(!t.in_backoff("b", t0));
        assert!(!t.in_backoff("a", t0 + Duration::from_millis(1004)));
        let t1 = t0 + Duration::from_secs(2);
        for i in 0..3 {
            t.record_undo("a", t1 + Duration::from_millis(i));
        }
        assert_eq!(
            t.record_undo("a", t1 + Duration::from_millis(4)),
            Verdict::BackOff(INITIAL_BACKOFF * 2)
        );
        assert_eq!(t.undo_counts(), vec![("a".to_string(), 8, 2)]);
    }

    #[test]
    fn slow_undos_never_trip_and_zero_disables() {
        let mut t = FightTracker::new(Duration::from_secs(1), 3);
        let t0 = Instant::now();
        for i in 0..100 {
            assert_eq!(
                t.record_undo("a", t0 + Duration::from_millis(400 * i)),
                Verdict::Repair
            );
        }
        let mut off = FightTracker::new(Duration::from_secs(1), 0);
        for i in 0..100 {
            assert_eq!(
                off.record_undo("a", t0 + Duration::from_micros(i)),
                Verdict::Repair
            );
        }
    }

    #[test]
    fn forgiven_after_quiet_period() {
        let mut t = FightTracker::new(Duration::from_secs(1), 1);
        let t0 = Instant::now();
        t.record_undo("a", t0);
        assert_eq!(t.record_undo("a", t0), Verdict::BackOff(INITIAL_BACKOFF));
        t.record_undo("a", t0 + Duration::from_secs(2));
        assert_eq!(
            t.record_undo("a", t0 + Duration::from_secs(2)),
            Verdict::BackOff(INITIAL_BACKOFF * 2)
        );
        let later = t0 + Duration::from_secs(200);
        t.record_undo("a", later);
        assert_eq!(t.record_undo("a", later), Verdict::BackOff(INITIAL_BACKOFF));
        assert_eq!(
            t.backing_off(later),
            vec![("a".to_string(), later + INITIAL_BACKOFF)]
        );
    }
}

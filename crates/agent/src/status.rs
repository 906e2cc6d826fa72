//! State shared between the guard thread and the health server: readiness, its reason,
//! and the counters exported on `/metrics` (Prometheus text format).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// Upper bounds (seconds) of the repair-duration histogram buckets.
pub const REPAIR_BUCKETS: [f64; 9] = [0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0];

/// Readiness as last decided by the guard.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Readiness {
    /// True while the effective config carries our entry and the binary is verified.
    pub ready: bool,
    /// Why not (or "ok").
    pub reason: String,
    /// The file the runtime loads, when there is one.
    pub effective: Option<String>,
}

/// Everything `/healthz`, `/readyz` and `/metrics` report.
#[derive(Debug)]
pub struct Shared {
    readiness: Mutex<Readiness>,
    last_tick: Mutex<Instant>,
    /// Reconciles run (events + resyncs).
    pub reconciles: AtomicU64,
    /// Reconciles that changed something on disk.
    pub repairs: AtomicU64,
    /// Files written, renamed or removed.
    pub writes: AtomicU64,
    /// Failed steps (write, rename, remove, install).
    pub errors: AtomicU64,
    /// Plugin (re)installs.
    pub installs: AtomicU64,
    /// Periodic full resyncs.
    pub resyncs: AtomicU64,
    /// Transitions from ready to not ready.
    pub not_ready_transitions: AtomicU64,
    repair_hist: Mutex<([u64; REPAIR_BUCKETS.len()], u64, f64)>,
    conflicts: Mutex<Vec<(String, u64, u64, bool)>>,
}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            readiness: Mutex::new(Readiness {
                ready: false,
                reason: "starting".into(),
                effective: None,
            }),
            last_tick: Mutex::new(Instant::now()),
            reconciles: AtomicU64::new(0),
            repairs: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            installs: AtomicU64::new(0),
            resyncs: AtomicU64::new(0),
            not_ready_transitions: AtomicU64::new(0),
            repair_hist: Mutex::new(([0; REPAIR_BUCKETS.len()], 0, 0.0)),
            conflicts: Mutex::new(vec![]),
        }
    }
}

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Shared {
    /// Current readiness.
    pub fn readiness(&self) -> Readiness {
        self.readiness.lock().expect("readiness lock").clone()
    }

    /// Sets readiness; returns true when `ready` or the reason changed.
    pub fn set_readiness(&self, r: Readiness) -> bool {
        let mut cur = self.readiness.lock().expect("readiness lock");
        let changed =
            cur.ready != r.ready || cur.reason != r.reason || cur.effective != r.effective;
        if cur.ready && !r.ready {
            self.not_ready_transitions.fetch_add(1, Ordering::Relaxed);
        }
        *cur = r;
        changed
    }

    /// The guard loop is alive.
    pub fn tick(&self) {
        *self.last_tick.lock().expect("tick lock") = Instant::now();
    }

    /// Time since the guard loop last ran.
    pub fn since_tick(&self) -> std::time::Duration {
        self.last_tick.lock().expect("tick lock").elapsed()
    }

    /// Records how long one repair took (event seen → disk converged).
    pub fn observe_repair(&self, secs: f64) {
        let mut h = self.repair_hist.lock().expect("hist lock");
        for (i, b) in REPAIR_BUCKETS.iter().enumerate() {
            if secs <= *b {
                h.0[i] += 1;
            }
        }
        h.1 += 1;
        h.2 += secs;
    }

    /// Replaces the per-file conflict table: (file, undos, back-off trips, backing off now).
    pub fn set_conflicts(&self, c: Vec<(String, u64, u64, bool)>) {
        *self.conflicts.lock().expect("conflicts lock") = c;
    }

    /// Renders `/metrics`.
    pub fn render_metrics(&self) -> String {
        let r = self.readiness();
        let mut s = String::new();
        let mut counter = |name: &str, help: &str, v: &AtomicU64| {
            let _ = writeln!(
                s,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                v.load(Ordering::Relaxed)
            );
        };
        counter(
            "interlock_config_reconciles_total",
            "Reconciles of the CNI conf dir (events and resyncs).",
            &self.reconciles,
        );
        counter(
            "interlock_config_repairs_total",
            "Reconciles that had to change the conf dir.",
            &self.repairs,
        );
        counter(
            "interlock_config_writes_total",
            "Files written, renamed or removed in the conf dir.",
            &self.writes,
        );
        counter(
            "interlock_errors_total",
            "Failed writes, renames, removes and installs.",
            &self.errors,
        );
        counter(
            "interlock_plugin_installs_total",
            "Installs of the interlock-cni binary into a bin dir.",
            &self.installs,
        );
        counter(
            "interlock_config_resyncs_total",
            "Periodic full resyncs.",
            &self.resyncs,
        );
        counter(
            "interlock_not_ready_transitions_total",
            "Transitions from ready to not ready.",
            &self.not_ready_transitions,
        );
        let _ = writeln!(s, "# HELP interlock_agent_ready 1 while the effective CNI config contains interlock-cni and the binary is verified.\n# TYPE interlock_agent_ready gauge\ninterlock_agent_ready {}", u8::from(r.ready));
        let _ = writeln!(s, "# HELP interlock_effective_config_info The file the runtime loads.\n# TYPE interlock_effective_config_info gauge");
        if let Some(e) = &r.effective {
            let _ = writeln!(
                s,
                "interlock_effective_config_info{{file=\"{}\"}} 1",
                esc(e)
            );
        }
        {
            let h = self.repair_hist.lock().expect("hist lock");
            let _ = writeln!(s, "# HELP interlock_config_repair_duration_seconds Time from a change in the conf dir to the repaired state on disk.\n# TYPE interlock_config_repair_duration_seconds histogram");
            for (i, b) in REPAIR_BUCKETS.iter().enumerate() {
                let _ = writeln!(
                    s,
                    "interlock_config_repair_duration_seconds_bucket{{le=\"{b}\"}} {}",
                    h.0[i]
                );
            }
            let _ = writeln!(
                s,
                "interlock_config_repair_duration_seconds_bucket{{le=\"+Inf\"}} {}",
                h.1
            );
            let _ = writeln!(s, "interlock_config_repair_duration_seconds_sum {}\ninterlock_config_repair_duration_seconds_count {}", h.2, h.1);
        }
        let conflicts = self.conflicts.lock().expect("conflicts lock").clone();
        let _ = writeln!(s, "# HELP interlock_config_conflicts_total Times another writer undid our change to a file.\n# TYPE interlock_config_conflicts_total counter");
        for (f, n, _, _) in &conflicts {
            let _ = writeln!(
                s,
                "interlock_config_conflicts_total{{file=\"{}\"}} {n}",
                esc(f)
            );
        }
        let _ = writeln!(s, "# HELP interlock_config_backoff 1 while the agent backs off from a file another writer keeps rewriting.\n# TYPE interlock_config_backoff gauge");
        for (f, _, _, on) in &conflicts {
            let _ = writeln!(
                s,
                "interlock_config_backoff{{file=\"{}\"}} {}",
                esc(f),
                u8::from(*on)
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_prometheus_text() {
        let s = Shared::default();
        s.set_readiness(Readiness {
            ready: true,
            reason: "ok".into(),
            effective: Some("00-interlock.conflist".into()),
        });
        s.set_readiness(Readiness {
            ready: false,
            reason: "x".into(),
            effective: None,
        });
        s.observe_repair(0.003);
        s.set_conflicts(vec![("10-\"a\".conflist".into(), 4, 1, true)]);
        let m = s.render_metrics();
        assert!(m.contains("interlock_agent_ready 0\n"));
        assert!(m.contains("interlock_not_ready_transitions_total 1\n"));
        assert!(m.contains("interlock_config_repair_duration_seconds_bucket{le=\"0.005\"} 1\n"));
        assert!(m.contains("interlock_config_repair_duration_seconds_bucket{le=\"0.002\"} 0\n"));
        assert!(m.contains("interlock_config_conflicts_total{file=\"10-\\\"a\\\".conflist\"} 4\n"));
        assert!(m.contains("interlock_config_backoff{file=\"10-\\\"a\\\".conflist\"} 1\n"));
        for line in m.lines().filter(|l| !l.starts_with('#')) {
            let v = line.rsplit(' ').next().unwrap();
            assert!(v.parse::<f64>().is_ok(), "bad sample line {line}");
        }
    }
}

//! State shared between the guard thread and the health server: readiness, its reason,
//! when the guard loop last completed a pass, and the metrics on `/metrics`.
//!
//! [`Shared`] is the guard's one handle on all of it. The metrics themselves are
//! `prometheus-client` series, registered once per subsystem (see [`crate::health::metrics`]);
//! the fields here are handles on the same series.

use crate::health::metrics::{
    AgentMetrics, AuditMetrics, FileLabel, GuardMetrics, PluginMetrics, PodStartMetrics,
    ReadinessMetrics,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// What the guard knows about one file another writer keeps changing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileConflict {
    /// The file's name in the conf dir.
    pub file: String,
    /// Times another writer undid interlock's change to it, since the agent started.
    pub undos: u64,
    /// True while the agent backs off from it.
    pub backing_off: bool,
}

/// Another writer undid interlock's change to a file (the latest such file), for the
/// node's `ConfigTakenOver` Event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TakeOver {
    /// The file's name in the conf dir.
    pub file: String,
    /// Times another writer undid interlock's change to it, since the agent started.
    pub undos: u64,
}

/// A fight over a file started (the guard's `start_fight`), for the node's `ConfigFight`
/// Event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FightStarted {
    /// The file's name in the conf dir.
    pub file: String,
    /// What the guard logged: the file, the primary, what to do.
    pub message: String,
}

/// Everything `/healthz`, `/readyz` and `/metrics` report.
#[derive(Debug)]
pub struct Shared {
    readiness: Mutex<Readiness>,
    // The Kubernetes side follows these instead of polling the guard.
    readiness_changes: tokio::sync::watch::Sender<Readiness>,
    takeovers: tokio::sync::watch::Sender<Option<TakeOver>>,
    fights: tokio::sync::watch::Sender<Option<FightStarted>>,
    last_tick: Mutex<Instant>,
    registry: Registry,
    guard: GuardMetrics,
    ready: ReadinessMetrics,
    /// Reconciles run (events + resyncs).
    pub reconciles: Counter,
    /// Reconciles that changed something on disk.
    pub repairs: Counter,
    /// Files written, renamed or removed.
    pub writes: Counter,
    /// Failed steps (write, rename, remove, install, marker).
    pub errors: Counter,
    /// Plugin (re)installs.
    pub installs: Counter,
    /// Periodic full resyncs.
    pub resyncs: Counter,
    /// Conf, bin and state dirs a non-root user could write.
    pub insecure_dirs: Gauge,
    /// The sandbox audit's series.
    pub audit: AuditMetrics,
    /// The pod starts the plugin did not protect (its `failed` notes).
    pub starts: PodStartMetrics,
    /// What the sandbox audit last reported about the runtime and its passes.
    pub audit_health: Arc<AuditHealth>,
}

/// The sandbox audit's own state, for `/readyz` (`crate::health::verdicts::audit_problem`).
#[derive(Debug, Default)]
pub struct AuditHealth {
    state: Mutex<AuditState>,
}

#[derive(Debug, Default)]
struct AuditState {
    started: Option<(Instant, String, Duration)>,
    failing: Option<(Instant, String)>,
    last_pass: Option<Instant>,
}

impl AuditHealth {
    /// The audit starts on `endpoint` with period `interval`.
    pub fn started(&self, endpoint: &str, interval: Duration) {
        lock(&self.state).started = Some((Instant::now(), endpoint.to_string(), interval));
    }

    /// The runtime answered.
    pub fn runtime_answered(&self) {
        lock(&self.state).failing = None;
    }

    /// The runtime failed to answer with `error` (the first failure in a row counts).
    pub fn runtime_failed(&self, error: &str) {
        let mut s = lock(&self.state);
        let since = s.failing.as_ref().map_or_else(Instant::now, |f| f.0);
        s.failing = Some((since, error.to_string()));
    }

    /// A full pass completed.
    pub fn pass_done(&self) {
        let mut s = lock(&self.state);
        s.last_pass = Some(Instant::now());
        s.failing = None;
    }

    /// The state as `crate::health::verdicts::audit_problem` reads it.
    pub fn view(&self) -> AuditView {
        let s = lock(&self.state);
        let now = Instant::now();
        match &s.started {
            None => AuditView::default(),
            Some((at, endpoint, interval)) => AuditView {
                enabled: true,
                endpoint: endpoint.clone(),
                failing: s
                    .failing
                    .as_ref()
                    .map(|(t, e)| (now.saturating_duration_since(*t), e.clone())),
                since_pass: s.last_pass.map(|t| now.saturating_duration_since(t)),
                running_for: now.saturating_duration_since(*at),
                interval: *interval,
            },
        }
    }
}

impl Default for Shared {
    fn default() -> Self {
        let mut registry = Registry::default();
        let agent = AgentMetrics::register(&mut registry);
        let guard = GuardMetrics::register(&mut registry);
        let plugin = PluginMetrics::register(&mut registry);
        let ready = ReadinessMetrics::register(&mut registry);
        let audit = AuditMetrics::register(&mut registry);
        let starts = PodStartMetrics::register(&mut registry);
        registry.register_collector(Box::new(crate::health::process::ProcessCollector));
        let starting = Readiness {
            ready: false,
            reason: "starting".into(),
            effective: None,
        };
        Shared {
            audit,
            starts,
            audit_health: Arc::default(),
            readiness_changes: tokio::sync::watch::Sender::new(starting.clone()),
            takeovers: tokio::sync::watch::Sender::new(None),
            fights: tokio::sync::watch::Sender::new(None),
            readiness: Mutex::new(starting),
            last_tick: Mutex::new(Instant::now()),
            reconciles: guard.reconciles.clone(),
            repairs: guard.repairs.clone(),
            writes: guard.writes.clone(),
            resyncs: guard.resyncs.clone(),
            errors: agent.errors.clone(),
            installs: plugin.installs.clone(),
            insecure_dirs: agent.insecure_dirs.clone(),
            registry,
            guard,
            ready,
        }
    }
}

// A poisoned lock only means another thread panicked while holding it; the data (a
// readiness snapshot, an instant) is still whole, so the agent keeps going.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    /// Current readiness.
    pub fn readiness(&self) -> Readiness {
        lock(&self.readiness).clone()
    }

    /// Sets readiness; returns true when `ready` or the reason changed.
    pub fn set_readiness(&self, r: Readiness) -> bool {
        let mut cur = lock(&self.readiness);
        let changed =
            cur.ready != r.ready || cur.reason != r.reason || cur.effective != r.effective;
        if cur.ready && !r.ready {
            self.ready.not_ready_transitions.inc();
        }
        self.ready.ready.set(i64::from(r.ready));
        if cur.effective != r.effective {
            self.ready.effective_config.clear();
            if let Some(file) = &r.effective {
                self.ready
                    .effective_config
                    .get_or_create(&FileLabel::new(file))
                    .set(1);
            }
        }
        if changed {
            self.readiness_changes.send_replace(r.clone());
        }
        *cur = r;
        changed
    }

    /// Readiness as it changes (the guard publishes every change).
    pub fn watch_readiness(&self) -> tokio::sync::watch::Receiver<Readiness> {
        self.readiness_changes.subscribe()
    }

    /// The latest file another writer took interlock out of, as it happens.
    pub fn watch_takeovers(&self) -> tokio::sync::watch::Receiver<Option<TakeOver>> {
        self.takeovers.subscribe()
    }

    /// A fight over `file` started: counted, and published for the node's Event.
    pub fn fight_started(&self, file: &str, message: &str) {
        self.guard.fights.get_or_create(&FileLabel::new(file)).inc();
        self.fights.send_replace(Some(FightStarted {
            file: file.to_string(),
            message: message.to_string(),
        }));
    }

    /// Fights as they start.
    pub fn watch_fights(&self) -> tokio::sync::watch::Receiver<Option<FightStarted>> {
        self.fights.subscribe()
    }

    /// The guard loop completed a pass (it calls this once per loop iteration, at least
    /// once per marker heartbeat).
    pub fn tick(&self) {
        *lock(&self.last_tick) = Instant::now();
    }

    /// Time since the guard loop last completed a pass.
    pub fn since_tick(&self) -> Duration {
        lock(&self.last_tick).elapsed()
    }

    /// Records how long one repair took (event seen → disk converged).
    pub fn observe_repair(&self, secs: f64) {
        self.guard.repair_seconds.observe(secs);
    }

    /// Publishes the per-file conflict table.
    pub fn set_conflicts(&self, conflicts: Vec<FileConflict>) {
        for c in conflicts {
            let label = FileLabel::new(&c.file);
            let undos = self.guard.conflicts.get_or_create(&label);
            // The tracker counts since the agent started, as the counter does.
            let seen = undos.get();
            if c.undos > seen {
                undos.inc_by(c.undos - seen);
                self.takeovers.send_replace(Some(TakeOver {
                    file: c.file.clone(),
                    undos: c.undos,
                }));
            }
            self.guard
                .backoff
                .get_or_create(&label)
                .set(i64::from(c.backing_off));
        }
    }

    /// Guard mode: the state the node's config is in now (one of
    /// [`crate::health::metrics::GUARD_STATES`]).
    pub fn set_guard_state(&self, state: &str) {
        for s in crate::health::metrics::GUARD_STATES {
            self.guard
                .guard_state
                .get_or_create(&crate::health::metrics::StateLabel {
                    state: s.to_string(),
                })
                .set(i64::from(s == state));
        }
    }

    /// Guard mode: the mesh's installer wrote the guard file `file`.
    pub fn mesh_wrote(&self, file: &str) {
        self.guard
            .mesh_writes
            .get_or_create(&FileLabel::new(file))
            .inc();
    }

    /// `/metrics` in the OpenMetrics text format.
    pub fn render_metrics(&self) -> String {
        let mut s = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut s, &self.registry);
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
        assert!(s
            .render_metrics()
            .contains("interlock_effective_config_info{file=\"00-interlock.conflist\"} 1\n"));
        s.set_readiness(Readiness {
            ready: false,
            reason: "x".into(),
            effective: None,
        });
        s.observe_repair(0.003);
        s.set_conflicts(vec![FileConflict {
            file: "10-\"a\".conflist".into(),
            undos: 4,
            backing_off: true,
        }]);
        s.errors.inc();
        let m = s.render_metrics();
        assert!(m.contains("interlock_agent_ready 0\n"), "{m}");
        assert!(
            m.contains("interlock_not_ready_transitions_total 1\n"),
            "{m}"
        );
        assert!(m.contains("interlock_errors_total 1\n"), "{m}");
        assert!(!m.contains("interlock_effective_config_info{"), "{m}");
        assert!(m.contains("interlock_config_repair_duration_seconds_bucket{le=\"0.005\"} 1\n"));
        assert!(m.contains("interlock_config_repair_duration_seconds_bucket{le=\"0.002\"} 0\n"));
        assert!(m.contains("interlock_config_repair_duration_seconds_count 1\n"));
        assert!(m.contains("interlock_config_conflicts_total{file=\"10-\\\"a\\\".conflist\"} 4\n"));
        assert!(m.contains("interlock_config_backoff{file=\"10-\\\"a\\\".conflist\"} 1\n"));
        assert!(
            m.contains(&format!(
                "interlock_build_info{{version=\"{}\"}} 1\n",
                env!("CARGO_PKG_VERSION")
            )),
            "{m}"
        );
        assert!(m.contains("# HELP interlock_errors Failed writes, renames, removes, installs and marker writes.\n"), "{m}");
        for line in m.lines().filter(|l| !l.starts_with('#')) {
            let v = line.rsplit(' ').next().unwrap();
            assert!(v.parse::<f64>().is_ok(), "bad sample line {line}");
        }
        // The tracker's totals are absolute: publishing them again adds nothing.
        s.set_conflicts(vec![FileConflict {
            file: "10-\"a\".conflist".into(),
            undos: 4,
            backing_off: false,
        }]);
        let m = s.render_metrics();
        assert!(m.contains("interlock_config_conflicts_total{file=\"10-\\\"a\\\".conflist\"} 4\n"));
        assert!(m.contains("interlock_config_backoff{file=\"10-\\\"a\\\".conflist\"} 0\n"));
    }

    #[test]
    fn guard_state_is_one_hot_and_mesh_writes_count_per_file() {
        let s = Shared::default();
        s.set_guard_state("hold");
        s.set_guard_state("guard");
        s.mesh_wrote("00-interlock.conflist");
        s.mesh_wrote("00-interlock.conflist");
        let m = s.render_metrics();
        assert!(
            m.contains("interlock_guard_state{state=\"guard\"} 1\n"),
            "{m}"
        );
        assert!(
            m.contains("interlock_guard_state{state=\"hold\"} 0\n"),
            "{m}"
        );
        assert!(
            m.contains("interlock_guard_state{state=\"no-primary\"} 0\n"),
            "{m}"
        );
        assert!(
            m.contains("interlock_guard_mesh_writes_total{file=\"00-interlock.conflist\"} 2\n"),
            "{m}"
        );
    }

    #[test]
    fn every_documented_series_is_exported() {
        let m = Shared::default().render_metrics();
        for name in crate::health::metrics::SERIES {
            assert!(
                m.contains(&format!("# TYPE {name} ")),
                "{name} missing from:\n{m}"
            );
        }
    }
}

/// What the sandbox audit last reported, for `crate::health::verdicts::audit_problem`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditView {
    /// The audit runs (`--cri-endpoint` is not `none`).
    pub enabled: bool,
    /// The CRI endpoint.
    pub endpoint: String,
    /// How long the runtime has failed to answer, with its last error (`None`: its last
    /// call succeeded).
    pub failing: Option<(Duration, String)>,
    /// Time since the audit last completed a full pass (`None`: never).
    pub since_pass: Option<Duration>,
    /// Time since the audit started.
    pub running_for: Duration,
    /// The audit's period.
    pub interval: Duration,
}

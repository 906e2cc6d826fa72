//! The agent's Prometheus series, one struct per subsystem, each registered once into the
//! registry that `/metrics` encodes. Every series is listed in [`SERIES`] and documented in
//! docs/operate.md (section "Metrics").

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use std::fmt::Write as _;

/// Upper bounds (seconds) of the repair-duration histogram buckets: the budget is 50 ms
/// (p99), so the buckets are fine below it and coarse above.
pub const REPAIR_BUCKETS: [f64; 9] = [0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0];

/// Every series family the agent exports, by the name in its `# TYPE` line (counters get
/// `_total` on their samples, the info metric `_info`).
pub const SERIES: [&str; 31] = [
    "interlock_build",
    "interlock_errors",
    "interlock_insecure_dirs",
    "interlock_config_reconciles",
    "interlock_config_repairs",
    "interlock_config_writes",
    "interlock_config_resyncs",
    "interlock_config_repair_duration_seconds",
    "interlock_config_conflicts",
    "interlock_config_backoff",
    "interlock_config_fights",
    "interlock_guard_state",
    "interlock_guard_mesh_writes",
    "interlock_plugin_installs",
    "interlock_agent_ready",
    "interlock_not_ready_transitions",
    "interlock_effective_config_info",
    "interlock_sandboxes",
    "interlock_sandbox_repairs",
    "interlock_connections_ended",
    "interlock_audit_duration_seconds",
    "interlock_audit_errors",
    "interlock_pod_starts_refused",
    "interlock_pod_starts_failed",
    "interlock_pod_starts_unprotected",
    "process_cpu_seconds",
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "process_open_fds",
    "process_max_fds",
    "process_start_time_seconds",
];

/// Upper bounds (seconds) of the audit-duration histogram: the budget is 250 ms for 250
/// sandboxes.
pub const AUDIT_BUCKETS: [f64; 10] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0];

/// A label naming one file in the conf dir.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FileLabel {
    /// The file's name (not its path).
    pub file: FileName,
}

impl FileLabel {
    /// The label for the file named `name`.
    pub fn new(name: &str) -> FileLabel {
        FileLabel {
            file: FileName(name.to_string()),
        }
    }
}

/// A file name as a label value, escaped as the exposition format requires (the encoder
/// writes label values verbatim, and a file name may hold `"`, `\` or a newline).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct FileName(pub String);

impl EncodeLabelValue for FileName {
    fn encode(&self, e: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        for c in self.0.chars() {
            match c {
                '\\' => e.write_str("\\\\")?,
                '"' => e.write_str("\\\"")?,
                '\n' => e.write_str("\\n")?,
                c => e.write_char(c)?,
            }
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
}

/// Series about the agent process as a whole.
#[derive(Debug, Clone, Default)]
pub struct AgentMetrics {
    /// Failed steps of any subsystem (writes, renames, removes, installs, the marker).
    pub errors: Counter,
    /// Conf, bin and state dirs a non-root user could write (see `guard::writable_by_others`).
    pub insecure_dirs: Gauge,
}

impl AgentMetrics {
    /// Registers the agent's series (and `interlock_build_info`) into `r`.
    pub fn register(r: &mut Registry) -> AgentMetrics {
        let m = AgentMetrics::default();
        r.register(
            "interlock_build",
            "The running agent's version",
            Info::new(BuildLabels {
                version: env!("CARGO_PKG_VERSION").to_string(),
            }),
        );
        r.register(
            "interlock_errors",
            "Failed writes, renames, removes, installs and marker writes",
            m.errors.clone(),
        );
        r.register(
            "interlock_insecure_dirs",
            "Conf, bin and state dirs that a non-root user could write (should be 0)",
            m.insecure_dirs.clone(),
        );
        m
    }
}

/// Series of the config guard (the conf dir).
#[derive(Debug, Clone)]
pub struct GuardMetrics {
    /// Reconciles run.
    pub reconciles: Counter,
    /// Reconciles that changed the conf dir.
    pub repairs: Counter,
    /// Files written, renamed or removed.
    pub writes: Counter,
    /// Periodic full resyncs.
    pub resyncs: Counter,
    /// Time from a change in the conf dir to the repaired state on disk.
    pub repair_seconds: Histogram,
    /// Undos of interlock's change, per file.
    pub conflicts: Family<FileLabel, Counter>,
    /// 1 while the agent backs off from a file, per file.
    pub backoff: Family<FileLabel, Gauge>,
    /// Fights over a file (another writer undoing every change), per file.
    pub fights: Family<FileLabel, Counter>,
    /// Guard mode: 1 for the state the node's config is in (`no-primary`, `hold`,
    /// `guard`), 0 for the others; no series outside guard mode.
    pub guard_state: Family<StateLabel, Gauge>,
    /// Guard mode: the mesh's installer changed the guard file (added, replaced or removed
    /// its entry), per file. The converging writer, not a conflict.
    pub mesh_writes: Family<FileLabel, Counter>,
}

/// Guard mode's states, as `interlock_guard_state` names them.
pub const GUARD_STATES: [&str; 3] = ["no-primary", "hold", "guard"];

/// A label naming a guard-mode state.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    /// `no-primary`, `hold` or `guard`.
    pub state: String,
}

impl GuardMetrics {
    /// Registers the guard's series into `r`.
    pub fn register(r: &mut Registry) -> GuardMetrics {
        let m = GuardMetrics {
            reconciles: Counter::default(),
            repairs: Counter::default(),
            writes: Counter::default(),
            resyncs: Counter::default(),
            repair_seconds: Histogram::new(REPAIR_BUCKETS),
            conflicts: Family::default(),
            backoff: Family::default(),
            fights: Family::default(),
            guard_state: Family::default(),
            mesh_writes: Family::default(),
        };
        r.register(
            "interlock_config_reconciles",
            "Reconciles of the CNI conf dir (events and resyncs)",
            m.reconciles.clone(),
        );
        r.register(
            "interlock_config_repairs",
            "Reconciles that had to change the conf dir",
            m.repairs.clone(),
        );
        r.register(
            "interlock_config_writes",
            "Files written, renamed or removed in the conf dir",
            m.writes.clone(),
        );
        r.register(
            "interlock_config_resyncs",
            "Periodic full resyncs",
            m.resyncs.clone(),
        );
        r.register(
            "interlock_config_repair_duration_seconds",
            "Time from a change in the conf dir to the repaired state on disk",
            m.repair_seconds.clone(),
        );
        r.register(
            "interlock_config_conflicts",
            "Times another writer undid interlock's change to a file",
            m.conflicts.clone(),
        );
        r.register(
            "interlock_config_backoff",
            "1 while the agent backs off from a file another writer keeps rewriting",
            m.backoff.clone(),
        );
        r.register(
            "interlock_config_fights",
            "Fights over a file: another writer undid interlock's change to it so often that the agent backed off",
            m.fights.clone(),
        );
        r.register(
            "interlock_guard_state",
            "Guard mode: 1 for the state of the node's config (no-primary, hold, guard)",
            m.guard_state.clone(),
        );
        r.register(
            "interlock_guard_mesh_writes",
            "Guard mode: writes of the mesh's installer to the guard file (its entry added, replaced or removed)",
            m.mesh_writes.clone(),
        );
        m
    }
}

/// Series of the plugin installer.
#[derive(Debug, Clone, Default)]
pub struct PluginMetrics {
    /// Installs of the binary into a bin dir.
    pub installs: Counter,
}

impl PluginMetrics {
    /// Registers the installer's series into `r`.
    pub fn register(r: &mut Registry) -> PluginMetrics {
        let m = PluginMetrics::default();
        r.register(
            "interlock_plugin_installs",
            "Installs of the interlock-cni binary into a bin dir",
            m.installs.clone(),
        );
        m
    }
}

/// Series of readiness (what `/readyz` and the STATUS marker say).
#[derive(Debug, Clone, Default)]
pub struct ReadinessMetrics {
    /// 1 while ready.
    pub ready: Gauge,
    /// Transitions from ready to not ready.
    pub not_ready_transitions: Counter,
    /// The file the runtime loads (one series, value 1, while there is one).
    pub effective_config: Family<FileLabel, Gauge>,
}

impl ReadinessMetrics {
    /// Registers the readiness series into `r`.
    pub fn register(r: &mut Registry) -> ReadinessMetrics {
        let m = ReadinessMetrics::default();
        r.register(
            "interlock_agent_ready",
            "1 while the effective CNI config contains interlock-cni and the binary is verified",
            m.ready.clone(),
        );
        r.register(
            "interlock_not_ready_transitions",
            "Transitions from ready to not ready",
            m.not_ready_transitions.clone(),
        );
        r.register(
            "interlock_effective_config_info",
            "The file the runtime loads",
            m.effective_config.clone(),
        );
        m
    }
}

/// The verdict of one sandbox, as a label (`interlock_sandboxes{verdict=…}`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerdictLabel {
    /// `protected`, `unprotected`, `not_meshed` or `unknown` (`audit::decide::Verdict::label`).
    pub verdict: String,
}

impl VerdictLabel {
    /// Every verdict, for a series that must report zero too.
    pub const ALL: [&'static str; 4] = ["protected", "unprotected", "not_meshed", "unknown"];
}

/// What was done about one unprotected sandbox (`interlock_sandbox_repairs`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RepairLabels {
    /// The policy acted on (after fallbacks and escalation): `repair`, `restart`, ….
    pub policy: String,
    /// `done`, `failed` or `escalated`.
    pub result: String,
}

/// Series of the sandbox audit.
#[derive(Debug, Clone)]
pub struct AuditMetrics {
    /// Sandboxes by verdict at the last audit.
    pub sandboxes: Family<VerdictLabel, Gauge>,
    /// Actions on unprotected sandboxes, by policy and result.
    pub repairs: Family<RepairLabels, Counter>,
    /// Connections ended by in-place repairs.
    pub connections_ended: Counter,
    /// Duration of one audit pass.
    pub duration: Histogram,
    /// Audit failures (CRI unreachable, a sandbox whose status or netns could not be read).
    pub errors: Counter,
    /// `ListPodSandbox` calls of the audit.
    pub lists: Counter,
    /// Verbose `PodSandboxStatus` calls of the audit (one per sandbox it had not seen).
    pub status_reads: Counter,
    /// Whether the runtime answered the audit's last call (1) or not (0).
    pub cri_up: Gauge,
}

impl AuditMetrics {
    /// Registers the audit's series into `r` (every verdict reported, zero included).
    pub fn register(r: &mut Registry) -> AuditMetrics {
        let m = AuditMetrics {
            sandboxes: Family::default(),
            repairs: Family::default(),
            connections_ended: Counter::default(),
            duration: Histogram::new(AUDIT_BUCKETS),
            errors: Counter::default(),
            lists: Counter::default(),
            status_reads: Counter::default(),
            cri_up: Gauge::default(),
        };
        for v in VerdictLabel::ALL {
            m.sandboxes
                .get_or_create(&VerdictLabel {
                    verdict: v.to_string(),
                })
                .set(0);
        }
        r.register(
            "interlock_sandboxes",
            "Ready pod sandboxes on this node at the last audit, by verdict",
            m.sandboxes.clone(),
        );
        r.register(
            "interlock_sandbox_repairs",
            "Actions on unprotected meshed sandboxes, by policy and result",
            m.repairs.clone(),
        );
        r.register(
            "interlock_connections_ended",
            "Connections opened before the redirection that in-place repairs ended",
            m.connections_ended.clone(),
        );
        r.register(
            "interlock_audit_duration_seconds",
            "Duration of one audit of the node's sandboxes",
            m.duration.clone(),
        );
        r.register(
            "interlock_audit_errors",
            "Audit failures: CRI unreachable, or a sandbox whose status or netns could not be read",
            m.errors.clone(),
        );
        r.register(
            "interlock_audit_sandbox_lists",
            "ListPodSandbox calls made by the sandbox audit",
            m.lists.clone(),
        );
        r.register(
            "interlock_audit_sandbox_status_reads",
            "Verbose PodSandboxStatus calls made by the sandbox audit (one per sandbox it had not seen)",
            m.status_reads.clone(),
        );
        r.register(
            "interlock_cri_up",
            "Whether the container runtime answered the sandbox audit's last call (1) or not (0)",
            m.cri_up.clone(),
        );
        m
    }

    /// Publishes one pass's count per verdict label.
    pub fn set_verdicts(&self, counts: &std::collections::BTreeMap<&'static str, i64>) {
        for v in VerdictLabel::ALL {
            self.sandboxes
                .get_or_create(&VerdictLabel {
                    verdict: v.to_string(),
                })
                .set(counts.get(v).copied().unwrap_or(0));
        }
    }

    /// Counts one action.
    pub fn repaired(&self, policy: &str, result: &str) {
        self.repairs
            .get_or_create(&RepairLabels {
                policy: policy.to_string(),
                result: result.to_string(),
            })
            .inc();
    }
}

/// Why, and under which profile, a pod start went unprotected
/// (`interlock_pod_starts_{refused,failed,unprotected}_total`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StartLabels {
    /// The decision that refused (`undecided`, `needs-pod-spec`, `invalid`) or the step
    /// that failed (`netns`, `open`, `apply`, `verify`, `probe`, `state`, …); `other` for
    /// a value this agent does not know (a newer plugin).
    pub reason: String,
    /// The profile that claimed the pod (`istio`, `linkerd`, `consul`, `generic`), or
    /// `unknown`.
    pub profile: String,
}

/// The reasons a label may carry: the decisions that refuse and the steps
/// (`interlock_contract::codes::Step`); anything else is counted as `other`, so a
/// client cannot grow the series without bound.
const START_REASONS: [&str; 12] = [
    "undecided",
    "needs-pod-spec",
    "invalid",
    "lookup",
    "spec",
    "netns",
    "open",
    "apply",
    "verify",
    "probe",
    "remove",
    "state",
];

/// Series of the pod starts the plugin did not protect, from its `failed` notes on the
/// agent socket (`interlock_contract::agent_socket::FailedNote`).
#[derive(Debug, Clone, Default)]
pub struct PodStartMetrics {
    /// ADDs failed before anything was done: the plugin could not decide.
    pub refused: Family<StartLabels, Counter>,
    /// ADDs failed at a protection step.
    pub failed: Family<StartLabels, Counter>,
    /// Meshed pods started without redirection (`failurePolicy: open`).
    pub unprotected: Family<StartLabels, Counter>,
}

impl PodStartMetrics {
    /// Registers the pod-start series into `r`.
    pub fn register(r: &mut Registry) -> PodStartMetrics {
        let m = PodStartMetrics::default();
        r.register(
            "interlock_pod_starts_refused",
            "Pod starts interlock-cni refused before touching the pod (it could not decide whether or how the pod is meshed), by reason and profile",
            m.refused.clone(),
        );
        r.register(
            "interlock_pod_starts_failed",
            "Pod starts that failed because a protection step failed (failurePolicy closed), by step and profile",
            m.failed.clone(),
        );
        r.register(
            "interlock_pod_starts_unprotected",
            "Meshed pods started without traffic redirection because a step failed under failurePolicy open, by step and profile",
            m.unprotected.clone(),
        );
        m
    }

    /// Counts one note; false when its outcome is not one this agent knows (not counted).
    pub fn count(&self, outcome: &str, reason: &str, profile: &str) -> bool {
        use interlock_contract::agent_socket::outcome;
        let family = match outcome {
            outcome::REFUSED => &self.refused,
            outcome::FAILED => &self.failed,
            outcome::UNPROTECTED => &self.unprotected,
            _ => return false,
        };
        let reason = if START_REASONS.contains(&reason) {
            reason
        } else {
            "other"
        };
        let profile = if interlock_contract::ProfileName::ALL
            .iter()
            .any(|p| p.as_str() == profile)
        {
            profile
        } else {
            "unknown"
        };
        family
            .get_or_create(&StartLabels {
                reason: reason.to_string(),
                profile: profile.to_string(),
            })
            .inc();
        true
    }
}

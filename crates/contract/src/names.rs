//! Kubernetes names users configure node pools and alerts with (keep them stable).

/// The startup taint node pools register with; the agent removes it when the node is
/// protected and puts it back when protection is lost.
pub const TAINT_NOT_READY: &str = "interlock.dev/not-ready";

/// The node condition type the agent keeps in step with the taint.
pub const CONDITION_READY: &str = "InterlockReady";

/// The pod label set (to `true`) while a meshed pod is unprotected.
pub const LABEL_UNPROTECTED: &str = "interlock.dev/unprotected";

/// The `reportingController` of the agent's Events.
pub const EVENTS_REPORTER: &str = "interlock.dev/agent";

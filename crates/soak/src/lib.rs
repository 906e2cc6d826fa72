//! A bounded chaos soak of interlock against a private containerd, judged by a checker
//! that shares no code with interlock.
//!
//! Workers keep creating and removing meshed and plain sandboxes over CRI; a chaos loop
//! ([`chaos`]) kills and restarts the agent, rewrites, renames and deletes the primary's
//! config, adds configs that sort ahead, deletes the installed plugin and restarts
//! containerd; the checker probes every running sandbox from inside with a real
//! connection ([`probe`]) and keeps the exposure windows ([`ledger`]). The run ends with
//! one JSON report ([`report`]) and fails when an invariant broke.
//!
//! The crate depends on the test kit and the CRI client only: the agent and the plugin
//! are the built binaries, and containerd is the witness of what ran.

pub mod chaos;
pub mod chaos_loop;
pub mod checker;
pub mod ledger;
pub mod probe;
pub mod report;
pub mod run;
pub mod workload;

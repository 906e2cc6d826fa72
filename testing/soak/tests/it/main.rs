//! The soak's integration tests, one binary for all (each file here was a test binary of
//! its own, and every one of them linked tokio and both test kits again). The agent and
//! the plugin are run as the built binaries (`default_bin_dir`).
//!
//! Run one area with a filter: `cargo test -p interlock-soak --test it sentinel::`.

/// Each test here runs a node in a box (containerd, agents, pods) and judges timing
/// budgets on a 2-core machine: they take turns, as they did as separate binaries.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

mod end_check;
mod guard;
mod rollout_stop;
mod runtime_fault;
mod sentinel;
mod short;

//! The soak's integration tests, one binary for all (each file here was a test binary of
//! its own, and every one of them linked tokio and both test kits again). The agent and
//! the plugin are run as the built binaries (`default_bin_dir`).
//!
//! Run one area with a filter: `cargo test -p interlock-soak --test it sentinel::`.

mod end_check;
mod rollout_stop;
mod runtime_fault;
mod sentinel;
mod short;

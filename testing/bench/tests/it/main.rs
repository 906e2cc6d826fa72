//! The bench's integration tests, one binary for all (each file here was a test binary of
//! its own, and every one of them linked the agent, the plugin and both test kits again).
//!
//! Run one area with a filter: `cargo test -p interlock-bench --test it smoke::`.

mod release;
mod repair_return;
mod shipped_plugin;
mod smoke;

//! The `interlock` binary's integration tests (agent, CLI, image, upgrade), one binary
//! for all: each file here was a test binary of its own, and every one of them linked
//! tokio, kube, tonic and the test kits again. The binaries are tested as processes
//! (`env!("CARGO_BIN_EXE_interlock")`).
//!
//! Run one area with a filter: `cargo test -p interlock --test it upgrade::`.

mod common;

mod agent;
mod agent_socket;
mod agent_socket_e2e;
mod audit;
mod capabilities;
mod check;
mod check_cluster;
mod crash;
mod guard_mode;
mod health_flood;
mod image;
mod inspect;
mod kube_agent;
mod logging;
mod manifests;
mod node_scope;
mod scenarios;
mod stalled_guard;
mod uninstall;
mod uninstall_on_exit;
mod upgrade;
mod validate;

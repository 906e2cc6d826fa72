//! The redirect crate's integration tests, one binary for all (each file here was a test
//! binary of its own, and every one of them linked the same dependencies again).
//! `tests/netns_here.rs` stays a binary of its own: the switch it tests is process-wide.
//!
//! Run one area with a filter: `cargo test -p interlock-redirect --test it parity::`.

mod common;

mod iptables_backend;
mod parity;
mod probe_route;
mod probe_running_proxy;
mod sockdiag;
mod traffic;

//! The plugin's integration tests, one binary for all (each file here was a test binary of
//! its own, and every one of them linked the same dependencies again). The binary is
//! tested as a process: `env!("CARGO_BIN_EXE_interlock-cni")`.
//!
//! Run one area with a filter: `cargo test -p interlock-cni --test it verbs::`.

mod common;

mod attachments;
mod chain;
mod families;
mod guard;
mod hygiene;
mod lookup;
mod netns;
mod verbs;
mod wiring;

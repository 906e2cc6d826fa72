//! The `interlock-cni` chained CNI plugin, as a library.
//!
//! `main.rs` only reads the environment and stdin and calls [`run`]; everything else —
//! verbs, plugin config, per-attachment state, the pod decision — lives here so the
//! agent and the benchmarks can use it in-process.

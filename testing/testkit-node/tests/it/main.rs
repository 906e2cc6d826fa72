//! The node-in-a-box kit's integration tests, one binary for all (each file here was a
//! test binary of its own, and every one of them linked tokio, hyper and kube again).
//!
//! Run one area with a filter: `cargo test -p interlock-testkit-node --test it kubeapi::`.

mod containerd;
mod kubeapi;
mod kubeapi_kube_rs;
mod kubeapi_real_clients;
mod node;

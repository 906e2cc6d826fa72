//! The node in a box, for the tests that need a whole node: a private containerd with a
//! locally built pause image ([`containerd`]), a fake Kubernetes API server cross-checked
//! with kubectl, the Python client and kube-rs ([`kubeapi`]), and the two together with
//! the agent ([`node`]).
//!
//! The light helpers (root gating, throwaway netns, traffic, temp dirs) are
//! `interlock-testkit`'s; low-level crates depend on that one only.

pub mod containerd;
pub mod kubeapi;
pub mod kubelet;
pub mod node;

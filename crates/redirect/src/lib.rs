//! The redirection engine.
//!
//! One rule model ([`RedirectSpec`]) for inbound and outbound capture to a pod's proxy,
//! mesh profiles that build it from pod annotations, backends that apply, verify and
//! remove it inside a pod's network namespace, and the probe that proves it with traffic.

pub mod backend;
pub mod netns;
pub mod profile;
pub mod spec;

pub use profile::{decide, ProfileName};
pub use spec::{RedirectSpec, SpecError};

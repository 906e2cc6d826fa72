//! The redirection engine.
//!
//! One rule model ([`RedirectSpec`]) for inbound and outbound capture to a pod's proxy,
//! mesh profiles that build it from pod annotations ([`profile`]), backends that apply,
//! verify and remove it inside a pod's network namespace ([`backend`], [`netns`]), the
//! probe that proves it with traffic ([`probe`]), and the calls the plugin and agent use
//! ([`engine`]: [`install_and_prove`], [`check`], [`remove_rules`]), and the lock and record of a pod
//! netns as the unit of protection ([`netns_record`]).

pub mod backend;
pub mod decision;
pub mod engine;
pub mod netns;
pub mod netns_record;
pub mod probe;
pub mod profile;
pub mod route;
#[cfg(feature = "sockdiag")]
pub mod sockdiag;
pub mod spec;

pub use backend::{BackendKind, Verification};
pub use engine::{
    check, install_and_prove, install_and_prove_with, remove_all_rules, remove_all_rules_with,
    remove_rules, remove_rules_with, EngineError, InstallOptions, Installed, Removal,
};
pub use profile::{spec_for, PodFacts, PodView, ProfileName};
pub use spec::{RedirectSpec, SpecError};

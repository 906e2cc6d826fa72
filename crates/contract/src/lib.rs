//! What interlock's plugin (`interlock-cni`), agent and CLI (`interlock`) exchange, in one
//! place both sides import: the plugin's config and its defaults ([`config`]), the agent's
//! readiness marker ([`marker`]), the agent socket's messages ([`agent_socket`]), the
//! Kubernetes names users configure node pools and alerts with ([`names`]), file names and
//! the state dir's layout ([`layout`]), CNI and interlock error codes with the steps they
//! belong to ([`codes`]), the meshes whose own plugin guard mode keeps in the chain
//! ([`guard`]), the records the plugin keeps per attachment and per netns
//! ([`state`]), atomic writes for all of these files ([`atomic`]) and bounded reads of
//! files others may have planted ([`bounded`]), file names made safe to print
//! ([`shown`]), and the one clock and timestamp format of every log ([`time`]).
//!
//! Depends on serde, nix and thiserror only, so every crate can use it and none drags
//! another's stack in.

pub mod agent_socket;
pub mod atomic;
pub mod bounded;
pub mod codes;
pub mod config;
pub mod guard;
pub mod layout;
pub mod marker;
pub mod names;
pub mod pod;
pub mod profile;
pub mod rbac;
pub mod shown;
pub mod state;
pub mod time;

pub use config::{PluginConfig, PLUGIN_TYPE, POD_ANNOTATIONS_CAPABILITY};
pub use profile::ProfileName;

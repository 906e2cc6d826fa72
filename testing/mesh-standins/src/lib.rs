//! Stand-ins for the meshes' own CNI plugins and installers (guard mode), and
//! the scenarios that put them on a real containerd.
//!
//! - [`plugin`]: the plugin, one binary (`mesh-standin`) installed under the four type
//!   names, writing each mesh's rules from `interlock-mesh-cases`.
//! - [`install`]: the installers' file behaviour and their process
//!   (`mesh-standin install <mesh> …`).
//! - [`scenario`]: the race scenarios (mesh first, primary rewrite, pods before the mesh, installer restart) on a node in a box, with or without interlock,
//!   returning per-pod captured/uncaptured observations.

pub mod files;
pub mod install;
pub mod kube;
pub mod plugin;
pub mod scenario;

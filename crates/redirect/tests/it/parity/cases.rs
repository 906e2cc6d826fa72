//! The cases this test compares: those of `interlock-mesh-cases` for the meshes interlock
//! has a profile for (Istio, Linkerd, Consul; Kuma's cases serve the plugin stand-ins and
//! the harness's self-check), narrowed by `INTERLOCK_PARITY_CASES`.

use super::case::{Case, Mesh};

pub use interlock_mesh_cases::{by_id, not_mapped};

/// Every compared case, narrowed by `INTERLOCK_PARITY_CASES` (comma-separated substrings
/// of `mesh/name`) when set.
pub fn all() -> Vec<Case> {
    let filter: Vec<String> = std::env::var("INTERLOCK_PARITY_CASES")
        .map(|v| {
            v.split(',')
                .map(str::to_string)
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default();
    interlock_mesh_cases::all()
        .into_iter()
        .filter(|c| c.mesh != Mesh::Kuma)
        .filter(|c| filter.is_empty() || filter.iter().any(|f| c.id().contains(f.as_str())))
        .collect()
}

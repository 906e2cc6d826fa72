//! The cases, per mesh, each naming the upstream test or code it comes from.

pub mod consul;
pub mod istio;
pub mod linkerd;

use super::case::Case;

/// Every case of every mesh, narrowed by `INTERLOCK_PARITY_CASES` (comma-separated
/// substrings of `mesh/name`) when set.
pub fn all() -> Vec<Case> {
    let filter: Vec<String> = std::env::var("INTERLOCK_PARITY_CASES")
        .map(|v| {
            v.split(',')
                .map(str::to_string)
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default();
    istio::cases()
        .into_iter()
        .chain(linkerd::cases())
        .chain(consul::cases())
        .filter(|c| filter.is_empty() || filter.iter().any(|f| c.id().contains(f.as_str())))
        .collect()
}

/// One case by its id (`mesh/name`).
pub fn by_id(id: &str) -> Case {
    istio::cases()
        .into_iter()
        .chain(linkerd::cases())
        .chain(consul::cases())
        .find(|c| c.id() == id)
        .unwrap_or_else(|| panic!("no case {id}"))
}

/// Every mesh's upstream configurations that have no case: (mesh, upstream file, why).
pub fn not_mapped() -> Vec<(&'static str, &'static str, &'static str)> {
    let tag = |mesh: &'static str, v: Vec<(&'static str, &'static str)>| {
        v.into_iter().map(move |(f, why)| (mesh, f, why))
    };
    tag("istio", istio::not_mapped())
        .chain(tag("linkerd", linkerd::not_mapped()))
        .chain(tag("consul", consul::not_mapped()))
        .collect()
}

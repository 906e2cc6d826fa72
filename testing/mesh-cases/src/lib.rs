//! The meshes' own redirection rules, one [`Case`] per pod configuration: the pod's
//! annotations and spec facts as the mesh's CNI plugin sees them, and the tables the mesh
//! writes for it, per address family, each naming the upstream test or code it comes from
//! (the facts are from `research/{istio,linkerd,consul,guard-mode}.md`; the tables are
//! written here from them).
//!
//! Two users: the parity test of `interlock-redirect` (interlock's rules against the
//! mesh's, probe by probe) and the mesh plugin stand-ins of `interlock-mesh-standins`
//! (a plugin of the mesh's `type` that writes these rules into a real pod).

#![allow(missing_docs)]

pub mod consul;
pub mod istio;
pub mod kuma;
pub mod linkerd;

use std::collections::BTreeMap;
use std::fmt;

use interlock_contract::pod::{ContainerFacts, PodFacts};

/// The mesh a case comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mesh {
    Istio,
    Linkerd,
    Consul,
    Kuma,
}

impl fmt::Display for Mesh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mesh::Istio => "istio",
            Mesh::Linkerd => "linkerd",
            Mesh::Consul => "consul",
            Mesh::Kuma => "kuma",
        })
    }
}

impl Mesh {
    /// Ports every probe set of the mesh includes: its proxy's ports and the ports its
    /// rules treat specially.
    pub fn special_ports(self) -> &'static [u16] {
        match self {
            Mesh::Istio => &[15001, 15006, 15008, 15020, 15021, 15090, 15053, 53],
            Mesh::Linkerd => &[4140, 4143, 4190, 4191],
            Mesh::Consul => &[20000, 15001, 8600, 53, 19000],
            Mesh::Kuma => &[15001, 15006, 15053, 9000, 9901, 9902],
        }
    }
}

/// What a mesh writes for one address family.
#[derive(Debug, Clone)]
pub enum MeshRules {
    /// `iptables-restore` input (every table the mesh writes).
    Restore(String),
    /// The mesh writes nothing usable for this family (or refuses the pod): why.
    NotWritten(String),
}

/// One case.
#[derive(Debug, Clone)]
pub struct Case {
    pub mesh: Mesh,
    /// Short name, unique within the mesh.
    pub name: String,
    /// The upstream file(s) the configuration and rules come from.
    pub source: String,
    /// How the upstream configuration maps to the pod below (and what is derived).
    pub mapping: String,
    /// The pod's annotations as the mesh's injector and CNI plugin see them.
    pub annotations: BTreeMap<String, String>,
    /// The pod's spec facts (the agent's pod cache).
    pub facts: PodFacts,
    pub v4: MeshRules,
    pub v6: MeshRules,
    /// Under which condition the mesh writes the IPv6 rules compared here.
    pub v6_condition: String,
    /// The proxy's UID and GID (the GID as the proxy container runs; `None`: not set).
    pub proxy_uid: u32,
    pub proxy_gid: Option<u32>,
    /// Ports to probe beyond those named in the rules and the mesh's special ports.
    pub extra_ports: Vec<u16>,
}

impl Case {
    pub fn id(&self) -> String {
        format!("{}/{}", self.mesh, self.name)
    }

    pub fn rules(&self, v6: bool) -> &MeshRules {
        if v6 {
            &self.v6
        } else {
            &self.v4
        }
    }
}

/// Annotations from pairs.
pub fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A pod with an init container, an app container and a proxy container.
pub fn pod_facts(
    init: &str,
    proxy: &str,
    uid: Option<i64>,
    gid: Option<i64>,
    env: &[(&str, &str)],
    args: &[&str],
) -> PodFacts {
    PodFacts {
        labels: BTreeMap::new(),
        containers: vec![
            ContainerFacts::named(init, true),
            ContainerFacts::named("app", false),
            ContainerFacts {
                name: proxy.to_string(),
                init: false,
                run_as_user: uid,
                run_as_group: gid,
                env: env
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                args: args.iter().map(|s| s.to_string()).collect(),
            },
        ],
    }
}

/// The cases of one mesh.
pub fn of(mesh: Mesh) -> Vec<Case> {
    match mesh {
        Mesh::Istio => istio::cases(),
        Mesh::Linkerd => linkerd::cases(),
        Mesh::Consul => consul::cases(),
        Mesh::Kuma => kuma::cases(),
    }
}

/// Every case of every mesh.
pub fn all() -> Vec<Case> {
    [Mesh::Istio, Mesh::Linkerd, Mesh::Consul, Mesh::Kuma]
        .into_iter()
        .flat_map(of)
        .collect()
}

/// One case by its id (`mesh/name`), if there is one.
pub fn find(id: &str) -> Option<Case> {
    all().into_iter().find(|c| c.id() == id)
}

/// One case by its id (`mesh/name`); panics naming the id when there is none.
pub fn by_id(id: &str) -> Case {
    find(id).unwrap_or_else(|| panic!("no case {id}"))
}

/// The case a mesh's plugin stand-in writes when the pod names none: the mesh's default
/// install (no per-pod settings).
pub fn default_case(mesh: Mesh) -> Case {
    by_id(match mesh {
        Mesh::Istio => "istio/basic",
        Mesh::Linkerd => "linkerd/cni-default",
        Mesh::Consul => "consul/W1",
        Mesh::Kuma => "kuma/default",
    })
}

/// Every mesh's upstream configurations that have no case: (mesh, upstream file, why).
pub fn not_mapped() -> Vec<(&'static str, &'static str, &'static str)> {
    let tag = |mesh: &'static str, v: Vec<(&'static str, &'static str)>| {
        v.into_iter().map(move |(f, why)| (mesh, f, why))
    };
    tag("istio", istio::not_mapped())
        .chain(tag("linkerd", linkerd::not_mapped()))
        .chain(tag("consul", consul::not_mapped()))
        .chain(tag("kuma", kuma::not_mapped()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_every_case_names_its_source() {
        let cases = all();
        let mut ids: Vec<String> = cases.iter().map(Case::id).collect();
        ids.sort();
        let before = ids.len();
        ids.dedup();
        assert_eq!(ids.len(), before, "duplicate case ids");
        for c in &cases {
            assert!(!c.source.is_empty(), "{} names no upstream file", c.id());
        }
        for m in [Mesh::Istio, Mesh::Linkerd, Mesh::Consul, Mesh::Kuma] {
            let d = default_case(m);
            assert_eq!(d.mesh, m);
            assert!(matches!(d.v4, MeshRules::Restore(_)), "{}", d.id());
        }
    }
}

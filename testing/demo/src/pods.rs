//! The demo's pods: which mesh each belongs to, the annotations its injector put on it,
//! and the ports its sidecar proxy listens on.

use crate::capture::ProxyPorts;

/// The mesh a pod's sidecar belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mesh {
    /// An Istio sidecar (`sidecar.istio.io/status`): proxy on 15001 out, 15006 in.
    Istio,
    /// A Linkerd proxy (`linkerd.io/proxy-version`): 4140 out, 4143 in.
    Linkerd,
    /// Not meshed: its traffic must be left alone.
    None,
}

impl Mesh {
    /// The annotations the mesh's injector puts on the pod.
    pub fn annotations(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Mesh::Istio => &[(
                "sidecar.istio.io/status",
                r#"{"initContainers":null,"containers":["istio-proxy"]}"#,
            )],
            Mesh::Linkerd => &[("linkerd.io/proxy-version", "stable-2.14.10")],
            Mesh::None => &[],
        }
    }

    /// Where its proxy listens (a pod without a mesh is checked against the Istio ports:
    /// its traffic must land on neither).
    pub fn proxy_ports(self) -> ProxyPorts {
        match self {
            Mesh::Linkerd => ProxyPorts {
                outbound: 4140,
                inbound: 4143,
            },
            Mesh::Istio | Mesh::None => ProxyPorts {
                outbound: 15001,
                inbound: 15006,
            },
        }
    }

    /// Whether the pod needs redirection.
    pub fn meshed(self) -> bool {
        self != Mesh::None
    }

    /// How the output names it.
    pub fn label(self) -> &'static str {
        match self {
            Mesh::Istio => "istio",
            Mesh::Linkerd => "linkerd",
            Mesh::None => "-",
        }
    }
}

/// One pod of a scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodSpec {
    /// Its namespace.
    pub namespace: &'static str,
    /// Its name.
    pub name: &'static str,
    /// Its mesh.
    pub mesh: Mesh,
}

impl PodSpec {
    /// The pod's UID (stable per name: each node has its own API server).
    pub fn uid(&self) -> String {
        format!("uid-{}-{}", self.namespace, self.name)
    }

    /// `namespace/name`.
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The pods every scenario runs: two meshed (one per mesh), one not.
pub const PODS: [PodSpec; 3] = [
    PodSpec {
        namespace: "shop",
        name: "web",
        mesh: Mesh::Istio,
    },
    PodSpec {
        namespace: "shop",
        name: "api",
        mesh: Mesh::Linkerd,
    },
    PodSpec {
        namespace: "shop",
        name: "db",
        mesh: Mesh::None,
    },
];

/// The pods of the guarded-mesh scenario: two Istio pods, each started in one of
/// istio-cni's windows, and one not meshed.
pub const GUARDED_PODS: [PodSpec; 3] = [
    PodSpec {
        namespace: "shop",
        name: "web",
        mesh: Mesh::Istio,
    },
    PodSpec {
        namespace: "shop",
        name: "cart",
        mesh: Mesh::Istio,
    },
    PodSpec {
        namespace: "shop",
        name: "db",
        mesh: Mesh::None,
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mesh_has_its_proxy_ports() {
        assert_eq!(Mesh::Istio.proxy_ports().outbound, 15001);
        assert_eq!(Mesh::Linkerd.proxy_ports().inbound, 4143);
        assert!(PODS.iter().filter(|p| p.mesh.meshed()).count() == 2);
    }
}

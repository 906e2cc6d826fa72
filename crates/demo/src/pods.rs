//! The demo's pods: which mesh each belongs to, the annotations its injector put on it,
//! the ports its sidecar proxy listens on, and its object in the Kubernetes API.

use serde_json::{json, Value};

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

    /// The pod as the API holds it once the scheduler bound it to `node`.
    pub fn api_object(&self, node: &str) -> Value {
        let annotations: serde_json::Map<String, Value> = self
            .mesh
            .annotations()
            .iter()
            .map(|(k, v)| ((*k).to_string(), Value::String((*v).to_string())))
            .collect();
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "uid": self.uid(),
                "labels": {"app": self.name},
                "annotations": annotations,
            },
            "spec": {
                "nodeName": node,
                "containers": [{"name": "app", "image": "registry.example/app:1"}],
            },
            "status": {"phase": "Running"},
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_object_carries_the_injectors_annotations_and_the_node() {
        let v = PODS[0].api_object("n1");
        assert_eq!(v["spec"]["nodeName"], "n1");
        assert_eq!(v["metadata"]["uid"], "uid-shop-web");
        assert!(v["metadata"]["annotations"]["sidecar.istio.io/status"].is_string());
        let plain = PODS[2].api_object("n1");
        assert_eq!(plain["metadata"]["annotations"], json!({}));
    }

    #[test]
    fn each_mesh_has_its_proxy_ports() {
        assert_eq!(Mesh::Istio.proxy_ports().outbound, 15001);
        assert_eq!(Mesh::Linkerd.proxy_ports().inbound, 4143);
        assert!(PODS.iter().filter(|p| p.mesh.meshed()).count() == 2);
    }
}

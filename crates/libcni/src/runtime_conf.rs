//! The per-attachment parameters of a call, as libcni's `RuntimeConf` carries them: shared
//! by the code that runs plugins ([`crate::exec`]) and the result cache that keys on them
//! ([`crate::result_cache`]).

use serde_json::{Map, Value};

/// Per-attachment parameters of a call (libcni `RuntimeConf`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RuntimeConf {
    /// `CNI_CONTAINERID` (the sandbox id).
    pub container_id: String,
    /// `CNI_NETNS` (path of the netns; empty on a late DEL).
    pub netns: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// `CNI_ARGS` pairs, joined as `K=V;K=V`.
    pub args: Vec<(String, String)>,
    /// Capability arguments (`portMappings`, `io.kubernetes.cri.pod-annotations`, …),
    /// injected as `runtimeConfig` into plugins that declare the capability.
    pub capability_args: Map<String, Value>,
}

impl RuntimeConf {
    /// A runtime conf for one attachment.
    pub fn new(container_id: &str, netns: &str, ifname: &str) -> RuntimeConf {
        RuntimeConf {
            container_id: container_id.into(),
            netns: netns.into(),
            ifname: ifname.into(),
            ..RuntimeConf::default()
        }
    }

    /// Adds a `CNI_ARGS` pair.
    pub fn with_arg(mut self, key: &str, value: &str) -> RuntimeConf {
        self.args.push((key.into(), value.into()));
        self
    }

    /// Adds a capability argument.
    pub fn with_capability(mut self, capability: &str, value: Value) -> RuntimeConf {
        self.capability_args.insert(capability.into(), value);
        self
    }

    /// `CNI_ARGS` as the runtime passes it.
    pub fn cni_args(&self) -> String {
        self.args
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(";")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cni_args_are_joined_as_the_runtime_passes_them() {
        let rt = RuntimeConf::new("c", "", "eth0")
            .with_arg("K8S_POD_NAMESPACE", "ns")
            .with_arg("IgnoreUnknown", "1");
        assert_eq!(rt.cni_args(), "K8S_POD_NAMESPACE=ns;IgnoreUnknown=1");
    }
}

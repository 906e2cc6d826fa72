//! What a runtime's verbose `PodSandboxStatus` info says about the sandbox's network
//! namespace: a pure function over the `info` map, because every runtime version puts it
//! somewhere else.
//!
//! Known forms, all under the key `"info"` whose value is a JSON document:
//! - `runtimeSpec.linux.namespaces[type == "network"].path`: the OCI spec of the sandbox
//!   (pause) container. containerd 1.6 reports the path only here; 1.7, 2.x and CRI-O
//!   carry it too while the sandbox container exists.
//! - `sandboxMetadata.Metadata.NetNSPath`: containerd's stored sandbox metadata
//!   (versioned, `{"Version": "v1", "Metadata": {...}}`), reported by 1.7's sandbox-API
//!   server (`pkg/cri/sbserver`) and by 2.x, also for a sandbox whose container is gone.
//! - `cniResult.Interfaces.<ifname>.Sandbox`: go-cni's summary of the CNI result
//!   (containerd 1.6+), the netns path the chain was run in; `eth0` preferred.
//!
//! The first form found in that order wins: the runtime spec is the namespace the pause
//! process joined. A stopped containerd sandbox still names its path while
//! `netNamespaceClosed` is true (the file is gone): check [`VerboseInfo::netns_closed`].

use std::collections::HashMap;
use std::path::PathBuf;

use serde_json::Value;

/// Which part of the verbose info named the network namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetnsSource {
    /// `runtimeSpec.linux.namespaces[type=network].path` (containerd 1.6+, CRI-O).
    RuntimeSpec,
    /// `sandboxMetadata.Metadata.NetNSPath` (containerd 1.7 sandbox API, 2.x).
    SandboxMetadata,
    /// `cniResult.Interfaces.<ifname>.Sandbox` (containerd 1.6+).
    CniResult,
}

/// A sandbox's network namespace file and where the runtime said so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetnsPath {
    /// The bind-mounted namespace file, e.g. `/var/run/netns/cni-<uuid>`.
    pub path: PathBuf,
    /// Which part of the info named it.
    pub source: NetnsSource,
}

/// What the verbose info says about a sandbox's process and network namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerboseInfo {
    /// The network namespace file; `None` for a host-network sandbox, a sandbox not fully
    /// created, or a runtime whose info names none.
    pub netns: Option<NetnsPath>,
    /// `netNamespaceClosed` as the runtime reported it (containerd), if it did.
    pub netns_closed: Option<bool>,
    /// The sandbox process's PID in the host PID namespace, if reported and non-zero.
    pub pid: Option<u32>,
}

/// Reads the network namespace (and PID) from a verbose `PodSandboxStatus` info map.
///
/// A map without `"info"` (a non-verbose answer) yields an empty [`VerboseInfo`]; an
/// `"info"` that is not a JSON object is an error, since the runtime documents JSON there.
/// Parts of unknown shape are treated as absent rather than failing the sandbox.
pub fn parse_verbose_info(info: &HashMap<String, String>) -> Result<VerboseInfo, String> {
    let Some(raw) = info.get("info") else {
        return Ok(VerboseInfo::default());
    };
    let doc: Value =
        serde_json::from_str(raw).map_err(|e| format!("info[\"info\"] is not JSON: {e}"))?;
    if !doc.is_object() {
        return Err("info[\"info\"] is not a JSON object".to_string());
    }
    let netns = netns_in_runtime_spec(&doc)
        .map(|path| NetnsPath {
            path,
            source: NetnsSource::RuntimeSpec,
        })
        .or_else(|| {
            netns_in_sandbox_metadata(&doc).map(|path| NetnsPath {
                path,
                source: NetnsSource::SandboxMetadata,
            })
        })
        .or_else(|| {
            netns_in_cni_result(&doc).map(|path| NetnsPath {
                path,
                source: NetnsSource::CniResult,
            })
        });
    Ok(VerboseInfo {
        netns,
        netns_closed: doc.get("netNamespaceClosed").and_then(Value::as_bool),
        pid: doc
            .get("pid")
            .and_then(Value::as_u64)
            .and_then(|p| u32::try_from(p).ok())
            .filter(|&p| p != 0),
    })
}

fn netns_in_runtime_spec(doc: &Value) -> Option<PathBuf> {
    doc.pointer("/runtimeSpec/linux/namespaces")?
        .as_array()?
        .iter()
        .find(|ns| ns.get("type").and_then(Value::as_str) == Some("network"))?
        .get("path")
        .and_then(Value::as_str)
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
}

fn netns_in_sandbox_metadata(doc: &Value) -> Option<PathBuf> {
    let metadata = doc.get("sandboxMetadata")?;
    // Stored versioned; accept the bare struct too in case a version drops the wrapper.
    metadata
        .pointer("/Metadata/NetNSPath")
        .or_else(|| metadata.get("NetNSPath"))
        .and_then(Value::as_str)
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
}

fn netns_in_cni_result(doc: &Value) -> Option<PathBuf> {
    let interfaces = doc.pointer("/cniResult/Interfaces")?.as_object()?;
    let sandbox_of = |iface: &Value| {
        iface
            .get("Sandbox")
            .and_then(Value::as_str)
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
    };
    // eth0 is the pod's interface; any other with a sandbox path names the same netns
    // (`lo` does too).
    interfaces
        .get("eth0")
        .and_then(sandbox_of)
        .or_else(|| interfaces.values().find_map(sandbox_of))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Captured from containerd 1.6.20 (Debian 12) through the test kit: a ready sandbox.
    const CONTAINERD_16_READY: &str = include_str!("../fixtures/containerd-1.6.20-ready.json");
    /// The same sandbox after StopPodSandbox.
    const CONTAINERD_16_STOPPED: &str = include_str!("../fixtures/containerd-1.6.20-stopped.json");
    const NETNS_16: &str = "/var/run/netns/cni-812e0e2e-900e-61e2-28d3-4fdbba20197f";

    fn info(doc: &str) -> HashMap<String, String> {
        HashMap::from([("info".to_string(), doc.to_string())])
    }

    fn parsed(doc: Value) -> VerboseInfo {
        parse_verbose_info(&info(&doc.to_string())).unwrap()
    }

    #[test]
    fn containerd_16_names_the_netns_in_the_runtime_spec() {
        let v = parse_verbose_info(&info(CONTAINERD_16_READY)).unwrap();
        assert_eq!(
            v.netns,
            Some(NetnsPath {
                path: PathBuf::from(NETNS_16),
                source: NetnsSource::RuntimeSpec
            })
        );
        assert_eq!(v.netns_closed, Some(false));
        assert_eq!(v.pid, Some(27431));
    }

    #[test]
    fn a_stopped_containerd_16_sandbox_still_names_its_closed_netns() {
        let v = parse_verbose_info(&info(CONTAINERD_16_STOPPED)).unwrap();
        assert_eq!(v.netns.unwrap().path, PathBuf::from(NETNS_16));
        assert_eq!(v.netns_closed, Some(true));
        assert_eq!(v.pid, None, "pid 0 means no process");
    }

    #[test]
    fn without_a_runtime_spec_the_cni_result_names_it() {
        let mut doc: Value = serde_json::from_str(CONTAINERD_16_READY).unwrap();
        doc["runtimeSpec"] = Value::Null;
        let v = parsed(doc);
        assert_eq!(
            v.netns,
            Some(NetnsPath {
                path: PathBuf::from(NETNS_16),
                source: NetnsSource::CniResult
            })
        );
    }

    /// containerd 1.7 (sandbox API) and 2.x add the stored metadata; 2.x reports only
    /// that, the config and the CNI result for a sandbox whose container is gone
    /// (`toDeletedCRISandboxInfo`). Shape from containerd's `SandboxInfo` and
    /// `sandboxstore.Metadata` (versioned JSON); not captured from a running 2.x.
    #[test]
    fn containerd_2_names_it_in_the_sandbox_metadata() {
        let v = parsed(json!({
            "pid": 0,
            "processStatus": "deleted",
            "netNamespaceClosed": false,
            "config": {"metadata": {"name": "web", "namespace": "default", "uid": "u"}},
            "runtimeSpec": null,
            "cniResult": null,
            "sandboxMetadata": {
                "Version": "v1",
                "Metadata": {
                    "ID": "abc",
                    "Name": "web_default_u_0",
                    "NetNSPath": "/var/run/netns/cni-2x",
                    "IP": "10.1.0.5",
                    "AdditionalIPs": null,
                    "RuntimeHandler": "",
                    "CNIResult": null,
                    "ProcessLabel": ""
                }
            }
        }));
        assert_eq!(
            v.netns,
            Some(NetnsPath {
                path: PathBuf::from("/var/run/netns/cni-2x"),
                source: NetnsSource::SandboxMetadata
            })
        );
        assert_eq!(v.netns_closed, Some(false));
    }

    #[test]
    fn the_runtime_spec_wins_over_the_other_forms() {
        let v = parsed(json!({
            "runtimeSpec": {"linux": {"namespaces": [
                {"type": "pid"},
                {"type": "network", "path": "/var/run/netns/cni-spec"}
            ]}},
            "sandboxMetadata": {"Version": "v1", "Metadata": {"NetNSPath": "/var/run/netns/cni-meta"}},
            "cniResult": {"Interfaces": {"eth0": {"Sandbox": "/var/run/netns/cni-result"}}}
        }));
        assert_eq!(
            v.netns.unwrap().path,
            PathBuf::from("/var/run/netns/cni-spec")
        );
        let v = parsed(json!({
            "sandboxMetadata": {"Version": "v1", "Metadata": {"NetNSPath": "/var/run/netns/cni-meta"}},
            "cniResult": {"Interfaces": {"eth0": {"Sandbox": "/var/run/netns/cni-result"}}}
        }));
        assert_eq!(v.netns.unwrap().source, NetnsSource::SandboxMetadata);
    }

    /// CRI-O puts an OCI spec under the same key; a bare metadata struct is accepted too.
    #[test]
    fn cri_o_and_unwrapped_metadata_are_read() {
        let v = parsed(json!({"runtimeSpec": {"linux": {"namespaces": [
            {"type": "network", "path": "/var/run/netns/crio-1"}
        ]}}, "pid": 42}));
        assert_eq!(
            v.netns.unwrap().path,
            PathBuf::from("/var/run/netns/crio-1")
        );
        assert_eq!(v.pid, Some(42));
        let v = parsed(json!({"sandboxMetadata": {"NetNSPath": "/var/run/netns/bare"}}));
        assert_eq!(v.netns.unwrap().path, PathBuf::from("/var/run/netns/bare"));
    }

    #[test]
    fn host_network_and_empty_paths_name_no_netns() {
        // A host-network sandbox has no network entry in its spec and no NetNSPath.
        let v = parsed(json!({
            "runtimeSpec": {"linux": {"namespaces": [{"type": "pid"}, {"type": "ipc"}]}},
            "sandboxMetadata": {"Version": "v1", "Metadata": {"NetNSPath": ""}},
            "cniResult": null
        }));
        assert_eq!(v.netns, None);
        // A network entry without a path is a namespace runc creates, not a file.
        let v = parsed(json!({"runtimeSpec": {"linux": {"namespaces": [{"type": "network"}]}}}));
        assert_eq!(v.netns, None);
        // The CNI result's bridge and host veth have no sandbox.
        let v = parsed(json!({"cniResult": {"Interfaces": {"cni0": {"Sandbox": ""}}}}));
        assert_eq!(v.netns, None);
    }

    #[test]
    fn unknown_shapes_are_absent_not_errors() {
        let v = parsed(json!({
            "runtimeSpec": {"linux": {"namespaces": "not a list"}},
            "sandboxMetadata": 7,
            "cniResult": {"Interfaces": []},
            "pid": "x",
            "netNamespaceClosed": "no"
        }));
        assert_eq!(v, VerboseInfo::default());
    }

    #[test]
    fn no_info_key_is_empty_and_bad_json_is_an_error() {
        assert_eq!(
            parse_verbose_info(&HashMap::new()).unwrap(),
            VerboseInfo::default()
        );
        let err = parse_verbose_info(&info("{not json")).unwrap_err();
        assert!(err.contains("not JSON"), "{err}");
        let err = parse_verbose_info(&info("[1]")).unwrap_err();
        assert!(err.contains("not a JSON object"), "{err}");
    }
}

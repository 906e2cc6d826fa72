//! libcni's result cache (`<cacheDir>/results/<network>-<containerID>-<ifname>`), read and
//! written in the same `cniCacheV1` format, so that interlock sees what containerd and
//! CRI-O recorded (which sandbox got which result from which config) and a
//! [`crate::exec::Chain`] can keep its own cache the same way.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use interlock_cni_types::result::CniResult;
use interlock_cni_types::version::CniVersion;
use interlock_contract::atomic::write_file_atomic;

use crate::runtime_conf::RuntimeConf;

/// The `kind` of a libcni cache entry.
pub const CACHE_KIND: &str = "cniCacheV1";

/// libcni's default cache directory.
pub const DEFAULT_CACHE_DIR: &str = "/var/lib/cni";

/// One cache entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CachedAttachment {
    /// Always `cniCacheV1`.
    pub kind: String,
    /// The container (sandbox) id.
    #[serde(rename = "containerId", alias = "containerID")]
    pub container_id: String,
    /// The network config list bytes used for ADD (base64 in the file, like Go's `[]byte`).
    #[serde(with = "base64_bytes")]
    pub config: Vec<u8>,
    /// The interface name.
    #[serde(rename = "ifName")]
    pub ifname: String,
    /// The network (list) name.
    #[serde(rename = "networkName")]
    pub network_name: String,
    /// The netns path at ADD (newer libcni only).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub netns: String,
    /// `CNI_ARGS` pairs.
    #[serde(rename = "cniArgs", default, skip_serializing_if = "Vec::is_empty")]
    pub cni_args: Vec<[String; 2]>,
    /// Capability arguments.
    #[serde(
        rename = "capabilityArgs",
        default,
        skip_serializing_if = "Map::is_empty"
    )]
    pub capability_args: Map<String, Value>,
    /// The chain's ADD result, as the last plugin wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
}

impl CachedAttachment {
    /// The cached result converted to `version` (libcni `GetAsVersion`).
    pub fn result_as(&self, version: CniVersion) -> Option<CniResult> {
        let raw = self.result.clone()?;
        CniResult::from_value(raw, Some(version))
            .ok()
            .map(|r| r.convert(version))
    }
}

/// A libcni-format result cache rooted at a cache directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultCache {
    results: PathBuf,
}

impl Default for ResultCache {
    fn default() -> Self {
        ResultCache::new(Path::new(DEFAULT_CACHE_DIR))
    }
}

impl ResultCache {
    /// The cache under `cache_dir` (files in `cache_dir/results`).
    pub fn new(cache_dir: &Path) -> ResultCache {
        ResultCache {
            results: cache_dir.join("results"),
        }
    }

    /// The `results` directory.
    pub fn dir(&self) -> &Path {
        &self.results
    }

    /// The file for one attachment.
    pub fn path(&self, network: &str, container_id: &str, ifname: &str) -> PathBuf {
        self.results
            .join(format!("{network}-{container_id}-{ifname}"))
    }

    /// Records a successful ADD (libcni `cacheAdd`).
    pub fn write(
        &self,
        network: &str,
        config: &[u8],
        rt: &RuntimeConf,
        result: &CniResult,
    ) -> io::Result<()> {
        let entry = CachedAttachment {
            kind: CACHE_KIND.into(),
            container_id: rt.container_id.clone(),
            config: config.to_vec(),
            ifname: rt.ifname.clone(),
            network_name: network.into(),
            netns: rt.netns.clone(),
            cni_args: rt
                .args
                .iter()
                .map(|(k, v)| [k.clone(), v.clone()])
                .collect(),
            capability_args: rt.capability_args.clone(),
            result: Some(result.to_value()),
        };
        fs::create_dir_all(&self.results)?;
        let data = serde_json::to_vec(&entry).map_err(io::Error::other)?;
        write_file_atomic(
            &self.path(network, &rt.container_id, &rt.ifname),
            &data,
            Some(0o600),
        )
    }

    /// Reads one entry; `Ok(None)` when there is none.
    pub fn read(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
    ) -> io::Result<Option<CachedAttachment>> {
        let path = self.path(network, container_id, ifname);
        match fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: {e}", path.display()),
                )
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Removes one entry (libcni `cacheDel`); missing is fine.
    pub fn remove(&self, network: &str, container_id: &str, ifname: &str) -> io::Result<()> {
        match fs::remove_file(self.path(network, container_id, ifname)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Every readable `cniCacheV1` entry, optionally only those of one container, sorted
    /// by file name (libcni `GetCachedAttachments`). Unreadable files are skipped.
    pub fn list(&self, container_id: Option<&str>) -> io::Result<Vec<CachedAttachment>> {
        let entries = match fs::read_dir(&self.results) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut names: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        names.sort();
        let mut out = Vec::new();
        for path in names {
            let Ok(bytes) = fs::read(&path) else { continue };
            let Ok(entry) = serde_json::from_slice::<CachedAttachment>(&bytes) else {
                continue;
            };
            if entry.kind != CACHE_KIND || entry.ifname.is_empty() || entry.network_name.is_empty()
            {
                continue;
            }
            if container_id.is_some_and(|c| c != entry.container_id) {
                continue;
            }
            out.push(entry);
        }
        Ok(out)
    }
}

/// Go's `[]byte` JSON encoding: standard base64 with padding.
mod base64_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    pub fn encode(data: &[u8]) -> String {
        let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
        for chunk in data.chunks(3) {
            let b = [
                chunk[0],
                *chunk.get(1).unwrap_or(&0),
                *chunk.get(2).unwrap_or(&0),
            ];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            for i in 0..4 {
                if i <= chunk.len() {
                    out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    pub fn decode(s: &str) -> Result<Vec<u8>, String> {
        let s = s.trim_end_matches('=');
        let mut out = Vec::with_capacity(s.len() * 3 / 4);
        let mut acc = 0u32;
        let mut bits = 0;
        for c in s.bytes() {
            let v = ALPHABET
                .iter()
                .position(|&a| a == c)
                .ok_or_else(|| format!("invalid base64 character {:?}", c as char))?;
            acc = (acc << 6) | v as u32;
            bits += 6;
            if bits >= 8 {
                bits -= 8;
                out.push((acc >> bits) as u8);
                acc &= (1 << bits) - 1;
            }
        }
        Ok(out)
    }

    pub fn serialize<S: Serializer>(data: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&encode(data))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = Option::<String>::deserialize(d)?.unwrap_or_default();
        decode(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reads_a_libcni_entry() {
        let t = tempfile::tempdir().unwrap();
        let c = ResultCache::new(t.path());
        fs::create_dir_all(c.dir()).unwrap();
        // As containerd writes it ("config" is base64 of the list bytes).
        let go = r#"{"kind":"cniCacheV1","containerId":"abc","config":"eyJuYW1lIjoiazhzIn0=","ifName":"eth0","networkName":"k8s","netns":"/var/run/netns/cni-1","cniArgs":[["K8S_POD_NAME","p"]],"capabilityArgs":{"io.kubernetes.cri.pod-annotations":null},"result":{"cniVersion":"0.4.0","ips":[{"version":"4","address":"10.99.0.9/24"}],"dns":{}}}"#;
        fs::write(c.path("k8s", "abc", "eth0"), go).unwrap();
        fs::write(c.dir().join("junk"), "x").unwrap();
        let e = c.read("k8s", "abc", "eth0").unwrap().unwrap();
        assert_eq!(e.config, br#"{"name":"k8s"}"#);
        assert_eq!(e.cni_args, [["K8S_POD_NAME".to_string(), "p".to_string()]]);
        let r = e.result_as(CniVersion::V1_0_0).unwrap();
        assert_eq!(r.ips[0].address, "10.99.0.9/24");
        assert_eq!(r.ips[0].version, None);
        assert_eq!(c.list(None).unwrap().len(), 1);
        assert_eq!(c.list(Some("other")).unwrap().len(), 0);
        // Round trip through our writer gives the same fields.
        let rt =
            RuntimeConf::new("abc", "/var/run/netns/cni-1", "eth0").with_arg("K8S_POD_NAME", "p");
        c.write("k8s", br#"{"name":"k8s"}"#, &rt, &r).unwrap();
        let back = c.read("k8s", "abc", "eth0").unwrap().unwrap();
        assert_eq!(back.config, e.config);
        assert_eq!(back.result_as(CniVersion::V1_0_0).unwrap(), r);
        c.remove("k8s", "abc", "eth0").unwrap();
        c.remove("k8s", "abc", "eth0").unwrap();
        assert!(c.read("k8s", "abc", "eth0").unwrap().is_none());
    }

    proptest! {
        #[test]
        fn base64_round_trips(data in prop::collection::vec(any::<u8>(), 0..64)) {
            let s = base64_bytes::encode(&data);
            prop_assert_eq!(s.len() % 4, 0);
            prop_assert_eq!(base64_bytes::decode(&s).unwrap(), data);
        }
    }

    #[test]
    fn base64_matches_go() {
        assert_eq!(base64_bytes::encode(b"f"), "Zg==");
        assert_eq!(base64_bytes::encode(b"fo"), "Zm8=");
        assert_eq!(base64_bytes::encode(b"foo"), "Zm9v");
        assert!(base64_bytes::decode("Zm9v!").is_err());
    }
}

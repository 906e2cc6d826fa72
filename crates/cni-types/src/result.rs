//! ADD results for spec versions 0.3.0 to 1.1.0, and conversion between them as libcni
//! does it.
//!
//! One model covers every supported version. The differences are handled on parse and on
//! conversion:
//! - 0.3.0/0.3.1/0.4.0 (libcni `types040`) carry `ips[].version` ("4"/"6"); converting
//!   down computes it from the address, converting up to 1.x drops it;
//! - 1.1.0 adds `interfaces[].mtu`, `socketPath`, `pciID`, which the 0.x shape lacks
//!   (dropped when converting down; kept between 1.0.0 and 1.1.0, as libcni does);
//! - `ips[].interface` is an index into `interfaces` in every version and is kept.
//!
//! Routes and DNS share one shape across versions (libcni `types.Route`, `types.DNS`).

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::version::CniVersion;

/// A CNI result (`cniVersion`, `interfaces`, `ips`, `routes`, `dns`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CniResult {
    /// The version this result is expressed in.
    #[serde(rename = "cniVersion")]
    pub cni_version: CniVersion,
    /// Interfaces created or known by the chain.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<Interface>,
    /// Addresses assigned.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<IpConfig>,
    /// Routes installed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
    /// DNS settings (libcni always prints the object, possibly empty).
    #[serde(default)]
    pub dns: Dns,
}

/// One entry of `interfaces`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Interface {
    /// Interface name.
    pub name: String,
    /// Hardware address.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    /// MTU (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Netns path for interfaces inside the container; empty for host interfaces.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sandbox: String,
    /// vhost-user socket path (1.1.0).
    #[serde(
        rename = "socketPath",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub socket_path: String,
    /// PCI address (1.1.0).
    #[serde(rename = "pciID", default, skip_serializing_if = "String::is_empty")]
    pub pci_id: String,
}

/// One entry of `ips`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct IpConfig {
    /// Index into `interfaces` of the interface carrying the address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
    /// Address with prefix length, e.g. `10.99.0.2/24`.
    pub address: String,
    /// Gateway, if any.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub gateway: String,
    /// `"4"` or `"6"`: present in 0.3.x/0.4.0 results only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

impl IpConfig {
    /// The address without its prefix length, if it parses.
    pub fn ip(&self) -> Option<IpAddr> {
        self.address.split('/').next()?.parse().ok()
    }

    /// `"4"` or `"6"` from the address (what libcni's down-conversion writes).
    pub fn family(&self) -> Option<&'static str> {
        self.ip().map(|ip| if ip.is_ipv4() { "4" } else { "6" })
    }
}

/// One entry of `routes`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Route {
    /// Destination prefix.
    pub dst: String,
    /// Next hop, if any.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub gw: String,
    /// Route MTU (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Advertised MSS (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advmss: Option<u32>,
    /// Route priority (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    /// Routing table (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
    /// Route scope (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<u32>,
}

/// DNS settings.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Dns {
    /// Name servers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    /// Local domain.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub domain: String,
    /// Search domains.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    /// Resolver options.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// Why a result could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ResultError {
    /// Not JSON or not the result shape.
    #[error("invalid result JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The result's `cniVersion` is missing and no fallback was given, or unsupported.
    #[error(
        "result cniVersion {0:?} is not supported (supported: 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0)"
    )]
    Version(String),
}

impl CniResult {
    /// An empty result in `version`.
    pub fn empty(version: CniVersion) -> CniResult {
        CniResult {
            cni_version: version,
            interfaces: Vec::new(),
            ips: Vec::new(),
            routes: Vec::new(),
            dns: Dns::default(),
        }
    }

    /// Parses a result. Like libcni, a result without `cniVersion` is read in
    /// `fallback` (the config's version). The result is normalised to its version's
    /// shape (1.x: no `ips[].version`; 0.x: `version` filled in from the address).
    pub fn parse(bytes: &[u8], fallback: Option<CniVersion>) -> Result<CniResult, ResultError> {
        let value: serde_json::Value = serde_json::from_slice(bytes)?;
        CniResult::from_value(value, fallback)
    }

    /// Like [`CniResult::parse`] from an already parsed JSON value (e.g. `prevResult`).
    pub fn from_value(
        mut value: serde_json::Value,
        fallback: Option<CniVersion>,
    ) -> Result<CniResult, ResultError> {
        if let Some(obj) = value.as_object_mut() {
            let version = match obj.get("cniVersion").and_then(|v| v.as_str()) {
                Some(v) => v.to_string(),
                None => fallback.map(|f| f.to_string()).unwrap_or_default(),
            };
            let parsed: CniVersion = version
                .parse()
                .map_err(|_| ResultError::Version(version.clone()))?;
            obj.insert("cniVersion".into(), serde_json::Value::String(version));
            let mut r: CniResult = serde_json::from_value(value)?;
            r.normalise(parsed);
            return Ok(r);
        }
        Ok(serde_json::from_value(value)?)
    }

    /// [`CniResult::from_value_ref`] from the result's JSON text (the plugin's `prevResult`,
    /// on every ADD): a result that names a known version is read straight into its
    /// types, without building a generic value first; anything else takes the generic
    /// path, with its version fallback and its errors.
    pub fn from_raw(
        raw: &serde_json::value::RawValue,
        fallback: Option<CniVersion>,
    ) -> Result<CniResult, ResultError> {
        if let Ok(mut r) = serde_json::from_str::<CniResult>(raw.get()) {
            let version = r.cni_version;
            r.normalise(version);
            return Ok(r);
        }
        let value: serde_json::Value = serde_json::from_str(raw.get())?;
        CniResult::from_value_ref(&value, fallback)
    }

    /// [`CniResult::from_value`] without taking (or copying) the value: a result that
    /// names its version is read in place.
    pub fn from_value_ref(
        value: &serde_json::Value,
        fallback: Option<CniVersion>,
    ) -> Result<CniResult, ResultError> {
        let Some(version) = value.get("cniVersion").and_then(|v| v.as_str()) else {
            return CniResult::from_value(value.clone(), fallback);
        };
        let parsed: CniVersion = version
            .parse()
            .map_err(|_| ResultError::Version(version.to_string()))?;
        let mut r = CniResult::deserialize(value)?;
        r.normalise(parsed);
        Ok(r)
    }

    fn normalise(&mut self, to: CniVersion) {
        self.cni_version = to;
        if to.is_1x() {
            for ip in &mut self.ips {
                ip.version = None;
            }
        } else {
            for ip in &mut self.ips {
                if ip.version.as_deref().is_none_or(str::is_empty) {
                    ip.version = ip.family().map(str::to_string);
                }
            }
            for i in &mut self.interfaces {
                i.mtu = None;
                i.socket_path.clear();
                i.pci_id.clear();
            }
        }
    }

    /// The result expressed in `to`, as libcni's `GetAsVersion` converts it.
    pub fn convert(&self, to: CniVersion) -> CniResult {
        let mut r = self.clone();
        if !to.is_1x() {
            // 1.x → 0.x recomputes the family from the address; 0.x → 0.x keeps it.
            if self.cni_version.is_1x() {
                for ip in &mut r.ips {
                    ip.version = ip.family().map(str::to_string);
                }
            }
        }
        r.normalise(to);
        r
    }

    /// The result as compact JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The result as a JSON value (for injecting as `prevResult`).
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }

    /// The addresses assigned to the interface called `ifname` inside the sandbox (or to
    /// any interface, for entries without an `interface` index).
    pub fn ips_on(&self, ifname: &str) -> Vec<&IpConfig> {
        self.ips
            .iter()
            .filter(|ip| match ip.interface {
                Some(i) => self.interfaces.get(i).is_some_and(|x| x.name == ifname),
                None => true,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const BRIDGE_031: &str = r#"{"cniVersion":"0.3.1","interfaces":[{"name":"cni0","mac":"aa:bb:cc:dd:ee:01"},{"name":"veth1","mac":"aa:bb:cc:dd:ee:02"},{"name":"eth0","mac":"aa:bb:cc:dd:ee:03","sandbox":"/var/run/netns/x"}],"ips":[{"version":"4","interface":2,"address":"10.99.0.2/24","gateway":"10.99.0.1"},{"version":"6","interface":2,"address":"fd99::2/64"}],"routes":[{"dst":"0.0.0.0/0"}],"dns":{}}"#;

    #[test]
    fn parses_a_bridge_result_and_keeps_its_shape() {
        let r = CniResult::parse(BRIDGE_031.as_bytes(), None).unwrap();
        assert_eq!(r.cni_version, CniVersion::V0_3_1);
        assert_eq!(r.ips_on("eth0").len(), 2);
        assert_eq!(r.ips[0].ip().unwrap().to_string(), "10.99.0.2");
        let back: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        let orig: serde_json::Value = serde_json::from_str(BRIDGE_031).unwrap();
        assert_eq!(back, orig);
    }

    #[test]
    fn up_conversion_drops_version_and_down_conversion_restores_it() {
        let r = CniResult::parse(BRIDGE_031.as_bytes(), None).unwrap();
        let up = r.convert(CniVersion::V1_0_0);
        assert!(up.ips.iter().all(|i| i.version.is_none()));
        assert!(!up.to_json().contains("\"version\""));
        assert_eq!(up.ips[0].interface, Some(2));
        let down = up.convert(CniVersion::V0_4_0);
        assert_eq!(down.ips[0].version.as_deref(), Some("4"));
        assert_eq!(down.ips[1].version.as_deref(), Some("6"));
        assert_eq!(down.cni_version, CniVersion::V0_4_0);
        assert_eq!(down.convert(CniVersion::V0_3_1), r);
    }

    #[test]
    fn missing_version_falls_back_to_the_config_version() {
        let r = CniResult::parse(
            br#"{"ips":[{"address":"10.99.0.5/24","version":"4"}]}"#,
            Some(CniVersion::V1_0_0),
        )
        .unwrap();
        assert_eq!(r.cni_version, CniVersion::V1_0_0);
        assert_eq!(r.ips[0].version, None);
        assert!(CniResult::parse(br#"{"ips":[]}"#, None).is_err());
        assert!(matches!(
            CniResult::parse(br#"{"cniVersion":"0.2.0","ip4":{"ip":"10.0.0.1/24"}}"#, None),
            Err(ResultError::Version(v)) if v == "0.2.0"
        ));
    }

    #[test]
    fn v11_fields_survive_between_1x_and_drop_in_0x() {
        let r = CniResult::parse(br#"{"cniVersion":"1.1.0","interfaces":[{"name":"eth0","mtu":1400,"socketPath":"/s","pciID":"0000:00:01.0"}],"routes":[{"dst":"0.0.0.0/0","mtu":1300,"table":100}]}"#, None).unwrap();
        assert_eq!(r.convert(CniVersion::V1_0_0).interfaces[0].mtu, Some(1400));
        let down = r.convert(CniVersion::V0_4_0);
        assert_eq!(
            down.interfaces[0],
            Interface {
                name: "eth0".into(),
                ..Default::default()
            }
        );
        assert_eq!(down.routes[0].table, Some(100));
    }

    fn arb_result() -> impl Strategy<Value = CniResult> {
        let ip = (
            any::<[u8; 4]>(),
            8u8..32,
            proptest::option::of(0usize..3),
            any::<bool>(),
        )
            .prop_map(|(a, len, iface, v6)| IpConfig {
                interface: iface,
                address: if v6 {
                    format!("fd99::{:x}/{}", a[0], len + 64)
                } else {
                    format!("{}.{}.{}.{}/{len}", a[0], a[1], a[2], a[3])
                },
                gateway: String::new(),
                version: None,
            });
        (
            prop::sample::select(CniVersion::ALL.to_vec()),
            prop::collection::vec(ip, 0..4),
            prop::collection::vec("[a-z0-9]{1,8}", 0..3),
        )
            .prop_map(|(v, ips, names)| {
                let mut r = CniResult::empty(CniVersion::V1_0_0);
                r.interfaces = names
                    .into_iter()
                    .map(|n| Interface {
                        name: n,
                        ..Default::default()
                    })
                    .collect();
                r.ips = ips;
                r.convert(v)
            })
    }

    proptest! {
        #[test]
        fn conversion_round_trips_through_any_version(r in arb_result(), via in prop::sample::select(CniVersion::ALL.to_vec())) {
            let back = r.convert(via).convert(r.cni_version);
            prop_assert_eq!(&back, &r);
            // Serialising and parsing is the identity too.
            let parsed = CniResult::parse(r.to_json().as_bytes(), None).unwrap();
            prop_assert_eq!(parsed, r.clone());
            // 0.x carries the family on every IP; 1.x never.
            let s = r.convert(via).to_json();
            prop_assert_eq!(s.contains("\"version\""), !via.is_1x() && !r.ips.is_empty());
        }
    }

    #[test]
    fn reading_in_place_equals_reading_a_copy() {
        let cases = [
            BRIDGE_031,
            r#"{"ips":[{"address":"10.99.0.5/24","version":"4"}]}"#,
            r#"{"cniVersion":"1.0.0","ips":[{"address":"fd99::2/64","version":"6"}],"dns":{}}"#,
            r#"{"cniVersion":"9.9.9","ips":[]}"#,
            r#"{"cniVersion":"1.0.0","ips":"nope"}"#,
            r#"{"cniVersion":7}"#,
            r#"[]"#,
        ];
        for case in cases {
            let v: serde_json::Value = serde_json::from_str(case).unwrap();
            for fallback in [None, Some(CniVersion::V0_4_0)] {
                let by_ref = CniResult::from_value_ref(&v, fallback).map_err(|e| e.to_string());
                let by_copy = CniResult::from_value(v.clone(), fallback).map_err(|e| e.to_string());
                assert_eq!(by_ref, by_copy, "{case} with fallback {fallback:?}");
            }
        }
    }
}

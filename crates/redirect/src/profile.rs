//! Mesh profiles: turn a pod's annotations into a [`RedirectSpec`], following the
//! conventions of the meshes users already run.
//!
//! - `istio` (sidecar mode): meshed when `sidecar.istio.io/status` is present and
//!   `sidecar.istio.io/inject` is not false. Outbound 15001, inbound 15006, UID and GID
//!   1337, inbound 15020/15021/15090 never captured. Honours
//!   `traffic.sidecar.istio.io/{include,exclude}{Inbound,Outbound}Ports`,
//!   `…/{include,exclude}OutboundIPRanges`, `…/excludeInterfaces` and
//!   `sidecar.istio.io/interceptionMode` (`REDIRECT`; `TPROXY` is refused).
//! - `linkerd`: meshed when `linkerd.io/proxy-version` is present and `linkerd.io/inject`
//!   is not `disabled`. Outbound 4140, inbound 4143, UID 2102, inbound 4190/4191 (the
//!   proxy's own control and admin ports) never captured. Honours
//!   `config.linkerd.io/{skip-inbound-ports,skip-outbound-ports,skip-subnets,proxy-uid,proxy-gid}`.
//! - `generic`: meshed when `interlock.dev/redirect: enabled`. Outbound 15001, inbound
//!   15006, UID 1337; `interlock.dev/<field>` keys for every field of the spec.
//!
//! Port lists are comma separated; every profile accepts ranges (`8000-8010`) and `*`
//! where it means "all". Invalid values are errors naming the annotation and value: a pod
//! whose mesh settings cannot be understood must not start unprotected.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::spec::{
    port_runs, validate_ifname, InboundCapture, OutboundCapture, PortSelection, RedirectSpec,
    SpecError, MAX_RULES_PER_LIST,
};

pub use interlock_contract::pod::PodFacts;
pub use interlock_contract::profile::{ProfileName, UnknownProfile};

/// Decides whether a pod is meshed and builds its spec.
///
/// Profiles are tried in the order of `enabled`; the first whose "is this pod meshed"
/// test matches builds the spec (both families enabled: a pod can always use both, if
/// only through IPv6 link-local). `Ok(None)` means no enabled profile claims the pod: it is not
/// meshed and passes through. An error means the pod is meshed but its annotations cannot
/// be turned into rules (or an opt-in/out annotation is unreadable): fail closed.
pub fn spec_for(
    pod: &PodView,
    enabled: &[ProfileName],
) -> Result<Option<(ProfileName, RedirectSpec)>, SpecError> {
    let a = Annotations(pod.annotations);
    for &profile in enabled {
        let spec = match profile {
            ProfileName::Istio => istio(&a)?,
            ProfileName::Linkerd => linkerd(&a)?,
            ProfileName::Generic => generic(&a)?,
        };
        if let Some(spec) = spec {
            let spec = spec.normalized();
            spec.validate()?;
            return Ok(Some((profile, spec)));
        }
    }
    Ok(None)
}

/// What a profile reads from a pod: its annotations and, when known, the facts of its spec
/// ([`PodFacts`], from the agent's pod cache; the runtime hands the plugin annotations only).
#[derive(Debug, Clone, Copy)]
pub struct PodView<'a> {
    /// Every annotation of the pod.
    pub annotations: &'a BTreeMap<String, String>,
    /// The spec facts the profiles read, when a source that has the spec answered.
    pub facts: Option<&'a PodFacts>,
}

impl<'a> PodView<'a> {
    /// A pod known by its annotations alone.
    pub fn annotations_only(annotations: &'a BTreeMap<String, String>) -> PodView<'a> {
        PodView {
            annotations,
            facts: None,
        }
    }

    /// A pod known by its annotations and its spec facts.
    pub fn with_facts(
        annotations: &'a BTreeMap<String, String>,
        facts: &'a PodFacts,
    ) -> PodView<'a> {
        PodView {
            annotations,
            facts: Some(facts),
        }
    }
}

struct Annotations<'a>(&'a BTreeMap<String, String>);

impl Annotations<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(|s| s.as_str())
    }
}

fn invalid(key: &str, value: &str, reason: impl Into<String>) -> SpecError {
    // Keep a huge value from swamping the message (it names the annotation anyway).
    let value = match value.char_indices().nth(120) {
        Some((end, _)) => format!("{}… ({} bytes)", &value[..end], value.len()),
        None => value.to_string(),
    };
    SpecError::Annotation {
        annotation: key.to_string(),
        value,
        reason: reason.into(),
    }
}

/// Refuses a list that would need more than [`MAX_RULES_PER_LIST`] rules (one per port
/// run or network): no real annotation comes near, and one transaction must stay well
/// within what the kernel accepts in one netlink message.
fn check_list_size(key: &str, value: &str, rules: usize, what: &str) -> Result<(), SpecError> {
    if rules > MAX_RULES_PER_LIST {
        return Err(invalid(
            key,
            value,
            format!(
                "{rules} separate {what} need one rule each, more than the {MAX_RULES_PER_LIST} interlock allows per annotation; merge neighbouring ports into ranges (8000-8100) or networks into wider CIDRs"
            ),
        ));
    }
    Ok(())
}

/// A parsed port list.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ports {
    Wildcard,
    List(Vec<u16>),
}

fn parse_port(key: &str, value: &str, item: &str) -> Result<u16, SpecError> {
    let n: u64 = item.parse().map_err(|_| {
        invalid(
            key,
            value,
            format!("{item:?} is not a port number (expected 1-65535, a range like 8000-8010, or a comma-separated list)"),
        )
    })?;
    if n == 0 || n > 65535 {
        return Err(invalid(
            key,
            value,
            format!("port {n} is out of range 1-65535"),
        ));
    }
    Ok(n as u16)
}

fn parse_ports(key: &str, value: &str, wildcard: bool) -> Result<Ports, SpecError> {
    let trimmed = value.trim();
    if trimmed == "*" {
        return if wildcard {
            Ok(Ports::Wildcard)
        } else {
            Err(invalid(key, value, "\"*\" is not allowed here"))
        };
    }
    let mut out = Vec::new();
    for item in trimmed.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if item == "*" {
            return Err(invalid(key, value, "\"*\" must be the whole value"));
        }
        if let Some((lo, hi)) = item.split_once('-') {
            let lo = parse_port(key, value, lo.trim())?;
            let hi = parse_port(key, value, hi.trim())?;
            if lo > hi {
                return Err(invalid(
                    key,
                    value,
                    format!("range {item:?} runs backwards"),
                ));
            }
            out.extend(lo..=hi);
        } else {
            out.push(parse_port(key, value, item)?);
        }
    }
    out.sort_unstable();
    out.dedup();
    check_list_size(key, value, port_runs(&out).len(), "port ranges")?;
    Ok(Ports::List(out))
}

fn parse_single_port(key: &str, value: &str) -> Result<u16, SpecError> {
    parse_port(key, value, value.trim())
}

fn parse_id(key: &str, value: &str, what: &str) -> Result<u32, SpecError> {
    let n: u32 = value
        .trim()
        .parse()
        .map_err(|_| invalid(key, value, format!("{what} must be a non-negative integer")))?;
    if n == 0 {
        return Err(invalid(
            key,
            value,
            format!("{what} 0 (root) would exempt every root process from capture"),
        ));
    }
    Ok(n)
}

/// CIDR list; `None` for `*` when the wildcard is allowed.
fn parse_cidrs(key: &str, value: &str, wildcard: bool) -> Result<Option<Vec<IpNet>>, SpecError> {
    let trimmed = value.trim();
    if trimmed == "*" {
        return if wildcard {
            Ok(None)
        } else {
            Err(invalid(key, value, "\"*\" is not allowed here"))
        };
    }
    let mut out = Vec::new();
    for item in trimmed.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let net = match item.parse::<IpNet>() {
            Ok(n) => n,
            Err(_) => match item.parse::<IpAddr>() {
                Ok(ip) => IpNet::from(ip),
                Err(_) => {
                    return Err(invalid(
                        key,
                        value,
                        format!("{item:?} is not a CIDR (expected e.g. 10.0.0.0/8 or fd00::/8)"),
                    ))
                }
            },
        };
        out.push(net.trunc());
    }
    out.sort_unstable();
    out.dedup();
    check_list_size(key, value, out.len(), "networks")?;
    Ok(Some(out))
}

fn parse_ifnames(key: &str, value: &str) -> Result<Vec<String>, SpecError> {
    let mut out = Vec::new();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        validate_ifname(item).map_err(|r| invalid(key, value, r))?;
        out.push(item.to_string());
    }
    Ok(out)
}

/// Go's strconv.ParseBool "false" spellings (what the Istio injector accepts).
fn is_false(v: &str) -> bool {
    matches!(v.trim(), "0" | "f" | "F" | "false" | "FALSE" | "False")
}

fn base_spec(uid: u32, gid: Option<u32>, inbound: u16, outbound: u16) -> RedirectSpec {
    RedirectSpec {
        proxy_uid: uid,
        proxy_gid: gid,
        inbound: InboundCapture {
            proxy_port: inbound,
            include_ports: PortSelection::All,
            exclude_ports: Vec::new(),
        },
        outbound: OutboundCapture {
            proxy_port: outbound,
            include_ports: PortSelection::All,
            exclude_ports: Vec::new(),
            include_cidrs: Vec::new(),
            exclude_cidrs: Vec::new(),
        },
        exclude_interfaces: Vec::new(),
        ipv4: true,
        ipv6: true,
    }
}

/// Istio annotation keys.
pub mod istio_keys {
    /// Written by the injector on meshed pods.
    pub const STATUS: &str = "sidecar.istio.io/status";
    /// `"false"` opts a pod out.
    pub const INJECT: &str = "sidecar.istio.io/inject";
    /// `REDIRECT` (default) or `TPROXY` (refused).
    pub const INTERCEPTION_MODE: &str = "sidecar.istio.io/interceptionMode";
    /// Inbound ports captured (`*` default, empty = none).
    pub const INCLUDE_INBOUND_PORTS: &str = "traffic.sidecar.istio.io/includeInboundPorts";
    /// Inbound ports not captured (added to 15020,15021,15090).
    pub const EXCLUDE_INBOUND_PORTS: &str = "traffic.sidecar.istio.io/excludeInboundPorts";
    /// Outbound ports captured whatever the destination.
    pub const INCLUDE_OUTBOUND_PORTS: &str = "traffic.sidecar.istio.io/includeOutboundPorts";
    /// Outbound ports not captured.
    pub const EXCLUDE_OUTBOUND_PORTS: &str = "traffic.sidecar.istio.io/excludeOutboundPorts";
    /// Outbound destinations captured (`*` default, empty = none).
    pub const INCLUDE_OUTBOUND_IP_RANGES: &str = "traffic.sidecar.istio.io/includeOutboundIPRanges";
    /// Outbound destinations not captured.
    pub const EXCLUDE_OUTBOUND_IP_RANGES: &str = "traffic.sidecar.istio.io/excludeOutboundIPRanges";
    /// Interfaces never captured.
    pub const EXCLUDE_INTERFACES: &str = "traffic.sidecar.istio.io/excludeInterfaces";
}

/// Ports the Istio sidecar serves itself (status, health, Prometheus), never captured inbound.
pub const ISTIO_EXCLUDED_INBOUND: [u16; 3] = [15020, 15021, 15090];

fn istio(a: &Annotations) -> Result<Option<RedirectSpec>, SpecError> {
    use istio_keys::*;
    if a.get(STATUS).is_none() {
        return Ok(None);
    }
    if a.get(INJECT).is_some_and(is_false) {
        return Ok(None);
    }
    match a.get(INTERCEPTION_MODE).map(str::trim) {
        None | Some("REDIRECT") => {}
        Some("TPROXY") => {
            return Err(SpecError::Unsupported {
                annotation: INTERCEPTION_MODE.into(),
                value: "TPROXY".into(),
                reason: "interlock implements REDIRECT interception only; remove the annotation or set it to REDIRECT".into(),
            })
        }
        Some(other) => {
            return Err(invalid(
                INTERCEPTION_MODE,
                other,
                "expected REDIRECT (or TPROXY, which interlock refuses)",
            ))
        }
    }
    let mut spec = base_spec(1337, Some(1337), 15006, 15001);

    // Inbound.
    if let Some(v) = a.get(INCLUDE_INBOUND_PORTS) {
        spec.inbound.include_ports = match parse_ports(INCLUDE_INBOUND_PORTS, v, true)? {
            Ports::Wildcard => PortSelection::All,
            Ports::List(l) => PortSelection::Only(l),
        };
    }
    spec.inbound.exclude_ports = ISTIO_EXCLUDED_INBOUND.to_vec();
    if let Some(v) = a.get(EXCLUDE_INBOUND_PORTS) {
        match parse_ports(EXCLUDE_INBOUND_PORTS, v, true)? {
            Ports::Wildcard => spec.inbound.include_ports = PortSelection::Only(Vec::new()),
            Ports::List(l) => spec.inbound.exclude_ports.extend(l),
        }
    }

    // Outbound.
    let include_ranges = match a.get(INCLUDE_OUTBOUND_IP_RANGES) {
        None => None,
        Some(v) => parse_cidrs(INCLUDE_OUTBOUND_IP_RANGES, v, true)?,
    };
    let include_ports = match a.get(INCLUDE_OUTBOUND_PORTS) {
        None => Ports::List(Vec::new()),
        Some(v) => parse_ports(INCLUDE_OUTBOUND_PORTS, v, true)?,
    };
    match (include_ranges, include_ports) {
        // Every destination is captured; includeOutboundPorts adds nothing.
        (None, _) | (_, Ports::Wildcard) => {}
        (Some(ranges), Ports::List(ports)) if ports.is_empty() => {
            if ranges.is_empty() {
                spec.outbound.include_ports = PortSelection::Only(Vec::new());
            } else {
                spec.outbound.include_cidrs = ranges;
            }
        }
        (Some(ranges), Ports::List(ports)) => {
            if ranges.is_empty() {
                spec.outbound.include_ports = PortSelection::Only(ports);
            } else {
                return Err(SpecError::Unsupported {
                    annotation: INCLUDE_OUTBOUND_PORTS.into(),
                    value: a.get(INCLUDE_OUTBOUND_PORTS).unwrap_or_default().into(),
                    reason: format!(
                        "combining it with a non-\"*\" {INCLUDE_OUTBOUND_IP_RANGES} (capture by port OR by address) is not implemented; use one of the two"
                    ),
                });
            }
        }
    }
    if let Some(v) = a.get(EXCLUDE_OUTBOUND_PORTS) {
        match parse_ports(EXCLUDE_OUTBOUND_PORTS, v, true)? {
            Ports::Wildcard => spec.outbound.include_ports = PortSelection::Only(Vec::new()),
            Ports::List(l) => spec.outbound.exclude_ports = l,
        }
    }
    if let Some(v) = a.get(EXCLUDE_OUTBOUND_IP_RANGES) {
        spec.outbound.exclude_cidrs =
            parse_cidrs(EXCLUDE_OUTBOUND_IP_RANGES, v, false)?.unwrap_or_default();
    }
    if let Some(v) = a.get(EXCLUDE_INTERFACES) {
        spec.exclude_interfaces = parse_ifnames(EXCLUDE_INTERFACES, v)?;
    }
    Ok(Some(spec))
}

/// Linkerd annotation keys.
pub mod linkerd_keys {
    /// Written by the injector on meshed pods.
    pub const PROXY_VERSION: &str = "linkerd.io/proxy-version";
    /// `disabled` opts a pod out.
    pub const INJECT: &str = "linkerd.io/inject";
    /// Inbound ports not captured (added to 4190,4191).
    pub const SKIP_INBOUND_PORTS: &str = "config.linkerd.io/skip-inbound-ports";
    /// Outbound ports not captured.
    pub const SKIP_OUTBOUND_PORTS: &str = "config.linkerd.io/skip-outbound-ports";
    /// Outbound destinations not captured.
    pub const SKIP_SUBNETS: &str = "config.linkerd.io/skip-subnets";
    /// The proxy's UID (default 2102).
    pub const PROXY_UID: &str = "config.linkerd.io/proxy-uid";
    /// The proxy's GID (default: none).
    pub const PROXY_GID: &str = "config.linkerd.io/proxy-gid";
}

/// The Linkerd proxy's own ports (4190 control/tap, 4191 admin), never captured inbound.
pub const LINKERD_EXCLUDED_INBOUND: [u16; 2] = [4190, 4191];

fn linkerd(a: &Annotations) -> Result<Option<RedirectSpec>, SpecError> {
    use linkerd_keys::*;
    if a.get(PROXY_VERSION).is_none() {
        return Ok(None);
    }
    if a.get(INJECT).is_some_and(|v| v.trim() == "disabled") {
        return Ok(None);
    }
    let mut spec = base_spec(2102, None, 4143, 4140);
    spec.inbound.exclude_ports = LINKERD_EXCLUDED_INBOUND.to_vec();
    if let Some(v) = a.get(SKIP_INBOUND_PORTS) {
        match parse_ports(SKIP_INBOUND_PORTS, v, false)? {
            Ports::List(l) => spec.inbound.exclude_ports.extend(l),
            Ports::Wildcard => unreachable!("wildcard refused by parse_ports"),
        }
    }
    if let Some(v) = a.get(SKIP_OUTBOUND_PORTS) {
        if let Ports::List(l) = parse_ports(SKIP_OUTBOUND_PORTS, v, false)? {
            spec.outbound.exclude_ports = l;
        }
    }
    if let Some(v) = a.get(SKIP_SUBNETS) {
        spec.outbound.exclude_cidrs = parse_cidrs(SKIP_SUBNETS, v, false)?.unwrap_or_default();
    }
    if let Some(v) = a.get(PROXY_UID) {
        spec.proxy_uid = parse_id(PROXY_UID, v, "a UID")?;
    }
    if let Some(v) = a.get(PROXY_GID) {
        spec.proxy_gid = Some(parse_id(PROXY_GID, v, "a GID")?);
    }
    Ok(Some(spec))
}

/// interlock's own annotation keys (the `generic` profile).
pub mod generic_keys {
    /// `enabled` meshes the pod; `disabled` (or absent) does not.
    pub const REDIRECT: &str = "interlock.dev/redirect";
    /// The proxy's UID (default 1337).
    pub const PROXY_UID: &str = "interlock.dev/proxy-uid";
    /// The proxy's GID (default: none).
    pub const PROXY_GID: &str = "interlock.dev/proxy-gid";
    /// Inbound proxy port (default 15006).
    pub const INBOUND_PORT: &str = "interlock.dev/inbound-port";
    /// Outbound proxy port (default 15001).
    pub const OUTBOUND_PORT: &str = "interlock.dev/outbound-port";
    /// Inbound ports captured (`*` default).
    pub const INCLUDE_INBOUND_PORTS: &str = "interlock.dev/include-inbound-ports";
    /// Inbound ports not captured.
    pub const EXCLUDE_INBOUND_PORTS: &str = "interlock.dev/exclude-inbound-ports";
    /// Outbound destination ports captured (`*` default).
    pub const INCLUDE_OUTBOUND_PORTS: &str = "interlock.dev/include-outbound-ports";
    /// Outbound destination ports not captured.
    pub const EXCLUDE_OUTBOUND_PORTS: &str = "interlock.dev/exclude-outbound-ports";
    /// Outbound destinations captured (`*` or absent: all).
    pub const INCLUDE_OUTBOUND_CIDRS: &str = "interlock.dev/include-outbound-cidrs";
    /// Outbound destinations not captured.
    pub const EXCLUDE_OUTBOUND_CIDRS: &str = "interlock.dev/exclude-outbound-cidrs";
    /// Interfaces never captured.
    pub const EXCLUDE_INTERFACES: &str = "interlock.dev/exclude-interfaces";
}

fn generic(a: &Annotations) -> Result<Option<RedirectSpec>, SpecError> {
    use generic_keys::*;
    match a.get(REDIRECT).map(str::trim) {
        None | Some("disabled") => return Ok(None),
        Some("enabled") => {}
        Some(other) => {
            return Err(invalid(
                REDIRECT,
                other,
                "expected \"enabled\" or \"disabled\"",
            ))
        }
    }
    let mut spec = base_spec(1337, None, 15006, 15001);
    if let Some(v) = a.get(PROXY_UID) {
        spec.proxy_uid = parse_id(PROXY_UID, v, "a UID")?;
    }
    if let Some(v) = a.get(PROXY_GID) {
        spec.proxy_gid = Some(parse_id(PROXY_GID, v, "a GID")?);
    }
    if let Some(v) = a.get(INBOUND_PORT) {
        spec.inbound.proxy_port = parse_single_port(INBOUND_PORT, v)?;
    }
    if let Some(v) = a.get(OUTBOUND_PORT) {
        spec.outbound.proxy_port = parse_single_port(OUTBOUND_PORT, v)?;
    }
    let selection = |key: &str, v: &str| -> Result<PortSelection, SpecError> {
        Ok(match parse_ports(key, v, true)? {
            Ports::Wildcard => PortSelection::All,
            Ports::List(l) => PortSelection::Only(l),
        })
    };
    let list = |key: &str, v: &str| -> Result<Vec<u16>, SpecError> {
        match parse_ports(key, v, false)? {
            Ports::List(l) => Ok(l),
            Ports::Wildcard => unreachable!("wildcard refused by parse_ports"),
        }
    };
    if let Some(v) = a.get(INCLUDE_INBOUND_PORTS) {
        spec.inbound.include_ports = selection(INCLUDE_INBOUND_PORTS, v)?;
    }
    if let Some(v) = a.get(EXCLUDE_INBOUND_PORTS) {
        spec.inbound.exclude_ports = list(EXCLUDE_INBOUND_PORTS, v)?;
    }
    if let Some(v) = a.get(INCLUDE_OUTBOUND_PORTS) {
        spec.outbound.include_ports = selection(INCLUDE_OUTBOUND_PORTS, v)?;
    }
    if let Some(v) = a.get(EXCLUDE_OUTBOUND_PORTS) {
        spec.outbound.exclude_ports = list(EXCLUDE_OUTBOUND_PORTS, v)?;
    }
    if let Some(v) = a.get(INCLUDE_OUTBOUND_CIDRS) {
        match parse_cidrs(INCLUDE_OUTBOUND_CIDRS, v, true)? {
            None => {}
            Some(l) if l.is_empty() => return Err(invalid(
                INCLUDE_OUTBOUND_CIDRS,
                v,
                "an empty list would mean every destination; write \"*\" for all, or list networks",
            )),
            Some(l) => spec.outbound.include_cidrs = l,
        }
    }
    if let Some(v) = a.get(EXCLUDE_OUTBOUND_CIDRS) {
        spec.outbound.exclude_cidrs =
            parse_cidrs(EXCLUDE_OUTBOUND_CIDRS, v, false)?.unwrap_or_default();
    }
    if let Some(v) = a.get(EXCLUDE_INTERFACES) {
        spec.exclude_interfaces = parse_ifnames(EXCLUDE_INTERFACES, v)?;
    }
    Ok(Some(spec))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn decide_all(
        pairs: &[(&str, &str)],
    ) -> Result<Option<(ProfileName, RedirectSpec)>, SpecError> {
        spec_for(&PodView::annotations_only(&ann(pairs)), &ProfileName::ALL)
    }

    fn spec(pairs: &[(&str, &str)]) -> RedirectSpec {
        decide_all(pairs).unwrap().expect("meshed").1
    }

    fn err(pairs: &[(&str, &str)]) -> SpecError {
        decide_all(pairs).unwrap_err()
    }

    fn assert_names(e: &SpecError, key: &str, value: &str) {
        let msg = e.to_string();
        assert!(msg.contains(key), "{msg}");
        assert!(msg.contains(value), "{msg}");
    }

    const ISTIO: (&str, &str) = (
        "sidecar.istio.io/status",
        "{\"containers\":[\"istio-proxy\"]}",
    );
    const LINKERD: (&str, &str) = ("linkerd.io/proxy-version", "stable-2.14.10");
    const GENERIC: (&str, &str) = ("interlock.dev/redirect", "enabled");

    #[test]
    fn profile_names_parse_and_print() {
        for p in ProfileName::ALL {
            assert_eq!(p.as_str().parse::<ProfileName>().unwrap(), p);
            assert_eq!(
                serde_json::to_string(&p).unwrap(),
                format!("\"{}\"", p.as_str())
            );
        }
        assert!("consul"
            .parse::<ProfileName>()
            .unwrap_err()
            .to_string()
            .contains("consul"));
    }

    /// An oversized list is refused naming the annotation and the limit (not the
    /// kernel's "Message too long" after applying); the value in the message is cut.
    #[test]
    fn oversized_lists_name_the_annotation_and_the_limit() {
        let key = "traffic.sidecar.istio.io/excludeOutboundPorts";
        let odd: Vec<String> = (1..65535u32).step_by(2).map(|p| p.to_string()).collect();
        let e = err(&[ISTIO, (key, &odd.join(","))]);
        let msg = e.to_string();
        assert!(
            msg.contains(key)
                && msg.contains("32767 separate port ranges")
                && msg.contains(&format!("more than the {MAX_RULES_PER_LIST}"))
                && msg.len() < 1000,
            "{msg}"
        );
        // At the limit: fine; ranges count once.
        let at: Vec<String> = (1..=MAX_RULES_PER_LIST as u32)
            .map(|i| (i * 2).to_string())
            .collect();
        spec(&[ISTIO, (key, &at.join(","))]);
        spec(&[ISTIO, (key, "1-65000")]);
        let nets: Vec<String> = (0..=MAX_RULES_PER_LIST as u32)
            .map(|i| format!("10.{}.{}.0/24", i / 256, i % 256))
            .collect();
        let e = err(&[LINKERD, ("config.linkerd.io/skip-subnets", &nets.join(","))]);
        assert!(
            e.to_string().contains("config.linkerd.io/skip-subnets")
                && e.to_string().contains("separate networks"),
            "{e}"
        );
    }

    #[test]
    fn unannotated_pod_is_not_meshed() {
        assert_eq!(decide_all(&[]).unwrap(), None);
        assert_eq!(decide_all(&[("app", "x")]).unwrap(), None);
    }

    #[test]
    fn istio_defaults() {
        let (p, s) = decide_all(&[ISTIO]).unwrap().unwrap();
        assert_eq!(p, ProfileName::Istio);
        assert_eq!(s.proxy_uid, 1337);
        assert_eq!(s.proxy_gid, Some(1337));
        assert_eq!(s.outbound.proxy_port, 15001);
        assert_eq!(s.inbound.proxy_port, 15006);
        assert_eq!(s.inbound.include_ports, PortSelection::All);
        assert_eq!(s.inbound.exclude_ports, vec![15020, 15021, 15090]);
        assert_eq!(s.outbound.include_ports, PortSelection::All);
        assert!(s.outbound.include_cidrs.is_empty());
        assert!(s.outbound.exclude_cidrs.is_empty());
        assert!(s.ipv4 && s.ipv6);
    }

    #[test]
    fn istio_opt_out_and_disabled_profile() {
        for v in ["false", "False", "0", "f"] {
            assert_eq!(
                decide_all(&[ISTIO, ("sidecar.istio.io/inject", v)]).unwrap(),
                None,
                "{v}"
            );
        }
        assert!(decide_all(&[ISTIO, ("sidecar.istio.io/inject", "true")])
            .unwrap()
            .is_some());
        // Injection requested but not done (no status): not meshed.
        assert_eq!(
            decide_all(&[("sidecar.istio.io/inject", "true")]).unwrap(),
            None
        );
        assert_eq!(
            spec_for(
                &PodView::annotations_only(&ann(&[ISTIO])),
                &[ProfileName::Linkerd, ProfileName::Generic]
            )
            .unwrap(),
            None
        );
    }

    #[test]
    fn istio_interception_mode() {
        assert!(
            decide_all(&[ISTIO, ("sidecar.istio.io/interceptionMode", "REDIRECT")])
                .unwrap()
                .is_some()
        );
        let e = err(&[ISTIO, ("sidecar.istio.io/interceptionMode", "TPROXY")]);
        assert!(matches!(e, SpecError::Unsupported { .. }), "{e}");
        assert_names(&e, "sidecar.istio.io/interceptionMode", "TPROXY");
        let e = err(&[ISTIO, ("sidecar.istio.io/interceptionMode", "bogus")]);
        assert_names(&e, "sidecar.istio.io/interceptionMode", "bogus");
    }

    #[test]
    fn istio_inbound_ports() {
        let s = spec(&[
            ISTIO,
            ("traffic.sidecar.istio.io/includeInboundPorts", "8080, 9090"),
        ]);
        assert_eq!(
            s.inbound.include_ports,
            PortSelection::Only(vec![8080, 9090])
        );
        let s = spec(&[ISTIO, ("traffic.sidecar.istio.io/includeInboundPorts", "")]);
        assert_eq!(s.inbound.include_ports, PortSelection::Only(vec![]));
        let s = spec(&[ISTIO, ("traffic.sidecar.istio.io/includeInboundPorts", "*")]);
        assert_eq!(s.inbound.include_ports, PortSelection::All);
        let s = spec(&[
            ISTIO,
            ("traffic.sidecar.istio.io/excludeInboundPorts", "22,15020"),
        ]);
        assert_eq!(s.inbound.exclude_ports, vec![22, 15020, 15021, 15090]);
        let s = spec(&[ISTIO, ("traffic.sidecar.istio.io/excludeInboundPorts", "*")]);
        assert_eq!(s.inbound.include_ports, PortSelection::Only(vec![]));
        let e = err(&[
            ISTIO,
            ("traffic.sidecar.istio.io/excludeInboundPorts", "22,70000"),
        ]);
        assert_names(&e, "traffic.sidecar.istio.io/excludeInboundPorts", "70000");
        assert!(e.to_string().contains("out of range"), "{e}");
        let e = err(&[
            ISTIO,
            ("traffic.sidecar.istio.io/includeInboundPorts", "http"),
        ]);
        assert_names(&e, "traffic.sidecar.istio.io/includeInboundPorts", "http");
    }

    #[test]
    fn istio_outbound_ports_and_ranges() {
        let s = spec(&[
            ISTIO,
            ("traffic.sidecar.istio.io/excludeOutboundPorts", "3306,5432"),
        ]);
        assert_eq!(s.outbound.exclude_ports, vec![3306, 5432]);
        let s = spec(&[
            ISTIO,
            ("traffic.sidecar.istio.io/excludeOutboundPorts", "*"),
        ]);
        assert_eq!(s.outbound.include_ports, PortSelection::Only(vec![]));
        // includeOutboundPorts under the default "*" ranges adds nothing.
        let s = spec(&[
            ISTIO,
            ("traffic.sidecar.istio.io/includeOutboundPorts", "443"),
        ]);
        assert_eq!(s.outbound.include_ports, PortSelection::All);
        assert!(s.outbound.include_cidrs.is_empty());
        // With no IP ranges, only the listed ports are captured, to any destination.
        let s = spec(&[
            ISTIO,
            ("traffic.sidecar.istio.io/includeOutboundIPRanges", ""),
            ("traffic.sidecar.istio.io/includeOutboundPorts", "443,80"),
        ]);
        assert_eq!(s.outbound.include_ports, PortSelection::Only(vec![80, 443]));
        assert!(s.outbound.include_cidrs.is_empty());
        // No IP ranges and no ports: nothing captured outbound.
        let s = spec(&[
            ISTIO,
            ("traffic.sidecar.istio.io/includeOutboundIPRanges", ""),
        ]);
        assert_eq!(s.outbound.include_ports, PortSelection::Only(vec![]));
        let e = err(&[
            ISTIO,
            (
                "traffic.sidecar.istio.io/includeOutboundIPRanges",
                "10.0.0.0/8",
            ),
            ("traffic.sidecar.istio.io/includeOutboundPorts", "443"),
        ]);
        assert!(matches!(e, SpecError::Unsupported { .. }));
        assert_names(&e, "traffic.sidecar.istio.io/includeOutboundPorts", "443");
    }

    #[test]
    fn istio_ip_ranges() {
        let s = spec(&[
            ISTIO,
            (
                "traffic.sidecar.istio.io/includeOutboundIPRanges",
                "10.96.0.0/12, 10.1.2.3/16,fd00::/8",
            ),
            (
                "traffic.sidecar.istio.io/excludeOutboundIPRanges",
                "169.254.169.254/32,10.96.0.10",
            ),
        ]);
        let n = |s: &str| s.parse::<IpNet>().unwrap();
        assert_eq!(
            s.outbound.include_cidrs,
            vec![n("10.1.0.0/16"), n("10.96.0.0/12"), n("fd00::/8")]
        );
        assert_eq!(
            s.outbound.exclude_cidrs,
            vec![n("10.96.0.10/32"), n("169.254.169.254/32")]
        );
        let s = spec(&[
            ISTIO,
            ("traffic.sidecar.istio.io/includeOutboundIPRanges", "*"),
        ]);
        assert!(s.outbound.include_cidrs.is_empty());
        assert_eq!(s.outbound.include_ports, PortSelection::All);
        let e = err(&[
            ISTIO,
            (
                "traffic.sidecar.istio.io/excludeOutboundIPRanges",
                "10.0.0.0/33",
            ),
        ]);
        assert_names(
            &e,
            "traffic.sidecar.istio.io/excludeOutboundIPRanges",
            "10.0.0.0/33",
        );
        assert!(e.to_string().contains("not a CIDR"));
        let e = err(&[
            ISTIO,
            ("traffic.sidecar.istio.io/excludeOutboundIPRanges", "*"),
        ]);
        assert_names(&e, "excludeOutboundIPRanges", "*");
        let e = err(&[
            ISTIO,
            ("traffic.sidecar.istio.io/includeOutboundIPRanges", "banana"),
        ]);
        assert_names(&e, "includeOutboundIPRanges", "banana");
    }

    #[test]
    fn istio_exclude_interfaces() {
        let s = spec(&[
            ISTIO,
            ("traffic.sidecar.istio.io/excludeInterfaces", "net1, net2"),
        ]);
        assert_eq!(s.exclude_interfaces, vec!["net1", "net2"]);
        let e = err(&[ISTIO, ("traffic.sidecar.istio.io/excludeInterfaces", "a/b")]);
        assert_names(&e, "excludeInterfaces", "a/b");
    }

    #[test]
    fn linkerd_defaults() {
        let (p, s) = decide_all(&[LINKERD]).unwrap().unwrap();
        assert_eq!(p, ProfileName::Linkerd);
        assert_eq!(s.proxy_uid, 2102);
        assert_eq!(s.proxy_gid, None);
        assert_eq!(s.outbound.proxy_port, 4140);
        assert_eq!(s.inbound.proxy_port, 4143);
        assert_eq!(s.inbound.exclude_ports, vec![4190, 4191]);
        assert_eq!(s.inbound.include_ports, PortSelection::All);
        assert_eq!(s.outbound.include_ports, PortSelection::All);
    }

    #[test]
    fn linkerd_opt_out() {
        assert_eq!(
            decide_all(&[LINKERD, ("linkerd.io/inject", "disabled")]).unwrap(),
            None
        );
        assert!(decide_all(&[LINKERD, ("linkerd.io/inject", "enabled")])
            .unwrap()
            .is_some());
        assert_eq!(
            decide_all(&[("linkerd.io/inject", "enabled")]).unwrap(),
            None
        );
    }

    #[test]
    fn linkerd_overrides_and_ranges() {
        let s = spec(&[
            LINKERD,
            ("config.linkerd.io/skip-inbound-ports", "8000-8003,25"),
            ("config.linkerd.io/skip-outbound-ports", "3306, 4567-4568"),
            ("config.linkerd.io/skip-subnets", "10.99.0.0/16,fd99::/16"),
            ("config.linkerd.io/proxy-uid", "2103"),
            ("config.linkerd.io/proxy-gid", "2104"),
        ]);
        assert_eq!(
            s.inbound.exclude_ports,
            vec![25, 4190, 4191, 8000, 8001, 8002, 8003]
        );
        assert_eq!(s.outbound.exclude_ports, vec![3306, 4567, 4568]);
        assert_eq!(s.outbound.exclude_cidrs.len(), 2);
        assert_eq!(s.proxy_uid, 2103);
        assert_eq!(s.proxy_gid, Some(2104));
        let s = spec(&[
            LINKERD,
            ("config.linkerd.io/skip-outbound-ports", "1-65535"),
        ]);
        assert_eq!(s.outbound.exclude_ports.len(), 65535);
        assert_eq!(
            crate::spec::port_runs(&s.outbound.exclude_ports),
            vec![1..=65535]
        );
    }

    #[test]
    fn linkerd_garbage() {
        let e = err(&[LINKERD, ("config.linkerd.io/proxy-uid", "proxy")]);
        assert_names(&e, "config.linkerd.io/proxy-uid", "proxy");
        assert!(e.to_string().contains("integer"));
        let e = err(&[LINKERD, ("config.linkerd.io/proxy-uid", "-5")]);
        assert_names(&e, "config.linkerd.io/proxy-uid", "-5");
        let e = err(&[LINKERD, ("config.linkerd.io/proxy-uid", "0")]);
        assert_names(&e, "config.linkerd.io/proxy-uid", "0");
        let e = err(&[LINKERD, ("config.linkerd.io/proxy-gid", "4294967296")]);
        assert_names(&e, "config.linkerd.io/proxy-gid", "4294967296");
        let e = err(&[
            LINKERD,
            ("config.linkerd.io/skip-inbound-ports", "9000-8000"),
        ]);
        assert_names(&e, "skip-inbound-ports", "9000-8000");
        let e = err(&[LINKERD, ("config.linkerd.io/skip-inbound-ports", "1-70000")]);
        assert_names(&e, "skip-inbound-ports", "70000");
        let e = err(&[LINKERD, ("config.linkerd.io/skip-outbound-ports", "*")]);
        assert_names(&e, "skip-outbound-ports", "*");
        let e = err(&[
            LINKERD,
            ("config.linkerd.io/skip-subnets", "10.0.0.0/8,nope"),
        ]);
        assert_names(&e, "config.linkerd.io/skip-subnets", "nope");
    }

    #[test]
    fn generic_defaults_and_fields() {
        let (p, s) = decide_all(&[GENERIC]).unwrap().unwrap();
        assert_eq!(p, ProfileName::Generic);
        assert_eq!((s.proxy_uid, s.proxy_gid), (1337, None));
        assert_eq!(
            (s.outbound.proxy_port, s.inbound.proxy_port),
            (15001, 15006)
        );
        assert!(s.inbound.exclude_ports.is_empty());
        let s = spec(&[
            GENERIC,
            ("interlock.dev/proxy-uid", "999"),
            ("interlock.dev/proxy-gid", "998"),
            ("interlock.dev/inbound-port", "7000"),
            ("interlock.dev/outbound-port", "7001"),
            ("interlock.dev/include-inbound-ports", "80,443"),
            ("interlock.dev/exclude-inbound-ports", "9000-9001"),
            ("interlock.dev/include-outbound-ports", "*"),
            ("interlock.dev/exclude-outbound-ports", "22"),
            ("interlock.dev/include-outbound-cidrs", "10.0.0.0/8"),
            ("interlock.dev/exclude-outbound-cidrs", "10.1.0.0/16"),
            ("interlock.dev/exclude-interfaces", "net1"),
        ]);
        assert_eq!((s.proxy_uid, s.proxy_gid), (999, Some(998)));
        assert_eq!((s.inbound.proxy_port, s.outbound.proxy_port), (7000, 7001));
        assert_eq!(s.inbound.include_ports, PortSelection::Only(vec![80, 443]));
        assert_eq!(s.inbound.exclude_ports, vec![9000, 9001]);
        assert_eq!(s.outbound.include_ports, PortSelection::All);
        assert_eq!(s.outbound.exclude_ports, vec![22]);
        assert_eq!(
            s.outbound.include_cidrs,
            vec!["10.0.0.0/8".parse::<IpNet>().unwrap()]
        );
        assert_eq!(
            s.outbound.exclude_cidrs,
            vec!["10.1.0.0/16".parse::<IpNet>().unwrap()]
        );
        assert_eq!(s.exclude_interfaces, vec!["net1"]);
        let s = spec(&[GENERIC, ("interlock.dev/include-outbound-cidrs", "*")]);
        assert!(s.outbound.include_cidrs.is_empty());
    }

    #[test]
    fn generic_switch_values() {
        assert_eq!(
            decide_all(&[("interlock.dev/redirect", "disabled")]).unwrap(),
            None
        );
        let e = err(&[("interlock.dev/redirect", "yes")]);
        assert_names(&e, "interlock.dev/redirect", "yes");
    }

    #[test]
    fn generic_garbage() {
        let e = err(&[GENERIC, ("interlock.dev/outbound-port", "70000")]);
        assert_names(&e, "interlock.dev/outbound-port", "70000");
        let e = err(&[GENERIC, ("interlock.dev/inbound-port", "0")]);
        assert_names(&e, "interlock.dev/inbound-port", "0");
        let e = err(&[GENERIC, ("interlock.dev/inbound-port", "80,81")]);
        assert_names(&e, "interlock.dev/inbound-port", "80,81");
        let e = err(&[GENERIC, ("interlock.dev/proxy-uid", "root")]);
        assert_names(&e, "interlock.dev/proxy-uid", "root");
        let e = err(&[
            GENERIC,
            ("interlock.dev/exclude-outbound-cidrs", "300.1.1.1/8"),
        ]);
        assert_names(&e, "interlock.dev/exclude-outbound-cidrs", "300.1.1.1/8");
        let e = err(&[GENERIC, ("interlock.dev/include-outbound-cidrs", "")]);
        assert_names(&e, "interlock.dev/include-outbound-cidrs", "");
        let e = err(&[GENERIC, ("interlock.dev/exclude-inbound-ports", "*")]);
        assert_names(&e, "interlock.dev/exclude-inbound-ports", "*");
        let e = err(&[GENERIC, ("interlock.dev/exclude-outbound-ports", "22,*")]);
        assert_names(&e, "interlock.dev/exclude-outbound-ports", "22,*");
    }

    #[test]
    fn priority_follows_enabled_order() {
        let both = ann(&[ISTIO, GENERIC]);
        assert_eq!(
            spec_for(&PodView::annotations_only(&both), &ProfileName::ALL)
                .unwrap()
                .unwrap()
                .0,
            ProfileName::Istio
        );
        assert_eq!(
            spec_for(
                &PodView::annotations_only(&both),
                &[ProfileName::Generic, ProfileName::Istio]
            )
            .unwrap()
            .unwrap()
            .0,
            ProfileName::Generic
        );
        assert_eq!(
            spec_for(&PodView::annotations_only(&both), &[]).unwrap(),
            None
        );
        // A profile that is not enabled does not even parse its annotations.
        let bad = ann(&[GENERIC, ("interlock.dev/outbound-port", "x")]);
        assert_eq!(
            spec_for(&PodView::annotations_only(&bad), &[ProfileName::Istio]).unwrap(),
            None
        );
    }

    #[test]
    fn decided_specs_are_normalized_and_valid() {
        for pairs in [vec![ISTIO], vec![LINKERD], vec![GENERIC]] {
            let s = spec(&pairs);
            assert_eq!(s, s.normalized());
            s.validate().unwrap();
        }
    }
}

//! interlock's own annotations: `interlock.dev/redirect: enabled` meshes a pod, and an
//! `interlock.dev/<field>` annotation sets each field of the spec (defaults: outbound
//! 15001, inbound 15006, proxy UID 1337, no GID; everything captured; everything through
//! `lo` passes). Port lists take single ports and `8000-8010` ranges, comma-separated,
//! and `*` where it means all; CIDR lists take networks or addresses. Invalid values fail
//! the pod, naming the annotation.

use std::net::IpAddr;

use ipnet::IpNet;

use super::{invalid, PodView};
use crate::spec::{PortSelection, RedirectSpec, SpecError};

/// interlock's own annotation keys (the `generic` profile).
pub mod keys {
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

/// The spec the `interlock.dev/*` annotations of `a` ask for, `None` unless
/// `interlock.dev/redirect` is `enabled`.
pub fn spec(a: &PodView) -> Result<Option<RedirectSpec>, SpecError> {
    use keys::*;
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
    let mut spec = super::base_spec(1337, None, 15006, 15001);
    if let Some(v) = a.get(PROXY_UID) {
        spec.proxy_uid = super::parse_id(PROXY_UID, v, "a UID")?;
    }
    if let Some(v) = a.get(PROXY_GID) {
        spec.proxy_gid = Some(super::parse_id(PROXY_GID, v, "a GID")?);
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
        spec.exclude_interfaces = super::parse_ifnames(EXCLUDE_INTERFACES, v)?;
    }
    Ok(Some(spec))
}

/// A parsed port list.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ports {
    Wildcard,
    List(Vec<u16>),
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
            let lo = super::parse_port(key, value, lo.trim())?;
            let hi = super::parse_port(key, value, hi.trim())?;
            if lo > hi {
                return Err(invalid(
                    key,
                    value,
                    format!("range {item:?} runs backwards"),
                ));
            }
            out.extend(lo..=hi);
        } else {
            out.push(super::parse_port(key, value, item)?);
        }
    }
    out.sort_unstable();
    out.dedup();
    super::check_ports_size(key, value, &out)?;
    Ok(Ports::List(out))
}

fn parse_single_port(key: &str, value: &str) -> Result<u16, SpecError> {
    super::parse_port(key, value, value.trim())
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
    super::check_list_size(key, value, out.len(), "networks")?;
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;
    use interlock_contract::profile::ProfileName;

    const GENERIC: (&str, &str) = ("interlock.dev/redirect", "enabled");

    fn decide_all(
        pairs: &[(&str, &str)],
    ) -> Result<Option<(ProfileName, RedirectSpec)>, SpecError> {
        decide(pairs, None)
    }

    fn spec(pairs: &[(&str, &str)]) -> RedirectSpec {
        decide_all(pairs).unwrap().expect("meshed").1
    }

    fn err(pairs: &[(&str, &str)]) -> SpecError {
        decide_all(pairs).unwrap_err()
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
}

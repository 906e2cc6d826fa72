//! Istio sidecars in REDIRECT mode, as istio-cni programs them (its `cni/pkg/plugin`:
//! which pods, which annotations and defaults; istio-iptables' `capture/run.go`: which
//! rules).
//!
//! A pod is Istio's when it carries `sidecar.istio.io/status` (the injector's mark), has
//! an `istio-proxy` container (or native-sidecar init container) and no `istio-init`
//! (that init container writes the rules itself), its proxy is a sidecar (not started as
//! `proxy router` and the like) with `DISABLE_ENVOY` unset, and `sidecar.istio.io/inject`
//! (the label, else the annotation) is not false. Those facts, the proxy's UID and GID
//! (`runAsUser` / `runAsGroup` of `istio-proxy`; unset or 0 means 1337) and DNS capture
//! (`ISTIO_META_DNS_CAPTURE` in its environment) come from the pod's spec, so an Istio
//! pod needs the agent ([`SpecError::PodSpecNeeded`] without it).
//!
//! Annotations (`traffic.sidecar.istio.io/…`) and what istio-cni assumes without them:
//! `includeInboundPorts` `*`, `excludeInboundPorts` `15020` (15020, 15021 and 15090 are
//! always added), `includeOutboundIPRanges` `*`, `excludeOutboundIPRanges` none,
//! `includeOutboundPorts` none, `excludeOutboundPorts` `15020` (only when absent: an
//! empty value excludes nothing), `excludeInterfaces` none;
//! `sidecar.istio.io/interceptionMode` `REDIRECT` (TPROXY is refused). Port lists take
//! single ports (0–65535, no ranges), CIDR lists prefixes only; anything else fails the
//! pod, as it fails istio-cni's ADD.
//!
//! The rules beyond the annotations, always: inbound 15008 (HBONE) passes; the proxy's
//! connections to its own pod through `lo` (other than to 127.0.0.1, and to 15008) go to
//! the inbound port 15006 (how Envoy calls its own pod, and what `istio-validation`
//! checks); connections from 127.0.0.6 through `lo` (Envoy's inbound passthrough) pass;
//! everything else the apps send through `lo` passes, unless the include ranges name a
//! loopback address. With DNS capture, TCP and UDP to port 53 from anyone but the proxy
//! go to 15053, with Istio's conntrack zones. `INVALID_DROP` drops invalid inbound
//! packets.
//!
//! Where interlock differs on purpose: both address families are always programmed
//! (istio-cni writes IPv6 rules only for a pod whose first address is IPv6, or with
//! `ISTIO_DUAL_STACK`), so that no IPv6 connection leaves a meshed pod unproxied.

use interlock_contract::pod::ContainerFacts;
use ipnet::IpNet;

use super::{facts, go_parse_bool, invalid, unsupported, PodView, ProfileName};
use crate::spec::{DnsCapture, PortSelection, ProxyToInbound, RedirectSpec, SpecError};

/// Istio annotation keys.
pub mod keys {
    pub use interlock_contract::guard::keys::istio::{INJECT, STATUS};
    /// `REDIRECT` (default) or `TPROXY` (refused).
    pub const INTERCEPTION_MODE: &str = "sidecar.istio.io/interceptionMode";
    /// Inbound ports captured (`*` default, empty = none).
    pub const INCLUDE_INBOUND_PORTS: &str = "traffic.sidecar.istio.io/includeInboundPorts";
    /// Inbound ports not captured (15020, 15021, 15090 always added).
    pub const EXCLUDE_INBOUND_PORTS: &str = "traffic.sidecar.istio.io/excludeInboundPorts";
    /// Outbound ports captured whatever the destination.
    pub const INCLUDE_OUTBOUND_PORTS: &str = "traffic.sidecar.istio.io/includeOutboundPorts";
    /// Outbound ports not captured (15020 when absent).
    pub const EXCLUDE_OUTBOUND_PORTS: &str = "traffic.sidecar.istio.io/excludeOutboundPorts";
    /// Outbound destinations captured (`*` default, empty = none).
    pub const INCLUDE_OUTBOUND_IP_RANGES: &str = "traffic.sidecar.istio.io/includeOutboundIPRanges";
    /// Outbound destinations not captured.
    pub const EXCLUDE_OUTBOUND_IP_RANGES: &str = "traffic.sidecar.istio.io/excludeOutboundIPRanges";
    /// Interfaces never captured.
    pub const EXCLUDE_INTERFACES: &str = "traffic.sidecar.istio.io/excludeInterfaces";
    /// KubeVirt interfaces whose traffic Istio reroutes (refused).
    pub const REROUTE_VIRTUAL_INTERFACES: &str = "istio.io/reroute-virtual-interfaces";
    /// The older name of [`REROUTE_VIRTUAL_INTERFACES`] (refused).
    pub const KUBEVIRT_INTERFACES: &str = "traffic.sidecar.istio.io/kubevirtInterfaces";
}

pub use interlock_contract::guard::keys::istio::{
    INIT as INIT_CONTAINER, PROXY as PROXY_CONTAINER,
};
/// The proxy's UID and GID when its container does not set them.
pub const DEFAULT_PROXY_ID: u32 = 1337;
/// Outbound capture port.
pub const OUTBOUND_PORT: u16 = 15001;
/// Inbound capture port.
pub const INBOUND_PORT: u16 = 15006;
/// HBONE: inbound never captured, and never a target of the proxy's own loopback calls.
pub const TUNNEL_PORT: u16 = 15008;
/// The DNS proxy's port.
pub const DNS_PORT: u16 = 15053;
/// Ports istio-cni always leaves out of inbound capture (status, health, Prometheus).
pub const EXCLUDED_INBOUND: [u16; 3] = [15020, 15021, 15090];
/// `excludeInboundPorts` and `excludeOutboundPorts` when absent (the status port).
pub const DEFAULT_EXCLUDED: u16 = 15020;

/// The spec istio-cni would program for `pod`, `None` when it would leave the pod alone.
pub fn spec(pod: &PodView) -> Result<Option<RedirectSpec>, SpecError> {
    use keys::*;
    if pod.get(STATUS).is_none() {
        return Ok(None);
    }
    let facts = facts(
        pod,
        ProfileName::Istio,
        "the proxy's UID and GID (the istio-proxy container's securityContext), DNS capture (its environment) and whether istio-init writes the rules",
    )?;
    if facts.has_container(INIT_CONTAINER) {
        return Ok(None);
    }
    let Some(proxy) = facts.container(PROXY_CONTAINER) else {
        return Ok(None);
    };
    if env_true(proxy, "DISABLE_ENVOY") {
        return Ok(None);
    }
    if proxy.args.first().is_some_and(|a| a == "proxy")
        && proxy.args.get(1).map(String::as_str) != Some("sidecar")
    {
        return Ok(None);
    }
    let inject = facts
        .labels
        .get(INJECT)
        .map(String::as_str)
        .or_else(|| pod.get(INJECT));
    if inject.is_some_and(|v| go_parse_bool(v) == Some(false)) {
        return Ok(None);
    }
    match pod.get(INTERCEPTION_MODE) {
        None | Some("REDIRECT") => {}
        Some("TPROXY") => {
            return Err(unsupported(
                INTERCEPTION_MODE,
                "TPROXY",
                "interlock implements REDIRECT interception only; remove the annotation or set it to REDIRECT",
            ))
        }
        Some(other) => {
            return Err(invalid(
                INTERCEPTION_MODE,
                other,
                "expected REDIRECT (or TPROXY, which interlock refuses)",
            ))
        }
    }
    for key in [REROUTE_VIRTUAL_INTERFACES, KUBEVIRT_INTERFACES] {
        if let Some(v) = pod.get(key).filter(|v| !v.trim().is_empty()) {
            return Err(unsupported(
                key,
                v,
                "interlock does not reroute KubeVirt interfaces to the proxy; remove the annotation",
            ));
        }
    }

    let uid = proxy_id(proxy.run_as_user, "runAsUser")?;
    let gid = proxy_id(proxy.run_as_group, "runAsGroup")?;
    let mut spec = super::base_spec(uid, Some(gid), INBOUND_PORT, OUTBOUND_PORT);

    // Inbound: 15008 always passes; the exclusions count only when every port is captured.
    spec.inbound.exclude_ports = vec![TUNNEL_PORT];
    match ports(
        INCLUDE_INBOUND_PORTS,
        pod.get(INCLUDE_INBOUND_PORTS).unwrap_or("*"),
        true,
    )? {
        Ports::All => {
            let given = pod
                .get(EXCLUDE_INBOUND_PORTS)
                .map(str::to_string)
                .unwrap_or_else(|| DEFAULT_EXCLUDED.to_string());
            if let Ports::List(l) = ports(EXCLUDE_INBOUND_PORTS, &given, false)? {
                spec.inbound.exclude_ports.extend(l);
            }
            spec.inbound.exclude_ports.extend(EXCLUDED_INBOUND);
        }
        Ports::List(l) => spec.inbound.include_ports = PortSelection::Only(l),
    }

    // Outbound.
    spec.outbound.exclude_ports = match pod.get(EXCLUDE_OUTBOUND_PORTS) {
        None => vec![DEFAULT_EXCLUDED],
        Some(v) => ports(EXCLUDE_OUTBOUND_PORTS, v, false)?.list(),
    };
    if let Some(v) = pod.get(INCLUDE_OUTBOUND_PORTS) {
        spec.outbound.any_destination_ports = ports(INCLUDE_OUTBOUND_PORTS, v, false)?.list();
    }
    let mut loopback_included = false;
    match pod.get(INCLUDE_OUTBOUND_IP_RANGES).unwrap_or("*") {
        "*" => {}
        "" => spec.outbound.include_ports = PortSelection::Only(Vec::new()),
        v => {
            let nets = prefixes(INCLUDE_OUTBOUND_IP_RANGES, v)?;
            loopback_included = nets.iter().any(|n| n.addr().is_loopback());
            spec.outbound.include_cidrs = nets.iter().map(IpNet::trunc).collect();
        }
    }
    if let Some(v) = pod.get(EXCLUDE_OUTBOUND_IP_RANGES) {
        if v == "*" {
            return Err(invalid(
                EXCLUDE_OUTBOUND_IP_RANGES,
                v,
                "\"*\" is not allowed here (Istio refuses it too)",
            ));
        }
        if !v.is_empty() {
            spec.outbound.exclude_cidrs = prefixes(EXCLUDE_OUTBOUND_IP_RANGES, v)?
                .iter()
                .map(IpNet::trunc)
                .collect();
        }
    }
    if let Some(v) = pod.get(EXCLUDE_INTERFACES) {
        spec.exclude_interfaces = interfaces(EXCLUDE_INTERFACES, v)?;
    }

    spec.loopback.app_bypass = !loopback_included;
    spec.loopback.passthrough_source = true;
    spec.loopback.proxy_to_inbound = Some(ProxyToInbound {
        skip_ports: vec![TUNNEL_PORT],
    });
    if env_true(proxy, "ISTIO_META_DNS_CAPTURE") {
        spec.dns = Some(DnsCapture {
            port: DNS_PORT,
            only_to: Vec::new(),
            proxy_exempt: true,
            conntrack_zones: true,
        });
    }
    spec.drop_invalid = env_true(proxy, "INVALID_DROP");
    Ok(Some(spec))
}

/// A boolean of the proxy's environment as istio-cni reads it (`strconv.ParseBool`; an
/// unparsable value counts as false).
fn env_true(proxy: &ContainerFacts, name: &str) -> bool {
    proxy
        .env
        .get(name)
        .is_some_and(|v| go_parse_bool(v) == Some(true))
}

fn proxy_id(value: Option<i64>, field: &str) -> Result<u32, SpecError> {
    match value {
        None | Some(0) => Ok(DEFAULT_PROXY_ID),
        Some(n) => u32::try_from(n).map_err(|_| SpecError::Field {
            field: "proxyUid",
            reason: format!(
                "the istio-proxy container's securityContext.{field} is {n}, not a valid ID"
            ),
        }),
    }
}

/// An Istio port list.
enum Ports {
    All,
    List(Vec<u16>),
}

impl Ports {
    fn list(self) -> Vec<u16> {
        match self {
            Ports::All => Vec::new(),
            Ports::List(l) => l,
        }
    }
}

/// Istio's port list: `*` (where allowed), empty, or single ports 0–65535 separated by
/// commas (each item trimmed; ranges and empty items are errors). Port 0 never matches a
/// TCP connection and is dropped.
fn ports(key: &str, value: &str, wildcard: bool) -> Result<Ports, SpecError> {
    let t = value.trim();
    if t.is_empty() {
        return Ok(Ports::List(Vec::new()));
    }
    if t == "*" {
        return if wildcard {
            Ok(Ports::All)
        } else {
            Err(invalid(key, value, "\"*\" is not allowed here"))
        };
    }
    let mut out = Vec::new();
    for item in t.split(',').map(str::trim) {
        if item.is_empty() {
            return Err(invalid(key, value, "an empty item (stray comma)"));
        }
        let port: u16 = item.parse().map_err(|_| {
            invalid(
                key,
                value,
                format!("{item:?} is not a port number (Istio takes single ports 0-65535; ranges are not accepted)"),
            )
        })?;
        if port != 0 {
            out.push(port);
        }
    }
    super::check_ports_size(key, value, &out)?;
    Ok(Ports::List(out))
}

/// Istio's CIDR list: comma-separated prefixes, written exactly (no spaces, no empty items,
/// no bare addresses).
fn prefixes(key: &str, value: &str) -> Result<Vec<IpNet>, SpecError> {
    let mut out = Vec::new();
    for item in value.split(',') {
        let net = item.parse::<IpNet>().map_err(|_| {
            invalid(
                key,
                value,
                format!("{item:?} is not a CIDR prefix (expected e.g. 10.0.0.0/8 or fd00::/8, comma-separated without spaces)"),
            )
        })?;
        out.push(net);
    }
    super::check_list_size(key, value, out.len(), "networks")?;
    Ok(out)
}

/// Interface names as Istio validates them.
fn interfaces(key: &str, value: &str) -> Result<Vec<String>, SpecError> {
    let mut out = Vec::new();
    for item in value.split(',').map(str::trim) {
        let valid = !item.is_empty()
            && item.len() <= 15
            && item.starts_with(|c: char| c.is_ascii_alphabetic())
            && item
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
        if !valid {
            return Err(invalid(
                key,
                value,
                format!("{item:?} is not an interface name (a letter, then up to 14 letters, digits, '_', '.' or '-')"),
            ));
        }
        out.push(item.to_string());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;
    use crate::spec::{Landing, OutboundFlow, Transport};
    use interlock_contract::pod::PodFacts;
    use std::collections::BTreeMap;
    use std::net::IpAddr;

    const ISTIO: (&str, &str) = (keys::STATUS, "{\"containers\":[\"istio-proxy\"]}");

    fn proxy() -> ContainerFacts {
        ContainerFacts {
            name: PROXY_CONTAINER.into(),
            args: vec!["proxy".into(), "sidecar".into()],
            ..ContainerFacts::default()
        }
    }

    fn pod_facts() -> PodFacts {
        facts_with(Some(proxy()))
    }

    fn spec_with(pairs: &[(&str, &str)], facts: &PodFacts) -> RedirectSpec {
        let mut all = vec![ISTIO];
        all.extend_from_slice(pairs);
        let (p, s) = decide(&all, Some(facts)).unwrap().expect("meshed");
        assert_eq!(p, ProfileName::Istio);
        s
    }

    fn spec(pairs: &[(&str, &str)]) -> RedirectSpec {
        spec_with(pairs, &pod_facts())
    }

    fn err(pairs: &[(&str, &str)]) -> SpecError {
        let mut all = vec![ISTIO];
        all.extend_from_slice(pairs);
        decide(&all, Some(&pod_facts())).unwrap_err()
    }

    fn out(
        s: &RedirectSpec,
        uid: u32,
        out_if: &str,
        src: Option<&str>,
        dst: &str,
        port: u16,
    ) -> Landing {
        s.outbound(&OutboundFlow {
            uid,
            gid: uid,
            out_if,
            src: src.map(|a| a.parse().unwrap()),
            dst: dst.parse().unwrap(),
            transport: Transport::Tcp,
            port,
        })
    }

    /// istio-cni's `basic` case (cni/pkg/plugin/testdata/basic.txt.golden): the defaults.
    #[test]
    fn defaults() {
        let s = spec(&[]);
        assert_eq!((s.proxy_uid, s.proxy_gid), (1337, Some(1337)));
        assert_eq!(
            (s.outbound.proxy_port, s.inbound.proxy_port),
            (15001, 15006)
        );
        assert_eq!(s.inbound.include_ports, PortSelection::All);
        assert_eq!(s.inbound.exclude_ports, vec![15008, 15020, 15021, 15090]);
        assert_eq!(s.outbound.exclude_ports, vec![15020]);
        assert_eq!(s.outbound.include_ports, PortSelection::All);
        assert!(s.outbound.include_cidrs.is_empty() && s.outbound.exclude_cidrs.is_empty());
        assert!(s.loopback.app_bypass && s.loopback.passthrough_source);
        assert_eq!(
            s.loopback.proxy_to_inbound,
            Some(ProxyToInbound {
                skip_ports: vec![15008]
            })
        );
        assert_eq!((s.dns.clone(), s.drop_invalid), (None, false));
        // istio-validation's check: UID 1337, 127.0.0.1 -> 127.0.0.6:15002 lands inbound.
        assert_eq!(
            out(&s, 1337, "lo", Some("127.0.0.1"), "127.0.0.6", 15002),
            Landing::Inbound
        );
        // Envoy's inbound passthrough from 127.0.0.6 to the pod IP passes.
        assert_eq!(
            out(&s, 1337, "lo", Some("127.0.0.6"), "10.1.0.5", 8080),
            Landing::Passes
        );
        // The hairpin: Envoy to its own pod IP goes through the inbound side.
        assert_eq!(
            out(&s, 1337, "lo", None, "10.1.0.5", 8080),
            Landing::Inbound
        );
        assert_eq!(
            out(&s, 1337, "lo", None, "10.1.0.5", 15008),
            Landing::Passes
        );
        assert_eq!(
            out(&s, 1337, "lo", None, "127.0.0.1", 15000),
            Landing::Passes
        );
        assert_eq!(out(&s, 1000, "lo", None, "10.1.0.5", 8080), Landing::Passes);
        assert_eq!(
            out(&s, 1000, "eth0", None, "10.2.0.5", 8080),
            Landing::Outbound
        );
        assert_eq!(
            out(&s, 1000, "eth0", None, "10.2.0.5", 15020),
            Landing::Passes
        );
        assert_eq!(
            s.inbound("eth0", "10.2.0.5".parse().unwrap(), 15008),
            Landing::Passes
        );
        assert_eq!(
            s.inbound("eth0", "10.2.0.5".parse().unwrap(), 15021),
            Landing::Passes
        );
        assert_eq!(
            s.inbound("eth0", "10.2.0.5".parse().unwrap(), 8080),
            Landing::Inbound
        );
    }

    /// `custom-uid` and `custom-uid-zero` (cni/pkg/plugin/plugin_dryrun_test.go).
    #[test]
    fn proxy_ids_come_from_the_proxy_container() {
        let mut p = proxy();
        p.run_as_user = Some(1000670000);
        p.run_as_group = Some(1000670001);
        let s = spec_with(&[], &facts_with(Some(p.clone())));
        assert_eq!((s.proxy_uid, s.proxy_gid), (1000670000, Some(1000670001)));
        p.run_as_user = Some(0);
        p.run_as_group = None;
        let s = spec_with(&[], &facts_with(Some(p.clone())));
        assert_eq!((s.proxy_uid, s.proxy_gid), (1337, Some(1337)));
        p.run_as_user = Some(-3);
        let e = decide(&[ISTIO], Some(&facts_with(Some(p)))).unwrap_err();
        assert!(e.to_string().contains("runAsUser is -3"), "{e}");
    }

    /// cni/pkg/plugin/plugin.go: which pods istio-cni leaves alone.
    #[test]
    fn pods_istio_cni_skips() {
        let none = |pairs: &[(&str, &str)], facts: &PodFacts| {
            assert_eq!(
                decide(pairs, Some(facts)).unwrap(),
                None,
                "{pairs:?} {facts:?}"
            );
        };
        // No status annotation: not injected.
        none(&[], &pod_facts());
        // No istio-proxy container.
        none(&[ISTIO], &facts_with(None));
        // istio-init writes the rules itself.
        let mut f = pod_facts();
        f.containers
            .push(ContainerFacts::named(INIT_CONTAINER, true));
        none(&[ISTIO], &f);
        // DISABLE_ENVOY.
        let mut p = proxy();
        p.env.insert("DISABLE_ENVOY".into(), "true".into());
        none(&[ISTIO], &facts_with(Some(p)));
        // A gateway (proxy router).
        let mut p = proxy();
        p.args = vec!["proxy".into(), "router".into()];
        none(&[ISTIO], &facts_with(Some(p)));
        // inject false, as annotation or label; the label wins.
        for v in ["false", "False", "0", "f"] {
            none(&[ISTIO, (keys::INJECT, v)], &pod_facts());
        }
        let mut f = pod_facts();
        f.labels.insert(keys::INJECT.into(), "false".into());
        none(&[ISTIO, (keys::INJECT, "true")], &f);
        let mut f = pod_facts();
        f.labels.insert(keys::INJECT.into(), "true".into());
        assert!(decide(&[ISTIO, (keys::INJECT, "false")], Some(&f))
            .unwrap()
            .is_some());
        // Unparsable inject values are ignored.
        assert!(decide(&[ISTIO, (keys::INJECT, "nope")], Some(&pod_facts()))
            .unwrap()
            .is_some());
        // A native sidecar counts as the proxy.
        let mut p = proxy();
        p.init = true;
        assert!(decide(&[ISTIO], Some(&facts_with(Some(p))))
            .unwrap()
            .is_some());
    }

    /// cni/pkg/plugin/sidecar_redirect.go's excludeInboundPorts composition and the
    /// `include-exclude-ports` case.
    #[test]
    fn inbound_ports() {
        let s = spec(&[(keys::EXCLUDE_INBOUND_PORTS, "3306")]);
        assert_eq!(
            s.inbound.exclude_ports,
            vec![3306, 15008, 15020, 15021, 15090]
        );
        let s = spec(&[(keys::EXCLUDE_INBOUND_PORTS, "")]);
        assert_eq!(s.inbound.exclude_ports, vec![15008, 15020, 15021, 15090]);
        let s = spec(&[
            (keys::INCLUDE_INBOUND_PORTS, "1111,2222"),
            (keys::EXCLUDE_INBOUND_PORTS, "3333,4444"),
            (keys::EXCLUDE_OUTBOUND_PORTS, "5555,6666"),
        ]);
        assert_eq!(
            s.inbound.include_ports,
            PortSelection::Only(vec![1111, 2222])
        );
        assert_eq!(s.inbound.exclude_ports, vec![15008]);
        assert_eq!(s.outbound.exclude_ports, vec![5555, 6666]);
        // An included port that the default exclusions name is captured (they are ignored).
        let s = spec(&[(keys::INCLUDE_INBOUND_PORTS, "15020")]);
        assert!(s.captures_inbound("eth0", 15020));
        let s = spec(&[(keys::INCLUDE_INBOUND_PORTS, "")]);
        assert_eq!(s.inbound.include_ports, PortSelection::Only(vec![]));
        let s = spec(&[(keys::INCLUDE_INBOUND_PORTS, " * ")]);
        assert_eq!(s.inbound.include_ports, PortSelection::All);
        for (key, bad) in [
            (keys::EXCLUDE_INBOUND_PORTS, "8000-8010"),
            (keys::EXCLUDE_INBOUND_PORTS, "22,"),
            (keys::EXCLUDE_INBOUND_PORTS, "*"),
            (keys::INCLUDE_INBOUND_PORTS, "70000"),
            (keys::INCLUDE_INBOUND_PORTS, "http"),
            (keys::EXCLUDE_OUTBOUND_PORTS, "1:2"),
        ] {
            assert_names(&err(&[(key, bad)]), key, bad);
        }
    }

    #[test]
    fn outbound_ports_and_ranges() {
        // Present but empty: 15020 is no longer excluded.
        assert!(spec(&[(keys::EXCLUDE_OUTBOUND_PORTS, "")])
            .outbound
            .exclude_ports
            .is_empty());
        // includeOutboundPorts captures to any destination not excluded.
        let s = spec(&[
            (keys::INCLUDE_OUTBOUND_IP_RANGES, ""),
            (keys::INCLUDE_OUTBOUND_PORTS, "32000,31000"),
        ]);
        assert_eq!(s.outbound.any_destination_ports, vec![31000, 32000]);
        assert_eq!(s.outbound.include_ports, PortSelection::Only(vec![]));
        assert_eq!(
            out(&s, 1000, "eth0", None, "10.9.9.9", 31000),
            Landing::Outbound
        );
        assert_eq!(
            out(&s, 1000, "eth0", None, "10.9.9.9", 8080),
            Landing::Passes
        );
        let s = spec(&[
            (keys::INCLUDE_OUTBOUND_IP_RANGES, "10.0.0.0/8"),
            (keys::INCLUDE_OUTBOUND_PORTS, "443"),
        ]);
        assert_eq!(
            out(&s, 1000, "eth0", None, "192.0.2.1", 443),
            Landing::Outbound
        );
        assert_eq!(
            out(&s, 1000, "eth0", None, "192.0.2.1", 80),
            Landing::Passes
        );
        assert_eq!(
            out(&s, 1000, "eth0", None, "10.1.1.1", 80),
            Landing::Outbound
        );
        // Ranges: host bits are cleared, families split, bare addresses refused.
        let s = spec(&[
            (keys::INCLUDE_OUTBOUND_IP_RANGES, "10.1.2.3/16,fd00::/8"),
            (keys::EXCLUDE_OUTBOUND_IP_RANGES, "169.254.169.254/32"),
        ]);
        let n = |s: &str| s.parse::<IpNet>().unwrap();
        assert_eq!(
            s.outbound.include_cidrs,
            vec![n("10.1.0.0/16"), n("fd00::/8")]
        );
        assert_eq!(s.outbound.exclude_cidrs, vec![n("169.254.169.254/32")]);
        for (key, bad) in [
            (keys::INCLUDE_OUTBOUND_IP_RANGES, "10.0.0.1"),
            (keys::INCLUDE_OUTBOUND_IP_RANGES, "10.0.0.0/8, 10.1.0.0/16"),
            (keys::INCLUDE_OUTBOUND_IP_RANGES, "*,10.0.0.0/8"),
            (keys::EXCLUDE_OUTBOUND_IP_RANGES, "*"),
            (keys::EXCLUDE_OUTBOUND_IP_RANGES, "10.0.0.0/33"),
        ] {
            assert_names(&err(&[(key, bad)]), key, bad);
        }
    }

    /// `include-exclude-ip` (cni/pkg/plugin/testdata/include-exclude-ip.txt.golden): a
    /// loopback include range captures the apps' loopback traffic (but 127.0.0.1).
    #[test]
    fn loopback_include_range() {
        let s = spec(&[
            (keys::INCLUDE_OUTBOUND_IP_RANGES, "127.0.0.0/8"),
            (keys::EXCLUDE_OUTBOUND_IP_RANGES, "10.0.0.0/8"),
        ]);
        assert!(!s.loopback.app_bypass);
        assert_eq!(out(&s, 0, "lo", None, "127.0.0.2", 9), Landing::Outbound);
        assert_eq!(out(&s, 0, "lo", None, "127.0.0.1", 9), Landing::Passes);
        assert_eq!(out(&s, 0, "lo", None, "10.1.0.5", 9), Landing::Passes);
        assert_eq!(out(&s, 0, "eth0", None, "192.0.2.1", 9), Landing::Passes);
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        assert!(!s.captures_outbound(0, 0, "eth0", v6, 9));
        assert!(s.outbound_capture_gap(crate::spec::Family::V4).is_none());
    }

    /// `dns` and `invalid-drop` (cni/pkg/plugin/testdata/dns.txt.golden, invalid-drop.txt.golden).
    #[test]
    fn dns_capture_and_invalid_drop_come_from_the_proxy_environment() {
        let mut p = proxy();
        p.env.insert("ISTIO_META_DNS_CAPTURE".into(), "true".into());
        p.env.insert("INVALID_DROP".into(), "1".into());
        let s = spec_with(&[], &facts_with(Some(p)));
        let dns = s.dns.clone().expect("dns");
        assert_eq!(
            (dns.port, dns.proxy_exempt, dns.conntrack_zones),
            (15053, true, true)
        );
        assert!(dns.only_to.is_empty());
        assert!(s.drop_invalid);
        let udp = |uid: u32, dst: &str| {
            s.outbound(&OutboundFlow {
                uid,
                gid: uid,
                out_if: "eth0",
                src: None,
                dst: dst.parse().unwrap(),
                transport: Transport::Udp,
                port: 53,
            })
        };
        assert_eq!(udp(1000, "10.96.0.10"), Landing::Dns);
        assert_eq!(udp(1337, "10.96.0.10"), Landing::Passes);
        // TCP to a resolver on loopback is captured too.
        assert_eq!(out(&s, 1000, "lo", None, "127.0.0.53", 53), Landing::Dns);
        // The proxy's loopback call to port 53 is not hairpinned.
        assert_eq!(out(&s, 1337, "lo", None, "10.1.0.5", 53), Landing::Passes);
        // An unparsable value is false, as in istio-cni.
        let mut p = proxy();
        p.env.insert("ISTIO_META_DNS_CAPTURE".into(), "yes".into());
        assert_eq!(spec_with(&[], &facts_with(Some(p))).dns, None);
    }

    #[test]
    fn interception_modes_and_kubevirt() {
        let e = err(&[(keys::INTERCEPTION_MODE, "TPROXY")]);
        assert!(matches!(e, SpecError::Unsupported { .. }), "{e}");
        assert_names(
            &err(&[(keys::INTERCEPTION_MODE, "NONE")]),
            keys::INTERCEPTION_MODE,
            "NONE",
        );
        spec(&[(keys::INTERCEPTION_MODE, "REDIRECT")]);
        let e = err(&[(keys::REROUTE_VIRTUAL_INTERFACES, "net1")]);
        assert!(matches!(e, SpecError::Unsupported { .. }), "{e}");
    }

    #[test]
    fn exclude_interfaces() {
        let s = spec(&[(keys::EXCLUDE_INTERFACES, "net1, not-istio-nic")]);
        assert_eq!(s.exclude_interfaces, vec!["net1", "not-istio-nic"]);
        for bad in ["a/b", "1abc", "net1,", "averyveryverylongname"] {
            assert_names(
                &err(&[(keys::EXCLUDE_INTERFACES, bad)]),
                "excludeInterfaces",
                bad,
            );
        }
    }

    #[test]
    fn without_the_spec_the_pod_waits_for_the_agent() {
        let e = decide(&[ISTIO], None).unwrap_err();
        assert!(matches!(e, SpecError::PodSpecNeeded { .. }), "{e}");
        let _ = BTreeMap::<String, String>::new();
    }
}

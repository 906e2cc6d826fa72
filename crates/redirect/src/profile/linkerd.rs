//! Linkerd, as linkerd-cni programs it (linkerd2-proxy-init's `cni-plugin/main.go`: which
//! pods and which annotations; `pkg/iptables/iptables.go`: which rules).
//!
//! A pod is Linkerd's when it carries `linkerd.io/proxy-version` (the injector's mark),
//! has a `linkerd-proxy` container (or native-sidecar init container) and no
//! `linkerd-init` init container (which writes the rules itself). linkerd-cni looks at
//! the containers only; interlock needs the injector's annotation first so that a pod
//! without it is decided without asking the agent (a hand-written pod with a
//! `linkerd-proxy` container but no injector annotation is left alone). The containers
//! and the `linkerd.io/control-plane-component` label come from the pod's spec, so a
//! Linkerd pod needs the agent ([`SpecError::PodSpecNeeded`] without it).
//!
//! Rules, as linkerd-cni's defaults (`linkerd2-cni` chart) and the pod's annotations make
//! them: outbound 4140, inbound 4143, proxy UID 2102 (`config.linkerd.io/proxy-uid`), a
//! GID exemption only with `config.linkerd.io/proxy-gid`; inbound 4191 and 4190 plus
//! `config.linkerd.io/skip-inbound-ports` pass; outbound
//! `config.linkerd.io/skip-outbound-ports` pass (none by default; 443 and 6443 too for
//! control-plane components); inbound connections from
//! `config.linkerd.io/skip-subnets` pass (a source match: it does not touch outbound
//! traffic); everything through `lo` passes. Port lists take `N` and `L-H` items;
//! linkerd-cni drops an item it cannot read (a space included: `80, 443` skips 80 only),
//! and so does this profile. A proxy UID or GID that is not a number, or a subnet that is
//! not a CIDR, fails the pod, as it fails linkerd-cni's ADD.
//!
//! Where interlock differs on purpose: both address families are always programmed
//! (linkerd-cni's chart leaves IPv6 out unless `disableIPv6: false`), subnets of both
//! families are accepted in one list, the API server's ports of a control-plane pod are
//! 443 and 6443 (linkerd-cni's fallback; it asks the `kubernetes` Service first), and a
//! proxy UID of 0 or below is refused (linkerd-cni would then exempt nothing and capture
//! the proxy's own traffic).

use ipnet::IpNet;

use super::{facts, invalid, PodView, ProfileName};
use crate::spec::{RedirectSpec, SpecError};

/// Linkerd annotation and label keys.
pub mod keys {
    pub use interlock_contract::guard::keys::linkerd::{PROXY_UID, PROXY_VERSION};
    /// Inbound ports not captured (added to 4191, 4190).
    pub const SKIP_INBOUND_PORTS: &str = "config.linkerd.io/skip-inbound-ports";
    /// Outbound ports not captured.
    pub const SKIP_OUTBOUND_PORTS: &str = "config.linkerd.io/skip-outbound-ports";
    /// Inbound source networks not captured.
    pub const SKIP_SUBNETS: &str = "config.linkerd.io/skip-subnets";
    /// The proxy's GID (default: none).
    pub const PROXY_GID: &str = "config.linkerd.io/proxy-gid";
    /// Label of the control plane's own pods (their API server calls are not captured).
    pub const CONTROL_PLANE_COMPONENT: &str = "linkerd.io/control-plane-component";
}

pub use interlock_contract::guard::keys::linkerd::{
    INIT as INIT_CONTAINER, PROXY as PROXY_CONTAINER,
};
/// The proxy's default UID.
pub const DEFAULT_PROXY_UID: u32 = 2102;
/// Outbound capture port.
pub const OUTBOUND_PORT: u16 = 4140;
/// Inbound capture port.
pub const INBOUND_PORT: u16 = 4143;
/// The proxy's admin and control ports, never captured inbound (linkerd-cni's config).
pub const EXCLUDED_INBOUND: [u16; 2] = [4191, 4190];
/// The API server's ports a control-plane pod reaches without its proxy.
pub const API_SERVER_PORTS: [u16; 2] = [443, 6443];

/// The spec linkerd-cni would program for `pod`, `None` when it would leave the pod alone.
pub fn spec(pod: &PodView) -> Result<Option<RedirectSpec>, SpecError> {
    use keys::*;
    if pod.get(PROXY_VERSION).is_none() {
        return Ok(None);
    }
    let facts = facts(
        pod,
        ProfileName::Linkerd,
        "whether it runs linkerd-proxy without linkerd-init, and the control-plane-component label",
    )?;
    if facts
        .containers
        .iter()
        .any(|c| c.init && c.name == INIT_CONTAINER)
        || !facts.has_container(PROXY_CONTAINER)
    {
        return Ok(None);
    }
    // linkerd-cni reads an annotation only when it is not empty.
    let get = |key: &str| pod.get(key).filter(|v| !v.is_empty());

    let mut spec = super::base_spec(DEFAULT_PROXY_UID, None, INBOUND_PORT, OUTBOUND_PORT);
    spec.inbound.exclude_ports = EXCLUDED_INBOUND.to_vec();
    if let Some(v) = get(SKIP_INBOUND_PORTS) {
        spec.inbound
            .exclude_ports
            .extend(ports(SKIP_INBOUND_PORTS, v)?);
    }
    if let Some(v) = get(SKIP_OUTBOUND_PORTS) {
        spec.outbound.exclude_ports = ports(SKIP_OUTBOUND_PORTS, v)?;
    }
    if facts
        .labels
        .get(CONTROL_PLANE_COMPONENT)
        .is_some_and(|v| !v.is_empty())
    {
        spec.outbound.exclude_ports.extend(API_SERVER_PORTS);
    }
    if let Some(v) = get(SKIP_SUBNETS) {
        spec.inbound.exclude_sources = subnets(SKIP_SUBNETS, v)?;
    }
    if let Some(v) = get(PROXY_UID) {
        spec.proxy_uid = match number(PROXY_UID, v)? {
            n if n > 0 => n as u32,
            n => {
                return Err(invalid(
                    PROXY_UID,
                    v,
                    format!("UID {n} would leave the proxy's own traffic captured (linkerd-cni writes no exemption for it); use the proxy's real UID"),
                ))
            }
        };
    }
    if let Some(v) = get(PROXY_GID) {
        let n = number(PROXY_GID, v)?;
        spec.proxy_gid = (n > 0).then_some(n as u32);
    }
    Ok(Some(spec))
}

/// Go's `strconv.Atoi` within the range of an ID.
fn number(key: &str, value: &str) -> Result<i64, SpecError> {
    value
        .parse::<i64>()
        .ok()
        .filter(|n| *n <= u32::MAX as i64)
        .ok_or_else(|| invalid(key, value, "expected an integer ID"))
}

/// linkerd's port list: `N` or `L-H` items (0–65535) separated by commas, untrimmed;
/// an item that does not read is dropped, as linkerd drops it. Port 0 never matches.
fn ports(key: &str, value: &str) -> Result<Vec<u16>, SpecError> {
    let mut out = Vec::new();
    for item in value.split(',') {
        let (lo, hi) = item.split_once('-').unwrap_or((item, item));
        match (lo.parse::<u16>(), hi.parse::<u16>()) {
            (Ok(lo), Ok(hi)) if lo <= hi => out.extend((lo..=hi).filter(|p| *p != 0)),
            _ => {}
        }
    }
    super::check_ports_size(key, value, &out)?;
    Ok(out)
}

/// linkerd's subnet list: comma-separated CIDRs, each trimmed; anything else fails.
fn subnets(key: &str, value: &str) -> Result<Vec<IpNet>, SpecError> {
    let mut out = Vec::new();
    for item in value.split(',').map(str::trim) {
        let net = item.parse::<IpNet>().map_err(|_| {
            invalid(
                key,
                value,
                format!("{item:?} is not a valid CIDR address (expected e.g. 10.0.0.0/8)"),
            )
        })?;
        out.push(net.trunc());
    }
    super::check_list_size(key, value, out.len(), "networks")?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;
    use crate::spec::{Landing, OutboundFlow, PortSelection, Transport};
    use interlock_contract::pod::{ContainerFacts, PodFacts};

    const LINKERD: (&str, &str) = (keys::PROXY_VERSION, "edge-24.11.8");

    fn pod_facts() -> PodFacts {
        let mut f = facts_with(Some(ContainerFacts::named(PROXY_CONTAINER, false)));
        f.containers
            .push(ContainerFacts::named("linkerd-network-validator", true));
        f
    }

    fn spec_with(pairs: &[(&str, &str)], facts: &PodFacts) -> RedirectSpec {
        let mut all = vec![LINKERD];
        all.extend_from_slice(pairs);
        let (p, s) = decide(&all, Some(facts)).unwrap().expect("meshed");
        assert_eq!(p, ProfileName::Linkerd);
        s
    }

    fn spec(pairs: &[(&str, &str)]) -> RedirectSpec {
        spec_with(pairs, &pod_facts())
    }

    fn err(pairs: &[(&str, &str)]) -> SpecError {
        let mut all = vec![LINKERD];
        all.extend_from_slice(pairs);
        decide(&all, Some(&pod_facts())).unwrap_err()
    }

    /// linkerd-cni's chart defaults (linkerd2 `charts/linkerd2-cni/values.yaml`).
    #[test]
    fn defaults() {
        let s = spec(&[]);
        assert_eq!((s.proxy_uid, s.proxy_gid), (2102, None));
        assert_eq!((s.outbound.proxy_port, s.inbound.proxy_port), (4140, 4143));
        assert_eq!(s.inbound.exclude_ports, vec![4190, 4191]);
        assert!(s.outbound.exclude_ports.is_empty());
        assert!(s.inbound.exclude_sources.is_empty());
        assert_eq!(s.inbound.include_ports, PortSelection::All);
        assert!(s.loopback.is_default());
        assert!(s.dns.is_none());
    }

    /// The pods linkerd-cni acts on (cni-plugin/main.go).
    #[test]
    fn pods_linkerd_cni_skips() {
        assert_eq!(decide(&[LINKERD], Some(&facts_with(None))).unwrap(), None);
        let mut f = pod_facts();
        f.containers
            .push(ContainerFacts::named(INIT_CONTAINER, true));
        assert_eq!(decide(&[LINKERD], Some(&f)).unwrap(), None);
        // A native-sidecar proxy counts.
        let f = facts_with(Some(ContainerFacts::named(PROXY_CONTAINER, true)));
        assert!(decide(&[LINKERD], Some(&f)).unwrap().is_some());
        // No injector annotation: not looked at (and no agent needed to say so).
        assert_eq!(decide(&[], None).unwrap(), None);
        let e = decide(&[LINKERD], None).unwrap_err();
        assert!(matches!(e, SpecError::PodSpecNeeded { .. }), "{e}");
    }

    /// skip-subnets is an inbound source match (pkg/iptables/iptables.go; the proxy-init
    /// integration lab's `pod-ignores-subnets`).
    #[test]
    fn skip_subnets_exempt_inbound_sources_only() {
        let s = spec(&[(keys::SKIP_SUBNETS, "10.99.0.0/16, fd99::/16")]);
        assert_eq!(s.inbound.exclude_sources.len(), 2);
        assert!(s.outbound.exclude_cidrs.is_empty());
        let from = |src: &str| s.inbound("eth0", src.parse().unwrap(), 8080);
        assert_eq!(from("10.99.3.4"), Landing::Passes);
        assert_eq!(from("10.98.3.4"), Landing::Inbound);
        assert_eq!(from("fd99::9"), Landing::Passes);
        assert!(s.captures_outbound(0, 0, "eth0", "10.99.3.4".parse().unwrap(), 80));
        assert_names(
            &err(&[(keys::SKIP_SUBNETS, "10.0.0.0/8,10.1.1.1")]),
            keys::SKIP_SUBNETS,
            "10.1.1.1",
        );
    }

    #[test]
    fn ports_as_linkerd_reads_them() {
        let s = spec(&[
            (keys::SKIP_INBOUND_PORTS, "8000-8003,25,bad, 443"),
            (keys::SKIP_OUTBOUND_PORTS, "3306,4567-4568"),
        ]);
        assert_eq!(
            s.inbound.exclude_ports,
            vec![25, 4190, 4191, 8000, 8001, 8002, 8003]
        );
        assert_eq!(s.outbound.exclude_ports, vec![3306, 4567, 4568]);
        let s = spec(&[(keys::SKIP_OUTBOUND_PORTS, "1-65535")]);
        assert_eq!(
            crate::spec::port_runs(&s.outbound.exclude_ports),
            vec![1..=65535]
        );
        // An empty annotation is no annotation.
        assert!(spec(&[(keys::SKIP_OUTBOUND_PORTS, "")])
            .outbound
            .exclude_ports
            .is_empty());
    }

    #[test]
    fn proxy_ids() {
        let s = spec(&[(keys::PROXY_UID, "2103"), (keys::PROXY_GID, "2104")]);
        assert_eq!((s.proxy_uid, s.proxy_gid), (2103, Some(2104)));
        assert_eq!(spec(&[(keys::PROXY_GID, "0")]).proxy_gid, None);
        for (k, v) in [
            (keys::PROXY_UID, "proxy"),
            (keys::PROXY_UID, "0"),
            (keys::PROXY_UID, "-5"),
            (keys::PROXY_GID, "4294967296"),
            (keys::PROXY_UID, " 2103"),
        ] {
            assert_names(&err(&[(k, v)]), k, v);
        }
        let s = spec(&[(keys::PROXY_UID, "2103")]);
        let flow = |uid: u32| OutboundFlow {
            uid,
            gid: 5,
            out_if: "eth0",
            src: None,
            dst: "10.1.1.1".parse().unwrap(),
            transport: Transport::Tcp,
            port: 80,
        };
        assert_eq!(s.outbound(&flow(2103)), Landing::Passes);
        assert_eq!(s.outbound(&flow(2102)), Landing::Outbound);
    }

    #[test]
    fn control_plane_pods_reach_the_api_server_directly() {
        let mut f = pod_facts();
        f.labels
            .insert(keys::CONTROL_PLANE_COMPONENT.into(), "destination".into());
        let s = spec_with(&[(keys::SKIP_OUTBOUND_PORTS, "3306")], &f);
        assert_eq!(s.outbound.exclude_ports, vec![443, 3306, 6443]);
    }
}

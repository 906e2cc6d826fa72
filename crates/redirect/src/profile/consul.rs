//! Consul transparent proxy, as consul-k8s's CNI plugin programs it (`control-plane/cni`:
//! which pods and which annotations; consul's `sdk/iptables`: which rules).
//!
//! A pod is Consul's when `consul.hashicorp.com/connect-inject-status` (or the older
//! `mesh-inject-status`) and `consul.hashicorp.com/transparent-proxy-status` are both set.
//! Its whole redirection is the JSON of `consul.hashicorp.com/redirect-traffic-config`,
//! which the injector writes (field names as Go writes them, matched without regard to
//! case): `ProxyUserID` (required; 5995 from the injector), `ProxyInboundPort`
//! (required; 20000), `ProxyOutboundPort` (15001 when 0), `ExcludeInboundPorts`,
//! `ExcludeOutboundPorts`, `ExcludeOutboundCIDRs`, `ExcludeUIDs` (the injector always
//! lists its init container's 5996), `ConsulDNSIP` and `ConsulDNSPort` (Consul DNS:
//! 127.0.0.1:8600, or `::1` in dual stack). `consul.hashicorp.com/dual-stack: "true"`
//! says whether the IPv6 side exists. A pod without these annotations, or with a value
//! consul-k8s's plugin or `sdk/iptables` refuses, fails, as it fails there.
//!
//! Rules: inbound TCP to the inbound port unless its port is excluded; outbound TCP to
//! the outbound port unless it is the proxy's or an excluded UID, to 127.0.0.1 / `::1`,
//! or to an excluded port or network. Consul writes no rule for `lo`: an app's connection
//! to its own pod IP or to another 127/8 address is captured. With Consul DNS, TCP and
//! UDP to port 53 at the DNS address (of the family the pod's DNS uses) go to the DNS
//! port, from every UID, before any exemption.
//!
//! Where interlock differs on purpose: both address families are always programmed
//! (consul writes IPv6 rules only in dual stack), an excluded network of the other family
//! is accepted (consul's iptables call for it fails the pod), and a DNS setting that
//! sends queries to another host (`ConsulDNSPort` 0, or a non-loopback `ConsulDNSIP`;
//! consul-k8s never writes either) and a proxy UID of 0 are refused.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde_json::{Map, Value};

use super::{invalid, unsupported, PodView};
use crate::spec::{is_localhost, DnsCapture, RedirectSpec, SpecError};

/// Consul annotation keys.
pub mod keys {
    pub use interlock_contract::guard::keys::consul::{
        CONNECT_INJECT_STATUS, DUAL_STACK, MESH_INJECT_STATUS, REDIRECT_TRAFFIC_CONFIG,
        TRANSPARENT_PROXY_STATUS,
    };
}

/// Outbound port when the config leaves it 0.
pub const DEFAULT_OUTBOUND_PORT: u16 = 15001;

/// The spec consul-k8s's CNI plugin would program for `pod`, `None` when it would leave
/// the pod alone.
pub fn spec(pod: &PodView) -> Result<Option<RedirectSpec>, SpecError> {
    use keys::*;
    let set = |key: &str| pod.get(key).is_some_and(|v| !v.is_empty());
    if !(set(CONNECT_INJECT_STATUS) || set(MESH_INJECT_STATUS)) || !set(TRANSPARENT_PROXY_STATUS) {
        return Ok(None);
    }
    let raw = pod.get(REDIRECT_TRAFFIC_CONFIG).ok_or_else(|| {
        invalid(
            REDIRECT_TRAFFIC_CONFIG,
            "",
            "the annotation is missing; consul-k8s's injector writes it when the pod is injected in CNI mode with transparent proxy",
        )
    })?;
    let dual_stack = match pod.get(DUAL_STACK) {
        Some(v) => v == "true",
        None => return Err(invalid(
            DUAL_STACK,
            "",
            "the annotation is missing; consul-k8s's injector writes it on every pod it injects",
        )),
    };
    let cfg = Config::parse(raw)?;
    let bad = |reason: String| invalid(REDIRECT_TRAFFIC_CONFIG, raw, reason);

    let proxy_uid = match cfg.proxy_user_id.as_str() {
        "" => return Err(bad("ProxyUserID is required".into())),
        u => {
            uid(u).ok_or_else(|| bad(format!("ProxyUserID {u:?} is not a non-zero numeric UID")))?
        }
    };
    if cfg.proxy_inbound_port == 0 {
        return Err(bad("ProxyInboundPort is required".into()));
    }
    let inbound = port(cfg.proxy_inbound_port)
        .ok_or_else(|| bad("ProxyInboundPort is out of range".into()))?;
    let outbound = match cfg.proxy_outbound_port {
        0 => DEFAULT_OUTBOUND_PORT,
        p => port(p).ok_or_else(|| bad("ProxyOutboundPort is out of range".into()))?,
    };
    let mut spec = super::base_spec(proxy_uid, None, inbound, outbound);
    spec.loopback.app_bypass = false;
    spec.inbound.exclude_ports = port_list("ExcludeInboundPorts", &cfg.exclude_inbound_ports, raw)?;
    spec.outbound.exclude_ports =
        port_list("ExcludeOutboundPorts", &cfg.exclude_outbound_ports, raw)?;
    spec.outbound.exclude_cidrs = cfg
        .exclude_outbound_cidrs
        .iter()
        .map(|c| {
            super::parse_net_or_addr(c).ok_or_else(|| {
                bad(format!(
                    "ExcludeOutboundCIDRs: {c:?} is not an address or CIDR"
                ))
            })
        })
        .collect::<Result<_, _>>()?;
    super::check_list_size(
        REDIRECT_TRAFFIC_CONFIG,
        raw,
        spec.outbound.exclude_cidrs.len(),
        "networks",
    )?;
    spec.exempt_uids = cfg
        .exclude_uids
        .iter()
        .map(|u| {
            uid(u).ok_or_else(|| bad(format!("ExcludeUIDs: {u:?} is not a non-zero numeric UID")))
        })
        .collect::<Result<_, _>>()?;
    spec.dns = dns(&cfg, dual_stack, raw)?;
    Ok(Some(spec))
}

/// Consul DNS as `sdk/iptables` writes it: queries to one loopback address go to the DNS
/// port, on the IPv4 side without dual stack and on the IPv6 side with it.
fn dns(cfg: &Config, dual_stack: bool, raw: &str) -> Result<Option<DnsCapture>, SpecError> {
    let ip = match cfg.consul_dns_ip.as_str() {
        "" => None,
        s => Some(s.parse::<IpAddr>().map_err(|_| {
            invalid(
                keys::REDIRECT_TRAFFIC_CONFIG,
                raw,
                format!("ConsulDNSIP {s:?} is not an address"),
            )
        })?),
    };
    match ip {
        Some(IpAddr::V4(_)) if dual_stack => {
            return Err(invalid(
                keys::REDIRECT_TRAFFIC_CONFIG,
                raw,
                "a dual-stack pod needs an IPv6 ConsulDNSIP",
            ))
        }
        Some(IpAddr::V6(_)) if !dual_stack => {
            return Err(invalid(
                keys::REDIRECT_TRAFFIC_CONFIG,
                raw,
                "a pod that is not dual stack needs an IPv4 ConsulDNSIP",
            ))
        }
        _ => {}
    }
    if cfg.consul_dns_port == 0 {
        return match ip {
            None => Ok(None),
            Some(ip) => Err(unsupported(
                keys::REDIRECT_TRAFFIC_CONFIG,
                raw,
                format!("ConsulDNSIP {ip} without ConsulDNSPort sends every DNS query to another resolver; interlock only sends DNS to the proxy's own DNS port"),
            )),
        };
    }
    let dns_port = port(cfg.consul_dns_port).ok_or_else(|| {
        invalid(
            keys::REDIRECT_TRAFFIC_CONFIG,
            raw,
            "ConsulDNSPort is out of range",
        )
    })?;
    let target = ip.unwrap_or(if dual_stack {
        IpAddr::V6(Ipv6Addr::LOCALHOST)
    } else {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    });
    if !is_localhost(target) {
        return Err(unsupported(
            keys::REDIRECT_TRAFFIC_CONFIG,
            raw,
            format!("ConsulDNSIP {target} is not the loopback address; interlock only sends DNS to the proxy's own listener"),
        ));
    }
    Ok(Some(DnsCapture {
        port: dns_port,
        only_to: vec![target],
        proxy_exempt: false,
        conntrack_zones: false,
    }))
}

fn uid(s: &str) -> Option<u32> {
    s.parse::<u32>().ok().filter(|u| *u != 0)
}

fn port(n: u64) -> Option<u16> {
    u16::try_from(n).ok().filter(|p| *p != 0)
}

/// A port list as iptables reads each item of it: `N` or `N:M`.
fn port_list(field: &str, items: &[String], raw: &str) -> Result<Vec<u16>, SpecError> {
    let mut out = Vec::new();
    for item in items {
        let (lo, hi) = item.split_once(':').unwrap_or((item, item));
        match (lo.parse::<u16>(), hi.parse::<u16>()) {
            (Ok(lo), Ok(hi)) if lo <= hi && lo != 0 => out.extend(lo..=hi),
            _ => {
                return Err(invalid(
                    keys::REDIRECT_TRAFFIC_CONFIG,
                    raw,
                    format!("{field}: {item:?} is not a port (1-65535) or a range (8000:8100)"),
                ))
            }
        }
    }
    super::check_ports_size(keys::REDIRECT_TRAFFIC_CONFIG, raw, &out)?;
    Ok(out)
}

/// consul's `iptables.Config` as Go decodes it from JSON.
#[derive(Debug, Default)]
struct Config {
    consul_dns_ip: String,
    consul_dns_port: u64,
    proxy_user_id: String,
    proxy_inbound_port: u64,
    proxy_outbound_port: u64,
    exclude_inbound_ports: Vec<String>,
    exclude_outbound_ports: Vec<String>,
    exclude_outbound_cidrs: Vec<String>,
    exclude_uids: Vec<String>,
}

impl Config {
    fn parse(raw: &str) -> Result<Config, SpecError> {
        let bad = |reason: String| invalid(keys::REDIRECT_TRAFFIC_CONFIG, raw, reason);
        let value: Value = serde_json::from_str(raw).map_err(|e| bad(format!("not JSON: {e}")))?;
        let Value::Object(map) = value else {
            return Err(bad("not a JSON object".into()));
        };
        let field = |name: &str| lookup(&map, name);
        let string = |name: &str| -> Result<String, SpecError> {
            match field(name) {
                None | Some(Value::Null) => Ok(String::new()),
                Some(Value::String(s)) => Ok(s.clone()),
                Some(other) => Err(bad(format!("{name} must be a string, not {other}"))),
            }
        };
        let number = |name: &str| -> Result<u64, SpecError> {
            match field(name) {
                None | Some(Value::Null) => Ok(0),
                Some(Value::Number(n)) => n
                    .as_u64()
                    .ok_or_else(|| bad(format!("{name} must be a non-negative integer"))),
                Some(other) => Err(bad(format!("{name} must be a number, not {other}"))),
            }
        };
        let strings = |name: &str| -> Result<Vec<String>, SpecError> {
            match field(name) {
                None | Some(Value::Null) => Ok(Vec::new()),
                Some(Value::Array(items)) => items
                    .iter()
                    .map(|i| match i {
                        Value::String(s) => Ok(s.clone()),
                        other => Err(bad(format!("{name} must list strings, not {other}"))),
                    })
                    .collect(),
                Some(other) => Err(bad(format!(
                    "{name} must be a list of strings, not {other}"
                ))),
            }
        };
        if let Some(p) = field("IptablesProvider").filter(|v| !v.is_null()) {
            return Err(bad(format!("IptablesProvider must be null, not {p}")));
        }
        Ok(Config {
            consul_dns_ip: string("ConsulDNSIP")?,
            consul_dns_port: number("ConsulDNSPort")?,
            proxy_user_id: string("ProxyUserID")?,
            proxy_inbound_port: number("ProxyInboundPort")?,
            proxy_outbound_port: number("ProxyOutboundPort")?,
            exclude_inbound_ports: strings("ExcludeInboundPorts")?,
            exclude_outbound_ports: strings("ExcludeOutboundPorts")?,
            exclude_outbound_cidrs: strings("ExcludeOutboundCIDRs")?,
            exclude_uids: strings("ExcludeUIDs")?,
        })
    }
}

/// Go's `encoding/json` field matching: the exact name, else any key equal to it without
/// regard to case.
fn lookup<'a>(map: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    map.get(name).or_else(|| {
        map.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;
    use crate::spec::{Landing, OutboundFlow, PortSelection, Transport};
    use interlock_contract::profile::ProfileName;
    use ipnet::IpNet;

    /// What consul-k8s's injector writes for a default pod (its webhook's
    /// `iptablesConfigJSON`, control-plane/connect-inject/webhook/redirect_traffic.go).
    const DEFAULT_CONFIG: &str = r#"{"ConsulDNSIP":"","ConsulDNSPort":0,"ProxyUserID":"5995","ProxyInboundPort":20000,"ProxyOutboundPort":15001,"ExcludeInboundPorts":null,"ExcludeOutboundPorts":null,"ExcludeOutboundCIDRs":null,"ExcludeUIDs":["5996"],"NetNS":"","IptablesProvider":null}"#;

    fn pod(config: &str, dual: &str) -> Vec<(&'static str, String)> {
        vec![
            (keys::CONNECT_INJECT_STATUS, "injected".into()),
            (keys::TRANSPARENT_PROXY_STATUS, "enabled".into()),
            (keys::REDIRECT_TRAFFIC_CONFIG, config.into()),
            (keys::DUAL_STACK, dual.into()),
        ]
    }

    fn run(
        pairs: &[(&'static str, String)],
    ) -> Result<Option<(ProfileName, RedirectSpec)>, SpecError> {
        let p: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        decide(&p, None)
    }

    fn spec(config: &str, dual: &str) -> RedirectSpec {
        let (p, s) = run(&pod(config, dual)).unwrap().expect("meshed");
        assert_eq!(p, ProfileName::Consul);
        s
    }

    fn out(
        s: &RedirectSpec,
        uid: u32,
        out_if: &str,
        dst: &str,
        t: Transport,
        port: u16,
    ) -> Landing {
        s.outbound(&OutboundFlow {
            uid,
            gid: uid,
            out_if,
            src: None,
            dst: dst.parse().unwrap(),
            transport: t,
            port,
        })
    }

    #[test]
    fn the_injectors_default_config() {
        let s = spec(DEFAULT_CONFIG, "false");
        assert_eq!((s.proxy_uid, s.proxy_gid), (5995, None));
        assert_eq!(s.exempt_uids, vec![5996]);
        assert_eq!(
            (s.inbound.proxy_port, s.outbound.proxy_port),
            (20000, 15001)
        );
        assert_eq!(s.inbound.include_ports, PortSelection::All);
        assert!(!s.loopback.app_bypass);
        assert!(s.dns.is_none());
        // No lo rule: an app's call to its own pod IP or 127.0.0.2 is captured; 127.0.0.1 is not.
        assert_eq!(
            out(&s, 1000, "lo", "10.1.0.5", Transport::Tcp, 8080),
            Landing::Outbound
        );
        assert_eq!(
            out(&s, 1000, "lo", "127.0.0.2", Transport::Tcp, 8080),
            Landing::Outbound
        );
        assert_eq!(
            out(&s, 1000, "lo", "127.0.0.1", Transport::Tcp, 8080),
            Landing::Passes
        );
        assert_eq!(
            out(&s, 5995, "eth0", "10.2.0.1", Transport::Tcp, 80),
            Landing::Passes
        );
        assert_eq!(
            out(&s, 5996, "eth0", "10.2.0.1", Transport::Tcp, 80),
            Landing::Passes
        );
        assert_eq!(
            out(&s, 1000, "eth0", "10.2.0.1", Transport::Tcp, 80),
            Landing::Outbound
        );
    }

    /// consul's sdk/iptables test configurations ("exclude … is set", "Consul DNS IP and
    /// port provided") and the webhook's annotations.
    #[test]
    fn exclusions_and_dns() {
        let s = spec(
            r#"{"ProxyUserID":"123","ProxyInboundPort":20000,"ProxyOutboundPort":21000,
                "ExcludeInboundPorts":["22000","22500:22510"],"ExcludeOutboundPorts":["3306"],
                "ExcludeOutboundCIDRs":["1.1.1.1","2.2.2.2/24"],"ExcludeUIDs":["456","789"],
                "ConsulDNSIP":"127.0.0.1","ConsulDNSPort":8600}"#,
            "false",
        );
        assert_eq!(s.outbound.proxy_port, 21000);
        assert_eq!(s.inbound.exclude_ports.len(), 12);
        let n = |s: &str| s.parse::<IpNet>().unwrap();
        assert_eq!(
            s.outbound.exclude_cidrs,
            vec![n("1.1.1.1/32"), n("2.2.2.0/24")]
        );
        assert_eq!(s.exempt_uids, vec![456, 789]);
        let dns = s.dns.clone().unwrap();
        assert_eq!((dns.port, dns.proxy_exempt), (8600, false));
        assert_eq!(
            out(&s, 123, "lo", "127.0.0.1", Transport::Udp, 53),
            Landing::Dns
        );
        assert_eq!(
            out(&s, 1000, "lo", "127.0.0.1", Transport::Tcp, 53),
            Landing::Dns
        );
        assert_eq!(
            out(&s, 1000, "eth0", "10.96.0.10", Transport::Udp, 53),
            Landing::Passes
        );
        assert_eq!(
            out(&s, 1000, "eth0", "10.96.0.10", Transport::Tcp, 53),
            Landing::Outbound
        );
        // Dual stack: DNS on the IPv6 side, to ::1.
        let s = spec(
            r#"{"ProxyUserID":"5995","ProxyInboundPort":20000,"ConsulDNSIP":"::1","ConsulDNSPort":8600}"#,
            "true",
        );
        assert_eq!(s.outbound.proxy_port, 15001);
        assert_eq!(out(&s, 1000, "lo", "::1", Transport::Udp, 53), Landing::Dns);
        assert_eq!(
            out(&s, 1000, "lo", "127.0.0.1", Transport::Udp, 53),
            Landing::Passes
        );
        let s = spec(
            r#"{"ProxyUserID":"5995","ProxyInboundPort":20000,"ConsulDNSPort":8600}"#,
            "true",
        );
        assert_eq!(
            s.dns.unwrap().only_to,
            vec!["::1".parse::<IpAddr>().unwrap()]
        );
        // Go matches field names without regard to case.
        let s = spec(r#"{"proxyuserid":"77","PROXYINBOUNDPORT":20001}"#, "false");
        assert_eq!((s.proxy_uid, s.inbound.proxy_port), (77, 20001));
    }

    #[test]
    fn which_pods_and_which_failures() {
        assert_eq!(
            run(&[(keys::CONNECT_INJECT_STATUS, "injected".into())]).unwrap(),
            None
        );
        let mut p = pod(DEFAULT_CONFIG, "false");
        p[1].1 = String::new();
        assert_eq!(run(&p).unwrap(), None);
        let mut p = pod(DEFAULT_CONFIG, "false");
        p[0].0 = keys::MESH_INJECT_STATUS;
        assert!(run(&p).unwrap().is_some());
        let missing = |drop: &str| {
            let p: Vec<_> = pod(DEFAULT_CONFIG, "false")
                .into_iter()
                .filter(|(k, _)| *k != drop)
                .collect();
            run(&p).unwrap_err()
        };
        assert_names(
            &missing(keys::REDIRECT_TRAFFIC_CONFIG),
            keys::REDIRECT_TRAFFIC_CONFIG,
            "missing",
        );
        assert_names(&missing(keys::DUAL_STACK), keys::DUAL_STACK, "missing");
        for (cfg, why) in [
            ("nope", "not JSON"),
            ("[]", "object"),
            (r#"{"ProxyInboundPort":20000}"#, "ProxyUserID is required"),
            (r#"{"ProxyUserID":"5995"}"#, "ProxyInboundPort is required"),
            (r#"{"ProxyUserID":"envoy","ProxyInboundPort":1}"#, "numeric"),
            (r#"{"ProxyUserID":"0","ProxyInboundPort":1}"#, "numeric"),
            (
                r#"{"ProxyUserID":"1","ProxyInboundPort":"20000"}"#,
                "must be a number",
            ),
            (
                r#"{"ProxyUserID":"1","ProxyInboundPort":1,"ExcludeInboundPorts":["http"]}"#,
                "ExcludeInboundPorts",
            ),
            (
                r#"{"ProxyUserID":"1","ProxyInboundPort":1,"ExcludeOutboundCIDRs":["example.com"]}"#,
                "ExcludeOutboundCIDRs",
            ),
            (
                r#"{"ProxyUserID":"1","ProxyInboundPort":1,"ConsulDNSIP":"::1","ConsulDNSPort":8600}"#,
                "IPv4",
            ),
            (
                r#"{"ProxyUserID":"1","ProxyInboundPort":1,"IptablesProvider":{}}"#,
                "IptablesProvider",
            ),
        ] {
            let e = run(&pod(cfg, "false")).unwrap_err();
            assert!(e.to_string().contains(why), "{cfg}: {e}");
        }
        for cfg in [
            r#"{"ProxyUserID":"1","ProxyInboundPort":1,"ConsulDNSIP":"10.0.34.16"}"#,
            r#"{"ProxyUserID":"1","ProxyInboundPort":1,"ConsulDNSIP":"10.0.34.16","ConsulDNSPort":53}"#,
        ] {
            let e = run(&pod(cfg, "false")).unwrap_err();
            assert!(matches!(e, SpecError::Unsupported { .. }), "{cfg}: {e}");
        }
    }
}

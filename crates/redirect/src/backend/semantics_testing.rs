//! Test support: random specs over every setting of the model, and the port a landing
//! means, for the tests that hold each backend's rules to [`crate::spec`]'s semantics.

use crate::spec::{
    DnsCapture, InboundCapture, Landing, Loopback, OutboundCapture, PortSelection, ProxyToInbound,
    RedirectSpec,
};
use ipnet::IpNet;
use proptest::prelude::*;

pub fn ports() -> impl Strategy<Value = Vec<u16>> {
    proptest::collection::vec(prop_oneof![1u16..12, Just(53), Just(15008)], 0..4)
}

pub fn selection() -> impl Strategy<Value = PortSelection> {
    prop_oneof![
        Just(PortSelection::All),
        ports().prop_map(PortSelection::Only)
    ]
}

pub fn nets() -> impl Strategy<Value = Vec<IpNet>> {
    let pool: Vec<IpNet> = [
        "10.0.0.0/8",
        "10.1.0.0/16",
        "10.1.2.3/32",
        "127.0.0.0/8",
        "fd00::/8",
        "fd00:1::/32",
        "0.0.0.0/0",
        "::/0",
    ]
    .iter()
    .map(|s| s.parse().unwrap())
    .collect();
    proptest::sample::subsequence(pool, 0..3)
}

pub fn loopback() -> impl Strategy<Value = Loopback> {
    (any::<bool>(), any::<bool>(), any::<bool>()).prop_map(|(bypass, hairpin, pass)| Loopback {
        app_bypass: bypass,
        proxy_to_inbound: hairpin.then(|| ProxyToInbound {
            skip_ports: vec![15008],
        }),
        passthrough_source: pass,
    })
}

pub fn dns() -> impl Strategy<Value = Option<DnsCapture>> {
    prop_oneof![
        Just(None),
        Just(Some(DnsCapture {
            port: 15053,
            only_to: vec![],
            proxy_exempt: true,
            conntrack_zones: true,
        })),
        Just(Some(DnsCapture {
            port: 8600,
            only_to: vec!["127.0.0.1".parse().unwrap()],
            proxy_exempt: false,
            conntrack_zones: false,
        })),
    ]
}

pub fn spec() -> impl Strategy<Value = RedirectSpec> {
    (
        (
            1u32..4,
            proptest::option::of(1u32..4),
            proptest::collection::vec(1u32..6, 0..2),
            any::<bool>(),
            any::<bool>(),
        ),
        (selection(), ports(), selection(), ports(), ports()),
        (
            nets(),
            nets(),
            nets(),
            proptest::sample::subsequence(vec!["eth1", "net1"], 0..2),
        ),
        (loopback(), dns()),
    )
        .prop_filter_map(
            "one family",
            |(
                (uid, gid, exempt, v4, v6),
                (ii, ie, oi, oe, any_dst),
                (inc, exc, src, ifs),
                (lo, dns),
            )| {
                (v4 || v6).then(|| RedirectSpec {
                    proxy_uid: uid,
                    proxy_gid: gid,
                    exempt_uids: exempt,
                    inbound: InboundCapture {
                        proxy_port: 15006,
                        include_ports: ii,
                        exclude_ports: ie,
                        exclude_sources: src,
                    },
                    outbound: OutboundCapture {
                        proxy_port: 15001,
                        include_ports: oi,
                        exclude_ports: oe,
                        include_cidrs: inc,
                        exclude_cidrs: exc,
                        any_destination_ports: any_dst,
                    },
                    loopback: lo,
                    dns,
                    drop_invalid: false,
                    exclude_interfaces: ifs.into_iter().map(String::from).collect(),
                    ipv4: v4,
                    ipv6: v6,
                })
            },
        )
}

/// The port a flow with this landing is redirected to, `None` when it passes.
pub fn landing_port(spec: &RedirectSpec, l: Landing) -> Option<u16> {
    match l {
        Landing::Passes => None,
        Landing::Outbound => Some(spec.outbound.proxy_port),
        Landing::Inbound => Some(spec.inbound.proxy_port),
        Landing::Dns => Some(spec.dns.as_ref().expect("a DNS landing needs DNS").port),
    }
}

//! A comparison case: one pod configuration, the rules its mesh writes for it (per family,
//! with the upstream file they come from), the pod as interlock sees it — all from
//! `interlock-mesh-cases`, shared with the mesh plugin stand-ins — and the probes
//! generated from all of that.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ipnet::IpNet;

pub use interlock_mesh_cases::{Case, Mesh, MeshRules};

use super::net::{Creds, Proto};
use super::probe::{Dir, Probe, Who};
use super::topology::{gw_ip, on_link, pod_ip};

/// What a rule set names: ports, networks, UIDs and GIDs.
#[derive(Debug, Default)]
struct Named {
    ports: BTreeSet<u16>,
    dst_nets: BTreeSet<IpNet>,
    src_nets: BTreeSet<IpNet>,
    uids: BTreeSet<u32>,
    gids: BTreeSet<u32>,
}

fn ports_of(spec: &str, out: &mut BTreeSet<u16>) {
    for item in spec.split(',') {
        let mut ends = item.split(':').filter_map(|p| p.parse::<u16>().ok());
        if let Some(lo) = ends.next() {
            out.insert(lo);
            if let Some(hi) = ends.next() {
                out.insert(hi);
                if hi > lo + 1 {
                    out.insert(lo + (hi - lo) / 2);
                }
                out.insert(hi.saturating_add(1));
            }
        }
    }
}

fn net_of(s: &str) -> Option<IpNet> {
    s.parse::<IpNet>()
        .ok()
        .or_else(|| s.parse::<IpAddr>().ok().map(IpNet::from))
}

/// Reads the ports, networks and owners a restore file names.
fn named(rules: &str) -> Named {
    let mut n = Named::default();
    for line in rules
        .lines()
        .filter(|l| l.starts_with("-A ") || l.starts_with("-I "))
    {
        let words: Vec<&str> = line.split_whitespace().collect();
        for (i, w) in words.iter().enumerate() {
            let Some(next) = words.get(i + 1) else { break };
            match *w {
                "--dport" | "--dports" | "--destination-port" | "--sport" | "--to-ports"
                | "--to-port" => ports_of(next, &mut n.ports),
                "--to-destination" => {
                    if let Some((_, port)) = next.rsplit_once(':') {
                        ports_of(port, &mut n.ports);
                    }
                    let host = next
                        .rsplit_once(':')
                        .filter(|(h, _)| h.ends_with(']') || !h.contains(':'))
                        .map(|(h, _)| h)
                        .unwrap_or(next);
                    if let Some(net) = net_of(host.trim_matches(|c| c == '[' || c == ']')) {
                        n.dst_nets.insert(net);
                    }
                }
                "-d" => {
                    if let Some(net) = net_of(next) {
                        n.dst_nets.insert(net);
                    }
                }
                "-s" => {
                    if let Some(net) = net_of(next) {
                        n.src_nets.insert(net);
                    }
                }
                "--uid-owner" => {
                    if let Ok(u) = next.parse() {
                        n.uids.insert(u);
                    }
                }
                "--gid-owner" => {
                    if let Ok(g) = next.parse() {
                        n.gids.insert(g);
                    }
                }
                _ => {}
            }
        }
    }
    n
}

/// A host inside `net` (past its middle, so not its first or last address) and one just
/// outside it (none for a /0).
fn hosts_around(net: &IpNet) -> (IpAddr, Option<IpAddr>) {
    match net {
        IpNet::V4(n) => {
            let lo = u32::from(n.network());
            let hi = u32::from(n.broadcast());
            let inside = if n.prefix_len() >= 30 {
                n.addr()
            } else {
                Ipv4Addr::from(lo + (hi - lo) / 2 + 2)
            };
            let outside = hi.checked_add(2).map(Ipv4Addr::from);
            (inside.into(), outside.map(IpAddr::from))
        }
        IpNet::V6(n) => {
            let lo = u128::from(n.network());
            let hi = u128::from(n.broadcast());
            let inside = if n.prefix_len() >= 126 {
                n.addr()
            } else {
                Ipv6Addr::from(lo + (hi - lo) / 2 + 2)
            };
            let outside = hi.checked_add(2).map(Ipv6Addr::from);
            (inside.into(), outside.map(IpAddr::from))
        }
    }
}

/// A documentation address no rule names: a remote service.
pub fn remote(v6: bool) -> IpAddr {
    if v6 {
        "2001:db8::10".parse().unwrap()
    } else {
        "192.0.2.10".parse().unwrap()
    }
}

/// The node address inbound probes come from when no skip-subnet is involved, outside
/// every network the cases name.
pub fn outside_source(v6: bool) -> IpAddr {
    if v6 {
        "2001:db8:ffff::7".parse().unwrap()
    } else {
        "198.51.100.7".parse().unwrap()
    }
}

/// The generic app port.
pub const APP_PORT: u16 = 8080;
/// The app's UID and GID.
pub const APP: Creds = Creds {
    uid: 1000,
    gid: 1000,
};

fn loopback(v6: bool) -> IpAddr {
    if v6 {
        Ipv6Addr::LOCALHOST.into()
    } else {
        Ipv4Addr::LOCALHOST.into()
    }
}

/// Envoy's inbound passthrough source (127.0.0.6 / ::6).
pub fn passthrough_src(v6: bool) -> IpAddr {
    if v6 {
        "::6".parse().unwrap()
    } else {
        "127.0.0.6".parse().unwrap()
    }
}

/// Everything the probes of a case need: the probes, the ports the pod listens on, and the
/// node's extra addresses.
pub struct ProbePlan {
    pub probes: Vec<Probe>,
    pub ports: BTreeSet<u16>,
    pub node_addrs: Vec<IpAddr>,
}

/// The probes of `case` for the families whose mesh rules exist.
pub fn plan(case: &Case) -> ProbePlan {
    let mut probes = BTreeSet::new();
    let mut all_ports = BTreeSet::new();
    let mut node_addrs = BTreeSet::new();
    for v6 in [false, true] {
        let MeshRules::Restore(rules) = case.rules(v6) else {
            continue;
        };
        let named = named(rules);
        let mut ports: BTreeSet<u16> = named.ports.clone();
        ports.insert(APP_PORT);
        ports.extend(case.mesh.special_ports());
        ports.extend(&case.extra_ports);
        ports.remove(&0);
        all_ports.extend(&ports);

        // Who sends.
        let proxy_gid = case.proxy_gid.unwrap_or(case.proxy_uid);
        let mut senders = vec![
            Who {
                role: "root".into(),
                creds: Creds { uid: 0, gid: 0 },
            },
            Who {
                role: "app".into(),
                creds: APP,
            },
            Who {
                role: "proxy".into(),
                creds: Creds {
                    uid: case.proxy_uid,
                    gid: proxy_gid,
                },
            },
            Who {
                role: "proxy-gid".into(),
                creds: Creds {
                    uid: APP.uid,
                    gid: proxy_gid,
                },
            },
        ];
        for &u in named.uids.iter().filter(|u| **u != case.proxy_uid) {
            senders.push(Who {
                role: format!("uid {u}"),
                creds: Creds {
                    uid: u,
                    gid: APP.gid,
                },
            });
        }
        for &g in named.gids.iter().filter(|g| **g != proxy_gid) {
            senders.push(Who {
                role: format!("gid {g}"),
                creds: Creds {
                    uid: APP.uid,
                    gid: g,
                },
            });
        }
        let app_and_proxy: Vec<&Who> = senders
            .iter()
            .filter(|w| w.role == "app" || w.role == "proxy")
            .collect();

        // Where to.
        let lo = loopback(v6);
        let pt = passthrough_src(v6);
        let mut dsts: BTreeSet<IpAddr> = [lo, pt, pod_ip(v6), gw_ip(v6), remote(v6)]
            .into_iter()
            .collect();
        if !v6 {
            dsts.insert("127.1.2.3".parse().unwrap());
        }
        let mut hosts: BTreeSet<IpAddr> = BTreeSet::new();
        // Source networks too: a rule set that mistook an inbound source range for an
        // outbound destination range shows there.
        for net in named.dst_nets.iter().chain(&named.src_nets) {
            let (inside, outside) = hosts_around(net);
            hosts.insert(inside);
            hosts.extend(outside);
            if net.prefix_len() == net.max_prefix_len() {
                hosts.insert(net.addr());
            }
        }
        for h in hosts.into_iter().filter(|h| h.is_ipv6() == v6) {
            // An on-link address other than the pod's and the gateway's has no neighbour.
            if on_link(h) && h != pod_ip(v6) {
                dsts.insert(gw_ip(v6));
            } else {
                dsts.insert(h);
            }
        }

        let mut add = |p: Probe| {
            probes.insert(p);
        };
        // Every sender to every destination at the app port.
        for who in &senders {
            for &d in &dsts {
                add(Probe {
                    dir: Dir::Out,
                    proto: Proto::Tcp,
                    who: who.clone(),
                    src: None,
                    dst: SocketAddr::new(d, APP_PORT),
                });
            }
        }
        // Every sender to a remote, the pod itself and loopback at every port.
        for who in &senders {
            for d in [remote(v6), pod_ip(v6), pt, lo] {
                for &port in &ports {
                    add(Probe {
                        dir: Dir::Out,
                        proto: Proto::Tcp,
                        who: who.clone(),
                        src: None,
                        dst: SocketAddr::new(d, port),
                    });
                }
            }
        }
        // Envoy's inbound passthrough: bound to 127.0.0.6 / ::6, to the pod's own addresses.
        let mut local_dsts = vec![pod_ip(v6), lo];
        if !v6 {
            local_dsts.push("127.1.2.3".parse().unwrap());
        }
        for who in &app_and_proxy {
            for &d in &local_dsts {
                for &port in &ports {
                    add(Probe {
                        dir: Dir::Out,
                        proto: Proto::Tcp,
                        who: (*who).clone(),
                        src: Some(pt),
                        dst: SocketAddr::new(d, port),
                    });
                }
            }
        }
        // DNS (UDP and TCP) and UDP to another port, to the node, loopback, a remote and
        // every host the rules name exactly (DNS servers).
        let mut udp_dsts: BTreeSet<IpAddr> = [gw_ip(v6), lo, remote(v6)].into_iter().collect();
        for net in named.dst_nets.iter().filter(|n| n.addr().is_ipv6() == v6) {
            if net.prefix_len() == net.max_prefix_len() && !on_link(net.addr()) {
                udp_dsts.insert(net.addr());
            }
        }
        for who in &senders {
            for &d in &udp_dsts {
                for (proto, port) in [(Proto::Udp, 53), (Proto::Udp, APP_PORT), (Proto::Tcp, 53)] {
                    add(Probe {
                        dir: Dir::Out,
                        proto,
                        who: who.clone(),
                        src: None,
                        dst: SocketAddr::new(d, port),
                    });
                }
            }
        }
        // Inbound from the node: from its bridge address, from outside every source
        // network the rules name, and from inside each of them.
        let mut sources: BTreeSet<IpAddr> = [gw_ip(v6), outside_source(v6)].into_iter().collect();
        for net in named
            .src_nets
            .iter()
            .filter(|n| n.addr().is_ipv6() == v6 && !n.addr().is_loopback() && n.addr() != pt)
        {
            let inside = if net.contains(&gw_ip(v6)) {
                gw_ip(v6)
            } else {
                hosts_around(net).0
            };
            sources.insert(inside);
        }
        for &src in &sources {
            if src != gw_ip(v6) {
                node_addrs.insert(src);
            }
            for &port in &ports {
                add(Probe {
                    dir: Dir::In,
                    proto: Proto::Tcp,
                    who: Who {
                        role: "node".into(),
                        creds: Creds { uid: 0, gid: 0 },
                    },
                    src: Some(src),
                    dst: SocketAddr::new(pod_ip(v6), port),
                });
            }
        }
    }
    ProbePlan {
        probes: probes.into_iter().collect(),
        ports: all_ports,
        node_addrs: node_addrs.into_iter().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_name_ports_nets_and_owners() {
        let n = named(
            "-A X -p tcp -m multiport --dports 4190,9000:9010 -j RETURN\n\
             -A X -s 10.0.0.0/8 -j RETURN\n-A X -d 2406:da00::/24 -j RETURN\n\
             -A X -m owner --uid-owner 5996 -j RETURN\n\
             -A Y -d ::1/128 -p udp --dport 53 -j DNAT --to-destination [::1]:8600\n",
        );
        assert!(n
            .ports
            .is_superset(&[4190, 9000, 9005, 9010, 9011, 53, 8600].into()));
        assert!(n.src_nets.contains(&"10.0.0.0/8".parse().unwrap()));
        assert!(n.dst_nets.contains(&"2406:da00::/24".parse().unwrap()));
        assert!(n.dst_nets.contains(&"::1/128".parse().unwrap()));
        assert_eq!(n.uids, [5996].into());
    }

    #[test]
    fn hosts_inside_and_outside() {
        let (i, o) = hosts_around(&"10.0.0.0/8".parse().unwrap());
        assert_eq!(i, "10.128.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(o, Some("11.0.0.1".parse().unwrap()));
        let (i, o) = hosts_around(&"1.1.1.1/32".parse().unwrap());
        assert_eq!(i, "1.1.1.1".parse::<IpAddr>().unwrap());
        assert_eq!(o, Some("1.1.1.3".parse().unwrap()));
        assert_eq!(hosts_around(&"0.0.0.0/0".parse().unwrap()).1, None);
    }
}

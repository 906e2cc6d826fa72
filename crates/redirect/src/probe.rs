//! Proof by traffic: inside the pod's netns, show that outbound connections really land
//! on the proxy's outbound port with the original destination intact.
//!
//! For each enabled family that has outbound capture, [`probe`] listens on the loopback
//! address at the outbound proxy port (where `REDIRECT` delivers locally generated
//! connections), opens a TCP connection as root (UID 0, which every profile captures) to a
//! destination the spec captures, accepts it, and reads `SO_ORIGINAL_DST`
//! (`IP6T_SO_ORIGINAL_DST` for IPv6), which must equal that destination. Both sockets are
//! closed with an RST (`SO_LINGER` 0) and the listener is dropped before returning, so the
//! port is free for the proxy.
//!
//! Traffic safety: the probe socket sends with `IP_TTL` / `IPV6_UNICAST_HOPS` 1, so if the
//! rules are missing or wrong, the SYN can reach the first hop (the node, i.e. the pod's
//! gateway) and no further. Callers pass the pod's gateway addresses as candidates; the
//! probe uses a port the spec captures, preferring the discard port 9 that nothing serves.
//! Only when no candidate is captured does it derive a destination from the spec's include
//! networks or, when every destination is captured but the gateways are excluded, use a
//! documentation address (192.0.2.1, 2001:db8::1); either is still limited to one hop by
//! the TTL.
//!
//! Must run on a thread inside the pod's netns ([`crate::netns::in_netns`]); the outbound
//! proxy port must be free there (true during CNI ADD, before any container starts).
//!
//! # Limit: the first hop must be the node
//!
//! "One hop" means "stays on the node" only when the pod's first hop is the node: a veth
//! pair of the `bridge`, `ptp` or similar primary plugins, whose other end is in the node's
//! netns. With a macvlan or ipvlan primary the pod's interface talks to the physical
//! network directly, and the TTL-1 SYN reaches the external router before it dies; the
//! same holds for a physical device (SR-IOV VF) moved into the pod, and for a tunnel
//! device inside the pod (its outer packet gets a fresh TTL). Before sending anything,
//! [`probe_one`] therefore looks up (rtnetlink, in the pod's netns) the interface the
//! target is routed through and refuses, failing closed with
//! [`ProbeError::LeavesNode`], when it is a macvlan, macvtap, ipvlan or ipvtap link
//! ([`crate::route::BYPASSING_KINDS`]). Physical devices and tunnels are not detected:
//! do not mesh pods whose primary interface is one.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, TcpListener};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::sys::socket::{
    connect, getsockname, getsockopt, setsockopt, socket, sockopt, AddressFamily, SockFlag,
    SockType, SockaddrIn, SockaddrIn6, SockaddrStorage,
};
use nix::sys::time::{TimeVal, TimeValLike};

use crate::spec::{Family, PortSelection, RedirectSpec};

/// Default time a probe waits for its connection to arrive.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(500);

/// Ports tried first as probe destination ports: services nobody runs (discard, tcpmux, echo).
const PREFERRED_PORTS: [u16; 3] = [9, 1, 7];

/// What the probe proved for one family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeResult {
    /// Family probed.
    pub family: Family,
    /// Destination the probe connected to.
    pub target: SocketAddr,
    /// Where the connection landed (the proxy's outbound port on loopback).
    pub landed_on: SocketAddr,
    /// `SO_ORIGINAL_DST` of the accepted connection (equal to `target`).
    pub original_dst: SocketAddr,
    /// How long the round took.
    pub elapsed: Duration,
}

/// The probe's outcome for every enabled family.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeReport {
    /// Families proven redirected.
    pub proven: Vec<ProbeResult>,
    /// Families not probed because the spec captures nothing outbound for them, with why.
    pub skipped: Vec<(Family, String)>,
}

/// Why the proof failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The spec captures outbound traffic of `family` but no destination to probe exists.
    #[error("no {family} probe destination: {reason}")]
    NoTarget {
        /// Family.
        family: Family,
        /// Why none of the candidates fits.
        reason: String,
    },
    /// The proxy's outbound port cannot be bound (already in use in the pod's netns?).
    #[error("cannot listen on {addr} for the probe (is the proxy port already in use in the pod's netns?): {source}")]
    Bind {
        /// Address.
        addr: SocketAddr,
        /// Why.
        source: io::Error,
    },
    /// The target is routed through an interface whose traffic bypasses the node
    /// (macvlan/ipvlan): an unredirected probe packet could leave the node, so the probe
    /// refuses to send it.
    #[error("refusing to probe {target}: it is routed through {}, a {} link whose packets go straight to the external network (the probe's one-hop limit keeps it on the node only when the pod's first hop is the node, e.g. a veth of the bridge or ptp plugin); interlock cannot prove the redirection of pods with a {} primary interface", .via.name, .via.kind, .via.kind)]
    LeavesNode {
        /// Destination that would have been probed.
        target: SocketAddr,
        /// The egress interface in the pod's netns and its link kind.
        via: Box<crate::route::Egress>,
    },
    /// A socket operation failed.
    #[error("probe {step} for {target}: {source}")]
    Socket {
        /// Which step (socket, connect, accept, getsockopt).
        step: &'static str,
        /// Destination being probed.
        target: SocketAddr,
        /// Why.
        source: io::Error,
    },
    /// The connection did not arrive at the proxy port: outbound capture is not working.
    #[error("a connection to {target} did not arrive at the proxy's outbound port {port}: {detail}; the outbound redirection is not effective")]
    NotRedirected {
        /// Destination probed.
        target: SocketAddr,
        /// Outbound proxy port.
        port: u16,
        /// What happened instead.
        detail: String,
    },
    /// The connection arrived but with another original destination.
    #[error("a connection to {target} arrived at the proxy with original destination {got}")]
    WrongOriginalDst {
        /// Destination probed.
        target: SocketAddr,
        /// What `SO_ORIGINAL_DST` said.
        got: SocketAddr,
    },
}

/// Picks the destination for `family`: a captured (candidate, port), else a destination
/// derived from the include networks. `Ok(None)` when the family has no outbound capture.
pub fn choose_target(
    spec: &RedirectSpec,
    family: Family,
    candidates: &[IpAddr],
) -> Result<Option<SocketAddr>, ProbeError> {
    let ports = candidate_ports(spec);
    let include = spec.include_cidrs(family);
    let captures_nothing =
        ports.is_empty() || (!spec.outbound.include_cidrs.is_empty() && include.is_empty());
    if !spec.families().contains(&family) || captures_nothing {
        return Ok(None);
    }
    let captured = |ip: IpAddr| {
        ports
            .iter()
            .find(|&&p| spec.captures_outbound(0, 0, "", ip, p))
            .map(|&p| SocketAddr::new(ip, p))
    };
    if let Some(t) = candidates
        .iter()
        .filter(|ip| Family::of(ip) == family)
        .find_map(|&ip| captured(ip))
    {
        return Ok(Some(t));
    }
    // Derive one from the include networks: the first address after the network address.
    for net in &include {
        let ip = match net.hosts().next() {
            Some(ip) => ip,
            None => net.network(),
        };
        if let Some(t) = captured(ip) {
            return Ok(Some(t));
        }
    }
    // Every destination is selected but the gateways are excluded: use a documentation
    // address (RFC 5737 / RFC 3849), routed by the default route, never served by anyone,
    // and still stopped at the first hop by the TTL if the rules do not catch it.
    if spec.outbound.include_cidrs.is_empty() {
        let docs: &[IpAddr] = match family {
            Family::V4 => &[
                IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
                IpAddr::V4(Ipv4Addr::new(198, 51, 100, 1)),
                IpAddr::V4(Ipv4Addr::new(203, 0, 113, 1)),
            ],
            Family::V6 => &[IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1))],
        };
        if let Some(t) = docs.iter().find_map(|&ip| captured(ip)) {
            return Ok(Some(t));
        }
    }
    Err(ProbeError::NoTarget {
        family,
        reason: format!(
            "none of the candidates {candidates:?} (the pod's gateways) is captured by the spec, and no include network yields one; pass a captured address"
        ),
    })
}

/// Destination ports the spec captures, in preference order (at most a handful).
fn candidate_ports(spec: &RedirectSpec) -> Vec<u16> {
    let ok = |p: &u16| !spec.outbound.exclude_ports.contains(p);
    match &spec.outbound.include_ports {
        PortSelection::Only(list) => list.iter().copied().filter(ok).take(4).collect(),
        PortSelection::All => PREFERRED_PORTS
            .iter()
            .copied()
            .chain(10..=u16::MAX)
            .filter(ok)
            .take(4)
            .collect(),
    }
}

/// The gateways of the default routes of the calling thread's netns (IPv4 from
/// `/proc/thread-self/net/route`, IPv6 from `.../ipv6_route`), i.e. the node as seen from
/// the pod. Empty when there is none or the files cannot be read.
pub fn default_gateways() -> Vec<IpAddr> {
    let mut out = Vec::new();
    if let Ok(text) = std::fs::read_to_string("/proc/thread-self/net/route") {
        out.extend(parse_route_v4(&text));
    }
    if let Ok(text) = std::fs::read_to_string("/proc/thread-self/net/ipv6_route") {
        out.extend(parse_route_v6(&text));
    }
    out
}

fn parse_route_v4(text: &str) -> Vec<IpAddr> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // Iface Destination Gateway Flags RefCnt Use Metric Mask ...
            if f.len() < 8 || f[1] != "00000000" || f[7] != "00000000" {
                return None;
            }
            let gw = u32::from_str_radix(f[2], 16).ok().filter(|g| *g != 0)?;
            // The kernel prints the network-order word in host order.
            Some(IpAddr::V4(Ipv4Addr::from(gw.to_ne_bytes())))
        })
        .collect()
}

fn parse_route_v6(text: &str) -> Vec<IpAddr> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // dest plen src plen nexthop metric refcnt use flags iface
            if f.len() < 10 || f[1] != "00" || f[0].bytes().any(|b| b != b'0') {
                return None;
            }
            let hop = u128::from_str_radix(f[4], 16).ok().filter(|h| *h != 0)?;
            Some(IpAddr::V6(Ipv6Addr::from(hop)))
        })
        .collect()
}

/// Runs the probe for every family `spec` enables (see the module docs). Call inside the
/// pod's netns. `candidates` (the pod's gateways from the CNI result) are tried first,
/// then the gateways of the netns's default routes ([`default_gateways`]).
pub fn probe(
    spec: &RedirectSpec,
    candidates: &[IpAddr],
    timeout: Duration,
) -> Result<ProbeReport, ProbeError> {
    let mut candidates = candidates.to_vec();
    // Reading /proc/thread-self/net/* from inside the pod's netns is not free: the proc
    // dentries it creates make the plugin's exit measurably slower. Only look at the routes
    // when the caller gave no candidate for a family.
    let uncovered = spec
        .families()
        .iter()
        .any(|f| !candidates.iter().any(|ip| Family::of(ip) == *f));
    if uncovered {
        for gw in default_gateways() {
            if !candidates.contains(&gw) {
                candidates.push(gw);
            }
        }
    }
    let candidates = &candidates[..];
    let mut report = ProbeReport::default();
    for family in spec.families() {
        match choose_target(spec, family, candidates)? {
            None => report.skipped.push((
                family,
                "the spec captures no outbound traffic of this family".into(),
            )),
            Some(target) => {
                report
                    .proven
                    .push(probe_one(spec.outbound.proxy_port, target, timeout)?)
            }
        }
    }
    Ok(report)
}

/// Probes one destination: refuse a target routed through a macvlan/ipvlan link, listen on
/// loopback at `proxy_port`, connect to `target` with a hop limit of 1, accept, compare
/// `SO_ORIGINAL_DST`.
pub fn probe_one(
    proxy_port: u16,
    target: SocketAddr,
    timeout: Duration,
) -> Result<ProbeResult, ProbeError> {
    let start = Instant::now();
    // Never send a packet that could leave the node (see "Limit" in the module docs).
    match crate::route::egress(target.ip()) {
        Ok(Some(e)) if e.bypasses_node() => {
            return Err(ProbeError::LeavesNode {
                target,
                via: Box::new(e),
            })
        }
        Ok(_) => {}
        Err(source) => {
            return Err(ProbeError::Socket {
                step: "route lookup",
                target,
                source,
            })
        }
    }
    let family = Family::of(&target.ip());
    let listen_addr = match family {
        Family::V4 => SocketAddr::new(Ipv4Addr::LOCALHOST.into(), proxy_port),
        Family::V6 => SocketAddr::new(Ipv6Addr::LOCALHOST.into(), proxy_port),
    };
    let listener = TcpListener::bind(listen_addr).map_err(|source| ProbeError::Bind {
        addr: listen_addr,
        source,
    })?;
    let sock_err = |step: &'static str| {
        move |e: nix::Error| ProbeError::Socket {
            step,
            target,
            source: io::Error::from(e),
        }
    };
    // accept() honours SO_RCVTIMEO: wait in short slices, checking the client in between.
    setsockopt(
        &listener,
        sockopt::ReceiveTimeout,
        &TimeVal::milliseconds(5),
    )
    .map_err(sock_err("setsockopt SO_RCVTIMEO"))?;

    let client = connect_hop_limited(target).map_err(|source| ProbeError::Socket {
        step: "connect",
        target,
        source,
    })?;
    let client_local = local_addr(&client).map_err(sock_err("getsockname"))?;

    let deadline = start + timeout;
    let accepted = loop {
        match listener.accept() {
            Ok((stream, peer)) if peer == client_local => break stream,
            Ok(_) => continue, // not ours (cannot normally happen: the port was free)
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(source) => {
                return Err(ProbeError::Socket {
                    step: "accept",
                    target,
                    source,
                })
            }
        }
        let pending =
            getsockopt(&client, sockopt::SocketError).map_err(sock_err("getsockopt SO_ERROR"))?;
        if pending != 0 {
            return Err(ProbeError::NotRedirected {
                target,
                port: proxy_port,
                detail: format!(
                    "the connection failed with \"{}\" (it went to the network instead)",
                    io::Error::from_raw_os_error(pending)
                ),
            });
        }
        if Instant::now() >= deadline {
            return Err(ProbeError::NotRedirected {
                target,
                port: proxy_port,
                detail: format!(
                    "nothing arrived within {timeout:?} (are the rules there, and is lo up?)"
                ),
            });
        }
    };
    let original_dst = original_dst(&accepted, family).map_err(|source| ProbeError::Socket {
        step: "getsockopt SO_ORIGINAL_DST",
        target,
        source,
    })?;
    let landed_on = accepted.local_addr().unwrap_or(listen_addr);
    // Close with RST on both ends: no TIME_WAIT left on the proxy's port.
    let rst = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    let _ = setsockopt(&accepted, sockopt::Linger, &rst);
    let _ = setsockopt(&client, sockopt::Linger, &rst);
    drop(accepted);
    drop(client);
    drop(listener);
    if original_dst != target {
        return Err(ProbeError::WrongOriginalDst {
            target,
            got: original_dst,
        });
    }
    Ok(ProbeResult {
        family,
        target,
        landed_on,
        original_dst,
        elapsed: start.elapsed(),
    })
}

/// A non-blocking TCP socket with a hop limit of 1, connecting to `target`.
fn connect_hop_limited(target: SocketAddr) -> io::Result<OwnedFd> {
    let flags = SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC;
    let fd = match target {
        SocketAddr::V4(a) => {
            let fd = socket(AddressFamily::Inet, SockType::Stream, flags, None)?;
            setsockopt(&fd, sockopt::Ipv4Ttl, &1)?;
            start_connect(&fd, &SockaddrIn::from(a))?;
            fd
        }
        SocketAddr::V6(a) => {
            let fd = socket(AddressFamily::Inet6, SockType::Stream, flags, None)?;
            setsockopt(&fd, sockopt::Ipv6Ttl, &1)?;
            start_connect(&fd, &SockaddrIn6::from(a))?;
            fd
        }
    };
    Ok(fd)
}

fn start_connect(fd: &OwnedFd, addr: &dyn nix::sys::socket::SockaddrLike) -> io::Result<()> {
    match connect(fd.as_raw_fd(), addr) {
        Ok(()) | Err(nix::Error::EINPROGRESS) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn local_addr(fd: &OwnedFd) -> nix::Result<SocketAddr> {
    let ss: SockaddrStorage = getsockname(fd.as_raw_fd())?;
    if let Some(a) = ss.as_sockaddr_in() {
        Ok(SocketAddr::V4(SocketAddrV4::new(a.ip(), a.port())))
    } else if let Some(a) = ss.as_sockaddr_in6() {
        Ok(SocketAddr::V6(SocketAddrV6::new(
            a.ip(),
            a.port(),
            a.flowinfo(),
            a.scope_id(),
        )))
    } else {
        Err(nix::Error::EAFNOSUPPORT)
    }
}

/// The destination a redirected connection was originally sent to (`SO_ORIGINAL_DST`,
/// or `IP6T_SO_ORIGINAL_DST` for IPv6), read from an accepted socket.
pub fn original_dst(accepted: &impl AsFd, family: Family) -> io::Result<SocketAddr> {
    match family {
        Family::V4 => {
            let sa = getsockopt(accepted, sockopt::OriginalDst)?;
            Ok(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr)),
                u16::from_be(sa.sin_port),
            )))
        }
        Family::V6 => {
            let sa = getsockopt(accepted, sockopt::Ip6tOriginalDst)?;
            Ok(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sa.sin6_addr.s6_addr),
                u16::from_be(sa.sin6_port),
                0,
                0,
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::tests::istio_like;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn parses_default_routes() {
        let v4 =
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
eth0\t00000000\t0101630A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
eth0\t0001630A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";
        if cfg!(target_endian = "little") {
            assert_eq!(parse_route_v4(v4), vec![ip("10.99.1.1")]);
        }
        let v6 = "00000000000000000000000000000000 00 00000000000000000000000000000000 00 fd990001000000000000000000000001 00000400 00000001 00000000 00000003     eth0\n\
fd990001000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0\n";
        assert_eq!(parse_route_v6(v6), vec![ip("fd99:1::1")]);
    }

    #[test]
    fn prefers_gateway_on_discard_port() {
        let s = istio_like();
        let t = choose_target(&s, Family::V4, &[ip("fd99::1"), ip("10.99.0.1")]).unwrap();
        assert_eq!(t, Some("10.99.0.1:9".parse().unwrap()));
        let t = choose_target(&s, Family::V6, &[ip("fd99::1"), ip("10.99.0.1")]).unwrap();
        assert_eq!(t, Some("[fd99::1]:9".parse().unwrap()));
    }

    #[test]
    fn respects_port_and_cidr_selection() {
        let mut s = istio_like();
        s.outbound.exclude_ports = vec![9, 1];
        assert_eq!(
            choose_target(&s, Family::V4, &[ip("10.99.0.1")]).unwrap(),
            Some("10.99.0.1:7".parse().unwrap())
        );
        s.outbound.include_ports = PortSelection::Only(vec![1, 443]);
        assert_eq!(
            choose_target(&s, Family::V4, &[ip("10.99.0.1")]).unwrap(),
            Some("10.99.0.1:443".parse().unwrap())
        );
        // Gateway excluded: derive from the include network instead.
        s.outbound.exclude_cidrs = vec!["10.99.0.0/24".parse().unwrap()];
        s.outbound.include_cidrs = vec!["10.96.0.0/12".parse().unwrap()];
        assert_eq!(
            choose_target(&s, Family::V4, &[ip("10.99.0.1")]).unwrap(),
            Some("10.96.0.1:443".parse().unwrap())
        );
        // No IPv6 include network: IPv6 has no outbound capture, nothing to prove.
        assert_eq!(
            choose_target(&s, Family::V6, &[ip("fd99::1")]).unwrap(),
            None
        );
        // Gateway excluded, every destination selected: a documentation address.
        s.outbound.include_cidrs.clear();
        assert_eq!(
            choose_target(&s, Family::V4, &[ip("10.99.0.1")]).unwrap(),
            Some("192.0.2.1:443".parse().unwrap())
        );
        s.outbound.exclude_cidrs.push("0.0.0.0/0".parse().unwrap());
        assert!(matches!(
            choose_target(&s, Family::V4, &[ip("10.99.0.1")]),
            Err(ProbeError::NoTarget { .. })
        ));
        s.outbound.include_ports = PortSelection::Only(vec![]);
        assert_eq!(
            choose_target(&s, Family::V4, &[ip("10.99.0.1")]).unwrap(),
            None
        );
    }
}

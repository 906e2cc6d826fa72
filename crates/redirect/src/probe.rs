//! Proof by traffic: inside the pod's netns, show for **each address family** that no
//! outbound TCP connection of that family can leave the pod without passing the proxy.
//!
//! # What is proven, per family
//!
//! The rules are always programmed for both families (one nf_tables transaction, or one
//! `iptables-restore` and one `ip6tables-restore`) and read back before the probe runs.
//! The probe then looks at the pod's routes ([`crate::route::routes`], every table) and
//! decides, purely ([`plan`]), what a real connection must show:
//!
//! 1. **The family reaches something beyond link-local** (a default route, or an on-link
//!    prefix): [`Plan::Connect`]. It listens on the loopback address at the outbound proxy
//!    port (where `REDIRECT` delivers locally generated connections), opens a TCP
//!    connection as root (UID 0, which every profile captures) to a destination the spec
//!    captures, accepts it, and reads `SO_ORIGINAL_DST` (`IP6T_SO_ORIGINAL_DST`), which
//!    must equal that destination. Destinations, in order: the pod's gateways from the CNI
//!    result, the gateways of its default routes, the first host of its on-link prefixes,
//!    the first host of the spec's include networks, and a documentation address
//!    (192.0.2.1, 2001:db8::1) when a default route exists. A destination whose route
//!    leaves through an excluded interface is passed over.
//! 2. **IPv6 whose only routes are link-local** (`fe80::/64` on the pod's interfaces, as on
//!    every veth of an IPv4-only primary): [`Plan::LinkLocal`]. A redirected link-local
//!    connection can never reach the proxy: its socket is bound to the interface by the
//!    scope id, and `::1` cannot be routed through that interface, so the kernel drops the
//!    redirected SYN inside the netns (counted as `Ip6OutNoRoutes`). The probe sends one
//!    such connection and requires exactly that: `connect` accepted (a route exists) and
//!    `Ip6OutNoRoutes` grew. Without the rules the SYN is handed to the interface instead
//!    and the counter does not move, so the probe fails closed. Apps in a meshed pod thus
//!    cannot open TCP connections to link-local addresses (as with Istio's sidecar);
//!    inbound link-local connections are redirected to the inbound port normally.
//! 3. **The family has no route at all** (no address, IPv6 disabled): [`Plan::NoRoute`].
//!    Every TCP connection needs a route — `connect` fails with "network unreachable"
//!    before any packet is built, and an incoming SYN cannot be answered. The probe makes
//!    one real attempt to a documentation address and requires exactly that failure. The
//!    rules are installed for the family anyway, so an address added later is captured.
//! 4. **Nothing of the family is captured**, by the spec (`excludeOutboundIPRanges:
//!    0.0.0.0/0`, every port excluded, an include list without that family) or because
//!    every route of the family leaves through an excluded interface
//!    (`excludeInterfaces: eth0`): [`Plan::NotCaptured`], nothing to prove; the report
//!    says why.
//!
//! A family the pod can route but the spec does not program is an error
//! ([`ProbeError::NotProgrammed`]): that family would bypass the proxy.
//!
//! IPv6 probe connections are sent from `::1`. The rules never match on the source
//! address, so this proves the same capture an app's socket gets; it works while the
//! pod's own addresses are still in duplicate address detection (the primary plugin often
//! returns before it ends), and a SYN with a loopback source that escaped anyway is dropped
//! by every receiver (RFC 4291 §2.5.3).
//!
//! Both sockets are closed with an RST (`SO_LINGER` 0) and the listener is dropped before
//! returning, so the port is free for the proxy.
//!
//! # When a running proxy owns the port
//!
//! During CNI ADD no container of the pod runs, so the probe binds the proxy's outbound
//! port itself ([`ProxyPort::Free`]). The agent's in-place repair proves the rules of a
//! pod that is running, whose proxy usually listens on that port already; binding it
//! fails with `EADDRINUSE`. With [`ProxyPort::MaybeTaken`] (feature `sockdiag`) the probe
//! then leaves the listener alone: it opens the same connection (as root, whom every
//! profile captures) and looks, with sock_diag inside the netns, for the connection's
//! server side: a TCP socket on the proxy's port whose peer is the probe's own address
//! ([`crate::sockdiag::accepted_from`]). While the probe's socket holds its ephemeral
//! port no other connection can have that peer, and without the redirect the server
//! side would be on the destination, outside the netns: so that socket shows the
//! connection to the destination was delivered to the proxy's port. Reading rules back
//! is not such a proof; with no server-side socket the probe fails, and the repair
//! escalates.
//!
//! The proxy handles the probe connection as any other: Istio's and Linkerd's proxies
//! dial its original destination (as the proxy's UID, which is exempt, with a normal hop
//! limit). So with a running proxy the probe only sends to the pod's **gateways** (from
//! the CNI result or the routes), on the same never-served ports: the gateway is the node
//! (the probe refuses links whose first hop is not, see below), which answers the
//! proxy's onward SYN with a reset, and nothing leaves the node. A documentation address
//! or another on-link host is never used then, and a pod without a captured gateway
//! fails the probe ([`ProbeError::NoTarget`]).
//!
//! Traffic safety: the probe socket sends with `IP_TTL` / `IPV6_UNICAST_HOPS` 1, so if the
//! rules are missing or wrong, the SYN can reach the first hop (the node, i.e. the pod's
//! gateway) and no further; the probe uses a port the spec captures, preferring the
//! discard port 9 that nothing serves.
//!
//! Must run on a thread inside the pod's netns ([`crate::netns::in_netns`]); with
//! [`ProxyPort::Free`] the outbound proxy port must be free there (true during CNI ADD,
//! before any container starts).
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

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, TcpListener};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use ipnet::IpNet;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{
    bind, connect, getsockname, getsockopt, listen, setsockopt, socket, sockopt, AddressFamily,
    Backlog, SockFlag, SockType, SockaddrIn, SockaddrIn6, SockaddrStorage,
};

use crate::route::{Link, Route, Rtnetlink};
use crate::spec::{Family, PortSelection, RedirectSpec};

/// Default time a probe waits for its connection to arrive.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(500);

/// Ports tried first as probe destination ports: services nobody runs (discard, tcpmux, echo).
const PREFERRED_PORTS: [u16; 3] = [9, 1, 7];

/// What the probe proved for one family by a connection that landed on the proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeResult {
    /// Family probed.
    pub family: Family,
    /// Destination the probe connected to.
    pub target: SocketAddr,
    /// Where the connection landed (the proxy's outbound port on loopback).
    pub landed_on: SocketAddr,
    /// The original destination of the delivered connection (equal to `target`):
    /// `SO_ORIGINAL_DST` of the accepted socket ([`Evidence::OriginalDst`]), or, when a
    /// running proxy owns the port ([`Evidence::ServerSocket`]), the destination of the
    /// connection whose server side was found on the port.
    pub original_dst: SocketAddr,
    /// How the delivery was seen.
    pub evidence: Evidence,
    /// How long the round took.
    pub elapsed: Duration,
}

/// How the probe saw its connection arrive at the proxy's outbound port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evidence {
    /// The probe listened on the port, accepted the connection and read
    /// `SO_ORIGINAL_DST`.
    OriginalDst,
    /// A running proxy listens on the port: sock_diag showed the connection's server
    /// side on it, owned by `uid` (see the module docs).
    ServerSocket {
        /// Owner of the server-side socket (the listener's owner: the proxy's UID).
        uid: u32,
    },
}

/// Who may own the proxy's outbound port while the probe runs (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ProxyPort {
    /// No container of the pod runs (CNI ADD): the probe binds the port itself, and a
    /// busy port is an error ([`ProbeError::Bind`]).
    #[default]
    Free,
    /// The pod runs (the agent's in-place repair): its proxy may listen on the port.
    /// The probe binds the port when it is free, else it proves the delivery with
    /// sock_diag, sending only to the pod's gateways. (A proxy that starts during the
    /// probe's bind, at most the probe's timeout, fails to bind and is restarted by its
    /// kubelet.)
    #[cfg(feature = "sockdiag")]
    MaybeTaken,
}

/// The probe's outcome for both families.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeReport {
    /// Families whose connections were proven to land on the proxy ([`Plan::Connect`]).
    pub proven: Vec<ProbeResult>,
    /// Families proven to have no unredirected path another way ([`Plan::LinkLocal`],
    /// [`Plan::NoRoute`]), with what the attempt showed.
    pub sealed: Vec<(Family, String)>,
    /// Families with nothing captured outbound ([`Plan::NotCaptured`]), with why.
    pub skipped: Vec<(Family, String)>,
    /// Of the sealed families, those with no route at all ([`Plan::NoRoute`]): nothing
    /// of theirs can leave the pod now, which says nothing about the rules.
    pub unroutable: Vec<Family>,
}

impl ProbeReport {
    /// Whether some family's outcome depended on the redirect rules: a connection landed
    /// on the proxy, or a link-local one was dropped by the redirect. A report of only
    /// unroutable and uncaptured families proves nothing about the rules.
    pub fn shows_redirection(&self) -> bool {
        !self.proven.is_empty() || self.sealed.len() > self.unroutable.len()
    }

    /// One line per family, for logs and state.
    pub fn lines(&self) -> Vec<String> {
        let mut out: Vec<(Family, String)> = self
            .proven
            .iter()
            .map(|r| {
                let line = match r.evidence {
                    Evidence::OriginalDst => format!(
                        "connection to {} landed on {} with original destination {}",
                        r.target, r.landed_on, r.original_dst
                    ),
                    Evidence::ServerSocket { uid } => format!(
                        "connection to {} landed on the running proxy's listener at {} (its server side, socket of UID {uid}, seen with sock_diag)",
                        r.target, r.landed_on
                    ),
                };
                (r.family, line)
            })
            .chain(self.sealed.iter().cloned())
            .chain(
                self.skipped
                    .iter()
                    .map(|(f, why)| (*f, format!("not probed: {why}"))),
            )
            .collect();
        out.sort_by_key(|(f, _)| *f);
        out.into_iter().map(|(f, l)| format!("{f}: {l}")).collect()
    }
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
    /// The pod can route `family` but the spec does not program it: that family's
    /// traffic would bypass the proxy.
    #[error("the pod's network namespace routes {family} ({routes}) but the redirect spec does not program {family}: its {family} traffic would bypass the proxy")]
    NotProgrammed {
        /// Family.
        family: Family,
        /// The routes, for the message.
        routes: String,
    },
    /// The routes or links of the pod's netns cannot be read.
    #[error("reading the routes of the pod's network namespace: {source}")]
    Routes {
        /// Why.
        source: io::Error,
    },
    /// The proxy's outbound port cannot be bound (already in use in the pod's netns? no
    /// loopback address, `lo` being down?).
    #[error("cannot listen on {addr} for the probe (is the proxy port already in use in the pod's netns, or is its loopback interface down?): {source}")]
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
    /// A family the routes said was unreachable was routed after all.
    #[error("{family} has no route in the pod's network namespace, yet a connection to {target} was accepted by the kernel (did a route appear during the probe?)")]
    UnexpectedRoute {
        /// Family.
        family: Family,
        /// Destination tried.
        target: SocketAddr,
    },
}

/// What the probe must show for one family (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Connect to the first of these destinations whose route does not leave through an
    /// excluded interface; the connection must land on the proxy's outbound port.
    Connect(Vec<SocketAddr>),
    /// IPv6 routed only link-locally: a connection to `target` (scope id = the interface)
    /// must be captured and dropped inside the netns.
    LinkLocal {
        /// Destination, on the interface of the pod's first link-local route.
        target: SocketAddrV6,
        /// That interface.
        via: crate::route::Egress,
    },
    /// No route of the family: a connection attempt to `target` must fail with "network
    /// unreachable" before any packet exists.
    NoRoute {
        /// A documentation address of the family.
        target: SocketAddr,
    },
    /// Nothing of the family is captured outbound; why.
    NotCaptured(String),
}

fn documentation_addresses(family: Family) -> &'static [IpAddr] {
    const V4: [IpAddr; 3] = [
        IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
        IpAddr::V4(Ipv4Addr::new(198, 51, 100, 1)),
        IpAddr::V4(Ipv4Addr::new(203, 0, 113, 1)),
    ];
    const V6: [IpAddr; 1] = [IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1))];
    match family {
        Family::V4 => &V4,
        Family::V6 => &V6,
    }
}

fn is_link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V6(a) => (a.segments()[0] & 0xffc0) == 0xfe80,
        IpAddr::V4(_) => false,
    }
}

fn family_of_net(net: &IpNet) -> Family {
    Family::of_net(net)
}

/// The first address after the network address (never IPv6's subnet-router anycast
/// address `prefix::`, which a router answers); the address itself for a host route.
fn first_host(net: &IpNet) -> IpAddr {
    let n = net.trunc();
    match n {
        IpNet::V4(v) if v.prefix_len() < 32 => {
            IpAddr::V4(Ipv4Addr::from(u32::from(v.network()).saturating_add(1)))
        }
        IpNet::V6(v) if v.prefix_len() < 128 => {
            IpAddr::V6(Ipv6Addr::from(u128::from(v.network()).saturating_add(1)))
        }
        other => other.addr(),
    }
}

/// Decides what the probe must show for `family` (pure; see the module docs).
/// `gateways` are the pod's gateways from the CNI result; `routes` and `links` are what
/// the pod's netns has ([`crate::route::routes`], [`crate::route::links`]).
pub fn plan(
    spec: &RedirectSpec,
    family: Family,
    gateways: &[IpAddr],
    routes: &[Route],
    links: &[Link],
) -> Result<Plan, ProbeError> {
    let names: BTreeMap<u32, &str> = links.iter().map(|l| (l.index, l.name.as_str())).collect();
    let name_of = |r: &Route| names.get(&r.oif).copied().unwrap_or("");
    let usable: Vec<&Route> = routes
        .iter()
        .filter(|r| r.is_unicast() && family_of_net(&r.dst) == family && name_of(r) != "lo")
        .collect();
    let describe = |rs: &[&Route]| {
        rs.iter()
            .map(|r| {
                let via = r.gateway.map(|g| format!(" via {g}")).unwrap_or_default();
                format!("{}{via} dev {}", r.dst, name_of(r))
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    if !spec.families().contains(&family) {
        if usable.is_empty() {
            return Ok(Plan::NoRoute {
                target: SocketAddr::new(documentation_addresses(family)[0], PREFERRED_PORTS[0]),
            });
        }
        return Err(ProbeError::NotProgrammed {
            family,
            routes: describe(&usable),
        });
    }
    if let Some(why) = spec.outbound_capture_gap(family) {
        return Ok(Plan::NotCaptured(why));
    }
    let excluded = |r: &&Route| spec.exclude_interfaces.iter().any(|i| i == name_of(r));
    let (via_excluded, routed): (Vec<&Route>, Vec<&Route>) =
        usable.iter().copied().partition(excluded);
    let ports = candidate_ports(spec);
    // A destination on the pod itself (a loopback address, or one of its own) leaves
    // through lo, which the spec may treat apart.
    let own: Vec<IpAddr> = routes
        .iter()
        .filter(|r| r.is_local())
        .map(|r| r.dst.addr())
        .collect();
    let captured = |ip: IpAddr| {
        let out_if = if ip.is_loopback() || own.contains(&ip) {
            "lo"
        } else {
            ""
        };
        captured_target(spec, &ports, out_if, ip)
    };
    if routed.is_empty() {
        if !via_excluded.is_empty() {
            return Ok(Plan::NotCaptured(format!(
                "every {family} route leaves through an excluded interface ({})",
                describe(&via_excluded)
            )));
        }
        let target = documentation_addresses(family)
            .iter()
            .find_map(|&ip| captured(ip))
            .unwrap_or_else(|| SocketAddr::new(documentation_addresses(family)[0], 9));
        return Ok(Plan::NoRoute { target });
    }
    let beyond_link: Vec<&Route> = routed
        .iter()
        .copied()
        .filter(|r| !is_link_local(r.dst.addr()))
        .collect();
    if beyond_link.is_empty() {
        // Only link-local IPv6 routes (IPv4 link-local 169.254/16 needs no scope and is
        // probed like any destination).
        let r = routed[0];
        let local: Vec<IpAddr> = routes
            .iter()
            .filter(|r| r.is_local())
            .map(|r| r.dst.addr())
            .collect();
        let Some(ip) = (1..=0xffffu16)
            .map(|n| IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, n)))
            .find(|ip| !local.contains(ip))
        else {
            return Err(ProbeError::NoTarget {
                family,
                reason: "every fe80::N address is the pod's own".into(),
            });
        };
        let Some(SocketAddr::V6(t)) = captured(ip) else {
            return Ok(Plan::NotCaptured(format!(
                "the pod routes {family} only link-locally ({}) and the spec excludes link-local destinations",
                describe(&routed)
            )));
        };
        let link = links.iter().find(|l| l.index == r.oif);
        return Ok(Plan::LinkLocal {
            target: SocketAddrV6::new(*t.ip(), t.port(), 0, r.oif),
            via: crate::route::Egress {
                index: r.oif,
                name: name_of(r).to_string(),
                kind: link.map(|l| l.kind.clone()).unwrap_or_default(),
            },
        });
    }
    let mut candidates: Vec<IpAddr> = Vec::new();
    let mut push = |ip: IpAddr| {
        if Family::of(&ip) == family && !is_link_local(ip) && !candidates.contains(&ip) {
            candidates.push(ip);
        }
    };
    gateways.iter().copied().for_each(&mut push);
    for r in &beyond_link {
        if r.dst.prefix_len() == 0 {
            if let Some(g) = r.gateway {
                push(g);
            }
        }
    }
    for r in &beyond_link {
        if r.gateway.is_none() && r.dst.prefix_len() > 0 {
            push(first_host(&r.dst));
        }
    }
    for net in spec.include_cidrs(family) {
        // The first host may be one the spec leaves alone (127.0.0.1 in 127.0.0.0/8).
        let first = first_host(&net);
        push(first);
        if let Some(second) = next_in(first, &net) {
            push(second);
        }
    }
    if beyond_link.iter().any(|r| r.dst.prefix_len() == 0) {
        documentation_addresses(family)
            .iter()
            .copied()
            .for_each(&mut push);
    }
    let targets: Vec<SocketAddr> = candidates.iter().filter_map(|&ip| captured(ip)).collect();
    if targets.is_empty() {
        return Err(ProbeError::NoTarget {
            family,
            reason: format!(
                "the pod routes {family} ({}) but none of the destinations derived from its gateways, routes and the spec's include networks ({}) is captured by the spec",
                describe(&beyond_link),
                candidates
                    .iter()
                    .map(|c| c.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        });
    }
    Ok(Plan::Connect(targets))
}

/// Destination ports the spec captures, in preference order (at most a handful): those
/// captured to any destination count too.
fn candidate_ports(spec: &RedirectSpec) -> Vec<u16> {
    let ok = |p: &u16| !spec.outbound.exclude_ports.contains(p);
    let mut ports: Vec<u16> = match &spec.outbound.include_ports {
        PortSelection::Only(list) => list.iter().copied().filter(ok).take(4).collect(),
        PortSelection::All => PREFERRED_PORTS
            .iter()
            .copied()
            .chain(10..=u16::MAX)
            .filter(ok)
            .take(4)
            .collect(),
    };
    for p in spec
        .outbound
        .any_destination_ports
        .iter()
        .copied()
        .filter(ok)
        .take(4)
    {
        if !ports.contains(&p) {
            ports.push(p);
        }
    }
    ports
}

/// Runs the probe for both families (see the module docs) with the proxy's port free
/// ([`ProxyPort::Free`]). Call inside the pod's netns. `gateways` (the pod's gateways
/// from the CNI result) are tried first as destinations.
pub fn probe(
    spec: &RedirectSpec,
    gateways: &[IpAddr],
    timeout: Duration,
) -> Result<ProbeReport, ProbeError> {
    probe_with(spec, gateways, timeout, ProxyPort::Free)
}

/// [`probe`], saying whether a running proxy may own its outbound port.
pub fn probe_with(
    spec: &RedirectSpec,
    gateways: &[IpAddr],
    timeout: Duration,
    port: ProxyPort,
) -> Result<ProbeReport, ProbeError> {
    // One socket for every route lookup. The route and link dumps that [`plan`] needs are
    // taken only for a family the gateway shortcut does not settle (the shortcut needs one
    // route lookup per family and one lookup of the link they leave through).
    let mut rtnl = Rtnetlink::open().map_err(|source| ProbeError::Routes { source })?;
    let mut tables: Option<(Vec<Route>, Vec<Link>)> = None;
    // Links met on the way (both families usually leave through the same one).
    let mut met: Vec<Link> = Vec::new();
    let mut report = ProbeReport::default();
    for family in [Family::V4, Family::V6] {
        if let Some(target) = routed_gateway(spec, family, gateways, (&mut rtnl, &mut met))? {
            report.proven.push(land_or_observe(
                spec,
                target,
                &[target],
                (timeout, port),
                (&mut rtnl, &met),
            )?);
            continue;
        }
        let (routes, links) = match &mut tables {
            Some(t) => t,
            None => {
                let dumped = rtnl
                    .routes()
                    .and_then(|r| Ok((r, rtnl.links()?)))
                    .map_err(|source| ProbeError::Routes { source })?;
                tables.insert(dumped)
            }
        };
        let (routes, links) = (&*routes, &*links);
        match plan(spec, family, gateways, routes, links)? {
            Plan::NotCaptured(why) => report.skipped.push((family, why)),
            Plan::Connect(targets) => {
                let harmless = gateway_targets(&targets, gateways, routes);
                report.proven.push(connect_first(
                    spec,
                    family,
                    (&targets, &harmless),
                    (timeout, port),
                    (&mut rtnl, links),
                )?)
            }
            Plan::LinkLocal { target, via } => {
                report.sealed.push((family, seal_link_local(target, via)?))
            }
            Plan::NoRoute { target } => {
                report.sealed.push((family, seal_no_route(family, target)?));
                report.unroutable.push(family);
            }
        }
    }
    Ok(report)
}

/// The targets a running proxy may be made to dial (pure): those whose address is one of
/// the pod's gateways, from the CNI result or its routes — the node, for the pods the
/// probe accepts (see the module docs).
pub fn gateway_targets(
    targets: &[SocketAddr],
    gateways: &[IpAddr],
    routes: &[Route],
) -> Vec<SocketAddr> {
    targets
        .iter()
        .copied()
        .filter(|t| {
            gateways.contains(&t.ip())
                || routes
                    .iter()
                    .any(|r| r.is_unicast() && r.gateway == Some(t.ip()))
        })
        .collect()
}

/// Probes the first target whose route does not leave through an excluded interface;
/// when a running proxy owns the port ([`ProxyPort::MaybeTaken`]), the first such
/// target of `harmless` instead, without binding.
fn connect_first(
    spec: &RedirectSpec,
    family: Family,
    (targets, harmless): (&[SocketAddr], &[SocketAddr]),
    (timeout, port): (Duration, ProxyPort),
    (rtnl, links): (&mut Rtnetlink, &[Link]),
) -> Result<ProbeResult, ProbeError> {
    let mut passed_over = Vec::new();
    for &target in targets {
        match egress_checked(rtnl, links, target)? {
            None => passed_over.push(format!("{target}: no route")),
            Some(e) if spec.exclude_interfaces.contains(&e.name) => {
                passed_over.push(format!("{target}: routed through excluded {}", e.name))
            }
            Some(_) => {
                return land_or_observe(spec, target, harmless, (timeout, port), (rtnl, links))
            }
        }
    }
    Err(ProbeError::NoTarget {
        family,
        reason: format!(
            "every captured destination is unroutable or leaves through an excluded interface ({})",
            passed_over.join("; ")
        ),
    })
}

/// Lands the probe on `target` (its route already checked); when a running proxy owns
/// the port ([`ProxyPort::MaybeTaken`]), observes the first of `harmless` instead.
#[cfg_attr(not(feature = "sockdiag"), allow(unused_variables))]
fn land_or_observe(
    spec: &RedirectSpec,
    target: SocketAddr,
    harmless: &[SocketAddr],
    (timeout, port): (Duration, ProxyPort),
    (rtnl, links): (&mut Rtnetlink, &[Link]),
) -> Result<ProbeResult, ProbeError> {
    let proxy_port = spec.outbound.proxy_port;
    let landed = land(proxy_port, target, timeout);
    #[cfg(feature = "sockdiag")]
    if let Err(ProbeError::Bind { source, .. }) = &landed {
        if port == ProxyPort::MaybeTaken && source.kind() == io::ErrorKind::AddrInUse {
            let family = Family::of(&target.ip());
            return observe_first(spec, family, harmless, timeout, (rtnl, links));
        }
    }
    landed
}

/// The shortcut of [`probe_with`] for `family` (what [`plan`] would pick first, without
/// the route and link dumps): the first of the pod's `gateways` of that family, when the
/// spec captures the family and a port to it, and the kernel routes it out through an
/// interface that is not excluded (nor loopback). `None` sends the family to the full
/// [`plan`]; a route that bypasses the node is refused here as it would be there.
fn routed_gateway(
    spec: &RedirectSpec,
    family: Family,
    gateways: &[IpAddr],
    (rtnl, met): (&mut Rtnetlink, &mut Vec<Link>),
) -> Result<Option<SocketAddr>, ProbeError> {
    if !spec.families().contains(&family) || spec.outbound_capture_gap(family).is_some() {
        return Ok(None);
    }
    let ports = candidate_ports(spec);
    let Some(target) = gateways
        .iter()
        .filter(|&&ip| Family::of(&ip) == family && !is_link_local(ip))
        .find_map(|&ip| captured_target(spec, &ports, "", ip))
    else {
        return Ok(None);
    };
    let egress = egress_checked(rtnl, met, target)?;
    if let Some(e) = &egress {
        if !met.iter().any(|l| l.index == e.index) {
            met.push(Link {
                index: e.index,
                name: e.name.clone(),
                kind: e.kind.clone(),
            });
        }
    }
    Ok(match egress {
        Some(e) if e.name != "lo" && !spec.exclude_interfaces.contains(&e.name) => Some(target),
        _ => None,
    })
}

/// `ip` with the first of `ports` the spec captures outbound to it (from UID 0, leaving
/// through `out_if`), if any.
fn captured_target(
    spec: &RedirectSpec,
    ports: &[u16],
    out_if: &str,
    ip: IpAddr,
) -> Option<SocketAddr> {
    ports
        .iter()
        .find(|&&p| spec.captures_outbound(0, 0, out_if, ip, p))
        .map(|&p| SocketAddr::new(ip, p))
}

/// The address after `ip`, when `net` still holds it.
fn next_in(ip: IpAddr, net: &IpNet) -> Option<IpAddr> {
    let next = match ip {
        IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(u32::from(a).checked_add(1)?)),
        IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(u128::from(a).checked_add(1)?)),
    };
    net.contains(&next).then_some(next)
}

/// [`connect_first`] when a running proxy owns the port: [`observe`] the first of the
/// gateway targets that leaves through a non-excluded interface.
#[cfg(feature = "sockdiag")]
fn observe_first(
    spec: &RedirectSpec,
    family: Family,
    harmless: &[SocketAddr],
    timeout: Duration,
    (rtnl, links): (&mut Rtnetlink, &[Link]),
) -> Result<ProbeResult, ProbeError> {
    for &target in harmless {
        match egress_checked(rtnl, links, target)? {
            Some(e) if !spec.exclude_interfaces.contains(&e.name) => {
                return observe(spec.outbound.proxy_port, target, timeout)
            }
            _ => {}
        }
    }
    Err(ProbeError::NoTarget {
        family,
        reason: format!(
            "the proxy's outbound port {} is taken (a running proxy?) and none of the pod's \
             gateways is a captured, routable destination: a running proxy dials the probe's \
             destination, and only the node (the pod's gateway) is a harmless one",
            spec.outbound.proxy_port
        ),
    })
}

/// The interface `target` leaves through (its link looked up in `links` first), refusing
/// links that bypass the node (see "Limit" in the module docs).
fn egress_checked(
    rtnl: &mut Rtnetlink,
    links: &[Link],
    target: SocketAddr,
) -> Result<Option<crate::route::Egress>, ProbeError> {
    match rtnl.egress(target.ip(), links) {
        Ok(Some(e)) if e.bypasses_node() => Err(ProbeError::LeavesNode {
            target,
            via: Box::new(e),
        }),
        Ok(e) => Ok(e),
        Err(source) => Err(ProbeError::Socket {
            step: "route lookup",
            target,
            source,
        }),
    }
}

/// `Ip6OutNoRoutes` of the calling thread's netns (IPv6 packets dropped for want of a
/// route, including after a NAT rewrote their destination).
fn ip6_out_no_routes() -> io::Result<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/net/snmp6")?;
    text.lines()
        .find_map(|l| l.strip_prefix("Ip6OutNoRoutes"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no Ip6OutNoRoutes in snmp6"))
}

/// [`Plan::LinkLocal`]: one connection from `::1` to `target`; the redirect must have
/// made the kernel drop it inside the netns (see the module docs).
fn seal_link_local(target: SocketAddrV6, via: crate::route::Egress) -> Result<String, ProbeError> {
    let t = SocketAddr::V6(target);
    if via.bypasses_node() {
        return Err(ProbeError::LeavesNode {
            target: t,
            via: Box::new(via),
        });
    }
    let ifname = via.name.as_str();
    let sock_err = |step: &'static str| {
        move |source: io::Error| ProbeError::Socket {
            step,
            target: t,
            source,
        }
    };
    let before = ip6_out_no_routes().map_err(sock_err("read snmp6"))?;
    let client = connect_hop_limited(t).map_err(sock_err("connect"))?;
    let after = ip6_out_no_routes().map_err(sock_err("read snmp6"))?;
    close_with_rst(&client);
    drop(client);
    if after > before {
        Ok(format!(
            "routed only link-locally (via {ifname}): a connection to [{}%{ifname}]:{} was captured and dropped inside the pod (a redirected link-local connection cannot reach the proxy: Ip6OutNoRoutes {before} -> {after}); no IPv6 connection can leave the pod unredirected",
            target.ip(),
            target.port()
        ))
    } else {
        Err(ProbeError::NotRedirected {
            target: t,
            port: 0,
            detail: format!(
                "the link-local connection through {ifname} was handed to the interface instead of being captured (Ip6OutNoRoutes stayed at {after})"
            ),
        })
    }
}

/// [`Plan::NoRoute`]: one connection attempt to `target` must fail for want of a route.
fn seal_no_route(family: Family, target: SocketAddr) -> Result<String, ProbeError> {
    let domain = match family {
        Family::V4 => AddressFamily::Inet,
        Family::V6 => AddressFamily::Inet6,
    };
    let fd = match socket(
        domain,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    ) {
        Ok(fd) => fd,
        Err(nix::Error::EAFNOSUPPORT) => {
            return Ok(format!(
                "{family} is disabled in the kernel: no {family} connection can exist"
            ))
        }
        Err(e) => {
            return Err(ProbeError::Socket {
                step: "socket",
                target,
                source: e.into(),
            })
        }
    };
    let result = match target {
        SocketAddr::V4(a) => start_connect(&fd, &SockaddrIn::from(a)),
        SocketAddr::V6(a) => start_connect(&fd, &SockaddrIn6::from(a)),
    };
    close_with_rst(&fd);
    match result {
        // No route, or (IPv6 disabled on every interface) no address to send from.
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENETUNREACH | libc::EHOSTUNREACH | libc::EADDRNOTAVAIL)
            ) =>
        {
            Ok(format!(
                "no route: a connection attempt to {target} failed with \"{e}\" before any packet was built; no {family} connection can be made or answered"
            ))
        }
        Err(source) => Err(ProbeError::Socket {
            step: "connect",
            target,
            source,
        }),
        Ok(()) => Err(ProbeError::UnexpectedRoute { family, target }),
    }
}

fn close_with_rst(fd: &impl AsFd) {
    let rst = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    let _ = setsockopt(fd, sockopt::Linger, &rst);
}

/// Probes one destination: refuse a target routed through a macvlan/ipvlan link, then
/// [`land`].
pub fn probe_one(
    proxy_port: u16,
    target: SocketAddr,
    timeout: Duration,
) -> Result<ProbeResult, ProbeError> {
    let mut rtnl = Rtnetlink::open().map_err(|source| ProbeError::Socket {
        step: "route lookup",
        target,
        source,
    })?;
    egress_checked(&mut rtnl, &[], target)?;
    drop(rtnl);
    land(proxy_port, target, timeout)
}

/// Listens on loopback at `proxy_port`, connects to `target` with a hop limit of 1 (from
/// `::1` for IPv6), accepts, compares `SO_ORIGINAL_DST`.
fn land(proxy_port: u16, target: SocketAddr, timeout: Duration) -> Result<ProbeResult, ProbeError> {
    let start = Instant::now();
    let family = Family::of(&target.ip());
    let listen_addr = match family {
        Family::V4 => SocketAddr::new(Ipv4Addr::LOCALHOST.into(), proxy_port),
        Family::V6 => SocketAddr::new(Ipv6Addr::LOCALHOST.into(), proxy_port),
    };
    // containerd runs the loopback plugin alongside the chain (go-cni sets networks up
    // in parallel): until it has brought `lo` up, the loopback address does not exist.
    // Wait for it within the probe's time.
    let listener = loop {
        match listen_nonblocking(listen_addr) {
            Ok(l) => break l,
            Err(e) if e.kind() == io::ErrorKind::AddrNotAvailable && start.elapsed() < timeout => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(source) => {
                return Err(ProbeError::Bind {
                    addr: listen_addr,
                    source,
                })
            }
        }
    };
    let sock_err = |step: &'static str| {
        move |e: nix::Error| ProbeError::Socket {
            step,
            target,
            source: io::Error::from(e),
        }
    };

    let client = connect_hop_limited(target).map_err(|source| ProbeError::Socket {
        step: "connect",
        target,
        source,
    })?;
    let client_local = local_addr(&client).map_err(sock_err("getsockname"))?;

    // Over loopback the handshake is done when connect returns, so the first accept
    // normally takes the connection; otherwise wait on the listener in short slices,
    // checking the client in between.
    let deadline = start + timeout;
    let accepted = loop {
        match listener.accept() {
            Ok((stream, peer)) if peer == client_local => break stream,
            Ok(_) => continue, // not ours (cannot normally happen: the port was free)
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
                let _ = poll(&mut fds, PollTimeout::from(5u8));
            }
            Err(source) => {
                return Err(ProbeError::Socket {
                    step: "accept",
                    target,
                    source,
                })
            }
        }
        still_waiting(&client, target, proxy_port, deadline, || {
            format!("nothing arrived within {timeout:?} (are the rules there, and is lo up?)")
        })?;
    };
    let original_dst = original_dst(&accepted, family).map_err(|source| ProbeError::Socket {
        step: "getsockopt SO_ORIGINAL_DST",
        target,
        source,
    })?;
    // The listener is bound to this one address, so every connection it accepts is on it.
    let landed_on = listen_addr;
    // Close the client with RST: the accepted end is reset by it, so neither end is left
    // in TIME_WAIT on the proxy's port (and the accepted end needs no linger of its own).
    close_with_rst(&client);
    drop(client);
    drop(accepted);
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
        evidence: Evidence::OriginalDst,
        elapsed: start.elapsed(),
    })
}

/// Connects to `target` with a hop limit of 1 (from `::1` for IPv6) while a running
/// proxy owns `proxy_port`, and finds the connection's server side on that port with
/// sock_diag (see the module docs). The connection is reset once seen.
#[cfg(feature = "sockdiag")]
fn observe(
    proxy_port: u16,
    target: SocketAddr,
    timeout: Duration,
) -> Result<ProbeResult, ProbeError> {
    use crate::sockdiag;
    let start = Instant::now();
    let family = Family::of(&target.ip());
    let sock_err = |step: &'static str| {
        move |e: nix::Error| ProbeError::Socket {
            step,
            target,
            source: io::Error::from(e),
        }
    };
    let client = connect_hop_limited(target).map_err(|source| ProbeError::Socket {
        step: "connect",
        target,
        source,
    })?;
    let client_local = local_addr(&client).map_err(sock_err("getsockname"))?;
    let deadline = start + timeout;
    let server_side = loop {
        let sockets = sockdiag::tcp_sockets().map_err(|e| ProbeError::Socket {
            step: "sock_diag dump",
            target,
            source: io::Error::other(e.to_string()),
        })?;
        if let Some(s) = sockdiag::accepted_from(&sockets, proxy_port, client_local) {
            break s.clone();
        }
        still_waiting(&client, target, proxy_port, deadline, || {
            format!(
                "no socket on port {proxy_port} had the probe's {client_local} as peer within {timeout:?} (are the rules there, and does the running proxy accept?)"
            )
        })?;
        std::thread::sleep(Duration::from_millis(1));
    };
    close_with_rst(&client);
    drop(client);
    Ok(ProbeResult {
        family,
        target,
        landed_on: server_side.local,
        original_dst: target,
        evidence: Evidence::ServerSocket {
            uid: server_side.uid,
        },
        elapsed: start.elapsed(),
    })
}

/// `Ok` while the probe's connection may still arrive: fails when it failed (it went
/// to the network, which refused it) or `deadline` passed (`nothing` says what did not
/// happen).
fn still_waiting(
    client: &OwnedFd,
    target: SocketAddr,
    proxy_port: u16,
    deadline: Instant,
    nothing: impl FnOnce() -> String,
) -> Result<(), ProbeError> {
    let pending = getsockopt(client, sockopt::SocketError).map_err(|e| ProbeError::Socket {
        step: "getsockopt SO_ERROR",
        target,
        source: e.into(),
    })?;
    let detail = if pending != 0 {
        format!(
            "the connection failed with \"{}\" (it went to the network instead)",
            io::Error::from_raw_os_error(pending)
        )
    } else if Instant::now() >= deadline {
        nothing()
    } else {
        return Ok(());
    };
    Err(ProbeError::NotRedirected {
        target,
        port: proxy_port,
        detail,
    })
}

/// A listening socket on `addr` that does not block in accept (what `TcpListener::bind`
/// does, with `SOCK_NONBLOCK`: no separate `fcntl` or receive timeout).
fn listen_nonblocking(addr: SocketAddr) -> io::Result<TcpListener> {
    let family = match addr {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    };
    let flags = SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC;
    let fd = socket(family, SockType::Stream, flags, None)?;
    setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    bind(fd.as_raw_fd(), &SockaddrStorage::from(addr))?;
    listen(&fd, Backlog::new(128).map_err(io::Error::from)?)?;
    Ok(TcpListener::from(fd))
}

/// A non-blocking TCP socket with a hop limit of 1, connecting to `target`; IPv6 from
/// `[::1]` (see the module docs).
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
            bind(
                fd.as_raw_fd(),
                &SockaddrIn6::from(SocketAddrV6::new(Ipv6Addr::LOCALHOST, 0, 0, 0)),
            )?;
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

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// A route: `dst` (CIDR), optional gateway, interface index (1 lo, 2 eth0, 3 net1).
    fn rt(dst: &str, gw: Option<&str>, oif: u32) -> Route {
        Route {
            dst: dst.parse().unwrap(),
            gateway: gw.map(ip),
            oif,
            table: 254,
            kind: 1,
        }
    }

    fn local(addr: &str) -> Route {
        Route {
            dst: format!("{addr}/{}", if addr.contains(':') { 128 } else { 32 })
                .parse()
                .unwrap(),
            gateway: None,
            oif: 2,
            table: 255,
            kind: 2,
        }
    }

    fn links() -> Vec<Link> {
        ["lo", "eth0", "net1"]
            .iter()
            .enumerate()
            .map(|(i, n)| Link {
                index: i as u32 + 1,
                name: n.to_string(),
                kind: if *n == "lo" { "" } else { "veth" }.to_string(),
            })
            .collect()
    }

    /// What a bridge pod with an IPv4-only primary has: IPv4 routes, and IPv6 only the
    /// link-local prefix of its veth (plus the kernel's local and multicast entries).
    fn v4_only_pod() -> Vec<Route> {
        vec![
            rt("0.0.0.0/0", Some("10.99.0.1"), 2),
            rt("10.99.0.0/24", None, 2),
            local("10.99.0.2"),
            local("fe80::1"),
            rt("fe80::/64", None, 2),
            Route {
                kind: 5,
                table: 255,
                ..rt("ff00::/8", None, 2)
            },
            Route {
                table: 255,
                kind: 2,
                ..rt("::1/128", None, 1)
            },
        ]
    }

    fn plan_of(spec: &RedirectSpec, f: Family, gws: &[&str], routes: &[Route]) -> Plan {
        let gws: Vec<IpAddr> = gws.iter().map(|g| ip(g)).collect();
        plan(spec, f, &gws, routes, &links()).unwrap()
    }

    #[test]
    fn every_family_the_pod_routes_is_planned() {
        let s = istio_like();
        let routes = v4_only_pod();
        // IPv4: the gateway from the CNI result, on the discard port, then the rest.
        let Plan::Connect(t) = plan_of(&s, Family::V4, &["10.99.0.1"], &routes) else {
            panic!()
        };
        assert_eq!(t[0], sa("10.99.0.1:9"));
        assert!(t.contains(&sa("192.0.2.1:9")), "{t:?}");
        // Without the CNI result's gateway, the default route's.
        let Plan::Connect(t) = plan_of(&s, Family::V4, &[], &routes) else {
            panic!()
        };
        assert_eq!(t[0], sa("10.99.0.1:9"));
        // IPv6 routed only link-locally: sealed through eth0, avoiding the pod's own
        // fe80::1.
        match plan_of(&s, Family::V6, &["10.99.0.1"], &routes) {
            Plan::LinkLocal { target, via } => {
                assert_eq!(*target.ip(), "fe80::2".parse::<Ipv6Addr>().unwrap());
                assert_eq!((target.port(), target.scope_id()), (9, 2));
                assert_eq!(via.name, "eth0");
            }
            other => panic!("{other:?}"),
        }
        // A global IPv6 default route the CNI result did not list is probed for real.
        let mut dual = routes.clone();
        dual.push(rt("::/0", Some("fd99::1"), 2));
        let Plan::Connect(t) = plan_of(&s, Family::V6, &[], &dual) else {
            panic!()
        };
        assert_eq!(t[0], sa("[fd99::1]:9"));
        // A link-local default gateway (Calico) is no target; the default route still
        // routes a documentation address.
        let mut calico = routes.clone();
        calico.push(rt("::/0", Some("fe80::ecee:eeff:feee:eeee"), 2));
        let Plan::Connect(t) = plan_of(&s, Family::V6, &[], &calico) else {
            panic!()
        };
        assert_eq!(t, vec![sa("[2001:db8::1]:9")]);
        // An on-link global prefix without a default route: its first host.
        let mut onlink = routes.clone();
        onlink.push(rt("fd98::/64", None, 3));
        let Plan::Connect(t) = plan_of(&s, Family::V6, &[], &onlink) else {
            panic!()
        };
        assert_eq!(t, vec![sa("[fd98::1]:9")]);
    }

    /// istio-cni's `include-exclude-ip` case: only 127.0.0.0/8 is included and 10.0.0.0/8
    /// excluded, so neither the gateway nor 127.0.0.1 is captured; the probe proves
    /// 127.0.0.2, and IPv6 (no included network) has nothing to prove.
    #[test]
    fn a_loopback_include_range_is_proven_on_loopback() {
        let mut s = istio_like();
        s.outbound.include_cidrs = vec!["127.0.0.0/8".parse().unwrap()];
        s.outbound.exclude_cidrs = vec!["10.0.0.0/8".parse().unwrap()];
        s.loopback.app_bypass = false;
        let Plan::Connect(t) = plan_of(&s, Family::V4, &["10.99.0.1"], &v4_only_pod()) else {
            panic!()
        };
        assert_eq!(t, vec![sa("127.0.0.2:9")]);
        assert!(matches!(
            plan_of(&s, Family::V6, &["10.99.0.1"], &v4_only_pod()),
            Plan::NotCaptured(_)
        ));
        // With the apps' loopback traffic passing, no address of the range is captured
        // and the error says which destinations were tried.
        s.loopback.app_bypass = true;
        let e = plan(&s, Family::V4, &[ip("10.99.0.1")], &v4_only_pod(), &links()).unwrap_err();
        assert!(e.to_string().contains("127.0.0.2"), "{e}");
    }

    #[test]
    fn a_family_without_routes_is_sealed_by_a_failed_attempt() {
        let s = istio_like();
        let v6_only = vec![
            rt("::/0", Some("fd99::1"), 2),
            rt("fd99::/64", None, 2),
            rt("fe80::/64", None, 2),
            // lo's IPv4 routes are all in the local table.
            Route {
                table: 255,
                kind: 2,
                ..rt("127.0.0.0/8", None, 1)
            },
        ];
        assert_eq!(
            plan_of(&s, Family::V4, &["fd99::1"], &v6_only),
            Plan::NoRoute {
                target: sa("192.0.2.1:9")
            }
        );
        // A family the spec does not program: fine without routes, an error with them.
        let mut v4_spec = istio_like();
        v4_spec.ipv6 = false;
        assert!(matches!(
            plan_of(&v4_spec, Family::V4, &[], &v6_only),
            Plan::NoRoute { .. }
        ));
        let mut v6_off = istio_like();
        v6_off.ipv6 = false;
        let e = plan(&v6_off, Family::V6, &[], &v6_only, &links()).unwrap_err();
        assert!(matches!(e, ProbeError::NotProgrammed { .. }), "{e}");
        assert!(e.to_string().contains("::/0 via fd99::1 dev eth0"), "{e}");
    }

    #[test]
    fn nothing_captured_means_nothing_to_prove() {
        let routes = v4_only_pod();
        // excludeOutboundIPRanges: 0.0.0.0/0 (and ::/0).
        let mut s = istio_like();
        s.outbound.exclude_cidrs = vec!["0.0.0.0/0".parse().unwrap()];
        assert!(matches!(
            plan_of(&s, Family::V4, &["10.99.0.1"], &routes),
            Plan::NotCaptured(w) if w.contains("0.0.0.0/0")
        ));
        assert!(matches!(
            plan_of(&s, Family::V6, &[], &routes),
            Plan::LinkLocal { .. }
        ));
        // excludeInterfaces: eth0, the only interface: nothing leaves captured.
        let mut s = istio_like();
        s.exclude_interfaces = vec!["eth0".into()];
        for f in [Family::V4, Family::V6] {
            match plan_of(&s, f, &["10.99.0.1"], &routes) {
                Plan::NotCaptured(w) => {
                    assert!(
                        w.contains("excluded interface") && w.contains("eth0"),
                        "{w}"
                    )
                }
                other => panic!("{f}: {other:?}"),
            }
        }
        // Excluded there but routed on net1 too: probed through net1.
        let mut two = routes.clone();
        two.push(rt("10.98.0.0/24", None, 3));
        let Plan::Connect(t) = plan_of(&s, Family::V4, &[], &two) else {
            panic!()
        };
        assert_eq!(t[0], sa("10.98.0.1:9"));
        // Link-local destinations excluded and nothing else routed.
        let mut s = istio_like();
        s.outbound.exclude_cidrs = vec!["fe80::/10".parse().unwrap()];
        assert!(matches!(
            plan_of(&s, Family::V6, &[], &routes),
            Plan::NotCaptured(w) if w.contains("link-local")
        ));
    }

    #[test]
    fn respects_port_and_cidr_selection() {
        let routes = v4_only_pod();
        let mut s = istio_like();
        s.outbound.exclude_ports = vec![9, 1];
        let first = |s: &RedirectSpec| match plan_of(s, Family::V4, &["10.99.0.1"], &routes) {
            Plan::Connect(t) => t[0],
            other => panic!("{other:?}"),
        };
        assert_eq!(first(&s), sa("10.99.0.1:7"));
        s.outbound.include_ports = PortSelection::Only(vec![1, 443]);
        assert_eq!(first(&s), sa("10.99.0.1:443"));
        // Gateway and its subnet excluded: the include network's first host.
        s.outbound.exclude_cidrs = vec!["10.99.0.0/24".parse().unwrap()];
        s.outbound.include_cidrs = vec!["10.96.0.0/12".parse().unwrap()];
        assert_eq!(first(&s), sa("10.96.0.1:443"));
        // No IPv6 include network: IPv6 has no outbound capture, nothing to prove.
        assert!(matches!(
            plan_of(&s, Family::V6, &[], &routes),
            Plan::NotCaptured(_)
        ));
        // Gateway excluded, every destination selected: a documentation address.
        s.outbound.include_cidrs.clear();
        assert_eq!(first(&s), sa("192.0.2.1:443"));
        // Only on-link destinations, all excluded: no target, and the error says why.
        let onlink = vec![rt("10.99.0.0/24", None, 2)];
        let e = plan(&s, Family::V4, &[], &onlink, &links()).unwrap_err();
        assert!(
            matches!(e, ProbeError::NoTarget { .. }) && e.to_string().contains("10.99.0.1"),
            "{e}"
        );
    }

    #[test]
    fn a_running_proxy_is_only_made_to_dial_the_pods_gateways() {
        let s = istio_like();
        let routes = v4_only_pod();
        let Plan::Connect(t) = plan_of(&s, Family::V4, &[], &routes) else {
            panic!()
        };
        // The default route's gateway stays; the documentation address goes (the proxy
        // would dial it through the node to the network).
        assert!(t.contains(&sa("192.0.2.1:9")), "{t:?}");
        assert_eq!(gateway_targets(&t, &[], &routes), vec![sa("10.99.0.1:9")]);
        // A gateway from the CNI result counts as well, a mere on-link host does not.
        let onlink = vec![rt("10.98.0.0/24", None, 2)];
        let Plan::Connect(t) = plan_of(&s, Family::V4, &["10.98.0.254"], &onlink) else {
            panic!()
        };
        assert_eq!(t, vec![sa("10.98.0.254:9"), sa("10.98.0.1:9")]);
        assert_eq!(
            gateway_targets(&t, &[ip("10.98.0.254")], &onlink),
            vec![sa("10.98.0.254:9")]
        );
        assert!(gateway_targets(&t, &[], &onlink).is_empty());
        // Calico's link-local IPv6 gateway is never a target: only the documentation
        // address is, so nothing is left for a running proxy.
        let mut calico = routes.clone();
        calico.push(rt("::/0", Some("fe80::ecee:eeff:feee:eeee"), 2));
        let Plan::Connect(t) = plan_of(&s, Family::V6, &[], &calico) else {
            panic!()
        };
        assert!(gateway_targets(&t, &[], &calico).is_empty(), "{t:?}");
    }

    #[test]
    fn report_lines_name_each_family() {
        let r = ProbeReport {
            proven: vec![ProbeResult {
                family: Family::V4,
                target: sa("10.99.0.1:9"),
                landed_on: sa("127.0.0.1:15001"),
                original_dst: sa("10.99.0.1:9"),
                evidence: Evidence::OriginalDst,
                elapsed: Duration::ZERO,
            }],
            sealed: vec![(Family::V6, "routed only link-locally".into())],
            skipped: vec![],
            unroutable: vec![],
        };
        assert!(r.shows_redirection());
        let nothing = ProbeReport {
            sealed: vec![
                (Family::V4, "no route".into()),
                (Family::V6, "no route".into()),
            ],
            unroutable: vec![Family::V4, Family::V6],
            ..ProbeReport::default()
        };
        assert!(!nothing.shows_redirection());
        let link_local = ProbeReport {
            sealed: vec![
                (Family::V4, "no route".into()),
                (Family::V6, "link-local".into()),
            ],
            unroutable: vec![Family::V4],
            ..ProbeReport::default()
        };
        assert!(link_local.shows_redirection());
        assert_eq!(
            r.lines(),
            [
                "IPv4: connection to 10.99.0.1:9 landed on 127.0.0.1:15001 with original destination 10.99.0.1:9",
                "IPv6: routed only link-locally"
            ]
        );
        let seen = ProbeReport {
            proven: vec![ProbeResult {
                evidence: Evidence::ServerSocket { uid: 1337 },
                ..r.proven[0].clone()
            }],
            ..ProbeReport::default()
        };
        assert_eq!(
            seen.lines(),
            ["IPv4: connection to 10.99.0.1:9 landed on the running proxy's listener at 127.0.0.1:15001 (its server side, socket of UID 1337, seen with sock_diag)"]
        );
    }
}

//! Routes and links of the calling thread's network namespace, over rtnetlink
//! (`RTM_GETROUTE`, `RTM_GETLINK`): which interface a destination is routed through and
//! what kind of link that is ([`egress`]), and every route the namespace has ([`routes`]).
//!
//! The probe uses both (see [`crate::probe`]): [`routes`] tells which address families a
//! pod can reach anything in, and through which interfaces; [`egress`] refuses
//! destinations whose first hop is not the node (a pod whose route leaves through a
//! macvlan or ipvlan interface talks to the physical network directly, so a TTL-1 packet
//! reaches the external router) and names the interface a probe would leave through.
//! [`Rtnetlink`] runs several of these on one socket, and finds an egress link among links
//! it met before instead of asking the kernel again (the probe: one socket, one link
//! lookup for both families).
//!
//! Route lookups run without the RTNL lock; the kernel answers every `RTM_GETLINK`, a
//! lookup or a dump, under it, and fills each link's reply there with
//! every attribute it has, so a node creating or deleting pods (netns teardown, IPv6
//! address set-up on new interfaces) makes link requests wait. A link's kind has no
//! lock-free source either: [`Rtnetlink::link`] asks ethtool for the driver, which takes
//! the lock only to copy two strings. The listing (the full plan's) asks for no
//! statistics (`IFLA_EXT_MASK`).
//! `/sys/class/net` and `/proc/net/*route` cannot answer this cheaply: sysfs shows the
//! netns it was mounted in, and the proc files cost dentries on every read.

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};

use interlock_netlink::message::{
    align, header, NLMSG_DONE, NLMSG_ERROR, NLMSG_HDRLEN, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST,
};
use interlock_netlink::{Messages, Receiver};
use nix::sys::socket::{setsockopt, sockopt, MsgFlags, SockProtocol};
use nix::sys::time::{TimeVal, TimeValLike};

const RTM_NEWLINK: u16 = 16;
const RTM_NEWADDR: u16 = 20;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const IFA_FLAGS: u16 = 8;
const IFA_F_NODAD: u32 = 0x02;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const RTM_GETLINK: u16 = 18;
const RTM_NEWROUTE: u16 = 24;
const RTM_GETROUTE: u16 = 26;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_TABLE: u16 = 15;
const RTA_MULTIPATH: u16 = 9;
const RT_TABLE_LOCAL: u32 = 255;
const RTN_UNICAST: u8 = 1;
const RTN_LOCAL: u8 = 2;
const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_EXT_MASK: u16 = 29;
/// `RTEXT_FILTER_SKIP_STATS`: no counters in a link reply (the kernel fills them for
/// every link while it holds the RTNL lock).
const RTEXT_FILTER_SKIP_STATS: u32 = 1 << 3;
const IFLA_INFO_KIND: u16 = 1;
const NLA_TYPE_MASK: u16 = 0x3fff;

/// Link kinds (`IFLA_INFO_KIND`, and the ethtool driver names of the same links, which
/// for macvtap and ipvtap are `macvlan` and `ipvlan`) whose traffic goes straight to the
/// parent's physical network instead of through the node's stack.
pub const BYPASSING_KINDS: [&str; 4] = ["macvlan", "macvtap", "ipvlan", "ipvtap"];

/// The interface a destination is routed through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Egress {
    /// Interface index.
    pub index: u32,
    /// Interface name.
    pub name: String,
    /// Link kind (`veth`, `macvlan`, …): the ethtool driver name when the link was looked
    /// up by index ([`Rtnetlink::link`]: a physical NIC's driver, a macvtap's `macvlan`),
    /// `IFLA_INFO_KIND` when it came from a listing (empty for a device without one);
    /// empty when the device names neither.
    pub kind: String,
}

impl Egress {
    /// True when the link's traffic bypasses the node ([`BYPASSING_KINDS`]).
    pub fn bypasses_node(&self) -> bool {
        BYPASSING_KINDS.contains(&self.kind.as_str())
    }
}

/// One route of the calling thread's netns, as the kernel lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Destination network (`0.0.0.0/0`, `::/0` for a default route).
    pub dst: ipnet::IpNet,
    /// Next hop, when the route has one (`None`: on-link).
    pub gateway: Option<IpAddr>,
    /// Outgoing interface index (0 when the kernel gave none, e.g. a multipath route).
    pub oif: u32,
    /// Routing table id.
    pub table: u32,
    /// `RTN_*` route type: 1 unicast, 2 local, …
    pub kind: u8,
}

impl Route {
    /// A unicast route in any table but `local`: something can be sent along it.
    pub fn is_unicast(&self) -> bool {
        self.kind == RTN_UNICAST && self.table != RT_TABLE_LOCAL
    }

    /// A local route: `dst` is one of the namespace's own addresses.
    pub fn is_local(&self) -> bool {
        self.kind == RTN_LOCAL
    }
}

/// One network interface of the calling thread's netns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// Interface index.
    pub index: u32,
    /// Interface name.
    pub name: String,
    /// Link kind (`veth`, `macvlan`, …): `IFLA_INFO_KIND` in a listing ([`links`]), the
    /// ethtool driver name from [`Rtnetlink::link`] (see [`Egress::kind`]).
    pub kind: String,
}

/// Every route of both families in every table of the calling thread's netns.
pub fn routes() -> io::Result<Vec<Route>> {
    Rtnetlink::open()?.routes()
}

/// Every interface of the calling thread's netns.
pub fn links() -> io::Result<Vec<Link>> {
    Rtnetlink::open()?.links()
}

/// The egress interface the current netns routes `dst` through. `Ok(None)` when there is
/// no route (nothing could be sent there at all).
pub fn egress(dst: IpAddr) -> io::Result<Option<Egress>> {
    Rtnetlink::open()?.egress(dst, &[])
}

/// An rtnetlink socket of the calling thread's netns, for several requests in a row (the
/// probe's dumps and lookups: one socket instead of one per request).
#[derive(Debug)]
pub struct Rtnetlink {
    fd: OwnedFd,
    rx: Receiver,
    seq: u32,
}

impl Rtnetlink {
    /// Opens the socket in the calling thread's netns.
    pub fn open() -> io::Result<Rtnetlink> {
        let fd = interlock_netlink::socket::open(SockProtocol::NetlinkRoute)
            .map_err(|(_, e)| io::Error::from(e))?;
        setsockopt(&fd, sockopt::ReceiveTimeout, &TimeVal::milliseconds(1000))?;
        Ok(Rtnetlink {
            fd,
            rx: Receiver::new(),
            seq: 0,
        })
    }

    /// [`routes`] on this socket.
    pub fn routes(&mut self) -> io::Result<Vec<Route>> {
        let mut out = Vec::new();
        for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
            let body = [family, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
            for msg in self.exchange(RTM_GETROUTE, NLM_F_DUMP, &body, RTM_NEWROUTE)? {
                if let Some(r) = parse_route(&msg) {
                    out.push(r);
                }
            }
        }
        Ok(out)
    }

    /// [`links`] on this socket.
    pub fn links(&mut self) -> io::Result<Vec<Link>> {
        Ok(self
            .exchange(RTM_GETLINK, NLM_F_DUMP, &link_dump_request(), RTM_NEWLINK)?
            .iter()
            .filter_map(|m| parse_link(m))
            .collect())
    }

    /// The link with interface index `index`, by two ioctls on this socket (it belongs to
    /// the netns): `SIOCGIFNAME` for the name, then ethtool's `ETHTOOL_GDRVINFO` for the
    /// driver, which is the link kind for the kinds the probe asks about (`veth`,
    /// `macvlan`, `ipvlan`; a macvtap or ipvtap link reports the driver it is built on,
    /// `macvlan` or `ipvlan`, refused the same way) and empty for a device that names none
    /// (loopback). `None` when there is no such link.
    ///
    /// Both take less of the kernel than an `RTM_GETLINK`: the name comes under RCU, and
    /// the driver query holds the RTNL lock only to copy two strings, where a link reply is
    /// filled under the lock with every attribute the kernel has (the IPv4 and IPv6
    /// settings among them), even without statistics.
    pub fn link(&mut self, index: u32) -> io::Result<Option<Link>> {
        let Some(name) = ioctl_ifname(&self.fd, index)? else {
            return Ok(None);
        };
        let Some(kind) = ioctl_driver(&self.fd, &name)? else {
            return Ok(None);
        };
        Ok(Some(Link {
            index,
            name: c_string(&name),
            kind,
        }))
    }

    /// [`egress`] on this socket; the link is looked up in `known` (a [`Self::links`]
    /// taken earlier) and asked of the kernel only when it is not there.
    pub fn egress(&mut self, dst: IpAddr, known: &[Link]) -> io::Result<Option<Egress>> {
        let (family, addr) = match dst {
            IpAddr::V4(a) => (libc::AF_INET as u8, a.octets().to_vec()),
            IpAddr::V6(a) => (libc::AF_INET6 as u8, a.octets().to_vec()),
        };
        // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags(u32)
        let mut body = vec![family, (addr.len() * 8) as u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        put_attr(&mut body, RTA_DST, &addr);
        let reply = match self.request(RTM_GETROUTE, &body, RTM_NEWROUTE) {
            Ok(r) => r,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENETUNREACH | libc::EHOSTUNREACH | libc::ESRCH)
                ) =>
            {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        let Some(index) = attrs(reply.get(12..).unwrap_or(&[]))
            .find(|(t, _)| *t == RTA_OIF)
            .and_then(|(_, v)| u32_of(v))
        else {
            return Ok(None);
        };
        let link = match known.iter().find(|l| l.index == index) {
            Some(l) => Some(l.clone()),
            None => self.link(index)?,
        }
        .unwrap_or(Link {
            index,
            name: String::new(),
            kind: String::new(),
        });
        Ok(Some(Egress {
            index,
            name: link.name,
            kind: link.kind,
        }))
    }

    /// Adds `addr`/`prefix` to the interface `index` (no duplicate address detection);
    /// an address that is there already is fine.
    pub fn add_address(&mut self, index: u32, addr: IpAddr, prefix: u8) -> io::Result<()> {
        let (family, bytes) = match addr {
            IpAddr::V4(a) => (libc::AF_INET as u8, a.octets().to_vec()),
            IpAddr::V6(a) => (libc::AF_INET6 as u8, a.octets().to_vec()),
        };
        // struct ifaddrmsg, then IFA_LOCAL, IFA_ADDRESS and IFA_FLAGS (IFA_F_NODAD).
        let mut body = vec![family, prefix, 0, 0];
        body.extend_from_slice(&index.to_ne_bytes());
        for ty in [IFA_LOCAL, IFA_ADDRESS] {
            push_attr(&mut body, ty, &bytes);
        }
        push_attr(&mut body, IFA_FLAGS, &IFA_F_NODAD.to_ne_bytes());
        match self.exchange(
            RTM_NEWADDR,
            NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
            &body,
            NLMSG_ERROR,
        ) {
            Ok(_) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Sends one request and returns the payload (after the netlink header) of the reply
    /// of type `want`; a kernel error becomes an `io::Error` with its errno.
    fn request(&mut self, kind: u16, body: &[u8], want: u16) -> io::Result<Vec<u8>> {
        self.exchange(kind, 0, body, want)?
            .pop()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "empty rtnetlink reply"))
    }

    /// One rtnetlink round: sends the request (a dump when `flags` has `NLM_F_DUMP`),
    /// reads the replies of its sequence number until the first message of type `want`
    /// (a plain request) or `NLMSG_DONE` (a dump).
    fn exchange(
        &mut self,
        kind: u16,
        flags: u16,
        body: &[u8],
        want: u16,
    ) -> io::Result<Vec<Vec<u8>>> {
        let flags = NLM_F_REQUEST | flags;
        let is_dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut msg = Vec::with_capacity(NLMSG_HDRLEN + body.len());
        msg.extend_from_slice(&header(NLMSG_HDRLEN + body.len(), kind, flags, seq));
        msg.extend_from_slice(body);
        interlock_netlink::socket::send(&self.fd, &msg)?;
        let mut out = Vec::new();
        loop {
            let datagram = self.rx.recv(&self.fd, MsgFlags::empty())?;
            for m in Messages::new(&datagram) {
                let m = m.map_err(|_| {
                    io::Error::new(io::ErrorKind::InvalidData, "malformed rtnetlink reply")
                })?;
                if m.seq != seq {
                    continue;
                }
                match m.ty {
                    NLMSG_ERROR => {
                        let errno = m
                            .payload
                            .get(..4)
                            .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                            .unwrap_or(-libc::EIO);
                        if errno == 0 {
                            // The acknowledgement of a request sent with NLM_F_ACK.
                            return Ok(out);
                        }
                        return Err(io::Error::from_raw_os_error(-errno));
                    }
                    NLMSG_DONE => return Ok(out),
                    t if t == want => {
                        out.push(m.payload.to_vec());
                        if !is_dump {
                            return Ok(out);
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}

fn parse_route(msg: &[u8]) -> Option<Route> {
    let head = msg.get(..12)?;
    let (family, dst_len, table8, kind) = (head[0], head[1], head[4], head[7]);
    let addr = |v: &[u8]| -> Option<IpAddr> {
        match (family as i32, v.len()) {
            (libc::AF_INET, 4) => Some(IpAddr::from(<[u8; 4]>::try_from(v).ok()?)),
            (libc::AF_INET6, 16) => Some(IpAddr::from(<[u8; 16]>::try_from(v).ok()?)),
            _ => None,
        }
    };
    let (mut dst, mut gateway, mut oif, mut table) = (None, None, 0u32, u32::from(table8));
    for (t, v) in attrs(&msg[12..]) {
        match t {
            RTA_DST => dst = addr(v),
            RTA_GATEWAY => gateway = addr(v),
            RTA_OIF => oif = u32_of(v).unwrap_or(0),
            RTA_TABLE => table = u32_of(v).unwrap_or(table),
            // struct rtnexthop: len(u16) flags(u8) hops(u8) ifindex(i32), then attributes.
            RTA_MULTIPATH => {
                if let Some(hop) = v.get(..8) {
                    oif = u32_of(&hop[4..8]).unwrap_or(0);
                    let len = usize::from(u16::from_ne_bytes([hop[0], hop[1]]));
                    if let Some(nested) = v.get(8..len.min(v.len())) {
                        if let Some((_, g)) = attrs(nested).find(|(t, _)| *t == RTA_GATEWAY) {
                            gateway = addr(g);
                        }
                    }
                }
            }
            _ => {}
        }
    }
    let dst = dst.unwrap_or(match family as i32 {
        libc::AF_INET => IpAddr::from([0u8; 4]),
        _ => IpAddr::from([0u8; 16]),
    });
    Some(Route {
        dst: ipnet::IpNet::new(dst, dst_len).ok()?,
        gateway,
        oif,
        table,
        kind,
    })
}

/// `struct ethtool_drvinfo` (linux/ethtool.h), for `ETHTOOL_GDRVINFO`.
#[repr(C)]
struct EthtoolDrvinfo {
    cmd: u32,
    driver: [u8; 32],
    version: [u8; 32],
    fw_version: [u8; 32],
    bus_info: [u8; 32],
    erom_version: [u8; 32],
    reserved2: [u8; 12],
    n_priv_flags: u32,
    n_stats: u32,
    testinfo_len: u32,
    eedump_len: u32,
    regdump_len: u32,
}

const ETHTOOL_GDRVINFO: u32 = 3;

/// The name (`IFNAMSIZ` bytes, NUL-padded) of interface `index` in the socket's netns;
/// `None` when there is none.
#[allow(unsafe_code)]
fn ioctl_ifname(fd: &OwnedFd, index: u32) -> io::Result<Option<[u8; libc::IFNAMSIZ]>> {
    // SAFETY: an all-zero ifreq is valid; SIOCGIFNAME reads its index and writes at most
    // IFNAMSIZ bytes of name into it, nothing else.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    ifr.ifr_ifru.ifru_ifindex = index as libc::c_int;
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFNAME as _, &mut ifr) } < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENODEV) => Ok(None),
            _ => Err(e),
        };
    }
    Ok(Some(ifr.ifr_name.map(|c| c as u8)))
}

/// The ethtool driver name of interface `name` in the socket's netns (empty when the
/// device names none); `None` when the interface is gone.
#[allow(unsafe_code)]
fn ioctl_driver(fd: &OwnedFd, name: &[u8; libc::IFNAMSIZ]) -> io::Result<Option<String>> {
    // SAFETY: all-zero ifreq and ethtool_drvinfo are valid; SIOCETHTOOL reads the command
    // from `info` (through ifru_data, which points at it for the whole call) and writes at
    // most size_of::<EthtoolDrvinfo>() bytes back into it.
    let mut info: EthtoolDrvinfo = unsafe { std::mem::zeroed() };
    info.cmd = ETHTOOL_GDRVINFO;
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    ifr.ifr_name = name.map(|b| b as libc::c_char);
    ifr.ifr_ifru.ifru_data = (&mut info as *mut EthtoolDrvinfo).cast();
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCETHTOOL as _, &mut ifr) } < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENODEV) => Ok(None),
            // A device without ethtool driver information (loopback).
            Some(libc::EOPNOTSUPP) => Ok(Some(String::new())),
            _ => Err(e),
        };
    }
    Ok(Some(c_string(&info.driver)))
}

/// The listing's `RTM_GETLINK` body: `struct ifinfomsg` for every interface, then
/// `IFLA_EXT_MASK` asking for no statistics.
fn link_dump_request() -> Vec<u8> {
    let mut body = vec![0u8; 16];
    put_attr(
        &mut body,
        IFLA_EXT_MASK,
        &RTEXT_FILTER_SKIP_STATS.to_ne_bytes(),
    );
    body
}

fn parse_link(msg: &[u8]) -> Option<Link> {
    let index = u32_of(msg.get(4..8)?)?;
    let (mut name, mut kind) = (String::new(), String::new());
    for (t, v) in attrs(msg.get(16..)?) {
        match t {
            IFLA_IFNAME => name = c_string(v),
            IFLA_LINKINFO => {
                if let Some((_, k)) = attrs(v).find(|(t, _)| *t == IFLA_INFO_KIND) {
                    kind = c_string(k);
                }
            }
            _ => {}
        }
    }
    Some(Link { index, name, kind })
}

fn u32_of(v: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(v.get(..4)?.try_into().ok()?))
}

fn put_attr(buf: &mut Vec<u8>, t: u16, value: &[u8]) {
    buf.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
    buf.extend_from_slice(&t.to_ne_bytes());
    buf.extend_from_slice(value);
    buf.resize(align(buf.len()), 0);
}

/// The (type, value) netlink attributes in `data`.
fn attrs(mut data: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if data.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([data[0], data[1]]) as usize;
        let t = u16::from_ne_bytes([data[2], data[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > data.len() {
            return None;
        }
        let value = &data[4..len];
        data = &data[align(len).min(data.len())..];
        Some((t, value))
    })
}

fn c_string(v: &[u8]) -> String {
    let end = v.iter().position(|b| *b == 0).unwrap_or(v.len());
    String::from_utf8_lossy(&v[..end]).into_owned()
}

/// Appends one rtnetlink attribute (type, value, padding to 4 bytes).
fn push_attr(buf: &mut Vec<u8>, ty: u16, value: &[u8]) {
    buf.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(value);
    buf.resize(align(buf.len()), 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_round_trip() {
        let mut b = Vec::new();
        put_attr(&mut b, IFLA_IFNAME, b"eth0\0");
        let mut nested = Vec::new();
        put_attr(&mut nested, IFLA_INFO_KIND, b"macvlan\0");
        put_attr(&mut b, IFLA_LINKINFO | 0x8000, &nested);
        put_attr(&mut b, RTA_OIF, &7u32.to_ne_bytes());
        let got: Vec<(u16, Vec<u8>)> = attrs(&b).map(|(t, v)| (t, v.to_vec())).collect();
        assert_eq!(got.len(), 3);
        assert_eq!(c_string(&got[0].1), "eth0");
        assert_eq!(got[1].0, IFLA_LINKINFO, "NLA_F_NESTED is masked");
        let kind = attrs(&got[1].1).next().unwrap();
        assert_eq!(
            (kind.0, c_string(kind.1)),
            (IFLA_INFO_KIND, "macvlan".into())
        );
        assert_eq!(got[2].1, 7u32.to_ne_bytes());
        // Truncated input ends the iteration instead of panicking.
        assert_eq!(attrs(&b[..b.len() - 2]).count(), 2);
    }

    #[test]
    fn loopback_route_is_found() {
        // Every netns has lo; 127.0.0.1 is routed through it (the local table).
        let e = egress("127.0.0.1".parse().unwrap()).unwrap().unwrap();
        assert_eq!(e.name, "lo");
        assert!(!e.bypasses_node());
    }

    #[test]
    fn one_socket_answers_dumps_and_lookups_in_a_row() {
        let mut rtnl = Rtnetlink::open().unwrap();
        let routes = rtnl.routes().unwrap();
        let links = rtnl.links().unwrap();
        assert!(routes.iter().any(Route::is_local), "{routes:?}");
        assert!(links.iter().any(|l| l.name == "lo"), "{links:?}");
        // The link found among links listed before equals the one listed afresh.
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let from_dump = rtnl.egress(lo, &links).unwrap().unwrap();
        let asked = rtnl.egress(lo, &[]).unwrap().unwrap();
        assert_eq!(from_dump, asked);
        assert_eq!(from_dump, egress(lo).unwrap().unwrap());
        // Later requests on the same socket still get their own replies.
        assert_eq!(rtnl.links().unwrap(), links);
        // One link asked by index has its listed name; where the listing names a kind
        // whose driver has the same name (veth), or none that the driver reports
        // (loopback), the lookup gives the same kind. A missing link is None.
        for l in &links {
            let one = rtnl.link(l.index).unwrap().unwrap();
            assert_eq!((one.index, &one.name), (l.index, &l.name));
            if l.kind == "veth" || l.name == "lo" {
                assert_eq!(one.kind, l.kind, "{l:?}");
            }
        }
        let unused = links.iter().map(|l| l.index).max().unwrap() + 1000;
        assert_eq!(rtnl.link(unused).unwrap(), None);
    }

    #[test]
    fn the_link_listing_asks_for_no_statistics() {
        let all = link_dump_request();
        assert_eq!(all.len(), 24, "ifinfomsg + one u32 attribute");
        assert_eq!(&all[4..8], &[0; 4], "ifi_index 0: every link");
        let (t, v) = attrs(&all[16..]).next().unwrap();
        assert_eq!(
            (t, v),
            (IFLA_EXT_MASK, &RTEXT_FILTER_SKIP_STATS.to_ne_bytes()[..])
        );
    }
}

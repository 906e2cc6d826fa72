//! Ending the connections a pod opened before its redirection was in place.
//!
//! Rules only capture connections that start after them: a connection the app opened
//! while it ran unprotected keeps flowing in plaintext, because conntrack already holds
//! its (un-NATed) tuple. Flushing conntrack is not enough (the peer is left half-open and
//! the flow may keep going), so the in-place repair ends such sockets in the kernel with
//! `SOCK_DESTROY` over sock_diag, like `ss -K`: the app sees `ECONNABORTED` and the peer
//! a reset, and the app's next connection goes through the proxy.
//!
//! sock_diag sees only the network namespace its socket was opened in, so
//! [`end_connections`] must run inside the pod's netns (see [`crate::netns::in_netns`]).
//!
//! What is ended is a pure decision ([`must_end`]): TCP sockets that are established or
//! being established, and connected UDP sockets, that do not belong to the proxy's UID and
//! are not loopback-only. Listening sockets are never touched (the app's `accept()` would
//! fail and it may exit), nor the proxy's own connections, nor loopback traffic between
//! the proxy and the app. After destroying, the sockets are dumped again: one that is
//! still there means the kernel did not end it, and the caller must escalate.

use interlock_netlink::Receiver;
use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_sock_diag::{
    constants::{AF_INET, AF_INET6, IPPROTO_TCP, IPPROTO_UDP},
    inet::{ExtensionFlags, InetRequest, SocketId, StateFlags},
    SockDiagDestroy, SockDiagMessage,
};
use nix::sys::socket::{connect, MsgFlags, NetlinkAddr, SockProtocol};
use std::net::{IpAddr, SocketAddr};

/// TCP states, numbered as the kernel's `TCP_*` (UDP reports 1 when connected, 7 when not).
const TCP_ESTABLISHED: u8 = 1;
const TCP_SYN_SENT: u8 = 2;
const TCP_SYN_RECV: u8 = 3;
const TCP_TIME_WAIT: u8 = 6;
const TCP_CLOSE: u8 = 7;
const TCP_LISTEN: u8 = 10;

/// The transport protocol of a socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

impl Transport {
    fn ipproto(self) -> u8 {
        match self {
            Transport::Tcp => IPPROTO_TCP,
            Transport::Udp => IPPROTO_UDP,
        }
    }
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Transport::Tcp => "tcp",
            Transport::Udp => "udp",
        })
    }
}

/// One socket as sock_diag reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketEntry {
    /// TCP or UDP.
    pub transport: Transport,
    /// The kernel's state number (`TCP_ESTABLISHED` = 1, `TCP_LISTEN` = 10, …).
    pub state: u8,
    /// Local address and port.
    pub local: SocketAddr,
    /// Remote address and port (unspecified for listening or unconnected sockets).
    pub remote: SocketAddr,
    /// Owner UID.
    pub uid: u32,
    /// Socket inode.
    pub inode: u32,
    /// The kernel's cookie: identifies this socket, not a later one with the same tuple.
    pub cookie: [u8; 8],
    /// Bound interface index (0: none).
    pub interface: u32,
    family: u8,
}

impl std::fmt::Display for SocketEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} -> {} (uid {}, state {})",
            self.transport, self.local, self.remote, self.uid, self.state
        )
    }
}

/// Whether a socket opened before the rules must be ended (pure).
///
/// `exempt_uid` is the proxy's UID: its sockets are the mesh's own traffic.
pub fn must_end(s: &SocketEntry, exempt_uid: u32) -> bool {
    let in_play = match s.transport {
        Transport::Tcp => matches!(s.state, TCP_ESTABLISHED | TCP_SYN_SENT | TCP_SYN_RECV),
        // A connected UDP socket reports ESTABLISHED; an unconnected one has no peer.
        Transport::Udp => s.state == TCP_ESTABLISHED && s.remote.port() != 0,
    };
    in_play
        && s.state != TCP_LISTEN
        && s.uid != exempt_uid
        && !(is_loopback(s.local.ip()) && is_loopback(s.remote.ip()))
}

/// The server side of a connection from `client` accepted on local port `port` (pure):
/// a TCP socket in the same netns, not listening and not closed, whose local port is
/// `port` and whose peer is `client` (IPv4-mapped IPv6 addresses compare as IPv4: a
/// dual-stack listener reports IPv4 peers that way).
///
/// This is what the probe looks for when a running proxy owns its outbound port
/// (`crate::probe`): while `client` holds its ephemeral port, only the connection it
/// opened can have it as peer, so such a socket on the proxy's port means that
/// connection was delivered there. `TIME_WAIT` and `CLOSE` are left out: they may be a
/// leftover of an earlier connection with the same tuple.
pub fn accepted_from(
    sockets: &[SocketEntry],
    port: u16,
    client: SocketAddr,
) -> Option<&SocketEntry> {
    let canonical = |a: SocketAddr| SocketAddr::new(a.ip().to_canonical(), a.port());
    sockets.iter().find(|s| {
        s.transport == Transport::Tcp
            && !matches!(s.state, TCP_LISTEN | TCP_TIME_WAIT | TCP_CLOSE)
            && s.local.port() == port
            && canonical(s.remote) == canonical(client)
    })
}

fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// What [`end_connections`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ended {
    /// The sockets that were ended.
    pub ended: Vec<SocketEntry>,
    /// Sockets that were already gone when their turn came (closed by the app meanwhile).
    pub already_gone: usize,
}

/// Why connections could not be ended.
#[derive(Debug, thiserror::Error)]
pub enum SockDiagError {
    /// The sock_diag socket could not be opened or used.
    #[error("sock_diag: {op}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The kernel refused to destroy a socket (no `CONFIG_INET_DIAG_DESTROY`, or no
    /// CAP_NET_ADMIN in the netns).
    #[error(
        "the kernel refused to end {socket}: {source} (needs CAP_NET_ADMIN in the pod's network \
         namespace and a kernel with CONFIG_INET_DIAG_DESTROY)"
    )]
    Refused {
        /// The socket.
        socket: SocketEntry,
        /// The kernel's answer.
        #[source]
        source: std::io::Error,
    },
    /// Sockets were still there after being destroyed.
    #[error("{} connection(s) survived SOCK_DESTROY, first: {}", .0.len(), .0[0])]
    Remaining(Vec<SocketEntry>),
    /// The kernel's answer could not be decoded.
    #[error("sock_diag: cannot decode the kernel's answer: {0}")]
    Decode(String),
}

impl SockDiagError {
    /// Whether this error means "this kernel or this process cannot end connections here"
    /// (the caller escalates, e.g. to restarting the sandbox) rather than a passing fault.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            SockDiagError::Refused { .. } | SockDiagError::Remaining(_)
        )
    }
}

fn io(op: &'static str) -> impl FnOnce(std::io::Error) -> SockDiagError {
    move |source| SockDiagError::Io { op, source }
}

/// A sock_diag socket in the calling thread's network namespace.
struct Diag {
    fd: std::os::fd::OwnedFd,
    rx: Receiver,
    seq: u32,
}

impl Diag {
    fn open() -> Result<Diag, SockDiagError> {
        use std::os::fd::AsRawFd;
        let fd = interlock_netlink::socket::open(SockProtocol::NetlinkSockDiag)
            .map_err(|(op, e)| io(op)(e.into()))?;
        connect(fd.as_raw_fd(), &NetlinkAddr::new(0, 0)).map_err(|e| io("connect")(e.into()))?;
        Ok(Diag {
            fd,
            rx: Receiver::new(),
            seq: 0,
        })
    }

    fn send<T>(&mut self, flags: u16, payload: T) -> Result<u32, SockDiagError>
    where
        T: netlink_packet_core::NetlinkSerializable + Into<NetlinkPayload<T>>,
    {
        self.seq += 1;
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        header.sequence_number = self.seq;
        let mut msg = NetlinkMessage::new(header, payload.into());
        msg.finalize();
        let mut buf = vec![0u8; msg.buffer_len()];
        msg.serialize(&mut buf);
        let sent =
            interlock_netlink::socket::send(&self.fd, &buf).map_err(|e| io("send")(e.into()))?;
        if sent != buf.len() {
            return Err(io("send")(std::io::Error::new(
                std::io::ErrorKind::WriteZero,
                format!("sent {sent} of {} bytes", buf.len()),
            )));
        }
        Ok(self.seq)
    }

    /// Every socket of one family and transport (all states).
    fn dump(
        &mut self,
        family: u8,
        transport: Transport,
    ) -> Result<Vec<SocketEntry>, SockDiagError> {
        let socket_id = if family == AF_INET {
            SocketId::new_v4()
        } else {
            SocketId::new_v6()
        };
        let req = SockDiagMessage::InetRequest(InetRequest {
            family,
            protocol: transport.ipproto(),
            extensions: ExtensionFlags::empty(),
            states: StateFlags::all(),
            socket_id,
        });
        let seq = self.send(NLM_F_REQUEST | NLM_F_DUMP, req)?;
        let mut out = Vec::new();
        loop {
            let buf = self
                .rx
                .recv(&self.fd, MsgFlags::empty())
                .map_err(io("recv"))?;
            let mut off = 0;
            while off < buf.len() {
                let msg = NetlinkMessage::<SockDiagMessage>::deserialize(&buf[off..])
                    .map_err(|e| SockDiagError::Decode(e.to_string()))?;
                let len = msg.header.length as usize;
                if msg.header.sequence_number == seq {
                    match msg.payload {
                        NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => {
                            out.push(entry(family, transport, &r.header));
                        }
                        NetlinkPayload::Done(_) => return Ok(out),
                        NetlinkPayload::Error(e) => {
                            if let Some(code) = e.code {
                                return Err(SockDiagError::Io {
                                    op: "dump",
                                    source: std::io::Error::from_raw_os_error(-code.get()),
                                });
                            }
                        }
                        _ => {}
                    }
                }
                if len == 0 {
                    break;
                }
                off += len;
            }
        }
    }

    /// Destroys one socket. `Ok(false)`: it was gone already.
    fn destroy(&mut self, s: &SocketEntry) -> Result<bool, SockDiagError> {
        let req = SockDiagDestroy::new(SockDiagMessage::InetRequest(InetRequest {
            family: s.family,
            protocol: s.transport.ipproto(),
            extensions: ExtensionFlags::empty(),
            states: StateFlags::all(),
            socket_id: SocketId {
                source_port: s.local.port(),
                destination_port: s.remote.port(),
                source_address: s.local.ip(),
                destination_address: s.remote.ip(),
                interface_id: s.interface,
                cookie: s.cookie,
            },
        }));
        let seq = self.send(NLM_F_REQUEST | NLM_F_ACK, req)?;
        loop {
            let buf = self
                .rx
                .recv(&self.fd, MsgFlags::empty())
                .map_err(io("recv"))?;
            let mut off = 0;
            while off < buf.len() {
                let msg = NetlinkMessage::<SockDiagDestroy>::deserialize(&buf[off..])
                    .map_err(|e| SockDiagError::Decode(e.to_string()))?;
                let len = msg.header.length as usize;
                if msg.header.sequence_number == seq {
                    if let NetlinkPayload::Error(e) = msg.payload {
                        return match e.code.map(|c| -c.get()) {
                            None => Ok(true),
                            Some(libc::ENOENT) => Ok(false),
                            Some(errno) => Err(SockDiagError::Refused {
                                socket: s.clone(),
                                source: std::io::Error::from_raw_os_error(errno),
                            }),
                        };
                    }
                }
                if len == 0 {
                    break;
                }
                off += len;
            }
        }
    }
}

fn entry(
    family: u8,
    transport: Transport,
    h: &netlink_packet_sock_diag::inet::InetResponseHeader,
) -> SocketEntry {
    let id = &h.socket_id;
    SocketEntry {
        transport,
        state: h.state,
        local: SocketAddr::new(id.source_address, id.source_port),
        remote: SocketAddr::new(id.destination_address, id.destination_port),
        uid: h.uid,
        inode: h.inode,
        cookie: id.cookie,
        interface: id.interface_id,
        family,
    }
}

/// Every TCP and UDP socket, both families, in the calling thread's network namespace.
pub fn list_sockets() -> Result<Vec<SocketEntry>, SockDiagError> {
    let mut diag = Diag::open()?;
    let mut all = Vec::new();
    for family in [AF_INET, AF_INET6] {
        for transport in [Transport::Tcp, Transport::Udp] {
            all.extend(diag.dump(family, transport)?);
        }
    }
    Ok(all)
}

/// Every TCP socket, both families, in the calling thread's network namespace.
pub fn tcp_sockets() -> Result<Vec<SocketEntry>, SockDiagError> {
    let mut diag = Diag::open()?;
    let mut all = diag.dump(AF_INET, Transport::Tcp)?;
    all.extend(diag.dump(AF_INET6, Transport::Tcp)?);
    Ok(all)
}

/// Ends every connection [`must_end`] selects in the calling thread's network namespace,
/// then dumps again to confirm that none of them is left.
///
/// Call it after the rules are in place: a connection opened in between is already
/// redirected, and ending it too is harmless (the client reconnects through the proxy).
/// Only the sockets selected here are confirmed gone, so new, redirected connections that
/// appear meanwhile do not count as survivors.
pub fn end_connections(exempt_uid: u32) -> Result<Ended, SockDiagError> {
    let mut diag = Diag::open()?;
    let mut targets = Vec::new();
    for family in [AF_INET, AF_INET6] {
        for transport in [Transport::Tcp, Transport::Udp] {
            targets.extend(
                diag.dump(family, transport)?
                    .into_iter()
                    .filter(|s| must_end(s, exempt_uid)),
            );
        }
    }
    let mut done = Ended::default();
    for s in targets {
        if diag.destroy(&s)? {
            done.ended.push(s);
        } else {
            done.already_gone += 1;
        }
    }
    if !done.ended.is_empty() {
        let mut left = Vec::new();
        for family in [AF_INET, AF_INET6] {
            for transport in [Transport::Tcp, Transport::Udp] {
                left.extend(diag.dump(family, transport)?.into_iter().filter(|s| {
                    done.ended
                        .iter()
                        .any(|e| e.cookie == s.cookie && e.transport == s.transport)
                        && must_end(s, exempt_uid)
                }));
            }
        }
        if !left.is_empty() {
            return Err(SockDiagError::Remaining(left));
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sock(transport: Transport, state: u8, local: &str, remote: &str, uid: u32) -> SocketEntry {
        let local: SocketAddr = local.parse().unwrap();
        SocketEntry {
            transport,
            state,
            family: if local.is_ipv4() { AF_INET } else { AF_INET6 },
            local,
            remote: remote.parse().unwrap(),
            uid,
            inode: 1,
            cookie: [0; 8],
            interface: 0,
        }
    }

    #[test]
    fn app_connections_in_play_are_ended() {
        for state in [TCP_ESTABLISHED, TCP_SYN_SENT, TCP_SYN_RECV] {
            let s = sock(
                Transport::Tcp,
                state,
                "10.1.0.5:43210",
                "10.1.0.9:443",
                1000,
            );
            assert!(must_end(&s, 1337), "state {state}");
        }
        let s = sock(
            Transport::Tcp,
            TCP_ESTABLISHED,
            "[fe80::1]:8080",
            "[fe80::2]:5000",
            0,
        );
        assert!(must_end(&s, 1337), "inbound over link-local");
        let s = sock(
            Transport::Udp,
            TCP_ESTABLISHED,
            "10.1.0.5:5353",
            "10.1.0.9:53",
            1000,
        );
        assert!(must_end(&s, 1337), "connected UDP");
    }

    #[test]
    fn listeners_proxy_loopback_and_closing_sockets_are_kept() {
        let listen = sock(
            Transport::Tcp,
            TCP_LISTEN,
            "0.0.0.0:8080",
            "0.0.0.0:0",
            1000,
        );
        assert!(!must_end(&listen, 1337));
        let proxy = sock(
            Transport::Tcp,
            TCP_ESTABLISHED,
            "10.1.0.5:43210",
            "10.1.0.9:443",
            1337,
        );
        assert!(!must_end(&proxy, 1337));
        let lo = sock(
            Transport::Tcp,
            TCP_ESTABLISHED,
            "127.0.0.1:8080",
            "127.0.0.6:4000",
            1000,
        );
        assert!(!must_end(&lo, 1337));
        let lo6 = sock(
            Transport::Tcp,
            TCP_ESTABLISHED,
            "[::1]:8080",
            "[::ffff:127.0.0.1]:4000",
            1000,
        );
        assert!(!must_end(&lo6, 1337));
        let time_wait = sock(Transport::Tcp, 6, "10.1.0.5:43210", "10.1.0.9:443", 1000);
        assert!(!must_end(&time_wait, 1337));
        let unconnected = sock(Transport::Udp, 7, "0.0.0.0:5353", "0.0.0.0:0", 1000);
        assert!(!must_end(&unconnected, 1337));
    }

    #[test]
    fn the_server_side_of_a_clients_connection_is_found_on_the_port() {
        let client: SocketAddr = "10.1.0.5:43210".parse().unwrap();
        let listener = sock(
            Transport::Tcp,
            TCP_LISTEN,
            "0.0.0.0:15001",
            "0.0.0.0:0",
            1337,
        );
        let other = sock(
            Transport::Tcp,
            TCP_ESTABLISHED,
            "127.0.0.1:15001",
            "10.1.0.5:43211",
            1337,
        );
        let elsewhere = sock(
            Transport::Tcp,
            TCP_ESTABLISHED,
            "127.0.0.1:15006",
            "10.1.0.5:43210",
            1337,
        );
        let mut all = vec![listener, other, elsewhere];
        assert_eq!(accepted_from(&all, 15001, client), None);
        // Any live state counts: the proxy may have accepted and closed already.
        for state in [TCP_SYN_RECV, TCP_ESTABLISHED, 4, 5, 8] {
            let ours = sock(
                Transport::Tcp,
                state,
                "127.0.0.1:15001",
                "10.1.0.5:43210",
                1337,
            );
            all.push(ours.clone());
            assert_eq!(
                accepted_from(&all, 15001, client),
                Some(&ours),
                "state {state}"
            );
            all.pop();
        }
        // A leftover of an earlier connection with the same tuple proves nothing.
        for state in [TCP_TIME_WAIT, TCP_CLOSE] {
            all.push(sock(
                Transport::Tcp,
                state,
                "127.0.0.1:15001",
                "10.1.0.5:43210",
                1337,
            ));
            assert_eq!(accepted_from(&all, 15001, client), None, "state {state}");
            all.pop();
        }
        // UDP on the port is not a TCP connection.
        all.push(sock(
            Transport::Udp,
            TCP_ESTABLISHED,
            "127.0.0.1:15001",
            "10.1.0.5:43210",
            0,
        ));
        assert_eq!(accepted_from(&all, 15001, client), None);
        // A dual-stack listener's IPv4 connection reports IPv4-mapped addresses.
        let mapped = sock(
            Transport::Tcp,
            TCP_ESTABLISHED,
            "[::ffff:127.0.0.1]:15001",
            "[::ffff:10.1.0.5]:43210",
            1337,
        );
        assert_eq!(
            accepted_from(std::slice::from_ref(&mapped), 15001, client),
            Some(&mapped)
        );
        // IPv6 from ::1.
        let v6 = sock(
            Transport::Tcp,
            TCP_ESTABLISHED,
            "[::1]:15001",
            "[::1]:40000",
            1337,
        );
        assert_eq!(
            accepted_from(
                std::slice::from_ref(&v6),
                15001,
                "[::1]:40000".parse().unwrap()
            ),
            Some(&v6)
        );
    }

    #[test]
    fn half_loopback_is_not_loopback_only() {
        let s = sock(
            Transport::Tcp,
            TCP_ESTABLISHED,
            "127.0.0.1:8080",
            "10.1.0.9:443",
            1000,
        );
        assert!(must_end(&s, 1337));
    }
}

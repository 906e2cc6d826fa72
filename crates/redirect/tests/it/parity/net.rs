//! Sockets for the probes and listeners: wildcard listeners that do not collide across
//! families, transparent ones for the node's catch-all, datagrams with the destination they
//! were delivered to, and client sockets owned by a given UID/GID.

use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{
    bind, getsockopt, listen, recvmsg, setsockopt, socket, sockopt, AddressFamily, Backlog,
    ControlMessageOwned, MsgFlags, SockFlag, SockType, SockaddrStorage,
};

/// Which transport a probe or listener uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proto {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

impl Proto {
    pub fn as_str(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }
}

fn family(addr: &SocketAddr) -> AddressFamily {
    if addr.is_ipv6() {
        AddressFamily::Inet6
    } else {
        AddressFamily::Inet
    }
}

/// A socket bound to `addr` (IPv6 sockets are IPv6-only, so `0.0.0.0:p` and `[::]:p` can
/// both be bound). `transparent` makes it accept packets for any address (the node's
/// catch-all under `tproxy`).
fn bound(addr: SocketAddr, ty: SockType, transparent: bool) -> io::Result<OwnedFd> {
    let fd = socket(
        family(&addr),
        ty,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?;
    setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    if addr.is_ipv6() {
        setsockopt(&fd, sockopt::Ipv6V6Only, &true)?;
    }
    if transparent {
        // IP_TRANSPARENT serves IPv6 sockets too (ipv6_setsockopt hands SOL_IP on).
        setsockopt(&fd, sockopt::IpTransparent, &true)?;
    }
    // Every datagram reports the address it was delivered to: after a REDIRECT/DNAT in the
    // pod the rewritten one, under the node's tproxy the one the pod sent to.
    if ty == SockType::Datagram {
        if addr.is_ipv6() {
            setsockopt(&fd, sockopt::Ipv6OrigDstAddr, &true)?;
        } else {
            setsockopt(&fd, sockopt::Ipv4OrigDstAddr, &true)?;
        }
    }
    bind(fd.as_raw_fd(), &SockaddrStorage::from(addr))?;
    Ok(fd)
}

/// A non-blocking TCP listener on `addr` (call it on a thread inside the netns).
pub fn tcp_listener(addr: SocketAddr, transparent: bool) -> io::Result<TcpListener> {
    let fd = bound(addr, SockType::Stream, transparent)?;
    listen(&fd, Backlog::new(1024).expect("backlog"))?;
    Ok(TcpListener::from(fd))
}

/// A non-blocking UDP socket on `addr` that reports each datagram's delivery address.
pub fn udp_listener(addr: SocketAddr, transparent: bool) -> io::Result<UdpSocket> {
    Ok(UdpSocket::from(bound(
        addr,
        SockType::Datagram,
        transparent,
    )?))
}

/// Reads one datagram if there is one: its source and the address it was delivered to.
pub fn recv_datagram(sock: &UdpSocket) -> io::Result<Option<(SocketAddr, SocketAddr, Vec<u8>)>> {
    let mut buf = vec![0u8; 2048];
    let mut cmsg = nix::cmsg_space!(libc::sockaddr_in6);
    let (peer, dst, len) = {
        let mut iov = [io::IoSliceMut::new(&mut buf)];
        let msg = match recvmsg::<SockaddrStorage>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(m) => m,
            Err(nix::errno::Errno::EAGAIN) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let peer = msg.address.as_ref().and_then(storage_to_std);
        let mut dst = None;
        for c in msg.cmsgs().map_err(io::Error::from)? {
            match c {
                ControlMessageOwned::Ipv4OrigDstAddr(sa) => {
                    dst = Some(SocketAddr::new(
                        IpAddr::from(u32::from_be(sa.sin_addr.s_addr).to_be_bytes()),
                        u16::from_be(sa.sin_port),
                    ))
                }
                ControlMessageOwned::Ipv6OrigDstAddr(sa) => {
                    dst = Some(SocketAddr::new(
                        IpAddr::from(sa.sin6_addr.s6_addr),
                        u16::from_be(sa.sin6_port),
                    ))
                }
                _ => {}
            }
        }
        (peer, dst, msg.bytes)
    };
    match (peer, dst) {
        (Some(p), Some(d)) => {
            buf.truncate(len);
            Ok(Some((p, d, buf)))
        }
        _ => Err(io::Error::other("datagram without source or destination")),
    }
}

fn storage_to_std(s: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = s.as_sockaddr_in() {
        return Some(SocketAddr::from((v4.ip(), v4.port())));
    }
    s.as_sockaddr_in6()
        .map(|v6| SocketAddr::from((v6.ip(), v6.port())))
}

/// A UID and GID a probe's socket is owned by (the owner netfilter matches).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Creds {
    pub uid: u32,
    pub gid: u32,
}

/// A client socket of `proto` for `dst`'s family, owned by `creds`: created while the
/// calling thread's filesystem UID and GID are `creds` (a socket's owner, for
/// `-m owner`/`meta skuid`, is the file's credentials at creation), restored to root
/// right after. Only this thread's credentials change, so hundreds of probes run without
/// a process each.
pub fn client_socket(proto: Proto, dst: &SocketAddr, creds: Creds) -> io::Result<OwnedFd> {
    let ty = match proto {
        Proto::Tcp => SockType::Stream,
        Proto::Udp => SockType::Datagram,
    };
    nix::unistd::setfsgid(nix::unistd::Gid::from_raw(creds.gid));
    nix::unistd::setfsuid(nix::unistd::Uid::from_raw(creds.uid));
    let fd = socket(
        family(dst),
        ty,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    );
    nix::unistd::setfsuid(nix::unistd::Uid::from_raw(0));
    nix::unistd::setfsgid(nix::unistd::Gid::from_raw(0));
    let fd = fd?;
    if proto == Proto::Tcp {
        // End with a reset: hundreds of probes leave no TIME_WAIT behind.
        setsockopt(
            &fd,
            sockopt::Linger,
            &libc::linger {
                l_onoff: 1,
                l_linger: 0,
            },
        )?;
    }
    Ok(fd)
}

/// Binds a client socket to `src` (port chosen by the kernel).
pub fn bind_source(fd: &OwnedFd, src: IpAddr) -> io::Result<()> {
    bind(
        fd.as_raw_fd(),
        &SockaddrStorage::from(SocketAddr::new(src, 0)),
    )?;
    Ok(())
}

/// Connects a non-blocking TCP socket to `dst`, waiting up to `within`; a connection that
/// gets no answer in that time is `TimedOut`.
pub fn connect_within(fd: &OwnedFd, dst: &SocketAddr, within: Duration) -> io::Result<()> {
    match nix::sys::socket::connect(fd.as_raw_fd(), &SockaddrStorage::from(*dst)) {
        Ok(()) => return Ok(()),
        Err(nix::errno::Errno::EINPROGRESS) => {}
        Err(e) => return Err(e.into()),
    }
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLOUT)];
    let ms = within.as_millis().min(u16::MAX as u128) as u16;
    let n = poll(&mut fds, PollTimeout::from(ms))?;
    if n == 0 {
        return Err(io::ErrorKind::TimedOut.into());
    }
    match getsockopt(fd, sockopt::SocketError)? {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

/// Connects a UDP socket (fixing its source address and port) to `dst`.
pub fn connect_udp(fd: &OwnedFd, dst: &SocketAddr) -> io::Result<()> {
    nix::sys::socket::connect(fd.as_raw_fd(), &SockaddrStorage::from(*dst))?;
    Ok(())
}

/// The pending error of a socket (an ICMP "port unreachable" on a connected UDP socket
/// shows up here as `ECONNREFUSED`).
pub fn pending_error(fd: &OwnedFd) -> Option<io::Error> {
    match getsockopt(fd, sockopt::SocketError) {
        Ok(0) => None,
        Ok(e) => Some(io::Error::from_raw_os_error(e)),
        Err(e) => Some(e.into()),
    }
}

/// Enters the netns at `path` on the calling thread.
pub fn enter(path: &std::path::Path) {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
        .unwrap_or_else(|e| panic!("setns {}: {e}", path.display()));
}

/// Runs `f` on a fresh thread inside the netns at `path`.
pub fn in_netns<R: Send>(path: &std::path::Path, f: impl FnOnce() -> R + Send) -> R {
    std::thread::scope(|s| {
        s.spawn(|| {
            enter(path);
            f()
        })
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
    })
}

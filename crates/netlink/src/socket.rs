//! Netlink sockets: opened in the calling thread's network namespace (a netlink socket
//! belongs to the namespace it is opened in), and sent to whole.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::socket::{
    bind, send as nix_send, socket, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol,
    SockType,
};

/// `NETLINK_CAP_ACK`: error acks do not echo the whole request.
pub const NETLINK_CAP_ACK: i32 = 10;
/// `NETLINK_EXT_ACK`: error acks carry the kernel's message.
pub const NETLINK_EXT_ACK: i32 = 11;

/// Opens a netlink socket of `protocol` in the calling thread's netns, bound to a port id
/// the kernel picks; close-on-exec. The error names the call that failed.
pub fn open(protocol: SockProtocol) -> Result<OwnedFd, (&'static str, nix::Error)> {
    let fd = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        protocol,
    )
    .map_err(|e| ("socket", e))?;
    // Port id 0: the kernel picks one.
    bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0)).map_err(|e| ("bind", e))?;
    Ok(fd)
}

/// Sends `buf` as one datagram to the kernel (an unconnected netlink socket sends to port
/// 0), retried on `EINTR`; returns the bytes sent.
pub fn send(fd: &OwnedFd, buf: &[u8]) -> nix::Result<usize> {
    loop {
        match nix_send(fd.as_raw_fd(), buf, MsgFlags::empty()) {
            Err(nix::Error::EINTR) => continue,
            other => return other,
        }
    }
}

/// Turns on the boolean netlink socket option `opt` ([`NETLINK_EXT_ACK`],
/// [`NETLINK_CAP_ACK`]). nix 0.29 has no sockopt for these two, and its `SetSockOpt`
/// trait cannot be implemented without the same raw call, so this is the crate's one
/// `unsafe` block.
#[allow(unsafe_code)]
pub fn set_flag(fd: &OwnedFd, opt: i32) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: `on` is a live c_int for the duration of the call and the length passed is
    // its size; `fd` is an open socket owned by the caller.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_NETLINK,
            opt,
            &on as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

//! Receiving netlink datagrams whole.
//!
//! A netlink datagram must be read in one `recv` into a buffer large enough for it; the
//! kernel also sizes the datagrams of a dump after the largest buffer the socket has
//! offered (up to 32 KiB), and ends a dump early when one object does not fit an empty
//! datagram. So the buffer stays large ([`RECV_BUFFER`]). What costs is not its size but
//! touching it: zero-filling 64 KiB of fresh heap faults in every one of its pages, in a
//! plugin process that lives for one ADD. The buffer therefore lives in `.bss`, whose
//! pages the kernel maps only when a reply is written into them (a small reply costs one
//! page), and is shared
//! by every socket of the process; a thread that finds it busy (the agent, receiving on
//! several threads at once) falls back to a heap buffer of its own.

use std::io;
use std::ops::Deref;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::{Mutex, MutexGuard, TryLockError};

use nix::sys::socket::{recv, MsgFlags};

/// Bytes of the receive buffer: a datagram larger than this is refused, never cut.
pub const RECV_BUFFER: usize = 64 * 1024;

/// All zeroes, so it is placed in `.bss` and costs nothing until a reply lands in it.
static SHARED: Mutex<[u8; RECV_BUFFER]> = Mutex::new([0; RECV_BUFFER]);

/// The receive side of one netlink socket.
#[derive(Debug, Default)]
pub struct Receiver {
    /// Allocated only when [`SHARED`] was busy.
    own: Option<Vec<u8>>,
}

/// One received datagram; holds the buffer it was received into until dropped.
pub struct Datagram<'a> {
    buf: Buffer<'a>,
    len: usize,
}

enum Buffer<'a> {
    Shared(MutexGuard<'static, [u8; RECV_BUFFER]>),
    Own(&'a mut [u8]),
}

impl Deref for Datagram<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.buf {
            Buffer::Shared(g) => &g[..self.len],
            Buffer::Own(b) => &b[..self.len],
        }
    }
}

impl Receiver {
    /// A receiver; no memory is taken until a receive needs it.
    pub fn new() -> Receiver {
        Receiver::default()
    }

    /// Receives one whole datagram from `fd` (`MSG_DONTWAIT` in `flags` for a
    /// non-blocking read). A datagram longer than [`RECV_BUFFER`] is an error
    /// (`InvalidData`, naming both sizes): the kernel has dropped its tail, so nothing of it
    /// is returned.
    pub fn recv(&mut self, fd: &impl AsFd, flags: MsgFlags) -> io::Result<Datagram<'_>> {
        let mut buf = match SHARED.try_lock() {
            Ok(g) => Buffer::Shared(g),
            // A panic elsewhere while holding it leaves only bytes behind.
            Err(TryLockError::Poisoned(p)) => Buffer::Shared(p.into_inner()),
            Err(TryLockError::WouldBlock) => Buffer::Own(
                self.own
                    .get_or_insert_with(|| vec![0; RECV_BUFFER])
                    .as_mut_slice(),
            ),
        };
        let target: &mut [u8] = match &mut buf {
            Buffer::Shared(g) => &mut g[..],
            Buffer::Own(b) => b,
        };
        let len = loop {
            match recv(fd.as_fd().as_raw_fd(), target, flags | MsgFlags::MSG_TRUNC) {
                Err(nix::Error::EINTR) => continue,
                Err(e) => return Err(e.into()),
                Ok(n) => break n,
            }
        };
        if len > RECV_BUFFER {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "netlink reply of {len} bytes exceeds the {RECV_BUFFER}-byte receive buffer"
                ),
            ));
        }
        Ok(Datagram { buf, len })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{send, socketpair, AddressFamily, SockFlag, SockType};

    fn pair() -> (std::os::fd::OwnedFd, std::os::fd::OwnedFd) {
        socketpair(
            AddressFamily::Unix,
            SockType::Datagram,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap()
    }

    fn datagram(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8).collect()
    }

    fn send_all(fd: &std::os::fd::OwnedFd, data: &[u8]) {
        assert_eq!(
            send(fd.as_raw_fd(), data, MsgFlags::empty()).unwrap(),
            data.len()
        );
    }

    #[test]
    fn datagrams_up_to_the_buffer_size_arrive_whole() {
        let (a, b) = pair();
        let mut rx = Receiver::new();
        for len in [1, 3000, RECV_BUFFER] {
            let sent = datagram(len);
            send_all(&a, &sent);
            let got = rx.recv(&b, MsgFlags::empty()).unwrap();
            assert_eq!(&got[..], &sent[..], "a {len}-byte datagram");
        }
    }

    #[test]
    fn a_longer_datagram_is_refused_not_cut() {
        let (a, b) = pair();
        nix::sys::socket::setsockopt(&a, nix::sys::socket::sockopt::SndBuf, &(1 << 20)).unwrap();
        send_all(&a, &datagram(RECV_BUFFER + 1));
        let err = Receiver::new()
            .recv(&b, MsgFlags::empty())
            .err()
            .expect("a truncated datagram must not be returned");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        let text = err.to_string();
        assert!(
            text.contains(&format!("{} bytes", RECV_BUFFER + 1)),
            "{text}"
        );
    }

    #[test]
    fn a_receiver_that_finds_the_shared_buffer_busy_uses_its_own() {
        let (a, b) = pair();
        let first = datagram(100);
        let second: Vec<u8> = datagram(200).into_iter().rev().collect();
        send_all(&a, &first);
        send_all(&a, &second);
        let mut rx1 = Receiver::new();
        let mut rx2 = Receiver::new();
        // rx1 holds the buffer (shared, unless a test on another thread has it) while rx2
        // receives: the two datagrams stay distinct.
        let d1 = rx1.recv(&b, MsgFlags::empty()).unwrap();
        let d2 = rx2.recv(&b, MsgFlags::empty()).unwrap();
        assert_eq!(&d1[..], &first[..]);
        assert_eq!(&d2[..], &second[..]);
        drop((d1, d2));
        assert!(
            rx1.own.is_some() || rx2.own.is_some(),
            "one of two receivers held at once must have its own buffer"
        );
    }

    #[test]
    fn a_non_blocking_receive_with_nothing_queued_would_block() {
        let (_a, b) = pair();
        let err = Receiver::new()
            .recv(&b, MsgFlags::MSG_DONTWAIT)
            .err()
            .unwrap();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
    }
}

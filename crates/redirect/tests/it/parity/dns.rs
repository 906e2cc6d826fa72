//! Real DNS: a minimal query packet, a responder that answers it with an address naming
//! itself, and a client that sends a query as a given UID over UDP or TCP and says who
//! answered.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::net::{client_socket, connect_udp, connect_within, in_netns, Creds, Proto};

/// A query for `parity.test. IN A` with id `id`.
pub fn query(id: u16) -> Vec<u8> {
    let mut q = Vec::new();
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]); // RD; one question
    for label in ["parity", "test"] {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]); // root, type A, class IN
    q
}

/// The answer to `q`: its id and question, one A record `addr`.
fn answer(q: &[u8], addr: Ipv4Addr) -> Option<Vec<u8>> {
    // Header (12 bytes), then the name up to its zero label, then type and class.
    let end = 12 + q.get(12..)?.iter().position(|&b| b == 0)? + 1 + 4;
    let question = q.get(12..end)?;
    let mut a = Vec::new();
    a.extend_from_slice(&q[..2]);
    a.extend_from_slice(&[0x81, 0x80, 0, 1, 0, 1, 0, 0, 0, 0]);
    a.extend_from_slice(question);
    a.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4]);
    a.extend_from_slice(&addr.octets());
    Some(a)
}

/// The A record of an answer to the query with id `id`, if it is one.
fn answered(id: u16, a: &[u8]) -> Option<Ipv4Addr> {
    (a.len() >= 16 && a[..2] == id.to_be_bytes() && a[2] & 0x80 != 0 && a[6..8] == [0, 1]).then(
        || {
            Ipv4Addr::new(
                a[a.len() - 4],
                a[a.len() - 3],
                a[a.len() - 2],
                a[a.len() - 1],
            )
        },
    )
}

/// A DNS responder on UDP and TCP at some addresses of one netns, answering every query
/// with `me`.
pub struct Responder {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Responder {
    /// Starts answering at `addrs` inside the netns at `ns`, with sockets owned by `owner`
    /// (a proxy's DNS server is the proxy: Istio's conntrack zones match its UID on replies).
    pub fn start(
        ns: &std::path::Path,
        addrs: &[SocketAddr],
        me: Ipv4Addr,
        owner: Creds,
    ) -> Responder {
        let (udp, tcp): (Vec<UdpSocket>, Vec<TcpListener>) = in_netns(ns, || {
            nix::unistd::setfsgid(nix::unistd::Gid::from_raw(owner.gid));
            nix::unistd::setfsuid(nix::unistd::Uid::from_raw(owner.uid));
            let udp = addrs
                .iter()
                .map(|a| {
                    super::net::udp_listener(*a, false)
                        .unwrap_or_else(|e| panic!("bind udp {a}: {e}"))
                })
                .collect();
            let tcp = addrs
                .iter()
                .map(|a| {
                    super::net::tcp_listener(*a, false)
                        .unwrap_or_else(|e| panic!("bind tcp {a}: {e}"))
                })
                .collect();
            nix::unistd::setfsuid(nix::unistd::Uid::from_raw(0));
            nix::unistd::setfsgid(nix::unistd::Gid::from_raw(0));
            (udp, tcp)
        });
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let mut fds: Vec<PollFd> = udp
                    .iter()
                    .map(|u| PollFd::new(u.as_fd(), PollFlags::POLLIN))
                    .chain(
                        tcp.iter()
                            .map(|t| PollFd::new(t.as_fd(), PollFlags::POLLIN)),
                    )
                    .collect();
                if poll(&mut fds, PollTimeout::from(20u16)).unwrap_or(0) == 0 {
                    continue;
                }
                drop(fds);
                let mut buf = [0u8; 512];
                for u in &udp {
                    while let Ok((n, peer)) = u.recv_from(&mut buf) {
                        if let Some(a) = answer(&buf[..n], me) {
                            let _ = u.send_to(&a, peer);
                        }
                    }
                }
                for t in &tcp {
                    while let Ok((mut c, _)) = t.accept() {
                        let _ = c.set_nonblocking(false);
                        let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
                        let mut len = [0u8; 2];
                        if c.read_exact(&mut len).is_err() {
                            continue;
                        }
                        let mut q = vec![0u8; u16::from_be_bytes(len) as usize];
                        if c.read_exact(&mut q).is_err() {
                            continue;
                        }
                        if let Some(a) = answer(&q, me) {
                            let mut msg = (a.len() as u16).to_be_bytes().to_vec();
                            msg.extend_from_slice(&a);
                            let _ = c.write_all(&msg);
                        }
                    }
                }
            }
        });
        Responder {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Sends one query from inside the netns at `pod`, as `creds`, over `proto` to `server`;
/// the address in the answer (which responder answered) or why there was none.
pub fn ask(
    pod: &std::path::Path,
    proto: Proto,
    server: SocketAddr,
    creds: Creds,
    id: u16,
) -> Result<Ipv4Addr, String> {
    in_netns(pod, || {
        let fd = client_socket(proto, &server, creds).map_err(|e| format!("socket: {e}"))?;
        let q = query(id);
        let a = match proto {
            Proto::Udp => {
                connect_udp(&fd, &server).map_err(|e| format!("connect: {e}"))?;
                let s = UdpSocket::from(fd);
                s.set_nonblocking(false).map_err(|e| e.to_string())?;
                s.set_read_timeout(Some(Duration::from_secs(3)))
                    .map_err(|e| e.to_string())?;
                s.send(&q).map_err(|e| format!("send: {e}"))?;
                let mut buf = [0u8; 512];
                let n = s
                    .recv(&mut buf)
                    .map_err(|e| format!("no UDP answer from {server}: {e}"))?;
                buf[..n].to_vec()
            }
            Proto::Tcp => {
                connect_within(&fd, &server, Duration::from_secs(3))
                    .map_err(|e| format!("connect {server}: {e}"))?;
                let mut c = TcpStream::from(fd);
                c.set_nonblocking(false).map_err(|e| e.to_string())?;
                c.set_read_timeout(Some(Duration::from_secs(3)))
                    .map_err(|e| e.to_string())?;
                let mut msg = (q.len() as u16).to_be_bytes().to_vec();
                msg.extend_from_slice(&q);
                c.write_all(&msg).map_err(|e| format!("write: {e}"))?;
                let mut len = [0u8; 2];
                c.read_exact(&mut len)
                    .map_err(|e| format!("no TCP answer from {server}: {e}"))?;
                let mut a = vec![0u8; u16::from_be_bytes(len) as usize];
                c.read_exact(&mut a)
                    .map_err(|e| format!("short TCP answer: {e}"))?;
                a
            }
        };
        answered(id, &a).ok_or_else(|| {
            format!(
                "{} bytes from {server} are no answer to query {id}",
                a.len()
            )
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_and_answer_round_trip() {
        let q = query(0x1234);
        let a = answer(&q, Ipv4Addr::new(10, 53, 0, 1)).unwrap();
        assert_eq!(answered(0x1234, &a), Some(Ipv4Addr::new(10, 53, 0, 1)));
        assert_eq!(answered(0x1235, &a), None);
        assert_eq!(answered(0x1234, &q), None, "a query is no answer");
    }
}

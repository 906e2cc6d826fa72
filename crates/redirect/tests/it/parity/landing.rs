//! Where a probe landed, as seen by the listeners of one side.
//!
//! Every listener of a side (the pod's, on every port the probes use, and the node's
//! catch-all) is watched by one thread that accepts each connection and reads each
//! datagram as it comes, and records where it arrived under the probe's token: the first
//! [`TOKEN_LEN`] bytes a probe sends. (Not under the probe's source address: NAT may give
//! a redirected connection another source port when its rewritten tuple is still known to
//! conntrack from an earlier probe.)

use std::collections::HashMap;
use std::fmt;
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use interlock_redirect::probe::original_dst;
use interlock_redirect::spec::Family;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::net::recv_datagram;

/// Where a probe ended.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Landing {
    /// On a listener in the pod: the local address it was delivered to and, when netfilter
    /// rewrote the destination, the destination the probe used (`SO_ORIGINAL_DST`; for UDP
    /// the probe's own).
    Pod {
        local: SocketAddr,
        orig: Option<SocketAddr>,
    },
    /// At the node's catch-all, with the destination the packet carried when it left the pod.
    Node { dst: SocketAddr },
    /// Actively refused (RST or ICMP port unreachable).
    Refused,
    /// Nothing answered within the probe's wait.
    NoAnswer,
    /// The probe could not be sent (e.g. its source address does not exist).
    Failed(String),
}

impl fmt::Display for Landing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Landing::Pod { local, orig: None } => write!(f, "pod {local}"),
            Landing::Pod {
                local,
                orig: Some(o),
            } => write!(f, "pod {local} (orig {o})"),
            Landing::Node { dst } => write!(f, "node {dst}"),
            Landing::Refused => f.write_str("refused"),
            Landing::NoAnswer => f.write_str("no answer"),
            Landing::Failed(e) => write!(f, "not sent: {e}"),
        }
    }
}

/// How many bytes a probe's token has.
pub const TOKEN_LEN: usize = 8;

/// The token of probe number `n`.
pub fn token(n: u32) -> [u8; TOKEN_LEN] {
    let mut t = *b"prb\0\0\0\0\0";
    t[4..].copy_from_slice(&n.to_be_bytes());
    t
}

fn token_number(b: &[u8]) -> Option<u32> {
    (b.len() >= TOKEN_LEN && &b[..4] == b"prb\0")
        .then(|| u32::from_be_bytes([b[4], b[5], b[6], b[7]]))
}

struct Shared {
    seen: Mutex<HashMap<u32, Landing>>,
    arrived: Condvar,
    stop: AtomicBool,
}

/// The listeners of one side and the thread that records what reaches them.
pub struct Recorder {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// One watched socket.
pub enum Watched {
    /// A TCP listener in the pod.
    PodTcp(TcpListener),
    /// A UDP socket in the pod.
    PodUdp(UdpSocket),
    /// The node's transparent TCP listener.
    NodeTcp(TcpListener),
    /// The node's transparent UDP socket.
    NodeUdp(UdpSocket),
}

impl Watched {
    fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            Watched::PodTcp(l) | Watched::NodeTcp(l) => l.as_fd(),
            Watched::PodUdp(s) | Watched::NodeUdp(s) => s.as_fd(),
        }
    }
}

fn family_of(a: &SocketAddr) -> Family {
    if a.is_ipv6() {
        Family::V6
    } else {
        Family::V4
    }
}

/// An accepted connection whose token has not all arrived yet.
struct Pending {
    stream: TcpStream,
    landing: Landing,
    buf: Vec<u8>,
    since: Instant,
}

fn accept_all(w: &Watched, pending: &mut Vec<Pending>) {
    let (Watched::PodTcp(l) | Watched::NodeTcp(l)) = w else {
        return;
    };
    loop {
        match l.accept() {
            Ok((s, _)) => {
                let local = s.local_addr().expect("local_addr");
                let landing = if matches!(w, Watched::NodeTcp(_)) {
                    // tproxy keeps the packet as sent: the local address is its destination.
                    Landing::Node { dst: local }
                } else {
                    let orig = original_dst(&s, family_of(&local))
                        .ok()
                        .filter(|o| *o != local);
                    Landing::Pod { local, orig }
                };
                s.set_nonblocking(true).expect("set_nonblocking");
                pending.push(Pending {
                    stream: s,
                    landing,
                    buf: Vec::new(),
                    since: Instant::now(),
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("accept: {e}"),
        }
    }
}

fn read_datagrams(w: &Watched, found: &mut Vec<(u32, Landing)>) {
    let (Watched::PodUdp(s) | Watched::NodeUdp(s)) = w else {
        return;
    };
    while let Some((_, dst, data)) = recv_datagram(s).expect("recvmsg") {
        let Some(n) = token_number(&data) else {
            continue;
        };
        let landing = if matches!(w, Watched::NodeUdp(_)) {
            Landing::Node { dst }
        } else {
            Landing::Pod {
                local: dst,
                orig: None,
            }
        };
        found.push((n, landing));
    }
}

/// Reads what arrived on a pending connection; true when it is done with (token read,
/// closed, or silent for too long: not a probe).
fn read_token(p: &mut Pending, found: &mut Vec<(u32, Landing)>) -> bool {
    let mut chunk = [0u8; TOKEN_LEN];
    loop {
        match p.stream.read(&mut chunk[..TOKEN_LEN - p.buf.len()]) {
            Ok(0) => return true,
            Ok(n) => {
                p.buf.extend_from_slice(&chunk[..n]);
                if p.buf.len() == TOKEN_LEN {
                    if let Some(n) = token_number(&p.buf) {
                        found.push((n, p.landing.clone()));
                    }
                    return true;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                return p.since.elapsed() > Duration::from_secs(30)
            }
            Err(_) => return true,
        }
    }
}

impl Recorder {
    /// Starts watching `sockets`.
    pub fn start(sockets: Vec<Watched>) -> Recorder {
        let shared = Arc::new(Shared {
            seen: Mutex::new(HashMap::new()),
            arrived: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let thread = std::thread::spawn(move || {
            let mut pending: Vec<Pending> = Vec::new();
            while !s.stop.load(Ordering::Relaxed) {
                let mut fds: Vec<PollFd> = sockets
                    .iter()
                    .map(|w| PollFd::new(w.fd(), PollFlags::POLLIN))
                    .chain(
                        pending
                            .iter()
                            .map(|p| PollFd::new(p.stream.as_fd(), PollFlags::POLLIN)),
                    )
                    .collect();
                let n = poll(&mut fds, PollTimeout::from(20u16)).expect("poll");
                let ready: Vec<usize> = fds
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| p.revents().is_some_and(|r| !r.is_empty()))
                    .map(|(i, _)| i)
                    .collect();
                drop(fds);
                let mut found = Vec::new();
                let before = pending.len();
                let mut done = vec![false; before];
                if n > 0 {
                    for i in ready {
                        if let Some(w) = sockets.get(i) {
                            accept_all(w, &mut pending);
                            read_datagrams(w, &mut found);
                        } else {
                            let j = i - sockets.len();
                            done[j] = read_token(&mut pending[j], &mut found);
                        }
                    }
                }
                // Connections accepted just now may hold their token already.
                done.resize(pending.len(), false);
                for (j, p) in pending.iter_mut().enumerate().skip(before) {
                    done[j] = read_token(p, &mut found);
                }
                let mut k = 0;
                pending.retain(|_| {
                    k += 1;
                    !done[k - 1]
                });
                if !found.is_empty() {
                    let mut seen = s.seen.lock().unwrap();
                    seen.extend(found);
                    s.arrived.notify_all();
                }
            }
        });
        Recorder {
            shared,
            thread: Some(thread),
        }
    }

    /// Waits up to `within` for the probe whose token is `token`; `check`
    /// is called while waiting and may end the wait early with its own verdict (a socket
    /// error on the probe's side).
    pub fn wait(
        &self,
        token: u32,
        within: Duration,
        mut check: impl FnMut() -> Option<Landing>,
    ) -> Landing {
        let deadline = Instant::now() + within;
        let mut seen = self.shared.seen.lock().unwrap();
        loop {
            if let Some(l) = seen.remove(&token) {
                return l;
            }
            if let Some(l) = check() {
                return l;
            }
            let now = Instant::now();
            if now >= deadline {
                return Landing::NoAnswer;
            }
            let step = (deadline - now).min(Duration::from_millis(5));
            seen = self.shared.arrived.wait_timeout(seen, step).unwrap().0;
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

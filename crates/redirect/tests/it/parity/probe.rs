//! One probe — a TCP connection or a UDP datagram from the pod (outbound) or from the node
//! (inbound) — and running a list of them against a side.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use super::landing::{token, Landing, Recorder};
use super::net::{
    bind_source, client_socket, connect_udp, connect_within, in_netns, pending_error, Creds, Proto,
};

/// How long a TCP connection may take to be answered. Both sides of a comparison see the
/// same conditions; a connection that gets no answer (none should: every destination has
/// a listener or refuses) only costs this once.
const CONNECT_WAIT: Duration = Duration::from_secs(2);
/// How long an accepted connection may take to be recorded (it was accepted by the
/// kernel already: only the recording thread's turn is awaited).
const RECORD_WAIT: Duration = Duration::from_secs(10);
/// How long a datagram may take to arrive.
const UDP_WAIT: Duration = Duration::from_secs(2);

/// Direction of a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dir {
    /// Sent by a process in the pod.
    Out,
    /// Sent by the node to the pod.
    In,
}

/// Who sends an outbound probe: a role and the socket's owner.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Who {
    /// `app`, `root`, `proxy`, `proxy-gid`, `uid N`… (inbound probes: `node`).
    pub role: String,
    pub creds: Creds,
}

/// One probe.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Probe {
    pub dir: Dir,
    pub proto: Proto,
    pub who: Who,
    /// Source address the socket binds to (inbound: a node address).
    pub src: Option<IpAddr>,
    pub dst: SocketAddr,
}

impl Probe {
    pub fn is_v6(&self) -> bool {
        self.dst.is_ipv6()
    }
}

impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dir = match self.dir {
            Dir::Out => "out",
            Dir::In => "in",
        };
        write!(f, "{dir} {} ", self.proto.as_str())?;
        match self.dir {
            Dir::Out => write!(
                f,
                "{} ({}:{})",
                self.who.role, self.who.creds.uid, self.who.creds.gid
            )?,
            Dir::In => f.write_str("node")?,
        }
        if let Some(src) = self.src {
            write!(f, " from {src}")?;
        }
        write!(f, " -> {}", self.dst)
    }
}

/// [`run_one`], sent again (at most three times, 20 ms apart) while `connect` fails with
/// "network unreachable" before anything is sent. Seen about once per full run on a
/// loaded machine, on either side, for a connection to an address on the pod's own `lo`
/// whose route read back fine at that moment and a retry 0 ms later succeeded: a passing
/// kernel condition, not where the rules send the connection (which needs it sent).
fn run_one_settled(n: u32, p: &Probe, rec: &Recorder) -> Landing {
    let mut landing = run_one(n, p, rec);
    for _ in 0..3 {
        match &landing {
            Landing::Failed(e) if e.contains("Network is unreachable") => {
                eprintln!("parity: {p}: {e}; sending it again");
                std::thread::sleep(Duration::from_millis(20));
                landing = run_one(n, p, rec);
            }
            _ => break,
        }
    }
    landing
}

/// Sends one probe from the calling thread (inside the right netns) and says where it
/// landed.
fn run_one(n: u32, p: &Probe, rec: &Recorder) -> Landing {
    let token = token(n);
    let fd = match client_socket(p.proto, &p.dst, p.who.creds) {
        Ok(fd) => fd,
        Err(e) => return Landing::Failed(format!("socket: {e}")),
    };
    if let Some(src) = p.src {
        if let Err(e) = bind_source(&fd, src) {
            return Landing::Failed(format!("bind {src}: {e}"));
        }
    }
    match p.proto {
        Proto::Tcp => match connect_within(&fd, &p.dst, CONNECT_WAIT) {
            Ok(()) => {
                // The connection is established: some listener of the side has it.
                if let Err(e) = nix::unistd::write(&fd, &token) {
                    return Landing::Failed(format!("write: {e}"));
                }
                rec.wait(n, RECORD_WAIT, || None)
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Landing::Refused,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => Landing::NoAnswer,
            Err(e) => Landing::Failed(format!("connect: {e}")),
        },
        Proto::Udp => {
            if let Err(e) = connect_udp(&fd, &p.dst) {
                return Landing::Failed(format!("connect: {e}"));
            }
            if let Err(e) = nix::unistd::write(&fd, &token) {
                return Landing::Failed(format!("send: {e}"));
            }
            rec.wait(n, UDP_WAIT, || {
                pending_error(&fd).map(|e| {
                    if e.kind() == std::io::ErrorKind::ConnectionRefused {
                        Landing::Refused
                    } else {
                        Landing::Failed(format!("send: {e}"))
                    }
                })
            })
        }
    }
}

/// How many threads send a side's outbound probes: a probe that gets no answer holds its
/// thread for [`CONNECT_WAIT`], and some rule sets black-hole a few (Consul's DNAT of every
/// port-53 packet sends loopback-sourced ones out of the pod).
const OUT_THREADS: usize = 3;

/// Runs `probes` against one side: outbound ones on threads in the pod netns, inbound
/// ones on a thread in the node netns, all at once (each probe is told apart by its
/// token). Landings come back in `probes`' order.
pub fn run_all(probes: &[Probe], rec: &Recorder, pod: &Path, node: &Path) -> Vec<Landing> {
    let (out, inb): (Vec<_>, Vec<_>) = probes
        .iter()
        .enumerate()
        .partition(|(_, p)| p.dir == Dir::Out);
    let mut groups: Vec<(&Path, Vec<(usize, &Probe)>)> =
        (0..OUT_THREADS).map(|_| (pod, Vec::new())).collect();
    for (k, p) in out.into_iter().enumerate() {
        groups[k % OUT_THREADS].1.push(p);
    }
    groups.push((node, inb));
    let results: Vec<Vec<(usize, Landing)>> = std::thread::scope(|s| {
        let handles: Vec<_> = groups
            .iter()
            .map(|(ns, list)| {
                s.spawn(move || {
                    in_netns(ns, || {
                        list.iter()
                            .map(|(i, p)| (*i, run_one_settled(*i as u32, p, rec)))
                            .collect::<Vec<_>>()
                    })
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut all: Vec<Option<Landing>> = vec![None; probes.len()];
    for (i, l) in results.into_iter().flatten() {
        all[i] = Some(l);
    }
    all.into_iter()
        .map(|l| l.expect("every probe ran"))
        .collect()
}

//! The checker's real connection from inside a sandbox — written here, sharing no code
//! with interlock's own probe.
//!
//! A [`ProbeServer`] listens in the host's network namespace; the sandboxes reach it at
//! their bridge's gateway. From inside a sandbox's netns the checker connects to it:
//!
//! - the server accepts a connection from exactly the probe's local address: the packet
//!   left the sandbox unredirected ([`Verdict::Direct`]);
//! - the connection is refused, or accepted by something that is not the server: the
//!   sandbox redirected it to a local port (nothing listens on the proxy port in a pause
//!   sandbox, so the redirect ends in a reset) ([`Verdict::Captured`]);
//! - anything else (timeout, no route, the netns gone) proves nothing
//!   ([`Verdict::NoConnection`]).
//!
//! The server only ever hears from the soak's own sandboxes; nothing is sent anywhere
//! else.

use std::collections::{HashSet, VecDeque};
use std::fs::File;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::ledger::Verdict;

/// How many recent peers the server remembers (a probe looks its own up within a second).
const REMEMBERED_PEERS: usize = 4096;

#[derive(Debug, Default)]
struct Peers {
    set: HashSet<SocketAddr>,
    order: VecDeque<SocketAddr>,
}

/// The server the probes try to reach, on the host.
#[derive(Debug)]
pub struct ProbeServer {
    port: u16,
    peers: Arc<(Mutex<Peers>, Condvar)>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ProbeServer {
    /// Listens on every address of the host's namespace, on a free port.
    pub fn start() -> io::Result<ProbeServer> {
        let listener = TcpListener::bind("0.0.0.0:0")?;
        let port = listener.local_addr()?.port();
        let peers = Arc::new((Mutex::new(Peers::default()), Condvar::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (peers.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("soak-probe-server".into())
            .spawn(move || accept_loop(listener, p, s))?;
        Ok(ProbeServer {
            port,
            peers,
            stop,
            thread: Some(thread),
        })
    }

    /// The port the probes connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// True when a connection from `peer` arrives within `within` (forgotten after).
    fn saw(&self, peer: SocketAddr, within: Duration) -> bool {
        let (lock, cv) = &*self.peers;
        let deadline = Instant::now() + within;
        let mut peers = lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if peers.set.remove(&peer) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            peers = cv
                .wait_timeout(peers, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Connects from inside the netns at `netns` to `gateway:port` and says what
    /// happened; `timeout` bounds the connect and the wait for the server's side each.
    pub fn probe(&self, netns: &Path, gateway: std::net::Ipv4Addr, timeout: Duration) -> Verdict {
        let target = SocketAddr::from((gateway, self.port));
        match connect_from(netns, target, timeout) {
            Ok(local) if self.saw(local, timeout) => Verdict::Direct,
            // Connected, but not to us: something inside the sandbox took it.
            Ok(_) => Verdict::Captured,
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Verdict::Captured,
            Err(_) => Verdict::NoConnection,
        }
    }
}

impl Drop for ProbeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept.
        let _ = TcpStream::connect_timeout(
            &SocketAddr::from(([127, 0, 0, 1], self.port)),
            Duration::from_secs(1),
        );
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: TcpListener, peers: Arc<(Mutex<Peers>, Condvar)>, stop: Arc<AtomicBool>) {
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = conn else { continue };
        let Ok(peer) = stream.peer_addr() else {
            continue;
        };
        drop(stream);
        let (lock, cv) = &*peers;
        let mut p = lock.lock().unwrap_or_else(|e| e.into_inner());
        if p.set.insert(peer) {
            p.order.push_back(peer);
        }
        while p.order.len() > REMEMBERED_PEERS {
            if let Some(old) = p.order.pop_front() {
                p.set.remove(&old);
            }
        }
        cv.notify_all();
    }
}

/// Connects to `target` from inside the netns file `netns` on a thread of its own (the
/// caller's namespace never changes); returns the connection's local address.
pub fn connect_from(netns: &Path, target: SocketAddr, timeout: Duration) -> io::Result<SocketAddr> {
    let ns = File::open(netns)?;
    std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(io::Error::from)?;
            let stream = TcpStream::connect_timeout(&target, timeout)?;
            stream.local_addr()
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the probe thread panicked")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use interlock_testkit::{require_root, Netns};
    use std::net::Ipv4Addr;

    /// A netns joined to the host by a veth pair: host side 10.96.<n>.1, netns side .2.
    struct Linked {
        ns: Netns,
        host_if: String,
        host_ip: Ipv4Addr,
    }

    impl Linked {
        fn new() -> Linked {
            let ns = Netns::new("soakp").unwrap();
            let host_if = interlock_testkit::unique("sp");
            let peer = interlock_testkit::unique("sq");
            let octet = (rand::random::<u8>() % 200) + 20;
            let host_ip = Ipv4Addr::new(10, 96, octet, 1);
            let sh = |args: &[&str]| {
                let st = std::process::Command::new("ip")
                    .args(args)
                    .status()
                    .unwrap();
                assert!(st.success(), "ip {args:?}");
            };
            sh(&[
                "link", "add", &host_if, "type", "veth", "peer", "name", &peer,
            ]);
            sh(&["link", "set", &peer, "netns", ns.name()]);
            sh(&["addr", "add", &format!("{host_ip}/24"), "dev", &host_if]);
            sh(&["link", "set", &host_if, "up"]);
            let pod_ip = format!("10.96.{octet}.2/24");
            ns.exec_ok(&["ip", "addr", "add", &pod_ip, "dev", &peer]);
            ns.exec_ok(&["ip", "link", "set", &peer, "up"]);
            Linked {
                ns,
                host_if,
                host_ip,
            }
        }
    }

    impl Drop for Linked {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip")
                .args(["link", "del", &self.host_if])
                .status();
        }
    }

    #[test]
    fn a_plain_netns_reaches_the_server_directly_and_a_redirect_is_seen_as_captured() {
        require_root!();
        let server = ProbeServer::start().unwrap();
        let l = Linked::new();
        let t = Duration::from_millis(500);
        // The veth pair may take a moment to carry traffic on a busy machine.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mut first = server.probe(&l.ns.path(), l.host_ip, t);
        while first != Verdict::Direct && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            first = server.probe(&l.ns.path(), l.host_ip, t);
        }
        assert_eq!(first, Verdict::Direct);
        // A REDIRECT of all outbound TCP to a port nobody listens on, as a mesh does.
        l.ns.exec_ok(&[
            "nft",
            "add table ip soakt; add chain ip soakt out { type nat hook output priority -100; }; \
             add rule ip soakt out meta l4proto tcp redirect to :15001",
        ]);
        assert_eq!(server.probe(&l.ns.path(), l.host_ip, t), Verdict::Captured);
        // Something listening on the proxy port takes it: still captured, not direct.
        let listener = l.ns.run(|| TcpListener::bind("0.0.0.0:15001")).unwrap();
        assert_eq!(server.probe(&l.ns.path(), l.host_ip, t), Verdict::Captured);
        drop(listener);
        l.ns.exec_ok(&["nft", "delete table ip soakt"]);
        assert_eq!(server.probe(&l.ns.path(), l.host_ip, t), Verdict::Direct);
        // No route to the target: nothing proven.
        l.ns.exec_ok(&[
            "ip",
            "route",
            "add",
            "blackhole",
            &format!("{}/32", l.host_ip),
        ]);
        assert_eq!(
            server.probe(&l.ns.path(), l.host_ip, Duration::from_millis(200)),
            Verdict::NoConnection
        );
        // A netns that does not exist.
        assert_eq!(
            server.probe(Path::new("/var/run/netns/il-none-such"), l.host_ip, t),
            Verdict::NoConnection
        );
    }
}

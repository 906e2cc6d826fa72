//! The meshes' validators, reproduced from what they do (`research/istio.md` §4,
//! `research/linkerd.md` §4): the init containers that fail a pod whose redirection is
//! missing, and that therefore must pass against interlock's rules.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use interlock_redirect::probe::original_dst;
use interlock_redirect::spec::Family;
use nix::sys::socket::{setsockopt, sockopt};

use super::net::{bind_source, client_socket, connect_within, enter, Creds, Proto};

/// Binds a TCP listener on `addr` with the calling thread's credentials set to `creds`
/// (the validator's own user), SO_REUSEADDR and SO_REUSEPORT as istio-validation sets them.
fn listen_as(addr: SocketAddr, creds: Creds) -> std::io::Result<TcpListener> {
    nix::unistd::setfsgid(nix::unistd::Gid::from_raw(creds.gid));
    nix::unistd::setfsuid(nix::unistd::Uid::from_raw(creds.uid));
    let l = (|| {
        let fd = nix::sys::socket::socket(
            if addr.is_ipv6() {
                nix::sys::socket::AddressFamily::Inet6
            } else {
                nix::sys::socket::AddressFamily::Inet
            },
            nix::sys::socket::SockType::Stream,
            nix::sys::socket::SockFlag::SOCK_CLOEXEC,
            None,
        )?;
        setsockopt(&fd, sockopt::ReuseAddr, &true)?;
        setsockopt(&fd, sockopt::ReusePort, &true)?;
        if addr.is_ipv6() {
            setsockopt(&fd, sockopt::Ipv6V6Only, &true)?;
        }
        nix::sys::socket::bind(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            &nix::sys::socket::SockaddrStorage::from(addr),
        )?;
        nix::sys::socket::listen(&fd, nix::sys::socket::Backlog::new(128).expect("backlog"))?;
        let l = TcpListener::from(fd);
        l.set_nonblocking(true)?;
        Ok::<_, std::io::Error>(l)
    })();
    nix::unistd::setfsuid(nix::unistd::Uid::from_raw(0));
    nix::unistd::setfsgid(nix::unistd::Gid::from_raw(0));
    l
}

/// istio-validation (istio.md §4), inside the pod netns at `pod`: as the proxy's UID/GID,
/// listen on loopback at 15001 and 15006; every second, from loopback port 0, connect to
/// 127.0.0.6:15002 (`::6` from `::1` for IPv6); succeed when a listener accepts a
/// connection whose `SO_ORIGINAL_DST` port is 15002; give up after 5 s (the container
/// then exits 126 and the pod is not started).
pub fn istio_validation(pod: &std::path::Path, v6: bool, creds: Creds) -> Result<(), String> {
    super::net::in_netns(pod, || {
        let lo: IpAddr = if v6 { "::1" } else { "127.0.0.1" }.parse().unwrap();
        let target = SocketAddr::new(if v6 { "::6" } else { "127.0.0.6" }.parse().unwrap(), 15002);
        let listeners: Vec<TcpListener> = [15001, 15006]
            .into_iter()
            .filter_map(|p| listen_as(SocketAddr::new(lo, p), creds).ok())
            .collect();
        if listeners.is_empty() {
            return Err("no listener could be bound on 15001 or 15006".into());
        }
        let family = if v6 { Family::V6 } else { Family::V4 };
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut last = String::from("no attempt");
        while Instant::now() < deadline {
            let attempt = client_socket(Proto::Tcp, &target, creds).and_then(|fd| {
                bind_source(&fd, lo)?;
                connect_within(&fd, &target, Duration::from_secs(1))?;
                Ok(fd)
            });
            match attempt {
                Ok(fd) => {
                    last = "connected, but no listener saw original port 15002".into();
                    let until = Instant::now() + Duration::from_secs(1);
                    while Instant::now() < until {
                        for l in &listeners {
                            if let Ok((c, _)) = l.accept() {
                                if original_dst(&c, family).is_ok_and(|o| o.port() == 15002) {
                                    return Ok(());
                                }
                            }
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    drop(fd);
                }
                Err(e) => {
                    last = format!("connect {target} from {lo}: {e}");
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
        Err(format!("validation timeout after 5 s (exit 126): {last}"))
    })
}

/// A 63-character alphanumeric token and a newline, as linkerd-network-validator makes.
fn token() -> Vec<u8> {
    const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut x = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        ^ u64::from(std::process::id()) << 32;
    let mut t: Vec<u8> = (0..63)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ALNUM[(x % ALNUM.len() as u64) as usize]
        })
        .collect();
    t.push(b'\n');
    t
}

/// linkerd-network-validator (linkerd.md §4), inside the pod netns at `pod`: as UID/GID
/// 65534, listen on `listen`, answer every connection with a random 64-byte token, connect
/// to `connect` and succeed only when the same token comes back (so the connection was
/// redirected to its own listener); 10 s in all (then it exits 95).
pub fn linkerd_network_validator(
    pod: &std::path::Path,
    listen: SocketAddr,
    connect: SocketAddr,
) -> Result<(), String> {
    let nobody = Creds {
        uid: 65534,
        gid: 65534,
    };
    let token = token();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let server = s.spawn(|| {
            enter(pod);
            let l = match listen_as(listen, nobody) {
                Ok(l) => l,
                Err(e) => {
                    let _ = ready_tx.send(Err(format!("listen {listen}: {e}")));
                    return;
                }
            };
            let _ = ready_tx.send(Ok(()));
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match l.accept() {
                    Ok((mut c, _)) => {
                        let _ = c.set_nonblocking(false);
                        let _ = c.write_all(&token);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        let result = match ready_rx.recv().unwrap_or(Err("server thread died".into())) {
            Err(e) => Err(e),
            Ok(()) => s
                .spawn(|| {
                    enter(pod);
                    let fd = client_socket(Proto::Tcp, &connect, nobody)
                        .map_err(|e| format!("socket: {e}"))?;
                    connect_within(&fd, &connect, Duration::from_secs(10))
                        .map_err(|e| format!("connect {connect}: {e}"))?;
                    let mut c = TcpStream::from(fd);
                    c.set_nonblocking(false).map_err(|e| e.to_string())?;
                    c.set_read_timeout(Some(Duration::from_secs(10)))
                        .map_err(|e| e.to_string())?;
                    let mut got = Vec::new();
                    let mut buf = [0u8; 64];
                    while got.len() < 64 {
                        match c.read(&mut buf[..64 - got.len()]) {
                            Ok(0) => break,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                            Err(e) => return Err(format!("read from {connect}: {e}")),
                        }
                    }
                    if got == token {
                        Ok(())
                    } else {
                        Err(format!(
                            "{connect} answered {} bytes that are not the token (exit 95): not redirected to {listen}",
                            got.len()
                        ))
                    }
                })
                .join()
                .unwrap_or_else(|_| Err("client thread panicked".into())),
        };
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = server.join();
        result
    })
}

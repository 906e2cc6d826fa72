//! Ending a pod's connections with SOCK_DESTROY, for real, between two test pods.
//!
//! Pod A holds every kind of socket the in-place repair meets: an app listener, an inbound
//! connection accepted on it, an outbound connection, a loopback connection, a connection
//! owned by the proxy's UID, and a connected UDP socket. `end_connections` inside A must
//! end exactly the app's non-loopback connections and leave the rest working.

use crate::common::{accept_within, listen, Topology};
use interlock_redirect::sockdiag::{end_connections, list_sockets, Transport};
use interlock_testkit::require_root;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PROXY_UID: u32 = 1337;
const WAIT: Duration = Duration::from_secs(2);

/// True when the connection is dead: a write then a read fails or sees EOF.
fn is_dead(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    if s.write_all(b"x").is_err() {
        return true;
    }
    let mut buf = [0u8; 1];
    match s.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

/// Echoes one byte back on each accepted stream, so `is_dead` can tell a live connection.
fn echo(mut s: TcpStream) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 || s.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    });
}

fn accept(l: &std::net::TcpListener) -> TcpStream {
    let (s, _) = accept_within(l, WAIT).expect("accept");
    s.set_nonblocking(false).unwrap();
    s
}

#[test]
fn app_connections_end_and_listeners_loopback_and_proxy_survive() {
    require_root!();
    let topo = Topology::new();
    let (a, b) = (&topo.a, &topo.b);
    let a_app: SocketAddr = SocketAddr::new(a.v4, 8080);
    let b_srv: SocketAddr = SocketAddr::new(b.v4, 9090);

    let app_listener = listen(&a.ns, "0.0.0.0:8080".parse().unwrap());
    let lo_listener = listen(&a.ns, "127.0.0.1:7070".parse().unwrap());
    let b_listener = listen(&b.ns, "0.0.0.0:9090".parse().unwrap());
    let b_listener6 = listen(&b.ns, "[::]:9091".parse().unwrap());

    // Inbound: B -> A's app; A holds the accepted socket.
    let mut inbound_client =
        b.ns.run(|| TcpStream::connect_timeout(&a_app, WAIT))
            .unwrap();
    let mut inbound_app = accept(&app_listener);
    // Outbound: A -> B, v4 and v6.
    let mut outbound =
        a.ns.run(|| TcpStream::connect_timeout(&b_srv, WAIT))
            .unwrap();
    echo(accept(&b_listener));
    let to6 = SocketAddr::new(b.v6, 9091);
    let mut outbound6 = a.ns.run(|| TcpStream::connect_timeout(&to6, WAIT)).unwrap();
    echo(accept(&b_listener6));
    // Loopback inside A.
    let mut lo =
        a.ns.run(|| TcpStream::connect_timeout(&"127.0.0.1:7070".parse().unwrap(), WAIT))
            .unwrap();
    echo(accept(&lo_listener));
    // Connected UDP from A to B.
    let udp = a.ns.run(|| {
        let u = UdpSocket::bind("0.0.0.0:0").unwrap();
        u.connect(SocketAddr::new(b.v4, 5353)).unwrap();
        u
    });
    // The proxy's own connection: a child process of UID 1337 in A, holding it open.
    let mut proxy = a.ns.run(|| {
        Command::new("bash")
            .arg("-c")
            .arg(format!("exec 3<>/dev/tcp/{}/{} && sleep 5", b.v4, 9090))
            .uid(PROXY_UID)
            .gid(PROXY_UID)
            .stdin(Stdio::null())
            .spawn()
            .expect("bash as the proxy")
    });
    let proxy_conn = accept(&b_listener);
    let deadline = Instant::now() + WAIT;
    while !a
        .ns
        .run(list_sockets)
        .unwrap()
        .iter()
        .any(|s| s.uid == PROXY_UID && s.state == 1)
    {
        assert!(
            Instant::now() < deadline,
            "the proxy's connection never showed up"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        !is_dead(&mut outbound),
        "outbound must be alive before the repair"
    );
    assert!(
        !is_dead(&mut lo),
        "loopback must be alive before the repair"
    );

    let ended =
        a.ns.run(|| end_connections(PROXY_UID))
            .expect("end_connections");

    // Exactly the app's TCP connections (inbound, outbound v4 and v6) and the UDP socket.
    let tcp: Vec<_> = ended
        .ended
        .iter()
        .filter(|s| s.transport == Transport::Tcp)
        .collect();
    let udp_ended: Vec<_> = ended
        .ended
        .iter()
        .filter(|s| s.transport == Transport::Udp)
        .collect();
    assert_eq!(tcp.len(), 3, "ended: {:#?}", ended.ended);
    assert_eq!(udp_ended.len(), 1, "ended: {:#?}", ended.ended);
    assert!(ended.ended.iter().all(|s| s.uid != PROXY_UID));

    assert!(
        is_dead(&mut outbound),
        "the app's outbound connection must be ended"
    );
    assert!(
        is_dead(&mut outbound6),
        "the app's outbound IPv6 connection must be ended"
    );
    assert!(
        is_dead(&mut inbound_app),
        "the app's inbound connection must be ended"
    );
    assert!(
        is_dead(&mut inbound_client),
        "the peer must see the inbound connection end"
    );
    assert!(!is_dead(&mut lo), "loopback connections are kept");
    let err = udp.send(b"x").err().or_else(|| udp.send(b"x").err());
    assert!(err.is_some(), "the connected UDP socket must be ended");

    let left = a.ns.run(list_sockets).unwrap();
    assert!(
        left.iter()
            .any(|s| s.uid == PROXY_UID && s.state == 1 && s.transport == Transport::Tcp),
        "the proxy's connection is kept: {left:#?}"
    );
    assert!(
        left.iter().any(|s| s.state == 10 && s.local.port() == 8080),
        "the app's listener is kept"
    );
    // The listener still accepts.
    let _again =
        b.ns.run(|| TcpStream::connect_timeout(&a_app, WAIT))
            .expect("connect again");
    assert!(
        accept_within(&app_listener, WAIT).is_some(),
        "the app's listener still accepts"
    );

    // Nothing left to end: a second pass ends nothing and is not an error.
    let again = a.ns.run(|| end_connections(PROXY_UID)).unwrap();
    assert!(
        again.ended.iter().all(|s| s.local.port() == 8080),
        "only the new inbound connection may be ended: {:#?}",
        again.ended
    );

    drop(proxy_conn);
    let _ = proxy.kill();
    let _ = proxy.wait();
}

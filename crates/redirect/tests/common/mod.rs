//! A test-owned "node" netns with a bridge and two pod netns (A and B) on it, plus
//! listeners and connections inside them. Everything is torn down on drop.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

use interlock_redirect::netns::in_netns;
use interlock_testkit::Netns;

/// One pod: its netns and addresses.
pub struct Pod {
    pub ns: Netns,
    pub v4: IpAddr,
    pub v6: IpAddr,
}

impl Pod {
    pub fn ip(&self, v6: bool) -> IpAddr {
        if v6 {
            self.v6
        } else {
            self.v4
        }
    }
}

/// node (bridge ilbr0, 10.99.1.1/24 + fd99:1::1/64) with pods A (.2) and B (.3).
pub struct Topology {
    pub a: Pod,
    pub b: Pod,
    pub gw4: IpAddr,
    pub gw6: IpAddr,
    // Dropped last: pods first, then the node (and its bridge).
    pub node: Netns,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Topology {
    pub fn new() -> Topology {
        let node = Netns::new("node").unwrap();
        let n = node.name().to_string();
        ip(&["-n", &n, "link", "add", "ilbr0", "type", "bridge"]);
        ip(&["-n", &n, "addr", "add", "10.99.1.1/24", "dev", "ilbr0"]);
        ip(&[
            "-n",
            &n,
            "addr",
            "add",
            "fd99:1::1/64",
            "dev",
            "ilbr0",
            "nodad",
        ]);
        ip(&["-n", &n, "link", "set", "ilbr0", "up"]);
        let mk = |tag: &str, host: u8| -> Pod {
            let ns = Netns::new(tag).unwrap();
            let p = ns.name().to_string();
            let veth = format!("ilv{tag}");
            ip(&[
                "-n", &n, "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &p,
            ]);
            ip(&["-n", &n, "link", "set", &veth, "master", "ilbr0", "up"]);
            ip(&[
                "-n",
                &p,
                "addr",
                "add",
                &format!("10.99.1.{host}/24"),
                "dev",
                "eth0",
            ]);
            ip(&[
                "-n",
                &p,
                "addr",
                "add",
                &format!("fd99:1::{host}/64"),
                "dev",
                "eth0",
                "nodad",
            ]);
            ip(&["-n", &p, "link", "set", "eth0", "up"]);
            ip(&["-n", &p, "route", "add", "default", "via", "10.99.1.1"]);
            ip(&[
                "-n",
                &p,
                "-6",
                "route",
                "add",
                "default",
                "via",
                "fd99:1::1",
            ]);
            Pod {
                ns,
                v4: format!("10.99.1.{host}").parse().unwrap(),
                v6: format!("fd99:1::{host}").parse().unwrap(),
            }
        };
        let a = mk("a", 2);
        let b = mk("b", 3);
        Topology {
            a,
            b,
            gw4: "10.99.1.1".parse().unwrap(),
            gw6: "fd99:1::1".parse().unwrap(),
            node,
        }
    }

    pub fn gateways(&self) -> Vec<IpAddr> {
        vec![self.gw4, self.gw6]
    }
}

/// A non-blocking listener bound inside `ns`.
pub fn listen(ns: &Netns, addr: SocketAddr) -> TcpListener {
    let l = in_netns(&ns.path(), || TcpListener::bind(addr))
        .unwrap()
        .unwrap_or_else(|e| panic!("bind {addr} in {}: {e}", ns.name()));
    l.set_nonblocking(true).unwrap();
    l
}

/// Waits up to `within` for a connection on `l`.
pub fn accept_within(l: &TcpListener, within: Duration) -> Option<(TcpStream, SocketAddr)> {
    let deadline = Instant::now() + within;
    loop {
        match l.accept() {
            Ok(c) => return Some(c),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
}

/// Connects from inside `ns` as root; returns the connection's local address.
pub fn connect_as_root(ns: &Netns, to: SocketAddr) -> SocketAddr {
    in_netns(&ns.path(), || {
        let s = TcpStream::connect_timeout(&to, Duration::from_secs(2))
            .unwrap_or_else(|e| panic!("connect {to} from {}: {e}", ns.name()));
        let local = s.local_addr().unwrap();
        // Keep the socket open until the peer accepted: leak it into a short-lived thread.
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(500));
            drop(s);
        });
        local
    })
    .unwrap()
}

/// Connects from inside `ns` in a child process running as `uid`/`gid`; true when the
/// connection was established.
pub fn connect_as(ns: &Netns, uid: u32, gid: u32, to: SocketAddr) -> bool {
    let target = format!("/dev/tcp/{}/{}", to.ip(), to.port());
    in_netns(&ns.path(), || {
        Command::new("bash")
            .arg("-c")
            .arg(format!("exec 3<>{target} && sleep 0.3"))
            .uid(uid)
            .gid(gid)
            .output()
            .unwrap()
            .status
            .success()
    })
    .unwrap()
}

/// `iptables-save -t nat` of both families and flavours plus `nft list ruleset`, inside `ns`.
pub fn all_rules(ns: &Netns) -> String {
    let mut s = String::new();
    for tool in [
        "iptables-nft-save",
        "ip6tables-nft-save",
        "iptables-legacy-save",
        "ip6tables-legacy-save",
    ] {
        s.push_str(&ns.exec_ok(&[tool, "-t", "nat"]));
    }
    s.push_str(&ns.exec_ok(&["nft", "list", "ruleset"]));
    s
}

pub fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

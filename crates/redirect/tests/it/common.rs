//! A test-owned "node" netns with a bridge and two pod netns (A and B) on it, plus
//! listeners and connections inside them. Everything is torn down on drop.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::process::Command;

pub use interlock_testkit::traffic::*;
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

pub fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

//! One closed "side" of a comparison: a node netns with a bridge and one pod netns on it,
//! with the same addresses on every side, and nothing beyond them.
//!
//! The node has no uplink and no default route. Instead of forwarding, it answers every
//! TCP connection and UDP datagram the pod sends towards any address (the gateway, a
//! documentation address, 1.1.1.1 …) itself: an nftables `tproxy` rule in its prerouting
//! hook hands each such packet, unchanged, to a transparent listener of the test
//! ([`NODE_CATCH_PORT`]), whose local address is the destination the packet carried. So a
//! pod's connection that leaves the pod is recorded with that destination, and none of
//! the test's packets can go anywhere but the test's own namespaces. Replies to the
//! node's own connections (the inbound probes) are left alone (`ct direction original`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::process::{Command, Stdio};

use interlock_testkit::Netns;

/// The pod's IPv4 address (on `eth0`, /24).
pub const POD4: Ipv4Addr = Ipv4Addr::new(10, 99, 1, 2);
/// The node's IPv4 address on the bridge: the pod's gateway.
pub const GW4: Ipv4Addr = Ipv4Addr::new(10, 99, 1, 1);
/// The pod's IPv6 address (on `eth0`, /64).
pub const POD6: Ipv6Addr = Ipv6Addr::new(0xfd99, 1, 0, 0, 0, 0, 0, 2);
/// The node's IPv6 address on the bridge: the pod's IPv6 gateway.
pub const GW6: Ipv6Addr = Ipv6Addr::new(0xfd99, 1, 0, 0, 0, 0, 0, 1);
/// The prefix length of the pod's on-link IPv4 network.
pub const NET4_LEN: u8 = 24;
/// The prefix length of the pod's on-link IPv6 network.
pub const NET6_LEN: u8 = 64;
/// The port of the node's transparent catch-all listeners (TCP and UDP, both families).
pub const NODE_CATCH_PORT: u16 = 9999;

/// The pod's address of a family.
pub fn pod_ip(v6: bool) -> IpAddr {
    if v6 {
        POD6.into()
    } else {
        POD4.into()
    }
}

/// The node's (gateway) address of a family.
pub fn gw_ip(v6: bool) -> IpAddr {
    if v6 {
        GW6.into()
    } else {
        GW4.into()
    }
}

/// True when `ip` is on the pod's link (the bridge network of its family): a connection to
/// such an address that is neither the pod nor the gateway would wait for a neighbour
/// that never answers.
pub fn on_link(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => u32::from(a) >> (32 - NET4_LEN) == u32::from(GW4) >> (32 - NET4_LEN),
        IpAddr::V6(a) => u128::from(a) >> (128 - NET6_LEN) == u128::from(GW6) >> (128 - NET6_LEN),
    }
}

/// What the node of a side offers besides the bridge.
#[derive(Debug, Clone, Default)]
pub struct NodeSetup {
    /// Extra local addresses (on the node's `lo`) to source inbound connections from.
    pub extra_addrs: Vec<IpAddr>,
    /// Hand every TCP connection and UDP datagram from the pod to the catch-all.
    pub catch_all: bool,
}

/// A node netns and a pod netns, torn down on drop.
pub struct Side {
    /// The pod's netns (dropped first).
    pub pod: Netns,
    /// The node's netns.
    pub node: Netns,
}

/// Runs `ip -n <ns> -batch -` with `lines` on stdin, panicking with ip's stderr on failure.
fn ip_batch(ns: &Netns, lines: &[String]) {
    run_stdin(
        Command::new("ip").args(["-n", ns.name(), "-batch", "-"]),
        &lines.join("\n"),
        &format!("ip -n {} -batch", ns.name()),
    );
}

/// Runs `cmd` with `input` on stdin; panics naming `what` with its stderr when it fails.
pub fn run_stdin(cmd: &mut Command, input: &str, what: &str) {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .unwrap_or_else(|e| panic!("{what}: writing stdin: {e}"));
    let out = child.wait_with_output().expect("wait");
    assert!(
        out.status.success(),
        "{what} failed: {}\ninput:\n{input}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Side {
    /// Builds the node (bridge `br0` with the gateway addresses, `setup`'s addresses and
    /// catch-all) and the pod (`eth0` with [`POD4`]/[`POD6`], default routes via the
    /// gateways).
    pub fn new(setup: &NodeSetup) -> Side {
        let node = Netns::new("pnode").expect("node netns");
        let pod = Netns::new("ppod").expect("pod netns");
        let mut lines = vec![
            "link add br0 type bridge forward_delay 0 stp_state 0".to_string(),
            format!("addr add {GW4}/{NET4_LEN} dev br0"),
            format!("addr add {GW6}/{NET6_LEN} dev br0 nodad"),
            "link set br0 up".to_string(),
            format!(
                "link add vpod type veth peer name eth0 netns {}",
                pod.name()
            ),
            "link set vpod master br0 up".to_string(),
        ];
        for a in &setup.extra_addrs {
            let len = if a.is_ipv4() { 32 } else { 128 };
            lines.push(format!("addr add {a}/{len} dev lo"));
        }
        if setup.catch_all {
            // Packets the tproxy rule marks are delivered locally whatever their address.
            lines.extend([
                "rule add fwmark 1 lookup 100".to_string(),
                "route add local 0.0.0.0/0 dev lo table 100".to_string(),
                "route add local ::/0 dev lo table 100".to_string(),
            ]);
        }
        ip_batch(&node, &lines);
        if setup.catch_all {
            // A batch line cannot carry `-6`, and `ip rule` needs it for IPv6.
            let out = Command::new("ip")
                .args([
                    "-n",
                    node.name(),
                    "-6",
                    "rule",
                    "add",
                    "fwmark",
                    "1",
                    "lookup",
                    "100",
                ])
                .output()
                .expect("ip -6 rule");
            assert!(
                out.status.success(),
                "ip -6 rule add: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        ip_batch(
            &pod,
            &[
                format!("addr add {POD4}/{NET4_LEN} dev eth0"),
                format!("addr add {POD6}/{NET6_LEN} dev eth0 nodad"),
                "link set eth0 up".to_string(),
                format!("route add default via {GW4}"),
                format!("route add default via {GW6}"),
            ],
        );
        if setup.catch_all {
            // br_netfilter (built in here) would run the inet hooks while the frame is still
            // being bridged, before it is handed up to the node: tproxy would assign the
            // socket there and the local delivery after it would not find it.
            super::net::in_netns(&node.path(), || {
                for f in ["bridge-nf-call-iptables", "bridge-nf-call-ip6tables"] {
                    let p = format!("/proc/sys/net/bridge/{f}");
                    if std::path::Path::new(&p).exists() {
                        std::fs::write(&p, "0").unwrap_or_else(|e| panic!("write {p}: {e}"));
                    }
                }
            });
            let rules = format!(
                "table inet parity_catch {{\n chain pre {{\n  type filter hook prerouting priority mangle; policy accept;\n  iifname \"br0\" ct direction original meta l4proto {{ tcp, udp }} tproxy to :{NODE_CATCH_PORT} meta mark set 1 accept\n }}\n}}\n"
            );
            run_stdin(
                Command::new("ip").args(["netns", "exec", node.name(), "nft", "-f", "-"]),
                &rules,
                "nft catch-all in the node",
            );
        }
        Side { pod, node }
    }
}

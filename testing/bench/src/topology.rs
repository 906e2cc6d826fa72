//! The benchmark's throwaway network: a "node" netns with a bridge that is every pod's
//! gateway, and pools of pod netns wired to it.
//!
//! Each pod netns gets `eth0` (a veth whose peer is on the node's bridge), an IPv4 and an
//! IPv6 address and default routes via the node, so the probe has a real gateway to aim
//! at. Pools are created in bulk (a handful of `ip -batch` calls) before the samples that
//! use them, so netns creation is never inside a measurement. Everything is named `il…`
//! and deleted on drop; addresses are in 10.99.0.0/16 and fd99:be::/64, inside the node
//! netns the benchmark owns, so no packet can leave it.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use interlock_testkit::Netns;

use crate::BenchError;

/// The node's (gateway's) IPv4 address on the bridge (prefix /16).
pub const GATEWAY_V4: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
/// The node's (gateway's) IPv6 address on the bridge (prefix /64).
pub const GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0xfd99, 0xbe, 0, 0, 0, 0, 0, 1);

/// The test-owned node netns: a bridge holding both gateway addresses.
#[derive(Debug)]
pub struct Node {
    ns: Netns,
    bridge: String,
    next: AtomicU32,
}

/// One pod netns on the node's bridge, deleted (with its veth) on drop.
#[derive(Debug)]
pub struct Pod {
    ns: Netns,
    /// The pod's IPv4 address.
    pub v4: Ipv4Addr,
    /// The pod's IPv6 address.
    pub v6: Ipv6Addr,
}

impl Pod {
    /// The netns file, as a runtime passes it in `CNI_NETNS`.
    pub fn path(&self) -> PathBuf {
        self.ns.path()
    }

    /// The netns name.
    pub fn name(&self) -> &str {
        self.ns.name()
    }

    /// Runs a command inside the pod netns.
    pub fn exec(&self, argv: &[&str]) -> std::process::Output {
        self.ns.exec(argv)
    }
}

/// The node's NAT rules: the pods' traffic leaving the node other than through the
/// bridge is masqueraded, for both families, as the `bridge` plugin's `ipMasq` does on a
/// node (and kube-proxy's NAT tables are there on every Kubernetes node). Nothing leaves
/// the node netns here; what matters for the figures is that, as on every node, NAT hooks
/// stay registered while pod netns come and go. Without them, the first NAT chain after
/// every pod netns was torn down turned the kernel's NAT hooks back on (a static key:
/// kernel text patched on every CPU), which a node never pays: the concurrent N = 1 level,
/// one ADD per round, read 1.44 ms per ADD instead of 1.05.
const NODE_NAT: &str = "table ip ilbench_node {
  chain postrouting {
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr 10.99.0.0/16 oifname != \"BRIDGE\" masquerade
  }
}
table ip6 ilbench_node {
  chain postrouting {
    type nat hook postrouting priority srcnat; policy accept;
    ip6 saddr fd99:be::/64 oifname != \"BRIDGE\" masquerade
  }
}
";

/// Loads an nftables script into `netns` (`nft -f -` inside it).
fn nft_script(netns: &str, script: &str) -> Result<(), BenchError> {
    feed(
        &["ip", "netns", "exec", netns, "nft", "-f", "-"],
        &format!("`nft -f -` in {netns}"),
        script,
    )
}

fn ip_batch(netns: &str, script: &str) -> Result<(), BenchError> {
    feed(
        &["ip", "-n", netns, "-batch", "-"],
        &format!("`ip -n {netns} -batch -`"),
        script,
    )
}

/// Runs `argv` with `script` on its stdin; `what` names it in errors.
fn feed(argv: &[&str], what: &str, script: &str) -> Result<(), BenchError> {
    let mut child = Command::new(argv[0])
        .args(&argv[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| BenchError::Setup(format!("starting {what}: {e}")))?;
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(script.as_bytes())
        .map_err(|e| BenchError::Setup(format!("writing to {what}: {e}")))?;
    let out = child
        .wait_with_output()
        .map_err(|e| BenchError::Setup(format!("waiting for {what}: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(BenchError::Setup(format!(
            "{what} failed: {}\nscript:\n{script}",
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

impl Node {
    /// Creates the node netns and its bridge with both gateway addresses, and the
    /// node's NAT rules (`NODE_NAT`).
    pub fn new() -> Result<Node, BenchError> {
        let ns = Netns::new("bnode")
            .map_err(|e| BenchError::Setup(format!("creating the node netns: {e}")))?;
        let bridge = "ilbenchbr0".to_string();
        ip_batch(
            ns.name(),
            &format!(
                "link add {bridge} type bridge\n\
                 addr add {GATEWAY_V4}/16 dev {bridge}\n\
                 addr add {GATEWAY_V6}/64 dev {bridge} nodad\n\
                 link set {bridge} up\n"
            ),
        )?;
        nft_script(ns.name(), &NODE_NAT.replace("BRIDGE", &bridge))?;
        Ok(Node {
            ns,
            bridge,
            next: AtomicU32::new(0),
        })
    }

    /// The node netns name.
    pub fn name(&self) -> &str {
        self.ns.name()
    }

    /// The pods' gateways (the node), IPv4 first: the probe's candidate destinations.
    pub fn gateways(&self) -> Vec<IpAddr> {
        vec![IpAddr::V4(GATEWAY_V4), IpAddr::V6(GATEWAY_V6)]
    }

    /// Creates `n` pod netns, each with `eth0` on the bridge, dual-stack addresses and
    /// default routes via the node.
    pub fn pods(&self, n: usize) -> Result<Vec<Pod>, BenchError> {
        let mut pods = Vec::with_capacity(n);
        let mut veths = Vec::with_capacity(n);
        for _ in 0..n {
            let ns = Netns::new("bp")
                .map_err(|e| BenchError::Setup(format!("creating a pod netns: {e}")))?;
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            // 10.99.1.2 … 10.99.250.251; fd99:be::2 … (250 × 250 pods before wrapping).
            let slot = i % (250 * 250);
            let v4 = Ipv4Addr::new(10, 99, 1 + (slot / 250) as u8, 2 + (slot % 250) as u8);
            let v6 = Ipv6Addr::from(u128::from(GATEWAY_V6) + 1 + u128::from(slot) + 1);
            veths.push(format!("ilbv{i:08x}"));
            pods.push(Pod { ns, v4, v6 });
        }
        let mut node_script = String::new();
        for (pod, veth) in pods.iter().zip(&veths) {
            node_script.push_str(&format!(
                "link add {veth} type veth peer name eth0 netns {}\nlink set {veth} master {} up\n",
                pod.name(),
                self.bridge
            ));
        }
        if !pods.is_empty() {
            ip_batch(self.ns.name(), &node_script)?;
        }
        for pod in &pods {
            ip_batch(
                pod.name(),
                &format!(
                    "addr add {}/16 dev eth0\n\
                     addr add {}/64 dev eth0 nodad\n\
                     link set eth0 up\n\
                     route add default via {GATEWAY_V4}\n\
                     route add default via {GATEWAY_V6}\n",
                    pod.v4, pod.v6
                ),
            )?;
        }
        Ok(pods)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_keeps_nat_hooks_as_a_real_node_does() {
        interlock_testkit::require_root!();
        let node = Node::new().unwrap();
        let out = node.ns.exec(&["nft", "list", "ruleset"]);
        let text = String::from_utf8_lossy(&out.stdout);
        for want in [
            "table ip ilbench_node",
            "table ip6 ilbench_node",
            "type nat hook postrouting priority srcnat; policy accept;",
            "ip saddr 10.99.0.0/16 oifname != \"ilbenchbr0\" masquerade",
            "ip6 saddr fd99:be::/64 oifname != \"ilbenchbr0\" masquerade",
        ] {
            assert!(text.contains(want), "missing {want:?} in:\n{text}");
        }
    }
}

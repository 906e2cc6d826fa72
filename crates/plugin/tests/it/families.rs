//! Every address family a meshed pod can use is redirected, whatever families the
//! primary's result lists (issue 7 item 1). With an IPv4-only result the pod still has an
//! IPv6 link-local address on its veth, and may get a global IPv6 address the primary
//! never listed; with an IPv6-only result an IPv4 address may appear later. Real
//! connections between the pod and its node (the bridge's netns) must land on the
//! proxy's ports (or be refused), never on the app or the peer.

use std::net::{IpAddr, SocketAddr, SocketAddrV6};
use std::time::Duration;

use crate::common::*;
use interlock_redirect::probe::original_dst;
use interlock_testkit::require_root;
use serde_json::{json, Value};

/// The probe lines of a protected attachment, whose recorded spec programs both families.
fn probe_lines(n: &Node, pod: &Pod) -> Vec<String> {
    let s = n
        .state_of(&pod.rt)
        .unwrap_or_else(|| panic!("no state\n{}", n.log()));
    let p = &s["protection"];
    assert_eq!(p["protection"], "protected", "{s}");
    let spec: Value = serde_json::from_str(p["spec"].as_str().unwrap()).unwrap();
    assert_eq!(
        (spec["ipv4"].as_bool(), spec["ipv6"].as_bool()),
        (Some(true), Some(true)),
        "{spec}"
    );
    p["probe"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap().to_string())
        .collect()
}

/// Asserts that a probe line starts with `prefix` (and contains `also`).
fn assert_line(probe: &[String], prefix: &str, also: &str) {
    assert!(
        probe
            .iter()
            .any(|l| l.starts_with(prefix) && l.contains(also)),
        "no line {prefix:?}: {probe:?}"
    );
}

fn ip(ns: &interlock_testkit::Netns, args: &[&str]) {
    let mut argv = vec!["ip"];
    argv.extend_from_slice(args);
    ns.exec_ok(&argv);
}

/// The app port and the inbound proxy port listening in `pod` (dual-stack sockets).
struct Inbound {
    app: std::net::TcpListener,
    proxy: std::net::TcpListener,
}

impl Inbound {
    fn new(pod: &Pod) -> Inbound {
        Inbound {
            app: listen(&pod.ns, any(true, 8082)),
            proxy: listen(&pod.ns, any(true, ISTIO.inbound)),
        }
    }

    /// A connection from `peer` to `to` (the pod's app port) lands on the inbound proxy
    /// port with `to` as original destination, and never on the app.
    fn assert_captured(&self, peer: &interlock_testkit::Netns, to: SocketAddr, v6: bool) {
        let connected = try_connect(peer, to, WAIT);
        let landed = accept_within(&self.proxy, if connected { WAIT } else { Duration::ZERO });
        assert!(
            accept_within(&self.app, Duration::ZERO).is_none(),
            "{to}: reached the app, past the proxy"
        );
        let (c, _) = landed.unwrap_or_else(|| panic!("{to}: neither captured nor refused"));
        let dst = original_dst(&c, family(v6)).unwrap();
        assert_eq!((dst.ip(), dst.port()), (to.ip(), to.port()));
    }
}

/// The pod's outbound connection to `to` (a listener in `peer`) lands on the outbound
/// proxy port, or is refused; it never reaches the peer.
fn assert_outbound_captured(
    pod: &Pod,
    peer: &interlock_testkit::Netns,
    to: SocketAddr,
    v6: bool,
    must_land: bool,
) {
    let peer_l = listen(peer, any(true, to.port()));
    let proxy = listen(&pod.ns, loopback(v6, ISTIO.outbound));
    try_connect(&pod.ns, to, Duration::from_secs(1));
    assert!(
        accept_within(&peer_l, Duration::from_millis(300)).is_none(),
        "{to}: the meshed pod reached its peer directly"
    );
    match accept_within(&proxy, Duration::ZERO) {
        Some((c, _)) => {
            let dst = original_dst(&c, family(v6)).unwrap();
            assert_eq!((dst.ip(), dst.port()), (to.ip(), to.port()));
        }
        None => assert!(!must_land, "{to}: not captured at the outbound proxy port"),
    }
}

/// An IPv4-only result: both families are programmed; IPv6 link-local in both
/// directions and a global IPv6 address added afterwards are captured.
fn ipv4_only_result(backend: &str) {
    let n = Node::new(false);
    let chain = n.chain(json!({ "backend": backend }));
    let only = n.only_interlock(&chain);
    let a = n.add(&chain, "a", Some(ISTIO.annotations()));
    assert!(a
        .result
        .ips_on("eth0")
        .iter()
        .all(|c| c.ip().is_some_and(|i| i.is_ipv4())));
    let probe = probe_lines(&n, &a);
    assert_line(
        &probe,
        "IPv4: connection to 10.99.7.1:9 landed on 127.0.0.1:15001",
        "",
    );
    assert_line(
        &probe,
        "IPv6: routed only link-locally (via eth0)",
        "captured and dropped",
    );

    wait_dad(&a.ns);
    wait_dad(&n.node);
    let inbound = Inbound::new(&a);

    // The node reaches the pod's link-local address: captured at the inbound port.
    let a_ll = link_local(&a.ns, "eth0");
    let to = SocketAddr::V6(SocketAddrV6::new(
        a_ll,
        8082,
        0,
        ifindex(&n.node, &n.bridge),
    ));
    inbound.assert_captured(&n.node, to, true);

    // The pod reaches the node's link-local address: captured (and, as a redirected
    // link-local connection cannot reach the proxy, dropped), never delivered.
    let br_ll = link_local(&n.node, &n.bridge);
    let to = SocketAddr::V6(SocketAddrV6::new(br_ll, 8081, 0, ifindex(&a.ns, "eth0")));
    assert_outbound_captured(&a, &n.node, to, true, false);

    // A global IPv6 address the primary never listed, with a default route.
    ip(
        &n.node,
        &["addr", "add", "fd99:8::1/64", "dev", &n.bridge, "nodad"],
    );
    ip(
        &a.ns,
        &["addr", "add", "fd99:8::2/64", "dev", "eth0", "nodad"],
    );
    ip(
        &a.ns,
        &["-6", "route", "add", "default", "via", "fd99:8::1"],
    );
    let a6: IpAddr = "fd99:8::2".parse().unwrap();
    inbound.assert_captured(&n.node, SocketAddr::new(a6, 8082), true);
    let node6: IpAddr = "fd99:8::1".parse().unwrap();
    assert_outbound_captured(&a, &n.node, SocketAddr::new(node6, 8081), true, true);
    // And IPv4 as usual.
    inbound.assert_captured(&n.node, SocketAddr::new(a.ip(false), 8082), false);
    drop(inbound);

    // A repeated ADD now proves IPv6 with a real connection through that default route.
    n.readd(&only, &a)
        .unwrap_or_else(|e| panic!("{e}\n{}", n.log()));
    let probe = probe_lines(&n, &a);
    assert_line(
        &probe,
        "IPv6: connection to [fd99:8::1]:9 landed on [::1]:15001",
        "",
    );
    n.check(&only, &a).unwrap();
    n.del(&chain, &a).unwrap();
    assert_no_interlock_rules(&a.ns);
}

/// An IPv6-only result: IPv4 has no route at ADD (proven by a failed attempt), is
/// programmed anyway, and an IPv4 address added later is captured both ways.
fn ipv6_only_result(backend: &str) {
    let n = Node::with_families(false, true);
    let chain = n.chain(json!({ "backend": backend }));
    let only = n.only_interlock(&chain);
    let a = n.add(&chain, "a", Some(ISTIO.annotations()));
    assert_eq!(a.families(), vec![true]);
    let probe = probe_lines(&n, &a);
    assert_line(
        &probe,
        "IPv4: no route: a connection attempt to 192.0.2.1:9 failed",
        "",
    );
    assert_line(
        &probe,
        "IPv6: connection to [fd99:7::1]:9 landed on [::1]:15001",
        "",
    );
    wait_dad(&a.ns);
    wait_dad(&n.node);
    let inbound = Inbound::new(&a);
    inbound.assert_captured(&n.node, SocketAddr::new(a.ip(true), 8082), true);
    let node6: IpAddr = "fd99:7::1".parse().unwrap();
    assert_outbound_captured(&a, &n.node, SocketAddr::new(node6, 8081), true, true);

    // IPv4 the primary never listed.
    ip(&n.node, &["addr", "add", "10.99.9.1/24", "dev", &n.bridge]);
    ip(&a.ns, &["addr", "add", "10.99.9.2/24", "dev", "eth0"]);
    ip(&a.ns, &["route", "add", "default", "via", "10.99.9.1"]);
    inbound.assert_captured(&n.node, "10.99.9.2:8082".parse().unwrap(), false);
    assert_outbound_captured(&a, &n.node, "10.99.9.1:8081".parse().unwrap(), false, true);
    drop(inbound);
    n.check(&only, &a).unwrap();
    n.del(&chain, &a).unwrap();
    assert_no_interlock_rules(&a.ns);
}

#[test]
fn ipv4_only_result_nftables() {
    require_root!();
    ipv4_only_result("nftables");
}

#[test]
fn ipv4_only_result_iptables_legacy() {
    require_root!();
    ipv4_only_result("iptables-legacy");
}

#[test]
fn ipv6_only_result_nftables() {
    require_root!();
    ipv6_only_result("nftables");
}

#[test]
fn ipv6_only_result_iptables_nft() {
    require_root!();
    ipv6_only_result("iptables-nft");
}

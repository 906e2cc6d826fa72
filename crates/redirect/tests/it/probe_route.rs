//! The probe refuses a target routed through a macvlan link (its packets would reach the
//! external network, not the node) before sending anything, and still probes through a
//! veth. Everything lives in one test-owned netns: a veth pair (`ilpar`/`ilpeer`), a
//! macvlan `eth0` and a macvtap `ilmvt0` on top of `ilpar`.

use std::collections::BTreeMap;
use std::net::IpAddr;

use interlock_redirect::probe::ProbeError;
use interlock_redirect::route::egress;
use interlock_redirect::{install_and_prove, spec_for, BackendKind, EngineError, ProfileName};
use interlock_testkit::{require_root, Netns};

fn tx_packets(ns: &Netns, dev: &str) -> u64 {
    let text = ns.exec_ok(&[
        "cat",
        &format!("/sys/class/net/{dev}/statistics/tx_packets"),
    ]);
    text.trim().parse().unwrap()
}

#[test]
fn probe_refuses_macvlan_egress_and_accepts_veth() {
    require_root!();
    let ns = Netns::new("mvl").unwrap();
    for argv in [
        &["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"][..],
        &["sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1"],
        &["ip", "link", "set", "lo", "up"],
        &[
            "ip", "link", "add", "ilpar", "type", "veth", "peer", "name", "ilpeer",
        ],
        &[
            "ip", "link", "add", "link", "ilpar", "name", "eth0", "type", "macvlan", "mode",
            "bridge",
        ],
        &[
            "ip", "link", "add", "link", "ilpar", "name", "ilmvt0", "type", "macvtap",
        ],
        &["ip", "addr", "add", "10.99.77.2/24", "dev", "eth0"],
        &["ip", "addr", "add", "10.99.79.2/24", "dev", "ilmvt0"],
        &["ip", "addr", "add", "10.99.78.2/24", "dev", "ilpeer"],
        &["ip", "link", "set", "ilpar", "up"],
        &["ip", "link", "set", "ilpeer", "up"],
        &["ip", "link", "set", "eth0", "up"],
        &["ip", "link", "set", "ilmvt0", "up"],
    ] {
        ns.exec_ok(argv);
    }
    let macvlan_gw: IpAddr = "10.99.77.1".parse().unwrap();
    let veth_gw: IpAddr = "10.99.78.1".parse().unwrap();
    let (via_macvlan, via_veth) = ns.run(|| (egress(macvlan_gw), egress(veth_gw)));
    let via_macvlan = via_macvlan.unwrap().unwrap();
    assert_eq!(
        (via_macvlan.name.as_str(), via_macvlan.kind.as_str()),
        ("eth0", "macvlan")
    );
    assert!(via_macvlan.bypasses_node());
    let via_veth = via_veth.unwrap().unwrap();
    assert_eq!(
        (via_veth.name.as_str(), via_veth.kind.as_str()),
        ("ilpeer", "veth")
    );
    assert!(!via_veth.bypasses_node());
    // A macvtap reports the driver it is built on, macvlan's: refused the same way.
    let via_macvtap = ns
        .run(|| egress("10.99.79.1".parse().unwrap()))
        .unwrap()
        .unwrap();
    assert_eq!(
        (via_macvtap.name.as_str(), via_macvtap.kind.as_str()),
        ("ilmvt0", "macvlan")
    );
    assert!(via_macvtap.bypasses_node());
    // What the check adds to each probe (one socket, two round trips).
    let per_call = ns.run(|| {
        let t = std::time::Instant::now();
        for _ in 0..200 {
            egress(veth_gw).unwrap();
        }
        t.elapsed() / 200
    });
    eprintln!("route + link lookup: {per_call:?} per probe target");

    let ann: BTreeMap<String, String> =
        [("sidecar.istio.io/status".to_string(), "{}".to_string())].into();
    let mut spec = spec_for(
        &interlock_redirect::PodView::with_facts(&ann, &interlock_testkit::pods::injected(&ann)),
        &ProfileName::ALL,
    )
    .unwrap()
    .unwrap()
    .1;
    spec.ipv6 = false;

    // Through the macvlan: refused before any packet, fail closed, rules removed again.
    let before = tx_packets(&ns, "eth0");
    let e = install_and_prove(&ns.path(), &spec, BackendKind::Nftables, &[macvlan_gw]).unwrap_err();
    let EngineError::Probe {
        source: ProbeError::LeavesNode { via, target },
        cleanup,
        ..
    } = &e
    else {
        panic!("{e}")
    };
    assert_eq!((via.name.as_str(), via.kind.as_str()), ("eth0", "macvlan"));
    assert_eq!(target.ip(), macvlan_gw);
    assert!(cleanup.is_none(), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("refusing to probe 10.99.77.1") && text.contains("macvlan"),
        "{text}"
    );
    assert_eq!(
        tx_packets(&ns, "eth0"),
        before,
        "the probe sent something on the macvlan"
    );
    let rules = ns.exec_ok(&["nft", "list", "ruleset"]);
    assert!(!rules.contains("interlock"), "{rules}");

    // Through the veth: probed and proven as usual.
    let p = install_and_prove(&ns.path(), &spec, BackendKind::Nftables, &[veth_gw]).unwrap();
    assert_eq!(p.probe.proven.len(), 1);
    assert_eq!(p.probe.proven[0].target.ip(), veth_gw);
}

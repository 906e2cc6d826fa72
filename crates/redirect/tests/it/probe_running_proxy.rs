//! The probe of a pod whose proxy already runs (the agent's in-place repair): a listener
//! of the proxy's UID owns the outbound port inside pod A, so the probe cannot bind it.
//! With `ProxyPort::MaybeTaken` it proves capture by finding its connection's server
//! side on that listener (sock_diag), fails closed when the rules are missing, and CNI
//! ADD's mode (`ProxyPort::Free`) still refuses the taken port.

use std::net::SocketAddr;
use std::time::Duration;

use crate::common::*;
use interlock_contract::codes::Step;
use interlock_redirect::netns::in_netns;
use interlock_redirect::probe::{self, original_dst, Evidence, ProbeError, ProxyPort};
use interlock_redirect::spec::Family;
use interlock_redirect::{
    install_and_prove_with, BackendKind, InstallOptions, ProfileName, RedirectSpec,
};
use interlock_testkit::require_root;

const PROXY_UID: u32 = 1337;

fn istio_spec() -> RedirectSpec {
    let ann = annotations(&[("sidecar.istio.io/status", "{}")]);
    let mut spec = interlock_redirect::spec_for(
        &interlock_redirect::PodView::with_facts(&ann, &interlock_testkit::pods::istio_sidecar()),
        &ProfileName::ALL,
    )
    .unwrap()
    .expect("meshed")
    .1;
    spec.ipv4 = true;
    spec.ipv6 = true;
    spec
}

/// Accepts whatever is queued on `l` (the probe's connections, reset by now).
fn drain(l: &std::net::TcpListener) {
    while accept_within(l, Duration::from_millis(50)).is_some() {}
}

#[test]
fn a_running_proxys_listener_proves_capture_without_binding() {
    require_root!();
    let topo = Topology::new();
    let (a, b) = (&topo.a, &topo.b);
    let spec = istio_spec();
    // The proxy: one dual-stack listener on the outbound port (IPv4 connections show as
    // IPv4-mapped there), one on the inbound port.
    let proxy = listen_as(&a.ns.path(), PROXY_UID, "[::]:15001".parse().unwrap());
    let _inbound = listen_as(&a.ns.path(), PROXY_UID, "[::]:15006".parse().unwrap());
    let taken = InstallOptions {
        proxy_port: ProxyPort::MaybeTaken,
        ..InstallOptions::default()
    };

    // No rules: the probe's connection goes to the gateway, not to the listener.
    let e = in_netns(&a.ns.path(), || {
        probe::probe_with(
            &spec,
            &[],
            Duration::from_millis(300),
            ProxyPort::MaybeTaken,
        )
    })
    .unwrap()
    .unwrap_err();
    assert!(matches!(e, ProbeError::NotRedirected { .. }), "{e}");
    drain(&proxy);

    // CNI ADD's mode refuses the taken port (and removes its rules again).
    let e = install_and_prove_with(
        &a.ns.path(),
        &spec,
        BackendKind::Nftables,
        &[],
        &InstallOptions::default(),
    )
    .unwrap_err();
    assert_eq!(e.step(), Step::Probe, "{e}");
    assert!(e.to_string().contains("cannot listen"), "{e}");
    assert_no_interlock_rules(&a.ns);

    // The repair's mode: proven through the proxy's listener, for both families, only
    // towards the pod's gateways (the proxy dials the probe's destination).
    let done = install_and_prove_with(&a.ns.path(), &spec, BackendKind::Nftables, &[], &taken)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(done.probe.proven.len(), 2, "{:?}", done.probe);
    for r in &done.probe.proven {
        assert_eq!(
            r.evidence,
            Evidence::ServerSocket { uid: PROXY_UID },
            "{r:?}"
        );
        assert_eq!(r.landed_on.port(), 15001, "{r:?}");
        assert_eq!(r.target.port(), 9, "{r:?}");
        assert!(topo.gateways().contains(&r.target.ip()), "{r:?}");
        assert_eq!(r.original_dst, r.target);
    }
    let lines = done.probe.lines().join("\n");
    assert!(lines.contains("running proxy's listener"), "{lines}");
    drain(&proxy);

    // An app's connection from inside lands on the proxy with its original destination.
    for to in [SocketAddr::new(b.v4, 9090), SocketAddr::new(b.v6, 9090)] {
        let local = connect_as_root(&a.ns, to);
        let (s, peer) = accept_within(&proxy, WAIT).expect("nothing reached the proxy");
        assert_eq!(peer.ip().to_canonical(), local.ip(), "{peer} vs {local}");
        assert_eq!(peer.port(), local.port());
        let family = if to.is_ipv4() { Family::V4 } else { Family::V6 };
        // A dual-stack socket answers SO_ORIGINAL_DST for its IPv4-mapped connections.
        assert_eq!(original_dst(&s, family).unwrap(), to);
    }

    // Per family: with only an IPv4 listener (root's) left on the port, IPv4 is proven
    // through it and IPv6, whose port is free, by the probe's own listener.
    drop(proxy);
    // The sockets the dropped listener accepted close asynchronously; until the last
    // one has, the port may still be taken.
    let _v4_only = a.ns.run(|| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match std::net::TcpListener::bind("127.0.0.1:15001") {
                Ok(l) => break l,
                Err(e)
                    if e.kind() == std::io::ErrorKind::AddrInUse
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => panic!("binding 127.0.0.1:15001 after the proxy went: {e}"),
            }
        }
    });
    let report = in_netns(&a.ns.path(), || {
        probe::probe_with(
            &spec,
            &[],
            Duration::from_millis(300),
            ProxyPort::MaybeTaken,
        )
    })
    .unwrap();
    let report = report.unwrap_or_else(|e| panic!("{e}"));
    let by_family = |f: Family| {
        report
            .proven
            .iter()
            .find(|r| r.family == f)
            .map(|r| r.evidence)
    };
    assert_eq!(
        by_family(Family::V4),
        Some(Evidence::ServerSocket { uid: 0 })
    );
    assert_eq!(by_family(Family::V6), Some(Evidence::OriginalDst));
}

/// containerd runs the loopback plugin alongside the chain, so during ADD the pod's `lo`
/// may come up only after interlock's probe started: the probe waits for the loopback
/// address within its time instead of failing to bind it.
#[test]
fn the_probe_waits_for_the_loopback_interface_to_come_up() {
    require_root!();
    let topo = Topology::new();
    let a = &topo.a;
    let spec = istio_spec();
    // As in a netns whose lo was never up: down, without the loopback addresses (the
    // kernel gives them back when it comes up).
    a.ns.exec_ok(&["ip", "link", "set", "lo", "down"]);
    a.ns.exec_ok(&["ip", "addr", "flush", "dev", "lo"]);
    let ns = a.ns.name().to_string();
    let up = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        let st = std::process::Command::new("ip")
            .args(["-n", &ns, "link", "set", "lo", "up"])
            .status()
            .unwrap();
        assert!(st.success());
    });
    let done = install_and_prove_with(
        &a.ns.path(),
        &spec,
        BackendKind::Nftables,
        &topo.gateways(),
        &InstallOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    up.join().unwrap();
    assert_eq!(done.probe.proven.len(), 2, "{:?}", done.probe);
    assert!(done
        .probe
        .proven
        .iter()
        .all(|r| r.evidence == Evidence::OriginalDst));
}

/// The probe's connections end with a reset: after it, the pod's netns holds no TCP
/// socket at all — none in TIME_WAIT or closing on the proxy's port for the proxy to
/// find when it starts — for both families.
#[test]
fn the_probe_leaves_no_socket_behind() {
    require_root!();
    let topo = Topology::new();
    let a = &topo.a;
    let done = install_and_prove_with(
        &a.ns.path(),
        &istio_spec(),
        BackendKind::Nftables,
        &topo.gateways(),
        &InstallOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(done.probe.proven.len(), 2, "{:?}", done.probe);
    // Any state, listeners included; `-H`: no header line.
    let left = a.ns.exec_ok(&["ss", "-H", "-tan", "state", "all"]);
    assert!(
        left.trim().is_empty(),
        "the probe left TCP sockets in the pod's netns:\n{left}"
    );
}

//! Redirection proven with real traffic between test-owned network namespaces: pod A is
//! protected, pod B and the node are its peers on a bridge.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::common::*;
use interlock_contract::codes::Step;
use interlock_redirect::probe::original_dst;
use interlock_redirect::spec::Family;
use interlock_redirect::{
    check, install_and_prove, remove_rules, BackendKind, ProfileName, RedirectSpec, Removal,
    Verification,
};
use interlock_testkit::require_root;

fn family(v6: bool) -> Family {
    if v6 {
        Family::V6
    } else {
        Family::V4
    }
}

struct Mesh {
    annotations: &'static [(&'static str, &'static str)],
    outbound: u16,
    inbound: u16,
    uid: u32,
    /// GID exempt besides the UID, if the profile sets one.
    gid: Option<u32>,
    excluded_inbound: u16,
}

const ISTIO: Mesh = Mesh {
    annotations: &[(
        "sidecar.istio.io/status",
        "{\"containers\":[\"istio-proxy\"]}",
    )],
    outbound: 15001,
    inbound: 15006,
    uid: 1337,
    gid: Some(1337),
    excluded_inbound: 15021,
};

const LINKERD: Mesh = Mesh {
    annotations: &[("linkerd.io/proxy-version", "stable-2.14.10")],
    outbound: 4140,
    inbound: 4143,
    uid: 2102,
    gid: None,
    excluded_inbound: 4191,
};

const GENERIC: Mesh = Mesh {
    annotations: &[
        ("interlock.dev/redirect", "enabled"),
        ("interlock.dev/proxy-uid", "999"),
        ("interlock.dev/proxy-gid", "998"),
        ("interlock.dev/outbound-port", "7001"),
        ("interlock.dev/inbound-port", "7006"),
        ("interlock.dev/exclude-inbound-ports", "7070-7071"),
    ],
    outbound: 7001,
    inbound: 7006,
    uid: 999,
    gid: Some(998),
    excluded_inbound: 7071,
};

fn spec_for(pairs: &[(&str, &str)]) -> RedirectSpec {
    interlock_redirect::spec_for(
        &interlock_redirect::PodView::with_facts(
            &annotations(pairs),
            &interlock_testkit::pods::injected(&annotations(pairs)),
        ),
        &ProfileName::ALL,
    )
    .unwrap()
    .expect("meshed")
    .1
}

fn mesh_scenario(kind: BackendKind, mesh: &Mesh, v6: bool) {
    let topo = Topology::new();
    let (a, b) = (&topo.a, &topo.b);
    let spec = spec_for(mesh.annotations);

    // ADD: apply, verify, prove.
    let p = install_and_prove(&a.ns.path(), &spec, kind, &topo.gateways()).unwrap();
    assert_eq!(p.backend, kind);
    assert_eq!(p.spec_hash, spec.hash());
    assert_eq!(p.probe.proven.len(), 2, "{:?}", p.probe);
    for r in &p.probe.proven {
        assert_eq!(r.original_dst, r.target);
        assert!(topo.gateways().contains(&r.target.ip()), "{r:?}");
    }

    let out_l = listen(&a.ns, loopback(v6, mesh.outbound));
    let in_l = listen(&a.ns, any(v6, mesh.inbound));
    let b_l = listen(&b.ns, any(v6, 8080));
    let b8080 = SocketAddr::new(b.ip(v6), 8080);
    let a8080 = SocketAddr::new(a.ip(v6), 8080);

    // An app process (root) in A connecting to B:8080 lands on A's outbound proxy port.
    let local = connect_as_root(&a.ns, b8080);
    let (c, peer) = accept_within(&out_l, WAIT).expect("captured connection at the proxy");
    assert_eq!(peer, local);
    assert_eq!(original_dst(&c, family(v6)).unwrap(), b8080);
    assert!(
        accept_within(&b_l, Duration::ZERO).is_none(),
        "B must not see it"
    );

    // The proxy's UID is exempt: the same connection reaches B itself.
    assert!(connect_as(&a.ns, mesh.uid, 5000, b8080));
    assert!(
        accept_within(&b_l, WAIT).is_some(),
        "proxy UID must reach B"
    );
    assert!(accept_within(&out_l, Duration::ZERO).is_none());

    // The proxy's GID is exempt too, when the profile sets one.
    if let Some(gid) = mesh.gid {
        assert!(connect_as(&a.ns, 4321, gid, b8080));
        assert!(
            accept_within(&b_l, WAIT).is_some(),
            "proxy GID must reach B"
        );
        assert!(accept_within(&out_l, Duration::ZERO).is_none());
    }

    // Another unprivileged UID is captured too.
    assert!(connect_as(&a.ns, 4321, 4321, b8080));
    let (c, _) = accept_within(&out_l, WAIT).expect("UID 4321 captured");
    assert_eq!(original_dst(&c, family(v6)).unwrap(), b8080);
    assert!(accept_within(&b_l, Duration::ZERO).is_none());

    // B → A:8080 lands on A's inbound proxy port.
    connect_as_root(&b.ns, a8080);
    let (c, _) = accept_within(&in_l, WAIT).expect("inbound capture");
    assert_eq!(original_dst(&c, family(v6)).unwrap(), a8080);

    // The proxy's own admin port is not captured inbound.
    let admin = listen(&a.ns, any(v6, mesh.excluded_inbound));
    connect_as_root(&b.ns, SocketAddr::new(a.ip(v6), mesh.excluded_inbound));
    assert!(accept_within(&admin, WAIT).is_some());
    assert!(accept_within(&in_l, Duration::ZERO).is_none());

    // CHECK: exact now; a deleted rule is detected (and really stops the exemption).
    assert_eq!(
        check(&a.ns.path(), &spec, kind).unwrap(),
        Verification::Exact
    );
    delete_uid_rule(&a.ns, kind.as_str(), mesh.uid);
    let Verification::Mismatch(diffs) = check(&a.ns.path(), &spec, kind).unwrap() else {
        panic!("deleted rule not detected")
    };
    assert!(!diffs.is_empty());
    assert!(connect_as(&a.ns, mesh.uid, 5000, b8080));
    assert!(
        accept_within(&out_l, WAIT).is_some(),
        "without the rule the proxy UID is captured"
    );

    // Re-applying repairs it (listeners closed: the probe needs the port).
    drop((out_l, in_l, admin));
    install_and_prove(&a.ns.path(), &spec, kind, &topo.gateways()).unwrap();
    assert_eq!(
        check(&a.ns.path(), &spec, kind).unwrap(),
        Verification::Exact
    );
    assert!(connect_as(&a.ns, mesh.uid, 5000, b8080));
    assert!(accept_within(&b_l, WAIT).is_some());

    // DEL: removed, nothing left; a vanished netns is reported as such.
    assert_eq!(remove_rules(&a.ns.path(), kind).unwrap(), Removal::Removed);
    let rules = all_rules(&a.ns);
    assert!(
        !rules.contains("IL_") && !rules.contains("interlock"),
        "{rules}"
    );
    let b_l2 = b_l;
    connect_as_root(&a.ns, b8080);
    assert!(
        accept_within(&b_l2, WAIT).is_some(),
        "unprotected pod talks to B directly"
    );
    let path = a.ns.path();
    drop(topo);
    assert_eq!(remove_rules(&path, kind).unwrap(), Removal::NetnsGone);
}

fn exclusions_scenario(kind: BackendKind, v6: bool) {
    let topo = Topology::new();
    let (a, b) = (&topo.a, &topo.b);
    let b_net = if v6 { "fd99:1::3/128" } else { "10.99.1.3/32" };
    let ranges = format!("{b_net},10.99.200.0/24");
    let ranges: &'static str = Box::leak(ranges.into_boxed_str());
    // The generic profile: Istio's lists take no port ranges.
    let spec = spec_for(&[
        ("interlock.dev/redirect", "enabled"),
        ("interlock.dev/exclude-outbound-cidrs", ranges),
        ("interlock.dev/exclude-outbound-ports", "5432,6000-6010"),
        ("interlock.dev/include-inbound-ports", "8080,9090"),
    ]);
    install_and_prove(&a.ns.path(), &spec, kind, &topo.gateways()).unwrap();
    let out_l = listen(&a.ns, loopback(v6, 15001));
    let in_l = listen(&a.ns, any(v6, 15006));
    let gw = if v6 { topo.gw6 } else { topo.gw4 };
    let node_5432 = listen(&topo.node, SocketAddr::new(gw, 5432));
    let node_6005 = listen(&topo.node, SocketAddr::new(gw, 6005));
    let node_8080 = listen(&topo.node, SocketAddr::new(gw, 8080));
    let b_l = listen(&b.ns, any(v6, 8080));

    // Excluded CIDR: A → B:8080 is not captured.
    connect_as_root(&a.ns, SocketAddr::new(b.ip(v6), 8080));
    assert!(
        accept_within(&b_l, WAIT).is_some(),
        "excluded CIDR reaches B"
    );
    assert!(accept_within(&out_l, Duration::ZERO).is_none());
    // Excluded ports (single and range) to a captured address are not captured.
    connect_as_root(&a.ns, SocketAddr::new(gw, 5432));
    assert!(
        accept_within(&node_5432, WAIT).is_some(),
        "excluded port 5432 reaches the node"
    );
    connect_as_root(&a.ns, SocketAddr::new(gw, 6005));
    assert!(
        accept_within(&node_6005, WAIT).is_some(),
        "excluded port 6005 reaches the node"
    );
    assert!(accept_within(&out_l, Duration::ZERO).is_none());
    // The same address on another port is captured.
    connect_as_root(&a.ns, SocketAddr::new(gw, 8080));
    let (c, _) = accept_within(&out_l, WAIT).expect("captured");
    assert_eq!(
        original_dst(&c, family(v6)).unwrap(),
        SocketAddr::new(gw, 8080)
    );
    assert!(accept_within(&node_8080, Duration::ZERO).is_none());

    // Inbound include list: 8080 captured, 7070 not.
    let a7070 = listen(&a.ns, any(v6, 7070));
    connect_as_root(&b.ns, SocketAddr::new(a.ip(v6), 7070));
    assert!(
        accept_within(&a7070, WAIT).is_some(),
        "inbound port outside the include list"
    );
    assert!(accept_within(&in_l, Duration::ZERO).is_none());
    connect_as_root(&b.ns, SocketAddr::new(a.ip(v6), 8080));
    assert!(
        accept_within(&in_l, WAIT).is_some(),
        "inbound port in the include list"
    );
}

#[test]
fn istio_v4_iptables_nft() {
    require_root!();
    mesh_scenario(BackendKind::IptablesNft, &ISTIO, false);
}

#[test]
fn istio_v6_iptables_nft() {
    require_root!();
    mesh_scenario(BackendKind::IptablesNft, &ISTIO, true);
}

#[test]
fn istio_v4_iptables_legacy() {
    require_root!();
    mesh_scenario(BackendKind::IptablesLegacy, &ISTIO, false);
}

#[test]
fn istio_v6_iptables_legacy() {
    require_root!();
    mesh_scenario(BackendKind::IptablesLegacy, &ISTIO, true);
}

#[test]
fn linkerd_v4_iptables_nft() {
    require_root!();
    mesh_scenario(BackendKind::IptablesNft, &LINKERD, false);
}

#[test]
fn linkerd_v6_iptables_nft() {
    require_root!();
    mesh_scenario(BackendKind::IptablesNft, &LINKERD, true);
}

#[test]
fn linkerd_v4_iptables_legacy() {
    require_root!();
    mesh_scenario(BackendKind::IptablesLegacy, &LINKERD, false);
}

#[test]
fn linkerd_v6_iptables_legacy() {
    require_root!();
    mesh_scenario(BackendKind::IptablesLegacy, &LINKERD, true);
}

#[test]
fn exclusions_v4_iptables_nft() {
    require_root!();
    exclusions_scenario(BackendKind::IptablesNft, false);
}

#[test]
fn exclusions_v6_iptables_legacy() {
    require_root!();
    exclusions_scenario(BackendKind::IptablesLegacy, true);
}

#[test]
fn garbage_annotation_applies_nothing() {
    require_root!();
    let topo = Topology::new();
    let err = interlock_redirect::spec_for(
        &interlock_redirect::PodView::with_facts(
            &annotations(&[
                ISTIO.annotations[0],
                (
                    "traffic.sidecar.istio.io/excludeInboundPorts",
                    "15020,70000",
                ),
            ]),
            &interlock_testkit::pods::istio_sidecar(),
        ),
        &ProfileName::ALL,
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("traffic.sidecar.istio.io/excludeInboundPorts") && msg.contains("70000"),
        "{msg}"
    );
    // An invalid spec handed to install_and_prove fails before touching the netns.
    let mut bad = spec_for(ISTIO.annotations);
    bad.proxy_uid = 0;
    let e = install_and_prove(
        &topo.a.ns.path(),
        &bad,
        BackendKind::IptablesNft,
        &topo.gateways(),
    )
    .unwrap_err();
    assert_eq!(e.step(), Step::Spec);
    let rules = all_rules(&topo.a.ns);
    assert!(
        !rules.contains("IL_") && !rules.contains("interlock"),
        "{rules}"
    );
}

#[test]
fn failed_probe_leaves_no_rules() {
    require_root!();
    let topo = Topology::new();
    let spec = spec_for(ISTIO.annotations);
    // Something already holds the outbound proxy port: the probe cannot listen.
    let _busy = listen(&topo.a.ns, loopback(false, 15001));
    let e = install_and_prove(
        &topo.a.ns.path(),
        &spec,
        BackendKind::IptablesLegacy,
        &topo.gateways(),
    )
    .unwrap_err();
    assert_eq!(e.step(), Step::Probe, "{e}");
    assert!(
        e.to_string()
            .contains(&topo.a.ns.path().display().to_string()),
        "{e}"
    );
    let rules = all_rules(&topo.a.ns);
    assert!(!rules.contains("IL_"), "{rules}");
}

#[test]
fn probe_detects_missing_redirection() {
    require_root!();
    let topo = Topology::new();
    let spec = spec_for(ISTIO.annotations);
    // No rules at all: the probe's SYN (hop limit 1) reaches the node, which refuses it.
    let e = interlock_redirect::netns::in_netns(&topo.a.ns.path(), || {
        interlock_redirect::probe::probe(&spec, &[topo.gw4], Duration::from_millis(300))
    })
    .unwrap()
    .unwrap_err();
    assert!(
        matches!(
            e,
            interlock_redirect::probe::ProbeError::NotRedirected { .. }
        ),
        "{e}"
    );
    let _: &[IpAddr] = &topo.gateways();
}

#[test]
fn istio_v4_nftables() {
    require_root!();
    mesh_scenario(BackendKind::Nftables, &ISTIO, false);
}

#[test]
fn istio_v6_nftables() {
    require_root!();
    mesh_scenario(BackendKind::Nftables, &ISTIO, true);
}

#[test]
fn linkerd_v4_nftables() {
    require_root!();
    mesh_scenario(BackendKind::Nftables, &LINKERD, false);
}

#[test]
fn linkerd_v6_nftables() {
    require_root!();
    mesh_scenario(BackendKind::Nftables, &LINKERD, true);
}

#[test]
fn exclusions_v4_nftables() {
    require_root!();
    exclusions_scenario(BackendKind::Nftables, false);
}

#[test]
fn exclusions_v6_nftables() {
    require_root!();
    exclusions_scenario(BackendKind::Nftables, true);
}

#[test]
fn exclusions_v6_iptables_nft() {
    require_root!();
    exclusions_scenario(BackendKind::IptablesNft, true);
}

#[test]
fn exclusions_v4_iptables_legacy() {
    require_root!();
    exclusions_scenario(BackendKind::IptablesLegacy, false);
}

/// Install and remove, five rounds per backend in one netns: every round is exact after
/// install_and_prove and leaves nothing after remove_rules. Prints how long each step took; speed is
/// measured by `interlock-bench`, not asserted here.
#[test]
fn install_remove_rounds_leave_exact_rules_then_none() {
    require_root!();
    let topo = Topology::new();
    let spec = spec_for(ISTIO.annotations);
    for kind in [
        BackendKind::Nftables,
        BackendKind::IptablesNft,
        BackendKind::IptablesLegacy,
    ] {
        let mut probe_times = Vec::new();
        let mut totals = Vec::new();
        for round in 0..5 {
            let t = std::time::Instant::now();
            let p = install_and_prove(&topo.a.ns.path(), &spec, kind, &topo.gateways()).unwrap();
            totals.push(t.elapsed());
            probe_times.push(p.probe_time);
            assert_eq!(
                check(&topo.a.ns.path(), &spec, kind).unwrap(),
                Verification::Exact,
                "{kind} round {round}: not exact after install_and_prove"
            );
            remove_rules(&topo.a.ns.path(), kind).unwrap();
            assert!(
                !check(&topo.a.ns.path(), &spec, kind).unwrap().is_exact(),
                "{kind} round {round}: rules left after remove_rules"
            );
        }
        probe_times.sort();
        totals.sort();
        eprintln!(
            "{kind}: install_and_prove median {:?}, probe median {:?}",
            totals[2], probe_times[2]
        );
    }
}

#[test]
fn probe_finds_the_gateways_itself() {
    require_root!();
    let topo = Topology::new();
    let routes =
        interlock_redirect::netns::in_netns(&topo.a.ns.path(), interlock_redirect::route::routes)
            .unwrap()
            .unwrap();
    let gws: Vec<IpAddr> = routes
        .iter()
        .filter(|r| r.is_unicast() && r.dst.prefix_len() == 0)
        .filter_map(|r| r.gateway)
        .collect();
    assert_eq!(gws, topo.gateways());
    let spec = spec_for(ISTIO.annotations);
    let p = install_and_prove(&topo.a.ns.path(), &spec, BackendKind::IptablesNft, &[]).unwrap();
    let targets: Vec<SocketAddr> = p.probe.proven.iter().map(|r| r.target).collect();
    assert_eq!(
        targets,
        vec![SocketAddr::new(topo.gw4, 9), SocketAddr::new(topo.gw6, 9)]
    );
}

/// Given the pod's gateways, the probe takes them without dumping the route table: for
/// each family it proves the destination the full plan over the pod's route table picks
/// first, whatever the gateways given.
#[test]
fn the_gateway_shortcut_proves_what_the_full_plan_would() {
    require_root!();
    let topo = Topology::new();
    let spec = spec_for(ISTIO.annotations).as_installed();
    let (routes, links) = interlock_redirect::netns::in_netns(&topo.a.ns.path(), || {
        (
            interlock_redirect::route::routes().unwrap(),
            interlock_redirect::route::links().unwrap(),
        )
    })
    .unwrap();
    let planned = |gateways: &[IpAddr]| -> Vec<SocketAddr> {
        [Family::V4, Family::V6]
            .into_iter()
            .map(
                |f| match interlock_redirect::probe::plan(&spec, f, gateways, &routes, &links) {
                    Ok(interlock_redirect::probe::Plan::Connect(targets)) => targets[0],
                    other => panic!("{f}: {other:?}"),
                },
            )
            .collect()
    };
    let proven = |gateways: &[IpAddr]| -> Vec<SocketAddr> {
        let p =
            install_and_prove(&topo.a.ns.path(), &spec, BackendKind::Nftables, gateways).unwrap();
        remove_rules(&topo.a.ns.path(), BackendKind::Nftables).unwrap();
        p.probe.proven.iter().map(|r| r.target).collect()
    };
    let routed_elsewhere: IpAddr = "203.0.113.77".parse().unwrap();
    for gateways in [
        vec![],
        topo.gateways(),
        vec![topo.gw6, topo.gw4],
        vec![routed_elsewhere, topo.gw6],
    ] {
        assert_eq!(
            proven(&gateways),
            planned(&gateways),
            "gateways {gateways:?}"
        );
    }
    assert_eq!(
        proven(&topo.gateways()),
        vec![SocketAddr::new(topo.gw4, 9), SocketAddr::new(topo.gw6, 9)]
    );
}

#[test]
fn generic_v4_nftables() {
    require_root!();
    mesh_scenario(BackendKind::Nftables, &GENERIC, false);
}

#[test]
fn generic_v6_iptables_legacy() {
    require_root!();
    mesh_scenario(BackendKind::IptablesLegacy, &GENERIC, true);
}

#[test]
fn unprotect_all_clears_every_backend_and_tolerates_dead_netns() {
    require_root!();
    let topo = Topology::new();
    let spec = spec_for(ISTIO.annotations);
    // Rules of all three backends at once (as after a backend change without state).
    for kind in [
        BackendKind::IptablesLegacy,
        BackendKind::IptablesNft,
        BackendKind::Nftables,
    ] {
        interlock_redirect::netns::in_netns(&topo.a.ns.path(), || {
            interlock_redirect::backend::open(kind)
                .unwrap()
                .apply(&spec)
                .unwrap()
        })
        .unwrap();
    }
    assert_eq!(
        interlock_redirect::remove_all_rules(&topo.a.ns.path()).unwrap(),
        Removal::Removed
    );
    let rules = all_rules(&topo.a.ns);
    assert!(
        !rules.contains("IL_") && !rules.contains("interlock"),
        "{rules}"
    );

    // A netns file whose mount is gone (an empty regular file) counts as gone.
    let dir = interlock_testkit::tempdir().unwrap();
    let stale = dir.path().join("stale-netns");
    std::fs::write(&stale, b"").unwrap();
    assert_eq!(
        remove_rules(&stale, BackendKind::Nftables).unwrap(),
        Removal::NetnsGone
    );
    assert_eq!(
        interlock_redirect::remove_all_rules(&stale).unwrap(),
        Removal::NetnsGone
    );
}

#[test]
fn probe_works_when_the_gateways_are_excluded() {
    require_root!();
    let topo = Topology::new();
    let spec = spec_for(&[
        ISTIO.annotations[0],
        (
            "traffic.sidecar.istio.io/excludeOutboundIPRanges",
            "10.99.0.0/16,fd99::/16",
        ),
    ]);
    let p = install_and_prove(
        &topo.a.ns.path(),
        &spec,
        BackendKind::Nftables,
        &topo.gateways(),
    )
    .unwrap();
    let targets: Vec<SocketAddr> = p.probe.proven.iter().map(|r| r.target).collect();
    assert_eq!(
        targets,
        vec![
            "192.0.2.1:9".parse::<SocketAddr>().unwrap(),
            "[2001:db8::1]:9".parse().unwrap()
        ]
    );
}

#[test]
fn concurrent_protects_do_not_interfere() {
    require_root!();
    let topo = Topology::new();
    let spec = spec_for(ISTIO.annotations);
    let gws = topo.gateways();
    for kind in [BackendKind::IptablesLegacy, BackendKind::Nftables] {
        std::thread::scope(|s| {
            for pod in [&topo.a, &topo.b] {
                let (spec, gws) = (&spec, &gws);
                s.spawn(move || {
                    for _ in 0..3 {
                        install_and_prove(&pod.ns.path(), spec, kind, gws).unwrap();
                        assert_eq!(
                            check(&pod.ns.path(), spec, kind).unwrap(),
                            Verification::Exact
                        );
                        remove_rules(&pod.ns.path(), kind).unwrap();
                    }
                });
            }
        });
    }
}

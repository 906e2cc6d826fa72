//! interlock-cni chained after the reference `bridge` plugin, in test-owned namespaces,
//! proven with real traffic: pod A (meshed, annotations in `runtimeConfig`) and pod B
//! (not meshed) on the bridge. A's outbound connections land on its proxy's outbound
//! port with the original destination intact, the proxy's UID reaches B directly, B's
//! connections to A land on the inbound port. CHECK, re-ADD, DEL; fail-closed paths.

use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use crate::common::*;
use interlock_redirect::netns::in_netns;
use interlock_redirect::probe::original_dst;
use interlock_testkit::require_root;
use serde_json::{json, Value};

/// The whole life of a meshed pod with `mesh`'s profile and `backend`.
fn scenario(mesh: &Mesh, backend: &str, dual: bool) {
    let n = Node::new(dual);
    let chain = n.chain(json!({ "backend": backend }));
    let only = n.only_interlock(&chain);
    let b = n.add(&chain, "b", Some(json!({"team": "shop"})));
    let a = n.add(&chain, "a", Some(mesh.annotations()));

    // B needed nothing; A is protected with the configured backend and recorded so.
    let sb = n.state_of(&b.rt).unwrap();
    assert_eq!(sb["decision"]["decision"], "not-meshed", "{sb}");
    assert_eq!(sb["protection"]["protection"], "not-needed", "{sb}");
    let sa = n.state_of(&a.rt).unwrap();
    assert_eq!(sa["decision"]["decision"], "meshed", "{sa}");
    assert_eq!(sa["decision"]["profile"], mesh.profile);
    let p = &sa["protection"];
    assert_eq!(p["protection"], "protected", "{sa}");
    assert_eq!(p["backend"], backend);
    assert_eq!(p["profile"], mesh.profile);
    assert_eq!(sa["netns"], a.ns.path().display().to_string());
    assert_eq!(sa["ifname"], "eth0");
    assert_eq!(sa["pod"]["name"], "a");
    assert_eq!(sa["annotationsSource"], "runtime-config");
    let spec: Value = serde_json::from_str(p["spec"].as_str().unwrap()).unwrap();
    assert_eq!(spec["proxyUid"], mesh.uid);
    assert_eq!(spec["outbound"]["proxyPort"], mesh.outbound);
    assert_eq!(spec["inbound"]["proxyPort"], mesh.inbound);
    // Both families are programmed whatever the result lists (an IPv4-only pod still has
    // an IPv6 link-local address).
    assert_eq!(
        (&spec["ipv4"], &spec["ipv6"]),
        (&json!(true), &json!(true)),
        "{spec}"
    );
    assert_eq!(p["specHash"].as_str().unwrap().len(), 64);
    let probes = p["probe"].as_array().unwrap();
    assert_eq!(probes.len(), 2, "one line per family: {p}");
    assert_eq!(
        probes
            .iter()
            .filter(|l| l.as_str().unwrap().contains("landed on"))
            .count(),
        if dual { 2 } else { 1 },
        "{p}"
    );
    if !dual {
        assert!(
            probes[1]
                .as_str()
                .unwrap()
                .starts_with("IPv6: routed only link-locally (via eth0)"),
            "{p}"
        );
    }
    eprintln!(
        "TIMINGS {} {backend} dual={dual}: add {} us, protect {} us (rules {} us, probe {} us)",
        mesh.profile,
        sa["addUs"],
        p["timings"]["protectUs"],
        p["timings"]["rulesUs"],
        p["timings"]["probeUs"]
    );
    let log = n.log();
    assert!(
        log.lines().any(|l| l.contains(" INFO ")
            && l.contains("pod shop/a: meshed")
            && l.contains(&format!("protected with {backend}"))
            && l.contains("total ")),
        "{log}"
    );

    for v6 in a.families() {
        assert!(b.families().contains(&v6));
        let out_l = listen(&a.ns, loopback(v6, mesh.outbound));
        let in_l = listen(&a.ns, any(v6, mesh.inbound));
        let b_l = listen(&b.ns, any(v6, 8080));
        let b8080 = SocketAddr::new(b.ip(v6), 8080);
        let a8080 = SocketAddr::new(a.ip(v6), 8080);

        // A process in A (root, not the proxy) → B:8080 lands on A's outbound port.
        let local = connect_as_root(&a.ns, b8080);
        let (c, peer) = accept_within(&out_l, WAIT).expect("captured at the outbound port");
        assert_eq!(peer, local);
        assert_eq!(original_dst(&c, family(v6)).unwrap(), b8080);
        assert!(accept_within(&b_l, Duration::ZERO).is_none(), "B saw it");
        // Another unprivileged UID too.
        assert!(connect_as(&a.ns, 4321, 4321, b8080));
        let (c, _) = accept_within(&out_l, WAIT).expect("UID 4321 captured");
        assert_eq!(original_dst(&c, family(v6)).unwrap(), b8080);
        assert!(accept_within(&b_l, Duration::ZERO).is_none());

        // The proxy's UID reaches B's own listener.
        assert!(connect_as(&a.ns, mesh.uid, mesh.uid, b8080));
        assert!(accept_within(&b_l, WAIT).is_some(), "proxy UID reaches B");
        assert!(accept_within(&out_l, Duration::ZERO).is_none());

        // B → A:8080 lands on A's inbound port.
        connect_as_root(&b.ns, a8080);
        let (c, _) = accept_within(&in_l, WAIT).expect("captured at the inbound port");
        assert_eq!(original_dst(&c, family(v6)).unwrap(), a8080);

        // B has no rules of its own: its connection reached A (above) instead of B's
        // loopback, and A's proxy UID reaches a port B serves.
        assert_no_interlock_rules(&b.ns);
    }

    // CHECK: exact; one rule deleted → 103 with the difference; re-ADD repairs it.
    n.check(&only, &a).unwrap();
    n.check(&only, &b).unwrap();
    delete_uid_rule(&a.ns, backend, mesh.uid);
    let e = n.check(&only, &a).unwrap_err();
    let (code, msg) = cni_error(&e);
    assert_eq!(code, 103, "{e}");
    assert!(
        msg.starts_with("pod shop/a: step verify failed:") && msg.contains(backend),
        "{msg}"
    );
    let readd = n.readd(&only, &a).unwrap();
    assert_eq!(readd, a.result, "re-ADD returns prevResult");
    n.check(&only, &a).unwrap();

    // DEL: rules and state gone; again without netns (containerd's late DEL): success.
    n.del(&chain, &a).unwrap();
    assert!(n.state_of(&a.rt).is_none());
    assert_no_interlock_rules(&a.ns);
    let late = interlock_libcni::RuntimeConf::new(&a.rt.container_id, "", "eth0");
    n.node.run(|| chain.del(&late, None)).unwrap();
    n.del(&chain, &b).unwrap();
    let log = n.log();
    if std::env::var_os("IL_SHOW_LOG").is_some() {
        eprintln!("{log}");
    }
    assert!(
        log.lines()
            .any(|l| l.contains("DEL ") && l.contains("pod shop/a: rules removed")),
        "{log}"
    );
}

#[test]
fn istio_nftables_dual_stack() {
    require_root!();
    scenario(&ISTIO, "nftables", true);
}

#[test]
fn istio_iptables_nft_dual_stack() {
    require_root!();
    scenario(&ISTIO, "iptables-nft", true);
}

#[test]
fn linkerd_nftables_dual_stack() {
    require_root!();
    scenario(&LINKERD, "nftables", true);
}

#[test]
fn linkerd_iptables_nft_dual_stack() {
    require_root!();
    scenario(&LINKERD, "iptables-nft", true);
}

#[test]
fn istio_nftables_ipv4_only() {
    require_root!();
    scenario(&ISTIO, "nftables", false);
}

#[test]
fn linkerd_iptables_legacy_ipv4_only() {
    require_root!();
    scenario(&LINKERD, "iptables-legacy", false);
}

/// A garbage annotation value: ADD fails (101) naming the annotation, nothing is applied.
#[test]
fn garbage_annotation_fails_add_and_leaves_no_rules() {
    require_root!();
    let n = Node::new(true);
    for backend in ["nftables", "iptables-nft"] {
        let chain = n.chain(json!({ "backend": backend }));
        let mut ann = ISTIO.annotations();
        ann["traffic.sidecar.istio.io/excludeOutboundPorts"] = json!("70000");
        let (ns, rt, r) = n.try_add(&chain, "a", Some(ann));
        let e = r.unwrap_err();
        let (code, msg) = cni_error(&e);
        assert_eq!(code, 101, "{e}");
        assert!(
            msg.starts_with("pod shop/a: step spec failed:")
                && msg.contains("traffic.sidecar.istio.io/excludeOutboundPorts")
                && msg.contains("70000"),
            "{msg}"
        );
        assert_no_interlock_rules(&ns);
        assert!(n.state_of(&rt).is_none());
        // The runtime's DEL after the failed ADD succeeds.
        n.node.run(|| chain.del(&rt, None)).unwrap();
    }
    assert!(
        n.log()
            .lines()
            .any(|l| l.contains(" ERROR ") && l.contains("excludeOutboundPorts")),
        "{}",
        n.log()
    );
}

/// A real failure after the rules were applied: the outbound proxy port is already taken
/// in the pod's netns, so the probe cannot listen. Closed: ADD fails (104) and the rules
/// are removed again. Open: ADD succeeds, the pod is recorded unprotected, the log shouts.
#[test]
fn probe_failure_fails_closed_or_logs_loudly_when_open() {
    require_root!();
    let n = Node::new(false);
    for policy in ["closed", "open"] {
        let chain = n.chain(json!({ "backend": "nftables", "failurePolicy": policy }));
        let ns = interlock_testkit::Netns::new("pod").unwrap();
        let squatter: TcpListener = in_netns(&ns.path(), || {
            TcpListener::bind(loopback(false, ISTIO.outbound))
        })
        .unwrap()
        .unwrap();
        let rt = n.runtime_conf(&ns, "a", Some(ISTIO.annotations()));
        let r = n.node.run(|| chain.add(&rt));
        match policy {
            "closed" => {
                let e = r.unwrap_err();
                let (code, msg) = cni_error(&e);
                assert_eq!(code, 104, "{e}");
                assert!(
                    msg.starts_with("pod shop/a: step probe failed:") && msg.contains("15001"),
                    "{msg}"
                );
                assert!(n.state_of(&rt).is_none());
            }
            _ => {
                let result = r.unwrap_or_else(|e| panic!("open policy: {e}"));
                assert_eq!(result.ips_on("eth0").len(), 1);
                let s = n.state_of(&rt).unwrap();
                assert_eq!(s["protection"]["protection"], "unprotected", "{s}");
                assert_eq!(s["protection"]["step"], "probe", "{s}");
                let log = n.log();
                assert!(
                    log.lines().any(|l| l.contains(" ERROR ")
                        && l.contains("pod shop/a runs WITHOUT traffic redirection")
                        && l.contains("step probe failed")),
                    "{log}"
                );
                // CHECK says it is not protected; DEL cleans up.
                let only = n.only_interlock(&chain);
                let e = n.node.run(|| only.check(&rt, &result)).unwrap_err();
                assert_eq!(cni_error(&e).0, 103, "{e}");
                n.node.run(|| chain.del(&rt, Some(&result))).unwrap();
                assert!(n.state_of(&rt).is_none());
            }
        }
        // Either way the engine removed its rules again: all or nothing.
        assert_no_interlock_rules(&ns);
        drop(squatter);
        n.node.run(|| chain.del(&rt, None)).unwrap();
    }
}

/// Excluded namespaces are never touched, even with mesh annotations.
#[test]
fn excluded_namespace_is_skipped() {
    require_root!();
    let n = Node::new(false);
    let chain = n.chain(json!({ "excludeNamespaces": ["shop"] }));
    let a = n.add(&chain, "a", Some(ISTIO.annotations()));
    let s = n.state_of(&a.rt).unwrap();
    assert_eq!(s["decision"]["decision"], "skip", "{s}");
    assert_no_interlock_rules(&a.ns);
    n.del(&chain, &a).unwrap();
}

/// `backend: auto` detects from the plugin's own (node) netns; `profiles` limits which
/// meshes are recognised.
#[test]
fn auto_backend_and_enabled_profiles() {
    require_root!();
    let n = Node::new(false);
    let chain = n.chain(json!({ "backend": "auto", "profiles": ["istio", "generic"] }));
    let a = n.add(&chain, "a", Some(ISTIO.annotations()));
    let s = n.state_of(&a.rt).unwrap();
    let expected =
        interlock_testkit::Netns::run(&n.node, || interlock_redirect::backend::detect().kind);
    assert_eq!(s["protection"]["backend"], expected.as_str(), "{s}");
    assert!(
        s["protection"]["backendReason"]
            .as_str()
            .unwrap()
            .starts_with("auto: "),
        "{s}"
    );
    // linkerd is not enabled: a linkerd pod passes through untouched.
    let l = n.add(&chain, "l", Some(LINKERD.annotations()));
    let s = n.state_of(&l.rt).unwrap();
    assert_eq!(s["decision"]["decision"], "not-meshed", "{s}");
    assert_no_interlock_rules(&l.ns);
    n.del(&chain, &a).unwrap();
    n.del(&chain, &l).unwrap();
}

/// `backend: auto` reuses a fresh detection cached in `<stateDir>/backend-detected.json`
/// and replaces a corrupt or stale one with a new detection.
#[test]
fn auto_backend_detection_is_cached() {
    require_root!();
    use interlock_attach::detected_backend::{CachedDetection, FILE_NAME};
    use interlock_redirect::BackendKind;
    let n = Node::new(false);
    let chain = n.chain(json!({ "backend": "auto" }));
    let cache = n.state.path().join(FILE_NAME);
    let detected =
        interlock_testkit::Netns::run(&n.node, || interlock_redirect::backend::detect().kind);
    // A backend detection would not choose, so its use proves the cache was read.
    let planted = if detected == BackendKind::IptablesNft {
        BackendKind::IptablesLegacy
    } else {
        BackendKind::IptablesNft
    };
    let now = interlock_contract::time::now_ms();
    let plant = |at: u64| {
        let c = CachedDetection {
            backend: planted,
            reason: "planted by the test".into(),
            detected_at_ms: at,
        };
        std::fs::write(&cache, serde_json::to_vec(&c).unwrap()).unwrap();
    };
    let read_cache = || CachedDetection::parse(&std::fs::read(&cache).unwrap()).unwrap();

    plant(now);
    let a = n.add(&chain, "a", Some(ISTIO.annotations()));
    let p = n.state_of(&a.rt).unwrap()["protection"].clone();
    assert_eq!(p["backend"], planted.as_str(), "{p}");
    let reason = p["backendReason"].as_str().unwrap();
    assert!(
        reason.starts_with("auto: planted by the test (detected ") && reason.contains(FILE_NAME),
        "{reason}"
    );

    // Corrupt: ignored, detection runs, the file is rewritten.
    std::fs::write(&cache, b"{\"backend\": \"nft").unwrap();
    let b = n.add(&chain, "b", Some(ISTIO.annotations()));
    let p = n.state_of(&b.rt).unwrap()["protection"].clone();
    assert_eq!(p["backend"], detected.as_str(), "{p}");
    assert!(
        !p["backendReason"].as_str().unwrap().contains("cached"),
        "{p}"
    );
    let c = read_cache();
    assert_eq!(c.backend, detected);
    assert!(c.detected_at_ms >= now, "{c:?}");

    // Stale (two minutes old): detection runs again.
    plant(now - 120_000);
    let d = n.add(&chain, "d", Some(ISTIO.annotations()));
    let p = n.state_of(&d.rt).unwrap()["protection"].clone();
    assert_eq!(p["backend"], detected.as_str(), "{p}");
    assert_eq!(read_cache().backend, detected);

    for pod in [&a, &b, &d] {
        n.del(&chain, pod).unwrap();
        assert_no_interlock_rules(&pod.ns);
    }
}

/// DEL without state (lost state file) removes every backend's rules; DEL after the
/// netns is gone succeeds and removes the state.
#[test]
fn del_without_state_and_after_the_netns_is_gone() {
    require_root!();
    let n = Node::new(false);
    let chain = n.chain(json!({ "backend": "iptables-nft" }));
    let a = n.add(&chain, "a", Some(ISTIO.annotations()));
    assert!(a
        .ns
        .exec_ok(&["iptables-nft-save", "-t", "nat"])
        .contains("IL_"));
    std::fs::remove_file(
        n.state
            .path()
            .join(format!("attachments/{}+eth0.json", a.rt.container_id)),
    )
    .unwrap();
    n.del(&chain, &a).unwrap();
    assert_no_interlock_rules(&a.ns);
    assert!(n
        .log()
        .lines()
        .any(|l| l.contains("pod shop/a: rules of every backend removed")));

    let b = n.add(&chain, "b", Some(ISTIO.annotations()));
    let Pod { ns, rt, result, .. } = b;
    drop(ns);
    let only = n.only_interlock(&chain);
    n.node.run(|| only.del(&rt, Some(&result))).unwrap();
    assert!(n.state_of(&rt).is_none());
    assert!(n
        .log()
        .lines()
        .any(|l| l.contains("pod shop/b: netns already gone")));
}

/// GC (1.1.0, interlock-cni alone since the reference plugins stop at 1.0.0) removes the
/// state of attachments not in the valid list, and their leftover rules.
#[test]
fn gc_removes_stale_state_and_rules() {
    require_root!();
    let n = Node::new(false);
    let chain = n.chain(json!({ "backend": "nftables" }));
    let keep = n.add(&chain, "keep", Some(ISTIO.annotations()));
    let stale = n.add(&chain, "stale", Some(ISTIO.annotations()));
    assert!(stale
        .ns
        .exec_ok(&["nft", "list", "tables"])
        .contains("interlock"));
    n.gc(&[(&keep.rt.container_id, "eth0")]);
    assert!(n.state_of(&keep.rt).is_some());
    assert!(n.state_of(&stale.rt).is_none());
    assert_no_interlock_rules(&stale.ns);
    let only = n.only_interlock(&chain);
    n.check(&only, &keep).unwrap();
    n.del(&chain, &keep).unwrap();
    n.del(&chain, &stale).unwrap();
}

/// Exclusions from the pod's annotations hold for real traffic through the plugin: an
/// excluded port and an excluded destination reach B directly; others are captured.
#[test]
fn annotation_exclusions_hold_for_real_traffic() {
    require_root!();
    let n = Node::new(true);
    let chain = n.chain(json!({ "backend": "nftables" }));
    let b = n.add(&chain, "b", Some(Value::Null));
    let b6 = b.ip(true);
    let mut ann = ISTIO.annotations();
    ann["traffic.sidecar.istio.io/excludeOutboundPorts"] = json!("5432");
    ann["traffic.sidecar.istio.io/excludeOutboundIPRanges"] = json!(format!("{b6}/128"));
    let a = n.add(&chain, "a", Some(ann));
    let out4 = listen(&a.ns, loopback(false, 15001));
    let out6 = listen(&a.ns, loopback(true, 15001));
    let b5432 = listen(&b.ns, any(false, 5432));
    let b8080 = listen(&b.ns, any(true, 8080));
    let b8080_4 = listen(&b.ns, any(false, 8081));
    // Excluded port (v4): reaches B.
    connect_as_root(&a.ns, SocketAddr::new(b.ip(false), 5432));
    assert!(
        accept_within(&b5432, WAIT).is_some(),
        "excluded port reaches B"
    );
    // Excluded destination (B's v6 address): reaches B on any port.
    connect_as_root(&a.ns, SocketAddr::new(b6, 8080));
    assert!(
        accept_within(&b8080, WAIT).is_some(),
        "excluded CIDR reaches B"
    );
    assert!(accept_within(&out4, Duration::ZERO).is_none());
    assert!(accept_within(&out6, Duration::ZERO).is_none());
    // Anything else is captured.
    let dst = SocketAddr::new(b.ip(false), 8081);
    connect_as_root(&a.ns, dst);
    let (c, _) = accept_within(&out4, WAIT).expect("captured");
    assert_eq!(original_dst(&c, family(false)).unwrap(), dst);
    assert!(accept_within(&b8080_4, Duration::ZERO).is_none());
    drop((out4, out6));
    n.del(&chain, &a).unwrap();
    n.del(&chain, &b).unwrap();
}

/// The backend changes between two ADDs of one attachment (the operator switched it, or
/// detection changed): the second ADD removes the first backend's rules, so the netns
/// holds only what the state records, and DEL leaves nothing.
#[test]
fn readd_with_another_backend_retires_the_first_backends_rules() {
    require_root!();
    let n = Node::new(false);
    let first = n.chain(json!({ "backend": "iptables-nft" }));
    let a = n.add(&first, "a", Some(ISTIO.annotations()));
    assert!(a
        .ns
        .exec_ok(&["iptables-nft-save", "-t", "nat"])
        .contains("IL_"));

    let second = n.only_interlock(&n.chain(json!({ "backend": "nftables" })));
    n.readd(&second, &a).unwrap();
    let nat = a.ns.exec_ok(&["iptables-nft-save", "-t", "nat"]);
    assert!(!nat.contains("IL_"), "iptables-nft rules left: {nat}");
    let ruleset = a.ns.exec_ok(&["nft", "list", "table", "inet", "interlock"]);
    assert!(ruleset.contains("redirect to :15001"), "{ruleset}");
    assert_eq!(
        n.state_of(&a.rt).unwrap()["protection"]["backend"],
        "nftables"
    );
    assert!(n.log().lines().any(|l| l
        .contains("pod shop/a: removed the iptables-nft rules of this attachment's previous ADD")));
    n.check(&second, &a).unwrap();

    n.del(&first, &a).unwrap();
    assert_no_interlock_rules(&a.ns);
}

/// A primary whose result lists no addresses: both families are still programmed, and
/// the probe finds its targets in the pod's routes (IPv4 through the default route; IPv6,
/// routed only link-locally here, sealed).
#[test]
fn result_without_addresses_still_protects_every_family() {
    require_root!();
    let n = Node::new(false);
    let chain = n.chain(json!({ "backend": "nftables" }));
    let mut a = n.add(&chain, "a", Some(json!({})));
    a.result.ips.clear();
    a.rt =
        a.rt.clone()
            .with_capability("io.kubernetes.cri.pod-annotations", ISTIO.annotations());
    let only = n.only_interlock(&chain);
    n.readd(&only, &a)
        .unwrap_or_else(|e| panic!("{e}\nlog:\n{}", n.log()));
    let state = n.state_of(&a.rt).unwrap();
    let spec: Value = serde_json::from_str(state["protection"]["spec"].as_str().unwrap()).unwrap();
    assert_eq!(
        (spec["ipv4"].as_bool(), spec["ipv6"].as_bool()),
        (Some(true), Some(true)),
        "{spec}"
    );
    let probe = state["protection"]["probe"].as_array().unwrap();
    assert_eq!(probe.len(), 2, "{probe:?}");
    assert!(
        probe[0]
            .as_str()
            .unwrap()
            .starts_with("IPv4: connection to 10.99.7.1:9 landed"),
        "{probe:?}"
    );
    assert!(
        probe[1]
            .as_str()
            .unwrap()
            .starts_with("IPv6: routed only link-locally"),
        "{probe:?}"
    );
    n.del(&chain, &a).unwrap();
    assert_no_interlock_rules(&a.ns);
}

/// STATUS needs no agent (issue 10 item 2): with the agent's marker stale (the agent
/// crashed long ago) and the annotations capability declared, STATUS answers 0 and a
/// meshed pod still gets its rules, proven by its traffic.
#[test]
fn status_and_a_meshed_add_need_no_agent() {
    require_root!();
    let n = Node::new(false);
    let stale = interlock_contract::marker::ReadinessMarker {
        ready: true,
        reason: "an agent that crashed".into(),
        updated_at_ms: 1,
        stale_after_ms: 3000,
        pid: 999_999,
        pid_namespace: None,
        config_path: String::new(),
        runtime: None,
        cri_endpoint: None,
        fight: None,
    };
    std::fs::write(
        interlock_contract::layout::marker_path(n.state.path()),
        stale.to_bytes(),
    )
    .unwrap();
    let doc = json!({
        "cniVersion": "1.1.0", "name": "ilnet",
        "plugins": [n.interlock_entry(json!({ "backend": "nftables" }))],
    });
    let list = interlock_libcni::parse_conflist(doc.to_string().as_bytes()).unwrap();
    let status = interlock_libcni::exec::Chain::new(list, vec![n.bins.path().into()]).unwrap();
    n.node
        .run(|| status.status())
        .unwrap_or_else(|e| panic!("STATUS: {e}"));
    let chain = n.chain(json!({ "backend": "nftables" }));
    let a = n.add(&chain, "a", Some(ISTIO.annotations()));
    let s = n.state_of(&a.rt).unwrap();
    assert_eq!(s["protection"]["protection"], "protected", "{s}");
    let out = listen(&a.ns, loopback(false, ISTIO.outbound));
    let dst: SocketAddr = "10.99.7.1:8081".parse().unwrap();
    connect_as_root(&a.ns, dst);
    let (c, _) = accept_within(&out, WAIT).expect("captured");
    assert_eq!(original_dst(&c, family(false)).unwrap(), dst);
    n.del(&chain, &a).unwrap();
}

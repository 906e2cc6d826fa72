//! The smaller holes of issue 7 item 9, each with real pods: container IDs whose state
//! file name would pass the filesystem's limit, a state dir that cannot be written, temp
//! files left by killed writers, and annotations that exclude everything in a direction.

use std::net::SocketAddr;
use std::time::Duration;

use crate::common::*;
use interlock_cni_types::Command as Verb;
use interlock_redirect::probe::original_dst;
use interlock_testkit::require_root;
use serde_json::json;

fn files(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|e| {
            e.map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Container IDs with 80 dots (each encodes as `%2E`; libcni wants a letter or digit
/// first) and of 300 characters: their state
/// file gets a hashed name, so ADD succeeds with its state, CHECK and GC find it, and DEL
/// removes rules and state (it used to fail after applying the rules, and DEL forever).
#[test]
fn long_container_ids_are_protected_and_deleted() {
    require_root!();
    let n = Node::new(false);
    let chain = n.chain(json!({ "backend": "nftables" }));
    let only = n.only_interlock(&chain);
    for cid in [format!("a{}", ".".repeat(80)), "b".repeat(300)] {
        let ns = interlock_testkit::Netns::new("pod").unwrap();
        let mut rt = n.runtime_conf(&ns, "long", Some(ISTIO.annotations()));
        rt.container_id.clone_from(&cid);
        let result = n
            .node
            .run(|| chain.add(&rt))
            .unwrap_or_else(|e| panic!("ADD {}: {e}\n{}", cid.len(), n.log()));
        let names = files(&n.state.path().join("attachments"));
        assert_eq!(names.len(), 1, "{names:?}");
        assert!(
            names[0].starts_with("h-") && names[0].len() < 100,
            "{names:?}"
        );
        n.node.run(|| only.check(&rt, &result)).unwrap();
        // GC keeps it when listed, and collects it (rules too) when not.
        n.gc(&[(&cid, "eth0")]);
        assert_eq!(files(&n.state.path().join("attachments")).len(), 1);
        n.gc(&[]);
        assert!(files(&n.state.path().join("attachments")).is_empty());
        assert_no_interlock_rules(&ns);
        // ADD again (interlock-cni alone, as a retry), then DEL.
        n.exec_interlock(&only, Verb::Add, &rt, &result).unwrap();
        n.node.run(|| chain.del(&rt, Some(&result))).unwrap();
        assert_no_interlock_rules(&ns);
        assert!(files(&n.state.path().join("attachments")).is_empty());
    }
}

/// A state dir that cannot be created does not fail pods that need nothing (ADD and DEL
/// succeed); a meshed pod fails closed, nothing applied.
#[test]
fn an_unwritable_state_dir_fails_only_meshed_pods() {
    require_root!();
    let n = Node::new(false);
    let chain = n.chain(json!({ "backend": "nftables", "stateDir": "/proc/il-no-state" }));
    let plain = n.add(&chain, "plain", Some(json!({"team": "shop"})));
    assert_no_interlock_rules(&plain.ns);
    n.del(&chain, &plain).unwrap();
    let (ns, rt, r) = n.try_add(&chain, "meshed", Some(ISTIO.annotations()));
    let (code, msg) = cni_error(&r.unwrap_err());
    assert_eq!(code, 5, "{msg}");
    assert!(msg.contains("/proc/il-no-state"), "{msg}");
    assert_no_interlock_rules(&ns);
    n.node.run(|| chain.del(&rt, None)).unwrap();
}

/// Temp files of atomic writes whose writer died (an ADD killed mid-write) are removed by
/// GC; a live writer's are kept.
#[test]
fn gc_sweeps_temp_files_of_killed_writers() {
    require_root!();
    let n = Node::new(false);
    let chain = n.chain(json!({ "backend": "nftables" }));
    let a = n.add(&chain, "a", Some(ISTIO.annotations()));
    let mut dead = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    dead.wait().unwrap();
    let state = n.state.path();
    let abandoned = [
        state.join(format!("attachments/.c7+eth0.json.{dead_pid}.0.tmp")),
        state.join(format!(".backend-detected.json.{dead_pid}.3.tmp")),
        state.join(format!("netns/.4-4026532000.json.{dead_pid}.1.tmp")),
    ];
    let live = state.join(format!(
        "attachments/.c8+eth0.json.{}.0.tmp",
        std::process::id()
    ));
    for p in abandoned.iter().chain([&live]) {
        std::fs::write(p, b"{}").unwrap();
    }
    n.gc(&[(&a.rt.container_id, "eth0")]);
    for p in &abandoned {
        assert!(!p.exists(), "{} left", p.display());
    }
    assert!(live.exists(), "a live writer's temp file was removed");
    assert!(
        n.log().contains("GC removed 3 abandoned temp file(s)"),
        "{}",
        n.log()
    );
    n.check(&n.only_interlock(&chain), &a).unwrap();
    n.del(&chain, &a).unwrap();
}

/// The probe lines of a protected attachment.
fn probe_lines(n: &Node, pod: &Pod) -> Vec<String> {
    let s = n.state_of(&pod.rt).unwrap();
    assert_eq!(s["protection"]["protection"], "protected", "{s}");
    s["protection"]["probe"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap().to_string())
        .collect()
}

/// Reaching the node at 10.99.7.1:8081 from `pod`: directly (`true`) or through the
/// outbound proxy port.
fn reaches_node_directly(n: &Node, pod: &Pod, proxy_port: u16) -> bool {
    let node_l = listen(&n.node, any(false, 8081));
    let proxy = listen(&pod.ns, loopback(false, proxy_port));
    let dst: SocketAddr = "10.99.7.1:8081".parse().unwrap();
    connect_as_root(&pod.ns, dst);
    if accept_within(&node_l, WAIT).is_some() {
        return true;
    }
    let (c, _) = accept_within(&proxy, Duration::ZERO).expect("neither direct nor captured");
    assert_eq!(original_dst(&c, family(false)).unwrap(), dst);
    false
}

/// Annotations that exclude everything in a direction are honoured as "nothing to
/// redirect there" (it used to be a probe that could never succeed, and a pod that never
/// started): istio `excludeOutboundIPRanges: 0.0.0.0/0`, istio `excludeInterfaces:
/// eth0`, and linkerd `skip-subnets: 0.0.0.0/0` inbound. The rest stays captured and
/// proven.
#[test]
fn annotations_that_exclude_everything_are_honoured() {
    require_root!();
    let n = Node::new(false);
    let chain = n.chain(json!({ "backend": "nftables" }));
    let mut istio = ISTIO.annotations();
    istio["traffic.sidecar.istio.io/excludeOutboundIPRanges"] = json!("0.0.0.0/0");
    let p = n.add(&chain, "istio", Some(istio));
    let probe = probe_lines(&n, &p);
    assert!(
        probe
            .iter()
            .any(|l| l
                .starts_with("IPv4: not probed: every IPv4 destination is excluded (0.0.0.0/0")),
        "{probe:?}"
    );
    // The veth's link-local route appears when the kernel configures the address on
    // link up, asynchronously: on a loaded machine the probe may run before it, and
    // then IPv6 honestly has no route yet (its rules are installed either way).
    assert!(
        probe
            .iter()
            .any(|l| l.starts_with("IPv6: routed only link-locally")
                || l.starts_with("IPv6: no route")),
        "{probe:?}"
    );
    assert!(
        reaches_node_directly(&n, &p, ISTIO.outbound),
        "istio: IPv4 excluded"
    );
    n.del(&chain, &p).unwrap();

    // Linkerd's skip-subnets names inbound sources (as proxy-init matches them): every
    // IPv4 source skipped, outbound stays captured and proven, inbound reaches the app.
    let mut linkerd = LINKERD.annotations();
    linkerd["config.linkerd.io/skip-subnets"] = json!("0.0.0.0/0");
    let p = n.add(&chain, "linkerd", Some(linkerd));
    let probe = probe_lines(&n, &p);
    assert!(
        probe
            .iter()
            .any(|l| l.starts_with("IPv4: connection to") && l.contains(":4140")),
        "{probe:?}"
    );
    let app = listen(&p.ns, any(false, 8083));
    connect_as_root(&n.node, SocketAddr::new(p.ip(false), 8083));
    assert!(
        accept_within(&app, WAIT).is_some(),
        "inbound from a skipped subnet"
    );
    n.del(&chain, &p).unwrap();

    let mut no_eth0 = ISTIO.annotations();
    no_eth0["traffic.sidecar.istio.io/excludeInterfaces"] = json!("eth0");
    let p = n.add(&chain, "noeth0", Some(no_eth0));
    let probe = probe_lines(&n, &p);
    for f in ["IPv4", "IPv6"] {
        assert!(
            probe.iter().any(|l| l.starts_with(&format!(
                "{f}: not probed: every {f} route leaves through an excluded interface"
            )) && l.contains("dev eth0")),
            "{probe:?}"
        );
    }
    assert!(reaches_node_directly(&n, &p, ISTIO.outbound));
    // Inbound on eth0 is not captured either: the app gets it.
    let app = listen(&p.ns, any(false, 8082));
    connect_as_root(&n.node, SocketAddr::new(p.ip(false), 8082));
    assert!(accept_within(&app, WAIT).is_some());
    n.del(&chain, &p).unwrap();
}

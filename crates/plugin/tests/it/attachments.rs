//! Several attachments in one netns keep their rules (issue 7 item 3): the netns is the
//! unit of protection, each attachment holds a reference, and DEL, GC or a failed ADD of
//! one attachment removes the rules only when no other live attachment relies on them.
//! A Multus pod's second interface (`net1`) is an ADD of interlock-cni alone with the
//! same netns; the pod's own traffic shows the rules are still in force.

use std::collections::BTreeSet;
use std::net::{SocketAddr, TcpListener};

use crate::common::*;
use interlock_cni_types::Command as Verb;
use interlock_libcni::RuntimeConf;
use interlock_redirect::netns::in_netns;
use interlock_redirect::probe::original_dst;
use interlock_testkit::require_root;
use serde_json::{json, Value};

/// The pod's runtime config for another interface of the same sandbox.
fn on_if(pod: &Pod, ifname: &str) -> RuntimeConf {
    let mut rt = pod.rt.clone();
    rt.ifname = ifname.to_string();
    rt
}

/// The pod's outbound traffic lands on its proxy port: the rules are in force.
fn assert_captured(pod: &Pod) {
    let out = listen(&pod.ns, loopback(false, ISTIO.outbound));
    let dst: SocketAddr = "10.99.7.1:8081".parse().unwrap();
    connect_as_root(&pod.ns, dst);
    let (c, _) = accept_within(&out, WAIT).expect("captured at the outbound port");
    assert_eq!(original_dst(&c, family(false)).unwrap(), dst);
}

fn rules_count(pod: &Pod) -> usize {
    pod.ns
        .exec_ok(&["nft", "list", "ruleset"])
        .matches("redirect to")
        .count()
}

fn netns_records(n: &Node) -> Vec<Value> {
    let dir = n.state.path().join("netns");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| {
            let p = e.unwrap().path();
            (p.extension()? == "json")
                .then(|| serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap())
        })
        .collect()
}

/// eth0 (through the chain) and net1 (interlock-cni alone) in one netns: DEL of net1,
/// then GC keeping only eth0, leave eth0's rules in force and CHECK passing; DEL of the
/// last attachment removes them and the netns record.
#[test]
fn del_and_gc_of_one_attachment_keep_the_others_rules() {
    require_root!();
    let n = Node::new(false);
    let chain = n.chain(json!({ "backend": "nftables" }));
    let only = n.only_interlock(&chain);
    let a = n.add(&chain, "a", Some(ISTIO.annotations()));
    let net1 = on_if(&a, "net1");
    n.exec_interlock(&only, Verb::Add, &net1, &a.result)
        .unwrap_or_else(|e| panic!("{e}\n{}", n.log()));
    let s1 = n.state_of_if(&a.rt, "net1").unwrap();
    assert!(
        s1["protection"]["backendReason"]
            .as_str()
            .unwrap()
            .starts_with(&format!(
                "shared with attachment {}/eth0",
                a.rt.container_id
            )),
        "{s1}"
    );
    let records = netns_records(&n);
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0]["attachments"].as_array().unwrap().len(), 2);

    // DEL net1: eth0 keeps its rules.
    n.exec_interlock(&only, Verb::Del, &net1, &a.result)
        .unwrap();
    assert!(n.state_of_if(&a.rt, "net1").is_none());
    assert!(rules_count(&a) >= 2, "rules removed under eth0");
    n.check(&only, &a).unwrap();
    assert_captured(&a);
    assert!(n.log().contains(&format!(
        "rules kept: attachment {}/eth0 still relies on them",
        a.rt.container_id
    )));

    // net1 again, then GC keeping only eth0.
    n.exec_interlock(&only, Verb::Add, &net1, &a.result)
        .unwrap();
    n.gc(&[(&a.rt.container_id, "eth0")]);
    assert!(n.state_of_if(&a.rt, "net1").is_none());
    assert!(n.state_of(&a.rt).is_some());
    n.check(&only, &a).unwrap();
    assert_captured(&a);
    let records = netns_records(&n);
    assert_eq!(records[0]["attachments"].as_array().unwrap().len(), 1);

    // The last attachment's DEL removes the rules and the record.
    n.del(&chain, &a).unwrap();
    assert_no_interlock_rules(&a.ns);
    assert!(netns_records(&n).is_empty());
    let left: Vec<_> = std::fs::read_dir(n.state.path().join("netns"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// A failed ADD of a second attachment leaves the first one's rules in force: a
/// conflicting spec is refused without touching them; a re-apply whose probe fails (the
/// outbound port is taken) keeps them instead of removing them.
#[test]
fn a_failed_add_of_another_attachment_keeps_the_rules() {
    require_root!();
    let n = Node::new(false);
    let chain = n.chain(json!({ "backend": "nftables" }));
    let only = n.only_interlock(&chain);
    let a = n.add(&chain, "a", Some(ISTIO.annotations()));

    // Another spec for the same netns: refused, named, eth0 untouched.
    let mut ann = ISTIO.annotations();
    ann["traffic.sidecar.istio.io/excludeOutboundPorts"] = json!("5432");
    let net1 = on_if(&a, "net1").with_capability("io.kubernetes.cri.pod-annotations", ann);
    let e = n
        .exec_interlock(&only, Verb::Add, &net1, &a.result)
        .unwrap_err();
    let (code, msg) = cni_error(&e);
    assert_eq!(code, 102, "{e}");
    assert!(
        msg.contains("already holds interlock's rules for attachment")
            && msg.contains("another spec"),
        "{msg}"
    );
    assert!(
        e.to_string().contains("interlock's rules were kept"),
        "details name the kept rules: {e}"
    );
    assert!(n.state_of_if(&a.rt, "net1").is_none());
    n.check(&only, &a).unwrap();
    assert_captured(&a);

    // The rules were altered, and the re-apply's probe cannot listen on 15001.
    delete_uid_rule(&a.ns, "nftables", ISTIO.uid);
    let squatter: TcpListener =
        in_netns(&a.ns.path(), || TcpListener::bind(loopback(false, 15001)))
            .unwrap()
            .unwrap();
    let net1 = on_if(&a, "net1");
    let e = n
        .exec_interlock(&only, Verb::Add, &net1, &a.result)
        .unwrap_err();
    assert_eq!(cni_error(&e).0, 104, "{e}");
    assert!(e.to_string().contains("interlock's rules were kept"), "{e}");
    drop(squatter);
    // Re-applied (exact again) and kept: eth0 is protected.
    n.check(&only, &a).unwrap();
    assert_captured(&a);
    // The runtime's DEL after the failed ADD does not strip eth0 either.
    n.exec_interlock(&only, Verb::Del, &net1, &a.result)
        .unwrap();
    n.check(&only, &a).unwrap();
    n.del(&chain, &a).unwrap();
    assert_no_interlock_rules(&a.ns);
}

/// 32 concurrent ADDs into one netns (four interfaces, each added eight times at once):
/// every ADD that succeeded is backed by rules at the end, CHECK passes for each
/// attachment, and the record lists exactly them.
#[test]
fn concurrent_adds_into_one_netns_all_end_protected() {
    require_root!();
    let n = Node::new(false);
    let chain = n.chain(json!({ "backend": "nftables" }));
    let only = n.only_interlock(&chain);
    // The pod is created without rules; then the storm.
    let a = n.add(&chain, "a", Some(json!({})));
    let ifnames = ["eth0", "net1", "net2", "net3"];
    let results: Vec<(String, bool, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..32)
            .map(|i| {
                let ifname = ifnames[i % 4];
                let rt = on_if(&a, ifname)
                    .with_capability("io.kubernetes.cri.pod-annotations", ISTIO.annotations());
                let (n, only, prev) = (&n, &only, &a.result);
                s.spawn(move || {
                    let r = n.exec_interlock(only, Verb::Add, &rt, prev);
                    (
                        ifname.to_string(),
                        r.is_ok(),
                        r.err().map(|e| e.to_string()).unwrap_or_default(),
                    )
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ok: BTreeSet<&str> = results
        .iter()
        .filter(|(_, ok, _)| *ok)
        .map(|(i, _, _)| i.as_str())
        .collect();
    let failures: Vec<&String> = results.iter().filter(|r| !r.1).map(|r| &r.2).collect();
    assert_eq!(
        failures.len(),
        0,
        "every ADD succeeds (serialised per netns): {failures:?}"
    );
    assert!(rules_count(&a) >= 2);
    for ifname in &ok {
        let rt = on_if(&a, ifname);
        n.node
            .run(|| only.check(&rt, &a.result))
            .unwrap_or_else(|e| panic!("CHECK {ifname}: {e}\n{}", n.log()));
    }
    assert_captured(&a);
    let records = netns_records(&n);
    assert_eq!(records.len(), 1);
    let listed: BTreeSet<&str> = records[0]["attachments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["ifname"].as_str().unwrap())
        .collect();
    assert_eq!(listed, ok);
    for ifname in ifnames {
        n.exec_interlock(&only, Verb::Del, &on_if(&a, ifname), &a.result)
            .unwrap();
    }
    assert_no_interlock_rules(&a.ns);
}

/// The kernel gives a new netns the inode of one just deleted, so a pod deleted without
/// a DEL leaves a record and a state that name the new pod's netns identity. The dead
/// attachment must not count as relying on the new netns's rules (else the new pod, with
/// another spec, would be refused): here its recorded netns path names another netns.
#[test]
fn a_dead_pods_reference_does_not_bind_a_reused_netns_identity() {
    require_root!();
    use std::os::unix::fs::MetadataExt;
    let n = Node::new(false);
    let chain = n.chain(json!({ "backend": "nftables" }));
    let only = n.only_interlock(&chain);
    let a = n.add(&chain, "a", Some(ISTIO.annotations()));
    let b = n.add(&chain, "b", Some(json!({})));
    // As if A's netns had had B's inode and died without a DEL.
    let m = std::fs::metadata(b.ns.path()).unwrap();
    let reused = format!("{}-{}", m.dev(), m.ino());
    let state_file = n
        .state
        .path()
        .join(format!("attachments/{}+eth0.json", a.rt.container_id));
    let mut sa: Value = serde_json::from_slice(&std::fs::read(&state_file).unwrap()).unwrap();
    let old_id = sa["netnsId"].as_str().unwrap().to_string();
    let netns_dir = n.state.path().join("netns");
    let mut record: Value =
        serde_json::from_slice(&std::fs::read(netns_dir.join(format!("{old_id}.json"))).unwrap())
            .unwrap();
    record["netnsId"] = json!(reused);
    std::fs::write(netns_dir.join(format!("{reused}.json")), record.to_string()).unwrap();
    sa["netnsId"] = json!(reused);
    std::fs::write(&state_file, sa.to_string()).unwrap();

    // B becomes meshed with another spec: protected on its own, not refused.
    let mut ann = ISTIO.annotations();
    ann["traffic.sidecar.istio.io/excludeOutboundPorts"] = json!("5432");
    let rt =
        b.rt.clone()
            .with_capability("io.kubernetes.cri.pod-annotations", ann);
    n.exec_interlock(&only, Verb::Add, &rt, &b.result)
        .unwrap_or_else(|e| panic!("{e}\n{}", n.log()));
    let sb = n.state_of(&b.rt).unwrap();
    assert_eq!(sb["protection"]["protection"], "protected", "{sb}");
    assert!(
        !sb["protection"]["backendReason"]
            .as_str()
            .unwrap()
            .starts_with("shared"),
        "{sb}"
    );
    n.node.run(|| only.check(&rt, &b.result)).unwrap();
    n.exec_interlock(&only, Verb::Del, &rt, &b.result).unwrap();
    assert_no_interlock_rules(&b.ns);
    n.del(&chain, &a).unwrap();
}

//! The guard role (issue 29): interlock-cni behind the reference `bridge` plugin, in a
//! real node netns, with the entry's `guard` set. It never writes a rule; in hold it
//! refuses meshed pods with 11 and lets every other pod through with the bridge's result;
//! out of hold it passes meshed pods and tells the agent.

use crate::common::*;
use interlock_cni_types::{CniResult, Command as Verb};
use interlock_testkit::{require_root, Netns};
use serde_json::{json, Value};

/// No rule of any kind in the pod's netns: no nft table, no iptables rule in any family
/// or flavour (the bridge plugin writes none there either).
fn assert_untouched(ns: &Netns) {
    let ruleset = ns.exec_ok(&["nft", "list", "ruleset"]);
    assert!(ruleset.trim().is_empty(), "nft ruleset: {ruleset}");
    let rules = all_rules(ns);
    assert!(
        !rules.lines().any(|l| l.starts_with("-A")),
        "iptables rules: {rules}"
    );
}

fn role(mesh: &str, hold: bool) -> Value {
    json!({"guard": {
        "mesh": mesh,
        "hold": hold,
        "reason": "istio-cni binary missing from /opt/cni/bin (installer restarting?)",
        "excludeNamespaces": ["kube-system"],
    }})
}

/// In hold, a meshed Istio pod gets 11 with a message naming it, the mesh's plugin and
/// the reason; nothing is written in its netns, and its DEL passes.
#[test]
fn hold_refuses_a_meshed_pod_with_try_again_later() {
    require_root!();
    let n = Node::new(false);
    let chain = n.chain(role("istio", true));
    let (ns, rt, r) = n.try_add(&chain, "held-0", Some(ISTIO.annotations()));
    let e = r.expect_err("a meshed pod must be held");
    let (code, msg) = cni_error(&e);
    assert_eq!(code, 11, "{msg}");
    assert!(
        msg.contains("shop/held-0")
            && msg.contains("istio-cni")
            && msg.contains("binary missing from /opt/cni/bin")
            && msg.contains("held"),
        "{msg}"
    );
    assert_untouched(&ns);
    assert!(
        !n.state.path().join("attachments").exists()
            || std::fs::read_dir(n.state.path().join("attachments"))
                .unwrap()
                .next()
                .is_none(),
        "the guard role keeps no state"
    );
    // The runtime's DEL after the failed ADD passes through the whole chain.
    n.node.run(|| chain.del(&rt, None)).unwrap();
}

/// In hold, a pod the mesh does not capture (no sidecar.istio.io/status) passes with
/// the bridge's result unchanged, and so does an Istio pod in an excluded namespace;
/// nothing is written.
#[test]
fn hold_passes_unmeshed_pods_with_the_bridges_result() {
    require_root!();
    let n = Node::new(false);
    let chain = n.chain(role("istio", true));
    let only = n.only_interlock(&chain);
    let pod = n.add(&chain, "plain-0", Some(json!({"app": "web"})));
    let ip = pod.ip(false);
    assert!(
        ip.to_string().starts_with("10.99.7."),
        "bridge's address: {ip}"
    );
    let addrs = pod.ns.exec_ok(&["ip", "-o", "addr", "show", "dev", "eth0"]);
    assert!(addrs.contains(&ip.to_string()), "{addrs}");
    assert_untouched(&pod.ns);
    // interlock-cni alone, given the bridge's result: the same result back.
    let out = n
        .exec_interlock(&only, Verb::Add, &pod.rt, &pod.result)
        .unwrap();
    assert_eq!(CniResult::parse(&out, None).unwrap(), pod.result);
    // CHECK and DEL pass.
    n.check(&only, &pod).unwrap();
    n.del(&chain, &pod).unwrap();

    // An Istio pod in a namespace istio-cni excludes.
    let ns = Netns::new("pod").unwrap();
    let rt = n
        .runtime_conf(&ns, "sys-0", Some(ISTIO.annotations()))
        .with_arg("K8S_POD_NAMESPACE", "kube-system");
    let r = n.node.run(|| chain.add(&rt));
    r.unwrap_or_else(|e| panic!("an excluded namespace's pod passes: {e}\n{}", n.log()));
    assert_untouched(&ns);
    let log = n.log();
    assert!(
        log.contains("kube-system/sys-0: guard (istio): passed, not meshed: namespace kube-system is excluded"),
        "{log}"
    );
}

/// With `failurePolicy: open`, hold lets a meshed pod through and logs it at error
/// level; still nothing is written.
#[test]
fn hold_with_failure_policy_open_passes_and_says_so() {
    require_root!();
    let n = Node::new(false);
    let mut r = role("istio", true);
    r["failurePolicy"] = json!("open");
    let pod = n.add(&n.chain(r), "open-0", Some(ISTIO.annotations()));
    assert_untouched(&pod.ns);
    let log = n.log();
    assert!(
        log.contains("ERROR")
            && log.contains("shop/open-0")
            && log.contains("WITHOUT its traffic captured"),
        "{log}"
    );
}

/// Out of hold, a meshed pod passes (the mesh's plugin follows) and the agent hears of
/// its ADD, so its audit probes the sandbox; nothing is written.
#[test]
fn out_of_hold_a_meshed_pod_passes_and_the_agent_is_told() {
    require_root!();
    let n = Node::new(false);
    let chain = n.chain(role("istio", false));
    let pod = n.add(&chain, "meshed-0", Some(ISTIO.annotations()));
    assert!(
        n.agent.noted(&pod.ns.path().display().to_string()),
        "no ADD note reached the agent\n{}",
        n.log()
    );
    assert_untouched(&pod.ns);
    let log = n.log();
    assert!(
        log.contains("shop/meshed-0: guard (istio): meshed"),
        "{log}"
    );
}

/// A pod whose annotations nobody can tell (no capability passed them, no agent): held
/// in hold (fail closed, the message says why), passed to the mesh's plugin otherwise.
#[test]
fn an_undecidable_pod_is_held_only_in_hold() {
    require_root!();
    let n = Node::new(false);
    let without_agent = |hold: bool| {
        let mut r = role("consul", hold);
        r["agentSocket"] = Value::Null;
        n.chain(r)
    };
    let (ns, _, r) = n.try_add(&without_agent(true), "unknown-0", None);
    let (code, msg) = cni_error(&r.expect_err("undecidable in hold must be held"));
    assert_eq!(code, 11, "{msg}");
    assert!(
        msg.contains("shop/unknown-0")
            && msg.contains("consul-cni")
            && msg.contains("cannot be told"),
        "{msg}"
    );
    assert_untouched(&ns);
    let pod = n.add(&without_agent(false), "unknown-1", None);
    assert_untouched(&pod.ns);
    let log = n.log();
    assert!(
        log.contains("shop/unknown-1: guard (consul): passed, consul-cni decides"),
        "{log}"
    );
}

/// Linkerd, in hold: linkerd-cni decides on the pod's containers, so a pod without
/// Linkerd's annotations is looked up; the agent says it runs `linkerd-proxy` (the
/// stand-in's pods do), so it is held. Without an agent only the annotations are known:
/// no `linkerd.io/proxy-version`, not meshed, passed.
#[test]
fn linkerd_hold_asks_the_agent_for_the_containers() {
    require_root!();
    let n = Node::new(false);
    let (ns, _, r) = n.try_add(&n.chain(role("linkerd", true)), "hand-0", Some(json!({})));
    let (code, msg) = cni_error(&r.expect_err("a pod running linkerd-proxy must be held"));
    assert_eq!(code, 11, "{msg}");
    assert!(
        msg.contains("shop/hand-0") && msg.contains("linkerd-cni"),
        "{msg}"
    );
    assert_untouched(&ns);
    let mut without_agent = role("linkerd", true);
    without_agent["agentSocket"] = Value::Null;
    let pod = n.add(&n.chain(without_agent), "hand-1", Some(json!({})));
    assert_untouched(&pod.ns);
    let log = n.log();
    assert!(
        log.contains(
            "shop/hand-1: guard (linkerd): passed, not meshed: no linkerd.io/proxy-version"
        ),
        "{log}"
    );
}

/// STATUS in the guard role succeeds in hold, even where the redirecting role's STATUS
/// fails (a spec-reading profile without an agent socket).
#[test]
fn status_succeeds_in_hold() {
    require_root!();
    let n = Node::new(false);
    let status = |extra: Value| {
        let doc = json!({
            "cniVersion": "1.1.0", "name": "ilnet",
            "plugins": [n.interlock_entry(extra)],
        });
        let list = interlock_libcni::parse_conflist(doc.to_string().as_bytes()).unwrap();
        interlock_libcni::exec::Chain::new(list, vec![n.bins.path().into()])
            .unwrap()
            .status()
    };
    let e = status(json!({"agentSocket": null, "profiles": ["istio"]}))
        .expect_err("the redirecting role's STATUS fails without an agent for istio");
    assert_eq!(cni_error(&e).0, 50);
    let mut held = role("istio", true);
    held["agentSocket"] = Value::Null;
    held["profiles"] = json!(["istio"]);
    status(held).unwrap_or_else(|e| panic!("STATUS in hold: {e}"));
}

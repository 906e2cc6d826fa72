//! Pods whose annotations the runtime did not pass (the interlock-cni entry declares no
//! `io.kubernetes.cri.pod-annotations` capability): interlock-cni asks the agent socket
//! (its only other source: it carries no Kubernetes client) and fails closed (11) saying
//! why when the agent cannot tell. The agent is a Unix socket served by a test thread.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::common::*;
use interlock_contract::agent_socket::{answer_request, PodRef, Response};
use interlock_redirect::probe::original_dst;
use interlock_testkit::require_root;
use serde_json::{json, Value};

/// A fake agent on a Unix socket; counts the lookups it gets (a connection that only
/// brings an ADD note is not a lookup) and keeps the notes' sandbox IDs.
fn fake_agent(
    dir: &Path,
    reply: impl Fn(&PodRef) -> Response + Send + Sync + 'static,
) -> (PathBuf, Arc<AtomicUsize>) {
    fake_agent_with_notes(dir, reply).0
}

type Notes = Arc<std::sync::Mutex<Vec<String>>>;

fn fake_agent_with_notes(
    dir: &Path,
    reply: impl Fn(&PodRef) -> Response + Send + Sync + 'static,
) -> ((PathBuf, Arc<AtomicUsize>), Notes) {
    let sock = dir.join("agent.sock");
    let l = UnixListener::bind(&sock).unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let notes: Notes = Arc::default();
    let (count, noted) = (seen.clone(), notes.clone());
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let mut line = String::new();
            if BufReader::new(&s).read_line(&mut line).is_ok() {
                let answer = answer_request(
                    &line,
                    |p| {
                        count.fetch_add(1, Ordering::SeqCst);
                        reply(p)
                    },
                    |n| {
                        noted.lock().unwrap().push(n.sandbox.clone());
                        Response::Noted { v: 1 }
                    },
                );
                let _ = s.write_all(answer.as_bytes());
            }
        }
    });
    ((sock, seen), notes)
}

/// The agent's answer for a pod it has in its cache: annotations and spec facts (a pod
/// running both meshes' proxies: each profile looks for its own).
fn found(annotations: &[(&str, &str)], uid: &str) -> Response {
    Response::Found {
        v: 1,
        uid: Some(uid.into()),
        annotations: annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        facts: Some(interlock_testkit::pods::mesh_proxies()),
        noted: false,
    }
}

/// The entry without the annotations capability: the runtime passes none.
fn no_capability(extra: Value) -> Value {
    let mut e = json!({"capabilities": null, "backend": "nftables"});
    for (k, v) in extra.as_object().unwrap() {
        e[k] = v.clone();
    }
    e
}

/// A → B:8080 from A lands on A's outbound port `port` with B:8080 as original destination.
fn assert_outbound_captured(a: &Pod, b: &Pod, port: u16) {
    let out_l = listen(&a.ns, loopback(false, port));
    let b8080 = SocketAddr::new(b.ip(false), 8080);
    let local = connect_as_root(&a.ns, b8080);
    let (c, peer) = accept_within(&out_l, WAIT).expect("captured at the outbound port");
    assert_eq!(peer, local);
    assert_eq!(original_dst(&c, family(false)).unwrap(), b8080);
}

#[test]
fn agent_answers_when_the_runtime_passed_no_annotations() {
    require_root!();
    let n = Node::new(false);
    let dir = interlock_testkit::tempdir().unwrap();
    let ((sock, calls), notes) = fake_agent_with_notes(dir.path(), |p| match p.name.as_str() {
        "a" => found(ISTIO.annotations, "uid-a"),
        _ => found(&[("team", "shop")], &format!("uid-{}", p.name)),
    });
    let chain = n.chain(no_capability(json!({ "agentSocket": sock })));
    let b = n.add(&chain, "b", Some(json!({"ignored": "not passed"})));
    let a = n.add(&chain, "a", None);
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    let sa = n.state_of(&a.rt).unwrap();
    assert_eq!(sa["annotationsSource"], "agent", "{sa}");
    assert_eq!(sa["decision"]["profile"], "istio");
    assert_eq!(sa["protection"]["protection"], "protected", "{sa}");
    assert!(sa["pod"]["annotations"]["sidecar.istio.io/status"].is_string());
    let sb = n.state_of(&b.rt).unwrap();
    assert_eq!(sb["annotationsSource"], "agent");
    assert_eq!(sb["decision"]["decision"], "not-meshed", "{sb}");
    assert_outbound_captured(&a, &b, ISTIO.outbound);

    // When the runtime passes annotations, only a pod whose profile reads its spec
    // (Linkerd's, d) is looked up; one without mesh annotations (c) is not.
    let with_cap = n.chain(json!({ "agentSocket": sock, "backend": "nftables" }));
    let c = n.add(&with_cap, "c", Some(Value::Null));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the agent was asked about c"
    );
    let d = n.add(&with_cap, "d", Some(LINKERD.annotations()));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "the agent was not asked for d's spec"
    );
    assert_eq!(
        n.state_of(&c.rt).unwrap()["annotationsSource"],
        "runtime-config"
    );
    assert_eq!(
        n.state_of(&d.rt).unwrap()["protection"]["protection"],
        "protected"
    );
    // Each ADD the agent heard of was noted: the lookups made for an ADD (a, b, d) are
    // their notes, meshed or not; c, neither looked up nor meshed, sent none.
    let wait = std::time::Instant::now();
    while notes.lock().unwrap().len() < 3 && wait.elapsed() < WAIT {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let mut got = notes.lock().unwrap().clone();
    got.sort();
    let mut want = vec![
        a.rt.container_id.clone(),
        b.rt.container_id.clone(),
        d.rt.container_id.clone(),
    ];
    want.sort();
    assert_eq!(got, want);
    for p in [&a, &b, &c, &d] {
        n.del(&chain, p).unwrap();
    }
}

#[test]
fn undecidable_pod_fails_closed_saying_why() {
    require_root!();
    let n = Node::new(false);
    let dir = interlock_testkit::tempdir().unwrap();

    // Nothing there: no socket.
    let missing_sock = dir.path().join("nope.sock");
    let chain = n.chain(no_capability(json!({ "agentSocket": missing_sock })));
    let (ns, rt, r) = n.try_add(&chain, "a", None);
    let e = r.unwrap_err();
    let (code, msg) = cni_error(&e);
    assert_eq!(code, 11, "{e}");
    assert!(
        msg.starts_with("pod shop/a: step lookup failed:")
            && msg.contains(&missing_sock.display().to_string()),
        "{msg}"
    );
    assert!(n.state_of(&rt).is_none());
    assert_no_interlock_rules(&ns);
    n.node.run(|| chain.del(&rt, None)).unwrap();

    // The agent answers without authority: undecided, or notFound (its cache may lag
    // behind the kubelet; the pod being added exists).
    for (reply, why) in [
        (
            Response::Undecided {
                v: 1,
                reason: "pod cache not synced".into(),
            },
            "pod cache not synced",
        ),
        (Response::NotFound { v: 1 }, "not authoritative"),
    ] {
        let d = interlock_testkit::tempdir().unwrap();
        let (sock, _) = fake_agent(d.path(), move |_| reply.clone());
        let chain = n.chain(no_capability(json!({ "agentSocket": sock })));
        let (_ns, rt, r) = n.try_add(&chain, "a", None);
        let e = r.unwrap_err();
        let (code, msg) = cni_error(&e);
        assert_eq!(code, 11, "{e}");
        assert!(msg.contains(why), "{msg}");
        n.node.run(|| chain.del(&rt, None)).unwrap();
    }
    let (sock, _) = fake_agent(dir.path(), |_| Response::Undecided {
        v: 1,
        reason: "pod cache not synced".into(),
    });

    // failurePolicy open: the pod starts, recorded unprotected, logged at error level.
    let open = n.chain(no_capability(
        json!({ "agentSocket": sock, "failurePolicy": "open" }),
    ));
    let p = n.add(&open, "a", None);
    let s = n.state_of(&p.rt).unwrap();
    assert_eq!(s["protection"]["protection"], "unprotected", "{s}");
    assert_eq!(s["protection"]["step"], "lookup", "{s}");
    let log = n.log();
    assert!(
        log.lines().any(|l| l.contains(" ERROR ")
            && l.contains("pod shop/a runs WITHOUT traffic redirection")
            && l.contains("pod cache not synced")),
        "{log}"
    );
    // Excluded namespaces are never looked up.
    let excluded = n.chain(no_capability(
        json!({ "agentSocket": missing_sock, "excludeNamespaces": ["shop"] }),
    ));
    let x = n.add(&excluded, "x", None);
    assert_eq!(n.state_of(&x.rt).unwrap()["decision"]["decision"], "skip");
}

/// The forged agent (`interlock_testkit::forged_agent`): any pod is "meshed"; only
/// does anything in the child `a_socket_served_by_another_user_is_not_trusted` starts.
#[test]
fn forged_agent_child() {
    interlock_testkit::forged_agent::serve_if_child(&[("interlock.dev/redirect", "enabled")]);
}

/// The agent socket's answer decides whether a pod is meshed, so it counts only from a
/// root-owned socket in a root-owned directory that others cannot write, served by a root
/// process (issue 7 item 9, review L11). A socket an unprivileged user (65534) serves is
/// refused both where that user could bind it (a world-writable directory) and after
/// root moved it into a root-owned directory and made it root's (SO_PEERCRED): the ADD
/// fails closed (11) naming the refusal, and the forged "meshed" answer installs nothing.
#[test]
fn a_socket_served_by_another_user_is_not_trusted() {
    require_root!();
    let mut forger =
        interlock_testkit::forged_agent::ForgedAgent::start("lookup::forged_agent_child", 65534);
    let forged = forger.socket.clone();
    // Moved by root into a root-owned directory and made root's: only SO_PEERCRED tells.
    use std::os::unix::fs::PermissionsExt;
    let closed = interlock_testkit::tempdir().unwrap();
    std::fs::set_permissions(closed.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let n = Node::new(false);
    for (socket, refusal) in [
        (forged.clone(), "owned by uid 65534"),
        (
            closed.path().join("agent.sock"),
            "runs as uid 65534, not root",
        ),
    ] {
        if socket != forged {
            forger.move_into(closed.path());
        }
        let chain = n.chain(no_capability(json!({ "agentSocket": socket })));
        let (ns, rt, r) = n.try_add(&chain, "web", None);
        let e = r.unwrap_err();
        let (code, msg) = cni_error(&e);
        assert_eq!(code, 11, "{e}");
        assert!(
            msg.contains(&format!("agent socket {}", socket.display())) && msg.contains(refusal),
            "{msg}"
        );
        assert_no_interlock_rules(&ns);
        assert!(n.state_of(&rt).is_none());
        n.node.run(|| chain.del(&rt, None)).unwrap();
    }
}

//! `interlock validate` run inside a real network namespace (as an init container runs
//! in its pod's): without interlock's rules it exits 2 (NOT protected) so the pod fails
//! to start; with them it proves the redirection and exits 0; a pod that is not meshed
//! passes; a proof that cannot be made (the proxy port taken) exits 3. An unredirected
//! probe SYN reaches only the test's second netns (its gateway).

use crate::common;

use common::*;
use interlock_contract::config::PluginConfig;
use interlock_redirect::backend::BackendKind;
use interlock_testkit::{require_root, Netns};
use std::process::Command;

const GATEWAY: &str = "10.213.7.1";

/// A pod netns whose default route goes through a veth to a second netns of the test's
/// own (the "node", holding the gateway address), as a bridge or ptp primary leaves it.
fn pod_netns() -> (Netns, Netns) {
    let pod = Netns::new("valp").unwrap();
    let node = Netns::new("valn").unwrap();
    let ip = |ns: &Netns, args: &[&str]| {
        let ok = Command::new("ip")
            .args(["-n", ns.name()])
            .args(args)
            .status()
            .unwrap()
            .success();
        assert!(ok, "ip -n {} {args:?}", ns.name());
    };
    ip(
        &pod,
        &[
            "link",
            "add",
            "eth0",
            "type",
            "veth",
            "peer",
            "name",
            "gw0",
            "netns",
            node.name(),
        ],
    );
    ip(&pod, &["addr", "add", "10.213.7.2/24", "dev", "eth0"]);
    ip(&pod, &["link", "set", "eth0", "up"]);
    ip(&pod, &["route", "add", "default", "via", GATEWAY]);
    ip(
        &node,
        &["addr", "add", &format!("{GATEWAY}/24"), "dev", "gw0"],
    );
    ip(&node, &["link", "set", "gw0", "up"]);
    (pod, node)
}

fn validate(ns: &Netns, args: &[&str]) -> (i32, String, String) {
    let out = Command::new("ip")
        .args(["netns", "exec", ns.name()])
        .arg(interlock())
        .args(["validate", "--timeout-ms", "300"])
        .args(args)
        .env_remove("POD_NAMESPACE")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn validate_fails_the_pod_without_rules_and_proves_them_with() {
    require_root!();
    let (ns, _node) = pod_netns();
    let istio = ["--annotation", "sidecar.istio.io/status={}"];

    let (code, _, err) = validate(&ns, &istio);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("NOT PROTECTED") && err.contains("15001"),
        "{err}"
    );

    // Not meshed: nothing to prove.
    let (code, out, err) = validate(&ns, &["--annotation", "app=web"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("not meshed"), "{out}");

    // The rules the plugin would install for these annotations.
    let mut a = std::collections::BTreeMap::new();
    a.insert("sidecar.istio.io/status".to_string(), "{}".to_string());
    let interlock_redirect::decision::Decision::Meshed { spec, .. } =
        interlock_redirect::decision::decide(
            &PluginConfig::default(),
            "",
            "t",
            Some(&a),
            Some(&interlock_testkit::pods::istio_sidecar()),
        )
    else {
        panic!("not meshed")
    };
    interlock_redirect::engine::install_and_prove(
        &ns.path(),
        &spec,
        BackendKind::Nftables,
        &[GATEWAY.parse().unwrap()],
    )
    .unwrap();
    let (code, out, err) = validate(&ns, &istio);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("PROTECTED") && out.contains(GATEWAY), "{out}");
    let (code, out, _) = validate(&ns, &[istio[0], istio[1], "-o", "json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(
        (v["verdict"].as_str(), v["exitCode"].as_u64()),
        (Some("protected"), Some(0))
    );

    // The annotations as the downward API mounts them.
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("annotations");
    std::fs::write(
        &file,
        "kubernetes.io/config.seen=\"2026-11-24T09:00:00Z\"\nsidecar.istio.io/status=\"{\\\"initContainers\\\":null}\"\n",
    )
    .unwrap();
    let (code, out, err) = validate(&ns, &["--annotations-file", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("PROTECTED"), "{out}");
    let (code, _, err) = validate(&ns, &["--annotations-file", "/nonexistent/annotations"]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("/nonexistent/annotations"), "{err}");

    // The proxy's port already taken in the pod: the proof cannot be made (3).
    let holder = ns.run(|| std::net::TcpListener::bind("127.0.0.1:15001").unwrap());
    let (code, _, err) = validate(&ns, &istio);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("COULD NOT VALIDATE"), "{err}");
    drop(holder);
}

/// A netns where nothing is routable (only `lo`, no rules): no connection can show
/// anything about the redirection, so validate does not say PROTECTED; it fails the pod
/// (fail closed) and says why.
#[test]
fn nothing_routable_is_not_called_protected() {
    require_root!();
    let ns = Netns::new("valo").unwrap();
    let up = Command::new("ip")
        .args(["-n", ns.name(), "link", "set", "lo", "up"])
        .status()
        .unwrap();
    assert!(up.success());
    let (code, out, err) = validate(&ns, &["--annotation", "sidecar.istio.io/status={}"]);
    assert_eq!(code, 3, "{out}{err}");
    assert!(!out.contains("PROTECTED"), "{out}");
    assert!(err.contains("nothing routable to prove"), "{err}");
    assert!(!err.contains("installed for it anyway"), "{err}");
    // The same as a document, on stdout.
    let (code, out, _) = validate(
        &ns,
        &["--annotation", "sidecar.istio.io/status={}", "-o", "json"],
    );
    assert_eq!(code, 3);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["kind"], "Validation");
    assert_eq!(v["schemaVersion"], 1);
    assert_eq!(v["verdict"], "could-not-validate");
    assert_eq!(v["exitCode"], 3);
    assert!(
        v["message"].as_str().unwrap().contains("nothing routable"),
        "{v}"
    );
}

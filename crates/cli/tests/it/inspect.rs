//! `interlock inspect netns` on a real network namespace: the spec the annotations ask
//! for, the rules present (read with nft inside the netns), the difference, and the
//! verdict's exit code — before and after the rules are applied, for a pod that is not
//! meshed, and for a netns nobody can tell about. Read-only: inspect changes nothing.

use crate::common;

use common::*;
use interlock_contract::config::PluginConfig;
use interlock_redirect::backend::BackendKind;
use interlock_testkit::{require_root, Netns};
use serde_json::Value;

/// A meshed pod's annotation that decides without the pod's spec (the generic profile's).
const MESHED: &str = "interlock.dev/redirect=enabled";

fn inspect(d: &Dirs, ns: &Netns, extra: &[&str]) -> (i32, Value) {
    let out = std::process::Command::new(interlock())
        .args(["inspect", "netns"])
        .arg(ns.path())
        .arg("--state-dir")
        .arg(&d.state)
        .arg("--cni-conf-dir")
        .arg(&d.conf)
        .args(["--cri-endpoint", "none", "-o", "json"])
        .args(extra)
        .output()
        .unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "inspect -o json: {e}\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), v)
}

fn nft_ruleset(ns: &Netns) -> String {
    ns.exec_ok(&["nft", "list", "ruleset"])
}

#[test]
fn inspect_netns_shows_spec_rules_and_difference() {
    require_root!();
    let d = Dirs::new();
    let ns = Netns::new("insp").unwrap();

    // Meshed by its annotations, no rules: unprotected (2), the difference says what
    // is missing, nothing of ours is present — and inspect installed nothing.
    let (code, v) = inspect(&d, &ns, &["--annotation", MESHED]);
    assert_eq!(code, 2, "{v:#}");
    assert_eq!(v["kind"], "Inspection");
    assert_eq!(v["verdict"], "unprotected");
    assert_eq!(v["spec"]["source"], "--annotation flags");
    assert_eq!(v["spec"]["spec"]["proxyUid"], 1337, "{v:#}");
    assert_eq!(v["spec"]["spec"]["inbound"]["proxyPort"], 15006, "{v:#}");
    assert!(!v["difference"].as_array().unwrap().is_empty(), "{v:#}");
    assert_eq!(v["rulesPresent"], serde_json::json!([]));
    assert!(
        !nft_ruleset(&ns).contains("interlock"),
        "inspect changed the netns"
    );

    // The rules the same decision asks for, applied: protected (0), listed.
    let plugin = PluginConfig::from_map(&interlock_agent::plugin_entry(&d.state)).unwrap();
    let mut a = std::collections::BTreeMap::new();
    a.insert("interlock.dev/redirect".to_string(), "enabled".to_string());
    let interlock_redirect::decision::Decision::Meshed { spec, .. } =
        interlock_redirect::decision::decide(&plugin, "", "test", Some(&a), None)
    else {
        panic!("not meshed")
    };
    let mut spec = *spec;
    spec.ipv4 = true;
    spec.ipv6 = true;
    interlock_redirect::engine::install_and_prove(&ns.path(), &spec, BackendKind::Nftables, &[])
        .unwrap();
    let (code, v) = inspect(&d, &ns, &["--annotation", MESHED]);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["verdict"], "protected");
    assert_eq!(v["difference"], serde_json::json!([]));
    let present = v["rulesPresent"].as_array().unwrap();
    assert!(
        present
            .iter()
            .any(|l| l.as_str().unwrap().contains("table inet interlock")),
        "{v:#}"
    );
    assert!(
        present
            .iter()
            .any(|l| l.as_str().unwrap().contains("15001")),
        "{v:#}"
    );

    // Another spec (an excluded port) against these rules: unprotected, and the
    // difference says how.
    let (code, v) = inspect(
        &d,
        &ns,
        &[
            "--annotation",
            MESHED,
            "--annotation",
            "interlock.dev/exclude-outbound-ports=9999",
        ],
    );
    assert_eq!(code, 2, "{v:#}");
    assert!(!v["difference"].as_array().unwrap().is_empty(), "{v:#}");

    // Not meshed: 0, no spec.
    let (code, v) = inspect(&d, &ns, &["--annotation", "app=web"]);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["verdict"], "not-meshed");
    assert_eq!(v["spec"], Value::Null);

    // Nothing says what this netns should hold (no pod over CRI, no record, no
    // annotations): could not decide (3), never a guess.
    let (code, v) = inspect(&d, &ns, &[]);
    assert_eq!(code, 3, "{v:#}");
    assert_eq!(v["verdict"], "unknown");
    assert!(
        v["reason"].as_str().unwrap().contains("--annotation"),
        "{v:#}"
    );

    // The human output names the parts.
    let out = std::process::Command::new(interlock())
        .args(["inspect", "netns"])
        .arg(ns.path())
        .arg("--state-dir")
        .arg(&d.state)
        .args(["--cri-endpoint", "none", "--annotation", MESHED])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    for part in [
        "spec:     from --annotation flags",
        "rules present:",
        "table inet interlock",
        "PROTECTED:",
        // nft's indentation shows as indentation, not as escaped tabs.
        "    chain output {",
    ] {
        assert!(text.contains(part), "{part} in\n{text}");
    }
    assert!(!text.contains("\\x09"), "{text}");
}

#[test]
fn inspect_usage_errors_exit_64() {
    for args in [
        &["inspect", "pod", "no-slash"][..],
        &["inspect", "netns", "/x", "--annotation", "novalue"],
        &["inspect", "pod", "a/b", "-o", "yaml"],
    ] {
        let out = std::process::Command::new(interlock())
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(64), "{args:?}");
    }
}

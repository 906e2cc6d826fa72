//! `interlock check` as a process: its verdict, exit code and JSON follow the node's real
//! state as the agent changes it.

mod common;

use common::*;
use std::process::Command;
use std::time::Duration;

fn check(d: &Dirs, a: Option<&Agent>, json: bool) -> (i32, String) {
    let health = a
        .map(|a| format!("127.0.0.1:{}", a.port))
        .unwrap_or_else(|| "none".into());
    let mut cmd = d.interlock("check");
    cmd.arg("--health-addr").arg(health);
    if json {
        cmd.args(["-o", "json"]);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn check_follows_the_node_from_unprotected_to_protected_and_back() {
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);

    // Before the agent: the race window, stated plainly.
    let (code, text) = check(&d, None, false);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("NOT PROTECTED"), "{text}");
    assert!(
        text.contains("10-calico.conflist") && text.contains("does not contain interlock-cni"),
        "{text}"
    );

    let a = d.agent(&[]);
    let owned = wait_protected(&d, &a);
    let (code, text) = check(&d, Some(&a), false);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains(&format!("loads {owned}")), "{text}");
    assert!(text.contains("PROTECTED: a meshed pod"), "{text}");

    let (code, json) = check(&d, Some(&a), true);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["protected"], true);
    assert_eq!(v["readyz"], 200);
    assert_eq!(
        v["effective"]["chosen"]["path"].as_str().unwrap(),
        d.conf.join(&owned).to_str().unwrap()
    );
    assert!(
        v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["status"] == "ok"),
        "{json}"
    );

    // The agent dies: its marker goes stale and check says so, even though the config
    // file is still in place.
    a.kill9();
    wait_until(
        Duration::from_secs(10),
        || check(&d, None, false).0 == 1,
        || "check still says protected after the agent was killed".into(),
    );
    let (_, text) = check(&d, None, false);
    assert!(text.contains("gone or hung"), "{text}");
}

#[test]
fn check_reports_a_missing_conf_dir_as_an_error() {
    let d = Dirs::new();
    let out = Command::new(interlock())
        .args(["check", "--health-addr", "none", "--cni-conf-dir"])
        .arg(d.tmp.path().join("nope"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("nope"), "{stderr}");
}

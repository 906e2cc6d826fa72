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

/// The config half of `check -o json` for `d` (no agent): `(ok, message)`.
fn check_config(d: &Dirs) -> (bool, String) {
    let (_, json) = check(d, None, true);
    let v: serde_json::Value =
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("check -o json: {e}\n{json}"));
    let config: Vec<&serde_json::Value> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["area"] == "config" && f["status"] != "warn")
        .collect();
    assert_eq!(config.len(), 1, "{json}");
    (
        config[0]["status"] == "ok",
        config[0]["message"].as_str().unwrap().to_string(),
    )
}

/// The agent's readiness verdict on `d`'s conf dir as it is (the guard's own function).
fn agent_config(d: &Dirs) -> Result<String, String> {
    let mut cfg = interlock_agent::AgentConfig::new(plugin());
    cfg.conf_dir = d.conf.clone();
    cfg.bin_dirs = vec![d.bin.clone()];
    cfg.state_dir = d.state.clone();
    let accepts = interlock_agent::install::query_versions(&plugin()).unwrap();
    let snap = interlock_agent::guard::snapshot(&d.conf).unwrap();
    interlock_agent::guard::effective_verdict(&cfg, &snap, &accepts)
}

/// `interlock check` and the agent's readiness judge every fixture conf dir alike,
/// Multus with inline and file delegates included (issue 8: check used to say NOT
/// PROTECTED where the agent said ready), and neither calls a list protected when
/// interlock-cni runs before the primary, twice, or at a version it refuses.
#[test]
fn check_and_the_agent_agree_on_every_fixture_conf_dir() {
    let probe = Dirs::new();
    let ours = serde_json::Value::Object(interlock_agent::plugin_entry(&probe.state));
    let list = |version: &str, plugins: Vec<serde_json::Value>| {
        serde_json::json!({"cniVersion": version, "name": "k8s", "plugins": plugins}).to_string()
    };
    let bridge = serde_json::json!({"type": "bridge", "bridge": "ilagree0"});
    let multus_inline = |with_us: bool| {
        let mut ps = vec![bridge.clone()];
        if with_us {
            ps.push(ours.clone());
        }
        serde_json::json!({"cniVersion": "0.3.1", "name": "multus-cni-network", "type": "multus",
            "kubeconfig": "/etc/cni/net.d/multus.d/multus.kubeconfig",
            "delegates": [{"cniVersion": "1.0.0", "name": "k8s", "plugins": ps}]})
        .to_string()
    };
    let multus_file = r#"{"cniVersion":"0.3.1","name":"multus-cni-network","type":"multus","clusterNetwork":"/etc/cni/net.d/10-calico.conflist","kubeconfig":"/etc/cni/net.d/multus.d/multus.kubeconfig"}"#;
    let multus_file_wrapped =
        serde_json::json!({"cniVersion": "0.3.1", "name": "multus-cni-network", "plugins": [
        serde_json::from_str::<serde_json::Value>(multus_file).unwrap(), ours.clone()]})
        .to_string();
    // (what, files, protected)
    type Case<'a> = (&'a str, Vec<(&'a str, String)>, bool);
    let cases: Vec<Case> = vec![
        (
            "owned copy first",
            vec![
                (
                    "00-interlock.conflist",
                    list("1.0.0", vec![bridge.clone(), ours.clone()]),
                ),
                ("10-calico.conflist", list("1.0.0", vec![bridge.clone()])),
            ],
            true,
        ),
        (
            "primary only",
            vec![("10-calico.conflist", list("1.0.0", vec![bridge.clone()]))],
            false,
        ),
        (
            "foreign file ahead",
            vec![
                ("00-calico.conflist", list("1.0.0", vec![bridge.clone()])),
                (
                    "01-interlock.conflist",
                    list("1.0.0", vec![bridge.clone(), ours.clone()]),
                ),
            ],
            false,
        ),
        (
            "interlock-cni before the primary",
            vec![(
                "10-calico.conflist",
                list("1.0.0", vec![ours.clone(), bridge.clone()]),
            )],
            false,
        ),
        (
            "interlock-cni twice",
            vec![(
                "10-calico.conflist",
                list("1.0.0", vec![ours.clone(), bridge.clone(), ours.clone()]),
            )],
            false,
        ),
        (
            "a version interlock-cni refuses",
            vec![(
                "10-calico.conflist",
                list("0.2.0", vec![bridge.clone(), ours.clone()]),
            )],
            false,
        ),
        (
            "a broken first file",
            vec![
                ("00-broken.conflist", "{\"cniVersion\":".to_string()),
                (
                    "10-calico.conflist",
                    list("1.0.0", vec![bridge.clone(), ours.clone()]),
                ),
            ],
            false,
        ),
        (
            "Multus, inline delegate with interlock-cni",
            vec![("00-multus.conf", multus_inline(true))],
            true,
        ),
        (
            "Multus, inline delegate without it",
            vec![("00-multus.conf", multus_inline(false))],
            false,
        ),
        (
            "Multus, file delegate (clusterNetwork), not wrapped",
            vec![
                ("00-multus.conf", multus_file.to_string()),
                (
                    "10-calico.conflist",
                    list("1.0.0", vec![bridge.clone(), ours.clone()]),
                ),
            ],
            false,
        ),
        (
            "Multus, file delegate, wrapped with interlock-cni after it",
            vec![
                ("00-multus.conflist", multus_file_wrapped),
                ("10-calico.conflist", list("1.0.0", vec![bridge.clone()])),
            ],
            true,
        ),
    ];
    for (what, files, protected) in cases {
        let d = Dirs::new();
        std::fs::copy(plugin(), d.bin.join("interlock-cni")).unwrap();
        // The fixtures carry the entry for the probe's state dir; use that one.
        let d = Dirs {
            state: probe.state.clone(),
            ..d
        };
        for (n, c) in &files {
            d.write(n, c);
        }
        let (check_ok, message) = check_config(&d);
        let agent = agent_config(&d);
        assert_eq!(
            check_ok,
            agent.is_ok(),
            "{what}: check says {message:?}, the agent says {agent:?}"
        );
        assert_eq!(check_ok, protected, "{what}: {message} / {agent:?}");
    }
}

/// A FIFO, a /dev/zero link and a huge file do not stall `check`; a name that is not
/// UTF-8 still gives valid JSON, and a name with terminal escapes is never printed raw.
#[test]
fn hostile_file_names_and_entries_do_not_stall_or_corrupt_check() {
    use std::os::unix::ffi::OsStrExt;
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    mkfifo(&d.conf.join("05-fifo.conflist"));
    std::os::unix::fs::symlink("/dev/zero", d.conf.join("50-zero.conflist")).unwrap();
    std::fs::File::create(d.conf.join("60-big.json"))
        .unwrap()
        .set_len(100 << 20)
        .unwrap();
    let raw = std::ffi::OsStr::from_bytes(b"70-\xff.conflist");
    std::fs::write(d.conf.join(raw), CALICO).unwrap();
    d.write("80-\u{1b}[31mRED\u{1b}[0m\u{1b}[2K.conflist", CALICO);
    let start = std::time::Instant::now();
    let (code, json) = check(&d, None, true);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "check took {:?}",
        start.elapsed()
    );
    assert_eq!(code, 1);
    let v: serde_json::Value =
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("invalid JSON ({e}):\n{json}"));
    let files = v["effective"]["files"].as_array().unwrap();
    assert_eq!(files.len(), 6, "{json}");
    assert_eq!(files[0]["verdict"], "failed-load");
    assert!(
        files[0]["reason"].as_str().unwrap().contains("a FIFO"),
        "{json}"
    );
    assert!(json.contains("70-\\\\xff.conflist"), "{json}");
    let (_, text) = check(&d, None, false);
    assert!(
        !text.contains('\u{1b}'),
        "raw escape sequence printed:\n{text}"
    );
    assert!(text.contains("80-\\x1b[31mRED"), "{text}");
}

/// `INTERLOCK_CNI_BIN_DIR` means the same list of directories to `check` as to `agent`
/// (':'-separated, like CNI_PATH).
#[test]
fn bin_dir_env_is_split_alike_by_agent_and_check() {
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    let bin2 = d.tmp.path().join("bin2");
    std::fs::create_dir_all(&bin2).unwrap();
    let env = format!("{}:{}", bin2.display(), d.bin.display());
    let a = {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = d.tmp.path().join("agent.log");
        let child = Command::new(interlock())
            .args(["agent", "--kube=none", "--cni-conf-dir"])
            .arg(&d.conf)
            .arg("--state-dir")
            .arg(&d.state)
            .arg("--plugin-source")
            .arg(plugin())
            .arg("--health-addr")
            .arg(format!("127.0.0.1:{port}"))
            .env("INTERLOCK_CNI_BIN_DIR", &env)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Agent { child, port, log }
    };
    wait_until(
        Duration::from_secs(10),
        || bin2.join("interlock-cni").exists() && d.bin.join("interlock-cni").exists(),
        || {
            format!(
                "agent did not install into both dirs of {env}; log:\n{}",
                a.log_text()
            )
        },
    );
    let out = Command::new(interlock())
        .args([
            "check",
            "--health-addr",
            "none",
            "-o",
            "json",
            "--cni-conf-dir",
        ])
        .arg(&d.conf)
        .arg("--state-dir")
        .arg(&d.state)
        .env("INTERLOCK_CNI_BIN_DIR", &env)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["binary"]["path"].as_str().unwrap(),
        bin2.join("interlock-cni").to_str().unwrap(),
        "check looked in the first of the agent's dirs"
    );
}

//! `interlock check` as a process: its verdict, exit code and JSON follow the node's real
//! state as the agent changes it.

use crate::common;

use common::*;
use std::process::Command;
use std::time::Duration;

fn check(d: &Dirs, a: Option<&Agent>, json: bool) -> (i32, String) {
    let health = a
        .map(|a| format!("127.0.0.1:{}", a.port))
        .unwrap_or_else(|| "none".into());
    let mut cmd = d.interlock("check");
    // No runtime in these tests: the sandboxes are not listed (tested with containerd
    // in check_sandboxes.rs).
    cmd.args(["--cri-endpoint", "none", "--health-addr"])
        .arg(health)
        // What the agent installs (the real plugin, or the stand-in when it is not built).
        .arg("--plugin-source")
        .arg(plugin());
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

    // Before the agent: the race window, stated plainly (2: unprotected).
    let (code, text) = check(&d, None, false);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("UNPROTECTED"), "{text}");
    assert!(
        text.contains("10-calico.conflist") && text.contains("does not contain interlock-cni"),
        "{text}"
    );

    let a = d.agent(&[]);
    let owned = wait_protected(&d, &a);
    let (code, text) = check(&d, Some(&a), false);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains(&format!("loads {owned}")), "{text}");
    // Which file the copy follows (a changed primary shows here first).
    assert!(
        text.contains(&format!(
            "loads {owned} (interlock's copy of 10-calico.conflist)"
        )),
        "{text}"
    );
    assert!(text.contains("PROTECTED: a meshed pod"), "{text}");

    let (code, json) = check(&d, Some(&a), true);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["protected"], true);
    assert_eq!(v["verdict"], "protected");
    assert_eq!(v["agent"]["readyz"]["status"], 200);
    assert_eq!(v["binary"]["content"], "matches");
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
    // file is still in place (1: at risk).
    a.kill9();
    wait_until(
        Duration::from_secs(10),
        || check(&d, None, false).0 == 1,
        || "check still says protected after the agent was killed".into(),
    );
    let (_, text) = check(&d, None, false);
    assert!(text.contains("gone or hung"), "{text}");
}

/// A check that cannot look exits 3 and still prints its document (issue 12: it printed
/// nothing on stdout with `-o json`).
#[test]
fn check_reports_a_missing_conf_dir_as_could_not_check() {
    let d = Dirs::new();
    for json in [false, true] {
        let mut cmd = Command::new(interlock());
        cmd.args(["check", "--health-addr", "none", "--cni-conf-dir"])
            .arg(d.tmp.path().join("nope"));
        if json {
            cmd.args(["-o", "json"]);
        }
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(3), "{stdout}");
        assert!(stdout.contains("nope"), "{stdout}");
        if json {
            let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
            assert_eq!(v["verdict"], "could-not-check");
            assert_eq!(v["schemaVersion"], 1);
            assert_eq!(v["findings"][0]["id"], "check.conf-dir-missing");
            assert_eq!(v["effective"], serde_json::Value::Null);
        } else {
            assert!(stdout.contains("COULD NOT CHECK"), "{stdout}");
        }
    }
}

/// Usage errors exit 64, apart from every verdict (issue 12: both were 2).
#[test]
fn usage_errors_exit_64_and_version_carries_the_build() {
    for args in [
        &["check", "-o", "yaml"][..],
        &["check", "--no-such-flag"],
        &["nope"],
    ] {
        let out = Command::new(interlock()).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(64), "{args:?}");
    }
    let out = Command::new(interlock())
        .env("INTERLOCK_RUNTIME", "docker")
        .args(["check", "--health-addr", "none"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let out = Command::new(interlock()).arg("--version").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("interlock {}", interlock_buildinfo::VERSION)
    );
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
        // The runs-interlock judgement (the one the agent's readiness shares); missing
        // binaries and a stale copy are findings of their own.
        .filter(|f| {
            [
                "config.loaded",
                "config.no-interlock",
                "config.interlock-misplaced",
                "config.version-refused",
                "config.no-network",
            ]
            .contains(&f["id"].as_str().unwrap())
        })
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
    let accepts = interlock_agent::guard::install::query_versions(&plugin()).unwrap();
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

/// `check -o json` on `d` with extra args: `(exit code, document)`.
fn check_json(d: &Dirs, extra: &[&str]) -> (i32, serde_json::Value) {
    let out = d
        .interlock("check")
        .args(["-o", "json", "--cri-endpoint", "none", "--plugin-source"])
        .arg(plugin())
        .args(extra)
        .output()
        .unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "check -o json: {e}\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), v)
}

fn finding<'a>(v: &'a serde_json::Value, id: &str) -> Option<&'a serde_json::Value> {
    v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == id)
}

/// issue 12, wrong answer: the owned copy kept the old pod CIDR after the primary changed
/// (while no agent ran) and check said "ok config". Now: `config.stale`, naming the
/// difference — and nothing stale while the agent keeps the copy current.
#[test]
fn a_stale_owned_copy_is_reported_with_its_difference() {
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    let a = d.agent(&[]);
    let owned = wait_protected(&d, &a);
    let health = format!("127.0.0.1:{}", a.port);
    let (code, v) = check_json(&d, &["--health-addr", &health]);
    assert_eq!(code, 0, "{v:#}");
    assert!(finding(&v, "config.stale").is_none(), "{v:#}");
    a.kill9();
    d.rename_in(
        "10-calico.conflist",
        &CALICO.replace("10.99.0.0/24", "10.250.7.0/24"),
    );
    let (code, v) = check_json(&d, &["--health-addr", "none"]);
    assert_eq!(code, 1, "{v:#}");
    let f = finding(&v, "config.stale").unwrap_or_else(|| panic!("no config.stale: {v:#}"));
    let msg = f["message"].as_str().unwrap();
    assert!(
        msg.contains(&owned) && msg.contains("10.99.0.0/24") && msg.contains("10.250.7.0/24"),
        "{msg}"
    );
    assert_eq!(v["effective"]["stale"]["file"], owned.as_str());
}

/// issue 12, wrong answer: the `bridge` plugin renamed `interlock-cni` was "ok binary".
/// Now the agent's content check (and the VERSION answer) tell it apart: unprotected.
#[test]
fn another_binary_installed_as_interlock_cni_is_unprotected() {
    let d = Dirs::new();
    let bridge = interlock_testkit::cni_plugins_dir().join("bridge");
    if !bridge.exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{} missing",
            bridge.display()
        );
        eprintln!("skipped: no reference bridge plugin");
        return;
    }
    d.write("10-calico.conflist", CALICO);
    let a = d.agent(&[]);
    wait_protected(&d, &a);
    a.terminate();
    std::fs::remove_file(d.bin.join("interlock-cni")).unwrap();
    std::fs::copy(&bridge, d.bin.join("interlock-cni")).unwrap();
    let (code, v) = check_json(&d, &["--health-addr", "none"]);
    assert_eq!(code, 2, "{v:#}");
    assert_eq!(v["verdict"], "unprotected");
    assert_eq!(v["findings"][0]["id"], "binary.not-interlock", "{v:#}");
    assert_eq!(v["binary"]["content"], "differs");
    assert_eq!(v["binary"]["interlockVersion"], serde_json::Value::Null);
}

/// issue 12, wrong answer: the chain needs `portmap` and `bandwidth`, the bin dir lacks
/// them, and containerd mode said "ok config".
#[test]
fn a_missing_primary_plugin_binary_is_reported() {
    let d = Dirs::new();
    std::fs::copy(plugin(), d.bin.join("interlock-cni")).unwrap();
    let _ = std::fs::remove_file(d.bin.join("portmap"));
    let list = r#"{"cniVersion":"1.0.0","name":"k8s","plugins":[{"type":"bridge"},{"type":"portmap"},{"type":"bandwidth"},{"type":"interlock-cni","capabilities":{"io.kubernetes.cri.pod-annotations":true}}]}"#;
    d.write("00-interlock.conflist", list);
    let (code, v) = check_json(&d, &["--health-addr", "none"]);
    assert_eq!(code, 1, "{v:#}");
    let f = finding(&v, "config.plugin-missing").unwrap_or_else(|| panic!("{v:#}"));
    assert!(
        f["message"]
            .as_str()
            .unwrap()
            .contains("portmap, bandwidth"),
        "{f}"
    );
    assert_eq!(
        v["effective"]["missingPlugins"],
        serde_json::json!(["portmap", "bandwidth"])
    );
}

/// issue 12, wrong answer: with the agent running and `/readyz` asked at the wrong
/// address, check said PROTECTED without mentioning it.
#[test]
fn an_unreachable_readyz_is_mentioned() {
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    let a = d.agent(&[]);
    wait_protected(&d, &a);
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (code, v) = check_json(&d, &["--health-addr", &format!("127.0.0.1:{closed}")]);
    assert_eq!(code, 0, "{v:#}");
    let f = finding(&v, "agent.readyz-unreachable").unwrap_or_else(|| panic!("{v:#}"));
    assert_eq!(f["status"], "warn");
    assert!(
        v["summary"]
            .as_str()
            .unwrap()
            .contains("agent.readyz-unreachable"),
        "{v:#}"
    );
    assert_eq!(v["agent"]["readyz"]["status"], serde_json::Value::Null);
    // Not an address at all: said too.
    let (_, v) = check_json(&d, &["--health-addr", "localhost:abc"]);
    let f = finding(&v, "agent.readyz-unreachable").unwrap();
    assert!(
        f["message"].as_str().unwrap().contains("not an address"),
        "{f}"
    );
}

/// issue 12, wrong answer: istio-cni or linkerd-cni in the chain with interlock-cni (the
/// agent copies a primary that carries it) was PROTECTED.
#[test]
fn another_meshs_plugin_in_the_chain_is_unprotected() {
    for mesh in ["istio-cni", "linkerd-cni"] {
        let d = Dirs::new();
        // The mesh's binary, as its DaemonSet would have installed it (a stand-in).
        std::fs::copy(plugin(), d.bin.join(mesh)).unwrap();
        let primary = CALICO.replace(
            r#"{"type": "portmap""#,
            &format!(r#"{{"type": "{mesh}"}}, {{"type": "portmap""#),
        );
        d.write("10-calico.conflist", &primary);
        let a = d.agent(&[]);
        wait_protected(&d, &a);
        let health = format!("127.0.0.1:{}", a.port);
        let (code, v) = check_json(&d, &["--health-addr", &health]);
        assert_eq!(code, 2, "{mesh}: {v:#}");
        let f = &v["findings"][0];
        assert_eq!(f["id"], "config.other-mesh", "{v:#}");
        assert!(f["message"].as_str().unwrap().contains(mesh), "{f}");
        assert!(
            f["hint"].as_str().unwrap().contains("docs/migration.md"),
            "{f}"
        );
    }
}

/// `kubectl exec … interlock check` in the agent's pod: the agent's INTERLOCK_*
/// environment is all check needs; without it, the marker names the conf dir.
#[test]
fn settings_come_from_the_agents_environment_then_the_marker() {
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    let a = d.agent(&[]);
    let owned = wait_protected(&d, &a);
    let health = format!("127.0.0.1:{}", a.port);
    let out = Command::new(interlock())
        .args(["check", "node", "-o", "json"])
        .env("INTERLOCK_CNI_CONF_DIR", &d.conf)
        .env("INTERLOCK_CNI_BIN_DIR", &d.bin)
        .env("INTERLOCK_STATE_DIR", &d.state)
        .env("INTERLOCK_HEALTH_ADDR", &health)
        .env("INTERLOCK_CRI_ENDPOINT", "none")
        .env("INTERLOCK_PLUGIN_SOURCE", plugin())
        .env("NODE_NAME", "node-from-downward-api")
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{v:#}");
    assert_eq!(v["node"], "node-from-downward-api");
    assert_eq!(v["settings"]["cniConfDirFrom"], "env");
    assert_eq!(v["interlockVersion"], interlock_buildinfo::VERSION);
    // No conf dir setting at all: the one the agent's marker names.
    let out = Command::new(interlock())
        .args(["check", "-o", "json", "--health-addr", "none"])
        .env_remove("INTERLOCK_CNI_CONF_DIR")
        .env("INTERLOCK_CNI_BIN_DIR", &d.bin)
        .env("INTERLOCK_STATE_DIR", &d.state)
        .env("INTERLOCK_PLUGIN_SOURCE", plugin())
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["settings"]["cniConfDirFrom"], "marker", "{v:#}");
    assert_eq!(
        v["effective"]["chosen"]["path"].as_str().unwrap(),
        d.conf.join(&owned).to_str().unwrap()
    );
}

/// Waits (5 s at most) until the runtime says its pod network is ready.
async fn network_ready(cri: &interlock_cri::CriClient) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !cri.status().await.unwrap().network_ready() {
        assert!(
            std::time::Instant::now() < deadline,
            "NetworkReady never came"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The sandboxes half of `check node` against a real containerd (issue 12): meshed
/// sandboxes created while only the primary's config existed are listed as UNPROTECTED by
/// name (exit 2) and check changes nothing in them; once the agent, started with the same
/// CRI endpoint, has repaired them, check (taking the endpoint from the agent's marker)
/// says protected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_lists_the_nodes_sandboxes_with_the_audits_verdicts() {
    interlock_testkit::require_root!();
    let kit = interlock_testkit_node::containerd::Containerd::start().unwrap();
    kit.install_primary_plugins().unwrap();
    kit.write_primary_config().unwrap();
    let cri = kit.cri().await;
    network_ready(&cri).await;
    let mut meshed = Vec::new();
    for tag in ["mesh0", "mesh1"] {
        let config = kit.pod(tag).annotation(
            interlock_testkit_node::node::MESHED_ANNOTATION.0,
            interlock_testkit_node::node::MESHED_ANNOTATION.1,
        );
        let pod = format!("{}/{}", config.metadata.namespace, config.metadata.name);
        meshed.push((cri.run_sandbox(&config).await.unwrap(), pod));
    }
    let plain_config = kit.pod("plain");
    let plain_pod = format!(
        "{}/{}",
        plain_config.metadata.namespace, plain_config.metadata.name
    );
    cri.run_sandbox(&plain_config).await.unwrap();
    let d = Dirs {
        conf: kit.conf_dir(),
        bin: kit.bin_dir(),
        ..Dirs::new()
    };
    let check = |extra: &[&str]| {
        let out = d
            .interlock("check")
            .args(["--health-addr", "none", "--plugin-source"])
            .arg(plugin())
            .args(extra)
            .env_remove("INTERLOCK_CRI_ENDPOINT")
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let endpoint = kit.endpoint();
    let by_pod = |v: &serde_json::Value, pod: &str| {
        v["sandboxes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["pod"] == pod)
            .cloned()
            .unwrap_or_else(|| panic!("{pod} not listed: {v:#}"))
    };

    // Before the agent: every meshed pod is named as unprotected (2).
    let (code, json) = check(&["--cri-endpoint", &endpoint, "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(code, 2, "{v:#}");
    assert_eq!(v["verdict"], "unprotected");
    assert_eq!(v["settings"]["criEndpoint"], endpoint.as_str());
    assert_eq!(v["settings"]["criEndpointFrom"], "flag");
    assert_eq!(v["sandboxes"].as_array().unwrap().len(), 3, "{v:#}");
    for (_, pod) in &meshed {
        let s = by_pod(&v, pod);
        assert_eq!(s["verdict"], "unprotected", "{s:#}");
        assert!(s["reason"].as_str().unwrap().contains("generic"), "{s:#}");
        assert!(s["netns"].is_string(), "{s:#}");
    }
    assert_eq!(by_pod(&v, &plain_pod)["verdict"], "not-meshed");
    let f = finding(&v, "sandboxes.unprotected").expect("sandboxes.unprotected");
    assert_eq!(f["status"], "fail");
    for (_, pod) in &meshed {
        assert!(f["message"].as_str().unwrap().contains(pod.as_str()), "{f}");
    }
    // The table says the same, by pod name.
    let (code, text) = check(&["--cri-endpoint", &endpoint]);
    eprintln!("{text}");
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("Sandboxes on this node"), "{text}");
    for (_, pod) in &meshed {
        assert!(
            text.lines()
                .any(|l| l.contains(pod.as_str()) && l.contains("UNPROTECTED")),
            "{text}"
        );
    }
    // `inspect pod` finds the same sandbox over CRI: its spec, no rules, the difference.
    let inspect = |pod: &str| {
        let out = Command::new(interlock())
            .args([
                "inspect",
                "pod",
                pod,
                "-o",
                "json",
                "--cri-endpoint",
                &endpoint,
            ])
            .arg("--state-dir")
            .arg(&d.state)
            .arg("--cni-conf-dir")
            .arg(&d.conf)
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        (out.status.code().unwrap_or(-1), v)
    };
    let (code, iv) = inspect(&meshed[0].1);
    assert_eq!(code, 2, "{iv:#}");
    assert_eq!(iv["sandbox"], meshed[0].0.as_str());
    assert_eq!(iv["spec"]["source"], "pod annotations");
    assert!(!iv["difference"].as_array().unwrap().is_empty(), "{iv:#}");
    let (code, iv) = inspect(&plain_pod);
    assert_eq!(
        (code, iv["verdict"].as_str()),
        (0, Some("not-meshed")),
        "{iv:#}"
    );
    let (code, iv) = inspect("nowhere/none");
    assert_eq!(code, 3, "{iv:#}");
    // Read-only: check installed nothing in the pods' netns.
    let again: serde_json::Value =
        serde_json::from_str(&check(&["--cri-endpoint", &endpoint, "-o", "json"]).1).unwrap();
    assert_eq!(again["sandboxes"], v["sandboxes"]);

    // The agent, on the same runtime, repairs them; check then says protected, with the
    // endpoint from the agent's marker (no flag, no environment).
    let a = Agent::start(&d, &["--cri-endpoint", &endpoint, "--audit-interval", "1"]);
    wait_until(
        Duration::from_secs(10),
        || {
            let log = a.log_text();
            meshed.iter().all(|(id, _)| {
                log.lines()
                    .any(|l| l.contains("audit action done") && l.contains(id.as_str()))
            })
        },
        || {
            format!(
                "the agent did not repair the sandboxes; log:\n{}",
                a.log_text()
            )
        },
    );
    wait_protected(&d, &a);
    let last = std::cell::RefCell::new(serde_json::Value::Null);
    wait_until(
        Duration::from_secs(10),
        || {
            let (code, json) = check(&["-o", "json"]);
            *last.borrow_mut() = serde_json::from_str(&json).unwrap();
            code == 0
        },
        || format!("check never said protected: {:#}", last.borrow()),
    );
    let v = last.into_inner();
    assert_eq!(v["verdict"], "protected", "{v:#}");
    assert_eq!(v["settings"]["criEndpointFrom"], "marker");
    for (_, pod) in &meshed {
        assert_eq!(by_pod(&v, pod)["verdict"], "protected", "{v:#}");
    }
    assert_eq!(by_pod(&v, &plain_pod)["verdict"], "not-meshed");
    // After the repair, inspect sees the rules and the plugin's record of them.
    let (code, iv) = inspect(&meshed[1].1);
    assert_eq!(code, 0, "{iv:#}");
    assert_eq!(iv["difference"], serde_json::json!([]));
    assert!(iv["record"]["specHash"].is_string(), "{iv:#}");
    assert!(!iv["rulesPresent"].as_array().unwrap().is_empty(), "{iv:#}");
    let ok = finding(&v, "sandboxes.ok").expect("sandboxes.ok");
    assert!(
        ok["message"]
            .as_str()
            .unwrap()
            .contains("3 sandboxes: 2 meshed and protected, 1 not meshed"),
        "{ok}"
    );
    drop(a);
    kit.teardown().unwrap();
}

/// Guard mode (the file containerd loads has interlock-cni in its guard role before
/// istio-cni): the mesh's plugin wrote the rules in its own shape, so check judges each
/// sandbox as guard mode's audit does, by a connection from inside the pod. A meshed pod
/// with istio-cni's rules and a listening proxy is protected, one without rules is
/// unprotected (exit 2), one whose proxy does not listen yet is not probed (unknown), and
/// an unmeshed pod is not meshed; nothing of interlock's is written into any of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_judges_guard_mode_sandboxes_by_a_connection() {
    interlock_testkit::require_root!();
    let kit = interlock_testkit_node::containerd::Containerd::start().unwrap();
    kit.install_primary_plugins().unwrap();
    let primary = kit.write_primary_config().unwrap();
    let cri = kit.cri().await;
    network_ready(&cri).await;
    let run = |tag: &'static str, meshed: bool| {
        let mut config = kit.pod(tag);
        if meshed {
            config = config.annotation(
                "sidecar.istio.io/status",
                "{\"containers\":[\"istio-proxy\"]}",
            );
        }
        let pod = format!("{}/{}", config.metadata.namespace, config.metadata.name);
        let cri = &cri;
        async move {
            let id = cri.run_sandbox(&config).await.unwrap();
            let status = cri.sandbox_status(&id, true).await.unwrap();
            (pod, status.netns_path().expect("netns path").to_path_buf())
        }
    };
    let (captured, captured_ns) = run("capt", true).await;
    let (bare, bare_ns) = run("bare", true).await;
    let (waiting, _) = run("wait", true).await;
    let (plain, plain_ns) = run("plain", false).await;
    let case = interlock_mesh_cases::default_case(interlock_mesh_cases::Mesh::Istio);
    let interlock_mesh_cases::MeshRules::Restore(rules) = case.rules(false) else {
        panic!("{}: no IPv4 rules", case.id())
    };
    interlock_testkit::traffic::restore_in(&captured_ns, "iptables-restore", rules);
    let proxies = (proxy_listener(&captured_ns), proxy_listener(&bare_ns));
    // The guard file as the agent writes it in guard mode: the primary's plugins, then
    // interlock-cni guarding istio-cni, then istio-cni's entry.
    let mut list: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&primary).unwrap()).unwrap();
    let plugins = list["plugins"].as_array_mut().unwrap();
    plugins.push(serde_json::json!({"type": "interlock-cni", "guard": {"mesh": "istio"}}));
    plugins.push(serde_json::json!({"type": "istio-cni", "name": "istio-cni"}));
    std::fs::write(
        kit.conf_dir().join("00-interlock.conflist"),
        serde_json::to_vec(&list).unwrap(),
    )
    .unwrap();
    let d = Dirs {
        conf: kit.conf_dir(),
        bin: kit.bin_dir(),
        ..Dirs::new()
    };
    let out = d
        .interlock("check")
        .args(["--health-addr", "none", "-o", "json", "--plugin-source"])
        .arg(plugin())
        .args(["--cri-endpoint", &kit.endpoint()])
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(out.status.code(), Some(2), "{v:#}");
    let by_pod = |pod: &str| {
        v["sandboxes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["pod"] == pod)
            .cloned()
            .unwrap_or_else(|| panic!("{pod} not listed: {v:#}"))
    };
    let s = by_pod(&captured);
    assert_eq!(s["verdict"], "protected", "{s:#}");
    assert!(s["reason"].as_str().unwrap().contains("istio-cni"), "{s:#}");
    let s = by_pod(&bare);
    assert_eq!(s["verdict"], "unprotected", "{s:#}");
    assert!(
        s["reason"].as_str().unwrap().contains("not captured"),
        "{s:#}"
    );
    let s = by_pod(&waiting);
    assert_eq!(s["verdict"], "unknown", "{s:#}");
    assert!(
        s["reason"].as_str().unwrap().contains("not probed yet"),
        "{s:#}"
    );
    assert_eq!(by_pod(&plain)["verdict"], "not-meshed", "{v:#}");
    let f = finding(&v, "sandboxes.unprotected").expect("sandboxes.unprotected");
    assert!(f["message"].as_str().unwrap().contains(&bare), "{f}");
    assert!(finding(&v, "guard.entry").is_some(), "{v:#}");
    // Read-only: nothing of interlock's in any pod.
    for ns in [&captured_ns, &bare_ns, &plain_ns] {
        let tables = interlock_testkit_node::node::in_netns(ns, || {
            Command::new("nft")
                .args(["list", "tables"])
                .output()
                .unwrap()
        })
        .unwrap();
        let tables = String::from_utf8_lossy(&tables.stdout);
        assert!(!tables.contains("interlock"), "{tables}");
    }
    drop(proxies);
    // containerd runs DEL through the config it loads now: without istio-cni's binary,
    // the guard file would fail every DEL.
    std::fs::remove_file(kit.conf_dir().join("00-interlock.conflist")).unwrap();
    kit.teardown().unwrap();
}

/// A proxy's outbound listener (port 15001) inside the pod, as Envoy binds it.
fn proxy_listener(netns: &std::path::Path) -> std::net::TcpListener {
    interlock_testkit_node::node::in_netns(netns, || {
        std::net::TcpListener::bind("0.0.0.0:15001").unwrap()
    })
    .unwrap()
}

/// A runtime that cannot be asked is a finding (at risk: running pods cannot be vouched
/// for, and the agent's audit cannot reach them either), never a crash; `none` skips.
/// Without flags or environment, the CRI endpoint and the runtime are the marker's.
#[test]
fn an_unreachable_cri_endpoint_is_at_risk_not_a_crash() {
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    let a = d.agent(&["--cri-endpoint", "none", "--runtime", "crio"]);
    wait_protected(&d, &a);
    let health = format!("127.0.0.1:{}", a.port);
    let missing = format!("unix://{}", d.tmp.path().join("no.sock").display());
    let out = d
        .interlock("check")
        .args([
            "-o",
            "json",
            "--health-addr",
            &health,
            "--cri-endpoint",
            &missing,
        ])
        .arg("--plugin-source")
        .arg(plugin())
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(1), "{v:#}");
    assert_eq!(v["verdict"], "at-risk");
    let f = finding(&v, "sandboxes.cri-unreachable").expect("sandboxes.cri-unreachable");
    assert!(f["message"].as_str().unwrap().contains("no.sock"), "{f}");
    assert!(!f["hint"].as_str().unwrap().is_empty());
    assert_eq!(v["sandboxes"], serde_json::Value::Null);
    // The agent runs without an audit: its marker says `none`, and check follows it.
    let out = d
        .interlock("check")
        .args(["-o", "json", "--health-addr", &health, "--plugin-source"])
        .arg(plugin())
        .env_remove("INTERLOCK_CRI_ENDPOINT")
        .env_remove("INTERLOCK_RUNTIME")
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{v:#}");
    // The runtime too comes from the marker.
    assert_eq!(v["settings"]["runtime"], "crio");
    assert_eq!(v["settings"]["criEndpoint"], "none");
    assert_eq!(v["settings"]["criEndpointFrom"], "marker");
    assert!(finding(&v, "sandboxes.cri-unreachable").is_none());
}

/// issue 26: `check node` judges the skew policy with the version the agent's `/metrics`
/// gives (`interlock_build_info`): this build's agent and plugin pass; an agent answering
/// as 0.1.0 (a stand-in serving the health endpoints in its place, the plugin this
/// build's) is flagged against the plugin installed and against this CLI.
#[test]
fn an_agent_outside_the_skew_policy_is_flagged() {
    use std::io::{BufRead, BufReader, Write};
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    let a = d.agent(&[]);
    wait_protected(&d, &a);
    let health = format!("127.0.0.1:{}", a.port);
    let (_, v) = check_json(&d, &["--health-addr", &health]);
    let skew = |v: &serde_json::Value| -> Vec<String> {
        v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|f| f["id"].as_str())
            .filter(|id| id.starts_with("skew."))
            .map(str::to_string)
            .collect()
    };
    assert!(skew(&v).is_empty(), "{v:#}");

    let standin = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = standin.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for conn in standin.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut line = String::new();
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let _ = reader.read_line(&mut line);
            // The rest of the request head.
            let mut header = String::new();
            while reader.read_line(&mut header).is_ok_and(|n| n > 2) {
                header.clear();
            }
            let body = if line.starts_with("GET /metrics ") {
                "# TYPE interlock_build_info gauge\ninterlock_build_info{version=\"0.1.0\"} 1\n"
            } else {
                "ready\n"
            };
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let (_, v) = check_json(&d, &["--health-addr", &addr]);
    assert_eq!(skew(&v), ["skew.agent-plugin", "skew.agent-cli"], "{v:#}");
    let msg = finding(&v, "skew.agent-plugin").unwrap()["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        msg.contains("the agent runs interlock 0.1.0")
            && msg.contains(&format!(
                "is interlock-cni {} (git",
                env!("CARGO_PKG_VERSION")
            )),
        "{msg}"
    );
    assert!(
        finding(&v, "skew.agent-cli").unwrap()["hint"]
            .as_str()
            .unwrap()
            .contains("interlock check node"),
        "{v:#}"
    );
    drop(a);
}

//! The built `interlock-cni` binary, driven like a runtime drives it: every verb, every
//! error path, and many concurrent ADDs.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_interlock-cni");

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    /// stdout must be exactly one JSON document (or nothing).
    fn json(&self) -> Value {
        let mut it = serde_json::Deserializer::from_str(&self.stdout).into_iter::<Value>();
        let v = it
            .next()
            .expect("no JSON on stdout")
            .expect("stdout is not JSON");
        assert!(
            it.next().is_none(),
            "more than one JSON document on stdout: {:?}",
            self.stdout
        );
        v
    }
}

fn run(command: &str, env: &[(&str, &str)], stdin: &[u8]) -> Run {
    let mut cmd = Command::new(BIN);
    cmd.env_clear()
        .env("CNI_COMMAND", command)
        .env("CNI_PATH", "/usr/lib/cni")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if command.is_empty() {
        cmd.env_remove("CNI_COMMAND");
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

fn attach_env<'a>(cid: &'a str, netns: &'a str, args: &'a str) -> Vec<(&'static str, &'a str)> {
    vec![
        ("CNI_CONTAINERID", cid),
        ("CNI_NETNS", netns),
        ("CNI_IFNAME", "eth0"),
        ("CNI_ARGS", args),
    ]
}

const POD_ARGS: &str = "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=cart-0;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u1";

fn prev_031() -> Value {
    json!({"cniVersion":"0.3.1","interfaces":[{"name":"eth0","mac":"aa:bb:cc:dd:ee:ff","sandbox":"/var/run/netns/p"}],
           "ips":[{"version":"4","interface":0,"address":"10.99.0.2/24","gateway":"10.99.0.1"}],"routes":[{"dst":"0.0.0.0/0"}],"dns":{}})
}

fn conf(version: &str, state: &Path, extra: Value) -> Value {
    let mut c = json!({
        "cniVersion": version, "name": "k8s", "type": "interlock-cni",
        "stateDir": state, "logFile": state.join("plugin.log"),
        "capabilities": {"io.kubernetes.cri.pod-annotations": true},
        "runtimeConfig": {"io.kubernetes.cri.pod-annotations": null},
        "prevResult": prev_031(),
    });
    for (k, v) in extra.as_object().unwrap() {
        if v.is_null() {
            c.as_object_mut().unwrap().remove(k);
        } else {
            c[k] = v.clone();
        }
    }
    c
}

fn bytes(v: &Value) -> Vec<u8> {
    v.to_string().into_bytes()
}

#[test]
fn garbage_on_stdin_is_error_6_and_nothing_else() {
    for garbage in [
        &b"\x00\xffnot json at all"[..],
        b"{\"cniVersion\":",
        b"",
        b"[1,2]",
    ] {
        let r = run("ADD", &attach_env("c", "/x", ""), garbage);
        assert_ne!(r.code, 0);
        let v = r.json();
        assert_eq!(v["code"], 6, "{v}");
        assert!(v["msg"].as_str().unwrap().contains("decode"), "{v}");
        assert_eq!(r.stdout.trim_end().lines().count(), 1);
    }
}

#[test]
fn version_lists_every_supported_version() {
    let r = run("VERSION", &[], b"{\"cniVersion\":\"1.1.0\"}");
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v = r.json();
    assert_eq!(
        v["supportedVersions"],
        json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
    );
    assert_eq!(v["cniVersion"], "1.1.0");
    // The build, so `interlock check` can tell this binary from another plugin renamed.
    assert_eq!(v["interlockVersion"], interlock_buildinfo::VERSION);
}

#[test]
fn protocol_errors() {
    let t = tempfile::tempdir().unwrap();
    let env = attach_env("c1", "/var/run/netns/p", POD_ARGS);
    // Unsupported version: code 1 with the list.
    let r = run("ADD", &env, &bytes(&conf("0.2.0", t.path(), json!({}))));
    assert_eq!(r.json()["code"], 1);
    assert!(r.json()["msg"]
        .as_str()
        .unwrap()
        .contains("0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0"));
    let r = run(
        "ADD",
        &env,
        &bytes(&conf("", t.path(), json!({"cniVersion": null}))),
    );
    assert_eq!(r.json()["code"], 1);
    // Bad fields: code 7 naming the field.
    for (field, value) in [
        ("failurePolicy", json!("maybe")),
        ("stateDir", json!(5)),
        ("backend", json!("bpf")),
        ("excludeNamespaces", json!("x")),
    ] {
        let r = run(
            "ADD",
            &env,
            &bytes(&conf("1.0.0", t.path(), json!({ field: value }))),
        );
        let v = r.json();
        assert_eq!(v["code"], 7, "{v}");
        assert!(v["msg"].as_str().unwrap().contains(field), "{v}");
        assert_eq!(v["cniVersion"], "1.0.0");
    }
    // Chained only: no prevResult is code 7 naming prevResult.
    let r = run(
        "ADD",
        &env,
        &bytes(&conf("1.0.0", t.path(), json!({"prevResult": null}))),
    );
    let v = r.json();
    assert_eq!(v["code"], 7);
    assert!(v["msg"].as_str().unwrap().starts_with("prevResult"), "{v}");
    // The agent's holding config (no primary on the node yet): code 11, try again later,
    // saying why; DEL too (the primary's teardown could not run: the runtime retries).
    let holding = json!({"prevResult": null, "name": interlock_contract::layout::HOLDING_NETWORK});
    let r = run(
        "ADD",
        &env,
        &bytes(&conf("1.0.0", t.path(), holding.clone())),
    );
    let v = r.json();
    assert_eq!(v["code"], 11, "{v}");
    assert!(
        v["msg"]
            .as_str()
            .unwrap()
            .contains("no primary CNI config yet"),
        "{v}"
    );
    let del = attach_env("c1", "", POD_ARGS);
    let r = run("DEL", &del, &bytes(&conf("1.0.0", t.path(), holding)));
    let v = r.json();
    assert_eq!(v["code"], 11, "{v}");
    assert!(
        v["msg"].as_str().unwrap().contains("primary's teardown"),
        "{v}"
    );
    // Missing environment: code 4 naming the variable.
    let r = run(
        "ADD",
        &[("CNI_CONTAINERID", "c"), ("CNI_IFNAME", "eth0")],
        &bytes(&conf("1.0.0", t.path(), json!({}))),
    );
    assert_eq!(r.json()["code"], 4);
    assert!(r.json()["msg"].as_str().unwrap().contains("CNI_NETNS"));
    let r = run("", &[], b"{}");
    assert_eq!(r.json()["code"], 4);
    let r = run("FROB", &[], b"{}");
    assert_eq!(r.json()["code"], 4);
    // Invalid annotation value type: code 7 naming the annotation.
    let r = run(
        "ADD",
        &env,
        &bytes(&conf(
            "1.0.0",
            t.path(),
            json!({"runtimeConfig": {"io.kubernetes.cri.pod-annotations": {"a": 1}}}),
        )),
    );
    assert_eq!(r.json()["code"], 7);
    assert!(r.json()["msg"]
        .as_str()
        .unwrap()
        .contains("pod-annotations.a"));
    // Nothing was logged to stdout: every error above is one JSON object.
    assert!(
        !t.path().join("attachments").exists()
            || std::fs::read_dir(t.path().join("attachments"))
                .unwrap()
                .count()
                == 0
    );
}

#[test]
fn add_converts_prev_result_del_is_idempotent_check_knows_the_attachment() {
    let t = tempfile::tempdir().unwrap();
    let env = attach_env("c-add", "/var/run/netns/p", POD_ARGS);
    for v in ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let r = run("ADD", &env, &bytes(&conf(v, t.path(), json!({}))));
        assert_eq!(r.code, 0, "{v}: {} {}", r.stdout, r.stderr);
        let out = r.json();
        assert_eq!(out["cniVersion"], v);
        let expected = interlock_cni_types::CniResult::from_value(prev_031(), None)
            .unwrap()
            .convert(v.parse().unwrap());
        assert_eq!(
            interlock_cni_types::CniResult::from_value(out.clone(), None).unwrap(),
            expected
        );
        assert_eq!(
            out["ips"][0].get("version").is_some(),
            !v.starts_with('1'),
            "{out}"
        );
    }
    let state_file = t.path().join("attachments/c-add+eth0.json");
    let state: Value = serde_json::from_slice(&std::fs::read(&state_file).unwrap()).unwrap();
    assert_eq!(state["pod"]["namespace"], "shop");
    assert_eq!(state["pod"]["uid"], "u1");
    assert_eq!(state["decision"]["decision"], "not-meshed");

    let r = run("CHECK", &env, &bytes(&conf("1.0.0", t.path(), json!({}))));
    assert_eq!(r.code, 0, "{}", r.stdout);
    assert!(r.stdout.is_empty());
    let r = run("CHECK", &env, &bytes(&conf("0.3.1", t.path(), json!({}))));
    assert_eq!(r.json()["code"], 1);

    let del = conf("1.0.0", t.path(), json!({}));
    let r = run("DEL", &env, &bytes(&del));
    assert_eq!((r.code, r.stdout.as_str()), (0, ""));
    assert!(!state_file.exists());
    // containerd's later DELs: no netns, no prevResult. Must succeed, twice.
    let late = conf("1.0.0", t.path(), json!({"prevResult": null}));
    for _ in 0..2 {
        let r = run("DEL", &attach_env("c-add", "", ""), &bytes(&late));
        assert_eq!((r.code, r.stdout.as_str()), (0, ""), "{}", r.stderr);
    }
    let r = run("CHECK", &env, &bytes(&conf("1.0.0", t.path(), json!({}))));
    assert_eq!(r.json()["code"], 3);
    let log = std::fs::read_to_string(t.path().join("plugin.log")).unwrap();
    assert!(
        log.contains("shop/cart-0") && log.contains("DEL c-add/eth0"),
        "{log}"
    );
}

#[test]
fn decision_input_and_failure_policy() {
    let t = tempfile::tempdir().unwrap();
    let env = attach_env("c-mesh", "/var/run/netns/p", POD_ARGS);
    // Meshed (generic) pod whose netns does not exist: fail closed naming pod, step, cause.
    let meshed = conf(
        "1.0.0",
        t.path(),
        json!({"runtimeConfig": {"io.kubernetes.cri.pod-annotations": {"interlock.dev/redirect": "enabled"}}}),
    );
    let r = run("ADD", &env, &bytes(&meshed));
    let v = r.json();
    assert_eq!(v["code"], 105, "{v}");
    let msg = v["msg"].as_str().unwrap();
    assert!(
        msg.starts_with("pod shop/cart-0: step netns failed:") && msg.contains("/var/run/netns/p"),
        "{v}"
    );
    assert!(!t.path().join("attachments/c-mesh+eth0.json").exists());
    // failurePolicy open: ADD succeeds, the state says unprotected, the log shouts.
    let mut meshed_open = meshed.clone();
    meshed_open["failurePolicy"] = json!("open");
    let r = run("ADD", &env, &bytes(&meshed_open));
    assert_eq!(r.code, 0, "{}", r.stdout);
    let state: Value = serde_json::from_slice(
        &std::fs::read(t.path().join("attachments/c-mesh+eth0.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(state["decision"]["decision"], "meshed");
    assert_eq!(state["decision"]["profile"], "generic");
    assert_eq!(state["protection"]["protection"], "unprotected");
    assert_eq!(state["protection"]["step"], "netns");
    let log = std::fs::read_to_string(t.path().join("plugin.log")).unwrap();
    assert!(
        log.lines().any(|l| l.contains(" ERROR ")
            && l.contains("pod shop/cart-0 runs WITHOUT traffic redirection")
            && l.contains("/var/run/netns/p")),
        "{log}"
    );
    // CHECK of the unprotected attachment fails (103) saying so.
    let r = run("CHECK", &env, &bytes(&meshed_open));
    let v = r.json();
    assert_eq!(v["code"], 103, "{v}");
    assert!(
        v["msg"].as_str().unwrap().contains("WITHOUT redirection"),
        "{v}"
    );
    // Annotations not passed: closed policy refuses (11), open passes with a warning.
    let unknown = conf("1.0.0", t.path(), json!({"runtimeConfig": null}));
    let r = run("ADD", &attach_env("c-u", "/x", POD_ARGS), &bytes(&unknown));
    let v = r.json();
    assert_eq!(v["code"], 11);
    let msg = v["msg"].as_str().unwrap();
    assert!(
        msg.starts_with("pod shop/cart-0: step lookup failed:")
            && msg.contains("agentSocket not configured"),
        "{v}"
    );
    let mut open = unknown.clone();
    open["failurePolicy"] = json!("open");
    let r = run("ADD", &attach_env("c-u", "/x", POD_ARGS), &bytes(&open));
    assert_eq!(r.code, 0);
    // Excluded namespace and non-Kubernetes callers are skipped.
    let mut ex = unknown.clone();
    ex["excludeNamespaces"] = json!(["shop"]);
    let r = run("ADD", &attach_env("c-x", "/x", POD_ARGS), &bytes(&ex));
    assert_eq!(r.code, 0, "{}", r.stdout);
    let state: Value =
        serde_json::from_slice(&std::fs::read(t.path().join("attachments/c-x+eth0.json")).unwrap())
            .unwrap();
    assert_eq!(state["decision"]["decision"], "skip");
    // Mesh annotations that cannot become rules: fail closed with code 101.
    let bad = conf(
        "1.0.0",
        t.path(),
        json!({"runtimeConfig": {"io.kubernetes.cri.pod-annotations": {"interlock.dev/redirect": "enabled", "interlock.dev/exclude-inbound-ports": "http"}}}),
    );
    let r = run("ADD", &attach_env("c-b", "/x", POD_ARGS), &bytes(&bad));
    let v = r.json();
    assert_eq!(v["code"], 101, "{v}");
    assert!(
        v["msg"].as_str().unwrap().contains("exclude-inbound-ports"),
        "{v}"
    );
}

#[test]
fn gc_removes_state_not_in_valid_attachments() {
    let t = tempfile::tempdir().unwrap();
    for cid in ["a", "b", "c"] {
        let r = run(
            "ADD",
            &attach_env(cid, "/x", POD_ARGS),
            &bytes(&conf("1.1.0", t.path(), json!({}))),
        );
        assert_eq!(r.code, 0);
    }
    let mut gc = conf(
        "1.1.0",
        t.path(),
        json!({"prevResult": null, "runtimeConfig": null}),
    );
    gc["cni.dev/valid-attachments"] =
        json!([{"containerID": "b", "ifname": "eth0"}, {"containerID": "zz", "ifname": "eth0"}]);
    let r = run("GC", &[], &bytes(&gc));
    assert_eq!((r.code, r.stdout.as_str()), (0, ""), "{}", r.stderr);
    let mut names: Vec<String> = std::fs::read_dir(t.path().join("attachments"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["b+eth0.json"]);
    gc["cni.dev/valid-attachments"] = json!([{"containerID": 5}]);
    assert_eq!(run("GC", &[], &bytes(&gc)).json()["code"], 7);
    let old = conf("1.0.0", t.path(), json!({"prevResult": null}));
    assert_eq!(run("GC", &[], &bytes(&old)).json()["code"], 1);
}

/// redteam-3 N-1: two networks chain interlock into one state dir (Multus). GC of one
/// network, whose valid list names only its own attachments, leaves the other
/// network's attachments alone.
#[test]
fn gc_of_one_network_leaves_another_networks_attachments() {
    let t = tempfile::tempdir().unwrap();
    let on = |network: &str| {
        let mut c = conf("1.1.0", t.path(), json!({}));
        c["name"] = json!(network);
        c
    };
    for (cid, net) in [("a", "k8s"), ("b", "k8s"), ("m", "macvlan-net")] {
        let r = run("ADD", &attach_env(cid, "/x", POD_ARGS), &bytes(&on(net)));
        assert_eq!(r.code, 0, "{}", r.stdout);
    }
    let mut gc = on("k8s");
    gc.as_object_mut().unwrap().remove("prevResult");
    gc.as_object_mut().unwrap().remove("runtimeConfig");
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "b", "ifname": "eth0"}]);
    let r = run("GC", &[], &bytes(&gc));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let mut names: Vec<String> = std::fs::read_dir(t.path().join("attachments"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["b+eth0.json", "m+eth0.json"]);
}

/// STATUS answers 50 only when an ADD on this node could not protect a meshed pod (issue
/// 10 item 2): not because the agent's marker is missing, stale or says not ready.
#[test]
fn status_fails_only_when_an_add_could_not_protect() {
    interlock_testkit::require_root!();
    let t = tempfile::tempdir().unwrap();
    let st = |extra: Value| {
        let mut c = conf(
            "1.1.0",
            t.path(),
            json!({"prevResult": null, "runtimeConfig": null, "backend": "nftables",
                   "agentSocket": t.path().join("agent.sock")}),
        );
        for (k, v) in extra.as_object().unwrap() {
            if v.is_null() {
                c.as_object_mut().unwrap().remove(k);
            } else {
                c[k] = v.clone();
            }
        }
        bytes(&c)
    };
    let ok = |stdin: &[u8]| {
        let r = run("STATUS", &[], stdin);
        assert_eq!((r.code, r.stdout.as_str()), (0, ""), "{}", r.stdout);
    };
    let fails = |stdin: &[u8], why: &str| {
        let v = run("STATUS", &[], stdin).json();
        assert_eq!(v["code"], 50, "{v}");
        let msg = v["msg"].as_str().unwrap();
        assert!(msg.contains(why), "{why:?} not in {msg}");
        msg.to_string()
    };
    // No marker at all, then a stale one saying "not ready": ready either way.
    ok(&st(json!({})));
    // Istio and Linkerd pods need their spec from the agent: enabled without an
    // agentSocket, every such ADD would fail.
    fails(&st(json!({"agentSocket": null})), "read a pod's spec");
    ok(&st(
        json!({"agentSocket": null, "profiles": ["consul", "generic"]}),
    ));
    let marker = interlock_contract::marker::ReadinessMarker {
        ready: false,
        reason: "10-calico.conflist sorts first".into(),
        updated_at_ms: 1,
        stale_after_ms: 3000,
        pid: 1,
        pid_namespace: None,
        config_path: String::new(),
        runtime: None,
        cri_endpoint: None,
        fight: None,
    };
    std::fs::write(
        interlock_contract::layout::marker_path(t.path()),
        marker.to_bytes(),
    )
    .unwrap();
    ok(&st(json!({})));
    // The backend cannot work: without CAP_NET_ADMIN over the host's namespace (a user
    // namespace), nf_tables refuses.
    let mut child = Command::new("unshare")
        .args(["--user", "--map-root-user", BIN])
        .env_clear()
        .env("CNI_COMMAND", "STATUS")
        .env("CNI_PATH", "/usr/lib/cni")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&st(json!({})))
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["code"], 50, "{v}");
    let msg = v["msg"].as_str().unwrap();
    assert!(
        msg.contains("the nftables backend (configured backend nftables) cannot work here")
            && !msg.contains("state dir"),
        "{msg}"
    );
    // The state dir is unusable.
    let file = t.path().join("not-a-dir");
    std::fs::write(&file, b"").unwrap();
    fails(&st(json!({"stateDir": file})), "the state dir");
    // No annotations capability: the lookup source must work.
    fails(
        &st(json!({"capabilities": {}, "agentSocket": null})),
        "agentSocket is not configured",
    );
    let msg = fails(
        &st(json!({"capabilities": {}, "agentSocket": t.path().join("agent.sock")})),
        "agent.sock",
    );
    assert!(msg.contains("io.kubernetes.cri.pod-annotations"), "{msg}");
    let old = conf("1.0.0", t.path(), json!({"prevResult": null}));
    assert_eq!(run("STATUS", &[], &bytes(&old)).json()["code"], 1);
}

/// containerd runs ADDs for different pods concurrently: state must stay whole.
#[test]
fn many_concurrent_adds_keep_state_consistent() {
    let t = tempfile::tempdir().unwrap();
    let conf_bytes = bytes(&conf("1.0.0", t.path(), json!({})));
    let mut children = Vec::new();
    // 48 distinct attachments plus 16 racing on the same one.
    let ids: Vec<String> = (0..48)
        .map(|i| format!("ctr{i:03}"))
        .chain((0..16).map(|_| "shared".to_string()))
        .collect();
    for id in &ids {
        let mut child = Command::new(BIN)
            .env_clear()
            .env("CNI_COMMAND", "ADD")
            .env("CNI_PATH", "/usr/lib/cni")
            .env("CNI_CONTAINERID", id)
            .env("CNI_NETNS", "/var/run/netns/p")
            .env("CNI_IFNAME", "eth0")
            .env("CNI_ARGS", POD_ARGS)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&conf_bytes).unwrap();
        children.push(child);
    }
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["cniVersion"], "1.0.0");
    }
    let dir = t.path().join("attachments");
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 49, "{names:?}");
    assert!(
        names.iter().all(|n| n.ends_with("+eth0.json")),
        "temp files left: {names:?}"
    );
    for n in names {
        let v: Value = serde_json::from_slice(&std::fs::read(dir.join(&n)).unwrap())
            .unwrap_or_else(|e| panic!("{n} corrupt: {e}"));
        assert_eq!(
            format!("{}+eth0.json", v["containerID"].as_str().unwrap()),
            n
        );
    }
}

/// The plugin starts without Rust's runtime wrapper (main.rs), so it guards the standard
/// descriptors itself: started with fds 0–2 closed, the files it opens (state, log) must
/// not take fd 1 and swallow the protocol answer, and the ADD still succeeds. A runtime
/// that closed its end of stdout gets an exit status, not a process killed by SIGPIPE.
#[test]
fn closed_standard_fds_and_a_closed_stdout_pipe() {
    let t = tempfile::tempdir().unwrap();
    let conf_file = t.path().join("conf.json");
    std::fs::write(&conf_file, bytes(&conf("1.0.0", t.path(), json!({})))).unwrap();
    let env = attach_env("c-fds", "/var/run/netns/p", POD_ARGS);
    // stdin from the file, then every standard fd closed except stdin's copy on 3...
    // simplest with a shell: fd 0 is the config, fds 1 and 2 are closed.
    let status = Command::new("sh")
        .arg("-c")
        .arg(r#"exec "$0" < "$1" >&- 2>&-"#)
        .arg(BIN)
        .arg(&conf_file)
        .env("CNI_COMMAND", "ADD")
        .env("CNI_PATH", "/usr/lib/cni")
        .envs(env.iter().copied())
        .status()
        .unwrap();
    assert!(status.success(), "{status}");
    let state_file = t.path().join("attachments/c-fds+eth0.json");
    let state: Value = serde_json::from_slice(&std::fs::read(&state_file).unwrap())
        .expect("the state file holds exactly the state, not the protocol answer");
    assert_eq!(state["decision"]["decision"], "not-meshed");
    let log = std::fs::read_to_string(t.path().join("plugin.log")).unwrap();
    assert!(
        !log.contains("\"cniVersion\""),
        "answer went to the log: {log}"
    );

    // stdout is a pipe nobody reads any more: the write fails, the plugin exits.
    let mut child = Command::new(BIN)
        .env_clear()
        .env("CNI_COMMAND", "ADD")
        .env("CNI_PATH", "/usr/lib/cni")
        .envs(attach_env("c-pipe", "/var/run/netns/p", POD_ARGS))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(&bytes(&conf("1.0.0", t.path(), json!({}))))
        .unwrap();
    drop(stdin);
    let status = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), None, "killed by a signal: {status}");
}

//! The plugin never programs a namespace that is not a pod's (issue 7 item 2): its own
//! (the host's) by any name, or a path that is not a network namespace at all. A test
//! netns stands in for the host: the plugin runs inside it (`ip netns exec`), as it runs
//! in the node's namespace under a runtime. The real root namespace is never the target.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use interlock_testkit::traffic::assert_no_interlock_rules;
use interlock_testkit::{require_root, tempdir, Netns};
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_interlock-cni");

/// Runs the plugin inside `host` (or in this process's namespace when `None`) with
/// `CNI_NETNS=netns`; waits at most 10 s (a hang fails the test); exit code and stdout.
fn run_in(host: Option<&Netns>, verb: &str, netns: &str, conf: &Value) -> (i32, Value) {
    let mut cmd = match host {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns.name(), BIN]);
            c
        }
        None => Command::new(BIN),
    };
    let mut child = cmd
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", verb)
        .env("CNI_CONTAINERID", "c-host")
        .env("CNI_NETNS", netns)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_ARGS", "K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web")
        .env("CNI_PATH", "/usr/lib/cni")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(conf.to_string().as_bytes())
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{verb} with CNI_NETNS={netns} hangs");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    let stdout: Value = if out.stdout.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&out.stdout).unwrap()
    };
    (out.status.code().unwrap_or(-1), stdout)
}

fn conf(state: &std::path::Path) -> Value {
    json!({
        "cniVersion": "1.0.0", "name": "n", "type": "interlock-cni",
        "stateDir": state, "logFile": state.join("plugin.log"), "backend": "nftables",
        "runtimeConfig": {"io.kubernetes.cri.pod-annotations": {"interlock.dev/redirect": "enabled"}},
        "prevResult": {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0"}],
                       "ips": [{"interface": 0, "address": "10.99.12.2/24", "gateway": "10.99.12.1"}]},
    })
}

/// The plugin runs in netns `host`; `CNI_NETNS` names that same namespace, as
/// `/proc/self/ns/net` or as its bind mount: ADD is refused (105) naming the path, and no
/// rule exists anywhere (the stand-in host, and the real root namespace either).
#[test]
fn the_plugins_own_namespace_is_refused() {
    require_root!();
    let host = Netns::new("host").unwrap();
    host.exec_ok(&[
        "ip", "link", "add", "ilh0", "type", "veth", "peer", "name", "ilh1",
    ]);
    host.exec_ok(&["ip", "addr", "add", "10.99.12.2/24", "dev", "ilh0"]);
    host.exec_ok(&["ip", "link", "set", "ilh0", "up"]);
    let state = tempdir().unwrap();
    let c = conf(state.path());
    let bind_mount = host.path().display().to_string();
    for netns in [
        "/proc/self/ns/net",
        "/proc/thread-self/ns/net",
        bind_mount.as_str(),
    ] {
        for verb in ["ADD", "CHECK", "DEL"] {
            let (code, out) = run_in(Some(&host), verb, netns, &c);
            if verb == "CHECK" {
                // No state: CHECK never reaches the namespace.
                assert_eq!(code, 1, "{out}");
                continue;
            }
            assert_eq!(
                (code, &out["code"]),
                (1, &json!(105)),
                "{verb} {netns}: {out}"
            );
            let msg = out["msg"].as_str().unwrap();
            assert!(
                msg.contains(netns)
                    && msg.contains("this process's own network namespace, not a pod's"),
                "{verb}: {msg}"
            );
            assert_no_interlock_rules(&host);
        }
    }
    let root_tables = Command::new("nft")
        .args(["list", "tables"])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&root_tables.stdout).contains("interlock"),
        "interlock table in the root namespace"
    );
    assert!(
        !state.path().join("attachments/c-host+eth0.json").exists(),
        "state recorded for a refused ADD"
    );
}

/// `CNI_NETNS` that is not a network namespace: ADD is refused naming it and what it is;
/// DEL succeeds at once (nothing of interlock's can be there), even for a FIFO.
#[test]
fn paths_that_are_not_network_namespaces() {
    require_root!();
    let dir = tempdir().unwrap();
    let state = tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, b"not a namespace").unwrap();
    let c = conf(state.path());
    for (path, what) in [
        (fifo.display().to_string(), "a FIFO"),
        (file.display().to_string(), "a regular file"),
        (dir.path().display().to_string(), "a directory"),
        (
            "/proc/self/ns/uts".to_string(),
            "a namespace of another type",
        ),
    ] {
        let (code, out) = run_in(None, "ADD", &path, &c);
        assert_eq!((code, &out["code"]), (1, &json!(105)), "{path}: {out}");
        let msg = out["msg"].as_str().unwrap();
        assert!(
            msg.contains(&format!("{path} is not a network namespace ({what}")),
            "{msg}"
        );
        let (code, out) = run_in(None, "DEL", &path, &c);
        assert_eq!(code, 0, "DEL {path}: {out}");
    }
}

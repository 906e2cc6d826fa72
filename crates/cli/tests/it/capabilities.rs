//! The DaemonSet's capabilities, proven on the real agent: it runs as root with exactly
//! the set `interlock manifests` grants (bounding set limited, every other capability
//! gone, no new privileges — what `drop: [ALL]`, `add: […]` and
//! `allowPrivilegeEscalation: false` give a container) against a private containerd, and
//! its audit still finds and repairs an unprotected meshed sandbox. With any one of the
//! set taken away, the audit cannot read the sandbox's rules (it says so, and changes
//! nothing). NET_RAW is the iptables-legacy backend's, so it is shown with that backend.

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{interlock, plugin, wait_until, Agent, Dirs};
use interlock_cri::CriClient;
use interlock_testkit::require_root;
use interlock_testkit_node::containerd::Containerd;
use serde::Deserialize;

/// The capabilities the DaemonSet adds, as `interlock manifests` renders it.
fn manifest_caps() -> Vec<String> {
    let out = Command::new(interlock()).arg("manifests").output().unwrap();
    assert!(out.status.success());
    let yaml = String::from_utf8(out.stdout).unwrap();
    let ds = serde_yaml_ng::Deserializer::from_str(&yaml)
        .map(|d| serde_json::Value::deserialize(d).unwrap())
        .find(|d| d["kind"] == "DaemonSet")
        .unwrap();
    let sc = &ds["spec"]["template"]["spec"]["containers"][0]["securityContext"];
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    sc["capabilities"]["add"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect()
}

/// The kernel's number of a capability name (`NET_ADMIN`).
fn cap_number(name: &str) -> u32 {
    match name {
        "NET_ADMIN" => 12,
        "NET_RAW" => 13,
        "SYS_PTRACE" => 19,
        "SYS_ADMIN" => 21,
        other => panic!("unknown capability {other} in the manifest: add it here"),
    }
}

/// `CapEff` of process `pid`.
fn effective_caps(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .unwrap()
        .trim();
    u64::from_str_radix(hex, 16).unwrap()
}

/// The agent, as root with only `caps` (bounding set, no new privileges).
fn agent_with(d: &Dirs, caps: &[String], endpoint: &str, extra: &[&str]) -> Agent {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let bounding = std::iter::once("-all".to_string())
        .chain(caps.iter().map(|c| format!("+{}", c.to_lowercase())))
        .collect::<Vec<_>>()
        .join(",");
    let log = d.tmp.path().join(format!("agent-{port}.log"));
    let child = Command::new("setpriv")
        .args([
            "--no-new-privs",
            "--inh-caps",
            "-all",
            "--bounding-set",
            &bounding,
            "--",
        ])
        .arg(interlock())
        .arg("agent")
        .arg("--cni-conf-dir")
        .arg(&d.conf)
        .arg("--cni-bin-dir")
        .arg(&d.bin)
        .arg("--state-dir")
        .arg(&d.state)
        .args(["--kube=none", "--plugin-source"])
        .arg(plugin())
        .arg("--health-addr")
        .arg(format!("127.0.0.1:{port}"))
        .args(["--cri-endpoint", endpoint, "--audit-interval", "0.2"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let a = Agent { child, port, log };
    wait_until(
        Duration::from_secs(10),
        || a.get("/healthz").is_some(),
        || format!("agent did not serve /healthz; log:\n{}", a.log_text()),
    );
    let want: u64 = caps.iter().map(|c| 1u64 << cap_number(c)).sum();
    assert_eq!(
        effective_caps(a.pid()),
        want,
        "the agent runs with exactly {caps:?}"
    );
    a
}

fn has_our_rules(netns: &Path) -> bool {
    let out = |cmd: &[&str]| {
        let o = Command::new("nsenter")
            .arg(format!("--net={}", netns.display()))
            .args(cmd)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    out(&["nft", "list", "ruleset"]).contains("interlock")
        || out(&["iptables-legacy-save", "-t", "nat"]).contains("IL_")
}

async fn meshed_sandbox(
    kit: &Containerd,
    cri: &CriClient,
    tag: &str,
) -> (String, std::path::PathBuf) {
    let config = kit.pod(tag).annotation(
        interlock_testkit_node::node::MESHED_ANNOTATION.0,
        interlock_testkit_node::node::MESHED_ANNOTATION.1,
    );
    let id = cri.run_sandbox(&config).await.unwrap();
    let netns = cri
        .sandbox_status(&id, true)
        .await
        .unwrap()
        .netns_path()
        .unwrap()
        .to_path_buf();
    (id, netns)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manifests_capabilities_are_enough_and_each_is_needed() {
    require_root!();
    let caps = manifest_caps();
    assert!(
        !caps.iter().any(|c| c == "SYS_PTRACE"),
        "SYS_PTRACE is not needed (this test runs without it)"
    );
    let kit = Containerd::start().unwrap();
    kit.install_primary_plugins().unwrap();
    kit.write_primary_config().unwrap();
    let cri = kit.cri().await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cri.status().await.unwrap().network_ready() {
        assert!(Instant::now() < deadline, "NetworkReady never came");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (first, first_netns) = meshed_sandbox(&kit, &cri, "cap0").await;
    assert!(!has_our_rules(&first_netns));
    let tmp = tempfile::tempdir().unwrap();
    let d = Dirs {
        conf: kit.conf_dir(),
        bin: kit.bin_dir(),
        state: tmp.path().join("state"),
        tmp,
    };
    std::fs::create_dir_all(&d.state).unwrap();
    let legacy = d.tmp.path().join("legacy.json");
    std::fs::write(&legacy, r#"{"backend": "iptables-legacy"}"#).unwrap();
    let legacy_flags = ["--plugin-config", legacy.to_str().unwrap()];
    let endpoint = kit.endpoint();

    // Each capability taken away (NET_RAW with the backend that needs it): the audit
    // cannot judge the sandbox, says why, and leaves it as it is.
    for missing in &caps {
        let fewer: Vec<String> = caps.iter().filter(|c| *c != missing).cloned().collect();
        let extra: &[&str] = if missing == "NET_RAW" {
            &legacy_flags
        } else {
            &[]
        };
        let a = agent_with(&d, &fewer, &endpoint, extra);
        wait_until(
            Duration::from_secs(10),
            || a.metric("interlock_sandboxes{verdict=\"unknown\"}") == Some(1.0),
            || {
                format!(
                    "without {missing}: the sandbox was not reported unknown; log:\n{}",
                    a.log_text()
                )
            },
        );
        let log = a.log_text();
        assert!(
            log.contains("cannot decide") && log.contains(&first),
            "without {missing}: {log}"
        );
        assert!(
            !log.contains("audit action done"),
            "without {missing}: {log}"
        );
        assert!(
            !has_our_rules(&first_netns),
            "without {missing}, rules appeared"
        );
        a.kill9();
    }

    // Exactly the manifest's set: repaired in place (the node's backend, nftables here).
    let a = agent_with(&d, &caps, &endpoint, &[]);
    wait_until(
        Duration::from_secs(10),
        || {
            a.log_text()
                .lines()
                .any(|l| l.contains("audit action done") && l.contains(&first))
        },
        || format!("not repaired with {caps:?}; log:\n{}", a.log_text()),
    );
    assert!(has_our_rules(&first_netns));
    a.kill9();

    // And with the iptables-legacy backend, for a sandbox started while the runtime
    // loaded only the primary again.
    for name in d.names().into_iter().filter(|n| n.contains("interlock")) {
        std::fs::remove_file(d.conf.join(name)).unwrap();
    }
    let mut second = None;
    for attempt in 0..50 {
        let (id, netns) = meshed_sandbox(&kit, &cri, &format!("cap{attempt}x")).await;
        if !has_our_rules(&netns) {
            second = Some((id, netns));
            break;
        }
        // The runtime had not reloaded its conf dir yet: that one went through interlock.
        cri.stop_sandbox(&id).await.unwrap();
        cri.remove_sandbox(&id).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (second, second_netns) = second.expect("the runtime never dropped interlock's config");
    let a = agent_with(&d, &caps, &endpoint, &legacy_flags);
    wait_until(
        Duration::from_secs(10),
        || {
            a.log_text()
                .lines()
                .any(|l| l.contains("audit action done") && l.contains(&second))
                && a.metric("interlock_sandboxes{verdict=\"protected\"}") == Some(2.0)
        },
        || {
            format!(
                "not repaired with {caps:?} and iptables-legacy; log:\n{}",
                a.log_text()
            )
        },
    );
    let legacy_rules = Command::new("nsenter")
        .arg(format!("--net={}", second_netns.display()))
        .args(["iptables-legacy-save", "-t", "nat"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&legacy_rules.stdout).contains("IL_"));
    // The probe the repair ran proved the capture (done means proven); the config
    // guard works too under these capabilities.
    wait_until(
        Duration::from_secs(5),
        || a.ready() == Some(true),
        || format!("not ready under {caps:?}; log:\n{}", a.log_text()),
    );
    drop(a);
    kit.teardown().unwrap();
}

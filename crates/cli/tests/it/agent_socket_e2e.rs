//! The agent socket end to end, with the real binaries: a real `interlock agent` process
//! (pods known through the fake Kubernetes API) answers the lookup of the real
//! `interlock-cni`, exec'd as a runtime execs it — ADD with `CNI_ARGS` naming the pod and
//! no annotations in the config —, over `<state dir>/agent.sock`; and the same plugin
//! refuses a socket an unprivileged user serves at that path.

use crate::common;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Agent, Dirs};
use interlock_testkit::forged_agent::ForgedAgent;
use interlock_testkit::{require_root, Netns};
use interlock_testkit_node::kubeapi::KubeApi;
use serde_json::{json, Value};

/// The UID the forged socket's server runs as.
const NOBODY: u32 = 65534;

fn plugin_binary() -> PathBuf {
    common::real_plugin().unwrap_or_else(|| {
        panic!("interlock-cni is not built next to interlock: run `cargo build -p interlock-cni`")
    })
}

/// The interlock-cni entry a runtime hands over (no `runtimeConfig`: no annotations),
/// asking `socket`, for an ADD in `netns`.
fn add_config(state: &Path, socket: &Path, netns: &Path) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "e2e",
        "type": "interlock-cni",
        "stateDir": state,
        "agentSocket": socket,
        "backend": "nftables",
        "prevResult": {
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0", "sandbox": netns}],
            "ips": []
        }
    })
}

/// Execs interlock-cni ADD for pod `shop/<name>` (UID `uid`) as a runtime does: `Ok` with
/// its result, or `Err((code, msg))` with its CNI error.
fn add(config: &Value, sandbox: &str, name: &str, uid: &str) -> Result<Value, (u64, String)> {
    let plugin = plugin_binary();
    let netns = config["prevResult"]["interfaces"][0]["sandbox"]
        .as_str()
        .unwrap()
        .to_string();
    let mut child = Command::new(&plugin)
        .env("CNI_COMMAND", "ADD")
        .env("CNI_CONTAINERID", sandbox)
        .env("CNI_NETNS", netns)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", plugin.parent().unwrap())
        .env(
            "CNI_ARGS",
            format!(
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME={name};\
                 K8S_POD_INFRA_CONTAINER_ID={sandbox};K8S_POD_UID={uid}"
            ),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(config.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "interlock-cni printed no JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    if out.status.success() {
        Ok(v)
    } else {
        Err((
            v["code"].as_u64().unwrap_or(0),
            v["msg"].as_str().unwrap_or_default().to_string(),
        ))
    }
}

fn state_of(state: &Path, sandbox: &str) -> Option<Value> {
    let p = state.join(format!("attachments/{sandbox}+eth0.json"));
    std::fs::read(p)
        .ok()
        .map(|b| serde_json::from_slice(&b).unwrap())
}

/// A pod on `node`; one Istio's injector marked (`sidecar.istio.io/status`) has the
/// `istio-proxy` container it adds, whose spec the agent passes on to the plugin.
fn pod(name: &str, node: &str, annotations: Value) -> Value {
    let mut containers = vec![json!({"name": "c", "image": "i"})];
    if annotations.get("sidecar.istio.io/status").is_some() {
        containers.push(json!({"name": "istio-proxy", "image": "proxyv2",
            "args": ["proxy", "sidecar"], "securityContext": {"runAsUser": 1337}}));
    }
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "shop", "annotations": annotations},
           "spec": {"nodeName": node, "containers": containers},
           "status": {"phase": "Running"}})
}

#[test]
fn the_real_agent_answers_the_real_plugins_lookup() {
    require_root!();
    let api = KubeApi::start().unwrap();
    api.put_object(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}));
    let web = api.put_object(pod("web-0", "n1", json!({"sidecar.istio.io/status": "{}"})));
    let db = api.put_object(pod("db-0", "n1", json!({"team": "shop"})));
    api.put_object(pod(
        "away-0",
        "n2",
        json!({"sidecar.istio.io/status": "{}"}),
    ));
    let uid = |p: &Value| p["metadata"]["uid"].as_str().unwrap().to_string();
    let d = Dirs::new();
    let kubeconfig = d.tmp.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    // No CRI here: the socket's answers come from the pod watch (an endpoint that does
    // not exist keeps the audit away from any runtime on the test host).
    let no_cri = format!("unix://{}", d.tmp.path().join("no-cri.sock").display());
    let a = Agent::start_env(
        &d,
        &[
            "--kube=auto",
            "--node-name",
            "n1",
            "--cri-endpoint",
            &no_cri,
            "--audit-interval",
            "600",
        ],
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
    );
    let socket = d.state.join("agent.sock");
    let (web_ns, db_ns, away_ns) = (
        Netns::new("web").unwrap(),
        Netns::new("db").unwrap(),
        Netns::new("away").unwrap(),
    );

    // Like a runtime, retry while the agent cannot tell yet (socket not there, pod
    // cache not synced): code 11, nothing else.
    let db_config = add_config(&d.state, &socket, &db_ns.path());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match add(&db_config, "sb-db", "db-0", &uid(&db)) {
            Ok(_) => break,
            Err((11, msg)) if Instant::now() < deadline => {
                assert!(
                    msg.contains("not synced") || msg.contains(&socket.display().to_string()),
                    "{msg}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("{e:?}\nagent log:\n{}", a.log_text()),
        }
    }
    let s = state_of(&d.state, "sb-db").unwrap();
    assert_eq!(s["annotationsSource"], "agent", "{s}");
    assert_eq!(s["decision"]["decision"], "not-meshed", "{s}");
    assert!(!db_ns
        .exec_ok(&["nft", "list", "ruleset"])
        .contains("interlock"));

    // The meshed pod: decided from the agent's answer, its rules applied and proven.
    let web_config = add_config(&d.state, &socket, &web_ns.path());
    add(&web_config, "sb-web", "web-0", &uid(&web))
        .unwrap_or_else(|e| panic!("{e:?}\nagent log:\n{}", a.log_text()));
    let s = state_of(&d.state, "sb-web").unwrap();
    assert_eq!(s["annotationsSource"], "agent", "{s}");
    assert_eq!(s["decision"]["profile"], "istio", "{s}");
    assert_eq!(s["protection"]["protection"], "protected", "{s}");
    assert!(web_ns
        .exec_ok(&["nft", "list", "ruleset"])
        .contains("interlock"));

    // A pod the agent does not have on this node, or another pod under the same name:
    // the agent's "not found" is no answer, and the plugin fails closed.
    let refused = |a: &Agent| starts(a, "refused", "undecided", "unknown");
    let before = refused(&a);
    let away_config = add_config(&d.state, &socket, &away_ns.path());
    for (name, pod_uid) in [("away-0", String::new()), ("web-0", "another-uid".into())] {
        let (code, msg) = add(&away_config, "sb-away", name, &pod_uid).unwrap_err();
        assert_eq!(code, 11, "{msg}");
        assert!(msg.contains(&format!("pod shop/{name}")), "{msg}");
        assert!(state_of(&d.state, "sb-away").is_none());
    }
    assert!(!away_ns
        .exec_ok(&["nft", "list", "ruleset"])
        .contains("interlock"));
    // ux-3 finding 10: the agent counts both refusals, by reason and profile, from the
    // plugin's failure notes.
    assert_eq!(
        refused(&a) - before,
        2.0,
        "{}",
        a.get("/metrics").unwrap().1
    );
    // A meshed pod whose protection fails at a step (its netns is no network namespace):
    // counted as failed, under the step and the pod's profile.
    let not_a_netns = d.tmp.path().join("not-a-netns");
    std::fs::write(&not_a_netns, "").unwrap();
    let broken = add_config(&d.state, &socket, &not_a_netns);
    let (code, msg) = add(&broken, "sb-broken", "web-0", &uid(&web)).unwrap_err();
    assert_eq!(code, 105, "{msg}");
    assert_eq!(
        starts(&a, "failed", "netns", "istio"),
        1.0,
        "{}",
        a.get("/metrics").unwrap().1
    );
    assert!(
        a.log_text()
            .contains("interlock-cni did not protect a pod start"),
        "{}",
        a.log_text()
    );
    drop(a);
}

/// `interlock_pod_starts_<outcome>_total{reason,profile}` on the agent's `/metrics` (0
/// when the series is not there yet).
fn starts(a: &Agent, outcome: &str, reason: &str, profile: &str) -> f64 {
    let (_, body) = a.get("/metrics").expect("/metrics answers");
    let name = format!("interlock_pod_starts_{outcome}_total{{");
    body.lines()
        .filter(|l| l.starts_with(&name))
        .filter(|l| l.contains(&format!("reason=\"{reason}\"")))
        .filter(|l| l.contains(&format!("profile=\"{profile}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The forged agent ([`ForgedAgent`]): answers "meshed" for every pod; only does
/// anything in the child `a_forged_socket_is_refused_by_the_real_plugin` starts as an
/// unprivileged user.
#[test]
fn forged_agent_process() {
    interlock_testkit::forged_agent::serve_if_child(&[("sidecar.istio.io/status", "{}")]);
}

/// A state dir an unprivileged user can write (a mistake) lets that user serve
/// `<state dir>/agent.sock` in the agent's place: the real plugin refuses the socket
/// (its owner), and still refuses it once root made it root's in a root-only directory
/// (its server's credentials, SO_PEERCRED). The ADD fails closed (11) and the forged
/// "meshed" answer installs nothing.
#[test]
fn a_forged_socket_is_refused_by_the_real_plugin() {
    require_root!();
    let mut forger = ForgedAgent::start("agent_socket_e2e::forged_agent_process", NOBODY);
    let forged = forger.socket.clone();
    let root_only = interlock_testkit::tempdir().unwrap();
    std::fs::set_permissions(root_only.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let moved = root_only.path().join("agent.sock");
    let ns = Netns::new("forged").unwrap();
    for (state, socket, refusal) in [
        (
            forger.open_dir.path().to_path_buf(),
            forged.clone(),
            format!("owned by uid {NOBODY}"),
        ),
        (
            root_only.path().to_path_buf(),
            moved.clone(),
            format!("runs as uid {NOBODY}, not root"),
        ),
    ] {
        if socket == moved {
            forger.move_into(root_only.path());
        }
        let config = add_config(&state, &socket, &ns.path());
        let (code, msg) = add(&config, "sb-forged", "web-0", "").unwrap_err();
        assert_eq!(code, 11, "{msg}");
        assert!(
            msg.contains(&format!("agent socket {}", socket.display())) && msg.contains(&refusal),
            "{msg}"
        );
        assert!(state_of(&state, "sb-forged").is_none());
        assert!(!ns
            .exec_ok(&["nft", "list", "ruleset"])
            .contains("interlock"));
    }
}

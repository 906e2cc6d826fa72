//! The plugin stand-in as a guard observes it, without a pod network: the verbs' answers
//! (`research/guard-mode.md` §A.x.6), ADD failing without the plugin's dependency (§A.x.1),
//! the pod GET over the fake API with the kubeconfig's token, and skipped pods getting
//! `prevResult` back unchanged (§A.x.3). Writing the rules into a pod is proven on a real
//! containerd (`without_guard.rs`).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use interlock_contract::guard::GuardedMesh;
use interlock_mesh_standins::install::{InstallOptions, Installer};
use interlock_testkit_node::kubeapi::{KubeApi, UserInfo};
use serde_json::{json, Value};

const EXE: &str = env!("CARGO_BIN_EXE_mesh-standin");

fn cni(command: &str, conf: &Value, args: &str) -> (i32, Value) {
    let mut child = Command::new(EXE)
        .env("CNI_COMMAND", command)
        .env("CNI_ARGS", args)
        .env("CNI_NETNS", "/nonexistent/netns")
        .env("CNI_IFNAME", "eth0")
        .env("CNI_CONTAINERID", "c0ffee")
        .env("CNI_PATH", "/nonexistent")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(conf.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), v)
}

fn prev() -> Value {
    json!({"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": "/nonexistent/netns"}],
           "ips": [{"address": "10.22.0.5/16", "gateway": "10.22.0.1", "interface": 0}]})
}

fn pod_args(ns: &str, name: &str) -> String {
    format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name};K8S_POD_INFRA_CONTAINER_ID=c0ffee")
}

#[test]
fn verbs_answer_as_cni_v1_3_skel_does() {
    for mesh in GuardedMesh::ALL {
        let t = mesh.plugin_type();
        let (code, v) = cni("VERSION", &json!({"cniVersion": "1.1.0", "type": t}), "");
        assert_eq!(code, 0, "{t}");
        assert_eq!(
            v["supportedVersions"],
            json!(["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]),
            "{t}"
        );
        for verb in ["STATUS", "GC"] {
            let (code, v) = cni(
                verb,
                &json!({"cniVersion": "1.1.0", "name": "n", "plugins": [{"type": t}]}),
                "",
            );
            assert_eq!((code, &v), (0, &Value::Null), "{t} {verb} at 1.1.0");
            let (code, v) = cni(
                verb,
                &json!({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": t}]}),
                "",
            );
            assert_eq!(code, 1, "{t} {verb} at 1.0.0");
            assert_eq!(v["code"], 4, "{t} {verb}: {v}");
        }
        for verb in ["CHECK", "DEL"] {
            let (code, v) = cni(
                verb,
                &json!({"cniVersion": "1.0.0", "type": t, "prevResult": prev()}),
                "",
            );
            assert_eq!((code, &v), (0, &Value::Null), "{t} {verb}");
        }
    }
}

struct Bed {
    api: KubeApi,
    _tmp: tempfile::TempDir,
    installers: Vec<Installer>,
}

/// A fake API with one plain pod `apps/plain`, and the four installers' files (entries
/// and kubeconfigs) in a temp dir.
fn bed() -> Bed {
    let api = KubeApi::start().unwrap();
    api.put_object(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "plain", "namespace": "apps"},
        "spec": {"containers": [{"name": "app", "image": "app"}]}}));
    let tmp = tempfile::tempdir().unwrap();
    let installers = GuardedMesh::ALL
        .into_iter()
        .map(|mesh| {
            let conf = tmp.path().join(format!("{mesh}-net.d"));
            let bin = tmp.path().join(format!("{mesh}-bin"));
            std::fs::create_dir_all(&conf).unwrap();
            std::fs::create_dir_all(&bin).unwrap();
            Installer::start(InstallOptions {
                mesh,
                conf_dir: conf,
                bin_dir: bin,
                source: EXE.into(),
                server: api.url(),
                token: "standin-token".into(),
                run_dir: tmp.path().join("istio-run"),
                conf_name: "10-primary.conflist".into(),
            })
            .unwrap()
        })
        .collect();
    Bed {
        api,
        _tmp: tmp,
        installers,
    }
}

fn entry(b: &Bed, mesh: GuardedMesh) -> Value {
    let i = &b.installers[GuardedMesh::ALL.iter().position(|m| *m == mesh).unwrap()];
    let mut e = i.entry();
    e["cniVersion"] = json!("1.0.0");
    e["prevResult"] = prev();
    e
}

fn kubeconfig(b: &Bed, mesh: GuardedMesh) -> std::path::PathBuf {
    b.installers[GuardedMesh::ALL.iter().position(|m| *m == mesh).unwrap()].kubeconfig_path()
}

/// Held by a test while it runs an `/install-cni` process: kuma-cni's plugin counts them
/// host-wide, so two at once would fail each other's ADDs.
static INSTALL_CNI: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A process whose argv[0] is `/install-cni` (kuma-cni's plugin looks for exactly one),
/// killed when dropped (also when the test fails).
struct InstallCni(std::process::Child);

impl InstallCni {
    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for InstallCni {
    fn drop(&mut self) {
        self.kill();
    }
}

fn install_cni_process() -> InstallCni {
    use std::os::unix::process::CommandExt;
    InstallCni(
        Command::new("sleep")
            .arg0("/install-cni")
            .arg("60")
            .spawn()
            .unwrap(),
    )
}

#[test]
fn add_gets_the_pod_with_the_token_and_passes_unmeshed_pods_unchanged() {
    let _one = INSTALL_CNI.lock().unwrap_or_else(|e| e.into_inner());
    let b = bed();
    let mut kuma = install_cni_process();
    for mesh in GuardedMesh::ALL {
        b.api.clear_requests();
        let (code, v) = cni("ADD", &entry(&b, mesh), &pod_args("apps", "plain"));
        assert_eq!(code, 0, "{mesh}: {v}");
        let mut want = prev();
        want["cniVersion"] = json!("1.0.0");
        assert_eq!(v, want, "{mesh}: prevResult back unchanged");
        assert!(
            b.api
                .requests()
                .iter()
                .any(|r| r.method == "GET" && r.path == "/api/v1/namespaces/apps/pods/plain"),
            "{mesh}: the pod was read over the API"
        );
    }
    // The token is the kubeconfig's: a token that may not read pods fails every ADD that
    // needs the pod (shown with the plugins that do not retry: istio-cni and kuma-cni try
    // 30 times, 1 s apart).
    b.api.add_token(
        "standin-token",
        UserInfo::service_account("kube-system", "nobody", None),
    );
    for mesh in [GuardedMesh::Linkerd, GuardedMesh::Consul] {
        let (code, v) = cni("ADD", &entry(&b, mesh), &pod_args("apps", "plain"));
        assert_eq!(code, 1, "{mesh}: {v}");
        assert!(v["msg"].as_str().unwrap().contains("403"), "{mesh}: {v}");
    }
    kuma.kill();
}

#[test]
fn add_fails_without_the_plugins_dependency() {
    let _one = INSTALL_CNI.lock().unwrap_or_else(|e| e.into_inner());
    let b = bed();
    let mut kuma = install_cni_process();
    // istio-cni lets excluded namespaces through before it needs its kubeconfig.
    std::fs::remove_file(kubeconfig(&b, GuardedMesh::Istio)).unwrap();
    let (code, v) = cni(
        "ADD",
        &entry(&b, GuardedMesh::Istio),
        &pod_args("kube-system", "dns"),
    );
    assert_eq!(code, 0, "excluded namespace: {v}");
    for mesh in GuardedMesh::ALL {
        let kc = kubeconfig(&b, mesh);
        let _ = std::fs::remove_file(&kc);
        let (code, v) = cni("ADD", &entry(&b, mesh), &pod_args("apps", "plain"));
        assert_eq!(code, 1, "{mesh} without {}: {v}", kc.display());
        assert!(
            v["msg"].as_str().unwrap().contains("kubeconfig"),
            "{mesh}: {v}"
        );
    }
    kuma.kill();
    // kuma-cni fails every ADD, excluded namespaces too, without exactly one /install-cni.
    let (code, v) = cni(
        "ADD",
        &entry(&b, GuardedMesh::Kuma),
        &pod_args("kube-system", "dns"),
    );
    assert_eq!(code, 1, "{v}");
    assert!(v["msg"].as_str().unwrap().contains("/install-cni"), "{v}");
    // linkerd-cni needs its context in the kubeconfig.
    let kc = kubeconfig(&b, GuardedMesh::Linkerd);
    std::fs::write(
        &kc,
        interlock_mesh_standins::files::kubeconfig(&b.api.url(), "t", "other"),
    )
    .unwrap();
    let (code, v) = cni(
        "ADD",
        &entry(&b, GuardedMesh::Linkerd),
        &pod_args("apps", "plain"),
    );
    assert_eq!(code, 1, "{v}");
    assert!(
        v["msg"].as_str().unwrap().contains("linkerd-cni-context"),
        "{v}"
    );
    assert!(Path::new(&kc).exists());
}

#[test]
fn consul_fails_a_tproxy_pod_without_its_redirect_config() {
    let b = bed();
    b.api.put_object(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "apps", "annotations": {
            "consul.hashicorp.com/connect-inject-status": "injected",
            "consul.hashicorp.com/transparent-proxy-status": "enabled"}},
        "spec": {"containers": [{"name": "app", "image": "app"}]}}));
    let (code, v) = cni(
        "ADD",
        &entry(&b, GuardedMesh::Consul),
        &pod_args("apps", "web"),
    );
    assert_eq!(code, 1, "{v}");
    assert!(
        v["msg"]
            .as_str()
            .unwrap()
            .contains("redirect-traffic-config"),
        "{v}"
    );
    // And one without prevResult IPs fails before the pod is read.
    let mut e = entry(&b, GuardedMesh::Consul);
    e["prevResult"]["ips"] = json!([]);
    let (code, v) = cni("ADD", &e, &pod_args("apps", "plain"));
    assert_eq!(code, 1, "{v}");
    assert!(v["msg"].as_str().unwrap().contains("no IP"), "{v}");
}

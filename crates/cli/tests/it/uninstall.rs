//! `interlock uninstall` as a process against throwaway conf/bin/state dirs (and, with
//! `--cluster`, the fake Kubernetes API): it refuses while an agent runs on the state dir,
//! `--force` goes ahead and says the agent puts things back, `--dry-run` changes nothing
//! and lists what goes and what stays, a conf dir without any CNI config is refused with
//! nothing removed, and the plugin binary stays while a config still names it.

use crate::common;

use common::*;
use interlock_contract::names::{CONDITION_READY, LABEL_UNPROTECTED, TAINT_NOT_READY};
use interlock_testkit_node::kubeapi::KubeApi;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

/// Every file under `root` with its content (directories as empty entries, sockets and
/// other special files by kind), to prove a run changed nothing.
fn tree(root: &Path) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let t = e.file_type().unwrap();
            if t.is_dir() {
                stack.push(p.clone());
                out.insert(p, None);
            } else if t.is_file() {
                out.insert(p.clone(), Some(std::fs::read(&p).unwrap()));
            } else {
                out.insert(p, Some(b"<special>".to_vec()));
            }
        }
    }
    out
}

fn text(out: &Output) -> (Option<i32>, String, String) {
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn run(d: &Dirs, args: &[&str]) -> (Option<i32>, String, String) {
    text(&d.interlock("uninstall").args(args).output().unwrap())
}

/// An agent in owned mode that protected the node and was stopped: its config, binary,
/// marker and socket stay behind.
fn stopped_agent(d: &Dirs) -> String {
    d.write("10-calico.conflist", CALICO);
    let a = d.agent(&[]);
    let owned = wait_protected(d, &a);
    assert!(a.terminate().success());
    owned
}

fn plugin_bin(d: &Dirs) -> PathBuf {
    d.bin.join("interlock-cni")
}

fn marker(d: &Dirs) -> PathBuf {
    d.state.join("agent-ready.json")
}

#[test]
fn refuses_while_the_agent_runs_and_force_says_it_puts_things_back() {
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    let a = d.agent(&[]);
    assert_eq!(wait_protected(&d, &a), "00-interlock.conflist");
    let before = d.names();

    let (code, out, err) = run(&d, &[]);
    assert_eq!(code, Some(1), "{out}\n{err}");
    let pid = format!("pid {}", a.pid());
    for want in [
        "refusing to uninstall",
        pid.as_str(),
        &marker(&d).display().to_string(),
        "--uninstall-on-exit",
        "--force",
        "nothing was changed",
    ] {
        assert!(err.contains(want), "{want:?} missing from: {err}");
    }
    assert_eq!(d.names(), before);
    assert!(plugin_bin(&d).exists());
    assert!(marker(&d).exists());
    assert!(d.state.join("agent.sock").exists());

    // A dry run says what a real run would do, and that it would refuse (exit 1).
    let (code, out, err) = run(&d, &["--dry-run"]);
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(
        out.contains("would remove 00-interlock.conflist in"),
        "{out}"
    );
    assert!(err.contains("a real run would refuse"), "{err}");
    assert_eq!(d.names(), before);
    assert!(plugin_bin(&d).exists() && marker(&d).exists());

    // --force goes ahead, says the agent puts things back, and the agent does.
    let (code, out, err) = run(&d, &["--force"]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(err.contains(&pid) && err.contains("will put its"), "{err}");
    assert!(out.contains("removed 00-interlock.conflist in"), "{out}");
    assert!(
        out.contains(&format!(
            "kept {}: an agent still listens on it",
            d.state.join("agent.sock").display()
        )),
        "{out}"
    );
    wait_until(
        Duration::from_secs(10),
        || d.effective_with_us().is_some() && plugin_bin(&d).exists(),
        || format!("the agent did not put things back: {:?}", d.names()),
    );

    // Once the agent has stopped, the same command removes everything of interlock's.
    assert!(a.terminate().success());
    let (code, out, err) = run(&d, &[]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert_eq!(d.names(), ["10-calico.conflist"]);
    assert_eq!(d.read("10-calico.conflist").unwrap(), CALICO.as_bytes());
    assert!(!plugin_bin(&d).exists(), "{out}");
    assert!(!marker(&d).exists(), "{out}");
    assert!(!d.state.join("agent.sock").exists(), "{out}");
}

#[test]
fn dry_run_changes_nothing_and_lists_what_goes_and_what_stays() {
    let d = Dirs::new();
    let owned = stopped_agent(&d);
    // What the plugin leaves in the state dir while pods run (records of one pod).
    let att = d.state.join("attachments");
    let netns = d.state.join("netns");
    std::fs::create_dir_all(&att).unwrap();
    std::fs::create_dir_all(&netns).unwrap();
    std::fs::write(att.join("c0ffee+eth0.json"), "{}").unwrap();
    std::fs::write(netns.join("4-4026532999.json"), "{}").unwrap();
    std::fs::write(netns.join("4-4026532999.lock"), "").unwrap();
    std::fs::write(
        d.state.join("backend-detected.json"),
        r#"{"backend":"nftables","reason":"test","detectedAtMs":1}"#,
    )
    .unwrap();
    let before = tree(d.tmp.path());

    let (code, out, err) = run(&d, &["--dry-run"]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert_eq!(tree(d.tmp.path()), before, "the dry run changed something");
    let s = |p: &Path| p.display().to_string();
    let expect_removed = [
        format!(
            "would remove {owned} in {} (interlock's own config)",
            s(&d.conf)
        ),
        format!("would remove {} (the plugin binary", s(&plugin_bin(&d))),
        format!(
            "would remove {} (the agent's readiness marker)",
            s(&marker(&d))
        ),
        format!(
            "would remove {} (the agent's socket; nothing listens",
            s(&d.state.join("agent.sock"))
        ),
        format!(
            "would remove {} (the plugin's cached detection",
            s(&d.state.join("backend-detected.json"))
        ),
    ];
    let expect_kept = [
        format!("would keep {}: 1 record(s) of pods attached", s(&att)),
        format!(
            "would keep {}: 1 record(s) of protected pod network namespaces",
            s(&netns)
        ),
    ];
    for want in expect_removed.iter().chain(&expect_kept) {
        assert!(out.contains(want.as_str()), "{want:?} missing from:\n{out}");
    }
    assert!(out.starts_with("dry run: nothing was changed"), "{out}");
    // Why the records stay: the DEL that may still come for running pods.
    assert!(out.contains("CRI-O") && out.contains("DEL"), "{out}");

    // The real run does what the dry run said, in the past tense.
    let (code, out2, err) = run(&d, &[]);
    assert_eq!(code, Some(0), "{out2}\n{err}");
    for want in expect_removed.iter().chain(&expect_kept) {
        let past = want
            .replace("would remove", "removed")
            .replace("would keep", "kept");
        assert!(out2.contains(&past), "{past:?} missing from:\n{out2}");
    }
    assert_eq!(d.names(), ["10-calico.conflist"]);
    assert!(!plugin_bin(&d).exists());
    let mut left: Vec<String> = std::fs::read_dir(&d.state)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["attachments", "netns"]);
    assert!(att.join("c0ffee+eth0.json").exists());
    assert!(netns.join("4-4026532999.lock").exists());

    // The pods are gone (their DELs removed the records): the empty directories go too.
    std::fs::remove_file(att.join("c0ffee+eth0.json")).unwrap();
    std::fs::remove_file(netns.join("4-4026532999.json")).unwrap();
    std::fs::remove_file(netns.join("4-4026532999.lock")).unwrap();
    let (code, out3, err) = run(&d, &[]);
    assert_eq!(code, Some(0), "{out3}\n{err}");
    assert!(
        out3.contains(&format!("removed {} (empty", s(&att))),
        "{out3}"
    );
    assert_eq!(std::fs::read_dir(&d.state).unwrap().count(), 0, "{out3}");
}

/// Chain mode: interlock's entry lives inside the primary's own file. Uninstall takes it
/// out (every foreign field kept), and only then removes the binary.
#[test]
fn chain_mode_entry_is_taken_out_of_the_primary_before_the_binary_goes() {
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    let a = d.agent(&["--config-mode", "chain"]);
    assert_eq!(wait_protected(&d, &a), "10-calico.conflist");
    assert!(a.terminate().success());
    assert_eq!(
        plugin_types(&d.json("10-calico.conflist")),
        ["bridge", "portmap", "interlock-cni"]
    );
    let (code, out, err) = run(&d, &["--dry-run"]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(
        out.contains(&format!(
            "would rewrite 10-calico.conflist in {} without interlock's entry",
            d.conf.display()
        )),
        "{out}"
    );
    // In memory the entry is gone, so the binary would go too.
    assert!(
        out.contains(&format!("would remove {}", plugin_bin(&d).display())),
        "{out}"
    );
    assert_eq!(
        plugin_types(&d.json("10-calico.conflist")),
        ["bridge", "portmap", "interlock-cni"]
    );

    let (code, out, err) = run(&d, &[]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    let orig: Value = serde_json::from_str(CALICO).unwrap();
    assert_eq!(d.json("10-calico.conflist"), orig, "{out}");
    assert_eq!(d.names(), ["10-calico.conflist"]);
    assert!(!plugin_bin(&d).exists(), "{out}");
}

#[test]
fn a_conf_dir_without_any_config_is_refused_and_nothing_is_removed() {
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    let a = d.agent(&[]);
    wait_protected(&d, &a);
    // An agent that died: its marker still names the config it guarded.
    a.kill9();
    let before = tree(d.tmp.path());
    let missing = d.tmp.path().join("no-such-net.d");
    let empty = d.tmp.path().join("empty-net.d");
    std::fs::create_dir_all(&empty).unwrap();
    std::fs::write(empty.join("README"), "not a config").unwrap();
    let before_empty = tree(d.tmp.path());
    for (dir, problem) in [
        (&missing, "does not exist"),
        (&empty, "holds no CNI config"),
    ] {
        for dry in [false, true] {
            let out = std::process::Command::new(interlock())
                .arg("uninstall")
                .arg("--cni-conf-dir")
                .arg(dir)
                .arg("--cni-bin-dir")
                .arg(&d.bin)
                .arg("--state-dir")
                .arg(&d.state)
                .args(dry.then_some("--dry-run"))
                .output()
                .unwrap();
            let (code, out, err) = text(&out);
            assert_eq!(code, Some(1), "dry run {dry}: {out}\n{err}");
            for want in [
                format!("--cni-conf-dir {} {problem}", dir.display()),
                "nothing was removed".to_string(),
                "/var/lib/rancher/k3s/agent/etc/cni/net.d".to_string(),
                // The agent's marker knows where the config really is.
                format!("try --cni-conf-dir {}", d.conf.display()),
            ] {
                assert!(err.contains(&want), "{want:?} missing from: {err}");
            }
            assert!(out.is_empty(), "{out}");
        }
    }
    let after = tree(d.tmp.path());
    assert_eq!(after, before_empty, "something was removed");
    assert!(before.keys().all(|k| after.contains_key(k)));
    assert!(plugin_bin(&d).exists() && marker(&d).exists());
}

/// A config interlock's plan cannot edit (its name is not UTF-8, which a runtime loads all
/// the same) still names interlock-cni: the binary stays, the run says which file and
/// exits 1; once that file is fixed the binary goes. `--force` removes it anyway.
#[test]
fn the_binary_stays_while_a_config_still_names_it() {
    let d = Dirs::new();
    let owned = stopped_agent(&d);
    let copy = std::ffi::OsStr::from_bytes(b"20-copy\xff.conflist");
    std::fs::write(d.conf.join(copy), d.read(&owned).unwrap()).unwrap();

    let (code, out, err) = run(&d, &["--dry-run"]);
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(
        out.contains(&format!("would keep {}: 20-copy", plugin_bin(&d).display())),
        "{out}"
    );
    assert!(out.contains("still names interlock-cni"), "{out}");
    assert!(err.contains("a real run would not be complete"), "{err}");
    assert!(d.read(&owned).is_some() && plugin_bin(&d).exists());

    let (code, out, err) = run(&d, &[]);
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(out.contains(&format!("removed {owned} in")), "{out}");
    assert!(
        out.contains(&format!("kept {}: 20-copy", plugin_bin(&d).display())),
        "{out}"
    );
    assert!(
        err.contains("not complete") && err.contains("20-copy"),
        "{err}"
    );
    assert!(
        plugin_bin(&d).exists(),
        "the binary went while a config names it"
    );
    assert!(d.conf.join(copy).exists());
    assert!(!marker(&d).exists());

    // The operator fixes the file; the binary goes on the next run.
    std::fs::remove_file(d.conf.join(copy)).unwrap();
    let (code, out, err) = run(&d, &[]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(!plugin_bin(&d).exists(), "{out}");

    // --force removes it although the file still names it, and says so.
    std::fs::write(d.conf.join(copy), b"{\"cniVersion\":\"1.0.0\",\"name\":\"x\",\"plugins\":[{\"type\":\"bridge\"},{\"type\":\"interlock-cni\"}]}").unwrap();
    std::fs::copy(plugin(), plugin_bin(&d)).unwrap();
    let (code, out, err) = run(&d, &["--force"]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("removed on --force although 20-copy"), "{out}");
    assert!(!plugin_bin(&d).exists());
}

/// CRI-O tears a pod down with the config it was set up with: while attachment records
/// say pods were set up through interlock-cni, the binary stays on a CRI-O node (the
/// runtime from --runtime, else from the agent's marker); containerd does not need it.
#[test]
fn on_crio_the_binary_stays_while_pods_set_up_through_it_remain() {
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    std::fs::copy(plugin(), plugin_bin(&d)).unwrap();
    let att = d.state.join("attachments");
    std::fs::create_dir_all(&att).unwrap();
    std::fs::write(att.join("c0ffee+eth0.json"), "{}").unwrap();
    // A stopped agent's marker, long stale, naming CRI-O.
    std::fs::write(
        marker(&d),
        r#"{"ready":false,"reason":"stopped","updatedAtMs":1,"staleAfterMs":3000,"pid":0,"configPath":"","runtime":"CRI-O"}"#,
    )
    .unwrap();
    let (code, out, err) = run(&d, &["--dry-run"]);
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(out.contains("set up through it on CRI-O"), "{out}");

    let (code, out, err) = run(&d, &[]);
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(plugin_bin(&d).exists(), "{out}");
    assert!(out.contains("--runtime crio"), "{out}");
    assert!(!marker(&d).exists());
    // Without the marker, --runtime says it.
    let (code, out, _) = run(&d, &["--runtime", "crio"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(plugin_bin(&d).exists());
    let (code, out, err) = run(&d, &["--runtime", "containerd"]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(!plugin_bin(&d).exists());
    assert!(att.join("c0ffee+eth0.json").exists());
}

fn cluster(d: &Dirs, args: &[&str]) -> (Option<i32>, String, String) {
    text(
        &std::process::Command::new(interlock())
            .args(["uninstall", "--cluster"])
            .args(args)
            .env("KUBECONFIG", d.tmp.path().join("kubeconfig"))
            .env_remove("KUBERNETES_SERVICE_HOST")
            .output()
            .unwrap(),
    )
}

fn conditions(api: &KubeApi, node: &str) -> Vec<String> {
    api.get_object("nodes", "", node).unwrap()["status"]["conditions"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|c| c["type"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

fn taints(api: &KubeApi, node: &str) -> Vec<String> {
    api.get_object("nodes", "", node).unwrap()["spec"]["taints"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|t| t["key"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

fn labels(api: &KubeApi, ns: &str, name: &str) -> Value {
    api.get_object("pods", ns, name).unwrap()["metadata"]["labels"].clone()
}

#[test]
fn cluster_uninstall_removes_the_condition_and_the_labels() {
    let api = KubeApi::start().unwrap();
    let d = Dirs::new();
    api.write_kubeconfig(&d.tmp.path().join("kubeconfig"))
        .unwrap();
    let ready = json!({"type": "Ready", "status": "True"});
    api.put_object(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
        "spec": {"taints": [{"key": TAINT_NOT_READY, "effect": "NoSchedule"}, {"key": "gpu", "effect": "NoSchedule"}]},
        "status": {"conditions": [ready, {"type": CONDITION_READY, "status": "False", "reason": "ConfigNotEffective"}]}}));
    api.put_object(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2"},
        "spec": {}, "status": {"conditions": [{"type": CONDITION_READY, "status": "True", "reason": "ConfigEffective"}, ready]}}));
    api.put_object(
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n3"},
        "spec": {}, "status": {"conditions": [ready]}}),
    );
    let pod = |ns: &str, name: &str, node: &str, labels: Value| {
        api.put_object(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
            "status": {"phase": "Running"}}));
    };
    pod(
        "shop",
        "web",
        "n1",
        json!({"app": "web", LABEL_UNPROTECTED: "true"}),
    );
    pod("shop", "cart", "n2", json!({"app": "cart"}));
    pod(
        "interlock-system",
        "interlock-node-n1",
        "n1",
        json!({"app.kubernetes.io/name": "interlock"}),
    );
    let rv = api.resource_version();

    // The DaemonSet's agents still run: refused, nothing written.
    let (code, out, err) = cluster(&d, &[]);
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(
        err.contains("refusing") && err.contains("interlock-node-n1 on n1"),
        "{err}"
    );
    let (code, out, err) = cluster(&d, &["--dry-run"]);
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(err.contains("a real run would refuse"), "{err}");
    for want in [
        format!("would remove condition {CONDITION_READY} of node n1 (the agent's: False, ConfigNotEffective)"),
        format!("would remove condition {CONDITION_READY} of node n2"),
        format!("would remove label {LABEL_UNPROTECTED}=true of pod shop/web"),
        format!("would keep taint {TAINT_NOT_READY}:NoSchedule of node n1: "),
        "--remove-taint".to_string(),
        "Node pools that register their nodes with the startup taint".to_string(),
    ] {
        assert!(out.contains(&want), "{want:?} missing from:\n{out}");
    }
    assert!(!out.contains("node n3"), "{out}");
    assert!(!out.contains("shop/cart"), "{out}");
    assert_eq!(api.resource_version(), rv, "a refused or dry run wrote");

    // The DaemonSet is gone.
    api.delete_object("pods", "interlock-system", "interlock-node-n1");
    let (code, out, err) = cluster(&d, &["--dry-run"]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    let (code, out, err) = cluster(&d, &[]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    for want in [
        format!("removed condition {CONDITION_READY} of node n1"),
        format!("removed condition {CONDITION_READY} of node n2"),
        format!("removed label {LABEL_UNPROTECTED}=true of pod shop/web"),
        format!("kept taint {TAINT_NOT_READY}:NoSchedule of node n1"),
    ] {
        assert!(out.contains(&want), "{want:?} missing from:\n{out}");
    }
    assert_eq!(conditions(&api, "n1"), ["Ready"]);
    assert_eq!(conditions(&api, "n2"), ["Ready"]);
    assert_eq!(conditions(&api, "n3"), ["Ready"]);
    assert_eq!(labels(&api, "shop", "web"), json!({"app": "web"}));
    assert_eq!(labels(&api, "shop", "cart"), json!({"app": "cart"}));
    assert_eq!(taints(&api, "n1"), [TAINT_NOT_READY, "gpu"]);

    // The taint only with --remove-taint; the other taints stay, including one another
    // component adds between our read and our write (the write conflicts and is redone).
    let mut n1 = api.get_object("nodes", "", "n1").unwrap();
    n1["spec"]["taints"]
        .as_array_mut()
        .unwrap()
        .push(json!({"key": "spot", "effect": "NoSchedule"}));
    api.put_before_next("PATCH", "/nodes/n1", n1);
    let (code, out, err) = cluster(&d, &["--remove-taint"]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(
        out.contains(&format!(
            "removed taint {TAINT_NOT_READY}:NoSchedule of node n1"
        )),
        "{out}"
    );
    assert_eq!(taints(&api, "n1"), ["gpu", "spot"]);
    // Nothing left: a second run says so.
    let (code, out, _) = cluster(&d, &["--remove-taint"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("no node carries"), "{out}");

    // --remove-taint belongs to --cluster.
    let (code, _, err) = run(&d, &["--remove-taint"]);
    assert_eq!(code, Some(64), "{err}");
}

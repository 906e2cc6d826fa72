//! `interlock agent --uninstall-on-exit`, as a process against the fake Kubernetes API:
//! `false` and `true` as before, and `when-deleted`, which on SIGTERM asks the API whether
//! the agent's DaemonSet is going away. The DaemonSet present (a rollout, a pod deletion, a
//! drain): the config and the binary stay. Gone (404), being deleted (`deletionTimestamp`)
//! or re-created (another UID): uninstalled. The API unable to tell: kept, with a warning
//! that says why. A rollout in that mode never takes the config away, watched with
//! inotify, against `true`, which does (and is measured).

use crate::common;

use common::*;
use interlock_testkit_node::kubeapi::{FailRule, KubeApi};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const NS: &str = "interlock-system";
const DS: &str = "interlock-node";

fn daemonset() -> Value {
    json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
           "metadata": {"name": DS, "namespace": NS},
           "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": "interlock"}},
                    "template": {"metadata": {"labels": {"app.kubernetes.io/name": "interlock"}},
                                 "spec": {"containers": [{"name": "agent", "image": "i"}]}}}})
}

/// A fake API with node n1, the agent's DaemonSet, and its pods `pods` on n1.
struct Cluster {
    api: KubeApi,
    kubeconfig: PathBuf,
}

impl Cluster {
    fn new(d: &Dirs, pods: &[&str]) -> Cluster {
        let api = KubeApi::start().unwrap();
        api.put_object(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}));
        let ds = api.put_object(daemonset());
        for p in pods {
            api.put_object(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": p, "namespace": NS,
                             "labels": {"app.kubernetes.io/name": "interlock"},
                             "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                                  "name": DS, "uid": ds["metadata"]["uid"],
                                                  "controller": true, "blockOwnerDeletion": true}]},
                "spec": {"nodeName": "n1", "hostNetwork": true,
                         "containers": [{"name": "agent", "image": "i"}]},
                "status": {"phase": "Running"}}));
        }
        let kubeconfig = d.tmp.path().join("kubeconfig");
        api.write_kubeconfig(&kubeconfig).unwrap();
        Cluster { api, kubeconfig }
    }

    /// An agent in pod `pod` with uninstall-on-exit `mode`, its pod given as the
    /// DaemonSet gives it (POD_NAME, POD_NAMESPACE) and the mode as the ConfigMap does.
    fn agent(&self, d: &Dirs, pod: &str, mode: &str) -> Agent {
        let a = Agent::start_env(
            d,
            &["--kube=auto", "--node-name", "n1"],
            &[
                ("KUBECONFIG", self.kubeconfig.to_str().unwrap()),
                ("POD_NAME", pod),
                ("POD_NAMESPACE", NS),
                ("INTERLOCK_UNINSTALL_ON_EXIT", mode),
            ],
        );
        wait_protected(d, &a);
        a
    }
}

fn installed(d: &Dirs) -> bool {
    d.names() == ["00-interlock.conflist", "10-calico.conflist"]
        && d.bin.join("interlock-cni").exists()
}

fn uninstalled(d: &Dirs) -> bool {
    d.names() == ["10-calico.conflist"]
        && d.read("10-calico.conflist").unwrap() == CALICO.as_bytes()
        && !d.bin.join("interlock-cni").exists()
}

/// A node whose `when-deleted` agent (pod `interlock-node-a`) is stopped with SIGTERM
/// after `change` to the cluster: the dirs, the cluster, and the agent's log.
fn stopped_after(change: impl FnOnce(&Cluster)) -> (Dirs, Cluster, String) {
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    let c = Cluster::new(&d, &["interlock-node-a"]);
    let a = c.agent(&d, "interlock-node-a", "when-deleted");
    change(&c);
    let log = a.log.clone();
    assert!(a.terminate().success());
    let log = std::fs::read_to_string(log).unwrap();
    (d, c, log)
}

/// `when-deleted`, the DaemonSet present: SIGTERM keeps the config and the binary, and
/// the log says why; the agent asked for its pod and its DaemonSet, nothing more.
#[test]
fn when_deleted_keeps_everything_while_the_daemonset_stays() {
    let (d, c, log) = stopped_after(|c| c.api.clear_requests());
    assert!(installed(&d), "{:?}\n{log}", d.names());
    assert!(
        log.contains(&format!("DaemonSet {NS}/{DS}"))
            && log.contains("stays (a rollout, a pod deletion or a node drain)")
            && log.contains("stay in place (uninstall-on-exit=when-deleted)"),
        "{log}"
    );
    assert!(!log.contains("cannot tell whether"), "{log}");
    let reads: Vec<String> = c
        .api
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && !r.is_watch())
        .map(|r| r.path.clone())
        .collect();
    for want in [
        format!("/api/v1/namespaces/{NS}/pods/interlock-node-a"),
        format!("/apis/apps/v1/namespaces/{NS}/daemonsets/{DS}"),
    ] {
        assert!(reads.contains(&want), "{want} not read: {reads:?}");
    }
}

/// `when-deleted`: the DaemonSet gone (404, as after `kubectl delete ds`, whose
/// background propagation removes it before its pods), being deleted (foreground:
/// `deletionTimestamp` and the `foregroundDeletion` finalizer), or re-created under the
/// same name (another UID): SIGTERM uninstalls, and the log says which.
#[test]
fn when_deleted_uninstalls_once_the_daemonset_goes_away() {
    type Change = fn(&KubeApi);
    let cases: [(&str, Change, &str); 3] = [
        (
            "deleted",
            |api| {
                api.delete_object("daemonsets", NS, DS).unwrap();
            },
            "is gone from the API",
        ),
        (
            "being deleted",
            |api| {
                let mut ds = api.get_object("daemonsets", NS, DS).unwrap();
                ds["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
                ds["metadata"]["finalizers"] = json!(["foregroundDeletion"]);
                api.put_object(ds);
            },
            "is being deleted (since 2026-01-01",
        ),
        (
            "re-created",
            |api| {
                api.delete_object("daemonsets", NS, DS).unwrap();
                api.put_object(daemonset());
            },
            "the DaemonSet of that name now is another one",
        ),
    ];
    for (case, change, why) in cases {
        let (d, _, log) = stopped_after(|c| change(&c.api));
        assert!(uninstalled(&d), "{case}: {:?}\n{log}", d.names());
        assert!(
            log.contains(why) && log.contains("removing interlock's CNI config"),
            "{case}: {log}"
        );
        assert!(log.contains("uninstalled: removed"), "{case}: {log}");
    }
}

/// `when-deleted` when the API cannot tell: a 403 on the DaemonSet, the API down, no pod
/// name. Everything stays (a config left behind keeps pods protected), and a warning
/// says why.
#[test]
fn when_deleted_keeps_everything_when_the_api_cannot_tell() {
    type Change = fn(&KubeApi);
    let cases: [(&str, Change, &str); 2] = [
        (
            "forbidden",
            |api| {
                api.fail_next_matching(FailRule {
                    remaining: 1,
                    code: 403,
                    method: Some("GET".into()),
                    path_contains: Some("/daemonsets/".into()),
                })
            },
            "forbidden",
        ),
        ("API down", |api| api.stop(), "reading this agent's pod"),
    ];
    for (case, change, why) in cases {
        let (d, _, log) = stopped_after(|c| change(&c.api));
        assert!(installed(&d), "{case}: {:?}\n{log}", d.names());
        let warn = log
            .lines()
            .find(|l| l.contains("WARN") && l.contains("cannot tell whether"))
            .unwrap_or_else(|| panic!("{case}: no warning:\n{log}"));
        assert!(
            warn.contains(why) && warn.contains("fail closed") && warn.contains("protected"),
            "{case}: {warn}"
        );
    }

    // No pod name: said at start, and again at exit; nothing removed.
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    let c = Cluster::new(&d, &[]);
    let a = Agent::start_env(
        &d,
        &[
            "--kube=auto",
            "--node-name",
            "n1",
            "--uninstall-on-exit",
            "when-deleted",
        ],
        &[("KUBECONFIG", c.kubeconfig.to_str().unwrap())],
    );
    wait_protected(&d, &a);
    assert!(a.log_text().contains("POD_NAME"), "{}", a.log_text());
    let log = a.log.clone();
    assert!(a.terminate().success());
    let log = std::fs::read_to_string(log).unwrap();
    assert!(installed(&d), "{:?}\n{log}", d.names());
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("WARN") && l.contains("POD_NAME"))
            .count(),
        2,
        "{log}"
    );
}

/// The setting's values: `true` (flag alone or the variable) and `false` as before, and
/// an unknown value refused with the ones it takes.
#[test]
fn uninstall_on_exit_takes_false_true_and_when_deleted() {
    for (flags, env, removed) in [
        (&[][..], Some("true"), true),
        (&[][..], Some("false"), false),
        (&["--uninstall-on-exit"][..], None, true),
        (&["--uninstall-on-exit=false"][..], Some("true"), false),
        (&[][..], None, false),
    ] {
        let d = Dirs::new();
        d.write("10-calico.conflist", CALICO);
        let env: Vec<(&str, &str)> = env
            .map(|v| ("INTERLOCK_UNINSTALL_ON_EXIT", v))
            .into_iter()
            .collect();
        let a = Agent::start_env(&d, flags, &env);
        wait_protected(&d, &a);
        assert!(a.terminate().success());
        assert_eq!(
            uninstalled(&d),
            removed,
            "{flags:?} {env:?}: {:?}",
            d.names()
        );
        assert_eq!(
            installed(&d),
            !removed,
            "{flags:?} {env:?}: {:?}",
            d.names()
        );
    }
    let d = Dirs::new();
    let out = d
        .interlock("agent")
        .args(["--kube=none", "--uninstall-on-exit=always"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "a usage error");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("false, true or when-deleted"), "{err}");
    assert_eq!(d.names(), Vec::<String>::new());
}

/// One inotify event: when it was read, the directory (`conf` or `bin`), the name, what.
type Seen = (Instant, &'static str, String, inotify::EventMask);

/// What inotify saw in the conf dir and the bin dir, with when.
struct Recorder {
    events: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Recorder {
    fn start(d: &Dirs) -> Recorder {
        use inotify::{Inotify, WatchMask};
        let mut ino = Inotify::init().unwrap();
        let gone =
            WatchMask::DELETE | WatchMask::MOVED_FROM | WatchMask::MOVED_TO | WatchMask::CREATE;
        let conf = ino.watches().add(&d.conf, gone).unwrap();
        ino.watches().add(&d.bin, gone).unwrap();
        let events = Arc::new(Mutex::new(vec![]));
        let stop = Arc::new(AtomicBool::new(false));
        let (ev, st) = (events.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 16384];
            loop {
                // Drained once more after the stop: nothing queued is lost.
                let last = st.load(Ordering::SeqCst);
                while let Ok(batch) = ino.read_events(&mut buf) {
                    let now = Instant::now();
                    let mut got = false;
                    for e in batch {
                        got = true;
                        let dir = if e.wd == conf { "conf" } else { "bin" };
                        let name = e
                            .name
                            .map(|n| n.to_string_lossy().into_owned())
                            .unwrap_or_default();
                        ev.lock().unwrap().push((now, dir, name, e.mask));
                    }
                    if !got {
                        break;
                    }
                }
                if last {
                    return;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        Recorder {
            events,
            stop,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> Vec<Seen> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().unwrap().join().unwrap();
        let mut out = vec![];
        out.append(&mut self.events.lock().unwrap());
        out
    }
}

/// One rollout on a node as the DaemonSet controller does it (maxSurge 0): SIGTERM to
/// the old agent, its exit, a gap with no agent, the new agent in a new pod until ready.
/// Returns when interlock's config and binary were gone (removed → back), per inotify.
fn rollout(mode: &str) -> (Vec<(Duration, String)>, Dirs) {
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    let c = Cluster::new(&d, &["interlock-node-old", "interlock-node-new"]);
    let old = c.agent(&d, "interlock-node-old", mode);
    let rec = Recorder::start(&d);
    assert!(old.terminate().success());
    // The kubelet starts the next pod; pods that start meanwhile run the config in place.
    std::thread::sleep(Duration::from_millis(500));
    let between = d.effective_with_us();
    let new = c.agent(&d, "interlock-node-new", mode);
    let events = rec.finish();
    assert!(new.ready() == Some(true));
    drop(new);
    let watched = ["00-interlock.conflist", "interlock-cni"];
    let mut windows = vec![];
    for name in watched {
        let mut gone_at: Option<Instant> = None;
        for (at, _, n, mask) in &events {
            if n != name {
                continue;
            }
            let removed =
                mask.intersects(inotify::EventMask::DELETE | inotify::EventMask::MOVED_FROM);
            let back = mask.intersects(inotify::EventMask::CREATE | inotify::EventMask::MOVED_TO);
            match (gone_at, removed, back) {
                (None, true, _) => gone_at = Some(*at),
                (Some(g), _, true) => {
                    windows.push((at.duration_since(g), name.to_string()));
                    gone_at = None;
                }
                _ => {}
            }
        }
        if gone_at.is_some() {
            windows.push((Duration::MAX, name.to_string()));
        }
    }
    // In `when-deleted`, checked directly too: between the agents, the runtime would load
    // interlock.
    if mode == "when-deleted" {
        assert_eq!(
            between.as_deref(),
            Some("00-interlock.conflist"),
            "between the agents: {:?}",
            d.names()
        );
    }
    (windows, d)
}

/// The rolling-update window in `when-deleted` mode is zero: through a whole rollout,
/// interlock's config and binary are never removed (not for an instant: inotify sees
/// every removal). With `true`, the same rollout removes both and puts them back: the
/// window the mode closes, measured.
#[test]
fn a_rollout_in_when_deleted_mode_never_removes_the_config() {
    let (windows, d) = rollout("when-deleted");
    assert!(
        windows.is_empty(),
        "when-deleted: removed during the rollout: {windows:?}"
    );
    assert_eq!(
        d.effective_with_us().as_deref(),
        Some("00-interlock.conflist")
    );

    let (windows, _) = rollout("true");
    let config = windows
        .iter()
        .find(|(_, n)| n == "00-interlock.conflist")
        .unwrap_or_else(|| panic!("true: the rollout left the config alone: {windows:?}"));
    assert!(config.0 < Duration::MAX, "true: never put back");
    eprintln!(
        "rolling-update window: when-deleted 0 (no removal); true: {:?} without interlock's config",
        config.0
    );
}

/// Step 3 of docs/operate.md's removal, with kubectl itself against the fake API:
/// `kubectl delete ds` (background: the DaemonSet is gone at once) and `--cascade=foreground`
/// (it stays with `deletionTimestamp` until the garbage collector, which the fake does not
/// run, has deleted the pods). The agent, stopped as the collector stops it, uninstalls.
#[test]
fn the_documented_kubectl_deletions_make_the_agent_uninstall() {
    if std::process::Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_err()
    {
        assert!(
            std::env::var_os("CI").is_none(),
            "kubectl is missing: run `make deps`"
        );
        eprintln!("skipped: no kubectl");
        return;
    }
    for (cascade, held, why) in [
        (None, false, "is gone from the API"),
        (Some("--cascade=foreground"), true, "is being deleted"),
    ] {
        let (d, _, log) = stopped_after(|c| {
            let out = std::process::Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(&c.kubeconfig)
                .args(["-n", NS, "delete", "ds/interlock-node", "--wait=false"])
                .args(cascade)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "kubectl {cascade:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let ds = c.api.get_object("daemonsets", NS, DS);
            assert_eq!(ds.is_some(), held, "{cascade:?}: {ds:?}");
            if let Some(ds) = ds {
                assert!(ds["metadata"]["deletionTimestamp"].is_string(), "{ds}");
                assert_eq!(ds["metadata"]["finalizers"], json!(["foregroundDeletion"]));
            }
        });
        assert!(uninstalled(&d), "{cascade:?}: {:?}\n{log}", d.names());
        assert!(log.contains(why), "{cascade:?}: {log}");
    }
}

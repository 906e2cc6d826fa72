//! `interlock agent --config-mode guard` as a process against throwaway dirs, with each
//! mesh's installer played by test code that writes files the way that installer does
//! (research/guard-mode.md A.1.2, A.2.2, A.4.2) and a stand-in for the mesh's plugin
//! binary that answers VERSION. Every wait is for an event, with a generous deadline.

use crate::common::*;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const GUARD_FILE: &str = "00-interlock.conflist";
const PRIMARY: &str = "10-calico.conflist";
const WAIT: Duration = Duration::from_secs(30);

fn guard_args(mesh: &str) -> Vec<String> {
    vec![
        "--config-mode".into(),
        "guard".into(),
        "--guard-mesh".into(),
        mesh.into(),
    ]
}

fn start(d: &Dirs, mesh: &str) -> Agent {
    let args = guard_args(mesh);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    d.agent(&refs)
}

/// Installs a stand-in for the mesh's plugin binary that answers VERSION like the real
/// ones (cni v1.3.0 skel: 0.1.0 to 1.1.0), atomically.
fn install_binary(d: &Dirs, plugin: &str) {
    let script = "#!/bin/sh\ncase \"$CNI_COMMAND\" in\nVERSION) echo '{\"cniVersion\":\"1.1.0\",\"supportedVersions\":[\"0.1.0\",\"0.2.0\",\"0.3.0\",\"0.3.1\",\"0.4.0\",\"1.0.0\",\"1.1.0\"]}';;\n*) echo '{\"code\":50,\"msg\":\"stand-in\"}'; exit 1;;\nesac\n";
    let tmp = d.bin.join(format!(".{plugin}.tmp"));
    std::fs::write(&tmp, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::rename(&tmp, d.bin.join(plugin)).unwrap();
}

/// What a Go installer writes: the file through a map (keys sorted), compact.
fn go_json(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let sorted: BTreeMap<&String, Value> = m.iter().map(|(k, v)| (k, go_json(v))).collect();
            Value::Object(sorted.into_iter().map(|(k, v)| (k.clone(), v)).collect())
        }
        Value::Array(a) => Value::Array(a.iter().map(go_json).collect()),
        other => other.clone(),
    }
}

fn parse(s: &[u8]) -> Option<Map<String, Value>> {
    serde_json::from_slice::<Value>(s)
        .ok()?
        .as_object()
        .cloned()
}

/// `content` with T removed and `t` appended (all four installers do that), Go-style.
fn inject(content: &[u8], t: &Map<String, Value>) -> Option<Vec<u8>> {
    let mut list = parse(content)?;
    let ty = t["type"].clone();
    let ps = list.get_mut("plugins")?.as_array_mut()?;
    ps.retain(|p| p["type"] != ty);
    ps.push(Value::Object(t.clone()));
    Some(serde_json::to_vec(&go_json(&Value::Object(list))).unwrap())
}

/// `content` without T, or `None` when it had none.
fn without(content: &[u8], ty: &str) -> Option<Vec<u8>> {
    let mut list = parse(content)?;
    let ps = list.get_mut("plugins")?.as_array_mut()?;
    let n = ps.len();
    ps.retain(|p| p["type"] != ty);
    (ps.len() != n).then(|| serde_json::to_vec(&go_json(&Value::Object(list))).unwrap())
}

/// Atomic write, as Istio, Linkerd (install) and Kuma do.
fn put(dir: &Path, name: &str, data: &[u8]) {
    let tmp = dir.join(format!("{name}.install"));
    std::fs::write(&tmp, data).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

fn types(d: &Dirs, name: &str) -> Vec<String> {
    d.read(name)
        .and_then(|b| parse(&b))
        .map(|l| plugin_types(&Value::Object(l)))
        .unwrap_or_default()
}

fn guard_metric(a: &Agent, state: &str) -> Option<f64> {
    a.metric(&format!("interlock_guard_state{{state=\"{state}\"}}"))
}

/// The guard file runs the primary, interlock-cni in its guard role, then exactly `t`.
fn wait_guarding(d: &Dirs, a: &Agent, t: &Map<String, Value>) {
    let ty = t["type"].as_str().unwrap().to_string();
    wait_until(
        WAIT,
        || {
            a.ready() == Some(true)
                && guard_metric(a, "guard") == Some(1.0)
                && types(d, GUARD_FILE) == ["bridge", "portmap", "interlock-cni", ty.as_str()]
        },
        || {
            format!(
                "not guarding: {:?} {:?}\n{}\nlog:\n{}",
                d.names(),
                d.read(GUARD_FILE)
                    .map(|b| String::from_utf8_lossy(&b).into_owned()),
                d.effective().summary,
                a.log_text()
            )
        },
    );
    let g = d.json(GUARD_FILE);
    assert_eq!(g["plugins"][3], Value::Object(t.clone()), "T changed");
    assert_eq!(g["plugins"][2]["guard"]["hold"], json!(false));
    let e = d.effective();
    assert_eq!(
        e.chosen
            .unwrap()
            .path
            .file_name()
            .unwrap()
            .to_string_lossy(),
        GUARD_FILE
    );
}

/// Hold: T out of the guard file, interlock-cni refusing meshed pods with the reason, the
/// node not ready (marker included).
fn wait_holding(d: &Dirs, a: &Agent, ty: &str, why: &str) {
    wait_until(
        WAIT,
        || {
            a.ready() == Some(false)
                && guard_metric(a, "hold") == Some(1.0)
                && types(d, GUARD_FILE) == ["bridge", "portmap", "interlock-cni"]
                && d.json(GUARD_FILE)["plugins"][2]["guard"]["hold"] == json!(true)
                && d.json(GUARD_FILE)["plugins"][2]["guard"]["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains(why))
                && a.get("/readyz")
                    .is_some_and(|(_, body)| body.contains("meshed pods are held"))
        },
        || {
            format!(
                "not holding: {:?}\nlog:\n{}",
                d.read(GUARD_FILE)
                    .map(|b| String::from_utf8_lossy(&b).into_owned()),
                a.log_text()
            )
        },
    );
    let g = d.json(GUARD_FILE);
    let role = &g["plugins"][2]["guard"];
    assert_eq!(role["hold"], json!(true), "{g:#}");
    let reason = role["reason"].as_str().unwrap();
    assert!(
        reason.contains(ty) && reason.contains(why),
        "{reason}\nlog:\n{}",
        a.log_text()
    );
    let (_, body) = a.get("/readyz").unwrap();
    assert!(body.contains("meshed pods are held"), "{body}");
    let marker: Value =
        serde_json::from_slice(&std::fs::read(d.state.join("agent-ready.json")).unwrap()).unwrap();
    assert_eq!(marker["ready"], json!(false), "{marker:#}");
}

/// The first file libcni would load (sorted names, a list with plugins).
fn first_valid(d: &Dirs) -> Option<String> {
    d.names()
        .into_iter()
        .filter(|n| n.ends_with(".conflist"))
        .find(|n| {
            d.read(n)
                .and_then(|b| parse(&b))
                .is_some_and(|l| l.get("plugins").is_some())
        })
}

/// istio-cni's installer (A.1.2): binary and kubeconfig first, then its entry appended to
/// the first valid file at its start, which stays its target.
struct IstioInstaller {
    t: Map<String, Value>,
    run_dir: PathBuf,
    target: Option<String>,
}

impl IstioInstaller {
    fn new(d: &Dirs) -> IstioInstaller {
        let run_dir = d.tmp.path().join("istio-run");
        // Keys unsorted on purpose: the installer writes them sorted, and the agent must
        // keep whatever it finds verbatim.
        let t = json!({"type": "istio-cni", "name": "istio-cni", "plugin_log_level": "info",
            "cni_agent_run_dir": run_dir.display().to_string(),
            "exclude_namespaces": ["kube-system"], "native_nftables": false});
        IstioInstaller {
            t: go_json(&t).as_object().cloned().unwrap(),
            run_dir,
            target: None,
        }
    }

    fn start(&mut self, d: &Dirs) {
        install_binary(d, "istio-cni");
        std::fs::create_dir_all(&self.run_dir).unwrap();
        put(&self.run_dir, "istio-cni-kubeconfig", b"apiVersion: v1\n");
        let target = first_valid(d).expect("a valid config to chain into");
        let c = d.read(&target).unwrap();
        put(&d.conf, &target, &inject(&c, &self.t).unwrap());
        self.target = Some(target);
    }

    /// SIGTERM cleanup, first step: its entry out of its target.
    fn remove_entry(&mut self, d: &Dirs) {
        if let Some(tg) = self.target.take() {
            if let Some(new) = d.read(&tg).and_then(|c| without(&c, "istio-cni")) {
                put(&d.conf, &tg, &new);
            }
        }
    }

    /// SIGTERM cleanup, the rest: kubeconfig and binary removed.
    fn remove_files(&mut self, d: &Dirs) {
        let _ = std::fs::remove_file(self.run_dir.join("istio-cni-kubeconfig"));
        let _ = std::fs::remove_file(d.bin.join("istio-cni"));
    }
}

#[test]
fn istio_first_then_primary_guards_holds_on_cleanup_and_guards_again() {
    let d = Dirs::new();
    let a = start(&d, "istio");
    wait_until(
        WAIT,
        || types(&d, GUARD_FILE) == ["interlock-cni"],
        || format!("no holding config: {:?}\n{}", d.names(), a.log_text()),
    );
    assert_eq!(a.ready(), Some(false));
    // The mesh first: its installer picks the holding config, the only valid file.
    let mut istio = IstioInstaller::new(&d);
    istio.start(&d);
    assert_eq!(istio.target.as_deref(), Some(GUARD_FILE));
    wait_until(
        WAIT,
        || a.log_text().contains("learnt the istio-cni entry"),
        || a.log_text(),
    );
    // Accepted, never stripped: still the holding config plus T.
    assert_eq!(types(&d, GUARD_FILE), ["interlock-cni", "istio-cni"]);
    assert_eq!(guard_metric(&a, "no-primary"), Some(1.0));
    // Then the primary.
    d.write(PRIMARY, CALICO);
    wait_guarding(&d, &a, &istio.t);
    // T persisted verbatim, key order included.
    let kept: Value =
        serde_json::from_slice(&std::fs::read(d.state.join("guard-entry.json")).unwrap()).unwrap();
    assert_eq!(
        serde_json::to_string(&kept["entry"]).unwrap(),
        serde_json::to_string(&istio.t).unwrap()
    );
    // The primary rewrites its file: followed, T kept, still ready.
    d.write(PRIMARY, &CALICO.replace("1440", "1450"));
    wait_until(
        WAIT,
        || d.json(GUARD_FILE)["plugins"][0]["mtu"] == json!(1450),
        || a.log_text(),
    );
    wait_guarding(&d, &a, &istio.t);
    assert!(
        a.metric("interlock_guard_mesh_writes_total{file=\"00-interlock.conflist\"}")
            .is_some_and(|n| n >= 1.0),
        "the installer's write to the guard file was not counted"
    );
    assert_eq!(
        a.metric("interlock_config_conflicts_total{file=\"00-interlock.conflist\"}"),
        None,
        "the installer's write counted as a conflict"
    );
    // SIGTERM cleanup: the entry leaves the guard file: hold within the deadline, T
    // forgotten (not put back, not kept for a restart).
    istio.remove_entry(&d);
    wait_holding(&d, &a, "istio-cni", "removed from the guard file");
    assert!(!d.state.join("guard-entry.json").exists());
    // Then its kubeconfig and binary go; still holding.
    istio.remove_files(&d);
    std::thread::sleep(Duration::from_millis(300));
    wait_holding(&d, &a, "istio-cni", "removed from the guard file");
    // A new installer process: the first valid file is the guard file again.
    istio.start(&d);
    assert_eq!(istio.target.as_deref(), Some(GUARD_FILE));
    wait_guarding(&d, &a, &istio.t);
    assert_eq!(
        a.metric("interlock_errors_total"),
        Some(0.0),
        "{}",
        a.log_text()
    );
}

#[test]
fn istio_binary_removed_alone_holds_then_guards_when_back() {
    let d = Dirs::new();
    d.write(PRIMARY, CALICO);
    // Istio started before interlock: its sticky target is the primary's file.
    let mut istio = IstioInstaller::new(&d);
    istio.start(&d);
    assert_eq!(istio.target.as_deref(), Some(PRIMARY));
    let a = start(&d, "istio");
    wait_guarding(&d, &a, &istio.t);
    // The primary rewrites its file, dropping T: the guard file keeps T, still ready.
    d.write(PRIMARY, CALICO);
    std::thread::sleep(Duration::from_millis(300));
    wait_guarding(&d, &a, &istio.t);
    // The kubeconfig vanishes (installer restarting): hold, T kept in memory.
    std::fs::remove_file(istio.run_dir.join("istio-cni-kubeconfig")).unwrap();
    // The run dir is not watched: the next event or resync notices. An event:
    d.write(PRIMARY, &CALICO.replace("1440", "1460"));
    wait_holding(&d, &a, "istio-cni", "istio-cni-kubeconfig");
    assert!(d.state.join("guard-entry.json").exists());
    put(&istio.run_dir, "istio-cni-kubeconfig", b"apiVersion: v1\n");
    d.write(PRIMARY, CALICO);
    wait_guarding(&d, &a, &istio.t);
    // The binary goes: the bin dir is watched, hold at once.
    std::fs::remove_file(d.bin.join("istio-cni")).unwrap();
    wait_holding(&d, &a, "istio-cni", "binary missing");
    install_binary(&d, "istio-cni");
    wait_guarding(&d, &a, &istio.t);
}

/// linkerd-cni's installer (A.2.2) as a thread reacting to the conf dir: every
/// `.conflist` whose content differs from what it last wrote gets its entry appended
/// (temp file and rename); SIGTERM reverts every file (in place) and removes binary and
/// kubeconfig.
fn linkerd_entry(d: &Dirs) -> Map<String, Value> {
    let t = json!({"type": "linkerd-cni", "name": "linkerd-cni", "log_level": "info",
        "kubernetes": {"kubeconfig": d.conf.join("ZZZ-linkerd-cni-kubeconfig").display().to_string()},
        "linkerd": {"incoming-proxy-port": 4143, "outgoing-proxy-port": 4140,
            "proxy-uid": 2102, "ipv6": false}});
    go_json(&t).as_object().cloned().unwrap()
}

fn linkerd_installer(d: &Dirs) -> InstallerThread {
    install_binary(d, "linkerd-cni");
    put(&d.conf, "ZZZ-linkerd-cni-kubeconfig", b"apiVersion: v1\n");
    let t = linkerd_entry(d);
    let conf = d.conf.clone();
    let conflists = |conf: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(conf)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".conflist"))
            .collect();
        v.sort();
        v
    };
    let mut wrote: HashMap<String, Vec<u8>> = HashMap::new();
    let c2 = conf.clone();
    let step = move || {
        let mut any = false;
        for n in conflists(&c2) {
            let Ok(c) = std::fs::read(c2.join(&n)) else {
                continue;
            };
            if wrote.get(&n) == Some(&c) {
                continue;
            }
            if let Some(new) = inject(&c, &t) {
                put(&c2, &n, &new);
                wrote.insert(n, new);
                any = true;
            }
        }
        any
    };
    let bin = d.bin.join("linkerd-cni");
    let cleanup = move || {
        for n in conflists(&conf) {
            if let Some(new) = std::fs::read(conf.join(&n))
                .ok()
                .and_then(|c| without(&c, "linkerd-cni"))
            {
                std::fs::write(conf.join(&n), new).unwrap();
            }
        }
        let _ = std::fs::remove_file(bin);
        let _ = std::fs::remove_file(conf.join("ZZZ-linkerd-cni-kubeconfig"));
    };
    InstallerThread::spawn(step, cleanup)
}

#[test]
fn linkerd_every_file_converges_keeps_t_on_primary_rewrites_and_holds_on_sigterm() {
    let d = Dirs::new();
    d.write(PRIMARY, CALICO);
    let mut linkerd = linkerd_installer(&d);
    wait_until(
        WAIT,
        || types(&d, PRIMARY).last().map(String::as_str) == Some("linkerd-cni"),
        || "linkerd stand-in did not inject".into(),
    );
    let a = start(&d, "linkerd");
    let t = linkerd_entry(&d);
    wait_guarding(&d, &a, &t);
    assert_quiet(&a, &linkerd.writes);
    // The primary rewrites its file without T, a few times: the guard file keeps T, the
    // node stays ready, and everything settles again each time.
    for mtu in [1450, 1460, 1470] {
        d.write(PRIMARY, &CALICO.replace("1440", &mtu.to_string()));
        wait_until(
            WAIT,
            || d.json(GUARD_FILE)["plugins"][0]["mtu"] == json!(mtu),
            || a.log_text(),
        );
        wait_guarding(&d, &a, &t);
        assert_quiet(&a, &linkerd.writes);
    }
    assert_eq!(
        a.metric("interlock_config_conflicts_total{file=\"00-interlock.conflist\"}"),
        None,
        "{}",
        a.log_text()
    );
    // SIGTERM: every file reverted, binary and kubeconfig gone: hold, T not put back.
    linkerd.terminate();
    wait_holding(&d, &a, "linkerd-cni", "");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        types(&d, GUARD_FILE),
        ["bridge", "portmap", "interlock-cni"]
    );
    assert_eq!(types(&d, PRIMARY), ["bridge", "portmap"]);
    // The installer back: guard again.
    let linkerd = linkerd_installer(&d);
    wait_guarding(&d, &a, &t);
    assert_quiet(&a, &linkerd.writes);
    assert_eq!(
        a.metric("interlock_errors_total"),
        Some(0.0),
        "{}",
        a.log_text()
    );
}

#[test]
fn a_restarted_agent_guards_with_the_entry_it_kept() {
    let d = Dirs::new();
    // Kuma: its entry in the file its chart names (the primary's).
    let kubeconfig = d.conf.join("ZZZ-kuma-cni-kubeconfig");
    put(&d.conf, "ZZZ-kuma-cni-kubeconfig", b"apiVersion: v1\n");
    install_binary(&d, "kuma-cni");
    let t = go_json(
        &json!({"type": "kuma-cni", "name": "kuma-cni", "log_level": "info",
        "kubernetes": {"kubeconfig": kubeconfig.display().to_string(),
            "cni_bin_dir": d.bin.display().to_string(), "exclude_namespaces": ["kube-system"]}}),
    )
    .as_object()
    .cloned()
    .unwrap();
    put(&d.conf, PRIMARY, &inject(CALICO.as_bytes(), &t).unwrap());
    let a = start(&d, "kuma");
    wait_guarding(&d, &a, &t);
    let role = &d.json(GUARD_FILE)["plugins"][2]["guard"];
    assert_eq!(role["mesh"], json!("kuma"));
    assert_eq!(role["excludeNamespaces"], json!(["kube-system"]));
    assert!(a.terminate().success());
    // While the agent is away the node's conf dir is reset: the guard file is gone and
    // the primary's file was rewritten without T.
    std::fs::remove_file(d.conf.join(GUARD_FILE)).unwrap();
    d.write(PRIMARY, CALICO);
    let a = start(&d, "kuma");
    wait_guarding(&d, &a, &t);
    assert!(
        a.log_text().contains("kept from the last run"),
        "{}",
        a.log_text()
    );
    // Uninstall: the guard file and the kept entry go; the primary's file stays as the
    // primary wrote it, and the output says T left with the guard file.
    assert!(a.terminate().success());
    let out = d.uninstall();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("carried kuma-cni"), "{text}");
    assert_eq!(d.names(), [PRIMARY, "ZZZ-kuma-cni-kubeconfig"]);
    assert_eq!(d.read(PRIMARY).unwrap(), CALICO.as_bytes());
    assert!(!d.state.join("guard-entry.json").exists());
}

/// Runs the agent with `args` and returns its error output; it must refuse to start.
fn refused(d: &Dirs, args: &[&str]) -> String {
    let out = d.interlock("agent").args(args).output().unwrap();
    assert!(!out.status.success(), "started with {args:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn guard_flags_are_checked_together() {
    let d = Dirs::new();
    let base = ["--kube=none", "--cri-endpoint=none"];
    let err = refused(&d, &[&base[..], &["--config-mode", "guard"]].concat());
    assert!(
        err.contains("--config-mode guard needs --guard-mesh"),
        "{err}"
    );
    let err = refused(&d, &[&base[..], &["--guard-mesh", "consul"]].concat());
    assert!(
        err.contains("--guard-mesh consul needs --config-mode guard"),
        "{err}"
    );
    let err = refused(&d, &["--config-mode", "guard", "--guard-mesh", "cilium"]);
    assert!(err.contains("cilium"), "{err}");
    assert_eq!(d.names(), Vec::<String>::new(), "nothing written");
}

/// An installer played by a thread: `step` runs every few milliseconds until stopped
/// (counting its writes), then `cleanup` runs once (its SIGTERM handling).
struct InstallerThread {
    stop: Arc<AtomicBool>,
    writes: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl InstallerThread {
    fn spawn(
        mut step: impl FnMut() -> bool + Send + 'static,
        cleanup: impl FnOnce() + Send + 'static,
    ) -> InstallerThread {
        let stop = Arc::new(AtomicBool::new(false));
        let writes = Arc::new(AtomicUsize::new(0));
        let (s, w) = (stop.clone(), writes.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if step() {
                    w.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            cleanup();
        });
        InstallerThread {
            stop,
            writes,
            thread: Some(thread),
        }
    }

    /// True once the thread ended by itself (an installer that exits).
    fn exited(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    fn terminate(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for InstallerThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The agent's writes and the installer's stay the same for a second: no loop.
fn assert_quiet(a: &Agent, writes: &AtomicUsize) {
    let sample = || {
        (
            a.metric("interlock_config_writes_total"),
            writes.load(Ordering::Relaxed),
        )
    };
    let mut last = sample();
    let mut quiet = 0;
    let start = std::time::Instant::now();
    while quiet < 10 {
        assert!(
            start.elapsed() < WAIT,
            "the agent and the installer keep rewriting: {last:?}\n{}",
            a.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
        let now = sample();
        if now == last {
            quiet += 1;
        } else {
            quiet = 0;
            last = now;
        }
    }
}

/// consul-cni's installer (A.3.2): on every change, the first valid file; its entry must
/// be the last plugin and equal to its own, else removed and appended; written in place
/// (not atomically). Its kubeconfig name carries a per-start id. SIGTERM cleans the file
/// it chose at its start only, then binary and kubeconfig.
fn consul_installer(d: &Dirs, id: u32) -> (InstallerThread, Map<String, Value>) {
    let kubeconfig = format!("ZZZ-consul-cni-kubeconfig-{id}");
    install_binary(d, "consul-cni");
    put(&d.conf, &kubeconfig, b"apiVersion: v1\n");
    let t = go_json(&json!({"type": "consul-cni", "name": "consul-cni",
        "cni_bin_dir": d.bin.display().to_string(), "cni_net_dir": d.conf.display().to_string(),
        "kubeconfig": kubeconfig, "log_level": "info", "multus": false,
        "autorotate_token": true}))
    .as_object()
    .cloned()
    .unwrap();
    let conf = d.conf.clone();
    let names = move |conf: &Path| {
        let mut v: Vec<String> = std::fs::read_dir(conf)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".conflist"))
            .collect();
        v.sort();
        v
    };
    let first = move |conf: &Path| {
        names(conf).into_iter().find(|n| {
            std::fs::read(conf.join(n))
                .ok()
                .and_then(|b| parse(&b))
                .is_some_and(|l| l.get("plugins").is_some())
        })
    };
    let start_file = first(&conf);
    let (tt, c2) = (t.clone(), conf.clone());
    let step = move || {
        let Some(tg) = first(&c2) else {
            return false;
        };
        let Ok(c) = std::fs::read(c2.join(&tg)) else {
            return false;
        };
        let Some(list) = parse(&c) else {
            return false;
        };
        let last = list["plugins"].as_array().and_then(|p| p.last()).cloned();
        if last.as_ref().and_then(Value::as_object) == Some(&tt) {
            return false;
        }
        std::fs::write(c2.join(&tg), inject(&c, &tt).unwrap()).unwrap();
        true
    };
    let (c3, bin, kc) = (
        conf.clone(),
        d.bin.join("consul-cni"),
        conf.join(&kubeconfig),
    );
    let cleanup = move || {
        if let Some(f) = start_file {
            if let Some(new) = std::fs::read(c3.join(&f))
                .ok()
                .and_then(|c| without(&c, "consul-cni"))
            {
                std::fs::write(c3.join(&f), new).unwrap();
            }
        }
        let _ = std::fs::remove_file(bin);
        let _ = std::fs::remove_file(kc);
    };
    (InstallerThread::spawn(step, cleanup), t)
}

#[test]
fn consul_first_valid_file_on_every_event_converges_and_a_restart_is_adopted() {
    let d = Dirs::new();
    d.write(PRIMARY, CALICO);
    let (mut consul, t1) = consul_installer(&d, 1);
    wait_until(
        WAIT,
        || types(&d, PRIMARY).last().map(String::as_str) == Some("consul-cni"),
        || "consul stand-in did not write its entry".into(),
    );
    let a = start(&d, "consul");
    wait_guarding(&d, &a, &t1);
    assert_quiet(&a, &consul.writes);
    // The primary rewrites its file without T: the guard file (consul's target now,
    // being first) keeps T last; nobody loops.
    d.write(PRIMARY, &CALICO.replace("1440", "1450"));
    wait_until(
        WAIT,
        || d.json(GUARD_FILE)["plugins"][0]["mtu"] == json!(1450),
        || a.log_text(),
    );
    wait_guarding(&d, &a, &t1);
    assert_quiet(&a, &consul.writes);
    // A restart: the old installer cleans only its start file (the primary's) and takes
    // binary and kubeconfig: hold.
    consul.terminate();
    wait_holding(&d, &a, "consul-cni", "binary missing");
    // The new one has a new kubeconfig name: it writes its entry into the first file,
    // the guard file; the agent adopts it verbatim.
    let (consul, t2) = consul_installer(&d, 2);
    assert_ne!(t1, t2);
    wait_guarding(&d, &a, &t2);
    assert_quiet(&a, &consul.writes);
    let kept: Value =
        serde_json::from_slice(&std::fs::read(d.state.join("guard-entry.json")).unwrap()).unwrap();
    assert_eq!(kept["entry"], Value::Object(t2));
}

/// kuma-cni's installer (A.4.2): its entry appended to the file its chart names; polls
/// that file and, once its entry is gone, cleans up (binary, entry, kubeconfig) and exits.
fn kuma_installer(d: &Dirs, t: &Map<String, Value>) -> InstallerThread {
    install_binary(d, "kuma-cni");
    put(&d.conf, "ZZZ-kuma-cni-kubeconfig", b"apiVersion: v1\n");
    let c = d.read(PRIMARY).unwrap();
    if without(&c, "kuma-cni").is_none() {
        put(&d.conf, PRIMARY, &inject(&c, t).unwrap());
    }
    let (conf, bin) = (d.conf.clone(), d.bin.clone());
    let gone = Arc::new(AtomicBool::new(false));
    let g2 = gone.clone();
    let c2 = conf.clone();
    let step = move || {
        let has = std::fs::read(c2.join(PRIMARY))
            .ok()
            .is_some_and(|c| without(&c, "kuma-cni").is_some());
        if !has {
            g2.store(true, Ordering::Relaxed);
        }
        false
    };
    let cleanup = move || {
        let _ = std::fs::remove_file(bin.join("kuma-cni"));
        if let Some(new) = std::fs::read(conf.join(PRIMARY))
            .ok()
            .and_then(|c| without(&c, "kuma-cni"))
        {
            put(&conf, PRIMARY, &new);
        }
        let _ = std::fs::remove_file(conf.join("ZZZ-kuma-cni-kubeconfig"));
    };
    let th = InstallerThread::spawn(step, cleanup);
    // Exits by itself once the check fails.
    let stop = th.stop.clone();
    std::thread::spawn(move || {
        while !gone.load(Ordering::Relaxed) && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(5));
        }
        stop.store(true, Ordering::Relaxed);
    });
    th
}

#[test]
fn kuma_named_file_primary_rewrite_holds_until_the_restarted_installer_is_back() {
    let d = Dirs::new();
    d.write(PRIMARY, CALICO);
    let t = go_json(
        &json!({"type": "kuma-cni", "name": "kuma-cni", "cniVersion": "0.3.1",
        "kubernetes": {"kubeconfig": d.conf.join("ZZZ-kuma-cni-kubeconfig").display().to_string(),
            "cni_bin_dir": d.bin.display().to_string(), "exclude_namespaces": ["kube-system"]}}),
    )
    .as_object()
    .cloned()
    .unwrap();
    let kuma = kuma_installer(&d, &t);
    let a = start(&d, "kuma");
    wait_guarding(&d, &a, &t);
    // The primary rewrites its file without T: Kuma's check fails, it cleans up and
    // exits (binary gone): hold, meshed pods wait for its restart.
    d.write(PRIMARY, &CALICO.replace("1440", "1450"));
    wait_until(
        WAIT,
        || kuma.exited(),
        || "kuma stand-in did not exit".into(),
    );
    wait_holding(&d, &a, "kuma-cni", "binary missing");
    // Restarted (the kubelet's back-off): entry, binary and kubeconfig back: guard.
    let _kuma = kuma_installer(&d, &t);
    wait_guarding(&d, &a, &t);
    assert!(d.json(GUARD_FILE)["plugins"][0]["mtu"] == json!(1450));
}

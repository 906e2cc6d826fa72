//! The installer stand-ins' file behaviour on a temp dir (`research/guard-mode.md` §A.1.2,
//! §A.2.2, §A.3.2, §A.4.2), driven step by step, and the processes' signal handling.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use interlock_contract::guard::GuardedMesh;
use interlock_mesh_standins::files::{has_type, types, valid};
use interlock_mesh_standins::install::{self, InstallOptions, Installer, Step};
use serde_json::{json, Value};

const EXE: &str = env!("CARGO_BIN_EXE_mesh-standin");

struct Dirs {
    _tmp: tempfile::TempDir,
    conf: PathBuf,
    bin: PathBuf,
    run: PathBuf,
}

fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().unwrap();
    let conf = tmp.path().join("net.d");
    let bin = tmp.path().join("bin");
    let run = tmp.path().join("run");
    fs::create_dir_all(&conf).unwrap();
    fs::create_dir_all(&bin).unwrap();
    Dirs {
        conf,
        bin,
        run,
        _tmp: tmp,
    }
}

fn opts(mesh: GuardedMesh, d: &Dirs) -> InstallOptions {
    InstallOptions {
        mesh,
        conf_dir: d.conf.clone(),
        bin_dir: d.bin.clone(),
        source: EXE.into(),
        server: "http://127.0.0.1:1".into(),
        token: "t".into(),
        run_dir: d.run.clone(),
        conf_name: "10-primary.conflist".into(),
    }
}

fn primary() -> Value {
    json!({"cniVersion": "0.3.1", "name": "k8s-pod-network",
           "plugins": [{"type": "bridge"}, {"type": "portmap"}]})
}

fn write(p: &Path, v: &Value) {
    fs::write(p, serde_json::to_vec_pretty(v).unwrap()).unwrap();
}

fn read(p: &Path) -> Value {
    serde_json::from_slice(&fs::read(p).unwrap()).unwrap()
}

fn step(i: &mut Installer) {
    assert_eq!(i.step().unwrap(), Step::Ok);
}

#[test]
fn istio_keeps_the_first_valid_file_at_start_and_cleans_up() {
    let d = dirs();
    let a = d.conf.join("10-a.conflist");
    write(&a, &primary());
    let mut i = Installer::start(opts(GuardedMesh::Istio, &d)).unwrap();
    assert!(d.bin.join("istio-cni").exists(), "binary installed");
    assert!(
        d.run.join("istio-cni-kubeconfig").exists(),
        "kubeconfig in the run dir"
    );
    step(&mut i);
    assert_eq!(types(&read(&a)), ["bridge", "portmap", "istio-cni"]);
    assert!(read(&a)["plugins"][2].get("cniVersion").is_none());
    // A file that sorts ahead later is not the target ("preempted" is only logged).
    let b = d.conf.join("05-b.conflist");
    write(&b, &primary());
    step(&mut i);
    assert!(!has_type(&b, "istio-cni"));
    // Any position passes the check: an entry a writer moved first is left there.
    write(
        &a,
        &json!({"cniVersion": "0.3.1", "name": "k8s-pod-network", "plugins": [{"type": "istio-cni"}, {"type": "bridge"}]}),
    );
    step(&mut i);
    assert_eq!(types(&read(&a)), ["istio-cni", "bridge"]);
    // The primary drops the entry: it comes back, last, atomically (a new inode).
    write(&a, &primary());
    let before = fs::metadata(&a).unwrap().ino();
    step(&mut i);
    assert_ne!(fs::metadata(&a).unwrap().ino(), before, "renamed over");
    assert_eq!(types(&read(&a)), ["bridge", "portmap", "istio-cni"]);
    assert!(has_type(&a, "istio-cni"));
    i.cleanup().unwrap();
    assert_eq!(types(&read(&a)), ["bridge", "portmap"]);
    assert!(!d.bin.join("istio-cni").exists());
    assert!(!d.run.join("istio-cni-kubeconfig").exists());
}

#[test]
fn istio_turns_a_conf_into_a_conflist() {
    let d = dirs();
    let conf = d.conf.join("10-a.conf");
    write(
        &conf,
        &json!({"cniVersion": "0.3.1", "name": "net", "type": "bridge"}),
    );
    let mut i = Installer::start(opts(GuardedMesh::Istio, &d)).unwrap();
    step(&mut i);
    assert!(!conf.exists());
    let l = read(&d.conf.join("10-a.conflist"));
    assert_eq!(l["cniVersion"], "0.3.1");
    assert_eq!(l["name"], "k8s-pod-network");
    assert_eq!(types(&l), ["bridge", "istio-cni"]);
    i.cleanup().unwrap();
    assert_eq!(types(&read(&d.conf.join("10-a.conflist"))), ["bridge"]);
}

#[test]
fn linkerd_writes_every_file_once_per_change_and_reverts_all() {
    let d = dirs();
    let a = d.conf.join("10-a.conflist");
    let b = d.conf.join("20-b.conflist");
    let c = d.conf.join("30-c.conf");
    write(&a, &primary());
    write(&b, &primary());
    write(
        &c,
        &json!({"cniVersion": "0.3.1", "name": "net", "type": "ptp"}),
    );
    let mut i = Installer::start(opts(GuardedMesh::Linkerd, &d)).unwrap();
    let kc = fs::read_to_string(d.conf.join("ZZZ-linkerd-cni-kubeconfig")).unwrap();
    assert!(kc.contains("linkerd-cni-context"));
    step(&mut i);
    for p in [&a, &b] {
        assert_eq!(
            types(&read(p)),
            ["bridge", "portmap", "linkerd-cni"],
            "{}",
            p.display()
        );
    }
    assert!(!c.exists(), "the .conf is deleted");
    assert_eq!(
        types(&read(&d.conf.join("30-c.conflist"))),
        ["ptp", "linkerd-cni"]
    );
    assert!(!d.conf.join("10-a.conflist.install").exists());
    // Unchanged files are not written again.
    let ino = fs::metadata(&a).unwrap().ino();
    step(&mut i);
    assert_eq!(fs::metadata(&a).unwrap().ino(), ino, "hash-gated");
    // A rewrite without the entry gets it back.
    write(&a, &primary());
    step(&mut i);
    assert!(has_type(&a, "linkerd-cni"));
    i.cleanup().unwrap();
    for p in [&a, &b, &d.conf.join("30-c.conflist")] {
        assert!(!has_type(p, "linkerd-cni"), "{}", p.display());
    }
    assert!(!d.bin.join("linkerd-cni").exists());
    assert!(!d.conf.join("ZZZ-linkerd-cni-kubeconfig").exists());
}

#[test]
fn consul_follows_the_first_file_keeps_last_writes_in_place_and_cleans_its_first() {
    let d = dirs();
    let a = d.conf.join("10-a.conflist");
    write(&a, &primary());
    let mut i = Installer::start(opts(GuardedMesh::Consul, &d)).unwrap();
    let kc = i.kubeconfig_path();
    let name = kc.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with("ZZZ-consul-cni-kubeconfig-") && kc.exists(),
        "{name}"
    );
    assert_eq!(i.entry()["kubeconfig"], json!(name));
    step(&mut i);
    assert_eq!(types(&read(&a)), ["bridge", "portmap", "consul-cni"]);
    // Something appended after it: consul-cni moves itself last, in place (same inode).
    let mut l = read(&a);
    l["plugins"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "tuning"}));
    write(&a, &l);
    let ino = fs::metadata(&a).unwrap().ino();
    step(&mut i);
    assert_eq!(
        types(&read(&a)),
        ["bridge", "portmap", "tuning", "consul-cni"]
    );
    assert_eq!(fs::metadata(&a).unwrap().ino(), ino, "written in place");
    // A file that sorts ahead is the new target at the next event.
    let b = d.conf.join("05-b.conflist");
    write(&b, &primary());
    step(&mut i);
    assert!(has_type(&b, "consul-cni"));
    // Cleanup reverts only the file chosen at start.
    i.cleanup().unwrap();
    assert!(!has_type(&a, "consul-cni"));
    assert!(
        has_type(&b, "consul-cni"),
        "the later target keeps its entry"
    );
    assert!(!kc.exists() && !d.bin.join("consul-cni").exists());
    // Each start has its own kubeconfig name.
    std::thread::sleep(Duration::from_millis(2));
    let j = Installer::start(opts(GuardedMesh::Consul, &d)).unwrap();
    assert_ne!(j.kubeconfig_path(), kc);
}

#[test]
fn consul_writes_a_conflist_beside_a_conf_and_keeps_the_conf() {
    let d = dirs();
    let conf = d.conf.join("10-a.conf");
    write(
        &conf,
        &json!({"cniVersion": "0.3.1", "name": "net", "type": "bridge"}),
    );
    let mut i = Installer::start(opts(GuardedMesh::Consul, &d)).unwrap();
    step(&mut i);
    assert!(
        valid(&conf).is_some(),
        "the .conf stays (and still loads first)"
    );
    assert_eq!(
        types(&read(&d.conf.join("10-a.conflist"))),
        ["bridge", "consul-cni"]
    );
}

#[test]
fn kuma_chains_into_the_named_file_and_reports_its_loss() {
    let d = dirs();
    let named = d.conf.join("10-primary.conflist");
    write(&d.conf.join("05-other.conflist"), &primary());
    let mut i = Installer::start(opts(GuardedMesh::Kuma, &d)).unwrap();
    step(&mut i); // waits for the named file
    write(&named, &primary());
    step(&mut i);
    assert_eq!(types(&read(&named)), ["bridge", "portmap", "kuma-cni"]);
    assert!(!has_type(&d.conf.join("05-other.conflist"), "kuma-cni"));
    step(&mut i);
    write(&named, &primary());
    match i.step().unwrap() {
        Step::Lost(why) => assert!(why.contains("kuma-cni missing"), "{why}"),
        s => panic!("expected a failed check, got {s:?}"),
    }
    i.cleanup().unwrap();
    assert!(!d.bin.join("kuma-cni").exists());
    assert!(!d.conf.join("ZZZ-kuma-cni-kubeconfig").exists());
}

#[test]
fn kuma_writes_the_list_into_a_named_conf() {
    let d = dirs();
    let named = d.conf.join("10-primary.conf");
    write(
        &named,
        &json!({"cniVersion": "0.3.1", "name": "net", "type": "bridge"}),
    );
    let mut o = opts(GuardedMesh::Kuma, &d);
    o.conf_name = "10-primary.conf".into();
    let mut i = Installer::start(o).unwrap();
    step(&mut i);
    let v = read(&named);
    assert_eq!(v["cniVersion"], "0.3.0");
    assert_eq!(types(&v), ["bridge", "kuma-cni"]);
    assert!(
        valid(&named).is_none(),
        "a list in a .conf is not a valid .conf to libcni"
    );
}

/// An installer process killed when dropped (also when the test fails).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait(what: &str, f: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_istio_installer_process_cleans_up_on_sigterm() {
    let d = dirs();
    let a = d.conf.join("10-a.conflist");
    write(&a, &primary());
    let o = opts(GuardedMesh::Istio, &d);
    let log = d.conf.parent().unwrap().join("install.log");
    let mut child = Killed(install::spawn(Path::new(EXE), &o, &log).unwrap());
    let child = &mut child.0;
    wait("istio-cni in the file", || has_type(&a, "istio-cni"));
    // The primary drops it; the installer puts it back by itself.
    write(&a, &primary());
    wait("istio-cni back", || has_type(&a, "istio-cni"));
    let status = install::terminate(child, Duration::from_secs(10)).unwrap();
    assert!(
        status.success(),
        "{status}: {}",
        fs::read_to_string(&log).unwrap_or_default()
    );
    assert!(!has_type(&a, "istio-cni"));
    assert!(!d.bin.join("istio-cni").exists());
}

#[test]
fn the_kuma_installer_process_is_install_cni_and_exits_5_on_loss() {
    let d = dirs();
    let named = d.conf.join("10-primary.conflist");
    write(&named, &primary());
    let o = opts(GuardedMesh::Kuma, &d);
    let log = d.conf.parent().unwrap().join("install.log");
    let mut child = Killed(install::spawn(Path::new(EXE), &o, &log).unwrap());
    let child = &mut child.0;
    // Right after spawn the child may not have exec'd yet (its cmdline is still ours):
    // wait for the exec, then the name must be Kuma's.
    let argv0 = || {
        let cmdline = fs::read(format!("/proc/{}/cmdline", child.id())).unwrap_or_default();
        cmdline
            .split(|b| *b == 0)
            .next()
            .unwrap_or_default()
            .to_vec()
    };
    let ours = fs::read("/proc/self/cmdline").unwrap();
    let ours = ours.split(|b| *b == 0).next().unwrap().to_vec();
    wait("the installer's exec", || {
        let a = argv0();
        !a.is_empty() && a != ours
    });
    assert_eq!(argv0(), b"/install-cni");
    wait("kuma-cni in the file", || has_type(&named, "kuma-cni"));
    write(&named, &primary());
    let until = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < until, "kuma installer did not exit");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        status.code(),
        Some(install::KUMA_LOST_EXIT),
        "{}",
        fs::read_to_string(&log).unwrap_or_default()
    );
    assert!(!d.bin.join("kuma-cni").exists());
}

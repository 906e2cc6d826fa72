//! `interlock agent` as a process against throwaway conf/bin/state dirs, with adversaries
//! written as test code. Each test asserts the final effective config (by
//! `interlock_confdir::load`) and that no foreign data was lost.

use crate::common;

use common::*;
use serde_json::{json, Value};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn calico_with(subnet: &str, mtu: u32) -> String {
    CALICO
        .replace("10.99.0.0/24", subnet)
        .replace("1440", &mtu.to_string())
}

/// The owned copy = primary (every field, in order) + our entry last.
fn assert_owned_copy_of(d: &Dirs, owned: &str, primary: &str) {
    let o = d.json(owned);
    let p: Value = serde_json::from_slice(&d.read(primary).unwrap()).unwrap();
    let mut expect = p.as_object().unwrap().clone();
    let ours = Value::Object(interlock_agent::plugin_entry(&d.state));
    let mut plugins = p["plugins"].as_array().unwrap().clone();
    plugins.push(ours);
    expect.insert("plugins".into(), Value::Array(plugins));
    expect.insert("cniVersion".into(), o["cniVersion"].clone());
    assert_eq!(
        o,
        Value::Object(expect.clone()),
        "owned copy differs from primary + ours"
    );
    let ko: Vec<_> = o.as_object().unwrap().keys().collect();
    let ke: Vec<_> = expect.keys().collect();
    assert_eq!(ko, ke, "foreign key order lost");
}

#[test]
fn calico_like_rewriter_after_start_owned_copy_follows() {
    let d = Dirs::new();
    let a = d.agent(&[]);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(a.ready(), Some(false), "nothing to protect yet: not ready");
    // Calico writes its file in place (not atomically), every few ms, dropping anything
    // foreign that someone added to it.
    let stop = Arc::new(AtomicBool::new(false));
    let conf = d.conf.clone();
    let s2 = stop.clone();
    // It writes at least 100 times (about 0.3 s on an idle machine, longer on a loaded
    // one), and for at least 0.8 s.
    let writer = std::thread::spawn(move || {
        let mut i = 0u32;
        while i < 100 || !s2.load(Ordering::Relaxed) {
            let body = calico_with(&format!("10.99.{}.0/24", i % 4), 1400 + i % 3);
            std::fs::write(conf.join("10-calico.conflist"), body).unwrap();
            i += 1;
            std::thread::sleep(Duration::from_millis(3));
        }
        i
    });
    std::thread::sleep(Duration::from_millis(800));
    stop.store(true, Ordering::Relaxed);
    let writes = writer.join().unwrap();
    let eff = wait_protected(&d, &a);
    assert_eq!(eff, "00-interlock.conflist");
    wait_until(
        Duration::from_secs(2),
        || {
            let o = d.json("00-interlock.conflist");
            let p = d.json("10-calico.conflist");
            o["plugins"][0] == p["plugins"][0]
        },
        || "owned copy did not follow the last calico write".into(),
    );
    assert_owned_copy_of(&d, "00-interlock.conflist", "10-calico.conflist");
    let last = calico_with(
        &format!("10.99.{}.0/24", (writes - 1) % 4),
        1400 + (writes - 1) % 3,
    );
    assert_eq!(
        d.read("10-calico.conflist").unwrap(),
        last.as_bytes(),
        "calico's file was touched"
    );
    assert_eq!(d.names(), ["00-interlock.conflist", "10-calico.conflist"]);
    assert_eq!(
        a.metric("interlock_errors_total"),
        Some(0.0),
        "{}",
        a.log_text()
    );
}

#[test]
fn aws_node_like_rename_writer_owned_copy_follows() {
    let d = Dirs::new();
    d.rename_in("10-aws.conflist", &calico_with("10.99.10.0/24", 9001));
    let a = d.agent(&[]);
    wait_protected(&d, &a);
    for i in 0..150u32 {
        d.rename_in(
            "10-aws.conflist",
            &calico_with(&format!("10.99.{}.0/24", 10 + i % 5), 9001 - i),
        );
        std::thread::sleep(Duration::from_millis(4));
    }
    wait_until(
        Duration::from_secs(2),
        || d.json("00-interlock.conflist")["plugins"][0]["mtu"] == 9001 - 149,
        || "owned copy did not follow".into(),
    );
    assert_owned_copy_of(&d, "00-interlock.conflist", "10-aws.conflist");
    assert_eq!(
        d.effective_with_us().as_deref(),
        Some("00-interlock.conflist")
    );
    assert_eq!(a.ready(), Some(true));
    assert_eq!(
        d.names(),
        ["00-interlock.conflist", "10-aws.conflist"],
        "temp files left behind"
    );
}

#[test]
fn chain_mode_conflicting_rewriter_backs_off_reports_file_then_repairs() {
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    // A short forgiveness period: readiness comes back 1 s after the last back-off.
    let a = d.agent(&["--config-mode", "chain", "--conflict-forgive-seconds", "1"]);
    assert_eq!(wait_protected(&d, &a), "10-calico.conflist");
    assert_eq!(
        plugin_types(&d.json("10-calico.conflist")),
        ["bridge", "portmap", "interlock-cni"]
    );
    // Calico rewrites its file every 3 ms, dropping our entry.
    let stop = Arc::new(AtomicBool::new(false));
    let conf = d.conf.clone();
    let s2 = stop.clone();
    let writer = std::thread::spawn(move || {
        while !s2.load(Ordering::Relaxed) {
            std::fs::write(conf.join("10-calico.conflist"), CALICO).unwrap();
            std::thread::sleep(Duration::from_millis(3));
        }
    });
    wait_until(
        Duration::from_secs(5),
        || {
            a.get("/readyz").is_some_and(|(c, b)| {
                c == 503 && b.contains("backing off") && b.contains("10-calico.conflist")
            })
        },
        || format!("no back-off; log:\n{}", a.log_text()),
    );
    let metrics = a.get("/metrics").unwrap().1;
    assert!(
        metrics.contains("interlock_config_backoff{file=\"10-calico.conflist\"} 1"),
        "{metrics}"
    );
    // The fight is reported naming the primary the runtime loads meanwhile.
    let log = a.log_text();
    assert!(
        log.contains("a fight, most likely")
            && log.contains("the runtime loads 10-calico.conflist (bridge, portmap) meanwhile"),
        "{log}"
    );
    // Every conflict before the back-off is logged too, naming the file and what it holds.
    assert!(
        a.log_text().contains(
            "10-calico.conflist in {} changed since interlock wrote it and it no longer runs \
             interlock-cni"
                .replace("{}", &d.conf.display().to_string())
                .as_str()
        ),
        "{}",
        a.log_text()
    );
    // Backing off means not spinning: few writes while the conflict goes on.
    let w0 = a.metric("interlock_config_writes_total").unwrap();
    std::thread::sleep(Duration::from_millis(700));
    let w1 = a.metric("interlock_config_writes_total").unwrap();
    assert!(
        w1 - w0 <= 25.0,
        "agent kept writing during back-off: {w0} -> {w1}"
    );
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    // After the back-off ends, the repair happens and readiness returns.
    assert_eq!(wait_protected(&d, &a), "10-calico.conflist");
    let c = d.json("10-calico.conflist");
    let orig: Value = serde_json::from_str(CALICO).unwrap();
    assert_eq!(without_us(&c), orig, "foreign data lost");
}

#[test]
fn chain_mode_wraps_conf_and_uninstall_restores_bytes() {
    let d = Dirs::new();
    let conf = "{ \"cniVersion\": \"0.3.1\", \"name\": \"ilaws\",\n  \"type\": \"bridge\", \"bridge\": \"ilaws0\",\n  \"ipam\": {\"type\": \"host-local\", \"subnet\": \"10.99.20.0/24\"} }\n";
    d.write("10-aws.conf", conf);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        d.conf.join("10-aws.conf"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    d.write("99-other.conflist", CALICO);
    let a = d.agent(&["--config-mode", "chain"]);
    assert_eq!(wait_protected(&d, &a), "10-aws.conflist");
    assert_eq!(
        d.names(),
        [
            "10-aws.conf.interlock-orig",
            "10-aws.conflist",
            "99-other.conflist"
        ]
    );
    let w = d.json("10-aws.conflist");
    assert_eq!(w["plugins"][0]["bridge"], "ilaws0");
    assert_eq!(plugin_types(&w), ["bridge", "interlock-cni"]);
    let mode = std::fs::metadata(d.conf.join("10-aws.conflist"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    // SIGTERM: the config stays.
    assert!(a.terminate().success());
    assert_eq!(d.effective_with_us().as_deref(), Some("10-aws.conflist"));
    let m: Value =
        serde_json::from_slice(&std::fs::read(d.state.join("agent-ready.json")).unwrap()).unwrap();
    assert_eq!(m["ready"], false);
    // interlock uninstall restores the .conf byte for byte and removes only our things.
    d.uninstall();
    assert_eq!(d.names(), ["10-aws.conf", "99-other.conflist"]);
    assert_eq!(d.read("10-aws.conf").unwrap(), conf.as_bytes());
    assert_eq!(
        std::fs::metadata(d.conf.join("10-aws.conf"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    assert_eq!(d.read("99-other.conflist").unwrap(), CALICO.as_bytes());
    assert!(!d.bin.join("interlock-cni").exists());
    assert!(!d.state.join("agent-ready.json").exists());
}

#[test]
fn uninstall_on_exit_removes_owned_file_only() {
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    let a = d.agent(&["--uninstall-on-exit"]);
    wait_protected(&d, &a);
    assert!(a.terminate().success());
    assert_eq!(d.names(), ["10-calico.conflist"]);
    assert_eq!(d.read("10-calico.conflist").unwrap(), CALICO.as_bytes());
}

#[test]
fn new_config_sorting_ahead_is_overtaken_and_multus_is_chained() {
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    let a = d.agent(&[]);
    assert_eq!(wait_protected(&d, &a), "00-interlock.conflist");
    let newer = r#"{"cniVersion":"0.4.0","name":"ilnew","plugins":[{"type":"bridge","bridge":"ilnew0","ipam":{"type":"host-local","subnet":"10.99.30.0/24"}}]}"#;
    d.rename_in("00-new.conflist", newer);
    wait_until(
        Duration::from_secs(2),
        || {
            d.read("00-interlock.conflist")
                .is_some_and(|b| String::from_utf8_lossy(&b).contains("ilnew0"))
        },
        || a.log_text(),
    );
    assert_owned_copy_of(&d, "00-interlock.conflist", "00-new.conflist");
    // A file sorting ahead of our name: we take a name ahead of it.
    d.rename_in("00-aaa.conflist", newer);
    wait_until(
        Duration::from_secs(2),
        || {
            d.effective_with_us().as_deref() == Some("0-interlock.conflist")
                && !d.conf.join("00-interlock.conflist").exists()
        },
        || format!("{:?}\n{}", d.names(), a.log_text()),
    );
    assert_owned_copy_of(&d, "0-interlock.conflist", "00-aaa.conflist");
    // That file goes away again; then Multus arrives. It must stay first: chained into,
    // not overtaken.
    std::fs::remove_file(d.conf.join("00-aaa.conflist")).unwrap();
    wait_until(
        Duration::from_secs(2),
        || d.effective_with_us().is_some(),
        || a.log_text(),
    );
    let multus = r#"{"cniVersion":"0.3.1","name":"multus-cni-network","type":"multus","clusterNetwork":"k8s-pod-network","kubeconfig":"/nonexistent/multus.kubeconfig"}"#;
    d.rename_in("00-multus.conf", multus);
    wait_until(
        Duration::from_secs(2),
        || d.effective_with_us().as_deref() == Some("00-multus.conflist"),
        || format!("{:?}\n{}", d.names(), a.log_text()),
    );
    wait_until(
        Duration::from_secs(2),
        || a.ready() == Some(true),
        || a.log_text(),
    );
    let names = d.names();
    assert!(
        !names.iter().any(|n| n.ends_with("interlock.conflist")),
        "owned file placed ahead of multus: {names:?}"
    );
    assert_eq!(
        plugin_types(&d.json("00-multus.conflist")),
        ["multus", "interlock-cni"]
    );
    for (n, body) in [("00-new.conflist", newer), ("10-calico.conflist", CALICO)] {
        assert_eq!(d.read(n).unwrap(), body.as_bytes(), "{n} changed");
    }
    drop(a);
    d.uninstall();
    assert_eq!(d.read("00-multus.conf").unwrap(), multus.as_bytes());
}

#[test]
fn primary_subnet_change_is_followed_every_time() {
    // Every one of 30 changes is followed (within the 2 s bound); the latency itself is
    // measured by `interlock-bench repair --scenario follow`, not asserted here.
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    let a = d.agent(&[]);
    wait_protected(&d, &a);
    let mut lat = vec![];
    for i in 0..30u32 {
        let subnet = format!("10.99.{}.0/24", 40 + i);
        d.rename_in("10-calico.conflist", &calico_with(&subnet, 1440));
        let t0 = Instant::now();
        wait_until(
            Duration::from_secs(2),
            || {
                let e = d.effective();
                e.chosen.is_some_and(|c| {
                    c.list.plugins()[0]["ipam"]["subnet"] == subnet.as_str()
                        && c.list.plugin_types().contains(&"interlock-cni")
                })
            },
            || a.log_text(),
        );
        lat.push(t0.elapsed());
        std::thread::sleep(Duration::from_millis(10));
    }
    lat.sort();
    eprintln!(
        "owned copy followed the primary: median {:?}, max {:?}",
        lat[lat.len() / 2],
        lat[lat.len() - 1]
    );
    assert_owned_copy_of(&d, "00-interlock.conflist", "10-calico.conflist");
}

#[test]
fn two_agents_racing_converge_without_flapping() {
    let d = Dirs::new();
    let a = d.agent(&[]);
    let b = d.agent(&[]);
    d.write("10-calico.conflist", CALICO);
    wait_protected(&d, &a);
    wait_protected(&d, &b);
    for i in 0..20u32 {
        d.rename_in(
            "10-calico.conflist",
            &calico_with(&format!("10.99.{}.0/24", 60 + i), 1440),
        );
        std::thread::sleep(Duration::from_millis(15));
    }
    d.rename_in("00-aaa.conflist", CALICO);
    // Settle: the first 300 ms in which neither agent writes (a loaded machine may need
    // longer than an idle one), then no write at all may follow for a whole second.
    let writes = |x: &Agent| x.metric("interlock_config_writes_total").unwrap();
    let settle = Instant::now();
    let (mut wa, mut wb) = (writes(&a), writes(&b));
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = (writes(&a), writes(&b));
        if now == (wa, wb) {
            break;
        }
        (wa, wb) = now;
        assert!(
            settle.elapsed() < Duration::from_secs(10),
            "agents still writing after 10 s: flapping"
        );
    }
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(
        (writes(&a), writes(&b)),
        (wa, wb),
        "agents keep rewriting: flapping"
    );
    assert_eq!(
        d.effective_with_us().as_deref(),
        Some("0-interlock.conflist")
    );
    assert_eq!(
        d.names(),
        [
            "0-interlock.conflist",
            "00-aaa.conflist",
            "10-calico.conflist"
        ]
    );
    assert_owned_copy_of(&d, "0-interlock.conflist", "00-aaa.conflist");
    assert_eq!((a.ready(), b.ready()), (Some(true), Some(true)));
    for x in [&a, &b] {
        let m = x.get("/metrics").unwrap().1;
        assert!(
            !m.contains("interlock_config_backoff{"),
            "back-off between identical agents: {m}\nlog of the first agent:\n{}\nlog of the second:\n{}",
            a.log_text(),
            b.log_text()
        );
    }
}

#[test]
fn readyz_flips_when_a_foreign_file_takes_first_place_and_back_after() {
    // Each flip must happen within the 2 s bound; the latency itself is measured by
    // `interlock-bench repair --scenario readyz`, not asserted here.
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    let a = d.agent(&[]);
    wait_protected(&d, &a);
    // A name nothing of ours can sort before: the foreign file really takes first place.
    let (mut downs, mut ups) = (vec![], vec![]);
    for _ in 0..7 {
        let t0 = Instant::now();
        d.rename_in("\u{1}first.conflist", CALICO);
        wait_until(
            Duration::from_secs(2),
            || a.ready() == Some(false),
            || a.log_text(),
        );
        downs.push(t0.elapsed());
        let body = a.get("/readyz").unwrap().1;
        assert!(body.contains("first.conflist"), "{body}");
        let t1 = Instant::now();
        std::fs::remove_file(d.conf.join("\u{1}first.conflist")).unwrap();
        wait_until(
            Duration::from_secs(2),
            || a.ready() == Some(true),
            || a.log_text(),
        );
        ups.push(t1.elapsed());
    }
    downs.sort();
    ups.sort();
    eprintln!("/readyz 503 after {downs:?}; 200 again after {ups:?}");
    // A foreign writer replacing our own file: repaired, and readiness was lost meanwhile
    // for at most the repair (the transition counter shows it happened).
    let before = a.metric("interlock_not_ready_transitions_total").unwrap();
    let stripped = without_us(&d.json("00-interlock.conflist"));
    d.rename_in("00-interlock.conflist", &stripped.to_string());
    wait_until(
        Duration::from_secs(2),
        || d.effective_with_us().is_some() && a.ready() == Some(true),
        || a.log_text(),
    );
    wait_until(
        Duration::from_secs(2),
        || a.metric("interlock_not_ready_transitions_total").unwrap() > before,
        || "the repair did not pass through not-ready".into(),
    );
}

#[test]
fn plugin_binary_is_reinstalled_when_removed_or_replaced() {
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    let a = d.agent(&[]);
    wait_protected(&d, &a);
    let p = d.bin.join("interlock-cni");
    let good = std::fs::read(&p).unwrap();
    assert_eq!(good, std::fs::read(plugin()).unwrap());
    std::fs::remove_file(&p).unwrap();
    wait_until(
        Duration::from_secs(2),
        || std::fs::read(&p).is_ok_and(|b| b == good),
        || a.log_text(),
    );
    wait_until(
        Duration::from_secs(2),
        || a.metric("interlock_plugin_installs_total").unwrap() >= 2.0,
        || a.log_text(),
    );
    std::fs::write(&p, b"#!/bin/sh\nexit 0\n").unwrap();
    wait_until(
        Duration::from_secs(2),
        || std::fs::read(&p).is_ok_and(|b| b == good),
        || a.log_text(),
    );
    wait_until(
        Duration::from_secs(2),
        || a.ready() == Some(true),
        || a.log_text(),
    );
    // Install, reinstall after removal, reinstall after replacement (the counter moves
    // after the VERSION check that follows the rename, so wait for it).
    wait_until(
        Duration::from_secs(2),
        || a.metric("interlock_plugin_installs_total").unwrap() >= 3.0,
        || a.log_text(),
    );
}

/// The agent replaces any interlock-cni that is not its own build byte for byte: another
/// build already in the bin dir when it starts (a previous release's: it still answers
/// VERSION), and one of the same size put in while it runs (one byte differs), are both
/// replaced by its own.
#[test]
fn another_build_in_the_bin_dir_is_replaced_byte_for_byte() {
    use std::os::unix::fs::PermissionsExt;
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    let ours = std::fs::read(plugin()).unwrap();
    let p = d.bin.join("interlock-cni");
    let put = |bytes: &[u8]| {
        let tmp = d.bin.join(".other-build.tmp");
        std::fs::write(&tmp, bytes).unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&tmp, &p).unwrap();
    };
    let mut longer = ours.clone();
    longer.extend_from_slice(b"\n# another build\n");
    put(&longer);
    let a = d.agent(&[]);
    wait_protected(&d, &a);
    assert!(std::fs::read(&p).unwrap() == ours, "the other build stayed");
    let mut same_size = ours.clone();
    let i = same_size.len() / 2;
    same_size[i] ^= 0x01;
    put(&same_size);
    wait_until(
        Duration::from_secs(10),
        || std::fs::read(&p).is_ok_and(|b| b == ours),
        || format!("a build of the same size stayed; log:\n{}", a.log_text()),
    );
    wait_until(
        Duration::from_secs(10),
        || a.metric("interlock_plugin_installs_total").unwrap() >= 2.0,
        || a.log_text(),
    );
}

/// STATUS says whether an ADD could protect a meshed pod, not whether the agent runs
/// (issue 10): the plugin protects pods without the agent, so STATUS stays 0 after the
/// agent is killed (a failing STATUS would make containerd evict the node's pods).
#[test]
fn status_stays_ready_when_the_agent_is_gone() {
    let Some(real) = real_plugin() else {
        eprintln!("SKIP status test: the real interlock-cni is not built next to interlock (cargo build -p interlock-cni)");
        return;
    };
    let _ = real;
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    let a = d.agent(&["--marker-stale-ms", "300"]);
    let eff = wait_protected(&d, &a);
    let status = || {
        let list = d.json(&eff);
        let mut conf = list["plugins"].as_array().unwrap().last().unwrap().clone();
        conf["name"] = list["name"].clone();
        conf["cniVersion"] = json!("1.1.0");
        let mut c = std::process::Command::new(d.bin.join("interlock-cni"))
            .env("CNI_COMMAND", "STATUS")
            .env("CNI_PATH", &d.bin)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        use std::io::Write;
        c.stdin
            .take()
            .unwrap()
            .write_all(conf.to_string().as_bytes())
            .unwrap();
        let o = c.wait_with_output().unwrap();
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
        )
    };
    let (ok, out) = status();
    assert!(ok, "STATUS failed while the agent is ready: {out}");
    a.kill9();
    std::thread::sleep(Duration::from_millis(400));
    let (ok, out) = status();
    assert!(ok, "STATUS failed with the agent gone: {out}");
}

#[test]
fn conf_dir_removed_and_recreated_is_watched_again() {
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    let a = d.agent(&["--resync-seconds", "3600"]);
    wait_protected(&d, &a);
    // The agent answers each removal by putting its holding config back, so a single
    // remove_dir_all can meet a file it did not list (ENOTEMPTY): retry until it is gone.
    wait_until(
        Duration::from_secs(2),
        || match std::fs::remove_dir_all(&d.conf) {
            Ok(()) => true,
            Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        },
        || a.log_text(),
    );
    wait_until(
        Duration::from_secs(2),
        || a.ready() == Some(false),
        || a.log_text(),
    );
    std::fs::create_dir(&d.conf).unwrap();
    d.write("10-calico.conflist", CALICO);
    assert_eq!(wait_protected(&d, &a), "00-interlock.conflist");
    // And the new directory is really watched: a clobber is repaired without a resync.
    std::fs::remove_file(d.conf.join("00-interlock.conflist")).unwrap();
    wait_until(
        Duration::from_secs(2),
        || d.effective_with_us().is_some(),
        || a.log_text(),
    );
    assert!(a.log_text().contains("watching"), "{}", a.log_text());
}

#[test]
fn crio_rules_skip_unusable_files_and_own_writes_do_not_loop() {
    let d = Dirs::new();
    // CRI-O skips a list whose plugin binary is missing (containerd would fail on it).
    let nobin = r#"{"cniVersion":"0.4.0","name":"ghost","plugins":[{"type":"ilghost"}]}"#;
    d.write("00-aaa.conflist", nobin);
    d.write("10-calico.conflist", CALICO);
    let a = d.agent(&["--runtime", "crio"]);
    wait_until(
        Duration::from_secs(5),
        || a.ready() == Some(true),
        || a.log_text(),
    );
    let eff = interlock_confdir::load(
        &d.conf,
        interlock_confdir::Runtime::Crio,
        std::slice::from_ref(&d.bin),
    )
    .unwrap();
    let chosen = eff.chosen.unwrap();
    assert_eq!(chosen.path.file_name().unwrap(), "0-interlock.conflist");
    assert_owned_copy_of(&d, "0-interlock.conflist", "10-calico.conflist");
    assert_eq!(d.read("00-aaa.conflist").unwrap(), nobin.as_bytes());
    // Converged: our own writes do not wake a repair loop. On a loaded machine the
    // wakes of the agent's own start-up writes may still be in flight, so wait for a
    // whole second without a reconcile; a loop never gets one.
    let counts = || {
        (
            a.metric("interlock_config_writes_total").unwrap(),
            a.metric("interlock_config_reconciles_total").unwrap(),
        )
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut before = counts();
    let writes_when_ready = before.0;
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let now = counts();
        if now == before {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "writes or reconciles kept happening for 30 s: {before:?} -> {now:?}; log:\n{}",
            a.log_text()
        );
        before = now;
    }
    assert_eq!(
        before.0,
        writes_when_ready,
        "the agent wrote again after it was ready; log:\n{}",
        a.log_text()
    );
}

const AWS_CONF: &str = "{ \"cniVersion\": \"0.3.1\", \"name\": \"ilaws\",\n  \"type\": \"bridge\", \"bridge\": \"ilaws0\",\n  \"ipam\": {\"type\": \"host-local\", \"subnet\": \"10.99.20.0/24\"} }\n";

/// An agent killed between writing `10-aws.conflist` and moving `10-aws.conf` away leaves
/// both in place without a backup. The next agent must finish the wrap and become ready.
#[test]
fn chain_mode_wrap_interrupted_by_a_crash_is_finished_by_the_next_agent() {
    let d = Dirs::new();
    d.write("10-aws.conf", AWS_CONF);
    let a = d.agent(&["--config-mode", "chain"]);
    assert_eq!(wait_protected(&d, &a), "10-aws.conflist");
    a.kill9();
    // Put the directory back into the state between the two steps of the wrap.
    std::fs::rename(
        d.conf.join("10-aws.conf.interlock-orig"),
        d.conf.join("10-aws.conf"),
    )
    .unwrap();
    let wrapped = d.read("10-aws.conflist").unwrap();
    assert_eq!(d.names(), ["10-aws.conf", "10-aws.conflist"]);
    let b = d.agent(&["--config-mode", "chain"]);
    assert_eq!(wait_protected(&d, &b), "10-aws.conflist");
    assert_eq!(d.names(), ["10-aws.conf.interlock-orig", "10-aws.conflist"]);
    assert_eq!(d.read("10-aws.conflist").unwrap(), wrapped);
    assert_eq!(
        d.read("10-aws.conf.interlock-orig").unwrap(),
        AWS_CONF.as_bytes()
    );
    assert!(b.terminate().success());
    d.uninstall();
    assert_eq!(d.names(), ["10-aws.conf"]);
    assert_eq!(d.read("10-aws.conf").unwrap(), AWS_CONF.as_bytes());
}

/// After a wrap, the primary writes its own `10-aws.conflist`. `interlock uninstall` must
/// keep it (minus our entry), keep the backup, and say so.
#[test]
fn uninstall_keeps_a_conflist_the_primary_wrote_after_the_wrap() {
    let d = Dirs::new();
    d.write("10-aws.conf", AWS_CONF);
    let a = d.agent(&["--config-mode", "chain"]);
    assert_eq!(wait_protected(&d, &a), "10-aws.conflist");
    assert!(a.terminate().success());
    let theirs = CALICO.replace("k8s-pod-network", "ilaws");
    d.rename_in("10-aws.conflist", &theirs);
    let b = d.agent(&["--config-mode", "chain"]);
    assert_eq!(wait_protected(&d, &b), "10-aws.conflist");
    assert!(b.terminate().success());
    let out = d.uninstall();
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        d.names(),
        ["10-aws.conf.interlock-orig", "10-aws.conflist"],
        "{said}"
    );
    let expect: Value = serde_json::from_str(&theirs).unwrap();
    assert_eq!(d.json("10-aws.conflist"), expect, "{said}");
    assert_eq!(
        d.read("10-aws.conf.interlock-orig").unwrap(),
        AWS_CONF.as_bytes()
    );
    assert!(
        said.contains("kept 10-aws.conf.interlock-orig"),
        "uninstall does not say what happened to the backup: {said}"
    );
}

/// A `.conf` without cniVersion (libcni: 0.1.0) or at 0.2.0 would make interlock-cni refuse
/// every ADD. Chain mode raises it when every plugin supports a version interlock-cni
/// accepts; otherwise the agent stays not-ready and names the file and the version.
#[test]
fn old_cni_version_is_raised_or_reported_in_chain_and_owned_mode() {
    let d = Dirs::new();
    let conf = AWS_CONF.replace("\"cniVersion\": \"0.3.1\", ", "");
    d.write("10-aws.conf", &conf);
    let a = d.agent(&["--config-mode", "chain"]);
    assert_eq!(wait_protected(&d, &a), "10-aws.conflist");
    let w = d.json("10-aws.conflist");
    let v = w["cniVersion"].as_str().unwrap().to_string();
    assert!(
        v.parse::<interlock_cni_types::CniVersion>().is_ok(),
        "wrapped at {v}"
    );
    assert!(a.terminate().success());
    d.uninstall();
    assert_eq!(d.read("10-aws.conf").unwrap(), conf.as_bytes());

    // A primary plugin that only speaks 0.1.0/0.2.0: nothing to raise to.
    let old = d.bin.join("ilold");
    std::fs::write(
        &old,
        "#!/bin/sh\necho '{\"cniVersion\":\"0.2.0\",\"supportedVersions\":[\"0.1.0\",\"0.2.0\"]}'\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o755)).unwrap();
    let conf = r#"{"cniVersion":"0.2.0","name":"ilold","type":"ilold"}"#;
    std::fs::remove_file(d.conf.join("10-aws.conf")).unwrap();
    d.write("10-old.conf", conf);
    // Each agent reports the old file and its version, and stays unready.
    let refuses_old = |x: &Agent| {
        wait_until(
            Duration::from_secs(5),
            || {
                x.get("/readyz").is_some_and(|(code, body)| {
                    code == 503 && body.contains("10-old.conf") && body.contains("0.2.0")
                })
            },
            || format!("{:?}\nlog:\n{}", x.get("/readyz"), x.log_text()),
        );
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(x.ready(), Some(false));
    };
    let b = d.agent(&["--config-mode", "chain"]);
    refuses_old(&b);
    assert_eq!(d.names(), ["10-old.conf"], "nothing wrapped");
    assert_eq!(d.read("10-old.conf").unwrap(), conf.as_bytes());
    let m: Value =
        serde_json::from_slice(&std::fs::read(d.state.join("agent-ready.json")).unwrap()).unwrap();
    assert_eq!(m["ready"], false);
    assert!(m["reason"].as_str().unwrap().contains("10-old.conf"), "{m}");
    // Owned mode gives the same guarantee: no copy at a version interlock-cni refuses.
    assert!(b.terminate().success());
    let c = d.agent(&[]);
    refuses_old(&c);
    assert_eq!(d.names(), ["10-old.conf"], "no owned copy written");
}

/// `--plugin-config` settings are merged into the entry the agent writes, and that merged
/// entry is what counts as "ours" (not reverted as differing).
#[test]
fn plugin_config_is_merged_into_our_entry() {
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    let pc = d.tmp.path().join("plugin.json");
    std::fs::write(
        &pc,
        r#"{"excludeNamespaces": ["kube-system", "ilns"], "failurePolicy": "open", "logLevel": "debug"}"#,
    )
    .unwrap();
    let a = d.agent(&["--plugin-config", pc.to_str().unwrap()]);
    let want = |v: &Value| {
        let e = v["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["type"] == "interlock-cni")
            .cloned();
        e.filter(|e| {
            e["excludeNamespaces"] == json!(["kube-system", "ilns"])
                && e["failurePolicy"] == "open"
                && e["logLevel"] == "debug"
                && e["stateDir"] == d.state.display().to_string()
                && e["capabilities"]["io.kubernetes.cri.pod-annotations"] == true
        })
    };
    wait_until(
        Duration::from_secs(10),
        || {
            a.ready() == Some(true)
                && d.effective()
                    .chosen
                    .is_some_and(|c| want(&Value::Object(c.list.raw().clone())).is_some())
        },
        || format!("{:?}\nlog:\n{}", d.names(), a.log_text()),
    );
    let chosen = d.effective().chosen.unwrap();
    assert_eq!(
        chosen.path.file_name().unwrap().to_str().unwrap(),
        "00-interlock.conflist"
    );
    // The plugin itself accepts the merged entry.
    let entry = want(&Value::Object(chosen.list.raw().clone())).unwrap();
    let c = interlock_contract::PluginConfig::from_map(entry.as_object().unwrap()).unwrap();
    assert!(c.is_excluded("ilns"));
    // Stable: the merged entry is ours, so nothing is rewritten. (On a loaded machine a
    // write already under way can land late: wait until the count rests, then require
    // that it stays.)
    let writes = || a.metric("interlock_config_writes_total").unwrap();
    let start = std::time::Instant::now();
    let mut settled = writes();
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let now = writes();
        if now == settled {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the agent keeps rewriting its own merged entry: {now} writes\n{}",
            a.log_text()
        );
        settled = now;
    }
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(writes(), settled, "{}", a.log_text());
    // A plain entry written by someone else is repaired back to the merged one.
    let mut v = d.json("00-interlock.conflist");
    let plain = Value::Object(interlock_agent::plugin_entry(&d.state));
    *v["plugins"].as_array_mut().unwrap().last_mut().unwrap() = plain;
    d.rename_in("00-interlock.conflist", &v.to_string());
    wait_until(
        Duration::from_secs(5),
        || want(&d.json("00-interlock.conflist")).is_some() && a.ready() == Some(true),
        || a.log_text(),
    );
}

/// An invalid `--plugin-config` stops the agent at startup with the file and field named.
#[test]
fn invalid_plugin_config_exits_naming_file_and_field() {
    let d = Dirs::new();
    for (body, field) in [
        (r#"{"failurePolicy": "sometimes"}"#, "failurePolicy"),
        (
            r#"{"excludeNamespaces": "kube-system"}"#,
            "excludeNamespaces",
        ),
        (
            r#"{"excludeNamespace": ["kube-system"]}"#,
            "excludeNamespace",
        ),
        (r#"{"stateDir": "/elsewhere"}"#, "stateDir"),
        ("[1]", "JSON object"),
        ("{", "not valid JSON"),
    ] {
        let pc = d.tmp.path().join("bad-plugin.json");
        std::fs::write(&pc, body).unwrap();
        let mut out = d
            .interlock("agent")
            .arg("--kube=none")
            .arg("--plugin-source")
            .arg(plugin())
            .arg("--health-addr")
            .arg("127.0.0.1:0")
            .arg("--plugin-config")
            .arg(&pc)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(d.tmp.path().join("bad.log")).unwrap())
            .spawn()
            .unwrap();
        let start = Instant::now();
        let status = loop {
            if let Some(s) = out.try_wait().unwrap() {
                break s;
            }
            if start.elapsed() > Duration::from_secs(10) {
                let _ = out.kill();
                let _ = out.wait();
                panic!("{body}: the agent kept running with an invalid --plugin-config");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let err = std::fs::read_to_string(d.tmp.path().join("bad.log")).unwrap();
        assert!(!status.success(), "{body}: agent succeeded: {err}");
        assert!(
            err.contains(pc.to_str().unwrap()) && err.contains(field),
            "{body}: error does not name the file and {field}: {err}"
        );
    }
    assert!(d.names().is_empty(), "nothing written: {:?}", d.names());
}

/// Two agents with different flags on one conf dir: A in owned mode, B in chain mode.
///
/// Designed behaviour: B (chain) removes owned files as part of its plan, A (owned)
/// writes `00-interlock.conflist` back. A counts each removal as a conflict on its file and,
/// past the conflict threshold, backs off (1 s, then doubling), stays not-ready and
/// names `00-interlock.conflist` (log, `/readyz`, `interlock_config_backoff`). B does not
/// count A's file as a conflict (it carries the same entry), keeps its entry in the
/// primary's file and stays ready. So the writes are bounded (no spinning), and the
/// effective config carries interlock-cni the whole time: either A's copy or B's chained
/// primary.
#[test]
fn owned_and_chain_agents_on_one_dir_back_off_and_keep_interlock_effective() {
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    let a = d.agent(&[]);
    assert_eq!(wait_protected(&d, &a), "00-interlock.conflist");
    let b = d.agent(&["--config-mode", "chain"]);
    // A notices the conflict and backs off, naming the file.
    wait_until(
        Duration::from_secs(5),
        || {
            a.get("/readyz").is_some_and(|(c, body)| {
                c == 503 && body.contains("backing off") && body.contains("00-interlock.conflist")
            })
        },
        || {
            format!(
                "owned agent did not back off: {:?}\nA log:\n{}\nB log:\n{}",
                a.get("/readyz"),
                a.log_text(),
                b.log_text()
            )
        },
    );
    assert!(a
        .get("/metrics")
        .unwrap()
        .1
        .contains("interlock_config_backoff{file=\"00-interlock.conflist\"} 1"));
    // Over the next seconds: interlock stays effective at every sample, and the number
    // of writes stays bounded (an unchecked conflict would be thousands per second).
    let writes = |x: &Agent| x.metric("interlock_config_writes_total").unwrap();
    let w0 = writes(&a) + writes(&b);
    let start = Instant::now();
    let mut samples = 0;
    while start.elapsed() < Duration::from_secs(3) {
        let e = d.effective();
        let chosen = e.chosen.as_ref().map(|c| c.path.clone());
        assert!(
            d.effective_with_us().is_some(),
            "effective config {chosen:?} lacks interlock: {}\n{:?}",
            e.summary,
            d.names()
        );
        samples += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    let w1 = writes(&a) + writes(&b);
    eprintln!(
        "{} writes by both agents in 3 s ({samples} samples)",
        w1 - w0
    );
    assert!(
        w1 - w0 <= 150.0,
        "flapping: {} writes in 3 s\nA log:\n{}",
        w1 - w0,
        a.log_text()
    );
    // B holds the primary with our entry and is ready; the primary's data is intact.
    assert_eq!(b.ready(), Some(true), "B: {:?}", b.get("/readyz"));
    let c = d.json("10-calico.conflist");
    assert_eq!(plugin_types(&c), ["bridge", "portmap", "interlock-cni"]);
    let orig: Value = serde_json::from_str(CALICO).unwrap();
    assert_eq!(without_us(&c), orig, "foreign data lost");
    let log = a.log_text();
    assert!(
        log.contains("a fight, most likely") && log.contains("a second interlock agent"),
        "{log}"
    );
}

/// Peak resident memory of `pid` (VmHWM) in KiB.
fn vm_hwm_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// Issue 7 item 4: a FIFO named like a config, a 100 MB stray file, a link to /dev/zero
/// and a plugin slow to answer VERSION neither stall the guard nor blow its memory:
/// deleting the owned config is repaired at once, the peak RSS grows by at most 8 MiB, SIGTERM
/// still stops the agent, and the slow plugin's children are killed.
#[test]
fn hostile_conf_dir_entries_and_a_slow_plugin_do_not_stall_the_guard() {
    use std::os::unix::fs::PermissionsExt;
    let d = Dirs::new();
    let pids = d.tmp.path().join("slow.pids");
    let slow = d.bin.join("slowplug");
    let script = format!(
        "#!/bin/sh\nsleep 10 &\necho $! >> {}\nwait\n",
        pids.display()
    );
    std::fs::write(&slow, script).unwrap();
    std::fs::set_permissions(&slow, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut primary: Value = serde_json::from_str(CALICO).unwrap();
    primary["plugins"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "slowplug"}));
    d.write("10-calico.conflist", &primary.to_string());
    let a = d.agent(&["--resync-seconds", "3600"]);
    let owned = wait_protected(&d, &a);
    // The peak so far: start-up, which holds the plugin binary and reads the installed
    // copy back to verify it (a debug plugin is ~14 MB, so this alone is ~39 MB here; the
    // agent's memory budget is the release build's, measured by `make bench-repair`).
    let before = vm_hwm_kib(a.pid());

    mkfifo(&d.conf.join("99-anything.conflist"));
    std::os::unix::fs::symlink("/dev/zero", d.conf.join("50-zero.conflist")).unwrap();
    let big = format!(
        "{{\"cniVersion\":\"1.0.0\",\"name\":\"big\",\"type\":\"bridge\",\"pad\":\"{}\"}}",
        "A".repeat(100 << 20)
    );
    std::fs::write(d.conf.join("50-big.json"), big).unwrap();
    drop(
        std::fs::File::open(&slow)
            .unwrap()
            .set_modified(std::time::SystemTime::now()),
    );
    std::thread::sleep(Duration::from_millis(300));

    for round in 0..3 {
        std::fs::remove_file(d.conf.join(&owned)).unwrap();
        let t0 = Instant::now();
        wait_until(
            Duration::from_secs(2),
            || d.effective_with_us().as_deref() == Some(owned.as_str()),
            || {
                format!(
                    "round {round}: not repaired within 2 s; log:\n{}",
                    a.log_text()
                )
            },
        );
        eprintln!("round {round}: repaired in {:?}", t0.elapsed());
        wait_until(
            Duration::from_secs(2),
            || a.ready() == Some(true),
            || a.log_text(),
        );
    }
    // Reading the 100 MB file or /dev/zero unbounded would raise the peak by far more
    // than the 1 MiB a config read may take.
    let hwm = vm_hwm_kib(a.pid());
    eprintln!("agent VmHWM {before} KiB before the hostile entries, {hwm} KiB after");
    assert!(
        hwm <= before + 8 * 1024,
        "the hostile entries raised the agent's peak RSS from {before} to {hwm} KiB (> 8 MiB)"
    );

    // The slow plugin was asked (its children recorded) and every child is gone once
    // its time box is over.
    std::thread::sleep(interlock_agent::guard::install::VERSION_TIMEOUT + Duration::from_secs(1));
    let children = std::fs::read_to_string(&pids).unwrap_or_default();
    assert!(!children.is_empty(), "slowplug was never asked for VERSION");
    for pid in children.split_whitespace() {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(
            stat.is_empty() || stat.contains(") Z "),
            "slowplug's child {pid} still runs: {stat}"
        );
    }

    let t0 = Instant::now();
    let status = a.terminate();
    assert!(status.success(), "{status:?}");
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "SIGTERM took {:?}",
        t0.elapsed()
    );
}

/// Issue 7 item 6: the owned config is 0644 and root-owned even when the primary is
/// 0666, and a conf dir writable by others is reported in the log.
#[test]
fn owned_config_is_not_writable_by_others_whatever_the_primary_mode() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    let set = |p: &std::path::Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
    };
    set(&d.conf.join("10-calico.conflist"), 0o666);
    set(&d.conf, 0o777);
    let a = d.agent(&[]);
    let owned = wait_protected(&d, &a);
    let m = std::fs::metadata(d.conf.join(&owned)).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o644, "owned config mode");
    assert_eq!(m.uid(), 0, "owned config owner");
    let log = a.log_text();
    assert!(
        log.contains("conf dir") && log.contains("writable by others") && log.contains("0777"),
        "{log}"
    );
    assert_eq!(
        a.metric("interlock_insecure_dirs"),
        Some(1.0),
        "the insecure conf dir is counted"
    );
    set(&d.conf, 0o755);
}

/// Issue 7 item 9 (L8): `chmod -x` of the installed plugin is repaired on the next
/// event, not at the next resync.
#[test]
fn chmod_x_of_the_installed_plugin_is_noticed_on_the_next_event() {
    use std::os::unix::fs::PermissionsExt;
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    let a = d.agent(&["--resync-seconds", "3600"]);
    wait_protected(&d, &a);
    let p = d.bin.join("interlock-cni");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    wait_until(
        Duration::from_secs(2),
        || std::fs::metadata(&p).is_ok_and(|m| m.permissions().mode() & 0o111 != 0),
        || format!("still not executable; log:\n{}", a.log_text()),
    );
    wait_until(
        Duration::from_secs(2),
        || a.ready() == Some(true),
        || a.log_text(),
    );
}

/// Issue 7 item 9 (L4): neither the agent nor uninstall deletes a file that is only
/// named like interlock's; uninstall removes the one interlock wrote.
#[test]
fn only_interlocks_own_files_are_deleted() {
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    let operator = r#"{"cniVersion":"1.0.0","name":"operator-net","plugins":[{"type":"bridge","bridge":"opbr"}]}"#;
    let other =
        r#"{"cniVersion":"1.0.0","name":"other","plugins":[{"type":"bridge","bridge":"xbr"}]}"#;
    d.write("90-interlock.conflist", operator);
    d.write("interlock.conflist", other);
    let a = d.agent(&[]);
    let owned = wait_protected(&d, &a);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        d.read("90-interlock.conflist").unwrap(),
        operator.as_bytes()
    );
    assert_eq!(d.read("interlock.conflist").unwrap(), other.as_bytes());
    a.terminate();
    d.write("5-interlock.conflist", other);
    let out = d.uninstall();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(d.read(&owned).is_none(), "{text}");
    for (n, c) in [
        ("90-interlock.conflist", operator),
        ("interlock.conflist", other),
        ("5-interlock.conflist", other),
    ] {
        assert_eq!(d.read(n).as_deref(), Some(c.as_bytes()), "{n}: {text}");
    }
    assert!(text.contains("kept 5-interlock.conflist"), "{text}");
}

/// Issue 7 item 9 (L5, L6): in chain mode a symlinked primary stays a link and a primary
/// whose name is not UTF-8 gets no lossy twin; both are refused with a reason.
#[test]
fn chain_mode_refuses_a_symlinked_or_non_utf8_primary_with_a_reason() {
    use std::os::unix::ffi::OsStrExt;
    let d = Dirs::new();
    let managed = d.tmp.path().join("managed");
    std::fs::create_dir_all(&managed).unwrap();
    std::fs::write(managed.join("10-calico.conflist"), CALICO).unwrap();
    std::os::unix::fs::symlink(
        managed.join("10-calico.conflist"),
        d.conf.join("10-calico.conflist"),
    )
    .unwrap();
    let a = d.agent(&["--config-mode", "chain"]);
    wait_until(
        Duration::from_secs(5),
        || {
            a.get("/readyz")
                .is_some_and(|(c, b)| c == 503 && b.contains("symbolic link"))
        },
        || format!("no refusal; log:\n{}", a.log_text()),
    );
    let link = std::fs::symlink_metadata(d.conf.join("10-calico.conflist")).unwrap();
    assert!(link.file_type().is_symlink(), "the link was replaced");
    assert_eq!(
        std::fs::read_to_string(managed.join("10-calico.conflist")).unwrap(),
        CALICO
    );
    a.terminate();

    let d = Dirs::new();
    let raw = std::ffi::OsStr::from_bytes(b"10-\xff.conflist");
    std::fs::write(d.conf.join(raw), CALICO).unwrap();
    let a = d.agent(&["--config-mode", "chain"]);
    wait_until(
        Duration::from_secs(5),
        || {
            a.get("/readyz")
                .is_some_and(|(c, b)| c == 503 && b.contains("not valid UTF-8"))
        },
        || format!("no refusal; log:\n{}", a.log_text()),
    );
    assert_eq!(
        std::fs::read_dir(&d.conf).unwrap().count(),
        1,
        "{:?}",
        d.names()
    );
    assert_eq!(std::fs::read(d.conf.join(raw)).unwrap(), CALICO.as_bytes());
}

/// Issue 7 item 4: `uninstall` reads the conf dir the bounded way too — a FIFO and a
/// link to /dev/zero named like configs do not hang it.
#[test]
fn uninstall_is_not_stalled_by_hostile_entries() {
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    let a = d.agent(&[]);
    let owned = wait_protected(&d, &a);
    a.terminate();
    mkfifo(&d.conf.join("99-fifo.json"));
    mkfifo(&d.conf.join("05-fifo.conflist"));
    std::os::unix::fs::symlink("/dev/zero", d.conf.join("50-zero.conflist")).unwrap();
    let mut child = d
        .interlock("uninstall")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(5) {
            let _ = child.kill();
            panic!("uninstall hung on a FIFO in the conf dir");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "{status:?}");
    assert!(d.read(&owned).is_none());
    assert_eq!(d.read("10-calico.conflist").unwrap(), CALICO.as_bytes());
}

/// The primary's conflist with a write counter (a foreign field interlock must carry).
fn calico_counted(n: u32) -> String {
    CALICO.replace(
        "\"zzForeign\"",
        &format!("\"zzWriteCounter\": {n},\n  \"zzForeign\""),
    )
}

/// Chain mode inserts interlock into the primary's own file. A primary that rewrites that
/// file rapidly (renaming a temp file in, like aws-node, or truncating it in place, like
/// Calico) must never have a write lost to an insert made from an older read: after
/// every burst of writes the file holds the writer's last counter and interlock's entry,
/// and no temp file is left behind.
#[test]
fn chain_mode_never_loses_a_primary_write_renamed_or_in_place() {
    for in_place in [false, true] {
        let how = if in_place { "in place" } else { "renamed in" };
        let d = Dirs::new();
        d.write("10-calico.conflist", &calico_counted(0));
        let a = d.agent(&["--config-mode", "chain", "--conflict-threshold", "0"]);
        assert_eq!(wait_protected(&d, &a), "10-calico.conflist");
        let mut n = 0u32;
        for burst in 0..25 {
            // A writer thread: a burst of rewrites 0.3-1 ms apart, each without our entry.
            let conf = d.conf.clone();
            let first = n + 1;
            let writer = std::thread::spawn(move || {
                let mut last = first;
                for i in first..first + 30 {
                    let body = calico_counted(i);
                    let path = conf.join("10-calico.conflist");
                    if in_place {
                        std::fs::write(&path, body).unwrap();
                    } else {
                        let tmp = conf.join(".10-calico.conflist.writer.tmp");
                        std::fs::write(&tmp, body).unwrap();
                        std::fs::rename(&tmp, &path).unwrap();
                    }
                    last = i;
                    std::thread::sleep(Duration::from_micros(300 + 23 * u64::from(i % 31)));
                }
                last
            });
            n = writer.join().unwrap();
            wait_until(
                Duration::from_secs(5),
                || {
                    d.read("10-calico.conflist")
                        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                        .is_some_and(|v| {
                            v["zzWriteCounter"] == n
                                && plugin_types(&v).iter().any(|t| t == "interlock-cni")
                        })
                },
                || {
                    format!(
                        "burst {burst} ({how}): the primary's last write ({n}) was lost or not \
                         followed; the file holds:\n{}\nlog:\n{}",
                        String::from_utf8_lossy(&d.read("10-calico.conflist").unwrap_or_default()),
                        a.log_text()
                    )
                },
            );
        }
        let c = d.json("10-calico.conflist");
        let orig: Value = serde_json::from_str(&calico_counted(n)).unwrap();
        assert_eq!(without_us(&c), orig, "foreign data lost ({how})");
        wait_until(
            Duration::from_secs(2),
            || d.names() == ["10-calico.conflist"],
            || format!("temp files left behind ({how}): {:?}", d.names()),
        );
        assert_eq!(
            a.metric("interlock_errors_total"),
            Some(0.0),
            "{}",
            a.log_text()
        );
    }
}

/// redteam-3 L-3: a state dir another user can write is not ready (the plugin refuses
/// to write its state there), not a warning; once fixed, the agent is ready again.
#[test]
fn a_state_dir_others_can_write_is_not_ready() {
    use std::os::unix::fs::PermissionsExt;
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    std::fs::set_permissions(&d.state, std::fs::Permissions::from_mode(0o777)).unwrap();
    let a = d.agent(&["--resync-seconds", "1"]);
    wait_until(
        Duration::from_secs(10),
        || {
            a.get("/readyz")
                .is_some_and(|(c, b)| c == 503 && b.contains("state dir"))
        },
        || format!("{:?}\n{}", a.get("/readyz"), a.log_text()),
    );
    let (_, body) = a.get("/readyz").unwrap();
    assert!(body.contains("writable by group or others"), "{body}");
    std::fs::set_permissions(&d.state, std::fs::Permissions::from_mode(0o755)).unwrap();
    wait_until(
        Duration::from_secs(10),
        || a.ready() == Some(true),
        || format!("{:?}\n{}", a.get("/readyz"), a.log_text()),
    );
}

/// An agent pointed at a conf dir no runtime reads (as with k3s's path on a stock
/// containerd: here the dir did not even exist, and the runtime's config.toml names
/// another) says so, naming both paths, instead of waiting silently: a WARN at start, its
/// not-ready reason, a hint once the wait for the primary lasted (once), and `interlock
/// check`'s `config.conf-dir-unread`. Pointed at the runtime's dir, nothing is flagged.
#[test]
fn a_conf_dir_no_runtime_reads_is_flagged_naming_both_paths() {
    let d = Dirs::new();
    std::fs::remove_dir(&d.conf).unwrap();
    let real = d.tmp.path().join("runtime-net.d");
    std::fs::create_dir(&real).unwrap();
    let toml = d.tmp.path().join("config.toml");
    std::fs::write(
        &toml,
        format!(
            "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".cni]\n  conf_dir = \"{}\"\n",
            real.display()
        ),
    )
    .unwrap();
    let a = d.agent(&[
        "--runtime-config",
        toml.to_str().unwrap(),
        "--primary-wait-hint-seconds",
        "1",
    ]);
    let named = |s: &str| {
        s.contains(&format!(
            "the CNI conf dir {} is not the one the runtime reads",
            d.conf.display()
        )) && s.contains(&format!("{} reads {}", toml.display(), real.display()))
    };
    wait_until(
        Duration::from_secs(10),
        || {
            a.get("/readyz")
                .is_some_and(|(c, body)| c == 503 && named(&body))
        },
        || format!("{:?}\nlog:\n{}", a.get("/readyz"), a.log_text()),
    );
    assert!(
        a.log_text().lines().any(|l| l.contains("WARN") && named(l)),
        "{}",
        a.log_text()
    );
    // The wait for the primary's first config: said once, with the dir's creation.
    let waited = format!(
        "no primary CNI config has appeared in {} (the agent created it",
        d.conf.display()
    );
    wait_until(
        Duration::from_secs(10),
        || a.log_text().contains(&waited),
        || a.log_text(),
    );
    std::thread::sleep(Duration::from_millis(1500));
    let log = a.log_text();
    let hints = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("waited ") && l.contains(&waited))
        .count();
    assert_eq!(hints, 1, "{log}");
    // ... and the not-ready reason carries it.
    let body = a.get("/readyz").unwrap().1;
    assert!(body.contains(&waited), "{body}");
    // `check`: a warning naming both paths.
    let check = |conf: &std::path::Path| {
        let out = Command::new(interlock())
            .args([
                "check",
                "--cri-endpoint",
                "none",
                "--health-addr",
                "none",
                "-o",
                "json",
            ])
            .arg("--cni-conf-dir")
            .arg(conf)
            .arg("--state-dir")
            .arg(&d.state)
            .arg("--runtime-config")
            .arg(&toml)
            .output()
            .unwrap();
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let doc = check(&d.conf);
    let f = doc["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == "config.conf-dir-unread")
        .unwrap_or_else(|| panic!("{doc}"))
        .clone();
    assert_eq!(f["status"], "warn", "{f}");
    assert!(named(f["message"].as_str().unwrap()), "{f}");
    // The runtime's own dir: nothing to flag.
    let doc = check(&real);
    assert!(
        doc["findings"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["id"] != "config.conf-dir-unread"),
        "{doc}"
    );
}

//! Repair latency of a real `interlock agent`: a foreign writer clobbers the config
//! (temp file + rename, like aws-node), and we measure until the effective config (by
//! `interlock_confdir::load`) carries interlock again. Also prints one JSON
//! line per mode with p50/p99 over every clobber criterion ran, and the agent's idle RSS.
//!
//! Run: `cargo build --release -p interlock && cargo bench -p interlock-bench --bench repair`
//! (the agent is the `interlock` binary next to the bench's target directory).

// criterion_group! generates an undocumented pub fn.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, Criterion};
use interlock_bench::repair as bench;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The real plugin when it is built next to `interlock`; otherwise a stand-in that
/// answers VERSION (the plugin takes no part in a repair, only in install checks).
fn plugin(dir: &std::path::Path) -> PathBuf {
    let real = interlock_bench::default_plugin_path();
    let ok = Command::new(&real)
        .env("CNI_COMMAND", "VERSION")
        .stdin(Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return real;
    }
    let p = dir.join("interlock-cni");
    std::fs::write(
        &p,
        "#!/bin/sh\necho '{\"cniVersion\":\"1.0.0\",\"supportedVersions\":[\"0.3.1\",\"0.4.0\",\"1.0.0\"]}'\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

fn repair(c: &mut Criterion) {
    let exe = bench::default_interlock_path();
    if !exe.is_file() {
        eprintln!(
            "repair bench skipped: {} missing (cargo build --release -p interlock)",
            exe.display()
        );
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let plugin = plugin(tmp.path());
    let mut group = c.benchmark_group("config_repair");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(8))
        .warm_up_time(Duration::from_millis(500));
    for mode in ["chain", "owned"] {
        let mut s = bench::Session::start(&exe, &plugin, mode, tmp.path()).unwrap();
        std::thread::sleep(Duration::from_millis(1000));
        let idle_rss = s.rss_kib();
        let mut samples = vec![];
        group.bench_function(mode, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let d = s.clobber().unwrap();
                    samples.push(d);
                    total += d;
                    // Let the agent settle (its own write wakes it once more).
                    std::thread::sleep(Duration::from_millis(2));
                }
                total
            })
        });
        let mut out = bench::summary(&samples);
        out["mode"] = mode.into();
        out["idle_rss_kib"] = idle_rss.into();
        println!("interlock-repair {out}");
    }
    group.finish();
}

criterion_group!(benches, repair);
criterion_main!(benches);

//! The planner's model of a conf dir must pick the same file as the reference loader
//! (`interlock_protocol::confdir::load`) for both runtimes, on real directories.

use interlock_agent::guard::snapshot;
use interlock_agent::view::{effective, RuntimeKind};
use interlock_protocol::confdir::{load, Runtime};
use std::collections::HashSet;
use std::os::unix::fs::PermissionsExt;

#[test]
fn view_and_loader_agree_on_random_directories() {
    let names = [
        "00-a.conflist",
        "00-z.conf",
        "05-x.json",
        "0.conf",
        "10-calico.conflist",
        "99-last.conflist",
        "-dash.conflist",
        "A.conf",
        "a.conf",
        "b.conf.bak",
        ".hidden.conflist",
    ];
    let bodies = [
        r#"{"cniVersion":"0.3.1","name":"c","plugins":[{"type":"bridge"},{"type":"portmap"}]}"#,
        r#"{"cniVersion":"0.4.0","name":"b","type":"bridge"}"#,
        "{ broken",
        r#"{"cniVersion":"0.4.0","name":"f","plugins":[{"type":"missing-bin"}]}"#,
        r#"{"cniVersion":"0.4.0","name":"f","plugins":[]}"#,
        r#"{"cniVersion":"0.4.0","plugins":[{"type":"bridge"}]}"#,
        r#"{"cniVersion":"1.0.0","name":"x","plugins":[{"type":"bridge","args":5}]}"#,
        r#"{"cniVersion":"9.9","name":"x","plugins":[{"type":"bridge"}]}"#,
    ];
    let bin = tempfile::tempdir().unwrap();
    for p in ["bridge", "portmap"] {
        let f = bin.path().join(p);
        std::fs::write(&f, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let present: HashSet<String> = ["bridge".to_string(), "portmap".to_string()].into();
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..150 {
        let dir = tempfile::tempdir().unwrap();
        for n in names {
            if next() % 3 == 0 {
                std::fs::write(
                    dir.path().join(n),
                    bodies[(next() % bodies.len() as u64) as usize],
                )
                .unwrap();
            }
        }
        let snap = snapshot(dir.path()).unwrap();
        let cands = snap.candidates();
        for (rk, r) in [
            (RuntimeKind::Containerd, Runtime::Containerd),
            (RuntimeKind::Crio, Runtime::Crio),
        ] {
            let ours = effective(&cands, rk, &present).ok().map(|c| c.name.clone());
            let theirs = load(dir.path(), r, &[bin.path().to_path_buf()])
                .unwrap()
                .chosen
                .map(|c| c.path.file_name().unwrap().to_string_lossy().into_owned());
            assert_eq!(
                ours,
                theirs,
                "{rk:?} disagrees on {:?}",
                snap.entries.iter().map(|e| &e.name).collect::<Vec<_>>()
            );
        }
    }
}

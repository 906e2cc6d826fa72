//! Crash safety: `kill -9` the agent at random moments during a stream of repairs, many
//! times, while a poller parses the file the runtime would load. It must never see a
//! partial or invalid file sorting first.

mod common;

use common::*;
use interlock_protocol::conf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

fn xorshift(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

#[test]
fn kill_9_during_repairs_never_exposes_a_partial_first_file() {
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    let stop = Arc::new(AtomicBool::new(false));
    let checked = Arc::new(AtomicU64::new(0));

    // The poller: the first candidate by name, as containerd picks it, must parse.
    let poller = {
        let (conf_dir, stop, checked) = (d.conf.clone(), stop.clone(), checked.clone());
        std::thread::spawn(move || -> Result<(), String> {
            while !stop.load(Ordering::Relaxed) {
                let mut names: Vec<String> = std::fs::read_dir(&conf_dir)
                    .unwrap()
                    .filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| interlock_protocol::confdir::is_config_name(n))
                    .collect();
                names.sort();
                let Some(first) = names.first() else {
                    return Err("the conf dir became empty".into());
                };
                let bytes = match std::fs::read(conf_dir.join(first)) {
                    Ok(b) => b,
                    // Renamed away between listing and reading: not a partial file.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(format!("{first}: {e}")),
                };
                let parsed = if first.ends_with(".conflist") {
                    conf::parse_conflist(&bytes).map(|_| ())
                } else {
                    conf::parse_conf(&bytes).map(|_| ())
                };
                if let Err(e) = parsed {
                    return Err(format!(
                        "invalid first file {first}: {e}: {:?}",
                        String::from_utf8_lossy(&bytes)
                    ));
                }
                checked.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        })
    };

    // The adversary: a stream of clobbers (all atomic, as real installers do them), so
    // the agent is always in the middle of some repair.
    let adversary = {
        let (conf_dir, stop) = (d.conf.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut seed = 0x1234_5678_9abc_def1u64;
            let mut i = 0u64;
            let put = |name: &str, body: &str| {
                let tmp = conf_dir.join(format!(".{name}.adv.tmp"));
                std::fs::write(&tmp, body).unwrap();
                std::fs::rename(&tmp, conf_dir.join(name)).unwrap();
            };
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                match xorshift(&mut seed) % 4 {
                    0 => put("00-interlock.conflist", CALICO),
                    1 => {
                        let _ = std::fs::remove_file(conf_dir.join("00-interlock.conflist"));
                    }
                    2 => put(
                        "10-calico.conflist",
                        &CALICO.replace("10.99.0.0/24", &format!("10.99.{}.0/24", i % 200)),
                    ),
                    _ => put("10-calico.conflist", CALICO),
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };

    let mut seed = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    let start = Instant::now();
    let mut kills = 0;
    while kills < 40 && start.elapsed() < Duration::from_secs(40) {
        let a = d.agent(&[]);
        std::thread::sleep(Duration::from_micros(xorshift(&mut seed) % 60_000));
        a.kill9();
        kills += 1;
    }
    stop.store(true, Ordering::Relaxed);
    adversary.join().unwrap();
    let verdict = poller.join().unwrap();
    assert!(verdict.is_ok(), "{}", verdict.unwrap_err());
    assert!(kills >= 20, "only {kills} kills");
    assert!(
        checked.load(Ordering::Relaxed) > 1000,
        "poller checked too little"
    );

    // A fresh agent converges and sweeps the temp files the killed ones left behind.
    d.rename_in("10-calico.conflist", CALICO);
    let a = d.agent(&[]);
    assert_eq!(wait_protected(&d, &a), "00-interlock.conflist");
    let names = d.names();
    assert_eq!(
        names,
        ["00-interlock.conflist", "10-calico.conflist"],
        "left-overs: {names:?}"
    );
    assert_eq!(d.read("10-calico.conflist").unwrap(), CALICO.as_bytes());
    eprintln!(
        "{kills} kills, {} first-file checks, none invalid",
        checked.load(Ordering::Relaxed)
    );
}

//! `/readyz` tells the truth when the config guard cannot run (issue 7 item 4, review H3):
//! a FIFO named like a config can block a guard that opens it. Whether or not the guard
//! blocks on it, `/readyz` must never say 200 while the owned config is missing for
//! longer than a repair takes, and SIGTERM must stop the agent.

use crate::common;

use common::*;
use std::time::{Duration, Instant};

#[test]
fn readyz_is_never_200_while_the_guard_cannot_repair() {
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    let a = d.agent(&[]);
    assert_eq!(wait_protected(&d, &a), "00-interlock.conflist");
    // Sorts last: the runtime never reads it, but a guard that opens it blocks.
    let fifo = d.conf.join("99-anything.conflist");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    std::thread::sleep(Duration::from_millis(300));
    std::fs::remove_file(d.conf.join("00-interlock.conflist")).unwrap();
    let t0 = Instant::now();
    // 3 s without a pass makes /readyz stale; check past it.
    let mut saw_stale = false;
    while t0.elapsed() < Duration::from_secs(5) {
        let present = d.effective_with_us().is_some();
        let (code, body) = a.get("/readyz").expect("/readyz answers");
        if !present && t0.elapsed() > Duration::from_millis(3_500) {
            assert_eq!(
                code,
                503,
                "owned config missing for {:?} but /readyz says {body}",
                t0.elapsed()
            );
            assert!(body.contains("has not completed a pass"), "{body}");
            saw_stale = true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if saw_stale {
        // The agent must still stop on SIGTERM with its guard blocked.
        let t0 = Instant::now();
        let status = a.terminate();
        assert!(status.success(), "{status:?}");
        assert!(t0.elapsed() < Duration::from_secs(8), "{:?}", t0.elapsed());
        eprintln!(
            "the guard was blocked by the FIFO; /readyz said 503 and SIGTERM stopped the agent"
        );
    } else {
        // A guard that does not block on a FIFO repaired the config and stays ready.
        assert_eq!(
            d.effective_with_us().as_deref(),
            Some("00-interlock.conflist")
        );
        assert_eq!(a.ready(), Some(true), "{}", a.log_text());
        eprintln!("the guard did not block on the FIFO and repaired the config");
    }
    std::fs::remove_file(&fifo).unwrap();
}

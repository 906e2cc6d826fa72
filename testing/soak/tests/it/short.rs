//! The short soak in `make test`: the same run as `make soak` with fewer creations,
//! asserting the same invariants (the report's `ok`) and that the run was not vacuous.

use interlock_soak::chaos::{ChaosKind, ChaosTiming};
use interlock_soak::run::{default_bin_dir, run, SoakOptions};
use interlock_testkit::require_root;

#[test]
fn a_short_soak_keeps_every_invariant() {
    let _turn = crate::one_at_a_time();
    require_root!();
    let bin_dir = default_bin_dir().unwrap_or_else(|| {
        panic!(
            "interlock and interlock-cni not found next to {:?}: build them first \
             (cargo build -p interlock -p interlock-cni; make test does)",
            std::env::current_exe().ok()
        )
    });
    let seed = std::env::var("SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("short soak: seed {seed} (replay with SOAK_SEED={seed})");
    let mut opts = SoakOptions::new(100, seed, &bin_dir);
    opts.resident = 4;
    // Denser chaos than `make soak`, so that every kind happens in a run this short.
    opts.timing = ChaosTiming {
        gap_ms: 100..600,
        hold_ms: 100..1000,
    };
    let report = run(&opts).expect("the soak runs");
    eprintln!("{}", serde_json::to_string_pretty(&report).unwrap());
    eprint!("{}", report.summary());

    assert!(report.ok, "seed {seed}: {:#?}", report.violations);
    // Not vacuous: sandboxes of both kinds ran, every chaos kind happened, the checker
    // saw meshed sandboxes captured and plain ones direct, and the residents were
    // checked at the end.
    let (meshed, plain) = (
        report.sandboxes.created["meshed"],
        report.sandboxes.created["plain"],
    );
    assert_eq!(meshed + plain, 100);
    assert!(meshed > 0 && plain > 0);
    for kind in ChaosKind::OWN {
        assert!(
            report.chaos.events[&kind] >= 1,
            "seed {seed}: no {kind} step"
        );
    }
    assert!(report.checker.probes["meshed"].captured > 0);
    assert!(report.checker.probes["plain"].direct > 0);
    assert!(
        report.final_check.meshed_running >= 1,
        "{:?}",
        report.final_check
    );
    assert_eq!(report.final_check.left_unprotected, 0);
    assert_eq!(
        report.final_check.meshed_redirected,
        report.final_check.meshed_running
    );
    assert_eq!(report.leaks.total(), 0, "{:?}", report.leaks.details);
    // The sentinels started unprotected, and the API showed each one's Event.
    assert!(!report.chaos.sentinels.is_empty());
    for s in &report.chaos.sentinels {
        assert!(s.started_unprotected && s.missing.is_none(), "{s:?}");
        assert!(s.events.iter().any(|r| r == "Repaired"), "{s:?}");
    }
}

/// The control: the same soak without interlock must fail, and for the right reasons —
/// every meshed sandbox seen exposed, none explained by chaos, the residents left
/// unprotected. A checker that cannot see an unprotected sandbox would pass it.
#[test]
fn without_interlock_the_soak_sees_every_meshed_sandbox_exposed() {
    let _turn = crate::one_at_a_time();
    require_root!();
    let bin_dir = default_bin_dir().expect("interlock and interlock-cni built next to the tests");
    let seed = rand::random();
    let mut opts = SoakOptions::new(16, seed, &bin_dir);
    opts.with_interlock = false;
    opts.chaos = Vec::new();
    opts.resident = 2;
    // Long enough for the checker (a round every 250 ms, up to about 800 ms each on a
    // loaded 2-core machine) to see every sandbox at least once before it goes.
    opts.lifetime_ms = 2500..3500;
    let report = run(&opts).expect("the soak runs");
    eprint!("{}", report.summary());
    assert!(!report.ok);
    let meshed = report.sandboxes.created["meshed"];
    assert!(meshed >= 2, "{meshed}");
    assert_eq!(
        report.exposures.sandboxes as u64, meshed,
        "{:#?}",
        report.exposures.list
    );
    assert_eq!(report.checker.probes["meshed"].captured, 0);
    assert_eq!(report.final_check.left_unprotected, 2);
    let invariants: std::collections::BTreeSet<&str> = report
        .violations
        .iter()
        .map(|v| v.invariant.as_str())
        .collect();
    for want in ["unexplained_exposure", "left_unprotected", "vacuous"] {
        assert!(
            invariants.contains(want),
            "{want} missing from {invariants:?}"
        );
    }
    assert_eq!(report.leaks.total(), 0, "{:?}", report.leaks.details);
}

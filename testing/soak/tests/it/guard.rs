//! The short soak in guard mode: istio-cni's stand-ins redirect, interlock guards them
//! (`--config-mode guard --guard-mesh istio`), and the chaos acts on the mesh's
//! installer and plugin as well as on the agent and the primary. The same invariants as
//! `make soak SOAK_ARGS=--guard-mesh=istio`, in under a minute.

use std::time::Duration;

use interlock_contract::guard::GuardedMesh;
use interlock_soak::chaos::{ChaosKind, ChaosTiming};
use interlock_soak::run::{default_bin_dir, run, SoakOptions};
use interlock_testkit::require_root;

#[test]
fn a_short_guard_mode_soak_keeps_every_invariant() {
    let _turn = crate::one_at_a_time();
    require_root!();
    let bin_dir = default_bin_dir().expect("interlock and interlock-cni built next to the tests");
    let seed = std::env::var("SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("short guard soak: seed {seed} (replay with SOAK_SEED={seed})");
    let mut opts = SoakOptions::new(30, seed, &bin_dir).guard(GuardedMesh::Istio);
    assert!(
        opts.mesh_standin.is_file(),
        "{} missing: cargo build -p interlock-mesh-standins",
        opts.mesh_standin.display()
    );
    opts.resident = 3;
    // The kinds guard mode adds and the ones that act on what it guards; the upgrades
    // and containerd restarts are the long soak's (and the owned-mode short soak's).
    // A sentinel alone takes the audit's 30 s wait for a proxy that never listens.
    opts.chaos = vec![
        ChaosKind::InstallerRestart,
        ChaosKind::InstallerKill,
        ChaosKind::TBinaryDelete,
        ChaosKind::AgentKill,
        ChaosKind::PrimaryRewrite,
        ChaosKind::PluginDelete,
        ChaosKind::Sentinel,
    ];
    opts.timing = ChaosTiming {
        gap_ms: 100..500,
        hold_ms: 100..800,
    };
    opts.min_duration = Duration::from_secs(35);
    let report = run(&opts).expect("the soak runs");
    eprint!("{}", report.summary());

    assert!(report.ok, "seed {seed}: {:#?}", report.violations);
    assert_eq!(report.settings.guard_mesh.as_deref(), Some("istio"));
    assert_eq!(report.settings.repair_policy, "restart");
    let (meshed, plain) = (
        report.sandboxes.created["meshed"],
        report.sandboxes.created["plain"],
    );
    assert!(meshed + plain >= 30 && meshed > 0 && plain > 0);
    for kind in &opts.chaos {
        assert!(
            report.chaos.events[kind] >= 1,
            "seed {seed}: no {kind} step"
        );
    }
    // Captured by the mesh's rules, seen by a connection; plain pods went direct.
    assert!(report.checker.probes["meshed"].captured > 0);
    assert!(report.checker.probes["plain"].direct > 0);
    assert!(report.final_check.meshed_running >= 1);
    assert_eq!(
        report.final_check.meshed_redirected,
        report.final_check.meshed_running
    );
    assert_eq!(report.leaks.total(), 0, "{:?}", report.leaks.details);
    // The sentinel ran uncaptured; the audit restarted it and said so, and touched no
    // unmeshed pod.
    assert!(!report.chaos.sentinels.is_empty());
    for s in &report.chaos.sentinels {
        assert!(s.started_unprotected && s.missing.is_none(), "{s:?}");
        assert!(s.events.iter().any(|r| r == "Restarted"), "{s:?}");
    }
    assert!(report.audit.sentinels_acted_on >= 1, "{:?}", report.audit);
    assert_eq!(report.audit.unmeshed_acted_on, 0, "{:?}", report.audit);
}

/// The control: the same mesh without interlock. Each installer restart (SIGTERM: its
/// entry removed from the primary's file, put back by the new installer) lets meshed
/// pods start uncaptured, and the soak must say so. A checker that cannot see a pod the
/// mesh's plugin never ran for would pass this run.
#[test]
fn without_interlock_an_installer_restart_lets_meshed_pods_start_uncaptured() {
    let _turn = crate::one_at_a_time();
    require_root!();
    let bin_dir = default_bin_dir().expect("interlock and interlock-cni built next to the tests");
    let seed = rand::random();
    let mut opts = SoakOptions::new(24, seed, &bin_dir).guard(GuardedMesh::Istio);
    opts.with_interlock = false;
    opts.chaos = vec![ChaosKind::InstallerRestart];
    // The installer is away most of the time, so that meshed pods start meanwhile.
    opts.timing = ChaosTiming {
        gap_ms: 300..600,
        hold_ms: 1500..2500,
    };
    opts.resident = 2;
    opts.lifetime_ms = 2500..3500;
    opts.min_duration = Duration::from_secs(15);
    let report = run(&opts).expect("the soak runs");
    eprint!("{}", report.summary());

    assert!(!report.ok, "seed {seed}: the control run passed");
    assert!(report.chaos.events[&ChaosKind::InstallerRestart] >= 2);
    // Captured while the installer was there, uncaptured while it was not.
    assert!(report.checker.probes["meshed"].captured > 0);
    assert!(report.exposures.sandboxes >= 1, "{:?}", report.exposures);
    let unexplained: Vec<_> = report
        .violations
        .iter()
        .filter(|v| v.invariant == "unexplained_exposure")
        .collect();
    assert!(!unexplained.is_empty(), "{:#?}", report.violations);
    // Nothing was refused for the mesh: nobody held the pods back.
    assert!(
        !report
            .sandboxes
            .failure_reasons
            .keys()
            .any(|r| r.starts_with("guard mode held")),
        "{:?}",
        report.sandboxes.failure_reasons
    );
    assert_eq!(report.leaks.total(), 0, "{:?}", report.leaks.details);
}

//! The judgement on every case `check` meets, and the human output as a snapshot.

use super::judge::*;
use super::report::*;
use super::*;
use interlock_confdir::{Binaries, Snapshot};

fn judge_full(o: &Observed<'_>) -> (bool, String, Vec<Finding>) {
    let j = judge(o);
    (j.verdict == Verdict::Protected, j.summary, j.findings)
}

const NO_DIRS: &[PathBuf] = &[];

fn judge_at(
    effective: &Effective,
    binary: Option<&BinaryFacts>,
    marker: Result<&ReadinessMarker, String>,
    now_ms: u64,
    readyz: Option<u16>,
) -> (bool, String, Vec<Finding>) {
    let readyz = readyz.map(Readyz::Answered).unwrap_or(Readyz::NotAsked);
    judge_full(&Observed {
        effective,
        binary,
        bin_dirs: NO_DIRS,
        marker,
        now_ms,
        readyz: &readyz,
        missing_plugins: &[],
        stale: None,
        sandboxes: &SandboxesSeen::NotAsked,
        cri_endpoint: "none",
        namespace: crate::check::cluster::DEFAULT_NAMESPACE,
        copied_from: None,
        unread_conf_dir: None,
        agent_version: None,
    })
}

/// The conf dir `files` as containerd loads it, under `dir` (nothing on disk).
fn effective_in(dir: &str, files: &[(&str, &str)]) -> Effective {
    let mut snap = Snapshot::from_files(files, 0o644);
    snap.dir = dir.into();
    let present = |_: &str| true;
    confdir::effective(
        &snap,
        Runtime::Containerd,
        &Binaries {
            dirs: &[],
            present: &present,
            versions: None,
        },
    )
}

fn effective(files: &[(&str, &str)]) -> ((), Effective) {
    ((), effective_in("/etc/cni/net.d", files))
}

fn marker(ready: bool, age_ms: u64, now: u64) -> ReadinessMarker {
    ReadinessMarker {
        ready,
        reason: if ready {
            "ok".into()
        } else {
            "10-calico.conflist sorts ahead".into()
        },
        updated_at_ms: now - age_ms,
        stale_after_ms: 3000,
        pid: 42,
        pid_namespace: None,
        config_path: String::new(),
        runtime: None,
        cri_endpoint: None,
        fight: None,
    }
}

const OURS: &str = r#"{"cniVersion":"1.0.0","name":"k8s","plugins":[{"type":"bridge"},{"type":"interlock-cni","capabilities":{"io.kubernetes.cri.pod-annotations":true}}]}"#;
const PRIMARY: &str = r#"{"cniVersion":"1.0.0","name":"k8s","plugins":[{"type":"bridge"}]}"#;

fn bin() -> BinaryFacts {
    BinaryFacts {
        path: "/opt/cni/bin/interlock-cni".into(),
        versions: Ok(vec!["1.0.0".into()]),
        build: Some("0.1.0".into()),
        content: Content::Matches,
        source: Ok("/usr/local/bin/interlock-cni".into()),
        digests: None,
    }
}

fn ids(f: &[Finding]) -> Vec<&'static str> {
    f.iter().map(|x| x.id).collect()
}

#[test]
fn protected_only_when_config_binary_and_agent_agree() {
    let now = 1_000_000;
    let (_d, e) = effective(&[
        ("00-interlock.conflist", OURS),
        ("10-calico.conflist", PRIMARY),
    ]);
    let m = marker(true, 500, now);
    let b = bin();
    let (ok, verdict, f) = judge_at(&e, Some(&b), Ok(&m), now, Some(200));
    assert!(ok, "{f:?}");
    assert!(verdict.starts_with("PROTECTED"));
    assert!(f.iter().all(|x| x.status == Status::Ok), "{f:?}");

    // A foreign file sorting first: the hole the design is about.
    let (_d, e2) = effective(&[
        ("00-calico.conflist", PRIMARY),
        ("01-interlock.conflist", OURS),
    ]);
    let (ok, verdict, f) = judge_at(&e2, Some(&b), Ok(&m), now, Some(200));
    assert!(!ok);
    assert!(verdict.starts_with("UNPROTECTED"), "{verdict}");
    assert_eq!(f[0].status, Status::Fail);
    assert_eq!(f[0].id, "config.no-interlock");
    assert!(
        f[0].message.contains("00-calico.conflist") && f[0].message.contains("NO redirection"),
        "{}",
        f[0].message
    );

    // Stale marker: agent gone.
    let stale = marker(true, 10_000, now);
    let (ok, _, f) = judge_at(&e, Some(&b), Ok(&stale), now, None);
    assert!(!ok);
    assert!(
        f[0].message.contains("gone or hung") && f[0].message.contains("pid 42"),
        "{}",
        f[0].message
    );

    // Not ready, with the agent's reason.
    let nr = marker(false, 100, now);
    let (ok, _, f) = judge_at(&e, Some(&b), Ok(&nr), now, Some(503));
    assert!(!ok);
    assert!(f
        .iter()
        .any(|x| x.message.contains("10-calico.conflist sorts ahead")));
    assert!(f.iter().any(|x| x.message.contains("/readyz answers 503")));

    // Missing binary.
    let (ok, _, f) = judge_at(&e, None, Ok(&m), now, None);
    assert!(!ok);
    assert!(f[0].message.contains("none of the bin dirs"));
}

#[test]
fn broken_first_file_and_plugin_order_are_failures() {
    let now = 1_000_000;
    let m = marker(true, 0, now);
    let b = bin();
    let (_d, e) = effective(&[
        ("00-broken.conflist", "{\"cniVersion\":"),
        ("10-x.conflist", OURS),
    ]);
    let (ok, _, f) = judge_at(&e, Some(&b), Ok(&m), now, None);
    assert!(!ok);
    assert!(f[0].message.contains("has NO network"), "{}", f[0].message);
    // The summary's own words, once (it used to say "has no network: … has NO network").
    assert_eq!(
        f[0].message.matches("network").count(),
        1,
        "{}",
        f[0].message
    );

    let first = r#"{"cniVersion":"1.0.0","name":"k8s","plugins":[{"type":"interlock-cni"},{"type":"bridge"}]}"#;
    let (_d, e) = effective(&[("00-x.conflist", first)]);
    let (ok, _, f) = judge_at(&e, Some(&b), Ok(&m), now, None);
    assert!(!ok);
    assert!(f[0].message.contains("chained after"), "{}", f[0].message);

    let old = r#"{"cniVersion":"0.2.0","name":"k8s","plugins":[{"type":"bridge"},{"type":"interlock-cni"}]}"#;
    let (_d, e) = effective(&[("00-x.conflist", old)]);
    let (ok, _, f) = judge_at(&e, Some(&b), Ok(&m), now, None);
    assert!(!ok);
    assert!(
        f[0].message.contains("\"0.2.0\"") && f[0].message.contains("refuses"),
        "{}",
        f[0].message
    );

    let nocap = r#"{"cniVersion":"1.0.0","name":"k8s","plugins":[{"type":"bridge"},{"type":"interlock-cni"}]}"#;
    let (_d, e) = effective(&[("00-x.conflist", nocap)]);
    let (ok, _, f) = judge_at(&e, Some(&b), Ok(&m), now, None);
    assert!(ok);
    assert!(f
        .iter()
        .any(|x| x.status == Status::Warn && x.message.contains("pod-annotations")));
}

#[test]
fn the_agents_holding_config_is_named_with_what_to_look_at() {
    let now = 1_000_000;
    let m = marker(false, 0, now);
    let b = bin();
    let holding = format!(
        r#"{{"cniVersion":"1.0.0","name":"{}","plugins":[{{"type":"interlock-cni"}}]}}"#,
        interlock_contract::layout::HOLDING_NETWORK
    );
    let (_d, e) = effective(&[("00-interlock.conflist", &holding)]);
    let (ok, _, f) = judge_at(&e, Some(&b), Ok(&m), now, None);
    assert!(!ok);
    assert_eq!(f[0].id, "config.waiting-for-primary", "{f:?}");
    assert!(
        f[0].message.contains("no primary CNI config yet"),
        "{}",
        f[0].message
    );
    assert!(f[0].hint.contains("primary CNI"), "{}", f[0].hint);
}

/// Every verdict has its exit code, and the worst finding decides.
#[test]
fn verdicts_map_to_exit_codes_and_follow_the_worst_finding() {
    let now = 1_000_000;
    let m = marker(true, 0, now);
    let (_d, ours) = effective(&[("00-interlock.conflist", OURS), ("10-c.conflist", PRIMARY)]);
    let (_d, theirs) = effective(&[("10-c.conflist", PRIMARY)]);
    let b = bin();
    let at = |e: &Effective, m: Result<&ReadinessMarker, String>| {
        judge(&Observed {
            effective: e,
            binary: Some(&b),
            bin_dirs: NO_DIRS,
            marker: m,
            now_ms: now,
            readyz: &Readyz::NotAsked,
            missing_plugins: &[],
            stale: None,
            sandboxes: &SandboxesSeen::NotAsked,
            cri_endpoint: "none",
            namespace: crate::check::cluster::DEFAULT_NAMESPACE,
            copied_from: None,
            unread_conf_dir: None,
            agent_version: None,
        })
    };
    assert_eq!(at(&ours, Ok(&m)).verdict.exit_code(), 0);
    // The config carries interlock but nobody keeps it so: at risk.
    let j = at(&ours, Err("no marker".into()));
    assert_eq!((j.verdict, j.verdict.exit_code()), (Verdict::AtRisk, 1));
    assert!(
        j.summary.starts_with("AT RISK: no readiness"),
        "{}",
        j.summary
    );
    // No interlock in the loaded config outranks the agent's absence.
    let j = at(&theirs, Err("no marker".into()));
    assert_eq!(
        (j.verdict, j.verdict.exit_code()),
        (Verdict::Unprotected, 2)
    );
    assert_eq!(
        ids(&j.findings)[..2],
        ["config.no-interlock", "agent.no-marker"]
    );
    let j = could_not_check("check.conf-dir-missing", "x".into(), "y");
    assert_eq!(j.verdict.exit_code(), 3);
}

/// issue 12: the owned copy kept the old pod CIDR after the primary changed, and check
/// said "ok config". What the agent would write is now compared (see `stale_copy`).
#[test]
fn a_stale_owned_copy_is_at_risk_and_names_the_difference() {
    let now = 1_000_000;
    let m = marker(false, 0, now);
    let (_d, e) = effective(&[("00-interlock.conflist", OURS), ("10-c.conflist", PRIMARY)]);
    let s = Stale {
        file: "00-interlock.conflist".into(),
        source: Some("10-c.conflist".into()),
        difference: "plugins[0].ipam.subnet: \"10.250.7.0/24\" → \"10.99.3.0/24\"".into(),
    };
    let b = bin();
    let j = judge(&Observed {
        effective: &e,
        binary: Some(&b),
        bin_dirs: NO_DIRS,
        marker: Ok(&m),
        now_ms: now,
        readyz: &Readyz::NotAsked,
        missing_plugins: &[],
        stale: Some(&s),
        sandboxes: &SandboxesSeen::NotAsked,
        cri_endpoint: "none",
        namespace: crate::check::cluster::DEFAULT_NAMESPACE,
        copied_from: None,
        unread_conf_dir: None,
        agent_version: None,
    });
    assert_eq!(j.verdict, Verdict::AtRisk);
    let f = j.findings.iter().find(|f| f.id == "config.stale").unwrap();
    assert!(
        f.message.contains("10.99.3.0/24") && f.message.contains("from 10-c.conflist"),
        "{}",
        f.message
    );
    assert!(!f.hint.is_empty());
}

#[test]
fn first_difference_names_the_path() {
    let a = serde_json::json!({"plugins": [{"type": "bridge", "ipam": {"ranges": [[{"subnet": "10.250.7.0/24"}]]}}]});
    let b = serde_json::json!({"plugins": [{"type": "bridge", "ipam": {"ranges": [[{"subnet": "10.99.3.0/24"}]]}}]});
    assert_eq!(
        first_difference("", &a, &b).unwrap(),
        "plugins[0].ipam.ranges[0][0].subnet: \"10.250.7.0/24\" → \"10.99.3.0/24\""
    );
    assert_eq!(first_difference("", &a, &a), None);
    let c = serde_json::json!({"plugins": [{"type": "bridge"}, {"type": "portmap"}]});
    let d = serde_json::json!({"plugins": [{"type": "bridge"}]});
    assert_eq!(
        first_difference("", &c, &d).unwrap(),
        "plugins: 2 entries → 1"
    );
}

/// issue 12: the `bridge` plugin renamed `interlock-cni` passed as "ok binary".
#[test]
fn another_binary_at_interlock_cni_is_unprotected() {
    let now = 1_000_000;
    let m = marker(true, 0, now);
    let (_d, e) = effective(&[("00-interlock.conflist", OURS), ("10-c.conflist", PRIMARY)]);
    let run = |b: &BinaryFacts| {
        judge(&Observed {
            effective: &e,
            binary: Some(b),
            bin_dirs: NO_DIRS,
            marker: Ok(&m),
            now_ms: now,
            readyz: &Readyz::NotAsked,
            missing_plugins: &[],
            stale: None,
            sandboxes: &SandboxesSeen::NotAsked,
            cri_endpoint: "none",
            namespace: crate::check::cluster::DEFAULT_NAMESPACE,
            copied_from: None,
            unread_conf_dir: None,
            agent_version: None,
        })
    };
    let impostor = BinaryFacts {
        build: None,
        content: Content::Differs,
        ..bin()
    };
    let j = run(&impostor);
    assert_eq!(j.verdict, Verdict::Unprotected, "{}", j.summary);
    assert_eq!(j.findings[0].id, "binary.not-interlock");
    // Without a source to compare with, the VERSION answer still tells it apart.
    let unverified = BinaryFacts {
        build: None,
        content: Content::Unverified,
        source: Err("no plugin source".into()),
        ..bin()
    };
    assert_eq!(run(&unverified).findings[0].id, "binary.not-interlock");
    // An older interlock build (an upgrade under way): at risk, not a hole.
    let older = BinaryFacts {
        build: Some("0.0.9".into()),
        content: Content::Differs,
        ..bin()
    };
    let j = run(&older);
    assert_eq!(
        (j.verdict, j.findings[0].id),
        (Verdict::AtRisk, "binary.other-build")
    );
    // The same version with other bytes says so, with both digests.
    let rebuilt = BinaryFacts {
        build: Some(interlock_buildinfo::VERSION.to_string()),
        content: Content::Differs,
        digests: Some(("aa11".into(), "bb22".into())),
        ..bin()
    };
    let j = run(&rebuilt);
    assert_eq!(j.findings[0].id, "binary.other-build");
    let m = &j.findings[0].message;
    assert!(
        m.contains("the same version as this interlock, but other bytes")
            && m.contains("sha256 aa11 installed, bb22 shipped"),
        "{m}"
    );
    // Interlock's, but not compared: protected, with a warning that says so.
    let j = run(&BinaryFacts {
        content: Content::Unverified,
        source: Err("no plugin source: /x/interlock-cni does not exist".into()),
        ..bin()
    });
    assert_eq!(j.verdict, Verdict::Protected);
    assert!(j.summary.contains("binary.unverified"), "{}", j.summary);
}

/// issue 12: `portmap`/`bandwidth` missing on containerd passed as "ok config".
#[test]
fn a_missing_primary_plugin_binary_is_at_risk() {
    let now = 1_000_000;
    let m = marker(true, 0, now);
    let (_d, e) = effective(&[("00-interlock.conflist", OURS), ("10-c.conflist", PRIMARY)]);
    let b = bin();
    let missing = vec!["portmap".to_string(), "bandwidth".to_string()];
    let dirs = vec![PathBuf::from("/opt/cni/bin")];
    let j = judge(&Observed {
        effective: &e,
        binary: Some(&b),
        bin_dirs: &dirs,
        marker: Ok(&m),
        now_ms: now,
        readyz: &Readyz::NotAsked,
        missing_plugins: &missing,
        stale: None,
        sandboxes: &SandboxesSeen::NotAsked,
        cri_endpoint: "none",
        namespace: crate::check::cluster::DEFAULT_NAMESPACE,
        copied_from: None,
        unread_conf_dir: None,
        agent_version: None,
    });
    assert_eq!(j.verdict, Verdict::AtRisk);
    assert_eq!(j.findings[0].id, "config.plugin-missing");
    assert!(
        j.findings[0].message.contains("portmap, bandwidth")
            && j.findings[0].message.contains("/opt/cni/bin")
            && j.findings[0].message.contains("no pod can start"),
        "{}",
        j.findings[0].message
    );
}

/// issue 12: `/readyz` unreachable while check said PROTECTED without a word.
#[test]
fn an_unreachable_readyz_is_said_even_when_protected() {
    let now = 1_000_000;
    let m = marker(true, 0, now);
    let (_d, e) = effective(&[("00-interlock.conflist", OURS), ("10-c.conflist", PRIMARY)]);
    let b = bin();
    let r = Readyz::Unreachable("nobody answered at 127.0.0.1:9102: connection refused".into());
    let j = judge(&Observed {
        effective: &e,
        binary: Some(&b),
        bin_dirs: NO_DIRS,
        marker: Ok(&m),
        now_ms: now,
        readyz: &r,
        missing_plugins: &[],
        stale: None,
        sandboxes: &SandboxesSeen::NotAsked,
        cri_endpoint: "none",
        namespace: crate::check::cluster::DEFAULT_NAMESPACE,
        copied_from: None,
        unread_conf_dir: None,
        agent_version: None,
    });
    assert_eq!(j.verdict, Verdict::Protected);
    assert!(
        j.summary.contains("agent.readyz-unreachable"),
        "{}",
        j.summary
    );
    let f = j
        .findings
        .iter()
        .find(|f| f.id == "agent.readyz-unreachable")
        .unwrap();
    assert_eq!(f.status, Status::Warn);
    assert!(f.message.contains("connection refused"), "{}", f.message);
}

/// issue 12: istio-cni or linkerd-cni in the chain with interlock-cni (before or after
/// it) was "PROTECTED"; it is a failure that says what to do.
#[test]
fn another_mesh_plugin_in_the_chain_is_unprotected() {
    let now = 1_000_000;
    let m = marker(true, 0, now);
    let b = bin();
    let ic =
        r#"{"type":"interlock-cni","capabilities":{"io.kubernetes.cri.pod-annotations":true}}"#;
    for mesh in ["istio-cni", "linkerd-cni", "consul-cni", "kuma-cni"] {
        for (what, plugins) in [
            (
                "before",
                format!(r#"{{"type":"bridge"}},{{"type":"{mesh}"}},{ic}"#),
            ),
            (
                "after",
                format!(r#"{{"type":"bridge"}},{ic},{{"type":"{mesh}"}}"#),
            ),
        ] {
            let list = format!(r#"{{"cniVersion":"1.0.0","name":"k8s","plugins":[{plugins}]}}"#);
            let (_d, e) = effective(&[("00-interlock.conflist", &list)]);
            let j = judge(&Observed {
                effective: &e,
                binary: Some(&b),
                bin_dirs: NO_DIRS,
                marker: Ok(&m),
                now_ms: now,
                readyz: &Readyz::NotAsked,
                missing_plugins: &[],
                stale: None,
                sandboxes: &SandboxesSeen::NotAsked,
                cri_endpoint: "none",
                namespace: crate::check::cluster::DEFAULT_NAMESPACE,
                copied_from: None,
                unread_conf_dir: None,
                agent_version: None,
            });
            assert_eq!(
                j.verdict,
                Verdict::Unprotected,
                "{mesh} {what}: {}",
                j.summary
            );
            let f = &j.findings[0];
            assert_eq!(f.id, "config.other-mesh", "{mesh} {what}");
            assert!(
                f.message.contains(mesh) && f.message.contains("twice"),
                "{}",
                f.message
            );
            assert!(f.hint.contains("docs/migration.md"), "{}", f.hint);
        }
        // The mesh alone: its redirection, not interlock's — said as such.
        let list = format!(
            r#"{{"cniVersion":"1.0.0","name":"k8s","plugins":[{{"type":"bridge"}},{{"type":"{mesh}"}}]}}"#
        );
        let (_d, e) = effective(&[("10-c.conflist", &list)]);
        let (_, _, f) = judge_at(&e, Some(&b), Ok(&m), now, None);
        assert!(
            f[0].message
                .contains(&format!("redirected by {mesh}, not by interlock")),
            "{}",
            f[0].message
        );
    }
}

/// Every id has a hint, and ids are unique per finding kind (stable: docs/check.md
/// lists them).
#[test]
fn a_fight_is_a_finding_while_it_lasts_and_a_warning_for_an_hour_after() {
    use interlock_contract::marker::ConfigFight;
    let now = 10_000_000;
    let (_d, e) = effective(&[
        ("00-interlock.conflist", OURS),
        ("05-cilium.conflist", PRIMARY),
    ]);
    let b = bin();
    let fight = ConfigFight {
        file: "00-interlock.conflist".into(),
        conflicts: 9,
        started_at_ms: now - 4_000,
        last_conflict_at_ms: now - 1_000,
        ended_at_ms: None,
        primary: Some("05-cilium.conflist".into()),
        primary_types: vec!["cilium-cni".into()],
    };
    // Going on: at risk, the primary named, Cilium's setting in the hint.
    let mut m = marker(false, 100, now);
    m.fight = Some(fight.clone());
    let (ok, verdict, f) = judge_at(&e, Some(&b), Ok(&m), now, Some(503));
    assert!(!ok && verdict.starts_with("AT RISK"), "{verdict}");
    let x = f
        .iter()
        .find(|x| x.id == "config.fight")
        .expect("no fight finding");
    assert_eq!(x.status, Status::Fail);
    assert!(
        x.message
            .contains("00-interlock.conflist was undone 9 times")
            && x.message.contains("05-cilium.conflist (cilium-cni)"),
        "{}",
        x.message
    );
    assert!(
        x.hint.contains("cni.exclusive=false")
            && x.hint
                .contains("docs/install.md#primaries-that-remove-other-configs"),
        "{}",
        x.hint
    );
    // Over 10 minutes ago, the agent ready again: protected, with a warning that says so.
    let mut m = marker(true, 100, now);
    m.fight = Some(ConfigFight {
        ended_at_ms: Some(now - 600_000),
        ..fight.clone()
    });
    let (ok, verdict, f) = judge_at(&e, Some(&b), Ok(&m), now, Some(200));
    assert!(ok, "{verdict}");
    assert!(verdict.contains("config.recent-fight"), "{verdict}");
    let x = f.iter().find(|x| x.id == "config.recent-fight").unwrap();
    assert_eq!(x.status, Status::Warn);
    assert!(
        x.message.contains("9 times") && x.message.contains("600 s ago"),
        "{}",
        x.message
    );
    // Over for more than an hour: nothing.
    m.fight = Some(ConfigFight {
        ended_at_ms: Some(now - RECENT_FIGHT_MS - 1),
        ..fight
    });
    let (ok, _, f) = judge_at(&e, Some(&b), Ok(&m), now, Some(200));
    assert!(ok && f.iter().all(|x| !x.id.contains("fight")), "{f:?}");
}

#[test]
fn a_conf_dir_the_runtime_does_not_read_is_a_warning_naming_both() {
    let now = 1_000_000;
    let (_d, e) = effective(&[
        ("00-interlock.conflist", OURS),
        ("10-calico.conflist", PRIMARY),
    ]);
    let m = marker(true, 500, now);
    let b = bin();
    let readyz = Readyz::Answered(200);
    let why = "the CNI conf dir /var/lib/rancher/k3s/agent/etc/cni/net.d is not the one the runtime reads: /etc/containerd/config.toml reads /etc/cni/net.d";
    let j = judge(&Observed {
        effective: &e,
        binary: Some(&b),
        bin_dirs: NO_DIRS,
        marker: Ok(&m),
        now_ms: now,
        readyz: &readyz,
        missing_plugins: &[],
        stale: None,
        sandboxes: &SandboxesSeen::NotAsked,
        cri_endpoint: "none",
        namespace: crate::check::cluster::DEFAULT_NAMESPACE,
        copied_from: None,
        unread_conf_dir: Some(why),
        agent_version: None,
    });
    let x = j
        .findings
        .iter()
        .find(|x| x.id == "config.conf-dir-unread")
        .expect("no finding");
    assert_eq!(x.status, Status::Warn);
    assert_eq!(x.message, why);
    assert!(
        x.hint
            .contains("docs/install.md#which-conf-dir-the-runtime-reads"),
        "{}",
        x.hint
    );
    assert!(
        j.summary.contains("config.conf-dir-unread"),
        "{}",
        j.summary
    );
}

#[test]
fn every_failed_or_warned_finding_has_a_hint() {
    let now = 1_000_000;
    let m = marker(false, 0, now);
    let (_d, e) = effective(&[("10-c.conflist", PRIMARY)]);
    let (_, _, f) = judge_at(&e, None, Ok(&m), now, Some(503));
    for x in &f {
        assert!(
            x.status == Status::Ok || !x.hint.is_empty(),
            "{} has no hint",
            x.id
        );
        assert!(x.id.starts_with(x.area), "{}", x.id);
    }
}

fn fixed_report(files: &[(&str, &str)], binary: Option<BinaryFacts>, readyz: Readyz) -> NodeReport {
    let now = 1_795_938_576_042;
    let e = effective_in("/etc/cni/net.d", files);
    let m = marker(true, 400, now);
    let dirs = vec![PathBuf::from("/opt/cni/bin")];
    let j = judge(&Observed {
        effective: &e,
        binary: binary.as_ref(),
        bin_dirs: &dirs,
        marker: Ok(&m),
        now_ms: now,
        readyz: &readyz,
        missing_plugins: &[],
        stale: None,
        sandboxes: &SandboxesSeen::NotAsked,
        cri_endpoint: "none",
        namespace: crate::check::cluster::DEFAULT_NAMESPACE,
        copied_from: None,
        unread_conf_dir: None,
        agent_version: None,
    });
    let mut r = NodeReport::new(
        Parts {
            node: "node-a".into(),
            now_ms: now,
            settings: Settings {
                cni_conf_dir: "/etc/cni/net.d".into(),
                cni_bin_dirs: dirs.clone(),
                state_dir: "/var/run/interlock".into(),
                runtime: "containerd".into(),
                health_addr: "127.0.0.1:9102".into(),
                cni_conf_dir_from: "env",
                cri_endpoint: "none".into(),
                cri_endpoint_from: "flag",
            },
            effective: Some(EffectiveDoc::new(&e, &[], None)),
            binary: binary.as_ref().map(BinaryDoc::from),
            sandboxes: None,
            agent: AgentDoc {
                marker: Some(m),
                marker_error: None,
                readyz: ReadyzDoc::new("127.0.0.1:9102", &readyz),
            },
        },
        j,
    );
    // The build differs per commit; the snapshot pins it.
    r.head.interlock_version = "0.1.0 (git 0123456789ab)";
    r
}

fn rendered(r: &NodeReport, colour: bool) -> String {
    let mut out = Vec::new();
    render(&mut out, r, Style { colour }).unwrap();
    String::from_utf8(out).unwrap()
}

const ISTIO: &str = r#"{"cniVersion":"1.0.0","name":"k8s","plugins":[{"type":"bridge"},{"type":"istio-cni"},{"type":"interlock-cni","capabilities":{"io.kubernetes.cri.pod-annotations":true}}]}"#;

/// The human output, whole: a fixed clock, node and paths.
#[test]
fn human_output_snapshot() {
    let r = fixed_report(
        &[
            ("00-interlock.conflist", OURS),
            ("10-calico.conflist", PRIMARY),
        ],
        Some(bin()),
        Readyz::Answered(200),
    );
    assert_eq!(
        rendered(&r, false),
        "\
interlock check node node-a (2026-11-29T07:49:36.042Z, interlock 0.1.0 (git 0123456789ab))

CNI conf dir /etc/cni/net.d as containerd loads it:
  FILE                   VERDICT      REASON
  00-interlock.conflist  chosen       first config file by name, and valid (plugins: bridge → interlock-cni)
  10-calico.conflist     not-reached  not used: containerd loads only the first config file (00-interlock.conflist sorts first)

        ID             FINDING
  ok    config.loaded  containerd loads 00-interlock.conflist: bridge → interlock-cni
  ok    binary.ok      /opt/cni/bin/interlock-cni is interlock-cni 0.1.0 (answers VERSION: 1.0.0), byte for byte the plugin this interlock ships
  ok    agent.ready    ready (pid 42, marker 0.4 s old)

PROTECTED: a meshed pod started on this node now gets its redirection before it runs
"
    );

    let r = fixed_report(
        &[
            ("00-interlock.conflist", ISTIO),
            ("10-calico.conflist", PRIMARY),
        ],
        Some(bin()),
        Readyz::Unreachable(
            "nobody answered at 127.0.0.1:9102: Connection refused (os error 111)".into(),
        ),
    );
    assert_eq!(
        rendered(&r, false),
        "\
interlock check node node-a (2026-11-29T07:49:36.042Z, interlock 0.1.0 (git 0123456789ab))

CNI conf dir /etc/cni/net.d as containerd loads it:
  FILE                   VERDICT      REASON
  00-interlock.conflist  chosen       first config file by name, and valid (plugins: bridge → istio-cni → interlock-cni)
  10-calico.conflist     not-reached  not used: containerd loads only the first config file (00-interlock.conflist sorts first)

        ID                        FINDING
  FAIL  config.other-mesh         00-interlock.conflist runs istio-cni in the same chain as interlock-cni: each pod's traffic is redirected twice, by two rule sets neither of which knows the other; interlock cannot vouch for the result
                                  hint: remove the mesh's own CNI plugin (its CNI DaemonSet) before relying on interlock: see docs/migration.md
  WARN  agent.readyz-unreachable  /readyz could not be asked: nobody answered at 127.0.0.1:9102: Connection refused (os error 111); the verdict rests on the marker alone
                                  hint: set INTERLOCK_HEALTH_ADDR (or --health-addr) to the agent's health address, or `none` not to ask
  ok    config.loaded             containerd loads 00-interlock.conflist: bridge → istio-cni → interlock-cni
  ok    binary.ok                 /opt/cni/bin/interlock-cni is interlock-cni 0.1.0 (answers VERSION: 1.0.0), byte for byte the plugin this interlock ships
  ok    agent.ready               ready (pid 42, marker 0.4 s old)

UNPROTECTED: 00-interlock.conflist runs istio-cni in the same chain as interlock-cni: each pod's traffic is redirected twice, by two rule sets neither of which knows the other; interlock cannot vouch for the result
"
    );
    // On a terminal: the status and the verdict in colour, nothing else changes.
    let coloured = rendered(&r, true);
    assert!(coloured.contains("\u{1b}[31mFAIL\u{1b}[0m"), "{coloured}");
    assert!(coloured.contains("\u{1b}[1;31mUNPROTECTED"), "{coloured}");
    let plain: String = coloured
        .replace("\u{1b}[31m", "")
        .replace("\u{1b}[33m", "")
        .replace("\u{1b}[32m", "")
        .replace("\u{1b}[1;31m", "")
        .replace("\u{1b}[0m", "");
    assert_eq!(plain, rendered(&r, false));
}

/// The JSON document's shape: versioned, camelCase keys, no Ok/Err wrapping.
#[test]
fn json_document_is_versioned_and_camel_case() {
    let r = fixed_report(
        &[
            ("00-interlock.conflist", OURS),
            ("10-calico.conflist", PRIMARY),
        ],
        Some(BinaryFacts {
            versions: Err("garbage".into()),
            ..bin()
        }),
        Readyz::Answered(200),
    );
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["schemaVersion"], 1);
    assert_eq!(v["kind"], "NodeCheck");
    assert_eq!(v["node"], "node-a");
    assert_eq!(v["checkedAt"], "2026-11-29T07:49:36.042Z");
    assert_eq!(v["verdict"], "at-risk");
    assert_eq!(v["exitCode"], 1);
    assert_eq!(v["binary"]["versionError"], "garbage");
    assert_eq!(v["binary"]["supportedVersions"], Value::Null);
    assert_eq!(v["agent"]["readyz"]["status"], 200);
    assert_eq!(v["effective"]["chosen"]["networkName"], "k8s");
    let text = v.to_string();
    assert!(
        !text.contains("\"Ok\"") && !text.contains("\"Err\""),
        "{text}"
    );
    fn keys(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    // The marker's keys are the agent's contract (camelCase too).
                    out.push(k.clone());
                    keys(x, out);
                }
            }
            Value::Array(a) => a.iter().for_each(|x| keys(x, out)),
            _ => {}
        }
    }
    let mut all = vec![];
    keys(&v, &mut all);
    for k in all {
        assert!(
            !k.contains('_') && !k.contains('-') && k.chars().next().unwrap().is_ascii_lowercase(),
            "key {k:?} is not camelCase"
        );
    }
}

/// The judgement of a protected node (our config, our binary, a fresh marker) with
/// these sandboxes.
fn judge_sandboxes(s: &super::sandboxes::SandboxesSeen) -> Judgement {
    let now = 1_795_938_576_042;
    let e = effective_in("/etc/cni/net.d", &[("00-interlock.conflist", OURS)]);
    let m = marker(true, 400, now);
    let dirs = vec![PathBuf::from("/opt/cni/bin")];
    let b = bin();
    judge(&Observed {
        effective: &e,
        binary: Some(&b),
        bin_dirs: &dirs,
        marker: Ok(&m),
        now_ms: now,
        readyz: &Readyz::NotAsked,
        missing_plugins: &[],
        stale: None,
        sandboxes: s,
        cri_endpoint: "unix:///run/containerd/containerd.sock",
        namespace: crate::check::cluster::DEFAULT_NAMESPACE,
        copied_from: None,
        unread_conf_dir: None,
        agent_version: None,
    })
}

/// The sandboxes as the report lists them: worst first, the unprotected pods named in
/// the finding and the verdict line (exit 2).
#[test]
fn unprotected_sandboxes_make_the_node_unprotected_and_are_named() {
    use super::sandboxes::{doc, SandboxesSeen};
    use interlock_agent::audit::decide::Verdict as V;
    let list = |docs| SandboxesSeen::Listed(docs);
    let bad = V::Unprotected {
        reason: "meshed (istio) but its redirection is not in place: table inet interlock missing"
            .into(),
    };
    let j = judge_sandboxes(&list(vec![
        doc("a1", "shop/web", None, &bad),
        doc("a2", "shop/cart", None, &bad),
        doc(
            "a3",
            "kube-system/dns",
            None,
            &V::NotMeshed {
                reason: "no mesh annotation".into(),
            },
        ),
    ]));
    assert_eq!(j.verdict, Verdict::Unprotected);
    assert_eq!(j.verdict.exit_code(), 2);
    assert!(
        j.summary
            .contains("2 meshed pods are running WITHOUT their redirection: shop/web, shop/cart"),
        "{}",
        j.summary
    );
    let j = judge_sandboxes(&list(vec![doc("a1", "shop/web", None, &V::Protected)]));
    assert_eq!(j.verdict, Verdict::Protected, "{}", j.summary);
    assert!(ids(&j.findings).contains(&"sandboxes.ok"));
    let j = judge_sandboxes(&list(vec![doc(
        "a1",
        "shop/web",
        None,
        &V::Unknown {
            reason: "EPERM".into(),
        },
    )]));
    assert_eq!(j.verdict, Verdict::AtRisk, "{}", j.summary);
    assert!(ids(&j.findings).contains(&"sandboxes.unknown"));
    let j = judge_sandboxes(&SandboxesSeen::Unreachable("connection refused".into()));
    assert_eq!(j.verdict, Verdict::AtRisk, "{}", j.summary);
    assert!(j.summary.contains("unix:///run/containerd/containerd.sock"));
    let j = judge_sandboxes(&SandboxesSeen::NotAsked);
    assert_eq!(j.verdict, Verdict::Protected);
    assert!(!ids(&j.findings).iter().any(|i| i.starts_with("sandboxes")));
}

/// The human output with the sandboxes table, whole.
#[test]
fn human_output_with_sandboxes_snapshot() {
    use super::sandboxes::{doc, SandboxesSeen};
    use interlock_agent::audit::decide::Verdict as V;
    let mut r = fixed_report(
        &[("00-interlock.conflist", OURS)],
        Some(bin()),
        Readyz::NotAsked,
    );
    let docs = vec![
        doc(
            "9f2c41d0a7e3b5c6d8e9f0a1b2c3d4e5",
            "shop/web-7d9f",
            Some(Path::new("/var/run/netns/cni-1")),
            &V::Unprotected {
                reason: "meshed (istio) but its redirection is not in place: table inet interlock missing".into(),
            },
        ),
        doc(
            "0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e",
            "shop/cart-5c4b",
            Some(Path::new("/var/run/netns/cni-2")),
            &V::Protected,
        ),
        doc(
            "77aa88bb99cc00dd11ee22ff33aa44bb",
            "kube-system/coredns-1",
            Some(Path::new("/var/run/netns/cni-3")),
            &V::NotMeshed {
                reason: "no mesh annotation (istio, linkerd, interlock.dev)".into(),
            },
        ),
    ];
    let j = judge_sandboxes(&SandboxesSeen::Listed(docs.clone()));
    r.head = Head::new("NodeCheck", 1_795_938_576_042, j);
    r.head.interlock_version = "0.1.0 (git 0123456789ab)";
    r.sandboxes = Some(docs);
    r.settings.cri_endpoint = "unix:///run/containerd/containerd.sock".into();
    assert_eq!(
        rendered(&r, false),
        "\
interlock check node node-a (2026-11-29T07:49:36.042Z, interlock 0.1.0 (git 0123456789ab))

CNI conf dir /etc/cni/net.d as containerd loads it:
  FILE                   VERDICT  REASON
  00-interlock.conflist  chosen   first config file by name, and valid (plugins: bridge → interlock-cni)

Sandboxes on this node (CRI unix:///run/containerd/containerd.sock):
  POD                    SANDBOX       VERDICT      REASON
  shop/web-7d9f          9f2c41d0a7e3  UNPROTECTED  meshed (istio) but its redirection is not in place: table inet interlock missing
  shop/cart-5c4b         0b1c2d3e4f5a  protected    meshed; its redirection reads back exactly as its spec
  kube-system/coredns-1  77aa88bb99cc  not meshed   no mesh annotation (istio, linkerd, interlock.dev)

        ID                     FINDING
  FAIL  sandboxes.unprotected  1 meshed pod is running WITHOUT its redirection: shop/web-7d9f
                               hint: the agent repairs these per its --repair-policy within one audit interval; if they stay unprotected, read its log (kubectl -n interlock-system logs ds/interlock-node) or delete the pods so they start again through interlock
  ok    config.loaded          containerd loads 00-interlock.conflist: bridge → interlock-cni
  ok    binary.ok              /opt/cni/bin/interlock-cni is interlock-cni 0.1.0 (answers VERSION: 1.0.0), byte for byte the plugin this interlock ships
  ok    agent.ready            ready (pid 42, marker 0.4 s old)

UNPROTECTED: 1 meshed pod is running WITHOUT its redirection: shop/web-7d9f
"
    );
    let coloured = rendered(&r, true);
    assert!(coloured.contains("\u{1b}[31mUNPROTECTED"), "{coloured}");
}

/// `check` names the file interlock's owned config is a copy of: the config with the
/// same network and the same plugins without interlock-cni, whatever else the dir holds.
#[test]
fn the_owned_copy_names_the_file_it_follows() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
    let list = |name: &str, types: &[&str]| {
        let plugins: Vec<serde_json::Value> = types
            .iter()
            .map(|t| serde_json::json!({"type": t}))
            .collect();
        serde_json::json!({"cniVersion": "1.0.0", "name": name, "plugins": plugins}).to_string()
    };
    write(
        "10-calico.conflist",
        &list("k8s-pod-network", &["calico", "portmap"]),
    );
    write("05-stray.conflist", &list("k8s-pod-network", &["bridge"]));
    write(
        "00-interlock.conflist",
        &list("k8s-pod-network", &["calico", "portmap", "interlock-cni"]),
    );
    let e = confdir::load(dir.path(), Runtime::Containerd, &[]).unwrap();
    assert_eq!(e.chosen_name().as_deref(), Some("00-interlock.conflist"));
    assert_eq!(
        crate::check::copied_from(&e).as_deref(),
        Some("10-calico.conflist")
    );
    // The stray file became the primary and the agent copied it.
    write(
        "00-interlock.conflist",
        &list("k8s-pod-network", &["bridge", "interlock-cni"]),
    );
    let e = confdir::load(dir.path(), Runtime::Containerd, &[]).unwrap();
    assert_eq!(
        crate::check::copied_from(&e).as_deref(),
        Some("05-stray.conflist")
    );
    // Not interlock's own file: nothing to name.
    std::fs::remove_file(dir.path().join("00-interlock.conflist")).unwrap();
    let e = confdir::load(dir.path(), Runtime::Containerd, &[]).unwrap();
    assert_eq!(crate::check::copied_from(&e), None);
}

/// issue 26: the skew policy on a node (docs/operate.md#upgrading): the agent and the
/// plugin it installed are one build, the agent and the CLI of one minor version. The
/// agent's version is what its `/metrics` says (`interlock_build_info`); not known, the
/// policy is not judged.
#[test]
fn an_agent_and_plugin_outside_the_skew_policy_are_flagged() {
    let now = 1_000_000;
    let m = marker(true, 0, now);
    let (_d, e) = effective(&[("00-interlock.conflist", OURS), ("10-c.conflist", PRIMARY)]);
    let cli = interlock_buildinfo::VERSION;
    let run = |agent: Option<&str>, plugin: &str| {
        let b = BinaryFacts {
            build: Some(plugin.to_string()),
            ..bin()
        };
        judge(&Observed {
            effective: &e,
            binary: Some(&b),
            bin_dirs: NO_DIRS,
            marker: Ok(&m),
            now_ms: now,
            readyz: &Readyz::Answered(200),
            missing_plugins: &[],
            stale: None,
            sandboxes: &SandboxesSeen::NotAsked,
            cri_endpoint: "none",
            namespace: "mesh-system",
            copied_from: None,
            unread_conf_dir: None,
            agent_version: agent,
        })
    };
    let release = cli.split(' ').next().unwrap();
    // One build everywhere: nothing said, protected. (The agent's series names the
    // release; the plugin's VERSION answer the commit too.)
    let j = run(Some(release), cli);
    assert_eq!(j.verdict, Verdict::Protected, "{}", j.summary);
    assert!(!ids(&j.findings).iter().any(|i| i.starts_with("skew.")));
    // Not known (an agent without the series, or not asked): not judged.
    assert!(!ids(&run(None, "0.0.1").findings)
        .iter()
        .any(|i| i.starts_with("skew.")));

    // The agent of this release, a plugin of another: the pods start with a plugin the
    // agent did not ship.
    let j = run(Some(release), "0.1.0 (git 4d8d2ac0a1b2)");
    let f = j
        .findings
        .iter()
        .find(|f| f.id == "skew.agent-plugin")
        .expect("flagged");
    assert_eq!(f.status, Status::Warn);
    assert!(
        f.message
            .contains(&format!("the agent runs interlock {release}"))
            && f.message
                .contains("/opt/cni/bin/interlock-cni is interlock-cni 0.1.0 (git 4d8d2ac0a1b2)")
            && f.message.contains("outside the skew policy"),
        "{}",
        f.message
    );
    assert!(
        f.hint
            .contains("kubectl -n mesh-system rollout status ds/interlock-node"),
        "{}",
        f.hint
    );
    assert_eq!(j.verdict, Verdict::Protected, "a warning: {}", j.summary);
    assert!(j.summary.contains("skew.agent-plugin"), "{}", j.summary);

    // An agent of another minor version than this CLI (and its own plugin).
    let j = run(Some("0.1.3"), "0.1.3");
    assert_eq!(
        ids(&j.findings)
            .into_iter()
            .filter(|i| i.starts_with("skew."))
            .collect::<Vec<_>>(),
        ["skew.agent-cli"]
    );
    let f = j
        .findings
        .iter()
        .find(|f| f.id == "skew.agent-cli")
        .unwrap();
    assert!(
        f.message.contains(&format!(
            "the agent runs interlock 0.1.3, this interlock is {cli}"
        )),
        "{}",
        f.message
    );
    assert!(f
        .hint
        .contains("exec ds/interlock-node -- interlock check node"));
    // Another patch release of the same minor version is within the policy.
    let patch = format!("{}.99", &release[..release.rfind('.').unwrap()]);
    assert!(!ids(&run(Some(&patch), &patch).findings)
        .iter()
        .any(|i| i.starts_with("skew.")));
}

/// Guard mode: the mesh's plugin that interlock-cni guards is not "another mesh"; what
/// `check` says follows the role's hold and the plugin's place in the chain.
#[test]
fn a_guarded_mesh_plugin_is_judged_by_the_guard_role() {
    let now = 10_000_000;
    let m = marker(true, 0, now);
    let b = bin();
    let cap = r#""capabilities":{"io.kubernetes.cri.pod-annotations":true}"#;
    for mesh in interlock_contract::guard::GuardedMesh::ALL {
        let t = mesh.plugin_type();
        let guard = |hold: bool| {
            format!(
                r#"{{"type":"interlock-cni",{cap},"guard":{{"mesh":"{mesh}","hold":{hold},"reason":"{t} binary missing"}}}}"#
            )
        };
        let cases = [
            // (plugins, expected finding, protected)
            (
                format!(r#"{{"type":"bridge"}},{},{{"type":"{t}"}}"#, guard(false)),
                "guard.entry",
                true,
            ),
            (
                format!(r#"{{"type":"bridge"}},{}"#, guard(true)),
                "guard.hold",
                false,
            ),
            (
                format!(r#"{{"type":"bridge"}},{}"#, guard(false)),
                "guard.entry-missing",
                false,
            ),
            (
                format!(r#"{{"type":"bridge"}},{{"type":"{t}"}},{}"#, guard(false)),
                "guard.order",
                true,
            ),
        ];
        for (plugins, id, protected) in cases {
            let list = format!(r#"{{"cniVersion":"1.0.0","name":"k8s","plugins":[{plugins}]}}"#);
            let (_d, e) = effective(&[("05-interlock.conflist", &list)]);
            let (ok, summary, f) = judge_at(&e, Some(&b), Ok(&m), now, None);
            assert!(
                !f.iter().any(|f| f.id == "config.other-mesh"),
                "{mesh} {id}: {f:?}"
            );
            let g = f
                .iter()
                .find(|f| f.id == id)
                .unwrap_or_else(|| panic!("{mesh}: no {id} in {f:?}"));
            assert!(g.message.contains(t), "{}", g.message);
            if id == "guard.hold" {
                assert!(g.message.contains("binary missing"), "{}", g.message);
            }
            assert_eq!(ok, protected, "{mesh} {id}: {summary}");
        }
        // A second mesh's plugin next to the guarded one is still two redirectors.
        let other = interlock_contract::guard::GuardedMesh::ALL
            .into_iter()
            .find(|o| *o != mesh)
            .unwrap()
            .plugin_type();
        let list = format!(
            r#"{{"cniVersion":"1.0.0","name":"k8s","plugins":[{{"type":"bridge"}},{},{{"type":"{t}"}},{{"type":"{other}"}}]}}"#,
            guard(false)
        );
        let (_d, e) = effective(&[("05-interlock.conflist", &list)]);
        let (ok, _, f) = judge_at(&e, Some(&b), Ok(&m), now, None);
        let o = f
            .iter()
            .find(|f| f.id == "config.other-mesh")
            .expect("other-mesh");
        assert!(
            o.message.contains(other) && !o.message.contains(t),
            "{}",
            o.message
        );
        assert!(!ok);
    }
}

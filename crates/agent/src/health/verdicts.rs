//! The verdicts of `/readyz` and `/healthz` (what the kubelet's probes read): pure decisions from what the guard last
//! published and how long ago its loop last completed a pass (time is passed in).
//!
//! Readiness the guard published is only true while the guard is still running: a guard
//! blocked on a file (or on anything else) can no longer repair the conf dir, so after
//! [`VerdictWindows::ready_within`] without a pass `/readyz` says 503 whatever it last
//! decided. `/healthz` fails only after the much longer [`VerdictWindows::alive_within`],
//! because failing it makes the kubelet restart the agent.

use super::shared::{AuditView, Readiness};
use std::time::Duration;

/// How long the guard may go without completing a pass before `/readyz` says 503.
pub const READY_WITHIN: Duration = Duration::from_secs(3);

/// How long the guard may go without completing a pass before `/healthz` fails. Long
/// enough that a slow pass (VERSION queries of every plugin, a full resync on a loaded
/// node) never restarts the agent, short enough that a guard stuck for good is restarted
/// within a minute by the kubelet's default liveness probe (3 failures, 10 s apart).
pub const ALIVE_WITHIN: Duration = Duration::from_secs(30);

/// The two staleness limits of the probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerdictWindows {
    /// `/readyz` says 503 when the last pass is older than this.
    pub ready_within: Duration,
    /// `/healthz` fails when the last pass is older than this.
    pub alive_within: Duration,
}

impl VerdictWindows {
    /// The windows for a guard that writes the STATUS marker every `marker_stale_after / 3`
    /// (its heartbeat, so it completes a pass at least that often). `/readyz` goes stale
    /// when the marker does, and never sooner than [`READY_WITHIN`]; `/healthz` never
    /// sooner than [`ALIVE_WITHIN`].
    pub fn for_marker(marker_stale_after: Duration) -> VerdictWindows {
        let ready_within = READY_WITHIN.max(marker_stale_after);
        VerdictWindows {
            ready_within,
            alive_within: ALIVE_WITHIN.max(ready_within * 10),
        }
    }
}

impl Default for VerdictWindows {
    fn default() -> Self {
        VerdictWindows {
            ready_within: READY_WITHIN,
            alive_within: ALIVE_WITHIN,
        }
    }
}

/// A probe's answer: pass or fail, and the line to show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// 200 when true, 503 when false.
    pub pass: bool,
    /// The body, one line.
    pub body: String,
}

/// `/readyz`: ready only if the guard said so and its loop completed a pass within
/// `w.ready_within`.
pub fn readyz(r: &Readiness, since_pass: Duration, w: &VerdictWindows) -> Verdict {
    if since_pass > w.ready_within {
        return Verdict {
            pass: false,
            body: format!(
                "not ready: the config guard has not completed a pass for {:.1} s (limit {:.1} s); \
                 it cannot repair the conf dir while stalled\n",
                since_pass.as_secs_f64(),
                w.ready_within.as_secs_f64()
            ),
        };
    }
    if r.ready {
        Verdict {
            pass: true,
            body: format!("ready: {}\n", r.effective.as_deref().unwrap_or_default()),
        }
    } else {
        Verdict {
            pass: false,
            body: format!("not ready: {}\n", r.reason),
        }
    }
}

/// How long the runtime may fail to answer before `/readyz` says the audit is blind.
pub const CRI_GRACE: Duration = Duration::from_secs(3);

/// Why the agent cannot do the audit's job, if it cannot (pure): the runtime has not
/// answered for [`CRI_GRACE`] (a runtime restart re-creates its socket within about a
/// second), or no full pass completed within three periods (at least 30 s): the audit
/// is stuck.
pub fn audit_problem(a: &AuditView) -> Option<String> {
    if !a.enabled {
        return None;
    }
    if let Some((for_, why)) = &a.failing {
        if *for_ >= CRI_GRACE {
            return Some(format!(
                "the container runtime at {} has not answered for {:.0} s ({why}): the sandbox audit cannot see or repair pods",
                a.endpoint,
                for_.as_secs_f64()
            ));
        }
    }
    let limit = (a.interval * 3).max(Duration::from_secs(30));
    let stuck = match a.since_pass {
        Some(t) => t > limit,
        None => a.running_for > limit,
    };
    stuck.then(|| {
        format!(
            "the sandbox audit has not completed a pass for over {:.0} s",
            limit.as_secs_f64()
        )
    })
}

/// `/readyz` with the audit's state: not ready when [`audit_problem`] says so.
pub fn readyz_with_audit(
    r: &Readiness,
    since_pass: Duration,
    w: &VerdictWindows,
    audit: &AuditView,
) -> Verdict {
    let answer = readyz(r, since_pass, w);
    match audit_problem(audit) {
        Some(why) if answer.pass => Verdict {
            pass: false,
            body: format!("not ready: {why}\n"),
        },
        _ => answer,
    }
}

/// `/healthz`: alive unless the guard loop has not completed a pass within
/// `w.alive_within`.
pub fn healthz(since_pass: Duration, w: &VerdictWindows) -> Verdict {
    if since_pass > w.alive_within {
        Verdict {
            pass: false,
            body: format!(
                "the config guard has not completed a pass for {:.1} s (limit {:.1} s)\n",
                since_pass.as_secs_f64(),
                w.alive_within.as_secs_f64()
            ),
        }
    } else {
        Verdict {
            pass: true,
            body: "ok\n".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready() -> Readiness {
        Readiness {
            ready: true,
            reason: "ok".into(),
            effective: Some("00-interlock.conflist".into()),
        }
    }

    fn not_ready() -> Readiness {
        Readiness {
            ready: false,
            reason: "the effective config 10-a.conflist does not contain interlock-cni".into(),
            effective: None,
        }
    }

    #[test]
    fn readyz_needs_a_recent_pass_and_a_ready_guard() {
        let w = VerdictWindows::default();
        let ms = Duration::from_millis;
        for (r, since, pass, says) in [
            (ready(), ms(0), true, "ready: 00-interlock.conflist"),
            (ready(), ms(1_000), true, "ready: 00-interlock.conflist"),
            (ready(), ms(3_000), true, "ready: 00-interlock.conflist"),
            (
                ready(),
                ms(3_001),
                false,
                "has not completed a pass for 3.0 s",
            ),
            (
                ready(),
                ms(40_000),
                false,
                "has not completed a pass for 40.0 s",
            ),
            (not_ready(), ms(0), false, "does not contain interlock-cni"),
            (not_ready(), ms(5_000), false, "has not completed a pass"),
        ] {
            let a = readyz(&r, since, &w);
            assert_eq!(a.pass, pass, "{r:?} after {since:?}: {}", a.body);
            assert!(a.body.contains(says), "{r:?} after {since:?}: {}", a.body);
            assert!(a.body.ends_with('\n'));
        }
    }

    #[test]
    fn healthz_fails_only_when_stuck_for_long() {
        let w = VerdictWindows::default();
        assert!(healthz(Duration::ZERO, &w).pass);
        assert!(healthz(Duration::from_secs(29), &w).pass);
        assert!(healthz(Duration::from_secs(30), &w).pass);
        let a = healthz(Duration::from_millis(30_001), &w);
        assert!(!a.pass);
        assert!(a.body.contains("30.0 s"), "{}", a.body);
    }

    #[test]
    fn windows_follow_the_marker_heartbeat() {
        // The default marker (3 s, heartbeat 1 s) and faster ones keep the 3 s / 30 s.
        for ms in [30, 300, 3_000] {
            assert_eq!(
                VerdictWindows::for_marker(Duration::from_millis(ms)),
                VerdictWindows::default()
            );
        }
        // A slower heartbeat must not make a healthy guard look stalled.
        let w = VerdictWindows::for_marker(Duration::from_secs(9));
        assert_eq!(w.ready_within, Duration::from_secs(9));
        assert_eq!(w.alive_within, Duration::from_secs(90));
        assert!(
            readyz(
                &ready(),
                Duration::from_secs(3) + Duration::from_secs(3),
                &w
            )
            .pass
        );
    }

    #[test]
    fn a_runtime_that_does_not_answer_makes_the_agent_not_ready() {
        let ready = Readiness {
            ready: true,
            reason: "ok".into(),
            effective: Some("00-interlock.conflist".into()),
        };
        let w = VerdictWindows::default();
        let mut a = AuditView {
            enabled: true,
            endpoint: "unix:///run/containerd/containerd.sock".into(),
            failing: None,
            since_pass: Some(Duration::from_secs(1)),
            running_for: Duration::from_secs(60),
            interval: Duration::from_secs(10),
        };
        assert!(readyz_with_audit(&ready, Duration::ZERO, &w, &a).pass);
        a.failing = Some((Duration::from_secs(1), "connection refused".into()));
        assert!(
            readyz_with_audit(&ready, Duration::ZERO, &w, &a).pass,
            "within the grace"
        );
        a.failing = Some((CRI_GRACE, "connection refused".into()));
        let r = readyz_with_audit(&ready, Duration::ZERO, &w, &a);
        assert!(!r.pass);
        assert!(
            r.body.contains("containerd.sock") && r.body.contains("connection refused"),
            "{}",
            r.body
        );
        a.failing = None;
        a.since_pass = Some(Duration::from_secs(31));
        assert!(readyz_with_audit(&ready, Duration::ZERO, &w, &a)
            .body
            .contains("not completed a pass"));
        a.since_pass = None;
        a.running_for = Duration::from_secs(5);
        assert!(
            readyz_with_audit(&ready, Duration::ZERO, &w, &a).pass,
            "starting"
        );
        a.enabled = false;
        a.failing = Some((Duration::from_secs(60), "x".into()));
        assert!(readyz_with_audit(&ready, Duration::ZERO, &w, &a).pass);
    }
}

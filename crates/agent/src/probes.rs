//! Whether `/readyz` and `/healthz` pass (the probes): pure decisions from what the guard last
//! published and how long ago its loop last completed a pass (time is passed in).
//!
//! Readiness the guard published is only true while the guard is still running: a guard
//! blocked on a file (or on anything else) can no longer repair the conf dir, so after
//! [`ProbeWindows::ready_within`] without a pass `/readyz` says 503 whatever it last
//! decided. `/healthz` fails only after the much longer [`ProbeWindows::alive_within`],
//! because failing it makes the kubelet restart the agent.

use crate::status::Readiness;
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
pub struct ProbeWindows {
    /// `/readyz` says 503 when the last pass is older than this.
    pub ready_within: Duration,
    /// `/healthz` fails when the last pass is older than this.
    pub alive_within: Duration,
}

impl ProbeWindows {
    /// The windows for a guard that writes the STATUS marker every `marker_stale_after / 3`
    /// (its heartbeat, so it completes a pass at least that often). `/readyz` goes stale
    /// when the marker does, and never sooner than [`READY_WITHIN`]; `/healthz` never
    /// sooner than [`ALIVE_WITHIN`].
    pub fn for_marker(marker_stale_after: Duration) -> ProbeWindows {
        let ready_within = READY_WITHIN.max(marker_stale_after);
        ProbeWindows {
            ready_within,
            alive_within: ALIVE_WITHIN.max(ready_within * 10),
        }
    }
}

impl Default for ProbeWindows {
    fn default() -> Self {
        ProbeWindows {
            ready_within: READY_WITHIN,
            alive_within: ALIVE_WITHIN,
        }
    }
}

/// A probe's answer: pass or fail, and the line to show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeAnswer {
    /// 200 when true, 503 when false.
    pub pass: bool,
    /// The body, one line.
    pub body: String,
}

/// `/readyz`: ready only if the guard said so and its loop completed a pass within
/// `w.ready_within`.
pub fn readyz(r: &Readiness, since_pass: Duration, w: &ProbeWindows) -> ProbeAnswer {
    if since_pass > w.ready_within {
        return ProbeAnswer {
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
        ProbeAnswer {
            pass: true,
            body: format!("ready: {}\n", r.effective.as_deref().unwrap_or_default()),
        }
    } else {
        ProbeAnswer {
            pass: false,
            body: format!("not ready: {}\n", r.reason),
        }
    }
}

/// `/healthz`: alive unless the guard loop has not completed a pass within
/// `w.alive_within`.
pub fn healthz(since_pass: Duration, w: &ProbeWindows) -> ProbeAnswer {
    if since_pass > w.alive_within {
        ProbeAnswer {
            pass: false,
            body: format!(
                "the config guard has not completed a pass for {:.1} s (limit {:.1} s)\n",
                since_pass.as_secs_f64(),
                w.alive_within.as_secs_f64()
            ),
        }
    } else {
        ProbeAnswer {
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
        let w = ProbeWindows::default();
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
        let w = ProbeWindows::default();
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
                ProbeWindows::for_marker(Duration::from_millis(ms)),
                ProbeWindows::default()
            );
        }
        // A slower heartbeat must not make a healthy guard look stalled.
        let w = ProbeWindows::for_marker(Duration::from_secs(9));
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
}

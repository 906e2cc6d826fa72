//! The readiness matrix: from what the guard found, is the node ready, and why not.
//!
//! Pure, like [`crate::guard::conflict`]: the guard gathers the facts (the effective config's
//! verdict, the plugin binaries, the files in back-off, the plan) and publishes what
//! [`judge`] says.

use crate::guard::plan::{GuardState, Plan};
use crate::health::shared::Readiness;
use std::path::Path;

/// What the guard observed after a reconcile.
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    /// Whether the runtime's effective config runs our entry: `Ok(file)` or why not
    /// ([`crate::guard::plan::check_effective`]).
    pub verdict: &'a Result<String, String>,
    /// Why the plugin binary is not verified, if it is not.
    pub binary_problem: Option<&'a str>,
    /// Files the guard is backing off from (another writer keeps taking us out).
    pub backing_off: &'a [String],
    /// Files in a fight ([`crate::guard::conflict`]): not ready until it is over, even
    /// between back-offs (the config the node needs cannot stay).
    pub fighting: &'a [String],
    /// The fight's primary and what to do, for the reason.
    pub fight_detail: Option<&'a str>,
    /// The plan of this reconcile (its problem may block readiness).
    pub plan: &'a Plan,
    /// The conf dir (named in reasons).
    pub conf_dir: &'a Path,
    /// Guard mode: the state the plan put the config in (`None` in owned and chain mode).
    pub guard: Option<&'a GuardState>,
}

/// Ready only when the effective config runs our entry, the binary is verified, no file
/// is in back-off or in a fight and the plan has no blocking problem. The first failing
/// condition, in that order of precedence (back-off and fights first: they explain the
/// others), is the reason.
pub fn judge(o: &Observed<'_>) -> Readiness {
    let effective = o.verdict.as_ref().ok().cloned();
    if !o.backing_off.is_empty() || !o.fighting.is_empty() {
        // One reason for the whole fight, in and between its back-offs: it is logged and
        // published once, not on every back-off.
        let reason = if o.fighting.is_empty() {
            format!(
                "backing off: another writer keeps rewriting {} in {}",
                o.backing_off.join(", "),
                o.conf_dir.display()
            )
        } else {
            format!(
                "backing off: another writer keeps undoing interlock's change to {} in {} (a fight){}",
                o.fighting.join(", "),
                o.conf_dir.display(),
                o.fight_detail.map(|d| format!(": {d}")).unwrap_or_default()
            )
        };
        return Readiness {
            ready: false,
            reason,
            effective,
        };
    }
    // Guard mode is ready only in its guard state: the mesh's plugin runs after
    // interlock-cni in the guard file (the verdict checks the file and the order).
    match o.guard {
        Some(GuardState::Hold { .. }) => {
            return Readiness {
                ready: false,
                reason: o.plan.problem.clone().unwrap_or_default(),
                effective: o.verdict.as_ref().ok().cloned(),
            }
        }
        Some(GuardState::NoPrimary { reason }) => {
            return Readiness {
                ready: false,
                reason: match o.verdict {
                    Err(e) => format!("{e}: {reason}"),
                    Ok(_) => reason.clone(),
                },
                effective: None,
            }
        }
        Some(GuardState::Guard) | None => {}
    }
    match (o.verdict, o.binary_problem) {
        (Err(e), _) => Readiness {
            ready: false,
            reason: match &o.plan.problem {
                Some(p) => format!("{e}: {p}"),
                None => e.clone(),
            },
            effective: None,
        },
        (Ok(_), _) if o.plan.blocks_ready => Readiness {
            ready: false,
            reason: o.plan.problem.clone().unwrap_or_default(),
            effective,
        },
        (Ok(_), Some(b)) => Readiness {
            ready: false,
            reason: format!("plugin binary not verified: {b}"),
            effective,
        },
        (Ok(n), None) => Readiness {
            ready: true,
            reason: "ok".to_string(),
            effective: Some(n.clone()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs<'a>(
        verdict: &'a Result<String, String>,
        binary: Option<&'a str>,
        backing: &'a [String],
        plan: &'a Plan,
    ) -> Readiness {
        judge(&Observed {
            verdict,
            binary_problem: binary,
            backing_off: backing,
            fighting: &[],
            fight_detail: None,
            plan,
            conf_dir: Path::new("/etc/cni/net.d"),
            guard: None,
        })
    }

    #[test]
    fn every_cell_of_the_matrix() {
        let ok: Result<String, String> = Ok("00-interlock.conflist".into());
        let bad: Result<String, String> =
            Err("the effective config 10-x.conflist does not contain interlock-cni".into());
        let clean = Plan::default();
        let problem = Plan {
            problem: Some("cannot copy 10-x.conflist: cniVersion 0.2.0".into()),
            blocks_ready: true,
            ..Plan::default()
        };
        let soft = Plan {
            problem: Some("no valid primary".into()),
            blocks_ready: false,
            ..Plan::default()
        };
        let backing = vec!["00-interlock.conflist".to_string()];

        let r = obs(&ok, None, &[], &clean);
        assert!(r.ready);
        assert_eq!(r.effective.as_deref(), Some("00-interlock.conflist"));

        // Back-off wins over everything, and still says what is in effect.
        for v in [&ok, &bad] {
            let r = obs(v, Some("x"), &backing, &problem);
            assert!(!r.ready);
            assert!(
                r.reason.starts_with("backing off")
                    && r.reason.contains("00-interlock.conflist")
                    && r.reason.contains("/etc/cni/net.d"),
                "{}",
                r.reason
            );
            assert_eq!(r.effective, v.as_ref().ok().cloned());
        }

        // Not in effect: the verdict, with the plan's problem appended.
        let r = obs(&bad, None, &[], &soft);
        assert!(!r.ready && r.effective.is_none());
        assert!(
            r.reason.contains("does not contain") && r.reason.ends_with("no valid primary"),
            "{}",
            r.reason
        );
        let r = obs(&bad, Some("missing"), &[], &clean);
        assert_eq!(r.reason, bad.clone().unwrap_err());

        // In effect, but the plan says it cannot follow the primary.
        let r = obs(&ok, None, &[], &problem);
        assert!(!r.ready);
        assert!(r.reason.contains("cniVersion 0.2.0"), "{}", r.reason);
        // In effect, a soft problem does not block.
        assert!(obs(&ok, None, &[], &soft).ready);

        // In effect, binary not verified.
        let r = obs(
            &ok,
            Some("/opt/cni/bin/interlock-cni is not executable"),
            &[],
            &clean,
        );
        assert!(!r.ready);
        assert!(
            r.reason.starts_with("plugin binary not verified: "),
            "{}",
            r.reason
        );
    }

    #[test]
    fn a_fight_keeps_the_node_not_ready_between_back_offs_and_names_the_primary() {
        // Between two back-offs our config is in place for a moment: still not ready
        // (fail closed), and the reason carries who and what to do.
        let ok: Result<String, String> = Ok("00-interlock.conflist".into());
        let fighting = vec!["00-interlock.conflist".to_string()];
        let detail =
            "the runtime loads 05-cilium.conflist (cilium-cni) meanwhile; set cni.exclusive=false";
        let clean = Plan::default();
        let o = Observed {
            verdict: &ok,
            binary_problem: None,
            backing_off: &[],
            fighting: &fighting,
            fight_detail: Some(detail),
            plan: &clean,
            conf_dir: Path::new("/etc/cni/net.d"),
            guard: None,
        };
        let r = judge(&o);
        assert!(!r.ready);
        assert!(
            r.reason.starts_with("backing off: ")
                && r.reason
                    .contains("00-interlock.conflist in /etc/cni/net.d (a fight)")
                && r.reason.ends_with(detail),
            "{}",
            r.reason
        );
        let during = judge(&Observed {
            backing_off: &fighting,
            ..o
        });
        assert_eq!(during, r, "the reason changes with each back-off");
        // Over: ready again.
        let r = judge(&Observed { fighting: &[], ..o });
        assert!(r.ready, "{}", r.reason);
    }

    #[test]
    fn guard_mode_is_ready_only_in_its_guard_state() {
        let ok: Result<String, String> = Ok("00-interlock.conflist".into());
        let held = "consul-cni binary missing from /opt/cni/bin (installer restarting?)";
        let hold_plan = Plan {
            problem: Some(format!("{held}: meshed pods are held")),
            blocks_ready: true,
            target: Some("00-interlock.conflist".into()),
            ..Plan::default()
        };
        let guarding = Plan {
            target: Some("00-interlock.conflist".into()),
            ..Plan::default()
        };
        let o = |verdict, plan, guard, backing: &'static [String]| {
            judge(&Observed {
                verdict,
                binary_problem: None,
                backing_off: backing,
                fighting: &[],
                fight_detail: None,
                plan,
                conf_dir: Path::new("/etc/cni/net.d"),
                guard: Some(guard),
            })
        };
        // Guard, the guard file in effect with T after interlock-cni: ready.
        let r = o(&ok, &guarding, &GuardState::Guard, &[]);
        assert!(r.ready, "{}", r.reason);
        assert_eq!(r.effective.as_deref(), Some("00-interlock.conflist"));
        // Hold: interlock-cni is in effect (it holds meshed pods), still not ready, and
        // the reason names T and why.
        let hold = GuardState::Hold {
            reason: held.into(),
        };
        let r = o(&ok, &hold_plan, &hold, &[]);
        assert!(!r.ready);
        assert_eq!(
            r.reason,
            "consul-cni binary missing from /opt/cni/bin (installer restarting?): meshed pods are held"
        );
        // Guard planned, but the runtime loads something else (or T before us).
        let bad: Result<String, String> = Err(
            "the effective config is 0-cilium.conflist, not the guard file 00-interlock.conflist"
                .into(),
        );
        let r = o(&bad, &guarding, &GuardState::Guard, &[]);
        assert!(!r.ready);
        assert!(r.reason.contains("not the guard file"), "{}", r.reason);
        // No primary: the holding config.
        let none = GuardState::NoPrimary {
            reason: "no CNI config from the primary plugin in the conf dir yet".into(),
        };
        let holding: Result<String, String> =
            Err("00-interlock.conflist is interlock's holding config".into());
        let empty = Plan::default();
        let r = o(&holding, &empty, &none, &[]);
        assert!(!r.ready);
        assert!(r.reason.contains("holding config") && r.reason.contains("primary"));
        // Back-off comes first, as in the other modes.
        static BACKING: std::sync::LazyLock<Vec<String>> =
            std::sync::LazyLock::new(|| vec!["00-interlock.conflist".to_string()]);
        let r = o(&ok, &guarding, &GuardState::Guard, BACKING.as_slice());
        assert!(!r.ready);
        assert!(r.reason.starts_with("backing off"), "{}", r.reason);
    }
}

//! Node gating decisions (pure): when the startup taint `interlock.dev/not-ready` goes
//! and comes back, what the `InterlockReady` condition says, and the edits that get there
//! without losing anyone else's taint.
//!
//! Taints are removed as soon as the agent is ready (a ready node should get pods at
//! once) and put back only when protection has been lost for longer than
//! [`LOSS_DEBOUNCE`]: the config guard repairs a clobbered config within milliseconds,
//! and a taint that flapped with every clobber would churn the scheduler and the API for
//! nothing. Pods scheduled in that window are still covered by the plugin (it fails
//! closed) and the guard. The condition follows the same debounced state, so the taint
//! and the condition never disagree.
//!
//! Edits are computed from the node as last read: [`taints_edit`] returns the full new
//! list (taints have no merge key, the API replaces the list whole), which the caller
//! writes with a `resourceVersion` precondition and recomputes after a conflict.

use std::time::{Duration, Instant};

use interlock_contract::names::{CONDITION_READY as CONDITION_TYPE, TAINT_NOT_READY as TAINT_KEY};
use k8s_openapi::api::core::v1::{NodeCondition, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// How long protection must stay lost before the taint comes back.
pub const LOSS_DEBOUNCE: Duration = Duration::from_secs(3);

/// `--taint-effect`: the effect of the startup taint, or no taint at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaintEffect {
    /// New pods are not scheduled (the default).
    NoSchedule,
    /// New pods are scheduled only when nothing else fits.
    PreferNoSchedule,
    /// Running pods without a toleration are evicted too.
    NoExecute,
    /// No taint: only the condition reports readiness.
    None,
}

impl TaintEffect {
    /// The API's spelling (`None` has none).
    pub fn as_api(self) -> Option<&'static str> {
        match self {
            TaintEffect::NoSchedule => Some("NoSchedule"),
            TaintEffect::PreferNoSchedule => Some("PreferNoSchedule"),
            TaintEffect::NoExecute => Some("NoExecute"),
            TaintEffect::None => None,
        }
    }
}

impl std::str::FromStr for TaintEffect {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "NoSchedule" => TaintEffect::NoSchedule,
            "PreferNoSchedule" => TaintEffect::PreferNoSchedule,
            "NoExecute" => TaintEffect::NoExecute,
            "none" => TaintEffect::None,
            _ => {
                return Err(format!(
                    "unknown taint effect {s:?}: expected NoSchedule, PreferNoSchedule, NoExecute or none"
                ))
            }
        })
    }
}

/// What the node should say about interlock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeState {
    /// Protected: the taint goes, the condition is `True`.
    pub ready: bool,
    /// CamelCase reason for the condition (`ConfigEffective`, `ConfigNotEffective`, …).
    pub reason: String,
    /// Plain words.
    pub message: String,
}

/// Debounces the agent's readiness into the node's state.
#[derive(Debug, Default)]
pub struct Debounce {
    published: Option<NodeState>,
    lost_since: Option<Instant>,
}

impl Debounce {
    /// Feeds the agent's current readiness at `now`; returns the state the node should
    /// show now (unchanged while a loss is younger than [`LOSS_DEBOUNCE`]), and the time at
    /// which to ask again when a loss is pending.
    pub fn observe(&mut self, current: NodeState, now: Instant) -> (NodeState, Option<Instant>) {
        if current.ready {
            self.lost_since = None;
            self.published = Some(current.clone());
            return (current, None);
        }
        match &self.published {
            Some(p) if p.ready => {
                let since = *self.lost_since.get_or_insert(now);
                let due = since + LOSS_DEBOUNCE;
                if now < due {
                    return (p.clone(), Some(due));
                }
            }
            _ => {}
        }
        self.published = Some(current.clone());
        (current, None)
    }
}

/// The condition's reason when the runtime loads a config without interlock that the
/// guard cannot repair (a foreign file took first place).
pub const REASON_NOT_EFFECTIVE: &str = "ConfigNotEffective";

/// What the node should say for the guard's readiness: a CamelCase reason for the
/// condition, and the guard's own words as its message.
pub fn node_state(r: &crate::health::shared::Readiness) -> NodeState {
    if r.ready {
        return NodeState {
            ready: true,
            reason: "ConfigEffective".into(),
            message: format!(
                "the runtime loads {}, which runs interlock-cni",
                r.effective.as_deref().unwrap_or("the interlock config")
            ),
        };
    }
    let reason = if r.reason == "starting" {
        "Starting"
    } else if r.reason.starts_with("backing off") {
        "ConfigConflict"
    } else if r.reason.starts_with("plugin binary not verified") {
        "PluginNotVerified"
    } else if r.reason.starts_with("repairing") {
        "Repairing"
    } else if r.reason.starts_with("cannot read conf dir") {
        "ConfDirUnreadable"
    } else {
        REASON_NOT_EFFECTIVE
    };
    NodeState {
        ready: false,
        reason: reason.into(),
        message: r.reason.clone(),
    }
}

fn is_ours(t: &Taint) -> bool {
    t.key == TAINT_KEY
}

/// The node's new taint list, or `None` when `current` already says what it should.
/// Every other taint is kept, in order; ours is added (with `effect`) when not ready and
/// removed when ready. With [`TaintEffect::None`] ours is always removed (an operator
/// who turned the taint off must not be left with one from an earlier setting).
pub fn taints_edit(current: &[Taint], ready: bool, effect: TaintEffect) -> Option<Vec<Taint>> {
    let want = match (ready, effect.as_api()) {
        (false, Some(e)) => Some(e),
        _ => None,
    };
    let ours: Vec<&Taint> = current.iter().filter(|t| is_ours(t)).collect();
    let already = match want {
        Some(e) => ours.len() == 1 && ours[0].effect == e,
        None => ours.is_empty(),
    };
    if already {
        return None;
    }
    let mut next: Vec<Taint> = current.iter().filter(|t| !is_ours(t)).cloned().collect();
    if let Some(e) = want {
        next.push(Taint {
            key: TAINT_KEY.to_string(),
            effect: e.to_string(),
            value: None,
            time_added: None,
        });
    }
    Some(next)
}

/// The `InterlockReady` condition to write, or `None` when `current` already says it.
/// `lastTransitionTime` moves only when the status flips; nothing is rewritten on a
/// timer, so a node that stays ready costs the API nothing.
pub fn condition_edit(
    current: Option<&NodeCondition>,
    want: &NodeState,
    now: Time,
) -> Option<NodeCondition> {
    let status = if want.ready { "True" } else { "False" };
    if let Some(c) = current {
        if c.status == status
            && c.reason.as_deref() == Some(want.reason.as_str())
            && c.message.as_deref() == Some(want.message.as_str())
        {
            return None;
        }
    }
    let transition = match current {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => Some(now.clone()),
    };
    Some(NodeCondition {
        type_: CONDITION_TYPE.to_string(),
        status: status.to_string(),
        reason: Some(want.reason.clone()),
        message: Some(want.message.clone()),
        last_transition_time: transition,
        last_heartbeat_time: Some(now),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            effect: effect.into(),
            value: None,
            time_added: None,
        }
    }

    fn state(ready: bool) -> NodeState {
        NodeState {
            ready,
            reason: if ready {
                "ConfigEffective"
            } else {
                "ConfigNotEffective"
            }
            .into(),
            message: "m".into(),
        }
    }

    #[test]
    fn readiness_maps_to_a_camel_case_reason_and_keeps_its_words() {
        let r = |ready: bool, reason: &str| crate::health::shared::Readiness {
            ready,
            reason: reason.into(),
            effective: ready.then(|| "00-interlock.conflist".to_string()),
        };
        let ok = node_state(&r(true, "ok"));
        assert!(ok.ready);
        assert_eq!(ok.reason, "ConfigEffective");
        assert!(
            ok.message.contains("00-interlock.conflist"),
            "{}",
            ok.message
        );
        for (words, reason) in [
            ("starting", "Starting"),
            (
                "backing off: another writer keeps rewriting 10-a.conflist in /d",
                "ConfigConflict",
            ),
            ("plugin binary not verified: missing", "PluginNotVerified"),
            (
                "repairing: the effective config 10-a.conflist lacks interlock-cni",
                "Repairing",
            ),
            ("cannot read conf dir /d: EACCES", "ConfDirUnreadable"),
            (
                "the effective config !first.conflist does not run interlock-cni",
                "ConfigNotEffective",
            ),
        ] {
            let s = node_state(&r(false, words));
            assert_eq!(
                (s.ready, s.reason.as_str(), s.message.as_str()),
                (false, reason, words)
            );
        }
    }

    #[test]
    fn taint_is_removed_when_ready_and_others_are_kept_in_order() {
        let others = [
            taint("node.kubernetes.io/not-ready", "NoSchedule"),
            taint("gpu", "NoSchedule"),
        ];
        let mut current = others.to_vec();
        current.insert(1, taint(TAINT_KEY, "NoSchedule"));
        assert_eq!(
            taints_edit(&current, true, TaintEffect::NoSchedule).unwrap(),
            others
        );
        assert_eq!(taints_edit(&others, true, TaintEffect::NoSchedule), None);
    }

    #[test]
    fn taint_is_added_once_with_the_configured_effect() {
        let others = [taint("gpu", "NoSchedule")];
        let next = taints_edit(&others, false, TaintEffect::NoExecute).unwrap();
        assert_eq!(
            next,
            [taint("gpu", "NoSchedule"), taint(TAINT_KEY, "NoExecute")]
        );
        assert_eq!(taints_edit(&next, false, TaintEffect::NoExecute), None);
        // Another effect than configured is corrected, not duplicated.
        let fixed = taints_edit(&next, false, TaintEffect::NoSchedule).unwrap();
        assert_eq!(
            fixed,
            [taint("gpu", "NoSchedule"), taint(TAINT_KEY, "NoSchedule")]
        );
        // Duplicates of ours collapse to one.
        let dup = [
            taint(TAINT_KEY, "NoSchedule"),
            taint(TAINT_KEY, "NoSchedule"),
        ];
        assert_eq!(
            taints_edit(&dup, false, TaintEffect::NoSchedule).unwrap(),
            [taint(TAINT_KEY, "NoSchedule")]
        );
    }

    #[test]
    fn effect_none_never_taints_and_clears_an_old_taint() {
        assert_eq!(taints_edit(&[], false, TaintEffect::None), None);
        assert_eq!(
            taints_edit(&[taint(TAINT_KEY, "NoSchedule")], false, TaintEffect::None).unwrap(),
            []
        );
        assert_eq!("none".parse::<TaintEffect>().unwrap(), TaintEffect::None);
        assert!("Never"
            .parse::<TaintEffect>()
            .unwrap_err()
            .contains("NoSchedule"));
    }

    #[test]
    fn a_short_loss_does_not_flap_and_a_long_one_does() {
        let mut d = Debounce::default();
        let t0 = Instant::now();
        assert!(d.observe(state(true), t0).0.ready);
        let (shown, due) = d.observe(state(false), t0 + Duration::from_millis(10));
        assert!(
            shown.ready,
            "a loss younger than the debounce shows the last ready state"
        );
        assert_eq!(due, Some(t0 + Duration::from_millis(10) + LOSS_DEBOUNCE));
        // Repaired within the debounce: nothing ever showed the loss.
        assert!(
            d.observe(state(true), t0 + Duration::from_millis(20))
                .0
                .ready
        );
        // A loss that lasts: shown once the debounce has passed.
        d.observe(state(false), t0 + Duration::from_secs(1));
        assert!(d.observe(state(false), t0 + Duration::from_secs(2)).0.ready);
        let (shown, due) = d.observe(state(false), t0 + Duration::from_secs(1) + LOSS_DEBOUNCE);
        assert!(!shown.ready);
        assert_eq!(due, None);
        // Never ready yet (start-up): shown at once, the taint stays.
        let mut fresh = Debounce::default();
        assert!(!fresh.observe(state(false), t0).0.ready);
    }

    #[test]
    fn condition_changes_only_when_its_content_does() {
        let t1 = Time(k8s_openapi::jiff::Timestamp::from_second(1_000).unwrap());
        let t2 = Time(k8s_openapi::jiff::Timestamp::from_second(2_000).unwrap());
        let c = condition_edit(None, &state(false), t1.clone()).unwrap();
        assert_eq!(
            (c.type_.as_str(), c.status.as_str()),
            (CONDITION_TYPE, "False")
        );
        assert_eq!(c.last_transition_time, Some(t1.clone()));
        assert_eq!(condition_edit(Some(&c), &state(false), t2.clone()), None);
        let mut other_msg = state(false);
        other_msg.message = "other".into();
        let c2 = condition_edit(Some(&c), &other_msg, t2.clone()).unwrap();
        assert_eq!(
            c2.last_transition_time,
            Some(t1),
            "same status: no transition"
        );
        let c3 = condition_edit(Some(&c2), &state(true), t2.clone()).unwrap();
        assert_eq!(
            (c3.status.as_str(), c3.last_transition_time),
            ("True", Some(t2))
        );
    }
}

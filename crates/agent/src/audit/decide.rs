//! The sandbox audit's decisions (pure): is a running sandbox protected, and what the
//! repair policy does about one that is not.
//!
//! The thin layer that lists sandboxes over CRI, enters their netns and acts lives
//! elsewhere; everything here takes what was observed and returns what to do, so every
//! rule is tested without root. Sandboxes are keyed by sandbox ID and netns identity; the
//! loop guard is keyed by the pod (namespace, name, UID), which a restart's new sandbox
//! keeps.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use interlock_contract::state::RULE_SHAPE;
use interlock_redirect::decision::Decision;

use crate::kubernetes::pods::PodKey;

/// What the audit concluded about one sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Meshed, and exactly its rules are in its netns.
    Protected,
    /// Meshed, and its rules are missing or differ.
    Unprotected {
        /// What is wrong, in plain words.
        reason: String,
    },
    /// Not meshed, or not interlock's business (excluded namespace).
    NotMeshed {
        /// Why.
        reason: String,
    },
    /// Could not be decided (annotations unknown, invalid annotations, netns unreadable).
    Unknown {
        /// Why.
        reason: String,
    },
}

impl Verdict {
    /// The label used in metrics and `check` (`protected`, `unprotected`, `not_meshed`,
    /// `unknown`: [`crate::health::metrics::VerdictLabel::ALL`]).
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Protected => "protected",
            Verdict::Unprotected { .. } => "unprotected",
            Verdict::NotMeshed { .. } => "not_meshed",
            Verdict::Unknown { .. } => "unknown",
        }
    }
}

/// What reading the sandbox's netns showed (only asked for meshed sandboxes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RulesSeen {
    /// The read-back equals the spec.
    Exact,
    /// The read-back differs; each entry says how (an empty netns lists the missing
    /// table).
    Mismatch(Vec<String>),
    /// The netns could not be read (not gone: that sandbox is skipped quietly).
    Error(String),
    /// The plugin recorded the rules as written by an older release (rule `shape` below
    /// [`RULE_SHAPE`]) and they differ from what this build writes: judged by what that
    /// shape promises, capture proven by a connection ([`resolve_older`]), before anything
    /// is rewritten.
    OlderShape {
        /// The recorded shape.
        shape: u32,
        /// How they differ from this build's rules.
        diffs: Vec<String>,
    },
    /// Rules of an older shape whose capture a connection proved: protected, left as
    /// written.
    Proven {
        /// The recorded shape.
        shape: u32,
        /// What the connection showed.
        proof: String,
    },
    /// The plugin recorded the rules as written by a newer release (rule `shape` above
    /// [`RULE_SHAPE`]): this build cannot judge them and leaves them alone.
    Newer {
        /// The recorded shape.
        shape: u32,
    },
}

/// Judges one sandbox from the mesh decision and, for a meshed one, what its netns holds.
pub fn judge(decision: &Decision, rules: Option<&RulesSeen>) -> Verdict {
    match decision {
        Decision::Skip { reason } | Decision::NotMeshed { reason } => Verdict::NotMeshed {
            reason: reason.clone(),
        },
        Decision::Undecided { reason }
        | Decision::Invalid { reason }
        | Decision::NeedsPodSpec { reason, .. } => Verdict::Unknown {
            reason: reason.clone(),
        },
        Decision::Meshed { profile, .. } => match rules {
            Some(RulesSeen::Exact) | Some(RulesSeen::Proven { .. }) => Verdict::Protected,
            Some(RulesSeen::OlderShape { shape, diffs }) => Verdict::Unknown {
                reason: format!(
                    "meshed ({}); its rules were written by an older interlock (rule shape \
                     {shape}, this build writes {RULE_SHAPE}) and not yet proven by a \
                     connection: {}",
                    profile.as_str(),
                    summarize(diffs)
                ),
            },
            Some(RulesSeen::Newer { shape }) => Verdict::Unknown {
                reason: format!(
                    "meshed ({}); its rules were written by a newer interlock (rule shape \
                     {shape}, this build knows up to {RULE_SHAPE}): left as they are, \
                     neither judged nor repaired; upgrade this node's interlock",
                    profile.as_str()
                ),
            },
            Some(RulesSeen::Mismatch(diffs)) => Verdict::Unprotected {
                reason: format!(
                    "meshed ({}) but its redirection is not in place: {}",
                    profile.as_str(),
                    summarize(diffs)
                ),
            },
            Some(RulesSeen::Error(e)) => Verdict::Unknown {
                reason: format!(
                    "meshed ({}) but its rules cannot be read: {e}",
                    profile.as_str()
                ),
            },
            None => Verdict::Unknown {
                reason: format!(
                    "meshed ({}) but its network namespace is unknown",
                    profile.as_str()
                ),
            },
        },
    }
}

/// What the plugin's record of a netns (`interlock_contract::state::NetnsRecord`) says,
/// as far as the audit cross-checks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordView<'a> {
    /// The record lists an attachment of this sandbox (container ID = sandbox ID).
    pub lists_sandbox: bool,
    /// The spec hash recorded as installed.
    pub spec_hash: &'a str,
    /// The rule shape recorded (`interlock_contract::state::NetnsRecord::shape`).
    pub shape: u32,
}

/// Cross-checks a read-back with the plugin's record of the netns, when there is one.
/// Rules that read back exactly but are not what the record says (another spec), or a
/// record that does not list this sandbox (the plugin's DEL and GC would remove the
/// rules with another attachment's last reference), are not the pod's protection as the
/// plugin treats it, so they count as a mismatch; the repair records them properly.
pub fn cross_check(
    read_back: RulesSeen,
    record: Option<RecordView<'_>>,
    spec_hash: &str,
) -> RulesSeen {
    let Some(record) = record else {
        return read_back;
    };
    let mut diffs = match read_back {
        RulesSeen::Exact => Vec::new(),
        RulesSeen::Mismatch(d) => d,
        other @ (RulesSeen::Error(_)
        | RulesSeen::OlderShape { .. }
        | RulesSeen::Proven { .. }
        | RulesSeen::Newer { .. }) => return other,
    };
    // A newer release's rules are not this build's to judge: whatever they look like to
    // it, "repairing" them would write an older shape over a newer one.
    if record.shape > RULE_SHAPE {
        return RulesSeen::Newer {
            shape: record.shape,
        };
    }
    if !record.lists_sandbox {
        diffs.push("the plugin's record of this netns does not list this sandbox".to_string());
    }
    if record.spec_hash != spec_hash {
        diffs.push(format!(
            "the plugin recorded spec {} but the pod's annotations now ask for {}",
            short(record.spec_hash),
            short(spec_hash)
        ));
    }
    if diffs.is_empty() {
        RulesSeen::Exact
    } else if record.shape < RULE_SHAPE && record.lists_sandbox {
        // Another release's rendering (or spec) of the same pod: the differences may be
        // nothing but the shape, so a connection decides, not the read-back.
        RulesSeen::OlderShape {
            shape: record.shape,
            diffs,
        }
    } else {
        RulesSeen::Mismatch(diffs)
    }
}

/// Settles [`RulesSeen::OlderShape`] with the outcome of a connection through the rules
/// (`Ok`: what it showed): capture proven leaves the rules as written ([`RulesSeen::Proven`]);
/// otherwise they are damaged for their own shape too and count as a mismatch, which the
/// policy repairs. Anything else passes through.
pub fn resolve_older(seen: RulesSeen, proof: Result<String, String>) -> RulesSeen {
    match (seen, proof) {
        (RulesSeen::OlderShape { shape, .. }, Ok(proof)) => RulesSeen::Proven { shape, proof },
        (RulesSeen::OlderShape { shape, mut diffs }, Err(why)) => {
            diffs.insert(
                0,
                format!(
                    "its rules, written by an older interlock (rule shape {shape}), no longer \
                     capture a connection: {why}"
                ),
            );
            RulesSeen::Mismatch(diffs)
        }
        (other, _) => other,
    }
}

fn short(hash: &str) -> &str {
    &hash[..12.min(hash.len())]
}

/// What an in-place repair that could not end the connections opened before the rules
/// becomes: a restart, saying why (the rules are in place, but the pod still holds
/// plaintext connections that bypass them).
pub fn after_failed_repair(reason: &str) -> RepairAction {
    RepairAction {
        policy: RepairPolicy::Restart,
        because: Some(format!(
            "the in-place repair did not finish ({reason}): restarting the sandbox instead"
        )),
    }
}

fn summarize(diffs: &[String]) -> String {
    match diffs {
        [] => "the rules differ".into(),
        [one] => one.clone(),
        [first, rest @ ..] => format!("{first} (and {} more differences)", rest.len()),
    }
}

/// `--repair-policy`: what to do with an unprotected meshed sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RepairPolicy {
    /// Apply the rules in place, prove them, end the connections opened before them.
    Repair,
    /// Stop the sandbox over CRI; the kubelet recreates it through the correct chain.
    Restart,
    /// Delete the pod through the Kubernetes API (UID precondition).
    Delete,
    /// Evict the pod through the Eviction subresource (respects PodDisruptionBudgets).
    Evict,
    /// Change nothing: log, metric, label and Event.
    Report,
}

impl RepairPolicy {
    /// Every policy, in the order `--help` lists them.
    pub const ALL: [RepairPolicy; 5] = [
        RepairPolicy::Repair,
        RepairPolicy::Restart,
        RepairPolicy::Delete,
        RepairPolicy::Evict,
        RepairPolicy::Report,
    ];

    /// The flag value and metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            RepairPolicy::Repair => "repair",
            RepairPolicy::Restart => "restart",
            RepairPolicy::Delete => "delete",
            RepairPolicy::Evict => "evict",
            RepairPolicy::Report => "report",
        }
    }

    /// The next, harsher-or-quieter policy when this one did not work or looped: an
    /// in-place repair that fails becomes a restart; anything else that keeps failing
    /// ends as a report, so nothing loops silently.
    pub fn escalated(self) -> RepairPolicy {
        match self {
            RepairPolicy::Repair => RepairPolicy::Restart,
            _ => RepairPolicy::Report,
        }
    }
}

impl std::fmt::Display for RepairPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for RepairPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        RepairPolicy::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| {
                format!("unknown repair policy {s:?}: expected one of repair, restart, delete, evict, report")
            })
    }
}

/// The action the audit takes for one unprotected sandbox, and why it differs from the
/// configured policy when it does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairAction {
    /// What to do.
    pub policy: RepairPolicy,
    /// Why this is not the configured policy (`None` when it is).
    pub because: Option<String>,
}

/// How many actions on one pod within [`LOOP_WINDOW`] mean that something keeps
/// undoing them (another agent, a mesh's own CNI, a hostile process in the pod): the
/// next one escalates instead of looping.
pub const LOOP_LIMIT: usize = 3;
/// The window of [`LOOP_LIMIT`].
pub const LOOP_WINDOW: Duration = Duration::from_secs(600);

/// What the loop guard knows of one pod's recent actions ([`RepairHistory::view`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoopView {
    /// Actions on the pod within [`LOOP_WINDOW`], whatever its sandbox.
    pub recent: usize,
    /// The harshest of them as an escalation stage of the configured policy (0: the
    /// policy itself, 1: one step harsher, 2: report), see [`stage_of`].
    pub harshest: u8,
}

/// How far `taken` is from `base` along `base → base.escalated() → report`.
pub fn stage_of(base: RepairPolicy, taken: RepairPolicy) -> u8 {
    if taken == base {
        0
    } else if taken == base.escalated() && taken != RepairPolicy::Report {
        1
    } else {
        2
    }
}

/// Chooses the action for an unprotected sandbox.
///
/// `kube` says whether a Kubernetes API is available (delete and evict need it; without
/// it they fall back to a restart over CRI). `seen` is what the loop guard remembers of
/// the sandbox's pod (keyed by namespace, name and UID, so a restart's new sandbox keeps
/// its pod's history): with [`LOOP_LIMIT`] actions within [`LOOP_WINDOW`] the next one
/// is one step harsher than the harshest of them, so the escalation
/// `repair → restart → report` ends in `report` after at most `LOOP_LIMIT + 1` actions.
pub fn choose(policy: RepairPolicy, kube: bool, seen: LoopView) -> RepairAction {
    let mut action = RepairAction {
        policy,
        because: None,
    };
    if matches!(policy, RepairPolicy::Delete | RepairPolicy::Evict) && !kube {
        action = RepairAction {
            policy: RepairPolicy::Restart,
            because: Some(format!(
                "policy {policy} needs the Kubernetes API and the agent runs without one: restarting the sandbox over CRI instead"
            )),
        };
    }
    if seen.recent >= LOOP_LIMIT && action.policy != RepairPolicy::Report {
        let base = action.policy;
        let next = match seen.harshest {
            0 => base.escalated(),
            _ => RepairPolicy::Report,
        };
        action = RepairAction {
            because: Some(format!(
                "acted on this pod {} times within {} s and it is unprotected again (something keeps undoing the rules): {} instead of {}",
                seen.recent,
                LOOP_WINDOW.as_secs(),
                next,
                base
            )),
            policy: next,
        };
    }
    action
}

/// A mirror (static) pod cannot be deleted or evicted through the API (the kubelet
/// recreates it from its manifest at once): such actions become a restart over CRI, and
/// say so.
pub fn for_mirror_pod(action: RepairAction) -> RepairAction {
    match action.policy {
        RepairPolicy::Delete | RepairPolicy::Evict => RepairAction {
            because: Some(format!(
                "the pod is a static (mirror) pod, which the API cannot {}: restarting its sandbox over CRI instead",
                action.policy
            )),
            policy: RepairPolicy::Restart,
        },
        _ => action,
    }
}

/// A sandbox whose pod (by UID) is no longer in the API cannot be deleted or evicted
/// through it: the pod of that name, if any, is another one. Such actions become a
/// restart over CRI (the kubelet does not recreate a sandbox for a pod the API no longer
/// has), and say so.
pub fn for_gone_pod(action: RepairAction, uid: &str) -> RepairAction {
    match action.policy {
        RepairPolicy::Delete | RepairPolicy::Evict => RepairAction {
            because: Some(format!(
                "no pod with UID {uid} in the API (deleted, or another pod now has its name, which is left alone): restarting the sandbox over CRI instead of {}",
                action.policy
            )),
            policy: RepairPolicy::Restart,
        },
        _ => action,
    }
}

/// What the pod cache shows of an unprotected sandbox's pod, for [`wait_for_api`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodSeen {
    /// No Kubernetes API.
    NoApi,
    /// The pod cache has not synced with the API yet.
    NotSynced,
    /// The pod, being deleted already (it has a deletion timestamp).
    Terminating,
    /// No pod with the sandbox's UID in a synced cache: it was deleted, or another pod
    /// now has its name (which nothing may touch).
    Gone,
    /// Anything else (the pod, or no such pod in a synced cache).
    Known,
}

/// Why acting through the API on a sandbox must wait for a later pass, if it must
/// (pure). Before the pod cache has synced, the API policies (`delete`, `evict`,
/// `report`'s label) cannot tell a static pod (which must not be deleted) and would act
/// without the pod's Event; a pod being deleted already needs no second delete or
/// eviction. An in-place repair or a restart never waits.
pub fn wait_for_api(policy: RepairPolicy, pod: PodSeen) -> Option<&'static str> {
    let through_api = matches!(
        policy,
        RepairPolicy::Delete | RepairPolicy::Evict | RepairPolicy::Report
    );
    match pod {
        PodSeen::NotSynced if through_api => Some(
            "the pod cache has not synced with the Kubernetes API yet (a static pod cannot be told, and the pod's Event would be lost)",
        ),
        PodSeen::Terminating if matches!(policy, RepairPolicy::Delete | RepairPolicy::Evict) => {
            Some("the pod is being deleted already")
        }
        _ => None,
    }
}

/// The Event (reason, warning?) a finished action publishes on its pod: `Restarted`,
/// `Deleted`, `Evicted` when done, `RepairFailed` when an action failed for good. An
/// in-place repair that worked publishes `Repaired`, and `report` publishes
/// `Unprotected`, where they happen; an action that escalates publishes nothing itself
/// (the next one will).
pub fn event_for(
    policy: RepairPolicy,
    done: bool,
    escalates: bool,
) -> Option<(&'static str, bool)> {
    match (done, escalates) {
        (true, _) => match policy {
            RepairPolicy::Restart => Some(("Restarted", true)),
            RepairPolicy::Delete => Some(("Deleted", true)),
            RepairPolicy::Evict => Some(("Evicted", true)),
            RepairPolicy::Repair | RepairPolicy::Report => None,
        },
        (false, true) => None,
        (false, false) => Some(("RepairFailed", true)),
    }
}

/// Remembers the actions on each pod (across its sandboxes), for the loop guard
/// ([`choose`]'s `seen`).
#[derive(Debug, Default)]
pub struct RepairHistory {
    by_pod: BTreeMap<PodKey, VecDeque<(Instant, RepairPolicy)>>,
}

impl RepairHistory {
    /// What the guard knows of `pod` at `now`, with stages counted from `base`.
    pub fn view(&mut self, pod: &PodKey, base: RepairPolicy, now: Instant) -> LoopView {
        let Some(q) = self.by_pod.get_mut(pod) else {
            return LoopView::default();
        };
        while q
            .front()
            .is_some_and(|(t, _)| now.saturating_duration_since(*t) > LOOP_WINDOW)
        {
            q.pop_front();
        }
        LoopView {
            recent: q.len(),
            harshest: q.iter().map(|(_, p)| stage_of(base, *p)).max().unwrap_or(0),
        }
    }

    /// Records the action `taken` on `pod` at `now`.
    pub fn record(&mut self, pod: &PodKey, taken: RepairPolicy, now: Instant) {
        self.by_pod
            .entry(pod.clone())
            .or_default()
            .push_back((now, taken));
    }

    /// Forgets pods with no action within [`LOOP_WINDOW`] before `now` (bounded memory
    /// as pods come and go; a pod between two sandboxes keeps its history).
    pub fn forget_old(&mut self, now: Instant) {
        self.by_pod.retain(|_, q| {
            q.back()
                .is_some_and(|(t, _)| now.saturating_duration_since(*t) <= LOOP_WINDOW)
        });
    }

    /// Pods remembered.
    pub fn len(&self) -> usize {
        self.by_pod.len()
    }

    /// Whether no pod is remembered.
    pub fn is_empty(&self) -> bool {
        self.by_pod.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every verdict's label is one `interlock_sandboxes` reports (zero included).
    #[test]
    fn every_verdict_label_is_a_reported_series() {
        use crate::health::metrics::VerdictLabel;
        let all = [
            Verdict::Protected,
            Verdict::Unprotected { reason: "r".into() },
            Verdict::NotMeshed { reason: "r".into() },
            Verdict::Unknown { reason: "r".into() },
        ];
        let labels: Vec<&str> = all.iter().map(Verdict::label).collect();
        assert_eq!(labels, VerdictLabel::ALL);
    }

    #[test]
    fn api_policies_wait_for_the_pod_cache_and_never_act_twice_on_a_deleted_pod() {
        use RepairPolicy::*;
        for policy in [Delete, Evict, Report] {
            assert!(
                wait_for_api(policy, PodSeen::NotSynced).is_some(),
                "{policy}"
            );
        }
        for policy in [Delete, Evict] {
            assert!(
                wait_for_api(policy, PodSeen::Terminating).is_some(),
                "{policy}"
            );
        }
        // Report still reports a terminating pod; repair and restart never wait.
        assert_eq!(wait_for_api(Report, PodSeen::Terminating), None);
        for pod in [PodSeen::NotSynced, PodSeen::Terminating, PodSeen::NoApi] {
            assert_eq!(wait_for_api(Repair, pod), None);
            assert_eq!(wait_for_api(Restart, pod), None);
        }
        for policy in [Repair, Restart, Delete, Evict, Report] {
            assert_eq!(wait_for_api(policy, PodSeen::Known), None);
            assert_eq!(wait_for_api(policy, PodSeen::NoApi), None);
        }
    }
    use interlock_contract::config::PluginConfig;

    fn meshed() -> Decision {
        let mut a = BTreeMap::new();
        a.insert("interlock.dev/redirect".to_string(), "enabled".to_string());
        interlock_redirect::decision::decide(
            &PluginConfig::default(),
            "shop",
            "shop/web",
            Some(&a),
            None,
        )
    }

    #[test]
    fn verdicts() {
        assert_eq!(
            judge(&meshed(), Some(&RulesSeen::Exact)),
            Verdict::Protected
        );
        let v = judge(
            &meshed(),
            Some(&RulesSeen::Mismatch(vec![
                "table inet interlock missing".into()
            ])),
        );
        assert_eq!(v.label(), "unprotected");
        let Verdict::Unprotected { reason } = v else {
            unreachable!()
        };
        assert!(
            reason.contains("generic") && reason.contains("table inet interlock missing"),
            "{reason}"
        );
        assert_eq!(
            judge(&meshed(), Some(&RulesSeen::Error("EPERM".into()))).label(),
            "unknown"
        );
        assert_eq!(judge(&meshed(), None).label(), "unknown");
        let plain = interlock_redirect::decision::decide(
            &PluginConfig::default(),
            "shop",
            "shop/web",
            Some(&BTreeMap::new()),
            None,
        );
        assert_eq!(judge(&plain, None).label(), "not_meshed");
        let unknown = interlock_redirect::decision::decide(
            &PluginConfig::default(),
            "shop",
            "shop/web",
            None,
            None,
        );
        assert_eq!(judge(&unknown, None).label(), "unknown");
    }

    #[test]
    fn the_plugins_record_is_cross_checked() {
        let rec = |lists_sandbox, spec_hash| {
            Some(RecordView {
                lists_sandbox,
                spec_hash,
                shape: RULE_SHAPE,
            })
        };
        assert_eq!(cross_check(RulesSeen::Exact, None, "h1"), RulesSeen::Exact);
        assert_eq!(
            cross_check(RulesSeen::Exact, rec(true, "h1"), "h1"),
            RulesSeen::Exact
        );
        let RulesSeen::Mismatch(d) = cross_check(RulesSeen::Exact, rec(true, "h0"), "h1") else {
            unreachable!()
        };
        assert!(d[0].contains("recorded spec h0"), "{d:?}");
        let RulesSeen::Mismatch(d) = cross_check(
            RulesSeen::Mismatch(vec!["table missing".into()]),
            rec(false, "h1"),
            "h1",
        ) else {
            unreachable!()
        };
        assert_eq!(d.len(), 2, "{d:?}");
        assert!(d[1].contains("does not list"), "{d:?}");
        assert_eq!(
            cross_check(RulesSeen::Error("EPERM".into()), rec(false, "h0"), "h1"),
            RulesSeen::Error("EPERM".into())
        );
    }

    /// An upgrade must not reset every meshed connection: rules an older release wrote
    /// are judged by a connection, not rewritten for their shape; a newer release's are
    /// left alone by an older agent.
    #[test]
    fn rules_of_another_release_are_judged_by_their_shape() {
        let view = |shape, lists_sandbox| {
            Some(RecordView {
                lists_sandbox,
                spec_hash: "h0",
                shape,
            })
        };
        let differs = || RulesSeen::Mismatch(vec!["rule 3 differs".into()]);
        // Older: a connection decides.
        let older = cross_check(differs(), view(1, true), "h1");
        let RulesSeen::OlderShape { shape: 1, diffs } = &older else {
            panic!("{older:?}")
        };
        assert_eq!(diffs.len(), 2, "{diffs:?}");
        assert_eq!(judge(&meshed(), Some(&older)).label(), "unknown");
        let proven = resolve_older(older.clone(), Ok("IPv4: landed on 15001".into()));
        assert_eq!(judge(&meshed(), Some(&proven)), Verdict::Protected);
        let damaged = resolve_older(older, Err("nothing captured 10.0.0.1:1".into()));
        let Verdict::Unprotected { reason } = judge(&meshed(), Some(&damaged)) else {
            panic!("{damaged:?}")
        };
        assert!(
            reason.contains("rule shape 1") && reason.contains("nothing captured"),
            "{reason}"
        );
        // Older but exactly this build's rules and spec: simply protected.
        assert_eq!(
            cross_check(
                RulesSeen::Exact,
                Some(RecordView {
                    lists_sandbox: true,
                    spec_hash: "h1",
                    shape: 1
                }),
                "h1"
            ),
            RulesSeen::Exact
        );
        // Older, but the record does not list the sandbox: a mismatch whatever the shape.
        assert!(matches!(
            cross_check(differs(), view(1, false), "h1"),
            RulesSeen::Mismatch(_)
        ));
        // Newer: left alone, whatever the read-back says, and said so.
        for seen in [differs(), RulesSeen::Exact] {
            let newer = cross_check(seen, view(RULE_SHAPE + 1, true), "h1");
            assert_eq!(
                newer,
                RulesSeen::Newer {
                    shape: RULE_SHAPE + 1
                }
            );
            let Verdict::Unknown { reason } = judge(&meshed(), Some(&newer)) else {
                unreachable!()
            };
            assert!(
                reason.contains("newer interlock") && reason.contains("left as they are"),
                "{reason}"
            );
        }
        // A read error stays one.
        assert!(matches!(
            cross_check(RulesSeen::Error("EPERM".into()), view(1, true), "h1"),
            RulesSeen::Error(_)
        ));
    }

    #[test]
    fn a_failed_repair_becomes_a_restart_with_its_reason() {
        let a = after_failed_repair("the kernel refused SOCK_DESTROY");
        assert_eq!(a.policy, RepairPolicy::Restart);
        assert!(a.because.unwrap().contains("refused SOCK_DESTROY"));
    }

    #[test]
    fn policies_parse_and_print() {
        for p in RepairPolicy::ALL {
            assert_eq!(p.as_str().parse::<RepairPolicy>().unwrap(), p);
        }
        let e = "reboot".parse::<RepairPolicy>().unwrap_err();
        assert!(e.contains("reboot") && e.contains("evict"), "{e}");
    }

    #[test]
    fn delete_and_evict_without_an_api_restart_and_say_so() {
        for p in [RepairPolicy::Delete, RepairPolicy::Evict] {
            let a = choose(p, false, LoopView::default());
            assert_eq!(a.policy, RepairPolicy::Restart);
            assert!(a.because.unwrap().contains(p.as_str()));
            assert_eq!(
                choose(p, true, LoopView::default()),
                RepairAction {
                    policy: p,
                    because: None
                }
            );
        }
        assert_eq!(
            choose(RepairPolicy::Repair, false, LoopView::default()).because,
            None
        );
    }

    fn seen(recent: usize, harshest: u8) -> LoopView {
        LoopView { recent, harshest }
    }

    #[test]
    fn the_loop_guard_escalates_and_ends_in_report() {
        use RepairPolicy::*;
        assert_eq!(choose(Repair, true, seen(LOOP_LIMIT - 1, 0)).policy, Repair);
        let a = choose(Repair, true, seen(LOOP_LIMIT, 0));
        assert_eq!(a.policy, Restart);
        assert!(a.because.unwrap().contains("keeps undoing"));
        // Once an escalated action is in the window, the next one reports.
        assert_eq!(choose(Repair, true, seen(LOOP_LIMIT + 1, 1)).policy, Report);
        assert_eq!(choose(Restart, true, seen(LOOP_LIMIT, 0)).policy, Report);
        assert_eq!(choose(Evict, true, seen(LOOP_LIMIT, 0)).policy, Report);
        assert_eq!(
            choose(Report, true, seen(99, 2)),
            RepairAction {
                policy: Report,
                because: None
            }
        );
        assert_eq!(stage_of(Repair, Repair), 0);
        assert_eq!(stage_of(Repair, Restart), 1);
        assert_eq!(stage_of(Repair, Report), 2);
        assert_eq!(stage_of(Restart, Report), 2);
    }

    /// M-3: a pod whose rules keep being undone gets new sandboxes from its restarts; the
    /// history follows the pod, so repair → restart → report ends in report within
    /// LOOP_LIMIT + 1 actions, whatever the sandbox IDs.
    #[test]
    fn the_loop_guard_follows_the_pod_across_its_sandboxes() {
        let pod = PodKey {
            namespace: "shop".into(),
            name: "loop".into(),
            uid: "u-1".into(),
        };
        let mut h = RepairHistory::default();
        let t0 = Instant::now();
        let mut taken = vec![];
        for i in 0..8u64 {
            let now = t0 + Duration::from_secs(i);
            let a = choose(
                RepairPolicy::Repair,
                false,
                h.view(&pod, RepairPolicy::Repair, now),
            );
            h.record(&pod, a.policy, now);
            taken.push(a.policy);
            // The restart's new sandbox belongs to the same pod: nothing to forget.
            h.forget_old(now);
        }
        use RepairPolicy::*;
        assert_eq!(
            taken,
            [Repair, Repair, Repair, Restart, Report, Report, Report, Report]
        );
        // Another pod of the same name (another UID) starts afresh.
        let other = PodKey {
            uid: "u-2".into(),
            ..pod.clone()
        };
        assert_eq!(h.view(&other, Repair, t0).recent, 0);
        // Old actions leave the window and the memory.
        h.forget_old(t0 + LOOP_WINDOW + Duration::from_secs(30));
        assert!(h.is_empty());
    }

    #[test]
    fn mirror_pods_are_restarted_instead_of_deleted_or_evicted() {
        for p in [RepairPolicy::Delete, RepairPolicy::Evict] {
            let a = for_mirror_pod(RepairAction {
                policy: p,
                because: None,
            });
            assert_eq!(a.policy, RepairPolicy::Restart);
            assert!(a.because.unwrap().contains("static (mirror) pod"));
        }
        let r = RepairAction {
            policy: RepairPolicy::Repair,
            because: None,
        };
        assert_eq!(for_mirror_pod(r.clone()), r);
    }

    #[test]
    fn actions_publish_the_contract_events() {
        assert_eq!(
            event_for(RepairPolicy::Restart, true, false),
            Some(("Restarted", true))
        );
        assert_eq!(
            event_for(RepairPolicy::Delete, true, false),
            Some(("Deleted", true))
        );
        assert_eq!(
            event_for(RepairPolicy::Evict, true, false),
            Some(("Evicted", true))
        );
        assert_eq!(
            event_for(RepairPolicy::Repair, true, false),
            None,
            "Repaired is sent by the repair"
        );
        assert_eq!(
            event_for(RepairPolicy::Report, true, false),
            None,
            "Unprotected is sent by the report"
        );
        assert_eq!(
            event_for(RepairPolicy::Repair, false, true),
            None,
            "the escalation reports"
        );
        for p in RepairPolicy::ALL {
            assert_eq!(event_for(p, false, false), Some(("RepairFailed", true)));
        }
    }

    #[test]
    fn history_counts_within_the_window() {
        let pod = |uid: &str| PodKey {
            namespace: "shop".into(),
            name: "web".into(),
            uid: uid.into(),
        };
        let mut h = RepairHistory::default();
        let t0 = Instant::now();
        h.record(&pod("a"), RepairPolicy::Repair, t0);
        h.record(
            &pod("a"),
            RepairPolicy::Restart,
            t0 + Duration::from_secs(10),
        );
        let v = h.view(
            &pod("a"),
            RepairPolicy::Repair,
            t0 + Duration::from_secs(20),
        );
        assert_eq!((v.recent, v.harshest), (2, 1));
        let v = h.view(
            &pod("a"),
            RepairPolicy::Repair,
            t0 + LOOP_WINDOW + Duration::from_secs(5),
        );
        assert_eq!((v.recent, v.harshest), (1, 1));
        assert_eq!(h.view(&pod("b"), RepairPolicy::Repair, t0).recent, 0);
    }
}

//! The sandbox audit's decisions (pure): is a running sandbox protected, and what the
//! repair policy does about one that is not.
//!
//! The thin layer that lists sandboxes over CRI, enters their netns and acts lives
//! elsewhere; everything here takes what was observed and returns what to do, so every
//! rule is tested without root. Sandboxes are keyed by sandbox ID and netns identity,
//! never by pod UID: a replaced sandbox keeps its pod's UID.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use interlock_redirect::decision::Decision;

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
    /// `unknown`).
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Protected => "protected",
            Verdict::Unprotected { .. } => "unprotected",
            Verdict::NotMeshed { .. } => "not_meshed",
            Verdict::Unknown { .. } => "unknown",
        }
    }

    /// Every label, for metrics that must report zero too.
    pub const LABELS: [&'static str; 4] = ["protected", "unprotected", "not_meshed", "unknown"];
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
            Some(RulesSeen::Exact) => Verdict::Protected,
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
        e @ RulesSeen::Error(_) => return e,
    };
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
    } else {
        RulesSeen::Mismatch(diffs)
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

/// How many repairs of one sandbox within [`LOOP_WINDOW`] mean that something keeps
/// undoing them (another agent, a mesh's own CNI, a hostile process in the pod): the
/// next one escalates instead of looping.
pub const LOOP_LIMIT: usize = 3;
/// The window of [`LOOP_LIMIT`].
pub const LOOP_WINDOW: Duration = Duration::from_secs(600);

/// Chooses the action for an unprotected sandbox.
///
/// `kube` says whether a Kubernetes API is available (delete and evict need it; without
/// it they fall back to a restart over CRI). `recent` is how many times this sandbox was
/// acted on within [`LOOP_WINDOW`].
pub fn choose(policy: RepairPolicy, kube: bool, recent: usize) -> RepairAction {
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
    if recent >= LOOP_LIMIT && action.policy != RepairPolicy::Report {
        let next = action.policy.escalated();
        action = RepairAction {
            because: Some(format!(
                "acted on {recent} times within {} s and it is unprotected again (something keeps undoing the rules): {} instead of {}",
                LOOP_WINDOW.as_secs(),
                next,
                action.policy
            )),
            policy: next,
        };
    }
    action
}

/// The annotation the kubelet puts on the API copy (mirror) of a static pod.
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

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

/// What the pod cache shows of an unprotected sandbox's pod, for [`wait_for_api`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodSeen {
    /// No Kubernetes API.
    NoApi,
    /// The pod cache has not synced with the API yet.
    NotSynced,
    /// The pod, being deleted already (it has a deletion timestamp).
    Terminating,
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

/// Remembers when each sandbox was acted on, for the loop guard ([`choose`]'s `recent`).
#[derive(Debug, Default)]
pub struct RepairHistory {
    by_sandbox: BTreeMap<String, VecDeque<Instant>>,
}

impl RepairHistory {
    /// How many actions on `sandbox` fall within [`LOOP_WINDOW`] before `now`.
    pub fn recent(&mut self, sandbox: &str, now: Instant) -> usize {
        match self.by_sandbox.get_mut(sandbox) {
            Some(q) => {
                while q
                    .front()
                    .is_some_and(|t| now.duration_since(*t) > LOOP_WINDOW)
                {
                    q.pop_front();
                }
                q.len()
            }
            None => 0,
        }
    }

    /// Records an action on `sandbox` at `now`.
    pub fn record(&mut self, sandbox: &str, now: Instant) {
        self.by_sandbox
            .entry(sandbox.to_string())
            .or_default()
            .push_back(now);
    }

    /// Forgets sandboxes that no longer run (bounded memory as pods come and go).
    pub fn retain_running<'a>(&mut self, running: impl IntoIterator<Item = &'a str>) {
        let keep: std::collections::BTreeSet<&str> = running.into_iter().collect();
        self.by_sandbox.retain(|id, _| keep.contains(id.as_str()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            let a = choose(p, false, 0);
            assert_eq!(a.policy, RepairPolicy::Restart);
            assert!(a.because.unwrap().contains(p.as_str()));
            assert_eq!(
                choose(p, true, 0),
                RepairAction {
                    policy: p,
                    because: None
                }
            );
        }
        assert_eq!(choose(RepairPolicy::Repair, false, 0).because, None);
    }

    #[test]
    fn the_loop_guard_escalates_and_ends_in_report() {
        assert_eq!(
            choose(RepairPolicy::Repair, true, LOOP_LIMIT - 1).policy,
            RepairPolicy::Repair
        );
        let a = choose(RepairPolicy::Repair, true, LOOP_LIMIT);
        assert_eq!(a.policy, RepairPolicy::Restart);
        assert!(a.because.unwrap().contains("keeps undoing"));
        assert_eq!(
            choose(RepairPolicy::Restart, true, LOOP_LIMIT).policy,
            RepairPolicy::Report
        );
        assert_eq!(
            choose(RepairPolicy::Evict, true, LOOP_LIMIT).policy,
            RepairPolicy::Report
        );
        assert_eq!(
            choose(RepairPolicy::Report, true, 99),
            RepairAction {
                policy: RepairPolicy::Report,
                because: None
            }
        );
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
    fn history_counts_within_the_window_and_forgets_gone_sandboxes() {
        let mut h = RepairHistory::default();
        let t0 = Instant::now();
        h.record("s1", t0);
        h.record("s1", t0 + Duration::from_secs(10));
        assert_eq!(h.recent("s1", t0 + Duration::from_secs(20)), 2);
        assert_eq!(h.recent("s1", t0 + LOOP_WINDOW + Duration::from_secs(5)), 1);
        assert_eq!(h.recent("s2", t0), 0);
        h.retain_running(["s2"]);
        assert_eq!(h.recent("s1", t0), 0);
    }
}

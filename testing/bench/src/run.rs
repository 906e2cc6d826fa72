//! Sampling every scenario in interleaved rounds.
//!
//! Each round creates one pool of fresh pod netns for all scenarios (not measured), then
//! runs each scenario's share of samples, one pod per sample, starting with a different
//! scenario every round so that background load (the machine is shared) does not bias one
//! scenario. The first sample of each scenario in every round is checked after the fact
//! (outside the timing): the baselines and the engine must have installed exactly the
//! bench rule set, an unmeshed ADD none, and a meshed plugin ADD shows whether the
//! plugin's redirection is wired in (rules visible in the pod) or not. At the end of a
//! round every attachment the plugin added gets its DEL, before the pods' netns are
//! deleted, as a runtime does ([`Bench::release_attachments`]).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use interlock_redirect::BackendKind;

use crate::{Bench, BenchError, Pod, Sample, Scenario};

/// How many samples to take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Samples per scenario, except the per-rule baseline.
    pub samples: usize,
    /// Samples of each per-rule `iptables` baseline (about 100 ms each).
    pub per_rule_samples: usize,
    /// Rounds the samples are spread over.
    pub rounds: usize,
    /// Scenarios to run, in report order.
    pub scenarios: Vec<Scenario>,
    /// One unrecorded sample per scenario first (page cache, lazy module loading).
    pub warmup: bool,
}

impl Plan {
    /// The default run: 200 samples (20 per-rule) in 10 rounds, about a minute on 2 cores.
    pub fn standard() -> Plan {
        Plan {
            samples: 200,
            per_rule_samples: 20,
            rounds: 10,
            scenarios: Scenario::all(),
            warmup: true,
        }
    }

    /// A smoke run: a few samples of everything.
    pub fn quick() -> Plan {
        Plan {
            samples: 6,
            per_rule_samples: 2,
            rounds: 2,
            scenarios: Scenario::all(),
            warmup: true,
        }
    }

    /// Total samples of `s`.
    pub fn samples_of(&self, s: Scenario) -> usize {
        if s.is_per_rule() {
            self.per_rule_samples
        } else {
            self.samples
        }
    }

    /// Samples of `s` in round `r`.
    fn share(&self, s: Scenario, r: usize) -> usize {
        let total = self.samples_of(s);
        let rounds = self.rounds.max(1);
        total / rounds + usize::from(r < total % rounds)
    }
}

/// Whether the plugin's ADD installed rules for meshed pods, as observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Wiring {
    /// Samples checked.
    pub checked: usize,
    /// Of those, samples after which interlock's rules were visible in the pod netns.
    pub visible: usize,
    /// Of the visible ones, samples whose rules read back exactly as the bench spec.
    pub exact: usize,
}

impl Wiring {
    /// True when every checked ADD left rules behind.
    pub fn wired(&self) -> bool {
        self.checked > 0 && self.visible == self.checked
    }
}

/// How many checked ADDs' notes reached the live agent socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AgentNotes {
    /// Samples checked.
    pub checked: usize,
    /// Of those, notes the socket took.
    pub taken: usize,
}

/// Everything a run measured.
#[derive(Debug, Clone, Default)]
pub struct Collected {
    /// Samples per scenario, in plan order.
    pub samples: Vec<(Scenario, Vec<Sample>)>,
    /// Observed wiring of the plugin ADD per backend.
    pub wiring: BTreeMap<&'static str, Wiring>,
    /// Things worth knowing about the run (mismatches seen, …).
    pub notes: Vec<String>,
    /// Per scenario key, the notes of checked samples whose ADD had `agentSocket` set
    /// ([`Scenario::AddMeshed`]: the lookup; [`Scenario::AddGeneric`]`(true)`: the
    /// `added` note).
    pub agent_notes: BTreeMap<String, AgentNotes>,
    /// Wall time of the whole run, setup included.
    pub elapsed: Duration,
}

impl Collected {
    /// The samples of `s`.
    pub fn of(&self, s: Scenario) -> &[Sample] {
        self.samples
            .iter()
            .find(|(x, _)| *x == s)
            .map_or(&[], |(_, v)| v.as_slice())
    }

    /// Observed wiring for `kind`.
    pub fn wiring_of(&self, kind: BackendKind) -> Wiring {
        self.wiring.get(kind.as_str()).copied().unwrap_or_default()
    }
}

/// Counts whether the live agent socket took the note of the ADD in `pod`. The `added`
/// note is best effort (20 ms in the plugin): one that did not arrive is counted, so that
/// a figure made of ADDs without it is visible as such.
fn count_note(bench: &Bench, s: Scenario, pod: &Pod, collected: &mut Collected) {
    let n = collected.agent_notes.entry(s.key()).or_default();
    n.checked += 1;
    if bench.agent_noted(pod) {
        n.taken += 1;
    } else {
        collected.notes.push(format!(
            "{}: the ADD's note did not reach the live agent socket",
            s.key()
        ));
    }
}

/// Checks a sample's pod after the measurement (not timed).
fn after_check(
    bench: &Bench,
    s: Scenario,
    pod: &Pod,
    collected: &mut Collected,
) -> Result<(), BenchError> {
    let fail = |msg: String| BenchError::Sample {
        scenario: s.key(),
        netns: pod.name().to_string(),
        msg,
    };
    match s {
        Scenario::AddMeshed(kind) => {
            let visible = bench.rules_visible(pod, kind);
            let exact = visible && bench.rules_exact(pod, kind).is_ok();
            let w = collected.wiring.entry(kind.as_str()).or_default();
            w.checked += 1;
            w.visible += usize::from(visible);
            w.exact += usize::from(exact);
            if visible && !exact {
                let why = bench.rules_exact(pod, kind).err().unwrap_or_default();
                collected.notes.push(format!(
                    "{}: the plugin installed rules that differ from the bench spec: {why}",
                    s.key()
                ));
            }
            count_note(bench, s, pod, collected);
        }
        Scenario::AddGeneric(note) => {
            if note {
                count_note(bench, s, pod, collected);
            }
            bench.generic_rules_exact(pod).map_err(|why| {
                fail(format!(
                    "the rules read back are not the generic profile's rule set: {why}"
                ))
            })?;
        }
        Scenario::SpawnFloor | Scenario::StaticFloor | Scenario::LeanFloor => {}
        Scenario::AddUnmeshed => {
            if let Some(k) = BackendKind::ALL
                .into_iter()
                .find(|k| bench.rules_visible(pod, *k))
            {
                return Err(fail(format!(
                    "an unmeshed pod got {k} rules from the plugin"
                )));
            }
        }
        Scenario::Engine(_)
        | Scenario::RestorePerFamily(_)
        | Scenario::IstioStandIn
        | Scenario::PerRule(_) => {
            let kind = s.rules_backend().expect("these install rules");
            bench.rules_exact(pod, kind).map_err(|why| {
                fail(format!(
                    "the rules read back with {kind} are not the bench rule set: {why}"
                ))
            })?;
        }
    }
    Ok(())
}

/// Runs `plan` on `bench`; `progress` gets a line per round.
pub fn run(
    bench: &Bench,
    plan: &Plan,
    progress: &mut dyn FnMut(&str),
) -> Result<Collected, BenchError> {
    let start = Instant::now();
    let mut collected = Collected {
        samples: plan.scenarios.iter().map(|s| (*s, Vec::new())).collect(),
        ..Collected::default()
    };
    let n = plan.scenarios.len();

    if plan.warmup {
        let pods = bench.pods(n)?;
        for (s, pod) in plan.scenarios.iter().zip(&pods) {
            bench.sample(*s, pod)?;
            after_check(bench, *s, pod, &mut collected)?;
        }
        bench.release_attachments()?;
        progress(&format!("warm-up done ({n} scenarios)"));
    }

    for r in 0..plan.rounds.max(1) {
        let shares: Vec<usize> = plan.scenarios.iter().map(|s| plan.share(*s, r)).collect();
        let total: usize = shares.iter().sum();
        if total == 0 {
            continue;
        }
        // Let the previous round's netns teardown (asynchronous in the kernel) finish.
        std::thread::sleep(Duration::from_millis(150));
        let mut pods = bench.pods(total)?.into_iter();
        std::thread::sleep(Duration::from_millis(50));
        let order: Vec<usize> = (0..n).map(|i| (i + r) % n).collect();
        let mut pools: Vec<Vec<Pod>> = shares
            .iter()
            .map(|&k| pods.by_ref().take(k).collect())
            .collect();
        for &i in &order {
            let s = plan.scenarios[i];
            for (j, pod) in pools[i].iter().enumerate() {
                let sample = bench.sample(s, pod)?;
                collected.samples[i].1.push(sample);
                if j == 0 {
                    after_check(bench, s, pod, &mut collected)?;
                }
            }
        }
        // The runtime's DEL before each pod's netns goes (not timed).
        bench.release_attachments()?;
        pools.clear();
        progress(&format!(
            "round {}/{} done ({total} samples, {:.1}s)",
            r + 1,
            plan.rounds.max(1),
            start.elapsed().as_secs_f64()
        ));
    }
    collected.elapsed = start.elapsed();
    Ok(collected)
}

//! What the demo saw, judged and written for a newcomer: one line per pod, one line for
//! the node, the `interlock check` it ran, and a final verdict per scenario and side.
//! Everything here is pure (tested without root); the scenarios gather the facts.

use std::fmt::Write as _;

use crate::capture::{Landing, Traffic};
use crate::node_box::{CheckRun, NodeView, PodView};
use crate::pods::PodSpec;

/// How far a pod got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Started {
    /// Its sandbox runs with this IP.
    Running(String),
    /// The runtime refused it (the kubelet would retry): why.
    Failed(String),
}

/// Everything observed about one pod at the end of a side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodOutcome {
    /// The pod.
    pub spec: PodSpec,
    /// Whether its sandbox runs.
    pub started: Started,
    /// Where its connections landed (for a running pod).
    pub traffic: Option<Traffic>,
    /// For a pod that had a connection open before the check: `Ok` when it is still
    /// open, else how it ended.
    pub earlier_connection: Option<Result<(), String>>,
    /// Its label and Events in the API.
    pub view: PodView,
}

/// The judgement on one pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protection {
    /// Meshed, running, both directions redirected.
    Redirected,
    /// Meshed and running, but not (fully) redirected: the failure interlock prevents.
    Unprotected,
    /// Not running (a meshed pod without an IP is not exposed, but it is not serving).
    NotStarted,
    /// Not meshed, running, its traffic untouched.
    LeftAlone,
    /// Not meshed but its traffic was redirected or lost: interlock must not do that.
    Disturbed,
}

impl PodOutcome {
    /// Judges the pod from what the connections showed.
    pub fn protection(&self) -> Protection {
        let Started::Running(_) = self.started else {
            return Protection::NotStarted;
        };
        let traffic = self.traffic.as_ref();
        match (self.spec.mesh.meshed(), traffic) {
            (true, Some(t)) if t.redirected() => Protection::Redirected,
            (true, _) => Protection::Unprotected,
            (false, Some(t)) if t.direct() => Protection::LeftAlone,
            (false, _) => Protection::Disturbed,
        }
    }
}

/// One side of a scenario, as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SideOutcome {
    /// Whether interlock's agent ran on this side.
    pub with_interlock: bool,
    /// The pods at the end.
    pub pods: Vec<PodOutcome>,
    /// The node in the API at the end.
    pub node: NodeView,
    /// A fact worth one word in the verdict table (e.g. how fast the repair was).
    pub highlight: Option<String>,
    /// Where `interlock check` contradicted the connections (empty: it agreed).
    pub check_disagreements: Vec<String>,
}

impl SideOutcome {
    fn meshed(&self) -> impl Iterator<Item = &PodOutcome> {
        self.pods.iter().filter(|p| p.spec.mesh.meshed())
    }

    /// Every meshed pod runs redirected and every other pod runs untouched.
    pub fn all_protected(&self) -> bool {
        self.meshed()
            .all(|p| p.protection() == Protection::Redirected)
            && self
                .pods
                .iter()
                .filter(|p| !p.spec.mesh.meshed())
                .all(|p| p.protection() == Protection::LeftAlone)
    }

    /// A few words: how many meshed pods were redirected, and what else happened.
    pub fn summary(&self) -> String {
        let total = self.meshed().count();
        let count = |want: Protection| self.meshed().filter(|p| p.protection() == want).count();
        let mut parts = vec![format!(
            "{}/{total} redirected",
            count(Protection::Redirected)
        )];
        let unprotected = count(Protection::Unprotected);
        if unprotected > 0 {
            parts.push(format!("{unprotected} UNPROTECTED"));
        }
        let failed = self
            .pods
            .iter()
            .filter(|p| p.protection() == Protection::NotStarted)
            .count();
        if failed > 0 {
            parts.push(format!("{failed} not started"));
        }
        let disturbed = self
            .pods
            .iter()
            .filter(|p| p.protection() == Protection::Disturbed)
            .count();
        if disturbed > 0 {
            parts.push(format!("{disturbed} unmeshed DISTURBED"));
        }
        if !self.check_disagreements.is_empty() {
            parts.push("CHECK WRONG".into());
        }
        if let Some(h) = &self.highlight {
            parts.push(h.clone());
        }
        parts.join(", ")
    }
}

/// A scenario: what it replays and its two sides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScenarioOutcome {
    /// 1, 2, 3.
    pub number: u32,
    /// Its short title.
    pub title: &'static str,
    /// Without interlock.
    pub without: SideOutcome,
    /// With interlock.
    pub with: SideOutcome,
}

const POD_COLUMNS: [(&str, usize); 6] = [
    ("POD", 9),
    ("MESH", 7),
    ("IP", 12),
    ("TRAFFIC", 38),
    ("EARLIER CONN", 20),
    ("LABEL", 5),
];

/// The header of the pod table.
pub fn pod_header() -> String {
    let mut s = String::from("    ");
    for (name, width) in POD_COLUMNS {
        let _ = write!(s, "{name:<width$} ");
    }
    s.push_str("EVENTS");
    s
}

/// One line for one pod: name, mesh, IP, where its traffic went, its label and Events.
pub fn pod_line(p: &PodOutcome) -> String {
    let ip = match &p.started {
        Started::Running(ip) => ip.clone(),
        Started::Failed(_) => "-".into(),
    };
    let traffic = traffic_words(p);
    let earlier = match &p.earlier_connection {
        None => "-".to_string(),
        Some(Ok(())) => "still open".to_string(),
        Some(Err(how)) => how.clone(),
    };
    let label = p.view.unprotected_label.as_deref().unwrap_or("-");
    let events = if p.view.events.is_empty() {
        "-".to_string()
    } else {
        p.view.events.join(",")
    };
    let cells = [
        p.spec.full_name(),
        p.spec.mesh.label().to_string(),
        ip,
        traffic,
        earlier,
        label.to_string(),
    ];
    let mut s = String::from("    ");
    for ((_, width), cell) in POD_COLUMNS.iter().zip(cells) {
        let _ = write!(s, "{cell:<width$} ");
    }
    s.push_str(&events);
    s
}

fn traffic_words(p: &PodOutcome) -> String {
    match p.protection() {
        Protection::NotStarted => "NOT STARTED (see ↳ below)".to_string(),
        Protection::Redirected => "redirected (out+in)".to_string(),
        Protection::LeftAlone => "direct (not meshed)".to_string(),
        Protection::Unprotected | Protection::Disturbed => {
            let prefix = if p.spec.mesh.meshed() {
                "NOT REDIRECTED"
            } else {
                "DISTURBED"
            };
            match &p.traffic {
                Some(t) => format!("{prefix} ({})", landing_words(t)),
                None => format!("{prefix} (not checked)"),
            }
        }
    }
}

/// What the table cuts short, for under it: why pods did not start (each reason once)
/// and where a connection got lost.
pub fn notes(pods: &[PodOutcome]) -> Vec<String> {
    let mut notes: Vec<String> = Vec::new();
    let mut add = |note: String| {
        if !notes.contains(&note) {
            notes.push(note);
        }
    };
    for p in pods {
        if let Started::Failed(why) = &p.started {
            add(format!("    ↳ not started: {why}"));
        }
        if let Some(t) = &p.traffic {
            for (way, landing) in [("outbound", &t.outbound), ("inbound", &t.inbound)] {
                if let Landing::Lost(why) = landing {
                    add(format!("    ↳ {} {way}: {why}", p.spec.full_name()));
                }
            }
        }
    }
    notes
}

fn landing_words(t: &Traffic) -> String {
    let word = |l: &Landing| match l {
        Landing::Proxy => "proxy".to_string(),
        Landing::Direct => "direct".to_string(),
        Landing::Lost(_) => "lost".to_string(),
    };
    format!("out {}, in {}", word(&t.outbound), word(&t.inbound))
}

/// One line for the node: its taint, `InterlockReady` and Events in the API.
pub fn node_line(name: &str, v: &NodeView) -> String {
    let taint = if v.tainted {
        "interlock.dev/not-ready"
    } else {
        "none"
    };
    let condition = match &v.condition {
        Some((status, _)) => format!("InterlockReady={status}"),
        None => "no InterlockReady condition".to_string(),
    };
    let events = if v.events.is_empty() {
        "no Events".to_string()
    } else {
        format!("Events {}", v.events.join(","))
    };
    format!("    node {name}: taint {taint} · {condition} · {events}")
}

/// `interlock check`'s output, indented under the command line; with `full` false only
/// its verdict line (the last one).
pub fn check_block(run: &CheckRun, full: bool) -> String {
    let code = run
        .code
        .map_or_else(|| "killed".to_string(), |c| c.to_string());
    let mut s = String::from("    $ interlock check\n");
    let lines: Vec<&str> = run.output.lines().collect();
    let shown: Vec<&str> = if full {
        lines
    } else {
        lines
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty())
            .copied()
            .into_iter()
            .collect()
    };
    for line in shown {
        let _ = writeln!(s, "    │ {line}");
    }
    let _ = write!(s, "    (exit {code})");
    s
}

/// The closing table: each scenario, both sides, and the one-line verdict.
pub fn verdict(scenarios: &[ScenarioOutcome]) -> String {
    let mut s = String::new();
    let head = "scenario (meshed pods)";
    let width = scenarios
        .iter()
        .map(|sc| sc.title.chars().count() + 3)
        .chain([head.len()])
        .max()
        .unwrap_or(0);
    let without = "without interlock";
    let middle = scenarios
        .iter()
        .map(|sc| sc.without.summary().chars().count())
        .chain([without.len()])
        .max()
        .unwrap_or(0);
    let _ = writeln!(s, "  {head:<width$}  {without:<middle$}  with interlock");
    for sc in scenarios {
        let title = format!("{}. {}", sc.number, sc.title);
        let _ = writeln!(
            s,
            "  {title:<width$}  {:<middle$}  {}",
            sc.without.summary(),
            sc.with.summary()
        );
    }
    let numbers = |f: &dyn Fn(&SideOutcome) -> bool| -> String {
        scenarios
            .iter()
            .filter(|sc| f(&sc.with))
            .map(|sc| sc.number.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let unprotected = numbers(&|w| !w.all_protected());
    let wrong_check = numbers(&|w| !w.check_disagreements.is_empty());
    if passed(scenarios) {
        let _ = write!(
            s,
            "\nPASS: with interlock every meshed pod ran redirected, every other pod was left alone, \
             and interlock check said so"
        );
    }
    if !unprotected.is_empty() {
        let _ = write!(
            s,
            "\nFAIL: with interlock, scenario {unprotected} left a meshed pod unprotected (or disturbed an unmeshed one)"
        );
    }
    if !wrong_check.is_empty() {
        let _ = write!(
            s,
            "\nFAIL: in scenario {wrong_check}, interlock check contradicted the connections (see above)"
        );
    }
    s
}

/// Whether the demo passed: the "with interlock" side protected every meshed pod, and
/// `interlock check` said what the connections showed.
pub fn passed(scenarios: &[ScenarioOutcome]) -> bool {
    scenarios
        .iter()
        .all(|sc| sc.with.all_protected() && sc.with.check_disagreements.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::PODS;

    fn pod(i: usize, started: Started, traffic: Option<Traffic>) -> PodOutcome {
        PodOutcome {
            spec: PODS[i],
            started,
            traffic,
            earlier_connection: None,
            view: PodView {
                unprotected_label: None,
                events: Vec::new(),
            },
        }
    }

    fn t(out: Landing, inb: Landing) -> Option<Traffic> {
        Some(Traffic {
            outbound: out,
            inbound: inb,
        })
    }

    fn running() -> Started {
        Started::Running("10.97.1.2".into())
    }

    fn side(pods: Vec<PodOutcome>) -> SideOutcome {
        SideOutcome {
            with_interlock: true,
            pods,
            node: NodeView {
                tainted: false,
                condition: None,
                events: Vec::new(),
            },
            highlight: None,
            check_disagreements: Vec::new(),
        }
    }

    #[test]
    fn a_meshed_pod_is_protected_only_when_both_directions_land_on_its_proxy() {
        use Landing::*;
        assert_eq!(
            pod(0, running(), t(Proxy, Proxy)).protection(),
            Protection::Redirected
        );
        for (o, i) in [
            (Direct, Direct),
            (Proxy, Direct),
            (Direct, Proxy),
            (Lost("x".into()), Proxy),
        ] {
            assert_eq!(
                pod(0, running(), t(o, i)).protection(),
                Protection::Unprotected
            );
        }
        assert_eq!(
            pod(1, running(), None).protection(),
            Protection::Unprotected
        );
        assert_eq!(
            pod(0, Started::Failed("no IP".into()), None).protection(),
            Protection::NotStarted
        );
    }

    #[test]
    fn an_unmeshed_pod_must_be_left_alone() {
        use Landing::*;
        assert_eq!(
            pod(2, running(), t(Direct, Direct)).protection(),
            Protection::LeftAlone
        );
        assert_eq!(
            pod(2, running(), t(Proxy, Direct)).protection(),
            Protection::Disturbed
        );
    }

    #[test]
    fn the_verdict_fails_when_the_with_side_misses_one_pod() {
        use Landing::*;
        let good = side(vec![
            pod(0, running(), t(Proxy, Proxy)),
            pod(1, running(), t(Proxy, Proxy)),
            pod(2, running(), t(Direct, Direct)),
        ]);
        let mut bad = good.clone();
        bad.pods[1] = pod(1, running(), t(Direct, Direct));
        let mut without = bad.clone();
        without.with_interlock = false;
        let ok = ScenarioOutcome {
            number: 1,
            title: "one",
            without: without.clone(),
            with: good.clone(),
        };
        assert!(passed(std::slice::from_ref(&ok)));
        assert!(verdict(std::slice::from_ref(&ok)).contains("PASS"));
        let ko = ScenarioOutcome {
            number: 2,
            title: "two",
            without,
            with: bad.clone(),
        };
        assert!(!passed(&[ok.clone(), ko.clone()]));
        let text = verdict(&[ok, ko]);
        assert!(
            text.contains("FAIL: with interlock, scenario 2 left"),
            "{text}"
        );
        assert!(text.contains("1/2 redirected, 1 UNPROTECTED"), "{text}");
        // A pod that never started is not protected either.
        let mut not_started = good.clone();
        not_started.pods[0] = pod(0, Started::Failed("no IP".into()), None);
        assert!(!not_started.all_protected());
        // Nor is a run that disturbed an unmeshed pod.
        let mut disturbed = good;
        disturbed.pods[2] = pod(2, running(), t(Proxy, Proxy));
        assert!(!disturbed.all_protected());
        assert!(disturbed.summary().contains("1 unmeshed DISTURBED"));
    }

    #[test]
    fn a_check_that_contradicts_the_connections_fails_the_demo() {
        use Landing::*;
        let mut with = side(vec![pod(0, running(), t(Proxy, Proxy))]);
        with.check_disagreements = vec!["shop/web: check says unprotected".into()];
        let sc = ScenarioOutcome {
            number: 3,
            title: "three",
            without: with.clone(),
            with,
        };
        assert!(!passed(std::slice::from_ref(&sc)));
        let text = verdict(&[sc]);
        assert!(
            text.contains("FAIL: in scenario 3, interlock check contradicted"),
            "{text}"
        );
        assert!(!text.contains("PASS"), "{text}");
        assert!(text.contains("1/1 redirected, CHECK WRONG"), "{text}");
    }

    #[test]
    fn one_line_per_pod_says_what_a_newcomer_needs() {
        use Landing::*;
        let mut p = pod(0, running(), t(Proxy, Proxy));
        p.view.events = vec!["Repaired".into()];
        p.earlier_connection = Some(Err("ended (ECONNABORTED)".into()));
        let line = pod_line(&p);
        assert!(line.contains("shop/web"), "{line}");
        assert!(line.contains("istio"), "{line}");
        assert!(line.contains("10.97.1.2"), "{line}");
        assert!(line.contains("redirected (out+in)"), "{line}");
        assert!(line.contains("ended (ECONNABORTED)"), "{line}");
        assert!(line.ends_with("Repaired"), "{line}");
        let bad = pod_line(&pod(1, running(), t(Direct, Direct)));
        assert!(
            bad.contains("NOT REDIRECTED (out direct, in direct)"),
            "{bad}"
        );
        let long = "plugin type=\"interlock-cni\": interlock-cni is a chained plugin and needs the primary plugin's result";
        let failed = pod(0, Started::Failed(long.into()), None);
        let cut = pod_line(&failed);
        assert!(cut.contains("NOT STARTED (see ↳ below)"), "{cut}");
        let mut lost = pod(1, running(), t(Lost("nothing arrived".into()), Proxy));
        lost.spec = PODS[1];
        let lost_line = pod_line(&lost);
        assert!(
            lost_line.contains("NOT REDIRECTED (out lost, in proxy)"),
            "{lost_line}"
        );
        assert_eq!(
            notes(&[failed.clone(), failed, lost]),
            [
                format!("    ↳ not started: {long}"),
                "    ↳ shop/api outbound: nothing arrived".to_string(),
            ],
            "each reason once, in full"
        );
        let header = pod_header();
        for (column, cell) in [
            ("TRAFFIC", "redirected"),
            ("EARLIER CONN", "ended"),
            ("EVENTS", "Repaired"),
        ] {
            assert_eq!(
                header.find(column),
                line.find(cell),
                "{column} lines up:\n{header}\n{line}"
            );
        }
    }

    #[test]
    fn the_node_line_names_taint_condition_and_events() {
        let v = NodeView {
            tainted: true,
            condition: Some(("False".into(), "no primary".into())),
            events: vec!["ProtectionLost".into()],
        };
        let line = node_line("n1", &v);
        assert!(line.contains("taint interlock.dev/not-ready"), "{line}");
        assert!(line.contains("InterlockReady=False"), "{line}");
        assert!(line.contains("Events ProtectionLost"), "{line}");
        let plain = node_line(
            "n2",
            &NodeView {
                tainted: false,
                condition: None,
                events: Vec::new(),
            },
        );
        assert!(plain.contains("taint none · no InterlockReady condition · no Events"));
    }

    #[test]
    fn the_check_block_keeps_the_verdict_line_when_short() {
        let run = CheckRun {
            code: Some(2),
            output: "interlock check node n1\n\n  FAIL x\n\nUNPROTECTED: because\n".into(),
        };
        let short = check_block(&run, false);
        assert_eq!(
            short,
            "    $ interlock check\n    │ UNPROTECTED: because\n    (exit 2)"
        );
        let full = check_block(&run, true);
        assert!(full.contains("    │   FAIL x\n"), "{full}");
        assert!(full.ends_with("(exit 2)"));
    }
}

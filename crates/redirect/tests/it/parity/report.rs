//! Comparing two sides probe by probe, and the table that says so: one row per case ×
//! backend × family, printed and (with `INTERLOCK_PARITY_REPORT=<file>`) written as
//! Markdown.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::IpAddr;

use super::case::{passthrough_src, remote, Case, MeshRules, ProbePlan};
use super::landing::Landing;
use super::probe::Probe;
use super::side::SideRun;
use super::topology::{gw_ip, pod_ip};

/// One probe whose landings differ.
pub struct Diff {
    pub probe: Probe,
    pub mesh: Landing,
    pub other: Landing,
}

/// The outcome of one row.
pub enum Verdict {
    /// Every probe landed in the same place.
    Agree,
    /// Some did not.
    Disagree,
    /// interlock refused the pod (so it would not start) where the mesh writes rules.
    Refused(String),
    /// The mesh writes no rules for this family: nothing to compare (why).
    NotComparable(String),
}

/// One case × backend × family.
pub struct Row {
    pub case: String,
    pub source: String,
    pub backend: String,
    pub family: &'static str,
    pub verdict: Verdict,
    pub probes: usize,
    pub agreeing: usize,
    /// How interlock's side came about (profile, "not meshed"…) and the IPv6 condition.
    pub note: String,
    pub diffs: Vec<Diff>,
}

impl Row {
    pub fn ok(&self) -> bool {
        matches!(self.verdict, Verdict::Agree | Verdict::NotComparable(_))
    }
}

/// The rows of one case and one backend (both families).
pub fn compare(
    case: &Case,
    plan: &ProbePlan,
    mesh: &SideRun,
    other: &SideRun,
    backend: &str,
) -> Vec<Row> {
    let mut rows = Vec::new();
    for v6 in [false, true] {
        let family = if v6 { "IPv6" } else { "IPv4" };
        let idx: Vec<usize> = (0..plan.probes.len())
            .filter(|&i| plan.probes[i].is_v6() == v6)
            .collect();
        let mut row = Row {
            case: case.id(),
            source: case.source.clone(),
            backend: backend.to_string(),
            family,
            verdict: Verdict::Agree,
            probes: idx.len(),
            agreeing: 0,
            note: String::new(),
            diffs: Vec::new(),
        };
        if let MeshRules::NotWritten(why) = case.rules(v6) {
            row.verdict = Verdict::NotComparable(why.clone());
            row.probes = 0;
            rows.push(row);
            continue;
        }
        if v6 {
            row.note = format!("IPv6 as written under: {}", case.v6_condition);
        }
        match &other.setup {
            Err(e) => row.verdict = Verdict::Refused(e.clone()),
            Ok(note) => {
                if !row.note.is_empty() {
                    row.note.push_str("; ");
                }
                row.note.push_str(note);
                for i in idx {
                    if mesh.landings[i] == other.landings[i] {
                        row.agreeing += 1;
                    } else {
                        row.diffs.push(Diff {
                            probe: plan.probes[i].clone(),
                            mesh: mesh.landings[i].clone(),
                            other: other.landings[i].clone(),
                        });
                    }
                }
                if !row.diffs.is_empty() {
                    row.verdict = Verdict::Disagree;
                }
            }
        }
        rows.push(row);
    }
    rows
}

fn verdict_text(r: &Row) -> String {
    match &r.verdict {
        Verdict::Agree => "agree".into(),
        Verdict::Disagree => format!("{} disagree", r.diffs.len()),
        Verdict::Refused(e) => format!("interlock refused the pod: {e}"),
        Verdict::NotComparable(why) => format!("n/a: {why}"),
    }
}

/// A probe's destination in words (which of the addresses the probes use).
fn ip_class(ip: IpAddr) -> String {
    let v6 = ip.is_ipv6();
    if ip.is_loopback() {
        "loopback".into()
    } else if ip == passthrough_src(v6) {
        "passthrough".into()
    } else if ip == pod_ip(v6) {
        "pod".into()
    } else if ip == gw_ip(v6) {
        "gateway".into()
    } else if ip == remote(v6) {
        "remote".into()
    } else if matches!(ip, IpAddr::V4(a) if a.octets()[0] == 127) {
        "127/8".into()
    } else {
        ip.to_string()
    }
}

/// Where a probe landed, relative to where it was sent.
fn landing_class(l: &Landing, sent_to: std::net::SocketAddr) -> String {
    match l {
        Landing::Pod { local, orig: None } if local.port() == sent_to.port() => "own port".into(),
        Landing::Pod { local, orig } => format!(
            "pod:{}{}",
            local.port(),
            if orig.is_some() { " (nat)" } else { "" }
        ),
        Landing::Node { dst } if *dst == sent_to => "node".into(),
        Landing::Node { dst } => format!("node at {dst}"),
        other => other.to_string(),
    }
}

/// Disagreements grouped by kind of probe (ports folded) and where it went on each side,
/// with the ports, the probe count and the rows: the causes read off this list.
pub fn patterns(rows: &[Row]) -> Vec<(String, String, usize, usize)> {
    type Group = (BTreeSet<u16>, usize, BTreeSet<String>);
    let mut by: BTreeMap<String, Group> = BTreeMap::new();
    for r in rows {
        for d in &r.diffs {
            let p = &d.probe;
            let mesh = r.case.split('/').next().unwrap_or("");
            let key = format!(
                "{mesh} {} {} {} {}{} -> {}: mesh {} / interlock {}",
                r.family,
                if p.dir == super::probe::Dir::Out {
                    "out"
                } else {
                    "in"
                },
                p.proto.as_str(),
                p.who.role,
                p.src
                    .map(|s| format!(" from {}", ip_class(s)))
                    .unwrap_or_default(),
                ip_class(p.dst.ip()),
                landing_class(&d.mesh, p.dst),
                landing_class(&d.other, p.dst),
            );
            let e = by.entry(key).or_default();
            e.0.insert(p.dst.port());
            e.1 += 1;
            e.2.insert(format!("{} {}", r.case, r.backend));
        }
    }
    let mut v: Vec<_> = by
        .into_iter()
        .map(|(k, (ports, n, rows))| {
            let mut ports: Vec<String> = ports.iter().map(u16::to_string).collect();
            if ports.len() > 10 {
                let more = ports.len() - 10;
                ports.truncate(10);
                ports.push(format!("+{more}"));
            }
            (k, ports.join(","), n, rows.len())
        })
        .collect();
    v.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)));
    v
}

/// The plain-text table (disagreements listed under their row, at most `per_row` each).
pub fn text(rows: &[Row], per_row: usize) -> String {
    let mut s = String::new();
    let mut last_case = String::new();
    for r in rows {
        if r.case != last_case {
            let _ = writeln!(s, "\n{}  [{}]", r.case, r.source);
            last_case = r.case.clone();
        }
        let _ = writeln!(
            s,
            "  {:<16} {:<5} probes {:>4}  agreeing {:>4}  {}{}",
            r.backend,
            r.family,
            r.probes,
            r.agreeing,
            verdict_text(r),
            if r.note.is_empty() {
                String::new()
            } else {
                format!("  ({})", r.note)
            }
        );
        for d in r.diffs.iter().take(per_row) {
            let _ = writeln!(
                s,
                "      {}: mesh {} | interlock {}",
                d.probe, d.mesh, d.other
            );
        }
        if r.diffs.len() > per_row {
            let _ = writeln!(s, "      … and {} more", r.diffs.len() - per_row);
        }
    }
    s
}

fn md_escape(s: &str) -> String {
    s.replace('|', "\\|")
}

/// The Markdown report: the summary table, the disagreement patterns, then each
/// disagreeing row's probes (at most `per_row`).
pub fn markdown(rows: &[Row], cases: &[Case], per_row: usize, timing: &str) -> String {
    let mut s = String::from("# interlock vs. the meshes' own rules\n\n");
    let _ = writeln!(s, "{timing}\n");
    s.push_str("## Cases\n\n| case | upstream source | interlock input | IPv6 rules written when |\n|---|---|---|---|\n");
    for c in cases {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} |",
            c.id(),
            md_escape(&c.source),
            md_escape(&c.mapping),
            md_escape(&c.v6_condition)
        );
    }
    s.push_str(
        "\n## Upstream configurations not mapped\n\n| mesh | upstream | why |\n|---|---|---|\n",
    );
    for (mesh, file, why) in super::cases::not_mapped() {
        let _ = writeln!(s, "| {mesh} | {} | {} |", md_escape(file), md_escape(why));
    }
    s.push_str("\n## Results\n\n| case | backend | family | probes | agreeing | verdict | interlock side |\n|---|---|---|---|---|---|---|\n");
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.case,
            r.backend,
            r.family,
            r.probes,
            r.agreeing,
            md_escape(&verdict_text(r)),
            md_escape(&r.note)
        );
    }
    let pats = patterns(rows);
    if !pats.is_empty() {
        s.push_str("\n## Disagreement patterns\n\n| probe → mesh / interlock | ports | probes | rows |\n|---|---|---|---|\n");
        for (k, ports, n, r) in &pats {
            let _ = writeln!(s, "| {} | {ports} | {n} | {r} |", md_escape(k));
        }
    }
    let bad: Vec<&Row> = rows.iter().filter(|r| !r.diffs.is_empty()).collect();
    if !bad.is_empty() {
        s.push_str("\n## Disagreeing probes\n");
        for r in bad {
            let _ = writeln!(s, "\n### {} {} {}\n", r.case, r.backend, r.family);
            for d in r.diffs.iter().take(per_row) {
                let _ = writeln!(
                    s,
                    "- `{}`: mesh **{}**, interlock **{}**",
                    d.probe, d.mesh, d.other
                );
            }
            if r.diffs.len() > per_row {
                let _ = writeln!(s, "- … and {} more", r.diffs.len() - per_row);
            }
        }
    }
    s
}

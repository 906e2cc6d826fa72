//! Running many cases: every side of every case is one unit of work, run by a few worker
//! threads (each side is its own pair of namespaces, so sides run side by side).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use interlock_redirect::BackendKind;

use super::case::{plan, Case, ProbePlan};
use super::landing::Landing;
use super::report::{compare, Row};
use super::side::{run_side, Rules, SideRun};

/// What a run compares each case's mesh side with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Against {
    /// interlock's rules on every backend.
    Interlock,
    /// The mesh's rules again, on a second side per backend label (harness check).
    Itself,
}

/// The result of a run.
pub struct Outcome {
    pub rows: Vec<Row>,
    /// Wall-clock time of the whole run.
    pub wall: Duration,
    /// Sides run and the sum of their times.
    pub sides: usize,
    pub side_time: Duration,
    pub probes_sent: usize,
    /// Each case's mesh side (for checks on the mesh's own landings).
    pub mesh: Vec<(Case, ProbePlan, SideRun)>,
}

/// Worker threads: `INTERLOCK_PARITY_JOBS`, else 4 (sides spend much of their time in
/// `ip`, `nft` and `iptables-restore` children and in the kernel).
fn jobs() -> usize {
    std::env::var("INTERLOCK_PARITY_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(4)
}

/// Runs every case's mesh side and its comparison sides, and compares them.
pub fn run(cases: Vec<Case>, against: Against) -> Outcome {
    let start = Instant::now();
    let plans: Vec<ProbePlan> = cases.iter().map(plan).collect();
    let mut units: Vec<(usize, Rules)> = Vec::new();
    for i in 0..cases.len() {
        units.push((i, Rules::Mesh));
        for kind in BackendKind::ALL {
            units.push((
                i,
                match against {
                    Against::Interlock => Rules::Interlock(kind),
                    Against::Itself => Rules::MeshAgain(kind),
                },
            ));
        }
    }
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<SideRun>>> = Mutex::new((0..units.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..jobs().min(units.len()) {
            s.spawn(|| loop {
                let u = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(i, rules)) = units.get(u) else {
                    break;
                };
                let r = run_side(&cases[i], &plans[i], rules);
                if std::env::var_os("INTERLOCK_PARITY_DEBUG").is_some() {
                    let silent = r
                        .landings
                        .iter()
                        .filter(|l| matches!(l, Landing::NoAnswer))
                        .count();
                    eprintln!(
                        "side {} {rules:?}: {:.2} s, {} probes, {silent} without answer",
                        cases[i].id(),
                        r.elapsed.as_secs_f64(),
                        r.landings.len(),
                    );
                }
                results.lock().unwrap()[u] = Some(r);
            });
        }
    });
    let results: Vec<SideRun> = results
        .into_inner()
        .unwrap()
        .into_iter()
        .map(|r| r.expect("every side ran"))
        .collect();
    let mut rows = Vec::new();
    let side_time = results.iter().map(|r| r.elapsed).sum();
    let probes_sent = results.iter().map(|r| r.landings.len()).sum();
    let mut mesh_sides: Vec<Option<SideRun>> = Vec::new();
    let mut results = results.into_iter();
    for (i, case) in cases.iter().enumerate() {
        let mesh = results.next().expect("mesh side");
        for kind in BackendKind::ALL {
            let other = results.next().expect("comparison side");
            let label = match against {
                Against::Interlock => kind.as_str().to_string(),
                Against::Itself => format!("self/{}", kind.as_str()),
            };
            rows.extend(compare(case, &plans[i], &mesh, &other, &label));
        }
        mesh_sides.push(Some(mesh));
    }
    let sides = units.len();
    Outcome {
        rows,
        wall: start.elapsed(),
        sides,
        side_time,
        probes_sent,
        mesh: cases
            .into_iter()
            .zip(plans)
            .zip(mesh_sides)
            .map(|((c, p), m)| (c, p, m.expect("mesh side")))
            .collect(),
    }
}

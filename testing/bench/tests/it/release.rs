//! The bench behaves like a runtime towards the plugin's state: every attachment a sample
//! ADDs gets its DEL before the pod's netns is deleted, so the state dir never holds a
//! dead pod's record for a later netns that reuses its inode number.

use interlock_bench::run::{run, Plan};
use interlock_bench::{Bench, Scenario};
use interlock_redirect::BackendKind;

/// The JSON files (attachment states, netns records) under `dir`, recursively.
fn state_files(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "json") {
                out.push(p.display().to_string());
            }
        }
    }
    out
}

#[test]
fn every_added_attachment_is_deleted_before_its_pod_goes() {
    interlock_testkit::require_root!();
    let plugin = interlock_bench::plugin_or_build().unwrap_or_else(|e| panic!("{e}"));
    let bench = Bench::new(&plugin).unwrap_or_else(|e| panic!("{e}"));
    let plan = Plan {
        samples: 6,
        per_rule_samples: 0,
        rounds: 3,
        scenarios: vec![
            Scenario::AddMeshed(BackendKind::Nftables),
            Scenario::AddUnmeshed,
        ],
        warmup: true,
    };
    let collected = run(&bench, &plan, &mut |_| {}).unwrap_or_else(|e| panic!("{e}"));
    // The samples read the plugin's own timings from its state before the DEL removed it.
    let meshed = collected.of(Scenario::AddMeshed(BackendKind::Nftables));
    assert_eq!(meshed.len(), 6);
    assert!(
        meshed.iter().all(|s| s.protect.is_some()),
        "a meshed sample lost the plugin's timings: {meshed:?}"
    );
    assert_eq!(collected.of(Scenario::AddUnmeshed).len(), 6);
    let left = state_files(bench.state_dir());
    assert!(
        left.is_empty(),
        "attachment state or netns records left after every round was released: {left:?}"
    );
    // Nothing more to release.
    assert_eq!(bench.release_attachments().unwrap(), 0);
}

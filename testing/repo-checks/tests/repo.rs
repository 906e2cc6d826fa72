//! The repository's documents and crate layout, checked against the files and against
//! `cargo metadata`.

use std::collections::{BTreeMap, BTreeSet};

use interlock_repo_checks::crates::{self, parse_flowchart, transitive_reduction};
use interlock_repo_checks::markdown::{broken_links, first_table, mermaid_blocks, section};
use interlock_repo_checks::{documents, repo_root};

fn read(rel: &str) -> String {
    let path = repo_root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

#[test]
fn every_relative_link_and_anchor_in_the_docs_resolves() {
    let root = repo_root();
    let docs = documents(&root);
    assert!(
        docs.len() >= 8,
        "expected README, ARCHITECTURE and docs/*.md, found {docs:?}"
    );
    let mut problems = Vec::new();
    let mut links = 0;
    for doc in &docs {
        let text = std::fs::read_to_string(root.join(doc)).unwrap();
        links += interlock_repo_checks::markdown::links(&text).len();
        problems.extend(broken_links(&root, doc, &text));
    }
    assert!(
        links > 50,
        "only {links} links found: is the parser still working?"
    );
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_docs_cite_nothing_a_reader_cannot_open() {
    // Documents outside the repository, tracker numbers, reviews and private tools, and
    // the history of how a figure was reached (that is what the git log is for).
    const REFUSED: [&str; 8] = [
        "design.md",
        "pfdrive",
        "performance review",
        "the seed",
        "this round",
        "later round",
        "earlier round",
        "bench run",
    ];
    let root = repo_root();
    let mut found = Vec::new();
    for doc in documents(&root) {
        let text = std::fs::read_to_string(root.join(&doc)).unwrap();
        for (i, line) in text.lines().enumerate() {
            let lower = line.to_lowercase();
            let issue = lower
                .match_indices("issue ")
                .any(|(at, _)| lower[at + 6..].starts_with(|c: char| c.is_ascii_digit()));
            for phrase in REFUSED.iter().filter(|p| lower.contains(*p)) {
                found.push(format!("{}:{}: {phrase:?}", doc.display(), i + 1));
            }
            if issue {
                found.push(format!("{}:{}: an issue number", doc.display(), i + 1));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_readme_stays_a_readme() {
    let lines = read("README.md").lines().count();
    assert!(
        lines <= 300,
        "README.md has {lines} lines; details belong in docs/"
    );
}

/// Every finding id `interlock check` can report has an entry in docs/check.md.
#[test]
fn every_check_finding_id_is_documented() {
    let root = repo_root();
    let check_doc = read("docs/check.md");
    let mut sources = vec![root.join("crates/cli/src/check.rs")];
    for entry in std::fs::read_dir(root.join("crates/cli/src/check")).unwrap() {
        sources.push(entry.unwrap().path());
    }
    let mut ids = BTreeSet::new();
    for path in sources {
        let text = std::fs::read_to_string(&path).unwrap();
        for piece in text.split('"').skip(1).step_by(2) {
            let Some((area, rest)) = piece.split_once('.') else {
                continue;
            };
            let areas = ["config", "binary", "agent", "sandboxes", "cluster", "check"];
            if areas.contains(&area)
                && !rest.is_empty()
                && rest.chars().all(|c| c.is_ascii_lowercase() || c == '-')
            {
                ids.insert(piece.to_string());
            }
        }
    }
    assert!(
        ids.len() > 30,
        "only {} finding ids found: {ids:?}",
        ids.len()
    );
    let missing: Vec<_> = ids
        .iter()
        .filter(|id| !check_doc.contains(&format!("`{id}`")))
        .collect();
    assert!(missing.is_empty(), "not in docs/check.md: {missing:?}");
}

/// ARCHITECTURE.md's crate diagram is the transitive reduction of the workspace's
/// dependency graph, and its crate table lists every member at its path.
#[test]
fn crate_graph_matches_cargo_metadata() {
    let root = repo_root();
    let members = crates::members(&root).expect("cargo metadata");
    let arch = read("ARCHITECTURE.md");
    let part = section(&arch, "Crates").expect("ARCHITECTURE.md has a ## Crates section");

    let graph: BTreeMap<String, BTreeSet<String>> = members
        .iter()
        .map(|m| (m.name.clone(), m.deps.clone()))
        .collect();
    let expected = transitive_reduction(&graph);
    let blocks = mermaid_blocks(part);
    assert_eq!(blocks.len(), 1, "one mermaid block under ## Crates");
    let chart = parse_flowchart(&blocks[0]);
    let package = |id: &str| id.replace('_', "-");
    let drawn: BTreeSet<(String, String)> = chart
        .edges
        .iter()
        .map(|(a, b)| (package(a), package(b)))
        .collect();
    let missing: Vec<_> = expected.difference(&drawn).collect();
    let extra: Vec<_> = drawn.difference(&expected).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "the crate diagram differs from cargo metadata\n  missing edges: {missing:?}\n  \
         edges cargo does not have (or another edge implies): {extra:?}"
    );
    let names: BTreeSet<String> = members.iter().map(|m| m.name.clone()).collect();
    let nodes: BTreeSet<String> = chart.nodes.keys().map(|id| package(id)).collect();
    assert_eq!(
        nodes, names,
        "the diagram's nodes are the workspace members"
    );

    // Product crates and test/measurement crates apart: the diagram's subgraphs follow
    // the directories.
    for m in &members {
        let id = m.name.replace('-', "_");
        let want = if m.dir.starts_with("crates/") {
            "product"
        } else if m.dir.starts_with("testing/") {
            "tools"
        } else {
            panic!("{} lives in {}: product crates go in crates/, test and measurement crates in testing/", m.name, m.dir)
        };
        assert_eq!(
            chart.nodes[&id].as_deref(),
            Some(want),
            "{} ({}) belongs in the {want} subgraph",
            m.name,
            m.dir
        );
    }

    let table: BTreeSet<(String, String)> = first_table(part)
        .into_iter()
        .map(|row| {
            (
                row[0].trim_matches('`').into(),
                row[1].trim_matches('`').into(),
            )
        })
        .collect();
    let actual: BTreeSet<(String, String)> = members
        .iter()
        .map(|m| (m.dir.clone(), m.name.clone()))
        .collect();
    assert_eq!(
        table, actual,
        "ARCHITECTURE.md's crate table (path, package) against cargo metadata"
    );
}

/// No crate has modules that import each other, directly or around a loop.
#[test]
fn no_import_cycle_between_modules_of_any_crate() {
    let root = repo_root();
    let mut found = Vec::new();
    let mut modules = 0;
    for m in crates::members(&root).expect("cargo metadata") {
        for g in interlock_repo_checks::imports::crate_graphs(&root.join(&m.dir)).unwrap() {
            modules += g.modules.len();
            for (set, edges) in g.cycles() {
                let edges: Vec<String> = edges
                    .iter()
                    .map(|e| format!("{} -> {} ({})", e.from, e.to, e.at))
                    .collect();
                found.push(format!(
                    "{} ({}): {{{}}}\n    {}",
                    m.name,
                    g.root,
                    set.into_iter().collect::<Vec<_>>().join(", "),
                    edges.join("\n    ")
                ));
            }
        }
    }
    assert!(
        modules > 100,
        "only {modules} modules found: is the walk still working?"
    );
    assert!(found.is_empty(), "import cycles:\n{}", found.join("\n"));
}

/// The docs pages and anchors the CLI names in its hints (`docs/check.md#…`) exist.
#[test]
fn every_docs_reference_in_the_cli_resolves() {
    let root = repo_root();
    let mut stack = vec![root.join("crates/cli/src")];
    let mut refs = BTreeSet::new();
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for (at, _) in text.match_indices("docs/") {
                    let r: String = text[at..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || "/.#-_".contains(*c))
                        .collect();
                    let r = r.trim_end_matches('.').to_string();
                    if r.contains(".md") {
                        refs.insert(r);
                    }
                }
            }
        }
    }
    assert!(
        refs.iter().any(|r| r.starts_with("docs/check.md#")),
        "no docs reference found in the CLI: {refs:?}"
    );
    // As links from a page at the repository's root.
    let text: String = refs.iter().map(|r| format!("[x]({r})\n")).collect();
    let problems = broken_links(&root, std::path::Path::new("README.md"), &text);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

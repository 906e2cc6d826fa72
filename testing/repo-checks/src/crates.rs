//! The workspace's crates as `cargo metadata` sees them, and the crate diagram of
//! ARCHITECTURE.md as Mermaid writes it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

/// A workspace member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The package name (`interlock-cni`).
    pub name: String,
    /// Its directory relative to the workspace root (`crates/plugin`).
    pub dir: String,
    /// The workspace members it depends on: normal dependencies, optional ones included,
    /// dev- and build-dependencies left out.
    pub deps: BTreeSet<String>,
}

/// The workspace members, from `cargo metadata --no-deps` run on `root`.
pub fn members(root: &Path) -> Result<Vec<Member>, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(&cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root)
        .output()
        .map_err(|e| format!("running {cargo} metadata: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cargo} metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("cargo metadata: {e}"))?;
    let root_dir = meta["workspace_root"]
        .as_str()
        .ok_or("cargo metadata: no workspace_root")?;
    let packages = meta["packages"]
        .as_array()
        .ok_or("cargo metadata: no packages")?;
    let names: BTreeSet<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    packages
        .iter()
        .map(|p| {
            let name = p["name"].as_str().ok_or("a package without a name")?;
            let manifest = p["manifest_path"].as_str().ok_or("no manifest_path")?;
            let dir = Path::new(manifest)
                .parent()
                .and_then(|d| d.strip_prefix(root_dir).ok())
                .ok_or_else(|| format!("{manifest} is not under {root_dir}"))?;
            let deps = p["dependencies"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|d| d["kind"].is_null())
                .filter_map(|d| d["name"].as_str())
                .filter(|d| names.contains(d) && *d != name)
                .map(str::to_string)
                .collect();
            Ok(Member {
                name: name.to_string(),
                dir: dir.display().to_string(),
                deps,
            })
        })
        .collect()
}

/// Directed edges `(from, to)`.
pub type Edges = BTreeSet<(String, String)>;

/// The edges of `graph` that no longer path implies: `a → b` is dropped when `a` reaches
/// `b` through another of its direct dependencies. The graph must have no cycle (cargo
/// refuses one between normal dependencies).
pub fn transitive_reduction(graph: &BTreeMap<String, BTreeSet<String>>) -> Edges {
    fn reaches(
        graph: &BTreeMap<String, BTreeSet<String>>,
        from: &str,
        to: &str,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        if from == to {
            return true;
        }
        if !seen.insert(from.to_string()) {
            return false;
        }
        graph
            .get(from)
            .into_iter()
            .flatten()
            .any(|next| reaches(graph, next, to, seen))
    }
    let mut out = Edges::new();
    for (from, deps) in graph {
        for to in deps {
            let implied = deps
                .iter()
                .filter(|other| *other != to)
                .any(|other| reaches(graph, other, to, &mut BTreeSet::new()));
            if !implied {
                out.insert((from.clone(), to.clone()));
            }
        }
    }
    out
}

/// A Mermaid flowchart: its nodes (with the subgraph each is declared in) and edges.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Flowchart {
    /// Node id → the id of the subgraph it is declared in (`None` at the top level).
    pub nodes: BTreeMap<String, Option<String>>,
    /// `a --> b` edges, by node id.
    pub edges: Edges,
}

fn node_id(s: &str) -> &str {
    let s = s.trim();
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-'))
        .unwrap_or(s.len());
    &s[..end]
}

/// Reads the node declarations (`id["label"]`), subgraphs (`subgraph id["title"]` …
/// `end`) and plain edges (`a --> b`) of a flowchart; other lines are ignored.
pub fn parse_flowchart(block: &str) -> Flowchart {
    let mut chart = Flowchart::default();
    let mut subgraphs: Vec<String> = Vec::new();
    for line in block.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("subgraph ") {
            subgraphs.push(node_id(rest).to_string());
        } else if line == "end" {
            subgraphs.pop();
        } else if let Some((a, b)) = line.split_once("-->") {
            chart
                .edges
                .insert((node_id(a).to_string(), node_id(b).to_string()));
        } else if line.contains('[') {
            chart
                .nodes
                .insert(node_id(line).to_string(), subgraphs.last().cloned());
        }
    }
    chart
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(edges: &[(&str, &str)]) -> BTreeMap<String, BTreeSet<String>> {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string());
            g.entry(b.to_string()).or_default();
        }
        g
    }

    #[test]
    fn reduction_drops_only_implied_edges() {
        let g = graph(&[
            ("cli", "agent"),
            ("cli", "contract"),
            ("agent", "contract"),
            ("cli", "x"),
        ]);
        let got: Vec<_> = transitive_reduction(&g)
            .into_iter()
            .map(|(a, b)| format!("{a}->{b}"))
            .collect();
        assert_eq!(got, ["agent->contract", "cli->agent", "cli->x"]);
    }

    #[test]
    fn flowchart_nodes_subgraphs_and_edges() {
        let chart = parse_flowchart(
            "flowchart TD\n  subgraph product[\"product\"]\n    a_b[\"a-b\"]\n  end\n  \
             c[\"c\"]\n  a_b --> c\n  c -.-> a_b\n",
        );
        assert_eq!(chart.nodes["a_b"], Some("product".to_string()));
        assert_eq!(chart.nodes["c"], None);
        assert_eq!(
            chart.edges.into_iter().collect::<Vec<_>>(),
            [("a_b".to_string(), "c".to_string())]
        );
    }
}

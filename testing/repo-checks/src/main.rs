//! Prints each workspace crate's module graph (modules, references between them) and its
//! import cycles; exits 1 when there is one. With arguments, checks the crates in those
//! directories instead. `make test` runs the same check as a test.

use interlock_repo_checks::{crates, imports, repo_root};

fn main() -> std::process::ExitCode {
    let root = repo_root();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let members = if args.is_empty() {
        match crates::members(&root) {
            Ok(m) => m,
            Err(e) => {
                eprintln!("import-cycles: {e}");
                return std::process::ExitCode::from(2);
            }
        }
    } else {
        let cwd = std::env::current_dir().unwrap_or_default();
        args.iter()
            .map(|a| crates::Member {
                name: a.clone(),
                dir: cwd.join(a).display().to_string(),
                deps: Default::default(),
            })
            .collect()
    };
    let mut cycles = 0;
    for m in &members {
        let graphs = match imports::crate_graphs(&root.join(&m.dir)) {
            Ok(g) => g,
            Err(e) => {
                eprintln!("import-cycles: {}: {e}", m.dir);
                return std::process::ExitCode::from(2);
            }
        };
        for g in graphs {
            let found = g.cycles();
            println!(
                "{:<24} {:<12} {:>3} modules {:>4} references  {}",
                m.name,
                g.root,
                g.modules.len(),
                g.edges.len(),
                if found.is_empty() {
                    "no cycle"
                } else {
                    "CYCLE"
                }
            );
            for (set, edges) in &found {
                cycles += 1;
                println!(
                    "  cycle {{{}}}",
                    set.iter().cloned().collect::<Vec<_>>().join(", ")
                );
                for e in edges {
                    println!("    {} -> {}  {}", e.from, e.to, e.at);
                }
            }
        }
    }
    if cycles == 0 {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::from(1)
    }
}

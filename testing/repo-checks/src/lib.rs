//! Checks on the repository itself, run by `make test` (`tests/repo.rs`): every relative
//! link and anchor in the README, ARCHITECTURE.md and `docs/` resolves, the documents cite
//! nothing a reader cannot open, the crate diagram and table in ARCHITECTURE.md agree
//! with `cargo metadata`, and no crate has an import cycle between its modules
//! ([`imports`]; `cargo run -p interlock-repo-checks` prints every crate's module graph).

pub mod crates;
pub mod imports;
pub mod markdown;

use std::path::{Path, PathBuf};

/// The workspace root (this crate sits two levels below it).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace root exists")
}

/// The documents a reader is pointed at: README.md, ARCHITECTURE.md and every `.md`
/// under `docs/`, as paths relative to `root`, sorted.
pub fn documents(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![PathBuf::from("README.md"), PathBuf::from("ARCHITECTURE.md")];
    let mut stack = vec![PathBuf::from("docs")];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(root.join(&dir)) else {
            continue;
        };
        for entry in entries.flatten() {
            let rel = dir.join(entry.file_name());
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(rel);
            } else if rel.extension().is_some_and(|e| e == "md") {
                out.push(rel);
            }
        }
    }
    out.sort();
    out
}

//! Sets `INTERLOCK_BUILD_COMMIT` for the crate: the environment's value when given (an
//! image build has no `.git`; the Dockerfile passes it), else `git rev-parse`, else
//! nothing.
//!
//! Reruns when HEAD moves, and only then: cargo reruns a build script on every build when
//! a path it was told to watch does not exist, and everything above this crate relinks.
//! So only files that exist are named: HEAD (in a worktree, the worktree's own), the
//! branch's loose ref or, while the branch has none (its ref is packed, or it has no
//! commit yet), the nearest directory above it, which a new loose ref appears in, and
//! `packed-refs` when there is one. When a loose ref goes (`git pack-refs`), the build
//! reruns once and then watches `packed-refs`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

/// The path git uses for `name` (`HEAD`, `packed-refs`, `refs/heads/main`), made absolute:
/// git may answer relative to the current directory, the package's.
fn git_path(name: &str) -> Option<PathBuf> {
    let p = PathBuf::from(git(&["rev-parse", "--git-path", name])?);
    Some(if p.is_absolute() {
        p
    } else {
        std::env::current_dir().ok()?.join(p)
    })
}

/// The files whose change means HEAD may name another commit, every one of them existing.
fn watched() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Some(head) = git_path("HEAD").filter(|p| p.is_file()) else {
        return out; // not a git checkout (or no git): nothing to watch
    };
    out.push(head);
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        if let (Some(loose), Some(common)) = (git_path(&branch), git_path("refs")) {
            let common = common.parent().map(Path::to_path_buf).unwrap_or_default();
            let mut p = loose.as_path();
            // The loose ref, else the nearest directory above it inside the git dir.
            while !p.exists() && p.starts_with(&common) && p != common {
                p = p.parent().unwrap_or(&common);
            }
            if p.exists() {
                out.push(p.to_path_buf());
            }
        }
    }
    if let Some(packed) = git_path("packed-refs").filter(|p| p.is_file()) {
        out.push(packed);
    }
    out
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=INTERLOCK_BUILD_COMMIT");
    let commit = match std::env::var("INTERLOCK_BUILD_COMMIT") {
        Ok(c) if !c.trim().is_empty() => Some(c.trim().to_string()),
        _ => {
            for path in watched() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
            git(&["rev-parse", "--short=12", "HEAD"])
        }
    };
    // Only hex digits: the value ends up in a const and in JSON.
    let commit = commit.filter(|c| c.chars().all(|ch| ch.is_ascii_hexdigit()));
    println!(
        "cargo:rustc-env=INTERLOCK_BUILD_COMMIT={}",
        commit.unwrap_or_default()
    );
}

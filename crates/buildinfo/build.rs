//! Sets `INTERLOCK_BUILD_COMMIT` for the crate: the environment's value when given (an
//! image build has no `.git`; the Dockerfile passes it), else `git rev-parse`, else
//! nothing. Reruns when HEAD moves, so a commit is never reported stale.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=INTERLOCK_BUILD_COMMIT");
    let commit = match std::env::var("INTERLOCK_BUILD_COMMIT") {
        Ok(c) if !c.trim().is_empty() => Some(c.trim().to_string()),
        _ => {
            // In a worktree HEAD and the branch ref live in different git dirs:
            // `--git-path` names the right file for each.
            for p in ["HEAD", "packed-refs"] {
                if let Some(path) = git(&["rev-parse", "--git-path", p]) {
                    println!("cargo:rerun-if-changed={path}");
                }
            }
            if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
                if let Some(path) = git(&["rev-parse", "--git-path", &r]) {
                    println!("cargo:rerun-if-changed={path}");
                }
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

//! The build script on real checkouts: a second `cargo build` with nothing changed does
//! nothing (the script does not rerun, nothing is compiled), and a new commit is picked
//! up. Each case builds a one-file package whose build script is this crate's own, in a
//! throwaway directory: a checkout without `packed-refs` (what `git init` and a fresh
//! clone of few refs leave), one with its refs packed, a worktree (where `.git` is a
//! file), and a directory that is no git checkout at all.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A package under `dir` that prints the commit its build script found.
fn write_package(dir: &Path) {
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(
        dir.join("Cargo.toml"),
        "[package]\nname = \"buildinfo-probe\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\
         build = \"build.rs\"\n\n[workspace]\n",
    )
    .unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("build.rs"),
        dir.join("build.rs"),
    )
    .unwrap();
    std::fs::write(
        dir.join("src/main.rs"),
        "fn main() { print!(\"{}\", env!(\"INTERLOCK_BUILD_COMMIT\")); }\n",
    )
    .unwrap();
    std::fs::write(dir.join(".gitignore"), "/target\n").unwrap();
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("starting a command");
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = run(Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
        .args([
            "-c",
            "init.defaultBranch=main",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .current_dir(dir));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// `cargo` in `dir` with its own target dir, no inherited build settings.
fn cargo(dir: &Path, target: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO"));
    for var in [
        "INTERLOCK_BUILD_COMMIT",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET_DIR",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_MAKEFLAGS",
        "MAKEFLAGS",
        "MFLAGS",
    ] {
        cmd.env_remove(var);
    }
    run(cmd
        .args(args)
        .args(["--offline", "-j1"])
        .env("CARGO_TARGET_DIR", target)
        .current_dir(dir))
}

/// Builds twice; the second build must find everything fresh. Returns what the built
/// program prints: the commit.
fn build_twice(dir: &Path, target: &Path) -> String {
    cargo(dir, target, &["build", "-q"]);
    let out = cargo(dir, target, &["build", "-v"]);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("Fresh buildinfo-probe"),
        "the second build did not find the package fresh:\n{log}"
    );
    for word in ["Running", "Compiling", "Dirty"] {
        assert!(
            !log.contains(word),
            "a build with nothing changed did work ({word}):\n{log}"
        );
    }
    let bin = target.join("debug/buildinfo-probe");
    String::from_utf8(run(&mut Command::new(bin)).stdout).unwrap()
}

struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        let base = tempfile::tempdir().unwrap().keep();
        Scratch(base)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn no_change_build_does_nothing_and_a_commit_is_picked_up() {
    let scratch = Scratch::new();
    let repo = scratch.0.join("repo");
    let target = scratch.0.join("target");
    write_package(&repo);
    git(&repo, &["init", "-q"]);
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-q", "-m", "one"]);
    assert!(
        !repo.join(".git/packed-refs").exists(),
        "the case under test: a checkout without packed-refs"
    );
    let first = git(&repo, &["rev-parse", "--short=12", "HEAD"]);
    assert_eq!(build_twice(&repo, &target), first);

    git(&repo, &["commit", "-q", "--allow-empty", "-m", "two"]);
    let second = git(&repo, &["rev-parse", "--short=12", "HEAD"]);
    assert_ne!(first, second);
    assert_eq!(
        build_twice(&repo, &target),
        second,
        "the new commit is reported"
    );

    // Refs packed: the loose ref is gone, the branch lives in packed-refs.
    git(&repo, &["pack-refs", "--all"]);
    assert!(repo.join(".git/packed-refs").is_file());
    assert!(!repo.join(".git/refs/heads/main").exists());
    assert_eq!(build_twice(&repo, &target), second);
    git(&repo, &["commit", "-q", "--allow-empty", "-m", "three"]);
    let third = git(&repo, &["rev-parse", "--short=12", "HEAD"]);
    assert_eq!(
        build_twice(&repo, &target),
        third,
        "a commit on a packed branch is picked up"
    );

    // Detached HEAD.
    git(&repo, &["checkout", "-q", "--detach", &first]);
    assert_eq!(build_twice(&repo, &target), first);
}

#[test]
fn a_worktree_where_dot_git_is_a_file() {
    let scratch = Scratch::new();
    let repo = scratch.0.join("repo");
    let tree = scratch.0.join("tree");
    let target = scratch.0.join("target");
    write_package(&repo);
    git(&repo, &["init", "-q"]);
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-q", "-m", "one"]);
    git(
        &repo,
        &[
            "worktree",
            "add",
            "-q",
            "-b",
            "side",
            tree.to_str().unwrap(),
        ],
    );
    assert!(tree.join(".git").is_file());
    let head = git(&tree, &["rev-parse", "--short=12", "HEAD"]);
    assert_eq!(build_twice(&tree, &target), head);
    git(&tree, &["commit", "-q", "--allow-empty", "-m", "two"]);
    let moved = git(&tree, &["rev-parse", "--short=12", "HEAD"]);
    assert_eq!(build_twice(&tree, &target), moved);
    // A commit in the main checkout moves another branch: nothing to rebuild here.
    git(
        &repo,
        &["commit", "-q", "--allow-empty", "-m", "main moves"],
    );
    assert_eq!(build_twice(&tree, &target), moved);
}

#[test]
fn a_directory_that_is_no_checkout() {
    let scratch = Scratch::new();
    let dir = scratch.0.join("plain");
    let target = scratch.0.join("target");
    write_package(&dir);
    assert_eq!(build_twice(&dir, &target), "", "no commit without git");
}

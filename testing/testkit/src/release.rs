//! Another release of interlock, built from git for upgrade and downgrade tests: the
//! `interlock` and `interlock-cni` binaries of a tag, as that tag's sources build them.
//!
//! [`build`] exports the tag's tree (`git archive`, so no worktree and no ref is added
//! to the repository) into `<target>/releases/<commit>/src` and builds both binaries
//! there with `cargo build --offline --locked` in the dev profile, into a target dir of
//! its own (`<target>/releases/<commit>/target`: the tag's workspace crates have the
//! same names and relative paths as this one's, so sharing the current target dir would
//! let one build's artifacts replace the other's). The binaries are copied to
//! `<target>/releases/<commit>/bin` last, so their presence means a finished build: a
//! target dir builds a release once, and test binaries running at once wait on a lock
//! instead of building it twice. The sources and the release's own target dir are then
//! removed.
//!
//! A cold build compiles every dependency again. Before it, the release's target dir is
//! seeded with a copy (never hard links: cargo rewrites some of these files in place) of
//! the current target dir's artifacts of the registry crates the tag's `Cargo.lock`
//! names at the same version. Cargo names a registry crate's artifacts by a hash of its
//! package id, features, profile, target and dependencies, not of the directory, so a
//! copy whose hash matches is reused and the others are built as usual: seeding can only
//! save time, never change what is built.
//!
//! The build commit is passed as `INTERLOCK_BUILD_COMMIT` (the exported tree has no
//! `.git`; `git rev-parse` there would name this checkout's HEAD instead).

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};

/// The previous release: the first tagged one, rule shape 1.
pub const PREVIOUS: &str = "v0.1.0";

/// Every release's tag and commit. A clone made without tags (a CI checkout of one
/// branch) still holds each release's commit in main's history: [`commit_of`] falls back
/// to it, and a tag that exists must name the same commit.
pub const RELEASES: &[(&str, &str)] = &[("v0.1.0", "e203c86bd9f6e0f5587011ca9b0b5eb975445099")];

/// A release's binaries, built by [`build`].
#[derive(Debug, Clone)]
pub struct Release {
    /// The tag (or any revision) it was built from.
    pub tag: String,
    /// Its full commit.
    pub commit: String,
    /// Its `interlock` (agent and CLI).
    pub interlock: PathBuf,
    /// Its `interlock-cni`.
    pub plugin: PathBuf,
    /// How long this call's build took; `None` when an earlier one had built it.
    pub built_in: Option<Duration>,
    /// Seeded artifacts copied from the current target dir before the build (0 when
    /// none matched or it was built before).
    pub seeded: usize,
}

/// Why a release could not be built.
#[derive(Debug)]
pub enum ReleaseError {
    /// The revision is not in this repository (a shallow clone, or tags not fetched).
    Missing(String),
    /// Anything else: git, cargo or the file system failed.
    Failed(String),
}

impl std::fmt::Display for ReleaseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReleaseError::Missing(m) | ReleaseError::Failed(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for ReleaseError {}

/// The repository this test kit belongs to (the workspace root).
pub fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("the test kit lives two levels under the workspace root")
        .to_path_buf()
}

/// The current target dir: `CARGO_TARGET_DIR` when set, else the one the running test
/// binary was built in (`<target>/<profile>/deps/<test>`), else `<workspace>/target`.
pub fn target_dir() -> PathBuf {
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        let t = PathBuf::from(t);
        return if t.is_absolute() {
            t
        } else {
            repository().join(t)
        };
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| {
            exe.ancestors()
                .find(|d| d.join("CACHEDIR.TAG").exists())
                .map(Path::to_path_buf)
        })
        .unwrap_or_else(|| repository().join("target"))
}

fn run(cmd: &mut Command, what: &str) -> Result<String, ReleaseError> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| ReleaseError::Failed(format!("{what}: {e}")))?;
    if !out.status.success() {
        return Err(ReleaseError::Failed(format!(
            "{what}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The full commit `rev` names in this repository; for a release tag missing from this
/// clone, the commit [`RELEASES`] pins for it.
pub fn commit_of(rev: &str) -> Result<String, ReleaseError> {
    let pinned = RELEASES
        .iter()
        .find(|(tag, _)| *tag == rev)
        .map(|(_, c)| *c);
    match (resolve(rev)?, pinned) {
        (Some(commit), Some(pin)) if commit != pin => Err(ReleaseError::Failed(format!(
            "the tag {rev} names {commit}, but release {rev} is {pin}: a moved tag is not \
             that release"
        ))),
        (Some(commit), _) => Ok(commit),
        (None, Some(pin)) => match resolve(pin)? {
            Some(commit) => Ok(commit),
            None => Err(missing(&format!("{rev} (tag and its commit {pin})"))),
        },
        (None, None) => Err(missing(rev)),
    }
}

/// `rev`'s full commit, `None` when this repository lacks it.
fn resolve(rev: &str) -> Result<Option<String>, ReleaseError> {
    let out = Command::new("git")
        .arg("-C")
        .arg(repository())
        .args(["rev-parse", "--verify", "--quiet"])
        .arg(format!("{rev}^{{commit}}"))
        .stdin(Stdio::null())
        .output()
        .map_err(|e| ReleaseError::Failed(format!("git rev-parse {rev}: {e}")))?;
    let commit = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Ok((out.status.success() && !commit.is_empty()).then_some(commit))
}

fn missing(what: &str) -> ReleaseError {
    let shallow = Command::new("git")
        .arg("-C")
        .arg(repository())
        .args(["rev-parse", "--is-shallow-repository"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "true")
        .unwrap_or(false);
    ReleaseError::Missing(format!(
        "{what} is not in the repository at {}{}",
        repository().display(),
        if shallow {
            " (a shallow clone: `git fetch --unshallow --tags`)"
        } else {
            " (fetch the tags: `git fetch --tags`)"
        }
    ))
}

/// Builds (once per target dir) the binaries of `rev`; see the module docs.
pub fn build(rev: &str) -> Result<Release, ReleaseError> {
    let commit = commit_of(rev)?;
    let root = target_dir().join("releases");
    fs::create_dir_all(&root).map_err(|e| fail(&root, e))?;
    let dir = root.join(&commit);
    let bin = dir.join("bin");
    let release = |built_in, seeded| Release {
        tag: rev.to_string(),
        commit: commit.clone(),
        interlock: bin.join("interlock"),
        plugin: bin.join("interlock-cni"),
        built_in,
        seeded,
    };
    let lock_path = root.join(format!("{commit}.lock"));
    let lock = File::create(&lock_path).map_err(|e| fail(&lock_path, e))?;
    let _lock = Flock::lock(lock, FlockArg::LockExclusive)
        .map_err(|(_, e)| ReleaseError::Failed(format!("locking {}: {e}", lock_path.display())))?;
    if bin.join("interlock").exists() && bin.join("interlock-cni").exists() {
        return Ok(release(None, 0));
    }
    let start = Instant::now();
    let src = dir.join("src");
    let target = dir.join("target");
    if src.exists() {
        fs::remove_dir_all(&src).map_err(|e| fail(&src, e))?;
    }
    fs::create_dir_all(&src).map_err(|e| fail(&src, e))?;
    run(
        Command::new("sh").arg("-c").arg(format!(
            "git -C '{}' archive --format=tar {commit} | tar -x -C '{}'",
            repository().display(),
            src.display()
        )),
        &format!("exporting {rev} ({commit})"),
    )?;
    // A target dir left by an interrupted build is reused as it is.
    let seeded = if target.exists() {
        0
    } else {
        seed(&target_dir(), &target, &src.join("Cargo.lock")).map_err(|e| {
            ReleaseError::Failed(format!(
                "seeding {} from the current target: {e}",
                target.display()
            ))
        })?
    };
    let short = &commit[..12];
    run(
        Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
            .current_dir(&src)
            .args([
                "build",
                "--offline",
                "--locked",
                "-p",
                "interlock",
                "-p",
                "interlock-cni",
            ])
            .env("CARGO_TARGET_DIR", &target)
            .env("INTERLOCK_BUILD_COMMIT", short)
            // The outer cargo's settings for this checkout are not the tag's.
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .env_remove("CARGO_BUILD_RUSTFLAGS")
            .env_remove("CARGO_MANIFEST_DIR")
            .env_remove("CARGO_PRIMARY_PACKAGE")
            .env_remove("CARGO_PKG_NAME"),
        &format!(
            "building {rev} ({commit}) offline in {} (the dependencies of the tag's Cargo.lock \
             must be in the local cargo registry)",
            src.display()
        ),
    )?;
    fs::create_dir_all(&bin).map_err(|e| fail(&bin, e))?;
    for name in ["interlock-cni", "interlock"] {
        let from = target.join("debug").join(name);
        let tmp = bin.join(format!(".{name}.tmp"));
        fs::copy(&from, &tmp).map_err(|e| fail(&from, e))?;
        fs::rename(&tmp, bin.join(name)).map_err(|e| fail(&tmp, e))?;
    }
    // Only the binaries are kept: the sources and the release's target dir (1.5 GB)
    // would only serve a rebuild, which the binaries' presence rules out.
    let _ = fs::remove_dir_all(&src);
    let _ = fs::remove_dir_all(&target);
    Ok(release(Some(start.elapsed()), seeded))
}

fn fail(path: &Path, e: io::Error) -> ReleaseError {
    ReleaseError::Failed(format!("{}: {e}", path.display()))
}

/// The registry crates `lock` names, as `<crate_name>-<version>` is not part of an
/// artifact's name: just their crate names (`-` as `_`).
fn registry_crates(lock: &Path) -> io::Result<BTreeSet<String>> {
    let text = fs::read_to_string(lock)?;
    let mut names = BTreeSet::new();
    let mut name = None;
    for line in text.lines() {
        if line == "[[package]]" {
            name = None;
        } else if let Some(n) = line.strip_prefix("name = ") {
            name = Some(n.trim_matches('"').replace('-', "_"));
        } else if line.starts_with("source = \"registry+") {
            if let Some(n) = name.take() {
                names.insert(n);
            }
        }
    }
    Ok(names)
}

/// Copies the dev-profile artifacts of the registry crates `lock` names from `from` (a
/// target dir) into `to`; returns how many files and dirs it copied at the top level of
/// `deps`, `build` and `.fingerprint`. A missing `from` seeds nothing.
fn seed(from: &Path, to: &Path, lock: &Path) -> io::Result<usize> {
    let crates = registry_crates(lock)?;
    // `<crate>-<16 hex>` and, in deps, `lib<crate>-<16 hex>.<ext>`.
    let crate_of = |file: &str| -> Option<String> {
        let stem = file.split('.').next()?;
        let (name, hash) = stem.rsplit_once('-')?;
        if hash.len() != 16 || !hash.chars().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        let name = name
            .strip_prefix("lib")
            .filter(|n| crates.contains(*n))
            .unwrap_or(name);
        // Build scripts' dirs are `<crate>-<hash>` with the package's name (`-` kept).
        let name = name.replace('-', "_");
        crates.contains(&name).then_some(name)
    };
    let mut copied = 0;
    for sub in ["deps", "build", ".fingerprint"] {
        let src = from.join("debug").join(sub);
        let Ok(entries) = fs::read_dir(&src) else {
            continue;
        };
        let dst = to.join("debug").join(sub);
        fs::create_dir_all(&dst)?;
        let mut batch: Vec<PathBuf> = Vec::new();
        for e in entries {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            if crate_of(&name).is_some() {
                batch.push(e.path());
            }
        }
        copied += batch.len();
        for chunk in batch.chunks(500) {
            // `cp -a`: modification times kept (cargo compares them), no hard links.
            let status = Command::new("cp")
                .arg("-a")
                .args(chunk)
                .arg(&dst)
                .stdin(Stdio::null())
                .status()?;
            if !status.success() {
                return Err(io::Error::other(format!(
                    "cp -a into {}: {status}",
                    dst.display()
                )));
            }
        }
    }
    Ok(copied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_crates_are_read_from_the_lock_file() {
        let t = tempfile::tempdir().unwrap();
        let lock = t.path().join("Cargo.lock");
        fs::write(
            &lock,
            "version = 4\n\n[[package]]\nname = \"serde-json\"\nversion = \"1.0.0\"\n\
             source = \"registry+https://github.com/rust-lang/crates.io-index\"\n\n\
             [[package]]\nname = \"interlock-cni\"\nversion = \"0.1.0\"\n",
        )
        .unwrap();
        assert_eq!(
            registry_crates(&lock).unwrap(),
            BTreeSet::from(["serde_json".to_string()])
        );
    }

    #[test]
    fn a_missing_revision_is_named_as_missing() {
        match commit_of("refs/tags/no-such-tag-of-interlock") {
            Err(ReleaseError::Missing(m)) => assert!(m.contains("no-such-tag"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    /// A release resolves to its pinned commit whether or not this clone has its tag (a
    /// CI checkout of one branch has none).
    #[test]
    fn a_release_is_its_pinned_commit_with_or_without_the_tag() {
        for (tag, pin) in RELEASES {
            match commit_of(tag) {
                Ok(c) => assert_eq!(&c, pin, "{tag}"),
                Err(ReleaseError::Missing(m)) if !crate::in_ci() => {
                    eprintln!("SKIP: {m}");
                    continue;
                }
                Err(e) => panic!("{tag}: {e}"),
            }
            assert_eq!(commit_of(pin).unwrap_or_else(|e| panic!("{e}")), *pin);
        }
    }
}

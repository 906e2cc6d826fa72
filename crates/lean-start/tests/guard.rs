//! The build script's guard on a real build: against this machine's libc.a, a pin file
//! that does not list its start-up objects makes the build fall back to glibc's own
//! start-up with a warning naming the object, or fail under
//! `INTERLOCK_LEAN_START=require`; a build that is not static is refused the same way.
//! (That the pinned glibc gets the lean start-up is shown by the shipped plugin's
//! self-check, testing/bench/tests/it/shipped_plugin.rs.)

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `cargo build` of this crate alone with the lean-start feature, for the host's x86-64
/// glibc target, in `target/lean-start-guard-<dir>`; `rustflags` as given.
fn build(dir: &str, rustflags: &str, env: &[(&str, &str)]) -> Output {
    let target_dir = crate_dir().join(format!("../../target/lean-start-guard-{dir}"));
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["build", "--offline", "-j2", "-p", "interlock-lean-start"])
        .args([
            "--features",
            "lean-start",
            "--target",
            "x86_64-unknown-linux-gnu",
        ])
        .arg("--manifest-path")
        .arg(crate_dir().join("../../Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target_dir)
        .env("RUSTFLAGS", rustflags)
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("INTERLOCK_LEAN_START")
        .env_remove("INTERLOCK_LEAN_START_PIN");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("running cargo")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A pin file like the crate's, with one member's hash changed.
fn wrong_pin(dir: &Path) -> PathBuf {
    let pins = std::fs::read_to_string(crate_dir().join("glibc.pin")).unwrap();
    let changed: String = pins
        .lines()
        .map(|l| match l.strip_prefix("init-first.o ") {
            Some(_) => format!("init-first.o {}\n", "0".repeat(64)),
            None => format!("{l}\n"),
        })
        .collect();
    assert_ne!(changed, pins, "the pin file lists init-first.o");
    let path = dir.join("other.pin");
    std::fs::write(&path, changed).unwrap();
    path
}

#[test]
fn an_unpinned_glibc_falls_back_or_fails_when_required() {
    if !cfg!(all(target_arch = "x86_64", target_env = "gnu")) {
        eprintln!("SKIP: the lean start-up exists for x86-64 glibc only");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pin = wrong_pin(dir.path());
    let pin = pin.to_str().unwrap();
    let static_crt = "-C target-feature=+crt-static";

    let out = build("static", static_crt, &[("INTERLOCK_LEAN_START_PIN", pin)]);
    let log = stderr(&out);
    assert!(
        out.status.success(),
        "a refusal falls back, it does not fail:\n{log}"
    );
    assert!(
        log.contains("not built, the plugin keeps glibc's own start-up")
            && log.contains("init-first.o has sha256")
            && log.contains("glibc.pin"),
        "the warning names the refused object and what to do:\n{log}"
    );

    let out = build(
        "static",
        static_crt,
        &[
            ("INTERLOCK_LEAN_START_PIN", pin),
            ("INTERLOCK_LEAN_START", "require"),
        ],
    );
    let log = stderr(&out);
    assert!(
        !out.status.success(),
        "require turns the refusal into an error:\n{log}"
    );
    assert!(log.contains("INTERLOCK_LEAN_START=require"), "{log}");
}

#[test]
fn a_dynamic_build_is_refused() {
    if !cfg!(all(target_arch = "x86_64", target_env = "gnu")) {
        eprintln!("SKIP: the lean start-up exists for x86-64 glibc only");
        return;
    }
    let out = build("dynamic", "", &[]);
    let log = stderr(&out);
    assert!(out.status.success(), "{log}");
    assert!(
        log.contains("links glibc dynamically") && log.contains("crt-static"),
        "{log}"
    );
}

//! Builds the C parts of the crate.
//!
//! - `c/self_check.c`, on any x86-64 glibc target: the start-up's invariants, checked from
//!   inside the running process (`interlock-cni --self-check`), whichever start-up ran.
//! - `c/lean_start.c`, only with the `lean-start` feature, and only when the guard lets it:
//!   the target is a static x86-64 glibc build, and the `libc.a` the C compiler links has
//!   exactly the start-up objects pinned in `glibc.pin` (see `src/pin.rs`). Otherwise the
//!   build says why (a cargo warning) and falls back to glibc's own start-up; with
//!   `INTERLOCK_LEAN_START=require` it fails instead. `INTERLOCK_LEAN_START_PIN` names
//!   another pin file (the tests use it to see a refusal).

#[path = "src/pin.rs"]
#[allow(dead_code)]
mod pin;

use std::path::PathBuf;
use std::process::Command;

fn var(k: &str) -> String {
    std::env::var(k).unwrap_or_default()
}

/// The pinned glibc build the target links, or why the lean start-up cannot be used.
fn guard(compiler: &cc::Tool) -> Result<String, String> {
    let static_crt = var("CARGO_CFG_TARGET_FEATURE")
        .split(',')
        .any(|f| f == "crt-static");
    if var("CARGO_CFG_TARGET_ARCH") != "x86_64" || var("CARGO_CFG_TARGET_ENV") != "gnu" {
        return Err(format!(
            "it mirrors glibc's x86-64 start-up; this target is {} {}",
            var("CARGO_CFG_TARGET_ARCH"),
            var("CARGO_CFG_TARGET_ENV")
        ));
    }
    if !static_crt {
        return Err(
            "it replaces glibc's static start-up, and this build links glibc \
                    dynamically (build with -C target-feature=+crt-static, as \
                    scripts/plugin-static.sh does)"
                .into(),
        );
    }
    let out = Command::new(compiler.path())
        .arg("-print-file-name=libc.a")
        .output()
        .map_err(|e| {
            format!(
                "cannot ask {} where libc.a is: {e}",
                compiler.path().display()
            )
        })?;
    let libc_a = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !libc_a.is_absolute() || !libc_a.is_file() {
        return Err(format!(
            "{} does not know a libc.a (answered {:?})",
            compiler.path().display(),
            libc_a
        ));
    }
    println!("cargo:rerun-if-changed={}", libc_a.display());
    let archive =
        std::fs::read(&libc_a).map_err(|e| format!("reading {}: {e}", libc_a.display()))?;
    let found = pin::member_hashes(&archive, &pin::MEMBERS)
        .map_err(|e| format!("{}: {e}", libc_a.display()))?;
    let pin_file = match var("INTERLOCK_LEAN_START_PIN") {
        p if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from("glibc.pin"),
    };
    println!("cargo:rerun-if-changed={}", pin_file.display());
    let pins = std::fs::read_to_string(&pin_file)
        .map_err(|e| format!("reading {}: {e}", pin_file.display()))
        .and_then(|t| pin::parse_pins(&t).map_err(|e| format!("{}: {e}", pin_file.display())))?;
    pin::matching(&pins, &found).map_err(|e| format!("{}: {e}", libc_a.display()))
}

fn main() {
    for f in [
        "build.rs",
        "src/pin.rs",
        "c/lean_start.c",
        "c/cflags",
        "c/self_check.c",
        "glibc.pin",
    ] {
        println!("cargo:rerun-if-changed={f}");
    }
    println!("cargo:rerun-if-env-changed=INTERLOCK_LEAN_START");
    println!("cargo:rerun-if-env-changed=INTERLOCK_LEAN_START_PIN");
    println!("cargo:rustc-check-cfg=cfg(lean_start)");
    println!("cargo:rustc-check-cfg=cfg(self_check_c)");

    let x86_glibc = var("CARGO_CFG_TARGET_ARCH") == "x86_64"
        && var("CARGO_CFG_TARGET_ENV") == "gnu"
        && var("CARGO_CFG_TARGET_OS") == "linux";
    if x86_glibc {
        cc::Build::new()
            .file("c/self_check.c")
            .opt_level(2)
            .warnings(true)
            .extra_warnings(true)
            .warnings_into_errors(true)
            .compile("interlock_self_check");
        println!("cargo:rustc-cfg=self_check_c");
    }

    let mut built = String::new();
    let mut refused = String::new();
    if std::env::var_os("CARGO_FEATURE_LEAN_START").is_none() {
        refused = "the lean-start feature is off".into();
    } else {
        let mut build = cc::Build::new();
        match guard(&build.get_compiler()) {
            Ok(label) => {
                // c/cflags (also read by the bench's lean-start floor): nothing may call a
                // string function or read a stack canary before the start-up has applied
                // the IRELATIVE relocations and set up TLS.
                let cflags = std::fs::read_to_string("c/cflags").expect("reading c/cflags");
                for flag in cflags.split_whitespace() {
                    build.flag(flag);
                }
                build
                    .file("c/lean_start.c")
                    .opt_level(2)
                    .warnings(true)
                    .extra_warnings(true)
                    .warnings_into_errors(true)
                    .compile("interlock_lean_start");
                println!("cargo:rustc-cfg=lean_start");
                built = label;
            }
            Err(why) if var("INTERLOCK_LEAN_START") == "require" => {
                panic!("interlock-lean-start: refused ({why}), and INTERLOCK_LEAN_START=require")
            }
            Err(why) => {
                println!(
                    "cargo:warning=interlock-lean-start: not built, the plugin keeps glibc's own \
                     start-up: {why}"
                );
                refused = why;
            }
        }
    }
    println!("cargo:rustc-env=INTERLOCK_LEAN_START_GLIBC={built}");
    println!("cargo:rustc-env=INTERLOCK_LEAN_START_REFUSED={refused}");
}

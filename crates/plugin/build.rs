//! With the `lean-start` feature (the shipped static build), compiles
//! `start/lean_start.c`: the plugin's own `__libc_start_main`, glibc's static start-up
//! without identifying the CPU (see that file). Only a statically linked glibc x86-64
//! build can use it: in a dynamic executable the start-up belongs to `libc.so`, so the
//! feature without `crt-static` is refused here, naming the flags to use.

#[cfg(feature = "lean-start")]
fn main() {
    println!("cargo:rerun-if-changed=start/lean_start.c");
    println!("cargo:rerun-if-changed=start/cflags");
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let static_crt = var("CARGO_CFG_TARGET_FEATURE")
        .split(',')
        .any(|f| f == "crt-static");
    if var("CARGO_CFG_TARGET_ARCH") != "x86_64"
        || var("CARGO_CFG_TARGET_ENV") != "gnu"
        || !static_crt
    {
        panic!(
            "interlock-cni: the lean-start feature replaces glibc's static start-up and needs \
             an x86_64 gnu target linked statically (RUSTFLAGS from scripts/plugin-rustflags.sh, \
             `-C target-feature=+crt-static`); target arch {:?}, env {:?}, crt-static {static_crt}",
            var("CARGO_CFG_TARGET_ARCH"),
            var("CARGO_CFG_TARGET_ENV"),
        );
    }
    // start/cflags (also read by the bench's lean-start floor): nothing may call a string
    // function or read a stack canary before the start-up has applied the IRELATIVE
    // relocations and set up TLS.
    let cflags = std::fs::read_to_string("start/cflags").expect("reading start/cflags");
    let mut build = cc::Build::new();
    for flag in cflags.split_whitespace() {
        build.flag(flag);
    }
    build
        .file("start/lean_start.c")
        .opt_level(2)
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .compile("interlock_lean_start");
}

#[cfg(not(feature = "lean-start"))]
fn main() {
    println!("cargo:rerun-if-changed=start/lean_start.c");
}

//! `interlock-cni`: reads the CNI environment and stdin, runs the verb, prints the result.
//!
//! The runtime starts this binary once per pod, so its start-up is on every pod's path.
//! It skips the Rust runtime's `main` wrapper (`#![no_main]`): that wrapper reads
//! `/proc/self/maps` to place a stack guard, installs signal handlers for stack-overflow
//! messages and polls the standard descriptors, which together cost more than the whole
//! decision for a pod that is not meshed. What of it matters is done here by hand: the
//! standard descriptors must be open (else a file the plugin opens could take fd 1 and
//! receive the protocol answer), and SIGPIPE is blocked so a runtime that stops reading
//! yields an error instead of a killed process (children started through
//! `std::process::Command` get an empty signal mask back).
#![no_main]

use std::io::{Read, Write};

/// The C entry point (see the module docs for why not Rust's `main`).
// `no_mangle` is the only way to provide the C `main` symbol; nothing else is unsafe here.
#[allow(unsafe_code)]
#[no_mangle]
pub extern "C" fn main(argc: libc::c_int, _argv: *const *const libc::c_char) -> libc::c_int {
    guard_standard_fds();
    // A runtime passes no arguments; `--self-check` is for an operator and the tests.
    if argc > 1
        && std::env::args_os()
            .nth(1)
            .is_some_and(|a| a == "--self-check")
    {
        let (report, passed) = interlock_cni::self_check::report();
        let _ = standard_fd(1).write_all(report.as_bytes());
        return libc::c_int::from(!passed);
    }
    // Single-threaded: enter pod namespaces on this thread rather than starting one.
    interlock_redirect::netns::enter_on_calling_thread();
    let mut pipe = nix::sys::signal::SigSet::empty();
    pipe.add(nix::sys::signal::Signal::SIGPIPE);
    let _ = pipe.thread_block();
    // Even a bug must answer in the protocol: an error object on stdout, details on stderr.
    std::panic::set_hook(Box::new(|info| {
        let _ = writeln!(std::io::stderr(), "interlock-cni: {info}");
        // With panic=abort (release) nothing else will answer; otherwise `run` catches
        // the unwind and answers itself.
        if cfg!(panic = "abort") {
            let _ =
                std::io::stdout().write_all(interlock_cni::internal_error().to_json().as_bytes());
        }
    }));
    let env = interlock_cni::CniEnv::from_process();
    // Configs are small: one read usually takes all of it. Straight from the descriptors,
    // not through std's stdin and stdout, which allocate an 8 KiB and a 1 KiB buffer (heap
    // pages a new process faults in) for one read and one write.
    let mut stdin = Vec::with_capacity(4 * 1024);
    let _ = standard_fd(0).read_to_end(&mut stdin);
    let outcome = interlock_cni::run(&env, &stdin);
    let _ = standard_fd(1).write_all(&outcome.stdout);
    libc::c_int::from(u8::try_from(outcome.exit_code).unwrap_or(1))
}

/// Standard descriptor `fd` as a file that is never closed (it is the process's).
fn standard_fd(fd: std::os::fd::RawFd) -> std::mem::ManuallyDrop<std::fs::File> {
    use std::os::fd::FromRawFd;
    // SAFETY: fds 0–2 are open (`guard_standard_fds`), and ManuallyDrop never closes it.
    #[allow(unsafe_code)]
    std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// Opens /dev/null on any of fds 0–2 that is closed, as the Rust runtime would have.
fn guard_standard_fds() {
    use nix::fcntl::{fcntl, FcntlArg};
    for fd in 0..3 {
        if fcntl(fd, FcntlArg::F_GETFD).is_err() {
            // The lowest free descriptor is `fd` itself, since the lower ones are open.
            let _ = nix::fcntl::open(
                "/dev/null",
                nix::fcntl::OFlag::O_RDWR,
                nix::sys::stat::Mode::empty(),
            );
        }
    }
}

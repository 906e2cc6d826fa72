//! interlock-cni's optional process start-up, fenced off, and the self-check of whichever
//! start-up ran.
//!
//! A statically linked glibc program identifies the CPU before `main` (43 `cpuid` in
//! glibc 2.36), and on a virtual machine each `cpuid` exits to the hypervisor, on every
//! pod's ADD and DEL. With the `lean-start` feature (default off) this crate provides its
//! own `__libc_start_main` (`c/lean_start.c`): glibc's static start-up steps in glibc's
//! order, without the CPU identification and the dynamic loader's set-up. It is built
//! only for a static x86-64 glibc build whose start-up objects are exactly the ones
//! pinned in `glibc.pin` (the build script's guard, `src/pin.rs`); any other glibc gets a
//! build warning and glibc's own start-up.
//!
//! [`self_check`] checks the start-up's invariants from inside the process (thread
//! pointer and TLS, stack and pointer guards, IRELATIVE slots, RELRO, clocks) and says
//! which start-up ran; `interlock-cni --self-check` prints it, and the tests run it
//! against the plugin built both ways.
//!
//! No further replacement of C library internals belongs here: performance work goes
//! into interlock's own code.

#[cfg(test)]
mod pin;

/// What the build of this crate decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Build {
    /// The lean start-up is linked, checked against this pinned glibc build.
    Lean {
        /// The pin's label, e.g. `glibc 2.36-9+deb12u14 amd64 (Debian 12)`.
        glibc: &'static str,
    },
    /// glibc's own start-up, and why.
    Glibc {
        /// Why the lean start-up was not built (the feature is off, the target or the
        /// glibc is not one it was checked against).
        reason: &'static str,
    },
}

/// What the build decided.
pub fn build() -> Build {
    if cfg!(lean_start) {
        Build::Lean {
            glibc: env!("INTERLOCK_LEAN_START_GLIBC"),
        }
    } else {
        Build::Glibc {
            reason: env!("INTERLOCK_LEAN_START_REFUSED"),
        }
    }
}

/// The checks [`self_check`] runs on x86-64 glibc, by the name each line carries.
pub const CHECKS: [&str; 7] = [
    "start-up",
    "tls",
    "stack-guard",
    "pointer-guard",
    "irelative",
    "relro",
    "clock",
];

/// The outcome of [`self_check`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelfCheck {
    /// One line per check: `ok` or `FAIL`, its name, what was seen.
    pub lines: Vec<String>,
    /// How many checks failed.
    pub failures: usize,
    /// Whether the lean start-up is the one that ran.
    pub lean_ran: bool,
}

impl SelfCheck {
    /// No check failed, and the start-up that ran is the one the build chose.
    pub fn passed(&self) -> bool {
        self.failures == 0 && self.lean_ran == matches!(build(), Build::Lean { .. })
    }
}

#[cfg(self_check_c)]
extern "C" {
    fn interlock_start_up_self_check(out: *mut std::ffi::c_char, cap: usize) -> std::ffi::c_int;
}

/// Checks the start-up's invariants in this process.
pub fn self_check() -> SelfCheck {
    #[cfg(self_check_c)]
    {
        let mut buf = vec![0u8; 4096];
        // SAFETY: the C function writes at most `cap` bytes, NUL-terminated, into `buf`,
        // which is `cap` bytes long and outlives the call; it keeps no pointer to it.
        #[allow(unsafe_code)]
        let failures = unsafe { interlock_start_up_self_check(buf.as_mut_ptr().cast(), buf.len()) };
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        let text = String::from_utf8_lossy(&buf[..end]);
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        let lean_ran = lines
            .iter()
            .any(|l| l.contains("start-up") && l.contains("lean start-up ran"));
        SelfCheck {
            lines,
            failures: usize::try_from(failures).unwrap_or(1),
            lean_ran,
        }
    }
    #[cfg(not(self_check_c))]
    {
        // Not x86-64 glibc: only what Rust can see portably.
        let a = std::time::Instant::now();
        let ok = std::time::Instant::now() >= a;
        SelfCheck {
            lines: vec![
                "ok    start-up       glibc's own start-up ran (no x86-64 glibc checks on this target)"
                    .into(),
                format!("{:<4}  clock          the monotonic clock does not go back", if ok { "ok" } else { "FAIL" }),
            ],
            failures: usize::from(!ok),
            lean_ran: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test binary is an ordinary (dynamic) build: glibc's own start-up ran, and every
    /// invariant holds for it.
    #[test]
    fn the_self_check_passes_under_glibcs_own_start_up() {
        let check = self_check();
        assert!(!check.lean_ran, "{:#?}", check.lines);
        assert_eq!(check.failures, 0, "{:#?}", check.lines);
        assert!(check.passed());
        assert!(matches!(build(), Build::Glibc { .. }));
        if cfg!(all(target_arch = "x86_64", target_env = "gnu")) {
            for name in CHECKS {
                assert!(
                    check
                        .lines
                        .iter()
                        .any(|l| l.starts_with("ok") && l.contains(name)),
                    "no passing {name} line: {:#?}",
                    check.lines
                );
            }
        }
    }
}

//! `interlock-cni --self-check`: which process start-up the build chose and which ran,
//! and whether its invariants hold (`interlock_lean_start::self_check`). An operator can
//! run it on a node; the tests run it against the plugin built with and without the
//! lean start-up.

use interlock_lean_start::Build;

/// The report to print, and whether the check passed (exit 0) or not (exit 1).
pub fn report() -> (String, bool) {
    let check = interlock_lean_start::self_check();
    let build = match interlock_lean_start::build() {
        Build::Lean { glibc } => {
            format!("build: lean start-up, checked against {glibc}")
        }
        Build::Glibc { reason } => {
            format!("build: glibc's own start-up (the lean start-up is not built: {reason})")
        }
    };
    let mut out = format!(
        "interlock-cni {} self-check\n{build}\n",
        interlock_buildinfo::VERSION
    );
    for line in &check.lines {
        out.push_str(line);
        out.push('\n');
    }
    let passed = check.passed();
    out.push_str(match (passed, check.failures) {
        (true, _) => "PASS\n",
        (false, 0) => "FAIL: the start-up that ran is not the one this build chose\n",
        (false, _) => "FAIL: an invariant of the start-up does not hold\n",
    });
    (out, passed)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_test_build_reports_glibcs_start_up_and_passes() {
        let (text, passed) = super::report();
        assert!(passed, "{text}");
        assert!(text.contains("build: glibc's own start-up"), "{text}");
        assert!(text.ends_with("PASS\n"), "{text}");
    }
}

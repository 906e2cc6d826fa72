//! The build version `interlock --version`, `interlock check -o json` and the plugin's
//! VERSION answer carry: the crate version, plus the git commit when the build knew it
//! (`0.1.0 (git 0123456789ab)`). A `const`: the plugin answers VERSION without work.

/// The crate version.
pub const CRATE_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit the binaries were built from (empty when unknown).
pub const COMMIT: &str = env!("INTERLOCK_BUILD_COMMIT");

/// The build version, e.g. `0.1.0 (git 0123456789ab)` or `0.1.0`.
pub const VERSION: &str = if COMMIT.is_empty() {
    CRATE_VERSION
} else {
    concat!(
        env!("CARGO_PKG_VERSION"),
        " (git ",
        env!("INTERLOCK_BUILD_COMMIT"),
        ")"
    )
};

#[cfg(test)]
mod tests {
    #[test]
    fn version_starts_with_the_crate_version_and_names_the_commit_when_known() {
        assert!(super::VERSION.starts_with(super::CRATE_VERSION));
        if super::COMMIT.is_empty() {
            assert_eq!(super::VERSION, super::CRATE_VERSION);
        } else {
            assert!(super::COMMIT.chars().all(|c| c.is_ascii_hexdigit()));
            assert!(super::VERSION.ends_with(&format!("(git {})", super::COMMIT)));
        }
    }
}

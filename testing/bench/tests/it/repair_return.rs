//! The repair bench's `return` scenario on a real agent (no root needed): the primary's
//! file is removed and written back, and both transitions are seen in the config the
//! runtime would load, in both config modes, again and again.

use std::path::PathBuf;

use interlock_bench::repair::{default_interlock_path, Session};

fn built(package: &str, path: PathBuf) -> PathBuf {
    if path.is_file() {
        path
    } else {
        interlock_bench::build_workspace_bin(package, &path).unwrap_or_else(|e| panic!("{e}"))
    }
}

#[test]
fn the_primarys_removal_and_return_are_both_followed_in_both_modes() {
    let exe = built("interlock", default_interlock_path());
    let plugin = built("interlock-cni", interlock_bench::default_plugin_path());
    for mode in ["owned", "chain"] {
        let tmp = tempfile::tempdir().unwrap();
        let mut s = Session::start(&exe, &plugin, mode, tmp.path())
            .unwrap_or_else(|e| panic!("{mode}: {e:#}"));
        for round in 0..5 {
            // Each phase waits until the runtime's config shows it (the holding config,
            // then the primary's network with interlock), or fails after 5 s.
            s.primary_returns()
                .unwrap_or_else(|e| panic!("{mode}, round {round}: {e:#}"));
        }
        assert_eq!(
            s.effective_network().as_deref(),
            Some("ilbench"),
            "{mode}: the primary's network is not the runtime's config after its return"
        );
    }
}

//! The light test kit, shared by every crate's tests.
//!
//! Root detection with a clear skip, throwaway network namespaces named and torn down by
//! the test, traffic between them ([`traffic`]), the location of the reference CNI
//! plugins, pod specs ([`pods`]), stand-ins for the agent socket ([`agent_standin`],
//! [`forged_agent`]) and the one HTTP GET helper ([`http`]). Everything a test creates
//! here carries an `il` prefix and is deleted on drop, even when the test fails.
//!
//! No async runtime, HTTP server or CRI client here: the node in a box (a private
//! containerd, a fake Kubernetes API, the agent on a node) is `interlock-testkit-node`,
//! which only the crates that need a node depend on.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

pub mod agent_standin;
pub mod forged_agent;
pub mod http;
pub mod pods;
pub mod release;
pub mod traffic;

pub use tempfile::{tempdir, TempDir};

/// True when the process runs as root (effective UID 0).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// True when the tests run under CI (`CI` set to anything but empty, `0` or `false`).
///
/// CI sets `CI=true`; there a test that needs root must run, so a green run means it ran.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false"))
}

/// Whether a test that needs root can run here.
///
/// Returns `true` as root. Otherwise prints a skip message naming `test` and returns
/// `false` for a contributor without root, but panics under CI ([`in_ci`]): a skipped
/// root test there would make a green CI claim something that never ran.
pub fn can_run_root_test(test: &str) -> bool {
    if is_root() {
        return true;
    }
    if in_ci() {
        panic!(
            "{test}: needs root (network namespaces, netfilter) and CI is set: run CI as root; \
             a root test is never skipped under CI"
        );
    }
    eprintln!("SKIP {test}: needs root (network namespaces, netfilter); run the tests as root to include it");
    false
}

/// Skips the calling test with a message when not running as root; fails it under CI
/// instead (see [`can_run_root_test`]).
#[macro_export]
macro_rules! require_root {
    () => {
        if !$crate::can_run_root_test(module_path!()) {
            return;
        }
    };
}

/// Directory holding the reference CNI plugins (`bridge`, `host-local`, `portmap`, …).
pub fn cni_plugins_dir() -> PathBuf {
    std::env::var_os("INTERLOCK_CNI_PLUGINS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/lib/cni"))
}

/// A short name unique to this process and call, at most 15 bytes (fits an ifname).
pub fn unique(tag: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let salt: u32 = rand::random::<u32>() ^ std::process::id().rotate_left(13) ^ n;
    let tag: String = tag
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(5)
        .collect();
    format!("il{tag}{:08x}", salt)
}

/// Copies this test binary to `dir/name`, mode 0755, for a test that runs it as another
/// user.
///
/// The copy is written by a `cp` child, never through a descriptor of this process:
/// another test thread forking at the same moment would inherit an open write descriptor
/// to the copy, and exec'ing it would then fail with "Text file busy" (seen in CI-like
/// runs).
pub fn copy_of_this_test_binary(dir: &Path, name: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let exe = dir.join(name);
    let me = std::env::current_exe().expect("current_exe");
    let out = Command::new("cp")
        .arg("--")
        .arg(&me)
        .arg(&exe)
        .output()
        .expect("run cp");
    assert!(
        out.status.success(),
        "cp {} {}: {}",
        me.display(),
        exe.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    exe
}

/// A network namespace created for one test and deleted when dropped.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates `il<tag><random>` with `ip netns add` and brings its loopback up.
    pub fn new(tag: &str) -> std::io::Result<Netns> {
        let name = unique(tag);
        run_ok(Command::new("ip").args(["netns", "add", &name]))?;
        let ns = Netns { name };
        run_ok(Command::new("ip").args(["-n", &ns.name, "link", "set", "lo", "up"]))?;
        Ok(ns)
    }

    /// The namespace's name under `/var/run/netns`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The bind-mounted namespace file, as a runtime passes it in `CNI_NETNS`.
    pub fn path(&self) -> PathBuf {
        Path::new("/var/run/netns").join(&self.name)
    }

    /// Runs a command inside the namespace (`ip netns exec`).
    pub fn exec(&self, argv: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(argv)
            .output()
            .unwrap_or_else(|e| panic!("ip netns exec {} {:?}: {e}", self.name, argv))
    }

    /// Like [`Netns::exec`] but panics with the command's stderr when it fails.
    pub fn exec_ok(&self, argv: &[&str]) -> String {
        let out = self.exec(argv);
        assert!(
            out.status.success(),
            "in netns {}: {:?} failed: {}",
            self.name,
            argv,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs `f` on a fresh thread that has entered this namespace; processes it spawns
    /// inherit the namespace. The calling thread's namespace is untouched.
    pub fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        let path = self.path();
        std::thread::scope(|s| {
            s.spawn(move || {
                let file = std::fs::File::open(&path)
                    .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                    .unwrap_or_else(|e| panic!("setns {}: {e}", path.display()));
                f()
            })
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e))
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

fn run_ok(cmd: &mut Command) -> std::io::Result<()> {
    let out = cmd.output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "{:?}: {}",
            cmd,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_names_fit_an_ifname() {
        let a = unique("bridge");
        let b = unique("bridge");
        assert_ne!(a, b);
        assert!(a.len() <= 15, "{a}");
        assert!(a.starts_with("ilbridg"));
    }

    #[test]
    fn root_tests_refuse_to_skip_under_ci() {
        // Run the check in a child process with a non-root UID when we are root, so the
        // non-root branch is exercised for real; without root, call it directly.
        if is_root() {
            // A copy in a world-readable temp dir: the checkout may sit under a directory
            // (e.g. /root) that the unprivileged child cannot traverse.
            use std::os::unix::fs::PermissionsExt;
            let dir = tempdir().unwrap();
            let exe = copy_of_this_test_binary(dir.path(), "testkit-child");
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
            for (ci, expect_ok) in [("true", false), ("", true)] {
                let out = Command::new("setpriv")
                    .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
                    .arg(&exe)
                    .args(["--exact", "tests::child_checks_root_test", "--nocapture"])
                    .env("CI", ci)
                    .env("INTERLOCK_TESTKIT_CHILD", "1")
                    .output()
                    .unwrap();
                let text = String::from_utf8_lossy(&out.stdout).into_owned()
                    + &String::from_utf8_lossy(&out.stderr);
                assert_eq!(out.status.success(), expect_ok, "CI={ci:?}: {text}");
                if expect_ok {
                    assert!(text.contains("SKIP"), "CI={ci:?}: {text}");
                } else {
                    assert!(text.contains("never skipped under CI"), "CI={ci:?}: {text}");
                }
            }
        } else if in_ci() {
            assert!(std::panic::catch_unwind(|| can_run_root_test("x")).is_err());
        } else {
            assert!(!can_run_root_test("x"));
        }
    }

    /// Helper for `root_tests_refuse_to_skip_under_ci`: only does anything in the child.
    #[test]
    fn child_checks_root_test() {
        if std::env::var_os("INTERLOCK_TESTKIT_CHILD").is_none() {
            return;
        }
        assert!(!is_root(), "the child must run without root");
        assert!(!can_run_root_test("child"));
    }

    #[test]
    fn netns_is_created_entered_and_removed() {
        require_root!();
        let ns = Netns::new("kit").unwrap();
        let path = ns.path();
        assert!(path.exists());
        ns.exec_ok(&[
            "ip",
            "link",
            "add",
            "ilkitdummy",
            "type",
            "veth",
            "peer",
            "name",
            "ilkitpeer",
        ]);
        let links = ns.run(|| {
            String::from_utf8(
                Command::new("ip")
                    .args(["-o", "link"])
                    .output()
                    .unwrap()
                    .stdout,
            )
            .unwrap()
        });
        assert!(links.contains("ilkitdummy"), "{links}");
        let host = String::from_utf8(
            Command::new("ip")
                .args(["-o", "link"])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        assert!(!host.contains("ilkitdummy"));
        drop(ns);
        assert!(!path.exists());
    }
}

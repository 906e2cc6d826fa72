//! `make demo` end to end, so that every commit keeps it working: the demo binary runs
//! the four scenarios against real containerd with the `interlock`, `interlock-cni` and
//! `mesh-standin` built next to it, passes, shows the failures interlock exists for on the "without"
//! side, and leaves nothing behind — also when interrupted by Ctrl-C halfway.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use interlock_testkit::require_root;

/// The directory holding the demo binary and, when built, `interlock`, `interlock-cni`
/// and `mesh-standin` (`make test` builds every binary before the tests).
fn bin_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_BIN_EXE_interlock-demo"))
        .parent()?
        .to_path_buf();
    let built = ["interlock", "interlock-cni", "mesh-standin"]
        .iter()
        .all(|b| dir.join(b).is_file());
    if built {
        return Some(dir);
    }
    let msg = format!(
        "interlock, interlock-cni and mesh-standin are not built in {}: cargo build -p interlock -p interlock-cni -p interlock-mesh-standins",
        dir.display()
    );
    assert!(!interlock_testkit::in_ci(), "{msg}");
    eprintln!("SKIP: {msg}");
    None
}

/// The demo, its kits under a directory of the test's own (so that what it leaves is
/// visible), in a process group of its own (so a group-wide SIGINT is a terminal's Ctrl-C).
fn demo(bins: &Path, kits: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_interlock-demo"));
    cmd.arg("--bin-dir")
        .arg(bins)
        .env("INTERLOCK_KIT_DIR", kits)
        .stdin(Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    cmd
}

/// What of the demo's nodes is still on the host: kit directories, processes that name
/// them (containerd, shims, the agent), netns of its sandboxes.
fn leftovers(kits: &Path) -> Vec<String> {
    let mut left: Vec<String> = std::fs::read_dir(kits)
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().is_dir())
                .map(|e| format!("kit directory {}", e.path().display()))
                .collect()
        })
        .unwrap_or_default();
    let needle = kits.to_string_lossy().into_owned();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(&needle) {
            left.push(format!("process {:?}: {cmdline}", entry.file_name()));
        }
    }
    left
}

/// A directory for the demo's kits: on /dev/shm like the kit's default (fast), else in
/// the temp dir.
fn kits_dir() -> tempfile::TempDir {
    let b = tempfile::Builder::new()
        .prefix("demo-kits-")
        .tempdir_in("/dev/shm");
    b.or_else(|_| tempfile::tempdir()).unwrap()
}

#[test]
fn the_demo_passes_shows_the_races_and_leaves_nothing() {
    require_root!();
    let Some(bins) = bin_dir() else { return };
    let kits = kits_dir();
    let started = Instant::now();
    let out = demo(&bins, kits.path()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "exit {:?}\n{stdout}\n{stderr}",
        out.status
    );
    eprintln!("the demo took {:?}", started.elapsed());
    for needle in [
        "Scenario 1: primary first",
        "Scenario 2: mesh first, primary later",
        "Scenario 3: pods before the mesh",
        // Without interlock: the mesh-only file starves every pod of an IP, and the pods
        // of a node boot keep running unredirected.
        "0/2 redirected, 3 not started",
        "0/2 redirected, 2 UNPROTECTED",
        // With interlock: the earlier connections of the repaired pods were ended.
        "ended (ECONNABORTED)",
        // istio-cni kept: without interlock the primary's rewrite and the installer's
        // restart each let a meshed pod run uncaptured; in guard mode the pod started
        // during the restart is held, naming istio-cni, and starts once it is back, and
        // check names the guarded plugin.
        "Scenario 4: a mesh keeps its own CNI (istio-cni)",
        "2/2 redirected, 1 held until istio-cni was back",
        "held — plugin type=\"interlock-cni\" failed (add): pod shop/cart is held: it is meshed by istio-cni",
        "00-interlock.conflist runs istio-cni after interlock-cni's guard",
        "PASS: with interlock every meshed pod ran redirected",
        "cleanup: every containerd",
    ] {
        assert!(stdout.contains(needle), "{needle:?} missing:\n{stdout}");
    }
    assert!(!stdout.contains("CHECK WRONG"), "{stdout}");
    // Scenarios 3 and 4 without interlock.
    assert_eq!(
        stdout.matches("0/2 redirected, 2 UNPROTECTED").count(),
        2,
        "{stdout}"
    );
    assert_eq!(leftovers(kits.path()), Vec::<String>::new());
}

#[test]
fn ctrl_c_halfway_removes_everything() {
    require_root!();
    let Some(bins) = bin_dir() else { return };
    let kits = kits_dir();
    let mut child = demo(&bins, kits.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pgid = nix::unistd::Pid::from_raw(child.id() as i32);
    // Wait until the demo is inside a "with interlock" side: containerd, sandboxes and
    // the agent all exist.
    let mut seen = String::new();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(120);
    for line in lines.by_ref() {
        let line = line.unwrap();
        seen.push_str(&line);
        seen.push('\n');
        if line.contains("scheduler places pods on the untainted node") {
            break;
        }
        assert!(Instant::now() < deadline, "{seen}");
    }
    assert!(
        seen.contains("scheduler places pods"),
        "the demo ended early:\n{seen}"
    );
    // A terminal's Ctrl-C reaches the whole foreground group.
    nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGINT).unwrap();
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(
        status.code(),
        Some(130),
        "{seen}{}\n{stderr}",
        rest.join("\n")
    );
    assert!(stderr.contains("interrupted"), "{stderr}");
    assert_eq!(leftovers(kits.path()), Vec::<String>::new(), "{stderr}");
}

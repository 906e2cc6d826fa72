//! The containerd kit end to end: a private daemon, a sandbox run over CRI with its
//! netns and IP checked from the host, and nothing left on the host afterwards — also
//! after a test process that was killed before it could clean up.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use interlock_cri::{CriClient, NetnsSource, SandboxFilter, SandboxState};
use interlock_testkit::require_root;
use interlock_testkit_node::containerd::{is_network_namespace, Containerd, Footprint};

/// Waits until containerd has loaded the CNI config (it watches the conf dir).
async fn wait_network_ready(cri: &CriClient, kit: &Containerd) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let status = cri.status().await.unwrap();
        assert!(status.runtime_ready(), "{status:?}");
        if status.network_ready() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "NetworkReady never came: {status:?}\n{}",
            kit.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The IPv4 address (without prefix) of `eth0` inside the netns at `netns`.
fn eth0_ipv4(netns: &Path) -> String {
    let out = Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .args(["ip", "-o", "-4", "addr", "show", "dev", "eth0"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let cidr = text
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .unwrap_or_else(|| panic!("no inet on eth0: {text}"));
    cidr.split('/').next().unwrap().to_string()
}

#[tokio::test]
async fn a_sandbox_gets_a_netns_and_an_ip_and_the_kit_leaves_nothing() {
    require_root!();
    let begin = Instant::now();
    let kit = Containerd::start().unwrap();
    eprintln!(
        "kit: daemon answered CRI {:?} after spawn; ready with the image {:?} after start",
        kit.started_in(),
        begin.elapsed()
    );
    kit.install_primary_plugins().unwrap();
    kit.write_primary_config().unwrap();
    let cri = kit.cri().await;
    let version = cri.version().await.unwrap();
    assert_eq!(version.runtime_name, "containerd");
    assert_eq!(version.runtime_api_version, "v1");
    wait_network_ready(&cri, &kit).await;

    let config = kit
        .pod("web")
        .label("app", "web")
        .label("kit", kit.network_name())
        .annotation("interlock.dev/test", "annotated");
    let t = Instant::now();
    let id = cri.run_sandbox(&config).await.unwrap();
    let run = t.elapsed();

    let status = cri.sandbox_status(&id, true).await.unwrap();
    assert_eq!(status.id, id);
    assert_eq!(status.state, SandboxState::Ready);
    assert_eq!(status.metadata, config.metadata);
    assert_eq!(status.labels.get("app").map(String::as_str), Some("web"));
    assert_eq!(
        status
            .annotations
            .get("interlock.dev/test")
            .map(String::as_str),
        Some("annotated")
    );
    let age = SystemTime::now()
        .duration_since(status.created_at())
        .unwrap();
    assert!(age < Duration::from_secs(60), "created {age:?} ago");
    assert!(!status.host_network);

    let netns = status
        .netns()
        .expect("verbose status names the netns")
        .clone();
    // containerd 1.6 names it only in the runtime spec.
    assert_eq!(netns.source, NetnsSource::RuntimeSpec, "{:?}", status.info);
    // Under the kit's own state dir (not /var/run/netns), so its teardown knows every
    // netns the daemon made, even one of a sandbox it never recorded.
    assert!(
        netns.path.starts_with(kit.state()),
        "{}",
        netns.path.display()
    );
    assert!(
        is_network_namespace(&netns.path),
        "{}",
        netns.path.display()
    );
    assert!(status.verbose.pid.is_some(), "{:?}", status.verbose);

    let ip = eth0_ipv4(&netns.path);
    let ip: std::net::IpAddr = ip.parse().unwrap();
    assert!(kit.in_subnet(ip), "{ip} not in {}", kit.subnet());
    assert_eq!(status.ips.first(), Some(&ip), "CRI and the netns disagree");

    let ready = cri
        .list_sandboxes(&SandboxFilter::ready().label("kit", kit.network_name()))
        .await
        .unwrap();
    assert_eq!(ready.len(), 1, "{ready:?}");
    assert_eq!(ready[0].id, id);
    assert_eq!(ready[0].metadata, config.metadata);
    let other_label = cri
        .list_sandboxes(&SandboxFilter::ready().label("app", "not-web"))
        .await
        .unwrap();
    assert!(other_label.is_empty(), "{other_label:?}");

    let t = Instant::now();
    cri.stop_sandbox(&id).await.unwrap();
    let stop = t.elapsed();
    let stopped = cri.sandbox_status(&id, true).await.unwrap();
    assert_eq!(stopped.state, SandboxState::NotReady);
    assert!(stopped.ips.is_empty(), "{stopped:?}");
    // Stop closes the netns already; the info keeps naming its path.
    assert_eq!(
        stopped.verbose.netns_closed,
        Some(true),
        "{:?}",
        stopped.verbose
    );
    assert_eq!(stopped.netns_path(), Some(netns.path.as_path()));
    assert!(
        !netns.path.exists(),
        "{} outlived the stop",
        netns.path.display()
    );
    assert!(cri
        .list_sandboxes(&SandboxFilter::ready())
        .await
        .unwrap()
        .is_empty());
    let all = cri.list_sandboxes(&SandboxFilter::default()).await.unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].state, SandboxState::NotReady);

    let t = Instant::now();
    cri.remove_sandbox(&id).await.unwrap();
    let remove = t.elapsed();
    let gone = cri.sandbox_status(&id, false).await.unwrap_err();
    assert!(gone.is_not_found(), "{gone}");
    assert!(gone.to_string().contains(&id), "{gone}");
    assert!(gone.to_string().contains(&kit.endpoint()), "{gone}");
    eprintln!("sandbox: run {run:?}, stop {stop:?}, remove {remove:?}");

    // One left running, and one stopped, for the teardown to sweep.
    let running = cri.run_sandbox(&kit.pod("left")).await.unwrap();
    let stopped = cri.run_sandbox(&kit.pod("stopped")).await.unwrap();
    let mut seen = vec![netns.path.clone()];
    for id in [&running, &stopped] {
        let s = cri.sandbox_status(id, true).await.unwrap();
        seen.push(s.netns_path().unwrap().to_path_buf());
    }
    cri.stop_sandbox(&stopped).await.unwrap();
    let footprint = kit
        .footprint()
        .with_netns(seen)
        .with_sandboxes([id.clone(), running, stopped]);
    let t = Instant::now();
    let result = kit.teardown();
    eprintln!("teardown with 2 sandboxes: {:?}", t.elapsed());
    assert_eq!(result, Ok(()));
    assert_eq!(footprint.leftovers(), Vec::<String>::new());
}

/// Runs only in the child of `a_killed_test_is_cleaned_up_by_the_next_kit`: starts a kit
/// with a sandbox, prints where it lives, and dies without any teardown.
#[tokio::test]
async fn killed_child() {
    if std::env::var_os("INTERLOCK_KIT_KILLED_CHILD").is_none() {
        return;
    }
    let kit = Containerd::start().unwrap();
    kit.install_primary_plugins().unwrap();
    kit.write_primary_config().unwrap();
    let cri = kit.cri().await;
    wait_network_ready(&cri, &kit).await;
    let id = cri.run_sandbox(&kit.pod("crash")).await.unwrap();
    let status = cri.sandbox_status(&id, true).await.unwrap();
    if std::env::var_os("INTERLOCK_KIT_KILLED_CHILD").is_some_and(|v| v == "break") {
        // containerd has read it; whoever cleans up after this process cannot restart it.
        std::fs::write(kit.dir().join("config.toml"), "not = [toml").unwrap();
    }
    println!(
        "KIT {} NETNS {}",
        kit.dir().display(),
        status.netns_path().unwrap().display()
    );
    std::process::abort();
}

#[test]
fn a_killed_test_is_cleaned_up_by_the_next_kit() {
    require_root!();
    killed_test_is_cleaned_up(false);
}

/// The same when no daemon can be restarted on the dead kit's directory (its config is
/// broken): the shims, runc containers, netns and mounts go without CRI.
#[test]
fn a_killed_test_is_cleaned_up_even_when_its_daemon_cannot_restart() {
    require_root!();
    killed_test_is_cleaned_up(true);
}

fn killed_test_is_cleaned_up(break_config: bool) {
    // The test's full name in this binary (tests/it/main.rs: `mod containerd;`).
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "containerd::killed_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            "INTERLOCK_KIT_KILLED_CHILD",
            if break_config { "break" } else { "1" },
        )
        .output()
        .unwrap();
    // The harness may put a test's output on either stream.
    let output =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the child should have aborted: {output}"
    );
    let line = output
        .lines()
        .find_map(|l| l.split_once("KIT ").map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("the child printed no kit: {output}"));
    let (dir, netns) = line.split_once(" NETNS ").unwrap();
    let (dir, netns) = (PathBuf::from(dir), PathBuf::from(netns));
    let footprint = Footprint::load(&dir).unwrap().with_netns([netns.clone()]);
    // What the crash left: the sandbox's shim and pause process, its netns, mounts.
    // (Unless a kit starting in another test process got to it first.)
    if dir.exists() {
        let left = footprint.leftovers();
        assert!(is_network_namespace(&netns), "{left:?}");
        assert!(
            left.iter().any(|l| l.contains("containerd-shim")),
            "no shim survived the crash? {left:?}"
        );
    }

    let t = Instant::now();
    let next = Containerd::start().unwrap();
    eprintln!("start with a crashed kit to clean: {:?}", t.elapsed());
    assert_eq!(footprint.leftovers(), Vec::<String>::new());
    assert!(!netns.exists());
    assert!(!dir.exists());
    drop(next);
}

/// A test that panics with a sandbox running still leaves nothing: the kit's Drop runs
/// during unwinding.
#[test]
fn a_panicking_test_still_tears_everything_down() {
    require_root!();
    let (tx, rx) = std::sync::mpsc::channel();
    let outcome = std::panic::catch_unwind(move || {
        let kit = Containerd::start().unwrap();
        kit.install_primary_plugins().unwrap();
        kit.write_primary_config().unwrap();
        let sandbox = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let cri = kit.cri().await;
                wait_network_ready(&cri, &kit).await;
                let id = cri.run_sandbox(&kit.pod("panic")).await.unwrap();
                let status = cri.sandbox_status(&id, true).await.unwrap();
                (id, status.netns_path().unwrap().to_path_buf())
            });
        let (id, netns) = sandbox;
        tx.send(kit.footprint().with_netns([netns]).with_sandboxes([id]))
            .unwrap();
        panic!("the test fails with the sandbox still running");
    });
    assert!(outcome.is_err());
    let footprint = rx.recv().unwrap();
    assert_eq!(footprint.leftovers(), Vec::<String>::new());
}

/// containerd killed under a running sandbox: the teardown restarts it on the same
/// directory so the sandbox is still stopped and removed through CRI.
#[tokio::test]
async fn a_daemon_killed_mid_test_is_restarted_to_sweep() {
    require_root!();
    let kit = Containerd::start().unwrap();
    kit.install_primary_plugins().unwrap();
    kit.write_primary_config().unwrap();
    let cri = kit.cri().await;
    wait_network_ready(&cri, &kit).await;
    let id = cri.run_sandbox(&kit.pod("orphan")).await.unwrap();
    let netns = cri
        .sandbox_status(&id, true)
        .await
        .unwrap()
        .netns_path()
        .unwrap()
        .to_path_buf();
    let pid = nix::unistd::Pid::from_raw(kit.daemon_pid().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    // The sandbox outlives its daemon (the shim keeps it).
    assert!(is_network_namespace(&netns));
    let footprint = kit.footprint().with_netns([netns]).with_sandboxes([id]);
    assert_eq!(kit.teardown(), Ok(()));
    assert_eq!(footprint.leftovers(), Vec::<String>::new());
}

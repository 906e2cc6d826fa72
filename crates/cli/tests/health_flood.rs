//! An unprivileged local user floods the agent's health port with idle connections and
//! the config guard keeps working (issue 7 item 5, review H2): a child process that runs
//! as `nobody` raises its own soft open-file limit and holds 5,000 connections open, each
//! with an unfinished request, while the agent runs with the common container limit of
//! 1,024 descriptors (soft and hard, so it cannot raise it). Deleting the owned config
//! is repaired within the usual budget, `/readyz` answers, and the agent's memory stays
//! bounded. And the agent raises its soft open-file limit to the hard one at start.

mod common;

use common::*;
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

const CONNECTIONS: usize = 5_000;

/// Opens `CONNECTIONS` connections to the port, writes half a request on each, reports
/// how many it opened, then holds them until its stdin closes.
const FLOODER: &str = r#"
trap '' PIPE
ulimit -Sn 8192 || exit 3
echo "pid $$"
opened=0
for ((i = 0; i < N; i++)); do
  if exec {fd}<>"/dev/tcp/127.0.0.1/$PORT" 2>/dev/null; then
    printf 'GET /healthz HTTP/1.1\r\n' >&$fd 2>/dev/null
    opened=$((opened + 1))
  fi
done
echo "opened $opened"
read -r _
"#;

/// The flooder as `nobody`; it exits when this is dropped (its stdin closes).
struct Flooder {
    child: Child,
    stdin: Option<ChildStdin>,
    pid: u32,
    opened: usize,
}

impl Flooder {
    fn start(port: u16) -> Flooder {
        let mut child = Command::new("runuser")
            .args(["-u", "nobody", "--", "bash", "-c", FLOODER])
            .env("N", CONNECTIONS.to_string())
            .env("PORT", port.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("runuser");
        let stdin = child.stdin.take();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut next = || {
            lines
                .next()
                .and_then(Result::ok)
                .unwrap_or_else(|| panic!("flooder ended early"))
        };
        let pid: u32 = next()
            .strip_prefix("pid ")
            .and_then(|p| p.parse().ok())
            .expect("flooder pid");
        let opened: usize = next()
            .strip_prefix("opened ")
            .and_then(|p| p.parse().ok())
            .expect("flooder count");
        Flooder {
            child,
            stdin,
            pid,
            opened,
        }
    }
}

impl Drop for Flooder {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} for {pid}"))
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

fn uid_of(pid: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

#[test]
fn idle_connections_from_an_unprivileged_user_do_not_stop_repairs() {
    interlock_testkit::require_root!();
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    let a = d.agent(&[]);
    assert_eq!(wait_protected(&d, &a), "00-interlock.conflist");
    // The limit of a container started with the common default: the agent cannot raise
    // it, so only its connection cap keeps descriptors for the guard.
    let set = Command::new("prlimit")
        .args(["--pid", &a.pid().to_string(), "--nofile=1024:1024"])
        .status()
        .unwrap();
    assert!(set.success(), "prlimit failed");
    let rss_before = status_kib(a.pid(), "VmRSS:");

    let flood_started = Instant::now();
    let flood = Flooder::start(a.port);
    assert_eq!(uid_of(flood.pid), 65534, "the flooder must run as nobody");
    assert!(
        flood.opened >= CONNECTIONS,
        "the flooder opened only {} connections",
        flood.opened
    );
    let held = open_fds(flood.pid);
    assert!(held >= CONNECTIONS, "the flooder holds {held} descriptors");
    let agent_fds = open_fds(a.pid());
    assert!(
        agent_fds < 512,
        "the agent holds {agent_fds} descriptors under the flood"
    );

    // A primary reinstall (or anyone) deletes the owned config.
    std::fs::remove_file(d.conf.join("00-interlock.conflist")).unwrap();
    let t0 = Instant::now();
    wait_until(
        Duration::from_secs(2),
        || d.effective_with_us().as_deref() == Some("00-interlock.conflist"),
        || format!("not repaired under the flood; log:\n{}", a.log_text()),
    );
    let repaired = t0.elapsed();

    // The probes still get through the held connections.
    let t0 = Instant::now();
    let addr = format!("127.0.0.1:{}", a.port).parse().unwrap();
    let mut readyz = None;
    while t0.elapsed() < Duration::from_secs(2) && readyz != Some(200) {
        readyz = interlock_agent::health::readyz_status(addr, Duration::from_secs(1)).ok();
    }
    let answered = t0.elapsed();
    assert_eq!(
        readyz,
        Some(200),
        "/readyz under the flood; log:\n{}",
        a.log_text()
    );
    let (code, body) = a.get("/healthz").expect("/healthz under the flood");
    assert_eq!((code, body.as_str()), (200, "ok\n"));

    let rss = status_kib(a.pid(), "VmRSS:");
    let peak = status_kib(a.pid(), "VmHWM:");
    let agent_fds_after = open_fds(a.pid());
    eprintln!(
        "health flood: {} connections held by uid 65534 (opened in {:?}); agent fds {agent_fds} \
         then {agent_fds_after} of 1024; repaired in {repaired:?}; /readyz 200 after \
         {answered:?}; agent RSS {rss_before} KiB before, {rss} KiB under the flood, peak {peak} KiB",
        flood.opened,
        flood_started.elapsed(),
    );
    // Growth, not the absolute figure: a debug agent holds its (debug-sized, ~27 MB)
    // plugin image in memory. Unbounded, 8,000 held connections cost about 70 MB.
    assert!(
        peak.saturating_sub(rss_before) < 8 * 1024,
        "agent memory under the flood: RSS {rss_before} KiB before, peak {peak} KiB"
    );
    assert!(
        !a.log_text().contains("Too many open files"),
        "{}",
        a.log_text()
    );
    drop(flood);
}

/// The soft open-file limit in force for `pid`.
fn soft_nofile(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/limits"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

#[test]
fn the_agent_raises_its_soft_open_file_limit_to_the_hard_one() {
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = d.tmp.path().join("agent.log");
    // prlimit execs the agent, so the child is the agent itself.
    let child = Command::new("prlimit")
        .arg("--nofile=1024:4096")
        .arg(interlock())
        .args(["agent", "--kube=none", "--cni-conf-dir"])
        .arg(&d.conf)
        .arg("--cni-bin-dir")
        .arg(&d.bin)
        .arg("--state-dir")
        .arg(&d.state)
        .arg("--plugin-source")
        .arg(plugin())
        .arg("--health-addr")
        .arg(format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let a = Agent { child, port, log };
    wait_protected(&d, &a);
    assert_eq!(soft_nofile(a.pid()), 4096, "{}", a.log_text());
    assert!(
        a.log_text()
            .contains("raised the open-file limit from=1024 to=4096"),
        "{}",
        a.log_text()
    );
}

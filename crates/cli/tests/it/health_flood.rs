//! An unprivileged local user floods the agent's health port with idle connections and
//! the config guard keeps working (issue 7 item 5, review H2): a child process that runs
//! as `nobody` raises its own soft open-file limit and holds 5,000 connections open, each
//! with an unfinished request, while the agent runs with the common container limit of
//! 1,024 descriptors (soft and hard, so it cannot raise it). Deleting the owned config
//! is repaired within the usual budget, `/readyz` answers, and the agent's memory stays
//! bounded. And the agent raises its soft open-file limit to the hard one at start.

use crate::common;

use common::*;
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

const CONNECTIONS: usize = 5_000;

/// The floods of this file load the machine: one at a time.
static FLOOD: std::sync::Mutex<()> = std::sync::Mutex::new(());

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
    let _flood = FLOOD
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
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

/// Keeps `n` connections to `addr` that trickle a request head one byte every 50 ms, and
/// opens a new one as soon as one is dropped (redteam-3 H-1's attacker), until `stop`.
fn churning_flood(
    addr: std::net::SocketAddr,
    n: usize,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    use std::io::{Read, Write};
    use std::sync::atomic::Ordering;
    std::thread::spawn(move || {
        let head = format!(
            "GET /readyz HTTP/1.1\r\nHost: x\r\nX-Pad: {}",
            "a".repeat(4000)
        );
        let head = head.as_bytes();
        let open = || {
            let s = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
            s.set_nonblocking(true).ok()?;
            Some(s)
        };
        let mut conns: Vec<(Option<std::net::TcpStream>, usize)> =
            (0..n).map(|_| (open(), 0)).collect();
        let mut reconnects = 0u64;
        while !stop.load(Ordering::Relaxed) {
            for (conn, at) in conns.iter_mut() {
                let alive = match conn {
                    Some(s) => {
                        let mut b = [0u8; 512];
                        let closed = matches!(s.read(&mut b), Ok(0))
                            || matches!(s.read(&mut b), Err(ref e) if e.kind() != std::io::ErrorKind::WouldBlock);
                        !closed && s.write(&head[*at % head.len()..][..1]).is_ok()
                    }
                    None => false,
                };
                if alive {
                    *at += 1;
                } else {
                    *conn = open();
                    *at = 0;
                    reconnects += 1;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        reconnects
    })
}

/// One kubelet-like probe: GET `path` with a `timeout` for the whole exchange; the time
/// it took when it was answered 200.
fn probe(addr: std::net::SocketAddr, path: &str, timeout: Duration) -> Option<Duration> {
    probe_why(addr, path, timeout).ok()
}

fn probe_why(
    addr: std::net::SocketAddr,
    path: &str,
    timeout: Duration,
) -> Result<Duration, String> {
    use std::io::{Read, Write};
    let t0 = Instant::now();
    let mut s = std::net::TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| format!("connect after {:?}: {e}", t0.elapsed()))?;
    let left = timeout
        .checked_sub(t0.elapsed())
        .ok_or("connected too late")?
        .max(Duration::from_millis(1));
    s.set_read_timeout(Some(left)).map_err(|e| e.to_string())?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: kube-probe/1.33\r\n\r\n"
    )
    .map_err(|e| format!("write after {:?}: {e}", t0.elapsed()))?;
    let mut out = String::new();
    s.read_to_string(&mut out)
        .map_err(|e| format!("read after {:?}: {e}", t0.elapsed()))?;
    if !out.starts_with("HTTP/1.1 200") {
        return Err(format!(
            "answer after {:?}: {:?}",
            t0.elapsed(),
            out.lines().next()
        ));
    }
    if t0.elapsed() > timeout {
        return Err(format!("answered after {:?}", t0.elapsed()));
    }
    Ok(t0.elapsed())
}

/// redteam-3 H-1: 400 connections that trickle a request head and reconnect as soon as
/// they are dropped, on every TCP listener the agent opens (the metrics listener and the
/// kubelet's probe listener), do not starve the kubelet's liveness probe. The review
/// measured 11 of 35 probes answered at 130 such connections. The figure that matters is
/// the kubelet's default timeout, 1 s, and it is printed; on a loaded 2-core machine the
/// machine's own scheduling, not the agent, can hold a probe past 1 s, so the assertion
/// gives each probe 3 s and asks 99 % of them, and never 3 failures in a row (the
/// liveness threshold).
#[test]
fn a_churning_flood_on_every_listener_does_not_starve_the_kubelets_probe() {
    let _flood = FLOOD
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    let probe_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let probe_addr = format!("127.0.0.1:{probe_port}");
    let a = d.agent(&["--probe-addr", &probe_addr]);
    assert_eq!(wait_protected(&d, &a), "00-interlock.conflist");
    let probes: std::net::SocketAddr = probe_addr.parse().unwrap();
    let metrics: std::net::SocketAddr = format!("127.0.0.1:{}", a.port).parse().unwrap();
    assert!(probe(probes, "/healthz", Duration::from_secs(2)).is_some());
    assert!(
        probe(probes, "/metrics", Duration::from_secs(2)).is_none(),
        "no /metrics on the probe listener"
    );

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let floods = [
        churning_flood(probes, 400, stop.clone()),
        churning_flood(metrics, 400, stop.clone()),
    ];
    // Let the flood fill every place first.
    std::thread::sleep(Duration::from_secs(2));
    const PROBES: usize = 150;
    let mut latencies = vec![];
    let (mut failed, mut run, mut longest_run, mut within_3s) = (0usize, 0usize, 0usize, 0usize);
    for _ in 0..PROBES {
        let t0 = Instant::now();
        match probe_why(probes, "/healthz", Duration::from_secs(3)) {
            Ok(l) => {
                within_3s += 1;
                latencies.push(l);
                run = 0;
                if l > Duration::from_secs(1) {
                    failed += 1;
                }
            }
            Err(why) => {
                eprintln!("probe failed: {why}");
                failed += 1;
                run += 1;
                longest_run = longest_run.max(run);
            }
        }
        std::thread::sleep(Duration::from_millis(100).saturating_sub(t0.elapsed()));
    }
    // The metrics listener still answers too (fewer probes: it is not the kubelet's).
    let metrics_ok = (0..20)
        .filter(|_| probe(metrics, "/healthz", Duration::from_secs(1)).is_some())
        .count();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reconnects: Vec<u64> = floods.into_iter().map(|f| f.join().unwrap()).collect();
    latencies.sort();
    let answered = PROBES - failed;
    let pct = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    eprintln!(
        "churning flood (400 connections on each listener, {reconnects:?} reconnects): \
         kubelet probe /healthz answered within 1 s {answered}/{PROBES} ({:.1} %), within 3 s \
         {within_3s}/{PROBES}, longest failing run {longest_run}, latency p50 {:?} p99 {:?} \
         max {:?}; metrics listener {metrics_ok}/20",
        answered as f64 * 100.0 / PROBES as f64,
        pct(0.5),
        pct(0.99),
        latencies.last().unwrap(),
    );
    assert!(
        reconnects.iter().all(|r| *r > 400),
        "the flood did not churn: {reconnects:?}"
    );
    // The kubelet restarts the agent after 3 failures in a row (failureThreshold).
    assert!(longest_run < 3, "{longest_run} probes failed in a row");
    assert!(
        within_3s * 100 >= PROBES * 99,
        "only {within_3s}/{PROBES} probes answered within 3 s ({answered} within 1 s); log:\n{}",
        a.log_text()
    );
    assert!(metrics_ok >= 15, "metrics listener: {metrics_ok}/20");
}

//! `interlock-bench repair`: starts a real agent on throwaway directories, clobbers its
//! config again and again the way a primary CNI's installer would (write a temp file,
//! rename it over the file), and measures the time from each clobber until the runtime's
//! effective config (by `interlock_confdir::load`) carries interlock again.
//! With `--scenario follow` it changes the primary's subnet instead and measures until
//! the effective config carries the new subnet and interlock; with `--scenario readyz` it
//! renames in a foreign file that sorts first and measures until `/readyz` answers 503,
//! then removes it and measures until 200 again; with `--scenario return` it removes the
//! primary's file, measures until interlock's holding config (or the next network) is in
//! effect, writes the file back and measures until the primary's network with interlock
//! is in effect again (how long pods are refused after the primary is back); with
//! `--scenario writer` the primary is rewritten `--writes-per-sec` times a second for `--seconds` (alternating two
//! subnets) and the agent's CPU share is measured. `--foreign N` puts N further valid
//! foreign files in the conf dir (sorting after the primary, as other networks do), to
//! show that the agent's cost does not grow with the directory. Every scenario reports
//! the agent's CPU (`/proc/<pid>/stat` utime + stime) over its run.
//! Prints `{"p50_ms", "p99_ms", "max_ms", "mean_ms", "n", "idle_rss_kib", ...}`, with
//! `filesystem` (`tmpfs` or `disk`: tmpfs writes are not synced) and, for the scenarios
//! with a budget (`clobber`: p99 ≤ 5 ms; `writer`: ≤ 10 % of a core), `budget` and `pass`.
//! Needs no root: everything happens in a temp dir and on a loopback port.

use crate::stats::Summary;
use anyhow::{bail, Context};
use clap::Args;
use interlock_confdir as confdir;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// `interlock-bench repair`'s flags.
#[derive(Debug, Args)]
pub struct RepairArgs {
    /// Number of clobbers.
    #[arg(long, default_value_t = 1000)]
    pub clobbers: usize,
    /// Pause between a repair and the next clobber, in milliseconds.
    #[arg(long, default_value_t = 5)]
    pub interval_ms: u64,
    /// owned: clobber the owned file; chain: the primary rewrites its file without us.
    #[arg(long, default_value = "chain")]
    pub mode: String,
    /// The interlock-cni binary (default: next to this binary).
    #[arg(long)]
    pub plugin_source: Option<PathBuf>,
    /// The `interlock` binary that runs the agent (default: next to this binary).
    #[arg(long)]
    pub interlock: Option<PathBuf>,
    /// Where to create the throwaway directories (default: the system temp dir).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// clobber: a foreign writer replaces the file; follow: the primary changes its
    /// subnet; readyz: a foreign file takes first place and goes away again; return: the
    /// primary's file is removed (holding config) and written back.
    #[arg(long, default_value = "clobber", value_parser = ["clobber", "follow", "readyz", "writer", "return"])]
    pub scenario: String,
    /// Further valid foreign config files in the conf dir (`50-foreign-NNNN.conflist`).
    #[arg(long, default_value_t = 0)]
    pub foreign: usize,
    /// writer: rewrites of the primary per second.
    #[arg(long, default_value_t = 100)]
    pub writes_per_sec: u64,
    /// writer: how long it writes, in seconds.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
}

const PRIMARY: &str = r#"{
  "cniVersion": "0.4.0",
  "name": "ilbench",
  "plugins": [
    {"type": "bridge", "bridge": "ilbench0", "ipam": {"type": "host-local", "subnet": "10.99.250.0/24"}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
"#;

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The list containerd loads from `dir` (its first config file by name, parsed), read
/// without stat'ing or reading the other files: with a large directory the bench's own
/// check must not be what it measures.
fn containerd_list(dir: &Path) -> Option<confdir::Parsed> {
    let first = std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| !t.is_dir()))
        .map(|e| e.file_name())
        .filter(|n| confdir::is_config_name(&n.to_string_lossy()))
        .min_by(|a, b| a.as_bytes().cmp(b.as_bytes()))?;
    let content = interlock_contract::bounded::read_config(&dir.join(&first)).ok()?;
    let mut entry = confdir::DirEntry::file(&first.to_string_lossy(), &content, 0o644);
    entry.os_name = first;
    entry.parse().ok()
}

/// A change to the conf dir's names, from its inotify events.
enum NameChange {
    /// This name was created, written, moved or removed.
    Changed(std::ffi::OsString),
    /// The queue overflowed: list the directory again.
    Relist,
}

/// The conf dir's config names, listed once and kept from its events: the bench's check
/// then reads the first file only. Listing a directory of a thousand files on every event
/// would be the bench measuring itself, and each listing holds the directory's lock
/// against the agent's renames.
struct Names {
    dir: PathBuf,
    set: std::collections::BTreeSet<std::ffi::OsString>,
}

impl Names {
    fn list(dir: &Path) -> std::io::Result<Names> {
        let set = std::fs::read_dir(dir)?
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| !t.is_dir()))
            .map(|e| e.file_name())
            .collect();
        Ok(Names {
            dir: dir.to_path_buf(),
            set,
        })
    }

    /// Each name an event names is looked up again (one `lstat`): the order of the
    /// events of an exchange (`RENAME_EXCHANGE`) says nothing about which name exists.
    fn apply(&mut self, changes: Vec<NameChange>) {
        for c in changes {
            let name = match c {
                NameChange::Changed(n) => n,
                NameChange::Relist => {
                    if let Ok(fresh) = Names::list(&self.dir) {
                        *self = fresh;
                    }
                    continue;
                }
            };
            match std::fs::symlink_metadata(self.dir.join(&name)) {
                Ok(m) if !m.is_dir() => {
                    self.set.insert(name);
                }
                _ => {
                    self.set.remove(&name);
                }
            }
        }
    }

    /// What [`containerd_list`] reads, from the names kept (`OsString`s order by bytes,
    /// as containerd sorts). `None` also while an event is still on its way.
    fn containerd_list(&self) -> Option<confdir::Parsed> {
        let first = self
            .set
            .iter()
            .find(|n| confdir::is_config_name(&n.to_string_lossy()))?;
        let content = interlock_contract::bounded::read_config(&self.dir.join(first)).ok()?;
        let mut entry = confdir::DirEntry::file(&first.to_string_lossy(), &content, 0o644);
        entry.os_name = first.clone();
        entry.parse().ok()
    }
}

/// Whether a list runs interlock-cni.
fn carries_interlock(p: &confdir::Parsed) -> bool {
    p.list.plugin_types().contains(&"interlock-cni")
}

fn has_interlock(dir: &Path) -> bool {
    containerd_list(dir).is_some_and(|p| carries_interlock(&p))
}

/// User + system CPU time of `pid` so far (`/proc/<pid>/stat` utime + stime).
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as u64;
    Some(Duration::from_nanos(ticks * 1_000_000_000 / hz))
}

fn rename_in(dir: &Path, name: &str, data: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join(".bench-clobber.tmp");
    std::fs::write(&tmp, data)?;
    std::fs::rename(&tmp, dir.join(name))
}

/// VmRSS of `pid` in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// A running agent on throwaway directories, ready to be clobbered.
pub struct Session {
    agent: Agent,
    root: PathBuf,
    conf: PathBuf,
    mode: String,
    events: mpsc::Receiver<Vec<NameChange>>,
    names: Names,
    count: u64,
    health: std::net::SocketAddr,
}

impl Session {
    /// Starts `exe agent` in `mode` (chain or owned) under `base`, installing `plugin`,
    /// and waits until interlock is in effect.
    pub fn start(exe: &Path, plugin: &Path, mode: &str, base: &Path) -> anyhow::Result<Session> {
        Session::start_with(exe, plugin, mode, base, 0)
    }

    /// [`Session::start`] with `foreign` further valid foreign files in the conf dir.
    pub fn start_with(
        exe: &Path,
        plugin: &Path,
        mode: &str,
        base: &Path,
        foreign: usize,
    ) -> anyhow::Result<Session> {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let root = base.join(format!("interlock-bench-{}-{n}", std::process::id()));
        let conf = root.join("net.d");
        let bin = root.join("bin");
        let state = root.join("state");
        for d in [&conf, &bin, &state] {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        std::fs::write(conf.join("10-primary.conflist"), PRIMARY)?;
        for i in 0..foreign {
            let body = PRIMARY
                .replace("\"ilbench\"", &format!("\"foreign{i}\""))
                .replace("ilbench0", &format!("fb{i}"))
                .replace("10.99.250.0/24", &format!("10.98.{}.0/24", i % 250));
            std::fs::write(conf.join(format!("50-foreign-{i:04}.conflist")), body)?;
        }
        let health = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let child = Command::new(exe)
            .args([
                "agent",
                "--kube=none",
                "--config-mode",
                mode,
                "--conflict-threshold",
                "0",
                // The guard alone is measured: no runtime runs here, and an audit that
                // cannot reach one turns /readyz to 503 after a while.
                "--cri-endpoint",
                "none",
            ])
            .arg("--cni-conf-dir")
            .arg(&conf)
            .arg("--cni-bin-dir")
            .arg(&bin)
            .arg("--state-dir")
            .arg(&state)
            .arg("--plugin-source")
            .arg(plugin)
            .arg("--health-addr")
            .arg(health.to_string())
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(root.join("agent.log"))
                    .context("creating the agent's log")?,
            )
            .spawn()
            .context("starting the agent")?;
        let agent = Agent(child);
        let start = Instant::now();
        while !has_interlock(&conf) {
            if start.elapsed() > Duration::from_secs(10) {
                bail!("the agent did not put interlock in effect within 10 s");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        // Wake on every change in the conf dir instead of busy polling.
        let (tx, events) = mpsc::channel();
        let mut ino = inotify::Inotify::init()?;
        ino.watches().add(
            &conf,
            inotify::WatchMask::MOVED_TO
                | inotify::WatchMask::MOVED_FROM
                | inotify::WatchMask::CREATE
                | inotify::WatchMask::CLOSE_WRITE
                | inotify::WatchMask::DELETE,
        )?;
        // Listed after the watch is in place, so no change falls between the two.
        let names = Names::list(&conf)?;
        std::thread::spawn(move || {
            use inotify::EventMask;
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(events) = ino.read_events_blocking(&mut buf) {
                let changes = events
                    .filter_map(|e| {
                        if e.mask.contains(EventMask::Q_OVERFLOW) {
                            return Some(NameChange::Relist);
                        }
                        Some(NameChange::Changed(e.name?.to_os_string()))
                    })
                    .collect();
                if tx.send(changes).is_err() {
                    return;
                }
            }
        });
        Ok(Session {
            agent,
            root,
            conf,
            mode: mode.to_string(),
            events,
            names,
            count: 0,
            health,
        })
    }

    /// The network name of the config the runtime would load now, when it carries
    /// interlock (`None` otherwise).
    pub fn effective_network(&self) -> Option<String> {
        containerd_list(&self.conf)
            .filter(carries_interlock)
            .map(|c| c.list.name().to_string())
    }

    /// The agent's CPU time so far.
    pub fn cpu_time(&self) -> Option<Duration> {
        cpu_time(self.agent.0.id())
    }

    /// VmRSS of the agent in KiB.
    pub fn rss_kib(&self) -> Option<u64> {
        rss_kib(self.agent.0.id())
    }

    /// One clobber, the way an installer writes (temp file, rename), and the time until
    /// the effective config carries interlock again.
    pub fn clobber(&mut self) -> anyhow::Result<Duration> {
        self.count += 1;
        // Vary the content so every clobber is a real change.
        let body = PRIMARY.replace("ilbench", &format!("ilbench{}", self.count % 2));
        self.drain();
        let name = if self.mode == "owned" {
            "00-interlock.conflist"
        } else {
            "10-primary.conflist"
        };
        let t0 = Instant::now();
        rename_in(&self.conf, name, body.as_bytes())?;
        let what = format!("clobber {}: not repaired", self.count);
        self.wait_conf(t0, &what, carries_interlock)
    }
}

impl Session {
    /// The primary changes a parameter (its subnet), and the time until the effective
    /// config carries the new subnet with interlock in it.
    pub fn follow(&mut self) -> anyhow::Result<Duration> {
        self.count += 1;
        let subnet = format!("10.99.{}.0/24", self.count % 200);
        let body = PRIMARY.replace("10.99.250.0/24", &subnet);
        self.drain();
        let t0 = Instant::now();
        rename_in(&self.conf, "10-primary.conflist", body.as_bytes())?;
        let what = format!("subnet change {}: not followed", self.count);
        self.wait_conf(t0, &what, |c| {
            carries_interlock(c) && c.list.plugins()[0]["ipam"]["subnet"] == subnet.as_str()
        })
    }

    /// The primary rewritten `per_sec` times a second for `secs` seconds (two subnets in
    /// turn); returns the agent's CPU share of one core over that time and whether the
    /// effective config follows the last subnet (within 5 s of the last write).
    pub fn writer(&mut self, per_sec: u64, secs: u64) -> anyhow::Result<(f64, bool)> {
        let period = Duration::from_nanos(1_000_000_000 / per_sec.max(1));
        let bodies =
            ["10.99.251.0/24", "10.99.252.0/24"].map(|s| (s, PRIMARY.replace("10.99.250.0/24", s)));
        let cpu0 = self.cpu_time().context("reading the agent's CPU time")?;
        let t0 = Instant::now();
        let n = per_sec * secs;
        for i in 0..n {
            rename_in(
                &self.conf,
                "10-primary.conflist",
                bodies[(i % 2) as usize].1.as_bytes(),
            )?;
            let next = t0 + period * (i as u32 + 1);
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
        let wall = t0.elapsed();
        let cpu = self.cpu_time().context("reading the agent's CPU time")? - cpu0;
        let last = bodies[((n + 1) % 2) as usize].0;
        let followed = self
            .wait_conf(Instant::now(), "the last write: not followed", |c| {
                carries_interlock(c) && c.list.plugins()[0]["ipam"]["subnet"] == last
            })
            .is_ok();
        Ok((cpu.as_secs_f64() / wall.as_secs_f64(), followed))
    }

    /// The last `n` lines of the agent's log (for an error).
    fn log_tail(&self, n: usize) -> String {
        let log = std::fs::read_to_string(self.root.join("agent.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    fn wait_readyz(&self, want: u16, t0: Instant) -> anyhow::Result<Duration> {
        loop {
            if interlock_agent::health::readyz_status(self.health, Duration::from_secs(1))? == want
            {
                return Ok(t0.elapsed());
            }
            if t0.elapsed() > Duration::from_secs(5) {
                bail!(
                    "/readyz did not answer {want} within 5 s; the agent's log ends:\n{}",
                    self.log_tail(20)
                );
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// The primary's file goes away (its DaemonSet re-installing, a node reconfigured)
    /// and comes back. Returns the time from the removal until the runtime's config is
    /// no longer the removed network (interlock's holding config; with `--foreign` files,
    /// the next network with interlock in it), and the time from the file's return until
    /// the runtime's config is the primary's network with interlock in it again. Pods
    /// created in that second window are refused by the holding config (fail closed)
    /// although the primary is back: it is how long interlock itself keeps pods from
    /// starting.
    pub fn primary_returns(&mut self) -> anyhow::Result<(Duration, Duration)> {
        let holding =
            |c: &confdir::Parsed| c.list.name() == interlock_contract::layout::HOLDING_NETWORK;
        let primary = self.conf.join("10-primary.conflist");
        self.drain();
        let t0 = Instant::now();
        std::fs::remove_file(&primary)
            .with_context(|| format!("removing {}", primary.display()))?;
        let what = "the primary's removal: the runtime's config did not leave its network";
        let gone = self.wait_conf(t0, what, |c| {
            c.list.name() != "ilbench" && (holding(c) || carries_interlock(c))
        })?;
        self.drain();
        let t1 = Instant::now();
        rename_in(&self.conf, "10-primary.conflist", PRIMARY.as_bytes())?;
        let what = "the primary's return: its network with interlock did not come back";
        let back = self.wait_conf(t1, what, |c| {
            c.list.name() == "ilbench" && carries_interlock(c)
        })?;
        Ok((gone, back))
    }

    /// Waits until the config the runtime would load satisfies `ok` (woken by the conf
    /// dir's events); the time since `t0`, or `failed` after 5 s.
    fn wait_conf(
        &mut self,
        t0: Instant,
        failed: &str,
        ok: impl Fn(&confdir::Parsed) -> bool,
    ) -> anyhow::Result<Duration> {
        loop {
            self.drain();
            if self.names.containerd_list().is_some_and(|c| ok(&c)) {
                return Ok(t0.elapsed());
            }
            if t0.elapsed() > Duration::from_secs(5) {
                bail!("{failed} within 5 s");
            }
            if let Ok(changes) = self.events.recv_timeout(Duration::from_millis(20)) {
                self.names.apply(changes);
            }
        }
    }

    /// Takes in the conf dir's changes so far.
    fn drain(&mut self) {
        while let Ok(changes) = self.events.try_recv() {
            self.names.apply(changes);
        }
    }

    /// A foreign file that sorts ahead of anything interlock can name appears, and the
    /// time until `/readyz` says 503; then it goes away, and the time until 200 again.
    pub fn readyz_flip(&mut self) -> anyhow::Result<(Duration, Duration)> {
        let t0 = Instant::now();
        rename_in(&self.conf, "\u{1}first.conflist", PRIMARY.as_bytes())?;
        let down = self.wait_readyz(503, t0)?;
        let t1 = Instant::now();
        std::fs::remove_file(self.conf.join("\u{1}first.conflist"))?;
        let up = self.wait_readyz(200, t1)?;
        Ok((down, up))
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.agent.0.kill();
        let _ = self.agent.0.wait();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// p50/p90/p99/max/mean of `samples` in milliseconds, as JSON (`{"n": 0}` for none).
pub fn summary(samples: &[Duration]) -> serde_json::Value {
    Summary::of(samples).map_or_else(|| serde_json::json!({"n": 0}), |s| s.to_json_ms())
}

/// Repair after a clobber: p99 within this (docs/performance.md, Budgets).
pub const REPAIR_P99_BUDGET_MS: f64 = 5.0;

/// The agent's CPU while a primary is rewritten 100 times a second, in percent of a core.
pub const WRITER_CPU_BUDGET_PCT: f64 = 10.0;

/// `tmpfs` when `dir` is on a tmpfs (where the agent writes without fsync), else `disk`.
pub fn filesystem(dir: &Path) -> &'static str {
    match nix::sys::statfs::statfs(dir) {
        Ok(s) if s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC => "tmpfs",
        _ => "disk",
    }
}

/// The budget a scenario's figure is judged by and whether `out` meets it (`None` for a
/// scenario without one).
fn judged(scenario: &str, out: &serde_json::Value) -> Option<serde_json::Value> {
    let (budget, figure) = match scenario {
        "clobber" => (
            serde_json::json!({"p99_ms": REPAIR_P99_BUDGET_MS}),
            out["p99_ms"].as_f64()? <= REPAIR_P99_BUDGET_MS,
        ),
        "writer" => (
            serde_json::json!({"agent_cpu_pct_of_core": WRITER_CPU_BUDGET_PCT}),
            out["agent_cpu_pct_of_core"].as_f64()? <= WRITER_CPU_BUDGET_PCT,
        ),
        _ => return None,
    };
    Some(serde_json::json!({"budget": budget, "pass": figure}))
}

/// Adds `budget` and `pass` to `out` for a scenario with a budget.
fn add_verdict(out: &mut serde_json::Value, scenario: &str) {
    if let Some(v) = judged(scenario, out) {
        out["budget"] = v["budget"].clone();
        out["pass"] = v["pass"].clone();
    }
}

/// `interlock` next to this executable (or next to its `deps` directory, for benches).
pub fn default_interlock_path() -> PathBuf {
    crate::default_plugin_path().with_file_name("interlock")
}

/// Runs the scenario `a` names and prints one JSON line.
pub fn run(a: RepairArgs) -> anyhow::Result<()> {
    let exe = a.interlock.unwrap_or_else(default_interlock_path);
    let plugin = a.plugin_source.unwrap_or_else(crate::default_plugin_path);
    if a.scenario == "readyz" && a.mode != "owned" {
        // In chain mode the agent chains into whatever file is first, so a new first
        // file does not make it unready.
        bail!("--scenario readyz needs --mode owned (chain mode joins the new first file)");
    }
    let base = a.dir.unwrap_or_else(std::env::temp_dir);
    let fs = filesystem(&base);
    let mut s = Session::start_with(&exe, &plugin, &a.mode, &base, a.foreign)?;
    std::thread::sleep(Duration::from_millis(1500));
    let idle_rss = s.rss_kib();
    if a.scenario == "writer" {
        let (share, followed) = s.writer(a.writes_per_sec, a.seconds)?;
        let mut out = serde_json::json!({
            "scenario": "writer",
            "mode": a.mode,
            "filesystem": fs,
            "foreign_files": a.foreign,
            "writes_per_sec": a.writes_per_sec,
            "seconds": a.seconds,
            "agent_cpu_pct_of_core": (share * 1000.0).round() / 10.0,
            "followed_last_write": followed,
            "idle_rss_kib": idle_rss,
            "rss_after_kib": s.rss_kib(),
        });
        add_verdict(&mut out, "writer");
        println!("{out}");
        return Ok(());
    }
    let cpu0 = s.cpu_time();
    let t0 = Instant::now();
    let (mut samples, mut ups) = (Vec::with_capacity(a.clobbers), vec![]);
    let floor = WriteFloor::new(&base, fs == "disk")?;
    let mut floors = vec![];
    for _ in 0..a.clobbers {
        match a.scenario.as_str() {
            "follow" => samples.push(s.follow()?),
            "readyz" => {
                let (down, up) = s.readyz_flip()?;
                samples.push(down);
                ups.push(up);
            }
            "return" => {
                let (left, back) = s.primary_returns()?;
                samples.push(back);
                ups.push(left);
            }
            _ => {
                samples.push(s.clobber()?);
                floors.push(floor.write()?);
            }
        }
        std::thread::sleep(Duration::from_millis(a.interval_ms));
    }
    let cpu1 = s.cpu_time();
    let wall = t0.elapsed().as_secs_f64();
    let mut out = summary(&samples);
    if a.scenario == "readyz" {
        // samples: until 503; ready_again: until 200 after the foreign file left.
        out["ready_again"] = summary(&ups);
    }
    if a.scenario == "return" {
        // samples: from the primary's return until its network with interlock is in
        // effect; left: from its removal until the runtime's config no longer is it.
        out["left"] = summary(&ups);
    }
    if !floors.is_empty() {
        // What writing the repaired file alone costs here: the floor under the repair.
        out["write_floor"] = summary(&floors);
    }
    if let (Some(c0), Some(c1)) = (cpu0, cpu1) {
        out["agent_cpu_pct_of_core"] =
            (((c1 - c0).as_secs_f64() / wall * 1000.0).round() / 10.0).into();
    }
    out["foreign_files"] = a.foreign.into();
    out["scenario"] = a.scenario.clone().into();
    out["mode"] = a.mode.clone().into();
    out["filesystem"] = fs.into();
    add_verdict(&mut out, &a.scenario);
    out["idle_rss_kib"] = idle_rss.into();
    out["rss_after_kib"] = s.rss_kib().into();
    println!("{out}");
    Ok(())
}

/// The floor under a repair: writing a config-sized file the way the agent writes one
/// (a complete temp file, synced except on tmpfs, renamed in), in a directory of its own
/// on the same filesystem, with no agent and no inotify watch on it.
struct WriteFloor {
    dir: PathBuf,
    sync: bool,
    bytes: Vec<u8>,
}

impl WriteFloor {
    fn new(base: &Path, sync: bool) -> anyhow::Result<WriteFloor> {
        let dir = base.join(format!("interlock-bench-floor-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        // About the size of the primary's list with interlock's entry in it.
        let bytes = PRIMARY.repeat(2).into_bytes();
        Ok(WriteFloor { dir, sync, bytes })
    }

    fn write(&self) -> anyhow::Result<Duration> {
        let t0 = Instant::now();
        let tmp = interlock_contract::atomic::write_temp(
            &self.dir,
            "10-floor.conflist",
            &self.bytes,
            0o644,
            self.sync,
        )?;
        std::fs::rename(&tmp, self.dir.join("10-floor.conflist"))?;
        Ok(t0.elapsed())
    }
}

impl Drop for WriteFloor {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names kept from events match the directory whatever order an exchange's
    /// events come in, and the first config is the one containerd would pick.
    #[test]
    fn the_names_kept_from_events_are_the_directorys() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        std::fs::write(d.join("10-primary.conflist"), PRIMARY).unwrap();
        std::fs::write(d.join("50-foreign.conflist"), PRIMARY).unwrap();
        let mut names = Names::list(d).unwrap();
        let ours = PRIMARY.replace("\"ilbench\"", "\"ours\"");
        std::fs::write(d.join(".tmp"), &ours).unwrap();
        nix::fcntl::renameat2(
            None,
            &d.join(".tmp"),
            None,
            &d.join("10-primary.conflist"),
            nix::fcntl::RenameFlags::RENAME_EXCHANGE,
        )
        .unwrap();
        // An exchange's events, the name's removal last: both names still exist.
        names.apply(vec![
            NameChange::Changed(".tmp".into()),
            NameChange::Changed("10-primary.conflist".into()),
        ]);
        std::fs::remove_file(d.join(".tmp")).unwrap();
        names.apply(vec![NameChange::Changed(".tmp".into())]);
        assert_eq!(names.set, Names::list(d).unwrap().set);
        assert_eq!(names.containerd_list().unwrap().list.name(), "ours");
        std::fs::remove_file(d.join("10-primary.conflist")).unwrap();
        names.apply(vec![NameChange::Changed("10-primary.conflist".into())]);
        assert_eq!(names.containerd_list().unwrap().list.name(), "ilbench");
        assert_eq!(
            names.containerd_list().map(|c| c.list.name().to_string()),
            containerd_list(d).map(|c| c.list.name().to_string())
        );
    }
}

//! `interlock-bench repair`: starts a real agent on throwaway directories, clobbers its
//! config again and again the way a primary CNI's installer would (write a temp file,
//! rename it over the file), and measures the time from each clobber until the runtime's
//! effective config (by `interlock_protocol::confdir::load`) carries interlock again.
//! With `--scenario follow` it changes the primary's subnet instead and measures until
//! the effective config carries the new subnet and interlock; with `--scenario readyz` it
//! renames in a foreign file that sorts first and measures until `/readyz` answers 503,
//! then removes it and measures until 200 again.
//! Prints `{"p50_ms", "p99_ms", "max_ms", "mean_ms", "n", "idle_rss_kib", ...}`. Needs no
//! root: everything happens in a temp dir and on a loopback port.

use crate::stats::Summary;
use anyhow::{bail, Context};
use clap::Args;
use interlock_protocol::confdir::{self, Runtime};
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
    /// subnet; readyz: a foreign file takes first place and goes away again.
    #[arg(long, default_value = "clobber", value_parser = ["clobber", "follow", "readyz"])]
    pub scenario: String,
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

fn has_interlock(dir: &Path) -> bool {
    confdir::load(dir, Runtime::Containerd, &[])
        .ok()
        .and_then(|e| e.chosen)
        .is_some_and(|c| c.list.plugin_types().contains(&"interlock-cni"))
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
    events: mpsc::Receiver<()>,
    count: u64,
    health: std::net::SocketAddr,
}

impl Session {
    /// Starts `exe agent` in `mode` (chain or owned) under `base`, installing `plugin`,
    /// and waits until interlock is in effect.
    pub fn start(exe: &Path, plugin: &Path, mode: &str, base: &Path) -> anyhow::Result<Session> {
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
        let health = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let child = Command::new(exe)
            .args([
                "agent",
                "--kube=none",
                "--config-mode",
                mode,
                "--conflict-threshold",
                "0",
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
            .stderr(Stdio::null())
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
                | inotify::WatchMask::CLOSE_WRITE
                | inotify::WatchMask::DELETE,
        )?;
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 8192];
            while ino.read_events_blocking(&mut buf).is_ok() {
                if tx.send(()).is_err() {
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
            count: 0,
            health,
        })
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
        while self.events.try_recv().is_ok() {}
        let name = if self.mode == "owned" {
            "00-interlock.conflist"
        } else {
            "10-primary.conflist"
        };
        let t0 = Instant::now();
        rename_in(&self.conf, name, body.as_bytes())?;
        loop {
            if has_interlock(&self.conf) {
                return Ok(t0.elapsed());
            }
            if t0.elapsed() > Duration::from_secs(5) {
                bail!("clobber {}: not repaired within 5 s", self.count);
            }
            let _ = self.events.recv_timeout(Duration::from_millis(20));
        }
    }
}

impl Session {
    /// The primary changes a parameter (its subnet), and the time until the effective
    /// config carries the new subnet with interlock in it.
    pub fn follow(&mut self) -> anyhow::Result<Duration> {
        self.count += 1;
        let subnet = format!("10.99.{}.0/24", self.count % 200);
        let body = PRIMARY.replace("10.99.250.0/24", &subnet);
        while self.events.try_recv().is_ok() {}
        let t0 = Instant::now();
        rename_in(&self.conf, "10-primary.conflist", body.as_bytes())?;
        loop {
            let followed = confdir::load(&self.conf, Runtime::Containerd, &[])
                .ok()
                .and_then(|e| e.chosen)
                .is_some_and(|c| {
                    c.list.plugin_types().contains(&"interlock-cni")
                        && c.list.plugins()[0]["ipam"]["subnet"] == subnet.as_str()
                });
            if followed {
                return Ok(t0.elapsed());
            }
            if t0.elapsed() > Duration::from_secs(5) {
                bail!("subnet change {}: not followed within 5 s", self.count);
            }
            let _ = self.events.recv_timeout(Duration::from_millis(20));
        }
    }

    fn wait_readyz(&self, want: u16, t0: Instant) -> anyhow::Result<Duration> {
        loop {
            if interlock_agent::health::readyz_status(self.health, Duration::from_secs(1))? == want
            {
                return Ok(t0.elapsed());
            }
            if t0.elapsed() > Duration::from_secs(5) {
                bail!("/readyz did not answer {want} within 5 s");
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// A foreign file that sorts ahead of anything interlock can name appears, and the
    /// time until `/readyz` says 503; then it goes away, and the time until 200 again.
    pub fn readyz_flip(&mut self) -> anyhow::Result<(Duration, Duration)> {
        let t0 = Instant::now();
        rename_in(&self.conf, "!first.conflist", PRIMARY.as_bytes())?;
        let down = self.wait_readyz(503, t0)?;
        let t1 = Instant::now();
        std::fs::remove_file(self.conf.join("!first.conflist"))?;
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
    let mut s = Session::start(&exe, &plugin, &a.mode, &base)?;
    std::thread::sleep(Duration::from_millis(1500));
    let idle_rss = s.rss_kib();
    let (mut samples, mut ups) = (Vec::with_capacity(a.clobbers), vec![]);
    for _ in 0..a.clobbers {
        match a.scenario.as_str() {
            "follow" => samples.push(s.follow()?),
            "readyz" => {
                let (down, up) = s.readyz_flip()?;
                samples.push(down);
                ups.push(up);
            }
            _ => samples.push(s.clobber()?),
        }
        std::thread::sleep(Duration::from_millis(a.interval_ms));
    }
    let mut out = summary(&samples);
    if a.scenario == "readyz" {
        // samples: until 503; ready_again: until 200 after the foreign file left.
        out["ready_again"] = summary(&ups);
    }
    out["scenario"] = a.scenario.clone().into();
    out["mode"] = a.mode.clone().into();
    out["idle_rss_kib"] = idle_rss.into();
    out["rss_after_kib"] = s.rss_kib().into();
    println!("{out}");
    Ok(())
}

//! `interlock bench-repair`: starts a real agent on throwaway directories, clobbers its
//! config again and again the way a primary CNI's installer would (write a temp file,
//! rename it over the file), and measures the time from each clobber until the runtime's
//! effective config (by `interlock_protocol::confdir::load`) carries interlock again.
//! Prints `{"p50_ms", "p99_ms", "max_ms", "mean_ms", "n", "idle_rss_kib", ...}`.

use anyhow::{bail, Context};
use clap::Args;
use interlock_protocol::confdir::{self, Runtime};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[derive(Debug, Args)]
pub struct BenchArgs {
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
    /// Where to create the throwaway directories (default: the system temp dir).
    #[arg(long)]
    pub dir: Option<PathBuf>,
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

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let idx = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[idx]
}

pub fn run(a: BenchArgs) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let plugin = a
        .plugin_source
        .unwrap_or_else(|| exe.with_file_name("interlock-cni"));
    let base = a.dir.unwrap_or_else(std::env::temp_dir);
    let root = base.join(format!("interlock-bench-{}", std::process::id()));
    let conf = root.join("net.d");
    let bin = root.join("bin");
    let state = root.join("state");
    for d in [&conf, &bin, &state] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let result = bench(
        &exe,
        &plugin,
        &conf,
        &bin,
        &state,
        a.clobbers,
        a.interval_ms,
        &a.mode,
    );
    let _ = std::fs::remove_dir_all(&root);
    let out = result?;
    println!("{out}");
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn bench(
    exe: &Path,
    plugin: &Path,
    conf: &Path,
    bin: &Path,
    state: &Path,
    n: usize,
    interval_ms: u64,
    mode: &str,
) -> anyhow::Result<serde_json::Value> {
    std::fs::write(conf.join("10-primary.conflist"), PRIMARY)?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
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
        .arg(conf)
        .arg("--cni-bin-dir")
        .arg(bin)
        .arg("--state-dir")
        .arg(state)
        .arg("--plugin-source")
        .arg(plugin)
        .arg("--health-addr")
        .arg(format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting the agent")?;
    let agent = Agent(child);
    let start = Instant::now();
    while !has_interlock(conf) {
        if start.elapsed() > Duration::from_secs(10) {
            bail!("the agent did not put interlock in effect within 10 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(1500));
    let idle_rss = rss_kib(agent.0.id());

    // Wake on every change in the conf dir instead of busy polling.
    let (tx, rx) = mpsc::channel();
    let mut ino = inotify::Inotify::init()?;
    ino.watches().add(
        conf,
        inotify::WatchMask::MOVED_TO | inotify::WatchMask::CLOSE_WRITE | inotify::WatchMask::DELETE,
    )?;
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 8192];
        while ino.read_events_blocking(&mut buf).is_ok() {
            if tx.send(()).is_err() {
                return;
            }
        }
    });

    let stripped_primary = PRIMARY.to_string();
    let owned_name = "00-interlock.conflist";
    let mut samples = Vec::with_capacity(n);
    for i in 0..n {
        // Vary the content so every clobber is a real change.
        let clobber = stripped_primary.replace("ilbench", &format!("ilbench{}", i % 2));
        while rx.try_recv().is_ok() {}
        let t0 = Instant::now();
        match mode {
            "owned" => rename_in(conf, owned_name, clobber.as_bytes())?,
            _ => rename_in(conf, "10-primary.conflist", clobber.as_bytes())?,
        }
        loop {
            if has_interlock(conf) {
                break;
            }
            if t0.elapsed() > Duration::from_secs(5) {
                bail!("clobber {i}: not repaired within 5 s");
            }
            let _ = rx.recv_timeout(Duration::from_millis(20));
        }
        samples.push(t0.elapsed().as_secs_f64() * 1000.0);
        std::thread::sleep(Duration::from_millis(interval_ms));
    }
    let busy_rss = rss_kib(agent.0.id());
    drop(agent);
    let mut sorted = samples.clone();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let mean = samples.iter().sum::<f64>() / samples.len().max(1) as f64;
    Ok(serde_json::json!({
        "n": samples.len(),
        "mode": mode,
        "p50_ms": percentile(&sorted, 0.50),
        "p90_ms": percentile(&sorted, 0.90),
        "p99_ms": percentile(&sorted, 0.99),
        "max_ms": sorted.last().copied().unwrap_or(0.0),
        "mean_ms": mean,
        "idle_rss_kib": idle_rss,
        "rss_after_kib": busy_rss,
    }))
}

//! Helpers for driving `interlock agent` as a process against throwaway directories.
#![allow(dead_code)]

use interlock_confdir::{self as confdir, Effective, Runtime};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub const CALICO: &str = r#"{
  "name": "k8s-pod-network",
  "cniVersion": "0.3.1",
  "zzForeign": {"keep": [3, 2, 1]},
  "plugins": [
    {"type": "bridge", "bridge": "ilcal0", "ipam": {"type": "host-local", "subnet": "10.99.0.0/24"}, "mtu": 1440},
    {"type": "portmap", "snat": true, "capabilities": {"portMappings": true}}
  ]
}
"#;

pub fn interlock() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_interlock"))
}

fn answers_version(p: &Path) -> bool {
    Command::new(p)
        .env("CNI_COMMAND", "VERSION")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|o| {
            o.status.success()
                && serde_json::from_slice::<serde_json::Value>(&o.stdout)
                    .is_ok_and(|v| v.get("supportedVersions").is_some())
        })
}

/// The real interlock-cni built next to `interlock` (`cargo build -p interlock-cni`), when
/// it answers VERSION.
pub fn real_plugin() -> Option<PathBuf> {
    let p = interlock().with_file_name("interlock-cni");
    answers_version(&p).then_some(p)
}

/// The plugin to install: the real one when built, else a shell stand-in that only
/// answers VERSION (enough for the config guard; STATUS tests need the real one).
pub fn plugin() -> PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        if let Some(p) = real_plugin() {
            return p;
        }
        eprintln!(
            "NOTE: {} missing or not answering VERSION; using a shell stand-in plugin \
             (run `cargo build -p interlock-cni` to test with the real one)",
            interlock().with_file_name("interlock-cni").display()
        );
        let dir = std::env::temp_dir().join(format!("interlock-standin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("interlock-cni");
        let script = "#!/bin/sh\ncase \"$CNI_COMMAND\" in\nVERSION) echo '{\"cniVersion\":\"1.0.0\",\"supportedVersions\":[\"0.3.0\",\"0.3.1\",\"0.4.0\",\"1.0.0\",\"1.1.0\"]}';;\n*) echo '{\"code\":50,\"msg\":\"stand-in\"}'; exit 1;;\nesac\n";
        let tmp = dir.join(".standin.tmp");
        std::fs::write(&tmp, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&tmp, &p).unwrap();
        p
    })
    .clone()
}

/// Throwaway conf, bin and state dirs.
pub struct Dirs {
    pub tmp: tempfile::TempDir,
    pub conf: PathBuf,
    pub bin: PathBuf,
    pub state: PathBuf,
}

impl Dirs {
    pub fn new() -> Dirs {
        let tmp = tempfile::tempdir().unwrap();
        let conf = tmp.path().join("net.d");
        let bin = tmp.path().join("bin");
        let state = tmp.path().join("state");
        for d in [&conf, &bin, &state] {
            std::fs::create_dir_all(d).unwrap();
        }
        // The runtime these tests stand for reads `conf` (the host's own containerd, if
        // any, reads another directory).
        std::fs::write(
            tmp.path().join("containerd.toml"),
            format!(
                "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".cni]\n  conf_dir = \"{}\"\n",
                conf.display()
            ),
        )
        .unwrap();
        // The primary's plugins, so VERSION answers are real.
        for p in ["bridge", "portmap", "host-local"] {
            let src = interlock_testkit::cni_plugins_dir().join(p);
            if src.exists() {
                std::os::unix::fs::symlink(src, bin.join(p)).unwrap();
            }
        }
        Dirs {
            tmp,
            conf,
            bin,
            state,
        }
    }

    /// `interlock <sub>` pointed at these conf, bin and state dirs.
    pub fn interlock(&self, sub: &str) -> Command {
        let mut cmd = Command::new(interlock());
        cmd.env(
            "INTERLOCK_RUNTIME_CONFIG",
            self.tmp.path().join("containerd.toml"),
        )
        .arg(sub)
        .arg("--cni-conf-dir")
        .arg(&self.conf)
        .arg("--cni-bin-dir")
        .arg(&self.bin)
        .arg("--state-dir")
        .arg(&self.state);
        cmd
    }

    /// Runs `interlock uninstall` on these dirs and asserts it succeeded.
    pub fn uninstall(&self) -> std::process::Output {
        let out = self.interlock("uninstall").output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    pub fn write(&self, name: &str, data: &str) {
        std::fs::write(self.conf.join(name), data).unwrap();
    }

    /// Writes like aws-node: temp name, then rename in.
    pub fn rename_in(&self, name: &str, data: &str) {
        let tmp = self.conf.join(format!(".{name}.adversary.tmp"));
        std::fs::write(&tmp, data).unwrap();
        std::fs::rename(&tmp, self.conf.join(name)).unwrap();
    }

    pub fn read(&self, name: &str) -> Option<Vec<u8>> {
        std::fs::read(self.conf.join(name)).ok()
    }

    pub fn json(&self, name: &str) -> serde_json::Value {
        serde_json::from_slice(&self.read(name).unwrap_or_else(|| panic!("{name} missing")))
            .unwrap()
    }

    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.conf)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    pub fn effective(&self) -> Effective {
        confdir::load(
            &self.conf,
            Runtime::Containerd,
            std::slice::from_ref(&self.bin),
        )
        .unwrap()
    }

    /// The effective file's name, when it carries the entry this agent writes.
    pub fn effective_with_us(&self) -> Option<String> {
        let e = self.effective();
        let c = e.chosen?;
        let want = serde_json::Value::Object(interlock_agent::plugin_entry(&self.state));
        c.list
            .plugins()
            .contains(&want)
            .then(|| c.path.file_name().unwrap().to_string_lossy().into_owned())
    }

    pub fn agent(&self, extra: &[&str]) -> Agent {
        Agent::start(self, extra)
    }
}

pub struct Agent {
    pub child: Child,
    pub port: u16,
    pub log: PathBuf,
}

impl Agent {
    pub fn start(d: &Dirs, extra: &[&str]) -> Agent {
        Agent::start_env(d, extra, &[])
    }

    /// Starts the agent with `env` added; `--kube=none` unless `extra` sets `--kube`.
    pub fn start_env(d: &Dirs, extra: &[&str], env: &[(&str, &str)]) -> Agent {
        let kube_given = extra.iter().any(|a| a.starts_with("--kube"));
        // No runtime on a test machine unless the test brings one (the containerd kit):
        // an agent auditing a missing runtime is rightly not ready.
        let cri_given = extra.iter().any(|a| a.starts_with("--cri-endpoint"))
            || env.iter().any(|(k, _)| *k == "INTERLOCK_CRI_ENDPOINT");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = d.tmp.path().join(format!("agent-{port}.log"));
        let child = d
            .interlock("agent")
            .args((!kube_given).then_some("--kube=none"))
            .args((!cri_given).then_some("--cri-endpoint=none"))
            .envs(env.iter().copied())
            .arg("--plugin-source")
            .arg(plugin())
            .arg("--health-addr")
            .arg(format!("127.0.0.1:{port}"))
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let a = Agent { child, port, log };
        wait_until(
            Duration::from_secs(10),
            || a.get("/healthz").is_some(),
            || format!("agent did not serve /healthz; log:\n{}", a.log_text()),
        );
        a
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// GET `path`: (status, body), or None when not reachable.
    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
        interlock_testkit::http::get(addr, path, Duration::from_secs(2))
    }

    pub fn ready(&self) -> Option<bool> {
        self.get("/readyz").map(|(c, _)| c == 200)
    }

    pub fn metric(&self, name: &str) -> Option<f64> {
        let (_, body) = self.get("/metrics")?;
        body.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))?
            .rsplit(' ')
            .next()?
            .parse()
            .ok()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn terminate(mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let start = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "agent ignored SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool, msg: impl FnOnce() -> String) {
    let start = Instant::now();
    while !cond() {
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?}: {}", msg());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Waits until the agent reports ready and the effective config carries our entry.
pub fn wait_protected(d: &Dirs, a: &Agent) -> String {
    wait_until(
        Duration::from_secs(60),
        || d.effective_with_us().is_some() && a.ready() == Some(true),
        || {
            format!(
                "not protected: {:?}\n{}\nlog:\n{}",
                d.names(),
                d.effective().summary,
                a.log_text()
            )
        },
    );
    d.effective_with_us().unwrap()
}

pub fn plugin_types(v: &serde_json::Value) -> Vec<String> {
    v["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["type"].as_str().unwrap().to_string())
        .collect()
}

/// The config list with our entry removed (what a foreign writer would produce).
pub fn without_us(v: &serde_json::Value) -> serde_json::Value {
    let mut v = v.clone();
    v["plugins"]
        .as_array_mut()
        .unwrap()
        .retain(|p| p["type"] != "interlock-cni");
    v
}

/// Makes a FIFO at `p` (the mkfifo tool: no extra dependency for the tests).
pub fn mkfifo(p: &Path) {
    let st = Command::new("mkfifo").arg(p).status().unwrap();
    assert!(st.success(), "mkfifo {}", p.display());
}

/// In `netns`: `nft` with `args`, which must succeed.
pub fn nft_in(netns: &Path, args: &[&str]) {
    let o = Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .arg("nft")
        .args(args)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "nft {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

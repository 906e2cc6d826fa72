//! Installer stand-ins: each mesh's `install-cni` container as it treats the conf dir
//! (`research/guard-mode.md` §A.1.2, §A.2.2, §A.3.2, §A.4.2): which file it targets, where it
//! puts its entry, how it writes, and what it removes when it stops.
//!
//! [`Installer`] is the file behaviour, one [`Installer::step`] per look at the directory,
//! so tests can drive it by hand; [`run`] is the process (`mesh-standin install …`): it
//! steps every 100 ms (istio-cni, linkerd-cni and consul-cni react to fsnotify events
//! within milliseconds; a short poll stands in for the watch) or every second (kuma-cni's
//! `CFGCHECK_INTERVAL`), and cleans up on SIGTERM or SIGINT as each installer does.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use interlock_contract::guard::GuardedMesh;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::files::{self, appended, has_type, is_list_path, valid, without, wrap};

/// Where an installer works and what it installs.
#[derive(Debug, Clone)]
pub struct InstallOptions {
    /// The mesh whose installer this is.
    pub mesh: GuardedMesh,
    /// The CNI conf dir.
    pub conf_dir: PathBuf,
    /// The CNI bin dir.
    pub bin_dir: PathBuf,
    /// The plugin binary to copy in as `<type>` (the stand-in itself).
    pub source: PathBuf,
    /// The API server the plugin's kubeconfig names, and its token.
    pub server: String,
    /// The token the kubeconfig carries.
    pub token: String,
    /// istio-cni's `cni_agent_run_dir` (its kubeconfig lives there).
    pub run_dir: PathBuf,
    /// kuma-cni's `cni.confName`: the one file it chains into.
    pub conf_name: String,
}

/// What a look at the directory found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing to report (the entry is in place, or the installer waits for a file).
    Ok,
    /// kuma-cni's check failed (named file gone, not a list, or without `kuma-cni`): the
    /// installer cleans up and exits 5.
    Lost(String),
}

#[derive(Debug)]
enum State {
    /// The target chosen at the first look that found a valid file; sticky.
    Istio { target: Option<PathBuf> },
    /// The hash of each file as last seen or written.
    Linkerd { seen: BTreeMap<PathBuf, String> },
    /// The per-start kubeconfig id, and the file chosen first (the only one cleaned up).
    Consul {
        id: u128,
        start_file: Option<PathBuf>,
    },
    /// The file the entry went into, once it did.
    Kuma { installed: Option<PathBuf> },
}

/// One installer's file behaviour; see the module docs.
#[derive(Debug)]
pub struct Installer {
    opts: InstallOptions,
    state: State,
}

/// The kuma-cni exit code after a failed check (`app/cni/pkg/install/main.go`).
pub const KUMA_LOST_EXIT: i32 = 5;

impl Installer {
    /// Copies the binary and writes the plugin's kubeconfig, as each installer does before
    /// it touches a config.
    pub fn start(opts: InstallOptions) -> io::Result<Installer> {
        let state = match opts.mesh {
            GuardedMesh::Istio => State::Istio { target: None },
            GuardedMesh::Linkerd => State::Linkerd {
                seen: BTreeMap::new(),
            },
            GuardedMesh::Consul => State::Consul {
                id: SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or_default(),
                start_file: None,
            },
            GuardedMesh::Kuma => State::Kuma { installed: None },
        };
        let me = Installer { opts, state };
        files::install_binary(
            &me.opts.source,
            &me.opts.bin_dir,
            me.opts.mesh.plugin_type(),
        )?;
        let kc = me.kubeconfig_path();
        if let Some(dir) = kc.parent() {
            fs::create_dir_all(dir)?;
        }
        let context = match me.opts.mesh {
            GuardedMesh::Linkerd => "linkerd-cni-context",
            m => m.plugin_type(),
        };
        fs::write(
            &kc,
            files::kubeconfig(&me.opts.server, &me.opts.token, context),
        )?;
        Ok(me)
    }

    fn t(&self) -> &'static str {
        self.opts.mesh.plugin_type()
    }

    /// Where this installer writes the plugin's kubeconfig (A.5 "what ADD needs").
    pub fn kubeconfig_path(&self) -> PathBuf {
        match (&self.opts.mesh, &self.state) {
            (GuardedMesh::Istio, _) => self.opts.run_dir.join("istio-cni-kubeconfig"),
            (GuardedMesh::Consul, State::Consul { id, .. }) => self
                .opts
                .conf_dir
                .join(format!("ZZZ-consul-cni-kubeconfig-{id}")),
            (m, _) => self
                .opts
                .conf_dir
                .join(format!("ZZZ-{}-kubeconfig", m.plugin_type())),
        }
    }

    /// The plugin entry this installer writes (A.x.1).
    pub fn entry(&self) -> Value {
        let o = &self.opts;
        match o.mesh {
            GuardedMesh::Istio => json!({
                "type": "istio-cni", "name": "istio-cni",
                "plugin_log_level": "info",
                "cni_agent_run_dir": o.run_dir,
                "ambient_enabled": false,
                "enablement_selectors": [],
                "exclude_namespaces": ["kube-system"],
                "pod_namespace": "istio-system",
                "native_nftables": false,
                "enable_ambient_detection_retry": false,
            }),
            GuardedMesh::Linkerd => json!({
                "name": "linkerd-cni", "type": "linkerd-cni",
                "log_level": "info",
                "kubernetes": {"kubeconfig": self.kubeconfig_path()},
                "linkerd": {
                    "incoming-proxy-port": 4143,
                    "outgoing-proxy-port": 4140,
                    "proxy-uid": 2102,
                    "inbound-ports-to-ignore": ["4191", "4190"],
                    "simulate": false,
                    "use-wait-flag": false,
                    "iptables-mode": "nft",
                    "ipv6": false,
                },
            }),
            GuardedMesh::Consul => json!({
                "cni_bin_dir": o.bin_dir,
                "cni_net_dir": o.conf_dir,
                "kubeconfig": self.kubeconfig_path().file_name().map(|n| n.to_string_lossy().into_owned()),
                "cni_token_path": "/var/run/secrets/kubernetes.io/serviceaccount/token",
                "cni_host_token_path": o.conf_dir.join("consul-cni-token"),
                "autorotate_token": false,
                "log_level": "info",
                "multus": false,
                "name": "consul-cni",
                "type": "consul-cni",
            }),
            GuardedMesh::Kuma => json!({
                "cniVersion": "0.3.1",
                "name": "kuma-cni", "type": "kuma-cni",
                "log_level": "info",
                "kubernetes": {
                    "kubeconfig": self.kubeconfig_path(),
                    "cni_bin_dir": o.bin_dir,
                    "exclude_namespaces": ["kube-system"],
                },
            }),
        }
    }

    /// One look at the directory, and the writes the installer makes after it.
    pub fn step(&mut self) -> io::Result<Step> {
        match self.opts.mesh {
            GuardedMesh::Istio => self.step_istio().map(|()| Step::Ok),
            GuardedMesh::Linkerd => self.step_linkerd().map(|()| Step::Ok),
            GuardedMesh::Consul => self.step_consul().map(|()| Step::Ok),
            GuardedMesh::Kuma => self.step_kuma(),
        }
    }

    /// istio-cni: the first valid file at the first look is the target for good; the entry
    /// (without its own `cniVersion`) is appended after removing any old one; atomic
    /// writes; a `.conf` gets the list written into it and is renamed `.conflist`.
    fn step_istio(&mut self) -> io::Result<()> {
        let entry = self.entry();
        let State::Istio { target } = &mut self.state else {
            unreachable!("istio state")
        };
        if target.is_none() {
            *target = files::first_valid(&self.opts.conf_dir);
        }
        let Some(p) = target.clone() else {
            return Ok(());
        };
        // A deleted target is waited for, not replaced.
        let Some(v) = valid(&p) else { return Ok(()) };
        if is_list_path(&p) {
            if !files::types(&v).iter().any(|t| t == "istio-cni") {
                files::write_atomic(&p, &appended(&v, &entry))?;
            }
        } else {
            let list = appended(&wrap(&v, "0.3.1"), &entry);
            files::write_atomic(&p, &list)?;
            let to = p.with_extension("conflist");
            fs::rename(&p, &to)?;
            *target = Some(to);
        }
        Ok(())
    }

    /// linkerd-cni: every `.conf`/`.conflist` whose content differs from what it last saw
    /// or wrote gets the entry (remove, append), through `<name>.install` and a rename; a
    /// `.conf` becomes `<name>.conflist` and the `.conf` is deleted.
    fn step_linkerd(&mut self) -> io::Result<()> {
        let entry = self.entry();
        let State::Linkerd { seen } = &mut self.state else {
            unreachable!("linkerd state")
        };
        for p in files::config_files(&self.opts.conf_dir) {
            if p.extension().and_then(|e| e.to_str()) == Some("json") {
                continue;
            }
            let Ok(bytes) = fs::read(&p) else { continue };
            let h = hex::encode(Sha256::digest(&bytes));
            if seen.get(&p) == Some(&h) {
                continue;
            }
            let Ok(v) = serde_json::from_slice::<Value>(&bytes) else {
                continue;
            };
            let (dst, list) = if is_list_path(&p) {
                (p.clone(), appended(&v, &entry))
            } else {
                (
                    p.with_extension("conflist"),
                    appended(&wrap(&v, "0.3.1"), &entry),
                )
            };
            files::write_install_rename(&dst, &list)?;
            if dst != p {
                fs::remove_file(&p)?;
                seen.remove(&p);
            }
            let written = hex::encode(Sha256::digest(fs::read(&dst)?));
            seen.insert(dst, written);
        }
        Ok(())
    }

    /// consul-cni: the first valid file at every look; the entry must be there, last and
    /// equal to the installer's own, or it is removed and appended; written in place; a
    /// `.conf` gets a `<name>.conflist` beside it, and the `.conf` stays.
    fn step_consul(&mut self) -> io::Result<()> {
        let entry = self.entry();
        let Some(first) = files::first_valid(&self.opts.conf_dir) else {
            return Ok(());
        };
        let State::Consul { start_file, .. } = &mut self.state else {
            unreachable!("consul state")
        };
        if start_file.is_none() {
            *start_file = Some(first.clone());
        }
        let v = valid(&first).expect("first_valid parsed it");
        if is_list_path(&first) {
            let ok = v
                .get("plugins")
                .and_then(Value::as_array)
                .and_then(|a| a.last())
                == Some(&entry);
            if !ok {
                files::write_in_place(&first, &appended(&v, &entry))?;
            }
        } else {
            let list = first.with_extension("conflist");
            files::write_in_place(&list, &wrap(&v, "0.3.1"))?;
            let l = valid(&list).unwrap_or_else(|| wrap(&v, "0.3.1"));
            files::write_in_place(&list, &appended(&l, &entry))?;
        }
        Ok(())
    }

    /// The file kuma-cni chains into: the named file, or `<name>list` when the `.conf` is
    /// gone and the list exists.
    fn kuma_file(&self) -> Option<PathBuf> {
        let p = self.opts.conf_dir.join(&self.opts.conf_name);
        if p.exists() {
            return Some(p);
        }
        let l = self
            .opts
            .conf_dir
            .join(format!("{}list", self.opts.conf_name));
        (self.opts.conf_name.ends_with(".conf") && l.exists()).then_some(l)
    }

    /// kuma-cni: wait for the named file, append the entry (a `.conf` gets the list written
    /// into its own path), atomically; afterwards every look checks the file is there, is a
    /// list and carries `kuma-cni`, and reports [`Step::Lost`] otherwise.
    fn step_kuma(&mut self) -> io::Result<Step> {
        let entry = self.entry();
        let file = self.kuma_file();
        let State::Kuma { installed } = &self.state else {
            unreachable!("kuma state")
        };
        match installed {
            None => {
                let Some(p) = file else { return Ok(Step::Ok) };
                let Ok(v) = serde_json::from_slice::<Value>(&fs::read(&p)?) else {
                    return Ok(Step::Ok);
                };
                let list = if v.get("plugins").is_some() {
                    appended(&v, &entry)
                } else {
                    appended(&wrap(&v, "0.3.0"), &entry)
                };
                files::write_atomic(&p, &list)?;
                self.state = State::Kuma { installed: Some(p) };
                Ok(Step::Ok)
            }
            Some(_) => {
                let Some(p) = file else {
                    return Ok(Step::Lost(format!(
                        "{} is gone",
                        self.opts.conf_dir.join(&self.opts.conf_name).display()
                    )));
                };
                let v = fs::read(&p)
                    .ok()
                    .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
                match v {
                    Some(v) if files::types(&v).iter().any(|t| t == "kuma-cni") => Ok(Step::Ok),
                    Some(_) => Ok(Step::Lost(format!("kuma-cni missing from {}", p.display()))),
                    None => Ok(Step::Lost(format!("{} is not a valid list", p.display()))),
                }
            }
        }
    }

    /// What each installer removes when it stops (A.x.2 "shutdown"): its entry (istio-cni
    /// from its target, linkerd-cni from every list, consul-cni from the file it chose
    /// first, kuma-cni from the named file), its binary and its kubeconfig.
    pub fn cleanup(&mut self) -> io::Result<()> {
        let t = self.t();
        let revert = |p: &Path, in_place: bool| -> io::Result<()> {
            if let Some(v) = valid(p).or_else(|| {
                fs::read(p)
                    .ok()
                    .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            }) {
                if files::types(&v).iter().any(|x| x == t) {
                    if in_place {
                        files::write_in_place(p, &without(&v, t))?;
                    } else {
                        files::write_atomic(p, &without(&v, t))?;
                    }
                }
            }
            Ok(())
        };
        match &self.state {
            State::Istio { target } => {
                if let Some(p) = target {
                    revert(p, false)?;
                }
            }
            State::Linkerd { .. } => {
                for p in files::config_files(&self.opts.conf_dir) {
                    if is_list_path(&p) && has_type(&p, t) {
                        revert(&p, true)?;
                    }
                }
            }
            State::Consul { start_file, .. } => {
                if let Some(p) = start_file {
                    revert(p, true)?;
                }
            }
            State::Kuma { installed } => {
                if let Some(p) = installed {
                    revert(p, false)?;
                }
            }
        }
        let _ = fs::remove_file(self.opts.bin_dir.join(t));
        let _ = fs::remove_file(self.kubeconfig_path());
        Ok(())
    }
}

/// The installer process: steps until SIGTERM/SIGINT (then cleans up, exit 0) or, for
/// kuma-cni, until its check fails (cleans up, exit [`KUMA_LOST_EXIT`]).
pub fn run(opts: InstallOptions) -> i32 {
    use nix::sys::signal::{SigSet, Signal};
    use nix::sys::signalfd::{SfdFlags, SignalFd};
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGTERM);
    mask.add(Signal::SIGINT);
    if let Err(e) = mask.thread_block() {
        eprintln!("install: block signals: {e}");
        return 1;
    }
    let sfd = match SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("install: signalfd: {e}");
            return 1;
        }
    };
    let mesh = opts.mesh;
    let mut inst = match Installer::start(opts) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("install {mesh}: {e}");
            return 1;
        }
    };
    let period = if mesh == GuardedMesh::Kuma {
        Duration::from_secs(1)
    } else {
        Duration::from_millis(100)
    };
    loop {
        match inst.step() {
            Ok(Step::Ok) => {}
            Ok(Step::Lost(why)) => {
                eprintln!("install {mesh}: check failed: {why}; cleaning up");
                let _ = inst.cleanup();
                return KUMA_LOST_EXIT;
            }
            Err(e) => eprintln!("install {mesh}: {e}"),
        }
        let until = std::time::Instant::now() + period;
        while std::time::Instant::now() < until {
            if let Ok(Some(_)) = sfd.read_signal() {
                if let Err(e) = inst.cleanup() {
                    eprintln!("install {mesh}: cleanup: {e}");
                    return 1;
                }
                return 0;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The command line of `mesh-standin install` for `opts`.
pub fn args(opts: &InstallOptions) -> Vec<String> {
    vec![
        "install".into(),
        opts.mesh.as_str().into(),
        "--conf-dir".into(),
        opts.conf_dir.display().to_string(),
        "--bin-dir".into(),
        opts.bin_dir.display().to_string(),
        "--server".into(),
        opts.server.clone(),
        "--token".into(),
        opts.token.clone(),
        "--run-dir".into(),
        opts.run_dir.display().to_string(),
        "--conf-name".into(),
        opts.conf_name.clone(),
    ]
}

/// Parses what [`args`] wrote (after `install`); `source` is the running binary.
pub fn parse(argv: &[String], source: PathBuf) -> Result<InstallOptions, String> {
    let mesh: GuardedMesh = argv
        .first()
        .ok_or("install: which mesh?")?
        .parse()
        .map_err(|e| format!("install: {e}"))?;
    let mut o = InstallOptions {
        mesh,
        conf_dir: "/etc/cni/net.d".into(),
        bin_dir: "/opt/cni/bin".into(),
        source,
        server: String::new(),
        token: String::new(),
        run_dir: "/var/run/istio-cni".into(),
        conf_name: "10-calico.conflist".into(),
    };
    let mut it = argv[1..].iter();
    while let Some(flag) = it.next() {
        let v = it
            .next()
            .ok_or_else(|| format!("install: {flag} needs a value"))?
            .clone();
        match flag.as_str() {
            "--conf-dir" => o.conf_dir = v.into(),
            "--bin-dir" => o.bin_dir = v.into(),
            "--server" => o.server = v,
            "--token" => o.token = v,
            "--run-dir" => o.run_dir = v.into(),
            "--conf-name" => o.conf_name = v,
            other => return Err(format!("install: unknown flag {other}")),
        }
    }
    Ok(o)
}

/// Starts the installer process from the stand-in binary `exe`: kuma-cni's with `argv[0]`
/// `/install-cni` (its plugin looks for exactly one such process). Output goes to `log`.
pub fn spawn(exe: &Path, opts: &InstallOptions, log: &Path) -> io::Result<Child> {
    use std::os::unix::process::CommandExt;
    let out = fs::File::create(log)?;
    let mut cmd = Command::new(exe);
    if opts.mesh == GuardedMesh::Kuma {
        cmd.arg0("/install-cni");
    }
    cmd.args(args(opts))
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    cmd.spawn()
}

/// Sends SIGTERM to an installer and waits (up to `grace`, then SIGKILL) for it.
pub fn terminate(child: &mut Child, grace: Duration) -> Option<std::process::ExitStatus> {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
    let until = std::time::Instant::now() + grace;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        if std::time::Instant::now() > until {
            let _ = child.kill();
            return child.wait().ok();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

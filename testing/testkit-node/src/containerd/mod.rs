//! A private containerd for end-to-end tests, driven over CRI.
//!
//! [`Containerd::start`] builds (once, cached) the pause image, lays out a directory of
//! its own (root, state, socket, config, CNI conf and bin dirs, host-local's data dir,
//! runc's root) under `/dev/shm/interlock-containerd/<name>/` (`$TMPDIR` when /dev/shm
//! is not an exec-able tmpfs; `$INTERLOCK_KIT_DIR` overrides), starts `containerd` on it as a
//! child process, waits until CRI answers and imports the image. The test fills the CNI
//! bin dir ([`Containerd::install_primary_plugins`]) and writes the primary's config
//! ([`Containerd::write_primary_config`]: `bridge` + `host-local` + `portmap` on a
//! bridge and a /24 of this kit's own), then talks CRI through [`Containerd::cri`].
//!
//! Dropping the kit tears everything down, also after a failed assertion or a panic:
//! every sandbox is stopped and removed over CRI (NOTREADY ones too; this runs the CNI
//! DELs and frees the IPs; a daemon that died mid-test is first restarted on the same
//! directory for it), the daemon is stopped, runc containers left in its runc root
//! are deleted, shims whose `-address` is this socket are killed, the netns it made are
//! unmounted and deleted, every mount under its directory is unmounted, its bridge, its
//! libcni result-cache entries and its directory are removed. What could not be undone
//! is printed (and returned by [`Containerd::teardown`]).
//!
//! ## What a crashed test process leaves, and who cleans it
//! The daemon runs under `setpriv --pdeathsig KILL`, from a thread that lives as long as
//! the kit, so it dies with the process. A process killed outright (SIGKILL, a timeout,
//! `panic = abort`) does not run the teardown and leaves: the shims and pause processes
//! of its sandboxes, their `cni-*` namespaces (mounted under the kit's state dir), overlay
//! and shm mounts under the kit directory, the bridge, libcni's cached results in
//! `/var/lib/cni/results` (`<network>-<id>-eth0`, `cni-loopback-<id>-lo`) and the kit
//! directory. Each kit holds an exclusive `flock` on `<dir>/kit.lock` for its lifetime;
//! the next [`Containerd::start`] in any process takes the lock of every kit directory
//! whose owner is gone, restarts a daemon on that directory so the normal CRI sweep can
//! stop and remove the sandboxes (netns, IPAM and CNI cache included), and then runs the
//! same teardown. When no daemon can be restarted there, the sandboxes' runc containers
//! are force-deleted, their netns found by inode and their cache entries by ID. Only a
//! kit whose directory was deleted by hand is beyond reach (its shims and netns then
//! need `kill` and `ip netns del` by hand); on /dev/shm a reboot clears everything
//! anyway. Always left, by design: the empty parent cgroup `k8s.io` that runc creates
//! for sandbox cgroups (`/k8s.io/<id>`), shared with any containerd on the host.
//!
//! Two test processes never collide: names (kit, bridge, CNI network) come from
//! [`interlock_testkit::unique`], and subnets (`10.97.<n>.0/24`) are handed out under a lock in the
//! parent directory, skipping any a live kit or the host's routes already use.

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use interlock_cri::{CriClient, SandboxConfig, Timeouts};
use nix::fcntl::Flock;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

mod image;
mod teardown;

pub use image::{pause_image, write_oci_archive, PAUSE_IMAGE};
pub use teardown::Footprint;

/// The CRI plugin's containerd namespace.
pub const K8S_NAMESPACE: &str = "k8s.io";
/// The file name the primary's config is written under (it sorts where Calico's does).
pub const PRIMARY_CONFLIST: &str = "10-calico.conflist";
/// The reference plugins the primary config needs (`loopback`: containerd sets up `lo`
/// in every sandbox with it).
pub const PRIMARY_PLUGINS: &[&str] = &["bridge", "host-local", "portmap", "loopback"];

const READY_TIMEOUT: Duration = Duration::from_secs(15);

/// Everything the kit owns, written to `<dir>/kit.json` so that a later process can tear
/// down a kit whose owner crashed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Layout {
    /// The kit's name (also its CNI network's name).
    pub name: String,
    /// The kit's directory; everything of the daemon lives under it.
    pub dir: PathBuf,
    /// The bridge the primary config uses.
    pub bridge: String,
    /// The third octet `n` of the kit's subnet `10.97.n.0/24`.
    pub subnet_octet: u8,
}

impl Layout {
    pub fn root(&self) -> PathBuf {
        self.dir.join("root")
    }
    pub fn state(&self) -> PathBuf {
        self.dir.join("state")
    }
    pub fn socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }
    pub fn config(&self) -> PathBuf {
        self.dir.join("config.toml")
    }
    pub fn conf_dir(&self) -> PathBuf {
        self.dir.join("net.d")
    }
    pub fn bin_dir(&self) -> PathBuf {
        self.dir.join("bin")
    }
    pub fn ipam_dir(&self) -> PathBuf {
        self.dir.join("ipam")
    }
    pub fn runc_root(&self) -> PathBuf {
        self.dir.join("runc")
    }
    pub fn log(&self) -> PathBuf {
        self.dir.join("containerd.log")
    }
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket().display())
    }
    pub fn subnet(&self) -> String {
        format!("10.97.{}.0/24", self.subnet_octet)
    }

    fn config_toml(&self) -> String {
        let cri = "plugins.\"io.containerd.grpc.v1.cri\"";
        format!(
            r#"version = 2
root = "{root}"
state = "{state}"
# Plugins that would write outside the kit directory or probe for absent backends.
disabled_plugins = [
  "io.containerd.internal.v1.opt",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
]

[grpc]
  address = "{socket}"

[{cri}]
  sandbox_image = "{image}"
  # Without CAP_SYS_RESOURCE runc fails "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  # The sandboxes' netns under the kit's state dir, not /var/run/netns shared with the
  # host and other kits: a netns whose sandbox was never recorded (the daemon killed
  # mid-creation) is then still known to be this kit's, and goes with it.
  netns_mounts_under_state_dir = true
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        # runc's state in the kit, not /run/containerd/runc shared with the host.
        Root = "{runc_root}"
  [{cri}.cni]
    bin_dir = "{bin}"
    conf_dir = "{conf}"
    max_conf_num = 1
"#,
            root = self.root().display(),
            state = self.state().display(),
            socket = self.socket().display(),
            image = PAUSE_IMAGE,
            runc_root = self.runc_root().display(),
            bin = self.bin_dir().display(),
            conf = self.conf_dir().display(),
        )
    }
}

/// The parent of every kit directory (shared by all test processes):
/// `$INTERLOCK_KIT_DIR` if set, else `/dev/shm/interlock-containerd` when `/dev/shm` is a
/// tmpfs that allows exec (containerd fsyncs its content store and metadata: on tmpfs a
/// kit starts in ~80 ms and is removed in ~30 ms instead of ~300 and ~120 on ext4 here),
/// else `$TMPDIR/interlock-containerd`.
pub(crate) fn kits_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("INTERLOCK_KIT_DIR") {
        return PathBuf::from(dir);
    }
    let shm = Path::new("/dev/shm");
    let usable = nix::sys::statfs::statfs(shm)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
        && nix::sys::statvfs::statvfs(shm)
            .is_ok_and(|s| !s.flags().contains(nix::sys::statvfs::FsFlags::ST_NOEXEC));
    if usable {
        shm.join("interlock-containerd")
    } else {
        std::env::temp_dir().join("interlock-containerd")
    }
}

/// A running private containerd; torn down on drop.
#[derive(Debug)]
pub struct Containerd {
    layout: Layout,
    // A lock so that a test may restart the daemon while other threads use the kit.
    daemon: std::sync::Mutex<Option<Daemon>>,
    lock: Option<Flock<File>>,
    started_in: Duration,
    torn_down: bool,
}

impl Containerd {
    /// Starts a private containerd and imports the pause image; blocks until CRI answers.
    ///
    /// Cleans up first what crashed test processes left (see the module docs). Callable
    /// from inside or outside a tokio runtime.
    pub fn start() -> io::Result<Containerd> {
        let image = pause_image()?;
        let begin = Instant::now();
        let (layout, lock) = teardown::claim_new_kit()?;
        let mut kit = Containerd {
            layout,
            daemon: std::sync::Mutex::new(None),
            lock: Some(lock),
            started_in: Duration::ZERO,
            torn_down: false,
        };
        // From here on a failure tears the kit down through Drop.
        for dir in [
            kit.layout.root(),
            kit.layout.state(),
            kit.layout.conf_dir(),
            kit.layout.bin_dir(),
            kit.layout.ipam_dir(),
            kit.layout.runc_root(),
        ] {
            fs::create_dir_all(&dir)?;
        }
        fs::write(kit.layout.config(), kit.layout.config_toml())?;
        *kit.daemon() = Some(Daemon::spawn(&kit.layout)?);
        kit.wait_ready()?;
        kit.started_in = begin.elapsed();
        kit.import_image(&image)?;
        Ok(kit)
    }

    fn daemon(&self) -> std::sync::MutexGuard<'_, Option<Daemon>> {
        self.daemon.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait_ready(&self) -> io::Result<()> {
        let mut daemon = self.daemon();
        let daemon = daemon.as_mut().expect("spawned");
        wait_ready(&self.layout, daemon, READY_TIMEOUT)
    }

    fn import_image(&self, image: &Path) -> io::Result<()> {
        let out = Command::new("ctr")
            .arg("--address")
            .arg(self.layout.socket())
            .args(["-n", K8S_NAMESPACE, "images", "import"])
            .arg(image)
            .output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "ctr images import {}: {}",
                image.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }

    /// The CRI endpoint, `unix://<dir>/containerd.sock`.
    pub fn endpoint(&self) -> String {
        self.layout.endpoint()
    }

    /// The daemon's socket.
    pub fn socket(&self) -> PathBuf {
        self.layout.socket()
    }

    /// A CRI client on the caller's runtime, connected to this daemon.
    pub async fn cri(&self) -> CriClient {
        CriClient::connect(&self.endpoint())
            .await
            .unwrap_or_else(|e| panic!("{e}\ncontainerd log:\n{}", self.log_tail()))
    }

    /// The kit's directory.
    pub fn dir(&self) -> &Path {
        &self.layout.dir
    }

    /// containerd's `root`.
    pub fn root(&self) -> PathBuf {
        self.layout.root()
    }

    /// containerd's `state`.
    pub fn state(&self) -> PathBuf {
        self.layout.state()
    }

    /// The CNI conf dir containerd watches (`cni.conf_dir`).
    pub fn conf_dir(&self) -> PathBuf {
        self.layout.conf_dir()
    }

    /// containerd's config file (naming the conf dir, as `--runtime-config` reads it).
    pub fn config_path(&self) -> PathBuf {
        self.layout.config()
    }

    /// The CNI bin dir containerd runs plugins from (`cni.bin_dir`).
    pub fn bin_dir(&self) -> PathBuf {
        self.layout.bin_dir()
    }

    /// host-local's `dataDir` in the primary config.
    pub fn ipam_dir(&self) -> PathBuf {
        self.layout.ipam_dir()
    }

    /// The name of the kit (and of the primary config's CNI network).
    pub fn network_name(&self) -> &str {
        &self.layout.name
    }

    /// The bridge the primary config attaches pods to.
    pub fn bridge(&self) -> &str {
        &self.layout.bridge
    }

    /// The primary config's subnet, `10.97.<n>.0/24`.
    pub fn subnet(&self) -> String {
        self.layout.subnet()
    }

    /// True when `ip` lies in [`Containerd::subnet`].
    pub fn in_subnet(&self, ip: IpAddr) -> bool {
        matches!(ip, IpAddr::V4(v4) if v4.octets()[..3] == [10, 97, self.layout.subnet_octet])
    }

    /// The bridge's (gateway's) address, `10.97.<n>.1`.
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 97, self.layout.subnet_octet, 1)
    }

    /// The daemon's process ID while it runs.
    pub fn daemon_pid(&self) -> Option<u32> {
        self.daemon().as_ref().map(|d| d.pid)
    }

    /// From spawning the daemon until CRI answered (image import not included).
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// The last 4 KiB of containerd's log, for assertion messages.
    pub fn log_tail(&self) -> String {
        log_tail(&self.layout.log())
    }

    /// The primary's config: `bridge` (on [`Containerd::bridge`], gateway, no masquerade)
    /// with `host-local` on [`Containerd::subnet`] (data in [`Containerd::ipam_dir`]) and
    /// `portmap`, at `cniVersion` 0.3.1, named [`Containerd::network_name`].
    pub fn primary_conflist(&self) -> Value {
        json!({
            "cniVersion": "0.3.1",
            "name": self.layout.name,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.layout.bridge,
                    "isGateway": true,
                    "ipMasq": false,
                    "hairpinMode": true,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.layout.subnet()}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": self.layout.ipam_dir(),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": true}},
            ],
        })
    }

    /// Writes [`Containerd::primary_conflist`] as [`PRIMARY_CONFLIST`]; returns its path.
    pub fn write_primary_config(&self) -> io::Result<PathBuf> {
        self.write_conf(PRIMARY_CONFLIST, &self.primary_conflist())
    }

    /// Writes `config` to `<conf dir>/<file_name>` atomically (containerd reloads on the
    /// rename and never sees half a file); returns its path.
    pub fn write_conf(&self, file_name: &str, config: &Value) -> io::Result<PathBuf> {
        let path = self.conf_dir().join(file_name);
        let text = serde_json::to_vec_pretty(config)?;
        interlock_contract::atomic::write_file_atomic(&path, &text, Some(0o644))?;
        Ok(path)
    }

    /// Copies [`PRIMARY_PLUGINS`] from the reference plugins ([`interlock_testkit::cni_plugins_dir`]).
    pub fn install_primary_plugins(&self) -> io::Result<()> {
        self.install_reference_plugins(PRIMARY_PLUGINS)
    }

    /// Copies reference plugins by name from [`interlock_testkit::cni_plugins_dir`] into the bin dir.
    pub fn install_reference_plugins(&self, names: &[&str]) -> io::Result<()> {
        let from = interlock_testkit::cni_plugins_dir();
        for name in names {
            self.install_plugin(&from.join(name), name)?;
        }
        Ok(())
    }

    /// Copies any plugin binary (e.g. `interlock-cni`) into the bin dir as `name`.
    pub fn install_plugin(&self, binary: &Path, name: &str) -> io::Result<()> {
        let to = self.bin_dir().join(name);
        let tmp = self.bin_dir().join(format!(".{name}.tmp"));
        fs::copy(binary, &tmp)
            .map_err(|e| io::Error::new(e.kind(), format!("copying {}: {e}", binary.display())))?;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))?;
        fs::rename(&tmp, &to)
    }

    /// A sandbox config for a pod `default/<unique name>` with a fresh UID.
    pub fn pod(&self, tag: &str) -> SandboxConfig {
        let name = interlock_testkit::unique(tag);
        SandboxConfig::new("default", name.clone(), format!("uid-{name}"))
    }

    /// What this kit owns on the host, to check after the kit is gone that nothing is
    /// left ([`Footprint::leftovers`]).
    pub fn footprint(&self) -> Footprint {
        Footprint::of(&self.layout)
    }

    /// Stops the daemon (SIGTERM, SIGKILL after 5 s) as an operator's `systemctl stop
    /// containerd` would: the sandboxes' shims and netns live on. The teardown still works
    /// with the daemon down (it starts one on the same directory to sweep).
    pub fn stop_daemon(&self) -> io::Result<()> {
        let daemon = self.daemon().take();
        match daemon {
            Some(daemon) => daemon
                .stop(Duration::from_secs(5))
                .map_err(io::Error::other),
            None => Ok(()),
        }
    }

    /// Starts the daemon again on the same root, state, socket and config (a no-op when
    /// it runs); returns how long until CRI answered. Sandboxes created before are found
    /// again (containerd reloads them from its root and state).
    pub fn start_daemon(&self) -> io::Result<Duration> {
        if self.daemon().is_some() {
            return Ok(Duration::ZERO);
        }
        let begin = Instant::now();
        *self.daemon() = Some(Daemon::spawn(&self.layout)?);
        self.wait_ready()?;
        Ok(begin.elapsed())
    }

    /// [`Containerd::stop_daemon`] then [`Containerd::start_daemon`].
    pub fn restart_daemon(&self) -> io::Result<Duration> {
        self.stop_daemon()?;
        self.start_daemon()
    }

    /// Tears the kit down now; returns what could not be undone (also done on drop,
    /// where it is printed instead).
    pub fn teardown(mut self) -> Result<(), Vec<String>> {
        let problems = self.teardown_now();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }

    fn teardown_now(&mut self) -> Vec<String> {
        if self.torn_down {
            return Vec::new();
        }
        self.torn_down = true;
        let problems = teardown::tear_down(&self.layout, self.daemon().take());
        // The directory is gone (or reported); the lock goes with the kit.
        self.lock = None;
        problems
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let problems = self.teardown_now();
        if !problems.is_empty() {
            eprintln!(
                "containerd kit {}: teardown left {} problem(s):\n  {}",
                self.layout.name,
                problems.len(),
                problems.join("\n  ")
            );
        }
    }
}

/// A child process (the daemon, or the node's agent) spawned and reaped by a thread of
/// its own: `PR_SET_PDEATHSIG` (the command runs under `setpriv --pdeathsig KILL`) fires
/// when the spawning *thread* exits, so that thread must live as long as the child.
#[derive(Debug)]
pub(crate) struct Daemon {
    pid: u32,
    // In a Mutex only to make the kit `Sync` (a `Receiver` is not).
    exited: std::sync::Mutex<mpsc::Receiver<io::Result<ExitStatus>>>,
    exit_status: Option<ExitStatus>,
    thread: Option<JoinHandle<()>>,
}

impl Daemon {
    pub(crate) fn spawn(layout: &Layout) -> io::Result<Daemon> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(layout.log())?;
        let log2 = log.try_clone()?;
        let mut command = Command::new("setpriv");
        command
            .args(["--pdeathsig", "KILL", "--", "containerd", "--config"])
            .arg(layout.config())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        Daemon::spawn_command(format!("containerd-{}", layout.name), command)
    }

    /// Spawns `command` (which should run under `setpriv --pdeathsig KILL`) from a new
    /// thread named `thread_name` that then waits for it.
    pub(crate) fn spawn_command(thread_name: String, mut command: Command) -> io::Result<Daemon> {
        let what = format!("{:?}", command.get_args().collect::<Vec<_>>());
        let (pid_tx, pid_rx) = mpsc::channel();
        let (exit_tx, exit_rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(thread_name)
            .spawn(move || match command.spawn() {
                Err(e) => {
                    let _ = pid_tx.send(Err(e));
                }
                Ok(mut child) => {
                    let _ = pid_tx.send(Ok(child.id()));
                    let _ = exit_tx.send(child.wait());
                }
            })?;
        let pid = pid_rx
            .recv()
            .map_err(|_| io::Error::other(format!("the thread spawning {what} died")))?
            .map_err(|e| io::Error::new(e.kind(), format!("starting {what}: {e}")))?;
        Ok(Daemon {
            pid,
            exited: std::sync::Mutex::new(exit_rx),
            exit_status: None,
            thread: Some(thread),
        })
    }

    /// The process ID.
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// The exit status once the daemon has exited.
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        if self.exit_status.is_none() {
            if let Ok(status) = receiver(&mut self.exited).try_recv() {
                self.exit_status = Some(status.unwrap_or_else(|_| ExitStatus::default()));
            }
        }
        self.exit_status
    }

    /// Sends `signal` unless the process was reaped already.
    pub(crate) fn signal(&mut self, signal: nix::sys::signal::Signal) {
        if self.exited().is_none() {
            // Not reaped yet, so the PID is still this process's.
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid as i32), signal);
        }
    }

    /// Waits up to `timeout` for the exit; joins the thread once it came.
    pub(crate) fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if self.exit_status.is_none() {
            if let Ok(status) = receiver(&mut self.exited).recv_timeout(timeout) {
                self.exit_status = Some(status.unwrap_or_else(|_| ExitStatus::default()));
            }
        }
        if self.exit_status.is_some() {
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
        }
        self.exit_status
    }

    /// SIGTERM, then SIGKILL after `grace`; waits until it is reaped (at most 5 s more).
    pub(crate) fn terminate(&mut self, grace: Duration) -> Option<ExitStatus> {
        use nix::sys::signal::Signal;
        self.signal(Signal::SIGTERM);
        if let Some(status) = self.wait_exit(grace) {
            return Some(status);
        }
        self.signal(Signal::SIGKILL);
        self.wait_exit(Duration::from_secs(5))
    }

    /// [`Daemon::terminate`], as an error naming the process when it survived SIGKILL.
    pub(crate) fn stop(mut self, grace: Duration) -> Result<(), String> {
        match self.terminate(grace) {
            Some(_) => Ok(()),
            None => Err(format!("process {} survived SIGKILL for 5 s", self.pid)),
        }
    }
}

fn receiver<T>(m: &mut std::sync::Mutex<T>) -> &mut T {
    m.get_mut().unwrap_or_else(|e| e.into_inner())
}

/// Polls until CRI answers `Version` on the layout's socket, failing early with the log
/// when the daemon exits.
pub(crate) fn wait_ready(
    layout: &Layout,
    daemon: &mut Daemon,
    timeout: Duration,
) -> io::Result<()> {
    let endpoint = layout.endpoint();
    let deadline = Instant::now() + timeout;
    let answered = block_on_thread(|| async {
        let quick = Timeouts {
            connect: Duration::from_millis(500),
            call: Duration::from_secs(2),
            ..Timeouts::default()
        };
        loop {
            if let Some(status) = daemon.exited() {
                return Err(format!("containerd exited early ({status})"));
            }
            if Instant::now() > deadline {
                return Err(format!("CRI did not answer within {timeout:?}"));
            }
            if layout.socket().exists() {
                if let Ok(client) = CriClient::connect_with(&endpoint, quick).await {
                    if client.version().await.is_ok() {
                        return Ok(());
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    answered
        .map_err(|e| io::Error::other(format!("{e}; containerd log:\n{}", log_tail(&layout.log()))))
}

/// Runs an async block to completion on a fresh thread with its own runtime, so that the
/// kit can be started and dropped inside or outside a caller's tokio runtime.
pub(crate) fn block_on_thread<F, Fut>(f: F) -> Fut::Output
where
    F: FnOnce() -> Fut + Send,
    Fut: std::future::Future,
    Fut::Output: Send,
{
    std::thread::scope(|s| {
        s.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a current-thread tokio runtime")
                .block_on(f())
        })
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
    })
}

/// True when `path` is a network namespace file (nsfs, and `setns(CLONE_NEWNET)` accepts
/// it); entered on a scratch thread, so the caller's namespace is untouched.
pub fn is_network_namespace(path: &Path) -> bool {
    let Ok(file) = File::open(path) else {
        return false;
    };
    let on_nsfs = nix::sys::statfs::fstatfs(&file)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::NSFS_MAGIC);
    on_nsfs
        && std::thread::scope(|s| {
            s.spawn(|| nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).is_ok())
                .join()
                .unwrap_or(false)
        })
}

fn log_tail(log: &Path) -> String {
    let text = fs::read(log).unwrap_or_default();
    let start = text.len().saturating_sub(4096);
    String::from_utf8_lossy(&text[start..]).into_owned()
}

/// Subnet octets in use: by live kits (their `kit.json`) and by the host's routes.
pub(crate) fn octets_in_use(kits: &[Layout]) -> BTreeSet<u8> {
    let mut used: BTreeSet<u8> = kits.iter().map(|k| k.subnet_octet).collect();
    let routes = Command::new("ip")
        .args(["-4", "route", "show", "table", "all"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    used.extend(octets_in_routes(&routes));
    used
}

/// The `n` of every `10.97.n.*` destination in `ip route` output.
fn octets_in_routes(routes: &str) -> impl Iterator<Item = u8> + '_ {
    routes.lines().filter_map(|line| {
        let dst = line.split_whitespace().find(|w| w.starts_with("10.97."))?;
        dst.split(['.', '/']).nth(2)?.parse().ok()
    })
}

/// A free octet: random start, first not in `used`.
pub(crate) fn pick_octet(used: &BTreeSet<u8>, start: u8) -> Option<u8> {
    (0..=255u16)
        .map(|i| start.wrapping_add(i as u8))
        .find(|o| !used.contains(o))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_network_namespaces_are_network_namespaces() {
        interlock_testkit::require_root!();
        assert!(is_network_namespace(Path::new("/proc/self/ns/net")));
        assert!(!is_network_namespace(Path::new("/proc/self/ns/uts")));
        assert!(!is_network_namespace(Path::new("/etc/hostname")));
        assert!(!is_network_namespace(Path::new("/nonexistent")));
    }

    #[test]
    fn octets_come_from_route_destinations() {
        let routes = "default via 192.0.2.1 dev eth0\n10.97.7.0/24 dev ilbr1 proto kernel scope link src 10.97.7.1\nlocal 10.97.9.1 dev ilbr2 table local proto kernel scope host src 10.97.9.1\n10.99.3.0/24 dev x\n";
        let got: Vec<u8> = octets_in_routes(routes).collect();
        assert_eq!(got, vec![7, 9]);
    }

    #[test]
    fn a_free_octet_skips_used_ones_and_wraps() {
        let used: BTreeSet<u8> = [254, 255, 0].into_iter().collect();
        assert_eq!(pick_octet(&used, 254), Some(1));
        assert_eq!(pick_octet(&BTreeSet::new(), 9), Some(9));
        let all: BTreeSet<u8> = (0..=255).collect();
        assert_eq!(pick_octet(&all, 3), None);
    }

    #[test]
    fn the_config_keeps_everything_inside_the_kit_dir() {
        let layout = Layout {
            name: "ilctdx".into(),
            dir: PathBuf::from("/tmp/k/ilctdx"),
            bridge: "ilbrx".into(),
            subnet_octet: 4,
        };
        let toml = layout.config_toml();
        for needle in [
            "root = \"/tmp/k/ilctdx/root\"",
            "state = \"/tmp/k/ilctdx/state\"",
            "address = \"/tmp/k/ilctdx/containerd.sock\"",
            "restrict_oom_score_adj = true",
            "snapshotter = \"overlayfs\"",
            "Root = \"/tmp/k/ilctdx/runc\"",
            "bin_dir = \"/tmp/k/ilctdx/bin\"",
            "conf_dir = \"/tmp/k/ilctdx/net.d\"",
            "max_conf_num = 1",
            "sandbox_image = \"localhost/pause:test\"",
        ] {
            assert!(toml.contains(needle), "{needle} missing from:\n{toml}");
        }
        assert_eq!(layout.subnet(), "10.97.4.0/24");
    }
}

//! A node in a box: a private containerd, the reference primary CNI config, the
//! `interlock agent` process, optionally the fake Kubernetes API, and sandboxes created
//! over CRI — for scenario tests, the chaos soak and the demo.
//!
//! # The pieces
//! - [`Node::start`] starts a private containerd ([`crate::containerd::Containerd`]) and
//!   copies the primary's reference plugins into its CNI bin dir. No CNI config exists
//!   yet: the test decides when the primary appears.
//! - The primary: [`Node::write_primary`] writes `bridge` + `host-local` + `portmap` as
//!   [`PRIMARY_CONFLIST`] (`10-calico.conflist`, cniVersion 0.3.1), atomically.
//!   [`Node::rewrite_primary`] rewrites it as a primary's installer does when it
//!   restarts, dropping every foreign entry (in place or by rename, [`PrimaryWrite`]).
//!   [`Node::delete_primary`] / [`Node::rename_primary`] remove it or move it aside;
//!   [`Node::write_sorting_first`] writes any config under a name that sorts ahead;
//!   [`Node::write_half_written`] leaves a truncated file (what a writer killed mid-write
//!   leaves; containerd then fails the whole load when it sorts first) and
//!   [`Node::complete_file`] finishes it.
//! - The agent: [`Node::start_agent`] runs the `interlock` binary given in
//!   [`NodeOptions::agent`] as `interlock agent` with the node's conf dir, bin dir, state
//!   dir, CRI endpoint, a health address of its own, `--plugin-source`
//!   [`NodeOptions::plugin`], and `--kube=none` or (with the fake API) `--kube=auto
//!   --node-name` plus `KUBECONFIG`; the caller adds flags and env ([`AgentArgs`]).
//!   [`Node::start_agent_from`] runs another binary (an upgrade). One agent runs at a
//!   time: [`Node::wait_agent_ready`] (`/readyz` 200), [`Node::agent_ready`],
//!   [`Node::stop_agent`] (SIGTERM, SIGKILL after a grace), [`Node::kill_agent`]
//!   (SIGKILL), [`Node::restart_agent`] (SIGTERM, then a new agent with the same binary
//!   and arguments); [`Node::agent`] lends the [`AgentProcess`] itself
//!   ([`AgentProcess::metric`], [`AgentProcess::get`], [`AgentProcess::pid`]). The agent
//!   runs under `setpriv --pdeathsig KILL`, so it dies with the test process. Every
//!   agent's stdout and stderr go to a log file of its own; [`Node::agent_logs`] returns
//!   them all, and their tail is printed when a test panics with the node alive.
//! - interlock-cni: [`Node::install_interlock_cni`] copies [`NodeOptions::plugin`] into
//!   the bin dir (the agent also installs it from `--plugin-source`);
//!   [`Node::remove_interlock_cni`] deletes it.
//! - The fake API ([`NodeOptions::kube`]): a [`KubeApi`] holding the Node object
//!   [`NODE_NAME`], registered with the startup taint [`TAINT_NOT_READY`] when
//!   [`NodeOptions::startup_taint`]; every sandbox the node runs also gets its Pod object
//!   (same namespace, name, UID and annotations, bound to the node, `Running`).
//! - Sandboxes: [`Node::run_pod`] runs one over CRI, meshed ones carrying
//!   [`MESHED_ANNOTATION`] (the `generic` profile's, which the annotations alone decide,
//!   with or without the fake API); it returns a [`Sandbox`] (ID, pod, netns, IP) or the
//!   runtime's error. [`Node::stop_pod`] / [`Node::remove_pod`] undo it. A pod run from a
//!   config with a mesh's annotations gets that mesh's proxy container in its Pod object
//!   (the agent reads the spec of Istio and Linkerd pods; the mesh plugin stand-ins that of
//!   Kuma's). [`Node::loaded_chains`] is what containerd has loaded (verbose CRI status).
//!   With the fake API, [`Node::pod_object`] and [`Node::pod_events`] show what the agent
//!   wrote about a pod, [`Node::taints`] and [`Node::condition`] about the node.
//! - [`Node::watch_conf_dir`] reports every file deleted or moved out of the conf dir
//!   (inotify), so a test sees a config that vanished even for a microsecond.
//! - Leak checks while the node runs: [`Node::ipam_addresses`] (host-local's),
//!   [`Node::state_files`] (interlock's attachment records), [`Node::sandboxes`].
//! - containerd: [`Node::restart_containerd`] stops the daemon and starts it again on the
//!   same root, state and socket; the sandboxes survive. [`Node::network_ready`] is CRI's
//!   `NetworkReady`.
//! - The independent capture check: [`check_capture`] uses nothing of interlock (only
//!   std and nix). Inside a sandbox's netns it listens on the proxy's outbound port and
//!   connects, as a non-proxy UID ([`CHECK_UID`]), to a destination the test owns (the
//!   bridge gateway, on a port the check listens on in the host): [`Capture::Redirected`]
//!   when the proxy listener accepted it with `SO_ORIGINAL_DST` = the destination,
//!   [`Capture::NotRedirected`] when the host listener got it, [`Capture::NoNetwork`]
//!   when the netns has no IPv4 address besides loopback. [`Node::capture`] runs it on a
//!   [`Sandbox`]. One check at a time per sandbox (each binds the proxy port there).
//!   [`in_netns`] runs a closure inside a sandbox's netns (e.g. to hold a connection
//!   open from before a repair).
//!
//! # Teardown
//! Dropping the node (also on a panic) kills the agent, removes a half-written or
//! invalid config that would make containerd refuse every DEL, tears the containerd kit
//! down (every sandbox stopped and removed over CRI, so CNI DELs run and IPs are freed;
//! netns, mounts, bridge, cache and the kit directory go — see
//! [`crate::containerd`]), and stops the fake API. The node's own files (agent state dir,
//! logs, kubeconfig) live in the kit directory and go with it. [`Node::teardown`] does
//! the same now and returns what could not be undone; [`Node::footprint`] names what to
//! check afterwards.
//!
//! # Threads and async
//! Methods are synchronous and may be called from several threads at once (a pod
//! creator while another thread restarts the agent) and from inside a tokio runtime: CRI
//! calls run on the node's own runtime. [`Node::cri`] gives the client for async code.

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use interlock_cri::{CriClient, SandboxConfig, SandboxFilter, SandboxSummary};
use serde_json::{json, Value};

use crate::containerd::{Containerd, Daemon, Footprint};
use crate::kubeapi::KubeApi;

pub use crate::containerd::PRIMARY_CONFLIST;
/// The startup taint the agent removes once ready, and the node condition it writes.
pub use interlock_contract::names::{CONDITION_READY, TAINT_NOT_READY};

/// The annotation that makes a pod meshed: the `generic` profile's switch
/// (`interlock_redirect::profile::generic::keys::REDIRECT`), decided from the
/// annotations alone (Istio's and Linkerd's pods need their spec, which only the agent's
/// Kubernetes cache has). Its defaults are Istio's ports and UID 1337.
pub const MESHED_ANNOTATION: (&str, &str) = ("interlock.dev/redirect", "enabled");
/// The generic profile's outbound proxy port, where captured connections land.
pub const PROXY_OUTBOUND_PORT: u16 = 15001;
/// The UID the capture check connects as: `nobody`, never the proxy's 1337.
pub const CHECK_UID: u32 = 65534;
/// The Node object's name in the fake API.
pub const NODE_NAME: &str = "node-in-a-box";
/// How long [`AgentProcess::wait_ready`] waits by default.
pub const AGENT_READY_TIMEOUT: Duration = Duration::from_secs(15);

/// What a [`Node`] is made of.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// The `interlock` binary the agent runs from.
    pub agent: PathBuf,
    /// The `interlock-cni` binary (`--plugin-source`, [`Node::install_interlock_cni`]).
    pub plugin: PathBuf,
    /// Start the fake Kubernetes API with the Node object and point the agent at it.
    pub kube: bool,
    /// Register the Node with the startup taint (as a node pool configured for
    /// interlock does); only with `kube`.
    pub startup_taint: bool,
}

impl NodeOptions {
    /// No fake API; `agent` and `plugin` as given.
    pub fn new(agent: impl Into<PathBuf>, plugin: impl Into<PathBuf>) -> NodeOptions {
        NodeOptions {
            agent: agent.into(),
            plugin: plugin.into(),
            kube: false,
            startup_taint: true,
        }
    }

    /// With the fake API (and the startup taint).
    pub fn with_kube(mut self) -> NodeOptions {
        self.kube = true;
        self
    }
}

/// Extra arguments and environment for one agent start, after the node's own flags
/// (a flag the node already sets must not be given again: clap refuses duplicates).
#[derive(Debug, Clone, Default)]
pub struct AgentArgs {
    /// Extra command-line arguments, e.g. `["--audit-interval", "1"]`.
    pub args: Vec<String>,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
}

impl AgentArgs {
    /// Just these arguments.
    pub fn args<S: AsRef<str>>(args: &[S]) -> AgentArgs {
        AgentArgs {
            args: args.iter().map(|a| a.as_ref().to_string()).collect(),
            env: Vec::new(),
        }
    }
}

/// How the primary's config file is rewritten.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrimaryWrite {
    /// Write a temp file and rename it over (aws-node, Cilium).
    Rename,
    /// Truncate and write the file itself (a shell `cat > file`): containerd may see it
    /// empty or half-written for a moment.
    InPlace,
}

/// A sandbox the node ran over CRI.
#[derive(Debug, Clone)]
pub struct Sandbox {
    /// The runtime's sandbox ID.
    pub id: String,
    /// Namespace, name, UID of the pod.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's UID.
    pub uid: String,
    /// Whether it carries [`MESHED_ANNOTATION`].
    pub meshed: bool,
    /// Its network namespace file (from verbose `PodSandboxStatus`).
    pub netns: Option<PathBuf>,
    /// Its IP as the runtime reports it.
    pub ip: Option<IpAddr>,
}

/// The result of [`check_capture`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Capture {
    /// The proxy's listener accepted the connection, `SO_ORIGINAL_DST` = destination.
    Redirected,
    /// The destination itself accepted the connection.
    NotRedirected,
    /// The netns has no IPv4 address besides loopback (or no netns at all).
    NoNetwork,
    /// Anything else (connection failed, redirected elsewhere), described.
    Failed(String),
}

/// A node in a box; see the module docs.
pub struct Node {
    options: NodeOptions,
    kit: Option<Containerd>,
    api: Option<KubeApi>,
    runtime: OwnRuntime,
    cri: CriClient,
    dir: PathBuf,
    agent: Mutex<Option<AgentProcess>>,
    last_agent: Mutex<Option<(PathBuf, AgentArgs)>>,
    agent_starts: std::sync::atomic::AtomicU32,
    /// Every sandbox run (ID, netns), for [`Node::footprint`].
    created: Mutex<Vec<(String, Option<PathBuf>)>>,
    torn_down: bool,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("dir", &self.dir)
            .field("kube", &self.api.is_some())
            .finish()
    }
}

impl Node {
    /// Starts containerd (no CNI config yet), installs the primary's plugins and, with
    /// [`NodeOptions::kube`], the fake API holding the Node object.
    pub fn start(options: NodeOptions) -> io::Result<Node> {
        let runtime = OwnRuntime(Some(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .thread_name("node-cri")
                .build()?,
        ));
        let kit = Containerd::start()?;
        kit.install_primary_plugins()?;
        let dir = kit.dir().join("node");
        fs::create_dir_all(dir.join("state"))?;
        let endpoint = kit.endpoint();
        let cri = on_runtime(runtime.get(), CriClient::connect(&endpoint))
            .map_err(|e| io::Error::other(e.to_string()))?;
        let api = if options.kube {
            let api = KubeApi::start()?;
            let taints = if options.startup_taint {
                json!([{"key": TAINT_NOT_READY, "effect": "NoSchedule"}])
            } else {
                json!([])
            };
            api.put_object(json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": NODE_NAME}, "spec": {"taints": taints}}));
            api.write_kubeconfig(&dir.join("kubeconfig"))?;
            Some(api)
        } else {
            None
        };
        Ok(Node {
            options,
            kit: Some(kit),
            api,
            runtime,
            cri,
            dir,
            agent: Mutex::new(None),
            last_agent: Mutex::new(None),
            agent_starts: std::sync::atomic::AtomicU32::new(0),
            created: Mutex::new(Vec::new()),
            torn_down: false,
        })
    }

    fn kit(&self) -> &Containerd {
        self.kit.as_ref().expect("the node is torn down")
    }

    /// The private containerd.
    pub fn containerd(&self) -> &Containerd {
        self.kit()
    }

    /// The fake API, when [`NodeOptions::kube`].
    pub fn api(&self) -> Option<&KubeApi> {
        self.api.as_ref()
    }

    /// A CRI client (usable on any tokio runtime).
    pub fn cri(&self) -> CriClient {
        self.cri.clone()
    }

    /// Runs `fut` to completion on the node's runtime (callable inside a runtime too).
    pub fn block_on<F>(&self, fut: F) -> F::Output
    where
        F: std::future::Future + Send,
        F::Output: Send,
    {
        on_runtime(self.runtime.get(), fut)
    }

    /// The CNI conf dir containerd watches.
    pub fn conf_dir(&self) -> PathBuf {
        self.kit().conf_dir()
    }

    /// The CNI bin dir.
    pub fn bin_dir(&self) -> PathBuf {
        self.kit().bin_dir()
    }

    /// The node's containerd process ID while it runs.
    pub fn containerd_pid(&self) -> Option<u32> {
        self.kit().daemon_pid()
    }

    /// The agent's state dir.
    pub fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }

    /// The bridge gateway, the destination the capture check connects to.
    pub fn gateway(&self) -> Ipv4Addr {
        self.kit().gateway()
    }

    /// What the node leaves on the host, to check after [`Node::teardown`]: the kit's,
    /// plus every sandbox [`Node::run_pod`] ran and its netns.
    pub fn footprint(&self) -> Footprint {
        let created = self.created.lock().unwrap_or_else(|e| e.into_inner());
        self.kit()
            .footprint()
            .with_sandboxes(created.iter().map(|(id, _)| id.clone()))
            .with_netns(created.iter().filter_map(|(_, ns)| ns.clone()))
    }

    // ---- the primary's config ----

    /// The primary's config (see [`Containerd::primary_conflist`]).
    pub fn primary_conflist(&self) -> Value {
        self.kit().primary_conflist()
    }

    /// Writes the primary's config as [`PRIMARY_CONFLIST`], atomically.
    pub fn write_primary(&self) -> io::Result<PathBuf> {
        self.kit().write_primary_config()
    }

    /// Rewrites [`PRIMARY_CONFLIST`] with the primary's plugins only, dropping whatever
    /// another component added to it (what a primary's installer does on restart).
    pub fn rewrite_primary(&self, how: PrimaryWrite) -> io::Result<PathBuf> {
        let path = self.conf_dir().join(PRIMARY_CONFLIST);
        match how {
            PrimaryWrite::Rename => {
                let tmp = self.conf_dir().join(format!(".{PRIMARY_CONFLIST}.tmp"));
                fs::write(&tmp, serde_json::to_vec_pretty(&self.primary_conflist())?)?;
                fs::rename(&tmp, &path)?;
            }
            PrimaryWrite::InPlace => {
                let mut f = File::create(&path)?;
                f.write_all(&serde_json::to_vec_pretty(&self.primary_conflist())?)?;
            }
        }
        Ok(path)
    }

    /// Deletes [`PRIMARY_CONFLIST`] (absent is fine).
    pub fn delete_primary(&self) -> io::Result<()> {
        match fs::remove_file(self.conf_dir().join(PRIMARY_CONFLIST)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Renames [`PRIMARY_CONFLIST`] to `to` in the conf dir (e.g. `.bak`, ignored by
    /// containerd, or another config name).
    pub fn rename_primary(&self, to: &str) -> io::Result<PathBuf> {
        let dest = self.conf_dir().join(to);
        fs::rename(self.conf_dir().join(PRIMARY_CONFLIST), &dest)?;
        Ok(dest)
    }

    /// Writes `config` under `file_name`, atomically; for a name that sorts ahead of
    /// the primary (`00-first.conflist`) it takes first place.
    pub fn write_sorting_first(&self, file_name: &str, config: &Value) -> io::Result<PathBuf> {
        self.kit().write_conf(file_name, config)
    }

    /// The primary's config as another component writes it (marked `"writtenBy":
    /// writer`), for [`Node::write_sorting_first`]. It keeps the primary's network name,
    /// so its pods share host-local's pool (no address handed out twice on the bridge)
    /// and the kit's teardown finds their CNI cache entries.
    pub fn foreign_conflist(&self, writer: &str) -> Value {
        let mut v = self.primary_conflist();
        v["writtenBy"] = json!(writer);
        v
    }

    /// Writes the first half of the primary's config bytes under `file_name`, not
    /// atomically: invalid JSON, what a writer killed mid-write leaves.
    pub fn write_half_written(&self, file_name: &str) -> io::Result<PathBuf> {
        let full = serde_json::to_vec_pretty(&self.foreign_conflist("half-written"))?;
        let path = self.conf_dir().join(file_name);
        fs::write(&path, &full[..full.len() / 2])?;
        Ok(path)
    }

    /// Completes a file written by [`Node::write_half_written`] (in place, as the writer
    /// finishing its write): it becomes a valid config.
    pub fn complete_file(&self, file_name: &str) -> io::Result<PathBuf> {
        let full = serde_json::to_vec_pretty(&self.foreign_conflist("half-written"))?;
        let path = self.conf_dir().join(file_name);
        let mut f = fs::OpenOptions::new().append(true).open(&path)?;
        let have = f.metadata()?.len() as usize;
        f.write_all(&full[have.min(full.len())..])?;
        Ok(path)
    }

    /// Starts watching the conf dir for files removed or moved away (inotify: nothing
    /// between two polls is missed); read with [`ConfDirWatch::removed`].
    pub fn watch_conf_dir(&self) -> io::Result<ConfDirWatch> {
        ConfDirWatch::new(&self.conf_dir())
    }

    /// The config file names in the conf dir, sorted.
    pub fn conf_files(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(self.conf_dir())
            .map(|r| {
                r.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    // ---- interlock-cni ----

    /// Copies [`NodeOptions::plugin`] into the bin dir as `interlock-cni`.
    pub fn install_interlock_cni(&self) -> io::Result<()> {
        self.kit()
            .install_plugin(&self.options.plugin, "interlock-cni")
    }

    /// Deletes `interlock-cni` from the bin dir (absent is fine).
    pub fn remove_interlock_cni(&self) -> io::Result<()> {
        match fs::remove_file(self.bin_dir().join("interlock-cni")) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    // ---- the agent ----

    /// Starts the agent from [`NodeOptions::agent`]; panics if one runs already. Does not
    /// wait for readiness ([`AgentProcess::wait_ready`]).
    pub fn start_agent(&self, extra: AgentArgs) -> io::Result<()> {
        self.start_agent_from(&self.options.agent.clone(), extra)
    }

    /// Starts the agent from another `interlock` binary (an upgrade).
    pub fn start_agent_from(&self, binary: &Path, extra: AgentArgs) -> io::Result<()> {
        let mut slot = self.agent.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(a) = slot.as_mut() {
            assert!(
                a.exited().is_some(),
                "an agent (pid {}) runs already: stop it first",
                a.pid()
            );
        }
        let n = self
            .agent_starts
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let health = free_port()?;
        let mut args: Vec<OsString> = vec!["agent".into()];
        let mut flag = |k: &str, v: &dyn AsRef<std::ffi::OsStr>| {
            args.push(k.into());
            args.push(v.as_ref().to_owned());
        };
        flag("--cni-conf-dir", &self.conf_dir());
        flag("--cni-bin-dir", &self.bin_dir());
        flag("--state-dir", &self.state_dir());
        flag("--cri-endpoint", &self.kit().endpoint());
        flag("--plugin-source", &self.options.plugin);
        flag("--health-addr", &health.to_string());
        // The kit's containerd config: the runtime that reads this conf dir (in the
        // environment, which an older release's agent ignores, not as a flag it would
        // refuse).
        let mut env: Vec<(OsString, OsString)> = vec![(
            "INTERLOCK_RUNTIME_CONFIG".into(),
            self.kit().config_path().into(),
        )];
        if self.api.is_some() {
            flag("--kube", &"auto");
            flag("--node-name", &NODE_NAME);
            env.push(("KUBECONFIG".into(), self.dir.join("kubeconfig").into()));
        } else {
            flag("--kube", &"none");
        }
        args.extend(extra.args.iter().map(OsString::from));
        env.extend(
            extra
                .env
                .iter()
                .map(|(k, v)| (OsString::from(k), OsString::from(v))),
        );
        let log = self.dir.join(format!("agent-{n}.log"));
        let process = AgentProcess::spawn(binary, &args, &env, &log, health)?;
        *slot = Some(process);
        *self.last_agent.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((binary.to_path_buf(), extra));
        Ok(())
    }

    /// Runs `f` on the current agent; panics when none was started.
    pub fn agent<R>(&self, f: impl FnOnce(&mut AgentProcess) -> R) -> R {
        let mut slot = self.agent.lock().unwrap_or_else(|e| e.into_inner());
        f(slot.as_mut().expect("no agent started"))
    }

    /// Waits until the current agent answers `/readyz` 200; returns how long it took.
    pub fn wait_agent_ready(&self, timeout: Duration) -> Result<Duration, String> {
        let (health, log) = self.agent(|a| (a.health, a.log.clone()));
        wait_ready_at(health, &log, timeout)
    }

    /// The current agent's `/readyz` verdict (`None`: not answering, or none started).
    pub fn agent_ready(&self) -> Option<bool> {
        let slot = self.agent.lock().unwrap_or_else(|e| e.into_inner());
        slot.as_ref().and_then(|a| a.ready())
    }

    /// SIGTERMs the current agent and waits up to `grace` for it (then SIGKILL).
    pub fn stop_agent(&self, grace: Duration) -> Option<ExitStatus> {
        let mut slot = self.agent.lock().unwrap_or_else(|e| e.into_inner());
        slot.as_mut().and_then(|a| a.terminate(grace))
    }

    /// SIGKILLs the current agent.
    pub fn kill_agent(&self) {
        let mut slot = self.agent.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(a) = slot.as_mut() {
            a.kill();
        }
    }

    /// SIGTERM, then a new agent with the last binary and arguments.
    pub fn restart_agent(&self) -> io::Result<()> {
        self.stop_agent(Duration::from_secs(10));
        let (binary, extra) = self
            .last_agent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .expect("no agent started before");
        self.start_agent_from(&binary, extra)
    }

    /// Every agent log of this node, oldest first, each under a header.
    pub fn agent_logs(&self) -> String {
        let mut out = String::new();
        for n in 0..self.agent_starts.load(std::sync::atomic::Ordering::Relaxed) {
            let path = self.dir.join(format!("agent-{n}.log"));
            out.push_str(&format!("==== {} ====\n", path.display()));
            out.push_str(&fs::read_to_string(&path).unwrap_or_default());
        }
        out
    }

    // ---- sandboxes ----

    /// A sandbox config for `default/<unique name>`, meshed or not.
    pub fn pod_config(&self, tag: &str, meshed: bool) -> SandboxConfig {
        let config = self.kit().pod(tag);
        if meshed {
            config.annotation(MESHED_ANNOTATION.0, MESHED_ANNOTATION.1)
        } else {
            config
        }
    }

    /// Runs a sandbox (and, with the fake API, puts its Pod first); returns it, or the
    /// runtime's error text.
    pub fn run_pod(&self, tag: &str, meshed: bool) -> Result<Sandbox, String> {
        self.run_config(self.pod_config(tag, meshed))
    }

    /// Runs a sandbox from a config of the caller's.
    pub fn run_config(&self, config: SandboxConfig) -> Result<Sandbox, String> {
        let meshed = config
            .annotations
            .get(MESHED_ANNOTATION.0)
            .map(String::as_str)
            == Some(MESHED_ANNOTATION.1);
        if let Some(api) = &self.api {
            api.put_object(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": config.metadata.name, "namespace": config.metadata.namespace,
                             "uid": config.metadata.uid, "annotations": config.annotations},
                "spec": pod_spec(&config.annotations),
                "status": {"phase": "Running"}}));
        }
        let cri = self.cri.clone();
        let (id, status) = self.block_on(async move {
            let id = cri.run_sandbox(&config).await.map_err(|e| e.to_string())?;
            let status = cri
                .sandbox_status(&id, true)
                .await
                .map_err(|e| format!("status of {id}: {e}"))?;
            Ok::<_, String>((id, status))
        })?;
        self.created
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((id.clone(), status.netns_path().map(Path::to_path_buf)));
        Ok(Sandbox {
            id,
            namespace: status.metadata.namespace.clone(),
            name: status.metadata.name.clone(),
            uid: status.metadata.uid.clone(),
            meshed,
            netns: status.netns_path().map(Path::to_path_buf),
            ip: status.ips.first().copied(),
        })
    }

    /// Stops a sandbox (CNI DEL runs).
    pub fn stop_pod(&self, id: &str) -> Result<(), String> {
        let cri = self.cri.clone();
        self.block_on(async move { cri.stop_sandbox(id).await.map_err(|e| e.to_string()) })
    }

    /// Stops and removes a sandbox, and deletes its Pod from the fake API.
    pub fn remove_pod(&self, sandbox: &Sandbox) -> Result<(), String> {
        let cri = self.cri.clone();
        let id = sandbox.id.clone();
        self.block_on(async move {
            cri.stop_sandbox(&id).await.map_err(|e| e.to_string())?;
            cri.remove_sandbox(&id).await.map_err(|e| e.to_string())
        })?;
        if let Some(api) = &self.api {
            api.delete_object("pods", &sandbox.namespace, &sandbox.name);
        }
        Ok(())
    }

    /// Every sandbox containerd knows (ready or not).
    pub fn sandboxes(&self) -> Result<Vec<SandboxSummary>, String> {
        let cri = self.cri.clone();
        self.block_on(async move {
            cri.list_sandboxes(&SandboxFilter::default())
                .await
                .map_err(|e| e.to_string())
        })
    }

    /// CRI's `NetworkReady` (containerd loaded a CNI config); `None` when CRI does not
    /// answer.
    pub fn network_ready(&self) -> Option<bool> {
        let cri = self.cri.clone();
        self.block_on(async move { cri.status().await.ok().map(|s| s.network_ready()) })
    }

    /// Waits until `NetworkReady` is `want`.
    pub fn wait_network_ready(&self, want: bool, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        while self.network_ready() != Some(want) {
            if Instant::now() > deadline {
                return Err(format!(
                    "NetworkReady not {want} within {timeout:?}; conf dir: {:?}",
                    self.conf_files()
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    /// The plugin `type`s of each CNI network containerd has loaded, in its order (the
    /// loopback network first, then the pod network from the conf dir), from CRI's verbose
    /// `Status` (`cniconfig`); `None` when CRI does not answer or says nothing of it.
    pub fn loaded_chains(&self) -> Option<Vec<Vec<String>>> {
        let cri = self.cri.clone();
        let info = self.block_on(async move { cri.status_info().await.ok() })?;
        let v: Value = serde_json::from_str(info.get("cniconfig")?).ok()?;
        let nets = v.get("Networks")?.as_array()?;
        Some(
            nets.iter()
                .map(|n| {
                    n["Config"]["Plugins"]
                        .as_array()
                        .map(|ps| {
                            ps.iter()
                                .filter_map(|p| p["Network"]["type"].as_str().map(str::to_string))
                                .collect()
                        })
                        .unwrap_or_default()
                })
                .collect(),
        )
    }

    /// Waits until the pod network containerd has loaded (the last of
    /// [`Node::loaded_chains`] that is not the loopback network; empty while there is none)
    /// satisfies `want`; returns the chain it saw.
    pub fn wait_loaded_chain(
        &self,
        want: impl Fn(&[String]) -> bool,
        timeout: Duration,
    ) -> Result<Vec<String>, String> {
        let deadline = Instant::now() + timeout;
        loop {
            // containerd always lists its loopback network first; the pod network, once
            // loaded, follows it.
            let chain = self
                .loaded_chains()
                .and_then(|c| c.into_iter().rfind(|n| n.as_slice() != ["loopback"]))
                .unwrap_or_default();
            if want(&chain) {
                return Ok(chain);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "containerd's loaded chain {chain:?} not as wanted within {timeout:?}; conf dir: {:?}",
                    self.conf_files()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops containerd and starts it again on the same root, state and socket; returns
    /// how long until CRI answered again. Sandboxes survive.
    pub fn restart_containerd(&self) -> io::Result<Duration> {
        self.kit().restart_daemon()
    }

    /// The independent capture check on `sandbox` ([`check_capture`]).
    pub fn capture(&self, sandbox: &Sandbox) -> Capture {
        match &sandbox.netns {
            Some(netns) => check_capture(netns, PROXY_OUTBOUND_PORT, CHECK_UID, self.gateway()),
            None => Capture::NoNetwork,
        }
    }

    /// The addresses host-local holds for the primary's network (one per sandbox with
    /// a network; 0 once all are stopped: a leak check).
    pub fn ipam_addresses(&self) -> Vec<IpAddr> {
        let dir = self.kit().ipam_dir().join(self.kit().network_name());
        let mut v: Vec<IpAddr> = fs::read_dir(dir)
            .map(|r| {
                r.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    /// The attachment state files the plugin (or the audit) keeps in the agent's state
    /// dir (one per protected sandbox; 0 once all are stopped: a leak check).
    pub fn state_files(&self) -> Vec<String> {
        let dir = self
            .state_dir()
            .join(interlock_contract::layout::ATTACHMENTS_DIR);
        let mut v: Vec<String> = fs::read_dir(dir)
            .map(|r| {
                r.filter_map(|e| Some(e.ok()?.file_name().to_str()?.to_string()))
                    .filter(|n| n.ends_with(".json"))
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    // ---- the fake API ----

    /// The Node object's taint keys (empty without the fake API).
    pub fn taints(&self) -> Vec<String> {
        self.node_object()
            .and_then(|n| n["spec"]["taints"].as_array().cloned())
            .map(|a| {
                a.iter()
                    .filter_map(|t| t["key"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The Node's [`CONDITION_READY`] condition, if written.
    pub fn condition(&self) -> Option<Value> {
        self.node_object()?["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == CONDITION_READY)
            .cloned()
    }

    /// The sandbox's Pod object in the fake API (its labels, annotations, status).
    pub fn pod_object(&self, sandbox: &Sandbox) -> Option<Value> {
        self.api
            .as_ref()?
            .get_object("pods", &sandbox.namespace, &sandbox.name)
    }

    /// The Events about the sandbox's pod in the fake API, oldest first, as
    /// (reason, note).
    pub fn pod_events(&self, sandbox: &Sandbox) -> Vec<(String, String)> {
        let Some(api) = &self.api else {
            return Vec::new();
        };
        api.objects("events")
            .iter()
            .filter(|e| {
                e["regarding"]["kind"] == "Pod"
                    && e["regarding"]["name"] == sandbox.name.as_str()
                    && e["regarding"]["namespace"] == sandbox.namespace.as_str()
            })
            .map(|e| {
                let text = |k: &str| e[k].as_str().unwrap_or_default().to_string();
                (text("reason"), text("note"))
            })
            .collect()
    }

    fn node_object(&self) -> Option<Value> {
        self.api.as_ref()?.get_object("nodes", "", NODE_NAME)
    }

    // ---- teardown ----

    /// Tears everything down now; returns what could not be undone.
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
        if let Some(mut a) = self.agent.lock().unwrap_or_else(|e| e.into_inner()).take() {
            a.kill();
        }
        let mut problems = Vec::new();
        if let Some(kit) = self.kit.take() {
            // A file containerd cannot parse makes it refuse every DEL ("cni plugin not
            // initialized"): the sweep would leave NOTREADY sandboxes behind.
            remove_unparsable_configs(&kit.conf_dir());
            if let Err(p) = kit.teardown() {
                problems.extend(p);
            }
        }
        if let Some(api) = self.api.take() {
            api.stop();
        }
        self.runtime.shut_down();
        problems
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if std::thread::panicking() && !self.torn_down {
            let logs = self.agent_logs();
            let tail = &logs[logs.len().saturating_sub(8192)..];
            eprintln!("node in a box: the test panicked; agent logs (tail):\n{tail}");
        }
        let problems = self.teardown_now();
        if !problems.is_empty() {
            eprintln!(
                "node in a box: teardown left {} problem(s):\n  {}",
                problems.len(),
                problems.join("\n  ")
            );
        }
    }
}

fn remove_unparsable_configs(conf_dir: &Path) {
    let Ok(entries) = fs::read_dir(conf_dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let is_config = matches!(
            path.extension().and_then(|x| x.to_str()),
            Some("conf" | "conflist" | "json")
        );
        let parses = fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .is_some();
        if is_config && !parses {
            let _ = fs::remove_file(&path);
        }
    }
}

/// Files that left a directory (deleted, or renamed to another name), in order, as
/// inotify reports them; a file replaced by a rename onto its name does not count (it
/// never left).
#[derive(Debug)]
pub struct ConfDirWatch {
    inotify: inotify::Inotify,
    buffer: Vec<u8>,
}

impl ConfDirWatch {
    /// Watches `dir`.
    pub fn new(dir: &Path) -> io::Result<ConfDirWatch> {
        let inotify = inotify::Inotify::init()?;
        inotify.watches().add(
            dir,
            inotify::WatchMask::DELETE | inotify::WatchMask::MOVED_FROM,
        )?;
        Ok(ConfDirWatch {
            inotify,
            buffer: vec![0; 16 * 1024],
        })
    }

    /// The names removed or moved away since the last call (does not block).
    pub fn removed(&mut self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        loop {
            match self.inotify.read_events(&mut self.buffer) {
                Ok(events) => {
                    let before = names.len();
                    names.extend(
                        events.filter_map(|e| Some(e.name?.to_string_lossy().into_owned())),
                    );
                    if names.len() == before {
                        return Ok(names);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(names),
                Err(e) => return Err(e),
            }
        }
    }
}

/// The node's tokio runtime, shut down without blocking when dropped: a test may drop
/// the node inside its own runtime, where dropping a runtime the normal way panics.
struct OwnRuntime(Option<tokio::runtime::Runtime>);

impl OwnRuntime {
    fn get(&self) -> &tokio::runtime::Runtime {
        self.0.as_ref().expect("the node is torn down")
    }

    fn shut_down(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// Runs `fut` on `rt` from a scratch thread (so the caller may be inside a runtime).
fn on_runtime<F>(rt: &tokio::runtime::Runtime, fut: F) -> F::Output
where
    F: std::future::Future + Send,
    F::Output: Send,
{
    if tokio::runtime::Handle::try_current().is_err() {
        return rt.block_on(fut);
    }
    std::thread::scope(|s| {
        s.spawn(|| rt.block_on(fut))
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e))
    })
}

fn free_port() -> io::Result<SocketAddr> {
    TcpListener::bind("127.0.0.1:0")?.local_addr()
}

/// One `interlock agent` process, spawned from a thread that lives as long as it (so
/// `setpriv --pdeathsig KILL` kills it with the test process) and reaped there.
#[derive(Debug)]
pub struct AgentProcess {
    process: Daemon,
    health: SocketAddr,
    log: PathBuf,
}

impl AgentProcess {
    /// Spawns `binary args…` with `env` added, stderr and stdout to `log`; `health` is
    /// the `--health-addr` the arguments carry.
    pub fn spawn(
        binary: &Path,
        args: &[OsString],
        env: &[(OsString, OsString)],
        log: &Path,
        health: SocketAddr,
    ) -> io::Result<AgentProcess> {
        let out = File::create(log)?;
        let err = out.try_clone()?;
        let mut command = Command::new("setpriv");
        command
            .args(["--pdeathsig", "KILL", "--"])
            .arg(binary)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        Ok(AgentProcess {
            process: Daemon::spawn_command("interlock-agent".into(), command)?,
            health,
            log: log.to_path_buf(),
        })
    }

    /// The process ID.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The health server's address.
    pub fn health_addr(&self) -> SocketAddr {
        self.health
    }

    /// The log file (stdout and stderr).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The log so far.
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The exit status once it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.process.exited()
    }

    /// SIGTERM; SIGKILL if still running after `grace`. Returns the exit status (`None`
    /// only if even SIGKILL did not end it within 5 s).
    pub fn terminate(&mut self, grace: Duration) -> Option<ExitStatus> {
        self.process.terminate(grace)
    }

    /// SIGKILL, and waits up to 5 s for it to be reaped.
    pub fn kill(&mut self) -> Option<ExitStatus> {
        self.process.signal(nix::sys::signal::Signal::SIGKILL);
        self.process.wait_exit(Duration::from_secs(5))
    }

    /// GET `path` on the health server: (status, body), or `None` when not reachable.
    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        interlock_testkit::http::get(self.health, path, Duration::from_secs(2))
    }

    /// `/readyz` is 200 (`None`: not answering).
    pub fn ready(&self) -> Option<bool> {
        self.get("/readyz").map(|(c, _)| c == 200)
    }

    /// Waits until `/readyz` is 200; returns how long it took, or an error with the log.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<Duration, String> {
        wait_ready_at(self.health, &self.log, timeout)
    }

    /// The value of an unlabelled or fully spelled metric line, e.g.
    /// `interlock_sandboxes{verdict="protected"}`.
    pub fn metric(&self, name: &str) -> Option<f64> {
        let (_, body) = self.get("/metrics")?;
        body.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))?
            .rsplit(' ')
            .next()?
            .parse()
            .ok()
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

fn wait_ready_at(health: SocketAddr, log: &Path, timeout: Duration) -> Result<Duration, String> {
    let begin = Instant::now();
    loop {
        if interlock_testkit::http::get(health, "/readyz", Duration::from_secs(2))
            .is_some_and(|(c, _)| c == 200)
        {
            return Ok(begin.elapsed());
        }
        if begin.elapsed() > timeout {
            return Err(format!(
                "the agent was not ready within {timeout:?}; log:\n{}",
                fs::read_to_string(log).unwrap_or_default()
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The independent capture check (see the module docs): nothing of interlock is used.
///
/// In `netns`: listens on `0.0.0.0:<proxy_port>`; a child process as `uid` (and the
/// same GID) connects to `gateway:<p>`, where `p` is a port this check listens on in the
/// host's namespace. Connections the check did not cause are ignored by their source.
pub fn check_capture(netns: &Path, proxy_port: u16, uid: u32, gateway: Ipv4Addr) -> Capture {
    let host = match TcpListener::bind(SocketAddrV4::new(gateway, 0)) {
        Ok(l) => l,
        // No bridge address on the host: no sandbox has a network on it.
        Err(e) => return Capture::Failed(format!("listen on the gateway {gateway}: {e}")),
    };
    let _ = host.set_nonblocking(true);
    let destination = match host.local_addr() {
        Ok(SocketAddr::V4(a)) => a,
        other => return Capture::Failed(format!("host listener address: {other:?}")),
    };
    let checked = in_netns(netns, || {
        let Some(own_ip) = ipv4_address() else {
            return Capture::NoNetwork;
        };
        let proxy = match bind_retrying(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, proxy_port)) {
            Ok(l) => l,
            Err(e) => return Capture::Failed(format!("listen on {proxy_port}: {e}")),
        };
        let mut child = match Command::new("timeout")
            .args(["3", "bash", "-c"])
            .arg(format!(
                "exec 3<>/dev/tcp/{}/{} && sleep 0.3",
                destination.ip(),
                destination.port()
            ))
            .uid(uid)
            .gid(uid)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
        {
            Ok(c) => c,
            Err(e) => return Capture::Failed(format!("spawn the client: {e}")),
        };
        let deadline = Instant::now() + Duration::from_secs(3);
        // A connection for another destination is someone else's (guard mode's audit
        // probes the gateway once a proxy listens, and looks for the server side of its
        // connection: kept open until the check ends): not a verdict on ours, but said if
        // ours never arrives.
        let mut other_landing = None;
        let mut others = Vec::new();
        let verdict = loop {
            if let Ok((conn, peer)) = proxy.accept() {
                if peer.ip() == IpAddr::V4(own_ip) || peer.ip().is_loopback() {
                    match original_dst(&conn) {
                        Some(d) if d == destination => break Capture::Redirected,
                        other => {
                            other_landing = Some(format!(
                                "; a connection landed on the proxy port with original \
                                 destination {other:?}, not {destination}"
                            ));
                            others.push(conn);
                        }
                    }
                }
            }
            if let Ok((_, peer)) = host.accept() {
                if peer.ip() == IpAddr::V4(own_ip) {
                    break Capture::NotRedirected;
                }
            }
            if Instant::now() > deadline {
                break Capture::Failed(format!(
                    "no connection arrived anywhere{}",
                    other_landing.as_deref().unwrap_or("")
                ));
            }
            if let Ok(Some(status)) = child.try_wait() {
                if !status.success() {
                    let mut err = String::new();
                    if let Some(mut e) = child.stderr.take() {
                        let _ = e.read_to_string(&mut err);
                    }
                    break Capture::Failed(format!("connect failed ({status}): {}", err.trim()));
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        let _ = child.kill();
        let _ = child.wait();
        drop(others);
        verdict
    });
    match checked {
        Ok(verdict) => verdict,
        // The sandbox's netns is gone (stopped sandbox).
        Err(e) if e.kind() == io::ErrorKind::NotFound => Capture::NoNetwork,
        Err(e) => Capture::Failed(e.to_string()),
    }
}

/// Runs `f` on a scratch thread that has entered the network namespace at `netns` (a
/// sandbox's `/var/run/netns/cni-…`); sockets it opens stay in that namespace.
pub fn in_netns<R: Send>(netns: &Path, f: impl FnOnce() -> R + Send) -> io::Result<R> {
    let file = File::open(netns)
        .map_err(|e| io::Error::new(e.kind(), format!("open {}: {e}", netns.display())))?;
    std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| io::Error::other(format!("setns {}: {e}", netns.display())))?;
            Ok(f())
        })
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
    })
}

/// The calling thread's netns's first IPv4 address that is not loopback.
fn ipv4_address() -> Option<Ipv4Addr> {
    nix::ifaddrs::getifaddrs().ok()?.find_map(|ifa| {
        let a = ifa.address?.as_sockaddr_in()?.ip();
        (!a.is_loopback()).then_some(a)
    })
}

fn bind_retrying(addr: SocketAddrV4) -> io::Result<TcpListener> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match TcpListener::bind(addr) {
            Ok(l) => {
                l.set_nonblocking(true)?;
                return Ok(l);
            }
            // Another prober (the agent's audit) may hold the port for a moment.
            Err(e) if e.kind() == io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e),
        }
    }
}

fn original_dst(conn: &TcpStream) -> Option<SocketAddrV4> {
    let sa = nix::sys::socket::getsockopt(conn, nix::sys::socket::sockopt::OriginalDst).ok()?;
    Some(SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr)),
        u16::from_be(sa.sin_port),
    ))
}

/// The spec of a pod with `annotations`, bound to the node: an app container, and the
/// proxy container a mesh's injector adds when its annotation says it injected the pod
/// (as the injector writes them: Istio's proxy runs `proxy sidecar` as 1337).
pub fn pod_spec(annotations: &std::collections::BTreeMap<String, String>) -> Value {
    let mut containers = vec![json!({"name": "app", "image": "app"})];
    if annotations.contains_key("sidecar.istio.io/status") {
        containers.push(json!({"name": "istio-proxy", "image": "proxyv2",
            "args": ["proxy", "sidecar"],
            "securityContext": {"runAsUser": 1337, "runAsGroup": 1337}}));
    }
    if annotations.contains_key("linkerd.io/proxy-version") {
        containers.push(json!({"name": "linkerd-proxy", "image": "proxy"}));
    }
    if annotations
        .get("kuma.io/sidecar-injected")
        .map(String::as_str)
        == Some("true")
    {
        containers.push(json!({"name": "kuma-sidecar", "image": "kuma-dp",
            "securityContext": {"runAsUser": 5678, "runAsGroup": 5678}}));
    }
    json!({"nodeName": NODE_NAME, "containers": containers})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unparsable_configs_go_and_others_stay() {
        let dir = interlock_testkit::tempdir().unwrap();
        fs::write(
            dir.path().join("00-half.conflist"),
            "{\"cniVersion\": \"0.3",
        )
        .unwrap();
        fs::write(dir.path().join("10-ok.conflist"), "{}").unwrap();
        fs::write(dir.path().join("notes.txt"), "not json").unwrap();
        remove_unparsable_configs(dir.path());
        let mut left: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["10-ok.conflist", "notes.txt"]);
    }
}

//! One node of the demo: the test kit's node in a box ([`interlock_testkit_node::node`]: a
//! private containerd with the reference primary's plugins, the fake Kubernetes API, the
//! real `interlock agent` process) plus what the demo plays around it: the mesh CNI's
//! installer (without interlock), the kubelet's sandbox attempts, an operator running
//! `interlock check`, and reading the node and pods back from the API.
//!
//! Everything the demo writes lives in the kit's directory and goes with it; dropping
//! the node stops the agent and tears the kit down.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use interlock_contract::guard::GuardedMesh;
use interlock_contract::names::LABEL_UNPROTECTED;
use interlock_cri::SandboxConfig;
use interlock_mesh_standins::scenario::MeshBed;
use interlock_testkit::agent_standin::AgentStandIn;
use interlock_testkit_node::containerd::Footprint;
use interlock_testkit_node::kubeapi::KubeApi;
use interlock_testkit_node::node::{
    AgentArgs, Node, NodeOptions, PrimaryWrite, Sandbox, NODE_NAME, PRIMARY_CONFLIST,
    TAINT_NOT_READY,
};
use serde_json::{json, Value};

use crate::interrupt::{self, Interrupted};
use crate::pods::PodSpec;

/// The binaries under demonstration.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `interlock` (agent and CLI).
    pub interlock: PathBuf,
    /// `interlock-cni`.
    pub plugin: PathBuf,
    /// `mesh-standin`: the stand-in for a mesh's own CNI plugin and its installer.
    pub mesh_standin: PathBuf,
}

/// How the agent guards the node's config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// interlock-cni redirects (`--config-mode owned`).
    Owned,
    /// The mesh's own CNI plugin redirects; interlock-cni guards it (`--config-mode guard
    /// --guard-mesh <mesh>`).
    Guard(GuardedMesh),
}

impl Mode {
    /// The agent's flags (and `interlock check`'s environment) for this mode.
    fn flags(self) -> Vec<(&'static str, &'static str, String)> {
        match self {
            Mode::Owned => vec![("--config-mode", "INTERLOCK_CONFIG_MODE", "owned".into())],
            Mode::Guard(mesh) => vec![
                ("--config-mode", "INTERLOCK_CONFIG_MODE", "guard".into()),
                ("--guard-mesh", "INTERLOCK_GUARD_MESH", mesh.as_str().into()),
            ],
        }
    }
}

/// The node in a box itself, or one carrying a mesh's installer and plugin stand-ins.
enum Host {
    Plain(Box<Node>),
    Mesh(Box<MeshBed>),
}

/// `interlock check` as an operator ran it.
#[derive(Debug, Clone)]
pub struct CheckRun {
    /// Its exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    /// What it printed (stdout, then stderr when not empty).
    pub output: String,
}

/// The node as the Kubernetes API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    /// Whether the node carries `interlock.dev/not-ready`.
    pub tainted: bool,
    /// `InterlockReady`: (status, message), when the condition exists.
    pub condition: Option<(String, String)>,
    /// The reasons of the node's Events, oldest first.
    pub events: Vec<String>,
}

impl NodeView {
    /// Untainted with `InterlockReady=True`: the agent vouches for the node.
    pub fn ready(&self) -> bool {
        !self.tainted && self.condition.as_ref().is_some_and(|c| c.0 == "True")
    }
}

/// A pod as the Kubernetes API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    /// The `interlock.dev/unprotected` label's value, when set.
    pub unprotected_label: Option<String>,
    /// The reasons of the pod's Events, oldest first.
    pub events: Vec<String>,
}

/// One node of the demo.
pub struct DemoNode {
    /// What the mesh's own CNI plugin reads from the API server (the pods' specs: their
    /// proxy containers), served to the plugin standing in for it when interlock's agent
    /// does not run. Declared first: it stops before the node's directory goes.
    mesh_api: AgentStandIn,
    host: Host,
    bins: Binaries,
    /// The agent's `--config-mode` (and, in guard mode, `--guard-mesh`).
    mode: Mode,
    /// The demo's own files (plugin config, kubeconfig), inside the kit's directory.
    dir: PathBuf,
    /// A loopback address nothing listens on, for `check` before the agent runs.
    no_agent_yet: String,
    /// Whether the agent was started (then `check` asks its health address).
    agent_started: AtomicBool,
    /// Sandboxes the kubelet asked for per pod: a retry is the next attempt, as the
    /// kubelet counts them (containerd keeps a failed attempt's name reserved).
    attempts: Mutex<BTreeMap<String, u32>>,
}

impl DemoNode {
    /// Starts a node with the fake API; `startup_taint`: it registers with
    /// `interlock.dev/not-ready`, as a node pool set up for interlock does.
    pub fn start(bins: &Binaries, startup_taint: bool) -> Result<DemoNode, String> {
        let node = Node::start(node_options(bins, startup_taint).with_kube())
            .map_err(|e| format!("starting a node: {e}"))?;
        DemoNode::around(bins, Host::Plain(Box::new(node)), Mode::Owned)
    }

    /// Starts a node where `mesh`'s own CNI plugin redirects: its installer and plugin are
    /// the stand-ins (`mesh-standin`); with interlock, the agent runs in guard mode.
    pub fn start_guarded(
        bins: &Binaries,
        mesh: GuardedMesh,
        startup_taint: bool,
    ) -> Result<DemoNode, String> {
        let bed = MeshBed::start(mesh, &bins.mesh_standin, node_options(bins, startup_taint))
            .map_err(|e| format!("starting a node: {e}"))?;
        DemoNode::around(bins, Host::Mesh(Box::new(bed)), Mode::Guard(mesh))
    }

    fn around(bins: &Binaries, host: Host, mode: Mode) -> Result<DemoNode, String> {
        let node = match &host {
            Host::Plain(n) => n,
            Host::Mesh(bed) => &bed.node,
        };
        let dir = node.containerd().dir().join("demo");
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mesh_api = AgentStandIn::start(
            &dir.join("mesh-cni-api.sock"),
            interlock_testkit::pods::mesh_proxies(),
        )
        .map_err(|e| format!("the mesh plugin's pod source: {e}"))?;
        let demo = DemoNode {
            mesh_api,
            host,
            bins: bins.clone(),
            mode,
            dir,
            no_agent_yet: unused_loopback_port()?,
            agent_started: AtomicBool::new(false),
            attempts: Mutex::new(BTreeMap::new()),
        };
        demo.api()
            .write_kubeconfig(&demo.kubeconfig())
            .map_err(|e| format!("kubeconfig: {e}"))?;
        // The plugin settings interlock's manifests ship (deploy/interlock.yaml).
        let plugin_config = json!({
            "profiles": ["istio", "linkerd", "generic"],
            "excludeNamespaces": ["kube-system"],
            "agentSocket": demo.node().state_dir().join("agent.sock"),
        });
        std::fs::write(demo.plugin_config(), plugin_config.to_string())
            .map_err(|e| format!("plugin config: {e}"))?;
        Ok(demo)
    }

    fn node(&self) -> &Node {
        match &self.host {
            Host::Plain(n) => n,
            Host::Mesh(bed) => &bed.node,
        }
    }

    /// The mesh's installer and plugin stand-ins, on a node from
    /// [`DemoNode::start_guarded`].
    pub fn mesh(&mut self) -> Result<&mut MeshBed, String> {
        match &mut self.host {
            Host::Mesh(bed) => Ok(bed),
            Host::Plain(_) => Err("this node has no mesh stand-ins".into()),
        }
    }

    fn api(&self) -> &KubeApi {
        self.node()
            .api()
            .expect("DemoNode::start always starts the fake API")
    }

    fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    fn plugin_config(&self) -> PathBuf {
        self.dir.join("plugin-config.json")
    }

    /// The node's name in the API.
    pub fn name(&self) -> &'static str {
        NODE_NAME
    }

    /// The node's address on the pods' network (the bridge).
    pub fn gateway(&self) -> Ipv4Addr {
        self.node().gateway()
    }

    /// The config file names in the conf dir, sorted.
    pub fn conf_files(&self) -> Vec<String> {
        self.node().conf_files()
    }

    /// Whether the conf dir's `file` is a list with a plugin for which `is` holds.
    fn file_has(&self, file: &str, is: impl Fn(&Value) -> bool) -> bool {
        let list: Value = std::fs::read(self.node().conf_dir().join(file))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(Value::Null);
        list["plugins"]
            .as_array()
            .is_some_and(|plugins| plugins.iter().any(is))
    }

    /// Whether interlock-cni's entry in the conf dir's `file` holds meshed pods (its guard
    /// role's `hold`).
    pub fn guard_holds(&self, file: &str) -> bool {
        self.file_has(file, |p| {
            p["type"] == "interlock-cni" && p["guard"]["hold"] == true
        })
    }

    /// Whether the conf dir's `file` runs a plugin of type `plugin_type`.
    pub fn file_runs(&self, file: &str, plugin_type: &str) -> bool {
        self.file_has(file, |p| p["type"] == plugin_type)
    }

    /// What the node owns on the host, to check after teardown that nothing is left.
    pub fn footprint(&self) -> Footprint {
        self.node().footprint()
    }

    /// The primary CNI's DaemonSet writes its config (`10-calico.conflist`).
    pub fn write_primary(&self) -> Result<(), String> {
        self.node()
            .write_primary()
            .map(drop)
            .map_err(|e| format!("writing {PRIMARY_CONFLIST}: {e}"))
    }

    /// The mesh's plugin entry as a mesh CNI installer writes it, without interlock's
    /// agent (the plugin is interlock-cni, standing in for istio-cni or linkerd-cni; like
    /// them it learns each pod's spec, here from [`DemoNode::mesh_api`] where they ask
    /// the API server).
    fn plain_mesh_entry(&self) -> Value {
        json!({
            "type": "interlock-cni",
            "stateDir": self.node().state_dir(),
            "agentSocket": self.mesh_api.path(),
            "capabilities": {"io.kubernetes.cri.pod-annotations": true},
        })
    }

    /// The primary CNI's DaemonSet rewrites its config (a restart or an upgrade): the
    /// file as it writes it, without anything another installer appended.
    pub fn rewrite_primary(&self, how: PrimaryWrite) -> Result<(), String> {
        self.node()
            .rewrite_primary(how)
            .map(drop)
            .map_err(|e| format!("rewriting {PRIMARY_CONFLIST}: {e}"))
    }

    /// The mesh CNI's installer copies its binary and appends its entry to the
    /// primary's file, as istio-cni and linkerd-cni do when they find one.
    pub fn append_mesh_entry_to_primary(&self) -> Result<(), String> {
        self.node()
            .install_interlock_cni()
            .map_err(|e| format!("installing interlock-cni: {e}"))?;
        let mut list = self.node().primary_conflist();
        if let Some(plugins) = list["plugins"].as_array_mut() {
            plugins.push(self.plain_mesh_entry());
        }
        self.node()
            .containerd()
            .write_conf(PRIMARY_CONFLIST, &list)
            .map(drop)
            .map_err(|e| format!("rewriting {PRIMARY_CONFLIST}: {e}"))
    }

    /// The mesh CNI's installer finds no config and writes one of its own holding only
    /// its plugin; returns the file's name.
    pub fn write_mesh_only_config(&self) -> Result<&'static str, String> {
        const NAME: &str = "05-mesh-cni.conflist";
        self.node()
            .install_interlock_cni()
            .map_err(|e| format!("installing interlock-cni: {e}"))?;
        let list = json!({
            "cniVersion": "0.3.1",
            "name": "mesh-cni",
            "plugins": [self.plain_mesh_entry()],
        });
        self.node()
            .write_sorting_first(NAME, &list)
            .map(|_| NAME)
            .map_err(|e| format!("writing {NAME}: {e}"))
    }

    /// Starts `interlock agent` as its DaemonSet runs it (owned mode, the shipped plugin
    /// settings, the API, the CRI socket).
    pub fn start_agent(&self) -> Result<(), String> {
        let mut args: Vec<String> = Vec::new();
        for (flag, _, value) in self.mode.flags() {
            args.extend([flag.to_string(), value]);
        }
        args.extend([
            "--plugin-config".into(),
            self.plugin_config().display().to_string(),
        ]);
        self.node()
            .start_agent(AgentArgs::args(&args))
            .map_err(|e| format!("starting the agent: {e}"))?;
        self.agent_started.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// The agent's log so far.
    pub fn agent_log(&self) -> String {
        self.node().agent_logs()
    }

    /// The environment the agent's pod has (the DaemonSet's ConfigMap and fieldRefs):
    /// `interlock check` run there needs no flags.
    fn agent_env(&self) -> Vec<(&'static str, String)> {
        let path = |p: &Path| p.display().to_string();
        let mut env = vec![
            ("INTERLOCK_CNI_CONF_DIR", path(&self.node().conf_dir())),
            ("INTERLOCK_CNI_BIN_DIR", path(&self.node().bin_dir())),
            ("INTERLOCK_STATE_DIR", path(&self.node().state_dir())),
            (
                "INTERLOCK_CRI_ENDPOINT",
                self.node().containerd().endpoint(),
            ),
            (
                "INTERLOCK_RUNTIME_CONFIG",
                path(&self.node().containerd().config_path()),
            ),
            ("INTERLOCK_RUNTIME", "containerd".into()),
            ("INTERLOCK_PLUGIN_CONFIG", path(&self.plugin_config())),
            ("INTERLOCK_PLUGIN_SOURCE", path(&self.bins.plugin)),
            ("KUBECONFIG", path(&self.kubeconfig())),
            ("NODE_NAME", NODE_NAME.into()),
        ];
        env.extend(
            self.mode
                .flags()
                .into_iter()
                .map(|(_, var, value)| (var, value)),
        );
        if self.agent_started.load(Ordering::SeqCst) {
            let health = self.node().agent(|a| a.health_addr().to_string());
            env.push(("INTERLOCK_HEALTH_ADDR", health));
        } else {
            // As in the agent's pod before the agent listens: an address nobody answers.
            env.push(("INTERLOCK_HEALTH_ADDR", self.no_agent_yet.clone()));
        }
        env
    }

    fn check_command(&self) -> Command {
        let mut cmd = Command::new(&self.bins.interlock);
        cmd.arg("check").envs(self.agent_env()).stdin(Stdio::null());
        cmd
    }

    /// Runs `interlock check` with the agent's environment, as `kubectl exec` into the
    /// agent's pod would.
    pub fn check(&self) -> Result<CheckRun, String> {
        let out = self
            .check_command()
            .env("NO_COLOR", "1")
            .output()
            .map_err(|e| format!("running interlock check: {e}"))?;
        let mut output = String::from_utf8_lossy(&out.stdout).into_owned();
        let err = String::from_utf8_lossy(&out.stderr);
        if !err.trim().is_empty() {
            output.push_str(&err);
        }
        Ok(CheckRun {
            code: out.status.code(),
            output,
        })
    }

    /// `interlock check -o json`, parsed.
    pub fn check_json(&self) -> Result<Value, String> {
        let out = self
            .check_command()
            .args(["-o", "json"])
            .output()
            .map_err(|e| format!("running interlock check -o json: {e}"))?;
        serde_json::from_slice(&out.stdout).map_err(|e| {
            format!(
                "interlock check -o json printed no JSON document ({e}); stderr: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )
        })
    }

    /// Waits up to `timeout` for containerd to load a CNI config; `false` when it did
    /// not (the pods then show why).
    pub fn wait_network_ready(&self, timeout: Duration) -> bool {
        self.node().wait_network_ready(true, timeout).is_ok()
    }

    /// The scheduler binds `pod` to this node (it appears in the API) and the kubelet
    /// runs its sandbox over CRI; `Err` is containerd's refusal.
    pub fn run_pod(&self, pod: &PodSpec) -> Result<Sandbox, String> {
        let attempt = {
            let mut attempts = self.attempts.lock().unwrap_or_else(|e| e.into_inner());
            let next = attempts.entry(pod.full_name()).or_insert(0);
            *next += 1;
            *next - 1
        };
        let mut config = SandboxConfig::new(pod.namespace, pod.name, pod.uid()).attempt(attempt);
        for (k, v) in pod.mesh.annotations() {
            config = config.annotation(*k, *v);
        }
        self.node()
            .run_config(config)
            .map_err(|e| short_cri_error(&e))
    }

    /// The node as the API shows it now.
    pub fn node_view(&self) -> NodeView {
        let taints = self.node().taints();
        let condition = self.node().condition().map(|c| {
            (
                c["status"].as_str().unwrap_or("").to_string(),
                c["message"].as_str().unwrap_or("").to_string(),
            )
        });
        NodeView {
            tainted: taints.iter().any(|t| t == TAINT_NOT_READY),
            condition,
            events: self.event_reasons("Node", NODE_NAME),
        }
    }

    /// The pod as the API shows it now.
    pub fn pod_view(&self, pod: &PodSpec) -> PodView {
        let obj = self
            .api()
            .get_object("pods", pod.namespace, pod.name)
            .unwrap_or(Value::Null);
        PodView {
            unprotected_label: obj["metadata"]["labels"][LABEL_UNPROTECTED]
                .as_str()
                .map(str::to_string),
            events: self.event_reasons("Pod", pod.name),
        }
    }

    fn event_reasons(&self, kind: &str, name: &str) -> Vec<String> {
        let mut events: Vec<(u64, String)> = self
            .api()
            .objects("events")
            .into_iter()
            .filter(|e| e["regarding"]["kind"] == kind && e["regarding"]["name"] == name)
            .filter_map(|e| {
                let rv = e["metadata"]["resourceVersion"].as_str()?.parse().ok()?;
                Some((rv, e["reason"].as_str()?.to_string()))
            })
            .collect();
        events.sort();
        events.into_iter().map(|(_, r)| r).collect()
    }

    /// Waits up to `timeout` until `cond` holds for the node's API view.
    pub fn wait_node(
        &self,
        timeout: Duration,
        cond: impl Fn(&NodeView) -> bool,
    ) -> Result<bool, Interrupted> {
        wait_until(timeout, || cond(&self.node_view()))
    }

    /// Tears the node down now; returns what could not be undone.
    pub fn teardown(self) -> Vec<String> {
        match self.host {
            Host::Plain(node) => node.teardown().err().unwrap_or_default(),
            Host::Mesh(mut bed) => {
                // The installer first (it runs from the node's bin dir), then the node,
                // whose teardown on drop says on stderr what it could not undo; the
                // footprint check after it finds what is left.
                bed.kill_installer();
                drop(bed);
                Vec::new()
            }
        }
    }
}

/// The node's options: the binaries under demonstration, the startup taint.
fn node_options(bins: &Binaries, startup_taint: bool) -> NodeOptions {
    let mut options = NodeOptions::new(&bins.interlock, &bins.plugin);
    options.startup_taint = startup_taint;
    options
}

/// `127.0.0.1:<port>` where nothing listens: a port the kernel just handed out, closed.
fn unused_loopback_port() -> Result<String, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.to_string())
        .map_err(|e| format!("a free port: {e}"))
}

/// Polls `cond` every 10 ms for up to `timeout`; stops early on Ctrl-C.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> Result<bool, Interrupted> {
    let end = Instant::now() + timeout;
    loop {
        interrupt::check()?;
        if cond() {
            return Ok(true);
        }
        if Instant::now() >= end {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// containerd's error carries the whole story of the CNI call; keep the plugin that
/// failed and its message, or the last clause.
fn short_cri_error(e: &str) -> String {
    if let Some(i) = e.find("plugin type=") {
        return e[i..].to_string();
    }
    e.rsplit(": ").next().unwrap_or(e).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cni_failure_keeps_the_plugin_and_its_message() {
        let e = "RunPodSandbox shop/web at unix:///x: rpc error: code = Unknown desc = failed to setup network for sandbox \"abc\": plugin type=\"interlock-cni\" failed (add): needs the primary's result";
        assert_eq!(
            short_cri_error(e),
            "plugin type=\"interlock-cni\" failed (add): needs the primary's result"
        );
        assert_eq!(
            short_cri_error(
                "rpc error: code = Unknown desc = failed to create: cni plugin not initialized"
            ),
            "cni plugin not initialized"
        );
    }
}

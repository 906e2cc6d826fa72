//! One node in a box: a private containerd (the test kit) with the reference primary's
//! plugins, a fake Kubernetes API server holding the node and its pods, and — on the
//! "with interlock" side — the real `interlock agent` process pointed at all of it.
//!
//! The demo plays the parts that are not there: the primary CNI's and the mesh
//! installer's DaemonSets (they write files), and the scheduler and kubelet (a pod is
//! put into the API, bound to this node, and its sandbox is run over CRI). Dropping the
//! node stops the agent and tears the kit down (sandboxes, netns, bridge, directory).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use interlock_contract::names::{CONDITION_READY, TAINT_NOT_READY};
use interlock_cri::{CriClient, SandboxConfig};
use interlock_testkit::containerd::{Containerd, Footprint, PRIMARY_CONFLIST};
use interlock_testkit::kubeapi::KubeApi;
use serde_json::{json, Value};

use crate::pods::PodSpec;

/// The binaries under demonstration.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `interlock` (agent and CLI).
    pub interlock: PathBuf,
    /// `interlock-cni`.
    pub plugin: PathBuf,
}

/// The agent process; stopped (SIGKILL) when dropped.
#[derive(Debug)]
struct AgentProcess {
    child: Child,
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A pod whose sandbox runs.
#[derive(Debug, Clone)]
pub struct RunningPod {
    /// The sandbox ID.
    pub sandbox: String,
    /// The pod's IP on the primary's network.
    pub ip: IpAddr,
    /// Its network namespace file.
    pub netns: PathBuf,
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

/// A pod as the Kubernetes API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    /// The `interlock.dev/unprotected` label's value, when set.
    pub unprotected_label: Option<String>,
    /// The reasons of the pod's Events, oldest first.
    pub events: Vec<String>,
}

/// One node of the demo.
pub struct NodeInBox {
    // Dropped first: the agent stops before the runtime it watches is torn down.
    agent: Option<AgentProcess>,
    kit: Containerd,
    cri: CriClient,
    api: KubeApi,
    name: String,
    dir: tempfile::TempDir,
    health: SocketAddr,
    bins: Binaries,
    /// Sandboxes the kubelet asked for per pod: a retry is the next attempt, as the
    /// kubelet counts them (containerd keeps the name of a failed attempt reserved).
    attempts: Mutex<BTreeMap<String, u32>>,
}

impl NodeInBox {
    /// Starts containerd with the primary's plugins and `interlock-cni` in its bin dir
    /// (as a mesh's installer, or interlock's agent, would have put it there), and
    /// registers node `name` in a fresh API server; with `startup_taint` the node carries
    /// `interlock.dev/not-ready` as a node pool set up for interlock registers it.
    pub async fn start(
        name: &str,
        bins: &Binaries,
        startup_taint: bool,
    ) -> Result<NodeInBox, String> {
        let kit = Containerd::start().map_err(|e| format!("starting containerd: {e}"))?;
        kit.install_primary_plugins()
            .map_err(|e| format!("installing the reference CNI plugins: {e}"))?;
        let cri = CriClient::connect(&kit.endpoint())
            .await
            .map_err(|e| format!("connecting to containerd's CRI: {e}"))?;
        let api = KubeApi::start().map_err(|e| format!("starting the fake API server: {e}"))?;
        let taints = if startup_taint {
            json!([{"key": TAINT_NOT_READY, "effect": "NoSchedule"}])
        } else {
            json!([])
        };
        api.put_object(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/os": "linux"}},
            "spec": {"taints": taints}}));
        let dir = tempfile::Builder::new()
            .prefix("interlock-demo-")
            .tempdir()
            .map_err(|e| format!("a temp dir: {e}"))?;
        for sub in ["state", "plain-state"] {
            std::fs::create_dir_all(dir.path().join(sub)).map_err(|e| e.to_string())?;
        }
        api.write_kubeconfig(&dir.path().join("kubeconfig"))
            .map_err(|e| format!("kubeconfig: {e}"))?;
        let plugin_config = json!({
            "profiles": ["istio", "linkerd", "generic"],
            "excludeNamespaces": ["kube-system"],
            "agentSocket": dir.path().join("state").join("agent.sock"),
        });
        std::fs::write(
            dir.path().join("plugin-config.json"),
            plugin_config.to_string(),
        )
        .map_err(|e| e.to_string())?;
        let health = free_port().map_err(|e| format!("a free port: {e}"))?;
        Ok(NodeInBox {
            agent: None,
            kit,
            cri,
            api,
            name: name.to_string(),
            dir,
            health,
            bins: bins.clone(),
            attempts: Mutex::new(BTreeMap::new()),
        })
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node's address on the pods' network (the bridge).
    pub fn gateway(&self) -> Ipv4Addr {
        self.kit.gateway()
    }

    /// The CNI conf dir containerd watches.
    pub fn conf_dir(&self) -> PathBuf {
        self.kit.conf_dir()
    }

    fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// What the node owns on the host, to check after teardown that nothing is left.
    pub fn footprint(&self) -> Footprint {
        self.kit.footprint()
    }

    /// The primary CNI's DaemonSet writes its config (`10-calico.conflist`).
    pub fn write_primary(&self) -> Result<(), String> {
        self.kit
            .write_primary_config()
            .map(drop)
            .map_err(|e| format!("writing {PRIMARY_CONFLIST}: {e}"))
    }

    /// The mesh's plugin entry as a mesh CNI installer writes it, without interlock's
    /// agent (the plugin binary is interlock-cni, standing in for istio-cni/linkerd-cni).
    fn plain_mesh_entry(&self) -> Value {
        json!({
            "type": "interlock-cni",
            "stateDir": self.dir.path().join("plain-state"),
            "capabilities": {"io.kubernetes.cri.pod-annotations": true},
        })
    }

    /// The mesh CNI's installer copies its binary into the bin dir.
    pub fn install_mesh_binary(&self) -> Result<(), String> {
        self.kit
            .install_plugin(&self.bins.plugin, "interlock-cni")
            .map_err(|e| format!("installing interlock-cni: {e}"))
    }

    /// The mesh CNI's installer appends its entry to the primary's file, as istio-cni and
    /// linkerd-cni do when they find one.
    pub fn append_mesh_entry_to_primary(&self) -> Result<(), String> {
        self.install_mesh_binary()?;
        let mut list = self.kit.primary_conflist();
        if let Some(plugins) = list["plugins"].as_array_mut() {
            plugins.push(self.plain_mesh_entry());
        }
        self.kit
            .write_conf(PRIMARY_CONFLIST, &list)
            .map(drop)
            .map_err(|e| format!("rewriting {PRIMARY_CONFLIST}: {e}"))
    }

    /// The mesh CNI's installer finds no config and writes one of its own, holding only
    /// its plugin; returns the file's name.
    pub fn write_mesh_only_config(&self) -> Result<&'static str, String> {
        const NAME: &str = "05-mesh-cni.conflist";
        self.install_mesh_binary()?;
        let list = json!({
            "cniVersion": "0.3.1",
            "name": "mesh-cni",
            "plugins": [self.plain_mesh_entry()],
        });
        self.kit
            .write_conf(NAME, &list)
            .map(|_| NAME)
            .map_err(|e| format!("writing {NAME}: {e}"))
    }

    /// Starts `interlock agent` as its DaemonSet would run it on this node.
    pub fn start_agent(&mut self) -> Result<(), String> {
        let log = std::fs::File::create(self.dir.path().join("agent.log"))
            .map_err(|e| format!("agent log: {e}"))?;
        let mut cmd = Command::new(&self.bins.interlock);
        cmd.arg("agent")
            .envs(self.agent_env())
            .arg("--plugin-source")
            .arg(&self.bins.plugin)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        // Its own process group: a Ctrl-C on the terminal reaches the demo only, which
        // then stops the agent in order.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let child = cmd
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.bins.interlock.display()))?;
        self.agent = Some(AgentProcess { child });
        Ok(())
    }

    /// The environment the agent's pod has (the DaemonSet's ConfigMap and fieldRefs),
    /// which `interlock check` reads too.
    fn agent_env(&self) -> Vec<(&'static str, String)> {
        let path = |p: &Path| p.display().to_string();
        vec![
            ("INTERLOCK_CNI_CONF_DIR", path(&self.kit.conf_dir())),
            ("INTERLOCK_CNI_BIN_DIR", path(&self.kit.bin_dir())),
            ("INTERLOCK_STATE_DIR", path(&self.state_dir())),
            ("INTERLOCK_HEALTH_ADDR", self.health.to_string()),
            ("INTERLOCK_CRI_ENDPOINT", self.kit.endpoint()),
            ("INTERLOCK_RUNTIME", "containerd".into()),
            ("INTERLOCK_CONFIG_MODE", "owned".into()),
            ("INTERLOCK_KUBE", "auto".into()),
            (
                "INTERLOCK_PLUGIN_CONFIG",
                path(&self.dir.path().join("plugin-config.json")),
            ),
            ("KUBECONFIG", path(&self.dir.path().join("kubeconfig"))),
            ("NODE_NAME", self.name.clone()),
        ]
    }

    /// The agent's log so far.
    pub fn agent_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default()
    }

    fn check_command(&self) -> Command {
        let mut cmd = Command::new(&self.bins.interlock);
        cmd.arg("check")
            .envs(self.agent_env())
            .env("INTERLOCK_PLUGIN_SOURCE", &self.bins.plugin)
            .stdin(Stdio::null());
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

    /// Whether containerd has a CNI config loaded (CRI `NetworkReady`).
    pub async fn network_ready(&self) -> bool {
        self.cri.status().await.is_ok_and(|s| s.network_ready())
    }

    /// Waits up to `timeout` for containerd to load a CNI config.
    pub async fn wait_network_ready(&self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        loop {
            if self.network_ready().await {
                return true;
            }
            if Instant::now() >= end {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The scheduler binds `pod` to this node (it appears in the API) and the kubelet
    /// runs its sandbox over CRI.
    pub async fn run_pod(&self, pod: &PodSpec) -> Result<RunningPod, String> {
        self.api.put_object(pod.api_object(&self.name));
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
        let sandbox = self
            .cri
            .run_sandbox(&config)
            .await
            .map_err(|e| short_cri_error(&e.to_string()))?;
        let status = self
            .cri
            .sandbox_status(&sandbox, true)
            .await
            .map_err(|e| e.to_string())?;
        let ip = status
            .ips
            .first()
            .copied()
            .ok_or_else(|| format!("sandbox {sandbox} has no IP"))?;
        let netns = status
            .netns_path()
            .map(Path::to_path_buf)
            .ok_or_else(|| format!("sandbox {sandbox} has no netns path"))?;
        Ok(RunningPod { sandbox, ip, netns })
    }

    /// The node as the API shows it now.
    pub fn node_view(&self) -> NodeView {
        let node = self
            .api
            .get_object("nodes", "", &self.name)
            .unwrap_or(Value::Null);
        let tainted = node["spec"]["taints"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["key"] == TAINT_NOT_READY));
        let condition = node["status"]["conditions"].as_array().and_then(|cs| {
            cs.iter().find(|c| c["type"] == CONDITION_READY).map(|c| {
                (
                    c["status"].as_str().unwrap_or("").to_string(),
                    c["message"].as_str().unwrap_or("").to_string(),
                )
            })
        });
        NodeView {
            tainted,
            condition,
            events: self.event_reasons("Node", &self.name),
        }
    }

    /// The pod as the API shows it now.
    pub fn pod_view(&self, pod: &PodSpec) -> PodView {
        let obj = self
            .api
            .get_object("pods", pod.namespace, pod.name)
            .unwrap_or(Value::Null);
        PodView {
            unprotected_label: obj["metadata"]["labels"]
                [interlock_contract::names::LABEL_UNPROTECTED]
                .as_str()
                .map(str::to_string),
            events: self.event_reasons("Pod", pod.name),
        }
    }

    fn event_reasons(&self, kind: &str, name: &str) -> Vec<String> {
        let mut events: Vec<Value> = self
            .api
            .objects("events")
            .into_iter()
            .filter(|e| e["regarding"]["kind"] == kind && e["regarding"]["name"] == name)
            .collect();
        events.sort_by_key(|e| {
            e["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|v| v.parse::<u64>().ok())
        });
        events
            .iter()
            .filter_map(|e| e["reason"].as_str().map(str::to_string))
            .collect()
    }

    /// Waits up to `timeout` until `cond` holds for the node's API view.
    pub async fn wait_node(&self, timeout: Duration, cond: impl Fn(&NodeView) -> bool) -> bool {
        let end = Instant::now() + timeout;
        loop {
            if cond(&self.node_view()) {
                return true;
            }
            if Instant::now() >= end {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Tears the node down now; returns what could not be undone.
    pub fn teardown(mut self) -> Vec<String> {
        self.agent = None;
        match self.kit.teardown() {
            Ok(()) => Vec::new(),
            Err(problems) => problems,
        }
    }
}

/// containerd's errors carry the whole CNI chain's story; the reason is at the end.
fn short_cri_error(e: &str) -> String {
    let last = e.rsplit(": ").next().unwrap_or(e);
    let plugin = e.find("plugin type=").map(|i| &e[i..]);
    match plugin {
        Some(p) => p
            .split(" failed")
            .next()
            .map_or_else(|| last.to_string(), |who| format!("{who}: {last}")),
        None => last.to_string(),
    }
}

fn free_port() -> std::io::Result<SocketAddr> {
    TcpListener::bind("127.0.0.1:0")?.local_addr()
}

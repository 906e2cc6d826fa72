//! A test-owned node: a "node" netns in which the chain `bridge` (+ `host-local`) →
//! `interlock-cni` runs, creating its bridge there, and one netns per pod given as
//! `CNI_NETNS`. Listeners and connections inside those namespaces. Everything is torn
//! down on drop (pods first, then the node with its bridge).

#![allow(dead_code)]

use std::fs;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::symlink;
use std::path::PathBuf;

use interlock_cni_types::{CniResult, Command as Verb};
use interlock_libcni::exec::{exec_plugin, Attachment, Chain, ExecError};
use interlock_libcni::{parse_conflist, RuntimeConf};
pub use interlock_testkit::traffic::*;
use interlock_testkit::{cni_plugins_dir, tempdir, unique, Netns, TempDir};
use serde_json::{json, Value};

pub const SUBNET4: &str = "10.99.7.0/24";
pub const SUBNET6: &str = "fd99:7::/64";

/// A mesh profile's conventions, as the tests check them with traffic.
pub struct Mesh {
    pub annotations: &'static [(&'static str, &'static str)],
    pub profile: &'static str,
    pub outbound: u16,
    pub inbound: u16,
    pub uid: u32,
}

pub const ISTIO: Mesh = Mesh {
    annotations: &[(
        "sidecar.istio.io/status",
        "{\"containers\":[\"istio-proxy\"]}",
    )],
    profile: "istio",
    outbound: 15001,
    inbound: 15006,
    uid: 1337,
};

pub const LINKERD: Mesh = Mesh {
    annotations: &[("linkerd.io/proxy-version", "stable-2.14.10")],
    profile: "linkerd",
    outbound: 4140,
    inbound: 4143,
    uid: 2102,
};

impl Mesh {
    pub fn annotations(&self) -> Value {
        Value::Object(
            self.annotations
                .iter()
                .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
                .collect(),
        )
    }
}

/// The node: its netns, plugin dir, host-local data dir, interlock state dir, and a
/// stand-in for the agent's socket in the state dir (the plugin asks it for the spec of
/// Istio and Linkerd pods; its answer: a pod running both proxies).
pub struct Node {
    pub agent: interlock_testkit::agent_standin::AgentStandIn,
    pub state: TempDir,
    pub bins: TempDir,
    pub data: TempDir,
    pub bridge: String,
    /// host-local hands out IPv4 addresses.
    pub v4: bool,
    /// host-local hands out IPv6 addresses.
    pub dual: bool,
    pub node: Netns,
}

/// One pod attached through the chain.
pub struct Pod {
    pub name: String,
    pub rt: RuntimeConf,
    pub result: CniResult,
    pub ns: Netns,
}

impl Pod {
    /// The pod's address of one family from the chain's result.
    pub fn ip(&self, v6: bool) -> IpAddr {
        self.result
            .ips_on("eth0")
            .iter()
            .filter_map(|c| c.ip())
            .find(|ip| ip.is_ipv6() == v6)
            .unwrap_or_else(|| panic!("pod {} has no v6={v6} address", self.name))
    }

    pub fn families(&self) -> Vec<bool> {
        let mut out = Vec::new();
        if self
            .result
            .ips_on("eth0")
            .iter()
            .any(|c| c.ip().is_some_and(|i| i.is_ipv4()))
        {
            out.push(false);
        }
        if self
            .result
            .ips_on("eth0")
            .iter()
            .any(|c| c.ip().is_some_and(|i| i.is_ipv6()))
        {
            out.push(true);
        }
        out
    }
}

impl Node {
    /// A node whose primary gives IPv4, and IPv6 too when `dual`.
    pub fn new(dual: bool) -> Node {
        Node::with_families(true, dual)
    }

    /// A node whose primary gives the families asked for (at least one).
    pub fn with_families(v4: bool, v6: bool) -> Node {
        let node = Netns::new("node").unwrap();
        let bins = tempdir().unwrap();
        fs::copy(
            env!("CARGO_BIN_EXE_interlock-cni"),
            bins.path().join("interlock-cni"),
        )
        .unwrap();
        for p in ["bridge", "host-local", "loopback"] {
            symlink(cni_plugins_dir().join(p), bins.path().join(p)).unwrap();
        }
        let state = tempdir().unwrap();
        let agent = interlock_testkit::agent_standin::AgentStandIn::start(
            &state.path().join("agent.sock"),
            interlock_testkit::pods::mesh_proxies(),
        )
        .unwrap();
        Node {
            agent,
            state,
            bins,
            data: tempdir().unwrap(),
            bridge: unique("br"),
            v4,
            dual: v6,
            node,
        }
    }

    pub fn log_path(&self) -> PathBuf {
        self.state.path().join("plugin.log")
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The interlock-cni entry: defaults for the tests (the agent stand-in's socket as
    /// `agentSocket`), overridden by `extra` (a `null` value removes the field).
    pub fn interlock_entry(&self, extra: Value) -> Value {
        let mut e = json!({
            "type": "interlock-cni",
            "stateDir": self.state.path(),
            "logFile": self.log_path(),
            "logLevel": "debug",
            "capabilities": {"io.kubernetes.cri.pod-annotations": true},
            "excludeNamespaces": ["kube-system"],
            "agentSocket": self.agent.path(),
        });
        for (k, v) in extra.as_object().unwrap() {
            if v.is_null() {
                e.as_object_mut().unwrap().remove(k);
            } else {
                e[k] = v.clone();
            }
        }
        e
    }

    /// `bridge` (+ host-local, v4 and optionally v6) → `interlock-cni`.
    pub fn chain(&self, interlock: Value) -> Chain {
        let mut ranges = Vec::new();
        let mut routes = Vec::new();
        if self.v4 {
            ranges.push(json!([{ "subnet": SUBNET4 }]));
            routes.push(json!({"dst": "0.0.0.0/0"}));
        }
        if self.dual {
            ranges.push(json!([{ "subnet": SUBNET6 }]));
        }
        if !self.v4 {
            routes.push(json!({"dst": "::/0"}));
        }
        let doc = json!({
            "cniVersion": "1.0.0",
            "name": "ilnet",
            "plugins": [
                {
                    "type": "bridge", "bridge": self.bridge, "isGateway": true, "ipMasq": false,
                    "ipam": {
                        "type": "host-local",
                        "ranges": ranges,
                        "routes": routes,
                        "dataDir": self.data.path()
                    }
                },
                self.interlock_entry(interlock),
            ]
        });
        let list = parse_conflist(doc.to_string().as_bytes()).unwrap();
        Chain::new(list, vec![self.bins.path().to_path_buf()]).unwrap()
    }

    /// The same chain reduced to interlock-cni alone (for CHECK and re-ADD).
    pub fn only_interlock(&self, chain: &Chain) -> Chain {
        let mut only = chain.list().clone();
        only.plugins_mut().drain(0..1);
        Chain::new(only, vec![self.bins.path().to_path_buf()]).unwrap()
    }

    pub fn runtime_conf(&self, ns: &Netns, name: &str, annotations: Option<Value>) -> RuntimeConf {
        let cid = unique("sbx");
        let rt = RuntimeConf::new(&cid, &ns.path().display().to_string(), "eth0")
            .with_arg("IgnoreUnknown", "1")
            .with_arg("K8S_POD_NAMESPACE", "shop")
            .with_arg("K8S_POD_NAME", name)
            .with_arg("K8S_POD_INFRA_CONTAINER_ID", &cid)
            .with_arg("K8S_POD_UID", &format!("uid-{name}"));
        match annotations {
            Some(a) => rt.with_capability("io.kubernetes.cri.pod-annotations", a),
            None => rt,
        }
    }

    /// Creates a pod netns and runs the chain's ADD for it (inside the node netns).
    pub fn try_add(
        &self,
        chain: &Chain,
        name: &str,
        annotations: Option<Value>,
    ) -> (Netns, RuntimeConf, Result<CniResult, ExecError>) {
        let ns = Netns::new("pod").unwrap();
        let rt = self.runtime_conf(&ns, name, annotations);
        let r = self.node.run(|| chain.add(&rt));
        (ns, rt, r)
    }

    pub fn add(&self, chain: &Chain, name: &str, annotations: Option<Value>) -> Pod {
        let (ns, rt, r) = self.try_add(chain, name, annotations);
        let result = r.unwrap_or_else(|e| panic!("ADD {name}: {e}\nlog:\n{}", self.log()));
        Pod {
            name: name.to_string(),
            rt,
            result,
            ns,
        }
    }

    /// ADD of interlock-cni alone with the pod's chain result as `prevResult` (what a
    /// runtime's retry of the last plugin looks like; re-applies the rules).
    pub fn readd(&self, only: &Chain, pod: &Pod) -> Result<CniResult, ExecError> {
        let out = self.exec_interlock(only, Verb::Add, &pod.rt, &pod.result)?;
        Ok(CniResult::parse(&out, None).unwrap())
    }

    /// interlock-cni alone (`only`), run like the runtime runs the last plugin of a
    /// chain: `verb` for `rt`, with `prev` as prevResult, inside the node netns.
    pub fn exec_interlock(
        &self,
        only: &Chain,
        verb: Verb,
        rt: &RuntimeConf,
        prev: &CniResult,
    ) -> Result<Vec<u8>, ExecError> {
        let conf = only.plugin_config(0, Some(prev), rt);
        let stdin = serde_json::to_vec(&conf).unwrap();
        let path = self.bins.path().join("interlock-cni");
        self.node
            .run(|| exec_plugin(&path, verb, rt, &[self.bins.path().into()], &stdin))
    }

    /// GC through interlock-cni alone at 1.1.0 (the reference plugins stop at 1.0.0),
    /// keeping `valid` (container ID, ifname).
    pub fn gc(&self, valid: &[(&str, &str)]) {
        let doc = json!({
            "cniVersion": "1.1.0", "name": "ilnet",
            "plugins": [self.interlock_entry(json!({ "backend": "nftables" }))],
        });
        let list = parse_conflist(doc.to_string().as_bytes()).unwrap();
        let chain = Chain::new(list, vec![self.bins.path().into()]).unwrap();
        let valid: Vec<Attachment> = valid
            .iter()
            .map(|(cid, ifname)| Attachment {
                container_id: cid.to_string(),
                ifname: ifname.to_string(),
            })
            .collect();
        self.node.run(|| chain.gc(&valid)).unwrap();
    }

    /// The state of attachment (`rt`'s container ID, `ifname`).
    pub fn state_of_if(&self, rt: &RuntimeConf, ifname: &str) -> Option<Value> {
        let p = self
            .state
            .path()
            .join(format!("attachments/{}+{ifname}.json", rt.container_id));
        fs::read(p)
            .ok()
            .map(|b| serde_json::from_slice(&b).unwrap())
    }

    pub fn check(&self, only: &Chain, pod: &Pod) -> Result<(), ExecError> {
        self.node.run(|| only.check(&pod.rt, &pod.result))
    }

    pub fn del(&self, chain: &Chain, pod: &Pod) -> Result<(), ExecError> {
        self.node.run(|| chain.del(&pod.rt, Some(&pod.result)))
    }

    pub fn state_of(&self, rt: &RuntimeConf) -> Option<Value> {
        self.state_of_if(rt, "eth0")
    }
}

/// The CNI error code and message of a failed chain call.
pub fn cni_error(e: &ExecError) -> (u32, String) {
    match e {
        ExecError::Failed { error, .. } => (error.code, error.msg.clone()),
        other => panic!("not a plugin failure: {other}"),
    }
}

pub fn family(v6: bool) -> interlock_redirect::spec::Family {
    if v6 {
        interlock_redirect::spec::Family::V6
    } else {
        interlock_redirect::spec::Family::V4
    }
}

/// Waits (up to 5 s) until no IPv6 address in `ns` is tentative (duplicate address
/// detection finished), so it can be used as a source or destination.
pub fn wait_dad(ns: &Netns) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let out = ns.exec_ok(&["ip", "-6", "addr"]);
        if !out.contains("tentative") {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "DAD did not finish in {}: {out}",
            ns.name()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The IPv6 link-local address of `dev` in `ns`.
pub fn link_local(ns: &Netns, dev: &str) -> std::net::Ipv6Addr {
    let out = ns.exec_ok(&[
        "ip", "-6", "-o", "addr", "show", "dev", dev, "scope", "link",
    ]);
    out.split_whitespace()
        .skip_while(|w| *w != "inet6")
        .nth(1)
        .and_then(|a| a.split('/').next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no link-local address on {dev} in {}: {out}", ns.name()))
}

/// The interface index of `dev` in `ns` (the scope id of its link-local addresses).
pub fn ifindex(ns: &Netns, dev: &str) -> u32 {
    let out = ns.exec_ok(&["ip", "-o", "link", "show", "dev", dev]);
    out.split(':').next().unwrap().trim().parse().unwrap()
}

/// Tries to connect from inside `ns` as root within `within`; true when established. The
/// socket stays open for half a second so the peer can accept it.
pub fn try_connect(ns: &Netns, to: SocketAddr, within: std::time::Duration) -> bool {
    ns.run(|| match std::net::TcpStream::connect_timeout(&to, within) {
        Ok(s) => {
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(500));
                drop(s);
            });
            true
        }
        Err(_) => false,
    })
}

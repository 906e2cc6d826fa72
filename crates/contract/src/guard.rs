//! Guard mode: interlock keeps a mesh's *own* CNI plugin (istio-cni, linkerd-cni,
//! consul-cni, kuma-cni) in the effective chain and writes no redirection rules itself.
//!
//! What the plugin, the agent and the CLI share about a guarded mesh: its name
//! ([`GuardedMesh`]), the plugin `type` that must run, the static facts of its installer
//! and proxy that guard mode depends on, and `interlock-cni`'s guard role in the chain
//! ([`GuardRole`]).
//!
//! The facts come from each mesh's own sources:
//! - istio/istio `cni/pkg/install/{install.go,cniconfig.go}`, `cni/pkg/plugin/plugin.go`,
//!   `tools/istio-iptables/pkg/constants/constants.go`;
//! - linkerd/linkerd2-proxy-init `internal/cni/*.go`, `cni-plugin/main.go`, and
//!   linkerd/linkerd2 `charts/linkerd2-cni/values.yaml`;
//! - hashicorp/consul-k8s `control-plane/subcommand/install-cni/*.go`,
//!   `control-plane/cni/main.go`, `sdk/iptables` of hashicorp/consul;
//! - kumahq/kuma `app/cni/pkg/install/*.go`, `app/cni/pkg/cni/*.go`,
//!   `pkg/transparentproxy/config/config.go`.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::pod::PodFacts;

/// A mesh whose own CNI plugin interlock can guard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GuardedMesh {
    /// Istio in sidecar mode, plugin `istio-cni`.
    Istio,
    /// Linkerd, plugin `linkerd-cni`.
    Linkerd,
    /// consul-k8s transparent proxy, plugin `consul-cni`.
    Consul,
    /// Kuma, plugin `kuma-cni`.
    Kuma,
}

/// Where a mesh's installer puts its plugin entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstallerTarget {
    /// The first valid config file when the installer process starts; that file stays its
    /// target for the life of the process (istio-cni).
    FirstValidAtStart,
    /// Every `.conf`/`.conflist` file in the directory, again whenever one changes
    /// (linkerd-cni).
    EveryFile,
    /// The first valid file, chosen again on every directory event (consul-cni).
    FirstValidEachEvent,
    /// One file named in the mesh's chart (kuma-cni, `cni.confName`).
    NamedFile,
}

impl GuardedMesh {
    /// Every guarded mesh.
    pub const ALL: [GuardedMesh; 4] = [
        GuardedMesh::Istio,
        GuardedMesh::Linkerd,
        GuardedMesh::Consul,
        GuardedMesh::Kuma,
    ];

    /// The name used in configuration and flags (`istio`, `linkerd`, `consul`, `kuma`).
    pub fn as_str(self) -> &'static str {
        match self {
            GuardedMesh::Istio => "istio",
            GuardedMesh::Linkerd => "linkerd",
            GuardedMesh::Consul => "consul",
            GuardedMesh::Kuma => "kuma",
        }
    }

    /// The `type` (and binary name) of the mesh's CNI plugin.
    pub fn plugin_type(self) -> &'static str {
        match self {
            GuardedMesh::Istio => "istio-cni",
            GuardedMesh::Linkerd => "linkerd-cni",
            GuardedMesh::Consul => "consul-cni",
            GuardedMesh::Kuma => "kuma-cni",
        }
    }

    /// The mesh whose plugin has this `type`.
    pub fn from_plugin_type(t: &str) -> Option<GuardedMesh> {
        GuardedMesh::ALL.into_iter().find(|m| m.plugin_type() == t)
    }

    /// Where the installer writes its entry.
    pub fn installer_target(self) -> InstallerTarget {
        match self {
            GuardedMesh::Istio => InstallerTarget::FirstValidAtStart,
            GuardedMesh::Linkerd => InstallerTarget::EveryFile,
            GuardedMesh::Consul => InstallerTarget::FirstValidEachEvent,
            GuardedMesh::Kuma => InstallerTarget::NamedFile,
        }
    }

    /// True when the installer insists on its entry being the last plugin of the list
    /// and rewrites the file otherwise (consul-k8s). The others append last but accept
    /// any position.
    pub fn must_be_last(self) -> bool {
        self == GuardedMesh::Consul
    }

    /// True when the mesh's CNI DaemonSet runs with `hostNetwork`, so its own pod needs
    /// no CNI ADD to start. Only istio-cni's does: a hold that refused every pod would
    /// keep the other three installers off the node for good.
    pub fn installer_host_network(self) -> bool {
        self == GuardedMesh::Istio
    }

    /// The proxy's outbound capture port when nothing in the pod or entry says otherwise.
    pub fn default_outbound_port(self) -> u16 {
        match self {
            GuardedMesh::Istio | GuardedMesh::Consul | GuardedMesh::Kuma => 15001,
            GuardedMesh::Linkerd => 4140,
        }
    }

    /// The proxy's inbound capture port when nothing in the pod or entry says otherwise.
    pub fn default_inbound_port(self) -> u16 {
        match self {
            GuardedMesh::Istio | GuardedMesh::Kuma => 15006,
            GuardedMesh::Linkerd => 4143,
            GuardedMesh::Consul => 20000,
        }
    }

    /// The proxy's UID when nothing in the pod or entry says otherwise.
    pub fn default_proxy_uid(self) -> u32 {
        match self {
            GuardedMesh::Istio => 1337,
            GuardedMesh::Linkerd => 2102,
            GuardedMesh::Consul => 5995,
            GuardedMesh::Kuma => 5678,
        }
    }
}

impl std::fmt::Display for GuardedMesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A mesh name that is not one interlock can guard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownMesh(pub String);

impl std::fmt::Display for UnknownMesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "unknown guarded mesh {:?}: expected istio, linkerd, consul or kuma",
            self.0
        )
    }
}

impl std::error::Error for UnknownMesh {}

impl FromStr for GuardedMesh {
    type Err = UnknownMesh;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        GuardedMesh::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| UnknownMesh(s.to_string()))
    }
}

/// `interlock-cni`'s role in a guard-mode chain (the entry's `guard` field): it writes no
/// rules; it holds meshed pods back ("try again later") while the mesh's plugin cannot
/// run, and lets every other pod through, the mesh's own installer pod included.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GuardRole {
    /// The mesh whose plugin follows in the chain.
    pub mesh: GuardedMesh,
    /// True while the mesh's plugin is not in the chain: meshed pods are refused.
    #[serde(default)]
    pub hold: bool,
    /// Why the chain is held, for the error a refused pod gets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Namespaces the mesh's plugin never touches (copied from its entry).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude_namespaces: Vec<String>,
}

/// The annotation and container names guard-mode recognition reads, per mesh. Each is
/// the name the mesh's own plugin (or its injector, which writes what the plugin reads)
/// uses.
pub mod keys {
    /// Istio (istio/istio `cni/pkg/plugin/plugin.go`, `kubernetes.go`).
    pub mod istio {
        /// Written by the injector on every pod it injects.
        pub const STATUS: &str = "sidecar.istio.io/status";
        /// `"false"` opts a pod out (the label of the same name wins over the annotation).
        pub const INJECT: &str = "sidecar.istio.io/inject";
        /// The proxy container (a native sidecar is an init container of that name).
        pub const PROXY: &str = "istio-proxy";
        /// The init container that writes the rules itself (no CNI).
        pub const INIT: &str = "istio-init";
    }
    /// Linkerd (linkerd/linkerd2-proxy-init `cni-plugin/main.go`).
    pub mod linkerd {
        /// Written by the injector on every pod it gives a `linkerd-proxy` container.
        pub const PROXY_VERSION: &str = "linkerd.io/proxy-version";
        /// The proxy's UID, overriding the entry's `linkerd.proxy-uid`.
        pub const PROXY_UID: &str = "config.linkerd.io/proxy-uid";
        /// The proxy container.
        pub const PROXY: &str = "linkerd-proxy";
        /// The init container that writes the rules itself (no CNI).
        pub const INIT: &str = "linkerd-init";
    }
    /// consul-k8s (hashicorp/consul-k8s `control-plane/cni/main.go`).
    pub mod consul {
        /// Written by the injector on injected pods.
        pub const CONNECT_INJECT_STATUS: &str = "consul.hashicorp.com/connect-inject-status";
        /// The older name of [`CONNECT_INJECT_STATUS`].
        pub const MESH_INJECT_STATUS: &str = "consul.hashicorp.com/mesh-inject-status";
        /// Written by the injector when transparent proxy is on for the pod.
        pub const TRANSPARENT_PROXY_STATUS: &str = "consul.hashicorp.com/transparent-proxy-status";
        /// The redirection, as JSON (`ProxyUserID`, `ProxyOutboundPort`, …).
        pub const REDIRECT_TRAFFIC_CONFIG: &str = "consul.hashicorp.com/redirect-traffic-config";
        /// `"true"` when consul-cni writes IPv6 rules too.
        pub const DUAL_STACK: &str = "consul.hashicorp.com/dual-stack";
    }
    /// Kuma (kumahq/kuma `app/cni/pkg/cni/kubernetes_linux.go`,
    /// `pkg/transparentproxy/kubernetes/kubernetes_config.go`).
    pub mod kuma {
        /// `"true"` on pods the injector gave a sidecar.
        pub const SIDECAR_INJECTED: &str = "kuma.io/sidecar-injected";
        /// The whole transparent-proxy config, as YAML.
        pub const TPROXY_CONFIG: &str = "traffic.kuma.io/transparent-proxy-config";
        /// The sidecar container (or native-sidecar init container).
        pub const SIDECAR: &str = "kuma-sidecar";
        /// The init container that writes the rules itself (no CNI).
        pub const INIT: &str = "kuma-init";
    }
}

/// What guard-mode recognition reads of a pod.
#[derive(Debug, Clone, Copy)]
pub struct GuardPod<'a> {
    /// `namespace/name`, for messages.
    pub display: &'a str,
    /// The pod's namespace.
    pub namespace: &'a str,
    /// All of its annotations, when known (the runtime's `runtimeConfig`, or the agent).
    pub annotations: Option<&'a BTreeMap<String, String>>,
    /// Its containers (and the few labels and proxy facts kept), when the agent told them.
    pub facts: Option<&'a PodFacts>,
}

impl GuardPod<'_> {
    fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations?.get(key).map(String::as_str)
    }

    /// The annotation when present and not empty (how consul-cni and linkerd-cni read
    /// them).
    fn set(&self, key: &str) -> Option<&str> {
        self.annotation(key).filter(|v| !v.is_empty())
    }
}

/// Whether the guarded mesh's own plugin would redirect a pod's traffic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recognition {
    /// It would: the pod must be proven captured.
    Meshed,
    /// It would not (why, for logs).
    NotMeshed(String),
    /// What the mesh's plugin decides on is unknown here (why).
    Undecidable(String),
}

impl Recognition {
    /// `meshed`, `not-meshed`, `undecidable`.
    pub fn label(&self) -> &'static str {
        match self {
            Recognition::Meshed => "meshed",
            Recognition::NotMeshed(_) => "not-meshed",
            Recognition::Undecidable(_) => "undecidable",
        }
    }
}

/// When the mesh writes IPv6 rules for a pod (its plugin decides at ADD, inside the pod's
/// netns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ipv6Capture {
    /// Never: IPv4 only.
    Never,
    /// Always (the pod's IPv6 side, if it has one, is captured).
    Always,
    /// When the first address that is neither loopback nor link-local is IPv6 (Istio
    /// without `ISTIO_DUAL_STACK`, istio/istio `tools/common/config/config.go` `getLocalIP`).
    FirstAddressIsIpv6,
    /// When any address that is neither loopback nor link-local is IPv6 (Istio with
    /// `ISTIO_DUAL_STACK=true`, same function).
    AnyGlobalIpv6,
    /// When any non-loopback IPv6 address exists, link-local included (Kuma's
    /// `HasLocalIPv6`, kumahq/kuma `pkg/transparentproxy/config/config.go`
    /// `Config.Initialize`; its IPv6 setup can still fail silently, which guard mode
    /// then reports as not captured, since Kuma meant to capture it).
    AnyIpv6,
}

impl Ipv6Capture {
    /// Whether the mesh captures IPv6 in a pod whose interfaces carry `addrs`, in the
    /// kernel's order (loopback's included or not: they are skipped).
    pub fn captures_ipv6(self, addrs: &[IpAddr]) -> bool {
        let global = |a: &&IpAddr| !a.is_loopback() && !is_link_local(a);
        match self {
            Ipv6Capture::Never => false,
            Ipv6Capture::Always => true,
            Ipv6Capture::FirstAddressIsIpv6 => {
                addrs.iter().find(global).is_some_and(IpAddr::is_ipv6)
            }
            Ipv6Capture::AnyGlobalIpv6 => addrs.iter().filter(global).any(IpAddr::is_ipv6),
            Ipv6Capture::AnyIpv6 => addrs.iter().any(|a| a.is_ipv6() && !a.is_loopback()),
        }
    }
}

fn is_link_local(a: &IpAddr) -> bool {
    match a {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// What proves a meshed pod captured: the port its proxy's outbound listener has (where
/// a redirected connection lands), the proxy's UID (exempt from capture), and the
/// families the mesh captures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeInputs {
    /// The proxy's outbound capture port.
    pub outbound_port: u16,
    /// The proxy's UID.
    pub proxy_uid: u32,
    /// When IPv6 is captured (IPv4 always is).
    pub ipv6: Ipv6Capture,
}

/// A pod or entry value guard mode cannot read: which pod, which field, what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pod {pod}: {field}: {problem}")]
pub struct GuardPodError {
    /// `namespace/name`.
    pub pod: String,
    /// The annotation, or `<mesh entry>.<key>`.
    pub field: String,
    /// What is wrong, and what the mesh's plugin does with it.
    pub problem: String,
}

/// Parses YAML into a JSON value (Kuma's config annotation is YAML; contract carries no
/// YAML parser, so the caller hands its own in).
pub type YamlParser<'a> = &'a dyn Fn(&str) -> Result<Value, String>;

impl GuardedMesh {
    /// The namespaces the mesh's plugin never touches, from its entry T: Istio's
    /// `exclude_namespaces`, Kuma's `kubernetes.exclude_namespaces`; linkerd-cni and
    /// consul-cni have none.
    pub fn excluded_namespaces(self, entry: &Value) -> Vec<String> {
        let list = match self {
            GuardedMesh::Istio => entry.get("exclude_namespaces"),
            GuardedMesh::Kuma => entry
                .get("kubernetes")
                .and_then(|k| k.get("exclude_namespaces")),
            GuardedMesh::Linkerd | GuardedMesh::Consul => None,
        };
        list.and_then(Value::as_array)
            .map(|l| {
                l.iter()
                    .filter_map(Value::as_str)
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether the mesh's own plugin would redirect `pod`, as that plugin decides (per
    /// mesh below); `excluded` are T's excluded namespaces.
    ///
    /// Where the plugin reads the pod's containers and only the annotations are known,
    /// the injector's annotation decides: an injected pod counts as meshed, which is the
    /// side that holds it back rather than letting it through.
    pub fn recognise(self, pod: &GuardPod, excluded: &[String]) -> Recognition {
        if excluded.iter().any(|n| n == pod.namespace) {
            return Recognition::NotMeshed(format!(
                "namespace {} is excluded by {}'s entry",
                pod.namespace,
                self.plugin_type()
            ));
        }
        let facts = pod.facts;
        let has = |name: &str| facts.is_some_and(|f| f.has_container(name));
        let has_init = |name: &str| {
            facts.is_some_and(|f| f.containers.iter().any(|c| c.init && c.name == name))
        };
        let not = |why: &str| Recognition::NotMeshed(why.to_string());
        match self {
            // istio-cni `plugin.go` `doAddRun`: the annotation, then the containers.
            // Ambient pods carry no status annotation, so they are not meshed here.
            GuardedMesh::Istio => {
                use keys::istio::*;
                if pod.annotations.is_none() {
                    return undecidable(self, pod);
                }
                if pod.annotation(STATUS).is_none() {
                    return not("no sidecar.istio.io/status (not injected, or ambient)");
                }
                let inject = facts
                    .and_then(|f| f.labels.get(INJECT))
                    .map(String::as_str)
                    .or_else(|| pod.annotation(INJECT));
                if inject.is_some_and(|v| go_bool(v) == Some(false)) {
                    return not("sidecar.istio.io/inject is false");
                }
                let Some(f) = facts else {
                    return Recognition::Meshed;
                };
                if has(INIT) {
                    return not("istio-init writes the rules (not CNI mode)");
                }
                let Some(proxy) = f.container(PROXY) else {
                    return not("no istio-proxy container");
                };
                if proxy
                    .env
                    .get("DISABLE_ENVOY")
                    .is_some_and(|v| go_bool(v) == Some(true))
                {
                    return not("istio-proxy has DISABLE_ENVOY=true");
                }
                if proxy.args.first().is_some_and(|a| a == "proxy")
                    && proxy.args.get(1).map(String::as_str) != Some("sidecar")
                {
                    return not("istio-proxy is not a sidecar (a gateway)");
                }
                Recognition::Meshed
            }
            // linkerd-cni `cni-plugin/main.go` `cmdAdd` decides on the containers alone
            // (no linkerd-init init container, a linkerd-proxy container). Where only the
            // annotations are known (the runtime passed them, no agent to tell the
            // containers), `linkerd.io/proxy-version` stands in: linkerd2's injector
            // (`pkg/inject/inject.go`) writes it on every pod it gives a linkerd-proxy.
            GuardedMesh::Linkerd => {
                use keys::linkerd::*;
                match facts {
                    Some(_) if has_init(INIT) => not("linkerd-init writes the rules"),
                    Some(_) if has(PROXY) => Recognition::Meshed,
                    Some(_) => not("no linkerd-proxy container"),
                    None if pod.annotations.is_none() => undecidable(self, pod),
                    None if pod.annotation(PROXY_VERSION).is_some() => Recognition::Meshed,
                    None => not("no linkerd.io/proxy-version annotation (containers unknown)"),
                }
            }
            // consul-cni `control-plane/cni/main.go` `skipTrafficRedirection`: both
            // annotations set and not empty.
            GuardedMesh::Consul => {
                use keys::consul::*;
                if pod.annotations.is_none() {
                    return undecidable(self, pod);
                }
                if pod.set(CONNECT_INJECT_STATUS).is_none() && pod.set(MESH_INJECT_STATUS).is_none()
                {
                    return not("no connect-inject-status annotation");
                }
                if pod.set(TRANSPARENT_PROXY_STATUS).is_none() {
                    return not("no transparent-proxy-status annotation (transparent proxy off)");
                }
                Recognition::Meshed
            }
            // kuma-cni `kubernetes_linux.go` `getAndValidatePodAnnotations`.
            GuardedMesh::Kuma => {
                use keys::kuma::*;
                if pod.annotations.is_none() {
                    return undecidable(self, pod);
                }
                if pod.annotation(SIDECAR_INJECTED) != Some("true") {
                    return not("kuma.io/sidecar-injected is not \"true\"");
                }
                if facts.is_none() {
                    return Recognition::Meshed;
                }
                if has_init(INIT) {
                    return not("kuma-init writes the rules");
                }
                if !has(SIDECAR) {
                    return not("no kuma-sidecar container");
                }
                Recognition::Meshed
            }
        }
    }

    /// What proves a meshed `pod` captured (see [`ProbeInputs`]), from the pod and T's
    /// entry (`entry`, when known; the mesh's chart defaults otherwise). `yaml` parses
    /// Kuma's config annotation.
    ///
    /// - Istio: 15001, fixed (istio-cni `sidecar_iptables_linux.go`); the UID is
    ///   `istio-proxy`'s `runAsUser` (unset or 0: 1337); IPv6 by the first address, or
    ///   any with `ISTIO_DUAL_STACK=true` on `istio-proxy`.
    /// - Linkerd: the entry's `linkerd.outgoing-proxy-port`, `linkerd.proxy-uid` (the pod's
    ///   `config.linkerd.io/proxy-uid` wins) and `linkerd.ipv6` (linkerd-cni `main.go`).
    ///   The namespace's annotation, which linkerd-cni also reads, is not known here.
    /// - Consul: `ProxyOutboundPort` (0: 15001) and `ProxyUserID` of
    ///   `redirect-traffic-config`, IPv6 when `dual-stack` is `"true"`; either annotation
    ///   missing is an error, as it fails consul-cni's ADD.
    /// - Kuma: `redirect.outbound.port`, `kumaDPUser` and `ipFamilyMode` of
    ///   `traffic.kuma.io/transparent-proxy-config` (missing: an error, as at kuma-cni's
    ///   ADD); IPv6 unless `ipv4`, with any non-loopback IPv6 address.
    pub fn probe_inputs(
        self,
        pod: &GuardPod,
        entry: Option<&Value>,
        yaml: YamlParser,
    ) -> Result<ProbeInputs, GuardPodError> {
        let err = |field: &str, problem: String| GuardPodError {
            pod: pod.display.to_string(),
            field: field.to_string(),
            problem,
        };
        match self {
            GuardedMesh::Istio => {
                let proxy = pod.facts.and_then(|f| f.container(keys::istio::PROXY));
                let uid = match proxy.and_then(|p| p.run_as_user) {
                    None | Some(0) => self.default_proxy_uid(),
                    Some(n) => u32::try_from(n).map_err(|_| {
                        err(
                            "istio-proxy securityContext.runAsUser",
                            format!("{n} is not a valid UID"),
                        )
                    })?,
                };
                let dual = proxy
                    .and_then(|p| p.env.get("ISTIO_DUAL_STACK"))
                    .is_some_and(|v| go_bool(v) == Some(true));
                Ok(ProbeInputs {
                    outbound_port: self.default_outbound_port(),
                    proxy_uid: uid,
                    ipv6: if dual {
                        Ipv6Capture::AnyGlobalIpv6
                    } else {
                        Ipv6Capture::FirstAddressIsIpv6
                    },
                })
            }
            GuardedMesh::Linkerd => {
                let linkerd = entry.and_then(|e| e.get("linkerd"));
                let key = |k: &str| linkerd.and_then(|l| l.get(k));
                let field = |k: &str| format!("linkerd-cni entry linkerd.{k}");
                let outbound_port = match key("outgoing-proxy-port") {
                    None => self.default_outbound_port(),
                    Some(v) => v
                        .as_u64()
                        .and_then(|n| u16::try_from(n).ok())
                        .filter(|p| *p != 0)
                        .ok_or_else(|| {
                            err(&field("outgoing-proxy-port"), format!("{v} is not a port"))
                        })?,
                };
                let proxy_uid = match pod.set(keys::linkerd::PROXY_UID) {
                    Some(v) => v.parse::<u32>().ok().filter(|n| *n != 0).ok_or_else(|| {
                        err(
                            keys::linkerd::PROXY_UID,
                            format!("{v:?} is not a UID (linkerd-cni fails the pod's ADD)"),
                        )
                    })?,
                    None => match key("proxy-uid") {
                        None => self.default_proxy_uid(),
                        Some(v) => v
                            .as_u64()
                            .and_then(|n| u32::try_from(n).ok())
                            .ok_or_else(|| err(&field("proxy-uid"), format!("{v} is not a UID")))?,
                    },
                };
                let ipv6 = match key("ipv6") {
                    None | Some(Value::Bool(false)) => Ipv6Capture::Never,
                    Some(Value::Bool(true)) => Ipv6Capture::Always,
                    Some(v) => return Err(err(&field("ipv6"), format!("{v} is not a boolean"))),
                };
                Ok(ProbeInputs {
                    outbound_port,
                    proxy_uid,
                    ipv6,
                })
            }
            GuardedMesh::Consul => {
                use keys::consul::*;
                let raw = pod.annotation(REDIRECT_TRAFFIC_CONFIG).ok_or_else(|| {
                    err(
                        REDIRECT_TRAFFIC_CONFIG,
                        "missing (consul-cni fails the pod's ADD without it)".into(),
                    )
                })?;
                let dual = pod.annotation(DUAL_STACK).ok_or_else(|| {
                    err(
                        DUAL_STACK,
                        "missing (consul-cni fails the pod's ADD without it)".into(),
                    )
                })? == "true";
                let cfg: Map<String, Value> = serde_json::from_str(raw)
                    .map_err(|e| err(REDIRECT_TRAFFIC_CONFIG, format!("not a JSON object: {e}")))?;
                // Go's encoding/json matches field names without regard to case.
                let get = |name: &str| {
                    cfg.iter()
                        .find(|(k, _)| k.eq_ignore_ascii_case(name))
                        .map(|(_, v)| v)
                };
                let outbound_port = match get("ProxyOutboundPort") {
                    None => self.default_outbound_port(),
                    Some(v) => match v.as_u64().and_then(|n| u16::try_from(n).ok()) {
                        Some(0) => self.default_outbound_port(),
                        Some(p) => p,
                        None => {
                            return Err(err(
                                REDIRECT_TRAFFIC_CONFIG,
                                format!("ProxyOutboundPort {v} is not a port"),
                            ))
                        }
                    },
                };
                let proxy_uid = get("ProxyUserID")
                    .and_then(Value::as_str)
                    .and_then(|u| u.parse::<u32>().ok())
                    .filter(|n| *n != 0)
                    .ok_or_else(|| {
                        err(
                            REDIRECT_TRAFFIC_CONFIG,
                            "ProxyUserID is missing or not a non-zero numeric UID".into(),
                        )
                    })?;
                Ok(ProbeInputs {
                    outbound_port,
                    proxy_uid,
                    ipv6: if dual {
                        Ipv6Capture::Always
                    } else {
                        Ipv6Capture::Never
                    },
                })
            }
            GuardedMesh::Kuma => {
                use keys::kuma::*;
                let raw = pod.annotation(TPROXY_CONFIG).ok_or_else(|| {
                    err(
                        TPROXY_CONFIG,
                        "missing (kuma-cni fails the pod's ADD without it)".into(),
                    )
                })?;
                let cfg = yaml(raw).map_err(|e| err(TPROXY_CONFIG, format!("not YAML: {e}")))?;
                let outbound_port = match cfg.pointer("/redirect/outbound/port") {
                    None | Some(Value::Null) => self.default_outbound_port(),
                    Some(v) => v
                        .as_u64()
                        .and_then(|n| u16::try_from(n).ok())
                        .filter(|p| *p != 0)
                        .ok_or_else(|| {
                            err(
                                TPROXY_CONFIG,
                                format!("redirect.outbound.port {v} is not a port"),
                            )
                        })?,
                };
                // In CNI mode an empty kumaDPUser means 5678 (`InitializeKumaDPUser`).
                let proxy_uid = match cfg.get("kumaDPUser") {
                    None | Some(Value::Null) => self.default_proxy_uid(),
                    Some(Value::String(s)) if s.is_empty() => self.default_proxy_uid(),
                    Some(v) => v
                        .as_u64()
                        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(|| {
                            err(
                                TPROXY_CONFIG,
                                format!("kumaDPUser {v} is not a numeric UID"),
                            )
                        })?,
                };
                let ipv6 = match cfg.get("ipFamilyMode") {
                    None | Some(Value::Null) => Ipv6Capture::AnyIpv6,
                    Some(Value::String(m)) => match m.to_ascii_lowercase().as_str() {
                        "" | "dualstack" => Ipv6Capture::AnyIpv6,
                        "ipv4" => Ipv6Capture::Never,
                        _ => {
                            return Err(err(
                                TPROXY_CONFIG,
                                format!("ipFamilyMode {m:?}: expected dualstack or ipv4"),
                            ))
                        }
                    },
                    Some(v) => {
                        return Err(err(
                            TPROXY_CONFIG,
                            format!("ipFamilyMode {v} is not a string"),
                        ))
                    }
                };
                Ok(ProbeInputs {
                    outbound_port,
                    proxy_uid,
                    ipv6,
                })
            }
        }
    }
}

fn undecidable(mesh: GuardedMesh, pod: &GuardPod) -> Recognition {
    Recognition::Undecidable(format!(
        "the annotations of pod {} are unknown, and {} decides on them",
        pod.display,
        mesh.plugin_type()
    ))
}

/// Go's `strconv.ParseBool`, which istio-cni uses (an unparsable value is `None`).
fn go_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::pod::ContainerFacts;

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Containers by name; `+name` is an init container.
    fn facts(names: &[&str]) -> PodFacts {
        PodFacts {
            labels: BTreeMap::new(),
            containers: names
                .iter()
                .map(|n| match n.strip_prefix('+') {
                    Some(n) => ContainerFacts::named(n, true),
                    None => ContainerFacts::named(*n, false),
                })
                .collect(),
        }
    }

    fn json_parser(s: &str) -> Result<Value, String> {
        serde_json::from_str(s).map_err(|e| e.to_string())
    }

    #[test]
    fn recognition_follows_each_mesh_plugin() {
        use GuardedMesh::*;
        let istio = [(keys::istio::STATUS, "{}")];
        let mut gateway = facts(&["istio-proxy"]);
        gateway.containers[0].args = vec!["proxy".into(), "router".into()];
        let mut no_envoy = facts(&["istio-proxy"]);
        no_envoy.containers[0]
            .env
            .insert("DISABLE_ENVOY".into(), "true".into());
        let mut label_off = facts(&["istio-proxy"]);
        label_off
            .labels
            .insert(keys::istio::INJECT.into(), "false".into());
        let consul_on = [
            (keys::consul::CONNECT_INJECT_STATUS, "injected"),
            (keys::consul::TRANSPARENT_PROXY_STATUS, "enabled"),
        ];
        let kuma_on = [(keys::kuma::SIDECAR_INJECTED, "true")];
        type Case<'a> = (
            &'a str,
            GuardedMesh,
            &'a str,
            Option<&'a [(&'a str, &'a str)]>,
            Option<PodFacts>,
            &'a str,
        );
        let cases: Vec<Case> = vec![
            // istio/istio cni/pkg/plugin/plugin.go doAddRun
            (
                "istio sidecar",
                Istio,
                "shop",
                Some(&istio),
                Some(facts(&["app", "istio-proxy"])),
                "meshed",
            ),
            (
                "istio native sidecar",
                Istio,
                "shop",
                Some(&istio),
                Some(facts(&["+istio-proxy", "app"])),
                "meshed",
            ),
            (
                "istio annotations only",
                Istio,
                "shop",
                Some(&istio),
                None,
                "meshed",
            ),
            (
                "istio excluded namespace",
                Istio,
                "kube-system",
                Some(&istio),
                None,
                "not-meshed",
            ),
            (
                "istio not injected",
                Istio,
                "shop",
                Some(&[]),
                Some(facts(&["app"])),
                "not-meshed",
            ),
            (
                "istio ambient pod (no status)",
                Istio,
                "shop",
                Some(&[("ambient.istio.io/redirection", "enabled")]),
                None,
                "not-meshed",
            ),
            (
                "istio-init mode",
                Istio,
                "shop",
                Some(&istio),
                Some(facts(&["+istio-init", "istio-proxy"])),
                "not-meshed",
            ),
            (
                "istio no proxy",
                Istio,
                "shop",
                Some(&istio),
                Some(facts(&["app"])),
                "not-meshed",
            ),
            (
                "istio gateway",
                Istio,
                "shop",
                Some(&istio),
                Some(gateway),
                "not-meshed",
            ),
            (
                "istio DISABLE_ENVOY",
                Istio,
                "shop",
                Some(&istio),
                Some(no_envoy),
                "not-meshed",
            ),
            (
                "istio inject label false",
                Istio,
                "shop",
                Some(&istio),
                Some(label_off),
                "not-meshed",
            ),
            (
                "istio inject annotation false",
                Istio,
                "shop",
                Some(&[(keys::istio::STATUS, "{}"), (keys::istio::INJECT, "false")]),
                None,
                "not-meshed",
            ),
            (
                "istio unknown annotations",
                Istio,
                "shop",
                None,
                None,
                "undecidable",
            ),
            // linkerd/linkerd2-proxy-init cni-plugin/main.go cmdAdd: containers only
            (
                "linkerd proxy",
                Linkerd,
                "shop",
                Some(&[]),
                Some(facts(&["app", "linkerd-proxy"])),
                "meshed",
            ),
            (
                "linkerd native sidecar",
                Linkerd,
                "shop",
                None,
                Some(facts(&["+linkerd-proxy", "app"])),
                "meshed",
            ),
            (
                "linkerd-init mode",
                Linkerd,
                "shop",
                Some(&[]),
                Some(facts(&["+linkerd-init", "linkerd-proxy"])),
                "not-meshed",
            ),
            (
                "linkerd no proxy",
                Linkerd,
                "shop",
                Some(&[(keys::linkerd::PROXY_VERSION, "v2")]),
                Some(facts(&["app"])),
                "not-meshed",
            ),
            (
                "linkerd annotations only",
                Linkerd,
                "shop",
                Some(&[(keys::linkerd::PROXY_VERSION, "v2")]),
                None,
                "meshed",
            ),
            (
                "linkerd annotations only, not injected",
                Linkerd,
                "shop",
                Some(&[]),
                None,
                "not-meshed",
            ),
            (
                "linkerd has no namespace exclusions",
                Linkerd,
                "kube-system",
                Some(&[]),
                Some(facts(&["linkerd-proxy"])),
                "meshed",
            ),
            (
                "linkerd nothing known",
                Linkerd,
                "shop",
                None,
                None,
                "undecidable",
            ),
            // hashicorp/consul-k8s control-plane/cni/main.go skipTrafficRedirection
            (
                "consul tproxy",
                Consul,
                "shop",
                Some(&consul_on),
                None,
                "meshed",
            ),
            (
                "consul mesh-inject-status",
                Consul,
                "shop",
                Some(&[
                    (keys::consul::MESH_INJECT_STATUS, "injected"),
                    (keys::consul::TRANSPARENT_PROXY_STATUS, "enabled"),
                ]),
                None,
                "meshed",
            ),
            (
                "consul no tproxy",
                Consul,
                "shop",
                Some(&[(keys::consul::CONNECT_INJECT_STATUS, "injected")]),
                None,
                "not-meshed",
            ),
            (
                "consul empty status",
                Consul,
                "shop",
                Some(&[
                    (keys::consul::CONNECT_INJECT_STATUS, ""),
                    (keys::consul::TRANSPARENT_PROXY_STATUS, "enabled"),
                ]),
                None,
                "not-meshed",
            ),
            (
                "consul has no namespace exclusions",
                Consul,
                "kube-system",
                Some(&consul_on),
                None,
                "meshed",
            ),
            (
                "consul unknown annotations",
                Consul,
                "shop",
                None,
                Some(facts(&["consul-dataplane"])),
                "undecidable",
            ),
            // kumahq/kuma app/cni/pkg/cni/kubernetes_linux.go getAndValidatePodAnnotations
            (
                "kuma sidecar",
                Kuma,
                "shop",
                Some(&kuma_on),
                Some(facts(&["app", "kuma-sidecar"])),
                "meshed",
            ),
            (
                "kuma annotations only",
                Kuma,
                "shop",
                Some(&kuma_on),
                None,
                "meshed",
            ),
            (
                "kuma-init mode",
                Kuma,
                "shop",
                Some(&kuma_on),
                Some(facts(&["+kuma-init", "kuma-sidecar"])),
                "not-meshed",
            ),
            (
                "kuma no sidecar",
                Kuma,
                "shop",
                Some(&kuma_on),
                Some(facts(&["app"])),
                "not-meshed",
            ),
            (
                "kuma not injected",
                Kuma,
                "shop",
                Some(&[(keys::kuma::SIDECAR_INJECTED, "false")]),
                Some(facts(&["kuma-sidecar"])),
                "not-meshed",
            ),
            (
                "kuma excluded namespace",
                Kuma,
                "kube-system",
                Some(&kuma_on),
                None,
                "not-meshed",
            ),
            (
                "kuma unknown annotations",
                Kuma,
                "shop",
                None,
                None,
                "undecidable",
            ),
        ];
        let excluded = vec!["kube-system".to_string()];
        for (what, mesh, ns, a, f, want) in cases {
            let a = a.map(ann);
            let pod = GuardPod {
                display: "shop/p",
                namespace: ns,
                annotations: a.as_ref(),
                facts: f.as_ref(),
            };
            let excl: &[String] = match mesh {
                Istio | Kuma => &excluded,
                Linkerd | Consul => &[],
            };
            let got = mesh.recognise(&pod, excl);
            assert_eq!(got.label(), want, "{what}: {got:?}");
            if let Recognition::Undecidable(why) = got {
                assert!(
                    why.contains("shop/p") && why.contains(mesh.plugin_type()),
                    "{why}"
                );
            }
        }
    }

    #[test]
    fn excluded_namespaces_come_from_the_entry() {
        let istio = serde_json::json!({"type": "istio-cni", "exclude_namespaces": ["kube-system", "istio-system"]});
        let kuma = serde_json::json!({"type": "kuma-cni", "kubernetes": {"exclude_namespaces": ["kuma-system"]}});
        assert_eq!(
            GuardedMesh::Istio.excluded_namespaces(&istio),
            vec!["kube-system", "istio-system"]
        );
        assert_eq!(
            GuardedMesh::Kuma.excluded_namespaces(&kuma),
            vec!["kuma-system"]
        );
        assert!(GuardedMesh::Linkerd.excluded_namespaces(&istio).is_empty());
        assert!(GuardedMesh::Kuma.excluded_namespaces(&istio).is_empty());
    }

    #[test]
    fn probe_inputs_per_mesh() {
        use GuardedMesh::*;
        let probe =
            |mesh: GuardedMesh, a: &[(&str, &str)], f: Option<PodFacts>, entry: Option<Value>| {
                let a = ann(a);
                let pod = GuardPod {
                    display: "shop/p",
                    namespace: "shop",
                    annotations: Some(&a),
                    facts: f.as_ref(),
                };
                mesh.probe_inputs(&pod, entry.as_ref(), &json_parser)
            };
        // istio-cni: 15001 fixed, UID from istio-proxy's runAsUser (0 → 1337).
        let mut custom = facts(&["istio-proxy"]);
        custom.containers[0].run_as_user = Some(1500);
        custom.containers[0]
            .env
            .insert("ISTIO_DUAL_STACK".into(), "true".into());
        assert_eq!(
            probe(Istio, &[], Some(custom), None).unwrap(),
            ProbeInputs {
                outbound_port: 15001,
                proxy_uid: 1500,
                ipv6: Ipv6Capture::AnyGlobalIpv6
            }
        );
        let mut root = facts(&["istio-proxy"]);
        root.containers[0].run_as_user = Some(0);
        assert_eq!(
            probe(Istio, &[], Some(root), None).unwrap(),
            ProbeInputs {
                outbound_port: 15001,
                proxy_uid: 1337,
                ipv6: Ipv6Capture::FirstAddressIsIpv6
            }
        );
        // linkerd-cni: the entry's linkerd object, the pod's proxy-uid annotation wins.
        let entry = serde_json::json!({"type": "linkerd-cni", "linkerd": {"outgoing-proxy-port": 4150, "proxy-uid": 2200, "ipv6": true}});
        assert_eq!(
            probe(Linkerd, &[], None, Some(entry.clone())).unwrap(),
            ProbeInputs {
                outbound_port: 4150,
                proxy_uid: 2200,
                ipv6: Ipv6Capture::Always
            }
        );
        assert_eq!(
            probe(
                Linkerd,
                &[(keys::linkerd::PROXY_UID, "3000")],
                None,
                Some(entry)
            )
            .unwrap()
            .proxy_uid,
            3000
        );
        assert_eq!(
            probe(Linkerd, &[], None, None).unwrap(),
            ProbeInputs {
                outbound_port: 4140,
                proxy_uid: 2102,
                ipv6: Ipv6Capture::Never
            }
        );
        let e = probe(Linkerd, &[(keys::linkerd::PROXY_UID, "abc")], None, None).unwrap_err();
        assert_eq!(
            (e.pod.as_str(), e.field.as_str()),
            ("shop/p", keys::linkerd::PROXY_UID)
        );
        let e = probe(
            Linkerd,
            &[],
            None,
            Some(serde_json::json!({"linkerd": {"ipv6": "yes"}})),
        )
        .unwrap_err();
        assert!(e.to_string().contains("linkerd.ipv6"), "{e}");
        // consul-cni: the redirect-traffic-config JSON and dual-stack.
        let rtc = r#"{"ConsulDNSIP":"","ProxyUserID":"5995","ProxyInboundPort":20000,"ProxyOutboundPort":15001}"#;
        assert_eq!(
            probe(
                Consul,
                &[
                    (keys::consul::REDIRECT_TRAFFIC_CONFIG, rtc),
                    (keys::consul::DUAL_STACK, "false")
                ],
                None,
                None
            )
            .unwrap(),
            ProbeInputs {
                outbound_port: 15001,
                proxy_uid: 5995,
                ipv6: Ipv6Capture::Never
            }
        );
        let custom = r#"{"proxyuserid":"6000","ProxyInboundPort":20000,"ProxyOutboundPort":0}"#;
        assert_eq!(
            probe(
                Consul,
                &[
                    (keys::consul::REDIRECT_TRAFFIC_CONFIG, custom),
                    (keys::consul::DUAL_STACK, "true")
                ],
                None,
                None
            )
            .unwrap(),
            ProbeInputs {
                outbound_port: 15001,
                proxy_uid: 6000,
                ipv6: Ipv6Capture::Always
            }
        );
        let e = probe(
            Consul,
            &[(keys::consul::REDIRECT_TRAFFIC_CONFIG, rtc)],
            None,
            None,
        )
        .unwrap_err();
        assert_eq!(e.field, keys::consul::DUAL_STACK);
        let e = probe(Consul, &[(keys::consul::DUAL_STACK, "true")], None, None).unwrap_err();
        assert!(
            e.to_string().contains("shop/p") && e.to_string().contains("redirect-traffic-config"),
            "{e}"
        );
        let e = probe(
            Consul,
            &[
                (keys::consul::REDIRECT_TRAFFIC_CONFIG, "{"),
                (keys::consul::DUAL_STACK, "true"),
            ],
            None,
            None,
        )
        .unwrap_err();
        assert!(e.problem.contains("JSON"), "{e}");
        // kuma-cni: the transparent-proxy config annotation (JSON is YAML too).
        let kuma =
            r#"{"kumaDPUser":"5679","redirect":{"outbound":{"port":15002}},"ipFamilyMode":"ipv4"}"#;
        assert_eq!(
            probe(Kuma, &[(keys::kuma::TPROXY_CONFIG, kuma)], None, None).unwrap(),
            ProbeInputs {
                outbound_port: 15002,
                proxy_uid: 5679,
                ipv6: Ipv6Capture::Never
            }
        );
        assert_eq!(
            probe(
                Kuma,
                &[(keys::kuma::TPROXY_CONFIG, r#"{"kumaDPUser":""}"#)],
                None,
                None
            )
            .unwrap(),
            ProbeInputs {
                outbound_port: 15001,
                proxy_uid: 5678,
                ipv6: Ipv6Capture::AnyIpv6
            }
        );
        let e = probe(
            Kuma,
            &[(keys::kuma::TPROXY_CONFIG, r#"{"ipFamilyMode":"ipv6"}"#)],
            None,
            None,
        )
        .unwrap_err();
        assert!(e.problem.contains("ipFamilyMode"), "{e}");
        let e = probe(Kuma, &[], None, None).unwrap_err();
        assert_eq!(e.field, keys::kuma::TPROXY_CONFIG);
    }

    #[test]
    fn ipv6_capture_rules() {
        let v4: IpAddr = "10.0.0.5".parse().unwrap();
        let v6: IpAddr = "fd00::5".parse().unwrap();
        let ll: IpAddr = "fe80::1".parse().unwrap();
        let lo4: IpAddr = "127.0.0.1".parse().unwrap();
        let lo6: IpAddr = "::1".parse().unwrap();
        use Ipv6Capture::*;
        let cases: &[(Ipv6Capture, &[IpAddr], bool)] = &[
            (Never, &[v6], false),
            (Always, &[v4], true),
            // istio getLocalIP: the first non-loopback, non-link-local address decides.
            (FirstAddressIsIpv6, &[lo4, lo6, v4, v6], false),
            (FirstAddressIsIpv6, &[lo4, ll, v6, v4], true),
            (FirstAddressIsIpv6, &[lo4, lo6, ll], false),
            (AnyGlobalIpv6, &[lo4, v4, v6], true),
            (AnyGlobalIpv6, &[lo4, lo6, v4, ll], false),
            // kuma HasLocalIPv6: a link-local address counts.
            (AnyIpv6, &[lo4, lo6, v4, ll], true),
            (AnyIpv6, &[lo4, lo6, v4], false),
        ];
        for (rule, addrs, want) in cases {
            assert_eq!(rule.captures_ipv6(addrs), *want, "{rule:?} {addrs:?}");
        }
    }

    #[test]
    fn names_round_trip() {
        for m in GuardedMesh::ALL {
            assert_eq!(m.as_str().parse::<GuardedMesh>().unwrap(), m);
            assert_eq!(GuardedMesh::from_plugin_type(m.plugin_type()), Some(m));
            let v = serde_json::to_value(m).unwrap();
            assert_eq!(v, serde_json::Value::String(m.as_str().into()));
        }
        let e = "cilium".parse::<GuardedMesh>().unwrap_err();
        assert!(e.to_string().contains("cilium"));
        assert_eq!(GuardedMesh::from_plugin_type("interlock-cni"), None);
    }

    #[test]
    fn role_serialises_with_camel_case_and_omits_empty_fields() {
        let r = GuardRole {
            mesh: GuardedMesh::Consul,
            hold: true,
            reason: Some("consul-cni binary missing".into()),
            exclude_namespaces: vec![],
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"mesh": "consul", "hold": true, "reason": "consul-cni binary missing"})
        );
        let back: GuardRole = serde_json::from_value(
            serde_json::json!({"mesh": "kuma", "excludeNamespaces": ["kube-system"]}),
        )
        .unwrap();
        assert!(!back.hold);
        assert_eq!(back.exclude_namespaces, vec!["kube-system".to_string()]);
    }
}

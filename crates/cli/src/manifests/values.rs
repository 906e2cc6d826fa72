//! The settings of `interlock manifests`: one key per setting, given in a values file
//! (`-f values.yaml`) or with `--set key=value`, validated here with an error naming the
//! key (and the file) and what it accepts. Both go through [`Values::apply`], so a key
//! means the same thing in either place; docs/install.md lists every key with its default.

use k8s_openapi::api::core::v1::{Affinity, ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;
use std::collections::BTreeMap;

/// The settings `interlock manifests` renders.
#[derive(Debug, Clone, PartialEq)]
pub struct Values {
    /// The image holding both binaries, by full name (registry/path:tag or @digest).
    pub image: String,
    /// `IfNotPresent`, `Always` or `Never`.
    pub image_pull_policy: String,
    /// Secrets (in the namespace) the kubelet pulls the image with.
    pub image_pull_secrets: Vec<String>,
    /// The namespace interlock runs in.
    pub namespace: String,
    /// `owned`, `chain` or `guard`.
    pub config_mode: String,
    /// Guard mode: the mesh whose own CNI plugin the agent guards (`istio`, `linkerd`,
    /// `consul`, `kuma`; `""` outside guard mode).
    pub guard_mesh: String,
    /// What the agent removes when it exits: `false`, `true` or `when-deleted`.
    pub uninstall_on_exit: String,
    /// Chain mode: the file to chain into (`""`: the one the runtime loads).
    pub chain_target: String,
    /// `containerd` or `crio`.
    pub runtime: String,
    /// `repair`, `restart`, `delete`, `evict` or `report`.
    pub repair_policy: String,
    /// `NoSchedule`, `PreferNoSchedule`, `NoExecute` or `none`.
    pub taint_effect: String,
    /// Mesh profiles in priority order (`istio`, `linkerd`, `consul`, `generic`).
    pub profiles: Vec<String>,
    /// Namespaces whose pods the plugin never redirects.
    pub exclude_namespaces: Vec<String>,
    /// The runtime's CNI conf dir on the host.
    pub cni_conf_dir: String,
    /// The runtime's CNI bin dir on the host.
    pub cni_bin_dir: String,
    /// The runtime's CRI socket on the host (`""`: the runtime's default).
    pub cri_socket: String,
    /// The health and metrics port on the node.
    pub health_port: u16,
    /// Also render a prometheus-operator `PodMonitor`.
    pub pod_monitor: bool,
    /// Render the admission policy that limits each agent's writes to its own node
    /// (Kubernetes ≥ 1.30; `false` for older clusters, where the RBAC alone applies).
    pub node_scope: bool,
    /// The agent pod's nodeSelector (one node pool at a time during a migration).
    pub node_selector: BTreeMap<String, String>,
    /// The agent pod's affinity.
    pub affinity: Option<Affinity>,
    /// The agent pod's tolerations (default: every taint).
    pub tolerations: Vec<Toleration>,
    /// The agent container's requests and limits.
    pub resources: ResourceRequirements,
    /// The agent pod's priority class (`""`: none).
    pub priority_class_name: String,
    /// The DaemonSet's rolling update: nodes whose agent may be down at once.
    pub max_unavailable: IntOrString,
    /// The DaemonSet's rolling update: always 0 (see [`Values::apply`]).
    pub max_surge: IntOrString,
    /// Extra labels on every object and on the agent's pods.
    pub labels: BTreeMap<String, String>,
    /// Extra annotations on every object and on the agent's pods.
    pub annotations: BTreeMap<String, String>,
    /// The agent's log filter (`INTERLOCK_LOG`).
    pub log_level: String,
    /// `text` or `json` (`INTERLOCK_LOG_FORMAT`).
    pub log_format: String,
    /// Seconds between full sandbox audits (`INTERLOCK_AUDIT_INTERVAL`).
    pub audit_interval: String,
    /// Config files allowed to sort ahead of interlock's (`INTERLOCK_ALLOW_AHEAD`).
    pub allow_ahead: Vec<String>,
    /// Highest cniVersion the owned config gets (`""`: the highest every plugin supports).
    pub max_cni_version: String,
    /// The plugin's `failurePolicy`: `closed` or `open`.
    pub failure_policy: String,
    /// The plugin's `backend`: `auto`, `nftables`, `iptables-nft` or `iptables-legacy`.
    pub backend: String,
    /// The plugin's `logFile` on the host (`""`: the runtime's stderr).
    pub log_file: String,
    /// The plugin's `logLevel`: `error`, `warn`, `info` or `debug`.
    pub plugin_log_level: String,
}

/// The image the default rendering names: the release of this version.
pub const DEFAULT_IMAGE_REPOSITORY: &str = "ghcr.io/interlock-dev/interlock";

/// Labels interlock sets itself on every object (the DaemonSet selects its pods by the
/// first), refused as extra labels.
pub const OWN_LABELS: [&str; 3] = [
    "app.kubernetes.io/name",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/version",
];

/// How a key's value is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One value.
    Scalar,
    /// A list (in `--set`: comma-separated).
    List,
    /// A string map (in `--set`: `key.name=value`, or YAML `{…}`).
    Map,
    /// A Kubernetes object (in `--set`: YAML flow syntax, e.g. `[{operator: Exists}]`).
    Object,
}

/// Every key, in the order docs/install.md lists them.
pub const KEYS: &[(&str, Shape)] = &[
    ("image", Shape::Scalar),
    ("imagePullPolicy", Shape::Scalar),
    ("imagePullSecrets", Shape::List),
    ("namespace", Shape::Scalar),
    ("configMode", Shape::Scalar),
    ("chainTarget", Shape::Scalar),
    ("guardMesh", Shape::Scalar),
    ("runtime", Shape::Scalar),
    ("repairPolicy", Shape::Scalar),
    ("taintEffect", Shape::Scalar),
    ("profiles", Shape::List),
    ("excludeNamespaces", Shape::List),
    ("cniConfDir", Shape::Scalar),
    ("cniBinDir", Shape::Scalar),
    ("criSocket", Shape::Scalar),
    ("healthPort", Shape::Scalar),
    ("podMonitor", Shape::Scalar),
    ("nodeScope", Shape::Scalar),
    ("nodeSelector", Shape::Map),
    ("affinity", Shape::Object),
    ("tolerations", Shape::Object),
    ("resources", Shape::Object),
    ("priorityClassName", Shape::Scalar),
    ("maxUnavailable", Shape::Scalar),
    ("maxSurge", Shape::Scalar),
    ("labels", Shape::Map),
    ("annotations", Shape::Map),
    ("logLevel", Shape::Scalar),
    ("logFormat", Shape::Scalar),
    ("auditInterval", Shape::Scalar),
    ("uninstallOnExit", Shape::Scalar),
    ("allowAhead", Shape::List),
    ("maxCniVersion", Shape::Scalar),
    ("failurePolicy", Shape::Scalar),
    ("backend", Shape::Scalar),
    ("logFile", Shape::Scalar),
    ("pluginLogLevel", Shape::Scalar),
];

fn known_keys() -> String {
    KEYS.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
}

fn shape(key: &str) -> Option<Shape> {
    KEYS.iter().find(|(k, _)| *k == key).map(|(_, s)| *s)
}

impl Default for Values {
    fn default() -> Values {
        let quantity = |s: &str| Quantity(s.to_string());
        Values {
            image: format!(
                "{DEFAULT_IMAGE_REPOSITORY}:v{}",
                interlock_buildinfo::CRATE_VERSION
            ),
            image_pull_policy: "IfNotPresent".into(),
            image_pull_secrets: Vec::new(),
            namespace: "interlock-system".into(),
            config_mode: "owned".into(),
            chain_target: String::new(),
            guard_mesh: String::new(),
            uninstall_on_exit: "false".into(),
            runtime: "containerd".into(),
            repair_policy: "repair".into(),
            taint_effect: "NoSchedule".into(),
            profiles: vec![
                "istio".into(),
                "linkerd".into(),
                "consul".into(),
                "generic".into(),
            ],
            exclude_namespaces: vec!["kube-system".into()],
            cni_conf_dir: "/etc/cni/net.d".into(),
            cni_bin_dir: "/opt/cni/bin".into(),
            cri_socket: String::new(),
            health_port: 9102,
            pod_monitor: false,
            node_scope: true,
            node_selector: BTreeMap::from([("kubernetes.io/os".into(), "linux".into())]),
            affinity: None,
            // Run before anything else, on every node, whatever its taints (including
            // interlock's own startup taint).
            tolerations: vec![Toleration {
                operator: Some("Exists".into()),
                ..Default::default()
            }],
            // No CPU limit: a throttled agent repairs late.
            resources: ResourceRequirements {
                requests: Some(BTreeMap::from([
                    ("cpu".into(), quantity("10m")),
                    ("memory".into(), quantity("24Mi")),
                ])),
                limits: Some(BTreeMap::from([("memory".into(), quantity("64Mi"))])),
                ..Default::default()
            },
            priority_class_name: "system-node-critical".into(),
            max_unavailable: IntOrString::Int(1),
            max_surge: IntOrString::Int(0),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            log_level: "info".into(),
            log_format: "text".into(),
            audit_interval: "10".into(),
            allow_ahead: Vec::new(),
            max_cni_version: String::new(),
            failure_policy: "closed".into(),
            backend: "auto".into(),
            log_file: String::new(),
            plugin_log_level: "info".into(),
        }
    }
}

fn one_of(key: &str, v: &str, allowed: &[&str]) -> Result<String, String> {
    if allowed.contains(&v) {
        Ok(v.to_string())
    } else {
        Err(format!(
            "{key}={v:?}: expected one of {}",
            allowed.join(", ")
        ))
    }
}

/// A DNS-1123 label (namespace names).
fn dns_label(key: &str, v: &str) -> Result<String, String> {
    if is_dns_label(v) {
        Ok(v.to_string())
    } else {
        Err(format!(
            "{key}={v:?}: not a namespace name (lower-case letters, digits and '-', at most 63)"
        ))
    }
}

fn is_dns_label(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 63
        && v.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !v.starts_with('-')
        && !v.ends_with('-')
}

/// A DNS-1123 subdomain (names of Secrets, PriorityClasses).
fn dns_subdomain(key: &str, v: &str) -> Result<String, String> {
    if v.len() <= 253 && v.split('.').all(is_dns_label) {
        Ok(v.to_string())
    } else {
        Err(format!(
            "{key}={v:?}: not an object name (lower-case letters, digits, '-' and '.', at most 253)"
        ))
    }
}

/// A label value: at most 63 of `[A-Za-z0-9_.-]`, alphanumeric at both ends (or empty).
fn is_label_value(v: &str) -> bool {
    v.is_empty()
        || (v.len() <= 63
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && v.as_bytes()[0].is_ascii_alphanumeric()
            && v.as_bytes()[v.len() - 1].is_ascii_alphanumeric())
}

/// A label or annotation key: an optional DNS-subdomain prefix and `/`, then a name.
fn is_qualified_name(k: &str) -> bool {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    prefix.is_none_or(|p| p.len() <= 253 && p.split('.').all(is_dns_label))
        && !name.is_empty()
        && is_label_value(name)
}

fn host_path(key: &str, v: &str) -> Result<String, String> {
    if v.starts_with('/') && !v.contains("..") && !v.chars().any(|c| c.is_control()) {
        let p = v.trim_end_matches('/');
        Ok(if p.is_empty() { "/".into() } else { p.into() })
    } else {
        Err(format!("{key}={v:?}: expected an absolute host path"))
    }
}

/// A file name in the conf dir (no directory part).
fn file_name(key: &str, v: &str) -> Result<String, String> {
    if !v.is_empty()
        && v != "."
        && v != ".."
        && !v.contains('/')
        && !v.chars().any(|c| c.is_control() || c == ',')
    {
        Ok(v.to_string())
    } else {
        Err(format!(
            "{key}={v:?}: expected a file name in the CNI conf dir (no '/')"
        ))
    }
}

fn boolean(key: &str, v: &str) -> Result<bool, String> {
    match v {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("{key}={v:?}: expected true or false")),
    }
}

/// An int, or a percentage `N%`, as the DaemonSet's rolling update takes it.
fn int_or_percent(key: &str, v: &str) -> Result<IntOrString, String> {
    let bad =
        || format!("{key}={v:?}: expected a number of nodes (e.g. 1) or a percentage (e.g. 10%)");
    match v.strip_suffix('%') {
        Some(n) => match n.parse::<u8>() {
            Ok(p) if p <= 100 => Ok(IntOrString::String(format!("{p}%"))),
            _ => Err(bad()),
        },
        None => v
            .parse::<i32>()
            .ok()
            .filter(|n| *n >= 0)
            .map(IntOrString::Int)
            .ok_or_else(bad),
    }
}

/// A Kubernetes quantity: a decimal number and a binary (`Ki`…`Ei`), decimal
/// (`n`…`E`) or exponent (`e3`) suffix. The API server refuses anything else, after
/// the objects are half applied.
fn is_quantity(q: &str) -> bool {
    let body = q.strip_prefix(['+', '-']).unwrap_or(q);
    let digits = body
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(body.len());
    let (number, suffix) = body.split_at(digits);
    let number_ok = !number.is_empty() && number != "." && number.matches('.').count() <= 1;
    let suffix_ok = matches!(
        suffix,
        "" | "Ki"
            | "Mi"
            | "Gi"
            | "Ti"
            | "Pi"
            | "Ei"
            | "n"
            | "u"
            | "m"
            | "k"
            | "M"
            | "G"
            | "T"
            | "P"
            | "E"
    ) || suffix
        .strip_prefix(['e', 'E'])
        .map(|e| e.strip_prefix(['+', '-']).unwrap_or(e))
        .is_some_and(|e| !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit()));
    number_ok && suffix_ok
}

fn is_zero(x: &IntOrString) -> bool {
    match x {
        IntOrString::Int(n) => *n == 0,
        IntOrString::String(s) => s == "0%",
    }
}

fn list(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// What kind of YAML value this is, for an error.
fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a map",
    }
}

fn scalar(key: &str, v: &Value) -> Result<String, String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        other => Err(format!(
            "{key}: expected one value, found {}",
            kind_of(other)
        )),
    }
}

fn strings(key: &str, v: &Value) -> Result<Vec<String>, String> {
    match v {
        Value::Array(xs) => xs.iter().map(|x| scalar(key, x)).collect(),
        Value::Null => Ok(Vec::new()),
        other => Ok(list(&scalar(key, other)?)),
    }
}

/// A typed Kubernetes field from YAML, refusing a key the type does not have (which
/// the type's own deserializer would silently drop).
fn typed<T: serde::de::DeserializeOwned + serde::Serialize>(
    key: &str,
    v: &Value,
) -> Result<T, String> {
    let t: T = serde_json::from_value(v.clone()).map_err(|e| format!("{key}: {e}"))?;
    let back = serde_json::to_value(&t).map_err(|e| format!("{key}: {e}"))?;
    unknown_field(key, v, &back)?;
    Ok(t)
}

fn unknown_field(path: &str, given: &Value, kept: &Value) -> Result<(), String> {
    match (given, kept) {
        (Value::Object(g), Value::Object(k)) => {
            for (name, value) in g {
                let here = format!("{path}.{name}");
                match k.get(name) {
                    Some(kv) => unknown_field(&here, value, kv)?,
                    None if value.is_null() => {}
                    None => return Err(format!("{here}: not a field of this Kubernetes object")),
                }
            }
            Ok(())
        }
        (Value::Array(g), Value::Array(k)) => {
            for (i, (gv, kv)) in g.iter().zip(k).enumerate() {
                unknown_field(&format!("{path}[{i}]"), gv, kv)?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

impl Values {
    /// Applies one `--set key=value` (after any values file); the error names the key
    /// and what it accepts, and a refused setting changes nothing.
    pub fn set(&mut self, kv: &str) -> Result<(), String> {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("--set {kv:?}: expected key=value"))?;
        let unknown = |k: &str| format!("--set {k}: unknown setting (known: {})", known_keys());
        // `nodeSelector.pool=blue`: one entry of a map (the entry's own name may hold
        // dots and slashes, as label keys do).
        if let Some((top, entry)) = k.split_once('.') {
            return match shape(top) {
                Some(Shape::Map) => {
                    let mut map = serde_json::Map::new();
                    map.insert(entry.to_string(), Value::String(v.to_string()));
                    self.apply(top, &Value::Object(map))
                }
                Some(_) => Err(format!(
                    "--set {k}: {top} is not a map; give it whole: --set {top}=…"
                )),
                None => Err(unknown(top)),
            };
        }
        let value = match shape(k) {
            None => return Err(unknown(k)),
            Some(Shape::Scalar | Shape::List) => Value::String(v.to_string()),
            Some(Shape::Map | Shape::Object) => serde_yaml_ng::from_str::<Value>(v)
                .map_err(|e| format!("--set {k}: not YAML: {e}"))?,
        };
        self.apply(k, &value)
    }

    /// Applies every key of a values file, in order; the error names the file and the key.
    pub fn apply_file(&mut self, path: &std::path::Path) -> Result<(), String> {
        let name = path.display();
        let text = interlock_contract::bounded::read_config(path)
            .map_err(|e| format!("{name}: cannot read: {e}"))?;
        let text = String::from_utf8(text).map_err(|_| format!("{name}: not UTF-8 text"))?;
        let doc: Value =
            serde_yaml_ng::from_str(&text).map_err(|e| format!("{name}: not YAML: {e}"))?;
        let map = match doc {
            Value::Object(m) => m,
            // An empty file (or only comments) sets nothing.
            Value::Null => return Ok(()),
            other => {
                return Err(format!(
                    "{name}: expected a map of settings, found {}",
                    kind_of(&other)
                ))
            }
        };
        let mut next = self.clone();
        for (k, v) in &map {
            if shape(k).is_none() {
                return Err(format!(
                    "{name}: {k}: unknown setting (known: {})",
                    known_keys()
                ));
            }
            next.apply(k, v).map_err(|e| format!("{name}: {e}"))?;
        }
        *self = next;
        Ok(())
    }

    /// Applies one key's value; all or nothing. Rules between keys are checked once
    /// every file and `--set` is applied ([`Values::check`]), so their order does not
    /// matter.
    pub fn apply(&mut self, k: &str, v: &Value) -> Result<(), String> {
        let mut next = self.clone();
        next.apply_in_place(k, v)?;
        *self = next;
        Ok(())
    }

    fn apply_in_place(&mut self, k: &str, value: &Value) -> Result<(), String> {
        if self.apply_pod_key(k, value)?
            || self.apply_agent_key(k, value)?
            || self.apply_plugin_key(k, value)?
        {
            return Ok(());
        }
        Err(format!(
            "--set {k}: unknown setting (known: {})",
            known_keys()
        ))
    }

    /// The image, the namespace and how the agent pod is scheduled and labelled; `false`: not one of them.
    fn apply_pod_key(&mut self, k: &str, value: &Value) -> Result<bool, String> {
        let s = || scalar(k, value);
        match k {
            "image" => {
                let v = s()?;
                // A full reference: a registry host (with a dot or a port, or localhost)
                // and a tag or digest. A bare name would be resolved through registry
                // defaults (Docker Hub, CRI-O's short-name search) for a node agent.
                let (name, tagged) = match v.split_once('@') {
                    Some((n, d)) => (n, d.starts_with("sha256:") && d.len() == 71),
                    None => {
                        let last = v.rsplit('/').next().unwrap_or(&v);
                        (v.as_str(), last.contains(':'))
                    }
                };
                let host = name.split('/').next().unwrap_or("");
                let qualified = name.contains('/')
                    && (host.contains('.') || host.contains(':') || host == "localhost");
                if !qualified || !tagged || v.chars().any(|c| c.is_whitespace() || c == '"') {
                    return Err(format!(
                        "image={v:?}: expected a full reference with a registry and a tag or digest, e.g. {DEFAULT_IMAGE_REPOSITORY}:v{} or …@sha256:<64 hex>",
                        interlock_buildinfo::CRATE_VERSION
                    ));
                }
                self.image = v;
            }
            "imagePullPolicy" => {
                self.image_pull_policy = one_of(k, &s()?, &["IfNotPresent", "Always", "Never"])?
            }
            "imagePullSecrets" => {
                let names = strings(k, value)?;
                for n in &names {
                    dns_subdomain(k, n)?;
                }
                self.image_pull_secrets = names;
            }
            "namespace" => self.namespace = dns_label(k, &s()?)?,
            "healthPort" => {
                let v = s()?;
                self.health_port = v
                    .parse::<u16>()
                    .ok()
                    .filter(|p| *p >= 1024)
                    .ok_or_else(|| format!("{k}={v:?}: expected a port from 1024 to 65535"))?
            }
            "podMonitor" => self.pod_monitor = boolean(k, &s()?)?,
            "nodeScope" => self.node_scope = boolean(k, &s()?)?,
            "nodeSelector" => merge_map(k, &mut self.node_selector, value, true)?,
            "labels" => {
                merge_map(k, &mut self.labels, value, true)?;
                if let Some(own) = OWN_LABELS.iter().find(|l| self.labels.contains_key(**l)) {
                    return Err(format!(
                        "{k}.{own}: set by interlock on every object (the DaemonSet selects its pods by app.kubernetes.io/name); choose another label"
                    ));
                }
            }
            "annotations" => merge_map(k, &mut self.annotations, value, false)?,
            "affinity" => {
                self.affinity = match value {
                    Value::Null => None,
                    v => Some(typed(k, v)?),
                }
            }
            "tolerations" => {
                self.tolerations = match value {
                    Value::Null => Vec::new(),
                    v @ Value::Array(_) => typed(k, v)?,
                    other => {
                        return Err(format!(
                            "{k}: expected a list of tolerations, found {}",
                            kind_of(other)
                        ))
                    }
                }
            }
            "resources" => {
                let r: ResourceRequirements = match value {
                    Value::Null => ResourceRequirements::default(),
                    v => typed(k, v)?,
                };
                for (part, map) in [("requests", &r.requests), ("limits", &r.limits)] {
                    for (name, q) in map.iter().flatten() {
                        if !is_quantity(&q.0) {
                            return Err(format!(
                                "{k}.{part}.{name}={:?}: not a quantity (e.g. 10m, 64Mi, 1)",
                                q.0
                            ));
                        }
                    }
                }
                self.resources = r;
            }
            "priorityClassName" => {
                let v = s()?;
                self.priority_class_name = if v.is_empty() {
                    v
                } else {
                    dns_subdomain(k, &v)?
                };
            }
            "maxUnavailable" => {
                let v = s()?;
                let n = int_or_percent(k, &v)?;
                if is_zero(&n) {
                    return Err(format!(
                        "{k}={v:?}: must not be 0 (maxSurge is always 0, so the rollout could never replace an agent)"
                    ));
                }
                self.max_unavailable = n;
            }
            "maxSurge" => {
                let v = s()?;
                let surge = int_or_percent(k, &v)?;
                // A surge pod would run next to the old agent on the same node: both bind
                // the health port on the node's network (hostNetwork, hostPort), so the
                // scheduler never places it and the rollout stalls.
                if !is_zero(&surge) {
                    return Err(format!(
                        "{k}={v:?}: must be 0: a second agent pod on a node would need the same host port as the first (hostNetwork), so it could never be scheduled and the rollout would stall; use maxUnavailable to go faster"
                    ));
                }
                self.max_surge = surge;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The agent's own settings (its `INTERLOCK_*` environment); `false`: not one of them.
    fn apply_agent_key(&mut self, k: &str, value: &Value) -> Result<bool, String> {
        let s = || scalar(k, value);
        match k {
            "configMode" => self.config_mode = one_of(k, &s()?, &["owned", "chain", "guard"])?,
            "guardMesh" => {
                let v = s()?;
                self.guard_mesh = if v.is_empty() {
                    v
                } else {
                    one_of(k, &v, &["istio", "linkerd", "consul", "kuma"])?
                };
            }
            "uninstallOnExit" => {
                self.uninstall_on_exit = one_of(k, &s()?, &["false", "true", "when-deleted"])?
            }
            "chainTarget" => {
                let v = s()?;
                self.chain_target = if v.is_empty() { v } else { file_name(k, &v)? };
            }
            "runtime" => self.runtime = one_of(k, &s()?, &["containerd", "crio"])?,
            "repairPolicy" => {
                self.repair_policy = one_of(
                    k,
                    &s()?,
                    &["repair", "restart", "delete", "evict", "report"],
                )?
            }
            "taintEffect" => {
                self.taint_effect = one_of(
                    k,
                    &s()?,
                    &["NoSchedule", "PreferNoSchedule", "NoExecute", "none"],
                )?
            }
            "cniConfDir" => self.cni_conf_dir = host_path(k, &s()?)?,
            "cniBinDir" => self.cni_bin_dir = host_path(k, &s()?)?,
            "criSocket" => self.cri_socket = host_path(k, &s()?)?,
            "logLevel" => {
                let v = s()?;
                // The agent's filter, RUST_LOG syntax: a level, or `target=level,…`.
                if v.is_empty()
                    || !v.bytes().all(|b| {
                        b.is_ascii_alphanumeric() || matches!(b, b'_' | b'=' | b',' | b':' | b'-')
                    })
                {
                    return Err(format!(
                        "{k}={v:?}: expected a log level (error, warn, info, debug, trace) or a filter such as interlock_agent=debug,info"
                    ));
                }
                self.log_level = v;
            }
            "logFormat" => self.log_format = one_of(k, &s()?, &["text", "json"])?,
            "auditInterval" => {
                let v = s()?;
                // The agent's own floor (crates/cli/src/agent_cmd.rs).
                match v.parse::<f64>() {
                    Ok(x) if x.is_finite() && x >= 0.1 => self.audit_interval = v,
                    _ => return Err(format!("{k}={v:?}: expected seconds, at least 0.1")),
                }
            }
            "allowAhead" => {
                let names = strings(k, value)?;
                for n in &names {
                    file_name(k, n)?;
                }
                self.allow_ahead = names;
            }
            "maxCniVersion" => {
                let v = s()?;
                let ok = v.is_empty()
                    || (v.split('.').count() == 3
                        && v.split('.')
                            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())));
                if !ok {
                    return Err(format!("{k}={v:?}: expected a CNI version such as 1.0.0"));
                }
                self.max_cni_version = v;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The plugin's settings (`plugin-config.json`); `false`: not one of them.
    fn apply_plugin_key(&mut self, k: &str, value: &Value) -> Result<bool, String> {
        let s = || scalar(k, value);
        match k {
            "profiles" => {
                let ps = strings(k, value)?;
                for p in &ps {
                    one_of(k, p, &["istio", "linkerd", "consul", "generic"])?;
                }
                if ps.is_empty() {
                    return Err(format!("{k}: name at least one profile"));
                }
                self.profiles = ps;
            }
            "excludeNamespaces" => {
                let ns = strings(k, value)?;
                for n in &ns {
                    dns_label(k, n)?;
                }
                self.exclude_namespaces = ns;
            }
            "failurePolicy" => self.failure_policy = one_of(k, &s()?, &["closed", "open"])?,
            "backend" => {
                self.backend = one_of(
                    k,
                    &s()?,
                    &["auto", "nftables", "iptables-nft", "iptables-legacy"],
                )?
            }
            "logFile" => {
                let v = s()?;
                self.log_file = if v.is_empty() { v } else { host_path(k, &v)? };
            }
            "pluginLogLevel" => {
                self.plugin_log_level = one_of(k, &s()?, &["error", "warn", "info", "debug"])?
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Rules between keys, once all settings are in.
    pub fn check(&self) -> Result<(), String> {
        if !self.chain_target.is_empty() && self.config_mode != "chain" {
            return Err(format!(
                "chainTarget={:?}: only with configMode=chain (configMode is {})",
                self.chain_target, self.config_mode
            ));
        }
        match (self.config_mode == "guard", self.guard_mesh.is_empty()) {
            (true, true) => Err(
                "configMode=guard: guardMesh must name the mesh whose CNI plugin to guard (istio, linkerd, consul or kuma)"
                    .to_string(),
            ),
            (false, false) => Err(format!(
                "guardMesh={:?}: only with configMode=guard (configMode is {})",
                self.guard_mesh, self.config_mode
            )),
            _ => Ok(()),
        }
    }

    /// What the operator should know before applying these settings.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        if self.taint_effect == "NoExecute" {
            w.push(format!(
                "taintEffect=NoExecute: a loss of protection longer than {} s evicts every pod on the node that does not tolerate interlock.dev/not-ready (a primary CNI's restart can cause one); NoSchedule only keeps new pods away",
                interlock_agent::kubernetes::gating::LOSS_DEBOUNCE.as_secs()
            ));
        }
        if self.guard_mesh == "consul" && self.taint_effect != "none" {
            w.push(format!(
                "guardMesh=consul: Consul's CNI DaemonSet does not tolerate the startup taint interlock.dev/not-ready:{}; add that toleration to it, or set taintEffect=none, or its pod never starts on a tainted node",
                self.taint_effect
            ));
        }
        if self.failure_policy == "open" {
            w.push(
                "failurePolicy=open: a meshed pod whose redirection fails starts without it (logged and recorded as unprotected) instead of being held back"
                    .into(),
            );
        }
        w
    }

    /// The CRI socket on the host: the setting, else the runtime's default.
    pub fn cri_socket(&self) -> &str {
        if !self.cri_socket.is_empty() {
            &self.cri_socket
        } else if self.runtime == "crio" {
            "/var/run/crio/crio.sock"
        } else {
            "/run/containerd/containerd.sock"
        }
    }

    /// The directory of the CRI socket on the host, mounted at the same path.
    pub fn cri_socket_dir(&self) -> &str {
        let s = self.cri_socket();
        match s.rsplit_once('/') {
            Some(("", _)) | None => "/",
            Some((dir, _)) => dir,
        }
    }

    /// The plugin settings the agent merges into its entry (`INTERLOCK_PLUGIN_CONFIG`):
    /// the plugin's own defaults are left out, so the file shows what was chosen.
    pub fn plugin_config(&self, state_dir: &str) -> String {
        let mut m = serde_json::Map::new();
        m.insert("profiles".into(), self.profiles.clone().into());
        m.insert(
            "excludeNamespaces".into(),
            self.exclude_namespaces.clone().into(),
        );
        // The agent socket: the plugin asks it when the runtime passed no annotations,
        // and notes each meshed ADD there so the audit looks at once.
        m.insert(
            "agentSocket".into(),
            format!(
                "{state_dir}/{}",
                interlock_contract::layout::AGENT_SOCKET_FILE
            )
            .into(),
        );
        let defaults = Values::default();
        if self.failure_policy != defaults.failure_policy {
            m.insert("failurePolicy".into(), self.failure_policy.clone().into());
        }
        if self.backend != defaults.backend {
            m.insert("backend".into(), self.backend.clone().into());
        }
        if !self.log_file.is_empty() {
            m.insert("logFile".into(), self.log_file.clone().into());
        }
        if self.plugin_log_level != defaults.plugin_log_level {
            m.insert("logLevel".into(), self.plugin_log_level.clone().into());
        }
        Value::Object(m).to_string()
    }
}

/// Merges a map setting: entries are added or replaced, `null` removes one (as Helm
/// does), so a values file can add a node pool's label to the default `kubernetes.io/os`.
fn merge_map(
    key: &str,
    into: &mut BTreeMap<String, String>,
    value: &Value,
    label_values: bool,
) -> Result<(), String> {
    let map = match value {
        Value::Object(m) => m,
        Value::Null => {
            into.clear();
            return Ok(());
        }
        other => {
            return Err(format!(
                "{key}: expected a map (name: value), found {}",
                kind_of(other)
            ))
        }
    };
    for (name, v) in map {
        if !is_qualified_name(name) {
            return Err(format!(
                "{key}.{name}: not a valid key (an optional DNS prefix and '/', then at most 63 of letters, digits, '-', '_', '.')"
            ));
        }
        if v.is_null() {
            into.remove(name);
            continue;
        }
        let v = scalar(&format!("{key}.{name}"), v)?;
        if label_values && !is_label_value(&v) {
            return Err(format!(
                "{key}.{name}={v:?}: not a valid label value (at most 63 of letters, digits, '-', '_', '.', alphanumeric at both ends)"
            ));
        }
        into.insert(name.clone(), v);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_label_keys_and_values_follow_the_api_rules() {
        for q in ["10m", "64Mi", "1", "0.5", "1e3", "2E-2", "+1Gi", "100k"] {
            assert!(is_quantity(q), "{q}");
        }
        for q in ["", "lots", "10MB", "1.2.3", ".", "e3", "1e", "64 Mi"] {
            assert!(!is_quantity(q), "{q}");
        }
        for k in [
            "pool",
            "kubernetes.io/os",
            "cloud.google.com/gke-nodepool",
            "a_b.c-d",
        ] {
            assert!(is_qualified_name(k), "{k}");
        }
        for k in ["", "/x", "Example.com/x", "a/", "-x", "x y"] {
            assert!(!is_qualified_name(k), "{k}");
        }
        assert!(is_label_value("") && is_label_value("pool-b") && is_label_value("1.2"));
        assert!(
            !is_label_value("-b") && !is_label_value("a b") && !is_label_value(&"x".repeat(64))
        );
    }

    #[test]
    fn every_key_is_applied_by_set_and_a_refused_one_changes_nothing() {
        let mut v = Values::default();
        for (kv, check) in [
            (
                "nodeSelector.pool=b",
                (|v: &Values| v.node_selector["pool"] == "b") as fn(&Values) -> bool,
            ),
            ("maxUnavailable=25%", |v| {
                v.max_unavailable == IntOrString::String("25%".into())
            }),
            ("imagePullSecrets=a,b", |v| {
                v.image_pull_secrets == ["a", "b"]
            }),
            ("labels.team=mesh", |v| v.labels["team"] == "mesh"),
            ("resources={requests: {cpu: 1}}", |v| {
                v.resources.limits.is_none()
            }),
            ("priorityClassName=", |v| v.priority_class_name.is_empty()),
            ("tolerations=[]", |v| v.tolerations.is_empty()),
        ] {
            v.set(kv).unwrap_or_else(|e| panic!("{kv}: {e}"));
            assert!(check(&v), "{kv}");
        }
        let before = v.clone();
        for kv in [
            "maxSurge=1",
            "maxUnavailable=0",
            "nodeSelector.pool=not ok",
            "labels.app.kubernetes.io/version=1",
            "affinity={nodeAfinity: {}}",
            "chainTarget=a/b",
            "logLevel=info; rm",
        ] {
            assert!(v.set(kv).is_err(), "{kv}");
        }
        assert_eq!(v, before, "a refused setting changes nothing");
        let mut w = Values::default();
        w.set("taintEffect=NoExecute").unwrap();
        assert!(w.warnings()[0].contains("3 s"), "{:?}", w.warnings());
        assert!(Values::default().warnings().is_empty());
    }
}

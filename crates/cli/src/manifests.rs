//! `interlock manifests [--set key=value …]`: the Kubernetes objects that install
//! interlock — the source of truth (`deploy/interlock.yaml` is the default rendering,
//! kept identical by a test). The settings are few and validated here ([`Values`]); the
//! rendering ([`render`]) is pure, so tests check the fields that matter and validate
//! every object against the Kubernetes schemas.

use clap::Args;
use interlock_contract::rbac::{Rule, AGENT_RULES, EVICT_RULES, NODE_SCOPE_POLICY};
use std::fmt::Write as _;

/// `interlock manifests` flags.
#[derive(Debug, Args)]
pub struct ManifestsArgs {
    /// A setting, `key=value` (repeatable): image, namespace, configMode, runtime,
    /// repairPolicy, taintEffect, profiles, excludeNamespaces, cniConfDir, cniBinDir,
    /// criSocket, healthPort, podMonitor, nodeScope.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
}

/// The settings `interlock manifests` renders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Values {
    /// The image holding both binaries, by full name (registry/path:tag or @digest).
    pub image: String,
    /// The namespace interlock runs in.
    pub namespace: String,
    /// `owned` or `chain`.
    pub config_mode: String,
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
}

/// The image the default rendering names: the release of this version.
pub const DEFAULT_IMAGE_REPOSITORY: &str = "ghcr.io/interlock-dev/interlock";

impl Default for Values {
    fn default() -> Values {
        Values {
            image: format!(
                "{DEFAULT_IMAGE_REPOSITORY}:v{}",
                interlock_buildinfo::CRATE_VERSION
            ),
            namespace: "interlock-system".into(),
            config_mode: "owned".into(),
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
    let ok = !v.is_empty()
        && v.len() <= 63
        && v.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !v.starts_with('-')
        && !v.ends_with('-');
    if ok {
        Ok(v.to_string())
    } else {
        Err(format!(
            "{key}={v:?}: not a namespace name (lower-case letters, digits and '-', at most 63)"
        ))
    }
}

fn host_path(key: &str, v: &str) -> Result<String, String> {
    if v.starts_with('/') && !v.contains("..") && !v.chars().any(|c| c.is_control()) {
        Ok(v.trim_end_matches('/').to_string()).map(|p| if p.is_empty() { "/".into() } else { p })
    } else {
        Err(format!("{key}={v:?}: expected an absolute host path"))
    }
}

fn boolean(key: &str, v: &str) -> Result<bool, String> {
    match v {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("{key}={v:?}: expected true or false")),
    }
}

fn list(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

impl Values {
    /// Applies one `key=value`; the error names the key and what it accepts.
    pub fn set(&mut self, kv: &str) -> Result<(), String> {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("--set {kv:?}: expected key=value"))?;
        match k {
            "image" => {
                // A full reference: a registry host (with a dot or a port, or localhost)
                // and a tag or digest. A bare name would be resolved through registry
                // defaults (Docker Hub, CRI-O's short-name search) for a node agent.
                let (name, tagged) = match v.split_once('@') {
                    Some((n, d)) => (n, d.starts_with("sha256:") && d.len() == 71),
                    None => {
                        let last = v.rsplit('/').next().unwrap_or(v);
                        (v, last.contains(':'))
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
                self.image = v.to_string();
            }
            "namespace" => self.namespace = dns_label(k, v)?,
            "configMode" => self.config_mode = one_of(k, v, &["owned", "chain"])?,
            "runtime" => self.runtime = one_of(k, v, &["containerd", "crio"])?,
            "repairPolicy" => {
                self.repair_policy =
                    one_of(k, v, &["repair", "restart", "delete", "evict", "report"])?
            }
            "taintEffect" => {
                self.taint_effect =
                    one_of(k, v, &["NoSchedule", "PreferNoSchedule", "NoExecute", "none"])?
            }
            "profiles" => {
                let ps = list(v);
                for p in &ps {
                    one_of(k, p, &["istio", "linkerd", "consul", "generic"])?;
                }
                if ps.is_empty() {
                    return Err(format!("{k}: name at least one profile"));
                }
                self.profiles = ps;
            }
            "excludeNamespaces" => {
                let ns = list(v);
                for n in &ns {
                    dns_label(k, n)?;
                }
                self.exclude_namespaces = ns;
            }
            "cniConfDir" => self.cni_conf_dir = host_path(k, v)?,
            "cniBinDir" => self.cni_bin_dir = host_path(k, v)?,
            "criSocket" => self.cri_socket = host_path(k, v)?,
            "healthPort" => {
                self.health_port = v
                    .parse::<u16>()
                    .ok()
                    .filter(|p| *p >= 1024)
                    .ok_or_else(|| format!("{k}={v:?}: expected a port from 1024 to 65535"))?
            }
            "podMonitor" => self.pod_monitor = boolean(k, v)?,
            "nodeScope" => self.node_scope = boolean(k, v)?,
            other => {
                return Err(format!(
                    "--set {other}: unknown setting (known: image, namespace, configMode, runtime, repairPolicy, taintEffect, profiles, excludeNamespaces, cniConfDir, cniBinDir, criSocket, healthPort, podMonitor, nodeScope)"
                ))
            }
        }
        Ok(())
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

    /// The plugin settings the agent merges into its entry (`INTERLOCK_PLUGIN_CONFIG`).
    pub fn plugin_config(&self) -> String {
        // The agent socket: the plugin asks it when the runtime passed no annotations,
        // and notes each meshed ADD there so the audit looks at once.
        serde_json::json!({
            "profiles": self.profiles,
            "excludeNamespaces": self.exclude_namespaces,
            "agentSocket": format!("{STATE_DIR}/{}", interlock_contract::layout::AGENT_SOCKET_FILE),
        })
        .to_string()
    }
}

/// A YAML scalar that is always a string (JSON string syntax is valid YAML).
fn q(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

fn rules_yaml(rules: &[Rule]) -> String {
    let mut out = String::new();
    for r in rules {
        let words = |xs: &[&str]| xs.iter().map(|x| q(x)).collect::<Vec<_>>().join(", ");
        let _ = write!(
            out,
            "  - apiGroups: [{}]\n    resources: [{}]\n    verbs: [{}]\n",
            q(r.group),
            words(r.resources),
            words(r.verbs)
        );
    }
    out
}

/// Where the host's dirs appear in the container.
const CONF_MOUNT: &str = "/host/etc/cni/net.d";
const BIN_MOUNT: &str = "/host/opt/cni/bin";
/// The state dir: the same path on the host and in the container (see the comment in
/// the DaemonSet).
const STATE_DIR: &str = "/var/run/interlock";

/// The objects, as one YAML stream.
pub fn render(v: &Values) -> String {
    let ns = &v.namespace;
    let port = v.health_port;
    let version = interlock_buildinfo::CRATE_VERSION;
    let labels = format!(
        "app.kubernetes.io/name: interlock\n    app.kubernetes.io/part-of: interlock\n    app.kubernetes.io/version: {}",
        q(version)
    );
    let cri = v.cri_socket();
    let mut out = format!(
        r#"# interlock: the node agent and the interlock-cni plugin, as a DaemonSet.
# Rendered by `interlock manifests` (the source of truth); change settings with
# `interlock manifests --set key=value … | kubectl apply -f -`.
apiVersion: v1
kind: Namespace
metadata:
  name: {ns}
  labels:
    {labels}
    # The agent needs hostNetwork, hostPath mounts and capabilities: Pod Security
    # "baseline" and "restricted" would reject it.
    pod-security.kubernetes.io/enforce: privileged
    pod-security.kubernetes.io/audit: privileged
    pod-security.kubernetes.io/warn: privileged
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: interlock
  namespace: {ns}
  labels:
    {labels}
---
# The agent's API access: exactly interlock_contract::rbac::AGENT_RULES.
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: interlock-agent
  labels:
    {labels}
rules:
{rules}---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: interlock-agent
  labels:
    {labels}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: interlock-agent
subjects:
  - kind: ServiceAccount
    name: interlock
    namespace: {ns}
---
# The agent's settings as its INTERLOCK_* environment: `kubectl exec … interlock check`
# in the agent's pod sees the same ones and needs no flags.
apiVersion: v1
kind: ConfigMap
metadata:
  name: interlock-config
  namespace: {ns}
  labels:
    {labels}
data:
  INTERLOCK_CNI_CONF_DIR: {conf_mount}
  INTERLOCK_CNI_BIN_DIR: {bin_mount}
  INTERLOCK_STATE_DIR: {state}
  INTERLOCK_CONFIG_MODE: {mode}
  INTERLOCK_RUNTIME: {runtime}
  INTERLOCK_REPAIR_POLICY: {repair}
  INTERLOCK_TAINT_EFFECT: {taint}
  INTERLOCK_CRI_ENDPOINT: {cri_endpoint}
  INTERLOCK_KUBE: "auto"
  # The plugin's own settings (ConfigMap interlock-plugin-config), merged into the
  # entry the agent writes.
  INTERLOCK_PLUGIN_CONFIG: "/etc/interlock/plugin-config.json"
  INTERLOCK_PLUGIN_SOURCE: "/usr/local/bin/interlock-cni"
  # The kubelet's probes (/healthz, /readyz only) on the node's loopback (the pod is
  # hostNetwork): no pod and nothing off the node reaches them, so no flood of the
  # metrics port can fail a liveness probe. `interlock check` on the node asks here too.
  # The metrics listener is the node's own IP, same port (INTERLOCK_HEALTH_ADDR below).
  INTERLOCK_PROBE_ADDR: "127.0.0.1:{port}"
---
# The plugin's settings, a file (apart from the environment above: envFrom would skip
# a key that is not a variable name, with a warning Event).
apiVersion: v1
kind: ConfigMap
metadata:
  name: interlock-plugin-config
  namespace: {ns}
  labels:
    {labels}
data:
  plugin-config.json: {plugin_config}
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: interlock-node
  namespace: {ns}
  labels:
    {labels}
spec:
  selector:
    matchLabels:
      app.kubernetes.io/name: interlock
  updateStrategy:
    type: RollingUpdate
    rollingUpdate:
      maxUnavailable: 1
  template:
    metadata:
      labels:
        {pod_labels}
      annotations:
        prometheus.io/scrape: "true"
        prometheus.io/port: "{port}"
        prometheus.io/path: "/metrics"
    spec:
      serviceAccountName: interlock
      # The agent must run while pod networking is broken (that is when it is needed),
      # and hostNetwork pods never go through CNI.
      hostNetwork: true
      dnsPolicy: ClusterFirstWithHostNet
      priorityClassName: system-node-critical
      nodeSelector:
        kubernetes.io/os: linux
      tolerations:
        # Run before anything else, on every node, whatever its taints (including
        # interlock's own startup taint).
        - operator: Exists
      terminationGracePeriodSeconds: 30
      containers:
        - name: agent
          image: {image}
          imagePullPolicy: IfNotPresent
          command: ["/usr/local/bin/interlock", "agent"]
          envFrom:
            - configMapRef:
                name: interlock-config
          env:
            - name: NODE_NAME
              valueFrom:
                fieldRef:
                  fieldPath: spec.nodeName
            # `interlock check` in the pod names this namespace in its hints.
            - name: POD_NAMESPACE
              valueFrom:
                fieldRef:
                  fieldPath: metadata.namespace
            # /metrics (with /healthz and /readyz) on the node's IP only, not on every
            # interface: Prometheus scrapes the pod IP, which is the node's.
            - name: HOST_IP
              valueFrom:
                fieldRef:
                  fieldPath: status.hostIP
            - name: INTERLOCK_HEALTH_ADDR
              value: "$(HOST_IP):{port}"
            # The image's iptables-legacy tools (legacy nodes) take their lock here: the
            # image's root is read-only. The plugin on the host uses the host's lock; the
            # netns lock in the state dir keeps the two from one pod's netns at once.
            - name: XTABLES_LOCKFILE
              value: "{state_plain}/xtables.lock"
          ports:
            - name: metrics
              containerPort: {port}
              hostPort: {port}
              protocol: TCP
          securityContext:
            privileged: false
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            runAsUser: 0
            seccompProfile:
              type: RuntimeDefault
            capabilities:
              drop: ["ALL"]
              # Each one shown needed, and the set enough, by running the real agent's
              # audit and repair with exactly it (crates/cli/tests/capabilities.rs).
              add:
                # The audit's read-back and in-place repair: nftables/iptables rules
                # inside a pod's network namespace, and ending the connections opened
                # before them (SOCK_DESTROY).
                - NET_ADMIN
                # The iptables-legacy backend (nodes whose rules are legacy iptables):
                # its tools talk to the kernel through a raw socket.
                - NET_RAW
                # setns(2) into a pod's network namespace (the audit and its repair).
                - SYS_ADMIN
          # On the loopback probe listener (INTERLOCK_PROBE_ADDR): the kubelet runs in
          # the node's network namespace, which is the pod's.
          readinessProbe:
            httpGet:
              host: 127.0.0.1
              path: /readyz
              port: {port}
            periodSeconds: 2
          livenessProbe:
            httpGet:
              host: 127.0.0.1
              path: /healthz
              port: {port}
            periodSeconds: 10
            failureThreshold: 3
          resources:
            requests:
              cpu: 10m
              memory: 24Mi
            limits:
              memory: 64Mi
          volumeMounts:
            - name: cni-conf
              mountPath: {conf_mount_plain}
            - name: cni-bin
              mountPath: {bin_mount_plain}
            # The same path on the host and in the container: the agent writes it into
            # the plugin entry (stateDir) that the plugin, run by the runtime on the
            # host, reads — with its readiness marker and the agent socket in it.
            - name: state
              mountPath: {state_plain}
            # The audit enters pod network namespaces by the paths the runtime reports.
            - name: netns
              mountPath: /var/run/netns
              mountPropagation: HostToContainer
              readOnly: true
            # The audit lists the node's pod sandboxes over CRI. The socket's directory,
            # not the socket file: a runtime re-creates its socket when it restarts, and a
            # bind mount of the file would keep the old one (the audit reconnects by path).
            # Read-only: connecting to a socket needs no write access to the mount.
            - name: cri-socket-dir
              mountPath: {cri_dir_plain}
              readOnly: true
            - name: config
              mountPath: /etc/interlock
              readOnly: true
      volumes:
        - name: cni-conf
          hostPath:
            path: {conf_dir}
            type: DirectoryOrCreate
        - name: cni-bin
          hostPath:
            path: {bin_dir}
            type: DirectoryOrCreate
        - name: state
          hostPath:
            path: {state}
            type: DirectoryOrCreate
        - name: netns
          hostPath:
            path: /var/run/netns
            type: DirectoryOrCreate
        - name: cri-socket-dir
          hostPath:
            path: {cri_dir_q}
            type: Directory
        - name: config
          configMap:
            name: interlock-plugin-config
            items:
              - key: plugin-config.json
                path: plugin-config.json
"#,
        rules = rules_yaml(AGENT_RULES),
        pod_labels = labels.replace("\n    ", "\n        "),
        conf_mount = q(CONF_MOUNT),
        bin_mount = q(BIN_MOUNT),
        conf_mount_plain = CONF_MOUNT,
        bin_mount_plain = BIN_MOUNT,
        state = q(STATE_DIR),
        state_plain = STATE_DIR,
        mode = q(&v.config_mode),
        runtime = q(&v.runtime),
        repair = q(&v.repair_policy),
        taint = q(&v.taint_effect),
        cri_endpoint = q(&format!("unix://{cri}")),
        cri_dir_plain = q(v.cri_socket_dir()),
        cri_dir_q = q(v.cri_socket_dir()),
        plugin_config = q(&v.plugin_config()),
        image = q(&v.image),
        conf_dir = q(&v.cni_conf_dir),
        bin_dir = q(&v.cni_bin_dir),
    );
    if v.repair_policy == "evict" {
        let _ = write!(
            out,
            r#"---
# repairPolicy=evict only: the Eviction subresource (PodDisruptionBudgets apply). No
# admission policy can narrow it to this node's pods (a policy sees the Eviction, not
# the pod): with it, each node's agent token may evict any pod of the cluster. The
# other repair policies need no such grant.
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: interlock-agent-evict
  labels:
    {labels}
rules:
{rules}---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: interlock-agent-evict
  labels:
    {labels}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: interlock-agent-evict
subjects:
  - kind: ServiceAccount
    name: interlock
    namespace: {ns}
"#,
            rules = rules_yaml(EVICT_RULES),
        );
    }
    if v.node_scope {
        let _ = write!(
            out,
            r#"---
# Least privilege at cluster scope. RBAC gives every node's agent the same cluster-wide
# verbs; this policy lets an agent's token change only its own Node and the pods bound
# to its node, and report Events only as its own node's agent, keyed on the node claim
# of the agent pod's token (authentication.kubernetes.io/node-name), as NodeRestriction
# does for the kubelet. Needs Kubernetes 1.30 or later (admissionregistration.k8s.io/v1
# and the claim, on by default); a token without the claim may write nothing. Older
# clusters: render with --set nodeScope=false (the RBAC alone then applies).
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {policy}
  labels:
    {labels}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: [""]
        apiVersions: ["v1"]
        operations: ["UPDATE", "DELETE"]
        resources: ["nodes", "nodes/status", "pods"]
      - apiGroups: ["events.k8s.io"]
        apiVersions: ["v1"]
        operations: ["CREATE", "UPDATE"]
        resources: ["events"]
  matchConditions:
    - name: interlock-agent
      expression: "request.userInfo.username == 'system:serviceaccount:{ns}:interlock'"
  variables:
    - name: node
      expression: "has(request.userInfo.extra) && 'authentication.kubernetes.io/node-name' in request.userInfo.extra && size(request.userInfo.extra['authentication.kubernetes.io/node-name']) == 1 ? request.userInfo.extra['authentication.kubernetes.io/node-name'][0] : ''"
  validations:
    - expression: "variables.node != ''"
      message: "the interlock agent's token carries no node claim (authentication.kubernetes.io/node-name, Kubernetes 1.30 or later): it may change nothing"
    - expression: "request.resource.resource != 'nodes' || request.name == variables.node"
      messageExpression: "'the interlock agent of node ' + variables.node + ' may change only its own Node, not ' + request.name"
    - expression: "request.resource.resource != 'pods' || (has(oldObject.spec.nodeName) && oldObject.spec.nodeName == variables.node)"
      messageExpression: "'the interlock agent of node ' + variables.node + ' may change only the pods bound to its node, not ' + request.namespace + '/' + request.name"
    - expression: "request.resource.resource != 'events' || (has(object.reportingInstance) && object.reportingInstance == 'interlock.dev/agent/' + variables.node)"
      messageExpression: "'the interlock agent of node ' + variables.node + ' may report Events only as interlock.dev/agent/' + variables.node"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {policy}
  labels:
    {labels}
spec:
  policyName: {policy}
  validationActions: ["Deny"]
"#,
            policy = NODE_SCOPE_POLICY,
        );
    }
    if v.pod_monitor {
        let _ = write!(
            out,
            r#"---
# For the prometheus-operator (its CRD must be installed).
apiVersion: monitoring.coreos.com/v1
kind: PodMonitor
metadata:
  name: interlock
  namespace: {ns}
  labels:
    {labels}
spec:
  selector:
    matchLabels:
      app.kubernetes.io/name: interlock
  podMetricsEndpoints:
    - port: metrics
      path: /metrics
"#
        );
    }
    out
}

/// Runs `interlock manifests`.
pub fn run(a: ManifestsArgs) -> anyhow::Result<std::process::ExitCode> {
    let mut v = Values::default();
    for kv in &a.set {
        v.set(kv).map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(render(&v).as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(std::process::ExitCode::SUCCESS),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_validated_with_a_message_naming_the_key() {
        let mut v = Values::default();
        for (kv, needle) in [
            ("image=interlock:dev", "full reference"),
            ("image=ghcr.io/x/interlock", "tag or digest"),
            ("image=ghcr.io/x/interlock@sha256:abc", "tag or digest"),
            ("configMode=inline", "owned, chain"),
            ("runtime=docker", "containerd, crio"),
            ("repairPolicy=kill", "repair, restart"),
            ("taintEffect=NoWay", "NoSchedule"),
            ("profiles=kuma", "istio, linkerd, consul, generic"),
            ("excludeNamespaces=Kube_System", "namespace name"),
            ("cniConfDir=etc/cni", "absolute"),
            ("healthPort=80", "1024"),
            ("podMonitor=yes", "true or false"),
            ("nope=1", "unknown setting"),
            ("image", "key=value"),
        ] {
            let e = v.set(kv).unwrap_err();
            assert!(e.contains(needle), "{kv}: {e}");
        }
        assert_eq!(v, Values::default(), "a refused setting changes nothing");
        v.set("image=registry.example.com:5000/team/interlock@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
            .unwrap();
        v.set("image=localhost/interlock:test").unwrap();
        v.set("profiles=linkerd, istio").unwrap();
        assert_eq!(v.profiles, ["linkerd", "istio"]);
        v.set("runtime=crio").unwrap();
        assert_eq!(v.cri_socket(), "/var/run/crio/crio.sock");
        assert_eq!(v.cri_socket_dir(), "/var/run/crio");
    }

    #[test]
    fn the_default_image_is_a_full_reference_with_this_version() {
        let v = Values::default();
        assert!(v.image.starts_with("ghcr.io/"), "{}", v.image);
        assert!(v
            .image
            .ends_with(&format!(":v{}", interlock_buildinfo::CRATE_VERSION)));
        let mut w = Values::default();
        w.set(&format!("image={}", v.image)).unwrap();
    }
}

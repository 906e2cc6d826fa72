//! The Kubernetes objects of `interlock manifests`, built as typed objects (k8s-openapi)
//! from [`Values`]: each setting is a field here, and the reason for each field is the
//! comment next to it. [`objects`] returns them with the comment each carries in the
//! YAML; [`super::render`] writes the stream.

use super::values::Values;
use interlock_contract::rbac::{
    Rule, AGENT_NAMESPACE_RULES, AGENT_RULES, EVICT_RULES, NODE_SCOPE_POLICY,
};
use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, NamedRuleWithOperations, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, ValidatingAdmissionPolicyBindingSpec,
    ValidatingAdmissionPolicySpec, Validation, Variable,
};
use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy, RollingUpdateDaemonSet,
};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapEnvSource, ConfigMapVolumeSource, Container, ContainerPort,
    EnvFromSource, EnvVar, EnvVarSource, HTTPGetAction, HostPathVolumeSource, KeyToPath,
    LocalObjectReference, Namespace, ObjectFieldSelector, PodSpec, PodTemplateSpec, Probe,
    SeccompProfile, SecurityContext, ServiceAccount, Volume, VolumeMount,
};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::BTreeMap;

/// Where the host's dirs appear in the container.
pub const CONF_MOUNT: &str = "/host/etc/cni/net.d";
/// Where the host's CNI bin dir appears in the container.
pub const BIN_MOUNT: &str = "/host/opt/cni/bin";
/// The state dir: the same path on the host and in the container, because the agent
/// writes it into the plugin entry (`stateDir`) that the plugin, run by the runtime on
/// the host, reads — with the readiness marker and the agent socket in it.
pub const STATE_DIR: &str = interlock_contract::layout::DEFAULT_STATE_DIR;

/// One object of the stream, with the comment written above it.
pub struct Object {
    /// `#` lines above the object (without the `#`).
    pub comment: &'static str,
    /// The object as YAML.
    pub yaml: String,
}

fn yaml<T: serde::Serialize>(comment: &'static str, object: &T) -> Object {
    Object {
        comment,
        // Serializing a k8s-openapi object or a JSON value to YAML cannot fail (string
        // keys, no non-finite floats).
        yaml: serde_yaml_ng::to_string(object).expect("a Kubernetes object serializes to YAML"),
    }
}

fn strings(xs: &[&str]) -> Vec<String> {
    xs.iter().map(|x| x.to_string()).collect()
}

/// The labels on every object: interlock's own and the extra ones.
fn labels(v: &Values) -> BTreeMap<String, String> {
    let mut l = v.labels.clone();
    l.insert("app.kubernetes.io/name".into(), "interlock".into());
    l.insert("app.kubernetes.io/part-of".into(), "interlock".into());
    l.insert(
        "app.kubernetes.io/version".into(),
        interlock_buildinfo::CRATE_VERSION.into(),
    );
    l
}

fn meta(v: &Values, name: &str, namespaced: bool) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: namespaced.then(|| v.namespace.clone()),
        labels: Some(labels(v)),
        annotations: (!v.annotations.is_empty()).then(|| v.annotations.clone()),
        ..Default::default()
    }
}

fn policy_rules(rules: &[Rule]) -> Vec<PolicyRule> {
    rules
        .iter()
        .map(|r| PolicyRule {
            api_groups: Some(vec![r.group.to_string()]),
            resources: Some(strings(r.resources)),
            verbs: strings(r.verbs),
            ..Default::default()
        })
        .collect()
}

fn agent_subject(v: &Values) -> Vec<Subject> {
    vec![Subject {
        kind: "ServiceAccount".into(),
        name: "interlock".into(),
        namespace: Some(v.namespace.clone()),
        ..Default::default()
    }]
}

fn role_ref(kind: &str, name: &str) -> RoleRef {
    RoleRef {
        api_group: "rbac.authorization.k8s.io".into(),
        kind: kind.into(),
        name: name.into(),
    }
}

fn binding(v: &Values, name: &str) -> ClusterRoleBinding {
    ClusterRoleBinding {
        metadata: meta(v, name, false),
        role_ref: role_ref("ClusterRole", name),
        subjects: Some(agent_subject(v)),
    }
}

/// Every object, in the order they are applied.
pub fn objects(v: &Values) -> Vec<Object> {
    let mut out = vec![
        yaml(
            "The agent needs hostNetwork, hostPath mounts and capabilities: Pod Security\n\"baseline\" and \"restricted\" would reject it, hence \"privileged\" here.",
            &namespace(v),
        ),
        yaml(
            "",
            &ServiceAccount {
                metadata: meta(v, "interlock", true),
                ..Default::default()
            },
        ),
        yaml(
            "The agent's API access: exactly interlock_contract::rbac::AGENT_RULES.",
            &ClusterRole {
                metadata: meta(v, "interlock-agent", false),
                rules: Some(policy_rules(AGENT_RULES)),
                ..Default::default()
            },
        ),
        yaml("", &binding(v, "interlock-agent")),
        yaml(
            "The agent's API access in its own namespace only: exactly\ninterlock_contract::rbac::AGENT_NAMESPACE_RULES (reading its DaemonSet on SIGTERM,\nfor INTERLOCK_UNINSTALL_ON_EXIT=when-deleted; rendered whatever that setting is).",
            &Role {
                metadata: meta(v, "interlock-agent", true),
                rules: Some(policy_rules(AGENT_NAMESPACE_RULES)),
            },
        ),
        yaml(
            "",
            &RoleBinding {
                metadata: meta(v, "interlock-agent", true),
                role_ref: role_ref("Role", "interlock-agent"),
                subjects: Some(agent_subject(v)),
            },
        ),
        yaml(
            "The agent's settings as its INTERLOCK_* environment: `kubectl exec … interlock check`\nin the agent's pod sees the same ones and needs no flags. INTERLOCK_PROBE_ADDR: the\nkubelet's probes (/healthz, /readyz only) on the node's loopback (the pod is\nhostNetwork), so no flood of the metrics port can fail a liveness probe.",
            &agent_config(v),
        ),
        yaml(
            "The plugin's settings, a file merged into the entry the agent writes (apart from the\nenvironment above: envFrom would skip a key that is not a variable name).",
            &ConfigMap {
                metadata: meta(v, "interlock-plugin-config", true),
                data: Some(BTreeMap::from([(
                    "plugin-config.json".into(),
                    v.plugin_config(STATE_DIR),
                )])),
                ..Default::default()
            },
        ),
        yaml(
            "The node agent. Not privileged: exactly NET_ADMIN (the audit's read-back and\nrepair of a pod's rules, ending connections opened before them), NET_RAW (the\niptables-legacy backend's tools) and SYS_ADMIN (setns into a pod's network\nnamespace), each shown needed and the set enough by crates/cli/tests/it/capabilities.rs.\nThe CRI socket's directory is mounted, not the socket: a runtime re-creates its\nsocket when it restarts, and a bind mount of the file would keep the old one.",
            &daemon_set(v),
        ),
    ];
    if v.repair_policy == "evict" {
        out.push(yaml(
            "repairPolicy=evict only: the Eviction subresource (PodDisruptionBudgets apply). No\nadmission policy can narrow it to this node's pods (a policy sees the Eviction, not\nthe pod): with it, each node's agent token may evict any pod of the cluster. The\nother repair policies need no such grant.",
            &ClusterRole {
                metadata: meta(v, "interlock-agent-evict", false),
                rules: Some(policy_rules(EVICT_RULES)),
                ..Default::default()
            },
        ));
        out.push(yaml("", &binding(v, "interlock-agent-evict")));
    }
    if v.node_scope {
        let (policy, binding) = node_scope(v);
        out.push(yaml(
            "Least privilege at cluster scope. RBAC gives every node's agent the same cluster-wide\nverbs; this policy lets an agent's token change only its own Node and the pods bound\nto its node, and report Events only as its own node's agent, keyed on the node claim\nof the agent pod's token (authentication.kubernetes.io/node-name), as NodeRestriction\ndoes for the kubelet. Needs Kubernetes 1.30 or later; a token without the claim may\nwrite nothing. Older clusters: render with --set nodeScope=false (the RBAC alone applies).",
            &policy,
        ));
        out.push(yaml("", &binding));
    }
    if v.pod_monitor {
        out.push(yaml(
            "For the prometheus-operator (its CRD must be installed).",
            &serde_json::json!({
                "apiVersion": "monitoring.coreos.com/v1",
                "kind": "PodMonitor",
                "metadata": meta(v, "interlock", true),
                "spec": {
                    "selector": {"matchLabels": {"app.kubernetes.io/name": "interlock"}},
                    "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics"}],
                },
            }),
        ));
    }
    out
}

fn namespace(v: &Values) -> Namespace {
    let mut m = meta(v, &v.namespace, false);
    let l = m.labels.get_or_insert_with(BTreeMap::new);
    for mode in ["enforce", "audit", "warn"] {
        l.insert(
            format!("pod-security.kubernetes.io/{mode}"),
            "privileged".into(),
        );
    }
    Namespace {
        metadata: m,
        ..Default::default()
    }
}

fn agent_config(v: &Values) -> ConfigMap {
    let mut data = BTreeMap::from([
        ("INTERLOCK_CNI_CONF_DIR", CONF_MOUNT.to_string()),
        ("INTERLOCK_CNI_BIN_DIR", BIN_MOUNT.to_string()),
        ("INTERLOCK_STATE_DIR", STATE_DIR.to_string()),
        ("INTERLOCK_CONFIG_MODE", v.config_mode.clone()),
        ("INTERLOCK_RUNTIME", v.runtime.clone()),
        ("INTERLOCK_REPAIR_POLICY", v.repair_policy.clone()),
        ("INTERLOCK_TAINT_EFFECT", v.taint_effect.clone()),
        (
            "INTERLOCK_CRI_ENDPOINT",
            format!("unix://{}", v.cri_socket()),
        ),
        ("INTERLOCK_KUBE", "auto".into()),
        (
            "INTERLOCK_PLUGIN_CONFIG",
            "/etc/interlock/plugin-config.json".into(),
        ),
        (
            "INTERLOCK_PLUGIN_SOURCE",
            "/usr/local/bin/interlock-cni".into(),
        ),
        (
            "INTERLOCK_PROBE_ADDR",
            format!("127.0.0.1:{}", v.health_port),
        ),
        ("INTERLOCK_LOG", v.log_level.clone()),
        ("INTERLOCK_LOG_FORMAT", v.log_format.clone()),
        ("INTERLOCK_AUDIT_INTERVAL", v.audit_interval.clone()),
    ]);
    if !v.allow_ahead.is_empty() {
        data.insert("INTERLOCK_ALLOW_AHEAD", v.allow_ahead.join(","));
    }
    if !v.max_cni_version.is_empty() {
        data.insert("INTERLOCK_MAX_CNI_VERSION", v.max_cni_version.clone());
    }
    if !v.guard_mesh.is_empty() {
        data.insert("INTERLOCK_GUARD_MESH", v.guard_mesh.clone());
        data.insert("INTERLOCK_GUARD_HOST_ROOT", GUARD_HOST_ROOT.into());
    }
    if v.uninstall_on_exit != "false" {
        data.insert("INTERLOCK_UNINSTALL_ON_EXIT", v.uninstall_on_exit.clone());
    }
    if !v.chain_target.is_empty() {
        data.insert("INTERLOCK_CHAIN_TARGET", v.chain_target.clone());
    }
    ConfigMap {
        metadata: meta(v, super::AGENT_CONFIG_MAP, true),
        data: Some(data.into_iter().map(|(k, v)| (k.to_string(), v)).collect()),
        ..Default::default()
    }
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn host_path(name: &str, path: &str, type_: &str) -> Volume {
    Volume {
        name: name.into(),
        host_path: Some(HostPathVolumeSource {
            path: path.into(),
            type_: Some(type_.into()),
        }),
        ..Default::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

fn probe(path: &str, port: u16, period: i32, failure_threshold: Option<i32>) -> Probe {
    Probe {
        // The loopback probe listener (INTERLOCK_PROBE_ADDR): the kubelet runs in the
        // node's network namespace, which is the pod's.
        http_get: Some(HTTPGetAction {
            host: Some("127.0.0.1".into()),
            path: Some(path.into()),
            port: IntOrString::Int(port.into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        failure_threshold,
        ..Default::default()
    }
}

/// The agent container: the image, its settings, probes, privileges and mounts.
fn agent_container(v: &Values) -> Container {
    let port = v.health_port;
    Container {
        name: "agent".into(),
        image: Some(v.image.clone()),
        image_pull_policy: Some(v.image_pull_policy.clone()),
        command: Some(strings(&["/usr/local/bin/interlock", "agent"])),
        env_from: Some(vec![EnvFromSource {
            config_map_ref: Some(ConfigMapEnvSource {
                name: super::AGENT_CONFIG_MAP.into(),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        env: Some(vec![
            field_env("NODE_NAME", "spec.nodeName"),
            // `interlock check` in the pod names this namespace in its hints; with
            // POD_NAME, uninstall-on-exit `when-deleted` reads the pod's owning DaemonSet.
            field_env("POD_NAMESPACE", "metadata.namespace"),
            field_env("POD_NAME", "metadata.name"),
            // /metrics (with /healthz and /readyz) on the node's IP only, not on every
            // interface: Prometheus scrapes the pod IP, which is the node's.
            field_env("HOST_IP", "status.hostIP"),
            EnvVar {
                name: "INTERLOCK_HEALTH_ADDR".into(),
                value: Some(format!("$(HOST_IP):{port}")),
                ..Default::default()
            },
            // The image's iptables-legacy tools take their lock here: the image's root
            // is read-only. The plugin on the host uses the host's lock; the netns lock
            // in the state dir keeps the two from one pod's netns at once.
            EnvVar {
                name: "XTABLES_LOCKFILE".into(),
                value: Some(format!("{STATE_DIR}/xtables.lock")),
                ..Default::default()
            },
        ]),
        ports: Some(vec![ContainerPort {
            name: Some("metrics".into()),
            container_port: port.into(),
            host_port: Some(port.into()),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        security_context: Some(SecurityContext {
            privileged: Some(false),
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_user: Some(0),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..Default::default()
            }),
            capabilities: Some(Capabilities {
                drop: Some(strings(&["ALL"])),
                add: Some(strings(&["NET_ADMIN", "NET_RAW", "SYS_ADMIN"])),
            }),
            ..Default::default()
        }),
        readiness_probe: Some(probe("/readyz", port, 2, None)),
        liveness_probe: Some(probe("/healthz", port, 10, Some(3))),
        resources: Some(v.resources.clone()),
        volume_mounts: Some(
            vec![
                mount("cni-conf", CONF_MOUNT, false),
                mount("cni-bin", BIN_MOUNT, false),
                mount("state", STATE_DIR, false),
                // The audit enters pod network namespaces by the paths the runtime reports.
                VolumeMount {
                    mount_propagation: Some("HostToContainer".into()),
                    ..mount("netns", "/var/run/netns", true)
                },
                // The audit lists the node's sandboxes over CRI and reconnects by path.
                // Read-only: connecting to a socket needs no write access to the mount.
                mount("cri-socket-dir", v.cri_socket_dir(), true),
                mount("config", "/etc/interlock", true),
            ]
            .into_iter()
            .chain(guard_run_dir(v).map(|(_, inside)| VolumeMount {
                // istio-cni's installer creates and fills the directory after the agent
                // starts: its files must show through.
                mount_propagation: Some("HostToContainer".into()),
                ..mount("guard-run-dir", &inside, true)
            }))
            .collect(),
        ),
        ..Default::default()
    }
}

/// Guard mode: the host directory outside the conf dir where the guarded mesh's plugin
/// keeps what its ADD needs (istio-cni's kubeconfig in its run dir), and where the agent
/// sees it (under [`GUARD_HOST_ROOT`]), so that it can tell the plugin would run.
fn guard_run_dir(v: &Values) -> Option<(String, String)> {
    (v.config_mode == "guard" && v.guard_mesh == "istio").then(|| {
        let host = ISTIO_CNI_RUN_DIR.to_string();
        (host.clone(), format!("{GUARD_HOST_ROOT}{host}"))
    })
}

/// Where guard mode's host paths are mounted in the agent's container.
const GUARD_HOST_ROOT: &str = "/host";
/// istio-cni's run dir on the host (its chart's `cniAgentRunDir`), which holds the
/// kubeconfig its plugin reads at every ADD.
const ISTIO_CNI_RUN_DIR: &str = "/var/run/istio-cni";

/// The agent pod: host network, scheduling settings and the host paths it mounts.
fn pod_spec(v: &Values) -> PodSpec {
    PodSpec {
        service_account_name: Some("interlock".into()),
        // The agent must run while pod networking is broken (that is when it is needed),
        // and hostNetwork pods never go through CNI.
        host_network: Some(true),
        dns_policy: Some("ClusterFirstWithHostNet".into()),
        priority_class_name: (!v.priority_class_name.is_empty())
            .then(|| v.priority_class_name.clone()),
        node_selector: (!v.node_selector.is_empty()).then(|| v.node_selector.clone()),
        affinity: v.affinity.clone(),
        tolerations: (!v.tolerations.is_empty()).then(|| v.tolerations.clone()),
        image_pull_secrets: (!v.image_pull_secrets.is_empty()).then(|| {
            v.image_pull_secrets
                .iter()
                .map(|n| LocalObjectReference { name: n.clone() })
                .collect()
        }),
        termination_grace_period_seconds: Some(30),
        containers: vec![agent_container(v)],
        volumes: Some(
            vec![
                host_path("cni-conf", &v.cni_conf_dir, "DirectoryOrCreate"),
                host_path("cni-bin", &v.cni_bin_dir, "DirectoryOrCreate"),
                host_path("state", STATE_DIR, "DirectoryOrCreate"),
                host_path("netns", "/var/run/netns", "DirectoryOrCreate"),
                host_path("cri-socket-dir", v.cri_socket_dir(), "Directory"),
                Volume {
                    name: "config".into(),
                    config_map: Some(ConfigMapVolumeSource {
                        name: "interlock-plugin-config".into(),
                        items: Some(vec![KeyToPath {
                            key: "plugin-config.json".into(),
                            path: "plugin-config.json".into(),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ]
            .into_iter()
            .chain(
                guard_run_dir(v)
                    .map(|(host, _)| host_path("guard-run-dir", &host, "DirectoryOrCreate")),
            )
            .collect(),
        ),
        ..Default::default()
    }
}

fn daemon_set(v: &Values) -> DaemonSet {
    let mut pod_annotations = v.annotations.clone();
    pod_annotations.extend([
        ("prometheus.io/scrape".to_string(), "true".to_string()),
        ("prometheus.io/port".into(), v.health_port.to_string()),
        ("prometheus.io/path".into(), "/metrics".into()),
    ]);
    DaemonSet {
        metadata: meta(v, "interlock-node", true),
        spec: Some(DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    "app.kubernetes.io/name".into(),
                    "interlock".into(),
                )])),
                ..Default::default()
            },
            update_strategy: Some(DaemonSetUpdateStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDaemonSet {
                    max_unavailable: Some(v.max_unavailable.clone()),
                    // Always 0 (values.rs says why): left to the default.
                    max_surge: None,
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(v)),
                    annotations: Some(pod_annotations),
                    ..Default::default()
                }),
                spec: Some(pod_spec(v)),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn node_scope(v: &Values) -> (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) {
    let rule = |group: &str, resources: &[&str], operations: &[&str]| NamedRuleWithOperations {
        api_groups: Some(vec![group.into()]),
        api_versions: Some(vec!["v1".into()]),
        operations: Some(strings(operations)),
        resources: Some(strings(resources)),
        ..Default::default()
    };
    let validation =
        |expression: &str, message: Option<&str>, message_expression: Option<&str>| Validation {
            expression: expression.into(),
            message: message.map(str::to_string),
            message_expression: message_expression.map(str::to_string),
            ..Default::default()
        };
    const NODE_CLAIM: &str = "authentication.kubernetes.io/node-name";
    let policy = ValidatingAdmissionPolicy {
        metadata: meta(v, NODE_SCOPE_POLICY, false),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".into()),
            match_constraints: Some(MatchResources {
                resource_rules: Some(vec![
                    rule("", &["nodes", "nodes/status", "pods"], &["UPDATE", "DELETE"]),
                    rule("events.k8s.io", &["events"], &["CREATE", "UPDATE"]),
                ]),
                ..Default::default()
            }),
            match_conditions: Some(vec![MatchCondition {
                name: "interlock-agent".into(),
                expression: format!(
                    "request.userInfo.username == 'system:serviceaccount:{}:interlock'",
                    v.namespace
                ),
            }]),
            variables: Some(vec![Variable {
                name: "node".into(),
                expression: format!(
                    "has(request.userInfo.extra) && '{NODE_CLAIM}' in request.userInfo.extra && size(request.userInfo.extra['{NODE_CLAIM}']) == 1 ? request.userInfo.extra['{NODE_CLAIM}'][0] : ''"
                ),
            }]),
            validations: Some(vec![
                validation(
                    "variables.node != ''",
                    Some("the interlock agent's token carries no node claim (authentication.kubernetes.io/node-name, Kubernetes 1.30 or later): it may change nothing"),
                    None,
                ),
                validation(
                    "request.resource.resource != 'nodes' || request.name == variables.node",
                    None,
                    Some("'the interlock agent of node ' + variables.node + ' may change only its own Node, not ' + request.name"),
                ),
                validation(
                    "request.resource.resource != 'pods' || (has(oldObject.spec.nodeName) && oldObject.spec.nodeName == variables.node)",
                    None,
                    Some("'the interlock agent of node ' + variables.node + ' may change only the pods bound to its node, not ' + request.namespace + '/' + request.name"),
                ),
                validation(
                    "request.resource.resource != 'events' || (has(object.reportingInstance) && object.reportingInstance == 'interlock.dev/agent/' + variables.node)",
                    None,
                    Some("'the interlock agent of node ' + variables.node + ' may report Events only as interlock.dev/agent/' + variables.node"),
                ),
            ]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let binding = ValidatingAdmissionPolicyBinding {
        metadata: meta(v, NODE_SCOPE_POLICY, false),
        spec: Some(ValidatingAdmissionPolicyBindingSpec {
            policy_name: Some(NODE_SCOPE_POLICY.into()),
            validation_actions: Some(vec!["Deny".into()]),
            ..Default::default()
        }),
    };
    (policy, binding)
}

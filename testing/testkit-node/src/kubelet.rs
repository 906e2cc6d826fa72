//! The kubelet's part in running one pod of a DaemonSet, over CRI: a test hands it the
//! DaemonSet and the ConfigMaps as `interlock manifests` renders them (parsed YAML, as
//! JSON values) and runs the pod on a kit's containerd the way a kubelet would, so that
//! what the manifests ask for — host network, hostPath and ConfigMap volumes with their
//! propagation and read-only flags, `envFrom`, `env` with field references and `$(VAR)`
//! expansion, the securityContext (capabilities, seccomp, read-only root, privilege
//! escalation, user), the memory limit and CPU request — is what the container gets.
//!
//! Strict on purpose: a field it does not know how to apply (a securityContext key, a
//! volume type, a field reference) is an error naming it, never skipped, so a change to
//! the manifests makes the test that runs them fail until this emulation follows.
//! Probes, ports (with host networking a hostPort is the container's own port),
//! scheduling fields and the pull policy are not the container's business and are left
//! out; [`PodRun::probe`] runs an `httpGet` probe as the kubelet does.
//!
//! Host paths: the test maps each `hostPath.path` of the manifests to a path of its own
//! ([`PodContext::host_paths`]), so the pod writes into the test's directories and not
//! the machine's; a path not in the map is used as it is.

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

use interlock_cri::proto as cri;
use interlock_cri::{CriClient, SandboxConfig};
use serde_json::Value;

/// What the kubelet knows about the pod besides its spec.
#[derive(Debug, Clone)]
pub struct PodContext {
    /// `spec.nodeName`.
    pub node_name: String,
    /// `status.hostIP` (and `status.podIP` with host networking).
    pub host_ip: String,
    /// The pod's name (a DaemonSet's pods get a generated one).
    pub pod_name: String,
    /// The pod's UID.
    pub pod_uid: String,
    /// Each manifest `hostPath.path` → the test's own path.
    pub host_paths: BTreeMap<String, PathBuf>,
    /// Where ConfigMap volumes are written and container logs go (the test's own dir).
    pub pod_dir: PathBuf,
    /// Mounts the kubelet adds that the spec does not name (the service account token's
    /// projected volume): (host path, container path), read-only.
    pub extra_mounts: Vec<(PathBuf, String)>,
    /// Environment the kubelet adds (e.g. `KUBERNETES_SERVICE_HOST`), before the spec's.
    pub extra_env: Vec<(String, String)>,
}

/// A pod the kubelet runs: its sandbox and its one container.
#[derive(Debug, Clone)]
pub struct PodRun {
    /// The sandbox's config (to create more containers or stop it).
    pub sandbox: SandboxConfig,
    /// The sandbox's ID.
    pub sandbox_id: String,
    /// The container's ID.
    pub container_id: String,
    /// The container's environment as handed to the runtime (after expansion).
    pub env: BTreeMap<String, String>,
    /// Each mount: container path → host path.
    pub mounts: BTreeMap<String, PathBuf>,
    /// `terminationGracePeriodSeconds` (30 when unset).
    pub grace_seconds: i64,
    /// The container's spec, for its probes.
    pub container: Value,
}

/// Runs the DaemonSet's pod (its only container) as the kubelet would; `config_maps` are
/// the ConfigMap objects `envFrom` and `configMap` volumes refer to, `namespace` the
/// DaemonSet's. The image must be in the runtime already (imported).
pub async fn run_daemonset_pod(
    cri: &CriClient,
    daemonset: &Value,
    config_maps: &[Value],
    ctx: &PodContext,
) -> Result<PodRun, String> {
    let namespace = str_at(daemonset, "/metadata/namespace")?;
    let template = at(daemonset, "/spec/template")?;
    let spec = at(template, "/spec")?;
    let containers = at(spec, "/containers")?
        .as_array()
        .ok_or("spec.template.spec.containers is not a list")?;
    let [container] = &containers[..] else {
        return Err(format!(
            "{} containers: this kubelet runs a pod of one",
            containers.len()
        ));
    };
    if spec.get("initContainers").is_some() {
        return Err("initContainers: not supported by this kubelet".into());
    }
    let host_network = spec
        .get("hostNetwork")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let config_map = |name: &str| -> Result<&Value, String> {
        config_maps
            .iter()
            .find(|c| {
                c.pointer("/metadata/name").and_then(Value::as_str) == Some(name)
                    && c.pointer("/metadata/namespace").and_then(Value::as_str) == Some(namespace)
            })
            .ok_or_else(|| format!("ConfigMap {namespace}/{name} not given"))
    };

    // The sandbox.
    let mut sandbox = SandboxConfig::new(namespace, &ctx.pod_name, &ctx.pod_uid)
        .log_directory(ctx.pod_dir.join("logs"));
    fs::create_dir_all(ctx.pod_dir.join("logs")).map_err(|e| e.to_string())?;
    sandbox.host_network = host_network;
    if let Some(labels) = template
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
    {
        for (k, v) in labels {
            sandbox = sandbox.label(k, v.as_str().unwrap_or_default());
        }
    }
    if let Some(ann) = template
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
    {
        for (k, v) in ann {
            sandbox = sandbox.annotation(k, v.as_str().unwrap_or_default());
        }
    }

    // The environment: the kubelet's own, envFrom, then env (later wins), `$(VAR)`
    // expanded against what is defined before.
    let mut env: Vec<(String, String)> = ctx.extra_env.clone();
    let set = |env: &mut Vec<(String, String)>, k: String, v: String| {
        env.retain(|(name, _)| *name != k);
        env.push((k, v));
    };
    for from in array(container, "envFrom") {
        let name = str_at(from, "/configMapRef/name")
            .map_err(|_| format!("envFrom {from}: only configMapRef is supported"))?;
        let cm = config_map(name)?;
        if let Some(data) = cm.get("data").and_then(Value::as_object) {
            for (k, v) in data {
                // The kubelet skips keys that are not valid variable names.
                if is_env_name(k) {
                    set(
                        &mut env,
                        k.clone(),
                        v.as_str().unwrap_or_default().to_string(),
                    );
                }
            }
        }
    }
    for e in array(container, "env") {
        let name = str_at(e, "/name")?.to_string();
        let value = if let Some(v) = e.get("value").and_then(Value::as_str) {
            expand(v, &env)
        } else if let Some(path) = e
            .pointer("/valueFrom/fieldRef/fieldPath")
            .and_then(Value::as_str)
        {
            match path {
                "spec.nodeName" => ctx.node_name.clone(),
                "metadata.namespace" => namespace.to_string(),
                "metadata.name" => ctx.pod_name.clone(),
                "metadata.uid" => ctx.pod_uid.clone(),
                "status.hostIP" => ctx.host_ip.clone(),
                "status.podIP" if host_network => ctx.host_ip.clone(),
                other => return Err(format!("env {name}: fieldRef {other} not supported")),
            }
        } else {
            return Err(format!("env {name}: {e}: not supported"));
        };
        set(&mut env, name, value);
    }

    // The volumes and mounts.
    let volumes: BTreeMap<&str, &Value> = array(spec, "volumes")
        .iter()
        .map(|v| Ok((str_at(v, "/name")?, v)))
        .collect::<Result<_, String>>()?;
    let mut mounts = Vec::new();
    let mut mount_map = BTreeMap::new();
    for m in array(container, "volumeMounts") {
        let name = str_at(m, "/name")?;
        let container_path = str_at(m, "/mountPath")?.to_string();
        let volume = volumes
            .get(name)
            .ok_or_else(|| format!("volumeMount {name}: no such volume"))?;
        let read_only = m.get("readOnly").and_then(Value::as_bool).unwrap_or(false);
        let propagation = match m.get("mountPropagation").and_then(Value::as_str) {
            None | Some("None") => cri::MountPropagation::PropagationPrivate,
            Some("HostToContainer") => cri::MountPropagation::PropagationHostToContainer,
            Some("Bidirectional") => cri::MountPropagation::PropagationBidirectional,
            Some(other) => return Err(format!("volumeMount {name}: mountPropagation {other}")),
        };
        if m.get("subPath").is_some() {
            return Err(format!("volumeMount {name}: subPath not supported"));
        }
        let host_path = if let Some(hp) = volume.get("hostPath") {
            let path = str_at(hp, "/path")?;
            let mapped = ctx
                .host_paths
                .get(path)
                .cloned()
                .unwrap_or_else(|| PathBuf::from(path));
            // containerd checks a HostToContainer mount's source for shared or slave
            // propagation by the path as given, without following a symlink such as
            // /var/run -> /run: on a host whose / is private (no systemd, as a test
            // machine may be), /var/run/netns then fails although /run/netns is shared.
            // A node's / is shared, so there the path as written works.
            let mapped = if propagation == cri::MountPropagation::PropagationPrivate {
                mapped
            } else {
                fs::canonicalize(&mapped).unwrap_or(mapped)
            };
            match hp.get("type").and_then(Value::as_str).unwrap_or("") {
                "DirectoryOrCreate" => fs::create_dir_all(&mapped)
                    .map_err(|e| format!("hostPath {}: {e}", mapped.display()))?,
                "Directory" if !mapped.is_dir() => {
                    return Err(format!(
                        "hostPath {} (volume {name}) is not a directory",
                        mapped.display()
                    ))
                }
                "" | "Directory" => {}
                other => return Err(format!("volume {name}: hostPath type {other}")),
            }
            mapped
        } else if let Some(cm) = volume.get("configMap") {
            let cm_name = str_at(cm, "/name")?;
            let data = config_map(cm_name)?
                .get("data")
                .and_then(Value::as_object)
                .ok_or_else(|| format!("ConfigMap {cm_name} has no data"))?;
            let dir = ctx.pod_dir.join("volumes").join(name);
            fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
            let items: Vec<(String, String)> = match cm.get("items").and_then(Value::as_array) {
                Some(items) => items
                    .iter()
                    .map(|i| Ok((str_at(i, "/key")?.into(), str_at(i, "/path")?.into())))
                    .collect::<Result<_, String>>()?,
                None => data.keys().map(|k| (k.clone(), k.clone())).collect(),
            };
            for (key, path) in items {
                let text = data
                    .get(&key)
                    .and_then(Value::as_str)
                    .ok_or_else(|| format!("ConfigMap {cm_name} has no key {key}"))?;
                fs::write(dir.join(&path), text).map_err(|e| e.to_string())?;
            }
            dir
        } else {
            return Err(format!("volume {name}: {volume}: type not supported"));
        };
        mount_map.insert(container_path.clone(), host_path.clone());
        mounts.push(cri::Mount {
            container_path,
            host_path: host_path.to_string_lossy().into_owned(),
            readonly: read_only,
            propagation: propagation as i32,
            ..Default::default()
        });
    }
    for (host, inside) in &ctx.extra_mounts {
        mount_map.insert(inside.clone(), host.clone());
        mounts.push(cri::Mount {
            container_path: inside.clone(),
            host_path: host.to_string_lossy().into_owned(),
            readonly: true,
            ..Default::default()
        });
    }

    // The securityContext: the container's over the pod's.
    let pod_sc = spec.get("securityContext").cloned().unwrap_or(Value::Null);
    let sc = container
        .get("securityContext")
        .cloned()
        .unwrap_or(Value::Null);
    let mut security = cri::LinuxContainerSecurityContext {
        namespace_options: Some(cri::NamespaceOption {
            network: if host_network {
                cri::NamespaceMode::Node
            } else {
                cri::NamespaceMode::Pod
            } as i32,
            pid: cri::NamespaceMode::Container as i32,
            ipc: cri::NamespaceMode::Pod as i32,
            ..Default::default()
        }),
        ..Default::default()
    };
    for (key, value) in sc.as_object().into_iter().flatten() {
        match key.as_str() {
            "privileged" => security.privileged = value.as_bool().unwrap_or(false),
            "allowPrivilegeEscalation" => security.no_new_privs = !value.as_bool().unwrap_or(true),
            "readOnlyRootFilesystem" => security.readonly_rootfs = value.as_bool().unwrap_or(false),
            "runAsUser" => {
                security.run_as_user = Some(cri::Int64Value {
                    value: value.as_i64().ok_or("runAsUser is not a number")?,
                })
            }
            "runAsGroup" => {
                security.run_as_group = Some(cri::Int64Value {
                    value: value.as_i64().ok_or("runAsGroup is not a number")?,
                })
            }
            "capabilities" => {
                let caps = |k: &str| -> Vec<String> {
                    array(value, k)
                        .iter()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect()
                };
                security.capabilities = Some(cri::Capability {
                    add_capabilities: caps("add"),
                    drop_capabilities: caps("drop"),
                    ..Default::default()
                });
            }
            "seccompProfile" => security.seccomp = Some(seccomp(value)?),
            other => {
                return Err(format!(
                    "securityContext.{other}: not applied by this kubelet"
                ))
            }
        }
    }
    if security.seccomp.is_none() {
        if let Some(p) = pod_sc.get("seccompProfile") {
            security.seccomp = Some(seccomp(p)?);
        }
    }
    for key in pod_sc.as_object().into_iter().flatten().map(|(k, _)| k) {
        if key != "seccompProfile" {
            return Err(format!(
                "pod securityContext.{key}: not applied by this kubelet"
            ));
        }
    }
    // The kubelet asks for the runtime's default masked and read-only /proc paths for
    // every container that is not privileged (ProcMount Default).
    if !security.privileged {
        security.masked_paths = DEFAULT_MASKED_PATHS.iter().map(|s| s.to_string()).collect();
        security.readonly_paths = DEFAULT_READONLY_PATHS
            .iter()
            .map(|s| s.to_string())
            .collect();
    }

    // Resources: the memory limit and the CPU request as the kubelet converts them.
    let mut resources = cri::LinuxContainerResources::default();
    if let Some(limit) = container
        .pointer("/resources/limits/memory")
        .and_then(Value::as_str)
    {
        resources.memory_limit_in_bytes = quantity(limit)?;
    }
    if let Some(cpu) = container
        .pointer("/resources/limits/cpu")
        .and_then(Value::as_str)
    {
        let millis = millicpu(cpu)?;
        resources.cpu_period = 100_000;
        resources.cpu_quota = millis * 100;
    }
    resources.cpu_shares = match container
        .pointer("/resources/requests/cpu")
        .and_then(Value::as_str)
    {
        Some(cpu) => (millicpu(cpu)? * 1024 / 1000).max(2),
        None => 2,
    };

    let strings = |k: &str| -> Vec<String> {
        array(container, k)
            .iter()
            .filter_map(Value::as_str)
            .map(|s| expand(s, &env))
            .collect()
    };
    let container_name = str_at(container, "/name")?;
    // The kubelet makes the container's log directory; the runtime writes the file.
    fs::create_dir_all(ctx.pod_dir.join("logs").join(container_name)).map_err(|e| e.to_string())?;
    let config = cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: container_name.to_string(),
            attempt: 0,
        }),
        image: Some(cri::ImageSpec {
            image: str_at(container, "/image")?.to_string(),
            ..Default::default()
        }),
        command: strings("command"),
        args: strings("args"),
        envs: env
            .iter()
            .map(|(key, value)| cri::KeyValue {
                key: key.clone(),
                value: value.clone(),
            })
            .collect(),
        mounts,
        log_path: format!("{container_name}/0.log"),
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(resources),
            security_context: Some(security),
        }),
        ..Default::default()
    };
    let sandbox_id = cri
        .run_sandbox(&sandbox)
        .await
        .map_err(|e| format!("RunPodSandbox: {e}"))?;
    let container_id = cri
        .create_container(&sandbox_id, config, &sandbox)
        .await
        .map_err(|e| format!("CreateContainer: {e}"))?;
    cri.start_container(&container_id)
        .await
        .map_err(|e| format!("StartContainer: {e}"))?;
    Ok(PodRun {
        sandbox,
        sandbox_id,
        container_id,
        env: env.into_iter().collect(),
        mounts: mount_map,
        grace_seconds: spec
            .get("terminationGracePeriodSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(30),
        container: container.clone(),
    })
}

impl PodRun {
    /// Runs the container's `readinessProbe` or `livenessProbe` (`which`) once, as the
    /// kubelet does for an `httpGet` probe: Some(true) for a 2xx or 3xx answer,
    /// Some(false) for another answer or none, None when there is no such probe.
    pub fn probe(&self, which: &str) -> Option<bool> {
        let get = self.container.get(which)?.get("httpGet")?;
        let host = get.get("host").and_then(Value::as_str)?;
        let port = get.get("port").and_then(Value::as_u64)? as u16;
        let path = get.get("path").and_then(Value::as_str).unwrap_or("/");
        let addr: SocketAddr = format!("{host}:{port}").parse().ok()?;
        Some(http_status(addr, path).is_some_and(|s| (200..400).contains(&s)))
    }

    /// The container's log (CRI's log format: `<time> <stream> <tag> <line>` per line).
    pub fn log(&self, ctx: &PodContext) -> String {
        let path = ctx.pod_dir.join("logs").join(
            self.container
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("c"),
        );
        fs::read_to_string(path.join("0.log")).unwrap_or_default()
    }
}

/// `GET path` on `addr`; the status code.
fn http_status(addr: SocketAddr, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: kube-probe/1.33\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut head = [0u8; 64];
    let n = s.read(&mut head).ok()?;
    let line = String::from_utf8_lossy(&head[..n]);
    line.split_whitespace().nth(1)?.parse().ok()
}

// containerd's and the kubelet's defaults for ProcMount Default.
const DEFAULT_MASKED_PATHS: &[&str] = &[
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
];
const DEFAULT_READONLY_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

fn seccomp(p: &Value) -> Result<cri::SecurityProfile, String> {
    use cri::security_profile::ProfileType;
    let (profile_type, localhost_ref) = match str_at(p, "/type")? {
        "RuntimeDefault" => (ProfileType::RuntimeDefault, String::new()),
        "Unconfined" => (ProfileType::Unconfined, String::new()),
        "Localhost" => (
            ProfileType::Localhost,
            str_at(p, "/localhostProfile")?.to_string(),
        ),
        other => return Err(format!("seccompProfile type {other}")),
    };
    Ok(cri::SecurityProfile {
        profile_type: profile_type as i32,
        localhost_ref,
    })
}

/// A memory quantity (`64Mi`, `1G`, `1048576`) in bytes.
fn quantity(q: &str) -> Result<i64, String> {
    let split = q.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(q.len());
    let (n, unit) = q.split_at(split);
    let n: i64 = n.parse().map_err(|_| format!("quantity {q}"))?;
    let mult: i64 = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        _ => return Err(format!("quantity {q}: unit {unit}")),
    };
    Ok(n * mult)
}

/// A CPU quantity (`10m`, `1`, `0.5`) in millicores.
fn millicpu(q: &str) -> Result<i64, String> {
    if let Some(m) = q.strip_suffix('m') {
        return m.parse().map_err(|_| format!("cpu {q}"));
    }
    let cores: f64 = q.parse().map_err(|_| format!("cpu {q}"))?;
    Ok((cores * 1000.0).round() as i64)
}

/// `$(VAR)` references to variables defined before, as the kubelet expands them (`$$` is
/// a literal `$`; an unknown reference stays as written).
fn expand(s: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(') {
            match inner.find(')') {
                Some(end) => {
                    let name = &inner[..end];
                    match env.iter().rev().find(|(k, _)| k == name) {
                        Some((_, v)) => out.push_str(v),
                        None => out.push_str(&format!("$({name})")),
                    }
                    rest = &inner[end + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = inner;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

fn is_env_name(k: &str) -> bool {
    !k.is_empty()
        && !k.starts_with(|c: char| c.is_ascii_digit())
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
}

fn at<'a>(v: &'a Value, pointer: &str) -> Result<&'a Value, String> {
    v.pointer(pointer)
        .ok_or_else(|| format!("{pointer} missing"))
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> Result<&'a str, String> {
    at(v, pointer)?
        .as_str()
        .ok_or_else(|| format!("{pointer} is not a string"))
}

fn array<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_expand_as_the_kubelet_expands_them() {
        let env = vec![("HOST_IP".to_string(), "10.0.0.7".to_string())];
        assert_eq!(expand("$(HOST_IP):9102", &env), "10.0.0.7:9102");
        assert_eq!(expand("$(NOPE):1", &env), "$(NOPE):1");
        assert_eq!(expand("a$$(HOST_IP)", &env), "a$(HOST_IP)");
        assert_eq!(expand("$x", &env), "$x");
    }

    #[test]
    fn quantities_convert_as_the_kubelet_converts_them() {
        assert_eq!(quantity("64Mi").unwrap(), 64 << 20);
        assert_eq!(quantity("1G").unwrap(), 1_000_000_000);
        assert!(quantity("1X").is_err());
        assert_eq!(millicpu("10m").unwrap(), 10);
        assert_eq!(millicpu("0.5").unwrap(), 500);
    }
}

//! The plugin stand-in: one binary installed as `istio-cni`, `linkerd-cni`, `consul-cni`
//! and `kuma-cni`, dispatching on the entry's `type`. Where a guard can observe it, it
//! behaves like the mesh's plugin (`research/guard-mode.md` §A.x.1, A.x.3, A.x.6):
//!
//! - the entry fields the real plugin reads, and its dependency: istio-cni's
//!   `<cni_agent_run_dir>/istio-cni-kubeconfig`, linkerd-cni's `kubernetes.kubeconfig`
//!   (context `linkerd-cni-context`), consul-cni's `<cni_net_dir>/<kubeconfig>` (else the
//!   newest `<that>-*`), kuma-cni's `kubernetes.kubeconfig` and exactly one process whose
//!   `argv[0]` is `/install-cni`; ADD fails when it is missing;
//! - the pod GET over the API with the kubeconfig's token (istio-cni and kuma-cni retry 30
//!   times, 1 s apart), the mesh's recognition and skips — a skipped pod gets `prevResult`
//!   back unchanged;
//! - the mesh's rules as its code writes them: istio-cni and kuma-cni with
//!   `iptables-restore --noflush` inside the netns, linkerd-cni and consul-cni with one
//!   `iptables -t nat …` per rule through `nsenter`; the rules are the case the pod names
//!   in [`CASE_ANNOTATION`] (a test-only key), else the mesh's default case, from
//!   `interlock-mesh-cases`;
//! - consul-cni writes `transparent-proxy-status: waiting`, then `complete`, on the pod;
//! - VERSION answers 0.1.0 … 1.1.0; STATUS and GC succeed at 1.1.0 and above and fail with
//!   code 4 below (cni v1.3.0 `skel`); CHECK and DEL do nothing.
//!
//! Not modelled: istio-cni's gateway, `DISABLE_ENVOY` and injection-disabled skips,
//! linkerd-cni's namespace GET for overrides, per-pod settings read from annotations (the
//! case carries them), and IPv6 for istio-cni (IPv4 pods only here).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use interlock_contract::guard::GuardedMesh;
use interlock_mesh_cases::{Case, Mesh, MeshRules};
use serde_json::{json, Value};

use crate::kube::{self, KubeConfig};

/// A test-only pod annotation naming the case (`mesh/name`) whose rules the stand-in
/// writes; without it, the mesh's default case.
pub const CASE_ANNOTATION: &str = "test.interlock.dev/mesh-case";

/// The versions every one of the four plugins reports (cni v1.3.0 `version.All`).
pub const SUPPORTED: [&str; 7] = [
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];

/// A CNI error: code, message, details.
#[derive(Debug)]
pub struct CniError {
    /// The CNI error code (4: incompatible versions, 7: bad config, 999: the plugin's own).
    pub code: u32,
    /// The message.
    pub msg: String,
    /// Details (the rules that failed, for instance).
    pub details: String,
}

fn err(code: u32, msg: impl Into<String>, details: impl Into<String>) -> CniError {
    CniError {
        code,
        msg: msg.into(),
        details: details.into(),
    }
}

fn version_at_least(v: &str, want: (u32, u32, u32)) -> bool {
    let mut p = v.split('.').map(|x| x.parse::<u32>().unwrap_or(0));
    let have = (
        p.next().unwrap_or(0),
        p.next().unwrap_or(0),
        p.next().unwrap_or(0),
    );
    have >= want
}

/// The mesh of a plugin `type` (the stand-in's own meshes only).
pub fn mesh_of(t: &str) -> Option<Mesh> {
    Some(match GuardedMesh::from_plugin_type(t)? {
        GuardedMesh::Istio => Mesh::Istio,
        GuardedMesh::Linkerd => Mesh::Linkerd,
        GuardedMesh::Consul => Mesh::Consul,
        GuardedMesh::Kuma => Mesh::Kuma,
    })
}

/// The plugin's entry point: reads the environment and stdin, writes stdout; the exit code.
pub fn main() -> i32 {
    let mut input = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut input);
    let conf: Value = serde_json::from_slice(&input).unwrap_or(Value::Null);
    let version = conf["cniVersion"].as_str().unwrap_or("1.1.0").to_string();
    let command = std::env::var("CNI_COMMAND").unwrap_or_default();
    let out = match command.as_str() {
        "VERSION" => Ok(Some(
            json!({"cniVersion": version, "supportedVersions": SUPPORTED}),
        )),
        "STATUS" | "GC" => {
            if version_at_least(&version, (1, 1, 0)) {
                Ok(None)
            } else {
                Err(err(
                    4,
                    "incompatible CNI versions",
                    format!("config is \"{version}\", plugin supports {SUPPORTED:?} for {command}"),
                ))
            }
        }
        "CHECK" | "DEL" => Ok(None),
        "ADD" => add(&conf, &version).map(Some),
        other => Err(err(4, format!("unknown CNI_COMMAND {other:?}"), "")),
    };
    let mut stdout = std::io::stdout();
    match out {
        Ok(Some(v)) => {
            let _ = writeln!(stdout, "{v}");
            0
        }
        Ok(None) => 0,
        Err(e) => {
            let _ = writeln!(
                stdout,
                "{}",
                json!({"cniVersion": version, "code": e.code, "msg": e.msg, "details": e.details})
            );
            1
        }
    }
}

fn cni_arg(key: &str) -> String {
    std::env::var("CNI_ARGS")
        .unwrap_or_default()
        .split(';')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.to_string())
        .unwrap_or_default()
}

fn pass(prev: &Value, version: &str) -> Value {
    let mut r = prev.clone();
    r["cniVersion"] = json!(version);
    r
}

fn names(pod: &Value, field: &str) -> Vec<String> {
    pod["spec"][field]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|c| c["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn annotation<'a>(pod: &'a Value, key: &str) -> Option<&'a str> {
    pod["metadata"]["annotations"][key].as_str()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn get_pod_retrying(kc: &KubeConfig, ns: &str, name: &str, tries: u32) -> Result<Value, CniError> {
    let mut last = String::new();
    for i in 0..tries {
        match kube::get_pod(kc, ns, name) {
            Ok(p) => return Ok(p),
            Err(e) => last = e,
        }
        if i + 1 < tries {
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    Err(err(999, format!("pod {ns}/{name}: {last}"), ""))
}

fn load_kubeconfig(path: &Path) -> Result<KubeConfig, CniError> {
    kube::load(path).map_err(|e| err(999, e, ""))
}

/// The `/install-cni` processes on the host (kuma-cni's `pidOf`).
fn install_cni_processes() -> usize {
    std::fs::read_dir("/proc")
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .bytes()
                        .all(|b| b.is_ascii_digit())
                })
                .filter(|e| {
                    std::fs::read(e.path().join("cmdline"))
                        .ok()
                        .is_some_and(|c| {
                            c.split(|b| *b == 0).next() == Some(b"/install-cni".as_slice())
                        })
                })
                .count()
        })
        .unwrap_or(0)
}

fn add(conf: &Value, version: &str) -> Result<Value, CniError> {
    let t = conf["type"].as_str().unwrap_or_default();
    let mesh = mesh_of(t)
        .ok_or_else(|| err(7, format!("mesh-standin: no mesh plugin of type {t:?}"), ""))?;
    let prev = conf
        .get("prevResult")
        .filter(|p| !p.is_null())
        .ok_or_else(|| {
            err(
                7,
                format!("{t}: must be called as a chained plugin (no prevResult)"),
                "",
            )
        })?;
    let ns = cni_arg("K8S_POD_NAMESPACE");
    let name = cni_arg("K8S_POD_NAME");
    let netns = std::env::var("CNI_NETNS").unwrap_or_default();

    let pod = match mesh {
        Mesh::Istio => {
            if strings(&conf["exclude_namespaces"]).contains(&ns) {
                return Ok(pass(prev, version));
            }
            if conf["pod_namespace"].as_str() == Some(ns.as_str())
                && name.starts_with("istio-cni-node-")
            {
                return Ok(pass(prev, version));
            }
            let run_dir = conf["cni_agent_run_dir"]
                .as_str()
                .unwrap_or("/var/run/istio-cni");
            let kc = load_kubeconfig(&Path::new(run_dir).join("istio-cni-kubeconfig"))?;
            let pod = get_pod_retrying(&kc, &ns, &name, 30)?;
            let init = names(&pod, "initContainers");
            let cont = names(&pod, "containers");
            let proxy = cont.iter().chain(&init).any(|c| c == "istio-proxy");
            if init.iter().any(|c| c == "istio-init")
                || !proxy
                || annotation(&pod, "sidecar.istio.io/status").is_none()
            {
                return Ok(pass(prev, version));
            }
            pod
        }
        Mesh::Linkerd => {
            if ns.is_empty() || name.is_empty() {
                return Ok(pass(prev, version));
            }
            let path = conf["kubernetes"]["kubeconfig"]
                .as_str()
                .unwrap_or_default();
            let kc = load_kubeconfig(Path::new(path))?;
            if !kc.contexts.iter().any(|c| c == "linkerd-cni-context") {
                return Err(err(
                    999,
                    format!("kubeconfig {path}: context \"linkerd-cni-context\" does not exist"),
                    "",
                ));
            }
            let pod = get_pod_retrying(&kc, &ns, &name, 1)?;
            let init = names(&pod, "initContainers");
            let all: Vec<String> = names(&pod, "containers")
                .into_iter()
                .chain(init.clone())
                .collect();
            if init.iter().any(|c| c == "linkerd-init") || !all.iter().any(|c| c == "linkerd-proxy")
            {
                return Ok(pass(prev, version));
            }
            pod
        }
        Mesh::Consul => {
            let dir = PathBuf::from(conf["cni_net_dir"].as_str().unwrap_or("/etc/cni/net.d"));
            let file = conf["kubeconfig"]
                .as_str()
                .unwrap_or("ZZZ-consul-cni-kubeconfig");
            let kc = load_kubeconfig(&consul_kubeconfig(&dir, file))?;
            if ns.is_empty() || name.is_empty() {
                return Err(err(
                    999,
                    "consul-cni: pod name or namespace missing from CNI_ARGS",
                    "",
                ));
            }
            let has_ip = prev["ips"].as_array().is_some_and(|a| !a.is_empty());
            if !has_ip {
                return Err(err(999, "consul-cni: prevResult carries no IP", ""));
            }
            let pod = get_pod_retrying(&kc, &ns, &name, 1)?;
            let injected = annotation(&pod, "consul.hashicorp.com/connect-inject-status").is_some()
                || annotation(&pod, "consul.hashicorp.com/mesh-inject-status").is_some();
            if !injected
                || annotation(&pod, "consul.hashicorp.com/transparent-proxy-status").is_none()
            {
                return Ok(pass(prev, version));
            }
            for required in [
                "consul.hashicorp.com/redirect-traffic-config",
                "consul.hashicorp.com/dual-stack",
            ] {
                if annotation(&pod, required).is_none() {
                    return Err(err(
                        999,
                        format!("consul-cni: pod {ns}/{name} lacks the annotation {required}"),
                        "",
                    ));
                }
            }
            let status = "consul.hashicorp.com/transparent-proxy-status";
            kube::annotate_pod(&kc, &ns, &name, status, "waiting").map_err(|e| err(999, e, ""))?;
            apply(mesh, &pod, &netns, conf)?;
            kube::annotate_pod(&kc, &ns, &name, status, "complete").map_err(|e| err(999, e, ""))?;
            return Ok(pass(prev, version));
        }
        Mesh::Kuma => {
            let n = install_cni_processes();
            if n != 1 {
                return Err(err(
                    999,
                    format!("kuma-cni: found {n} processes named /install-cni, need exactly one"),
                    "",
                ));
            }
            if ns.is_empty()
                || name.is_empty()
                || strings(&conf["kubernetes"]["exclude_namespaces"]).contains(&ns)
            {
                return Ok(pass(prev, version));
            }
            let path = conf["kubernetes"]["kubeconfig"]
                .as_str()
                .unwrap_or_default();
            let kc = load_kubeconfig(Path::new(path))?;
            let pod = get_pod_retrying(&kc, &ns, &name, 30)?;
            let init = names(&pod, "initContainers");
            let all: Vec<String> = names(&pod, "containers")
                .into_iter()
                .chain(init.clone())
                .collect();
            if init.iter().any(|c| c == "kuma-init")
                || !all.iter().any(|c| c == "kuma-sidecar")
                || annotation(&pod, interlock_mesh_cases::kuma::INJECTED_ANNOTATION) != Some("true")
            {
                return Ok(pass(prev, version));
            }
            if annotation(&pod, interlock_mesh_cases::kuma::CONFIG_ANNOTATION).is_none() {
                return Err(err(
                    999,
                    format!(
                        "kuma-cni: pod {ns}/{name} lacks {}",
                        interlock_mesh_cases::kuma::CONFIG_ANNOTATION
                    ),
                    "",
                ));
            }
            pod
        }
    };
    apply(mesh, &pod, &netns, conf)?;
    Ok(pass(prev, version))
}

/// `<dir>/<file>`, else the newest `<dir>/<file>-*` by mtime (consul-cni's
/// `resolveKubeconfigPath`; the in-cluster fallback does not exist on a test node).
fn consul_kubeconfig(dir: &Path, file: &str) -> PathBuf {
    let p = dir.join(file);
    if p.exists() {
        return p;
    }
    let prefix = format!("{file}-");
    std::fs::read_dir(dir)
        .ok()
        .and_then(|rd| {
            rd.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
                .map(|e| e.path())
        })
        .unwrap_or(p)
}

/// The case whose rules go into the pod.
pub fn case_for(mesh: Mesh, pod: &Value) -> Result<Case, CniError> {
    match annotation(pod, CASE_ANNOTATION) {
        None => Ok(interlock_mesh_cases::default_case(mesh)),
        Some(id) => match interlock_mesh_cases::find(id) {
            Some(c) if c.mesh == mesh => Ok(c),
            _ => Err(err(
                999,
                format!("{CASE_ANNOTATION}: no {mesh} case {id:?}"),
                "",
            )),
        },
    }
}

fn apply(mesh: Mesh, pod: &Value, netns: &str, conf: &Value) -> Result<(), CniError> {
    let case = case_for(mesh, pod)?;
    let MeshRules::Restore(v4) = &case.v4 else {
        return Err(err(
            999,
            format!("{}: the mesh writes no IPv4 rules for this pod", case.id()),
            "",
        ));
    };
    let v6 = match (&case.v6, mesh) {
        (MeshRules::Restore(t), Mesh::Linkerd)
            if conf["linkerd"]["ipv6"].as_bool() == Some(true) =>
        {
            Some(t)
        }
        (MeshRules::Restore(t), Mesh::Consul)
            if annotation(pod, "consul.hashicorp.com/dual-stack") == Some("true") =>
        {
            Some(t)
        }
        (MeshRules::Restore(t), Mesh::Kuma) if has_ipv6(netns) => Some(t),
        _ => None,
    };
    match mesh {
        Mesh::Istio | Mesh::Kuma => {
            restore(netns, "iptables-restore", v4)?;
            if let Some(t) = v6 {
                // kuma-cni: a failing IPv6 setup is only logged; the pod stays IPv4-only.
                let _ = restore(netns, "ip6tables-restore", t);
            }
        }
        Mesh::Linkerd | Mesh::Consul => {
            let bin = if mesh == Mesh::Linkerd {
                match conf["linkerd"]["iptables-mode"].as_str() {
                    Some("legacy") => "iptables-legacy",
                    _ => "iptables-nft",
                }
            } else {
                "iptables"
            };
            for cmd in commands(v4) {
                run_in(netns, bin, &cmd)?;
            }
            if let Some(t) = v6 {
                let bin6 = bin.replacen("iptables", "ip6tables", 1);
                for cmd in commands(t) {
                    run_in(netns, &bin6, &cmd)?;
                }
            }
        }
    }
    Ok(())
}

fn has_ipv6(netns: &str) -> bool {
    Command::new("nsenter")
        .arg(format!("--net={netns}"))
        .args(["ip", "-6", "-o", "addr", "show", "scope", "link"])
        .output()
        .map(|o| !o.stdout.is_empty())
        .unwrap_or(false)
}

fn restore(netns: &str, bin: &str, table: &str) -> Result<(), CniError> {
    let mut child = Command::new("nsenter")
        .arg(format!("--net={netns}"))
        .args([bin, "--noflush"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| err(999, format!("nsenter {bin}: {e}"), ""))?;
    if let Some(mut i) = child.stdin.take() {
        let _ = i.write_all(table.as_bytes());
    }
    let out = child
        .wait_with_output()
        .map_err(|e| err(999, format!("{bin}: {e}"), ""))?;
    if !out.status.success() {
        return Err(err(
            999,
            format!(
                "{bin} in {netns}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            table.to_string(),
        ));
    }
    Ok(())
}

fn run_in(netns: &str, bin: &str, args: &[String]) -> Result<(), CniError> {
    let out = Command::new("nsenter")
        .arg(format!("--net={netns}"))
        .arg(bin)
        .args(args)
        .output()
        .map_err(|e| err(999, format!("nsenter {bin}: {e}"), ""))?;
    if !out.status.success() {
        return Err(err(
            999,
            format!(
                "{bin} {} in {netns}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            "",
        ));
    }
    Ok(())
}

/// A restore file as one iptables command per rule, as linkerd-cni (proxy-init) and
/// consul-cni issue them: `-N` for each chain the file declares without a policy, then
/// every `-A`/`-I` in order, each with `-t <table>`.
pub fn commands(table: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut current = "filter".to_string();
    for line in table.lines().map(str::trim) {
        if let Some(t) = line.strip_prefix('*') {
            current = t.to_string();
        } else if let Some(decl) = line.strip_prefix(':') {
            let mut w = decl.split_whitespace();
            if let (Some(chain), Some("-")) = (w.next(), w.next()) {
                out.push(vec![
                    "-t".into(),
                    current.clone(),
                    "-N".into(),
                    chain.into(),
                ]);
            }
        } else if line.starts_with("-A ") || line.starts_with("-I ") {
            let mut cmd = vec!["-t".to_string(), current.clone()];
            cmd.extend(split_words(line));
            out.push(cmd);
        }
    }
    out
}

/// Splits a rule into words, a double-quoted span being one word.
fn split_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut any = false;
    for c in line.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                any = true;
            }
            c if c.is_whitespace() && !quoted => {
                if any {
                    words.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => {
                cur.push(c);
                any = true;
            }
        }
    }
    if any {
        words.push(cur);
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restore_file_becomes_one_command_per_rule() {
        let c = commands(
            "*nat\n:PREROUTING ACCEPT [0:0]\n:PROXY_INIT_OUTPUT - [0:0]\n\
             -A OUTPUT -m comment --comment \"proxy-init/install proxy\" -j PROXY_INIT_OUTPUT\nCOMMIT\n",
        );
        assert_eq!(c.len(), 2);
        assert_eq!(c[0], ["-t", "nat", "-N", "PROXY_INIT_OUTPUT"]);
        assert_eq!(
            c[1],
            [
                "-t",
                "nat",
                "-A",
                "OUTPUT",
                "-m",
                "comment",
                "--comment",
                "proxy-init/install proxy",
                "-j",
                "PROXY_INIT_OUTPUT"
            ]
        );
    }

    #[test]
    fn versions_gate_status() {
        assert!(version_at_least("1.1.0", (1, 1, 0)));
        assert!(!version_at_least("1.0.0", (1, 1, 0)));
        assert!(!version_at_least("0.3.1", (1, 1, 0)));
        for m in GuardedMesh::ALL {
            assert!(mesh_of(m.plugin_type()).is_some());
        }
        assert!(mesh_of("bridge").is_none());
    }
}

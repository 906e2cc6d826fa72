//! Runs chains of the real reference plugins (`bridge` + `host-local` → `portmap`) in
//! throwaway network namespaces, and GC/STATUS through a recording plugin.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use interlock_cni_types::{error, CniVersion};
use interlock_libcni::exec::{Attachment, Chain, ExecError};
use interlock_libcni::result_cache::ResultCache;
use interlock_libcni::{parse_conflist, RuntimeConf};
use interlock_testkit::{cni_plugins_dir, require_root, unique, Netns};
use serde_json::json;

fn bridge_chain(version: &str, bridge: &str, subnet: &str, data_dir: &str) -> Chain {
    let doc = json!({
        "cniVersion": version,
        "name": unique("net"),
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": true,
                "ipMasq": false,
                "ipam": {
                    "type": "host-local",
                    // Dual stack: portmap 1.1.x CHECKs its IPv6 chain even for an IPv4-only
                    // pod, so give the pod both families.
                    "ranges": [[{"subnet": subnet}], [{"subnet": v6_subnet(subnet)}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": data_dir
                }
            },
            {"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}
        ]
    });
    let list = parse_conflist(doc.to_string().as_bytes()).unwrap();
    Chain::new(list, vec![cni_plugins_dir()]).unwrap()
}

fn v6_subnet(v4: &str) -> String {
    let third = v4.split('.').nth(2).unwrap_or("0");
    format!("fd99:{third}::/64")
}

fn subnet() -> String {
    format!("10.99.{}.0/24", 1 + rand_byte() % 250)
}

fn rand_byte() -> u8 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    (t ^ std::process::id()) as u8
}

fn run_bridge_portmap(version: CniVersion) {
    let node = Netns::new("node").unwrap();
    let pod = Netns::new("pod").unwrap();
    let data = interlock_testkit::tempdir().unwrap();
    let bridge = unique("br");
    let cache_dir = interlock_testkit::tempdir().unwrap();
    let cache = ResultCache::new(cache_dir.path());
    let chain = bridge_chain(
        version.as_str(),
        &bridge,
        &subnet(),
        data.path().to_str().unwrap(),
    )
    .with_cache(cache.clone());
    let pod_path = pod.path().display().to_string();
    let rt = RuntimeConf::new(&unique("ctr"), &pod_path, "eth0")
        .with_arg("IgnoreUnknown", "1")
        .with_arg("K8S_POD_NAMESPACE", "default")
        .with_capability(
            "portMappings",
            json!([{"hostPort": 18080, "containerPort": 80, "protocol": "tcp"}]),
        );

    let result = node
        .run(|| chain.add(&rt))
        .unwrap_or_else(|e| panic!("ADD {version}: {e}"));
    assert_eq!(result.cni_version, version);
    let ips = result.ips_on("eth0");
    assert_eq!(ips.len(), 2, "{result:?}");
    let addr = pod.exec_ok(&["ip", "-o", "addr", "show", "dev", "eth0"]);
    for ip in &ips {
        let (family, a) = match ip.ip().unwrap() {
            std::net::IpAddr::V4(a) => ("inet", a.to_string()),
            std::net::IpAddr::V6(a) => ("inet6", a.to_string()),
        };
        let prefix = ip.address.split('/').nth(1).unwrap();
        assert!(
            addr.contains(&format!("{family} {a}/{prefix}")),
            "{a} not on eth0: {addr}"
        );
        if !version.is_1x() {
            assert_eq!(ip.version.as_deref(), ip.family());
        }
    }
    // The bridge lives in the node netns, not on the host.
    let links = node.exec_ok(&["ip", "-o", "link", "show", &bridge]);
    assert!(links.contains(&bridge));
    // portmap really got the capability argument: its DNAT rule names the host port.
    let nat = node.exec_ok(&["iptables-save", "-t", "nat"]);
    assert!(
        nat.contains("--dport 18080"),
        "portmap rule missing:\n{nat}"
    );

    // CHECK goes through the bridge plugin only: portmap 1.1.x's CHECK compares its
    // IPv4 rules against the ip6tables table and always fails (fixed upstream later).
    let mut bridge_only = chain.list().clone();
    bridge_only.plugins_mut().truncate(1);
    let bridge_only = Chain::new(bridge_only, vec![cni_plugins_dir()]).unwrap();
    if version.supports_check() {
        node.run(|| bridge_only.check(&rt, &result))
            .unwrap_or_else(|e| panic!("CHECK {version}: {e}"));
        // The same CHECK against the cached result, as a runtime does it.
        let bridge_cached = bridge_only.clone().with_cache(cache.clone());
        node.run(|| bridge_cached.check_cached(&rt))
            .unwrap_or_else(|e| panic!("cached CHECK {version}: {e}"));
        // And CHECK really checks: with eth0's address gone, bridge reports it.
        let gone = result.ips_on("eth0")[0].address.clone();
        pod.exec_ok(&["ip", "addr", "del", &gone, "dev", "eth0"]);
        let e = node.run(|| bridge_only.check(&rt, &result)).unwrap_err();
        assert!(e.to_string().contains("bridge"), "{e}");
        pod.exec_ok(&["ip", "addr", "add", &gone, "dev", "eth0"]);
    } else {
        assert!(matches!(
            node.run(|| chain.check(&rt, &result)),
            Err(ExecError::Unsupported { .. })
        ));
    }

    // The result is cached like libcni does; DEL without prevResult uses it.
    let cached = cache
        .read(chain.list().name(), &rt.container_id, "eth0")
        .unwrap()
        .expect("ADD result cached");
    assert_eq!(cached.result_as(version).unwrap(), result);
    assert_eq!(cached.netns, pod_path);
    node.run(|| chain.del(&rt, None))
        .unwrap_or_else(|e| panic!("DEL {version}: {e}"));
    assert!(cache
        .read(chain.list().name(), &rt.container_id, "eth0")
        .unwrap()
        .is_none());
    let after = pod.exec(&["ip", "link", "show", "eth0"]);
    assert!(!after.status.success(), "eth0 still exists after DEL");
    let nat = node.exec_ok(&["iptables-save", "-t", "nat"]);
    assert!(
        !nat.contains("--dport 18080"),
        "portmap rule left after DEL:\n{nat}"
    );
    // A second DEL without netns and without prevResult, as containerd sends it.
    let late = RuntimeConf::new(&rt.container_id, "", "eth0");
    node.run(|| chain.del(&late, None))
        .unwrap_or_else(|e| panic!("second DEL {version}: {e}"));

    let versions = chain.versions().unwrap();
    assert_eq!(versions.len(), 2);
    for (plugin, info) in versions {
        assert!(
            info.supported_versions
                .iter()
                .any(|v| v == version.as_str()),
            "{plugin}: {info:?}"
        );
    }
}

#[test]
fn bridge_portmap_0_3_1() {
    require_root!();
    run_bridge_portmap(CniVersion::V0_3_1);
}

#[test]
fn bridge_portmap_0_4_0() {
    require_root!();
    run_bridge_portmap(CniVersion::V0_4_0);
}

#[test]
fn bridge_portmap_1_0_0() {
    require_root!();
    run_bridge_portmap(CniVersion::V1_0_0);
}

/// The installed reference plugins (1.1.x) stop at 1.0.0: a 1.1.0 list fails with the
/// spec's "incompatible CNI version" error, which the runtime surfaces as such.
#[test]
fn reference_plugins_reject_1_1_0_with_code_1() {
    require_root!();
    let node = Netns::new("node").unwrap();
    let pod = Netns::new("pod").unwrap();
    let data = interlock_testkit::tempdir().unwrap();
    let chain = bridge_chain(
        "1.1.0",
        &unique("br"),
        &subnet(),
        data.path().to_str().unwrap(),
    );
    let rt = RuntimeConf::new(&unique("ctr"), &pod.path().display().to_string(), "eth0");
    match node.run(|| chain.add(&rt)) {
        Err(e @ ExecError::Failed { .. }) => {
            assert_eq!(e.cni_code(), Some(error::INCOMPATIBLE_VERSION), "{e}");
            assert!(e.to_string().contains("bridge"), "{e}");
        }
        // A newer plugins package accepts 1.1.0; then the chain must really work.
        Ok(r) => assert_eq!(r.cni_version, CniVersion::V1_1_0),
        Err(e) => panic!("unexpected error: {e}"),
    }
}

/// A plugin that records what it was given, to check the runtime side of GC and STATUS.
fn recorder(dir: &std::path::Path, name: &str, fail_status: bool) -> PathBuf {
    let script = format!(
        "#!/bin/sh\nout={out}/$CNI_COMMAND.$$\nenv | grep '^CNI_' | sort > $out.env\ncat > $out.json\n{fail}exit 0\n",
        out = dir.display(),
        fail = if fail_status {
            "if [ \"$CNI_COMMAND\" = STATUS ]; then echo '{\"cniVersion\":\"1.1.0\",\"code\":50,\"msg\":\"not ready\"}'; echo 'agent missing' >&2; exit 1; fi\n"
        } else {
            ""
        }
    );
    let path = dir.join(name);
    fs::write(&path, script).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn recorded(dir: &std::path::Path, command: &str) -> Vec<(String, serde_json::Value)> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let n = p.file_name().unwrap().to_string_lossy().into_owned();
        if n.starts_with(&format!("{command}.")) && n.ends_with(".json") {
            let env = fs::read_to_string(p.with_extension("env")).unwrap();
            out.push((env, serde_json::from_slice(&fs::read(&p).unwrap()).unwrap()));
        }
    }
    out
}

#[test]
fn gc_and_status_pass_the_spec_fields() {
    let t = interlock_testkit::tempdir().unwrap();
    let bin = t.path().join("bin");
    let rec = t.path().join("rec");
    fs::create_dir_all(&bin).unwrap();
    fs::create_dir_all(&rec).unwrap();
    recorder(&rec, "unused", false);
    fs::remove_file(rec.join("unused")).unwrap();
    let _ = recorder(&bin, "rec-a", false);
    let _ = fs::copy(bin.join("rec-a"), bin.join("rec-b"));
    // rec-a/rec-b write into bin/; point them at rec/ instead.
    for p in ["rec-a", "rec-b"] {
        let s = fs::read_to_string(bin.join(p))
            .unwrap()
            .replace(&bin.display().to_string(), &rec.display().to_string());
        fs::write(bin.join(p), s).unwrap();
    }
    let list = parse_conflist(br#"{"cniVersion":"1.1.0","name":"gcnet","plugins":[{"type":"rec-a","capabilities":{"portMappings":true}},{"type":"rec-b"}]}"#).unwrap();
    let chain = Chain::new(list, vec![bin.clone()]).unwrap();
    let valid = vec![Attachment {
        container_id: "c1".into(),
        ifname: "eth0".into(),
    }];
    chain.gc(&valid).unwrap();
    let gc = recorded(&rec, "GC");
    assert_eq!(gc.len(), 2);
    for (env, conf) in &gc {
        assert!(env.contains("CNI_COMMAND=GC"), "{env}");
        assert!(
            env.contains(&format!("CNI_PATH={}", bin.display())),
            "{env}"
        );
        assert_eq!(
            conf["cni.dev/valid-attachments"],
            json!([{"containerID": "c1", "ifname": "eth0"}])
        );
        assert_eq!(conf["name"], "gcnet");
        assert_eq!(conf["cniVersion"], "1.1.0");
    }
    chain.status().unwrap();
    assert_eq!(recorded(&rec, "STATUS").len(), 2);

    // A failing STATUS surfaces the plugin's code and its stderr.
    recorder(&bin, "rec-a", true);
    let s = fs::read_to_string(bin.join("rec-a"))
        .unwrap()
        .replace(&bin.display().to_string(), &rec.display().to_string());
    fs::write(bin.join("rec-a"), s).unwrap();
    let e = chain.status().unwrap_err();
    assert_eq!(e.cni_code(), Some(error::NOT_AVAILABLE));
    assert!(
        e.to_string().contains("agent missing") && e.to_string().contains("not ready"),
        "{e}"
    );

    // Before 1.1.0, GC and STATUS are no-ops; disableGC turns GC off.
    let old = parse_conflist(br#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"rec-a"}]}"#)
        .unwrap();
    Chain::new(old, vec![bin.clone()])
        .unwrap()
        .status()
        .unwrap();
    let off = parse_conflist(
        br#"{"cniVersion":"1.1.0","name":"n","disableGC":true,"plugins":[{"type":"nonexistent"}]}"#,
    )
    .unwrap();
    Chain::new(off, vec![bin.clone()])
        .unwrap()
        .gc(&valid)
        .unwrap();
    // A missing binary names the plugin and the path.
    let missing =
        parse_conflist(br#"{"cniVersion":"1.1.0","name":"n","plugins":[{"type":"nonexistent"}]}"#)
            .unwrap();
    let e = Chain::new(missing, vec![bin.clone()])
        .unwrap()
        .gc(&valid)
        .unwrap_err();
    assert!(
        e.to_string().contains("nonexistent") && e.to_string().contains(&bin.display().to_string()),
        "{e}"
    );
}

//! The conf dir as the meshes' installers read and write it: libcni's order and validity,
//! entry insertion and removal, and the three ways they write a file.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

/// The config files of `dir` in libcni's order (sorted names; `.conf`, `.conflist`,
/// `.json`).
pub fn config_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    matches!(
                        p.extension().and_then(|e| e.to_str()),
                        Some("conf" | "conflist" | "json")
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// True for a `.conflist`.
pub fn is_list_path(p: &Path) -> bool {
    p.extension().and_then(|e| e.to_str()) == Some("conflist")
}

/// The parsed file when libcni would accept it: a list needs `plugins`, a single config a
/// `type`.
pub fn valid(p: &Path) -> Option<Value> {
    let v: Value = serde_json::from_slice(&fs::read(p).ok()?).ok()?;
    let ok = if is_list_path(p) {
        v.get("plugins")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
    } else {
        v.get("type").and_then(Value::as_str).is_some()
    };
    ok.then_some(v)
}

/// The first valid config file of `dir`.
pub fn first_valid(dir: &Path) -> Option<PathBuf> {
    config_files(dir).into_iter().find(|p| valid(p).is_some())
}

/// The `type`s of a list's plugins (empty for anything else).
pub fn types(v: &Value) -> Vec<String> {
    v.get("plugins")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|p| p.get("type").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// True when the list at `p` carries a plugin of type `t`.
pub fn has_type(p: &Path, t: &str) -> bool {
    valid(p).is_some_and(|v| types(&v).iter().any(|x| x == t))
}

/// A single-plugin config wrapped into a list as the installers do (`k8s-pod-network`).
pub fn wrap(conf: &Value, cni_version: &str) -> Value {
    json!({"cniVersion": cni_version, "name": "k8s-pod-network", "plugins": [conf]})
}

/// `list` without any plugin of type `t`.
pub fn without(list: &Value, t: &str) -> Value {
    let mut l = list.clone();
    if let Some(a) = l.get_mut("plugins").and_then(Value::as_array_mut) {
        a.retain(|p| p.get("type").and_then(Value::as_str) != Some(t));
    }
    l
}

/// `list` with every plugin of `entry`'s type removed and `entry` appended last.
pub fn appended(list: &Value, entry: &Value) -> Value {
    let t = entry
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let mut l = without(list, t);
    if let Some(a) = l.get_mut("plugins").and_then(Value::as_array_mut) {
        a.push(entry.clone());
    }
    l
}

fn text(v: &Value) -> Vec<u8> {
    let mut b = serde_json::to_vec_pretty(v).expect("a JSON value serialises");
    b.push(b'\n');
    b
}

/// A temp file next to `p` renamed over it, keeping `p`'s mode (istio-cni, kuma-cni).
pub fn write_atomic(p: &Path, v: &Value) -> io::Result<()> {
    let tmp = p.with_file_name(format!(
        ".{}.tmp",
        p.file_name().and_then(|n| n.to_str()).unwrap_or("conf")
    ));
    write_renamed(p, &tmp, v)
}

/// `<p>.install` renamed over `p` (linkerd-cni's `reconfigureCNI`).
pub fn write_install_rename(p: &Path, v: &Value) -> io::Result<()> {
    let tmp = PathBuf::from(format!("{}.install", p.display()));
    write_renamed(p, &tmp, v)
}

fn write_renamed(p: &Path, tmp: &Path, v: &Value) -> io::Result<()> {
    let mode = fs::metadata(p)
        .map(|m| m.permissions().mode())
        .unwrap_or(0o644);
    fs::write(tmp, text(v))?;
    fs::set_permissions(tmp, fs::Permissions::from_mode(mode))?;
    fs::rename(tmp, p)
}

/// Truncate and write in place (consul-cni's `os.WriteFile`; linkerd-cni's revert): a
/// reader can see the file empty or half-written.
pub fn write_in_place(p: &Path, v: &Value) -> io::Result<()> {
    fs::write(p, text(v))
}

/// Copies `source` into `bin_dir/<name>` (temp file + rename, mode 0755).
pub fn install_binary(source: &Path, bin_dir: &Path, name: &str) -> io::Result<PathBuf> {
    let dst = bin_dir.join(name);
    let tmp = bin_dir.join(format!(".{name}.tmp"));
    fs::copy(source, &tmp)?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))?;
    fs::rename(&tmp, &dst)?;
    Ok(dst)
}

/// A kubeconfig for `server` with `token`, its one context named `context`.
pub fn kubeconfig(server: &str, token: &str, context: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: {server}\n\
         users:\n- name: cni\n  user:\n    token: {token}\n\
         contexts:\n- name: {context}\n  context:\n    cluster: local\n    user: cni\n\
         current-context: {context}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validity_order_and_append() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("05-bad.conflist"), "{\"plugins\": []}").unwrap();
        fs::write(d.path().join("07-half.conflist"), "{\"plu").unwrap();
        fs::write(d.path().join("10-a.conf"), "{\"type\": \"bridge\"}").unwrap();
        fs::write(
            d.path().join("20-b.conflist"),
            "{\"plugins\": [{\"type\": \"ptp\"}]}",
        )
        .unwrap();
        fs::write(d.path().join("notes.txt"), "x").unwrap();
        assert_eq!(first_valid(d.path()).unwrap(), d.path().join("10-a.conf"));
        let l = json!({"plugins": [{"type": "x"}, {"type": "bridge"}, {"type": "x", "old": 1}]});
        let a = appended(&l, &json!({"type": "x", "new": 1}));
        assert_eq!(types(&a), ["bridge", "x"]);
        assert_eq!(a["plugins"][1]["new"], 1);
    }
}

//! Which CNI conf dir the container runtime reads, from the runtime's own config file: an
//! agent pointed at a directory no runtime reads (k3s's while the node runs a stock
//! containerd, or the other way round) protects nothing and waits for a primary that
//! never writes there.
//!
//! containerd reads `conf_dir` of its CRI plugin's `cni` table
//! (`[plugins."io.containerd.grpc.v1.cri".cni]`, config version 2;
//! `[plugins."io.containerd.cri.v1.runtime".cni]`, version 3 / containerd 2.x), default
//! `/etc/cni/net.d`. CRI-O reads `network_dir` of `[crio.network]` in `crio.conf` and its
//! drop-ins (`crio.conf.d/*.conf`, later files win), default `/etc/cni/net.d/`. Only the
//! files that exist are read; a runtime config this module cannot see (not mounted into the
//! agent's pod) says nothing.

use crate::Runtime;
use interlock_contract::bounded;
use std::path::{Path, PathBuf};

/// The conf dir both runtimes read when their config names none.
pub const DEFAULT_CONF_DIR: &str = "/etc/cni/net.d";

/// Where containerd's config is looked for: the stock path, then k3s's and RKE2's (they
/// run their own containerd with its own config).
pub const CONTAINERD_CONFIGS: [&str; 3] = [
    "/etc/containerd/config.toml",
    "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
    "/var/lib/rancher/rke2/agent/etc/containerd/config.toml",
];

/// Where CRI-O's config is looked for (its drop-in directory `crio.conf.d` beside it too).
pub const CRIO_CONFIG: &str = "/etc/crio/crio.conf";

/// The conf dir one runtime config file makes its runtime read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeConfDir {
    /// The runtime config file (for CRI-O: the last file that set it, else `crio.conf`).
    pub config: PathBuf,
    /// The CNI conf dir it reads.
    pub conf_dir: PathBuf,
    /// False when the file does not set it and the runtime's default applies.
    pub explicit: bool,
}

/// The runtime config files looked at for `runtime` by default.
pub fn default_configs(runtime: Runtime) -> Vec<PathBuf> {
    match runtime {
        Runtime::Containerd => CONTAINERD_CONFIGS.iter().map(PathBuf::from).collect(),
        Runtime::Crio => vec![PathBuf::from(CRIO_CONFIG)],
    }
}

fn table_str<'a>(item: Option<&'a toml_edit::Item>, path: &[&str]) -> Option<&'a str> {
    let mut at = item?;
    for key in path {
        at = at.get(key)?;
    }
    at.as_str()
}

/// The conf dir that config text `text` of `runtime` sets (`Ok(None)`: it sets none).
pub fn conf_dir_in(runtime: Runtime, text: &str) -> Result<Option<PathBuf>, String> {
    let doc: toml_edit::DocumentMut = text.parse().map_err(|e| format!("not TOML: {e}"))?;
    let root = Some(doc.as_item());
    let found = match runtime {
        Runtime::Containerd => ["io.containerd.cri.v1.runtime", "io.containerd.grpc.v1.cri"]
            .iter()
            .find_map(|plugin| table_str(root, &["plugins", plugin, "cni", "conf_dir"])),
        Runtime::Crio => table_str(root, &["crio", "network", "network_dir"]),
    };
    Ok(found.map(PathBuf::from))
}

/// Reads the runtime config files `configs` that exist; one that cannot be read or
/// parsed is an error naming it (the others still count).
pub fn read(runtime: Runtime, configs: &[PathBuf]) -> Vec<Result<RuntimeConfDir, String>> {
    let text = |p: &Path| -> Option<Result<String, String>> {
        if !p.is_file() {
            return None;
        }
        Some(
            bounded::read_config(p)
                .map_err(|e| format!("{}: {e}", p.display()))
                .map(|b| String::from_utf8_lossy(&b).into_owned()),
        )
    };
    let mut out = vec![];
    for config in configs {
        let Some(main) = text(config) else { continue };
        let mut found = main.and_then(|t| {
            conf_dir_in(runtime, &t).map_err(|e| format!("{}: {e}", config.display()))
        });
        let mut set_in = config.clone();
        if runtime == Runtime::Crio {
            // Drop-ins override the main file, in name order.
            let dir = config.with_extension("conf.d");
            let mut drops: Vec<PathBuf> = std::fs::read_dir(&dir)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "conf"))
                .collect();
            drops.sort();
            for d in drops {
                match text(&d).map(|t| {
                    t.and_then(|t| {
                        conf_dir_in(runtime, &t).map_err(|e| format!("{}: {e}", d.display()))
                    })
                }) {
                    Some(Ok(Some(dir))) => {
                        found = found.map(|_| Some(dir));
                        set_in = d;
                    }
                    Some(Err(e)) => found = Err(e),
                    _ => {}
                }
            }
        }
        out.push(found.map(|dir| RuntimeConfDir {
            explicit: dir.is_some(),
            conf_dir: dir.unwrap_or_else(|| PathBuf::from(DEFAULT_CONF_DIR)),
            config: set_in,
        }));
    }
    out
}

/// `p` without trailing slashes, resolved through symbolic links when it exists.
fn normal(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.components().collect())
}

/// Why `conf_dir` looks like a directory no runtime reads, given what the runtime configs
/// say (`None`: one of them reads it, or none was found, so nothing can be told).
pub fn unread(conf_dir: &Path, found: &[RuntimeConfDir]) -> Option<String> {
    if found.is_empty()
        || found
            .iter()
            .any(|f| normal(&f.conf_dir) == normal(conf_dir))
    {
        return None;
    }
    let reads: Vec<String> = found
        .iter()
        .map(|f| {
            format!(
                "{} reads {}{}",
                f.config.display(),
                f.conf_dir.display(),
                if f.explicit { "" } else { " (its default)" }
            )
        })
        .collect();
    Some(format!(
        "the CNI conf dir {} is not the one the runtime reads: {}; pods get their network \
         from there, and interlock's config in {} is never loaded (point --cni-conf-dir / \
         INTERLOCK_CNI_CONF_DIR at the runtime's)",
        conf_dir.display(),
        reads.join(", "),
        conf_dir.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const K3S: &str = r#"
version = 2
[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "/var/lib/rancher/k3s/data/current/bin"
  conf_dir = "/var/lib/rancher/k3s/agent/etc/cni/net.d"
"#;

    #[test]
    fn containerd_v2_v3_default_and_crio() {
        assert_eq!(
            conf_dir_in(Runtime::Containerd, K3S).unwrap(),
            Some(PathBuf::from("/var/lib/rancher/k3s/agent/etc/cni/net.d"))
        );
        let v3 = "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.cni]\nconf_dir = '/opt/cni/conf'\n";
        assert_eq!(
            conf_dir_in(Runtime::Containerd, v3).unwrap(),
            Some(PathBuf::from("/opt/cni/conf"))
        );
        assert_eq!(
            conf_dir_in(Runtime::Containerd, "version = 2\n").unwrap(),
            None
        );
        assert!(conf_dir_in(Runtime::Containerd, "[plugins")
            .unwrap_err()
            .contains("not TOML"));
        let crio = "[crio.network]\nnetwork_dir = \"/etc/cni/crio.d/\"\n";
        assert_eq!(
            conf_dir_in(Runtime::Crio, crio).unwrap(),
            Some(PathBuf::from("/etc/cni/crio.d/"))
        );
    }

    #[test]
    fn a_conf_dir_no_runtime_config_names_is_flagged_naming_both() {
        let t = tempfile::tempdir().unwrap();
        let cfg = t.path().join("config.toml");
        std::fs::write(&cfg, K3S).unwrap();
        let missing = t.path().join("absent.toml");
        let found: Vec<RuntimeConfDir> = read(Runtime::Containerd, &[missing, cfg.clone()])
            .into_iter()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(found.len(), 1, "a missing config says nothing");
        let why = unread(Path::new("/etc/cni/net.d/"), &found).unwrap();
        assert!(
            why.contains("/etc/cni/net.d")
                && why.contains(&format!(
                    "{} reads /var/lib/rancher/k3s/agent/etc/cni/net.d",
                    cfg.display()
                )),
            "{why}"
        );
        assert_eq!(
            unread(
                Path::new("/var/lib/rancher/k3s/agent/etc/cni/net.d/"),
                &found
            ),
            None
        );
        assert_eq!(unread(Path::new("/x"), &[]), None, "nothing known");
        // A config that sets nothing: the default.
        std::fs::write(&cfg, "version = 2\n").unwrap();
        let found = read(Runtime::Containerd, &[cfg]);
        let f = found[0].as_ref().unwrap();
        assert!(!f.explicit && f.conf_dir == Path::new(DEFAULT_CONF_DIR));
        assert!(unread(Path::new("/k3s/net.d"), std::slice::from_ref(f))
            .unwrap()
            .contains("(its default)"));
    }

    #[test]
    fn crio_drop_ins_override_the_main_file() {
        let t = tempfile::tempdir().unwrap();
        let main = t.path().join("crio.conf");
        std::fs::write(&main, "[crio.network]\nnetwork_dir = \"/a\"\n").unwrap();
        std::fs::create_dir(t.path().join("crio.conf.d")).unwrap();
        std::fs::write(
            t.path().join("crio.conf.d/10-net.conf"),
            "[crio.network]\nnetwork_dir = \"/b\"\n",
        )
        .unwrap();
        let found = read(Runtime::Crio, &[main]);
        let f = found[0].as_ref().unwrap();
        assert_eq!(f.conf_dir, Path::new("/b"));
        assert!(f.config.ends_with("crio.conf.d/10-net.conf"));
    }
}

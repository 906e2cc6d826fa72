//! Which network a container runtime loads from a CNI config directory, and why.
//!
//! Two rule sets, reproduced from the runtimes' code:
//!
//! - **containerd** (go-cni `loadFromConfDir` with `max_conf_num = 1`): files whose
//!   extension is `.conf`, `.conflist` or `.json`, sorted by name; `.conflist` is parsed as
//!   a list, the others as a single network config (which must have a `type`) wrapped
//!   into a list. The first file wins. If that first file cannot be read or parsed, the
//!   **whole load fails** and the runtime has no network at all (fail-closed); files after
//!   the chosen one are never read.
//! - **CRI-O** (ocicni `loadNetworks`): same listing and parsing, but a file that fails to
//!   parse, or whose plugins' binaries are missing from the plugin directories, is
//!   **skipped** and the next one is tried (fail-open). The default network is the first
//!   file that survives; an empty `name` becomes the file name; a later file with an
//!   already loaded name is ignored.
//!
//! [`load`] applies one rule set and gives every file in the directory a verdict with a
//! human reason. It never executes anything: for CRI-O it checks that every plugin
//! binary exists and is executable. CRI-O additionally asks each binary for its VERSION
//! and skips lists whose version a plugin does not support; [`load_with`] with
//! [`LoadOptions::probe_versions`] does that too.

use std::fmt;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::conf::{self, ConfFormat, NetworkConfigList, Validation};

/// The extensions both runtimes load.
pub const EXTENSIONS: [&str; 3] = [".conf", ".conflist", ".json"];

/// Which runtime's loading rules to apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    /// containerd (go-cni): first file wins, an invalid first file fails the load.
    Containerd,
    /// CRI-O (ocicni): invalid files and files with missing plugin binaries are skipped.
    Crio,
}

impl fmt::Display for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Runtime::Containerd => "containerd",
            Runtime::Crio => "CRI-O",
        })
    }
}

/// What the runtime did with one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// This file is the network the runtime uses.
    Chosen,
    /// containerd: this file is invalid and sorts first, so the whole load failed.
    FailedLoad,
    /// CRI-O: invalid or unusable, skipped.
    Skipped,
    /// CRI-O: valid and loaded as an additional network, but not the default one.
    LoadedNotDefault,
    /// CRI-O: valid but ignored because a network with the same name was loaded first.
    DuplicateName,
    /// Never read: the runtime had already chosen (or failed) on an earlier file.
    NotReached,
    /// Not a config file for the runtime (other extension, or a directory).
    Ignored,
}

/// The verdict on one directory entry, with the reason in words.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FileVerdict {
    /// Full path of the entry.
    pub path: PathBuf,
    /// What happened to it.
    pub verdict: Verdict,
    /// Why, in words an operator can act on.
    pub reason: String,
}

/// The network the runtime would use.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Chosen {
    /// The file it comes from.
    pub path: PathBuf,
    /// Its contents as a list (a `.conf` is wrapped like libcni's `ConfListFromConf`).
    pub list: NetworkConfigList,
    /// Whether the file was a `.conflist` or a single config.
    pub format: ConfFormat,
    /// The network name the runtime uses (CRI-O: the file name when `name` is empty).
    pub network_name: String,
}

/// "Which network would this runtime load from this directory, and why."
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Effective {
    /// The rules applied.
    pub runtime: Runtime,
    /// The directory examined.
    pub dir: PathBuf,
    /// The network in effect, or `None` when the runtime has no network.
    pub chosen: Option<Chosen>,
    /// Every entry of the directory in the order the runtime considers them (config
    /// files sorted by name, then ignored entries).
    pub files: Vec<FileVerdict>,
    /// One sentence summing up the outcome (why this file, or why no network).
    pub summary: String,
}

impl Effective {
    /// The verdict for a file name, if the directory has it.
    pub fn verdict_for(&self, file_name: &str) -> Option<&FileVerdict> {
        self.files
            .iter()
            .find(|f| f.path.file_name().is_some_and(|n| n == file_name))
    }

    /// The chosen file's name, if any.
    pub fn chosen_name(&self) -> Option<String> {
        self.chosen
            .as_ref()
            .and_then(|c| c.path.file_name())
            .map(|n| n.to_string_lossy().into_owned())
    }
}

/// `filepath.Ext`: the suffix from the last dot of the final element.
fn extension(name: &[u8]) -> &[u8] {
    match name.iter().rposition(|&b| b == b'.') {
        Some(i) => &name[i..],
        None => &[],
    }
}

/// True when a runtime would consider a file with this name.
pub fn is_config_name(name: &str) -> bool {
    EXTENSIONS
        .iter()
        .any(|e| extension(name.as_bytes()) == e.as_bytes())
}

/// Reads and parses one file the way both runtimes do (list for `.conflist`, single
/// config otherwise). The error is a sentence naming the file.
pub fn load_file(path: &Path) -> Result<(NetworkConfigList, ConfFormat), String> {
    let bytes = fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let is_list = path.extension().is_some_and(|e| e == "conflist");
    if is_list {
        conf::parse_conflist_with(&bytes, Validation::Libcni)
            .map(|l| (l, ConfFormat::Conflist))
            .map_err(|e| format!("{} is not a valid config list: {e}", path.display()))
    } else {
        conf::parse_conf_with(&bytes, Validation::Libcni)
            .map(|l| (l, ConfFormat::Conf))
            .map_err(|e| {
                let hint = if e.field_name() == Some("type") {
                    " (perhaps this is a .conflist?)"
                } else {
                    ""
                };
                format!(
                    "{} is not a valid network config: {e}{hint}",
                    path.display()
                )
            })
    }
}

fn is_executable_file(p: &Path) -> bool {
    fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Finds a plugin binary in `bin_dirs` (libcni `FindInPath`).
pub fn find_plugin(plugin: &str, bin_dirs: &[PathBuf]) -> Option<PathBuf> {
    if plugin.is_empty() || plugin.contains('/') {
        return None;
    }
    bin_dirs
        .iter()
        .map(|d| d.join(plugin))
        .find(|p| is_executable_file(p))
}

fn dir_list(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(":")
}

/// Directory entries no runtime loads, with the reason.
type IgnoredEntries = Vec<(PathBuf, String)>;

/// Lists a directory as the runtimes do: config files sorted by byte order of the name,
/// plus the entries they ignore. A missing directory is empty (libcni `ConfFiles`).
fn list_dir(dir: &Path) -> io::Result<(Vec<PathBuf>, IgnoredEntries)> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((Vec::new(), Vec::new())),
        Err(e) => {
            return Err(io::Error::new(
                e.kind(),
                format!("reading CNI config directory {}: {e}", dir.display()),
            ))
        }
    };
    let mut configs = Vec::new();
    let mut ignored = Vec::new();
    for entry in entries {
        let entry = entry?;
        let path = entry.path();
        let name = entry.file_name();
        let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
        if is_dir {
            ignored.push((path, "a directory: runtimes only read files".to_string()));
        } else if EXTENSIONS
            .iter()
            .any(|e| extension(name.as_bytes()) == e.as_bytes())
        {
            configs.push(path);
        } else {
            ignored.push((
                path,
                "not loaded: only .conf, .conflist and .json files are read".to_string(),
            ));
        }
    }
    configs.sort_by(|a, b| {
        a.file_name()
            .map(OsStrExt::as_bytes)
            .cmp(&b.file_name().map(OsStrExt::as_bytes))
    });
    ignored.sort();
    Ok((configs, ignored))
}

/// Options for [`load_with`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// CRI-O rules: also run each plugin's VERSION, as ocicni's `ValidateNetworkList`
    /// does, and skip lists whose version a plugin does not support (e.g. a 1.1.0 list
    /// with plugins that stop at 1.0.0). Executes the binaries.
    pub probe_versions: bool,
}

/// Applies `runtime`'s rules to `dir` without executing anything. `bin_dirs` are the
/// runtime's plugin directories (used by the CRI-O rules to skip lists whose binaries
/// are missing).
pub fn load(dir: &Path, runtime: Runtime, bin_dirs: &[PathBuf]) -> io::Result<Effective> {
    load_with(dir, runtime, bin_dirs, LoadOptions::default())
}

/// The version check of ocicni's `ValidateNetworkList`: every plugin must list the
/// list's version (an empty one means 0.1.0) in its VERSION answer.
fn unsupported_by_plugins(list: &NetworkConfigList, bin_dirs: &[PathBuf]) -> Option<String> {
    let mut version = list.effective_version();
    if version.is_empty() {
        version = "0.1.0".into();
    }
    let mut problems = Vec::new();
    for t in list.plugin_types() {
        let Some(path) = find_plugin(t, bin_dirs) else {
            continue;
        };
        match crate::exec::plugin_version(&path, bin_dirs) {
            Ok(info) if info.supported_versions.contains(&version) => {}
            Ok(info) => problems.push(format!(
                "plugin {t} does not support config version {version:?} (it supports {})",
                info.supported_versions.join(", ")
            )),
            Err(e) => problems.push(format!("plugin {t} VERSION failed: {e}")),
        }
    }
    (!problems.is_empty()).then(|| problems.join("; "))
}

/// [`load`] with options.
pub fn load_with(
    dir: &Path,
    runtime: Runtime,
    bin_dirs: &[PathBuf],
    options: LoadOptions,
) -> io::Result<Effective> {
    let (configs, ignored) = list_dir(dir)?;
    let mut files = Vec::with_capacity(configs.len() + ignored.len());
    let mut chosen: Option<Chosen> = None;
    let mut summary = String::new();
    match runtime {
        Runtime::Containerd => {
            let mut stop: Option<String> = None;
            for path in configs {
                if let Some(why) = &stop {
                    files.push(FileVerdict {
                        path,
                        verdict: Verdict::NotReached,
                        reason: why.clone(),
                    });
                    continue;
                }
                let name = path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                match load_file(&path) {
                    Ok((list, format)) => {
                        stop = Some(format!(
                            "not used: containerd loads only the first config file ({name} sorts first)"
                        ));
                        summary = format!(
                            "containerd uses network {:?} from {name}: it is the first config file by name",
                            list.name()
                        );
                        files.push(FileVerdict {
                            path: path.clone(),
                            verdict: Verdict::Chosen,
                            reason: format!(
                                "first config file by name, and valid (plugins: {})",
                                list.plugin_types().join(" → ")
                            ),
                        });
                        chosen = Some(Chosen {
                            network_name: list.name().to_string(),
                            path,
                            list,
                            format,
                        });
                    }
                    Err(e) => {
                        stop = Some(format!(
                            "not read: containerd stopped at {name}, which sorts first and is invalid"
                        ));
                        summary = format!(
                            "containerd has NO network: the first config file {name} is invalid and fails the whole load \
                             (pods fail with \"cni plugin not initialized\"); fix or remove {name}"
                        );
                        files.push(FileVerdict {
                            path,
                            verdict: Verdict::FailedLoad,
                            reason: format!("{e}; containerd fails the whole load on it"),
                        });
                    }
                }
            }
            if summary.is_empty() {
                summary = format!(
                    "containerd has NO network: no .conf/.conflist/.json file in {}",
                    dir.display()
                );
            }
        }
        Runtime::Crio => {
            let mut loaded_names: Vec<(String, String)> = Vec::new();
            for path in configs {
                let name = path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let (list, format) = match load_file(&path) {
                    Ok(x) => x,
                    Err(e) => {
                        files.push(FileVerdict {
                            path,
                            verdict: Verdict::Skipped,
                            reason: format!("skipped by CRI-O: {e}"),
                        });
                        continue;
                    }
                };
                let missing: Vec<&str> = list
                    .plugin_types()
                    .into_iter()
                    .filter(|t| find_plugin(t, bin_dirs).is_none())
                    .collect();
                if !missing.is_empty() {
                    files.push(FileVerdict {
                        path,
                        verdict: Verdict::Skipped,
                        reason: format!(
                            "skipped by CRI-O: plugin binary {} not found (or not executable) in {}",
                            missing.join(", "),
                            dir_list(bin_dirs)
                        ),
                    });
                    continue;
                }
                if options.probe_versions {
                    if let Some(problem) = unsupported_by_plugins(&list, bin_dirs) {
                        files.push(FileVerdict {
                            path,
                            verdict: Verdict::Skipped,
                            reason: format!("skipped by CRI-O: {problem}"),
                        });
                        continue;
                    }
                }
                let net_name = if list.name().is_empty() {
                    name.clone()
                } else {
                    list.name().to_string()
                };
                if let Some((_, first_file)) = loaded_names.iter().find(|(n, _)| *n == net_name) {
                    files.push(FileVerdict {
                        path,
                        verdict: Verdict::DuplicateName,
                        reason: format!(
                            "ignored by CRI-O: network {net_name:?} was already loaded from {first_file}"
                        ),
                    });
                    continue;
                }
                loaded_names.push((net_name.clone(), name.clone()));
                if let Some(c) = &chosen {
                    let first = c
                        .path
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    files.push(FileVerdict {
                        path,
                        verdict: Verdict::LoadedNotDefault,
                        reason: format!(
                            "valid, loaded as network {net_name:?} but not the default: {first} is the first usable file"
                        ),
                    });
                    continue;
                }
                let skipped = files
                    .iter()
                    .filter(|f| f.verdict == Verdict::Skipped)
                    .count();
                summary = if skipped == 0 {
                    format!("CRI-O uses network {net_name:?} from {name}: it is the first usable config file by name")
                } else {
                    format!(
                        "CRI-O uses network {net_name:?} from {name} after skipping {skipped} unusable file(s) before it (fail-open)"
                    )
                };
                files.push(FileVerdict {
                    path: path.clone(),
                    verdict: Verdict::Chosen,
                    reason: format!(
                        "first usable config file by name (plugins: {})",
                        list.plugin_types().join(" → ")
                    ),
                });
                chosen = Some(Chosen {
                    path,
                    list,
                    format,
                    network_name: net_name,
                });
            }
            if chosen.is_none() {
                summary = if files.is_empty() {
                    format!(
                        "CRI-O has NO network: no .conf/.conflist/.json file in {}",
                        dir.display()
                    )
                } else {
                    format!(
                        "CRI-O has NO network: every config file in {} was skipped",
                        dir.display()
                    )
                };
            }
        }
    }
    files.extend(ignored.into_iter().map(|(path, reason)| FileVerdict {
        path,
        verdict: Verdict::Ignored,
        reason,
    }));
    Ok(Effective {
        runtime,
        dir: dir.to_path_buf(),
        chosen,
        files,
        summary,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn good(name: &str, plugin: &str) -> String {
        format!(r#"{{"cniVersion":"1.0.0","name":"{name}","plugins":[{{"type":"{plugin}"}}]}}"#)
    }

    fn bin_dir(dir: &Path, plugins: &[&str]) -> PathBuf {
        let b = dir.join("bin");
        fs::create_dir_all(&b).unwrap();
        for p in plugins {
            fs::write(b.join(p), "#!/bin/sh\n").unwrap();
            fs::set_permissions(b.join(p), fs::Permissions::from_mode(0o755)).unwrap();
        }
        b
    }

    #[test]
    fn broken_first_file_containerd_fails_crio_falls_back() {
        let t = tempfile::tempdir().unwrap();
        let conf = t.path().join("net.d");
        fs::create_dir(&conf).unwrap();
        let full = good("good", "bridge");
        fs::write(conf.join("00-broken.conflist"), &full[..full.len() / 2]).unwrap();
        fs::write(conf.join("10-good.conflist"), &full).unwrap();
        let bins = vec![bin_dir(t.path(), &["bridge"])];

        let c = load(&conf, Runtime::Containerd, &bins).unwrap();
        assert!(c.chosen.is_none(), "containerd must have no network: {c:?}");
        let broken = c.verdict_for("00-broken.conflist").unwrap();
        assert_eq!(broken.verdict, Verdict::FailedLoad);
        assert!(
            broken.reason.contains("00-broken.conflist"),
            "{}",
            broken.reason
        );
        assert!(
            broken.reason.contains("invalid JSON") && broken.reason.contains("EOF"),
            "{}",
            broken.reason
        );
        assert!(
            c.summary.contains("NO network") && c.summary.contains("00-broken.conflist"),
            "{}",
            c.summary
        );
        assert_eq!(
            c.verdict_for("10-good.conflist").unwrap().verdict,
            Verdict::NotReached
        );

        let o = load(&conf, Runtime::Crio, &bins).unwrap();
        assert_eq!(o.chosen_name().as_deref(), Some("10-good.conflist"));
        assert_eq!(o.chosen.as_ref().unwrap().network_name, "good");
        let broken = o.verdict_for("00-broken.conflist").unwrap();
        assert_eq!(broken.verdict, Verdict::Skipped);
        assert!(broken.reason.contains("invalid JSON"), "{}", broken.reason);
        assert!(o.summary.contains("skipping 1"), "{}", o.summary);
    }

    #[test]
    fn extensions_conf_wrapping_and_ignored_entries() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        fs::write(d.join("05-a.conf.bak"), good("bak", "x")).unwrap();
        fs::write(d.join(".00-x.conflist.1.0.tmp"), "{").unwrap();
        fs::create_dir(d.join("00-dir.conflist")).unwrap();
        fs::write(
            d.join("20-single.json"),
            r#"{"cniVersion":"0.4.0","name":"single","type":"bridge","zz":1}"#,
        )
        .unwrap();
        fs::write(d.join("30-list.conflist"), good("list", "bridge")).unwrap();
        let bins = vec![bin_dir(d, &["bridge"])];
        let c = load(d, Runtime::Containerd, &bins).unwrap();
        let chosen = c.chosen.as_ref().unwrap();
        assert_eq!(chosen.format, ConfFormat::Conf);
        assert_eq!(chosen.list.name(), "single");
        assert_eq!(chosen.list.plugins()[0]["zz"], 1);
        let ignored: Vec<_> = c
            .files
            .iter()
            .filter(|f| f.verdict == Verdict::Ignored)
            .collect();
        // .bak, .tmp, a directory named like a list, and the bin/ directory.
        assert_eq!(ignored.len(), 4, "{:?}", c.files);
        assert_eq!(c.files.len(), 6);
        // A .conf without "type" is invalid (probably a list in the wrong file).
        fs::write(d.join("10-list-in-conf.conf"), good("x", "bridge")).unwrap();
        let c = load(d, Runtime::Containerd, &bins).unwrap();
        assert!(c.chosen.is_none());
        assert!(
            c.files[0].reason.contains("perhaps this is a .conflist"),
            "{}",
            c.files[0].reason
        );
    }

    #[test]
    fn crio_skips_missing_binaries_names_and_duplicates() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("net.d");
        fs::create_dir(&d).unwrap();
        let bins = vec![bin_dir(t.path(), &["bridge", "portmap"])];
        fs::write(d.join("00-calico.conflist"), good("k8s", "calico")).unwrap();
        fs::write(
            d.join("10-a.conflist"),
            r#"{"cniVersion":"1.0.0","name":"","plugins":[{"type":"bridge"},{"type":"portmap"}]}"#,
        )
        .unwrap();
        fs::write(d.join("20-b.conflist"), good("10-a.conflist", "bridge")).unwrap();
        fs::write(d.join("30-c.conflist"), good("other", "bridge")).unwrap();
        let o = load(&d, Runtime::Crio, &bins).unwrap();
        let v: Vec<Verdict> = o.files.iter().map(|f| f.verdict).collect();
        assert_eq!(
            v,
            [
                Verdict::Skipped,
                Verdict::Chosen,
                Verdict::DuplicateName,
                Verdict::LoadedNotDefault
            ]
        );
        assert!(o.files[0].reason.contains("calico") && o.files[0].reason.contains("not found"));
        assert_eq!(o.chosen.unwrap().network_name, "10-a.conflist");
        // containerd does not look at binaries: it picks 00-calico.
        let c = load(&d, Runtime::Containerd, &bins).unwrap();
        assert_eq!(c.chosen_name().as_deref(), Some("00-calico.conflist"));
    }

    #[test]
    fn runtimes_only_reject_what_libcni_rejects() {
        // `args` is not a JSON object: the spec says it should be, libcni does not care,
        // so both runtimes load the file and so must the prediction.
        let t = tempfile::tempdir().unwrap();
        fs::write(
            t.path().join("10-a.conflist"),
            r#"{"cniVersion":"1.0.0","name":"a","plugins":[{"type":"bridge","args":"x"}]}"#,
        )
        .unwrap();
        let bins = vec![bin_dir(t.path(), &["bridge"])];
        for rt in [Runtime::Containerd, Runtime::Crio] {
            let e = load(t.path(), rt, &bins).unwrap();
            assert_eq!(e.chosen_name().as_deref(), Some("10-a.conflist"), "{rt}");
            let json = serde_json::to_value(&e).unwrap();
            assert_eq!(json["chosen"]["list"]["plugins"][0]["args"], "x");
            assert_eq!(json["files"][0]["verdict"], "chosen");
        }
    }

    #[test]
    fn crio_version_probe_skips_lists_the_plugins_cannot_run() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("net.d");
        fs::create_dir(&d).unwrap();
        let b = t.path().join("bin");
        fs::create_dir(&b).unwrap();
        fs::write(
            b.join("old"),
            "#!/bin/sh\necho '{\"cniVersion\":\"1.0.0\",\"supportedVersions\":[\"0.4.0\",\"1.0.0\"]}'\n",
        )
        .unwrap();
        fs::set_permissions(b.join("old"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(
            d.join("00-new.conflist"),
            r#"{"cniVersion":"1.1.0","name":"new","plugins":[{"type":"old"}]}"#,
        )
        .unwrap();
        fs::write(
            d.join("10-ok.conflist"),
            r#"{"cniVersion":"1.0.0","name":"ok","plugins":[{"type":"old"}]}"#,
        )
        .unwrap();
        let bins = vec![b];
        // Without probing, 00-new looks usable.
        let plain = load(&d, Runtime::Crio, &bins).unwrap();
        assert_eq!(plain.chosen_name().as_deref(), Some("00-new.conflist"));
        let probed = load_with(
            &d,
            Runtime::Crio,
            &bins,
            LoadOptions {
                probe_versions: true,
            },
        )
        .unwrap();
        assert_eq!(probed.chosen_name().as_deref(), Some("10-ok.conflist"));
        let why = &probed.verdict_for("00-new.conflist").unwrap().reason;
        assert!(
            why.contains("does not support config version \"1.1.0\""),
            "{why}"
        );
        // containerd never looks at the binaries.
        let c = load_with(
            &d,
            Runtime::Containerd,
            &bins,
            LoadOptions {
                probe_versions: true,
            },
        )
        .unwrap();
        assert_eq!(c.chosen_name().as_deref(), Some("00-new.conflist"));
    }

    #[test]
    fn empty_and_missing_directories_have_no_network() {
        let t = tempfile::tempdir().unwrap();
        for rt in [Runtime::Containerd, Runtime::Crio] {
            let e = load(t.path(), rt, &[]).unwrap();
            assert!(e.chosen.is_none() && e.files.is_empty());
            assert!(e.summary.contains("NO network"));
            let e = load(&t.path().join("nope"), rt, &[]).unwrap();
            assert!(e.chosen.is_none());
        }
    }

    #[derive(Debug, Clone, Copy)]
    enum Kind {
        Good,
        Broken,
        MissingBinary,
    }

    fn arb_dir() -> impl Strategy<Value = Vec<(String, Kind)>> {
        prop::collection::btree_map(
            (
                "[0-9a-zA-Z_-]{1,6}",
                prop::sample::select(vec![".conf", ".conflist", ".json"]),
            )
                .prop_map(|(s, e)| format!("{s}{e}")),
            prop::sample::select(vec![Kind::Good, Kind::Broken, Kind::MissingBinary]),
            0..7,
        )
        .prop_map(|m| m.into_iter().collect())
    }

    fn write_dir(d: &Path, files: &[(String, Kind)]) {
        for (name, kind) in files {
            let plugin = match kind {
                Kind::MissingBinary => "nosuchplugin",
                _ => "bridge",
            };
            let body = if name.ends_with(".conflist") {
                good(name, plugin)
            } else {
                format!(r#"{{"cniVersion":"1.0.0","name":"{name}","type":"{plugin}"}}"#)
            };
            let body = match kind {
                Kind::Broken => body[..body.len() - 3].to_string(),
                _ => body,
            };
            fs::write(d.join(name), body).unwrap();
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn sorted_by_byte_order_and_first_wins(names in prop::collection::btree_set("[0-9A-Za-z._-]{1,8}\\.(conf|conflist|json)", 1..6)) {
            let t = tempfile::tempdir().unwrap();
            let bins = vec![bin_dir(t.path(), &["bridge"])];
            let d = t.path().join("net.d");
            fs::create_dir(&d).unwrap();
            let files: Vec<(String, Kind)> = names.iter().map(|n| (n.clone(), Kind::Good)).collect();
            write_dir(&d, &files);
            let mut sorted: Vec<&String> = names.iter().collect();
            sorted.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
            for rt in [Runtime::Containerd, Runtime::Crio] {
                let e = load(&d, rt, &bins).unwrap();
                let order: Vec<String> = e.files.iter().map(|f| f.path.file_name().unwrap().to_string_lossy().into_owned()).collect();
                prop_assert_eq!(order.iter().collect::<Vec<_>>(), sorted.clone());
                let chosen = e.chosen_name();
                prop_assert_eq!(chosen.as_ref(), Some(sorted[0]));
            }
        }

        #[test]
        fn containerd_fails_closed_crio_fails_open(files in arb_dir()) {
            let t = tempfile::tempdir().unwrap();
            let bins = vec![bin_dir(t.path(), &["bridge"])];
            let d = t.path().join("net.d");
            fs::create_dir(&d).unwrap();
            write_dir(&d, &files);
            let mut sorted = files.clone();
            sorted.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));

            let c = load(&d, Runtime::Containerd, &bins).unwrap();
            let expect_c = match sorted.first() {
                Some((n, Kind::Good | Kind::MissingBinary)) => Some(n.clone()),
                _ => None,
            };
            prop_assert_eq!(c.chosen_name(), expect_c.clone());
            if expect_c.is_none() && !sorted.is_empty() {
                prop_assert_eq!(c.files[0].verdict, Verdict::FailedLoad);
                prop_assert!(c.files[1..].iter().all(|f| f.verdict == Verdict::NotReached));
            }

            let o = load(&d, Runtime::Crio, &bins).unwrap();
            let expect_o = sorted.iter().find(|(_, k)| matches!(k, Kind::Good)).map(|(n, _)| n.clone());
            prop_assert_eq!(o.chosen_name(), expect_o.clone());
            // Every file before CRI-O's choice was skipped, with a reason.
            for f in o.files.iter().take_while(|f| f.verdict != Verdict::Chosen) {
                prop_assert_eq!(f.verdict, Verdict::Skipped);
                prop_assert!(!f.reason.is_empty());
            }
            // Fail-open never has less network than fail-closed.
            prop_assert!(expect_c.is_none() || expect_o.is_some() || matches!(sorted[0].1, Kind::MissingBinary));
            prop_assert_eq!(c.files.len(), files.len());
            prop_assert_eq!(o.files.len(), files.len());
        }
    }
}

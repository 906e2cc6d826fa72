//! Removing interlock from a node: exactly what it added, in an order that never leaves
//! a config naming a plugin that is gone ([`uninstall_node`]). Used by `interlock
//! uninstall` and by the agent on exit with `--uninstall-on-exit`.

use std::path::{Path, PathBuf};

use interlock_confdir::Runtime;
use serde_json::Value;

use crate::guard;

/// What one step of [`uninstall_node`] did or, in a dry run, would do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UninstallStep {
    /// `what` is removed.
    Remove {
        /// The file or directory.
        what: String,
        /// What it is, so that the reader knows why it goes.
        why: String,
    },
    /// The foreign config `what` is rewritten without interlock's entry.
    Rewrite {
        /// The file (`<name> in <conf dir>`).
        what: String,
    },
    /// The original `to` is put back from interlock's backup `from`.
    Restore {
        /// The backup's name.
        from: String,
        /// The original (`<name> in <conf dir>`).
        to: String,
    },
    /// `what` stays, on purpose.
    Keep {
        /// The file or directory.
        what: String,
        /// Why it stays, and what to do about it.
        why: String,
    },
    /// A step that failed (the others were still attempted).
    Failed {
        /// What was being done.
        doing: String,
        /// The error.
        error: String,
    },
}

impl UninstallStep {
    /// One line for people: what was done, or with `dry_run` what would be.
    pub fn line(&self, dry_run: bool) -> String {
        let verb = |done: &str, planned: &str| {
            if dry_run {
                format!("would {planned}")
            } else {
                done.to_string()
            }
        };
        match self {
            UninstallStep::Remove { what, why } => {
                format!("{} {what} ({why})", verb("removed", "remove"))
            }
            UninstallStep::Rewrite { what } => format!(
                "{} {what} without interlock's entry",
                verb("rewrote", "rewrite")
            ),
            UninstallStep::Restore { from, to } => {
                format!("{} {to} from {from}", verb("restored", "restore"))
            }
            UninstallStep::Keep { what, why } => format!("{} {what}: {why}", verb("kept", "keep")),
            UninstallStep::Failed { doing, error } => format!("FAILED {doing}: {error}"),
        }
    }

    /// The step as something to do (for the message when doing it failed).
    fn planned(&self) -> String {
        let l = self.line(true);
        l.strip_prefix("would ").unwrap_or(&l).to_string()
    }
}

/// How [`uninstall_node`] runs.
#[derive(Debug, Clone, Copy, Default)]
pub struct UninstallOptions {
    /// Change nothing: say what would be removed and what would stay.
    pub dry_run: bool,
    /// Remove the plugin binary even while something still needs it (a config that names
    /// it, or CRI-O pods set up through it).
    pub force: bool,
    /// The node's runtime; `None`: the one the agent's readiness marker names, if any.
    pub runtime: Option<Runtime>,
    /// The caller is the agent that served `agent.sock` (uninstall on exit): remove it
    /// without asking whether something listens (its own listener may not be closed yet).
    pub own_socket: bool,
}

/// Everything [`uninstall_node`] did, or would do, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UninstallReport {
    /// Nothing was changed.
    pub dry_run: bool,
    /// The steps, in the order they ran.
    pub steps: Vec<UninstallStep>,
    /// Why interlock is not gone from the node afterwards (empty: it is, apart from the
    /// records kept on purpose), one sentence each.
    pub incomplete: Vec<String>,
}

impl UninstallReport {
    /// One line per step.
    pub fn lines(&self) -> Vec<String> {
        self.steps.iter().map(|s| s.line(self.dry_run)).collect()
    }

    /// The failed steps, one line each.
    pub fn errors(&self) -> Vec<String> {
        self.steps
            .iter()
            .filter(|s| matches!(s, UninstallStep::Failed { .. }))
            .map(|s| s.line(self.dry_run))
            .collect()
    }
}

/// Removes exactly what interlock added to this node, in an order that never leaves a
/// config naming a plugin that is gone:
///
/// 1. the conf dir: owned config files, interlock's entries in foreign configs, wrapped
///    `.conf`s restored byte for byte ([`guard::plan::plan_uninstall_explained`]);
/// 2. the `interlock-cni` binary in each bin dir — unless a config file in the conf dir
///    still names it afterwards (a runtime loading that file could start no pod), or the
///    node runs CRI-O and pods set up through it still have attachment records (CRI-O
///    tears a pod down with the config it was set up with, so their DEL needs it); the
///    report says which, and `force` removes it anyway;
/// 3. the state dir: the readiness marker, the agent socket (when nothing listens), the
///    plugin's backend cache, and the `attachments/` and `netns/` directories when they
///    are empty. Records of pods still running stay (see [`UninstallStep::Keep`]'s
///    reasons), and so does anything else found there.
///
/// Every step is attempted; failures are [`UninstallStep::Failed`] steps. With
/// `dry_run` nothing is changed: the conf dir's outcome is computed in memory.
pub fn uninstall_node(
    conf_dir: &Path,
    bin_dirs: &[PathBuf],
    state_dir: &Path,
    opts: &UninstallOptions,
) -> UninstallReport {
    let mut r = UninstallReport {
        dry_run: opts.dry_run,
        ..UninstallReport::default()
    };
    let naming = uninstall_conf_dir(conf_dir, opts.dry_run, &mut r);
    let runtime = opts.runtime.or_else(|| {
        guard::marker::read(state_dir)
            .ok()
            .and_then(|m| m.runtime?.parse().ok())
    });
    let attachments = state_dir.join(interlock_contract::layout::ATTACHMENTS_DIR);
    let crio_pods = match runtime {
        Some(Runtime::Crio) => json_files(&attachments),
        _ => 0,
    };
    let mut blockers: Vec<(String, String)> = vec![];
    match &naming {
        Ok(files) if files.is_empty() => {}
        Ok(files) => {
            let one = files.len() == 1;
            let short = format!(
                "{} still {} interlock-cni as a plugin",
                files.join(", "),
                if one { "names" } else { "name" }
            );
            let long = format!(
                "{short}: a runtime that loads {} could start no pod without this binary. Remove \
                 the interlock-cni entry from {} (or the file itself) and run interlock uninstall \
                 again",
                if one { "it" } else { "one of them" },
                if one { "that file" } else { "those files" }
            );
            blockers.push((short, long));
        }
        Err(e) => blockers.push((
            format!(
                "whether a config in {} names it is unknown",
                conf_dir.display()
            ),
            format!(
                "whether a config in {} still names interlock-cni is unknown ({e})",
                conf_dir.display()
            ),
        )),
    }
    if crio_pods > 0 {
        let short = format!(
            "{crio_pods} pod attachment(s) recorded in {} were set up through it on CRI-O",
            attachments.display()
        );
        let long = format!(
            "{short}, which tears a pod down with the config it was set up with: without the \
             binary their DEL fails, and with it the primary plugin's teardown (their IP \
             addresses leak). Run `interlock uninstall --runtime crio` again once those pods \
             are gone (drain the node)"
        );
        blockers.push((short, long));
    }
    for b in bin_dirs {
        let p = b.join(guard::install::PLUGIN_FILE);
        match std::fs::symlink_metadata(&p) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                r.steps.push(UninstallStep::Failed {
                    doing: format!("inspecting {}", p.display()),
                    error: e.to_string(),
                });
                continue;
            }
        }
        if blockers.is_empty() {
            let why = format!(
                "the plugin binary; no config in {} names it any more",
                conf_dir.display()
            );
            remove_path(&mut r, &p, why, false);
        } else if opts.force {
            let shorts: Vec<&str> = blockers.iter().map(|(s, _)| s.as_str()).collect();
            let why = format!(
                "the plugin binary, removed on --force although {}",
                shorts.join(", and ")
            );
            remove_path(&mut r, &p, why, false);
        } else {
            let longs: Vec<&str> = blockers.iter().map(|(_, l)| l.as_str()).collect();
            let why = format!("{}; or pass --force", longs.join(". Also, "));
            r.incomplete.push(format!("{} stays: {why}", p.display()));
            r.steps.push(UninstallStep::Keep {
                what: p.display().to_string(),
                why,
            });
        }
    }
    uninstall_state_dir(state_dir, opts, &mut r);
    r
}

/// The conf dir's part of [`uninstall_node`]: returns the config files (`<name> in
/// <dir>`) that still name interlock-cni afterwards (in a dry run: would), or why that
/// is unknown.
fn uninstall_conf_dir(
    conf_dir: &Path,
    dry_run: bool,
    r: &mut UninstallReport,
) -> Result<Vec<String>, String> {
    use interlock_contract::shown::shown;
    let at = |name: &str| format!("{} in {}", shown(name), conf_dir.display());
    let snap = match guard::snapshot(conf_dir) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => {
            r.steps.push(UninstallStep::Failed {
                doing: format!("reading {}", conf_dir.display()),
                error: e.to_string(),
            });
            return Err(e.to_string());
        }
    };
    let up = guard::plan::plan_uninstall_explained(&snap);
    for n in &up.notes {
        // Notes say `kept <name>: <why>`.
        let step = match n.strip_prefix("kept ").and_then(|k| k.split_once(": ")) {
            Some((name, why)) => UninstallStep::Keep {
                what: format!("{name} in {}", conf_dir.display()),
                why: why.to_string(),
            },
            None => UninstallStep::Keep {
                what: conf_dir.display().to_string(),
                why: n.clone(),
            },
        };
        r.steps.push(step);
    }
    for a in &up.actions {
        let step = match a {
            guard::plan::Action::Write { name, .. } => UninstallStep::Rewrite { what: at(name) },
            guard::plan::Action::Rename { from, to } => UninstallStep::Restore {
                from: shown(from),
                to: at(to),
            },
            guard::plan::Action::Remove { name } => UninstallStep::Remove {
                what: at(name),
                why: match name.strip_suffix(guard::plan::BACKUP_SUFFIX) {
                    Some(orig) => format!(
                        "interlock's backup of {}, which the primary has written again since",
                        shown(orig)
                    ),
                    None if guard::plan::is_owned_name(name) => "interlock's own config".into(),
                    None => "interlock's .conflist wrapping the original restored above".into(),
                },
            },
        };
        if dry_run {
            r.steps.push(step);
            continue;
        }
        match guard::apply(conf_dir, a) {
            Ok(()) => r.steps.push(step),
            Err(e) => r.steps.push(UninstallStep::Failed {
                doing: step.planned(),
                error: e.to_string(),
            }),
        }
    }
    let after = if dry_run {
        simulate(&snap, &up.actions)
    } else {
        guard::snapshot(conf_dir).map_err(|e| e.to_string())?
    };
    let mut naming = vec![];
    for e in after.entries.iter().filter(|e| e.is_config()) {
        match &e.content {
            Some(bytes) if names_plugin(bytes) => naming.push(at(&e.shown())),
            Some(_) => {}
            None => r.steps.push(UninstallStep::Keep {
                what: at(&e.shown()),
                why: format!(
                    "not interlock's, and cannot be read ({}), so whether it names interlock-cni \
                     is unknown",
                    e.unreadable.as_deref().unwrap_or("not read")
                ),
            }),
        }
    }
    Ok(naming)
}

/// `snap` after `actions`, computed in memory (the dry run's conf dir).
fn simulate(
    snap: &interlock_confdir::Snapshot,
    actions: &[guard::plan::Action],
) -> interlock_confdir::Snapshot {
    use std::ffi::OsStr;
    let mut s = snap.clone();
    let at = |s: &interlock_confdir::Snapshot, name: &str| {
        s.entries
            .iter()
            .position(|e| e.os_name.as_os_str() == OsStr::new(name))
    };
    for a in actions {
        match a {
            guard::plan::Action::Write { name, bytes, mode } => {
                s.entries
                    .retain(|e| e.os_name.as_os_str() != OsStr::new(name));
                s.entries
                    .push(interlock_confdir::DirEntry::file(name, bytes, *mode));
            }
            guard::plan::Action::Remove { name } => {
                s.entries
                    .retain(|e| e.os_name.as_os_str() != OsStr::new(name));
            }
            guard::plan::Action::Rename { from, to } => {
                if let Some(i) = at(&s, from) {
                    let mut e = s.entries.remove(i);
                    s.entries
                        .retain(|x| x.os_name.as_os_str() != OsStr::new(to));
                    e.name = to.clone();
                    e.os_name = to.into();
                    s.entries.push(e);
                }
            }
        }
    }
    s
}

/// True when a config's bytes name interlock-cni as a plugin anywhere: in `plugins`, as
/// a single `.conf`'s own type, or inside a meta plugin's delegates (any object whose
/// `type` is interlock-cni). Bytes that are not JSON here are judged by the words, as a
/// runtime's parser might still read them.
fn names_plugin(bytes: &[u8]) -> bool {
    let Ok(v) = serde_json::from_slice::<Value>(bytes) else {
        return bytes
            .windows(guard::plan::PLUGIN_TYPE.len())
            .any(|w| w == guard::plan::PLUGIN_TYPE.as_bytes());
    };
    let mut stack = vec![&v];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(m) => {
                if m.get("type").and_then(Value::as_str) == Some(guard::plan::PLUGIN_TYPE) {
                    return true;
                }
                stack.extend(m.values());
            }
            Value::Array(a) => stack.extend(a.iter()),
            _ => {}
        }
    }
    false
}

/// How many `*.json` files `dir` holds (0 when it cannot be read).
fn json_files(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |rd| {
        rd.flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
            .count()
    })
}

/// Removes `path` (a directory with `dir`: only when empty) unless this is a dry run,
/// and records the step; true when it is (or would be) gone.
fn remove_path(r: &mut UninstallReport, path: &Path, why: String, dir: bool) -> bool {
    if !r.dry_run {
        let res = if dir {
            std::fs::remove_dir(path)
        } else {
            std::fs::remove_file(path)
        };
        match res {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                r.steps.push(UninstallStep::Failed {
                    doing: format!("removing {}", path.display()),
                    error: e.to_string(),
                });
                return false;
            }
        }
    }
    r.steps.push(UninstallStep::Remove {
        what: path.display().to_string(),
        why,
    });
    true
}

/// The state dir's part of [`uninstall_node`].
fn uninstall_state_dir(state_dir: &Path, opts: &UninstallOptions, r: &mut UninstallReport) {
    use interlock_contract::layout::{
        AGENT_SOCKET_FILE, ATTACHMENTS_DIR, BACKEND_CACHE_FILE, GUARD_ENTRY_FILE, MARKER_FILE,
        NETNS_DIR,
    };
    use std::os::unix::fs::FileTypeExt;
    let mut names: Vec<std::ffi::OsString> = match std::fs::read_dir(state_dir) {
        Ok(rd) => rd.flatten().map(|e| e.file_name()).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(e) => {
            r.steps.push(UninstallStep::Failed {
                doing: format!("reading {}", state_dir.display()),
                error: e.to_string(),
            });
            return;
        }
    };
    names.sort();
    let leftover = "Small files (under /var/run, a tmpfs, by default: gone at reboot); delete \
                    them by hand once no pod started before the uninstall runs";
    for name in names {
        let path = state_dir.join(&name);
        let Some(n) = name.to_str() else {
            r.steps.push(UninstallStep::Keep {
                what: path.display().to_string(),
                why: "not a file interlock writes; left alone".into(),
            });
            continue;
        };
        match n {
            MARKER_FILE => {
                remove_path(r, &path, "the agent's readiness marker".into(), false);
            }
            AGENT_SOCKET_FILE => {
                let socket =
                    std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_socket());
                if !socket {
                    r.steps.push(UninstallStep::Keep {
                        what: path.display().to_string(),
                        why: "not a socket, so not the agent's; left alone".into(),
                    });
                } else if !opts.own_socket && std::os::unix::net::UnixStream::connect(&path).is_ok()
                {
                    r.steps.push(UninstallStep::Keep {
                        what: path.display().to_string(),
                        why:
                            "an agent still listens on it; run uninstall again once it has stopped"
                                .into(),
                    });
                } else {
                    remove_path(
                        r,
                        &path,
                        "the agent's socket; nothing listens on it any more".into(),
                        false,
                    );
                }
            }
            GUARD_ENTRY_FILE => {
                remove_path(
                    r,
                    &path,
                    "guard mode's copy of the mesh plugin's entry; a new agent learns it again \
                     from the conf dir"
                        .into(),
                    false,
                );
            }
            BACKEND_CACHE_FILE => {
                remove_path(
                    r,
                    &path,
                    "the plugin's cached detection of the host's netfilter backend; an ADD that \
                     still runs detects again"
                        .into(),
                    false,
                );
            }
            ATTACHMENTS_DIR | NETNS_DIR => {
                let entries = std::fs::read_dir(&path).map(|rd| rd.flatten().count());
                match entries {
                    Ok(0) => {
                        remove_path(r, &path, "empty: no pod's records".into(), true);
                    }
                    Ok(_) => {
                        let records = json_files(&path);
                        let why = if n == ATTACHMENTS_DIR {
                            format!(
                                "{records} record(s) of pods attached while interlock was \
                                 installed. Under CRI-O, which tears a pod down with the config \
                                 it was set up with, interlock-cni's DEL still runs for them and \
                                 reads these to remove exactly its rules; under containerd, DEL \
                                 runs the config loaded now, without interlock-cni, so the rules \
                                 go with the pod's network namespace and these are left over. \
                                 {leftover}"
                            )
                        } else {
                            format!(
                                "{records} record(s) of protected pod network namespaces, with \
                                 their locks: interlock-cni's DEL uses them to keep the rules \
                                 another attachment of the same namespace still relies on. \
                                 {leftover}"
                            )
                        };
                        r.steps.push(UninstallStep::Keep {
                            what: path.display().to_string(),
                            why,
                        });
                    }
                    Err(e) => r.steps.push(UninstallStep::Failed {
                        doing: format!("reading {}", path.display()),
                        error: e.to_string(),
                    }),
                }
            }
            _ if guard::is_stale_temp(n) => {
                remove_path(
                    r,
                    &path,
                    "a temporary file left by an interrupted write".into(),
                    false,
                );
            }
            _ => r.steps.push(UninstallStep::Keep {
                what: path.display().to_string(),
                why: "not a file interlock writes; left alone".into(),
            }),
        }
    }
}

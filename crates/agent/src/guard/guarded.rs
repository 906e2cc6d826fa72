//! Guard mode's part of the guard's thin layer: learns T from each snapshot
//! ([`crate::guard::learn`]), keeps it in the state dir, checks that T can run (its
//! binary, the files it needs at ADD) and publishes the state
//! ([`crate::guard::plan::GuardState`]) and the mesh installer's writes.
//!
//! Kuma's installer must also be running for kuma-cni's ADD to work (it takes over the
//! stderr of the one process named `/install-cni`). In this version "running" is judged
//! from what it leaves on disk only: its binary and its kubeconfig, both of which its
//! cleanup removes. An installer killed without cleanup (SIGKILL, OOM) is not seen until
//! its files go; no process check is made (the agent has no hostPID).

use crate::guard::learn::{self, FileView, Learner, Learning, Learnt};
use crate::guard::plan::{self, GuardInput, GuardState};
use crate::health::shared::Shared;
use interlock_confdir::Snapshot;
use interlock_contract::atomic::write_file_atomic;
use interlock_contract::guard::GuardedMesh;
use interlock_contract::layout::GUARD_ENTRY_FILE;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tracing::{info, warn};

/// The largest `guard-entry.json` read back at start.
const MAX_ENTRY_BYTES: u64 = 1 << 20;

/// Guard mode's state between reconciles.
#[derive(Debug)]
pub struct Guarded {
    /// The guarded mesh.
    pub mesh: GuardedMesh,
    learner: Learner,
    state_dir: PathBuf,
    /// Paths T's entry names are looked up under this root (`/` on the host; the
    /// host's root mount in a container).
    host_root: PathBuf,
    /// The conf dir as the agent sees it: a file T names in the host's conf dir (every
    /// kubeconfig but istio-cni's) is found there, wherever the host's root is.
    conf_dir: PathBuf,
    /// The guard file's name and content as last seen or written.
    seen: Option<(String, Vec<u8>)>,
    /// The state the last plan put the config in.
    pub state: Option<GuardState>,
    /// The guard file of the last plan.
    pub guard_file: Option<String>,
    /// In the hold the last plan put the config in, the installer put T back after the
    /// guard left it out ([`GuardInput::installer_put_t_back`]).
    t_put_back: bool,
}

impl Guarded {
    /// Guard mode for `mesh`, with the T the last run kept in `state_dir` (if any).
    pub fn new(mesh: GuardedMesh, state_dir: &Path, host_root: &Path, conf_dir: &Path) -> Guarded {
        let persisted = load(state_dir, mesh);
        if persisted.is_some() {
            info!(
                "guard mode ({mesh}): {} entry from {} kept from the last run",
                mesh.plugin_type(),
                state_dir.join(GUARD_ENTRY_FILE).display()
            );
        }
        Guarded {
            mesh,
            learner: Learner::new(mesh, persisted),
            state_dir: state_dir.to_path_buf(),
            host_root: host_root.to_path_buf(),
            conf_dir: conf_dir.to_path_buf(),
            seen: None,
            state: None,
            guard_file: None,
            t_put_back: false,
        }
    }

    /// T as learnt.
    pub fn learnt(&self) -> Option<&Learnt> {
        self.learner.current()
    }

    /// Learns from `snap`, persists a change, and counts the installer's writes to the
    /// guard file.
    pub fn learn(&mut self, snap: &Snapshot, shared: &Shared) {
        let cands = snap.candidates();
        let guard = cands
            .iter()
            .find(|c| plan::is_owned_name(c.name()) && c.entry.utf8_name());
        let view = |c: &interlock_confdir::Candidate<'_>| -> (String, Option<serde_json::Map<String, serde_json::Value>>) {
            (
                c.name().to_string(),
                c.parsed().as_ref().ok().map(|p| p.list.raw().clone()),
            )
        };
        let g = guard.map(view);
        let foreign: Vec<_> = cands
            .iter()
            .filter(|c| !plan::is_owned_name(c.name()))
            .map(view)
            .collect();
        if let Some(c) = guard {
            let now = c.entry.content.clone().unwrap_or_default();
            let changed = self
                .seen
                .as_ref()
                .is_some_and(|(n, b)| n == c.name() && *b != now);
            let ours_still = g
                .as_ref()
                .and_then(|(_, l)| l.as_ref())
                .is_some_and(|l| plan::entry_of_type(l, plan::PLUGIN_TYPE).is_some());
            if changed && ours_still {
                shared.mesh_wrote(c.name());
                info!(
                    "{} in the conf dir was changed by another writer that kept interlock-cni \
                     (the {} CNI installer converging)",
                    c.name(),
                    self.mesh
                );
            }
            self.seen = Some((c.name().to_string(), now));
        }
        let mesh = self.mesh;
        let (root, conf) = (self.host_root.clone(), self.conf_dir.clone());
        let deps = move |t: &serde_json::Map<String, serde_json::Value>| {
            learn::dependency_paths(mesh, t).is_ok_and(|d| missing(&root, &conf, &d).is_none())
        };
        let gv = g.as_ref().map(|(n, l)| FileView {
            name: n,
            list: l.as_ref(),
        });
        let fv: Vec<FileView> = foreign
            .iter()
            .map(|(n, l)| FileView {
                name: n,
                list: l.as_ref(),
            })
            .collect();
        match self.learner.observe(gv, &fv, &deps) {
            Learning::Unchanged => {}
            Learning::Adopted(from) => {
                info!(
                    "guard mode: learnt the {} entry from {from}",
                    mesh.plugin_type()
                );
                self.persist();
            }
            Learning::Forgotten(_) => {
                warn!(
                    "guard mode: {}",
                    self.learner.forgotten().unwrap_or_default()
                );
                self.persist();
            }
        }
    }

    /// Writes T to the state dir (atomically), or removes it once forgotten, so that a
    /// restarted agent guards from its first reconcile.
    fn persist(&self) {
        let path = self.state_dir.join(GUARD_ENTRY_FILE);
        let done = match self.learner.current() {
            Some(l) => serde_json::to_vec_pretty(l)
                .map_err(std::io::Error::other)
                .and_then(|b| write_file_atomic(&path, &b, Some(0o644))),
            None => match std::fs::remove_file(&path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                other => other,
            },
        };
        if let Err(e) = done {
            // The guard goes on with T in memory; only a restart would start without it.
            warn!("cannot update {}: {e}", path.display());
        }
    }

    /// What the planner gets: T as learnt and why it cannot run, if it cannot
    /// (`t_binary`: where its binary was found; `bin_dirs`: where it was looked for).
    pub fn input(&self, t_binary: Option<&Path>, bin_dirs: &[PathBuf]) -> GuardInput {
        let t_type = self.mesh.plugin_type();
        let learned = self.learner.current().map(|l| l.entry.clone());
        let unusable = match &learned {
            None => self.learner.forgotten().map(str::to_string),
            Some(_) if t_binary.is_none() => Some(format!(
                "{t_type} binary missing from {} (installer restarting?)",
                bin_dirs
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            Some(t) => match learn::dependency_paths(self.mesh, t) {
                Err(e) => Some(e),
                Ok(d) => missing(&self.host_root, &self.conf_dir, &d).map(|p| {
                    format!(
                        "{t_type} needs {} at every ADD, which is missing (installer \
                         restarting?)",
                        p.display()
                    )
                }),
            },
        };
        GuardInput {
            mesh: self.mesh,
            learned,
            unusable,
            installer_put_t_back: self.t_put_back,
        }
    }

    /// Notes, before a plan, whether the installer put T back into the guard file during
    /// a hold: interlock's last write there (`left`) had no T and the file has one now.
    /// Sticky until the hold ends, so that a later write of the guard file keeps it.
    pub fn note_put_back(&mut self, snap: &Snapshot, left: &HashMap<String, Option<Vec<u8>>>) {
        if !matches!(self.state, Some(GuardState::Hold { .. })) {
            self.t_put_back = false;
            return;
        }
        let Some(name) = &self.guard_file else {
            return;
        };
        let t_type = self.mesh.plugin_type();
        if !self.t_put_back && plan::t_put_back(snap, name, left, t_type) {
            info!(
                "guard mode: the {} installer put {t_type} back into {name} while meshed pods \
                 are held; keeping it there after interlock-cni (an unmeshed pod fails at \
                 {t_type} until it can run, as without interlock)",
                self.mesh
            );
            self.t_put_back = true;
        }
    }

    /// Records the state a plan put the config in (logged when it changes) and the guard
    /// file it names.
    pub fn planned(&mut self, state: GuardState, guard_file: Option<String>, shared: &Shared) {
        if self.state.as_ref() != Some(&state) {
            match &state {
                GuardState::Guard => info!(
                    "guard mode: {} runs after interlock-cni in {}",
                    self.mesh.plugin_type(),
                    guard_file.as_deref().unwrap_or("?")
                ),
                GuardState::Hold { reason } => warn!("guard mode: hold: {reason}"),
                GuardState::NoPrimary { reason } => info!("guard mode: no primary: {reason}"),
            }
        }
        shared.set_guard_state(state.as_str());
        if !matches!(state, GuardState::Hold { .. }) {
            self.t_put_back = false;
        }
        self.state = Some(state);
        self.guard_file = guard_file;
    }

    /// Interlock wrote `bytes` to the guard file `name`.
    pub fn wrote(&mut self, name: &str, bytes: &[u8]) {
        let with_t = serde_json::from_slice::<serde_json::Value>(bytes)
            .ok()
            .and_then(|v| v.as_object().cloned())
            .is_some_and(|l| plan::entry_of_type(&l, self.mesh.plugin_type()).is_some());
        self.learner.wrote_guard_file(with_t);
        self.seen = Some((name.to_string(), bytes.to_vec()));
    }
}

/// `path` (absolute, as on the host) under `root`.
fn under(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

/// Where the agent sees `path` (absolute, as on the host): in the conf dir when `path`
/// names a file in a directory the conf dir is a mount of (`/etc/cni/net.d/x` with the
/// conf dir at `/host/etc/cni/net.d`), else under `root`.
fn seen_at(root: &Path, conf_dir: &Path, path: &Path) -> PathBuf {
    let in_conf = path
        .parent()
        .and_then(|p| p.strip_prefix("/").ok())
        .filter(|p| !p.as_os_str().is_empty() && conf_dir.ends_with(p));
    match (in_conf, path.file_name()) {
        (Some(_), Some(name)) => conf_dir.join(name),
        _ => under(root, path),
    }
}

/// The first dependency that is not a regular file (following links, as the plugin's
/// open does), if any.
fn missing(root: &Path, conf_dir: &Path, deps: &[learn::Dependency]) -> Option<PathBuf> {
    deps.iter()
        .find(|d| {
            let p = seen_at(root, conf_dir, &d.path);
            if std::fs::metadata(&p).is_ok_and(|m| m.is_file()) {
                return false;
            }
            if !d.prefix_fallback {
                return true;
            }
            // consul-cni's fallback: the newest `<name>-*` beside it.
            let (Some(dir), Some(name)) = (p.parent(), p.file_name()) else {
                return true;
            };
            let prefix = format!("{}-", name.to_string_lossy());
            !std::fs::read_dir(dir).is_ok_and(|rd| {
                rd.flatten().any(|e| {
                    e.file_name().to_string_lossy().starts_with(&prefix)
                        && std::fs::metadata(e.path()).is_ok_and(|m| m.is_file())
                })
            })
        })
        .map(|d| d.path.clone())
}

/// T as the last run kept it, if it is there, readable and for `mesh`.
fn load(state_dir: &Path, mesh: GuardedMesh) -> Option<Learnt> {
    let path = state_dir.join(GUARD_ENTRY_FILE);
    let bytes = match interlock_contract::bounded::read_regular(&path, MAX_ENTRY_BYTES) {
        Ok(b) => b,
        Err(e) if e.is_not_found() => return None,
        Err(e) => {
            warn!(
                "cannot read {}: {e}; learning the entry again",
                path.display()
            );
            return None;
        }
    };
    match serde_json::from_slice::<Learnt>(&bytes) {
        Ok(l) if l.mesh == mesh => Some(Learnt {
            source: learn::PERSISTED.to_string(),
            ..l
        }),
        Ok(l) => {
            warn!(
                "{} holds an entry for {}, not {mesh}: ignored",
                path.display(),
                l.mesh
            );
            None
        }
        Err(e) => {
            warn!(
                "{} is not a guard entry ({e}): ignored, learning the entry again",
                path.display()
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dependencies_are_regular_files_under_the_root_with_consuls_fallback() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        std::fs::create_dir_all(root.join("n")).unwrap();
        let dep = |p: &str, f| learn::Dependency {
            path: p.into(),
            prefix_fallback: f,
        };
        let conf = Path::new("/nowhere/etc/cni/net.d");
        assert_eq!(
            missing(root, conf, &[dep("/n/k", false)]),
            Some(PathBuf::from("/n/k"))
        );
        std::fs::create_dir(root.join("n/k")).unwrap();
        assert!(
            missing(root, conf, &[dep("/n/k", false)]).is_some(),
            "a dir is no kubeconfig"
        );
        std::fs::write(root.join("n/c-1"), "x").unwrap();
        assert!(missing(root, conf, &[dep("/n/c", false)]).is_some());
        assert_eq!(missing(root, conf, &[dep("/n/c", true)]), None);
        std::fs::write(root.join("n/j"), "x").unwrap();
        assert_eq!(missing(root, conf, &[dep("/n/j", false)]), None);
        // The host's conf dir mounted elsewhere (the DaemonSet's /host/etc/cni/net.d):
        // a kubeconfig the entry names in /etc/cni/net.d is found in the mount.
        let mounted = root.join("host/etc/cni/net.d");
        std::fs::create_dir_all(&mounted).unwrap();
        std::fs::write(mounted.join("ZZZ-linkerd-cni-kubeconfig"), "x").unwrap();
        let l = dep("/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig", false);
        assert_eq!(
            missing(Path::new("/nowhere"), &mounted, std::slice::from_ref(&l)),
            None
        );
        assert!(missing(Path::new("/nowhere"), conf, &[l]).is_some());
    }

    #[test]
    fn the_entry_survives_a_restart_in_key_order() {
        let d = tempfile::tempdir().unwrap();
        let entry: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(r#"{"type":"consul-cni","z":1,"a":{"y":2,"b":3}}"#).unwrap();
        let mut l = Learner::new(GuardedMesh::Consul, None);
        let list: serde_json::Map<String, serde_json::Value> = serde_json::from_value(
            serde_json::json!({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "calico"}, entry]}),
        )
        .unwrap();
        l.observe(
            None,
            &[FileView {
                name: "10-calico.conflist",
                list: Some(&list),
            }],
            &|_| true,
        );
        let g = Guarded {
            mesh: GuardedMesh::Consul,
            learner: l,
            state_dir: d.path().into(),
            host_root: "/".into(),
            conf_dir: "/etc/cni/net.d".into(),
            seen: None,
            state: None,
            guard_file: None,
            t_put_back: false,
        };
        g.persist();
        let back = load(d.path(), GuardedMesh::Consul).unwrap();
        assert_eq!(
            serde_json::to_string(&back.entry).unwrap(),
            r#"{"type":"consul-cni","z":1,"a":{"y":2,"b":3}}"#
        );
        assert!(load(d.path(), GuardedMesh::Istio).is_none());
        std::fs::write(d.path().join(GUARD_ENTRY_FILE), "{").unwrap();
        assert!(load(d.path(), GuardedMesh::Consul).is_none());
    }
}

//! Guard mode: learning the guarded mesh's plugin entry, T, from the conf dir (pure).
//!
//! T is what the mesh's installer wrote, copied **verbatim** (key order and all; the
//! workspace's serde_json keeps it) and never edited: consul-k8s compares its entry field
//! by field with its own config and rewrites the file on any difference.
//!
//! Sources, in order:
//! 1. T in the guard file (an installer targeting the first file put it there);
//! 2. T in the foreign files, the first one first, then the others by name (Kuma's named
//!    file, Istio's sticky target chosen before interlock, Linkerd's every file).
//!
//! The newest observation wins: a T that changed in a file since the last look is
//! adopted. At start, with nothing to go by, a T persisted by the last run
//! ([`interlock_contract::layout::GUARD_ENTRY_FILE`]) is kept; without one, the first T
//! whose dependency files exist (Consul leaves a stale T, naming a kubeconfig that is
//! gone, in a file it chose at an earlier start).
//!
//! Only the mesh's installer removes T from the guard file (the primary writes its own
//! file). So T vanishing from the guard file while `interlock-cni` stays there means the
//! installer removed it (its SIGTERM cleanup: uninstall or upgrade): T is forgotten and
//! not put back until an installer writes it again ([`Learner::observe`]).

use crate::guard::plan::entry_of_type;
use interlock_contract::guard::GuardedMesh;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// A learnt T and where it was seen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Learnt {
    /// The mesh it belongs to.
    pub mesh: GuardedMesh,
    /// The entry, verbatim.
    pub entry: Map<String, Value>,
    /// The file it was learnt from (or [`PERSISTED`]).
    pub source: String,
}

/// The source of a T read back from the state dir at start.
pub const PERSISTED: &str = "guard-entry.json (the agent's last run)";

/// One config file as the learner sees it.
#[derive(Debug, Clone, Copy)]
pub struct FileView<'a> {
    /// File name in the conf dir.
    pub name: &'a str,
    /// Its list (parsed), `None` when it does not parse.
    pub list: Option<&'a Map<String, Value>>,
}

impl<'a> FileView<'a> {
    fn t(&self, mesh: GuardedMesh) -> Option<&'a Map<String, Value>> {
        entry_of_type(self.list?, mesh.plugin_type())
    }

    fn runs_interlock(&self) -> bool {
        self.list
            .is_some_and(|l| entry_of_type(l, crate::guard::plan::PLUGIN_TYPE).is_some())
    }
}

/// What one observation changed.
#[derive(Debug, Clone, PartialEq)]
pub enum Learning {
    /// Nothing.
    Unchanged,
    /// T was (re)learnt from this file.
    Adopted(String),
    /// T vanished from the guard file: its installer removed it. Forgotten.
    Forgotten(String),
}

/// The learner's memory between reconciles.
#[derive(Debug, Clone)]
pub struct Learner {
    mesh: GuardedMesh,
    /// T as learnt.
    current: Option<Learnt>,
    /// T as last seen in each foreign file (`None`: the file had none).
    seen: HashMap<String, Option<Map<String, Value>>>,
    /// Whether the guard file held T at the last look (or after interlock's last write).
    guard_had_t: bool,
    /// At least one observation was made (before it, nothing is "new").
    primed: bool,
    /// Why T was forgotten, until it is learnt again.
    forgotten: Option<String>,
}

impl Learner {
    /// A learner for `mesh`, starting from what the last run persisted (if it is this
    /// mesh's).
    pub fn new(mesh: GuardedMesh, persisted: Option<Learnt>) -> Learner {
        Learner {
            mesh,
            current: persisted.filter(|p| p.mesh == mesh),
            seen: HashMap::new(),
            guard_had_t: false,
            primed: false,
            forgotten: None,
        }
    }

    /// T as learnt, if any.
    pub fn current(&self) -> Option<&Learnt> {
        self.current.as_ref()
    }

    /// Why T was forgotten (its installer removed it from the guard file), while it is.
    pub fn forgotten(&self) -> Option<&str> {
        self.forgotten.as_deref()
    }

    /// Interlock wrote the guard file: it holds T (`with_t`) or not. A T interlock
    /// itself left out (hold) is not an installer's removal.
    pub fn wrote_guard_file(&mut self, with_t: bool) {
        self.guard_had_t = with_t;
    }

    fn adopt(&mut self, entry: &Map<String, Value>, source: &str) -> Learning {
        self.current = Some(Learnt {
            mesh: self.mesh,
            entry: entry.clone(),
            source: source.to_string(),
        });
        self.forgotten = None;
        Learning::Adopted(source.to_string())
    }

    /// Learns from the conf dir as it is now: `guard_file` is interlock's own file (if
    /// there is one), `foreign` the other config files in the runtime's order.
    /// `deps_exist` says whether the files a T needs at ADD exist (see
    /// [`dependency_paths`]).
    pub fn observe(
        &mut self,
        guard_file: Option<FileView<'_>>,
        foreign: &[FileView<'_>],
        deps_exist: &dyn Fn(&Map<String, Value>) -> bool,
    ) -> Learning {
        let mesh = self.mesh;
        let mut out = Learning::Unchanged;
        let guard_t = guard_file.and_then(|g| g.t(mesh));
        if let Some(g) = guard_file {
            if self.guard_had_t && guard_t.is_none() && g.runs_interlock() {
                self.current = None;
                let why = format!(
                    "{} was removed from the guard file {} by the {mesh} CNI installer \
                     (uninstalled or restarting?): not put back until it writes it again",
                    mesh.plugin_type(),
                    g.name
                );
                self.forgotten = Some(why);
                out = Learning::Forgotten(g.name.to_string());
            }
        }
        if let (Some(g), Some(t)) = (guard_file, guard_t) {
            if self.current.as_ref().map(|c| &c.entry) != Some(t) {
                out = self.adopt(t, g.name);
            }
        }
        self.guard_had_t = guard_t.is_some();
        let mut fresh: Option<(&str, &Map<String, Value>)> = None;
        let mut first_any: Option<(&str, &Map<String, Value>)> = None;
        let mut first_ok: Option<(&str, &Map<String, Value>)> = None;
        for f in foreign {
            let t = f.t(mesh);
            let before = self.seen.insert(f.name.to_string(), t.cloned());
            let Some(t) = t else { continue };
            if first_any.is_none() {
                first_any = Some((f.name, t));
            }
            if first_ok.is_none() && deps_exist(t) {
                first_ok = Some((f.name, t));
            }
            let changed = before.as_ref().is_none_or(|b| b.as_ref() != Some(t));
            if self.primed && changed && fresh.is_none() && deps_exist(t) {
                fresh = Some((f.name, t));
            }
        }
        self.seen
            .retain(|n, _| foreign.iter().any(|f| f.name == n.as_str()));
        // A T the guard file carries was just written by the installer there; it wins
        // over the others.
        if guard_t.is_none() {
            let pick = if !self.primed && self.current.is_none() && self.forgotten.is_none() {
                first_ok.or(first_any)
            } else {
                fresh
            };
            if let Some((name, t)) = pick {
                if self.current.as_ref().map(|c| &c.entry) != Some(t) {
                    out = self.adopt(t, name);
                }
            }
        }
        self.primed = true;
        out
    }
}

/// A file T needs at ADD, as its entry names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dependency {
    /// The path on the host.
    pub path: PathBuf,
    /// consul-cni falls back to the newest `<path>-*` file when `path` is missing.
    pub prefix_fallback: bool,
}

/// The files T needs at ADD (its kubeconfig), from its entry; the agent checks they exist
/// as regular files and never reads them. `Err` when the entry does not say where.
///
/// - Istio: `<cni_agent_run_dir>/istio-cni-kubeconfig` (default run dir
///   `/var/run/istio-cni`), written outside the conf dir.
/// - Linkerd and Kuma: `kubernetes.kubeconfig`.
/// - Consul: `<cni_net_dir>/<kubeconfig>`, else the newest `<that>-*`.
pub fn dependency_paths(
    mesh: GuardedMesh,
    t: &Map<String, Value>,
) -> Result<Vec<Dependency>, String> {
    fn s(v: Option<&Value>) -> Option<&str> {
        v.and_then(Value::as_str).filter(|s| !s.is_empty())
    }
    let t_type = mesh.plugin_type();
    let plain = |p: PathBuf| {
        Ok(vec![Dependency {
            path: p,
            prefix_fallback: false,
        }])
    };
    match mesh {
        GuardedMesh::Istio => {
            let dir = s(t.get("cni_agent_run_dir")).unwrap_or("/var/run/istio-cni");
            plain(Path::new(dir).join("istio-cni-kubeconfig"))
        }
        GuardedMesh::Linkerd | GuardedMesh::Kuma => {
            match s(t.get("kubernetes").and_then(|k| k.get("kubeconfig"))) {
                Some(p) => plain(p.into()),
                None => Err(format!(
                    "the {t_type} entry names no kubernetes.kubeconfig, which {t_type} needs \
                     at every ADD"
                )),
            }
        }
        GuardedMesh::Consul => {
            let dir = s(t.get("cni_net_dir")).unwrap_or("/etc/cni/net.d");
            match s(t.get("kubeconfig")) {
                Some(k) => Ok(vec![Dependency {
                    path: Path::new(dir).join(k),
                    prefix_fallback: true,
                }]),
                None => Err(format!(
                    "the {t_type} entry names no kubeconfig, which {t_type} needs at every ADD"
                )),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    fn list(plugins: Value) -> Map<String, Value> {
        obj(json!({"cniVersion": "1.0.0", "name": "k8s-pod-network", "plugins": plugins}))
    }

    const ALL_DEPS: &dyn Fn(&Map<String, Value>) -> bool = &|_| true;

    fn g(l: &Map<String, Value>) -> FileView<'_> {
        FileView {
            name: "00-interlock.conflist",
            list: Some(l),
        }
    }

    #[test]
    fn learns_from_the_guard_file_first_verbatim() {
        // Keys in a non-sorted order: kept as they are.
        let t = json!({"type": "istio-cni", "zeta": 1, "alpha": 2});
        let g = list(json!([{"type": "calico"}, {"type": "interlock-cni"}, t.clone()]));
        let other = json!({"type": "istio-cni", "alpha": 9});
        let p = list(json!([{"type": "calico"}, other]));
        let mut l = Learner::new(GuardedMesh::Istio, None);
        let got = l.observe(
            Some(FileView {
                name: "00-interlock.conflist",
                list: Some(&g),
            }),
            &[FileView {
                name: "10-calico.conflist",
                list: Some(&p),
            }],
            ALL_DEPS,
        );
        assert_eq!(got, Learning::Adopted("00-interlock.conflist".into()));
        let c = l.current().unwrap();
        assert_eq!(Value::Object(c.entry.clone()), t);
        let keys: Vec<&String> = c.entry.keys().collect();
        assert_eq!(keys, ["type", "zeta", "alpha"]);
    }

    #[test]
    fn first_foreign_file_with_its_dependencies_at_start_then_newest_change() {
        let stale = json!({"type": "consul-cni", "kubeconfig": "ZZZ-old"});
        let live = json!({"type": "consul-cni", "kubeconfig": "ZZZ-new"});
        let a = list(json!([{"type": "calico"}, stale]));
        let b = list(json!([{"type": "calico"}, live.clone()]));
        let deps = |t: &Map<String, Value>| t["kubeconfig"] == "ZZZ-new";
        let mut l = Learner::new(GuardedMesh::Consul, None);
        let files = [
            FileView {
                name: "10-a.conflist",
                list: Some(&a),
            },
            FileView {
                name: "20-b.conflist",
                list: Some(&b),
            },
        ];
        assert_eq!(
            l.observe(None, &files, &deps),
            Learning::Adopted("20-b.conflist".into())
        );
        assert_eq!(Value::Object(l.current().unwrap().entry.clone()), live);
        // Nothing changed: nothing new, the stale T is not taken.
        assert_eq!(l.observe(None, &files, &deps), Learning::Unchanged);
        // The installer restarted and wrote a new T into the first file: newest wins.
        let newer = json!({"type": "consul-cni", "kubeconfig": "ZZZ-new", "x": 1});
        let a2 = list(json!([{"type": "calico"}, newer.clone()]));
        let files2 = [
            FileView {
                name: "10-a.conflist",
                list: Some(&a2),
            },
            files[1],
        ];
        assert_eq!(
            l.observe(None, &files2, &deps),
            Learning::Adopted("10-a.conflist".into())
        );
        assert_eq!(Value::Object(l.current().unwrap().entry.clone()), newer);
    }

    #[test]
    fn a_persisted_t_is_kept_at_start_over_older_foreign_ones() {
        let kept = obj(json!({"type": "kuma-cni", "kubernetes": {"kubeconfig": "/k"}}));
        let other = json!({"type": "kuma-cni", "kubernetes": {"kubeconfig": "/other"}});
        let p = list(json!([{"type": "flannel"}, other]));
        let mut l = Learner::new(
            GuardedMesh::Kuma,
            Some(Learnt {
                mesh: GuardedMesh::Kuma,
                entry: kept.clone(),
                source: PERSISTED.into(),
            }),
        );
        let f = [FileView {
            name: "10-flannel.conflist",
            list: Some(&p),
        }];
        assert_eq!(l.observe(None, &f, ALL_DEPS), Learning::Unchanged);
        assert_eq!(l.current().unwrap().entry, kept);
        // A persisted T of another mesh is ignored.
        let l2 = Learner::new(
            GuardedMesh::Istio,
            Some(Learnt {
                mesh: GuardedMesh::Kuma,
                entry: kept,
                source: PERSISTED.into(),
            }),
        );
        assert!(l2.current().is_none());
    }

    #[test]
    fn t_vanishing_from_the_guard_file_is_forgotten_and_not_relearnt_from_old_copies() {
        let t = json!({"type": "linkerd-cni", "kubernetes": {"kubeconfig": "/k"}});
        let with = list(json!([{"type": "calico"}, {"type": "interlock-cni"}, t.clone()]));
        let without = list(json!([{"type": "calico"}, {"type": "interlock-cni"}]));
        let primary = list(json!([{"type": "calico"}, t.clone()]));
        let mut l = Learner::new(GuardedMesh::Linkerd, None);
        let p = [FileView {
            name: "10-calico.conflist",
            list: Some(&primary),
        }];
        assert!(matches!(
            l.observe(Some(g(&with)), &p, ALL_DEPS),
            Learning::Adopted(_)
        ));
        // The installer's cleanup reverts the guard file first; the primary's copy is
        // still there for a moment: not re-learnt from it.
        assert_eq!(
            l.observe(Some(g(&without)), &p, ALL_DEPS),
            Learning::Forgotten("00-interlock.conflist".into())
        );
        assert!(l.current().is_none());
        assert!(l.forgotten().unwrap().contains("linkerd-cni was removed"));
        assert_eq!(
            l.observe(Some(g(&without)), &p, ALL_DEPS),
            Learning::Unchanged
        );
        assert!(l.current().is_none());
        // The installer is back and writes T everywhere: learnt again.
        assert!(matches!(
            l.observe(Some(g(&with)), &p, ALL_DEPS),
            Learning::Adopted(_)
        ));
        assert!(l.forgotten().is_none());
    }

    #[test]
    fn interlock_leaving_t_out_of_the_guard_file_is_no_removal() {
        let t = json!({"type": "istio-cni"});
        let with = list(json!([{"type": "interlock-cni"}, t]));
        let without = list(json!([{"type": "interlock-cni"}]));
        let mut l = Learner::new(GuardedMesh::Istio, None);
        l.observe(Some(g(&with)), &[], ALL_DEPS);
        l.wrote_guard_file(false);
        assert_eq!(
            l.observe(Some(g(&without)), &[], ALL_DEPS),
            Learning::Unchanged
        );
        assert!(l.current().is_some());
        // interlock-cni gone too: someone else's doing (a conflict), not the installer.
        let mut l = Learner::new(GuardedMesh::Istio, None);
        l.observe(Some(g(&with)), &[], ALL_DEPS);
        let bare = list(json!([{"type": "calico"}]));
        assert_eq!(
            l.observe(Some(g(&bare)), &[], ALL_DEPS),
            Learning::Unchanged
        );
        assert!(l.current().is_some());
    }

    #[test]
    fn dependency_paths_per_mesh() {
        let d = |m, v| dependency_paths(m, &obj(v)).unwrap();
        assert_eq!(
            d(GuardedMesh::Istio, json!({"type": "istio-cni"}))[0].path,
            Path::new("/var/run/istio-cni/istio-cni-kubeconfig")
        );
        assert_eq!(
            d(
                GuardedMesh::Istio,
                json!({"type": "istio-cni", "cni_agent_run_dir": "/run/x"})
            )[0]
            .path,
            Path::new("/run/x/istio-cni-kubeconfig")
        );
        assert_eq!(
            d(
                GuardedMesh::Linkerd,
                json!({"kubernetes": {"kubeconfig": "/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"}})
            )[0]
            .path,
            Path::new("/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig")
        );
        let c = d(
            GuardedMesh::Consul,
            json!({"cni_net_dir": "/n", "kubeconfig": "ZZZ-consul-cni-kubeconfig-1"}),
        );
        assert_eq!(c[0].path, Path::new("/n/ZZZ-consul-cni-kubeconfig-1"));
        assert!(c[0].prefix_fallback);
        let e = dependency_paths(GuardedMesh::Kuma, &obj(json!({"type": "kuma-cni"})));
        assert!(e.unwrap_err().contains("kubernetes.kubeconfig"));
    }
}

//! Guard mode's pure decisions (`plan_guard`, the learner, the guard conflicts) against
//! in-memory models of each mesh installer's file behaviour (research/guard-mode.md
//! A.1.2, A.2.2, A.3.2, A.4.2): the agent and the installer take turns on one conf dir
//! until neither writes, and the result must converge in a few writes, never loop, and
//! keep T last and verbatim.

use interlock_agent::guard::conflict::guard_conflicting_files;
use interlock_agent::guard::learn::{FileView, Learner};
use interlock_agent::guard::plan::{
    check_effective_guard, entry_of_type, is_owned_name, plan_guard, t_put_back, Action,
    ConfigMode, Facts, GuardInput, GuardState, Settings,
};
use interlock_agent::plugin_entry;
use interlock_confdir::{Binaries, Runtime, Snapshot};
use interlock_contract::guard::GuardedMesh;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

type Files = BTreeMap<String, String>;

const PRIMARY: &str = "10-calico.conflist";

fn calico() -> String {
    // Keys not in Go's sorted order, so that an installer's round trip reorders them.
    r#"{"name": "k8s-pod-network", "cniVersion": "1.0.0", "plugins": [
        {"type": "calico", "mtu": 1440, "ipam": {"type": "calico-ipam"}},
        {"type": "portmap", "snat": true, "capabilities": {"portMappings": true}}]}"#
        .to_string()
}

fn calico_v2() -> String {
    calico().replace("1440", "1450")
}

/// Each mesh's entry as its installer writes it, keys deliberately unsorted.
fn t_entry(mesh: GuardedMesh, generation: u32) -> Map<String, Value> {
    let v = match mesh {
        GuardedMesh::Istio => json!({"type": "istio-cni", "name": "istio-cni",
            "plugin_log_level": "info", "cni_agent_run_dir": "/var/run/istio-cni",
            "exclude_namespaces": ["kube-system"], "gen": generation}),
        GuardedMesh::Linkerd => json!({"type": "linkerd-cni", "name": "linkerd-cni",
            "log_level": "info",
            "kubernetes": {"kubeconfig": "/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"},
            "linkerd": {"incoming-proxy-port": 4143, "outgoing-proxy-port": 4140}, "gen": generation}),
        GuardedMesh::Consul => json!({"type": "consul-cni", "name": "consul-cni",
            "cni_net_dir": "/etc/cni/net.d",
            "kubeconfig": format!("ZZZ-consul-cni-kubeconfig-{generation}"), "log_level": "info"}),
        GuardedMesh::Kuma => json!({"type": "kuma-cni", "name": "kuma-cni", "log_level": "info",
            "kubernetes": {"kubeconfig": "/etc/cni/net.d/ZZZ-kuma-cni-kubeconfig",
                "exclude_namespaces": ["kube-system"]}, "gen": generation}),
    };
    v.as_object().cloned().unwrap()
}

/// What a Go installer writes: the whole file through a map (sorted keys), compact.
fn go_json(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let sorted: BTreeMap<&String, Value> = m.iter().map(|(k, v)| (k, go_json(v))).collect();
            Value::Object(sorted.into_iter().map(|(k, v)| (k.clone(), v)).collect())
        }
        Value::Array(a) => Value::Array(a.iter().map(go_json).collect()),
        other => other.clone(),
    }
}

fn parse(s: &str) -> Option<Map<String, Value>> {
    serde_json::from_str::<Value>(s).ok()?.as_object().cloned()
}

/// Removes T and appends `t` last, as all four installers do; returns the new text.
fn inject(content: &str, t: &Map<String, Value>) -> Option<String> {
    let mut list = parse(content)?;
    let ps = list.get_mut("plugins")?.as_array_mut()?;
    let ty = t["type"].as_str().unwrap();
    ps.retain(|p| p["type"] != ty);
    ps.push(Value::Object(t.clone()));
    Some(serde_json::to_string(&go_json(&Value::Object(list))).unwrap())
}

fn remove_t(content: &str, ty: &str) -> Option<String> {
    let mut list = parse(content)?;
    let ps = list.get_mut("plugins")?.as_array_mut()?;
    let before = ps.len();
    ps.retain(|p| p["type"] != ty);
    (ps.len() != before).then(|| serde_json::to_string(&go_json(&Value::Object(list))).unwrap())
}

fn has_t(content: &str, ty: &str) -> bool {
    parse(content).is_some_and(|l| entry_of_type(&l, ty).is_some())
}

/// The first file libcni would load (sorted names, a list with plugins).
fn first_valid(files: &Files) -> Option<String> {
    files
        .iter()
        .filter(|(n, _)| n.ends_with(".conflist"))
        .find(|(_, c)| parse(c).is_some_and(|l| l.get("plugins").is_some()))
        .map(|(n, _)| n.clone())
}

/// An installer model: reacts to the directory as it is; returns true when it wrote.
trait Installer {
    fn react(&mut self, files: &mut Files) -> bool;
    /// SIGTERM: removes its entry (from the files its cleanup covers) and its binary.
    fn cleanup(&mut self, files: &mut Files);
    fn binary(&self) -> bool;
}

/// istio-cni: first valid file at its start, sticky for the life of the process.
struct Istio {
    t: Map<String, Value>,
    target: Option<String>,
    up: bool,
}

impl Installer for Istio {
    fn react(&mut self, files: &mut Files) -> bool {
        if !self.up {
            return false;
        }
        if self.target.is_none() {
            self.target = first_valid(files);
        }
        let Some(tg) = self.target.clone() else {
            return false;
        };
        let Some(c) = files.get(&tg) else {
            return false; // waits for its file to come back
        };
        if has_t(c, "istio-cni") {
            return false;
        }
        let new = inject(c, &self.t).unwrap();
        files.insert(tg, new);
        true
    }
    fn cleanup(&mut self, files: &mut Files) {
        if let Some(tg) = self.target.take() {
            if let Some(new) = files.get(&tg).and_then(|c| remove_t(c, "istio-cni")) {
                files.insert(tg, new);
            }
        }
        self.up = false;
    }
    fn binary(&self) -> bool {
        self.up
    }
}

/// linkerd-cni: every file whose content differs from what it last wrote there.
struct Linkerd {
    t: Map<String, Value>,
    wrote: HashMap<String, String>,
    up: bool,
}

impl Installer for Linkerd {
    fn react(&mut self, files: &mut Files) -> bool {
        if !self.up {
            return false;
        }
        let mut any = false;
        let names: Vec<String> = files.keys().cloned().collect();
        for n in names {
            let c = files[&n].clone();
            if self.wrote.get(&n) == Some(&c) {
                continue;
            }
            if let Some(new) = inject(&c, &self.t) {
                self.wrote.insert(n.clone(), new.clone());
                if new != c {
                    files.insert(n, new);
                    any = true;
                }
            }
        }
        any
    }
    fn cleanup(&mut self, files: &mut Files) {
        let names: Vec<String> = files.keys().cloned().collect();
        for n in names {
            if let Some(new) = remove_t(&files[&n], "linkerd-cni") {
                files.insert(n, new);
            }
        }
        self.wrote.clear();
        self.up = false;
    }
    fn binary(&self) -> bool {
        self.up
    }
}

/// consul-cni: the first valid file on every event; its entry must be last and equal.
struct Consul {
    t: Map<String, Value>,
    start_file: Option<String>,
    up: bool,
}

impl Installer for Consul {
    fn react(&mut self, files: &mut Files) -> bool {
        if !self.up {
            return false;
        }
        let Some(tg) = first_valid(files) else {
            return false;
        };
        self.start_file.get_or_insert_with(|| tg.clone());
        let c = files[&tg].clone();
        let list = parse(&c).unwrap();
        let ps = list["plugins"].as_array().unwrap();
        if ps.last().and_then(Value::as_object) == Some(&self.t) {
            return false;
        }
        files.insert(tg, inject(&c, &self.t).unwrap());
        true
    }
    fn cleanup(&mut self, files: &mut Files) {
        if let Some(f) = self.start_file.take() {
            if let Some(new) = files.get(&f).and_then(|c| remove_t(c, "consul-cni")) {
                files.insert(f, new);
            }
        }
        self.up = false;
    }
    fn binary(&self) -> bool {
        self.up
    }
}

/// kuma-cni: one named file; exits (cleanup, binary gone) once its entry is missing.
struct Kuma {
    t: Map<String, Value>,
    file: String,
    up: bool,
}

impl Installer for Kuma {
    fn react(&mut self, files: &mut Files) -> bool {
        if !self.up {
            return false;
        }
        match files.get(&self.file) {
            Some(c) if has_t(c, "kuma-cni") => false,
            _ => {
                // Its 1 s check fails: cleanup and exit; the kubelet restarts it later.
                self.up = false;
                false
            }
        }
    }
    fn cleanup(&mut self, files: &mut Files) {
        if let Some(new) = files.get(&self.file).and_then(|c| remove_t(c, "kuma-cni")) {
            files.insert(self.file.clone(), new);
        }
        self.up = false;
    }
    fn binary(&self) -> bool {
        self.up
    }
}

impl Kuma {
    /// A (re)started installer: waits for its named file, appends its entry.
    fn start(&mut self, files: &mut Files) {
        self.up = true;
        if let Some(c) = files.get(&self.file).cloned() {
            if !has_t(&c, "kuma-cni") {
                files.insert(self.file.clone(), inject(&c, &self.t).unwrap());
            }
        }
    }
}

/// The agent's side: the learner and the plan, as the thin layer runs them.
struct Agent {
    mesh: GuardedMesh,
    learner: Learner,
    left: HashMap<String, Option<Vec<u8>>>,
    writes: usize,
    state: Option<GuardState>,
    target: Option<String>,
    /// Sticky for a hold, as `Guarded::note_put_back` keeps it.
    put_back: bool,
}

fn settings(mesh: GuardedMesh) -> Settings {
    Settings {
        mode: ConfigMode::Guard,
        chain_target: None,
        allow_ahead: vec![],
        runtime: Runtime::Containerd,
        entry: plugin_entry(Path::new("/var/run/interlock")),
        max_cni_version: None,
        guard: Some(GuardInput {
            mesh,
            learned: None,
            unusable: None,
            installer_put_t_back: false,
        }),
    }
}

fn all_versions() -> Vec<String> {
    ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

fn snapshot(files: &Files) -> Snapshot {
    let v: Vec<(&str, &str)> = files
        .iter()
        .map(|(n, c)| (n.as_str(), c.as_str()))
        .collect();
    Snapshot::from_files(&v, 0o644)
}

impl Agent {
    fn new(mesh: GuardedMesh) -> Agent {
        Agent {
            mesh,
            learner: Learner::new(mesh, None),
            left: HashMap::new(),
            writes: 0,
            state: None,
            target: None,
            put_back: false,
        }
    }

    fn facts(&self, t_binary: bool) -> Facts {
        let mut f = Facts::default();
        for t in ["calico", "portmap", "interlock-cni"] {
            f.present_types.insert(t.into());
            f.versions.insert(t.into(), all_versions());
        }
        if t_binary {
            let t = self.mesh.plugin_type();
            f.present_types.insert(t.into());
            f.versions.insert(t.into(), all_versions());
        }
        f
    }

    /// One reconcile; true when it wrote.
    fn reconcile(&mut self, files: &mut Files, t_binary: bool) -> bool {
        let snap = snapshot(files);
        let cands = snap.candidates();
        let lists: Vec<(String, Option<Map<String, Value>>)> = cands
            .iter()
            .map(|c| {
                (
                    c.name().to_string(),
                    c.parsed().as_ref().ok().map(|p| p.list.raw().clone()),
                )
            })
            .collect();
        let guard = lists
            .iter()
            .find(|(n, _)| is_owned_name(n))
            .map(|(n, l)| FileView {
                name: n,
                list: l.as_ref(),
            });
        let foreign: Vec<FileView> = lists
            .iter()
            .filter(|(n, _)| !is_owned_name(n))
            .map(|(n, l)| FileView {
                name: n,
                list: l.as_ref(),
            })
            .collect();
        self.learner.observe(guard, &foreign, &|_| true);
        match (&self.state, &self.target) {
            (Some(GuardState::Hold { .. }), Some(name)) => {
                self.put_back |= t_put_back(&snap, name, &self.left, self.mesh.plugin_type());
            }
            _ => self.put_back = false,
        }
        let mut s = settings(self.mesh);
        let learned = self.learner.current().map(|l| l.entry.clone());
        s.guard = Some(GuardInput {
            mesh: self.mesh,
            unusable: match (&learned, t_binary) {
                (None, _) => self.learner.forgotten().map(str::to_string),
                (Some(_), false) => Some(format!("{} binary missing", self.mesh.plugin_type())),
                (Some(_), true) => None,
            },
            learned,
            installer_put_t_back: self.put_back,
        });
        let facts = self.facts(t_binary);
        let (plan, state) = plan_guard(&snap, &s, &facts);
        let conflicts = guard_conflicting_files(&plan, &snap, &self.left, self.mesh.plugin_type());
        assert!(
            conflicts.is_empty(),
            "an installer's write counted as a conflict: {conflicts:?}"
        );
        if !matches!(state, GuardState::Hold { .. }) {
            self.put_back = false;
        }
        self.state = Some(state);
        self.target = plan.target.clone();
        let wrote = !plan.actions.is_empty();
        for a in &plan.actions {
            self.writes += 1;
            match a {
                Action::Write { name, bytes, .. } => {
                    let text = String::from_utf8(bytes.clone()).unwrap();
                    files.insert(name.clone(), text);
                    self.left.insert(name.clone(), Some(bytes.clone()));
                    if is_owned_name(name) {
                        self.learner
                            .wrote_guard_file(has_t(&files[name], self.mesh.plugin_type()));
                    }
                }
                Action::Remove { name } => {
                    files.remove(name);
                    self.left.insert(name.clone(), None);
                }
                Action::Rename { from, to } => {
                    let c = files.remove(from).unwrap();
                    files.insert(to.clone(), c);
                }
            }
        }
        wrote
    }

    /// The effective config's verdict (the readiness half the plan decides).
    fn verdict(&self, files: &Files) -> Result<String, String> {
        let present = |_: &str| true;
        let bins = Binaries {
            dirs: &[],
            present: &present,
            versions: None,
        };
        let mut s = settings(self.mesh);
        s.guard.as_mut().unwrap().learned = self.learner.current().map(|l| l.entry.clone());
        check_effective_guard(
            &snapshot(files),
            &s,
            &bins,
            &all_versions(),
            self.state.as_ref().unwrap(),
            self.target.as_deref(),
        )
    }
}

/// Agent and installer take turns until neither writes; returns (agent writes,
/// installer writes). Panics if that takes more than `max_rounds` (a loop).
fn settle(
    agent: &mut Agent,
    inst: &mut dyn Installer,
    files: &mut Files,
    max_rounds: usize,
) -> (usize, usize) {
    let before = agent.writes;
    let mut inst_writes = 0;
    for _ in 0..max_rounds {
        let a = agent.reconcile(files, inst.binary());
        let i = inst.react(files);
        inst_writes += usize::from(i);
        if !a && !i {
            // One more look: the agent must find nothing to do.
            assert!(
                !agent.reconcile(files, inst.binary()),
                "no fixed point: {files:#?}"
            );
            return (agent.writes - before, inst_writes);
        }
    }
    panic!("no convergence in {max_rounds} rounds (a loop): {files:#?}");
}

fn guard_file(files: &Files) -> (&String, Map<String, Value>) {
    let (n, c) = files
        .iter()
        .find(|(n, _)| is_owned_name(n))
        .expect("a guard file");
    (n, parse(c).unwrap())
}

/// The guard file runs calico, portmap, interlock-cni (guard role), then exactly `t`.
fn assert_guarding(files: &Files, t: &Map<String, Value>) {
    let (name, list) = guard_file(files);
    let ps = list["plugins"].as_array().unwrap();
    let types: Vec<&str> = ps.iter().map(|p| p["type"].as_str().unwrap()).collect();
    let ty = t["type"].as_str().unwrap();
    assert_eq!(
        types,
        ["calico", "portmap", "interlock-cni", ty],
        "{name}: {list:#?}"
    );
    assert_eq!(ps[3].as_object().unwrap(), t, "T changed");
    assert_eq!(ps[2]["guard"]["hold"], Value::Bool(false), "{list:#?}");
}

fn assert_holding(files: &Files, ty: &str) {
    let (_, list) = guard_file(files);
    let ps = list["plugins"].as_array().unwrap();
    assert!(
        ps.iter().all(|p| p["type"] != ty),
        "T still in the guard file: {list:#?}"
    );
    let ours = ps.last().unwrap();
    assert_eq!(ours["type"], "interlock-cni");
    assert_eq!(ours["guard"]["hold"], Value::Bool(true), "{list:#?}");
    assert!(ours["guard"]["reason"]
        .as_str()
        .is_some_and(|r| r.contains(ty)));
}

#[test]
fn istio_first_then_the_primary_adopts_the_holding_file_as_its_sticky_target() {
    let mesh = GuardedMesh::Istio;
    let t = t_entry(mesh, 1);
    let mut files = Files::new();
    let mut agent = Agent::new(mesh);
    let mut istio = Istio {
        t: t.clone(),
        target: None,
        up: true,
    };
    settle(&mut agent, &mut istio, &mut files, 6);
    // Istio picked the holding config (the only valid file) and appended itself: kept.
    let (holding, _) = guard_file(&files);
    assert_eq!(istio.target.as_deref(), Some(holding.as_str()));
    assert!(
        has_t(&files[holding], "istio-cni"),
        "T stripped from the holding config"
    );
    assert!(matches!(agent.state, Some(GuardState::NoPrimary { .. })));
    files.insert(PRIMARY.into(), calico());
    let (a, i) = settle(&mut agent, &mut istio, &mut files, 6);
    assert!(a <= 2 && i <= 2, "agent {a}, installer {i} writes");
    assert_guarding(&files, &t);
    assert_eq!(agent.state, Some(GuardState::Guard));
    assert_eq!(agent.verdict(&files).unwrap(), *guard_file(&files).0);
    // The primary rewrites its own file: the guard file follows it and keeps T.
    files.insert(PRIMARY.into(), calico_v2());
    let (a, i) = settle(&mut agent, &mut istio, &mut files, 6);
    assert!(a <= 2 && i <= 2, "agent {a}, installer {i} writes");
    assert_guarding(&files, &t);
    assert!(files[guard_file(&files).0].contains("1450"));
}

#[test]
fn istio_started_before_interlock_keeps_its_target_and_t_is_copied() {
    let mesh = GuardedMesh::Istio;
    let t = t_entry(mesh, 1);
    let mut files = Files::from([(PRIMARY.to_string(), calico())]);
    let mut istio = Istio {
        t: t.clone(),
        target: None,
        up: true,
    };
    istio.react(&mut files);
    assert_eq!(istio.target.as_deref(), Some(PRIMARY));
    let mut agent = Agent::new(mesh);
    let (a, _) = settle(&mut agent, &mut istio, &mut files, 6);
    assert!(a <= 2);
    assert_guarding(&files, &t);
    // The primary drops T from its file; Istio puts it back there; the guard file keeps T
    // and is not rewritten.
    let (gname, _) = guard_file(&files);
    let before = files[gname].clone();
    files.insert(PRIMARY.into(), calico());
    let (a, i) = settle(&mut agent, &mut istio, &mut files, 6);
    assert_eq!((a, i), (0, 1));
    assert_eq!(files[guard_file(&files).0], before);
    // SIGTERM: T leaves its target, the binary goes: hold, meshed pods held back.
    istio.cleanup(&mut files);
    settle(&mut agent, &mut istio, &mut files, 6);
    assert_holding(&files, "istio-cni");
    assert!(matches!(agent.state, Some(GuardState::Hold { .. })));
    // A new installer process picks the first valid file, the guard file, and appends:
    // adopted, guard again.
    istio.up = true;
    let (a, _) = settle(&mut agent, &mut istio, &mut files, 6);
    assert!(a <= 2);
    assert_eq!(istio.target.as_deref(), Some(guard_file(&files).0.as_str()));
    assert_guarding(&files, &t);
    assert_eq!(agent.state, Some(GuardState::Guard));
}

#[test]
fn linkerd_reinjecting_every_file_converges_despite_its_key_order() {
    let mesh = GuardedMesh::Linkerd;
    let t = t_entry(mesh, 1);
    let mut files = Files::from([(PRIMARY.to_string(), calico())]);
    let mut linkerd = Linkerd {
        t: t.clone(),
        wrote: HashMap::new(),
        up: true,
    };
    linkerd.react(&mut files);
    let mut agent = Agent::new(mesh);
    let (a, i) = settle(&mut agent, &mut linkerd, &mut files, 8);
    assert!(a <= 2 && i <= 2, "agent {a}, installer {i} writes");
    assert_guarding(&files, &t);
    // Linkerd rewrote the guard file with sorted keys: not rewritten back.
    assert!(files[guard_file(&files).0].starts_with("{\"cniVersion\""));
    for _ in 0..3 {
        files.insert(PRIMARY.into(), calico_v2());
        let (a, i) = settle(&mut agent, &mut linkerd, &mut files, 8);
        assert!(a <= 2 && i <= 2, "agent {a}, installer {i} writes");
        assert_guarding(&files, &t);
        files.insert(PRIMARY.into(), calico());
        settle(&mut agent, &mut linkerd, &mut files, 8);
        assert_guarding(&files, &t);
    }
    // SIGTERM: every file reverted, binary gone: T forgotten, hold, not re-added.
    linkerd.cleanup(&mut files);
    settle(&mut agent, &mut linkerd, &mut files, 8);
    assert_holding(&files, "linkerd-cni");
    assert!(agent.learner.current().is_none());
    assert!(!has_t(&files[PRIMARY], "linkerd-cni"));
    // Back: it injects everywhere again.
    linkerd.up = true;
    settle(&mut agent, &mut linkerd, &mut files, 8);
    assert_guarding(&files, &t);
}

#[test]
fn consul_first_valid_file_each_event_stays_last_and_equal() {
    let mesh = GuardedMesh::Consul;
    let t1 = t_entry(mesh, 1);
    let mut files = Files::from([(PRIMARY.to_string(), calico())]);
    let mut consul = Consul {
        t: t1.clone(),
        start_file: None,
        up: true,
    };
    consul.react(&mut files);
    let mut agent = Agent::new(mesh);
    let (a, i) = settle(&mut agent, &mut consul, &mut files, 8);
    assert!(a <= 2 && i <= 2, "agent {a}, installer {i} writes");
    assert_guarding(&files, &t1);
    // Primary rewrites (dropping T from its file): the guard file, first, keeps T last.
    files.insert(PRIMARY.into(), calico_v2());
    let (a, i) = settle(&mut agent, &mut consul, &mut files, 8);
    assert!(a <= 2 && i <= 2, "agent {a}, installer {i} writes");
    assert_guarding(&files, &t1);
    // A restarted installer has a new kubeconfig name: it rewrites the guard file with
    // its new entry, which the agent adopts without a fight.
    consul.cleanup(&mut files);
    settle(&mut agent, &mut consul, &mut files, 8);
    assert_holding(&files, "consul-cni");
    let t2 = t_entry(mesh, 2);
    consul.t = t2.clone();
    consul.up = true;
    let (a, i) = settle(&mut agent, &mut consul, &mut files, 8);
    assert!(a <= 2 && i <= 2, "agent {a}, installer {i} writes");
    assert_guarding(&files, &t2);
    assert_eq!(agent.learner.current().unwrap().entry, t2);
}

#[test]
fn kuma_named_file_is_learnt_and_a_primary_rewrite_holds_until_it_is_back() {
    let mesh = GuardedMesh::Kuma;
    let t = t_entry(mesh, 1);
    let mut files = Files::from([(PRIMARY.to_string(), calico())]);
    let mut kuma = Kuma {
        t: t.clone(),
        file: PRIMARY.into(),
        up: false,
    };
    kuma.start(&mut files);
    let mut agent = Agent::new(mesh);
    let (a, i) = settle(&mut agent, &mut kuma, &mut files, 6);
    assert!(a <= 2 && i == 0);
    assert_guarding(&files, &t);
    assert_eq!(agent.learner.current().unwrap().source, PRIMARY);
    // The primary drops T: Kuma exits and takes its binary: hold (never T without binary).
    files.insert(PRIMARY.into(), calico_v2());
    settle(&mut agent, &mut kuma, &mut files, 6);
    assert_holding(&files, "kuma-cni");
    // Restarted by the kubelet: appends again, binary back: guard.
    kuma.start(&mut files);
    let (a, _) = settle(&mut agent, &mut kuma, &mut files, 6);
    assert!(a <= 2);
    assert_guarding(&files, &t);
    assert!(files[guard_file(&files).0].contains("1450"));
}

#[test]
fn removing_interlock_from_the_guard_file_or_deleting_it_is_a_conflict() {
    let mesh = GuardedMesh::Istio;
    let t = t_entry(mesh, 1);
    let mut files = Files::from([(PRIMARY.to_string(), inject(&calico(), &t).unwrap())]);
    let mut agent = Agent::new(mesh);
    agent.reconcile(&mut files, true);
    let (gname, _) = guard_file(&files);
    let gname = gname.clone();
    // The installer rewriting T in the guard file: no conflict.
    let snap_after = |files: &Files| snapshot(files);
    let mut s = settings(mesh);
    s.guard.as_mut().unwrap().learned = Some(t.clone());
    let mut facts = agent.facts(true);
    facts.present_types.insert("istio-cni".into());
    let mut edited = files.clone();
    edited.insert(
        gname.clone(),
        remove_t(&files[&gname], "istio-cni").unwrap(),
    );
    let (plan, _) = plan_guard(&snap_after(&edited), &s, &facts);
    assert!(!plan.actions.is_empty());
    assert!(
        guard_conflicting_files(&plan, &snap_after(&edited), &agent.left, "istio-cni").is_empty()
    );
    // interlock-cni removed: a conflict.
    let mut edited = files.clone();
    edited.insert(
        gname.clone(),
        remove_t(&files[&gname], "interlock-cni").unwrap(),
    );
    let (plan, _) = plan_guard(&snap_after(&edited), &s, &facts);
    assert_eq!(
        guard_conflicting_files(&plan, &snap_after(&edited), &agent.left, "istio-cni"),
        [gname.as_str()]
    );
    // The guard file deleted: a conflict.
    let mut edited = files.clone();
    edited.remove(&gname);
    let (plan, _) = plan_guard(&snap_after(&edited), &s, &facts);
    assert_eq!(
        guard_conflicting_files(&plan, &snap_after(&edited), &agent.left, "istio-cni"),
        [gname.as_str()]
    );
}

#[test]
fn a_file_sorting_ahead_of_the_guard_file_keeps_its_name_and_blocks_readiness() {
    let mesh = GuardedMesh::Istio;
    let t = t_entry(mesh, 1);
    let mut files = Files::from([(PRIMARY.to_string(), inject(&calico(), &t).unwrap())]);
    let mut agent = Agent::new(mesh);
    agent.reconcile(&mut files, true);
    let gname = guard_file(&files).0.clone();
    assert_eq!(gname, "00-interlock.conflist");
    files.insert("0-cilium.conflist".into(), calico());
    let mut s = settings(mesh);
    s.guard.as_mut().unwrap().learned = Some(t.clone());
    let (plan, state) = plan_guard(&snapshot(&files), &s, &agent.facts(true));
    assert_eq!(state, GuardState::Guard);
    assert_eq!(plan.target.as_deref(), Some(gname.as_str()));
    assert!(plan.blocks_ready);
    assert!(
        plan.problem
            .as_deref()
            .unwrap()
            .contains("0-cilium.conflist sorts ahead"),
        "{plan:?}"
    );
    assert!(plan.actions.iter().all(|a| a.file() == gname));
}

#[test]
fn t_is_held_while_its_version_refuses_the_list_or_it_is_not_learnt() {
    let mesh = GuardedMesh::Consul;
    let files = Files::from([(PRIMARY.to_string(), calico())]);
    let agent = Agent::new(mesh);
    let s = settings(mesh);
    let (plan, state) = plan_guard(&snapshot(&files), &s, &agent.facts(true));
    match state {
        GuardState::Hold { reason } => assert!(reason.contains("no consul-cni entry learnt")),
        other => panic!("{other:?}"),
    }
    assert!(plan.problem.unwrap().ends_with("meshed pods are held"));
    let mut s = settings(mesh);
    s.guard.as_mut().unwrap().learned = Some(t_entry(mesh, 1));
    let mut facts = agent.facts(true);
    facts
        .versions
        .insert("consul-cni".into(), vec!["0.1.0".into(), "0.2.0".into()]);
    let (_, state) = plan_guard(&snapshot(&files), &s, &facts);
    match state {
        GuardState::Hold { reason } => assert!(reason.contains("refuses"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn uninstall_removes_the_guard_file_and_says_the_mesh_plugin_went_with_it() {
    let mesh = GuardedMesh::Istio;
    let t = t_entry(mesh, 1);
    let mut files = Files::new();
    let mut agent = Agent::new(mesh);
    let mut istio = Istio {
        t: t.clone(),
        target: None,
        up: true,
    };
    settle(&mut agent, &mut istio, &mut files, 6);
    files.insert(PRIMARY.into(), calico());
    settle(&mut agent, &mut istio, &mut files, 6);
    assert_guarding(&files, &t);
    let u = interlock_agent::guard::plan::plan_uninstall_explained(&snapshot(&files));
    assert_eq!(
        u.actions,
        [Action::Remove {
            name: "00-interlock.conflist".into()
        }]
    );
    assert!(
        u.notes
            .iter()
            .any(|n| n.contains("carried istio-cni")
                && n.contains("restart the istio-cni DaemonSet")),
        "{:?}",
        u.notes
    );
    // The primary's file is left as it is (T is not written into it).
    assert!(u.actions.iter().all(|a| a.file() != PRIMARY));
}

#[test]
fn an_installer_putting_t_back_while_the_guard_holds_converges_and_stays_held() {
    // Each of these installers re-inserts its entry into the guard file when it is
    // missing (Istio: its sticky target; Linkerd: every file; Consul: the first valid
    // file). While the entry cannot run (here: its binary is missing where the agent
    // looks, while the installer lives on), the guard leaves it out once; the installer
    // puts it back; the guard keeps it there after interlock-cni, which goes on holding
    // meshed pods. Stripping it again would rewrite the file with the installer for as
    // long as the hold lasts, and the fight that trips would keep the node not ready
    // long after the binary is back.
    for mesh in [
        GuardedMesh::Istio,
        GuardedMesh::Linkerd,
        GuardedMesh::Consul,
    ] {
        let t = t_entry(mesh, 1);
        let ty = mesh.plugin_type();
        let mut files = Files::from([(PRIMARY.to_string(), calico())]);
        let mut inst = installer(mesh, &t);
        inst.react(&mut files);
        let mut agent = Agent::new(mesh);
        settle(&mut agent, inst.as_mut(), &mut files, 8);
        assert_guarding(&files, &t);
        // The binary vanishes from the agent's view; the installer goes on.
        assert!(
            agent.reconcile(&mut files, false),
            "{mesh}: the hold is written"
        );
        assert_holding(&files, ty);
        let before = agent.writes;
        let mut inst_writes = 0;
        for _ in 0..8 {
            inst_writes += usize::from(inst.react(&mut files));
            agent.reconcile(&mut files, false);
        }
        assert_eq!(
            agent.writes, before,
            "{mesh}: the guard wrote again: {files:#?}"
        );
        assert!(
            inst_writes <= 1,
            "{mesh}: the installer wrote {inst_writes} times"
        );
        let (name, list) = guard_file(&files);
        let types: Vec<&str> = list["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["type"].as_str().unwrap())
            .collect();
        assert_eq!(
            types,
            ["calico", "portmap", "interlock-cni", ty],
            "{mesh}: {name}"
        );
        assert_eq!(
            list["plugins"][2]["guard"]["hold"],
            Value::Bool(true),
            "{mesh}: interlock-cni must go on holding meshed pods"
        );
        assert!(matches!(agent.state, Some(GuardState::Hold { .. })));
        // The binary is back: guarding again, no fight left behind, and ready.
        settle(&mut agent, inst.as_mut(), &mut files, 8);
        assert_guarding(&files, &t);
        assert_eq!(agent.state, Some(GuardState::Guard));
        agent.verdict(&files).unwrap();
    }
}

/// A running installer for `mesh` whose target is (or becomes) the guard file: Istio's
/// sticky target is set to it, as when it started before the primary.
fn installer(mesh: GuardedMesh, t: &Map<String, Value>) -> Box<dyn Installer> {
    let t = t.clone();
    match mesh {
        GuardedMesh::Istio => Box::new(Istio {
            t,
            target: Some("00-interlock.conflist".into()),
            up: true,
        }),
        GuardedMesh::Linkerd => Box::new(Linkerd {
            t,
            wrote: HashMap::new(),
            up: true,
        }),
        GuardedMesh::Consul => Box::new(Consul {
            t,
            start_file: None,
            up: true,
        }),
        GuardedMesh::Kuma => unreachable!("kuma-cni writes its own file only"),
    }
}

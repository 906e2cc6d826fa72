//! `interlock check cluster`: the cluster as the Kubernetes API shows it — per Linux node
//! the `InterlockReady` condition, the startup taint and the agent pod on it; the pods
//! the agents labelled unprotected; the nodes without an agent — judged with the same
//! finding ids, verdicts and exit codes as `check node`.
//!
//! Gathering (three list calls: nodes, the agent pods, the pods labelled unprotected) is
//! kept apart from judging ([`judge_cluster`], pure), which the tests feed directly.

use std::collections::BTreeMap;
use std::io::Write;

use interlock_contract::names::{CONDITION_READY, LABEL_UNPROTECTED, TAINT_NOT_READY};
use serde::Serialize;

use super::judge::{self, Effect, Finding, Judgement, Status, Verdict};
use super::report::{render_findings, render_verdict, Head, Style};

/// The namespace `interlock manifests` installs the agent into.
pub const DEFAULT_NAMESPACE: &str = "interlock-system";
/// The label selector of the agent's pods in the manifests.
pub const DEFAULT_AGENT_SELECTOR: &str = "app.kubernetes.io/name=interlock";

/// `interlock check cluster` flags.
#[derive(Debug, clap::Args)]
pub struct ClusterArgs {
    /// The namespace the agent's DaemonSet runs in.
    #[arg(long, env = "INTERLOCK_NAMESPACE", default_value = DEFAULT_NAMESPACE)]
    namespace: String,
    /// The label selector of the agent's pods.
    #[arg(long, default_value = DEFAULT_AGENT_SELECTOR)]
    agent_selector: String,
    /// The kubeconfig to read [default: in a pod its service account, else $KUBECONFIG,
    /// else ~/.kube/config].
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<std::path::PathBuf>,
    /// The kubeconfig context to use [default: its current context].
    #[arg(long, value_name = "NAME")]
    context: Option<String>,
    /// How long the API may take for all of check's calls, in seconds (`30` or `30s`).
    #[arg(long, value_name = "SECONDS", default_value = "30", value_parser = parse_timeout)]
    timeout: std::time::Duration,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
    pub output: super::Output,
}

fn parse_timeout(s: &str) -> Result<std::time::Duration, String> {
    s.strip_suffix('s')
        .unwrap_or(s)
        .parse::<f64>()
        .ok()
        .filter(|x| x.is_finite() && *x > 0.0 && *x <= 3600.0)
        .map(std::time::Duration::from_secs_f64)
        .ok_or_else(|| format!("{s:?}: expected seconds, e.g. 30 or 2.5s (at most 3600)"))
}

/// `InterlockReady` as a node carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionFacts {
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// The machine-readable reason.
    pub reason: String,
    /// The agent's explanation.
    pub message: String,
}

/// One node as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    /// Its name.
    pub name: String,
    /// Runs Linux (`kubernetes.io/os` is `linux` or absent): the agent's DaemonSet
    /// selects only these.
    pub linux: bool,
    /// `InterlockReady`, if set.
    pub condition: Option<ConditionFacts>,
    /// The startup taint's effect, if the node carries it.
    pub taint: Option<String>,
}

/// One agent pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentPodFacts {
    /// Its name.
    pub name: String,
    /// The node it is bound to (empty: not scheduled).
    pub node: String,
    /// Its phase.
    pub phase: String,
    /// Its `Ready` condition holds.
    pub ready: bool,
    /// Its `app.kubernetes.io/version` label: the interlock version of its image, as the
    /// manifests label it (`None`: not labelled).
    pub version: Option<String>,
    /// How often its agent container restarted.
    pub restarts: i32,
    /// Why its agent container is waiting (`CrashLoopBackOff`, `ImagePullBackOff`, …).
    pub waiting: Option<String>,
    /// How its agent container last ended: reason and exit code (`OOMKilled, exit code
    /// 137`), and the message the container left, if any.
    pub last_termination: Option<String>,
}

/// A DaemonSet of another mesh's CNI plugin (its chart's name or labels).
#[derive(Debug, Clone, PartialEq)]
pub struct MeshCniFacts {
    /// `istio-cni`, `linkerd-cni`, `consul-cni` or `kuma-cni`.
    pub mesh: &'static str,
    /// `namespace/name`.
    pub daemonset: String,
    /// The nodes its pods run on.
    pub nodes: Vec<String>,
    /// Its pods' tolerations.
    pub tolerations: Vec<k8s_openapi::api::core::v1::Toleration>,
}

/// Guard mode as interlock's ConfigMap sets it for every agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardFacts {
    /// The guarded mesh's plugin type (`istio-cni`, …).
    pub plugin: &'static str,
    /// The startup taint's effect the agents use (`none`: no taint).
    pub taint_effect: String,
}

/// Whether `tolerations` let a pod onto a node tainted `key` with `effect`, as the
/// scheduler matches them (an empty key with `Exists` tolerates every taint; an empty
/// effect, every effect).
pub fn tolerates(
    tolerations: &[k8s_openapi::api::core::v1::Toleration],
    key: &str,
    effect: &str,
) -> bool {
    tolerations.iter().any(|t| {
        let exists = t.operator.as_deref() == Some("Exists");
        let key_ok = match t.key.as_deref() {
            None | Some("") => exists,
            Some(k) => k == key,
        };
        let value_ok = exists || t.value.as_deref().unwrap_or("") == "true";
        let effect_ok = t
            .effect
            .as_deref()
            .is_none_or(|e| e.is_empty() || e == effect);
        key_ok && value_ok && effect_ok
    })
}

/// A Karpenter NodePool (`karpenter.sh/v1`) and where it puts interlock's startup taint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePoolFacts {
    /// Its name.
    pub name: String,
    /// `interlock.dev/not-ready` is among `spec.template.spec.startupTaints`.
    pub startup_taint: bool,
    /// It is among `spec.template.spec.taints` (permanent to Karpenter's scheduling).
    pub permanent_taint: bool,
}

/// interlock's own DaemonSet, as its controller counts its pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonSetFacts {
    /// `namespace/name`.
    pub name: String,
    /// Nodes that should run its pod.
    pub desired: i32,
    /// Of them, nodes whose pod is ready.
    pub ready: i32,
    /// Of them, nodes whose pod runs the current template.
    pub updated: i32,
}

/// A pod labelled unprotected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its node.
    pub node: String,
}

/// Everything [`judge_cluster`] looks at.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterFacts {
    /// The version of this `interlock` (the CLI), `major.minor.patch`.
    pub cli_version: String,
    /// Every node.
    pub nodes: Vec<NodeFacts>,
    /// The agent's pods.
    pub agents: Vec<AgentPodFacts>,
    /// Pods labelled `interlock.dev/unprotected=true`.
    pub unprotected: Vec<PodRef>,
    /// The agent's namespace (hints name it; empty: the default).
    pub namespace: String,
    /// Other meshes' CNI DaemonSets, or why they could not be listed.
    pub mesh_cni: Result<Vec<MeshCniFacts>, String>,
    /// interlock's DaemonSet (`None`: not found, or DaemonSets could not be listed).
    pub daemonset: Option<DaemonSetFacts>,
    /// Karpenter's NodePools (empty: Karpenter is not installed), or why they could not
    /// be listed.
    pub node_pools: Result<Vec<NodePoolFacts>, String>,
    /// Guard mode, when interlock's ConfigMap turns it on.
    pub guard: Option<GuardFacts>,
}

impl Default for ClusterFacts {
    fn default() -> ClusterFacts {
        ClusterFacts {
            cli_version: String::new(),
            nodes: Vec::new(),
            agents: Vec::new(),
            unprotected: Vec::new(),
            namespace: DEFAULT_NAMESPACE.into(),
            mesh_cni: Ok(Vec::new()),
            daemonset: None,
            node_pools: Ok(Vec::new()),
            guard: None,
        }
    }
}

/// The agent pod of a node in the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentPodDoc {
    /// Its name.
    pub name: String,
    /// Its phase.
    pub phase: String,
    /// Its `Ready` condition holds.
    pub ready: bool,
    /// Its interlock version (`null`: its pod carries no version label).
    pub version: Option<String>,
    /// How often its agent container restarted.
    pub restarts: i32,
    /// Why its agent container is waiting (`null`: it is not).
    pub waiting: Option<String>,
    /// How its agent container last ended (`null`: it never did).
    pub last_termination: Option<String>,
}

/// One Linux node in the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeDoc {
    /// Its name.
    pub name: String,
    /// The node's verdict.
    pub verdict: Verdict,
    /// `InterlockReady`'s status (`null`: not set).
    pub interlock_ready: Option<String>,
    /// Its reason and message, `reason: message`.
    pub interlock_ready_reason: Option<String>,
    /// The startup taint's effect (`null`: not tainted).
    pub taint: Option<String>,
    /// The agent pod on it (`null`: none).
    pub agent_pod: Option<AgentPodDoc>,
    /// Pods on it labelled unprotected, `namespace/name`.
    pub unprotected_pods: Vec<String>,
    /// What is wrong, one sentence each (empty: nothing).
    pub problems: Vec<String>,
}

/// Where `check cluster` looked.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSettings {
    /// The agent's namespace.
    pub namespace: String,
    /// The agent pods' label selector.
    pub agent_selector: String,
    /// The credentials used (`null`: none found).
    pub credentials: Option<String>,
}

/// The document `check cluster -o json` prints (schemaVersion 1, kind `ClusterCheck`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterReport {
    /// Schema, build, time, verdict, findings.
    #[serde(flatten)]
    pub head: Head,
    /// Where it looked.
    pub settings: ClusterSettings,
    /// Every Linux node, by name (`null`: the API could not be read).
    pub nodes: Option<Vec<NodeDoc>>,
    /// Every pod labelled unprotected.
    pub unprotected_pods: Vec<PodRef>,
}

impl ClusterReport {
    /// The report from the judgement and what was seen.
    pub fn new(
        now_ms: u64,
        settings: ClusterSettings,
        j: Judgement,
        nodes: Option<Vec<NodeDoc>>,
        unprotected_pods: Vec<PodRef>,
    ) -> ClusterReport {
        ClusterReport {
            head: Head::new("ClusterCheck", now_ms, j),
            settings,
            nodes,
            unprotected_pods,
        }
    }
}

/// Where docs/check.md explains the cluster's findings.
const DOC_CLUSTER: &str = "docs/check.md#the-cluster-check-cluster";
/// Where docs/check.md explains `check`'s own findings (credentials, the API).
const DOC_CHECK: &str = "docs/check.md#check-itself";

/// What to do about a cluster finding, with the agent's namespace `ns` in its commands.
fn hint(id: &str, ns: &str) -> String {
    match id {
        "cluster.no-agent" | "cluster.no-agent-gated" => format!(
            "check the DaemonSet (kubectl -n {ns} get ds,pods -o wide): its nodeSelector and tolerations must reach every Linux node; register node pools with the startup taint so pods wait for the agent ({DOC_CLUSTER})"
        ),
        "cluster.agent-not-ready" => format!(
            "read the agent's log on that node: kubectl -n {ns} logs <pod>; `interlock check node` in the pod says why ({DOC_CLUSTER})"
        ),
        "cluster.agent-crashlooping" => format!(
            "the agent keeps exiting: read why with kubectl -n {ns} logs <pod> --previous; OOMKilled: raise resources.limits.memory (interlock manifests --set, docs/install.md#settings-values-file-and---set) ({DOC_CLUSTER})"
        ),
        "cluster.agent-restarted" => format!(
            "the agent is ready now but restarted: kubectl -n {ns} logs <pod> --previous says why; OOMKilled: raise resources.limits.memory ({DOC_CLUSTER})"
        ),
        "cluster.not-ready-ungated" => format!(
            "the agent runs with taintEffect none (or the taint was removed): set taintEffect NoSchedule so an unprotected node takes no pods, and see the condition's message ({DOC_CLUSTER})"
        ),
        "cluster.not-ready" => format!(
            "the node takes no new pods until the agent is ready: see the condition's message and `interlock check node` on it ({DOC_CLUSTER})"
        ),
        "cluster.no-condition" => format!(
            "the agent on that node never wrote its condition: does it run with --kube=auto and the RBAC of `interlock manifests`? ({DOC_CLUSTER})"
        ),
        "cluster.tainted-while-ready" => format!(
            "the agent removes the taint once ready; if it stays, the agent cannot patch the node (RBAC): kubectl -n {ns} logs <pod> ({DOC_CLUSTER})"
        ),
        "cluster.version-skew" => "use the interlock of the agents' release to check, or finish the upgrade: agents and CLI are supported at the same minor version (docs/operate.md#upgrading)".into(),
        "cluster.mixed-versions" => format!(
            "normal while a DaemonSet rollout runs (kubectl -n {ns} rollout status ds/interlock-node); otherwise some nodes did not take the update (docs/operate.md#upgrading)"
        ),
        "cluster.other-mesh-cni" => format!(
            "on those nodes each pod's traffic is redirected twice: remove the mesh's CNI DaemonSet, or keep it off interlock's nodes while you move one node pool at a time (docs/migration.md#one-node-pool-at-a-time); `interlock check node` there names the file ({DOC_CLUSTER})"
        ),
        "cluster.other-mesh-cni-elsewhere" => format!(
            "fine while you move one node pool at a time; when every pool runs interlock, remove it (docs/migration.md#one-node-pool-at-a-time) ({DOC_CLUSTER})"
        ),
        "cluster.guarded-mesh-cni-missing" => format!(
            "install the mesh's CNI (its DaemonSet) or run the agents without guard mode (interlock manifests --set configMode=owned): until then they hold every meshed pod (docs/guard-mode.md) ({DOC_CLUSTER})"
        ),
        "cluster.guarded-mesh-cni-untolerated" => format!(
            "add the toleration {{key: {TAINT_NOT_READY}, operator: Exists}} to the mesh's CNI DaemonSet, or set taintEffect none: a node the agent taints before the mesh's plugin is there would keep its taint for good (docs/guard-mode.md#consul-consul-cni) ({DOC_CLUSTER})"
        ),
        "cluster.guarded-mesh-cni-absent" => format!(
            "the agents there hold meshed pods until the mesh's CNI pod runs: look at its DaemonSet's nodeSelector and tolerations (docs/guard-mode.md) ({DOC_CLUSTER})"
        ),
        "cluster.daemonsets-unreadable" => format!(
            "grant list on daemonsets.apps in every namespace to see leftover mesh CNI DaemonSets (kubectl auth can-i list daemonsets.apps -A) ({DOC_CHECK})"
        ),
        "cluster.nodepool-no-startup-taint" => format!(
            "add {{key: {TAINT_NOT_READY}, effect: NoSchedule}} to the NodePool's spec.template.spec.startupTaints, so its new nodes take pods only once the agent is ready (docs/install.md#node-pools-the-startup-taint) ({DOC_CLUSTER})"
        ),
        "cluster.nodepool-permanent-taint" => format!(
            "move {TAINT_NOT_READY} from the NodePool's spec.template.spec.taints to startupTaints: Karpenter launches no node for a pod that does not tolerate a taint in taints (docs/install.md#node-pools-the-startup-taint) ({DOC_CLUSTER})"
        ),
        "cluster.nodepools-unreadable" => format!(
            "grant list on nodepools.karpenter.sh to see whether Karpenter registers nodes with the startup taint (kubectl auth can-i list nodepools.karpenter.sh) ({DOC_CHECK})"
        ),
        "cluster.daemonset-rollout" => format!(
            "normal while a rollout runs: kubectl -n {ns} rollout status ds/interlock-node; if it does not finish, kubectl -n {ns} get pods -o wide shows the nodes whose pod is not ready (docs/operate.md#upgrading)"
        ),
        "cluster.nodes" => "the API lists no Linux node: is the kubeconfig's cluster the right one (--kubeconfig, --context)?".into(),
        _ => format!(
            "an agent found these pods unprotected and, by its repair policy (report, or repairs that kept failing), left them so: see the pods' Events (Unprotected, RepairFailed) and delete them so they start again through interlock ({DOC_CLUSTER})"
        ),
    }
}

/// What a cluster finding is about, for its message.
fn what(id: &str) -> &'static str {
    match id {
        "cluster.no-agent" => "nodes without an interlock agent",
        "cluster.no-agent-gated" => "nodes without an agent, gated",
        "cluster.agent-not-ready" => "agent pods not ready",
        "cluster.agent-crashlooping" => "agent pods crash-looping",
        "cluster.agent-restarted" => "agent pods that restarted",
        "cluster.not-ready-ungated" => "nodes not ready and not gated",
        "cluster.not-ready" => "nodes not ready",
        "cluster.no-condition" => "nodes without InterlockReady",
        "cluster.tainted-while-ready" => "nodes still tainted",
        "cluster.version-skew" => "agents of another minor version than this interlock",
        "cluster.mixed-versions" => "agents of several versions",
        "cluster.other-mesh-cni" => "another mesh's CNI DaemonSet runs on nodes with interlock",
        "cluster.other-mesh-cni-elsewhere" => "another mesh's CNI DaemonSet is still installed",
        "cluster.daemonsets-unreadable" => "other meshes' CNI DaemonSets not looked for",
        "cluster.guarded-mesh-cni-missing" => "the guarded mesh's CNI DaemonSet is missing",
        "cluster.guarded-mesh-cni-untolerated" => {
            "the guarded mesh's CNI DaemonSet does not tolerate the startup taint"
        }
        "cluster.guarded-mesh-cni-absent" => {
            "nodes with an agent but no pod of the guarded mesh's CNI"
        }
        "cluster.nodepool-no-startup-taint" => "Karpenter NodePools without the startup taint",
        "cluster.nodepool-permanent-taint" => {
            "Karpenter NodePools with the startup taint as a permanent taint"
        }
        "cluster.nodepools-unreadable" => "Karpenter NodePools not looked at",
        "cluster.daemonset-rollout" => "interlock's DaemonSet not all ready and up to date",
        _ => "meshed pods running unprotected",
    }
}

/// `major.minor` of a version (the whole text when it has no two dots' worth).
fn minor_of(v: &str) -> &str {
    match v.match_indices('.').nth(1) {
        Some((i, _)) => &v[..i],
        None => v,
    }
}

/// One problem with a node: id, status, effect, message.
type Problem = (&'static str, Status, Effect, String);

/// Findings of one kind, the items (one per node or object) they name.
#[derive(Default)]
struct Kinds(BTreeMap<&'static str, (Status, Effect, Vec<String>)>);

impl Kinds {
    fn add(&mut self, id: &'static str, status: Status, effect: Effect, item: String) {
        self.0
            .entry(id)
            .or_insert((status, effect, Vec::new()))
            .2
            .push(item);
    }
}

/// An agent pod as the table and the messages show it: ready, or its phase, why it
/// waits and how often it restarted.
fn agent_state(a: &AgentPodFacts) -> String {
    let mut s = if a.ready {
        "ready".to_string()
    } else {
        a.waiting.clone().unwrap_or_else(|| a.phase.clone())
    };
    if a.restarts > 0 {
        s.push_str(&format!(
            ", {} restart{}",
            a.restarts,
            if a.restarts == 1 { "" } else { "s" }
        ));
    }
    s
}

fn last_ended(a: &AgentPodFacts) -> String {
    a.last_termination
        .as_deref()
        .map(|t| format!("; last ended: {t}"))
        .unwrap_or_default()
}

/// The agent pod of a node: missing, crash-looping, not ready, or restarted.
fn agent_problems(agent: Option<&AgentPodFacts>, tainted: bool) -> Vec<Problem> {
    match agent {
        None if tainted => vec![(
            "cluster.no-agent-gated",
            Status::Fail,
            Effect::Risk,
            "no agent pod; the startup taint keeps pods off".into(),
        )],
        None => vec![(
            "cluster.no-agent",
            Status::Fail,
            Effect::Hole,
            "no agent pod and no startup taint: pods scheduled here start without interlock".into(),
        )],
        Some(a) if !a.ready && a.waiting.as_deref() == Some("CrashLoopBackOff") => vec![(
            "cluster.agent-crashlooping",
            Status::Fail,
            Effect::Risk,
            format!(
                "agent pod {} is crash-looping ({}){}",
                a.name,
                agent_state(a),
                last_ended(a)
            ),
        )],
        Some(a) if !a.ready => vec![(
            "cluster.agent-not-ready",
            Status::Fail,
            Effect::Risk,
            format!(
                "agent pod {} is not ready ({}){}",
                a.name,
                agent_state(a),
                last_ended(a)
            ),
        )],
        Some(a) if a.restarts > 0 => vec![(
            "cluster.agent-restarted",
            Status::Warn,
            Effect::None,
            format!(
                "agent pod {} restarted {} time{}{}",
                a.name,
                a.restarts,
                if a.restarts == 1 { "" } else { "s" },
                last_ended(a)
            ),
        )],
        Some(_) => vec![],
    }
}

/// The node's `InterlockReady` condition against its taint.
fn condition_problems(n: &NodeFacts, has_agent: bool, why: &str) -> Vec<Problem> {
    let tainted = n.taint.is_some();
    match n.condition.as_ref().map(|c| c.status.as_str()) {
        Some("True") if tainted => vec![(
            "cluster.tainted-while-ready",
            Status::Warn,
            Effect::None,
            "InterlockReady=True but the startup taint is still on".into(),
        )],
        Some("True") => vec![],
        Some(s) if tainted => vec![(
            "cluster.not-ready",
            Status::Fail,
            Effect::Risk,
            format!("InterlockReady={s} ({why}); tainted, so no new pods land"),
        )],
        Some(s) => vec![(
            "cluster.not-ready-ungated",
            Status::Fail,
            Effect::Hole,
            format!("InterlockReady={s} ({why}) and no startup taint: pods still land here"),
        )],
        // Without an agent, the missing condition is already said.
        None if !has_agent => vec![],
        None => vec![(
            "cluster.no-condition",
            Status::Fail,
            Effect::Risk,
            "no InterlockReady condition: the agent has not reported to the API".into(),
        )],
    }
}

/// One Linux node: its problems (added to `kinds`) and its row.
fn judge_node(f: &ClusterFacts, n: &NodeFacts, kinds: &mut Kinds) -> NodeDoc {
    // A ready agent pod wins over others of the same node (a rollout's old one).
    let agent = f
        .agents
        .iter()
        .filter(|a| a.node == n.name)
        .max_by_key(|a| a.ready);
    let unprotected: Vec<String> = f
        .unprotected
        .iter()
        .filter(|p| p.node == n.name)
        .map(|p| format!("{}/{}", p.namespace, p.name))
        .collect();
    let cond = n.condition.as_ref();
    let why = cond
        .map(|c| format!("{}: {}", c.reason, c.message))
        .unwrap_or_default();
    let mut problems = agent_problems(agent, n.taint.is_some());
    problems.extend(condition_problems(n, agent.is_some(), &why));
    if !unprotected.is_empty() {
        problems.push((
            "cluster.unprotected-pods",
            Status::Fail,
            Effect::Hole,
            format!("pods labelled unprotected: {}", unprotected.join(", ")),
        ));
    }
    let verdict = match problems
        .iter()
        .filter(|p| p.1 == Status::Fail)
        .map(|p| p.2)
        .min()
    {
        Some(Effect::Hole) => Verdict::Unprotected,
        Some(_) => Verdict::AtRisk,
        None => Verdict::Protected,
    };
    for (id, status, effect, msg) in &problems {
        kinds.add(id, *status, *effect, format!("{} ({msg})", n.name));
    }
    NodeDoc {
        name: n.name.clone(),
        verdict,
        interlock_ready: cond.map(|c| c.status.clone()),
        interlock_ready_reason: cond.map(|_| why.clone()),
        taint: n.taint.clone(),
        agent_pod: agent.map(|a| AgentPodDoc {
            name: a.name.clone(),
            phase: a.phase.clone(),
            ready: a.ready,
            version: a.version.clone(),
            restarts: a.restarts,
            waiting: a.waiting.clone(),
            last_termination: a.last_termination.clone(),
        }),
        unprotected_pods: unprotected,
        problems: problems.into_iter().map(|p| p.3).collect(),
    }
}

/// Labelled pods on no known Linux node still count.
fn stray_unprotected(f: &ClusterFacts, known: &[&str], kinds: &mut Kinds) {
    for p in f
        .unprotected
        .iter()
        .filter(|p| !known.contains(&p.node.as_str()))
    {
        kinds.add(
            "cluster.unprotected-pods",
            Status::Fail,
            Effect::Hole,
            format!(
                "{} (pod {}/{} labelled unprotected)",
                if p.node.is_empty() {
                    "no node"
                } else {
                    &p.node
                },
                p.namespace,
                p.name
            ),
        );
    }
}

/// Version skew (docs/operate.md, "Upgrading"): agents and this CLI of one minor
/// version; several versions across nodes while a rollout runs.
fn version_findings(f: &ClusterFacts, known: &[&str], kinds: &mut Kinds) {
    let mut versions: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for a in f.agents.iter().filter(|a| known.contains(&a.node.as_str())) {
        versions
            .entry(a.version.as_deref().unwrap_or("unlabelled"))
            .or_default()
            .push(a.node.as_str());
    }
    let cli_minor = minor_of(&f.cli_version);
    let off: Vec<String> = versions
        .iter()
        .filter(|(v, _)| minor_of(v) != cli_minor)
        .map(|(v, nodes)| format!("{v} on {}", nodes.join(", ")))
        .collect();
    if !off.is_empty() {
        kinds.add(
            "cluster.version-skew",
            Status::Warn,
            Effect::None,
            format!(
                "this interlock is {}; agents: {}",
                f.cli_version,
                off.join("; ")
            ),
        );
    }
    if versions.len() > 1 {
        kinds.add(
            "cluster.mixed-versions",
            Status::Warn,
            Effect::None,
            versions
                .iter()
                .map(|(v, nodes)| format!("{v} on {} node(s)", nodes.len()))
                .collect::<Vec<_>>()
                .join(", "),
        );
    }
}

/// Other meshes' CNI DaemonSets: on a node that also runs interlock's agent, pods get
/// two redirections (a hole); elsewhere, a migration still under way (a warning).
fn mesh_cni_findings(f: &ClusterFacts, kinds: &mut Kinds) {
    let ours: Vec<&str> = f.agents.iter().map(|a| a.node.as_str()).collect();
    match &f.mesh_cni {
        Err(e) => kinds.add(
            "cluster.daemonsets-unreadable",
            Status::Warn,
            Effect::None,
            e.clone(),
        ),
        Ok(found) => {
            let guarded = f.guard.as_ref().map(|g| g.plugin);
            if let Some(g) = &f.guard {
                guarded_mesh_findings(f, g, found, &ours, kinds);
            }
            for m in found.iter().filter(|m| Some(m.mesh) != guarded) {
                let both: Vec<&str> = m
                    .nodes
                    .iter()
                    .map(String::as_str)
                    .filter(|n| ours.contains(n))
                    .collect();
                if both.is_empty() {
                    kinds.add(
                        "cluster.other-mesh-cni-elsewhere",
                        Status::Warn,
                        Effect::None,
                        format!(
                            "{} DaemonSet {} on {} node(s), none running interlock",
                            m.mesh,
                            m.daemonset,
                            m.nodes.len()
                        ),
                    );
                } else {
                    kinds.add(
                        "cluster.other-mesh-cni",
                        Status::Fail,
                        Effect::Hole,
                        format!(
                            "{} DaemonSet {} also runs on {}",
                            m.mesh,
                            m.daemonset,
                            both.join(", ")
                        ),
                    );
                }
            }
        }
    }
}

/// Guard mode: the guarded mesh's CNI DaemonSet must run on every node with an agent
/// (the agents there hold meshed pods until it does) and tolerate the startup taint (a
/// node tainted for want of it could never get it).
fn guarded_mesh_findings(
    f: &ClusterFacts,
    g: &GuardFacts,
    found: &[MeshCniFacts],
    ours: &[&str],
    kinds: &mut Kinds,
) {
    let theirs: Vec<&MeshCniFacts> = found.iter().filter(|m| m.mesh == g.plugin).collect();
    if theirs.is_empty() {
        if !f.agents.is_empty() {
            kinds.add(
                "cluster.guarded-mesh-cni-missing",
                Status::Fail,
                Effect::Risk,
                format!(
                    "the agents guard {} but no {} DaemonSet was found",
                    g.plugin, g.plugin
                ),
            );
        }
        return;
    }
    for m in &theirs {
        if g.taint_effect != "none" && !tolerates(&m.tolerations, TAINT_NOT_READY, &g.taint_effect)
        {
            kinds.add(
                "cluster.guarded-mesh-cni-untolerated",
                Status::Fail,
                Effect::Risk,
                format!(
                    "{} DaemonSet {} does not tolerate {TAINT_NOT_READY}:{}",
                    m.mesh, m.daemonset, g.taint_effect
                ),
            );
        }
    }
    let without: Vec<&str> = ours
        .iter()
        .copied()
        .filter(|n| !theirs.iter().any(|m| m.nodes.iter().any(|x| x == n)))
        .collect();
    if !without.is_empty() {
        kinds.add(
            "cluster.guarded-mesh-cni-absent",
            Status::Fail,
            Effect::Risk,
            format!("no {} pod on {}", g.plugin, without.join(", ")),
        );
    }
}

/// Where Karpenter's NodePools put the startup taint: absent, new nodes take pods before
/// the agent is ready; among the permanent taints, Karpenter launches no node for the
/// pods that need one (it treats startup taints as temporary, taints as not).
fn node_pool_findings(f: &ClusterFacts, kinds: &mut Kinds) {
    match &f.node_pools {
        Err(e) => kinds.add(
            "cluster.nodepools-unreadable",
            Status::Warn,
            Effect::None,
            e.clone(),
        ),
        Ok(pools) => {
            for p in pools {
                if p.permanent_taint {
                    kinds.add(
                        "cluster.nodepool-permanent-taint",
                        Status::Warn,
                        Effect::None,
                        p.name.clone(),
                    );
                } else if !p.startup_taint {
                    kinds.add(
                        "cluster.nodepool-no-startup-taint",
                        Status::Warn,
                        Effect::None,
                        p.name.clone(),
                    );
                }
            }
        }
    }
}

/// interlock's DaemonSet as its controller counts it: a rollout under way, or pods not
/// ready, in one line.
fn daemonset_findings(f: &ClusterFacts, kinds: &mut Kinds) {
    let Some(d) = &f.daemonset else { return };
    if d.ready < d.desired || d.updated < d.desired {
        kinds.add(
            "cluster.daemonset-rollout",
            Status::Warn,
            Effect::None,
            format!(
                "{}: {} desired, {} ready, {} up to date",
                d.name, d.desired, d.ready, d.updated
            ),
        );
    }
}

/// Judges the cluster from what the API showed, one area at a time. Pure.
pub fn judge_cluster(f: &ClusterFacts) -> (Judgement, Vec<NodeDoc>) {
    let ns = if f.namespace.is_empty() {
        DEFAULT_NAMESPACE
    } else {
        &f.namespace
    };
    let mut kinds = Kinds::default();
    let mut nodes: Vec<&NodeFacts> = f.nodes.iter().filter(|n| n.linux).collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let docs: Vec<NodeDoc> = nodes.iter().map(|n| judge_node(f, n, &mut kinds)).collect();
    let known: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    stray_unprotected(f, &known, &mut kinds);
    version_findings(f, &known, &mut kinds);
    mesh_cni_findings(f, &mut kinds);
    node_pool_findings(f, &mut kinds);
    daemonset_findings(f, &mut kinds);
    let mut findings: Vec<Finding> = kinds
        .0
        .into_iter()
        .map(|(id, (status, effect, items))| {
            Finding::new(
                id,
                "cluster",
                status,
                effect,
                format!("{}: {}", what(id), items.join("; ")),
                hint(id, ns),
            )
        })
        .collect();
    let protected = docs
        .iter()
        .filter(|d| d.verdict == Verdict::Protected)
        .count();
    findings.push(Finding::new(
        "cluster.nodes",
        "cluster",
        if nodes.is_empty() {
            Status::Warn
        } else {
            Status::Ok
        },
        Effect::None,
        format!(
            "{} Linux node{}: {protected} protected{}",
            nodes.len(),
            if nodes.len() == 1 { "" } else { "s" },
            f.daemonset.as_ref().map_or(String::new(), |d| format!(
                "; DaemonSet {}: {} desired, {} ready, {} up to date",
                d.name, d.desired, d.ready, d.updated
            ))
        ),
        hint("cluster.nodes", ns),
    ));
    let j = judge::conclude(
        findings,
        Some(format!(
            "every Linux node ({}) runs a ready interlock agent and no meshed pod is labelled unprotected",
            nodes.len()
        )),
    );
    (j, docs)
}

/// The DaemonSets of other meshes' CNI plugins, by the names and labels their own
/// charts give them: istio's `istio-cni-node` (`k8s-app`/`app: istio-cni-node`,
/// `app.kubernetes.io/name: istio-cni`), linkerd2-cni's `linkerd-cni`
/// (`k8s-app: linkerd-cni`, `linkerd.io/cni-resource`), consul-k8s's `<release>-cni`
/// (`app: consul`, `component: cni`) and kuma's `kuma-cni-node` (`app: kuma-cni`).
pub fn mesh_cni_of(name: &str, labels: &BTreeMap<String, String>) -> Option<&'static str> {
    let label = |k: &str| labels.get(k).map(String::as_str);
    if name == "istio-cni-node"
        || name.starts_with("istio-cni-node-")
        || label("k8s-app") == Some("istio-cni-node")
        || label("app") == Some("istio-cni-node")
        || label("app.kubernetes.io/name") == Some("istio-cni")
    {
        Some("istio-cni")
    } else if name == "linkerd-cni"
        || label("k8s-app") == Some("linkerd-cni")
        || label("linkerd.io/cni-resource") == Some("true")
    {
        Some("linkerd-cni")
    } else if (label("app") == Some("consul") && label("component") == Some("cni"))
        || name == "consul-cni"
        || name.ends_with("-consul-cni")
    {
        Some("consul-cni")
    } else if name == "kuma-cni-node" || label("app") == Some("kuma-cni") {
        Some("kuma-cni")
    } else {
        None
    }
}

/// One call `check cluster` makes, named in an error.
struct Call {
    verb: &'static str,
    resource: &'static str,
    /// `in every namespace`, `in namespace x`, or empty (cluster-scoped).
    scope: String,
}

impl Call {
    fn new(verb: &'static str, resource: &'static str, scope: String) -> Call {
        Call {
            verb,
            resource,
            scope,
        }
    }
}

impl std::fmt::Display for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.verb, self.resource)?;
        if !self.scope.is_empty() {
            write!(f, " {}", self.scope)?;
        }
        Ok(())
    }
}

/// Why the API could not be read, in words: the finding's id, message and hint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiProblem {
    /// `check.api-unreachable`, `check.api-unauthorized`, `check.api-forbidden`, …
    pub id: &'static str,
    /// What failed.
    pub message: String,
    /// What to do.
    pub hint: String,
}

/// The innermost cause of an error chain: what actually happened (`Connection refused
/// (os error 111)`), and whether it was a refused connection.
fn root_cause(e: &(dyn std::error::Error + 'static)) -> (String, bool) {
    let mut cur = e;
    let mut refused = false;
    loop {
        if let Some(io) = cur.downcast_ref::<std::io::Error>() {
            refused |= io.kind() == std::io::ErrorKind::ConnectionRefused;
        }
        match cur.source() {
            Some(next) => cur = next,
            None => return (cur.to_string(), refused),
        }
    }
}

/// Turns a failed call into what failed and what to do (never a debug dump).
fn explain(call: &Call, e: &kube::Error, server: &str, creds: &str) -> ApiProblem {
    if let kube::Error::Api(status) = e {
        let said = if status.message.is_empty() {
            status.reason.clone()
        } else {
            status.message.clone()
        };
        return match status.code {
            401 => ApiProblem {
                id: "check.api-unauthorized",
                message: format!(
                    "the API server at {server} did not accept the credentials of {creds} (401 Unauthorized) to {call}: {said}"
                ),
                hint: format!(
                    "the credentials are missing, expired or revoked: renew them (for a managed cluster, its get-credentials command) or choose others with --kubeconfig/--context ({DOC_CHECK})"
                ),
            },
            403 => ApiProblem {
                id: "check.api-forbidden",
                message: format!(
                    "{creds} may not {call} (403 Forbidden): {said}"
                ),
                hint: format!(
                    "grant `{}` on `{}` {} to these credentials (check with kubectl auth can-i {} {}{}); check cluster needs list on nodes, on pods in every namespace and on daemonsets.apps ({DOC_CHECK})",
                    call.verb,
                    call.resource,
                    if call.scope.is_empty() { "(cluster-wide)" } else { &call.scope },
                    call.verb,
                    call.resource,
                    if call.scope == "in every namespace" { " -A" } else { "" },
                ),
            },
            code => ApiProblem {
                id: "check.api-error",
                message: format!(
                    "the API server at {server} answered {code} {} to {call}: {said}",
                    status.reason
                ),
                hint: format!("retry; if it stays, look at the API server's health ({DOC_CHECK})"),
            },
        };
    }
    let (cause, refused) = root_cause(e);
    if refused {
        return ApiProblem {
            id: "check.api-unreachable",
            message: format!(
                "nothing accepts connections at {server} (connection refused) to {call}"
            ),
            hint: format!(
                "is the API server up, and is {server} its address? The address comes from {creds}; pick another with --kubeconfig/--context ({DOC_CHECK})"
            ),
        };
    }
    ApiProblem {
        id: "check.api-unreachable",
        message: format!("could not {call} at {server}: {cause}"),
        hint: format!(
            "check the network path to {server} and the kubeconfig's server address and certificate authority ({creds}; --kubeconfig, --context) ({DOC_CHECK})"
        ),
    }
}

/// Reads the facts from the API: nodes, the agent pods, the pods labelled unprotected,
/// and the DaemonSets of other meshes' CNI plugins (with their pods).
async fn gather(
    client: kube::Client,
    namespace: &str,
    selector: &str,
    server: &str,
    creds: &str,
) -> Result<ClusterFacts, ApiProblem> {
    use k8s_openapi::api::apps::v1::DaemonSet;
    use k8s_openapi::api::core::v1::{Node, Pod};
    use kube::api::{Api, ListParams};
    let fail = |call: Call| move |e: kube::Error| explain(&call, &e, server, creds);
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(fail(Call::new("list", "nodes", String::new())))?;
    let agents = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(selector))
        .await
        .map_err(fail(Call::new(
            "list",
            "pods",
            format!("in namespace {namespace}"),
        )))?;
    let unprotected = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{LABEL_UNPROTECTED}=true")))
        .await
        .map_err(fail(Call::new("list", "pods", "in every namespace".into())))?;
    // Leftover mesh CNIs are a migration check: without the right to list DaemonSets
    // the rest of the check still stands, and says what it could not look at.
    let daemonsets = Api::<DaemonSet>::all(client.clone())
        .list(&ListParams::default())
        .await;
    let daemonset = daemonsets
        .as_ref()
        .ok()
        .and_then(|list| own_daemonset(&list.items, namespace));
    let node_pools = node_pools(&client, server, creds).await;
    let guard = guard_facts(&client, namespace).await;
    let mesh_cni = match daemonsets {
        Err(e) => Err(explain(
            &Call::new("list", "daemonsets.apps", "in every namespace".into()),
            &e,
            server,
            creds,
        )
        .message),
        Ok(list) => Ok(mesh_cnis(&client, &list.items, server, creds).await?),
    };
    let node_of = |p: &Pod| {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default()
    };
    Ok(ClusterFacts {
        cli_version: interlock_buildinfo::CRATE_VERSION.to_string(),
        namespace: namespace.to_string(),
        mesh_cni,
        daemonset,
        node_pools,
        guard,
        nodes: nodes.items.iter().map(node_facts).collect(),
        agents: agents.items.iter().map(agent_facts).collect(),
        unprotected: unprotected
            .items
            .iter()
            .map(|p| PodRef {
                namespace: p.metadata.namespace.clone().unwrap_or_default(),
                name: p.metadata.name.clone().unwrap_or_default(),
                node: node_of(p),
            })
            .collect(),
    })
}

/// Guard mode from interlock's ConfigMap (`interlock manifests` renders the agents'
/// settings there). Not readable or not there: judged as interlock's own mode, which is
/// what the node checks then show.
async fn guard_facts(client: &kube::Client, namespace: &str) -> Option<GuardFacts> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let cm = kube::api::Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .get_opt(CONFIG_MAP_NAME)
        .await
        .ok()??;
    let data = cm.data?;
    if data.get("INTERLOCK_CONFIG_MODE").map(String::as_str) != Some("guard") {
        return None;
    }
    let mesh: interlock_contract::guard::GuardedMesh =
        data.get("INTERLOCK_GUARD_MESH")?.parse().ok()?;
    Some(GuardFacts {
        plugin: mesh.plugin_type(),
        taint_effect: data
            .get("INTERLOCK_TAINT_EFFECT")
            .cloned()
            .unwrap_or_else(|| "NoSchedule".into()),
    })
}

/// The rollout of the agent's own DaemonSet, when `namespace` has it.
fn own_daemonset(
    daemonsets: &[k8s_openapi::api::apps::v1::DaemonSet],
    namespace: &str,
) -> Option<DaemonSetFacts> {
    let ds = daemonsets.iter().find(|d| {
        d.metadata.name.as_deref() == Some(DAEMONSET_NAME)
            && d.metadata.namespace.as_deref() == Some(namespace)
    })?;
    let st = ds.status.as_ref()?;
    Some(DaemonSetFacts {
        name: format!("{namespace}/{DAEMONSET_NAME}"),
        desired: st.desired_number_scheduled,
        ready: st.number_ready,
        updated: st.updated_number_scheduled.unwrap_or(0),
    })
}

/// The DaemonSets of other meshes' CNI plugins among `daemonsets`, each with the nodes
/// its pods run on (listed by its selector).
async fn mesh_cnis(
    client: &kube::Client,
    daemonsets: &[k8s_openapi::api::apps::v1::DaemonSet],
    server: &str,
    creds: &str,
) -> Result<Vec<MeshCniFacts>, ApiProblem> {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, ListParams};
    let mut found = Vec::new();
    for ds in daemonsets {
        let name = ds.metadata.name.clone().unwrap_or_default();
        let ds_ns = ds.metadata.namespace.clone().unwrap_or_default();
        let labels = ds.metadata.labels.clone().unwrap_or_default();
        let Some(mesh) = mesh_cni_of(&name, &labels) else {
            continue;
        };
        let selector = ds
            .spec
            .as_ref()
            .and_then(|s| s.selector.match_labels.clone())
            .unwrap_or_default()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        let nodes = if selector.is_empty() {
            Vec::new()
        } else {
            let call = Call::new("list", "pods", format!("in namespace {ds_ns}"));
            Api::<Pod>::namespaced(client.clone(), &ds_ns)
                .list(&ListParams::default().labels(&selector))
                .await
                .map_err(|e| explain(&call, &e, server, creds))?
                .items
                .iter()
                .filter_map(|p| p.spec.as_ref()?.node_name.clone())
                .collect()
        };
        let tolerations = ds
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|p| p.tolerations.clone())
            .unwrap_or_default();
        found.push(MeshCniFacts {
            mesh,
            daemonset: format!("{ds_ns}/{name}"),
            nodes,
            tolerations,
        });
    }
    Ok(found)
}

/// What `check cluster` needs of a node: its OS, Ready condition and startup taint.
fn node_facts(n: &k8s_openapi::api::core::v1::Node) -> NodeFacts {
    NodeFacts {
        name: n.metadata.name.clone().unwrap_or_default(),
        linux: n
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("kubernetes.io/os"))
            .is_none_or(|os| os == "linux"),
        condition: n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == CONDITION_READY))
            .map(|c| ConditionFacts {
                status: c.status.clone(),
                reason: c.reason.clone().unwrap_or_default(),
                message: c.message.clone().unwrap_or_default(),
            }),
        taint: n
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .and_then(|t| t.iter().find(|t| t.key == TAINT_NOT_READY))
            .map(|t| t.effect.clone()),
    }
}

/// The name `interlock manifests` gives the agent's DaemonSet.
const DAEMONSET_NAME: &str = "interlock-node";
/// The agents' settings, as `interlock manifests` renders them.
const CONFIG_MAP_NAME: &str = crate::manifests::AGENT_CONFIG_MAP;

/// Karpenter's NodePools and where each puts the startup taint. A cluster without
/// Karpenter serves no such resource (404): no pools, nothing to say.
async fn node_pools(
    client: &kube::Client,
    server: &str,
    creds: &str,
) -> Result<Vec<NodePoolFacts>, String> {
    use kube::api::{Api, ApiResource, DynamicObject, ListParams};
    let resource = ApiResource {
        group: "karpenter.sh".into(),
        version: "v1".into(),
        api_version: "karpenter.sh/v1".into(),
        kind: "NodePool".into(),
        plural: "nodepools".into(),
    };
    let list = match Api::<DynamicObject>::all_with(client.clone(), &resource)
        .list(&ListParams::default())
        .await
    {
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(Vec::new()),
        Err(e) => {
            let call = Call::new("list", "nodepools.karpenter.sh", String::new());
            return Err(explain(&call, &e, server, creds).message);
        }
        Ok(list) => list,
    };
    let has = |pool: &DynamicObject, field: &str| {
        pool.data
            .pointer(&format!("/spec/template/spec/{field}"))
            .and_then(serde_json::Value::as_array)
            .is_some_and(|taints| {
                taints.iter().any(|t| {
                    t.get("key").and_then(serde_json::Value::as_str) == Some(TAINT_NOT_READY)
                })
            })
    };
    Ok(list
        .items
        .iter()
        .map(|pool| NodePoolFacts {
            name: pool.metadata.name.clone().unwrap_or_default(),
            startup_taint: has(pool, "startupTaints"),
            permanent_taint: has(pool, "taints"),
        })
        .collect())
}

/// An agent pod as the API shows it: its `agent` container's state (else the first's).
fn agent_facts(p: &k8s_openapi::api::core::v1::Pod) -> AgentPodFacts {
    let status = p.status.as_ref();
    let containers = status
        .and_then(|s| s.container_statuses.as_deref())
        .unwrap_or_default();
    let c = containers
        .iter()
        .find(|c| c.name == "agent")
        .or(containers.first());
    let waiting = c
        .and_then(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone())
        .filter(|r| !r.is_empty());
    let last_termination = c
        .and_then(|c| c.last_state.as_ref()?.terminated.as_ref())
        .map(|t| {
            let mut s = format!(
                "{}, exit code {}",
                t.reason.as_deref().unwrap_or("Terminated"),
                t.exit_code
            );
            if let Some(m) = t
                .message
                .as_deref()
                .map(str::trim)
                .filter(|m| !m.is_empty())
            {
                // The agent's last words (terminationMessagePath), one line.
                let line: String = m.lines().last().unwrap_or(m).chars().take(200).collect();
                s.push_str(&format!(": {line}"));
            }
            s
        });
    AgentPodFacts {
        name: p.metadata.name.clone().unwrap_or_default(),
        node: p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default(),
        phase: status
            .and_then(|s| s.phase.clone())
            .unwrap_or_else(|| "Unknown".into()),
        ready: status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
        version: p
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app.kubernetes.io/version"))
            .cloned(),
        restarts: c.map(|c| c.restart_count).unwrap_or(0),
        waiting,
        last_termination,
    }
}

/// The client for `check cluster`: `--kubeconfig` (else, in a pod without
/// `--context`, its service account; else `$KUBECONFIG`, else `~/.kube/config`) and
/// `--context`. Returns the client, the server's address and the credentials' name, or
/// why there is none, in words.
async fn connect(a: &ClusterArgs) -> Result<(kube::Client, String, String), ApiProblem> {
    let no_creds = |message: String, hint: &str| ApiProblem {
        id: "check.no-credentials",
        message,
        hint: format!("{hint} ({DOC_CHECK})"),
    };
    let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
        && std::path::Path::new("/var/run/secrets/kubernetes.io/serviceaccount/token").exists();
    let (path, from) = match (&a.kubeconfig, std::env::var_os("KUBECONFIG")) {
        (Some(p), _) => (Some(p.clone()), "--kubeconfig"),
        (None, _) if in_cluster && a.context.is_none() => (None, "the pod's service account"),
        (None, Some(p)) if !p.is_empty() => (Some(std::path::PathBuf::from(p)), "$KUBECONFIG"),
        _ => {
            let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
            match home.map(|h| h.join(".kube/config")).filter(|p| p.exists()) {
                Some(p) => (Some(p), "~/.kube/config"),
                None => return Err(no_creds(
                    "no Kubernetes credentials: not in a pod, no $KUBECONFIG, no ~/.kube/config"
                        .into(),
                    "give a kubeconfig with --kubeconfig or $KUBECONFIG",
                )),
            }
        }
    };
    let (mut config, creds) =
        match path {
            None => (
                kube::Config::incluster().map_err(|e| {
                    no_creds(
                        format!("the pod's service account cannot be used: {e}"),
                        "run check cluster with --kubeconfig",
                    )
                })?,
                "the pod's service account".to_string(),
            ),
            Some(path) => {
                let shown = path.display().to_string();
                if !path.exists() {
                    return Err(no_creds(
                        format!("kubeconfig {shown} (from {from}) does not exist"),
                        "give the path of a kubeconfig with --kubeconfig or $KUBECONFIG",
                    ));
                }
                let kc = kube::config::Kubeconfig::read_from(&path).map_err(|e| {
                    no_creds(
                        format!(
                            "kubeconfig {shown} (from {from}) cannot be read: {}",
                            root_cause(&e).0
                        ),
                        "fix the file, or give another with --kubeconfig",
                    )
                })?;
                if let Some(ctx) = &a.context {
                    if !kc.contexts.iter().any(|c| &c.name == ctx) {
                        let known: Vec<&str> =
                            kc.contexts.iter().map(|c| c.name.as_str()).collect();
                        return Err(no_creds(
                        format!(
                            "kubeconfig {shown} has no context {ctx:?} (it has: {})",
                            if known.is_empty() { "none".to_string() } else { known.join(", ") }
                        ),
                        "choose one of its contexts with --context (kubectl config get-contexts)",
                    ));
                    }
                }
                let options = kube::config::KubeConfigOptions {
                    context: a.context.clone(),
                    ..Default::default()
                };
                let config = kube::Config::from_custom_kubeconfig(kc, &options)
                    .await
                    .map_err(|e| {
                        no_creds(
                            format!("kubeconfig {shown} (from {from}): {}", root_cause(&e).0),
                            "fix the kubeconfig's current context (or choose one with --context)",
                        )
                    })?;
                let creds = match &a.context {
                    Some(c) => format!("kubeconfig {shown}, context {c}"),
                    None => format!("kubeconfig {shown}"),
                };
                (config, creds)
            }
        };
    // check asks once; retries would only stretch an outage past --timeout.
    config.default_retry = false;
    config.connect_timeout = Some(a.timeout);
    let server = config.cluster_url.to_string();
    let server = server.trim_end_matches('/').to_string();
    let client = kube::Client::try_from(config).map_err(|e| {
        no_creds(
            format!(
                "{creds}: cannot build a client for {server}: {}",
                root_cause(&e).0
            ),
            "fix the kubeconfig's cluster (its server and certificate authority)",
        )
    })?;
    Ok((client, server, creds))
}

/// Runs the check: connects (`--kubeconfig`, `--context`; in-cluster service account,
/// else `$KUBECONFIG` or `~/.kube/config`), gathers within `--timeout`, judges. Never
/// fails: what could not be read becomes a `could-not-check` report saying what failed
/// and what to do.
pub fn check_cluster(a: &ClusterArgs, now_ms: u64) -> ClusterReport {
    let mut settings = ClusterSettings {
        namespace: a.namespace.clone(),
        agent_selector: a.agent_selector.clone(),
        credentials: None,
    };
    let fail = |settings, p: ApiProblem| {
        ClusterReport::new(
            now_ms,
            settings,
            judge::could_not_check(p.id, p.message, p.hint),
            None,
            vec![],
        )
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            return fail(
                settings,
                ApiProblem {
                    id: "check.internal",
                    message: format!("cannot start a runtime: {e}"),
                    hint: String::new(),
                },
            )
        }
    };
    // The client's own logs (an ERROR line per failed connection) would repeat, badly,
    // what the finding says: none while check talks to the API.
    let quiet = tracing::subscriber::NoSubscriber::default();
    let got = tracing::subscriber::with_default(quiet, || {
        rt.block_on(async {
            let (client, server, creds) = connect(a).await.map_err(|p| (None, p))?;
            match tokio::time::timeout(
                a.timeout,
                gather(client, &a.namespace, &a.agent_selector, &server, &creds),
            )
            .await
            {
                Ok(Ok(f)) => Ok((f, creds)),
                Ok(Err(p)) => Err((Some(creds), p)),
                Err(_) => Err((
                    Some(creds.clone()),
                    ApiProblem {
                        id: "check.api-unreachable",
                        message: format!(
                            "the API server at {server} did not answer within {} s",
                            a.timeout.as_secs_f64()
                        ),
                        hint: format!(
                            "is {server} the API server, and reachable from here? A slow one: raise --timeout ({DOC_CHECK})"
                        ),
                    },
                )),
            }
        })
    });
    match got {
        Ok((facts, creds)) => {
            settings.credentials = Some(creds);
            let (j, nodes) = judge_cluster(&facts);
            ClusterReport::new(now_ms, settings, j, Some(nodes), facts.unprotected)
        }
        Err((creds, p)) => {
            settings.credentials = creds;
            fail(settings, p)
        }
    }
}

/// The table for people.
pub fn render(out: &mut impl Write, r: &ClusterReport, style: Style) -> std::io::Result<()> {
    writeln!(
        out,
        "interlock check cluster ({}, interlock {})",
        r.head.checked_at, r.head.interlock_version
    )?;
    writeln!(out)?;
    if let Some(nodes) = &r.nodes {
        let rows: Vec<[String; 5]> = nodes
            .iter()
            .map(|n| {
                [
                    n.name.clone(),
                    n.interlock_ready.clone().unwrap_or_else(|| "-".into()),
                    n.taint.clone().unwrap_or_else(|| "-".into()),
                    n.agent_pod
                        .as_ref()
                        .map(|a| {
                            let facts = AgentPodFacts {
                                name: a.name.clone(),
                                phase: a.phase.clone(),
                                ready: a.ready,
                                restarts: a.restarts,
                                waiting: a.waiting.clone(),
                                ..Default::default()
                            };
                            format!("{} ({})", a.name, agent_state(&facts))
                        })
                        .unwrap_or_else(|| "NONE".into()),
                    n.unprotected_pods.len().to_string(),
                ]
            })
            .collect();
        let head = [
            "NODE",
            "INTERLOCKREADY",
            "TAINT",
            "AGENT POD",
            "UNPROTECTED",
        ];
        let w: Vec<usize> = (0..5)
            .map(|i| {
                rows.iter()
                    .map(|r| r[i].chars().count())
                    .chain([head[i].len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |c: &[String; 5], last: &str| {
            format!(
                "  {:<w0$}  {:<w1$}  {:<w2$}  {:<w3$}  {:<w4$}  {last}",
                c[0],
                c[1],
                c[2],
                c[3],
                c[4],
                w0 = w[0],
                w1 = w[1],
                w2 = w[2],
                w3 = w[3],
                w4 = w[4]
            )
        };
        writeln!(out, "{}", line(&head.map(String::from), "VERDICT"))?;
        for (row, n) in rows.iter().zip(nodes) {
            writeln!(out, "{}", line(row, n.verdict.word()))?;
        }
        writeln!(out)?;
    }
    render_findings(out, &r.head.findings, style)?;
    writeln!(out)?;
    render_verdict(out, r.head.verdict, &r.head.summary, style)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, cond: Option<&str>, taint: bool) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            linux: true,
            condition: cond.map(|s| ConditionFacts {
                status: s.into(),
                reason: if s == "True" {
                    "Ready"
                } else {
                    "ConfigNotEffective"
                }
                .into(),
                message: "m".into(),
            }),
            taint: taint.then(|| "NoSchedule".into()),
        }
    }

    fn agent(node: &str, ready: bool) -> AgentPodFacts {
        AgentPodFacts {
            name: format!("interlock-node-{node}"),
            node: node.into(),
            phase: "Running".into(),
            ready,
            version: Some("0.2.0".into()),
            ..Default::default()
        }
    }

    fn verdict_of(docs: &[NodeDoc], name: &str) -> Verdict {
        docs.iter().find(|d| d.name == name).unwrap().verdict
    }

    #[test]
    fn every_node_state_gets_its_verdict() {
        let f = ClusterFacts {
            cli_version: "0.2.0".into(),
            nodes: vec![
                node("ok", Some("True"), false),
                node("gated", Some("False"), true),
                node("ungated", Some("False"), false),
                node("bare", None, false),
                node("bare-tainted", None, true),
                node("silent", None, false),
                node("sticky", Some("True"), true),
                NodeFacts {
                    linux: false,
                    ..node("win", None, false)
                },
            ],
            agents: vec![
                agent("ok", true),
                agent("gated", false),
                agent("ungated", true),
                agent("silent", true),
                agent("sticky", true),
            ],
            unprotected: vec![],
            ..Default::default()
        };
        let (j, docs) = judge_cluster(&f);
        assert_eq!(verdict_of(&docs, "ok"), Verdict::Protected);
        assert_eq!(verdict_of(&docs, "gated"), Verdict::AtRisk);
        assert_eq!(verdict_of(&docs, "ungated"), Verdict::Unprotected);
        assert_eq!(verdict_of(&docs, "bare"), Verdict::Unprotected);
        assert_eq!(verdict_of(&docs, "bare-tainted"), Verdict::AtRisk);
        assert_eq!(verdict_of(&docs, "silent"), Verdict::AtRisk);
        assert_eq!(verdict_of(&docs, "sticky"), Verdict::Protected);
        assert!(!docs.iter().any(|d| d.name == "win"), "not a Linux node");
        assert_eq!(j.verdict, Verdict::Unprotected);
        let ids: Vec<&str> = j.findings.iter().map(|f| f.id).collect();
        for id in [
            "cluster.no-agent",
            "cluster.no-agent-gated",
            "cluster.agent-not-ready",
            "cluster.not-ready",
            "cluster.not-ready-ungated",
            "cluster.no-condition",
            "cluster.tainted-while-ready",
            "cluster.nodes",
        ] {
            assert!(ids.contains(&id), "{id} in {ids:?}");
        }
        for f in &j.findings {
            assert!(f.status == Status::Ok || !f.hint.is_empty(), "{}", f.id);
            assert!(f.id.starts_with(f.area));
        }
    }

    #[test]
    fn a_labelled_pod_makes_its_node_unprotected_and_a_healthy_cluster_is_protected() {
        let mut f = ClusterFacts {
            cli_version: "0.2.1".into(),
            nodes: vec![node("n1", Some("True"), false)],
            agents: vec![agent("n1", true)],
            unprotected: vec![],
            ..Default::default()
        };
        let (j, _) = judge_cluster(&f);
        assert_eq!(j.verdict, Verdict::Protected, "{}", j.summary);
        f.unprotected.push(PodRef {
            namespace: "shop".into(),
            name: "web".into(),
            node: "n1".into(),
        });
        let (j, docs) = judge_cluster(&f);
        assert_eq!(j.verdict, Verdict::Unprotected);
        assert!(j.summary.contains("shop/web"), "{}", j.summary);
        assert_eq!(docs[0].unprotected_pods, ["shop/web"]);
    }

    /// An agent of another minor version than the CLI, and agents of several versions
    /// across nodes (a rollout), are named; neither makes a node unprotected.
    #[test]
    fn version_skew_and_mixed_versions_are_named() {
        let with = |n: &str, v: Option<&str>| AgentPodFacts {
            version: v.map(str::to_string),
            ..agent(n, true)
        };
        let mut f = ClusterFacts {
            cli_version: "0.2.0".into(),
            nodes: vec![
                node("a", Some("True"), false),
                node("b", Some("True"), false),
                node("c", Some("True"), false),
            ],
            agents: vec![
                with("a", Some("0.2.3")),
                with("b", Some("0.1.0")),
                with("c", None),
            ],
            unprotected: vec![],
            ..Default::default()
        };
        let (j, docs) = judge_cluster(&f);
        assert_eq!(j.verdict, Verdict::Protected, "{}", j.summary);
        let msg = |id: &str| {
            j.findings
                .iter()
                .find(|f| f.id == id)
                .map(|f| f.message.clone())
                .unwrap_or_else(|| panic!("no {id}: {:?}", j.findings))
        };
        let skew = msg("cluster.version-skew");
        assert!(
            skew.contains("0.1.0 on b") && skew.contains("unlabelled on c"),
            "{skew}"
        );
        assert!(
            !skew.contains("0.2.3"),
            "a patch release is not skew: {skew}"
        );
        let mixed = msg("cluster.mixed-versions");
        assert!(mixed.contains("0.2.3 on 1 node(s)"), "{mixed}");
        assert_eq!(
            docs[1].agent_pod.as_ref().unwrap().version.as_deref(),
            Some("0.1.0")
        );
        // One version everywhere, the CLI's minor: nothing said.
        f.agents = vec![
            with("a", Some("0.2.0")),
            with("b", Some("0.2.0")),
            with("c", Some("0.2.0")),
        ];
        let (j, _) = judge_cluster(&f);
        assert!(
            !j.findings.iter().any(|f| f.id.contains("version")),
            "{:?}",
            j.findings
        );
        assert_eq!(minor_of("1.22.3-rc.1"), "1.22");
        assert_eq!(minor_of("7"), "7");
    }

    /// Hints are built with the namespace the agent was found in.
    #[test]
    fn hints_name_the_agents_namespace() {
        let f = |namespace: &str| ClusterFacts {
            cli_version: "0.2.0".into(),
            nodes: vec![node("bare", None, false), node("busy", Some("True"), false)],
            agents: vec![AgentPodFacts {
                version: Some("0.1.0".into()),
                ..agent("busy", true)
            }],
            namespace: namespace.into(),
            ..Default::default()
        };
        let (j, _) = judge_cluster(&f("mesh-guard"));
        let hints: Vec<&str> = j.findings.iter().map(|f| f.hint.as_ref()).collect();
        assert!(
            hints
                .iter()
                .any(|h| h.contains("kubectl -n mesh-guard get ds")),
            "{hints:?}"
        );
        assert!(
            !hints.iter().any(|h| h.contains("interlock-system")),
            "{hints:?}"
        );
        let (j, _) = judge_cluster(&f(DEFAULT_NAMESPACE));
        assert!(j
            .findings
            .iter()
            .any(|f| f.hint.contains("kubectl -n interlock-system get ds")));
    }

    /// A crash-looping agent is named as such with its restarts and how it last ended
    /// (never "(Running)"); one that is ready again after restarts is a warning.
    #[test]
    fn a_crash_looping_agent_says_so_with_its_last_termination() {
        let looping = AgentPodFacts {
            restarts: 7,
            waiting: Some("CrashLoopBackOff".into()),
            last_termination: Some("Error, exit code 1: plugin config: field x".into()),
            ..agent("n1", false)
        };
        let restarted = AgentPodFacts {
            restarts: 1,
            last_termination: Some("OOMKilled, exit code 137".into()),
            ..agent("n2", true)
        };
        let f = ClusterFacts {
            cli_version: "0.2.0".into(),
            nodes: vec![
                node("n1", Some("False"), true),
                node("n2", Some("True"), false),
            ],
            agents: vec![looping.clone(), restarted],
            ..Default::default()
        };
        let (j, docs) = judge_cluster(&f);
        let finding = |id: &str| {
            j.findings
                .iter()
                .find(|f| f.id == id)
                .unwrap_or_else(|| panic!("no {id}: {:?}", j.findings))
        };
        let m = &finding("cluster.agent-crashlooping").message;
        assert!(
            m.contains("CrashLoopBackOff, 7 restarts") && m.contains("Error, exit code 1"),
            "{m}"
        );
        assert!(!j.findings.iter().any(|f| f.id == "cluster.agent-not-ready"));
        assert_eq!(finding("cluster.agent-crashlooping").status, Status::Fail);
        let r = finding("cluster.agent-restarted");
        assert_eq!(r.status, Status::Warn);
        assert!(
            r.message.contains("OOMKilled, exit code 137"),
            "{}",
            r.message
        );
        assert!(r.hint.contains("limits.memory"), "{}", r.hint);
        assert_eq!(verdict_of(&docs, "n1"), Verdict::AtRisk);
        assert_eq!(verdict_of(&docs, "n2"), Verdict::Protected);
        assert_eq!(agent_state(&looping), "CrashLoopBackOff, 7 restarts");
    }

    /// Other meshes' CNI DaemonSets, known by their charts' names and labels: on a node
    /// with interlock a hole, elsewhere a migration under way.
    #[test]
    fn other_meshes_cni_daemonsets_are_found_by_name_and_label() {
        let l = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(mesh_cni_of("istio-cni-node", &l(&[])), Some("istio-cni"));
        assert_eq!(
            mesh_cni_of("istio-cni-node-canary", &l(&[])),
            Some("istio-cni")
        );
        assert_eq!(
            mesh_cni_of("cni", &l(&[("app.kubernetes.io/name", "istio-cni")])),
            Some("istio-cni")
        );
        assert_eq!(mesh_cni_of("linkerd-cni", &l(&[])), Some("linkerd-cni"));
        assert_eq!(
            mesh_cni_of("x", &l(&[("linkerd.io/cni-resource", "true")])),
            Some("linkerd-cni")
        );
        assert_eq!(
            mesh_cni_of(
                "consul-consul-cni",
                &l(&[("app", "consul"), ("component", "cni")])
            ),
            Some("consul-cni")
        );
        assert_eq!(mesh_cni_of("kuma-cni-node", &l(&[])), Some("kuma-cni"));
        assert_eq!(
            mesh_cni_of("calico-node", &l(&[("k8s-app", "calico-node")])),
            None
        );
        assert_eq!(mesh_cni_of("interlock-node", &l(&[])), None);
        let f = ClusterFacts {
            cli_version: "0.2.0".into(),
            nodes: vec![node("a", Some("True"), false), node("b", None, true)],
            agents: vec![agent("a", true)],
            mesh_cni: Ok(vec![
                MeshCniFacts {
                    mesh: "istio-cni",
                    daemonset: "istio-system/istio-cni-node".into(),
                    nodes: vec!["a".into(), "b".into()],
                    tolerations: vec![],
                },
                MeshCniFacts {
                    mesh: "linkerd-cni",
                    daemonset: "linkerd-cni/linkerd-cni".into(),
                    nodes: vec!["b".into()],
                    tolerations: vec![],
                },
            ]),
            ..Default::default()
        };
        let (j, _) = judge_cluster(&f);
        let by = |id: &str| j.findings.iter().find(|f| f.id == id).unwrap();
        let both = by("cluster.other-mesh-cni");
        assert_eq!(both.status, Status::Fail);
        assert!(
            both.message
                .contains("istio-system/istio-cni-node also runs on a"),
            "{}",
            both.message
        );
        assert_eq!(j.verdict, Verdict::Unprotected);
        let elsewhere = by("cluster.other-mesh-cni-elsewhere");
        assert_eq!(elsewhere.status, Status::Warn);
        assert!(
            elsewhere.message.contains("linkerd-cni/linkerd-cni"),
            "{}",
            elsewhere.message
        );
        let unreadable = judge_cluster(&ClusterFacts {
            mesh_cni: Err("no right".into()),
            ..f
        })
        .0;
        assert!(unreadable
            .findings
            .iter()
            .any(|f| f.id == "cluster.daemonsets-unreadable" && f.status == Status::Warn));
    }

    /// Tolerations match as the scheduler matches them.
    #[test]
    fn tolerations_match_key_value_and_effect() {
        use k8s_openapi::api::core::v1::Toleration;
        let t =
            |key: Option<&str>, op: &str, value: Option<&str>, effect: Option<&str>| Toleration {
                key: key.map(str::to_string),
                operator: Some(op.to_string()),
                value: value.map(str::to_string),
                effect: effect.map(str::to_string),
                ..Default::default()
            };
        let k = TAINT_NOT_READY;
        for (tols, effect, want) in [
            (vec![t(None, "Exists", None, None)], "NoSchedule", true),
            (
                vec![t(None, "Exists", None, Some("NoSchedule"))],
                "NoSchedule",
                true,
            ),
            (
                vec![t(None, "Exists", None, Some("NoExecute"))],
                "NoSchedule",
                false,
            ),
            (vec![t(Some(k), "Exists", None, None)], "NoExecute", true),
            (
                vec![t(Some(k), "Equal", Some("true"), Some("NoSchedule"))],
                "NoSchedule",
                true,
            ),
            (
                vec![t(Some(k), "Equal", Some("false"), None)],
                "NoSchedule",
                false,
            ),
            (
                vec![t(Some("CriticalAddonsOnly"), "Exists", None, None)],
                "NoSchedule",
                false,
            ),
            (vec![], "NoSchedule", false),
        ] {
            assert_eq!(tolerates(&tols, k, effect), want, "{tols:?} {effect}");
        }
    }

    /// Karpenter's NodePools: without the startup taint, or with it as a permanent taint,
    /// a warning naming the pool; unreadable, a warning saying so; none (no Karpenter),
    /// nothing. interlock's DaemonSet counted in the nodes line, and a warning while not
    /// all its pods are ready and up to date.
    #[test]
    fn node_pools_and_the_daemonset_rollout_are_judged() {
        let pool = |name: &str, startup: bool, permanent: bool| NodePoolFacts {
            name: name.into(),
            startup_taint: startup,
            permanent_taint: permanent,
        };
        let base = ClusterFacts {
            cli_version: "0.2.0".into(),
            nodes: vec![node("a", Some("True"), false)],
            agents: vec![agent("a", true)],
            ..Default::default()
        };
        let ids = |f: &ClusterFacts| -> Vec<(&'static str, Status, String)> {
            judge_cluster(f)
                .0
                .findings
                .into_iter()
                .filter(|f| f.id != "cluster.nodes")
                .map(|f| (f.id, f.status, f.message))
                .collect()
        };
        assert!(ids(&base).is_empty(), "{:?}", ids(&base));
        let f = ClusterFacts {
            node_pools: Ok(vec![
                pool("good", true, false),
                pool("bare", false, false),
                pool("wrong", false, true),
                pool("both", true, true),
            ]),
            ..base.clone()
        };
        let found = ids(&f);
        let msg = |id: &str| {
            found
                .iter()
                .find(|(i, s, _)| *i == id && *s == Status::Warn)
                .map(|(_, _, m)| m.clone())
                .unwrap_or_else(|| panic!("no warning {id}: {found:?}"))
        };
        assert!(msg("cluster.nodepool-no-startup-taint").ends_with(": bare"));
        let permanent = msg("cluster.nodepool-permanent-taint");
        assert!(permanent.ends_with(": wrong; both"), "{permanent}");
        assert_eq!(judge_cluster(&f).0.verdict, Verdict::Protected);
        let f = ClusterFacts {
            node_pools: Err("may not list nodepools.karpenter.sh (403 Forbidden)".into()),
            ..base.clone()
        };
        assert_eq!(ids(&f)[0].0, "cluster.nodepools-unreadable");

        let ds = |ready, updated| DaemonSetFacts {
            name: "interlock-system/interlock-node".into(),
            desired: 3,
            ready,
            updated,
        };
        let f = ClusterFacts {
            daemonset: Some(ds(3, 3)),
            ..base.clone()
        };
        assert!(ids(&f).is_empty());
        let (j, _) = judge_cluster(&f);
        let nodes = j.findings.iter().find(|f| f.id == "cluster.nodes").unwrap();
        assert!(
            nodes.message.ends_with(
                "DaemonSet interlock-system/interlock-node: 3 desired, 3 ready, 3 up to date"
            ),
            "{}",
            nodes.message
        );
        for (ready, updated) in [(2, 3), (3, 1)] {
            let f = ClusterFacts {
                daemonset: Some(ds(ready, updated)),
                ..base.clone()
            };
            assert_eq!(ids(&f)[0].0, "cluster.daemonset-rollout");
        }
    }
}

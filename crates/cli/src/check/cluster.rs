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
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
    pub output: super::Output,
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
#[derive(Debug, Clone, PartialEq, Eq)]
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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterFacts {
    /// The version of this `interlock` (the CLI), `major.minor.patch`.
    pub cli_version: String,
    /// Every node.
    pub nodes: Vec<NodeFacts>,
    /// The agent's pods.
    pub agents: Vec<AgentPodFacts>,
    /// Pods labelled `interlock.dev/unprotected=true`.
    pub unprotected: Vec<PodRef>,
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

const HINT_NO_AGENT: &str = "check the DaemonSet (kubectl -n interlock-system get ds,pods -o wide): its nodeSelector and tolerations must reach every Linux node; register node pools with the startup taint so pods wait for the agent";
const HINT_AGENT_NOT_READY: &str =
    "read the agent's log on that node: kubectl -n interlock-system logs <pod>; `interlock check node` in the pod says why";
const HINT_NOT_READY_UNGATED: &str = "the agent runs with taintEffect none (or the taint was removed): set taintEffect NoSchedule so an unprotected node takes no pods, and see the condition's message";
const HINT_NOT_READY: &str =
    "the node takes no new pods until the agent is ready: see the condition's message and `interlock check node` on it";
const HINT_NO_CONDITION: &str = "the agent on that node never wrote its condition: does it run with --kube=auto and the RBAC of `interlock manifests`?";
const HINT_TAINTED: &str = "the agent removes the taint once ready; if it stays, the agent cannot patch the node (RBAC) — see its log";
const HINT_UNPROTECTED: &str = "an agent found these pods unprotected and, by its repair policy (report, or repairs that kept failing), left them so: see the pods' Events (Unprotected, RepairFailed) and delete them so they start again through interlock";

const HINT_VERSION_SKEW: &str = "use the interlock of the agents' release to check, or finish the upgrade: agents and CLI are supported at the same minor version (docs/operate.md, Upgrading)";
const HINT_MIXED: &str = "normal while a DaemonSet rollout runs (`kubectl -n interlock-system rollout status ds/interlock-node`); otherwise some nodes did not take the update";

/// `major.minor` of a version (the whole text when it has no two dots' worth).
fn minor_of(v: &str) -> &str {
    match v.match_indices('.').nth(1) {
        Some((i, _)) => &v[..i],
        None => v,
    }
}

/// Judges the cluster from what the API showed. Pure.
pub fn judge_cluster(f: &ClusterFacts) -> (Judgement, Vec<NodeDoc>) {
    let mut by_kind: BTreeMap<&'static str, (Status, Effect, Vec<String>)> = BTreeMap::new();
    let mut docs = Vec::new();
    let mut nodes: Vec<&NodeFacts> = f.nodes.iter().filter(|n| n.linux).collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    for n in &nodes {
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
        let tainted = n.taint.is_some();
        let mut problems: Vec<(&'static str, Status, Effect, String)> = Vec::new();
        let cond = n.condition.as_ref();
        let why = cond
            .map(|c| format!("{}: {}", c.reason, c.message))
            .unwrap_or_default();
        match agent {
            None if tainted => problems.push((
                "cluster.no-agent-gated",
                Status::Fail,
                Effect::Risk,
                "no agent pod; the startup taint keeps pods off".into(),
            )),
            None => problems.push((
                "cluster.no-agent",
                Status::Fail,
                Effect::Hole,
                "no agent pod and no startup taint: pods scheduled here start without interlock"
                    .into(),
            )),
            Some(a) if !a.ready => problems.push((
                "cluster.agent-not-ready",
                Status::Fail,
                Effect::Risk,
                format!("agent pod {} is not ready ({})", a.name, a.phase),
            )),
            Some(_) => {}
        }
        match cond.map(|c| c.status.as_str()) {
            Some("True") if tainted => problems.push((
                "cluster.tainted-while-ready",
                Status::Warn,
                Effect::None,
                "InterlockReady=True but the startup taint is still on".into(),
            )),
            Some("True") => {}
            Some(s) if tainted => problems.push((
                "cluster.not-ready",
                Status::Fail,
                Effect::Risk,
                format!("InterlockReady={s} ({why}); tainted, so no new pods land"),
            )),
            Some(s) => problems.push((
                "cluster.not-ready-ungated",
                Status::Fail,
                Effect::Hole,
                format!("InterlockReady={s} ({why}) and no startup taint: pods still land here"),
            )),
            // Without an agent, the missing condition is already said.
            None if agent.is_none() => {}
            None => problems.push((
                "cluster.no-condition",
                Status::Fail,
                Effect::Risk,
                "no InterlockReady condition: the agent has not reported to the API".into(),
            )),
        }
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
            by_kind
                .entry(id)
                .or_insert((*status, *effect, Vec::new()))
                .2
                .push(format!("{} ({msg})", n.name));
        }
        docs.push(NodeDoc {
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
            }),
            unprotected_pods: unprotected,
            problems: problems.into_iter().map(|p| p.3).collect(),
        });
    }
    // Labelled pods on no known Linux node still count.
    let known: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    for p in f
        .unprotected
        .iter()
        .filter(|p| !known.contains(&p.node.as_str()))
    {
        by_kind
            .entry("cluster.unprotected-pods")
            .or_insert((Status::Fail, Effect::Hole, Vec::new()))
            .2
            .push(format!(
                "{} (pod {}/{} labelled unprotected)",
                if p.node.is_empty() {
                    "no node"
                } else {
                    &p.node
                },
                p.namespace,
                p.name
            ));
    }
    // Version skew (docs/operate.md, "Upgrading"): agents and this CLI of one minor
    // version; several versions across nodes while a rollout runs.
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
        by_kind
            .entry("cluster.version-skew")
            .or_insert((Status::Warn, Effect::None, Vec::new()))
            .2
            .push(format!(
                "this interlock is {}; agents: {}",
                f.cli_version,
                off.join("; ")
            ));
    }
    if versions.len() > 1 {
        by_kind
            .entry("cluster.mixed-versions")
            .or_insert((Status::Warn, Effect::None, Vec::new()))
            .2
            .push(
                versions
                    .iter()
                    .map(|(v, nodes)| format!("{v} on {} node(s)", nodes.len()))
                    .collect::<Vec<_>>()
                    .join(", "),
            );
    }
    let mut findings: Vec<Finding> = by_kind
        .into_iter()
        .map(|(id, (status, effect, items))| {
            let (what, hint) = match id {
                "cluster.no-agent" => ("nodes without an interlock agent", HINT_NO_AGENT),
                "cluster.no-agent-gated" => ("nodes without an agent, gated", HINT_NO_AGENT),
                "cluster.agent-not-ready" => ("agent pods not ready", HINT_AGENT_NOT_READY),
                "cluster.not-ready-ungated" => {
                    ("nodes not ready and not gated", HINT_NOT_READY_UNGATED)
                }
                "cluster.not-ready" => ("nodes not ready", HINT_NOT_READY),
                "cluster.no-condition" => ("nodes without InterlockReady", HINT_NO_CONDITION),
                "cluster.tainted-while-ready" => ("nodes still tainted", HINT_TAINTED),
                "cluster.version-skew" => (
                    "agents of another minor version than this interlock",
                    HINT_VERSION_SKEW,
                ),
                "cluster.mixed-versions" => ("agents of several versions", HINT_MIXED),
                _ => ("meshed pods running unprotected", HINT_UNPROTECTED),
            };
            Finding::new(
                id,
                "cluster",
                status,
                effect,
                format!("{what}: {}", items.join("; ")),
                hint,
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
            "{} Linux node{}: {protected} protected",
            nodes.len(),
            if nodes.len() == 1 { "" } else { "s" }
        ),
        "the API lists no Linux node: is the kubeconfig's cluster the right one?",
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

/// Reads the facts from the API: three list calls.
async fn gather(
    client: kube::Client,
    namespace: &str,
    selector: &str,
) -> Result<ClusterFacts, String> {
    use k8s_openapi::api::core::v1::{Node, Pod};
    use kube::api::{Api, ListParams};
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("listing nodes: {e}"))?;
    let agents = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(selector))
        .await
        .map_err(|e| format!("listing the agent pods ({selector} in {namespace}): {e}"))?;
    let unprotected = Api::<Pod>::all(client)
        .list(&ListParams::default().labels(&format!("{LABEL_UNPROTECTED}=true")))
        .await
        .map_err(|e| format!("listing pods labelled {LABEL_UNPROTECTED}=true: {e}"))?;
    let node_of = |p: &Pod| {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default()
    };
    Ok(ClusterFacts {
        cli_version: interlock_buildinfo::CRATE_VERSION.to_string(),
        nodes: nodes
            .items
            .iter()
            .map(|n| NodeFacts {
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
            })
            .collect(),
        agents: agents
            .items
            .iter()
            .map(|p| AgentPodFacts {
                name: p.metadata.name.clone().unwrap_or_default(),
                node: node_of(p),
                phase: p
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_else(|| "Unknown".into()),
                ready: p
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
                version: p
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("app.kubernetes.io/version"))
                    .cloned(),
            })
            .collect(),
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

/// Runs the check: connects (in-cluster service account, else `$KUBECONFIG` or
/// `~/.kube/config`), gathers, judges. Never fails: what could not be read becomes a
/// `could-not-check` report.
pub fn check_cluster(a: &ClusterArgs, now_ms: u64) -> ClusterReport {
    let mut settings = ClusterSettings {
        namespace: a.namespace.clone(),
        agent_selector: a.agent_selector.clone(),
        credentials: None,
    };
    let fail = |settings, id, msg: String, hint| {
        ClusterReport::new(
            now_ms,
            settings,
            judge::could_not_check(id, msg, hint),
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
                "check.internal",
                format!("cannot start a runtime: {e}"),
                "",
            )
        }
    };
    let got = rt.block_on(async {
        let (client, creds) =
            match interlock_agent::kubernetes::connect().await {
                Ok(Some(c)) => c,
                Ok(None) => return Err((
                    None,
                    "no Kubernetes credentials: not in a pod, no $KUBECONFIG, no ~/.kube/config"
                        .to_string(),
                )),
                Err(e) => return Err((None, e)),
            };
        let creds = creds.to_string();
        match tokio::time::timeout(
            std::time::Duration::from_secs(30),
            gather(client, &a.namespace, &a.agent_selector),
        )
        .await
        {
            Ok(Ok(f)) => Ok((f, creds)),
            Ok(Err(e)) => Err((Some(creds), e)),
            Err(_) => Err((Some(creds), "the API did not answer within 30 s".into())),
        }
    });
    match got {
        Ok((facts, creds)) => {
            settings.credentials = Some(creds);
            let (mut j, nodes) = judge_cluster(&facts);
            j.findings = j
                .findings
                .into_iter()
                .map(|f| f.in_namespace(&a.namespace))
                .collect();
            ClusterReport::new(now_ms, settings, j, Some(nodes), facts.unprotected)
        }
        Err((creds, e)) => {
            settings.credentials = creds;
            fail(
                settings,
                "check.api-unreachable",
                format!("the Kubernetes API could not be read: {e}"),
                "set KUBECONFIG to a kubeconfig that can list nodes and pods (or run in a pod with the agent's service account)",
            )
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
                            format!("{} ({})", a.name, if a.ready { "ready" } else { &a.phase })
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

    /// A hint names the namespace the agent was installed in.
    #[test]
    fn hints_name_the_agents_namespace() {
        let f = Finding::new(
            "cluster.no-agent",
            "cluster",
            Status::Fail,
            Effect::Hole,
            "m".into(),
            HINT_NO_AGENT,
        );
        assert!(f.hint.contains("-n interlock-system"));
        let moved = f.clone().in_namespace("mesh-guard");
        assert!(
            moved.hint.contains("kubectl -n mesh-guard get ds"),
            "{}",
            moved.hint
        );
        assert!(!moved.hint.contains("interlock-system"), "{}", moved.hint);
        assert_eq!(f.clone().in_namespace(DEFAULT_NAMESPACE), f);
    }
}

//! The sandboxes half of `check node`: every ready sandbox on the node, listed over CRI,
//! with the verdict the agent's audit would give it. Read-only: nothing is repaired,
//! stopped or written.
//!
//! The decision is the audit's own: the pod's mesh decision
//! ([`interlock_redirect::decision::decide`] on the annotations the runtime holds, the
//! same the plugin got at ADD), the read-back of a meshed sandbox's netns cross-checked
//! with the plugin's record ([`interlock_agent::sandbox_audit::inspect`]), and the verdict
//! ([`interlock_agent::audit::judge`]).

use std::path::Path;
use std::time::Duration;

use interlock_agent::audit;
use interlock_agent::sandbox_audit::{self, Inspection};
use interlock_contract::config::{BackendChoice, PluginConfig};
use interlock_cri::{CriClient, SandboxFilter, SandboxState, SandboxStatus, Timeouts};
use interlock_redirect::backend::BackendKind;
use interlock_redirect::decision::Decision;
use serde::Serialize;

/// What listing the node's sandboxes gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxesSeen {
    /// Not asked (`--cri-endpoint none`).
    NotAsked,
    /// The runtime could not be asked: why.
    Unreachable(String),
    /// Every ready sandbox, with its verdict.
    Listed(Vec<SandboxDoc>),
}

/// A sandbox's verdict as `check` spells it (`-o json`: kebab-case).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SandboxVerdict {
    /// Meshed, and exactly its rules are in its netns.
    Protected,
    /// Meshed, and its rules are missing or differ.
    Unprotected,
    /// Not meshed, or excluded.
    NotMeshed,
    /// Could not be decided.
    Unknown,
}

impl SandboxVerdict {
    /// The word in the table.
    pub fn word(self) -> &'static str {
        match self {
            SandboxVerdict::Protected => "protected",
            SandboxVerdict::Unprotected => "UNPROTECTED",
            SandboxVerdict::NotMeshed => "not meshed",
            SandboxVerdict::Unknown => "unknown",
        }
    }
}

/// One sandbox in the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxDoc {
    /// The sandbox ID.
    pub id: String,
    /// `namespace/name` of its pod.
    pub pod: String,
    /// Its netns file, when the runtime named one.
    pub netns: Option<String>,
    /// The verdict.
    pub verdict: SandboxVerdict,
    /// Why, in words.
    pub reason: String,
}

/// The sandbox's entry from the audit's verdict.
pub fn doc(id: &str, pod: &str, netns: Option<&Path>, v: &audit::Verdict) -> SandboxDoc {
    let (verdict, reason) = match v {
        audit::Verdict::Protected => (
            SandboxVerdict::Protected,
            "meshed; its redirection reads back exactly as its spec".to_string(),
        ),
        audit::Verdict::Unprotected { reason } => (SandboxVerdict::Unprotected, reason.clone()),
        audit::Verdict::NotMeshed { reason } => (SandboxVerdict::NotMeshed, reason.clone()),
        audit::Verdict::Unknown { reason } => (SandboxVerdict::Unknown, reason.clone()),
    };
    SandboxDoc {
        id: id.to_string(),
        pod: pod.to_string(),
        netns: netns.map(|p| p.display().to_string()),
        verdict,
        reason,
    }
}

/// The backend to read a netns with when the plugin recorded none for it: the configured
/// one, or the node's detected one for `auto` (detected here, without writing the
/// agent's cache: `check` writes nothing).
pub(crate) fn backend_for(plugin: &PluginConfig) -> BackendKind {
    match plugin.backend {
        BackendChoice::Auto => interlock_redirect::backend::detect().kind,
        fixed => interlock_attach::protect::resolve_backend(fixed, &plugin.state_dir).0,
    }
}

/// The pod's mesh decision as the audit makes it without a Kubernetes API: a
/// host-network sandbox has no netns of its own to redirect in, and a profile that reads
/// the pod's spec (which the runtime does not keep) is judged by the spec the plugin
/// recorded when it installed the rules.
pub(crate) fn decision_of(plugin: &PluginConfig, s: &SandboxStatus) -> Decision {
    let meta = &s.metadata;
    interlock_redirect::decision::decide_sandbox(
        plugin,
        &meta.namespace,
        &meta.name,
        s.host_network,
        &s.annotations,
        None,
    )
    .or_recorded(|| sandbox_audit::recorded_spec(&plugin.state_dir, s.netns_path()?))
}

/// A sandbox's status, or why it could not be read.
pub(crate) type StatusRead = Result<SandboxStatus, String>;

/// The status (verbose: with the netns) of every ready sandbox at `endpoint`, or only of
/// pod `(namespace, name)`'s; a sandbox gone since the list is left out, one whose status
/// cannot be read carries the error. Fails when the runtime cannot be asked.
pub(crate) fn ready_statuses(
    endpoint: &str,
    pod: Option<(&str, &str)>,
) -> Result<Vec<(String, StatusRead)>, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    let timeouts = Timeouts {
        connect: Duration::from_secs(2),
        call: Duration::from_secs(5),
        ..Timeouts::default()
    };
    rt.block_on(async {
        let cri = CriClient::connect_with(endpoint, timeouts).await?;
        let listed = cri.list_sandboxes(&SandboxFilter::ready()).await?;
        let mut out = Vec::with_capacity(listed.len());
        for s in listed.into_iter().filter(|s| {
            pod.is_none_or(|(ns, name)| s.metadata.namespace == ns && s.metadata.name == name)
        }) {
            match cri.sandbox_status(&s.id, true).await {
                Ok(st) => out.push((s.id, Ok(st))),
                // Gone between the list and the status: not on the node any more.
                Err(e) if e.is_not_found() => {}
                Err(e) => out.push((s.id, Err(e.to_string()))),
            }
        }
        Ok::<_, interlock_cri::CriError>(out)
    })
    .map_err(|e| e.to_string())
}

/// Lists the ready sandboxes at `endpoint` and judges each with `plugin` (the entry the
/// agent writes). Never fails: an unreachable runtime is [`SandboxesSeen::Unreachable`].
pub fn list(endpoint: &str, plugin: &PluginConfig) -> SandboxesSeen {
    let statuses = match ready_statuses(endpoint, None) {
        Ok(s) => s,
        Err(e) => return SandboxesSeen::Unreachable(e),
    };
    let backend = backend_for(plugin);
    let mut docs = Vec::new();
    for (id, status) in statuses {
        let status = match status {
            Ok(s) => s,
            Err(e) => {
                docs.push(doc(&id, "", None, &audit::Verdict::Unknown { reason: e }));
                continue;
            }
        };
        if status.state != SandboxState::Ready || status.verbose.netns_closed == Some(true) {
            continue;
        }
        let pod = format!("{}/{}", status.metadata.namespace, status.metadata.name);
        let decision = decision_of(plugin, &status);
        let netns = status.netns_path();
        let verdict = match (&decision, netns) {
            (Decision::Meshed { spec, .. }, Some(path)) => {
                let spec = spec.as_installed();
                match sandbox_audit::inspect(path, &spec, &plugin.state_dir, backend, &id) {
                    Inspection::Gone => continue,
                    Inspection::Seen { rules, .. } => audit::judge(&decision, Some(&rules)),
                }
            }
            _ => audit::judge(&decision, None),
        };
        docs.push(doc(&id, &pod, netns, &verdict));
    }
    // Worst first, then by pod: the table reads from what needs attention.
    docs.sort_by(|a, b| {
        rank(a.verdict)
            .cmp(&rank(b.verdict))
            .then_with(|| a.pod.cmp(&b.pod))
            .then_with(|| a.id.cmp(&b.id))
    });
    SandboxesSeen::Listed(docs)
}

fn rank(v: SandboxVerdict) -> u8 {
    match v {
        SandboxVerdict::Unprotected => 0,
        SandboxVerdict::Unknown => 1,
        SandboxVerdict::Protected => 2,
        SandboxVerdict::NotMeshed => 3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn docs_carry_the_audits_verdicts_in_kebab_case() {
        let d = doc(
            "abc",
            "shop/web",
            Some(Path::new("/var/run/netns/x")),
            &audit::Verdict::Unprotected {
                reason: "meshed (istio) but …".into(),
            },
        );
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(v["verdict"], "unprotected");
        assert_eq!(v["netns"], "/var/run/netns/x");
        let n = doc(
            "abc",
            "shop/web",
            None,
            &audit::Verdict::NotMeshed { reason: "x".into() },
        );
        assert_eq!(serde_json::to_value(&n).unwrap()["verdict"], "not-meshed");
        assert!(rank(SandboxVerdict::Unprotected) < rank(SandboxVerdict::Protected));
    }

    #[test]
    fn host_network_sandboxes_are_not_meshed_whatever_their_annotations() {
        let mut a = BTreeMap::new();
        a.insert("interlock.dev/redirect".to_string(), "enabled".to_string());
        let status = |host_network, a: &BTreeMap<String, String>| SandboxStatus {
            id: "s".into(),
            metadata: interlock_cri::SandboxMetadata {
                name: "web".into(),
                namespace: "shop".into(),
                uid: "u".into(),
                attempt: 0,
            },
            state: SandboxState::Ready,
            created_at_nanos: 0,
            annotations: a.clone(),
            ips: vec![],
            host_network,
            runtime_handler: String::new(),
            verbose: Default::default(),
            info: BTreeMap::new(),
            labels: BTreeMap::new(),
        };
        let p = PluginConfig::default();
        assert!(matches!(
            decision_of(&p, &status(true, &a)),
            Decision::NotMeshed { .. }
        ));
        assert!(matches!(
            decision_of(&p, &status(false, &a)),
            Decision::Meshed { .. }
        ));
        // An Istio pod's spec is not in the runtime's copy: without a record of what the
        // plugin installed, the decision says so.
        a.insert("sidecar.istio.io/status".to_string(), "{}".to_string());
        a.remove("interlock.dev/redirect");
        assert!(matches!(
            decision_of(&p, &status(false, &a)),
            Decision::NeedsPodSpec { .. }
        ));
    }
}

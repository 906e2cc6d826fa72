//! `interlock inspect pod NS/NAME` and `interlock inspect netns PATH`: for one pod
//! network namespace, the spec that applies, the rules present, and the difference —
//! with the agent's audit verdict. Read-only.
//!
//! The spec comes from the pod's mesh decision (its annotations as the runtime holds
//! them, found over CRI; for a netns, the ready sandbox whose netns is that namespace),
//! else from `--annotation` flags, else from the plugin's record of the netns. The
//! difference is the audit's own read-back ([`interlock_agent::audit::inspect`]:
//! the backend's verify, cross-checked with the plugin's record). The rules present are
//! listed with the backend's own tool inside the netns (`nft list table inet interlock`,
//! `iptables-save -t nat`).
//!
//! Exit codes: 0 protected or not meshed, 2 unprotected, 3 could not decide (64, a usage
//! error, comes from `main`).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::{Args, Subcommand};
use interlock_agent::audit::decide::{self, RulesSeen};
use interlock_agent::audit::{self, Inspection};
use interlock_confdir::{self as confdir, Runtime};
use interlock_contract::layout::marker_path;
use interlock_contract::marker::ReadinessMarker;
use interlock_contract::shown::shown;
use interlock_contract::state::NetnsRecord;
use interlock_cri::SandboxStatus;
use interlock_redirect::backend::BackendKind;
use interlock_redirect::decision::Decision;
use interlock_redirect::netns::{NetnsId, PodNetns};
use interlock_redirect::{RedirectSpec, Verification};
use serde::Serialize;

use crate::check::report::Style;
use crate::check::sandboxes::{backend_for, decisions_of, ready_statuses, SandboxVerdict};
use crate::check::{self, Output};

/// `interlock inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    #[command(subcommand)]
    what: Target,
}

#[derive(Debug, Subcommand)]
enum Target {
    /// A pod on this node, found over CRI: its ready sandbox and that sandbox's netns.
    Pod {
        /// `namespace/name`.
        #[arg(value_parser = parse_pod)]
        pod: (String, String),
        #[command(flatten)]
        common: Common,
    },
    /// A network namespace file (`/var/run/netns/…`, `/proc/<pid>/ns/net`).
    Netns {
        /// The netns file.
        path: PathBuf,
        /// The pod's annotations, `key=value` (repeatable), when no sandbox over CRI
        /// owns this netns.
        #[arg(long = "annotation", value_parser = parse_annotation)]
        annotations: Vec<(String, String)>,
        #[command(flatten)]
        common: Common,
    },
}

/// Settings shared by both targets; each defaults to the agent's own environment.
#[derive(Debug, Args)]
struct Common {
    /// The agent's state dir (the plugin's netns records, the readiness marker).
    #[arg(
        long,
        env = "INTERLOCK_STATE_DIR",
        default_value = "/var/run/interlock"
    )]
    state_dir: PathBuf,
    /// The runtime's CRI socket [env: INTERLOCK_CRI_ENDPOINT; else the agent's marker;
    /// else containerd's socket]; `none` does not ask.
    #[arg(long)]
    cri_endpoint: Option<String>,
    /// The runtime's CNI conf dir, whose interlock-cni entry holds the plugin settings
    /// [env: INTERLOCK_CNI_CONF_DIR; else the agent's marker; else /etc/cni/net.d].
    #[arg(long)]
    cni_conf_dir: Option<PathBuf>,
    /// Whose loading rules decide which config is effective.
    #[arg(long, env = "INTERLOCK_RUNTIME", default_value = "containerd")]
    runtime: Runtime,
    /// As for `agent`: the plugin settings the agent writes into its entry.
    #[arg(long, env = "INTERLOCK_PLUGIN_CONFIG")]
    plugin_config: Option<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
    output: Output,
}

fn parse_pod(s: &str) -> Result<(String, String), String> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_string(), name.to_string()))
        }
        _ => Err(format!("{s:?}: expected namespace/name")),
    }
}

/// `key=value`, for `--annotation`.
pub(crate) fn parse_annotation(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s:?}: expected key=value"))
}

/// The spec that applies, and where it came from.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SpecDoc {
    /// `pod annotations`, `--annotation flags` or `the plugin's record`.
    pub source: String,
    /// The spec (both families, as the audit reads it).
    pub spec: RedirectSpec,
    /// Its hash.
    pub hash: String,
}

/// The document `inspect -o json` prints (schemaVersion 1, kind `Inspection`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InspectReport {
    /// Always 1.
    pub schema_version: u32,
    /// Always `Inspection`.
    pub kind: &'static str,
    /// The build of the `interlock` that inspected.
    pub interlock_version: &'static str,
    /// `namespace/name` of the pod (`null`: unknown).
    pub pod: Option<String>,
    /// Its sandbox ID (`null`: unknown).
    pub sandbox: Option<String>,
    /// The netns file.
    pub netns: Option<String>,
    /// Its identity `<dev>-<ino>`.
    pub netns_id: Option<String>,
    /// The verdict.
    pub verdict: SandboxVerdict,
    /// Why.
    pub reason: String,
    /// The exit code.
    pub exit_code: u8,
    /// The spec that applies (`null`: none — not meshed, or not known).
    pub spec: Option<SpecDoc>,
    /// The backend the rules were read with.
    pub backend: Option<BackendKind>,
    /// The plugin's record of the netns (`null`: none).
    pub record: Option<NetnsRecord>,
    /// The rules present, as the backend's tool lists them.
    pub rules_present: Vec<String>,
    /// How the rules present differ from the spec (empty: they match, or not read).
    pub difference: Vec<String>,
}

impl InspectReport {
    fn failed(reason: String) -> InspectReport {
        InspectReport {
            schema_version: 1,
            kind: "Inspection",
            interlock_version: interlock_buildinfo::VERSION,
            pod: None,
            sandbox: None,
            netns: None,
            netns_id: None,
            verdict: SandboxVerdict::Unknown,
            reason,
            exit_code: 3,
            spec: None,
            backend: None,
            record: None,
            rules_present: vec![],
            difference: vec![],
        }
    }
}

/// The exit code of a verdict.
pub fn exit_code(v: SandboxVerdict) -> u8 {
    match v {
        SandboxVerdict::Protected | SandboxVerdict::NotMeshed => 0,
        SandboxVerdict::Unprotected => 2,
        SandboxVerdict::Unknown => 3,
    }
}

/// Runs `interlock inspect`.
pub fn run(a: InspectArgs) -> anyhow::Result<std::process::ExitCode> {
    let (report, output) = match a.what {
        Target::Pod { pod, common } => (inspect_pod(&pod.0, &pod.1, &common), common.output),
        Target::Netns {
            path,
            annotations,
            common,
        } => (
            inspect_netns(&path, &annotations.into_iter().collect(), &common),
            common.output,
        ),
    };
    check::emit(&report, report.exit_code, output, |out, style| {
        render(out, &report, style)
    })
}

/// What the CRI side found: the sandbox and its status.
struct Found {
    status: SandboxStatus,
}

/// The ready sandboxes' statuses at `endpoint`, optionally only those of one pod.
fn statuses(endpoint: &str, pod: Option<(&str, &str)>) -> Result<Vec<SandboxStatus>, String> {
    ready_statuses(endpoint, pod)?
        .into_iter()
        .map(|(_, s)| s)
        .collect()
}

fn marker(c: &Common) -> Option<ReadinessMarker> {
    ReadinessMarker::read(&marker_path(&c.state_dir)).ok()
}

fn plugin_config(
    c: &Common,
    m: Option<&ReadinessMarker>,
) -> Result<interlock_contract::config::PluginConfig, String> {
    let (dir, _) = check::resolve_conf_dir(c.cni_conf_dir.as_deref(), m);
    // Without a readable conf dir the agent's default entry (or --plugin-config) holds.
    let effective = confdir::load(&dir, c.runtime, &[]).ok();
    check::audit_plugin_config(c.plugin_config.as_deref(), &c.state_dir, effective.as_ref())
}

fn inspect_pod(ns: &str, name: &str, c: &Common) -> InspectReport {
    let m = marker(c);
    let (endpoint, _) = check::resolve_cri_endpoint(c.cri_endpoint.as_deref(), m.as_ref());
    if endpoint == "none" {
        return InspectReport::failed(
            "a pod is found over CRI: set --cri-endpoint (or INTERLOCK_CRI_ENDPOINT)".into(),
        );
    }
    let plugin = match plugin_config(c, m.as_ref()) {
        Ok(p) => p,
        Err(e) => return InspectReport::failed(e),
    };
    let mut found = match statuses(&endpoint, Some((ns, name))) {
        Ok(s) => s,
        Err(e) => return InspectReport::failed(format!("listing sandboxes at {endpoint}: {e}")),
    };
    // The newest ready sandbox is the pod's current one.
    found.sort_by_key(|s| std::cmp::Reverse(s.created_at_nanos));
    let Some(status) = found.into_iter().next() else {
        return InspectReport::failed(format!(
            "no ready sandbox of pod {ns}/{name} at {endpoint}: the pod is not on this node, or not running"
        ));
    };
    let Some(path) = status.netns_path().map(Path::to_path_buf) else {
        let mut r = InspectReport::failed(format!(
            "the runtime names no netns for pod {ns}/{name}'s sandbox"
        ));
        if status.host_network {
            r.verdict = SandboxVerdict::NotMeshed;
            r.reason = "host-network sandbox: no pod netns to redirect in".into();
            r.exit_code = 0;
        }
        r.pod = Some(format!("{ns}/{name}"));
        r.sandbox = Some(status.id);
        return r;
    };
    inspect_at(&path, Some(Found { status }), None, &plugin, c)
}

fn inspect_netns(path: &Path, annotations: &BTreeMap<String, String>, c: &Common) -> InspectReport {
    let m = marker(c);
    let plugin = match plugin_config(c, m.as_ref()) {
        Ok(p) => p,
        Err(e) => return InspectReport::failed(e),
    };
    let id = match PodNetns::open(path) {
        Ok(p) => p.id(),
        Err(e) => return InspectReport::failed(e.to_string()),
    };
    let mut found = None;
    if annotations.is_empty() {
        let (endpoint, _) = check::resolve_cri_endpoint(c.cri_endpoint.as_deref(), m.as_ref());
        if endpoint != "none" {
            // A runtime that cannot be asked leaves the plugin's record as the source.
            if let Ok(all) = statuses(&endpoint, None) {
                found = all.into_iter().find(|s| {
                    s.netns_path()
                        .and_then(netns_id_of)
                        .is_some_and(|i| i == id)
                });
            }
        }
    }
    let given = (!annotations.is_empty()).then_some(annotations);
    inspect_at(
        path,
        found.map(|status| Found { status }),
        given,
        &plugin,
        c,
    )
}

fn netns_id_of(p: &Path) -> Option<NetnsId> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(p).ok()?;
    Some(NetnsId {
        dev: m.dev(),
        ino: m.ino(),
    })
}

fn inspect_at(
    path: &Path,
    found: Option<Found>,
    given: Option<&BTreeMap<String, String>>,
    plugin: &interlock_contract::config::PluginConfig,
    c: &Common,
) -> InspectReport {
    let mut r = InspectReport::failed(String::new());
    r.netns = Some(path.display().to_string());
    let id = netns_id_of(path);
    r.netns_id = id.map(|i| i.to_string());
    r.record = id.and_then(|i| audit::read_record(&c.state_dir, i));
    let sandbox_id = found
        .as_ref()
        .map(|f| f.status.id.clone())
        .unwrap_or_default();
    let (decision, source) = match (&found, given) {
        (Some(f), _) => {
            let m = &f.status.metadata;
            r.pod = Some(format!("{}/{}", m.namespace, m.name));
            r.sandbox = Some(f.status.id.clone());
            (decisions_of(plugin, &[&f.status]).pop(), "pod annotations")
        }
        (None, Some(a)) => (
            Some(
                interlock_redirect::decision::decide(
                    plugin,
                    "",
                    &path.display().to_string(),
                    Some(a),
                    None,
                )
                .or_recorded(|| {
                    r.record
                        .as_ref()
                        .and_then(|rec| serde_json::from_str::<RedirectSpec>(&rec.spec).ok())
                }),
            ),
            "--annotation flags",
        ),
        (None, None) => (None, "the plugin's record"),
    };
    let spec = match &decision {
        Some(Decision::Meshed { spec, .. }) => Some((**spec).clone()),
        Some(_) => None,
        None => r
            .record
            .as_ref()
            .and_then(|rec| serde_json::from_str::<RedirectSpec>(&rec.spec).ok()),
    };
    let spec = spec.map(|s| s.as_installed());
    let backend = r
        .record
        .as_ref()
        .map_or_else(|| backend_for(plugin), |rec| rec.backend);
    r.backend = Some(backend);
    r.rules_present = rules_present(path, backend);
    let seen = spec.as_ref().map(|s| match &found {
        Some(_) => match audit::inspect(path, s, &c.state_dir, backend, &sandbox_id) {
            Inspection::Gone => RulesSeen::Error("the netns is gone".into()),
            Inspection::Seen { rules, .. } => rules,
        },
        // Without a sandbox the record's attachments cannot be matched: the read-back
        // alone counts.
        None => match interlock_redirect::engine::check(path, s, backend) {
            Ok(Verification::Exact) => RulesSeen::Exact,
            Ok(Verification::Mismatch(d)) => RulesSeen::Mismatch(d),
            Err(e) => RulesSeen::Error(e.to_string()),
        },
    });
    if let Some(RulesSeen::Mismatch(d)) = &seen {
        r.difference = d.clone();
    }
    let verdict = match (&decision, &seen) {
        (Some(d), seen) => decide::judge(d, seen.as_ref()),
        (None, Some(RulesSeen::Exact)) => decide::Verdict::Protected,
        (None, Some(RulesSeen::Mismatch(d))) => decide::Verdict::Unprotected {
            reason: format!(
                "the plugin's record says it installed rules here, but they differ: {}",
                d.join("; ")
            ),
        },
        (None, Some(RulesSeen::Error(e))) => decide::Verdict::Unknown { reason: e.clone() },
        (None, Some(other)) => decide::Verdict::Unknown {
            reason: format!("{other:?}"),
        },
        (None, None) => decide::Verdict::Unknown {
            reason: "no sandbox over CRI owns this netns and the plugin has no record of it: pass the pod's --annotation key=value".into(),
        },
    };
    let doc = crate::check::sandboxes::doc(&sandbox_id, "", Some(path), &verdict);
    r.verdict = doc.verdict;
    r.reason = doc.reason;
    r.exit_code = exit_code(r.verdict);
    r.spec = spec.map(|s| SpecDoc {
        source: source.into(),
        hash: s.hash(),
        spec: s,
    });
    r
}

/// interlock's rules in the netns, as the backend's own tool lists them (one line each).
fn rules_present(path: &Path, backend: BackendKind) -> Vec<String> {
    let cmds: Vec<(&str, Vec<&str>)> = match backend {
        BackendKind::Nftables => vec![("nft", vec!["list", "table", "inet", "interlock"])],
        BackendKind::IptablesNft => vec![
            ("iptables-nft-save", vec!["-t", "nat"]),
            ("ip6tables-nft-save", vec!["-t", "nat"]),
        ],
        BackendKind::IptablesLegacy => vec![
            ("iptables-legacy-save", vec!["-t", "nat"]),
            ("ip6tables-legacy-save", vec!["-t", "nat"]),
        ],
    };
    let iptables = backend != BackendKind::Nftables;
    let listed = interlock_redirect::netns::in_netns(path, move || {
        let mut out = Vec::new();
        for (tool, args) in cmds {
            match Command::new(tool).args(&args).output() {
                Ok(o) if o.status.success() => out.extend(
                    String::from_utf8_lossy(&o.stdout)
                        .lines()
                        .filter(|l| !iptables || l.contains("IL_"))
                        // nft indents with tabs, which the report would show
                        // escaped: two spaces a level.
                        .map(|l| l.trim_end().replace('\t', "  "))
                        .filter(|l| !l.is_empty()),
                ),
                // nft fails when the table is absent: nothing of ours is there.
                Ok(_) => {}
                Err(e) => out.push(format!("({tool}: {e})")),
            }
        }
        out
    });
    listed.unwrap_or_else(|e| vec![format!("(cannot enter {}: {e})", path.display())])
}

/// The human output.
pub fn render(out: &mut impl Write, r: &InspectReport, style: Style) -> std::io::Result<()> {
    let none = || "-".to_string();
    writeln!(out, "pod:      {}", r.pod.clone().unwrap_or_else(none))?;
    writeln!(out, "sandbox:  {}", r.sandbox.clone().unwrap_or_else(none))?;
    writeln!(
        out,
        "netns:    {} ({})",
        r.netns.clone().unwrap_or_else(none),
        r.netns_id.clone().unwrap_or_else(none)
    )?;
    writeln!(
        out,
        "backend:  {}",
        r.backend.map(|b| b.to_string()).unwrap_or_else(none)
    )?;
    match &r.spec {
        Some(s) => writeln!(
            out,
            "spec:     from {} (hash {}):\n  {}",
            s.source,
            &s.hash[..12.min(s.hash.len())],
            serde_json::to_string(&s.spec).unwrap_or_default()
        )?,
        None => writeln!(out, "spec:     none")?,
    }
    writeln!(
        out,
        "record:   {}",
        r.record
            .as_ref()
            .map(|rec| format!(
                "installed by {} with {}, spec hash {}",
                rec.proven_by
                    .container_id
                    .chars()
                    .take(12)
                    .collect::<String>(),
                rec.backend,
                &rec.spec_hash[..12.min(rec.spec_hash.len())]
            ))
            .unwrap_or_else(|| "none".into())
    )?;
    writeln!(out, "rules present:")?;
    if r.rules_present.is_empty() {
        writeln!(out, "  (none of interlock's)")?;
    }
    for l in &r.rules_present {
        writeln!(out, "  {}", shown(l))?;
    }
    if !r.difference.is_empty() {
        writeln!(out, "difference:")?;
        for d in &r.difference {
            writeln!(out, "  {d}")?;
        }
    }
    writeln!(out)?;
    let (word, code) = match r.verdict {
        SandboxVerdict::Protected => ("PROTECTED", "1;32"),
        SandboxVerdict::NotMeshed => ("NOT MESHED", "1"),
        SandboxVerdict::Unprotected => ("UNPROTECTED", "1;31"),
        SandboxVerdict::Unknown => ("UNKNOWN", "1;33"),
    };
    writeln!(
        out,
        "{}",
        style.paint(code, &format!("{word}: {}", r.reason))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_and_annotation_arguments_are_checked() {
        assert_eq!(
            parse_pod("shop/web").unwrap(),
            ("shop".into(), "web".into())
        );
        for bad in ["shop", "/web", "shop/", "a/b/c"] {
            assert!(parse_pod(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_annotation("a=b=c").unwrap(),
            ("a".into(), "b=c".into())
        );
        assert!(parse_annotation("=x").is_err());
        assert!(parse_annotation("x").is_err());
        assert_eq!(exit_code(SandboxVerdict::NotMeshed), 0);
        assert_eq!(exit_code(SandboxVerdict::Unprotected), 2);
        assert_eq!(exit_code(SandboxVerdict::Unknown), 3);
    }
}

//! What `interlock check node` prints: the versioned JSON document (`-o json`, a public
//! interface) and the table for people, both from one [`NodeReport`].
//!
//! Schema rules (`schemaVersion` 1): keys are camelCase, enumerated values kebab-case;
//! a field is never wrapped as `{"Ok": …}`/`{"Err": …}` (an error is a sibling string
//! field); absent facts are `null`. New fields may be added without a version bump
//! (readers ignore unknown keys) — the per-sandbox verdicts arrived as the top-level
//! `sandboxes` array that way; renaming or removing a field bumps `schemaVersion`.

use super::judge::{BinaryFacts, Content, Finding, Judgement, Readyz, Stale, Status, Verdict};
use super::sandboxes::SandboxDoc;
use interlock_confdir::Effective;
use interlock_contract::marker::ReadinessMarker;
use interlock_contract::shown::{shown, shown_os};
use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The schema version of the JSON document.
pub const SCHEMA_VERSION: u32 = 1;

/// What every `check` document starts with: the schema, the build, the time, the verdict
/// and the findings.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Head {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// `NodeCheck` or `ClusterCheck`.
    pub kind: &'static str,
    /// The build of the `interlock` that checked.
    pub interlock_version: &'static str,
    /// When, RFC 3339 in UTC with milliseconds.
    pub checked_at: String,
    /// The verdict.
    pub verdict: Verdict,
    /// True only for `protected`.
    pub protected: bool,
    /// The process exit code for this verdict.
    pub exit_code: u8,
    /// One line: the verdict and why.
    pub summary: String,
    /// Every finding, worst first.
    pub findings: Vec<Finding>,
}

impl Head {
    /// The head of a `kind` document checked at `now_ms` with judgement `j`.
    pub fn new(kind: &'static str, now_ms: u64, j: Judgement) -> Head {
        Head {
            schema_version: SCHEMA_VERSION,
            kind,
            interlock_version: interlock_buildinfo::VERSION,
            checked_at: interlock_contract::time::format_ms(now_ms),
            verdict: j.verdict,
            protected: j.verdict == Verdict::Protected,
            exit_code: j.verdict.exit_code(),
            summary: j.summary,
            findings: j.findings,
        }
    }
}

/// The document `check node -o json` prints.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    /// Schema, build, time, verdict, findings.
    #[serde(flatten)]
    pub head: Head,
    /// The node (`NODE_NAME`, else the host name).
    pub node: String,
    /// Where `check` looked, and where each setting came from.
    pub settings: Settings,
    /// The conf dir as the runtime sees it (`null` when it could not be read).
    pub effective: Option<EffectiveDoc>,
    /// The file at `interlock-cni` in the bin dirs (`null`: none).
    pub binary: Option<BinaryDoc>,
    /// The agent's marker and `/readyz`.
    pub agent: AgentDoc,
    /// Every ready sandbox on the node with its verdict, worst first (`null`: not
    /// listed, see `settings.criEndpoint` and the `sandboxes.*` finding).
    pub sandboxes: Option<Vec<SandboxDoc>>,
}

/// Where `check` looked.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    /// The CNI conf dir.
    #[serde(serialize_with = "shown_path")]
    pub cni_conf_dir: PathBuf,
    /// The bin dirs, in search order.
    #[serde(serialize_with = "shown_paths")]
    pub cni_bin_dirs: Vec<PathBuf>,
    /// The agent's state dir.
    #[serde(serialize_with = "shown_path")]
    pub state_dir: PathBuf,
    /// `containerd` or `crio`.
    pub runtime: String,
    /// The agent's health address asked, or `none`.
    pub health_addr: String,
    /// Where the conf dir setting came from: `flag`, `env`, `marker` or `default`.
    pub cni_conf_dir_from: &'static str,
    /// The CRI endpoint the sandboxes were listed through, or `none`.
    pub cri_endpoint: String,
    /// Where it came from: `flag`, `env`, `marker` or `default`.
    pub cri_endpoint_from: &'static str,
}

fn shown_path<S: serde::Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&shown_os(p.as_os_str()))
}

fn shown_paths<S: serde::Serializer>(p: &[PathBuf], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(p.iter().map(|p| shown_os(p.as_os_str())))
}

/// One file of the conf dir.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FileDoc {
    /// Its path.
    pub path: String,
    /// `chosen`, `failed-load`, `skipped`, `loaded-not-default`, `duplicate-name`,
    /// `not-reached` or `ignored`.
    pub verdict: String,
    /// Why, in words.
    pub reason: String,
}

/// The network the runtime uses.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChosenDoc {
    /// Its path.
    pub path: String,
    /// `conflist` or `conf` (wrapped).
    pub format: String,
    /// The network name.
    pub network_name: String,
    /// The list's `cniVersion`.
    pub cni_version: String,
    /// Plugin types in order.
    pub plugins: Vec<String>,
}

/// The conf dir as the runtime sees it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EffectiveDoc {
    /// Whose rules.
    pub runtime: String,
    /// The dir.
    pub dir: String,
    /// The network used, or `null` (no network).
    pub chosen: Option<ChosenDoc>,
    /// Every entry, with its verdict.
    pub files: Vec<FileDoc>,
    /// One sentence.
    pub summary: String,
    /// Plugin types the chosen chain runs that no bin dir has.
    pub missing_plugins: Vec<String>,
    /// The file the agent would rewrite now, if any.
    pub stale: Option<StaleDoc>,
}

/// A stale owned copy.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StaleDoc {
    /// The file the runtime loads.
    pub file: String,
    /// What it is derived from.
    pub source: Option<String>,
    /// The first difference.
    pub difference: String,
}

impl EffectiveDoc {
    /// The document for `e`.
    pub fn new(e: &Effective, missing: &[String], stale: Option<&Stale>) -> EffectiveDoc {
        let word = |v: &dyn erased::Word| v.word();
        EffectiveDoc {
            runtime: e.runtime.to_string(),
            dir: shown_os(e.dir.as_os_str()),
            chosen: e.chosen.as_ref().map(|c| ChosenDoc {
                path: shown_os(c.path.as_os_str()),
                format: word(&c.format),
                network_name: c.network_name.clone(),
                cni_version: c.list.effective_version(),
                plugins: c
                    .list
                    .plugin_types()
                    .iter()
                    .map(|t| t.to_string())
                    .collect(),
            }),
            files: e
                .files
                .iter()
                .map(|f| FileDoc {
                    path: shown_os(f.path.as_os_str()),
                    verdict: word(&f.verdict),
                    reason: f.reason.clone(),
                })
                .collect(),
            summary: e.summary.clone(),
            missing_plugins: missing.to_vec(),
            stale: stale.map(|s| StaleDoc {
                file: s.file.clone(),
                source: s.source.clone(),
                difference: s.difference.clone(),
            }),
        }
    }
}

/// Serde enums as their one JSON word.
mod erased {
    pub trait Word {
        fn word(&self) -> String;
    }
    impl<T: serde::Serialize> Word for T {
        fn word(&self) -> String {
            serde_json::to_value(self)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default()
        }
    }
}

/// The plugin binary.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BinaryDoc {
    /// Where.
    pub path: String,
    /// Its VERSION answer's `supportedVersions` (`null` when it did not answer).
    pub supported_versions: Option<Vec<String>>,
    /// Why it did not answer VERSION.
    pub version_error: Option<String>,
    /// The build it reports (`null`: not an interlock plugin, or one too old to say).
    pub interlock_version: Option<String>,
    /// `matches`, `differs` or `unverified`.
    pub content: Content,
    /// The plugin compared with.
    pub plugin_source: Option<String>,
}

impl From<&BinaryFacts> for BinaryDoc {
    fn from(b: &BinaryFacts) -> BinaryDoc {
        BinaryDoc {
            path: shown_os(b.path.as_os_str()),
            supported_versions: b.versions.as_ref().ok().cloned(),
            version_error: b.versions.as_ref().err().cloned(),
            interlock_version: b.build.clone(),
            content: b.content.clone(),
            plugin_source: b.source.as_ref().ok().map(|p| shown_os(p.as_os_str())),
        }
    }
}

/// The agent as `check` saw it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentDoc {
    /// The readiness marker (`null`: none, see `markerError`).
    pub marker: Option<ReadinessMarker>,
    /// Why the marker could not be read.
    pub marker_error: Option<String>,
    /// `/readyz` (`null`: not asked).
    pub readyz: Option<ReadyzDoc>,
}

/// `/readyz` as asked.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadyzDoc {
    /// The address asked.
    pub address: String,
    /// The HTTP status (`null`: nobody answered).
    pub status: Option<u16>,
    /// Why nobody answered.
    pub error: Option<String>,
}

impl ReadyzDoc {
    /// The document for `r` asked at `address` (`None` when not asked).
    pub fn new(address: &str, r: &Readyz) -> Option<ReadyzDoc> {
        match r {
            Readyz::NotAsked => None,
            Readyz::Answered(code) => Some(ReadyzDoc {
                address: address.to_string(),
                status: Some(*code),
                error: None,
            }),
            Readyz::Unreachable(e) => Some(ReadyzDoc {
                address: address.to_string(),
                status: None,
                error: Some(e.clone()),
            }),
        }
    }
}

/// Assembles the report (everything but the judgement is passed through).
pub struct Parts {
    /// The node name.
    pub node: String,
    /// Unix ms of the check.
    pub now_ms: u64,
    /// Settings.
    pub settings: Settings,
    /// The conf dir document.
    pub effective: Option<EffectiveDoc>,
    /// The binary.
    pub binary: Option<BinaryDoc>,
    /// The agent.
    pub agent: AgentDoc,
    /// The sandboxes, when listed.
    pub sandboxes: Option<Vec<SandboxDoc>>,
}

impl NodeReport {
    /// The report from its parts and the judgement.
    pub fn new(p: Parts, j: Judgement) -> NodeReport {
        NodeReport {
            head: Head::new("NodeCheck", p.now_ms, j),
            node: p.node,
            settings: p.settings,
            effective: p.effective,
            binary: p.binary,
            agent: p.agent,
            sandboxes: p.sandboxes,
        }
    }
}

/// Colours for a terminal (none when the output is not one, or `NO_COLOR` is set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Style {
    /// Whether to emit ANSI colour codes.
    pub colour: bool,
}

impl Style {
    /// `s` in the ANSI colour `code` when colour is on.
    pub fn paint(self, code: &str, s: &str) -> String {
        if self.colour {
            format!("\u{1b}[{code}m{s}\u{1b}[0m")
        } else {
            s.to_string()
        }
    }
}

fn status_tag(s: Status) -> (&'static str, &'static str) {
    match s {
        Status::Ok => ("ok", "32"),
        Status::Warn => ("WARN", "33"),
        Status::Fail => ("FAIL", "31"),
    }
}

/// The table for people. Names from the conf dir are escaped (they can carry terminal
/// escape sequences).
pub fn render(out: &mut impl Write, r: &NodeReport, style: Style) -> std::io::Result<()> {
    writeln!(
        out,
        "interlock check node {} ({}, interlock {})",
        r.node, r.head.checked_at, r.head.interlock_version
    )?;
    writeln!(out)?;
    match &r.effective {
        Some(e) => {
            writeln!(out, "CNI conf dir {} as {} loads it:", e.dir, e.runtime)?;
            let names: Vec<String> = e
                .files
                .iter()
                .map(|f| {
                    Path::new(&f.path)
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_else(|| f.path.clone())
                })
                .collect();
            let nw = names
                .iter()
                .map(|n| n.chars().count())
                .max()
                .unwrap_or(0)
                .max(4);
            let vw = e
                .files
                .iter()
                .map(|f| f.verdict.len())
                .max()
                .unwrap_or(0)
                .max(7);
            if e.files.is_empty() {
                writeln!(out, "  (empty)")?;
            } else {
                writeln!(out, "  {:<nw$}  {:<vw$}  REASON", "FILE", "VERDICT")?;
            }
            for (f, name) in e.files.iter().zip(&names) {
                writeln!(out, "  {name:<nw$}  {:<vw$}  {}", f.verdict, f.reason)?;
            }
        }
        None => writeln!(
            out,
            "CNI conf dir {}: not read",
            r.settings.cni_conf_dir.display()
        )?,
    }
    writeln!(out)?;
    if let Some(list) = &r.sandboxes {
        render_sandboxes(out, list, &r.settings.cri_endpoint, style)?;
        writeln!(out)?;
    }
    render_findings(out, &r.head.findings, style)?;
    writeln!(out)?;
    render_verdict(out, r.head.verdict, &r.head.summary, style)
}

/// The findings table: status, id, message and hint.
pub fn render_findings(
    out: &mut impl Write,
    findings: &[Finding],
    style: Style,
) -> std::io::Result<()> {
    let iw = findings.iter().map(|f| f.id.len()).max().unwrap_or(0);
    writeln!(out, "  {:<4}  {:<iw$}  FINDING", "", "ID")?;
    for f in findings {
        let (tag, code) = status_tag(f.status);
        // Pad before painting: escape codes have no width.
        let tag = style.paint(code, &format!("{tag:<4}"));
        writeln!(out, "  {tag}  {:<iw$}  {}", f.id, f.message)?;
        if !f.hint.is_empty() {
            writeln!(out, "  {:<4}  {:<iw$}  hint: {}", "", "", f.hint)?;
        }
    }
    Ok(())
}

/// The one-line verdict, in the verdict's colour.
pub fn render_verdict(
    out: &mut impl Write,
    verdict: Verdict,
    summary: &str,
    style: Style,
) -> std::io::Result<()> {
    let code = match verdict {
        Verdict::Protected => "1;32",
        Verdict::AtRisk => "1;33",
        Verdict::Unprotected | Verdict::CouldNotCheck => "1;31",
    };
    writeln!(out, "{}", style.paint(code, summary))
}

/// The sandboxes table: pod, short sandbox ID, verdict, reason.
fn render_sandboxes(
    out: &mut impl Write,
    list: &[SandboxDoc],
    endpoint: &str,
    style: Style,
) -> std::io::Result<()> {
    use super::sandboxes::SandboxVerdict;
    writeln!(out, "Sandboxes on this node (CRI {endpoint}):")?;
    if list.is_empty() {
        return writeln!(out, "  (none ready)");
    }
    // Pod names come from the API: escape them like file names.
    let pods: Vec<String> = list.iter().map(|s| shown(&s.pod)).collect();
    let pw = pods
        .iter()
        .map(|p| p.chars().count())
        .max()
        .unwrap_or(0)
        .max(3);
    let vw = list
        .iter()
        .map(|s| s.verdict.word().len())
        .max()
        .unwrap_or(0)
        .max(7);
    writeln!(
        out,
        "  {:<pw$}  {:<12}  {:<vw$}  REASON",
        "POD", "SANDBOX", "VERDICT"
    )?;
    for (s, pod) in list.iter().zip(&pods) {
        let id: String = s.id.chars().take(12).collect();
        let word = format!("{:<vw$}", s.verdict.word());
        let word = match s.verdict {
            SandboxVerdict::Unprotected => style.paint("31", &word),
            SandboxVerdict::Unknown => style.paint("33", &word),
            SandboxVerdict::Protected => style.paint("32", &word),
            SandboxVerdict::NotMeshed => word,
        };
        writeln!(out, "  {pod:<pw$}  {id:<12}  {word}  {}", shown(&s.reason))?;
    }
    Ok(())
}

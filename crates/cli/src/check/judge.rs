//! The verdict on a node from what `check` observed: pure, so every case is unit-tested
//! without root. Each finding has a stable id and a hint (docs/check.md's findings
//! section has one entry per id); the verdict follows from the worst finding.

use super::sandboxes::{SandboxVerdict, SandboxesSeen};
use interlock_confdir::{self as confdir, Effective};
use interlock_contract::config::{PLUGIN_TYPE, POD_ANNOTATIONS_CAPABILITY};
use interlock_contract::guard::GuardRole;
use interlock_contract::marker::ReadinessMarker;
use interlock_contract::shown::{shown, shown_os};
use serde::Serialize;
use std::path::PathBuf;

/// Plugin types of other meshes' redirectors: with one in the same chain as
/// interlock-cni, a pod's traffic is redirected twice (two rule sets, two owners).
pub const OTHER_MESH_PLUGINS: &[&str] = &["istio-cni", "linkerd-cni", "consul-cni", "kuma-cni"];

/// Severity of a finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Pods started now could run unprotected, could not start, or protection is not
    /// kept up (see [`Finding::effect`]).
    Fail,
    /// Not a hole today, but worth fixing.
    Warn,
    /// As it should be.
    Ok,
}

/// What a failed finding means for a pod started now; decides the verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Effect {
    /// It could run without its redirection: UNPROTECTED.
    Hole,
    /// It cannot start, or protection is not kept up: AT RISK.
    Risk,
    /// Nothing (ok and warn findings).
    None,
}

/// What to do about a finding: a fixed sentence, or one built with what was found
/// (the agent's namespace).
pub type Hint = std::borrow::Cow<'static, str>;

/// One finding about the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Stable id (`area.what`), for scripts and the troubleshooting guide.
    pub id: &'static str,
    /// What was looked at: `config`, `binary`, `agent`.
    pub area: &'static str,
    /// `ok`, `warn` or `fail`.
    pub status: Status,
    /// What was found, in words an operator can act on.
    pub message: String,
    /// What to do (empty for `ok`).
    pub hint: Hint,
    #[serde(skip)]
    effect: Effect,
}

impl Finding {
    /// A finding; an `ok` one carries no hint.
    pub fn new(
        id: &'static str,
        area: &'static str,
        status: Status,
        effect: Effect,
        message: String,
        hint: impl Into<Hint>,
    ) -> Finding {
        Finding {
            id,
            area,
            status,
            message,
            hint: if status == Status::Ok {
                "".into()
            } else {
                hint.into()
            },
            effect,
        }
    }
}

/// The node's verdict (`-o json` spells it in kebab-case).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// A meshed pod started now gets its redirection, and the agent keeps it so.
    Protected,
    /// Pods started now are redirected or do not start, but something is wrong.
    AtRisk,
    /// A meshed pod started now could run without redirection.
    Unprotected,
    /// `check` itself could not look (the conf dir is missing, …).
    CouldNotCheck,
}

impl Verdict {
    /// The process exit code: 0 protected, 1 at risk, 2 unprotected, 3 could not check.
    pub fn exit_code(self) -> u8 {
        match self {
            Verdict::Protected => 0,
            Verdict::AtRisk => 1,
            Verdict::Unprotected => 2,
            Verdict::CouldNotCheck => 3,
        }
    }

    /// The word the verdict line starts with.
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Protected => "PROTECTED",
            Verdict::AtRisk => "AT RISK",
            Verdict::Unprotected => "UNPROTECTED",
            Verdict::CouldNotCheck => "COULD NOT CHECK",
        }
    }
}

/// Whether the file at `interlock-cni` is interlock's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Content {
    /// Byte for byte the plugin this interlock installs (the agent's own check).
    Matches,
    /// Not the plugin this interlock installs.
    Differs,
    /// Nothing to compare with (no plugin source next to this binary).
    Unverified,
}

/// What the plugin binary said about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BinaryFacts {
    /// Where the runtime would find it.
    pub path: PathBuf,
    /// Versions from its VERSION answer, or the error.
    pub versions: Result<Vec<String>, String>,
    /// The build it answered to VERSION (`interlockVersion`): only interlock's plugin has one.
    pub build: Option<String>,
    /// The content check against the plugin source.
    pub content: Content,
    /// The plugin source compared with (or why there was none).
    pub source: Result<PathBuf, String>,
    /// When the content differs: the SHA-256 of the installed binary and of the source,
    /// hex (two builds of one version are told apart only by their bytes).
    pub digests: Option<(String, String)>,
}

/// `/readyz`, as asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readyz {
    /// Not asked (`--health-addr none`).
    NotAsked,
    /// The agent answered with this HTTP status.
    Answered(u16),
    /// Nobody answered at the address (or it is not an address).
    Unreachable(String),
}

/// The agent would rewrite the file the runtime loads: it no longer matches its source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stale {
    /// The file the runtime loads.
    pub file: String,
    /// The file it is derived from, if the plan names one.
    pub source: Option<String>,
    /// The first difference, `where: now → would be`.
    pub difference: String,
}

/// Everything [`judge`] looks at.
pub struct Observed<'a> {
    /// The effective config.
    pub effective: &'a Effective,
    /// The binary, if found in a bin dir.
    pub binary: Option<&'a BinaryFacts>,
    /// The bin dirs searched (for messages).
    pub bin_dirs: &'a [PathBuf],
    /// The marker, or why it could not be read.
    pub marker: Result<&'a ReadinessMarker, String>,
    /// Now, unix ms.
    pub now_ms: u64,
    /// `/readyz`.
    pub readyz: &'a Readyz,
    /// Plugin types the chosen chain runs that no bin dir has (containerd loads the
    /// file anyway; every ADD then fails).
    pub missing_plugins: &'a [String],
    /// What the agent would rewrite, if anything.
    pub stale: Option<&'a Stale>,
    /// The node's sandboxes over CRI, with the audit's verdicts.
    pub sandboxes: &'a SandboxesSeen,
    /// The CRI endpoint asked (for messages).
    pub cri_endpoint: &'a str,
    /// The namespace the agent runs in, for the `kubectl -n` commands in hints.
    pub namespace: &'a str,
    /// When the runtime loads interlock's own copy: the file it was copied from.
    pub copied_from: Option<&'a str>,
    /// Why the runtime's own config says it reads another conf dir, if it does.
    pub unread_conf_dir: Option<&'a str>,
    /// The running agent's version (its `/metrics` `interlock_build_info`), when it
    /// answered.
    pub agent_version: Option<&'a str>,
}

/// The outcome of [`judge`].
#[derive(Debug, Clone)]
pub struct Judgement {
    /// The verdict.
    pub verdict: Verdict,
    /// One line: the verdict word and why.
    pub summary: String,
    /// Every finding, worst first.
    pub findings: Vec<Finding>,
}

const HINT_NO_NETWORK: &str = "make the primary CNI plugin write a valid config (its DaemonSet); fix or remove the file named above";
const HINT_NO_INTERLOCK: &str = "start the interlock agent on this node (it writes the config); if a file sorts ahead on purpose, list it in INTERLOCK_ALLOW_AHEAD";
const HINT_MISPLACED: &str = "let the agent write the entry (remove hand-written interlock-cni entries); it goes after the primary plugin, once";
const HINT_WAITING_FOR_PRIMARY: &str = "look at the primary CNI (its DaemonSet and logs): it has not written its config to the conf dir yet; the agent replaces the holding config as soon as it does";
const HINT_VERSION: &str = "use a cniVersion interlock-cni supports (INTERLOCK_MAX_CNI_VERSION caps what the agent writes)";
const HINT_CAPABILITY: &str = "let the agent write the entry, or add \"capabilities\": {\"io.kubernetes.cri.pod-annotations\": true} to it";
const HINT_PLUGIN_MISSING: &str = "install the primary's plugin binaries into the bin dir (the primary CNI's DaemonSet does this), or fix INTERLOCK_CNI_BIN_DIR";
const HINT_GUARD_HOLD: &str = "the mesh's CNI DaemonSet is not (or not yet) installed on this node: see `kubectl get pods -A -o wide` for its pod here and the agent's log for what it waits for (docs/guard-mode.md)";
const HINT_GUARD_MISSING: &str = "the agent is not running or not in guard mode: see `interlock check` after the agent is up (docs/guard-mode.md)";
const HINT_GUARD_ORDER: &str = "the mesh's installer placed its entry before interlock-cni: the agent keeps the order it finds rather than fight it (docs/guard-mode.md)";
const HINT_OTHER_MESH: &str = "remove the mesh's own CNI plugin (its CNI DaemonSet) before relying on interlock: see docs/migration.md";
const HINT_STALE: &str = "start the interlock agent (it rewrites the copy at once); until then pods get the old settings";
const HINT_BINARY_MISSING: &str =
    "start the interlock agent (it installs the plugin), or fix INTERLOCK_CNI_BIN_DIR";
const HINT_BINARY_BROKEN: &str =
    "start the interlock agent (it reinstalls and verifies the plugin)";
const HINT_NOT_INTERLOCK: &str = "another binary is installed as interlock-cni: find who wrote it; the agent replaces it with its own";
const HINT_OTHER_BUILD: &str =
    "the agent replaces it with the build it ships; if it does not, check that the agent runs";
const HINT_UNVERIFIED: &str = "run check where the plugin it ships is next to it (the agent's pod), or set INTERLOCK_PLUGIN_SOURCE";
fn hint_agent(namespace: &str) -> String {
    format!("look at the agent: kubectl -n {namespace} logs ds/interlock-node (or its journal)")
}
fn hint_skew_plugin(namespace: &str) -> String {
    format!("during a rollout this passes within a second (a new agent installs its own plugin at start); if it stays, the agent's plugin source (its image) holds another build, or something else writes interlock-cni: finish the rollout (kubectl -n {namespace} rollout status ds/interlock-node) and read the agent's log")
}
fn hint_skew_cli(namespace: &str) -> String {
    format!("check with the interlock of the agent's release: kubectl -n {namespace} exec ds/interlock-node -- interlock check node")
}
const HINT_CRI: &str = "set INTERLOCK_CRI_ENDPOINT (or --cri-endpoint) to the runtime's socket (kubelet's --container-runtime-endpoint) and run check as root, or `none` not to list sandboxes";
fn hint_sandbox_unprotected(namespace: &str) -> String {
    format!("the agent repairs these per its --repair-policy within one audit interval; if they stay unprotected, read its log (kubectl -n {namespace} logs ds/interlock-node) or delete the pods so they start again through interlock")
}
const HINT_SANDBOX_UNKNOWN: &str = "read each sandbox's reason above; fix the pod's annotations, or run check as root on the host (the agent's pod) so it can enter the pod's netns";
const HINT_CONF_DIR_UNREAD: &str = "set the agent's conf dir (INTERLOCK_CNI_CONF_DIR, the manifests' cniConfDir) to the one the runtime reads; see docs/install.md#which-conf-dir-the-runtime-reads";
const HINT_READYZ: &str = "set INTERLOCK_HEALTH_ADDR (or --health-addr) to the agent's health address, or `none` not to ask";

/// The verdict on a node, from what was observed, one area at a time. Pure.
pub fn judge(o: &Observed<'_>) -> Judgement {
    let (mut f, config_runs_us) = config_findings(o);
    if let Some(why) = o.unread_conf_dir {
        f.push(Finding::new(
            "config.conf-dir-unread",
            "config",
            Status::Warn,
            Effect::None,
            why.to_string(),
            HINT_CONF_DIR_UNREAD,
        ));
    }
    let (binary, binary_ok) = binary_findings(o);
    f.extend(binary);
    f.extend(agent_findings(o));
    f.extend(skew_findings(o));
    f.extend(sandbox_findings(o));
    let warns: Vec<&str> = f
        .iter()
        .filter(|x| x.status == Status::Warn)
        .map(|x| x.id)
        .collect();
    let protected = (config_runs_us && binary_ok).then(|| {
        let mut s =
            "a meshed pod started on this node now gets its redirection before it runs".to_string();
        if !warns.is_empty() {
            s.push_str(&format!(
                " (with {} warning{}: {})",
                warns.len(),
                if warns.len() == 1 { "" } else { "s" },
                warns.join(", ")
            ));
        }
        s
    });
    conclude(f, protected)
}

/// The config the runtime loads: whether it runs interlock-cni, and what is wrong
/// with it. Also says whether the config runs interlock (with a version it accepts).
fn config_findings(o: &Observed<'_>) -> (Vec<Finding>, bool) {
    let Some(chosen) = &o.effective.chosen else {
        let no_network = Finding::new(
            "config.no-network",
            "config",
            Status::Fail,
            Effect::Risk,
            // The summary already says "<runtime> has NO network: …".
            format!("{}: no pod can start", o.effective.summary),
            HINT_NO_NETWORK,
        );
        return (vec![no_network], false);
    };
    let file = LoadedFile::of(chosen);
    let (mut f, config_runs_us) = entry_findings(o, &file);
    if config_runs_us {
        f.extend(other_mesh_finding(&file));
        f.extend(guard_finding(&file));
    }
    f.extend(plugin_missing_finding(o, &file));
    if config_runs_us {
        f.extend(stale_finding(o));
    }
    (f, config_runs_us)
}

/// The file the runtime loads, as the config findings name it.
struct LoadedFile<'a> {
    chosen: &'a confdir::Chosen,
    /// Its file name.
    name: String,
    /// Its plugin types, in order, joined by arrows.
    chain: String,
    /// The other meshes' redirectors it runs ([`OTHER_MESH_PLUGINS`]), but for the one
    /// interlock-cni guards.
    other_meshes: Vec<&'static str>,
    /// interlock-cni's guard role in this file, when it guards a mesh's own plugin.
    guard: Option<GuardRole>,
    /// The file's plugin types, in order.
    types: Vec<String>,
}

impl<'a> LoadedFile<'a> {
    fn of(chosen: &'a confdir::Chosen) -> LoadedFile<'a> {
        let types = chain_types(&chosen.list);
        let guard = guard_role(&chosen.list);
        let guarded = guard.as_ref().map(|g| g.mesh.plugin_type());
        LoadedFile {
            chosen,
            name: shown_os(chosen.path.file_name().unwrap_or_default()),
            chain: chosen.list.plugin_types().join(" → "),
            other_meshes: OTHER_MESH_PLUGINS
                .iter()
                .copied()
                .filter(|m| Some(*m) != guarded && types.iter().any(|t| t == m))
                .collect(),
            guard,
            types,
        }
    }
}

/// The guard role of interlock-cni in the file the runtime loads, if any.
pub fn guard_role_of(e: &Effective) -> Option<GuardRole> {
    guard_role(&e.chosen.as_ref()?.list)
}

/// The guard role of the first interlock-cni entry of `list`, if it has one that parses
/// (one that does not is the plugin's error to report at ADD, and `entry_findings`').
fn guard_role(list: &interlock_libcni::NetworkConfigList) -> Option<GuardRole> {
    let entry = list
        .plugins()
        .iter()
        .find(|p| p.get("type").and_then(|t| t.as_str()) == Some(PLUGIN_TYPE))?;
    serde_json::from_value(entry.get("guard")?.clone()).ok()
}

/// In guard mode: whether the mesh's own plugin runs after interlock-cni's guard, or the
/// guard holds meshed pods back, and why.
fn guard_finding(file: &LoadedFile<'_>) -> Option<Finding> {
    let role = file.guard.as_ref()?;
    let t = role.mesh.plugin_type();
    let name = &file.name;
    let ours = file.types.iter().position(|x| x == PLUGIN_TYPE);
    let theirs = file.types.iter().position(|x| x == t);
    let reason = role
        .reason
        .as_deref()
        .map(|r| format!(" ({r})"))
        .unwrap_or_default();
    let finding = |id, status, effect, message: String, hint| {
        Some(Finding::new(id, "config", status, effect, message, hint))
    };
    match (theirs, role.hold) {
        (None, true) => finding(
            "guard.hold",
            Status::Fail,
            Effect::Risk,
            format!("{name} holds meshed pods: {t} is not in the chain{reason}; {} pods wait (\"try again later\") until it is, other pods start", role.mesh),
            HINT_GUARD_HOLD,
        ),
        (None, false) => finding(
            "guard.entry-missing",
            Status::Fail,
            Effect::Hole,
            format!("interlock-cni in {name} guards {t}, but the file does not run it and does not hold: {} pods started now get no redirection", role.mesh),
            HINT_GUARD_MISSING,
        ),
        (Some(_), true) => finding(
            "guard.hold",
            Status::Fail,
            Effect::Risk,
            format!("{name} runs {t}, but interlock-cni's guard still holds {} pods{reason}: they wait until the agent sees {t} usable", role.mesh),
            HINT_GUARD_HOLD,
        ),
        (Some(i), false) if ours.is_some_and(|o| o > i) => finding(
            "guard.order",
            Status::Warn,
            Effect::None,
            format!("{name} runs {t} before interlock-cni's guard: {t} still redirects, but a pod it fails is not held back first"),
            HINT_GUARD_ORDER,
        ),
        (Some(_), false) => finding(
            "guard.entry",
            Status::Ok,
            Effect::None,
            format!("{name} runs {t} after interlock-cni's guard: {} pods are redirected by {t}", role.mesh),
            "",
        ),
    }
}

/// Whether the loaded file runs interlock-cni, where it must and once; also says whether
/// it does, with a version the binary accepts.
fn entry_findings(o: &Observed<'_>, file: &LoadedFile<'_>) -> (Vec<Finding>, bool) {
    let rt = o.effective.runtime;
    let name = &file.name;
    let fail = |id, effect, message, hint| {
        let finding = Finding::new(id, "config", Status::Fail, effect, message, hint);
        (vec![finding], false)
    };
    // The same predicate the agent's readiness uses (thin Multus included).
    match confdir::runs_plugin(&file.chosen.list, name, PLUGIN_TYPE) {
        // The agent's own fail-closed stand-in for a missing primary: no pod
        // starts (none unprotected either); the primary is what is missing.
        Err(why) if file.chosen.list.name() == interlock_contract::layout::HOLDING_NETWORK => fail(
            "config.waiting-for-primary",
            Effect::Risk,
            format!("{rt} loads {why}: no pod can start on this node"),
            HINT_WAITING_FOR_PRIMARY,
        ),
        Err(why) if why.contains("does not contain") => {
            let by = if file.other_meshes.is_empty() {
                "pods started now get NO redirection".to_string()
            } else {
                format!(
                    "pods started now are redirected by {}, not by interlock",
                    file.other_meshes.join(" and ")
                )
            };
            fail(
                "config.no-interlock",
                Effect::Hole,
                format!(
                    "{rt} loads {name} ({}), which does not contain interlock-cni: {by}",
                    file.chain
                ),
                HINT_NO_INTERLOCK,
            )
        }
        Err(why) => fail(
            "config.interlock-misplaced",
            Effect::Risk,
            format!("{rt} loads {why}"),
            HINT_MISPLACED,
        ),
        Ok(running) => running_entry_findings(o, file, &running),
    }
}

/// The interlock-cni entry the loaded file runs: with a cniVersion the binary accepts
/// (then the config runs interlock), and declaring the pod-annotations capability.
fn running_entry_findings(
    o: &Observed<'_>,
    file: &LoadedFile<'_>,
    running: &confdir::RunningEntry<'_>,
) -> (Vec<Finding>, bool) {
    let rt = o.effective.runtime;
    let name = &file.name;
    let accepts = o
        .binary
        .and_then(|b| b.versions.as_ref().ok())
        .cloned()
        .unwrap_or_default();
    if let Some(why) = confdir::version_refused(name, PLUGIN_TYPE, &running.version, &accepts) {
        let refused = Finding::new(
            "config.version-refused",
            "config",
            Status::Fail,
            Effect::Risk,
            format!("{rt} loads {why}"),
            HINT_VERSION,
        );
        return (vec![refused], false);
    }
    let place = match running.placement {
        confdir::Placement::List => String::new(),
        confdir::Placement::MultusDelegate => {
            " (interlock-cni runs in its Multus delegate)".to_string()
        }
    };
    let copy = o
        .copied_from
        .map(|src| format!(" (interlock's copy of {src})"))
        .unwrap_or_default();
    let mut f = vec![Finding::new(
        "config.loaded",
        "config",
        Status::Ok,
        Effect::None,
        format!("{rt} loads {name}{copy}: {}{place}", file.chain),
        "",
    )];
    let declares = running
        .entry
        .get("capabilities")
        .and_then(|c| c.get(POD_ANNOTATIONS_CAPABILITY))
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
    if !declares {
        f.push(Finding::new(
            "config.no-annotations-capability",
            "config",
            Status::Warn,
            Effect::None,
            format!("the interlock-cni entry in {name} does not declare the {POD_ANNOTATIONS_CAPABILITY} capability: every ADD must ask the agent or the API"),
            HINT_CAPABILITY,
        ));
    }
    (f, true)
}

/// Another mesh's redirector in the same chain as interlock-cni (which runs).
fn other_mesh_finding(file: &LoadedFile<'_>) -> Option<Finding> {
    if file.other_meshes.is_empty() {
        return None;
    }
    Some(Finding::new(
        "config.other-mesh",
        "config",
        Status::Fail,
        Effect::Hole,
        format!(
            "{} runs {} in the same chain as interlock-cni: each pod's traffic is redirected twice, by two rule sets neither of which knows the other; interlock cannot vouch for the result",
            file.name,
            file.other_meshes.join(" and ")
        ),
        HINT_OTHER_MESH,
    ))
}

/// Plugins the loaded file runs that no bin dir has.
fn plugin_missing_finding(o: &Observed<'_>, file: &LoadedFile<'_>) -> Option<Finding> {
    if o.missing_plugins.is_empty() {
        return None;
    }
    Some(Finding::new(
        "config.plugin-missing",
        "config",
        Status::Fail,
        Effect::Risk,
        format!(
            "{} runs {} but no bin dir ({}) has {}: {} loads the file anyway and every ADD fails, so no pod can start",
            file.name,
            o.missing_plugins.join(", "),
            shown_dirs(o.bin_dirs),
            if o.missing_plugins.len() == 1 { "it" } else { "them" },
            o.effective.runtime
        ),
        HINT_PLUGIN_MISSING,
    ))
}

/// The loaded file (which runs interlock) is not what the agent would write now.
fn stale_finding(o: &Observed<'_>) -> Option<Finding> {
    let s = o.stale?;
    let from = s
        .source
        .as_deref()
        .map(|p| format!(" (from {})", shown(p)))
        .unwrap_or_default();
    Some(Finding::new(
        "config.stale",
        "config",
        Status::Fail,
        Effect::Risk,
        format!(
            "{} is not what the agent would write now{from}: {}; pods started now get the old settings",
            shown(&s.file),
            s.difference
        ),
        HINT_STALE,
    ))
}

/// The plugin binary the runtime would run. Also says whether it is interlock's.
fn binary_findings(o: &Observed<'_>) -> (Vec<Finding>, bool) {
    let fail = |id, effect, message, hint| {
        let finding = Finding::new(id, "binary", Status::Fail, effect, message, hint);
        (vec![finding], false)
    };
    let Some(b) = o.binary else {
        return fail(
            "binary.missing",
            Effect::Risk,
            format!(
                "interlock-cni is in none of the bin dirs ({}), or is not executable: ADD would fail",
                shown_dirs(o.bin_dirs)
            ),
            HINT_BINARY_MISSING,
        );
    };
    let path = shown_os(b.path.as_os_str());
    match (&b.versions, &b.content, &b.build) {
        (_, Content::Differs, None) | (Ok(_), Content::Unverified, None) => fail(
            "binary.not-interlock",
            Effect::Hole,
            format!(
                "{path} is not interlock's plugin: {}; whatever it does, it does not redirect pods",
                match &b.source {
                    Ok(src) if b.content == Content::Differs => format!(
                        "its content differs from {} and it does not answer VERSION as interlock-cni",
                        shown_os(src.as_os_str())
                    ),
                    _ => "it does not answer VERSION as interlock-cni".to_string(),
                }
            ),
            HINT_NOT_INTERLOCK,
        ),
        (Err(e), _, _) => fail(
            "binary.no-version",
            Effect::Risk,
            format!("{path} does not answer VERSION: {e}"),
            HINT_BINARY_BROKEN,
        ),
        (Ok(_), Content::Differs, Some(build)) => fail(
            "binary.other-build",
            Effect::Risk,
            other_build_message(&path, b, build),
            HINT_OTHER_BUILD,
        ),
        (Ok(v), content, build) => (interlock_binary_findings(&path, b, v, content, build), true),
    }
}

/// What `binary.other-build` says: interlock's plugin, but not the bytes this interlock
/// ships (the same version rebuilt, or another version).
fn other_build_message(path: &str, b: &BinaryFacts, build: &str) -> String {
    let source = b
        .source
        .as_ref()
        .map(|s| shown_os(s.as_os_str()))
        .unwrap_or_default();
    let digests = b
        .digests
        .as_ref()
        .map(|(i, s)| format!(" (sha256 {i} installed, {s} shipped)"))
        .unwrap_or_default();
    if build == interlock_buildinfo::VERSION {
        format!(
            "{path} is interlock-cni {build}, the same version as this interlock, but other bytes than {source}{digests}: another build of the same commit (a rebuild, other flags or another toolchain)"
        )
    } else {
        format!(
            "{path} is interlock-cni {build}, not the build this interlock ships ({}): it differs from {source}{digests}",
            interlock_buildinfo::VERSION
        )
    }
}

/// The binary is interlock's plugin (it answers VERSION as interlock-cni): whether its
/// content was compared with the plugin this interlock ships.
fn interlock_binary_findings(
    path: &str,
    b: &BinaryFacts,
    versions: &[String],
    content: &Content,
    build: &Option<String>,
) -> Vec<Finding> {
    let mut f = vec![Finding::new(
        "binary.ok",
        "binary",
        Status::Ok,
        Effect::None,
        format!(
            "{path} is interlock-cni {} (answers VERSION: {}){}",
            build.as_deref().unwrap_or("?"),
            versions.join(", "),
            if *content == Content::Matches {
                ", byte for byte the plugin this interlock ships"
            } else {
                ""
            }
        ),
        "",
    )];
    if *content == Content::Unverified {
        f.push(Finding::new(
            "binary.unverified",
            "binary",
            Status::Warn,
            Effect::None,
            format!(
                "{path} answers as interlock-cni but its content was not compared: {}",
                b.source.as_ref().err().cloned().unwrap_or_default()
            ),
            HINT_UNVERIFIED,
        ));
    }
    f
}

/// How long after a fight ended `check` still mentions it: a primary restarted later
/// (a node reboot, its DaemonSet's upgrade) starts the same fight again.
pub const RECENT_FIGHT_MS: u64 = 60 * 60 * 1000;

/// A fight over interlock's config (the agent's marker records the latest): going on, a
/// failure; over within [`RECENT_FIGHT_MS`], a warning.
fn fight_findings(o: &Observed<'_>) -> Vec<Finding> {
    let Ok(m) = &o.marker else { return vec![] };
    let Some(fight) = &m.fight else {
        return vec![];
    };
    let ago = |ms: u64| o.now_ms.saturating_sub(ms) as f64 / 1e3;
    let primary = match &fight.primary {
        Some(p) => format!(
            "; the runtime loaded {} ({}) when it started",
            shown(p),
            fight.primary_types.join(", ")
        ),
        None => String::new(),
    };
    let hint = interlock_agent::guard::conflict::fight_hint(&fight.primary_types);
    match fight.ended_at_ms {
        None if m.is_fresh(o.now_ms) => vec![Finding::new(
            "config.fight",
            "config",
            Status::Fail,
            Effect::Risk,
            format!(
                "another writer keeps undoing interlock's config: {} was undone {} times since the fight started {:.0} s ago (last {:.0} s ago){primary}; the agent backs off and the node stays not ready until it stops",
                shown(&fight.file),
                fight.conflicts,
                ago(fight.started_at_ms),
                ago(fight.last_conflict_at_ms),
            ),
            hint,
        )],
        Some(ended) if o.now_ms.saturating_sub(ended) <= RECENT_FIGHT_MS => vec![Finding::new(
            "config.recent-fight",
            "config",
            Status::Warn,
            Effect::None,
            format!(
                "another writer undid interlock's config {} times in a fight over {} that ended {:.0} s ago{primary}; it starts again when that writer does it again (a restart of the primary)",
                fight.conflicts,
                shown(&fight.file),
                ago(ended),
            ),
            hint,
        )],
        // Going on in a stale marker (the agent is gone: `agent.stale` says so), or long
        // over.
        _ => vec![],
    }
}

/// The agent: its readiness marker and `/readyz`.
fn agent_findings(o: &Observed<'_>) -> Vec<Finding> {
    let mut f: Vec<Finding> = fight_findings(o);
    let mut push = |id, area, status, effect, message: String, hint: Hint| {
        f.push(Finding::new(id, area, status, effect, message, hint))
    };
    use Effect::Risk;
    use Status::{Fail, Ok as Good, Warn};
    let age = |m: &ReadinessMarker| o.now_ms.saturating_sub(m.updated_at_ms) as f64 / 1e3;
    match &o.marker {
        Err(e) => push(
            "agent.no-marker",
            "agent",
            Fail,
            Risk,
            format!("no readiness from the agent: {e}"),
            hint_agent(o.namespace).into(),
        ),
        Ok(m) if !m.ready => push(
            "agent.not-ready",
            "agent",
            Fail,
            Risk,
            format!(
                "the agent (pid {}) reports not ready: {} (marker {:.1} s old)",
                m.pid,
                m.reason,
                age(m)
            ),
            hint_agent(o.namespace).into(),
        ),
        Ok(m) if !m.is_fresh(o.now_ms) => push(
            "agent.stale",
            "agent",
            Fail,
            Risk,
            format!(
                "the agent's marker is {:.1} s old (stale after {:.1} s): the agent (pid {}) is gone or hung",
                age(m),
                m.stale_after_ms as f64 / 1e3,
                m.pid
            ),
            hint_agent(o.namespace).into(),
        ),
        Ok(m) => push(
            "agent.ready",
            "agent",
            Good,
            Effect::None,
            format!("ready (pid {}, marker {:.1} s old)", m.pid, age(m)),
            "".into(),
        ),
    }
    match o.readyz {
        Readyz::NotAsked | Readyz::Answered(200) => {}
        Readyz::Answered(code) => push(
            "agent.readyz-not-ready",
            "agent",
            Warn,
            Effect::None,
            format!("/readyz answers {code}"),
            hint_agent(o.namespace).into(),
        ),
        Readyz::Unreachable(why) => push(
            "agent.readyz-unreachable",
            "agent",
            Warn,
            Effect::None,
            format!("/readyz could not be asked: {why}; the verdict rests on the marker alone"),
            HINT_READYZ.into(),
        ),
    }
    f
}

/// The node's running sandboxes, as the audit judges them.
/// The skew policy (docs/operate.md#upgrading) on this node: the agent and the plugin it
/// installed are one build, and the agent and this CLI share a minor version. Nothing
/// is said when the agent's version is unknown (not asked, no answer, an agent without
/// `interlock_build_info`).
fn skew_findings(o: &Observed<'_>) -> Vec<Finding> {
    let Some(agent) = o.agent_version else {
        return Vec::new();
    };
    let mut f = Vec::new();
    let cli = interlock_buildinfo::VERSION;
    if let Some((b, plugin)) = o.binary.and_then(|b| Some((b, b.build.as_deref()?))) {
        // The agent's series carries the release only; the plugin's answer adds the
        // commit (`0.2.0 (git …)`), whose bytes `binary.*` compares already.
        if release_of(plugin) != release_of(agent) {
            f.push(Finding::new(
                "skew.agent-plugin",
                "agent",
                Status::Warn,
                Effect::Risk,
                format!(
                    "the agent runs interlock {agent} but {} is interlock-cni {plugin}: outside the skew policy (an agent and the plugin on its node are one build); pods start with a plugin the agent did not ship",
                    shown_os(b.path.as_os_str())
                ),
                hint_skew_plugin(o.namespace),
            ));
        }
    }
    if minor_of(release_of(agent)) != minor_of(release_of(cli)) {
        f.push(Finding::new(
            "skew.agent-cli",
            "agent",
            Status::Warn,
            Effect::None,
            format!(
                "the agent runs interlock {agent}, this interlock is {cli}: outside the skew policy (agent and CLI of one minor version); this check may judge by rules the agent does not follow"
            ),
            hint_skew_cli(o.namespace),
        ));
    }
    f
}

/// The release of a version text, without what follows it (`0.2.0 (git …)` → `0.2.0`).
fn release_of(v: &str) -> &str {
    v.split_whitespace().next().unwrap_or(v)
}

/// `major.minor` of a version (all of it without a second dot).
fn minor_of(v: &str) -> &str {
    match v.match_indices('.').nth(1) {
        Some((i, _)) => &v[..i],
        None => v,
    }
}

fn sandbox_findings(o: &Observed<'_>) -> Vec<Finding> {
    let mut f: Vec<Finding> = Vec::new();
    let mut push = |id, area, status, effect, message: String, hint: Hint| {
        f.push(Finding::new(id, area, status, effect, message, hint))
    };
    use Effect::{Hole, Risk};
    use Status::{Fail, Ok as Good};
    match o.sandboxes {
        SandboxesSeen::NotAsked => {}
        // At risk, not "could not check": the config half was judged; what is not
        // known is whether pods already running are protected, and the agent's audit,
        // which asks the same runtime, cannot be repairing them either.
        SandboxesSeen::Unreachable(why) => push(
            "sandboxes.cri-unreachable",
            "sandboxes",
            Fail,
            Risk,
            format!(
                "the running sandboxes could not be listed over CRI ({}): {why}; a pod already running could be unprotected unseen, and the agent's audit of the same runtime cannot repair it",
                o.cri_endpoint
            ),
            HINT_CRI.into(),
        ),
        SandboxesSeen::Listed(list) => {
            let pods = |v: SandboxVerdict| -> Vec<&str> {
                list.iter()
                    .filter(|s| s.verdict == v)
                    .map(|s| if s.pod.is_empty() { s.id.as_str() } else { s.pod.as_str() })
                    .collect()
            };
            let bad = pods(SandboxVerdict::Unprotected);
            if !bad.is_empty() {
                push(
                    "sandboxes.unprotected",
                    "sandboxes",
                    Fail,
                    Hole,
                    format!(
                        "{} meshed pod{} running WITHOUT {} redirection: {}",
                        bad.len(),
                        if bad.len() == 1 { " is" } else { "s are" },
                        if bad.len() == 1 { "its" } else { "their" },
                        bad.join(", ")
                    ),
                    hint_sandbox_unprotected(o.namespace).into(),
                );
            }
            let unknown = pods(SandboxVerdict::Unknown);
            if !unknown.is_empty() {
                push(
                    "sandboxes.unknown",
                    "sandboxes",
                    Fail,
                    Risk,
                    format!(
                        "{} sandbox{} could not be judged: {}",
                        unknown.len(),
                        if unknown.len() == 1 { "" } else { "es" },
                        unknown.join(", ")
                    ),
                    HINT_SANDBOX_UNKNOWN.into(),
                );
            }
            if bad.is_empty() && unknown.is_empty() {
                push(
                    "sandboxes.ok",
                    "sandboxes",
                    Good,
                    Effect::None,
                    format!(
                        "{} sandbox{}: {} meshed and protected, {} not meshed",
                        list.len(),
                        if list.len() == 1 { "" } else { "es" },
                        pods(SandboxVerdict::Protected).len(),
                        pods(SandboxVerdict::NotMeshed).len()
                    ),
                    "".into(),
                );
            }
        }
    }
    f
}

/// The judgement from a list of findings: sorted worst first (equal findings keep their
/// order); the verdict follows the worst failure (a hole: unprotected; else at risk),
/// and without one is protected with `protected_summary` (`None`: nothing vouched for
/// protection, so at risk).
pub fn conclude(mut f: Vec<Finding>, protected_summary: Option<String>) -> Judgement {
    f.sort_by_key(|x| (x.status, x.effect));
    let worst = f
        .iter()
        .filter(|x| x.status == Status::Fail)
        .min_by_key(|x| x.effect);
    let (verdict, summary) = match worst {
        Some(x) if x.effect == Effect::Hole => (Verdict::Unprotected, x.message.clone()),
        Some(x) => (Verdict::AtRisk, x.message.clone()),
        None => match protected_summary {
            Some(s) => (Verdict::Protected, s),
            None => (Verdict::AtRisk, "the node could not be judged".to_string()),
        },
    };
    Judgement {
        verdict,
        summary: format!("{}: {summary}", verdict.word()),
        findings: f,
    }
}

/// Every plugin type a chain runs, its thin Multus delegate's too.
pub fn chain_types(list: &interlock_libcni::NetworkConfigList) -> Vec<String> {
    let mut types: Vec<String> = list.plugin_types().iter().map(|t| t.to_string()).collect();
    if let Some(d) = confdir::multus_delegate(list) {
        types.extend(
            d.get("plugins")
                .and_then(|p| p.as_array())
                .into_iter()
                .flatten()
                .filter_map(|p| Some(p.get("type")?.as_str()?.to_string())),
        );
    }
    types
}

fn shown_dirs(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|d| shown_os(d.as_os_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The finding `check` reports when it could not look at all.
pub fn could_not_check(id: &'static str, message: String, hint: impl Into<Hint>) -> Judgement {
    Judgement {
        verdict: Verdict::CouldNotCheck,
        summary: format!("{}: {message}", Verdict::CouldNotCheck.word()),
        findings: vec![Finding {
            id,
            area: "check",
            status: Status::Fail,
            message,
            hint: hint.into(),
            effect: Effect::Risk,
        }],
    }
}

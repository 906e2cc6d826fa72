//! Pure decisions of the config guard: given the conf dir and what the plugin binaries
//! answered, which files to write, rename or remove — and nothing else.
//!
//! Owned mode copies the first valid foreign config, appends our entry and writes it under
//! a name that sorts before every other candidate. Chain mode inserts our entry into the
//! target in place, wrapping a single-plugin `.conf` into a `.conflist` and moving the
//! original out of the runtime's way (`<name>.interlock-orig`), from where uninstall
//! restores it unchanged. The thin layer in [`crate::guard`] executes a [`Plan`] in order.

use crate::view::{
    effective, lift_conf, loadable, Candidate, DirSnapshot, FileFormat, RuntimeKind,
};
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet};

/// The plugin `type` interlock registers under.
pub const PLUGIN_TYPE: &str = "interlock-cni";

/// Suffix of the backup name a wrapped `.conf`/`.json` is moved to (runtimes ignore it).
pub const BACKUP_SUFFIX: &str = ".interlock-orig";

/// Plugin types of meta plugins that must stay first (we chain into them instead).
pub const META_PLUGIN_TYPES: [&str; 2] = ["multus", "multus-shim"];

/// Spec versions the guard may choose, oldest first.
pub const KNOWN_CNI_VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// How interlock gets into the runtime's config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigMode {
    /// Write our own `<prefix>-interlock.conflist` sorting first (default).
    Owned,
    /// Insert our entry into the target file in place.
    Chain,
}

/// What the guard is asked to maintain.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Owned or chain.
    pub mode: ConfigMode,
    /// Chain mode: the file to chain into (name inside the conf dir); `None`: the effective one.
    pub chain_target: Option<String>,
    /// Files allowed to sort ahead of us: we chain into them instead of overtaking them.
    pub allow_ahead: Vec<String>,
    /// Whose loading rules decide what is effective.
    pub runtime: RuntimeKind,
    /// Our plugin entry, exactly as it must appear in the effective config.
    pub entry: Map<String, Value>,
    /// Highest `cniVersion` the guard may choose (`None`: no cap).
    pub max_cni_version: Option<String>,
}

/// What the thin layer learnt from the bin dirs.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// Plugin types that have an executable in some bin dir.
    pub present_types: HashSet<String>,
    /// Versions each plugin type said it supports (its VERSION answer). A type missing
    /// here did not answer.
    pub versions: HashMap<String, Vec<String>>,
}

/// One step of a plan. Steps run in order; each leaves the directory loadable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Replace `name` atomically with `bytes` and permission bits `mode`.
    Write {
        /// File name.
        name: String,
        /// New content.
        bytes: Vec<u8>,
        /// Permission bits.
        mode: u32,
    },
    /// Rename `from` to `to` (both in the conf dir).
    Rename {
        /// Old name.
        from: String,
        /// New name.
        to: String,
    },
    /// Remove `name`.
    Remove {
        /// File name.
        name: String,
    },
}

impl Action {
    /// The file whose state this action decides (for a rename, the one moved away).
    pub fn file(&self) -> &str {
        match self {
            Action::Write { name, .. } | Action::Remove { name } => name,
            Action::Rename { from, .. } => from,
        }
    }

    /// What the decided file holds after the action (`None`: absent).
    pub fn leaves(&self) -> Option<&[u8]> {
        match self {
            Action::Write { bytes, .. } => Some(bytes),
            _ => None,
        }
    }
}

/// The outcome of planning.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Steps, in order. Empty when the directory is already as it should be.
    pub actions: Vec<Action>,
    /// The file that should be in effect afterwards.
    pub target: Option<String>,
    /// Why interlock cannot be put in effect (then the agent stays not-ready).
    pub problem: Option<String>,
    /// The problem makes the agent not-ready even if the effective config carries our
    /// entry (e.g. the primary moved to a `cniVersion` interlock-cni refuses, so the copy
    /// we keep can no longer follow it).
    pub blocks_ready: bool,
}

/// True for names of the owned file (`[0-9-]*interlock.conflist`).
pub fn is_owned_name(name: &str) -> bool {
    name.strip_suffix("interlock.conflist")
        .is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit() || b == b'-'))
}

/// A name for the owned file that sorts strictly before `first`, preferring the usual
/// `00-interlock.conflist`. `None` when no such name exists (e.g. `first` starts with `!`).
pub fn owned_name_before(first: &str) -> Option<String> {
    let mut candidates = vec![
        "00-interlock.conflist".to_string(),
        "0-interlock.conflist".to_string(),
    ];
    for n in 1..=8 {
        candidates.push(format!("{}interlock.conflist", "-".repeat(n)));
    }
    candidates
        .into_iter()
        .find(|c| c.as_bytes() < first.as_bytes())
}

fn parse_version(v: &str) -> Option<(u64, u64, u64)> {
    let mut it = v.split('.').map(|p| p.parse::<u64>().ok());
    let out = (it.next()??, it.next()??, it.next()??);
    it.next().is_none().then_some(out)
}

/// The `cniVersion` for a list of `types`: the highest known version every plugin said it
/// supports (capped by `max`). If some plugin did not answer VERSION, or they share none,
/// the primary's own `current` version is kept.
pub fn choose_cni_version(
    current: &str,
    types: &[String],
    versions: &HashMap<String, Vec<String>>,
    max: Option<&str>,
) -> String {
    let cap = max.and_then(parse_version);
    let mut common: Vec<&str> = KNOWN_CNI_VERSIONS
        .iter()
        .copied()
        .filter(|v| match cap {
            None => true,
            Some(c) => parse_version(v).is_some_and(|p| p <= c),
        })
        .collect();
    for t in types {
        let Some(supported) = versions.get(t) else {
            return current.to_string();
        };
        common.retain(|v| supported.iter().any(|s| s == v));
    }
    common
        .last()
        .map(|v| v.to_string())
        .unwrap_or_else(|| current.to_string())
}

fn is_entry(p: &Value) -> bool {
    p.get("type").and_then(Value::as_str) == Some(PLUGIN_TYPE)
}

/// Removes every interlock entry from `plugins` and appends `entry` as the last plugin.
fn chain_plugins(plugins: &[Value], entry: &Map<String, Value>) -> Vec<Value> {
    let mut out: Vec<Value> = plugins.iter().filter(|p| !is_entry(p)).cloned().collect();
    out.push(Value::Object(entry.clone()));
    out
}

/// The inline delegate list of a thin Multus `.conf` (`delegates[0].plugins`), if any.
fn delegate_plugins(conf: &Map<String, Value>) -> Option<&Vec<Value>> {
    conf.get("delegates")?
        .as_array()?
        .first()?
        .get("plugins")?
        .as_array()
}

/// True when `list` (conflist form) or its inline delegate runs exactly `entry`.
pub fn contains_entry(parsed: &crate::view::ParsedConf, entry: &Map<String, Value>) -> bool {
    let want = Value::Object(entry.clone());
    parsed.plugins().contains(&want)
        || delegate_plugins(&parsed.original).is_some_and(|d| d.contains(&want))
}

/// The `cniVersion` our entry runs with in `parsed`: the list's, or for a thin Multus
/// config the first delegate's (falling back to the meta config's).
pub fn running_version(parsed: &crate::view::ParsedConf) -> String {
    if parsed.plugins().iter().any(is_entry) {
        return parsed.cni_version().to_string();
    }
    parsed
        .original
        .get("delegates")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .and_then(|d| d.get("cniVersion"))
        .or_else(|| parsed.original.get("cniVersion"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// True when `parsed` has an interlock entry anywhere we put one.
pub fn has_any_entry(parsed: &crate::view::ParsedConf) -> bool {
    parsed.plugins().iter().any(is_entry)
        || delegate_plugins(&parsed.original).is_some_and(|d| d.iter().any(is_entry))
}

/// Serialises a config the way the guard writes it (pretty, trailing newline; indented
/// only so deep that a 10,000-deep config stays its own size).
pub fn render(map: &Map<String, Value>) -> Vec<u8> {
    let mut out =
        interlock_protocol::conf::pretty_json(&interlock_protocol::gojson::StackSafe(map));
    out.push(b'\n');
    out
}

fn backup_name(name: &str) -> String {
    format!("{name}{BACKUP_SUFFIX}")
}

/// The `.conflist` a `.conf`/`.json` is wrapped into.
pub fn wrapped_name(name: &str) -> String {
    let stem = name.rsplit_once('.').map(|(s, _)| s).unwrap_or(name);
    format!("{stem}.conflist")
}

fn is_meta(c: &Candidate, settings: &Settings) -> bool {
    if settings.allow_ahead.iter().any(|a| a == &c.name) {
        return true;
    }
    match &c.parsed {
        Ok(p) => p
            .plugin_types()
            .iter()
            .any(|t| META_PLUGIN_TYPES.contains(&t.as_str())),
        Err(_) => false,
    }
}

/// The versions interlock-cni accepts: its VERSION answer, or every known version when
/// the binary has not answered (yet).
fn interlock_versions(facts: &Facts) -> Vec<String> {
    facts
        .versions
        .get(PLUGIN_TYPE)
        .filter(|v| !v.is_empty())
        .cloned()
        .unwrap_or_else(|| KNOWN_CNI_VERSIONS.iter().map(|v| v.to_string()).collect())
}

/// True when interlock-cni accepts a list whose `cniVersion` is `version`.
pub fn version_accepted(version: &str, facts: &Facts) -> bool {
    interlock_versions(facts).iter().any(|v| v == version)
}

fn shown_version(v: &str) -> String {
    if v.is_empty() {
        "none (meaning 0.1.0)".into()
    } else {
        v.to_string()
    }
}

/// Makes `list`'s `cniVersion` one interlock-cni accepts: kept when it already is, else
/// raised to the version [`choose_cni_version`] picks when every plugin in the list said
/// (VERSION) that it supports it. Otherwise why not, naming `file` and the version.
fn fit_version(
    list: &mut Map<String, Value>,
    file: &str,
    settings: &Settings,
    facts: &Facts,
) -> Result<(), String> {
    let current = list
        .get("cniVersion")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if version_accepted(&current, facts) {
        return Ok(());
    }
    let types: Vec<String> = list
        .get("plugins")
        .and_then(Value::as_array)
        .map(|ps| {
            ps.iter()
                .filter_map(|p| p.get("type").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let chosen = choose_cni_version(
        &current,
        &types,
        &facts.versions,
        settings.max_cni_version.as_deref(),
    );
    if version_accepted(&chosen, facts) {
        list.insert("cniVersion".into(), Value::String(chosen));
        return Ok(());
    }
    let silent: Vec<&str> = types
        .iter()
        .filter(|t| !facts.versions.contains_key(t.as_str()))
        .map(String::as_str)
        .collect();
    Err(format!(
        "{file} has cniVersion {}, which interlock-cni does not accept (it accepts {}), and it \
         cannot be raised: {}; set a cniVersion of 0.3.0 or newer in {file}",
        shown_version(&current),
        interlock_versions(facts).join(", "),
        if silent.is_empty() {
            format!(
                "its plugins ({}) share no version interlock-cni accepts",
                types.join(", ")
            )
        } else {
            format!(
                "{} did not answer VERSION (binary missing from the bin dirs?)",
                silent.join(", ")
            )
        }
    ))
}

/// `list` without interlock entries and without `cniVersion` (which the guard may raise).
fn foreign_part(list: &Map<String, Value>) -> Map<String, Value> {
    let mut out = list.clone();
    out.remove("cniVersion");
    if let Some(Value::Array(ps)) = out.get_mut("plugins") {
        ps.retain(|p| !is_entry(p));
    }
    out
}

/// True when `conflist` (a `.conflist`'s top-level object) is what wrapping the `.conf`
/// `conf` produces: the lifted `.conf` plus interlock entries, perhaps with a raised
/// `cniVersion`. Nothing foreign would be lost by replacing or removing it.
pub fn is_wrap_of(conflist: &Map<String, Value>, conf: &Map<String, Value>) -> bool {
    foreign_part(conflist) == foreign_part(&lift_conf(conf))
}

/// Plans how to chain `settings.entry` into candidate `c` in place. Returns the actions
/// and the name that carries our entry afterwards.
fn chain_into(
    c: &Candidate,
    snap: &DirSnapshot,
    settings: &Settings,
    facts: &Facts,
) -> Result<(Vec<Action>, String), String> {
    let entry = &settings.entry;
    let parsed = c
        .parsed
        .as_ref()
        .map_err(|e| format!("cannot chain into {}: {e}", c.name))?;
    match parsed.format {
        FileFormat::Conflist => {
            let mut list = parsed.original.clone();
            list.insert(
                "plugins".into(),
                Value::Array(chain_plugins(parsed.plugins(), entry)),
            );
            fit_version(&mut list, &c.name, settings, facts)
                .map_err(|e| format!("cannot chain into {}: {e}", c.name))?;
            let actions = if list == parsed.original && ordered_eq(&list, &parsed.original) {
                vec![]
            } else {
                vec![Action::Write {
                    name: c.name.clone(),
                    bytes: render(&list),
                    mode: c.mode,
                }]
            };
            Ok((actions, c.name.clone()))
        }
        FileFormat::Conf => {
            if let Some(delegates) = delegate_plugins(&parsed.original) {
                let new = chain_plugins(delegates, entry);
                let mut conf = parsed.original.clone();
                if let Some(Value::Object(d0)) = conf
                    .get_mut("delegates")
                    .and_then(Value::as_array_mut)
                    .and_then(|a| a.first_mut())
                {
                    d0.insert("plugins".into(), Value::Array(new));
                    // The delegate runs with its own cniVersion (or, without one, the
                    // meta plugin's).
                    if !d0.contains_key("cniVersion") {
                        if let Some(v) = parsed.original.get("cniVersion") {
                            d0.insert("cniVersion".into(), v.clone());
                        }
                    }
                    let had = d0.clone();
                    fit_version(
                        d0,
                        &format!("the first delegate of {}", c.name),
                        settings,
                        facts,
                    )
                    .map_err(|e| format!("cannot chain into {}: {e}", c.name))?;
                    if had == *d0 && !delegate_has_version(&parsed.original) {
                        // Only added for the check: leave the file as it was.
                        d0.remove("cniVersion");
                    }
                }
                if ordered_eq(&conf, &parsed.original) {
                    return Ok((vec![], c.name.clone()));
                }
                return Ok((
                    vec![Action::Write {
                        name: c.name.clone(),
                        bytes: render(&conf),
                        mode: c.mode,
                    }],
                    c.name.clone(),
                ));
            }
            let wrapped = wrapped_name(&c.name);
            let backup = backup_name(&c.name);
            let existing = snap.get(&wrapped);
            if existing.is_some() && snap.get(&backup).is_none() {
                // Either someone else's file, or our own wrap interrupted between writing
                // the .conflist and moving the .conf away (agent killed): finish that.
                let ours = existing
                    .and_then(|e| e.content.as_deref())
                    .and_then(|b| crate::view::parse_candidate(&wrapped, b).ok())
                    .is_some_and(|w| {
                        has_any_entry(&w) && is_wrap_of(&w.original, &parsed.original)
                    });
                if !ours {
                    return Err(format!(
                        "cannot wrap {} into {wrapped}: {wrapped} already exists and is not ours; \
                         remove one of them or set --chain-target",
                        c.name
                    ));
                }
            }
            let mut list = lift_conf(&parsed.original);
            list.insert(
                "plugins".into(),
                Value::Array(chain_plugins(parsed.plugins(), entry)),
            );
            fit_version(&mut list, &c.name, settings, facts)
                .map_err(|e| format!("cannot wrap {} into {wrapped}: {e}", c.name))?;
            let bytes = render(&list);
            let mut actions = vec![];
            if existing.and_then(|e| e.content.as_deref()) != Some(bytes.as_slice())
                || existing.is_some_and(|e| e.mode != c.mode)
            {
                actions.push(Action::Write {
                    name: wrapped.clone(),
                    bytes,
                    mode: c.mode,
                });
            }
            actions.push(Action::Rename {
                from: c.name.clone(),
                to: backup,
            });
            Ok((actions, wrapped))
        }
    }
}

fn delegate_has_version(conf: &Map<String, Value>) -> bool {
    conf.get("delegates")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .is_some_and(|d| d.get("cniVersion").is_some())
}

/// Map equality that also compares key order (serde_json's `==` ignores it).
fn ordered_eq(a: &Map<String, Value>, b: &Map<String, Value>) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b.iter())
            .all(|((ka, va), (kb, vb))| ka == kb && ordered_eq_value(va, vb))
}

fn ordered_eq_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => ordered_eq(a, b),
        (Value::Array(a), Value::Array(b)) => ordered_eq_values(a, b),
        _ => a == b,
    }
}

fn ordered_eq_values(a: &[Value], b: &[Value]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| ordered_eq_value(x, y))
}

/// Decides what to do so that the runtime loads a config containing our entry.
pub fn plan(snap: &DirSnapshot, settings: &Settings, facts: &Facts) -> Plan {
    match settings.mode {
        ConfigMode::Owned => plan_owned(snap, settings, facts),
        ConfigMode::Chain => plan_chain(snap, settings, facts),
    }
}

fn remove_owned(cands: &[Candidate], keep: Option<&str>) -> Vec<Action> {
    cands
        .iter()
        .filter(|c| is_owned_name(&c.name) && Some(c.name.as_str()) != keep)
        .map(|c| Action::Remove {
            name: c.name.clone(),
        })
        .collect()
}

fn plan_owned(snap: &DirSnapshot, settings: &Settings, facts: &Facts) -> Plan {
    let cands = snap.candidates();
    let foreign: Vec<&Candidate> = cands.iter().filter(|c| !is_owned_name(&c.name)).collect();
    let Some(first_foreign) = foreign.first() else {
        return Plan {
            actions: remove_owned(&cands, None),
            target: None,
            problem: Some(
                "no CNI config from the primary plugin in the conf dir yet: waiting for it".into(),
            ),
            blocks_ready: false,
        };
    };
    let Some(primary) = foreign
        .iter()
        .find(|c| loadable(c, settings.runtime, &facts.present_types))
    else {
        let why = match &first_foreign.parsed {
            Err(e) => e.clone(),
            Ok(_) => format!("{}: plugin binaries missing", first_foreign.name),
        };
        // Keep whatever we wrote: the primary is probably mid-way through a rewrite.
        return Plan {
            actions: vec![],
            target: None,
            problem: Some(format!("no valid primary CNI config to copy ({why})")),
            blocks_ready: false,
        };
    };
    if is_meta(primary, settings) {
        return match chain_into(primary, snap, settings, facts) {
            Ok((mut actions, target)) => {
                actions.extend(remove_owned(&cands, None));
                Plan {
                    actions,
                    target: Some(target),
                    problem: None,
                    blocks_ready: false,
                }
            }
            Err(e) => Plan {
                actions: vec![],
                target: None,
                problem: Some(e),
                blocks_ready: true,
            },
        };
    }
    let existing = cands
        .iter()
        .find(|c| is_owned_name(&c.name) && c.name.as_bytes() < first_foreign.name.as_bytes())
        .map(|c| c.name.clone());
    let Some(name) = existing.or_else(|| owned_name_before(&first_foreign.name)) else {
        return Plan {
            actions: vec![],
            target: None,
            problem: Some(format!(
                "cannot name our config so that it sorts before {}: rename that file or list it \
                 in --allow-ahead",
                first_foreign.name
            )),
            blocks_ready: false,
        };
    };
    let parsed = primary.parsed.as_ref().expect("loadable implies parsed");
    let mut list = parsed.list.clone();
    let plugins = chain_plugins(parsed.plugins(), &settings.entry);
    let types: Vec<String> = plugins
        .iter()
        .filter_map(|p| p.get("type").and_then(Value::as_str).map(str::to_string))
        .collect();
    let version = choose_cni_version(
        parsed.cni_version(),
        &types,
        &facts.versions,
        settings.max_cni_version.as_deref(),
    );
    list.insert("cniVersion".into(), Value::String(version));
    list.insert("plugins".into(), Value::Array(plugins));
    if let Err(e) = fit_version(&mut list, &primary.name, settings, facts) {
        // Writing it would make interlock-cni refuse every ADD. Keep what we wrote (the
        // runtime keeps working with it) but stay not-ready: the copy cannot follow.
        return Plan {
            actions: vec![],
            target: None,
            problem: Some(format!("cannot copy {}: {e}", primary.name)),
            blocks_ready: true,
        };
    }
    let bytes = render(&list);
    let mut actions = vec![];
    let current = snap.get(&name);
    if current.and_then(|e| e.content.as_deref()) != Some(bytes.as_slice())
        || current.is_some_and(|e| e.mode != primary.mode)
    {
        actions.push(Action::Write {
            name: name.clone(),
            bytes,
            mode: primary.mode,
        });
    }
    actions.extend(remove_owned(&cands, Some(&name)));
    Plan {
        actions,
        target: Some(name),
        problem: None,
        blocks_ready: false,
    }
}

fn plan_chain(snap: &DirSnapshot, settings: &Settings, facts: &Facts) -> Plan {
    let cands = snap.candidates();
    let mut actions = remove_owned(&cands, None);
    let foreign: Vec<Candidate> = cands
        .iter()
        .filter(|c| !is_owned_name(&c.name))
        .cloned()
        .collect();
    let target = match &settings.chain_target {
        Some(t) => {
            let wrapped = wrapped_name(t);
            match foreign.iter().find(|c| &c.name == t) {
                Some(c) => Ok(c),
                None if snap.get(&backup_name(t)).is_some() => {
                    foreign.iter().find(|c| c.name == wrapped).ok_or_else(|| {
                        format!("chain target {t} was wrapped into {wrapped}, which is gone")
                    })
                }
                None => Err(format!("chain target {t} not found in the conf dir")),
            }
        }
        None => effective(&foreign, settings.runtime, &facts.present_types)
            .map_err(|e| format!("no config to chain into: {e}")),
    };
    match target.and_then(|c| chain_into(c, snap, settings, facts)) {
        Ok((more, target)) => {
            actions.extend(more);
            Plan {
                actions,
                target: Some(target),
                problem: None,
                blocks_ready: false,
            }
        }
        Err(problem) => Plan {
            actions,
            target: None,
            problem: Some(problem),
            blocks_ready: true,
        },
    }
}

/// What uninstall will do, with notes on what it deliberately leaves in place.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UninstallPlan {
    /// Steps, in order.
    pub actions: Vec<Action>,
    /// Things left in place on purpose, and why (for the log and the command's output).
    pub notes: Vec<String>,
}

/// Decides how to remove exactly what interlock added: owned files, our entries in
/// foreign files, and wrapped `.conf`s (the original is renamed back, byte for byte).
pub fn plan_uninstall(snap: &DirSnapshot) -> Vec<Action> {
    plan_uninstall_explained(snap).actions
}

/// [`plan_uninstall`] with notes. A `<stem>.conflist` next to a backup is only removed
/// when it is still our wrap of that backup (its content minus our entry equals the
/// lifted original); if the primary has written its own `<stem>.conflist` since, only our
/// entry is stripped from it and the backup is kept (never deleted, never restored over
/// the primary's newer config).
pub fn plan_uninstall_explained(snap: &DirSnapshot) -> UninstallPlan {
    let cands = snap.candidates();
    let mut actions = vec![];
    let mut notes = vec![];
    let mut restored = HashSet::new();
    for c in &cands {
        if is_owned_name(&c.name) {
            actions.push(Action::Remove {
                name: c.name.clone(),
            });
            continue;
        }
        // A conflist we created by wrapping a .conf/.json: put the original back first
        // (it sorts before the .conflist), then remove ours.
        let stem = c.name.strip_suffix(".conflist");
        let orig = stem.and_then(|s| {
            [format!("{s}.conf"), format!("{s}.json")]
                .into_iter()
                .find(|o| snap.get(&backup_name(o)).is_some())
        });
        if let Some(orig) = orig {
            let backup = backup_name(&orig);
            let backup_conf = snap
                .get(&backup)
                .and_then(|e| e.content.as_deref())
                .and_then(|b| crate::view::parse_candidate(&orig, b).ok());
            let ours = match (&c.parsed, &backup_conf) {
                (Ok(w), Some(b)) => is_wrap_of(&w.original, &b.original),
                _ => false,
            };
            restored.insert(orig.clone());
            if ours {
                if snap.get(&orig).is_none() {
                    actions.push(Action::Rename {
                        from: backup.clone(),
                        to: orig.clone(),
                    });
                } else {
                    // The primary wrote a newer original since: it wins, the backup is stale.
                    actions.push(Action::Remove {
                        name: backup.clone(),
                    });
                }
                actions.push(Action::Remove {
                    name: c.name.clone(),
                });
                continue;
            }
            notes.push(format!(
                "kept {backup}: {} is no longer interlock's wrap of {orig} (someone rewrote it \
                 since), so only interlock's entry is removed from it and the original \
                 {orig} stays saved under {backup}; delete that file by hand if the primary \
                 no longer needs it",
                c.name
            ));
        }
        let Ok(parsed) = &c.parsed else { continue };
        if !has_any_entry(parsed) {
            continue;
        }
        let mut orig = parsed.original.clone();
        match parsed.format {
            FileFormat::Conflist => {
                let kept: Vec<Value> = parsed
                    .plugins()
                    .iter()
                    .filter(|p| !is_entry(p))
                    .cloned()
                    .collect();
                orig.insert("plugins".into(), Value::Array(kept));
            }
            FileFormat::Conf => {
                if let Some(Value::Object(d0)) = orig
                    .get_mut("delegates")
                    .and_then(Value::as_array_mut)
                    .and_then(|a| a.first_mut())
                {
                    if let Some(Value::Array(p)) = d0.get_mut("plugins") {
                        p.retain(|x| !is_entry(x));
                    }
                }
            }
        }
        actions.push(Action::Write {
            name: c.name.clone(),
            bytes: render(&orig),
            mode: c.mode,
        });
    }
    // Backups whose wrapped conflist is gone: restore them too.
    for e in &snap.entries {
        if let Some(orig) = e.name.strip_suffix(BACKUP_SUFFIX) {
            if !restored.contains(orig) && snap.get(orig).is_none() {
                actions.push(Action::Rename {
                    from: e.name.clone(),
                    to: orig.to_string(),
                });
            }
        }
    }
    UninstallPlan { actions, notes }
}

/// Whether the runtime's effective config carries our entry. `Ok(name)` of the effective
/// file when it does, otherwise why not.
pub fn check_effective(
    snap: &DirSnapshot,
    settings: &Settings,
    facts: &Facts,
) -> Result<String, String> {
    let cands = snap.candidates();
    let c = effective(&cands, settings.runtime, &facts.present_types)?;
    let parsed = c.parsed.as_ref().map_err(Clone::clone)?;
    if contains_entry(parsed, &settings.entry) {
        let version = running_version(parsed);
        if !version_accepted(&version, facts) {
            return Err(format!(
                "the effective config {} runs interlock-cni with cniVersion {}, which it refuses",
                c.name,
                shown_version(&version)
            ));
        }
        Ok(c.name.clone())
    } else if has_any_entry(parsed) {
        Err(format!(
            "the effective config {} has an interlock-cni entry that differs from ours",
            c.name
        ))
    } else {
        Err(format!(
            "the effective config {} does not contain interlock-cni",
            c.name
        ))
    }
}

/// Applies `actions` to a snapshot in memory (what the directory looks like afterwards).
/// Used by tests and by the bench to predict outcomes.
pub fn apply_in_memory(snap: &DirSnapshot, actions: &[Action]) -> DirSnapshot {
    let mut out = snap.clone();
    for a in actions {
        match a {
            Action::Write { name, bytes, mode } => {
                out.entries.retain(|e| &e.name != name);
                out.entries.push(crate::view::DirEntry {
                    name: name.clone(),
                    content: Some(bytes.clone()),
                    mode: *mode,
                });
            }
            Action::Rename { from, to } => {
                if let Some(mut e) = out.entries.iter().find(|e| &e.name == from).cloned() {
                    out.entries.retain(|e| &e.name != from && &e.name != to);
                    e.name = to.clone();
                    out.entries.push(e);
                }
            }
            Action::Remove { name } => out.entries.retain(|e| &e.name != name),
        }
    }
    out
}

//! Pure decisions of the config guard: given the conf dir and what the plugin binaries
//! answered, which files to write, rename or remove — and nothing else.
//!
//! Owned mode copies the first valid foreign config, appends our entry and writes it under
//! a name that sorts before every other candidate. Chain mode inserts our entry into the
//! target in place, wrapping a single-plugin `.conf` into a `.conflist` and moving the
//! original out of the runtime's way (`<name>.interlock-orig`), from where uninstall
//! restores it unchanged. The thin layer in [`crate::guard`] executes a [`Plan`] in order.

use interlock_cni_types::version::{CniVersion, SemVer};
use interlock_confdir::{
    self as confdir, Binaries, Candidate, DirEntry, Parsed, Runtime, Snapshot,
};
use interlock_contract::guard::{GuardRole, GuardedMesh};
use interlock_contract::layout;
use interlock_contract::shown::shown;
use interlock_libcni::ConfFormat;
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet};

/// The plugin `type` interlock registers under.
pub use interlock_contract::config::PLUGIN_TYPE;

/// Suffix of the backup name a wrapped `.conf`/`.json` is moved to (runtimes ignore it).
pub const BACKUP_SUFFIX: &str = ".interlock-orig";

/// Plugin types of meta plugins that must stay first (we chain into them instead).
pub use interlock_confdir::META_PLUGIN_TYPES;

/// Permission bits interlock gives a config it writes: never writable by group or
/// others, whatever the primary's mode (a world-writable primary must not let an
/// unprivileged user edit the file that decides protection).
pub fn written_mode(primary_mode: u32) -> u32 {
    primary_mode & 0o644
}

/// How interlock gets into the runtime's config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigMode {
    /// Write our own `<prefix>-interlock.conflist` sorting first (default).
    Owned,
    /// Insert our entry into the target file in place.
    Chain,
    /// Guard a mesh's own CNI plugin (`--guard-mesh`): a file of our own sorting first
    /// with the primary's plugins, `interlock-cni` in its guard role, then the mesh's
    /// entry, kept verbatim ([`plan_guard`]).
    Guard,
}

impl std::str::FromStr for ConfigMode {
    type Err = String;

    fn from_str(s: &str) -> Result<ConfigMode, String> {
        match s {
            "owned" => Ok(ConfigMode::Owned),
            "chain" => Ok(ConfigMode::Chain),
            "guard" => Ok(ConfigMode::Guard),
            other => Err(format!(
                "unknown config mode {other:?} (expected owned, chain or guard)"
            )),
        }
    }
}

impl ConfigMode {
    /// The name `--config-mode` takes (`owned`, `chain`, `guard`).
    pub fn as_str(self) -> &'static str {
        match self {
            ConfigMode::Owned => "owned",
            ConfigMode::Chain => "chain",
            ConfigMode::Guard => "guard",
        }
    }
}

impl std::fmt::Display for ConfigMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
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
    pub runtime: Runtime,
    /// Our plugin entry, exactly as it must appear in the effective config.
    pub entry: Map<String, Value>,
    /// Highest `cniVersion` the guard may choose (`None`: no cap).
    pub max_cni_version: Option<String>,
    /// Guard mode: the guarded mesh and what the thin layer learnt about its plugin
    /// before this plan (`None` in owned and chain mode).
    pub guard: Option<GuardInput>,
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

/// [`Facts`] seen as the conf-dir judgement's [`Binaries`].
pub struct FactBinaries<'a> {
    facts: &'a Facts,
    present: Box<dyn Fn(&str) -> bool + 'a>,
}

impl FactBinaries<'_> {
    /// The view [`confdir`] takes.
    pub fn view(&self) -> Binaries<'_> {
        let _ = self.facts;
        Binaries {
            dirs: &[],
            present: &*self.present,
            versions: None,
        }
    }
}

impl Facts {
    /// These facts as plugin binaries for [`confdir::effective`].
    pub fn binaries(&self) -> FactBinaries<'_> {
        FactBinaries {
            facts: self,
            present: Box::new(move |t| self.present_types.contains(t)),
        }
    }
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

/// The bytes an owned file's name may start with: digits, space and the punctuation
/// below `.` (no letters, so no other writer's `…-interlock.conflist` is taken for ours,
/// no `.` or `/`).
fn owned_prefix_byte(b: u8) -> bool {
    b.is_ascii_digit() || (b' '..=b'-').contains(&b)
}

/// True for names of the owned file (`<prefix>interlock.conflist`, the prefix digits,
/// spaces and punctuation below `.`, e.g. `00-`, `--`, `!-`).
pub fn is_owned_name(name: &str) -> bool {
    name.strip_suffix("interlock.conflist")
        .is_some_and(|p| p.bytes().all(owned_prefix_byte))
}

/// A name for the owned file that sorts strictly before `first`, preferring the usual
/// `00-interlock.conflist`. When even `-interlock.conflist` does not sort first (a name
/// starting with `!`, a space, …), the name keeps `first`'s leading bytes up to the first
/// one above `-` and puts `-` there: `!.conflist` gives `!-interlock.conflist` (every
/// config name has a `.`, which sorts after `-`). `None` only when `first` starts with
/// bytes no owned name may hold (control characters, letters below `-` do not exist).
pub fn owned_name_before(first: &str) -> Option<String> {
    let mut candidates = vec![
        "00-interlock.conflist".to_string(),
        "0-interlock.conflist".to_string(),
    ];
    for n in 1..=8 {
        candidates.push(format!("{}interlock.conflist", "-".repeat(n)));
    }
    if let Some(c) = candidates
        .into_iter()
        .find(|c| c.as_bytes() < first.as_bytes())
    {
        return Some(c);
    }
    let bytes = first.as_bytes();
    let k = bytes.iter().position(|b| *b > b'-')?;
    let prefix = &first[..k];
    if !prefix.bytes().all(owned_prefix_byte) {
        return None;
    }
    let name = format!("{prefix}-interlock.conflist");
    (name.as_bytes() < bytes).then_some(name)
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
    let cap = max.and_then(|m| SemVer::parse(m).ok());
    let mut common: Vec<&str> = CniVersion::all_strings()
        .into_iter()
        .filter(|v| match cap {
            None => true,
            Some(c) => SemVer::parse(v).is_ok_and(|p| p <= c),
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

/// The inline delegate list of a thin Multus config (`delegates[0].plugins`), if any.
fn delegate_plugins(parsed: &Parsed) -> Option<&Vec<Value>> {
    confdir::multus_delegate(&parsed.list)?
        .get("plugins")?
        .as_array()
}

/// True when the runtime running `parsed` (file `name`) runs exactly `entry`, once and
/// after the primary (the list's own plugins or a thin Multus delegate's): the one
/// predicate `interlock check` uses too ([`confdir::runs_plugin`]). `Ok` gives the
/// `cniVersion` it runs with.
pub fn runs_entry(
    parsed: &Parsed,
    name: &str,
    entry: &Map<String, Value>,
) -> Result<String, String> {
    let r = confdir::runs_plugin(&parsed.list, name, PLUGIN_TYPE)?;
    if r.entry != entry {
        return Err(format!(
            "{name} has an interlock-cni entry that differs from ours"
        ));
    }
    Ok(r.version)
}

/// True when `parsed` has an interlock entry anywhere we put one.
pub fn has_any_entry(parsed: &Parsed) -> bool {
    parsed.plugins().iter().any(is_entry)
        || delegate_plugins(parsed).is_some_and(|d| d.iter().any(is_entry))
}

/// True when the owned-looking file `c` is interlock's: it parses and carries an
/// interlock-cni entry. Anything else with such a name is someone else's and is never
/// deleted (the one name the guard keeps in effect is still overwritten: it is the name
/// interlock reserves, and a copy without our entry there is exactly what it repairs).
pub fn is_ours(c: &Candidate<'_>) -> bool {
    is_owned_name(c.name()) && c.parsed().as_ref().is_ok_and(has_any_entry)
}

/// Serialises a config the way the guard writes it (pretty, trailing newline; indented
/// only so deep that a 10,000-deep config stays its own size).
pub fn render(map: &Map<String, Value>) -> Vec<u8> {
    let mut out = interlock_libcni::conf::pretty_json(&interlock_libcni::gojson::StackSafe(map));
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
    if settings.allow_ahead.iter().any(|a| a == c.name()) {
        return true;
    }
    match c.parsed() {
        Ok(p) => p
            .plugin_types()
            .iter()
            .any(|t| META_PLUGIN_TYPES.contains(&t.as_str())),
        Err(_) => false,
    }
}

/// The versions interlock-cni accepts: its VERSION answer, or every known version when
/// the binary has not answered (yet).
pub fn interlock_versions(facts: &Facts) -> Vec<String> {
    facts
        .versions
        .get(PLUGIN_TYPE)
        .filter(|v| !v.is_empty())
        .cloned()
        .unwrap_or_else(|| {
            CniVersion::all_strings()
                .into_iter()
                .map(str::to_string)
                .collect()
        })
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

/// True when `conflist` (a parsed `.conflist`) is what wrapping the parsed `.conf` `conf`
/// produces: the lifted `.conf` plus interlock entries, perhaps with a raised
/// `cniVersion`. Nothing foreign would be lost by replacing or removing it.
pub fn is_wrap_of(conflist: &Parsed, conf: &Parsed) -> bool {
    foreign_part(conflist.original()) == foreign_part(conf.list.raw())
}

/// Plans how to chain `settings.entry` into candidate `c` in place. Returns the actions
/// and the name that carries our entry afterwards.
fn chain_into(
    c: &Candidate,
    snap: &Snapshot,
    settings: &Settings,
    facts: &Facts,
) -> Result<(Vec<Action>, String), String> {
    let entry = &settings.entry;
    let parsed = c
        .parsed()
        .as_ref()
        .map_err(|e| format!("cannot chain into {}: {e}", c.entry.shown()))?;
    if !c.entry.utf8_name() {
        return Err(format!(
            "cannot chain into {}: its name is not valid UTF-8, and interlock does not write \
             under a name it cannot spell exactly (it would create a second file); rename it",
            c.entry.shown()
        ));
    }
    if c.entry.is_symlink {
        return Err(format!(
            "cannot chain into {}: it is a symbolic link; interlock neither writes through a \
             link (it could point anywhere) nor replaces it with a copy (that would freeze \
             the linked config); use owned mode, or point --chain-target at the real file",
            c.entry.shown()
        ));
    }
    match parsed.format {
        ConfFormat::Conflist => {
            let mut list = parsed.original().clone();
            list.insert(
                "plugins".into(),
                Value::Array(chain_plugins(parsed.plugins(), entry)),
            );
            fit_version(&mut list, &c.entry.shown(), settings, facts)
                .map_err(|e| format!("cannot chain into {}: {e}", c.entry.shown()))?;
            let actions = if list == *parsed.original() && ordered_eq(&list, parsed.original()) {
                vec![]
            } else {
                vec![Action::Write {
                    name: c.name().to_string(),
                    bytes: render(&list),
                    mode: written_mode(c.mode()),
                }]
            };
            Ok((actions, c.name().to_string()))
        }
        ConfFormat::Conf => {
            if let Some(delegates) = delegate_plugins(parsed) {
                let new = chain_plugins(delegates, entry);
                let mut conf = parsed.original().clone();
                if let Some(Value::Object(d0)) = conf
                    .get_mut("delegates")
                    .and_then(Value::as_array_mut)
                    .and_then(|a| a.first_mut())
                {
                    d0.insert("plugins".into(), Value::Array(new));
                    // The delegate runs with its own cniVersion (or, without one, the
                    // meta plugin's).
                    if !d0.contains_key("cniVersion") {
                        if let Some(v) = parsed.original().get("cniVersion") {
                            d0.insert("cniVersion".into(), v.clone());
                        }
                    }
                    let had = d0.clone();
                    fit_version(
                        d0,
                        &format!("the first delegate of {}", c.entry.shown()),
                        settings,
                        facts,
                    )
                    .map_err(|e| format!("cannot chain into {}: {e}", c.entry.shown()))?;
                    if had == *d0 && !delegate_has_version(parsed.original()) {
                        // Only added for the check: leave the file as it was.
                        d0.remove("cniVersion");
                    }
                }
                if ordered_eq(&conf, parsed.original()) {
                    return Ok((vec![], c.name().to_string()));
                }
                return Ok((
                    vec![Action::Write {
                        name: c.name().to_string(),
                        bytes: render(&conf),
                        mode: written_mode(c.mode()),
                    }],
                    c.name().to_string(),
                ));
            }
            let wrapped = wrapped_name(c.name());
            let backup = backup_name(c.name());
            let existing = snap.get(&wrapped);
            if existing.is_some() && snap.get(&backup).is_none() {
                // Either someone else's file, or our own wrap interrupted between writing
                // the .conflist and moving the .conf away (agent killed): finish that.
                let ours = existing
                    .and_then(|e| e.parse().ok())
                    .is_some_and(|w| has_any_entry(&w) && is_wrap_of(&w, parsed));
                if !ours {
                    return Err(format!(
                        "cannot wrap {} into {w}: {w} already exists and is not ours; \
                         remove one of them or set --chain-target",
                        c.entry.shown(),
                        w = shown(&wrapped)
                    ));
                }
            }
            let mut list = parsed.list.raw().clone();
            list.insert(
                "plugins".into(),
                Value::Array(chain_plugins(parsed.plugins(), entry)),
            );
            fit_version(&mut list, &c.entry.shown(), settings, facts).map_err(|e| {
                format!(
                    "cannot wrap {} into {}: {e}",
                    c.entry.shown(),
                    shown(&wrapped)
                )
            })?;
            let bytes = render(&list);
            let mut actions = vec![];
            if existing.and_then(|e| e.content.as_deref()) != Some(bytes.as_slice())
                || existing.is_some_and(|e| e.mode != written_mode(c.mode()))
            {
                actions.push(Action::Write {
                    name: wrapped.clone(),
                    bytes,
                    mode: written_mode(c.mode()),
                });
            }
            actions.push(Action::Rename {
                from: c.name().to_string(),
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
pub fn plan(snap: &Snapshot, settings: &Settings, facts: &Facts) -> Plan {
    match settings.mode {
        ConfigMode::Owned => plan_owned(snap, settings, facts),
        ConfigMode::Chain => plan_chain(snap, settings, facts),
        ConfigMode::Guard => plan_guard(snap, settings, facts).0,
    }
}

/// What [`plan`] writes to `name` when `name` holds `content` instead of what `snap` read,
/// everything else as in `snap` (`None`: nothing). The guard asks this when another
/// writer changed the file while the guard was writing it ([`crate::guard::contested_write`]), so the
/// write follows the newer content instead of undoing it.
pub fn rewrite_for(
    snap: &Snapshot,
    settings: &Settings,
    facts: &Facts,
    name: &str,
    content: &[u8],
) -> Option<Vec<u8>> {
    let mut now = snap.clone();
    match now
        .entries
        .iter_mut()
        .find(|e| e.os_name.as_encoded_bytes() == name.as_bytes())
    {
        Some(e) => {
            e.content = Some(content.to_vec());
            e.unreadable = None;
            e.refused = false;
            e.is_symlink = false;
            e.is_dir = false;
        }
        None => now.entries.push(DirEntry::file(name, content, 0o644)),
    }
    plan(&now, settings, facts)
        .actions
        .into_iter()
        .find_map(|a| match a {
            Action::Write { name: n, bytes, .. } if n == name => Some(bytes),
            _ => None,
        })
}

fn remove_owned(cands: &[Candidate], keep: Option<&str>) -> Vec<Action> {
    cands
        .iter()
        .filter(|c| is_ours(c) && Some(c.name()) != keep)
        .map(|c| Action::Remove {
            name: c.name().to_string(),
        })
        .collect()
}

fn plan_owned(snap: &Snapshot, settings: &Settings, facts: &Facts) -> Plan {
    let cands = snap.candidates();
    let foreign: Vec<&Candidate> = cands.iter().filter(|c| !is_owned_name(c.name())).collect();
    let Some(first_foreign) = foreign.first() else {
        return plan_holding(snap, settings);
    };
    let bins = facts.binaries();
    let Some(primary) = foreign
        .iter()
        .find(|c| confdir::usable(c, settings.runtime, &bins.view()).is_ok())
    else {
        let why = match first_foreign.parsed() {
            Err(e) => e.clone(),
            Ok(_) => format!("{}: plugin binaries missing", first_foreign.entry.shown()),
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
        .find(|c| {
            is_owned_name(c.name())
                && c.name().as_bytes() < first_foreign.entry.os_name.as_encoded_bytes()
        })
        .map(|c| c.name().to_string());
    let first_name =
        String::from_utf8_lossy(first_foreign.entry.os_name.as_encoded_bytes()).into_owned();
    let Some(name) = existing
        .or_else(|| owned_name_before(&first_name))
        .filter(|n| n.as_bytes() < first_foreign.entry.os_name.as_encoded_bytes())
    else {
        return Plan {
            actions: vec![],
            target: None,
            problem: Some(format!(
                "cannot name our config so that it sorts before {}: rename that file or list it \
                 in --allow-ahead",
                first_foreign.entry.shown()
            )),
            blocks_ready: false,
        };
    };
    let parsed = match primary.parsed() {
        Ok(p) => p,
        // `usable` said it parsed; keep what we wrote rather than panic if not.
        Err(e) => {
            return Plan {
                problem: Some(format!("no valid primary CNI config to copy ({e})")),
                ..Plan::default()
            }
        }
    };
    let mut list = parsed.list.raw().clone();
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
    if let Err(e) = fit_version(&mut list, &primary.entry.shown(), settings, facts) {
        // Writing it would make interlock-cni refuse every ADD. Keep what we wrote (the
        // runtime keeps working with it) but stay not-ready: the copy cannot follow.
        return Plan {
            actions: vec![],
            target: None,
            problem: Some(format!("cannot copy {}: {e}", primary.entry.shown())),
            blocks_ready: true,
        };
    }
    let bytes = render(&list);
    let mut actions = vec![];
    let current = snap.get(&name);
    if current.and_then(|e| e.content.as_deref()) != Some(bytes.as_slice())
        || current.is_some_and(|e| e.mode != written_mode(primary.mode()))
    {
        actions.push(Action::Write {
            name: name.clone(),
            bytes,
            mode: written_mode(primary.mode()),
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

fn plan_chain(snap: &Snapshot, settings: &Settings, facts: &Facts) -> Plan {
    let cands = snap.candidates();
    // A file only named like ours is someone else's: the runtime reads it like any other.
    let foreign: Vec<Candidate> = cands.iter().filter(|c| !is_ours(c)).cloned().collect();
    if foreign.is_empty() {
        return plan_holding(snap, settings);
    }
    let mut actions = vec![];
    let target = match &settings.chain_target {
        Some(t) => {
            let wrapped = wrapped_name(t);
            match foreign.iter().find(|c| c.name() == t) {
                Some(c) => Ok(c),
                None if snap.get(&backup_name(t)).is_some() => {
                    foreign.iter().find(|c| c.name() == wrapped).ok_or_else(|| {
                        format!("chain target {t} was wrapped into {wrapped}, which is gone")
                    })
                }
                None => Err(format!("chain target {t} not found in the conf dir")),
            }
        }
        None => {
            let bins = facts.binaries();
            let j = confdir::judge_outcome(&foreign, settings.runtime, &snap.dir, &bins.view());
            j.chosen
                .map(|i| &foreign[i])
                .ok_or_else(|| format!("no config to chain into: {}", j.summary))
        }
    };
    let target = target.and_then(|c| {
        if is_owned_name(c.name()) {
            // Once it carried our entry it could not be told apart from an owned-mode
            // file of ours, which chain mode removes.
            return Err(format!(
                "cannot chain into {}: it is named like interlock's own config in owned mode, \
                 so interlock could not tell it apart from its own leftovers; rename it",
                c.entry.shown()
            ));
        }
        Ok(c)
    });
    match target.and_then(|c| chain_into(c, snap, settings, facts)) {
        Ok((more, target)) => {
            actions.extend(more);
            // Only after our entry is in the target: until then the holding config (or
            // an owned copy left by owned mode) is what keeps pods from starting bare.
            actions.extend(remove_owned(&cands, None));
            Plan {
                actions,
                target: Some(target),
                problem: None,
                blocks_ready: false,
            }
        }
        Err(problem) => {
            // Keep the holding config while there is nothing to chain into: removing it
            // would let the runtime load a config without our entry. Other owned copies
            // (left by owned mode) go as before.
            let holding = cands.iter().find(|c| is_holding(c)).map(|c| c.name());
            actions.extend(remove_owned(&cands, holding));
            Plan {
                actions,
                target: None,
                problem: Some(problem),
                blocks_ready: true,
            }
        }
    }
}

/// True for the config the guard keeps first while there is no primary
/// ([`layout::HOLDING_NETWORK`]).
pub fn is_holding(c: &Candidate<'_>) -> bool {
    is_ours(c)
        && c.parsed().as_ref().is_ok_and(|p| {
            p.list.raw().get("name").and_then(Value::as_str) == Some(layout::HOLDING_NETWORK)
        })
}

/// The holding config: interlock-cni alone under [`layout::HOLDING_NETWORK`], whose ADD
/// fails with "try again later". The `cniVersion` is one every runtime interlock supports
/// loads (capped by `--max-cni-version`).
pub fn holding_config(settings: &Settings) -> Vec<u8> {
    let version = match settings.max_cni_version.as_deref() {
        Some(max) if SemVer::parse(max).ok() < SemVer::parse(HOLDING_CNI_VERSION).ok() => max,
        _ => HOLDING_CNI_VERSION,
    };
    let mut list = Map::new();
    list.insert("cniVersion".into(), Value::String(version.to_string()));
    list.insert(
        "name".into(),
        Value::String(layout::HOLDING_NETWORK.to_string()),
    );
    list.insert(
        "plugins".into(),
        Value::Array(vec![Value::Object(settings.entry.clone())]),
    );
    render(&list)
}

/// containerd 1.6 (libcni 1.1) and CRI-O load 1.0.0; 1.1.0 needs a newer libcni.
const HOLDING_CNI_VERSION: &str = "1.0.0";

/// No primary config at all (the node is booting, or the primary removed its file):
/// keep a config of ours first that holds every pod back. When the primary then writes
/// its file, the runtime goes on loading ours, which sorts first, until the guard has
/// replaced it with the primary's chain plus interlock-cni (owned mode, one rename) or
/// chained into the primary's file and then removed it (chain mode). Without it, every
/// pod created between the primary's first write and the guard's reaction would start
/// with the primary alone: an address and no redirection.
/// How the problem of a plan that writes the holding config starts.
pub const WAITING_FOR_PRIMARY: &str = "no CNI config from the primary plugin in the conf dir yet";

fn plan_holding(snap: &Snapshot, settings: &Settings) -> Plan {
    let cands = snap.candidates();
    let first = cands.first().map(|c| c.name().to_string());
    let existing = cands
        .iter()
        .find(|c| is_ours(c) && first.as_deref() == Some(c.name()))
        .map(|c| c.name().to_string());
    let problem = format!(
        "{WAITING_FOR_PRIMARY}: waiting for it; pods are held back (their ADD fails) until it \
         appears"
    );
    let Some(name) = existing.or_else(|| match &first {
        Some(f) => owned_name_before(f),
        None => Some("00-interlock.conflist".to_string()),
    }) else {
        return Plan {
            actions: remove_owned(&cands, None),
            target: None,
            problem: Some(format!(
                "{problem}; cannot name the holding config so that it sorts first"
            )),
            blocks_ready: false,
        };
    };
    let bytes = holding_config(settings);
    let mut actions = vec![];
    let current = snap.get(&name);
    if current.and_then(|e| e.content.as_deref()) != Some(bytes.as_slice())
        || current.is_some_and(|e| e.mode != written_mode(0o644))
    {
        actions.push(Action::Write {
            name: name.clone(),
            bytes,
            mode: written_mode(0o644),
        });
    }
    actions.extend(remove_owned(&cands, Some(&name)));
    Plan {
        actions,
        target: None,
        problem: Some(problem),
        blocks_ready: false,
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
pub fn plan_uninstall(snap: &Snapshot) -> Vec<Action> {
    plan_uninstall_explained(snap).actions
}

/// [`plan_uninstall`] with notes. A `<stem>.conflist` next to a backup is only removed
/// when it is still our wrap of that backup (its content minus our entry equals the
/// lifted original); if the primary has written its own `<stem>.conflist` since, only our
/// entry is stripped from it and the backup is kept (never deleted, never restored over
/// the primary's newer config).
pub fn plan_uninstall_explained(snap: &Snapshot) -> UninstallPlan {
    let cands = snap.candidates();
    let mut actions = vec![];
    let mut notes = vec![];
    let mut restored = HashSet::new();
    for c in &cands {
        if !c.entry.utf8_name() {
            // interlock never writes under a name it cannot spell, so this is not ours.
            continue;
        }
        if is_owned_name(c.name()) {
            if is_ours(c) {
                actions.push(Action::Remove {
                    name: c.name().to_string(),
                });
                if let Some(note) = guarded_plugin_note(c) {
                    notes.push(note);
                }
            } else {
                notes.push(format!(
                    "kept {}: named like interlock's own config, but it does not carry an \
                     interlock-cni entry, so interlock did not write it",
                    c.entry.shown()
                ));
            }
            continue;
        }
        // A conflist we created by wrapping a .conf/.json: put the original back first
        // (it sorts before the .conflist), then remove ours.
        let stem = c.name().strip_suffix(".conflist");
        let orig = stem.and_then(|s| {
            [format!("{s}.conf"), format!("{s}.json")]
                .into_iter()
                .find(|o| snap.get(&backup_name(o)).is_some())
        });
        if let Some(orig) = orig {
            let backup = backup_name(&orig);
            // The backup parsed as the .conf it was.
            let backup_conf = snap
                .get(&backup)
                .and_then(|e| e.content.as_deref())
                .and_then(|b| DirEntry::file(&orig, b, 0).parse().ok());
            let ours = match (c.parsed(), &backup_conf) {
                (Ok(w), Some(b)) => is_wrap_of(w, b),
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
                    name: c.name().to_string(),
                });
                continue;
            }
            notes.push(format!(
                "kept {backup}: {} is no longer interlock's wrap of {orig} (someone rewrote it \
                 since), so only interlock's entry is removed from it and the original \
                 {orig} stays saved under {backup}; delete that file by hand if the primary \
                 no longer needs it",
                c.name()
            ));
        }
        let Ok(parsed) = c.parsed() else { continue };
        if !has_any_entry(parsed) {
            continue;
        }
        let mut orig = parsed.original().clone();
        match parsed.format {
            ConfFormat::Conflist => {
                let kept: Vec<Value> = parsed
                    .plugins()
                    .iter()
                    .filter(|p| !is_entry(p))
                    .cloned()
                    .collect();
                orig.insert("plugins".into(), Value::Array(kept));
            }
            ConfFormat::Conf => {
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
            name: c.name().to_string(),
            bytes: render(&orig),
            mode: c.mode(),
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

/// The note for removing guard file `c` when it carries a guarded mesh's plugin: the
/// chain loses that plugin until its installer writes it again. Interlock does not write
/// it into another file itself (that would be writing the mesh's entry for it).
fn guarded_plugin_note(c: &Candidate<'_>) -> Option<String> {
    let p = c.parsed().as_ref().ok()?;
    let t = p
        .list
        .plugin_types()
        .into_iter()
        .find_map(GuardedMesh::from_plugin_type)?;
    Some(format!(
        "removed {}, interlock's guard file, which carried {}: the chain lacks {} until \
         the {t} CNI installer writes it again (linkerd-cni and consul-cni do on the \
         directory's next change; istio-cni, if this file was its target, waits for it to \
         come back: restart the istio-cni DaemonSet's pod on this node)",
        c.entry.shown(),
        t.plugin_type(),
        t.plugin_type()
    ))
}

/// Whether the runtime's effective config runs our entry (once, after the primary, at a
/// `cniVersion` interlock-cni accepts), with the binaries as `facts` know them. `Ok(name)`
/// of the effective file when it does, otherwise why not.
pub fn check_effective(
    snap: &Snapshot,
    settings: &Settings,
    facts: &Facts,
) -> Result<String, String> {
    let bins = facts.binaries();
    check_effective_with(snap, settings, &bins.view(), &interlock_versions(facts))
}

/// The config the runtime loads from `snap` and its file name, or why none.
fn effective_named(
    snap: &Snapshot,
    runtime: Runtime,
    bins: &Binaries<'_>,
) -> Result<(confdir::Chosen, String), String> {
    let (chosen, summary) = confdir::effective_outcome(snap, runtime, bins);
    let chosen = chosen.ok_or(summary)?;
    let name = chosen
        .path
        .file_name()
        .map(interlock_contract::shown::shown_os)
        .unwrap_or_default();
    Ok((chosen, name))
}

/// [`check_effective`] with the plugin binaries as `bins` and the versions interlock-cni
/// `accepts`. The same judgement ([`confdir::effective`], [`confdir::runs_plugin`],
/// [`confdir::version_refused`]) as `interlock check`.
pub fn check_effective_with(
    snap: &Snapshot,
    settings: &Settings,
    bins: &Binaries<'_>,
    accepts: &[String],
) -> Result<String, String> {
    let (chosen, name) = effective_named(snap, settings.runtime, bins)?;
    let chosen = &chosen;
    let parsed = Parsed {
        list: chosen.list.clone(),
        format: chosen.format,
    };
    let what = format!("the effective config {name}");
    let version = runs_entry(&parsed, &what, &settings.entry)?;
    if let Some(why) = confdir::version_refused(&what, PLUGIN_TYPE, &version, accepts) {
        return Err(why);
    }
    Ok(name)
}

/// Applies `actions` to a snapshot in memory (what the directory looks like afterwards).
/// Used by tests and by the bench to predict outcomes.
pub fn apply_in_memory(snap: &Snapshot, actions: &[Action]) -> Snapshot {
    let mut out = snap.clone();
    for a in actions {
        match a {
            Action::Write { name, bytes, mode } => {
                out.entries.retain(|e| &e.name != name);
                out.entries.push(DirEntry::file(name, bytes, *mode));
            }
            Action::Rename { from, to } => {
                if let Some(mut e) = out.entries.iter().find(|e| &e.name == from).cloned() {
                    out.entries.retain(|e| &e.name != from && &e.name != to);
                    e.name = to.clone();
                    e.os_name = to.into();
                    out.entries.push(e);
                }
            }
            Action::Remove { name } => out.entries.retain(|e| &e.name != name),
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Guard mode (issue 29): keep a mesh's own CNI plugin, T, in the effective chain.

/// What the thin layer learnt about the guarded mesh's plugin before a plan.
#[derive(Debug, Clone, PartialEq)]
pub struct GuardInput {
    /// The guarded mesh.
    pub mesh: GuardedMesh,
    /// T as learnt (verbatim, key order kept; [`crate::guard::learn`]), if any.
    pub learned: Option<Map<String, Value>>,
    /// Why T cannot run now apart from its VERSION answer (binary missing, a file it
    /// needs at ADD missing, never learnt), worded for the node's reason; `None`: nothing
    /// found against it.
    pub unusable: Option<String>,
    /// While the guard holds, the installer put T back into the guard file after the
    /// guard left it out: keep the installer's T there rather than strip it again (the
    /// two would otherwise rewrite the file in turn for as long as the hold lasts).
    pub installer_put_t_back: bool,
}

/// The guard-mode state of the node's config, published for readiness, metrics and
/// `check`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuardState {
    /// No valid foreign config: the holding config is kept (every ADD refused).
    NoPrimary {
        /// Why (no primary yet, or none usable).
        reason: String,
    },
    /// A primary, but T cannot run: the guard file runs the primary's plugins and
    /// `interlock-cni` holding meshed pods back.
    Hold {
        /// Why T cannot run, for the node's reason and the refused pods' error.
        reason: String,
    },
    /// The guard file runs the primary's plugins, `interlock-cni` in its guard role and T.
    Guard,
}

impl GuardState {
    /// The state's name in metrics and logs (`no-primary`, `hold`, `guard`).
    pub fn as_str(&self) -> &'static str {
        match self {
            GuardState::NoPrimary { .. } => "no-primary",
            GuardState::Hold { .. } => "hold",
            GuardState::Guard => "guard",
        }
    }

    /// Every state name, for the metric's series.
    pub const NAMES: [&'static str; 3] = crate::health::metrics::GUARD_STATES;
}

/// The plugin `type` of `p`, if any.
fn type_of(p: &Value) -> Option<&str> {
    p.get("type").and_then(Value::as_str)
}

/// The last entry of type `t` in `list`'s `plugins` (a `.conflist`'s, or a list some
/// installer wrote into a `.conf`), if any.
pub fn entry_of_type<'a>(list: &'a Map<String, Value>, t: &str) -> Option<&'a Map<String, Value>> {
    list.get("plugins")
        .and_then(Value::as_array)?
        .iter()
        .rev()
        .find(|p| type_of(p) == Some(t))
        .and_then(Value::as_object)
}

/// Namespaces T never touches, from its entry (Istio: `exclude_namespaces`; Kuma:
/// `kubernetes.exclude_namespaces`; the others have none).
pub fn excluded_namespaces(mesh: GuardedMesh, t: &Map<String, Value>) -> Vec<String> {
    let v = match mesh {
        GuardedMesh::Istio => t.get("exclude_namespaces"),
        GuardedMesh::Kuma => t
            .get("kubernetes")
            .and_then(|k| k.get("exclude_namespaces")),
        GuardedMesh::Linkerd | GuardedMesh::Consul => None,
    };
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Our entry in its guard role: `settings.entry` plus the `guard` field.
pub fn guard_entry(
    settings: &Settings,
    mesh: GuardedMesh,
    t: Option<&Map<String, Value>>,
    hold: Option<&str>,
) -> Map<String, Value> {
    let role = GuardRole {
        mesh,
        hold: hold.is_some(),
        reason: hold.map(str::to_string),
        exclude_namespaces: t.map(|t| excluded_namespaces(mesh, t)).unwrap_or_default(),
    };
    let mut entry = settings.entry.clone();
    // GuardRole is plain data: serialising it cannot fail, and a failure would only
    // leave the role out, which the plugin reads as no guard role (redirect as usual).
    if let Ok(v) = serde_json::to_value(&role) {
        entry.insert("guard".into(), v);
    }
    entry
}

/// True when `bytes` parse to exactly `want` up to object key order (every mesh's
/// installer round-trips the file through a Go map, which sorts keys; treating that as a
/// difference would make interlock and Linkerd rewrite the file in turn for ever).
pub fn same_config(bytes: Option<&[u8]>, want: &Map<String, Value>) -> bool {
    bytes
        .and_then(|b| serde_json::from_slice::<Value>(b).ok())
        .is_some_and(|v| v.as_object() == Some(want))
}

/// A write of `want` to `name` unless it already holds it (up to key order) with a mode
/// no other user can write.
fn write_unless_same(snap: &Snapshot, name: &str, want: &Map<String, Value>) -> Vec<Action> {
    let current = snap.get(name);
    let same = same_config(current.and_then(|e| e.content.as_deref()), want);
    if same && current.is_some_and(|e| e.mode & 0o022 == 0) {
        return vec![];
    }
    vec![Action::Write {
        name: name.to_string(),
        bytes: render(want),
        mode: written_mode(current.map_or(0o644, |e| e.mode)),
    }]
}

/// Guard mode's plan and the state it puts the node's config in.
///
/// - No valid foreign config: the holding config, under the name it will keep as the
///   guard file. An installer appending T to it is accepted (never stripped).
/// - A primary and a usable T: the guard file is the primary's list with its plugins
///   (minus any T and interlock entries), `interlock-cni` in its guard role, then T
///   exactly as learnt, last (consul-k8s insists on it; all four installers append).
/// - A primary and no usable T: the same without T, and `interlock-cni` holding meshed
///   pods back (`hold: true`, the reason in the entry). T is left out once; if the
///   installer puts it back during the hold ([`GuardInput::installer_put_t_back`]), its
///   T stays after `interlock-cni`, which keeps holding meshed pods.
///
/// The guard file keeps its name once chosen: Istio's installer may have made it its
/// sticky target, and would wait for it for ever if it moved. A file that comes to sort
/// ahead of it is therefore reported (not ready) rather than overtaken.
pub fn plan_guard(snap: &Snapshot, settings: &Settings, facts: &Facts) -> (Plan, GuardState) {
    let Some(g) = &settings.guard else {
        let why = "guard mode without a guarded mesh (--guard-mesh)".to_string();
        return (
            Plan {
                problem: Some(why.clone()),
                blocks_ready: true,
                ..Plan::default()
            },
            GuardState::NoPrimary { reason: why },
        );
    };
    let t_type = g.mesh.plugin_type();
    let cands = snap.candidates();
    let foreign: Vec<&Candidate> = cands.iter().filter(|c| !is_owned_name(c.name())).collect();
    // The guard file keeps its name: the first file of ours there is (with our entry),
    // wherever it sorts now.
    let existing = cands
        .iter()
        .find(|c| is_ours(c) && c.entry.utf8_name())
        .map(|c| c.name().to_string());
    let Some(first_foreign) = foreign.first() else {
        return plan_guard_holding(snap, settings, t_type, existing);
    };
    let first_name =
        String::from_utf8_lossy(first_foreign.entry.os_name.as_encoded_bytes()).into_owned();
    // T's binary may be gone while T still sits in the primary's file; the guard file
    // never copies it from there, so it does not make the primary unusable.
    let present = |t: &str| t == t_type || facts.present_types.contains(t);
    let bins = Binaries {
        dirs: &[],
        present: &present,
        versions: None,
    };
    let Some(primary) = foreign
        .iter()
        .find(|c| confdir::usable(c, settings.runtime, &bins).is_ok())
    else {
        let why = match first_foreign.parsed() {
            Err(e) => e.clone(),
            Ok(_) => format!("{}: plugin binaries missing", first_foreign.entry.shown()),
        };
        let reason = format!("no valid primary CNI config to copy ({why})");
        // Keep whatever we wrote: the primary is probably mid-way through a rewrite.
        return (
            Plan {
                problem: Some(reason.clone()),
                ..Plan::default()
            },
            GuardState::NoPrimary { reason },
        );
    };
    let name = match existing.or_else(|| owned_name_before(&first_name)) {
        Some(n) => n,
        None => {
            let reason = format!(
                "cannot name the guard file so that it sorts before {}: rename that file",
                first_foreign.entry.shown()
            );
            return (
                Plan {
                    problem: Some(reason.clone()),
                    blocks_ready: true,
                    ..Plan::default()
                },
                GuardState::NoPrimary { reason },
            );
        }
    };
    if is_meta(primary, settings) {
        let reason = format!(
            "{} is a meta plugin's config (Multus or similar): guard mode does not support \
             it; the mesh's plugin cannot be guarded in a delegate",
            primary.entry.shown()
        );
        return (
            Plan {
                problem: Some(reason.clone()),
                blocks_ready: true,
                ..Plan::default()
            },
            GuardState::NoPrimary { reason },
        );
    }
    let parsed = match primary.parsed() {
        Ok(p) => p,
        Err(e) => {
            let reason = format!("no valid primary CNI config to copy ({e})");
            return (
                Plan {
                    problem: Some(reason.clone()),
                    ..Plan::default()
                },
                GuardState::NoPrimary { reason },
            );
        }
    };
    let base: Vec<Value> = parsed
        .plugins()
        .iter()
        .filter(|p| !is_entry(p) && type_of(p) != Some(t_type))
        .cloned()
        .collect();
    // The list as the runtime reads it (a `.conf` lifted into a list, as owned mode
    // copies it).
    let mut list = parsed.list.raw().clone();
    // The version every plugin of the full chain (with T) accepts.
    let mut types: Vec<String> = base
        .iter()
        .filter_map(|p| type_of(p).map(str::to_string))
        .collect();
    types.push(PLUGIN_TYPE.to_string());
    types.push(t_type.to_string());
    let version = choose_cni_version(
        parsed.cni_version(),
        &types,
        &facts.versions,
        settings.max_cni_version.as_deref(),
    );
    list.insert("cniVersion".into(), Value::String(version));
    let with_entry = |entry: Map<String, Value>, t: Option<&Map<String, Value>>| {
        let mut ps = base.clone();
        ps.push(Value::Object(entry));
        if let Some(t) = t {
            ps.push(Value::Object(t.clone()));
        }
        ps
    };
    // Fit the list's version to interlock-cni and the primary's plugins first (as owned
    // mode does); T is judged against the result.
    list.insert(
        "plugins".into(),
        Value::Array(with_entry(settings.entry.clone(), None)),
    );
    if let Err(e) = fit_version(&mut list, &primary.entry.shown(), settings, facts) {
        let reason = format!("cannot copy {}: {e}", primary.entry.shown());
        return (
            Plan {
                problem: Some(reason.clone()),
                blocks_ready: true,
                ..Plan::default()
            },
            GuardState::NoPrimary { reason },
        );
    }
    let version = list
        .get("cniVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let hold = t_unusable(g, &version, facts);
    let t = g.learned.as_ref().filter(|_| hold.is_none());
    let entry = guard_entry(settings, g.mesh, g.learned.as_ref(), hold.as_deref());
    let mut plugins = with_entry(entry, t);
    if hold.is_some() && g.installer_put_t_back {
        // interlock-cni still runs first and refuses meshed pods; an unmeshed pod fails
        // at T as it would without interlock. Converging beats a fight with the installer.
        plugins.extend(t_entries_in(snap, &name, t_type));
    }
    list.insert("plugins".into(), Value::Array(plugins));
    let mut actions = write_unless_same(snap, &name, &list);
    actions.extend(remove_owned(&cands, Some(&name)));
    let ahead = name.as_bytes() >= first_foreign.entry.os_name.as_encoded_bytes();
    let (problem, blocks_ready) = match (&hold, ahead) {
        (_, true) => (
            Some(format!(
                "{} sorts ahead of the guard file {}, so the runtime loads it instead: \
                 interlock keeps the guard file's name (the {} installer may have made it \
                 its target) and stays not ready; remove that file or rename it to sort \
                 after {}",
                first_foreign.entry.shown(),
                shown(&name),
                g.mesh,
                shown(&name)
            )),
            true,
        ),
        (Some(h), false) => (Some(format!("{h}: meshed pods are held")), true),
        (None, false) => (None, false),
    };
    let state = match hold {
        Some(reason) => GuardState::Hold { reason },
        None => GuardState::Guard,
    };
    (
        Plan {
            actions,
            target: Some(name),
            problem,
            blocks_ready,
        },
        state,
    )
}

/// Why T cannot run in a list of `version`, or `None` when it can.
fn t_unusable(g: &GuardInput, version: &str, facts: &Facts) -> Option<String> {
    let t_type = g.mesh.plugin_type();
    if g.learned.is_none() {
        return Some(g.unusable.clone().unwrap_or_else(|| {
            format!(
                "no {t_type} entry learnt yet: no config file in the conf dir carries one \
                 (the {} CNI installer has not written it)",
                g.mesh
            )
        }));
    }
    if let Some(u) = &g.unusable {
        return Some(u.clone());
    }
    let Some(accepts) = facts.versions.get(t_type) else {
        return Some(format!("{t_type} has not answered VERSION (yet)"));
    };
    confdir::version_refused("the guard file", t_type, version, accepts)
}

/// Whether another writer put T (`t_type`) back into the guard file `name` after
/// interlock left it out: interlock's last write there (`left`) had no T and the file has
/// one now.
pub fn t_put_back(
    snap: &Snapshot,
    name: &str,
    left: &HashMap<String, Option<Vec<u8>>>,
    t_type: &str,
) -> bool {
    let ours_without_t = matches!(left.get(name), Some(Some(b)) if !runs_type(b, t_type));
    ours_without_t
        && snap
            .get(name)
            .and_then(|e| e.content.as_deref())
            .is_some_and(|b| runs_type(b, t_type))
}

/// Whether the config file `bytes` parses to a list with an entry of type `t`.
pub fn runs_type(bytes: &[u8], t: &str) -> bool {
    serde_json::from_slice::<Map<String, Value>>(bytes)
        .is_ok_and(|l| entry_of_type(&l, t).is_some())
}

/// The entries of type `t_type` in `name`'s `plugins` as the conf dir has them now.
fn t_entries_in(snap: &Snapshot, name: &str, t_type: &str) -> Vec<Value> {
    snap.get(name)
        .and_then(|e| e.content.as_deref())
        .and_then(|b| serde_json::from_slice::<Value>(b).ok())
        .and_then(|v| v.get("plugins").and_then(Value::as_array).cloned())
        .unwrap_or_default()
        .into_iter()
        .filter(|p| type_of(p) == Some(t_type))
        .collect()
}

/// No primary in guard mode: today's holding config, except that T entries an installer
/// appended to it are kept (Linkerd injects into every file, Istio and Consul pick the
/// first one): stripping them would start a loop with the installer.
fn plan_guard_holding(
    snap: &Snapshot,
    settings: &Settings,
    t_type: &str,
    existing: Option<String>,
) -> (Plan, GuardState) {
    let mut plan = plan_holding(snap, settings);
    let reason = plan
        .problem
        .clone()
        .unwrap_or_else(|| WAITING_FOR_PRIMARY.to_string());
    // plan_holding names the file itself; a guard file of ours that is already there
    // keeps its name (it is the only candidate then, so the two agree).
    let name = plan
        .actions
        .iter()
        .find_map(|a| match a {
            Action::Write { name, .. } => Some(name.clone()),
            _ => None,
        })
        .or(existing);
    if let Some(name) = name {
        let theirs = t_entries_in(snap, &name, t_type);
        let holding: Value = serde_json::from_slice(&holding_config(settings)).unwrap_or_default();
        if let Some(mut want) = holding.as_object().cloned() {
            if let Some(Value::Array(ps)) = want.get_mut("plugins") {
                ps.extend(theirs);
            }
            let write = write_unless_same(snap, &name, &want);
            plan.actions.retain(|a| a.file() != name);
            plan.actions.splice(0..0, write);
        }
    }
    (plan, GuardState::NoPrimary { reason })
}

/// Whether the runtime's effective config is the guard file `guard_file` and runs
/// `interlock-cni` (at a version it `accepts`) and, in [`GuardState::Guard`], T after it:
/// `Ok(file)` or why not. The same predicates as `interlock check`
/// ([`confdir::effective_outcome`], [`confdir::runs_plugin`], [`confdir::version_refused`]).
pub fn check_effective_guard(
    snap: &Snapshot,
    settings: &Settings,
    bins: &Binaries<'_>,
    accepts: &[String],
    state: &GuardState,
    guard_file: Option<&str>,
) -> Result<String, String> {
    let (chosen, name) = effective_named(snap, settings.runtime, bins)?;
    let chosen = &chosen;
    if let Some(g) = guard_file.filter(|g| *g != name) {
        return Err(format!(
            "the effective config is {name}, not the guard file {}",
            shown(g)
        ));
    }
    let what = format!("the effective config {name}");
    let ours = confdir::runs_plugin(&chosen.list, &what, PLUGIN_TYPE)?;
    if let Some(why) = confdir::version_refused(&what, PLUGIN_TYPE, &ours.version, accepts) {
        return Err(why);
    }
    if *state == GuardState::Guard {
        if let Some(g) = &settings.guard {
            let t_type = g.mesh.plugin_type();
            confdir::runs_plugin(&chosen.list, &what, t_type)?;
            let plugins = chosen.list.plugins();
            let at = |t: &str| plugins.iter().position(|p| type_of(p) == Some(t));
            match (at(PLUGIN_TYPE), at(t_type)) {
                (Some(i), Some(j)) if i < j => {}
                _ => {
                    return Err(format!(
                        "{what} runs {t_type} before interlock-cni: meshed pods would not be \
                         held while {t_type} cannot run"
                    ))
                }
            }
        }
    }
    Ok(name)
}

//! Which network a container runtime loads from a CNI config directory, and why — the
//! one model of a conf dir that the agent, `interlock check` and the demo share.
//!
//! Two rule sets, reproduced from the runtimes' code:
//!
//! - **containerd** (go-cni `loadFromConfDir` with `max_conf_num = 1`): files whose
//!   extension is `.conf`, `.conflist` or `.json`, sorted by name; `.conflist` is parsed as
//!   a list, the others as a single network config (which must have a `type`) wrapped
//!   into a list. The first file wins. If that first file cannot be read or parsed, the
//!   **whole load fails** and the runtime has no network at all (fail-closed); files after
//!   the chosen one are never read ([`containerd_rules`]).
//! - **CRI-O** (ocicni `loadNetworks`): same listing and parsing, but a file that fails to
//!   parse, or whose plugins' binaries are missing from the plugin directories, is
//!   **skipped** and the next one is tried (fail-open). The default network is the first
//!   file that survives; an empty `name` becomes the file name; a later file with an
//!   already loaded name is ignored ([`crio_rules`]).
//!
//! The layers: [`read`] takes a [`Snapshot`] of the directory (bounded reads of regular
//! files only, `interlock_contract::bounded`); [`effective`] judges it, purely — the plugin
//! binaries are seen through a [`Binaries`] the caller provides (CRI-O's VERSION probe is
//! a closure); [`load`] is the two together. [`DirCache`] gives the same snapshot to a
//! long-lived reader (the agent) re-reading only what changed. [`runs_plugin`] answers "does this list run
//! interlock's entry, and at which `cniVersion`" (thin Multus delegates included) for the
//! agent's readiness and for `interlock check` alike.

use std::cell::OnceCell;
use std::ffi::OsString;
use std::fmt;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde_json::{Map, Value};

mod dir_cache;
pub mod runtime_config;
pub use dir_cache::{CacheWork, DirCache};

use interlock_cni_types::version::CniVersion;
use interlock_contract::bounded;
use interlock_contract::shown::shown_os;
use interlock_libcni::conf::{self, ConfFormat, NetworkConfigList, Validation};
use interlock_libcni::exec::{find_plugin, plugin_version};

/// The extensions both runtimes load.
pub const EXTENSIONS: [&str; 3] = [".conf", ".conflist", ".json"];

/// Meta plugins that run the real chain as a delegate (thin Multus: `delegates[0]`).
pub const META_PLUGIN_TYPES: [&str; 2] = ["multus", "multus-shim"];

/// Which runtime's loading rules to apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    /// containerd (go-cni): first file wins, an invalid first file fails the load.
    Containerd,
    /// CRI-O (ocicni): invalid files and files with missing plugin binaries are skipped.
    Crio,
}

impl Runtime {
    /// The names accepted on a command line.
    pub const NAMES: [&'static str; 2] = ["containerd", "crio"];
}

impl fmt::Display for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Runtime::Containerd => "containerd",
            Runtime::Crio => "CRI-O",
        })
    }
}

impl FromStr for Runtime {
    type Err = String;

    fn from_str(s: &str) -> Result<Runtime, String> {
        match s.to_ascii_lowercase().as_str() {
            "containerd" => Ok(Runtime::Containerd),
            "crio" | "cri-o" => Ok(Runtime::Crio),
            other => Err(format!(
                "unknown runtime {other:?} (expected one of: {})",
                Runtime::NAMES.join(", ")
            )),
        }
    }
}

/// What the runtime did with one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// This file is the network the runtime uses.
    Chosen,
    /// containerd: this file is invalid and sorts first, so the whole load failed.
    FailedLoad,
    /// CRI-O: invalid or unusable, skipped.
    Skipped,
    /// CRI-O: valid and loaded as an additional network, but not the default one.
    LoadedNotDefault,
    /// CRI-O: valid but ignored because a network with the same name was loaded first.
    DuplicateName,
    /// Never read: the runtime had already chosen (or failed) on an earlier file.
    NotReached,
    /// Not a config file for the runtime (other extension, or a directory).
    Ignored,
}

fn lossy_path<S: serde::Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&shown_os(p.as_os_str()))
}

/// The verdict on one directory entry, with the reason in words.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FileVerdict {
    /// Full path of the entry (in JSON: escaped like [`shown_os`], so always valid).
    #[serde(serialize_with = "lossy_path")]
    pub path: PathBuf,
    /// What happened to it.
    pub verdict: Verdict,
    /// Why, in words an operator can act on.
    pub reason: String,
}

/// The network the runtime would use.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Chosen {
    /// The file it comes from.
    #[serde(serialize_with = "lossy_path")]
    pub path: PathBuf,
    /// Its contents as a list (a `.conf` is wrapped like libcni's `ConfListFromConf`).
    pub list: NetworkConfigList,
    /// Whether the file was a `.conflist` or a single config.
    pub format: ConfFormat,
    /// The network name the runtime uses (CRI-O: the file name when `name` is empty).
    pub network_name: String,
}

/// "Which network would this runtime load from this directory, and why."
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Effective {
    /// The rules applied.
    pub runtime: Runtime,
    /// The directory examined.
    #[serde(serialize_with = "lossy_path")]
    pub dir: PathBuf,
    /// The network in effect, or `None` when the runtime has no network.
    pub chosen: Option<Chosen>,
    /// Every entry of the directory in the order the runtime considers them (config
    /// files sorted by name, then ignored entries).
    pub files: Vec<FileVerdict>,
    /// One sentence summing up the outcome (why this file, or why no network).
    pub summary: String,
}

impl Effective {
    /// The verdict for a file name, if the directory has it.
    pub fn verdict_for(&self, file_name: &str) -> Option<&FileVerdict> {
        self.files
            .iter()
            .find(|f| f.path.file_name().is_some_and(|n| n == file_name))
    }

    /// The chosen file's name, if any (as the OS spells it, lossily when not UTF-8).
    pub fn chosen_name(&self) -> Option<String> {
        self.chosen
            .as_ref()
            .and_then(|c| c.path.file_name())
            .map(|n| n.to_string_lossy().into_owned())
    }
}

/// `filepath.Ext`: the suffix from the last dot of the final element.
fn extension(name: &[u8]) -> &[u8] {
    match name.iter().rposition(|&b| b == b'.') {
        Some(i) => &name[i..],
        None => &[],
    }
}

fn is_config_bytes(name: &[u8]) -> bool {
    // One search for the extension (this runs for every entry of a large directory on
    // every judgement).
    let ext = extension(name);
    EXTENSIONS.iter().any(|e| ext == e.as_bytes())
}

/// True when a runtime would consider a file with this name.
pub fn is_config_name(name: &str) -> bool {
    is_config_bytes(name.as_bytes())
}

/// One directory entry as [`read`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// File name. Exact when the OS name is UTF-8 (see [`DirEntry::utf8_name`]);
    /// otherwise a lossy rendering that must not be used to address the file.
    pub name: String,
    /// The name as the OS spells it.
    pub os_name: OsString,
    /// A directory in the listing (the runtimes skip these; a symlink to a directory
    /// is not one, as in Go's `DirEntry.IsDir`).
    pub is_dir: bool,
    /// The name is a symbolic link (the runtimes follow it).
    pub is_symlink: bool,
    /// File content; `None` when not read (not a config name, unreadable, or sorting
    /// after the file a [`read_until`] stopped at).
    pub content: Option<Vec<u8>>,
    /// Why the content could not be read (not a regular file, over the cap, gone…).
    pub unreadable: Option<String>,
    /// interlock refused to read it (not a regular file, or over the size cap) although a
    /// runtime would try: what the runtime makes of it is unknown.
    pub refused: bool,
    /// Permission bits of what the name resolves to.
    pub mode: u32,
    /// Owner of what the name resolves to.
    pub uid: u32,
    /// The parse of this content, made once and shared by clones (see [`ParseMemo`]).
    memo: ParseMemo,
}

/// [`DirEntry::parse`]'s result for one version of an entry, kept with it: clones of the
/// entry (the snapshots a [`DirCache`] hands out, for as long as the file is unchanged)
/// share it, so a long-lived reader parses each version of a file once instead of on
/// every judgement. It answers only for the name and content it was made from, so an
/// entry whose public fields were changed afterwards is parsed afresh.
#[derive(Clone, Default)]
struct ParseMemo(std::sync::Arc<std::sync::OnceLock<ParseOf>>);

/// A parse result and what it was made from.
struct ParseOf {
    os_name: OsString,
    content: Vec<u8>,
    result: Result<Parsed, String>,
}

impl fmt::Debug for ParseMemo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ParseMemo")
    }
}

/// Equal whatever they hold: a memo is not part of what an entry is.
impl PartialEq for ParseMemo {
    fn eq(&self, _: &ParseMemo) -> bool {
        true
    }
}

impl Eq for ParseMemo {}

impl DirEntry {
    /// A regular file with `content` (for tests and tools that model a directory).
    pub fn file(name: &str, content: &[u8], mode: u32) -> DirEntry {
        DirEntry {
            name: name.to_string(),
            os_name: name.into(),
            is_dir: false,
            is_symlink: false,
            content: Some(content.to_vec()),
            unreadable: None,
            refused: false,
            mode,
            uid: 0,
            memo: ParseMemo::default(),
        }
    }

    /// True when [`DirEntry::name`] is the exact name (the OS name is UTF-8).
    pub fn utf8_name(&self) -> bool {
        self.os_name.to_str().is_some()
    }

    /// The name, escaped for logs and terminals ([`shown_os`]).
    pub fn shown(&self) -> String {
        shown_os(&self.os_name)
    }

    /// True when a runtime would consider this entry.
    pub fn is_config(&self) -> bool {
        !self.is_dir && is_config_bytes(self.os_name.as_bytes())
    }

    /// [`DirEntry::parse`], made once per version of the content and shared by clones
    /// of this entry. `None` when there is no content (nothing worth keeping).
    pub fn parsed(&self) -> Option<&Result<Parsed, String>> {
        let content = self.content.as_ref()?;
        let of = self.memo.0.get_or_init(|| ParseOf {
            os_name: self.os_name.clone(),
            content: content.clone(),
            result: self.parse_now(),
        });
        (of.os_name == self.os_name && of.content == *content).then_some(&of.result)
    }

    /// Parses the content the way both runtimes do (list for `.conflist`, single config
    /// otherwise). The error is a sentence naming the file.
    pub fn parse(&self) -> Result<Parsed, String> {
        match self.parsed() {
            Some(r) => r.clone(),
            None => self.parse_now(),
        }
    }

    fn parse_now(&self) -> Result<Parsed, String> {
        let name = self.shown();
        let Some(bytes) = &self.content else {
            return Err(self
                .unreadable
                .clone()
                .unwrap_or_else(|| format!("{name} was not read")));
        };
        if extension(self.os_name.as_bytes()) == b".conflist" {
            conf::parse_conflist_with(bytes, Validation::Libcni)
                .map(|list| Parsed {
                    list,
                    format: ConfFormat::Conflist,
                })
                .map_err(|e| format!("{name} is not a valid config list: {e}"))
        } else {
            conf::parse_conf_with(bytes, Validation::Libcni)
                .map(|list| Parsed {
                    list,
                    format: ConfFormat::Conf,
                })
                .map_err(|e| {
                    let hint = if e.field_name() == Some("type") {
                        " (perhaps this is a .conflist?)"
                    } else {
                        ""
                    };
                    format!("{name} is not a valid network config: {e}{hint}")
                })
        }
    }
}

/// A parsed config file: its list form with every foreign field in its original order.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    /// The list form (a `.conf` lifted like libcni's `ConfListFromConf`).
    pub list: NetworkConfigList,
    /// On-disk format.
    pub format: ConfFormat,
}

impl Parsed {
    /// The file's top-level JSON object as written (for a `.conf`: the single config).
    pub fn original(&self) -> &Map<String, Value> {
        match self.format {
            ConfFormat::Conflist => self.list.raw(),
            ConfFormat::Conf => self
                .list
                .plugins()
                .first()
                .and_then(Value::as_object)
                .unwrap_or_else(|| self.list.raw()),
        }
    }

    /// The plugins of the list form.
    pub fn plugins(&self) -> &[Value] {
        self.list.plugins()
    }

    /// Plugin `type`s in order.
    pub fn plugin_types(&self) -> Vec<String> {
        self.list
            .plugin_types()
            .into_iter()
            .map(str::to_string)
            .collect()
    }

    /// The list's `cniVersion` as written (empty when absent).
    pub fn cni_version(&self) -> &str {
        self.list.cni_version_raw().unwrap_or("")
    }
}

/// A config file in the runtime's order, parsed when first asked.
#[derive(Debug, Clone)]
pub struct Candidate<'a> {
    /// The directory entry.
    pub entry: &'a DirEntry,
    /// Only for an entry without a parse memo of its own; boxed, so that the list of a
    /// large directory's candidates stays small.
    parsed: OnceCell<Box<Result<Parsed, String>>>,
}

impl<'a> Candidate<'a> {
    /// A candidate for `entry`.
    pub fn new(entry: &'a DirEntry) -> Candidate<'a> {
        Candidate {
            entry,
            parsed: OnceCell::new(),
        }
    }

    /// File name.
    pub fn name(&self) -> &'a str {
        &self.entry.name
    }

    /// Permission bits.
    pub fn mode(&self) -> u32 {
        self.entry.mode
    }

    /// Parse result (parsed once per version of the file: [`DirEntry::parsed`]).
    pub fn parsed(&self) -> &Result<Parsed, String> {
        if let Some(r) = self.entry.parsed() {
            return r;
        }
        self.parsed.get_or_init(|| Box::new(self.entry.parse_now()))
    }
}

/// The iterator [`Snapshot::candidates_iter`] returns.
#[derive(Debug)]
pub enum Candidates<'a> {
    /// A cache's snapshot: positions of its config files among its sorted entries.
    Kept(&'a [DirEntry], std::slice::Iter<'a, u32>),
    /// Any other snapshot: its config files, sorted here.
    Sorted(std::vec::IntoIter<&'a DirEntry>),
}

impl<'a> Iterator for Candidates<'a> {
    type Item = Candidate<'a>;

    fn next(&mut self) -> Option<Candidate<'a>> {
        match self {
            Candidates::Kept(entries, at) => {
                at.next().map(|&i| Candidate::new(&entries[i as usize]))
            }
            Candidates::Sorted(it) => it.next().map(Candidate::new),
        }
    }
}

/// The conf dir at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// The directory.
    pub dir: PathBuf,
    /// Entries, in any order; [`Snapshot::candidates`] sorts them the runtime's way.
    pub entries: Vec<DirEntry>,
    /// Which entries are config files, for the snapshot a [`DirCache`] keeps (see
    /// [`ConfigOrder`]).
    order: ConfigOrder,
}

/// The positions of the config files among a [`DirCache`]'s entries (which it keeps in
/// the runtime's order), found once per change of the listing instead of on every
/// [`Snapshot::candidates`] — a judgement asks for them several times per change, and
/// a large directory's foreign files then cost a scan and a sort each time. Only the
/// cache sets one (it resets it whenever a name comes or goes); nobody else can change
/// its snapshot's entries (it lends it out shared), and a clone goes without one.
#[derive(Default)]
struct ConfigOrder(Option<std::sync::OnceLock<Vec<u32>>>);

impl ConfigOrder {
    /// An empty memo for a cache's snapshot.
    fn fresh() -> ConfigOrder {
        ConfigOrder(Some(std::sync::OnceLock::new()))
    }
}

impl Clone for ConfigOrder {
    fn clone(&self) -> ConfigOrder {
        ConfigOrder(None)
    }
}

impl fmt::Debug for ConfigOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ConfigOrder")
    }
}

/// Equal whatever they hold: a memo is not part of what a snapshot is.
impl PartialEq for ConfigOrder {
    fn eq(&self, _: &ConfigOrder) -> bool {
        true
    }
}

impl Eq for ConfigOrder {}

impl Snapshot {
    /// A snapshot of `(name, content)` files, all with permission bits `mode` (for tests
    /// and tools that model a directory without touching the disk).
    pub fn from_files(files: &[(&str, &str)], mode: u32) -> Snapshot {
        Snapshot {
            dir: PathBuf::new(),
            entries: files
                .iter()
                .map(|(n, c)| DirEntry::file(n, c.as_bytes(), mode))
                .collect(),
            order: ConfigOrder::default(),
        }
    }

    /// The config files sorted by name (bytewise, like Go's `sort.Strings`).
    pub fn candidates(&self) -> Vec<Candidate<'_>> {
        self.candidates_iter().collect()
    }

    /// [`Snapshot::candidates`] one at a time: for a caller that stops early (the runtime
    /// loads the first file that qualifies), the files after it cost nothing in a cache's
    /// snapshot, not even a place in a list.
    pub fn candidates_iter(&self) -> Candidates<'_> {
        if let Some(memo) = &self.order.0 {
            // A cache's entries, sorted already.
            let at = memo.get_or_init(|| {
                (0..self.entries.len() as u32)
                    .filter(|&i| self.entries[i as usize].is_config())
                    .collect()
            });
            return Candidates::Kept(&self.entries, at.iter());
        }
        let mut out: Vec<&DirEntry> = self.entries.iter().filter(|e| e.is_config()).collect();
        out.sort_by(|a, b| a.os_name.as_bytes().cmp(b.os_name.as_bytes()));
        Candidates::Sorted(out.into_iter())
    }

    /// The entry called `name` (exact UTF-8 names only).
    pub fn get(&self, name: &str) -> Option<&DirEntry> {
        // Snapshots read from disk are in name order: a binary search finds a present
        // name in a large directory without a scan. Any other order, and absent names,
        // fall back to the scan (a hit of the search is a real match either way).
        let key = name.as_bytes();
        if let Ok(i) = self
            .entries
            .binary_search_by(|e| e.os_name.as_bytes().cmp(key))
        {
            return self.entries.get(i);
        }
        self.entries.iter().find(|e| e.os_name.as_bytes() == key)
    }

    fn path_of(&self, e: &DirEntry) -> PathBuf {
        // One allocation (`join` allocates and then grows): this runs once per file of
        // the directory on every judgement.
        let mut p = PathBuf::with_capacity(self.dir.as_os_str().len() + e.os_name.len() + 1);
        p.push(&self.dir);
        p.push(&e.os_name);
        p
    }
}

/// Reads `dir`: every entry, with the content of every config file (bounded, regular
/// files only: `interlock_contract::bounded`). A missing directory is an error of kind `NotFound`.
pub fn read(dir: &Path) -> io::Result<Snapshot> {
    read_with(dir, &|_| false)
}

/// [`read`], also reading the content of entries for which `also_read(name)` is true
/// (e.g. the agent's backups of wrapped files).
pub fn read_with(dir: &Path, also_read: &dyn Fn(&str) -> bool) -> io::Result<Snapshot> {
    read_until(dir, also_read, None)
}

/// [`read_with`], reading config files in the runtime's order only until `stop` says the
/// decision has what it needs (e.g. containerd: the first file that parses). Config files
/// after that are listed but not read (their content is `None`, they parse as "not
/// read"), unless `also_read` names them.
pub fn read_until(
    dir: &Path,
    also_read: &dyn Fn(&str) -> bool,
    stop: Option<&dyn Fn(&DirEntry) -> bool>,
) -> io::Result<Snapshot> {
    let rd = fs::read_dir(dir).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("reading CNI config directory {}: {e}", dir.display()),
        )
    })?;
    let mut entries = vec![];
    for e in rd {
        let e = e?;
        let os_name = e.file_name();
        // The listing's own type, not following links (Go's DirEntry.IsDir).
        let Ok(t) = e.file_type() else { continue };
        let name = os_name.to_string_lossy().into_owned();
        let mut entry = DirEntry {
            name,
            os_name,
            is_dir: t.is_dir(),
            is_symlink: t.is_symlink(),
            content: None,
            unreadable: None,
            refused: false,
            mode: 0,
            uid: 0,
            memo: ParseMemo::default(),
        };
        let path = e.path();
        if let Ok(m) = fs::metadata(&path).or_else(|_| fs::symlink_metadata(&path)) {
            use std::os::unix::fs::MetadataExt;
            entry.mode = m.permissions().mode() & 0o7777;
            entry.uid = m.uid();
        }
        entries.push(entry);
    }
    // The runtime's order, so that reading can stop where the decision does.
    entries.sort_by(|a, b| a.os_name.as_bytes().cmp(b.os_name.as_bytes()));
    let mut stopped = false;
    let mut gone = vec![];
    for (i, entry) in entries.iter_mut().enumerate() {
        let extra = entry.utf8_name() && also_read(&entry.name);
        let config = entry.is_config() && !stopped;
        if entry.is_dir || !(config || extra) {
            continue;
        }
        match bounded::read_config(&dir.join(&entry.os_name)) {
            Ok(c) => entry.content = Some(c),
            // Gone between the listing and the read: as if never listed.
            Err(err) if err.is_not_found() => gone.push(i),
            Err(err) => {
                entry.refused = matches!(
                    err,
                    bounded::BoundedReadError::NotRegular { .. }
                        | bounded::BoundedReadError::TooLarge { .. }
                );
                entry.unreadable = Some(err.to_string());
            }
        }
        if config && stop.is_some_and(|f| f(entry)) {
            stopped = true;
        }
    }
    for i in gone.into_iter().rev() {
        entries.remove(i);
    }
    Ok(Snapshot {
        dir: dir.to_path_buf(),
        entries,
        order: ConfigOrder::default(),
    })
}

/// CRI-O's VERSION probe: the versions a plugin type answers, or why it did not.
pub type VersionProbe<'a> = &'a dyn Fn(&str) -> Result<Vec<String>, String>;

/// The plugin binaries as the judgement sees them.
pub struct Binaries<'a> {
    /// The runtime's plugin directories (named in reasons).
    pub dirs: &'a [PathBuf],
    /// Whether a plugin type has an executable in one of them.
    pub present: &'a dyn Fn(&str) -> bool,
    /// CRI-O's VERSION check (ocicni `ValidateNetworkList`): the versions a plugin type
    /// answers, or why it did not. `None`: not probed.
    pub versions: Option<VersionProbe<'a>>,
}

fn dir_list(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(":")
}

/// CRI-O's per-file rule: why a parsed list is unusable (missing binaries; with the
/// probe, plugins that do not support the list's version), or `None` when usable.
pub fn crio_unusable(p: &Parsed, bins: &Binaries<'_>) -> Option<String> {
    let types = p.list.plugin_types();
    let missing: Vec<&str> = types
        .iter()
        .copied()
        .filter(|t| !(bins.present)(t))
        .collect();
    if !missing.is_empty() {
        return Some(format!(
            "plugin binary {} not found (or not executable) in {}",
            missing.join(", "),
            dir_list(bins.dirs)
        ));
    }
    let probe = bins.versions?;
    let mut version = p.list.effective_version();
    if version.is_empty() {
        version = "0.1.0".into();
    }
    let problems: Vec<String> = types
        .iter()
        .filter_map(|t| match probe(t) {
            Ok(v) if v.contains(&version) => None,
            Ok(v) => Some(format!(
                "plugin {t} does not support config version {version:?} (it supports {})",
                v.join(", ")
            )),
            Err(e) => Some(format!("plugin {t} VERSION failed: {e}")),
        })
        .collect();
    (!problems.is_empty()).then(|| problems.join("; "))
}

/// Whether `runtime` would load `c` if it got to it: `Ok` or why not.
pub fn usable(c: &Candidate<'_>, runtime: Runtime, bins: &Binaries<'_>) -> Result<(), String> {
    let p = c.parsed().as_ref().map_err(Clone::clone)?;
    match runtime {
        Runtime::Containerd => Ok(()),
        Runtime::Crio => crio_unusable(p, bins).map_or(Ok(()), Err),
    }
}

/// What a rule set decided: per candidate (same order) a verdict and reason, the index
/// of the chosen one, and a summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judgement {
    /// `(verdict, reason)` per candidate, in order.
    pub verdicts: Vec<(Verdict, String)>,
    /// Index of the chosen candidate.
    pub chosen: Option<usize>,
    /// One sentence.
    pub summary: String,
}

/// containerd's rules over `cands` (sorted). Parses only the first file.
pub fn containerd_rules(cands: &[Candidate<'_>], dir: &Path) -> Judgement {
    containerd_judgement(cands, dir, true)
}

/// [`containerd_rules`]; without `full`, no verdicts for the files it never reaches (the
/// outcome alone: what a long-lived caller asks on every change, whatever the
/// directory's size).
fn containerd_judgement(cands: &[Candidate<'_>], dir: &Path, full: bool) -> Judgement {
    let Some(first) = cands.first() else {
        return Judgement {
            verdicts: vec![],
            chosen: None,
            summary: format!(
                "containerd has NO network: no .conf/.conflist/.json file in {}",
                dir.display()
            ),
        };
    };
    let name = first.entry.shown();
    let (head, stop, summary, chosen) = match first.parsed() {
        Ok(p) => (
            (
                Verdict::Chosen,
                format!(
                    "first config file by name, and valid (plugins: {})",
                    p.list.plugin_types().join(" → ")
                ),
            ),
            format!("not used: containerd loads only the first config file ({name} sorts first)"),
            format!(
                "containerd uses network {:?} from {name}: it is the first config file by name",
                p.list.name()
            ),
            Some(0),
        ),
        Err(e) => (
            (
                Verdict::FailedLoad,
                format!("{e}; containerd fails the whole load on it"),
            ),
            format!("not read: containerd stopped at {name}, which sorts first and is invalid"),
            format!(
                "containerd has NO network: the first config file {name} is invalid and fails the whole load \
                 (pods fail with \"cni plugin not initialized\"); fix or remove {name}"
            ),
            None,
        ),
    };
    let mut verdicts = Vec::with_capacity(cands.len());
    verdicts.push(head);
    if full {
        verdicts.extend(
            cands[1..]
                .iter()
                .map(|_| (Verdict::NotReached, stop.clone())),
        );
    }
    Judgement {
        verdicts,
        chosen,
        summary,
    }
}

/// CRI-O's rules over `cands` (sorted).
pub fn crio_rules(cands: &[Candidate<'_>], dir: &Path, bins: &Binaries<'_>) -> Judgement {
    crio_judgement(cands, dir, bins, true)
}

/// [`crio_rules`]; without `full`, it stops at the default network (the files after it
/// cannot change the outcome, only their own verdicts).
fn crio_judgement(
    cands: &[Candidate<'_>],
    dir: &Path,
    bins: &Binaries<'_>,
    full: bool,
) -> Judgement {
    let mut verdicts = Vec::with_capacity(cands.len());
    let mut chosen: Option<usize> = None;
    let mut loaded_names: Vec<(String, String)> = Vec::new();
    let mut summary = String::new();
    for (i, c) in cands.iter().enumerate() {
        if !full && chosen.is_some() {
            break;
        }
        let name = c.entry.shown();
        if c.entry.refused && chosen.is_some() {
            let why = c.entry.unreadable.clone().unwrap_or_default();
            verdicts.push((
                Verdict::NotReached,
                format!("{why}; it sorts after CRI-O's default network, so it does not change it"),
            ));
            continue;
        }
        if c.entry.refused {
            // CRI-O would read it: it might block, run out of memory, or load it as the
            // default network. Which network it uses is unknown: fail closed.
            let why = c.entry.unreadable.clone().unwrap_or_default();
            verdicts.push((
                Verdict::FailedLoad,
                format!("{why}; CRI-O would read it and might block on it or load it, so which network CRI-O uses is unknown"),
            ));
            let stop = format!(
                "not judged: interlock cannot tell what CRI-O makes of {name}, which sorts before"
            );
            verdicts.extend(
                cands[i + 1..]
                    .iter()
                    .map(|_| (Verdict::NotReached, stop.clone())),
            );
            return Judgement {
                verdicts,
                chosen: None,
                summary: format!(
                    "CRI-O's network is UNKNOWN: {name} sorts before any usable file and interlock refused to read it \
                     (not a regular file, or over {} bytes); remove it",
                    bounded::MAX_CONFIG_BYTES
                ),
            };
        }
        let p = match c.parsed() {
            Ok(p) => p,
            Err(e) => {
                verdicts.push((Verdict::Skipped, format!("skipped by CRI-O: {e}")));
                continue;
            }
        };
        if let Some(why) = crio_unusable(p, bins) {
            verdicts.push((Verdict::Skipped, format!("skipped by CRI-O: {why}")));
            continue;
        }
        let net_name = if p.list.name().is_empty() {
            c.entry.name.clone()
        } else {
            p.list.name().to_string()
        };
        if let Some((_, first_file)) = loaded_names.iter().find(|(n, _)| *n == net_name) {
            verdicts.push((
                Verdict::DuplicateName,
                format!(
                    "ignored by CRI-O: network {net_name:?} was already loaded from {first_file}"
                ),
            ));
            continue;
        }
        loaded_names.push((net_name.clone(), name.clone()));
        if let Some(first) = chosen {
            verdicts.push((
                Verdict::LoadedNotDefault,
                format!(
                    "valid, loaded as network {net_name:?} but not the default: {} is the first usable file",
                    cands[first].entry.shown()
                ),
            ));
            continue;
        }
        let skipped = verdicts
            .iter()
            .filter(|(v, _)| *v == Verdict::Skipped)
            .count();
        summary = if skipped == 0 {
            format!("CRI-O uses network {net_name:?} from {name}: it is the first usable config file by name")
        } else {
            format!(
                "CRI-O uses network {net_name:?} from {name} after skipping {skipped} unusable file(s) before it (fail-open)"
            )
        };
        verdicts.push((
            Verdict::Chosen,
            format!(
                "first usable config file by name (plugins: {})",
                p.list.plugin_types().join(" → ")
            ),
        ));
        chosen = Some(i);
    }
    if chosen.is_none() {
        summary = if cands.is_empty() {
            format!(
                "CRI-O has NO network: no .conf/.conflist/.json file in {}",
                dir.display()
            )
        } else {
            format!(
                "CRI-O has NO network: every config file in {} was skipped",
                dir.display()
            )
        };
    }
    Judgement {
        verdicts,
        chosen,
        summary,
    }
}

/// `runtime`'s rules over `cands` (sorted).
pub fn judge(
    cands: &[Candidate<'_>],
    runtime: Runtime,
    dir: &Path,
    bins: &Binaries<'_>,
) -> Judgement {
    judgement(cands, runtime, dir, bins, true)
}

/// [`judge`] for the outcome alone: the same `chosen` and `summary`, but verdicts only
/// for the files up to the chosen one (the rest cannot change the outcome). For a caller
/// that judges on every change: in a large directory the other verdicts are most of the
/// work.
pub fn judge_outcome(
    cands: &[Candidate<'_>],
    runtime: Runtime,
    dir: &Path,
    bins: &Binaries<'_>,
) -> Judgement {
    judgement(cands, runtime, dir, bins, false)
}

fn judgement(
    cands: &[Candidate<'_>],
    runtime: Runtime,
    dir: &Path,
    bins: &Binaries<'_>,
    full: bool,
) -> Judgement {
    match runtime {
        Runtime::Containerd => containerd_judgement(cands, dir, full),
        Runtime::Crio => crio_judgement(cands, dir, bins, full),
    }
}

fn chosen_of(
    snap: &Snapshot,
    cands: &[Candidate<'_>],
    j: &Judgement,
    runtime: Runtime,
) -> Option<Chosen> {
    j.chosen.and_then(|i| {
        let c = &cands[i];
        let p = c.parsed().as_ref().ok()?;
        Some(Chosen {
            path: snap.path_of(c.entry),
            list: p.list.clone(),
            format: p.format,
            network_name: if runtime == Runtime::Crio && p.list.name().is_empty() {
                c.entry.name.clone()
            } else {
                p.list.name().to_string()
            },
        })
    })
}

/// The outcome of [`effective`] without a verdict per file: the network in effect (or
/// `None`) and the summary, exactly as [`effective`] gives them. For a caller that judges
/// on every change (the agent): in a large directory the per-file verdicts are most of
/// the work.
pub fn effective_outcome(
    snap: &Snapshot,
    runtime: Runtime,
    bins: &Binaries<'_>,
) -> (Option<Chosen>, String) {
    let cands = deciding_candidates(snap, runtime, bins);
    let j = judge_outcome(&cands, runtime, &snap.dir, bins);
    (chosen_of(snap, &cands, &j, runtime), j.summary)
}

/// The candidates up to the one that decides `runtime`'s outcome, in order: containerd
/// decides on the first file; CRI-O on the first usable one or the first it cannot tell
/// anything about (refused), and only when there is none on all of them. The outcome
/// judged on this prefix is the outcome judged on every candidate, and in a large
/// directory the files after the decision are most of them.
fn deciding_candidates<'a>(
    snap: &'a Snapshot,
    runtime: Runtime,
    bins: &Binaries<'_>,
) -> Vec<Candidate<'a>> {
    let mut out = vec![];
    for c in snap.candidates_iter() {
        let decides = match runtime {
            Runtime::Containerd => true,
            Runtime::Crio => {
                c.entry.refused
                    || c.parsed()
                        .as_ref()
                        .is_ok_and(|p| crio_unusable(p, bins).is_none())
            }
        };
        out.push(c);
        if decides {
            break;
        }
    }
    out
}

/// Which network `runtime` loads from `snap`, with a verdict for every entry. Pure: the
/// binaries are seen only through `bins`.
pub fn effective(snap: &Snapshot, runtime: Runtime, bins: &Binaries<'_>) -> Effective {
    let cands = snap.candidates();
    let j = judge(&cands, runtime, &snap.dir, bins);
    let chosen = chosen_of(snap, &cands, &j, runtime);
    let mut files: Vec<FileVerdict> = cands
        .iter()
        .zip(j.verdicts)
        .map(|(c, (verdict, reason))| FileVerdict {
            path: snap.path_of(c.entry),
            verdict,
            reason,
        })
        .collect();
    let mut ignored: Vec<&DirEntry> = snap.entries.iter().filter(|e| !e.is_config()).collect();
    ignored.sort_by(|a, b| a.os_name.as_bytes().cmp(b.os_name.as_bytes()));
    files.extend(ignored.into_iter().map(|e| FileVerdict {
        path: snap.path_of(e),
        verdict: Verdict::Ignored,
        reason: if e.is_dir {
            "a directory: runtimes only read files".to_string()
        } else {
            "not loaded: only .conf, .conflist and .json files are read".to_string()
        },
    }));
    Effective {
        runtime,
        dir: snap.dir.clone(),
        chosen,
        files,
        summary: j.summary,
    }
}

/// Options for [`load_with`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// CRI-O rules: also run each plugin's VERSION, as ocicni's `ValidateNetworkList`
    /// does, and skip lists whose version a plugin does not support (e.g. a 1.1.0 list
    /// with plugins that stop at 1.0.0). Executes the binaries (time-boxed).
    pub probe_versions: bool,
}

/// Reads `dir` and applies `runtime`'s rules without executing anything. `bin_dirs` are
/// the runtime's plugin directories (used by the CRI-O rules to skip lists whose
/// binaries are missing). A missing directory has no network.
pub fn load(dir: &Path, runtime: Runtime, bin_dirs: &[PathBuf]) -> io::Result<Effective> {
    load_with(dir, runtime, bin_dirs, LoadOptions::default())
}

/// [`load`] with options.
pub fn load_with(
    dir: &Path,
    runtime: Runtime,
    bin_dirs: &[PathBuf],
    options: LoadOptions,
) -> io::Result<Effective> {
    let snap = match read(dir) {
        Ok(s) => s,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Snapshot {
            dir: dir.to_path_buf(),
            ..Snapshot::default()
        },
        Err(e) => return Err(e),
    };
    let present = |t: &str| find_plugin(t, bin_dirs).is_some();
    let probe = |t: &str| -> Result<Vec<String>, String> {
        let Some(path) = find_plugin(t, bin_dirs) else {
            return Err(format!("{t} not found"));
        };
        plugin_version(&path, bin_dirs)
            .map(|i| i.supported_versions)
            .map_err(|e| e.to_string())
    };
    let bins = Binaries {
        dirs: bin_dirs,
        present: &present,
        versions: options.probe_versions.then_some(&probe as VersionProbe<'_>),
    };
    Ok(effective(&snap, runtime, &bins))
}

/// Where in a list an entry runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// In the list's own `plugins`.
    List,
    /// In the first inline delegate of a thin Multus config (`delegates[0].plugins`).
    MultusDelegate,
}

/// A plugin entry a list runs, and how.
#[derive(Debug, Clone, PartialEq)]
pub struct RunningEntry<'a> {
    /// The entry as written.
    pub entry: &'a Map<String, Value>,
    /// Where it runs.
    pub placement: Placement,
    /// The `cniVersion` its chain runs with (empty: none, meaning 0.1.0).
    pub version: String,
}

/// A thin Multus config's first inline delegate (`delegates[0]`, when it has `plugins`).
pub fn multus_delegate(list: &NetworkConfigList) -> Option<&Map<String, Value>> {
    let meta = list.plugins().first()?.as_object()?;
    let t = meta.get("type")?.as_str()?;
    if !META_PLUGIN_TYPES.contains(&t) {
        return None;
    }
    let d0 = meta.get("delegates")?.as_array()?.first()?.as_object()?;
    d0.get("plugins")?.as_array()?;
    Some(d0)
}

/// Does `list` (from file `name`) run the plugin `plugin_type` exactly once, after
/// another plugin? Looks in the list itself and in a thin Multus config's first inline
/// delegate, whose chain runs with the delegate's `cniVersion` (or else the meta
/// plugin's). The error says why not, in words for `interlock check` and `/readyz`.
pub fn runs_plugin<'a>(
    list: &'a NetworkConfigList,
    name: &str,
    plugin_type: &str,
) -> Result<RunningEntry<'a>, String> {
    let is_ours = |p: &Value| p.get("type").and_then(Value::as_str) == Some(plugin_type);
    let mut found: Vec<(usize, &'a Map<String, Value>, Placement)> = list
        .plugins()
        .iter()
        .enumerate()
        .filter(|(_, p)| is_ours(p))
        .filter_map(|(i, p)| Some((i, p.as_object()?, Placement::List)))
        .collect();
    let delegate = multus_delegate(list);
    if let Some(d0) = delegate {
        let ps = d0.get("plugins").and_then(Value::as_array);
        found.extend(
            ps.into_iter()
                .flatten()
                .enumerate()
                .filter(|(_, p)| is_ours(p))
                .filter_map(|(i, p)| Some((i, p.as_object()?, Placement::MultusDelegate))),
        );
    }
    let types = list.plugin_types().join(" -> ");
    match found.as_slice() {
        [] => Err(format!("{name} ({types}) does not contain {plugin_type}")),
        [(0, _, Placement::List)]
            if list.name() == interlock_contract::layout::HOLDING_NETWORK =>
        {
            Err(format!(
                "{name} is interlock's holding config: the node has no primary CNI config \
                 yet, so every ADD is refused until the primary writes one"
            ))
        }
        [(0, _, place)] => Err(format!(
            "{name} runs {plugin_type} first{}: it must be chained after the primary plugin \
             (it needs the primary's result), so every ADD would fail",
            if *place == Placement::MultusDelegate {
                " in its Multus delegate"
            } else {
                ""
            }
        )),
        [(_, entry, placement)] => {
            let version = match placement {
                Placement::List => list.effective_version(),
                Placement::MultusDelegate => delegate
                    .and_then(|d| d.get("cniVersion"))
                    .or_else(|| list.plugins().first()?.get("cniVersion"))
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
            };
            Ok(RunningEntry {
                entry,
                placement: *placement,
                version,
            })
        }
        many => Err(format!(
            "{name} runs {plugin_type} {} times: every pod would be processed twice; remove the extra entries",
            many.len()
        )),
    }
}

/// Why `plugin_type` refuses a chain at `version`, given the versions it `accepts`
/// (empty: every version interlock knows), or `None` when it accepts it.
pub fn version_refused(
    file: &str,
    plugin_type: &str,
    version: &str,
    accepts: &[String],
) -> Option<String> {
    let known: Vec<String> = CniVersion::all_strings()
        .into_iter()
        .map(str::to_string)
        .collect();
    let accepts = if accepts.is_empty() { &known } else { accepts };
    if accepts.iter().any(|v| v == version) && version.parse::<CniVersion>().is_ok() {
        return None;
    }
    Some(format!(
        "{file} runs {plugin_type} with cniVersion {}, which it refuses (it accepts {}): every ADD would fail",
        if version.is_empty() {
            "none (meaning 0.1.0)".to_string()
        } else {
            format!("{version:?}")
        },
        accepts.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    /// A parse is made once per version of an entry and shared by its clones, and never
    /// answers for a name or content it was not made from.
    #[test]
    fn a_parse_is_shared_by_clones_and_follows_changes_of_the_entry() {
        let list = r#"{"cniVersion":"1.0.0","name":"a","plugins":[{"type":"bridge"}]}"#;
        let e = DirEntry::file("10-a.conflist", list.as_bytes(), 0o644);
        let c = e.clone();
        let (pe, pc) = (e.parsed().unwrap(), c.parsed().unwrap());
        assert!(std::ptr::eq(pe, pc), "a clone parsed again");
        assert_eq!(pe.as_ref().unwrap().list.name(), "a");
        // Its public fields changed afterwards: parsed afresh, exactly as a new entry.
        let mut changed = e.clone();
        changed.content = Some(list.replace("\"a\"", "\"b\"").into_bytes());
        assert_eq!(changed.parse().unwrap().list.name(), "b");
        assert_eq!(
            Candidate::new(&changed)
                .parsed()
                .as_ref()
                .unwrap()
                .list
                .name(),
            "b"
        );
        let mut renamed = e.clone();
        renamed.name = "10-a.conf".into();
        renamed.os_name = "10-a.conf".into();
        let fresh = DirEntry::file("10-a.conf", list.as_bytes(), 0o644);
        assert_eq!(renamed.parse(), fresh.parse());
        assert!(renamed.parse().is_err(), "a list is not a valid .conf");
        assert_eq!(Candidate::new(&renamed).parsed(), &fresh.parse());
        // The original still answers from its own parse.
        assert!(std::ptr::eq(e.parsed().unwrap(), pe));
        assert_eq!(e, c, "the memo is not part of equality");
    }

    /// Through a [`DirCache`], an unchanged file keeps its parse across reads (and
    /// resyncs); a changed one is parsed again.
    #[test]
    fn a_cached_directory_parses_each_version_of_a_file_once() {
        let d = tempfile::tempdir().unwrap();
        let w = |n: &str, name: &str| {
            let body = format!(
                r#"{{"cniVersion":"1.0.0","name":"{name}","plugins":[{{"type":"bridge"}}]}}"#
            );
            fs::write(d.path().join(n), body).unwrap()
        };
        w("10-a.conflist", "a");
        w("20-b.conflist", "b");
        let mut cache = DirCache::new(d.path());
        // Clones share the parse, and keep an old one alive (its address is not reused).
        let at = |c: &mut DirCache, n: &str| c.read().unwrap().get(n).unwrap().clone();
        let parse = |e: &DirEntry| e.parsed().unwrap() as *const _;
        let (a1, b1) = (
            at(&mut cache, "10-a.conflist"),
            at(&mut cache, "20-b.conflist"),
        );
        assert_eq!(parse(&a1), parse(&at(&mut cache, "10-a.conflist")));
        cache.resync();
        assert_eq!(parse(&a1), parse(&at(&mut cache, "10-a.conflist")));
        w("20-b.conflist", "b2");
        cache.changed("20-b.conflist");
        let (a4, b4) = (
            at(&mut cache, "10-a.conflist"),
            at(&mut cache, "20-b.conflist"),
        );
        assert_eq!(parse(&a1), parse(&a4));
        assert_ne!(parse(&b1), parse(&b4));
        assert_eq!(b4.parse().unwrap().list.name(), "b2");
        assert_eq!(*cache.read().unwrap(), read(d.path()).unwrap());
    }

    use super::*;
    use interlock_contract::shown::shown;
    use proptest::prelude::*;
    use std::os::unix::ffi::OsStrExt;

    fn good(name: &str, plugin: &str) -> String {
        format!(r#"{{"cniVersion":"1.0.0","name":"{name}","plugins":[{{"type":"{plugin}"}}]}}"#)
    }

    fn bin_dir(dir: &Path, plugins: &[&str]) -> PathBuf {
        let b = dir.join("bin");
        fs::create_dir_all(&b).unwrap();
        for p in plugins {
            fs::write(b.join(p), "#!/bin/sh\n").unwrap();
            fs::set_permissions(b.join(p), fs::Permissions::from_mode(0o755)).unwrap();
        }
        b
    }

    #[test]
    fn broken_first_file_containerd_fails_crio_falls_back() {
        let t = tempfile::tempdir().unwrap();
        let conf = t.path().join("net.d");
        fs::create_dir(&conf).unwrap();
        let full = good("good", "bridge");
        fs::write(conf.join("00-broken.conflist"), &full[..full.len() / 2]).unwrap();
        fs::write(conf.join("10-good.conflist"), &full).unwrap();
        let bins = vec![bin_dir(t.path(), &["bridge"])];

        let c = load(&conf, Runtime::Containerd, &bins).unwrap();
        assert!(c.chosen.is_none(), "containerd must have no network: {c:?}");
        let broken = c.verdict_for("00-broken.conflist").unwrap();
        assert_eq!(broken.verdict, Verdict::FailedLoad);
        assert!(
            broken.reason.contains("00-broken.conflist"),
            "{}",
            broken.reason
        );
        assert!(
            broken.reason.contains("invalid JSON") && broken.reason.contains("EOF"),
            "{}",
            broken.reason
        );
        assert!(
            c.summary.contains("NO network") && c.summary.contains("00-broken.conflist"),
            "{}",
            c.summary
        );
        assert_eq!(
            c.verdict_for("10-good.conflist").unwrap().verdict,
            Verdict::NotReached
        );

        let o = load(&conf, Runtime::Crio, &bins).unwrap();
        assert_eq!(o.chosen_name().as_deref(), Some("10-good.conflist"));
        assert_eq!(o.chosen.as_ref().unwrap().network_name, "good");
        let broken = o.verdict_for("00-broken.conflist").unwrap();
        assert_eq!(broken.verdict, Verdict::Skipped);
        assert!(broken.reason.contains("invalid JSON"), "{}", broken.reason);
        assert!(o.summary.contains("skipping 1"), "{}", o.summary);
    }

    #[test]
    fn extensions_conf_wrapping_and_ignored_entries() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        fs::write(d.join("05-a.conf.bak"), good("bak", "x")).unwrap();
        fs::write(d.join(".00-x.conflist.1.0.tmp"), "{").unwrap();
        fs::create_dir(d.join("00-dir.conflist")).unwrap();
        fs::write(
            d.join("20-single.json"),
            r#"{"cniVersion":"0.4.0","name":"single","type":"bridge","zz":1}"#,
        )
        .unwrap();
        fs::write(d.join("30-list.conflist"), good("list", "bridge")).unwrap();
        let bins = vec![bin_dir(d, &["bridge"])];
        let c = load(d, Runtime::Containerd, &bins).unwrap();
        let chosen = c.chosen.as_ref().unwrap();
        assert_eq!(chosen.format, ConfFormat::Conf);
        assert_eq!(chosen.list.name(), "single");
        assert_eq!(chosen.list.plugins()[0]["zz"], 1);
        let ignored: Vec<_> = c
            .files
            .iter()
            .filter(|f| f.verdict == Verdict::Ignored)
            .collect();
        // .bak, .tmp, a directory named like a list, and the bin/ directory.
        assert_eq!(ignored.len(), 4, "{:?}", c.files);
        assert_eq!(c.files.len(), 6);
        // A .conf without "type" is invalid (probably a list in the wrong file).
        fs::write(d.join("10-list-in-conf.conf"), good("x", "bridge")).unwrap();
        let c = load(d, Runtime::Containerd, &bins).unwrap();
        assert!(c.chosen.is_none());
        assert!(
            c.files[0].reason.contains("perhaps this is a .conflist"),
            "{}",
            c.files[0].reason
        );
    }

    #[test]
    fn crio_skips_missing_binaries_names_and_duplicates() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("net.d");
        fs::create_dir(&d).unwrap();
        let bins = vec![bin_dir(t.path(), &["bridge", "portmap"])];
        fs::write(d.join("00-calico.conflist"), good("k8s", "calico")).unwrap();
        fs::write(
            d.join("10-a.conflist"),
            r#"{"cniVersion":"1.0.0","name":"","plugins":[{"type":"bridge"},{"type":"portmap"}]}"#,
        )
        .unwrap();
        fs::write(d.join("20-b.conflist"), good("10-a.conflist", "bridge")).unwrap();
        fs::write(d.join("30-c.conflist"), good("other", "bridge")).unwrap();
        let o = load(&d, Runtime::Crio, &bins).unwrap();
        let v: Vec<Verdict> = o.files.iter().map(|f| f.verdict).collect();
        assert_eq!(
            v,
            [
                Verdict::Skipped,
                Verdict::Chosen,
                Verdict::DuplicateName,
                Verdict::LoadedNotDefault
            ]
        );
        assert!(o.files[0].reason.contains("calico") && o.files[0].reason.contains("not found"));
        assert_eq!(o.chosen.unwrap().network_name, "10-a.conflist");
        // containerd does not look at binaries: it picks 00-calico.
        let c = load(&d, Runtime::Containerd, &bins).unwrap();
        assert_eq!(c.chosen_name().as_deref(), Some("00-calico.conflist"));
    }

    #[test]
    fn runtimes_only_reject_what_libcni_rejects() {
        // `args` is not a JSON object: the spec says it should be, libcni does not care,
        // so both runtimes load the file and so must the prediction.
        let t = tempfile::tempdir().unwrap();
        fs::write(
            t.path().join("10-a.conflist"),
            r#"{"cniVersion":"1.0.0","name":"a","plugins":[{"type":"bridge","args":"x"}]}"#,
        )
        .unwrap();
        let bins = vec![bin_dir(t.path(), &["bridge"])];
        for rt in [Runtime::Containerd, Runtime::Crio] {
            let e = load(t.path(), rt, &bins).unwrap();
            assert_eq!(e.chosen_name().as_deref(), Some("10-a.conflist"), "{rt}");
            let json = serde_json::to_value(&e).unwrap();
            assert_eq!(json["chosen"]["list"]["plugins"][0]["args"], "x");
            assert_eq!(json["files"][0]["verdict"], "chosen");
        }
    }

    #[test]
    fn crio_version_probe_skips_lists_the_plugins_cannot_run() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("net.d");
        fs::create_dir(&d).unwrap();
        let b = t.path().join("bin");
        fs::create_dir(&b).unwrap();
        fs::write(
            b.join("old"),
            "#!/bin/sh\necho '{\"cniVersion\":\"1.0.0\",\"supportedVersions\":[\"0.4.0\",\"1.0.0\"]}'\n",
        )
        .unwrap();
        fs::set_permissions(b.join("old"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(
            d.join("00-new.conflist"),
            r#"{"cniVersion":"1.1.0","name":"new","plugins":[{"type":"old"}]}"#,
        )
        .unwrap();
        fs::write(
            d.join("10-ok.conflist"),
            r#"{"cniVersion":"1.0.0","name":"ok","plugins":[{"type":"old"}]}"#,
        )
        .unwrap();
        let bins = vec![b];
        // Without probing, 00-new looks usable.
        let plain = load(&d, Runtime::Crio, &bins).unwrap();
        assert_eq!(plain.chosen_name().as_deref(), Some("00-new.conflist"));
        let probed = load_with(
            &d,
            Runtime::Crio,
            &bins,
            LoadOptions {
                probe_versions: true,
            },
        )
        .unwrap();
        assert_eq!(probed.chosen_name().as_deref(), Some("10-ok.conflist"));
        let why = &probed.verdict_for("00-new.conflist").unwrap().reason;
        assert!(
            why.contains("does not support config version \"1.1.0\""),
            "{why}"
        );
        // containerd never looks at the binaries.
        let c = load_with(
            &d,
            Runtime::Containerd,
            &bins,
            LoadOptions {
                probe_versions: true,
            },
        )
        .unwrap();
        assert_eq!(c.chosen_name().as_deref(), Some("00-new.conflist"));
    }

    #[test]
    fn empty_and_missing_directories_have_no_network() {
        let t = tempfile::tempdir().unwrap();
        for rt in [Runtime::Containerd, Runtime::Crio] {
            let e = load(t.path(), rt, &[]).unwrap();
            assert!(e.chosen.is_none() && e.files.is_empty());
            assert!(e.summary.contains("NO network"));
            let e = load(&t.path().join("nope"), rt, &[]).unwrap();
            assert!(e.chosen.is_none());
        }
    }

    #[test]
    fn hostile_entries_are_refused_without_blocking_and_fail_closed() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        nix::unistd::mkfifo(
            &d.join("00-fifo.conflist"),
            nix::sys::stat::Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        std::os::unix::fs::symlink("/dev/zero", d.join("01-zero.conflist")).unwrap();
        let big = fs::File::create(d.join("02-big.json")).unwrap();
        big.set_len(100 << 20).unwrap();
        fs::write(d.join("10-good.conflist"), good("good", "bridge")).unwrap();
        let bins = vec![bin_dir(d, &["bridge"])];
        let c = load(d, Runtime::Containerd, &bins).unwrap();
        assert!(
            c.chosen.is_none(),
            "containerd would block on the FIFO: fail closed"
        );
        let fifo = c.verdict_for("00-fifo.conflist").unwrap();
        assert_eq!(fifo.verdict, Verdict::FailedLoad);
        assert!(fifo.reason.contains("a FIFO"), "{}", fifo.reason);
        // CRI-O would read them (and block, or run out of memory, or load one): fail
        // closed instead of guessing that it skips them.
        let o = load(d, Runtime::Crio, &bins).unwrap();
        assert!(o.chosen.is_none(), "{o:?}");
        assert!(
            o.summary.contains("UNKNOWN") && o.summary.contains("00-fifo.conflist"),
            "{}",
            o.summary
        );
        fs::remove_file(d.join("00-fifo.conflist")).unwrap();
        let o = load(d, Runtime::Crio, &bins).unwrap();
        assert!(o.chosen.is_none());
        let zero = o.verdict_for("01-zero.conflist").unwrap();
        assert_eq!(zero.verdict, Verdict::FailedLoad);
        assert!(zero.reason.contains("character device"), "{}", zero.reason);
        fs::remove_file(d.join("01-zero.conflist")).unwrap();
        let c = load(d, Runtime::Containerd, &bins).unwrap();
        let big = c.verdict_for("02-big.json").unwrap();
        assert_eq!(big.verdict, Verdict::FailedLoad);
        assert!(
            big.reason.contains("1048576") && big.reason.contains("02-big.json"),
            "{}",
            big.reason
        );
        // A file interlock cannot read after CRI-O's choice does not matter.
        fs::rename(d.join("02-big.json"), d.join("20-big.json")).unwrap();
        let o = load(d, Runtime::Crio, &bins).unwrap();
        assert_eq!(o.chosen_name().as_deref(), Some("10-good.conflist"));
    }

    #[test]
    fn names_are_escaped_for_terminals_and_json() {
        assert_eq!(shown("05-\x1b[31mRED.conflist"), "05-\\x1b[31mRED.conflist");
        assert_eq!(
            shown("05-\u{1b}[31mRED.conflist"),
            "05-\\x1b[31mRED.conflist"
        );
        let raw = std::ffi::OsStr::from_bytes(b"10-\xff.conflist");
        assert_eq!(shown_os(raw), "10-\\xff.conflist");
        let t = tempfile::tempdir().unwrap();
        fs::write(t.path().join(raw), good("n", "bridge")).unwrap();
        let e = load(t.path(), Runtime::Containerd, &[]).unwrap();
        let json = serde_json::to_string(&e).unwrap();
        let back: Value = serde_json::from_str(&json).unwrap();
        assert!(back["chosen"]["path"]
            .as_str()
            .unwrap()
            .ends_with("10-\\xff.conflist"));
    }

    #[test]
    fn the_outcome_alone_equals_the_full_judgement() {
        let bridge = r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"}]}"#;
        let missing = r#"{"cniVersion":"1.0.0","name":"m","plugins":[{"type":"nosuch"}]}"#;
        let dirs: Vec<Vec<(&str, &str)>> = vec![
            vec![],
            vec![("10-a.conflist", bridge)],
            vec![("05-x.conflist", "{"), ("10-a.conflist", bridge)],
            vec![
                ("05-m.conflist", missing),
                ("10-a.conflist", bridge),
                ("20-b.conflist", bridge),
            ],
            vec![("05-m.conflist", missing), ("notes.txt", "x")],
            vec![(
                "10-a.conf",
                r#"{"cniVersion":"1.0.0","name":"","type":"bridge"}"#,
            )],
        ];
        let present = |t: &str| t == "bridge";
        let bins = Binaries {
            dirs: &[],
            present: &present,
            versions: None,
        };
        for files in dirs {
            let snap = Snapshot::from_files(&files, 0o644);
            for rt in [Runtime::Containerd, Runtime::Crio] {
                let full = effective(&snap, rt, &bins);
                let (chosen, summary) = effective_outcome(&snap, rt, &bins);
                assert_eq!(
                    (chosen, summary),
                    (full.chosen, full.summary),
                    "{rt} {files:?}"
                );
            }
        }
    }

    #[test]
    fn runtime_parses_from_the_command_line_spelling() {
        assert_eq!("containerd".parse::<Runtime>(), Ok(Runtime::Containerd));
        assert_eq!("crio".parse::<Runtime>(), Ok(Runtime::Crio));
        assert_eq!("CRI-O".parse::<Runtime>(), Ok(Runtime::Crio));
        assert!("docker"
            .parse::<Runtime>()
            .unwrap_err()
            .contains("containerd, crio"));
    }

    fn list(v: Value) -> NetworkConfigList {
        NetworkConfigList::from_value(v).unwrap()
    }

    #[test]
    fn runs_plugin_finds_the_entry_in_the_list_or_the_multus_delegate() {
        let ok = list(
            serde_json::json!({"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"},{"type":"interlock-cni"}]}),
        );
        let r = runs_plugin(&ok, "a", "interlock-cni").unwrap();
        assert_eq!(
            (r.placement, r.version.as_str()),
            (Placement::List, "1.0.0")
        );
        let first = list(
            serde_json::json!({"cniVersion":"1.0.0","name":"n","plugins":[{"type":"interlock-cni"},{"type":"bridge"}]}),
        );
        assert!(runs_plugin(&first, "a", "interlock-cni")
            .unwrap_err()
            .contains("first"));
        let twice = list(
            serde_json::json!({"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"},{"type":"interlock-cni"},{"type":"interlock-cni"}]}),
        );
        assert!(runs_plugin(&twice, "a", "interlock-cni")
            .unwrap_err()
            .contains("2 times"));
        let none = list(
            serde_json::json!({"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"}]}),
        );
        assert!(runs_plugin(&none, "a", "interlock-cni")
            .unwrap_err()
            .contains("does not contain"));
        let multus = list(
            serde_json::json!({"cniVersion":"0.3.1","name":"m","plugins":[{"type":"multus","cniVersion":"0.3.1","delegates":[
            {"cniVersion":"1.0.0","name":"d","plugins":[{"type":"bridge"},{"type":"interlock-cni"}]}]}]}),
        );
        let r = runs_plugin(&multus, "m", "interlock-cni").unwrap();
        assert_eq!(
            (r.placement, r.version.as_str()),
            (Placement::MultusDelegate, "1.0.0")
        );
        // A delegate without its own version runs with the meta plugin's.
        let inherit = list(
            serde_json::json!({"cniVersion":"0.4.0","name":"m","plugins":[{"type":"multus","cniVersion":"0.4.0","delegates":[
            {"name":"d","plugins":[{"type":"bridge"},{"type":"interlock-cni"}]}]}]}),
        );
        assert_eq!(
            runs_plugin(&inherit, "m", "interlock-cni").unwrap().version,
            "0.4.0"
        );
        // Only a meta plugin's delegates run.
        let fake = list(
            serde_json::json!({"cniVersion":"1.0.0","name":"m","plugins":[{"type":"bridge","delegates":[
            {"plugins":[{"type":"bridge"},{"type":"interlock-cni"}]}]}]}),
        );
        assert!(runs_plugin(&fake, "m", "interlock-cni").is_err());
        assert!(version_refused("f", "interlock-cni", "1.0.0", &[]).is_none());
        assert!(version_refused("f", "interlock-cni", "0.2.0", &[])
            .unwrap()
            .contains("\"0.2.0\""));
        assert!(version_refused("f", "interlock-cni", "", &[])
            .unwrap()
            .contains("0.1.0"));
        assert!(version_refused("f", "interlock-cni", "1.1.0", &["1.0.0".into()]).is_some());
    }

    #[derive(Debug, Clone, Copy)]
    enum Kind {
        Good,
        Broken,
        MissingBinary,
    }

    fn arb_dir() -> impl Strategy<Value = Vec<(String, Kind)>> {
        prop::collection::btree_map(
            (
                "[0-9a-zA-Z_-]{1,6}",
                prop::sample::select(vec![".conf", ".conflist", ".json"]),
            )
                .prop_map(|(s, e)| format!("{s}{e}")),
            prop::sample::select(vec![Kind::Good, Kind::Broken, Kind::MissingBinary]),
            0..7,
        )
        .prop_map(|m| m.into_iter().collect())
    }

    fn write_dir(d: &Path, files: &[(String, Kind)]) {
        for (name, kind) in files {
            let plugin = match kind {
                Kind::MissingBinary => "nosuchplugin",
                _ => "bridge",
            };
            let body = if name.ends_with(".conflist") {
                good(name, plugin)
            } else {
                format!(r#"{{"cniVersion":"1.0.0","name":"{name}","type":"{plugin}"}}"#)
            };
            let body = match kind {
                Kind::Broken => body[..body.len() - 3].to_string(),
                _ => body,
            };
            fs::write(d.join(name), body).unwrap();
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// The outcome judged on the candidates up to the deciding one equals the full
        /// judgement's, for a fresh read and a cache's read, with duplicate network names
        /// and a file interlock refuses to read (a FIFO) anywhere in the order.
        #[test]
        fn the_outcome_on_the_deciding_prefix_equals_the_full_judgement(
            files in arb_dir(),
            fifo in prop::option::of("[0-9a-zA-Z_-]{1,6}\\.conflist"),
            dup in prop::option::of("[0-9a-zA-Z_-]{1,6}\\.conflist"),
        ) {
            let t = tempfile::tempdir().unwrap();
            let bins = vec![bin_dir(t.path(), &["bridge"])];
            let d = t.path().join("net.d");
            fs::create_dir(&d).unwrap();
            write_dir(&d, &files);
            if let Some(dup) = dup.filter(|n| !d.join(n).exists()) {
                // The same network name as a good file (if any sorts before it).
                fs::write(d.join(dup), good("shared", "bridge")).unwrap();
            }
            if let Some(f) = fifo.filter(|n| !d.join(n).exists()) {
                nix::unistd::mkfifo(&d.join(f), nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
            }
            let present = |t: &str| interlock_libcni::exec::find_plugin(t, &bins).is_some();
            let b = Binaries { dirs: &bins, present: &present, versions: None };
            let fresh = read(&d).unwrap();
            let mut cache = DirCache::new(&d);
            let cached = cache.read().unwrap();
            for snap in [&fresh, cached] {
                for rt in [Runtime::Containerd, Runtime::Crio] {
                    let full = effective(snap, rt, &b);
                    prop_assert_eq!(effective_outcome(snap, rt, &b), (full.chosen, full.summary));
                }
            }
        }

        #[test]
        fn sorted_by_byte_order_and_first_wins(names in prop::collection::btree_set("[0-9A-Za-z._-]{1,8}\\.(conf|conflist|json)", 1..6)) {
            let t = tempfile::tempdir().unwrap();
            let bins = vec![bin_dir(t.path(), &["bridge"])];
            let d = t.path().join("net.d");
            fs::create_dir(&d).unwrap();
            let files: Vec<(String, Kind)> = names.iter().map(|n| (n.clone(), Kind::Good)).collect();
            write_dir(&d, &files);
            let mut sorted: Vec<&String> = names.iter().collect();
            sorted.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
            for rt in [Runtime::Containerd, Runtime::Crio] {
                let e = load(&d, rt, &bins).unwrap();
                let order: Vec<String> = e.files.iter().map(|f| f.path.file_name().unwrap().to_string_lossy().into_owned()).collect();
                prop_assert_eq!(order.iter().collect::<Vec<_>>(), sorted.clone());
                let chosen = e.chosen_name();
                prop_assert_eq!(chosen.as_ref(), Some(sorted[0]));
            }
        }

        #[test]
        fn containerd_fails_closed_crio_fails_open(files in arb_dir()) {
            let t = tempfile::tempdir().unwrap();
            let bins = vec![bin_dir(t.path(), &["bridge"])];
            let d = t.path().join("net.d");
            fs::create_dir(&d).unwrap();
            write_dir(&d, &files);
            let mut sorted = files.clone();
            sorted.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));

            let c = load(&d, Runtime::Containerd, &bins).unwrap();
            let expect_c = match sorted.first() {
                Some((n, Kind::Good | Kind::MissingBinary)) => Some(n.clone()),
                _ => None,
            };
            prop_assert_eq!(c.chosen_name(), expect_c.clone());
            if expect_c.is_none() && !sorted.is_empty() {
                prop_assert_eq!(c.files[0].verdict, Verdict::FailedLoad);
                prop_assert!(c.files[1..].iter().all(|f| f.verdict == Verdict::NotReached));
            }

            let o = load(&d, Runtime::Crio, &bins).unwrap();
            let expect_o = sorted.iter().find(|(_, k)| matches!(k, Kind::Good)).map(|(n, _)| n.clone());
            prop_assert_eq!(o.chosen_name(), expect_o.clone());
            // Every file before CRI-O's choice was skipped, with a reason.
            for f in o.files.iter().take_while(|f| f.verdict != Verdict::Chosen) {
                prop_assert_eq!(f.verdict, Verdict::Skipped);
                prop_assert!(!f.reason.is_empty());
            }
            // Fail-open never has less network than fail-closed.
            prop_assert!(expect_c.is_none() || expect_o.is_some() || matches!(sorted[0].1, Kind::MissingBinary));
            prop_assert_eq!(c.files.len(), files.len());
            prop_assert_eq!(o.files.len(), files.len());
        }
    }
}

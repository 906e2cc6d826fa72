//! A conf dir as the runtime sees it: which names are candidates, how each file parses,
//! and which one containerd or CRI-O would load.
//!
//! This is the agent's pure model of the directory, fed by a [`DirSnapshot`] the thin
//! layer reads. The parsing rules mirror libcni (`ConfFiles`, `ConfListFromBytes`,
//! `ConfFromBytes`, `ConfListFromConf`); the loading rules mirror containerd 1.6 (first
//! candidate by name, an invalid one fails the whole load) and CRI-O (invalid files and
//! lists whose plugin binaries are missing are skipped).

use serde_json::{Map, Value};
use std::collections::HashSet;

/// Whose loading rules decide which file is in effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeKind {
    /// containerd: the first candidate by name; if it is invalid the load fails.
    Containerd,
    /// CRI-O: the first candidate that parses and whose plugin binaries exist.
    Crio,
}

/// Extensions the runtimes load (libcni `ConfFiles` with containerd's list).
pub const CANDIDATE_EXTENSIONS: [&str; 3] = [".conf", ".conflist", ".json"];

/// One directory entry as read by the thin layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// File name (no directory part).
    pub name: String,
    /// File content; `None` for names whose content was not read (not candidates, not ours).
    pub content: Option<Vec<u8>>,
    /// Permission bits of the file.
    pub mode: u32,
}

/// The conf dir at one moment: every regular file's name, and content where it matters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DirSnapshot {
    /// Entries, in any order; helpers sort them the runtime's way.
    pub entries: Vec<DirEntry>,
}

/// How a candidate file is written on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileFormat {
    /// A single-plugin `.conf` / `.json` file.
    Conf,
    /// A `.conflist` with a `plugins` array.
    Conflist,
}

/// A candidate file that parsed: its list form (a `.conf` is lifted like libcni's
/// `ConfListFromConf`) with every foreign field in its original order.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedConf {
    /// On-disk format.
    pub format: FileFormat,
    /// The file's top-level JSON object as written.
    pub original: Map<String, Value>,
    /// Conflist form: `name`, `cniVersion`, `plugins` (+ foreign fields for a conflist).
    pub list: Map<String, Value>,
}

impl ParsedConf {
    /// The plugins of the list form.
    pub fn plugins(&self) -> &[Value] {
        self.list
            .get("plugins")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// Plugin `type`s in order.
    pub fn plugin_types(&self) -> Vec<String> {
        self.plugins()
            .iter()
            .filter_map(|p| p.get("type").and_then(Value::as_str).map(str::to_string))
            .collect()
    }

    /// The list's `cniVersion` (empty when absent).
    pub fn cni_version(&self) -> &str {
        self.list
            .get("cniVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
    }
}

/// True when the runtimes would consider `name` at all.
pub fn is_candidate_name(name: &str) -> bool {
    CANDIDATE_EXTENSIONS.iter().any(|ext| {
        // Go's filepath.Ext: the suffix from the last dot.
        name.rfind('.').map(|i| &name[i..]) == Some(*ext)
    })
}

/// Parses one candidate file by libcni's rules (through `interlock_protocol::conf`, the
/// same parser the conf-dir loader uses). The error says what is wrong.
pub fn parse_candidate(name: &str, bytes: &[u8]) -> Result<ParsedConf, String> {
    use interlock_protocol::conf::{self, Validation};
    let is_list = name.ends_with(".conflist");
    let list = if is_list {
        conf::parse_conflist_with(bytes, Validation::Libcni)
    } else {
        conf::parse_conf_with(bytes, Validation::Libcni)
    }
    .map_err(|e| format!("{name}: {e}"))?;
    let original = match interlock_protocol::gojson::parse(bytes) {
        Ok(Value::Object(m)) => m,
        _ => return Err(format!("{name}: not a JSON object")),
    };
    Ok(ParsedConf {
        format: if is_list {
            FileFormat::Conflist
        } else {
            FileFormat::Conf
        },
        list: list.into_raw(),
        original,
    })
}

/// libcni's `ConfListFromConf`: `{name, cniVersion, plugins: [the whole conf]}`.
pub fn lift_conf(conf: &Map<String, Value>) -> Map<String, Value> {
    let mut list = Map::new();
    list.insert(
        "name".into(),
        conf.get("name")
            .cloned()
            .unwrap_or(Value::String(String::new())),
    );
    list.insert(
        "cniVersion".into(),
        conf.get("cniVersion")
            .cloned()
            .unwrap_or(Value::String(String::new())),
    );
    list.insert(
        "plugins".into(),
        Value::Array(vec![Value::Object(conf.clone())]),
    );
    list
}

/// One candidate in the runtime's order, parsed.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// File name.
    pub name: String,
    /// Permission bits.
    pub mode: u32,
    /// Raw bytes.
    pub bytes: Vec<u8>,
    /// Parse result.
    pub parsed: Result<ParsedConf, String>,
}

impl DirSnapshot {
    /// A snapshot of `(name, content)` files, all with permission bits `mode` (for tests
    /// and tools that model a directory without touching the disk).
    pub fn from_files(files: &[(&str, &str)], mode: u32) -> DirSnapshot {
        DirSnapshot {
            entries: files
                .iter()
                .map(|(n, c)| DirEntry {
                    name: n.to_string(),
                    content: Some(c.as_bytes().to_vec()),
                    mode,
                })
                .collect(),
        }
    }

    /// The candidate files sorted by name (bytewise, like Go's `sort.Strings`).
    pub fn candidates(&self) -> Vec<Candidate> {
        let mut out: Vec<Candidate> = self
            .entries
            .iter()
            .filter(|e| is_candidate_name(&e.name))
            .map(|e| {
                let bytes = e.content.clone().unwrap_or_default();
                Candidate {
                    parsed: parse_candidate(&e.name, &bytes),
                    name: e.name.clone(),
                    mode: e.mode,
                    bytes,
                }
            })
            .collect();
        out.sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
        out
    }

    /// The entry called `name`.
    pub fn get(&self, name: &str) -> Option<&DirEntry> {
        self.entries.iter().find(|e| e.name == name)
    }
}

/// Whether `c` is loadable by `runtime`. `present_types` is the set of plugin types with
/// an executable in some bin dir (only CRI-O checks binaries).
pub fn loadable(c: &Candidate, runtime: RuntimeKind, present_types: &HashSet<String>) -> bool {
    match &c.parsed {
        Err(_) => false,
        Ok(p) => match runtime {
            RuntimeKind::Containerd => !p.plugins().is_empty(),
            RuntimeKind::Crio => p.plugin_types().iter().all(|t| present_types.contains(t)),
        },
    }
}

/// The file the runtime loads from `candidates` (already sorted), or why none.
pub fn effective<'a>(
    candidates: &'a [Candidate],
    runtime: RuntimeKind,
    present_types: &HashSet<String>,
) -> Result<&'a Candidate, String> {
    match runtime {
        RuntimeKind::Containerd => match candidates.first() {
            None => Err("no network config found".into()),
            Some(c) => match &c.parsed {
                Ok(_) => Ok(c),
                Err(e) => Err(format!("containerd fails the whole load: {e}")),
            },
        },
        RuntimeKind::Crio => candidates
            .iter()
            .find(|c| loadable(c, runtime, present_types))
            .ok_or_else(|| "no valid network config found".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(files: &[(&str, &str)]) -> DirSnapshot {
        DirSnapshot::from_files(files, 0o644)
    }

    const LIST: &str = r#"{"cniVersion":"0.4.0","name":"n","zz":1,"plugins":[{"type":"bridge"}]}"#;

    #[test]
    fn candidate_names_follow_go_ext() {
        assert!(is_candidate_name("10-a.conflist"));
        assert!(is_candidate_name("a.conf"));
        assert!(is_candidate_name("x.json"));
        assert!(is_candidate_name(".conf"));
        assert!(!is_candidate_name("a.conf.bak"));
        assert!(!is_candidate_name(".a.conflist.1.2.tmp"));
        assert!(!is_candidate_name("a.conf.interlock-orig"));
        assert!(!is_candidate_name("conf"));
    }

    #[test]
    fn parses_like_libcni() {
        let p = parse_candidate("a.conflist", LIST.as_bytes()).unwrap();
        assert_eq!(p.format, FileFormat::Conflist);
        assert_eq!(p.plugin_types(), vec!["bridge"]);
        let keys: Vec<_> = p.list.keys().cloned().collect();
        assert_eq!(keys, ["cniVersion", "name", "zz", "plugins"]);
        for bad in [
            "",
            "{",
            "[]",
            r#"{"plugins":[{"type":"a"}]}"#,
            r#"{"name":"n","plugins":[]}"#,
            r#"{"name":"n","plugins":[{}]}"#,
            r#"{"name":"n","plugins":{}}"#,
            r#"{"name":1,"plugins":[{"type":"a"}]}"#,
            r#"{"name":"n"}"#,
        ] {
            assert!(
                parse_candidate("a.conflist", bad.as_bytes()).is_err(),
                "{bad}"
            );
        }
        let c = parse_candidate(
            "a.conf",
            br#"{"cniVersion":"0.3.1","name":"x","type":"bridge","k":2}"#,
        )
        .unwrap();
        assert_eq!(c.format, FileFormat::Conf);
        assert_eq!(c.cni_version(), "0.3.1");
        assert_eq!(c.plugins()[0]["k"], 2);
        assert!(parse_candidate("a.conf", br#"{"name":"x"}"#).is_err());
        // A conflist put in a .conf has no type: invalid.
        assert!(parse_candidate("a.conf", LIST.as_bytes()).is_err());
    }

    #[test]
    fn reads_what_containerd_reads() {
        // Review M3: invalid UTF-8 in a string and a field 200 deep; Go's decoder loads both.
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        let doc = [
            &b"{\"cniVersion\":\"1.0.0\",\"name\":\"caf\xe9\",\"x\":"[..],
            deep.as_bytes(),
            b",\"plugins\":[{\"type\":\"bridge\"}]}",
        ]
        .concat();
        let p = parse_candidate("a.conflist", &doc).unwrap();
        assert_eq!(p.plugin_types(), vec!["bridge"]);
        assert_eq!(p.original["name"], "caf\u{FFFD}");
        assert_eq!(p.list, p.original);
    }

    #[test]
    fn containerd_takes_first_and_fails_on_invalid() {
        let s = snap(&[("20-b.conflist", LIST), ("10-a.conflist", "{")]);
        let c = s.candidates();
        assert_eq!(c[0].name, "10-a.conflist");
        assert!(effective(&c, RuntimeKind::Containerd, &HashSet::new()).is_err());
        let present: HashSet<String> = ["bridge".to_string()].into();
        assert_eq!(
            effective(&c, RuntimeKind::Crio, &present).unwrap().name,
            "20-b.conflist"
        );
        assert!(effective(&c, RuntimeKind::Crio, &HashSet::new()).is_err());
    }

    #[test]
    fn sorting_is_bytewise() {
        let s = snap(&[
            ("a.conf", "{}"),
            ("B.conf", "{}"),
            ("00.conf", "{}"),
            ("-x.conf", "{}"),
        ]);
        let names: Vec<_> = s.candidates().into_iter().map(|c| c.name).collect();
        assert_eq!(names, ["-x.conf", "00.conf", "B.conf", "a.conf"]);
    }
}

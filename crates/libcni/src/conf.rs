//! Network configuration lists (`.conflist`) and single network configs (`.conf`).
//!
//! A [`NetworkConfigList`] is the parsed JSON object itself, kept as an order-preserving
//! map: every field this code does not know (a foreign plugin's settings, a newer spec's
//! keys) survives a read → write round trip byte-for-byte in content and order. The spec
//! fields are validated on parse with libcni's rules, and errors name the field.
//!
//! Bytes are read as the runtimes read them ([`crate::gojson`]: Go's `encoding/json`),
//! a list's own keys case-sensitively as libcni's `map[string]interface{}` does, and each
//! plugin entry as libcni's struct decoding does ([`crate::netconf`]: case-insensitive
//! field names, `null` allowed, the last key wins), so what parses here is what
//! containerd and CRI-O load.

use serde_json::{Map, Value};

use crate::error::ConfError;
use crate::gojson;
use crate::netconf::{self, Decoded};
use interlock_cni_types::version::{CniVersion, SemVer};

/// Which on-disk shape a config came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConfFormat {
    /// A single-plugin network config (`.conf`, `.json`), wrapped into a list on load.
    Conf,
    /// A network configuration list (`.conflist`).
    Conflist,
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn expect_string<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<Option<&'a str>, ConfError> {
    match obj.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(ConfError::field(
            path,
            format!("expected a string, found {}", type_name(other)),
        )),
    }
}

fn expect_object<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<Option<&'a Map<String, Value>>, ConfError> {
    match obj.get(key) {
        None => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m)),
        Some(other) => Err(ConfError::field(
            path,
            format!("expected an object, found {}", type_name(other)),
        )),
    }
}

/// libcni's `readBool`: a JSON boolean, or the strings "true"/"false" in any case.
fn read_bool(obj: &Map<String, Value>, key: &str) -> Result<bool, ConfError> {
    match obj.get(key) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(Value::String(s)) => match s.to_ascii_lowercase().as_str() {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err(ConfError::field(
                key,
                format!("invalid value {s:?}: expected true or false"),
            )),
        },
        Some(other) => Err(ConfError::field(
            key,
            format!("expected a boolean, found {}", type_name(other)),
        )),
    }
}

/// How strictly to check a config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Validation {
    /// Every spec field's type, including `args` and `runtimeConfig` (the default).
    #[default]
    Spec,
    /// Only what libcni rejects when a runtime loads the file (it does not look at
    /// `args` or `runtimeConfig`): use this to predict what a runtime will load.
    Libcni,
}

/// Validates one plugin entry (`plugins[i]`) as libcni decodes it once re-encoded from
/// its map (keys sorted: [`netconf::decode_value`]) plus, for [`Validation::Spec`], the
/// types of the spec's other well-known fields.
fn validate_plugin(value: &Value, path: &str, level: Validation) -> Result<(), ConfError> {
    netconf::decode_value(value, path)?;
    if level == Validation::Spec {
        if let Some(obj) = value.as_object() {
            expect_object(obj, "runtimeConfig", &format!("{path}.runtimeConfig"))?;
            expect_object(obj, "args", &format!("{path}.args"))?;
        }
    }
    Ok(())
}

/// A network configuration list: the JSON object of a `.conflist` (or a `.conf` wrapped
/// into one), with every field kept in its original order.
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkConfigList {
    raw: Map<String, Value>,
}

/// Parses a `.conflist` document.
pub fn parse_conflist(bytes: &[u8]) -> Result<NetworkConfigList, ConfError> {
    parse_conflist_with(bytes, Validation::Spec)
}

/// Parses a `.conflist` document with the given strictness.
pub fn parse_conflist_with(
    bytes: &[u8],
    level: Validation,
) -> Result<NetworkConfigList, ConfError> {
    match gojson::parse(bytes)? {
        Value::Object(raw) => {
            let list = NetworkConfigList { raw };
            list.validate_with(level)?;
            Ok(list)
        }
        other => Err(ConfError::field(
            "(document)",
            format!("expected a JSON object, found {}", type_name(&other)),
        )),
    }
}

/// How deep a `.conf` may nest: libcni's `ConfListFromConf` puts it inside a list object
/// and its `plugins` array and decodes that again, under Go's limit of 10,000.
const CONF_MAX_DEPTH: usize = gojson::MAX_DEPTH - 2;

/// Parses a single-plugin `.conf` document and wraps it into list form the way libcni's
/// `ConfListFromConf` does: `{"name", "cniVersion", "plugins": [<the whole conf>]}`.
pub fn parse_conf(bytes: &[u8]) -> Result<NetworkConfigList, ConfError> {
    parse_conf_with(bytes, Validation::Spec)
}

/// Parses a single-plugin `.conf` document with the given strictness.
pub fn parse_conf_with(bytes: &[u8], level: Validation) -> Result<NetworkConfigList, ConfError> {
    let text = gojson::normalize_within(bytes, CONF_MAX_DEPTH)?;
    let value = gojson::parse_normalized(&text)?;
    // libcni's ConfFromBytes reads the file's own bytes: document order, duplicate keys
    // included; the list takes its name and version from that decoding.
    let decoded = netconf::decode_text(&text, "")?;
    NetworkConfigList::wrap_single_conf(value, decoded, level)
}

impl NetworkConfigList {
    /// Validates a JSON value as a config list and takes it over.
    pub fn from_value(value: Value) -> Result<NetworkConfigList, ConfError> {
        match value {
            Value::Object(raw) => NetworkConfigList::from_map(raw),
            other => Err(ConfError::field(
                "(document)",
                format!("expected a JSON object, found {}", type_name(&other)),
            )),
        }
    }

    /// Validates a JSON object as a config list and takes it over.
    pub fn from_map(raw: Map<String, Value>) -> Result<NetworkConfigList, ConfError> {
        let list = NetworkConfigList { raw };
        list.validate()?;
        Ok(list)
    }

    /// `ConfListFromConf`: `decoded` is the conf's first decoding (`ConfFromBytes`); the
    /// entry is then decoded again as the list's only plugin, keys sorted.
    fn wrap_single_conf(
        value: Value,
        decoded: Decoded,
        level: Validation,
    ) -> Result<NetworkConfigList, ConfError> {
        validate_plugin(&value, "", level)?;
        let mut raw = Map::new();
        raw.insert("name".into(), Value::String(decoded.name));
        raw.insert("cniVersion".into(), Value::String(decoded.cni_version));
        raw.insert("plugins".into(), Value::Array(vec![value]));
        let list = NetworkConfigList { raw };
        list.validate_with(level)?;
        Ok(list)
    }

    /// Checks every spec field with libcni's rules; the error names the field.
    pub fn validate(&self) -> Result<(), ConfError> {
        self.validate_with(Validation::Spec)
    }

    /// Like [`NetworkConfigList::validate`] with the given strictness.
    pub fn validate_with(&self, level: Validation) -> Result<(), ConfError> {
        let raw = &self.raw;
        match raw.get("name") {
            None => {
                return Err(ConfError::field(
                    "name",
                    "missing: a config list needs a network name",
                ))
            }
            Some(Value::String(_)) => {}
            Some(other) => {
                return Err(ConfError::field(
                    "name",
                    format!("expected a string, found {}", type_name(other)),
                ))
            }
        }
        expect_string(raw, "cniVersion", "cniVersion")?;
        self.effective_version_string()?;
        read_bool(raw, "disableCheck")?;
        read_bool(raw, "disableGC")?;
        read_bool(raw, "loadOnlyInlinedPlugins")?;
        let plugins = match raw.get("plugins") {
            None => {
                return Err(ConfError::field(
                    "plugins",
                    "missing: a config list needs a \"plugins\" array",
                ))
            }
            Some(Value::Array(p)) => p,
            Some(other) => {
                return Err(ConfError::field(
                    "plugins",
                    format!("expected an array, found {}", type_name(other)),
                ))
            }
        };
        if plugins.is_empty() {
            return Err(ConfError::field("plugins", "empty: no plugins in list"));
        }
        for (i, p) in plugins.iter().enumerate() {
            validate_plugin(p, &format!("plugins[{i}]"), level)?;
        }
        Ok(())
    }

    /// The version libcni would run this list with: `cniVersion`, or, when `cniVersions`
    /// is present, the highest of it and `cniVersion` not newer than 1.1.0.
    fn effective_version_string(&self) -> Result<String, ConfError> {
        let base = expect_string(&self.raw, "cniVersion", "cniVersion")?
            .unwrap_or("")
            .to_string();
        let Some(raw_versions) = self.raw.get("cniVersions") else {
            return Ok(base);
        };
        let items = raw_versions.as_array().ok_or_else(|| {
            ConfError::field(
                "cniVersions",
                format!(
                    "expected an array of strings, found {}",
                    type_name(raw_versions)
                ),
            )
        })?;
        let latest = SemVer::from(CniVersion::LATEST);
        let mut candidates: Vec<(SemVer, String)> = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let s = item.as_str().ok_or_else(|| {
                ConfError::field(
                    format!("cniVersions[{i}]"),
                    format!("expected a string, found {}", type_name(item)),
                )
            })?;
            let v =
                SemVer::parse(s).map_err(|e| ConfError::field(format!("cniVersions[{i}]"), e))?;
            if v <= latest {
                candidates.push((v, s.to_string()));
            }
        }
        if !base.is_empty() {
            let v = SemVer::parse(&base).map_err(|e| ConfError::field("cniVersion", e))?;
            if v <= latest {
                candidates.push((v, base.clone()));
            }
        }
        Ok(candidates
            .into_iter()
            .max_by(|a, b| a.0.cmp(&b.0))
            .map(|(_, s)| s)
            .unwrap_or(base))
    }

    /// The network name (`name`).
    pub fn name(&self) -> &str {
        self.raw.get("name").and_then(Value::as_str).unwrap_or("")
    }

    /// The `cniVersion` field as written, if present.
    pub fn cni_version_raw(&self) -> Option<&str> {
        self.raw.get("cniVersion").and_then(Value::as_str)
    }

    /// The version the chain runs with (see `cniVersions`), as a string; may be one
    /// interlock does not support (e.g. `0.2.0`), which runtimes still load.
    pub fn effective_version(&self) -> String {
        self.effective_version_string().unwrap_or_default()
    }

    /// The version the chain runs with, if interlock supports it.
    pub fn cni_version(&self) -> Result<CniVersion, ConfError> {
        let v = self.effective_version_string()?;
        if v.is_empty() {
            return Err(ConfError::field("cniVersion", "missing"));
        }
        v.parse::<CniVersion>()
            .map_err(|e| ConfError::field("cniVersion", e.to_string()))
    }

    /// `disableCheck` (boolean or "true"/"false").
    pub fn disable_check(&self) -> bool {
        read_bool(&self.raw, "disableCheck").unwrap_or(false)
    }

    /// `disableGC` (boolean or "true"/"false").
    pub fn disable_gc(&self) -> bool {
        read_bool(&self.raw, "disableGC").unwrap_or(false)
    }

    /// `loadOnlyInlinedPlugins` (boolean or "true"/"false").
    pub fn load_only_inlined_plugins(&self) -> bool {
        read_bool(&self.raw, "loadOnlyInlinedPlugins").unwrap_or(false)
    }

    /// The raw plugin entries, in chain order.
    pub fn plugins(&self) -> &[Value] {
        match self.raw.get("plugins") {
            Some(Value::Array(p)) => p,
            _ => &[],
        }
    }

    /// The plugin entries for editing (e.g. appending interlock-cni). Creates an empty
    /// `plugins` array if there is none; call [`NetworkConfigList::validate`] afterwards.
    pub fn plugins_mut(&mut self) -> &mut Vec<Value> {
        if !matches!(self.raw.get("plugins"), Some(Value::Array(_))) {
            self.raw.insert("plugins".into(), Value::Array(Vec::new()));
        }
        match self.raw.get_mut("plugins") {
            Some(Value::Array(p)) => p,
            _ => unreachable!("plugins was just set to an array"),
        }
    }

    /// Read-only views of the plugin entries with typed accessors.
    pub fn plugin_confs(&self) -> Vec<PluginConf<'_>> {
        self.plugins()
            .iter()
            .enumerate()
            .filter_map(|(index, v)| v.as_object().map(|raw| PluginConf { index, raw }))
            .collect()
    }

    /// The plugin `type`s in chain order.
    pub fn plugin_types(&self) -> Vec<&str> {
        self.plugin_confs()
            .iter()
            .map(|p| p.plugin_type())
            .collect()
    }

    /// The whole JSON object.
    pub fn raw(&self) -> &Map<String, Value> {
        &self.raw
    }

    /// Compact JSON, fields in their original order.
    pub fn to_json(&self) -> String {
        serde_json::to_string(&gojson::StackSafe(&self.raw)).unwrap_or_default()
    }

    /// Indented JSON (two spaces, trailing newline, see [`pretty_json`]), fields in their
    /// original order.
    pub fn to_json_pretty(&self) -> String {
        let mut s = String::from_utf8(pretty_json(self)).unwrap_or_default();
        s.push('\n');
        s
    }
}

/// Levels that [`pretty_json`] indents; deeper levels are written compactly.
pub const PRETTY_INDENT_LEVELS: usize = 32;

/// JSON indented like `serde_json::to_vec_pretty` for the first [`PRETTY_INDENT_LEVELS`]
/// levels and compact below: a config nested 10,000 deep (the runtimes accept that)
/// would otherwise take 200 MB of indentation. Serialising recurses as deep as `value`
/// unless it is (or holds) a [`NetworkConfigList`] or a [`gojson::StackSafe`].
pub fn pretty_json<T: serde::Serialize + ?Sized>(value: &T) -> Vec<u8> {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, BoundedPretty::default());
    // Writing into a Vec cannot fail, nor can a map with string keys.
    let _ = value.serialize(&mut ser);
    out
}

/// serde_json's `PrettyFormatter` (two spaces) that stops breaking lines past
/// [`PRETTY_INDENT_LEVELS`].
#[derive(Default)]
struct BoundedPretty {
    level: usize,
    has_value: bool,
}

impl BoundedPretty {
    fn line<W: ?Sized + std::io::Write>(w: &mut W, level: usize) -> std::io::Result<()> {
        if level <= PRETTY_INDENT_LEVELS {
            w.write_all(b"\n")?;
            for _ in 0..level {
                w.write_all(b"  ")?;
            }
        }
        Ok(())
    }

    fn open<W: ?Sized + std::io::Write>(&mut self, w: &mut W, b: &[u8]) -> std::io::Result<()> {
        self.level += 1;
        self.has_value = false;
        w.write_all(b)
    }

    fn close<W: ?Sized + std::io::Write>(&mut self, w: &mut W, b: &[u8]) -> std::io::Result<()> {
        self.level -= 1;
        if self.has_value && self.level < PRETTY_INDENT_LEVELS {
            Self::line(w, self.level)?;
        }
        w.write_all(b)
    }

    fn item<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
        if !first {
            w.write_all(b",")?;
        }
        Self::line(w, self.level)
    }
}

impl serde_json::ser::Formatter for BoundedPretty {
    fn begin_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.open(w, b"[")
    }

    fn end_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.close(w, b"]")
    }

    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.item(w, first)
    }

    fn end_array_value<W: ?Sized + std::io::Write>(&mut self, _: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    fn begin_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.open(w, b"{")
    }

    fn end_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.close(w, b"}")
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.item(w, first)
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(if self.level <= PRETTY_INDENT_LEVELS {
            b": "
        } else {
            b":"
        })
    }

    fn end_object_value<W: ?Sized + std::io::Write>(&mut self, _: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }
}

impl serde::Serialize for NetworkConfigList {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        gojson::StackSafe(&self.raw).serialize(s)
    }
}

impl<'de> serde::Deserialize<'de> for NetworkConfigList {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = Map::deserialize(d)?;
        NetworkConfigList::from_map(raw).map_err(serde::de::Error::custom)
    }
}

/// A read-only view of one plugin entry in a list.
#[derive(Debug, Clone, Copy)]
pub struct PluginConf<'a> {
    index: usize,
    raw: &'a Map<String, Value>,
}

impl<'a> PluginConf<'a> {
    /// Position in the chain (0-based).
    pub fn index(&self) -> usize {
        self.index
    }

    /// The plugin binary name (`type`), as libcni decodes it: the key matched without
    /// regard to case, the last one in byte order winning.
    pub fn plugin_type(&self) -> &'a str {
        netconf::go_string_field(self.raw, "type")
    }

    /// The capabilities this plugin declares as enabled (`capabilities: {"x": true}`).
    pub fn capabilities(&self) -> Vec<&'a str> {
        self.raw
            .get("capabilities")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter(|(_, v)| v.as_bool() == Some(true))
                    .map(|(k, _)| k.as_str())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// True when the plugin declares `capability` enabled.
    pub fn has_capability(&self, capability: &str) -> bool {
        self.raw
            .get("capabilities")
            .and_then(|c| c.get(capability))
            .and_then(Value::as_bool)
            == Some(true)
    }

    /// `runtimeConfig`, if present.
    pub fn runtime_config(&self) -> Option<&'a Map<String, Value>> {
        self.raw.get("runtimeConfig").and_then(Value::as_object)
    }

    /// `args`, if present.
    pub fn args(&self) -> Option<&'a Map<String, Value>> {
        self.raw.get("args").and_then(Value::as_object)
    }

    /// `ipam`, if present (matched as libcni's struct decoding matches it).
    pub fn ipam(&self) -> Option<&'a Map<String, Value>> {
        self.raw
            .iter()
            .filter(|(k, v)| v.is_object() && netconf::go_field_matches(k, "ipam"))
            .max_by(|a, b| a.0.cmp(b.0))
            .and_then(|(_, v)| v.as_object())
    }

    /// `ipam.type`, if present and not empty.
    pub fn ipam_type(&self) -> Option<&'a str> {
        self.ipam()
            .map(|m| netconf::go_string_field(m, "type"))
            .filter(|t| !t.is_empty())
    }

    /// `dns`, if present.
    pub fn dns(&self) -> Option<&'a Map<String, Value>> {
        self.raw.get("dns").and_then(Value::as_object)
    }

    /// The entry's JSON object.
    pub fn raw(&self) -> &'a Map<String, Value> {
        self.raw
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const FULL: &str = r#"{
  "cniVersion": "1.0.0",
  "cniVersions": ["0.4.0", "1.0.0", "1.1.0", "2.0.0"],
  "name": "k8s-pod-network",
  "zz-foreign": {"b": 1, "a": [true, null]},
  "disableCheck": "TRUE",
  "disableGC": false,
  "loadOnlyInlinedPlugins": true,
  "plugins": [
    {
      "type": "calico",
      "log_level": "info",
      "ipam": {"type": "calico-ipam", "assign_ipv4": "true"},
      "dns": {"nameservers": ["10.96.0.10"], "domain": "cluster.local", "search": ["svc"], "options": ["ndots:5"]},
      "args": {"cni": {"x": 1}},
      "policy": {"type": "k8s"}
    },
    {"type": "portmap", "snat": true, "capabilities": {"portMappings": true, "bandwidth": false}, "runtimeConfig": {"portMappings": []}}
  ]
}"#;

    #[test]
    fn reads_every_spec_field() {
        let list = parse_conflist(FULL.as_bytes()).unwrap();
        assert_eq!(list.name(), "k8s-pod-network");
        assert_eq!(list.cni_version_raw(), Some("1.0.0"));
        // cniVersions picks the highest not newer than what we implement.
        assert_eq!(list.cni_version().unwrap(), CniVersion::V1_1_0);
        assert!(list.disable_check());
        assert!(!list.disable_gc());
        assert!(list.load_only_inlined_plugins());
        assert_eq!(list.plugin_types(), vec!["calico", "portmap"]);
        let p = list.plugin_confs();
        assert_eq!(p[0].ipam_type(), Some("calico-ipam"));
        assert!(p[0].dns().is_some() && p[0].args().is_some());
        assert_eq!(p[1].capabilities(), vec!["portMappings"]);
        assert!(p[1].has_capability("portMappings") && !p[1].has_capability("bandwidth"));
        assert!(p[1].runtime_config().is_some());
    }

    #[test]
    fn round_trip_keeps_foreign_fields_in_order() {
        let list = parse_conflist(FULL.as_bytes()).unwrap();
        let again = parse_conflist(list.to_json_pretty().as_bytes()).unwrap();
        let original: Value = serde_json::from_str(FULL).unwrap();
        assert_eq!(again.to_json(), original.to_string());
    }

    fn err_field(doc: &str) -> String {
        let e = parse_conflist(doc.as_bytes()).unwrap_err();
        e.field_name()
            .map(str::to_string)
            .unwrap_or_else(|| format!("json: {e}"))
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(err_field(r#"{"plugins":[{"type":"x"}]}"#), "name");
        assert_eq!(err_field(r#"{"name":3,"plugins":[{"type":"x"}]}"#), "name");
        assert_eq!(
            err_field(r#"{"name":"n","cniVersion":1,"plugins":[{"type":"x"}]}"#),
            "cniVersion"
        );
        assert_eq!(
            err_field(r#"{"name":"n","cniVersions":["a"],"plugins":[{"type":"x"}]}"#),
            "cniVersions[0]"
        );
        assert_eq!(
            err_field(r#"{"name":"n","disableCheck":"maybe","plugins":[{"type":"x"}]}"#),
            "disableCheck"
        );
        assert_eq!(
            err_field(r#"{"name":"n","disableGC":1,"plugins":[{"type":"x"}]}"#),
            "disableGC"
        );
        assert_eq!(
            err_field(r#"{"name":"n","loadOnlyInlinedPlugins":[],"plugins":[{"type":"x"}]}"#),
            "loadOnlyInlinedPlugins"
        );
        assert_eq!(err_field(r#"{"name":"n"}"#), "plugins");
        assert_eq!(err_field(r#"{"name":"n","plugins":[]}"#), "plugins");
        assert_eq!(err_field(r#"{"name":"n","plugins":{}}"#), "plugins");
        assert_eq!(
            err_field(r#"{"name":"n","plugins":[{"x":1}]}"#),
            "plugins[0].type"
        );
        assert_eq!(
            err_field(r#"{"name":"n","plugins":[{"type":"a"},{"type":""}]}"#),
            "plugins[1].type"
        );
        assert_eq!(
            err_field(r#"{"name":"n","plugins":[{"type":"a","capabilities":{"x":"yes"}}]}"#),
            "plugins[0].capabilities.x"
        );
        assert_eq!(
            err_field(r#"{"name":"n","plugins":[{"type":"a","runtimeConfig":[]}]}"#),
            "plugins[0].runtimeConfig"
        );
        assert_eq!(
            err_field(r#"{"name":"n","plugins":[{"type":"a","args":"x"}]}"#),
            "plugins[0].args"
        );
        assert_eq!(
            err_field(r#"{"name":"n","plugins":[{"type":"a","ipam":{"type":1}}]}"#),
            "plugins[0].ipam.type"
        );
        assert_eq!(
            err_field(r#"{"name":"n","plugins":[{"type":"a","dns":{"nameservers":[1]}}]}"#),
            "plugins[0].dns.nameservers[0]"
        );
        assert!(err_field(r#"{"name":"n","plugins":[{"type":"a"}"#).starts_with("json: "));
        let e = parse_conflist(br#"{"name":"n","plugins":[{"type":"a","ipam":{"type":1}}]}"#)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "plugins[0].ipam.type: expected a string, found a number"
        );
    }

    #[test]
    fn conf_is_wrapped_like_conf_list_from_conf() {
        let conf = r#"{"cniVersion":"0.3.1","name":"mynet","type":"bridge","bridge":"cni0","ipam":{"type":"host-local"}}"#;
        let list = parse_conf(conf.as_bytes()).unwrap();
        assert_eq!(list.name(), "mynet");
        assert_eq!(list.cni_version().unwrap(), CniVersion::V0_3_1);
        assert_eq!(list.plugins().len(), 1);
        assert_eq!(list.plugins()[0].to_string(), conf);
        let e = parse_conf(br#"{"name":"x","cniVersion":"1.0.0","plugins":[{"type":"a"}]}"#)
            .unwrap_err();
        assert_eq!(e.field_name(), Some("type"));
    }

    #[test]
    fn libcni_validation_ignores_args_and_runtime_config() {
        let doc = br#"{"name":"n","plugins":[{"type":"a","args":"x","runtimeConfig":1}]}"#;
        assert_eq!(
            parse_conflist(doc).unwrap_err().field_name(),
            Some("plugins[0].runtimeConfig")
        );
        let list = parse_conflist_with(doc, Validation::Libcni).unwrap();
        assert_eq!(list.plugin_types(), ["a"]);
        let conf = br#"{"name":"n","type":"a","args":[]}"#;
        assert!(parse_conf(conf).is_err());
        assert!(parse_conf_with(conf, Validation::Libcni).is_ok());
        let bad_prev = br#"{"name":"n","plugins":[{"type":"a","prevResult":[]}]}"#;
        assert!(parse_conflist_with(bad_prev, Validation::Libcni).is_err());
    }

    #[test]
    fn serde_is_the_raw_object() {
        let list = parse_conflist(FULL.as_bytes()).unwrap();
        let v = serde_json::to_value(&list).unwrap();
        assert_eq!(v.to_string(), list.to_json());
        let back: NetworkConfigList = serde_json::from_value(v).unwrap();
        assert_eq!(back, list);
        assert!(serde_json::from_str::<NetworkConfigList>(r#"{"name":"x"}"#).is_err());
    }

    #[test]
    fn unsupported_version_still_parses() {
        let list = parse_conflist(br#"{"cniVersion":"0.2.0","name":"n","plugins":[{"type":"a"}]}"#)
            .unwrap();
        assert_eq!(list.effective_version(), "0.2.0");
        let e = list.cni_version().unwrap_err();
        assert_eq!(e.field_name(), Some("cniVersion"));
        assert!(e.to_string().contains("supported versions are"));
    }

    fn json_leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            (-1.0e9f64..1.0e9).prop_map(Value::from),
            "[ -~]{0,12}".prop_map(Value::String),
            "\\PC{0,6}".prop_map(Value::String),
        ]
    }

    fn json_value() -> impl Strategy<Value = Value> {
        json_leaf().prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::vec(("[a-zA-Z_.-]{1,10}", inner), 0..4)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    /// Foreign keys (never spec keys) with arbitrary values, inserted at arbitrary
    /// positions among the spec keys.
    fn foreign_fields() -> impl Strategy<Value = Vec<(String, Value, usize)>> {
        prop::collection::vec(("x[a-zA-Z0-9_.-]{0,10}", json_value(), 0usize..8), 0..6)
    }

    fn build(
        spec: Vec<(String, Value)>,
        foreign: Vec<(String, Value, usize)>,
    ) -> Map<String, Value> {
        let mut entries: Vec<(String, Value)> = spec;
        for (k, v, pos) in foreign {
            if entries.iter().any(|(e, _)| *e == k) {
                continue;
            }
            let at = pos.min(entries.len());
            entries.insert(at, (k, v));
        }
        entries.into_iter().collect()
    }

    fn arb_plugin() -> impl Strategy<Value = Value> {
        ("[a-z][a-z0-9-]{0,10}", any::<bool>(), foreign_fields()).prop_map(|(ty, caps, foreign)| {
            let mut spec = vec![("type".to_string(), Value::String(ty))];
            if caps {
                spec.push(("capabilities".into(), serde_json::json!({"portMappings": true, "io.kubernetes.cri.pod-annotations": false})));
                spec.push(("ipam".into(), serde_json::json!({"type": "host-local", "ranges": [[{"subnet": "10.99.0.0/24"}]]})));
            }
            Value::Object(build(spec, foreign))
        })
    }

    fn arb_list() -> impl Strategy<Value = Value> {
        (
            "[a-z0-9-]{1,12}",
            prop::sample::select(CniVersion::ALL.to_vec()),
            prop::collection::vec(arb_plugin(), 1..4),
            foreign_fields(),
            any::<bool>(),
        )
            .prop_map(|(name, v, plugins, foreign, flags)| {
                let mut spec = vec![
                    ("cniVersion".to_string(), Value::String(v.to_string())),
                    ("name".to_string(), Value::String(name)),
                ];
                if flags {
                    spec.push(("disableCheck".into(), Value::Bool(true)));
                    spec.push(("disableGC".into(), Value::String("false".into())));
                }
                spec.push(("plugins".into(), Value::Array(plugins)));
                Value::Object(build(spec, foreign))
            })
    }

    #[test]
    fn pretty_json_indents_like_serde_json_and_stays_linear_when_deep() {
        for depth in [1, 2, 31, 32, 33, 34, 40] {
            for inner in ["1", "{}", "[]", "{\"k\":[true,{\"z\":null}]}"] {
                let doc = format!(
                    "{}{inner}{}",
                    "{\"a\":[1,".repeat(depth),
                    "]}".repeat(depth)
                );
                let v: Value = serde_json::from_str(&doc).unwrap();
                let ours = pretty_json(&v);
                if 2 * depth + 2 <= PRETTY_INDENT_LEVELS {
                    assert_eq!(
                        ours,
                        serde_json::to_vec_pretty(&v).unwrap(),
                        "depth {depth}"
                    );
                }
                assert_eq!(serde_json::from_slice::<Value>(&ours).unwrap(), v);
            }
        }
        let doc = format!("{{\"a\":{}{}}}", "[".repeat(9_999), "]".repeat(9_999));
        let list_doc = doc.replacen('{', r#"{"name":"n","plugins":[{"type":"t"}],"#, 1);
        let text = std::thread::Builder::new()
            .stack_size(gojson::DEEP_VALUE_STACK)
            .spawn(move || {
                let list = parse_conflist(list_doc.as_bytes()).unwrap();
                let text = list.to_json_pretty();
                assert_eq!(parse_conflist(text.as_bytes()).unwrap(), list);
                text
            })
            .unwrap()
            .join()
            .unwrap();
        // serde_json's own pretty form of this is about 200 MB.
        assert!(text.len() < 30_000, "{} bytes", text.len());
    }

    proptest! {
        #[test]
        fn pretty_json_is_serde_jsons_for_shallow_values(v in json_value()) {
            prop_assert_eq!(pretty_json(&v), serde_json::to_vec_pretty(&v).unwrap());
        }

        #[test]
        fn round_trip_preserves_unknown_fields_and_order(doc in arb_list()) {
            let text = doc.to_string();
            let list = parse_conflist(text.as_bytes()).unwrap();
            // Compact and pretty output both carry exactly the same fields in the same order.
            prop_assert_eq!(list.to_json(), text.clone());
            let again = parse_conflist(list.to_json_pretty().as_bytes()).unwrap();
            prop_assert_eq!(again.to_json(), text);
            let keys: Vec<&String> = again.raw().keys().collect();
            let orig: Vec<&String> = doc.as_object().unwrap().keys().collect();
            prop_assert_eq!(keys, orig);
        }

        #[test]
        fn editing_plugins_keeps_the_rest(doc in arb_list()) {
            let mut list = parse_conflist(doc.to_string().as_bytes()).unwrap();
            list.plugins_mut().push(serde_json::json!({"type": "interlock-cni"}));
            list.validate().unwrap();
            let mut expected = doc.as_object().unwrap().clone();
            if let Some(Value::Array(p)) = expected.get_mut("plugins") {
                p.push(serde_json::json!({"type": "interlock-cni"}));
            }
            prop_assert_eq!(list.to_json(), Value::Object(expected).to_string());
        }
    }
}

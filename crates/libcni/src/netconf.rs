//! One plugin entry decoded the way libcni decodes it: `json.Unmarshal` into the Go
//! struct `types.NetConf` (`PluginConf` since libcni 1.2), so that our verdict on a plugin
//! entry is libcni's.
//!
//! A config list's own keys (`name`, `cniVersion`, `plugins`…) are read from a
//! `map[string]interface{}`: exact, case-sensitive keys (see `conf.rs`). A plugin entry,
//! and a whole `.conf`, go into a struct instead, and Go's struct decoding differs
//! (`encoding/json` `decode.go` `object()`):
//!
//! - a key selects a field when it equals the field's name under Unicode case folding
//!   (`fold.go`: `equalFoldRight`/`simpleLetterEqualFold`; Go 1.21+ `foldName`), so
//!   `"Type"` and `"TYPE"` set `type`, and `ſ` (U+017F) counts as `s`;
//! - every key that selects a field is decoded, in the order the decoder meets it; the last
//!   one wins, and a value of the wrong type is an error even when a later key overrides it
//!   (`d.saveError`: decoding goes on, `Unmarshal` returns the first such error);
//! - `null` leaves a string or struct field as it was and empties a map or slice
//!   (`literalStore`), so `"name": null` is no error;
//! - keys that select no field are skipped unread.
//!
//! libcni meets a plugin entry's keys in two orders. A `.conf` file is decoded from its
//! own bytes (`ConfFromBytes`): document order, duplicates included. A `.conflist`'s entries,
//! and a `.conf` again once `ConfListFromConf` wraps it, are re-encoded from
//! `map[string]interface{}` by `json.Marshal`, which drops duplicate keys (the last stays)
//! and sorts keys by bytes (`encode.go` `mapEncoder`) before `ConfFromBytes` decodes them.

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::error::ConfError;

/// A Go type of a field libcni decodes, as far as it decides what is accepted.
#[derive(Debug, Clone, Copy)]
enum GoType {
    /// `string`: a JSON string or null.
    Str,
    /// `bool` (a map value): a JSON boolean or null.
    Bool,
    /// `[]string`: an array of strings/nulls, or null.
    StrSlice,
    /// `map[string]bool`.
    BoolMap,
    /// `map[string]interface{}`: any object, or null.
    AnyMap,
    /// A struct: an object (keys matched to these fields) or null.
    Struct(&'static [(&'static str, GoType)]),
    /// A slice of structs.
    StructSlice(&'static [(&'static str, GoType)]),
}

impl GoType {
    fn expected(self) -> &'static str {
        match self {
            GoType::Str => "a string",
            GoType::Bool => "a boolean",
            GoType::StrSlice => "an array of strings",
            GoType::BoolMap | GoType::AnyMap | GoType::Struct(_) => "an object",
            GoType::StructSlice(_) => "an array of objects",
        }
    }
}

/// `types.IPAM`.
const IPAM: &[(&str, GoType)] = &[("type", GoType::Str)];
/// `types.DNS`.
const DNS: &[(&str, GoType)] = &[
    ("nameservers", GoType::StrSlice),
    ("domain", GoType::Str),
    ("search", GoType::StrSlice),
    ("options", GoType::StrSlice),
];
/// `types.GCAttachment` (libcni 1.2+).
const GC_ATTACHMENT: &[(&str, GoType)] = &[("containerID", GoType::Str), ("ifname", GoType::Str)];
/// `types.NetConf` / `types.PluginConf`: the fields libcni decodes from every plugin entry
/// (`PrevResult` is `json:"-"`). The first three are the strings [`Decoded`] reports.
const NET_CONF: &[(&str, GoType)] = &[
    ("type", GoType::Str),
    ("name", GoType::Str),
    ("cniVersion", GoType::Str),
    ("capabilities", GoType::BoolMap),
    ("ipam", GoType::Struct(IPAM)),
    ("dns", GoType::Struct(DNS)),
    ("prevResult", GoType::AnyMap),
    (
        "cni.dev/valid-attachments",
        GoType::StructSlice(GC_ATTACHMENT),
    ),
];

/// The struct fields of a decoded plugin entry that decide what the runtime does with it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Decoded {
    /// `Type`: the plugin binary.
    pub plugin_type: String,
    /// `Name`.
    pub name: String,
    /// `CNIVersion`.
    pub cni_version: String,
}

/// True when Go's `encoding/json` would put key `key` into the field named `field` (an
/// ASCII name): equal under Unicode simple case folding, where besides ASCII case only
/// U+017F folds to `s` and U+212A (Kelvin) to `k`.
pub(crate) fn go_field_matches(key: &str, field: &str) -> bool {
    let mut chars = key.chars();
    for f in field.bytes() {
        let Some(c) = chars.next() else {
            return false;
        };
        let same = if c.is_ascii() {
            (c as u8).eq_ignore_ascii_case(&f)
        } else {
            (c == '\u{17F}' && f.eq_ignore_ascii_case(&b's'))
                || (c == '\u{212A}' && f.eq_ignore_ascii_case(&b'k'))
        };
        if !same {
            return false;
        }
    }
    chars.next().is_none()
}

/// The string a Go struct field ends up with when an object that went through
/// `map[string]interface{}` and `json.Marshal` (keys sorted) is decoded into it: the last
/// string among the keys that select the field (null changes nothing). Empty when none.
pub(crate) fn go_string_field<'a>(obj: &'a Map<String, Value>, field: &str) -> &'a str {
    obj.iter()
        .filter(|(k, v)| v.is_string() && go_field_matches(k, field))
        .max_by(|a, b| a.0.cmp(b.0))
        .and_then(|(_, v)| v.as_str())
        .unwrap_or("")
}

/// `ConfFromBytes` on a document's own bytes (already through `gojson::normalize`): keys
/// in document order, duplicates included. Errors name fields under `prefix`.
pub(crate) fn decode_text(text: &[u8], prefix: &str) -> Result<Decoded, ConfError> {
    let mut de = serde_json::Deserializer::from_slice(text);
    de.disable_recursion_limit();
    let mut cx = Context::default();
    let outcome = Decode {
        ty: GoType::Struct(NET_CONF),
        path: prefix.to_string(),
        cx: &mut cx,
    }
    .deserialize(&mut de)
    .map_err(crate::gojson::Error::from)?;
    cx.finish(outcome, prefix)
}

/// `ConfFromBytes` on a plugin entry held as a value, its keys met sorted by bytes, as
/// libcni re-encodes it from `map[string]interface{}`. Errors name fields under `prefix`.
pub(crate) fn decode_value(value: &Value, prefix: &str) -> Result<Decoded, ConfError> {
    let mut cx = Context::default();
    let decode = Decode {
        ty: GoType::Struct(NET_CONF),
        path: prefix.to_string(),
        cx: &mut cx,
    };
    let outcome = match value {
        Value::Object(obj) => {
            let mut entries: Vec<(&str, &Value)> =
                obj.iter().map(|(k, v)| (k.as_str(), v)).collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            decode.deserialize(de::value::MapDeserializer::<_, serde_json::Error>::new(
                entries.into_iter(),
            ))
        }
        other => decode.deserialize(other),
    }
    .map_err(crate::gojson::Error::from)?;
    cx.finish(outcome, prefix)
}

/// The decoder's saved state: Go keeps the first type error and decodes on.
#[derive(Default)]
struct Context {
    first_error: Option<ConfError>,
}

impl Context {
    fn type_error(&mut self, path: &str, ty: GoType, found: &str) {
        if self.first_error.is_none() {
            let field = if path.is_empty() { "(document)" } else { path };
            self.first_error = Some(ConfError::Field {
                field: field.to_string(),
                problem: format!("expected {}, found {found}", ty.expected()),
            });
        }
    }

    /// libcni: the decoder's error first, then "missing 'type'".
    fn finish(self, outcome: Outcome, prefix: &str) -> Result<Decoded, ConfError> {
        if let Some(e) = self.first_error {
            return Err(e);
        }
        let mut fields = match outcome {
            Outcome::Fields(f) => f.into_iter(),
            _ => Vec::new().into_iter(),
        };
        let decoded = Decoded {
            plugin_type: fields.next().flatten().unwrap_or_default(),
            name: fields.next().flatten().unwrap_or_default(),
            cni_version: fields.next().flatten().unwrap_or_default(),
        };
        if decoded.plugin_type.is_empty() {
            return Err(ConfError::Field {
                field: join(prefix, "type"),
                problem: "missing: every plugin entry needs the name of its plugin binary".into(),
            });
        }
        Ok(decoded)
    }
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

/// What decoding one value yielded.
enum Outcome {
    /// Nothing that is kept (null, a type error, a map or slice).
    Nothing,
    /// A string field's new value.
    Str(String),
    /// A struct's string fields, by field position (last non-null wins).
    Fields(Vec<Option<String>>),
}

/// Decodes one value into a Go type, recording type errors in the context.
struct Decode<'c> {
    ty: GoType,
    path: String,
    cx: &'c mut Context,
}

impl<'de> DeserializeSeed<'de> for Decode<'_> {
    type Value = Outcome;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Outcome, D::Error> {
        d.deserialize_any(self)
    }
}

impl Decode<'_> {
    fn mismatch(self, found: &str) -> Outcome {
        self.cx.type_error(&self.path, self.ty, found);
        Outcome::Nothing
    }
}

impl<'de> Visitor<'de> for Decode<'_> {
    type Value = Outcome;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(self.ty.expected())
    }

    fn visit_unit<E: de::Error>(self) -> Result<Outcome, E> {
        Ok(Outcome::Nothing)
    }

    fn visit_none<E: de::Error>(self) -> Result<Outcome, E> {
        Ok(Outcome::Nothing)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Outcome, E> {
        Ok(match self.ty {
            GoType::Bool => Outcome::Nothing,
            _ => self.mismatch("a boolean"),
        })
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Outcome, E> {
        Ok(self.mismatch("a number"))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Outcome, E> {
        Ok(self.mismatch("a number"))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Outcome, E> {
        Ok(self.mismatch("a number"))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Outcome, E> {
        Ok(match self.ty {
            GoType::Str => Outcome::Str(s.to_string()),
            _ => self.mismatch("a string"),
        })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Outcome, A::Error> {
        let element = match self.ty {
            GoType::StrSlice => GoType::Str,
            GoType::StructSlice(fields) => GoType::Struct(fields),
            _ => {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                return Ok(self.mismatch("an array"));
            }
        };
        let mut i = 0;
        loop {
            let seed = Decode {
                ty: element,
                path: format!("{}[{i}]", self.path),
                cx: &mut *self.cx,
            };
            if seq.next_element_seed(seed)?.is_none() {
                return Ok(Outcome::Nothing);
            }
            i += 1;
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Outcome, A::Error> {
        match self.ty {
            GoType::Struct(fields) => {
                let mut values = vec![None; fields.len()];
                while let Some(key) = map.next_key::<String>()? {
                    match fields
                        .iter()
                        .position(|(name, _)| go_field_matches(&key, name))
                    {
                        Some(at) => {
                            let seed = Decode {
                                ty: fields[at].1,
                                path: join(&self.path, &key),
                                cx: &mut *self.cx,
                            };
                            if let Outcome::Str(s) = map.next_value_seed(seed)? {
                                values[at] = Some(s);
                            }
                        }
                        None => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(Outcome::Fields(values))
            }
            GoType::BoolMap => {
                while let Some(key) = map.next_key::<String>()? {
                    let seed = Decode {
                        ty: GoType::Bool,
                        path: join(&self.path, &key),
                        cx: &mut *self.cx,
                    };
                    map.next_value_seed(seed)?;
                }
                Ok(Outcome::Nothing)
            }
            GoType::AnyMap => {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Outcome::Nothing)
            }
            _ => {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(self.mismatch("an object"))
            }
        }
    }
}

//! JSON read the way the container runtimes read it.
//!
//! containerd and CRI-O load CNI configs through libcni, which decodes with Go's
//! `encoding/json`. That decoder is laxer than serde_json in two ways and stricter in none
//! that matters here, so a config our parser refused could still be the one the runtime
//! runs. [`parse`] accepts exactly what Go accepts and yields the same order-preserving
//! [`Value`] as `serde_json::from_slice` does for every input serde_json already accepted:
//!
//! - invalid UTF-8 inside a string becomes U+FFFD, one per byte that does not start a
//!   valid sequence (Go `decode.go` `unquoteBytes`: `utf8.DecodeRune` yields
//!   `RuneError` with size 1 and it is re-encoded as U+FFFD);
//! - a `\uXXXX` escape of a UTF-16 surrogate that is not the first half of a valid pair
//!   becomes U+FFFD, and the escape after it is read on its own (`unquoteBytes`:
//!   `utf16.DecodeRune` fails, "fall back to replacement rune"); serde_json rejects it;
//! - nesting is allowed up to 10,000 arrays/objects deep and refused beyond (`scanner.go`
//!   `maxNestingDepth`, checked in `pushParseState`); serde_json stops at 128.
//!
//! Everything else already agrees, and [`parse`] leaves it to serde_json: a UTF-8 byte
//! order mark, anything but whitespace after the value (`stateEndTop`), a control
//! character inside a string (`stateInString`: `c < 0x20`), a bad escape, a number out of
//! float64 range (`convertNumber`: `strconv.ParseFloat` fails, and libcni decodes every
//! config into `map[string]interface{}`) are refused by both; whitespace is the same four
//! bytes (`isSpace`); a duplicate key keeps the last value (Go map assignment; serde_json
//! keeps it at the first key's position).
//!
//! A 10,000-deep document cannot overflow the parsing thread's stack: serde_json runs
//! under `serde_stacker`, which moves to a fresh heap-allocated stack segment when the
//! current one runs low; [`StackSafe`] does the same for serialising. Code that clones,
//! compares or drops such a [`Value`] recurses too: run it on a thread with
//! [`DEEP_VALUE_STACK`].

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::Value;

/// Go's `encoding/json` limit on nested arrays and objects (`scanner.go` `maxNestingDepth`).
pub const MAX_DEPTH: usize = 10_000;

/// Stack a thread needs to clone, compare, serialise and drop a [`Value`] nested
/// [`MAX_DEPTH`] deep. Measured for serde_json 1.0.154 at depth 10,000: a debug build
/// needs about 16 MiB to clone or compare (7.3 to serialise, 2.3 to drop), a release
/// build 3.1 MiB; this leaves room for the caller's own frames. Only the pages a thread
/// touches count against memory.
pub const DEEP_VALUE_STACK: usize = 64 << 20;

/// Why a document is not JSON to Go's decoder.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// More than `limit` arrays/objects are open at once.
    #[error(
        "nested deeper than {limit} arrays/objects at line {line} column {column} \
         (containerd and CRI-O refuse it too)"
    )]
    TooDeep {
        /// The limit: [`MAX_DEPTH`], less what the caller wraps around the document.
        limit: usize,
        /// 1-based line of the bracket that went one level too deep.
        line: usize,
        /// 1-based column (in bytes) of that bracket.
        column: usize,
    },
    /// Not JSON (the message is serde_json's; Go refuses the same input).
    #[error("{0}")]
    Syntax(#[from] serde_json::Error),
}

/// Parses one JSON document as Go's `json.Unmarshal` into `interface{}` accepts it.
pub fn parse(bytes: &[u8]) -> Result<Value, Error> {
    parse_normalized(&normalize(bytes)?)
}

/// Parses what [`normalize`] returned.
pub(crate) fn parse_normalized(text: &[u8]) -> Result<Value, Error> {
    let mut de = serde_json::Deserializer::from_slice(text);
    // Depth is bounded by normalize() at Go's limit; serde_stacker keeps the stack safe.
    de.disable_recursion_limit();
    let value = Value::deserialize(serde_stacker::Deserializer::new(&mut de))?;
    de.end()?;
    Ok(value)
}

/// Serialises a [`Value`] (or a map of them) however deep it is, on any thread: each level
/// runs on a fresh heap-allocated stack segment when the current one runs low.
/// (`serde_stacker`'s own serializer does not grow the stack for map and array elements.)
pub struct StackSafe<'a, T: ?Sized>(pub &'a T);

/// Room left on the stack below which a level of nesting moves to a new segment.
const RED_ZONE: usize = 64 << 10;
/// Size of each new stack segment.
const SEGMENT: usize = 1 << 20;

impl serde::Serialize for StackSafe<'_, Value> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        stacker::maybe_grow(RED_ZONE, SEGMENT, || match self.0 {
            Value::Array(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(&StackSafe(item))?;
                }
                seq.end()
            }
            Value::Object(map) => StackSafe(map).serialize(s),
            scalar => scalar.serialize(s),
        })
    }
}

impl serde::Serialize for StackSafe<'_, serde_json::Map<String, Value>> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        stacker::maybe_grow(RED_ZONE, SEGMENT, || {
            let mut map = s.serialize_map(Some(self.0.len()))?;
            for (k, v) in self.0 {
                map.serialize_entry(k, &StackSafe(v))?;
            }
            map.end()
        })
    }
}

/// Rewrites what Go accepts and serde_json does not into the JSON Go decodes it as, and
/// refuses nesting beyond [`MAX_DEPTH`]. Only bytes inside strings change, so the
/// document's structure, and what is valid in it, stay as they were. Borrows when
/// nothing needs rewriting.
pub fn normalize(bytes: &[u8]) -> Result<Cow<'_, [u8]>, Error> {
    normalize_within(bytes, MAX_DEPTH)
}

/// [`normalize`] with a lower depth limit, for a document the runtime nests inside
/// another before decoding it again.
pub fn normalize_within(bytes: &[u8], limit: usize) -> Result<Cow<'_, [u8]>, Error> {
    let mut out = Rewrite::new(bytes);
    let mut depth = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    let (line, column) = position(bytes, i);
                    return Err(Error::TooDeep {
                        limit,
                        line,
                        column,
                    });
                }
                i += 1;
            }
            b']' | b'}' => {
                depth = depth.saturating_sub(1);
                i += 1;
            }
            b'"' => i = string(bytes, i + 1, &mut out),
            _ => i += 1,
        }
    }
    Ok(out.finish())
}

/// Scans a string body from `i` (just after its opening quote) and returns the index
/// after its closing quote (or the end of input, for serde_json to report).
fn string(bytes: &[u8], mut i: usize, out: &mut Rewrite<'_>) -> usize {
    while i < bytes.len() {
        match bytes[i] {
            b'"' => return i + 1,
            b'\\' => match bytes.get(i + 1) {
                Some(b'u') => match hex4(bytes, i + 2) {
                    // A valid pair: serde_json decodes it as Go does.
                    Some(0xD800..=0xDBFF)
                        if matches!(low_escape(bytes, i + 6), Some(0xDC00..=0xDFFF)) =>
                    {
                        i += 12
                    }
                    Some(0xD800..=0xDFFF) => {
                        // Go: not the first half of a valid pair, so U+FFFD; the next
                        // escape is decoded on its own.
                        out.replace(i, 6, b"\\ufffd");
                        i += 6;
                    }
                    Some(_) => i += 6,
                    // A malformed escape: left for serde_json to refuse, as Go does.
                    None => i += 2,
                },
                // Any other escape (valid or not) is two bytes that cannot end the string.
                Some(_) => i += 2,
                None => i += 1,
            },
            b if b < 0x80 => i += 1,
            _ => match utf8_len(&bytes[i..]) {
                Some(n) => i += n,
                None => {
                    // Go: utf8.DecodeRune gives RuneError of size 1, written as U+FFFD.
                    out.replace(i, 1, "\u{FFFD}".as_bytes());
                    i += 1;
                }
            },
        }
    }
    i
}

/// Length of the valid UTF-8 sequence at the start of `s`, if one starts there. Go's
/// `utf8.DecodeRune` and Rust accept the same sequences (no overlong forms, no
/// surrogates, nothing above U+10FFFF).
fn utf8_len(s: &[u8]) -> Option<usize> {
    let n = match s.first()? {
        0xC2..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF4 => 4,
        _ => return None,
    };
    let seq = s.get(..n)?;
    std::str::from_utf8(seq).ok().map(|_| n)
}

/// The code unit of four hex digits at `i`.
fn hex4(bytes: &[u8], i: usize) -> Option<u16> {
    let digits = bytes.get(i..i + 4)?;
    let text = std::str::from_utf8(digits).ok()?;
    if !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u16::from_str_radix(text, 16).ok()
}

/// The code unit of a `\uXXXX` escape at `i`, if there is one.
fn low_escape(bytes: &[u8], i: usize) -> Option<u16> {
    if bytes.get(i..i + 2)? != b"\\u" {
        return None;
    }
    hex4(bytes, i + 2)
}

/// 1-based line and byte column of offset `at`.
fn position(bytes: &[u8], at: usize) -> (usize, usize) {
    let before = &bytes[..at];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let column = at
        - before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |p| p + 1)
        + 1;
    (line, column)
}

/// A copy of the input made only once something in it has to change.
struct Rewrite<'a> {
    input: &'a [u8],
    out: Option<Vec<u8>>,
    copied: usize,
}

impl<'a> Rewrite<'a> {
    fn new(input: &'a [u8]) -> Self {
        Rewrite {
            input,
            out: None,
            copied: 0,
        }
    }

    /// Writes `with` in place of `len` input bytes at `at` (calls come in input order).
    fn replace(&mut self, at: usize, len: usize, with: &[u8]) {
        let out = self
            .out
            .get_or_insert_with(|| Vec::with_capacity(self.input.len() + 16));
        out.extend_from_slice(&self.input[self.copied..at]);
        out.extend_from_slice(with);
        self.copied = at + len;
    }

    fn finish(self) -> Cow<'a, [u8]> {
        match self.out {
            None => Cow::Borrowed(self.input),
            Some(mut out) => {
                out.extend_from_slice(&self.input[self.copied..]);
                Cow::Owned(out)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parsed(doc: &[u8]) -> Value {
        parse(doc).unwrap()
    }

    #[test]
    fn rewrites_only_what_serde_json_refuses() {
        let clean = br#"{"a":"caf\u00e9 \ud83d\ude00 \"x\" \\ud800","b":[1,2]}"#;
        assert!(matches!(normalize(clean).unwrap(), Cow::Borrowed(_)));
        assert_eq!(
            parsed(clean),
            serde_json::from_slice::<Value>(clean).unwrap()
        );
        // An escaped backslash followed by "ud800" is text, not an escape.
        assert_eq!(parsed(clean)["a"], "caf\u{e9} \u{1F600} \"x\" \\ud800");
        let rewritten = normalize(b"[\"\xe9\\udc00\"]").unwrap();
        assert_eq!(&*rewritten, "[\"\u{FFFD}\\ufffd\"]".as_bytes());
        // Bytes outside strings are left for serde_json to refuse.
        assert!(matches!(normalize(b"[1]\xe9").unwrap(), Cow::Borrowed(_)));
        assert!(parse(b"[1]\xe9").is_err());
    }

    #[test]
    fn depth_limit_is_gos_and_names_the_place() {
        let at = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(normalize(at(MAX_DEPTH).as_bytes()).is_ok());
        let doc = format!("{{\n \"a\": {}}}", at(MAX_DEPTH));
        match normalize(doc.as_bytes()) {
            Err(Error::TooDeep {
                limit,
                line,
                column,
            }) => assert_eq!((limit, line, column), (MAX_DEPTH, 2, 7 + MAX_DEPTH - 1)),
            other => panic!("expected TooDeep, got {other:?}"),
        }
        // Brackets inside strings do not count.
        let quoted = format!("[\"{}\"]", "[{".repeat(MAX_DEPTH));
        assert!(parse(quoted.as_bytes()).is_ok());
        assert!(normalize_within(at(3).as_bytes(), 2).is_err());
    }

    #[test]
    fn deepest_document_parses_on_a_small_stack() {
        let doc = format!(
            "{}{}",
            "{\"a\":[".repeat(MAX_DEPTH / 2),
            "]}".repeat(MAX_DEPTH / 2)
        );
        // 128 KiB is far less than serde_json needs for 10,000 levels unaided.
        let value = std::thread::Builder::new()
            .stack_size(128 << 10)
            .spawn(move || parse(doc.as_bytes()).map_err(|e| e.to_string()))
            .unwrap()
            .join()
            .unwrap()
            .unwrap();
        // Dropping and comparing the value recurse: that needs DEEP_VALUE_STACK.
        std::thread::Builder::new()
            .stack_size(DEEP_VALUE_STACK)
            .spawn(move || {
                let mut v = &value;
                let mut depth = 0;
                while let Some(inner) = v.get("a").or_else(|| v.get(0)) {
                    v = inner;
                    depth += 1;
                }
                assert_eq!(depth, MAX_DEPTH - 1);
                assert_eq!(value.clone(), value);
            })
            .unwrap()
            .join()
            .unwrap();
    }

    #[test]
    fn stack_safe_serialises_the_deepest_value_on_a_small_stack() {
        let doc = format!(
            "{{\"k\":[1,{}\"x\"{}]}}",
            "{\"a\":[true,".repeat(MAX_DEPTH / 2 - 2),
            "]}".repeat(MAX_DEPTH / 2 - 2)
        );
        let value = std::sync::Arc::new(parse(doc.as_bytes()).unwrap());
        let shared = value.clone();
        let text = std::thread::Builder::new()
            .stack_size(128 << 10)
            .spawn(move || {
                let map = shared.as_object().unwrap();
                let text = serde_json::to_string(&StackSafe(&*shared)).unwrap();
                assert_eq!(serde_json::to_string(&StackSafe(map)).unwrap(), text);
                text
            })
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(text, doc);
        // The value is dropped where there is stack for it.
        std::thread::Builder::new()
            .stack_size(DEEP_VALUE_STACK)
            .spawn(move || drop(value))
            .unwrap()
            .join()
            .unwrap();
    }

    proptest! {
        #[test]
        fn stack_safe_writes_what_serde_json_writes(v in json_value()) {
            prop_assert_eq!(serde_json::to_string(&StackSafe(&v)).unwrap(), v.to_string());
            prop_assert_eq!(
                serde_json::to_string_pretty(&StackSafe(&v)).unwrap(),
                serde_json::to_string_pretty(&v).unwrap()
            );
        }
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            any::<String>().prop_map(Value::String),
        ];
        leaf.prop_recursive(6, 64, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::vec((any::<String>(), inner), 0..6)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    /// A JSON text for `v` with non-ASCII written as escapes, some of them surrogate pairs.
    fn ascii_escaped(v: &Value) -> String {
        let mut out = String::new();
        for c in v.to_string().chars() {
            if c.is_ascii() {
                out.push(c);
            } else {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04X}"));
                }
            }
        }
        out
    }

    proptest! {
        #[test]
        fn same_value_as_serde_json_for_what_it_accepts(v in json_value()) {
            for text in [v.to_string(), serde_json::to_string_pretty(&v).unwrap(), ascii_escaped(&v)] {
                let theirs: Value = serde_json::from_str(&text).unwrap();
                let ours = parse(text.as_bytes()).unwrap();
                prop_assert_eq!(&ours, &theirs);
                // Same keys in the same order, not only equal maps.
                prop_assert_eq!(ours.to_string(), theirs.to_string());
            }
        }

        #[test]
        fn mutated_documents_agree_wherever_serde_json_accepts(
            v in json_value(),
            edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        ) {
            let mut bytes = v.to_string().into_bytes();
            for (at, byte) in edits {
                let i = at.index(bytes.len());
                bytes[i] = byte;
            }
            if let Ok(theirs) = serde_json::from_slice::<Value>(&bytes) {
                let ours = parse(&bytes).unwrap();
                prop_assert_eq!(ours.to_string(), theirs.to_string());
            }
        }
    }
}

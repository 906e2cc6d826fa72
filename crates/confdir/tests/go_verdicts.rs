//! Configs the runtimes load are configs we load, and the other way round.
//!
//! Each case is a file and the verdict containerd reaches on it through libcni
//! (`.conflist`: `ConfListFromBytes`; otherwise `ConfFromBytes` then `ConfListFromConf`,
//! as containerd's go-cni loads a conf dir), with the Go rule that decides it. The
//! verdicts, names and types were taken from libcni v1.1.2 (what containerd 1.6 and CRI-O
//! vendor) built with Go 1.19's `encoding/json`. To check the table against a Go decoder
//! again, set `INTERLOCK_GO_VERDICT_CASES=<dir>`: every case is written there as
//! `NNN.conflist` / `NNN.conf` for a program that prints libcni's verdict on each, and
//! the table's verdicts as `expected.tsv` (`NNN.ext<TAB>accept<TAB>name="…" type="…"`
//! or `NNN.ext<TAB>reject`) to compare its output with.

use interlock_libcni::conf::{parse_conf_with, parse_conflist_with, Validation};
use interlock_libcni::NetworkConfigList;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Conflist,
    Conf,
}
use Kind::{Conf, Conflist};

/// What libcni makes of the file: loaded with this network name and first plugin type,
/// or refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Go {
    Loads {
        name: &'static str,
        plugin: &'static str,
    },
    Refuses,
}
use Go::Refuses;

const fn loads(name: &'static str, plugin: &'static str) -> Go {
    Go::Loads { name, plugin }
}

struct Case {
    kind: Kind,
    doc: Vec<u8>,
    go: Go,
    rule: &'static str,
}

fn case(kind: Kind, doc: impl AsRef<[u8]>, go: Go, rule: &'static str) -> Case {
    Case {
        kind,
        doc: doc.as_ref().to_vec(),
        go,
        rule,
    }
}

/// A conflist `{"cniVersion":"1.0.0","name":<name>,<extra>"plugins":[<plugin>]}` from raw
/// bytes, so cases can hold what is not valid UTF-8.
fn list(name: &[u8], extra: &[u8], plugin: &[u8]) -> Vec<u8> {
    [
        &b"{\"cniVersion\":\"1.0.0\",\"name\":"[..],
        name,
        b",",
        extra,
        b"\"plugins\":[",
        plugin,
        b"]}",
    ]
    .concat()
}

/// `n` nested arrays around `1`.
fn nested(n: usize) -> String {
    format!("{}1{}", "[".repeat(n), "]".repeat(n))
}

const BRIDGE: &[u8] = br#"{"type":"bridge"}"#;

fn cases() -> Vec<Case> {
    let mut c = vec![
        // --- M3's two reproductions ---
        case(Conflist, list(b"\"caf\xe9\"", b"", BRIDGE), loads("caf\u{FFFD}", "bridge"),
            "decode.go unquoteBytes: an invalid UTF-8 byte in a string becomes U+FFFD"),
        case(Conflist, list(b"\"n\"", format!("\"x\":{},", nested(200)).as_bytes(), BRIDGE), loads("n", "bridge"),
            "scanner.go maxNestingDepth = 10000: 200 deep is fine"),
        // --- invalid UTF-8: one U+FFFD per byte that starts no valid sequence ---
        case(Conflist, list(b"\"\xe2\x82\"", b"", BRIDGE), loads("\u{FFFD}\u{FFFD}", "bridge"),
            "utf8.DecodeRune: a truncated sequence is RuneError of size 1, byte by byte"),
        case(Conflist, list(b"\"\xed\xa0\x80\"", b"", BRIDGE), loads("\u{FFFD}\u{FFFD}\u{FFFD}", "bridge"),
            "utf8.DecodeRune: an encoded surrogate is invalid, three replacements"),
        case(Conflist, list(b"\"\xc0\xaf\"", b"", BRIDGE), loads("\u{FFFD}\u{FFFD}", "bridge"),
            "utf8.DecodeRune: an overlong form is invalid"),
        case(Conflist, list(b"\"\xf4\x90\x80\x80\"", b"", BRIDGE), loads("\u{FFFD}\u{FFFD}\u{FFFD}\u{FFFD}", "bridge"),
            "utf8.DecodeRune: above U+10FFFF is invalid"),
        case(Conflist, list(b"\"\xf0\x9f\x98\x80\"", b"", BRIDGE), loads("\u{1F600}", "bridge"),
            "valid 4-byte UTF-8 is kept"),
        case(Conflist, list(b"\"n\"", b"\"caf\xe9\":1,", BRIDGE), loads("n", "bridge"),
            "unquoteBytes also runs on object keys"),
        case(Conflist, list(b"\"n\"", b"", b"{\"type\":\"br\xffidge\"}"), loads("n", "br\u{FFFD}idge"),
            "inside a plugin entry too: the map keeps U+FFFD, json.Marshal writes it back"),
        case(Conf, b"{\"type\":\"bridge\",\"name\":\"caf\xe9\"}", loads("caf\u{FFFD}", "bridge"),
            "a .conf: ConfFromBytes decodes with the same unquoteBytes"),
        case(Conflist, [&list(b"\"n\"", b"", BRIDGE)[..], b"\xe9"].concat(), Refuses,
            "stateEndTop: a byte >= 0x80 outside a string is a syntax error"),
        // --- lone UTF-16 surrogate escapes become U+FFFD ---
        case(Conflist, list(br#""\ud800""#, b"", BRIDGE), loads("\u{FFFD}", "bridge"),
            "unquoteBytes: a high surrogate without its pair falls back to U+FFFD"),
        case(Conflist, list(br#""\udc00""#, b"", BRIDGE), loads("\u{FFFD}", "bridge"),
            "unquoteBytes: a lone low surrogate is U+FFFD"),
        case(Conflist, list(br#""\ud800\u0041""#, b"", BRIDGE), loads("\u{FFFD}A", "bridge"),
            "unquoteBytes: the escape after a bad high surrogate is read on its own"),
        case(Conflist, list(br#""\ud800\ud800\udc00""#, b"", BRIDGE), loads("\u{FFFD}\u{10000}", "bridge"),
            "unquoteBytes: a bad high surrogate, then a valid pair"),
        case(Conflist, list(br#""\udc00\ud800""#, b"", BRIDGE), loads("\u{FFFD}\u{FFFD}", "bridge"),
            "utf16.DecodeRune: low then high is no pair"),
        case(Conflist, list(br#""\ud83d\ude00""#, b"", BRIDGE), loads("\u{1F600}", "bridge"),
            "a valid surrogate pair decodes"),
        case(Conf, br#"{"type":"bri\udfffdge","name":"n"}"#, loads("n", "bri\u{FFFD}dge"),
            "a .conf's struct decoding uses the same unquoteBytes"),
        // --- structure and syntax: refused by Go, refused by us ---
        case(Conflist, [&b"\xef\xbb\xbf"[..], &list(b"\"n\"", b"", BRIDGE)].concat(), Refuses,
            "stateBeginValue: a UTF-8 byte order mark is an invalid character"),
        case(Conflist, [&list(b"\"n\"", b"", BRIDGE)[..], b"x"].concat(), Refuses,
            "stateEndTop: non-space after the top-level value"),
        case(Conflist, [&list(b"\"n\"", b"", BRIDGE)[..], b"{}"].concat(), Refuses,
            "stateEndTop: a second value after the first"),
        case(Conflist, [&list(b"\"n\"", b"", BRIDGE)[..], b"\0"].concat(), Refuses,
            "isSpace: NUL is not whitespace"),
        case(Conflist, [&list(b"\"n\"", b"", BRIDGE)[..], b" \t\r\n"].concat(), loads("n", "bridge"),
            "isSpace: space, tab, CR and LF may follow the value"),
        case(Conflist, [&b"\x0c"[..], &list(b"\"n\"", b"", BRIDGE)].concat(), Refuses,
            "isSpace: form feed is not whitespace"),
        case(Conflist, [&b"\xc2\xa0"[..], &list(b"\"n\"", b"", BRIDGE)].concat(), Refuses,
            "isSpace: no-break space is not whitespace"),
        case(Conflist, b"", Refuses, "checkValid: unexpected end of JSON input"),
        case(Conflist, list(b"\"a\x01b\"", b"", BRIDGE), Refuses,
            "stateInString: a control character below 0x20 in a string"),
        case(Conflist, list(b"\"a\tb\"", b"", BRIDGE), Refuses,
            "stateInString: a raw tab in a string is a control character"),
        case(Conflist, list(b"\"a\x7fb\"", b"", BRIDGE), loads("a\u{7f}b", "bridge"),
            "stateInString: DEL (0x7f) is allowed"),
        case(Conflist, list(br#""a\'b""#, b"", BRIDGE), Refuses,
            "stateInStringEsc: \\' is no JSON escape"),
        case(Conflist, list(br#""a\x41""#, b"", BRIDGE), Refuses,
            "stateInStringEsc: \\x is no JSON escape"),
        case(Conflist, list(br#""a\u00e""#, b"", BRIDGE), Refuses,
            "stateInStringEscU123: \\u needs four hex digits"),
        case(Conflist, list(br#""a\/b\u00e9""#, b"", BRIDGE), loads("a/b\u{e9}", "bridge"),
            "stateInStringEsc: \\/ and \\u00e9"),
        case(Conflist, list(b"\"n", b"", BRIDGE), Refuses, "an unclosed string"),
        case(Conflist, list(b"\"n\"", b"// c\n", BRIDGE), Refuses, "no comments"),
        case(Conflist, list(b"\"n\"", b"\"x\":True,", BRIDGE), Refuses, "literals are lower case"),
        case(Conflist, list(b"\"n\"", b"\"x\":[1,],", BRIDGE), Refuses, "no trailing comma"),
        // --- numbers: the scanner's grammar, then float64 (libcni decodes into interface{}) ---
        case(Conflist, list(b"\"n\"", b"\"x\":1e400,", BRIDGE), Refuses,
            "convertNumber: strconv.ParseFloat overflows, UnmarshalTypeError"),
        case(Conflist, list(b"\"n\"", b"\"x\":-1e400,", BRIDGE), Refuses,
            "convertNumber: negative overflow too"),
        case(Conflist, list(b"\"n\"", b"\"x\":1.8e308,", BRIDGE), Refuses,
            "convertNumber: just above the largest float64"),
        case(Conflist, list(b"\"n\"", b"\"x\":1.7976931348623157e308,", BRIDGE), loads("n", "bridge"),
            "convertNumber: the largest float64"),
        case(Conflist, list(b"\"n\"", b"\"x\":1e-400,", BRIDGE), loads("n", "bridge"),
            "convertNumber: underflow is 0, no error"),
        case(Conflist, list(b"\"n\"", b"\"x\":0e99999999999,", BRIDGE), loads("n", "bridge"),
            "convertNumber: zero with a huge exponent is 0"),
        case(Conflist, list(b"\"n\"", b"\"x\":18446744073709551616,", BRIDGE), loads("n", "bridge"),
            "convertNumber: an integer past u64 is still a float64"),
        case(Conflist, list(b"\"n\"", format!("\"x\":{},", "9".repeat(400)).as_bytes(), BRIDGE), Refuses,
            "convertNumber: a 400-digit integer overflows float64"),
        case(Conflist, list(b"\"n\"", b"\"x\":[-0,1E+2,0.5e-3],", BRIDGE), loads("n", "bridge"),
            "scanner: -0, 1E+2 and 0.5e-3 are numbers"),
        case(Conflist, list(b"\"n\"", b"\"x\":01,", BRIDGE), Refuses, "state0: no leading zero"),
        case(Conflist, list(b"\"n\"", b"\"x\":1.,", BRIDGE), Refuses, "stateDot: a digit after the dot"),
        case(Conflist, list(b"\"n\"", b"\"x\":.5,", BRIDGE), Refuses, "stateBeginValue: no leading dot"),
        case(Conflist, list(b"\"n\"", b"\"x\":+1,", BRIDGE), Refuses, "stateBeginValue: no plus sign"),
        case(Conflist, list(b"\"n\"", b"\"x\":1e,", BRIDGE), Refuses, "stateE: a digit after the exponent"),
        case(Conf, br#"{"type":"bridge","name":"n","x":1e400}"#, Refuses,
            "ConfListFromConf decodes a .conf into map[string]interface{}: the overflow is an error"),
        // --- duplicate keys ---
        case(Conflist, br#"{"name":5,"name":"n","plugins":[{"type":"bridge"}]}"#, loads("n", "bridge"),
            "map[string]interface{}: the last key wins, the first value is never type-checked"),
        case(Conflist, br#"{"name":"a","plugins":[{"type":"bridge"}],"name":"b"}"#, loads("b", "bridge"),
            "map[string]interface{}: the last key wins"),
        case(Conflist, br#"{"name":"n","plugins":[{"type":5,"type":"bridge"}]}"#, loads("n", "bridge"),
            "a conflist's plugin entry goes through the map first: only the last type is decoded"),
        case(Conf, br#"{"type":5,"type":"bridge","name":"n"}"#, Refuses,
            "a .conf is decoded into the struct from its bytes: every duplicate is type-checked"),
        case(Conf, br#"{"type":"bridge","type":"macvlan","name":"n"}"#, loads("n", "macvlan"),
            "struct decoding: the last key wins"),
        case(Conf, br#"{"type":"bridge","capabilities":{"x":"s","x":true}}"#, Refuses,
            "map[string]bool inside the struct: every duplicate value is type-checked"),
        case(Conflist, br#"{"name":"n","plugins":[{"type":"bridge","capabilities":{"x":"s","x":true}}]}"#, loads("n", "bridge"),
            "the same entry in a conflist was deduplicated by the map first"),
        // --- a conflist's own keys are map keys: exact case ---
        case(Conflist, br#"{"Name":"n","plugins":[{"type":"bridge"}]}"#, Refuses,
            "ConfListFromBytes: rawList[\"name\"] is an exact lookup"),
        case(Conflist, br#"{"name":"n","Plugins":[{"type":"bridge"}]}"#, Refuses,
            "ConfListFromBytes: rawList[\"plugins\"] is an exact lookup"),
        case(Conflist, br#"{"name":null,"plugins":[{"type":"bridge"}]}"#, Refuses,
            "ConfListFromBytes: a null name is no string"),
        case(Conflist, br#"{"name":"n","cniVersion":null,"plugins":[{"type":"bridge"}]}"#, Refuses,
            "ConfListFromBytes: a null cniVersion is no string"),
        // --- a plugin entry and a .conf are struct-decoded: field names without case ---
        case(Conflist, br#"{"name":"n","plugins":[{"TYPE":"bridge"}]}"#, loads("n", "bridge"),
            "decode.go object(): a key matches a struct field case-insensitively"),
        case(Conf, br#"{"Type":"bridge","NAME":"n"}"#, loads("n", "bridge"),
            "ConfFromBytes: Type and Name match case-insensitively"),
        case(Conf, br#"{"type":"bridge","NAME":"n1","name":"n2"}"#, loads("n2", "bridge"),
            "struct decoding in document order: the last matching key wins"),
        case(Conf, br#"{"type":"bridge","name":"n2","NAME":"n1"}"#, loads("n1", "bridge"),
            "struct decoding in document order: the last matching key wins"),
        case(Conf, "{\"type\":\"bridge\",\"dn\u{17F}\":{\"nameservers\":5}}", Refuses,
            "fold.go: U+017F (long s) folds to s, so the key is dns and 5 is no []string"),
        case(Conflist, br#"{"name":"n","plugins":[{"type":"bridge","IPAM":{"Type":7}}]}"#, Refuses,
            "IPAM.Type is a string field, matched without case"),
        case(Conflist, br#"{"name":"n","plugins":[{"type":"","Type":"bridge"}]}"#, Refuses,
            "json.Marshal sorts map keys: Type, then type; the empty type wins: missing 'type'"),
        case(Conflist, br#"{"name":"n","plugins":[{"Type":"","type":"bridge"}]}"#, loads("n", "bridge"),
            "json.Marshal sorts map keys: Type, then type; bridge wins"),
        case(Conf, br#"{"type":"","Type":"bridge","name":"n"}"#, Refuses,
            "ConfFromBytes takes bridge, but ConfListFromConf re-encodes sorted and the empty type wins"),
        case(Conf, br#"{"Type":"","type":"bridge","name":"n"}"#, loads("n", "bridge"),
            "both decodings end on bridge"),
        // --- null in struct fields: no error ---
        case(Conflist, br#"{"name":"n","plugins":[{"type":"bridge","name":null,"cniVersion":null,"ipam":null,"dns":null,"capabilities":null,"prevResult":null}]}"#, loads("n", "bridge"),
            "literalStore: null leaves a string or struct as it is and empties a map"),
        case(Conf, br#"{"type":"bridge","name":null,"cniVersion":null,"ipam":{"type":null},"dns":{"nameservers":[null],"domain":null}}"#, loads("", "bridge"),
            "literalStore: null inside nested structs and slices is no error"),
        case(Conflist, br#"{"name":"n","plugins":[{"type":"bridge","TYPE":null}]}"#, loads("n", "bridge"),
            "literalStore: a later null does not clear the type"),
        case(Conflist, br#"{"name":"n","plugins":[{"type":"bridge","capabilities":{"portMappings":null}}]}"#, loads("n", "bridge"),
            "map[string]bool: a null value is false, no error"),
        case(Conflist, br#"{"name":"n","plugins":[{"type":null}]}"#, Refuses,
            "ConfFromBytes: a null type stays empty: missing 'type'"),
        case(Conflist, br#"{"name":"n","plugins":[{"type":"bridge"},null]}"#, Refuses,
            "ConfFromBytes(\"null\"): an empty struct: missing 'type'"),
        // --- type errors in struct fields ---
        case(Conf, br#"{"type":"bridge","capabilities":{"x":"true"}}"#, Refuses,
            "map[string]bool: a string is no bool"),
        case(Conf, br#"{"type":"bridge","name":5}"#, Refuses, "Name is a string"),
        case(Conflist, br#"{"name":"n","plugins":[{"type":"bridge","dns":{"search":"x"}}]}"#, Refuses,
            "DNS.Search is a []string"),
        case(Conflist, br#"{"name":"n","plugins":[{"type":"bridge","prevResult":[]}]}"#, Refuses,
            "RawPrevResult is a map"),
        case(Conf, b"[]", Refuses, "a .conf must be an object"),
    ];
    // --- nesting: Go allows 10,000 open arrays/objects and refuses 10,001 ---
    // The list object is level 1, so a top-level field holds 9,999 more.
    for (depth, go) in [(10_000, loads("n", "bridge")), (10_001, Refuses)] {
        let extra = format!("\"x\":{},", nested(depth - 1));
        c.push(case(
            Conflist,
            list(b"\"n\"", extra.as_bytes(), BRIDGE),
            go,
            "scanner.go pushParseState: len(parseState) <= maxNestingDepth (10000)",
        ));
    }
    // A .conf passes ConfFromBytes at 10,000, but ConfListFromConf nests it two levels
    // deeper (list object, plugins array) and decodes that: 9,998 is a .conf's limit.
    for (depth, go) in [
        (9_998, loads("n", "bridge")),
        (9_999, Refuses),
        (10_000, Refuses),
    ] {
        let conf = format!(
            "{{\"type\":\"bridge\",\"name\":\"n\",\"x\":{}}}",
            nested(depth - 1)
        );
        c.push(case(
            Conf,
            conf,
            go,
            "maxNestingDepth, after ConfListFromConf wraps the .conf two levels deeper",
        ));
    }
    // A plugin entry is level 3 (list, plugins array, entry).
    let plugin = format!("{{\"type\":\"bridge\",\"x\":{}}}", nested(9_997));
    c.push(case(
        Conflist,
        list(b"\"n\"", b"", plugin.as_bytes()),
        loads("n", "bridge"),
        "10,000 deep inside a plugin entry: libcni re-encodes and decodes it again, still 10,000",
    ));
    c
}

fn our_verdict(c: &Case) -> Result<NetworkConfigList, String> {
    match c.kind {
        Conflist => parse_conflist_with(&c.doc, Validation::Libcni),
        Conf => parse_conf_with(&c.doc, Validation::Libcni),
    }
    .map_err(|e| e.to_string())
}

/// Runs `f` on a thread with the stack a 10,000-deep value needs (dropping and comparing
/// it recurse; parsing does not).
fn with_deep_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(interlock_libcni::gojson::DEEP_VALUE_STACK)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap()
}

#[test]
fn every_verdict_is_gos() {
    let cases = cases();
    if let Some(dir) = std::env::var_os("INTERLOCK_GO_VERDICT_CASES") {
        let dir = std::path::PathBuf::from(dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut table = String::new();
        for (i, c) in cases.iter().enumerate() {
            let ext = if c.kind == Conflist {
                "conflist"
            } else {
                "conf"
            };
            std::fs::write(dir.join(format!("{i:03}.{ext}")), &c.doc).unwrap();
            table += &match c.go {
                Go::Loads { name, plugin } => {
                    format!("{i:03}.{ext}\taccept\tname={name:?} type={plugin:?}\n")
                }
                Go::Refuses => format!("{i:03}.{ext}\treject\n"),
            };
        }
        std::fs::write(dir.join("expected.tsv"), table).unwrap();
    }
    let failures = with_deep_stack(move || {
        let mut failures = Vec::new();
        for (i, c) in cases.iter().enumerate() {
            let ours = our_verdict(c);
            let agrees = match (&ours, c.go) {
                (Ok(l), Go::Loads { name, plugin }) => {
                    l.name() == name && l.plugin_types().first() == Some(&plugin)
                }
                (Err(_), Go::Refuses) => true,
                _ => false,
            };
            if !agrees {
                let ours = ours.map(|l| (l.name().to_string(), l.plugin_types().join(",")));
                failures.push(format!(
                    "case {i} ({:?}, {}): Go {:?}, ours {ours:?}",
                    c.kind, c.rule, c.go
                ));
            }
        }
        failures
    });
    assert!(
        failures.is_empty(),
        "{} verdicts differ from Go's:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn m3_reproductions_load_with_the_fields_kept() {
    // M3's first file: the name keeps U+FFFD; the plugin entry and its order survive.
    let doc = b"{\"cniVersion\":\"1.0.0\",\"name\":\"caf\xe9\",\"plugins\":[{\"type\":\"bridge\",\"bridge\":\"rtbr0\",\"ipam\":{\"type\":\"host-local\",\"ranges\":[[{\"subnet\":\"10.231.60.0/24\"}]]}}]}";
    let list = parse_conflist_with(doc, Validation::Libcni).unwrap();
    assert_eq!(list.name(), "caf\u{FFFD}");
    assert_eq!(
        list.to_json(),
        "{\"cniVersion\":\"1.0.0\",\"name\":\"caf\u{FFFD}\",\"plugins\":[{\"type\":\"bridge\",\"bridge\":\"rtbr0\",\"ipam\":{\"type\":\"host-local\",\"ranges\":[[{\"subnet\":\"10.231.60.0/24\"}]]}}]}"
    );
    assert_eq!(list.plugin_confs()[0].ipam_type(), Some("host-local"));
    // M3's second: a foreign field 200 deep is kept whole, after the spec keys.
    let deep = format!("{}{{}}{}", "{\"a\":".repeat(199), "}".repeat(199));
    let doc = format!(
        r#"{{"cniVersion":"1.0.0","name":"n","zz":{deep},"plugins":[{{"type":"bridge"}}]}}"#
    );
    let list = parse_conflist_with(doc.as_bytes(), Validation::Libcni).unwrap();
    assert_eq!(list.to_json(), doc);
    let keys: Vec<&str> = list.raw().keys().map(String::as_str).collect();
    assert_eq!(keys, ["cniVersion", "name", "zz", "plugins"]);
}

#[test]
fn errors_name_the_file_problem() {
    let deep = format!(
        r#"{{"name":"n","x":{},"plugins":[{{"type":"bridge"}}]}}"#,
        nested(10_000)
    );
    let e = parse_conflist_with(deep.as_bytes(), Validation::Libcni).unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid JSON: nested deeper than 10000 arrays/objects at line 1 column 10016 \
         (containerd and CRI-O refuse it too)"
    );
    let e = parse_conf_with(br#"{"type":"bridge","type":5}"#, Validation::Libcni).unwrap_err();
    assert_eq!(e.to_string(), "type: expected a string, found a number");
    let e = parse_conflist_with(
        br#"{"name":"n","plugins":[{"type":"bridge","IPAM":{"Type":7}}]}"#,
        Validation::Libcni,
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "plugins[0].IPAM.Type: expected a string, found a number"
    );
}

#[test]
fn the_conf_dir_verdict_is_the_runtimes() {
    use interlock_confdir::{self as confdir, Runtime, Verdict};
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let bin = tempfile::tempdir().unwrap();
    let plugin = bin.path().join("bridge");
    std::fs::write(&plugin, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    // M3: containerd loads this file and runs bridge; so must our verdict say.
    std::fs::write(
        dir.path().join("10-primary.conflist"),
        list(
            b"\"caf\xe9\"",
            format!("\"x\":{},", nested(200)).as_bytes(),
            BRIDGE,
        ),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("20-other.conf"),
        br#"{"Type":"bridge","NAME":"other"}"#,
    )
    .unwrap();
    for runtime in [Runtime::Containerd, Runtime::Crio] {
        let e = confdir::load(dir.path(), runtime, &[bin.path().to_path_buf()]).unwrap();
        let chosen = e.chosen.as_ref().expect("the runtime has a network");
        assert_eq!(
            chosen.path,
            dir.path().join("10-primary.conflist"),
            "{runtime}"
        );
        assert_eq!(chosen.list.name(), "caf\u{FFFD}");
        assert_eq!(chosen.list.plugin_types(), ["bridge"]);
        assert_eq!(
            e.verdict_for("10-primary.conflist").unwrap().verdict,
            Verdict::Chosen
        );
    }
    // CRI-O reads on past the default network: the case-folded .conf loads too.
    let e = confdir::load(dir.path(), Runtime::Crio, &[bin.path().to_path_buf()]).unwrap();
    assert_eq!(
        e.verdict_for("20-other.conf").unwrap().verdict,
        Verdict::LoadedNotDefault,
        "{:?}",
        e.files
    );
}

/// CRI-O's VERSION probe against the real plugins: a 1.1.0 list is skipped (the
/// installed plugins stop at 1.0.0) and CRI-O falls back to the next file.
#[test]
fn crio_probe_with_reference_plugins() {
    use interlock_confdir::{load_with, LoadOptions, Runtime, Verdict};
    use serde_json::json;
    use std::fs;
    let t = interlock_testkit::tempdir().unwrap();
    let list = |v: &str, n: &str| {
        json!({"cniVersion": v, "name": n, "plugins": [{"type": "bridge"}, {"type": "portmap"}]})
            .to_string()
    };
    fs::write(t.path().join("00-a.conflist"), list("1.1.0", "a")).unwrap();
    fs::write(t.path().join("10-b.conflist"), list("1.0.0", "b")).unwrap();
    let e = load_with(
        t.path(),
        Runtime::Crio,
        &[interlock_testkit::cni_plugins_dir()],
        LoadOptions {
            probe_versions: true,
        },
    )
    .unwrap();
    if e.chosen_name().as_deref() == Some("00-a.conflist") {
        eprintln!("SKIP: the installed reference plugins support 1.1.0");
        return;
    }
    assert_eq!(e.chosen_name().as_deref(), Some("10-b.conflist"));
    let a = e.verdict_for("00-a.conflist").unwrap();
    assert_eq!(a.verdict, Verdict::Skipped);
    assert!(
        a.reason.contains("bridge does not support config version"),
        "{}",
        a.reason
    );
}

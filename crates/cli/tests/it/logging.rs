//! The agent's logs as an operator sees them: `--log-format json` gives one JSON object
//! per line with the event's fields and the shared timestamp format, and a filter that
//! does not parse is refused with the variable's name.

use crate::common;

use common::*;
use serde_json::Value;

#[test]
fn json_logs_carry_fields_and_rfc3339_millis() {
    let d = Dirs::new();
    d.write("10-calico.conflist", CALICO);
    let a = d.agent(&["--log-format", "json"]);
    wait_protected(&d, &a);
    let text = a.log_text();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let start = lines
        .iter()
        .find(|l| l["message"] == "interlock agent starting")
        .unwrap_or_else(|| panic!("no start line in:\n{text}"));
    assert_eq!(start["level"], "INFO");
    assert_eq!(start["conf_dir"], d.conf.display().to_string());
    // ux-3 finding 10: arrays and enums are JSON values, not Rust's debug text.
    assert_eq!(
        start["bin_dirs"],
        serde_json::json!([d.bin.display().to_string()]),
        "{start}"
    );
    assert_eq!(start["mode"], "owned");
    assert_eq!(start["runtime"], "containerd");
    assert!(start["plugin_versions"].is_array(), "{start}");
    assert!(start["plugin_bytes"].is_u64(), "{start}");
    assert_eq!(start["target"], "interlock_agent");
    let entry = lines
        .iter()
        .find(|l| l["message"] == "plugin entry")
        .unwrap_or_else(|| panic!("no plugin entry line in:\n{text}"));
    assert_eq!(entry["entry"]["type"], "interlock-cni", "{entry}");
    // Keys in the order tracing-subscriber's flattened JSON writes them.
    let keys: Vec<&String> = start.as_object().unwrap().keys().collect();
    assert_eq!(keys.first().map(|k| k.as_str()), Some("timestamp"));
    assert_eq!(keys.last().map(|k| k.as_str()), Some("target"));
    for l in &lines {
        let t = l["timestamp"].as_str().unwrap();
        // 2026-11-23T23:35:22.123Z, as the plugin prints it.
        assert_eq!(t.len(), 24, "{t}");
        assert!(t.ends_with('Z') && t.as_bytes()[19] == b'.', "{t}");
    }
}

#[test]
fn a_bad_log_filter_is_refused_by_name() {
    let d = Dirs::new();
    let out = d
        .interlock("uninstall")
        .env("INTERLOCK_LOG", "interlock_agent=loud")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("INTERLOCK_LOG=\"interlock_agent=loud\" is not a valid log filter"),
        "{err}"
    );
}

//! The guard's pure decisions, exercised without touching the disk.

use interlock_agent::guard::plan::{
    apply_in_memory, check_effective, choose_cni_version, holding_config, is_holding,
    is_owned_name, owned_name_before, plan, plan_uninstall, Action, ConfigMode, Facts, Settings,
};
use interlock_agent::plugin_entry;
use interlock_confdir::{DirEntry, Runtime, Snapshot};
use interlock_contract::layout::HOLDING_NETWORK;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::Path;

const CALICO: &str = r#"{
  "name": "k8s-pod-network",
  "cniVersion": "0.3.1",
  "zzForeign": {"keep": [3, 2, 1]},
  "plugins": [
    {"type": "calico", "ipam": {"type": "calico-ipam", "subnet": "10.99.0.0/16"}, "mtu": 1440},
    {"type": "portmap", "snat": true, "capabilities": {"portMappings": true}}
  ],
  "aFieldAfter": 1
}"#;

fn snap(files: &[(&str, &str)]) -> Snapshot {
    Snapshot::from_files(files, 0o640)
}

fn settings(mode: ConfigMode) -> Settings {
    Settings {
        mode,
        chain_target: None,
        allow_ahead: vec![],
        runtime: Runtime::Containerd,
        entry: plugin_entry(Path::new("/var/run/interlock")),
        max_cni_version: None,
        guard: None,
    }
}

fn all_versions() -> Vec<String> {
    ["0.3.0", "0.3.1", "0.4.0", "1.0.0"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

fn facts() -> Facts {
    let mut f = Facts::default();
    for t in [
        "calico",
        "portmap",
        "bridge",
        "multus",
        "flannel",
        "interlock-cni",
        "aws-cni",
    ] {
        f.present_types.insert(t.to_string());
        f.versions.insert(t.to_string(), all_versions());
    }
    f.versions
        .get_mut("interlock-cni")
        .unwrap()
        .push("1.1.0".into());
    f
}

fn content(s: &Snapshot, name: &str) -> Value {
    serde_json::from_slice(s.get(name).unwrap().content.as_ref().unwrap()).unwrap()
}

/// Plans, applies in memory, and checks that a second plan is a no-op.
fn converge(s: &Snapshot, st: &Settings, f: &Facts) -> (Snapshot, Vec<Action>) {
    let p = plan(s, st, f);
    assert!(p.problem.is_none(), "unexpected problem: {:?}", p.problem);
    let after = apply_in_memory(s, &p.actions);
    let again = plan(&after, st, f);
    assert!(
        again.actions.is_empty(),
        "not idempotent: {:?}",
        again.actions
    );
    assert_eq!(
        check_effective(&after, st, f).as_deref().ok(),
        p.target.as_deref(),
        "the planned target is not what the runtime loads"
    );
    (after, p.actions)
}

#[test]
fn owned_copies_primary_and_appends_entry() {
    let s = snap(&[("10-calico.conflist", CALICO)]);
    let st = settings(ConfigMode::Owned);
    let (after, actions) = converge(&s, &st, &facts());
    assert_eq!(actions.len(), 1);
    let owned = content(&after, "00-interlock.conflist");
    let keys: Vec<_> = owned.as_object().unwrap().keys().cloned().collect();
    assert_eq!(
        keys,
        ["name", "cniVersion", "zzForeign", "plugins", "aFieldAfter"]
    );
    assert_eq!(
        owned["cniVersion"], "1.0.0",
        "highest version all plugins support"
    );
    assert_eq!(owned["zzForeign"], json!({"keep": [3, 2, 1]}));
    let types: Vec<_> = owned["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["calico", "portmap", "interlock-cni"]);
    assert_eq!(owned["plugins"][0]["ipam"]["subnet"], "10.99.0.0/16");
    assert_eq!(after.get("00-interlock.conflist").unwrap().mode, 0o640);
    assert_eq!(
        after.get("10-calico.conflist").unwrap().content.as_deref(),
        Some(CALICO.as_bytes())
    );
}

#[test]
fn owned_follows_primary_parameters() {
    let st = settings(ConfigMode::Owned);
    let (after, _) = converge(&snap(&[("10-calico.conflist", CALICO)]), &st, &facts());
    let mut s2 = after.clone();
    let changed = CALICO.replace("10.99.0.0/16", "10.99.128.0/17");
    s2.entries.retain(|e| e.name != "10-calico.conflist");
    s2.entries.push(DirEntry::file(
        "10-calico.conflist",
        &changed.into_bytes(),
        0o640,
    ));
    let (after2, actions) = converge(&s2, &st, &facts());
    assert_eq!(actions.len(), 1);
    assert_eq!(
        content(&after2, "00-interlock.conflist")["plugins"][0]["ipam"]["subnet"],
        "10.99.128.0/17"
    );
}

#[test]
fn owned_rederives_from_new_first_config_and_stays_first() {
    let st = settings(ConfigMode::Owned);
    let (after, _) = converge(&snap(&[("10-calico.conflist", CALICO)]), &st, &facts());
    // 00-new sorts after 00-interlock but before calico: it is the new primary.
    let mut s = after.clone();
    s.entries.push(DirEntry::file(
        "00-new.conflist",
        br#"{"cniVersion":"0.4.0","name":"new","plugins":[{"type":"bridge","bridge":"ilnew"}]}"#,
        0o644,
    ));
    let (after2, _) = converge(&s, &st, &facts());
    let owned = content(&after2, "00-interlock.conflist");
    assert_eq!(owned["name"], "new");
    assert_eq!(owned["plugins"][0]["bridge"], "ilnew");
    // 00-aaa sorts ahead of 00-interlock: we take a new name and drop the old one.
    let mut s = after2.clone();
    s.entries.push(DirEntry::file(
        "00-aaa.conflist",
        br#"{"cniVersion":"0.4.0","name":"aaa","plugins":[{"type":"flannel"}]}"#,
        0o644,
    ));
    let (after3, actions) = converge(&s, &st, &facts());
    assert!(actions.contains(&Action::Remove {
        name: "00-interlock.conflist".into()
    }));
    assert!(after3.get("00-interlock.conflist").is_none());
    assert_eq!(content(&after3, "0-interlock.conflist")["name"], "aaa");
    assert_eq!(
        check_effective(&after3, &st, &facts()).unwrap(),
        "0-interlock.conflist"
    );
    // Write first, remove after: there is never a moment without us first.
    let w = actions
        .iter()
        .position(|a| matches!(a, Action::Write { .. }))
        .unwrap();
    let r = actions
        .iter()
        .position(|a| matches!(a, Action::Remove { .. }))
        .unwrap();
    assert!(w < r);
}

#[test]
fn owned_sorts_before_invalid_files_for_containerd() {
    let st = settings(ConfigMode::Owned);
    let s = snap(&[
        ("00-broken.conf", "{ partial"),
        ("10-calico.conflist", CALICO),
    ]);
    let (after, _) = converge(&s, &st, &facts());
    assert_eq!(
        check_effective(&after, &st, &facts()).unwrap(),
        "0-interlock.conflist"
    );
    assert_eq!(
        content(&after, "0-interlock.conflist")["name"],
        "k8s-pod-network"
    );
}

#[test]
fn owned_with_conf_primary_lifts_it() {
    let st = settings(ConfigMode::Owned);
    let conf = r#"{"cniVersion":"0.3.1","name":"br","type":"bridge","bridge":"ilbr0","ipam":{"type":"host-local","subnet":"10.99.1.0/24"}}"#;
    let (after, _) = converge(&snap(&[("10-br.conf", conf)]), &st, &facts());
    let owned = content(&after, "00-interlock.conflist");
    assert_eq!(owned["name"], "br");
    assert_eq!(owned["plugins"][0]["bridge"], "ilbr0");
    assert_eq!(owned["plugins"][1]["type"], "interlock-cni");
    assert_eq!(
        after.get("10-br.conf").unwrap().content.as_deref(),
        Some(conf.as_bytes())
    );
}

#[test]
fn multus_stays_first_and_is_chained_into() {
    let st = settings(ConfigMode::Owned);
    let (after, _) = converge(&snap(&[("10-calico.conflist", CALICO)]), &st, &facts());
    let multus = r#"{"cniVersion":"0.3.1","name":"multus-cni-network","type":"multus","clusterNetwork":"/etc/cni/net.d/10-calico.conflist","kubeconfig":"/etc/cni/net.d/multus.d/multus.kubeconfig"}"#;
    let mut s = after;
    s.entries
        .push(DirEntry::file("00-multus.conf", multus.as_bytes(), 0o600));
    let (after2, _) = converge(&s, &st, &facts());
    assert!(
        after2.get("00-interlock.conflist").is_none(),
        "owned file must not sort ahead of multus"
    );
    assert_eq!(
        check_effective(&after2, &st, &facts()).unwrap(),
        "00-multus.conflist"
    );
    let wrapped = content(&after2, "00-multus.conflist");
    assert_eq!(
        wrapped["plugins"][0]["clusterNetwork"],
        "/etc/cni/net.d/10-calico.conflist"
    );
    assert_eq!(wrapped["plugins"][1]["type"], "interlock-cni");
    assert_eq!(after2.get("00-multus.conflist").unwrap().mode, 0o600);
    // Uninstall puts multus back exactly.
    let restored = apply_in_memory(&after2, &plan_uninstall(&after2));
    assert_eq!(
        restored.get("00-multus.conf").unwrap().content.as_deref(),
        Some(multus.as_bytes())
    );
    assert!(restored.get("00-multus.conflist").is_none());
    assert!(restored.get("00-multus.conf.interlock-orig").is_none());
}

#[test]
fn multus_with_inline_delegate_gets_entry_in_delegate() {
    let st = settings(ConfigMode::Owned);
    let multus = json!({"cniVersion":"0.3.1","name":"multus","type":"multus","delegates":[
        {"cniVersion":"0.3.1","name":"k8s-pod-network","plugins":[{"type":"calico"},{"type":"portmap"}]}]});
    let s = snap(&[
        ("00-multus.conf", &multus.to_string()),
        ("10-calico.conflist", CALICO),
    ]);
    let (after, _) = converge(&s, &st, &facts());
    assert_eq!(
        check_effective(&after, &st, &facts()).unwrap(),
        "00-multus.conf"
    );
    let m = content(&after, "00-multus.conf");
    assert_eq!(m["delegates"][0]["plugins"][2]["type"], "interlock-cni");
    let restored = apply_in_memory(&after, &plan_uninstall(&after));
    assert_eq!(content(&restored, "00-multus.conf"), multus);
}

#[test]
fn allow_ahead_is_chained_into() {
    let mut st = settings(ConfigMode::Owned);
    st.allow_ahead = vec!["05-special.conflist".into()];
    let special = r#"{"cniVersion":"0.4.0","name":"special","plugins":[{"type":"bridge"}]}"#;
    let (after, _) = converge(
        &snap(&[
            ("05-special.conflist", special),
            ("10-calico.conflist", CALICO),
        ]),
        &st,
        &facts(),
    );
    assert!(after.get("00-interlock.conflist").is_none());
    assert_eq!(
        content(&after, "05-special.conflist")["plugins"][1]["type"],
        "interlock-cni"
    );
}

#[test]
fn unbeatable_name_is_a_problem_not_a_guess() {
    let st = settings(ConfigMode::Owned);
    let first = "\u{1}first.conflist";
    let p = plan(&snap(&[(first, CALICO)]), &st, &facts());
    assert!(p.actions.is_empty());
    assert!(p.problem.unwrap().contains("first.conflist"));
    assert!(check_effective(&snap(&[(first, CALICO)]), &st, &facts()).is_err());
    // A primary named below `-` is overtaken (redteam-3 L-4).
    let p = plan(&snap(&[("!first.conflist", CALICO)]), &st, &facts());
    assert!(p.problem.is_none(), "{:?}", p.problem);
}

#[test]
fn owned_without_primary_holds_pods_back_but_keeps_the_copy_while_primary_is_invalid() {
    let st = settings(ConfigMode::Owned);
    let (after, _) = converge(&snap(&[("10-calico.conflist", CALICO)]), &st, &facts());
    let mut half = after.clone();
    half.entries
        .iter_mut()
        .find(|e| e.name == "10-calico.conflist")
        .unwrap()
        .content = Some(b"{\"name\":".to_vec());
    let p = plan(&half, &st, &facts());
    assert!(
        p.actions.is_empty(),
        "keep our copy while the primary is mid-rewrite"
    );
    assert!(p.problem.is_some());
    // The primary removed its file: our copy is replaced, in one write at the same name,
    // by the holding config (never removed first: the runtime would keep loading the
    // copy, or load the next file without our entry).
    let mut gone = after;
    gone.entries.retain(|e| e.name != "10-calico.conflist");
    let p = plan(&gone, &st, &facts());
    assert_eq!(p.actions.len(), 1, "{:?}", p.actions);
    assert!(
        matches!(&p.actions[0], Action::Write { name, bytes, .. }
            if name == "00-interlock.conflist" && bytes == &holding_config(&st)),
        "{:?}",
        p.actions
    );
    assert!(p.problem.unwrap().contains("waiting for it"));
}

/// The holding config is interlock-cni alone, under the holding network's name.
fn assert_holding(s: &Snapshot, name: &str) {
    let v = content(s, name);
    assert_eq!(v["name"], HOLDING_NETWORK, "{v}");
    assert_eq!(v["cniVersion"], "1.0.0", "{v}");
    let plugins = v["plugins"].as_array().unwrap();
    assert_eq!(plugins.len(), 1, "{v}");
    assert_eq!(plugins[0]["type"], "interlock-cni", "{v}");
}

#[test]
fn an_empty_conf_dir_gets_the_holding_config_in_both_modes() {
    for mode in [ConfigMode::Owned, ConfigMode::Chain] {
        let st = settings(mode);
        let empty = snap(&[]);
        let p = plan(&empty, &st, &facts());
        assert!(p.target.is_none(), "{mode:?}: not ready without a primary");
        assert!(
            p.problem.as_deref().unwrap().contains("held back"),
            "{mode:?}"
        );
        let after = apply_in_memory(&empty, &p.actions);
        assert_holding(&after, "00-interlock.conflist");
        assert!(
            plan(&after, &st, &facts()).actions.is_empty(),
            "{mode:?}: not idempotent"
        );
        // What the runtime loads is the holding config: every ADD is refused.
        let view = after.candidates();
        assert!(is_holding(&view[0]), "{mode:?}");
    }
}

/// The primary's first write: the runtime must go from the holding config straight to a
/// config with our entry, never through one without it.
#[test]
fn the_primarys_first_write_replaces_the_holding_config_without_a_gap() {
    let held = apply_in_memory(
        &snap(&[]),
        &plan(&snap(&[]), &settings(ConfigMode::Owned), &facts()).actions,
    );
    let mut arrived = held.clone();
    arrived
        .entries
        .extend(snap(&[("10-calico.conflist", CALICO)]).entries);
    arrived.entries.sort_by(|a, b| a.name.cmp(&b.name));

    // Owned: one write over the holding config, at its name.
    let st = settings(ConfigMode::Owned);
    let p = plan(&arrived, &st, &facts());
    assert_eq!(p.target.as_deref(), Some("00-interlock.conflist"));
    assert_eq!(p.actions.len(), 1, "{:?}", p.actions);
    assert!(matches!(&p.actions[0], Action::Write { name, .. } if name == "00-interlock.conflist"));

    // Chain: our entry goes into the primary's file first, the holding config goes after.
    let st = settings(ConfigMode::Chain);
    let p = plan(&arrived, &st, &facts());
    assert_eq!(p.target.as_deref(), Some("10-calico.conflist"));
    let names: Vec<String> = p
        .actions
        .iter()
        .map(|a| match a {
            Action::Write { name, .. } => format!("write {name}"),
            Action::Remove { name } => format!("remove {name}"),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(
        names,
        vec!["write 10-calico.conflist", "remove 00-interlock.conflist"]
    );
    let after = apply_in_memory(&arrived, &p.actions);
    assert_eq!(
        check_effective(&after, &st, &facts()).as_deref().ok(),
        Some("10-calico.conflist")
    );
}

/// Chain mode with nothing it can chain into keeps the holding config.
#[test]
fn chain_mode_keeps_the_holding_config_while_its_target_is_unusable() {
    let st = settings(ConfigMode::Chain);
    let held = apply_in_memory(&snap(&[]), &plan(&snap(&[]), &st, &facts()).actions);
    let mut broken = held.clone();
    broken
        .entries
        .extend(snap(&[("10-calico.conflist", "{ broken")]).entries);
    broken.entries.sort_by(|a, b| a.name.cmp(&b.name));
    let p = plan(&broken, &st, &facts());
    assert!(p.target.is_none());
    assert!(
        !p.actions
            .iter()
            .any(|a| matches!(a, Action::Remove { name } if name == "00-interlock.conflist")),
        "{:?}",
        p.actions
    );
}

#[test]
fn crio_skips_lists_with_missing_binaries() {
    let mut st = settings(ConfigMode::Owned);
    st.runtime = Runtime::Crio;
    let nobin = r#"{"cniVersion":"0.4.0","name":"x","plugins":[{"type":"not-installed"}]}"#;
    let (after, _) = converge(
        &snap(&[("05-x.conflist", nobin), ("10-calico.conflist", CALICO)]),
        &st,
        &facts(),
    );
    assert_eq!(
        content(&after, "00-interlock.conflist")["name"],
        "k8s-pod-network"
    );
}

#[test]
fn chain_inserts_last_dedups_and_keeps_fields() {
    let st = settings(ConfigMode::Chain);
    let mut v: Value = serde_json::from_str(CALICO).unwrap();
    let ours = Value::Object(plugin_entry(Path::new("/elsewhere")));
    v["plugins"].as_array_mut().unwrap().insert(1, ours.clone());
    v["plugins"].as_array_mut().unwrap().insert(0, ours);
    let s = snap(&[
        ("10-calico.conflist", &v.to_string()),
        ("20-other.conflist", CALICO),
    ]);
    let (after, actions) = converge(&s, &st, &facts());
    assert_eq!(actions.len(), 1);
    let c = content(&after, "10-calico.conflist");
    let types: Vec<_> = c["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["calico", "portmap", "interlock-cni"]);
    assert_eq!(c["plugins"][2]["stateDir"], "/var/run/interlock");
    assert_eq!(
        c["cniVersion"], "0.3.1",
        "chain mode keeps the foreign version"
    );
    let keys: Vec<_> = c.as_object().unwrap().keys().cloned().collect();
    assert_eq!(
        keys,
        ["name", "cniVersion", "zzForeign", "plugins", "aFieldAfter"]
    );
    assert_eq!(after.get("10-calico.conflist").unwrap().mode, 0o640);
    assert_eq!(
        after.get("20-other.conflist").unwrap().content.as_deref(),
        Some(CALICO.as_bytes())
    );
    // Uninstall strips our entry and nothing else.
    let un = apply_in_memory(&after, &plan_uninstall(&after));
    let orig: Value = serde_json::from_str(CALICO).unwrap();
    assert_eq!(content(&un, "10-calico.conflist"), orig);
}

#[test]
fn chain_wraps_conf_and_uninstall_restores_bytes() {
    let st = settings(ConfigMode::Chain);
    let conf = "{\n  \"cniVersion\": \"0.3.1\",  \"name\": \"aws-cni\", \"type\": \"aws-cni\",\n \"vethPrefix\": \"eni\" }\n";
    let s = snap(&[("10-aws.conf", conf), ("README", "x")]);
    let (after, actions) = converge(&s, &st, &facts());
    assert!(matches!(&actions[0], Action::Write { name, .. } if name == "10-aws.conflist"));
    assert_eq!(
        actions[1],
        Action::Rename {
            from: "10-aws.conf".into(),
            to: "10-aws.conf.interlock-orig".into()
        }
    );
    let w = content(&after, "10-aws.conflist");
    assert_eq!(w["name"], "aws-cni");
    assert_eq!(w["plugins"][0]["vethPrefix"], "eni");
    assert_eq!(w["plugins"][1]["type"], "interlock-cni");
    // The primary writes its .conf again: wrapped again, the backup is the newest original.
    let mut again = after.clone();
    let conf2 = conf.replace("eni", "xyz");
    again.entries.push(DirEntry::file(
        "10-aws.conf",
        &conf2.clone().into_bytes(),
        0o600,
    ));
    let (after2, _) = converge(&again, &st, &facts());
    assert_eq!(
        content(&after2, "10-aws.conflist")["plugins"][0]["vethPrefix"],
        "xyz"
    );
    let un = apply_in_memory(&after2, &plan_uninstall(&after2));
    let e = un.get("10-aws.conf").unwrap();
    assert_eq!(e.content.as_deref(), Some(conf2.as_bytes()));
    assert_eq!(e.mode, 0o600);
    let mut names: Vec<_> = un.entries.iter().map(|e| e.name.clone()).collect();
    names.sort();
    assert_eq!(names, ["10-aws.conf", "README"]);
}

#[test]
fn chain_target_explicit_and_missing() {
    let mut st = settings(ConfigMode::Chain);
    st.chain_target = Some("20-other.conflist".into());
    let s = snap(&[
        ("10-calico.conflist", CALICO),
        ("20-other.conflist", CALICO),
    ]);
    let p = plan(&s, &st, &facts());
    assert_eq!(p.target.as_deref(), Some("20-other.conflist"));
    assert!(p.actions.iter().all(|a| a.file() == "20-other.conflist"));
    st.chain_target = Some("99-none.conflist".into());
    assert!(plan(&s, &st, &facts())
        .problem
        .unwrap()
        .contains("99-none.conflist"));
    // A wrapped target keeps being found under its .conflist name.
    st.chain_target = Some("10-aws.conf".into());
    let conf = r#"{"cniVersion":"0.3.1","name":"aws","type":"aws-cni"}"#;
    let (after, _) = converge(&snap(&[("10-aws.conf", conf)]), &st, &facts());
    assert!(plan(&after, &st, &facts()).actions.is_empty());
}

#[test]
fn chain_refuses_to_clobber_a_foreign_conflist_of_the_same_stem() {
    let st = settings(ConfigMode::Chain);
    let conf = r#"{"cniVersion":"0.3.1","name":"aws","type":"aws-cni"}"#;
    let p = plan(
        &snap(&[("10-aws.conf", conf), ("10-aws.conflist", CALICO)]),
        &st,
        &facts(),
    );
    assert!(p.actions.is_empty());
    assert!(p.problem.unwrap().contains("10-aws.conflist"));
}

#[test]
fn mode_switch_cleans_up_owned_files() {
    let (after, _) = converge(
        &snap(&[("10-calico.conflist", CALICO)]),
        &settings(ConfigMode::Owned),
        &facts(),
    );
    let (after2, _) = converge(&after, &settings(ConfigMode::Chain), &facts());
    assert!(after2.get("00-interlock.conflist").is_none());
    assert_eq!(
        check_effective(&after2, &settings(ConfigMode::Chain), &facts()).unwrap(),
        "10-calico.conflist"
    );
}

#[test]
fn uninstall_owned_touches_nothing_foreign() {
    let (after, _) = converge(
        &snap(&[("10-calico.conflist", CALICO), ("notes.txt", "x")]),
        &settings(ConfigMode::Owned),
        &facts(),
    );
    let un = plan_uninstall(&after);
    assert_eq!(
        un,
        vec![Action::Remove {
            name: "00-interlock.conflist".into()
        }]
    );
}

#[test]
fn check_effective_requires_our_exact_entry() {
    let st = settings(ConfigMode::Chain);
    let mut v: Value = serde_json::from_str(CALICO).unwrap();
    v["plugins"]
        .as_array_mut()
        .unwrap()
        .push(Value::Object(plugin_entry(Path::new("/other"))));
    let s = snap(&[("10-calico.conflist", &v.to_string())]);
    assert!(check_effective(&s, &st, &facts())
        .unwrap_err()
        .contains("differs"));
    let s = snap(&[("10-calico.conflist", CALICO)]);
    assert!(check_effective(&s, &st, &facts())
        .unwrap_err()
        .contains("does not contain"));
    assert!(check_effective(&snap(&[]), &st, &facts()).is_err());
}

#[test]
fn cni_version_choice() {
    let mut v: HashMap<String, Vec<String>> = HashMap::new();
    let types = |ts: &[&str]| ts.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let vs = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    v.insert("a".into(), vs(&["0.3.1", "0.4.0", "1.0.0", "1.1.0"]));
    v.insert(
        "b".into(),
        vs(&["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]),
    );
    v.insert("old".into(), vs(&["0.1.0", "0.2.0", "0.3.0", "0.3.1"]));
    assert_eq!(
        choose_cni_version("0.3.1", &types(&["a", "b"]), &v, None),
        "1.1.0"
    );
    assert_eq!(
        choose_cni_version("0.3.1", &types(&["a", "b"]), &v, Some("1.0.0")),
        "1.0.0"
    );
    assert_eq!(
        choose_cni_version("1.0.0", &types(&["a", "old"]), &v, None),
        "0.3.1"
    );
    assert_eq!(
        choose_cni_version("0.4.0", &types(&["a", "silent"]), &v, None),
        "0.4.0"
    );
    v.insert("none".into(), vs(&["9.9.9"]));
    assert_eq!(
        choose_cni_version("0.4.0", &types(&["a", "none"]), &v, None),
        "0.4.0"
    );
}

#[test]
fn owned_names() {
    assert!(is_owned_name("00-interlock.conflist"));
    assert!(is_owned_name("0-interlock.conflist"));
    assert!(is_owned_name("--interlock.conflist"));
    assert!(!is_owned_name("10-calico.conflist"));
    assert!(!is_owned_name("00-interlock.conf"));
    assert!(!is_owned_name("a-interlock.conflist"));
    assert!(!is_owned_name("10-calico-interlock.conflist"));
    assert!(is_owned_name("!-interlock.conflist"));
    assert_eq!(
        owned_name_before("10-calico.conflist").unwrap(),
        "00-interlock.conflist"
    );
    assert_eq!(
        owned_name_before("00-aaa.conflist").unwrap(),
        "0-interlock.conflist"
    );
    assert_eq!(
        owned_name_before("0-a.conf").unwrap(),
        "-interlock.conflist"
    );
    assert_eq!(
        owned_name_before("-a.conf").unwrap(),
        "--interlock.conflist"
    );
    assert_eq!(
        owned_name_before("!x.conf").unwrap(),
        "!-interlock.conflist"
    );
    for first in [
        "00-multus.conf",
        "05-cilium.conflist",
        "A.conf",
        "z.json",
        "000.conf",
        "0.conf",
        "00.conf",
    ] {
        let n = owned_name_before(first).unwrap();
        assert!(n.as_str() < first, "{n} !< {first}");
        assert!(is_owned_name(&n));
    }
}

/// Many random directories: after converging, the runtime loads a config with our entry
/// built from the first valid foreign file, and no foreign file changed.
#[test]
fn random_directories_converge_without_touching_foreign_files() {
    let names = [
        "00-a.conflist",
        "00-z.conf",
        "05-x.json",
        "0.conf",
        "10-calico.conflist",
        "99-last.conflist",
        "-dash.conflist",
        "A.conf",
        "a.conf",
        "00-interlock.conflist",
        "0-interlock.conflist",
    ];
    let bodies = [
        CALICO.to_string(),
        r#"{"cniVersion":"0.4.0","name":"b","type":"bridge"}"#.to_string(),
        "{ broken".to_string(),
        r#"{"cniVersion":"0.4.0","name":"f","plugins":[{"type":"flannel"}]}"#.to_string(),
    ];
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for mode in [ConfigMode::Owned, ConfigMode::Chain] {
        for runtime in [Runtime::Containerd, Runtime::Crio] {
            let mut st = settings(mode);
            st.runtime = runtime;
            for _ in 0..300 {
                let mut files = vec![];
                for n in names {
                    if next() % 3 == 0 {
                        files.push((n, bodies[(next() % bodies.len() as u64) as usize].as_str()));
                    }
                }
                let s = snap(&files);
                let p = plan(&s, &st, &facts());
                let after = apply_in_memory(&s, &p.actions);
                let again = plan(&after, &st, &facts());
                assert!(
                    again.actions.is_empty(),
                    "{files:?}: not idempotent: {:?}",
                    again.actions
                );
                if p.problem.is_none() && p.target.is_some() {
                    assert_eq!(
                        check_effective(&after, &st, &facts()).ok(),
                        p.target.clone(),
                        "{files:?} {mode:?} {runtime:?}"
                    );
                }
                if mode == ConfigMode::Owned {
                    for (n, body) in &files {
                        if !is_owned_name(n) && !n.contains("multus") {
                            assert_eq!(
                                after.get(n).and_then(|e| e.content.as_deref()),
                                Some(body.as_bytes()),
                                "{n} changed in owned mode"
                            );
                        }
                    }
                }
                // Uninstall leaves no entry of ours and no owned file of ours; a file
                // only named like ours (issue 7, L4) is someone else's and stays as it was.
                let un = apply_in_memory(&after, &plan_uninstall(&after));
                for e in &un.entries {
                    if is_owned_name(&e.name) {
                        let was = files
                            .iter()
                            .find(|(n, _)| *n == e.name)
                            .map(|(_, b)| b.as_bytes());
                        assert_eq!(
                            e.content.as_deref(),
                            was,
                            "{} is not interlock's: kept as it was",
                            e.name
                        );
                    }
                    assert!(!e.name.ends_with(".interlock-orig"));
                    if let Some(c) = &e.content {
                        assert!(
                            !String::from_utf8_lossy(c).contains("interlock-cni"),
                            "{} still has our entry",
                            e.name
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn our_entry_is_a_valid_plugin_config() {
    let e = plugin_entry(Path::new("/var/run/interlock"));
    let c: interlock_contract::PluginConfig = serde_json::from_value(Value::Object(e)).unwrap();
    assert_eq!(c.plugin_type, "interlock-cni");
    assert_eq!(c.state_dir, Path::new("/var/run/interlock"));
    assert_eq!(
        c.capabilities.get("io.kubernetes.cri.pod-annotations"),
        Some(&true)
    );
}

/// An agent killed between writing `<stem>.conflist` and moving the `.conf` away leaves
/// the wrap half done: the next plan recognises the `.conflist` as ours and finishes it.
#[test]
fn chain_finishes_a_wrap_interrupted_before_the_rename() {
    let st = settings(ConfigMode::Chain);
    let conf = r#"{"cniVersion":"0.3.1","name":"aws-cni","type":"aws-cni","vethPrefix":"eni"}"#;
    let full = plan(&snap(&[("10-aws.conf", conf)]), &st, &facts());
    let Action::Write { bytes, .. } = &full.actions[0] else {
        panic!("first step writes the conflist: {:?}", full.actions)
    };
    // The crash: the conflist is written, the .conf is still there, no backup.
    let crashed = snap(&[
        ("10-aws.conf", conf),
        ("10-aws.conflist", std::str::from_utf8(bytes).unwrap()),
    ]);
    let p = plan(&crashed, &st, &facts());
    assert!(p.problem.is_none(), "refused: {:?}", p.problem);
    assert_eq!(
        p.actions,
        vec![Action::Rename {
            from: "10-aws.conf".into(),
            to: "10-aws.conf.interlock-orig".into()
        }],
        "only the rename is left to do"
    );
    let (after, _) = converge(&crashed, &st, &facts());
    assert_eq!(
        check_effective(&after, &st, &facts()).unwrap(),
        "10-aws.conflist"
    );
    // Uninstall still restores the .conf byte for byte.
    let un = apply_in_memory(&after, &plan_uninstall(&after));
    assert_eq!(
        un.get("10-aws.conf").unwrap().content.as_deref(),
        Some(conf.as_bytes())
    );
    assert!(un.get("10-aws.conflist").is_none());
    // Our wrap of an older version of the .conf (stale entry dir too) is still ours.
    let stale = std::str::from_utf8(bytes)
        .unwrap()
        .replace("/var/run/interlock", "/old/state");
    let p = plan(
        &snap(&[("10-aws.conf", conf), ("10-aws.conflist", &stale)]),
        &st,
        &facts(),
    );
    assert!(p.problem.is_none(), "{:?}", p.problem);
    assert_eq!(p.actions.len(), 2, "rewrite with our entry, then rename");
    // A conflist whose foreign part differs is not ours: still refused.
    let other = std::str::from_utf8(bytes).unwrap().replace("eni", "xyz");
    let p = plan(
        &snap(&[("10-aws.conf", conf), ("10-aws.conflist", &other)]),
        &st,
        &facts(),
    );
    assert!(p.actions.is_empty());
    assert!(p.problem.unwrap().contains("not ours"));
}

/// After a wrap, the primary replaces `<stem>.conflist` with its own. Uninstall must not
/// delete it: it strips only our entry and keeps the backup, saying so.
#[test]
fn uninstall_keeps_a_conflist_the_primary_rewrote_after_the_wrap() {
    let st = settings(ConfigMode::Chain);
    let conf = r#"{"cniVersion":"0.3.1","name":"aws-cni","type":"aws-cni","vethPrefix":"eni"}"#;
    let (after, _) = converge(&snap(&[("10-aws.conf", conf)]), &st, &facts());
    // The primary writes its own 10-aws.conflist (new parameters, no interlock).
    let mut theirs: Value = serde_json::from_str(CALICO).unwrap();
    theirs["name"] = json!("aws-cni");
    let mut s = after.clone();
    s.entries.retain(|e| e.name != "10-aws.conflist");
    s.entries.push(DirEntry::file(
        "10-aws.conflist",
        &theirs.to_string().into_bytes(),
        0o644,
    ));
    // The agent chains into it again (it is the effective conflist now).
    let (s, _) = converge(&s, &st, &facts());
    assert!(s.get("10-aws.conf.interlock-orig").is_some());
    let up = interlock_agent::guard::plan::plan_uninstall_explained(&s);
    let un = apply_in_memory(&s, &up.actions);
    assert_eq!(
        content(&un, "10-aws.conflist"),
        theirs,
        "the primary's conflist survives uninstall minus our entry"
    );
    assert_eq!(
        un.get("10-aws.conf.interlock-orig")
            .and_then(|e| e.content.as_deref()),
        Some(conf.as_bytes()),
        "the backup is kept, not deleted"
    );
    assert!(
        un.get("10-aws.conf").is_none(),
        "the old .conf is not put back in front of the primary's new conflist"
    );
    assert_eq!(up.notes.len(), 1, "{:?}", up.notes);
    assert!(up.notes[0].contains("10-aws.conf.interlock-orig"));
    // Our own wrap is still removed and the .conf restored.
    let un2 = apply_in_memory(&after, &plan_uninstall(&after));
    assert!(un2.get("10-aws.conflist").is_none());
    assert_eq!(
        un2.get("10-aws.conf").unwrap().content.as_deref(),
        Some(conf.as_bytes())
    );
}

/// interlock-cni accepts 0.3.0..1.1.0. Chain mode raises an older target when every
/// plugin supports a version it accepts, and otherwise reports the file and version.
#[test]
fn chain_raises_unsupported_cni_version_or_reports_it() {
    let st = settings(ConfigMode::Chain);
    for (conf, was) in [
        (r#"{"name":"aws-cni","type":"aws-cni"}"#, "none"),
        (
            r#"{"cniVersion":"0.2.0","name":"aws-cni","type":"aws-cni"}"#,
            "0.2.0",
        ),
    ] {
        let (after, _) = converge(&snap(&[("10-aws.conf", conf)]), &st, &facts());
        let w = content(&after, "10-aws.conflist");
        assert_eq!(w["cniVersion"], "1.0.0", "raised from {was}");
        // The backup stays byte for byte.
        assert_eq!(
            after
                .get("10-aws.conf.interlock-orig")
                .unwrap()
                .content
                .as_deref(),
            Some(conf.as_bytes())
        );
        // A plugin that supports nothing interlock-cni accepts: a problem naming the file
        // and the version, nothing written.
        let mut f = facts();
        f.versions
            .insert("aws-cni".into(), vec!["0.1.0".into(), "0.2.0".into()]);
        let p = plan(&snap(&[("10-aws.conf", conf)]), &st, &f);
        assert!(p.actions.is_empty(), "{:?}", p.actions);
        assert!(p.blocks_ready);
        let msg = p.problem.unwrap();
        assert!(msg.contains("10-aws.conf") && msg.contains(was), "{msg}");
    }
    // A conflist at 0.2.0 is raised in place.
    let old = CALICO.replace("0.3.1", "0.2.0");
    let (after, _) = converge(&snap(&[("10-calico.conflist", &old)]), &st, &facts());
    assert_eq!(content(&after, "10-calico.conflist")["cniVersion"], "1.0.0");
    // A plugin that did not answer VERSION: cannot raise, reported.
    let mut f = facts();
    f.versions.remove("calico");
    let p = plan(&snap(&[("10-calico.conflist", &old)]), &st, &f);
    let msg = p.problem.unwrap();
    assert!(
        msg.contains("10-calico.conflist") && msg.contains("0.2.0") && msg.contains("calico"),
        "{msg}"
    );
    // A file wrapped earlier at 0.2.0 (by an older agent) is not what interlock-cni runs.
    let mut v: Value = serde_json::from_str(&old).unwrap();
    v["plugins"]
        .as_array_mut()
        .unwrap()
        .push(Value::Object(plugin_entry(Path::new("/var/run/interlock"))));
    let s = snap(&[("10-calico.conflist", &v.to_string())]);
    assert!(check_effective(&s, &st, &f).unwrap_err().contains("0.2.0"));
}

/// Owned mode gives the same guarantee: never a copy interlock-cni would refuse.
#[test]
fn owned_never_writes_a_cni_version_interlock_refuses() {
    let st = settings(ConfigMode::Owned);
    let old = CALICO.replace("0.3.1", "0.2.0");
    let (after, _) = converge(&snap(&[("10-calico.conflist", &old)]), &st, &facts());
    assert_eq!(
        content(&after, "00-interlock.conflist")["cniVersion"],
        "1.0.0"
    );
    let mut f = facts();
    f.versions.remove("calico");
    let p = plan(&snap(&[("10-calico.conflist", &old)]), &st, &f);
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert!(p.blocks_ready);
    let msg = p.problem.unwrap();
    assert!(
        msg.contains("10-calico.conflist") && msg.contains("0.2.0"),
        "{msg}"
    );
}

/// Issue 7 item 6: whatever the primary's mode, what interlock writes is not writable
/// by group or others.
#[test]
fn written_files_are_never_group_or_world_writable() {
    let s = Snapshot::from_files(&[("10-calico.conflist", CALICO)], 0o666);
    let p = plan(&s, &settings(ConfigMode::Owned), &facts());
    let modes: Vec<u32> = p
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::Write { mode, .. } => Some(*mode),
            _ => None,
        })
        .collect();
    assert_eq!(modes, [0o644]);
    let p = plan(&s, &settings(ConfigMode::Chain), &facts());
    assert!(p
        .actions
        .iter()
        .all(|a| !matches!(a, Action::Write { mode, .. } if mode & 0o022 != 0)));
    // A tighter primary stays as tight.
    let s = Snapshot::from_files(&[("10-calico.conflist", CALICO)], 0o600);
    let p = plan(&s, &settings(ConfigMode::Owned), &facts());
    assert!(matches!(&p.actions[0], Action::Write { mode: 0o600, .. }));
}

/// Issue 7 item 9 (L5, L6): chain mode never replaces a symlinked primary with a copy
/// and never writes a lossy twin of a primary whose name is not UTF-8; it says why.
#[test]
fn chain_mode_refuses_symlinked_and_non_utf8_targets() {
    use std::os::unix::ffi::OsStrExt;
    let mut s = Snapshot::from_files(&[("10-calico.conflist", CALICO)], 0o644);
    s.entries[0].is_symlink = true;
    let p = plan(&s, &settings(ConfigMode::Chain), &facts());
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert!(p.blocks_ready);
    assert!(
        p.problem.as_deref().unwrap().contains("symbolic link"),
        "{:?}",
        p.problem
    );

    let mut s = Snapshot::from_files(&[("10-calico.conflist", CALICO)], 0o644);
    s.entries[0].os_name = std::ffi::OsStr::from_bytes(b"10-\xff.conflist").into();
    s.entries[0].name = s.entries[0].os_name.to_string_lossy().into_owned();
    let p = plan(&s, &settings(ConfigMode::Chain), &facts());
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    let why = p.problem.unwrap();
    assert!(
        why.contains("not valid UTF-8") && why.contains("10-\\xff"),
        "{why}"
    );
    // Owned mode copies it under our own name: nothing is written under its name.
    let p = plan(&s, &settings(ConfigMode::Owned), &facts());
    assert!(p.problem.is_none(), "{:?}", p.problem);
    assert!(p
        .actions
        .iter()
        .all(|a| a.file() == "00-interlock.conflist"));
}

/// Issue 7 item 9 (L4): files only named like interlock's are never deleted, by the
/// guard's plan or by uninstall; the one interlock wrote is.
#[test]
fn only_files_carrying_our_entry_are_removed() {
    let st = settings(ConfigMode::Owned);
    let operator = r#"{"cniVersion":"1.0.0","name":"op","plugins":[{"type":"bridge"}]}"#;
    let s = snap(&[
        ("10-calico.conflist", CALICO),
        ("90-interlock.conflist", operator),
        ("interlock.conflist", operator),
    ]);
    let (after, actions) = converge(&s, &st, &facts());
    assert!(
        actions.iter().all(|a| !matches!(a, Action::Remove { .. })),
        "{actions:?}"
    );
    assert_eq!(
        after
            .get("90-interlock.conflist")
            .unwrap()
            .content
            .as_deref(),
        Some(operator.as_bytes())
    );
    // A stale copy of ours after the primary's name is removed.
    let mut stale = after.clone();
    let ours = after.get("00-interlock.conflist").unwrap().clone();
    let mut moved = ours.clone();
    moved.name = "50-interlock.conflist".into();
    moved.os_name = "50-interlock.conflist".into();
    stale.entries.push(moved);
    let p = plan(&stale, &st, &facts());
    assert_eq!(
        p.actions,
        [Action::Remove {
            name: "50-interlock.conflist".into()
        }]
    );
    let un = apply_in_memory(&after, &plan_uninstall(&after));
    assert!(un.get("00-interlock.conflist").is_none());
    assert!(un.get("90-interlock.conflist").is_some());
    assert!(un.get("interlock.conflist").is_some());
}

/// When the primary rewrote its file while the guard was inserting our entry, the guard
/// asks what it would write for the newer content: the newer content plus our entry, or
/// nothing when it needs nothing (already carries us) or cannot be used (half-written).
#[test]
fn chain_rewrite_follows_the_newer_content_of_the_target() {
    let st = settings(ConfigMode::Chain);
    let f = facts();
    let s = snap(&[
        ("10-calico.conflist", CALICO),
        ("50-other.conflist", CALICO),
    ]);
    let newer = CALICO.replace("10.99.0.0/16", "10.42.0.0/16");
    let bytes = interlock_agent::guard::plan::rewrite_for(
        &s,
        &st,
        &f,
        "10-calico.conflist",
        newer.as_bytes(),
    )
    .expect("a write for the newer content");
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["plugins"][0]["ipam"]["subnet"], "10.42.0.0/16");
    assert_eq!(v["plugins"][2]["type"], "interlock-cni");
    assert_eq!(v["zzForeign"], json!({"keep": [3, 2, 1]}));
    // Same as planning the newer directory from scratch.
    let fresh = plan(
        &snap(&[
            ("10-calico.conflist", &newer),
            ("50-other.conflist", CALICO),
        ]),
        &st,
        &f,
    );
    assert_eq!(
        fresh.actions,
        vec![Action::Write {
            name: "10-calico.conflist".into(),
            bytes: bytes.clone(),
            mode: 0o640
        }]
    );
    // Already ours: nothing to write. Half-written: nothing for this file either.
    assert_eq!(
        interlock_agent::guard::plan::rewrite_for(&s, &st, &f, "10-calico.conflist", &bytes),
        None
    );
    assert_eq!(
        interlock_agent::guard::plan::rewrite_for(
            &s,
            &st,
            &f,
            "10-calico.conflist",
            &newer.as_bytes()[..40]
        ),
        None
    );
}

/// redteam-3 L-4: a primary named below `-` (`!.conflist`, ` .conflist`) is still
/// overtaken: the owned file keeps its leading bytes and puts `-` before its `.`.
#[test]
fn a_primary_named_below_dash_is_still_overtaken() {
    for first in [
        "!.conflist",
        " .conflist",
        "!!.conflist",
        "!-.conf",
        "#a.conflist",
    ] {
        let name = owned_name_before(first).unwrap_or_else(|| panic!("{first:?}: no name"));
        assert!(name.as_bytes() < first.as_bytes(), "{name:?} !< {first:?}");
        assert!(is_owned_name(&name), "{name:?}");
    }
    assert_eq!(
        owned_name_before("!.conflist").unwrap(),
        "!-interlock.conflist"
    );
    assert_eq!(
        owned_name_before("10-calico.conflist").unwrap(),
        "00-interlock.conflist"
    );
    // Control characters cannot start an owned name.
    assert_eq!(owned_name_before("\u{1}.conflist"), None);
}

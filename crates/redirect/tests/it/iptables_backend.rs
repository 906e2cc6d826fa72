//! The iptables backend against real iptables in throwaway network namespaces.

use interlock_redirect::backend::iptables::{restore_text, Flavour, IptablesBackend, Tool};
use interlock_redirect::backend::{Backend, Verification};
use interlock_redirect::netns::in_netns;
use interlock_redirect::spec::Family;
use interlock_redirect::{spec_for, ProfileName, RedirectSpec};
use interlock_testkit::{require_root, Netns};
use std::collections::BTreeMap;

fn istio_spec() -> RedirectSpec {
    let ann: BTreeMap<String, String> = [
        ("sidecar.istio.io/status", "{}"),
        (
            "traffic.sidecar.istio.io/excludeOutboundIPRanges",
            "10.99.250.0/24,fd99:250::/64",
        ),
        ("traffic.sidecar.istio.io/excludeOutboundPorts", "5432"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    spec_for(
        &interlock_redirect::PodView::with_facts(&ann, &interlock_testkit::pods::injected(&ann)),
        &ProfileName::ALL,
    )
    .unwrap()
    .unwrap()
    .1
}

fn save(ns: &Netns, flavour: Flavour, family: Family) -> String {
    ns.exec_ok(&[&flavour.tool(family, Tool::Save), "-t", "nat"])
        .lines()
        .filter(|l| !l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
}

fn lifecycle(flavour: Flavour) {
    let ns = Netns::new("ipt").unwrap();
    let backend = IptablesBackend::new(flavour);
    let spec = istio_spec();
    in_netns(&ns.path(), || {
        assert!(!backend.verify(&spec).unwrap().is_exact());
        backend.apply(&spec).unwrap();
        assert_eq!(backend.verify(&spec).unwrap(), Verification::Exact);
    })
    .unwrap();
    let v4 = save(&ns, flavour, Family::V4);
    let v6 = save(&ns, flavour, Family::V6);
    assert!(v4.contains("-A PREROUTING -p tcp -j IL_INBOUND"), "{v4}");
    assert!(
        v4.contains("-A IL_OUTPUT -d 10.99.250.0/24 -j RETURN"),
        "{v4}"
    );
    assert!(
        v6.contains("-A IL_OUTPUT -d fd99:250::/64 -j RETURN"),
        "{v6}"
    );
    assert!(!v6.contains("10.99.250.0"), "{v6}");

    // Applying again changes nothing.
    in_netns(&ns.path(), || backend.apply(&spec).unwrap()).unwrap();
    assert_eq!(save(&ns, flavour, Family::V4), v4);
    assert_eq!(save(&ns, flavour, Family::V6), v6);

    // A deleted rule is detected, and apply repairs it.
    let ipt = flavour.tool(Family::V4, Tool::Iptables);
    ns.exec_ok(&[
        &ipt,
        "-t",
        "nat",
        "-D",
        "IL_OUTPUT",
        "-m",
        "owner",
        "--uid-owner",
        "1337",
        "-j",
        "RETURN",
    ]);
    let v = in_netns(&ns.path(), || backend.verify(&spec).unwrap()).unwrap();
    assert_eq!(
        v,
        Verification::Mismatch(vec![
            "IPv4: missing rule -A IL_OUTPUT -m owner --uid-owner 1337 -j RETURN".into()
        ])
    );
    // A foreign rule ahead of our jump, and a duplicate jump, are detected and fixed too.
    ns.exec_ok(&[
        &ipt,
        "-t",
        "nat",
        "-I",
        "OUTPUT",
        "1",
        "-d",
        "10.99.251.1",
        "-j",
        "ACCEPT",
    ]);
    ns.exec_ok(&[
        &ipt,
        "-t",
        "nat",
        "-A",
        "PREROUTING",
        "-p",
        "tcp",
        "-j",
        "IL_INBOUND",
    ]);
    let v = in_netns(&ns.path(), || backend.verify(&spec).unwrap()).unwrap();
    let Verification::Mismatch(d) = v else {
        panic!("expected mismatch")
    };
    assert_eq!(d.len(), 3, "{d:?}");
    in_netns(&ns.path(), || {
        backend.apply(&spec).unwrap();
        assert_eq!(backend.verify(&spec).unwrap(), Verification::Exact);
    })
    .unwrap();
    let v4_after = save(&ns, flavour, Family::V4);
    assert!(
        v4_after.contains("-A OUTPUT -d 10.99.251.1/32 -j ACCEPT"),
        "foreign rule kept: {v4_after}"
    );

    // A changed spec replaces the rules atomically.
    let mut other = spec.clone();
    other.outbound.proxy_port = 15002;
    in_netns(&ns.path(), || {
        assert!(!backend.verify(&other).unwrap().is_exact());
        backend.apply(&other).unwrap();
        assert_eq!(backend.verify(&other).unwrap(), Verification::Exact);
        // Turning IPv6 off removes the IPv6 rules.
        other.ipv6 = false;
        backend.apply(&other).unwrap();
        assert_eq!(backend.verify(&other).unwrap(), Verification::Exact);
    })
    .unwrap();
    assert!(!save(&ns, flavour, Family::V6).contains("IL_"));

    // Remove leaves nothing of ours, keeps foreign rules, and is idempotent.
    in_netns(&ns.path(), || {
        backend.remove().unwrap();
        backend.remove().unwrap();
    })
    .unwrap();
    let v4 = save(&ns, flavour, Family::V4);
    assert!(!v4.contains("IL_"), "{v4}");
    assert!(v4.contains("-A OUTPUT -d 10.99.251.1/32 -j ACCEPT"), "{v4}");
}

#[test]
fn nft_flavour_lifecycle() {
    require_root!();
    lifecycle(Flavour::Nft);
}

#[test]
fn legacy_flavour_lifecycle() {
    require_root!();
    lifecycle(Flavour::Legacy);
}

#[test]
fn baseline_restore_text_loads_in_a_fresh_netns() {
    require_root!();
    let ns = Netns::new("iptrs").unwrap();
    let spec = istio_spec();
    let backend = IptablesBackend::new(Flavour::Nft);
    for family in [Family::V4, Family::V6] {
        let text = restore_text(&spec, family);
        let tool = Flavour::Nft.tool(family, Tool::Restore);
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", ns.name(), &tool, "--noflush"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write;
                c.stdin.take().unwrap().write_all(text.as_bytes())?;
                c.wait_with_output()
            })
            .unwrap();
        assert!(out.status.success());
    }
    let v = in_netns(&ns.path(), || backend.verify(&spec).unwrap()).unwrap();
    assert_eq!(v, Verification::Exact);
}

/// On a host without the iptables tools (an nftables-only node), removal finds none of
/// their rules and succeeds, so a DEL without state does not fail forever; applying says
/// which program is missing and where it was looked for.
#[test]
fn missing_tools_count_as_no_rules_on_removal() {
    require_root!();
    use interlock_redirect::backend::{open, BackendKind, ToolLookup};
    let ns = Netns::new("iptno").unwrap();
    let empty = interlock_testkit::tempdir().unwrap();
    let tools = ToolLookup::Dirs(vec![empty.path().to_path_buf()]);
    let spec = istio_spec();
    in_netns(&ns.path(), || {
        for flavour in [Flavour::Nft, Flavour::Legacy] {
            let backend = IptablesBackend::with_tools(flavour, tools.clone());
            backend.remove().unwrap();
            let e = backend.apply(&spec).unwrap_err().to_string();
            // The legacy flavour skips the save when no legacy nat table exists.
            let missing = [Tool::Save, Tool::Restore]
                .map(|t| format!("cannot run {}: not found", flavour.tool(Family::V4, t)));
            assert!(
                missing.iter().any(|m| e.contains(m))
                    && e.contains(&empty.path().display().to_string()),
                "{e}"
            );
        }
        // Rules of the backend that is there, to be removed by remove_all_rules below.
        open(BackendKind::Nftables).unwrap().apply(&spec).unwrap();
    })
    .unwrap();
    assert!(ns
        .exec_ok(&["nft", "list", "ruleset"])
        .contains("interlock"));
    assert_eq!(
        interlock_redirect::remove_all_rules_with(&ns.path(), &tools).unwrap(),
        interlock_redirect::Removal::Removed
    );
    let rules = ns.exec_ok(&["nft", "list", "ruleset"]);
    assert!(!rules.contains("interlock"), "{rules}");
    // Same with the real tools: still nothing left, still success.
    assert_eq!(
        interlock_redirect::remove_all_rules(&ns.path()).unwrap(),
        interlock_redirect::Removal::Removed
    );
}

//! Istio sidecar (REDIRECT) cases: istio-cni's plugin cases and the istio-iptables capture
//! cases that map to a pod istio-cni would see, with the nat (and mangle/raw) tables the
//! mesh writes for them, written from `research/istio.md` §7 (which names the upstream
//! golden of each). IPv4 tables are as listed there; IPv6 tables are derived from them as
//! istio-iptables does (§1.3, §2.8): the loopback rules take `::6/128` and `::1/128`, and
//! rules naming an IPv4 network exist in the IPv4 table only. `tests::derivation` holds the
//! derivation to the IPv6 table the sheet lists for `include-exclude-ip`.

use crate::{ann, pod_facts, Case, Mesh, MeshRules};

/// Under which condition istio-cni writes IPv6 rules (istio.md §2.7).
const V6_CONDITION: &str =
    "IPv6 pod (first global address IPv6) or ISTIO_DUAL_STACK=true on istio-proxy; ::6/128 on lo";

const STATUS: (&str, &str) = ("sidecar.istio.io/status", "true");

fn t(key: &str) -> String {
    format!("traffic.sidecar.istio.io/{key}")
}

/// The IPv6 table istio-iptables writes next to `v4` (istio.md §1.3 steps 11, 12, 16, 17, 19).
pub fn v6_of(v4: &str) -> String {
    let mut out = String::new();
    for line in v4.lines() {
        let line = line
            .replace("127.0.0.6/32", "::6/128")
            .replace("127.0.0.1/32", "::1/128");
        let names_v4 = line.split_whitespace().any(|w| {
            w.split('/')
                .next()
                .is_some_and(|a| a.parse::<std::net::Ipv4Addr>().is_ok())
        });
        if !names_v4 {
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn case(
    name: &str,
    source: &str,
    mapping: &str,
    pairs: &[(&str, &str)],
    uid_gid: (Option<i64>, Option<i64>),
    env: &[(&str, &str)],
    v4: &str,
    extra_ports: &[u16],
) -> Case {
    let mut annotations = ann(&[STATUS]);
    for (k, v) in pairs {
        let key = if k.contains('/') { k.to_string() } else { t(k) };
        annotations.insert(key, v.to_string());
    }
    // istio-cni: runAsUser/runAsGroup of istio-proxy; unset or 0 means 1337 (§2.4).
    let eff = |v: Option<i64>| match v {
        Some(n) if n > 0 => n as u32,
        _ => 1337,
    };
    Case {
        mesh: Mesh::Istio,
        name: name.into(),
        source: source.into(),
        mapping: mapping.into(),
        annotations,
        facts: pod_facts(
            "istio-validation",
            "istio-proxy",
            uid_gid.0,
            uid_gid.1,
            env,
            &["proxy", "sidecar"],
        ),
        v4: MeshRules::Restore(v4.into()),
        v6: MeshRules::Restore(v6_of(v4)),
        v6_condition: V6_CONDITION.into(),
        proxy_uid: eff(uid_gid.0),
        proxy_gid: Some(eff(uid_gid.1)),
        extra_ports: extra_ports.to_vec(),
    }
}

const DRYRUN: &str = "cni/pkg/plugin/plugin_dryrun_test.go";
/// The three annotations that turn istio-cni's defaults into istio-iptables' test base (§3.1 "B").
const B: [(&str, &str); 3] = [
    ("includeInboundPorts", ""),
    ("includeOutboundIPRanges", ""),
    ("excludeOutboundPorts", ""),
];

fn with_b(more: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    B.iter().chain(more).copied().collect()
}

/// An istio-iptables capture case: name, golden, annotations beyond B, istio-proxy env,
/// IPv4 table.
type BCase = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static [(&'static str, &'static str)],
    &'static str,
);

/// `table` with `line` put right after its line `after`.
fn with_line(table: &str, after: &str, line: &str) -> String {
    assert!(table.lines().any(|l| l == after), "no line {after:?}");
    table
        .lines()
        .flat_map(|l| if l == after { vec![l, line] } else { vec![l] })
        .map(|l| format!("{l}\n"))
        .collect()
}

/// Derived tables: `basic` with the rules istio-iptables adds for one more setting
/// (istio.md §1.3), in the place its steps put them.
fn derived_basic(setting: &str) -> String {
    match setting {
        // Step 8: inbound exclusions 3306,15020,15021,15090 follow the 15008 RETURN.
        "excludeInboundPorts 3306" => with_line(
            BASIC_V4,
            "-A ISTIO_INBOUND -p tcp --dport 15008 -j RETURN",
            "-A ISTIO_INBOUND -p tcp --dport 3306 -j RETURN",
        ),
        // Step 17: excluded ranges follow the 127.0.0.1 RETURN (0.0.0.0/0 has no loopback
        // address, so the `! --uid-owner` loopback RETURNs stay).
        "excludeOutboundIPRanges 0.0.0.0/0" => with_line(
            BASIC_V4,
            "-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN",
            "-A ISTIO_OUTPUT -d 0.0.0.0/0 -j RETURN",
        ),
        // Step 2: an excluded interface's RETURNs come before the jumps of steps 8 and 9
        // (as basic-exclude-nic.golden shows for another name).
        "excludeInterfaces eth0" => {
            let t = with_line(
                BASIC_V4,
                ":ISTIO_REDIRECT - [0:0]",
                "-A PREROUTING -i eth0 -j RETURN",
            );
            with_line(
                &t,
                "-A PREROUTING -p tcp -j ISTIO_INBOUND",
                "-A OUTPUT -o eth0 -j RETURN",
            )
        }
        other => panic!("no derivation for {other}"),
    }
}

/// Every Istio case.
pub fn cases() -> Vec<Case> {
    let none = (None, None);
    let mut v = vec![
        case("basic", &format!("{DRYRUN} `basic`; cni/pkg/plugin/testdata/basic.txt.golden"),
            "annotations absent (defaults): only sidecar.istio.io/status", &[], none, &[], BASIC_V4, &[]),
        case("custom-uid-zero", &format!("{DRYRUN} `custom-uid-zero`; cni/pkg/plugin/testdata/basic.txt.golden"),
            "istio-proxy runAsUser 0, runAsGroup unset: both mean 1337", &[], (Some(0), None), &[], BASIC_V4, &[]),
        case("include-exclude-ip", &format!("{DRYRUN} `include-exclude-ip`; cni/pkg/plugin/testdata/include-exclude-ip.txt.golden"),
            "includeOutboundIPRanges 127.0.0.0/8, excludeOutboundIPRanges 10.0.0.0/8",
            &[("includeOutboundIPRanges", "127.0.0.0/8"), ("excludeOutboundIPRanges", "10.0.0.0/8")],
            none, &[], INCLUDE_EXCLUDE_IP_V4, &[]),
        case("include-exclude-ports", &format!("{DRYRUN} `include-exclude-ports`; cni/pkg/plugin/testdata/include-exclude-ports.txt.golden"),
            "includeInboundPorts 1111,2222; excludeInboundPorts 3333,4444 (unused with a port list); excludeOutboundPorts 5555,6666",
            &[("includeInboundPorts", "1111,2222"), ("excludeInboundPorts", "3333,4444"), ("excludeOutboundPorts", "5555,6666")],
            none, &[], INCLUDE_EXCLUDE_PORTS_V4, &[3333, 4444]),
        case("dns", &format!("{DRYRUN} `DNS`; cni/pkg/plugin/testdata/dns.txt.golden"),
            "ISTIO_META_DNS_CAPTURE=true on istio-proxy (capture-all DNS, nat + raw)",
            &[], none, &[("ISTIO_META_DNS_CAPTURE", "true")], DNS_V4, &[]),
        case("invalid-drop", &format!("{DRYRUN} `invalid-drop`; cni/pkg/plugin/testdata/invalid-drop.txt.golden"),
            "INVALID_DROP=true on istio-proxy (mangle)", &[], none, &[("INVALID_DROP", "true")], INVALID_DROP_V4, &[]),
        case("custom-uid", &format!("{DRYRUN} `custom-uid`; cni/pkg/plugin/testdata/custom-uid.txt.golden"),
            "istio-proxy runAsUser 1000670000, runAsGroup 1000670001",
            &[], (Some(1000670000), Some(1000670001)), &[], CUSTOM_UID_V4, &[]),
    ];
    const CAPTURE: &str = "tools/istio-iptables/pkg/capture/run_test.go";
    let b_cases: [BCase; 9] = [
        ("empty", "empty.golden", &[], &[], EMPTY_V4),
        (
            "ipv6-empty-inbound-ports",
            "ipv6-empty-inbound-ports.golden",
            &[],
            &[],
            EMPTY_V4,
        ),
        (
            "ipv6-inbound-ports",
            "ipv6-inbound-ports.golden",
            &[("includeInboundPorts", "4000,5000")],
            &[],
            IPV6_INBOUND_PORTS_V4,
        ),
        (
            "ipv6-outbound-ports",
            "ipv6-outbound-ports.golden",
            &[("includeOutboundPorts", "32000,31000")],
            &[],
            IPV6_OUTBOUND_PORTS_V4,
        ),
        (
            "ipnets",
            "ipnets.golden",
            &[("includeOutboundIPRanges", "10.0.0.0/8")],
            &[],
            IPNETS_V4,
        ),
        (
            "inbound-ports-include",
            "inbound-ports-include.golden",
            &[("includeInboundPorts", "32000,31000")],
            &[],
            INBOUND_PORTS_INCLUDE_V4,
        ),
        (
            "outbound-ports-include",
            "outbound-ports-include.golden",
            &[("includeOutboundPorts", "32000,31000")],
            &[],
            OUTBOUND_PORTS_INCLUDE_V4,
        ),
        (
            "basic-exclude-nic",
            "basic-exclude-nic.golden",
            &[("excludeInterfaces", "not-istio-nic")],
            &[],
            BASIC_EXCLUDE_NIC_V4,
        ),
        (
            "drop-invalid",
            "drop-invalid.golden",
            &[],
            &[("INVALID_DROP", "true")],
            DROP_INVALID_V4,
        ),
    ];
    for (name, golden, more, env, v4) in b_cases {
        // A later annotation of the same key replaces the base's.
        let pairs = with_b(more);
        v.push(case(name, &format!("{CAPTURE} `{name}`; tools/istio-iptables/pkg/capture/testdata/{golden}"),
            "istio-iptables' base as a CNI pod: includeInboundPorts \"\", includeOutboundIPRanges \"\", excludeOutboundPorts \"\" (istio.md §3.1 B)",
            &pairs, none, env, v4, &[]));
    }
    v.extend([
        case("inbound-ports-wildcard", &format!("{CAPTURE} `inbound-ports-wildcard` as istio-cni produces it (istio.md §7.C, derived)"),
            "includeOutboundIPRanges \"\", excludeOutboundPorts \"\"; includeInboundPorts left at *: istio-cni adds 15020,15021,15090 RETURNs",
            &[("includeOutboundIPRanges", ""), ("excludeOutboundPorts", "")], none, &[], INBOUND_PORTS_WILDCARD_V4, &[]),
        case("as-injected", "manifests/charts/istio-control/istio-discovery/files/injection-template.yaml (CNI mode) + cni/pkg/plugin/testdata/basic.txt.golden",
            "what the injector writes in CNI mode by default: interceptionMode REDIRECT, includeInboundPorts *, excludeInboundPorts 15020, includeOutboundIPRanges *",
            &[("sidecar.istio.io/interceptionMode", "REDIRECT"), ("includeInboundPorts", "*"), ("excludeInboundPorts", "15020"), ("includeOutboundIPRanges", "*")],
            (Some(1337), Some(1337)), &[], BASIC_V4, &[]),
        case("excludeInboundPorts", "cni/pkg/plugin/plugin_test.go (3306 -> 3306,15020,15021,15090), cni/pkg/plugin/sidecar_redirect.go; table derived (istio.md §1.3 step 8)",
            "excludeInboundPorts 3306", &[("excludeInboundPorts", "3306")], none, &[], &derived_basic("excludeInboundPorts 3306"), &[]),
        case("excludeOutboundIPRanges-all", "cni/pkg/plugin/sidecar_redirect.go; table derived (istio.md §1.3 step 17)",
            "excludeOutboundIPRanges 0.0.0.0/0", &[("excludeOutboundIPRanges", "0.0.0.0/0")], none, &[], &derived_basic("excludeOutboundIPRanges 0.0.0.0/0"), &[]),
        case("excludeInterfaces-eth0", "cni/pkg/plugin/sidecar_redirect.go; table derived (istio.md §1.3 step 2, as in basic-exclude-nic.golden)",
            "excludeInterfaces eth0 (the pod's own interface)", &[("excludeInterfaces", "eth0")], none, &[], &derived_basic("excludeInterfaces eth0"), &[]),
    ]);
    v
}

/// Upstream configurations with no case, and why.
pub fn not_mapped() -> Vec<(&'static str, &'static str)> {
    const CAPTURE: &str = "tools/istio-iptables/pkg/capture/run_test.go";
    vec![
        (CAPTURE, "`tproxy`, `inbound-ports-tproxy`, `inbound-ports-wildcard-tproxy`; plugin_dryrun_test.go `tproxy`, `custom-uid-tproxy`: TPROXY interception (interlock implements REDIRECT and refuses TPROXY)"),
        (CAPTURE, "`ip-range`, `dns-uid-gid`, `ipv6-dns-uid-gid`, `loopback-outbound-iprange`: UID/GID lists and per-nameserver DNS, which istio-cni never passes (one UID and GID from istio-proxy, capture-all DNS); the loopback-include behaviour is covered by `include-exclude-ip`"),
        (CAPTURE, "`ipv6-virt-interfaces`, `ipv6-ipnets`, `ipv6-uid-gid`, `kube-virt-interfaces`, `ipnets-with-kube-virt-interfaces`: kube-virt/reroute interfaces, which interlock does not support"),
        (CAPTURE, "`outbound-owner-groups`, `outbound-owner-groups-exclude`, `ipv6-dns-outbound-owner-groups`, `ipv6-dns-outbound-owner-groups-exclude`: owner groups come from the environment of the process running istio-iptables, not from the pod"),
        (CAPTURE, "`host-ipv4-loopback-cidr`: ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR is read from the CNI plugin process's environment only"),
        (CAPTURE, "`inbound-ports-wildcard` as its golden stands: istio-cni always adds the 15020,15021,15090 RETURNs; compared in the form istio-cni produces"),
        ("cni/pkg/plugin/testdata/status-ports.txt.golden", "referenced by no test; stale format"),
        ("cni/pkg/iptables/testdata/*", "ambient (ztunnel) redirection, not sidecar"),
    ]
}

/// istio.md 7.A.1, IPv4.
const BASIC_V4: &str = "\
*nat
:ISTIO_INBOUND - [0:0]
:ISTIO_IN_REDIRECT - [0:0]
:ISTIO_OUTPUT - [0:0]
:ISTIO_REDIRECT - [0:0]
-A PREROUTING -p tcp -j ISTIO_INBOUND
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_INBOUND -p tcp --dport 15008 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 15020 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 15021 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 15090 -j RETURN
-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT
-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006
-A ISTIO_OUTPUT -p tcp --dport 15020 -j RETURN
-A ISTIO_OUTPUT -p udp --dport 15020 -j RETURN
-A ISTIO_OUTPUT -o lo -s 127.0.0.6/32 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --gid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN
-A ISTIO_OUTPUT -j ISTIO_REDIRECT
-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
";

/// istio.md 7.A.2, IPv4.
const INCLUDE_EXCLUDE_IP_V4: &str = "\
*nat
:ISTIO_INBOUND - [0:0]
:ISTIO_IN_REDIRECT - [0:0]
:ISTIO_OUTPUT - [0:0]
:ISTIO_REDIRECT - [0:0]
-A PREROUTING -p tcp -j ISTIO_INBOUND
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_INBOUND -p tcp --dport 15008 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 15020 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 15021 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 15090 -j RETURN
-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT
-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006
-A ISTIO_OUTPUT -p tcp --dport 15020 -j RETURN
-A ISTIO_OUTPUT -p udp --dport 15020 -j RETURN
-A ISTIO_OUTPUT -o lo -s 127.0.0.6/32 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --gid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN
-A ISTIO_OUTPUT -d 10.0.0.0/8 -j RETURN
-A ISTIO_OUTPUT -d 127.0.0.0/8 -j ISTIO_REDIRECT
-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
";

/// istio.md 7.A.3, IPv4.
const INCLUDE_EXCLUDE_PORTS_V4: &str = "\
*nat
:ISTIO_INBOUND - [0:0]
:ISTIO_IN_REDIRECT - [0:0]
:ISTIO_OUTPUT - [0:0]
:ISTIO_REDIRECT - [0:0]
-A PREROUTING -p tcp -j ISTIO_INBOUND
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_INBOUND -p tcp --dport 15008 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 1111 -j ISTIO_IN_REDIRECT
-A ISTIO_INBOUND -p tcp --dport 2222 -j ISTIO_IN_REDIRECT
-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006
-A ISTIO_OUTPUT -p tcp --dport 5555 -j RETURN
-A ISTIO_OUTPUT -p udp --dport 5555 -j RETURN
-A ISTIO_OUTPUT -p tcp --dport 6666 -j RETURN
-A ISTIO_OUTPUT -p udp --dport 6666 -j RETURN
-A ISTIO_OUTPUT -o lo -s 127.0.0.6/32 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --gid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN
-A ISTIO_OUTPUT -j ISTIO_REDIRECT
-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
";

/// istio.md 7.A.4, IPv4.
const DNS_V4: &str = "\
*nat
:ISTIO_INBOUND - [0:0]
:ISTIO_IN_REDIRECT - [0:0]
:ISTIO_OUTPUT - [0:0]
:ISTIO_OUTPUT_DNS - [0:0]
:ISTIO_REDIRECT - [0:0]
-A PREROUTING -p tcp -j ISTIO_INBOUND
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_INBOUND -p tcp --dport 15008 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 15020 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 15021 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 15090 -j RETURN
-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT
-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006
-A ISTIO_OUTPUT -p tcp --dport 15020 -j RETURN
-A ISTIO_OUTPUT -p udp --dport 15020 -j RETURN
-A ISTIO_OUTPUT -o lo -s 127.0.0.6/32 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp -m multiport ! --dports 53,15008 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -p tcp ! --dport 53 -m owner ! --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --gid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -p tcp ! --dport 53 -m owner ! --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -j ISTIO_OUTPUT_DNS
-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN
-A ISTIO_OUTPUT -j ISTIO_REDIRECT
-A ISTIO_OUTPUT_DNS -p tcp --dport 53 -j REDIRECT --to-ports 15053
-A ISTIO_OUTPUT_DNS -p udp --dport 53 -j REDIRECT --to-port 15053
-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
*raw
:ISTIO_INBOUND - [0:0]
:ISTIO_OUTPUT_DNS - [0:0]
-A PREROUTING -j ISTIO_INBOUND
-A OUTPUT -j ISTIO_OUTPUT_DNS
-A ISTIO_INBOUND -p udp --sport 53 -j CT --zone 1
-A ISTIO_OUTPUT_DNS -p udp --dport 53 -m owner --uid-owner 1337 -j CT --zone 1
-A ISTIO_OUTPUT_DNS -p udp --sport 15053 -m owner --uid-owner 1337 -j CT --zone 2
-A ISTIO_OUTPUT_DNS -p udp --dport 53 -m owner --gid-owner 1337 -j CT --zone 1
-A ISTIO_OUTPUT_DNS -p udp --sport 15053 -m owner --gid-owner 1337 -j CT --zone 2
-A ISTIO_OUTPUT_DNS -p udp --dport 53 -j CT --zone 2
COMMIT
";

/// istio.md 7.A.5, IPv4.
const INVALID_DROP_V4: &str = "\
*mangle
:ISTIO_DROP - [0:0]
-A PREROUTING -m conntrack --ctstate INVALID -j ISTIO_DROP
-A ISTIO_DROP -j DROP
COMMIT
*nat
:ISTIO_INBOUND - [0:0]
:ISTIO_IN_REDIRECT - [0:0]
:ISTIO_OUTPUT - [0:0]
:ISTIO_REDIRECT - [0:0]
-A PREROUTING -p tcp -j ISTIO_INBOUND
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_INBOUND -p tcp --dport 15008 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 15020 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 15021 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 15090 -j RETURN
-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT
-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006
-A ISTIO_OUTPUT -p tcp --dport 15020 -j RETURN
-A ISTIO_OUTPUT -p udp --dport 15020 -j RETURN
-A ISTIO_OUTPUT -o lo -s 127.0.0.6/32 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --gid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN
-A ISTIO_OUTPUT -j ISTIO_REDIRECT
-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
";

/// istio.md 7.A.6, IPv4.
const CUSTOM_UID_V4: &str = "\
*nat
:ISTIO_INBOUND - [0:0]
:ISTIO_IN_REDIRECT - [0:0]
:ISTIO_OUTPUT - [0:0]
:ISTIO_REDIRECT - [0:0]
-A PREROUTING -p tcp -j ISTIO_INBOUND
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_INBOUND -p tcp --dport 15008 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 15020 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 15021 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 15090 -j RETURN
-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT
-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006
-A ISTIO_OUTPUT -p tcp --dport 15020 -j RETURN
-A ISTIO_OUTPUT -p udp --dport 15020 -j RETURN
-A ISTIO_OUTPUT -o lo -s 127.0.0.6/32 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --uid-owner 1000670000 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --uid-owner 1000670000 -j RETURN
-A ISTIO_OUTPUT -m owner --uid-owner 1000670000 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --gid-owner 1000670001 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --gid-owner 1000670001 -j RETURN
-A ISTIO_OUTPUT -m owner --gid-owner 1000670001 -j RETURN
-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN
-A ISTIO_OUTPUT -j ISTIO_REDIRECT
-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
";

/// istio.md 7.B.1, IPv4.
const EMPTY_V4: &str = "\
*nat
:ISTIO_INBOUND - [0:0]
:ISTIO_IN_REDIRECT - [0:0]
:ISTIO_OUTPUT - [0:0]
:ISTIO_REDIRECT - [0:0]
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_INBOUND -p tcp --dport 15008 -j RETURN
-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006
-A ISTIO_OUTPUT -o lo -s 127.0.0.6/32 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --gid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN
-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
";

/// istio.md 7.B.3, IPv4.
const IPV6_INBOUND_PORTS_V4: &str = "\
*nat
:ISTIO_INBOUND - [0:0]
:ISTIO_IN_REDIRECT - [0:0]
:ISTIO_OUTPUT - [0:0]
:ISTIO_REDIRECT - [0:0]
-A PREROUTING -p tcp -j ISTIO_INBOUND
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_INBOUND -p tcp --dport 15008 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 4000 -j ISTIO_IN_REDIRECT
-A ISTIO_INBOUND -p tcp --dport 5000 -j ISTIO_IN_REDIRECT
-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006
-A ISTIO_OUTPUT -o lo -s 127.0.0.6/32 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --gid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN
-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
";

/// istio.md 7.B.4, IPv4.
const IPV6_OUTBOUND_PORTS_V4: &str = "\
*nat
:ISTIO_INBOUND - [0:0]
:ISTIO_IN_REDIRECT - [0:0]
:ISTIO_OUTPUT - [0:0]
:ISTIO_REDIRECT - [0:0]
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_INBOUND -p tcp --dport 15008 -j RETURN
-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006
-A ISTIO_OUTPUT -o lo -s 127.0.0.6/32 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --gid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN
-A ISTIO_OUTPUT -p tcp --dport 32000 -j ISTIO_REDIRECT
-A ISTIO_OUTPUT -p tcp --dport 31000 -j ISTIO_REDIRECT
-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
";

/// istio.md 7.B.5, IPv4.
const IPNETS_V4: &str = "\
*nat
:ISTIO_INBOUND - [0:0]
:ISTIO_IN_REDIRECT - [0:0]
:ISTIO_OUTPUT - [0:0]
:ISTIO_REDIRECT - [0:0]
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_INBOUND -p tcp --dport 15008 -j RETURN
-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006
-A ISTIO_OUTPUT -o lo -s 127.0.0.6/32 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --gid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN
-A ISTIO_OUTPUT -d 10.0.0.0/8 -j ISTIO_REDIRECT
-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
";

/// istio.md 7.B.6, IPv4.
const INBOUND_PORTS_INCLUDE_V4: &str = "\
*nat
:ISTIO_INBOUND - [0:0]
:ISTIO_IN_REDIRECT - [0:0]
:ISTIO_OUTPUT - [0:0]
:ISTIO_REDIRECT - [0:0]
-A PREROUTING -p tcp -j ISTIO_INBOUND
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_INBOUND -p tcp --dport 15008 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 32000 -j ISTIO_IN_REDIRECT
-A ISTIO_INBOUND -p tcp --dport 31000 -j ISTIO_IN_REDIRECT
-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006
-A ISTIO_OUTPUT -o lo -s 127.0.0.6/32 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --gid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN
-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
";

/// istio.md 7.B.7, IPv4.
const OUTBOUND_PORTS_INCLUDE_V4: &str = "\
*nat
:ISTIO_INBOUND - [0:0]
:ISTIO_IN_REDIRECT - [0:0]
:ISTIO_OUTPUT - [0:0]
:ISTIO_REDIRECT - [0:0]
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_INBOUND -p tcp --dport 15008 -j RETURN
-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006
-A ISTIO_OUTPUT -o lo -s 127.0.0.6/32 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --gid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN
-A ISTIO_OUTPUT -p tcp --dport 32000 -j ISTIO_REDIRECT
-A ISTIO_OUTPUT -p tcp --dport 31000 -j ISTIO_REDIRECT
-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
";

/// istio.md 7.B.8, IPv4.
const BASIC_EXCLUDE_NIC_V4: &str = "\
*nat
:ISTIO_INBOUND - [0:0]
:ISTIO_IN_REDIRECT - [0:0]
:ISTIO_OUTPUT - [0:0]
:ISTIO_REDIRECT - [0:0]
-A PREROUTING -i not-istio-nic -j RETURN
-A OUTPUT -o not-istio-nic -j RETURN
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_INBOUND -p tcp --dport 15008 -j RETURN
-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006
-A ISTIO_OUTPUT -o lo -s 127.0.0.6/32 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --gid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN
-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
";

/// istio.md 7.B.9, IPv4.
const DROP_INVALID_V4: &str = "\
*mangle
:ISTIO_DROP - [0:0]
-A PREROUTING -m conntrack --ctstate INVALID -j ISTIO_DROP
-A ISTIO_DROP -j DROP
COMMIT
*nat
:ISTIO_INBOUND - [0:0]
:ISTIO_IN_REDIRECT - [0:0]
:ISTIO_OUTPUT - [0:0]
:ISTIO_REDIRECT - [0:0]
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_INBOUND -p tcp --dport 15008 -j RETURN
-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006
-A ISTIO_OUTPUT -o lo -s 127.0.0.6/32 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --gid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN
-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
";

/// istio.md 7.C, IPv4.
const INBOUND_PORTS_WILDCARD_V4: &str = "\
*nat
:ISTIO_INBOUND - [0:0]
:ISTIO_IN_REDIRECT - [0:0]
:ISTIO_OUTPUT - [0:0]
:ISTIO_REDIRECT - [0:0]
-A PREROUTING -p tcp -j ISTIO_INBOUND
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_INBOUND -p tcp --dport 15008 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 15020 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 15021 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 15090 -j RETURN
-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT
-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006
-A ISTIO_OUTPUT -o lo -s 127.0.0.6/32 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --gid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -o lo -m owner ! --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN
-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
";

/// istio.md 7.A.2, IPv6 (the sheet's derived listing; only the derivation test reads it).
#[cfg(test)]
const INCLUDE_EXCLUDE_IP_V6: &str = "\
*nat
:ISTIO_INBOUND - [0:0]
:ISTIO_IN_REDIRECT - [0:0]
:ISTIO_OUTPUT - [0:0]
:ISTIO_REDIRECT - [0:0]
-A PREROUTING -p tcp -j ISTIO_INBOUND
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_INBOUND -p tcp --dport 15008 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 15020 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 15021 -j RETURN
-A ISTIO_INBOUND -p tcp --dport 15090 -j RETURN
-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT
-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006
-A ISTIO_OUTPUT -p tcp --dport 15020 -j RETURN
-A ISTIO_OUTPUT -p udp --dport 15020 -j RETURN
-A ISTIO_OUTPUT -o lo -s ::6/128 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d ::1/128 -p tcp ! --dport 15008 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -o lo ! -d ::1/128 -p tcp ! --dport 15008 -m owner --gid-owner 1337 -j ISTIO_IN_REDIRECT
-A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN
-A ISTIO_OUTPUT -d ::1/128 -j RETURN
-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
";

#[cfg(test)]
mod tests {
    use super::*;

    /// The derivation gives the IPv6 table the sheet lists for `include-exclude-ip` (the one
    /// whose IPv6 table differs from its IPv4 one by more than the loopback addresses).
    #[test]
    fn derivation() {
        assert_eq!(v6_of(INCLUDE_EXCLUDE_IP_V4), INCLUDE_EXCLUDE_IP_V6);
    }
}

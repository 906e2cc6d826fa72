//! Linkerd cases as linkerd-cni configures a pod: its integration-test configuration, the
//! default chart configuration, each pod annotation linkerd-cni reads, and the proxy-init
//! lab scenarios whose setting is a pod annotation under linkerd-cni. The nat tables are
//! written by `nat_table` exactly as `research/linkerd.md` §1.1–1.3 describes proxy-init's
//! commands (the same rule list for IPv4 and IPv6); the tests below hold it to the two full
//! tables the sheet lists (§3.3 and §3.4 C).

use interlock_contract::pod::PodFacts;

use crate::{ann, pod_facts, Case, Mesh, MeshRules};

/// Under which condition linkerd-cni writes the IPv6 rules (linkerd.md §1.5).
const V6_CONDITION: &str = "\"ipv6\": true in the linkerd-cni config (chart disableIPv6: false): the same rules through ip6tables";

/// The proxy-init settings linkerd-cni passes for a pod.
struct ProxyInit<'a> {
    uid: u32,
    /// 0: no GID rule (linkerd.md §1.4: only > 0 makes one).
    gid: u32,
    inbound_ignore: Vec<&'a str>,
    outbound_ignore: Vec<&'a str>,
    subnets: Vec<&'a str>,
}

/// proxy-init's port groups: `N` or `L-H` (as `L:H`), at most 15 slots per rule, a range
/// costing two; invalid entries dropped (linkerd.md §1.3).
fn port_groups(entries: &[&str]) -> Vec<String> {
    let mut groups: Vec<(Vec<String>, usize)> = Vec::new();
    for e in entries {
        let (item, slots) = match e.split_once('-') {
            Some((lo, hi)) => match (lo.parse::<u16>(), hi.parse::<u16>()) {
                (Ok(l), Ok(h)) if l == h => (l.to_string(), 1),
                (Ok(l), Ok(h)) if l < h => (format!("{l}:{h}"), 2),
                _ => continue,
            },
            None => match e.parse::<u16>() {
                Ok(p) => (p.to_string(), 1),
                Err(_) => continue,
            },
        };
        match groups.last_mut() {
            Some((g, used)) if *used + slots <= 15 => {
                g.push(item);
                *used += slots;
            }
            _ => groups.push((vec![item], slots)),
        }
    }
    groups.into_iter().map(|(g, _)| g.join(",")).collect()
}

/// The nat table proxy-init writes into a fresh netns for `p` (linkerd.md §1.1, §1.2),
/// with linkerd-cni's proxy ports 4143 in / 4140 out.
fn nat_table(p: &ProxyInit) -> String {
    let mut out = String::from(
        "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:PROXY_INIT_OUTPUT - [0:0]\n:PROXY_INIT_REDIRECT - [0:0]\n\
         -A PREROUTING -m comment --comment \"proxy-init/install-proxy-init-prerouting\" -j PROXY_INIT_REDIRECT\n\
         -A OUTPUT -m comment --comment \"proxy-init/install-proxy-init-output\" -j PROXY_INIT_OUTPUT\n",
    );
    if p.uid > 0 {
        out += &format!("-A PROXY_INIT_OUTPUT -m owner --uid-owner {} -m comment --comment \"proxy-init/ignore-proxy-user-id\" -j RETURN\n", p.uid);
    }
    if p.gid > 0 {
        out += &format!("-A PROXY_INIT_OUTPUT -m owner --gid-owner {} -m comment --comment \"proxy-init/ignore-proxy-group-id\" -j RETURN\n", p.gid);
    }
    out += "-A PROXY_INIT_OUTPUT -o lo -m comment --comment \"proxy-init/ignore-loopback\" -j RETURN\n";
    for g in port_groups(&p.outbound_ignore) {
        out += &format!("-A PROXY_INIT_OUTPUT -p tcp -m multiport --dports {g} -m comment --comment \"proxy-init/ignore-port-{g}\" -j RETURN\n");
    }
    out += "-A PROXY_INIT_OUTPUT -p tcp -m comment --comment \"proxy-init/redirect-all-outgoing-to-proxy-port\" -j REDIRECT --to-ports 4140\n";
    for g in port_groups(&p.inbound_ignore) {
        out += &format!("-A PROXY_INIT_REDIRECT -p tcp -m multiport --dports {g} -m comment --comment \"proxy-init/ignore-port-{g}\" -j RETURN\n");
    }
    for s in &p.subnets {
        out += &format!("-A PROXY_INIT_REDIRECT -s {s} -m comment --comment \"proxy-init/ignore-subnet-{s}\" -j RETURN\n");
    }
    out += "-A PROXY_INIT_REDIRECT -p tcp -m comment --comment \"proxy-init/redirect-all-incoming-to-proxy-port\" -j REDIRECT --to-ports 4143\nCOMMIT\n";
    out
}

/// The chart's linkerd-cni config: inbound ignore `["4191","4190"]`, nothing else ignored
/// (linkerd.md §2.2).
const CNI_INBOUND: [&str; 2] = ["4191", "4190"];

fn facts(uid: u32, gid: Option<u32>) -> PodFacts {
    pod_facts(
        "linkerd-network-validator",
        "linkerd-proxy",
        Some(uid.into()),
        gid.map(i64::from),
        &[],
        &[],
    )
}

struct Spec<'a> {
    name: &'a str,
    source: &'a str,
    mapping: &'a str,
    annotations: &'a [(&'a str, &'a str)],
    init: ProxyInit<'a>,
}

fn case(s: Spec) -> Case {
    let mut annotations = ann(&[("linkerd.io/proxy-version", "edge-25.8.1")]);
    annotations.extend(ann(s.annotations));
    let table = nat_table(&s.init);
    // proxy-init gives ip6tables the same subnet list; an IPv4 network fails that pass and
    // with it the pod (linkerd.md §1.5, PR linkerd2-proxy-init#696).
    let v6 = if s.init.subnets.iter().any(|n| !n.contains(':')) {
        MeshRules::NotWritten(
            "ip6tables rejects the IPv4 skip-subnets: linkerd-cni fails the pod".into(),
        )
    } else {
        MeshRules::Restore(table.clone())
    };
    Case {
        mesh: Mesh::Linkerd,
        name: s.name.into(),
        source: s.source.into(),
        mapping: s.mapping.into(),
        annotations,
        facts: facts(s.init.uid, (s.init.gid > 0).then_some(s.init.gid)),
        v4: MeshRules::Restore(table),
        v6,
        v6_condition: V6_CONDITION.into(),
        proxy_uid: s.init.uid,
        proxy_gid: (s.init.gid > 0).then_some(s.init.gid),
        extra_ports: vec![],
    }
}

const CNI: &str = "linkerd2-proxy-init cni-plugin/main.go";

fn cni(more_inbound: &[&'static str]) -> Vec<&'static str> {
    CNI_INBOUND.iter().chain(more_inbound).copied().collect()
}

/// Every Linkerd case.
pub fn cases() -> Vec<Case> {
    let base = |inbound: Vec<&'static str>,
                outbound: Vec<&'static str>,
                subnets: Vec<&'static str>| ProxyInit {
        uid: 2102,
        gid: 0,
        inbound_ignore: inbound,
        outbound_ignore: outbound,
        subnets,
    };
    let mut with_gid = base(cni(&[]), vec![], vec![]);
    with_gid.gid = 2102;
    let mut uid = base(cni(&[]), vec![], vec![]);
    uid.uid = 2103;
    let mut gid = base(cni(&[]), vec![], vec![]);
    gid.gid = 2104;
    vec![
        case(Spec {
            name: "cni-integration",
            source: "linkerd2-proxy-init cni-plugin/integration/manifests/*/linkerd-cni.yaml, cni-plugin/integration/tests/*_test.go (linkerd.md §3.3)",
            mapping: "the integration config (uid 2102, gid 2102, inbound ignore 4191,4190); interlock has no node-wide setting, so the pod carries config.linkerd.io/proxy-gid: 2102",
            annotations: &[("config.linkerd.io/proxy-gid", "2102")],
            init: with_gid,
        }),
        case(Spec {
            name: "cni-default",
            source: "linkerd2 charts/linkerd2-cni/values.yaml, cli/cmd/testdata/install-cni-plugin_default.golden (linkerd.md §3.4 D)",
            mapping: "annotations absent (defaults): chart config, proxy-gid left out",
            annotations: &[],
            init: base(cni(&[]), vec![], vec![]),
        }),
        case(Spec {
            name: "cni-annotations",
            source: "linkerd2-proxy-init cni-plugin/main.go (linkerd.md §3.4 E)",
            mapping: "skip-inbound-ports 8080 (appended to 4191,4190), skip-outbound-ports 3306, skip-subnets 10.0.0.0/8",
            annotations: &[("config.linkerd.io/skip-inbound-ports", "8080"), ("config.linkerd.io/skip-outbound-ports", "3306"), ("config.linkerd.io/skip-subnets", "10.0.0.0/8")],
            init: base(cni(&["8080"]), vec!["3306"], vec!["10.0.0.0/8"]),
        }),
        case(Spec {
            name: "skip-inbound-ports",
            source: CNI,
            mapping: "config.linkerd.io/skip-inbound-ports 8080,9000-9010 (appended to 4191,4190)",
            annotations: &[("config.linkerd.io/skip-inbound-ports", "8080,9000-9010")],
            init: base(cni(&["8080", "9000-9010"]), vec![], vec![]),
        }),
        case(Spec {
            name: "skip-outbound-ports",
            source: CNI,
            mapping: "config.linkerd.io/skip-outbound-ports 3306,4567-4568",
            annotations: &[("config.linkerd.io/skip-outbound-ports", "3306,4567-4568")],
            init: base(cni(&[]), vec!["3306", "4567-4568"], vec![]),
        }),
        case(Spec {
            name: "skip-subnets",
            source: "linkerd2-proxy-init cni-plugin/main.go, pkg/iptables/iptables.go (inbound source RETURN)",
            mapping: "config.linkerd.io/skip-subnets 192.168.0.0/16",
            annotations: &[("config.linkerd.io/skip-subnets", "192.168.0.0/16")],
            init: base(cni(&[]), vec![], vec!["192.168.0.0/16"]),
        }),
        case(Spec {
            name: "proxy-uid",
            source: CNI,
            mapping: "config.linkerd.io/proxy-uid 2103 (the proxy runs as 2103)",
            annotations: &[("config.linkerd.io/proxy-uid", "2103")],
            init: uid,
        }),
        case(Spec {
            name: "proxy-gid",
            source: CNI,
            mapping: "config.linkerd.io/proxy-gid 2104 (the proxy runs with GID 2104)",
            annotations: &[("config.linkerd.io/proxy-gid", "2104")],
            init: gid,
        }),
        case(Spec {
            name: "lab-doesnt-redirect-blacklisted",
            source: "linkerd2-proxy-init proxy-init/integration/iptables/iptablestest-lab.yaml `pod-doesnt-redirect-blacklisted`, http_test.go",
            mapping: "the lab's --inbound-ports-to-ignore 6000-8000 as the pod annotation skip-inbound-ports under linkerd-cni's config (its 8080 proxy ports are no pod setting)",
            annotations: &[("config.linkerd.io/skip-inbound-ports", "6000-8000")],
            init: base(cni(&["6000-8000"]), vec![], vec![]),
        }),
        case(Spec {
            name: "lab-ignores-subnets",
            source: "linkerd2-proxy-init proxy-init/integration/iptables/iptablestest-lab.yaml `pod-ignores-subnets`, http_test.go",
            mapping: "the lab's --subnets-to-ignore 0.0.0.0/0 as the pod annotation skip-subnets under linkerd-cni's config",
            annotations: &[("config.linkerd.io/skip-subnets", "0.0.0.0/0")],
            init: base(cni(&[]), vec![], vec!["0.0.0.0/0"]),
        }),
        {
            let mut c = case(Spec {
                name: "control-plane-component",
                source: "linkerd2-proxy-init cni-plugin/main.go (linkerd.md §3.4 F)",
                mapping: "label linkerd.io/control-plane-component: destination; the kubernetes Service 443 -> 6443 (also linkerd-cni's fallback)",
                annotations: &[],
                init: base(cni(&[]), vec!["443", "6443"], vec![]),
            });
            c.facts.labels.insert("linkerd.io/control-plane-component".into(), "destination".into());
            c
        },
    ]
}

/// Upstream configurations with no case, and why.
pub fn not_mapped() -> Vec<(&'static str, &'static str)> {
    vec![
        ("linkerd2-proxy-init pkg/iptables/iptables_test.go", "TestAddIncomingTrafficRules / TestAddOutgoingTrafficRules: command-list tests with no mode or UID set (no inbound REDIRECT, no owner rule), not a configuration any pod gets"),
        ("linkerd2 charts/partials/templates/_proxy-init.tpl, controller/proxy-injector/fake/data/pod.patch.json (linkerd.md §3.4 A-C)", "the injector's linkerd-init path (inbound ignore 4190,4191,4567,4568; outbound 4567,4568; control-plane 443,6443): linkerd-cni skips pods with linkerd-init, and interlock replaces linkerd-cni; the annotations it honours are covered under linkerd-cni's semantics"),
        ("linkerd2-proxy-init proxy-init/integration/iptables/iptablestest-lab.yaml", "`pod-redirects-all-ports`, `pod-with-existing-rules`: proxy ports 8080 in and out are proxy-init flags that linkerd-cni does not take from a pod (it ignores the inbound-port/outbound-port annotations); existing-rules tests re-running proxy-init"),
        ("linkerd2-proxy-init proxy-init/integration/iptables/iptablestest-lab.yaml", "`pod-redirects-whitelisted` (--ports-to-redirect): linkerd-cni's ports-to-redirect is node-wide config, no pod annotation; `pod-with-no-rules`: the control pod without rules"),
        ("linkerd2-proxy-init cni-plugin/main.go", "skip-subnets with an IPv6 network: proxy-init hands the list to the IPv4 pass too, which rejects it, so the pod never starts (PR linkerd2-proxy-init#696); with IPv6 on, an IPv4 network fails the IPv6 pass the same way (those IPv6 rows are n/a)"),
        ("linkerd2 pkg/k8s/labels.go", "config.linkerd.io/inbound-port, outbound-port, admin-port, control-port, close-wait-timeout: read by the injector only, not by linkerd-cni"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// linkerd.md §3.3, the integration-test table.
    const INTEGRATION: &str = "\
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:PROXY_INIT_OUTPUT - [0:0]
:PROXY_INIT_REDIRECT - [0:0]
-A PREROUTING -m comment --comment \"proxy-init/install-proxy-init-prerouting\" -j PROXY_INIT_REDIRECT
-A OUTPUT -m comment --comment \"proxy-init/install-proxy-init-output\" -j PROXY_INIT_OUTPUT
-A PROXY_INIT_OUTPUT -m owner --uid-owner 2102 -m comment --comment \"proxy-init/ignore-proxy-user-id\" -j RETURN
-A PROXY_INIT_OUTPUT -m owner --gid-owner 2102 -m comment --comment \"proxy-init/ignore-proxy-group-id\" -j RETURN
-A PROXY_INIT_OUTPUT -o lo -m comment --comment \"proxy-init/ignore-loopback\" -j RETURN
-A PROXY_INIT_OUTPUT -p tcp -m comment --comment \"proxy-init/redirect-all-outgoing-to-proxy-port\" -j REDIRECT --to-ports 4140
-A PROXY_INIT_REDIRECT -p tcp -m multiport --dports 4191,4190 -m comment --comment \"proxy-init/ignore-port-4191,4190\" -j RETURN
-A PROXY_INIT_REDIRECT -p tcp -m comment --comment \"proxy-init/redirect-all-incoming-to-proxy-port\" -j REDIRECT --to-ports 4143
COMMIT
";

    /// linkerd.md §3.4 C (injector args, the same proxy-init code).
    const INJECTOR_C: &str = "\
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:PROXY_INIT_OUTPUT - [0:0]
:PROXY_INIT_REDIRECT - [0:0]
-A PREROUTING -m comment --comment \"proxy-init/install-proxy-init-prerouting\" -j PROXY_INIT_REDIRECT
-A OUTPUT -m comment --comment \"proxy-init/install-proxy-init-output\" -j PROXY_INIT_OUTPUT
-A PROXY_INIT_OUTPUT -m owner --uid-owner 2102 -m comment --comment \"proxy-init/ignore-proxy-user-id\" -j RETURN
-A PROXY_INIT_OUTPUT -m owner --gid-owner 2102 -m comment --comment \"proxy-init/ignore-proxy-group-id\" -j RETURN
-A PROXY_INIT_OUTPUT -o lo -m comment --comment \"proxy-init/ignore-loopback\" -j RETURN
-A PROXY_INIT_OUTPUT -p tcp -m multiport --dports 3306 -m comment --comment \"proxy-init/ignore-port-3306\" -j RETURN
-A PROXY_INIT_OUTPUT -p tcp -m comment --comment \"proxy-init/redirect-all-outgoing-to-proxy-port\" -j REDIRECT --to-ports 4140
-A PROXY_INIT_REDIRECT -p tcp -m multiport --dports 4190,4191,8080,9000:9010 -m comment --comment \"proxy-init/ignore-port-4190,4191,8080,9000:9010\" -j RETURN
-A PROXY_INIT_REDIRECT -s 10.0.0.0/8 -m comment --comment \"proxy-init/ignore-subnet-10.0.0.0/8\" -j RETURN
-A PROXY_INIT_REDIRECT -s 192.168.0.0/16 -m comment --comment \"proxy-init/ignore-subnet-192.168.0.0/16\" -j RETURN
-A PROXY_INIT_REDIRECT -p tcp -m comment --comment \"proxy-init/redirect-all-incoming-to-proxy-port\" -j REDIRECT --to-ports 4143
COMMIT
";

    #[test]
    fn tables_match_the_sheet() {
        assert_eq!(
            nat_table(&ProxyInit {
                uid: 2102,
                gid: 2102,
                inbound_ignore: cni(&[]),
                outbound_ignore: vec![],
                subnets: vec![]
            }),
            INTEGRATION
        );
        assert_eq!(
            nat_table(&ProxyInit {
                uid: 2102,
                gid: 2102,
                inbound_ignore: vec!["4190", "4191", "8080", "9000-9010"],
                outbound_ignore: vec!["3306"],
                subnets: vec!["10.0.0.0/8", "192.168.0.0/16"],
            }),
            INJECTOR_C
        );
    }

    #[test]
    fn ports_group_by_fifteen_slots() {
        let e: Vec<&str> = "22-23,25-27,33-34,35-35,37-38,50-54,56,58,60,63,70-72"
            .split(',')
            .collect();
        assert_eq!(
            port_groups(&e),
            vec!["22:23,25:27,33:34,35,37:38,50:54,56,58,60,63", "70:72"]
        );
        assert_eq!(port_groups(&["x", "80"]), vec!["80"]);
    }
}

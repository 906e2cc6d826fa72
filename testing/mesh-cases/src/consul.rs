//! Consul cases as consul-k8s's CNI plugin applies a pod's
//! `consul.hashicorp.com/redirect-traffic-config` annotation: consul's own `sdk/iptables`
//! test configurations (IPv4, and the dual-stack pairs), consul-k8s's CNI test
//! configurations and the webhook's, written from `research/consul.md` §5 (tables as listed
//! there). An IPv6 table the sheet does not list is derived as the sdk writes it under
//! dual stack (§4.5): the same rules through ip6tables with `::1/128`.

use serde_json::json;

use crate::{ann, pod_facts, Case, Mesh, MeshRules};

/// Under which condition consul-k8s writes IPv6 rules (consul.md §4.5).
const V6_CONDITION: &str = "consul.hashicorp.com/dual-stack: \"true\" (webhook env CONSUL_DUAL_STACK=true): the same rules through ip6tables with ::1/128";

/// The sdk's `iptables.Config` as consul-k8s serialises it (Go field names, nil lists as
/// `null`; consul.md §2.5).
#[derive(Clone, Default)]
struct Config {
    dns_ip: &'static str,
    dns_port: u16,
    uid: &'static str,
    inbound: u16,
    outbound: u16,
    exclude_inbound: &'static [&'static str],
    exclude_outbound: &'static [&'static str],
    exclude_cidrs: &'static [&'static str],
    exclude_uids: &'static [&'static str],
}

fn list(l: &[&str]) -> serde_json::Value {
    if l.is_empty() {
        serde_json::Value::Null
    } else {
        json!(l)
    }
}

impl Config {
    fn json(&self) -> String {
        json!({
            "ConsulDNSIP": self.dns_ip,
            "ConsulDNSPort": self.dns_port,
            "ProxyUserID": self.uid,
            "ProxyInboundPort": self.inbound,
            "ProxyOutboundPort": self.outbound,
            "ExcludeInboundPorts": list(self.exclude_inbound),
            "ExcludeOutboundPorts": list(self.exclude_outbound),
            "ExcludeOutboundCIDRs": list(self.exclude_cidrs),
            "ExcludeUIDs": list(self.exclude_uids),
            "NetNS": "",
            "IptablesProvider": null,
        })
        .to_string()
    }
}

/// How a case's IPv6 table comes about.
enum V6 {
    /// The IPv4 table with `::1/128` for `127.0.0.1/32` (no other IPv4 address in it).
    Derived,
    /// As the sheet lists it.
    Listed(&'static str),
    /// The sdk writes no IPv6 rules for this configuration under dual stack: why.
    Refused(&'static str),
}

const DNS_V4_ONLY: &str = "without dual stack consul writes no IPv6 rules, and with it the DNS rule moves to the IPv6 pass (SD.3 compares that form)";
const DNS_V4_REFUSED: &str = "Setup refuses an IPv4 ConsulDNSIP under dual stack (TestVerifyDualStackConfig, consul.md §4.1)";
const NOMAD_V6: &str = "Nomad's path never sets dual stack (consul.md §2.2), and Setup would refuse the IPv4 ConsulDNSIP under it";
const CIDR_V4_REFUSED: &str = "the IPv6 pass gives ip6tables the IPv4 ExcludeOutboundCIDRs, which it rejects: Setup fails under dual stack";

fn v6_of(v4: &str) -> String {
    let out = v4.replace("127.0.0.1/32", "::1/128");
    assert!(
        !out.split_whitespace().any(|w| w
            .split(['/', ':'])
            .next()
            .is_some_and(|a| a.parse::<std::net::Ipv4Addr>().is_ok())),
        "an IPv4 address is left in a derived IPv6 table:\n{out}"
    );
    out
}

const SDK: &str = "consul sdk/iptables/iptables_test.go";
const K8S_CNI: &str = "consul-k8s control-plane/cni/main_test.go";
const WEBHOOK: &str = "consul-k8s control-plane/connect-inject/webhook/redirect_traffic_test.go";

fn case(
    name: &str,
    source: &str,
    mapping: &str,
    cfg: Config,
    dual_stack: bool,
    v4: &str,
    v6: V6,
) -> Case {
    let uid: u32 = cfg.uid.parse().expect("numeric ProxyUserID");
    let annotations = ann(&[
        ("consul.hashicorp.com/connect-inject-status", "injected"),
        ("consul.hashicorp.com/transparent-proxy-status", "enabled"),
        ("consul.hashicorp.com/redirect-traffic-config", &cfg.json()),
        (
            "consul.hashicorp.com/dual-stack",
            if dual_stack { "true" } else { "false" },
        ),
    ]);
    Case {
        mesh: Mesh::Consul,
        name: name.into(),
        source: source.into(),
        mapping: mapping.into(),
        annotations,
        facts: pod_facts(
            "consul-connect-inject-init",
            "consul-dataplane",
            Some(uid.into()),
            Some(uid.into()),
            &[],
            &[],
        ),
        v4: MeshRules::Restore(v4.into()),
        v6: match v6 {
            V6::Derived => MeshRules::Restore(v6_of(v4)),
            V6::Listed(t) => MeshRules::Restore(t.into()),
            V6::Refused(why) => MeshRules::NotWritten(why.into()),
        },
        v6_condition: V6_CONDITION.into(),
        proxy_uid: uid,
        proxy_gid: Some(uid),
        extra_ports: vec![cfg.inbound, cfg.outbound, 21000],
    }
}

/// Every Consul case.
pub fn cases() -> Vec<Case> {
    let t = Config {
        uid: "123",
        inbound: 20000,
        ..Config::default()
    };
    let t21 = Config {
        outbound: 21000,
        ..t.clone()
    };
    let sdk4 = |k: &str| format!("{SDK} TestSetup_IPv4 {k}; IPv6: TestSetup_IPv6");
    let sdk_ds = |k: &str| format!("{SDK} TestSetup_IPv4_Dualstack and TestSetup_IPv6 {k}");
    const AS_ANNOTATION: &str = "the sdk test's Config as the redirect-traffic-config annotation";
    let w = Config {
        uid: "5995",
        inbound: 20000,
        outbound: 15001,
        exclude_uids: &["5996"],
        ..Config::default()
    };
    let mut v = vec![
        case(
            "S4.1",
            &sdk4("\"no proxy outbound port provided\""),
            AS_ANNOTATION,
            t.clone(),
            false,
            S4_1,
            V6::Derived,
        ),
        case(
            "S4.3",
            &sdk4("\"Consul DNS port provided\""),
            AS_ANNOTATION,
            Config {
                dns_port: 8600,
                ..t.clone()
            },
            false,
            S4_3,
            V6::Refused(DNS_V4_ONLY),
        ),
        case(
            "S4.5",
            &sdk4("\"proxy outbound port is provided\""),
            AS_ANNOTATION,
            t21.clone(),
            false,
            S4_5,
            V6::Derived,
        ),
        case(
            "S4.6",
            &sdk4("\"exclude inbound ports is set\""),
            AS_ANNOTATION,
            Config {
                exclude_inbound: &["22000", "22500"],
                ..t21.clone()
            },
            false,
            S4_6,
            V6::Derived,
        ),
        case(
            "S4.7",
            &sdk4("\"exclude outbound ports is set\""),
            AS_ANNOTATION,
            Config {
                exclude_outbound: &["22000", "22500"],
                ..t21.clone()
            },
            false,
            S4_7,
            V6::Derived,
        ),
        case(
            "S4.8",
            &sdk4("\"exclude outbound CIDRs is set\""),
            AS_ANNOTATION,
            Config {
                exclude_cidrs: &["1.1.1.1", "2.2.2.2/24"],
                ..t21.clone()
            },
            false,
            S4_8,
            V6::Refused(CIDR_V4_REFUSED),
        ),
        case(
            "S4.9",
            &sdk4("\"exclude UIDs is set\""),
            AS_ANNOTATION,
            Config {
                exclude_uids: &["456", "789"],
                ..t21.clone()
            },
            false,
            S4_9,
            V6::Derived,
        ),
    ];
    // Dual stack: the IPv4 pass writes no DNS rules (consul.md §4.4), so SD.1–SD.4 are one
    // table; SD.2/SD.4 (IPv4 DNS IP) and SD.8/S6.8 (one family's CIDRs) are refused by
    // Setup or by one of the two passes and map to no pod.
    const DS: &str = "the sdk test's Config as the annotation, dual-stack \"true\"";
    v.extend([
        case("SD.1", &sdk_ds("\"no proxy outbound port provided\""), DS, t.clone(), true, S4_1, V6::Derived),
        case("SD.3", &sdk_ds("\"Consul DNS port provided\""), DS, Config { dns_port: 8600, ..t.clone() }, true, S4_1, V6::Listed(S6_3)),
        case("SD.5", &sdk_ds("\"proxy outbound port is provided\""), DS, t21.clone(), true, S4_5, V6::Derived),
        case("SD.6", &sdk_ds("\"exclude inbound ports is set\""), DS, Config { exclude_inbound: &["22000", "22500"], ..t21.clone() }, true, S4_6, V6::Derived),
        case("SD.7", &sdk_ds("\"exclude outbound ports is set\""), DS, Config { exclude_outbound: &["22000", "22500"], ..t21.clone() }, true, S4_7, V6::Derived),
        case("SD.9", &sdk_ds("\"exclude UIDs is set\""), DS, Config { exclude_uids: &["456", "789"], ..t21.clone() }, true, S4_9, V6::Derived),
        case("C1", &format!("{K8S_CNI} Test_cmdAdd \"Pod with correct annotations\""), "the test pod's annotations (dual-stack not \"true\")", t.clone(), false, S4_1, V6::Derived),
        case("C2", &format!("{K8S_CNI} Test_cmdAdd \"Parsing iptables from CNI_ARGs as in Nomad\""),
            "the Nomad CNI_ARGS config (reconstructed from the sheet's table) as the annotation; Nomad never sets dual stack",
            Config { dns_ip: "127.0.0.1", dns_port: 8600, uid: "101", inbound: 20000, outbound: 15001, exclude_inbound: &["9000"], exclude_outbound: &["15002"], exclude_cidrs: &["10.0.0.0/24"], exclude_uids: &["1", "42"] },
            false, C2, V6::Refused(NOMAD_V6)),
        case("W1", &format!("{WEBHOOK} \"basic bare minimum pod\""), "webhook defaults: proxy 5995, init 5996 excluded", w.clone(), false, W1, V6::Derived),
        case("W2", &format!("{WEBHOOK} \"proxy health checks enabled\""), "use-proxy-health-check: excluded inbound 21000", Config { exclude_inbound: &["21000"], ..w.clone() }, false, W2, V6::Derived),
        case("W3", &format!("{WEBHOOK} \"metrics enabled\""), "enable-metrics, prometheus-scrape-port 13373", Config { exclude_inbound: &["13373"], ..w.clone() }, false, W3, V6::Derived),
        case("W5", &format!("{WEBHOOK} \"overwrite probes, transparent proxy annotation set\""), "one HTTP liveness probe: excluded inbound 20300", Config { exclude_inbound: &["20300"], ..w.clone() }, false, W5, V6::Derived),
        case("W6", &format!("{WEBHOOK} \"exclude inbound ports\""), "transparent-proxy-exclude-inbound-ports 1111,11111", Config { exclude_inbound: &["1111", "11111"], ..w.clone() }, false, W6, V6::Derived),
        case("W7", &format!("{WEBHOOK} \"exclude outbound ports\""), "transparent-proxy-exclude-outbound-ports 2222,22222", Config { exclude_outbound: &["2222", "22222"], ..w.clone() }, false, W7, V6::Derived),
        case("W8", &format!("{WEBHOOK} \"exclude outbound CIDRs\""), "transparent-proxy-exclude-outbound-cidrs 3.3.3.3,3.3.3.3/24", Config { exclude_cidrs: &["3.3.3.3", "3.3.3.3/24"], ..w.clone() }, false, W8, V6::Refused(CIDR_V4_REFUSED)),
        case("W9", &format!("{WEBHOOK} \"exclude UIDs\""), "transparent-proxy-exclude-uids 4444,44444 (after 5996)", Config { exclude_uids: &["5996", "4444", "44444"], ..w.clone() }, false, W9, V6::Derived),
        case("W10", &format!("{WEBHOOK} \"exclude inbound ports, outbound ports, outbound CIDRs, and UIDs\""), "the four exclusion annotations of W6-W9 together",
            Config { exclude_inbound: &["1111", "11111"], exclude_outbound: &["2222", "22222"], exclude_cidrs: &["3.3.3.3", "3.3.3.3/24"], exclude_uids: &["5996", "4444", "44444"], ..w.clone() },
            false, W10, V6::Refused(CIDR_V4_REFUSED)),
        case("W11", &format!("{WEBHOOK} TestRedirectTraffic_consulDNS (the four enabled cases)"), "Consul DNS enabled: ConsulDNSIP 127.0.0.1, ConsulDNSPort 8600",
            Config { dns_ip: "127.0.0.1", dns_port: 8600, ..w.clone() }, false, W11, V6::Refused(DNS_V4_REFUSED)),
        case("D1", "consul-k8s connect-inject/webhook/mesh_webhook.go, redirect_traffic.go (consul.md §5.4 D1, derived)", "default Helm CNI install, app with HTTP liveness and readiness probes: excluded inbound 20300, 20400",
            Config { exclude_inbound: &["20300", "20400"], ..w.clone() }, false, D1, V6::Derived),
        case("D2", "consul-k8s connect-inject/webhook/mesh_webhook.go, redirect_traffic.go (consul.md §5.4 D2, derived)",
            "D1 + metrics (20200), use-proxy-health-check (21000), Consul DNS, exclude inbound 8080 / outbound 5432 / CIDR 10.96.0.0/12 / UID 1234",
            Config { dns_ip: "127.0.0.1", dns_port: 8600, exclude_inbound: &["20200", "21000", "20300", "20400", "8080"], exclude_outbound: &["5432"], exclude_cidrs: &["10.96.0.0/12"], exclude_uids: &["5996", "1234"], ..w.clone() },
            false, D2, V6::Refused(DNS_V4_REFUSED)),
        case("D3", "consul-k8s connect-inject/webhook/mesh_webhook.go, redirect_traffic.go (consul.md §5.4 D3, derived)",
            "global.dualStack.enabled: dual-stack \"true\", Consul DNS on ::1:8600, probes as D1",
            Config { dns_ip: "::1", dns_port: 8600, exclude_inbound: &["20300", "20400"], ..w.clone() },
            true, D1, V6::Listed(D3_V6)),
    ]);
    v
}

/// consul.md S4.1, IPv4.
const S4_1: &str = "\
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CONSUL_DNS_REDIRECT - [0:0]
:CONSUL_PROXY_INBOUND - [0:0]
:CONSUL_PROXY_IN_REDIRECT - [0:0]
:CONSUL_PROXY_OUTPUT - [0:0]
:CONSUL_PROXY_REDIRECT - [0:0]
-A PREROUTING -p tcp -j CONSUL_PROXY_INBOUND
-A OUTPUT -p tcp -j CONSUL_PROXY_OUTPUT
-A CONSUL_PROXY_INBOUND -p tcp -j CONSUL_PROXY_IN_REDIRECT
-A CONSUL_PROXY_IN_REDIRECT -p tcp -j REDIRECT --to-ports 20000
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 123 -j RETURN
-A CONSUL_PROXY_OUTPUT -d 127.0.0.1/32 -j RETURN
-A CONSUL_PROXY_OUTPUT -j CONSUL_PROXY_REDIRECT
-A CONSUL_PROXY_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
";

/// consul.md S4.3, IPv4.
const S4_3: &str = "\
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CONSUL_DNS_REDIRECT - [0:0]
:CONSUL_PROXY_INBOUND - [0:0]
:CONSUL_PROXY_IN_REDIRECT - [0:0]
:CONSUL_PROXY_OUTPUT - [0:0]
:CONSUL_PROXY_REDIRECT - [0:0]
-A PREROUTING -p tcp -j CONSUL_PROXY_INBOUND
-A OUTPUT -d 127.0.0.1/32 -p udp -m udp --dport 53 -j CONSUL_DNS_REDIRECT
-A OUTPUT -d 127.0.0.1/32 -p tcp -m tcp --dport 53 -j CONSUL_DNS_REDIRECT
-A OUTPUT -p tcp -j CONSUL_PROXY_OUTPUT
-A CONSUL_DNS_REDIRECT -d 127.0.0.1/32 -p udp -m udp --dport 53 -j DNAT --to-destination 127.0.0.1:8600
-A CONSUL_DNS_REDIRECT -d 127.0.0.1/32 -p tcp -m tcp --dport 53 -j DNAT --to-destination 127.0.0.1:8600
-A CONSUL_PROXY_INBOUND -p tcp -j CONSUL_PROXY_IN_REDIRECT
-A CONSUL_PROXY_IN_REDIRECT -p tcp -j REDIRECT --to-ports 20000
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 123 -j RETURN
-A CONSUL_PROXY_OUTPUT -d 127.0.0.1/32 -j RETURN
-A CONSUL_PROXY_OUTPUT -j CONSUL_PROXY_REDIRECT
-A CONSUL_PROXY_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
";

/// consul.md S4.5, IPv4.
const S4_5: &str = "\
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CONSUL_DNS_REDIRECT - [0:0]
:CONSUL_PROXY_INBOUND - [0:0]
:CONSUL_PROXY_IN_REDIRECT - [0:0]
:CONSUL_PROXY_OUTPUT - [0:0]
:CONSUL_PROXY_REDIRECT - [0:0]
-A PREROUTING -p tcp -j CONSUL_PROXY_INBOUND
-A OUTPUT -p tcp -j CONSUL_PROXY_OUTPUT
-A CONSUL_PROXY_INBOUND -p tcp -j CONSUL_PROXY_IN_REDIRECT
-A CONSUL_PROXY_IN_REDIRECT -p tcp -j REDIRECT --to-ports 20000
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 123 -j RETURN
-A CONSUL_PROXY_OUTPUT -d 127.0.0.1/32 -j RETURN
-A CONSUL_PROXY_OUTPUT -j CONSUL_PROXY_REDIRECT
-A CONSUL_PROXY_REDIRECT -p tcp -j REDIRECT --to-ports 21000
COMMIT
";

/// consul.md S4.6, IPv4.
const S4_6: &str = "\
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CONSUL_DNS_REDIRECT - [0:0]
:CONSUL_PROXY_INBOUND - [0:0]
:CONSUL_PROXY_IN_REDIRECT - [0:0]
:CONSUL_PROXY_OUTPUT - [0:0]
:CONSUL_PROXY_REDIRECT - [0:0]
-A PREROUTING -p tcp -j CONSUL_PROXY_INBOUND
-A OUTPUT -p tcp -j CONSUL_PROXY_OUTPUT
-A CONSUL_PROXY_INBOUND -p tcp -m tcp --dport 22500 -j RETURN
-A CONSUL_PROXY_INBOUND -p tcp -m tcp --dport 22000 -j RETURN
-A CONSUL_PROXY_INBOUND -p tcp -j CONSUL_PROXY_IN_REDIRECT
-A CONSUL_PROXY_IN_REDIRECT -p tcp -j REDIRECT --to-ports 20000
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 123 -j RETURN
-A CONSUL_PROXY_OUTPUT -d 127.0.0.1/32 -j RETURN
-A CONSUL_PROXY_OUTPUT -j CONSUL_PROXY_REDIRECT
-A CONSUL_PROXY_REDIRECT -p tcp -j REDIRECT --to-ports 21000
COMMIT
";

/// consul.md S4.7, IPv4.
const S4_7: &str = "\
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CONSUL_DNS_REDIRECT - [0:0]
:CONSUL_PROXY_INBOUND - [0:0]
:CONSUL_PROXY_IN_REDIRECT - [0:0]
:CONSUL_PROXY_OUTPUT - [0:0]
:CONSUL_PROXY_REDIRECT - [0:0]
-A PREROUTING -p tcp -j CONSUL_PROXY_INBOUND
-A OUTPUT -p tcp -j CONSUL_PROXY_OUTPUT
-A CONSUL_PROXY_INBOUND -p tcp -j CONSUL_PROXY_IN_REDIRECT
-A CONSUL_PROXY_IN_REDIRECT -p tcp -j REDIRECT --to-ports 20000
-A CONSUL_PROXY_OUTPUT -p tcp -m tcp --dport 22500 -j RETURN
-A CONSUL_PROXY_OUTPUT -p tcp -m tcp --dport 22000 -j RETURN
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 123 -j RETURN
-A CONSUL_PROXY_OUTPUT -d 127.0.0.1/32 -j RETURN
-A CONSUL_PROXY_OUTPUT -j CONSUL_PROXY_REDIRECT
-A CONSUL_PROXY_REDIRECT -p tcp -j REDIRECT --to-ports 21000
COMMIT
";

/// consul.md S4.8, IPv4.
const S4_8: &str = "\
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CONSUL_DNS_REDIRECT - [0:0]
:CONSUL_PROXY_INBOUND - [0:0]
:CONSUL_PROXY_IN_REDIRECT - [0:0]
:CONSUL_PROXY_OUTPUT - [0:0]
:CONSUL_PROXY_REDIRECT - [0:0]
-A PREROUTING -p tcp -j CONSUL_PROXY_INBOUND
-A OUTPUT -p tcp -j CONSUL_PROXY_OUTPUT
-A CONSUL_PROXY_INBOUND -p tcp -j CONSUL_PROXY_IN_REDIRECT
-A CONSUL_PROXY_IN_REDIRECT -p tcp -j REDIRECT --to-ports 20000
-A CONSUL_PROXY_OUTPUT -d 2.2.2.0/24 -j RETURN
-A CONSUL_PROXY_OUTPUT -d 1.1.1.1/32 -j RETURN
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 123 -j RETURN
-A CONSUL_PROXY_OUTPUT -d 127.0.0.1/32 -j RETURN
-A CONSUL_PROXY_OUTPUT -j CONSUL_PROXY_REDIRECT
-A CONSUL_PROXY_REDIRECT -p tcp -j REDIRECT --to-ports 21000
COMMIT
";

/// consul.md S4.9, IPv4.
const S4_9: &str = "\
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CONSUL_DNS_REDIRECT - [0:0]
:CONSUL_PROXY_INBOUND - [0:0]
:CONSUL_PROXY_IN_REDIRECT - [0:0]
:CONSUL_PROXY_OUTPUT - [0:0]
:CONSUL_PROXY_REDIRECT - [0:0]
-A PREROUTING -p tcp -j CONSUL_PROXY_INBOUND
-A OUTPUT -p tcp -j CONSUL_PROXY_OUTPUT
-A CONSUL_PROXY_INBOUND -p tcp -j CONSUL_PROXY_IN_REDIRECT
-A CONSUL_PROXY_IN_REDIRECT -p tcp -j REDIRECT --to-ports 20000
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 789 -j RETURN
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 456 -j RETURN
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 123 -j RETURN
-A CONSUL_PROXY_OUTPUT -d 127.0.0.1/32 -j RETURN
-A CONSUL_PROXY_OUTPUT -j CONSUL_PROXY_REDIRECT
-A CONSUL_PROXY_REDIRECT -p tcp -j REDIRECT --to-ports 21000
COMMIT
";

/// consul.md S6.3, IPv6.
const S6_3: &str = "\
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CONSUL_DNS_REDIRECT - [0:0]
:CONSUL_PROXY_INBOUND - [0:0]
:CONSUL_PROXY_IN_REDIRECT - [0:0]
:CONSUL_PROXY_OUTPUT - [0:0]
:CONSUL_PROXY_REDIRECT - [0:0]
-A PREROUTING -p tcp -j CONSUL_PROXY_INBOUND
-A OUTPUT -d ::1/128 -p udp -m udp --dport 53 -j CONSUL_DNS_REDIRECT
-A OUTPUT -d ::1/128 -p tcp -m tcp --dport 53 -j CONSUL_DNS_REDIRECT
-A OUTPUT -p tcp -j CONSUL_PROXY_OUTPUT
-A CONSUL_DNS_REDIRECT -d ::1/128 -p udp -m udp --dport 53 -j DNAT --to-destination [::1]:8600
-A CONSUL_DNS_REDIRECT -d ::1/128 -p tcp -m tcp --dport 53 -j DNAT --to-destination [::1]:8600
-A CONSUL_PROXY_INBOUND -p tcp -j CONSUL_PROXY_IN_REDIRECT
-A CONSUL_PROXY_IN_REDIRECT -p tcp -j REDIRECT --to-ports 20000
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 123 -j RETURN
-A CONSUL_PROXY_OUTPUT -d ::1/128 -j RETURN
-A CONSUL_PROXY_OUTPUT -j CONSUL_PROXY_REDIRECT
-A CONSUL_PROXY_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
";

/// consul.md C2, IPv4.
const C2: &str = "\
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CONSUL_DNS_REDIRECT - [0:0]
:CONSUL_PROXY_INBOUND - [0:0]
:CONSUL_PROXY_IN_REDIRECT - [0:0]
:CONSUL_PROXY_OUTPUT - [0:0]
:CONSUL_PROXY_REDIRECT - [0:0]
-A PREROUTING -p tcp -j CONSUL_PROXY_INBOUND
-A OUTPUT -d 127.0.0.1/32 -p udp -m udp --dport 53 -j CONSUL_DNS_REDIRECT
-A OUTPUT -d 127.0.0.1/32 -p tcp -m tcp --dport 53 -j CONSUL_DNS_REDIRECT
-A OUTPUT -p tcp -j CONSUL_PROXY_OUTPUT
-A CONSUL_DNS_REDIRECT -d 127.0.0.1/32 -p udp -m udp --dport 53 -j DNAT --to-destination 127.0.0.1:8600
-A CONSUL_DNS_REDIRECT -d 127.0.0.1/32 -p tcp -m tcp --dport 53 -j DNAT --to-destination 127.0.0.1:8600
-A CONSUL_PROXY_INBOUND -p tcp -m tcp --dport 9000 -j RETURN
-A CONSUL_PROXY_INBOUND -p tcp -j CONSUL_PROXY_IN_REDIRECT
-A CONSUL_PROXY_IN_REDIRECT -p tcp -j REDIRECT --to-ports 20000
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 42 -j RETURN
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 1 -j RETURN
-A CONSUL_PROXY_OUTPUT -d 10.0.0.0/24 -j RETURN
-A CONSUL_PROXY_OUTPUT -p tcp -m tcp --dport 15002 -j RETURN
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 101 -j RETURN
-A CONSUL_PROXY_OUTPUT -d 127.0.0.1/32 -j RETURN
-A CONSUL_PROXY_OUTPUT -j CONSUL_PROXY_REDIRECT
-A CONSUL_PROXY_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
";

/// consul.md W1, IPv4.
const W1: &str = "\
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CONSUL_DNS_REDIRECT - [0:0]
:CONSUL_PROXY_INBOUND - [0:0]
:CONSUL_PROXY_IN_REDIRECT - [0:0]
:CONSUL_PROXY_OUTPUT - [0:0]
:CONSUL_PROXY_REDIRECT - [0:0]
-A PREROUTING -p tcp -j CONSUL_PROXY_INBOUND
-A OUTPUT -p tcp -j CONSUL_PROXY_OUTPUT
-A CONSUL_PROXY_INBOUND -p tcp -j CONSUL_PROXY_IN_REDIRECT
-A CONSUL_PROXY_IN_REDIRECT -p tcp -j REDIRECT --to-ports 20000
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 5996 -j RETURN
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 5995 -j RETURN
-A CONSUL_PROXY_OUTPUT -d 127.0.0.1/32 -j RETURN
-A CONSUL_PROXY_OUTPUT -j CONSUL_PROXY_REDIRECT
-A CONSUL_PROXY_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
";

/// consul.md W2, IPv4.
const W2: &str = "\
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CONSUL_DNS_REDIRECT - [0:0]
:CONSUL_PROXY_INBOUND - [0:0]
:CONSUL_PROXY_IN_REDIRECT - [0:0]
:CONSUL_PROXY_OUTPUT - [0:0]
:CONSUL_PROXY_REDIRECT - [0:0]
-A PREROUTING -p tcp -j CONSUL_PROXY_INBOUND
-A OUTPUT -p tcp -j CONSUL_PROXY_OUTPUT
-A CONSUL_PROXY_INBOUND -p tcp -m tcp --dport 21000 -j RETURN
-A CONSUL_PROXY_INBOUND -p tcp -j CONSUL_PROXY_IN_REDIRECT
-A CONSUL_PROXY_IN_REDIRECT -p tcp -j REDIRECT --to-ports 20000
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 5996 -j RETURN
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 5995 -j RETURN
-A CONSUL_PROXY_OUTPUT -d 127.0.0.1/32 -j RETURN
-A CONSUL_PROXY_OUTPUT -j CONSUL_PROXY_REDIRECT
-A CONSUL_PROXY_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
";

/// consul.md W3, IPv4.
const W3: &str = "\
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CONSUL_DNS_REDIRECT - [0:0]
:CONSUL_PROXY_INBOUND - [0:0]
:CONSUL_PROXY_IN_REDIRECT - [0:0]
:CONSUL_PROXY_OUTPUT - [0:0]
:CONSUL_PROXY_REDIRECT - [0:0]
-A PREROUTING -p tcp -j CONSUL_PROXY_INBOUND
-A OUTPUT -p tcp -j CONSUL_PROXY_OUTPUT
-A CONSUL_PROXY_INBOUND -p tcp -m tcp --dport 13373 -j RETURN
-A CONSUL_PROXY_INBOUND -p tcp -j CONSUL_PROXY_IN_REDIRECT
-A CONSUL_PROXY_IN_REDIRECT -p tcp -j REDIRECT --to-ports 20000
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 5996 -j RETURN
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 5995 -j RETURN
-A CONSUL_PROXY_OUTPUT -d 127.0.0.1/32 -j RETURN
-A CONSUL_PROXY_OUTPUT -j CONSUL_PROXY_REDIRECT
-A CONSUL_PROXY_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
";

/// consul.md W5, IPv4.
const W5: &str = "\
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CONSUL_DNS_REDIRECT - [0:0]
:CONSUL_PROXY_INBOUND - [0:0]
:CONSUL_PROXY_IN_REDIRECT - [0:0]
:CONSUL_PROXY_OUTPUT - [0:0]
:CONSUL_PROXY_REDIRECT - [0:0]
-A PREROUTING -p tcp -j CONSUL_PROXY_INBOUND
-A OUTPUT -p tcp -j CONSUL_PROXY_OUTPUT
-A CONSUL_PROXY_INBOUND -p tcp -m tcp --dport 20300 -j RETURN
-A CONSUL_PROXY_INBOUND -p tcp -j CONSUL_PROXY_IN_REDIRECT
-A CONSUL_PROXY_IN_REDIRECT -p tcp -j REDIRECT --to-ports 20000
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 5996 -j RETURN
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 5995 -j RETURN
-A CONSUL_PROXY_OUTPUT -d 127.0.0.1/32 -j RETURN
-A CONSUL_PROXY_OUTPUT -j CONSUL_PROXY_REDIRECT
-A CONSUL_PROXY_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
";

/// consul.md W6, IPv4.
const W6: &str = "\
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CONSUL_DNS_REDIRECT - [0:0]
:CONSUL_PROXY_INBOUND - [0:0]
:CONSUL_PROXY_IN_REDIRECT - [0:0]
:CONSUL_PROXY_OUTPUT - [0:0]
:CONSUL_PROXY_REDIRECT - [0:0]
-A PREROUTING -p tcp -j CONSUL_PROXY_INBOUND
-A OUTPUT -p tcp -j CONSUL_PROXY_OUTPUT
-A CONSUL_PROXY_INBOUND -p tcp -m tcp --dport 11111 -j RETURN
-A CONSUL_PROXY_INBOUND -p tcp -m tcp --dport 1111 -j RETURN
-A CONSUL_PROXY_INBOUND -p tcp -j CONSUL_PROXY_IN_REDIRECT
-A CONSUL_PROXY_IN_REDIRECT -p tcp -j REDIRECT --to-ports 20000
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 5996 -j RETURN
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 5995 -j RETURN
-A CONSUL_PROXY_OUTPUT -d 127.0.0.1/32 -j RETURN
-A CONSUL_PROXY_OUTPUT -j CONSUL_PROXY_REDIRECT
-A CONSUL_PROXY_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
";

/// consul.md W7, IPv4.
const W7: &str = "\
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CONSUL_DNS_REDIRECT - [0:0]
:CONSUL_PROXY_INBOUND - [0:0]
:CONSUL_PROXY_IN_REDIRECT - [0:0]
:CONSUL_PROXY_OUTPUT - [0:0]
:CONSUL_PROXY_REDIRECT - [0:0]
-A PREROUTING -p tcp -j CONSUL_PROXY_INBOUND
-A OUTPUT -p tcp -j CONSUL_PROXY_OUTPUT
-A CONSUL_PROXY_INBOUND -p tcp -j CONSUL_PROXY_IN_REDIRECT
-A CONSUL_PROXY_IN_REDIRECT -p tcp -j REDIRECT --to-ports 20000
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 5996 -j RETURN
-A CONSUL_PROXY_OUTPUT -p tcp -m tcp --dport 22222 -j RETURN
-A CONSUL_PROXY_OUTPUT -p tcp -m tcp --dport 2222 -j RETURN
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 5995 -j RETURN
-A CONSUL_PROXY_OUTPUT -d 127.0.0.1/32 -j RETURN
-A CONSUL_PROXY_OUTPUT -j CONSUL_PROXY_REDIRECT
-A CONSUL_PROXY_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
";

/// consul.md W8, IPv4.
const W8: &str = "\
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CONSUL_DNS_REDIRECT - [0:0]
:CONSUL_PROXY_INBOUND - [0:0]
:CONSUL_PROXY_IN_REDIRECT - [0:0]
:CONSUL_PROXY_OUTPUT - [0:0]
:CONSUL_PROXY_REDIRECT - [0:0]
-A PREROUTING -p tcp -j CONSUL_PROXY_INBOUND
-A OUTPUT -p tcp -j CONSUL_PROXY_OUTPUT
-A CONSUL_PROXY_INBOUND -p tcp -j CONSUL_PROXY_IN_REDIRECT
-A CONSUL_PROXY_IN_REDIRECT -p tcp -j REDIRECT --to-ports 20000
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 5996 -j RETURN
-A CONSUL_PROXY_OUTPUT -d 3.3.3.0/24 -j RETURN
-A CONSUL_PROXY_OUTPUT -d 3.3.3.3/32 -j RETURN
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 5995 -j RETURN
-A CONSUL_PROXY_OUTPUT -d 127.0.0.1/32 -j RETURN
-A CONSUL_PROXY_OUTPUT -j CONSUL_PROXY_REDIRECT
-A CONSUL_PROXY_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
";

/// consul.md W9, IPv4.
const W9: &str = "\
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CONSUL_DNS_REDIRECT - [0:0]
:CONSUL_PROXY_INBOUND - [0:0]
:CONSUL_PROXY_IN_REDIRECT - [0:0]
:CONSUL_PROXY_OUTPUT - [0:0]
:CONSUL_PROXY_REDIRECT - [0:0]
-A PREROUTING -p tcp -j CONSUL_PROXY_INBOUND
-A OUTPUT -p tcp -j CONSUL_PROXY_OUTPUT
-A CONSUL_PROXY_INBOUND -p tcp -j CONSUL_PROXY_IN_REDIRECT
-A CONSUL_PROXY_IN_REDIRECT -p tcp -j REDIRECT --to-ports 20000
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 44444 -j RETURN
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 4444 -j RETURN
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 5996 -j RETURN
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 5995 -j RETURN
-A CONSUL_PROXY_OUTPUT -d 127.0.0.1/32 -j RETURN
-A CONSUL_PROXY_OUTPUT -j CONSUL_PROXY_REDIRECT
-A CONSUL_PROXY_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
";

/// consul.md W10, IPv4.
const W10: &str = "\
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CONSUL_DNS_REDIRECT - [0:0]
:CONSUL_PROXY_INBOUND - [0:0]
:CONSUL_PROXY_IN_REDIRECT - [0:0]
:CONSUL_PROXY_OUTPUT - [0:0]
:CONSUL_PROXY_REDIRECT - [0:0]
-A PREROUTING -p tcp -j CONSUL_PROXY_INBOUND
-A OUTPUT -p tcp -j CONSUL_PROXY_OUTPUT
-A CONSUL_PROXY_INBOUND -p tcp -m tcp --dport 11111 -j RETURN
-A CONSUL_PROXY_INBOUND -p tcp -m tcp --dport 1111 -j RETURN
-A CONSUL_PROXY_INBOUND -p tcp -j CONSUL_PROXY_IN_REDIRECT
-A CONSUL_PROXY_IN_REDIRECT -p tcp -j REDIRECT --to-ports 20000
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 44444 -j RETURN
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 4444 -j RETURN
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 5996 -j RETURN
-A CONSUL_PROXY_OUTPUT -d 3.3.3.0/24 -j RETURN
-A CONSUL_PROXY_OUTPUT -d 3.3.3.3/32 -j RETURN
-A CONSUL_PROXY_OUTPUT -p tcp -m tcp --dport 22222 -j RETURN
-A CONSUL_PROXY_OUTPUT -p tcp -m tcp --dport 2222 -j RETURN
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 5995 -j RETURN
-A CONSUL_PROXY_OUTPUT -d 127.0.0.1/32 -j RETURN
-A CONSUL_PROXY_OUTPUT -j CONSUL_PROXY_REDIRECT
-A CONSUL_PROXY_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
";

/// consul.md W11, IPv4.
const W11: &str = "\
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CONSUL_DNS_REDIRECT - [0:0]
:CONSUL_PROXY_INBOUND - [0:0]
:CONSUL_PROXY_IN_REDIRECT - [0:0]
:CONSUL_PROXY_OUTPUT - [0:0]
:CONSUL_PROXY_REDIRECT - [0:0]
-A PREROUTING -p tcp -j CONSUL_PROXY_INBOUND
-A OUTPUT -d 127.0.0.1/32 -p udp -m udp --dport 53 -j CONSUL_DNS_REDIRECT
-A OUTPUT -d 127.0.0.1/32 -p tcp -m tcp --dport 53 -j CONSUL_DNS_REDIRECT
-A OUTPUT -p tcp -j CONSUL_PROXY_OUTPUT
-A CONSUL_DNS_REDIRECT -d 127.0.0.1/32 -p udp -m udp --dport 53 -j DNAT --to-destination 127.0.0.1:8600
-A CONSUL_DNS_REDIRECT -d 127.0.0.1/32 -p tcp -m tcp --dport 53 -j DNAT --to-destination 127.0.0.1:8600
-A CONSUL_PROXY_INBOUND -p tcp -j CONSUL_PROXY_IN_REDIRECT
-A CONSUL_PROXY_IN_REDIRECT -p tcp -j REDIRECT --to-ports 20000
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 5996 -j RETURN
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 5995 -j RETURN
-A CONSUL_PROXY_OUTPUT -d 127.0.0.1/32 -j RETURN
-A CONSUL_PROXY_OUTPUT -j CONSUL_PROXY_REDIRECT
-A CONSUL_PROXY_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
";

/// consul.md D1, IPv4.
const D1: &str = "\
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CONSUL_DNS_REDIRECT - [0:0]
:CONSUL_PROXY_INBOUND - [0:0]
:CONSUL_PROXY_IN_REDIRECT - [0:0]
:CONSUL_PROXY_OUTPUT - [0:0]
:CONSUL_PROXY_REDIRECT - [0:0]
-A PREROUTING -p tcp -j CONSUL_PROXY_INBOUND
-A OUTPUT -p tcp -j CONSUL_PROXY_OUTPUT
-A CONSUL_PROXY_INBOUND -p tcp -m tcp --dport 20400 -j RETURN
-A CONSUL_PROXY_INBOUND -p tcp -m tcp --dport 20300 -j RETURN
-A CONSUL_PROXY_INBOUND -p tcp -j CONSUL_PROXY_IN_REDIRECT
-A CONSUL_PROXY_IN_REDIRECT -p tcp -j REDIRECT --to-ports 20000
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 5996 -j RETURN
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 5995 -j RETURN
-A CONSUL_PROXY_OUTPUT -d 127.0.0.1/32 -j RETURN
-A CONSUL_PROXY_OUTPUT -j CONSUL_PROXY_REDIRECT
-A CONSUL_PROXY_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
";

/// consul.md D2, IPv4.
const D2: &str = "\
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CONSUL_DNS_REDIRECT - [0:0]
:CONSUL_PROXY_INBOUND - [0:0]
:CONSUL_PROXY_IN_REDIRECT - [0:0]
:CONSUL_PROXY_OUTPUT - [0:0]
:CONSUL_PROXY_REDIRECT - [0:0]
-A PREROUTING -p tcp -j CONSUL_PROXY_INBOUND
-A OUTPUT -d 127.0.0.1/32 -p udp -m udp --dport 53 -j CONSUL_DNS_REDIRECT
-A OUTPUT -d 127.0.0.1/32 -p tcp -m tcp --dport 53 -j CONSUL_DNS_REDIRECT
-A OUTPUT -p tcp -j CONSUL_PROXY_OUTPUT
-A CONSUL_DNS_REDIRECT -d 127.0.0.1/32 -p udp -m udp --dport 53 -j DNAT --to-destination 127.0.0.1:8600
-A CONSUL_DNS_REDIRECT -d 127.0.0.1/32 -p tcp -m tcp --dport 53 -j DNAT --to-destination 127.0.0.1:8600
-A CONSUL_PROXY_INBOUND -p tcp -m tcp --dport 8080 -j RETURN
-A CONSUL_PROXY_INBOUND -p tcp -m tcp --dport 20400 -j RETURN
-A CONSUL_PROXY_INBOUND -p tcp -m tcp --dport 20300 -j RETURN
-A CONSUL_PROXY_INBOUND -p tcp -m tcp --dport 21000 -j RETURN
-A CONSUL_PROXY_INBOUND -p tcp -m tcp --dport 20200 -j RETURN
-A CONSUL_PROXY_INBOUND -p tcp -j CONSUL_PROXY_IN_REDIRECT
-A CONSUL_PROXY_IN_REDIRECT -p tcp -j REDIRECT --to-ports 20000
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 1234 -j RETURN
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 5996 -j RETURN
-A CONSUL_PROXY_OUTPUT -d 10.96.0.0/12 -j RETURN
-A CONSUL_PROXY_OUTPUT -p tcp -m tcp --dport 5432 -j RETURN
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 5995 -j RETURN
-A CONSUL_PROXY_OUTPUT -d 127.0.0.1/32 -j RETURN
-A CONSUL_PROXY_OUTPUT -j CONSUL_PROXY_REDIRECT
-A CONSUL_PROXY_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
";

/// consul.md D3 (IPv6), IPv6.
const D3_V6: &str = "\
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CONSUL_DNS_REDIRECT - [0:0]
:CONSUL_PROXY_INBOUND - [0:0]
:CONSUL_PROXY_IN_REDIRECT - [0:0]
:CONSUL_PROXY_OUTPUT - [0:0]
:CONSUL_PROXY_REDIRECT - [0:0]
-A PREROUTING -p tcp -j CONSUL_PROXY_INBOUND
-A OUTPUT -d ::1/128 -p udp -m udp --dport 53 -j CONSUL_DNS_REDIRECT
-A OUTPUT -d ::1/128 -p tcp -m tcp --dport 53 -j CONSUL_DNS_REDIRECT
-A OUTPUT -p tcp -j CONSUL_PROXY_OUTPUT
-A CONSUL_DNS_REDIRECT -d ::1/128 -p udp -m udp --dport 53 -j DNAT --to-destination [::1]:8600
-A CONSUL_DNS_REDIRECT -d ::1/128 -p tcp -m tcp --dport 53 -j DNAT --to-destination [::1]:8600
-A CONSUL_PROXY_INBOUND -p tcp -m tcp --dport 20400 -j RETURN
-A CONSUL_PROXY_INBOUND -p tcp -m tcp --dport 20300 -j RETURN
-A CONSUL_PROXY_INBOUND -p tcp -j CONSUL_PROXY_IN_REDIRECT
-A CONSUL_PROXY_IN_REDIRECT -p tcp -j REDIRECT --to-ports 20000
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 5996 -j RETURN
-A CONSUL_PROXY_OUTPUT -m owner --uid-owner 5995 -j RETURN
-A CONSUL_PROXY_OUTPUT -d ::1/128 -j RETURN
-A CONSUL_PROXY_OUTPUT -j CONSUL_PROXY_REDIRECT
-A CONSUL_PROXY_REDIRECT -p tcp -j REDIRECT --to-ports 15001
COMMIT
";

/// Upstream configurations with no case, and why.
pub fn not_mapped() -> Vec<(&'static str, &'static str)> {
    vec![
        (SDK, "S4.10 / SD.10 / S6.10 \"additional rules are passed\": the AdditionalRulesFn hook is ECS's; the CNI plugin never passes it (rules otherwise those of S4.9)"),
        (SDK, "SD.2, SD.4 and S6.2: an IPv4 ConsulDNSIP under dual stack, which Setup refuses (and ip6tables would reject a DNAT to it)"),
        (SDK, "S4.2, S4.4, S6.4 \"Consul DNS IP provided\" / \"… IP and port provided\": a DNAT of DNS to a resolver that is not the pod's loopback (10.0.34.16, 2406:da1a:…); interlock sends DNS only to the proxy's own listener and refuses such a config (consul-k8s's injector only ever writes 127.0.0.1 or ::1 with port 8600)"),
        (SDK, "SD.8 / S6.8: ExcludeOutboundCIDRs of one family under dual stack: the other family's pass hands them to its tool, which rejects them, and Setup fails"),
        (SDK, "TestSetup_errors, TestVerifyDualStackConfig's errors (consul.md D4-D6): configurations Setup refuses; no rules to compare (interlock must refuse such a pod too)"),
        (K8S_CNI, "Test_cmdAdd error cases (no pod name, no container IPs, unparsable annotation): plugin errors, no rules"),
        (WEBHOOK, "W4 \"metrics enabled with incorrect annotation\": the webhook refuses the pod, no annotation is written"),
    ]
}

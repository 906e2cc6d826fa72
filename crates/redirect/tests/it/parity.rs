//! Parity with the meshes' own rules, proven differentially.
//!
//! For every case — a pod configuration taken from Istio's, Linkerd's and Consul's own
//! rule-generation tests and code (`testing/mesh-cases`, each naming its upstream file) —
//! the rules the mesh writes are loaded with `iptables-restore` into the pod netns of one
//! closed topology, and interlock's rules for the same pod (its annotations and spec facts
//! as the mesh's CNI plugin sees them) into another, once per backend. The same probes run
//! on every side — TCP and UDP from the pod as the app, root, the proxy's UID and GID, to
//! loopback, 127.0.0.6, the pod itself, the gateway, hosts inside and outside every range
//! the rules name, on every port they name; TCP from the node to the pod from inside and
//! outside every source range — and each reports where it landed (which listener in the
//! pod, with its original destination, or the node's catch-all with the destination it
//! carried). Any probe that lands differently is a disagreement; the test prints one row
//! per case × backend × family and fails on any. `INTERLOCK_PARITY_REPORT=<file>` writes
//! the same table as Markdown, with the disagreements grouped by pattern and the upstream
//! configurations that have no case. Knobs: `INTERLOCK_PARITY_CASES=istio/dns,consul/W`
//! (substrings of the cases to run), `INTERLOCK_PARITY_JOBS` (sides at once, default 4),
//! `INTERLOCK_PARITY_SHOW` (disagreeing probes listed per row), `INTERLOCK_PARITY_SELF=1`
//! (the mesh's rules on every side: the harness against itself), `INTERLOCK_PARITY_DEBUG=1`
//! (each side's time).
//!
//! The other tests: the harness agrees with itself (the mesh's rules on both sides, and
//! the mesh's rules sending known probes where the fact sheets say); the meshes'
//! validators (`istio-validation`, `linkerd-network-validator`) pass against interlock's
//! rules on every backend; a real DNS query is captured as Istio and Consul capture it.

#[path = "parity/case.rs"]
mod case;
#[path = "parity/cases.rs"]
mod cases;
#[path = "parity/dns.rs"]
mod dns;
#[path = "parity/landing.rs"]
mod landing;
#[path = "parity/net.rs"]
mod net;
#[path = "parity/probe.rs"]
mod probe;
#[path = "parity/report.rs"]
mod report;
#[path = "parity/run.rs"]
mod run;
#[path = "parity/side.rs"]
mod side;
#[path = "parity/topology.rs"]
mod topology;
#[path = "parity/validators.rs"]
mod validators;

use std::net::{Ipv4Addr, SocketAddr};

use interlock_testkit::require_root;

use landing::Landing;
use net::{Creds, Proto};
use run::{run, Against, Outcome};
use side::on_each_side;
use topology::{NodeSetup, GW4, GW6};

/// How many disagreeing probes each row lists in the printed table and in the Markdown
/// report (all are counted): `INTERLOCK_PARITY_SHOW` for both, else 12 and 80.
fn shown_per_row() -> (usize, usize) {
    match std::env::var("INTERLOCK_PARITY_SHOW")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        Some(n) => (n, n),
        None => (12, 80),
    }
}

fn timing(o: &Outcome) -> String {
    format!(
        "{} cases, {} sides, {} probes sent, {:.1} s wall ({:.2} s per side on average, {} workers)",
        o.mesh.len(),
        o.sides,
        o.probes_sent,
        o.wall.as_secs_f64(),
        o.side_time.as_secs_f64() / o.sides.max(1) as f64,
        std::env::var("INTERLOCK_PARITY_JOBS").unwrap_or_else(|_| "4".into()),
    )
}

fn print_and_write(o: &Outcome, title: &str) {
    println!("{title}: {}", timing(o));
    let (text_rows, md_rows) = shown_per_row();
    println!("{}", report::text(&o.rows, text_rows));
    let patterns = report::patterns(&o.rows);
    if !patterns.is_empty() {
        println!("disagreements by pattern (probes, rows):");
        for (k, ports, n, rows) in patterns.iter().take(60) {
            println!("  {n:>5} {rows:>4}  {k}  [ports {ports}]");
        }
        if patterns.len() > 60 {
            println!("  … and {} more patterns", patterns.len() - 60);
        }
    }
    let cases: Vec<case::Case> = o.mesh.iter().map(|(c, _, _)| c.clone()).collect();
    if let Ok(path) = std::env::var("INTERLOCK_PARITY_REPORT") {
        let md = report::markdown(&o.rows, &cases, md_rows, &timing(o));
        std::fs::write(&path, md).unwrap_or_else(|e| panic!("write {path}: {e}"));
        println!("report written to {path}");
    }
}

fn summary(rows: &[report::Row]) -> String {
    let bad: Vec<String> = rows
        .iter()
        .filter(|r| !r.ok())
        .map(|r| {
            format!(
                "{} {} {}: {}/{} agree{}",
                r.case,
                r.backend,
                r.family,
                r.agreeing,
                r.probes,
                match &r.verdict {
                    report::Verdict::Refused(e) => format!(" (refused: {e})"),
                    _ => String::new(),
                }
            )
        })
        .collect();
    format!(
        "{} of {} rows disagree:\n{}",
        bad.len(),
        rows.len(),
        bad.join("\n")
    )
}

/// Every case, interlock against the mesh, on every backend and both families.
#[test]
fn interlock_lands_every_probe_where_the_mesh_does() {
    require_root!();
    // INTERLOCK_PARITY_SELF=1 puts the mesh's rules on the other sides too: the whole
    // harness checked against itself.
    let against = if std::env::var_os("INTERLOCK_PARITY_SELF").is_some() {
        Against::Itself
    } else {
        Against::Interlock
    };
    let o = run(cases::all(), against);
    print_and_write(&o, "parity");
    assert!(o.rows.iter().all(report::Row::ok), "{}", summary(&o.rows));
}

/// Where a probe of a case landed on the mesh's side.
fn landed(o: &Outcome, case: &str, probe: &str) -> Landing {
    let (_, plan, side) = o
        .mesh
        .iter()
        .find(|(c, _, _)| c.id() == case)
        .unwrap_or_else(|| panic!("case {case} not run"));
    let i = plan
        .probes
        .iter()
        .position(|p| p.to_string() == probe)
        .unwrap_or_else(|| panic!("{case}: no probe {probe:?}"));
    side.landings[i].clone()
}

fn pod(local: &str, orig: Option<&str>) -> Landing {
    Landing::Pod {
        local: local.parse().unwrap(),
        orig: orig.map(|o| o.parse::<SocketAddr>().unwrap()),
    }
}

fn node(dst: &str) -> Landing {
    Landing::Node {
        dst: dst.parse().unwrap(),
    }
}

/// The harness measures the rules and nothing else: the mesh's rules on both sides agree
/// on every probe, and the mesh's rules send probes where the fact sheets say they go.
#[test]
fn harness_agrees_with_itself_and_with_the_fact_sheets() {
    require_root!();
    let ids = [
        "istio/basic",
        "istio/dns",
        "istio/include-exclude-ip",
        "linkerd/cni-annotations",
        "consul/W11",
        "consul/D3",
        "istio/excludeInterfaces-eth0",
        "istio/excludeInboundPorts",
        "istio/excludeOutboundIPRanges-all",
    ];
    let o = run(
        ids.iter().map(|id| cases::by_id(id)).collect(),
        Against::Itself,
    );
    print_and_write(&o, "self-comparison");
    assert!(o.rows.iter().all(report::Row::ok), "{}", summary(&o.rows));
    assert!(o.rows.iter().any(|r| r.probes > 100), "probes ran");

    let expect = [
        // istio.md §1.3: the app's TCP goes to 15001, the proxy's leaves; the proxy's own
        // connection to its pod over lo goes to the inbound port, unless it comes from
        // 127.0.0.6 (§1.4); inbound goes to 15006 but for the status ports (§1.5).
        (
            "istio/basic",
            "out tcp app (1000:1000) -> 192.0.2.10:8080",
            pod("127.0.0.1:15001", Some("192.0.2.10:8080")),
        ),
        (
            "istio/basic",
            "out tcp proxy (1337:1337) -> 192.0.2.10:8080",
            node("192.0.2.10:8080"),
        ),
        (
            "istio/basic",
            "out tcp proxy-gid (1000:1337) -> 192.0.2.10:8080",
            node("192.0.2.10:8080"),
        ),
        (
            "istio/basic",
            "out tcp proxy (1337:1337) -> 10.99.1.2:8080",
            pod("127.0.0.1:15006", Some("10.99.1.2:8080")),
        ),
        (
            "istio/basic",
            "out tcp proxy (1337:1337) from 127.0.0.6 -> 10.99.1.2:8080",
            pod("10.99.1.2:8080", None),
        ),
        (
            "istio/basic",
            "out tcp app (1000:1000) -> 127.0.0.6:8080",
            pod("127.0.0.6:8080", None),
        ),
        (
            "istio/basic",
            "out tcp app (1000:1000) -> 192.0.2.10:15020",
            node("192.0.2.10:15020"),
        ),
        (
            "istio/basic",
            "in tcp node from 198.51.100.7 -> 10.99.1.2:8080",
            pod("10.99.1.2:15006", Some("10.99.1.2:8080")),
        ),
        (
            "istio/basic",
            "in tcp node from 198.51.100.7 -> 10.99.1.2:15021",
            pod("10.99.1.2:15021", None),
        ),
        (
            "istio/basic",
            "in tcp node from 198.51.100.7 -> 10.99.1.2:15008",
            pod("10.99.1.2:15008", None),
        ),
        (
            "istio/basic",
            "out udp app (1000:1000) -> 10.99.1.1:53",
            node("10.99.1.1:53"),
        ),
        (
            "istio/basic",
            "out tcp proxy (1337:1337) -> [fd99:1::2]:8080",
            pod("[::1]:15006", Some("[fd99:1::2]:8080")),
        ),
        // §1.7: DNS to the proxy's 15053, but not the proxy's own.
        (
            "istio/dns",
            "out udp app (1000:1000) -> 10.99.1.1:53",
            pod("127.0.0.1:15053", None),
        ),
        (
            "istio/dns",
            "out tcp app (1000:1000) -> 10.99.1.1:53",
            pod("127.0.0.1:15053", Some("10.99.1.1:53")),
        ),
        (
            "istio/dns",
            "out udp proxy (1337:1337) -> 10.99.1.1:53",
            node("10.99.1.1:53"),
        ),
        (
            "istio/dns",
            "out udp app (1000:1000) -> [fd99:1::1]:53",
            pod("[::1]:15053", None),
        ),
        // include 127.0.0.0/8 captures the app's loopback traffic but 127.0.0.1; 10/8 leaves.
        (
            "istio/include-exclude-ip",
            "out tcp app (1000:1000) -> 127.1.2.3:8080",
            pod("127.0.0.1:15001", Some("127.1.2.3:8080")),
        ),
        (
            "istio/include-exclude-ip",
            "out tcp app (1000:1000) -> 10.128.0.1:8080",
            node("10.128.0.1:8080"),
        ),
        (
            "istio/include-exclude-ip",
            "out tcp app (1000:1000) -> 192.0.2.10:8080",
            node("192.0.2.10:8080"),
        ),
        // The derived tables: an excluded interface passes both ways; 3306 is not captured
        // inbound; 0.0.0.0/0 excluded leaves every destination alone but the pod's own
        // loopback rules.
        (
            "istio/excludeInterfaces-eth0",
            "out tcp app (1000:1000) -> 192.0.2.10:8080",
            node("192.0.2.10:8080"),
        ),
        (
            "istio/excludeInterfaces-eth0",
            "in tcp node from 198.51.100.7 -> 10.99.1.2:8080",
            pod("10.99.1.2:8080", None),
        ),
        (
            "istio/excludeInterfaces-eth0",
            "out tcp proxy (1337:1337) -> 10.99.1.2:8080",
            pod("127.0.0.1:15006", Some("10.99.1.2:8080")),
        ),
        (
            "istio/excludeInboundPorts",
            "in tcp node from 198.51.100.7 -> 10.99.1.2:3306",
            pod("10.99.1.2:3306", None),
        ),
        (
            "istio/excludeInboundPorts",
            "in tcp node from 198.51.100.7 -> 10.99.1.2:8080",
            pod("10.99.1.2:15006", Some("10.99.1.2:8080")),
        ),
        (
            "istio/excludeOutboundIPRanges-all",
            "out tcp app (1000:1000) -> 192.0.2.10:8080",
            node("192.0.2.10:8080"),
        ),
        (
            "istio/excludeOutboundIPRanges-all",
            "out tcp proxy (1337:1337) -> 10.99.1.2:8080",
            pod("127.0.0.1:15006", Some("10.99.1.2:8080")),
        ),
        // linkerd.md §1.1: skip-subnets are inbound sources; loopback is never captured.
        (
            "linkerd/cni-annotations",
            "in tcp node from 10.99.1.1 -> 10.99.1.2:3306",
            pod("10.99.1.2:3306", None),
        ),
        (
            "linkerd/cni-annotations",
            "in tcp node from 198.51.100.7 -> 10.99.1.2:3306",
            pod("10.99.1.2:4143", Some("10.99.1.2:3306")),
        ),
        (
            "linkerd/cni-annotations",
            "in tcp node from 198.51.100.7 -> 10.99.1.2:8080",
            pod("10.99.1.2:8080", None),
        ),
        (
            "linkerd/cni-annotations",
            "out tcp app (1000:1000) -> 10.128.0.1:8080",
            pod("127.0.0.1:4140", Some("10.128.0.1:8080")),
        ),
        (
            "linkerd/cni-annotations",
            "out tcp app (1000:1000) -> 127.1.2.3:8080",
            pod("127.1.2.3:8080", None),
        ),
        (
            "linkerd/cni-annotations",
            "out tcp app (1000:1000) -> 192.0.2.10:3306",
            node("192.0.2.10:3306"),
        ),
        // consul.md §4.3, §4.4: DNS to 127.0.0.1:53 goes to 8600; the app's own pod IP to 15001.
        (
            "consul/W11",
            "out udp app (1000:1000) -> 127.0.0.1:53",
            pod("127.0.0.1:8600", None),
        ),
        (
            "consul/W11",
            "out tcp app (1000:1000) -> 10.99.1.2:8080",
            pod("127.0.0.1:15001", Some("10.99.1.2:8080")),
        ),
        (
            "consul/W11",
            "out tcp uid 5996 (5996:1000) -> 192.0.2.10:8080",
            node("192.0.2.10:8080"),
        ),
        (
            "consul/D3",
            "out udp app (1000:1000) -> [::1]:53",
            pod("[::1]:8600", None),
        ),
        (
            "consul/D3",
            "out udp app (1000:1000) -> 127.0.0.1:53",
            pod("127.0.0.1:53", None),
        ),
    ];
    let mut wrong = Vec::new();
    for (case, probe, want) in expect {
        let got = landed(&o, case, probe);
        if got != want {
            wrong.push(format!(
                "{case}: {probe}: landed {got}, the fact sheet says {want}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Kuma's case (written from the fact sheet, no golden upstream) through the harness
/// against itself, and its probes landing where `research/guard-mode.md` §A.4.4 says:
/// the app's TCP to 15001, the proxy's (5678) out, the proxy's own loopback connection to
/// the pod to 15006 unless from 127.0.0.6, inbound to 15006.
#[test]
fn kuma_case_lands_where_the_fact_sheet_says() {
    require_root!();
    let o = run(vec![cases::by_id("kuma/default")], Against::Itself);
    print_and_write(&o, "kuma self-comparison");
    assert!(o.rows.iter().all(report::Row::ok), "{}", summary(&o.rows));
    let expect = [
        (
            "out tcp app (1000:1000) -> 192.0.2.10:8080",
            pod("127.0.0.1:15001", Some("192.0.2.10:8080")),
        ),
        (
            "out tcp root (0:0) -> 192.0.2.10:8080",
            pod("127.0.0.1:15001", Some("192.0.2.10:8080")),
        ),
        (
            "out tcp proxy (5678:5678) -> 192.0.2.10:8080",
            node("192.0.2.10:8080"),
        ),
        (
            "out tcp proxy (5678:5678) -> 10.99.1.2:8080",
            pod("127.0.0.1:15006", Some("10.99.1.2:8080")),
        ),
        (
            "out tcp proxy (5678:5678) from 127.0.0.6 -> 10.99.1.2:8080",
            pod("10.99.1.2:8080", None),
        ),
        (
            "out tcp app (1000:1000) -> 127.0.0.6:8080",
            pod("127.0.0.6:8080", None),
        ),
        (
            "in tcp node from 198.51.100.7 -> 10.99.1.2:8080",
            pod("10.99.1.2:15006", Some("10.99.1.2:8080")),
        ),
        (
            "out tcp app (1000:1000) -> [2001:db8::10]:8080",
            pod("[::1]:15001", Some("[2001:db8::10]:8080")),
        ),
        (
            "out tcp proxy (5678:5678) -> [fd99:1::2]:8080",
            pod("[::1]:15006", Some("[fd99:1::2]:8080")),
        ),
    ];
    let mut wrong = Vec::new();
    for (probe, want) in expect {
        let got = landed(&o, "kuma/default", probe);
        if got != want {
            wrong.push(format!(
                "kuma/default: {probe}: landed {got}, the fact sheet says {want}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Every side's failures, in words (the mesh's own rules are the control: a failure there
/// is the harness's).
fn failures(case: &str, results: Vec<(String, Result<Vec<String>, String>)>) -> Vec<String> {
    let mut failures = Vec::new();
    for (side, r) in results {
        match r {
            Err(e) => failures.push(format!("{case} on {side}: the pod would not start: {e}")),
            Ok(errs) => failures.extend(errs.into_iter().map(|e| format!("{case} on {side}: {e}"))),
        }
    }
    failures
}

const CLOSED: NodeSetup = NodeSetup {
    extra_addrs: Vec::new(),
    catch_all: true,
};

/// istio-validation, as the injector runs it in every new sidecar pod under CNI mode (as
/// the proxy's UID/GID, here the default and a custom one), passes against interlock's
/// rules on every backend, IPv4 and IPv6 — and against Istio's own.
#[test]
fn istio_validation_passes() {
    require_root!();
    let mut failed = Vec::new();
    for (id, creds) in [
        (
            "istio/basic",
            Creds {
                uid: 1337,
                gid: 1337,
            },
        ),
        (
            "istio/custom-uid",
            Creds {
                uid: 1000670000,
                gid: 1000670001,
            },
        ),
    ] {
        let case = cases::by_id(id);
        let results = on_each_side(&case, &CLOSED, |side| {
            [false, true]
                .into_iter()
                .filter_map(|v6| {
                    validators::istio_validation(&side.pod.path(), v6, creds)
                        .err()
                        .map(|e| format!("{}: {e}", if v6 { "IPv6" } else { "IPv4" }))
                })
                .collect()
        });
        failed.extend(failures(id, results));
    }
    assert!(
        failed.is_empty(),
        "istio-validation failed:\n{}",
        failed.join("\n")
    );
}

/// linkerd-network-validator, as the injector runs it under CNI mode (UID 65534), passes
/// against interlock's rules on every backend: IPv4 to the chart's 1.1.1.1:20001 and the
/// binary's default 192.0.2.2:1404, IPv6 to [fd00::1]:20001 (all inside the closed
/// topology) — and against Linkerd's own rules.
#[test]
fn linkerd_network_validator_passes() {
    require_root!();
    let case = cases::by_id("linkerd/cni-default");
    let runs = [
        ("0.0.0.0:4140", "1.1.1.1:20001"),
        ("0.0.0.0:4140", "192.0.2.2:1404"),
        ("[::]:4140", "[fd00::1]:20001"),
    ];
    // The validator runs once in a fresh pod: each run gets fresh sides, as a second run
    // in the same netns would meet the first one's connection state, which no pod has.
    let mut results = Vec::new();
    for (listen, connect) in runs {
        results.extend(on_each_side(&case, &CLOSED, |side| {
            validators::linkerd_network_validator(
                &side.pod.path(),
                listen.parse().unwrap(),
                connect.parse().unwrap(),
            )
            .err()
            .map(|e| format!("listen {listen}, connect {connect}: {e}"))
            .into_iter()
            .collect::<Vec<_>>()
        }));
    }
    let failed = failures(&case.id(), results);
    assert!(
        failed.is_empty(),
        "linkerd-network-validator failed:\n{}",
        failed.join("\n")
    );
}

/// What answers the pod's resolver queries in the DNS test.
const PROXY_DNS: Ipv4Addr = Ipv4Addr::new(10, 53, 0, 1);
const NODE_DNS: Ipv4Addr = Ipv4Addr::new(10, 53, 0, 2);

/// One DNS case: the pod's case, the proxy's DNS listeners, and the queries (server, who
/// asks, who must answer).
struct DnsCase {
    id: &'static str,
    proxy: Creds,
    proxy_dns: Vec<SocketAddr>,
    queries: Vec<(SocketAddr, Creds, Ipv4Addr)>,
}

fn sa(ip: impl Into<std::net::IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(ip.into(), port)
}

/// A real DNS query, UDP and TCP, from the app is answered by a test listener at the
/// proxy's DNS port, and the proxy's own query reaches the node's resolver: with Istio's
/// DNS capture (ISTIO_META_DNS_CAPTURE=true, port 15053, both families) and Consul DNS
/// (127.0.0.1:8600; ::1:8600 under dual stack) — on interlock's rules on every backend and
/// on the mesh's own.
#[test]
fn dns_is_captured_as_the_mesh_captures_it() {
    require_root!();
    let app = case::APP;
    let istio_proxy = Creds {
        uid: 1337,
        gid: 1337,
    };
    let consul_proxy = Creds {
        uid: 5995,
        gid: 5995,
    };
    let lo4 = Ipv4Addr::LOCALHOST;
    let lo6 = std::net::Ipv6Addr::LOCALHOST;
    let dns_cases = [
        DnsCase {
            id: "istio/dns",
            proxy: istio_proxy,
            proxy_dns: vec![sa(lo4, 15053), sa(lo6, 15053)],
            queries: vec![
                (sa(GW4, 53), app, PROXY_DNS),
                (sa(GW4, 53), istio_proxy, NODE_DNS),
                (sa(GW6, 53), app, PROXY_DNS),
                (sa(GW6, 53), istio_proxy, NODE_DNS),
            ],
        },
        DnsCase {
            id: "consul/W11",
            proxy: consul_proxy,
            proxy_dns: vec![sa(lo4, 8600)],
            queries: vec![
                (sa(lo4, 53), app, PROXY_DNS),
                (sa(GW4, 53), consul_proxy, NODE_DNS),
            ],
        },
        DnsCase {
            id: "consul/D3",
            proxy: consul_proxy,
            proxy_dns: vec![sa(lo6, 8600)],
            queries: vec![
                (sa(lo6, 53), app, PROXY_DNS),
                (sa(GW6, 53), consul_proxy, NODE_DNS),
            ],
        },
    ];
    let resolver = NodeSetup {
        extra_addrs: Vec::new(),
        catch_all: false,
    };
    let mut failed = Vec::new();
    for dc in dns_cases {
        let case = cases::by_id(dc.id);
        let results = on_each_side(&case, &resolver, |side| {
            let root = Creds { uid: 0, gid: 0 };
            let node = [sa(GW4, 53), sa(GW6, 53)];
            let _node = dns::Responder::start(&side.node.path(), &node, NODE_DNS, root);
            let _proxy =
                dns::Responder::start(&side.pod.path(), &dc.proxy_dns, PROXY_DNS, dc.proxy);
            let mut errs = Vec::new();
            for (i, (server, who, want)) in dc.queries.iter().enumerate() {
                for proto in [Proto::Udp, Proto::Tcp] {
                    let asked = format!(
                        "{} query as {}:{} to {server}",
                        proto.as_str(),
                        who.uid,
                        who.gid
                    );
                    match dns::ask(&side.pod.path(), proto, *server, *who, 0x4000 + i as u16) {
                        Ok(got) if got == *want => {}
                        Ok(got) => errs.push(format!(
                            "{asked}: answered by {}, expected {}",
                            if got == PROXY_DNS {
                                "the proxy's DNS"
                            } else {
                                "the node's resolver"
                            },
                            if *want == PROXY_DNS {
                                "the proxy's DNS"
                            } else {
                                "the node's resolver"
                            },
                        )),
                        Err(e) => errs.push(format!("{asked}: {e}")),
                    }
                }
            }
            errs
        });
        failed.extend(failures(dc.id, results));
    }
    assert!(
        failed.is_empty(),
        "DNS capture failed:\n{}",
        failed.join("\n")
    );
}

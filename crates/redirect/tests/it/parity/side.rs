//! Running a case's probes against one side: the mesh's own rules, or interlock's on one
//! backend, each in a fresh closed topology.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::process::Command;
use std::time::{Duration, Instant};

use interlock_redirect::{install_and_prove, spec_for, BackendKind, PodView, ProfileName};
use interlock_testkit::Netns;

use super::case::{Case, Mesh, MeshRules, ProbePlan};
use super::landing::{Landing, Recorder, Watched};
use super::net::{in_netns, tcp_listener, udp_listener};
use super::probe::run_all;
use super::topology::{run_stdin, NodeSetup, Side, GW4, GW6, NODE_CATCH_PORT};

/// Whose rules a side holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rules {
    /// The mesh's, loaded with `iptables-nft-restore` as the case lists them.
    Mesh,
    /// interlock's, from `spec_for` and `install_and_prove` on a backend.
    Interlock(BackendKind),
    /// The mesh's again, in place of interlock's on a backend (the harness's own check:
    /// two sides with the same rules must agree on every probe).
    MeshAgain(BackendKind),
}

/// What one side did.
pub struct SideRun {
    /// `Ok` with a note on how the rules came about, or `Err` when the pod would not start
    /// (interlock refused it): then no probe ran.
    pub setup: Result<String, String>,
    pub landings: Vec<Landing>,
    pub elapsed: Duration,
}

/// Loads the mesh's rules of `case` into the pod netns `pod`, as the mesh writes them
/// (every table of each family's restore file; Istio's and Kuma's `::6/128` on `lo` with
/// their IPv6 rules). A restore file the kernel refuses is a wrong fact: the test stops, naming it.
pub fn load_mesh_rules(pod: &Netns, case: &Case) {
    for (v6, tool) in [
        (false, "iptables-nft-restore"),
        (true, "ip6tables-nft-restore"),
    ] {
        let MeshRules::Restore(text) = case.rules(v6) else {
            continue;
        };
        run_stdin(
            Command::new("ip").args(["netns", "exec", pod.name(), tool]),
            text,
            &format!(
                "{}: loading the mesh's {} rules ({}) with {tool}",
                case.id(),
                if v6 { "IPv6" } else { "IPv4" },
                case.source
            ),
        );
        if v6 && matches!(case.mesh, Mesh::Istio | Mesh::Kuma) {
            let out = Command::new("ip")
                .args(["-n", pod.name(), "addr", "add", "::6/128", "dev", "lo"])
                .output()
                .expect("ip addr add ::6");
            assert!(
                out.status.success(),
                "ip addr add ::6/128 dev lo: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// Applies interlock's rules for `case`'s pod as the plugin would: the spec from its
/// annotations and spec facts with every profile enabled, then `install_and_prove` (apply, verify,
/// prove) on `kind`.
fn apply_interlock(side: &Side, case: &Case, kind: BackendKind) -> Result<String, String> {
    let view = PodView {
        annotations: &case.annotations,
        facts: Some(&case.facts),
    };
    match spec_for(&view, &ProfileName::ALL) {
        Err(e) => Err(format!("spec_for refused the pod: {e}")),
        Ok(None) => Ok("not meshed (spec_for: None): no rules".into()),
        Ok(Some((profile, spec))) => {
            match install_and_prove(&side.pod.path(), &spec, kind, &[GW4.into(), GW6.into()]) {
                Ok(_) => Ok(format!("profile {profile}")),
                Err(e) => Err(format!("install_and_prove failed: {e}")),
            }
        }
    }
}

/// A TCP listener on `a` in the pod (on the calling thread, inside it). The port can be
/// busy for a moment right after `install_and_prove`, whose probe listened on the outbound proxy port
/// (the testkit's `listen` saw the same): retry for a while, then fail showing the sockets.
fn bind_retrying(a: SocketAddr) -> std::net::TcpListener {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match tcp_listener(a, false) {
            Ok(l) => return l,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => {
                let ss = Command::new("ss")
                    .arg("-tanpe")
                    .output()
                    .map(|o| o.stdout)
                    .unwrap_or_default();
                panic!(
                    "bind tcp {a} in the pod: {e}\nsockets:\n{}",
                    String::from_utf8_lossy(&ss)
                )
            }
        }
    }
}

/// The pod's listeners on every port of `ports` (TCP and UDP, `0.0.0.0` and `[::]`) and
/// the node's transparent catch-all.
fn listeners(side: &Side, ports: &BTreeSet<u16>) -> Vec<Watched> {
    let any4 = |p| SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), p);
    let any6 = |p| SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), p);
    let mut all = in_netns(&side.pod.path(), || {
        let mut v = Vec::new();
        for &p in ports {
            for a in [any4(p), any6(p)] {
                let tcp = bind_retrying(a);
                let udp = udp_listener(a, false)
                    .unwrap_or_else(|e| panic!("bind udp {a} in the pod: {e}"));
                v.extend([Watched::PodTcp(tcp), Watched::PodUdp(udp)]);
            }
        }
        v
    });
    all.extend(in_netns(&side.node.path(), || {
        let mut v = Vec::new();
        for a in [any4(NODE_CATCH_PORT), any6(NODE_CATCH_PORT)] {
            let tcp =
                tcp_listener(a, true).unwrap_or_else(|e| panic!("bind tcp {a} in the node: {e}"));
            let udp =
                udp_listener(a, true).unwrap_or_else(|e| panic!("bind udp {a} in the node: {e}"));
            v.extend([Watched::NodeTcp(tcp), Watched::NodeUdp(udp)]);
        }
        v
    }));
    all
}

/// A fresh side for `case` whose pod holds `rules`, and how they came about (`Err`: the
/// pod would not start).
pub fn prepare(case: &Case, rules: Rules, node: &NodeSetup) -> (Side, Result<String, String>) {
    let side = Side::new(node);
    let setup = match rules {
        Rules::Mesh => {
            load_mesh_rules(&side.pod, case);
            Ok("the mesh's rules".to_string())
        }
        Rules::MeshAgain(_) => {
            load_mesh_rules(&side.pod, case);
            Ok("the mesh's rules again (harness check)".to_string())
        }
        Rules::Interlock(kind) => apply_interlock(&side, case, kind),
    };
    settle_loopback(&side.pod);
    (side, setup)
}

/// Waits until every IPv6 address on the pod's `lo` is usable. An address just added
/// (Istio's `::6`) is tentative, without its local route, until the kernel's address work
/// has run; a probe to it before then would leave through `eth0` and land elsewhere than a
/// moment later. Usable means a socket connected to it picks it as its own source. That
/// work waits for the RTNL lock, which netns teardowns hold for long stretches on a busy
/// machine: the wait is generous, and an address that never settles stops the test
/// (comparing landings then would compare the kernel's timing, not the rules).
fn settle_loopback(pod: &Netns) {
    let out = Command::new("ip")
        .args(["-n", pod.name(), "-o", "-6", "addr", "show", "dev", "lo"])
        .output()
        .expect("ip addr show");
    let addrs: Vec<Ipv6Addr> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3)?.split('/').next()?.parse().ok())
        .collect();
    in_netns(&pod.path(), || {
        for a in addrs {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let ready = std::net::UdpSocket::bind((Ipv6Addr::UNSPECIFIED, 0))
                    .and_then(|s| s.connect((a, 9)).and(s.local_addr()))
                    .is_ok_and(|l| l.ip() == std::net::IpAddr::V6(a));
                if ready {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{a} on lo of {} never became usable within 30 s",
                    pod.name()
                );
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    });
}

/// Runs `plan`'s probes against a fresh side holding `rules` for `case`.
pub fn run_side(case: &Case, plan: &ProbePlan, rules: Rules) -> SideRun {
    let start = Instant::now();
    let (side, setup) = prepare(
        case,
        rules,
        &NodeSetup {
            extra_addrs: plan.node_addrs.clone(),
            catch_all: true,
        },
    );
    if setup.is_err() {
        return SideRun {
            setup,
            landings: Vec::new(),
            elapsed: start.elapsed(),
        };
    }
    // After install_and_prove: its probe binds the outbound proxy port while it runs.
    let rec = Recorder::start(listeners(&side, &plan.ports));
    let landings = run_all(&plan.probes, &rec, &side.pod.path(), &side.node.path());
    drop(rec);
    SideRun {
        setup,
        landings,
        elapsed: start.elapsed(),
    }
}

/// Runs `f` on a fresh side for `case` with the mesh's rules (label `mesh`) and with
/// interlock's on every backend, side by side; a side whose pod would not start gives `Err`.
pub fn on_each_side<T: Send>(
    case: &Case,
    node: &NodeSetup,
    f: impl Fn(&Side) -> T + Sync,
) -> Vec<(String, Result<T, String>)> {
    let mut all = vec![("mesh".to_string(), Rules::Mesh)];
    all.extend(
        BackendKind::ALL
            .into_iter()
            .map(|k| (k.as_str().to_string(), Rules::Interlock(k))),
    );
    std::thread::scope(|s| {
        let handles: Vec<_> = all
            .into_iter()
            .map(|(label, rules)| {
                let f = &f;
                s.spawn(move || {
                    let (side, setup) = prepare(case, rules, node);
                    (label, setup.map(|_| f(&side)))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

//! Guard mode's audit (issue 29): the mesh's own plugin wrote a meshed sandbox's rules,
//! in its own shape, so they are never read back. Each meshed sandbox is judged by a
//! connection alone ([`interlock_redirect::probe::probe_with`] with
//! [`ProxyPort::MaybeTaken`], in the pod's netns on a dedicated thread, as the in-place
//! repair proves its rules): an outbound connection as root to the pod's gateway must be
//! delivered to the proxy's outbound port, whoever wrote the rules.
//!
//! - **Which sandboxes**: those the guarded mesh's plugin would redirect
//!   ([`GuardedMesh::recognise`]), with T's excluded namespaces from the entry the config
//!   guard learnt (`<stateDir>/guard-entry.json`), else from interlock-cni's own
//!   settings (its guard role's `excludeNamespaces`, else `excludeNamespaces`), which the
//!   log says.
//! - **Which families**: only those the mesh captures for that pod
//!   ([`interlock_contract::guard::Ipv6Capture`]: IPv4 always). A family the pod routes
//!   beyond link-local that the mesh leaves uncaptured is reported (logged once per
//!   sandbox), not judged unprotected: the mesh chose not to capture it, and restarting
//!   the pod would not change that.
//! - **When**: once the proxy's outbound port has a listener (sock_diag, nothing bound);
//!   a sandbox whose proxy has not listened after [`LISTEN_GRACE`] is probed with the port
//!   free (the probe binds it for at most its timeout). A failed probe is tried once more
//!   before it counts, since a proxy that starts during the first may have taken the
//!   port.
//!
//! In-place repair is not offered in guard mode in this version (it would need an
//! explicit opt-in and the guard role's DEL releasing its state): an unprotected sandbox
//! is restarted by default, and `repair` is taken as `restart`.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use interlock_contract::guard::{GuardedMesh, ProbeInputs};
use interlock_redirect::probe::{self, ProbeError, ProbeReport, ProxyPort};
use interlock_redirect::spec::{Family, PortSelection, RedirectSpec};
use serde_json::Value;

use super::decide::Verdict;

/// How long after its sandbox was created a proxy may take to listen before the probe
/// binds its port itself.
pub const LISTEN_GRACE: Duration = Duration::from_secs(30);
/// How long one probe connection may take.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// The pause before a failed probe is tried again.
pub const RETRY_AFTER: Duration = Duration::from_millis(500);
/// How the verdict of a sandbox not probed yet starts (its proxy does not listen yet).
pub const WAITING: &str = "not probed yet";
/// The Event reason of a routed family the guarded mesh leaves uncaptured.
pub const EVENT_FAMILY_UNCOVERED: &str = "FamilyNotCaptured";
/// The largest `guard-entry.json` read.
const MAX_ENTRY_BYTES: u64 = 1 << 20;

/// The guarded mesh and where its learnt entry is kept.
#[derive(Debug, Clone)]
pub struct GuardAudit {
    /// The mesh whose plugin follows interlock-cni in the chain.
    pub mesh: GuardedMesh,
    /// The agent's state dir (where the config guard keeps the learnt entry).
    pub state_dir: PathBuf,
    /// T's excluded namespaces while no entry has been learnt: interlock-cni's own.
    pub fallback_excluded: Vec<String>,
}

/// T's entry and excluded namespaces as the audit uses them, and where they came from.
#[derive(Debug, Clone, PartialEq)]
pub struct MeshSettings {
    /// T's entry, when learnt.
    pub entry: Option<Value>,
    /// T's excluded namespaces.
    pub excluded: Vec<String>,
    /// Where those came from, for the log.
    pub source: String,
}

impl GuardAudit {
    /// Guard mode's audit for interlock-cni's settings `plugin`, when its guard role is
    /// set: T's excluded namespaces fall back on the role's, else the plugin's own.
    pub fn of(plugin: &interlock_contract::PluginConfig) -> Option<GuardAudit> {
        let role = plugin.guard.as_ref()?;
        Some(GuardAudit {
            mesh: role.mesh,
            state_dir: plugin.state_dir.clone(),
            fallback_excluded: if role.exclude_namespaces.is_empty() {
                plugin.exclude_namespaces.clone()
            } else {
                role.exclude_namespaces.clone()
            },
        })
    }

    /// T's entry as the config guard last learnt it, and the excluded namespaces
    /// (see the module docs). An unreadable or foreign file counts as not learnt.
    pub fn settings(&self) -> MeshSettings {
        let path = self
            .state_dir
            .join(interlock_contract::layout::GUARD_ENTRY_FILE);
        let learnt = interlock_contract::bounded::read_regular(&path, MAX_ENTRY_BYTES)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .and_then(|v| learnt_entry(&v, self.mesh));
        match learnt {
            Some(entry) => MeshSettings {
                excluded: self.mesh.excluded_namespaces(&entry),
                entry: Some(entry),
                source: format!(
                    "{}'s entry learnt in {}",
                    self.mesh.plugin_type(),
                    path.display()
                ),
            },
            None => MeshSettings {
                entry: None,
                excluded: self.fallback_excluded.clone(),
                source: format!(
                    "interlock-cni's settings: no {} entry learnt yet ({} missing or unreadable)",
                    self.mesh.plugin_type(),
                    path.display()
                ),
            },
        }
    }
}

/// The entry in the config guard's `guard-entry.json` (`{"mesh": …, "entry": {…}}`), if
/// it is for `mesh` (pure).
pub fn learnt_entry(file: &Value, mesh: GuardedMesh) -> Option<Value> {
    let for_mesh = file.get("mesh").and_then(Value::as_str) == Some(mesh.as_str());
    let entry = file.get("entry").filter(|e| e.is_object())?;
    let typed = entry.get("type").and_then(Value::as_str) == Some(mesh.plugin_type());
    (for_mesh && typed).then(|| entry.clone())
}

/// The spec the probe checks a meshed pod against (pure): outbound TCP to the proxy's
/// outbound port from every UID but the proxy's, IPv4 always and IPv6 only when
/// `ipv6` (a family not captured is excluded whole, so the probe skips it rather than
/// failing on it). Never installed: it only tells the probe what to demand.
pub fn probe_spec(inputs: &ProbeInputs, ipv6: bool) -> RedirectSpec {
    let port = inputs.outbound_port;
    let mut spec = interlock_redirect::profile::base_spec(inputs.proxy_uid, None, port, port);
    spec.inbound.include_ports = PortSelection::Only(Vec::new());
    if !ipv6 {
        spec.outbound.exclude_cidrs = vec!["::/0".parse().expect("a literal network")];
    }
    spec
}

/// What the pod's netns showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probed {
    /// The netns is gone.
    Gone,
    /// The proxy does not listen yet and the grace has not passed: judged later.
    Waiting,
    /// Probed.
    Done {
        /// The outcome.
        outcome: ProbeOutcome,
        /// A family the pod routes that the mesh leaves uncaptured (why), if any.
        uncovered: Option<String>,
        /// Whether the proxy listened when the probe ran.
        listening: bool,
    },
}

/// How the probe ended (classified in the netns thread, judged by [`judge`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// Every captured family shown delivered to the proxy (or sealed); the report's lines.
    Captured(Vec<String>),
    /// The probe ran but nothing it did depended on the rules (no family routable).
    NothingToProve(Vec<String>),
    /// A connection was not delivered to the proxy's port: the traffic leaves uncaptured.
    NotCaptured(String),
    /// The probe could not tell (no gateway to probe, a link that leaves the node, the
    /// netns unreadable).
    CannotTell(String),
}

/// The verdict for a probed meshed sandbox (pure).
pub fn judge(mesh: GuardedMesh, outcome: &ProbeOutcome) -> Verdict {
    let t = mesh.plugin_type();
    match outcome {
        ProbeOutcome::Captured(_) => Verdict::Protected,
        ProbeOutcome::NotCaptured(why) => Verdict::Unprotected {
            reason: format!(
                "meshed by {t}, but its outbound traffic is not captured (proven by a connection): {why}"
            ),
        },
        ProbeOutcome::NothingToProve(lines) => Verdict::Unknown {
            reason: format!(
                "meshed by {t}; no family of the pod is routable, so a connection proves nothing: {}",
                lines.join("; ")
            ),
        },
        ProbeOutcome::CannotTell(why) => Verdict::Unknown {
            reason: format!("meshed by {t}; capture cannot be proven by a connection: {why}"),
        },
    }
}

/// Classifies what [`probe::probe_with`] returned (pure).
pub fn classify(result: Result<ProbeReport, ProbeError>) -> ProbeOutcome {
    match result {
        Ok(r) if r.shows_redirection() => ProbeOutcome::Captured(r.lines()),
        Ok(r) => ProbeOutcome::NothingToProve(r.lines()),
        Err(
            e @ (ProbeError::NotRedirected { .. }
            | ProbeError::WrongOriginalDst { .. }
            | ProbeError::UnexpectedRoute { .. }),
        ) => ProbeOutcome::NotCaptured(e.to_string()),
        Err(e) => ProbeOutcome::CannotTell(e.to_string()),
    }
}

/// Whether `verdict` says the sandbox was not probed yet, its proxy not listening
/// ([`Probed::Waiting`]).
pub fn is_waiting(verdict: &Verdict) -> bool {
    matches!(verdict, Verdict::Unknown { reason } if reason.starts_with(WAITING))
}

/// Whether to probe now (pure): once the proxy listens, or once `age` passed the grace.
pub fn probe_now(listening: bool, age: Duration) -> bool {
    listening || age >= LISTEN_GRACE
}

/// Why a routed family is left uncovered (pure): IPv6 routed beyond link-local while the
/// mesh captures only IPv4 for this pod. `routes_v6` are the pod's IPv6 unicast
/// destinations off `lo` (network address, as printed).
pub fn uncovered(
    mesh: GuardedMesh,
    captures_v6: bool,
    routes_v6: &[(IpAddr, String)],
) -> Option<String> {
    let beyond: Vec<&str> = routes_v6
        .iter()
        .filter(|(a, _)| !is_link_local(*a))
        .map(|(_, s)| s.as_str())
        .collect();
    (!captures_v6 && !beyond.is_empty()).then(|| {
        format!(
            "the pod routes IPv6 ({}), which {} does not capture for it; its IPv6 connections bypass the proxy (the mesh's own choice: see its IPv6 setting)",
            beyond.join(", "),
            mesh.plugin_type()
        )
    })
}

fn is_link_local(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V6(a) if (a.segments()[0] & 0xffc0) == 0xfe80)
}

/// Probes the sandbox at `netns` (blocking: enters the netns on a dedicated thread).
/// `age` is how long ago the sandbox was created.
pub fn probe_sandbox(
    netns: &Path,
    mesh: GuardedMesh,
    inputs: &ProbeInputs,
    age: Duration,
) -> Probed {
    let pod = match interlock_redirect::netns::PodNetns::open(netns) {
        Ok(p) => p,
        Err(e) if e.is_gone() => return Probed::Gone,
        Err(e) => {
            return Probed::Done {
                outcome: ProbeOutcome::CannotTell(e.to_string()),
                uncovered: None,
                listening: false,
            }
        }
    };
    let inputs = *inputs;
    let ran = pod.run(move || {
        let listening = match interlock_redirect::sockdiag::tcp_sockets() {
            Ok(s) => s
                .iter()
                .any(|s| s.state == TCP_LISTEN && s.local.port() == inputs.outbound_port),
            Err(e) => {
                return Probed::Done {
                    outcome: ProbeOutcome::CannotTell(format!("listing the pod's sockets: {e}")),
                    uncovered: None,
                    listening: false,
                }
            }
        };
        if !probe_now(listening, age) {
            return Probed::Waiting;
        }
        let addrs = addresses();
        let captures_v6 = inputs.ipv6.captures_ipv6(&addrs);
        let routes_v6 = ipv6_routes();
        let spec = probe_spec(&inputs, captures_v6);
        let mut result = probe::probe_with(&spec, &[], PROBE_TIMEOUT, ProxyPort::MaybeTaken);
        if result.is_err() {
            std::thread::sleep(RETRY_AFTER);
            result = probe::probe_with(&spec, &[], PROBE_TIMEOUT, ProxyPort::MaybeTaken);
        }
        Probed::Done {
            outcome: classify(result),
            uncovered: uncovered(mesh, captures_v6, &routes_v6),
            listening,
        }
    });
    match ran {
        Ok(p) => p,
        Err(e) if e.is_gone() => Probed::Gone,
        Err(e) => Probed::Done {
            outcome: ProbeOutcome::CannotTell(e.to_string()),
            uncovered: None,
            listening: false,
        },
    }
}

/// A guard-mode verdict on one sandbox ([`judge_sandbox`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judged {
    /// The verdict.
    pub verdict: Verdict,
    /// A family the pod routes that the mesh leaves uncaptured (why), if probed.
    pub uncovered: Option<String>,
    /// The probe's lines when it proved the capture.
    pub proof: Option<Vec<String>>,
    /// Whether the proxy listened when the probe ran.
    pub listening: bool,
    /// Whether the verdict came from the pod's netns (probed, or waiting for its proxy).
    pub in_netns: bool,
}

impl Judged {
    fn just(verdict: Verdict) -> Judged {
        Judged {
            verdict,
            uncovered: None,
            proof: None,
            listening: false,
            in_netns: false,
        }
    }
}

/// Guard mode's verdict on the sandbox `status` (blocking: reads the learnt entry, enters
/// the netns), as the audit and `interlock check` give it: whether the guarded mesh's
/// plugin would redirect its pod ([`GuardedMesh::recognise`] on `annotations` and the
/// spec's `facts`), and if so whether a connection proves its traffic captured
/// ([`probe_sandbox`]; not probed yet while its proxy does not listen within
/// [`LISTEN_GRACE`]). `None`: the sandbox's netns is gone.
pub fn judge_sandbox(
    g: &GuardAudit,
    status: &interlock_cri::SandboxStatus,
    annotations: &std::collections::BTreeMap<String, String>,
    facts: Option<&interlock_contract::pod::PodFacts>,
) -> Option<Judged> {
    use interlock_contract::guard::{GuardPod, Recognition};
    let meta = &status.metadata;
    let pod = format!("{}/{}", meta.namespace, meta.name);
    if status.host_network {
        return Some(Judged::just(Verdict::NotMeshed {
            reason: "hostNetwork: no CNI plugin runs for it".into(),
        }));
    }
    let settings = g.settings();
    let gp = GuardPod {
        display: &pod,
        namespace: &meta.namespace,
        annotations: Some(annotations),
        facts,
    };
    match g.mesh.recognise(&gp, &settings.excluded) {
        Recognition::Meshed => {}
        Recognition::NotMeshed(reason) => return Some(Judged::just(Verdict::NotMeshed { reason })),
        Recognition::Undecidable(reason) => return Some(Judged::just(Verdict::Unknown { reason })),
    }
    let yaml = |s: &str| serde_yaml_ng::from_str::<Value>(s).map_err(|e| e.to_string());
    let inputs = match g.mesh.probe_inputs(&gp, settings.entry.as_ref(), &yaml) {
        Ok(i) => i,
        Err(e) => {
            return Some(Judged::just(Verdict::Unknown {
                reason: format!("{e} (excluded namespaces from {})", settings.source),
            }))
        }
    };
    let Some(path) = status.netns_path() else {
        return Some(Judged::just(Verdict::Unknown {
            reason: "the sandbox's netns path is unknown".into(),
        }));
    };
    let age = std::time::SystemTime::now()
        .duration_since(status.created_at())
        .unwrap_or_default();
    match probe_sandbox(path, g.mesh, &inputs, age) {
        Probed::Gone => None,
        Probed::Waiting => Some(Judged {
            in_netns: true,
            ..Judged::just(Verdict::Unknown {
                reason: format!(
                    "{WAITING}: its proxy does not listen on port {} yet; probed once it does, \
                     or with the port free {} s after the sandbox was created",
                    inputs.outbound_port,
                    LISTEN_GRACE.as_secs()
                ),
            })
        }),
        Probed::Done {
            outcome,
            uncovered,
            listening,
        } => Some(Judged {
            verdict: judge(g.mesh, &outcome),
            uncovered,
            proof: match outcome {
                ProbeOutcome::Captured(lines) => Some(lines),
                _ => None,
            },
            listening,
            in_netns: true,
        }),
    }
}

const TCP_LISTEN: u8 = 10;

/// The calling thread's netns's addresses, interface by interface in the kernel's order
/// (how the meshes' plugins walk them).
fn addresses() -> Vec<IpAddr> {
    let Ok(list) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    list.filter_map(|a| {
        let s = a.address?;
        s.as_sockaddr_in()
            .map(|v4| IpAddr::V4(v4.ip()))
            .or_else(|| s.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
    })
    .collect()
}

/// The IPv6 unicast destinations the calling thread's netns routes off `lo`.
fn ipv6_routes() -> Vec<(IpAddr, String)> {
    let (Ok(routes), Ok(links)) = (
        interlock_redirect::route::routes(),
        interlock_redirect::route::links(),
    ) else {
        return Vec::new();
    };
    let lo: Vec<u32> = links
        .iter()
        .filter(|l| l.name == "lo")
        .map(|l| l.index)
        .collect();
    routes
        .iter()
        .filter(|r| r.is_unicast() && Family::of_net(&r.dst) == Family::V6 && !lo.contains(&r.oif))
        .map(|r| (r.dst.addr(), r.dst.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use interlock_contract::guard::{GuardPod, Ipv6Capture, Recognition};

    fn inputs() -> ProbeInputs {
        ProbeInputs {
            outbound_port: 15001,
            proxy_uid: 1337,
            ipv6: Ipv6Capture::FirstAddressIsIpv6,
        }
    }

    /// A pod netns behind a veth whose other end (the pod's gateway) is in a "node"
    /// netns, IPv4 with a default route, and an IPv6 address that Istio leaves
    /// uncaptured (its first address is IPv4).
    fn pod_behind_node() -> (interlock_testkit::Netns, interlock_testkit::Netns) {
        let node = interlock_testkit::Netns::new("gnode").unwrap();
        let pod = interlock_testkit::Netns::new("gpod").unwrap();
        node.exec_ok(&[
            "ip",
            "link",
            "add",
            "gw0",
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            pod.name(),
        ]);
        node.exec_ok(&["ip", "addr", "add", "10.98.3.1/24", "dev", "gw0"]);
        node.exec_ok(&["ip", "link", "set", "gw0", "up"]);
        pod.exec_ok(&["ip", "addr", "add", "10.98.3.2/24", "dev", "eth0"]);
        pod.exec_ok(&["ip", "addr", "add", "fd98:3::2/64", "dev", "eth0", "nodad"]);
        pod.exec_ok(&["ip", "link", "set", "eth0", "up"]);
        pod.exec_ok(&["ip", "route", "add", "default", "via", "10.98.3.1"]);
        (node, pod)
    }

    /// The rules `mesh`'s own plugin writes for its default install (the shared cases,
    /// `interlock_mesh_cases::default_case`), for the families in `v6` (`false`: IPv4),
    /// loaded into `pod` as the plugin would: interlock never writes them.
    fn write_mesh_rules(
        pod: &interlock_testkit::Netns,
        mesh: interlock_mesh_cases::Mesh,
        v6: &[bool],
    ) {
        let case = interlock_mesh_cases::default_case(mesh);
        for &family in v6 {
            let tool = if family {
                "ip6tables-restore"
            } else {
                "iptables-restore"
            };
            let interlock_mesh_cases::MeshRules::Restore(text) = case.rules(family) else {
                panic!("{}: no rules for v6={family}", case.id())
            };
            interlock_testkit::traffic::restore_in(&pod.path(), tool, text);
        }
    }

    fn case_mesh(mesh: GuardedMesh) -> interlock_mesh_cases::Mesh {
        match mesh {
            GuardedMesh::Istio => interlock_mesh_cases::Mesh::Istio,
            GuardedMesh::Linkerd => interlock_mesh_cases::Mesh::Linkerd,
            GuardedMesh::Consul => interlock_mesh_cases::Mesh::Consul,
            GuardedMesh::Kuma => interlock_mesh_cases::Mesh::Kuma,
        }
    }

    /// Every mesh's default case, as its own plugin sees the pod: recognised as meshed,
    /// its probe inputs read from the pod (Kuma's YAML annotation included), not captured
    /// without rules, and captured once the rules that plugin writes are in the pod's
    /// netns (its proxy not listening: past the grace the probe binds the port). Kuma
    /// captures the pod's IPv6 too, and is proven for it: with its IPv4 rules alone (its
    /// IPv6 setup failed) the pod is not captured.
    #[test]
    fn every_meshs_own_rules_are_proven_captured() {
        interlock_testkit::require_root!();
        let yaml = |s: &str| serde_yaml_ng::from_str::<Value>(s).map_err(|e| e.to_string());
        for mesh in GuardedMesh::ALL {
            let case = interlock_mesh_cases::default_case(case_mesh(mesh));
            let pod = GuardPod {
                display: "default/p",
                namespace: "default",
                annotations: Some(&case.annotations),
                facts: Some(&case.facts),
            };
            assert_eq!(
                mesh.recognise(&pod, &[]),
                Recognition::Meshed,
                "{}",
                case.id()
            );
            let inputs = mesh
                .probe_inputs(&pod, None, &yaml)
                .unwrap_or_else(|e| panic!("{}: {e}", case.id()));
            assert_eq!(
                inputs.outbound_port,
                mesh.default_outbound_port(),
                "{}",
                case.id()
            );
            assert_eq!(inputs.proxy_uid, case.proxy_uid, "{}", case.id());

            let (_node, ns) = pod_behind_node();
            let old = LISTEN_GRACE + Duration::from_secs(1);
            let Probed::Done { outcome, .. } = probe_sandbox(&ns.path(), mesh, &inputs, old) else {
                panic!("{}: not probed", case.id())
            };
            assert!(
                matches!(outcome, ProbeOutcome::NotCaptured(_)),
                "{}: {outcome:?}",
                case.id()
            );
            // The pod has an IPv4 address first and a global IPv6 one: only Kuma (any
            // IPv6 address) writes IPv6 rules for it, and then demands them captured.
            let addrs: [IpAddr; 2] = ["10.98.3.2".parse().unwrap(), "fd98:3::2".parse().unwrap()];
            let v6 = inputs.ipv6.captures_ipv6(&addrs);
            assert_eq!(v6, mesh == GuardedMesh::Kuma, "{}", case.id());
            write_mesh_rules(&ns, case_mesh(mesh), &[false]);
            if v6 {
                // Kuma's IPv6 setup failing (silently, upstream): not captured.
                let Probed::Done { outcome, .. } = probe_sandbox(&ns.path(), mesh, &inputs, old)
                else {
                    panic!("{}: not probed", case.id())
                };
                let ProbeOutcome::NotCaptured(why) = &outcome else {
                    panic!("{}: {outcome:?}", case.id())
                };
                assert!(why.contains("fd98:3::1"), "{why}");
                write_mesh_rules(&ns, case_mesh(mesh), &[true]);
            }
            let Probed::Done { outcome, .. } = probe_sandbox(&ns.path(), mesh, &inputs, old) else {
                panic!("{}: not probed", case.id())
            };
            assert_eq!(
                judge(mesh, &outcome),
                Verdict::Protected,
                "{}: {outcome:?}",
                case.id()
            );
        }
    }

    /// The probe judges by a connection only: with no rules it says not captured (and a
    /// proxy that listens does not change that); with the rules istio-cni writes it says
    /// captured, through a listening proxy (sock_diag) and, past the grace, with the port
    /// free; a young sandbox whose proxy does not listen waits. The pod's IPv6, which
    /// Istio leaves uncaptured here, is reported, not judged.
    #[test]
    fn a_connection_tells_captured_from_not_captured() {
        interlock_testkit::require_root!();
        let (_node, pod) = pod_behind_node();
        let mesh = GuardedMesh::Istio;
        let old = LISTEN_GRACE + Duration::from_secs(1);
        let probe = |age| probe_sandbox(&pod.path(), mesh, &inputs(), age);

        assert_eq!(probe(Duration::ZERO), Probed::Waiting);
        let Probed::Done {
            outcome,
            uncovered,
            listening,
        } = probe(old)
        else {
            panic!("not probed")
        };
        assert!(!listening);
        assert!(
            matches!(outcome, ProbeOutcome::NotCaptured(_)),
            "{outcome:?}"
        );
        assert_eq!(judge(mesh, &outcome).label(), "unprotected");
        let why = uncovered.expect("the pod's IPv6 is routed and not captured");
        assert!(
            why.contains("fd98:3::/64") && why.contains("istio-cni"),
            "{why}"
        );

        // A proxy listening without the rules: still not captured.
        let proxy = pod.run(|| std::net::TcpListener::bind("0.0.0.0:15001").unwrap());
        let Probed::Done {
            outcome, listening, ..
        } = probe(Duration::ZERO)
        else {
            panic!("a listening proxy is probed at once")
        };
        assert!(listening);
        assert!(
            matches!(outcome, ProbeOutcome::NotCaptured(_)),
            "{outcome:?}"
        );

        write_mesh_rules(&pod, interlock_mesh_cases::Mesh::Istio, &[false]);
        let Probed::Done {
            outcome, uncovered, ..
        } = probe(Duration::ZERO)
        else {
            panic!("not probed")
        };
        let ProbeOutcome::Captured(lines) = &outcome else {
            panic!("{outcome:?}")
        };
        assert!(
            lines
                .iter()
                .any(|l| l.contains("10.98.3.1") && l.contains("running proxy")),
            "{lines:?}"
        );
        assert_eq!(judge(mesh, &outcome), Verdict::Protected);
        assert!(
            uncovered.is_some(),
            "reported every pass; the audit logs it once"
        );

        // The proxy gone: past the grace the probe binds the port itself.
        drop(proxy);
        let Probed::Done {
            outcome, listening, ..
        } = probe(old)
        else {
            panic!("not probed")
        };
        assert!(!listening);
        let ProbeOutcome::Captured(lines) = &outcome else {
            panic!("{outcome:?}")
        };
        assert!(
            lines
                .iter()
                .any(|l| l.contains("original destination 10.98.3.1")),
            "{lines:?}"
        );
        // Nothing of interlock's was written.
        let ruleset = pod.exec_ok(&["nft", "list", "tables"]);
        assert!(!ruleset.contains("interlock"), "{ruleset}");
    }

    #[test]
    fn the_probe_spec_demands_only_the_captured_families() {
        let v4 = probe_spec(&inputs(), false);
        v4.validate().unwrap();
        assert_eq!(v4.outbound.proxy_port, 15001);
        assert!(v4.outbound_capture_gap(Family::V4).is_none());
        let gap = v4.outbound_capture_gap(Family::V6).unwrap();
        assert!(gap.contains("::/0"), "{gap}");
        assert!(v4.captures_outbound(0, 0, "", "10.0.0.1".parse().unwrap(), 9));
        assert!(!v4.captures_outbound(1337, 0, "", "10.0.0.1".parse().unwrap(), 9));
        let dual = probe_spec(&inputs(), true);
        dual.validate().unwrap();
        assert!(dual.outbound_capture_gap(Family::V6).is_none());
    }

    #[test]
    fn verdicts_come_from_the_connection_only() {
        let m = GuardedMesh::Istio;
        assert_eq!(
            judge(m, &ProbeOutcome::Captured(vec!["IPv4: landed".into()])),
            Verdict::Protected
        );
        let Verdict::Unprotected { reason } =
            judge(m, &ProbeOutcome::NotCaptured("reset by 10.0.0.1".into()))
        else {
            panic!()
        };
        assert!(
            reason.contains("istio-cni") && reason.contains("reset by 10.0.0.1"),
            "{reason}"
        );
        assert_eq!(
            judge(m, &ProbeOutcome::CannotTell("x".into())).label(),
            "unknown"
        );
        assert_eq!(
            judge(m, &ProbeOutcome::NothingToProve(vec![])).label(),
            "unknown"
        );
        // Which probe errors mean "not captured".
        let not = classify(Err(ProbeError::NotRedirected {
            target: "10.0.0.1:9".parse().unwrap(),
            port: 15001,
            detail: "connection refused".into(),
        }));
        assert!(matches!(not, ProbeOutcome::NotCaptured(_)), "{not:?}");
        let cannot = classify(Err(ProbeError::NoTarget {
            family: Family::V4,
            reason: "no gateway".into(),
        }));
        assert!(matches!(cannot, ProbeOutcome::CannotTell(_)), "{cannot:?}");
        let empty = classify(Ok(ProbeReport::default()));
        assert!(
            matches!(empty, ProbeOutcome::NothingToProve(_)),
            "{empty:?}"
        );
    }

    #[test]
    fn probing_waits_for_the_listener_or_the_grace() {
        assert!(is_waiting(&Verdict::Unknown {
            reason: format!("{WAITING}: its proxy does not listen")
        }));
        assert!(!is_waiting(&Verdict::Unknown {
            reason: "netns unreadable".into()
        }));
        assert!(probe_now(true, Duration::ZERO));
        assert!(!probe_now(false, Duration::from_secs(5)));
        assert!(probe_now(false, LISTEN_GRACE));
    }

    #[test]
    fn an_uncaptured_routed_family_is_reported_not_judged() {
        let m = GuardedMesh::Linkerd;
        let net = |s: &str| {
            let addr = s.split('/').next().unwrap().parse::<IpAddr>().unwrap();
            (addr, s.to_string())
        };
        let (ll, global, default) = (net("fe80::/64"), net("fd00:1::/64"), net("::/0"));
        assert_eq!(
            uncovered(m, false, std::slice::from_ref(&ll)),
            None,
            "link-local only is not reported"
        );
        assert_eq!(uncovered(m, true, &[global.clone(), default.clone()]), None);
        let why = uncovered(m, false, &[ll, global, default]).unwrap();
        assert!(
            why.contains("fd00:1::/64") && why.contains("::/0") && why.contains("linkerd-cni"),
            "{why}"
        );
    }

    #[test]
    fn the_learnt_entry_is_read_for_its_mesh_only() {
        let file = serde_json::json!({
            "mesh": "istio",
            "entry": {"type": "istio-cni", "exclude_namespaces": ["kube-system", "istio-system"]},
            "source": "10-calico.conflist",
        });
        let e = learnt_entry(&file, GuardedMesh::Istio).unwrap();
        assert_eq!(e["type"], "istio-cni");
        assert_eq!(learnt_entry(&file, GuardedMesh::Kuma), None);
        assert_eq!(
            learnt_entry(&serde_json::json!({"mesh": "istio"}), GuardedMesh::Istio),
            None
        );

        let dir = interlock_testkit::tempdir().unwrap();
        let g = GuardAudit {
            mesh: GuardedMesh::Istio,
            state_dir: dir.path().to_path_buf(),
            fallback_excluded: vec!["kube-system".into()],
        };
        let s = g.settings();
        assert_eq!(
            (s.entry, s.excluded.clone()),
            (None, vec!["kube-system".to_string()])
        );
        assert!(
            s.source.contains("no istio-cni entry learnt yet"),
            "{}",
            s.source
        );
        std::fs::write(
            dir.path()
                .join(interlock_contract::layout::GUARD_ENTRY_FILE),
            file.to_string(),
        )
        .unwrap();
        let s = g.settings();
        assert_eq!(s.excluded, vec!["kube-system", "istio-system"]);
        assert!(s.entry.is_some() && s.source.contains("learnt"), "{s:?}");
    }
}

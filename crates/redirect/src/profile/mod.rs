//! Mesh profiles: turn a pod into a [`RedirectSpec`] exactly as each mesh's own CNI
//! plugin would program it, so that every connection lands where that mesh sends it.
//!
//! - [`istio`]: Istio sidecars in REDIRECT mode, as istio-cni configures them from the
//!   pod's annotations and its `istio-proxy` container (UID/GID, DNS capture).
//! - [`linkerd`]: Linkerd, as linkerd-cni configures it from the pod's annotations.
//! - [`consul`]: Consul transparent proxy, as consul-k8s's CNI plugin applies the
//!   `consul.hashicorp.com/redirect-traffic-config` annotation.
//! - [`generic`]: interlock's own `interlock.dev/*` annotations.
//!
//! A profile answers `Ok(None)` for a pod that is not its own, and an error for one that
//! is but whose settings cannot be turned into rules, or that needs the pod's spec when
//! only its annotations are known ([`SpecError::PodSpecNeeded`]): a pod whose mesh
//! settings cannot be known must not start unprotected. Invalid values are errors naming
//! the annotation and value, where the mesh's own plugin fails the pod too; where the
//! mesh ignores a bad value, so does its profile (each module says where).

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::spec::{
    port_runs, validate_ifname, InboundCapture, Loopback, OutboundCapture, PortSelection,
    RedirectSpec, SpecError, MAX_RULES_PER_LIST,
};

pub mod consul;
pub mod generic;
pub mod istio;
pub mod linkerd;

pub use interlock_contract::pod::PodFacts;
pub use interlock_contract::profile::{ProfileName, UnknownProfile};

/// What a profile reads from a pod: its annotations and, when known, the facts of its spec
/// ([`PodFacts`], from the agent's pod cache; the runtime hands the plugin annotations only).
#[derive(Debug, Clone, Copy)]
pub struct PodView<'a> {
    /// Every annotation of the pod.
    pub annotations: &'a BTreeMap<String, String>,
    /// The spec facts the profiles read, when a source that has the spec answered.
    pub facts: Option<&'a PodFacts>,
}

impl<'a> PodView<'a> {
    /// A pod known by its annotations alone.
    pub fn annotations_only(annotations: &'a BTreeMap<String, String>) -> PodView<'a> {
        PodView {
            annotations,
            facts: None,
        }
    }

    /// A pod known by its annotations and its spec facts.
    pub fn with_facts(
        annotations: &'a BTreeMap<String, String>,
        facts: &'a PodFacts,
    ) -> PodView<'a> {
        PodView {
            annotations,
            facts: Some(facts),
        }
    }

    fn get(&self, key: &str) -> Option<&'a str> {
        self.annotations.get(key).map(String::as_str)
    }
}

/// Decides whether a pod is meshed and builds its spec.
///
/// Profiles are tried in the order of `enabled`; the first that claims the pod builds the
/// spec. `Ok(None)` means no enabled profile claims the pod: it is not meshed and passes
/// through. An error means the pod is meshed but cannot be turned into rules now: fail
/// closed.
pub fn spec_for(
    pod: &PodView,
    enabled: &[ProfileName],
) -> Result<Option<(ProfileName, RedirectSpec)>, SpecError> {
    for &profile in enabled {
        let spec = match profile {
            ProfileName::Istio => istio::spec(pod)?,
            ProfileName::Linkerd => linkerd::spec(pod)?,
            ProfileName::Consul => consul::spec(pod)?,
            ProfileName::Generic => generic::spec(pod)?,
        };
        if let Some(spec) = spec {
            let spec = spec.normalized();
            spec.validate()?;
            return Ok(Some((profile, spec)));
        }
    }
    Ok(None)
}

/// The spec facts of `pod`, or the error saying `profile` needs them for `what`.
fn facts<'a>(
    pod: &PodView<'a>,
    profile: ProfileName,
    what: &str,
) -> Result<&'a PodFacts, SpecError> {
    pod.facts.ok_or_else(|| SpecError::PodSpecNeeded {
        profile,
        what: what.to_string(),
    })
}

fn invalid(key: &str, value: &str, reason: impl Into<String>) -> SpecError {
    // Keep a huge value from swamping the message (it names the annotation anyway).
    let value = match value.char_indices().nth(120) {
        Some((end, _)) => format!("{}… ({} bytes)", &value[..end], value.len()),
        None => value.to_string(),
    };
    SpecError::Annotation {
        annotation: key.to_string(),
        value,
        reason: reason.into(),
    }
}

fn unsupported(key: &str, value: &str, reason: impl Into<String>) -> SpecError {
    SpecError::Unsupported {
        annotation: key.to_string(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// Refuses a list that would need more than [`MAX_RULES_PER_LIST`] rules (one per port
/// run or network): no real annotation comes near, and one transaction must stay well
/// within what the kernel accepts in one netlink message.
fn check_list_size(key: &str, value: &str, rules: usize, what: &str) -> Result<(), SpecError> {
    if rules > MAX_RULES_PER_LIST {
        return Err(invalid(
            key,
            value,
            format!(
                "{rules} separate {what} need one rule each, more than the {MAX_RULES_PER_LIST} interlock allows per annotation; merge neighbouring ports into ranges (8000-8100) or networks into wider CIDRs"
            ),
        ));
    }
    Ok(())
}

fn check_ports_size(key: &str, value: &str, ports: &[u16]) -> Result<(), SpecError> {
    check_list_size(key, value, port_runs(ports).len(), "port ranges")
}

/// A number in 1–65535 (`what` names it in the error).
fn parse_port(key: &str, value: &str, item: &str) -> Result<u16, SpecError> {
    let n: u64 = item.parse().map_err(|_| {
        invalid(
            key,
            value,
            format!("{item:?} is not a port number (expected 1-65535)"),
        )
    })?;
    if n == 0 || n > 65535 {
        return Err(invalid(
            key,
            value,
            format!("port {n} is out of range 1-65535"),
        ));
    }
    Ok(n as u16)
}

/// A UID or GID other than 0.
fn parse_id(key: &str, value: &str, what: &str) -> Result<u32, SpecError> {
    let n: u32 = value
        .trim()
        .parse()
        .map_err(|_| invalid(key, value, format!("{what} must be a non-negative integer")))?;
    if n == 0 {
        return Err(invalid(
            key,
            value,
            format!("{what} 0 (root) would exempt every root process from capture"),
        ));
    }
    Ok(n)
}

/// Go's `strconv.ParseBool`: `Some(b)` for its spellings, `None` for anything else.
fn go_parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

fn parse_ifnames(key: &str, value: &str) -> Result<Vec<String>, SpecError> {
    let mut out = Vec::new();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        validate_ifname(item).map_err(|r| invalid(key, value, r))?;
        out.push(item.to_string());
    }
    Ok(out)
}

/// A CIDR or a bare address (a host route), host bits cleared.
fn parse_net_or_addr(item: &str) -> Option<IpNet> {
    item.parse::<IpNet>()
        .ok()
        .or_else(|| item.parse::<IpAddr>().ok().map(IpNet::from))
        .map(|n| n.trunc())
}

/// The spec every profile starts from: capture everything in both directions, both
/// families, everything through `lo` passes.
pub fn base_spec(uid: u32, gid: Option<u32>, inbound: u16, outbound: u16) -> RedirectSpec {
    RedirectSpec {
        proxy_uid: uid,
        proxy_gid: gid,
        exempt_uids: Vec::new(),
        inbound: InboundCapture {
            proxy_port: inbound,
            include_ports: PortSelection::All,
            exclude_ports: Vec::new(),
            exclude_sources: Vec::new(),
        },
        outbound: OutboundCapture {
            proxy_port: outbound,
            include_ports: PortSelection::All,
            exclude_ports: Vec::new(),
            include_cidrs: Vec::new(),
            exclude_cidrs: Vec::new(),
            any_destination_ports: Vec::new(),
        },
        loopback: Loopback::default(),
        dns: None,
        drop_invalid: false,
        exclude_interfaces: Vec::new(),
        ipv4: true,
        ipv6: true,
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! Helpers for the profile tests.
    use super::*;
    use interlock_contract::pod::ContainerFacts;

    pub fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// A pod with one app container and, when `proxy` is given, that proxy container.
    pub fn facts_with(proxy: Option<ContainerFacts>) -> PodFacts {
        let mut containers = vec![ContainerFacts::named("app", false)];
        containers.extend(proxy);
        PodFacts {
            labels: BTreeMap::new(),
            containers,
        }
    }

    pub fn decide(
        pairs: &[(&str, &str)],
        facts: Option<&PodFacts>,
    ) -> Result<Option<(ProfileName, RedirectSpec)>, SpecError> {
        let a = ann(pairs);
        spec_for(
            &PodView {
                annotations: &a,
                facts,
            },
            &ProfileName::ALL,
        )
    }

    pub fn assert_names(e: &SpecError, key: &str, value: &str) {
        let msg = e.to_string();
        assert!(msg.contains(key), "{msg}");
        assert!(msg.contains(value), "{msg}");
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    #[test]
    fn profile_names_parse_and_print() {
        for p in ProfileName::ALL {
            assert_eq!(p.as_str().parse::<ProfileName>().unwrap(), p);
            assert_eq!(
                serde_json::to_string(&p).unwrap(),
                format!("\"{}\"", p.as_str())
            );
        }
        assert!("kuma"
            .parse::<ProfileName>()
            .unwrap_err()
            .to_string()
            .contains("kuma"));
    }

    #[test]
    fn go_booleans() {
        for t in ["1", "t", "T", "true", "TRUE", "True"] {
            assert_eq!(go_parse_bool(t), Some(true));
        }
        for f in ["0", "f", "F", "false", "FALSE", "False"] {
            assert_eq!(go_parse_bool(f), Some(false));
        }
        for x in ["yes", "", " true", "tRue"] {
            assert_eq!(go_parse_bool(x), None);
        }
    }

    #[test]
    fn priority_follows_enabled_order() {
        let both = ann(&[
            ("interlock.dev/redirect", "enabled"),
            ("sidecar.istio.io/status", "{}"),
        ]);
        let facts = facts_with(Some(interlock_contract::pod::ContainerFacts::named(
            "istio-proxy",
            false,
        )));
        let pod = PodView::with_facts(&both, &facts);
        assert_eq!(
            spec_for(&pod, &ProfileName::ALL).unwrap().unwrap().0,
            ProfileName::Istio
        );
        assert_eq!(
            spec_for(&pod, &[ProfileName::Generic, ProfileName::Istio])
                .unwrap()
                .unwrap()
                .0,
            ProfileName::Generic
        );
        assert_eq!(spec_for(&pod, &[]).unwrap(), None);
        // A profile that is not enabled does not even parse its annotations.
        let bad = ann(&[
            ("interlock.dev/redirect", "enabled"),
            ("interlock.dev/outbound-port", "x"),
        ]);
        assert_eq!(
            spec_for(&PodView::annotations_only(&bad), &[ProfileName::Istio]).unwrap(),
            None
        );
    }

    #[test]
    fn a_pod_that_needs_its_spec_says_so() {
        let a = ann(&[("sidecar.istio.io/status", "{}")]);
        let e = spec_for(&PodView::annotations_only(&a), &ProfileName::ALL).unwrap_err();
        assert!(
            matches!(
                e,
                SpecError::PodSpecNeeded {
                    profile: ProfileName::Istio,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("agent"), "{e}");
        // Not an istio pod at all: no facts needed to say so.
        assert_eq!(
            spec_for(&PodView::annotations_only(&ann(&[])), &ProfileName::ALL).unwrap(),
            None
        );
    }
}

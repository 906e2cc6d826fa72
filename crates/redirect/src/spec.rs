//! The one rule model every profile produces and every backend applies.
//!
//! # Semantics (every backend implements exactly this)
//!
//! TCP is captured, and UDP only for DNS. For each enabled address family, the first
//! step that applies decides; "passes" means not redirected.
//!
//! **Inbound** (nat prerouting: connections arriving from outside the pod), a TCP
//! connection is redirected to `inbound.proxy_port` unless:
//! 1. it arrives on an interface in `exclude_interfaces`;
//! 2. its destination port is in `inbound.exclude_ports`;
//! 3. its source address is in `inbound.exclude_sources`;
//! 4. `inbound.include_ports` is `Only(list)` and the destination port is not in `list`.
//!
//! **Outbound** (nat output: connections a pod process opens), in this order:
//! 1. leaving through an interface in `exclude_interfaces`: passes;
//! 2. DNS that `dns` captures without exempting the proxy (`proxyExempt: false`): to
//!    `dns.port`;
//! 3. destination port in `outbound.exclude_ports` (any protocol): passes;
//! 4. with `loopback.passthroughSource`, leaving through `lo` from 127.0.0.6 or `::6`:
//!    passes;
//! 5. with `loopback.proxyToInbound`, a TCP connection of the proxy's UID leaving through
//!    `lo` to a destination other than 127.0.0.1 / `::1`, to a port outside
//!    `loopback.proxyToInbound.skipPorts` (and not 53 while `dns` is set): to
//!    `inbound.proxy_port` — how a proxy reaches its own pod's services through its
//!    inbound side;
//! 6. with `loopback.appBypass`, leaving through `lo` from any UID but the proxy's (except
//!    port 53 while `dns` is set): passes;
//! 7. the proxy's UID: passes;
//! 8. as 5, for the proxy's GID (skip ports without the DNS exception);
//! 9. the proxy's GID, or a UID in `exempt_uids`: passes;
//! 10. DNS that `dns` captures (`proxyExempt: true`): to `dns.port`;
//! 11. without `loopback.appBypass`, destination 127.0.0.1 or `::1`: passes;
//! 12. anything but TCP: passes;
//! 13. destination in `outbound.exclude_cidrs` (of this family): passes;
//! 14. destination port in `outbound.any_destination_ports`: to `outbound.proxy_port`;
//! 15. destination in `outbound.include_cidrs` (every destination when that list is
//!     empty; none of a family without a network of its own there) and port selected by
//!     `outbound.include_ports`: to `outbound.proxy_port`;
//! 16. anything else passes.
//!
//! DNS captured means UDP or TCP to port 53 at a destination `dns.to` names. The
//! defaults of the loopback settings (`appBypass` only) make everything through `lo`
//! pass. [`RedirectSpec::outbound`] and [`RedirectSpec::inbound`] are these semantics as
//! pure functions; the backends' rules are held to them by tests, and the profiles to
//! the meshes' own rules by the differential tests.
//!
//! Port lists may be long (ranges in annotations are expanded); backends compress them
//! with [`port_runs`].

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::ops::RangeInclusive;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use interlock_contract::profile::ProfileName;

/// The most rules one list of a spec may need (port runs, networks): far within what the
/// kernel accepts in one transaction even with every list at the limit, and far above
/// any real annotation. Profiles refuse longer lists naming the annotation.
pub const MAX_RULES_PER_LIST: usize = 1024;

/// Everything a backend needs to capture a pod's traffic to its proxy.
///
/// Fields added after the first release default to what that release did and are left
/// out of the canonical JSON while they hold their default, so a spec that needs none of
/// them hashes as it did (the per-attachment state records that hash).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RedirectSpec {
    /// UID the proxy runs as; its own outbound traffic is never captured.
    pub proxy_uid: u32,
    /// GID the proxy runs as; also exempt from outbound capture when set.
    pub proxy_gid: Option<u32>,
    /// Further UIDs whose outbound traffic is never captured (Consul's init container).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exempt_uids: Vec<u32>,
    /// Inbound capture (traffic arriving at the pod).
    pub inbound: InboundCapture,
    /// Outbound capture (traffic the pod's processes originate).
    pub outbound: OutboundCapture,
    /// What happens to traffic through the loopback interface.
    #[serde(default, skip_serializing_if = "Loopback::is_default")]
    pub loopback: Loopback,
    /// DNS sent to the proxy's DNS port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<DnsCapture>,
    /// Drop inbound packets conntrack finds invalid (Istio's `INVALID_DROP`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub drop_invalid: bool,
    /// Interfaces whose traffic is never captured (besides loopback).
    pub exclude_interfaces: Vec<String>,
    /// Program IPv4 rules.
    pub ipv4: bool,
    /// Program IPv6 rules.
    pub ipv6: bool,
}

/// Which destination ports are captured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "mode", content = "ports")]
pub enum PortSelection {
    /// Every port (minus the exclusions).
    All,
    /// Only these ports (minus the exclusions); empty means none.
    Only(Vec<u16>),
}

impl PortSelection {
    /// True when `port` is selected (exclusions not considered).
    pub fn contains(&self, port: u16) -> bool {
        match self {
            PortSelection::All => true,
            PortSelection::Only(list) => list.contains(&port),
        }
    }
}

/// Inbound capture settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InboundCapture {
    /// Port the proxy accepts redirected inbound connections on.
    pub proxy_port: u16,
    /// Ports captured.
    pub include_ports: PortSelection,
    /// Ports never captured (the proxy's own admin/health ports belong here).
    pub exclude_ports: Vec<u16>,
    /// Source networks whose connections are never captured (Linkerd's `skip-subnets`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude_sources: Vec<IpNet>,
}

/// Outbound capture settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutboundCapture {
    /// Port the proxy accepts redirected outbound connections on.
    pub proxy_port: u16,
    /// Destination ports captured (to the included networks).
    pub include_ports: PortSelection,
    /// Destination ports never captured.
    pub exclude_ports: Vec<u16>,
    /// Destination networks captured; empty means every destination.
    pub include_cidrs: Vec<IpNet>,
    /// Destination networks never captured.
    pub exclude_cidrs: Vec<IpNet>,
    /// Destination ports captured to any destination that is not excluded, inside the
    /// included networks or not (Istio's `includeOutboundPorts`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub any_destination_ports: Vec<u16>,
}

/// The source address Envoy binds for its inbound passthrough connections, per family.
pub const PASSTHROUGH_SOURCE_V4: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 6);
/// The IPv6 form of [`PASSTHROUGH_SOURCE_V4`], added to `lo` when it is used.
pub const PASSTHROUGH_SOURCE_V6: Ipv6Addr = Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 6);

/// Traffic through the loopback interface (semantics steps 4–8 and 11).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Loopback {
    /// Everything but the proxy's traffic through `lo` passes. Without it, traffic to
    /// 127.0.0.1 and `::1` passes and the rest of `lo` is captured like any destination.
    #[serde(default = "yes")]
    pub app_bypass: bool,
    /// The proxy's own connections to its pod through `lo` go to the inbound port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_to_inbound: Option<ProxyToInbound>,
    /// Connections from 127.0.0.6 / `::6` through `lo` pass, and `::6` is on `lo`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub passthrough_source: bool,
}

fn yes() -> bool {
    true
}

impl Default for Loopback {
    fn default() -> Loopback {
        Loopback {
            app_bypass: true,
            proxy_to_inbound: None,
            passthrough_source: false,
        }
    }
}

impl Loopback {
    /// Everything through `lo` passes (what interlock always did, and Linkerd does).
    pub fn is_default(&self) -> bool {
        *self == Loopback::default()
    }
}

/// The proxy's connections to its own pod through `lo`, sent to the inbound port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyToInbound {
    /// Destination ports left alone (Istio's HBONE port 15008).
    pub skip_ports: Vec<u16>,
}

/// DNS sent to the proxy's DNS listener.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DnsCapture {
    /// The port the proxy's DNS listener has on the loopback address.
    pub port: u16,
    /// Which queries: empty for DNS to any address, else only to these loopback
    /// addresses (a family without one of its own has no DNS capture).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub only_to: Vec<IpAddr>,
    /// The proxy's own queries (and those of `exempt_uids`) are left alone; without it
    /// DNS is captured before any exemption.
    pub proxy_exempt: bool,
    /// The proxy's upstream queries and the applications' queries to the proxy are
    /// tracked in separate conntrack zones (1 and 2), as Istio's raw-table rules do, so
    /// that the two legs of one query never share a conntrack entry.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub conntrack_zones: bool,
}

impl DnsCapture {
    /// True when a query to `dst` (port 53) is captured.
    pub fn captures(&self, dst: IpAddr) -> bool {
        self.only_to.is_empty() || self.only_to.contains(&dst)
    }

    /// The addresses of one family that `only_to` names.
    pub fn only_to(&self, family: Family) -> Vec<IpAddr> {
        self.only_to
            .iter()
            .copied()
            .filter(|a| Family::of(a) == family)
            .collect()
    }

    /// True when some query of `family` is captured.
    pub fn covers(&self, family: Family) -> bool {
        self.only_to.is_empty() || !self.only_to(family).is_empty()
    }
}

/// The DNS port.
pub const DNS_PORT: u16 = 53;

/// A transport protocol the rules tell apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

/// A new outbound flow a pod process opens, as the rules see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutboundFlow<'a> {
    /// Socket owner UID.
    pub uid: u32,
    /// Socket owner GID.
    pub gid: u32,
    /// Interface it leaves through (`lo` for a destination on the pod itself).
    pub out_if: &'a str,
    /// Source address (`None`: not bound, any but the passthrough source).
    pub src: Option<IpAddr>,
    /// Destination address.
    pub dst: IpAddr,
    /// Transport.
    pub transport: Transport,
    /// Destination port.
    pub port: u16,
}

/// Where the rules send a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Landing {
    /// Not redirected.
    Passes,
    /// To the outbound proxy port.
    Outbound,
    /// To the inbound proxy port.
    Inbound,
    /// To the proxy's DNS port.
    Dns,
}

/// An IP address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl Family {
    /// The family of an address.
    pub fn of(ip: &IpAddr) -> Family {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    /// The family of a network.
    pub fn of_net(net: &IpNet) -> Family {
        match net {
            IpNet::V4(_) => Family::V4,
            IpNet::V6(_) => Family::V6,
        }
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

/// Why a spec, or the annotation it was built from, is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// A pod annotation has a value interlock cannot use.
    #[error("pod annotation {annotation}={value:?} is invalid: {reason}; fix the annotation on the pod (or its template)")]
    Annotation {
        /// Full annotation key.
        annotation: String,
        /// The value as found on the pod.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A pod annotation asks for something interlock does not implement.
    #[error("pod annotation {annotation}={value:?} is not supported: {reason}")]
    Unsupported {
        /// Full annotation key.
        annotation: String,
        /// The value as found on the pod.
        value: String,
        /// What is not supported and what to use instead.
        reason: String,
    },
    /// The pod is this profile's, but its rules depend on the pod's spec (the mesh's own
    /// plugin reads it), which only the agent's pod cache has.
    #[error("pod spec needed: the {profile} profile takes {what} from the pod's spec, which the runtime does not pass to a CNI plugin; only the interlock agent (agentSocket) can tell them")]
    PodSpecNeeded {
        /// The profile that claims the pod.
        profile: ProfileName,
        /// What it reads from the spec.
        what: String,
    },
    /// A field of the spec itself is invalid (spec built in code or read from state).
    #[error("redirect spec field {field} is invalid: {reason}")]
    Field {
        /// Field path, e.g. `outbound.proxyPort`.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

impl RedirectSpec {
    /// The families to program, in order (IPv4 first).
    pub fn families(&self) -> Vec<Family> {
        let mut out = Vec::with_capacity(2);
        if self.ipv4 {
            out.push(Family::V4);
        }
        if self.ipv6 {
            out.push(Family::V6);
        }
        out
    }

    /// Why no outbound TCP connection of `family` to a destination off the pod is
    /// captured, whatever its interface, or `None` when some destination and port are
    /// (the probe then has something to prove). Covers the family not being programmed,
    /// every port excluded (or an empty include list), and the excluded networks
    /// covering every destination (or every included network), e.g.
    /// `excludeOutboundIPRanges: 0.0.0.0/0`.
    pub fn outbound_capture_gap(&self, family: Family) -> Option<String> {
        if !self.families().contains(&family) {
            return Some(format!("the spec does not program {family}"));
        }
        let excluded_ports: BTreeSet<u16> = self.outbound.exclude_ports.iter().copied().collect();
        let open = |p: &u16| !excluded_ports.contains(p);
        let any_destination_port = self.outbound.any_destination_ports.iter().any(open);
        let any_port = any_destination_port
            || match &self.outbound.include_ports {
                PortSelection::All => (1..=u16::MAX).any(|p| open(&p)),
                PortSelection::Only(list) => list.iter().any(open),
            };
        if !any_port {
            return Some("every outbound port is excluded".to_string());
        }
        let excluded = IpNet::aggregate(&self.exclude_cidrs(family));
        let covered = |net: &IpNet| excluded.iter().any(|x| x.contains(net));
        let all = match family {
            Family::V4 => IpNet::from(ipnet::Ipv4Net::default()),
            Family::V6 => IpNet::from(ipnet::Ipv6Net::default()),
        };
        if covered(&all) {
            return Some(format!("every {family} destination is excluded ({all} is)"));
        }
        if self.outbound.include_cidrs.is_empty() || any_destination_port {
            return None;
        }
        let include = self.include_cidrs(family);
        if include.is_empty() {
            return Some(format!(
                "the outbound include list has no {family} network, so no {family} destination is captured"
            ));
        }
        if include.iter().all(covered) {
            return Some(format!("every included {family} network is also excluded"));
        }
        None
    }

    /// Checks every field; the first problem found is returned.
    pub fn validate(&self) -> Result<(), SpecError> {
        fn field(field: &'static str, reason: impl Into<String>) -> SpecError {
            SpecError::Field {
                field,
                reason: reason.into(),
            }
        }
        if self.proxy_uid == 0 {
            return Err(field(
                "proxyUid",
                "UID 0 would exempt every root process from capture",
            ));
        }
        if self.proxy_gid == Some(0) {
            return Err(field(
                "proxyGid",
                "GID 0 would exempt every root-group process from capture",
            ));
        }
        if !self.ipv4 && !self.ipv6 {
            return Err(field("ipv4/ipv6", "at least one address family is needed"));
        }
        if self.inbound.proxy_port == 0 {
            return Err(field("inbound.proxyPort", "port 0 is not a valid port"));
        }
        if self.outbound.proxy_port == 0 {
            return Err(field("outbound.proxyPort", "port 0 is not a valid port"));
        }
        let no_zero = |name: &'static str, ports: &[u16]| {
            if ports.contains(&0) {
                Err(field(name, "port 0 is not a valid port"))
            } else {
                Ok(())
            }
        };
        let sized = |name: &'static str, rules: usize| {
            if rules > MAX_RULES_PER_LIST {
                Err(field(
                    name,
                    format!("{rules} rules, more than {MAX_RULES_PER_LIST}"),
                ))
            } else {
                Ok(())
            }
        };
        sized(
            "inbound.excludePorts",
            port_runs(&self.inbound.exclude_ports).len(),
        )?;
        sized(
            "outbound.excludePorts",
            port_runs(&self.outbound.exclude_ports).len(),
        )?;
        for (name, sel) in [
            ("inbound.includePorts", &self.inbound.include_ports),
            ("outbound.includePorts", &self.outbound.include_ports),
        ] {
            if let PortSelection::Only(list) = sel {
                sized(name, port_runs(list).len())?;
            }
        }
        sized("outbound.includeCidrs", self.outbound.include_cidrs.len())?;
        sized("outbound.excludeCidrs", self.outbound.exclude_cidrs.len())?;
        no_zero("inbound.excludePorts", &self.inbound.exclude_ports)?;
        no_zero("outbound.excludePorts", &self.outbound.exclude_ports)?;
        if let PortSelection::Only(list) = &self.inbound.include_ports {
            no_zero("inbound.includePorts", list)?;
        }
        if let PortSelection::Only(list) = &self.outbound.include_ports {
            no_zero("outbound.includePorts", list)?;
        }
        for name in &self.exclude_interfaces {
            validate_ifname(name).map_err(|reason| field("excludeInterfaces", reason))?;
        }
        if self.exempt_uids.contains(&0) {
            return Err(field(
                "exemptUids",
                "UID 0 would exempt every root process from capture",
            ));
        }
        sized("exemptUids", self.exempt_uids.len())?;
        sized(
            "outbound.anyDestinationPorts",
            port_runs(&self.outbound.any_destination_ports).len(),
        )?;
        no_zero(
            "outbound.anyDestinationPorts",
            &self.outbound.any_destination_ports,
        )?;
        sized("inbound.excludeSources", self.inbound.exclude_sources.len())?;
        if let Some(p) = &self.loopback.proxy_to_inbound {
            sized("loopback.proxyToInbound.skipPorts", p.skip_ports.len())?;
        }
        if let Some(dns) = &self.dns {
            if dns.port == 0 {
                return Err(field("dns.port", "port 0 is not a valid port"));
            }
            if let Some(a) = dns.only_to.iter().find(|a| !is_localhost(**a)) {
                return Err(field(
                    "dns.onlyTo",
                    format!("{a} is not 127.0.0.1 or ::1: DNS is only ever sent to the proxy's listener on the loopback address"),
                ));
            }
        }
        Ok(())
    }

    /// The same spec with every list sorted and deduplicated and every CIDR truncated to
    /// its network address, so equal meanings compare (and hash) equal.
    pub fn normalized(&self) -> RedirectSpec {
        let mut s = self.clone();
        sort_dedup(&mut s.inbound.exclude_ports);
        sort_dedup(&mut s.outbound.exclude_ports);
        if let PortSelection::Only(list) = &mut s.inbound.include_ports {
            sort_dedup(list);
        }
        if let PortSelection::Only(list) = &mut s.outbound.include_ports {
            sort_dedup(list);
        }
        for list in [&mut s.outbound.include_cidrs, &mut s.outbound.exclude_cidrs] {
            for net in list.iter_mut() {
                *net = net.trunc();
            }
            sort_dedup(list);
        }
        sort_dedup(&mut s.exclude_interfaces);
        sort_dedup(&mut s.exempt_uids);
        sort_dedup(&mut s.outbound.any_destination_ports);
        for net in s.inbound.exclude_sources.iter_mut() {
            *net = net.trunc();
        }
        sort_dedup(&mut s.inbound.exclude_sources);
        if let Some(p) = &mut s.loopback.proxy_to_inbound {
            sort_dedup(&mut p.skip_ports);
        }
        if let Some(dns) = &mut s.dns {
            sort_dedup(&mut dns.only_to);
        }
        s
    }

    /// Canonical JSON of the normalized spec (stable field order, sorted lists).
    pub fn canonical_json(&self) -> String {
        serde_json::to_string(&self.normalized()).expect("a RedirectSpec always serializes")
    }

    /// Hex SHA-256 of [`RedirectSpec::canonical_json`]: equal for equal meanings, recorded in
    /// per-attachment state to tell whether the rules in a netns are the ones wanted now.
    pub fn hash(&self) -> String {
        Self::hash_of_canonical(&self.canonical_json())
    }

    /// This spec as interlock installs it in a pod's netns: the rules of both families,
    /// whatever addresses the pod has (a family without addresses then has its rules
    /// and nothing to capture). The plugin installs this, and every reader that checks
    /// what a netns holds (the agent's audit, `check`, `inspect`) compares with this.
    pub fn as_installed(&self) -> RedirectSpec {
        RedirectSpec {
            ipv4: true,
            ipv6: true,
            ..self.clone()
        }
    }

    /// [`RedirectSpec::canonical_json`] and [`RedirectSpec::hash`] together, rendering the
    /// spec once (a caller that records both).
    pub fn canonical_and_hash(&self) -> (String, String) {
        let canonical = self.canonical_json();
        let hash = Self::hash_of_canonical(&canonical);
        (canonical, hash)
    }

    fn hash_of_canonical(canonical: &str) -> String {
        hex::encode(Sha256::digest(canonical.as_bytes()))
    }

    /// The include CIDRs of one family (empty: see [`OutboundCapture::include_cidrs`]).
    pub fn include_cidrs(&self, family: Family) -> Vec<IpNet> {
        cidrs_of(&self.outbound.include_cidrs, family)
    }

    /// The exclude CIDRs of one family.
    pub fn exclude_cidrs(&self, family: Family) -> Vec<IpNet> {
        cidrs_of(&self.outbound.exclude_cidrs, family)
    }

    /// The exclude source networks of one family (inbound).
    pub fn exclude_sources(&self, family: Family) -> Vec<IpNet> {
        cidrs_of(&self.inbound.exclude_sources, family)
    }

    /// Where the rules send a new outbound flow: the outbound semantics of this module
    /// as a pure function (the probe picks its targets with it; tests hold the backends
    /// to it).
    pub fn outbound(&self, f: &OutboundFlow) -> Landing {
        let family = Family::of(&f.dst);
        if !self.families().contains(&family) {
            return Landing::Passes;
        }
        let lo = f.out_if == "lo";
        let tcp = f.transport == Transport::Tcp;
        let dns_query = |dns: &DnsCapture| f.port == DNS_PORT && dns.captures(f.dst);
        let to_self = lo && !is_localhost(f.dst) && tcp;
        let dns_port_spared = self.dns.is_some() && f.port == DNS_PORT;
        if self.exclude_interfaces.iter().any(|i| i == f.out_if) {
            return Landing::Passes;
        }
        if let Some(dns) = self.dns.as_ref().filter(|d| !d.proxy_exempt) {
            if dns_query(dns) {
                return Landing::Dns;
            }
        }
        if self.outbound.exclude_ports.contains(&f.port) {
            return Landing::Passes;
        }
        if self.loopback.passthrough_source && lo && f.src.is_some_and(is_passthrough_source) {
            return Landing::Passes;
        }
        let hairpin = self.loopback.proxy_to_inbound.as_ref();
        let proxy_uid = f.uid == self.proxy_uid;
        if let Some(h) = hairpin {
            if proxy_uid && to_self && !h.skip_ports.contains(&f.port) && !dns_port_spared {
                return Landing::Inbound;
            }
        }
        if self.loopback.app_bypass && lo && !proxy_uid && !dns_port_spared {
            return Landing::Passes;
        }
        if proxy_uid {
            return Landing::Passes;
        }
        let proxy_gid = self.proxy_gid == Some(f.gid);
        if let Some(h) = hairpin {
            if proxy_gid && to_self && !h.skip_ports.contains(&f.port) {
                return Landing::Inbound;
            }
        }
        if proxy_gid || self.exempt_uids.contains(&f.uid) {
            return Landing::Passes;
        }
        if let Some(dns) = self.dns.as_ref().filter(|d| d.proxy_exempt) {
            if dns_query(dns) {
                return Landing::Dns;
            }
        }
        if !self.loopback.app_bypass && is_localhost(f.dst) {
            return Landing::Passes;
        }
        if !tcp
            || self
                .exclude_cidrs(family)
                .iter()
                .any(|n| n.contains(&f.dst))
        {
            return Landing::Passes;
        }
        if self.outbound.any_destination_ports.contains(&f.port) {
            return Landing::Outbound;
        }
        let included = self.outbound.include_cidrs.is_empty()
            || self
                .include_cidrs(family)
                .iter()
                .any(|n| n.contains(&f.dst));
        if included && self.outbound.include_ports.contains(f.port) {
            Landing::Outbound
        } else {
            Landing::Passes
        }
    }

    /// Whether a TCP connection opened by a process with `uid`/`gid` to `dst:port`, leaving
    /// through interface `out_if` from an unbound source, would be redirected to the
    /// outbound proxy port ([`RedirectSpec::outbound`]).
    pub fn captures_outbound(
        &self,
        uid: u32,
        gid: u32,
        out_if: &str,
        dst: IpAddr,
        port: u16,
    ) -> bool {
        self.outbound(&OutboundFlow {
            uid,
            gid,
            out_if,
            src: None,
            dst,
            transport: Transport::Tcp,
            port,
        }) == Landing::Outbound
    }

    /// Whether a TCP connection from `src`, arriving on `in_if` for destination port
    /// `port`, would be redirected to the inbound proxy port (the inbound semantics).
    pub fn inbound(&self, in_if: &str, src: IpAddr, port: u16) -> Landing {
        let family = Family::of(&src);
        let captured = self.families().contains(&family)
            && !self.exclude_interfaces.iter().any(|i| i == in_if)
            && !self.inbound.exclude_ports.contains(&port)
            && !self
                .exclude_sources(family)
                .iter()
                .any(|n| n.contains(&src))
            && self.inbound.include_ports.contains(port);
        if captured {
            Landing::Inbound
        } else {
            Landing::Passes
        }
    }

    /// [`RedirectSpec::inbound`] for a source outside every excluded network.
    pub fn captures_inbound(&self, in_if: &str, port: u16) -> bool {
        !self.exclude_interfaces.iter().any(|i| i == in_if)
            && !self.inbound.exclude_ports.contains(&port)
            && self.inbound.include_ports.contains(port)
    }
}

/// 127.0.0.1 or `::1`: the address REDIRECT sends local traffic to.
pub fn is_localhost(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a == Ipv4Addr::LOCALHOST,
        IpAddr::V6(a) => a == Ipv6Addr::LOCALHOST,
    }
}

/// 127.0.0.6 or `::6`.
pub fn is_passthrough_source(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a == PASSTHROUGH_SOURCE_V4,
        IpAddr::V6(a) => a == PASSTHROUGH_SOURCE_V6,
    }
}

fn cidrs_of(list: &[IpNet], family: Family) -> Vec<IpNet> {
    list.iter()
        .filter(|n| Family::of_net(n) == family)
        .map(|n| n.trunc())
        .collect()
}

fn sort_dedup<T: Ord>(v: &mut Vec<T>) {
    v.sort();
    v.dedup();
}

/// Checks a Linux interface name (1–15 bytes, no `/`, no whitespace, not `.`/`..`).
pub fn validate_ifname(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 15 {
        return Err(format!(
            "interface name {name:?} must be 1 to 15 characters long"
        ));
    }
    if name == "." || name == ".." || name.chars().any(|c| c == '/' || c.is_whitespace()) {
        return Err(format!("{name:?} is not a valid interface name"));
    }
    Ok(())
}

/// Compresses a port list into sorted, merged inclusive runs (`[80,81,82,443]` →
/// `[80..=82, 443..=443]`), so backends can emit one range match per run.
pub fn port_runs(ports: &[u16]) -> Vec<RangeInclusive<u16>> {
    let set: BTreeSet<u16> = ports.iter().copied().collect();
    let mut runs: Vec<RangeInclusive<u16>> = Vec::new();
    for p in set {
        match runs.last_mut() {
            Some(r) if *r.end() != u16::MAX && r.end() + 1 == p => *r = *r.start()..=p,
            _ => runs.push(p..=p),
        }
    }
    runs
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn istio_like() -> RedirectSpec {
        RedirectSpec {
            proxy_uid: 1337,
            proxy_gid: Some(1337),
            exempt_uids: vec![],
            inbound: InboundCapture {
                proxy_port: 15006,
                include_ports: PortSelection::All,
                exclude_ports: vec![15090, 15020, 15021],
                exclude_sources: vec![],
            },
            outbound: OutboundCapture {
                proxy_port: 15001,
                include_ports: PortSelection::All,
                exclude_ports: vec![],
                include_cidrs: vec![],
                exclude_cidrs: vec![],
                any_destination_ports: vec![],
            },
            loopback: Loopback::default(),
            dns: None,
            drop_invalid: false,
            exclude_interfaces: vec![],
            ipv4: true,
            ipv6: true,
        }
    }

    #[test]
    fn valid_spec_passes() {
        istio_like().validate().unwrap();
    }

    #[test]
    fn the_installed_spec_has_both_families_and_nothing_else_changed() {
        let mut v4_only = istio_like();
        v4_only.ipv6 = false;
        let installed = v4_only.as_installed();
        assert!(installed.ipv4 && installed.ipv6);
        assert_eq!(installed, istio_like().as_installed());
        assert_eq!(
            RedirectSpec {
                ipv6: false,
                ..installed.clone()
            },
            v4_only
        );
        let (canonical, hash) = installed.canonical_and_hash();
        assert_eq!(
            (canonical, hash),
            (installed.canonical_json(), installed.hash())
        );
    }

    #[test]
    fn invalid_fields_are_named() {
        let mut s = istio_like();
        s.proxy_uid = 0;
        assert!(matches!(
            s.validate(),
            Err(SpecError::Field {
                field: "proxyUid",
                ..
            })
        ));
        let mut s = istio_like();
        s.proxy_gid = Some(0);
        assert!(matches!(
            s.validate(),
            Err(SpecError::Field {
                field: "proxyGid",
                ..
            })
        ));
        let mut s = istio_like();
        s.outbound.proxy_port = 0;
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("outbound.proxyPort"), "{e}");
        let mut s = istio_like();
        s.inbound.exclude_ports.push(0);
        assert!(s
            .validate()
            .unwrap_err()
            .to_string()
            .contains("inbound.excludePorts"));
        let mut s = istio_like();
        s.outbound.include_ports = PortSelection::Only(vec![0]);
        assert!(s
            .validate()
            .unwrap_err()
            .to_string()
            .contains("outbound.includePorts"));
        let mut s = istio_like();
        s.exclude_interfaces.push("a/b".into());
        assert!(s
            .validate()
            .unwrap_err()
            .to_string()
            .contains("excludeInterfaces"));
        let mut s = istio_like();
        s.exclude_interfaces.push("averyveryverylongname".into());
        assert!(s.validate().is_err());
        let mut s = istio_like();
        s.ipv4 = false;
        s.ipv6 = false;
        assert!(s.validate().is_err());
    }

    #[test]
    fn hash_is_stable_across_list_order_and_host_bits() {
        let a = istio_like();
        let mut b = istio_like();
        b.inbound.exclude_ports = vec![15021, 15090, 15020, 15020];
        assert_eq!(a.hash(), b.hash());
        let mut c = istio_like();
        c.outbound.exclude_cidrs = vec!["10.1.2.3/8".parse().unwrap()];
        let mut d = istio_like();
        d.outbound.exclude_cidrs = vec!["10.0.0.0/8".parse().unwrap()];
        assert_eq!(c.hash(), d.hash());
        assert_ne!(a.hash(), c.hash());
        assert_eq!(a.hash().len(), 64);
        let mut e = istio_like();
        e.outbound.proxy_port = 15002;
        assert_ne!(a.hash(), e.hash());
    }

    #[test]
    fn canonical_json_round_trips() {
        let a = istio_like();
        let back: RedirectSpec = serde_json::from_str(&a.canonical_json()).unwrap();
        assert_eq!(back, a.normalized());
        assert!(a.canonical_json().contains("\"proxyUid\":1337"));
    }

    #[test]
    fn outbound_capture_gaps() {
        let v4 = Family::V4;
        let v6 = Family::V6;
        let mut s = istio_like();
        assert_eq!(
            (s.outbound_capture_gap(v4), s.outbound_capture_gap(v6)),
            (None, None)
        );
        // Excluding everything of one family (istio excludeOutboundIPRanges 0.0.0.0/0).
        s.outbound.exclude_cidrs = vec!["0.0.0.0/0".parse().unwrap()];
        assert!(s.outbound_capture_gap(v4).unwrap().contains("0.0.0.0/0"));
        assert_eq!(s.outbound_capture_gap(v6), None);
        // Two halves cover everything too.
        s.outbound.exclude_cidrs = vec!["::/1".parse().unwrap(), "8000::/1".parse().unwrap()];
        assert!(s.outbound_capture_gap(v6).is_some());
        assert_eq!(s.outbound_capture_gap(v4), None);
        // Include lists: none of a family, or all of it excluded.
        let mut s = istio_like();
        s.outbound.include_cidrs = vec!["10.96.0.0/12".parse().unwrap()];
        assert_eq!(s.outbound_capture_gap(v4), None);
        assert!(s.outbound_capture_gap(v6).is_some());
        s.outbound.exclude_cidrs = vec!["10.0.0.0/8".parse().unwrap()];
        assert!(s.outbound_capture_gap(v4).is_some());
        // Ports: all excluded, or an empty include list.
        let mut s = istio_like();
        s.outbound.exclude_ports = (1..=u16::MAX).collect();
        assert!(s.outbound_capture_gap(v4).unwrap().contains("port"));
        let mut s = istio_like();
        s.outbound.include_ports = PortSelection::Only(vec![]);
        assert!(s.outbound_capture_gap(v6).is_some());
        s.ipv6 = false;
        assert!(s
            .outbound_capture_gap(v6)
            .unwrap()
            .contains("does not program"));
    }

    #[test]
    fn port_runs_merge_neighbours() {
        assert_eq!(port_runs(&[443, 80, 81, 82, 81]), vec![80..=82, 443..=443]);
        assert_eq!(port_runs(&[]), Vec::<RangeInclusive<u16>>::new());
        assert_eq!(port_runs(&[65534, 65535, 1]), vec![1..=1, 65534..=65535]);
    }

    #[test]
    fn outbound_semantics() {
        let mut s = istio_like();
        let b: IpAddr = "10.99.1.3".parse().unwrap();
        assert!(s.captures_outbound(0, 0, "eth0", b, 8080));
        assert!(!s.captures_outbound(1337, 0, "eth0", b, 8080));
        assert!(!s.captures_outbound(1000, 1337, "eth0", b, 8080));
        assert!(!s.captures_outbound(0, 0, "lo", b, 8080));
        s.outbound.exclude_ports = vec![8080];
        assert!(!s.captures_outbound(0, 0, "eth0", b, 8080));
        s.outbound.exclude_ports = vec![];
        s.outbound.exclude_cidrs = vec!["10.99.1.0/24".parse().unwrap()];
        assert!(!s.captures_outbound(0, 0, "eth0", b, 8080));
        s.outbound.exclude_cidrs = vec![];
        s.outbound.include_cidrs = vec!["10.98.0.0/16".parse().unwrap()];
        assert!(!s.captures_outbound(0, 0, "eth0", b, 8080));
        // An include list with only IPv4 networks captures no IPv6 destination.
        assert!(!s.captures_outbound(0, 0, "eth0", "fd99::3".parse().unwrap(), 80));
        s.outbound.include_cidrs = vec!["10.99.0.0/16".parse().unwrap()];
        assert!(s.captures_outbound(0, 0, "eth0", b, 8080));
        s.outbound.include_ports = PortSelection::Only(vec![443]);
        assert!(!s.captures_outbound(0, 0, "eth0", b, 8080));
        assert!(s.captures_outbound(0, 0, "eth0", b, 443));
        s.exclude_interfaces = vec!["eth0".into()];
        assert!(!s.captures_outbound(0, 0, "eth0", b, 443));
        s.ipv4 = false;
        s.exclude_interfaces.clear();
        assert!(!s.captures_outbound(0, 0, "eth0", b, 443));
    }

    #[test]
    fn inbound_semantics() {
        let mut s = istio_like();
        assert!(s.captures_inbound("eth0", 8080));
        assert!(!s.captures_inbound("eth0", 15020));
        s.inbound.include_ports = PortSelection::Only(vec![8080, 15020]);
        assert!(s.captures_inbound("eth0", 8080));
        assert!(!s.captures_inbound("eth0", 9090));
        assert!(!s.captures_inbound("eth0", 15020));
        s.exclude_interfaces = vec!["net1".into()];
        assert!(!s.captures_inbound("net1", 8080));
    }
}

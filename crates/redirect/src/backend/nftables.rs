//! The nftables backend: the pod's rules as one `inet interlock` table, written in one
//! atomic netlink transaction by [`interlock_nft`] (no `nft` process), read back and
//! compared expression by expression.
//!
//! Layout (both families in one `inet` table):
//!
//! ```text
//! table inet interlock {
//!   chain prerouting { type nat hook prerouting priority -100; policy accept;
//!     [meta nfproto ipvX] meta l4proto tcp jump inbound }
//!   chain output { type nat hook output priority -100; policy accept;
//!     [meta nfproto ipvX] meta l4proto tcp jump outbound }
//!   chain inbound {                       # exclusions, then capture
//!     iifname "<excluded>" return
//!     th dport <excluded run> return
//!     redirect to :<inbound>                       # or: th dport <included run> redirect …
//!   }
//!   chain outbound {
//!     oifname "lo" return
//!     meta skuid <uid> return
//!     meta skgid <gid> return
//!     oifname "<excluded>" return
//!     th dport <excluded run> return
//!     ip[6] daddr <excluded cidr> return
//!     redirect to :<outbound>                      # or: th dport <included run> redirect …
//!   }                                              # with included networks instead:
//!   chain outbound_redirect {                      #   ip[6] daddr <included cidr> goto
//!     redirect to :<outbound>                      #   outbound_redirect, which redirects
//!   }                                              #   (only then does this chain exist)
//! }
//! ```
//!
//! Only TCP reaches the inner chains (the base chains' jumps match it), so their rules do
//! not repeat `meta l4proto tcp`: `th dport` reads the TCP header's destination port.
//! Each expression costs the kernel a walk of every registered expression type by name
//! when the rule is added (the largest share of the transaction), so the rules carry as
//! few as they can: no repeated matches, a port run is one `range` expression, and the
//! redirect chain exists only for included networks (without them the outbound chain
//! ends with the redirect itself).
//!
//! The `[meta nfproto]` match appears only when one family is disabled. Every rule is
//! tagged `il:<chain>:<index>` (shown by `nft list ruleset` as its comment) so a
//! mismatch names the rule; the comparison still covers every expression.
//!
//! Applying replaces the whole table in one transaction (`add table; delete table; add
//! table; chains; rules`), so a pod's netns never holds a half-written rule set; when the
//! read-back already matches, nothing is sent and handles stay as they are.

use interlock_nft::{
    Batch, Chain, ChainInfo, ChainType, Family as NfFamily, Hook, Nft, NftError, Rule, TableInfo,
    Verdict, IPPROTO_TCP, IPPROTO_UDP, NFPROTO_IPV4, NFPROTO_IPV6, TABLE_F_DORMANT,
};

use interlock_contract::codes::Step;

use crate::backend::{Backend, BackendError, BackendKind, Verification};
use crate::spec::{
    port_runs, DnsCapture, Family, PortSelection, RedirectSpec, DNS_PORT, PASSTHROUGH_SOURCE_V4,
    PASSTHROUGH_SOURCE_V6,
};

/// Table interlock owns in every pod netns (family `inet`).
pub const TABLE: &str = "interlock";
/// Priority of both base chains (`dstnat`, as iptables' nat table).
pub const NAT_PRIORITY: i32 = -100;

const CHAIN_PREROUTING: &str = "prerouting";
const CHAIN_OUTPUT: &str = "output";
const CHAIN_INBOUND: &str = "inbound";
const CHAIN_OUTBOUND: &str = "outbound";
const CHAIN_OUTBOUND_REDIRECT: &str = "outbound_redirect";
const CHAIN_DROP_INVALID: &str = "drop_invalid";
const CHAIN_DNS_ZONES_OUT: &str = "dns_zones_out";
const CHAIN_DNS_ZONES_IN: &str = "dns_zones_in";
/// Priority of the invalid-packet drop (`mangle`, before NAT).
pub const MANGLE_PRIORITY: i32 = -150;
/// Priority of the DNS conntrack zones (`raw`, before conntrack).
pub const RAW_PRIORITY: i32 = -300;

/// The complete nf_tables content for one spec: chains in creation order and rules in
/// order within each chain, each rule tagged `il:<chain>:<index>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ruleset {
    /// Chains of table `inet interlock`.
    pub chains: Vec<Chain>,
    /// Rules, grouped by chain in the order of [`Ruleset::chains`].
    pub rules: Vec<Rule>,
}

impl Ruleset {
    /// The rules `spec` needs (the spec is normalized first, so equal meanings give equal
    /// rule sets), in the order of the semantics in [`crate::spec`].
    pub fn for_spec(spec: &RedirectSpec) -> Ruleset {
        let spec = spec.normalized();
        let families = spec.families();
        let mut rules = Vec::new();
        let mut chain = |name: &str, bodies: Vec<Rule>| {
            for (i, r) in bodies.into_iter().enumerate() {
                rules.push(Rule {
                    chain: name.to_string(),
                    ..r.tag(&format!("il:{name}:{i}"))
                });
            }
        };
        // A rule restricted to the programmed family when only one is.
        let family_only = || {
            let r = Rule::new("");
            if families.len() == 1 {
                r.nfproto(nfproto(families[0]))
            } else {
                r
            }
        };
        let dns = spec
            .dns
            .as_ref()
            .filter(|d| families.iter().any(|f| d.covers(*f)));
        // Port 53 is spared on lo whenever DNS is captured at all (semantics steps 5–6).
        let dns_set = spec.dns.is_some();
        let in_port = spec.inbound.proxy_port;

        // Base chains: the jumps, TCP only (and UDP when DNS is captured).
        let mut chains = vec![
            Chain::base(
                CHAIN_PREROUTING,
                ChainType::Nat,
                Hook::Prerouting,
                NAT_PRIORITY,
            ),
            Chain::base(CHAIN_OUTPUT, ChainType::Nat, Hook::Output, NAT_PRIORITY),
            Chain::regular(CHAIN_INBOUND),
            Chain::regular(CHAIN_OUTBOUND),
        ];
        let jump = |proto: u8, target: &str| {
            family_only()
                .l4proto(proto)
                .verdict(Verdict::Jump(target.to_string()))
        };
        chain(CHAIN_PREROUTING, vec![jump(IPPROTO_TCP, CHAIN_INBOUND)]);
        let mut output = vec![jump(IPPROTO_TCP, CHAIN_OUTBOUND)];
        if dns.is_some() {
            output.push(jump(IPPROTO_UDP, CHAIN_OUTBOUND));
        }
        chain(CHAIN_OUTPUT, output);

        // Inbound: excluded interfaces, ports, sources, then capture.
        let mut inbound = Vec::new();
        for ifname in &spec.exclude_interfaces {
            inbound.push(Rule::new("").iifname(ifname).verdict(Verdict::Return));
        }
        for run in port_runs(&spec.inbound.exclude_ports) {
            inbound.push(dport_run(Rule::new(""), &run).verdict(Verdict::Return));
        }
        for &family in &families {
            for net in spec.exclude_sources(family) {
                inbound.push(
                    Rule::new("")
                        .saddr(net.network(), net.prefix_len())
                        .verdict(Verdict::Return),
                );
            }
        }
        inbound.extend(redirects(&spec.inbound.include_ports, in_port));
        chain(CHAIN_INBOUND, inbound);

        // Outbound, step by step (see crate::spec). With the default loopback handling
        // and no DNS every exemption is a plain return and their order does not matter:
        // they keep the order the first release wrote, so its pods read back as intact.
        let simple = spec.loopback.is_default() && spec.dns.is_none();
        let mut outbound = Vec::new();
        if simple {
            outbound.push(Rule::new("").oifname("lo").verdict(Verdict::Return));
            outbound.push(Rule::new("").skuid(spec.proxy_uid).verdict(Verdict::Return));
            if let Some(gid) = spec.proxy_gid {
                outbound.push(Rule::new("").skgid(gid).verdict(Verdict::Return));
            }
        }
        for ifname in &spec.exclude_interfaces {
            outbound.push(Rule::new("").oifname(ifname).verdict(Verdict::Return));
        }
        let dns_rules = |d: &DnsCapture| -> Vec<Rule> {
            if d.only_to.is_empty() {
                vec![Rule::new("").dport(DNS_PORT).redirect_to_port(d.port)]
            } else {
                families
                    .iter()
                    .flat_map(|f| d.only_to(*f))
                    .map(|a| {
                        let full = if a.is_ipv4() { 32 } else { 128 };
                        Rule::new("")
                            .daddr(a, full)
                            .dport(DNS_PORT)
                            .redirect_to_port(d.port)
                    })
                    .collect()
            }
        };
        if let Some(d) = dns.filter(|d| !d.proxy_exempt) {
            outbound.extend(dns_rules(d));
        }
        for run in port_runs(&spec.outbound.exclude_ports) {
            outbound.push(dport_run(Rule::new(""), &run).verdict(Verdict::Return));
        }
        let lo = spec.loopback.clone();
        if lo.passthrough_source {
            for &family in &families {
                outbound.push(
                    Rule::new("")
                        .oifname("lo")
                        .saddr(passthrough_source(family), full_prefix(family))
                        .verdict(Verdict::Return),
                );
            }
        }
        // The proxy's connections to its own pod through lo, to the inbound port.
        let hairpin = |owner: fn(Rule, u32) -> Rule, id: u32, skip: &[u16]| -> Vec<Rule> {
            families
                .iter()
                .map(|&family| {
                    let r = Rule::new("").oifname("lo").daddr_not(localhost(family));
                    let r = if dns.is_some() {
                        r.l4proto(IPPROTO_TCP)
                    } else {
                        r
                    };
                    owner(r.dport_not(skip), id).redirect_to_port(in_port)
                })
                .collect()
        };
        let by_uid = |r: Rule, id: u32| r.skuid(id);
        let by_gid = |r: Rule, id: u32| r.skgid(id);
        if let Some(h) = &lo.proxy_to_inbound {
            let mut skip = h.skip_ports.clone();
            if dns_set {
                skip.push(DNS_PORT);
                skip.sort_unstable();
                skip.dedup();
            }
            outbound.extend(hairpin(by_uid, spec.proxy_uid, &skip));
        }
        if lo.app_bypass && !simple {
            // Without the hairpin and DNS, everything through lo passes (the proxy's own
            // traffic passes one rule later anyway).
            let bypass = if lo.proxy_to_inbound.is_none() && !dns_set {
                Rule::new("").oifname("lo")
            } else {
                let r = Rule::new("").oifname("lo");
                let r = if dns_set {
                    let r = if dns.is_some() {
                        r.l4proto(IPPROTO_TCP)
                    } else {
                        r
                    };
                    r.dport_not(&[DNS_PORT])
                } else {
                    r
                };
                r.skuid_not(spec.proxy_uid)
            };
            outbound.push(bypass.verdict(Verdict::Return));
        }
        if !simple {
            outbound.push(Rule::new("").skuid(spec.proxy_uid).verdict(Verdict::Return));
        }
        if let Some(gid) = spec.proxy_gid.filter(|_| !simple) {
            if let Some(h) = &lo.proxy_to_inbound {
                outbound.extend(hairpin(by_gid, gid, &h.skip_ports));
            }
            outbound.push(Rule::new("").skgid(gid).verdict(Verdict::Return));
        }
        for &uid in &spec.exempt_uids {
            outbound.push(Rule::new("").skuid(uid).verdict(Verdict::Return));
        }
        if let Some(d) = dns.filter(|d| d.proxy_exempt) {
            outbound.extend(dns_rules(d));
        }
        if !lo.app_bypass {
            for &family in &families {
                outbound.push(
                    Rule::new("")
                        .daddr(localhost(family), full_prefix(family))
                        .verdict(Verdict::Return),
                );
            }
        }
        if dns.is_some() {
            outbound.push(Rule::new("").l4proto(IPPROTO_UDP).verdict(Verdict::Return));
        }
        for &family in &families {
            for net in spec.exclude_cidrs(family) {
                outbound.push(
                    Rule::new("")
                        .daddr(net.network(), net.prefix_len())
                        .verdict(Verdict::Return),
                );
            }
        }
        for run in port_runs(&spec.outbound.any_destination_ports) {
            outbound
                .push(dport_run(Rule::new(""), &run).redirect_to_port(spec.outbound.proxy_port));
        }
        // Capture: every destination (the redirect rules end the chain), or only the
        // included networks, each sent on to the redirect chain.
        let capture = redirects(&spec.outbound.include_ports, spec.outbound.proxy_port);
        if spec.outbound.include_cidrs.is_empty() {
            outbound.extend(capture);
            chain(CHAIN_OUTBOUND, outbound);
        } else {
            let to_redirect = Verdict::Goto(CHAIN_OUTBOUND_REDIRECT.to_string());
            for &family in &families {
                for net in spec.include_cidrs(family) {
                    outbound.push(
                        Rule::new("")
                            .daddr(net.network(), net.prefix_len())
                            .verdict(to_redirect.clone()),
                    );
                }
            }
            chain(CHAIN_OUTBOUND, outbound);
            chain(CHAIN_OUTBOUND_REDIRECT, capture);
            chains.push(Chain::regular(CHAIN_OUTBOUND_REDIRECT));
        }

        // Invalid inbound packets, dropped before NAT.
        if spec.drop_invalid {
            chains.push(Chain::base(
                CHAIN_DROP_INVALID,
                ChainType::Filter,
                Hook::Prerouting,
                MANGLE_PRIORITY,
            ));
            chain(
                CHAIN_DROP_INVALID,
                vec![family_only().ct_state_invalid().verdict(Verdict::Drop)],
            );
        }
        // DNS conntrack zones: 1 for the proxy and its upstream resolvers, 2 for the
        // applications and the proxy's DNS listener (Istio's raw-table rules).
        if let Some(d) = dns.filter(|d| d.conntrack_zones) {
            let udp = || family_only().l4proto(IPPROTO_UDP);
            let mut zones = Vec::new();
            let owners: Vec<fn(Rule, u32) -> Rule> = vec![by_uid, by_gid];
            let ids = [Some(spec.proxy_uid), spec.proxy_gid];
            for (owner, id) in owners.into_iter().zip(ids) {
                if let Some(id) = id {
                    zones.push(owner(udp().dport(DNS_PORT), id).ct_zone_set(1));
                    zones.push(owner(udp().sport(d.port), id).ct_zone_set(2));
                }
            }
            zones.push(udp().dport(DNS_PORT).ct_zone_set(2));
            chains.push(Chain::base(
                CHAIN_DNS_ZONES_OUT,
                ChainType::Filter,
                Hook::Output,
                RAW_PRIORITY,
            ));
            chain(CHAIN_DNS_ZONES_OUT, zones);
            chains.push(Chain::base(
                CHAIN_DNS_ZONES_IN,
                ChainType::Filter,
                Hook::Prerouting,
                RAW_PRIORITY,
            ));
            chain(
                CHAIN_DNS_ZONES_IN,
                vec![udp().sport(DNS_PORT).ct_zone_set(1)],
            );
        }

        Ruleset { chains, rules }
    }

    /// The transaction that replaces table `inet interlock` with exactly this rule set,
    /// whether or not it exists (`add table; delete table; add table; …`).
    pub fn replace_batch(&self) -> Batch {
        let mut b = Batch::new();
        b.add_table(NfFamily::Inet, TABLE)
            .delete_table(NfFamily::Inet, TABLE)
            .add_table(NfFamily::Inet, TABLE);
        self.add_content(&mut b);
        b
    }

    /// The transaction that creates table `inet interlock` with this rule set; refused
    /// as a whole (`EEXIST`) if the table exists. Deletes nothing, so it does not make
    /// the socket's close wait for the kernel's deferred destruction.
    pub fn create_batch(&self) -> Batch {
        let mut b = Batch::new();
        b.create_table(NfFamily::Inet, TABLE);
        self.add_content(&mut b);
        b
    }

    fn add_content(&self, b: &mut Batch) {
        for c in &self.chains {
            b.add_chain(NfFamily::Inet, TABLE, c);
        }
        for r in &self.rules {
            b.add_rule(NfFamily::Inet, TABLE, r);
        }
    }

    /// Reads table `inet interlock` back through `nft` and compares it with this rule
    /// set ([`Ruleset::judge`]).
    pub fn compare(&self, nft: &mut Nft) -> Result<Readback, NftError> {
        let Some(table) = nft.table(NfFamily::Inet, TABLE)? else {
            return Ok(Readback::TableMissing);
        };
        let chains = nft.chains(NfFamily::Inet, TABLE)?;
        let live = nft.rules(NfFamily::Inet, TABLE, None)?;
        Ok(self.judge(Some(&table), &chains, &live))
    }

    /// Compares what the kernel holds in table `inet interlock` with this rule set:
    /// dormant table,
    /// missing/altered/extra chains, and missing/altered/extra/reordered rules are each
    /// listed.
    pub fn judge(
        &self,
        table: Option<&TableInfo>,
        chains: &[ChainInfo],
        live: &[Rule],
    ) -> Readback {
        let mut diffs = Vec::new();
        match table {
            None => return Readback::TableMissing,
            Some(t) if t.flags & TABLE_F_DORMANT != 0 => diffs.push(format!(
                "table inet {TABLE} is dormant (flags {:#x}): its chains see no packets",
                t.flags
            )),
            Some(_) => {}
        }
        for want in &self.chains {
            match chains.iter().find(|c| c.name == want.name) {
                None => diffs.push(format!("chain {} is missing", want.name)),
                Some(have) if !have.matches(want) => diffs.push(format!(
                    "chain {} was altered: it is `{have}`, expected {}",
                    want.name,
                    describe_chain(want)
                )),
                Some(_) => {}
            }
        }
        for have in chains {
            if !self.chains.iter().any(|c| c.name == have.name) {
                diffs.push(format!("unexpected chain `{have}` in table inet {TABLE}"));
            }
        }
        for want_chain in &self.chains {
            let want: Vec<&Rule> = self
                .rules
                .iter()
                .filter(|r| r.chain == want_chain.name)
                .collect();
            let have: Vec<&Rule> = live.iter().filter(|r| r.chain == want_chain.name).collect();
            compare_chain(&want_chain.name, &want, &have, &mut diffs);
        }
        for r in live {
            if !self.chains.iter().any(|c| c.name == r.chain) {
                diffs.push(format!(
                    "unexpected rule in chain {}: {}",
                    r.chain,
                    one_line(r)
                ));
            }
        }
        if diffs.is_empty() {
            Readback::Exact
        } else {
            Readback::Differs(diffs)
        }
    }
}

/// What [`Ruleset::compare`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readback {
    /// Exactly the expected table, chains and rules.
    Exact,
    /// Table `inet interlock` does not exist.
    TableMissing,
    /// The table exists but differs; each entry says how.
    Differs(Vec<String>),
}

impl From<Readback> for Verification {
    fn from(r: Readback) -> Verification {
        match r {
            Readback::Exact => Verification::Exact,
            Readback::TableMissing => {
                Verification::Mismatch(vec![format!("table inet {TABLE} is missing")])
            }
            Readback::Differs(d) => Verification::Mismatch(d),
        }
    }
}

/// Rule-by-rule comparison of one chain, keyed by tag, then order.
fn compare_chain(chain: &str, want: &[&Rule], have: &[&Rule], diffs: &mut Vec<String>) {
    let same = |a: &Rule, b: &Rule| a.exprs == b.exprs && a.tag_str() == b.tag_str();
    if want.len() == have.len() && want.iter().zip(have).all(|(w, h)| same(w, h)) {
        return;
    }
    let before = diffs.len();
    for w in want {
        let tag = w.tag_str().unwrap_or_default();
        let found: Vec<&&Rule> = have.iter().filter(|h| h.tag_str() == Some(tag)).collect();
        match found.as_slice() {
            [] => diffs.push(format!(
                "rule {tag} (chain {chain}) is missing: {}",
                exprs_line(w)
            )),
            [h] if h.exprs != w.exprs => diffs.push(format!(
                "rule {tag} (chain {chain}, handle {}) was altered: expected {}, found {}",
                handle(h),
                exprs_line(w),
                exprs_line(h)
            )),
            [_] => {}
            many => diffs.push(format!(
                "rule {tag} (chain {chain}) is present {} times (handles {})",
                many.len(),
                many.iter()
                    .map(|h| handle(h))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
    for h in have {
        let known = h
            .tag_str()
            .is_some_and(|t| want.iter().any(|w| w.tag_str() == Some(t)));
        if !known {
            diffs.push(format!("unexpected rule in chain {chain}: {}", one_line(h)));
        }
    }
    if diffs.len() == before {
        diffs.push(format!(
            "rules of chain {chain} are out of order: expected {}, found {}",
            tags(want),
            tags(have)
        ));
    }
}

fn handle(r: &Rule) -> String {
    r.handle
        .map(|h| h.to_string())
        .unwrap_or_else(|| "?".into())
}

fn tags(rules: &[&Rule]) -> String {
    rules
        .iter()
        .map(|r| r.tag_str().unwrap_or("(untagged)"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The rule as `nft list` shows it (what an operator reads and types), not the raw
/// netlink expressions.
fn exprs_line(r: &Rule) -> String {
    interlock_nft::nft_syntax(&r.exprs)
}

fn one_line(r: &Rule) -> String {
    format!(
        "handle {} tag {} {}",
        handle(r),
        r.tag_str().unwrap_or("(none)"),
        exprs_line(r)
    )
}

fn describe_chain(c: &Chain) -> String {
    match &c.base {
        None => "a regular chain".to_string(),
        Some(b) => format!(
            "type {} hook {:?} priority {} policy {:?}",
            b.chain_type.as_str(),
            b.hook,
            b.priority,
            b.policy
        )
        .to_lowercase(),
    }
}

fn nfproto(f: Family) -> u8 {
    match f {
        Family::V4 => NFPROTO_IPV4,
        Family::V6 => NFPROTO_IPV6,
    }
}

fn localhost(f: Family) -> std::net::IpAddr {
    match f {
        Family::V4 => std::net::Ipv4Addr::LOCALHOST.into(),
        Family::V6 => std::net::Ipv6Addr::LOCALHOST.into(),
    }
}

fn passthrough_source(f: Family) -> std::net::IpAddr {
    match f {
        Family::V4 => PASSTHROUGH_SOURCE_V4.into(),
        Family::V6 => PASSTHROUGH_SOURCE_V6.into(),
    }
}

fn full_prefix(f: Family) -> u8 {
    match f {
        Family::V4 => 32,
        Family::V6 => 128,
    }
}

fn dport_run(rule: Rule, run: &std::ops::RangeInclusive<u16>) -> Rule {
    if run.start() == run.end() {
        rule.dport(*run.start())
    } else {
        rule.dport_range(*run.start(), *run.end())
    }
}

/// Capture rules: everything, or one rule per run of included ports (none for `Only([])`).
fn redirects(include: &PortSelection, proxy_port: u16) -> Vec<Rule> {
    match include {
        PortSelection::All => vec![Rule::new("").redirect_to_port(proxy_port)],
        PortSelection::Only(ports) => port_runs(ports)
            .iter()
            .map(|run| dport_run(Rule::new(""), run).redirect_to_port(proxy_port))
            .collect(),
    }
}

/// nftables over netlink, in process. Holds no socket: each call opens one in the calling
/// thread's network namespace and uses it for all of its reads and writes.
#[derive(Debug, Clone, Default)]
pub struct NftablesBackend {
    _private: (),
}

impl NftablesBackend {
    /// The backend (no system call until a method runs).
    pub fn new() -> Self {
        NftablesBackend { _private: () }
    }
}

fn nft_err(op: Step, what: impl Into<String>) -> impl FnOnce(NftError) -> BackendError {
    let what = what.into();
    move |source| BackendError::Nft {
        backend: BackendKind::Nftables,
        op,
        what,
        source,
    }
}

fn checked(spec: &RedirectSpec, op: Step) -> Result<Ruleset, BackendError> {
    spec.validate().map_err(|source| BackendError::Spec {
        backend: BackendKind::Nftables,
        op,
        source,
    })?;
    Ok(Ruleset::for_spec(spec))
}

fn open(op: Step) -> Result<Nft, BackendError> {
    Nft::open().map_err(nft_err(op, "opening a netlink socket"))
}

fn read_back(nft: &mut Nft, ruleset: &Ruleset, op: Step) -> Result<Readback, BackendError> {
    ruleset
        .compare(nft)
        .map_err(nft_err(op, format!("reading back table inet {TABLE}")))
}

fn verify_with(nft: &mut Nft, ruleset: &Ruleset, op: Step) -> Result<Verification, BackendError> {
    read_back(nft, ruleset, op).map(Verification::from)
}

/// Nothing when exact; a create-only transaction when the table is missing (a new pod);
/// a delete-and-recreate transaction otherwise (repair, or a changed spec).
fn apply_with(nft: &mut Nft, ruleset: &Ruleset) -> Result<(), BackendError> {
    let replace = |nft: &mut Nft| {
        nft.commit(&ruleset.replace_batch()).map_err(nft_err(
            Step::Apply,
            format!("replacing table inet {TABLE}"),
        ))
    };
    match read_back(nft, ruleset, Step::Apply)? {
        Readback::Exact => Ok(()),
        Readback::TableMissing => match nft.commit(&ruleset.create_batch()) {
            Ok(()) => Ok(()),
            // Created concurrently since the read-back: replace it.
            Err(e) if e.errno() == Some(libc::EEXIST) => replace(nft),
            Err(e) => Err(nft_err(Step::Apply, format!("creating table inet {TABLE}"))(e)),
        },
        Readback::Differs(_) => replace(nft),
    }
}

impl Backend for NftablesBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Nftables
    }

    /// nf_tables answers a read over netlink (it needs `CAP_NET_ADMIN` and the module).
    fn usable(&self) -> Result<(), BackendError> {
        open(Step::Open)?
            .table(NfFamily::Inet, TABLE)
            .map(|_| ())
            .map_err(nft_err(Step::Open, "nf_tables does not answer a read"))
    }

    fn apply(&self, spec: &RedirectSpec) -> Result<(), BackendError> {
        let ruleset = checked(spec, Step::Apply)?;
        apply_with(&mut open(Step::Apply)?, &ruleset)
    }

    fn verify(&self, spec: &RedirectSpec) -> Result<Verification, BackendError> {
        let ruleset = checked(spec, Step::Verify)?;
        verify_with(&mut open(Step::Verify)?, &ruleset, Step::Verify)
    }

    /// Applies `spec` (unless already exact) and verifies the result on one socket: the
    /// plugin ADD path.
    fn apply_and_verify(&self, spec: &RedirectSpec) -> Result<Verification, BackendError> {
        let ruleset = checked(spec, Step::Apply)?;
        let mut nft = open(Step::Apply)?;
        apply_with(&mut nft, &ruleset)?;
        verify_with(&mut nft, &ruleset, Step::Verify)
    }

    /// The create-only transaction straight away, without the read before it (one round
    /// trip per new pod). Not the default: when the table exists the kernel refuses the
    /// transaction only after building it, and undoing that waits for an RCU grace period
    /// (far longer than reading first), so this path is for a netns that is new to
    /// interlock; there it falls back to [`Backend::apply_and_verify`]'s. The read-back
    /// after it stays a read: verifying from the kernel's `NLM_F_ECHO` of the transaction
    /// instead saves syscalls but no time (the kernel builds the echo as dearly as it
    /// answers the dumps).
    fn create_and_verify(&self, spec: &RedirectSpec) -> Result<Verification, BackendError> {
        let ruleset = checked(spec, Step::Apply)?;
        let mut nft = open(Step::Apply)?;
        match nft.commit(&ruleset.create_batch()) {
            Ok(()) => {}
            Err(e) if e.errno() == Some(libc::EEXIST) => apply_with(&mut nft, &ruleset)?,
            Err(e) => return Err(nft_err(Step::Apply, format!("creating table inet {TABLE}"))(e)),
        }
        verify_with(&mut nft, &ruleset, Step::Verify)
    }

    /// Deletes the table. The commit itself is quick; closing the socket afterwards waits
    /// for the kernel's deferred destruction of what was deleted (the `NETLINK_URELEASE`
    /// handler flushes nf_tables' destroy work, an RCU grace period: milliseconds). The
    /// wait is per netns (a socket closed in another netns meanwhile does not wait), moves
    /// to process exit when the socket is not closed (same total), and vanishes only if
    /// the close comes a grace period after the commit. Flushing the table instead of
    /// deleting it waits the same; marking it dormant does not wait but leaves the table
    /// behind, so removal keeps the honest delete.
    fn remove(&self) -> Result<(), BackendError> {
        open(Step::Remove)?
            .delete_table(NfFamily::Inet, TABLE)
            .map(|_existed| ())
            .map_err(nft_err(
                Step::Remove,
                format!("deleting table inet {TABLE}"),
            ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use interlock_testkit::{require_root, Netns};
    use std::time::Duration;

    /// The istio-like fixture with an outbound port, two networks and an interface excluded.
    fn spec() -> RedirectSpec {
        let mut s = crate::spec::tests::istio_like();
        s.outbound.exclude_ports = vec![9999];
        s.outbound.exclude_cidrs = vec![
            "10.99.201.0/24".parse().unwrap(),
            "fd99:201::/64".parse().unwrap(),
        ];
        s.exclude_interfaces = vec!["ilexcl0".into()];
        s
    }

    fn chain_rules<'a>(rs: &'a Ruleset, chain: &str) -> Vec<&'a Rule> {
        rs.rules.iter().filter(|r| r.chain == chain).collect()
    }

    #[test]
    fn ruleset_follows_the_spec_semantics_in_order() {
        let rs = Ruleset::for_spec(&spec());
        // No included networks: the outbound chain redirects itself, no redirect chain.
        assert_eq!(rs.chains.len(), 4);
        assert!(!rs.chains.iter().any(|c| c.name == CHAIN_OUTBOUND_REDIRECT));
        let tags: Vec<_> = rs
            .rules
            .iter()
            .map(|r| r.tag_str().unwrap().to_string())
            .collect();
        let mut unique = tags.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), tags.len(), "tags are unique: {tags:?}");

        // Both families: the entry rules do not restrict the family.
        let pre = chain_rules(&rs, CHAIN_PREROUTING);
        assert_eq!(pre.len(), 1);
        assert_eq!(
            pre[0].exprs,
            Rule::new("")
                .l4proto(IPPROTO_TCP)
                .verdict(Verdict::Jump("inbound".into()))
                .exprs
        );

        // inbound: iifname, the 15020-15021 run, 15090, then capture everything.
        let inbound = chain_rules(&rs, CHAIN_INBOUND);
        assert_eq!(inbound.len(), 4);
        assert_eq!(inbound[0].tag_str(), Some("il:inbound:0"));
        assert_eq!(
            inbound[1].exprs,
            Rule::new("")
                .dport_range(15020, 15021)
                .verdict(Verdict::Return)
                .exprs
        );
        assert_eq!(
            inbound[3].exprs,
            Rule::new("").redirect_to_port(15006).exprs
        );
        // Only the base chains' jumps match the protocol: nothing else reaches the inner
        // chains, so no inner rule repeats the match.
        let l4 = Rule::new("").l4proto(IPPROTO_TCP).exprs;
        for r in rs
            .rules
            .iter()
            .filter(|r| ![CHAIN_PREROUTING, CHAIN_OUTPUT].contains(&r.chain.as_str()))
        {
            assert!(
                !r.exprs.windows(l4.len()).any(|w| w == l4.as_slice()),
                "{} repeats meta l4proto tcp: {:?}",
                r.chain,
                r.exprs
            );
        }

        // outbound: lo, uid, gid, interface, port, two CIDRs, then the redirect itself.
        let out = chain_rules(&rs, CHAIN_OUTBOUND);
        assert_eq!(out.len(), 8);
        assert_eq!(
            out[1].exprs,
            Rule::new("").skuid(1337).verdict(Verdict::Return).exprs
        );
        assert_eq!(out[7].exprs, Rule::new("").redirect_to_port(15001).exprs);
        assert!(chain_rules(&rs, CHAIN_OUTBOUND_REDIRECT).is_empty());
    }

    #[test]
    fn one_family_and_include_lists_shape_the_rules() {
        let mut s = spec();
        s.ipv6 = false;
        s.proxy_gid = None;
        s.outbound.include_cidrs =
            vec!["10.96.0.0/12".parse().unwrap(), "fd00::/8".parse().unwrap()];
        s.outbound.include_ports = PortSelection::Only(vec![443, 80, 81]);
        s.inbound.include_ports = PortSelection::Only(vec![]);
        let rs = Ruleset::for_spec(&s);
        let pre = chain_rules(&rs, CHAIN_PREROUTING);
        assert_eq!(
            pre[0].exprs,
            Rule::new("")
                .nfproto(NFPROTO_IPV4)
                .l4proto(IPPROTO_TCP)
                .verdict(Verdict::Jump("inbound".into()))
                .exprs
        );
        // Only([]) inbound: exclusions but no capture rule.
        assert!(chain_rules(&rs, CHAIN_INBOUND)
            .iter()
            .all(|r| !r.exprs.iter().any(|e| e.name() == "redir")));
        let out = chain_rules(&rs, CHAIN_OUTBOUND);
        // lo, uid, iface, port 9999, v4 exclude CIDR (v6 one dropped), v4 include goto only.
        assert_eq!(out.len(), 6, "{out:#?}");
        assert_eq!(
            out[5].exprs,
            Rule::new("")
                .daddr("10.96.0.0".parse().unwrap(), 12)
                .verdict(Verdict::Goto(CHAIN_OUTBOUND_REDIRECT.into()))
                .exprs
        );
        assert_eq!(
            rs.chains.last().map(|c| c.name.as_str()),
            Some(CHAIN_OUTBOUND_REDIRECT),
            "included networks go on to the redirect chain"
        );
        let red = chain_rules(&rs, CHAIN_OUTBOUND_REDIRECT);
        assert_eq!(red.len(), 2, "runs 80-81 and 443");
        assert_eq!(
            red[0].exprs,
            Rule::new("")
                .dport_range(80, 81)
                .redirect_to_port(15001)
                .exprs
        );
    }

    #[test]
    fn equal_meanings_give_equal_rulesets() {
        let a = spec();
        let mut b = spec();
        b.inbound.exclude_ports.reverse();
        b.outbound.exclude_cidrs = vec![
            "fd99:201::5/64".parse().unwrap(),
            "10.99.201.7/24".parse().unwrap(),
        ];
        assert_eq!(Ruleset::for_spec(&a), Ruleset::for_spec(&b));
    }

    fn live(tag: &str, handle: u64, port: u16) -> Rule {
        Rule {
            handle: Some(handle),
            ..Rule::new("c")
                .tag(tag)
                .l4proto(IPPROTO_TCP)
                .dport(port)
                .verdict(Verdict::Return)
        }
    }

    fn diff(want: &[Rule], have: &[Rule]) -> Vec<String> {
        let mut d = Vec::new();
        let w: Vec<&Rule> = want.iter().collect();
        let h: Vec<&Rule> = have.iter().collect();
        compare_chain("c", &w, &h, &mut d);
        d
    }

    #[test]
    fn chain_comparison_names_each_kind_of_difference() {
        let want = [live("il:c:0", 0, 1), live("il:c:1", 0, 2)];
        // Handles differ from the expectation's: not a difference.
        assert!(diff(&want, &[live("il:c:0", 5, 1), live("il:c:1", 6, 2)]).is_empty());

        let d = diff(&want, &[live("il:c:0", 5, 1)]);
        assert_eq!(d.len(), 1);
        assert!(d[0].contains("il:c:1") && d[0].contains("missing"), "{d:?}");

        let d = diff(&want, &[live("il:c:0", 5, 1), live("il:c:1", 6, 3)]);
        assert_eq!(d.len(), 1);
        assert!(
            d[0].contains("il:c:1") && d[0].contains("handle 6") && d[0].contains("altered"),
            "{d:?}"
        );

        let mut foreign = live("x", 9, 22);
        foreign.userdata = None;
        let d = diff(
            &want,
            &[live("il:c:0", 5, 1), foreign, live("il:c:1", 6, 2)],
        );
        assert_eq!(d.len(), 1);
        assert!(
            d[0].contains("unexpected rule") && d[0].contains("handle 9"),
            "{d:?}"
        );

        let d = diff(&want, &[live("il:c:1", 6, 2), live("il:c:0", 5, 1)]);
        assert_eq!(d.len(), 1);
        assert!(d[0].contains("out of order"), "{d:?}");

        let d = diff(
            &want,
            &[
                live("il:c:0", 5, 1),
                live("il:c:1", 6, 2),
                live("il:c:1", 7, 2),
            ],
        );
        assert!(
            d.iter()
                .any(|m| m.contains("2 times") && m.contains("6, 7")),
            "{d:?}"
        );

        assert!(diff(&[], &[]).is_empty());
        assert_eq!(diff(&[], &[live("il:c:0", 1, 1)]).len(), 1);
    }

    /// What the kernel would report for exactly `rs`: its table, chains and rules.
    fn held(rs: &Ruleset) -> (TableInfo, Vec<ChainInfo>, Vec<Rule>) {
        let table = TableInfo {
            name: TABLE.into(),
            family: NfFamily::Inet,
            flags: 0,
            handle: 1,
            use_count: rs.chains.len() as u32,
        };
        let chains = rs
            .chains
            .iter()
            .enumerate()
            .map(|(i, c)| ChainInfo {
                name: c.name.clone(),
                handle: i as u64 + 1,
                hook: c.base.as_ref().map(|b| (b.hook.raw(), b.priority)),
                chain_type: c.base.as_ref().map(|b| b.chain_type.as_str().to_string()),
                policy: c.base.as_ref().map(|b| b.policy.raw()),
                use_count: 0,
            })
            .collect();
        let rules = rs
            .rules
            .iter()
            .enumerate()
            .map(|(i, r)| Rule {
                handle: Some(i as u64 + 10),
                ..r.clone()
            })
            .collect();
        (table, chains, rules)
    }

    #[test]
    fn judging_what_the_kernel_holds_names_each_difference() {
        let rs = Ruleset::for_spec(&spec());
        let (table, chains, rules) = held(&rs);
        assert_eq!(rs.judge(Some(&table), &chains, &rules), Readback::Exact);
        assert_eq!(rs.judge(None, &[], &[]), Readback::TableMissing);
        let differs = |table: &TableInfo, chains: &[ChainInfo], rules: &[Rule]| match rs.judge(
            Some(table),
            chains,
            rules,
        ) {
            Readback::Differs(d) => d.join("; "),
            other => panic!("{other:?}"),
        };
        let dormant = TableInfo {
            flags: TABLE_F_DORMANT,
            ..table.clone()
        };
        assert!(differs(&dormant, &chains, &rules).contains("dormant"));
        assert!(differs(&table, &chains[1..], &rules).contains("is missing"));
        let mut extra = chains.clone();
        extra.push(ChainInfo {
            name: "sneaky".into(),
            ..chains[2].clone()
        });
        assert!(differs(&table, &extra, &rules).contains("unexpected chain"));
        assert!(differs(&table, &chains, &rules[1..]).contains("missing"));
        let mut stray = rules.clone();
        stray.push(Rule {
            chain: "sneaky".into(),
            ..rules[0].clone()
        });
        assert!(differs(&table, &chains, &stray).contains("unexpected rule in chain sneaky"));
    }

    #[test]
    fn readback_maps_to_verification() {
        assert_eq!(Verification::from(Readback::Exact), Verification::Exact);
        match Verification::from(Readback::TableMissing) {
            Verification::Mismatch(d) => assert!(d[0].contains("inet interlock is missing")),
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn invalid_spec_is_refused_before_touching_the_kernel() {
        let mut s = spec();
        s.proxy_uid = 0;
        let e = NftablesBackend::new().apply(&s).unwrap_err().to_string();
        assert!(e.contains("proxyUid"), "{e}");
    }

    fn handles(ns: &Netns) -> Vec<(String, u64)> {
        ns.run(|| {
            Nft::open()
                .unwrap()
                .rules(NfFamily::Inet, TABLE, None)
                .unwrap()
                .into_iter()
                .map(|r| {
                    (
                        r.tag_str().unwrap_or_default().to_string(),
                        r.handle.unwrap(),
                    )
                })
                .collect()
        })
    }

    /// Deletes the rule tagged `tag` from chain `outbound` with `nft`, as a tamperer would.
    fn delete_outbound_rule(ns: &Netns, handles: &[(String, u64)], tag: &str) {
        let (_, h) = handles.iter().find(|(t, _)| t == tag).unwrap();
        ns.exec_ok(&[
            "nft",
            "delete",
            "rule",
            "inet",
            TABLE,
            "outbound",
            "handle",
            &h.to_string(),
        ]);
    }

    #[test]
    fn create_first_ends_exact_whether_the_table_is_absent_exact_or_altered() {
        require_root!();
        let ns = Netns::new("nftcr").unwrap();
        let be = NftablesBackend::new();
        let s = spec();
        // Absent: created by the first transaction.
        assert!(ns.run(|| be.create_and_verify(&s)).unwrap().is_exact());
        let created = handles(&ns);
        assert_eq!(created.len(), Ruleset::for_spec(&s).rules.len());
        // Exact already: the refused create changes nothing (same handles).
        assert!(ns.run(|| be.create_and_verify(&s)).unwrap().is_exact());
        assert_eq!(handles(&ns), created);
        // Altered (a rule deleted): replaced, exact again.
        delete_outbound_rule(&ns, &created, "il:outbound:1");
        assert!(!ns.run(|| be.verify(&s)).unwrap().is_exact());
        assert!(ns.run(|| be.create_and_verify(&s)).unwrap().is_exact());
        assert_eq!(handles(&ns).len(), created.len());
        // Another spec: replaced by the new one.
        let mut s2 = s.clone();
        s2.outbound.proxy_port = 15002;
        assert!(ns.run(|| be.create_and_verify(&s2)).unwrap().is_exact());
        assert!(!ns.run(|| be.verify(&s)).unwrap().is_exact());
    }

    #[test]
    fn apply_verify_tamper_reapply_remove_in_a_netns() {
        require_root!();
        let ns = Netns::new("nftbe").unwrap();
        let be = NftablesBackend::new();
        let s = spec();

        assert!(
            matches!(ns.run(|| be.verify(&s)).unwrap(), Verification::Mismatch(d) if d[0].contains("missing"))
        );
        ns.run(|| be.apply(&s)).unwrap();
        assert_eq!(ns.run(|| be.verify(&s)).unwrap(), Verification::Exact);

        let listed = ns.exec_ok(&["nft", "-a", "list", "table", "inet", TABLE]);
        for want in [
            "type nat hook prerouting priority dstnat; policy accept;",
            "type nat hook output priority -100; policy accept;",
            "meta l4proto tcp jump inbound comment \"il:prerouting:0\"",
            "iifname \"ilexcl0\" return comment \"il:inbound:0\"",
            "th dport 15020-15021 return comment \"il:inbound:1\"",
            "th dport 15090 return comment \"il:inbound:2\"",
            "redirect to :15006 comment \"il:inbound:3\"",
            "oifname \"lo\" return comment \"il:outbound:0\"",
            "meta skuid 1337 return comment \"il:outbound:1\"",
            "meta skgid 1337 return comment \"il:outbound:2\"",
            "ip daddr 10.99.201.0/24 return comment \"il:outbound:5\"",
            "ip6 daddr fd99:201::/64 return comment \"il:outbound:6\"",
            "redirect to :15001 comment \"il:outbound:7\"",
        ] {
            assert!(listed.contains(want), "missing {want:?} in:\n{listed}");
        }

        // Applying again changes nothing: same rules, same handles.
        let before = handles(&ns);
        ns.run(|| be.apply(&s)).unwrap();
        assert_eq!(handles(&ns), before);

        // Someone deletes one rule: verify names it; apply restores exactly.
        delete_outbound_rule(&ns, &before, "il:outbound:1");
        match ns.run(|| be.verify(&s)).unwrap() {
            Verification::Mismatch(d) => {
                assert!(
                    d.iter()
                        .any(|m| m.contains("il:outbound:1") && m.contains("missing")),
                    "{d:?}"
                )
            }
            Verification::Exact => panic!("a deleted rule went unnoticed"),
        }
        ns.run(|| be.apply(&s)).unwrap();
        assert_eq!(ns.run(|| be.verify(&s)).unwrap(), Verification::Exact);

        // Altered expressions under the same tag, an extra rule, a dormant table, a
        // changed priority: each is a mismatch.
        let h = handles(&ns)
            .into_iter()
            .find(|(t, _)| t == "il:outbound:1")
            .unwrap()
            .1;
        ns.exec_ok(&[
            "nft",
            "replace",
            "rule",
            "inet",
            TABLE,
            "outbound",
            "handle",
            &h.to_string(),
            "meta",
            "skuid",
            "0",
            "return",
            "comment",
            "\"il:outbound:1\"",
        ]);
        ns.exec_ok(&[
            "nft", "add", "rule", "inet", TABLE, "inbound", "tcp", "dport", "22", "return",
        ]);
        let d = match ns.run(|| be.verify(&s)).unwrap() {
            Verification::Mismatch(d) => d,
            Verification::Exact => panic!("tampering went unnoticed"),
        };
        assert!(
            d.iter()
                .any(|m| m.contains("il:outbound:1") && m.contains("altered")),
            "{d:?}"
        );
        assert!(
            d.iter()
                .any(|m| m.contains("unexpected rule in chain inbound")),
            "{d:?}"
        );
        // In the words nft itself took them in (as `nft list` prints them), not as raw
        // netlink expressions.
        assert!(
            d.iter()
                .any(|m| m.contains("altered") && m.contains("found meta skuid 0 return")),
            "{d:?}"
        );
        assert!(
            d.iter()
                .any(|m| m.contains("unexpected rule in chain inbound")
                    && m.ends_with("tcp dport 22 return")),
            "{d:?}"
        );
        assert!(d.iter().all(|m| !m.contains("[ ")), "{d:?}");
        ns.run(|| be.apply(&s)).unwrap();
        assert_eq!(ns.run(|| be.verify(&s)).unwrap(), Verification::Exact);
        ns.exec_ok(&[
            "nft", "add", "table", "inet", TABLE, "{", "flags", "dormant", ";", "}",
        ]);
        let d = ns.run(|| be.verify(&s)).unwrap();
        assert!(
            matches!(&d, Verification::Mismatch(d) if d.iter().any(|m| m.contains("dormant"))),
            "{d:?}"
        );
        ns.run(|| be.apply(&s)).unwrap();
        assert_eq!(ns.run(|| be.verify(&s)).unwrap(), Verification::Exact);

        // A different spec is a mismatch, and applying it replaces the rules.
        let mut s2 = s.clone();
        s2.outbound.proxy_port = 15002;
        assert!(!ns.run(|| be.verify(&s2)).unwrap().is_exact());
        assert_eq!(
            ns.run(|| be.apply_and_verify(&s2)).unwrap(),
            Verification::Exact
        );
        assert!(!ns.run(|| be.verify(&s)).unwrap().is_exact());

        ns.run(|| be.remove()).unwrap();
        let listed = ns.exec_ok(&["nft", "list", "ruleset"]);
        assert!(!listed.contains(TABLE), "{listed}");
        ns.run(|| be.remove())
            .expect("removing an absent table is fine");
    }

    /// Two namespaces joined by a veth pair: `pod` (10.99.200.1) programs the rules,
    /// `peer` (10.99.200.2) serves nothing, so an unredirected connection is refused.
    struct Pair {
        pod: Netns,
        _peer: Netns,
    }

    fn pair() -> Pair {
        let pod = Netns::new("nftpod").unwrap();
        let peer = Netns::new("nftpeer").unwrap();
        let (a, b) = (
            interlock_testkit::unique("va"),
            interlock_testkit::unique("vb"),
        );
        pod.exec_ok(&["ip", "link", "add", &a, "type", "veth", "peer", "name", &b]);
        pod.exec_ok(&["ip", "link", "set", &b, "netns", peer.name()]);
        pod.exec_ok(&["ip", "addr", "add", "10.99.200.1/24", "dev", &a]);
        pod.exec_ok(&["ip", "link", "set", &a, "up"]);
        peer.exec_ok(&["ip", "addr", "add", "10.99.200.2/24", "dev", &b]);
        peer.exec_ok(&["ip", "link", "set", &b, "up"]);
        Pair { pod, _peer: peer }
    }

    #[test]
    fn outbound_traffic_lands_on_the_proxy_port_and_exclusions_hold() {
        require_root!();
        use std::net::{SocketAddr, TcpListener, TcpStream};
        let p = pair();
        let be = NftablesBackend::new();
        let mut s = spec();
        s.outbound.exclude_cidrs = vec![];
        p.pod.run(|| be.apply(&s)).unwrap();
        p.pod.run(|| {
            let proxy = TcpListener::bind("0.0.0.0:15001").unwrap();
            let dst: SocketAddr = "10.99.200.2:8080".parse().unwrap();
            let c = TcpStream::connect_timeout(&dst, Duration::from_secs(2))
                .expect("redirected connection reaches the proxy listener");
            let (accepted, _) = proxy.accept().unwrap();
            assert_eq!(accepted.local_addr().unwrap().port(), 15001);
            drop((c, accepted));
            // Excluded destination port: not redirected, the peer refuses it.
            let excluded: SocketAddr = "10.99.200.2:9999".parse().unwrap();
            let e = TcpStream::connect_timeout(&excluded, Duration::from_secs(2)).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
        });
        // With the peer's network excluded, port 8080 is not captured either.
        s.outbound.exclude_cidrs = vec!["10.99.200.0/24".parse().unwrap()];
        p.pod.run(|| be.apply(&s)).unwrap();
        p.pod.run(|| {
            let _proxy = TcpListener::bind("0.0.0.0:15001").unwrap();
            let dst: SocketAddr = "10.99.200.2:8080".parse().unwrap();
            let e = TcpStream::connect_timeout(&dst, Duration::from_secs(2)).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
        });
    }

    /// Every apply path ends exact: creating in a new pod's netns (reading first or
    /// creating first), applying again, and replacing with another spec. (What each
    /// costs is the bench's.)
    #[test]
    fn every_apply_path_ends_exact() {
        require_root!();
        let be = NftablesBackend::new();
        let s = spec();
        let mut s2 = s.clone();
        s2.outbound.proxy_port = 15002;
        for created in [false, true] {
            let ns = Netns::new("nftpath").unwrap();
            ns.run(|| {
                let v = if created {
                    be.create_and_verify(&s)
                } else {
                    be.apply_and_verify(&s)
                };
                assert!(v.unwrap().is_exact());
            });
        }
        let ns = Netns::new("nftpath").unwrap();
        ns.run(|| {
            be.apply(&s).unwrap();
            assert!(be.verify(&s).unwrap().is_exact());
            be.apply(&s).unwrap();
            assert!(be.verify(&s).unwrap().is_exact());
            assert!(be.apply_and_verify(&s2).unwrap().is_exact());
            assert!(!be.verify(&s).unwrap().is_exact());
        });
    }
}

/// The rule set, interpreted expression by expression as the kernel evaluates it, must
/// decide exactly as the spec's own semantics ([`RedirectSpec::outbound`] /
/// [`RedirectSpec::inbound`]).
#[cfg(test)]
mod semantics {
    use super::*;
    use crate::backend::semantics_testing::{landing_port, spec};
    use crate::spec::{OutboundFlow, Transport};
    use interlock_nft::{CmpOp, Expr, ImmediateData, MetaKey, PayloadBase, RangeOp, Register};
    use proptest::prelude::*;
    use std::collections::HashMap;
    use std::net::IpAddr;

    struct Packet<'a> {
        uid: u32,
        gid: u32,
        iif: &'a str,
        oif: &'a str,
        src: IpAddr,
        dst: IpAddr,
        udp: bool,
        port: u16,
    }

    enum Outcome {
        Next,
        Verdict(Verdict),
        Redirect(u16),
    }

    fn ifname(name: &str) -> Vec<u8> {
        let mut b = vec![0u8; 16];
        b[..name.len()].copy_from_slice(name.as_bytes());
        b
    }

    fn network_header(p: &Packet) -> Vec<u8> {
        match (p.src, p.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let mut h = vec![0u8; 20];
                h[12..16].copy_from_slice(&s.octets());
                h[16..20].copy_from_slice(&d.octets());
                h
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                let mut h = vec![0u8; 40];
                h[8..24].copy_from_slice(&s.octets());
                h[24..40].copy_from_slice(&d.octets());
                h
            }
            _ => unreachable!("one family per packet"),
        }
    }

    /// Runs one rule's expressions.
    fn run(rule: &Rule, p: &Packet) -> Outcome {
        let mut regs: HashMap<u32, Vec<u8>> = HashMap::new();
        let net = network_header(p);
        let mut transport = vec![0u8; 4];
        transport[2..4].copy_from_slice(&p.port.to_be_bytes());
        transport[0..2].copy_from_slice(&40000u16.to_be_bytes());
        for e in &rule.exprs {
            match e {
                Expr::Meta { key, dreg } => {
                    let v = match key {
                        MetaKey::OifName => ifname(p.oif),
                        MetaKey::IifName => ifname(p.iif),
                        MetaKey::SkUid => p.uid.to_ne_bytes().to_vec(),
                        MetaKey::SkGid => p.gid.to_ne_bytes().to_vec(),
                        MetaKey::NfProto => vec![if p.src.is_ipv4() {
                            NFPROTO_IPV4
                        } else {
                            NFPROTO_IPV6
                        }],
                        MetaKey::L4Proto => vec![if p.udp { IPPROTO_UDP } else { IPPROTO_TCP }],
                        other => panic!("meta {other:?} not modelled"),
                    };
                    regs.insert(dreg.0, v);
                }
                Expr::Payload {
                    base,
                    offset,
                    len,
                    dreg,
                } => {
                    let h = match base {
                        PayloadBase::Network => &net,
                        PayloadBase::Transport => &transport,
                        other => panic!("payload base {other:?} not modelled"),
                    };
                    let (o, l) = (*offset as usize, *len as usize);
                    regs.insert(dreg.0, h[o..o + l].to_vec());
                }
                Expr::Cmp { sreg, op, data } => {
                    let r = &regs[&sreg.0][..data.len()];
                    let holds = match op {
                        CmpOp::Eq => r == data.as_slice(),
                        CmpOp::Neq => r != data.as_slice(),
                        other => panic!("cmp {other:?} not modelled"),
                    };
                    if !holds {
                        return Outcome::Next;
                    }
                }
                Expr::Bitwise {
                    sreg,
                    dreg,
                    len,
                    mask,
                    xor,
                } => {
                    let r = regs[&sreg.0].clone();
                    let v = (0..*len as usize)
                        .map(|i| (r[i] & mask[i]) ^ xor[i])
                        .collect();
                    regs.insert(dreg.0, v);
                }
                Expr::Range { sreg, op, from, to } => {
                    let r = &regs[&sreg.0][..from.len()];
                    let inside = from.as_slice() <= r && r <= to.as_slice();
                    if inside != matches!(op, RangeOp::Eq) {
                        return Outcome::Next;
                    }
                }
                Expr::Immediate { dreg, data } => match data {
                    ImmediateData::Value(v) => {
                        regs.insert(dreg.0, v.clone());
                    }
                    ImmediateData::Verdict(v) => return Outcome::Verdict(v.clone()),
                },
                Expr::Redir { reg_proto_min, .. } => {
                    let r = &regs[&reg_proto_min.unwrap_or(Register::R1).0];
                    return Outcome::Redirect(u16::from_be_bytes([r[0], r[1]]));
                }
                other => panic!("{other} not modelled in a nat chain"),
            }
        }
        Outcome::Next
    }

    /// Walks `chain` with jump/goto/return semantics; `Some(port)` when redirected.
    fn walk(rs: &Ruleset, chain: &str, p: &Packet) -> Option<u16> {
        for r in rs.rules.iter().filter(|r| r.chain == chain) {
            match run(r, p) {
                Outcome::Next => {}
                Outcome::Redirect(port) => return Some(port),
                Outcome::Verdict(Verdict::Return) | Outcome::Verdict(Verdict::Accept) => {
                    return None
                }
                Outcome::Verdict(Verdict::Jump(c)) => {
                    if let Some(port) = walk(rs, &c, p) {
                        return Some(port);
                    }
                }
                Outcome::Verdict(Verdict::Goto(c)) => return walk(rs, &c, p),
                Outcome::Verdict(v) => panic!("verdict {v} not modelled"),
            }
        }
        None
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn the_ruleset_matches_the_spec_semantics(
            spec in spec(),
            uid in 0u32..6,
            gid in 0u32..5,
            udp in any::<bool>(),
            iface in proptest::sample::select(vec!["lo", "eth0", "eth1", "net1"]),
            src in proptest::sample::select(vec![None, Some("127.0.0.6"), Some("::6"), Some("10.1.2.3"), Some("fd00:1::9")]),
            dst in proptest::sample::select(vec!["10.1.2.3", "10.1.9.9", "10.200.0.1", "192.168.0.1", "127.0.0.1", "127.0.0.6", "fd00:1::5", "fd00:2::5", "2001:db8::1", "::1", "::6"]),
            port in prop_oneof![1u16..12, Just(53), Just(15008)],
        ) {
            let rs = Ruleset::for_spec(&spec);
            let dst: IpAddr = dst.parse().unwrap();
            let family = Family::of(&dst);
            let src: Option<IpAddr> = src.map(|s| s.parse().unwrap()).filter(|s| Family::of(s) == family);
            let p = Packet {
                uid,
                gid,
                iif: iface,
                oif: iface,
                // An unbound socket's source, as the rules see it: not the passthrough one.
                src: src.unwrap_or(match family {
                    Family::V4 => "10.255.0.1".parse().unwrap(),
                    Family::V6 => "fd00:ff::1".parse().unwrap(),
                }),
                dst,
                udp,
                port,
            };
            let want = spec.outbound(&OutboundFlow {
                uid,
                gid,
                out_if: iface,
                src,
                dst,
                transport: if udp { Transport::Udp } else { Transport::Tcp },
                port,
            });
            prop_assert_eq!(walk(&rs, CHAIN_OUTPUT, &p), landing_port(&spec, want), "{:?}", want);
            if iface != "lo" && !udp {
                let p = Packet { src: dst, ..p };
                prop_assert_eq!(
                    walk(&rs, CHAIN_PREROUTING, &p),
                    landing_port(&spec, spec.inbound(iface, dst, port))
                );
            }
        }
    }
}

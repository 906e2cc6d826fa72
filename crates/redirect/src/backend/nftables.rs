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
    Verdict, IPPROTO_TCP, NFPROTO_IPV4, NFPROTO_IPV6, TABLE_F_DORMANT,
};

use interlock_contract::codes::Step;

use crate::backend::{Backend, BackendError, BackendKind, Verification};
use crate::spec::{port_runs, Family, PortSelection, RedirectSpec};

/// Table interlock owns in every pod netns (family `inet`).
pub const TABLE: &str = "interlock";
/// Priority of both base chains (`dstnat`, as iptables' nat table).
pub const NAT_PRIORITY: i32 = -100;

const CHAIN_PREROUTING: &str = "prerouting";
const CHAIN_OUTPUT: &str = "output";
const CHAIN_INBOUND: &str = "inbound";
const CHAIN_OUTBOUND: &str = "outbound";
const CHAIN_OUTBOUND_REDIRECT: &str = "outbound_redirect";

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
    /// rule sets).
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

        // Base chains: one jump, restricted to the family when only one is programmed.
        let entry = |target: &str| -> Vec<Rule> {
            let mut r = Rule::new("");
            if families.len() == 1 {
                r = r.nfproto(nfproto(families[0]));
            }
            vec![r
                .l4proto(IPPROTO_TCP)
                .verdict(Verdict::Jump(target.to_string()))]
        };
        chain(CHAIN_PREROUTING, entry(CHAIN_INBOUND));
        chain(CHAIN_OUTPUT, entry(CHAIN_OUTBOUND));

        // Inbound: excluded interfaces, excluded ports, then capture.
        let mut inbound = Vec::new();
        for ifname in &spec.exclude_interfaces {
            inbound.push(Rule::new("").iifname(ifname).verdict(Verdict::Return));
        }
        for run in port_runs(&spec.inbound.exclude_ports) {
            inbound.push(dport_run(Rule::new(""), &run).verdict(Verdict::Return));
        }
        inbound.extend(redirects(
            &spec.inbound.include_ports,
            spec.inbound.proxy_port,
        ));
        chain(CHAIN_INBOUND, inbound);

        // Outbound: the exemptions in the spec's order, then the include CIDRs (or all).
        let mut outbound = vec![
            Rule::new("").oifname("lo").verdict(Verdict::Return),
            Rule::new("").skuid(spec.proxy_uid).verdict(Verdict::Return),
        ];
        if let Some(gid) = spec.proxy_gid {
            outbound.push(Rule::new("").skgid(gid).verdict(Verdict::Return));
        }
        for ifname in &spec.exclude_interfaces {
            outbound.push(Rule::new("").oifname(ifname).verdict(Verdict::Return));
        }
        for run in port_runs(&spec.outbound.exclude_ports) {
            outbound.push(dport_run(Rule::new(""), &run).verdict(Verdict::Return));
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
        // Capture: every destination (the redirect rules end the chain), or only the
        // included networks, each sent on to the redirect chain.
        let capture = redirects(&spec.outbound.include_ports, spec.outbound.proxy_port);
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

fn exprs_line(r: &Rule) -> String {
    r.exprs
        .iter()
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join(" ")
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
    use std::time::{Duration, Instant};

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

    #[test]
    fn timing_of_apply_and_verify() {
        require_root!();
        let be = NftablesBackend::new();
        let s = spec();
        let mut s2 = s.clone();
        s2.outbound.proxy_port = 15002;
        let rounds = 20u32;
        let (mut fresh, mut noop, mut replace, mut verify) = (
            Duration::ZERO,
            Duration::ZERO,
            Duration::ZERO,
            Duration::ZERO,
        );
        let (mut read_first, mut created_t) = (Duration::ZERO, Duration::ZERO);
        for _ in 0..rounds {
            // The plugin's ADD into a new pod's netns, reading first or (nothing recorded
            // for the netns) creating first.
            for (ns, created) in [
                (Netns::new("nftperf").unwrap(), false),
                (Netns::new("nftperf").unwrap(), true),
            ] {
                ns.run(|| {
                    let t = Instant::now();
                    let v = if created {
                        be.create_and_verify(&s)
                    } else {
                        be.apply_and_verify(&s)
                    };
                    assert!(v.unwrap().is_exact());
                    *(if created {
                        &mut created_t
                    } else {
                        &mut read_first
                    }) += t.elapsed();
                });
            }
            // A new pod: its netns has never had a table (the plugin ADD case).
            let ns = Netns::new("nftperf").unwrap();
            ns.run(|| {
                let t = Instant::now();
                be.apply(&s).unwrap();
                assert!(be.verify(&s).unwrap().is_exact());
                fresh += t.elapsed();
                let t = Instant::now();
                be.apply(&s).unwrap();
                noop += t.elapsed();
                let t = Instant::now();
                assert!(be.verify(&s).unwrap().is_exact());
                verify += t.elapsed();
                let t = Instant::now();
                assert!(be.apply_and_verify(&s2).unwrap().is_exact());
                replace += t.elapsed();
            });
        }
        let (fresh, noop, replace, verify, read_first, created) = (
            fresh / rounds,
            noop / rounds,
            replace / rounds,
            verify / rounds,
            read_first / rounds,
            created_t / rounds,
        );
        eprintln!(
            "nftables backend, {} rules, mean of {rounds} new netns: apply+verify {fresh:?}; \
             on one socket: read first {read_first:?}, create first {created:?}; \
             apply when already exact {noop:?}; verify {verify:?}; \
             replace with another spec + verify {replace:?} (includes the close waiting for an RCU grace period)",
            Ruleset::for_spec(&s).rules.len()
        );
        // Generous bound (debug build, shared 2-core machine): catches a regression to
        // the slow path (e.g. deleting in the new-pod case), not a benchmark.
        assert!(fresh < Duration::from_millis(5), "{fresh:?}");
        assert!(created < Duration::from_millis(5), "{created:?}");
    }
}

//! The iptables backend: `iptables-restore --noflush` (and `ip6tables-restore`), one call
//! per address family, legacy or nft flavour.
//!
//! interlock owns chains in the pod netns's tables — in `nat` [`CHAIN_INBOUND`],
//! [`CHAIN_OUTPUT`] and [`CHAIN_OUT_PORTS`] (jumped to by the first rules of `PREROUTING`
//! and `OUTPUT`: TCP, and UDP when DNS is captured); in `mangle` [`CHAIN_DROP_INVALID`]
//! when invalid packets are dropped; in `raw` [`CHAIN_DNS_OUT`] and [`CHAIN_DNS_IN`] for
//! the DNS conntrack zones. Apply reads the tables (`iptables-save`; skipped when the
//! netns has none of them, as a fresh pod's has not), does nothing when exactly the
//! expected rules are there, and otherwise replaces interlock's chains and jumps in one
//! restore transaction per family (declaring a chain in `--noflush` mode flushes it; stale
//! jumps are deleted by their saved text, chains a spec no longer needs are deleted).
//! Rules are written exactly as `iptables-save` prints them, so verification is a
//! line-by-line comparison.

use std::io::Write;
use std::process::{Command, Stdio};

use interlock_contract::codes::Step;

use crate::backend::{Backend, BackendError, BackendKind, ToolLookup, Verification};
use crate::spec::{
    port_runs, DnsCapture, Family, PortSelection, RedirectSpec, DNS_PORT, PASSTHROUGH_SOURCE_V4,
    PASSTHROUGH_SOURCE_V6,
};

/// Chain for inbound capture, jumped to from `nat PREROUTING`.
pub const CHAIN_INBOUND: &str = "IL_INBOUND";
/// Chain for outbound exemptions and destination selection, jumped to from `nat OUTPUT`.
pub const CHAIN_OUTPUT: &str = "IL_OUTPUT";
/// Chain for outbound port selection and the redirect itself.
pub const CHAIN_OUT_PORTS: &str = "IL_OUT_PORTS";
/// Chain dropping invalid packets, jumped to from `mangle PREROUTING`.
pub const CHAIN_DROP_INVALID: &str = "IL_DROP_INVALID";
/// Chain setting the DNS conntrack zones of outgoing packets (`raw OUTPUT`).
pub const CHAIN_DNS_OUT: &str = "IL_DNS_OUT";
/// Chain setting the DNS conntrack zone of incoming replies (`raw PREROUTING`).
pub const CHAIN_DNS_IN: &str = "IL_DNS_IN";

/// A table interlock writes chains into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    /// `nat`: the redirections.
    Nat,
    /// `mangle`: the invalid-packet drop.
    Mangle,
    /// `raw`: the DNS conntrack zones.
    Raw,
}

impl Table {
    /// Every table, in the order restore text lists them.
    pub const ALL: [Table; 3] = [Table::Nat, Table::Mangle, Table::Raw];

    /// The table's name.
    pub fn name(self) -> &'static str {
        match self {
            Table::Nat => "nat",
            Table::Mangle => "mangle",
            Table::Raw => "raw",
        }
    }

    /// interlock's chains in this table, in declaration order.
    pub fn chains(self) -> &'static [&'static str] {
        match self {
            Table::Nat => &[CHAIN_INBOUND, CHAIN_OUTPUT, CHAIN_OUT_PORTS],
            Table::Mangle => &[CHAIN_DROP_INVALID],
            Table::Raw => &[CHAIN_DNS_OUT, CHAIN_DNS_IN],
        }
    }

    fn of_chain(chain: &str) -> Option<(Table, &'static str)> {
        Table::ALL
            .into_iter()
            .find_map(|t| t.chains().iter().find(|c| **c == chain).map(|c| (t, *c)))
    }
}

/// Which iptables implementation the tools drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flavour {
    /// `iptables-nft*` (xtables over nf_tables).
    Nft,
    /// `iptables-legacy*` (x_tables).
    Legacy,
}

impl Flavour {
    /// The tool name for `base` (`iptables`, `iptables-restore`, `iptables-save`) in this
    /// flavour and family, e.g. `ip6tables-legacy-restore`.
    pub fn tool(self, family: Family, base: Tool) -> String {
        let prefix = match family {
            Family::V4 => "iptables",
            Family::V6 => "ip6tables",
        };
        let flavour = match self {
            Flavour::Nft => "nft",
            Flavour::Legacy => "legacy",
        };
        match base {
            Tool::Iptables => format!("{prefix}-{flavour}"),
            Tool::Restore => format!("{prefix}-{flavour}-restore"),
            Tool::Save => format!("{prefix}-{flavour}-save"),
        }
    }

    fn kind(self) -> BackendKind {
        match self {
            Flavour::Nft => BackendKind::IptablesNft,
            Flavour::Legacy => BackendKind::IptablesLegacy,
        }
    }
}

/// The three iptables programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    /// `iptables` (one rule per call).
    Iptables,
    /// `iptables-restore`.
    Restore,
    /// `iptables-save`.
    Save,
}

/// One rule in an interlock chain: the chain and the text after `-A <chain> `, exactly as
/// `iptables-save` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainRule {
    /// interlock chain the rule is in.
    pub chain: &'static str,
    /// Rule text (`-p tcp -m tcp --dport 22 -j RETURN`).
    pub rule: String,
}

impl ChainRule {
    /// The table of the rule's chain.
    pub fn table(&self) -> Table {
        Table::of_chain(self.chain)
            .map(|(t, _)| t)
            .unwrap_or(Table::Nat)
    }
}

/// A jump from a built-in chain to one of interlock's, as `iptables-save` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Jump {
    /// Table.
    pub table: Table,
    /// Built-in chain (`PREROUTING`, `OUTPUT`).
    pub builtin: &'static str,
    /// Rule text after `-A <builtin> `.
    pub rule: String,
}

fn dport(proto: &str, run: &std::ops::RangeInclusive<u16>) -> String {
    if run.start() == run.end() {
        format!("-p {proto} -m {proto} --dport {}", run.start())
    } else {
        format!(
            "-p {proto} -m {proto} --dport {}:{}",
            run.start(),
            run.end()
        )
    }
}

/// `! --dport` of one port, or `-m multiport ! --dports` of several (TCP).
fn tcp_dport_not(ports: &[u16]) -> String {
    match ports {
        [] => "-p tcp".to_string(),
        [p] => format!("-p tcp -m tcp ! --dport {p}"),
        many => format!(
            "-p tcp -m multiport ! --dports {}",
            many.iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(",")
        ),
    }
}

fn localhost(family: Family) -> &'static str {
    match family {
        Family::V4 => "127.0.0.1/32",
        Family::V6 => "::1/128",
    }
}

fn host(ip: std::net::IpAddr) -> String {
    match ip {
        std::net::IpAddr::V4(a) => format!("{a}/32"),
        std::net::IpAddr::V6(a) => format!("{a}/128"),
    }
}

/// The DNS capture of `spec` that applies to `family`, if any.
fn dns_of(spec: &RedirectSpec, family: Family) -> Option<&DnsCapture> {
    spec.dns.as_ref().filter(|d| d.covers(family))
}

/// The jumps `spec` needs for `family`, per built-in chain in order (each first in it).
pub fn jumps(spec: &RedirectSpec, family: Family) -> Vec<Jump> {
    if !spec.families().contains(&family) {
        return Vec::new();
    }
    let j = |table, builtin, rule: &str| Jump {
        table,
        builtin,
        rule: rule.to_string(),
    };
    let mut out = vec![
        j(Table::Nat, "PREROUTING", "-p tcp -j IL_INBOUND"),
        j(Table::Nat, "OUTPUT", "-p tcp -j IL_OUTPUT"),
    ];
    if let Some(d) = dns_of(spec, family) {
        out.push(j(Table::Nat, "OUTPUT", "-p udp -j IL_OUTPUT"));
        if d.conntrack_zones {
            out.push(j(Table::Raw, "OUTPUT", "-j IL_DNS_OUT"));
            out.push(j(Table::Raw, "PREROUTING", "-j IL_DNS_IN"));
        }
    }
    if spec.drop_invalid {
        out.push(j(Table::Mangle, "PREROUTING", "-j IL_DROP_INVALID"));
    }
    out
}

/// The rules of interlock's chains for one family, in order (the semantics documented in
/// [`crate::spec`]). Empty when the spec does not enable `family`.
pub fn chain_rules(spec: &RedirectSpec, family: Family) -> Vec<ChainRule> {
    let mut out = Vec::new();
    if !spec.families().contains(&family) {
        return out;
    }
    let spec = spec.normalized();
    let dns = dns_of(&spec, family);
    // Port 53 is spared on lo whenever DNS is captured at all (the semantics' steps 5–6).
    let dns_set = spec.dns.is_some();
    let mut push = |chain: &'static str, rule: String| out.push(ChainRule { chain, rule });
    let in_redirect = format!("-j REDIRECT --to-ports {}", spec.inbound.proxy_port);

    // Inbound.
    for iface in &spec.exclude_interfaces {
        push(CHAIN_INBOUND, format!("-i {iface} -j RETURN"));
    }
    for run in port_runs(&spec.inbound.exclude_ports) {
        push(CHAIN_INBOUND, format!("{} -j RETURN", dport("tcp", &run)));
    }
    for net in spec.exclude_sources(family) {
        push(CHAIN_INBOUND, format!("{}-j RETURN", addr("-s", &net)));
    }
    match &spec.inbound.include_ports {
        PortSelection::All => push(CHAIN_INBOUND, format!("-p tcp {in_redirect}")),
        PortSelection::Only(list) => {
            for run in port_runs(list) {
                push(
                    CHAIN_INBOUND,
                    format!("{} {in_redirect}", dport("tcp", &run)),
                );
            }
        }
    }

    // Outbound, step by step. With the default loopback handling and no DNS every
    // exemption is a plain return and their order does not matter: they keep the order
    // the first release wrote, so its pods read back as intact.
    let simple = spec.loopback.is_default() && spec.dns.is_none();
    if simple {
        push(CHAIN_OUTPUT, "-o lo -j RETURN".into());
        push(
            CHAIN_OUTPUT,
            format!("-m owner --uid-owner {} -j RETURN", spec.proxy_uid),
        );
        if let Some(gid) = spec.proxy_gid {
            push(
                CHAIN_OUTPUT,
                format!("-m owner --gid-owner {gid} -j RETURN"),
            );
        }
    }
    for iface in &spec.exclude_interfaces {
        push(CHAIN_OUTPUT, format!("-o {iface} -j RETURN"));
    }
    let dns_rules = |d: &DnsCapture| -> Vec<String> {
        let to = |dst: &str| {
            ["tcp", "udp"].map(|p| {
                format!(
                    "{dst}-p {p} -m {p} --dport {DNS_PORT} -j REDIRECT --to-ports {}",
                    d.port
                )
            })
        };
        if d.only_to.is_empty() {
            to("").to_vec()
        } else {
            d.only_to(family)
                .into_iter()
                .flat_map(|a| to(&format!("-d {} ", host(a))))
                .collect()
        }
    };
    if let Some(d) = dns.filter(|d| !d.proxy_exempt) {
        for r in dns_rules(d) {
            push(CHAIN_OUTPUT, r);
        }
    }
    for run in port_runs(&spec.outbound.exclude_ports) {
        push(CHAIN_OUTPUT, format!("{} -j RETURN", dport("tcp", &run)));
        if dns.is_some() {
            push(CHAIN_OUTPUT, format!("{} -j RETURN", dport("udp", &run)));
        }
    }
    let lo = &spec.loopback;
    if lo.passthrough_source {
        let src = match family {
            Family::V4 => format!("{PASSTHROUGH_SOURCE_V4}/32"),
            Family::V6 => format!("{PASSTHROUGH_SOURCE_V6}/128"),
        };
        push(CHAIN_OUTPUT, format!("-s {src} -o lo -j RETURN"));
    }
    let hairpin = |owner: &str, id: u32, skip: &[u16]| {
        format!(
            "! -d {} -o lo {} -m owner --{owner}-owner {id} {in_redirect}",
            localhost(family),
            tcp_dport_not(skip)
        )
    };
    if let Some(h) = &lo.proxy_to_inbound {
        let mut skip = h.skip_ports.clone();
        if dns_set {
            skip.push(DNS_PORT);
            skip.sort_unstable();
            skip.dedup();
        }
        push(CHAIN_OUTPUT, hairpin("uid", spec.proxy_uid, &skip));
    }
    if lo.app_bypass && !simple {
        let rule = if lo.proxy_to_inbound.is_none() && !dns_set {
            "-o lo -j RETURN".to_string()
        } else if dns_set {
            format!(
                "-o lo -p tcp -m tcp ! --dport {DNS_PORT} -m owner ! --uid-owner {} -j RETURN",
                spec.proxy_uid
            )
        } else {
            format!("-o lo -m owner ! --uid-owner {} -j RETURN", spec.proxy_uid)
        };
        push(CHAIN_OUTPUT, rule);
    }
    if !simple {
        push(
            CHAIN_OUTPUT,
            format!("-m owner --uid-owner {} -j RETURN", spec.proxy_uid),
        );
    }
    if let Some(gid) = spec.proxy_gid.filter(|_| !simple) {
        if let Some(h) = &lo.proxy_to_inbound {
            push(CHAIN_OUTPUT, hairpin("gid", gid, &h.skip_ports));
        }
        push(
            CHAIN_OUTPUT,
            format!("-m owner --gid-owner {gid} -j RETURN"),
        );
    }
    for uid in &spec.exempt_uids {
        push(
            CHAIN_OUTPUT,
            format!("-m owner --uid-owner {uid} -j RETURN"),
        );
    }
    if let Some(d) = dns.filter(|d| d.proxy_exempt) {
        for r in dns_rules(d) {
            push(CHAIN_OUTPUT, r);
        }
    }
    if !lo.app_bypass {
        push(CHAIN_OUTPUT, format!("-d {} -j RETURN", localhost(family)));
    }
    if dns.is_some() {
        push(CHAIN_OUTPUT, "-p udp -j RETURN".to_string());
    }
    for net in spec.exclude_cidrs(family) {
        push(CHAIN_OUTPUT, format!("{}-j RETURN", addr("-d", &net)));
    }
    for run in port_runs(&spec.outbound.any_destination_ports) {
        push(
            CHAIN_OUTPUT,
            format!(
                "{} -j REDIRECT --to-ports {}",
                dport("tcp", &run),
                spec.outbound.proxy_port
            ),
        );
    }
    // Destination selection.
    if spec.outbound.include_cidrs.is_empty() {
        push(CHAIN_OUTPUT, format!("-j {CHAIN_OUT_PORTS}"));
    } else {
        for net in spec.include_cidrs(family) {
            push(
                CHAIN_OUTPUT,
                format!("{}-j {CHAIN_OUT_PORTS}", addr("-d", &net)),
            );
        }
    }
    // Port selection and redirect.
    let out_redirect = format!("-j REDIRECT --to-ports {}", spec.outbound.proxy_port);
    match &spec.outbound.include_ports {
        PortSelection::All => push(CHAIN_OUT_PORTS, format!("-p tcp {out_redirect}")),
        PortSelection::Only(list) => {
            for run in port_runs(list) {
                push(
                    CHAIN_OUT_PORTS,
                    format!("{} {out_redirect}", dport("tcp", &run)),
                );
            }
        }
    }

    // Invalid inbound packets, dropped.
    if spec.drop_invalid {
        push(
            CHAIN_DROP_INVALID,
            "-m conntrack --ctstate INVALID -j DROP".to_string(),
        );
    }
    // DNS conntrack zones.
    if let Some(d) = dns.filter(|d| d.conntrack_zones) {
        let owners = [("uid", Some(spec.proxy_uid)), ("gid", spec.proxy_gid)];
        for (owner, id) in owners {
            if let Some(id) = id {
                push(
                    CHAIN_DNS_OUT,
                    format!("-p udp -m udp --dport {DNS_PORT} -m owner --{owner}-owner {id} -j CT --zone 1"),
                );
                push(
                    CHAIN_DNS_OUT,
                    format!(
                        "-p udp -m udp --sport {} -m owner --{owner}-owner {id} -j CT --zone 2",
                        d.port
                    ),
                );
            }
        }
        push(
            CHAIN_DNS_OUT,
            format!("-p udp -m udp --dport {DNS_PORT} -j CT --zone 2"),
        );
        push(
            CHAIN_DNS_IN,
            format!("-p udp -m udp --sport {DNS_PORT} -j CT --zone 1"),
        );
    }
    out
}

/// The `iptables-restore --noflush` input that installs `spec` for `family` in a netns that
/// has none of interlock's rules yet (the "one restore per family" baseline). Empty when
/// the family is not enabled.
pub fn restore_text(spec: &RedirectSpec, family: Family) -> String {
    if !spec.families().contains(&family) {
        return String::new();
    }
    render_restore(
        &Observed::default(),
        &chain_rules(spec, family),
        &jumps(spec, family),
    )
}

/// The restore text that turns `obs` into exactly `rules` and `jumps`: per table it
/// touches, interlock's chains declared (flushed), stale jumps deleted, the jumps
/// inserted first in their built-in chains, the rules appended, and the chains no longer
/// used deleted.
fn render_restore(obs: &Observed, rules: &[ChainRule], jumps: &[Jump]) -> String {
    let mut s = String::new();
    for table in Table::ALL {
        let wanted = jumps.iter().any(|j| j.table == table);
        let present = obs.chains.iter().any(|(t, _)| *t == table)
            || obs.jumps.iter().any(|j| j.table == table);
        if !wanted && !present {
            continue;
        }
        s.push_str(&format!("*{}\n", table.name()));
        for c in table.chains() {
            s.push_str(&format!(":{c} - [0:0]\n"));
        }
        for j in obs.jumps.iter().filter(|j| j.table == table) {
            s.push_str(&format!("-D {} {}\n", j.builtin, j.rule));
        }
        // Inserted at 1 in reverse, so each built-in chain starts with its jumps in order.
        for j in jumps.iter().filter(|j| j.table == table).rev() {
            s.push_str(&format!("-I {} 1 {}\n", j.builtin, j.rule));
        }
        for r in rules.iter().filter(|r| r.table() == table) {
            s.push_str(&format!("-A {} {}\n", r.chain, r.rule));
        }
        for c in table.chains() {
            if !chain_used(c, rules, jumps) {
                s.push_str(&format!("-X {c}\n"));
            }
        }
        s.push_str("COMMIT\n");
    }
    s
}

/// Whether chain `c` is needed: it holds rules, or a rule or a built-in jump goes to it
/// (`IL_OUT_PORTS` can be jumped to and empty, when no port is captured).
fn chain_used(c: &str, rules: &[ChainRule], jumps: &[Jump]) -> bool {
    let target = format!("-j {c}");
    rules
        .iter()
        .any(|r| r.chain == c || r.rule.ends_with(&target))
        || jumps.iter().any(|j| j.rule.ends_with(&target))
}

/// `-d <net> ` (or `-s`), as iptables-save prints it: nothing for a whole family
/// (`0.0.0.0/0` and `::/0` match every address and are not printed).
fn addr(flag: &str, net: &ipnet::IpNet) -> String {
    if net.prefix_len() == 0 {
        String::new()
    } else {
        format!("{flag} {net} ")
    }
}

/// One `iptables` argv per rule (program first) that installs `spec` for `family` in a
/// fresh netns: create the chains, append the rules, insert the jumps (the "one call per
/// rule" baseline).
pub fn rule_argvs(spec: &RedirectSpec, family: Family, flavour: Flavour) -> Vec<Vec<String>> {
    if !spec.families().contains(&family) {
        return Vec::new();
    }
    let prog = flavour.tool(family, Tool::Iptables);
    let base = |table: Table, args: Vec<String>| -> Vec<String> {
        let mut v = vec![
            prog.clone(),
            "-w".into(),
            "5".into(),
            "-t".into(),
            table.name().into(),
        ];
        v.extend(args);
        v
    };
    let words = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
    let rules = chain_rules(spec, family);
    let jumps = jumps(spec, family);
    let mut out = Vec::new();
    for table in Table::ALL {
        if !jumps.iter().any(|j| j.table == table) {
            continue;
        }
        for c in table.chains() {
            if rules.iter().any(|r| r.chain == *c) {
                out.push(base(table, vec!["-N".into(), c.to_string()]));
            }
        }
    }
    for r in &rules {
        let mut args = vec!["-A".into(), r.chain.into()];
        args.extend(words(&r.rule));
        out.push(base(r.table(), args));
    }
    for j in jumps.iter().rev() {
        let mut args = vec!["-I".into(), j.builtin.into(), "1".into()];
        args.extend(words(&j.rule));
        out.push(base(j.table, args));
    }
    out
}

/// What `iptables-save` shows of interlock.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Observed {
    /// interlock chains declared, with their tables.
    chains: Vec<(Table, &'static str)>,
    /// Rules per interlock chain, in order.
    rules: Vec<ChainRule>,
    /// Every rule of a built-in chain that jumps to an interlock chain, with its position
    /// in that built-in chain.
    jumps: Vec<ObservedJump>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct ObservedJump {
    table: Table,
    builtin: String,
    rule: String,
    position: usize,
}

impl Observed {
    fn is_empty(&self) -> bool {
        self.chains.is_empty() && self.rules.is_empty() && self.jumps.is_empty()
    }
}

fn parse_save(text: &str) -> Observed {
    let mut obs = Observed::default();
    let mut table = None;
    let mut positions: std::collections::HashMap<String, usize> = Default::default();
    for line in text.lines() {
        let line = line.trim_end();
        if let Some(t) = line.strip_prefix('*') {
            table = Table::ALL.into_iter().find(|x| x.name() == t);
            positions.clear();
            continue;
        }
        let Some(table) = table else {
            continue;
        };
        if let Some(decl) = line.strip_prefix(':') {
            let name = decl.split_whitespace().next().unwrap_or("");
            if let Some(c) = table.chains().iter().find(|c| **c == name) {
                obs.chains.push((table, c));
            }
        } else if let Some(rest) = line.strip_prefix("-A ") {
            let (chain, rule) = rest.split_once(' ').unwrap_or((rest, ""));
            let pos = positions.entry(chain.to_string()).or_insert(0);
            let position = *pos;
            *pos += 1;
            if let Some(c) = table.chains().iter().find(|c| **c == chain) {
                obs.rules.push(ChainRule {
                    chain: c,
                    rule: rule.to_string(),
                });
            } else if (chain == "PREROUTING" || chain == "OUTPUT")
                && table.chains().iter().any(|c| {
                    rule.split_whitespace()
                        .collect::<Vec<_>>()
                        .windows(2)
                        .any(|w| w[0] == "-j" && w[1] == *c)
                })
            {
                obs.jumps.push(ObservedJump {
                    table,
                    builtin: chain.to_string(),
                    rule: rule.to_string(),
                    position,
                });
            }
        }
    }
    obs
}

/// Compares what is there with what `expected` and `jumps` (the family's rules and jumps;
/// empty = family off) need; every difference in words.
fn compare(family: Family, expected: &[ChainRule], jumps: &[Jump], obs: &Observed) -> Vec<String> {
    let mut diffs = Vec::new();
    let used = |c: &str| chain_used(c, expected, jumps);
    for (table, c) in &obs.chains {
        if !used(c) {
            diffs.push(format!(
                "{family}: unexpected chain {c} in table {}",
                table.name()
            ));
        }
    }
    for table in Table::ALL {
        for c in table.chains() {
            if used(c) && !obs.chains.iter().any(|(_, o)| o == c) {
                diffs.push(format!("{family}: chain {c} missing"));
            }
        }
    }
    for table in Table::ALL {
        for c in table.chains().iter().copied() {
            let want: Vec<&str> = expected
                .iter()
                .filter(|r| r.chain == c)
                .map(|r| r.rule.as_str())
                .collect();
            let have: Vec<&str> = obs
                .rules
                .iter()
                .filter(|r| r.chain == c)
                .map(|r| r.rule.as_str())
                .collect();
            if want == have {
                continue;
            }
            let mut any = false;
            for w in &want {
                if !have.contains(w) {
                    diffs.push(format!("{family}: missing rule -A {c} {w}"));
                    any = true;
                }
            }
            for h in &have {
                if !want.contains(h) {
                    diffs.push(format!("{family}: unexpected rule -A {c} {h}"));
                    any = true;
                }
            }
            if !any {
                diffs.push(format!(
                    "{family}: rules of chain {c} are out of order or duplicated"
                ));
            }
        }
    }
    for j in jumps {
        // Its place: after the jumps before it in the same built-in chain.
        let want_at = jumps
            .iter()
            .take_while(|o| !std::ptr::eq(*o, j))
            .filter(|o| o.table == j.table && o.builtin == j.builtin)
            .count();
        let matching: Vec<usize> = obs
            .jumps
            .iter()
            .filter(|o| o.table == j.table && o.builtin == j.builtin && o.rule == j.rule)
            .map(|o| o.position)
            .collect();
        match matching.as_slice() {
            [] => diffs.push(format!(
                "{family}: missing rule -A {} {}",
                j.builtin, j.rule
            )),
            [i] if *i == want_at => {}
            [i] => diffs.push(format!(
                "{family}: rule -A {} {} is at position {} instead of {}",
                j.builtin,
                j.rule,
                i + 1,
                want_at + 1
            )),
            _ => diffs.push(format!(
                "{family}: rule -A {} {} is duplicated",
                j.builtin, j.rule
            )),
        }
    }
    for o in &obs.jumps {
        if !jumps
            .iter()
            .any(|j| j.table == o.table && j.builtin == o.builtin && j.rule == o.rule)
        {
            diffs.push(format!(
                "{family}: unexpected rule -A {} {}",
                o.builtin, o.rule
            ));
        }
    }
    diffs
}

/// The iptables backend.
///
/// Removal treats a missing `*-save` program as "none of this backend's rules here":
/// interlock only ever installs them with these very tools, so on a host without them
/// (an nftables-only node has no `iptables-nft-save`) there is nothing of this backend to
/// remove, and a CNI DEL without state (which removes every backend's rules) must not
/// fail forever because of it.
#[derive(Debug, Clone)]
pub struct IptablesBackend {
    flavour: Flavour,
    tools: ToolLookup,
}

impl IptablesBackend {
    /// A backend driving the tools of `flavour`, found with [`ToolLookup::System`].
    pub fn new(flavour: Flavour) -> IptablesBackend {
        IptablesBackend::with_tools(flavour, ToolLookup::System)
    }

    /// A backend driving the tools of `flavour`, found with `tools`.
    pub fn with_tools(flavour: Flavour, tools: ToolLookup) -> IptablesBackend {
        IptablesBackend { flavour, tools }
    }

    /// The program `tool`, or an error naming it and where it was looked for.
    fn program(&self, tool: &str, op: Step) -> Result<std::path::PathBuf, BackendError> {
        self.tools.find(tool).ok_or_else(|| BackendError::Missing {
            backend: self.flavour.kind(),
            op,
            program: tool.to_string(),
            searched: self.tools.describe(),
        })
    }

    /// The flavour this backend drives.
    pub fn flavour(&self) -> Flavour {
        self.flavour
    }

    fn spawn_err(
        &self,
        op: Step,
        program: impl Into<String>,
        source: std::io::Error,
    ) -> BackendError {
        BackendError::Spawn {
            backend: self.flavour.kind(),
            op,
            program: program.into(),
            source,
        }
    }

    fn save(&self, family: Family, op: Step) -> Result<Observed, BackendError> {
        let exists = |table: Table| match self.flavour {
            Flavour::Legacy => legacy_table_exists(family, table),
            Flavour::Nft => nft_table_exists(family, table),
        };
        let present: Vec<Table> = Table::ALL.into_iter().filter(|t| exists(*t)).collect();
        if present.is_empty() {
            // None of these tables in this netns (a fresh pod's, for one): nothing of
            // ours, and no need to start a process (which, for legacy, would also
            // instantiate a table).
            return Ok(Observed::default());
        }
        let tool = self.flavour.tool(family, Tool::Save);
        // Removal: without the tool, none of this backend's rules can be here (see the
        // type's docs).
        let removing = op == Step::Remove;
        let program = match self.program(&tool, op) {
            Ok(p) => p,
            Err(_) if removing => return Ok(Observed::default()),
            Err(e) => return Err(e),
        };
        // One table is asked for by name; several are read in one run of the tool.
        let args: &[&str] = if present == [Table::Nat] {
            &["-t", "nat"]
        } else {
            &[]
        };
        let out = match Command::new(&program)
            .args(args)
            .stdin(Stdio::null())
            .output()
        {
            Ok(out) => out,
            Err(e) if removing && e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Observed::default())
            }
            Err(e) => return Err(self.spawn_err(op, program.display().to_string(), e)),
        };
        if !out.status.success() {
            return Err(BackendError::Tool {
                backend: self.flavour.kind(),
                op,
                command: format!("{tool} {} ({family})", args.join(" ")),
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
                input: None,
            });
        }
        Ok(parse_save(&String::from_utf8_lossy(&out.stdout)))
    }

    fn restore(&self, family: Family, op: Step, text: &str) -> Result<(), BackendError> {
        let tool = self.flavour.tool(family, Tool::Restore);
        let mut child = Command::new(self.program(&tool, op)?)
            .args(["--noflush", "-w", "5"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| self.spawn_err(op, &tool, e))?;
        let write = child
            .stdin
            .take()
            .expect("stdin is piped")
            .write_all(text.as_bytes());
        let out = child
            .wait_with_output()
            .map_err(|e| self.spawn_err(op, &tool, e))?;
        if !out.status.success() || write.is_err() {
            return Err(BackendError::Tool {
                backend: self.flavour.kind(),
                op,
                command: format!("{tool} --noflush ({family})"),
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
                input: Some(text.to_string()),
            });
        }
        Ok(())
    }

    fn remove_family(&self, family: Family, op: Step) -> Result<(), BackendError> {
        let obs = self.save(family, op)?;
        self.remove_observed(family, op, &obs)
    }

    fn remove_observed(
        &self,
        family: Family,
        op: Step,
        obs: &Observed,
    ) -> Result<(), BackendError> {
        if obs.is_empty() {
            return Ok(());
        }
        self.restore(family, op, &render_restore(obs, &[], &[]))
    }
}

const FAMILIES: [Family; 2] = [Family::V4, Family::V6];

/// Whether the legacy (x_tables) `table` exists in the calling thread's netns. `true`
/// when that cannot be read, so the caller falls back to asking the tool.
fn legacy_table_exists(family: Family, table: Table) -> bool {
    let file = match family {
        Family::V4 => "/proc/thread-self/net/ip_tables_names",
        Family::V6 => "/proc/thread-self/net/ip6_tables_names",
    };
    match std::fs::read_to_string(file) {
        Ok(names) => names.lines().any(|l| l.trim() == table.name()),
        Err(_) => true,
    }
}

/// Whether the nf_tables table that iptables-nft uses for `family` and `table` exists in
/// the calling thread's netns, asked in-process over netlink (tens of µs, against a few
/// ms for `iptables-nft-save`). `true` when that cannot be asked, so the caller falls
/// back to the tool.
fn nft_table_exists(family: Family, table: Table) -> bool {
    let nft_family = match family {
        Family::V4 => interlock_nft::Family::Ip,
        Family::V6 => interlock_nft::Family::Ip6,
    };
    match interlock_nft::Nft::open().and_then(|mut nft| nft.table(nft_family, table.name())) {
        Ok(t) => t.is_some(),
        Err(_) => true,
    }
}

impl Backend for IptablesBackend {
    fn kind(&self) -> BackendKind {
        self.flavour.kind()
    }

    /// Every program ADD runs exists: restore and save, for both families.
    fn usable(&self) -> Result<(), BackendError> {
        for family in FAMILIES {
            for tool in [Tool::Restore, Tool::Save] {
                self.program(&self.flavour.tool(family, tool), Step::Open)?;
            }
        }
        Ok(())
    }

    fn apply(&self, spec: &RedirectSpec) -> Result<(), BackendError> {
        spec.validate().map_err(|source| BackendError::Spec {
            backend: self.flavour.kind(),
            op: Step::Apply,
            source,
        })?;
        for family in FAMILIES {
            if !spec.families().contains(&family) {
                // A family that is off may have no usable tooling at all: then there is
                // nothing of ours in it either.
                if let Ok(obs) = self.save(family, Step::Apply) {
                    self.remove_observed(family, Step::Apply, &obs)?;
                }
                continue;
            }
            let expected = chain_rules(spec, family);
            let jumps = jumps(spec, family);
            let obs = self.save(family, Step::Apply)?;
            if compare(family, &expected, &jumps, &obs).is_empty() {
                continue;
            }
            self.restore(
                family,
                Step::Apply,
                &render_restore(&obs, &expected, &jumps),
            )?;
        }
        Ok(())
    }

    fn verify(&self, spec: &RedirectSpec) -> Result<Verification, BackendError> {
        let mut diffs = Vec::new();
        for family in FAMILIES {
            let expected = chain_rules(spec, family);
            let jumps = jumps(spec, family);
            let obs = match self.save(family, Step::Verify) {
                Ok(o) => o,
                // A family that is off may have no usable tooling at all.
                Err(_) if expected.is_empty() => continue,
                Err(e) => return Err(e),
            };
            diffs.extend(compare(family, &expected, &jumps, &obs));
        }
        Ok(if diffs.is_empty() {
            Verification::Exact
        } else {
            Verification::Mismatch(diffs)
        })
    }

    fn remove(&self) -> Result<(), BackendError> {
        let mut errors: Vec<BackendError> = FAMILIES
            .into_iter()
            .filter_map(|family| self.remove_family(family, Step::Remove).err())
            .collect();
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(BackendError::Several {
                backend: self.flavour.kind(),
                op: Step::Remove,
                errors,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::tests::istio_like;

    fn rules(spec: &RedirectSpec, family: Family) -> Vec<String> {
        chain_rules(spec, family)
            .into_iter()
            .map(|r| format!("-A {} {}", r.chain, r.rule))
            .collect()
    }

    #[test]
    fn istio_defaults_render() {
        let s = istio_like();
        assert_eq!(
            rules(&s, Family::V4),
            vec![
                "-A IL_INBOUND -p tcp -m tcp --dport 15020:15021 -j RETURN",
                "-A IL_INBOUND -p tcp -m tcp --dport 15090 -j RETURN",
                "-A IL_INBOUND -p tcp -j REDIRECT --to-ports 15006",
                "-A IL_OUTPUT -o lo -j RETURN",
                "-A IL_OUTPUT -m owner --uid-owner 1337 -j RETURN",
                "-A IL_OUTPUT -m owner --gid-owner 1337 -j RETURN",
                "-A IL_OUTPUT -j IL_OUT_PORTS",
                "-A IL_OUT_PORTS -p tcp -j REDIRECT --to-ports 15001",
            ]
        );
        assert_eq!(rules(&s, Family::V4), rules(&s, Family::V6));
    }

    #[test]
    fn selections_and_cidrs_render_per_family() {
        let mut s = istio_like();
        s.proxy_gid = None;
        s.exclude_interfaces = vec!["net1".into()];
        s.inbound.include_ports = PortSelection::Only(vec![80, 81, 443]);
        s.outbound.exclude_ports = vec![22];
        s.outbound.include_ports = PortSelection::Only(vec![8080]);
        s.outbound.exclude_cidrs = vec![
            "10.1.0.0/16".parse().unwrap(),
            "fd00:1::/64".parse().unwrap(),
        ];
        s.outbound.include_cidrs = vec!["10.0.0.0/8".parse().unwrap()];
        let v4 = rules(&s, Family::V4);
        assert_eq!(
            v4,
            vec![
                "-A IL_INBOUND -i net1 -j RETURN",
                "-A IL_INBOUND -p tcp -m tcp --dport 15020:15021 -j RETURN",
                "-A IL_INBOUND -p tcp -m tcp --dport 15090 -j RETURN",
                "-A IL_INBOUND -p tcp -m tcp --dport 80:81 -j REDIRECT --to-ports 15006",
                "-A IL_INBOUND -p tcp -m tcp --dport 443 -j REDIRECT --to-ports 15006",
                "-A IL_OUTPUT -o lo -j RETURN",
                "-A IL_OUTPUT -m owner --uid-owner 1337 -j RETURN",
                "-A IL_OUTPUT -o net1 -j RETURN",
                "-A IL_OUTPUT -p tcp -m tcp --dport 22 -j RETURN",
                "-A IL_OUTPUT -d 10.1.0.0/16 -j RETURN",
                "-A IL_OUTPUT -d 10.0.0.0/8 -j IL_OUT_PORTS",
                "-A IL_OUT_PORTS -p tcp -m tcp --dport 8080 -j REDIRECT --to-ports 15001",
            ]
        );
        let v6 = rules(&s, Family::V6);
        assert!(v6.contains(&"-A IL_OUTPUT -d fd00:1::/64 -j RETURN".to_string()));
        // No IPv6 include network: IPv6 destinations are not selected at all.
        assert!(!v6.iter().any(|r| r.contains("-j IL_OUT_PORTS")), "{v6:?}");
        s.ipv6 = false;
        assert!(chain_rules(&s, Family::V6).is_empty());
        assert!(restore_text(&s, Family::V6).is_empty());
    }

    #[test]
    fn restore_text_and_argvs_cover_the_same_rules() {
        let s = istio_like();
        let text = restore_text(&s, Family::V4);
        assert!(text.starts_with("*nat\n:IL_INBOUND - [0:0]\n"));
        assert!(text.contains("-I PREROUTING 1 -p tcp -j IL_INBOUND\n"));
        assert!(text.ends_with("COMMIT\n"));
        let argvs = rule_argvs(&s, Family::V6, Flavour::Legacy);
        assert_eq!(argvs.len(), 3 + chain_rules(&s, Family::V6).len() + 2);
        assert!(text.contains("-I OUTPUT 1 -p tcp -j IL_OUTPUT\n"));
        assert_eq!(
            argvs[0],
            [
                "ip6tables-legacy",
                "-w",
                "5",
                "-t",
                "nat",
                "-N",
                "IL_INBOUND"
            ]
        );
        assert_eq!(
            argvs.last().unwrap()[5..],
            ["-I", "PREROUTING", "1", "-p", "tcp", "-j", "IL_INBOUND"]
        );
    }

    fn save_of(spec: &RedirectSpec, family: Family) -> String {
        let rules = chain_rules(spec, family);
        let jumps = jumps(spec, family);
        let mut s = String::from("# Generated\n");
        for table in Table::ALL {
            s.push_str(&format!(
                "*{}\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n",
                table.name()
            ));
            for c in table.chains() {
                if rules.iter().any(|r| r.chain == *c) {
                    s.push_str(&format!(":{c} - [0:0]\n"));
                }
            }
            for j in jumps.iter().filter(|j| j.table == table) {
                s.push_str(&format!("-A {} {}\n", j.builtin, j.rule));
            }
            for r in rules.iter().filter(|r| r.table() == table) {
                s.push_str(&format!("-A {} {}\n", r.chain, r.rule));
            }
            s.push_str("COMMIT\n");
        }
        s
    }

    #[test]
    fn compare_finds_exact_missing_extra_and_order() {
        let s = istio_like();
        let exp = chain_rules(&s, Family::V4);
        let jumps = jumps(&s, Family::V4);
        let compare = |f, e: &[ChainRule], o: &Observed| compare(f, e, &jumps, o);
        let good = save_of(&s, Family::V4);
        assert!(compare(Family::V4, &exp, &parse_save(&good)).is_empty());

        let missing = good.replace("-A IL_OUTPUT -m owner --uid-owner 1337 -j RETURN\n", "");
        let d = compare(Family::V4, &exp, &parse_save(&missing));
        assert_eq!(
            d,
            vec!["IPv4: missing rule -A IL_OUTPUT -m owner --uid-owner 1337 -j RETURN"]
        );

        let changed = good.replace("--to-ports 15001", "--to-ports 15002");
        let d = compare(Family::V4, &exp, &parse_save(&changed));
        assert_eq!(d.len(), 2, "{d:?}");

        let reordered = good.replace(
            "-A IL_OUTPUT -o lo -j RETURN\n-A IL_OUTPUT -m owner --uid-owner 1337 -j RETURN\n",
            "-A IL_OUTPUT -m owner --uid-owner 1337 -j RETURN\n-A IL_OUTPUT -o lo -j RETURN\n",
        );
        let d = compare(Family::V4, &exp, &parse_save(&reordered));
        assert_eq!(
            d,
            vec!["IPv4: rules of chain IL_OUTPUT are out of order or duplicated"]
        );

        let no_jump = good.replace("-A OUTPUT -p tcp -j IL_OUTPUT\n", "");
        let d = compare(Family::V4, &exp, &parse_save(&no_jump));
        assert_eq!(d, vec!["IPv4: missing rule -A OUTPUT -p tcp -j IL_OUTPUT"]);

        let late_jump = good.replace(
            "-A OUTPUT -p tcp -j IL_OUTPUT\n",
            "-A OUTPUT -d 1.2.3.4/32 -j ACCEPT\n-A OUTPUT -p tcp -j IL_OUTPUT\n",
        );
        let d = compare(Family::V4, &exp, &parse_save(&late_jump));
        assert_eq!(
            d,
            vec!["IPv4: rule -A OUTPUT -p tcp -j IL_OUTPUT is at position 2 instead of 1"]
        );

        let odd_jump = good.replace("COMMIT", "-A PREROUTING -j IL_INBOUND\nCOMMIT");
        let d = compare(Family::V4, &exp, &parse_save(&odd_jump));
        assert_eq!(d, vec!["IPv4: unexpected rule -A PREROUTING -j IL_INBOUND"]);

        let no_chain = "*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n";
        let d = compare(Family::V4, &exp, &parse_save(no_chain));
        assert!(
            d.contains(&"IPv4: chain IL_OUT_PORTS missing".to_string()),
            "{d:?}"
        );

        // Other tables are ignored.
        let filter = format!("*filter\n:IL_INBOUND - [0:0]\n-A IL_INBOUND -j DROP\nCOMMIT\n{good}");
        assert!(compare(Family::V4, &exp, &parse_save(&filter)).is_empty());

        // A disabled family must be empty.
        let d = super::compare(Family::V6, &[], &[], &parse_save(&good));
        assert_eq!(d.len(), 13, "{d:?}");
        assert!(d.iter().all(|d| d.contains("unexpected")), "{d:?}");
        assert!(super::compare(Family::V6, &[], &[], &parse_save(no_chain)).is_empty());
    }

    fn istio_with_dns() -> RedirectSpec {
        let mut s = istio_like();
        s.loopback.passthrough_source = true;
        s.loopback.proxy_to_inbound = Some(crate::spec::ProxyToInbound {
            skip_ports: vec![15008],
        });
        s.dns = Some(DnsCapture {
            port: 15053,
            only_to: vec![],
            proxy_exempt: true,
            conntrack_zones: true,
        });
        s.drop_invalid = true;
        s
    }

    /// The rules for Istio's loopback handling, DNS capture and invalid drop, as
    /// istio-iptables writes them for the same settings (tools/istio-iptables/pkg/capture,
    /// the `dns` and `invalid-drop` cases of istio-cni), in iptables-save spelling.
    #[test]
    fn istio_loopback_dns_and_invalid_drop_render() {
        let s = istio_with_dns();
        let v6 = rules(&s, Family::V6);
        let out: Vec<&String> = v6
            .iter()
            .filter(|r| r.starts_with("-A IL_OUTPUT"))
            .collect();
        assert_eq!(
            out,
            vec![
                "-A IL_OUTPUT -s ::6/128 -o lo -j RETURN",
                "-A IL_OUTPUT ! -d ::1/128 -o lo -p tcp -m multiport ! --dports 53,15008 -m owner --uid-owner 1337 -j REDIRECT --to-ports 15006",
                "-A IL_OUTPUT -o lo -p tcp -m tcp ! --dport 53 -m owner ! --uid-owner 1337 -j RETURN",
                "-A IL_OUTPUT -m owner --uid-owner 1337 -j RETURN",
                "-A IL_OUTPUT ! -d ::1/128 -o lo -p tcp -m tcp ! --dport 15008 -m owner --gid-owner 1337 -j REDIRECT --to-ports 15006",
                "-A IL_OUTPUT -m owner --gid-owner 1337 -j RETURN",
                "-A IL_OUTPUT -p tcp -m tcp --dport 53 -j REDIRECT --to-ports 15053",
                "-A IL_OUTPUT -p udp -m udp --dport 53 -j REDIRECT --to-ports 15053",
                "-A IL_OUTPUT -p udp -j RETURN",
                "-A IL_OUTPUT -j IL_OUT_PORTS",
            ]
        );
        assert!(
            v6.contains(&"-A IL_DROP_INVALID -m conntrack --ctstate INVALID -j DROP".to_string())
        );
        assert!(v6.contains(
            &"-A IL_DNS_OUT -p udp -m udp --sport 15053 -m owner --uid-owner 1337 -j CT --zone 2"
                .to_string()
        ));
        assert!(v6.contains(&"-A IL_DNS_IN -p udp -m udp --sport 53 -j CT --zone 1".to_string()));
        let j: Vec<String> = jumps(&s, Family::V4)
            .iter()
            .map(|j| format!("{} {} {}", j.table.name(), j.builtin, j.rule))
            .collect();
        assert_eq!(
            j,
            vec![
                "nat PREROUTING -p tcp -j IL_INBOUND",
                "nat OUTPUT -p tcp -j IL_OUTPUT",
                "nat OUTPUT -p udp -j IL_OUTPUT",
                "raw OUTPUT -j IL_DNS_OUT",
                "raw PREROUTING -j IL_DNS_IN",
                "mangle PREROUTING -j IL_DROP_INVALID",
            ]
        );
        // The saved form compares exact; a restore installs it table by table.
        let exp = chain_rules(&s, Family::V4);
        let jumps = jumps(&s, Family::V4);
        assert!(compare(
            Family::V4,
            &exp,
            &jumps,
            &parse_save(&save_of(&s, Family::V4))
        )
        .is_empty());
        let text = restore_text(&s, Family::V4);
        for section in ["*nat\n", "*mangle\n", "*raw\n"] {
            assert!(text.contains(section), "{text}");
        }
        // Inserted in reverse so the UDP jump ends up second.
        let tcp = text.find("-I OUTPUT 1 -p tcp -j IL_OUTPUT").unwrap();
        let udp = text.find("-I OUTPUT 1 -p udp -j IL_OUTPUT").unwrap();
        assert!(udp < tcp, "{text}");
    }

    /// A spec that no longer needs a table has its chains and jumps there removed.
    #[test]
    fn tables_a_spec_no_longer_needs_are_emptied() {
        let before = istio_with_dns();
        let after = istio_like();
        let obs = parse_save(&save_of(&before, Family::V4));
        let d = compare(
            Family::V4,
            &chain_rules(&after, Family::V4),
            &jumps(&after, Family::V4),
            &obs,
        );
        assert!(
            d.iter()
                .any(|d| d.contains("unexpected chain IL_DNS_OUT in table raw")),
            "{d:?}"
        );
        let text = render_restore(
            &obs,
            &chain_rules(&after, Family::V4),
            &jumps(&after, Family::V4),
        );
        assert!(text.contains("*raw\n:IL_DNS_OUT - [0:0]\n:IL_DNS_IN - [0:0]\n-D OUTPUT -j IL_DNS_OUT\n-D PREROUTING -j IL_DNS_IN\n-X IL_DNS_OUT\n-X IL_DNS_IN\nCOMMIT\n"), "{text}");
        assert!(
            text.contains("-D PREROUTING -j IL_DROP_INVALID\n-X IL_DROP_INVALID\n"),
            "{text}"
        );
        assert!(!text.contains("-X IL_OUTPUT"), "{text}");
    }
}

/// The rendered rules, interpreted like the kernel walks them, must decide exactly as the
/// spec's own semantics ([`RedirectSpec::outbound`] / [`RedirectSpec::inbound`]).
#[cfg(test)]
mod semantics {
    use super::*;
    use crate::backend::semantics_testing::{landing_port, spec};
    use crate::spec::{OutboundFlow, Transport};
    use ipnet::IpNet;
    use proptest::prelude::*;
    use std::net::IpAddr;

    struct Packet<'a> {
        uid: u32,
        gid: u32,
        iface: &'a str,
        src: IpAddr,
        dst: IpAddr,
        udp: bool,
        port: u16,
    }

    enum Verdict {
        Redirect(u16),
        Return,
        Jump(&'static str),
    }

    fn ports_match(spec: &str, port: u16) -> bool {
        spec.split(',').any(|item| {
            let (lo, hi) = item.split_once(':').unwrap_or((item, item));
            (lo.parse::<u16>().unwrap()..=hi.parse::<u16>().unwrap()).contains(&port)
        })
    }

    /// Evaluates one nat rule's matches; `None` when it does not match.
    fn matches(rule: &str, p: &Packet, inbound: bool) -> Option<Verdict> {
        let t: Vec<&str> = rule.split_whitespace().collect();
        let mut i = 0;
        let mut verdict = None;
        let mut negate = false;
        while i < t.len() {
            let ok = |m: bool, negate: &mut bool| {
                let r = m != *negate;
                *negate = false;
                r
            };
            match t[i] {
                "!" => {
                    negate = true;
                    i += 1;
                    continue;
                }
                "-i" | "-o" => {
                    let m = t[i + 1] == p.iface && (t[i] == "-i") == inbound;
                    if !ok(m, &mut negate) {
                        return None;
                    }
                    i += 2;
                }
                "-p" => {
                    let m = (t[i + 1] == "udp") == p.udp;
                    if !ok(m, &mut negate) {
                        return None;
                    }
                    i += 2;
                }
                "-m" => i += 2,
                "--uid-owner" | "--gid-owner" => {
                    let id = if t[i] == "--uid-owner" { p.uid } else { p.gid };
                    if !ok(t[i + 1].parse::<u32>().unwrap() == id, &mut negate) {
                        return None;
                    }
                    i += 2;
                }
                "--dport" | "--dports" => {
                    if !ok(ports_match(t[i + 1], p.port), &mut negate) {
                        return None;
                    }
                    i += 2;
                }
                "-d" | "-s" => {
                    let addr = if t[i] == "-d" { p.dst } else { p.src };
                    if !ok(
                        t[i + 1].parse::<IpNet>().unwrap().contains(&addr),
                        &mut negate,
                    ) {
                        return None;
                    }
                    i += 2;
                }
                "-j" => {
                    verdict = Some(match t[i + 1] {
                        "RETURN" => Verdict::Return,
                        "REDIRECT" => Verdict::Redirect(t[i + 3].parse().unwrap()),
                        c => Verdict::Jump(Table::of_chain(c).unwrap().1),
                    });
                    i += 2;
                    if matches!(verdict, Some(Verdict::Redirect(_))) {
                        i += 2;
                    }
                }
                other => panic!("unknown token {other} in {rule}"),
            }
        }
        verdict
    }

    /// Walks `chain` with jump/return semantics; `Some(port)` when redirected.
    fn walk(rules: &[ChainRule], chain: &str, p: &Packet, inbound: bool) -> Option<u16> {
        for r in rules.iter().filter(|r| r.chain == chain) {
            match matches(&r.rule, p, inbound) {
                None => {}
                Some(Verdict::Return) => return None,
                Some(Verdict::Redirect(port)) => return Some(port),
                Some(Verdict::Jump(c)) => {
                    if let Some(port) = walk(rules, c, p, inbound) {
                        return Some(port);
                    }
                }
            }
        }
        None
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn rendered_rules_match_the_spec_semantics(
            spec in spec(),
            uid in 0u32..6,
            gid in 0u32..5,
            udp in any::<bool>(),
            iface in proptest::sample::select(vec!["lo", "eth0", "eth1", "net1"]),
            src in proptest::sample::select(vec![None, Some("127.0.0.6"), Some("::6"), Some("10.1.2.3"), Some("fd00:1::9")]),
            dst in proptest::sample::select(vec!["10.1.2.3", "10.1.9.9", "10.200.0.1", "192.168.0.1", "127.0.0.1", "127.0.0.6", "fd00:1::5", "fd00:2::5", "2001:db8::1", "::1", "::6"]),
            port in prop_oneof![1u16..12, Just(53), Just(15008)],
        ) {
            let dst: IpAddr = dst.parse().unwrap();
            let family = Family::of(&dst);
            let src: Option<IpAddr> = src.map(|s| s.parse().unwrap()).filter(|s| Family::of(s) == family);
            let rules = chain_rules(&spec, family);
            let jumps = jumps(&spec, family);
            let p = Packet {
                uid,
                gid,
                iface,
                // An unbound socket's source, as the rules see it: not the passthrough one.
                src: src.unwrap_or(match family {
                    Family::V4 => "10.255.0.1".parse().unwrap(),
                    Family::V6 => "fd00:ff::1".parse().unwrap(),
                }),
                dst,
                udp,
                port,
            };
            // Outbound: the built-in OUTPUT jumps (TCP; UDP with DNS) lead to IL_OUTPUT.
            let proto = if udp { "-p udp -j IL_OUTPUT" } else { "-p tcp -j IL_OUTPUT" };
            let reaches = jumps.iter().any(|j| j.table == Table::Nat && j.builtin == "OUTPUT" && j.rule == proto);
            let out = if reaches { walk(&rules, CHAIN_OUTPUT, &p, false) } else { None };
            let want = spec.outbound(&OutboundFlow {
                uid,
                gid,
                out_if: iface,
                src,
                dst,
                transport: if udp { Transport::Udp } else { Transport::Tcp },
                port,
            });
            prop_assert_eq!(out, landing_port(&spec, want), "{:?} rules {:#?}", want, rules);
            // Inbound: PREROUTING never sees loopback traffic; TCP only.
            if iface != "lo" && !udp {
                let enabled = spec.families().contains(&family);
                let p = Packet { src: dst, ..p };
                let inb = if enabled { walk(&rules, CHAIN_INBOUND, &p, true) } else { None };
                prop_assert_eq!(inb, landing_port(&spec, spec.inbound(iface, dst, port)));
            }
        }
    }
}

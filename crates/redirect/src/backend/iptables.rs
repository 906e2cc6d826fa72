//! The iptables backend: `iptables-restore --noflush` (and `ip6tables-restore`), one call
//! per address family, legacy or nft flavour.
//!
//! interlock owns three chains in the `nat` table of the pod's netns — [`CHAIN_INBOUND`],
//! [`CHAIN_OUTPUT`] and [`CHAIN_OUT_PORTS`] — jumped to by the first rule of `PREROUTING`
//! and `OUTPUT` (TCP only). Apply reads the table (`iptables-save -t nat`; skipped when
//! the netns has no nat table of the flavour, as a fresh pod's has not), does nothing
//! when exactly the expected rules are there, and otherwise replaces interlock's chains
//! and jumps in one restore transaction per family (declaring a chain in `--noflush` mode
//! flushes it; stale jumps are deleted by their saved text). Rules are written exactly as
//! `iptables-save` prints them, so verification is a line-by-line comparison.

use std::io::Write;
use std::process::{Command, Stdio};

use interlock_contract::codes::Step;

use crate::backend::{Backend, BackendError, BackendKind, ToolLookup, Verification};
use crate::spec::{port_runs, Family, PortSelection, RedirectSpec};

/// Chain for inbound capture, jumped to from `PREROUTING`.
pub const CHAIN_INBOUND: &str = "IL_INBOUND";
/// Chain for outbound exemptions and destination selection, jumped to from `OUTPUT`.
pub const CHAIN_OUTPUT: &str = "IL_OUTPUT";
/// Chain for outbound port selection and the redirect itself.
pub const CHAIN_OUT_PORTS: &str = "IL_OUT_PORTS";
/// interlock's chains, in declaration order.
pub const CHAINS: [&str; 3] = [CHAIN_INBOUND, CHAIN_OUTPUT, CHAIN_OUT_PORTS];
/// The jump rules (builtin chain, rule text after `-A <chain> `).
pub const JUMPS: [(&str, &str); 2] = [
    ("PREROUTING", "-p tcp -j IL_INBOUND"),
    ("OUTPUT", "-p tcp -j IL_OUTPUT"),
];

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

fn dport(run: &std::ops::RangeInclusive<u16>) -> String {
    if run.start() == run.end() {
        format!("-p tcp -m tcp --dport {}", run.start())
    } else {
        format!("-p tcp -m tcp --dport {}:{}", run.start(), run.end())
    }
}

/// The rules of interlock's chains for one family, in order (the semantics documented in
/// [`crate::spec`]). Empty when the spec does not enable `family`.
pub fn chain_rules(spec: &RedirectSpec, family: Family) -> Vec<ChainRule> {
    let mut out = Vec::new();
    if !spec.families().contains(&family) {
        return out;
    }
    let mut push = |chain: &'static str, rule: String| out.push(ChainRule { chain, rule });

    // Inbound.
    for iface in &spec.exclude_interfaces {
        push(CHAIN_INBOUND, format!("-i {iface} -j RETURN"));
    }
    for run in port_runs(&spec.inbound.exclude_ports) {
        push(CHAIN_INBOUND, format!("{} -j RETURN", dport(&run)));
    }
    let in_redirect = format!("-j REDIRECT --to-ports {}", spec.inbound.proxy_port);
    match &spec.inbound.include_ports {
        PortSelection::All => push(CHAIN_INBOUND, format!("-p tcp {in_redirect}")),
        PortSelection::Only(list) => {
            for run in port_runs(list) {
                push(CHAIN_INBOUND, format!("{} {in_redirect}", dport(&run)));
            }
        }
    }

    // Outbound exemptions.
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
    for iface in &spec.exclude_interfaces {
        push(CHAIN_OUTPUT, format!("-o {iface} -j RETURN"));
    }
    for run in port_runs(&spec.outbound.exclude_ports) {
        push(CHAIN_OUTPUT, format!("{} -j RETURN", dport(&run)));
    }
    for net in spec.exclude_cidrs(family) {
        push(CHAIN_OUTPUT, format!("-d {net} -j RETURN"));
    }
    // Destination selection.
    if spec.outbound.include_cidrs.is_empty() {
        push(CHAIN_OUTPUT, format!("-j {CHAIN_OUT_PORTS}"));
    } else {
        for net in spec.include_cidrs(family) {
            push(CHAIN_OUTPUT, format!("-d {net} -j {CHAIN_OUT_PORTS}"));
        }
    }
    // Port selection and redirect.
    let out_redirect = format!("-j REDIRECT --to-ports {}", spec.outbound.proxy_port);
    match &spec.outbound.include_ports {
        PortSelection::All => push(CHAIN_OUT_PORTS, format!("-p tcp {out_redirect}")),
        PortSelection::Only(list) => {
            for run in port_runs(list) {
                push(CHAIN_OUT_PORTS, format!("{} {out_redirect}", dport(&run)));
            }
        }
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
    render_restore(&[], &chain_rules(spec, family))
}

fn render_restore(stale_jumps: &[(String, String)], rules: &[ChainRule]) -> String {
    let mut s = String::from("*nat\n");
    for c in CHAINS {
        s.push_str(&format!(":{c} - [0:0]\n"));
    }
    for (chain, rule) in stale_jumps {
        s.push_str(&format!("-D {chain} {rule}\n"));
    }
    for (chain, rule) in JUMPS {
        s.push_str(&format!("-I {chain} 1 {rule}\n"));
    }
    for r in rules {
        s.push_str(&format!("-A {} {}\n", r.chain, r.rule));
    }
    s.push_str("COMMIT\n");
    s
}

/// One `iptables` argv per rule (program first) that installs `spec` for `family` in a
/// fresh netns: create the chains, append the rules, insert the jumps (the "one call per
/// rule" baseline).
pub fn rule_argvs(spec: &RedirectSpec, family: Family, flavour: Flavour) -> Vec<Vec<String>> {
    if !spec.families().contains(&family) {
        return Vec::new();
    }
    let prog = flavour.tool(family, Tool::Iptables);
    let base = |args: Vec<String>| -> Vec<String> {
        let mut v = vec![
            prog.clone(),
            "-w".into(),
            "5".into(),
            "-t".into(),
            "nat".into(),
        ];
        v.extend(args);
        v
    };
    let words = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
    let mut out = Vec::new();
    for c in CHAINS {
        out.push(base(vec!["-N".into(), c.into()]));
    }
    for r in chain_rules(spec, family) {
        let mut args = vec!["-A".into(), r.chain.into()];
        args.extend(words(&r.rule));
        out.push(base(args));
    }
    for (chain, rule) in JUMPS {
        let mut args = vec!["-I".into(), chain.into(), "1".into()];
        args.extend(words(rule));
        out.push(base(args));
    }
    out
}

/// What `iptables-save -t nat` shows of interlock.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Observed {
    /// interlock chains declared.
    chains: Vec<String>,
    /// Rules per interlock chain, in order.
    rules: Vec<ChainRule>,
    /// Every rule of PREROUTING / OUTPUT that jumps to an interlock chain, with its
    /// position in that builtin chain.
    jumps: Vec<(String, String, usize)>,
}

impl Observed {
    fn is_empty(&self) -> bool {
        self.chains.is_empty() && self.rules.is_empty() && self.jumps.is_empty()
    }
}

fn parse_save(text: &str) -> Observed {
    let mut obs = Observed::default();
    let mut in_nat = false;
    let mut positions: std::collections::HashMap<String, usize> = Default::default();
    for line in text.lines() {
        let line = line.trim_end();
        if let Some(t) = line.strip_prefix('*') {
            in_nat = t == "nat";
            continue;
        }
        if !in_nat {
            continue;
        }
        if let Some(decl) = line.strip_prefix(':') {
            let name = decl.split_whitespace().next().unwrap_or("");
            if let Some(c) = CHAINS.iter().find(|c| **c == name) {
                obs.chains.push(c.to_string());
            }
        } else if let Some(rest) = line.strip_prefix("-A ") {
            let (chain, rule) = rest.split_once(' ').unwrap_or((rest, ""));
            let pos = positions.entry(chain.to_string()).or_insert(0);
            let index = *pos;
            *pos += 1;
            if let Some(c) = CHAINS.iter().find(|c| **c == chain) {
                obs.rules.push(ChainRule {
                    chain: c,
                    rule: rule.to_string(),
                });
            } else if (chain == "PREROUTING" || chain == "OUTPUT")
                && CHAINS.iter().any(|c| {
                    rule.split_whitespace()
                        .collect::<Vec<_>>()
                        .windows(2)
                        .any(|w| w[0] == "-j" && w[1] == *c)
                })
            {
                obs.jumps.push((chain.to_string(), rule.to_string(), index));
            }
        }
    }
    obs
}

/// Compares what is there with what `expected` (the family's rules; empty = family off)
/// needs; every difference in words.
fn compare(family: Family, expected: &[ChainRule], obs: &Observed) -> Vec<String> {
    let mut diffs = Vec::new();
    if expected.is_empty() {
        // Family disabled: nothing of interlock may be present.
        for c in &obs.chains {
            diffs.push(format!(
                "{family}: unexpected chain {c} (family not enabled)"
            ));
        }
        for (chain, rule, _) in &obs.jumps {
            diffs.push(format!(
                "{family}: unexpected rule -A {chain} {rule} (family not enabled)"
            ));
        }
        return diffs;
    }
    for c in CHAINS {
        if !obs.chains.iter().any(|o| o == c) {
            diffs.push(format!("{family}: chain {c} missing"));
        }
    }
    for c in CHAINS {
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
    for (chain, rule) in JUMPS {
        let matching: Vec<usize> = obs
            .jumps
            .iter()
            .filter(|(c, r, _)| c == chain && r == rule)
            .map(|(_, _, i)| *i)
            .collect();
        match matching.as_slice() {
            [] => diffs.push(format!("{family}: missing rule -A {chain} {rule}")),
            [0] => {}
            [i] => diffs.push(format!(
                "{family}: rule -A {chain} {rule} is at position {} instead of first",
                i + 1
            )),
            _ => diffs.push(format!("{family}: rule -A {chain} {rule} is duplicated")),
        }
    }
    for (chain, rule, _) in &obs.jumps {
        if !JUMPS.iter().any(|(c, r)| c == chain && r == rule) {
            diffs.push(format!("{family}: unexpected rule -A {chain} {rule}"));
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
        let nat_exists = match self.flavour {
            Flavour::Legacy => legacy_nat_exists(family),
            Flavour::Nft => nft_nat_exists(family),
        };
        if !nat_exists {
            // No nat table of this flavour in this netns (a fresh pod's, for one): nothing
            // of ours, and no need to start a process (which, for legacy, would also
            // instantiate the table).
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
        let out = match Command::new(&program)
            .args(["-t", "nat"])
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
                command: format!("{tool} -t nat ({family})"),
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
        let mut s = String::from("*nat\n");
        for c in CHAINS {
            s.push_str(&format!(":{c} - [0:0]\n"));
        }
        for (chain, rule, _) in &obs.jumps {
            s.push_str(&format!("-D {chain} {rule}\n"));
        }
        for c in CHAINS {
            s.push_str(&format!("-X {c}\n"));
        }
        s.push_str("COMMIT\n");
        self.restore(family, op, &s)
    }
}

const FAMILIES: [Family; 2] = [Family::V4, Family::V6];

/// Whether the legacy (x_tables) nat table exists in the calling thread's netns. `true`
/// when that cannot be read, so the caller falls back to asking the tool.
fn legacy_nat_exists(family: Family) -> bool {
    let file = match family {
        Family::V4 => "/proc/thread-self/net/ip_tables_names",
        Family::V6 => "/proc/thread-self/net/ip6_tables_names",
    };
    match std::fs::read_to_string(file) {
        Ok(names) => names.lines().any(|l| l.trim() == "nat"),
        Err(_) => true,
    }
}

/// Whether the nf_tables `nat` table that iptables-nft uses for `family` exists in the
/// calling thread's netns, asked in-process over netlink (tens of µs, against a few ms for
/// `iptables-nft-save`). `true` when that cannot be asked, so the caller falls back to
/// the tool.
fn nft_nat_exists(family: Family) -> bool {
    let nft_family = match family {
        Family::V4 => interlock_nft::Family::Ip,
        Family::V6 => interlock_nft::Family::Ip6,
    };
    match interlock_nft::Nft::open().and_then(|mut nft| nft.table(nft_family, "nat")) {
        Ok(table) => table.is_some(),
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
            let obs = self.save(family, Step::Apply)?;
            if compare(family, &expected, &obs).is_empty() {
                continue;
            }
            let stale: Vec<(String, String)> =
                obs.jumps.into_iter().map(|(c, r, _)| (c, r)).collect();
            self.restore(family, Step::Apply, &render_restore(&stale, &expected))?;
        }
        Ok(())
    }

    fn verify(&self, spec: &RedirectSpec) -> Result<Verification, BackendError> {
        let mut diffs = Vec::new();
        for family in FAMILIES {
            let expected = chain_rules(spec, family);
            let obs = match self.save(family, Step::Verify) {
                Ok(o) => o,
                // A family that is off may have no usable tooling at all.
                Err(_) if expected.is_empty() => continue,
                Err(e) => return Err(e),
            };
            diffs.extend(compare(family, &expected, &obs));
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
            ["-I", "OUTPUT", "1", "-p", "tcp", "-j", "IL_OUTPUT"]
        );
    }

    fn save_of(spec: &RedirectSpec, family: Family) -> String {
        let mut s = String::from("# Generated\n*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n");
        for c in CHAINS {
            s.push_str(&format!(":{c} - [0:0]\n"));
        }
        for (c, r) in JUMPS {
            s.push_str(&format!("-A {c} {r}\n"));
        }
        for r in rules(spec, family) {
            s.push_str(&r);
            s.push('\n');
        }
        s.push_str("COMMIT\n");
        s
    }

    #[test]
    fn compare_finds_exact_missing_extra_and_order() {
        let s = istio_like();
        let exp = chain_rules(&s, Family::V4);
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
            vec!["IPv4: rule -A OUTPUT -p tcp -j IL_OUTPUT is at position 2 instead of first"]
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
        let d = compare(Family::V6, &[], &parse_save(&good));
        assert_eq!(d.len(), 5, "{d:?}");
        assert!(compare(Family::V6, &[], &parse_save(no_chain)).is_empty());
    }
}

/// The rendered rules, interpreted like the kernel walks them, must decide exactly as the
/// spec's own semantics ([`RedirectSpec::captures_outbound`] / `captures_inbound`).
#[cfg(test)]
mod semantics {
    use super::*;
    use crate::spec::{InboundCapture, OutboundCapture};
    use ipnet::IpNet;
    use proptest::prelude::*;
    use std::net::IpAddr;

    struct Packet<'a> {
        uid: u32,
        gid: u32,
        iface: &'a str,
        dst: IpAddr,
        port: u16,
    }

    enum Verdict {
        Redirect(u16),
        Return,
        Jump(&'static str),
    }

    /// Evaluates one rule's matches; `None` when it does not match.
    fn matches(rule: &str, p: &Packet, inbound: bool) -> Option<Verdict> {
        let t: Vec<&str> = rule.split_whitespace().collect();
        let mut i = 0;
        let mut verdict = None;
        while i < t.len() {
            match t[i] {
                "-i" | "-o" => {
                    if t[i + 1] != p.iface || (t[i] == "-i") != inbound {
                        return None;
                    }
                    i += 2;
                }
                "-p" | "-m" => i += 2,
                "--uid-owner" => {
                    if t[i + 1].parse::<u32>().unwrap() != p.uid {
                        return None;
                    }
                    i += 2;
                }
                "--gid-owner" => {
                    if t[i + 1].parse::<u32>().unwrap() != p.gid {
                        return None;
                    }
                    i += 2;
                }
                "--dport" => {
                    let (lo, hi) = t[i + 1].split_once(':').unwrap_or((t[i + 1], t[i + 1]));
                    if !(lo.parse::<u16>().unwrap()..=hi.parse::<u16>().unwrap()).contains(&p.port)
                    {
                        return None;
                    }
                    i += 2;
                }
                "-d" => {
                    if !t[i + 1].parse::<IpNet>().unwrap().contains(&p.dst) {
                        return None;
                    }
                    i += 2;
                }
                "-j" => {
                    verdict = Some(match t[i + 1] {
                        "RETURN" => Verdict::Return,
                        "REDIRECT" => Verdict::Redirect(t[i + 3].parse().unwrap()),
                        c => Verdict::Jump(CHAINS.iter().find(|x| **x == c).unwrap()),
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

    fn ports() -> impl Strategy<Value = Vec<u16>> {
        proptest::collection::vec(1u16..12, 0..4)
    }

    fn selection() -> impl Strategy<Value = PortSelection> {
        prop_oneof![
            Just(PortSelection::All),
            ports().prop_map(PortSelection::Only)
        ]
    }

    fn nets() -> impl Strategy<Value = Vec<IpNet>> {
        let pool: Vec<IpNet> = [
            "10.0.0.0/8",
            "10.1.0.0/16",
            "10.1.2.3/32",
            "fd00::/8",
            "fd00:1::/32",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        proptest::sample::subsequence(pool, 0..3)
    }

    fn spec() -> impl Strategy<Value = RedirectSpec> {
        (
            (
                1u32..4,
                proptest::option::of(1u32..4),
                any::<bool>(),
                any::<bool>(),
            ),
            (selection(), ports(), selection(), ports()),
            (
                nets(),
                nets(),
                proptest::sample::subsequence(vec!["eth1", "net1"], 0..2),
            ),
        )
            .prop_filter_map(
                "one family",
                |((uid, gid, v4, v6), (ii, ie, oi, oe), (inc, exc, ifs))| {
                    (v4 || v6).then(|| RedirectSpec {
                        proxy_uid: uid,
                        proxy_gid: gid,
                        exempt_uids: vec![],
                        inbound: InboundCapture {
                            proxy_port: 15006,
                            include_ports: ii,
                            exclude_ports: ie,
                            exclude_sources: vec![],
                        },
                        outbound: OutboundCapture {
                            proxy_port: 15001,
                            include_ports: oi,
                            exclude_ports: oe,
                            include_cidrs: inc,
                            exclude_cidrs: exc,
                            any_destination_ports: vec![],
                        },
                        loopback: Default::default(),
                        dns: None,
                        drop_invalid: false,
                        exclude_interfaces: ifs.into_iter().map(String::from).collect(),
                        ipv4: v4,
                        ipv6: v6,
                    })
                },
            )
    }

    proptest! {
        #[test]
        fn rendered_rules_match_the_spec_semantics(
            spec in spec(),
            uid in 0u32..5,
            gid in 0u32..5,
            iface in proptest::sample::select(vec!["lo", "eth0", "eth1", "net1"]),
            dst in proptest::sample::select(vec!["10.1.2.3", "10.1.9.9", "10.200.0.1", "192.168.0.1", "fd00:1::5", "fd00:2::5", "2001:db8::1"]),
            port in 1u16..12,
        ) {
            let dst: IpAddr = dst.parse().unwrap();
            let family = Family::of(&dst);
            let rules = chain_rules(&spec, family);
            let p = Packet { uid, gid, iface, dst, port };
            let enabled = spec.families().contains(&family);
            // Outbound: the builtin jump is `-p tcp -j IL_OUTPUT` (present iff enabled).
            let out = if enabled { walk(&rules, CHAIN_OUTPUT, &p, false) } else { None };
            prop_assert_eq!(out.is_some(), spec.captures_outbound(uid, gid, iface, dst, port));
            if let Some(port) = out {
                prop_assert_eq!(port, 15001);
            }
            // Inbound: PREROUTING never sees loopback traffic.
            if iface != "lo" {
                let inb = if enabled { walk(&rules, CHAIN_INBOUND, &p, true) } else { None };
                prop_assert_eq!(inb.is_some(), enabled && spec.captures_inbound(iface, port));
            }
        }
    }
}

//! Tables, chains and the batch that carries them: every change goes into one
//! `NFNL_MSG_BATCH_BEGIN … END` transaction, which the kernel applies atomically or not
//! at all.

use std::fmt;

use crate::attr::{AttrWriter, Attrs};
use crate::rule::Rule;
use crate::sys::*;

/// An nf_tables address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// `inet`: IPv4 and IPv6 in one table (`NFPROTO_INET`).
    Inet,
    /// `ip` (`NFPROTO_IPV4`).
    Ip,
    /// `ip6` (`NFPROTO_IPV6`).
    Ip6,
}

impl Family {
    /// The `NFPROTO_*` number carried in `nfgenmsg.nfgen_family`.
    pub fn raw(self) -> u8 {
        match self {
            Family::Inet => 1,
            Family::Ip => 2,
            Family::Ip6 => 10,
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::Inet => "inet",
            Family::Ip => "ip",
            Family::Ip6 => "ip6",
        })
    }
}

/// A netfilter hook a base chain attaches to (`enum nf_inet_hooks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hook {
    /// `prerouting` (0).
    Prerouting,
    /// `input` (1).
    Input,
    /// `forward` (2).
    Forward,
    /// `output` (3).
    Output,
    /// `postrouting` (4).
    Postrouting,
}

impl Hook {
    /// The hook number.
    pub fn raw(self) -> u32 {
        match self {
            Hook::Prerouting => 0,
            Hook::Input => 1,
            Hook::Forward => 2,
            Hook::Output => 3,
            Hook::Postrouting => 4,
        }
    }

    /// The hook with number `n`.
    pub fn from_raw(n: u32) -> Option<Hook> {
        Some(match n {
            0 => Hook::Prerouting,
            1 => Hook::Input,
            2 => Hook::Forward,
            3 => Hook::Output,
            4 => Hook::Postrouting,
            _ => return None,
        })
    }
}

/// Chain type of a base chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChainType {
    /// `filter`.
    Filter,
    /// `nat` (only the first packet of a connection traverses it).
    Nat,
    /// `route`.
    Route,
}

impl ChainType {
    /// The name the kernel knows the type by.
    pub fn as_str(self) -> &'static str {
        match self {
            ChainType::Filter => "filter",
            ChainType::Nat => "nat",
            ChainType::Route => "route",
        }
    }

    /// The type named `s`.
    pub fn parse(s: &str) -> Option<ChainType> {
        Some(match s {
            "filter" => ChainType::Filter,
            "nat" => ChainType::Nat,
            "route" => ChainType::Route,
            _ => return None,
        })
    }
}

/// Default verdict of a base chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Policy {
    /// `policy accept`.
    Accept,
    /// `policy drop`.
    Drop,
}

impl Policy {
    /// The verdict code (`NF_ACCEPT` / `NF_DROP`).
    pub fn raw(self) -> u32 {
        match self {
            Policy::Accept => NF_ACCEPT as u32,
            Policy::Drop => NF_DROP as u32,
        }
    }

    /// The policy with verdict code `n`.
    pub fn from_raw(n: u32) -> Option<Policy> {
        match n as i32 {
            NF_ACCEPT => Some(Policy::Accept),
            NF_DROP => Some(Policy::Drop),
            _ => None,
        }
    }
}

/// How a base chain hooks into the stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BaseChain {
    /// `type filter|nat|route`.
    pub chain_type: ChainType,
    /// `hook …`.
    pub hook: Hook,
    /// `priority …` (lower runs first; `dstnat` is -100).
    pub priority: i32,
    /// `policy …`.
    pub policy: Policy,
}

/// A chain to create, or one read back from the kernel.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Chain {
    /// Chain name.
    pub name: String,
    /// `Some` for a base chain attached to a hook; `None` for a regular chain reached by
    /// jumps.
    pub base: Option<BaseChain>,
}

impl Chain {
    /// A regular chain (only reached by `jump`/`goto`).
    pub fn regular(name: impl Into<String>) -> Self {
        Chain {
            name: name.into(),
            base: None,
        }
    }

    /// A base chain with policy accept.
    pub fn base(name: impl Into<String>, chain_type: ChainType, hook: Hook, priority: i32) -> Self {
        Chain {
            name: name.into(),
            base: Some(BaseChain {
                chain_type,
                hook,
                priority,
                policy: Policy::Accept,
            }),
        }
    }
}

/// A table as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableInfo {
    /// Table name.
    pub name: String,
    /// Family.
    pub family: Family,
    /// `NFT_TABLE_F_*` flags (1 = dormant: its base chains are detached).
    pub flags: u32,
    /// Kernel handle.
    pub handle: u64,
    /// Number of chains, sets and other objects in it.
    pub use_count: u32,
}

/// `NFT_TABLE_F_DORMANT`: a dormant table's base chains see no packets.
pub const TABLE_F_DORMANT: u32 = 1;

/// Which batch messages ask the kernel for an acknowledgement (`NLM_F_ACK`). The kernel
/// reports every refused message whatever this says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ack {
    /// None (as `nft` sends them).
    None,
    /// Every message: one reply each, which for thousands of messages can overflow the
    /// socket's receive buffer.
    Each,
    /// Only the last message: one reply marks the end of the kernel's answer (what
    /// [`crate::Nft::commit`] uses).
    Last,
}

/// One message of a batch: where its header starts in `Batch::buf`. Its description
/// for errors is decoded from the message itself ([`Batch::describe`]), so building a
/// batch formats no text (a share of a meshed ADD's instructions otherwise).
#[derive(Debug, Clone)]
struct Entry {
    /// Offset of the message header in `Batch::buf`.
    offset: usize,
}

/// A transaction under construction: table, chain and rule messages the kernel will
/// apply all together or not at all.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    buf: Vec<u8>,
    entries: Vec<Entry>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Batch {
            buf: Vec::with_capacity(4096),
            entries: Vec::new(),
        }
    }

    /// Number of messages (without the begin/end markers).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when the batch holds no message.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The description of message `i` (0-based, without the begin marker), as `nft`
    /// would write the command: `add rule inet interlock outbound [il:out:3]`.
    pub fn describe(&self, i: usize) -> Option<String> {
        let start = self.entries.get(i)?.offset;
        let end = self.entries.get(i + 1).map_or(self.buf.len(), |e| e.offset);
        Some(describe_message(self.buf.get(start..end)?))
    }

    /// `add table <family> <name>`: creates the table, or leaves an existing one as is.
    pub fn add_table(&mut self, family: Family, name: &str) -> &mut Self {
        self.message(NFT_MSG_NEWTABLE, 0, family, |w| {
            w.string(NFTA_TABLE_NAME, name);
            w.be32(NFTA_TABLE_FLAGS, 0);
        })
    }

    /// `create table <family> <name>`: like [`Batch::add_table`] but the whole batch fails
    /// with `EEXIST` when the table already exists (`NLM_F_EXCL`).
    ///
    /// A batch that only creates objects is also cheaper to close out than one that
    /// deletes: after a deletion, closing any nf_tables netlink socket waits for the
    /// kernel's deferred destruction (an RCU grace period, milliseconds).
    pub fn create_table(&mut self, family: Family, name: &str) -> &mut Self {
        self.message(NFT_MSG_NEWTABLE, NLM_F_CREATE | NLM_F_EXCL, family, |w| {
            w.string(NFTA_TABLE_NAME, name);
            w.be32(NFTA_TABLE_FLAGS, 0);
        })
    }

    /// `delete table <family> <name>` with everything in it. Fails with `ENOENT` (and the
    /// whole batch with it) when the table does not exist: put [`Batch::add_table`] first
    /// to make it unconditional.
    pub fn delete_table(&mut self, family: Family, name: &str) -> &mut Self {
        self.message(NFT_MSG_DELTABLE, 0, family, |w| {
            w.string(NFTA_TABLE_NAME, name)
        })
    }

    /// `add chain <family> <table> <chain>` (with its hook for a base chain).
    pub fn add_chain(&mut self, family: Family, table: &str, chain: &Chain) -> &mut Self {
        self.message(NFT_MSG_NEWCHAIN, NLM_F_CREATE, family, |w| {
            w.string(NFTA_CHAIN_TABLE, table);
            w.string(NFTA_CHAIN_NAME, &chain.name);
            if let Some(base) = &chain.base {
                w.string(NFTA_CHAIN_TYPE, base.chain_type.as_str());
                w.be32(NFTA_CHAIN_POLICY, base.policy.raw());
                w.nested(NFTA_CHAIN_HOOK, |w| {
                    w.be32(NFTA_HOOK_HOOKNUM, base.hook.raw());
                    w.be32(NFTA_HOOK_PRIORITY, base.priority as u32);
                });
            }
        })
    }

    /// `add rule <family> <table> <rule.chain> …`, appended at the end of the chain.
    pub fn add_rule(&mut self, family: Family, table: &str, rule: &Rule) -> &mut Self {
        self.message(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, family, |w| {
            w.string(NFTA_RULE_TABLE, table);
            w.string(NFTA_RULE_CHAIN, &rule.chain);
            w.nested(NFTA_RULE_EXPRESSIONS, |w| {
                for e in &rule.exprs {
                    e.encode(w);
                }
            });
            if let Some(ud) = &rule.userdata {
                w.bytes(NFTA_RULE_USERDATA, ud);
            }
        })
    }

    fn message(
        &mut self,
        msg: u16,
        flags: u16,
        family: Family,
        body: impl FnOnce(&mut AttrWriter<'_>),
    ) -> &mut Self {
        let offset = self.buf.len();
        put_header(
            &mut self.buf,
            (NFNL_SUBSYS_NFTABLES << 8) | msg,
            NLM_F_REQUEST | flags,
            0,
            family.raw(),
            0,
        );
        body(&mut AttrWriter::new(&mut self.buf));
        finish_message(&mut self.buf, offset);
        self.entries.push(Entry { offset });
        self
    }

    /// The complete transaction as sent: begin marker with sequence number `first_seq`,
    /// message `i` with `first_seq + 1 + i` (with `NLM_F_ACK` as `ack` says), end marker
    /// last.
    pub fn encode(&self, first_seq: u32, ack: Ack) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.buf.len() + 40);
        put_header(
            &mut out,
            NFNL_MSG_BATCH_BEGIN,
            NLM_F_REQUEST,
            first_seq,
            0,
            NFNL_SUBSYS_NFTABLES,
        );
        finish_message(&mut out, 0);
        let base = out.len();
        out.extend_from_slice(&self.buf);
        for (i, e) in self.entries.iter().enumerate() {
            let at = base + e.offset;
            let seq = first_seq.wrapping_add(1 + i as u32);
            out[at + 8..at + 12].copy_from_slice(&seq.to_ne_bytes());
            let last = i + 1 == self.entries.len();
            if ack == Ack::Each || (ack == Ack::Last && last) {
                let flags = u16::from_ne_bytes([out[at + 6], out[at + 7]]) | NLM_F_ACK;
                out[at + 6..at + 8].copy_from_slice(&flags.to_ne_bytes());
            }
        }
        let end = out.len();
        put_header(
            &mut out,
            NFNL_MSG_BATCH_END,
            NLM_F_REQUEST,
            first_seq.wrapping_add(1 + self.entries.len() as u32),
            0,
            NFNL_SUBSYS_NFTABLES,
        );
        finish_message(&mut out, end);
        out
    }
}

/// `nft`'s words for one batch message (header, `nfgenmsg`, attributes) that this module
/// wrote: `create table inet interlock`, `add chain inet interlock output`,
/// `add rule inet interlock outbound [il:outbound:3]`.
fn describe_message(msg: &[u8]) -> String {
    let header = NLMSG_HDRLEN + 4;
    let (Some(ty), Some(flags), Some(&family)) = (
        msg.get(4..6)
            .map(|b| u16::from_ne_bytes([b[0], b[1]]) & 0xff),
        msg.get(6..8).map(|b| u16::from_ne_bytes([b[0], b[1]])),
        msg.get(NLMSG_HDRLEN),
    ) else {
        return "a truncated batch message".into();
    };
    let family = match family {
        1 => "inet",
        2 => "ip",
        10 => "ip6",
        _ => "family?",
    };
    let (mut table, mut name, mut tag) = (String::new(), String::new(), None);
    for a in Attrs::new(msg.get(header..).unwrap_or(&[])).flatten() {
        match (ty, a.ty) {
            (NFT_MSG_NEWTABLE | NFT_MSG_DELTABLE, NFTA_TABLE_NAME)
            | (NFT_MSG_NEWCHAIN, NFTA_CHAIN_TABLE)
            | (NFT_MSG_NEWRULE, NFTA_RULE_TABLE) => table = a.string().unwrap_or_default(),
            (NFT_MSG_NEWCHAIN, NFTA_CHAIN_NAME) | (NFT_MSG_NEWRULE, NFTA_RULE_CHAIN) => {
                name = a.string().unwrap_or_default()
            }
            (NFT_MSG_NEWRULE, NFTA_RULE_USERDATA) => {
                let mut rule = Rule::new(String::new());
                rule.userdata = Some(a.data.to_vec());
                tag = rule.tag_str().map(str::to_owned);
            }
            _ => {}
        }
    }
    match ty {
        NFT_MSG_NEWTABLE if flags & NLM_F_EXCL != 0 => format!("create table {family} {table}"),
        NFT_MSG_NEWTABLE => format!("add table {family} {table}"),
        NFT_MSG_DELTABLE => format!("delete table {family} {table}"),
        NFT_MSG_NEWCHAIN => format!("add chain {family} {table} {name}"),
        NFT_MSG_NEWRULE => match tag {
            Some(t) => format!("add rule {family} {table} {name} [{t}]"),
            None => format!("add rule {family} {table} {name}"),
        },
        other => format!("nf_tables message {other} in {family} {table}"),
    }
}

/// Writes `nlmsghdr` (length patched later) and `nfgenmsg`.
pub(crate) fn put_header(
    buf: &mut Vec<u8>,
    ty: u16,
    flags: u16,
    seq: u32,
    family: u8,
    res_id: u16,
) {
    buf.extend_from_slice(&0u32.to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    buf.push(family);
    buf.push(NFNETLINK_V0);
    buf.extend_from_slice(&res_id.to_be_bytes());
}

/// Patches `nlmsg_len` of the message starting at `start`.
pub(crate) fn finish_message(buf: &mut [u8], start: usize) {
    let len = (buf.len() - start) as u32;
    buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_message_is_described_in_nfts_words_from_its_bytes() {
        let rule = Rule::new("outbound".to_string()).tag("il:outbound:3");
        let mut untagged = Rule::new("inbound".to_string());
        untagged.userdata = None;
        let mut b = Batch::new();
        b.create_table(Family::Inet, "interlock")
            .add_table(Family::Ip6, "t6")
            .add_chain(
                Family::Inet,
                "interlock",
                &Chain::base("output", ChainType::Nat, Hook::Output, -100),
            )
            .add_chain(Family::Inet, "interlock", &Chain::regular("outbound"))
            .add_rule(Family::Inet, "interlock", &rule)
            .add_rule(Family::Ip, "interlock", &untagged)
            .delete_table(Family::Inet, "interlock");
        let all: Vec<String> = (0..b.len()).filter_map(|i| b.describe(i)).collect();
        assert_eq!(
            all,
            [
                "create table inet interlock",
                "add table ip6 t6",
                "add chain inet interlock output",
                "add chain inet interlock outbound",
                "add rule inet interlock outbound [il:outbound:3]",
                "add rule ip interlock inbound",
                "delete table inet interlock",
            ]
        );
        assert_eq!(b.describe(b.len()), None);
    }
}

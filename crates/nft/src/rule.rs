//! Rules: a chain, an ordered expression list and an optional tag, with builders for the
//! matches and actions a redirection needs. The builders emit the same expressions `nft`
//! generates for the equivalent rule text, so `nft list ruleset` shows ordinary syntax.

use std::net::IpAddr;

use crate::expr::{
    CmpOp, CtKey, Expr, ImmediateData, MetaKey, PayloadBase, RangeOp, Register, Verdict,
};
use crate::sys::NF_NAT_RANGE_PROTO_SPECIFIED;

/// Layer-4 protocol number of TCP.
pub const IPPROTO_TCP: u8 = 6;
/// Layer-4 protocol number of UDP.
pub const IPPROTO_UDP: u8 = 17;
/// `NFPROTO_IPV4`, as `meta nfproto` reports it.
pub const NFPROTO_IPV4: u8 = 2;
/// `NFPROTO_IPV6`, as `meta nfproto` reports it.
pub const NFPROTO_IPV6: u8 = 10;

/// Longest interface name the kernel stores (`IFNAMSIZ` without the NUL).
pub const IFNAME_MAX: usize = 15;

/// Userdata TLV type `nft` uses for a rule comment (`NFTNL_UDATA_RULE_COMMENT`).
const UDATA_RULE_COMMENT: u8 = 0;

/// The `invalid` bit of `ct state` (`NF_CT_STATE_INVALID_BIT`).
const CT_STATE_INVALID: u32 = 1;

/// Which address of the network header a match reads.
#[derive(Clone, Copy)]
enum Direction {
    Source,
    Destination,
}

/// A rule to add, or one read back from the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Chain the rule lives in.
    pub chain: String,
    /// Expressions, in order.
    pub exprs: Vec<Expr>,
    /// Raw `NFTA_RULE_USERDATA`.
    pub userdata: Option<Vec<u8>>,
    /// Kernel handle; only set on rules read back.
    pub handle: Option<u64>,
}

impl Rule {
    /// An empty rule for `chain`.
    pub fn new(chain: impl Into<String>) -> Self {
        Rule {
            chain: chain.into(),
            exprs: Vec::new(),
            userdata: None,
            handle: None,
        }
    }

    /// Tags the rule with `tag`, stored as the comment `nft list ruleset` shows
    /// (userdata TLV type 0, NUL terminated). At most 127 bytes.
    pub fn tag(mut self, tag: &str) -> Self {
        let len = (tag.len() + 1).min(255);
        let mut ud = Vec::with_capacity(2 + len);
        ud.push(UDATA_RULE_COMMENT);
        ud.push(len as u8);
        ud.extend_from_slice(&tag.as_bytes()[..len - 1]);
        ud.push(0);
        self.userdata = Some(ud);
        self
    }

    /// The tag (comment) stored in the userdata, if any.
    pub fn tag_str(&self) -> Option<&str> {
        let mut ud = self.userdata.as_deref()?;
        while ud.len() >= 2 {
            let (ty, len) = (ud[0], ud[1] as usize);
            let value = ud.get(2..2 + len)?;
            if ty == UDATA_RULE_COMMENT {
                let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
                return std::str::from_utf8(&value[..end]).ok();
            }
            ud = &ud[2 + len..];
        }
        None
    }

    /// Appends any expression.
    pub fn expr(mut self, e: Expr) -> Self {
        self.exprs.push(e);
        self
    }

    /// `meta <key> <op> <data>`.
    pub fn meta_cmp(self, key: MetaKey, op: CmpOp, data: &[u8]) -> Self {
        self.expr(Expr::Meta {
            key,
            dreg: Register::R1,
        })
        .expr(Expr::Cmp {
            sreg: Register::R1,
            op,
            data: data.to_vec(),
        })
    }

    /// `meta l4proto <proto>`.
    pub fn l4proto(self, proto: u8) -> Self {
        self.meta_cmp(MetaKey::L4Proto, CmpOp::Eq, &[proto])
    }

    /// `meta nfproto ipv4|ipv6` (use [`NFPROTO_IPV4`] / [`NFPROTO_IPV6`]).
    pub fn nfproto(self, nfproto: u8) -> Self {
        self.meta_cmp(MetaKey::NfProto, CmpOp::Eq, &[nfproto])
    }

    /// `meta skuid <uid>`.
    pub fn skuid(self, uid: u32) -> Self {
        self.meta_cmp(MetaKey::SkUid, CmpOp::Eq, &uid.to_ne_bytes())
    }

    /// `meta skgid <gid>`.
    pub fn skgid(self, gid: u32) -> Self {
        self.meta_cmp(MetaKey::SkGid, CmpOp::Eq, &gid.to_ne_bytes())
    }

    /// `iifname "<name>"` (exact match). Names longer than [`IFNAME_MAX`] never match
    /// a real interface; check them before building.
    pub fn iifname(self, name: &str) -> Self {
        self.meta_cmp(MetaKey::IifName, CmpOp::Eq, &ifname_bytes(name))
    }

    /// `oifname "<name>"` (exact match).
    pub fn oifname(self, name: &str) -> Self {
        self.meta_cmp(MetaKey::OifName, CmpOp::Eq, &ifname_bytes(name))
    }

    /// `ip daddr <net>/<prefix>` or `ip6 daddr <net>/<prefix>`, including the
    /// `meta nfproto` dependency an `inet` table needs. Host bits of `addr` are ignored.
    /// Like `nft`: a byte-aligned prefix loads only the prefix bytes, any other prefix
    /// loads the whole address and masks it; prefix 0 matches the family only.
    pub fn daddr(self, addr: IpAddr, prefix: u8) -> Self {
        self.addr_match(Direction::Destination, addr, prefix, CmpOp::Eq)
    }

    /// `ip saddr <net>/<prefix>` or `ip6 saddr <net>/<prefix>` (as [`Rule::daddr`]).
    pub fn saddr(self, addr: IpAddr, prefix: u8) -> Self {
        self.addr_match(Direction::Source, addr, prefix, CmpOp::Eq)
    }

    /// `ip daddr != <addr>` or `ip6 daddr != <addr>` (one host).
    pub fn daddr_not(self, addr: IpAddr) -> Self {
        let full = if addr.is_ipv4() { 32 } else { 128 };
        self.addr_match(Direction::Destination, addr, full, CmpOp::Neq)
    }

    fn addr_match(self, dir: Direction, addr: IpAddr, prefix: u8, op: CmpOp) -> Self {
        let (nfproto, offset, bytes): (u8, u32, Vec<u8>) = match (addr, dir) {
            (IpAddr::V4(a), Direction::Source) => (NFPROTO_IPV4, 12, a.octets().to_vec()),
            (IpAddr::V4(a), Direction::Destination) => (NFPROTO_IPV4, 16, a.octets().to_vec()),
            (IpAddr::V6(a), Direction::Source) => (NFPROTO_IPV6, 8, a.octets().to_vec()),
            (IpAddr::V6(a), Direction::Destination) => (NFPROTO_IPV6, 24, a.octets().to_vec()),
        };
        let full = bytes.len() * 8;
        let prefix = (prefix as usize).min(full);
        let mut rule = self.nfproto(nfproto);
        if prefix == 0 {
            return rule;
        }
        let mask: Vec<u8> = (0..bytes.len())
            .map(|i| {
                let bits = prefix.saturating_sub(i * 8).min(8);
                (0xffu16 << (8 - bits)) as u8
            })
            .collect();
        let net: Vec<u8> = bytes.iter().zip(&mask).map(|(b, m)| b & m).collect();
        if prefix % 8 == 0 {
            let n = prefix / 8;
            rule = rule.expr(Expr::Payload {
                base: PayloadBase::Network,
                offset,
                len: n as u32,
                dreg: Register::R1,
            });
            rule.expr(Expr::Cmp {
                sreg: Register::R1,
                op,
                data: net[..n].to_vec(),
            })
        } else {
            rule = rule
                .expr(Expr::Payload {
                    base: PayloadBase::Network,
                    offset,
                    len: bytes.len() as u32,
                    dreg: Register::R1,
                })
                .expr(Expr::Bitwise {
                    sreg: Register::R1,
                    dreg: Register::R1,
                    len: bytes.len() as u32,
                    mask,
                    xor: vec![0; bytes.len()],
                });
            rule.expr(Expr::Cmp {
                sreg: Register::R1,
                op,
                data: net,
            })
        }
    }

    /// Loads the transport destination port (TCP/UDP header offset 2) into register 1.
    /// Put an [`Rule::l4proto`] match before it.
    fn load_dport(self) -> Self {
        self.expr(Expr::Payload {
            base: PayloadBase::Transport,
            offset: 2,
            len: 2,
            dreg: Register::R1,
        })
    }

    /// `th sport <port>` (after an `l4proto` match this reads as `udp sport <port>`).
    pub fn sport(self, port: u16) -> Self {
        self.expr(Expr::Payload {
            base: PayloadBase::Transport,
            offset: 0,
            len: 2,
            dreg: Register::R1,
        })
        .expr(Expr::Cmp {
            sreg: Register::R1,
            op: CmpOp::Eq,
            data: port.to_be_bytes().to_vec(),
        })
    }

    /// `th dport != <p1> th dport != <p2> …`: one load, one comparison per port (no set).
    pub fn dport_not(self, ports: &[u16]) -> Self {
        ports.iter().fold(self.load_dport(), |r, p| {
            r.expr(Expr::Cmp {
                sreg: Register::R1,
                op: CmpOp::Neq,
                data: p.to_be_bytes().to_vec(),
            })
        })
    }

    /// `meta skuid != <uid>`.
    pub fn skuid_not(self, uid: u32) -> Self {
        self.meta_cmp(MetaKey::SkUid, CmpOp::Neq, &uid.to_ne_bytes())
    }

    /// `ct state invalid`.
    pub fn ct_state_invalid(self) -> Self {
        self.expr(Expr::Ct {
            key: CtKey::State,
            dreg: Some(Register::R1),
            sreg: None,
        })
        .expr(Expr::Bitwise {
            sreg: Register::R1,
            dreg: Register::R1,
            len: 4,
            mask: CT_STATE_INVALID.to_ne_bytes().to_vec(),
            xor: vec![0; 4],
        })
        .expr(Expr::Cmp {
            sreg: Register::R1,
            op: CmpOp::Neq,
            data: vec![0; 4],
        })
    }

    /// `ct zone set <zone>`.
    pub fn ct_zone_set(self, zone: u16) -> Self {
        self.expr(Expr::Immediate {
            dreg: Register::R1,
            data: ImmediateData::Value(zone.to_ne_bytes().to_vec()),
        })
        .expr(Expr::Ct {
            key: CtKey::Zone,
            dreg: None,
            sreg: Some(Register::R1),
        })
    }

    /// `th dport <port>` (after an `l4proto` match this reads as `tcp dport <port>`).
    pub fn dport(self, port: u16) -> Self {
        self.load_dport().expr(Expr::Cmp {
            sreg: Register::R1,
            op: CmpOp::Eq,
            data: port.to_be_bytes().to_vec(),
        })
    }

    /// `th dport <lo>-<hi>` (inclusive) as one `range` expression. (`nft` 1.0 writes a
    /// `cmp gte` and a `cmp lte`, which match the same ports and `nft list` shows the same
    /// way; one expression fewer costs the kernel one walk of its expression types fewer
    /// when the rule is added.)
    pub fn dport_range(self, lo: u16, hi: u16) -> Self {
        self.load_dport().expr(Expr::Range {
            sreg: Register::R1,
            op: RangeOp::Eq,
            from: lo.to_be_bytes().to_vec(),
            to: hi.to_be_bytes().to_vec(),
        })
    }

    /// `counter`.
    pub fn counter(self) -> Self {
        self.expr(Expr::Counter)
    }

    /// Ends the rule with a verdict (`return`, `accept`, `jump <chain>`, …).
    pub fn verdict(self, v: Verdict) -> Self {
        self.expr(Expr::Immediate {
            dreg: Register::VERDICT,
            data: ImmediateData::Verdict(v),
        })
    }

    /// `redirect to :<port>`: NAT to the local address of the interface (or loopback for
    /// locally generated traffic), port `port`. Needs an `l4proto` match before it.
    pub fn redirect_to_port(self, port: u16) -> Self {
        self.expr(Expr::Immediate {
            dreg: Register::R1,
            data: ImmediateData::Value(port.to_be_bytes().to_vec()),
        })
        .expr(Expr::Redir {
            reg_proto_min: Some(Register::R1),
            reg_proto_max: None,
            flags: NF_NAT_RANGE_PROTO_SPECIFIED,
        })
    }
}

/// An interface name as `meta iifname/oifname` holds it: 16 bytes, NUL padded.
fn ifname_bytes(name: &str) -> Vec<u8> {
    let mut b = [0u8; IFNAME_MAX + 1];
    let n = name.len().min(IFNAME_MAX);
    b[..n].copy_from_slice(&name.as_bytes()[..n]);
    b.to_vec()
}

impl std::fmt::Display for Rule {
    /// One line per expression, like `nft --debug=netlink`, headed by chain, tag, handle.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "chain {}", self.chain)?;
        if let Some(t) = self.tag_str() {
            write!(f, " [{t}]")?;
        }
        if let Some(h) = self.handle {
            write!(f, " handle {h}")?;
        }
        for e in &self.exprs {
            write!(f, "\n  {e}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_round_trips_through_the_comment_tlv() {
        let r = Rule::new("outbound").tag("il:out:0");
        assert_eq!(
            r.userdata.as_deref().unwrap(),
            b"\x00\x09il:out:0\x00".as_slice()
        );
        assert_eq!(r.tag_str(), Some("il:out:0"));
        assert_eq!(Rule::new("x").tag_str(), None);
    }

    #[test]
    fn non_byte_aligned_prefix_masks_the_whole_address() {
        let r = Rule::new("c").daddr("10.100.1.2".parse().unwrap(), 12);
        assert_eq!(
            r.exprs[3],
            Expr::Bitwise {
                sreg: Register::R1,
                dreg: Register::R1,
                len: 4,
                mask: vec![0xff, 0xf0, 0, 0],
                xor: vec![0; 4]
            }
        );
        assert_eq!(
            r.exprs[4],
            Expr::Cmp {
                sreg: Register::R1,
                op: CmpOp::Eq,
                data: vec![10, 96, 0, 0]
            }
        );
    }

    #[test]
    fn byte_aligned_prefix_loads_only_the_prefix_bytes() {
        let r = Rule::new("c").daddr("fd99:1::".parse().unwrap(), 64);
        assert_eq!(
            r.exprs[2],
            Expr::Payload {
                base: PayloadBase::Network,
                offset: 24,
                len: 8,
                dreg: Register::R1
            }
        );
        assert_eq!(r.exprs.len(), 4);
        let host = Rule::new("c").daddr("10.1.2.3".parse().unwrap(), 32);
        assert_eq!(host.exprs.len(), 4);
        let any = Rule::new("c").daddr("0.0.0.0".parse().unwrap(), 0);
        assert_eq!(any.exprs.len(), 2, "prefix 0 only matches the family");
    }
}

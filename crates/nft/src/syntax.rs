//! A rule's expressions in the words `nft list` prints them with (`tcp dport != 15001
//! meta skuid != 1337 redirect to :15001`), for people reading a difference: the raw
//! netlink form (`[ payload load 2b @ transport header + 2 => reg 1 ]`) is what the
//! kernel holds, not what an operator types or reads.
//!
//! Covers the expressions interlock writes and the usual matches around them; like
//! `nft`, a protocol match that only makes a header match possible (`meta l4proto tcp`
//! before `tcp dport`, `meta nfproto ipv4` before `ip daddr`) is left implicit. Anything
//! else is shown in the raw form, in brackets, so nothing is hidden.

use crate::expr::{CmpOp, CtKey, Expr, ImmediateData, MetaKey, PayloadBase, RangeOp, Register};
use std::net::{Ipv4Addr, Ipv6Addr};

/// `ct state` bits as `nft` names them.
const CT_STATES: [(u32, &str); 5] = [
    (1, "invalid"),
    (2, "established"),
    (4, "related"),
    (8, "new"),
    (64, "untracked"),
];

/// What register 1 holds.
#[derive(Debug, Clone, PartialEq)]
enum Loaded {
    Meta(MetaKey),
    Payload(PayloadBase, u32, u32),
    Ct(CtKey),
    Value(Vec<u8>),
}

fn op_word(op: CmpOp) -> &'static str {
    match op {
        CmpOp::Eq => "",
        CmpOp::Neq => "!= ",
        CmpOp::Lt => "< ",
        CmpOp::Lte => "<= ",
        CmpOp::Gt => "> ",
        CmpOp::Gte => ">= ",
    }
}

fn ne_u32(d: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(d.get(..4)?.try_into().ok()?))
}

fn be_u16(d: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(d.get(..2)?.try_into().ok()?))
}

fn l4_name(p: u8) -> String {
    match p {
        6 => "tcp".into(),
        17 => "udp".into(),
        1 => "icmp".into(),
        58 => "ipv6-icmp".into(),
        132 => "sctp".into(),
        n => n.to_string(),
    }
}

/// An address of `family_bytes` (4 or 16) from the first bytes of `data`, zero-filled.
fn address(data: &[u8], family_bytes: usize) -> String {
    let mut b = vec![0u8; family_bytes];
    let n = data.len().min(family_bytes);
    b[..n].copy_from_slice(&data[..n]);
    if family_bytes == 4 {
        Ipv4Addr::new(b[0], b[1], b[2], b[3]).to_string()
    } else {
        let a: [u8; 16] = b.try_into().unwrap_or([0; 16]);
        Ipv6Addr::from(a).to_string()
    }
}

/// `ip daddr` & co. for a network-header load, with the prefix its length or mask gives.
fn network_match(offset: u32, len: u32, mask: Option<&[u8]>, data: &[u8]) -> Option<String> {
    let (field, bytes) = match offset {
        12 if len <= 4 => ("ip saddr", 4),
        16 if len <= 4 => ("ip daddr", 4),
        8 if len <= 16 => ("ip6 saddr", 16),
        24 if len <= 16 => ("ip6 daddr", 16),
        _ => return None,
    };
    let prefix = match mask {
        Some(m) => m.iter().map(|b| b.count_ones()).sum::<u32>(),
        None => len * 8,
    };
    let addr = address(data, bytes);
    Some(if prefix as usize == bytes * 8 {
        format!("{field} {{op}}{addr}")
    } else {
        format!("{field} {{op}}{addr}/{prefix}")
    })
}

/// The words of a comparison of what register 1 holds (`r1`, masked by `mask`) with
/// `data`, or None when they are not known here; also whether the match only states a
/// dependency (a protocol match a later header match makes implicit). An `l4proto`
/// match names the protocol (`l4`) the port matches after it are shown with.
fn cmp_words(
    r1: Option<&Loaded>,
    mask: Option<&[u8]>,
    op: CmpOp,
    data: &[u8],
    l4: &mut Option<String>,
) -> (Option<String>, bool) {
    let op_w = op_word(op);
    let mut is_dependency = false;
    let words = match (r1, mask) {
        (Some(Loaded::Meta(MetaKey::L4Proto)), None) if data.len() == 1 => {
            if op == CmpOp::Eq {
                *l4 = Some(l4_name(data[0]));
                is_dependency = true;
            }
            Some(format!("meta l4proto {op_w}{}", l4_name(data[0])))
        }
        (Some(Loaded::Meta(MetaKey::NfProto)), None) if data.len() == 1 => {
            is_dependency = op == CmpOp::Eq;
            let f = match data[0] {
                2 => "ipv4".to_string(),
                10 => "ipv6".to_string(),
                n => n.to_string(),
            };
            Some(format!("meta nfproto {op_w}{f}"))
        }
        (Some(Loaded::Meta(k @ (MetaKey::SkUid | MetaKey::SkGid | MetaKey::Mark))), None) => {
            let name = match k {
                MetaKey::SkUid => "skuid",
                MetaKey::SkGid => "skgid",
                _ => "mark",
            };
            ne_u32(data).map(|v| match k {
                MetaKey::Mark => format!("meta mark {op_w}0x{v:08x}"),
                _ => format!("meta {name} {op_w}{v}"),
            })
        }
        (Some(Loaded::Meta(k @ (MetaKey::IifName | MetaKey::OifName))), None) => {
            let name = if *k == MetaKey::IifName {
                "iifname"
            } else {
                "oifname"
            };
            let s: Vec<u8> = data.iter().copied().take_while(|b| *b != 0).collect();
            Some(format!(
                "{name} {op_w}\"{}\"",
                String::from_utf8_lossy(&s).escape_debug()
            ))
        }
        (Some(Loaded::Payload(PayloadBase::Network, off, len)), m) => {
            network_match(*off, *len, m, data).map(|s| s.replace("{op}", op_w))
        }
        (Some(Loaded::Payload(PayloadBase::Transport, off @ (0 | 2), 2)), None) => {
            let field = if *off == 0 { "sport" } else { "dport" };
            be_u16(data).map(|p| format!("{} {field} {op_w}{p}", l4.as_deref().unwrap_or("th")))
        }
        (Some(Loaded::Ct(CtKey::State)), Some(m))
            if op == CmpOp::Neq && data.iter().all(|b| *b == 0) =>
        {
            ne_u32(m).map(|bits| {
                let names: Vec<&str> = CT_STATES
                    .iter()
                    .filter(|(b, _)| bits & b != 0)
                    .map(|(_, n)| *n)
                    .collect();
                format!("ct state {}", names.join(","))
            })
        }
        _ => None,
    };
    (words, is_dependency)
}

/// The words of a port range match on what register 1 holds (`r1`, unmasked), or None.
fn range_words(
    r1: Option<&Loaded>,
    mask: Option<&[u8]>,
    op: RangeOp,
    from: &[u8],
    to: &[u8],
    l4: Option<&str>,
) -> Option<String> {
    let (Some(Loaded::Payload(PayloadBase::Transport, off @ (0 | 2), 2)), None) = (r1, mask) else {
        return None;
    };
    let field = if *off == 0 { "sport" } else { "dport" };
    be_u16(from).zip(be_u16(to)).map(|(a, b)| {
        let op_w = if op == RangeOp::Eq { "" } else { "!= " };
        format!("{} {field} {op_w}{a}-{b}", l4.unwrap_or("th"))
    })
}

/// The words of a statement (`ct zone set`, `redirect`, `counter`, a verdict) whose
/// operand, if any, is what register 1 holds (`r1`); None for anything else.
fn statement_words(e: &Expr, r1: Option<&Loaded>) -> Option<String> {
    match e {
        Expr::Ct {
            key: CtKey::Zone,
            dreg: None,
            sreg,
        } if sreg.unwrap_or(Register::R1) == Register::R1 => match r1 {
            Some(Loaded::Value(v)) => v
                .get(..2)
                .map(|b| format!("ct zone set {}", u16::from_ne_bytes([b[0], b[1]]))),
            _ => None,
        },
        Expr::Redir {
            reg_proto_min,
            reg_proto_max: None,
            ..
        } => match (reg_proto_min, r1) {
            (None, _) => Some("redirect".to_string()),
            (Some(Register::R1), Some(Loaded::Value(v))) => {
                be_u16(v).map(|p| format!("redirect to :{p}"))
            }
            _ => None,
        },
        Expr::Counter => Some("counter".to_string()),
        Expr::Immediate {
            dreg,
            data: ImmediateData::Verdict(v),
        } if *dreg == Register::VERDICT => Some(match v {
            crate::expr::Verdict::Jump(c) => format!("jump {c}"),
            crate::expr::Verdict::Goto(c) => format!("goto {c}"),
            v => v.to_string(),
        }),
        _ => None,
    }
}

/// The rule's expressions as `nft list` shows them (see the module docs).
pub fn nft_syntax(exprs: &[Expr]) -> String {
    let mut out: Vec<String> = vec![];
    // The token that states only a dependency (may be dropped by the next match).
    let mut dependency: Option<usize> = None;
    let mut l4: Option<String> = None;
    let mut r1: Option<Loaded> = None;
    let mut mask: Option<Vec<u8>> = None;
    for e in exprs {
        let raw = e.to_string();
        let mut is_dependency = false;
        let words = match e {
            Expr::Meta { key, dreg } if *dreg == Register::R1 => {
                r1 = Some(Loaded::Meta(*key));
                mask = None;
                continue;
            }
            Expr::Payload {
                base,
                offset,
                len,
                dreg,
            } if *dreg == Register::R1 => {
                r1 = Some(Loaded::Payload(*base, *offset, *len));
                mask = None;
                continue;
            }
            Expr::Ct {
                key,
                dreg: Some(Register::R1),
                ..
            } => {
                r1 = Some(Loaded::Ct(*key));
                mask = None;
                continue;
            }
            Expr::Bitwise {
                sreg, dreg, xor, ..
            } if *sreg == Register::R1
                && *dreg == Register::R1
                && xor.iter().all(|b| *b == 0)
                && r1.is_some() =>
            {
                if let Expr::Bitwise { mask: m, .. } = e {
                    mask = Some(m.clone());
                }
                continue;
            }
            Expr::Immediate {
                dreg,
                data: ImmediateData::Value(v),
            } if *dreg == Register::R1 => {
                r1 = Some(Loaded::Value(v.clone()));
                continue;
            }
            Expr::Cmp { sreg, op, data } if *sreg == Register::R1 => {
                let words;
                (words, is_dependency) =
                    cmp_words(r1.as_ref(), mask.as_deref(), *op, data, &mut l4);
                // A header match makes its protocol match implicit, as in `nft list`.
                let header = matches!(
                    r1,
                    Some(Loaded::Payload(
                        PayloadBase::Network | PayloadBase::Transport,
                        ..
                    ))
                );
                if words.is_some() && header {
                    if let Some(i) = dependency.take() {
                        out.remove(i);
                    }
                }
                words
            }
            Expr::Range { sreg, op, from, to } if *sreg == Register::R1 => {
                let words = range_words(r1.as_ref(), mask.as_deref(), *op, from, to, l4.as_deref());
                if words.is_some() {
                    if let Some(i) = dependency.take() {
                        out.remove(i);
                    }
                }
                words
            }
            _ => statement_words(e, r1.as_ref()),
        };
        if is_dependency {
            dependency = Some(out.len());
        } else if words.is_some() {
            dependency = None;
        }
        out.push(words.unwrap_or(raw));
    }
    out.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::expr::Verdict;
    use crate::rule::Rule;
    use std::net::IpAddr;

    fn words(r: Rule) -> String {
        nft_syntax(&r.exprs)
    }

    #[test]
    fn interlocks_rules_read_as_nft_list_prints_them() {
        let r = Rule::new("outbound")
            .l4proto(6)
            .dport_not(&[15001, 15006])
            .skuid_not(1337)
            .redirect_to_port(15001);
        assert_eq!(
            words(r),
            "tcp dport != 15001 tcp dport != 15006 meta skuid != 1337 redirect to :15001"
        );
        let r = Rule::new("inbound")
            .daddr("10.96.0.0".parse::<IpAddr>().unwrap(), 12)
            .verdict(Verdict::Return);
        assert_eq!(words(r), "ip daddr 10.96.0.0/12 return");
        let r = Rule::new("inbound")
            .daddr_not("fd00::1".parse::<IpAddr>().unwrap())
            .verdict(Verdict::Accept);
        assert_eq!(words(r), "ip6 daddr != fd00::1 accept");
        let r = Rule::new("x")
            .saddr("127.0.0.0".parse::<IpAddr>().unwrap(), 8)
            .oifname("lo")
            .counter()
            .verdict(Verdict::Jump("il_out".into()));
        assert_eq!(
            words(r),
            "ip saddr 127.0.0.0/8 oifname \"lo\" counter jump il_out"
        );
        let r = Rule::new("x")
            .l4proto(17)
            .dport_range(15000, 15010)
            .skgid(7);
        assert_eq!(words(r), "udp dport 15000-15010 meta skgid 7");
        assert_eq!(words(Rule::new("x").ct_state_invalid()), "ct state invalid");
        assert_eq!(words(Rule::new("x").ct_zone_set(3)), "ct zone set 3");
        // A protocol match that no header match follows stays.
        assert_eq!(
            words(Rule::new("x").l4proto(6).verdict(Verdict::Accept)),
            "meta l4proto tcp accept"
        );
    }

    #[test]
    fn what_it_does_not_know_stays_raw() {
        let e = Expr::Other {
            name: "socket".into(),
            data: vec![1, 2],
        };
        let r = Rule::new("x").skuid(0).expr(e.clone());
        assert_eq!(words(r), format!("meta skuid 0 {e}"));
    }
}

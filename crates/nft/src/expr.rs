//! nf_tables expressions: the instructions of a rule, encoded as the kernel expects and
//! decoded from its dumps into the same normalized form, so "what we asked for" and
//! "what the kernel holds" compare with `==`.

use std::fmt;

use crate::attr::{Attr, AttrWriter};
use crate::error::NftError;
use crate::sys::*;

/// An nf_tables register. [`Register::VERDICT`] holds the verdict; data registers start at
/// [`Register::R1`] (the 16-byte registers `nft` itself uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Register(pub u32);

impl Register {
    /// `NFT_REG_VERDICT`.
    pub const VERDICT: Register = Register(0);
    /// `NFT_REG_1`, the first data register.
    pub const R1: Register = Register(1);
}

impl fmt::Display for Register {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "reg {}", self.0)
    }
}

/// What a `meta` expression loads (`enum nft_meta_keys`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetaKey {
    /// Packet length.
    Len,
    /// Ethertype (`skb->protocol`).
    Protocol,
    /// Packet mark.
    Mark,
    /// Input interface index.
    Iif,
    /// Output interface index.
    Oif,
    /// Input interface name (16 bytes, NUL padded).
    IifName,
    /// Output interface name (16 bytes, NUL padded).
    OifName,
    /// UID of the originating socket (host byte order).
    SkUid,
    /// GID of the originating socket (host byte order).
    SkGid,
    /// Netfilter family of the packet (`NFPROTO_IPV4` = 2, `NFPROTO_IPV6` = 10).
    NfProto,
    /// Layer-4 protocol number (6 = TCP).
    L4Proto,
    /// Any other key, by number.
    Other(u32),
}

impl MetaKey {
    fn to_raw(self) -> u32 {
        match self {
            MetaKey::Len => 0,
            MetaKey::Protocol => 1,
            MetaKey::Mark => 3,
            MetaKey::Iif => 4,
            MetaKey::Oif => 5,
            MetaKey::IifName => 6,
            MetaKey::OifName => 7,
            MetaKey::SkUid => 10,
            MetaKey::SkGid => 11,
            MetaKey::NfProto => 15,
            MetaKey::L4Proto => 16,
            MetaKey::Other(n) => n,
        }
    }

    fn from_raw(n: u32) -> MetaKey {
        match n {
            0 => MetaKey::Len,
            1 => MetaKey::Protocol,
            3 => MetaKey::Mark,
            4 => MetaKey::Iif,
            5 => MetaKey::Oif,
            6 => MetaKey::IifName,
            7 => MetaKey::OifName,
            10 => MetaKey::SkUid,
            11 => MetaKey::SkGid,
            15 => MetaKey::NfProto,
            16 => MetaKey::L4Proto,
            n => MetaKey::Other(n),
        }
    }

    fn name(self) -> String {
        match self {
            MetaKey::Len => "len".into(),
            MetaKey::Protocol => "protocol".into(),
            MetaKey::Mark => "mark".into(),
            MetaKey::Iif => "iif".into(),
            MetaKey::Oif => "oif".into(),
            MetaKey::IifName => "iifname".into(),
            MetaKey::OifName => "oifname".into(),
            MetaKey::SkUid => "skuid".into(),
            MetaKey::SkGid => "skgid".into(),
            MetaKey::NfProto => "nfproto".into(),
            MetaKey::L4Proto => "l4proto".into(),
            MetaKey::Other(n) => format!("key{n}"),
        }
    }
}

/// Where a `payload` expression's offset counts from (`enum nft_payload_bases`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PayloadBase {
    /// Link-layer header.
    LinkLayer,
    /// Network header (IPv4/IPv6).
    Network,
    /// Transport header (TCP/UDP).
    Transport,
    /// Any other base, by number.
    Other(u32),
}

impl PayloadBase {
    fn to_raw(self) -> u32 {
        match self {
            PayloadBase::LinkLayer => 0,
            PayloadBase::Network => 1,
            PayloadBase::Transport => 2,
            PayloadBase::Other(n) => n,
        }
    }

    fn from_raw(n: u32) -> PayloadBase {
        match n {
            0 => PayloadBase::LinkLayer,
            1 => PayloadBase::Network,
            2 => PayloadBase::Transport,
            n => PayloadBase::Other(n),
        }
    }
}

/// What a `ct` expression loads or sets (`enum nft_ct_keys`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CtKey {
    /// The connection's state bits (`ct state`), 32 bits in host order.
    State,
    /// The conntrack zone (`ct zone`), 16 bits in host order.
    Zone,
    /// Any other key, by number.
    Other(u32),
}

impl CtKey {
    fn to_raw(self) -> u32 {
        match self {
            CtKey::State => 0,
            CtKey::Zone => 17,
            CtKey::Other(n) => n,
        }
    }

    fn from_raw(n: u32) -> CtKey {
        match n {
            0 => CtKey::State,
            17 => CtKey::Zone,
            n => CtKey::Other(n),
        }
    }

    fn name(self) -> String {
        match self {
            CtKey::State => "state".into(),
            CtKey::Zone => "zone".into(),
            CtKey::Other(n) => format!("key{n}"),
        }
    }
}

/// Comparison of a `cmp` expression (`enum nft_cmp_ops`); ordering compares bytes, so
/// values must be big-endian for numeric order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmpOp {
    /// `==`
    Eq,
    /// `!=`
    Neq,
    /// `<`
    Lt,
    /// `<=`
    Lte,
    /// `>`
    Gt,
    /// `>=`
    Gte,
}

impl CmpOp {
    fn to_raw(self) -> u32 {
        match self {
            CmpOp::Eq => 0,
            CmpOp::Neq => 1,
            CmpOp::Lt => 2,
            CmpOp::Lte => 3,
            CmpOp::Gt => 4,
            CmpOp::Gte => 5,
        }
    }

    fn from_raw(n: u32) -> Option<CmpOp> {
        Some(match n {
            0 => CmpOp::Eq,
            1 => CmpOp::Neq,
            2 => CmpOp::Lt,
            3 => CmpOp::Lte,
            4 => CmpOp::Gt,
            5 => CmpOp::Gte,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            CmpOp::Eq => "eq",
            CmpOp::Neq => "neq",
            CmpOp::Lt => "lt",
            CmpOp::Lte => "lte",
            CmpOp::Gt => "gt",
            CmpOp::Gte => "gte",
        }
    }
}

/// Operation of a `range` expression (`enum nft_range_ops`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RangeOp {
    /// Inside the range.
    Eq,
    /// Outside the range.
    Neq,
}

/// A verdict (`NF_ACCEPT`, `NF_DROP`, `enum nft_verdicts`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Accept the packet (end of this base chain).
    Accept,
    /// Drop the packet.
    Drop,
    /// Continue with the next expression.
    Continue,
    /// Stop this rule, continue with the next rule.
    Break,
    /// Return to the calling chain.
    Return,
    /// Jump to a chain, returning afterwards.
    Jump(String),
    /// Go to a chain without returning.
    Goto(String),
    /// Any other verdict code.
    Other(i32),
}

impl Verdict {
    fn code(&self) -> i32 {
        match self {
            Verdict::Accept => NF_ACCEPT,
            Verdict::Drop => NF_DROP,
            Verdict::Continue => NFT_CONTINUE,
            Verdict::Break => NFT_BREAK,
            Verdict::Return => NFT_RETURN,
            Verdict::Jump(_) => NFT_JUMP,
            Verdict::Goto(_) => NFT_GOTO,
            Verdict::Other(c) => *c,
        }
    }

    fn chain(&self) -> Option<&str> {
        match self {
            Verdict::Jump(c) | Verdict::Goto(c) => Some(c),
            _ => None,
        }
    }

    fn from_parts(code: i32, chain: Option<String>) -> Verdict {
        match (code, chain) {
            (NF_ACCEPT, None) => Verdict::Accept,
            (NF_DROP, None) => Verdict::Drop,
            (NFT_CONTINUE, None) => Verdict::Continue,
            (NFT_BREAK, None) => Verdict::Break,
            (NFT_RETURN, None) => Verdict::Return,
            (NFT_JUMP, Some(c)) => Verdict::Jump(c),
            (NFT_GOTO, Some(c)) => Verdict::Goto(c),
            (c, _) => Verdict::Other(c),
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Accept => f.write_str("accept"),
            Verdict::Drop => f.write_str("drop"),
            Verdict::Continue => f.write_str("continue"),
            Verdict::Break => f.write_str("break"),
            Verdict::Return => f.write_str("return"),
            Verdict::Jump(c) => write!(f, "jump -> {c}"),
            Verdict::Goto(c) => write!(f, "goto -> {c}"),
            Verdict::Other(c) => write!(f, "verdict {c}"),
        }
    }
}

/// What an `immediate` expression loads.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ImmediateData {
    /// Raw bytes into a data register.
    Value(Vec<u8>),
    /// A verdict into the verdict register.
    Verdict(Verdict),
}

/// One expression of a rule, in the normalized form used both to build and to compare.
///
/// Decoding normalizes what the kernel echoes back differently from what was sent: a
/// counter's values are dropped, a redirect's `proto_max` equal to its `proto_min` is
/// folded away, a bitwise `op` of `NFT_BITWISE_BOOL` is implied.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Expr {
    /// `meta load <key> => <dreg>`.
    Meta {
        /// What to load.
        key: MetaKey,
        /// Destination register.
        dreg: Register,
    },
    /// `payload load <len>b @ <base> + <offset> => <dreg>`.
    Payload {
        /// Header the offset counts from.
        base: PayloadBase,
        /// Byte offset.
        offset: u32,
        /// Number of bytes.
        len: u32,
        /// Destination register.
        dreg: Register,
    },
    /// `cmp <op> <sreg> <data>`: the rule stops unless the comparison holds.
    Cmp {
        /// Register compared.
        sreg: Register,
        /// Comparison.
        op: CmpOp,
        /// Value compared with.
        data: Vec<u8>,
    },
    /// `bitwise <dreg> = (<sreg> & mask) ^ xor`.
    Bitwise {
        /// Source register.
        sreg: Register,
        /// Destination register.
        dreg: Register,
        /// Number of bytes.
        len: u32,
        /// AND mask.
        mask: Vec<u8>,
        /// XOR value.
        xor: Vec<u8>,
    },
    /// `range <op> <sreg> <from> <to>` (inclusive bounds, big-endian compare).
    Range {
        /// Register compared.
        sreg: Register,
        /// Inside or outside.
        op: RangeOp,
        /// Lower bound.
        from: Vec<u8>,
        /// Upper bound.
        to: Vec<u8>,
    },
    /// `immediate <dreg> <data>`: loads a value or sets the verdict.
    Immediate {
        /// Destination register ([`Register::VERDICT`] for a verdict).
        dreg: Register,
        /// The value or verdict.
        data: ImmediateData,
    },
    /// `redir`: NAT the destination to the local address, optionally a port from a register.
    Redir {
        /// Register holding the lowest port (big-endian 16 bits).
        reg_proto_min: Option<Register>,
        /// Register holding the highest port, when different from the lowest.
        reg_proto_max: Option<Register>,
        /// `NF_NAT_RANGE_*` flags.
        flags: u32,
    },
    /// `ct load <key> => <dreg>` or, with a source register, `ct set <key> with <sreg>`.
    Ct {
        /// What to load or set.
        key: CtKey,
        /// Destination register (load).
        dreg: Option<Register>,
        /// Source register (set).
        sreg: Option<Register>,
    },
    /// `counter` (its packet and byte values are not part of the comparison).
    Counter,
    /// Any expression this crate does not model, kept raw so it still compares unequal.
    Other {
        /// Expression name (`NFTA_EXPR_NAME`).
        name: String,
        /// Raw `NFTA_EXPR_DATA` content.
        data: Vec<u8>,
    },
}

impl Expr {
    /// The name the kernel knows this expression by.
    pub fn name(&self) -> &str {
        match self {
            Expr::Meta { .. } => "meta",
            Expr::Payload { .. } => "payload",
            Expr::Cmp { .. } => "cmp",
            Expr::Bitwise { .. } => "bitwise",
            Expr::Range { .. } => "range",
            Expr::Immediate { .. } => "immediate",
            Expr::Redir { .. } => "redir",
            Expr::Ct { .. } => "ct",
            Expr::Counter => "counter",
            Expr::Other { name, .. } => name,
        }
    }

    /// Appends this expression as one `NFTA_LIST_ELEM`, attributes in the order `nft`
    /// (libnftnl) writes them, so encodings compare byte for byte.
    pub(crate) fn encode(&self, w: &mut AttrWriter<'_>) {
        w.nested(NFTA_LIST_ELEM, |w| {
            w.string(NFTA_EXPR_NAME, self.name());
            if let Expr::Other { data, .. } = self {
                w.nested(NFTA_EXPR_DATA, |w| w.extend_raw(data));
                return;
            }
            w.nested(NFTA_EXPR_DATA, |w| match self {
                Expr::Meta { key, dreg } => {
                    w.be32(NFTA_META_KEY, key.to_raw());
                    w.be32(NFTA_META_DREG, dreg.0);
                }
                Expr::Payload {
                    base,
                    offset,
                    len,
                    dreg,
                } => {
                    w.be32(NFTA_PAYLOAD_DREG, dreg.0);
                    w.be32(NFTA_PAYLOAD_BASE, base.to_raw());
                    w.be32(NFTA_PAYLOAD_OFFSET, *offset);
                    w.be32(NFTA_PAYLOAD_LEN, *len);
                }
                Expr::Cmp { sreg, op, data } => {
                    w.be32(NFTA_CMP_SREG, sreg.0);
                    w.be32(NFTA_CMP_OP, op.to_raw());
                    w.nested(NFTA_CMP_DATA, |w| w.bytes(NFTA_DATA_VALUE, data));
                }
                Expr::Bitwise {
                    sreg,
                    dreg,
                    len,
                    mask,
                    xor,
                } => {
                    w.be32(NFTA_BITWISE_SREG, sreg.0);
                    w.be32(NFTA_BITWISE_DREG, dreg.0);
                    w.be32(NFTA_BITWISE_LEN, *len);
                    w.nested(NFTA_BITWISE_MASK, |w| w.bytes(NFTA_DATA_VALUE, mask));
                    w.nested(NFTA_BITWISE_XOR, |w| w.bytes(NFTA_DATA_VALUE, xor));
                }
                Expr::Range { sreg, op, from, to } => {
                    w.be32(NFTA_RANGE_SREG, sreg.0);
                    w.be32(NFTA_RANGE_OP, matches!(op, RangeOp::Neq) as u32);
                    w.nested(NFTA_RANGE_FROM_DATA, |w| w.bytes(NFTA_DATA_VALUE, from));
                    w.nested(NFTA_RANGE_TO_DATA, |w| w.bytes(NFTA_DATA_VALUE, to));
                }
                Expr::Immediate { dreg, data } => {
                    w.be32(NFTA_IMMEDIATE_DREG, dreg.0);
                    w.nested(NFTA_IMMEDIATE_DATA, |w| match data {
                        ImmediateData::Value(v) => w.bytes(NFTA_DATA_VALUE, v),
                        ImmediateData::Verdict(v) => w.nested(NFTA_DATA_VERDICT, |w| {
                            w.be32(NFTA_VERDICT_CODE, v.code() as u32);
                            if let Some(chain) = v.chain() {
                                w.string(NFTA_VERDICT_CHAIN, chain);
                            }
                        }),
                    });
                }
                Expr::Redir {
                    reg_proto_min,
                    reg_proto_max,
                    flags,
                } => {
                    if let Some(r) = reg_proto_min {
                        w.be32(NFTA_REDIR_REG_PROTO_MIN, r.0);
                    }
                    if let Some(r) = reg_proto_max {
                        w.be32(NFTA_REDIR_REG_PROTO_MAX, r.0);
                    }
                    if *flags != 0 {
                        w.be32(NFTA_REDIR_FLAGS, *flags);
                    }
                }
                Expr::Ct { key, dreg, sreg } => {
                    w.be32(NFTA_CT_KEY, key.to_raw());
                    if let Some(r) = dreg {
                        w.be32(NFTA_CT_DREG, r.0);
                    }
                    if let Some(r) = sreg {
                        w.be32(NFTA_CT_SREG, r.0);
                    }
                }
                Expr::Counter => {}
                Expr::Other { .. } => unreachable!("handled above"),
            });
        });
    }

    /// Decodes one `NFTA_LIST_ELEM`. Anything not modelled exactly becomes [`Expr::Other`].
    pub(crate) fn decode(elem: &Attr<'_>) -> Result<Expr, NftError> {
        let mut name = None;
        let mut data: &[u8] = &[];
        for a in elem.nested() {
            let a = a?;
            match a.ty {
                NFTA_EXPR_NAME => name = Some(a.str()?),
                NFTA_EXPR_DATA => data = a.data,
                _ => {}
            }
        }
        let name = name.ok_or_else(|| NftError::Malformed("expression without a name".into()))?;
        Ok(match decode_known(name, data)? {
            Some(e) => e,
            None => Expr::Other {
                name: name.to_owned(),
                data: data.to_vec(),
            },
        })
    }
}

fn data_value(a: &Attr<'_>) -> Result<Option<Vec<u8>>, NftError> {
    for inner in a.nested() {
        let inner = inner?;
        if inner.ty == NFTA_DATA_VALUE {
            return Ok(Some(inner.data.to_vec()));
        }
    }
    Ok(None)
}

/// An expression's attributes (`NFTA_EXPR_DATA`), for the decoders below.
struct Fields<'a> {
    attrs: Vec<Attr<'a>>,
}

impl<'a> Fields<'a> {
    fn parse(data: &'a [u8]) -> Result<Fields<'a>, NftError> {
        let attrs = crate::attr::Attrs::new(data).collect::<Result<Vec<_>, _>>()?;
        Ok(Fields { attrs })
    }

    fn get(&self, ty: u16) -> Option<&Attr<'a>> {
        self.attrs.iter().find(|a| a.ty == ty)
    }

    /// True when no attribute outside `allowed` is present.
    fn only(&self, allowed: &[u16]) -> bool {
        self.attrs.iter().all(|a| allowed.contains(&a.ty))
    }

    fn be32(&self, ty: u16) -> Result<Option<u32>, NftError> {
        self.get(ty).map(|a| a.be32()).transpose()
    }

    fn reg(&self, ty: u16) -> Result<Option<Register>, NftError> {
        Ok(self.be32(ty)?.map(Register))
    }

    /// The `NFTA_DATA_VALUE` inside the nested attribute `ty`.
    fn value(&self, ty: u16) -> Result<Option<Vec<u8>>, NftError> {
        match self.get(ty) {
            Some(a) => data_value(a),
            None => Ok(None),
        }
    }
}

/// Decodes the expressions this crate models, one decoder per kind. Returns `None` when
/// the expression has attributes or values outside the model (it is then kept as
/// [`Expr::Other`]).
fn decode_known(name: &str, data: &[u8]) -> Result<Option<Expr>, NftError> {
    let f = Fields::parse(data)?;
    match name {
        "meta" => decode_meta(&f),
        "payload" => decode_payload(&f),
        "cmp" => decode_cmp(&f),
        "bitwise" => decode_bitwise(&f),
        "range" => decode_range(&f),
        "immediate" => decode_immediate(&f),
        "redir" => decode_redir(&f),
        "ct" => decode_ct(&f),
        "counter" => Ok(Some(Expr::Counter)),
        _ => Ok(None),
    }
}

fn decode_meta(f: &Fields<'_>) -> Result<Option<Expr>, NftError> {
    if !f.only(&[NFTA_META_KEY, NFTA_META_DREG]) {
        return Ok(None);
    }
    Ok(match (f.get(NFTA_META_KEY), f.reg(NFTA_META_DREG)?) {
        (Some(key), Some(dreg)) => Some(Expr::Meta {
            key: MetaKey::from_raw(key.be32()?),
            dreg,
        }),
        _ => None,
    })
}

fn decode_payload(f: &Fields<'_>) -> Result<Option<Expr>, NftError> {
    if !f.only(&[
        NFTA_PAYLOAD_DREG,
        NFTA_PAYLOAD_BASE,
        NFTA_PAYLOAD_OFFSET,
        NFTA_PAYLOAD_LEN,
    ]) {
        return Ok(None);
    }
    Ok(
        match (
            f.reg(NFTA_PAYLOAD_DREG)?,
            f.get(NFTA_PAYLOAD_BASE),
            f.get(NFTA_PAYLOAD_OFFSET),
            f.get(NFTA_PAYLOAD_LEN),
        ) {
            (Some(dreg), Some(base), Some(offset), Some(len)) => Some(Expr::Payload {
                base: PayloadBase::from_raw(base.be32()?),
                offset: offset.be32()?,
                len: len.be32()?,
                dreg,
            }),
            _ => None,
        },
    )
}

fn decode_cmp(f: &Fields<'_>) -> Result<Option<Expr>, NftError> {
    if !f.only(&[NFTA_CMP_SREG, NFTA_CMP_OP, NFTA_CMP_DATA]) {
        return Ok(None);
    }
    let op = f.be32(NFTA_CMP_OP)?.and_then(CmpOp::from_raw);
    Ok(match (f.reg(NFTA_CMP_SREG)?, op, f.get(NFTA_CMP_DATA)) {
        (Some(sreg), Some(op), Some(d)) => data_value(d)?.map(|data| Expr::Cmp { sreg, op, data }),
        _ => None,
    })
}

fn decode_bitwise(f: &Fields<'_>) -> Result<Option<Expr>, NftError> {
    if !f.only(&[
        NFTA_BITWISE_SREG,
        NFTA_BITWISE_DREG,
        NFTA_BITWISE_LEN,
        NFTA_BITWISE_MASK,
        NFTA_BITWISE_XOR,
        NFTA_BITWISE_OP,
    ]) {
        return Ok(None);
    }
    if f.be32(NFTA_BITWISE_OP)?
        .is_some_and(|op| op != NFT_BITWISE_BOOL)
    {
        return Ok(None);
    }
    let (Some(sreg), Some(dreg), Some(len), Some(_), Some(_)) = (
        f.reg(NFTA_BITWISE_SREG)?,
        f.reg(NFTA_BITWISE_DREG)?,
        f.get(NFTA_BITWISE_LEN),
        f.get(NFTA_BITWISE_MASK),
        f.get(NFTA_BITWISE_XOR),
    ) else {
        return Ok(None);
    };
    Ok(
        match (f.value(NFTA_BITWISE_MASK)?, f.value(NFTA_BITWISE_XOR)?) {
            (Some(mask), Some(xor)) => Some(Expr::Bitwise {
                sreg,
                dreg,
                len: len.be32()?,
                mask,
                xor,
            }),
            _ => None,
        },
    )
}

fn decode_range(f: &Fields<'_>) -> Result<Option<Expr>, NftError> {
    if !f.only(&[
        NFTA_RANGE_SREG,
        NFTA_RANGE_OP,
        NFTA_RANGE_FROM_DATA,
        NFTA_RANGE_TO_DATA,
    ]) {
        return Ok(None);
    }
    let op = match f.be32(NFTA_RANGE_OP)? {
        Some(0) => RangeOp::Eq,
        Some(1) => RangeOp::Neq,
        _ => return Ok(None),
    };
    let (Some(sreg), Some(_), Some(_)) = (
        f.reg(NFTA_RANGE_SREG)?,
        f.get(NFTA_RANGE_FROM_DATA),
        f.get(NFTA_RANGE_TO_DATA),
    ) else {
        return Ok(None);
    };
    Ok(
        match (f.value(NFTA_RANGE_FROM_DATA)?, f.value(NFTA_RANGE_TO_DATA)?) {
            (Some(from), Some(to)) => Some(Expr::Range { sreg, op, from, to }),
            _ => None,
        },
    )
}

fn decode_immediate(f: &Fields<'_>) -> Result<Option<Expr>, NftError> {
    if !f.only(&[NFTA_IMMEDIATE_DREG, NFTA_IMMEDIATE_DATA]) {
        return Ok(None);
    }
    let (Some(dreg), Some(d)) = (f.reg(NFTA_IMMEDIATE_DREG)?, f.get(NFTA_IMMEDIATE_DATA)) else {
        return Ok(None);
    };
    let mut data = None;
    for inner in d.nested() {
        let inner = inner?;
        match inner.ty {
            NFTA_DATA_VALUE => data = Some(ImmediateData::Value(inner.data.to_vec())),
            NFTA_DATA_VERDICT => match decode_verdict(&inner)? {
                Some(v) => data = Some(ImmediateData::Verdict(v)),
                None => return Ok(None),
            },
            _ => return Ok(None),
        }
    }
    Ok(data.map(|data| Expr::Immediate { dreg, data }))
}

/// An `NFTA_DATA_VERDICT`; `None` without a verdict code.
fn decode_verdict(a: &Attr<'_>) -> Result<Option<Verdict>, NftError> {
    let mut code = None;
    let mut chain = None;
    for v in a.nested() {
        let v = v?;
        match v.ty {
            NFTA_VERDICT_CODE => code = Some(v.be32()? as i32),
            NFTA_VERDICT_CHAIN => chain = Some(v.string()?),
            _ => {}
        }
    }
    Ok(code.map(|c| Verdict::from_parts(c, chain)))
}

fn decode_redir(f: &Fields<'_>) -> Result<Option<Expr>, NftError> {
    if !f.only(&[
        NFTA_REDIR_REG_PROTO_MIN,
        NFTA_REDIR_REG_PROTO_MAX,
        NFTA_REDIR_FLAGS,
    ]) {
        return Ok(None);
    }
    let reg_proto_min = f.reg(NFTA_REDIR_REG_PROTO_MIN)?;
    let mut reg_proto_max = f.reg(NFTA_REDIR_REG_PROTO_MAX)?;
    if reg_proto_max == reg_proto_min {
        reg_proto_max = None;
    }
    Ok(Some(Expr::Redir {
        reg_proto_min,
        reg_proto_max,
        flags: f.be32(NFTA_REDIR_FLAGS)?.unwrap_or(0),
    }))
}

fn decode_ct(f: &Fields<'_>) -> Result<Option<Expr>, NftError> {
    if !f.only(&[NFTA_CT_KEY, NFTA_CT_DREG, NFTA_CT_SREG]) {
        return Ok(None);
    }
    let dreg = f.reg(NFTA_CT_DREG)?;
    let sreg = f.reg(NFTA_CT_SREG)?;
    Ok(match f.get(NFTA_CT_KEY) {
        Some(key) if dreg.is_some() != sreg.is_some() => Some(Expr::Ct {
            key: CtKey::from_raw(key.be32()?),
            dreg,
            sreg,
        }),
        _ => None,
    })
}

fn hex(data: &[u8]) -> String {
    data.iter().map(|b| format!("{b:02x}")).collect()
}

impl fmt::Display for Expr {
    /// Close to `nft --debug=netlink`, with values as big-endian hex bytes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::Meta { key, dreg } => write!(f, "[ meta load {} => {dreg} ]", key.name()),
            Expr::Payload {
                base,
                offset,
                len,
                dreg,
            } => {
                let base = match base {
                    PayloadBase::LinkLayer => "link".to_string(),
                    PayloadBase::Network => "network".to_string(),
                    PayloadBase::Transport => "transport".to_string(),
                    PayloadBase::Other(n) => format!("base{n}"),
                };
                write!(
                    f,
                    "[ payload load {len}b @ {base} header + {offset} => {dreg} ]"
                )
            }
            Expr::Cmp { sreg, op, data } => {
                write!(f, "[ cmp {} {sreg} 0x{} ]", op.name(), hex(data))
            }
            Expr::Bitwise {
                sreg,
                dreg,
                mask,
                xor,
                ..
            } => write!(
                f,
                "[ bitwise {dreg} = ( {sreg} & 0x{} ) ^ 0x{} ]",
                hex(mask),
                hex(xor)
            ),
            Expr::Range { sreg, op, from, to } => write!(
                f,
                "[ range {} {sreg} 0x{} 0x{} ]",
                if *op == RangeOp::Eq { "eq" } else { "neq" },
                hex(from),
                hex(to)
            ),
            Expr::Immediate { dreg, data } => match data {
                ImmediateData::Value(v) => write!(f, "[ immediate {dreg} 0x{} ]", hex(v)),
                ImmediateData::Verdict(v) => write!(f, "[ immediate {dreg} {v} ]"),
            },
            Expr::Redir {
                reg_proto_min,
                reg_proto_max,
                flags,
            } => {
                f.write_str("[ redir")?;
                if let Some(r) = reg_proto_min {
                    write!(f, " proto_min {r}")?;
                }
                if let Some(r) = reg_proto_max {
                    write!(f, " proto_max {r}")?;
                }
                write!(f, " flags 0x{flags:x} ]")
            }
            Expr::Ct {
                key,
                dreg: Some(dreg),
                ..
            } => write!(f, "[ ct load {} => {dreg} ]", key.name()),
            Expr::Ct { key, sreg, .. } => {
                let sreg = sreg.unwrap_or(Register::R1);
                write!(f, "[ ct set {} with {sreg} ]", key.name())
            }
            Expr::Counter => f.write_str("[ counter ]"),
            Expr::Other { name, data } => write!(f, "[ {name} (unmodelled) 0x{} ]", hex(data)),
        }
    }
}

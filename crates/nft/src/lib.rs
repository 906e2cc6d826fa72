//! nf_tables spoken over netlink, in process.
//!
//! Builds and sends one batch (one atomic transaction) of table, chain and rule messages,
//! and reads rules back, without starting `nft`. Written from the kernel's uapi
//! (`linux/netfilter/nf_tables.h`); no GPL code is linked.
//!
//! - [`Batch`] collects `add table` / `delete table` / `add chain` / `add rule` messages;
//!   [`Nft::commit`] sends them between `NFNL_MSG_BATCH_BEGIN` and `END` and checks every
//!   acknowledgement, naming the message the kernel refused.
//! - [`Rule`] builders emit the same expressions `nft` would for the equivalent rule text
//!   (checked byte for byte against `nft` 1.0.6 in the tests).
//! - [`Nft::table`], [`Nft::chains`], [`Nft::rules`] read back what the kernel holds,
//!   decoded into the same [`Expr`] form, so a comparison with `==` tells whether exactly
//!   the intended rules are installed.

mod attr;
pub mod batch;
pub mod error;
pub mod expr;
pub mod rule;
pub mod socket;
pub mod syntax;
#[allow(dead_code)]
mod sys;

pub use batch::{
    Ack, BaseChain, Batch, Chain, ChainType, Family, Hook, Policy, TableInfo, TABLE_F_DORMANT,
};
pub use error::NftError;
pub use expr::{
    CmpOp, CtKey, Expr, ImmediateData, MetaKey, PayloadBase, RangeOp, Register, Verdict,
};
pub use rule::{Rule, IPPROTO_TCP, IPPROTO_UDP, NFPROTO_IPV4, NFPROTO_IPV6};
pub use socket::{ChainInfo, Nft};
pub use syntax::nft_syntax;

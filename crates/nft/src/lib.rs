//! nf_tables spoken over netlink, in process.
//!
//! Builds and sends one batch (one atomic transaction) of table, chain and rule messages,
//! and reads rules back, without starting `nft`. Written from the kernel's uapi
//! (`linux/netfilter/nf_tables.h`); no GPL code is linked.

//! The nftables backend (owned by the nft work).

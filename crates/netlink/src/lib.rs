//! The project's netlink transport, shared by the nf_tables socket (`interlock-nft`),
//! rtnetlink (`interlock_redirect::route`) and sock_diag (`interlock_redirect::sockdiag`).
//!
//! Only what every family needs: opening a socket in the calling thread's network
//! namespace ([`socket`]), receiving a datagram whole into a buffer that costs nothing
//! until a reply lands in it ([`recv`]), and splitting a datagram into its messages
//! ([`message`]). What a message says is each family's business.
//!
//! The plugin links it on every ADD, so it stays small: no dependency beyond `nix` and
//! `libc`, nothing allocated before a receive needs it.

pub mod message;
pub mod recv;
pub mod socket;

pub use message::{Malformed, Message, Messages};
pub use recv::{Datagram, Receiver, RECV_BUFFER};

//! An attachment's protection, with its network namespace as the unit of protection.
//!
//! What the plugin's ADD, CHECK, DEL and GC do to a pod's netns, and what the agent's
//! in-place repair does too — one code path for both, so a netns the agent repaired is
//! one the plugin's DEL and GC clean up like any other: [`protect`] (apply, verify and
//! prove the rules under the netns's lock, share them with the other live attachments of
//! the same netns, release a reference and remove the rules with the last one),
//! [`state`] (one file per attachment: what was decided and done), [`outcome`] (what
//! the state records), [`pod`] (which pod an attachment belongs to, and where its
//! annotations came from), [`detected_backend`] (the host's netfilter backend, detected
//! once a minute) and [`collect`] (the agent's removal of what gone sandboxes left).

pub mod collect;
pub mod detected_backend;
pub mod outcome;
pub mod pod;
pub mod protect;
pub mod state;

//! Errors of the nf_tables netlink client.

/// A failure talking nf_tables over netlink.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    /// A socket call failed (opening, binding, sending, receiving).
    #[error("nf_tables netlink socket: {op} failed: {source}")]
    Io {
        /// The call that failed (`socket`, `bind`, `send`, `recv`).
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The kernel refused a request; `what` names the request (table, chain, rule tag).
    #[error("the kernel refused {what}: {} (errno {errno}){}{}", errno_text(*errno), ext_text(message), hint_text(*errno))]
    Kernel {
        /// The request the kernel refused, e.g. `add rule inet interlock outbound [il:out:3]`.
        what: String,
        /// The positive errno the kernel returned.
        errno: i32,
        /// The kernel's extended-ack message, when it sent one.
        message: Option<String>,
    },
    /// The kernel answered something this client cannot parse.
    #[error("malformed nf_tables netlink reply: {0}")]
    Malformed(String),
    /// The kernel did not answer a request in time.
    #[error("no answer from the kernel for {what} within {timeout_ms} ms")]
    Timeout {
        /// The request left unanswered.
        what: String,
        /// How long the client waited.
        timeout_ms: u64,
    },
    /// A dump was interrupted by concurrent changes too many times in a row.
    #[error("dump of {what} kept being interrupted by concurrent ruleset changes; retry")]
    DumpInterrupted {
        /// What was being dumped.
        what: String,
    },
    /// A batch is larger than one netlink message may be (`EMSGSIZE` on send).
    #[error("nf_tables batch of {bytes} bytes ({messages} messages) is larger than the kernel accepts in one netlink transaction (Message too long): too many rules at once")]
    BatchTooLarge {
        /// The encoded batch size.
        bytes: usize,
        /// The number of messages (tables, chains, rules) in it.
        messages: usize,
    },
    /// A value cannot be encoded (e.g. a name longer than the kernel accepts).
    #[error("invalid {what}: {why}")]
    Invalid {
        /// The value.
        what: String,
        /// Why it is refused.
        why: String,
    },
}

impl NftError {
    /// The kernel's errno when the kernel refused a request.
    pub fn errno(&self) -> Option<i32> {
        match self {
            NftError::Kernel { errno, .. } => Some(*errno),
            _ => None,
        }
    }

    /// True when the kernel said the object does not exist (`ENOENT`).
    pub fn is_not_found(&self) -> bool {
        self.errno() == Some(libc::ENOENT)
    }
}

fn errno_text(errno: i32) -> String {
    std::io::Error::from_raw_os_error(errno).to_string()
}

fn ext_text(message: &Option<String>) -> String {
    match message {
        Some(m) if !m.is_empty() => format!(": {m}"),
        _ => String::new(),
    }
}

fn hint_text(errno: i32) -> &'static str {
    match errno {
        libc::EPERM => " (needs CAP_NET_ADMIN in this network namespace)",
        libc::EOPNOTSUPP => " (the kernel lacks a needed nf_tables feature or module, e.g. nft_chain_nat / nft_redir)",
        libc::ENOENT => " (object or expression type does not exist; for an expression, is its kernel module available?)",
        libc::EBUSY => " (object in use, e.g. a chain still referenced by a jump)",
        libc::EEXIST => " (object already exists)",
        libc::EINVAL => " (the kernel rejected an attribute of this message)",
        libc::ENOBUFS | libc::ENOMEM => " (kernel out of buffer space; retry)",
        _ => "",
    }
}

impl From<interlock_netlink::Malformed> for NftError {
    fn from(e: interlock_netlink::Malformed) -> NftError {
        NftError::Malformed(e.to_string())
    }
}

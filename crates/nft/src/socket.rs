//! The netlink socket (`AF_NETLINK`, `NETLINK_NETFILTER`) and the client on top of it:
//! commit a batch and collect every acknowledgement, run dumps, get single objects.
//!
//! A socket belongs to the network namespace of the thread that opened it, so open it on
//! a thread that is already inside the target namespace.

use std::os::fd::OwnedFd;
use std::time::Duration;

use interlock_netlink::{socket, Message, Messages, Receiver};
use nix::sys::socket::{setsockopt, sockopt, MsgFlags, SockProtocol};
use nix::sys::time::TimeVal;

use crate::attr::{AttrWriter, Attrs};
use crate::batch::{
    finish_message, put_header, Ack, Batch, Chain, Family, Hook, Policy, TableInfo,
};
use crate::error::NftError;
use crate::expr::Expr;
use crate::rule::Rule;
use crate::sys::*;

/// How long a request may go unanswered before it fails. The kernel answers nf_tables
/// requests synchronously, so this only guards against a broken kernel or socket.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// Send buffer asked for, so a batch of thousands of rules fits one datagram.
const SEND_BUFFER: usize = 4 << 20;

/// Attempts when a dump is interrupted by concurrent changes (`NLM_F_DUMP_INTR`).
const DUMP_ATTEMPTS: usize = 5;

/// A chain as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainInfo {
    /// Chain name.
    pub name: String,
    /// Kernel handle.
    pub handle: u64,
    /// Hook number and priority, for a base chain.
    pub hook: Option<(u32, i32)>,
    /// Chain type name (`nat`, `filter`, `route`), for a base chain.
    pub chain_type: Option<String>,
    /// Policy verdict code, for a base chain.
    pub policy: Option<u32>,
    /// Number of rules and references.
    pub use_count: u32,
}

impl ChainInfo {
    /// True when this chain is exactly `expected`: same name, and the same hook, priority,
    /// type and policy (or none of them, for a regular chain).
    pub fn matches(&self, expected: &Chain) -> bool {
        if self.name != expected.name {
            return false;
        }
        match &expected.base {
            None => self.hook.is_none() && self.chain_type.is_none(),
            Some(b) => {
                self.hook == Some((b.hook.raw(), b.priority))
                    && self.chain_type.as_deref() == Some(b.chain_type.as_str())
                    && self.policy == Some(b.policy.raw())
            }
        }
    }
}

impl std::fmt::Display for ChainInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "chain {}", self.name)?;
        if let Some((hook, prio)) = self.hook {
            let hook = Hook::from_raw(hook)
                .map(|h| format!("{h:?}").to_lowercase())
                .unwrap_or_else(|| hook.to_string());
            let ty = self.chain_type.as_deref().unwrap_or("?");
            let policy = match self.policy.and_then(Policy::from_raw) {
                Some(Policy::Accept) => "accept".to_string(),
                Some(Policy::Drop) => "drop".to_string(),
                None => format!("{:?}", self.policy),
            };
            write!(
                f,
                " {{ type {ty} hook {hook} priority {prio}; policy {policy}; }}"
            )?;
        }
        Ok(())
    }
}

/// A client for nf_tables in the current network namespace.
///
/// Cheap to keep: one socket (receive buffers: [`crate::netlink`]). Reuse it for the
/// read-back after a commit instead of opening another.
#[derive(Debug)]
pub struct Nft {
    fd: OwnedFd,
    seq: u32,
    rx: Receiver,
}

impl Nft {
    /// Opens a netfilter netlink socket in the calling thread's network namespace.
    pub fn open() -> Result<Nft, NftError> {
        let io = |op: &'static str| {
            move |e: nix::Error| NftError::Io {
                op,
                source: e.into(),
            }
        };
        let fd = socket::open(SockProtocol::NetlinkNetFilter).map_err(|(op, e)| {
            io(match op {
                "socket" => "socket(AF_NETLINK, NETLINK_NETFILTER)",
                other => other,
            })(e)
        })?;
        // Best effort: error messages from the kernel, and short error acks.
        let _ = socket::set_flag(&fd, NETLINK_EXT_ACK);
        let _ = socket::set_flag(&fd, NETLINK_CAP_ACK);
        let timeout = TimeVal::new(
            REPLY_TIMEOUT.as_secs() as libc::time_t,
            REPLY_TIMEOUT.subsec_micros() as libc::suseconds_t,
        );
        setsockopt(&fd, sockopt::ReceiveTimeout, &timeout)
            .map_err(io("setsockopt(SO_RCVTIMEO)"))?;
        // A batch must fit the send buffer in one datagram; allow large rule sets
        // (SO_SNDBUFFORCE needs CAP_NET_ADMIN, which nf_tables changes need anyway).
        if setsockopt(&fd, sockopt::SndBufForce, &SEND_BUFFER).is_err() {
            let _ = setsockopt(&fd, sockopt::SndBuf, &SEND_BUFFER);
        }
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(1);
        Ok(Nft {
            fd,
            seq: seed | 1,
            rx: Receiver::new(),
        })
    }

    fn take_seqs(&mut self, n: u32) -> u32 {
        let first = self.seq;
        self.seq = self.seq.wrapping_add(n);
        first
    }

    /// Sends `batch` as one transaction and waits for the kernel's verdict on every
    /// message. On failure nothing of the batch is applied; the error names the first
    /// message the kernel refused.
    pub fn commit(&mut self, batch: &Batch) -> Result<(), NftError> {
        if batch.is_empty() {
            return Ok(());
        }
        let n = batch.len() as u32;
        let first = self.take_seqs(n + 2);
        let last = first.wrapping_add(n);
        let encoded = batch.encode(first, Ack::Last);
        sys_send(&self.fd, &encoded).map_err(|e| match e {
            NftError::Io { source, .. } if source.raw_os_error() == Some(libc::EMSGSIZE) => {
                NftError::BatchTooLarge {
                    bytes: encoded.len(),
                    messages: batch.len(),
                }
            }
            other => other,
        })?;

        // The kernel handles the batch inside send(): its replies (an error for every
        // refused message, the ack of the last one) are queued by now. Wait for the last
        // message's reply; once something was refused, read only what is queued (a batch
        // refused at its begin marker never answers for the last message).
        let mut done = false;
        // (message index or None for the batch markers, errno, kernel message)
        let mut errors: Vec<(Option<usize>, i32, Option<String>)> = Vec::new();
        while !done {
            let flags = if errors.is_empty() {
                MsgFlags::empty()
            } else {
                MsgFlags::MSG_DONTWAIT
            };
            let got = match self.rx.recv(&self.fd, flags) {
                Ok(d) if d.is_empty() => break,
                Ok(d) => d,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && !errors.is_empty() => break,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    return Err(NftError::Timeout {
                        what: batch.describe(0).unwrap_or_else(|| "batch".into()),
                        timeout_ms: REPLY_TIMEOUT.as_millis() as u64,
                    })
                }
                Err(e) => {
                    return Err(NftError::Io {
                        op: "recv",
                        source: e,
                    })
                }
            };
            for msg in Messages::new(&got) {
                let msg = msg?;
                let rel = msg.seq.wrapping_sub(first);
                if rel > n + 1 || msg.ty != NLMSG_ERROR {
                    continue;
                }
                let (errno, text) = parse_error(&msg)?;
                if errno != 0 {
                    let idx = (1..=n).contains(&rel).then(|| (rel - 1) as usize);
                    errors.push((idx, errno, text));
                }
                if msg.seq == last {
                    done = true;
                }
            }
        }
        if let Some((idx, errno, message)) = errors.into_iter().next() {
            let what = match idx {
                Some(i) => batch
                    .describe(i)
                    .unwrap_or_else(|| "a batch message".into()),
                None => "the nf_tables batch".to_string(),
            };
            return Err(NftError::Kernel {
                what,
                errno,
                message,
            });
        }
        if !done {
            return Err(NftError::Malformed(
                "the kernel closed the reply stream before acknowledging the batch".into(),
            ));
        }
        Ok(())
    }

    /// Sends one non-batch request and collects the payloads (after `nfgenmsg`) of every
    /// data message it answers with, until `NLMSG_DONE` (dump) or the ack.
    fn request(
        &mut self,
        msg: u16,
        flags: u16,
        family: Family,
        what: &str,
        attrs: impl Fn(&mut AttrWriter<'_>),
    ) -> Result<Vec<Vec<u8>>, NftError> {
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        // A plain get without an ack request ends with its one reply (or an error).
        let single = !dump && flags & NLM_F_ACK == 0;
        for _ in 0..DUMP_ATTEMPTS {
            let seq = self.take_seqs(1);
            let mut req = Vec::with_capacity(128);
            put_header(
                &mut req,
                (NFNL_SUBSYS_NFTABLES << 8) | msg,
                NLM_F_REQUEST | flags,
                seq,
                family.raw(),
                0,
            );
            attrs(&mut AttrWriter::new(&mut req));
            finish_message(&mut req, 0);
            sys_send(&self.fd, &req)?;

            let mut out = Vec::new();
            let mut interrupted = false;
            'recv: loop {
                let got = match self.rx.recv(&self.fd, MsgFlags::empty()) {
                    Ok(d) => d,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        return Err(NftError::Timeout {
                            what: what.to_string(),
                            timeout_ms: REPLY_TIMEOUT.as_millis() as u64,
                        })
                    }
                    Err(e) => {
                        return Err(NftError::Io {
                            op: "recv",
                            source: e,
                        })
                    }
                };
                if got.is_empty() {
                    return Err(NftError::Malformed(format!("{what}: socket closed")));
                }
                for m in Messages::new(&got) {
                    let m = m?;
                    if m.seq != seq {
                        continue;
                    }
                    if m.flags & NLM_F_DUMP_INTR != 0 {
                        interrupted = true;
                    }
                    match m.ty {
                        NLMSG_ERROR => {
                            let (errno, message) = parse_error(&m)?;
                            if errno != 0 {
                                return Err(NftError::Kernel {
                                    what: what.to_string(),
                                    errno,
                                    message,
                                });
                            }
                            if !dump {
                                break 'recv;
                            }
                        }
                        NLMSG_DONE => {
                            if let Some(b) = m.payload.get(..4) {
                                let status = i32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
                                if status < 0 {
                                    return Err(NftError::Kernel {
                                        what: what.to_string(),
                                        errno: -status,
                                        message: None,
                                    });
                                }
                            }
                            break 'recv;
                        }
                        NLMSG_NOOP => {}
                        _ => {
                            let body = m.payload.get(NFGENMSG_LEN..).ok_or_else(|| {
                                NftError::Malformed(format!("{what}: reply shorter than nfgenmsg"))
                            })?;
                            out.push(body.to_vec());
                            if single {
                                break 'recv;
                            }
                        }
                    }
                }
            }
            if !interrupted {
                return Ok(out);
            }
        }
        Err(NftError::DumpInterrupted {
            what: what.to_string(),
        })
    }

    /// The table `<family> <name>`, or `None` when it does not exist.
    pub fn table(&mut self, family: Family, name: &str) -> Result<Option<TableInfo>, NftError> {
        let what = format!("get table {family} {name}");
        // No ack requested: the reply (or the error) is the answer, one read instead of two.
        let replies = match self.request(NFT_MSG_GETTABLE, 0, family, &what, |w| {
            w.string(NFTA_TABLE_NAME, name)
        }) {
            Ok(r) => r,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e),
        };
        let Some(body) = replies.first() else {
            return Ok(None);
        };
        let mut t = TableInfo {
            name: String::new(),
            family,
            flags: 0,
            handle: 0,
            use_count: 0,
        };
        for a in Attrs::new(body) {
            let a = a?;
            match a.ty {
                NFTA_TABLE_NAME => t.name = a.string()?,
                NFTA_TABLE_FLAGS => t.flags = a.be32()?,
                NFTA_TABLE_USE => t.use_count = a.be32()?,
                NFTA_TABLE_HANDLE => t.handle = a.be64()?,
                _ => {}
            }
        }
        Ok(Some(t))
    }

    /// Every chain of table `<family> <table>`, in the kernel's order (empty when the
    /// table does not exist).
    pub fn chains(&mut self, family: Family, table: &str) -> Result<Vec<ChainInfo>, NftError> {
        let what = format!("list chains of table {family} {table}");
        let replies = self.request(NFT_MSG_GETCHAIN, NLM_F_DUMP, family, &what, |w| {
            w.string(NFTA_CHAIN_TABLE, table)
        })?;
        let mut chains = Vec::with_capacity(replies.len());
        for body in replies {
            let mut c = ChainInfo {
                name: String::new(),
                handle: 0,
                hook: None,
                chain_type: None,
                policy: None,
                use_count: 0,
            };
            let mut in_table = true;
            for a in Attrs::new(&body) {
                let a = a?;
                match a.ty {
                    NFTA_CHAIN_TABLE => in_table = a.string()? == table,
                    NFTA_CHAIN_NAME => c.name = a.string()?,
                    NFTA_CHAIN_HANDLE => c.handle = a.be64()?,
                    NFTA_CHAIN_POLICY => c.policy = Some(a.be32()?),
                    NFTA_CHAIN_TYPE => c.chain_type = Some(a.string()?),
                    NFTA_CHAIN_USE => c.use_count = a.be32()?,
                    NFTA_CHAIN_HOOK => {
                        let (mut num, mut prio) = (None, None);
                        for h in a.nested() {
                            let h = h?;
                            match h.ty {
                                NFTA_HOOK_HOOKNUM => num = Some(h.be32()?),
                                NFTA_HOOK_PRIORITY => prio = Some(h.be32()? as i32),
                                _ => {}
                            }
                        }
                        if let (Some(n), Some(p)) = (num, prio) {
                            c.hook = Some((n, p));
                        }
                    }
                    _ => {}
                }
            }
            if in_table {
                chains.push(c);
            }
        }
        Ok(chains)
    }

    /// Every rule of table `<family> <table>` (of one chain when `chain` is given), in
    /// chain order, with handles, tags and decoded expressions. Empty when the table
    /// does not exist.
    pub fn rules(
        &mut self,
        family: Family,
        table: &str,
        chain: Option<&str>,
    ) -> Result<Vec<Rule>, NftError> {
        let what = match chain {
            Some(c) => format!("list rules of chain {family} {table} {c}"),
            None => format!("list rules of table {family} {table}"),
        };
        let replies = self.request(NFT_MSG_GETRULE, NLM_F_DUMP, family, &what, |w| {
            w.string(NFTA_RULE_TABLE, table);
            if let Some(c) = chain {
                w.string(NFTA_RULE_CHAIN, c);
            }
        })?;
        let mut rules = Vec::with_capacity(replies.len());
        for body in replies {
            let (in_table, rule) = decode_rule(&body)?;
            if in_table == table && chain.is_none_or(|c| c == rule.chain) {
                rules.push(rule);
            }
        }
        Ok(rules)
    }

    /// Deletes table `<family> <name>` with everything in it. `Ok(false)` when it did not
    /// exist.
    pub fn delete_table(&mut self, family: Family, name: &str) -> Result<bool, NftError> {
        let mut b = Batch::new();
        b.delete_table(family, name);
        match self.commit(&b) {
            Ok(()) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// Decodes a `NEWRULE` body (after `nfgenmsg`) into its table name and rule.
fn decode_rule(body: &[u8]) -> Result<(String, Rule), NftError> {
    let mut rule = Rule::new(String::new());
    let mut table = String::new();
    for a in Attrs::new(body) {
        let a = a?;
        match a.ty {
            NFTA_RULE_TABLE => table = a.string()?,
            NFTA_RULE_CHAIN => rule.chain = a.string()?,
            NFTA_RULE_HANDLE => rule.handle = Some(a.be64()?),
            NFTA_RULE_USERDATA => rule.userdata = Some(a.data.to_vec()),
            NFTA_RULE_EXPRESSIONS => {
                for e in a.nested() {
                    rule.exprs.push(Expr::decode(&e?)?);
                }
            }
            _ => {}
        }
    }
    Ok((table, rule))
}

/// Errno (positive, 0 for an ack) and the extended-ack message of an `NLMSG_ERROR`.
fn parse_error(msg: &Message<'_>) -> Result<(i32, Option<String>), NftError> {
    let p = msg.payload;
    if p.len() < 4 {
        return Err(NftError::Malformed("short netlink error message".into()));
    }
    let errno = -i32::from_ne_bytes([p[0], p[1], p[2], p[3]]);
    let mut text = None;
    if msg.flags & NLM_F_ACK_TLVS != 0 && p.len() >= 4 + NLMSG_HDRLEN {
        let orig_len = u32::from_ne_bytes([p[4], p[5], p[6], p[7]]) as usize;
        let echoed = if msg.flags & NLM_F_CAPPED != 0 {
            NLMSG_HDRLEN
        } else {
            orig_len
        };
        if let Some(tlvs) = p.get(4 + crate::attr::align(echoed)..) {
            for a in Attrs::new(tlvs).flatten() {
                if a.ty == NLMSGERR_ATTR_MSG {
                    text = a.string().ok();
                }
            }
        }
    }
    Ok((errno, text))
}

/// Sends one whole datagram to the kernel (an unconnected netlink socket sends to port 0).
fn sys_send(fd: &OwnedFd, buf: &[u8]) -> Result<(), NftError> {
    let sent = interlock_netlink::socket::send(fd, buf).map_err(|e| NftError::Io {
        op: "send",
        source: e.into(),
    })?;
    if sent != buf.len() {
        return Err(NftError::Malformed(format!(
            "netlink send wrote {sent} of {} bytes",
            buf.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::expr::{CmpOp, Register};
    use crate::rule::{IPPROTO_TCP, NFPROTO_IPV6};
    use crate::Verdict;

    fn sample_rules() -> Vec<Rule> {
        vec![
            Rule::new("outbound")
                .tag("il:out:1")
                .l4proto(IPPROTO_TCP)
                .skuid(1337)
                .verdict(Verdict::Return),
            Rule::new("outbound")
                .daddr("fd99:1::".parse().unwrap(), 61)
                .l4proto(IPPROTO_TCP)
                .dport_range(1000, 2000)
                .counter()
                .redirect_to_port(15001),
            Rule::new("output")
                .nfproto(NFPROTO_IPV6)
                .verdict(Verdict::Jump("outbound".into())),
            Rule::new("x")
                .expr(Expr::Range {
                    sreg: Register::R1,
                    op: crate::RangeOp::Neq,
                    from: vec![0, 1],
                    to: vec![0, 9],
                })
                .meta_cmp(crate::MetaKey::Mark, CmpOp::Gt, &[1, 0, 0, 0])
                .expr(Expr::Other {
                    name: "unknownexpr".into(),
                    data: vec![8, 0, 1, 0, 0, 0, 0, 7],
                }),
        ]
    }

    #[test]
    fn encoded_rules_decode_to_the_same_rules() {
        let rules = sample_rules();
        let mut b = Batch::new();
        for r in &rules {
            b.add_rule(Family::Inet, "interlock", r);
        }
        let bytes = b.encode(100, Ack::Each);
        let msgs: Vec<_> = Messages::new(&bytes).collect::<Result<_, _>>().unwrap();
        assert_eq!(msgs.len(), rules.len() + 2);
        assert_eq!(msgs[0].ty, NFNL_MSG_BATCH_BEGIN);
        assert_eq!(msgs.last().unwrap().seq, 100 + rules.len() as u32 + 1);
        for (m, r) in msgs[1..=rules.len()].iter().zip(&rules) {
            assert_eq!(
                m.flags,
                NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_APPEND
            );
            let (table, decoded) = decode_rule(&m.payload[NFGENMSG_LEN..]).unwrap();
            assert_eq!(table, "interlock");
            assert_eq!(&decoded, r, "{decoded}");
        }
    }

    #[test]
    fn error_messages_yield_errno_and_extack_text() {
        // NLMSG_ERROR, capped, with an NLMSGERR_ATTR_MSG TLV.
        let mut p = Vec::new();
        p.extend_from_slice(&(-libc::ENOENT).to_ne_bytes());
        p.extend_from_slice(&[0u8; NLMSG_HDRLEN]);
        AttrWriter::new(&mut p).string(NLMSGERR_ATTR_MSG, "No such chain");
        let m = Message {
            ty: NLMSG_ERROR,
            flags: NLM_F_CAPPED | NLM_F_ACK_TLVS,
            seq: 1,
            payload: &p,
        };
        assert_eq!(
            parse_error(&m).unwrap(),
            (libc::ENOENT, Some("No such chain".to_string()))
        );
        let e = NftError::Kernel {
            what: "add rule inet interlock outbound [il:out:3]".into(),
            errno: libc::ENOENT,
            message: Some("No such chain".into()),
        };
        let text = e.to_string();
        assert!(
            text.contains("[il:out:3]") && text.contains("No such chain"),
            "{text}"
        );
        assert!(e.is_not_found());
    }
}

//! Netlink message framing (`linux/netlink.h`): the 16-byte header, 4-byte alignment, and
//! the messages of one received datagram.

/// Bytes of `struct nlmsghdr`.
pub const NLMSG_HDRLEN: usize = 16;
/// An error or, with errno 0, an acknowledgement.
pub const NLMSG_ERROR: u16 = 0x2;
/// The end of a dump.
pub const NLMSG_DONE: u16 = 0x3;
/// A request.
pub const NLM_F_REQUEST: u16 = 0x1;
/// Part of a multipart reply.
pub const NLM_F_MULTI: u16 = 0x2;
/// Ask for an acknowledgement.
pub const NLM_F_ACK: u16 = 0x4;
/// A dump request (`NLM_F_ROOT | NLM_F_MATCH`).
pub const NLM_F_DUMP: u16 = 0x300;

/// `n` rounded up to netlink's 4-byte alignment.
pub const fn align(n: usize) -> usize {
    (n + 3) & !3
}

/// The header of a message of `len` bytes in all (header included).
pub fn header(len: usize, ty: u16, flags: u16, seq: u32) -> [u8; NLMSG_HDRLEN] {
    let mut h = [0u8; NLMSG_HDRLEN];
    h[..4].copy_from_slice(&(len as u32).to_ne_bytes());
    h[4..6].copy_from_slice(&ty.to_ne_bytes());
    h[6..8].copy_from_slice(&flags.to_ne_bytes());
    h[8..12].copy_from_slice(&seq.to_ne_bytes());
    // Port id 0: the kernel fills in the sender's.
    h
}

/// One netlink message in a received datagram.
#[derive(Debug, Clone, Copy)]
pub struct Message<'a> {
    /// `nlmsg_type`.
    pub ty: u16,
    /// `nlmsg_flags`.
    pub flags: u16,
    /// `nlmsg_seq`.
    pub seq: u32,
    /// What follows the header, up to the message's length.
    pub payload: &'a [u8],
}

/// A message whose length does not fit the datagram it arrived in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed {
    /// The length the header claims.
    pub claimed: usize,
    /// The bytes left in the datagram.
    pub received: usize,
}

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "netlink message claims {} bytes, {} received",
            self.claimed, self.received
        )
    }
}

impl std::error::Error for Malformed {}

/// The messages of one datagram, in order. A message whose length is shorter than a
/// header or longer than what is left ends the iteration with [`Malformed`]; trailing
/// bytes shorter than a header are ignored.
#[derive(Debug, Clone)]
pub struct Messages<'a> {
    rest: &'a [u8],
}

impl<'a> Messages<'a> {
    /// The messages of `datagram`.
    pub fn new(datagram: &'a [u8]) -> Messages<'a> {
        Messages { rest: datagram }
    }
}

impl<'a> Iterator for Messages<'a> {
    type Item = Result<Message<'a>, Malformed>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.len() < NLMSG_HDRLEN {
            return None;
        }
        let r = self.rest;
        let len = u32::from_ne_bytes([r[0], r[1], r[2], r[3]]) as usize;
        if len < NLMSG_HDRLEN || len > r.len() {
            self.rest = &[];
            return Some(Err(Malformed {
                claimed: len,
                received: r.len(),
            }));
        }
        let msg = Message {
            ty: u16::from_ne_bytes([r[4], r[5]]),
            flags: u16::from_ne_bytes([r[6], r[7]]),
            seq: u32::from_ne_bytes([r[8], r[9], r[10], r[11]]),
            payload: &r[NLMSG_HDRLEN..len],
        };
        self.rest = &r[align(len).min(r.len())..];
        Some(Ok(msg))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(ty: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut m = header(NLMSG_HDRLEN + payload.len(), ty, NLM_F_MULTI, seq).to_vec();
        m.extend_from_slice(payload);
        m.resize(align(m.len()), 0);
        m
    }

    #[test]
    fn a_datagram_splits_into_its_aligned_messages() {
        let mut d = message(16, 7, b"abcde");
        d.extend(message(NLMSG_DONE, 7, &[0; 4]));
        let got: Vec<_> = Messages::new(&d).collect::<Result<_, _>>().unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(
            (got[0].ty, got[0].seq, got[0].payload),
            (16, 7, &b"abcde"[..])
        );
        assert_eq!(got[0].flags, NLM_F_MULTI);
        assert_eq!((got[1].ty, got[1].payload.len()), (NLMSG_DONE, 4));
    }

    #[test]
    fn a_length_past_the_datagram_is_malformed_and_ends_it() {
        let mut d = message(16, 1, b"xy");
        d[0] = 200;
        let mut it = Messages::new(&d);
        assert_eq!(
            it.next().unwrap().unwrap_err(),
            Malformed {
                claimed: 200,
                received: d.len()
            }
        );
        assert!(it.next().is_none());
        assert_eq!(
            Malformed {
                claimed: 200,
                received: 20
            }
            .to_string(),
            "netlink message claims 200 bytes, 20 received"
        );
    }
}

//! Byte-level encoding checks against what `nft` 1.0.6 (libnftnl) sends for the same
//! ruleset. The fixture was captured on the development machine with
//! `strace -e trace=sendmsg -e write=3 nft -f tests/fixtures/nft-1.0.6-batch.nft`
//! (sequence numbers 0.., no acks, exactly as `nft` sent them).

use interlock_nft::{
    Ack, Batch, Chain, ChainType, CmpOp, Expr, Family, Hook, PayloadBase, Register, Rule, Verdict,
    IPPROTO_TCP, NFPROTO_IPV4,
};

const FIXTURE: &[u8] = include_bytes!("fixtures/nft-1.0.6-batch.bin");

fn split(buf: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = buf;
    while rest.len() >= 16 {
        let len = u32::from_ne_bytes(rest[..4].try_into().unwrap()) as usize;
        out.push(&rest[..len]);
        rest = &rest[(len + 3) & !3..];
    }
    out
}

fn batch_like_the_fixture() -> Batch {
    let t = "interlock";
    let f = Family::Inet;
    let mut b = Batch::new();
    b.add_table(f, t)
        .add_chain(
            f,
            t,
            &Chain::base("output", ChainType::Nat, Hook::Output, -100),
        )
        .add_chain(
            f,
            t,
            &Chain::base("prerouting", ChainType::Nat, Hook::Prerouting, -100),
        )
        .add_chain(f, t, &Chain::regular("outbound"));
    let rules = [
        Rule::new("output")
            .nfproto(NFPROTO_IPV4)
            .l4proto(IPPROTO_TCP)
            .verdict(Verdict::Jump("outbound".into())),
        Rule::new("outbound")
            .oifname("lo")
            .verdict(Verdict::Return)
            .tag("il:out:0"),
        Rule::new("outbound").skuid(1337).verdict(Verdict::Return),
        Rule::new("outbound").skgid(1337).verdict(Verdict::Return),
        Rule::new("prerouting")
            .iifname("eth1")
            .verdict(Verdict::Return),
        Rule::new("outbound")
            .daddr("10.96.0.0".parse().unwrap(), 12)
            .verdict(Verdict::Return),
        Rule::new("outbound")
            .daddr("fd99:1::".parse().unwrap(), 64)
            .verdict(Verdict::Return),
        // nft writes a port range as `cmp gte` + `cmp lte` (`Rule::dport_range` writes
        // one `range` expression instead; the kernel test reads that back).
        Rule::new("outbound")
            .l4proto(IPPROTO_TCP)
            .expr(Expr::Payload {
                base: PayloadBase::Transport,
                offset: 2,
                len: 2,
                dreg: Register::R1,
            })
            .expr(Expr::Cmp {
                sreg: Register::R1,
                op: CmpOp::Gte,
                data: 15000u16.to_be_bytes().to_vec(),
            })
            .expr(Expr::Cmp {
                sreg: Register::R1,
                op: CmpOp::Lte,
                data: 15100u16.to_be_bytes().to_vec(),
            })
            .verdict(Verdict::Return),
        Rule::new("outbound")
            .l4proto(IPPROTO_TCP)
            .dport(8080)
            .redirect_to_port(15001),
        Rule::new("outbound")
            .l4proto(IPPROTO_TCP)
            .redirect_to_port(15001),
        Rule::new("outbound").l4proto(IPPROTO_TCP).counter(),
    ];
    for r in &rules {
        b.add_rule(f, t, r);
    }
    b.delete_table(f, t);
    b
}

#[test]
fn batch_matches_nft_byte_for_byte() {
    let ours = batch_like_the_fixture().encode(0, Ack::None);
    let theirs = split(FIXTURE);
    let mine = split(&ours);
    assert_eq!(mine.len(), theirs.len(), "message count");
    for (i, (m, t)) in mine.iter().zip(&theirs).enumerate() {
        assert_eq!(
            m, t,
            "message {i} differs\n ours: {:02x?}\nnft's: {:02x?}",
            m, t
        );
    }
    assert_eq!(ours, FIXTURE);
}

#[test]
fn acked_batch_differs_only_in_the_ack_flag() {
    let b = batch_like_the_fixture();
    let plain = b.encode(7, Ack::None);
    let acked = b.encode(7, Ack::Each);
    let (p, a) = (split(&plain), split(&acked));
    assert_eq!(p.len(), b.len() + 2);
    for (i, (p, a)) in p.iter().zip(&a).enumerate() {
        let pf = u16::from_ne_bytes([p[6], p[7]]);
        let af = u16::from_ne_bytes([a[6], a[7]]);
        let is_marker = i == 0 || i == b.len() + 1;
        assert_eq!(af, if is_marker { pf } else { pf | 0x4 }, "message {i}");
        assert_eq!(p[8..], a[8..]);
        assert_eq!(
            u32::from_ne_bytes(p[8..12].try_into().unwrap()),
            7 + i as u32
        );
    }
    // Ack::Last: only the last content message asks for an ack.
    let last = b.encode(7, Ack::Last);
    let flags: Vec<u16> = split(&last)
        .iter()
        .map(|m| u16::from_ne_bytes([m[6], m[7]]) & 0x4)
        .collect();
    let mut want = vec![0u16; b.len() + 2];
    want[b.len()] = 0x4;
    assert_eq!(flags, want);
}

//! Replies larger than one page, and dumps larger than one datagram, read back whole
//! (root only; throwaway network namespaces). The receive buffer is shared and only
//! touched where a reply lands (`interlock_netlink::recv`); these show that nothing is cut.

use interlock_nft::{Batch, Chain, CmpOp, Family, MetaKey, Nft, Rule, Verdict};
use interlock_testkit::{require_root, Netns};

const T: &str = "ilbig";

/// One regular chain holding `rules`.
fn batch(rules: &[Rule]) -> Batch {
    let mut b = Batch::new();
    b.add_table(Family::Inet, T)
        .add_chain(Family::Inet, T, &Chain::regular("c"));
    for r in rules {
        b.add_rule(Family::Inet, T, r);
    }
    b
}

/// A rule of `pairs` meta-mark comparisons (two expressions each) and a verdict.
fn wide_rule(tag: &str, pairs: u32) -> Rule {
    let mut r = Rule::new("c").tag(tag);
    for i in 0..pairs {
        r = r.meta_cmp(MetaKey::Mark, CmpOp::Neq, &i.to_ne_bytes());
    }
    r.verdict(Verdict::Return)
}

fn assert_same(got: &[Rule], want: &[Rule]) {
    assert_eq!(got.len(), want.len(), "rule count");
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.tag_str(), w.tag_str());
        assert_eq!(g.exprs, w.exprs, "\nread back: {g}\nexpected: {w}");
    }
}

#[test]
fn a_dump_of_many_datagrams_reads_back_every_rule_in_order() {
    require_root!();
    let ns = Netns::new("nftbig").unwrap();
    // ~2,000 rules: far more than one 32 KiB dump datagram.
    let want: Vec<Rule> = (0..2000)
        .map(|i| wide_rule(&format!("il:big:{i}"), 1 + i % 4))
        .collect();
    let (fresh, reused) = ns.run(|| {
        Nft::open().unwrap().commit(&batch(&want)).unwrap();
        // A dump as the first request of a socket, then again on the same socket.
        let mut nft = Nft::open().unwrap();
        let fresh = nft.rules(Family::Inet, T, None).unwrap();
        let reused = nft.rules(Family::Inet, T, Some("c")).unwrap();
        (fresh, reused)
    });
    assert_same(&fresh, &want);
    assert_same(&reused, &want);
}

#[test]
fn a_rule_larger_than_a_page_reads_back_whole_with_the_rules_after_it() {
    require_root!();
    let ns = Netns::new("nftwide").unwrap();
    // 64 pairs + verdict + comment: 129 expressions' worth, above 5 KB in one message.
    let want = vec![
        Rule::new("c").tag("il:before").verdict(Verdict::Return),
        wide_rule("il:wide", 63),
        Rule::new("c").tag("il:after").verdict(Verdict::Return),
    ];
    let (first, fresh) = ns.run(|| {
        let mut nft = Nft::open().unwrap();
        nft.commit(&batch(&want)).unwrap();
        let first = nft.rules(Family::Inet, T, None).unwrap();
        let fresh = Nft::open().unwrap().rules(Family::Inet, T, None).unwrap();
        (first, fresh)
    });
    assert_same(&first, &want);
    assert_same(&fresh, &want);
}

//! Against the real kernel, inside throwaway network namespaces (root only): what this
//! crate commits is what `nft list ruleset` shows and what the read-back decodes.

use interlock_nft::{
    Ack, Batch, Chain, ChainType, Family, Hook, Nft, Rule, Verdict, IPPROTO_TCP, NFPROTO_IPV4,
    NFPROTO_IPV6, TABLE_F_DORMANT,
};
use interlock_testkit::{require_root, Netns};

const T: &str = "iltest";

fn chains() -> Vec<Chain> {
    vec![
        Chain::base("prerouting", ChainType::Nat, Hook::Prerouting, -100),
        Chain::base("output", ChainType::Nat, Hook::Output, -100),
        Chain::regular("outbound"),
    ]
}

fn rules() -> Vec<Rule> {
    vec![
        Rule::new("prerouting")
            .tag("il:pre:0")
            .iifname("veth9")
            .verdict(Verdict::Return),
        Rule::new("prerouting")
            .tag("il:pre:1")
            .l4proto(IPPROTO_TCP)
            .dport_range(15020, 15021)
            .verdict(Verdict::Return),
        Rule::new("prerouting")
            .tag("il:pre:2")
            .l4proto(IPPROTO_TCP)
            .redirect_to_port(15006),
        Rule::new("output")
            .tag("il:output:0")
            .l4proto(IPPROTO_TCP)
            .verdict(Verdict::Jump("outbound".into())),
        Rule::new("outbound")
            .tag("il:out:0")
            .oifname("lo")
            .verdict(Verdict::Return),
        Rule::new("outbound")
            .tag("il:out:1")
            .skuid(1337)
            .verdict(Verdict::Return),
        Rule::new("outbound")
            .tag("il:out:2")
            .skgid(1338)
            .verdict(Verdict::Return),
        Rule::new("outbound")
            .tag("il:out:3")
            .daddr("10.99.0.0".parse().unwrap(), 20)
            .verdict(Verdict::Return),
        Rule::new("outbound")
            .tag("il:out:4")
            .daddr("fd99:1::".parse().unwrap(), 64)
            .verdict(Verdict::Return),
        Rule::new("outbound")
            .tag("il:out:5")
            .nfproto(NFPROTO_IPV4)
            .l4proto(IPPROTO_TCP)
            .dport(8080)
            .counter()
            .redirect_to_port(15001),
        Rule::new("outbound")
            .tag("il:out:6")
            .nfproto(NFPROTO_IPV6)
            .l4proto(IPPROTO_TCP)
            .redirect_to_port(15001),
    ]
}

fn replace_batch() -> Batch {
    let mut b = Batch::new();
    b.add_table(Family::Inet, T)
        .delete_table(Family::Inet, T)
        .add_table(Family::Inet, T);
    for c in chains() {
        b.add_chain(Family::Inet, T, &c);
    }
    for r in rules() {
        b.add_rule(Family::Inet, T, &r);
    }
    b
}

#[test]
fn committed_rules_are_what_nft_lists_and_what_reads_back() {
    require_root!();
    let ns = Netns::new("nftk").unwrap();
    let (table, chains_back, rules_back) = ns.run(|| {
        let mut nft = Nft::open().unwrap();
        assert!(nft.table(Family::Inet, T).unwrap().is_none());
        assert!(nft.rules(Family::Inet, T, None).unwrap().is_empty());
        nft.commit(&replace_batch()).unwrap();
        (
            nft.table(Family::Inet, T).unwrap(),
            nft.chains(Family::Inet, T).unwrap(),
            nft.rules(Family::Inet, T, None).unwrap(),
        )
    });
    let table = table.expect("table exists after commit");
    assert_eq!(table.name, T);
    assert_eq!(table.flags, 0);

    let expected_chains = chains();
    assert_eq!(chains_back.len(), expected_chains.len());
    for c in &expected_chains {
        assert!(
            chains_back.iter().any(|b| b.matches(c)),
            "chain {c:?} not found in {chains_back:?}"
        );
    }

    // Kernel order is per chain; compare chain by chain.
    let expected = rules();
    for chain in ["prerouting", "output", "outbound"] {
        let want: Vec<_> = expected.iter().filter(|r| r.chain == chain).collect();
        let got: Vec<_> = rules_back.iter().filter(|r| r.chain == chain).collect();
        assert_eq!(got.len(), want.len(), "rule count in {chain}");
        for (g, w) in got.iter().zip(&want) {
            assert!(g.handle.is_some());
            assert_eq!(g.tag_str(), w.tag_str());
            assert_eq!(g.exprs, w.exprs, "\nread back: {g}\nexpected: {w}");
        }
    }

    let listed = ns.exec_ok(&["nft", "list", "table", "inet", T]);
    for line in [
        "type nat hook prerouting priority dstnat; policy accept;",
        "type nat hook output priority -100; policy accept;",
        "iifname \"veth9\" return comment \"il:pre:0\"",
        "tcp dport 15020-15021 return comment \"il:pre:1\"",
        "meta l4proto tcp redirect to :15006 comment \"il:pre:2\"",
        "meta l4proto tcp jump outbound comment \"il:output:0\"",
        "oifname \"lo\" return comment \"il:out:0\"",
        "meta skuid 1337 return comment \"il:out:1\"",
        "meta skgid 1338 return comment \"il:out:2\"",
        "ip daddr 10.99.0.0/20 return comment \"il:out:3\"",
        "ip6 daddr fd99:1::/64 return comment \"il:out:4\"",
        "tcp dport 8080 counter packets 0 bytes 0 redirect to :15001 comment \"il:out:5\"",
        "meta nfproto ipv6 meta l4proto tcp redirect to :15001 comment \"il:out:6\"",
    ] {
        assert!(listed.contains(line), "missing {line:?} in:\n{listed}");
    }
    assert_eq!(
        listed.matches("comment \"il:").count(),
        expected.len(),
        "{listed}"
    );
}

#[test]
fn replacing_is_atomic_and_a_refused_batch_changes_nothing() {
    require_root!();
    let ns = Netns::new("nfta").unwrap();
    ns.run(|| {
        let mut nft = Nft::open().unwrap();
        nft.commit(&replace_batch()).unwrap();
        let first = nft.rules(Family::Inet, T, None).unwrap();

        // Same replace again: same rules, fresh handles (the table was recreated).
        nft.commit(&replace_batch()).unwrap();
        let second = nft.rules(Family::Inet, T, None).unwrap();
        assert_eq!(first.len(), second.len());
        for (a, b) in first.iter().zip(&second) {
            assert_eq!(a.exprs, b.exprs);
        }

        // A batch with a rule jumping to a missing chain before a valid last rule:
        // refused, naming that rule, and the earlier delete-table in the same batch did
        // not happen either.
        let mut bad = replace_batch();
        bad.add_rule(
            Family::Inet,
            T,
            &Rule::new("outbound")
                .tag("il:bad:0")
                .verdict(Verdict::Jump("nosuchchain".into())),
        )
        .add_rule(
            Family::Inet,
            T,
            &Rule::new("outbound")
                .tag("il:good:1")
                .verdict(Verdict::Return),
        );
        let err = nft.commit(&bad).unwrap_err();
        assert!(err.is_not_found(), "{err}");
        let text = err.to_string();
        assert!(text.contains("[il:bad:0]"), "{text}");
        let after = nft.rules(Family::Inet, T, None).unwrap();
        assert_eq!(
            after, second,
            "a refused batch must leave the old rules in place"
        );

        // create_table refuses an existing table, and with it the whole batch.
        let mut create = Batch::new();
        create
            .create_table(Family::Inet, T)
            .add_chain(Family::Inet, T, &Chain::regular("ilnew"));
        let err = nft.commit(&create).unwrap_err();
        assert_eq!(err.errno(), Some(libc_eexist()), "{err}");
        let has_new = |nft: &mut Nft| {
            nft.chains(Family::Inet, T)
                .unwrap()
                .iter()
                .any(|c| c.name == "ilnew")
        };
        assert!(!has_new(&mut nft));
        assert!(nft.delete_table(Family::Inet, T).unwrap());
        nft.commit(&create).unwrap();
        assert!(has_new(&mut nft));
    });
}

#[test]
fn table_lookup_sees_dormant_flag_and_delete_is_idempotent() {
    require_root!();
    let ns = Netns::new("nftd").unwrap();
    ns.exec_ok(&[
        "nft", "add", "table", "inet", T, "{", "flags", "dormant", ";", "}",
    ]);
    ns.run(|| {
        let mut nft = Nft::open().unwrap();
        let t = nft.table(Family::Inet, T).unwrap().unwrap();
        assert_eq!(t.flags & TABLE_F_DORMANT, TABLE_F_DORMANT);
        assert!(nft.table(Family::Ip, T).unwrap().is_none(), "other family");
        assert!(nft.delete_table(Family::Inet, T).unwrap());
        assert!(!nft.delete_table(Family::Inet, T).unwrap());
        assert!(nft.table(Family::Inet, T).unwrap().is_none());
    });
    let listed = ns.exec_ok(&["nft", "list", "ruleset"]);
    assert!(listed.trim().is_empty(), "{listed}");
}

#[test]
fn rules_altered_by_nft_read_back_differently() {
    require_root!();
    let ns = Netns::new("nftx").unwrap();
    ns.run(|| Nft::open().unwrap().commit(&replace_batch()).unwrap());
    // Someone inserts a foreign rule and replaces one of ours with different expressions.
    ns.exec_ok(&[
        "nft", "insert", "rule", "inet", T, "outbound", "meta", "mark", "1", "accept",
    ]);
    let handle = ns.run(|| {
        let mut nft = Nft::open().unwrap();
        let rules = nft.rules(Family::Inet, T, Some("outbound")).unwrap();
        assert_eq!(rules.len(), 8);
        assert_eq!(rules[0].tag_str(), None, "foreign rule first");
        assert!(rules.iter().all(|r| r.chain == "outbound"));
        rules
            .iter()
            .find(|r| r.tag_str() == Some("il:out:1"))
            .unwrap()
            .handle
            .unwrap()
    });
    ns.exec_ok(&[
        "nft",
        "replace",
        "rule",
        "inet",
        T,
        "outbound",
        "handle",
        &handle.to_string(),
        "meta",
        "skuid",
        "0",
        "return",
        "comment",
        "\"il:out:1\"",
    ]);
    ns.run(|| {
        let mut nft = Nft::open().unwrap();
        let rules = nft.rules(Family::Inet, T, Some("outbound")).unwrap();
        let r = rules
            .iter()
            .find(|r| r.tag_str() == Some("il:out:1"))
            .unwrap();
        let want = rules_by_tag("il:out:1");
        assert_ne!(
            r.exprs, want.exprs,
            "same tag, altered expressions must differ"
        );
    });
}

fn rules_by_tag(tag: &str) -> Rule {
    rules()
        .into_iter()
        .find(|r| r.tag_str() == Some(tag))
        .unwrap()
}

/// `EEXIST` on Linux (kept local: libc is not a dev-dependency of this test).
fn libc_eexist() -> i32 {
    17
}

#[test]
fn thousands_of_rules_commit_in_one_batch_and_dump_across_datagrams() {
    require_root!();
    let ns = Netns::new("nftbig").unwrap();
    let n = 3000u16;
    let got = ns.run(|| {
        let mut nft = Nft::open().unwrap();
        let mut b = Batch::new();
        b.create_table(Family::Inet, T)
            .add_chain(Family::Inet, T, &Chain::regular("ilbig"));
        for i in 0..n {
            b.add_rule(
                Family::Inet,
                T,
                &Rule::new("ilbig")
                    .tag(&format!("il:big:{i}"))
                    .daddr(std::net::Ipv4Addr::from(0x0a63_0000 + i as u32).into(), 32)
                    .l4proto(IPPROTO_TCP)
                    .dport(1000 + i)
                    .verdict(Verdict::Return),
            );
        }
        assert!(
            b.encode(0, Ack::Last).len() > 512 * 1024,
            "batch larger than a default send buffer"
        );
        nft.commit(&b).unwrap();
        nft.rules(Family::Inet, T, Some("ilbig")).unwrap()
    });
    assert_eq!(got.len(), n as usize);
    for (i, r) in got.iter().enumerate() {
        assert_eq!(r.tag_str(), Some(format!("il:big:{i}").as_str()));
    }
}

#[test]
fn range_and_ordered_comparisons_round_trip_through_the_kernel() {
    require_root!();
    use interlock_nft::{CmpOp, Expr, MetaKey, RangeOp, Register};
    let ns = Netns::new("nftr").unwrap();
    let rules = vec![
        Rule::new("ilc")
            .tag("il:r:0")
            .l4proto(IPPROTO_TCP)
            .expr(Expr::Payload {
                base: interlock_nft::PayloadBase::Transport,
                offset: 2,
                len: 2,
                dreg: Register::R1,
            })
            .expr(Expr::Range {
                sreg: Register::R1,
                op: RangeOp::Neq,
                from: 1000u16.to_be_bytes().to_vec(),
                to: 2000u16.to_be_bytes().to_vec(),
            })
            .verdict(Verdict::Accept),
        Rule::new("ilc")
            .tag("il:r:1")
            .meta_cmp(MetaKey::SkUid, CmpOp::Neq, &0u32.to_ne_bytes())
            .meta_cmp(MetaKey::L4Proto, CmpOp::Lt, &[17])
            .meta_cmp(MetaKey::L4Proto, CmpOp::Gt, &[1])
            .counter()
            .verdict(Verdict::Drop),
    ];
    let back = ns.run(|| {
        let mut nft = Nft::open().unwrap();
        let mut b = Batch::new();
        b.create_table(Family::Inet, T)
            .add_chain(Family::Inet, T, &Chain::regular("ilc"));
        for r in &rules {
            b.add_rule(Family::Inet, T, r);
        }
        nft.commit(&b).unwrap();
        nft.rules(Family::Inet, T, Some("ilc")).unwrap()
    });
    assert_eq!(back.len(), 2);
    for (b, r) in back.iter().zip(&rules) {
        assert_eq!(b.exprs, r.exprs, "\nread back: {b}\nexpected: {r}");
    }
    let listed = ns.exec_ok(&["nft", "list", "chain", "inet", T, "ilc"]);
    assert!(listed.contains("tcp dport != 1000-2000 accept"), "{listed}");
    assert!(listed.contains("meta skuid != 0"), "{listed}");
}

/// A batch larger than one netlink message may carry fails with an error that says so
/// (size and message count), not a bare "Message too long"; nothing is applied.
#[test]
fn an_oversized_batch_says_so() {
    require_root!();
    let ns = Netns::new("nftbig").unwrap();
    let mut b = Batch::new();
    b.add_table(Family::Inet, T);
    for c in chains() {
        b.add_chain(Family::Inet, T, &c);
    }
    for i in 0..40_000u32 {
        let rule = Rule::new("outbound")
            .tag(&format!("il:out:{i}"))
            .l4proto(IPPROTO_TCP)
            .dport((i % 65_000 + 1) as u16)
            .verdict(Verdict::Return);
        b.add_rule(Family::Inet, T, &rule);
    }
    let e = ns.run(|| Nft::open().unwrap().commit(&b)).unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(e, interlock_nft::NftError::BatchTooLarge { messages, .. } if messages == 40_004)
            && text.contains("too many rules at once"),
        "{text}"
    );
    let tables = ns.exec_ok(&["nft", "list", "tables"]);
    assert!(!tables.contains(T), "{tables}");
}

/// The expressions the mesh profiles added (source matches, negations, DNS over UDP,
/// conntrack zones and state) commit, list as `nft` writes them, and read back equal.
#[test]
fn source_negation_and_conntrack_expressions_round_trip() {
    use interlock_nft::IPPROTO_UDP;
    require_root!();
    let ns = Netns::new("nftct").unwrap();
    let chains = [
        Chain::base("raw_out", ChainType::Filter, Hook::Output, -300),
        Chain::base("mangle_pre", ChainType::Filter, Hook::Prerouting, -150),
        Chain::base("output", ChainType::Nat, Hook::Output, -100),
    ];
    let rules = vec![
        Rule::new("raw_out")
            .tag("il:z:0")
            .l4proto(IPPROTO_UDP)
            .dport(53)
            .skuid(1337)
            .ct_zone_set(1),
        Rule::new("raw_out")
            .tag("il:z:1")
            .l4proto(IPPROTO_UDP)
            .sport(15053)
            .ct_zone_set(2),
        Rule::new("mangle_pre")
            .tag("il:m:0")
            .ct_state_invalid()
            .verdict(Verdict::Drop),
        Rule::new("output")
            .tag("il:o:0")
            .oifname("lo")
            .saddr("127.0.0.6".parse().unwrap(), 32)
            .verdict(Verdict::Return),
        Rule::new("output")
            .tag("il:o:1")
            .oifname("lo")
            .daddr_not("::1".parse().unwrap())
            .l4proto(IPPROTO_TCP)
            .dport_not(&[53, 15008])
            .skuid(1337)
            .redirect_to_port(15006),
        Rule::new("output")
            .tag("il:o:2")
            .oifname("lo")
            .skuid_not(1337)
            .verdict(Verdict::Return),
        Rule::new("output")
            .tag("il:o:3")
            .saddr("fd99::".parse().unwrap(), 16)
            .verdict(Verdict::Return),
    ];
    let mut b = Batch::new();
    b.add_table(Family::Inet, T);
    for c in &chains {
        b.add_chain(Family::Inet, T, c);
    }
    for r in &rules {
        b.add_rule(Family::Inet, T, r);
    }
    let back = ns.run(|| {
        let mut nft = Nft::open().unwrap();
        nft.commit(&b).unwrap();
        nft.rules(Family::Inet, T, None).unwrap()
    });
    for w in &rules {
        let g = back
            .iter()
            .find(|g| g.tag_str() == w.tag_str())
            .unwrap_or_else(|| panic!("{w} not read back"));
        assert_eq!(g.exprs, w.exprs, "\nread back: {g}\nexpected: {w}");
    }
    let listed = ns.exec_ok(&["nft", "list", "table", "inet", T]);
    for line in [
        "udp dport 53 meta skuid 1337 ct zone set 1 comment \"il:z:0\"",
        "udp sport 15053 ct zone set 2 comment \"il:z:1\"",
        "ct state invalid drop comment \"il:m:0\"",
        "oifname \"lo\" ip saddr 127.0.0.6 return comment \"il:o:0\"",
        "oifname \"lo\" ip6 daddr != ::1 tcp dport != 53 tcp dport != 15008 meta skuid 1337 redirect to :15006 comment \"il:o:1\"",
        "oifname \"lo\" meta skuid != 1337 return comment \"il:o:2\"",
        "ip6 saddr fd99::/16 return comment \"il:o:3\"",
    ] {
        assert!(listed.contains(line), "missing {line:?} in:\n{listed}");
    }
}

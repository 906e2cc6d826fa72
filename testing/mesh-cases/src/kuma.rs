//! Kuma cases: the nat table kuma-cni writes for a pod of the default transparent-proxy
//! configuration, written from the facts in `research/guard-mode.md` §A.4.4, which reads
//! kumahq/kuma `pkg/transparentproxy/iptables/builder/builder_table_nat.go` (the chains and
//! the order of the outbound rules) and `pkg/transparentproxy/consts/consts.go` (ports,
//! UID). kuma-cni loads the table with `iptables-restore` inside the pod netns
//! (`app/cni/pkg/cni/injector_linux.go`, `pkg/transparentproxy/iptables/setup.go`).
//!
//! What the sheet gives as fact: the four chains, the comment prefix, the outbound order
//! (passthrough source, the proxy's own loopback connections to the inbound redirect,
//! other owners on `lo`, the proxy UID, 127.0.0.1, then redirect to 15001) and the inbound
//! redirect to 15006. **Inference**: the inbound side as one jump from PREROUTING to a
//! chain that redirects every TCP connection (the sheet lists no inbound exclusions by
//! default besides the probe proxy port 9000, which is excluded only when the app probe
//! proxy is enabled), and the exact comment texts after the prefix.

use crate::{ann, pod_facts, Case, Mesh, MeshRules};

const SOURCE: &str = "kumahq/kuma pkg/transparentproxy/iptables/builder/builder_table_nat.go, \
                      pkg/transparentproxy/consts/consts.go (research/guard-mode.md §A.4.4)";

/// Under which condition kuma-cni writes IPv6 rules (guard-mode.md §A.4.4 "Families").
const V6_CONDITION: &str = "ipFamilyMode not ipv4 and any non-loopback IPv6 address in the pod netns, \
                            ::6/128 added to lo, ip6tables initialised; silently IPv4-only otherwise";

/// The annotation holding the whole transparent-proxy configuration (YAML) the injector
/// writes (`pkg/transparentproxy/kubernetes/kubernetes_config.go` `ConfigToAnnotations`);
/// kuma-cni fails ADD without it.
pub const CONFIG_ANNOTATION: &str = "traffic.kuma.io/transparent-proxy-config";
/// The injector's mark on a meshed pod (`pkg/plugins/runtime/k8s/metadata/annotations.go`).
pub const INJECTED_ANNOTATION: &str = "kuma.io/sidecar-injected";

/// A default configuration as the annotation carries it. The key names are the sheet's
/// (ports, `kumaDPUser`); their nesting is an assumption of this case, and the stand-in
/// reads no more than the presence of the annotation.
const DEFAULT_CONFIG_YAML: &str = "kumaDPUser: \"5678\"\nipFamilyMode: dualstack\n\
redirect:\n  inbound:\n    enabled: true\n    port: 15006\n  outbound:\n    enabled: true\n    port: 15001\n\
  dns:\n    enabled: false\n    port: 15053\n";

/// The nat table for proxy UID `uid`, outbound port `out`, inbound port `inb`, with
/// loopback `lo_src`/`lo_dst` (127.0.0.6/127.0.0.1 or ::6/::1).
fn nat_table(uid: u32, out: u16, inb: u16, lo_src: &str, lo_dst: &str) -> String {
    const C: &str = "kuma/mesh/transparent/proxy";
    format!(
        "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n\
:KUMA_MESH_INBOUND - [0:0]\n:KUMA_MESH_INBOUND_REDIRECT - [0:0]\n:KUMA_MESH_OUTBOUND - [0:0]\n:KUMA_MESH_OUTBOUND_REDIRECT - [0:0]\n\
-A PREROUTING -p tcp -m comment --comment \"{C}/prerouting/inbound\" -j KUMA_MESH_INBOUND\n\
-A OUTPUT -p tcp -m comment --comment \"{C}/output/outbound\" -j KUMA_MESH_OUTBOUND\n\
-A KUMA_MESH_INBOUND -p tcp -m comment --comment \"{C}/inbound/redirect\" -j KUMA_MESH_INBOUND_REDIRECT\n\
-A KUMA_MESH_INBOUND_REDIRECT -p tcp -m comment --comment \"{C}/inbound-redirect\" -j REDIRECT --to-ports {inb}\n\
-A KUMA_MESH_OUTBOUND -s {lo_src} -o lo -m comment --comment \"{C}/outbound/passthrough\" -j RETURN\n\
-A KUMA_MESH_OUTBOUND ! -d {lo_dst} -o lo -p tcp -m owner --uid-owner {uid} -m comment --comment \"{C}/outbound/proxy-to-self\" -j KUMA_MESH_INBOUND_REDIRECT\n\
-A KUMA_MESH_OUTBOUND -o lo -m owner ! --uid-owner {uid} -m comment --comment \"{C}/outbound/lo-others\" -j RETURN\n\
-A KUMA_MESH_OUTBOUND -m owner --uid-owner {uid} -m comment --comment \"{C}/outbound/proxy\" -j RETURN\n\
-A KUMA_MESH_OUTBOUND -d {lo_dst} -m comment --comment \"{C}/outbound/localhost\" -j RETURN\n\
-A KUMA_MESH_OUTBOUND -p tcp -m comment --comment \"{C}/outbound/redirect\" -j KUMA_MESH_OUTBOUND_REDIRECT\n\
-A KUMA_MESH_OUTBOUND_REDIRECT -p tcp -m comment --comment \"{C}/outbound-redirect\" -j REDIRECT --to-ports {out}\n\
COMMIT\n"
    )
}

/// Every Kuma case.
pub fn cases() -> Vec<Case> {
    let uid = 5678;
    vec![Case {
        mesh: Mesh::Kuma,
        name: "default".into(),
        source: SOURCE.into(),
        mapping: "kuma.io/sidecar-injected \"true\", the transparent-proxy config annotation with \
                  the defaults (outbound 15001, inbound 15006, kumaDPUser 5678, DNS off)"
            .into(),
        annotations: ann(&[
            (INJECTED_ANNOTATION, "true"),
            (CONFIG_ANNOTATION, DEFAULT_CONFIG_YAML),
        ]),
        facts: pod_facts(
            "kuma-validation",
            "kuma-sidecar",
            Some(uid.into()),
            Some(uid.into()),
            &[],
            &[],
        ),
        v4: MeshRules::Restore(nat_table(uid, 15001, 15006, "127.0.0.6/32", "127.0.0.1/32")),
        v6: MeshRules::Restore(nat_table(uid, 15001, 15006, "::6/128", "::1/128")),
        v6_condition: V6_CONDITION.into(),
        proxy_uid: uid,
        proxy_gid: Some(uid),
        extra_ports: vec![],
    }]
}

/// Kuma configurations that have no case.
pub fn not_mapped() -> Vec<(&'static str, &'static str)> {
    vec![(
        "pkg/transparentproxy/iptables/builder/builder_table_nat.go",
        "DNS redirection, excluded ports/IPs, the app probe proxy and the VNet options: \
         only the default table is written from the fact sheet so far",
    )]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_table_has_the_sheets_outbound_order() {
        let c = &cases()[0];
        let MeshRules::Restore(t) = &c.v4 else {
            panic!("v4 written")
        };
        let out: Vec<&str> = t
            .lines()
            .filter(|l| l.starts_with("-A KUMA_MESH_OUTBOUND "))
            .collect();
        assert_eq!(out.len(), 6, "{t}");
        assert!(out[0].contains("-s 127.0.0.6/32 -o lo") && out[0].ends_with("RETURN"));
        assert!(
            out[1].contains("--uid-owner 5678") && out[1].ends_with("KUMA_MESH_INBOUND_REDIRECT")
        );
        assert!(out[2].contains("! --uid-owner 5678") && out[2].ends_with("RETURN"));
        assert!(out[3].contains("--uid-owner 5678") && out[3].ends_with("RETURN"));
        assert!(out[4].contains("-d 127.0.0.1/32") && out[4].ends_with("RETURN"));
        assert!(out[5].ends_with("KUMA_MESH_OUTBOUND_REDIRECT"));
        assert!(t.contains("REDIRECT --to-ports 15001") && t.contains("REDIRECT --to-ports 15006"));
        let MeshRules::Restore(t6) = &c.v6 else {
            panic!("v6 written")
        };
        assert!(!t6.contains("127.0.0."), "{t6}");
    }
}

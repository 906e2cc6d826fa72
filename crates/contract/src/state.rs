//! The records the plugin keeps under the state dir ([`crate::layout`]) that the agent
//! reads too: which attachment ([`AttachmentKey`]), and, per protected pod netns, what
//! interlock installed there and which attachments rely on it ([`NetnsRecord`]). The
//! netns is the unit of protection: rules live per netns, the runtime adds and deletes
//! attachments, so rules go only with their last live reference. Records change only
//! under the netns's lock (`interlock_redirect::netns_record`).

use serde::{Deserialize, Serialize};

use crate::config::BackendKind;

/// Identifies one attachment (what GC's `cni.dev/valid-attachments` lists).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AttachmentKey {
    /// `CNI_CONTAINERID`.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
}

impl std::fmt::Display for AttachmentKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.container_id, self.ifname)
    }
}

/// The rule shape this build writes: what the rules installed for a pod look like, given
/// the pod. It changes when a release renders different rules for the same pod (another
/// expression for the same match, a rule added for a mesh's behaviour, a spec derived
/// differently from the same pod), so that the audit can tell "written by another
/// release" from "damaged": a record of an older shape is judged by the capture its
/// rules still prove, never rewritten for its shape alone (a rewrite ends the pod's
/// connections); a record of a newer shape is left alone by an older agent.
///
/// 1: every record written before shapes were recorded (no `shape` field).
/// 2: the mesh-parity rules (Istio's loopback and DNS rules, Linkerd's inbound
///    skip-subnets, specs read from the pod's spec).
pub const RULE_SHAPE: u32 = 2;

fn first_shape() -> u32 {
    1
}

/// What interlock installed in one pod netns, and who relies on it:
/// `<stateDir>/netns/<dev>-<ino>.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetnsRecord {
    /// The namespace's identity (`<dev>-<ino>` of its nsfs file).
    pub netns_id: String,
    /// `CNI_NETNS` of the ADD that installed the rules.
    pub netns: String,
    /// The backend that installed them.
    pub backend: BackendKind,
    /// The installed spec, canonical JSON.
    pub spec: String,
    /// Its hash.
    pub spec_hash: String,
    /// What the probe proved when the rules were installed (or last re-applied).
    pub probe: Vec<String>,
    /// The attachment whose ADD installed (or last re-applied) and proved them.
    pub proven_by: AttachmentKey,
    /// Every attachment relying on the rules (sorted, unique).
    pub attachments: Vec<AttachmentKey>,
    /// When the record last changed (Unix ms).
    pub updated_at_ms: u64,
    /// The [`RULE_SHAPE`] of the build that wrote the rules (1 when absent: records from
    /// before shapes were recorded). Readers that do not know the field ignore it.
    #[serde(default = "first_shape")]
    pub shape: u32,
}

impl NetnsRecord {
    /// The references other than `except` that are live by `is_live` (for the plugin:
    /// the attachment's state exists, records this netns and says protected).
    pub fn live_refs(
        &self,
        except: &AttachmentKey,
        is_live: impl Fn(&AttachmentKey) -> bool,
    ) -> Vec<AttachmentKey> {
        self.attachments
            .iter()
            .filter(|k| *k != except && is_live(k))
            .cloned()
            .collect()
    }

    /// Adds `key` to the references (kept sorted and unique).
    pub fn add_ref(&mut self, key: &AttachmentKey) {
        if let Err(i) = self.attachments.binary_search(key) {
            self.attachments.insert(i, key.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(c: &str, i: &str) -> AttachmentKey {
        AttachmentKey {
            container_id: c.into(),
            ifname: i.into(),
        }
    }

    #[test]
    fn references_are_sorted_unique_and_filtered() {
        let mut r = NetnsRecord {
            netns_id: "4-1".into(),
            netns: "/var/run/netns/x".into(),
            backend: BackendKind::Nftables,
            spec: "{}".into(),
            spec_hash: "h".into(),
            probe: vec![],
            proven_by: key("a", "eth0"),
            attachments: vec![],
            updated_at_ms: 1,
            shape: RULE_SHAPE,
        };
        r.add_ref(&key("b", "net1"));
        r.add_ref(&key("a", "eth0"));
        r.add_ref(&key("b", "net1"));
        assert_eq!(r.attachments, [key("a", "eth0"), key("b", "net1")]);
        assert_eq!(r.live_refs(&key("a", "eth0"), |_| true), [key("b", "net1")]);
        assert!(r
            .live_refs(&key("a", "eth0"), |k| k.ifname == "eth0")
            .is_empty());
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["attachments"][1]["containerID"], "b");
        assert_eq!(v["backend"], "nftables");
        assert_eq!(key("c", "eth0").to_string(), "c/eth0");
        assert_eq!(v["shape"], RULE_SHAPE);
    }

    /// A record written before shapes were recorded (as the first release wrote them)
    /// reads as shape 1.
    #[test]
    fn a_record_without_a_shape_is_shape_one() {
        let old = r#"{"netnsId":"4-1","netns":"/var/run/netns/x","backend":"nftables",
            "spec":"{}","specHash":"h","probe":[],"provenBy":{"containerID":"a",
            "ifname":"eth0"},"attachments":[],"updatedAtMs":1}"#;
        let r: NetnsRecord = serde_json::from_str(old).unwrap();
        assert_eq!(r.shape, 1);
    }
}

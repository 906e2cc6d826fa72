//! The Kubernetes API access the agent needs, as RBAC rules: the one list that
//! `interlock manifests` grants and that the agent's tests check its requests against
//! (every verb it calls is granted, every granted verb is called).
//!
//! RBAC grants every node's agent the same cluster-wide verbs; the manifests' admission
//! policy ([`NODE_SCOPE_POLICY`]) narrows the writes to the agent's own Node and the pods
//! bound to its node. The Eviction subresource cannot be narrowed that way (an admission
//! policy sees the Eviction, not the pod), so it is granted apart ([`EVICT_RULES`]) and
//! only when the evict repair policy is chosen. What the agent reads in its own
//! namespace only (its DaemonSet, for uninstall-on-exit `when-deleted`) is a Role there
//! ([`AGENT_NAMESPACE_RULES`]), not part of the ClusterRole.

/// One RBAC rule: API group (`""` for core), resources, verbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// The API group (`""` is the core group).
    pub group: &'static str,
    /// Resources, subresources as `pods/eviction`.
    pub resources: &'static [&'static str],
    /// Verbs.
    pub verbs: &'static [&'static str],
}

/// What the agent's ClusterRole grants.
pub const AGENT_RULES: &[Rule] = &[
    // The pod cache (one watch field-selected to this node), the `unprotected` label,
    // and the delete repair policy (with a UID precondition).
    Rule {
        group: "",
        resources: &["pods"],
        verbs: &["get", "list", "watch", "patch", "delete"],
    },
    // The startup taint.
    Rule {
        group: "",
        resources: &["nodes"],
        verbs: &["get", "list", "watch", "patch"],
    },
    // The InterlockReady condition.
    Rule {
        group: "",
        resources: &["nodes/status"],
        verbs: &["patch"],
    },
    // Events on pods and on the node (series are patched).
    Rule {
        group: "events.k8s.io",
        resources: &["events"],
        verbs: &["create", "patch"],
    },
];

/// What the evict repair policy needs besides [`AGENT_RULES`], granted only with it (its
/// own ClusterRole): the Eviction subresource (PodDisruptionBudgets apply).
pub const EVICT_RULES: &[Rule] = &[Rule {
    group: "",
    resources: &["pods/eviction"],
    verbs: &["create"],
}];

/// What the agent's Role in its own namespace grants: reading its DaemonSet, to tell on
/// SIGTERM whether the DaemonSet is being deleted (uninstall-on-exit `when-deleted`).
/// Rendered always, whatever the setting, so that switching the setting in the
/// ConfigMap needs no RBAC change.
pub const AGENT_NAMESPACE_RULES: &[Rule] = &[Rule {
    group: "apps",
    resources: &["daemonsets"],
    verbs: &["get"],
}];

/// The name of the admission policy (and its binding) that limits each agent's writes
/// to its own node.
pub const NODE_SCOPE_POLICY: &str = "interlock-agent-node-scope";

/// Whether `AGENT_RULES` grants `verb` on `resource` in `group`.
pub fn grants(group: &str, resource: &str, verb: &str) -> bool {
    AGENT_RULES
        .iter()
        .any(|r| r.group == group && r.resources.contains(&resource) && r.verbs.contains(&verb))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_what_is_listed_and_nothing_else() {
        assert!(grants("", "pods", "watch"));
        assert!(
            !grants("", "pods/eviction", "create"),
            "only with the evict policy"
        );
        assert!(grants("events.k8s.io", "events", "patch"));
        assert!(!grants("", "pods", "create"));
        assert!(!grants("", "secrets", "get"));
        assert!(!grants("", "events", "create"), "core events are not used");
        assert!(
            !grants("apps", "daemonsets", "get"),
            "the agent's own namespace only (AGENT_NAMESPACE_RULES)"
        );
    }
}

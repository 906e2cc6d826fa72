//! The Kubernetes API access the agent needs, as RBAC rules: the one list that
//! `interlock manifests` grants and that the agent's tests check its requests against
//! (every verb it calls is granted, every granted verb is called).

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
    // The evict repair policy (PodDisruptionBudgets apply).
    Rule {
        group: "",
        resources: &["pods/eviction"],
        verbs: &["create"],
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
        assert!(grants("", "pods/eviction", "create"));
        assert!(grants("events.k8s.io", "events", "patch"));
        assert!(!grants("", "pods", "create"));
        assert!(!grants("", "secrets", "get"));
        assert!(!grants("", "events", "create"), "core events are not used");
    }
}

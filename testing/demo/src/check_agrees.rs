//! Whether `interlock check -o json` says what the connections showed: the node's
//! verdict against the pods' fate, and — when `check` lists the node's sandboxes — each
//! pod's verdict against its own traffic. `check` is the operator's word on a node; the
//! demo holds it to the independent check.

use serde_json::Value;

use crate::report::{PodOutcome, Protection, Started};

/// What `check` should say about the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expected {
    /// Every meshed pod runs redirected and the agent is ready: `protected`.
    Protected,
    /// Meshed pods run unprotected: `unprotected`.
    Unprotected,
}

impl Expected {
    fn word(self) -> &'static str {
        match self {
            Expected::Protected => "protected",
            Expected::Unprotected => "unprotected",
        }
    }
}

/// The sandbox verdict `check` should give a pod the connections judged.
fn expected_sandbox_verdict(p: &PodOutcome) -> Option<&'static str> {
    match p.protection() {
        Protection::Redirected => Some("protected"),
        Protection::Unprotected => Some("unprotected"),
        Protection::LeftAlone => Some("not-meshed"),
        // Disturbed: no verdict of check's makes that right; not started: not listed.
        Protection::Disturbed | Protection::NotStarted => None,
    }
}

/// Every way `check`'s JSON document differs from what was observed; empty when it
/// agrees.
pub fn disagreements(doc: &Value, expected: Expected, pods: &[PodOutcome]) -> Vec<String> {
    let mut out = Vec::new();
    let verdict = doc["verdict"].as_str().unwrap_or("(none)");
    if verdict != expected.word() {
        out.push(format!(
            "check says the node is {verdict}, the connections say {}",
            expected.word()
        ));
    }
    // `sandboxes` is null or absent when check did not list them.
    let Some(listed) = doc["sandboxes"].as_array() else {
        return out;
    };
    for p in pods {
        if !matches!(p.started, Started::Running(_)) {
            continue;
        }
        let name = p.spec.full_name();
        let entry = listed.iter().find(|s| s["pod"] == name.as_str());
        let said = entry.and_then(|s| s["verdict"].as_str());
        match (said, expected_sandbox_verdict(p)) {
            (None, _) => out.push(format!("check does not list the running pod {name}")),
            (Some(said), Some(want)) if said != want => out.push(format!(
                "{name}: check says {said}, the connections say {want}"
            )),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::{Landing, Traffic};
    use crate::node_box::PodView;
    use crate::pods::PODS;
    use serde_json::json;

    fn pod(i: usize, redirected: bool) -> PodOutcome {
        let l = if redirected {
            Landing::Proxy
        } else {
            Landing::Direct
        };
        PodOutcome {
            spec: PODS[i],
            started: Started::Running("10.0.0.2".into()),
            traffic: Some(Traffic {
                outbound: l.clone(),
                inbound: l,
            }),
            earlier_connection: None,
            view: PodView {
                unprotected_label: None,
                events: Vec::new(),
            },
        }
    }

    #[test]
    fn a_protected_node_with_every_pod_right_agrees() {
        let pods = [pod(0, true), pod(1, true), pod(2, false)];
        let doc = json!({"verdict": "protected", "sandboxes": [
            {"pod": "shop/web", "verdict": "protected"},
            {"pod": "shop/api", "verdict": "protected"},
            {"pod": "shop/db", "verdict": "not-meshed"},
        ]});
        assert_eq!(
            disagreements(&doc, Expected::Protected, &pods),
            Vec::<String>::new()
        );
        // Without a sandbox list only the node's verdict is compared.
        let doc = json!({"verdict": "protected", "sandboxes": null});
        assert!(disagreements(&doc, Expected::Protected, &pods).is_empty());
    }

    #[test]
    fn each_wrong_word_is_named() {
        let pods = [pod(0, false), pod(1, false), pod(2, false)];
        let doc = json!({"verdict": "protected", "sandboxes": [
            {"pod": "shop/web", "verdict": "protected"},
            {"pod": "shop/db", "verdict": "not-meshed"},
        ]});
        let d = disagreements(&doc, Expected::Unprotected, &pods);
        assert_eq!(
            d,
            [
                "check says the node is protected, the connections say unprotected",
                "shop/web: check says protected, the connections say unprotected",
                "check does not list the running pod shop/api",
            ]
        );
        let d = disagreements(&json!({}), Expected::Protected, &pods[..0]);
        assert_eq!(
            d,
            ["check says the node is (none), the connections say protected"]
        );
    }

    #[test]
    fn a_pod_that_never_started_need_not_be_listed() {
        let mut p = pod(0, false);
        p.started = Started::Failed("no IP".into());
        let doc = json!({"verdict": "unprotected", "sandboxes": []});
        assert!(disagreements(&doc, Expected::Unprotected, &[p]).is_empty());
    }
}

//! The agent socket protocol (`<stateDir>/agent.sock`, [`crate::layout::AGENT_SOCKET_FILE`]):
//! one JSON request line, one JSON response line, then close.
//!
//! Two operations (`op`), both in protocol version 1; operations are only ever added, and
//! an agent that does not know one answers `undecided` naming it:
//!
//! - `pod`, the plugin's lookup when the runtime passed no annotations:
//!   `{"v":1,"op":"pod","namespace":"default","name":"web-0","uid":"…"}`. Responses:
//!   `{"v":1,"status":"found","uid":"…","annotations":{…},"facts":{…}}` (`facts`: the
//!   pod spec's [`PodFacts`], when the agent has the spec), `{"v":1,"status":"notFound"}`,
//!   or `{"v":1,"status":"undecided","reason":"…"}` when the agent cannot answer with
//!   authority (for example its pod cache has not synced yet).
//!   A lookup made for an ADD may carry `"add":{"sandbox":…,"netns":…}`: an agent that takes
//!   it as the ADD's note answers `found` with `"noted":true`, and no note follows.
//! - `added` ([`AddedNote`]), the plugin's note after a successful ADD of a meshed pod:
//!   `{"v":1,"op":"added","sandbox":"<CNI_CONTAINERID>","netns":"<CNI_NETNS>"}`; the agent
//!   answers `{"v":1,"status":"noted"}` and audits that sandbox at once. Best effort: the
//!   plugin never waits long for it nor fails because of it.
//!
//! - `failed` ([`FailedNote`]), the plugin's note after an ADD it failed (the pod does not
//!   start) or let through unprotected (`failurePolicy: open`):
//!   `{"v":1,"op":"failed","sandbox":…,"netns":…,"namespace":…,"name":…,"outcome":"refused",
//!   "reason":"undecided","profile":"istio","code":11}`; the agent answers `noted` and
//!   counts it. Sent only on that path, so a pod that starts pays nothing for it; best
//!   effort like `added` (an older agent answers `undecided`, unknown op).
//!
//! Unknown fields are ignored both ways so either side can grow.
//!
//! The plugin trusts an answer only from a socket that root owns, in a directory root
//! owns, neither writable by group or others, served by a root process (`SO_PEERCRED`):
//! the server must create it so (mode 0600 or 0660 with a root group).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::pod::PodFacts;

/// Protocol version spoken by this build.
pub const PROTOCOL_VERSION: u32 = 1;

/// Which pod is being asked about, as the runtime names it in `CNI_ARGS`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRef {
    /// `K8S_POD_NAMESPACE`.
    pub namespace: String,
    /// `K8S_POD_NAME`.
    pub name: String,
    /// `K8S_POD_UID`, when the runtime sent it; a mismatch means a different pod of the
    /// same name (deleted and recreated) and is not an answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The `pod` operation.
pub const OP_POD: &str = "pod";
/// The `added` operation.
pub const OP_ADDED: &str = "added";

/// The plugin's note that an ADD for a meshed pod succeeded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddedNote {
    /// Protocol version.
    pub v: u32,
    /// Always [`OP_ADDED`].
    pub op: String,
    /// `CNI_CONTAINERID`: the sandbox ID.
    pub sandbox: String,
    /// `CNI_NETNS`.
    pub netns: String,
}

impl AddedNote {
    /// The note about `sandbox` in `netns`.
    pub fn new(sandbox: &str, netns: &str) -> AddedNote {
        AddedNote {
            v: PROTOCOL_VERSION,
            op: OP_ADDED.into(),
            sandbox: sandbox.into(),
            netns: netns.into(),
        }
    }
}

/// The `failed` operation.
pub const OP_FAILED: &str = "failed";

/// What became of a pod start the plugin did not protect ([`FailedNote::outcome`]).
pub mod outcome {
    /// The plugin could not decide (or not turn the annotations into rules) and failed
    /// the ADD before touching the pod's netns: fail closed by design.
    pub const REFUSED: &str = "refused";
    /// A protection step (netns, apply, verify, probe, state) failed and the ADD failed.
    pub const FAILED: &str = "failed";
    /// A step failed and the pod started anyway, without redirection (`failurePolicy:
    /// open`).
    pub const UNPROTECTED: &str = "unprotected";
}

/// The plugin's note about an ADD it did not protect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedNote {
    /// Protocol version.
    pub v: u32,
    /// Always [`OP_FAILED`].
    pub op: String,
    /// `CNI_CONTAINERID`.
    pub sandbox: String,
    /// `CNI_NETNS`.
    pub netns: String,
    /// The pod's namespace, when known.
    #[serde(default)]
    pub namespace: String,
    /// The pod's name, when known.
    #[serde(default)]
    pub name: String,
    /// One of [`outcome`].
    pub outcome: String,
    /// A short, stable reason: the decision that refused (`undecided`,
    /// `needs-pod-spec`, `invalid`) or the step that failed (`netns`, `apply`, …).
    pub reason: String,
    /// The profile that claimed the pod, or `unknown`.
    pub profile: String,
    /// The CNI error code the ADD returned (0 for `unprotected`: it succeeded).
    #[serde(default)]
    pub code: u32,
}

/// A request to the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Protocol version.
    pub v: u32,
    /// Operation; only `pod` exists.
    pub op: String,
    /// The pod asked about.
    #[serde(flatten)]
    pub pod: PodRef,
    /// The ADD this lookup is for: an agent that takes it as that ADD's note (as it
    /// takes an [`AddedNote`]) says so with `noted: true` in its `found` answer, and the
    /// plugin sends no note afterwards. Older agents ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add: Option<AddTarget>,
}

/// The sandbox and netns of the ADD a lookup is for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddTarget {
    /// `CNI_CONTAINERID`.
    pub sandbox: String,
    /// `CNI_NETNS`.
    pub netns: String,
}

/// The agent's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "camelCase")]
pub enum Response {
    /// The pod is known; all its annotations.
    Found {
        /// Protocol version.
        v: u32,
        /// The pod's UID.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        uid: Option<String>,
        /// The annotations.
        #[serde(default)]
        annotations: BTreeMap<String, String>,
        /// The facts of the pod's spec the profiles read, when the agent has the spec
        /// (its Kubernetes pod cache; the runtime's copy has none).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        facts: Option<PodFacts>,
        /// The lookup's `add` was taken as the ADD's note.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        noted: bool,
    },
    /// The agent knows with authority that no such pod exists on this node.
    NotFound {
        /// Protocol version.
        v: u32,
    },
    /// An [`AddedNote`] was taken.
    Noted {
        /// Protocol version.
        v: u32,
    },
    /// The agent cannot answer with authority.
    Undecided {
        /// Protocol version.
        v: u32,
        /// Why.
        reason: String,
    },
}

/// Server side: turns one request line into one response line using `lookup`.
/// Malformed requests get an `undecided` answer naming the problem, never a panic; an
/// `added` note is answered `undecided` (this server takes none; see [`answer_request`]).
pub fn answer_line(line: &str, lookup: impl FnOnce(&PodRef) -> Response) -> String {
    answer_request(line, lookup, |_| Response::Undecided {
        v: PROTOCOL_VERSION,
        reason: "this server takes no ADD notes".into(),
    })
}

/// Server side: [`answer_line`] that also takes `added` notes with `on_added` (a
/// `failed` note is answered `undecided`; see [`answer_notes`]).
pub fn answer_request(
    line: &str,
    lookup: impl FnOnce(&PodRef) -> Response,
    on_added: impl FnOnce(&AddedNote) -> Response,
) -> String {
    answer_notes(line, lookup, on_added, |_| Response::Undecided {
        v: PROTOCOL_VERSION,
        reason: "this server takes no failure notes".into(),
    })
}

/// Server side: [`answer_request`] that also takes `failed` notes with `on_failed`.
pub fn answer_notes(
    line: &str,
    lookup: impl FnOnce(&PodRef) -> Response,
    on_added: impl FnOnce(&AddedNote) -> Response,
    on_failed: impl FnOnce(&FailedNote) -> Response,
) -> String {
    let bad = |e: serde_json::Error| Response::Undecided {
        v: PROTOCOL_VERSION,
        reason: format!("bad request: {e}"),
    };
    let resp = match serde_json::from_str::<serde_json::Value>(line.trim()) {
        Err(e) => bad(e),
        // Another protocol version may mean other things by the same words: not an
        // answer of this one.
        Ok(v)
            if v.get("v").and_then(serde_json::Value::as_u64)
                != Some(u64::from(PROTOCOL_VERSION)) =>
        {
            Response::Undecided {
                v: PROTOCOL_VERSION,
                reason: format!(
                    "unsupported protocol version {} (this agent speaks {PROTOCOL_VERSION})",
                    v.get("v")
                        .map_or_else(|| "none".to_string(), |x| x.to_string())
                ),
            }
        }
        Ok(v) => match v.get("op").and_then(|o| o.as_str()) {
            Some(OP_POD) => match serde_json::from_value::<Request>(v) {
                Ok(req) => {
                    let mut resp = lookup(&req.pod);
                    if let (Response::Found { noted, .. }, Some(add)) = (&mut resp, &req.add) {
                        let note = AddedNote::new(&add.sandbox, &add.netns);
                        *noted = matches!(on_added(&note), Response::Noted { .. });
                    }
                    resp
                }
                Err(e) => bad(e),
            },
            Some(OP_ADDED) => match serde_json::from_value::<AddedNote>(v) {
                Ok(note) => on_added(&note),
                Err(e) => bad(e),
            },
            Some(OP_FAILED) => match serde_json::from_value::<FailedNote>(v) {
                Ok(note) => on_failed(&note),
                Err(e) => bad(e),
            },
            other => Response::Undecided {
                v: PROTOCOL_VERSION,
                reason: format!("unknown op {:?}", other.unwrap_or("")),
            },
        },
    };
    let mut s = serde_json::to_string(&resp).unwrap_or_else(|_| {
        r#"{"status":"undecided","v":1,"reason":"could not encode answer"}"#.to_string()
    });
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_have_their_wire_names() {
        let req = Request {
            v: PROTOCOL_VERSION,
            op: "pod".into(),
            pod: PodRef {
                namespace: "shop".into(),
                name: "cart-0".into(),
                uid: Some("u-1".into()),
            },
            add: None,
        };
        assert_eq!(
            serde_json::to_value(&req).unwrap(),
            serde_json::json!({"v": 1, "op": "pod", "namespace": "shop", "name": "cart-0", "uid": "u-1"})
        );
        let out = answer_line(&serde_json::to_string(&req).unwrap(), |p| {
            assert_eq!(p.to_string(), "shop/cart-0");
            Response::NotFound { v: 1 }
        });
        assert_eq!(out, "{\"status\":\"notFound\",\"v\":1}\n");
    }

    #[test]
    fn failure_notes_have_their_wire_names_and_reach_their_handler() {
        let note = FailedNote {
            v: PROTOCOL_VERSION,
            op: OP_FAILED.into(),
            sandbox: "sb1".into(),
            netns: "/run/netns/x".into(),
            namespace: "shop".into(),
            name: "cart-0".into(),
            outcome: outcome::REFUSED.into(),
            reason: "undecided".into(),
            profile: "unknown".into(),
            code: 11,
        };
        let line = serde_json::to_string(&note).unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&line).unwrap(),
            serde_json::json!({"v": 1, "op": "failed", "sandbox": "sb1", "netns": "/run/netns/x",
                "namespace": "shop", "name": "cart-0", "outcome": "refused",
                "reason": "undecided", "profile": "unknown", "code": 11})
        );
        let out = answer_notes(
            &line,
            |_| Response::NotFound { v: 1 },
            |_| Response::Undecided {
                v: 1,
                reason: "no".into(),
            },
            |n| {
                assert_eq!(n, &note);
                Response::Noted { v: 1 }
            },
        );
        assert_eq!(out, "{\"status\":\"noted\",\"v\":1}\n");
        // A server that counts no failures says so; the plugin only logs it.
        let out = answer_request(
            &line,
            |_| Response::NotFound { v: 1 },
            |_| Response::Noted { v: 1 },
        );
        assert!(
            out.contains("undecided") && out.contains("failure notes"),
            "{out}"
        );
    }

    #[test]
    fn bad_requests_get_an_undecided_answer() {
        let out = answer_line("not json", |_| Response::NotFound { v: 1 });
        assert!(
            out.contains("undecided") && out.contains("bad request"),
            "{out}"
        );
        let out = answer_line(
            r#"{"v":1,"op":"delete","namespace":"a","name":"b"}"#,
            |_| Response::NotFound { v: 1 },
        );
        assert!(out.contains("unknown op"), "{out}");
    }

    /// redteam-3 L-5: a request of another protocol version (or none) is not answered as
    /// version 1.
    #[test]
    fn another_protocol_version_is_not_answered_as_this_one() {
        for line in [
            r#"{"v":2,"op":"pod","namespace":"a","name":"b"}"#,
            r#"{"op":"pod","namespace":"a","name":"b"}"#,
            r#"{"v":"1","op":"pod","namespace":"a","name":"b"}"#,
        ] {
            let out = answer_line(line, |_| unreachable!("{line}"));
            assert!(
                out.contains("undecided") && out.contains("unsupported protocol version"),
                "{line}: {out}"
            );
        }
    }

    #[test]
    fn added_notes_are_taken_only_by_a_server_that_takes_them() {
        let note = serde_json::to_string(&AddedNote::new("sb-1", "/var/run/netns/cni-1")).unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&note).unwrap(),
            serde_json::json!({"v": 1, "op": "added", "sandbox": "sb-1", "netns": "/var/run/netns/cni-1"})
        );
        let out = answer_request(
            &note,
            |_| unreachable!(),
            |n| {
                assert_eq!(
                    (n.sandbox.as_str(), n.netns.as_str()),
                    ("sb-1", "/var/run/netns/cni-1")
                );
                Response::Noted {
                    v: PROTOCOL_VERSION,
                }
            },
        );
        assert_eq!(out, "{\"status\":\"noted\",\"v\":1}\n");
        let out = answer_line(&note, |_| unreachable!());
        assert!(
            out.contains("undecided") && out.contains("no ADD notes"),
            "{out}"
        );
        let out = answer_request(
            r#"{"v":1,"op":"added"}"#,
            |_| unreachable!(),
            |_| unreachable!(),
        );
        assert!(out.contains("bad request"), "{out}");
    }

    #[test]
    fn a_lookup_for_an_add_is_its_note_where_notes_are_taken() {
        let req = Request {
            v: PROTOCOL_VERSION,
            op: OP_POD.into(),
            pod: PodRef {
                namespace: "shop".into(),
                name: "cart-0".into(),
                uid: None,
            },
            add: Some(AddTarget {
                sandbox: "sb-1".into(),
                netns: "/var/run/netns/cni-1".into(),
            }),
        };
        let line = serde_json::to_string(&req).unwrap();
        assert!(line.contains(r#""add":{"sandbox":"sb-1""#), "{line}");
        let found = |_: &PodRef| Response::Found {
            v: 1,
            uid: None,
            annotations: Default::default(),
            facts: None,
            noted: false,
        };
        let mut taken = None;
        let out = answer_request(&line, found, |n| {
            taken = Some(n.sandbox.clone());
            Response::Noted { v: 1 }
        });
        assert!(out.contains(r#""noted":true"#), "{out}");
        assert_eq!(taken.as_deref(), Some("sb-1"));
        // A server that takes no notes answers without it; so does any other answer.
        assert!(!answer_line(&line, found).contains("noted"));
        let out = answer_request(&line, |_| Response::NotFound { v: 1 }, |_| unreachable!());
        assert!(!out.contains("noted"), "{out}");
    }
}

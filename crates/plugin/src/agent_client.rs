//! The client of the agent socket (`interlock_contract::agent_socket`: one JSON request
//! line, one JSON response line, then close): the plugin's one source for a pod's
//! annotations besides the runtime.
//!
//! Whoever answers decides whether a pod is meshed, so an answer counts only from a
//! socket nobody else could have put there: the socket file is owned by root and not
//! writable by group or others, so is its directory, and the process at the other end
//! (`SO_PEERCRED`) runs as root ([`connect_trusted`]). (A non-root caller, such as a
//! contributor's test run, also trusts its own user.)

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

pub use interlock_contract::agent_socket::AddTarget;
pub use interlock_contract::agent_socket::PodRef;
use interlock_contract::agent_socket::{Request, Response, PROTOCOL_VERSION};
use interlock_contract::pod::PodFacts;

/// A source's answer about one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodLookup {
    /// The pod exists; these are its annotations (empty when it has none).
    Found {
        /// The pod's UID as the source knows it.
        uid: Option<String>,
        /// All of the pod's annotations.
        annotations: BTreeMap<String, String>,
        /// The facts of its spec the profiles read, when the source has the spec.
        facts: Option<PodFacts>,
        /// The agent took the lookup as the ADD's note.
        noted: bool,
    },
    /// The source is authoritative and has no such pod (or one with another UID).
    NotFound,
}

/// Why a source could not answer.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    /// The agent socket could not be reached or answered badly.
    #[error("agent socket {socket}: {msg}")]
    Agent {
        /// Socket path.
        socket: String,
        /// What went wrong.
        msg: String,
    },
    /// The agent answered but does not know (its cache is not synced, no API access).
    #[error("agent socket {socket} could not decide for pod {pod}: {reason}")]
    AgentUndecided {
        /// Socket path.
        socket: String,
        /// The pod.
        pod: String,
        /// The agent's reason.
        reason: String,
    },
}

/// Keeps a lookup result only when the UIDs agree (or one side does not know it).
pub fn match_uid(pod: &PodRef, found_uid: Option<&str>) -> bool {
    match (pod.uid.as_deref(), found_uid) {
        (Some(want), Some(have)) => want.is_empty() || want == have,
        _ => true,
    }
}

/// A user whose socket and answer are trusted: root, or the caller itself.
fn trusted_uid(uid: u32) -> bool {
    uid == 0 || uid == nix::unistd::geteuid().as_raw()
}

/// Connects to `socket` after checking that nobody but root (see the module docs) could
/// have bound it, and that the peer runs as root. The error says which check failed.
pub fn connect_trusted(socket: &Path) -> Result<UnixStream, LookupError> {
    let err = |msg: String| LookupError::Agent {
        socket: socket.display().to_string(),
        msg,
    };
    let m = std::fs::symlink_metadata(socket).map_err(|e| err(format!("connect: {e}")))?;
    if !m.file_type().is_socket() {
        return Err(err("not a Unix socket (refused)".into()));
    }
    let writable_by_others = |mode: u32| mode & 0o022 != 0;
    if !trusted_uid(m.uid()) || writable_by_others(m.mode()) {
        return Err(err(format!(
            "refused: the socket is owned by uid {} with mode {:o}; only a root-owned socket that group and others cannot write is trusted",
            m.uid(),
            m.mode() & 0o7777
        )));
    }
    let dir = socket.parent().unwrap_or(Path::new("/"));
    let d = std::fs::metadata(dir).map_err(|e| err(format!("{}: {e}", dir.display())))?;
    if !trusted_uid(d.uid()) || writable_by_others(d.mode()) {
        return Err(err(format!(
            "refused: its directory {} is owned by uid {} with mode {:o}; anyone who can write it could replace the socket (make it root-owned, not group- or world-writable)",
            dir.display(),
            d.uid(),
            d.mode() & 0o7777
        )));
    }
    let stream = UnixStream::connect(socket).map_err(|e| err(format!("connect: {e}")))?;
    let peer = nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(|e| err(format!("SO_PEERCRED: {e}")))?;
    if !trusted_uid(peer.uid()) {
        return Err(err(format!(
            "refused: the process serving it (pid {}) runs as uid {}, not root",
            peer.pid(),
            peer.uid()
        )));
    }
    Ok(stream)
}

/// How long the ADD note may take, connect to send: it is best effort, and an ADD must
/// not wait on a slow agent.
pub const NOTE_TIMEOUT: Duration = Duration::from_millis(20);

/// Tells the agent at `socket` that the ADD of a meshed pod in sandbox `sandbox` (netns
/// `netns`) succeeded, so that it audits that sandbox at once
/// (`interlock_contract::agent_socket::AddedNote`). Best effort: only to a trusted
/// socket ([`connect_trusted`]), sending and waiting for the answer each bounded by
/// [`NOTE_TIMEOUT`], and every failure is returned for the log, never for the ADD.
pub fn note_added(socket: &Path, sandbox: &str, netns: &str) -> Result<(), LookupError> {
    send_note(
        socket,
        &interlock_contract::agent_socket::AddedNote::new(sandbox, netns),
    )
}

/// Tells the agent at `socket` about an ADD that failed, or let a meshed pod through
/// unprotected (`interlock_contract::agent_socket::FailedNote`), so it counts the pod
/// starts it refused by reason and profile. Sent only on that path; best effort, bounded
/// as [`note_added`].
pub fn note_failed(
    socket: &Path,
    note: &interlock_contract::agent_socket::FailedNote,
) -> Result<(), LookupError> {
    send_note(socket, note)
}

/// One note, connect to answer bounded by [`NOTE_TIMEOUT`] per step.
fn send_note(socket: &Path, note: &impl serde::Serialize) -> Result<(), LookupError> {
    let err = |msg: String| LookupError::Agent {
        socket: socket.display().to_string(),
        msg,
    };
    let mut stream = connect_trusted(socket)?;
    stream
        .set_write_timeout(Some(NOTE_TIMEOUT))
        .map_err(|e| err(e.to_string()))?;
    let mut line = serde_json::to_vec(note).map_err(|e| err(e.to_string()))?;
    line.push(b'\n');
    stream
        .write_all(&line)
        .map_err(|e| err(format!("send: {e}")))?;
    // Waiting for the answer (bounded) keeps the connection until the agent has taken the
    // note: a connection closed at once may be dropped unread by an agent at its cap.
    stream
        .set_read_timeout(Some(NOTE_TIMEOUT))
        .map_err(|e| err(e.to_string()))?;
    let mut answer = String::new();
    let _ = BufReader::new(&stream).read_line(&mut answer);
    match serde_json::from_str::<Response>(answer.trim()) {
        Ok(Response::Noted { .. }) => Ok(()),
        _ => Err(err(format!(
            "the note was not taken (answer {:?})",
            answer.trim()
        ))),
    }
}

/// Asks the agent at `socket` about `pod`, giving up after `timeout` in total; `add` names
/// the ADD the lookup is for, which the agent may take as its note. The answer counts
/// only from a trusted socket ([`connect_trusted`]).
pub fn query(
    socket: &Path,
    pod: &PodRef,
    add: Option<&AddTarget>,
    timeout: Duration,
) -> Result<PodLookup, LookupError> {
    let err = |msg: String| LookupError::Agent {
        socket: socket.display().to_string(),
        msg,
    };
    let mut stream = connect_trusted(socket)?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| err(e.to_string()))?;
    stream
        .set_write_timeout(Some(timeout))
        .map_err(|e| err(e.to_string()))?;
    let req = Request {
        v: PROTOCOL_VERSION,
        op: "pod".into(),
        pod: pod.clone(),
        add: add.cloned(),
    };
    let mut line = serde_json::to_vec(&req).map_err(|e| err(e.to_string()))?;
    line.push(b'\n');
    stream
        .write_all(&line)
        .map_err(|e| err(format!("send: {e}")))?;
    let mut answer = String::new();
    BufReader::new(&stream)
        .read_line(&mut answer)
        .map_err(|e| err(format!("no answer within {timeout:?}: {e}")))?;
    if answer.trim().is_empty() {
        return Err(err("closed the connection without answering".into()));
    }
    let resp: Response = serde_json::from_str(answer.trim())
        .map_err(|e| err(format!("bad answer {answer:?}: {e}")))?;
    match resp {
        Response::Found {
            uid,
            annotations,
            facts,
            noted,
            ..
        } => {
            if match_uid(pod, uid.as_deref()) {
                Ok(PodLookup::Found {
                    uid,
                    annotations,
                    facts,
                    noted,
                })
            } else {
                Ok(PodLookup::NotFound)
            }
        }
        Response::NotFound { .. } => Ok(PodLookup::NotFound),
        Response::Noted { .. } => Err(err("answered a lookup with a note's reply".into())),
        Response::Undecided { reason, .. } => Err(LookupError::AgentUndecided {
            socket: socket.display().to_string(),
            pod: pod.to_string(),
            reason,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use interlock_contract::agent_socket::answer_line;
    use std::os::unix::net::UnixListener;

    fn pod() -> PodRef {
        PodRef {
            namespace: "shop".into(),
            name: "cart-0".into(),
            uid: Some("u-1".into()),
        }
    }

    fn serve(
        dir: &Path,
        reply: impl Fn(&PodRef) -> Response + Send + 'static,
    ) -> std::path::PathBuf {
        let sock = dir.join("agent.sock");
        let l = UnixListener::bind(&sock).unwrap();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let mut s = s.unwrap();
                let mut line = String::new();
                BufReader::new(&s).read_line(&mut line).unwrap();
                let out = answer_line(&line, &reply);
                s.write_all(out.as_bytes()).unwrap();
            }
        });
        sock
    }

    #[test]
    fn found_notfound_undecided_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let sock = serve(dir.path(), |p| {
            if p.name == "cart-0" {
                Response::Found {
                    v: 1,
                    uid: Some("u-1".into()),
                    annotations: [("sidecar.istio.io/status".to_string(), "{}".to_string())].into(),
                    facts: None,
                    noted: false,
                }
            } else if p.name == "gone" {
                Response::NotFound { v: 1 }
            } else {
                Response::Undecided {
                    v: 1,
                    reason: "pod cache not synced".into(),
                }
            }
        });
        let t = Duration::from_secs(2);
        match query(&sock, &pod(), None, t).unwrap() {
            PodLookup::Found { annotations, .. } => {
                assert_eq!(annotations["sidecar.istio.io/status"], "{}")
            }
            other => panic!("{other:?}"),
        }
        let mut gone = pod();
        gone.name = "gone".into();
        assert_eq!(query(&sock, &gone, None, t).unwrap(), PodLookup::NotFound);
        let mut other = pod();
        other.name = "x".into();
        let e = query(&sock, &other, None, t).unwrap_err().to_string();
        assert!(
            e.contains("pod cache not synced") && e.contains("shop/x"),
            "{e}"
        );
        // Same name, other UID: a different pod.
        let mut recreated = pod();
        recreated.uid = Some("u-2".into());
        assert_eq!(
            query(&sock, &recreated, None, t).unwrap(),
            PodLookup::NotFound
        );
    }

    #[test]
    fn missing_socket_is_an_error_naming_it() {
        let e = query(
            Path::new("/nonexistent/il.sock"),
            &pod(),
            None,
            Duration::from_millis(100),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("/nonexistent/il.sock"), "{e}");
    }

    #[test]
    fn uid_mismatch_means_another_pod() {
        let mut pod = PodRef {
            namespace: "a".into(),
            name: "p".into(),
            uid: Some("u1".into()),
        };
        assert!(match_uid(&pod, Some("u1")));
        assert!(!match_uid(&pod, Some("u2")));
        assert!(match_uid(&pod, None));
        pod.uid = None;
        assert!(match_uid(&pod, Some("u2")));
        assert_eq!(pod.to_string(), "a/p");
    }
}

//! The agent socket (`<state dir>/agent.sock`): answers the plugin's "annotations of pod
//! X" when the runtime passed none, and takes its "ADD done for sandbox S" notes, which it
//! hands to the audit (protocol: `interlock_contract::agent_socket`, one JSON line each
//! way, versioned).
//!
//! The plugin trusts the answer only from a root-owned socket, mode 0600, in a directory
//! nobody else can write, served by a root peer: the server creates it so. Every
//! connection is bounded (a request line of at most [`MAX_REQUEST`] bytes, answered within
//! [`DEADLINE`]) and at most [`MAX_CONNECTIONS`] are served at once; past that a
//! connection is closed at once, so a flood cannot take the agent's descriptors.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use interlock_contract::agent_socket::{
    answer_notes, PodRef, Request, Response, OP_POD, PROTOCOL_VERSION,
};

use crate::health::metrics::PodStartMetrics;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;
use tokio::sync::Semaphore;

/// The longest request line read.
pub const MAX_REQUEST: u64 = 64 * 1024;
/// The time one connection may take, request and answer.
pub const DEADLINE: Duration = Duration::from_secs(2);
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 64;

/// Who answers "which annotations does pod X have".
pub trait PodSource: Send + Sync + 'static {
    /// The answer about `pod`.
    fn answer(&self, pod: &PodRef) -> Response;
}

impl PodSource for crate::kubernetes::pods::PodCache {
    fn answer(&self, pod: &PodRef) -> Response {
        crate::kubernetes::pods::PodCache::answer(self, pod)
    }
}

/// The source when the agent runs without a Kubernetes API: it cannot answer.
#[derive(Debug, Clone)]
pub struct NoSource(pub String);

impl PodSource for NoSource {
    fn answer(&self, _pod: &PodRef) -> Response {
        Response::Undecided {
            v: PROTOCOL_VERSION,
            reason: self.0.clone(),
        }
    }
}

/// How long the runtime may take to answer a fallback lookup (the plugin's own wait is
/// short: it retries, then fails closed).
const CRI_LOOKUP_TIMEOUT: Duration = Duration::from_millis(1500);

/// The second source of pod annotations: the container runtime's sandbox list. Asked
/// only when the first source cannot answer with authority (no Kubernetes API, or its
/// cache not synced yet). A sandbox's annotations are the pod's as they were when the
/// sandbox was created, which is what the runtime would have handed the plugin itself.
#[derive(Debug, Clone)]
pub struct CriFallback {
    /// The CRI endpoint (`unix:///run/containerd/containerd.sock`).
    pub endpoint: String,
}

impl CriFallback {
    /// Looks `pod` up in the runtime's sandboxes; `Undecided` with the reason when the
    /// runtime cannot be asked or lists no sandbox of that pod.
    pub async fn answer(&self, pod: &PodRef) -> Response {
        let undecided = |reason: String| Response::Undecided {
            v: PROTOCOL_VERSION,
            reason,
        };
        let ask = async {
            let client = interlock_cri::CriClient::connect(&self.endpoint).await?;
            client
                .list_sandboxes(&interlock_cri::SandboxFilter::default())
                .await
        };
        match tokio::time::timeout(CRI_LOOKUP_TIMEOUT, ask).await {
            Err(_) => undecided(format!(
                "the runtime at {} did not answer within {CRI_LOOKUP_TIMEOUT:?}",
                self.endpoint
            )),
            Ok(Err(e)) => undecided(format!("the runtime at {} failed: {e}", self.endpoint)),
            Ok(Ok(list)) => from_sandboxes(pod, &list),
        }
    }
}

/// The answer about `pod` from the runtime's sandboxes (pure): the newest sandbox of that
/// pod (the same namespace and name in its CRI metadata, and the same UID when the plugin
/// sent one). Never
/// `NotFound`: a runtime may list a sandbox only once its network is set up, so its
/// silence is no proof that the pod is not on this node.
pub fn from_sandboxes(pod: &PodRef, sandboxes: &[interlock_cri::SandboxSummary]) -> Response {
    let newest = sandboxes
        .iter()
        .filter(|s| s.metadata.namespace == pod.namespace && s.metadata.name == pod.name)
        .filter(|s| match pod.uid.as_deref() {
            Some(want) => want.is_empty() || s.metadata.uid.is_empty() || want == s.metadata.uid,
            None => true,
        })
        .max_by_key(|s| s.created_at_nanos);
    match newest {
        Some(s) => Response::Found {
            v: PROTOCOL_VERSION,
            uid: Some(s.metadata.uid.clone()).filter(|u| !u.is_empty()),
            annotations: s.annotations.clone(),
            // The runtime keeps the pod's annotations, never its spec.
            facts: None,
            noted: false,
        },
        None => Response::Undecided {
            v: PROTOCOL_VERSION,
            reason: format!("the runtime lists no sandbox of pod {pod} (yet)"),
        },
    }
}

/// Why the socket could not be served.
#[derive(Debug, thiserror::Error)]
#[error("agent socket {path}: {doing}: {source}")]
pub struct SocketError {
    /// The socket path.
    pub path: PathBuf,
    /// What was being done.
    pub doing: &'static str,
    /// The error.
    #[source]
    pub source: std::io::Error,
}

/// Binds `path` (replacing a stale socket left by an earlier agent, refusing to replace
/// anything that is not a socket) with mode 0600.
pub fn bind(path: &Path) -> Result<UnixListener, SocketError> {
    let err = |doing| {
        move |source| SocketError {
            path: path.to_path_buf(),
            doing,
            source,
        }
    };
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            std::fs::remove_file(path).map_err(err("removing the stale socket"))?
        }
        Ok(_) => {
            return Err(err("refusing to replace it")(std::io::Error::other(
                "it exists and is not a socket",
            )))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err("inspecting it")(e)),
    }
    // Created 0600 from the start: the umask cannot open a window in which another user
    // could connect.
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let listener = UnixListener::bind(path);
    nix::sys::stat::umask(old);
    let listener = listener.map_err(err("binding"))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(err("setting mode 0600"))?;
    Ok(listener)
}

/// Whether a client with `uid` (from `SO_PEERCRED`) may use the socket: root only, as the
/// plugin runs as root under the runtime.
pub fn peer_allowed(uid: u32) -> bool {
    uid == 0
}

/// Where the plugin's ADD notes go: the sandbox IDs, to the audit (a bounded queue).
pub type AddedNotes = tokio::sync::mpsc::Sender<String>;

/// Serves `listener` with `source` until the task is dropped; ADD notes go to `added`
/// (without it they are answered `undecided`), failure notes are counted in `starts`
/// (without it they are answered `undecided`).
pub async fn serve(
    listener: UnixListener,
    source: Arc<dyn PodSource>,
    fallback: Option<CriFallback>,
    added: Option<AddedNotes>,
    starts: Option<PodStartMetrics>,
) {
    let fallback = fallback.map(Arc::new);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(error = %e, "agent socket: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // Full: close at once rather than queue (the plugin retries, then fails closed).
            drop(stream);
            continue;
        };
        // Only root may ask or note (the socket is 0600 root; this holds even if its mode
        // were changed): anyone else is closed without an answer.
        match stream.peer_cred() {
            Ok(c) if peer_allowed(c.uid()) => {}
            Ok(c) => {
                tracing::warn!(uid = c.uid(), pid = %crate::health::telemetry::Json(c.pid()), "agent socket: refused a client that is not root");
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "agent socket: cannot read the client's credentials; refused");
                continue;
            }
        }
        let (source, fallback, added, starts) = (
            source.clone(),
            fallback.clone(),
            added.clone(),
            starts.clone(),
        );
        tokio::spawn(async move {
            let _slot = slot;
            let _ = tokio::time::timeout(DEADLINE, answer(stream, source, fallback, added, starts))
                .await;
        });
    }
}

fn not_running() -> Response {
    Response::Undecided {
        v: PROTOCOL_VERSION,
        reason: "the agent's audit is not running (--cri-endpoint none)".into(),
    }
}

async fn answer(
    stream: tokio::net::UnixStream,
    source: Arc<dyn PodSource>,
    fallback: Option<Arc<CriFallback>>,
    added: Option<AddedNotes>,
    starts: Option<PodStartMetrics>,
) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    BufReader::new(read.take(MAX_REQUEST))
        .read_line(&mut line)
        .await?;
    // A lookup the first source cannot answer with authority goes to the runtime (async,
    // so it is asked here, before the synchronous dispatch below).
    let mut looked_up = None;
    if let (Some(fb), Ok(req)) = (&fallback, serde_json::from_str::<Request>(line.trim())) {
        if req.op == OP_POD {
            let first = source.answer(&req.pod);
            looked_up = Some(match first {
                Response::Undecided { reason, .. } => match fb.answer(&req.pod).await {
                    found @ Response::Found { .. } => found,
                    Response::Undecided { reason: r2, .. } => Response::Undecided {
                        v: PROTOCOL_VERSION,
                        reason: format!("{reason}; {r2}"),
                    },
                    other => other,
                },
                other => other,
            });
        }
    }
    let reply = answer_notes(
        &line,
        |pod| looked_up.unwrap_or_else(|| source.answer(pod)),
        |note| match &added {
            Some(tx) => match tx.try_send(note.sandbox.clone()) {
                Ok(()) => Response::Noted {
                    v: PROTOCOL_VERSION,
                },
                Err(tokio::sync::mpsc::error::TrySendError::Full(_)) => Response::Undecided {
                    v: PROTOCOL_VERSION,
                    reason:
                        "the audit's queue of ADD notes is full; its next pass covers the sandbox"
                            .into(),
                },
                Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) => not_running(),
            },
            None => not_running(),
        },
        |note| match &starts {
            Some(m) if m.count(&note.outcome, &note.reason, &note.profile) => {
                tracing::info!(
                    sandbox = %note.sandbox,
                    pod = %format_args!("{}/{}", note.namespace, note.name),
                    outcome = %note.outcome,
                    reason = %note.reason,
                    profile = %note.profile,
                    code = note.code,
                    "interlock-cni did not protect a pod start"
                );
                Response::Noted {
                    v: PROTOCOL_VERSION,
                }
            }
            Some(_) => Response::Undecided {
                v: PROTOCOL_VERSION,
                reason: format!("unknown outcome {:?}", note.outcome),
            },
            None => Response::Undecided {
                v: PROTOCOL_VERSION,
                reason: "this agent counts no failure notes".into(),
            },
        },
    );
    write.write_all(reply.as_bytes()).await?;
    write.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::io::{BufRead, Write};

    struct OnePod;
    impl PodSource for OnePod {
        fn answer(&self, pod: &PodRef) -> Response {
            if pod.name == "web-0" {
                let mut annotations = BTreeMap::new();
                annotations.insert("sidecar.istio.io/status".to_string(), "{}".to_string());
                Response::Found {
                    v: PROTOCOL_VERSION,
                    uid: Some("u1".into()),
                    annotations,
                    facts: None,
                    noted: false,
                }
            } else {
                Response::NotFound {
                    v: PROTOCOL_VERSION,
                }
            }
        }
    }

    fn sandbox(
        ns: &str,
        name: &str,
        uid: &str,
        at: i64,
        mesh: &str,
    ) -> interlock_cri::SandboxSummary {
        interlock_cri::SandboxSummary {
            id: format!("sb{at}"),
            metadata: interlock_cri::SandboxMetadata {
                name: name.into(),
                namespace: ns.into(),
                uid: uid.into(),
                attempt: 0,
            },
            state: interlock_cri::SandboxState::Ready,
            created_at_nanos: at,
            labels: BTreeMap::new(),
            annotations: BTreeMap::from([("mesh".to_string(), mesh.to_string())]),
            runtime_handler: String::new(),
        }
    }

    #[test]
    fn the_runtimes_newest_sandbox_of_the_pod_answers_never_its_absence() {
        let pod = |uid: Option<&str>| PodRef {
            namespace: "shop".into(),
            name: "cart-0".into(),
            uid: uid.map(str::to_string),
        };
        let list = [
            sandbox("shop", "cart-0", "u1", 1, "old"),
            sandbox("shop", "cart-0", "u1", 3, "new"),
            sandbox("shop", "cart-1", "u1", 5, "other pod"),
            sandbox("web", "cart-0", "u1", 6, "other namespace"),
            sandbox("shop", "cart-0", "u2", 4, "recreated pod"),
        ];
        let found = |r: Response| match r {
            Response::Found {
                annotations, uid, ..
            } => (annotations["mesh"].clone(), uid),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            found(from_sandboxes(&pod(Some("u1")), &list)),
            ("new".into(), Some("u1".into()))
        );
        assert_eq!(
            found(from_sandboxes(&pod(Some("u2")), &list)),
            ("recreated pod".into(), Some("u2".into()))
        );
        // Without a UID the newest sandbox of that name answers.
        assert_eq!(found(from_sandboxes(&pod(None), &list)).0, "recreated pod");
        // A pod the runtime does not list (yet) is undecided, not "not found".
        assert!(matches!(
            from_sandboxes(&pod(Some("u3")), &list),
            Response::Undecided { reason, .. } if reason.contains("shop/cart-0")
        ));
        assert!(matches!(
            from_sandboxes(&pod(None), &[]),
            Response::Undecided { .. }
        ));
    }

    fn ask(path: &Path, line: &str) -> String {
        let mut s = std::os::unix::net::UnixStream::connect(path).unwrap();
        s.write_all(line.as_bytes()).unwrap();
        let mut out = String::new();
        std::io::BufReader::new(s).read_line(&mut out).unwrap();
        out
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn answers_lookups_with_mode_0600_and_replaces_only_a_stale_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.sock");
        std::fs::write(&path, "not a socket").unwrap();
        let e = bind(&path).unwrap_err();
        assert!(e.to_string().contains("not a socket"), "{e}");
        std::fs::remove_file(&path).unwrap();
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap()); // a stale socket
        let listener = bind(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let (tx, mut notes) = tokio::sync::mpsc::channel(4);
        let server = tokio::spawn(serve(listener, Arc::new(OnePod), None, Some(tx), None));
        let p = path.clone();
        let (found, missing, garbage, noted) = tokio::task::spawn_blocking(move || {
            (
                ask(
                    &p,
                    "{\"v\":1,\"op\":\"pod\",\"namespace\":\"shop\",\"name\":\"web-0\"}\n",
                ),
                ask(
                    &p,
                    "{\"v\":1,\"op\":\"pod\",\"namespace\":\"shop\",\"name\":\"db-0\"}\n",
                ),
                ask(&p, "garbage\n"),
                ask(
                    &p,
                    "{\"v\":1,\"op\":\"added\",\"sandbox\":\"sb-9\",\"netns\":\"/x\"}\n",
                ),
            )
        })
        .await
        .unwrap();
        let found: serde_json::Value = serde_json::from_str(&found).unwrap();
        assert_eq!(found["status"], "found");
        assert_eq!(found["annotations"]["sidecar.istio.io/status"], "{}");
        assert!(missing.contains("notFound"), "{missing}");
        assert!(garbage.contains("undecided"), "{garbage}");
        assert!(noted.contains("noted"), "{noted}");
        assert_eq!(notes.recv().await.as_deref(), Some("sb-9"));
        server.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_silent_client_is_dropped_after_the_deadline_and_others_are_served() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.sock");
        let server = tokio::spawn(serve(
            bind(&path).unwrap(),
            Arc::new(OnePod),
            None,
            None,
            None,
        ));
        let p = path.clone();
        let answered = tokio::task::spawn_blocking(move || {
            let silent: Vec<_> = (0..MAX_CONNECTIONS * 2)
                .map(|_| std::os::unix::net::UnixStream::connect(&p).unwrap())
                .collect();
            std::thread::sleep(DEADLINE + Duration::from_millis(300));
            let out = ask(
                &p,
                "{\"v\":1,\"op\":\"pod\",\"namespace\":\"shop\",\"name\":\"web-0\"}\n",
            );
            drop(silent);
            out
        })
        .await
        .unwrap();
        assert!(answered.contains("found"), "{answered}");
        server.abort();
    }
}

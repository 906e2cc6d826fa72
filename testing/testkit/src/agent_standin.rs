//! A stand-in for the agent's socket, for tests and benchmarks that run the plugin without
//! the agent: it answers every pod lookup "found" with no annotations of its own and the
//! spec facts it was given (so a pod the runtime passed annotations for is decided by
//! those, with its spec's facts from here), and takes every ADD note, remembering the
//! netns of each, whether it came as an `added` note or with a lookup made for an ADD.
//! Served by root in a directory of the caller's (the plugin trusts nothing else), until
//! dropped.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use interlock_contract::agent_socket::{answer_request, Response, PROTOCOL_VERSION};
use interlock_contract::pod::PodFacts;

/// The serving thread; stops when dropped.
#[derive(Debug)]
pub struct AgentStandIn {
    path: PathBuf,
    noted: Arc<Mutex<HashSet<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl AgentStandIn {
    /// Serves `path` (mode 0600), answering lookups with `facts`.
    pub fn start(path: &Path, facts: PodFacts) -> std::io::Result<AgentStandIn> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        let noted = Arc::new(Mutex::new(HashSet::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (noted, stop) = (noted.clone(), stop.clone());
            std::thread::Builder::new()
                .name("agent-stand-in".into())
                .spawn(move || {
                    for conn in listener.incoming() {
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                        if let Ok(conn) = conn {
                            let _ = answer(conn, &facts, &noted);
                        }
                    }
                })?
        };
        Ok(AgentStandIn {
            path: path.to_path_buf(),
            noted,
            stop,
            thread: Some(thread),
        })
    }

    /// The socket it serves.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True when a note for an ADD in `netns` (its `CNI_NETNS`) arrived.
    pub fn noted(&self, netns: &str) -> bool {
        self.noted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(netns)
    }
}

/// One connection: one request line, one answer line (as the agent's server does).
fn answer(
    conn: UnixStream,
    facts: &PodFacts,
    noted: &Mutex<HashSet<String>>,
) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(1)))?;
    conn.set_write_timeout(Some(Duration::from_secs(1)))?;
    let mut line = String::new();
    BufReader::new(&conn).read_line(&mut line)?;
    let out = answer_request(
        &line,
        |_| Response::Found {
            v: PROTOCOL_VERSION,
            uid: None,
            annotations: Default::default(),
            facts: Some(facts.clone()),
            noted: false,
        },
        |note| {
            noted
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(note.netns.clone());
            Response::Noted {
                v: PROTOCOL_VERSION,
            }
        },
    );
    (&conn).write_all(out.as_bytes())
}

impl Drop for AgentStandIn {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so that it sees the flag; with the socket file gone (its
        // directory removed first) nothing can wake it, and the thread is left to the
        // process's exit rather than waited for.
        if UnixStream::connect(&self.path).is_ok() {
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(path: &Path, line: &str) -> String {
        let mut c = UnixStream::connect(path).unwrap();
        c.write_all(line.as_bytes()).unwrap();
        let mut answer = String::new();
        BufReader::new(&c).read_line(&mut answer).unwrap();
        answer
    }

    #[test]
    fn notes_and_lookups_for_an_add_are_remembered() {
        let d = tempfile::tempdir().unwrap();
        let stub = AgentStandIn::start(&d.path().join("agent.sock"), PodFacts::default()).unwrap();
        let answer = ask(
            stub.path(),
            "{\"v\":1,\"op\":\"added\",\"sandbox\":\"abc\",\"netns\":\"/x\"}\n",
        );
        assert_eq!(answer.trim(), r#"{"status":"noted","v":1}"#);
        let answer = ask(
            stub.path(),
            "{\"v\":1,\"op\":\"pod\",\"namespace\":\"a\",\"name\":\"b\",\
             \"add\":{\"sandbox\":\"s\",\"netns\":\"/z\"}}\n",
        );
        let v: serde_json::Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(v["status"], "found", "{answer}");
        assert_eq!(v["noted"], true, "{answer}");
        assert!(stub.noted("/x") && stub.noted("/z") && !stub.noted("/y"));
        let path = stub.path().to_path_buf();
        drop(stub);
        assert!(!path.exists(), "socket left behind");
    }
}

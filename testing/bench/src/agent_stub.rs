//! A live agent socket for `make bench-json`: a listener that speaks the agent socket
//! protocol (`interlock_contract::agent_socket`, answered with its own
//! `answer_request`), so that a meshed ADD can be measured with `agentSocket` set, as on a
//! node where the agent runs: the plugin then sends its `added` note after the rules are
//! proven and waits for the answer before it exits.
//!
//! It takes every note (`noted`) and remembers their netns, so the bench checks that
//! the note of each checked ADD really arrived (a silently failed note would make the
//! figure a plain ADD's). Pod lookups are answered `undecided`: the bench passes the
//! annotations through the runtime, as containerd does, so the plugin does not ask.

use std::collections::HashSet;
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use interlock_contract::agent_socket::{answer_request, Response, PROTOCOL_VERSION};

/// A listener on a Unix socket answering the plugin's notes (see the module docs).
#[derive(Debug)]
pub struct AgentStub {
    path: PathBuf,
    noted: Arc<Mutex<HashSet<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl AgentStub {
    /// Listens on `path` (mode 0600: the plugin trusts only a socket nobody but root
    /// could have bound) until dropped.
    pub fn start(path: &Path) -> io::Result<AgentStub> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        let noted = Arc::new(Mutex::new(HashSet::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (noted, stop) = (noted.clone(), stop.clone());
            std::thread::Builder::new()
                .name("bench-agent-socket".into())
                .spawn(move || {
                    for conn in listener.incoming() {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        if let Ok(conn) = conn {
                            let _ = answer(conn, &noted);
                        }
                    }
                })?
        };
        Ok(AgentStub {
            path: path.to_path_buf(),
            noted,
            stop,
            thread: Some(thread),
        })
    }

    /// The socket.
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
fn answer(conn: UnixStream, noted: &Mutex<HashSet<String>>) -> io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(1)))?;
    conn.set_write_timeout(Some(Duration::from_secs(1)))?;
    let mut line = String::new();
    BufReader::new(&conn).read_line(&mut line)?;
    let out = answer_request(
        &line,
        |_| Response::Undecided {
            v: PROTOCOL_VERSION,
            reason: "the bench's stand-in agent answers no pod lookups".into(),
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

impl Drop for AgentStub {
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

    #[test]
    fn notes_are_answered_and_remembered() {
        let d = tempfile::tempdir().unwrap();
        let stub = AgentStub::start(&d.path().join("agent.sock")).unwrap();
        let mut c = UnixStream::connect(stub.path()).unwrap();
        c.write_all(b"{\"v\":1,\"op\":\"added\",\"sandbox\":\"abc\",\"netns\":\"/x\"}\n")
            .unwrap();
        let mut answer = String::new();
        BufReader::new(&c).read_line(&mut answer).unwrap();
        assert_eq!(answer.trim(), r#"{"status":"noted","v":1}"#);
        assert!(stub.noted("/x") && !stub.noted("/y"));
        let path = stub.path().to_path_buf();
        drop(stub);
        assert!(!path.exists(), "socket left behind");
    }
}

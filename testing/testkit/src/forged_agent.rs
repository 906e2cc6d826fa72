//! An agent socket served by an unprivileged user, for the tests that show the plugin
//! refuses it: a copy of the running test binary re-runs one test function as that
//! user, and that function ([`serve_if_child`]) answers every lookup "meshed".
//!
//! ```text
//! #[test]
//! fn forger() { interlock_testkit::forged_agent::serve_if_child(&[("a", "b")]) }
//! // in the test: ForgedAgent::start("forger", 65534) …
//! ```

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use interlock_contract::agent_socket::{answer_line, PodRef, Response};

/// The variable that carries the socket path to the child.
const SOCKET_VAR: &str = "INTERLOCK_FORGED_AGENT";

/// In the child [`ForgedAgent::start`] runs (the variable is set): binds the socket,
/// makes it writable by all, and answers every lookup with `annotations` until killed.
/// In any other run of the test function: returns at once.
pub fn serve_if_child(annotations: &[(&str, &str)]) {
    let Some(path) = std::env::var_os(SOCKET_VAR) else {
        return;
    };
    let l = UnixListener::bind(&path).expect("bind the forged socket");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777))
        .expect("open the forged socket to all");
    for s in l.incoming() {
        let Ok(mut s) = s else { return };
        let mut line = String::new();
        if BufReader::new(&s).read_line(&mut line).is_ok() {
            let reply = |_: &PodRef| Response::Found {
                v: 1,
                uid: None,
                annotations: annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                facts: None,
                noted: false,
            };
            let _ = s.write_all(answer_line(&line, reply).as_bytes());
        }
    }
}

/// The forging process, serving `agent.sock` in a world-writable directory of its own;
/// killed on drop.
#[derive(Debug)]
pub struct ForgedAgent {
    child: Child,
    /// Where it serves now (see [`ForgedAgent::move_into`]).
    pub socket: PathBuf,
    /// The world-writable directory it bound in (a state dir an unprivileged user can
    /// write: the mistake the tests show is harmless).
    pub open_dir: tempfile::TempDir,
}

impl ForgedAgent {
    /// Runs test function `test_fn` (its path in the test binary, `module::name`) of this test binary as `uid` (its group too) with
    /// the socket path set, and waits (5 s at most) until it has bound the socket.
    pub fn start(test_fn: &str, uid: u32) -> ForgedAgent {
        let open_dir = crate::tempdir().expect("tempdir");
        std::fs::set_permissions(open_dir.path(), std::fs::Permissions::from_mode(0o777))
            .expect("chmod 777");
        let exe = crate::copy_of_this_test_binary(open_dir.path(), "forger");
        let socket = open_dir.path().join("agent.sock");
        let child = Command::new(&exe)
            .args(["--exact", test_fn, "--nocapture"])
            .env(SOCKET_VAR, &socket)
            .uid(uid)
            .gid(uid)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the forger");
        let forged = ForgedAgent {
            child,
            socket,
            open_dir,
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while !forged.socket.exists() {
            assert!(Instant::now() < deadline, "the forger did not bind");
            std::thread::sleep(Duration::from_millis(10));
        }
        forged
    }

    /// Moves the socket into `dir` (root's) and makes it root's, mode 0600, as root
    /// could by mistake: then only the server's credentials (SO_PEERCRED) tell it is not
    /// the agent. Returns the new path.
    pub fn move_into(&mut self, dir: &Path) -> PathBuf {
        let to = dir.join("agent.sock");
        std::fs::rename(&self.socket, &to).expect("move the forged socket");
        std::os::unix::fs::chown(&to, Some(0), Some(0)).expect("chown root");
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        self.socket.clone_from(&to);
        to
    }
}

impl Drop for ForgedAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

//! The independent checker: every period it asks the runtime (over CRI) which sandboxes
//! run, and probes each of them from inside with a real connection ([`crate::probe`]).
//!
//! Whether a sandbox should be meshed is read from its own annotations, as the runtime
//! reports them; nothing is asked of interlock. While containerd restarts (listing
//! fails) the sandboxes known to run are probed on: their shims and netns outlive it.
//!
//! A sandbox the workload is about to stop is marked in [`Stopping`] first: its CNI DEL
//! removes the rules before the netns goes, so probes from then on say nothing about
//! protection and are dropped (a probe is only kept when the mark was still absent after
//! it finished).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use interlock_cri::{CriClient, SandboxFilter, Timeouts};

use crate::ledger::{Ledger, Ms, Verdict};
use crate::probe::ProbeServer;

/// The annotation that marks a sandbox as meshed: the node kit's, which the `generic`
/// profile decides from the annotations alone (most of the soak's pods have no Pod in
/// the fake API; only the sentinels do).
pub const MESH_ANNOTATION: (&str, &str) = interlock_testkit_node::node::MESHED_ANNOTATION;

/// What makes a sandbox meshed: annotations it carries (every one, with its value).
/// interlock's own modes: [`MESH_ANNOTATION`]; guard mode: the mesh's own annotations as
/// its injector writes them (the mesh's default case in `interlock-mesh-cases`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meshed(pub Vec<(String, String)>);

impl Meshed {
    /// interlock's own switch.
    pub fn interlock() -> Meshed {
        Meshed(vec![(
            MESH_ANNOTATION.0.to_string(),
            MESH_ANNOTATION.1.to_string(),
        )])
    }

    /// A guarded mesh's injected pod.
    pub fn of_mesh(mesh: interlock_mesh_cases::Mesh) -> Meshed {
        Meshed(
            interlock_mesh_cases::default_case(mesh)
                .annotations
                .into_iter()
                .collect(),
        )
    }

    /// True when `annotations` carry every one of them.
    pub fn matches(&self, annotations: &BTreeMap<String, String>) -> bool {
        !self.0.is_empty()
            && self
                .0
                .iter()
                .all(|(k, v)| annotations.get(k).is_some_and(|have| have == v))
    }
}

/// The soak's clock: milliseconds since it began, for both monotonic and wall times.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: Instant,
    wall: SystemTime,
}

impl Clock {
    /// A clock starting now.
    pub fn start() -> Clock {
        Clock {
            start: Instant::now(),
            wall: SystemTime::now(),
        }
    }

    /// Milliseconds since the start.
    pub fn now_ms(&self) -> Ms {
        self.start.elapsed().as_millis() as Ms
    }

    /// A wall-clock time (e.g. the runtime's creation stamp) on this clock; 0 when
    /// before the start.
    pub fn ms_of(&self, t: SystemTime) -> Ms {
        t.duration_since(self.wall)
            .map(|d| d.as_millis() as Ms)
            .unwrap_or(0)
    }
}

/// Sandboxes being stopped by the workload, with the time they were marked.
#[derive(Debug, Clone, Default)]
pub struct Stopping(Arc<Mutex<HashMap<String, Ms>>>);

impl Stopping {
    /// Marks `id` as being stopped from `at` on.
    pub fn mark(&self, id: &str, at: Ms) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(id.to_string())
            .or_insert(at);
    }

    /// When `id` was marked, if it was.
    pub fn since(&self, id: &str) -> Option<Ms> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .copied()
    }
}

/// What the checker needs to know.
#[derive(Debug, Clone)]
pub struct CheckerConfig {
    /// The runtime's CRI endpoint.
    pub cri_endpoint: String,
    /// The bridge's address, where the sandboxes reach the probe server.
    pub gateway: Ipv4Addr,
    /// Time between the starts of two rounds.
    pub period: Duration,
    /// Bound on one probe's connect and on the wait for the server to see it.
    pub probe_timeout: Duration,
    /// What makes a sandbox meshed.
    pub meshed: Meshed,
}

/// What the checker learnt, shared with the run while it goes on.
#[derive(Debug, Default)]
pub struct CheckerState {
    /// Every sandbox seen, with its probes and exposure windows.
    pub ledger: Ledger,
    /// Completed rounds.
    pub rounds: u64,
    /// Rounds in which listing the sandboxes failed (containerd restarting).
    pub list_failures: u64,
    /// The longest round, in milliseconds.
    pub longest_round_ms: Ms,
    /// Every netns path a sandbox had (for the leak check).
    pub netns_seen: BTreeSet<PathBuf>,
    /// Probes dropped because the sandbox was being stopped meanwhile.
    pub dropped_probes: u64,
}

/// A running checker; [`Checker::stop`] ends it.
#[derive(Debug)]
pub struct Checker {
    state: Arc<Mutex<CheckerState>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// A sandbox known to run: where to probe it.
#[derive(Debug, Clone)]
struct Known {
    netns: PathBuf,
}

impl Checker {
    /// Starts probing on a thread of its own (with its own CRI client and runtime).
    pub fn start(
        config: CheckerConfig,
        clock: Clock,
        stopping: Stopping,
        server: Arc<ProbeServer>,
    ) -> std::io::Result<Checker> {
        let state = Arc::new(Mutex::new(CheckerState::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp) = (state.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("soak-checker".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a tokio runtime for the checker");
                rt.block_on(check_loop(config, clock, stopping, server, st, sp));
            })?;
        Ok(Checker {
            state,
            stop,
            thread: Some(thread),
        })
    }

    /// Runs `f` on the current state.
    pub fn with_state<R>(&self, f: impl FnOnce(&CheckerState) -> R) -> R {
        f(&self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Waits until `n` more rounds have completed (or `timeout` passed).
    pub fn wait_rounds(&self, n: u64, timeout: Duration) -> bool {
        let target = self.with_state(|s| s.rounds) + n;
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.with_state(|s| s.rounds) >= target {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Stops the checker; returns what it learnt.
    pub fn stop(mut self) -> CheckerState {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        std::mem::take(&mut *self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Drop for Checker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn connect(endpoint: &str) -> Option<CriClient> {
    let timeouts = Timeouts {
        connect: Duration::from_millis(500),
        call: Duration::from_secs(2),
        ..Timeouts::default()
    };
    CriClient::connect_with(endpoint, timeouts).await.ok()
}

async fn check_loop(
    config: CheckerConfig,
    clock: Clock,
    stopping: Stopping,
    server: Arc<ProbeServer>,
    state: Arc<Mutex<CheckerState>>,
    stop: Arc<AtomicBool>,
) {
    let lock = || state.lock().unwrap_or_else(|e| e.into_inner());
    let mut cri: Option<CriClient> = None;
    let mut known: BTreeMap<String, Known> = BTreeMap::new();
    while !stop.load(Ordering::SeqCst) {
        let began = Instant::now();
        let now = clock.now_ms();
        if cri.is_none() {
            cri = connect(&config.cri_endpoint).await;
        }
        // Which sandboxes run, as the runtime says.
        let listed = match &cri {
            Some(c) => c.list_sandboxes(&SandboxFilter::ready()).await.ok(),
            None => None,
        };
        match listed {
            Some(list) => {
                let ids: BTreeSet<String> = list.iter().map(|s| s.id.clone()).collect();
                let gone: Vec<String> = known
                    .keys()
                    .filter(|id| !ids.contains(*id))
                    .cloned()
                    .collect();
                for id in gone {
                    known.remove(&id);
                    lock().ledger.gone(&id, now);
                }
                let new: Vec<_> = list.iter().filter(|s| !known.contains_key(&s.id)).collect();
                for s in new {
                    let Some(c) = &cri else { break };
                    // Not found: gone between list and status; other errors: next round.
                    let Ok(status) = c.sandbox_status(&s.id, true).await else {
                        continue;
                    };
                    let Some(netns) = status.netns_path().map(PathBuf::from) else {
                        continue;
                    };
                    let meshed = config.meshed.matches(&s.annotations);
                    let mut st = lock();
                    st.ledger
                        .seen(&s.id, meshed, clock.ms_of(s.created_at()), clock.now_ms());
                    st.netns_seen.insert(netns.clone());
                    drop(st);
                    known.insert(s.id.clone(), Known { netns });
                }
            }
            None => {
                lock().list_failures += 1;
                // A new connection next round (containerd may have restarted).
                cri = None;
            }
        }
        // Sandboxes being stopped are out of the picture from their mark on.
        let marked: Vec<(String, Ms)> = known
            .keys()
            .filter_map(|id| stopping.since(id).map(|t| (id.clone(), t)))
            .collect();
        for (id, at) in marked {
            known.remove(&id);
            lock().ledger.gone(&id, at);
        }
        // Probe everything that runs, in parallel.
        let targets: Vec<(String, PathBuf)> = known
            .iter()
            .map(|(id, k)| (id.clone(), k.netns.clone()))
            .collect();
        let (gateway, timeout) = (config.gateway, config.probe_timeout);
        let server2 = server.clone();
        let results: Vec<(String, Verdict)> = tokio::task::spawn_blocking(move || {
            std::thread::scope(|s| {
                let handles: Vec<_> = targets
                    .iter()
                    .map(|(id, netns)| {
                        let server = &server2;
                        s.spawn(move || (id.clone(), server.probe(netns, gateway, timeout)))
                    })
                    .collect();
                handles.into_iter().filter_map(|h| h.join().ok()).collect()
            })
        })
        .await
        .unwrap_or_default();
        {
            let mut st = lock();
            for (id, verdict) in results {
                if stopping.since(&id).is_some() {
                    st.dropped_probes += 1;
                    continue;
                }
                st.ledger.observe(&id, now, verdict);
            }
            st.rounds += 1;
            st.longest_round_ms = st.longest_round_ms.max(began.elapsed().as_millis() as Ms);
        }
        let left = config.period.saturating_sub(began.elapsed());
        tokio::time::sleep(left).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandbox_is_meshed_only_with_every_annotation_of_its_mode() {
        let ann = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let own = Meshed::interlock();
        assert!(own.matches(&ann(&[MESH_ANNOTATION])));
        assert!(!own.matches(&ann(&[(MESH_ANNOTATION.0, "disabled")])));
        let istio = Meshed::of_mesh(interlock_mesh_cases::Mesh::Istio);
        assert!(istio.0.iter().any(|(k, _)| k == "sidecar.istio.io/status"));
        let all: Vec<(&str, &str)> = istio
            .0
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert!(istio.matches(&ann(&all)));
        assert!(!istio.matches(&ann(&[MESH_ANNOTATION])));
        assert!(!own.matches(&ann(&all)));
        assert!(!Meshed(Vec::new()).matches(&ann(&all)));
    }
}

//! The workload: workers that keep creating and removing meshed and plain sandboxes over
//! CRI, as a busy kubelet would, until the planned number of creations was attempted.
//!
//! A creation that fails is counted by reason (the runtime retries in real life; here the
//! next attempt is simply a new pod). Removal is retried until it succeeds: while the
//! plugin binary is missing or containerd restarts, a sandbox cannot be torn down yet.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use interlock_cri::{CriClient, CriError, SandboxConfig, SandboxFilter, Timeouts};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::checker::{Clock, Stopping, MESH_ANNOTATION};

/// How long a worker keeps trying to remove one sandbox before it leaves it to the end.
const REMOVE_PATIENCE: Duration = Duration::from_secs(30);

/// What the workload does.
#[derive(Debug, Clone)]
pub struct WorkloadConfig {
    /// The runtime's CRI endpoint.
    pub cri_endpoint: String,
    /// Sandboxes created in parallel.
    pub workers: usize,
    /// Creations to attempt in all.
    pub creations: u64,
    /// Share of the creations that are meshed (0..=1).
    pub meshed_share: f64,
    /// How long a sandbox runs before it is removed, in milliseconds.
    pub lifetime_ms: Range<u64>,
    /// Seed of the meshed/plain choices and lifetimes.
    pub seed: u64,
}

/// Counts of what the workload did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct WorkloadStats {
    /// Creations attempted.
    pub attempted: u64,
    /// Meshed sandboxes that started.
    pub created_meshed: u64,
    /// Plain sandboxes that started.
    pub created_plain: u64,
    /// Meshed creations that failed.
    pub failed_meshed: u64,
    /// Plain creations that failed.
    pub failed_plain: u64,
    /// Failed creations by reason.
    pub failures_by_reason: BTreeMap<String, u64>,
    /// Sandboxes removed by the workers.
    pub removed: u64,
    /// Removal attempts that failed (and were retried).
    pub remove_retries: u64,
    /// Creation latency of the sandboxes that started, in milliseconds: (p50, p99, max).
    #[serde(skip)]
    pub create_ms: Vec<u64>,
}

/// A shared workload in progress.
#[derive(Debug, Clone)]
pub struct Workload {
    config: WorkloadConfig,
    clock: Clock,
    stopping: Stopping,
    next: Arc<AtomicU64>,
    stats: Arc<Mutex<WorkloadStats>>,
    /// Sandboxes a worker gave up removing, for the final sweep.
    left: Arc<Mutex<Vec<String>>>,
}

impl Workload {
    /// A workload; [`Workload::run`] drives it.
    pub fn new(config: WorkloadConfig, clock: Clock, stopping: Stopping) -> Workload {
        Workload {
            config,
            clock,
            stopping,
            next: Arc::new(AtomicU64::new(0)),
            stats: Arc::new(Mutex::new(WorkloadStats::default())),
            left: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// What has been done so far.
    pub fn stats(&self) -> WorkloadStats {
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Runs every worker until all creations were attempted and their sandboxes removed.
    pub async fn run(&self) {
        let mut tasks = tokio::task::JoinSet::new();
        for w in 0..self.config.workers.max(1) {
            let me = self.clone();
            tasks.spawn(async move { me.worker(w as u64).await });
        }
        while tasks.join_next().await.is_some() {}
    }

    async fn worker(&self, index: u64) {
        let mut rng = StdRng::seed_from_u64(self.config.seed ^ (index + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut cri: Option<CriClient> = None;
        loop {
            let n = self.next.fetch_add(1, Ordering::SeqCst);
            if n >= self.config.creations {
                return;
            }
            let meshed = rng.gen_bool(self.config.meshed_share.clamp(0.0, 1.0));
            let lifetime = rng.gen_range(self.config.lifetime_ms.clone());
            let client = match &cri {
                Some(c) => c.clone(),
                None => match connect(&self.config.cri_endpoint).await {
                    Ok(c) => {
                        cri = Some(c.clone());
                        c
                    }
                    Err(e) => {
                        self.failed(meshed, &e.to_string());
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                },
            };
            let name = format!("soak{n}-{}", if meshed { "m" } else { "p" });
            let mut pod = SandboxConfig::new("soak", name.clone(), format!("uid-{name}-{}", self.config.seed));
            if meshed {
                pod = pod.annotation(MESH_ANNOTATION.0, MESH_ANNOTATION.1);
            }
            let t0 = self.clock.now_ms();
            self.stats.lock().unwrap_or_else(|e| e.into_inner()).attempted += 1;
            let id = match client.run_sandbox(&pod).await {
                Ok(id) => id,
                Err(e) => {
                    if is_transport(&e) {
                        cri = None;
                    }
                    self.failed(meshed, &e.to_string());
                    continue;
                }
            };
            {
                let mut s = self.stats.lock().unwrap_or_else(|e| e.into_inner());
                if meshed {
                    s.created_meshed += 1;
                } else {
                    s.created_plain += 1;
                }
                s.create_ms.push(self.clock.now_ms().saturating_sub(t0));
            }
            tokio::time::sleep(Duration::from_millis(lifetime)).await;
            self.stopping.mark(&id, self.clock.now_ms());
            if self.remove(&mut cri, &id).await {
                self.stats.lock().unwrap_or_else(|e| e.into_inner()).removed += 1;
            } else {
                self.left.lock().unwrap_or_else(|e| e.into_inner()).push(id);
            }
        }
    }

    fn failed(&self, meshed: bool, error: &str) {
        let mut s = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        if meshed {
            s.failed_meshed += 1;
        } else {
            s.failed_plain += 1;
        }
        *s.failures_by_reason.entry(failure_reason(error)).or_default() += 1;
    }

    /// Stops and removes `id`, retrying for a while; false when it is still there.
    async fn remove(&self, cri: &mut Option<CriClient>, id: &str) -> bool {
        let deadline = tokio::time::Instant::now() + REMOVE_PATIENCE;
        loop {
            let client = match cri {
                Some(c) => Some(c.clone()),
                None => connect(&self.config.cri_endpoint).await.ok(),
            };
            if let Some(c) = client {
                *cri = Some(c.clone());
                let done = match c.stop_sandbox(id).await {
                    Ok(()) => c.remove_sandbox(id).await,
                    Err(e) => Err(e),
                };
                match done {
                    Ok(()) => return true,
                    Err(e) if e.is_not_found() => return true,
                    Err(e) => {
                        if is_transport(&e) {
                            *cri = None;
                        }
                    }
                }
            }
            self.stats.lock().unwrap_or_else(|e| e.into_inner()).remove_retries += 1;
            if tokio::time::Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Stops and removes every sandbox the runtime still lists (ready or not), retrying for
/// up to `patience`; returns the ones that could not be removed, with why.
pub async fn sweep(endpoint: &str, stopping: &Stopping, clock: &Clock, patience: Duration) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + patience;
    let mut problems = Vec::new();
    loop {
        problems.clear();
        match connect(endpoint).await {
            Err(e) => problems.push(format!("connecting to {endpoint}: {e}")),
            Ok(c) => match c.list_sandboxes(&SandboxFilter::default()).await {
                Err(e) => problems.push(format!("listing sandboxes: {e}")),
                Ok(list) if list.is_empty() => return Vec::new(),
                Ok(list) => {
                    for s in list {
                        stopping.mark(&s.id, clock.now_ms());
                        let done = match c.stop_sandbox(&s.id).await {
                            Ok(()) => c.remove_sandbox(&s.id).await,
                            Err(e) => Err(e),
                        };
                        if let Err(e) = done {
                            problems.push(format!("sandbox {}: {e}", s.id));
                        }
                    }
                }
            },
        }
        if tokio::time::Instant::now() > deadline {
            return problems;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn connect(endpoint: &str) -> Result<CriClient, CriError> {
    CriClient::connect_with(
        endpoint,
        Timeouts {
            connect: Duration::from_secs(2),
            call: Duration::from_secs(20),
            run_sandbox: Duration::from_secs(60),
        },
    )
    .await
}

/// True for errors that mean the connection to the runtime is gone (containerd
/// restarting), so the next call should reconnect.
fn is_transport(e: &CriError) -> bool {
    let text = e.to_string().to_lowercase();
    text.contains("transport") || text.contains("connect") || text.contains("unavailable") || text.contains("broken pipe")
}

/// A short, stable reason for a failed creation: the known causes by name, anything
/// else by its first words with IDs and numbers removed.
pub fn failure_reason(error: &str) -> String {
    let e = error.to_lowercase();
    let known: &[(&str, &str)] = &[
        ("cni plugin not initialized", "no CNI config loaded (cni plugin not initialized)"),
        ("failed to find plugin \"interlock-cni\"", "interlock-cni binary missing"),
        ("failed to find plugin", "a plugin binary missing"),
        ("text file busy", "plugin binary being replaced (text file busy)"),
        ("plugin type=\"interlock-cni\"", "interlock-cni refused the ADD"),
        ("unavailable", "containerd unavailable (restarting)"),
        ("connect", "containerd unavailable (restarting)"),
        ("deadline", "timed out"),
    ];
    for (needle, reason) in known {
        if e.contains(needle) {
            return (*reason).to_string();
        }
    }
    let words: String = error
        .split_whitespace()
        .filter(|w| !w.chars().any(|c| c.is_ascii_digit()))
        .take(12)
        .collect::<Vec<_>>()
        .join(" ");
    format!("other: {words}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_reasons_are_short_and_stable() {
        assert_eq!(
            failure_reason("RunPodSandbox soak/soak1-m: rpc error: code = Unknown desc = failed to setup network for sandbox \"abc\": cni plugin not initialized"),
            "no CNI config loaded (cni plugin not initialized)"
        );
        assert_eq!(
            failure_reason("failed to find plugin \"interlock-cni\" in path [/x/bin]"),
            "interlock-cni binary missing"
        );
        assert_eq!(
            failure_reason("plugin type=\"interlock-cni\" failed (add): code 104: probe"),
            "interlock-cni refused the ADD"
        );
        let a = failure_reason("weird thing 12ab happened to pod 7");
        let b = failure_reason("weird thing 99ff happened to pod 3");
        assert_eq!(a, b);
        assert_eq!(a, "other: weird thing happened to pod");
    }
}

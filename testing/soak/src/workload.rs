//! The workload: creators that keep creating meshed and plain sandboxes over CRI, as a
//! busy kubelet would, each removed after a random lifetime by a task of its own, until
//! the planned number of sandboxes started.
//!
//! Creation and removal are decoupled on purpose: a removal that must wait (no config
//! loaded, the plugin binary missing, containerd restarting) must not hold back the
//! creations, or they would all happen after the chaos step and never meet it. At most
//! `max_live` sandboxes run at once (residents aside). A creation that fails is counted
//! by reason and followed by a short back-off, as the kubelet's; the next attempt is a
//! new pod. Removal is retried until it succeeds.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use interlock_cri::{CriClient, CriError, SandboxConfig, SandboxFilter, SandboxState, Timeouts};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::sync::Semaphore;

use crate::checker::{Clock, Meshed, Stopping};
use crate::ledger::Ms;

/// How long a removal task keeps trying before it leaves the sandbox to the final sweep.
const REMOVE_PATIENCE: Duration = Duration::from_secs(30);
/// How often the collector looks for sandboxes a failed creation left behind.
const COLLECT_EVERY: Duration = Duration::from_secs(2);
/// How old a sandbox that is not ready must be before the collector removes it (the
/// workload's own removals finish well within it).
const COLLECT_AFTER: Duration = Duration::from_secs(10);
/// The pause after a failed creation.
const FAILURE_BACKOFF: Duration = Duration::from_millis(200);
/// Attempts per planned sandbox after which the workload gives up (a node that refuses
/// everything would otherwise keep it going forever).
const MAX_ATTEMPTS_PER_CREATION: u64 = 5;

/// What the workload does.
#[derive(Debug, Clone)]
pub struct WorkloadConfig {
    /// The runtime's CRI endpoint.
    pub cri_endpoint: String,
    /// Creations in flight at once.
    pub workers: usize,
    /// Sandboxes running at once at most (residents aside).
    pub max_live: usize,
    /// Sandboxes to start in all (at least; see `until_ms`).
    pub creations: u64,
    /// Keep starting sandboxes until the clock reads this, even after `creations`.
    pub until_ms: Ms,
    /// Share of the creations that are meshed (0..=1).
    pub meshed_share: f64,
    /// How long a sandbox runs before it is removed, in milliseconds.
    pub lifetime_ms: Range<u64>,
    /// Meshed sandboxes kept running until the end (they live through every chaos step
    /// and are checked once it stopped), spread over the run.
    pub resident: u64,
    /// Seed of the meshed/plain choices and lifetimes.
    pub seed: u64,
    /// The annotations a meshed sandbox carries.
    pub meshed: Meshed,
    /// The fake API's URL, when every sandbox's Pod must be there before its sandbox
    /// runs and go after it was removed, as the kubelet's pods are (guard mode: the
    /// mesh's plugin reads the Pod).
    pub pod_api: Option<String>,
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
    /// The first full error message of each reason.
    pub failure_examples: BTreeMap<String, String>,
    /// Sandboxes removed by the workload.
    pub removed: u64,
    /// Removal attempts that failed (and were retried).
    pub remove_retries: u64,
    /// Sandboxes a failed creation left behind (not ready, no ID returned), stopped and
    /// removed by the collector as the kubelet's garbage collection does.
    pub collected_not_ready: u64,
    /// libcni result caches containerd left unreadable (see [`clear_unreadable_cni_cache`]),
    /// removed so the sandbox could be torn down.
    pub unreadable_cni_caches: Vec<String>,
    /// Sandboxes' freezer cgroups a runtime deadlock left freezing (see
    /// [`thaw_stuck_freezer`]), thawed so the sandbox could be stopped.
    pub stuck_freezers_thawed: Vec<String>,
    /// True when it gave up before all planned sandboxes started.
    pub gave_up: bool,
    /// RunPodSandbox latency of the sandboxes that started, in milliseconds.
    #[serde(skip)]
    pub create_ms: Vec<u64>,
}

/// A shared workload in progress.
#[derive(Debug, Clone)]
pub struct Workload {
    config: WorkloadConfig,
    clock: Clock,
    stopping: Stopping,
    /// Creations reserved (in flight or started); a failed one gives its place back.
    reserved: Arc<AtomicU64>,
    /// Sandboxes started so far.
    started: Arc<AtomicU64>,
    live: Arc<Semaphore>,
    stats: Arc<Mutex<WorkloadStats>>,
    /// Sandboxes a removal task gave up on, for the final sweep.
    left: Arc<Mutex<Vec<String>>>,
    /// Sandboxes kept until the end.
    resident: Arc<Mutex<Vec<String>>>,
}

impl Workload {
    /// A workload; [`Workload::run`] drives it.
    pub fn new(config: WorkloadConfig, clock: Clock, stopping: Stopping) -> Workload {
        Workload {
            live: Arc::new(Semaphore::new(config.max_live.max(1))),
            config,
            clock,
            stopping,
            reserved: Arc::new(AtomicU64::new(0)),
            started: Arc::new(AtomicU64::new(0)),
            stats: Arc::new(Mutex::new(WorkloadStats::default())),
            left: Arc::new(Mutex::new(Vec::new())),
            resident: Arc::new(Mutex::new(Vec::new())),
        }
    }

    fn lock_stats(&self) -> std::sync::MutexGuard<'_, WorkloadStats> {
        self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The sandboxes kept running until the end.
    pub fn resident(&self) -> Vec<String> {
        self.resident
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The sandboxes whose removal was given up.
    pub fn left_behind(&self) -> Vec<String> {
        self.left.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// What has been done so far.
    pub fn stats(&self) -> WorkloadStats {
        self.lock_stats().clone()
    }

    /// Runs the creators until every planned sandbox started (or the attempts ran out),
    /// then waits for every removal.
    pub async fn run(&self) {
        let mut creators = tokio::task::JoinSet::new();
        let removals = Arc::new(Mutex::new(tokio::task::JoinSet::new()));
        for w in 0..self.config.workers.max(1) {
            let me = self.clone();
            let removals = removals.clone();
            creators.spawn(async move { me.creator(w as u64, removals).await });
        }
        let done = Arc::new(AtomicBool::new(false));
        let collector = {
            let me = self.clone();
            let done = done.clone();
            tokio::spawn(async move { me.collect_not_ready(&done).await })
        };
        while creators.join_next().await.is_some() {}
        done.store(true, Ordering::SeqCst);
        let _ = collector.await;
        let mut removals = std::mem::take(&mut *removals.lock().unwrap_or_else(|e| e.into_inner()));
        while removals.join_next().await.is_some() {}
    }

    /// Takes a place for one more creation; false when all are taken.
    fn reserve(&self) -> bool {
        self.reserved
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |r| {
                (r < self.config.creations || self.clock.now_ms() < self.config.until_ms)
                    .then_some(r + 1)
            })
            .is_ok()
    }

    async fn creator(&self, index: u64, removals: Arc<Mutex<tokio::task::JoinSet<()>>>) {
        let mut rng = StdRng::seed_from_u64(
            self.config.seed ^ (index + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        );
        let mut cri: Option<CriClient> = None;
        let max_attempts = self
            .config
            .creations
            .saturating_mul(MAX_ATTEMPTS_PER_CREATION);
        loop {
            let Ok(permit) = self.live.clone().acquire_owned().await else {
                return;
            };
            if !self.reserve() {
                return;
            }
            let attempt = {
                let mut s = self.lock_stats();
                // A timed run starts more than `creations`: the bound grows with it.
                let started = self.started.load(Ordering::SeqCst);
                if s.attempted
                    >= max_attempts.max(started.saturating_mul(MAX_ATTEMPTS_PER_CREATION))
                {
                    s.gave_up = true;
                    return;
                }
                s.attempted += 1;
                s.attempted
            };
            let meshed = rng.gen_bool(self.config.meshed_share.clamp(0.0, 1.0));
            let lifetime = rng.gen_range(self.config.lifetime_ms.clone());
            let name = format!("soak{attempt}-{}", if meshed { "m" } else { "p" });
            let mut pod = SandboxConfig::new(
                "soak",
                name.clone(),
                format!("uid-{name}-{}", self.config.seed),
            );
            if meshed {
                for (k, v) in &self.config.meshed.0 {
                    pod = pod.annotation(k, v);
                }
            }
            if let Some(url) = &self.config.pod_api {
                let (url, body) = (url.clone(), pod_object(&pod));
                let put = tokio::task::spawn_blocking(move || {
                    api_call(&url, "POST", "/api/v1/namespaces/soak/pods", Some(&body))
                })
                .await
                .unwrap_or_else(|e| Err(e.to_string()));
                if let Err(e) = put {
                    self.failed(meshed, &format!("putting the Pod {name} into the API: {e}"));
                    self.reserved.fetch_sub(1, Ordering::SeqCst);
                    drop(permit);
                    tokio::time::sleep(FAILURE_BACKOFF).await;
                    continue;
                }
            }
            let t0 = self.clock.now_ms();
            let created = match cri.clone() {
                Some(c) => Ok(c),
                None => connect(&self.config.cri_endpoint).await,
            };
            let created = match created {
                Ok(c) => {
                    cri = Some(c.clone());
                    c.run_sandbox(&pod).await
                }
                Err(e) => Err(e),
            };
            let id = match created {
                Ok(id) => id,
                Err(e) => {
                    if is_transport(&e) {
                        cri = None;
                    }
                    self.delete_pod(&name).await;
                    self.failed(meshed, &e.to_string());
                    self.reserved.fetch_sub(1, Ordering::SeqCst);
                    drop(permit);
                    tokio::time::sleep(FAILURE_BACKOFF).await;
                    continue;
                }
            };
            let k = self.started.fetch_add(1, Ordering::SeqCst);
            {
                let mut s = self.lock_stats();
                if meshed {
                    s.created_meshed += 1;
                } else {
                    s.created_plain += 1;
                }
                s.create_ms.push(self.clock.now_ms().saturating_sub(t0));
            }
            if meshed {
                let mut r = self.resident.lock().unwrap_or_else(|e| e.into_inner());
                if (r.len() as u64) < residents_due(k, self.config.creations, self.config.resident)
                {
                    r.push(id);
                    continue;
                }
            }
            let me = self.clone();
            removals
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .spawn(async move {
                    tokio::time::sleep(Duration::from_millis(lifetime)).await;
                    me.stopping.mark(&id, me.clock.now_ms());
                    if me.remove(&id).await {
                        me.delete_pod(&name).await;
                        me.lock_stats().removed += 1;
                    } else {
                        me.left.lock().unwrap_or_else(|e| e.into_inner()).push(id);
                    }
                    drop(permit);
                });
        }
    }

    /// Deletes the Pod `soak/<name>` from the fake API (when the workload keeps Pods).
    async fn delete_pod(&self, name: &str) {
        if let Some(url) = &self.config.pod_api {
            let (url, path) = (url.clone(), format!("/api/v1/namespaces/soak/pods/{name}"));
            let _ =
                tokio::task::spawn_blocking(move || api_call(&url, "DELETE", &path, None)).await;
        }
    }

    fn failed(&self, meshed: bool, error: &str) {
        let mut s = self.lock_stats();
        if meshed {
            s.failed_meshed += 1;
        } else {
            s.failed_plain += 1;
        }
        let reason = failure_reason(error);
        *s.failures_by_reason.entry(reason.clone()).or_default() += 1;
        s.failure_examples
            .entry(reason)
            .or_insert_with(|| error.to_string());
    }

    /// Until `done`: every `COLLECT_EVERY`, stops and removes the sandboxes that are not
    /// ready and older than `COLLECT_AFTER`. A creation that failed after its netns and
    /// address were set up (a DEL of its cleanup refused while the primary's config was
    /// gone, the runtime restarted mid-creation) leaves such a sandbox holding its
    /// address; the kubelet's garbage collection removes them, and without it a long
    /// run exhausts the node's addresses. The workload's own sandboxes being removed are
    /// not ready too: removing one twice is harmless (not found counts as removed).
    async fn collect_not_ready(&self, done: &AtomicBool) {
        while !done.load(Ordering::SeqCst) {
            tokio::time::sleep(COLLECT_EVERY).await;
            let Ok(c) = connect(&self.config.cri_endpoint).await else {
                continue;
            };
            let Ok(list) = c.list_sandboxes(&SandboxFilter::default()).await else {
                continue;
            };
            let now_ns = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as i64);
            for sb in list {
                let age_ns = now_ns.saturating_sub(sb.created_at_nanos);
                if sb.state == SandboxState::Ready || age_ns < COLLECT_AFTER.as_nanos() as i64 {
                    continue;
                }
                self.stopping.mark(&sb.id, self.clock.now_ms());
                let removed = match c.stop_sandbox(&sb.id).await {
                    Ok(()) => c.remove_sandbox(&sb.id).await,
                    Err(e) => Err(e),
                };
                if removed.is_ok() {
                    self.lock_stats().collected_not_ready += 1;
                }
            }
        }
    }

    /// Stops and removes `id`, retrying for a while; false when it is still there.
    async fn remove(&self, id: &str) -> bool {
        let deadline = tokio::time::Instant::now() + REMOVE_PATIENCE;
        loop {
            if let Ok(c) = connect(&self.config.cri_endpoint).await {
                let done = match c.stop_sandbox(id).await {
                    Ok(()) => c.remove_sandbox(id).await,
                    Err(e) => Err(e),
                };
                match done {
                    Ok(()) => return true,
                    Err(e) if e.is_not_found() => return true,
                    Err(e) => {
                        let cleared = clear_unreadable_cni_cache(id, &e.to_string());
                        let thawed = thaw_stuck_freezer(id, &e.to_string());
                        let mut s = self.lock_stats();
                        s.unreadable_cni_caches.extend(cleared);
                        s.stuck_freezers_thawed.extend(thawed);
                    }
                }
            }
            self.lock_stats().remove_retries += 1;
            if tokio::time::Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// How many residents should exist once sandbox number `k` (from 0) started: one more
/// at the start of each of `resident` equal stretches of the run.
pub fn residents_due(k: u64, creations: u64, resident: u64) -> u64 {
    if resident == 0 {
        return 0;
    }
    let stride = (creations / resident).max(1);
    (k / stride + 1).min(resident)
}

/// Where containerd's libcni caches each ADD's result (`<network>-<sandbox>-<ifname>`).
const CNI_RESULTS: &str = "/var/lib/cni/results";

/// A runtime fault, not interlock's: containerd 1.6's libcni writes its result cache in
/// place, so containerd killed (the `containerd_restart` chaos) between the create and
/// the write of that file leaves it empty or cut short, and from then on every DEL of the
/// sandbox fails before any plugin runs ("failed to get network … cached result:
/// decoding version from network config: unexpected end of JSON input"): the sandbox can
/// never be removed. When `error` is that failure, removes the cache files of `sandbox`
/// that are not JSON, as an operator would (the DEL then runs without the cached result,
/// and every plugin, interlock's included, still has to release what it holds), and
/// returns them. Anything else returns nothing and changes nothing.
pub fn clear_unreadable_cni_cache(sandbox: &str, error: &str) -> Vec<String> {
    clear_unreadable_cni_cache_in(std::path::Path::new(CNI_RESULTS), sandbox, error)
}

/// [`clear_unreadable_cni_cache`] with the cache in `dir`.
fn clear_unreadable_cni_cache_in(dir: &std::path::Path, sandbox: &str, error: &str) -> Vec<String> {
    if !error.contains("cached result") {
        return Vec::new();
    }
    let marker = format!("-{sandbox}-");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(&marker))
        .filter(|e| {
            std::fs::read(e.path())
                .is_ok_and(|data| serde_json::from_slice::<serde_json::Value>(&data).is_err())
        })
        .filter(|e| std::fs::remove_file(e.path()).is_ok())
        .map(|e| e.path().display().to_string())
        .collect()
}

/// The cgroup v1 freezer hierarchy where runc puts the kit's sandboxes (`k8s.io/<id>`).
const FREEZER: &str = "/sys/fs/cgroup/freezer/k8s.io";

/// A runtime fault, not interlock's: with cgroup v1, runc stops a container by freezing
/// its cgroup, signalling every task and thawing it. When the freeze starts while the
/// container's init is exec'ing its program (a sandbox stopped the moment it started),
/// the kernel's exec waits for the init's other thread to die, which the freezer holds:
/// the cgroup stays `FREEZING` for ever and every StopPodSandbox of the sandbox times out
/// ("failed to kill sandbox container"). When `error` is that failure and the sandbox's
/// freezer cgroup is `FREEZING`, thaws it, as an operator would (the exec, then the
/// runtime's kill, complete), and returns the cgroup. Anything else changes nothing.
pub fn thaw_stuck_freezer(sandbox: &str, error: &str) -> Vec<String> {
    thaw_stuck_freezer_in(std::path::Path::new(FREEZER), sandbox, error)
}

/// [`thaw_stuck_freezer`] with the freezer hierarchy at `root`.
fn thaw_stuck_freezer_in(root: &std::path::Path, sandbox: &str, error: &str) -> Vec<String> {
    if !error.contains("failed to kill sandbox container")
        || sandbox.is_empty()
        || !sandbox.chars().all(|c| c.is_ascii_hexdigit())
    {
        return Vec::new();
    }
    let cgroup = root.join(sandbox);
    let state = cgroup.join("freezer.state");
    match std::fs::read_to_string(&state) {
        Ok(s) if s.trim() == "FREEZING" && std::fs::write(&state, "THAWED").is_ok() => {
            vec![cgroup.display().to_string()]
        }
        _ => Vec::new(),
    }
}

/// Stops and removes every sandbox the runtime still lists (ready or not), retrying for
/// up to `patience`; returns the ones that could not be removed, with why, the
/// unreadable libcni caches it had to clear ([`clear_unreadable_cni_cache`]) and the
/// freezer cgroups it had to thaw ([`thaw_stuck_freezer`]).
pub async fn sweep(
    endpoint: &str,
    stopping: &Stopping,
    clock: &Clock,
    patience: Duration,
) -> (Vec<String>, Vec<String>, Vec<String>) {
    let deadline = tokio::time::Instant::now() + patience;
    let mut problems = Vec::new();
    let mut cleared = Vec::new();
    let mut thawed = Vec::new();
    loop {
        problems.clear();
        match connect(endpoint).await {
            Err(e) => problems.push(format!("connecting to {endpoint}: {e}")),
            Ok(c) => match c.list_sandboxes(&SandboxFilter::default()).await {
                Err(e) => problems.push(format!("listing sandboxes: {e}")),
                Ok(list) if list.is_empty() => return (Vec::new(), cleared, thawed),
                Ok(list) => {
                    for s in list {
                        stopping.mark(&s.id, clock.now_ms());
                        let done = match c.stop_sandbox(&s.id).await {
                            Ok(()) => c.remove_sandbox(&s.id).await,
                            Err(e) => Err(e),
                        };
                        if let Err(e) = done {
                            cleared.extend(clear_unreadable_cni_cache(&s.id, &e.to_string()));
                            thawed.extend(thaw_stuck_freezer(&s.id, &e.to_string()));
                            problems.push(format!("sandbox {}: {e}", s.id));
                        }
                    }
                }
            },
        }
        if tokio::time::Instant::now() > deadline {
            return (problems, cleared, thawed);
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
    text.contains("transport")
        || text.contains("connect")
        || text.contains("unavailable")
        || text.contains("broken pipe")
}

/// The Pod object of a sandbox config, as the kubelet's pod is in the API: its
/// annotations, and the containers a mesh's injector adds ([`interlock_testkit_node::node::pod_spec`]).
pub fn pod_object(pod: &SandboxConfig) -> serde_json::Value {
    serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod.metadata.name, "namespace": pod.metadata.namespace,
                     "uid": pod.metadata.uid, "annotations": pod.annotations},
        "spec": interlock_testkit_node::node::pod_spec(&pod.annotations),
        "status": {"phase": "Running"}})
}

/// One request to the fake API at `url` (`http://host:port`), without credentials;
/// `Ok` for a 2xx answer (and for a DELETE of what is gone already).
pub fn api_call(
    url: &str,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> Result<(), String> {
    use std::io::{Read, Write};
    let host = url.trim_start_matches("http://").trim_end_matches('/');
    let mut stream = std::net::TcpStream::connect(host).map_err(|e| format!("{url}: {e}"))?;
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream
        .write_all(request.as_bytes())
        .map_err(|e| format!("{method} {path}: {e}"))?;
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    let code: u16 = answer
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    if (200..300).contains(&code) || (method == "DELETE" && code == 404) {
        Ok(())
    } else {
        Err(format!(
            "{method} {path}: {}",
            answer.lines().next().unwrap_or("no answer")
        ))
    }
}

/// A short, stable reason for a failed creation: the known causes by name, anything
/// else by its first words with IDs and numbers removed.
pub fn failure_reason(error: &str) -> String {
    let e = error.to_lowercase();
    let known: &[(&str, &str)] = &[
        (
            "cni plugin not initialized",
            "no CNI config loaded (cni plugin not initialized)",
        ),
        (
            "failed to find plugin \"interlock-cni\"",
            "interlock-cni binary missing",
        ),
        (
            "bin/interlock-cni: no such file",
            "interlock-cni binary missing",
        ),
        ("failed to find plugin", "a plugin binary missing"),
        (
            "netplugin failed with no error message: fork/exec",
            "a plugin binary missing",
        ),
        (
            "text file busy",
            "plugin binary being replaced (text file busy)",
        ),
        (
            "this node has no primary cni config yet",
            "interlock's holding config refused it (no primary config)",
        ),
        (
            "is held: it is meshed by",
            "guard mode held a meshed pod (the mesh's plugin cannot run)",
        ),
        (
            "plugin type=\"interlock-cni\"",
            "interlock-cni refused the ADD",
        ),
        ("unavailable", "containerd unavailable (restarting)"),
        ("transport error", "containerd unavailable (restarting)"),
        (
            "server is not initialized yet",
            "containerd unavailable (restarting)",
        ),
        (
            "operation was canceled",
            "containerd unavailable (restarting)",
        ),
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

    /// The 10-minute soak's one leak: a sandbox whose freezer cgroup stayed FREEZING
    /// (its init exec'ing when the stop began) could never be stopped. Only that state,
    /// for that error, is thawed.
    #[test]
    fn only_a_freezing_cgroup_of_that_sandbox_is_thawed_and_only_for_that_error() {
        let t = interlock_testkit::tempdir().unwrap();
        let id = "1eacdd7458f73e77";
        let err = format!("CRI StopPodSandbox for sandbox {id}: Unknown: failed to stop sandbox container \"{id}\" in \"SANDBOX_READY\" state: failed to kill sandbox container: context deadline exceeded: unknown");
        let state = t.path().join(id).join("freezer.state");
        std::fs::create_dir_all(state.parent().unwrap()).unwrap();
        for (now, thaws) in [
            ("FROZEN\n", false),
            ("THAWED\n", false),
            ("FREEZING\n", true),
        ] {
            std::fs::write(&state, now).unwrap();
            assert!(thaw_stuck_freezer_in(t.path(), id, "transport error").is_empty());
            let thawed = thaw_stuck_freezer_in(t.path(), id, &err);
            assert_eq!(thawed.len(), usize::from(thaws), "{now}");
            let after = std::fs::read_to_string(&state).unwrap();
            assert_eq!(after.trim(), if thaws { "THAWED" } else { now.trim() });
        }
        // No such cgroup (cgroup v2, or another sandbox), or an ID that is not one.
        assert!(thaw_stuck_freezer_in(t.path(), "abc123", &err).is_empty());
        assert!(thaw_stuck_freezer_in(t.path(), "../x", &err).is_empty());
    }

    #[test]
    fn only_an_unreadable_cache_of_that_sandbox_is_cleared_and_only_for_that_error() {
        let dir = tempfile::tempdir().unwrap();
        let put = |name: &str, data: &str| std::fs::write(dir.path().join(name), data).unwrap();
        put("net-aaa-eth0", "");
        put(
            "cni-loopback-aaa-lo",
            r#"{"kind":"cniCacheV1","result":{}}"#,
        );
        put("net-aaa-net1", r#"{"kind":"cniCache"#);
        put("net-bbb-eth0", "");
        let decode = "failed to get network \"net\" cached result: decoding version from network config: unexpected end of JSON input";
        assert!(clear_unreadable_cni_cache_in(dir.path(), "aaa", "transport error").is_empty());
        let mut cleared = clear_unreadable_cni_cache_in(dir.path(), "aaa", decode);
        cleared.sort();
        let names: Vec<String> = cleared
            .iter()
            .map(|p| {
                std::path::Path::new(p)
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        assert_eq!(names, ["net-aaa-eth0", "net-aaa-net1"]);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["cni-loopback-aaa-lo", "net-bbb-eth0"]);
    }

    #[test]
    fn residents_are_due_one_per_stretch_and_never_more_than_asked() {
        assert_eq!(residents_due(0, 80, 4), 1);
        assert_eq!(residents_due(19, 80, 4), 1);
        assert_eq!(residents_due(20, 80, 4), 2);
        assert_eq!(residents_due(79, 80, 4), 4);
        assert_eq!(residents_due(500, 80, 4), 4);
        assert_eq!(residents_due(3, 5, 8), 4);
        assert_eq!(residents_due(10, 100, 0), 0);
    }

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
            failure_reason("plugin type=\"interlock-cni\" failed (add): netplugin failed with no error message: fork/exec /x/bin/interlock-cni: no such file or directory"),
            "interlock-cni binary missing"
        );
        assert_eq!(
            failure_reason("plugin type=\"interlock-cni\" failed (add): code 104: probe"),
            "interlock-cni refused the ADD"
        );
        assert_eq!(
            failure_reason("plugin type=\"istio-cni\" name=\"istio-cni\" failed (add): netplugin failed with no error message: fork/exec /x/bin/istio-cni: no such file or directory"),
            "a plugin binary missing"
        );
        assert_eq!(
            failure_reason("plugin type=\"interlock-cni\" failed (add): pod soak/soak46-m is held: it is meshed by istio-cni, and istio-cni cannot run"),
            "guard mode held a meshed pod (the mesh's plugin cannot run)"
        );
        assert_eq!(
            failure_reason("plugin type=\"interlock-cni\" failed (add): ADD refused: this node has no primary CNI config yet, so no pod can get an address"),
            "interlock's holding config refused it (no primary config)"
        );
        let a = failure_reason("weird thing 12ab happened to pod 7");
        let b = failure_reason("weird thing 99ff happened to pod 3");
        assert_eq!(a, b);
        assert_eq!(a, "other: weird thing happened to pod");
    }
}

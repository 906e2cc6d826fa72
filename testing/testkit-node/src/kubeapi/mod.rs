//! A fake Kubernetes API server, in process, for tests: a real HTTP/1.1 server on
//! 127.0.0.1 that answers what interlock's agent and CLI call the way kube-apiserver does.
//!
//! Served: core/v1 `nodes` (+ `status`), `pods` (+ `status`, `eviction`, and the
//! all-namespaces list/watch), events.k8s.io/v1 `events`, policy/v1
//! `poddisruptionbudgets` (+ `status`), apps/v1 `daemonsets` (+ `status`),
//! rbac.authorization.k8s.io/v1 `clusterroles`, `clusterrolebindings`, `roles` and
//! `rolebindings`, admissionregistration.k8s.io/v1 validating admission policies and
//! their bindings, and the discovery documents clients read.
//! Lists and watches honour `resourceVersion` (unset, `"0"`, a version, `Exact`),
//! `limit`/`continue`, `fieldSelector`, `labelSelector`, `allowWatchBookmarks`,
//! `timeoutSeconds` and `sendInitialEvents`; a version older than the retained history is
//! 410 Gone. Writes stamp `uid`, `creationTimestamp`, `generation`, `managedFields` and a
//! global `resourceVersion`, enforce `resourceVersion`/UID preconditions (409), and patch
//! by content type (merge, strategic merge, JSON patch, server-side apply with field
//! ownership). A bound pod is deleted gracefully (Terminating, then a simulated kubelet
//! removes it); an eviction is refused (429) while a PodDisruptionBudget allows no
//! disruption. Another object with finalizers, or deleted with
//! `propagationPolicy=Foreground`, stays with `deletionTimestamp` until its last finalizer
//! is taken away (no garbage collector runs here: the test plays it).
//!
//! The test side: direct object access, a request log, per-client load counters, and
//! fault injection (`fail_next`, `compact_history`, `restart`, `hang_writes`). Unknown
//! fields in a write are dropped (with a `Warning` header) or refused under
//! `fieldValidation=Strict`, as the real server does.

mod admission;
pub use admission::{UserInfo, NODE_NAME_CLAIM};
mod apply;
mod meta;
mod patch;
mod prune;
mod select;
mod server;
mod store;

use serde_json::Value;
use server::{lock, Shared};
use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The request header load is counted under (the User-Agent when it is absent).
pub const CLIENT_HEADER: &str = "x-client-id";

/// How the fake behaves where the real server is configurable or random.
#[derive(Debug, Clone)]
pub struct Config {
    /// How many changes are kept for watches to resume from; a watch from a version
    /// older than that is answered 410 Gone (the real watch cache keeps a window too).
    pub history_limit: usize,
    /// How often a watch with `allowWatchBookmarks=true` gets a BOOKMARK (about a minute
    /// on a real server).
    pub bookmark_interval: Duration,
    /// How long a watch without `timeoutSeconds` stays open (30–60 min on a real server).
    pub default_watch_timeout: Duration,
    /// How long after a graceful pod deletion (or eviction) the simulated kubelet removes
    /// the pod; `None`: it stays Terminating until the test calls `delete_object`.
    pub kubelet_deletes_after: Option<Duration>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            history_limit: 10_000,
            bookmark_interval: Duration::from_secs(60),
            default_watch_timeout: Duration::from_secs(1800),
            kubelet_deletes_after: Some(Duration::ZERO),
        }
    }
}

/// One request the server received, for tests to assert on.
#[derive(Debug, Clone)]
pub struct RequestRecord {
    /// `GET`, `POST`, `PATCH`, …
    pub method: String,
    /// The URL path, e.g. `/api/v1/pods`.
    pub path: String,
    /// The raw query string.
    pub query: String,
    /// The query, decoded, in order.
    pub params: Vec<(String, String)>,
    /// The `Content-Type` header, if any.
    pub content_type: Option<String>,
    /// The request body as text.
    pub body: String,
    /// The `User-Agent` header ("" when absent).
    pub user_agent: String,
    /// The key load is counted under ([`CLIENT_HEADER`], else the User-Agent).
    pub client: String,
    /// The HTTP status answered.
    pub status: u16,
}

impl RequestRecord {
    /// The decoded value of query parameter `name`.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether this was a watch (`watch=true` or `watch=1`).
    pub fn is_watch(&self) -> bool {
        matches!(self.param("watch"), Some("true" | "1"))
    }

    /// The body parsed as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// Requests and bytes one client caused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientLoad {
    /// Every request, including failed ones.
    pub requests: u64,
    /// List requests (GET of a collection without `watch`).
    pub lists: u64,
    /// Watch requests.
    pub watches: u64,
    /// POST, PUT, PATCH and DELETE requests.
    pub writes: u64,
    /// Request body bytes received.
    pub bytes_in: u64,
    /// Response body bytes sent, including watch streams so far.
    pub bytes_out: u64,
}

/// An injected failure: the next `remaining` requests that match get `code`.
#[derive(Debug, Clone)]
pub struct FailRule {
    /// How many more requests fail.
    pub remaining: usize,
    /// The HTTP status they get, with the `Status` body a real server sends for it.
    pub code: u16,
    /// Only this method (`PATCH`, …); `None`: any write (POST, PUT, PATCH, DELETE).
    pub method: Option<String>,
    /// Only paths containing this.
    pub path_contains: Option<String>,
}

impl FailRule {
    fn applies(&self, method: &str, path: &str) -> bool {
        let method_ok = match &self.method {
            Some(m) => m.eq_ignore_ascii_case(method),
            None => matches!(method, "POST" | "PUT" | "PATCH" | "DELETE"),
        };
        method_ok
            && self
                .path_contains
                .as_deref()
                .is_none_or(|p| path.contains(p))
    }
}

/// A running fake API server. Dropping it stops the server.
pub struct KubeApi {
    shared: Arc<Shared>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for KubeApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeApi").field("url", &self.url()).finish()
    }
}

fn resource_type(plural: &str) -> &'static meta::ResourceType {
    meta::resource_by_plural(plural).unwrap_or_else(|| {
        panic!(
            "kubeapi: no resource {plural:?}; served: {:?}",
            meta::RESOURCES.iter().map(|r| r.plural).collect::<Vec<_>>()
        )
    })
}

impl KubeApi {
    /// Starts a server with the default [`Config`] on 127.0.0.1 and an ephemeral port.
    pub fn start() -> io::Result<KubeApi> {
        KubeApi::start_with(Config::default())
    }

    /// Starts a server with `config`. It runs on its own thread and runtime, so it
    /// works the same from a plain `#[test]` and from `#[tokio::test]`.
    pub fn start_with(config: Config) -> io::Result<KubeApi> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (restart, _) = tokio::sync::watch::channel(0u64);
        let shared = Arc::new(Shared {
            store: Mutex::new(store::Store::new(config.history_limit)),
            config,
            log: Mutex::new(Vec::new()),
            load: Mutex::new(BTreeMap::new()),
            faults: Mutex::new(Vec::new()),
            interpose: Mutex::new(Vec::new()),
            restart,
            active_watches: AtomicUsize::new(0),
            down: AtomicBool::new(false),
            hang_writes: AtomicBool::new(false),
            users: Mutex::new(BTreeMap::new()),
            hung: AtomicUsize::new(0),
            addr,
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("kubeapi")
            .enable_all()
            .build()?;
        let (shutdown, stop) = tokio::sync::oneshot::channel::<()>();
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("kubeapi".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => {
                            eprintln!("kubeapi: cannot serve on {addr}: {e}");
                            return;
                        }
                    };
                    tokio::pin!(stop);
                    loop {
                        tokio::select! {
                            _ = &mut stop => return,
                            accepted = listener.accept() => {
                                let Ok((stream, _)) = accepted else { continue };
                                tokio::spawn(serve_connection(sh.clone(), stream));
                            }
                        }
                    }
                });
                runtime.shutdown_background();
            })?;
        Ok(KubeApi {
            shared,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.shared.addr)
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// Writes a kubeconfig for this server (plain HTTP, no credentials, namespace
    /// `default`) that kubectl, kube-rs and the Python client load.
    pub fn write_kubeconfig(&self, path: &Path) -> io::Result<()> {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
             users:\n- name: fake\n  user:\n    token: fake-token\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\n\
             current-context: fake\npreferences: {{}}\n",
            self.url()
        );
        std::fs::write(path, text)
    }

    /// Registers `token`: a request with `Authorization: Bearer <token>` is `user`'s, and
    /// RBAC (the stored ClusterRoles and ClusterRoleBindings) and the stored
    /// ValidatingAdmissionPolicies apply to it. Requests without a registered token stay
    /// the admin's.
    pub fn add_token(&self, token: &str, user: UserInfo) {
        lock(&self.shared.users).insert(token.to_string(), user);
    }

    /// [`write_kubeconfig`](Self::write_kubeconfig) with `token` as the credentials.
    pub fn write_kubeconfig_with_token(&self, path: &Path, token: &str) -> io::Result<()> {
        self.write_kubeconfig(path)?;
        let text =
            std::fs::read_to_string(path)?.replace("token: fake-token", &format!("token: {token}"));
        std::fs::write(path, text)
    }

    /// Stores `obj` as given, bypassing validation and status resets (as the kubelet or a
    /// controller would have written it): the way to seed pod status or a PDB's computed
    /// status. Fills `uid`, `creationTimestamp`, `generation` when missing and sets a new
    /// `resourceVersion`; watchers see ADDED or MODIFIED. Panics when `apiVersion`/`kind`
    /// name no served type. Returns the stored object.
    pub fn put_object(&self, obj: Value) -> Value {
        let rt = meta::resource_of(&obj).unwrap_or_else(|| {
            panic!("kubeapi: put_object needs the apiVersion and kind of a served type, got {obj}")
        });
        lock(&self.shared.store).put(rt, obj)
    }

    /// The stored object `plural`/`namespace`/`name` (`namespace` is ignored for
    /// cluster-scoped types), with `kind` and `apiVersion`.
    pub fn get_object(&self, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        lock(&self.shared.store)
            .get(resource_type(plural), namespace, name)
            .cloned()
    }

    /// Every stored object of `plural` (`"pods"`, `"nodes"`, `"events"`,
    /// `"poddisruptionbudgets"`), ordered by namespace and name.
    pub fn objects(&self, plural: &str) -> Vec<Value> {
        lock(&self.shared.store).all(resource_type(plural))
    }

    /// Deletes an object at once, as a controller (or, for a terminating pod, its
    /// kubelet) would: watchers see DELETED.
    pub fn delete_object(&self, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        lock(&self.shared.store)
            .delete(
                resource_type(plural),
                namespace,
                name,
                &store::DeleteOpts {
                    grace_seconds: Some(0),
                    ignore_finalizers: true,
                    ..Default::default()
                },
            )
            .ok()
            .map(|d| d.object().clone())
    }

    /// The current global `resourceVersion`.
    pub fn resource_version(&self) -> u64 {
        lock(&self.shared.store).rv()
    }

    /// Every request received so far, oldest first.
    pub fn requests(&self) -> Vec<RequestRecord> {
        lock(&self.shared.log).clone()
    }

    /// Forgets the request log.
    pub fn clear_requests(&self) {
        lock(&self.shared.log).clear();
    }

    /// The next `n` writes (POST, PUT, PATCH, DELETE) fail with `code` and the `Status`
    /// body a real server sends for it (409: the stale-`resourceVersion` conflict).
    pub fn fail_next(&self, n: usize, code: u16) {
        self.fail_next_matching(FailRule {
            remaining: n,
            code,
            method: None,
            path_contains: None,
        });
    }

    /// Adds a failure rule; rules are tried in the order added.
    pub fn fail_next_matching(&self, rule: FailRule) {
        if rule.remaining > 0 {
            lock(&self.shared.faults).push(rule);
        }
    }

    /// Another writer's change, made at the worst moment: `obj` is stored (as by
    /// [`put_object`](Self::put_object)) just before the next `method` request whose path
    /// contains `path_contains` is served — between a client's read and its write, so a
    /// write with a `resourceVersion` precondition from that read meets a real conflict.
    pub fn put_before_next(&self, method: &str, path_contains: &str, obj: Value) {
        assert!(
            meta::resource_of(&obj).is_some(),
            "kubeapi: put_before_next needs the apiVersion and kind of a served type, got {obj}"
        );
        lock(&self.shared.interpose).push(server::Interpose {
            method: method.to_string(),
            path_contains: path_contains.to_string(),
            object: obj,
        });
    }

    /// Forgets every change up to now: a watch or `Exact` list from any older
    /// `resourceVersion` is answered 410 Gone, as after an etcd compaction.
    pub fn compact_history(&self) {
        lock(&self.shared.store).compact();
    }

    /// Keeps at most `n` changes from now on.
    pub fn set_history_limit(&self, n: usize) {
        lock(&self.shared.store).history_limit = n;
    }

    /// Simulates an API server restart: every open connection and watch stream is closed
    /// at once. With `forget_history`, the history is dropped too, as a fresh watch cache
    /// has none: clients resuming from an older version get 410 and must re-list.
    pub fn restart(&self, forget_history: bool) {
        self.stop();
        self.resume(forget_history);
    }

    /// Takes the server down: every open connection and watch stream is closed, and new
    /// connections are closed at once (as refused) until [`resume`](Self::resume). Writes
    /// through this handle still work: they are what other clients did meanwhile.
    pub fn stop(&self) {
        self.shared.down.store(true, Ordering::SeqCst);
        self.shared.restart.send_modify(|g| *g += 1);
        // The streams close on their own tasks: until they have, a write made next would
        // still reach a client through its old stream, which a real server that went
        // down could not do.
        self.wait_until(Duration::from_secs(5), |a| a.active_watches() == 0);
    }

    /// Brings the server back after [`stop`](Self::stop); with `forget_history`, clients
    /// that watched from before get 410 Gone.
    pub fn resume(&self, forget_history: bool) {
        if forget_history {
            self.compact_history();
        }
        self.shared.down.store(false, Ordering::SeqCst);
    }

    /// While `on`, every write (POST, PUT, PATCH, DELETE) is read and never answered, as
    /// by an API server that accepts requests and hangs; reads and watches still work.
    pub fn hang_writes(&self, on: bool) {
        self.shared.hang_writes.store(on, Ordering::SeqCst);
    }

    /// Writes held unanswered by [`hang_writes`](Self::hang_writes) so far.
    pub fn hung_writes(&self) -> usize {
        self.shared.hung.load(Ordering::SeqCst)
    }

    /// Watch streams open now.
    pub fn active_watches(&self) -> usize {
        self.shared.active_watches.load(Ordering::Relaxed)
    }

    /// Waits up to `timeout` until `cond(self)` holds; returns whether it did.
    pub fn wait_until(&self, timeout: Duration, mut cond: impl FnMut(&KubeApi) -> bool) -> bool {
        let end = Instant::now() + timeout;
        loop {
            if cond(self) {
                return true;
            }
            if Instant::now() >= end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Requests and bytes per client key ([`CLIENT_HEADER`], else User-Agent).
    pub fn load(&self) -> BTreeMap<String, ClientLoad> {
        lock(&self.shared.load)
            .iter()
            .map(|(k, c)| (k.clone(), c.snapshot()))
            .collect()
    }

    /// Zeroes the load counters; watch streams still open keep counting (their later
    /// bytes show in the next [`load`](Self::load)).
    pub fn reset_load(&self) {
        for c in lock(&self.shared.load).values() {
            c.reset();
        }
    }
}

async fn serve_connection(shared: Arc<Shared>, stream: tokio::net::TcpStream) {
    if shared.down.load(Ordering::SeqCst) {
        return;
    }
    let mut restart = shared.restart.subscribe();
    let sh = shared.clone();
    let svc = hyper::service::service_fn(move |req| server::handle(sh.clone(), req));
    let conn = hyper::server::conn::http1::Builder::new()
        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
    tokio::pin!(conn);
    tokio::select! {
        _ = &mut conn => {}
        // A restart closes the socket under the client, as a dying server does.
        _ = restart.changed() => {}
    }
}

impl Drop for KubeApi {
    fn drop(&mut self) {
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

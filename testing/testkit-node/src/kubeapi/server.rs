//! The HTTP side: hyper 1 on loopback, routing of the real URL layout (`/api/v1/…`,
//! `/apis/<group>/<version>/…`, `namespaces/<ns>/…`, subresources), discovery documents,
//! lists, watches as chunked JSON lines, writes, the Eviction subresource, the request log,
//! per-client load counters and injected failures.

use super::meta::{resource, resource_by_plural, ApiError, ResourceType, RESOURCES};
use super::patch;
use super::select::{FieldSelector, LabelSelector};
use super::store::{
    name_of, Change, ChangeType, DeleteOpts, Deleted, Part, Scope, Store, WriteMode,
};
use super::{ClientLoad, Config, FailRule, RequestRecord};
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, watch};

/// Per-client counters, shared with the bodies that stream to that client.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    requests: AtomicU64,
    lists: AtomicU64,
    watches: AtomicU64,
    writes: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
}

impl Counters {
    /// Zeroes every counter in place: bodies still streaming keep counting into it.
    pub fn reset(&self) {
        for c in [
            &self.requests,
            &self.lists,
            &self.watches,
            &self.writes,
            &self.bytes_in,
            &self.bytes_out,
        ] {
            c.store(0, Ordering::Relaxed);
        }
    }

    pub fn snapshot(&self) -> ClientLoad {
        ClientLoad {
            requests: self.requests.load(Ordering::Relaxed),
            lists: self.lists.load(Ordering::Relaxed),
            watches: self.watches.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
        }
    }
}

/// Everything the server and the test handle share.
pub(crate) struct Shared {
    pub store: Mutex<Store>,
    pub config: Config,
    pub log: Mutex<Vec<RequestRecord>>,
    pub load: Mutex<BTreeMap<String, Arc<Counters>>>,
    pub faults: Mutex<Vec<FailRule>>,
    /// Objects another writer stores just before the next matching request is served.
    pub interpose: Mutex<Vec<Interpose>>,
    /// Bumped by `restart()`: every connection and watch stream ends.
    pub restart: watch::Sender<u64>,
    pub active_watches: AtomicUsize,
    /// Between `stop()` and `resume()`: connections are closed as soon as accepted.
    pub down: std::sync::atomic::AtomicBool,
    /// While set, every write is read and never answered.
    pub hang_writes: std::sync::atomic::AtomicBool,
    /// Bearer tokens and the users they authenticate (RBAC and admission policies then
    /// apply); any other request is the admin's.
    pub users: Mutex<BTreeMap<String, super::admission::UserInfo>>,
    /// Writes held unanswered so far.
    pub hung: AtomicUsize,
    pub addr: SocketAddr,
}

/// A write by another client, made just before the next request matching `method` and
/// `path_contains` is served (between a client's read and its write).
pub(crate) struct Interpose {
    pub method: String,
    pub path_contains: String,
    pub object: serde_json::Value,
}

/// Locks a mutex, recovering it if a test thread panicked while holding it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A response body: one buffer, or the lines of a watch; counts bytes sent to its client.
pub(crate) struct ApiBody {
    full: Option<Bytes>,
    stream: Option<mpsc::Receiver<Bytes>>,
    counters: Arc<Counters>,
}

impl Body for ApiBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(b) = self.full.take() {
            self.counters
                .bytes_out
                .fetch_add(b.len() as u64, Ordering::Relaxed);
            return Poll::Ready(Some(Ok(Frame::data(b))));
        }
        let Some(rx) = self.stream.as_mut() else {
            return Poll::Ready(None);
        };
        match rx.poll_recv(cx) {
            Poll::Ready(Some(b)) => {
                self.counters
                    .bytes_out
                    .fetch_add(b.len() as u64, Ordering::Relaxed);
                Poll::Ready(Some(Ok(Frame::data(b))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.full.is_none() && self.stream.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match (&self.full, &self.stream) {
            (Some(b), None) => SizeHint::with_exact(b.len() as u64),
            (None, None) => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

fn respond(code: u16, body: &Value, counters: &Arc<Counters>) -> Response<ApiBody> {
    let bytes = Bytes::from(body.to_string());
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", "application/json")
        .header("cache-control", "no-cache, private")
        .body(ApiBody {
            full: Some(bytes),
            stream: None,
            counters: counters.clone(),
        })
        .expect("static headers are valid")
}

fn error(e: ApiError, counters: &Arc<Counters>) -> Response<ApiBody> {
    respond(e.code, &e.body, counters)
}

/// Percent-decodes a query component (`+` is a space, as Go's url.ParseQuery reads it).
fn decode(s: &str) -> String {
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub(crate) fn parse_query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (decode(k), decode(v)),
            None => (decode(p), String::new()),
        })
        .collect()
}

struct Query(Vec<(String, String)>);

impl Query {
    fn get(&self, k: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }
    fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("true" | "1"))
    }
    fn dry_run(&self) -> bool {
        self.get("dryRun") == Some("All")
    }
}

/// The resource a request path names.
struct Target {
    rt: &'static ResourceType,
    namespace: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

enum Route {
    Doc(Value),
    Resource(Target),
}

fn route(path: &str, addr: SocketAddr) -> Result<Route, ApiError> {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let (group, version, rest) = match segs.as_slice() {
        ["version"] => return Ok(Route::Doc(version_doc())),
        ["api"] => {
            return Ok(Route::Doc(json!({
                "kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": addr.to_string()}]
            })))
        }
        ["apis"] => return Ok(Route::Doc(group_list())),
        ["api", "v1", rest @ ..] => ("", "v1", rest),
        ["apis", g] => {
            return group_doc(g).map(Route::Doc).ok_or_else(ApiError::no_route);
        }
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(ApiError::no_route()),
    };
    if rest.is_empty() {
        return resource_list(group, version)
            .map(Route::Doc)
            .ok_or_else(ApiError::no_route);
    }
    let (namespace, rest) = match rest {
        ["namespaces", ns, tail @ ..] if !tail.is_empty() => (Some(ns.to_string()), tail),
        _ => (None, rest),
    };
    let rt = resource(group, rest[0])
        .filter(|r| r.version == version)
        .ok_or_else(ApiError::no_route)?;
    if namespace.is_some() && !rt.namespaced {
        return Err(ApiError::no_route());
    }
    let name = rest.get(1).map(|s| s.to_string());
    let sub = rest.get(2).map(|s| s.to_string());
    if rest.len() > 3 {
        return Err(ApiError::no_route());
    }
    if rt.namespaced && namespace.is_none() && name.is_some() {
        return Err(ApiError::no_route());
    }
    match (rt.plural, sub.as_deref()) {
        (_, None) => {}
        (_, Some("status")) if rt.status_subresource => {}
        ("pods", Some("eviction")) => {}
        _ => return Err(ApiError::no_route()),
    }
    Ok(Route::Resource(Target {
        rt,
        namespace,
        name,
        sub,
    }))
}

fn version_doc() -> Value {
    json!({
        "major": "1", "minor": "33", "emulationMajor": "1", "emulationMinor": "33",
        "gitVersion": "v1.33.0-interlock-fake", "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.24.0", "compiler": "gc", "platform": "linux/amd64"
    })
}

fn groups() -> Vec<&'static str> {
    let mut gs: Vec<&str> = RESOURCES
        .iter()
        .map(|r| r.group)
        .filter(|g| !g.is_empty())
        .collect();
    gs.dedup();
    gs
}

fn group_doc(g: &str) -> Option<Value> {
    let v = RESOURCES
        .iter()
        .find(|r| r.group == g && !g.is_empty())?
        .version;
    let gv = json!({"groupVersion": format!("{g}/{v}"), "version": v});
    Some(
        json!({"kind": "APIGroup", "apiVersion": "v1", "name": g, "versions": [gv], "preferredVersion": gv}),
    )
}

fn group_list() -> Value {
    let gs: Vec<Value> = groups()
        .into_iter()
        .filter_map(group_doc)
        .map(|mut g| {
            if let Value::Object(m) = &mut g {
                m.remove("kind");
                m.remove("apiVersion");
            }
            g
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": gs})
}

fn resource_list(group: &str, version: &str) -> Option<Value> {
    let mut rs = Vec::new();
    for r in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        rs.push(json!({
            "name": r.plural, "singularName": r.singular, "namespaced": r.namespaced, "kind": r.kind,
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
            "shortNames": r.short_names,
        }));
        if r.status_subresource {
            rs.push(json!({"name": format!("{}/status", r.plural), "singularName": "", "namespaced": r.namespaced,
                "kind": r.kind, "verbs": ["get", "patch", "update"]}));
        }
        if r.plural == "pods" {
            rs.push(json!({"name": "pods/eviction", "singularName": "", "namespaced": true, "group": "policy",
                "version": "v1", "kind": "Eviction", "verbs": ["create"]}));
        }
    }
    if rs.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": rs}),
    )
}

/// The key load is counted under: the `X-Client-Id` header, else the User-Agent.
fn client_key(req: &Request<Incoming>) -> String {
    let h = |n: &str| {
        req.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(String::from)
    };
    h(super::CLIENT_HEADER)
        .or_else(|| h("user-agent"))
        .unwrap_or_else(|| "-".into())
}

pub(crate) async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<ApiBody>, Infallible> {
    use http_body_util::BodyExt;
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let raw_query = req.uri().query().unwrap_or("").to_string();
    let content_type = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let user_agent = req
        .headers()
        .get("user-agent")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let client = client_key(&req);
    let user = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .and_then(|t| lock(&shared.users).get(t.trim()).cloned());
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let counters = lock(&shared.load)
        .entry(client.clone())
        .or_default()
        .clone();
    counters.requests.fetch_add(1, Ordering::Relaxed);
    counters
        .bytes_in
        .fetch_add(body.len() as u64, Ordering::Relaxed);
    let params = parse_query(&raw_query);
    let query = Query(params.clone());
    if shared.hang_writes.load(Ordering::SeqCst)
        && matches!(method.as_str(), "POST" | "PUT" | "PATCH" | "DELETE")
    {
        // An API server that accepts the request and never answers (a stuck etcd, a
        // half-open connection behind a load balancer): the client waits forever unless
        // it has a deadline. The connection ends when the server is dropped or restarted.
        shared.hung.fetch_add(1, Ordering::SeqCst);
        std::future::pending::<()>().await;
    }

    let call = Call {
        method: &method,
        path: &path,
        query: &query,
        content_type: content_type.as_deref(),
        user_agent: &user_agent,
        body: &body,
        user: user.as_ref(),
    };
    let interposed = {
        let mut pending = lock(&shared.interpose);
        pending
            .iter()
            .position(|i| {
                i.method.eq_ignore_ascii_case(call.method) && call.path.contains(&i.path_contains)
            })
            .map(|i| pending.remove(i))
    };
    if let Some(i) = interposed {
        if let Some(rt) = crate::kubeapi::meta::resource_of(&i.object) {
            lock(&shared.store).put(rt, i.object);
        }
    }
    let resp = serve(&shared, &call, &counters);
    let status = resp.status().as_u16();
    lock(&shared.log).push(RequestRecord {
        method,
        path,
        query: raw_query,
        params,
        content_type,
        body: String::from_utf8_lossy(&body).into_owned(),
        user_agent,
        client,
        status,
    });
    Ok(resp)
}

fn take_fault(shared: &Shared, method: &str, path: &str) -> Option<u16> {
    let mut faults = lock(&shared.faults);
    let i = faults.iter().position(|f| f.applies(method, path))?;
    faults[i].remaining -= 1;
    let code = faults[i].code;
    if faults[i].remaining == 0 {
        faults.remove(i);
    }
    Some(code)
}

/// One request, read.
struct Call<'a> {
    method: &'a str,
    path: &'a str,
    query: &'a Query,
    content_type: Option<&'a str>,
    user_agent: &'a str,
    body: &'a [u8],
    /// A registered token's user (RBAC and admission policies apply).
    user: Option<&'a super::admission::UserInfo>,
}

fn serve(shared: &Arc<Shared>, call: &Call<'_>, counters: &Arc<Counters>) -> Response<ApiBody> {
    let &Call {
        method,
        path,
        query,
        content_type,
        user_agent,
        body,
        user,
    } = call;
    // Who owns what this request writes: `fieldManager`, else the User-Agent's product.
    let manager_name = query
        .get("fieldManager")
        .filter(|m| !m.is_empty())
        .map(String::from)
        .unwrap_or_else(|| user_agent.split('/').next().unwrap_or("").to_string());
    let manager = Some(manager_name.as_str());
    let target = match route(path, shared.addr) {
        Ok(Route::Doc(d)) if method == "GET" => return respond(200, &d, counters),
        Ok(Route::Doc(_)) => return error(ApiError::method_not_allowed(), counters),
        Ok(Route::Resource(t)) => t,
        Err(e) => return error(e, counters),
    };
    // Count what was asked, failed or not: the load a client puts on the server.
    match (method, &target.name) {
        ("GET", None) if query.flag("watch") => counters.watches.fetch_add(1, Ordering::Relaxed),
        ("GET", None) => counters.lists.fetch_add(1, Ordering::Relaxed),
        ("POST" | "PUT" | "PATCH" | "DELETE", _) => counters.writes.fetch_add(1, Ordering::Relaxed),
        _ => 0,
    };
    if let Some(code) = take_fault(shared, method, path) {
        return error(
            ApiError::injected(code, Some(target.rt), target.name.as_deref().unwrap_or("")),
            counters,
        );
    }
    let rt = target.rt;
    let ns = target.namespace.clone().unwrap_or_default();
    let mut warnings: Vec<String> = vec![];
    // A registered user: RBAC first, then (for writes) the admission policies.
    let verb = match (method, target.name.is_some()) {
        ("GET", false) if query.flag("watch") => "watch",
        ("GET", false) => "list",
        ("GET", true) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", _) => "delete",
        _ => "",
    };
    let attrs = user.map(|u| super::admission::Attributes {
        user: u,
        verb,
        rt,
        sub: target.sub.as_deref(),
        namespace: &ns,
        name: target.name.as_deref().unwrap_or(""),
        dry_run: query.dry_run(),
    });
    let (policies, bindings) = match &attrs {
        Some(a) => {
            let (rbac, policies, bindings) = {
                let store = lock(&shared.store);
                let all = |plural| store.all(resource_by_plural(plural).expect("served"));
                (
                    super::admission::Rbac {
                        cluster_roles: all("clusterroles"),
                        cluster_role_bindings: all("clusterrolebindings"),
                        roles: all("roles"),
                        role_bindings: all("rolebindings"),
                    },
                    all("validatingadmissionpolicies"),
                    all("validatingadmissionpolicybindings"),
                )
            };
            if let Err(e) = super::admission::authorize(&rbac, a) {
                return error(e, counters);
            }
            (policies, bindings)
        }
        None => (vec![], vec![]),
    };
    let admit = |object: Option<&Value>, old: Option<&Value>| match &attrs {
        Some(a) => super::admission::admit(&policies, &bindings, a, object, old),
        None => Ok(()),
    };
    let result = match (method, target.name.as_deref(), target.sub.as_deref()) {
        ("GET", None, None) => {
            let scope = match scope(&target, query) {
                Ok(s) => s,
                Err(e) => return error(e, counters),
            };
            if query.flag("watch") {
                return start_watch(shared, scope, query, counters);
            }
            list(shared, &scope, query).map(|v| (200, v))
        }
        ("GET", Some(name), None | Some("status")) => lock(&shared.store)
            .get(rt, &ns, name)
            .cloned()
            .map(|o| (200, o))
            .ok_or_else(|| ApiError::not_found(rt, name)),
        ("POST", None, None) if rt.namespaced == target.namespace.is_some() => parse_body(body)
            .and_then(|obj| known_fields(rt, &obj, query, &mut warnings))
            .and_then(|obj| admit(Some(&obj), None).map(|()| obj))
            .and_then(|obj| {
                lock(&shared.store)
                    .create(rt, &ns, obj, query.dry_run(), manager)
                    .map(|o| (201, o))
            }),
        ("POST", Some(name), Some("eviction")) => {
            let admitted = match (&attrs, body.is_empty()) {
                (Some(_), false) => parse_body(body)
                    .and_then(|b| super::prune::prune_eviction(&b))
                    .and_then(|(e, _)| admit(Some(&e), None)),
                (Some(_), true) => admit(Some(&json!({})), None),
                (None, _) => Ok(()),
            };
            admitted.and_then(|()| evict(shared, &ns, name, body, query, &mut warnings)).map(|()| {
                (201, json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}))
            })
        }
        ("PUT", Some(name), sub @ (None | Some("status"))) => {
            let part = if sub.is_some() {
                Part::Status
            } else {
                Part::Main
            };
            parse_body(body)
                .and_then(|obj| known_fields(rt, &obj, query, &mut warnings))
                .and_then(|obj| {
                    lock(&shared.store)
                        .update(
                            rt,
                            &ns,
                            name,
                            WriteMode {
                                part,
                                dry_run: query.dry_run(),
                                manager,
                            },
                            |cur| {
                                admit(Some(&obj), cur)?;
                                Ok(obj)
                            },
                        )
                        .map(|(o, created)| (if created { 201 } else { 200 }, o))
                })
        }
        ("PATCH", Some(name), sub @ (None | Some("status"))) => {
            let part = if sub.is_some() {
                Part::Status
            } else {
                Part::Main
            };
            let ct = content_type.unwrap_or("");
            if patch::media_type(ct) == "application/apply-patch+yaml" {
                if attrs.is_some() {
                    return error(
                        ApiError::internal(
                            "the fake API server does not evaluate admission policies for server-side apply",
                        ),
                        counters,
                    );
                }
                server_side_apply(&mut lock(&shared.store), rt, &ns, name, part, query, body)
            } else {
                lock(&shared.store)
                    .update(
                        rt,
                        &ns,
                        name,
                        WriteMode {
                            part,
                            dry_run: query.dry_run(),
                            manager,
                        },
                        |cur| match cur {
                            Some(cur) => patch::apply(rt, ct, cur, body)
                                .and_then(|obj| known_fields(rt, &obj, query, &mut warnings))
                                .and_then(|obj| admit(Some(&obj), Some(cur)).map(|()| obj)),
                            None => Err(ApiError::not_found(rt, name)),
                        },
                    )
                    .map(|(o, _)| (200, o))
            }
        }
        ("DELETE", Some(name), None) => {
            let old = lock(&shared.store).get(rt, &ns, name).cloned();
            match old {
                Some(old) => admit(None, Some(&old))
                    .and_then(|()| delete(shared, rt, &ns, name, body, query)),
                None => delete(shared, rt, &ns, name, body, query),
            }
        }
        _ => Err(ApiError::method_not_allowed()),
    };
    let mut resp = match result {
        Ok((code, v)) => respond(code, &v, counters),
        Err(e) => error(e, counters),
    };
    for w in warnings {
        let value = format!("299 - \"unknown field \\\"{w}\\\"\"");
        if let Ok(v) = hyper::header::HeaderValue::from_str(&value) {
            resp.headers_mut().append("warning", v);
        }
    }
    resp
}

/// `obj` as the server keeps it: unknown fields dropped (`fieldValidation` `Warn`, the
/// default, adds a warning for each; `Ignore` does not), or a 400 naming them
/// (`Strict`).
fn known_fields(
    rt: &ResourceType,
    obj: &Value,
    q: &Query,
    warnings: &mut Vec<String>,
) -> Result<Value, ApiError> {
    let (kept, unknown) = super::prune::prune(rt, obj)?;
    field_validation(q, unknown, warnings)?;
    Ok(kept)
}

fn field_validation(
    q: &Query,
    unknown: Vec<String>,
    warnings: &mut Vec<String>,
) -> Result<(), ApiError> {
    match q.get("fieldValidation") {
        Some("Strict") if !unknown.is_empty() => Err(ApiError::bad_request(format!(
            "strict decoding error: {}",
            unknown
                .iter()
                .map(|u| format!("unknown field \"{u}\""))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
        Some("Ignore") => Ok(()),
        _ => {
            warnings.extend(unknown);
            Ok(())
        }
    }
}

/// PATCH with `application/apply-patch+yaml`: creates the object or applies to it. The
/// configuration must be JSON (YAML's JSON form), as kube-rs and the Python client send.
fn server_side_apply(
    store: &mut Store,
    rt: &'static ResourceType,
    ns: &str,
    name: &str,
    part: Part,
    q: &Query,
    body: &[u8],
) -> Result<(u16, Value), ApiError> {
    let manager = q
        .get("fieldManager")
        .filter(|m| !m.is_empty())
        .ok_or_else(|| {
            ApiError::bad_request(
                "PATCH with apply-patch+yaml requires the fieldManager query parameter",
            )
        })?;
    let config: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!(
            "error decoding YAML: this fake reads apply configurations in their JSON form: {e}"
        ))
    })?;
    match config["metadata"]["name"].as_str() {
        Some(n) if n == name => {}
        _ => {
            return Err(ApiError::bad_request(format!(
                "the name of the object must match the name on the URL ({name})"
            )))
        }
    }
    let force = q.flag("force");
    let status = part == Part::Status;
    let current = store.get(rt, ns, name).cloned();
    let merged = super::apply::apply(rt, current.as_ref(), &config, manager, force, status)?;
    if current.is_none() {
        if status {
            return Err(ApiError::not_found(rt, name));
        }
        return store
            .create(rt, ns, merged, q.dry_run(), None)
            .map(|o| (201, o));
    }
    store
        .update(
            rt,
            ns,
            name,
            WriteMode {
                part,
                dry_run: q.dry_run(),
                manager: None,
            },
            |_| Ok(merged),
        )
        .map(|(o, _)| (200, o))
}

fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding request body as JSON: {e}")))
}

fn scope(t: &Target, q: &Query) -> Result<Scope, ApiError> {
    Ok(Scope {
        rt: t.rt,
        namespace: t.namespace.clone(),
        fields: FieldSelector::parse(q.get("fieldSelector").unwrap_or(""), t.rt)?,
        labels: LabelSelector::parse(q.get("labelSelector").unwrap_or(""))?,
    })
}

fn parse_rv(s: &str) -> Result<u64, ApiError> {
    s.parse().map_err(|_| {
        ApiError::bad_request(format!(
            "invalid resource version {s:?}: a resourceVersion is an integer"
        ))
    })
}

fn list_kind(rt: &ResourceType) -> String {
    format!("{}List", rt.kind)
}

fn list(shared: &Shared, scope: &Scope, q: &Query) -> Result<Value, ApiError> {
    let rv = q.get("resourceVersion").filter(|s| !s.is_empty());
    let rv_match = q.get("resourceVersionMatch").filter(|s| !s.is_empty());
    let limit = q
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let store = lock(&shared.store);
    // A later page: the state at the first page's version, after its last key.
    if let Some(token) = q.get("continue").filter(|c| !c.is_empty()) {
        if rv.is_some() {
            return Err(ApiError::bad_request(
                "specifying resource version is not allowed when using continue",
            ));
        }
        let (at, after) = decode_continue(token)?;
        let items = store.list_at(scope, at).map_err(|_| {
            ApiError::expired(
                "The provided continue parameter is too old to display a consistent list result. \
                 You can start a new list without the continue parameter."
                    .into(),
            )
        })?;
        let rest: Vec<Value> = items.into_iter().filter(|o| item_key(o) > after).collect();
        return Ok(list_doc(scope.rt, rest, at, limit));
    }
    let (items, at) = match (rv, rv_match) {
        (None, Some(_)) => {
            return Err(ApiError::bad_request(
                "resourceVersionMatch is forbidden unless resourceVersion is provided",
            ))
        }
        (Some("0"), Some("Exact")) => {
            return Err(ApiError::bad_request(
                "resourceVersionMatch \"Exact\" is forbidden for resourceVersion \"0\"",
            ))
        }
        (Some(v), Some("Exact")) => {
            let at = parse_rv(v)?;
            if at > store.rv() {
                return Err(ApiError::timeout(format!(
                    "Too large resource version: {at}, current: {}",
                    store.rv()
                )));
            }
            (store.list_at(scope, at)?, at)
        }
        (v, None | Some("NotOlderThan")) => {
            if let Some(v) = v {
                let at = parse_rv(v)?;
                if at > store.rv() {
                    return Err(ApiError::timeout(format!(
                        "Too large resource version: {at}, current: {}",
                        store.rv()
                    )));
                }
            }
            (store.list(scope), store.rv())
        }
        (_, Some(m)) => {
            return Err(ApiError::bad_request(format!(
                "resourceVersionMatch: Unsupported value: {m:?}"
            )))
        }
    };
    // resourceVersion=0 is served from the cache, which ignores limit.
    let limit = if rv == Some("0") { None } else { limit };
    Ok(list_doc(scope.rt, items, at, limit))
}

fn item_key(o: &Value) -> (String, String) {
    (
        o["metadata"]["namespace"]
            .as_str()
            .unwrap_or("")
            .to_string(),
        name_of(o).to_string(),
    )
}

/// An opaque continue token: the list's version and the last key served, hex-encoded.
fn encode_continue(at: u64, last: &(String, String)) -> String {
    json!({"rv": at, "ns": last.0, "name": last.1})
        .to_string()
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn decode_continue(token: &str) -> Result<(u64, (String, String)), ApiError> {
    let bad = || ApiError::bad_request(format!("continue key is not valid: {token:?}"));
    let bytes: Option<Vec<u8>> = (0..token.len())
        .step_by(2)
        .map(|i| {
            token
                .get(i..i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        })
        .collect();
    let v: Value = serde_json::from_slice(&bytes.ok_or_else(bad)?).map_err(|_| bad())?;
    let at = v["rv"].as_u64().ok_or_else(bad)?;
    let ns = v["ns"].as_str().ok_or_else(bad)?.to_string();
    let name = v["name"].as_str().ok_or_else(bad)?.to_string();
    Ok((at, (ns, name)))
}

/// The list document: items without kind/apiVersion (as on the wire), at most `limit`
/// of them with a continue token and the count left when there are more.
fn list_doc(rt: &ResourceType, mut items: Vec<Value>, at: u64, limit: Option<usize>) -> Value {
    let mut meta = json!({"resourceVersion": at.to_string()});
    if let Some(limit) = limit.filter(|l| items.len() > *l) {
        let left = items.len() - limit;
        items.truncate(limit);
        let last = item_key(items.last().expect("limit is at least 1"));
        meta["continue"] = json!(encode_continue(at, &last));
        meta["remainingItemCount"] = json!(left);
    }
    for o in &mut items {
        if let Value::Object(m) = o {
            m.remove("kind");
            m.remove("apiVersion");
        }
    }
    json!({"kind": list_kind(rt), "apiVersion": rt.api_version(), "metadata": meta, "items": items})
}

/// The watch event a change makes for this scope, if any: an object that moves into the
/// selection is ADDED, one that moves out is DELETED, as the real watch cache reports.
fn event_for<'a>(scope: &Scope, c: &'a Change) -> Option<(&'static str, &'a Value)> {
    if c.rt.plural != scope.rt.plural {
        return None;
    }
    let now = scope.matches(&c.object);
    match c.kind {
        ChangeType::Added => now.then_some(("ADDED", &c.object)),
        ChangeType::Deleted => now.then_some(("DELETED", &c.object)),
        ChangeType::Modified => {
            let before = c.prev.as_ref().is_some_and(|p| scope.matches(p));
            match (before, now) {
                (true, true) => Some(("MODIFIED", &c.object)),
                (false, true) => Some(("ADDED", &c.object)),
                (true, false) => Some(("DELETED", &c.object)),
                (false, false) => None,
            }
        }
    }
}

fn line(kind: &str, obj: &Value) -> Bytes {
    let mut s = json!({"type": kind, "object": obj}).to_string();
    s.push('\n');
    Bytes::from(s)
}

fn bookmark(rt: &ResourceType, rv: u64, initial_end: bool) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    line(
        "BOOKMARK",
        &json!({"kind": rt.kind, "apiVersion": rt.api_version(), "metadata": meta}),
    )
}

/// What a watch starts with before following live changes.
enum Start {
    Lines(Vec<Bytes>),
    Fail(ApiError),
}

struct WatchGuard(Arc<Shared>);

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.0.active_watches.fetch_sub(1, Ordering::Relaxed);
    }
}

fn start_watch(
    shared: &Arc<Shared>,
    scope: Scope,
    q: &Query,
    counters: &Arc<Counters>,
) -> Response<ApiBody> {
    let rv = q
        .get("resourceVersion")
        .filter(|s| !s.is_empty())
        .map(String::from);
    let bookmarks = q.flag("allowWatchBookmarks");
    let send_initial = q.get("sendInitialEvents").map(|v| v == "true" || v == "1");
    if send_initial.is_some() && q.get("resourceVersionMatch") != Some("NotOlderThan") {
        return error(
            ApiError::invalid(scope.rt, "", &[("resourceVersionMatch", "Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan".into())]),
            counters,
        );
    }
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(shared.config.default_watch_timeout);
    let mut restart = shared.restart.subscribe();
    let (start, mut live, mut last_rv) = {
        let store = lock(&shared.store);
        let live = store.tx.subscribe();
        let current = store.rv();
        let start = match rv.as_deref() {
            // No version, or "0": synthetic ADDED events for the current state first
            // (unless sendInitialEvents=false asks for changes only).
            None | Some("0") => {
                let mut lines: Vec<Bytes> = if send_initial == Some(false) {
                    Vec::new()
                } else {
                    store
                        .list(&scope)
                        .iter()
                        .map(|o| line("ADDED", o))
                        .collect()
                };
                if send_initial == Some(true) {
                    lines.push(bookmark(scope.rt, current, true));
                }
                Start::Lines(lines)
            }
            Some(v) => match parse_rv(v) {
                Err(e) => Start::Fail(e),
                Ok(from) if from > current => Start::Fail(ApiError::timeout(format!(
                    "Too large resource version: {from}, current: {current}"
                ))),
                Ok(from) => match store.changes_since(from) {
                    Err(e) => Start::Fail(e),
                    Ok(changes) => {
                        let mut lines: Vec<Bytes> = changes
                            .iter()
                            .filter_map(|c| event_for(&scope, c))
                            .map(|(k, o)| line(k, o))
                            .collect();
                        if send_initial == Some(true) {
                            lines.push(bookmark(scope.rt, current, true));
                        }
                        Start::Lines(lines)
                    }
                },
            },
        };
        (start, live, current)
    };
    let (tx, rx) = mpsc::channel::<Bytes>(1024);
    let bookmark_every = shared.config.bookmark_interval;
    shared.active_watches.fetch_add(1, Ordering::Relaxed);
    let guard = WatchGuard(shared.clone());
    tokio::spawn(async move {
        let _guard = guard;
        let lines = match start {
            Start::Fail(e) => {
                // The real server answers 200 and reports the error as the only event.
                let _ = tx.send(line("ERROR", &e.body)).await;
                return;
            }
            Start::Lines(l) => l,
        };
        for l in lines {
            if tx.send(l).await.is_err() {
                return;
            }
        }
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut tick =
            tokio::time::interval_at(tokio::time::Instant::now() + bookmark_every, bookmark_every);
        loop {
            let out = tokio::select! {
                _ = &mut deadline => return,
                _ = restart.changed() => return,
                _ = tx.closed() => return,
                _ = tick.tick(), if bookmarks => bookmark(scope.rt, last_rv, false),
                c = live.recv() => match c {
                    Ok(c) if c.rv <= last_rv => continue,
                    Ok(c) => {
                        last_rv = c.rv;
                        match event_for(&scope, &c) {
                            Some((k, o)) => line(k, o),
                            None => continue,
                        }
                    }
                    // A watcher that falls this far behind is closed, as the real
                    // server closes a slow watcher; the client re-watches.
                    Err(broadcast::error::RecvError::Lagged(_)) | Err(broadcast::error::RecvError::Closed) => return,
                },
            };
            if tx.send(out).await.is_err() {
                return;
            }
        }
    });
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .header("cache-control", "no-cache, private")
        .body(ApiBody {
            full: None,
            stream: Some(rx),
            counters: counters.clone(),
        })
        .expect("static headers are valid")
}

fn delete_options(body: &[u8], q: &Query) -> Result<DeleteOpts, ApiError> {
    let opts: Value = if body.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        parse_body(body)?
    };
    let s = |v: &Value| v.as_str().filter(|s| !s.is_empty()).map(String::from);
    let dry_run = q.dry_run()
        || opts["dryRun"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x == "All"));
    let grace_seconds = q
        .get("gracePeriodSeconds")
        .and_then(|g| g.parse().ok())
        .or_else(|| opts["gracePeriodSeconds"].as_i64());
    let propagation = q
        .get("propagationPolicy")
        .map(String::from)
        .or_else(|| s(&opts["propagationPolicy"]));
    if let Some(p) = propagation
        .as_deref()
        .filter(|p| !["Foreground", "Background", "Orphan"].contains(p))
    {
        return Err(ApiError::bad_request(format!(
            "propagationPolicy: Unsupported value: \"{p}\": supported values: \"Foreground\", \"Background\", \"Orphan\""
        )));
    }
    Ok(DeleteOpts {
        uid: s(&opts["preconditions"]["uid"]),
        rv: s(&opts["preconditions"]["resourceVersion"]),
        dry_run,
        grace_seconds,
        propagation,
        ignore_finalizers: false,
    })
}

fn delete(
    shared: &Arc<Shared>,
    rt: &'static ResourceType,
    ns: &str,
    name: &str,
    body: &[u8],
    q: &Query,
) -> Result<(u16, Value), ApiError> {
    let opts = delete_options(body, q)?;
    let done = lock(&shared.store).delete(rt, ns, name, &opts)?;
    if let Deleted::Terminating(pod) = &done {
        if !opts.dry_run && rt.plural == "pods" {
            kubelet_finishes(shared, pod);
        }
    }
    let gone = done.object();
    // Kept for its finalizers: 202 Accepted with the object, as kube-apiserver answers a
    // deletion it has not finished.
    if rt.plural != "pods" && matches!(done, Deleted::Terminating(_)) {
        return Ok((202, gone.clone()));
    }
    if rt.delete_returns_object {
        return Ok((200, gone.clone()));
    }
    let mut details = json!({"name": name, "kind": rt.plural, "uid": gone["metadata"]["uid"]});
    if !rt.group.is_empty() {
        details["group"] = json!(rt.group);
    }
    Ok((
        200,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}),
    ))
}

/// The simulated kubelet: removes a terminating pod (grace 0, its UID) after the
/// configured delay.
fn kubelet_finishes(shared: &Arc<Shared>, pod: &Value) {
    let Some(after) = shared.config.kubelet_deletes_after else {
        return;
    };
    let pods = resource_by_plural("pods").expect("pods are served");
    let ns = pod["metadata"]["namespace"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let name = name_of(pod).to_string();
    let opts = DeleteOpts {
        uid: pod["metadata"]["uid"].as_str().map(String::from),
        grace_seconds: Some(0),
        ..Default::default()
    };
    let sh = shared.clone();
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        let _ = lock(&sh.store).delete(pods, &ns, &name, &opts);
    });
}

/// POST pods/<name>/eviction: deletes the pod unless the one PodDisruptionBudget that
/// selects it allows no disruption, which is a 429 with a DisruptionBudget cause.
fn evict(
    shared: &Arc<Shared>,
    ns: &str,
    name: &str,
    body: &[u8],
    q: &Query,
    warnings: &mut Vec<String>,
) -> Result<(), ApiError> {
    let dry_run = q.dry_run();
    // An Eviction is decoded like any typed object: unknown fields (kube-core's
    // `delete_options`) are dropped.
    let body = if body.is_empty() {
        vec![]
    } else {
        let (kept, unknown) = super::prune::prune_eviction(&parse_body(body)?)?;
        field_validation(q, unknown, warnings)?;
        kept.to_string().into_bytes()
    };
    let body = &body[..];
    let mut store = lock(&shared.store);
    let done = evict_locked(&mut store, ns, name, body, dry_run)?;
    drop(store);
    if let Some(Deleted::Terminating(pod)) = &done {
        if !dry_run {
            kubelet_finishes(shared, pod);
        }
    }
    Ok(())
}

fn evict_locked(
    store: &mut Store,
    ns: &str,
    name: &str,
    body: &[u8],
    dry_run: bool,
) -> Result<Option<Deleted>, ApiError> {
    let pods = resource_by_plural("pods").expect("pods are served");
    let pdbs_rt = resource_by_plural("poddisruptionbudgets").expect("PDBs are served");
    let eviction: Value = if body.is_empty() {
        json!({})
    } else {
        parse_body(body)?
    };
    if let Some(n) = eviction["metadata"]["name"].as_str() {
        if n != name {
            return Err(ApiError::bad_request(
                "name in URL does not match name in Eviction object",
            ));
        }
    }
    let del = &eviction["deleteOptions"];
    let pre = &del["preconditions"];
    let s = |v: &Value| v.as_str().filter(|s| !s.is_empty()).map(String::from);
    let opts = DeleteOpts {
        uid: s(&pre["uid"]),
        rv: s(&pre["resourceVersion"]),
        dry_run,
        grace_seconds: del["gracePeriodSeconds"].as_i64(),
        ..Default::default()
    };
    let check_only = DeleteOpts {
        dry_run: true,
        ..opts.clone()
    };
    let Some(pod) = store.get(pods, ns, name).cloned() else {
        return Err(ApiError::not_found(pods, name));
    };
    let phase = pod["status"]["phase"].as_str().unwrap_or("");
    let terminal_or_pending = matches!(phase, "Succeeded" | "Failed" | "Pending");
    if terminal_or_pending || pod["metadata"].get("deletionTimestamp").is_some() {
        return store.delete(pods, ns, name, &opts).map(Some);
    }
    let labels = pod["metadata"].get("labels");
    let matching: Vec<Value> = store
        .all(pdbs_rt)
        .into_iter()
        .filter(|p| p["metadata"]["namespace"].as_str() == Some(ns))
        .filter(|p| {
            p["spec"]
                .get("selector")
                .and_then(LabelSelector::from_object)
                .is_some_and(|s| s.matches(labels))
        })
        .collect();
    let pdb = match matching.as_slice() {
        [] => return store.delete(pods, ns, name, &opts).map(Some),
        [one] => one.clone(),
        _ => {
            return Err(ApiError::internal(
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            ))
        }
    };
    let st = &pdb["status"];
    let int = |v: &Value| v.as_i64().unwrap_or(0);
    let pdb_name = name_of(&pdb).to_string();
    let ready = pod["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    });
    if !ready {
        let always = pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow";
        let desired = int(&st["desiredHealthy"]);
        if always || (desired > 0 && int(&st["currentHealthy"]) >= desired) {
            return store.delete(pods, ns, name, &opts).map(Some);
        }
    }
    let cause = |m: String| Some(json!([{"reason": "DisruptionBudget", "message": m}]));
    if int(&st["observedGeneration"]) < int(&pdb["metadata"]["generation"]) {
        return Err(ApiError::too_many_requests(
            "Cannot evict pod as it would violate the pod's disruption budget.".into(),
            cause(format!(
                "The disruption budget {pdb_name} is still being processed by the server."
            )),
        ));
    }
    let allowed = int(&st["disruptionsAllowed"]);
    if allowed < 0 {
        return Err(ApiError::forbidden(
            "pdb disruptions allowed is negative".into(),
        ));
    }
    if allowed == 0 {
        return Err(ApiError::too_many_requests(
            "Cannot evict pod as it would violate the pod's disruption budget.".into(),
            cause(format!(
                "The disruption budget {pdb_name} needs {} healthy pods and has {} currently",
                int(&st["desiredHealthy"]),
                int(&st["currentHealthy"])
            )),
        ));
    }
    // Check the pod's preconditions before spending the budget.
    store.delete(pods, ns, name, &check_only)?;
    if !dry_run {
        store.update(
            pdbs_rt,
            ns,
            &pdb_name,
            WriteMode {
                part: Part::Status,
                dry_run: false,
                manager: Some("kube-controller-manager"),
            },
            |cur| {
                let mut p = cur.cloned().unwrap_or(pdb.clone());
                p["status"]["disruptionsAllowed"] = json!(allowed - 1);
                p["status"]["disruptedPods"][name] = json!(super::meta::now());
                Ok(p)
            },
        )?;
    }
    store.delete(pods, ns, name, &opts).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_decoding() {
        let q = parse_query("fieldSelector=spec.nodeName%3Dn1%2Cmetadata.name%21%3Dx&watch=1&labelSelector=a+in+%28b%29&x");
        assert_eq!(
            q[0],
            (
                "fieldSelector".into(),
                "spec.nodeName=n1,metadata.name!=x".into()
            )
        );
        assert_eq!(q[1], ("watch".into(), "1".into()));
        assert_eq!(q[2], ("labelSelector".into(), "a in (b)".into()));
        assert_eq!(q[3], ("x".into(), String::new()));
        assert_eq!(decode("100%"), "100%");
    }

    #[test]
    fn routes() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let t = |p: &str| match route(p, a) {
            Ok(Route::Resource(t)) => Some((t.rt.plural, t.namespace, t.name, t.sub)),
            _ => None,
        };
        assert_eq!(t("/api/v1/pods"), Some(("pods", None, None, None)));
        assert_eq!(
            t("/api/v1/namespaces/ns/pods/p/eviction"),
            Some((
                "pods",
                Some("ns".into()),
                Some("p".into()),
                Some("eviction".into())
            ))
        );
        assert_eq!(
            t("/api/v1/nodes/n1/status"),
            Some(("nodes", None, Some("n1".into()), Some("status".into())))
        );
        assert_eq!(
            t("/apis/events.k8s.io/v1/namespaces/ns/events"),
            Some(("events", Some("ns".into()), None, None))
        );
        assert_eq!(
            t("/apis/policy/v1/namespaces/ns/poddisruptionbudgets/b"),
            Some((
                "poddisruptionbudgets",
                Some("ns".into()),
                Some("b".into()),
                None
            ))
        );
        assert!(
            t("/api/v1/namespaces/ns/nodes").is_none(),
            "nodes are cluster-scoped"
        );
        assert!(t("/api/v1/pods/p").is_none(), "a pod needs its namespace");
        assert!(t("/api/v1/nodes/n1/eviction").is_none());
        assert!(t("/apis/events.k8s.io/v1beta1/namespaces/ns/events").is_none());
        assert!(matches!(route("/apis", a), Ok(Route::Doc(_))));
        assert!(matches!(route("/api/v1", a), Ok(Route::Doc(_))));
    }
}

//! The object store behind the fake: JSON objects keyed by resource, namespace and name,
//! one global `resourceVersion` bumped by every write, a bounded history of changes that
//! watches resume from (older versions are "too old", 410), and the write rules of the real
//! server: system fields, `resourceVersion` and UID preconditions, status subresources,
//! no-op writes that change nothing, and the validation interlock's objects must pass.

use super::meta::{new_uid, now, ApiError, ResourceType};
use super::select::{FieldSelector, LabelSelector};
use serde_json::{json, Value};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use tokio::sync::broadcast;

/// What a write did, as a watch reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChangeType {
    /// The object was created.
    Added,
    /// The object was changed.
    Modified,
    /// The object was deleted.
    Deleted,
}

/// One committed write.
#[derive(Debug)]
pub(crate) struct Change {
    pub rv: u64,
    pub kind: ChangeType,
    pub rt: &'static ResourceType,
    /// The object after the write (for a delete: its last state, at the delete's version).
    pub object: Value,
    /// The object before the write; `None` for a create.
    pub prev: Option<Value>,
}

/// Which part of an object a write may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    /// The resource itself: `status` is kept when the type has a status subresource.
    Main,
    /// The `/status` subresource: only `status` changes.
    Status,
}

/// How a PUT or PATCH writes: which part, only tried (`dryRun`) or not, and the field
/// manager it records (`None`: an apply that recorded ownership itself).
#[derive(Debug, Clone, Copy)]
pub(crate) struct WriteMode<'a> {
    pub part: Part,
    pub dry_run: bool,
    pub manager: Option<&'a str>,
}

/// A DELETE's options: preconditions, `dryRun`, a pod's grace period, and the
/// `propagationPolicy`.
#[derive(Debug, Clone, Default)]
pub(crate) struct DeleteOpts {
    pub uid: Option<String>,
    pub rv: Option<String>,
    pub dry_run: bool,
    pub grace_seconds: Option<i64>,
    /// `Foreground`, `Background` or `Orphan` (`None`: the type's default, Background).
    pub propagation: Option<String>,
    /// Remove the object whatever its finalizers say (the test playing the garbage
    /// collector or a controller that finished its finalizer).
    pub ignore_finalizers: bool,
}

/// The finalizer kube-apiserver adds for `propagationPolicy=Foreground`: the object stays,
/// with `deletionTimestamp`, until the garbage collector has deleted its dependents.
pub(crate) const FOREGROUND_FINALIZER: &str = "foregroundDeletion";

fn finalizers(obj: &Value) -> Vec<String> {
    obj["metadata"]["finalizers"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// What a DELETE did.
#[derive(Debug)]
pub(crate) enum Deleted {
    /// The object is gone; its last state.
    Gone(Value),
    /// A pod marked for graceful deletion, still stored.
    Terminating(Value),
}

impl Deleted {
    pub fn object(&self) -> &Value {
        match self {
            Deleted::Gone(v) | Deleted::Terminating(v) => v,
        }
    }
}

type Key = (&'static str, String, String);

/// Selects objects of one resource in one namespace (or all).
#[derive(Debug, Clone)]
pub(crate) struct Scope {
    pub rt: &'static ResourceType,
    pub namespace: Option<String>,
    pub fields: FieldSelector,
    pub labels: LabelSelector,
}

impl Scope {
    pub fn matches(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.namespace {
            if obj["metadata"]["namespace"].as_str() != Some(ns) {
                return false;
            }
        }
        self.fields.matches(obj) && self.labels.matches(obj["metadata"].get("labels"))
    }
}

pub(crate) struct Store {
    objects: BTreeMap<Key, Value>,
    rv: u64,
    history: VecDeque<Arc<Change>>,
    /// Changes at or below this version are forgotten; watching from an older version
    /// is answered 410 Gone.
    compacted_rv: u64,
    pub history_limit: usize,
    pub tx: broadcast::Sender<Arc<Change>>,
}

/// `metadata.name` of an object ("" when missing).
pub(crate) fn name_of(obj: &Value) -> &str {
    obj["metadata"]["name"].as_str().unwrap_or("")
}

fn ns_of(obj: &Value) -> String {
    obj["metadata"]["namespace"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

fn rv_of(obj: &Value) -> &str {
    obj["metadata"]["resourceVersion"].as_str().unwrap_or("")
}

fn with_type(rt: &ResourceType, mut obj: Value) -> Value {
    if let Value::Object(m) = &mut obj {
        // Keep kind/apiVersion first, as the real server serialises them.
        let mut out = serde_json::Map::new();
        out.insert("kind".into(), json!(rt.kind));
        out.insert("apiVersion".into(), json!(rt.api_version()));
        for (k, v) in std::mem::take(m) {
            if k != "kind" && k != "apiVersion" {
                out.insert(k, v);
            }
        }
        *m = out;
    }
    obj
}

impl Store {
    pub fn new(history_limit: usize) -> Store {
        let (tx, _) = broadcast::channel(1 << 16);
        Store {
            objects: BTreeMap::new(),
            rv: 1,
            history: VecDeque::new(),
            compacted_rv: 1,
            history_limit,
            tx,
        }
    }

    pub fn rv(&self) -> u64 {
        self.rv
    }

    /// Forgets every change up to now: watching from any older version is 410 Gone.
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted_rv = self.rv;
    }

    fn key(rt: &'static ResourceType, ns: &str, name: &str) -> Key {
        (
            rt.plural,
            if rt.namespaced {
                ns.to_string()
            } else {
                String::new()
            },
            name.to_string(),
        )
    }

    pub fn get(&self, rt: &'static ResourceType, ns: &str, name: &str) -> Option<&Value> {
        self.objects.get(&Self::key(rt, ns, name))
    }

    /// Every object of `rt` in scope, ordered by namespace and name.
    pub fn list(&self, scope: &Scope) -> Vec<Value> {
        self.objects
            .range((scope.rt.plural, String::new(), String::new())..)
            .take_while(|((p, _, _), _)| *p == scope.rt.plural)
            .filter(|(_, o)| scope.matches(o))
            .map(|(_, o)| o.clone())
            .collect()
    }

    /// The objects in scope as they were at version `at` (`resourceVersionMatch=Exact`).
    pub fn list_at(&self, scope: &Scope, at: u64) -> Result<Vec<Value>, ApiError> {
        if at < self.compacted_rv {
            return Err(ApiError::expired(
                "The resourceVersion for the provided list is too old.".into(),
            ));
        }
        let mut state: BTreeMap<Key, Value> = self
            .objects
            .iter()
            .filter(|((p, _, _), _)| *p == scope.rt.plural)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for c in self.history.iter().rev().take_while(|c| c.rv > at) {
            if c.rt.plural != scope.rt.plural {
                continue;
            }
            let key = Self::key(c.rt, &ns_of(&c.object), name_of(&c.object));
            match &c.prev {
                None => {
                    state.remove(&key);
                }
                Some(p) => {
                    state.insert(key, p.clone());
                }
            }
        }
        Ok(state.into_values().filter(|o| scope.matches(o)).collect())
    }

    /// Changes after version `from` (exclusive), or 410 Gone when they are forgotten.
    pub fn changes_since(&self, from: u64) -> Result<Vec<Arc<Change>>, ApiError> {
        if from < self.compacted_rv {
            return Err(ApiError::expired(format!(
                "too old resource version: {from} ({})",
                self.compacted_rv
            )));
        }
        Ok(self
            .history
            .iter()
            .filter(|c| c.rv > from)
            .cloned()
            .collect())
    }

    fn commit(
        &mut self,
        kind: ChangeType,
        rt: &'static ResourceType,
        mut obj: Value,
        prev: Option<Value>,
    ) -> Value {
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        let key = Self::key(rt, &ns_of(&obj), name_of(&obj));
        if kind == ChangeType::Deleted {
            self.objects.remove(&key);
        } else {
            self.objects.insert(key, obj.clone());
        }
        let change = Arc::new(Change {
            rv: self.rv,
            kind,
            rt,
            object: obj.clone(),
            prev,
        });
        self.history.push_back(change.clone());
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.compacted_rv = old.rv;
            }
        }
        // No receiver is fine: nobody is watching.
        let _ = self.tx.send(change);
        obj
    }

    /// Stores `obj` as given (system fields filled in when missing), bypassing validation:
    /// the test's way to seed state (a pod's status, a PDB's computed status).
    pub fn put(&mut self, rt: &'static ResourceType, obj: Value) -> Value {
        let mut obj = with_type(rt, obj);
        let prev = self.get(rt, &ns_of(&obj), name_of(&obj)).cloned();
        let meta = &mut obj["metadata"];
        if meta.get("uid").is_none() {
            meta["uid"] = json!(prev.as_ref().map_or_else(new_uid, |p| p["metadata"]["uid"]
                .as_str()
                .unwrap_or("")
                .to_string()));
        }
        if meta.get("creationTimestamp").is_none() {
            meta["creationTimestamp"] = json!(now());
        }
        if rt.has_generation && meta.get("generation").is_none() {
            meta["generation"] = json!(1);
        }
        let kind = if prev.is_some() {
            ChangeType::Modified
        } else {
            ChangeType::Added
        };
        self.commit(kind, rt, obj, prev)
    }

    /// POST: creates `obj` in namespace `ns`. `manager` records the creator's field
    /// ownership; `None` when the caller (an apply) has recorded it already.
    pub fn create(
        &mut self,
        rt: &'static ResourceType,
        ns: &str,
        obj: Value,
        dry_run: bool,
        manager: Option<&str>,
    ) -> Result<Value, ApiError> {
        let Value::Object(_) = obj else {
            return Err(ApiError::bad_request(
                "the body of a create must be a JSON object",
            ));
        };
        check_type(rt, &obj)?;
        let mut obj = with_type(rt, obj);
        if !obj.get("metadata").is_some_and(Value::is_object) {
            obj["metadata"] = json!({});
        }
        check_namespace(rt, ns, &mut obj)?;
        if name_of(&obj).is_empty() {
            match obj["metadata"]["generateName"].as_str() {
                Some(g) if !g.is_empty() => {
                    obj["metadata"]["name"] = json!(format!("{g}{}", super::meta::name_suffix()));
                }
                _ => {
                    return Err(ApiError::invalid(
                        rt,
                        "",
                        &[(
                            "metadata.name",
                            "Required value: name or generateName is required".into(),
                        )],
                    ))
                }
            }
        }
        let name = name_of(&obj).to_string();
        if !rv_of(&obj).is_empty() {
            return Err(ApiError::internal(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        if self.get(rt, ns, &name).is_some() {
            return Err(ApiError::already_exists(rt, &name));
        }
        let meta = &mut obj["metadata"];
        meta["uid"] = json!(new_uid());
        meta["creationTimestamp"] = json!(now());
        if let Value::Object(m) = meta {
            m.remove("deletionTimestamp");
            m.remove("deletionGracePeriodSeconds");
        }
        if rt.has_generation {
            obj["metadata"]["generation"] = json!(1);
        }
        if rt.plural == "pods" {
            // The real server resets a new pod's status; the kubelet fills it later.
            obj["status"] = json!({ "phase": "Pending" });
        }
        validate(rt, &name, &obj, None)?;
        if let Some(m) = manager {
            if let Value::Object(meta) = &mut obj["metadata"] {
                meta.remove("managedFields");
            }
            super::apply::record_update(rt, None, &mut obj, m, "");
        }
        if dry_run {
            return Ok(obj);
        }
        Ok(self.commit(ChangeType::Added, rt, obj, None))
    }

    /// PUT or PATCH: `make(current)` gives the new object. Applies the real server's
    /// rules; a write that changes nothing returns the stored object, no new version.
    /// Returns the object and whether it was created (PUT of a missing event).
    pub fn update(
        &mut self,
        rt: &'static ResourceType,
        ns: &str,
        name: &str,
        mode: WriteMode<'_>,
        make: impl FnOnce(Option<&Value>) -> Result<Value, ApiError>,
    ) -> Result<(Value, bool), ApiError> {
        let WriteMode {
            part,
            dry_run,
            manager,
        } = mode;
        let old = self.get(rt, ns, name).cloned();
        let new = make(old.as_ref())?;
        if !new.is_object() {
            return Err(ApiError::bad_request(
                "the body of an update must be a JSON object",
            ));
        }
        check_type(rt, &new)?;
        let mut new = with_type(rt, new);
        if !new.get("metadata").is_some_and(Value::is_object) {
            new["metadata"] = json!({});
        }
        match name_of(&new) {
            "" => new["metadata"]["name"] = json!(name),
            n if n != name => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )))
            }
            _ => {}
        }
        check_namespace(rt, ns, &mut new)?;
        let Some(old) = old else {
            if rt.create_on_update && part == Part::Main {
                if let Value::Object(m) = &mut new["metadata"] {
                    m.remove("resourceVersion");
                }
                return self
                    .create(rt, ns, new, dry_run, manager)
                    .map(|o| (o, true));
            }
            return Err(ApiError::not_found(rt, name));
        };
        let want_rv = rv_of(&new);
        if !want_rv.is_empty() && want_rv != rv_of(&old) {
            return Err(ApiError::modified(rt, name));
        }
        if let Some(uid) = new["metadata"]["uid"].as_str() {
            let have = old["metadata"]["uid"].as_str().unwrap_or("");
            if !uid.is_empty() && uid != have {
                return Err(ApiError::conflict(
                    rt,
                    name,
                    &format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {have}"),
                ));
            }
        }
        let mut result = match part {
            Part::Status => {
                let mut r = old.clone();
                if manager.is_none() {
                    // An apply to the status subresource brings its ownership record.
                    r["metadata"]["managedFields"] = new["metadata"]["managedFields"].clone();
                }
                match new.get("status") {
                    Some(s) => r["status"] = s.clone(),
                    None => {
                        if let Value::Object(m) = &mut r {
                            m.remove("status");
                        }
                    }
                }
                r
            }
            Part::Main => {
                let mut r = new;
                // A write that does not send managedFields keeps the recorded ones.
                if r["metadata"].get("managedFields").is_none() {
                    if let Some(mf) = old["metadata"].get("managedFields") {
                        r["metadata"]["managedFields"] = mf.clone();
                    }
                }
                if rt.status_subresource {
                    match old.get("status") {
                        Some(s) => r["status"] = s.clone(),
                        None => {
                            if let Value::Object(m) = &mut r {
                                m.remove("status");
                            }
                        }
                    }
                }
                for f in [
                    "uid",
                    "creationTimestamp",
                    "generation",
                    "deletionTimestamp",
                    "deletionGracePeriodSeconds",
                ] {
                    match old["metadata"].get(f) {
                        Some(v) => r["metadata"][f] = v.clone(),
                        None => {
                            if let Value::Object(m) = &mut r["metadata"] {
                                m.remove(f);
                            }
                        }
                    }
                }
                if rt.has_generation && r.get("spec") != old.get("spec") {
                    let g = old["metadata"]["generation"].as_i64().unwrap_or(0);
                    r["metadata"]["generation"] = json!(g + 1);
                }
                r
            }
        };
        result["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
        if result["metadata"]["managedFields"].is_null() {
            if let Value::Object(m) = &mut result["metadata"] {
                m.remove("managedFields");
            }
        }
        validate(rt, name, &result, Some(&old))?;
        if let Some(m) = manager {
            let sub = if part == Part::Status { "status" } else { "" };
            super::apply::record_update(rt, Some(&old), &mut result, m, sub);
        }
        if result == old || dry_run {
            return Ok((result, false));
        }
        // The last finalizer of an object being deleted is gone: so is the object.
        if rt.plural != "pods"
            && result["metadata"].get("deletionTimestamp").is_some()
            && finalizers(&result).is_empty()
        {
            return Ok((
                self.commit(ChangeType::Deleted, rt, result, Some(old)),
                false,
            ));
        }
        Ok((
            self.commit(ChangeType::Modified, rt, result, Some(old)),
            false,
        ))
    }

    /// DELETE with optional UID and `resourceVersion` preconditions. A pod bound to a
    /// node is deleted gracefully, as on a real cluster: it gets `deletionTimestamp` and
    /// `deletionGracePeriodSeconds` (MODIFIED) and stays until a delete with grace 0 (the
    /// kubelet's) removes it. Any other object with finalizers, or deleted with
    /// `propagationPolicy=Foreground` (which adds [`FOREGROUND_FINALIZER`]), gets
    /// `deletionTimestamp` (MODIFIED) and stays until an update takes its last finalizer
    /// away; there is no garbage collector here, so the test plays it. `Orphan` removes
    /// the object at once: the real collector drops its `orphan` finalizer as soon as it
    /// has orphaned the dependents, and the fake tracks none.
    pub fn delete(
        &mut self,
        rt: &'static ResourceType,
        ns: &str,
        name: &str,
        opts: &DeleteOpts,
    ) -> Result<Deleted, ApiError> {
        let Some(old) = self.get(rt, ns, name).cloned() else {
            return Err(ApiError::not_found(rt, name));
        };
        let have_uid = old["metadata"]["uid"].as_str().unwrap_or("");
        if let Some(uid) = opts.uid.as_deref().filter(|u| *u != have_uid) {
            return Err(ApiError::conflict(
                rt,
                name,
                &format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {have_uid}"),
            ));
        }
        let have_rv = rv_of(&old);
        if let Some(rv) = opts.rv.as_deref().filter(|r| *r != have_rv) {
            return Err(ApiError::conflict(
                rt,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {have_rv}"
                ),
            ));
        }
        if rt.plural == "pods" {
            let grace = opts
                .grace_seconds
                .or_else(|| old["spec"]["terminationGracePeriodSeconds"].as_i64())
                .unwrap_or(30)
                .max(0);
            let unbound = old["spec"]["nodeName"].as_str().unwrap_or("").is_empty();
            let finished = matches!(
                old["status"]["phase"].as_str(),
                Some("Succeeded" | "Failed")
            );
            if grace > 0 && !unbound && !finished {
                let current = old["metadata"]["deletionGracePeriodSeconds"].as_i64();
                if current.is_some_and(|c| c <= grace) || opts.dry_run {
                    return Ok(Deleted::Terminating(old));
                }
                let mut marked = old.clone();
                let at = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0)
                    + grace as u64;
                marked["metadata"]["deletionTimestamp"] = json!(super::meta::rfc3339(at));
                marked["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
                return Ok(Deleted::Terminating(self.commit(
                    ChangeType::Modified,
                    rt,
                    marked,
                    Some(old),
                )));
            }
        }
        if rt.plural != "pods" && !opts.ignore_finalizers {
            let mut pending = finalizers(&old);
            if opts.propagation.as_deref() == Some("Foreground")
                && !pending.iter().any(|f| f == FOREGROUND_FINALIZER)
            {
                pending.push(FOREGROUND_FINALIZER.into());
            }
            if !pending.is_empty() {
                if opts.dry_run || old["metadata"].get("deletionTimestamp").is_some() {
                    return Ok(Deleted::Terminating(old));
                }
                let mut marked = old.clone();
                marked["metadata"]["finalizers"] = json!(pending);
                marked["metadata"]["deletionTimestamp"] = json!(now());
                marked["metadata"]["deletionGracePeriodSeconds"] = json!(0);
                return Ok(Deleted::Terminating(self.commit(
                    ChangeType::Modified,
                    rt,
                    marked,
                    Some(old),
                )));
            }
        }
        if opts.dry_run {
            return Ok(Deleted::Gone(old));
        }
        Ok(Deleted::Gone(self.commit(
            ChangeType::Deleted,
            rt,
            old.clone(),
            Some(old),
        )))
    }

    /// Every stored object of `rt`.
    pub fn all(&self, rt: &'static ResourceType) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|((p, _, _), _)| *p == rt.plural)
            .map(|(_, v)| v.clone())
            .collect()
    }
}

fn check_type(rt: &ResourceType, obj: &Value) -> Result<(), ApiError> {
    if let Some(k) = obj.get("kind").and_then(Value::as_str) {
        if k != rt.kind {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                rt.kind
            )));
        }
    }
    if let Some(v) = obj.get("apiVersion").and_then(Value::as_str) {
        if v != rt.api_version() {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({})",
                rt.api_version()
            )));
        }
    }
    Ok(())
}

fn check_namespace(rt: &ResourceType, ns: &str, obj: &mut Value) -> Result<(), ApiError> {
    if !rt.namespaced {
        if let Value::Object(m) = &mut obj["metadata"] {
            m.remove("namespace");
        }
        return Ok(());
    }
    match obj["metadata"]["namespace"].as_str() {
        Some(n) if !n.is_empty() && n != ns => Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
        _ => {
            obj["metadata"]["namespace"] = json!(ns);
            Ok(())
        }
    }
}

/// The checks of the real validation that interlock's writes could trip.
fn validate(
    rt: &ResourceType,
    name: &str,
    obj: &Value,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    let mut errs: Vec<(&str, String)> = Vec::new();
    match rt.plural {
        "events" => {
            let s = |f: &str| obj.get(f).and_then(Value::as_str).unwrap_or("");
            if s("eventTime").is_empty() {
                errs.push(("eventTime", "Required value".into()));
            }
            for (f, max) in [
                ("reportingController", 253),
                ("reportingInstance", 128),
                ("action", 128),
                ("reason", 128),
            ] {
                if s(f).is_empty() {
                    errs.push((f, "Required value".into()));
                } else if s(f).len() > max {
                    errs.push((f, format!("Too long: may not be more than {max} bytes")));
                }
            }
            if !matches!(s("type"), "Normal" | "Warning") {
                errs.push((
                    "type",
                    format!(
                        "Unsupported value: {:?}: supported values: \"Normal\", \"Warning\"",
                        s("type")
                    ),
                ));
            }
            if s("note").len() > 1024 {
                errs.push(("note", "Too long: may not be more than 1024 bytes".into()));
            }
            if let Some(series) = obj.get("series").filter(|v| !v.is_null()) {
                let count = series["count"].as_i64().unwrap_or(0);
                if count < 2 {
                    errs.push((
                        "series.count",
                        format!("Invalid value: {count}: should be at least 2"),
                    ));
                }
                if series["lastObservedTime"].as_str().unwrap_or("").is_empty() {
                    errs.push(("series.lastObservedTime", "Required value".into()));
                }
            }
            let event_ns = obj["metadata"]["namespace"].as_str().unwrap_or("");
            match obj["regarding"]["namespace"].as_str().unwrap_or("") {
                "" if !event_ns.is_empty() && event_ns != "default" => errs.push((
                    "regarding.namespace",
                    format!("Invalid value: \"\": does not match event.namespace ({event_ns}); events about cluster-scoped objects go in \"default\""),
                )),
                "" => {}
                r if r != event_ns => errs.push((
                    "regarding.namespace",
                    format!("Invalid value: {r:?}: does not match event.namespace"),
                )),
                _ => {}
            }
        }
        "pods" => {
            if obj["spec"]["containers"]
                .as_array()
                .is_none_or(|c| c.is_empty())
            {
                errs.push(("spec.containers", "Required value".into()));
            }
            if let Some(old) = old {
                // Pod specs are immutable but for images, activeDeadlineSeconds and added tolerations.
                let mutable = |spec: &Value| {
                    let mut s = spec.clone();
                    if let Some(cs) = s.get_mut("containers").and_then(Value::as_array_mut) {
                        for c in cs {
                            if let Value::Object(m) = c {
                                m.remove("image");
                            }
                        }
                    }
                    if let Value::Object(m) = &mut s {
                        m.remove("activeDeadlineSeconds");
                        m.remove("tolerations");
                    }
                    s
                };
                if mutable(&obj["spec"]) != mutable(&old["spec"]) {
                    errs.push(("spec", "Forbidden: pod updates may not change fields other than `spec.containers[*].image`, `spec.activeDeadlineSeconds` or `spec.tolerations` (only additions to existing tolerations)".into()));
                }
            }
        }
        "nodes" => {
            if let Some(taints) = obj["spec"]["taints"].as_array() {
                let mut seen = Vec::new();
                for (i, t) in taints.iter().enumerate() {
                    let key = t["key"].as_str().unwrap_or("");
                    let effect = t["effect"].as_str().unwrap_or("");
                    if key.is_empty() {
                        errs.push(("spec.taints[].key", format!("Required value (taint {i})")));
                    }
                    if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
                        errs.push(("spec.taints[].effect", format!("Unsupported value: {effect:?} (taint {i}): supported values: \"NoSchedule\", \"PreferNoSchedule\", \"NoExecute\"")));
                    }
                    if seen.contains(&(key, effect)) {
                        errs.push(("spec.taints", format!("Duplicate value: taint {i} {key}:{effect}: taints must be unique by key and effect pair")));
                    }
                    seen.push((key, effect));
                }
            }
        }
        _ => {}
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(rt, name, &errs))
    }
}

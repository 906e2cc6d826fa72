//! Server-side apply and field ownership (`metadata.managedFields`), as far as interlock
//! can meet them: every write records which manager owns which fields (FieldsV1 form);
//! an apply merges its configuration, removes fields the manager applied before and no
//! longer does (when nobody else owns them), and is a 409 Conflict when it would change a
//! field another manager owns, unless forced. Lists without a merge key (`spec.taints`)
//! are owned whole: applying a taint list that drops another manager's taint conflicts.

use super::meta::{now, ApiError, ResourceType};
use super::patch::{list_strategy, merge_strategic, ListStrategy};
use serde_json::{json, Map, Value};
use std::collections::BTreeSet;

/// One owned field: `f:<name>`, `k:<key object>` (a keyed list element) or `v:<value>`
/// (an element of a set-like list), from the object's root.
pub(crate) type FieldPath = Vec<String>;
pub(crate) type FieldSet = BTreeSet<FieldPath>;

/// Fields nobody owns: identity and server-set metadata.
fn ignored(path: &[String]) -> bool {
    match path {
        [f] => f == "f:apiVersion" || f == "f:kind",
        [m, f, ..] if m == "f:metadata" => matches!(
            f.as_str(),
            "f:name"
                | "f:namespace"
                | "f:uid"
                | "f:resourceVersion"
                | "f:creationTimestamp"
                | "f:generation"
                | "f:managedFields"
                | "f:deletionTimestamp"
                | "f:selfLink"
        ),
        _ => false,
    }
}

/// The leaf fields `v` sets, with keyed lists split by element and atomic lists whole.
pub(crate) fn fields_of(plural: &str, v: &Value) -> FieldSet {
    let mut out = FieldSet::new();
    collect(plural, v, &mut Vec::new(), &mut Vec::new(), &mut out);
    out.retain(|p| !ignored(p));
    out
}

fn collect(
    plural: &str,
    v: &Value,
    names: &mut Vec<String>,
    prefix: &mut FieldPath,
    out: &mut FieldSet,
) {
    let Value::Object(m) = v else {
        out.insert(prefix.clone());
        return;
    };
    for (k, child) in m {
        names.push(k.clone());
        prefix.push(format!("f:{k}"));
        match child {
            Value::Object(cm) if !cm.is_empty() => collect(plural, child, names, prefix, out),
            Value::Array(items) => {
                let names_ref: Vec<&str> = names.iter().map(String::as_str).collect();
                match list_strategy(plural, &names_ref) {
                    ListStrategy::MergeByKey(key) => {
                        for item in items {
                            let Some(kv) = item.get(key) else { continue };
                            prefix.push(format!("k:{}", json!({ key: kv })));
                            out.insert(prefix.clone());
                            if item.is_object() {
                                collect(plural, item, names, prefix, out);
                            }
                            prefix.pop();
                        }
                    }
                    ListStrategy::MergePrimitives => {
                        for item in items {
                            prefix.push(format!("v:{item}"));
                            out.insert(prefix.clone());
                            prefix.pop();
                        }
                    }
                    ListStrategy::Replace => {
                        out.insert(prefix.clone());
                    }
                }
            }
            _ => {
                out.insert(prefix.clone());
            }
        }
        prefix.pop();
        names.pop();
    }
}

fn find_element(list: &[Value], seg: &str) -> Option<usize> {
    if let Some(k) = seg.strip_prefix("k:") {
        let key: Map<String, Value> = serde_json::from_str(k).ok()?;
        list.iter()
            .position(|e| key.iter().all(|(kk, kv)| e.get(kk) == Some(kv)))
    } else if let Some(v) = seg.strip_prefix("v:") {
        let want: Value = serde_json::from_str(v).ok()?;
        list.iter().position(|e| *e == want)
    } else {
        None
    }
}

/// The value at `path` in `obj`.
pub(crate) fn value_at<'a>(obj: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut cur = obj;
    for seg in path {
        cur = match (seg.strip_prefix("f:"), cur) {
            (Some(f), Value::Object(m)) => m.get(f)?,
            (None, Value::Array(l)) => &l[find_element(l, seg)?],
            _ => return None,
        };
    }
    Some(cur)
}

fn remove_at(obj: &mut Value, path: &[String]) {
    let Some((last, parent)) = path.split_last() else {
        return;
    };
    let mut cur = obj;
    for seg in parent {
        cur = match (seg.strip_prefix("f:"), cur) {
            (Some(f), Value::Object(m)) => match m.get_mut(f) {
                Some(v) => v,
                None => return,
            },
            (None, Value::Array(l)) => match find_element(l, seg) {
                Some(i) => &mut l[i],
                None => return,
            },
            _ => return,
        };
    }
    match (last.strip_prefix("f:"), cur) {
        (Some(f), Value::Object(m)) => {
            m.remove(f);
        }
        (None, Value::Array(l)) => {
            if let Some(i) = find_element(l, last) {
                l.remove(i);
            }
        }
        _ => {}
    }
}

/// The FieldsV1 form: nested objects, `{}` for a leaf, `".": {}` for an element that is
/// owned itself and has owned fields too.
pub(crate) fn to_fields_v1(set: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut cur = &mut root;
        for (i, seg) in path.iter().enumerate() {
            let entry = cur.entry(seg.clone()).or_insert_with(|| json!({}));
            let Value::Object(next) = entry else { break };
            if i + 1 == path.len() && !next.is_empty() {
                next.insert(".".into(), json!({}));
            }
            cur = next;
        }
    }
    // An element listed before its children got `{}`; give it "." once it has children.
    fn mark(v: &mut Value, owned: &FieldSet, path: &mut FieldPath) {
        if let Value::Object(m) = v {
            let has_children = m.keys().any(|k| k != ".");
            if has_children && owned.contains(path) {
                m.insert(".".into(), json!({}));
            }
            for (k, child) in m.iter_mut() {
                if k != "." {
                    path.push(k.clone());
                    mark(child, owned, path);
                    path.pop();
                }
            }
        }
    }
    let mut v = Value::Object(root);
    mark(&mut v, set, &mut Vec::new());
    v
}

/// Reads the FieldsV1 form back into paths.
pub(crate) fn from_fields_v1(v: &Value) -> FieldSet {
    fn walk(v: &Value, prefix: &mut FieldPath, out: &mut FieldSet) {
        let Value::Object(m) = v else { return };
        if m.is_empty() && !prefix.is_empty() {
            out.insert(prefix.clone());
            return;
        }
        for (k, child) in m {
            if k == "." {
                out.insert(prefix.clone());
            } else {
                prefix.push(k.clone());
                walk(child, prefix, out);
                prefix.pop();
            }
        }
    }
    let mut out = FieldSet::new();
    walk(v, &mut Vec::new(), &mut out);
    out
}

/// One `metadata.managedFields` entry.
#[derive(Debug, Clone)]
struct Entry {
    manager: String,
    operation: String,
    subresource: String,
    api_version: String,
    time: String,
    fields: FieldSet,
}

fn read_entries(obj: &Value) -> Vec<Entry> {
    obj["metadata"]["managedFields"]
        .as_array()
        .map(|l| {
            l.iter()
                .map(|e| Entry {
                    manager: e["manager"].as_str().unwrap_or("").into(),
                    operation: e["operation"].as_str().unwrap_or("Update").into(),
                    subresource: e["subresource"].as_str().unwrap_or("").into(),
                    api_version: e["apiVersion"].as_str().unwrap_or("").into(),
                    time: e["time"].as_str().unwrap_or("").into(),
                    fields: from_fields_v1(&e["fieldsV1"]),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn write_entries(obj: &mut Value, entries: Vec<Entry>) {
    let list: Vec<Value> = entries
        .into_iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let mut v = json!({
                "manager": e.manager, "operation": e.operation, "apiVersion": e.api_version,
                "time": e.time, "fieldsType": "FieldsV1", "fieldsV1": to_fields_v1(&e.fields),
            });
            if !e.subresource.is_empty() {
                v["subresource"] = json!(e.subresource);
            }
            v
        })
        .collect();
    if list.is_empty() {
        if let Value::Object(m) = &mut obj["metadata"] {
            m.remove("managedFields");
        }
    } else {
        obj["metadata"]["managedFields"] = Value::Array(list);
    }
}

fn upsert<'a>(
    entries: &'a mut Vec<Entry>,
    rt: &ResourceType,
    manager: &str,
    operation: &str,
    sub: &str,
) -> &'a mut Entry {
    let i = match entries
        .iter()
        .position(|e| e.manager == manager && e.operation == operation && e.subresource == sub)
    {
        Some(i) => i,
        None => {
            entries.push(Entry {
                manager: manager.into(),
                operation: operation.into(),
                subresource: sub.into(),
                api_version: rt.api_version(),
                time: String::new(),
                fields: FieldSet::new(),
            });
            entries.len() - 1
        }
    };
    let e = &mut entries[i];
    e.time = now();
    e
}

/// Records an ordinary write (create, PUT, PATCH) by `manager`: the fields it changed
/// become its own (operation Update) and no one else's; removed fields leave every set.
pub(crate) fn record_update(
    rt: &ResourceType,
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    sub: &str,
) {
    let before = old.map(|o| fields_of(rt.plural, o)).unwrap_or_default();
    let after = fields_of(rt.plural, new);
    let changed: FieldSet = after
        .iter()
        .filter(|p| old.is_none_or(|o| value_at(o, p) != value_at(new, p)) || !before.contains(*p))
        .cloned()
        .collect();
    let removed: FieldSet = before.difference(&after).cloned().collect();
    if changed.is_empty() && removed.is_empty() {
        return;
    }
    let mut entries = read_entries(new);
    for e in entries.iter_mut() {
        e.fields
            .retain(|p| !changed.contains(p) && !removed.contains(p));
    }
    if !changed.is_empty() {
        upsert(&mut entries, rt, manager, "Update", sub)
            .fields
            .extend(changed);
    }
    write_entries(new, entries);
}

/// `.spec.taints`, `.status.conditions[type="Ready"].status`: how the real server names
/// a field in a conflict.
fn dotted(p: &FieldPath) -> String {
    p.iter()
        .map(|s| match s.strip_prefix("f:") {
            Some(f) => format!(".{f}"),
            None => {
                let inner = &s[2..];
                match serde_json::from_str::<Map<String, Value>>(inner) {
                    Ok(m) => m.iter().map(|(k, v)| format!("[{k}={v}]")).collect(),
                    Err(_) => format!("[{inner}]"),
                }
            }
        })
        .collect()
}

/// The 409 an apply gets when it would change fields other managers own.
fn conflict_error(
    rt: &ResourceType,
    name: &str,
    conflicts: &[(String, String, FieldPath)],
) -> ApiError {
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|(m, v, p)| json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{m}\" using {v}"), "field": dotted(p)}))
        .collect();
    let message = match conflicts {
        [(m, v, p)] => format!(
            "Apply failed with 1 conflict: conflict with \"{m}\" using {v}: {}",
            dotted(p)
        ),
        _ => {
            let mut by_manager: Vec<(&str, &str, Vec<String>)> = Vec::new();
            for (m, v, p) in conflicts {
                match by_manager.iter_mut().find(|(bm, _, _)| bm == m) {
                    Some((_, _, fs)) => fs.push(dotted(p)),
                    None => by_manager.push((m, v, vec![dotted(p)])),
                }
            }
            let parts: Vec<String> = by_manager
                .iter()
                .map(|(m, v, fs)| {
                    format!("conflicts with \"{m}\" using {v}:\n- {}", fs.join("\n- "))
                })
                .collect();
            format!(
                "Apply failed with {} conflicts: {}",
                conflicts.len(),
                parts.join("\n")
            )
        }
    };
    let mut e = ApiError::conflict(rt, name, "");
    e.body["message"] = json!(message);
    e.body["details"]["causes"] = Value::Array(causes);
    e
}

/// Applies `config` for `manager` to `current` (None: the apply creates the object).
pub(crate) fn apply(
    rt: &ResourceType,
    current: Option<&Value>,
    config: &Value,
    manager: &str,
    force: bool,
    status: bool,
) -> Result<Value, ApiError> {
    if config.get("apiVersion").and_then(Value::as_str) != Some(&rt.api_version())
        || config.get("kind").and_then(Value::as_str) != Some(rt.kind)
    {
        return Err(ApiError::bad_request(format!(
            "apiVersion and kind must be set to {} and {} in an apply configuration",
            rt.api_version(),
            rt.kind
        )));
    }
    // The main resource ignores status and the status subresource everything else.
    let mut config = config.clone();
    if rt.status_subresource {
        if let Value::Object(m) = &mut config {
            if status {
                m.retain(|k, _| {
                    matches!(k.as_str(), "apiVersion" | "kind" | "metadata" | "status")
                });
                if let Some(Value::Object(meta)) = m.get_mut("metadata") {
                    meta.retain(|k, _| k == "name" || k == "namespace");
                }
            } else {
                m.remove("status");
            }
        }
    }
    let sub = if status { "status" } else { "" };
    let applied = fields_of(rt.plural, &config);
    let base = match current {
        Some(c) => c.clone(),
        None => json!({"apiVersion": rt.api_version(), "kind": rt.kind, "metadata": {}}),
    };
    let mut merged = base.clone();
    let mut strip = config.clone();
    if let Value::Object(m) = &mut strip["metadata"] {
        m.remove("managedFields");
        m.remove("resourceVersion");
    }
    merge_strategic(rt.plural, &mut merged, &strip)?;

    let mut entries = read_entries(&base);
    let mut conflicts: Vec<(String, String, FieldPath)> = Vec::new();
    for e in entries.iter().filter(|e| e.manager != manager) {
        for p in applied.intersection(&e.fields) {
            if value_at(&base, p) != value_at(&merged, p) {
                conflicts.push((e.manager.clone(), e.api_version.clone(), p.clone()));
            }
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflict_error(
            rt,
            config["metadata"]["name"].as_str().unwrap_or(""),
            &conflicts,
        ));
    }
    // Forced (or no conflict): conflicting fields change hands.
    for (m, _, p) in &conflicts {
        for e in entries.iter_mut().filter(|e| &e.manager == m) {
            e.fields.remove(p);
        }
    }
    // Fields this manager applied before and no longer applies go, unless others own them.
    let before: FieldSet = entries
        .iter()
        .find(|e| e.manager == manager && e.operation == "Apply" && e.subresource == sub)
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    let mut dropped: Vec<&FieldPath> = before.difference(&applied).collect();
    dropped.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in dropped {
        let shared = entries.iter().any(|e| {
            !(e.manager == manager && e.operation == "Apply")
                && e.fields.iter().any(|f| f.starts_with(p))
        });
        if !shared {
            remove_at(&mut merged, p);
        }
    }
    upsert(&mut entries, rt, manager, "Apply", sub).fields = applied;
    write_entries(&mut merged, entries);
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use super::super::meta::resource_by_plural;
    use super::*;

    #[test]
    fn fields_v1_round_trip() {
        let node = json!({"metadata": {"name": "n", "labels": {"a": "1"}},
            "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        let set = fields_of("nodes", &node);
        let v1 = to_fields_v1(&set);
        assert_eq!(
            v1,
            json!({"f:metadata": {"f:labels": {"f:a": {}}}, "f:spec": {"f:taints": {}},
                   "f:status": {"f:conditions": {"k:{\"type\":\"Ready\"}": {".": {}, "f:status": {}, "f:type": {}}}}})
        );
        assert_eq!(from_fields_v1(&v1), set);
        let p: FieldPath = vec![
            "f:status".into(),
            "f:conditions".into(),
            "k:{\"type\":\"Ready\"}".into(),
            "f:status".into(),
        ];
        assert_eq!(value_at(&node, &p), Some(&json!("True")));
    }

    #[test]
    fn apply_conflicts_on_another_managers_atomic_taints() {
        let rt = resource_by_plural("nodes").unwrap();
        let mut node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"},
            "spec": {"taints": [{"key": "other", "effect": "NoSchedule"}]}});
        record_update(rt, None, &mut node, "kubelet", "");
        let cfg = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"},
            "spec": {"taints": [{"key": "interlock.dev/not-ready", "effect": "NoSchedule"}]}});
        let e = apply(rt, Some(&node), &cfg, "interlock", false, false).unwrap_err();
        assert_eq!(e.code, 409);
        assert_eq!(
            e.body["message"],
            "Apply failed with 1 conflict: conflict with \"kubelet\" using v1: .spec.taints"
        );
        assert_eq!(e.body["details"]["causes"][0]["field"], ".spec.taints");
        let forced = apply(rt, Some(&node), &cfg, "interlock", true, false).unwrap();
        assert_eq!(forced["spec"]["taints"], cfg["spec"]["taints"]);
        let owners: Vec<&str> = forced["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["manager"].as_str().unwrap())
            .collect();
        assert_eq!(owners, ["interlock"], "kubelet lost the taints it owned");
    }

    #[test]
    fn apply_merges_keyed_lists_and_removes_what_it_stopped_applying() {
        let rt = resource_by_plural("pods").unwrap();
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "image": "i"}]}});
        record_update(rt, None, &mut pod, "kubectl", "");
        let cfg = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"interlock.dev/unprotected": "true"}}});
        let a = apply(rt, Some(&pod), &cfg, "interlock", false, false).unwrap();
        assert_eq!(
            a["metadata"]["labels"],
            json!({"app": "web", "interlock.dev/unprotected": "true"})
        );
        let cfg2 = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}});
        let b = apply(rt, Some(&a), &cfg2, "interlock", false, false).unwrap();
        assert_eq!(
            b["metadata"]["labels"],
            json!({"app": "web"}),
            "the label it stopped applying is removed; kubectl's stays"
        );
        // Same value as another manager: shared, no conflict.
        let same = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"app": "web"}}});
        assert!(apply(rt, Some(&b), &same, "interlock", false, false).is_ok());
        let differ = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"app": "db"}}});
        assert_eq!(
            apply(rt, Some(&b), &differ, "interlock", false, false)
                .unwrap_err()
                .code,
            409
        );
    }
}

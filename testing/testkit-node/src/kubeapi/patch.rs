//! PATCH bodies by content type: RFC 7386 merge patch, RFC 6902 JSON patch (a failed
//! `test` is the real server's generic 422), and strategic merge patch with the merge keys
//! the real types declare for the fields interlock touches. `spec.taints` and
//! `spec.tolerations` declare none, so a patch replaces them whole, as on a real cluster.

use super::meta::{ApiError, ResourceType};
use serde_json::{Map, Value};

/// How a strategic merge patch combines a list field.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum ListStrategy {
    /// No merge key declared: the patch's list replaces the whole list.
    Replace,
    /// Elements with the same value of this field are merged; others are appended.
    MergeByKey(&'static str),
    /// A list of scalars merged as a set (`finalizers`, `podCIDRs`).
    MergePrimitives,
}

/// The merge strategy the real Go types declare for the list at `path` (field names,
/// list indices left out) in resource `plural`.
pub(crate) fn list_strategy(plural: &str, path: &[&str]) -> ListStrategy {
    use ListStrategy::*;
    match path {
        ["metadata", "ownerReferences"] => MergeByKey("uid"),
        ["metadata", "finalizers"] => MergePrimitives,
        ["status", "conditions"] if matches!(plural, "pods" | "nodes" | "poddisruptionbudgets") => {
            MergeByKey("type")
        }
        _ if plural == "nodes" => match path {
            ["status", "addresses"] => MergeByKey("type"),
            ["spec", "podCIDRs"] => MergePrimitives,
            _ => Replace,
        },
        _ if plural == "pods" => match path {
            ["spec", "containers" | "initContainers" | "ephemeralContainers"] => MergeByKey("name"),
            ["spec", "containers" | "initContainers" | "ephemeralContainers", "env"] => {
                MergeByKey("name")
            }
            ["spec", "containers" | "initContainers" | "ephemeralContainers", "ports"] => {
                MergeByKey("containerPort")
            }
            ["spec", "containers" | "initContainers" | "ephemeralContainers", "volumeMounts"] => {
                MergeByKey("mountPath")
            }
            ["spec", "volumes" | "imagePullSecrets"] => MergeByKey("name"),
            ["spec", "hostAliases"] => MergeByKey("ip"),
            ["status", "podIPs"] => MergeByKey("ip"),
            _ => Replace,
        },
        _ => Replace,
    }
}

/// `application/merge-patch+json` and friends, without parameters, lower case.
pub(crate) fn media_type(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// Applies a PATCH body of `content_type` to `current` (which carries `kind` and
/// `apiVersion`, so patches may test them too).
pub(crate) fn apply(
    rt: &ResourceType,
    content_type: &str,
    current: &Value,
    body: &[u8],
) -> Result<Value, ApiError> {
    let mt = media_type(content_type);
    let parse = || {
        serde_json::from_slice::<Value>(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))
    };
    match mt.as_str() {
        "application/json-patch+json" => {
            let ops: json_patch::Patch = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding JSON patch: {e}")))?;
            if ops.0.len() > 10_000 {
                return Err(ApiError::bad_request(
                    "The allowed maximum operations in a JSON patch is 10000",
                ));
            }
            let mut doc = current.clone();
            json_patch::patch(&mut doc, &ops).map_err(|_| ApiError::json_patch_failed())?;
            Ok(doc)
        }
        "application/merge-patch+json" => {
            let p = parse()?;
            if !p.is_object() {
                return Err(ApiError::bad_request(
                    "invalid JSON document: a merge patch must be an object",
                ));
            }
            let mut doc = current.clone();
            json_patch::merge(&mut doc, &p);
            Ok(doc)
        }
        "application/strategic-merge-patch+json" => {
            let p = parse()?;
            let Value::Object(p) = p else {
                return Err(ApiError::bad_request(
                    "invalid JSON document: a strategic merge patch must be an object",
                ));
            };
            let mut doc = current.clone();
            let Value::Object(map) = &mut doc else {
                return Err(ApiError::internal("stored object is not a JSON object"));
            };
            if merge_map(rt.plural, map, &p, &mut Vec::new())? == Outcome::Delete {
                return Err(ApiError::bad_request(
                    "a strategic merge patch may not delete the whole object",
                ));
            }
            Ok(doc)
        }
        _ => Err(ApiError::unsupported_media_type(&mt)),
    }
}

/// Merges `patch` into `doc` with the strategic rules (server-side apply merges this way).
pub(crate) fn merge_strategic(
    plural: &str,
    doc: &mut Value,
    patch: &Value,
) -> Result<(), ApiError> {
    match (doc, patch) {
        (Value::Object(d), Value::Object(p)) => merge_map(plural, d, p, &mut Vec::new()).map(drop),
        _ => Err(ApiError::bad_request(
            "an apply configuration must be an object",
        )),
    }
}

#[derive(Debug, PartialEq)]
enum Outcome {
    Keep,
    Delete,
}

fn smp_error(msg: String) -> ApiError {
    ApiError::internal(msg)
}

/// Merges `patch` into `orig` in place; `path` is the field path of `orig`.
fn merge_map<'a>(
    plural: &str,
    orig: &mut Map<String, Value>,
    patch: &'a Map<String, Value>,
    path: &mut Vec<&'a str>,
) -> Result<Outcome, ApiError> {
    match patch.get("$patch").and_then(Value::as_str) {
        Some("delete") => return Ok(Outcome::Delete),
        Some("replace") => {
            *orig = match strip_directives(&Value::Object(patch.clone())) {
                Value::Object(m) => m,
                _ => Map::new(),
            };
            return Ok(Outcome::Keep);
        }
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "Unknown patch type: {other} in map: {patch:?}"
            )))
        }
        None => {}
    }
    for (k, v) in patch {
        if k.starts_with('$') {
            if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
                if let (Some(Value::Array(list)), Some(del)) = (orig.get_mut(field), v.as_array()) {
                    list.retain(|x| !del.contains(x));
                }
            }
            continue;
        }
        path.push(k.as_str());
        match v {
            Value::Null => {
                orig.remove(k);
            }
            Value::Object(pm) => match orig.get_mut(k) {
                Some(Value::Object(om)) => {
                    if merge_map(plural, om, pm, path)? == Outcome::Delete {
                        orig.remove(k);
                    }
                }
                _ => {
                    if pm.get("$patch").and_then(Value::as_str) == Some("delete") {
                        orig.remove(k);
                    } else {
                        orig.insert(k.clone(), strip_directives(v));
                    }
                }
            },
            Value::Array(pl) => {
                let strategy = list_strategy(plural, path);
                match (strategy, orig.get_mut(k)) {
                    (ListStrategy::MergeByKey(key), Some(Value::Array(ol))) => {
                        merge_list_by_key(plural, ol, pl, key, path)?;
                    }
                    (ListStrategy::MergeByKey(key), _) => {
                        let mut fresh = Vec::new();
                        merge_list_by_key(plural, &mut fresh, pl, key, path)?;
                        orig.insert(k.clone(), Value::Array(fresh));
                    }
                    (ListStrategy::MergePrimitives, Some(Value::Array(ol))) => {
                        for x in pl {
                            if !ol.contains(x) {
                                ol.push(x.clone());
                            }
                        }
                    }
                    _ => {
                        orig.insert(k.clone(), strip_directives(v));
                    }
                }
            }
            _ => {
                orig.insert(k.clone(), v.clone());
            }
        }
        path.pop();
    }
    // `$setElementOrder/<list>` orders the merged list as the patch author saw it.
    for (k, order) in patch {
        let Some(field) = k.strip_prefix("$setElementOrder/") else {
            continue;
        };
        let (Some(Value::Array(list)), Some(order)) = (orig.get_mut(field), order.as_array())
        else {
            continue;
        };
        path.push(field);
        let key = match list_strategy(plural, path) {
            ListStrategy::MergeByKey(key) => Some(key),
            _ => None,
        };
        path.pop();
        let rank = |x: &Value| {
            order.iter().position(|o| match key {
                Some(key) => o.get(key).is_some() && o.get(key) == x.get(key),
                None => o == x,
            })
        };
        list.sort_by_key(|x| rank(x).unwrap_or(usize::MAX));
    }
    if let Some(retain) = patch.get("$retainKeys").and_then(Value::as_array) {
        orig.retain(|k, _| retain.iter().any(|r| r.as_str() == Some(k)));
    }
    Ok(Outcome::Keep)
}

fn merge_list_by_key<'a>(
    plural: &str,
    orig: &mut Vec<Value>,
    patch: &'a [Value],
    key: &str,
    path: &mut Vec<&'a str>,
) -> Result<(), ApiError> {
    if patch
        .iter()
        .any(|p| p.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        *orig = patch
            .iter()
            .filter(|p| p.get("$patch").is_none())
            .map(strip_directives)
            .collect();
        return Ok(());
    }
    for p in patch {
        let Value::Object(pm) = p else {
            return Err(smp_error(format!(
                "unable to find api field in struct for the list element {p}: a list with merge key {key:?} needs objects"
            )));
        };
        let Some(kv) = pm.get(key) else {
            return Err(smp_error(format!(
                "map: {p} does not contain declared merge key: {key}"
            )));
        };
        let pos = orig.iter().position(|o| o.get(key) == Some(kv));
        if pm.get("$patch").and_then(Value::as_str) == Some("delete") {
            orig.retain(|o| o.get(key) != Some(kv));
            continue;
        }
        match pos {
            Some(i) => {
                if let Value::Object(om) = &mut orig[i] {
                    if merge_map(plural, om, pm, path)? == Outcome::Delete {
                        orig.remove(i);
                    }
                }
            }
            None => orig.push(strip_directives(p)),
        }
    }
    Ok(())
}

/// The value with every `$patch`/`$retainKeys`/`$setElementOrder/…` directive removed.
fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(l) => Value::Array(
            l.iter()
                .filter(|x| x.get("$patch").is_none())
                .map(strip_directives)
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::meta::resource_by_plural;
    use super::*;
    use serde_json::json;

    fn smp(plural: &str, cur: Value, p: Value) -> Result<Value, ApiError> {
        apply(
            resource_by_plural(plural).unwrap(),
            "application/strategic-merge-patch+json",
            &cur,
            p.to_string().as_bytes(),
        )
    }

    fn node() -> Value {
        json!({
            "kind": "Node", "apiVersion": "v1",
            "metadata": {"name": "n1", "labels": {"a": "1", "b": "2"}},
            "spec": {"taints": [
                {"key": "other.io/x", "effect": "NoSchedule"},
                {"key": "interlock.dev/not-ready", "effect": "NoSchedule"}
            ]},
            "status": {"conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady"},
                {"type": "InterlockReady", "status": "False", "reason": "Starting"}
            ]}
        })
    }

    #[test]
    fn smp_merges_node_conditions_by_type() {
        let out = smp(
            "nodes",
            node(),
            json!({"status": {"conditions": [{"type": "InterlockReady", "status": "True", "reason": "Protected"}]}}),
        )
        .unwrap();
        assert_eq!(
            out["status"]["conditions"],
            json!([
                {"type": "Ready", "status": "True", "reason": "KubeletReady"},
                {"type": "InterlockReady", "status": "True", "reason": "Protected"}
            ])
        );
        let added = smp(
            "nodes",
            node(),
            json!({"status": {"conditions": [{"type": "New", "status": "True"}]}}),
        )
        .unwrap();
        assert_eq!(added["status"]["conditions"].as_array().unwrap().len(), 3);
    }

    #[test]
    fn smp_replaces_taints_whole() {
        let out = smp(
            "nodes",
            node(),
            json!({"spec": {"taints": [{"key": "other.io/x", "effect": "NoSchedule"}]}}),
        )
        .unwrap();
        assert_eq!(
            out["spec"]["taints"],
            json!([{"key": "other.io/x", "effect": "NoSchedule"}])
        );
    }

    #[test]
    fn smp_maps_merge_and_null_deletes() {
        let out = smp(
            "nodes",
            node(),
            json!({"metadata": {"labels": {"a": null, "c": "3"}}}),
        )
        .unwrap();
        assert_eq!(out["metadata"]["labels"], json!({"b": "2", "c": "3"}));
    }

    #[test]
    fn smp_directives() {
        let del = smp(
            "pods",
            json!({"status": {"conditions": [{"type": "A"}, {"type": "B"}]}}),
            json!({"status": {"conditions": [{"type": "A", "$patch": "delete"}]}}),
        )
        .unwrap();
        assert_eq!(del["status"]["conditions"], json!([{"type": "B"}]));
        let rep = smp(
            "pods",
            json!({"status": {"conditions": [{"type": "A"}, {"type": "B"}]}}),
            json!({"status": {"conditions": [{"$patch": "replace"}, {"type": "C"}]}}),
        )
        .unwrap();
        assert_eq!(rep["status"]["conditions"], json!([{"type": "C"}]));
        let order = smp(
            "pods",
            json!({"status": {"conditions": [{"type": "A"}, {"type": "B"}]}}),
            json!({"status": {"$setElementOrder/conditions": [{"type": "B"}, {"type": "A"}], "conditions": [{"type": "A", "status": "True"}]}}),
        )
        .unwrap();
        assert_eq!(
            order["status"]["conditions"],
            json!([{"type": "B"}, {"type": "A", "status": "True"}])
        );
        let fin = smp(
            "pods",
            json!({"metadata": {"finalizers": ["a", "b"]}}),
            json!({"metadata": {"finalizers": ["c"], "$deleteFromPrimitiveList/finalizers": ["a"]}}),
        )
        .unwrap();
        assert_eq!(fin["metadata"]["finalizers"], json!(["b", "c"]));
    }

    #[test]
    fn smp_missing_merge_key_is_an_error() {
        let e = smp(
            "nodes",
            node(),
            json!({"status": {"conditions": [{"status": "True"}]}}),
        )
        .unwrap_err();
        assert_eq!(e.code, 500);
        assert!(e.body["message"]
            .as_str()
            .unwrap()
            .contains("does not contain declared merge key: type"));
    }

    #[test]
    fn merge_patch_replaces_lists() {
        let out = apply(
            resource_by_plural("nodes").unwrap(),
            "application/merge-patch+json; charset=utf-8",
            &node(),
            br#"{"status":{"conditions":[{"type":"X"}]},"metadata":{"labels":{"a":null}}}"#,
        )
        .unwrap();
        assert_eq!(out["status"]["conditions"], json!([{"type": "X"}]));
        assert_eq!(out["metadata"]["labels"], json!({"b": "2"}));
    }

    #[test]
    fn json_patch_test_failure_is_the_generic_422() {
        let rt = resource_by_plural("nodes").unwrap();
        let ok = apply(
            rt,
            "application/json-patch+json",
            &node(),
            br#"[{"op":"test","path":"/metadata/labels/a","value":"1"},{"op":"remove","path":"/spec/taints/1"}]"#,
        )
        .unwrap();
        assert_eq!(ok["spec"]["taints"].as_array().unwrap().len(), 1);
        let e = apply(
            rt,
            "application/json-patch+json",
            &node(),
            br#"[{"op":"test","path":"/metadata/labels/a","value":"9"},{"op":"remove","path":"/spec/taints/1"}]"#,
        )
        .unwrap_err();
        assert_eq!(e.code, 422);
        assert_eq!(e.body["reason"], "Invalid");
        assert_eq!(
            e.body["message"],
            "the server rejected our request due to an error in our request"
        );
        assert_eq!(
            apply(rt, "application/json-patch+json", &node(), b"{")
                .unwrap_err()
                .code,
            400
        );
    }

    #[test]
    fn unknown_patch_type_is_415() {
        let rt = resource_by_plural("nodes").unwrap();
        assert_eq!(
            apply(rt, "text/plain", &node(), b"{}").unwrap_err().code,
            415
        );
    }
}

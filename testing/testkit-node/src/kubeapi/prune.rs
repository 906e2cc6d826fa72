//! Unknown fields, as the real API server treats them: a typed object is decoded into its
//! Go struct, so a field the type does not have is dropped (with a `Warning` header since
//! Kubernetes 1.27, `fieldValidation=Warn`, the default) or refused with `Strict`. The
//! types here are k8s-openapi's, generated from the same OpenAPI schema, whose decoders
//! skip unknown fields the same way: an object is decoded into its type, encoded back,
//! and every field of the request that did not survive is unknown.

use serde_json::Value;

use super::meta::{ApiError, ResourceType};

/// `obj` with the fields `rt`'s type does not have removed, and their paths
/// (`spec.foo`, `deleteOptions.x`). A value of the wrong type is a 400, as on a real
/// server.
pub(crate) fn prune(rt: &ResourceType, obj: &Value) -> Result<(Value, Vec<String>), ApiError> {
    let typed = match (rt.group, rt.kind) {
        ("", "Pod") => round_trip::<k8s_openapi::api::core::v1::Pod>(obj),
        ("", "Node") => round_trip::<k8s_openapi::api::core::v1::Node>(obj),
        ("events.k8s.io", "Event") => round_trip::<k8s_openapi::api::events::v1::Event>(obj),
        ("policy", "PodDisruptionBudget") => {
            round_trip::<k8s_openapi::api::policy::v1::PodDisruptionBudget>(obj)
        }
        _ => return Ok((obj.clone(), vec![])),
    }?;
    Ok(keep_known(obj, &typed, ""))
}

/// An Eviction body (policy/v1), pruned the same way.
pub(crate) fn prune_eviction(obj: &Value) -> Result<(Value, Vec<String>), ApiError> {
    let typed = round_trip::<k8s_openapi::api::policy::v1::Eviction>(obj)?;
    Ok(keep_known(obj, &typed, ""))
}

fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(
    obj: &Value,
) -> Result<Value, ApiError> {
    let t: T = serde_json::from_value(obj.clone())
        .map_err(|e| ApiError::bad_request(format!("error decoding request body: {e}")))?;
    serde_json::to_value(&t).map_err(ApiError::internal)
}

/// `orig` with only what `typed` (its decoded-and-encoded form) kept; the dropped paths.
fn keep_known(orig: &Value, typed: &Value, at: &str) -> (Value, Vec<String>) {
    match (orig, typed) {
        (Value::Object(o), Value::Object(t)) => {
            let mut out = serde_json::Map::new();
            let mut dropped = vec![];
            for (k, v) in o {
                let path = if at.is_empty() {
                    k.clone()
                } else {
                    format!("{at}.{k}")
                };
                match t.get(k) {
                    Some(tv) => {
                        let (kept, d) = keep_known(v, tv, &path);
                        out.insert(k.clone(), kept);
                        dropped.extend(d);
                    }
                    // An explicit null is an absent field: not unknown.
                    None if v.is_null() => {}
                    None => dropped.push(path),
                }
            }
            (Value::Object(out), dropped)
        }
        (Value::Array(o), Value::Array(t)) if o.len() == t.len() => {
            let mut out = vec![];
            let mut dropped = vec![];
            for (i, (v, tv)) in o.iter().zip(t).enumerate() {
                let (kept, d) = keep_known(v, tv, &format!("{at}[{i}]"));
                out.push(kept);
                dropped.extend(d);
            }
            (Value::Array(out), dropped)
        }
        _ => (orig.clone(), vec![]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_fields_are_dropped_and_named() {
        let rt = super::super::meta::resource_by_plural("pods").unwrap();
        let (kept, dropped) = prune(
            rt,
            &json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "a", "labels": {"x": "1"}, "bogus": 1},
                    "spec": {"nodeName": "n1", "containers": [{"name": "c", "colour": "red"}]},
                    "extra": true}),
        )
        .unwrap();
        assert_eq!(
            kept,
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "a", "labels": {"x": "1"}},
                   "spec": {"nodeName": "n1", "containers": [{"name": "c"}]}})
        );
        assert_eq!(
            dropped,
            ["metadata.bogus", "spec.containers[0].colour", "extra"]
        );
        let (e, dropped) = prune_eviction(&json!({"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": "a"}, "delete_options": {"preconditions": {"uid": "u"}}}))
        .unwrap();
        assert_eq!(dropped, ["delete_options"]);
        assert!(e.get("delete_options").is_none());
        assert!(prune(
            rt,
            &json!({"apiVersion": "v1", "kind": "Pod", "spec": {"nodeName": 5}})
        )
        .is_err());
    }
}

//! Field and label selectors, parsed and matched the way the real API server does:
//! field selectors `a=b,c!=d` over a fixed set of labels per resource (anything else is a
//! 400 "field label not supported"), label selectors with `=`, `==`, `!=`, `in`, `notin`,
//! `key`, `!key`, `>` and `<`.

use super::meta::{ApiError, ResourceType};
use serde_json::Value;

/// One `field=value` or `field!=value` term of a field selector.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FieldTerm {
    pub field: String,
    pub value: String,
    pub negated: bool,
}

/// A parsed field selector: every term must hold.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct FieldSelector(pub Vec<FieldTerm>);

impl FieldSelector {
    /// Parses `sel` for resource `rt`; an unknown field label is the real server's 400.
    pub fn parse(sel: &str, rt: &ResourceType) -> Result<FieldSelector, ApiError> {
        let mut terms = Vec::new();
        for part in split_unescaped(sel, ',') {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let (field, value, negated) = if let Some((f, v)) = part.split_once("!=") {
                (f, v, true)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, v, false)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, v, false)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{sel}'; can't understand '{part}'"
                )));
            };
            let field = field.trim();
            let supported = field == "metadata.name"
                || (rt.namespaced && field == "metadata.namespace")
                || rt.fields.contains(&field);
            if !supported {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            terms.push(FieldTerm {
                field: field.to_string(),
                value: unescape(value.trim()),
                negated,
            });
        }
        Ok(FieldSelector(terms))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0
            .iter()
            .all(|t| (field_value(obj, &t.field) == t.value) != t.negated)
    }
}

/// The string a field selector compares for `field` (missing fields compare as "", and
/// booleans the real server defaults as "false").
pub(crate) fn field_value(obj: &Value, field: &str) -> String {
    let mut v = obj;
    for part in field.split('.') {
        match v.get(part) {
            Some(next) => v = next,
            None => {
                return if matches!(field, "spec.unschedulable" | "spec.hostNetwork") {
                    "false".into()
                } else {
                    String::new()
                };
            }
        }
    }
    match v {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn split_unescaped(s: &str, sep: char) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut escaped = false;
    for c in s.chars() {
        if escaped {
            out.last_mut().expect("never empty").push(c);
            escaped = false;
        } else if c == '\\' {
            out.last_mut().expect("never empty").push(c);
            escaped = true;
        } else if c == sep {
            out.push(String::new());
        } else {
            out.last_mut().expect("never empty").push(c);
        }
    }
    out
}

fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut escaped = false;
    for c in s.chars() {
        if escaped || c != '\\' {
            out.push(c);
            escaped = false;
        } else {
            escaped = true;
        }
    }
    out
}

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
    Gt(String, i64),
    Lt(String, i64),
}

/// A parsed label selector: every requirement must hold.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct LabelSelector(pub Vec<LabelReq>);

impl LabelSelector {
    pub fn parse(sel: &str) -> Result<LabelSelector, ApiError> {
        let bad = |why: &str| {
            ApiError::bad_request(format!(
                "unable to parse requirement: {why} (in label selector {sel:?})"
            ))
        };
        let mut reqs = Vec::new();
        // Split on commas outside parentheses.
        let mut parts = Vec::new();
        let mut depth = 0i32;
        let mut cur = String::new();
        for c in sel.chars() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                ',' if depth == 0 => {
                    parts.push(std::mem::take(&mut cur));
                    continue;
                }
                _ => {}
            }
            cur.push(c);
        }
        parts.push(cur);
        if depth != 0 {
            return Err(bad("unbalanced parentheses"));
        }
        for part in parts {
            let p = part.trim();
            if p.is_empty() {
                if sel.trim().is_empty() {
                    continue;
                }
                return Err(bad("empty requirement"));
            }
            let req =
                if let Some(k) = p.strip_prefix('!') {
                    LabelReq::NotExists(check_key(k.trim()).map_err(|e| bad(&e))?)
                } else if let Some((k, v)) = p.split_once("!=") {
                    LabelReq::NotEq(
                        check_key(k.trim()).map_err(|e| bad(&e))?,
                        check_value(v.trim()).map_err(|e| bad(&e))?,
                    )
                } else if let Some((k, v)) = p.split_once("==") {
                    LabelReq::Eq(
                        check_key(k.trim()).map_err(|e| bad(&e))?,
                        check_value(v.trim()).map_err(|e| bad(&e))?,
                    )
                } else if let Some((k, v)) = p.split_once('=') {
                    LabelReq::Eq(
                        check_key(k.trim()).map_err(|e| bad(&e))?,
                        check_value(v.trim()).map_err(|e| bad(&e))?,
                    )
                } else if let Some((k, v)) = p.split_once('>') {
                    let n = v.trim().parse().map_err(|_| {
                        bad("for 'gt', 'lt' operators, the value must be an integer")
                    })?;
                    LabelReq::Gt(check_key(k.trim()).map_err(|e| bad(&e))?, n)
                } else if let Some((k, v)) = p.split_once('<') {
                    let n = v.trim().parse().map_err(|_| {
                        bad("for 'gt', 'lt' operators, the value must be an integer")
                    })?;
                    LabelReq::Lt(check_key(k.trim()).map_err(|e| bad(&e))?, n)
                } else if let Some((k, set)) = split_set_op(p, "notin") {
                    LabelReq::NotIn(
                        check_key(k).map_err(|e| bad(&e))?,
                        parse_set(set).map_err(|e| bad(&e))?,
                    )
                } else if let Some((k, set)) = split_set_op(p, "in") {
                    LabelReq::In(
                        check_key(k).map_err(|e| bad(&e))?,
                        parse_set(set).map_err(|e| bad(&e))?,
                    )
                } else {
                    LabelReq::Exists(check_key(p).map_err(|e| bad(&e))?)
                };
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    pub fn matches(&self, labels: Option<&Value>) -> bool {
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => !get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
            LabelReq::Gt(k, n) => get(k)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x > *n),
            LabelReq::Lt(k, n) => get(k)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x < *n),
        })
    }

    /// A `metav1.LabelSelector` object (`matchLabels`, `matchExpressions`), as a PDB holds.
    /// `None` when the object is absent or malformed: it then selects nothing.
    pub fn from_object(sel: &Value) -> Option<LabelSelector> {
        let mut reqs = Vec::new();
        if let Some(ml) = sel.get("matchLabels").and_then(Value::as_object) {
            for (k, v) in ml {
                reqs.push(LabelReq::Eq(k.clone(), v.as_str()?.to_string()));
            }
        }
        if let Some(me) = sel.get("matchExpressions").and_then(Value::as_array) {
            for e in me {
                let key = e.get("key")?.as_str()?.to_string();
                let values: Vec<String> = e
                    .get("values")
                    .and_then(Value::as_array)
                    .map(|vs| {
                        vs.iter()
                            .filter_map(|v| v.as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default();
                reqs.push(match e.get("operator")?.as_str()? {
                    "In" => LabelReq::In(key, values),
                    "NotIn" => LabelReq::NotIn(key, values),
                    "Exists" => LabelReq::Exists(key),
                    "DoesNotExist" => LabelReq::NotExists(key),
                    _ => return None,
                });
            }
        }
        Some(LabelSelector(reqs))
    }
}

fn split_set_op<'a>(p: &'a str, op: &str) -> Option<(&'a str, &'a str)> {
    let open = p.find('(')?;
    let head = p[..open].trim_end();
    let key = head.strip_suffix(op)?;
    if !key.ends_with(char::is_whitespace) {
        return None;
    }
    Some((key.trim(), &p[open..]))
}

fn parse_set(s: &str) -> Result<Vec<String>, String> {
    let inner = s
        .trim()
        .strip_prefix('(')
        .and_then(|x| x.strip_suffix(')'))
        .ok_or_else(|| format!("expected a parenthesised set, found {s:?}"))?;
    inner.split(',').map(|v| check_value(v.trim())).collect()
}

/// Label keys: an optional DNS prefix and `/`, then a name of at most 63 characters.
fn check_key(k: &str) -> Result<String, String> {
    let name = k.rsplit_once('/').map_or(k, |(_, n)| n);
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(k.to_string())
    } else {
        Err(format!("invalid label key {k:?}: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"))
    }
}

fn check_value(v: &str) -> Result<String, String> {
    let ok = v.is_empty()
        || (v.len() <= 63
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            && v.starts_with(|c: char| c.is_ascii_alphanumeric())
            && v.ends_with(|c: char| c.is_ascii_alphanumeric()));
    if ok {
        Ok(v.to_string())
    } else {
        Err(format!("invalid label value: {v:?}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.'"))
    }
}

#[cfg(test)]
mod tests {
    use super::super::meta::resource_by_plural;
    use super::*;
    use serde_json::json;

    fn pods() -> &'static ResourceType {
        resource_by_plural("pods").unwrap()
    }

    #[test]
    fn field_selector_ops_and_and() {
        let pod = json!({"metadata": {"name": "a", "namespace": "ns"}, "spec": {"nodeName": "n1"}});
        let m = |s: &str| FieldSelector::parse(s, pods()).unwrap().matches(&pod);
        assert!(m("spec.nodeName=n1"));
        assert!(m("spec.nodeName==n1"));
        assert!(!m("spec.nodeName!=n1"));
        assert!(m("spec.nodeName=n1,metadata.namespace=ns,metadata.name!=b"));
        assert!(!m("spec.nodeName=n1,metadata.name=b"));
        assert!(m("status.phase="), "a missing field compares as empty");
        assert!(m("spec.hostNetwork=false"), "hostNetwork defaults to false");
    }

    #[test]
    fn unsupported_field_is_the_real_400() {
        let e = FieldSelector::parse("spec.foo=x", pods()).unwrap_err();
        assert_eq!(e.code, 400);
        assert_eq!(e.body["reason"], "BadRequest");
        assert_eq!(e.body["message"], "field label not supported: spec.foo");
        let nodes = resource_by_plural("nodes").unwrap();
        assert_eq!(
            FieldSelector::parse("metadata.namespace=x", nodes)
                .unwrap_err()
                .code,
            400,
            "cluster-scoped nodes have no namespace field"
        );
        assert!(FieldSelector::parse("spec.unschedulable=true", nodes).is_ok());
    }

    #[test]
    fn label_selector_every_operator() {
        let labels = json!({"app": "web", "tier": "front", "n": "5"});
        let m = |s: &str| LabelSelector::parse(s).unwrap().matches(Some(&labels));
        assert!(m("app=web"));
        assert!(m("app==web"));
        assert!(!m("app!=web"));
        assert!(m("missing!=x"), "!= holds when the label is absent");
        assert!(m("app in (web, api)"));
        assert!(!m("app notin (web,api)"));
        assert!(m("missing notin (a)"));
        assert!(!m("missing in (a)"));
        assert!(m("tier"));
        assert!(!m("!tier"));
        assert!(m("!missing"));
        assert!(m("n>4,n<6"));
        assert!(!m("n>5"));
        assert!(m("app=web,tier in (front),!missing"));
        assert!(m(""), "the empty selector selects everything");
        assert!(LabelSelector::parse("app=web")
            .unwrap()
            .matches(Some(&labels)));
        assert!(!LabelSelector::parse("app").unwrap().matches(None));
    }

    #[test]
    fn bad_label_selector_is_400() {
        for s in ["app in web", "a b c", "app=(", "-bad=x"] {
            let e = LabelSelector::parse(s).unwrap_err();
            assert_eq!(e.code, 400, "{s}");
            assert!(
                e.body["message"]
                    .as_str()
                    .unwrap()
                    .starts_with("unable to parse requirement"),
                "{s}"
            );
        }
    }

    #[test]
    fn label_selector_object() {
        let sel = json!({"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["front"]}]});
        let s = LabelSelector::from_object(&sel).unwrap();
        assert!(s.matches(Some(&json!({"app": "web", "tier": "front"}))));
        assert!(!s.matches(Some(&json!({"app": "web", "tier": "back"}))));
        assert!(LabelSelector::from_object(&json!({}))
            .unwrap()
            .matches(None));
    }
}

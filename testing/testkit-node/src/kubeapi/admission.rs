//! Who is asking, and whether they may, as kube-apiserver decides it: bearer tokens the
//! test registers ([`super::KubeApi::add_token`]) name a user (a service account whose
//! pod-bound token carries `authentication.kubernetes.io/node-name`, as Kubernetes ≥ 1.30
//! issues them); RBAC is evaluated over the stored ClusterRoles and ClusterRoleBindings,
//! and Roles and RoleBindings in the request's namespace;
//! ValidatingAdmissionPolicies and their bindings are evaluated with a CEL interpreter
//! (the policy's own expressions, not a rewrite of them). A request with no registered
//! token is the cluster's admin, checked by neither, as before.
//!
//! What the fake does not evaluate it refuses loudly (a 500 naming it), never passes:
//! `paramKind`/`paramRef`, `excludeResourceRules`, selectors, `auditAnnotations`,
//! `validationActions` other than `Deny`, and server-side apply by a registered user.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::meta::{ApiError, ResourceType};

/// The identity a token authenticates as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    /// `system:serviceaccount:<ns>:<name>`, or a user name.
    pub username: String,
    /// Groups (`system:serviceaccounts`, …).
    pub groups: Vec<String>,
    /// Extra attributes (`authentication.kubernetes.io/node-name`, …).
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The extra attribute a pod-bound service account token carries with its pod's node.
pub const NODE_NAME_CLAIM: &str = "authentication.kubernetes.io/node-name";

impl UserInfo {
    /// The service account `namespace/name` as its pod-bound token authenticates it:
    /// with `node`, the node claim of a pod on that node (Kubernetes ≥ 1.30), without
    /// it, a token without the claim (older clusters, or the feature gate off).
    pub fn service_account(namespace: &str, name: &str, node: Option<&str>) -> UserInfo {
        let mut extra = BTreeMap::new();
        if let Some(n) = node {
            extra.insert(NODE_NAME_CLAIM.to_string(), vec![n.to_string()]);
            extra.insert(
                "authentication.kubernetes.io/pod-name".to_string(),
                vec![format!("{name}-{n}")],
            );
        }
        UserInfo {
            username: format!("system:serviceaccount:{namespace}:{name}"),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ],
            extra,
        }
    }
}

/// One request as authorization and admission see it.
pub(crate) struct Attributes<'a> {
    pub user: &'a UserInfo,
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`.
    pub verb: &'a str,
    pub rt: &'a ResourceType,
    pub sub: Option<&'a str>,
    pub namespace: &'a str,
    pub name: &'a str,
    pub dry_run: bool,
}

fn str_list(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn forbidden(a: &Attributes<'_>) -> ApiError {
    let resource = match a.sub {
        Some(s) => format!("{}/{s}", a.rt.plural),
        None => a.rt.plural.to_string(),
    };
    let what = if a.name.is_empty() {
        a.rt.qualified()
    } else {
        format!("{} \"{}\"", a.rt.qualified(), a.name)
    };
    let scope = if a.rt.namespaced && !a.namespace.is_empty() {
        format!(" in the namespace \"{}\"", a.namespace)
    } else if a.rt.namespaced {
        String::new()
    } else {
        " at the cluster scope".to_string()
    };
    ApiError::forbidden(format!(
        "{what} is forbidden: User \"{}\" cannot {} resource \"{resource}\" in API group \"{}\"{scope}",
        a.user.username, a.verb, a.rt.group
    ))
}

/// The stored RBAC objects.
pub(crate) struct Rbac {
    pub cluster_roles: Vec<Value>,
    pub cluster_role_bindings: Vec<Value>,
    pub roles: Vec<Value>,
    pub role_bindings: Vec<Value>,
}

/// RBAC: whether a ClusterRoleBinding grants the request through a rule of its
/// ClusterRole, or a RoleBinding in the request's namespace through a rule of its Role
/// (of that namespace) or ClusterRole. A cluster-scoped request, or a request across all
/// namespaces, is granted by ClusterRoleBindings only, as kube-apiserver decides.
pub(crate) fn authorize(rbac: &Rbac, a: &Attributes<'_>) -> Result<(), ApiError> {
    let resource = match a.sub {
        Some(s) => format!("{}/{s}", a.rt.plural),
        None => a.rt.plural.to_string(),
    };
    let subject_matches = |s: &Value| match s["kind"].as_str() {
        Some("ServiceAccount") => {
            let ns = s["namespace"].as_str().unwrap_or("");
            let name = s["name"].as_str().unwrap_or("");
            a.user.username == format!("system:serviceaccount:{ns}:{name}")
        }
        Some("User") => s["name"].as_str() == Some(a.user.username.as_str()),
        Some("Group") => s["name"]
            .as_str()
            .is_some_and(|g| a.user.groups.iter().any(|x| x == g)),
        _ => false,
    };
    let rule_matches = |r: &Value| {
        let has =
            |field: &str, want: &str| str_list(&r[field]).iter().any(|x| *x == "*" || *x == want);
        let names = str_list(&r["resourceNames"]);
        has("apiGroups", a.rt.group)
            && (has("resources", &resource)
                || str_list(&r["resources"])
                    .iter()
                    .any(|x| a.sub.is_some() && *x == format!("{}/*", a.rt.plural)))
            && has("verbs", a.verb)
            && (names.is_empty() || names.contains(&a.name))
    };
    let bound = |b: &&Value| {
        b["subjects"]
            .as_array()
            .is_some_and(|ss| ss.iter().any(subject_matches))
    };
    let cluster_role = |b: &Value| {
        rbac.cluster_roles
            .iter()
            .find(|r| r["metadata"]["name"] == b["roleRef"]["name"])
    };
    let grants = |role: &Value| {
        role["rules"]
            .as_array()
            .is_some_and(|rules| rules.iter().any(rule_matches))
    };
    let cluster_wide = rbac
        .cluster_role_bindings
        .iter()
        .filter(bound)
        .filter(|b| b["roleRef"]["kind"] == "ClusterRole")
        .filter_map(cluster_role)
        .any(grants);
    let in_namespace = a.rt.namespaced
        && !a.namespace.is_empty()
        && rbac
            .role_bindings
            .iter()
            .filter(|b| b["metadata"]["namespace"] == a.namespace)
            .filter(bound)
            .filter_map(|b| match b["roleRef"]["kind"].as_str() {
                Some("ClusterRole") => cluster_role(b),
                Some("Role") => rbac.roles.iter().find(|r| {
                    r["metadata"]["namespace"] == a.namespace
                        && r["metadata"]["name"] == b["roleRef"]["name"]
                }),
                _ => None,
            })
            .any(grants);
    let allowed = cluster_wide || in_namespace;
    if allowed {
        Ok(())
    } else {
        Err(forbidden(a))
    }
}

/// The admission operation of a verb (`patch` and `update` are `UPDATE`).
fn operation(verb: &str) -> Option<&'static str> {
    match verb {
        "create" => Some("CREATE"),
        "update" | "patch" => Some("UPDATE"),
        "delete" => Some("DELETE"),
        _ => None,
    }
}

fn unsupported(what: &str) -> ApiError {
    ApiError::internal(format!(
        "the fake API server does not evaluate {what}; it refuses the request rather than pass it"
    ))
}

fn cel(v: &Value) -> Result<cel::Value, ApiError> {
    cel::to_value(v).map_err(|e| ApiError::internal(format!("CEL value: {e}")))
}

fn eval(expr: &str, ctx: &cel::Context<'_, '_>) -> Result<cel::Value, String> {
    let program = cel::Program::compile(expr).map_err(|e| format!("compiling {expr:?}: {e}"))?;
    program
        .execute(ctx)
        .map_err(|e| format!("evaluating {expr:?}: {e}"))
}

/// Whether the policy's `matchConstraints` select the request.
fn matched(policy: &Value, a: &Attributes<'_>, op: &str) -> Result<bool, ApiError> {
    let mc = &policy["spec"]["matchConstraints"];
    for unsupported_field in [
        "excludeResourceRules",
        "namespaceSelector",
        "objectSelector",
    ] {
        let v = &mc[unsupported_field];
        if !(v.is_null() || v == &json!({}) || v == &json!([])) {
            return Err(unsupported(&format!(
                "matchConstraints.{unsupported_field}"
            )));
        }
    }
    let resource = match a.sub {
        Some(s) => format!("{}/{s}", a.rt.plural),
        None => a.rt.plural.to_string(),
    };
    let any = |list: Vec<&str>, want: &str| list.iter().any(|x| *x == "*" || *x == want);
    Ok(mc["resourceRules"].as_array().is_some_and(|rules| {
        rules.iter().any(|r| {
            any(str_list(&r["apiGroups"]), a.rt.group)
                && any(str_list(&r["apiVersions"]), a.rt.version)
                && any(str_list(&r["operations"]), op)
                && (any(str_list(&r["resources"]), &resource)
                    || (a.sub.is_some()
                        && str_list(&r["resources"])
                            .contains(&format!("{}/*", a.rt.plural).as_str())))
        })
    }))
}

/// ValidatingAdmissionPolicies: every bound policy that selects the request and whose
/// match conditions hold must pass all its validations; the first failure denies it
/// (422, with the policy's message).
pub(crate) fn admit(
    policies: &[Value],
    bindings: &[Value],
    a: &Attributes<'_>,
    object: Option<&Value>,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    let Some(op) = operation(a.verb) else {
        return Ok(());
    };
    for binding in bindings {
        let policy_name = binding["spec"]["policyName"].as_str().unwrap_or("");
        let binding_name = binding["metadata"]["name"].as_str().unwrap_or("");
        let Some(policy) = policies
            .iter()
            .find(|p| p["metadata"]["name"] == policy_name)
        else {
            continue;
        };
        if !binding["spec"]["paramRef"].is_null() || !policy["spec"]["paramKind"].is_null() {
            return Err(unsupported("policy parameters"));
        }
        if !binding["spec"]["matchResources"].is_null() {
            return Err(unsupported("a binding's matchResources"));
        }
        if str_list(&binding["spec"]["validationActions"]) != ["Deny"] {
            return Err(unsupported("validationActions other than [Deny]"));
        }
        if !matched(policy, a, op)? {
            continue;
        }
        let fail_open = policy["spec"]["failurePolicy"] == "Ignore";
        let denied = |message: String| {
            let mut e = ApiError::invalid_message(format!(
                "ValidatingAdmissionPolicy '{policy_name}' with binding '{binding_name}' denied request: {message}"
            ));
            e.body["details"] = json!({"name": a.name, "kind": a.rt.plural});
            e
        };
        let mut extra = serde_json::Map::new();
        for (k, v) in &a.user.extra {
            extra.insert(k.clone(), json!(v));
        }
        let mut user = json!({"username": a.user.username, "groups": a.user.groups});
        if !extra.is_empty() {
            user["extra"] = Value::Object(extra);
        }
        let request = json!({
            "kind": {"group": a.rt.group, "version": a.rt.version, "kind": a.rt.kind},
            "resource": {"group": a.rt.group, "version": a.rt.version, "resource": a.rt.plural},
            "subResource": a.sub.unwrap_or(""),
            "name": a.name,
            "namespace": a.namespace,
            "operation": op,
            "userInfo": user,
            "dryRun": a.dry_run,
        });
        let mut ctx = cel::Context::default();
        ctx.add_variable_from_value("request", cel(&request)?);
        ctx.add_variable_from_value("object", cel(object.unwrap_or(&Value::Null))?);
        ctx.add_variable_from_value("oldObject", cel(old.unwrap_or(&Value::Null))?);
        // Match conditions: all true, or the policy does not apply.
        let mut applies = true;
        for c in policy["spec"]["matchConditions"]
            .as_array()
            .into_iter()
            .flatten()
        {
            match eval(c["expression"].as_str().unwrap_or("false"), &ctx) {
                Ok(cel::Value::Bool(true)) => {}
                Ok(_) => applies = false,
                Err(_) if fail_open => applies = false,
                Err(e) => return Err(denied(e)),
            }
        }
        if !applies {
            continue;
        }
        let mut variables: BTreeMap<String, Value> = BTreeMap::new();
        for v in policy["spec"]["variables"].as_array().into_iter().flatten() {
            let name = v["name"].as_str().unwrap_or("");
            ctx.add_variable_from_value("variables", cel(&json!(variables))?);
            match eval(v["expression"].as_str().unwrap_or(""), &ctx) {
                Ok(val) => {
                    let j = val
                        .json()
                        .map_err(|e| ApiError::internal(format!("variable {name}: {e}")))?;
                    variables.insert(name.to_string(), j);
                }
                Err(_) if fail_open => continue,
                Err(e) => return Err(denied(e)),
            }
        }
        ctx.add_variable_from_value("variables", cel(&json!(variables))?);
        for check in policy["spec"]["validations"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let expr = check["expression"].as_str().unwrap_or("false");
            match eval(expr, &ctx) {
                Ok(cel::Value::Bool(true)) => {}
                Ok(_) => {
                    let message = match check["messageExpression"].as_str() {
                        Some(m) => match eval(m, &ctx) {
                            Ok(cel::Value::String(s)) => s.to_string(),
                            _ => format!("failed expression: {expr}"),
                        },
                        None => check["message"]
                            .as_str()
                            .map_or_else(|| format!("failed expression: {expr}"), String::from),
                    };
                    return Err(denied(message));
                }
                Err(_) if fail_open => {}
                Err(e) => return Err(denied(e)),
            }
        }
    }
    Ok(())
}

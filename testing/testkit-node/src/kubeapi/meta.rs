//! The resource types the fake serves, the `Status` bodies the real API server answers
//! errors with, and the system fields (`uid`, timestamps) it stamps on objects.

use serde_json::{json, Value};
use std::time::{SystemTime, UNIX_EPOCH};

/// One resource type: where it lives in the URL space and what its objects are called.
#[derive(Debug)]
pub(crate) struct ResourceType {
    /// API group; empty for the core group (`/api/v1`).
    pub group: &'static str,
    pub version: &'static str,
    /// Plural resource name as in the URL; unique among the served types.
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    /// Has a `/status` subresource: the main resource then keeps `status` on writes and
    /// the subresource keeps everything else.
    pub status_subresource: bool,
    /// `metadata.generation` is set on create and bumped when `spec` changes.
    pub has_generation: bool,
    /// A PUT to a missing object creates it (events do; pods, nodes and PDBs answer 404).
    pub create_on_update: bool,
    /// DELETE answers with the deleted object (pods) instead of a success `Status`.
    pub delete_returns_object: bool,
    pub short_names: &'static [&'static str],
    /// Field selector labels this resource supports, besides `metadata.name` (and
    /// `metadata.namespace` for namespaced types).
    pub fields: &'static [&'static str],
}

impl ResourceType {
    /// `v1` or `events.k8s.io/v1`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `pods` or `events.k8s.io`: how error messages and `details.kind`/`group` name it.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
}

/// Every type the fake serves: what the interlock agent and CLI call.
pub(crate) static RESOURCES: &[ResourceType] = &[
    ResourceType {
        group: "",
        version: "v1",
        plural: "nodes",
        singular: "node",
        kind: "Node",
        namespaced: false,
        status_subresource: true,
        has_generation: false,
        create_on_update: false,
        delete_returns_object: false,
        short_names: &["no"],
        fields: &["spec.unschedulable"],
    },
    ResourceType {
        group: "",
        version: "v1",
        plural: "pods",
        singular: "pod",
        kind: "Pod",
        namespaced: true,
        status_subresource: true,
        has_generation: true,
        create_on_update: false,
        delete_returns_object: true,
        short_names: &["po"],
        fields: &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
    },
    ResourceType {
        group: "events.k8s.io",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        status_subresource: false,
        has_generation: false,
        create_on_update: true,
        delete_returns_object: false,
        short_names: &["ev"],
        fields: &[
            "reason",
            "type",
            "reportingController",
            "regarding.kind",
            "regarding.name",
            "regarding.namespace",
            "regarding.uid",
        ],
    },
    ResourceType {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "clusterroles",
        singular: "clusterrole",
        kind: "ClusterRole",
        namespaced: false,
        status_subresource: false,
        has_generation: false,
        create_on_update: false,
        delete_returns_object: false,
        short_names: &[],
        fields: &[],
    },
    ResourceType {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "clusterrolebindings",
        singular: "clusterrolebinding",
        kind: "ClusterRoleBinding",
        namespaced: false,
        status_subresource: false,
        has_generation: false,
        create_on_update: false,
        delete_returns_object: false,
        short_names: &[],
        fields: &[],
    },
    ResourceType {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "roles",
        singular: "role",
        kind: "Role",
        namespaced: true,
        status_subresource: false,
        has_generation: false,
        create_on_update: false,
        delete_returns_object: false,
        short_names: &[],
        fields: &[],
    },
    ResourceType {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "rolebindings",
        singular: "rolebinding",
        kind: "RoleBinding",
        namespaced: true,
        status_subresource: false,
        has_generation: false,
        create_on_update: false,
        delete_returns_object: false,
        short_names: &[],
        fields: &[],
    },
    ResourceType {
        group: "admissionregistration.k8s.io",
        version: "v1",
        plural: "validatingadmissionpolicies",
        singular: "validatingadmissionpolicy",
        kind: "ValidatingAdmissionPolicy",
        namespaced: false,
        status_subresource: true,
        has_generation: true,
        create_on_update: false,
        delete_returns_object: false,
        short_names: &[],
        fields: &[],
    },
    ResourceType {
        group: "admissionregistration.k8s.io",
        version: "v1",
        plural: "validatingadmissionpolicybindings",
        singular: "validatingadmissionpolicybinding",
        kind: "ValidatingAdmissionPolicyBinding",
        namespaced: false,
        status_subresource: false,
        has_generation: true,
        create_on_update: false,
        delete_returns_object: false,
        short_names: &[],
        fields: &[],
    },
    // Where `interlock manifests` puts the agents' settings (`check cluster` reads guard
    // mode from it).
    ResourceType {
        group: "",
        version: "v1",
        plural: "configmaps",
        singular: "configmap",
        kind: "ConfigMap",
        namespaced: true,
        status_subresource: false,
        has_generation: false,
        create_on_update: false,
        delete_returns_object: false,
        short_names: &["cm"],
        fields: &[],
    },
    ResourceType {
        group: "apps",
        version: "v1",
        plural: "daemonsets",
        singular: "daemonset",
        kind: "DaemonSet",
        namespaced: true,
        status_subresource: true,
        has_generation: true,
        create_on_update: false,
        delete_returns_object: false,
        short_names: &["ds"],
        fields: &[],
    },
    // A custom resource of a cluster with Karpenter installed (its CRD's group, version
    // and names), which `check cluster` reads.
    ResourceType {
        group: "karpenter.sh",
        version: "v1",
        plural: "nodepools",
        singular: "nodepool",
        kind: "NodePool",
        namespaced: false,
        status_subresource: true,
        has_generation: true,
        create_on_update: false,
        delete_returns_object: false,
        short_names: &[],
        fields: &[],
    },
    ResourceType {
        group: "policy",
        version: "v1",
        plural: "poddisruptionbudgets",
        singular: "poddisruptionbudget",
        kind: "PodDisruptionBudget",
        namespaced: true,
        status_subresource: true,
        has_generation: true,
        create_on_update: false,
        delete_returns_object: false,
        short_names: &["pdb"],
        fields: &[],
    },
];

/// The served type with this group and plural name.
pub(crate) fn resource(group: &str, plural: &str) -> Option<&'static ResourceType> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.plural == plural)
}

/// The served type for a plural name alone (`pods`, `events`, …).
pub(crate) fn resource_by_plural(plural: &str) -> Option<&'static ResourceType> {
    RESOURCES.iter().find(|r| r.plural == plural)
}

/// The served type an object names with its `apiVersion` and `kind`.
pub(crate) fn resource_of(obj: &Value) -> Option<&'static ResourceType> {
    let api_version = obj.get("apiVersion")?.as_str()?;
    let kind = obj.get("kind")?.as_str()?;
    RESOURCES
        .iter()
        .find(|r| r.kind == kind && r.api_version() == api_version)
}

/// An error answer: HTTP code plus the `Status` body the real server sends.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub code: u16,
    pub body: Value,
}

impl ApiError {
    fn new(code: u16, reason: &str, message: String, details: Option<Value>) -> ApiError {
        let mut body = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        });
        if let Some(d) = details {
            body["details"] = d;
        }
        ApiError { code, body }
    }

    fn details(rt: &ResourceType, name: &str) -> Value {
        let mut d = json!({ "name": name, "kind": rt.plural });
        if !rt.group.is_empty() {
            d["group"] = json!(rt.group);
        }
        d
    }

    pub fn not_found(rt: &ResourceType, name: &str) -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", rt.qualified()),
            Some(Self::details(rt, name)),
        )
    }

    /// The 404 for a URL the server has no route for.
    pub fn no_route() -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource".into(),
            Some(json!({})),
        )
    }

    pub fn already_exists(rt: &ResourceType, name: &str) -> ApiError {
        ApiError::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", rt.qualified()),
            Some(Self::details(rt, name)),
        )
    }

    /// 409 Conflict: `what` is the reason after "Operation cannot be fulfilled on …:".
    pub fn conflict(rt: &ResourceType, name: &str, what: &str) -> ApiError {
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {what}",
                rt.qualified()
            ),
            Some(Self::details(rt, name)),
        )
    }

    /// The conflict a stale `resourceVersion` gets.
    pub fn modified(rt: &ResourceType, name: &str) -> ApiError {
        Self::conflict(
            rt,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message.into(), None)
    }

    /// 422 Invalid with the field errors the real validation names.
    /// A 422 `Invalid` with only a message (an admission policy's denial).
    pub fn invalid_message(message: String) -> ApiError {
        ApiError::new(422, "Invalid", message, None)
    }

    pub fn invalid(rt: &ResourceType, name: &str, causes: &[(&str, String)]) -> ApiError {
        let list: Vec<String> = causes.iter().map(|(f, m)| format!("{f}: {m}")).collect();
        let joined = if list.len() == 1 {
            list[0].clone()
        } else {
            format!("[{}]", list.join(", "))
        };
        let kind_group = if rt.group.is_empty() {
            rt.kind.to_string()
        } else {
            format!("{}.{}", rt.kind, rt.group)
        };
        let mut details = Self::details(rt, name);
        details["kind"] = json!(rt.kind);
        details["causes"] = causes
            .iter()
            .map(|(f, m)| json!({ "reason": "FieldValueInvalid", "message": m, "field": f }))
            .collect();
        ApiError::new(
            422,
            "Invalid",
            format!("{kind_group} \"{name}\" is invalid: {joined}"),
            Some(details),
        )
    }

    /// A JSON patch that does not apply (a failed `test`, a missing path): the real server
    /// answers this generic 422 and drops the patch library's words.
    pub fn json_patch_failed() -> ApiError {
        ApiError::new(
            422,
            "Invalid",
            "the server rejected our request due to an error in our request".into(),
            Some(json!({})),
        )
    }

    pub fn expired(message: String) -> ApiError {
        ApiError::new(410, "Expired", message, None)
    }

    pub fn too_many_requests(message: String, causes: Option<Value>) -> ApiError {
        ApiError::new(
            429,
            "TooManyRequests",
            message,
            causes.map(|c| json!({ "causes": c })),
        )
    }

    pub fn forbidden(message: String) -> ApiError {
        ApiError::new(403, "Forbidden", message, None)
    }

    pub fn internal(message: impl std::fmt::Display) -> ApiError {
        ApiError::new(
            500,
            "InternalError",
            format!("Internal error occurred: {message}"),
            Some(json!({ "causes": [{ "message": message.to_string() }] })),
        )
    }

    pub fn unsupported_media_type(content_type: &str) -> ApiError {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: \
                 application/json-patch+json, application/merge-patch+json, \
                 application/apply-patch+yaml, application/strategic-merge-patch+json \
                 (got {content_type:?})"
            ),
            None,
        )
    }

    pub fn method_not_allowed() -> ApiError {
        ApiError::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource".into(),
            Some(json!({})),
        )
    }

    pub fn timeout(message: String) -> ApiError {
        ApiError::new(
            504,
            "Timeout",
            format!("Timeout: {message}"),
            Some(json!({ "retryAfterSeconds": 1 })),
        )
    }

    /// The body a real server sends for `code` when a test injects that failure.
    pub fn injected(code: u16, rt: Option<&ResourceType>, name: &str) -> ApiError {
        match (code, rt) {
            (409, Some(rt)) => Self::modified(rt, name),
            (404, Some(rt)) => Self::not_found(rt, name),
            (429, _) => ApiError::new(
                429,
                "TooManyRequests",
                "Too many requests, please try again later.".into(),
                Some(json!({ "retryAfterSeconds": 1 })),
            ),
            // What kube-apiserver answers a token it does not accept.
            (401, _) => ApiError::new(401, "Unauthorized", "Unauthorized".into(), None),
            (500, _) => Self::internal("injected failure"),
            (503, _) => ApiError::new(
                503,
                "ServiceUnavailable",
                "the server is currently unable to handle the request".into(),
                None,
            ),
            (504, _) => Self::timeout("request did not complete within requested timeout".into()),
            (c, _) => ApiError::new(c, "Unknown", format!("injected failure {c}"), None),
        }
    }
}

/// Seconds since the Unix epoch as RFC 3339 UTC (`2026-11-24T07:06:17Z`), the form
/// `metadata.creationTimestamp` takes.
pub(crate) fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The current time in the `metadata.creationTimestamp` form.
pub(crate) fn now() -> String {
    rfc3339(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    )
}

/// A random version 4 UUID, the form `metadata.uid` takes.
pub(crate) fn new_uid() -> String {
    let b: [u8; 16] = rand::random();
    let mut b = b;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Five characters the real server appends to `metadata.generateName`.
pub(crate) fn name_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5)
        .map(|_| ALPHABET[rand::random::<usize>() % ALPHABET.len()] as char)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_matches_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_795_849_577), "2026-11-28T07:06:17Z");
    }

    #[test]
    fn uid_is_a_v4_uuid() {
        let u = new_uid();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert!(u.split('-').map(str::len).eq([8, 4, 4, 4, 12]));
    }

    #[test]
    fn invalid_names_every_field() {
        let rt = resource_by_plural("events").unwrap();
        let e = ApiError::invalid(
            rt,
            "e1",
            &[
                ("eventTime", "Required value".into()),
                ("action", "Required value".into()),
            ],
        );
        assert_eq!(e.code, 422);
        assert_eq!(
            e.body["message"],
            "Event.events.k8s.io \"e1\" is invalid: [eventTime: Required value, action: Required value]"
        );
        assert_eq!(e.body["details"]["group"], "events.k8s.io");
    }
}

//! The `interlock-cni` chained CNI plugin, as a library.
//!
//! `main.rs` only reads the environment and stdin and calls [`run`]; everything else —
//! verbs, plugin config, per-attachment state, the pod decision — lives here so the
//! agent and the benchmarks can use it in-process.
//!
//! Verbs: VERSION (0.3.0 to 1.1.0), ADD (chained: requires `prevResult`, returns it in the
//! config's version after [`decide::decide`] and [`decide::protect`]), DEL (idempotent,
//! works without netns or `prevResult`), CHECK, GC (removes state of attachments not in
//! `cni.dev/valid-attachments`) and STATUS (the agent's readiness marker). Errors are
//! the spec's JSON on stdout: 6 for undecodable input, 1 for an unsupported version (with
//! the supported list), 7 for a bad field (named), 4 for missing environment; nothing but
//! the protocol ever goes to stdout.

pub mod config;
pub mod decide;
pub mod identity;
pub mod log;
pub mod state;
pub mod status;

use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};

use interlock_protocol::error::{self as codes, CniError};
use interlock_protocol::exec::Command;
use interlock_protocol::{CniResult, CniVersion};
use serde_json::{Map, Value};

use crate::config::{FailurePolicy, PluginConfig};
use crate::decide::{Decision, Protection};
use crate::identity::PodIdentity;
use crate::log::Logger;
use crate::state::{AttachmentKey, AttachmentState, StateStore};

/// interlock's own error code: an internal error (a bug; please report it).
pub const ERR_INTERNAL: u32 = 100;
/// interlock's own error code: the pod's mesh annotations cannot be turned into rules.
pub const ERR_INVALID_POD_ANNOTATIONS: u32 = 101;

/// The `CNI_*` environment of one invocation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniEnv {
    /// `CNI_COMMAND`.
    pub command: Option<String>,
    /// `CNI_CONTAINERID`.
    pub container_id: Option<String>,
    /// `CNI_NETNS`.
    pub netns: Option<String>,
    /// `CNI_IFNAME`.
    pub ifname: Option<String>,
    /// `CNI_ARGS`.
    pub args: Option<String>,
    /// `CNI_PATH`.
    pub path: Option<String>,
}

impl CniEnv {
    /// Reads the `CNI_*` variables of this process (non-UTF-8 values count as absent).
    pub fn from_process() -> CniEnv {
        let var = |k: &str| std::env::var(k).ok();
        CniEnv {
            command: var("CNI_COMMAND"),
            container_id: var("CNI_CONTAINERID"),
            netns: var("CNI_NETNS"),
            ifname: var("CNI_IFNAME"),
            args: var("CNI_ARGS"),
            path: var("CNI_PATH"),
        }
    }
}

/// What the process should print on stdout and exit with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Exactly the bytes for stdout (a result, a version answer, an error, or nothing).
    pub stdout: Vec<u8>,
    /// 0 on success, 1 on a CNI error.
    pub exit_code: i32,
}

impl Outcome {
    fn ok(stdout: Vec<u8>) -> Outcome {
        Outcome {
            stdout,
            exit_code: 0,
        }
    }

    fn error(e: &CniError) -> Outcome {
        Outcome {
            stdout: e.to_json().into_bytes(),
            exit_code: 1,
        }
    }
}

/// Runs one invocation. Never panics through to the caller: a bug becomes error 100.
pub fn run(env: &CniEnv, stdin: &[u8]) -> Outcome {
    match catch_unwind(AssertUnwindSafe(|| run_inner(env, stdin))) {
        Ok(Ok(stdout)) => Outcome::ok(stdout),
        Ok(Err(e)) => Outcome::error(&e),
        Err(_) => Outcome::error(&internal_error()),
    }
}

/// The error printed when the plugin hits a bug (also used by `main`'s panic hook).
pub fn internal_error() -> CniError {
    CniError::new(
        CniVersion::LATEST.as_str(),
        ERR_INTERNAL,
        "interlock-cni internal error (a bug): see the plugin log or stderr",
    )
}

/// The VERSION answer.
pub fn version_info() -> Value {
    serde_json::json!({
        "cniVersion": CniVersion::LATEST.as_str(),
        "supportedVersions": CniVersion::all_strings(),
    })
}

fn json_line(v: &Value) -> Vec<u8> {
    let mut s = v.to_string().into_bytes();
    s.push(b'\n');
    s
}

/// The parsed invocation every verb works from.
struct Call<'a> {
    env: &'a CniEnv,
    command: Command,
    version: CniVersion,
    conf: Map<String, Value>,
    config: PluginConfig,
    log: Logger,
}

impl Call<'_> {
    fn err(&self, code: u32, msg: impl Into<String>) -> CniError {
        CniError::new(self.version.as_str(), code, msg)
    }

    fn require_env(&self) -> Result<(), CniError> {
        let need: &[(&str, &Option<String>)] = match self.command {
            Command::Add | Command::Check => &[
                ("CNI_CONTAINERID", &self.env.container_id),
                ("CNI_NETNS", &self.env.netns),
                ("CNI_IFNAME", &self.env.ifname),
            ],
            Command::Del => &[
                ("CNI_CONTAINERID", &self.env.container_id),
                ("CNI_IFNAME", &self.env.ifname),
            ],
            _ => &[],
        };
        let missing: Vec<&str> = need
            .iter()
            .filter(|(_, v)| v.as_deref().unwrap_or("").is_empty())
            .map(|(k, _)| *k)
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(self.err(
                codes::INVALID_ENVIRONMENT,
                format!(
                    "required environment variables missing for {}: {}",
                    self.command,
                    missing.join(", ")
                ),
            ))
        }
    }

    fn key(&self) -> AttachmentKey {
        AttachmentKey {
            container_id: self.env.container_id.clone().unwrap_or_default(),
            ifname: self.env.ifname.clone().unwrap_or_default(),
        }
    }

    fn prev_result(&self, verb: &str) -> Result<CniResult, CniError> {
        let Some(prev) = self.conf.get("prevResult").filter(|v| !v.is_null()) else {
            return Err(self.err(
                codes::INVALID_NETWORK_CONFIG,
                format!(
                    "prevResult: missing: interlock-cni is a chained plugin and needs the primary plugin's result for {verb}; \
                     put it after the primary plugin (bridge, calico, …) in the plugins list, never first"
                ),
            ));
        };
        CniResult::from_value(prev.clone(), Some(self.version))
            .map_err(|e| self.err(codes::INVALID_NETWORK_CONFIG, format!("prevResult: {e}")))
    }

    fn network(&self) -> String {
        self.conf
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    }
}

fn run_inner(env: &CniEnv, stdin: &[u8]) -> Result<Vec<u8>, CniError> {
    let latest = CniVersion::LATEST.as_str();
    let command: Command = match env.command.as_deref() {
        None | Some("") => {
            return Err(CniError::new(latest, codes::INVALID_ENVIRONMENT, "CNI_COMMAND is not set")
                .with_details("interlock-cni is a CNI plugin: a container runtime runs it with CNI_COMMAND=ADD|DEL|CHECK|GC|STATUS|VERSION"))
        }
        Some(c) => c
            .parse()
            .map_err(|e: String| CniError::new(latest, codes::INVALID_ENVIRONMENT, e))?,
    };
    if command == Command::Version {
        return Ok(json_line(&version_info()));
    }

    let conf: Map<String, Value> = match serde_json::from_slice::<Value>(stdin) {
        Ok(Value::Object(m)) => m,
        Ok(other) => {
            return Err(CniError::new(
                latest,
                codes::DECODING_FAILURE,
                format!(
                    "failed to decode network config from stdin: expected a JSON object, found {}",
                    short(&other.to_string())
                ),
            ))
        }
        Err(e) => {
            return Err(CniError::new(
                latest,
                codes::DECODING_FAILURE,
                format!("failed to decode network config from stdin: {e}"),
            ))
        }
    };
    let version = match conf.get("cniVersion") {
        None => {
            return Err(CniError::new(
                latest,
                codes::INCOMPATIBLE_VERSION,
                format!(
                    "incompatible CNI versions: config has no cniVersion (meaning 0.1.0); interlock-cni supports {}",
                    CniVersion::all_strings().join(", ")
                ),
            ))
        }
        Some(Value::String(s)) => s.parse::<CniVersion>().map_err(|_| {
            CniError::new(
                latest,
                codes::INCOMPATIBLE_VERSION,
                format!(
                    "incompatible CNI versions: config is {s:?}, interlock-cni supports {}",
                    CniVersion::all_strings().join(", ")
                ),
            )
        })?,
        Some(other) => {
            return Err(CniError::new(
                latest,
                codes::INVALID_NETWORK_CONFIG,
                format!("cniVersion: expected a string, found {}", short(&other.to_string())),
            ))
        }
    };
    let config = PluginConfig::from_map(&conf).map_err(|e| {
        CniError::new(
            version.as_str(),
            codes::INVALID_NETWORK_CONFIG,
            e.to_string(),
        )
    })?;
    let log = Logger::new(config.log_level, config.log_file.clone()).with_context(format!(
        "{command} {}/{}",
        env.container_id.as_deref().unwrap_or("-"),
        env.ifname.as_deref().unwrap_or("-")
    ));
    let call = Call {
        env,
        command,
        version,
        conf,
        config,
        log,
    };
    call.require_env()?;
    let result = match command {
        Command::Add => cmd_add(&call),
        Command::Del => cmd_del(&call),
        Command::Check => cmd_check(&call),
        Command::Gc => cmd_gc(&call),
        Command::Status => cmd_status(&call),
        Command::Version => Ok(json_line(&version_info())),
    };
    if let Err(e) = &result {
        call.log.error(&format!("failed: {e}"));
    }
    result
}

fn short(s: &str) -> String {
    if s.len() > 80 {
        let mut end = 80;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &s[..end])
    } else {
        s.to_string()
    }
}

fn cmd_add(call: &Call) -> Result<Vec<u8>, CniError> {
    let prev = call.prev_result("ADD")?;
    let pod = PodIdentity::from_cni(call.env.args.as_deref().unwrap_or(""), &call.conf)
        .map_err(|e| call.err(codes::INVALID_NETWORK_CONFIG, e.to_string()))?;
    call.log.debug(&format!("decision input: {pod:?}"));
    let decision = decide::decide(&call.config, &pod);
    let open = call.config.failure_policy == FailurePolicy::Open;
    let protection = match &decision {
        Decision::Invalid { reason } if !open => {
            return Err(call.err(
                ERR_INVALID_POD_ANNOTATIONS,
                format!("pod {}: {reason}", pod.display_name()),
            ))
        }
        Decision::Undecided { reason } if !open => return Err(call
            .err(
                codes::TRY_AGAIN_LATER,
                format!(
                    "cannot decide whether pod {} is meshed: {reason}",
                    pod.display_name()
                ),
            )
            .with_details(
                "failurePolicy is closed: the pod is not started until its mesh status is known",
            )),
        Decision::Invalid { reason } | Decision::Undecided { reason } => {
            call.log.warn(&format!(
                "pod {} passed through WITHOUT protection (failurePolicy open): {reason}",
                pod.display_name()
            ));
            Protection::PassedThrough {
                reason: format!("failurePolicy open: {reason}"),
            }
        }
        _ => decide::protect(
            &call.config,
            &pod,
            call.env.netns.as_deref().unwrap_or(""),
            &decision,
        ),
    };
    let state = AttachmentState {
        key: call.key(),
        netns: call.env.netns.clone().unwrap_or_default(),
        network: call.network(),
        cni_version: call.version.to_string(),
        pod: pod.clone(),
        decision: decision.clone(),
        protection: protection.clone(),
        added_at_ms: status::now_ms(),
    };
    let store = StateStore::new(&call.config.state_dir);
    if let Err(e) = store.save(&state) {
        if !open {
            return Err(call.err(codes::IO_FAILURE, format!("writing attachment state: {e}")));
        }
        call.log.warn(&format!(
            "writing attachment state failed (failurePolicy open): {e}"
        ));
    }
    let detail = match &protection {
        Protection::PassedThrough { reason } => reason.clone(),
        Protection::NotNeeded => match &decision {
            Decision::Skip { reason } | Decision::NotMeshed { reason } => reason.clone(),
            _ => String::new(),
        },
    };
    call.log.info(&format!(
        "pod {}: {} ({detail})",
        pod.display_name(),
        decision.label()
    ));
    let mut out = prev.convert(call.version).to_json().into_bytes();
    out.push(b'\n');
    Ok(out)
}

fn cmd_del(call: &Call) -> Result<Vec<u8>, CniError> {
    let store = StateStore::new(&call.config.state_dir);
    let key = call.key();
    let state = match store.load(&key) {
        Ok(s) => s,
        Err(e) => {
            call.log.warn(&format!(
                "attachment state unreadable, deleting anyway: {e}"
            ));
            None
        }
    };
    decide::unprotect(
        &call.config,
        state.as_ref(),
        call.env.netns.as_deref().unwrap_or(""),
    )
    .map_err(|e| call.err(codes::IO_FAILURE, format!("removing redirection: {e}")))?;
    let existed = store
        .remove(&key)
        .map_err(|e| call.err(codes::IO_FAILURE, format!("removing attachment state: {e}")))?;
    call.log.info(if existed {
        "attachment state removed"
    } else {
        "no attachment state (already deleted or never added): nothing to do"
    });
    Ok(Vec::new())
}

fn cmd_check(call: &Call) -> Result<Vec<u8>, CniError> {
    if !call.version.supports_check() {
        return Err(call.err(
            codes::INCOMPATIBLE_VERSION,
            format!(
                "config version {} does not allow CHECK (needs 0.4.0 or later)",
                call.version
            ),
        ));
    }
    call.prev_result("CHECK")?;
    let store = StateStore::new(&call.config.state_dir);
    match store.load(&call.key()) {
        Ok(Some(state)) => {
            call.log.info(&format!("attachment known: {}", state.decision.label()));
            Ok(Vec::new())
        }
        Ok(None) => Err(call.err(
            codes::UNKNOWN_CONTAINER,
            format!(
                "interlock-cni has no state for container {} interface {}: it was never added through interlock-cni",
                call.key().container_id,
                call.key().ifname
            ),
        )),
        Err(e) => Err(call.err(codes::IO_FAILURE, format!("reading attachment state: {e}"))),
    }
}

fn cmd_gc(call: &Call) -> Result<Vec<u8>, CniError> {
    if !call.version.supports_gc_and_status() {
        return Err(call.err(
            codes::INCOMPATIBLE_VERSION,
            format!(
                "config version {} does not allow GC (needs 1.1.0)",
                call.version
            ),
        ));
    }
    let (field, raw) =
        match call.conf.get("cni.dev/valid-attachments") {
            Some(v) => ("cni.dev/valid-attachments", v),
            None => match call.conf.get("cni.dev/attachments") {
                Some(v) => ("cni.dev/attachments", v),
                None => return Err(call.err(
                    codes::INVALID_NETWORK_CONFIG,
                    "cni.dev/valid-attachments: missing: GC needs the list of attachments to keep",
                )),
            },
        };
    let valid: Vec<AttachmentKey> = serde_json::from_value(raw.clone())
        .map_err(|e| call.err(codes::INVALID_NETWORK_CONFIG, format!("{field}: {e}")))?;
    let valid: BTreeSet<AttachmentKey> = valid.into_iter().collect();
    let store = StateStore::new(&call.config.state_dir);
    let removed = store
        .retain(&valid)
        .map_err(|e| call.err(codes::IO_FAILURE, format!("GC of attachment state: {e}")))?;
    call.log.info(&format!(
        "GC kept {} valid attachment(s), removed state of {}",
        valid.len(),
        removed.len()
    ));
    Ok(Vec::new())
}

fn cmd_status(call: &Call) -> Result<Vec<u8>, CniError> {
    if !call.version.supports_gc_and_status() {
        return Err(call.err(
            codes::INCOMPATIBLE_VERSION,
            format!(
                "config version {} does not allow STATUS (needs 1.1.0)",
                call.version
            ),
        ));
    }
    status::check_status(
        &call.config.state_dir,
        status::now_ms(),
        call.version.as_str(),
    )?;
    Ok(Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn env(command: &str) -> CniEnv {
        CniEnv {
            command: Some(command.into()),
            container_id: Some("c".into()),
            netns: Some("/var/run/netns/x".into()),
            ifname: Some("eth0".into()),
            args: Some("K8S_POD_NAMESPACE=a;K8S_POD_NAME=b".into()),
            path: Some("/usr/lib/cni".into()),
        }
    }

    fn check_outcome(o: &Outcome) -> Result<(), TestCaseError> {
        prop_assert!(o.exit_code == 0 || o.exit_code == 1);
        if o.exit_code == 1 {
            let e: CniError = serde_json::from_slice(&o.stdout)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_ne!(e.code, ERR_INTERNAL, "internal error (a panic): {:?}", e);
            prop_assert!(!e.msg.is_empty());
        } else if !o.stdout.is_empty() {
            serde_json::from_slice::<Value>(&o.stdout)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
        Ok(())
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            "\\PC{0,8}".prop_map(Value::String),
            prop::sample::select(vec![
                "0.3.1",
                "1.0.0",
                "1.1.0",
                "interlock-cni",
                "/tmp",
                "open",
                "closed"
            ])
            .prop_map(|s| Value::String(s.into())),
        ];
        leaf.prop_recursive(3, 20, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                prop::collection::vec(
                    (
                        prop::sample::select(vec![
                            "cniVersion",
                            "type",
                            "name",
                            "stateDir",
                            "prevResult",
                            "runtimeConfig",
                            "failurePolicy",
                            "io.kubernetes.cri.pod-annotations",
                            "ips",
                            "interfaces",
                            "address",
                            "profiles",
                            "cni.dev/valid-attachments",
                            "containerID",
                            "ifname",
                            "x",
                        ]),
                        inner
                    ),
                    0..6
                )
                .prop_map(|kv| Value::Object(
                    kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
                )),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Whatever arrives on stdin, every verb answers in the protocol and never panics.
        #[test]
        fn never_panics_on_any_input(
            bytes in prop::collection::vec(any::<u8>(), 0..64),
            doc in arb_json(),
            command in prop::sample::select(vec!["ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION", "NOPE"]),
        ) {
            let t = tempfile::tempdir().unwrap();
            check_outcome(&run(&env(command), &bytes))?;
            // Keep writes inside the temp dir when the document names a stateDir.
            let mut doc = doc;
            if let Value::Object(m) = &mut doc {
                m.insert("stateDir".into(), Value::String(t.path().display().to_string()));
            }
            check_outcome(&run(&env(command), doc.to_string().as_bytes()))?;
        }

        /// A valid config with random fields replaced by random values reaches every
        /// verb's deeper checks; still only protocol answers, never a panic.
        #[test]
        fn never_panics_on_almost_valid_configs(
            overrides in prop::collection::vec((prop::sample::select(vec![
                "cniVersion", "type", "prevResult", "runtimeConfig", "failurePolicy", "logLevel",
                "excludeNamespaces", "profiles", "capabilities", "cni.dev/valid-attachments", "backend",
            ]), arb_json()), 0..3),
            command in prop::sample::select(vec!["ADD", "DEL", "CHECK", "GC", "STATUS"]),
            annotations in prop::collection::btree_map(
                prop::sample::select(vec![
                    "sidecar.istio.io/status", "sidecar.istio.io/inject", "linkerd.io/proxy-version",
                    "interlock.dev/redirect", "traffic.sidecar.istio.io/excludeOutboundPorts",
                    "config.linkerd.io/skip-subnets", "interlock.dev/inbound-ports",
                ]),
                "\\PC{0,10}|enabled|false|[0-9,*-]{0,12}",
                0..4,
            ),
        ) {
            let t = tempfile::tempdir().unwrap();
            let mut doc = serde_json::json!({
                "cniVersion": "1.1.0", "name": "n", "type": "interlock-cni", "stateDir": t.path(),
                "logLevel": "error",
                "runtimeConfig": {"io.kubernetes.cri.pod-annotations": annotations},
                "prevResult": {"cniVersion": "1.1.0", "interfaces": [{"name": "eth0"}], "ips": [{"interface": 0, "address": "10.99.0.2/24"}]},
                "cni.dev/valid-attachments": [],
            });
            for (k, v) in overrides {
                doc[k] = v;
            }
            doc["stateDir"] = Value::String(t.path().display().to_string());
            check_outcome(&run(&env(command), doc.to_string().as_bytes()))?;
        }
    }
}

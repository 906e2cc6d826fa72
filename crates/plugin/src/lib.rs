//! The `interlock-cni` chained CNI plugin, as a library.
//!
//! `main.rs` only reads the environment and stdin and calls [`run`]; everything else —
//! verbs, plugin config, per-attachment state, the pod decision — lives here so the
//! agent and the benchmarks can use it in-process.
//!
//! # Verbs
//!
//! - **ADD** (chained: requires `prevResult`, returns it converted to the config's
//!   version). Decides whether the pod is meshed ([`decide::decide_with_lookup`]: the
//!   annotations from `runtimeConfig`, or — only when the runtime passed none — from the
//!   agent socket, see [`lookup`]). For a meshed pod it
//!   applies the profile's spec for **both** address families (whatever `prevResult`
//!   lists: every veth has an IPv6 link-local address, and a primary may not list every
//!   address) in `CNI_NETNS` with the configured backend (`auto` detects the host's,
//!   reusing a detection up to a minute old from `<stateDir>/backend-detected.json`, see
//!   [`backend_cache`]), verifies the rules read back are exactly the expected ones, and
//!   proves every family the pod can route with the probe, trying the pod's gateways
//!   first ([`protect::protect`], `interlock_redirect::probe`). The netns is the unit of
//!   protection ([`netns_state`]): under the netns's lock, an attachment whose netns
//!   already holds live rules for the same spec (a Multus pod's second interface, a
//!   concurrent ADD) shares them after reading them back; another spec there is refused.
//!   Only then is the attachment's state written (profile, backend, installed spec as
//!   canonical JSON and its hash, netns and its identity, pod, timings), its reference
//!   recorded in the netns's record, and the result returned. A repeated ADD of an
//!   attachment that an earlier ADD protected with another backend then removes that
//!   backend's rules, so the netns holds only what the state records. Any failure for a
//!   meshed pod fails the ADD naming the pod, the step and the cause; the netns is left
//!   without interlock rules unless another attachment relies on them (the details say
//!   which). With `failurePolicy: open` the ADD succeeds instead, the failure is logged at
//!   error level and the state records the attachment as `unprotected`.
//! - **CHECK** re-reads the recorded spec's rules in the netns and fails with every
//!   difference when they are not exactly the expected ones (it never re-applies or
//!   probes: the proxy owns its port by then). Succeeds for pods that needed nothing;
//!   fails for a meshed pod recorded as `unprotected`.
//! - **DEL** drops the attachment's reference on its netns and removes the rules with the
//!   recorded backend (every backend's rules when there is no state) when no other live
//!   attachment relies on them; then the state. An empty `CNI_NETNS` or a netns that is
//!   gone is success.
//! - **GC** does what DEL does for every attachment not in `cni.dev/valid-attachments`
//!   (only listed attachments count as live). **STATUS** answers 50 only when an ADD could
//!   not protect a meshed pod now ([`status`]; not because the agent is down).
//!   **VERSION**: 0.3.0 to 1.1.0.
//!
//! Nothing but the protocol ever goes to stdout; one line per verb is logged at info
//! level (pod, decision, backend, timings) and every failure at error level.
//!
//! # Error codes
//!
//! | code | meaning |
//! |---|---|
//! | 1 | incompatible CNI version (the message lists the supported ones) |
//! | 3 | CHECK for an attachment interlock-cni never added |
//! | 4 | missing or invalid `CNI_*` environment |
//! | 5 | I/O failure on interlock's own state under `stateDir` (step `state`) |
//! | 6 | stdin is not a JSON object |
//! | 7 | invalid network config: a bad field of the interlock-cni entry (named), a missing or invalid `prevResult`, malformed `runtimeConfig` annotations |
//! | 11 | try again later (step `lookup`): the pod's mesh status cannot be decided — the runtime passed no annotations and the agent socket did not answer (or is not trusted); the message says why |
//! | 50 | STATUS: an ADD could not protect a meshed pod now: the backend cannot work, the state dir is unusable, or the lookup the entry needs cannot work (every reason listed) |
//! | 100 | internal error (a bug) |
//! | 101 | step `spec`: the pod's mesh annotations cannot be turned into rules (names the annotation and its value) |
//! | 102 | step `apply` (or `open`): applying the redirect rules failed, or the backend cannot be used |
//! | 103 | step `verify`: the rules read back are not exactly the expected ones (ADD, CHECK: every difference is listed), or cannot be read; CHECK of a meshed pod left unprotected |
//! | 104 | step `probe`: the probe did not prove the outbound redirection |
//! | 105 | step `netns`: the pod's network namespace cannot be entered, or `CNI_NETNS` is not a pod's: the plugin's own or PID 1's (the host's), or not a network namespace (refused before anything is touched; DEL of a path that is not a network namespace succeeds) |
//! | 106 | step `remove`: DEL could not remove the redirect rules (the state is kept for the retry) |
//!
//! Every failure message about a pod starts with `pod <namespace>/<name>: step <step>
//! failed:` followed by the cause.

pub mod agent_client;
pub mod backend_cache;
pub mod decide;
pub mod identity;
pub mod log;
pub mod lookup;
pub mod netns_state;
pub mod protect;
pub mod protection;
pub mod state;
pub mod status;

use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use interlock_contract::codes::{self, Step};
use interlock_protocol::error::CniError;
use interlock_protocol::exec::Command;
use interlock_protocol::{CniResult, CniVersion};
use serde_json::{Map, Value};

use crate::decide::Decision;
use crate::identity::PodIdentity;
use crate::log::Logger;
use crate::protect::{micros, Failure, Undone};
use crate::protection::Protection;
use crate::state::{AttachmentKey, AttachmentState, StateStore};
use interlock_contract::config::{FailurePolicy, PluginConfig};

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
        codes::INTERNAL,
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

fn ms(us: u64) -> String {
    format!("{:.2} ms", us as f64 / 1000.0)
}

fn cmd_add(call: &Call) -> Result<Vec<u8>, CniError> {
    let start = Instant::now();
    let prev = call.prev_result("ADD")?;
    let mut pod = PodIdentity::from_cni(call.env.args.as_deref().unwrap_or(""), &call.conf)
        .map_err(|e| call.err(codes::INVALID_NETWORK_CONFIG, e.to_string()))?;
    call.log.debug(&format!("decision input: {pod:?}"));
    let (decision, source) = decide::decide_with_lookup(&call.config, &mut pod);
    let decide_us = micros(start.elapsed());
    let name = pod.display_name();
    let netns = call.env.netns.as_deref().unwrap_or("");
    let ifname = call.env.ifname.as_deref().unwrap_or("");
    let open = call.config.failure_policy == FailurePolicy::Open;

    let store = StateStore::new(&call.config.state_dir);
    let outcome = match &decision {
        Decision::Invalid { reason } => Err(Failure::clean(Step::Spec, reason.clone())),
        Decision::Undecided { reason } => Err(Failure::clean(
            Step::Lookup,
            format!("cannot decide whether the pod is meshed: {reason}"),
        )),
        _ => protect::protect(
            &call.config,
            &store,
            &call.key(),
            netns,
            &decision,
            &prev,
            ifname,
        ),
    };
    let (protection, claim) = match outcome {
        Ok(p) => p,
        Err(f) if !open => {
            return Err(call
                .err(
                    f.code,
                    format!("pod {name}: step {} failed: {}", f.step, f.message),
                )
                .with_details(add_failure_details(&f, netns)))
        }
        Err(f) => {
            call.log.error(&format!(
                "pod {name} runs WITHOUT traffic redirection (failurePolicy open): step {} \
                 failed: {}",
                f.step, f.message
            ));
            (
                Protection::Unprotected {
                    step: f.step.to_string(),
                    reason: f.message,
                },
                None,
            )
        }
    };
    let mut state = AttachmentState {
        key: call.key(),
        netns: netns.to_string(),
        netns_id: claim.as_ref().map(|c| c.netns_id().to_string()),
        network: call.network(),
        cni_version: call.version.to_string(),
        pod: pod.clone(),
        annotations_source: source,
        decision: decision.clone(),
        protection: protection.clone(),
        added_at_ms: interlock_contract::time::now_ms(),
        add_us: 0,
    };
    state.add_us = micros(start.elapsed());
    for note in claim.iter().flat_map(|c| c.notes()) {
        call.log.info(&format!("pod {name}: {note}"));
    }
    let saved = store.save(&state).and_then(|()| match &claim {
        Some(c) => c.commit(),
        None => Ok(()),
    });
    if let Err(e) = saved {
        match (&protection, open) {
            // Nothing was done in the pod's netns: interlock's bookkeeping must not stop
            // a pod that needs no protection (CHECK then re-decides from the config).
            (Protection::NotNeeded, _) => call.log.warn(&format!(
                "pod {name}: writing attachment state failed (nothing to protect, ADD continues): {e}"
            )),
            (_, false) => {
                let _ = store.remove(&call.key());
                let left = claim.and_then(protect::Claim::abort);
                let f = Failure {
                    leftover_rules: left,
                    ..Failure::clean(Step::State, format!("writing attachment state: {e}"))
                };
                return Err(call
                    .err(f.code, format!("pod {name}: step state failed: {}", f.message))
                    .with_details(add_failure_details(&f, netns)));
            }
            (_, true) => {
                if let Some(c) = &claim {
                    let _ = c.commit();
                }
                call.log.error(&format!(
                    "pod {name}: writing attachment state failed (failurePolicy open, ADD continues): {e}"
                ))
            }
        }
    }
    let total = micros(start.elapsed());
    let what = match (&decision, &protection) {
        (Decision::Meshed { profile, .. }, Protection::Protected(p)) => format!(
            "meshed ({profile}), protected with {} ({}), spec {}, probe {}; decide {}, rules {}, probe {}",
            p.backend,
            p.backend_reason,
            &p.spec_hash[..12.min(p.spec_hash.len())],
            p.probe.len(),
            ms(decide_us),
            ms(p.timings.rules_us),
            ms(p.timings.probe_us),
        ),
        (_, Protection::Unprotected { step, .. }) => {
            format!("{}, UNPROTECTED (step {step} failed, failurePolicy open)", decision.label())
        }
        (Decision::Skip { reason } | Decision::NotMeshed { reason }, _) => {
            format!("{} ({reason})", decision.label())
        }
        _ => decision.label().to_string(),
    };
    call.log.info(&format!(
        "pod {name}: {what}; annotations from {source}; total {}",
        ms(total)
    ));
    let mut out = prev.convert(call.version).to_json().into_bytes();
    out.push(b'\n');
    Ok(out)
}

/// The `details` of a failed ADD (failurePolicy closed): what happens next, and whether
/// interlock's rules were left in the netns.
fn add_failure_details(f: &Failure, netns: &str) -> String {
    let closed = "failurePolicy is closed: the pod does not start until its traffic \
                  redirection is in place and proven (the runtime retries the ADD)";
    match &f.leftover_rules {
        None => format!("{closed}; no interlock rules were left in its network namespace"),
        Some(leftover) => format!(
            "{closed}; {leftover} in its network namespace {netns}: the CNI DEL that \
             follows a failed ADD retries removing them (every backend's rules)"
        ),
    }
}

fn cmd_del(call: &Call) -> Result<Vec<u8>, CniError> {
    let start = Instant::now();
    let store = StateStore::new(&call.config.state_dir);
    let key = call.key();
    let state = match store.load(&key) {
        Ok(s) => s,
        Err(e) => {
            call.log.error(&format!(
                "attachment state unreadable, removing every backend's rules: {e}"
            ));
            None
        }
    };
    let name = match &state {
        Some(s) => s.pod.display_name(),
        None => PodIdentity::from_cni(call.env.args.as_deref().unwrap_or(""), &Map::new())
            .map(|p| p.display_name())
            .unwrap_or_default(),
    };
    let netns = call.env.netns.as_deref().unwrap_or("");
    let undone = protect::release(
        &call.config.state_dir,
        &store,
        &key,
        state.as_ref(),
        netns,
        None,
    )
    .map_err(|f| {
        call.err(
            f.code,
            format!(
                "pod {name}: step {} failed: removing redirect rules: {}",
                f.step, f.message
            ),
        )
    })?;
    let existed = store.remove(&key).map_err(|e| {
        call.err(
            codes::IO_FAILURE,
            format!("pod {name}: step state failed: removing attachment state: {e}"),
        )
    })?;
    let rules = match undone {
        Undone::Nothing if netns.is_empty() => "no netns given, no rules to remove".to_string(),
        other => other.to_string(),
    };
    call.log.info(&format!(
        "pod {name}: {rules}; {}; total {}",
        if existed {
            "state removed"
        } else {
            "no state (already deleted or never added)"
        },
        ms(micros(start.elapsed()))
    ));
    Ok(Vec::new())
}

fn cmd_check(call: &Call) -> Result<Vec<u8>, CniError> {
    let start = Instant::now();
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
    let state = match store.load(&call.key()) {
        Ok(Some(state)) => state,
        Ok(None) => return Err(call.err(
            codes::UNKNOWN_CONTAINER,
            format!(
                "interlock-cni has no state for container {} interface {}: it was never added through interlock-cni",
                call.key().container_id,
                call.key().ifname
            ),
        )),
        Err(e) => return Err(call.err(codes::IO_FAILURE, format!("reading attachment state: {e}"))),
    };
    let name = state.pod.display_name();
    let netns = call.env.netns.as_deref().unwrap_or("");
    let verdict = match &state.protection {
        Protection::NotNeeded => format!("{}: nothing to verify", state.decision.label()),
        Protection::Protected(p) => {
            protect::check(p, netns).map_err(|f| {
                call.err(
                    f.code,
                    format!("pod {name}: step {} failed: {}", f.step, f.message),
                )
                .with_details("re-run ADD (or let the agent repair the pod) to re-apply the rules")
            })?;
            format!("rules verified exact ({})", p.backend)
        }
        Protection::Unprotected { step, reason } => {
            return Err(call.err(
                codes::VERIFY,
                format!(
                    "pod {name}: is meshed but was left WITHOUT redirection at ADD \
                     (failurePolicy open; step {step} failed: {reason})"
                ),
            ))
        }
    };
    call.log.info(&format!(
        "pod {name}: {verdict}; total {}",
        ms(micros(start.elapsed()))
    ));
    Ok(Vec::new())
}

fn cmd_gc(call: &Call) -> Result<Vec<u8>, CniError> {
    let start = Instant::now();
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
    // Leftover rules of stale attachments whose netns still exists are removed first
    // (best effort: a failure is logged, the state goes anyway).
    let keys = store
        .keys()
        .map_err(|e| call.err(codes::IO_FAILURE, format!("GC of attachment state: {e}")))?;
    for key in keys.iter().filter(|k| !valid.contains(k)) {
        if let Ok(Some(state)) = store.load(key) {
            if let Err(f) = protect::release(
                &call.config.state_dir,
                &store,
                key,
                Some(&state),
                &state.netns,
                Some(&valid),
            ) {
                call.log.error(&format!(
                    "GC: pod {}: removing leftover rules in {} failed: {}",
                    state.pod.display_name(),
                    state.netns,
                    f.message
                ));
            }
        }
    }
    // Temp files of atomic writes whose writer was killed (an ADD killed mid-write);
    // the agent sweeps them too.
    let swept = state::sweep_abandoned_temps(&[
        call.config.state_dir.clone(),
        store.dir().to_path_buf(),
        netns_state::NetnsStore::new(&call.config.state_dir)
            .dir()
            .to_path_buf(),
    ]);
    if !swept.is_empty() {
        call.log.info(&format!(
            "GC removed {} abandoned temp file(s) of killed writers",
            swept.len()
        ));
    }
    let removed = store
        .retain(&valid)
        .map_err(|e| call.err(codes::IO_FAILURE, format!("GC of attachment state: {e}")))?;
    call.log.info(&format!(
        "GC kept {} valid attachment(s), removed state of {}; total {}",
        valid.len(),
        removed.len(),
        ms(micros(start.elapsed()))
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
    status::check_status(&call.config, call.version.as_str())?;
    Ok(Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn add_failure_details_say_whether_rules_remain() {
        use interlock_redirect::backend::{BackendError, BackendKind};
        use interlock_redirect::ProtectError;
        let kind = BackendKind::IptablesNft;
        let apply = |cleanup: Option<&str>| ProtectError::Apply {
            netns: "/run/netns/ilpod".into(),
            backend: kind,
            source: BackendError::Failed {
                backend: kind,
                op: "apply",
                msg: "iptables-nft-restore failed".into(),
            },
            cleanup: cleanup.map(String::from),
        };
        let clean = add_failure_details(&Failure::from(apply(None)), "/run/netns/ilpod");
        assert!(
            clean.contains("no interlock rules were left") && !clean.contains("may remain"),
            "{clean}"
        );
        let f = Failure::from(apply(Some("iptables-nft-restore: exit 4")));
        assert_eq!((f.step, f.code), (Step::Apply, codes::APPLY));
        let dirty = add_failure_details(&f, "/run/netns/ilpod");
        assert!(
            !dirty.contains("no interlock rules were left")
                && dirty.contains("interlock's iptables-nft rules may remain")
                && dirty.contains("iptables-nft-restore: exit 4")
                && dirty.contains("/run/netns/ilpod")
                && dirty.contains("DEL")
                && dirty.contains("retries removing them"),
            "{dirty}"
        );
        // Failures before anything was applied leave nothing.
        let lookup = Failure::clean(Step::Lookup, "no agent");
        assert!(add_failure_details(&lookup, "/x").contains("no interlock rules were left"));
    }

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
            prop_assert_ne!(e.code, codes::INTERNAL, "internal error (a panic): {:?}", e);
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

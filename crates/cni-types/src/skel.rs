//! The plugin side of the protocol: read the `CNI_*` environment and the network config on
//! stdin, negotiate the version, check the environment the verb needs, hand the verb to a
//! [`Plugin`]'s method, and answer on stdout in the protocol — the result, the VERSION
//! answer, or an error object — with the exit code. A plugin implements its verbs and
//! nothing else (the shape of netavark's `src/plugin.rs`).
//!
//! [`run`] never panics through to the caller: a bug becomes the plugin's internal error.

use std::panic::{catch_unwind, AssertUnwindSafe};

use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::error::{
    CniError, DECODING_FAILURE, INCOMPATIBLE_VERSION, INVALID_ENVIRONMENT, INVALID_NETWORK_CONFIG,
};
use crate::result::CniResult;
use crate::verb::Command;
use crate::version::CniVersion;

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

    /// The answer for `e`: its JSON on stdout, exit code 1.
    pub fn error(e: &CniError) -> Outcome {
        Outcome {
            stdout: e.to_json().into_bytes(),
            exit_code: 1,
        }
    }
}

/// One parsed invocation: the verb, the negotiated version, the environment and the
/// network config, as every verb sees it.
#[derive(Debug)]
pub struct Invocation<'a> {
    /// The environment.
    pub env: &'a CniEnv,
    /// The verb.
    pub command: Command,
    /// The config's `cniVersion` (every answer is in it).
    pub version: CniVersion,
    /// The network config from stdin (the plugin's entry, `name`, `runtimeConfig`, …),
    /// without `prevResult`.
    pub conf: Map<String, Value>,
    /// `prevResult`, as its JSON text ([`Invocation::prev_result`] reads it).
    pub prev_result: Option<Box<RawValue>>,
}

impl Invocation<'_> {
    /// An error in this invocation's version.
    pub fn err(&self, code: u32, msg: impl Into<String>) -> CniError {
        CniError::new(self.version.as_str(), code, msg)
    }

    /// `CNI_CONTAINERID` (empty when absent).
    pub fn container_id(&self) -> &str {
        self.env.container_id.as_deref().unwrap_or("")
    }

    /// `CNI_NETNS` (empty when absent, as on containerd's later DELs).
    pub fn netns(&self) -> &str {
        self.env.netns.as_deref().unwrap_or("")
    }

    /// `CNI_IFNAME` (empty when absent).
    pub fn ifname(&self) -> &str {
        self.env.ifname.as_deref().unwrap_or("")
    }

    /// `CNI_ARGS` (empty when absent).
    pub fn args(&self) -> &str {
        self.env.args.as_deref().unwrap_or("")
    }

    /// The network's `name`.
    pub fn network(&self) -> &str {
        self.conf.get("name").and_then(Value::as_str).unwrap_or("")
    }

    /// `prevResult`, parsed and in this invocation's version; `Ok(None)` when absent.
    pub fn prev_result(&self) -> Result<Option<CniResult>, CniError> {
        let Some(prev) = self
            .prev_result
            .as_deref()
            .filter(|v| v.get().trim() != "null")
        else {
            return Ok(None);
        };
        CniResult::from_raw(prev, Some(self.version))
            .map(Some)
            .map_err(|e| self.err(INVALID_NETWORK_CONFIG, format!("prevResult: {e}")))
    }

    /// The variables the verb needs (ADD and CHECK: container ID, netns, ifname; DEL:
    /// container ID and ifname), or error 4 naming the missing ones.
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
                INVALID_ENVIRONMENT,
                format!(
                    "required environment variables missing for {}: {}",
                    self.command,
                    missing.join(", ")
                ),
            ))
        }
    }

    /// The version gate of the verbs newer than 0.3: CHECK needs 0.4.0, GC and STATUS 1.1.0.
    fn allowed(&self) -> Result<(), CniError> {
        let (ok, needs) = match self.command {
            Command::Check => (self.version.supports_check(), "0.4.0 or later"),
            Command::Gc | Command::Status => (self.version.supports_gc_and_status(), "1.1.0"),
            _ => (true, ""),
        };
        if ok {
            return Ok(());
        }
        Err(self.err(
            INCOMPATIBLE_VERSION,
            format!(
                "config version {} does not allow {} (needs {needs})",
                self.version, self.command
            ),
        ))
    }
}

/// A CNI plugin: its verbs, each given the parsed [`Invocation`] and the plugin's own
/// per-call [`Plugin::Context`]. Verbs answer with a `CniError` on failure; [`run`] prints
/// it.
pub trait Plugin {
    /// What every verb needs besides the invocation (the plugin's parsed entry, its log).
    type Context;

    /// The binary's name, for messages (`interlock-cni`).
    fn name(&self) -> &str;

    /// Builds the context from the invocation (its config). An error (e.g. an invalid
    /// field, code 7) ends the call before the environment is checked.
    fn context(&self, inv: &Invocation) -> Result<Self::Context, CniError>;

    /// ADD: the result to print (converted to the invocation's version by [`run`]).
    fn add(&self, inv: &Invocation, ctx: &Self::Context) -> Result<CniResult, CniError>;

    /// DEL.
    fn del(&self, inv: &Invocation, ctx: &Self::Context) -> Result<(), CniError>;

    /// CHECK (only at 0.4.0 or later).
    fn check(&self, inv: &Invocation, ctx: &Self::Context) -> Result<(), CniError>;

    /// GC (only at 1.1.0).
    fn gc(&self, inv: &Invocation, ctx: &Self::Context) -> Result<(), CniError>;

    /// STATUS (only at 1.1.0).
    fn status(&self, inv: &Invocation, ctx: &Self::Context) -> Result<(), CniError>;

    /// Called with the error a verb returned, before it is printed (to log it).
    fn failed(&self, _inv: &Invocation, _ctx: &Self::Context, _e: &CniError) {}

    /// The error printed for a bug (a panic in a verb).
    fn internal_error(&self) -> CniError;

    /// The plugin's build, answered to VERSION as `interlockVersion` (a `const`: VERSION
    /// stays as fast as the bare protocol answer).
    fn build_version(&self) -> Option<&'static str> {
        None
    }
}

/// The VERSION answer, with the plugin's build when it has one (runtimes ignore the
/// extra field; `interlock check` reads it).
pub fn version_info(build: Option<&str>) -> Value {
    let mut v = serde_json::json!({
        "cniVersion": CniVersion::LATEST.as_str(),
        "supportedVersions": CniVersion::all_strings(),
    });
    if let (Some(b), Some(m)) = (build, v.as_object_mut()) {
        m.insert("interlockVersion".into(), Value::String(b.into()));
    }
    v
}

fn json_line(v: &Value) -> Vec<u8> {
    let mut s = v.to_string().into_bytes();
    s.push(b'\n');
    s
}

/// Runs one invocation of `plugin`. Never panics through to the caller: a bug becomes
/// [`Plugin::internal_error`].
pub fn run<P: Plugin>(plugin: &P, env: &CniEnv, stdin: &[u8]) -> Outcome {
    match catch_unwind(AssertUnwindSafe(|| run_inner(plugin, env, stdin))) {
        Ok(Ok(stdout)) => Outcome::ok(stdout),
        Ok(Err(e)) => Outcome::error(&e),
        Err(_) => Outcome::error(&plugin.internal_error()),
    }
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

/// The network config as read from stdin: every top-level key but `prevResult` as a JSON
/// value, `prevResult` as its text, read into its types only when a verb asks for it
/// ([`Invocation::prev_result`]). Building the generic value of the primary plugin's
/// result, then reading the typed result out of it, was most of parsing the config on
/// every ADD. A duplicated key keeps its last value, as the generic parse does.
struct StdinConf {
    conf: Map<String, Value>,
    prev_result: Option<Box<RawValue>>,
}

impl<'de> Deserialize<'de> for StdinConf {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> Visitor<'de> for Fields {
            type Value = StdinConf;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<StdinConf, A::Error> {
                let mut conf = Map::new();
                let mut prev_result = None;
                while let Some(key) = map.next_key::<String>()? {
                    if key == "prevResult" {
                        prev_result = Some(map.next_value::<Box<RawValue>>()?);
                    } else {
                        conf.insert(key, map.next_value::<Value>()?);
                    }
                }
                Ok(StdinConf { conf, prev_result })
            }
        }
        deserializer.deserialize_map(Fields)
    }
}

fn run_inner<P: Plugin>(plugin: &P, env: &CniEnv, stdin: &[u8]) -> Result<Vec<u8>, CniError> {
    let latest = CniVersion::LATEST.as_str();
    let name = plugin.name();
    let command: Command = match env.command.as_deref() {
        None | Some("") => {
            return Err(
                CniError::new(latest, INVALID_ENVIRONMENT, "CNI_COMMAND is not set").with_details(
                    format!("{name} is a CNI plugin: a container runtime runs it with CNI_COMMAND=ADD|DEL|CHECK|GC|STATUS|VERSION"),
                ),
            )
        }
        Some(c) => c
            .parse()
            .map_err(|e: String| CniError::new(latest, INVALID_ENVIRONMENT, e))?,
    };
    if command == Command::Version {
        return Ok(json_line(&version_info(plugin.build_version())));
    }
    let (conf, prev_result) = match serde_json::from_slice::<StdinConf>(stdin) {
        Ok(c) => (c.conf, c.prev_result),
        // Not an object (or not JSON): the generic parse names what it found.
        Err(_) => match serde_json::from_slice::<Value>(stdin) {
            Ok(Value::Object(mut m)) => {
                let prev = m
                    .remove("prevResult")
                    .and_then(|v| serde_json::value::to_raw_value(&v).ok());
                (m, prev)
            }
            Ok(other) => {
                return Err(CniError::new(
                    latest,
                    DECODING_FAILURE,
                    format!(
                    "failed to decode network config from stdin: expected a JSON object, found {}",
                    short(&other.to_string())
                ),
                ))
            }
            Err(e) => {
                return Err(CniError::new(
                    latest,
                    DECODING_FAILURE,
                    format!("failed to decode network config from stdin: {e}"),
                ))
            }
        },
    };
    // Only an error names the supported versions: build the list only then.
    let supported = || CniVersion::all_strings().join(", ");
    let version = match conf.get("cniVersion") {
        None => {
            return Err(CniError::new(
                latest,
                INCOMPATIBLE_VERSION,
                format!(
                    "incompatible CNI versions: config has no cniVersion (meaning 0.1.0); {name} supports {}",
                    supported()
                ),
            ))
        }
        Some(Value::String(s)) => s.parse::<CniVersion>().map_err(|_| {
            CniError::new(
                latest,
                INCOMPATIBLE_VERSION,
                format!(
                    "incompatible CNI versions: config is {s:?}, {name} supports {}",
                    supported()
                ),
            )
        })?,
        Some(other) => {
            return Err(CniError::new(
                latest,
                INVALID_NETWORK_CONFIG,
                format!(
                    "cniVersion: expected a string, found {}",
                    short(&other.to_string())
                ),
            ))
        }
    };
    let inv = Invocation {
        env,
        command,
        version,
        conf,
        prev_result,
    };
    let ctx = plugin.context(&inv)?;
    inv.require_env()?;
    let result = inv.allowed().and_then(|()| match command {
        Command::Add => plugin
            .add(&inv, &ctx)
            .map(|r| r.convert(version).to_json().into_bytes())
            .map(|mut out| {
                out.push(b'\n');
                out
            }),
        Command::Del => plugin.del(&inv, &ctx).map(|()| Vec::new()),
        Command::Check => plugin.check(&inv, &ctx).map(|()| Vec::new()),
        Command::Gc => plugin.gc(&inv, &ctx).map(|()| Vec::new()),
        Command::Status => plugin.status(&inv, &ctx).map(|()| Vec::new()),
        Command::Version => Ok(json_line(&version_info(plugin.build_version()))),
    });
    if let Err(e) = &result {
        plugin.failed(&inv, &ctx, e);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plugin whose verbs record that they ran and fail on demand.
    struct Probe;

    impl Plugin for Probe {
        type Context = ();
        fn name(&self) -> &str {
            "probe-cni"
        }
        fn context(&self, inv: &Invocation) -> Result<(), CniError> {
            match inv.conf.get("bad") {
                Some(_) => Err(inv.err(INVALID_NETWORK_CONFIG, "bad: refused")),
                None => Ok(()),
            }
        }
        fn add(&self, inv: &Invocation, _: &()) -> Result<CniResult, CniError> {
            Ok(inv
                .prev_result()?
                .unwrap_or_else(|| CniResult::empty(inv.version)))
        }
        fn del(&self, _: &Invocation, _: &()) -> Result<(), CniError> {
            Ok(())
        }
        fn check(&self, _: &Invocation, _: &()) -> Result<(), CniError> {
            Ok(())
        }
        fn gc(&self, _: &Invocation, _: &()) -> Result<(), CniError> {
            Ok(())
        }
        fn status(&self, _: &Invocation, _: &()) -> Result<(), CniError> {
            panic!("a bug")
        }
        fn internal_error(&self) -> CniError {
            CniError::new("1.1.0", 100, "probe-cni internal error")
        }
    }

    fn env(command: &str) -> CniEnv {
        CniEnv {
            command: Some(command.into()),
            container_id: Some("c".into()),
            netns: Some("/var/run/netns/x".into()),
            ifname: Some("eth0".into()),
            ..CniEnv::default()
        }
    }

    fn code(o: &Outcome) -> u64 {
        assert_eq!(o.exit_code, 1, "{}", String::from_utf8_lossy(&o.stdout));
        serde_json::from_slice::<Value>(&o.stdout).unwrap()["code"]
            .as_u64()
            .unwrap()
    }

    #[test]
    fn prev_result_is_read_from_its_text() {
        let add = |conf: &str| run(&Probe, &env("ADD"), conf.as_bytes());
        let answer = |o: Outcome| -> Value {
            assert_eq!(o.exit_code, 0, "{}", String::from_utf8_lossy(&o.stdout));
            serde_json::from_slice(&o.stdout).unwrap()
        };
        let prev = r#"{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/var/run/netns/x"}],"ips":[{"address":"10.1.2.3/24","gateway":"10.1.2.1","interface":0}]}"#;
        let with = |p: &str| format!(r#"{{"cniVersion":"1.0.0","name":"n","prevResult":{p}}}"#);
        // Read into its types; the probe plugin answers it.
        let o = answer(add(&with(prev)));
        assert_eq!(o["ips"][0]["address"], "10.1.2.3/24");
        assert_eq!(o["interfaces"][0]["sandbox"], "/var/run/netns/x");
        // null, or absent: none (the probe plugin answers an empty result).
        for c in [
            with("null"),
            r#"{"cniVersion":"1.0.0","name":"n"}"#.to_string(),
        ] {
            let o = answer(add(&c));
            assert!(o["ips"].is_null() && o["interfaces"].is_null(), "{o}");
        }
        // Without a cniVersion of its own: read in the config's version.
        let o = answer(add(&with(
            r#"{"ips":[{"address":"10.9.9.9/24","interface":0}],"interfaces":[{"name":"eth0"}]}"#,
        )));
        assert_eq!(o["ips"][0]["address"], "10.9.9.9/24");
        // A key given twice keeps its last value, as the generic parse does.
        let twice = format!(
            r#"{{"cniVersion":"1.0.0","name":"n","prevResult":{{"cniVersion":"1.0.0"}},"prevResult":{prev}}}"#
        );
        assert_eq!(answer(add(&twice))["ips"][0]["address"], "10.1.2.3/24");
        // Not a result: error 7, naming prevResult.
        let o = add(&with(r#"{"cniVersion":"1.0.0","ips":"x"}"#));
        assert_eq!(code(&o), 7);
        assert!(String::from_utf8_lossy(&o.stdout).contains("prevResult"));
    }

    #[test]
    fn negotiates_checks_and_dispatches() {
        let conf = |v: &str| format!(r#"{{"cniVersion":"{v}","name":"n","type":"probe-cni"}}"#);
        // ADD answers the result in the config's version.
        let o = run(&Probe, &env("ADD"), conf("0.4.0").as_bytes());
        assert_eq!(o.exit_code, 0);
        assert!(String::from_utf8_lossy(&o.stdout).contains("\"cniVersion\":\"0.4.0\""));
        // VERSION needs no stdin; an unknown verb, garbage and unknown versions are refused.
        let o = run(&Probe, &env("VERSION"), b"");
        assert!(String::from_utf8_lossy(&o.stdout).contains("supportedVersions"));
        assert_eq!(code(&run(&Probe, &env("NOPE"), b"{}")), 4);
        assert_eq!(code(&run(&Probe, &env("ADD"), b"[1]")), 6);
        let o = run(&Probe, &env("ADD"), conf("9.9.9").as_bytes());
        assert_eq!(code(&o), 1);
        assert!(String::from_utf8_lossy(&o.stdout).contains("probe-cni supports"));
        // The plugin's context can refuse (its config) before the environment is checked.
        let bad = r#"{"cniVersion":"1.0.0","bad":1}"#;
        assert_eq!(code(&run(&Probe, &CniEnv::default(), bad.as_bytes())), 4);
        assert_eq!(code(&run(&Probe, &env("ADD"), bad.as_bytes())), 7);
        // Missing environment, named.
        let mut e = env("ADD");
        e.netns = None;
        let o = run(&Probe, &e, conf("1.0.0").as_bytes());
        assert_eq!(code(&o), 4);
        assert!(String::from_utf8_lossy(&o.stdout).contains("CNI_NETNS"));
        // Version gates.
        assert_eq!(
            code(&run(&Probe, &env("CHECK"), conf("0.3.1").as_bytes())),
            1
        );
        assert_eq!(code(&run(&Probe, &env("GC"), conf("1.0.0").as_bytes())), 1);
        assert_eq!(
            run(&Probe, &env("GC"), conf("1.1.0").as_bytes()).exit_code,
            0
        );
        // A panic in a verb is the internal error, not a crash.
        assert_eq!(
            code(&run(&Probe, &env("STATUS"), conf("1.1.0").as_bytes())),
            100
        );
    }
}

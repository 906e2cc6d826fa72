//! `interlock validate`: the init-container check that proves, from inside the pod's
//! network namespace, that its outbound traffic is redirected to the proxy — the
//! plugin's own probe ([`interlock_redirect::probe::probe`]) run by the pod itself. A pod
//! whose redirection is missing then fails to start, even on a node where no agent runs.
//!
//! The spec comes from the pod's annotations (the downward API file, or `--annotation`),
//! decided as the plugin decides. The init container must run as a UID the rules capture
//! (root, or any UID but the proxy's) and before the proxy starts (the probe listens on
//! the proxy's outbound port). Nothing is changed in the netns.
//!
//! Exit codes (documented in `--help`): 0 redirection proven (or the pod is not meshed),
//! [`NOT_PROTECTED`] a connection was not redirected, [`COULD_NOT_VALIDATE`] the proof
//! could not be made (both fail the pod: fail closed), 64 usage error.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use interlock_contract::config::PluginConfig;
use interlock_redirect::decision::Decision;
use interlock_redirect::probe::{self, ProbeError};

/// The exit code when the pod's traffic is not redirected.
pub const NOT_PROTECTED: u8 = 2;
/// The exit code when the proof could not be made (annotations unreadable, the proxy
/// port taken, …).
pub const COULD_NOT_VALIDATE: u8 = 3;

/// The downward API file the manifests' init container mounts the pod's annotations at.
pub const DEFAULT_ANNOTATIONS_FILE: &str = "/etc/podinfo/annotations";

/// `interlock validate` flags.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// The pod's annotations as the downward API writes them (`key="value"` lines).
    #[arg(long, env = "INTERLOCK_ANNOTATIONS_FILE", default_value = DEFAULT_ANNOTATIONS_FILE)]
    annotations_file: PathBuf,
    /// A pod annotation, `key=value` (repeatable; with any, the file is not read).
    #[arg(long = "annotation", value_parser = crate::inspect::parse_annotation)]
    annotations: Vec<(String, String)>,
    /// The pod's namespace (excluded namespaces are not meshed) [the downward API's
    /// POD_NAMESPACE].
    #[arg(long, env = "POD_NAMESPACE", default_value = "")]
    namespace: String,
    /// As for `agent`: the interlock-cni settings (profiles, excluded namespaces).
    #[arg(long, env = "INTERLOCK_PLUGIN_CONFIG")]
    plugin_config: Option<PathBuf>,
    /// How long the probe waits for its connection to land on the proxy port (ms).
    #[arg(long, default_value_t = 1000)]
    timeout_ms: u64,
    /// Output format: a line for people, or one JSON document (schemaVersion 1, kind
    /// `Validation`) on stdout whatever the outcome.
    #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
    output: crate::check::Output,
}

/// The document `validate -o json` prints.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct ValidationDoc<'a> {
    schema_version: u32,
    kind: &'static str,
    /// `protected`, `not-meshed`, `not-protected` or `could-not-validate`.
    verdict: &'static str,
    exit_code: u8,
    /// What the text output prints after its verdict words.
    message: &'a str,
}

/// What `validate` found; it decides the exit code and the words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Redirection proven by a connection.
    Protected,
    /// The pod is not meshed: nothing to validate.
    NotMeshed,
    /// Traffic escaped the proxy (or the rules are not what the pod needs).
    NotProtected,
    /// No proof could be made either way.
    CouldNotValidate,
}

impl Verdict {
    fn code(self) -> u8 {
        match self {
            Verdict::Protected | Verdict::NotMeshed => 0,
            Verdict::NotProtected => NOT_PROTECTED,
            Verdict::CouldNotValidate => COULD_NOT_VALIDATE,
        }
    }

    /// The JSON document's `verdict`.
    fn key(self) -> &'static str {
        match self {
            Verdict::Protected => "protected",
            Verdict::NotMeshed => "not-meshed",
            Verdict::NotProtected => "not-protected",
            Verdict::CouldNotValidate => "could-not-validate",
        }
    }

    /// The words the text output starts with.
    fn words(self) -> &'static str {
        match self {
            Verdict::Protected => "PROTECTED",
            Verdict::NotMeshed => "not meshed",
            Verdict::NotProtected => "NOT PROTECTED",
            Verdict::CouldNotValidate => "COULD NOT VALIDATE",
        }
    }
}

/// Parses the downward API's annotations file: one `key="value"` per line, the value
/// quoted as Go's `strconv.Quote` does. The error names the line.
pub fn parse_downward(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |why: &str| format!("line {}: {why}: {line:?}", i + 1);
        let (k, v) = line.split_once('=').ok_or_else(|| bad("no '='"))?;
        out.insert(k.to_string(), unquote(v).map_err(|e| bad(&e))?);
    }
    Ok(out)
}

/// Go's `strconv.Unquote` for a double-quoted string.
fn unquote(q: &str) -> Result<String, String> {
    let inner = q
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .ok_or("the value is not double-quoted")?;
    let mut out = String::with_capacity(inner.len());
    let mut bytes: Vec<u8> = Vec::new();
    let mut chars = inner.chars();
    let hex = |chars: &mut std::str::Chars<'_>, n: usize| -> Result<u32, String> {
        let s: String = chars.by_ref().take(n).collect();
        if s.len() != n {
            return Err("a short escape".into());
        }
        u32::from_str_radix(&s, 16).map_err(|_| format!("a bad escape \\{s}"))
    };
    let flush = |bytes: &mut Vec<u8>, out: &mut String| -> Result<(), String> {
        if !bytes.is_empty() {
            out.push_str(std::str::from_utf8(bytes).map_err(|_| "escaped bytes are not UTF-8")?);
            bytes.clear();
        }
        Ok(())
    };
    while let Some(c) = chars.next() {
        if c != '\\' {
            flush(&mut bytes, &mut out)?;
            out.push(c);
            continue;
        }
        let e = chars.next().ok_or("a trailing backslash")?;
        if e == 'x' {
            bytes.push(hex(&mut chars, 2)? as u8);
            continue;
        }
        flush(&mut bytes, &mut out)?;
        out.push(match e {
            'n' => '\n',
            't' => '\t',
            'r' => '\r',
            'a' => '\u{7}',
            'b' => '\u{8}',
            'f' => '\u{c}',
            'v' => '\u{b}',
            '\\' => '\\',
            '"' => '"',
            'u' => char::from_u32(hex(&mut chars, 4)?).ok_or("a bad \\u escape")?,
            'U' => char::from_u32(hex(&mut chars, 8)?).ok_or("a bad \\U escape")?,
            other => return Err(format!("an unknown escape \\{other}")),
        });
    }
    flush(&mut bytes, &mut out)?;
    Ok(out)
}

/// What a probe failure means: the pod's traffic escaped ([`NOT_PROTECTED`]), or the
/// proof could not be made ([`COULD_NOT_VALIDATE`]).
pub fn code_of(e: &ProbeError) -> u8 {
    match e {
        ProbeError::NotRedirected { .. }
        | ProbeError::WrongOriginalDst { .. }
        | ProbeError::NotProgrammed { .. }
        | ProbeError::UnexpectedRoute { .. } => NOT_PROTECTED,
        _ => COULD_NOT_VALIDATE,
    }
}

fn annotations(a: &ValidateArgs) -> Result<BTreeMap<String, String>, String> {
    if !a.annotations.is_empty() {
        return Ok(a.annotations.iter().cloned().collect());
    }
    let text = read_small(&a.annotations_file).map_err(|e| {
        format!(
            "cannot read the pod's annotations from {}: {e} (mount them with the downward API, or pass --annotation)",
            a.annotations_file.display()
        )
    })?;
    parse_downward(&text).map_err(|e| format!("{}: {e}", a.annotations_file.display()))
}

/// Reads at most 1 MiB (the API's limit on a pod's annotations is 256 KiB), following
/// symlinks: the downward API's file is one (`..data/annotations`).
fn read_small(p: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(p)?
        .take(1024 * 1024)
        .read_to_string(&mut text)?;
    Ok(text)
}

/// The facts of a pod that runs `profile`'s proxy with its mesh's defaults.
fn running_proxy(profile: interlock_redirect::ProfileName) -> interlock_redirect::PodFacts {
    use interlock_contract::pod::ContainerFacts;
    use interlock_redirect::ProfileName;
    let proxy = match profile {
        ProfileName::Istio => "istio-proxy",
        ProfileName::Linkerd => "linkerd-proxy",
        ProfileName::Consul | ProfileName::Generic => "",
    };
    interlock_redirect::PodFacts {
        labels: Default::default(),
        containers: vec![ContainerFacts::named(proxy, false)],
    }
}

/// Runs `interlock validate` in the calling process's network namespace (the pod's).
pub fn run(a: ValidateArgs) -> anyhow::Result<std::process::ExitCode> {
    let (verdict, message) = validate(&a);
    let code = verdict.code();
    match a.output {
        crate::check::Output::Json => {
            let doc = ValidationDoc {
                schema_version: 1,
                kind: "Validation",
                verdict: verdict.key(),
                exit_code: code,
                message: &message,
            };
            println!("{}", serde_json::to_string_pretty(&doc)?);
        }
        crate::check::Output::Text => {
            let line = format!("interlock validate: {}: {message}", verdict.words());
            if code == 0 {
                println!("{line}")
            } else {
                eprintln!("{line}")
            }
        }
    }
    Ok(std::process::ExitCode::from(code))
}

fn validate(a: &ValidateArgs) -> (Verdict, String) {
    let plugin = match &a.plugin_config {
        Some(p) => {
            match interlock_agent::load_plugin_config(p)
                .map_err(|e| e.to_string())
                .and_then(|m| PluginConfig::from_map(&m).map_err(|e| e.to_string()))
            {
                Ok(c) => c,
                Err(e) => return (Verdict::CouldNotValidate, e.to_string()),
            }
        }
        None => PluginConfig::default(),
    };
    let annotations = match annotations(a) {
        Ok(x) => x,
        Err(e) => return (Verdict::CouldNotValidate, e.to_string()),
    };
    let decide = |facts| {
        interlock_redirect::decision::decide(
            &plugin,
            &a.namespace,
            "this pod",
            Some(&annotations),
            facts,
        )
    };
    // Run inside the pod, the check cannot read its spec. What the profile takes from it
    // (the proxy's UID and GID, DNS) does not enter the proof, which connects as this
    // container's own UID: the pod is taken to run its mesh's proxy.
    let decision = match decide(None) {
        Decision::NeedsPodSpec { profile, .. } => decide(Some(&running_proxy(profile))),
        other => other,
    };
    let spec = match decision {
        Decision::Meshed { spec, .. } => *spec,
        Decision::NotMeshed { reason } | Decision::Skip { reason } => {
            return (Verdict::NotMeshed, format!("{reason}; nothing to validate"))
        }
        Decision::Undecided { reason }
        | Decision::Invalid { reason }
        | Decision::NeedsPodSpec { reason, .. } => return (Verdict::CouldNotValidate, reason),
    };
    match probe::probe(&spec, &[], Duration::from_millis(a.timeout_ms)) {
        // No family could send anything: the proof shows nothing about the rules (this
        // check never reads them), so it cannot vouch for the pod.
        Ok(report) if !report.shows_redirection() => (
            Verdict::CouldNotValidate,
            format!(
                "nothing routable to prove: {}; no connection can leave \
                 this netns now, so no connection shows whether its traffic would reach \
                 the proxy once it can (is the pod's network set up? `interlock check node`)",
                report.lines().join("; ")
            ),
        ),
        Ok(report) => (
            Verdict::Protected,
            format!(
                "outbound redirection to port {} proven: {}",
                spec.outbound.proxy_port,
                report.lines().join("; ")
            ),
        ),
        Err(e) => {
            let verdict = if code_of(&e) == NOT_PROTECTED {
                Verdict::NotProtected
            } else {
                Verdict::CouldNotValidate
            };
            (
                verdict,
                format!("{e}; this pod's traffic may bypass the proxy, so it must not start (is interlock installed on this node? `interlock check node`)"),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn downward_api_files_parse_like_go_quotes() {
        let a = parse_downward(
            "sidecar.istio.io/status=\"{\\\"initContainers\\\":[\\\"istio-init\\\"]}\"\nkubernetes.io/config.seen=\"2026-11-24T09:00:00.000Z\"\nx=\"caf\\u00e9 \\xc3\\xa9\\n\"\n\n",
        )
        .unwrap();
        assert_eq!(
            a["sidecar.istio.io/status"],
            "{\"initContainers\":[\"istio-init\"]}"
        );
        assert_eq!(a["x"], "café é\n");
        for bad in ["k=v", "k=\"v", "novalue", "k=\"\\q\"", "k=\"\\xzz\""] {
            let e = parse_downward(bad).unwrap_err();
            assert!(e.contains("line 1"), "{bad}: {e}");
        }
    }

    #[test]
    fn escaped_traffic_and_failed_proofs_have_distinct_codes() {
        let target: std::net::SocketAddr = "10.0.0.1:9".parse().unwrap();
        let not = ProbeError::NotRedirected {
            target,
            port: 15001,
            detail: "timed out".into(),
        };
        assert_eq!(code_of(&not), NOT_PROTECTED);
        let bind = ProbeError::Bind {
            addr: "127.0.0.1:15001".parse().unwrap(),
            source: std::io::Error::from(std::io::ErrorKind::AddrInUse),
        };
        assert_eq!(code_of(&bind), COULD_NOT_VALIDATE);
        assert_ne!(NOT_PROTECTED, COULD_NOT_VALIDATE);
        assert!(![0, 1, 64].contains(&NOT_PROTECTED));
    }
}

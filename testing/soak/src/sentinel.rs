//! Sentinels: meshed pods the soak starts unprotected on purpose, to check what the
//! agent tells the cluster about them through the fake Kubernetes API.
//!
//! With no agent running, a config without interlock is put ahead of every other one;
//! the sentinel's Pod goes into the API first (as the kubelet's pods are there before
//! their sandbox) and its sandbox is run through that chain. The kit's capture check
//! proves it started unprotected (a connection from inside reaches the host unredirected);
//! one that did not (the runtime had not loaded the config yet) is removed and another
//! is tried. The config then goes, a new agent starts, and the API must show within
//! [`PATIENCE`] what the repair policy promises ([`expected`]): under `repair` a
//! `Repaired` Event, under `report` an `Unprotected` Event and the
//! [`LABEL_UNPROTECTED`] label.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use interlock_testkit_node::node::{Capture, Node, Sandbox};
use serde::Serialize;
use serde_json::Value;

use crate::checker::{Clock, Meshed, Stopping};
use crate::ledger::Ms;

/// The label the agent puts on an unprotected pod it reports (the documented name,
/// written here rather than taken from interlock).
pub const LABEL_UNPROTECTED: &str = "interlock.dev/unprotected";
/// How long the agent may take, once started, to publish what the policy promises.
pub const PATIENCE: Duration = Duration::from_secs(20);
/// The same in guard mode, whose audit probes a sandbox whose proxy never listens only
/// 30 s after it was created (the documented grace, docs/guard-mode.md): that, and
/// [`PATIENCE`] after it.
pub const GUARD_PATIENCE: Duration = Duration::from_secs(50);
/// Sandboxes tried before the step gives up on starting one unprotected.
const ATTEMPTS: u32 = 5;

/// What the API must show about a sentinel under the repair policy `policy`: the
/// Event's reason, and whether the `unprotected` label must be on the pod.
pub fn expected(policy: &str) -> Option<(&'static str, bool)> {
    match policy {
        "repair" => Some(("Repaired", false)),
        "report" => Some(("Unprotected", true)),
        "restart" => Some(("Restarted", false)),
        "delete" => Some(("Deleted", false)),
        "evict" => Some(("Evicted", false)),
        _ => None,
    }
}

/// What became of one sentinel.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SentinelOutcome {
    /// Its pod, `namespace/name`.
    pub pod: String,
    /// Its sandbox.
    pub sandbox: String,
    /// True when the capture check proved it started unprotected.
    pub started_unprotected: bool,
    /// Sandboxes run to get one that started unprotected (the others removed).
    pub attempts: u32,
    /// The reasons of the Events about its pod, oldest first.
    pub events: Vec<String>,
    /// Whether its pod carried the `unprotected` label when last looked at.
    pub labelled: bool,
    /// Time from the agent's start until the API showed what the policy promises.
    pub reported_after_ms: Option<Ms>,
    /// What the API should have shown and did not, in words.
    pub missing: Option<String>,
}

/// A name that sorts ahead of every config in `conf_dir` (the runtime loads the first).
pub fn ahead_name(conf_dir: &Path) -> Result<String, String> {
    let name = "-sentinel.conflist".to_string();
    let first = fs::read_dir(conf_dir)
        .map_err(|e| format!("reading {}: {e}", conf_dir.display()))?
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| !n.starts_with('.'))
        .min();
    match first {
        Some(f) if f <= name => Err(format!(
            "{f} sorts ahead of {name}: no name to put a config ahead of it"
        )),
        _ => Ok(name),
    }
}

/// Starts a meshed sandbox (pod `tag…`) through a chain without interlock; the caller
/// makes sure no agent runs meanwhile. The config ahead (a copy of `primary`) is removed
/// again before returning, also on failure. Sandboxes that still started protected are
/// marked in `stopping` and removed. Returns the sentinel and the sandboxes tried.
pub fn start_unprotected(
    node: &Node,
    conf_dir: &Path,
    primary: &Value,
    tag: &str,
    stopping: &Stopping,
    clock: &Clock,
) -> Result<(Sandbox, u32), String> {
    start_unprotected_as(
        node,
        conf_dir,
        primary,
        tag,
        &Meshed::interlock(),
        stopping,
        clock,
    )
}

/// [`start_unprotected`] for a pod meshed by `meshed`'s annotations (guard mode: the
/// mesh's own).
pub fn start_unprotected_as(
    node: &Node,
    conf_dir: &Path,
    primary: &Value,
    tag: &str,
    meshed: &Meshed,
    stopping: &Stopping,
    clock: &Clock,
) -> Result<(Sandbox, u32), String> {
    let name = ahead_name(conf_dir)?;
    let path = conf_dir.join(&name);
    let tmp = conf_dir.join(format!(".{name}.tmp"));
    fs::write(&tmp, serde_json::to_vec_pretty(primary).unwrap_or_default())
        .and_then(|()| fs::rename(&tmp, &path))
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    let started = (|| {
        let mut tried = Vec::new();
        for attempt in 1..=ATTEMPTS {
            // The runtime reloads its config dir on a change; give it a moment.
            std::thread::sleep(Duration::from_millis(100 * u64::from(attempt)));
            let mut config = node.pod_config(&format!("{tag}-{attempt}"), false);
            for (k, v) in &meshed.0 {
                config = config.annotation(k, v);
            }
            let sb = node.run_config(config)?;
            match node.capture(&sb) {
                Capture::NotRedirected => return Ok((sb, attempt)),
                other => {
                    tried.push(format!("{}: {other:?}", sb.name));
                    stopping.mark(&sb.id, clock.now_ms());
                    node.remove_pod(&sb)
                        .map_err(|e| format!("removing {}: {e}", sb.name))?;
                }
            }
        }
        Err(format!(
            "no sandbox started unprotected with {name} ahead of the others: {}",
            tried.join("; ")
        ))
    })();
    let removed = fs::remove_file(&path).map_err(|e| format!("removing {}: {e}", path.display()));
    let started = started?;
    removed?;
    Ok(started)
}

/// Watches the API until it shows what `policy` promises about `sentinel` (an Event,
/// and under `report` the label), for at most `patience` from `agent_started`.
pub fn await_report(
    node: &Node,
    sentinel: &Sandbox,
    attempts: u32,
    policy: &str,
    agent_started: Instant,
    patience: Duration,
) -> SentinelOutcome {
    let mut out = SentinelOutcome {
        pod: format!("{}/{}", sentinel.namespace, sentinel.name),
        sandbox: sentinel.id.clone(),
        started_unprotected: true,
        attempts,
        ..SentinelOutcome::default()
    };
    let Some((reason, label)) = expected(policy) else {
        out.missing = Some(format!("no expectation for repair policy {policy:?}"));
        return out;
    };
    let deadline = agent_started + patience;
    loop {
        out.events = node
            .pod_events(sentinel)
            .into_iter()
            .map(|(r, _)| r)
            .collect();
        out.labelled = node
            .pod_object(sentinel)
            .is_some_and(|p| p["metadata"]["labels"][LABEL_UNPROTECTED].as_str() == Some("true"));
        if out.events.iter().any(|r| r == reason) && (!label || out.labelled) {
            out.reported_after_ms = Some(agent_started.elapsed().as_millis() as Ms);
            return out;
        }
        if Instant::now() >= deadline {
            out.missing = Some(format!(
                "under repair policy {policy}: {}{} within {patience:?} of the agent's start (Events seen: {:?}, label {})",
                format_args!("an Event {reason:?}"),
                if label {
                    format!(" and the label {LABEL_UNPROTECTED}=true")
                } else {
                    String::new()
                },
                out.events,
                if out.labelled { "set" } else { "not set" }
            ));
            return out;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_policy_promises_an_event_and_only_report_a_label() {
        assert_eq!(expected("repair"), Some(("Repaired", false)));
        assert_eq!(expected("report"), Some(("Unprotected", true)));
        assert_eq!(expected("restart"), Some(("Restarted", false)));
        assert_eq!(expected("sometimes"), None);
    }

    #[test]
    fn the_config_ahead_sorts_before_every_other() {
        let t = interlock_testkit::tempdir().unwrap();
        for n in [
            "0-interlock.conflist",
            "00-aws.conflist",
            "10-calico.conflist",
        ] {
            fs::write(t.path().join(n), "{}").unwrap();
        }
        let name = ahead_name(t.path()).unwrap();
        assert!(name.as_str() < "0-interlock.conflist" && name.ends_with(".conflist"));
        fs::write(t.path().join("+first.conflist"), "{}").unwrap();
        let e = ahead_name(t.path()).unwrap_err();
        assert!(e.contains("+first.conflist"), "{e}");
    }
}

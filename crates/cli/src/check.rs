//! `interlock check`: what this node's runtime will load, and whether a pod started now
//! would be protected — in plain words, or as JSON (`-o json`, a public interface).
//!
//! Gathering (files, the plugin binary, the agent's marker and `/readyz`) is kept apart
//! from judging ([`judge`], pure), so every verdict is unit-tested without root.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};
use interlock_contract::config::{PLUGIN_TYPE, POD_ANNOTATIONS_CAPABILITY};
use interlock_contract::layout::marker_path;
use interlock_contract::marker::ReadinessMarker;
use interlock_contract::time::now_ms;
use interlock_protocol::confdir::{self, Effective, Runtime};
use interlock_protocol::exec::plugin_version;
use serde::Serialize;

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// A table for people.
    Text,
    /// One JSON document for machines.
    Json,
}

/// `interlock check` flags.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The runtime's CNI conf dir.
    #[arg(long, env = "INTERLOCK_CNI_CONF_DIR", default_value = "/etc/cni/net.d")]
    cni_conf_dir: PathBuf,
    /// Where the runtime looks for plugin binaries (repeatable; in the environment
    /// variable, ':'-separated like CNI_PATH, the same as for `agent`).
    #[arg(
        long = "cni-bin-dir",
        env = "INTERLOCK_CNI_BIN_DIR",
        value_delimiter = crate::agent_cmd::BIN_DIR_DELIMITER,
        default_value = "/opt/cni/bin"
    )]
    cni_bin_dirs: Vec<PathBuf>,
    /// The agent's state dir (readiness marker).
    #[arg(
        long,
        env = "INTERLOCK_STATE_DIR",
        default_value = "/var/run/interlock"
    )]
    state_dir: PathBuf,
    /// Whose loading rules decide what is effective: containerd or crio.
    #[arg(long, env = "INTERLOCK_RUNTIME", default_value = "containerd")]
    runtime: Runtime,
    /// The agent's health address (`/readyz`); `none` skips asking it.
    #[arg(long, env = "INTERLOCK_HEALTH_ADDR", default_value = "127.0.0.1:9102")]
    health_addr: String,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
    output: Output,
}

/// One finding about the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// What was looked at: `config`, `binary`, `agent`.
    pub area: &'static str,
    /// `ok`, `warn` or `fail`.
    pub status: Status,
    /// What was found, in words an operator can act on.
    pub message: String,
}

/// Severity of a finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// As it should be.
    Ok,
    /// Not a hole today, but worth fixing.
    Warn,
    /// Pods started now could run unprotected, or would not start.
    Fail,
}

/// The report `-o json` prints.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    /// `true` when a meshed pod started now gets interlock-cni and the agent vouches.
    pub protected: bool,
    /// One sentence.
    pub verdict: String,
    /// Every finding, worst first.
    pub findings: Vec<Finding>,
    /// The conf dir as the runtime sees it.
    pub effective: Effective,
    /// The plugin binary found, if any.
    pub binary: Option<BinaryFacts>,
    /// The agent's readiness marker, if present.
    pub marker: Option<ReadinessMarker>,
    /// `/readyz` status code, if the agent answered.
    pub readyz: Option<u16>,
}

fn shown_path<S: serde::Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&confdir::shown_os(p.as_os_str()))
}

/// What the plugin binary said about itself.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BinaryFacts {
    /// Where the runtime would find it.
    #[serde(serialize_with = "shown_path")]
    pub path: PathBuf,
    /// Versions from its VERSION answer, or the error.
    pub versions: Result<Vec<String>, String>,
}

/// Everything [`judge`] looks at.
pub struct Observed<'a> {
    /// The effective config.
    pub effective: &'a Effective,
    /// The binary, if found in a bin dir.
    pub binary: Option<&'a BinaryFacts>,
    /// The marker, or why it could not be read.
    pub marker: Result<&'a ReadinessMarker, String>,
    /// Now, unix ms.
    pub now_ms: u64,
    /// `/readyz` code, if asked and answered.
    pub readyz: Option<u16>,
}

/// The verdict on a node, from what was observed. Pure.
pub fn judge(o: &Observed<'_>) -> (bool, String, Vec<Finding>) {
    let mut f = Vec::new();
    let mut push = |area, status, message: String| {
        f.push(Finding {
            area,
            status,
            message,
        })
    };
    let rt = o.effective.runtime;
    let mut config_ok = false;
    match &o.effective.chosen {
        None => push(
            "config",
            Status::Fail,
            format!("{rt} has no network: {}", o.effective.summary),
        ),
        Some(c) => {
            let name = confdir::shown_os(c.path.file_name().unwrap_or_default());
            let chain = c.list.plugin_types().join(" -> ");
            // The same predicate the agent's readiness uses (thin Multus included).
            match confdir::runs_plugin(&c.list, &name, PLUGIN_TYPE) {
                Err(why) => push(
                    "config",
                    Status::Fail,
                    format!("{rt} loads {why}: pods started now get NO redirection"),
                ),
                Ok(running) => {
                    let accepts = o
                        .binary
                        .and_then(|b| b.versions.as_ref().ok())
                        .cloned()
                        .unwrap_or_default();
                    match confdir::version_refused(&name, PLUGIN_TYPE, &running.version, &accepts) {
                        Some(why) => push("config", Status::Fail, format!("{rt} loads {why}")),
                        None => {
                            config_ok = true;
                            let place = match running.placement {
                                confdir::Placement::List => String::new(),
                                confdir::Placement::MultusDelegate => {
                                    " (interlock-cni runs in its Multus delegate)".to_string()
                                }
                            };
                            push(
                                "config",
                                Status::Ok,
                                format!("{rt} loads {name}: {chain}{place}"),
                            );
                            let declares = running
                                .entry
                                .get("capabilities")
                                .and_then(|c| c.get(POD_ANNOTATIONS_CAPABILITY))
                                .and_then(|v| v.as_bool())
                                .unwrap_or(false);
                            if !declares {
                                push(
                                    "config",
                                    Status::Warn,
                                    format!("the interlock-cni entry in {name} does not declare the {POD_ANNOTATIONS_CAPABILITY} capability: every ADD must ask the agent or the API"),
                                );
                            }
                        }
                    }
                }
            }
        }
    }
    let mut binary_ok = false;
    match o.binary {
        None => push(
            "binary",
            Status::Fail,
            "interlock-cni is in none of the bin dirs: ADD would fail".into(),
        ),
        Some(b) => match &b.versions {
            Ok(v) => {
                binary_ok = true;
                push(
                    "binary",
                    Status::Ok,
                    format!("{} answers VERSION ({})", b.path.display(), v.join(", ")),
                )
            }
            Err(e) => push(
                "binary",
                Status::Fail,
                format!("{} does not answer VERSION: {e}", b.path.display()),
            ),
        },
    }
    let mut agent_ok = false;
    match &o.marker {
        Err(e) => push("agent", Status::Fail, format!("no readiness from the agent: {e}")),
        Ok(m) if !m.ready => push(
            "agent",
            Status::Fail,
            format!(
                "the agent (pid {}) reports not ready: {} (marker {:.1} s old)",
                m.pid,
                m.reason,
                o.now_ms.saturating_sub(m.updated_at_ms) as f64 / 1e3
            ),
        ),
        Ok(m) if !m.is_fresh(o.now_ms) => push(
            "agent",
            Status::Fail,
            format!(
                "the agent's marker is {:.1} s old (stale after {:.1} s): the agent (pid {}) is gone or hung",
                o.now_ms.saturating_sub(m.updated_at_ms) as f64 / 1e3,
                m.stale_after_ms as f64 / 1e3,
                m.pid
            ),
        ),
        Ok(m) => {
            agent_ok = true;
            push(
                "agent",
                Status::Ok,
                format!("ready (pid {}, marker {:.1} s old)", m.pid, o.now_ms.saturating_sub(m.updated_at_ms) as f64 / 1e3),
            )
        }
    }
    match o.readyz {
        Some(200) | None => {}
        Some(code) => push("agent", Status::Warn, format!("/readyz answers {code}")),
    }
    f.sort_by_key(|x| match x.status {
        Status::Fail => 0,
        Status::Warn => 1,
        Status::Ok => 2,
    });
    let protected = config_ok && binary_ok && agent_ok;
    let verdict = if protected {
        "PROTECTED: a meshed pod started on this node now gets its redirection before it runs"
            .to_string()
    } else {
        "NOT PROTECTED: a meshed pod started on this node now could run without redirection or fail to start".to_string()
    };
    (protected, verdict, f)
}

/// Runs `interlock check`; the exit code is 0 when protected, 1 when not.
pub fn run(a: CheckArgs) -> anyhow::Result<std::process::ExitCode> {
    let runtime = a.runtime;
    if !a.cni_conf_dir.is_dir() {
        anyhow::bail!(
            "CNI conf dir {} does not exist or is not a directory (the runtime would have no network); pass --cni-conf-dir",
            a.cni_conf_dir.display()
        );
    }
    let effective = confdir::load(&a.cni_conf_dir, runtime, &a.cni_bin_dirs)
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", a.cni_conf_dir.display()))?;
    let binary = confdir::find_plugin(PLUGIN_TYPE, &a.cni_bin_dirs).map(|path| BinaryFacts {
        versions: plugin_version(&path, &a.cni_bin_dirs)
            .map(|i| i.supported_versions)
            .map_err(|e| e.to_string()),
        path,
    });
    let mpath = marker_path(&a.state_dir);
    let marker = ReadinessMarker::read(&mpath).map_err(|e| format!("{}: {e}", mpath.display()));
    let readyz = if a.health_addr == "none" {
        None
    } else {
        readyz(&a.health_addr)
    };
    let now = now_ms();
    let (protected, verdict, findings) = judge(&Observed {
        effective: &effective,
        binary: binary.as_ref(),
        marker: marker.as_ref().map_err(Clone::clone),
        now_ms: now,
        readyz,
    });
    let report = NodeReport {
        protected,
        verdict,
        findings,
        effective,
        binary,
        marker: marker.ok(),
        readyz,
    };
    let mut out = std::io::stdout().lock();
    let written = match a.output {
        // Indented only so deep that a 10,000-deep config (the runtimes load one) stays
        // its own size.
        Output::Json => out
            .write_all(&interlock_protocol::conf::pretty_json(&report))
            .and_then(|()| writeln!(out)),
        Output::Text => render(&mut out, &report, &a.cni_conf_dir),
    };
    // A reader that stops early (`| head`) is not an error of ours.
    match written {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => return Err(e.into()),
        _ => {}
    }
    Ok(if report.protected {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::from(1)
    })
}

fn render(out: &mut impl Write, r: &NodeReport, dir: &Path) -> std::io::Result<()> {
    writeln!(
        out,
        "CNI conf dir {} as {} loads it:",
        confdir::shown_os(dir.as_os_str()),
        r.effective.runtime
    )?;
    for f in &r.effective.files {
        // Escaped: a file name can carry terminal escape sequences.
        let name = confdir::shown_os(f.path.file_name().unwrap_or_default());
        let verdict = serde_json::to_value(f.verdict)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        writeln!(out, "  {name:<28} {verdict:<12} {}", f.reason)?;
    }
    if r.effective.files.is_empty() {
        writeln!(out, "  (empty)")?;
    }
    writeln!(out)?;
    for f in &r.findings {
        let tag = match f.status {
            Status::Ok => "ok  ",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        };
        writeln!(out, "{tag} {:<7} {}", f.area, f.message)?;
    }
    writeln!(out, "\n{}", r.verdict)
}

fn readyz(addr: &str) -> Option<u16> {
    let addr: SocketAddr = addr.parse().ok()?;
    interlock_agent::health::readyz_status(addr, Duration::from_millis(500)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judge_at(
        effective: &Effective,
        binary: Option<&BinaryFacts>,
        marker: Result<&ReadinessMarker, String>,
        now_ms: u64,
        readyz: Option<u16>,
    ) -> (bool, String, Vec<Finding>) {
        judge(&Observed {
            effective,
            binary,
            marker,
            now_ms,
            readyz,
        })
    }

    fn effective(files: &[(&str, &str)]) -> (tempfile::TempDir, Effective) {
        let d = tempfile::tempdir().unwrap();
        for (n, c) in files {
            std::fs::write(d.path().join(n), c).unwrap();
        }
        let e = confdir::load(d.path(), Runtime::Containerd, &[]).unwrap();
        (d, e)
    }

    fn marker(ready: bool, age_ms: u64, now: u64) -> ReadinessMarker {
        ReadinessMarker {
            ready,
            reason: if ready {
                "ok".into()
            } else {
                "10-calico.conflist sorts ahead".into()
            },
            updated_at_ms: now - age_ms,
            stale_after_ms: 3000,
            pid: 42,
            pid_namespace: None,
            config_path: String::new(),
        }
    }

    const OURS: &str = r#"{"cniVersion":"1.0.0","name":"k8s","plugins":[{"type":"bridge"},{"type":"interlock-cni","capabilities":{"io.kubernetes.cri.pod-annotations":true}}]}"#;
    const PRIMARY: &str = r#"{"cniVersion":"1.0.0","name":"k8s","plugins":[{"type":"bridge"}]}"#;

    fn bin() -> BinaryFacts {
        BinaryFacts {
            path: "/opt/cni/bin/interlock-cni".into(),
            versions: Ok(vec!["1.0.0".into()]),
        }
    }

    #[test]
    fn protected_only_when_config_binary_and_agent_agree() {
        let now = 1_000_000;
        let (_d, e) = effective(&[
            ("00-interlock.conflist", OURS),
            ("10-calico.conflist", PRIMARY),
        ]);
        let m = marker(true, 500, now);
        let b = bin();
        let (ok, verdict, f) = judge_at(&e, Some(&b), Ok(&m), now, Some(200));
        assert!(ok, "{f:?}");
        assert!(verdict.starts_with("PROTECTED"));
        assert!(f.iter().all(|x| x.status == Status::Ok), "{f:?}");

        // A foreign file sorting first: the hole the design is about.
        let (_d, e2) = effective(&[
            ("00-calico.conflist", PRIMARY),
            ("01-interlock.conflist", OURS),
        ]);
        let (ok, verdict, f) = judge_at(&e2, Some(&b), Ok(&m), now, Some(200));
        assert!(!ok);
        assert!(verdict.starts_with("NOT PROTECTED"));
        assert_eq!(f[0].status, Status::Fail);
        assert!(
            f[0].message.contains("00-calico.conflist") && f[0].message.contains("NO redirection"),
            "{}",
            f[0].message
        );

        // Stale marker: agent gone.
        let stale = marker(true, 10_000, now);
        let (ok, _, f) = judge_at(&e, Some(&b), Ok(&stale), now, None);
        assert!(!ok);
        assert!(
            f[0].message.contains("gone or hung") && f[0].message.contains("pid 42"),
            "{}",
            f[0].message
        );

        // Not ready, with the agent's reason.
        let nr = marker(false, 100, now);
        let (ok, _, f) = judge_at(&e, Some(&b), Ok(&nr), now, Some(503));
        assert!(!ok);
        assert!(f
            .iter()
            .any(|x| x.message.contains("10-calico.conflist sorts ahead")));
        assert!(f.iter().any(|x| x.message.contains("/readyz answers 503")));

        // Missing binary.
        let (ok, _, f) = judge_at(&e, None, Ok(&m), now, None);
        assert!(!ok);
        assert!(f[0].message.contains("none of the bin dirs"));
    }

    #[test]
    fn broken_first_file_and_plugin_order_are_failures() {
        let now = 1_000_000;
        let m = marker(true, 0, now);
        let b = bin();
        let (_d, e) = effective(&[
            ("00-broken.conflist", "{\"cniVersion\":"),
            ("10-x.conflist", OURS),
        ]);
        let (ok, _, f) = judge_at(&e, Some(&b), Ok(&m), now, None);
        assert!(!ok);
        assert!(f[0].message.contains("has no network"), "{}", f[0].message);

        let first = r#"{"cniVersion":"1.0.0","name":"k8s","plugins":[{"type":"interlock-cni"},{"type":"bridge"}]}"#;
        let (_d, e) = effective(&[("00-x.conflist", first)]);
        let (ok, _, f) = judge_at(&e, Some(&b), Ok(&m), now, None);
        assert!(!ok);
        assert!(f[0].message.contains("chained after"), "{}", f[0].message);

        let old = r#"{"cniVersion":"0.2.0","name":"k8s","plugins":[{"type":"bridge"},{"type":"interlock-cni"}]}"#;
        let (_d, e) = effective(&[("00-x.conflist", old)]);
        let (ok, _, f) = judge_at(&e, Some(&b), Ok(&m), now, None);
        assert!(!ok);
        assert!(
            f[0].message.contains("\"0.2.0\"") && f[0].message.contains("refuses"),
            "{}",
            f[0].message
        );

        let nocap = r#"{"cniVersion":"1.0.0","name":"k8s","plugins":[{"type":"bridge"},{"type":"interlock-cni"}]}"#;
        let (_d, e) = effective(&[("00-x.conflist", nocap)]);
        let (ok, _, f) = judge_at(&e, Some(&b), Ok(&m), now, None);
        assert!(ok);
        assert!(f
            .iter()
            .any(|x| x.status == Status::Warn && x.message.contains("pod-annotations")));
    }
}

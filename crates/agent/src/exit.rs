//! What the agent leaves on the node as it exits. [`decide`] applies uninstall-on-exit
//! ([`UninstallOnExit`]; in `when-deleted` mode it asks the API through
//! [`kubernetes::owner`]), and [`uninstall`] removes interlock's files from the node when
//! that says so ([`crate::uninstall::uninstall_node`], as `interlock uninstall` does).

use tracing::{info, warn};

use crate::{kubernetes, AgentConfig, AgentError, KubeMode};

/// What the agent does with interlock's config and plugin binary when it exits
/// (`--uninstall-on-exit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UninstallOnExit {
    /// `false`: everything stays, so that a restart or a rollout never opens a window.
    Never,
    /// `true`: remove everything on every exit (a rollout then opens a window on each
    /// node until the next agent has written the config back).
    Always,
    /// `when-deleted`: remove everything only when the DaemonSet that runs the agent is
    /// being deleted, as the API says on SIGTERM ([`kubernetes::owner`]); keep everything
    /// on a rollout, a pod deletion or a node drain, and whenever the API cannot tell.
    WhenDeleted,
}

impl UninstallOnExit {
    /// The values the flag takes, for messages.
    pub const VALUES: &'static str = "false, true or when-deleted";
}

impl std::str::FromStr for UninstallOnExit {
    type Err = String;

    fn from_str(s: &str) -> Result<UninstallOnExit, String> {
        match s {
            "false" => Ok(UninstallOnExit::Never),
            "true" => Ok(UninstallOnExit::Always),
            "when-deleted" => Ok(UninstallOnExit::WhenDeleted),
            other => Err(format!(
                "unknown uninstall-on-exit mode {other:?} (expected {})",
                UninstallOnExit::VALUES
            )),
        }
    }
}

impl std::fmt::Display for UninstallOnExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            UninstallOnExit::Never => "false",
            UninstallOnExit::Always => "true",
            UninstallOnExit::WhenDeleted => "when-deleted",
        })
    }
}

/// Whether the agent removes what interlock added as it exits, as `uninstall_on_exit`
/// says; logged either way. `when-deleted` asks the API whether the agent's DaemonSet is
/// going away ([`kubernetes::owner`]), through `client` (`None`: a client of its own,
/// when there are credentials). When that cannot be found out, everything stays, with a
/// warning saying why: a config left behind keeps pods protected, while one removed
/// during a rollout would let pods start unprotected.
pub async fn decide(cfg: &AgentConfig, client: Option<kube::Client>) -> bool {
    let mode = cfg.uninstall_on_exit;
    match mode {
        UninstallOnExit::Never => {
            info!("the CNI config and the plugin binary stay in place (uninstall-on-exit={mode})");
            false
        }
        UninstallOnExit::Always => {
            info!("removing interlock's CNI config and plugin binary (uninstall-on-exit={mode})");
            true
        }
        UninstallOnExit::WhenDeleted => match ask_owner(cfg, client).await {
            Ok(kubernetes::owner::ExitDecision::Uninstall(why)) => {
                info!(
                    "{why}: removing interlock's CNI config and plugin binary \
                     (uninstall-on-exit={mode})"
                );
                true
            }
            Ok(kubernetes::owner::ExitDecision::Keep(why)) => {
                info!(
                    "{why}: the CNI config and the plugin binary stay in place \
                     (uninstall-on-exit={mode})"
                );
                false
            }
            Err(why) => {
                warn!(
                    "uninstall-on-exit={mode}: cannot tell whether this agent's DaemonSet is \
                     being deleted ({why}); keeping interlock's CNI config and plugin binary, \
                     which keeps the node's pods protected (fail closed). If the DaemonSet is \
                     gone, run `interlock uninstall` on the node"
                );
                false
            }
        },
    }
}

/// `when-deleted`: the API's answer about the agent's DaemonSet, or why there is none.
async fn ask_owner(
    cfg: &AgentConfig,
    client: Option<kube::Client>,
) -> Result<kubernetes::owner::ExitDecision, String> {
    let Some((namespace, name)) = &cfg.pod else {
        return Err(POD_UNKNOWN.into());
    };
    let client = match client {
        Some(c) => c,
        None if cfg.kube == KubeMode::None => {
            return Err("the agent runs without a Kubernetes API (--kube none)".into())
        }
        None => {
            let deadline = kubernetes::owner::EXIT_CHECK_DEADLINE;
            match tokio::time::timeout(deadline, kubernetes::connect()).await {
                Ok(Ok(Some((c, _)))) => c,
                Ok(Ok(None)) => {
                    return Err("no Kubernetes credentials (no in-cluster service account, \
                                no $KUBECONFIG or ~/.kube/config)"
                        .into())
                }
                Ok(Err(e)) => return Err(format!("cannot load Kubernetes credentials: {e}")),
                Err(_) => {
                    return Err(format!(
                        "loading Kubernetes credentials took over {deadline:?}"
                    ))
                }
            }
        }
    };
    kubernetes::owner::ask(client, namespace, name).await
}

/// Why `when-deleted` cannot work without the pod's name, and how to give it.
pub(crate) const POD_UNKNOWN: &str =
    "the agent's own pod is unknown: set POD_NAME and POD_NAMESPACE \
                           (in the DaemonSet: env from fieldRef metadata.name and \
                           metadata.namespace) or pass --pod-name and --pod-namespace";

/// Removes interlock's files from the node as the agent exits, with the agent's own
/// settings, and logs every step; an error lists the steps that failed.
pub fn uninstall(cfg: &AgentConfig) -> Result<(), AgentError> {
    let opts = crate::uninstall::UninstallOptions {
        runtime: Some(cfg.runtime),
        own_socket: true,
        ..crate::uninstall::UninstallOptions::default()
    };
    let r = crate::uninstall::uninstall_node(&cfg.conf_dir, &cfg.bin_dirs, &cfg.state_dir, &opts);
    let lines = r.lines();
    info!(
        "uninstalled: {}",
        if lines.is_empty() {
            "nothing to remove".into()
        } else {
            lines.join("; ")
        }
    );
    for why in &r.incomplete {
        warn!("uninstall incomplete: {why}");
    }
    let errors = r.errors();
    if !errors.is_empty() {
        return Err(AgentError::Uninstall(errors));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_modes_read_and_print_as_the_flag_takes_them() {
        for m in [
            UninstallOnExit::Never,
            UninstallOnExit::Always,
            UninstallOnExit::WhenDeleted,
        ] {
            assert_eq!(m.to_string().parse::<UninstallOnExit>(), Ok(m));
        }
        assert_eq!("true".parse(), Ok(UninstallOnExit::Always));
        assert_eq!("false".parse(), Ok(UninstallOnExit::Never));
        let e = "yes".parse::<UninstallOnExit>().unwrap_err();
        assert!(
            e.contains("\"yes\"") && e.contains(UninstallOnExit::VALUES),
            "{e}"
        );
    }

    /// `when-deleted` with nothing to ask (no API, or no pod name) keeps everything;
    /// `true` and `false` never ask.
    #[tokio::test]
    async fn when_deleted_keeps_everything_without_an_answer() {
        let mut cfg = AgentConfig::new("/nonexistent/interlock-cni".into());
        cfg.kube = KubeMode::None;
        cfg.pod = Some(("interlock-system".into(), "interlock-node-x".into()));
        cfg.uninstall_on_exit = UninstallOnExit::WhenDeleted;
        assert!(!decide(&cfg, None).await);
        cfg.kube = KubeMode::Auto;
        cfg.pod = None;
        assert!(!decide(&cfg, None).await);
        cfg.uninstall_on_exit = UninstallOnExit::Always;
        assert!(decide(&cfg, None).await);
        cfg.uninstall_on_exit = UninstallOnExit::Never;
        assert!(!decide(&cfg, None).await);
    }
}

//! The STATUS verb.
//!
//! A failing STATUS makes containerd (≥ 2.0.1, for a config list at cniVersion ≥ 1.1.0;
//! CRI-O likewise) report the node's network NotReady, and the node's ordinary pods are
//! evicted after 300 s. So [`check_status`] answers 50 only when an ADD on this node would
//! now fail, or leave a meshed pod unprotected: the backend cannot work here, the state
//! dir is unusable, or the pod lookup the entry depends on cannot work (no
//! `io.kubernetes.cri.pod-annotations` capability, and no reachable, trusted agent
//! socket), or a profile that reads the pod's spec (Istio, Linkerd) is enabled without
//! an `agentSocket` to ask for it. The agent being down or not ready is *not* such a
//! reason — it comes back, and meanwhile such pods' ADDs fail with 11 and are retried;
//! the agent's taint and node condition say that. In the guard role (the entry's
//! `guard`) STATUS always succeeds, in hold too (see `super::guard`). (The agent's
//! readiness marker is
//! `interlock_contract::marker`'s, read by `interlock check`.)

use std::io;

use interlock_cni_types::CniError;
use interlock_contract::codes::NOT_AVAILABLE;
use interlock_contract::config::PluginConfig;
use interlock_contract::profile::ProfileName;

use super::Call;

pub(super) fn status(call: &Call) -> Result<(), CniError> {
    check_status(call.config, call.inv.version.as_str())
}

/// STATUS: `Ok` when an ADD on this node can protect a meshed pod now; otherwise code 50
/// listing every reason (see the module docs).
pub fn check_status(config: &PluginConfig, cni_version: &str) -> Result<(), CniError> {
    if config.guard.is_some() {
        // The guard role writes nothing and keeps no state, and a hold is not a reason
        // (see `super::guard`): nothing it needs can be missing for good.
        return Ok(());
    }
    let mut problems = Vec::new();
    let (kind, why) = interlock_attach::protect::resolve_backend(config.backend, &config.state_dir);
    if let Err(e) = interlock_redirect::backend::open(kind).and_then(|b| b.usable()) {
        problems.push(format!("the {kind} backend ({why}) cannot work here: {e}"));
    }
    for dir in [
        config.state_dir.join(interlock_contract::layout::NETNS_DIR),
        interlock_attach::state::StateStore::new(&config.state_dir)
            .dir()
            .to_path_buf(),
    ] {
        let usable = std::fs::create_dir_all(&dir).and_then(|()| {
            nix::unistd::access(&dir, nix::unistd::AccessFlags::W_OK).map_err(io::Error::from)
        });
        if let Err(e) = usable {
            problems.push(format!(
                "the state dir {} is unusable ({}: {e})",
                config.state_dir.display(),
                dir.display()
            ));
            break;
        }
    }
    if !config.wants_pod_annotations() {
        let source = match &config.agent_socket {
            Some(socket) => crate::agent_client::connect_trusted(socket)
                .map(drop)
                .map_err(|e| e.to_string()),
            None => Err("agentSocket is not configured".to_string()),
        };
        if let Err(e) = source {
            problems.push(format!(
                "the entry does not declare the io.kubernetes.cri.pod-annotations capability, so a pod's annotations must be looked up, and that cannot work: {e}"
            ));
        }
    }
    let spec_readers: Vec<&str> = config
        .profiles
        .iter()
        .filter(|p| matches!(p, ProfileName::Istio | ProfileName::Linkerd))
        .map(|p| p.as_str())
        .collect();
    if !spec_readers.is_empty() && config.agent_socket.is_none() {
        problems.push(format!(
            "the {} profile(s) read a pod's spec, which only the agent can tell, and agentSocket is not configured: every such pod's ADD would fail",
            spec_readers.join(" and ")
        ));
    }
    if problems.is_empty() {
        return Ok(());
    }
    Err(CniError::new(
        cni_version,
        NOT_AVAILABLE,
        format!(
            "interlock-cni cannot protect meshed pods on this node now: {}",
            problems.join("; ")
        ),
    )
    .with_details(
        "an ADD of a meshed pod would fail; fix the cause named above (the agent being down is not such a cause: Istio and Linkerd pods then wait for it, other pods need no agent)",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use interlock_contract::guard::{GuardRole, GuardedMesh};

    #[test]
    fn guard_role_status_never_fails_not_even_in_hold() {
        // An entry that fails STATUS in the redirecting role for two reasons: an
        // unusable state dir (a file where the dir should be) and a spec-reading profile
        // without an agent socket.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-a-dir");
        std::fs::write(&file, "").unwrap();
        let mut c = PluginConfig {
            state_dir: file,
            profiles: vec![ProfileName::Istio],
            agent_socket: None,
            ..PluginConfig::default()
        };
        let e = check_status(&c, "1.1.0").unwrap_err();
        assert_eq!(e.code, NOT_AVAILABLE);
        assert!(e.msg.contains("state dir"), "{}", e.msg);
        c.guard = Some(GuardRole {
            mesh: GuardedMesh::Istio,
            hold: true,
            reason: Some("istio-cni binary missing".into()),
            exclude_namespaces: vec![],
        });
        assert!(check_status(&c, "1.1.0").is_ok());
    }
}

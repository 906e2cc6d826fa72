//! Containers in a sandbox: create, start, status, stop, remove — what a kubelet does to
//! run a pod's container, for tests that run an image as a DaemonSet would (the agent
//! itself only reads sandboxes). The container's config is CRI's own message
//! ([`crate::proto::ContainerConfig`]): a caller that translates a pod spec sets every
//! field the kubelet would.

use k8s_cri::v1 as cri;

use crate::{CriClient, CriError, SandboxConfig};

/// A container's state as `ContainerStatus` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerState {
    /// `CONTAINER_CREATED`, `CONTAINER_RUNNING`, `CONTAINER_EXITED` or `CONTAINER_UNKNOWN`.
    pub state: String,
    /// The exit code once exited.
    pub exit_code: i32,
    /// The runtime's reason (`Completed`, `Error`, `OOMKilled`…), once exited.
    pub reason: String,
    /// The runtime's message, e.g. why it could not start.
    pub message: String,
    /// The container's log file on the host, when the sandbox has a log directory.
    pub log_path: String,
}

impl ContainerState {
    /// True while the container runs.
    pub fn running(&self) -> bool {
        self.state == "CONTAINER_RUNNING"
    }
}

impl CriClient {
    /// Creates a container from `config` in sandbox `sandbox_id` (which was run from
    /// `sandbox`); returns its ID. The image must be in the runtime already.
    pub async fn create_container(
        &self,
        sandbox_id: &str,
        config: cri::ContainerConfig,
        sandbox: &SandboxConfig,
    ) -> Result<String, CriError> {
        let pod = sandbox.pod_name();
        let r = self
            .call(
                "CreateContainer",
                Some(&pod),
                self.timeouts.call,
                |mut c, req| async move { c.create_container(req).await },
                cri::CreateContainerRequest {
                    pod_sandbox_id: sandbox_id.to_string(),
                    config: Some(config),
                    sandbox_config: Some(sandbox.to_cri()),
                },
            )
            .await?;
        if r.container_id.is_empty() {
            return Err(CriError::InvalidResponse {
                site: self.site("CreateContainer", Some(&pod)),
                reason: "no container ID in the answer".to_string(),
            });
        }
        Ok(r.container_id)
    }

    /// Starts a created container.
    pub async fn start_container(&self, id: &str) -> Result<(), CriError> {
        self.call(
            "StartContainer",
            None,
            self.timeouts.call,
            |mut c, req| async move { c.start_container(req).await },
            cri::StartContainerRequest {
                container_id: id.to_string(),
            },
        )
        .await
        .map(drop)
    }

    /// The container's state, exit code, reason and message.
    pub async fn container_status(&self, id: &str) -> Result<ContainerState, CriError> {
        let r = self
            .call(
                "ContainerStatus",
                None,
                self.timeouts.call,
                |mut c, req| async move { c.container_status(req).await },
                cri::ContainerStatusRequest {
                    container_id: id.to_string(),
                    verbose: false,
                },
            )
            .await?;
        let s = r.status.ok_or_else(|| CriError::InvalidResponse {
            site: self.site("ContainerStatus", None),
            reason: format!("no status for container {id}"),
        })?;
        Ok(ContainerState {
            state: cri::ContainerState::try_from(s.state)
                .map(|s| s.as_str_name().to_string())
                .unwrap_or_else(|_| format!("state {}", s.state)),
            exit_code: s.exit_code,
            reason: s.reason,
            message: s.message,
            log_path: s.log_path,
        })
    }

    /// Stops the container: SIGTERM (or the image's stop signal), SIGKILL after
    /// `grace_seconds`. The call's own deadline is extended by the grace.
    pub async fn stop_container(&self, id: &str, grace_seconds: i64) -> Result<(), CriError> {
        let timeout =
            self.timeouts.call + std::time::Duration::from_secs(grace_seconds.max(0) as u64);
        self.call(
            "StopContainer",
            None,
            timeout,
            |mut c, req| async move { c.stop_container(req).await },
            cri::StopContainerRequest {
                container_id: id.to_string(),
                timeout: grace_seconds,
            },
        )
        .await
        .map(drop)
    }

    /// Removes a stopped container.
    pub async fn remove_container(&self, id: &str) -> Result<(), CriError> {
        self.call(
            "RemoveContainer",
            None,
            self.timeouts.call,
            |mut c, req| async move { c.remove_container(req).await },
            cri::RemoveContainerRequest {
                container_id: id.to_string(),
            },
        )
        .await
        .map(drop)
    }
}

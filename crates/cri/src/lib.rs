//! The CRI runtime-service client of interlock: version, runtime status, and the pod
//! sandbox calls an audit and the tests need (list, status with the netns path, run,
//! stop, remove), over the runtime's Unix socket; and, for tests that run an image as
//! a kubelet would, a container's create, start, status, stop and remove.
//!
//! It speaks CRI `runtime.v1` (containerd ≥ 1.6, CRI-O ≥ 1.20) through the `k8s-cri`
//! bindings and tonic. Every call has a deadline (sent to the runtime as `grpc-timeout`
//! and enforced here), connecting has its own timeout, and every error names the
//! endpoint, the call and the sandbox. The crate knows nothing about meshes or policy.
//!
//! The netns path of a sandbox is only in the runtime's verbose info, in a different
//! place per runtime version: [`info::parse_verbose_info`] reads every known form.

use std::future::Future;
use std::net::IpAddr;
use std::time::Duration;

use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::{Channel, Endpoint};

mod container;
pub mod endpoint;
mod error;
pub mod info;
mod sandbox;

pub use container::ContainerState;
pub use error::{CallSite, CriError};
pub use info::{NetnsPath, NetnsSource, VerboseInfo};
/// CRI's own messages, for callers that build a [`proto::ContainerConfig`]
/// ([`CriClient::create_container`]).
pub use k8s_cri::v1 as proto;
pub use sandbox::{
    SandboxConfig, SandboxFilter, SandboxMetadata, SandboxState, SandboxStatus, SandboxSummary,
};

/// containerd's CRI socket on a node, kubelet's usual `--container-runtime-endpoint`.
pub const DEFAULT_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";

/// Timeouts of a [`CriClient`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// How long connecting to the socket may take.
    pub connect: Duration,
    /// The deadline of every call except `RunPodSandbox`.
    pub call: Duration,
    /// The deadline of `RunPodSandbox`, which runs the CNI chain (kubelet allows 4 min).
    pub run_sandbox: Duration,
}

impl Default for Timeouts {
    fn default() -> Timeouts {
        Timeouts {
            connect: Duration::from_secs(2),
            call: Duration::from_secs(10),
            run_sandbox: Duration::from_secs(60),
        }
    }
}

/// `Version` of the runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeVersion {
    /// The runtime's name, e.g. `containerd`.
    pub runtime_name: String,
    /// The runtime's version, e.g. `1.6.20~ds1`.
    pub runtime_version: String,
    /// The CRI API version it serves, e.g. `v1`.
    pub runtime_api_version: String,
}

/// One condition of the runtime's `Status` (`RuntimeReady`, `NetworkReady`, …).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeCondition {
    /// The condition type.
    pub kind: String,
    /// Whether it holds.
    pub status: bool,
    /// A machine-readable reason when it does not, e.g. `NetworkPluginNotReady`.
    pub reason: String,
    /// The runtime's explanation.
    pub message: String,
}

/// `Status` of the runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeStatus {
    /// Every condition the runtime reported.
    pub conditions: Vec<RuntimeCondition>,
}

impl RuntimeStatus {
    /// The condition of this type, if reported.
    pub fn condition(&self, kind: &str) -> Option<&RuntimeCondition> {
        self.conditions.iter().find(|c| c.kind == kind)
    }

    /// `RuntimeReady` holds.
    pub fn runtime_ready(&self) -> bool {
        self.condition("RuntimeReady").is_some_and(|c| c.status)
    }

    /// `NetworkReady` holds (containerd: a valid CNI config is loaded).
    pub fn network_ready(&self) -> bool {
        self.condition("NetworkReady").is_some_and(|c| c.status)
    }
}

/// A connection to a CRI runtime service. Cheap to clone; clones share the connection,
/// which reconnects by itself after the runtime restarts.
#[derive(Debug, Clone)]
pub struct CriClient {
    endpoint: String,
    client: RuntimeServiceClient<Channel>,
    timeouts: Timeouts,
}

impl CriClient {
    /// Connects to `endpoint` (`unix:///path` or a path) with [`Timeouts::default`].
    pub async fn connect(endpoint: &str) -> Result<CriClient, CriError> {
        CriClient::connect_with(endpoint, Timeouts::default()).await
    }

    /// Connects to `endpoint` with the given timeouts. Fails when the socket cannot be
    /// reached within `timeouts.connect`.
    pub async fn connect_with(endpoint: &str, timeouts: Timeouts) -> Result<CriClient, CriError> {
        let path = endpoint::socket_path(endpoint)?;
        let path = path.to_str().ok_or_else(|| CriError::InvalidEndpoint {
            endpoint: endpoint.to_string(),
            reason: "the path is not UTF-8".to_string(),
        })?;
        let channel = Endpoint::from_shared(format!("unix://{path}"))
            .map_err(|source| CriError::Connect {
                endpoint: endpoint.to_string(),
                source,
            })?
            .connect_timeout(timeouts.connect);
        // The connector's timeout covers the socket connect; this one also covers the
        // HTTP/2 handshake with a runtime that accepts but never answers.
        let channel = tokio::time::timeout(timeouts.connect, channel.connect())
            .await
            .map_err(|_| CriError::ConnectTimeout {
                endpoint: endpoint.to_string(),
                timeout: timeouts.connect,
            })?
            .map_err(|source| CriError::Connect {
                endpoint: endpoint.to_string(),
                source,
            })?;
        Ok(CriClient {
            endpoint: endpoint.to_string(),
            client: RuntimeServiceClient::new(channel),
            timeouts,
        })
    }

    /// The endpoint as given to [`CriClient::connect`].
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The runtime's name, version and CRI API version.
    pub async fn version(&self) -> Result<RuntimeVersion, CriError> {
        let r = self
            .call(
                "Version",
                None,
                self.timeouts.call,
                |mut c, req| async move { c.version(req).await },
                cri::VersionRequest {
                    version: "v1".to_string(),
                },
            )
            .await?;
        Ok(RuntimeVersion {
            runtime_name: r.runtime_name,
            runtime_version: r.runtime_version,
            runtime_api_version: r.runtime_api_version,
        })
    }

    /// The runtime's conditions (`RuntimeReady`, `NetworkReady`).
    pub async fn status(&self) -> Result<RuntimeStatus, CriError> {
        let site = self.site("Status", None);
        let r = self
            .call(
                "Status",
                None,
                self.timeouts.call,
                |mut c, req| async move { c.status(req).await },
                cri::StatusRequest { verbose: false },
            )
            .await?;
        let status = r.status.ok_or_else(|| CriError::InvalidResponse {
            site,
            reason: "no status in the answer".to_string(),
        })?;
        Ok(RuntimeStatus {
            conditions: status
                .conditions
                .into_iter()
                .map(|c| RuntimeCondition {
                    kind: c.r#type,
                    status: c.status,
                    reason: c.reason,
                    message: c.message,
                })
                .collect(),
        })
    }

    /// The runtime's verbose `Status` info map (containerd: `cniconfig` holds the CNI
    /// networks it has loaded, `config` its CRI config); runtime-specific JSON strings.
    pub async fn status_info(&self) -> Result<std::collections::HashMap<String, String>, CriError> {
        let r = self
            .call(
                "Status",
                None,
                self.timeouts.call,
                |mut c, req| async move { c.status(req).await },
                cri::StatusRequest { verbose: true },
            )
            .await?;
        Ok(r.info)
    }

    /// The sandboxes that pass `filter`, in the runtime's order.
    pub async fn list_sandboxes(
        &self,
        filter: &SandboxFilter,
    ) -> Result<Vec<SandboxSummary>, CriError> {
        let r = self
            .call(
                "ListPodSandbox",
                None,
                self.timeouts.call,
                |mut c, req| async move { c.list_pod_sandbox(req).await },
                cri::ListPodSandboxRequest {
                    filter: Some(filter.to_cri()),
                },
            )
            .await?;
        Ok(r.items.into_iter().map(SandboxSummary::from_cri).collect())
    }

    /// The status of sandbox `id`. With `verbose` the runtime adds its info, from which
    /// the netns path is read ([`SandboxStatus::netns_path`]).
    ///
    /// A sandbox that no longer exists fails with an error whose
    /// [`CriError::is_not_found`] is true.
    pub async fn sandbox_status(&self, id: &str, verbose: bool) -> Result<SandboxStatus, CriError> {
        let r = self
            .call(
                "PodSandboxStatus",
                Some(id),
                self.timeouts.call,
                |mut c, req| async move { c.pod_sandbox_status(req).await },
                cri::PodSandboxStatusRequest {
                    pod_sandbox_id: id.to_string(),
                    verbose,
                },
            )
            .await?;
        let invalid = |reason: String| CriError::InvalidResponse {
            site: self.site("PodSandboxStatus", Some(id)),
            reason,
        };
        let status = r
            .status
            .ok_or_else(|| invalid("no status in the answer".to_string()))?;
        let verbose_info = info::parse_verbose_info(&r.info).map_err(invalid)?;
        let network = status.network.unwrap_or_default();
        let ips = std::iter::once(network.ip)
            .chain(network.additional_ips.into_iter().map(|p| p.ip))
            .filter(|ip| !ip.is_empty())
            .map(|ip| {
                ip.parse::<IpAddr>()
                    .map_err(|_| invalid(format!("pod IP {ip:?} is not an IP address")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let host_network = status
            .linux
            .and_then(|l| l.namespaces)
            .and_then(|n| n.options)
            .is_some_and(|o| o.network == cri::NamespaceMode::Node as i32);
        Ok(SandboxStatus {
            id: status.id,
            metadata: sandbox::SandboxMetadata::from_cri(status.metadata),
            state: SandboxState::from_cri(status.state),
            created_at_nanos: status.created_at,
            labels: sandbox::sorted(status.labels),
            annotations: sandbox::sorted(status.annotations),
            ips,
            host_network,
            runtime_handler: status.runtime_handler,
            verbose: verbose_info,
            info: sandbox::sorted(r.info),
        })
    }

    /// Creates and starts a sandbox (the runtime runs the CNI chain); returns its ID.
    pub async fn run_sandbox(&self, config: &SandboxConfig) -> Result<String, CriError> {
        let pod = config.pod_name();
        let site = self.site("RunPodSandbox", Some(&pod));
        let r = self
            .call(
                "RunPodSandbox",
                Some(&pod),
                self.timeouts.run_sandbox,
                |mut c, req| async move { c.run_pod_sandbox(req).await },
                cri::RunPodSandboxRequest {
                    config: Some(config.to_cri()),
                    runtime_handler: config.runtime_handler.clone(),
                },
            )
            .await?;
        if r.pod_sandbox_id.is_empty() {
            return Err(CriError::InvalidResponse {
                site,
                reason: "no sandbox ID in the answer".to_string(),
            });
        }
        Ok(r.pod_sandbox_id)
    }

    /// Stops sandbox `id` (the runtime tears its network down with CNI DEL). Stopping a
    /// stopped sandbox succeeds.
    pub async fn stop_sandbox(&self, id: &str) -> Result<(), CriError> {
        self.call(
            "StopPodSandbox",
            Some(id),
            self.timeouts.call,
            |mut c, req| async move { c.stop_pod_sandbox(req).await },
            cri::StopPodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            },
        )
        .await
        .map(drop)
    }

    /// Removes sandbox `id` (stopping it first if needed). Removing a sandbox that does
    /// not exist succeeds.
    pub async fn remove_sandbox(&self, id: &str) -> Result<(), CriError> {
        self.call(
            "RemovePodSandbox",
            Some(id),
            self.timeouts.call,
            |mut c, req| async move { c.remove_pod_sandbox(req).await },
            cri::RemovePodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            },
        )
        .await
        .map(drop)
    }

    fn site(&self, call: &'static str, sandbox: Option<&str>) -> CallSite {
        CallSite {
            endpoint: self.endpoint.clone(),
            call,
            sandbox: sandbox.map(str::to_string),
        }
    }

    /// One unary call with `timeout` as its deadline, both sent to the runtime and
    /// enforced here (a runtime that ignores `grpc-timeout` cannot hang the caller).
    async fn call<Req, Resp, F, Fut>(
        &self,
        name: &'static str,
        sandbox: Option<&str>,
        timeout: Duration,
        f: F,
        message: Req,
    ) -> Result<Resp, CriError>
    where
        F: FnOnce(RuntimeServiceClient<Channel>, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        let mut request = tonic::Request::new(message);
        request.set_timeout(timeout);
        match tokio::time::timeout(timeout, f(self.client.clone(), request)).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) if expired_here(&status) => Err(CriError::Deadline {
                site: self.site(name, sandbox),
                timeout,
            }),
            Ok(Err(status)) => Err(CriError::Rpc {
                site: self.site(name, sandbox),
                status,
            }),
            Err(_) => Err(CriError::Deadline {
                site: self.site(name, sandbox),
                timeout,
            }),
        }
    }
}

/// True when tonic itself ended the call at its `grpc-timeout` (it enforces the header
/// client-side too, and reports it as `Cancelled` with a `TimeoutExpired` source).
fn expired_here(status: &tonic::Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        if e.is::<tonic::TimeoutExpired>() {
            return true;
        }
        source = e.source();
    }
    false
}

//! The one error type of the crate: every failure names the CRI endpoint, the call and,
//! when there is one, the sandbox, so an operator reading a log line knows where to look.

use std::fmt;
use std::time::Duration;

/// Where a failed call went: endpoint, CRI method and (for per-sandbox calls) the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallSite {
    /// The endpoint as the caller gave it (`unix:///run/containerd/containerd.sock`).
    pub endpoint: String,
    /// The CRI method, e.g. `PodSandboxStatus`.
    pub call: &'static str,
    /// The sandbox the call was about, if any (for `RunPodSandbox`: the pod's
    /// `namespace/name`, since there is no ID yet).
    pub sandbox: Option<String>,
}

impl fmt::Display for CallSite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CRI {} on {}", self.call, self.endpoint)?;
        if let Some(sandbox) = &self.sandbox {
            write!(f, " for sandbox {sandbox}")?;
        }
        Ok(())
    }
}

/// A CRI client failure.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    /// The endpoint is neither `unix://<path>` nor a socket path.
    #[error("CRI endpoint {endpoint:?} is not usable: {reason} (give unix:///path/to/socket or /path/to/socket)")]
    InvalidEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The socket could not be connected to (missing, refused, permission) in time.
    #[error("CRI endpoint {endpoint}: cannot connect (is the runtime running and the socket readable by this user?)")]
    Connect {
        /// The endpoint as given.
        endpoint: String,
        /// The transport's error.
        #[source]
        source: tonic::transport::Error,
    },
    /// Connecting took longer than the connect timeout.
    #[error("CRI endpoint {endpoint}: no connection within {timeout:?}")]
    ConnectTimeout {
        /// The endpoint as given.
        endpoint: String,
        /// The connect timeout that expired.
        timeout: Duration,
    },
    /// The runtime answered with a gRPC error.
    #[error("{site}: {code:?}: {message}", code = status.code(), message = status.message())]
    Rpc {
        /// Where the call went.
        site: CallSite,
        /// The gRPC status (code and message as the runtime sent them).
        status: tonic::Status,
    },
    /// No answer within the call's deadline (the deadline is also sent to the runtime).
    #[error("{site}: no answer within {timeout:?}")]
    Deadline {
        /// Where the call went.
        site: CallSite,
        /// The deadline that expired.
        timeout: Duration,
    },
    /// The runtime answered, but the answer is unusable (a missing field, a malformed IP
    /// or verbose info that is not the JSON the runtime documents).
    #[error("{site}: unusable answer: {reason}")]
    InvalidResponse {
        /// Where the call went.
        site: CallSite,
        /// What is wrong with the answer.
        reason: String,
    },
}

impl CriError {
    /// True when the runtime says the sandbox does not exist (any more): a sandbox removed
    /// between a list and a status is not an audit failure.
    pub fn is_not_found(&self) -> bool {
        matches!(self, CriError::Rpc { status, .. } if status.code() == tonic::Code::NotFound)
    }

    /// The gRPC status when the runtime answered with an error.
    pub fn status(&self) -> Option<&tonic::Status> {
        match self {
            CriError::Rpc { status, .. } => Some(status),
            _ => None,
        }
    }
}

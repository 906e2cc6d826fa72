//! Where the runtime listens: `unix:///path`, `unix:path` or a bare socket path, the forms
//! kubelet's `--container-runtime-endpoint` and crictl accept on Linux.

use std::path::PathBuf;

use crate::CriError;

/// The socket path named by a CRI endpoint.
///
/// Accepts `unix:///abs/path`, `unix:relative/path` and a bare path (absolute or
/// relative). Anything else (`tcp://`, `npipe://`, an empty path) is refused with the
/// reason: the CRI runtimes on Linux listen on a Unix socket.
pub fn socket_path(endpoint: &str) -> Result<PathBuf, CriError> {
    let invalid = |reason: &str| CriError::InvalidEndpoint {
        endpoint: endpoint.to_string(),
        reason: reason.to_string(),
    };
    let path = if let Some(rest) = endpoint.strip_prefix("unix://") {
        rest
    } else if let Some(rest) = endpoint.strip_prefix("unix:") {
        rest
    } else if let Some((scheme, _)) = endpoint.split_once("://") {
        return Err(invalid(&format!(
            "scheme {scheme:?} is not supported, only unix sockets are"
        )));
    } else {
        endpoint
    };
    if path.is_empty() {
        return Err(invalid("no socket path"));
    }
    if path.contains('\0') {
        return Err(invalid("the path contains a NUL byte"));
    }
    Ok(PathBuf::from(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unix_form_names_the_same_socket() {
        for e in [
            "unix:///run/containerd/containerd.sock",
            "/run/containerd/containerd.sock",
        ] {
            assert_eq!(
                socket_path(e).unwrap(),
                PathBuf::from("/run/containerd/containerd.sock"),
                "{e}"
            );
        }
        assert_eq!(
            socket_path("unix:run/c.sock").unwrap(),
            PathBuf::from("run/c.sock")
        );
        assert_eq!(socket_path("c.sock").unwrap(), PathBuf::from("c.sock"));
    }

    #[test]
    fn other_schemes_and_empty_paths_are_refused_with_the_endpoint_named() {
        for (e, why) in [
            ("tcp://127.0.0.1:1234", "\"tcp\" is not supported"),
            ("npipe:////./pipe/containerd", "\"npipe\" is not supported"),
            ("unix://", "no socket path"),
            ("", "no socket path"),
            ("unix:///a\0b", "NUL"),
        ] {
            let err = socket_path(e).unwrap_err().to_string();
            assert!(err.contains(why), "{e:?}: {err}");
            assert!(err.contains(&format!("{e:?}")), "{e:?}: {err}");
        }
    }
}

//! What the plugins need of the API server: the kubeconfig their installer wrote (server,
//! token, context), a pod GET and a merge PATCH — over plain HTTP/1.1, as the testkit's
//! fake API serves it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

/// The parts of a kubeconfig the plugins use.
#[derive(Debug, Clone)]
pub struct KubeConfig {
    /// `clusters[].cluster.server`.
    pub server: String,
    /// `users[].user.token` (empty: none).
    pub token: String,
    /// Every context's name.
    pub contexts: Vec<String>,
}

/// Reads `path` (the simple shape [`crate::files::kubeconfig`] and the testkit write).
pub fn load(path: &Path) -> Result<KubeConfig, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("kubeconfig {}: {e}", path.display()))?;
    let field = |key: &str| {
        text.lines()
            .filter_map(|l| l.trim().strip_prefix(key).map(str::trim))
            .next()
            .map(str::to_string)
    };
    let server =
        field("server:").ok_or_else(|| format!("kubeconfig {}: no server", path.display()))?;
    let token = field("token:").unwrap_or_default();
    let mut contexts = Vec::new();
    let mut in_contexts = false;
    for l in text.lines() {
        if !l.starts_with(' ') && !l.starts_with('-') {
            in_contexts = l.starts_with("contexts:");
            continue;
        }
        if in_contexts {
            if let Some(n) = l.strip_prefix("- name:") {
                contexts.push(n.trim().to_string());
            }
        }
    }
    Ok(KubeConfig {
        server,
        token,
        contexts,
    })
}

fn request(
    kc: &KubeConfig,
    method: &str,
    path: &str,
    body: Option<(&str, &str)>,
) -> Result<(u16, Value), String> {
    let hostport = kc
        .server
        .strip_prefix("http://")
        .ok_or_else(|| format!("server {}: only http:// is served here", kc.server))?
        .trim_end_matches('/');
    let mut s = TcpStream::connect(hostport).map_err(|e| format!("connect {hostport}: {e}"))?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {hostport}\r\nAccept: application/json\r\nConnection: close\r\n"
    );
    if !kc.token.is_empty() {
        req += &format!("Authorization: Bearer {}\r\n", kc.token);
    }
    match body {
        Some((ct, b)) => {
            req += &format!(
                "Content-Type: {ct}\r\nContent-Length: {}\r\n\r\n{b}",
                b.len()
            )
        }
        None => req += "\r\n",
    }
    s.write_all(req.as_bytes())
        .map_err(|e| format!("{method} {path}: {e}"))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)
        .map_err(|e| format!("{method} {path}: {e}"))?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("{method} {path}: no HTTP header"))?;
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut body = raw[split + 4..].to_vec();
    let code: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("{method} {path}: bad status line"))?;
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    let v = serde_json::from_slice(&body).unwrap_or(Value::Null);
    Ok((code, v))
}

fn dechunk(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(end) = b[i..].windows(2).position(|w| w == b"\r\n") {
        let size =
            usize::from_str_radix(String::from_utf8_lossy(&b[i..i + end]).trim(), 16).unwrap_or(0);
        i += end + 2;
        if size == 0 || i + size > b.len() {
            break;
        }
        out.extend_from_slice(&b[i..i + size]);
        i += size + 2;
    }
    out
}

/// GET the pod.
pub fn get_pod(kc: &KubeConfig, namespace: &str, name: &str) -> Result<Value, String> {
    let path = format!("/api/v1/namespaces/{namespace}/pods/{name}");
    match request(kc, "GET", &path, None)? {
        (200, v) => Ok(v),
        (code, v) => Err(format!(
            "GET {path}: {code} {}",
            v["message"].as_str().unwrap_or("")
        )),
    }
}

/// Merge-patch the pod's annotations.
pub fn annotate_pod(
    kc: &KubeConfig,
    namespace: &str,
    name: &str,
    key: &str,
    value: &str,
) -> Result<(), String> {
    let path = format!("/api/v1/namespaces/{namespace}/pods/{name}");
    let body = serde_json::json!({"metadata": {"annotations": {key: value}}}).to_string();
    match request(
        kc,
        "PATCH",
        &path,
        Some(("application/merge-patch+json", &body)),
    )? {
        (200, _) => Ok(()),
        (code, v) => Err(format!(
            "PATCH {path}: {code} {}",
            v["message"].as_str().unwrap_or("")
        )),
    }
}

//! `/healthz`, `/readyz` and `/metrics` over a tiny HTTP/1.1 responder (one request per
//! connection, `Connection: close`).

use crate::status::Shared;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The guard loop counts as hung when it has not ticked for this long.
pub const HUNG_AFTER: Duration = Duration::from_secs(30);

/// Asks the health server at `addr` for `/readyz` and returns the HTTP status code: the
/// client side of this module, for `interlock check` and the repair benchmark. `timeout`
/// bounds the connect and the read each.
pub fn readyz_status(addr: std::net::SocketAddr, timeout: Duration) -> std::io::Result<u16> {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect_timeout(&addr, timeout)?;
    c.set_read_timeout(Some(timeout))?;
    write!(
        c,
        "GET /readyz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    // "HTTP/1.1 200": the status line's first 12 bytes are all that is needed.
    let mut head = [0u8; 12];
    c.read_exact(&mut head)?;
    std::str::from_utf8(&head[9..])
        .ok()
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "not an HTTP status line: {:?}",
                    String::from_utf8_lossy(&head)
                ),
            )
        })
}

/// Status code, content type and body for a request line's method and path.
pub fn respond(shared: &Shared, method: &str, path: &str) -> (u16, &'static str, String) {
    let path = path.split('?').next().unwrap_or(path);
    if method != "GET" && method != "HEAD" {
        return (405, "text/plain", "only GET\n".into());
    }
    match path {
        "/healthz" => {
            let since = shared.since_tick();
            if since < HUNG_AFTER {
                (200, "text/plain", "ok\n".into())
            } else {
                (
                    503,
                    "text/plain",
                    format!("guard loop has not run for {since:?}\n"),
                )
            }
        }
        "/readyz" => {
            let r = shared.readiness();
            if r.ready {
                (
                    200,
                    "text/plain",
                    format!("ready: {}\n", r.effective.unwrap_or_default()),
                )
            } else {
                (503, "text/plain", format!("not ready: {}\n", r.reason))
            }
        }
        "/metrics" => (200, "text/plain; version=0.0.4", shared.render_metrics()),
        _ => (
            404,
            "text/plain",
            "not found: try /healthz, /readyz, /metrics\n".into(),
        ),
    }
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Service Unavailable",
    }
}

async fn serve_one(mut s: TcpStream, shared: Arc<Shared>) {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 512];
    let head = loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break Some(end);
        }
        if buf.len() > 8192 {
            break None;
        }
        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break None,
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let (code, ctype, body, head_only) = match head {
        None => (400, "text/plain", "bad request\n".to_string(), false),
        Some(end) => {
            let text = String::from_utf8_lossy(&buf[..end]);
            let mut parts = text.lines().next().unwrap_or("").split_whitespace();
            let (m, p) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            let (c, t, b) = respond(&shared, m, p);
            (c, t, b, m == "HEAD")
        }
    };
    let mut out = format!(
        "HTTP/1.1 {code} {}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        reason(code),
        body.len()
    );
    if !head_only {
        out.push_str(&body);
    }
    let _ = s.write_all(out.as_bytes()).await;
    let _ = s.shutdown().await;
}

/// Serves forever on `listener`.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        match listener.accept().await {
            Ok((s, _)) => {
                tokio::spawn(serve_one(s, shared.clone()));
            }
            Err(e) => {
                crate::warn!("health endpoint accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::Readiness;

    #[test]
    fn routes() {
        let s = Shared::default();
        assert_eq!(respond(&s, "GET", "/healthz").0, 200);
        assert_eq!(respond(&s, "GET", "/readyz").0, 503);
        assert!(respond(&s, "GET", "/readyz").2.contains("starting"));
        s.set_readiness(Readiness {
            ready: true,
            reason: "ok".into(),
            effective: Some("a".into()),
        });
        assert_eq!(respond(&s, "GET", "/readyz?verbose").0, 200);
        assert_eq!(respond(&s, "GET", "/metrics").0, 200);
        assert_eq!(respond(&s, "GET", "/nope").0, 404);
        assert_eq!(respond(&s, "POST", "/readyz").0, 405);
    }

    #[tokio::test]
    async fn answers_over_tcp() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let shared = Arc::new(Shared::default());
        tokio::spawn(serve(l, shared));
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).await.unwrap();
        assert!(
            out.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{out}"
        );
        assert!(out.ends_with("not ready: starting\n"), "{out}");
    }
}

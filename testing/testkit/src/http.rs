//! The test kit's one HTTP client: a plain `GET` on loopback, for the agent's health
//! endpoints in the CLI's tests, node-in-a-box tests and the soak.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// `GET path` on `addr` (HTTP/1.1, `Connection: close`): the status code and the body, or
/// `None` when the server did not connect, answer or close within `timeout` (each of
/// connect, write and read), or answered something that is not HTTP.
pub fn get(addr: SocketAddr, path: &str, timeout: Duration) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, timeout).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    s.set_write_timeout(Some(timeout)).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).ok()?;
    let out = String::from_utf8_lossy(&out);
    let (head, body) = out.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn reads_the_status_and_body_and_gives_up_on_silence() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let mut req = Vec::new();
            let mut chunk = [0u8; 512];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = c.read(&mut chunk).unwrap();
                assert!(n > 0, "the client closed before its request head ended");
                req.extend_from_slice(&chunk[..n]);
            }
            assert!(String::from_utf8_lossy(&req).starts_with("GET /readyz HTTP/1.1\r\n"));
            c.write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 9\r\n\r\nnot ready")
                .unwrap();
            drop(c);
            // A second client that is accepted and never answered.
            let (silent, _) = l.accept().unwrap();
            std::thread::sleep(Duration::from_millis(600));
            drop(silent);
        });
        assert_eq!(
            get(addr, "/readyz", Duration::from_secs(5)),
            Some((503, "not ready".to_string()))
        );
        assert_eq!(get(addr, "/readyz", Duration::from_millis(200)), None);
        server.join().unwrap();
    }
}

//! A one-request-per-connection HTTP/1.1 responder for fake servers in tests (the
//! Kubernetes API is the one component that cannot run here). Loopback or test netns only.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::mpsc::{channel, Receiver};

/// Serves `listener` on a background thread. For each request, `answer(path)` gives the
/// status line (`"200 OK"`) and a JSON body. Every request is reported on the returned
/// channel as `"<request line> <Authorization header>"`.
pub fn serve_json(
    listener: TcpListener,
    answer: impl Fn(&str) -> (String, String) + Send + 'static,
) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { return };
            let Ok(clone) = s.try_clone() else { continue };
            let mut r = BufReader::new(clone);
            let mut first = String::new();
            if r.read_line(&mut first).is_err() {
                continue;
            }
            let mut auth = String::new();
            loop {
                let mut h = String::new();
                match r.read_line(&mut h) {
                    Ok(0) | Err(_) => break,
                    Ok(_) if h.trim().is_empty() => break,
                    Ok(_) => {
                        if h.to_ascii_lowercase().starts_with("authorization:") {
                            auth = h.trim().to_string();
                        }
                    }
                }
            }
            let _ = tx.send(format!("{} {}", first.trim(), auth));
            let path = first.split_whitespace().nth(1).unwrap_or("");
            let (status, body) = answer(path);
            let _ = write!(
                s,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    rx
}

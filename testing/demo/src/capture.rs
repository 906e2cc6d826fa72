//! The independent check of a pod's traffic, both ways, sharing no code with interlock.
//!
//! Outbound is the test kit's check ([`interlock_testkit_node::node::check_capture`]): inside
//! the pod, as an unprivileged user, a connection to a server on the node must land on
//! the proxy's outbound port with the server as its original destination. Inbound is
//! checked here the same way: the node connects to the pod's app port ([`APP_PORT`]),
//! and redirected means it landed on the proxy's inbound port instead of the app.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use interlock_testkit_node::node::{check_capture, in_netns, Capture, CHECK_UID};
use nix::sys::socket::{getsockopt, sockopt::OriginalDst};

/// The app's port inside every pod (what inbound traffic is addressed to).
pub const APP_PORT: u16 = 8080;

/// How long a connection that should arrive is waited for.
const WAIT: Duration = Duration::from_secs(1);

/// The ports a mesh's sidecar proxy listens on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyPorts {
    /// Where outbound traffic must land.
    pub outbound: u16,
    /// Where inbound traffic must land.
    pub inbound: u16,
}

/// Where one connection landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Landing {
    /// On the proxy's port, with the intended destination as its original destination.
    Proxy,
    /// On the intended destination itself: not redirected.
    Direct,
    /// Nowhere within the wait, or the check itself failed (the text says why).
    Lost(String),
}

/// What the check saw for one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Traffic {
    /// The pod's connection to a server on the node.
    pub outbound: Landing,
    /// The node's connection to the pod's app port.
    pub inbound: Landing,
}

impl Traffic {
    /// Both directions landed on the proxy.
    pub fn redirected(&self) -> bool {
        self.outbound == Landing::Proxy && self.inbound == Landing::Proxy
    }

    /// Both directions reached their destination directly.
    pub fn direct(&self) -> bool {
        self.outbound == Landing::Direct && self.inbound == Landing::Direct
    }
}

/// Runs `f` inside the pod's network namespace (on a scratch thread).
fn in_pod<R: Send>(netns: &Path, f: impl FnOnce() -> R + Send) -> Result<R, String> {
    in_netns(netns, f).map_err(|e| e.to_string())
}

/// Checks both directions of `pod`'s traffic (netns `netns`, address `pod_ip`) against a
/// proxy listening on `ports`; `node_ip` is the node's address on the pod's network.
pub fn check(netns: &Path, pod_ip: IpAddr, node_ip: Ipv4Addr, ports: ProxyPorts) -> Traffic {
    match check_or_fail(netns, pod_ip, node_ip, ports) {
        Ok(t) => t,
        Err(e) => Traffic {
            outbound: Landing::Lost(e.clone()),
            inbound: Landing::Lost(e),
        },
    }
}

fn check_or_fail(
    netns: &Path,
    pod_ip: IpAddr,
    node_ip: Ipv4Addr,
    ports: ProxyPorts,
) -> Result<Traffic, String> {
    let outbound = match check_capture(netns, ports.outbound, CHECK_UID, node_ip) {
        Capture::Redirected => Landing::Proxy,
        Capture::NotRedirected => Landing::Direct,
        Capture::NoNetwork => Landing::Lost("the pod has no network".into()),
        Capture::Failed(why) => Landing::Lost(why),
    };
    let [in_proxy, app] = in_pod(netns, move || -> std::io::Result<[TcpListener; 2]> {
        Ok([
            TcpListener::bind((Ipv4Addr::UNSPECIFIED, ports.inbound))?,
            TcpListener::bind((Ipv4Addr::UNSPECIFIED, APP_PORT))?,
        ])
    })?
    .map_err(|e| format!("listening in the pod as its proxy and app: {e}"))?;
    let app_addr = SocketAddr::new(pod_ip, APP_PORT);
    let inbound = match TcpStream::connect_timeout(&app_addr, WAIT) {
        Err(e) => Landing::Lost(format!("connecting to {app_addr} from the node: {e}")),
        Ok(_client) => first_landing(&in_proxy, &app, app_addr)?,
    };
    Ok(Traffic { outbound, inbound })
}

/// Waits for the connection to `target` on the proxy's listener or on the destination's.
fn first_landing(
    proxy: &TcpListener,
    destination: &TcpListener,
    target: SocketAddr,
) -> Result<Landing, String> {
    for l in [proxy, destination] {
        l.set_nonblocking(true).map_err(|e| e.to_string())?;
    }
    let end = Instant::now() + WAIT;
    while Instant::now() < end {
        if let Ok((conn, _)) = proxy.accept() {
            let original = getsockopt(&conn, OriginalDst)
                .map_err(|e| format!("SO_ORIGINAL_DST on the proxy's connection: {e}"))?;
            let original = SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(original.sin_addr.s_addr)),
                u16::from_be(original.sin_port),
            );
            return Ok(if SocketAddr::V4(original) == target {
                Landing::Proxy
            } else {
                Landing::Lost(format!(
                    "landed on the proxy port, but its original destination is {original}, not {target}"
                ))
            });
        }
        if destination.accept().is_ok() {
            return Ok(Landing::Direct);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(Landing::Lost(format!(
        "the connection to {target} arrived nowhere within {WAIT:?}"
    )))
}

/// The pod's sidecar proxy starting: a listener on its outbound port inside the pod,
/// kept as long as the returned socket lives (guard mode probes a pod once its proxy
/// listens).
pub fn proxy_listens(netns: &Path, ports: ProxyPorts) -> Result<TcpListener, String> {
    in_pod(netns, move || {
        TcpListener::bind((Ipv4Addr::UNSPECIFIED, ports.outbound))
    })?
    .map_err(|e| format!("the proxy listening on {}: {e}", ports.outbound))
}

/// A connection a pod opened before the check, to see later whether it was ended.
#[derive(Debug)]
pub struct OpenConnection {
    client: TcpStream,
    _server_end: TcpStream,
}

/// Opens a connection from inside the pod to a server on the node (the app talking to
/// something before anyone protected it).
pub fn open_connection(netns: &Path, node_ip: Ipv4Addr) -> Result<OpenConnection, String> {
    let server = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0))
        .map_err(|e| format!("a server on the node: {e}"))?;
    let port = server.local_addr().map_err(|e| e.to_string())?.port();
    let target = SocketAddr::V4(SocketAddrV4::new(node_ip, port));
    let client = in_pod(netns, move || TcpStream::connect_timeout(&target, WAIT))?
        .map_err(|e| format!("connecting to {target} from the pod: {e}"))?;
    server
        .set_nonblocking(true)
        .map_err(|e| format!("server: {e}"))?;
    let end = Instant::now() + WAIT;
    loop {
        match server.accept() {
            Ok((s, _)) => {
                return Ok(OpenConnection {
                    client,
                    _server_end: s,
                })
            }
            Err(_) if Instant::now() < end => std::thread::sleep(Duration::from_millis(2)),
            Err(e) => return Err(format!("the server on {target} saw no connection: {e}")),
        }
    }
}

impl OpenConnection {
    /// Whether the connection still carries data; `Err` holds how it ended.
    pub fn still_open(&mut self) -> Result<(), std::io::Error> {
        self.client
            .set_read_timeout(Some(Duration::from_millis(200)))?;
        self.client.write_all(b"ping")?;
        let mut b = [0u8; 1];
        match self.client.read(&mut b) {
            // The server end never writes: a timeout means the connection is alive.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(e),
            Ok(0) => Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "closed by the peer",
            )),
            Ok(_) => Ok(()),
        }
    }
}

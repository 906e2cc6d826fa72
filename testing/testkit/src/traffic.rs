//! Test traffic between a test's own namespaces: listeners, connections as a given UID,
//! and what netfilter holds. Nothing here ever addresses a host the test did not create.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::Netns;

/// How long a test waits for a connection that should arrive.
pub const WAIT: Duration = Duration::from_secs(2);

/// The loopback address of a family (`::1` for IPv6) at `port`.
pub fn loopback(v6: bool, port: u16) -> SocketAddr {
    let ip: IpAddr = if v6 {
        Ipv6Addr::LOCALHOST.into()
    } else {
        Ipv4Addr::LOCALHOST.into()
    };
    SocketAddr::new(ip, port)
}

/// The wildcard address of a family (`::` for IPv6) at `port`.
pub fn any(v6: bool, port: u16) -> SocketAddr {
    let ip: IpAddr = if v6 {
        Ipv6Addr::UNSPECIFIED.into()
    } else {
        Ipv4Addr::UNSPECIFIED.into()
    };
    SocketAddr::new(ip, port)
}

/// A non-blocking listener bound inside `ns`.
///
/// A rare `EADDRINUSE` right after the probe released the port was seen once in CI and
/// could not be reproduced (60 probe-then-bind rounds were clean): retry for up to two
/// seconds, print the netns's sockets when a retry was needed so the cause shows up in
/// the log, and fail with them if the port stays taken.
pub fn listen(ns: &Netns, addr: SocketAddr) -> TcpListener {
    let deadline = Instant::now() + WAIT;
    let mut retried = false;
    loop {
        match ns.run(|| TcpListener::bind(addr)) {
            Ok(l) => {
                l.set_nonblocking(true).expect("set_nonblocking");
                return l;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                if !retried {
                    retried = true;
                    eprintln!(
                        "bind {addr} in {}: {e}; retrying. sockets:\n{}",
                        ns.name(),
                        String::from_utf8_lossy(&ns.exec(&["ss", "-tanpe"]).stdout)
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!(
                "bind {addr} in {}: {e}\nsockets:\n{}",
                ns.name(),
                String::from_utf8_lossy(&ns.exec(&["ss", "-tanpe"]).stdout)
            ),
        }
    }
}

/// A non-blocking listener bound inside the netns at `netns` (a path, as a runtime gives
/// it) whose socket belongs to `uid`, like a proxy's: sock_diag reports `uid` as its
/// owner and the owner of every connection it accepts. The socket is created with the
/// thread's filesystem UID set to `uid` (sockets take their owner from it), on a
/// throwaway thread.
pub fn listen_as(netns: &std::path::Path, uid: u32, addr: SocketAddr) -> TcpListener {
    std::thread::scope(|s| {
        s.spawn(|| {
            let file = std::fs::File::open(netns)
                .unwrap_or_else(|e| panic!("open {}: {e}", netns.display()));
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                .unwrap_or_else(|e| panic!("setns {}: {e}", netns.display()));
            nix::unistd::setfsuid(nix::unistd::Uid::from_raw(uid));
            let l = TcpListener::bind(addr)
                .unwrap_or_else(|e| panic!("bind {addr} in {}: {e}", netns.display()));
            nix::unistd::setfsuid(nix::unistd::Uid::from_raw(0));
            l.set_nonblocking(true).expect("set_nonblocking");
            l
        })
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
    })
}

/// Waits up to `within` for a connection on a non-blocking `l`.
pub fn accept_within(l: &TcpListener, within: Duration) -> Option<(TcpStream, SocketAddr)> {
    let deadline = Instant::now() + within;
    loop {
        match l.accept() {
            Ok(c) => return Some(c),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
}

/// Connects from inside `ns` as root (this process); returns the connection's local
/// address. The socket stays open for half a second so the peer can accept it.
pub fn connect_as_root(ns: &Netns, to: SocketAddr) -> SocketAddr {
    ns.run(|| {
        let s = TcpStream::connect_timeout(&to, WAIT)
            .unwrap_or_else(|e| panic!("connect {to} from {}: {e}", ns.name()));
        let local = s.local_addr().expect("local_addr");
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(500));
            drop(s);
        });
        local
    })
}

/// Connects from inside `ns` in a child process running as `uid`/`gid`; true when the
/// connection was established.
pub fn connect_as(ns: &Netns, uid: u32, gid: u32, to: SocketAddr) -> bool {
    let target = format!("/dev/tcp/{}/{}", to.ip(), to.port());
    ns.run(|| {
        Command::new("bash")
            .arg("-c")
            .arg(format!("exec 3<>{target} && sleep 0.3"))
            .uid(uid)
            .gid(gid)
            .output()
            .expect("bash")
            .status
            .success()
    })
}

/// Every NAT rule in `ns`: `iptables-save -t nat` of both families and flavours plus
/// `nft list ruleset`.
pub fn all_rules(ns: &Netns) -> String {
    let mut s = String::new();
    for tool in [
        "iptables-nft-save",
        "ip6tables-nft-save",
        "iptables-legacy-save",
        "ip6tables-legacy-save",
    ] {
        s.push_str(&ns.exec_ok(&[tool, "-t", "nat"]));
    }
    s.push_str(&ns.exec_ok(&["nft", "list", "ruleset"]));
    s
}

/// Asserts that `ns` holds none of interlock's rules (no `interlock` nft table, no `IL_`
/// iptables chain, in any family or flavour).
pub fn assert_no_interlock_rules(ns: &Netns) {
    let tables = ns.exec_ok(&["nft", "list", "tables"]);
    assert!(!tables.contains("interlock"), "nft tables: {tables}");
    let rules = all_rules(ns);
    assert!(
        !rules.contains("IL_") && !rules.contains("interlock"),
        "{rules}"
    );
}

/// Deletes the proxy-UID exemption rule(s) from `ns` behind interlock's back, as a test of
/// tamper detection. `backend` is `nftables`, `iptables-nft` or `iptables-legacy`; for
/// iptables every address family holding the rule loses it. Panics when nothing matched.
pub fn delete_uid_rule(ns: &Netns, backend: &str, uid: u32) {
    let uid = uid.to_string();
    let mut deleted = 0;
    match backend {
        "iptables-nft" | "iptables-legacy" => {
            let flavour = backend.trim_start_matches("iptables-");
            for family in ["iptables", "ip6tables"] {
                let tool = format!("{family}-{flavour}");
                let out = ns.exec(&[
                    &tool,
                    "-t",
                    "nat",
                    "-D",
                    "IL_OUTPUT",
                    "-m",
                    "owner",
                    "--uid-owner",
                    &uid,
                    "-j",
                    "RETURN",
                ]);
                deleted += usize::from(out.status.success());
            }
            assert!(
                deleted > 0,
                "no --uid-owner {uid} rule in IL_OUTPUT of {}",
                ns.name()
            );
        }
        "nftables" => {
            let listing = ns.exec_ok(&["nft", "-a", "list", "ruleset"]);
            let (mut table, mut chain) = (String::new(), String::new());
            for line in listing.lines() {
                let t = line.trim();
                if let Some(rest) = t.strip_prefix("table ") {
                    table = rest.split('{').next().unwrap_or("").trim().to_string();
                } else if let Some(rest) = t.strip_prefix("chain ") {
                    chain = rest.split_whitespace().next().unwrap_or("").to_string();
                } else if t.contains("skuid") && t.contains(&uid) {
                    let handle = t
                        .rsplit("# handle ")
                        .next()
                        .unwrap_or("")
                        .trim()
                        .to_string();
                    let mut args = vec!["nft", "delete", "rule"];
                    args.extend(table.split_whitespace());
                    args.extend([chain.as_str(), "handle", handle.as_str()]);
                    ns.exec_ok(&args);
                    deleted += 1;
                }
            }
            assert!(deleted > 0, "no skuid {uid} rule in:\n{listing}");
        }
        other => panic!("unknown backend {other}"),
    }
}

/// Loads `text` with `tool` (`iptables-restore`, `ip6tables-restore`, …) `--noflush` into
/// the netns at `netns`, as a mesh's own CNI plugin loads its rules (a test playing that
/// plugin). Panics with the tool's stderr when it fails.
pub fn restore_in(netns: &std::path::Path, tool: &str, text: &str) {
    use std::io::Write;
    let mut child = std::process::Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .args([tool, "--noflush"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("nsenter {tool}: {e}"));
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(text.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{tool} in {}: {}",
        netns.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

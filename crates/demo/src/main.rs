//! `make demo`: interlock on a throwaway node built from network namespaces.
//!
//! A "node" netns holds the bridge; two pod netns get their network from a real chain
//! (the reference `bridge` + `host-local` + `portmap` plugins) exactly as containerd runs
//! it, from the config that containerd's rules say is in effect. The interlock agent
//! guards that config; `interlock-cni` protects the meshed pod and proves it with traffic.
//! Everything is created under `il*` names and removed at the end.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Process, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use interlock_protocol::confdir::{self, Runtime};
use interlock_protocol::exec::{exec_plugin, Chain, Command, RuntimeConf};
use interlock_protocol::result::CniResult;
use interlock_redirect::probe::original_dst;
use interlock_redirect::spec::Family;
use interlock_testkit::Netns;
use serde_json::json;

const ANNOTATIONS: &str = "io.kubernetes.cri.pod-annotations";

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("demo failed: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

struct Args {
    bin_dir: PathBuf,
}

fn args() -> Result<Option<Args>> {
    let mut bin_dir = std::env::current_exe()?
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--bin-dir" => bin_dir = it.next().context("--bin-dir needs a directory")?.into(),
            "-h" | "--help" => {
                println!("usage: interlock-demo [--bin-dir DIR]  (DIR holds interlock and interlock-cni)");
                return Ok(None);
            }
            other => bail!("unknown argument {other:?} (try --help)"),
        }
    }
    Ok(Some(Args { bin_dir }))
}

/// The agent process; killed on drop so a failed demo leaves nothing running.
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn step(n: u32, what: &str) {
    println!("\n[{n}] {what}");
}

fn run() -> Result<()> {
    let Some(args) = args()? else {
        return Ok(());
    };
    if !interlock_testkit::is_root() {
        bail!("the demo creates network namespaces and netfilter rules: run it as root (sudo make demo)");
    }
    let interlock = args.bin_dir.join("interlock");
    let plugin = args.bin_dir.join("interlock-cni");
    for b in [&interlock, &plugin] {
        if !b.is_file() {
            bail!(
                "{} not found: build it first (cargo build --release)",
                b.display()
            );
        }
    }
    let ref_plugins = interlock_testkit::cni_plugins_dir();
    if !ref_plugins.join("bridge").is_file() {
        bail!(
            "reference CNI plugins missing in {} (apt-get install containernetworking-plugins)",
            ref_plugins.display()
        );
    }

    println!("== interlock demo: a node in network namespaces, a real CNI chain, a meshed pod ==");
    let work = tempfile::tempdir()?;
    let conf_dir = work.path().join("net.d");
    let bin_dir = work.path().join("bin");
    let state_dir = work.path().join("state");
    let ipam_dir = work.path().join("ipam");
    for d in [&conf_dir, &bin_dir, &state_dir, &ipam_dir] {
        std::fs::create_dir_all(d)?;
    }
    for p in ["bridge", "host-local", "portmap", "loopback"] {
        std::os::unix::fs::symlink(ref_plugins.join(p), bin_dir.join(p))?;
    }
    let node = Netns::new("node")?;
    let web = Netns::new("web")?;
    let db = Netns::new("db")?;
    let bridge = interlock_testkit::unique("br");
    println!(
        "node netns {}, pods {} (web) and {} (db), bridge {bridge}",
        node.name(),
        web.name(),
        db.name()
    );
    println!(
        "conf dir {}  bin dir {}",
        conf_dir.display(),
        bin_dir.display()
    );

    step(1, "the primary CNI writes its config; no mesh entry yet");
    let primary = json!({
        "cniVersion": "1.0.0",
        "name": "demo-net",
        "plugins": [
            {"type": "bridge", "bridge": bridge, "isGateway": true, "ipMasq": false,
             "ipam": {"type": "host-local", "dataDir": ipam_dir, "ranges": [[{"subnet": "10.99.7.0/24"}]],
                      "routes": [{"dst": "0.0.0.0/0"}]},
             "x-vendor-tuning": {"keep": "this field"}},
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    });
    std::fs::write(
        conf_dir.join("10-bridge.conflist"),
        serde_json::to_vec_pretty(&primary)?,
    )?;
    explain(&conf_dir, &bin_dir)?;
    println!("    -> a meshed pod started now would run WITHOUT redirection: this is the race interlock closes");

    step(
        2,
        "the interlock agent starts (owned mode, containerd's loading rules)",
    );
    let health = free_port()?;
    let started = Instant::now();
    let agent = Agent(
        Process::new(&interlock)
            .args([
                "agent",
                "--kube=none",
                "--config-mode=owned",
                "--runtime=containerd",
                // No runtime on this throwaway node: no sandbox audit (check then
                // lists no sandboxes either, from the agent's marker).
                "--cri-endpoint=none",
            ])
            .arg("--cni-conf-dir")
            .arg(&conf_dir)
            .arg("--cni-bin-dir")
            .arg(&bin_dir)
            .arg("--state-dir")
            .arg(&state_dir)
            .arg("--health-addr")
            .arg(health.to_string())
            .arg("--plugin-source")
            .arg(&plugin)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(work.path().join("agent.log"))?)
            .spawn()
            .with_context(|| format!("starting {}", interlock.display()))?,
    );
    wait_ready(health, Duration::from_secs(10))?;
    println!("    /readyz 200 after {} ms", started.elapsed().as_millis());
    println!("    $ interlock check");
    let check = Process::new(&interlock)
        .arg("check")
        .arg("--cni-conf-dir")
        .arg(&conf_dir)
        .arg("--cni-bin-dir")
        .arg(&bin_dir)
        .arg("--state-dir")
        .arg(&state_dir)
        .arg("--health-addr")
        .arg(health.to_string())
        .output()?;
    for line in String::from_utf8_lossy(&check.stdout).lines() {
        println!("    | {line}");
    }
    if !check.status.success() {
        bail!(
            "interlock check says the node is not protected (exit {:?})",
            check.status.code()
        );
    }

    step(
        3,
        "the primary rewrites its file and drops foreign entries (as aws-node and Calico do)",
    );
    let mut rewritten = primary.clone();
    rewritten["plugins"][0]["ipam"]["ranges"] = json!([[{"subnet": "10.99.8.0/24"}]]);
    let clobber = Instant::now();
    interlock_protocol::atomic::write_file_atomic(
        &conf_dir.join("10-bridge.conflist"),
        &serde_json::to_vec_pretty(&rewritten)?,
        None,
    )?;
    let repaired = wait_for(Duration::from_secs(5), || {
        let eff = confdir::load(
            &conf_dir,
            Runtime::Containerd,
            std::slice::from_ref(&bin_dir),
        )
        .ok()?;
        let chosen = eff.chosen?;
        let text = serde_json::to_string(&chosen.list).ok()?;
        (text.contains("interlock-cni") && text.contains("10.99.8.0/24")).then_some(())
    });
    match repaired {
        Some(()) => println!(
            "    owned config re-derived from the new primary (subnet 10.99.8.0/24) {:.1} ms after the rewrite",
            clobber.elapsed().as_secs_f64() * 1e3
        ),
        None => bail!("the agent did not re-converge the config within 5 s (see {})", work.path().join("agent.log").display()),
    }
    explain(&conf_dir, &bin_dir)?;

    step(4, "containerd starts two pods through the effective chain");
    let eff = confdir::load(
        &conf_dir,
        Runtime::Containerd,
        std::slice::from_ref(&bin_dir),
    )?;
    let chosen = eff.chosen.context("no effective network")?;
    let chain = Chain::new(chosen.list.clone(), vec![bin_dir.clone()])?;
    let istio = json!({
        "sidecar.istio.io/status": "{\"containers\":[\"istio-proxy\"]}",
        "traffic.sidecar.istio.io/excludeOutboundPorts": "9999"
    });
    let web_rt = pod_rt("web", &web, istio);
    let db_rt = pod_rt("db", &db, serde_json::Value::Null);
    let t = Instant::now();
    let web_res = node.run(|| chain.add(&web_rt)).context("ADD web")?;
    println!(
        "    web (istio sidecar annotations): ADD ok in {:.1} ms, ip {}",
        t.elapsed().as_secs_f64() * 1e3,
        ip_of(&web_res)?
    );
    let t = Instant::now();
    let db_res = node.run(|| chain.add(&db_rt)).context("ADD db")?;
    println!(
        "    db  (no mesh annotations):      ADD ok in {:.1} ms, ip {}",
        t.elapsed().as_secs_f64() * 1e3,
        ip_of(&db_res)?
    );
    show_rules("web", &web);
    show_rules("db", &db);

    step(5, "traffic proves the redirection");
    let web_ip = ip_of(&web_res)?;
    let db_ip = ip_of(&db_res)?;
    let out = outbound_proof(&web, &db, db_ip)?;
    println!("    web -> {db_ip}:8080 landed on web's proxy port 15001; SO_ORIGINAL_DST = {out}");
    let inb = inbound_proof(&web, &db, web_ip)?;
    println!(
        "    db -> {web_ip}:8080 landed on web's inbound port 15006 (original destination {inb})"
    );

    step(6, "the plugin's STATUS verb needs no agent");
    println!(
        "    agent running: {}",
        status(&plugin, &state_dir, &bin_dir)
    );
    // SIGTERM, as the kubelet sends it: the agent marks itself not ready on the way out
    // and leaves the config in place so a restart opens no window.
    let mut agent = agent;
    Process::new("kill")
        .args(["-TERM", &agent.0.id().to_string()])
        .status()
        .context("kill -TERM the agent")?;
    agent.0.wait()?;
    println!("    agent stopped with SIGTERM (config left in place, by design):");
    // STATUS fails only when an ADD could not protect a meshed pod; the plugin does not
    // need the agent for that (a failing STATUS makes containerd evict the node's pods).
    println!(
        "    agent gone:    {}",
        status(&plugin, &state_dir, &bin_dir)
    );

    step(
        7,
        "pods are deleted; DEL is idempotent (containerd sends it again with no netns)",
    );
    for (name, rt, res) in [("web", &web_rt, &web_res), ("db", &db_rt, &db_res)] {
        node.run(|| chain.del(rt, Some(res)))
            .with_context(|| format!("DEL {name}"))?;
        let late = RuntimeConf {
            netns: String::new(),
            ..rt.clone()
        };
        node.run(|| chain.del(&late, None))
            .with_context(|| format!("second DEL {name}"))?;
        println!("    {name}: DEL ok, second DEL with empty CNI_NETNS ok");
    }
    println!("\ndone: namespaces, bridge and temp dirs are removed on exit");
    Ok(())
}

fn pod_rt(name: &str, ns: &Netns, annotations: serde_json::Value) -> RuntimeConf {
    RuntimeConf::new(
        &format!("demo-{name}-{}", ns.name()),
        &ns.path().display().to_string(),
        "eth0",
    )
    .with_arg("IgnoreUnknown", "1")
    .with_arg("K8S_POD_NAMESPACE", "shop")
    .with_arg("K8S_POD_NAME", name)
    .with_arg("K8S_POD_UID", &format!("uid-{name}"))
    .with_capability(ANNOTATIONS, annotations)
    .with_capability("portMappings", json!([]))
}

fn ip_of(res: &CniResult) -> Result<IpAddr> {
    res.ips_on("eth0")
        .first()
        .and_then(|c| c.ip())
        .context("the chain's result has no IP on eth0")
}

/// Prints which file containerd would load and why, and the plugins in it.
fn explain(conf_dir: &Path, bin_dir: &Path) -> Result<()> {
    let eff = confdir::load(conf_dir, Runtime::Containerd, &[bin_dir.to_path_buf()])?;
    for f in &eff.files {
        let name = f.path.file_name().unwrap_or_default().to_string_lossy();
        println!(
            "    {:<24} {:<12} {}",
            name,
            format!("{:?}", f.verdict),
            f.reason
        );
    }
    match &eff.chosen {
        Some(c) => {
            let types: Vec<String> = c
                .list
                .plugins()
                .iter()
                .map(|p| {
                    p.get("type")
                        .and_then(|t| t.as_str())
                        .unwrap_or("?")
                        .to_string()
                })
                .collect();
            println!(
                "    containerd loads {}: {}",
                c.path.file_name().unwrap_or_default().to_string_lossy(),
                types.join(" -> ")
            );
        }
        None => println!("    containerd has no network: {}", eff.summary),
    }
    Ok(())
}

fn show_rules(name: &str, ns: &Netns) {
    let out = ns.exec(&["nft", "list", "table", "inet", "interlock"]);
    if out.status.success() {
        let text = String::from_utf8_lossy(&out.stdout);
        let rules = text.lines().filter(|l| l.contains("comment \"il:")).count();
        println!("    {name}: table inet interlock with {rules} rules in its netns");
    } else {
        println!("    {name}: no interlock rules in its netns");
    }
}

fn outbound_proof(web: &Netns, db: &Netns, db_ip: IpAddr) -> Result<SocketAddr> {
    std::thread::scope(|s| {
        // db's real service; a redirected connection must NOT reach it.
        let app = s.spawn(|| db.run(|| listen_once(8080, Duration::from_millis(800))));
        std::thread::sleep(Duration::from_millis(100));
        let got = web.run(|| -> Result<SocketAddr> {
            let proxy = TcpListener::bind(("0.0.0.0", 15001))?;
            let mut c =
                TcpStream::connect_timeout(&SocketAddr::new(db_ip, 8080), Duration::from_secs(2))?;
            c.write_all(b"hello")?;
            let accepted = accept_within(&proxy, Duration::from_secs(1)).context(
                "web's proxy port 15001 received nothing: outbound traffic was NOT redirected",
            )?;
            Ok(original_dst(&accepted, Family::V4)?)
        })?;
        let app_saw = app
            .join()
            .map_err(|_| anyhow::anyhow!("listener thread panicked"))?;
        if app_saw.is_some() {
            bail!(
                "db's own listener received web's connection: outbound traffic was NOT redirected"
            );
        }
        Ok(got)
    })
}

fn inbound_proof(web: &Netns, db: &Netns, web_ip: IpAddr) -> Result<SocketAddr> {
    std::thread::scope(|s| {
        let proxy = s.spawn(|| {
            web.run(|| -> Result<SocketAddr> {
                let l = TcpListener::bind(("0.0.0.0", 15006))?;
                let accepted = accept_within(&l, Duration::from_secs(2)).context(
                    "web's inbound port 15006 received nothing: inbound traffic was NOT redirected",
                )?;
                Ok(original_dst(&accepted, Family::V4)?)
            })
        });
        std::thread::sleep(Duration::from_millis(100));
        db.run(|| {
            TcpStream::connect_timeout(&SocketAddr::new(web_ip, 8080), Duration::from_secs(2))
        })
        .context("db -> web:8080")?;
        proxy
            .join()
            .map_err(|_| anyhow::anyhow!("proxy thread panicked"))?
    })
}

/// Accepts one connection on `port` within `timeout`; `None` when nobody came.
fn listen_once(port: u16, timeout: Duration) -> Option<SocketAddr> {
    let l = TcpListener::bind(("0.0.0.0", port)).ok()?;
    accept_within(&l, timeout).and_then(|s| s.peer_addr().ok())
}

fn accept_within(l: &TcpListener, timeout: Duration) -> Option<TcpStream> {
    l.set_nonblocking(true).ok()?;
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if let Ok((s, _)) = l.accept() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

fn status(plugin: &Path, state_dir: &Path, bin_dir: &Path) -> String {
    let conf = json!({"cniVersion": "1.1.0", "name": "demo-net", "type": "interlock-cni", "stateDir": state_dir,
                      "capabilities": {"io.kubernetes.cri.pod-annotations": true}});
    match exec_plugin(
        plugin,
        Command::Status,
        &RuntimeConf::default(),
        &[bin_dir.to_path_buf()],
        conf.to_string().as_bytes(),
    ) {
        Ok(_) => "STATUS ok (code 0): an ADD can protect a meshed pod".into(),
        Err(interlock_protocol::exec::ExecError::Failed { error, .. }) => {
            format!("STATUS code {}: {}", error.code, error.msg)
        }
        Err(e) => format!("STATUS failed: {e}"),
    }
}

fn free_port() -> Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?)
}

fn wait_ready(addr: SocketAddr, timeout: Duration) -> Result<()> {
    wait_for(timeout, || {
        (http_status(addr, "/readyz") == Some(200)).then_some(())
    })
    .with_context(|| format!("agent not ready on http://{addr}/readyz within {timeout:?}"))
}

fn http_status(addr: SocketAddr, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    buf.split_whitespace().nth(1)?.parse().ok()
}

fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

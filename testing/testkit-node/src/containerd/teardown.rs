//! Claiming a kit directory, and undoing everything a kit did: for a kit being dropped
//! and for one whose test process died (found by its free `kit.lock`).

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use interlock_cri::{CriClient, SandboxFilter, Timeouts};
use nix::fcntl::{Flock, FlockArg};

use super::{block_on_thread, kits_dir, octets_in_use, pick_octet, wait_ready, Daemon, Layout};

const KIT_JSON: &str = "kit.json";
const KIT_LOCK: &str = "kit.lock";
/// Where libcni (inside containerd) caches ADD results, named `<network>-<id>-<ifname>`.
const CNI_RESULTS: &str = "/var/lib/cni/results";
/// Where the kit's containerd bind-mounts the netns it creates, as `cni-<uuid>`
/// (`netns_mounts_under_state_dir`): under its CRI plugin's state dir.
fn netns_dir(layout: &Layout) -> PathBuf {
    layout
        .state()
        .join("io.containerd.grpc.v1.cri")
        .join("netns")
}

/// Creates and locks a new kit directory with a free subnet, after tearing down every kit
/// whose owner is gone. All of it under the parent's allocation lock, so that no process
/// sees a directory between its creation and its lock.
pub(crate) fn claim_new_kit() -> io::Result<(Layout, Flock<File>)> {
    let parent = kits_dir();
    fs::create_dir_all(&parent)?;
    let alloc = lock(&parent.join(".alloc.lock"), FlockArg::LockExclusive)
        .map_err(|e| io::Error::other(format!("locking {}: {e}", parent.display())))?;
    let mut live = Vec::new();
    for entry in fs::read_dir(&parent)? {
        let dir = entry?.path();
        if !dir.is_dir() {
            continue;
        }
        match lock(&dir.join(KIT_LOCK), FlockArg::LockExclusiveNonblock) {
            // Its owner holds the lock: a live kit of another test.
            Err(_) => {
                if let Some(layout) = read_layout(&dir) {
                    live.push(layout);
                }
            }
            Ok(stale_lock) => {
                clean_stale(&dir);
                drop(stale_lock);
            }
        }
    }
    let name = interlock_testkit::unique("ctd");
    let octet = pick_octet(&octets_in_use(&live), rand::random())
        .ok_or_else(|| io::Error::other("no free 10.97.n.0/24 for a containerd kit"))?;
    let layout = Layout {
        dir: parent.join(&name),
        bridge: interlock_testkit::unique("br"),
        name,
        subnet_octet: octet,
    };
    fs::create_dir(&layout.dir)?;
    let kit_lock = lock(&layout.dir.join(KIT_LOCK), FlockArg::LockExclusiveNonblock)
        .map_err(|e| io::Error::other(format!("locking {}: {e}", layout.dir.display())))?;
    interlock_contract::atomic::write_file_atomic(
        &layout.dir.join(KIT_JSON),
        &serde_json::to_vec_pretty(&layout)?,
        Some(0o644),
    )?;
    drop(alloc);
    Ok((layout, kit_lock))
}

fn lock(path: &Path, how: FlockArg) -> Result<Flock<File>, String> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Flock::lock(file, how).map_err(|(_, errno)| format!("{}: {errno}", path.display()))
}

fn read_layout(dir: &Path) -> Option<Layout> {
    serde_json::from_slice(&fs::read(dir.join(KIT_JSON)).ok()?).ok()
}

/// Tears down the kit in `dir`, whose owner died.
fn clean_stale(dir: &Path) {
    let problems = match read_layout(dir) {
        Some(layout) => tear_down(&layout, None),
        // Died before writing kit.json: nothing but the directory (and maybe mounts).
        None => {
            let mut problems = Vec::new();
            unmount_under(dir, &mut problems);
            remove_dir(dir, &mut problems);
            problems
        }
    };
    eprintln!(
        "containerd kit: cleaned up {} left by a crashed test{}",
        dir.display(),
        if problems.is_empty() {
            String::new()
        } else {
            format!("; left: {}", problems.join("; "))
        }
    );
}

/// Undoes everything the kit did, in the order that lets each step succeed; returns what
/// could not be undone (empty when all is gone).
pub(crate) fn tear_down(layout: &Layout, daemon: Option<Daemon>) -> Vec<String> {
    let mut problems = Vec::new();
    let mut netns = Vec::new();
    // A daemon that crashed mid-test, or none (a kit whose process died): a daemon on
    // the same directory lets CRI stop and remove the sandboxes the normal way (CNI DEL,
    // netns and IPAM freed). Without one, the steps after the sweep still run.
    let daemon = match daemon {
        Some(d) if answers(layout) => Some(d),
        Some(d) => {
            let _ = d.stop(Duration::from_secs(1));
            restart(layout)
        }
        None => restart(layout),
    };
    if let Some(daemon) = daemon {
        let (seen, errors) = block_on_thread(|| sweep_sandboxes(layout.endpoint()));
        netns = seen;
        problems.extend(errors);
        if let Err(e) = daemon.stop(Duration::from_secs(5)) {
            problems.push(e);
        }
    }
    // Only a sweep that failed leaves containers here; their netns, found through their
    // processes before runc kills them, go too.
    netns.extend(netns_of_runc_containers(layout));
    // Their CNI DELs never ran: libcni's cache still holds their results.
    let unswept = runc_container_ids(layout);
    delete_runc_containers(layout, &mut problems);
    let shim_sockets = shim_sockets(layout);
    for pid in shims_of(&layout.socket()) {
        kill_and_wait(pid, &mut problems);
    }
    for socket in shim_sockets {
        let _ = fs::remove_file(socket);
    }
    // Every netns the daemon made is its own (see `netns_dir`), also one whose sandbox it
    // never recorded: the daemon killed between creating the netns and the sandbox.
    netns.extend(list_netns(layout));
    netns.sort();
    netns.dedup();
    for path in &netns {
        remove_netns(path, &mut problems);
    }
    unmount_under(&layout.dir, &mut problems);
    delete_bridge(&layout.bridge, &mut problems);
    remove_cni_cache(&layout.name, &unswept, &mut problems);
    remove_dir(&layout.dir, &mut problems);
    let footprint = Footprint {
        layout: layout.clone(),
        netns,
        sandboxes: unswept,
    };
    for left in footprint.leftovers() {
        if !problems.contains(&left) {
            problems.push(left);
        }
    }
    problems
}

/// True when CRI answers `Version` on the kit's socket within a second.
fn answers(layout: &Layout) -> bool {
    let quick = Timeouts {
        connect: Duration::from_secs(1),
        call: Duration::from_secs(1),
        ..Timeouts::default()
    };
    block_on_thread(|| async {
        match CriClient::connect_with(&layout.endpoint(), quick).await {
            Ok(client) => client.version().await.is_ok(),
            Err(_) => false,
        }
    })
}

fn restart(layout: &Layout) -> Option<Daemon> {
    if !layout.config().is_file() {
        return None;
    }
    let mut daemon = Daemon::spawn(layout).ok()?;
    match wait_ready(layout, &mut daemon, Duration::from_secs(10)) {
        Ok(()) => Some(daemon),
        Err(_) => {
            let _ = daemon.stop(Duration::from_secs(1));
            None
        }
    }
}

/// Stops and removes every sandbox (NOTREADY ones too), twice if new ones appeared;
/// returns the netns paths they had and what failed.
async fn sweep_sandboxes(endpoint: String) -> (Vec<PathBuf>, Vec<String>) {
    let mut netns = Vec::new();
    let mut problems = Vec::new();
    let timeouts = Timeouts {
        connect: Duration::from_secs(2),
        call: Duration::from_secs(20),
        ..Timeouts::default()
    };
    let client = match CriClient::connect_with(&endpoint, timeouts).await {
        Ok(c) => c,
        Err(e) => return (netns, vec![format!("sweeping sandboxes: {e}")]),
    };
    for _round in 0..2 {
        let sandboxes = match client.list_sandboxes(&SandboxFilter::default()).await {
            Ok(s) => s,
            Err(e) => {
                problems.push(e.to_string());
                break;
            }
        };
        if sandboxes.is_empty() {
            return (netns, problems);
        }
        // All at once: containerd runs the CNI DELs in parallel (20 sandboxes: 1.8 s one
        // by one here).
        let mut tasks = tokio::task::JoinSet::new();
        for sandbox in sandboxes {
            let client = client.clone();
            tasks.spawn(async move { remove_sandbox(&client, &sandbox.id).await });
        }
        while let Some(done) = tasks.join_next().await {
            match done {
                Ok((path, errors)) => {
                    netns.extend(path);
                    problems.extend(errors);
                }
                Err(e) => problems.push(format!("sweeping a sandbox: {e}")),
            }
        }
    }
    match client.list_sandboxes(&SandboxFilter::default()).await {
        Ok(left) if !left.is_empty() => problems.push(format!(
            "sandboxes still listed after the sweep: {}",
            left.iter()
                .map(|s| s.id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
        Ok(_) => {}
        Err(e) => problems.push(e.to_string()),
    }
    (netns, problems)
}

/// Stops and removes one sandbox; returns its netns path (if the runtime named one) and
/// what failed.
async fn remove_sandbox(client: &CriClient, id: &str) -> (Option<PathBuf>, Vec<String>) {
    let mut problems = Vec::new();
    let netns = match client.sandbox_status(id, true).await {
        Ok(status) => status.netns_path().map(Path::to_path_buf),
        Err(_) => None,
    };
    // Remove stops first too; a failed stop (a CNI DEL failing) is retried by it.
    if let Err(e) = client.stop_sandbox(id).await {
        problems.push(e.to_string());
    }
    if let Err(e) = client.remove_sandbox(id).await {
        problems.push(e.to_string());
    }
    (netns, problems)
}

/// `runc delete --force` for every container in the kit's runc root (kills its
/// processes, removes its cgroup). After a clean sweep there are none.
fn delete_runc_containers(layout: &Layout, problems: &mut Vec<String>) {
    let ns_root = layout.runc_root().join(super::K8S_NAMESPACE);
    for id in runc_container_ids(layout) {
        let out = Command::new("runc")
            .arg("--root")
            .arg(&ns_root)
            .args(["delete", "--force", &id])
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => problems.push(format!(
                "runc delete --force {id}: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Err(e) => problems.push(format!("runc delete --force {id}: {e}")),
        }
    }
}

/// The IDs of the containers in the kit's runc root (a sandbox's pause container has the
/// sandbox's ID, which is also the `CNI_CONTAINERID` of its CNI calls).
fn runc_container_ids(layout: &Layout) -> Vec<String> {
    fs::read_dir(layout.runc_root().join(super::K8S_NAMESPACE))
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The `cni-*` netns files that processes of the kit's runc containers are in
/// (matched by namespace inode).
fn netns_of_runc_containers(layout: &Layout) -> Vec<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let ns_root = layout.runc_root().join(super::K8S_NAMESPACE);
    let inodes: Vec<(u64, u64)> = runc_container_ids(layout)
        .into_iter()
        .filter_map(|id| {
            let state: serde_json::Value =
                serde_json::from_slice(&fs::read(ns_root.join(id).join("state.json")).ok()?)
                    .ok()?;
            let pid = state.get("init_process_pid")?.as_u64()?;
            let ns = fs::metadata(format!("/proc/{pid}/ns/net")).ok()?;
            Some((ns.dev(), ns.ino()))
        })
        .collect();
    if inodes.is_empty() {
        return Vec::new();
    }
    list_netns(layout)
        .into_iter()
        .filter(|f| fs::metadata(f).is_ok_and(|m| inodes.contains(&(m.dev(), m.ino()))))
        .collect()
}

/// The `cni-*` netns files of the kit's daemon.
fn list_netns(layout: &Layout) -> Vec<PathBuf> {
    let Ok(files) = fs::read_dir(netns_dir(layout)) else {
        return Vec::new();
    };
    files
        .flatten()
        .filter(|f| f.file_name().to_string_lossy().starts_with("cni-"))
        .map(|f| f.path())
        .collect()
}

/// The ttrpc sockets of the kit's shims (`/run/containerd/s/<hash>`, outside the kit
/// directory), from the `address` file of each task bundle.
fn shim_sockets(layout: &Layout) -> Vec<PathBuf> {
    let bundles = layout
        .state()
        .join("io.containerd.runtime.v2.task")
        .join(super::K8S_NAMESPACE);
    let Ok(entries) = fs::read_dir(bundles) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| fs::read_to_string(e.path().join("address")).ok())
        .filter_map(|a| a.trim().strip_prefix("unix://").map(PathBuf::from))
        .collect()
}

/// PIDs of processes whose command line contains `needle` as one argument.
fn processes_with_arg(needle: &str) -> Vec<(i32, String)> {
    let Ok(proc_dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id() as i32;
    proc_dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != me)
        .filter_map(|pid| {
            let raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args: Vec<String> = raw
                .split(|&b| b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            args.iter()
                .any(|a| a == needle)
                .then(|| (pid, args.join(" ").trim().to_string()))
        })
        .collect()
}

/// Shims started by the daemon on `socket` (`containerd-shim-runc-v2 … -address <socket>`).
fn shims_of(socket: &Path) -> Vec<i32> {
    processes_with_arg(&socket.to_string_lossy())
        .into_iter()
        .filter(|(_, cmdline)| cmdline.contains("containerd-shim"))
        .map(|(pid, _)| pid)
        .collect()
}

fn kill_and_wait(pid: i32, problems: &mut Vec<String>) {
    use nix::sys::signal::{kill, Signal};
    let pid = nix::unistd::Pid::from_raw(pid);
    let _ = kill(pid, Signal::SIGKILL);
    // Not our child (shims re-parent themselves): dead once a zombie, whenever its new
    // parent gets to reaping it.
    for _ in 0..200 {
        if kill(pid, None).is_err() || is_zombie(pid.as_raw()) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    problems.push(format!("shim {pid} survived SIGKILL for 2 s"));
}

fn is_zombie(pid: i32) -> bool {
    // The state follows the parenthesised command name, which may itself hold spaces.
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let (_, rest) = stat.rsplit_once(')')?;
            rest.split_whitespace().next().map(|state| state == "Z")
        })
        .unwrap_or(false)
}

fn remove_netns(path: &Path, problems: &mut Vec<String>) {
    if fs::symlink_metadata(path).is_err() {
        return;
    }
    let _ = nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH);
    if let Err(e) = fs::remove_file(path) {
        problems.push(format!("removing netns {}: {e}", path.display()));
    }
}

/// Mount points at or under `dir`, deepest first.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut found: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mountinfo(p)))
        .filter(|p| p.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            let code: String = chars.by_ref().take(3).collect();
            match u8::from_str_radix(&code, 8) {
                Ok(b) => out.push(b as char),
                Err(_) => {
                    out.push('\\');
                    out.push_str(&code);
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn unmount_under(dir: &Path, problems: &mut Vec<String>) {
    // Stacked mounts need one pass per layer; three is plenty.
    for _ in 0..3 {
        let mounts = mounts_under(dir);
        if mounts.is_empty() {
            return;
        }
        for m in mounts {
            let _ = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH);
        }
    }
    for m in mounts_under(dir) {
        problems.push(format!("still mounted: {}", m.display()));
    }
}

fn delete_bridge(bridge: &str, problems: &mut Vec<String>) {
    if !Path::new("/sys/class/net").join(bridge).exists() {
        return;
    }
    let out = Command::new("ip").args(["link", "del", bridge]).output();
    if !matches!(out, Ok(ref o) if o.status.success()) {
        problems.push(format!("deleting bridge {bridge} failed"));
    }
}

/// libcni cache entries of the kit: those of its own network, and any (such as
/// containerd's `cni-loopback`) of the given sandboxes.
fn cni_cache_entries(network: &str, sandboxes: &[String]) -> Vec<PathBuf> {
    let prefix = format!("{network}-");
    let ids: Vec<String> = sandboxes.iter().map(|id| format!("-{id}-")).collect();
    fs::read_dir(CNI_RESULTS)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.starts_with(&prefix) || ids.iter().any(|id| name.contains(id))
                })
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

fn remove_cni_cache(network: &str, sandboxes: &[String], problems: &mut Vec<String>) {
    for entry in cni_cache_entries(network, sandboxes) {
        if let Err(e) = fs::remove_file(&entry) {
            problems.push(format!("removing {}: {e}", entry.display()));
        }
    }
}

fn remove_dir(dir: &Path, problems: &mut Vec<String>) {
    if !dir.exists() {
        return;
    }
    // Never delete through a mount that is still there (a netns, a rootfs).
    if !mounts_under(dir).is_empty() {
        problems.push(format!("{} kept: mounts remain under it", dir.display()));
        return;
    }
    if let Err(e) = fs::remove_dir_all(dir) {
        problems.push(format!("removing {}: {e}", dir.display()));
    }
}

/// What a kit owns on the host, kept to check afterwards that none of it is left.
#[derive(Debug, Clone)]
pub struct Footprint {
    layout: Layout,
    netns: Vec<PathBuf>,
    sandboxes: Vec<String>,
}

impl Footprint {
    pub(crate) fn of(layout: &Layout) -> Footprint {
        Footprint {
            layout: layout.clone(),
            netns: Vec::new(),
            sandboxes: Vec::new(),
        }
    }

    /// The footprint of the kit in `dir`, read from its `kit.json` and its runc root
    /// (e.g. a kit that a crashed process made).
    pub fn load(dir: &Path) -> Option<Footprint> {
        read_layout(dir).map(|layout| {
            let mut footprint = Footprint::of(&layout);
            footprint.sandboxes = runc_container_ids(&layout);
            footprint
        })
    }

    /// Also checks what is left of these sandboxes (e.g. the ones the test ran).
    pub fn with_sandboxes(mut self, ids: impl IntoIterator<Item = String>) -> Footprint {
        self.sandboxes.extend(ids);
        self
    }

    /// The kit's directory.
    pub fn dir(&self) -> &Path {
        &self.layout.dir
    }

    /// Also checks these netns files (e.g. the sandboxes' the test saw).
    pub fn with_netns(mut self, paths: impl IntoIterator<Item = PathBuf>) -> Footprint {
        self.netns.extend(paths);
        self
    }

    /// Everything of the kit still on the host: its daemon or shims, processes whose root
    /// is in the kit, mounts under its directory, the netns files, its bridge, the CNI
    /// cache entries of its network and of the sandboxes, its directory. Empty after a clean teardown.
    pub fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        let socket = self.layout.socket();
        for (pid, cmdline) in processes_with_arg(&socket.to_string_lossy())
            .into_iter()
            .chain(processes_with_arg(&self.layout.config().to_string_lossy()))
        {
            left.push(format!("process {pid} still runs: {cmdline}"));
        }
        for pid in processes_rooted_under(&self.layout.dir) {
            left.push(format!("process {pid} still runs in a rootfs of the kit"));
        }
        for m in mounts_under(&self.layout.dir) {
            left.push(format!("still mounted: {}", m.display()));
        }
        for ns in &self.netns {
            if fs::symlink_metadata(ns).is_ok() {
                left.push(format!("netns {} still exists", ns.display()));
            }
        }
        if Path::new("/sys/class/net")
            .join(&self.layout.bridge)
            .exists()
        {
            left.push(format!("bridge {} still exists", self.layout.bridge));
        }
        for entry in cni_cache_entries(&self.layout.name, &self.sandboxes) {
            left.push(format!("CNI cache entry {} still exists", entry.display()));
        }
        if self.layout.dir.exists() {
            left.push(format!("{} still exists", self.layout.dir.display()));
        }
        left
    }
}

fn processes_rooted_under(dir: &Path) -> Vec<i32> {
    let Ok(proc_dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    proc_dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            fs::read_link(format!("/proc/{pid}/root")).is_ok_and(|root| root.starts_with(dir))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape_mountinfo(r"/a\040b/c"), "/a b/c");
        assert_eq!(unescape_mountinfo(r"/plain"), "/plain");
        assert_eq!(unescape_mountinfo(r"/x\134y"), r"/x\y");
    }
}

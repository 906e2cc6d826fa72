//! The runtime side of the protocol: run one plugin binary, or a whole chain.
//!
//! What libcni does, in Rust: a plugin gets `CNI_COMMAND`, `CNI_CONTAINERID`,
//! `CNI_NETNS`, `CNI_IFNAME`, `CNI_ARGS` and `CNI_PATH` (on top of the caller's
//! environment) and its config on stdin; its stdout is the result or a CNI error, its
//! stderr is captured into the error. A [`Chain`] runs a [`NetworkConfigList`]: ADD in
//! order threading `prevResult`, DEL in reverse, CHECK, GC with
//! `cni.dev/valid-attachments`, STATUS and VERSION, and injects `name`, `cniVersion`,
//! `prevResult` and — only for capabilities a plugin declares — `runtimeConfig`.
//!
//! Plugins are started from the calling thread, so a caller that entered a network
//! namespace on that thread runs them inside it.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command as Process, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use interlock_cni_types::error::{self as cni_error, CniError};
use interlock_cni_types::result::{CniResult, ResultError};
use interlock_cni_types::verb::Command;
use interlock_cni_types::version::CniVersion;

use crate::conf::NetworkConfigList;
use crate::error::ConfError;
use crate::result_cache::ResultCache;
use crate::runtime_conf::RuntimeConf;

/// One entry of `cni.dev/valid-attachments` for GC.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Attachment {
    /// The container (sandbox) id.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// The interface name inside it.
    pub ifname: String,
}

/// A plugin's answer to VERSION.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginInfo {
    /// The version the answer is written in.
    #[serde(rename = "cniVersion", default)]
    pub cni_version: String,
    /// Every spec version the plugin accepts.
    #[serde(rename = "supportedVersions", default)]
    pub supported_versions: Vec<String>,
    /// The build an interlock plugin says it is ([`interlock_cni_types::skel::Plugin::build_version`]);
    /// other plugins do not answer it.
    #[serde(
        rename = "interlockVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub interlock_version: Option<String>,
}

/// What went wrong running a plugin or a chain.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The binary for `plugin` is not in any plugin directory.
    #[error("failed to find plugin {plugin:?} in path [{dirs}]: install it there or fix the plugin directories")]
    NotFound {
        /// The plugin `type`.
        plugin: String,
        /// The directories searched, `:`-joined.
        dirs: String,
    },
    /// The binary could not be started or talked to.
    #[error("running plugin {path}: {source}")]
    Spawn {
        /// Path of the binary.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The plugin exited non-zero; its stdout error and stderr are kept.
    #[error("plugin {plugin} {command} failed: {error}{}", if stderr.trim().is_empty() { String::new() } else { format!("; stderr: {}", stderr.trim()) })]
    Failed {
        /// The plugin `type`.
        plugin: String,
        /// The verb.
        command: Command,
        /// The CNI error it printed (or one describing its silent failure).
        error: Box<CniError>,
        /// What it wrote to stderr.
        stderr: String,
    },
    /// The plugin succeeded but its stdout is not a valid result.
    #[error("plugin {plugin} {command} returned an invalid result: {source}; stdout: {stdout:?}")]
    BadResult {
        /// The plugin `type`.
        plugin: String,
        /// The verb.
        command: Command,
        /// Why the result did not parse.
        source: ResultError,
        /// The raw stdout.
        stdout: String,
    },
    /// The chain's version does not allow this verb.
    #[error("configuration version {version:?} does not support the {command} command")]
    Unsupported {
        /// The verb.
        command: Command,
        /// The chain's version.
        version: String,
    },
    /// The config itself is unusable.
    #[error("invalid network config: {0}")]
    Config(#[from] ConfError),
    /// Several plugins failed (GC collects every failure).
    #[error("{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    Many(Vec<ExecError>),
    /// The call was refused before any plugin ran (libcni's input validation).
    #[error("refused before running any plugin: {0}")]
    Rejected(Box<CniError>),
    /// The plugin did not finish in time; it and its process group were killed.
    #[error("plugin {path} {command} did not answer within {after:?}: killed it and every process it started")]
    TimedOut {
        /// Path of the binary.
        path: PathBuf,
        /// The verb.
        command: Command,
        /// The time box.
        after: Duration,
    },
    /// Reading or writing the result cache failed.
    #[error("result cache: {0}")]
    Cache(#[from] std::io::Error),
}

impl ExecError {
    /// The CNI error code behind this failure, when the plugin reported one.
    pub fn cni_code(&self) -> Option<u32> {
        match self {
            ExecError::Failed { error, .. } | ExecError::Rejected(error) => Some(error.code),
            _ => None,
        }
    }
}

/// libcni's `pluginErr`: turn a failed plugin's stdout/stderr into a CNI error.
fn plugin_error(stdout: &[u8], stderr: &str, status: std::process::ExitStatus) -> CniError {
    if stdout.iter().all(u8::is_ascii_whitespace) {
        let msg = if stderr.trim().is_empty() {
            format!("netplugin failed with no error message: {status}")
        } else {
            format!("netplugin failed: {:?}", stderr.trim())
        };
        return CniError::new("", 0, msg);
    }
    match serde_json::from_slice::<CniError>(stdout) {
        Ok(e) => e,
        Err(e) => CniError::new(
            "",
            0,
            format!(
                "netplugin failed but error parsing its diagnostic message {:?}: {e}",
                String::from_utf8_lossy(stdout)
            ),
        ),
    }
}

fn is_executable_file(p: &Path) -> bool {
    fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Finds a plugin binary in `bin_dirs` (libcni `FindInPath`).
pub fn find_plugin(plugin: &str, bin_dirs: &[PathBuf]) -> Option<PathBuf> {
    if plugin.is_empty() || plugin.contains('/') {
        return None;
    }
    bin_dirs
        .iter()
        .map(|d| d.join(plugin))
        .find(|p| is_executable_file(p))
}

/// The process of plugin `path` for `command`: the caller's environment minus any stale
/// `CNI_*`, with `CNI_COMMAND` and `CNI_PATH` (the bin dirs, `:`-separated) set.
fn plugin_process(path: &Path, command: Command, bin_dirs: &[PathBuf]) -> Process {
    let cni_path = bin_dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(":");
    let mut cmd = Process::new(path);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("CNI_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("CNI_COMMAND", command.as_str())
        .env("CNI_PATH", cni_path);
    cmd
}

/// Runs `path` once with `command`, the attachment's environment and `stdin`; returns
/// its stdout on success. The caller's environment is passed on (minus stale `CNI_*`).
pub fn exec_plugin(
    path: &Path,
    command: Command,
    rt: &RuntimeConf,
    bin_dirs: &[PathBuf],
    stdin: &[u8],
) -> Result<Vec<u8>, ExecError> {
    let plugin = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut cmd = plugin_process(path, command, bin_dirs);
    cmd.env("CNI_CONTAINERID", &rt.container_id)
        .env("CNI_NETNS", &rt.netns)
        .env("CNI_IFNAME", &rt.ifname)
        .env("CNI_ARGS", rt.cni_args())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let spawn_err = |source| ExecError::Spawn {
        path: path.to_path_buf(),
        source,
    };
    let mut child = cmd.spawn().map_err(spawn_err)?;
    if let Some(mut input) = child.stdin.take() {
        // A plugin may exit without reading stdin (e.g. VERSION): ignore EPIPE.
        if let Err(e) = input.write_all(stdin) {
            if e.kind() != std::io::ErrorKind::BrokenPipe {
                let _ = child.kill();
                let _ = child.wait();
                return Err(spawn_err(e));
            }
        }
    }
    let out = child.wait_with_output().map_err(spawn_err)?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        return Err(ExecError::Failed {
            plugin,
            command,
            error: Box::new(plugin_error(&out.stdout, &stderr, out.status)),
            stderr,
        });
    }
    Ok(out.stdout)
}

/// How long a plugin may take to answer VERSION before it (and every process it
/// started) is killed. A real plugin answers in milliseconds.
pub const VERSION_TIMEOUT: Duration = Duration::from_secs(3);

/// The most of a VERSION answer (or its stderr) that is kept.
const MAX_VERSION_OUTPUT: usize = 64 * 1024;

/// Asks a plugin binary which versions it supports (stdin `{"cniVersion": <latest>}`),
/// within [`VERSION_TIMEOUT`].
pub fn plugin_version(path: &Path, bin_dirs: &[PathBuf]) -> Result<PluginInfo, ExecError> {
    plugin_version_within(path, bin_dirs, VERSION_TIMEOUT)
}

/// [`plugin_version`] with a time box. The plugin runs in a process group of its own;
/// when it does not answer within `timeout`, or once it has exited, the whole group is
/// killed, so a plugin that leaves children behind cannot hold the caller (nor its
/// output pipe) open.
pub fn plugin_version_within(
    path: &Path,
    bin_dirs: &[PathBuf],
    timeout: Duration,
) -> Result<PluginInfo, ExecError> {
    let stdin = format!("{{\"cniVersion\":\"{}\"}}", CniVersion::LATEST);
    let plugin = path.display().to_string();
    let out = run_time_boxed(path, Command::Version, bin_dirs, stdin.as_bytes(), timeout)?;
    if !out.status.success() {
        return Err(ExecError::Failed {
            plugin,
            command: Command::Version,
            error: Box::new(plugin_error(&out.stdout, &out.stderr, out.status)),
            stderr: out.stderr,
        });
    }
    serde_json::from_slice(&out.stdout).map_err(|e| ExecError::BadResult {
        plugin,
        command: Command::Version,
        source: ResultError::Json(e),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
    })
}

struct BoxedOutput {
    status: std::process::ExitStatus,
    stdout: Vec<u8>,
    stderr: String,
}

/// Kills every process of the group `pgid` (ESRCH: none left).
fn kill_group(pgid: u32) {
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pgid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
}

/// Reads what is available on a non-blocking pipe; `true` at end of file.
fn drain(r: &mut impl std::io::Read, into: &mut Vec<u8>) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match r.read(&mut buf) {
            Ok(0) => return true,
            Ok(n) => {
                let room = MAX_VERSION_OUTPUT.saturating_sub(into.len());
                into.extend_from_slice(&buf[..n.min(room)]);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}

fn set_nonblocking(fd: &impl std::os::fd::AsRawFd) -> std::io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let flags = fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL).map_err(std::io::Error::from)?;
    fcntl(
        fd.as_raw_fd(),
        FcntlArg::F_SETFL(OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK),
    )
    .map_err(std::io::Error::from)?;
    Ok(())
}

/// Runs `path` with `command` in its own process group, feeding `stdin`, and collects
/// its output until it exits and its pipes close, or `timeout` passes.
fn run_time_boxed(
    path: &Path,
    command: Command,
    bin_dirs: &[PathBuf],
    stdin: &[u8],
    timeout: Duration,
) -> Result<BoxedOutput, ExecError> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    use std::os::unix::process::CommandExt;
    let spawn_err = |source| ExecError::Spawn {
        path: path.to_path_buf(),
        source,
    };
    let mut cmd = plugin_process(path, command, bin_dirs);
    cmd.process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let deadline = Instant::now() + timeout;
    let mut child = cmd.spawn().map_err(spawn_err)?;
    let pgid = child.id();
    let fail = |child: &mut std::process::Child, e: std::io::Error| {
        kill_group(pgid);
        let _ = child.wait();
        spawn_err(e)
    };
    if let Some(mut input) = child.stdin.take() {
        // The request fits in the pipe buffer, so this does not block; a plugin may exit
        // without reading it (EPIPE).
        if let Err(e) = input.write_all(stdin) {
            if e.kind() != std::io::ErrorKind::BrokenPipe {
                return Err(fail(&mut child, e));
            }
        }
    }
    let (Some(mut out), Some(mut err)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(fail(&mut child, std::io::Error::other("pipes missing")));
    };
    if let Err(e) = set_nonblocking(&out).and_then(|()| set_nonblocking(&err)) {
        return Err(fail(&mut child, e));
    }
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let (mut out_done, mut err_done) = (false, false);
    let mut status = None;
    loop {
        if !out_done {
            out_done = drain(&mut out, &mut stdout);
        }
        if !err_done {
            err_done = drain(&mut err, &mut stderr);
        }
        if status.is_none() {
            match child.try_wait() {
                Ok(Some(s)) => {
                    // Whatever it left behind goes with it.
                    kill_group(pgid);
                    status = Some(s);
                }
                Ok(None) => {}
                Err(e) => return Err(fail(&mut child, e)),
            }
        }
        if let (Some(s), true, true) = (status, out_done, err_done) {
            return Ok(BoxedOutput {
                status: s,
                stdout,
                stderr: String::from_utf8_lossy(&stderr).into_owned(),
            });
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            kill_group(pgid);
            let _ = child.wait();
            return Err(ExecError::TimedOut {
                path: path.to_path_buf(),
                command,
                after: timeout,
            });
        }
        // Wake on output, or soon to look at the exit status.
        let wait_ms = left.min(Duration::from_millis(5)).as_millis() as u16;
        let mut fds = vec![];
        if !out_done {
            fds.push(PollFd::new(out.as_fd(), PollFlags::POLLIN));
        }
        if !err_done {
            fds.push(PollFd::new(err.as_fd(), PollFlags::POLLIN));
        }
        if fds.is_empty() {
            std::thread::sleep(Duration::from_millis(wait_ms.max(1) as u64));
        } else {
            let _ = poll(&mut fds, PollTimeout::from(wait_ms.max(1)));
        }
    }
}

/// A network configuration list bound to plugin directories, ready to run.
#[derive(Debug, Clone)]
pub struct Chain {
    list: NetworkConfigList,
    bin_dirs: Vec<PathBuf>,
    version: CniVersion,
    cache: Option<ResultCache>,
}

fn valid_name_chars(s: &str) -> bool {
    let mut bytes = s.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphanumeric())
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-')
}

/// libcni's input checks (`pkg/utils`): container ID, network name and interface name
/// must be usable as file names and as a Linux ifname.
pub fn validate_attachment(network: &str, rt: &RuntimeConf) -> Result<(), CniError> {
    let err = |code, msg: &str| Err(CniError::new("", code, msg));
    if rt.container_id.is_empty() {
        return err(cni_error::UNKNOWN_CONTAINER, "missing containerID");
    }
    if !valid_name_chars(&rt.container_id) {
        return err(
            cni_error::INVALID_ENVIRONMENT,
            &format!("invalid characters in containerID {:?}", rt.container_id),
        );
    }
    if network.is_empty() {
        return err(cni_error::INVALID_NETWORK_CONFIG, "missing network name");
    }
    if !valid_name_chars(network) {
        return err(
            cni_error::INVALID_NETWORK_CONFIG,
            &format!("invalid characters found in network name {network:?}"),
        );
    }
    let ifname = &rt.ifname;
    if ifname.is_empty() {
        return err(cni_error::INVALID_ENVIRONMENT, "interface name is empty");
    }
    if ifname.len() > 15 {
        return err(
            cni_error::INVALID_ENVIRONMENT,
            &format!("interface name {ifname:?} is too long (15 bytes at most)"),
        );
    }
    if ifname == "." || ifname == ".." {
        return err(
            cni_error::INVALID_ENVIRONMENT,
            &format!("interface name {ifname:?} is . or .."),
        );
    }
    if ifname.contains(['/', ':']) || ifname.chars().any(char::is_whitespace) {
        return err(
            cni_error::INVALID_ENVIRONMENT,
            &format!("interface name {ifname:?} contains / or : or whitespace characters"),
        );
    }
    Ok(())
}

impl Chain {
    /// Binds `list` to `bin_dirs`. Fails when the list's version is not one interlock
    /// supports (0.3.0 to 1.1.0).
    pub fn new(list: NetworkConfigList, bin_dirs: Vec<PathBuf>) -> Result<Chain, ExecError> {
        let version = list.cni_version()?;
        Ok(Chain {
            list,
            bin_dirs,
            version,
            cache: None,
        })
    }

    /// Keeps results in a libcni-format cache, as runtimes do: ADD records the result,
    /// DEL without a `prevResult` uses the cached one and then forgets it, and
    /// [`Chain::check_cached`] checks against it.
    pub fn with_cache(mut self, cache: ResultCache) -> Chain {
        self.cache = Some(cache);
        self
    }

    /// The result cache, if any.
    pub fn cache(&self) -> Option<&ResultCache> {
        self.cache.as_ref()
    }

    fn validate(&self, rt: &RuntimeConf) -> Result<(), ExecError> {
        validate_attachment(self.list.name(), rt).map_err(|mut e| {
            e.cni_version = self.version.to_string();
            ExecError::Rejected(Box::new(e))
        })
    }

    fn cached_result(&self, rt: &RuntimeConf) -> Result<Option<CniResult>, ExecError> {
        let Some(cache) = &self.cache else {
            return Ok(None);
        };
        Ok(cache
            .read(self.list.name(), &rt.container_id, &rt.ifname)?
            .and_then(|e| e.result_as(self.version)))
    }

    /// The list being run.
    pub fn list(&self) -> &NetworkConfigList {
        &self.list
    }

    /// The version the chain runs with.
    pub fn version(&self) -> CniVersion {
        self.version
    }

    /// The plugin directories (`CNI_PATH`).
    pub fn bin_dirs(&self) -> &[PathBuf] {
        &self.bin_dirs
    }

    fn find(&self, plugin: &str) -> Result<PathBuf, ExecError> {
        find_plugin(plugin, &self.bin_dirs).ok_or_else(|| ExecError::NotFound {
            plugin: plugin.to_string(),
            dirs: self
                .bin_dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(":"),
        })
    }

    /// The exact stdin plugin `index` gets (libcni `buildOneConfig`): its own entry with
    /// `name` and `cniVersion` set, `prevResult` when given, and `runtimeConfig` holding
    /// the capability arguments for the capabilities it declares (only if any match).
    pub fn plugin_config(
        &self,
        index: usize,
        prev: Option<&CniResult>,
        rt: &RuntimeConf,
    ) -> Map<String, Value> {
        let mut conf = self.list.plugins()[index]
            .as_object()
            .cloned()
            .unwrap_or_default();
        conf.insert("name".into(), Value::String(self.list.name().to_string()));
        conf.insert("cniVersion".into(), Value::String(self.version.to_string()));
        if let Some(prev) = prev {
            conf.insert("prevResult".into(), prev.to_value());
        }
        let mut rc = Map::new();
        if let Some(view) = self.list.plugin_confs().get(index) {
            for cap in view.capabilities() {
                if let Some(v) = rt.capability_args.get(cap) {
                    rc.insert(cap.to_string(), v.clone());
                }
            }
        }
        if !rc.is_empty() {
            conf.insert("runtimeConfig".into(), Value::Object(rc));
        }
        conf
    }

    fn run_one(
        &self,
        index: usize,
        command: Command,
        conf: &Map<String, Value>,
        rt: &RuntimeConf,
    ) -> Result<Vec<u8>, ExecError> {
        let plugin = self.list.plugin_confs()[index].plugin_type().to_string();
        let path = self.find(&plugin)?;
        let stdin = serde_json::to_vec(conf).unwrap_or_default();
        exec_plugin(&path, command, rt, &self.bin_dirs, &stdin).map_err(|e| match e {
            ExecError::Failed {
                command,
                error,
                stderr,
                ..
            } => ExecError::Failed {
                plugin,
                command,
                error,
                stderr,
            },
            other => other,
        })
    }

    /// ADD: every plugin in order, each getting the previous one's result; returns the
    /// last result (in the version the last plugin wrote it).
    pub fn add(&self, rt: &RuntimeConf) -> Result<CniResult, ExecError> {
        self.validate(rt)?;
        let mut each = self.add_each(rt)?;
        each.pop().map(|(_, r)| r).ok_or_else(|| {
            ExecError::Config(ConfError::Field {
                field: "plugins".into(),
                problem: "empty: no plugins in list".into(),
            })
        })
    }

    /// ADD like [`Chain::add`], returning every plugin's result in chain order as
    /// `(type, result)`: what each plugin made of its predecessor's result.
    pub fn add_each(&self, rt: &RuntimeConf) -> Result<Vec<(String, CniResult)>, ExecError> {
        self.validate(rt)?;
        let mut results: Vec<(String, CniResult)> = Vec::new();
        for i in 0..self.list.plugins().len() {
            let conf = self.plugin_config(i, results.last().map(|(_, r)| r), rt);
            let out = self.run_one(i, Command::Add, &conf, rt)?;
            let plugin = self.list.plugin_confs()[i].plugin_type().to_string();
            let result = CniResult::parse(&out, Some(self.version)).map_err(|source| {
                ExecError::BadResult {
                    plugin: plugin.clone(),
                    command: Command::Add,
                    source,
                    stdout: String::from_utf8_lossy(&out).into_owned(),
                }
            })?;
            results.push((plugin, result));
        }
        if let (Some(cache), Some((_, last))) = (&self.cache, results.last()) {
            cache.write(self.list.name(), self.list.to_json().as_bytes(), rt, last)?;
        }
        Ok(results)
    }

    /// DEL: every plugin in reverse order. `prev` (the cached ADD result) is passed from
    /// 0.4.0 on, as libcni does; pass `None` for a late DEL without a cached result.
    /// With a cache, a `None` `prev` is replaced by the cached result, and the entry is
    /// removed once every plugin succeeded.
    pub fn del(&self, rt: &RuntimeConf, prev: Option<&CniResult>) -> Result<(), ExecError> {
        self.validate(rt)?;
        let prev = if self.version.del_has_prev_result() {
            match prev {
                Some(p) => Some(p.convert(self.version)),
                None => self.cached_result(rt)?,
            }
        } else {
            None
        };
        for i in (0..self.list.plugins().len()).rev() {
            let conf = self.plugin_config(i, prev.as_ref(), rt);
            self.run_one(i, Command::Del, &conf, rt)?;
        }
        if let Some(cache) = &self.cache {
            cache.remove(self.list.name(), &rt.container_id, &rt.ifname)?;
        }
        Ok(())
    }

    /// CHECK against the cached ADD result (needs [`Chain::with_cache`] and a cached entry).
    pub fn check_cached(&self, rt: &RuntimeConf) -> Result<(), ExecError> {
        match self.cached_result(rt)? {
            Some(prev) => self.check(rt, &prev),
            None => Err(ExecError::Cache(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!(
                    "no cached result for network {:?} container {} interface {}: nothing to CHECK against",
                    self.list.name(),
                    rt.container_id,
                    rt.ifname
                ),
            ))),
        }
    }

    /// CHECK: every plugin in order with the cached ADD result. An error for versions
    /// before 0.4.0; a no-op when the list sets `disableCheck`.
    pub fn check(&self, rt: &RuntimeConf, prev: &CniResult) -> Result<(), ExecError> {
        self.validate(rt)?;
        if !self.version.supports_check() {
            return Err(ExecError::Unsupported {
                command: Command::Check,
                version: self.version.to_string(),
            });
        }
        if self.list.disable_check() {
            return Ok(());
        }
        let prev = prev.convert(self.version);
        for i in 0..self.list.plugins().len() {
            let conf = self.plugin_config(i, Some(&prev), rt);
            self.run_one(i, Command::Check, &conf, rt)?;
        }
        Ok(())
    }

    /// GC (1.1.0+): every plugin gets `cni.dev/valid-attachments` (and the spec's older
    /// spelling `cni.dev/attachments`); every failure is collected. A no-op before 1.1.0
    /// or when the list sets `disableGC`.
    pub fn gc(&self, valid: &[Attachment]) -> Result<(), ExecError> {
        if !self.version.supports_gc_and_status() || self.list.disable_gc() {
            return Ok(());
        }
        let attachments = serde_json::to_value(valid).unwrap_or(Value::Array(Vec::new()));
        let rt = RuntimeConf::default();
        let mut errors = Vec::new();
        for i in 0..self.list.plugins().len() {
            let mut conf = self.plugin_config(i, None, &rt);
            conf.remove("runtimeConfig");
            conf.insert("cni.dev/valid-attachments".into(), attachments.clone());
            conf.insert("cni.dev/attachments".into(), attachments.clone());
            if let Err(e) = self.run_one(i, Command::Gc, &conf, &rt) {
                errors.push(e);
            }
        }
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(ExecError::Many(errors)),
        }
    }

    /// STATUS (1.1.0+): every plugin in order; the first failure is returned (code 50/51
    /// means "do not create pods"). A no-op before 1.1.0.
    pub fn status(&self) -> Result<(), ExecError> {
        if !self.version.supports_gc_and_status() {
            return Ok(());
        }
        let rt = RuntimeConf::default();
        for i in 0..self.list.plugins().len() {
            let mut conf = self.plugin_config(i, None, &rt);
            conf.remove("runtimeConfig");
            self.run_one(i, Command::Status, &conf, &rt)?;
        }
        Ok(())
    }

    /// VERSION for every plugin of the chain, in order: `(type, answer)`.
    pub fn versions(&self) -> Result<Vec<(String, PluginInfo)>, ExecError> {
        self.list
            .plugin_confs()
            .iter()
            .map(|p| {
                let path = self.find(p.plugin_type())?;
                Ok((
                    p.plugin_type().to_string(),
                    plugin_version(&path, &self.bin_dirs)?,
                ))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conf::parse_conflist;

    #[test]
    fn a_slow_version_is_cut_off_with_everything_it_started() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let pids = d.path().join("pids");
        let plugin = d.path().join("slow");
        // Leaves a grandchild holding its stdout, then waits for it.
        std::fs::write(
            &plugin,
            format!(
                "#!/bin/sh\nsleep 30 &\necho $! >> {}\nwait\n",
                pids.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let t0 = Instant::now();
        let e = plugin_version_within(&plugin, &[], Duration::from_millis(300)).unwrap_err();
        assert!(matches!(e, ExecError::TimedOut { .. }), "{e}");
        assert!(e.to_string().contains("did not answer within"), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        let grandchild: i32 = std::fs::read_to_string(&pids)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let alive = || {
            std::path::Path::new(&format!("/proc/{grandchild}")).exists()
                && !std::fs::read_to_string(format!("/proc/{grandchild}/stat"))
                    .unwrap_or_default()
                    .contains(") Z ")
        };
        let until = Instant::now() + Duration::from_secs(2);
        while alive() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            !alive(),
            "the plugin's child {grandchild} survived the time box"
        );

        // A plugin that answers and leaves a child behind does not hold us either.
        let quick = d.path().join("quick");
        std::fs::write(
            &quick,
            "#!/bin/sh\nsleep 30 &\necho '{\"cniVersion\":\"1.0.0\",\"supportedVersions\":[\"1.0.0\"]}'\n",
        )
        .unwrap();
        std::fs::set_permissions(&quick, std::fs::Permissions::from_mode(0o755)).unwrap();
        let t0 = Instant::now();
        let info = plugin_version_within(&quick, &[], Duration::from_secs(5)).unwrap();
        assert_eq!(info.supported_versions, ["1.0.0"]);
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    }

    #[test]
    fn plugin_config_injects_like_libcni() {
        let list = parse_conflist(br#"{"cniVersion":"1.0.0","name":"net","plugins":[
            {"type":"bridge","name":"ignored","zz":1},
            {"type":"portmap","capabilities":{"portMappings":true,"bandwidth":false},"runtimeConfig":{"static":1},"a":2},
            {"type":"interlock-cni","capabilities":{"io.kubernetes.cri.pod-annotations":true},"runtimeConfig":{"keep":true}}]}"#).unwrap();
        let chain = Chain::new(list, vec![]).unwrap();
        let rt = RuntimeConf::new("c1", "/var/run/netns/x", "eth0")
            .with_capability("portMappings", serde_json::json!([{"hostPort": 8080}]))
            .with_capability("bandwidth", serde_json::json!({"ingressRate": 1}));
        let prev = CniResult::empty(CniVersion::V1_0_0);
        let c0 = Value::Object(chain.plugin_config(0, None, &rt));
        assert_eq!(
            c0.to_string(),
            r#"{"type":"bridge","name":"net","zz":1,"cniVersion":"1.0.0"}"#
        );
        let c1 = Value::Object(chain.plugin_config(1, Some(&prev), &rt));
        assert_eq!(
            c1.to_string(),
            r#"{"type":"portmap","capabilities":{"portMappings":true,"bandwidth":false},"runtimeConfig":{"portMappings":[{"hostPort":8080}]},"a":2,"name":"net","cniVersion":"1.0.0","prevResult":{"cniVersion":"1.0.0","dns":{}}}"#
        );
        // No matching capability argument: the file's own runtimeConfig stays.
        let c2 = chain.plugin_config(2, None, &rt);
        assert_eq!(c2["runtimeConfig"], serde_json::json!({"keep": true}));
        // A null argument (pod without annotations) is still injected.
        let rt = rt.with_capability("io.kubernetes.cri.pod-annotations", Value::Null);
        let c2 = chain.plugin_config(2, None, &rt);
        assert_eq!(
            c2["runtimeConfig"],
            serde_json::json!({"io.kubernetes.cri.pod-annotations": null})
        );
    }

    #[test]
    fn attachment_validation_follows_libcni() {
        let ok = RuntimeConf::new("abc-1.x_y", "", "eth0");
        assert!(validate_attachment("net", &ok).is_ok());
        for (net, cid, ifname, code) in [
            ("net", "", "eth0", 3),
            ("net", "../x", "eth0", 4),
            ("net", "-a", "eth0", 4),
            ("", "a", "eth0", 7),
            ("n/t", "a", "eth0", 7),
            ("net", "a", "", 4),
            ("net", "a", "averyveryverylongname", 4),
            ("net", "a", "..", 4),
            ("net", "a", "et h0", 4),
            ("net", "a", "eth:0", 4),
        ] {
            let e = validate_attachment(net, &RuntimeConf::new(cid, "", ifname)).unwrap_err();
            assert_eq!(e.code, code, "{net:?} {cid:?} {ifname:?}: {e}");
        }
    }

    #[test]
    fn unsupported_version_is_refused() {
        let list = parse_conflist(br#"{"cniVersion":"0.2.0","name":"n","plugins":[{"type":"a"}]}"#)
            .unwrap();
        let e = Chain::new(list, vec![]).unwrap_err();
        assert!(e.to_string().contains("cniVersion"), "{e}");
    }
}

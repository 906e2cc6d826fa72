//! Benchmarks of interlock's hot paths against the tools people use today.
//!
//! Everything runs in throwaway network namespaces ([`topology`]): a test-owned "node"
//! netns that is every pod's gateway, and a fresh pod netns per sample. [`Bench`] measures
//! one sample of a [`Scenario`]:
//!
//! - `add_meshed_<backend>`: the real `interlock-cni` binary run as a runtime runs it
//!   (conflist entry + `prevResult` + `runtimeConfig` with istio pod annotations), with
//!   `agentSocket` set to a live socket that answers the plugin's lookup of the pod's spec
//!   and takes it as the ADD's note (one round trip, as on a node with the agent);
//! - `engine_protect_<backend>`: the in-process engine (`interlock_redirect::install_and_prove`:
//!   apply, verify, probe);
//! - `add_generic_nftables`: a pod meshed by interlock's own annotations, which decide
//!   alone: no `agentSocket`, no round trip;
//! - `add_generic_nftables_agent_note`: the same with `agentSocket` set: the plugin's
//!   `added` note to the live socket, answered, is the only difference;
//! - `add_unmeshed`: the binary for a pod no profile claims;
//! - `spawn_floor_static`: a static no-op (`gcc -static -Os`, like the shipped static
//!   plugin) started the same way: the exec floor the budgets are measured against;
//! - `spawn_floor_lean_start`: the same no-op linked with the shipped plugin's own
//!   start-up (`crates/lean-start/c/lean_start.c`: glibc's, without identifying the CPU),
//!   the floor of what the plugin does after it has started;
//! - `spawn_floor_true`: `/bin/true` (dynamic) started the same way, for comparison;
//! - `iptables_restore_per_family_<flavour>`: one `iptables-restore --noflush` and one
//!   `ip6tables-restore --noflush` with the same rules, rendered by the redirect crate,
//!   run from a thread inside the pod netns (the restores alone);
//! - `istio_cni_standin_nft`: istio-cni's way in full, each side paying its process start
//!   (the restore budget's baseline): a static C CNI plugin (`istio_standin.c`) exec'd
//!   like interlock-cni that enters the pod netns and runs the two nft-flavour restores;
//! - `iptables_per_rule_<flavour>`: one `iptables`/`ip6tables` process per rule.
//!
//! [`run::run`] samples every scenario in interleaved rounds and [`report`] turns the
//! samples into the JSON document `interlock-bench` prints (medians, tails, ratios and
//! budget verdicts, all computed from this run); [`concurrent`] adds ADDs started
//! together at N = 1, 8, 32, 64.
//!
//! [`repair`] measures the agent instead: how fast it repairs its config after another
//! writer clobbers it (`interlock-bench repair`, `make bench-repair`); [`audit`] the
//! sandbox audit of many meshed netns and one in-place repair (`interlock-bench audit`).

pub mod api_load;
pub mod audit;
pub mod budgets;
pub mod concurrent;
pub mod pin;
pub mod repair;
pub mod report;
pub mod run;
pub mod sandbox;
pub mod stats;
pub mod topology;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use interlock_libcni::exec;
use interlock_libcni::RuntimeConf;
use interlock_redirect::backend::iptables::{self, Flavour, Tool};
use interlock_redirect::backend::{self as backends, BackendKind};
use interlock_redirect::netns::in_netns;
use interlock_redirect::spec::Family;
use interlock_redirect::{ProfileName, RedirectSpec, Verification};
use interlock_testkit::agent_standin::AgentStandIn;
use serde_json::{json, Map, Value};

pub use topology::{Node, Pod};

/// The capability through which containerd passes pod annotations to a plugin.
pub const POD_ANNOTATIONS_CAPABILITY: &str = "io.kubernetes.cri.pod-annotations";

/// The CNI version of the benchmark's network configuration.
pub const CNI_VERSION: &str = "1.0.0";

/// Why a benchmark could not run or a sample failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The process is not root.
    #[error("interlock-bench needs root: it creates network namespaces and netfilter rules (run it with sudo)")]
    NotRoot,
    /// The plugin binary is not where it was looked for.
    #[error("interlock-cni binary not found at {0}: build it first (`cargo build --release -p interlock-cni -p interlock-bench`) or pass --plugin <path>")]
    PluginMissing(PathBuf),
    /// Building the throwaway network failed.
    #[error("setting up the benchmark network: {0}")]
    Setup(String),
    /// One sample of a scenario failed (the run stops: numbers without it would lie).
    #[error("{scenario} (pod netns {netns}): {msg}")]
    Sample {
        /// Scenario key.
        scenario: String,
        /// The pod netns of the sample.
        netns: String,
        /// What went wrong.
        msg: String,
    },
}

/// One thing the benchmark measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scenario {
    /// `interlock-cni` ADD for an istio-meshed pod with this backend configured; the
    /// plugin asks the live agent socket ([`AgentStandIn`]) for the pod's spec, and that
    /// lookup is the ADD's note.
    AddMeshed(BackendKind),
    /// `interlock-cni` ADD (nftables) for a pod meshed by interlock's own annotations
    /// (`generic`, decided without the spec); with `agentSocket` set when `true`, so that
    /// the plugin sends its `added` note to the live socket and waits for the answer.
    AddGeneric(bool),
    /// In-process `interlock_redirect::install_and_prove` (apply + verify + probe) with this backend.
    Engine(BackendKind),
    /// `interlock-cni` ADD for a pod without mesh annotations.
    AddUnmeshed,
    /// Reference: a static no-op binary (`int main(void){return 0;}`, `gcc -static -Os`)
    /// started exactly like the plugin: the exec floor of a static plugin.
    StaticFloor,
    /// Reference: the same no-op linked with the shipped plugin's start-up
    /// (`crates/lean-start/c/lean_start.c`, which skips glibc's 43 `cpuid`): what is left
    /// of the plugin's time over it is the plugin's own work.
    LeanFloor,
    /// Reference: `/bin/true` started exactly like the plugin (same environment, stdin
    /// and pipes): the floor of any exec'd CNI plugin on this machine.
    SpawnFloor,
    /// Baseline: one `iptables-restore --noflush` per family.
    RestorePerFamily(Flavour),
    /// Baseline, istio-cni's way in full: a CNI plugin process (static C, started exactly
    /// like the plugin) that enters the pod netns and runs one nft-flavour
    /// `iptables-restore --noflush` per family (`istio_standin.c`).
    IstioStandIn,
    /// Baseline: one `iptables` process per rule.
    PerRule(Flavour),
}

fn kind_key(kind: BackendKind) -> &'static str {
    match kind {
        BackendKind::Nftables => "nftables",
        BackendKind::IptablesNft => "iptables_nft",
        BackendKind::IptablesLegacy => "iptables_legacy",
    }
}

fn flavour_key(f: Flavour) -> &'static str {
    match f {
        Flavour::Nft => "nft",
        Flavour::Legacy => "legacy",
    }
}

/// The backend that reads back rules installed with `flavour`'s tools.
pub fn flavour_kind(f: Flavour) -> BackendKind {
    match f {
        Flavour::Nft => BackendKind::IptablesNft,
        Flavour::Legacy => BackendKind::IptablesLegacy,
    }
}

impl Scenario {
    /// Every scenario, in report order.
    pub fn all() -> Vec<Scenario> {
        let mut v = Vec::new();
        v.extend(BackendKind::ALL.map(Scenario::AddMeshed));
        v.extend([false, true].map(Scenario::AddGeneric));
        v.extend(BackendKind::ALL.map(Scenario::Engine));
        v.push(Scenario::AddUnmeshed);
        v.push(Scenario::StaticFloor);
        v.push(Scenario::LeanFloor);
        v.push(Scenario::SpawnFloor);
        v.extend([Flavour::Nft, Flavour::Legacy].map(Scenario::RestorePerFamily));
        v.push(Scenario::IstioStandIn);
        v.extend([Flavour::Nft, Flavour::Legacy].map(Scenario::PerRule));
        v
    }

    /// The JSON key (`add_meshed_nftables`, `iptables_per_rule_legacy`, …).
    pub fn key(&self) -> String {
        match self {
            Scenario::AddMeshed(k) => format!("add_meshed_{}", kind_key(*k)),
            Scenario::AddGeneric(false) => "add_generic_nftables".into(),
            Scenario::AddGeneric(true) => "add_generic_nftables_agent_note".into(),
            Scenario::Engine(k) => format!("engine_protect_{}", kind_key(*k)),
            Scenario::AddUnmeshed => "add_unmeshed".into(),
            Scenario::SpawnFloor => "spawn_floor_true".into(),
            Scenario::StaticFloor => "spawn_floor_static".into(),
            Scenario::LeanFloor => "spawn_floor_lean_start".into(),
            Scenario::RestorePerFamily(f) => {
                format!("iptables_restore_per_family_{}", flavour_key(*f))
            }
            Scenario::IstioStandIn => "istio_cni_standin_nft".into(),
            Scenario::PerRule(f) => format!("iptables_per_rule_{}", flavour_key(*f)),
        }
    }

    /// What the scenario measures, in one line (printed in the JSON).
    pub fn describe(&self) -> String {
        match self {
            Scenario::AddMeshed(k) => format!(
                "interlock-cni binary, CNI ADD of an istio-meshed pod (conflist entry + prevResult + runtimeConfig annotations), backend {k}, agentSocket set: the plugin asks a live socket speaking the agent socket protocol for the pod's spec, and the lookup is the ADD's note; spawn to exit"
            ),
            Scenario::AddGeneric(false) => "interlock-cni binary, CNI ADD of a pod meshed by interlock.dev/redirect (the generic profile, decided by the annotations alone), backend nftables, no agentSocket; spawn to exit".into(),
            Scenario::AddGeneric(true) => "interlock-cni binary, CNI ADD of the generic-profile pod, backend nftables, with agentSocket set: the plugin's `added` note goes to a live socket speaking the agent socket protocol, answered before the plugin exits; spawn to exit".into(),
            Scenario::Engine(k) => format!(
                "in-process interlock_redirect::install_and_prove with {k}: enter netns, apply, verify, probe"
            ),
            Scenario::AddUnmeshed => {
                "interlock-cni binary, CNI ADD of a pod without mesh annotations; spawn to exit".into()
            }
            Scenario::SpawnFloor => {
                "/bin/true (dynamic) through the same exec path as the plugin".into()
            }
            Scenario::StaticFloor => {
                "a static no-op (gcc -static -Os) through the same exec path as the plugin: the exec floor".into()
            }
            Scenario::LeanFloor => {
                "the static no-op linked with the shipped plugin's start-up (crates/lean-start/c/lean_start.c: glibc's without CPU identification), same exec path: the floor of the plugin's own work".into()
            }
            Scenario::RestorePerFamily(f) => format!(
                "baseline: iptables-{0}-restore --noflush + ip6tables-{0}-restore --noflush with the same rules, from a thread inside the pod netns (the restores alone)",
                flavour_key(*f)
            ),
            Scenario::IstioStandIn => "baseline, istio-cni's way in full: a static C CNI plugin started exactly like interlock-cni (spawn to exit) that reads its config, enters the pod netns and runs iptables-nft-restore --noflush + ip6tables-nft-restore --noflush with the same rules; a lower bound of istio-cni, a Go binary".into(),
            Scenario::PerRule(f) => format!(
                "baseline: one iptables-{0} / ip6tables-{0} process per chain, rule and jump (same rules)",
                flavour_key(*f)
            ),
        }
    }

    /// The scenario with this key.
    pub fn from_key(key: &str) -> Option<Scenario> {
        Scenario::all().into_iter().find(|s| s.key() == key)
    }

    /// True for the slow per-rule baseline (sampled less).
    pub fn is_per_rule(&self) -> bool {
        matches!(self, Scenario::PerRule(_))
    }

    /// The backend whose read-back shows this scenario's rules (`None`: no rules).
    pub fn rules_backend(&self) -> Option<BackendKind> {
        match self {
            Scenario::AddMeshed(k) | Scenario::Engine(k) => Some(*k),
            Scenario::AddGeneric(_) => Some(BackendKind::Nftables),
            Scenario::AddUnmeshed
            | Scenario::SpawnFloor
            | Scenario::StaticFloor
            | Scenario::LeanFloor => None,
            Scenario::RestorePerFamily(f) | Scenario::PerRule(f) => Some(flavour_kind(*f)),
            Scenario::IstioStandIn => Some(BackendKind::IptablesNft),
        }
    }
}

/// One measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sample {
    /// Wall time of the measured operation.
    pub total: Duration,
    /// Time applying and verifying the rules (engine: measured by the engine; plugin ADD:
    /// as the plugin recorded it in its attachment state).
    pub rules: Option<Duration>,
    /// Time proving the rules with the probe (same sources as `rules`).
    pub probe: Option<Duration>,
    /// Plugin ADD only: the plugin's whole `protect` step, as it recorded it.
    pub protect: Option<Duration>,
    /// Plugin ADD only: the ADD inside the plugin process until its state was written, as
    /// it recorded it (the rest of `total` is process start, exit and pipes).
    pub inside: Option<Duration>,
}

impl Sample {
    fn plain(total: Duration) -> Sample {
        Sample {
            total,
            ..Sample::default()
        }
    }
}

/// A timed plugin ADD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginAdd {
    /// Spawn to exit.
    pub elapsed: Duration,
    /// The attachment (`CNI_CONTAINERID`, `CNI_IFNAME`), to find the plugin's state.
    pub key: interlock_attach::state::AttachmentKey,
}

/// The pod annotations istio's injector writes on a sidecar-injected pod (only
/// `sidecar.istio.io/status` decides; the rest is what a real pod carries).
pub fn istio_annotations() -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "sidecar.istio.io/status".to_string(),
            r#"{"initContainers":["istio-init"],"containers":["istio-proxy"],"volumes":["workload-socket","credential-socket","workload-certs","istio-envoy","istio-data","istio-podinfo","istio-token","istiod-ca-cert"],"imagePullSecrets":null,"revision":"default"}"#.to_string(),
        ),
        ("kubectl.kubernetes.io/default-container".to_string(), "app".to_string()),
        ("prometheus.io/path".to_string(), "/stats/prometheus".to_string()),
        ("prometheus.io/port".to_string(), "15020".to_string()),
        ("prometheus.io/scrape".to_string(), "true".to_string()),
    ])
}

/// The annotations of a pod meshed by interlock's own annotations (the `generic` profile).
pub fn generic_annotations() -> BTreeMap<String, String> {
    BTreeMap::from([(
        interlock_redirect::profile::generic::keys::REDIRECT.to_string(),
        "enabled".to_string(),
    )])
}

/// The rule set [`generic_annotations`] ask for.
pub fn generic_spec() -> RedirectSpec {
    let (_, spec) = interlock_redirect::spec_for(
        &interlock_redirect::PodView::annotations_only(&generic_annotations()),
        &ProfileName::ALL,
    )
    .expect("the generic annotations are valid")
    .expect("the generic profile claims the pod");
    spec
}

/// The annotations of an ordinary, unmeshed pod.
pub fn plain_annotations() -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "kubernetes.io/config.seen".to_string(),
            "2026-11-21T06:00:00.000000000Z".to_string(),
        ),
        ("kubernetes.io/config.source".to_string(), "api".to_string()),
    ])
}

/// The rule set every scenario installs: the istio profile's spec for
/// [`istio_annotations`], dual-stack.
pub fn bench_spec() -> RedirectSpec {
    let (_, spec) = interlock_redirect::spec_for(
        &interlock_redirect::PodView::with_facts(
            &istio_annotations(),
            &interlock_testkit::pods::istio_sidecar(),
        ),
        &ProfileName::ALL,
    )
    .expect("the istio annotations are valid")
    .expect("the istio profile claims the pod");
    spec.as_installed()
}

/// Where the plugin is looked for by default: `interlock-cni` next to the running
/// executable (for a test or bench executable in `target/<profile>/deps`, one level up).
pub fn default_plugin_path() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    dir.join("interlock-cni")
}

/// [`default_plugin_path`] when that file exists, else [`build_plugin`]: the plugin the
/// smoke tests and the criterion benches run.
pub fn plugin_or_build() -> Result<PathBuf, BenchError> {
    let p = default_plugin_path();
    if p.is_file() {
        Ok(p)
    } else {
        build_plugin()
    }
}

/// Builds `interlock-cni` with cargo into the target directory that holds the running
/// executable (release when that is a release directory) and returns its path. For the
/// smoke test and the criterion benches, which cargo does not build the plugin for.
pub fn build_plugin() -> Result<PathBuf, BenchError> {
    build_workspace_bin("interlock-cni", &default_plugin_path())
}

/// Builds the binary `path` names (a file in the directory [`default_plugin_path`] is in)
/// of workspace package `package` with cargo, as [`build_plugin`] does, and returns `path`.
pub fn build_workspace_bin(package: &str, path: &Path) -> Result<PathBuf, BenchError> {
    let bin = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let profile_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let target_dir = profile_dir
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let release = profile_dir.file_name().is_some_and(|n| n != "debug");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "-p", package, "--bin", &bin])
        .arg("--target-dir")
        .arg(&target_dir)
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if release {
        cmd.arg("--release");
    }
    let status = cmd
        .status()
        .map_err(|e| BenchError::Setup(format!("running cargo to build {bin}: {e}")))?;
    if !status.success() || !path.exists() {
        return Err(BenchError::PluginMissing(path.to_path_buf()));
    }
    Ok(path.to_path_buf())
}

/// Where the plugin's `stateDir` goes by default: `/dev/shm` (a tmpfs, like `/run` on
/// a Kubernetes node, which the plugin's default `/var/run/interlock` lives in), else the
/// system temp directory.
pub fn default_state_parent() -> PathBuf {
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() {
        shm
    } else {
        std::env::temp_dir()
    }
}

/// Installs `source` as the agent installs the plugin on a node
/// ([`interlock_agent::guard::install::PluginInstaller`]: read, checked to answer VERSION,
/// written with `write` and renamed into place, verified), into a fresh directory next to
/// `source` (the disk the build is on, as a node's `/opt/cni/bin` is on disk; the temp dir
/// if that directory cannot be written). Returns the directory and the installed binary.
///
/// The bench never runs the file the linker wrote. lld writes its output through a shared
/// memory map, and the same bytes written that way start slower for as long as the file
/// stays in the page cache: on this 2-core VM (kernel 6.18, ext4) an unmeshed ADD of the
/// linker's file took 6–10 more page faults and 0.08–0.09 ms more than a copy written with
/// `write`, next to it on the same disk (memory-mapped copies behave like the linker's
/// file; dropping its cached pages did not help). No node runs such a file: the agent
/// writes the binary it installs, and after a reboot it is read from disk.
pub fn install_plugin(source: &Path) -> Result<(tempfile::TempDir, PathBuf), BenchError> {
    let mut installer = interlock_agent::guard::install::PluginInstaller::new(source)
        .map_err(|e| BenchError::Setup(format!("reading the plugin to install: {e}")))?;
    let beside = source.parent().filter(|p| !p.as_os_str().is_empty());
    let dir = beside
        .and_then(|p| {
            tempfile::Builder::new()
                .prefix(".ilbench-bin")
                .tempdir_in(p)
                .ok()
        })
        .map_or_else(
            || {
                tempfile::Builder::new()
                    .prefix("ilbench-bin")
                    .tempdir()
                    .map_err(|e| {
                        BenchError::Setup(format!("creating a bin dir for the plugin: {e}"))
                    })
            },
            Ok,
        )?;
    installer.ensure(dir.path(), true).map_err(|e| {
        BenchError::Setup(format!(
            "installing {} into {}: {e}",
            source.display(),
            dir.path().display()
        ))
    })?;
    let installed = dir
        .path()
        .join(interlock_agent::guard::install::PLUGIN_FILE);
    Ok((dir, installed))
}

/// The shipped plugin's start-up (see [`Scenario::LeanFloor`]) and its compiler flags.
const LEAN_START_C: &str = include_str!("../../../crates/lean-start/c/lean_start.c");
const LEAN_START_CFLAGS: &str = include_str!("../../../crates/lean-start/c/cflags");

/// A static C program built in a temp dir of its own (the dir goes with it).
pub(crate) type StaticBin = Result<(tempfile::TempDir, PathBuf), String>;

/// Builds the static no-op floor with `gcc -static -Os` in a temp dir; with `lean`, linked
/// with the plugin's start-up, compiled with its build script's flags
/// (`crates/lean-start/c/cflags`).
fn build_static_noop(lean: bool) -> StaticBin {
    let what = if lean {
        "lean-start no-op floor"
    } else {
        "static no-op floor"
    };
    let dir = temp_dir("ilbench-noop", what)?;
    let bin = build_static(
        dir.path(),
        what,
        "int main(void) { return 0; }\n",
        &[],
        lean,
    )?;
    Ok((dir, bin))
}

/// The istio-cni stand-in ([`Scenario::IstioStandIn`]).
const ISTIO_STANDIN_C: &str = include_str!("istio_standin.c");

/// Builds the istio-cni stand-in with `gcc -static -Os` in a temp dir, with its job list
/// there: one `--noflush` run of each `(tool, input)`.
pub(crate) fn build_istio_standin(jobs: &[(PathBuf, String)]) -> StaticBin {
    let what = "istio-cni stand-in";
    let dir = temp_dir("ilbench-standin", what)?;
    let mut list = String::new();
    for (i, (tool, input)) in jobs.iter().enumerate() {
        let path = dir.path().join(format!("input-{i}"));
        std::fs::write(&path, input).map_err(|e| format!("writing {}: {e}", path.display()))?;
        list.push_str(&format!("{}\t{}\n", tool.display(), path.display()));
    }
    let list_path = dir.path().join("jobs");
    std::fs::write(&list_path, list)
        .map_err(|e| format!("writing {}: {e}", list_path.display()))?;
    let define = format!("-DSTANDIN_JOBS=\"{}\"", list_path.display());
    let bin = build_static(dir.path(), what, ISTIO_STANDIN_C, &[&define], false)?;
    Ok((dir, bin))
}

/// Builds the chained no-op of `interlock-bench sandbox` (`istio_standin.c` with
/// `CHAINED_NOOP`: it reads its config and answers ADD with its prevResult, nothing else)
/// with `gcc -static -Os` in a temp dir.
pub(crate) fn build_chained_noop() -> StaticBin {
    let what = "chained no-op";
    let dir = temp_dir("ilbench-noop", what)?;
    let bin = build_static(
        dir.path(),
        what,
        ISTIO_STANDIN_C,
        &["-DCHAINED_NOOP"],
        false,
    )?;
    Ok((dir, bin))
}

fn temp_dir(prefix: &str, what: &str) -> Result<tempfile::TempDir, String> {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .map_err(|e| format!("creating a temp dir for the {what}: {e}"))
}

/// Compiles `main_c` into `dir` as a static binary (`gcc -static -Os`, with `cflags`);
/// with `lean`, linked with the plugin's start-up, compiled with its build script's flags.
fn build_static(
    dir: &Path,
    what: &str,
    main_c: &str,
    cflags: &[&str],
    lean: bool,
) -> Result<PathBuf, String> {
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text)
            .map(|_| path.clone())
            .map_err(|e| format!("writing {}: {e}", path.display()))
    };
    let gcc = |args: &[&std::ffi::OsStr]| -> Result<(), String> {
        let out = Command::new("gcc")
            .args(args)
            .output()
            .map_err(|e| format!("no {what}: running gcc: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "no {what}: gcc failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    };
    let src = write("main.c", main_c)?;
    let bin = dir.join("bin");
    let mut link: Vec<&std::ffi::OsStr> = ["-static", "-Os"].map(AsRef::as_ref).to_vec();
    link.extend(cflags.iter().map(std::ffi::OsStr::new));
    link.extend(["-o".as_ref(), bin.as_os_str(), src.as_os_str()]);
    let start_obj = dir.join("lean_start.o");
    if lean {
        let start = write("lean_start.c", LEAN_START_C)?;
        gcc(&LEAN_START_CFLAGS
            .split_whitespace()
            .chain(["-c", "-o"])
            .map(AsRef::as_ref)
            .chain([start_obj.as_os_str(), start.as_os_str()])
            .collect::<Vec<_>>())?;
        link.push(start_obj.as_os_str());
    }
    gcc(&link)?;
    Ok(bin)
}

/// Finds `name` on `PATH` or in the sbin directories; the bare name if nowhere.
pub(crate) fn tool_path(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(name))
}

/// Runs `program args` with `stdin`; an error says what failed and its stderr.
fn run_tool(program: &Path, args: &[String], stdin: Option<&[u8]>) -> Result<(), String> {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("starting {}: {e}", program.display()))?;
    if let (Some(data), Some(mut input)) = (stdin, child.stdin.take()) {
        input
            .write_all(data)
            .map_err(|e| format!("writing to {}: {e}", program.display()))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("waiting for {}: {e}", program.display()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{} {} failed ({}): {}",
            program.display(),
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A program and its arguments.
type Invocation = (PathBuf, Vec<String>);

/// The measured world: the node, the rule set, the plugin, and the pre-rendered baseline
/// inputs. Everything a sample needs is prepared here, outside the measurements.
#[derive(Debug)]
pub struct Bench {
    node: Node,
    spec: RedirectSpec,
    /// The plugin binary the bench was given (e.g. the linker's output).
    plugin_source: PathBuf,
    /// The copy every sample runs: installed by the agent's installer (see
    /// [`install_plugin`]), and the directory it lives in.
    plugin: PathBuf,
    _bin_dir: tempfile::TempDir,
    true_bin: PathBuf,
    /// The static no-op and the directory it was built in (`Err`: why there is none).
    static_noop: StaticBin,
    /// The same no-op with the plugin's start-up ([`Scenario::LeanFloor`]).
    lean_noop: StaticBin,
    /// The istio-cni stand-in ([`Scenario::IstioStandIn`]).
    istio_standin: StaticBin,
    bin_dirs: Vec<PathBuf>,
    /// The rule set of [`Scenario::AddGeneric`].
    generic_spec: RedirectSpec,
    /// The live agent socket every meshed ADD asks (`Err`: why there is none), in `state`:
    /// declared before it, so it closes before the directory goes.
    agent: Result<AgentStandIn, String>,
    state: tempfile::TempDir,
    /// Per flavour: (restore tool, its input) per family.
    restore: Vec<(Flavour, Vec<(PathBuf, String)>)>,
    /// Per flavour: (program, args) per rule, both families.
    per_rule: Vec<(Flavour, Vec<Invocation>)>,
    next_id: AtomicU64,
    /// Every attachment a plugin ADD created and no DEL has removed yet (see
    /// [`Bench::release_attachments`]).
    live: Mutex<Vec<Attachment>>,
}

/// What a CNI DEL of an attachment needs: its runtime parameters and the ADD's config.
#[derive(Debug, Clone)]
struct Attachment {
    rt: RuntimeConf,
    stdin: Vec<u8>,
}

impl Bench {
    /// Prepares a benchmark driving the plugin binary at `plugin`, with the plugin's
    /// `stateDir` in [`default_state_parent`]. Needs root.
    pub fn new(plugin: &Path) -> Result<Bench, BenchError> {
        Bench::with_state_parent(plugin, &default_state_parent())
    }

    /// [`Bench::new`] with the plugin's `stateDir` created under `state_parent`.
    pub fn with_state_parent(plugin: &Path, state_parent: &Path) -> Result<Bench, BenchError> {
        if !interlock_testkit::is_root() {
            return Err(BenchError::NotRoot);
        }
        if !plugin.is_file() {
            return Err(BenchError::PluginMissing(plugin.to_path_buf()));
        }
        let spec = bench_spec();
        let mut restore = Vec::new();
        let mut per_rule = Vec::new();
        for flavour in [Flavour::Nft, Flavour::Legacy] {
            let mut inputs = Vec::new();
            let mut argvs = Vec::new();
            for family in spec.families() {
                inputs.push((
                    tool_path(&flavour.tool(family, Tool::Restore)),
                    iptables::restore_text(&spec, family),
                ));
                for argv in iptables::rule_argvs(&spec, family, flavour) {
                    let (prog, args) = argv.split_first().expect("argv has a program");
                    argvs.push((tool_path(prog), args.to_vec()));
                }
            }
            restore.push((flavour, inputs));
            per_rule.push((flavour, argvs));
        }
        let state = tempfile::Builder::new()
            .prefix("ilbench-state")
            .tempdir_in(state_parent)
            .map_err(|e| {
                BenchError::Setup(format!(
                    "creating a state directory in {}: {e}",
                    state_parent.display()
                ))
            })?;
        let socket = state.path().join("agent.sock");
        let agent = AgentStandIn::start(&socket, interlock_testkit::pods::istio_sidecar())
            .map_err(|e| format!("no agent socket at {}: {e}", socket.display()));
        let istio_standin = restore
            .iter()
            .find(|(f, _)| *f == Flavour::Nft)
            .map_or_else(
                || Err("no nft restore inputs".into()),
                |(_, jobs)| build_istio_standin(jobs),
            );
        let (installed, installed_plugin) = install_plugin(plugin)?;
        let bin_dirs = vec![
            installed.path().to_path_buf(),
            interlock_testkit::cni_plugins_dir(),
        ];
        Ok(Bench {
            node: Node::new()?,
            spec,
            plugin_source: plugin.to_path_buf(),
            plugin: installed_plugin,
            _bin_dir: installed,
            true_bin: tool_path("true"),
            static_noop: build_static_noop(false),
            lean_noop: build_static_noop(true),
            istio_standin,
            bin_dirs,
            state,
            restore,
            per_rule,
            next_id: AtomicU64::new(0),
            agent,
            generic_spec: generic_spec(),
            live: Mutex::new(Vec::new()),
        })
    }

    /// The rule set every scenario installs.
    pub fn spec(&self) -> &RedirectSpec {
        &self.spec
    }

    /// The plugin binary being measured: the installed copy every sample runs.
    pub fn plugin(&self) -> &Path {
        &self.plugin
    }

    /// The plugin binary the bench was given, which [`Bench::plugin`] is a copy of.
    pub fn plugin_source(&self) -> &Path {
        &self.plugin_source
    }

    /// The plugin's `stateDir` (state files and log).
    pub fn state_dir(&self) -> &Path {
        self.state.path()
    }

    /// The node netns.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// Fresh pod netns (created now, not measured).
    pub fn pods(&self, n: usize) -> Result<Vec<Pod>, BenchError> {
        self.node.pods(n)
    }

    /// Rules per family in interlock's chains (what one family's restore installs,
    /// besides the chain declarations and the two jumps).
    pub fn rules_per_family(&self) -> usize {
        iptables::chain_rules(&self.spec, Family::V4).len()
    }

    /// Processes one per-rule baseline sample starts (both families).
    pub fn per_rule_calls(&self) -> usize {
        self.per_rule.first().map_or(0, |(_, v)| v.len())
    }

    /// The `iptables-restore` input of `family` (nft and legacy are the same text).
    pub fn restore_text(&self, family: Family) -> String {
        iptables::restore_text(&self.spec, family)
    }

    /// Measures one sample of `scenario` in the fresh `pod`.
    pub fn sample(&self, scenario: Scenario, pod: &Pod) -> Result<Sample, BenchError> {
        let fail = |msg: String| BenchError::Sample {
            scenario: scenario.key(),
            netns: pod.name().to_string(),
            msg,
        };
        match scenario {
            Scenario::AddMeshed(kind) => self
                .agent
                .as_ref()
                .map_err(Clone::clone)
                .and_then(|_| self.plugin_add_timed(pod, Some(kind), &istio_annotations()))
                .map(|a| self.with_plugin_timings(&a))
                .map_err(fail),
            Scenario::AddGeneric(note) => self
                .agent
                .as_ref()
                .map_err(Clone::clone)
                .and_then(|agent| {
                    let stdin = self.add_stdin_with(
                        pod,
                        Some(BackendKind::Nftables),
                        &generic_annotations(),
                        note.then(|| agent.path()),
                    );
                    self.plugin_add_stdin(pod, &stdin)
                })
                .map(|a| self.with_plugin_timings(&a))
                .map_err(fail),
            Scenario::AddUnmeshed => self
                .plugin_add_timed(pod, None, &plain_annotations())
                .map(|a| self.with_plugin_timings(&a))
                .map_err(fail),
            Scenario::SpawnFloor => self.spawn_floor(pod).map(Sample::plain).map_err(fail),
            Scenario::StaticFloor => self.static_bin_timed(&self.static_noop, pod).map_err(fail),
            Scenario::LeanFloor => self.static_bin_timed(&self.lean_noop, pod).map_err(fail),
            Scenario::IstioStandIn => self
                .static_bin_timed(&self.istio_standin, pod)
                .map_err(fail),
            Scenario::Engine(kind) => self.engine_protect(pod, kind).map_err(fail),
            Scenario::RestorePerFamily(f) => self
                .restore_per_family(pod, f)
                .map(Sample::plain)
                .map_err(fail),
            Scenario::PerRule(f) => self
                .iptables_per_rule(pod, f)
                .map(Sample::plain)
                .map_err(fail),
        }
    }

    /// One sample of a static program built in [`Bench::new`] (a no-op floor, the istio-cni
    /// stand-in), started as the plugin is; its build error when it could not be built.
    fn static_bin_timed(&self, built: &StaticBin, pod: &Pod) -> Result<Sample, String> {
        let (_, bin) = built.as_ref().map_err(Clone::clone)?;
        self.spawn_timed(bin, pod).map(Sample::plain)
    }

    /// The stdin of a plugin ADD as containerd builds it from the conflist: the plugin's
    /// entry (with `agentSocket` set to the live socket, as the agent writes it) plus
    /// `name`, `cniVersion`, `runtimeConfig` (declared capability) and `prevResult` (the
    /// bridge plugin's result for the pod).
    pub fn add_stdin(
        &self,
        pod: &Pod,
        backend: Option<BackendKind>,
        annotations: &BTreeMap<String, String>,
    ) -> Vec<u8> {
        let socket = self.agent.as_ref().ok().map(AgentStandIn::path);
        self.add_stdin_with(pod, backend, annotations, socket)
    }

    /// [`Bench::add_stdin`], with `agentSocket` set when `agent_socket` is given.
    pub fn add_stdin_with(
        &self,
        pod: &Pod,
        backend: Option<BackendKind>,
        annotations: &BTreeMap<String, String>,
        agent_socket: Option<&Path>,
    ) -> Vec<u8> {
        let mut conf = Map::new();
        conf.insert("cniVersion".into(), CNI_VERSION.into());
        conf.insert("name".into(), "ilbench".into());
        conf.insert("type".into(), "interlock-cni".into());
        conf.insert(
            "stateDir".into(),
            self.state.path().display().to_string().into(),
        );
        conf.insert(
            "logFile".into(),
            self.state
                .path()
                .join("interlock-cni.log")
                .display()
                .to_string()
                .into(),
        );
        conf.insert(
            "backend".into(),
            backend.map_or("auto", BackendKind::as_str).into(),
        );
        conf.insert("excludeNamespaces".into(), json!(["kube-system"]));
        if let Some(socket) = agent_socket {
            conf.insert("agentSocket".into(), socket.display().to_string().into());
        }
        conf.insert(
            "capabilities".into(),
            json!({ POD_ANNOTATIONS_CAPABILITY: true }),
        );
        conf.insert(
            "runtimeConfig".into(),
            json!({ POD_ANNOTATIONS_CAPABILITY: annotations }),
        );
        let [gw4, gw6] = [
            topology::GATEWAY_V4.to_string(),
            topology::GATEWAY_V6.to_string(),
        ];
        conf.insert(
            "prevResult".into(),
            json!({
                "cniVersion": CNI_VERSION,
                "interfaces": [
                    {"name": "ilbenchbr0", "mac": "02:00:00:00:00:01"},
                    {"name": "ilbv", "mac": "02:00:00:00:00:02"},
                    {"name": "eth0", "mac": "02:00:00:00:00:03", "sandbox": pod.path().display().to_string()}
                ],
                "ips": [
                    {"address": format!("{}/16", pod.v4), "gateway": gw4, "interface": 2},
                    {"address": format!("{}/64", pod.v6), "gateway": gw6, "interface": 2}
                ],
                "routes": [
                    {"dst": "0.0.0.0/0", "gw": gw4},
                    {"dst": "::/0", "gw": gw6}
                ],
                "dns": {}
            }),
        );
        serde_json::to_vec(&Value::Object(conf)).expect("JSON")
    }

    /// The sample of a plugin ADD, with the timings the plugin recorded in its
    /// attachment state (read after the measurement; absent fields stay `None`).
    pub fn with_plugin_timings(&self, add: &PluginAdd) -> Sample {
        let mut s = Sample::plain(add.elapsed);
        let store = interlock_attach::state::StateStore::new(self.state.path());
        if let Ok(Some(state)) = store.load(&add.key) {
            let us = Duration::from_micros;
            if state.add_us > 0 {
                s.inside = Some(us(state.add_us));
            }
            if let interlock_attach::outcome::Protection::Protected(p) = &state.protection {
                s.rules = Some(us(p.timings.rules_us));
                s.probe = Some(us(p.timings.probe_us));
                s.protect = Some(us(p.timings.protect_us));
            }
        }
        s
    }

    fn runtime_conf(&self, pod: &Pod) -> RuntimeConf {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let id = format!("ilbench{:08x}{n:08x}", std::process::id());
        RuntimeConf::new(&id, &pod.path().display().to_string(), "eth0")
            .with_arg("IgnoreUnknown", "1")
            .with_arg("K8S_POD_NAMESPACE", "bench")
            .with_arg("K8S_POD_NAME", &format!("pod-{n}"))
            .with_arg("K8S_POD_INFRA_CONTAINER_ID", &id)
            .with_arg("K8S_POD_UID", &format!("00000000-0000-4000-8000-{n:012x}"))
    }

    /// One plugin ADD of the binary, timed from spawn to exit (as a runtime waits for it);
    /// checks that it succeeded and printed a result.
    pub fn plugin_add(
        &self,
        pod: &Pod,
        backend: Option<BackendKind>,
        annotations: &BTreeMap<String, String>,
    ) -> Result<Duration, String> {
        self.plugin_add_timed(pod, backend, annotations)
            .map(|a| a.elapsed)
    }

    /// [`Bench::plugin_add`], also returning the attachment key.
    pub fn plugin_add_timed(
        &self,
        pod: &Pod,
        backend: Option<BackendKind>,
        annotations: &BTreeMap<String, String>,
    ) -> Result<PluginAdd, String> {
        let stdin = self.add_stdin(pod, backend, annotations);
        self.plugin_add_stdin(pod, &stdin)
    }

    /// One plugin ADD with `stdin` as its config, timed from spawn to exit.
    fn plugin_add_stdin(&self, pod: &Pod, stdin: &[u8]) -> Result<PluginAdd, String> {
        let rt = self.runtime_conf(pod);
        let t = Instant::now();
        let out = exec::exec_plugin(
            &self.plugin,
            interlock_cni_types::Command::Add,
            &rt,
            &self.bin_dirs,
            stdin,
        );
        let elapsed = t.elapsed();
        let out = out.map_err(|e| format!("plugin ADD failed: {e}"))?;
        let v: Value = serde_json::from_slice(&out).map_err(|e| {
            format!(
                "plugin ADD printed no JSON result ({e}): {:?}",
                String::from_utf8_lossy(&out)
            )
        })?;
        if v.get("ips").is_none() {
            return Err(format!("plugin ADD result has no ips: {v}"));
        }
        self.live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(Attachment {
                rt: rt.clone(),
                stdin: stdin.to_vec(),
            });
        Ok(PluginAdd {
            elapsed,
            key: interlock_attach::state::AttachmentKey {
                container_id: rt.container_id.clone(),
                ifname: rt.ifname.clone(),
            },
        })
    }

    /// Runs the plugin's CNI DEL (not timed) for every attachment an ADD created since the
    /// last call, as a runtime does when it stops a pod, before the pod's netns goes: the
    /// state dir then holds only live pods' records, as on a node. Without it, a later pod
    /// whose netns gets a freed netns's inode number (the kernel reuses them) would find a
    /// stale record of a dead pod, which no node has unless a DEL was lost: its ADD would
    /// check that record's attachments and read the netns before creating the rules,
    /// which measured about 0.03 ms more than a new pod's ADD. Call it before the pods
    /// are dropped. Fails naming the attachment when a DEL fails.
    pub fn release_attachments(&self) -> Result<usize, BenchError> {
        let live = std::mem::take(
            &mut *self
                .live
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for a in &live {
            exec::exec_plugin(
                &self.plugin,
                interlock_cni_types::Command::Del,
                &a.rt,
                &self.bin_dirs,
                &a.stdin,
            )
            .map_err(|e| BenchError::Sample {
                scenario: "del".into(),
                netns: a.rt.netns.clone(),
                msg: format!(
                    "the plugin's DEL of attachment {}/{} failed: {e}",
                    a.rt.container_id, a.rt.ifname
                ),
            })?;
        }
        Ok(live.len())
    }

    /// True when the live agent socket took the note of an ADD in `pod` (an `added` note, or
    /// the lookup made for it).
    pub fn agent_noted(&self, pod: &Pod) -> bool {
        self.agent
            .as_ref()
            .is_ok_and(|a| a.noted(&pod.path().display().to_string()))
    }

    /// `/bin/true` run through the same exec path as [`Bench::plugin_add`] (environment,
    /// stdin with a meshed ADD's config, piped stdout/stderr), timed the same way.
    pub fn spawn_floor(&self, pod: &Pod) -> Result<Duration, String> {
        self.spawn_timed(&self.true_bin, pod)
    }

    /// `bin` run through the same exec path as [`Bench::plugin_add`], timed the same way.
    pub fn spawn_timed(&self, bin: &Path, pod: &Pod) -> Result<Duration, String> {
        let stdin = self.add_stdin(pod, Some(BackendKind::Nftables), &istio_annotations());
        let rt = self.runtime_conf(pod);
        let t = Instant::now();
        let out = exec::exec_plugin(
            bin,
            interlock_cni_types::Command::Add,
            &rt,
            &self.bin_dirs,
            &stdin,
        );
        let elapsed = t.elapsed();
        out.map_err(|e| format!("{} failed: {e}", bin.display()))?;
        Ok(elapsed)
    }

    /// One in-process `interlock_redirect::install_and_prove` (enter netns, open backend, apply,
    /// verify, probe), timed around the call; checks every family was proven.
    pub fn engine_protect(&self, pod: &Pod, kind: BackendKind) -> Result<Sample, String> {
        let gateways: Vec<IpAddr> = self.node.gateways();
        let t = Instant::now();
        let p = interlock_redirect::install_and_prove(&pod.path(), &self.spec, kind, &gateways);
        let total = t.elapsed();
        let p = p.map_err(|e| format!("install_and_prove failed: {e}"))?;
        if p.probe.proven.len() != self.spec.families().len() {
            return Err(format!(
                "probe proved {} families, expected {}: {:?}",
                p.probe.proven.len(),
                self.spec.families().len(),
                p.probe
            ));
        }
        Ok(Sample {
            total,
            rules: Some(p.rules_time),
            probe: Some(p.probe_time),
            ..Sample::default()
        })
    }

    /// In-process apply + verify only (no probe): enter the netns, open the backend,
    /// `apply_and_verify`. Timed inside the netns thread, without the thread start.
    pub fn engine_apply_verify(&self, pod: &Pod, kind: BackendKind) -> Result<Duration, String> {
        in_netns(&pod.path(), || {
            let t = Instant::now();
            let backend = backends::open(kind).map_err(|e| e.to_string())?;
            let v = backend
                .apply_and_verify(&self.spec)
                .map_err(|e| e.to_string())?;
            let elapsed = t.elapsed();
            match v {
                Verification::Exact => Ok(elapsed),
                Verification::Mismatch(d) => Err(format!("rules not exact: {}", d.join("; "))),
            }
        })
        .map_err(|e| e.to_string())?
    }

    /// Baseline: one `<flavour> iptables-restore --noflush` per family with the rendered
    /// rules, inside the pod netns (timed from the first spawn to the last exit).
    pub fn restore_per_family(&self, pod: &Pod, flavour: Flavour) -> Result<Duration, String> {
        let inputs = &self
            .restore
            .iter()
            .find(|(f, _)| *f == flavour)
            .expect("both flavours rendered")
            .1;
        let noflush = ["--noflush".to_string()];
        in_netns(&pod.path(), || {
            let t = Instant::now();
            for (tool, text) in inputs {
                run_tool(tool, &noflush, Some(text.as_bytes()))?;
            }
            Ok(t.elapsed())
        })
        .map_err(|e| e.to_string())?
    }

    /// Baseline: one `iptables`/`ip6tables` process per rule (create chains, append rules,
    /// insert jumps), inside the pod netns.
    pub fn iptables_per_rule(&self, pod: &Pod, flavour: Flavour) -> Result<Duration, String> {
        let argvs = &self
            .per_rule
            .iter()
            .find(|(f, _)| *f == flavour)
            .expect("both flavours rendered")
            .1;
        in_netns(&pod.path(), || {
            let t = Instant::now();
            for (prog, args) in argvs {
                run_tool(prog, args, None)?;
            }
            Ok(t.elapsed())
        })
        .map_err(|e| e.to_string())?
    }

    /// Whether interlock's rules of `kind` are visible in the pod netns through the
    /// standard tools (`nft list table inet interlock`, `iptables-save -t nat`).
    pub fn rules_visible(&self, pod: &Pod, kind: BackendKind) -> bool {
        match kind {
            BackendKind::Nftables => {
                let out = pod.exec(&["nft", "list", "table", "inet", backends::nftables::TABLE]);
                out.status.success() && String::from_utf8_lossy(&out.stdout).contains("redirect")
            }
            BackendKind::IptablesNft | BackendKind::IptablesLegacy => {
                let flavour = if kind == BackendKind::IptablesNft {
                    Flavour::Nft
                } else {
                    Flavour::Legacy
                };
                let save = flavour.tool(Family::V4, Tool::Save);
                let out = pod.exec(&[&save, "-t", "nat"]);
                out.status.success()
                    && String::from_utf8_lossy(&out.stdout)
                        .lines()
                        .any(|l| l.starts_with(&format!("-A {}", iptables::CHAIN_OUTPUT)))
            }
        }
    }

    /// Reads the pod's rules back with `kind` and compares them with the bench spec.
    pub fn rules_exact(&self, pod: &Pod, kind: BackendKind) -> Result<(), String> {
        self.rules_match(pod, kind, &self.spec)
    }

    /// [`Bench::rules_exact`] for the rule set of [`Scenario::AddGeneric`].
    pub fn generic_rules_exact(&self, pod: &Pod) -> Result<(), String> {
        self.rules_match(pod, BackendKind::Nftables, &self.generic_spec)
    }

    fn rules_match(&self, pod: &Pod, kind: BackendKind, spec: &RedirectSpec) -> Result<(), String> {
        match interlock_redirect::check(&pod.path(), spec, kind) {
            Ok(Verification::Exact) => Ok(()),
            Ok(Verification::Mismatch(d)) => Err(d.join("; ")),
            Err(e) => Err(e.to_string()),
        }
    }
}

//! Backends that apply a [`RedirectSpec`] inside the current network namespace.
//!
//! [`BackendKind`] names a mechanism (configuration's `backend`, with `auto`, is
//! `interlock_contract::config::BackendChoice`), [`detect`] decides `auto` from what the
//! host uses, and [`open`] gives the [`Backend`] for a kind.

use std::path::{Path, PathBuf};

use interlock_contract::codes::Step;

use crate::spec::{RedirectSpec, SpecError};

pub mod iptables;
pub mod nftables;
#[cfg(test)]
pub(crate) mod semantics_testing;

pub use interlock_contract::config::{BackendKind, UnknownBackend};

/// The outcome of [`detect`]: a kind and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detection {
    /// The backend chosen.
    pub kind: BackendKind,
    /// Why, in words (for logs and `interlock check`).
    pub reason: String,
}

/// Decides `auto` from what the current network namespace (call it in the host's) uses.
///
/// If no legacy xtables table exists (`/proc/net/ip{,6}_tables_names` empty) nobody uses
/// legacy iptables here, and the in-process nftables backend is chosen without starting a
/// process. Otherwise the rules of both iptables flavours are counted (as kube-proxy and
/// Istio do) and a host that mostly uses legacy iptables gets `iptables-legacy`, so the
/// pod's rules are visible to the same tools the host's operators use.
pub fn detect() -> Detection {
    let legacy_tables = ["/proc/net/ip_tables_names", "/proc/net/ip6_tables_names"]
        .iter()
        .any(|p| std::fs::read_to_string(p).is_ok_and(|s| !s.trim().is_empty()));
    if !legacy_tables {
        return Detection {
            kind: BackendKind::Nftables,
            reason: "no legacy iptables tables on the host; using nf_tables".into(),
        };
    }
    let count = |tool: &str| -> Option<usize> {
        let out = std::process::Command::new(find_tool(tool)).output().ok()?;
        out.status.success().then(|| {
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| l.starts_with("-A "))
                .count()
        })
    };
    let legacy = count("iptables-legacy-save").unwrap_or(0);
    match count("iptables-nft-save") {
        None => Detection {
            kind: BackendKind::IptablesLegacy,
            reason: "iptables-nft-save unusable and legacy tables present; using iptables-legacy"
                .into(),
        },
        Some(nft) if legacy > nft => Detection {
            kind: BackendKind::IptablesLegacy,
            reason: format!(
                "host has {legacy} legacy iptables rules and {nft} iptables-nft rules; using iptables-legacy"
            ),
        },
        Some(nft) => Detection {
            kind: BackendKind::Nftables,
            reason: format!(
                "host has {legacy} legacy iptables rules and {nft} iptables-nft rules; using nf_tables"
            ),
        },
    }
}

/// Where the iptables backends look for their programs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ToolLookup {
    /// `PATH`, then the sbin directories a CNI plugin's minimal environment may lack
    /// (`/usr/sbin`, `/sbin`, `/usr/bin`, `/bin`).
    #[default]
    System,
    /// Only these directories (tests; hosts with tools in unusual places).
    Dirs(Vec<PathBuf>),
}

impl ToolLookup {
    /// The executable `name`, or `None` when it is in none of the searched directories.
    pub fn find(&self, name: &str) -> Option<PathBuf> {
        let dirs: Vec<PathBuf> = match self {
            ToolLookup::System => {
                let path = std::env::var_os("PATH").unwrap_or_default();
                std::env::split_paths(&path)
                    .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
                    .collect()
            }
            ToolLookup::Dirs(dirs) => dirs.clone(),
        };
        dirs.into_iter()
            .map(|d| d.join(name))
            .find(|p| is_executable(p))
    }

    /// Where [`ToolLookup::find`] searches, in words (for error messages).
    pub fn describe(&self) -> String {
        match self {
            ToolLookup::System => "PATH, /usr/sbin, /sbin, /usr/bin, /bin".to_string(),
            ToolLookup::Dirs(dirs) => dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        }
    }
}

/// Finds an executable by name on `PATH`, then in the sbin directories a CNI plugin's
/// minimal environment may lack; the bare name if nowhere (the spawn error then says so).
pub(crate) fn find_tool(name: &str) -> PathBuf {
    ToolLookup::System
        .find(name)
        .unwrap_or_else(|| PathBuf::from(name))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The backend for `kind` (iptables tools found with [`ToolLookup::System`]).
pub fn open(kind: BackendKind) -> Result<Box<dyn Backend + Send + Sync>, BackendError> {
    open_with(kind, &ToolLookup::System)
}

/// The backend for `kind`, the iptables flavours finding their programs with `tools`.
pub fn open_with(
    kind: BackendKind,
    tools: &ToolLookup,
) -> Result<Box<dyn Backend + Send + Sync>, BackendError> {
    let iptables = |flavour| {
        Box::new(iptables::IptablesBackend::with_tools(
            flavour,
            tools.clone(),
        ))
    };
    Ok(match kind {
        BackendKind::Nftables => open_nftables()?,
        BackendKind::IptablesNft => iptables(iptables::Flavour::Nft),
        BackendKind::IptablesLegacy => iptables(iptables::Flavour::Legacy),
    })
}

fn open_nftables() -> Result<Box<dyn Backend + Send + Sync>, BackendError> {
    Ok(Box::new(nftables::NftablesBackend::new()))
}

/// What a read-back found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verification {
    /// Exactly the expected rules are present.
    Exact,
    /// Something differs; each entry says what.
    Mismatch(Vec<String>),
}

impl Verification {
    /// True for [`Verification::Exact`].
    pub fn is_exact(&self) -> bool {
        matches!(self, Verification::Exact)
    }
}

/// A failure of a backend operation; each variant keeps its cause.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// nf_tables refused or failed an operation on `what`.
    #[error("{backend} {op}: {what}: {source}")]
    Nft {
        /// Backend that failed.
        backend: BackendKind,
        /// What it was doing.
        op: Step,
        /// On what (`creating table inet interlock`, …).
        what: String,
        /// The netlink error.
        #[source]
        source: interlock_nft::NftError,
    },
    /// A program the backend needs is not installed.
    #[error("{backend} {op}: cannot run {program}: not found (searched {searched}); install the {backend} tools or choose another backend")]
    Missing {
        /// Backend that failed.
        backend: BackendKind,
        /// What it was doing.
        op: Step,
        /// The program's name.
        program: String,
        /// Where it was looked for.
        searched: String,
    },
    /// A program could not be started or waited for.
    #[error("{backend} {op}: cannot run {program}: {source}")]
    Spawn {
        /// Backend that failed.
        backend: BackendKind,
        /// What it was doing.
        op: Step,
        /// The program.
        program: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A program ran and failed.
    #[error("{backend} {op}: {command} failed ({status}): {stderr}{}", input_note(.input))]
    Tool {
        /// Backend that failed.
        backend: BackendKind,
        /// What it was doing.
        op: Step,
        /// The command, with its relevant arguments (`iptables-nft-restore --noflush (IPv4)`).
        command: String,
        /// How it exited.
        status: String,
        /// What it said.
        stderr: String,
        /// What it was fed on stdin, when that matters for the diagnosis.
        input: Option<String>,
    },
    /// The spec cannot be applied.
    #[error("{backend} {op}: {source}")]
    Spec {
        /// Backend that failed.
        backend: BackendKind,
        /// What it was doing.
        op: Step,
        /// Why.
        #[source]
        source: SpecError,
    },
    /// An address the rules rely on (Envoy's `::6` passthrough source on `lo`) could not
    /// be added.
    #[error("{what}: {source}")]
    Address {
        /// What was being added.
        what: String,
        /// The rtnetlink error.
        #[source]
        source: std::io::Error,
    },
    /// Several parts of one operation failed (e.g. both families' removal); each is kept.
    #[error("{backend} {op}: {}", .errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    Several {
        /// Backend that failed.
        backend: BackendKind,
        /// What it was doing.
        op: Step,
        /// Every failure.
        errors: Vec<BackendError>,
    },
}

fn input_note(input: &Option<String>) -> String {
    match input {
        Some(text) => format!("; input was:\n{text}"),
        None => String::new(),
    }
}

impl BackendError {
    /// The operation that failed (`open`, `apply`, `verify`, `remove`).
    pub fn op(&self) -> Step {
        match self {
            BackendError::Nft { op, .. }
            | BackendError::Missing { op, .. }
            | BackendError::Spawn { op, .. }
            | BackendError::Tool { op, .. }
            | BackendError::Spec { op, .. }
            | BackendError::Several { op, .. } => *op,
            BackendError::Address { .. } => Step::Apply,
        }
    }
}

/// Applies, verifies and removes interlock's rules. Every method runs on a thread that is
/// already inside the pod's network namespace.
pub trait Backend {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;
    /// Installs exactly the rules for `spec` in one atomic transaction; a no-op when present.
    fn apply(&self, spec: &RedirectSpec) -> Result<(), BackendError>;
    /// Reads the rules back and compares them with what `spec` needs.
    fn verify(&self, spec: &RedirectSpec) -> Result<Verification, BackendError>;
    /// Removes everything interlock installed; succeeds when nothing is there.
    fn remove(&self) -> Result<(), BackendError>;
    /// Whether the backend can work here at all (CNI STATUS): its kernel interface
    /// answers, or its programs exist. Run in the host's namespace; changes nothing.
    fn usable(&self) -> Result<(), BackendError>;
    /// [`Backend::apply`] then [`Backend::verify`]; backends that can share work between
    /// the two (one netlink socket) override it. The engine calls this on ADD.
    fn apply_and_verify(&self, spec: &RedirectSpec) -> Result<Verification, BackendError> {
        self.apply(spec)?;
        self.verify(spec)
    }
    /// [`Backend::apply_and_verify`] in a netns believed to hold none of interlock's rules
    /// (a new pod): a backend may then change first and read only afterwards. Still
    /// correct, only slower, when the belief is wrong.
    fn create_and_verify(&self, spec: &RedirectSpec) -> Result<Verification, BackendError> {
        self.apply_and_verify(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse() {
        for k in BackendKind::ALL {
            assert_eq!(k.as_str().parse::<BackendKind>().unwrap(), k);
        }
        assert!("auto".parse::<BackendKind>().is_err());
        let e = "ipfw".parse::<BackendKind>().unwrap_err().to_string();
        assert!(e.contains("ipfw") && e.contains("iptables-legacy"), "{e}");
        assert_eq!(
            serde_json::to_string(&BackendKind::IptablesLegacy).unwrap(),
            "\"iptables-legacy\""
        );
    }

    #[test]
    fn detection_gives_a_reason() {
        let d = detect();
        assert!(!d.reason.is_empty());
    }

    #[test]
    fn tools_are_found_outside_path() {
        let p = find_tool("iptables-legacy-restore");
        if p.is_absolute() {
            assert!(is_executable(&p));
        }
    }
}

//! Backends that apply a [`RedirectSpec`] inside the current network namespace.
//!
//! [`BackendKind`] names a mechanism, [`BackendSelection`] is what configuration says
//! (`auto` or a kind), [`detect`] decides `auto` from what the host uses, and [`open`]
//! gives the [`Backend`] for a kind.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::spec::RedirectSpec;

pub mod iptables;
pub mod nftables;

/// Which mechanism programs the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackendKind {
    /// nf_tables over netlink, in process.
    Nftables,
    /// `iptables-restore` of the nft flavour.
    IptablesNft,
    /// `iptables-restore` of the legacy flavour.
    IptablesLegacy,
}

impl BackendKind {
    /// Every kind.
    pub const ALL: [BackendKind; 3] = [
        BackendKind::Nftables,
        BackendKind::IptablesNft,
        BackendKind::IptablesLegacy,
    ];

    /// The configuration spelling (`nftables`, `iptables-nft`, `iptables-legacy`).
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Nftables => "nftables",
            BackendKind::IptablesNft => "iptables-nft",
            BackendKind::IptablesLegacy => "iptables-legacy",
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A backend name that is not one of the known spellings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown redirect backend {0:?}: expected auto, nftables, iptables-nft or iptables-legacy")]
pub struct UnknownBackend(pub String);

impl FromStr for BackendKind {
    type Err = UnknownBackend;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        BackendKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| UnknownBackend(s.to_string()))
    }
}

/// What configuration asks for: a fixed backend or detection from the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum BackendSelection {
    /// Pick what the host uses ([`detect`]).
    #[default]
    Auto,
    /// Always this backend.
    Fixed(BackendKind),
}

impl BackendSelection {
    /// The backend to use: `Fixed` as is, `Auto` through [`detect`].
    pub fn resolve(self) -> BackendKind {
        match self {
            BackendSelection::Fixed(k) => k,
            BackendSelection::Auto => detect().kind,
        }
    }
}

impl FromStr for BackendSelection {
    type Err = UnknownBackend;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "auto" {
            Ok(BackendSelection::Auto)
        } else {
            s.parse().map(BackendSelection::Fixed)
        }
    }
}

impl TryFrom<String> for BackendSelection {
    type Error = UnknownBackend;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<BackendSelection> for String {
    fn from(s: BackendSelection) -> String {
        s.to_string()
    }
}

impl std::fmt::Display for BackendSelection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendSelection::Auto => f.write_str("auto"),
            BackendSelection::Fixed(k) => k.fmt(f),
        }
    }
}

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

/// A failure of a backend operation.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The kernel or a tool refused an operation.
    #[error("{backend:?} {op}: {msg}")]
    Failed {
        /// Backend that failed.
        backend: BackendKind,
        /// Operation (apply, verify, remove).
        op: &'static str,
        /// What went wrong.
        msg: String,
    },
}

impl BackendError {
    /// The operation that failed (`open`, `apply`, `verify`, `remove`).
    pub fn op(&self) -> &'static str {
        match self {
            BackendError::Failed { op, .. } => op,
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_selections_parse() {
        for k in BackendKind::ALL {
            assert_eq!(k.as_str().parse::<BackendKind>().unwrap(), k);
            assert_eq!(
                k.as_str().parse::<BackendSelection>().unwrap(),
                BackendSelection::Fixed(k)
            );
        }
        assert_eq!(
            "auto".parse::<BackendSelection>().unwrap(),
            BackendSelection::Auto
        );
        assert!("auto".parse::<BackendKind>().is_err());
        let e = "ipfw".parse::<BackendSelection>().unwrap_err().to_string();
        assert!(e.contains("ipfw") && e.contains("iptables-legacy"), "{e}");
        let s: BackendSelection = serde_json::from_str("\"iptables-nft\"").unwrap();
        assert_eq!(s, BackendSelection::Fixed(BackendKind::IptablesNft));
        assert_eq!(
            serde_json::to_string(&BackendSelection::Auto).unwrap(),
            "\"auto\""
        );
        assert!(serde_json::from_str::<BackendSelection>("\"x\"").is_err());
        assert_eq!(
            serde_json::to_string(&BackendKind::IptablesLegacy).unwrap(),
            "\"iptables-legacy\""
        );
    }

    #[test]
    fn detection_gives_a_reason() {
        let d = detect();
        assert!(!d.reason.is_empty());
        assert_eq!(
            BackendSelection::Fixed(BackendKind::IptablesNft).resolve(),
            BackendKind::IptablesNft
        );
    }

    #[test]
    fn tools_are_found_outside_path() {
        let p = find_tool("iptables-legacy-restore");
        if p.is_absolute() {
            assert!(is_executable(&p));
        }
    }
}

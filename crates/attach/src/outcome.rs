//! What an ADD did about an attachment, as recorded in its state: [`Protection`] — nothing
//! needed, [`Protected`] (rules applied, read back and proven), or unprotected (only with
//! `failurePolicy: open`) — and the [`Timings`] of the work.

use interlock_redirect::backend::BackendKind;
use interlock_redirect::{ProfileName, RedirectSpec};
use serde::{Deserialize, Serialize};

/// Per-step timings of a protected ADD, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Timings {
    /// Applying and verifying the rules.
    pub rules_us: u64,
    /// The probe.
    pub probe_us: u64,
    /// The whole `protect` call (backend selection, netns entry, rules, probe).
    pub protect_us: u64,
}

/// A meshed attachment whose redirection was applied, verified and proven.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Protected {
    /// The profile that claimed the pod.
    pub profile: ProfileName,
    /// The backend that installed the rules (the one DEL and CHECK use).
    pub backend: BackendKind,
    /// Why that backend (configured, or what `auto` detected).
    pub backend_reason: String,
    /// The installed spec, as [`RedirectSpec::canonical_json`] (both address families).
    pub spec: String,
    /// [`RedirectSpec::hash`] of the installed spec.
    pub spec_hash: String,
    /// What the probe proved, one line per family (landed on the proxy, sealed without a
    /// route, or nothing captured and why).
    pub probe: Vec<String>,
    /// How long it took.
    pub timings: Timings,
}

impl Protected {
    /// The installed spec, read back from its canonical JSON; checks the recorded hash.
    pub fn installed_spec(&self) -> Result<RedirectSpec, String> {
        let spec: RedirectSpec = serde_json::from_str(&self.spec)
            .map_err(|e| format!("recorded spec is unreadable: {e}"))?;
        if spec.hash() != self.spec_hash {
            return Err(format!(
                "recorded spec does not match its recorded hash {} (state file edited or corrupt)",
                self.spec_hash
            ));
        }
        Ok(spec)
    }
}

/// What `protect` did for the attachment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "protection", rename_all = "kebab-case")]
pub enum Protection {
    /// Nothing to protect (skip / not meshed).
    NotNeeded,
    /// Rules applied, verified and proven.
    Protected(Box<Protected>),
    /// The pod should be meshed but runs WITHOUT redirection (only with
    /// `failurePolicy: open`).
    Unprotected {
        /// The step that failed (`lookup`, `spec`, `netns`, `apply`, `verify`, `probe`, …).
        step: String,
        /// Why.
        reason: String,
    },
}

impl Protection {
    /// A short label for logs.
    pub fn label(&self) -> &'static str {
        match self {
            Protection::NotNeeded => "not-needed",
            Protection::Protected(_) => "protected",
            Protection::Unprotected { .. } => "UNPROTECTED",
        }
    }
}

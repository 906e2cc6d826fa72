//! The mesh profiles a plugin config can enable (`profiles`), by name. What each one
//! means for a pod's rules is `interlock_redirect::profile`'s.

use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A mesh convention interlock can reproduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProfileName {
    /// Istio sidecar mode.
    Istio,
    /// Linkerd.
    Linkerd,
    /// Consul (consul-k8s transparent proxy).
    Consul,
    /// interlock's own `interlock.dev/*` annotations.
    Generic,
}

impl ProfileName {
    /// Every profile, in the default priority order.
    pub const ALL: [ProfileName; 4] = [
        ProfileName::Istio,
        ProfileName::Linkerd,
        ProfileName::Consul,
        ProfileName::Generic,
    ];

    /// The name used in configuration (`istio`, `linkerd`, `generic`).
    pub fn as_str(self) -> &'static str {
        match self {
            ProfileName::Istio => "istio",
            ProfileName::Linkerd => "linkerd",
            ProfileName::Consul => "consul",
            ProfileName::Generic => "generic",
        }
    }
}

impl std::fmt::Display for ProfileName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown profile name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownProfile(pub String);

impl std::fmt::Display for UnknownProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "unknown redirect profile {:?}: expected one of istio, linkerd, consul, generic",
            self.0
        )
    }
}

impl std::error::Error for UnknownProfile {}

impl FromStr for ProfileName {
    type Err = UnknownProfile;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "istio" => Ok(ProfileName::Istio),
            "linkerd" => Ok(ProfileName::Linkerd),
            "consul" => Ok(ProfileName::Consul),
            "generic" => Ok(ProfileName::Generic),
            other => Err(UnknownProfile(other.to_string())),
        }
    }
}

//! CNI spec versions this project speaks, and the version arithmetic libcni does.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

/// A CNI spec version interlock understands (0.3.0 to 1.1.0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CniVersion {
    /// 0.3.0: first version with the `interfaces`/`ips` result shape.
    V0_3_0,
    /// 0.3.1: same result shape as 0.3.0.
    V0_3_1,
    /// 0.4.0: adds CHECK and `prevResult` on DEL.
    V0_4_0,
    /// 1.0.0: drops `ips[].version`, requires `.conflist` semantics.
    V1_0_0,
    /// 1.1.0: adds GC and STATUS, more interface and route fields.
    V1_1_0,
}

impl CniVersion {
    /// Every supported version, oldest first.
    pub const ALL: [CniVersion; 5] = [
        CniVersion::V0_3_0,
        CniVersion::V0_3_1,
        CniVersion::V0_4_0,
        CniVersion::V1_0_0,
        CniVersion::V1_1_0,
    ];

    /// The newest version supported (what libcni calls `version.Current()`).
    pub const LATEST: CniVersion = CniVersion::V1_1_0;

    /// The version as the spec spells it, e.g. `"1.0.0"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            CniVersion::V0_3_0 => "0.3.0",
            CniVersion::V0_3_1 => "0.3.1",
            CniVersion::V0_4_0 => "0.4.0",
            CniVersion::V1_0_0 => "1.0.0",
            CniVersion::V1_1_0 => "1.1.0",
        }
    }

    /// True for 1.0.0 and later (no `ips[].version`).
    pub fn is_1x(self) -> bool {
        self >= CniVersion::V1_0_0
    }

    /// CHECK exists from 0.4.0 on.
    pub fn supports_check(self) -> bool {
        self >= CniVersion::V0_4_0
    }

    /// DEL receives `prevResult` from 0.4.0 on.
    pub fn del_has_prev_result(self) -> bool {
        self >= CniVersion::V0_4_0
    }

    /// GC and STATUS exist from 1.1.0 on.
    pub fn supports_gc_and_status(self) -> bool {
        self >= CniVersion::V1_1_0
    }

    /// The supported versions as strings, for error messages and VERSION output.
    pub fn all_strings() -> Vec<&'static str> {
        Self::ALL.iter().map(|v| v.as_str()).collect()
    }
}

impl fmt::Display for CniVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A version string that is not one of [`CniVersion::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unsupported CNI version {given:?}: supported versions are {}", CniVersion::all_strings().join(", "))]
pub struct UnsupportedVersion {
    /// The version string that was given.
    pub given: String,
}

impl FromStr for CniVersion {
    type Err = UnsupportedVersion;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CniVersion::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| UnsupportedVersion {
                given: s.to_string(),
            })
    }
}

impl serde::Serialize for CniVersion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for CniVersion {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A parsed `major.minor.patch` version, as libcni's `version.ParseVersion` reads it
/// (one to three numeric parts; missing parts are zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct SemVer(pub u64, pub u64, pub u64);

impl SemVer {
    /// Parses `"1"`, `"1.1"` or `"1.1.0"`; anything else is an error message.
    pub fn parse(s: &str) -> Result<SemVer, String> {
        let parts: Vec<&str> = s.split('.').collect();
        if s.is_empty() || parts.len() > 3 {
            return Err(format!("invalid version {s:?}: expected major.minor.patch"));
        }
        let mut n = [0u64; 3];
        for (i, p) in parts.iter().enumerate() {
            n[i] = p
                .parse()
                .map_err(|_| format!("invalid version {s:?}: {p:?} is not a number"))?;
        }
        Ok(SemVer(n[0], n[1], n[2]))
    }
}

/// Compares two version strings numerically, like libcni's `version.GreaterThan`.
pub fn compare(a: &str, b: &str) -> Result<Ordering, String> {
    Ok(SemVer::parse(a)?.cmp(&SemVer::parse(b)?))
}

impl From<CniVersion> for SemVer {
    fn from(v: CniVersion) -> SemVer {
        match SemVer::parse(v.as_str()) {
            Ok(s) => s,
            Err(_) => SemVer(0, 0, 0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_displays_every_version() {
        for v in CniVersion::ALL {
            assert_eq!(v.as_str().parse::<CniVersion>().unwrap(), v);
            assert_eq!(v.to_string(), v.as_str());
        }
        let err = "0.2.0".parse::<CniVersion>().unwrap_err();
        assert!(err
            .to_string()
            .contains("0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0"));
    }

    #[test]
    fn order_follows_the_spec() {
        let mut sorted = CniVersion::ALL;
        sorted.sort();
        assert_eq!(sorted, CniVersion::ALL);
        assert!(CniVersion::V0_4_0.supports_check());
        assert!(!CniVersion::V0_3_1.supports_check());
        assert!(CniVersion::V1_1_0.supports_gc_and_status());
        assert!(!CniVersion::V1_0_0.supports_gc_and_status());
    }

    #[test]
    fn compares_numerically() {
        assert_eq!(compare("0.10.0", "0.4.0").unwrap(), Ordering::Greater);
        assert_eq!(compare("1.0", "1.0.0").unwrap(), Ordering::Equal);
        assert!(compare("x", "1.0.0").is_err());
        assert!(SemVer::from(CniVersion::V1_1_0) > SemVer::from(CniVersion::V1_0_0));
    }
}

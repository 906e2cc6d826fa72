//! The spec's error object, `{"cniVersion", "code", "msg", "details"}`, and its codes.

use serde::{Deserialize, Serialize};

// The codes are defined once, in the contract every interlock crate shares.
pub use interlock_contract::codes::{
    DECODING_FAILURE, INCOMPATIBLE_VERSION, INVALID_ENVIRONMENT, INVALID_NETWORK_CONFIG,
    IO_FAILURE, LIMITED_CONNECTIVITY, NOT_AVAILABLE, TRY_AGAIN_LATER, UNKNOWN_CONTAINER,
    UNSUPPORTED_FIELD,
};

/// What a well-known code means per the spec (codes 8–10 are reserved by the spec, and
/// 0–99 in general; plugins use 100 and up for their own).
pub fn describe(code: u32) -> &'static str {
    match code {
        INCOMPATIBLE_VERSION => "incompatible CNI version",
        UNSUPPORTED_FIELD => "unsupported field in network configuration",
        UNKNOWN_CONTAINER => "container unknown or does not exist",
        INVALID_ENVIRONMENT => "invalid necessary environment variables",
        IO_FAILURE => "I/O failure",
        DECODING_FAILURE => "failed to decode content",
        INVALID_NETWORK_CONFIG => "invalid network config",
        8..=10 => "reserved by the CNI spec",
        TRY_AGAIN_LATER => "try again later",
        NOT_AVAILABLE => "the plugin is not available",
        LIMITED_CONNECTIVITY => {
            "the plugin is not available, existing containers may have limited connectivity"
        }
        0..=99 => "reserved by the CNI spec",
        _ => "plugin-specific error",
    }
}

/// A CNI error as printed on stdout by a failing plugin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("CNI error {code} ({}): {msg}{}", describe(*code), if details.is_empty() { String::new() } else { format!(" ({details})") })]
pub struct CniError {
    /// Version of the spec the error is reported in (may be empty when unknown).
    #[serde(
        rename = "cniVersion",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub cni_version: String,
    /// Error code (see the constants in this module).
    pub code: u32,
    /// Short human message.
    #[serde(default)]
    pub msg: String,
    /// Longer details (e.g. the plugin's stderr).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub details: String,
}

impl CniError {
    /// An error with a code and message, no details.
    pub fn new(cni_version: impl Into<String>, code: u32, msg: impl Into<String>) -> CniError {
        CniError {
            cni_version: cni_version.into(),
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    /// Adds details.
    pub fn with_details(mut self, details: impl Into<String>) -> CniError {
        self.details = details.into();
        self
    }

    /// The error as compact JSON followed by a newline, as a plugin prints it.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string(self).unwrap_or_else(|_| {
            format!("{{\"code\":{},\"msg\":\"unprintable error\"}}", self.code)
        });
        s.push('\n');
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serializes_like_the_spec() {
        let e = CniError::new(
            "1.1.0",
            INVALID_NETWORK_CONFIG,
            "stateDir: expected a string",
        )
        .with_details("d");
        let v: serde_json::Value = serde_json::from_str(&e.to_json()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"cniVersion":"1.1.0","code":7,"msg":"stateDir: expected a string","details":"d"})
        );
        let keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys, ["cniVersion", "code", "msg", "details"]);
        let plain: CniError = serde_json::from_str(r#"{"code":11,"msg":"later"}"#).unwrap();
        assert_eq!(plain.code, TRY_AGAIN_LATER);
        assert_eq!(plain.to_json(), "{\"code\":11,\"msg\":\"later\"}\n");
    }

    #[test]
    fn every_well_known_code_is_described() {
        for c in [1, 2, 3, 4, 5, 6, 7, 11, 50, 51] {
            assert_ne!(describe(c), "reserved by the CNI spec", "code {c}");
        }
        assert_eq!(describe(9), "reserved by the CNI spec");
        assert_eq!(describe(100), "plugin-specific error");
    }
}

//! Why a config could not be parsed: shared by the config-list model ([`crate::conf`])
//! and the plugin-entry decoder under it ([`crate::netconf`]).

use crate::gojson;

/// Why a config could not be parsed. [`ConfError::field`] names the offending field as a
/// path (`plugins[1].capabilities`), so an operator knows what to fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfError {
    /// The bytes are not JSON to the runtimes' Go decoder (truncated file, stray
    /// character, nesting deeper than 10,000…).
    #[error("invalid JSON: {0}")]
    Json(#[from] gojson::Error),
    /// A field is missing, has the wrong type or an invalid value.
    #[error("{field}: {problem}")]
    Field {
        /// Path of the field, e.g. `name` or `plugins[0].type`.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
}

impl ConfError {
    pub(crate) fn field(field: impl Into<String>, problem: impl Into<String>) -> ConfError {
        ConfError::Field {
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// The field the error is about, if it is about one.
    pub fn field_name(&self) -> Option<&str> {
        match self {
            ConfError::Field { field, .. } => Some(field),
            ConfError::Json(_) => None,
        }
    }
}

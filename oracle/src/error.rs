//! Errors of the oracle. Every error that comes from user input names the field it is about
//! (`spec.parallelism.tp`), so the CLI, the operator's `Stalled` condition and the webhook's
//! denial can all print one clear line.

use std::fmt;

/// One problem with one field of the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct FieldError {
    /// Dotted path of the field, e.g. `spec.parallelism.tp`.
    pub field: String,
    /// What is wrong, in words a user can act on.
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Why a plan (or a model card, hardware profile, CSV row) could not be used.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The document is not valid YAML/JSON at all.
    #[error("{source_name}: {message}")]
    Syntax {
        source_name: String,
        message: String,
    },
    /// A field has the wrong type, an unknown value, or breaks a rule.
    #[error("{0}")]
    Field(#[from] FieldError),
    /// Reading a file failed.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl PlanError {
    pub fn field(field: impl Into<String>, message: impl Into<String>) -> Self {
        PlanError::Field(FieldError::new(field, message))
    }

    /// The field this error is about, when there is one.
    pub fn field_path(&self) -> Option<&str> {
        match self {
            PlanError::Field(e) => Some(&e.field),
            _ => None,
        }
    }
}

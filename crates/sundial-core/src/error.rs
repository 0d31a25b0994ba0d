//! Validation errors: why a task specification was refused. Nothing is stored for a refused spec.

use thiserror::Error;

/// Why a [`crate::TaskSpec`] (or one of its fields) was refused.
///
/// `field` names the offending field as it appears on the wire (`kind`, `queue`, `key`, `payload`,
/// `run_at`, `delay`, `max_attempts`, `backoff`, `timeout`, `exclusive`).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ValidationError {
    #[error("{field} must not be empty")]
    Empty { field: &'static str },
    #[error("{field} is {len} bytes long; the limit is {max}")]
    TooLong {
        field: &'static str,
        len: usize,
        max: usize,
    },
    #[error("{field} contains a character that is not allowed: {reason}")]
    BadCharacters {
        field: &'static str,
        reason: &'static str,
    },
    #[error("payload is {len} bytes; the limit is {max}")]
    PayloadTooLarge { len: usize, max: usize },
    #[error("{field} is out of range: {reason}")]
    OutOfRange { field: &'static str, reason: String },
    #[error("{0}")]
    Conflict(&'static str),
}

impl ValidationError {
    /// The wire name of the field the error is about, when there is one.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            ValidationError::Empty { field }
            | ValidationError::TooLong { field, .. }
            | ValidationError::BadCharacters { field, .. }
            | ValidationError::OutOfRange { field, .. } => Some(field),
            ValidationError::PayloadTooLarge { .. } => Some("payload"),
            ValidationError::Conflict(_) => None,
        }
    }
}

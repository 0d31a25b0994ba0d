//! The schedules API's error type.

use sundial::{StoreError, ValidationError};
use sundial_core::schedule::{SpecError, SpecErrorKind};
use sundial_store::ScheduleError;
use thiserror::Error;

/// Everything a [`crate::Schedules`] call can fail with.
#[derive(Debug, Error)]
pub enum Error {
    /// The schedule (or request) was refused: [`SpecError::field`] and [`SpecError::reason`] say
    /// which field and why. Nothing was stored.
    #[error("invalid schedule: {0}")]
    Invalid(#[from] SpecError),
    #[error("no such schedule")]
    NotFound,
    #[error("a schedule with this id exists")]
    AlreadyExists,
    /// The store has no schedule tables (see `Sundial::schedule_store`).
    #[error("this store does not support schedules")]
    Unsupported,
    #[error(transparent)]
    Sundial(#[from] sundial::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<ScheduleError> for Error {
    fn from(e: ScheduleError) -> Self {
        match e {
            ScheduleError::NotFound => Error::NotFound,
            ScheduleError::AlreadyExists => Error::AlreadyExists,
            // Only ticks pass an expected tick; the public API never sees this.
            e @ ScheduleError::StaleTick { .. } => Error::Store(StoreError::backend(e)),
            ScheduleError::Store(s) => Error::Store(s),
            other => Error::Store(StoreError::backend(other)),
        }
    }
}

impl From<ValidationError> for Error {
    fn from(e: ValidationError) -> Self {
        let field = format!("task.{}", e.field().unwrap_or("spec"));
        Error::Invalid(SpecError::new(field, SpecErrorKind::Invalid, e.to_string()))
    }
}

impl Error {
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound)
    }
    pub fn is_invalid(&self) -> bool {
        matches!(self, Error::Invalid(_))
    }
}

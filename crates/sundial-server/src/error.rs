//! Errors on the wire: `{"error": {"code", "message", ...}}` with a status that says who must act.
//!
//! | status | code(s) | meaning |
//! |---|---|---|
//! | 400 | `malformed` | the body is not JSON (syntax error, truncated) |
//! | 404 | `not_found` | no such task (or no such route) |
//! | 405 | `method_not_allowed` | the route exists, the method does not |
//! | 409 | `idempotency_conflict` (+ `existing_id`), `already_exists` (+ `existing_id`), `wrong_state` (+ `state`), `stale_execution` (+ `state`) | the request is valid but conflicts with what is stored |
//! | 413 | `too_large` | a body, payload, result or batch over its limit |
//! | 415 | `unsupported_media_type` | a write without `content-type: application/json` (see [`crate::guard`]) |
//! | 422 | `invalid` (+ `field`, `index` in a batch) | well-formed but invalid: unknown fields, bad values |
//! | 501 | `unsupported` | the store has no tables for this (schedules or workflows) |
//! | 503 | `shutting_down`, `unavailable` | the server is stopping, its store is closed, or its database cannot be reached for now (down, restarting); always with `Retry-After` |
//! | 507 | `insufficient_storage` | the store's disk is full: nothing was stored; reads still work, and writes work again once space is freed |
//! | 500 | `internal` | anything else (the store failed) |
//!
//! One code per idea: `already_exists` is a duplicate of any kind (a live task holding the key,
//! a schedule id in use, a workflow id that is running or whose id reuse policy refuses a new
//! run); `wrong_state` is any "not in a state for this" (a task that finished, a workflow that is
//! closed).
//!
//! **Architecture Invariant:** a request that gets an error stored nothing (the library refuses a
//! whole batch for one invalid item; the server validates before it calls the library).

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use sundial::{Error, StoreError, ValidationError};
use utoipa::ToSchema;
use uuid::Uuid;

/// The body of every error response.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ErrorDetail {
    /// Stable machine-readable code: `malformed` (400), `not_found` (404),
    /// `method_not_allowed` (405), `already_exists`, `wrong_state`, `stale_execution` (409),
    /// `too_large` (413), `unsupported_media_type` (415), `invalid` (422), `internal` (500), `unsupported` (501),
    /// `shutting_down`, `unavailable` (503).
    pub code: String,
    /// Human-readable explanation.
    pub message: String,
    /// The request field at fault, when known (`kind`, `delay`, `tasks[3].payload`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// For a batch: the index of the item at fault.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    /// For `already_exists`: the live task that holds the key, or the running workflow's run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub existing_id: Option<Uuid>,
    /// For `wrong_state` and `stale_execution`: the task's current state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

/// An error response.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    /// Boxed: errors travel in `Result`s on hot paths; keep them one pointer wide.
    pub detail: Box<ErrorDetail>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            detail: Box::new(ErrorDetail {
                code: code.to_string(),
                message: message.into(),
                field: None,
                index: None,
                existing_id: None,
                state: None,
            }),
        }
    }
    pub fn malformed(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "malformed", message)
    }
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", message);
        e.detail.field = Some(field.into());
        e
    }
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }
    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.detail.field = Some(field.into());
        self
    }
    /// Marks the error as about item `index` of a batch (its field becomes `tasks[index].field`).
    pub fn at_index(mut self, index: usize) -> Self {
        self.detail.index = Some(index);
        self.detail.field = Some(match self.detail.field.take() {
            Some(f) => format!("tasks[{index}].{f}"),
            None => format!("tasks[{index}]"),
        });
        if !self.detail.message.starts_with("tasks[") {
            self.detail.message = format!("tasks[{index}]: {}", self.detail.message);
        }
        self
    }
}

/// Seconds a client is told to wait before retrying a `503`.
pub const RETRY_AFTER_SECS: u32 = 1;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let unavailable = self.status == StatusCode::SERVICE_UNAVAILABLE;
        let mut resp = (
            self.status,
            Json(ErrorBody {
                error: *self.detail,
            }),
        )
            .into_response();
        if unavailable {
            resp.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(RETRY_AFTER_SECS),
            );
        }
        resp
    }
}

impl From<ValidationError> for ApiError {
    fn from(e: ValidationError) -> Self {
        let msg = e.to_string();
        let mut err = match e {
            ValidationError::PayloadTooLarge { .. } => ApiError::too_large(msg),
            _ => ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", msg),
        };
        err.detail.field = e.field().map(str::to_string);
        err
    }
}

/// "is scheduled", "has succeeded", "has been cancelled": a task's state as the end of a sentence.
pub fn state_phrase(state: sundial::TaskState) -> &'static str {
    use sundial::TaskState as S;
    match state {
        S::Scheduled => "is scheduled",
        S::Ready => "is ready",
        S::Running => "is running",
        S::Succeeded => "has already succeeded",
        S::Dead => "is dead",
        S::Cancelled => "has been cancelled",
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        match e {
            Error::Invalid(v) => v.into(),
            Error::InvalidBatchItem { index, error } => ApiError::from(error).at_index(index),
            Error::Duplicate { existing } => {
                let mut err = ApiError::new(
                    StatusCode::CONFLICT,
                    "already_exists",
                    format!("a live task of this queue already holds this key: {existing}"),
                );
                err.detail.existing_id = Some(existing.0);
                err
            }
            Error::IdempotencyConflict { existing, version } => {
                let mut err = ApiError::new(
                    StatusCode::CONFLICT,
                    "idempotency_conflict",
                    format!(
                        "this idempotency key is remembered for another request (version \
                         {version}, task {existing}): use a new key, or a higher version for a \
                         new revision"
                    ),
                );
                err.detail.existing_id = Some(existing.0);
                err
            }
            Error::NotFound => ApiError::not_found("no such task"),
            Error::WrongState { state } => {
                let mut err = ApiError::new(
                    StatusCode::CONFLICT,
                    "wrong_state",
                    format!("the task {}", state_phrase(state)),
                );
                err.detail.state = Some(state.to_string());
                err
            }
            Error::StaleExecution { state } => {
                let mut err = ApiError::new(
                    StatusCode::CONFLICT,
                    "stale_execution",
                    format!(
                        "this execution id does not match the task's current attempt (the task {}): stop working on it",
                        state_phrase(state)
                    ),
                );
                err.detail.state = Some(state.to_string());
                err
            }
            Error::ShuttingDown => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                "the server is shutting down",
            ),
            Error::Store(StoreError::Closed) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the store is closed",
            ),
            Error::Store(StoreError::Unavailable { source: why }) => {
                tracing::warn!(error = %why, "request refused: the database is unavailable");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    format!("the database is unavailable for now ({why}); retry"),
                )
            }
            Error::Store(StoreError::Full { step, source }) => {
                let why = match step {
                    Some(step) => format!("{step}: {source}"),
                    None => source.to_string(),
                };
                tracing::warn!(error = %why, "write refused: the store's disk is full");
                ApiError::new(
                    StatusCode::INSUFFICIENT_STORAGE,
                    "insufficient_storage",
                    format!(
                        "the server's disk is full, nothing was stored ({why}); retry once space is freed"
                    ),
                )
            }
            Error::Store(StoreError::LeaseLost { shard }) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                format!("shard {shard} is owned by another node; retry"),
            ),
            other => {
                tracing::error!(error = %other, "request failed");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    other.to_string(),
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sundial::{TaskId, TaskState};

    #[test]
    fn a_full_disk_is_insufficient_storage() {
        let api = ApiError::from(Error::Store(StoreError::full(std::io::Error::other(
            "database or disk is full",
        ))));
        assert_eq!(api.status, StatusCode::INSUFFICIENT_STORAGE);
        assert_eq!(api.detail.code, "insufficient_storage");
        assert!(
            api.detail.message.contains("disk is full")
                && api.detail.message.contains("(database or disk is full)"),
            "{}",
            api.detail.message
        );
    }

    #[test]
    fn maps_library_errors() {
        let id = TaskId(Uuid::nil());
        let cases: Vec<(Error, StatusCode, &str)> = vec![
            (
                Error::Invalid(ValidationError::Empty { field: "kind" }),
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid",
            ),
            (
                Error::Invalid(ValidationError::PayloadTooLarge { len: 10, max: 5 }),
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
            ),
            (
                Error::Duplicate { existing: id },
                StatusCode::CONFLICT,
                "already_exists",
            ),
            (Error::NotFound, StatusCode::NOT_FOUND, "not_found"),
            (
                Error::WrongState {
                    state: TaskState::Succeeded,
                },
                StatusCode::CONFLICT,
                "wrong_state",
            ),
            (
                Error::StaleExecution {
                    state: TaskState::Cancelled,
                },
                StatusCode::CONFLICT,
                "stale_execution",
            ),
            (
                Error::ShuttingDown,
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
            ),
            (
                Error::Store(StoreError::backend(std::io::Error::other("disk"))),
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
            ),
            (
                Error::Store(StoreError::unavailable(std::io::Error::other(
                    "connection refused",
                ))),
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
            ),
        ];
        for (e, status, code) in cases {
            let api = ApiError::from(e);
            assert_eq!(api.status, status);
            assert_eq!(api.detail.code, code);
        }
    }

    #[test]
    fn unavailable_answers_carry_retry_after() {
        for e in [
            Error::Store(StoreError::unavailable(std::io::Error::other(
                "connection refused",
            ))),
            Error::Store(StoreError::Closed),
            Error::ShuttingDown,
        ] {
            let resp = ApiError::from(e).into_response();
            assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(
                resp.headers()
                    .get(axum::http::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok()),
                Some("1")
            );
        }
        let resp = ApiError::from(Error::NotFound).into_response();
        assert!(
            resp.headers()
                .get(axum::http::header::RETRY_AFTER)
                .is_none()
        );
    }

    #[test]
    fn conflict_messages_read_as_sentences() {
        let api = ApiError::from(Error::WrongState {
            state: TaskState::Succeeded,
        });
        assert_eq!(api.detail.message, "the task has already succeeded");
        let api = ApiError::from(Error::StaleExecution {
            state: TaskState::Running,
        });
        assert!(
            api.detail
                .message
                .starts_with("this execution id does not match the task's current attempt"),
            "{api:?}"
        );
    }

    #[test]
    fn batch_item_errors_name_the_index() {
        let api = ApiError::from(Error::InvalidBatchItem {
            index: 3,
            error: ValidationError::Empty { field: "kind" },
        });
        assert_eq!(api.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(api.detail.index, Some(3));
        assert_eq!(api.detail.field.as_deref(), Some("tasks[3].kind"));
        assert!(api.detail.message.starts_with("tasks[3]: "));
    }

    #[test]
    fn duplicate_carries_existing_id() {
        let id = TaskId(Uuid::from_u128(7));
        let api = ApiError::from(Error::Duplicate { existing: id });
        assert_eq!(api.detail.existing_id, Some(id.0));
    }
}

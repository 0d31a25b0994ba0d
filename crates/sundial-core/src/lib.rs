//! # sundial-core
//!
//! The pure heart of Sundial: what a task is, which state changes are legal, how retries back off,
//! what input is acceptable, and how time is read. Everything here is deterministic and free of I/O:
//! no threads, no files, no sockets, no async runtime, no wall clock. Randomness (retry jitter) and
//! the current time are passed in by the caller.
//!
//! **Architecture Invariant:** this crate never depends on tokio, rusqlite, tokio-postgres or axum
//! (checked by `tests/layering.rs` in the `sundial` crate).

pub mod duration;
pub mod error;
pub mod id;
pub mod namespace;
pub mod priority;
pub mod retry;
pub mod rfc3339;
pub mod schedule;
pub mod shard;
pub mod target;
pub mod task;
pub mod time;
pub mod trace;

pub use error::ValidationError;
pub use id::{ExecutionId, RunId, TaskId, TokenId};
pub use priority::Priority;
pub use retry::Backoff;
pub use schedule::{
    CompiledSpec, DstPolicy, Recurrence, RepeatedTime, ScheduleSpec, SkippedTime, SpecError,
    SpecErrorKind,
};
pub use shard::{rendezvous_owner, shard_for};
pub use target::{PushMethod, Target, authority};
pub use task::{
    Due, Exclusive, ExclusiveMode, INTERNAL_QUEUE_PREFIX, Limits, NewTask, RateLimit, Tags, Task,
    TaskSpec, TaskState, check_tags, is_internal_queue,
};
pub use time::{Clock, ManualClock, Timestamp};
pub use trace::TraceContext;

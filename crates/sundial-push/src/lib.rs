//! # sundial-push
//!
//! Push delivery: a task, a schedule's task template or a workflow activity that names an HTTP
//! [`Target`](sundial_core::Target) is delivered by Sundial itself, which calls the URL at the
//! due time, signs the call (Standard Webhooks), retries it with the task's backoff and keeps
//! the answer.
//!
//! - [`address`]: which addresses may be called (a pure classifier and the `--push-allow` list).
//! - [`resolve`]: name resolution where every address is checked and the connection goes to
//!   the checked address.
//! - [`sign`]: `whsec_…` secrets and `v1,` signatures.
//! - [`client`]: one call: headers, no redirects, no proxies, the body cap and the timeout.
//! - [`outcome`]: what an answer means for the task.
//! - [`executor`]: the engine's push handler (a task's own target).
//! - [`queue`]: queue default targets, served through the worker protocol.
//!
//! **Architecture Invariant:** no socket opens to an address the policy refuses; every call is
//! bounded by its timeout and reads at most [`client::MAX_RESPONSE_BYTES`] of its answer.
//! **API Boundary:** sits above the `sundial` facade and below the server; the engine never
//! depends on it.

pub mod address;
pub mod client;
pub mod executor;
pub mod outcome;
pub mod queue;
pub mod resolve;
pub mod sign;

pub use address::{AddressClass, AddressPolicy, AllowEntry, AllowEntryError, Refused, classify};
pub use client::{
    CallError, CallRequest, CallResponse, ClientConfig, MAX_RESPONSE_BYTES, PushClient,
};
pub use executor::{Delivery, PushConfig, PushExecutor, SecretAddError};
pub use outcome::{Verdict, classify_status, parse_retry_after};
pub use queue::{PUSH_WORKER, QueuePushConfig};
pub use resolve::{Lookup, StaticLookup, SystemLookup};
pub use sign::{SigningKey, signature_header};

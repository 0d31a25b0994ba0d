//! Support code shared by the `sundial` binary and the `sundial-load` load generator: a typed
//! client for the v1 HTTP API and the credentials it sends. The commands themselves live in the
//! binary.

pub mod client;
pub mod connect;

pub use client::{Client, ClientError, http_client_builder};
pub use connect::Credentials;

//! Support code shared by the `sundial` binary and the `sundial-load` load generator: a typed
//! client for the v1 HTTP API. The commands themselves live in the binary.

pub mod client;

pub use client::{Client, ClientError, http_client_builder};

//! The access store conformance suite (tokens, namespaces, audit log) against PostgreSQL. The
//! environment rules and the fresh schemas are described in `common/mod.rs`.
#![allow(clippy::unwrap_used)] // test code: a panic is a failed test

mod common;

sundial_store::access_store_conformance!(common::fresh_postgres);

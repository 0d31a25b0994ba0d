//! The push secret store conformance suite against PostgreSQL (environment rules in
//! `common/mod.rs`).
#![allow(clippy::unwrap_used)] // test code: a panic is a failed test

mod common;

sundial_store::push_store_conformance!(common::fresh_postgres);

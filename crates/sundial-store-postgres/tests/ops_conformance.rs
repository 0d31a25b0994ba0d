//! The operations conformance suite against PostgreSQL (see `common/mod.rs` for the environment).
#![allow(clippy::unwrap_used)] // test code: a panic is a failed test

use std::sync::Arc;

use sundial_store::Store;

mod common;

use common::TestSchema;

async fn fresh_store() -> Option<(Arc<dyn Store>, TestSchema)> {
    let (store, guard) = common::fresh_postgres().await?;
    Some((store, guard))
}

sundial_store::ops_conformance!(fresh_store);

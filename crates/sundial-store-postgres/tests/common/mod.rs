//! What every PostgreSQL test file shares: stores in fresh schemas and connections. The test
//! database's URL (and when to skip: `SUNDIAL_TEST_DATABASE_URL`, `SUNDIAL_REQUIRE_POSTGRES=1`)
//! and the schemas dropped afterwards are the crate's `testkit` (`src/testkit.rs`), which the
//! end-to-end tests of `sundial-cli` share.
#![allow(dead_code)] // each test file uses its own part of this module

use std::sync::Arc;

#[allow(unused_imports)] // as above: not every test file uses every name
pub use sundial_store_postgres::testkit::{TestSchema, database_url, fresh_schema_name};
use sundial_store_postgres::{PostgresError, PostgresOptions, PostgresStore};

pub async fn connect(url: &str, schema: &str) -> Result<PostgresStore, PostgresError> {
    PostgresStore::connect(
        url,
        PostgresOptions {
            schema: schema.to_string(),
            pool_size: 4,
            ..PostgresOptions::default()
        },
    )
    .await
}

/// A store in a fresh schema (and the guard that drops it), or `None` when PostgreSQL tests are
/// skipped here.
pub async fn fresh_postgres() -> Option<(Arc<PostgresStore>, TestSchema)> {
    let url = database_url()?;
    let guard = TestSchema::new(&url);
    let store = connect(&url, &guard.schema)
        .await
        .expect("connect to PostgreSQL");
    Some((Arc::new(store), guard))
}

/// A plain connection for looking at the schema from outside the store.
pub async fn raw_client(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    client
}

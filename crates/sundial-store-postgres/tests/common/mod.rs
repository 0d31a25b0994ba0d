//! What every PostgreSQL test file shares: the test database's URL (and when to skip), fresh
//! schemas that are dropped afterwards, and connections.
//!
//! The tests need a PostgreSQL server: `SUNDIAL_TEST_DATABASE_URL` names it (for example
//! `postgres://postgres@127.0.0.1:5432/test`). Each test works in a fresh schema of its own,
//! `t_<pid>_<counter>_<random>`, dropped when the test ends, so runs and tests never collide.
//! Without the variable every test prints `skipped: SUNDIAL_TEST_DATABASE_URL not set` and
//! passes, unless `SUNDIAL_REQUIRE_POSTGRES=1` (as CI sets it), in which case it fails.
#![allow(dead_code)] // each test file uses its own part of this module

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sundial_store_postgres::{PostgresError, PostgresOptions, PostgresStore};

pub const URL_VAR: &str = "SUNDIAL_TEST_DATABASE_URL";
pub const REQUIRE_VAR: &str = "SUNDIAL_REQUIRE_POSTGRES";

/// The test database's URL, or `None` (after saying so) when the tests are to be skipped.
pub fn database_url() -> Option<String> {
    match std::env::var(URL_VAR) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            if std::env::var(REQUIRE_VAR).is_ok_and(|v| v == "1") {
                panic!("{URL_VAR} is not set, but {REQUIRE_VAR}=1 requires the PostgreSQL tests");
            }
            // Straight to the process's stderr, past the test harness's capture, so that a
            // skip is visible in a plain `cargo test` run.
            let test = std::thread::current().name().unwrap_or("?").to_string();
            let line = format!("\nskipped: {URL_VAR} not set ({test})\n");
            let _ = std::io::stderr().write_all(line.as_bytes());
            None
        }
    }
}

/// A schema name no other test or run uses.
pub fn fresh_schema_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("t_{}_{n}_{}", std::process::id(), &random[..8])
}

/// Drops its schema when dropped (after the store that used it).
pub struct SchemaGuard {
    pub url: String,
    pub schema: String,
}

impl SchemaGuard {
    pub fn new(url: &str) -> Self {
        SchemaGuard {
            url: url.to_string(),
            schema: fresh_schema_name(),
        }
    }
}

impl Drop for SchemaGuard {
    fn drop(&mut self) {
        let url = self.url.clone();
        let sql = format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.schema);
        // Drop runs inside the test's runtime, which cannot be blocked on from within: use a
        // thread with a small runtime of its own.
        let done = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
                let task = tokio::spawn(conn);
                let res = client.batch_execute(&sql).await;
                drop(client);
                let _ = task.await;
                res
            })
        })
        .join();
        if !matches!(done, Ok(Ok(()))) {
            eprintln!("could not drop test schema {}: {done:?}", self.schema);
        }
    }
}

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
pub async fn fresh_postgres() -> Option<(Arc<PostgresStore>, SchemaGuard)> {
    let url = database_url()?;
    let guard = SchemaGuard::new(&url);
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

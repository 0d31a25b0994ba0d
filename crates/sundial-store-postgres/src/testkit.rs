//! What every PostgreSQL test shares, in this crate's tests and in the end-to-end tests of
//! `sundial-cli` (feature `testkit`): the test database's URL and when to skip, and fresh schemas
//! that are dropped afterwards.
//!
//! `SUNDIAL_TEST_DATABASE_URL` names the server (for example
//! `postgres://postgres@127.0.0.1:5432/test`). Each test works in a fresh schema of its own,
//! `t_<pid>_<counter>_<random>`, dropped when the test ends, so runs and tests never collide.
//! Without the variable every PostgreSQL test prints `skipped: SUNDIAL_TEST_DATABASE_URL not set`
//! and passes, unless `SUNDIAL_REQUIRE_POSTGRES=1` (as CI sets it), in which case it fails.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};

pub const URL_VAR: &str = "SUNDIAL_TEST_DATABASE_URL";
pub const REQUIRE_VAR: &str = "SUNDIAL_REQUIRE_POSTGRES";

/// Whether `SUNDIAL_REQUIRE_POSTGRES=1`: a PostgreSQL test that cannot run fails instead of
/// being skipped.
pub fn postgres_required() -> bool {
    std::env::var(REQUIRE_VAR).is_ok_and(|v| v == "1")
}

/// The test database's URL, or `None` (after saying so) when the tests are to be skipped.
///
/// # Panics
///
/// Without the URL when [`postgres_required`].
pub fn database_url() -> Option<String> {
    match std::env::var(URL_VAR) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            if postgres_required() {
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

/// A fresh schema name on the test database; the schema (with everything in it) is dropped when
/// this is dropped. The schema itself is created by the first store that uses it.
pub struct TestSchema {
    pub url: String,
    pub schema: String,
}

impl TestSchema {
    /// A fresh schema on `url`.
    pub fn new(url: &str) -> TestSchema {
        TestSchema {
            url: url.to_string(),
            schema: fresh_schema_name(),
        }
    }

    /// A fresh schema on the test database, or `None` when PostgreSQL tests are skipped here
    /// (see [`database_url`]).
    pub fn fresh() -> Option<TestSchema> {
        Some(TestSchema::new(&database_url()?))
    }

    /// A plain connection, for looking at the schema from outside the store (its driver runs on
    /// the caller's runtime).
    pub async fn client(&self) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls)
            .await
            .expect("connect to PostgreSQL");
        tokio::spawn(conn);
        client
    }
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        let url = self.url.clone();
        let sql = format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.schema);
        // Drop may run inside the test's runtime, which cannot be blocked on from within: use a
        // thread with a small runtime of its own.
        let done = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for dropping the test schema");
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

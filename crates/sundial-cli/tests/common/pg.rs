//! PostgreSQL for the end-to-end tests: the test database's URL (and when to skip), fresh
//! schemas that are dropped afterwards, and plain connections for looking at a schema from
//! outside the servers. These are the PostgreSQL store's test support
//! (`sundial-store-postgres/src/testkit.rs`, feature `testkit`), shared with the store's own
//! PostgreSQL tests: without `SUNDIAL_TEST_DATABASE_URL` every PostgreSQL test prints
//! `skipped: SUNDIAL_TEST_DATABASE_URL not set` and passes, unless `SUNDIAL_REQUIRE_POSTGRES=1`
//! (as CI sets it), in which case it fails.

#[allow(unused_imports)] // not every test file uses every name
pub use sundial_store_postgres::testkit::{TestSchema, postgres_required};

/// `url` with `application_name` set, so the database can tell the servers' sessions apart
/// (`current_setting('application_name')`, `pg_stat_activity`). Works for URLs and for
/// `key=value` strings.
pub fn with_application_name(url: &str, name: &str) -> String {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let sep = if url.contains('?') { '&' } else { '?' };
        format!("{url}{sep}application_name={name}")
    } else {
        format!("{url} application_name={name}")
    }
}

//! The push secret store conformance suite against PostgreSQL (environment rules in
//! `common/mod.rs`), and the migration that gave secrets a namespace.
#![allow(clippy::unwrap_used)] // test code: a panic is a failed test

mod common;

use sundial_store::PushSecretStore;

sundial_store::push_store_conformance!(common::fresh_postgres);

/// Push secrets stored before they had a namespace (before migration 15) are the default
/// namespace's after it; no other namespace sees them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_secrets_older_than_namespaces_are_the_default_namespaces() {
    let Some(url) = common::database_url() else {
        return;
    };
    let guard = common::TestSchema::new(&url);
    let schema = guard.schema.clone();
    drop(common::connect(&url, &schema).await.unwrap());
    let client = common::raw_client(&url).await;
    client
        .batch_execute(&format!(
            "DROP INDEX \"{schema}\".push_secrets_namespace;
             ALTER TABLE \"{schema}\".push_secrets DROP COLUMN namespace;
             INSERT INTO \"{schema}\".push_secrets (id, secret, created_at, expires_at)
                 VALUES ('ps_old', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', 5, NULL);
             DROP INDEX \"{schema}\".tasks_ready;
             ALTER TABLE \"{schema}\".tasks DROP COLUMN priority;
             CREATE INDEX tasks_ready ON \"{schema}\".tasks (queue, id) WHERE state = 'ready';
             ALTER TABLE \"{schema}\".tasks DROP COLUMN exclusive_limit;
             DROP INDEX \"{schema}\".tasks_debounce;
             ALTER TABLE \"{schema}\".tasks DROP COLUMN debounce_key;
             DROP TABLE \"{schema}\".rate_limits;
             DROP INDEX \"{schema}\".tasks_rate_limited;
             ALTER TABLE \"{schema}\".tasks DROP COLUMN rate;
             DROP TRIGGER task_attempt_of_row ON \"{schema}\".tasks;
             DROP FUNCTION \"{schema}\".task_attempt_of_row();
             DELETE FROM \"{schema}\".schema_migrations WHERE version >= 15;"
        ))
        .await
        .unwrap();
    let store = common::connect(&url, &schema).await.unwrap();
    let default = store.push_secrets("default").await.unwrap();
    assert_eq!(default.len(), 1);
    assert_eq!(default[0].id, "ps_old");
    assert_eq!(default[0].namespace, "default");
    assert!(store.push_secrets("acme").await.unwrap().is_empty());
    drop(store);
    drop(guard);
}

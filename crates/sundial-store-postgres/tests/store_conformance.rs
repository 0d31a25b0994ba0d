//! The shared store conformance suite against PostgreSQL, plus what only this backend has: the
//! migration runner (concurrent starts, a newer schema refused) and counters kept per backend.
//!
//! The environment rules (`SUNDIAL_TEST_DATABASE_URL`, skipping, `SUNDIAL_REQUIRE_POSTGRES=1`) and
//! the fresh schemas are described in `common/mod.rs`.
#![allow(clippy::unwrap_used)] // test code: a panic is a failed test

use std::sync::Arc;

use sundial_core::{Limits, TaskId, TaskSpec, TaskState, Timestamp};
use sundial_store::{ClaimOutcome, ClaimTarget, DueClaim, Inserted, Store};
use sundial_store_postgres::{PostgresError, SCHEMA_VERSION};

mod common;

use common::{TestSchema, connect, database_url, fresh_schema_name, raw_client};

/// A store in a fresh schema, or `None` when PostgreSQL tests are skipped here.
async fn fresh_store() -> Option<(Arc<dyn Store>, TestSchema)> {
    let (store, guard) = common::fresh_postgres().await?;
    Some((store, guard))
}

sundial_store::store_conformance!(fresh_store);

async fn recorded_versions(client: &tokio_postgres::Client, schema: &str) -> Vec<i32> {
    client
        .query(
            &format!("SELECT version FROM \"{schema}\".schema_migrations ORDER BY version"),
            &[],
        )
        .await
        .expect("read schema_migrations")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

async fn schema_exists(client: &tokio_postgres::Client, schema: &str) -> bool {
    client
        .query_opt("SELECT 1 FROM pg_namespace WHERE nspname = $1", &[&schema])
        .await
        .unwrap()
        .is_some()
}

/// Nodes starting together on a fresh schema: every `connect` succeeds, the migrations run once
/// (each version recorded once), and the stores work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_connects_migrate_once() {
    let Some(url) = database_url() else { return };
    let schema = fresh_schema_name();
    let _guard = TestSchema {
        url: url.clone(),
        schema: schema.clone(),
    };
    let connects: Vec<_> = (0..4)
        .map(|_| {
            let (url, schema) = (url.clone(), schema.clone());
            tokio::spawn(async move { connect(&url, &schema).await })
        })
        .collect();
    let mut stores = Vec::new();
    for c in connects {
        stores.push(c.await.unwrap().expect("every concurrent connect succeeds"));
    }
    let client = raw_client(&url).await;
    assert_eq!(
        recorded_versions(&client, &schema).await,
        (1..=SCHEMA_VERSION).collect::<Vec<_>>()
    );
    // Connecting again later changes nothing either.
    stores.push(connect(&url, &schema).await.expect("reconnect"));
    assert_eq!(
        recorded_versions(&client, &schema).await,
        (1..=SCHEMA_VERSION).collect::<Vec<_>>()
    );
    // All of them see one database.
    let t = TaskSpec::new("k")
        .validate(
            TaskId(uuid::Uuid::now_v7()),
            Timestamp(1),
            4,
            &Limits::default(),
        )
        .unwrap();
    let id = t.id;
    stores[0].insert(vec![t]).await.unwrap();
    for s in &stores {
        assert_eq!(s.get(id).await.unwrap().unwrap().id, id);
    }
}

/// A schema recording a version newer than this build is refused, and left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn newer_schema_is_refused() {
    let Some(url) = database_url() else { return };
    let schema = fresh_schema_name();
    let _guard = TestSchema {
        url: url.clone(),
        schema: schema.clone(),
    };
    drop(connect(&url, &schema).await.expect("first connect"));
    let client = raw_client(&url).await;
    let newer = SCHEMA_VERSION + 1;
    client
        .execute(
            &format!(
                "INSERT INTO \"{schema}\".schema_migrations (version, name) VALUES ($1, 'from the future')"
            ),
            &[&newer],
        )
        .await
        .unwrap();
    match connect(&url, &schema).await {
        Err(PostgresError::TooNew { found, supported }) => {
            assert_eq!(found, i64::from(newer));
            assert_eq!(supported, i64::from(SCHEMA_VERSION));
        }
        Err(other) => panic!("expected TooNew, got {other}"),
        Ok(_) => panic!("a newer schema must be refused"),
    }
    let mut expected: Vec<i32> = (1..=SCHEMA_VERSION).collect();
    expected.push(newer);
    assert_eq!(recorded_versions(&client, &schema).await, expected);
}

/// A schema that does not exist yet is created; bad schema names are refused before any SQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_is_created_and_names_are_checked() {
    let Some(url) = database_url() else { return };
    let schema = fresh_schema_name();
    let _guard = TestSchema {
        url: url.clone(),
        schema: schema.clone(),
    };
    let client = raw_client(&url).await;
    assert!(!schema_exists(&client, &schema).await);
    let store = connect(&url, &schema).await.unwrap();
    assert_eq!(store.schema(), schema);
    assert!(schema_exists(&client, &schema).await);
    for bad in ["Upper", "a;b", "pg_x", "has space"] {
        assert!(matches!(
            connect(&url, bad).await,
            Err(PostgresError::SchemaName { .. })
        ));
    }
}

/// Counts stay exact when the transitions of one queue are made by many backends (each adds to
/// its own counter stripe), and the stripes of backends that are gone fold into one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_survive_many_backends_and_fold() {
    let Some(url) = database_url() else { return };
    let schema = fresh_schema_name();
    let _guard = TestSchema {
        url: url.clone(),
        schema: schema.clone(),
    };
    let now = Timestamp(1_000);
    let new = || {
        TaskSpec::new("k")
            .queue("q")
            .validate(TaskId(uuid::Uuid::now_v7()), now, 4, &Limits::default())
            .unwrap()
    };
    let mut ids = Vec::new();
    for round in 0..3 {
        // A store of its own each round: new connections, new backends.
        let store = connect(&url, &schema).await.unwrap();
        let batch: Vec<_> = (0..5).map(|_| new()).collect();
        ids.extend(batch.iter().map(|t| t.id));
        let out = store.insert(batch).await.unwrap();
        assert!(out.iter().all(|r| matches!(r, Inserted::Created(_))));
        let claims = ids
            .iter()
            .skip(round)
            .take(2)
            .map(|id| DueClaim {
                id: *id,
                target: ClaimTarget::Run {
                    execution: sundial_core::ExecutionId(uuid::Uuid::new_v4()),
                    lease_until: Timestamp(now.0 + 10),
                    worker: None,
                },
            })
            .collect();
        for o in store.claim_due(claims, now, None).await.unwrap() {
            assert!(matches!(
                o,
                ClaimOutcome::Started(_) | ClaimOutcome::NotClaimable
            ));
        }
        // Every running one expires: back to scheduled, by this backend.
        store
            .expire_leases(Timestamp(now.0 + 100), 100, None)
            .await
            .unwrap();
    }
    let store = connect(&url, &schema).await.unwrap();
    let mut expected = std::collections::HashMap::new();
    for id in &ids {
        let t = store.get(*id).await.unwrap().unwrap();
        *expected.entry(t.state).or_insert(0u64) += 1;
    }
    let counts = store.count_by_state().await.unwrap();
    let got: std::collections::HashMap<TaskState, u64> =
        counts.iter().map(|c| (c.state, c.count)).collect();
    assert_eq!(got, expected);
    assert_eq!(got.values().sum::<u64>(), 15);

    // Once the earlier stores' backends are gone, their stripes fold into stripe 0 (the server
    // notices a closed connection a moment after the client drops it: wait for that, boundedly).
    let client = raw_client(&url).await;
    let stripes = |sql: &'static str| {
        let client = &client;
        let sql = sql.replace("{schema}", &schema);
        async move { client.query_one(&sql, &[]).await.unwrap().get::<_, i64>(0) }
    };
    let mut folded = false;
    for _ in 0..100 {
        assert_eq!(store.count_by_state().await.unwrap(), counts);
        let dead = stripes(
            "SELECT count(*) FROM \"{schema}\".task_counts c WHERE stripe <> 0 \
             AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = c.stripe)",
        )
        .await;
        let zero = stripes("SELECT count(*) FROM \"{schema}\".task_counts WHERE stripe = 0").await;
        if dead == 0 && zero > 0 {
            folded = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(folded, "stripes of gone backends are folded into stripe 0");
}

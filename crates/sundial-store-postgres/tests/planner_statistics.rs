//! The hot statements' plans do not depend on luck with statistics (`statistics.rs`, `sql.rs`).
//!
//! Each statement is planned once per connection, generically, and the first plans are made on
//! a fresh, empty `tasks` without statistics, where every partial index looks as cheap as a
//! primary-key lookup. A statement that locks rows and then updates them must update through
//! the locked rows (a TID scan), not read a partial index of all rows in the state it expects;
//! a statement given task ids must find them by key once the store has given `tasks`
//! statistics, which it does by itself once the table holds rows. The environment rules are in
//! `common/mod.rs`.
#![allow(clippy::unwrap_used)] // test code: a panic is a failed test

use serde_json::Value;
use sundial_core::{TaskId, TaskSpec, Timestamp};
use sundial_store::Store;
use sundial_store_postgres::statistics::{PlannedStatement, StatisticsVerdict};

mod common;

/// A scan of `tasks`: its node type, index and whether it is keyed (a TID scan, or an index scan
/// whose condition names the id).
#[derive(Debug)]
struct TaskScan {
    node: String,
    index: String,
    keyed: bool,
}

/// The scans of `tasks` in `node` and below; with `skip_ctes`, not those of CTE subplans.
fn task_scans(node: &Value, skip_ctes: bool, out: &mut Vec<TaskScan>) {
    let s = |k: &str| {
        node.get(k)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    if skip_ctes && s("Subplan Name").starts_with("CTE") {
        return;
    }
    if s("Node Type").contains("Scan") && s("Relation Name") == "tasks" {
        let cond = s("Index Cond");
        out.push(TaskScan {
            keyed: s("Node Type") == "Tid Scan" || cond.contains("(id = "),
            node: s("Node Type"),
            index: s("Index Name"),
        });
    }
    if let Some(Value::Array(children)) = node.get("Plans") {
        for c in children {
            task_scans(c, skip_ctes, out);
        }
    }
}

/// The first `ModifyTable` node (the `UPDATE` or `DELETE` of `tasks`) in `node` and below.
fn update_node(node: &Value) -> Option<&Value> {
    if node.get("Node Type").and_then(Value::as_str) == Some("ModifyTable") {
        return Some(node);
    }
    node.get("Plans")?.as_array()?.iter().find_map(update_node)
}

async fn plan(store: &sundial_store_postgres::PostgresStore, which: PlannedStatement) -> Value {
    let text = store.explain_generic(which).await.unwrap();
    let plan: Value = serde_json::from_str(&text).unwrap();
    plan[0]["Plan"].clone()
}

/// The scans of `tasks` that the statement's `UPDATE` reads its rows with.
async fn update_scans(
    store: &sundial_store_postgres::PostgresStore,
    which: PlannedStatement,
) -> Vec<TaskScan> {
    let plan = plan(store, which).await;
    let update = update_node(&plan).expect("an UPDATE or DELETE in the plan");
    let mut found = Vec::new();
    for child in update["Plans"].as_array().unwrap() {
        task_scans(child, true, &mut found);
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_after_a_lock_find_their_rows_by_key_even_without_statistics() {
    let Some((store, _guard)) = common::fresh_postgres().await else {
        return;
    };
    for which in [
        PlannedStatement::ClaimReady,
        PlannedStatement::CompleteMany,
        PlannedStatement::ExpireLeases,
    ] {
        let found = update_scans(&store, which).await;
        assert!(
            !found.is_empty() && found.iter().all(|s| s.keyed),
            "{which:?} updates through {found:?} on an empty table"
        );
    }
    // The claim's update goes through the rows its candidates locked.
    let claim = update_scans(&store, PlannedStatement::ClaimReady).await;
    assert!(claim.iter().all(|s| s.node == "Tid Scan"), "{claim:?}");
}

fn due_tasks(n: usize, now: Timestamp) -> Vec<sundial_core::NewTask> {
    (0..n)
        .map(|i| {
            TaskSpec::new("k")
                .queue("q")
                .run_at(Timestamp(now.0 + i64::try_from(i).unwrap()))
                .validate(
                    TaskId(uuid::Uuid::now_v7()),
                    now,
                    4,
                    &sundial_core::Limits::default(),
                )
                .unwrap()
        })
        .collect()
}

async fn reltuples(guard: &common::TestSchema) -> f32 {
    let client = common::raw_client(&guard.url).await;
    client
        .query_one(
            &format!(
                "SELECT reltuples FROM pg_class WHERE oid = '\"{}\".tasks'::regclass",
                guard.schema
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_that_fills_up_gets_statistics_and_ids_are_found_by_key() {
    let Some((store, guard)) = common::fresh_postgres().await else {
        return;
    };
    let now = Timestamp(1_700_000_000_000);
    let (_, empty) = store.keep_statistics().await.unwrap();
    assert_eq!(empty, StatisticsVerdict::Current, "nothing to analyze yet");
    assert!(reltuples(&guard).await < 0.0, "never analyzed");

    for chunk in due_tasks(3_000, now).chunks(1_000) {
        store.insert(chunk.to_vec()).await.unwrap();
    }
    let (seen, verdict) = store.keep_statistics().await.unwrap();
    assert_eq!(verdict, StatisticsVerdict::Missing, "{seen:?}");
    assert!(reltuples(&guard).await >= 3_000.0, "analyzed");
    let (_, again) = store.keep_statistics().await.unwrap();
    assert_eq!(again, StatisticsVerdict::Current, "not again at once");

    // With statistics, every statement finds the tasks it is given by key, besides what drives
    // it: the claim reads its candidates in rank order (`tasks_ready`) and the reaper the ended
    // leases. A completion group finds its rows by key too, though the statistics say that
    // no task runs: read among the running ones, it would read every running task per call
    // once many run.
    for (which, driver) in [
        (PlannedStatement::ReadyClaimed, &[][..]),
        (PlannedStatement::ReadyEach, &[]),
        (PlannedStatement::CompleteMany, &[]),
        (PlannedStatement::ClaimReady, &["tasks_ready"]),
        (
            PlannedStatement::ExpireLeases,
            &["tasks_lease", "tasks_shard_lease", "tasks_state_id"],
        ),
    ] {
        let mut found = Vec::new();
        task_scans(&plan(&store, which).await, false, &mut found);
        let unkeyed: Vec<_> = found
            .iter()
            .filter(|s| !s.keyed && !driver.contains(&s.index.as_str()))
            .collect();
        assert!(unkeyed.is_empty(), "{which:?}: {found:?}");
    }

    // Statistics taken while the table is all ready (tasks due at once, no worker yet), then all
    // finished: a claim's `LIMIT $2` is estimated at a tenth of the ready rows, and a purge's at
    // a tenth of the finished ones, so a join on the locked rows would hash them against a read
    // of the whole table; each still goes through the locked rows.
    let client = common::raw_client(&guard.url).await;
    for (state, which) in [
        ("ready", PlannedStatement::ClaimReady),
        ("succeeded", PlannedStatement::Purge),
    ] {
        client
            .batch_execute(&format!(
                "UPDATE \"{s}\".tasks SET state = '{state}', finished_at = CASE WHEN \
                 '{state}' = 'succeeded' THEN 1 END; ANALYZE \"{s}\".tasks",
                s = guard.schema
            ))
            .await
            .unwrap();
        let found = update_scans(&store, which).await;
        assert!(
            !found.is_empty() && found.iter().all(|s| s.node == "Tid Scan"),
            "{which:?} with every task {state}: {found:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_analyzes_a_filling_table_by_itself() {
    let Some((store, guard)) = common::fresh_postgres().await else {
        return;
    };
    let now = Timestamp(1_700_000_000_000);
    // The first insert's look may run before its rows are there; a second one, a look's
    // interval later on the callers' clock, finds them.
    store.insert(due_tasks(200, now)).await.unwrap();
    let later = Timestamp(now.0 + 60_000);
    let mut analyzed = false;
    for _ in 0..250 {
        store.insert(due_tasks(1, later)).await.unwrap();
        if reltuples(&guard).await >= 200.0 {
            analyzed = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(analyzed, "the store never analyzed tasks");
}

//! Every filter combination of `list` reads its candidates from its driving index
//! (`TaskFilter::list_driver`, at most `LIST_VISIT_BUDGET` of them): `EXPLAIN QUERY PLAN` of the
//! very statement `list` runs, over a store with 20,000 tasks, never scans `tasks` (or the tag
//! table) without an index, reads the driver's index (`tasks_dead_error` for a dead-letter group,
//! `tasks_key_id` for a probed key prefix), and walks an index without searching it only when the
//! id drives (the primary key from the cursor, bounded by the budget).
#![allow(clippy::unwrap_used)]

use sundial_store::plan_testkit::{
    list_filter_combinations, plan_fixture_cancelled, plan_fixture_dead, plan_fixture_kill,
    plan_fixture_tasks,
};
use sundial_store::{ListDriver, Store};
use sundial_store_sqlite::{SqliteOptions, SqliteStore};

const TASKS: usize = 20_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_filter_combination_is_served_by_an_index() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open_dir(dir.path(), SqliteOptions::default()).unwrap();
    let tasks = plan_fixture_tasks(TASKS, store.shards().count);
    for chunk in tasks.chunks(5_000) {
        store.insert(chunk.to_vec()).await.unwrap();
    }
    store
        .cancel_many(plan_fixture_cancelled(&tasks), sundial_core::Timestamp(1))
        .await
        .unwrap();
    plan_fixture_kill(&store, &plan_fixture_dead(&tasks)).await;
    let mut failures = Vec::new();
    let combos = list_filter_combinations(TASKS);
    for c in &combos {
        let plan = store.explain_list(&c.filter, 50).await.unwrap();
        // Scans of the statement's own subqueries (`c0`, `c`, `v`, `p`, `k`, `f`) are of at
        // most a budget of rows; those of tables are what matters.
        let table_scan = |line: &&String| {
            ["SCAN d", "SCAN t", "SCAN g", "SCAN h"].iter().any(|p| {
                line.starts_with(p) && !line[p.len()..].starts_with(|c: char| c.is_alphanumeric())
            })
        };
        let driver = c.filter.list_driver();
        let bad = plan.iter().filter(table_scan).any(|line| {
            // A bare scan reads every row; a scan of an index walks it, which only the id may.
            !line.contains(" USING ") || driver != ListDriver::Id
        });
        let index = match driver {
            ListDriver::Key => Some("tasks_key_id"),
            ListDriver::DeadGroup => Some("tasks_dead_error"),
            ListDriver::QueueState => Some("tasks_queue_state_id"),
            ListDriver::Queue => Some("tasks_queue_id"),
            ListDriver::Kind => Some("tasks_kind_id"),
            ListDriver::State => Some("tasks_state_id"),
            ListDriver::Tag => Some("SEARCH g USING PRIMARY KEY"),
            ListDriver::Id => None,
        };
        let probe = c.filter.probes_key_prefix().then_some("tasks_key_id");
        let wrong_index = [index, probe]
            .into_iter()
            .flatten()
            .any(|name| !plan.iter().any(|line| line.contains(name)))
            || (c.is_dead_letter_group() && driver != ListDriver::DeadGroup);
        if bad || wrong_index {
            failures.push(format!("{}: {}", c.name, plan.join(" | ")));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} combinations scan instead of searching an index:\n{}",
        failures.len(),
        combos.len(),
        failures.join("\n")
    );
}

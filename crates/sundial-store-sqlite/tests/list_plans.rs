//! Every filter combination of `list` is served by an index: `EXPLAIN QUERY PLAN` of the very
//! statement `list` runs, over a store with 20,000 tasks, never scans `tasks` (or the tag table)
//! without an index, and a combination that sets any filter searches an index by it rather than
//! walking all tasks in id order. A combination that sets nothing walks the primary key from the
//! newest, which stops at the page's end. A dead-letter group (queue, state dead, error group)
//! reads the partial index `tasks_dead_error`.
#![allow(clippy::unwrap_used)]

use sundial_store::Store;
use sundial_store::plan_testkit::{
    list_filter_combinations, plan_fixture_cancelled, plan_fixture_dead, plan_fixture_kill,
    plan_fixture_tasks,
};
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
        let bad = plan.iter().any(|line| {
            let scan = line.starts_with("SCAN ");
            let bare = scan && !line.contains(" USING ");
            // Walking all tasks in id order serves nothing when a filter is set.
            bare || (scan && c.selective)
        });
        let wrong_index =
            c.is_dead_letter_group() && !plan.iter().any(|line| line.contains("tasks_dead_error"));
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

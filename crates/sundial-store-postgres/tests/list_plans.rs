//! Every filter combination of `list` reads its candidates from its driving index on PostgreSQL
//! (`TaskFilter::list_driver`, at most `LIST_VISIT_BUDGET` of them): over 20,000 tasks
//! (analyzed, so the planner knows how selective each value is), the plan of the very statement
//! `list` runs (`EXPLAIN (FORMAT JSON)`) has no sequential scan of `tasks` or of the tag table,
//! and reads the driver's index: `tasks_dead_error` for a dead-letter group (queue, state dead,
//! error group), `tasks_key_id` for a probed key prefix, the primary key only when the id drives.
//! The environment rules are in `common/mod.rs`.
#![allow(clippy::unwrap_used)] // test code: a panic is a failed test

use serde_json::Value;
use sundial_store::plan_testkit::{
    list_filter_combinations, plan_fixture_cancelled, plan_fixture_dead, plan_fixture_kill,
    plan_fixture_tasks,
};
use sundial_store::{ListDriver, Store};

mod common;

const TASKS: usize = 20_000;
const SHARDS: u32 = 4;

/// Every scan node of the plan: (node type, relation, index name).
fn scans(node: &Value, out: &mut Vec<(String, String, String)>) {
    let s = |k: &str| {
        node.get(k)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    if s("Node Type").contains("Scan") {
        out.push((s("Node Type"), s("Relation Name"), s("Index Name")));
    }
    if let Some(Value::Array(children)) = node.get("Plans") {
        for c in children {
            scans(c, out);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_filter_combination_is_served_by_an_index() {
    let Some((store, guard)) = common::fresh_postgres().await else {
        return;
    };
    let tasks = plan_fixture_tasks(TASKS, SHARDS);
    for chunk in tasks.chunks(2_000) {
        store.insert(chunk.to_vec()).await.unwrap();
    }
    store
        .cancel_many(plan_fixture_cancelled(&tasks), sundial_core::Timestamp(1))
        .await
        .unwrap();
    plan_fixture_kill(store.as_ref(), &plan_fixture_dead(&tasks)).await;
    let client = common::raw_client(&guard.url).await;
    client
        .batch_execute(&format!(
            "ANALYZE \"{s}\".tasks; ANALYZE \"{s}\".task_tags",
            s = guard.schema
        ))
        .await
        .unwrap();
    let mut failures = Vec::new();
    let combos = list_filter_combinations(TASKS);
    for c in &combos {
        let text = store.explain_list(&c.filter, 50).await.unwrap();
        let plan: Value = serde_json::from_str(&text).unwrap();
        let mut found = Vec::new();
        scans(&plan[0]["Plan"], &mut found);
        let seq = found
            .iter()
            .any(|(t, rel, _)| t == "Seq Scan" && (rel == "tasks" || rel == "task_tags"));
        let index = match c.filter.list_driver() {
            ListDriver::Key => "tasks_key_id",
            ListDriver::Tag => "task_tags_pkey",
            ListDriver::DeadGroup => "tasks_dead_error",
            ListDriver::QueueState => "tasks_queue_state_id",
            ListDriver::Queue => "tasks_queue_id",
            ListDriver::Kind => "tasks_kind_id",
            ListDriver::State => "tasks_state_id",
            ListDriver::Id => "tasks_pkey",
        };
        let probe = c.filter.probes_key_prefix().then_some("tasks_key_id");
        let reads = |name: &str| found.iter().any(|(_, _, i)| i == name);
        let wrong_index = !reads(index)
            || probe.is_some_and(|p| !reads(p))
            || (c.is_dead_letter_group() && !reads("tasks_dead_error"));
        if seq || wrong_index {
            failures.push(format!("{}: {found:?}", c.name));
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

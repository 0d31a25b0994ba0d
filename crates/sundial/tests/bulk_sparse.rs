//! A bulk action over a filter whose matches lie far apart, more than the store's visit budget
//! (`sundial_store::LIST_VISIT_BUDGET`) between them: the store answers batches that stopped
//! short (some empty) with a cursor, and the bulk action still reaches every match.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use sundial::{Sundial, TaskFilter, TaskSpec, TaskState};
use sundial_core::Timestamp;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_cancel_and_retry_reach_matches_beyond_several_budgets() {
    let dir = tempfile::tempdir().unwrap();
    let s = Sundial::builder().open(dir.path()).await.unwrap();
    let budget = sundial_store::LIST_VISIT_BUDGET;
    let n = 3 * budget + budget / 2;
    let spacing = budget / 2 + 1;
    let due = Timestamp(s.clock().now().0 + Duration::from_secs(3_600).as_millis() as i64);
    let mut hits = Vec::new();
    let mut specs = Vec::new();
    for i in 0..n {
        let kind = if i % spacing == 0 { "hit" } else { "miss" };
        specs.push(TaskSpec::new(kind).queue("sparse").run_at(due));
    }
    for (c, chunk) in specs.chunks(1_000).enumerate() {
        let created = s.schedule_many(chunk.to_vec()).await.unwrap();
        for (j, t) in created.into_iter().enumerate() {
            let sundial::Scheduled::Created(t) = t else {
                panic!("no keys here, nothing is a duplicate")
            };
            if (c * 1_000 + j) % spacing == 0 {
                hits.push(t.id);
            }
        }
    }
    assert!(hits.len() >= 6);
    let filter = TaskFilter {
        queue: Some("sparse".into()),
        kind: Some("hit".into()),
        ..TaskFilter::default()
    };
    let dry = s.cancel_matching(filter.clone(), true).await.unwrap();
    assert_eq!(dry.matched, hits.len() as u64);
    assert_eq!(dry.changed, 0);
    let done = s.cancel_matching(filter.clone(), false).await.unwrap();
    assert_eq!(done.changed, hits.len() as u64, "{done:?}");
    for id in &hits {
        assert_eq!(
            s.get(*id).await.unwrap().unwrap().state,
            TaskState::Cancelled
        );
    }
    let retried = s.retry_matching(filter, None, false).await.unwrap();
    assert_eq!(retried.changed, hits.len() as u64, "{retried:?}");
    for id in &hits {
        assert_eq!(
            s.get(*id).await.unwrap().unwrap().state,
            TaskState::Scheduled
        );
    }
    // Nothing else was touched.
    let missed = s
        .list(
            TaskFilter {
                kind: Some("miss".into()),
                state: Some(TaskState::Scheduled),
                ..TaskFilter::default()
            },
            1_000,
        )
        .await
        .unwrap();
    assert!(!missed.tasks.is_empty());
}

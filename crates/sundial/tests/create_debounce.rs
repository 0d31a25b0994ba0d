//! Debounced creates: a queue keeps at most one pending task per debounce key; a create while
//! one is pending replaces its payload and moves its due time (never past the first create plus
//! `max_wait`), also when 100 creates race. The engine runs the task once, at the latest due
//! time, never at a due time it was moved from. Driven by a stepped engine on a manual clock.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use sundial::{Config, Debounce, Error, TaskFilter, TaskSpec, TaskState};

fn spec(n: u32) -> TaskSpec {
    TaskSpec::new("reindex")
        .queue("search")
        .payload(serde_json::json!({ "n": n }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_debounced_creates_leave_one_pending_task_with_the_last_payload() {
    let h = harness().await;
    let s = h.sundial.clone();
    let debounce = || Debounce::new("doc-42", Duration::from_secs(30));
    let creates = (0..100).map(|n| {
        let s = s.clone();
        tokio::spawn(async move { s.create_debounced(spec(n), debounce()).await })
    });
    let mut answers = Vec::new();
    for c in creates {
        answers.push(c.await.unwrap().unwrap());
    }
    let stored: Vec<_> = answers.iter().filter(|d| !d.replaced).collect();
    assert_eq!(stored.len(), 1, "exactly one create stores a task");
    let id = stored[0].task.id;
    assert!(
        answers.iter().all(|d| d.task.id == id),
        "the others replace it"
    );
    let page = s.list(TaskFilter::default(), 1_000).await.unwrap();
    assert_eq!(page.tasks.len(), 1, "nothing else stored: {page:?}");
    let t = &page.tasks[0];
    assert_eq!(t.due_at, T0.saturating_add(Duration::from_secs(30)));
    // The stored payload is one of the creates' (the one whose replace came last).
    assert!(
        answers.iter().any(|d| d.task.payload == t.payload),
        "{:?}",
        t.payload
    );

    // Another key or another queue has a pending task of its own.
    assert!(
        !s.create_debounced(spec(0), Debounce::new("doc-7", Duration::from_secs(30)))
            .await
            .unwrap()
            .replaced
    );
    assert!(
        !s.create_debounced(spec(0).queue("other"), debounce())
            .await
            .unwrap()
            .replaced
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debounced_task_runs_once_at_its_latest_due_time_capped_by_max_wait() {
    let h = harness_with(Config {
        shard_count: 1,
        ..Config::default()
    })
    .await;
    let mut runs = record(&h, "reindex", |_| Ok(()));
    let mut stepper = h.sundial.stepper();
    let s = &h.sundial;
    let debounce =
        || Debounce::new("doc-1", Duration::from_secs(10)).max_wait(Duration::from_secs(25));

    let first = s.create_debounced(spec(1), debounce()).await.unwrap();
    assert!(!first.replaced);
    assert_eq!(
        first.task.due_at,
        T0.saturating_add(Duration::from_secs(10))
    );
    stepper.settle().await;

    // 8 s later: due 10 s from now (T0 + 18 s).
    h.clock.advance(Duration::from_secs(8));
    let second = s.create_debounced(spec(2), debounce()).await.unwrap();
    assert!(second.replaced);
    assert_eq!(second.task.id, first.task.id);
    assert_eq!(
        second.task.due_at,
        T0.saturating_add(Duration::from_secs(18))
    );
    stepper.settle().await;

    // The first due time passes: nothing starts.
    h.clock.advance(Duration::from_secs(3));
    stepper.settle().await;
    no_run(&mut runs).await;

    // At T0 + 17 s another create: now + 10 s would be T0 + 27 s, past the first create plus
    // max_wait (T0 + 25 s), so it is due then.
    h.clock.advance(Duration::from_secs(6));
    let third = s.create_debounced(spec(3), debounce()).await.unwrap();
    assert!(third.replaced);
    assert_eq!(
        third.task.due_at,
        T0.saturating_add(Duration::from_secs(25))
    );
    assert_eq!(third.task.payload, serde_json::json!({"n": 3}));
    stepper.settle().await;
    h.clock.advance(Duration::from_millis(7_999));
    stepper.settle().await;
    no_run(&mut runs).await;

    h.clock.advance(Duration::from_millis(1));
    stepper.settle().await;
    let run = next_run(&mut runs).await;
    assert_eq!(run.id, first.task.id);
    assert_eq!(run.at, T0.saturating_add(Duration::from_secs(25)));
    assert!(run.at >= run.due, "never early");
    stepper.settle().await;
    no_run(&mut runs).await;
    wait_state(s, first.task.id, TaskState::Succeeded).await;

    // Once it has started, the key has no pending task: the next create stores a new one.
    let next = s.create_debounced(spec(4), debounce()).await.unwrap();
    assert!(!next.replaced);
    assert_ne!(next.task.id, first.task.id);
}

#[tokio::test]
async fn a_bad_debounce_is_refused_and_nothing_is_stored() {
    let h = harness().await;
    let s = &h.sundial;
    let secs = Duration::from_secs;
    for (bad, field) in [
        (Debounce::new("", secs(1)), Some("debounce.key")),
        (Debounce::new(" k", secs(1)), Some("debounce.key")),
        (Debounce::new("a\nb", secs(1)), Some("debounce.key")),
        (
            Debounce::new("k", secs(400 * 24 * 3600)),
            Some("debounce.delay"),
        ),
        (
            Debounce::new("k", secs(10)).max_wait(secs(5)),
            Some("debounce.max_wait"),
        ),
    ] {
        match s.create_debounced(TaskSpec::new("k"), bad.clone()).await {
            Err(Error::Invalid(e)) => assert_eq!(e.field(), field, "{bad:?}: {e}"),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    // A due time of its own contradicts the delay.
    match s
        .create_debounced(
            TaskSpec::new("k").delay(secs(5)),
            Debounce::new("k", secs(1)),
        )
        .await
    {
        Err(Error::Invalid(_)) => {}
        other => panic!("{other:?}"),
    }
    let page = s.list(TaskFilter::default(), 10).await.unwrap();
    assert!(page.tasks.is_empty(), "nothing stored: {page:?}");
}

//! Throttled creates: at most one task per queue and throttle key per period, measured from the
//! admitted task's create; the others store nothing and are answered with the admitted task,
//! also when they race. And an idempotency key's fingerprint sees the priority.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use sundial::{Error, Idempotency, Priority, TaskSpec, Throttle};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_throttled_creates_admit_one_task_per_period() {
    let h = harness().await;
    let s = h.sundial.clone();
    let spec = |n: u32| {
        TaskSpec::new("digest")
            .queue("mail")
            .delay(Duration::from_secs(60))
            .payload(serde_json::json!({ "n": n }))
    };
    let throttle = || Throttle::new("user-42", Duration::from_secs(600));
    let creates = (0..100).map(|n| {
        let s = s.clone();
        tokio::spawn(async move { s.create_throttled(spec(n), throttle()).await })
    });
    let mut answers = Vec::new();
    for c in creates {
        answers.push(c.await.unwrap().unwrap());
    }
    let admitted: Vec<_> = answers.iter().filter(|c| !c.repeat).collect();
    assert_eq!(admitted.len(), 1, "exactly one create is admitted");
    let id = admitted[0].task.id;
    assert!(
        answers.iter().all(|c| c.task.id == id),
        "every other create is answered with the admitted task"
    );
    let stored = s.list(sundial::TaskFilter::default(), 1_000).await.unwrap();
    assert_eq!(stored.tasks.len(), 1, "nothing else stored: {stored:?}");

    // Another key, or another queue: a throttle of its own.
    assert!(
        !s.create_throttled(spec(0), Throttle::new("user-7", Duration::from_secs(600)))
            .await
            .unwrap()
            .repeat
    );
    assert!(
        !s.create_throttled(spec(0).queue("sms"), throttle())
            .await
            .unwrap()
            .repeat
    );

    // The period runs from the admitted create, whatever became of the task since.
    s.cancel(id).await.unwrap();
    h.clock.advance(Duration::from_millis(599_999));
    let inside = s.create_throttled(spec(1), throttle()).await.unwrap();
    assert!(inside.repeat);
    assert_eq!(inside.task.id, id);
    h.clock.advance(Duration::from_millis(1));
    let next = s.create_throttled(spec(2), throttle()).await.unwrap();
    assert!(!next.repeat, "a new period admits a new task");
    assert_ne!(next.task.id, id);
    assert_eq!(next.task.payload, serde_json::json!({"n": 2}));
}

#[tokio::test]
async fn a_bad_throttle_is_refused_and_nothing_is_stored() {
    let h = harness().await;
    let s = &h.sundial;
    for (bad, field) in [
        (Throttle::new("", Duration::from_secs(1)), "throttle.key"),
        (Throttle::new("k", Duration::ZERO), "throttle.per"),
        (
            Throttle::new("k", Duration::from_secs(400 * 24 * 3600)),
            "throttle.per",
        ),
        (
            Throttle::new("a\nb", Duration::from_secs(1)),
            "throttle.key",
        ),
        (
            Throttle::new("x".repeat(257), Duration::from_secs(1)),
            "throttle.key",
        ),
    ] {
        match s.create_throttled(TaskSpec::new("k"), bad.clone()).await {
            Err(Error::Invalid(e)) => assert_eq!(e.field(), Some(field), "{bad:?}: {e}"),
            other => panic!("{bad:?}: expected invalid, got {other:?}"),
        }
    }
    assert!(
        s.list(sundial::TaskFilter::default(), 1_000)
            .await
            .unwrap()
            .tasks
            .is_empty()
    );
}

#[tokio::test]
async fn a_retry_with_another_priority_is_not_a_repeat() {
    let h = harness().await;
    let s = &h.sundial;
    let spec = || TaskSpec::new("k").delay(Duration::from_secs(60));
    let first = s
        .create_idempotent(spec(), Idempotency::new("K"))
        .await
        .unwrap();
    assert!(!first.repeat);
    assert!(
        s.create_idempotent(spec(), Idempotency::new("K"))
            .await
            .unwrap()
            .repeat
    );
    let urgent = spec().priority(Priority::new(9).unwrap());
    assert!(matches!(
        s.create_idempotent(urgent, Idempotency::new("K")).await,
        Err(Error::IdempotencyConflict { .. })
    ));
}

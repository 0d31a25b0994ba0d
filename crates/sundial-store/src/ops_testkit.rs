//! Conformance checks of the operator's store calls (feature `testkit`): tags and search, queue
//! settings and pause, attempt history, retry and bulk actions, retention. Same shape as
//! [`crate::testkit`]: each check takes a fresh, empty store; a backend runs them all with
//! [`ops_conformance!`](crate::ops_conformance).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use sundial_core::{ExecutionId, TaskId, TaskSpec, TaskState, Timestamp};

use crate::Retry;
use crate::testkit::{
    at, counts, due_task, get, ids, insert, make, make_ready, ready_claim, start,
};
use crate::{
    AttemptOutcome, QueueConfig, RetentionOverride, RetentionRules, Store, TaskFilter,
    TransitionError,
};

/// Expands to one test per check of this module, like
/// [`store_conformance!`](crate::store_conformance).
#[macro_export]
macro_rules! ops_conformance {
    (@checks ($factory:expr) $($check:ident)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let fixture = ($factory)().await;
                let Some(store) = $crate::testkit::Fixture::store(&fixture) else {
                    return;
                };
                $crate::ops_testkit::$check(store.clone()).await;
                drop(fixture);
            }
        )*
    };
    ($factory:expr $(,)?) => {
        $crate::ops_conformance!(@checks ($factory)
            tags_round_trip_and_filter_lists
            list_filters_by_key_prefix_and_time_ranges
            error_group_filter_selects_exactly_a_dead_letter_group
            queue_settings_round_trip_and_pause_is_idempotent
            earliest_waiting_covers_scheduled_and_ready
            attempts_record_each_start_and_how_it_ended
            attempts_are_bounded_and_counted
            attempt_responses_are_kept_on_their_attempt
            retry_revives_dead_and_cancelled_only
            bulk_select_pages_and_changes_only_eligible_tasks
            purge_deletes_only_expired_finished_tasks
        );
    };
}

fn tags(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn tag_filter(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

async fn listed(s: &dyn Store, filter: TaskFilter) -> Vec<TaskId> {
    ids(&s.list(&filter, 100).await.expect("list").tasks)
}

/// Tags given at insert come back from `get`, `list` and every state change; `list` with tags
/// returns exactly the tasks carrying all of them, newest first, paged by the cursor.
pub async fn tags_round_trip_and_filter_lists(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let a = insert(
        s,
        make(
            TaskSpec::new("k").tags(tags(&[("env", "prod"), ("team", "a")])),
            at(0),
        ),
    )
    .await;
    let b = insert(
        s,
        make(
            TaskSpec::new("k")
                .queue("q2")
                .tags(tags(&[("env", "prod"), ("team", "b")])),
            at(0),
        ),
    )
    .await;
    let c = insert(
        s,
        make(TaskSpec::new("k").tags(tags(&[("env", "dev")])), at(0)),
    )
    .await;
    let plain = insert(s, make(TaskSpec::new("k"), at(0))).await;
    assert_eq!(a.tags, tags(&[("env", "prod"), ("team", "a")]));
    assert_eq!(get(s, a.id).await.tags, a.tags);
    assert!(get(s, plain.id).await.tags.is_empty());
    let (_, running) = start(s, a.id, at(1)).await;
    assert_eq!(running.tags, a.tags, "tags survive state changes");

    let f = |pairs: &[(&str, &str)]| TaskFilter {
        tags: tag_filter(pairs),
        ..TaskFilter::default()
    };
    assert_eq!(listed(s, f(&[("env", "prod")])).await, vec![b.id, a.id]);
    assert_eq!(listed(s, f(&[("env", "dev")])).await, vec![c.id]);
    assert_eq!(
        listed(s, f(&[("env", "prod"), ("team", "b")])).await,
        vec![b.id]
    );
    assert!(
        listed(s, f(&[("env", "prod"), ("team", "c")]))
            .await
            .is_empty()
    );
    assert!(listed(s, f(&[("nope", "prod")])).await.is_empty());
    assert_eq!(
        listed(
            s,
            TaskFilter {
                queue: Some("default".into()),
                ..f(&[("env", "prod")])
            }
        )
        .await,
        vec![a.id]
    );
    assert_eq!(
        listed(
            s,
            TaskFilter {
                state: Some(TaskState::Running),
                ..f(&[("env", "prod")])
            }
        )
        .await,
        vec![a.id]
    );
    let page = s.list(&f(&[("env", "prod")]), 1).await.expect("list");
    assert_eq!(ids(&page.tasks), vec![b.id]);
    assert_eq!(page.next_cursor, Some(b.id));
    let next = TaskFilter {
        before: page.next_cursor,
        ..f(&[("env", "prod")])
    };
    let page = s.list(&next, 1).await.expect("list");
    assert_eq!(ids(&page.tasks), vec![a.id]);
    assert_eq!(page.next_cursor, None);
}

/// `list` narrows by key prefix (byte order) and by half-open due and created ranges, alone and
/// together with the other filters.
pub async fn list_filters_by_key_prefix_and_time_ranges(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let mut all = Vec::new();
    for (i, key) in ["order-1", "order-2", "orders", "invoice-1", "order-"]
        .iter()
        .enumerate()
    {
        let i = i as i64;
        let t = make(
            TaskSpec::new("k").key(*key).run_at(at(1_000 * i)),
            at(10 * i),
        );
        all.push(insert(s, t).await);
    }
    all.push(insert(s, make(TaskSpec::new("k").run_at(at(50)), at(7))).await);
    let filters = vec![
        TaskFilter {
            key_prefix: Some("order-".into()),
            ..Default::default()
        },
        TaskFilter {
            key_prefix: Some("order".into()),
            ..Default::default()
        },
        TaskFilter {
            key_prefix: Some("x".into()),
            ..Default::default()
        },
        TaskFilter {
            due_after: Some(at(1_000)),
            ..Default::default()
        },
        TaskFilter {
            due_before: Some(at(1_000)),
            ..Default::default()
        },
        TaskFilter {
            due_after: Some(at(1_000)),
            due_before: Some(at(3_000)),
            ..Default::default()
        },
        TaskFilter {
            created_after: Some(at(10)),
            created_before: Some(at(30)),
            ..Default::default()
        },
        TaskFilter {
            created_before: Some(at(10)),
            ..Default::default()
        },
        TaskFilter {
            key_prefix: Some("order-".into()),
            due_after: Some(at(1_000)),
            created_before: Some(at(40)),
            queue: Some("default".into()),
            state: Some(TaskState::Scheduled),
            kind: Some("k".into()),
            ..Default::default()
        },
    ];
    for filter in filters {
        let mut expected: Vec<TaskId> = all
            .iter()
            .filter(|t| filter.matches(t))
            .map(|t| t.id)
            .collect();
        expected.sort_by_key(|id| std::cmp::Reverse(*id));
        assert_eq!(listed(s, filter.clone()).await, expected, "{filter:?}");
        let selected: Vec<TaskId> = s
            .select(&filter, 100)
            .await
            .expect("select")
            .selected
            .iter()
            .map(|x| x.id)
            .collect();
        assert_eq!(selected, expected, "select {filter:?}");
    }
}

/// The `error_group` filter matches a task exactly when [`crate::error_group`] of its last error
/// is the value (first line, at most 200 characters, counted in characters; never a prefix;
/// never a task without an error), in any state; with state dead and a queue, `list` and
/// `select` find exactly the tasks `dead_groups` counts in that row, and a retried task leaves it.
pub async fn error_group_filter_selects_exactly_a_dead_letter_group(store: Arc<dyn Store>) {
    let s = store.as_ref();
    async fn failed(s: &dyn Store, queue: &str, error: &str, retry: Retry) -> TaskId {
        let t = insert(s, due_task(queue, "k", 0)).await;
        let (exec, _) = start(s, t.id, at(0)).await;
        s.fail(t.id, exec, at(10), error.to_string(), retry)
            .await
            .expect("fail");
        t.id
    }
    let long_x = format!("{}tail", "x".repeat(200));
    let accents = "é".repeat(250);
    let mut ids_all = Vec::new();
    for (queue, error) in [
        ("a", "boom\ntrace 1"),
        ("a", "boom\ntrace 2"),
        ("a", "boom"),
        ("a", "boom again"),
        ("a", " boom"),
        ("a", "other"),
        ("b", "boom\ntrace 3"),
        ("b", long_x.as_str()),
        ("b", accents.as_str()),
    ] {
        ids_all.push(failed(s, queue, error, Retry::Never).await);
    }
    // Not dead: a failure with a retry left (it keeps its error), a task that never failed.
    ids_all.push(failed(s, "a", "boom\nlater", Retry::At(at(1_000))).await);
    ids_all.push(insert(s, due_task("a", "k", 0)).await.id);
    let mut all = Vec::new();
    for id in &ids_all {
        all.push(get(s, *id).await);
    }
    let group = |queue: Option<&str>, state: Option<TaskState>, g: &str| TaskFilter {
        queue: queue.map(str::to_string),
        state,
        error_group: Some(g.to_string()),
        ..Default::default()
    };
    let dead = Some(TaskState::Dead);
    let cases = [
        (group(Some("a"), dead, "boom"), 3),
        (group(None, dead, "boom"), 4),
        (group(None, None, "boom"), 5),
        (group(Some("a"), Some(TaskState::Scheduled), "boom"), 1),
        (group(Some("a"), dead, " boom"), 1),
        (group(Some("a"), dead, "boo"), 0),
        (group(Some("a"), dead, "boom\ntrace 1"), 0),
        (group(Some("b"), dead, &"x".repeat(200)), 1),
        (group(Some("b"), dead, &long_x), 0),
        (group(Some("b"), dead, &"é".repeat(200)), 1),
        (group(Some("b"), dead, &"é".repeat(199)), 0),
        (
            TaskFilter {
                kind: Some("other-kind".into()),
                ..group(Some("a"), dead, "boom")
            },
            0,
        ),
    ];
    for (filter, n) in cases {
        let mut expected: Vec<TaskId> = all
            .iter()
            .filter(|t| filter.matches(t))
            .map(|t| t.id)
            .collect();
        assert_eq!(expected.len(), n, "the reference, {filter:?}");
        expected.sort_by_key(|id| std::cmp::Reverse(*id));
        assert_eq!(listed(s, filter.clone()).await, expected, "list {filter:?}");
        let selected: Vec<TaskId> = s
            .select(&filter, 100)
            .await
            .expect("select")
            .selected
            .iter()
            .map(|x| x.id)
            .collect();
        assert_eq!(selected, expected, "select {filter:?}");
    }
    // Every row of the dead letters is exactly what its filter selects, page by page.
    let groups = s
        .dead_groups(crate::DeadGroupFilter::default(), 100)
        .await
        .expect("dead_groups");
    assert_eq!(groups.len(), 7);
    for g in &groups {
        let error = g
            .error
            .clone()
            .expect("every task here failed with an error");
        let filter = group(Some(&g.queue), dead, &error);
        let mut seen = Vec::new();
        let mut cursor = None;
        loop {
            let page = s
                .select(
                    &TaskFilter {
                        before: cursor,
                        ..filter.clone()
                    },
                    2,
                )
                .await
                .expect("select");
            assert!(page.selected.iter().all(|x| x.state == TaskState::Dead));
            seen.extend(page.selected.iter().map(|x| x.id));
            let Some(next) = page.next_cursor else { break };
            cursor = Some(next);
        }
        assert_eq!(seen.len() as u64, g.count, "{g:?}");
        assert_eq!(seen.first(), Some(&g.newest), "{g:?}");
    }
    // Retrying the group's tasks empties the group, and nothing else changes.
    let filter = group(Some("a"), dead, "boom");
    let chosen: Vec<TaskId> = s
        .select(&filter, 100)
        .await
        .expect("select")
        .selected
        .iter()
        .map(|x| x.id)
        .collect();
    let retried = s
        .retry_many(chosen.clone(), at(2_000), at(20))
        .await
        .expect("retry_many");
    assert_eq!(retried.len(), 3);
    assert!(listed(s, filter).await.is_empty());
    let after = s
        .dead_groups(crate::DeadGroupFilter::default(), 100)
        .await
        .expect("dead_groups");
    assert_eq!(after.len(), 6);
    assert!(
        after
            .iter()
            .all(|g| !(g.queue == "a" && g.error.as_deref() == Some("boom")))
    );
    assert_eq!(listed(s, group(Some("b"), dead, "boom")).await.len(), 1);
}

/// A queue has no settings until configured or paused; `put_queue_config` keeps the pause state,
/// `set_queue_paused` keeps the configuration; pausing twice keeps the first change time.
pub async fn queue_settings_round_trip_and_pause_is_idempotent(store: Arc<dyn Store>) {
    let s = store.as_ref();
    assert_eq!(s.queue_settings("q").await.expect("get"), None);
    assert!(s.list_queue_settings().await.expect("list").is_empty());
    let config = QueueConfig {
        retention: RetentionOverride {
            succeeded_ms: Some(60_000),
            ..Default::default()
        },
        // The default target round-trips whole (method, headers, timeout, retry statuses).
        target: Some(
            sundial_core::Target::new("https://hooks.example.com/q")
                .method(sundial_core::PushMethod::Put)
                .header("x-team", "a")
                .timeout(std::time::Duration::from_secs(5))
                .retry_statuses(vec![404]),
        ),
        concurrency: Some(7),
    };
    let q = s
        .put_queue_config("q", config.clone(), at(1))
        .await
        .expect("put");
    assert_eq!(q.queue, "q");
    assert!(!q.paused);
    assert_eq!(q.config, config);
    assert_eq!(q.updated_at, at(1));
    assert_eq!(
        s.queue_settings("q").await.expect("get").map(|q| q.config),
        Some(config.clone()),
        "read back as stored"
    );

    let p = s.set_queue_paused("q", true, at(2)).await.expect("pause");
    assert!(p.paused);
    assert_eq!(p.paused_changed_at, Some(at(2)));
    assert_eq!(p.config, config, "pausing keeps the configuration");
    let again = s.set_queue_paused("q", true, at(3)).await.expect("pause");
    assert_eq!(again.paused_changed_at, Some(at(2)), "already paused");

    let q = s
        .put_queue_config("q", QueueConfig::default(), at(4))
        .await
        .expect("put");
    assert!(q.paused, "configuring keeps the pause");
    assert_eq!(q.config, QueueConfig::default());

    let other = s.set_queue_paused("a", true, at(5)).await.expect("pause");
    assert!(other.paused);
    assert_eq!(other.config, QueueConfig::default());
    let r = s.set_queue_paused("q", false, at(6)).await.expect("resume");
    assert!(!r.paused);
    assert_eq!(r.paused_changed_at, Some(at(6)));
    let all = s.list_queue_settings().await.expect("list");
    assert_eq!(
        all.iter().map(|q| q.queue.as_str()).collect::<Vec<_>>(),
        vec!["a", "q"]
    );
    assert_eq!(s.queue_settings("q").await.expect("get"), Some(r));
}

/// `earliest_waiting` is the earliest due time among the queue's scheduled and ready tasks;
/// running and finished tasks and other queues do not count.
pub async fn earliest_waiting_covers_scheduled_and_ready(store: Arc<dyn Store>) {
    let s = store.as_ref();
    assert_eq!(s.earliest_waiting("q").await.expect("earliest"), None);
    let early = insert(s, make(TaskSpec::new("k").queue("q").run_at(at(10)), at(0))).await;
    let late = insert(
        s,
        make(TaskSpec::new("k").queue("q").run_at(at(500)), at(0)),
    )
    .await;
    insert(
        s,
        make(TaskSpec::new("k").queue("other").run_at(at(1)), at(0)),
    )
    .await;
    assert_eq!(
        s.earliest_waiting("q").await.expect("earliest"),
        Some(at(10))
    );
    make_ready(s, early.id, at(20)).await;
    assert_eq!(
        s.earliest_waiting("q").await.expect("earliest"),
        Some(at(10)),
        "a ready task still waits"
    );
    let taken = s
        .claim_ready(ready_claim("q", 1, "w", at(30)))
        .await
        .expect("claim_ready")
        .tasks;
    assert_eq!(ids(&taken), vec![early.id]);
    assert_eq!(
        s.earliest_waiting("q").await.expect("earliest"),
        Some(at(500))
    );
    s.cancel(late.id, at(40)).await.expect("cancel");
    assert_eq!(s.earliest_waiting("q").await.expect("earliest"), None);
}

/// Every start adds an attempt (execution id, worker, start time) and its end fills in how it
/// ended: failed (with the error), lease expired, succeeded, cancelled. Oldest first.
pub async fn attempts_record_each_start_and_how_it_ended(store: Arc<dyn Store>) {
    let s = store.as_ref();
    assert_eq!(s.attempts(TaskId::MIN).await.expect("attempts"), None);
    let t = insert(s, make(TaskSpec::new("k").max_attempts(5), at(0))).await;
    assert_eq!(
        s.attempts(t.id).await.expect("attempts").map(|h| h.total),
        Some(0)
    );
    let (e1, _) = start(s, t.id, at(0)).await;
    s.fail(t.id, e1, at(100), "boom".into(), Retry::At(at(200)))
        .await
        .expect("fail");
    // Second attempt by a worker; its lease runs out.
    make_ready(s, t.id, at(200)).await;
    let taken = s
        .claim_ready(ready_claim("default", 1, "w-7", at(250)))
        .await
        .expect("claim_ready")
        .tasks;
    assert_eq!(ids(&taken), vec![t.id]);
    let e2 = taken[0].execution_id.expect("execution id");
    let lease_end = taken[0].lease_expires_at.expect("lease");
    let expired = s
        .expire_leases(Timestamp(lease_end.0 + 1), 10, None)
        .await
        .expect("expire");
    assert_eq!(ids(&expired), vec![t.id]);
    let (e3, _) = start(s, t.id, Timestamp(lease_end.0 + 2)).await;
    s.complete(t.id, e3, Timestamp(lease_end.0 + 50), None)
        .await
        .expect("complete");

    let h = s.attempts(t.id).await.expect("attempts").expect("known");
    assert_eq!(h.total, 3);
    let seqs: Vec<u64> = h.attempts.iter().map(|a| a.seq).collect();
    assert_eq!(seqs, vec![1, 2, 3]);
    let a = &h.attempts;
    assert_eq!(a[0].execution_id, Some(e1));
    assert_eq!(a[0].worker, None);
    assert_eq!(a[0].started_at, at(0));
    assert_eq!(a[0].ended_at, Some(at(100)));
    assert_eq!(a[0].duration_ms(), Some(100));
    assert_eq!(a[0].outcome, Some(AttemptOutcome::Failed));
    assert_eq!(a[0].error.as_deref(), Some("boom"));
    assert_eq!(a[1].execution_id, Some(e2));
    assert_eq!(a[1].worker.as_deref(), Some("w-7"));
    assert_eq!(a[1].started_at, at(250));
    assert_eq!(a[1].outcome, Some(AttemptOutcome::LeaseExpired));
    assert_eq!(a[2].outcome, Some(AttemptOutcome::Succeeded));
    assert_eq!(a[2].error, None);
    assert_eq!(a[2].duration_ms(), Some(48));
    assert_eq!(
        get(s, t.id).await.last_error.as_deref(),
        Some(crate::LEASE_EXPIRED_ERROR),
        "last_error stays on the task"
    );

    // Cancelled while running; and a running attempt has no end yet.
    let u = insert(s, make(TaskSpec::new("k"), at(0))).await;
    start(s, u.id, at(1)).await;
    let h = s.attempts(u.id).await.expect("attempts").expect("known");
    assert_eq!(h.attempts[0].outcome, None);
    assert_eq!(h.attempts[0].ended_at, None);
    s.cancel(u.id, at(9)).await.expect("cancel");
    let h = s.attempts(u.id).await.expect("attempts").expect("known");
    assert_eq!(h.attempts[0].outcome, Some(AttemptOutcome::Cancelled));
    assert_eq!(h.attempts[0].ended_at, Some(at(9)));
}

/// A push attempt's HTTP answer (status code, content type) is kept on the attempt that ran
/// under the given execution id, whether it still runs or has ended, and on no other; an unknown
/// execution id changes nothing.
pub async fn attempt_responses_are_kept_on_their_attempt(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let t = insert(s, make(TaskSpec::new("k").max_attempts(5), at(0))).await;
    let (e1, _) = start(s, t.id, at(0)).await;
    let answer = |code: u16, ct: Option<&str>| crate::AttemptResponse {
        status_code: code,
        content_type: ct.map(str::to_string),
    };
    // Recorded while running (the push executor records before the attempt's end is written).
    assert!(
        s.record_attempt_response(t.id, e1, answer(503, Some("text/plain")))
            .await
            .expect("record")
    );
    s.fail(t.id, e1, at(10), "HTTP 503".into(), Retry::At(at(20)))
        .await
        .expect("fail");
    let (e2, _) = start(s, t.id, at(20)).await;
    s.complete(t.id, e2, at(30), Some("{}".into()))
        .await
        .expect("complete");
    // Recorded after the end, too.
    assert!(
        s.record_attempt_response(t.id, e2, answer(200, None))
            .await
            .expect("record")
    );
    assert!(
        !s.record_attempt_response(t.id, ExecutionId(uuid::Uuid::new_v4()), answer(204, None))
            .await
            .expect("record"),
        "an unknown execution id is no attempt"
    );
    let h = s.attempts(t.id).await.expect("attempts").expect("known");
    assert_eq!(h.attempts.len(), 2);
    assert_eq!(h.attempts[0].status_code, Some(503));
    assert_eq!(h.attempts[0].content_type.as_deref(), Some("text/plain"));
    assert_eq!(h.attempts[0].outcome, Some(AttemptOutcome::Failed));
    assert_eq!(h.attempts[1].status_code, Some(200));
    assert_eq!(h.attempts[1].content_type, None);
    assert_eq!(h.attempts[1].outcome, Some(AttemptOutcome::Succeeded));
    // A task without pushes has none.
    let u = insert(s, make(TaskSpec::new("k"), at(0))).await;
    let (e, _) = start(s, u.id, at(1)).await;
    s.complete(u.id, e, at(2), None).await.expect("complete");
    let h = s.attempts(u.id).await.expect("attempts").expect("known");
    assert_eq!(h.attempts[0].status_code, None);
    assert_eq!(h.attempts[0].content_type, None);
}

/// A task keeps only its latest attempts (100 by default) while `total` counts them all.
pub async fn attempts_are_bounded_and_counted(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let t = insert(s, make(TaskSpec::new("k").max_attempts(1_000), at(0))).await;
    let n = 105;
    for i in 0..n {
        let now = at(10 * i);
        let (e, _) = start(s, t.id, now).await;
        s.fail(t.id, e, now, format!("failure {i}"), Retry::At(now))
            .await
            .expect("fail");
    }
    let h = s.attempts(t.id).await.expect("attempts").expect("known");
    assert_eq!(h.total, n as u64);
    assert_eq!(h.attempts.len(), 100);
    assert_eq!(h.attempts[0].seq, 6);
    assert_eq!(h.attempts[99].seq, 105);
    assert_eq!(h.attempts[99].error.as_deref(), Some("failure 104"));
}

/// `retry` makes a dead or cancelled task scheduled again at the given time with its attempts
/// starting over, keeping its id, `last_error` and attempt history. Live tasks are `WrongState`,
/// unknown ones `NotFound`, and a task whose key another live task holds now `KeyTaken`.
pub async fn retry_revives_dead_and_cancelled_only(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let t = insert(s, make(TaskSpec::new("k").max_attempts(1).key("x"), at(0))).await;
    let (e, _) = start(s, t.id, at(0)).await;
    let dead = s
        .fail(t.id, e, at(5), "bad".into(), Retry::Never)
        .await
        .expect("fail");
    assert_eq!(dead.state, TaskState::Dead);
    let r = s.retry(t.id, at(1_000), at(10)).await.expect("retry");
    assert_eq!(r.id, t.id);
    assert_eq!(r.state, TaskState::Scheduled);
    assert_eq!(r.due_at, at(1_000));
    assert_eq!(r.attempt, 0);
    assert_eq!(r.execution_id, None);
    assert_eq!(r.finished_at, None);
    assert_eq!(r.updated_at, at(10));
    assert_eq!(r.last_error.as_deref(), Some("bad"));
    assert_eq!(get(s, t.id).await, r);
    assert_eq!(
        s.scan_due(t.shard, None, at(1_000), 10)
            .await
            .expect("scan")
            .len(),
        1,
        "the retried task is a timer again"
    );
    match s.retry(t.id, at(0), at(11)).await {
        Err(TransitionError::WrongState { state }) => assert_eq!(state, TaskState::Scheduled),
        other => panic!("retry of a live task: {other:?}"),
    }
    assert!(matches!(
        s.retry(TaskId::MIN, at(0), at(11)).await,
        Err(TransitionError::NotFound)
    ));
    // The retried task runs again as attempt 1, and the history keeps both attempts.
    let (e, again) = start(s, t.id, at(1_000)).await;
    assert_eq!(again.attempt, 1);
    s.complete(t.id, e, at(1_001), None)
        .await
        .expect("complete");
    let h = s.attempts(t.id).await.expect("attempts").expect("known");
    assert_eq!(h.total, 2);

    // Cancelled → retried; and a key taken by a newer live task refuses.
    let c = insert(s, make(TaskSpec::new("k").key("y"), at(0))).await;
    s.cancel(c.id, at(1)).await.expect("cancel");
    let holder = insert(s, make(TaskSpec::new("k").key("y"), at(2))).await;
    match s.retry(c.id, at(3), at(3)).await {
        Err(TransitionError::KeyTaken { existing }) => assert_eq!(existing, holder.id),
        other => panic!("retry with the key taken: {other:?}"),
    }
    assert_eq!(get(s, c.id).await.state, TaskState::Cancelled);
    s.cancel(holder.id, at(4)).await.expect("cancel");
    let r = s.retry(c.id, at(5), at(5)).await.expect("retry");
    assert_eq!(r.state, TaskState::Scheduled);
}

/// `select` pages through the filter's matches newest first with their states; `cancel_many`
/// cancels only the live ones, `retry_many` revives only dead or cancelled ones with a free key.
pub async fn bulk_select_pages_and_changes_only_eligible_tasks(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let mut all = Vec::new();
    for i in 0..7 {
        let spec = TaskSpec::new("k")
            .queue("bulk")
            .tags(tags(&[("batch", "b1")]));
        all.push(insert(s, make(spec, at(i))).await);
    }
    let outside = insert(s, make(TaskSpec::new("k").queue("bulk"), at(0))).await;
    let (e, _) = start(s, all[0].id, at(10)).await;
    s.complete(all[0].id, e, at(11), None)
        .await
        .expect("complete");
    start(s, all[1].id, at(10)).await;

    let filter = TaskFilter {
        tags: tag_filter(&[("batch", "b1")]),
        ..Default::default()
    };
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let page = s
            .select(
                &TaskFilter {
                    before: cursor,
                    ..filter.clone()
                },
                3,
            )
            .await
            .expect("select");
        assert!(page.selected.len() <= 3);
        seen.extend(page.selected);
        let Some(next) = page.next_cursor else { break };
        cursor = Some(next);
    }
    let mut expected: Vec<TaskId> = all.iter().map(|t| t.id).collect();
    expected.reverse();
    assert_eq!(seen.iter().map(|x| x.id).collect::<Vec<_>>(), expected);
    assert_eq!(
        seen.iter().find(|x| x.id == all[0].id).map(|x| x.state),
        Some(TaskState::Succeeded)
    );

    let cancelled = s
        .cancel_many(seen.iter().map(|x| x.id).collect(), at(20))
        .await
        .expect("cancel_many");
    let got: HashSet<TaskId> = cancelled.iter().map(|t| t.id).collect();
    let want: HashSet<TaskId> = all[1..].iter().map(|t| t.id).collect();
    assert_eq!(got, want, "only the live ones");
    assert!(cancelled.iter().all(|t| t.state == TaskState::Cancelled));
    assert_eq!(get(s, all[0].id).await.state, TaskState::Succeeded);
    assert_eq!(get(s, outside.id).await.state, TaskState::Scheduled);

    let retried = s
        .retry_many(seen.iter().map(|x| x.id).collect(), at(30), at(25))
        .await
        .expect("retry_many");
    let got: HashSet<TaskId> = retried.iter().map(|t| t.id).collect();
    assert_eq!(got, want, "succeeded is not retried");
    for t in &retried {
        assert_eq!(t.state, TaskState::Scheduled);
        assert_eq!(t.due_at, at(30));
        assert_eq!(t.attempt, 0);
    }
    assert!(
        s.retry_many(vec![all[2].id], at(30), at(26))
            .await
            .expect("retry_many")
            .is_empty(),
        "a live task is not retried"
    );
}

/// `purge_tasks` deletes finished tasks past their state's retention (or their queue's override),
/// at most `limit` per call, with their tags and attempts; the counters
/// follow. Live tasks are never deleted, however old.
pub async fn purge_deletes_only_expired_finished_tasks(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let mut queues = BTreeMap::new();
    queues.insert(
        "short".to_string(),
        RetentionOverride {
            succeeded_ms: Some(10),
            ..Default::default()
        },
    );
    let rules = RetentionRules {
        succeeded_ms: 1_000,
        cancelled_ms: 1_000,
        dead_ms: 5_000,
        queues,
    };
    let spec = |q: &str| TaskSpec::new("k").queue(q).tags(tags(&[("t", "v")]));
    // Live, very old: scheduled, ready, running.
    let scheduled = insert(s, make(spec("q"), at(0))).await;
    let ready = insert(s, make(spec("q"), at(0))).await;
    make_ready(s, ready.id, at(0)).await;
    let running = insert(s, make(spec("q"), at(0))).await;
    let (_, _) = start(s, running.id, at(0)).await;
    // Finished at 100.
    let succeeded = insert(s, make(spec("q"), at(0))).await;
    let (e, _) = start(s, succeeded.id, at(0)).await;
    s.complete(succeeded.id, e, at(100), None)
        .await
        .expect("complete");
    let dead = insert(s, make(spec("q").max_attempts(1), at(0))).await;
    let (e, _) = start(s, dead.id, at(0)).await;
    s.fail(dead.id, e, at(100), "x".into(), Retry::Never)
        .await
        .expect("fail");
    let cancelled = insert(s, make(spec("q"), at(0))).await;
    s.cancel(cancelled.id, at(100)).await.expect("cancel");
    let short = insert(s, make(spec("short"), at(0))).await;
    let (e, _) = start(s, short.id, at(0)).await;
    s.complete(short.id, e, at(100), None)
        .await
        .expect("complete");

    // At 109 nothing is due for deletion; at 110 the short queue's task is.
    assert_eq!(
        s.purge_tasks(&rules, at(109), 100, None)
            .await
            .expect("purge"),
        0
    );
    assert_eq!(
        s.purge_tasks(&rules, at(110), 100, None)
            .await
            .expect("purge"),
        1
    );
    assert!(s.get(short.id).await.expect("get").is_none());
    assert_eq!(s.attempts(short.id).await.expect("attempts"), None);
    // Succeeded and cancelled at 1,100; dead at 5,100; limit and shard respected.
    let mut gone = s
        .purge_tasks(&rules, at(1_100), 1, None)
        .await
        .expect("purge");
    gone += s
        .purge_tasks(&rules, at(1_100), 100, None)
        .await
        .expect("purge");
    assert_eq!(gone, 2, "succeeded and cancelled");
    assert!(s.get(succeeded.id).await.expect("get").is_none());
    assert!(s.get(cancelled.id).await.expect("get").is_none());
    assert_eq!(get(s, dead.id).await.state, TaskState::Dead);
    assert_eq!(
        s.purge_tasks(&rules, at(5_100), 100, None)
            .await
            .expect("purge"),
        1
    );
    assert!(s.get(dead.id).await.expect("get").is_none());
    // Far in the future: the live tasks are all still there.
    assert_eq!(
        s.purge_tasks(&rules, Timestamp::MAX, 100, None)
            .await
            .expect("purge"),
        0
    );
    for t in [&scheduled, &ready, &running] {
        assert!(!get(s, t.id).await.state.is_terminal());
    }
    let tagged = s
        .list(
            &TaskFilter {
                tags: tag_filter(&[("t", "v")]),
                ..Default::default()
            },
            100,
        )
        .await
        .expect("list");
    assert_eq!(tagged.tasks.len(), 3);
    let c = counts(s).await;
    let total: u64 = c.values().sum();
    assert_eq!(total, 3, "counters follow deletions: {c:?}");
}

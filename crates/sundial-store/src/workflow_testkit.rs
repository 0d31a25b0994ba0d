//! The workflow store conformance suite (feature `testkit`): what every [`WorkflowStore`] must do.
//! Separate from [`crate::store_conformance!`] so that a backend adds workflows when it is ready.
//!
//! ```ignore
//! async fn fresh() -> (Arc<MyStore>, TempDir) { … }
//! sundial_store::workflow_store_conformance!(fresh);
//! ```
//!
//! The factory returns a [`Fixture`](crate::testkit::Fixture): `Arc<S>` or `(Arc<S>, guard)` where `S` implements
//! both [`Store`] and [`WorkflowStore`] (workflow writes insert and cancel task rows), or an
//! `Option` of either: `None` skips the check (for backends that need an outside service this
//! environment lacks; the factory says why). Events are opaque here: the checks write small JSON
//! strings.

use std::sync::Arc;

use serde_json::json;
use sundial_core::{ExecutionId, Limits, NewTask, RunId, TaskId, TaskSpec, TaskState, Timestamp};
use uuid::Uuid;

use crate::audit_scope::AuditWrite;
use crate::testkit::in_audit_scope;
use crate::{
    ACTIVITY_KIND_PREFIX, ACTIVITY_QUEUE, AppendOp, ClaimOutcome, ClaimTarget, DueClaim, Fence,
    IdReusePolicy, NewEvent, NewRun, ParentLink, RunClose, Store, StoreError, TIMER_KIND,
    TerminateOp, WORKFLOW_KIND_PREFIX, WORKFLOW_QUEUE, WorkflowFilter, WorkflowRun, WorkflowStatus,
    WorkflowStore, WorkflowStoreError, WorkflowTaskCommit, activity_queue, run_task_key_prefix,
    workflow_queue,
};

/// Expands to one `#[tokio::test(flavor = "multi_thread", worker_threads = 2)]` per workflow
/// conformance check, each with a fresh store from `factory` (an async fn or closure returning a
/// [`WorkflowFixture`](crate::workflow_testkit::WorkflowFixture); `None` skips the check).
#[macro_export]
macro_rules! workflow_store_conformance {
    (@checks ($factory:expr) $($check:ident)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let fixture = ($factory)().await;
                let Some(store) = $crate::testkit::Fixture::store(&fixture) else {
                    return;
                };
                $crate::workflow_testkit::$check(store.clone(), store.clone()).await;
                drop(fixture);
            }
        )*
    };
    ($factory:expr $(,)?) => {
        $crate::workflow_store_conformance!(@checks ($factory)
            workflow_start_get_list_round_trip
            workflow_list_selects_one_namespace
            workflow_close_cancels_the_namespace_tasks
            workflow_id_reuse_policies
            workflow_append_keeps_one_pending_task
            workflow_append_marker_is_once
            workflow_stale_commit_writes_nothing
            workflow_commit_records_events_tasks_and_cancels
            workflow_close_cancels_outstanding_and_reports_to_parent
            workflow_continue_as_new_starts_next_run
            workflow_terminate_cancels_everything
            workflow_failed_commit_keeps_nothing
            workflow_purge_deletes_closed_runs_only
            workflow_writes_carry_their_request_audit_record
        );
    };
}

const SHARDS: u32 = 4;
/// 2023-11-14T22:13:20Z.
const T0: i64 = 1_700_000_000_000;

fn at(ms: i64) -> Timestamp {
    Timestamp(T0 + ms)
}

fn fresh_task_id() -> TaskId {
    TaskId(Uuid::new_v4())
}

fn fresh_run_id() -> RunId {
    RunId(Uuid::new_v4())
}

fn ev(ms: i64, what: &str) -> NewEvent {
    NewEvent {
        at: at(ms),
        data: json!({ "type": what }).to_string(),
    }
}

fn workflow_task(workflow_type: &str, run: RunId) -> NewTask {
    TaskSpec::new(format!("{WORKFLOW_KIND_PREFIX}{workflow_type}"))
        .queue(WORKFLOW_QUEUE)
        .payload(json!({ "run": run.to_string() }))
        .validate(fresh_task_id(), at(0), SHARDS, &Limits::default())
        .expect("valid workflow task")
}

fn timer_task(run: RunId, cmd: u32, due: Timestamp) -> NewTask {
    TaskSpec::new(TIMER_KIND)
        .queue(WORKFLOW_QUEUE)
        .key(format!("{}timer/{cmd}", run_task_key_prefix(&run)))
        .run_at(due)
        .validate(fresh_task_id(), at(0), SHARDS, &Limits::default())
        .expect("valid timer")
}

fn activity_task(run: RunId, cmd: u32) -> NewTask {
    TaskSpec::new(format!("{ACTIVITY_KIND_PREFIX}charge"))
        .queue(ACTIVITY_QUEUE)
        .key(format!("{}act/{cmd}", run_task_key_prefix(&run)))
        .validate(fresh_task_id(), at(0), SHARDS, &Limits::default())
        .expect("valid activity")
}

fn new_run(workflow_id: &str, workflow_type: &str) -> NewRun {
    let run_id = fresh_run_id();
    NewRun {
        workflow_id: workflow_id.to_string(),
        run_id,
        workflow_type: workflow_type.to_string(),
        input: json!({ "n": 1 }).to_string(),
        parent: None,
        continued_from: None,
        started: ev(0, "started"),
        first_task: workflow_task(workflow_type, run_id),
        now: at(0),
    }
}

fn append_op(run: RunId, what: &str, marker: Option<&str>) -> AppendOp {
    AppendOp {
        run_id: run,
        events: vec![ev(10, what)],
        marker: marker.map(str::to_string),
        workflow_task: workflow_task("order", run),
        now: at(10),
    }
}

fn commit_op(run: RunId, expect_len: u64, expect_task: TaskId) -> WorkflowTaskCommit {
    WorkflowTaskCommit {
        run_id: run,
        expect_len,
        expect_task,
        events: vec![ev(20, "task_completed")],
        tasks: Vec::new(),
        cancel: Vec::new(),
        close: None,
        continue_as: None,
        parent: None,
        now: at(20),
    }
}

async fn state(tasks: &dyn Store, id: TaskId) -> TaskState {
    tasks
        .get(id)
        .await
        .expect("get")
        .unwrap_or_else(|| panic!("task {id} should exist"))
        .state
}

/// Runs a workflow task to completion in the kernel, as the engine would after its commit.
async fn finish(tasks: &dyn Store, id: TaskId, now: Timestamp) {
    let exec = ExecutionId(Uuid::new_v4());
    let out = tasks
        .claim_due(
            vec![DueClaim {
                id,
                target: ClaimTarget::Run {
                    execution: exec,
                    lease_until: now.saturating_add(std::time::Duration::from_secs(60)),
                    worker: None,
                },
            }],
            now,
            None,
        )
        .await
        .expect("claim");
    assert!(
        matches!(out.first(), Some(ClaimOutcome::Started(_))),
        "{out:?}"
    );
    tasks.complete(id, exec, now, None).await.expect("complete");
}

async fn events(w: &dyn WorkflowStore, run: RunId) -> Vec<String> {
    w.history(run, 0, 1_000)
        .await
        .expect("history")
        .into_iter()
        .map(|e| {
            let v: serde_json::Value = serde_json::from_str(&e.data).expect("event JSON");
            v["type"].as_str().unwrap_or_default().to_string()
        })
        .collect()
}

/// Start, get, current, list (filters, paging) and history: every field round-trips.
pub async fn workflow_start_get_list_round_trip(
    tasks: Arc<dyn Store>,
    workflows: Arc<dyn WorkflowStore>,
) {
    let w = workflows.as_ref();
    let a = new_run("a", "order");
    let started = w
        .start_run(a.clone(), IdReusePolicy::AllowDuplicate)
        .await
        .expect("start");
    let run = &started.run;
    assert_eq!(run.workflow_id, "a");
    assert_eq!(run.run_id, a.run_id);
    assert_eq!(run.workflow_type, "order");
    assert_eq!(run.input, a.input);
    assert_eq!(run.status, WorkflowStatus::Running);
    assert_eq!(run.history_len, 1);
    assert_eq!(run.pending_task, Some(a.first_task.id));
    assert_eq!((run.result.clone(), run.error.clone()), (None, None));
    assert_eq!(run.created_at, at(0));
    assert_eq!(run.closed_at, None);
    assert_eq!(started.task.id, a.first_task.id);
    assert_eq!(
        state(tasks.as_ref(), a.first_task.id).await,
        TaskState::Scheduled
    );
    assert_eq!(w.get_run(a.run_id).await.expect("get").as_ref(), Some(run));
    assert_eq!(
        w.current_run("a").await.expect("current").as_ref(),
        Some(run)
    );
    assert_eq!(w.current_run("zz").await.expect("current"), None);
    assert_eq!(w.get_run(fresh_run_id()).await.expect("get"), None);
    let h = w.history(a.run_id, 0, 10).await.expect("history");
    assert_eq!(h.len(), 1);
    assert_eq!((h[0].seq, h[0].at), (0, at(0)));
    assert_eq!(h[0].data, a.started.data);

    for (id, ty) in [("b", "ship"), ("c", "order"), ("d", "order")] {
        w.start_run(new_run(id, ty), IdReusePolicy::AllowDuplicate)
            .await
            .expect("start");
    }
    let all = w
        .list_workflows(&WorkflowFilter::default(), None, 10)
        .await
        .expect("list");
    let ids: Vec<&str> = all.runs.iter().map(|r| r.workflow_id.as_str()).collect();
    assert_eq!(ids, ["a", "b", "c", "d"]);
    assert_eq!(all.next_cursor, None);
    let filter = WorkflowFilter {
        workflow_type: Some("order".into()),
        status: Some(WorkflowStatus::Running),
        ..WorkflowFilter::default()
    };
    let p1 = w.list_workflows(&filter, None, 2).await.expect("list");
    let ids: Vec<&str> = p1.runs.iter().map(|r| r.workflow_id.as_str()).collect();
    assert_eq!(ids, ["a", "c"]);
    assert_eq!(p1.next_cursor.as_deref(), Some("c"));
    let p2 = w
        .list_workflows(&filter, p1.next_cursor.as_deref(), 2)
        .await
        .expect("list");
    let ids: Vec<&str> = p2.runs.iter().map(|r| r.workflow_id.as_str()).collect();
    assert_eq!(ids, ["d"]);
    assert_eq!(p2.next_cursor, None);
    let done = WorkflowFilter {
        workflow_type: None,
        status: Some(WorkflowStatus::Completed),
        ..WorkflowFilter::default()
    };
    assert!(
        w.list_workflows(&done, None, 10)
            .await
            .expect("list")
            .runs
            .is_empty()
    );
}

/// `namespace` selects exactly one namespace's workflows by their stored ids (see
/// `sundial_core::namespace`): the default namespace's are those without the separator, and a
/// namespace whose name is another's prefix, or holds `_` (a LIKE wildcard), selects only its
/// own. The same id in two namespaces is two workflows; pages keep to the namespace.
pub async fn workflow_list_selects_one_namespace(
    _tasks: Arc<dyn Store>,
    workflows: Arc<dyn WorkflowStore>,
) {
    use sundial_core::namespace::qualify;
    let w = workflows.as_ref();
    let mut by_ns: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
    for (ns, id) in [
        ("default", "acme"),
        ("default", "order-1"),
        ("acme", "order-1"),
        ("acme", "order-2"),
        ("acm", "order-1"),
        ("a_me", "order-1"),
        ("abme", "order-1"),
    ] {
        let stored = qualify(ns, id);
        w.start_run(new_run(&stored, "order"), IdReusePolicy::RejectDuplicate)
            .await
            .expect("the same id in another namespace is another workflow");
        by_ns.entry(ns).or_default().push(stored);
    }
    for (ns, mut want) in by_ns {
        want.sort();
        let filter = WorkflowFilter {
            namespace: Some(ns.to_string()),
            ..WorkflowFilter::default()
        };
        let all = w.list_workflows(&filter, None, 100).await.expect("list");
        let ids: Vec<String> = all.runs.iter().map(|r| r.workflow_id.clone()).collect();
        assert_eq!(ids, want, "namespace {ns}");
        assert!(all.runs.iter().all(|r| filter.matches(r)));
        let mut seen = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = w
                .list_workflows(&filter, after.as_deref(), 1)
                .await
                .expect("page");
            seen.extend(page.runs.iter().map(|r| r.workflow_id.clone()));
            match page.next_cursor {
                Some(c) => after = Some(c),
                None => break,
            }
        }
        assert_eq!(seen, want, "pages of {ns}");
    }
    let none = WorkflowFilter {
        namespace: Some("nowhere".into()),
        ..WorkflowFilter::default()
    };
    assert!(
        w.list_workflows(&none, None, 100)
            .await
            .expect("list")
            .runs
            .is_empty()
    );
}

/// Closing a run of a namespace other than the default one cancels what it left outstanding in
/// that namespace's workflow queues ([`workflow_queue`], [`activity_queue`]), as for the
/// default namespace's runs.
pub async fn workflow_close_cancels_the_namespace_tasks(
    tasks: Arc<dyn Store>,
    workflows: Arc<dyn WorkflowStore>,
) {
    let w = workflows.as_ref();
    let id = sundial_core::namespace::qualify("acme", "order-1");
    let mut r = new_run(&id, "order");
    r.first_task = TaskSpec::new(format!("{WORKFLOW_KIND_PREFIX}order"))
        .queue(workflow_queue("acme"))
        .payload(json!({ "run": r.run_id.to_string() }))
        .validate(fresh_task_id(), at(0), SHARDS, &Limits::default())
        .expect("valid workflow task");
    w.start_run(r.clone(), IdReusePolicy::AllowDuplicate)
        .await
        .expect("start");
    let mut timer = timer_task(r.run_id, 1, at(86_400_000));
    timer.queue = workflow_queue("acme");
    let mut act = activity_task(r.run_id, 2);
    act.queue = activity_queue("acme");
    let mut op = commit_op(r.run_id, 1, r.first_task.id);
    op.tasks = vec![timer.clone(), act.clone()];
    w.commit_workflow_task(op).await.expect("commit");
    let t = w
        .terminate(TerminateOp {
            run_id: r.run_id,
            event: ev(30, "terminated"),
            reason: "operator".into(),
            parent: None,
            now: at(30),
        })
        .await
        .expect("terminate");
    let mut cancelled = t.cancelled.clone();
    cancelled.sort();
    let mut expected = vec![timer.id, act.id];
    expected.sort();
    assert_eq!(cancelled, expected);
    assert_eq!(state(tasks.as_ref(), timer.id).await, TaskState::Cancelled);
    assert_eq!(state(tasks.as_ref(), act.id).await, TaskState::Cancelled);
}

async fn complete_run(w: &dyn WorkflowStore, run: &NewRun, status: WorkflowStatus) {
    let mut op = commit_op(run.run_id, 1, run.first_task.id);
    op.close = Some(RunClose {
        status,
        result: Some("42".into()),
        error: None,
    });
    w.commit_workflow_task(op).await.expect("commit close");
}

/// A running id refuses a new run; a closed one follows the reuse policy.
pub async fn workflow_id_reuse_policies(_tasks: Arc<dyn Store>, workflows: Arc<dyn WorkflowStore>) {
    let w = workflows.as_ref();
    let first = new_run("x", "order");
    w.start_run(first.clone(), IdReusePolicy::AllowDuplicate)
        .await
        .expect("start");
    for policy in [
        IdReusePolicy::AllowDuplicate,
        IdReusePolicy::AllowDuplicateFailedOnly,
        IdReusePolicy::RejectDuplicate,
    ] {
        match w.start_run(new_run("x", "order"), policy).await {
            Err(WorkflowStoreError::AlreadyRunning { run_id }) => assert_eq!(run_id, first.run_id),
            other => panic!("{policy:?}: expected AlreadyRunning, got {other:?}"),
        }
    }
    complete_run(w, &first, WorkflowStatus::Completed).await;
    for policy in [
        IdReusePolicy::AllowDuplicateFailedOnly,
        IdReusePolicy::RejectDuplicate,
    ] {
        match w.start_run(new_run("x", "order"), policy).await {
            Err(WorkflowStoreError::AlreadyExists { run_id, status }) => {
                assert_eq!((run_id, status), (first.run_id, WorkflowStatus::Completed))
            }
            other => panic!("{policy:?}: expected AlreadyExists, got {other:?}"),
        }
    }
    let second = new_run("x", "order");
    w.start_run(second.clone(), IdReusePolicy::AllowDuplicate)
        .await
        .expect("second run");
    assert_eq!(
        w.current_run("x").await.expect("current").map(|r| r.run_id),
        Some(second.run_id)
    );
    // The first run is still readable by its run id.
    assert_eq!(
        w.get_run(first.run_id)
            .await
            .expect("get")
            .map(|r| r.status),
        Some(WorkflowStatus::Completed)
    );
    complete_run(w, &second, WorkflowStatus::Failed).await;
    let third = new_run("x", "order");
    w.start_run(third, IdReusePolicy::AllowDuplicateFailedOnly)
        .await
        .expect("a failed run may be followed");
}

/// Appends number events in order and insert a workflow task only when none is live.
pub async fn workflow_append_keeps_one_pending_task(
    tasks: Arc<dyn Store>,
    workflows: Arc<dyn WorkflowStore>,
) {
    let w = workflows.as_ref();
    let r = new_run("a", "order");
    w.start_run(r.clone(), IdReusePolicy::AllowDuplicate)
        .await
        .expect("start");
    let a1 = w
        .append(append_op(r.run_id, "signal", None))
        .await
        .expect("append");
    assert_eq!(a1.first_seq, 1);
    assert_eq!(a1.task, None, "the first workflow task is still pending");
    assert_eq!(a1.run.history_len, 2);
    assert_eq!(a1.run.pending_task, Some(r.first_task.id));
    assert_eq!(a1.run.updated_at, at(10));

    // The pending task ran and committed: the next append schedules a new one.
    let c = w
        .commit_workflow_task(commit_op(r.run_id, 2, r.first_task.id))
        .await
        .expect("commit");
    assert_eq!(c.run.pending_task, None);
    let op = append_op(r.run_id, "timer_fired", None);
    let new_task = op.workflow_task.id;
    let a2 = w.append(op).await.expect("append");
    assert_eq!(a2.first_seq, 3);
    assert_eq!(a2.task.as_ref().map(|t| t.id), Some(new_task));
    assert_eq!(a2.run.pending_task, Some(new_task));
    assert_eq!(state(tasks.as_ref(), new_task).await, TaskState::Scheduled);
    // Pending and live: no third task.
    let a3 = w
        .append(append_op(r.run_id, "signal", None))
        .await
        .expect("append");
    assert_eq!(a3.task, None);
    // A pending task that is no longer live (it died) is replaced.
    tasks.cancel(new_task, at(11)).await.expect("cancel");
    let op = append_op(r.run_id, "signal", None);
    let replacement = op.workflow_task.id;
    let a4 = w.append(op).await.expect("append");
    assert_eq!(a4.task.map(|t| t.id), Some(replacement));
    assert_eq!(a4.run.pending_task, Some(replacement));
    assert_eq!(
        events(w, r.run_id).await,
        [
            "started",
            "signal",
            "task_completed",
            "timer_fired",
            "signal",
            "signal"
        ]
    );
    // Closed runs take no appends.
    complete_run_now(w, r.run_id, &a4.run).await;
    match w.append(append_op(r.run_id, "signal", None)).await {
        Err(WorkflowStoreError::NotRunning { status }) => {
            assert_eq!(status, WorkflowStatus::Completed)
        }
        other => panic!("expected NotRunning, got {other:?}"),
    }
    match w.append(append_op(fresh_run_id(), "signal", None)).await {
        Err(WorkflowStoreError::NotFound) => {}
        other => panic!("expected NotFound, got {other:?}"),
    }
}

async fn complete_run_now(w: &dyn WorkflowStore, run: RunId, current: &WorkflowRun) {
    let Some(pending) = current.pending_task else {
        panic!("run has no pending task");
    };
    let mut op = commit_op(run, current.history_len, pending);
    op.close = Some(RunClose {
        status: WorkflowStatus::Completed,
        result: Some("1".into()),
        error: None,
    });
    w.commit_workflow_task(op).await.expect("close");
}

/// An append with a marker happens once; the repeat writes nothing.
pub async fn workflow_append_marker_is_once(
    _tasks: Arc<dyn Store>,
    workflows: Arc<dyn WorkflowStore>,
) {
    let w = workflows.as_ref();
    let r = new_run("a", "order");
    w.start_run(r.clone(), IdReusePolicy::AllowDuplicate)
        .await
        .expect("start");
    assert!(!w.has_marker(r.run_id, "timer:1").await.expect("marker"));
    w.append(append_op(r.run_id, "timer_fired", Some("timer:1")))
        .await
        .expect("append");
    assert!(w.has_marker(r.run_id, "timer:1").await.expect("marker"));
    match w
        .append(append_op(r.run_id, "timer_fired", Some("timer:1")))
        .await
    {
        Err(WorkflowStoreError::Duplicate) => {}
        other => panic!("expected Duplicate, got {other:?}"),
    }
    w.append(append_op(r.run_id, "timer_fired", Some("timer:2")))
        .await
        .expect("another marker");
    assert_eq!(
        events(w, r.run_id).await,
        ["started", "timer_fired", "timer_fired"]
    );
    assert_eq!(
        w.get_run(r.run_id)
            .await
            .expect("get")
            .map(|r| r.history_len),
        Some(3)
    );
}

/// A commit whose history length or pending task is out of date writes nothing.
pub async fn workflow_stale_commit_writes_nothing(
    tasks: Arc<dyn Store>,
    workflows: Arc<dyn WorkflowStore>,
) {
    let w = workflows.as_ref();
    let r = new_run("a", "order");
    w.start_run(r.clone(), IdReusePolicy::AllowDuplicate)
        .await
        .expect("start");
    // A signal arrives while the workflow task replays one event.
    w.append(append_op(r.run_id, "signal", None))
        .await
        .expect("append");
    let mut stale = commit_op(r.run_id, 1, r.first_task.id);
    let timer = timer_task(r.run_id, 1, at(60_000));
    stale.tasks.push(timer.clone());
    match w.commit_workflow_task(stale).await {
        Err(WorkflowStoreError::Stale {
            history_len,
            pending_task,
        }) => {
            assert_eq!(history_len, 2);
            assert_eq!(pending_task, Some(r.first_task.id));
        }
        other => panic!("expected Stale, got {other:?}"),
    }
    assert!(tasks.get(timer.id).await.expect("get").is_none());
    assert_eq!(events(w, r.run_id).await, ["started", "signal"]);
    // Another task than the pending one is stale too.
    match w
        .commit_workflow_task(commit_op(r.run_id, 2, fresh_task_id()))
        .await
    {
        Err(WorkflowStoreError::Stale { .. }) => {}
        other => panic!("expected Stale, got {other:?}"),
    }
    // The up-to-date commit goes through.
    w.commit_workflow_task(commit_op(r.run_id, 2, r.first_task.id))
        .await
        .expect("commit");
    // And a second commit of the same task is stale (it is no longer pending).
    match w
        .commit_workflow_task(commit_op(r.run_id, 3, r.first_task.id))
        .await
    {
        Err(WorkflowStoreError::Stale { pending_task, .. }) => assert_eq!(pending_task, None),
        other => panic!("expected Stale, got {other:?}"),
    }
    assert_eq!(
        events(w, r.run_id).await,
        ["started", "signal", "task_completed"]
    );
}

/// A commit appends its events, inserts its tasks and cancels the ones it gives up, together.
pub async fn workflow_commit_records_events_tasks_and_cancels(
    tasks: Arc<dyn Store>,
    workflows: Arc<dyn WorkflowStore>,
) {
    let w = workflows.as_ref();
    let r = new_run("a", "order");
    w.start_run(r.clone(), IdReusePolicy::AllowDuplicate)
        .await
        .expect("start");
    let timer = timer_task(r.run_id, 1, at(86_400_000));
    let act = activity_task(r.run_id, 2);
    let mut op = commit_op(r.run_id, 1, r.first_task.id);
    op.events.push(ev(20, "timer_started"));
    op.events.push(ev(20, "activity_scheduled"));
    op.tasks = vec![timer.clone(), act.clone()];
    let c = w.commit_workflow_task(op).await.expect("commit");
    assert_eq!(c.run.history_len, 4);
    assert_eq!(c.run.pending_task, None);
    assert_eq!(c.run.status, WorkflowStatus::Running);
    let ids: Vec<TaskId> = c.tasks.iter().map(|t| t.id).collect();
    assert_eq!(ids, [timer.id, act.id]);
    assert_eq!(state(tasks.as_ref(), timer.id).await, TaskState::Scheduled);
    finish(tasks.as_ref(), r.first_task.id, at(20)).await;

    // The activity finishes; the next workflow task cancels the timer.
    let op = append_op(r.run_id, "activity_completed", Some("activity:2"));
    let wft = op.workflow_task.id;
    w.append(op).await.expect("append");
    let mut op = commit_op(r.run_id, 5, wft);
    op.events.push(ev(20, "timer_cancelled"));
    op.cancel = vec![timer.id, act.id];
    let c = w.commit_workflow_task(op).await.expect("commit");
    // The activity was still scheduled in the kernel, so both were live and are cancelled.
    assert_eq!(c.cancelled, [timer.id, act.id]);
    assert_eq!(state(tasks.as_ref(), timer.id).await, TaskState::Cancelled);
    assert_eq!(
        events(w, r.run_id).await,
        [
            "started",
            "task_completed",
            "timer_started",
            "activity_scheduled",
            "activity_completed",
            "task_completed",
            "timer_cancelled"
        ]
    );
    let h = w.history(r.run_id, 4, 2).await.expect("history page");
    let seqs: Vec<u64> = h.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [4, 5]);
}

/// Closing a run cancels what it left outstanding and reports to its parent in the same
/// transaction.
pub async fn workflow_close_cancels_outstanding_and_reports_to_parent(
    tasks: Arc<dyn Store>,
    workflows: Arc<dyn WorkflowStore>,
) {
    let w = workflows.as_ref();
    let parent = new_run("p", "order");
    w.start_run(parent.clone(), IdReusePolicy::AllowDuplicate)
        .await
        .expect("start parent");
    w.commit_workflow_task(commit_op(parent.run_id, 1, parent.first_task.id))
        .await
        .expect("parent commit");
    let mut child = new_run("p/child-1", "ship");
    child.parent = Some(ParentLink {
        run_id: parent.run_id,
        workflow_id: "p".into(),
        cmd: 1,
    });
    let started = w
        .start_run(child.clone(), IdReusePolicy::AllowDuplicate)
        .await
        .expect("start child");
    assert_eq!(started.run.parent, child.parent);

    let timer = timer_task(child.run_id, 1, at(86_400_000));
    let act = activity_task(child.run_id, 2);
    let mut op = commit_op(child.run_id, 1, child.first_task.id);
    op.tasks = vec![timer.clone(), act.clone()];
    w.commit_workflow_task(op).await.expect("child commit");
    let op = append_op(child.run_id, "signal", None);
    let wft = op.workflow_task.id;
    w.append(op).await.expect("append");

    let mut op = commit_op(child.run_id, 3, wft);
    op.events.push(ev(20, "completed"));
    op.close = Some(RunClose {
        status: WorkflowStatus::Completed,
        result: Some(json!({"shipped": true}).to_string()),
        error: None,
    });
    let parent_op = append_op(parent.run_id, "child_completed", Some("child:1"));
    let parent_wft = parent_op.workflow_task.id;
    op.parent = Some(parent_op);
    let c = w.commit_workflow_task(op).await.expect("close");
    assert_eq!(c.run.status, WorkflowStatus::Completed);
    assert_eq!(
        c.run.result.as_deref(),
        Some(json!({"shipped": true}).to_string().as_str())
    );
    assert_eq!(c.run.closed_at, Some(at(20)));
    assert_eq!(c.run.pending_task, None);
    let mut cancelled = c.cancelled.clone();
    cancelled.sort();
    let mut expected = vec![timer.id, act.id];
    expected.sort();
    assert_eq!(cancelled, expected);
    for id in [timer.id, act.id] {
        assert_eq!(state(tasks.as_ref(), id).await, TaskState::Cancelled);
    }
    let p = c.parent.expect("parent appended");
    assert_eq!(p.task.map(|t| t.id), Some(parent_wft));
    assert_eq!(
        events(w, parent.run_id).await,
        ["started", "task_completed", "child_completed"]
    );
    // A closed run takes no more commits.
    match w
        .commit_workflow_task(commit_op(child.run_id, 4, wft))
        .await
    {
        Err(WorkflowStoreError::NotRunning { status }) => {
            assert_eq!(status, WorkflowStatus::Completed)
        }
        other => panic!("expected NotRunning, got {other:?}"),
    }
}

/// Continue-as-new closes the run and starts the next one of the same id, atomically.
pub async fn workflow_continue_as_new_starts_next_run(
    tasks: Arc<dyn Store>,
    workflows: Arc<dyn WorkflowStore>,
) {
    let w = workflows.as_ref();
    let r = new_run("loop", "counter");
    w.start_run(r.clone(), IdReusePolicy::AllowDuplicate)
        .await
        .expect("start");
    let mut next = new_run("loop", "counter");
    next.continued_from = Some(r.run_id);
    next.input = json!({"n": 2}).to_string();
    let mut op = commit_op(r.run_id, 1, r.first_task.id);
    op.close = Some(RunClose {
        status: WorkflowStatus::ContinuedAsNew,
        result: None,
        error: None,
    });
    op.continue_as = Some(next.clone());
    let c = w.commit_workflow_task(op).await.expect("commit");
    assert_eq!(c.run.status, WorkflowStatus::ContinuedAsNew);
    assert_eq!(c.run.continued_to, Some(next.run_id));
    let n = c.next_run.expect("next run");
    assert_eq!(n.run.run_id, next.run_id);
    assert_eq!(n.run.continued_from, Some(r.run_id));
    assert_eq!(n.run.input, next.input);
    assert_eq!(n.task.id, next.first_task.id);
    assert_eq!(
        state(tasks.as_ref(), next.first_task.id).await,
        TaskState::Scheduled
    );
    assert_eq!(
        w.current_run("loop")
            .await
            .expect("current")
            .map(|r| r.run_id),
        Some(next.run_id)
    );
    assert_eq!(events(w, next.run_id).await, ["started"]);
}

/// Terminate appends its event, cancels the pending workflow task and outstanding tasks.
pub async fn workflow_terminate_cancels_everything(
    tasks: Arc<dyn Store>,
    workflows: Arc<dyn WorkflowStore>,
) {
    let w = workflows.as_ref();
    let r = new_run("a", "order");
    w.start_run(r.clone(), IdReusePolicy::AllowDuplicate)
        .await
        .expect("start");
    let timer = timer_task(r.run_id, 1, at(86_400_000));
    let mut op = commit_op(r.run_id, 1, r.first_task.id);
    op.tasks = vec![timer.clone()];
    w.commit_workflow_task(op).await.expect("commit");
    let op = append_op(r.run_id, "signal", None);
    let wft = op.workflow_task.id;
    w.append(op).await.expect("append");
    let t = w
        .terminate(TerminateOp {
            run_id: r.run_id,
            event: ev(30, "terminated"),
            reason: "operator".into(),
            parent: None,
            now: at(30),
        })
        .await
        .expect("terminate");
    assert_eq!(t.run.status, WorkflowStatus::Terminated);
    assert_eq!(t.run.error.as_deref(), Some("operator"));
    assert_eq!(t.run.pending_task, None);
    let mut cancelled = t.cancelled.clone();
    cancelled.sort();
    let mut expected = vec![timer.id, wft];
    expected.sort();
    assert_eq!(cancelled, expected);
    assert_eq!(state(tasks.as_ref(), wft).await, TaskState::Cancelled);
    assert_eq!(
        events(w, r.run_id).await.last().map(String::as_str),
        Some("terminated")
    );
    match w
        .terminate(TerminateOp {
            run_id: r.run_id,
            event: ev(40, "terminated"),
            reason: "again".into(),
            parent: None,
            now: at(40),
        })
        .await
    {
        Err(WorkflowStoreError::NotRunning { status }) => {
            assert_eq!(status, WorkflowStatus::Terminated)
        }
        other => panic!("expected NotRunning, got {other:?}"),
    }
}

/// A commit that fails half-way (a task id that exists already) leaves no trace.
pub async fn workflow_failed_commit_keeps_nothing(
    tasks: Arc<dyn Store>,
    workflows: Arc<dyn WorkflowStore>,
) {
    let w = workflows.as_ref();
    let r = new_run("a", "order");
    w.start_run(r.clone(), IdReusePolicy::AllowDuplicate)
        .await
        .expect("start");
    let timer = timer_task(r.run_id, 1, at(60_000));
    let mut clash = timer_task(r.run_id, 2, at(60_000));
    clash.id = r.first_task.id; // reuses an existing task id
    let mut op = commit_op(r.run_id, 1, r.first_task.id);
    op.events.push(ev(20, "timer_started"));
    op.tasks = vec![timer.clone(), clash];
    assert!(w.commit_workflow_task(op).await.is_err());
    assert!(tasks.get(timer.id).await.expect("get").is_none());
    assert_eq!(events(w, r.run_id).await, ["started"]);
    let run = w.get_run(r.run_id).await.expect("get").expect("run");
    assert_eq!(run.history_len, 1);
    assert_eq!(run.pending_task, Some(r.first_task.id));
    // A failed start leaves no run and no workflow id behind.
    let mut bad = new_run("b", "order");
    bad.first_task.id = r.first_task.id;
    assert!(
        w.start_run(bad.clone(), IdReusePolicy::AllowDuplicate)
            .await
            .is_err()
    );
    assert_eq!(w.current_run("b").await.expect("current"), None);
    assert_eq!(w.get_run(bad.run_id).await.expect("get"), None);
}

async fn terminate_at(w: &dyn WorkflowStore, run: RunId, ms: i64) {
    w.terminate(TerminateOp {
        run_id: run,
        event: ev(ms, "terminated"),
        reason: "operator".into(),
        parent: None,
        now: at(ms),
    })
    .await
    .expect("terminate");
}

/// `purge_closed_runs` deletes runs closed before the cutoff (oldest first, at most `limit`)
/// with their histories and markers, and a workflow id's pointer only while it names the
/// deleted run; a running run is never deleted; a fence that is not current deletes nothing.
pub async fn workflow_purge_deletes_closed_runs_only(
    _tasks: Arc<dyn Store>,
    workflows: Arc<dyn WorkflowStore>,
) {
    let w = workflows.as_ref();
    // "a": a first run closed at 30, then a second run, still running.
    let a1 = new_run("a", "order");
    w.start_run(a1.clone(), IdReusePolicy::AllowDuplicate)
        .await
        .expect("start a1");
    w.append(append_op(a1.run_id, "signal", Some("m1")))
        .await
        .expect("append a1");
    terminate_at(w, a1.run_id, 30).await;
    let a2 = new_run("a", "order");
    w.start_run(a2.clone(), IdReusePolicy::AllowDuplicate)
        .await
        .expect("start a2");
    // "b" closed at 1,000 and "c" at 2,000: each its id's current run.
    let b = new_run("b", "order");
    w.start_run(b.clone(), IdReusePolicy::AllowDuplicate)
        .await
        .expect("start b");
    terminate_at(w, b.run_id, 1_000).await;
    let c = new_run("c", "order");
    w.start_run(c.clone(), IdReusePolicy::AllowDuplicate)
        .await
        .expect("start c");
    terminate_at(w, c.run_id, 2_000).await;

    let stale = Fence {
        shard: 0,
        range_id: 987_654,
    };
    match w.purge_closed_runs(Timestamp::MAX, 100, Some(stale)).await {
        Err(StoreError::LeaseLost { shard: 0 }) => {}
        other => panic!("a fence that is not current must be refused, got {other:?}"),
    }
    assert!(w.get_run(a1.run_id).await.expect("get").is_some());

    // The cutoff is exclusive: a run closed exactly at it stays.
    assert_eq!(
        w.purge_closed_runs(at(30), 100, None).await.expect("purge"),
        0
    );
    assert_eq!(
        w.purge_closed_runs(at(31), 100, None).await.expect("purge"),
        1
    );
    assert!(w.get_run(a1.run_id).await.expect("get").is_none());
    assert!(
        events(w, a1.run_id).await.is_empty(),
        "its history went too"
    );
    assert!(!w.has_marker(a1.run_id, "m1").await.expect("marker"));
    let current = w
        .current_run("a")
        .await
        .expect("current")
        .expect("a2 is current");
    assert_eq!(current.run_id, a2.run_id, "the id keeps its newer run");

    // Oldest close first, at most `limit`.
    assert_eq!(
        w.purge_closed_runs(Timestamp::MAX, 1, None)
            .await
            .expect("purge"),
        1
    );
    assert!(w.get_run(b.run_id).await.expect("get").is_none());
    assert!(w.current_run("b").await.expect("current").is_none());
    assert!(w.get_run(c.run_id).await.expect("get").is_some());
    assert_eq!(
        w.purge_closed_runs(Timestamp::MAX, 100, None)
            .await
            .expect("purge"),
        1
    );
    assert!(w.current_run("c").await.expect("current").is_none());

    // Only the running run is left, and no cutoff deletes it.
    assert_eq!(
        w.purge_closed_runs(Timestamp::MAX, 100, None)
            .await
            .expect("purge"),
        0
    );
    let run = w.get_run(a2.run_id).await.expect("get").expect("a2 kept");
    assert_eq!(run.status, WorkflowStatus::Running);
    assert_eq!(events(w, a2.run_id).await.len(), 1);
    let page = w
        .list_workflows(&WorkflowFilter::default(), None, 10)
        .await
        .expect("list");
    let ids: Vec<&str> = page.runs.iter().map(|r| r.workflow_id.as_str()).collect();
    assert_eq!(ids, vec!["a"]);

    // A purged id can be started again.
    w.start_run(new_run("b", "order"), IdReusePolicy::RejectDuplicate)
        .await
        .expect("start b again");
}

/// Every workflow write a request makes (start, signal, a worker's commit, terminate) commits the
/// request's audit record with the write itself; a write that is refused (a duplicate marker, a
/// stale commit, a run no longer running) leaves it pending for the caller.
pub async fn workflow_writes_carry_their_request_audit_record(
    _tasks: Arc<dyn Store>,
    workflows: Arc<dyn WorkflowStore>,
) {
    let w = workflows.as_ref();
    let written = |w: AuditWrite| matches!(w, AuditWrite::Written { .. });
    let r = new_run("audited", "order");
    let (out, a) = in_audit_scope(
        "POST /v1/workflows",
        w.start_run(r.clone(), IdReusePolicy::AllowDuplicate),
    )
    .await;
    out.expect("start");
    assert!(written(a), "start: {a:?}");

    let (out, a) = in_audit_scope(
        "POST /v1/workflows/{id}/signal",
        w.append(append_op(r.run_id, "signal", Some("signal:1"))),
    )
    .await;
    out.expect("append");
    assert!(written(a), "signal: {a:?}");
    let (out, a) = in_audit_scope(
        "POST /v1/workflows/{id}/signal",
        w.append(append_op(r.run_id, "signal", Some("signal:1"))),
    )
    .await;
    assert!(matches!(out, Err(WorkflowStoreError::Duplicate)), "{out:?}");
    assert_eq!(a, AuditWrite::Pending, "a duplicate writes no record");

    let (out, a) = in_audit_scope(
        "POST /v1/workflow-tasks/{id}/complete",
        w.commit_workflow_task(commit_op(r.run_id, 1, r.first_task.id)),
    )
    .await;
    assert!(
        matches!(out, Err(WorkflowStoreError::Stale { .. })),
        "{out:?}"
    );
    assert_eq!(a, AuditWrite::Pending, "a stale commit writes no record");
    let (out, a) = in_audit_scope(
        "POST /v1/workflow-tasks/{id}/complete",
        w.commit_workflow_task(commit_op(r.run_id, 2, r.first_task.id)),
    )
    .await;
    out.expect("commit");
    assert!(written(a), "commit: {a:?}");

    let terminate = |ms| TerminateOp {
        run_id: r.run_id,
        event: ev(ms, "terminated"),
        reason: "operator".into(),
        parent: None,
        now: at(ms),
    };
    let (out, a) = in_audit_scope(
        "POST /v1/workflows/{id}/terminate",
        w.terminate(terminate(30)),
    )
    .await;
    out.expect("terminate");
    assert!(written(a), "terminate: {a:?}");
    let (out, a) = in_audit_scope(
        "POST /v1/workflows/{id}/terminate",
        w.terminate(terminate(40)),
    )
    .await;
    assert!(
        matches!(out, Err(WorkflowStoreError::NotRunning { .. })),
        "{out:?}"
    );
    assert_eq!(a, AuditWrite::Pending);
}

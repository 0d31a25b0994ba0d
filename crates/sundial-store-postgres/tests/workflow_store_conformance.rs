//! The workflow store conformance suite against PostgreSQL, and what concurrency adds here:
//! starts of one workflow id and appends to one run from several nodes (separate stores,
//! separate pools).
//!
//! The environment rules (`SUNDIAL_TEST_DATABASE_URL`, skipping, `SUNDIAL_REQUIRE_POSTGRES=1`) and
//! the fresh schemas are described in `common/mod.rs`.
#![allow(clippy::unwrap_used)] // test code: a panic is a failed test

use std::sync::Arc;

use sundial_core::{Limits, RunId, TaskId, TaskSpec, Timestamp};
use sundial_store::{
    AppendOp, IdReusePolicy, NewEvent, NewRun, WORKFLOW_QUEUE, WorkflowStore, WorkflowStoreError,
};

mod common;

sundial_store::workflow_store_conformance!(common::fresh_postgres);

fn workflow_task() -> sundial_core::NewTask {
    TaskSpec::new("workflow/order")
        .queue(WORKFLOW_QUEUE)
        .validate(
            TaskId(uuid::Uuid::new_v4()),
            Timestamp(5),
            4,
            &Limits::default(),
        )
        .unwrap()
}

fn new_run(workflow_id: &str) -> NewRun {
    NewRun {
        workflow_id: workflow_id.into(),
        run_id: RunId(uuid::Uuid::new_v4()),
        workflow_type: "order".into(),
        input: "{}".into(),
        parent: None,
        continued_from: None,
        started: NewEvent {
            at: Timestamp(5),
            data: r#"{"type":"started"}"#.into(),
        },
        first_task: workflow_task(),
        now: Timestamp(5),
    }
}

/// Nodes racing to start one workflow id: exactly one run starts, the others are told it runs.
/// Then they race to append with one marker: exactly one append happens, and every plain append
/// gets its own event number.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn starts_and_appends_from_several_nodes() {
    let Some((first, guard)) = common::fresh_postgres().await else {
        return;
    };
    let mut nodes = vec![first];
    for _ in 0..3 {
        nodes.push(Arc::new(
            common::connect(&guard.url, &guard.schema).await.unwrap(),
        ));
    }
    let mut handles = Vec::new();
    for _ in 0..3 {
        for node in &nodes {
            let node = node.clone();
            handles.push(tokio::spawn(async move {
                node.start_run(new_run("race"), IdReusePolicy::AllowDuplicate)
                    .await
            }));
        }
    }
    let mut winner = None;
    let mut refused = Vec::new();
    for h in handles {
        match h.await.unwrap() {
            Ok(s) => {
                assert!(winner.is_none(), "two starts of one id succeeded");
                winner = Some(s.run.run_id);
            }
            Err(WorkflowStoreError::AlreadyRunning { run_id }) => refused.push(run_id),
            Err(e) => panic!("unexpected error {e:?}"),
        }
    }
    let winner = winner.expect("one start succeeds");
    assert_eq!(refused.len(), 11);
    assert!(refused.iter().all(|r| *r == winner));
    assert_eq!(
        nodes[2].current_run("race").await.unwrap().unwrap().run_id,
        winner
    );

    let append = |marker: Option<&str>, n: i64| AppendOp {
        run_id: winner,
        events: vec![NewEvent {
            at: Timestamp(10 + n),
            data: format!(r#"{{"type":"signal","n":{n}}}"#),
        }],
        marker: marker.map(str::to_string),
        workflow_task: workflow_task(),
        now: Timestamp(10 + n),
    };
    let mut handles = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        for j in 0..4 {
            let node = node.clone();
            let marked = append(Some("timer:1"), 0);
            let plain = append(None, (i * 4 + j) as i64);
            handles.push(tokio::spawn(async move {
                (node.append(marked).await, node.append(plain).await)
            }));
        }
    }
    let (mut marked_ok, mut seqs) = (0, Vec::new());
    for h in handles {
        let (marked, plain) = h.await.unwrap();
        match marked {
            Ok(a) => {
                marked_ok += 1;
                seqs.push(a.first_seq);
            }
            Err(WorkflowStoreError::Duplicate) => {}
            Err(e) => panic!("unexpected error {e:?}"),
        }
        seqs.push(plain.unwrap().first_seq);
    }
    assert_eq!(marked_ok, 1, "a marked append happens once");
    seqs.sort();
    assert_eq!(seqs, (1..=17).collect::<Vec<u64>>());
    let history = nodes[3].history(winner, 0, 100).await.unwrap();
    assert_eq!(history.len(), 18);
    assert!(history.iter().enumerate().all(|(i, e)| e.seq == i as u64));
    let run = nodes[0].get_run(winner).await.unwrap().unwrap();
    assert_eq!(run.history_len, 18);
    drop(nodes);
    drop(guard);
}

/// Closing a run cancels its own outstanding tasks and nothing of another run's (the key range
/// of its prefix is exact).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_run_leaves_other_runs_tasks_alone() {
    let Some((store, guard)) = common::fresh_postgres().await else {
        return;
    };
    let timer = |run: RunId| {
        TaskSpec::new(sundial_store::TIMER_KIND)
            .queue(WORKFLOW_QUEUE)
            .key(format!(
                "{}timer/1",
                sundial_store::run_task_key_prefix(&run)
            ))
            .run_at(Timestamp(1_000_000))
            .validate(
                TaskId(uuid::Uuid::new_v4()),
                Timestamp(5),
                4,
                &Limits::default(),
            )
            .unwrap()
    };
    let (a, b) = (new_run("a"), new_run("b"));
    let mut timers = Vec::new();
    for r in [&a, &b] {
        store
            .start_run(r.clone(), IdReusePolicy::AllowDuplicate)
            .await
            .unwrap();
        let t = timer(r.run_id);
        timers.push(t.id);
        store
            .commit_workflow_task(sundial_store::WorkflowTaskCommit {
                run_id: r.run_id,
                expect_len: 1,
                expect_task: r.first_task.id,
                events: Vec::new(),
                tasks: vec![t],
                cancel: Vec::new(),
                close: None,
                continue_as: None,
                parent: None,
                now: Timestamp(6),
            })
            .await
            .unwrap();
    }
    let op = AppendOp {
        run_id: a.run_id,
        events: Vec::new(),
        marker: None,
        workflow_task: workflow_task(),
        now: Timestamp(7),
    };
    let wft = op.workflow_task.id;
    store.append(op).await.unwrap();
    let closed = store
        .commit_workflow_task(sundial_store::WorkflowTaskCommit {
            run_id: a.run_id,
            expect_len: 1,
            expect_task: wft,
            events: Vec::new(),
            tasks: Vec::new(),
            cancel: Vec::new(),
            close: Some(sundial_store::RunClose {
                status: sundial_store::WorkflowStatus::Completed,
                result: Some("1".into()),
                error: None,
            }),
            continue_as: None,
            parent: None,
            now: Timestamp(8),
        })
        .await
        .unwrap();
    assert_eq!(closed.cancelled, [timers[0]]);
    use sundial_store::Store;
    let state = |id| {
        let store = store.clone();
        async move { store.get(id).await.unwrap().unwrap().state }
    };
    assert_eq!(state(timers[0]).await, sundial_core::TaskState::Cancelled);
    assert_eq!(state(timers[1]).await, sundial_core::TaskState::Scheduled);
    drop(store);
    drop(guard);
}

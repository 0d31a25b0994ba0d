//! Continue-as-new, child workflows, racing, side effects and deterministic time and randomness,
//! and the management API (id reuse, list, history as JSON).
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::{AtomicU32, Ordering};

use common::{MIN, harness, result};
use serde_json::json;
use sundial_workflow::{
    Either, Error, IdReusePolicy, StartWorkflow, WorkflowContext, WorkflowError, WorkflowFilter,
    WorkflowStatus, race,
};

/// Counts to 3, one run per step, sleeping a minute in each.
async fn counter(ctx: WorkflowContext, n: u32) -> Result<u32, WorkflowError> {
    if n >= 3 {
        return Ok(n);
    }
    ctx.sleep(MIN).await?;
    Err(WorkflowError::continue_as_new(&(n + 1)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continue_as_new_carries_state_across_runs() {
    let h = harness(|w| w.register("counter", counter).unwrap()).await;
    let first = h.start("counter", "c", json!(0)).await;
    let mut runs = vec![first.run_id];
    for _ in 0..3 {
        h.wait_events("c", "timer_started", 1).await;
        h.advance(MIN).await;
        let last = *runs.last().unwrap();
        let next = h
            .until("the next run", || async {
                let r = h.run("c").await;
                (r.run_id != last).then_some(r.run_id)
            })
            .await;
        runs.push(next);
    }
    let done = h.wait_status("c", WorkflowStatus::Completed).await;
    assert_eq!(result(&done), json!(3));
    assert_eq!(runs.len(), 4, "one run per step");
    // The chain: each run continued into the next, with its state as input.
    for (i, pair) in runs.windows(2).enumerate() {
        let old = h.workflows.get_run(pair[0]).await.unwrap().unwrap();
        assert_eq!(old.status, WorkflowStatus::ContinuedAsNew);
        assert_eq!(old.continued_to, Some(pair[1]));
        let new = h.workflows.get_run(pair[1]).await.unwrap().unwrap();
        assert_eq!(new.continued_from, Some(pair[0]));
        assert_eq!(new.input, (i + 1).to_string());
    }
    // Each run's history stays short.
    assert!(h.history("c").await.len() <= 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_workflows_return_their_result() {
    async fn parent(ctx: WorkflowContext, n: u32) -> Result<Vec<u32>, WorkflowError> {
        let a = ctx.child::<_, u32>("square", &n);
        let b = ctx.child::<_, u32>("square", &(n + 1)).id("custom-child");
        let (a, b) = futures::join!(a, b);
        let failed = ctx.child::<_, u32>("square", &1000).await;
        Ok(vec![a?, b?, u32::from(failed.is_err())])
    }
    async fn square(ctx: WorkflowContext, n: u32) -> Result<u32, WorkflowError> {
        ctx.sleep(MIN).await?;
        if n >= 1000 {
            return Err(WorkflowError::failed("too big"));
        }
        Ok(n * n)
    }
    let h = harness(|w| {
        w.register("parent", parent).unwrap();
        w.register("square", square).unwrap();
    })
    .await;
    h.start("parent", "p", json!(3)).await;
    h.wait_events("p/0", "timer_started", 1).await;
    h.wait_events("custom-child", "timer_started", 1).await;
    h.advance(MIN).await;
    h.wait_events("p/2", "timer_started", 1).await;
    h.advance(MIN).await;
    let done = h.wait_status("p", WorkflowStatus::Completed).await;
    assert_eq!(result(&done), json!([9, 16, 1]));
    let child = h.run("p/0").await;
    assert_eq!(child.parent.as_ref().unwrap().workflow_id, "p");
    assert_eq!(h.run("p/2").await.status, WorkflowStatus::Failed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn race_side_effect_time_and_randomness_are_replay_stable() {
    static SIDE_EFFECT_RUNS: AtomicU32 = AtomicU32::new(0);
    async fn wf(ctx: WorkflowContext, _: ()) -> Result<serde_json::Value, WorkflowError> {
        let t0 = ctx.now();
        let r = ctx.random_u64();
        let u = ctx.uuid();
        let token: u32 = ctx.side_effect(|| {
            SIDE_EFFECT_RUNS.fetch_add(1, Ordering::SeqCst);
            42
        })?;
        // The timer wins the race; the losing signal wait costs nothing.
        let first = race(ctx.sleep(MIN), ctx.signal::<String>("go")).await;
        let winner = match first {
            Either::Left(r) => {
                r?;
                "timer"
            }
            Either::Right(s) => {
                s?;
                "signal"
            }
        };
        // The signal wins this one; the losing timer is cancelled.
        let second = race(ctx.sleep(60 * MIN), ctx.signal::<String>("go")).await;
        let got = match second {
            Either::Left(_) => "timer".to_string(),
            Either::Right(s) => s?,
        };
        Ok(json!({
            "t0": t0.0, "t1": ctx.now().0, "r": r.to_string(), "u": u.to_string(),
            "token": token, "winner": winner, "got": got,
            // Drawn again after several replays: still the same sequence.
            "r2": ctx.random_u64().to_string(),
        }))
    }
    let h = harness(|w| w.register("wf", wf).unwrap()).await;
    h.start("wf", "w", json!(null)).await;
    h.wait_events("w", "timer_started", 1).await;
    h.advance(MIN).await;
    h.wait_events("w", "timer_started", 2).await;
    h.workflows.signal("w", "go", json!("hello")).await.unwrap();
    let done = h.wait_status("w", WorkflowStatus::Completed).await;
    let r = result(&done);
    assert_eq!(r["t0"], json!(common::T0.0));
    assert_eq!(r["t1"], json!(common::T0.0 + 60_000));
    assert_eq!(r["token"], json!(42));
    assert_eq!(r["winner"], json!("timer"));
    assert_eq!(r["got"], json!("hello"));
    assert_ne!(r["r"], r["r2"]);
    assert_eq!(
        SIDE_EFFECT_RUNS.load(Ordering::SeqCst),
        1,
        "side effect ran once"
    );
    let types = h.types("w").await;
    assert!(types.contains(&"timer_cancelled"), "{types:?}");
    // Replaying the closed history reproduces the same values (same commands, same result).
    let run = h.run("w").await;
    let history = h.workflows.history(run.run_id).await.unwrap();
    let replayed = h
        .workflows
        .replay(&run, &history, history.last().unwrap().at)
        .unwrap();
    assert!(replayed.finished);
    assert!(replayed.new_commands.is_empty());
    assert_eq!(SIDE_EFFECT_RUNS.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn management_api_id_reuse_list_and_history_json() {
    async fn quick(_ctx: WorkflowContext, n: u32) -> Result<u32, WorkflowError> {
        if n == 0 {
            return Err(WorkflowError::failed("zero"));
        }
        Ok(n)
    }
    let h = harness(|w| w.register("quick", quick).unwrap()).await;
    h.start("quick", "a", json!(1)).await;
    h.wait_status("a", WorkflowStatus::Completed).await;
    let err = h
        .workflows
        .start(
            StartWorkflow::new("quick", json!(2))
                .id("a")
                .id_reuse(IdReusePolicy::RejectDuplicate),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::AlreadyExists { .. }), "{err:?}");
    h.workflows
        .start(StartWorkflow::new("quick", json!(2)).id("a"))
        .await
        .unwrap();
    let done = h.wait_status("a", WorkflowStatus::Completed).await;
    assert_eq!(result(&done), json!(2));
    h.start("quick", "b", json!(0)).await;
    h.wait_status("b", WorkflowStatus::Failed).await;
    // A generated id is the run id.
    let c = h
        .workflows
        .start(StartWorkflow::new("quick", json!(3)))
        .await
        .unwrap();
    assert_eq!(c.workflow_id, c.run_id.to_string());

    let failed = h
        .workflows
        .list(
            &WorkflowFilter {
                status: Some(WorkflowStatus::Failed),
                ..WorkflowFilter::default()
            },
            None,
            10,
        )
        .await
        .unwrap();
    let ids: Vec<&str> = failed.runs.iter().map(|r| r.workflow_id.as_str()).collect();
    assert_eq!(ids, ["b"]);
    let page = h
        .workflows
        .list(&WorkflowFilter::default(), None, 1)
        .await
        .unwrap();
    assert_eq!(page.runs.len(), 1);
    assert_eq!(page.next_cursor.as_ref(), Some(&page.runs[0].workflow_id));
    let rest = h
        .workflows
        .list(&WorkflowFilter::default(), page.next_cursor.as_deref(), 10)
        .await
        .unwrap();
    assert_eq!(rest.runs.len(), 2);
    assert_eq!(rest.next_cursor, None);

    let j = h.workflows.history_json("a").await.unwrap();
    let events = j["events"].as_array().unwrap();
    assert_eq!(events[0]["seq"], json!(0));
    assert_eq!(events[0]["type"], json!("workflow_started"));
    assert_eq!(events[0]["input"], json!(2));
    assert_eq!(events.last().unwrap()["type"], json!("workflow_completed"));

    // Refused requests store nothing.
    for bad in [
        StartWorkflow::new("no spaces", json!(1)),
        StartWorkflow::new("quick", json!(1)).id(" padded"),
        StartWorkflow::new("quick", json!("x".repeat(300 * 1024))),
    ] {
        assert!(h.workflows.start(bad).await.unwrap_err().is_invalid());
    }
    assert!(h.workflows.get("zz").await.unwrap().is_none());
}

/// A loop that continues as new when the history grows past the configured size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_history_suggests_continue_as_new() {
    async fn looper(ctx: WorkflowContext, total: u32) -> Result<u32, WorkflowError> {
        let mut total = total;
        loop {
            if total >= 5 {
                return Ok(total);
            }
            if ctx.continue_as_new_suggested() {
                return Err(WorkflowError::continue_as_new(&total));
            }
            ctx.sleep(MIN).await?;
            total += 1;
        }
    }
    let config = sundial_workflow::WorkflowConfig {
        history_warn_events: 6,
        ..sundial_workflow::WorkflowConfig::default()
    };
    let h = common::harness_with(config, |w| w.register("looper", looper).unwrap()).await;
    let first = h.start("looper", "l", json!(0)).await;
    for _ in 0..5 {
        h.wait_events("l", "timer_started", 1).await;
        let before = h.run("l").await.history_len;
        h.advance(MIN).await;
        h.until("the loop's next step", || async {
            let r = h.run("l").await;
            (r.history_len != before || r.run_id != first.run_id && r.history_len > 1).then_some(())
        })
        .await;
    }
    let done = h.wait_status("l", WorkflowStatus::Completed).await;
    assert_eq!(result(&done), json!(5));
    assert_ne!(done.run_id, first.run_id, "the loop continued as new");
    let old = h.workflows.get_run(first.run_id).await.unwrap().unwrap();
    assert_eq!(old.status, WorkflowStatus::ContinuedAsNew);
    assert!(old.history_len <= 12, "{}", old.history_len);
    // Replay follows the answers recorded in the history, not today's threshold (the standalone
    // replayer never suggests on its own).
    let history = h.workflows.history(first.run_id).await.unwrap();
    let replayed = sundial_workflow::replay_history(looper, &history).unwrap();
    assert!(replayed.finished && replayed.new_commands.is_empty());
}

//! The replay suite. Histories recorded from real runs (saga, compensation, signal with timeout,
//! cancellation, racing with side effects, continue-as-new, parallel activities) are replayed and
//! must produce exactly the recorded commands; deliberately changed workflows are reported as
//! non-deterministic at the right event.
//!
//! The recorded histories are also kept as JSON files in `tests/histories/` (regenerate with
//! `SUNDIAL_UPDATE_HISTORIES=1`): replaying those guards against changes to this crate that would
//! break runs already in flight, not only against changes to workflow code.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{DAY, MIN, harness};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sundial_workflow::{
    ActivityError, Either, Event, ReplayError, Replayed, RetryPolicy, WorkflowContext,
    WorkflowError, WorkflowEvent, WorkflowStatus, Workflows, race, replay_history,
};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Order {
    id: String,
    amount: u64,
}

async fn saga(ctx: WorkflowContext, order: Order) -> Result<String, WorkflowError> {
    let _: () = ctx.activity("reserve", &order).await?;
    match ctx
        .activity::<_, String>("charge", &order)
        .retry(RetryPolicy::fixed(2, Duration::from_secs(1)))
        .await
    {
        Ok(receipt) => {
            ctx.sleep(DAY).await?;
            let _: () = ctx.activity("ship", &receipt).await?;
            Ok(receipt)
        }
        Err(e) => {
            let _: () = ctx.activity("release", &order).await?;
            Err(WorkflowError::failed(format!("compensated: {e}")))
        }
    }
}

async fn payment(ctx: WorkflowContext, _: ()) -> Result<String, WorkflowError> {
    let mut got = Vec::new();
    for _ in 0..2 {
        match ctx.signal::<String>("paid").timeout(30 * MIN).await? {
            Some(s) => got.push(s),
            None => got.push("timeout".into()),
        }
    }
    Ok(got.join(","))
}

async fn sleepy(ctx: WorkflowContext, _: ()) -> Result<(), WorkflowError> {
    if let Err(e) = ctx.sleep(7 * DAY).await {
        let _: () = ctx.activity("undo", &()).await?;
        return Err(e);
    }
    Ok(())
}

async fn racer(ctx: WorkflowContext, _: ()) -> Result<serde_json::Value, WorkflowError> {
    let id = ctx.uuid();
    let x: u64 = ctx.side_effect(|| 7)?;
    let first = match race(ctx.sleep(MIN), ctx.signal::<u64>("go")).await {
        Either::Left(r) => r.map(|()| 0)?,
        Either::Right(s) => s?,
    };
    let second = match race(ctx.activity::<_, u64>("slowish", &x), ctx.sleep(5 * MIN)).await {
        Either::Left(r) => r?,
        Either::Right(r) => r.map(|()| 0)?,
    };
    Ok(json!({"id": id, "first": first, "second": second, "r": ctx.random_u64().to_string()}))
}

async fn counter(ctx: WorkflowContext, n: u32) -> Result<u32, WorkflowError> {
    if n >= 2 {
        return Ok(n);
    }
    ctx.sleep(MIN).await?;
    Err(WorkflowError::continue_as_new(&(n + 1)))
}

async fn parallel(ctx: WorkflowContext, n: u64) -> Result<u64, WorkflowError> {
    let (a, b, c) = futures::join!(
        ctx.activity::<_, u64>("double", &n),
        ctx.activity::<_, u64>("double", &(n + 1)),
        ctx.activity::<_, u64>("double", &(n + 2)),
    );
    Ok(a? + b? + c?)
}

/// Replays a history with the workflow of that name.
fn replay(name: &str, history: &[WorkflowEvent]) -> Result<Replayed, ReplayError> {
    match name {
        "saga_ok" | "saga_compensated" => replay_history(saga, history),
        "payment" => replay_history(payment, history),
        "sleepy_cancelled" => replay_history(sleepy, history),
        "racer" => replay_history(racer, history),
        "counter_first_run" => replay_history(counter, history),
        "parallel" => replay_history(parallel, history),
        other => panic!("no workflow for history {other:?}"),
    }
}

fn register(w: &Workflows) {
    w.register("saga", saga).unwrap();
    w.register("payment", payment).unwrap();
    w.register("sleepy", sleepy).unwrap();
    w.register("racer", racer).unwrap();
    w.register("counter", counter).unwrap();
    w.register("parallel", parallel).unwrap();
    for name in ["reserve", "release", "undo"] {
        w.register_activity(name, |_ctx, _: serde_json::Value| async move {
            Ok::<_, ActivityError>(())
        })
        .unwrap();
    }
    w.register_activity("charge", |ctx, o: Order| async move {
        if o.amount > 100 {
            return Err(ActivityError::permanent("declined"));
        }
        if ctx.attempt() < 2 {
            return Err(ActivityError::retryable("flaky"));
        }
        Ok(format!("receipt-{}", o.id))
    })
    .unwrap();
    w.register_activity("ship", |_ctx, _: String| async move {
        Ok::<_, ActivityError>(())
    })
    .unwrap();
    w.register_activity("slowish", |_ctx, x: u64| async move {
        Ok::<_, ActivityError>(x * 3)
    })
    .unwrap();
    w.register_activity("double", |_ctx, x: u64| async move {
        Ok::<_, ActivityError>(x * 2)
    })
    .unwrap();
}

/// Runs every recorded workflow to its end on the manual clock and returns the histories.
async fn record() -> Vec<(&'static str, Vec<WorkflowEvent>)> {
    let h = harness(register).await;
    h.start("saga", "ok", json!({"id": "o1", "amount": 5}))
        .await;
    h.start("saga", "bad", json!({"id": "o2", "amount": 500}))
        .await;
    h.start("payment", "pay", json!(null)).await;
    h.start("sleepy", "sleepy", json!(null)).await;
    h.start("racer", "racer", json!(null)).await;
    let first_counter = h.start("counter", "counter", json!(0)).await;
    h.start("parallel", "parallel", json!(1)).await;

    // saga ok: charge fails once, retried after 1 s; then a day's sleep.
    h.wait_status("bad", WorkflowStatus::Failed).await;
    h.wait_events("pay", "timer_started", 1).await;
    h.wait_events("sleepy", "timer_started", 1).await;
    h.wait_events("racer", "timer_started", 1).await;
    h.wait_events("counter", "timer_started", 1).await;
    h.wait_status("parallel", WorkflowStatus::Completed).await;
    h.workflows
        .signal("pay", "paid", json!("early"))
        .await
        .unwrap();
    h.wait_events("pay", "timer_started", 2).await;
    h.workflows.cancel("sleepy", None).await.unwrap();
    h.workflows.signal("racer", "go", json!(11)).await.unwrap();
    h.wait_events("racer", "activity_completed", 1).await;
    h.advance_until("ok", Duration::from_secs(1), WorkflowStatus::Running)
        .await;
    for _ in 0..5 {
        h.advance(Duration::from_secs(1)).await;
    }
    h.wait_events("ok", "timer_started", 1).await;
    h.advance(DAY).await;
    h.advance(MIN).await;
    h.advance(MIN).await;
    h.advance(30 * MIN).await;
    for id in ["ok", "pay", "racer", "counter"] {
        h.wait_status(id, WorkflowStatus::Completed).await;
    }
    h.wait_status("sleepy", WorkflowStatus::Cancelled).await;
    let history = |id: &'static str| {
        let h = &h;
        async move { h.history(id).await }
    };
    vec![
        ("saga_ok", history("ok").await),
        ("saga_compensated", history("bad").await),
        ("payment", history("pay").await),
        ("sleepy_cancelled", history("sleepy").await),
        ("racer", history("racer").await),
        (
            "counter_first_run",
            h.workflows.history(first_counter.run_id).await.unwrap(),
        ),
        ("parallel", history("parallel").await),
    ]
}

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/histories")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_histories_replay_to_the_same_commands() {
    let recorded = record().await;
    let update = std::env::var_os("SUNDIAL_UPDATE_HISTORIES").is_some();
    for (name, history) in &recorded {
        let r = replay(name, history).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(r.finished, "{name}: the run closed, so replay finishes");
        assert!(
            r.new_commands.is_empty(),
            "{name}: replay issued commands the history lacks: {:?}",
            r.new_commands
        );
        // Every prefix that ends just before a workflow task replays too, and the commands the
        // live part issues are exactly the ones that task recorded.
        for (i, e) in history.iter().enumerate() {
            if !matches!(e.event, Event::WorkflowTaskCompleted { .. }) {
                continue;
            }
            let recorded: Vec<&Event> = history[i + 1..]
                .iter()
                .map(|e| &e.event)
                .take_while(|e| is_command(e))
                .collect();
            let r = replay(name, &history[..i]).unwrap_or_else(|e| panic!("{name}@{i}: {e}"));
            let issued: Vec<&Event> = r.new_commands.iter().collect();
            assert_eq!(
                issued.len(),
                recorded.len(),
                "{name}@{i}: {issued:?} vs {recorded:?}"
            );
            for (a, b) in issued.iter().zip(&recorded) {
                assert_eq!(a.type_name(), b.type_name(), "{name}@{i}");
            }
        }
        // The JSON form round-trips and replays the same.
        let text = serde_json::to_string_pretty(history).unwrap();
        let back: Vec<WorkflowEvent> = serde_json::from_str(&text).unwrap();
        assert_eq!(&back, history);
        if update {
            std::fs::create_dir_all(fixtures()).unwrap();
            std::fs::write(fixtures().join(format!("{name}.json")), text + "\n").unwrap();
        }
    }
}

fn is_command(e: &Event) -> bool {
    !matches!(
        e,
        Event::WorkflowStarted { .. }
            | Event::WorkflowTaskCompleted { .. }
            | Event::ActivityCompleted { .. }
            | Event::ActivityFailed { .. }
            | Event::TimerFired { .. }
            | Event::SignalReceived { .. }
            | Event::CancelRequested { .. }
            | Event::ChildStarted { .. }
            | Event::ChildStartFailed { .. }
            | Event::ChildClosed { .. }
            | Event::WorkflowTerminated { .. }
    )
}

#[test]
fn stored_histories_replay() {
    let Ok(dir) = std::fs::read_dir(fixtures()) else {
        panic!("no stored histories in {}", fixtures().display());
    };
    let mut n = 0;
    for entry in dir {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_str().unwrap().to_string();
        let history: Vec<WorkflowEvent> =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let r = replay(&name, &history).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(r.finished && r.new_commands.is_empty(), "{name}: {r:?}");
        n += 1;
    }
    assert!(n >= 7, "expected the recorded histories, found {n}");
}

fn stored(name: &str) -> Vec<WorkflowEvent> {
    let text = std::fs::read_to_string(fixtures().join(format!("{name}.json"))).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn seq_of(history: &[WorkflowEvent], pred: impl Fn(&Event) -> bool) -> u64 {
    history.iter().find(|e| pred(&e.event)).unwrap().seq
}

#[track_caller]
fn assert_non_deterministic(r: Result<Replayed, ReplayError>, seq: u64, fragments: &[&str]) {
    match r {
        Err(ReplayError::NonDeterminism { seq: got, message }) => {
            assert_eq!(got, seq, "{message}");
            for f in fragments {
                assert!(message.contains(f), "{message:?} lacks {f:?}");
            }
        }
        other => panic!("expected non-determinism at event {seq}, got {other:?}"),
    }
}

#[test]
fn renamed_activity_is_reported_at_its_event() {
    async fn changed(ctx: WorkflowContext, order: Order) -> Result<String, WorkflowError> {
        let _: () = ctx.activity("reserve", &order).await?;
        let r: String = ctx.activity("charge_v2", &order).await?;
        Ok(r)
    }
    let h = stored("saga_ok");
    let seq = seq_of(
        &h,
        |e| matches!(e, Event::ActivityScheduled { name, .. } if name == "charge"),
    );
    assert_non_deterministic(
        replay_history(changed, &h),
        seq,
        &[
            "the history has activity \"charge\" (command 1)",
            "issued activity \"charge_v2\" (command 1)",
        ],
    );
}

#[test]
fn inserted_step_is_reported_where_it_diverges() {
    async fn changed(ctx: WorkflowContext, order: Order) -> Result<String, WorkflowError> {
        let _: () = ctx.activity("reserve", &order).await?;
        ctx.sleep(MIN).await?;
        let r: String = ctx.activity("charge", &order).await?;
        Ok(r)
    }
    let h = stored("saga_ok");
    let seq = seq_of(
        &h,
        |e| matches!(e, Event::ActivityScheduled { name, .. } if name == "charge"),
    );
    assert_non_deterministic(
        replay_history(changed, &h),
        seq,
        &[
            "the history has activity \"charge\"",
            "issued timer (command 1)",
        ],
    );
}

#[test]
fn removed_step_is_reported_where_it_diverges() {
    async fn changed(ctx: WorkflowContext, order: Order) -> Result<String, WorkflowError> {
        let _: () = ctx.activity("reserve", &order).await?;
        Ok("skipped the charge".into())
    }
    let h = stored("saga_ok");
    let seq = seq_of(
        &h,
        |e| matches!(e, Event::ActivityScheduled { name, .. } if name == "charge"),
    );
    assert_non_deterministic(
        replay_history(changed, &h),
        seq,
        &[
            "the history has activity \"charge\"",
            "issued workflow completion",
        ],
    );
}

#[test]
fn fewer_parallel_commands_are_reported() {
    async fn changed(ctx: WorkflowContext, n: u64) -> Result<u64, WorkflowError> {
        let (a, b) = futures::join!(
            ctx.activity::<_, u64>("double", &n),
            ctx.activity::<_, u64>("double", &(n + 1)),
        );
        Ok(a? + b?)
    }
    let h = stored("parallel");
    let seq = seq_of(&h, |e| matches!(e, Event::ActivityScheduled { cmd: 2, .. }));
    assert_non_deterministic(
        replay_history(changed, &h),
        seq,
        &["the history has activity \"double\" (command 2) but the workflow did not issue it"],
    );
}

#[test]
fn extra_parallel_command_is_reported() {
    async fn changed(ctx: WorkflowContext, n: u64) -> Result<u64, WorkflowError> {
        let (a, b, c, d) = futures::join!(
            ctx.activity::<_, u64>("double", &n),
            ctx.activity::<_, u64>("double", &(n + 1)),
            ctx.activity::<_, u64>("double", &(n + 2)),
            ctx.activity::<_, u64>("double", &(n + 3)),
        );
        Ok(a? + b? + c? + d?)
    }
    let h = stored("parallel");
    // The first workflow task recorded three activities; the fourth is where it diverges: at
    // the event that follows those three.
    let seq = seq_of(&h, |e| matches!(e, Event::ActivityScheduled { cmd: 2, .. })) + 1;
    assert_non_deterministic(
        replay_history(changed, &h),
        seq,
        &["issued activity \"double\" (command 3)", "fewer commands"],
    );
}

#[test]
fn changed_signal_handling_is_reported() {
    // Waiting without a timeout issues no timer where the history has one.
    async fn changed(ctx: WorkflowContext, _: ()) -> Result<String, WorkflowError> {
        let a: String = ctx.signal("paid").await?;
        let b: String = ctx.signal("paid").await?;
        Ok(format!("{a},{b}"))
    }
    let h = stored("payment");
    let seq = seq_of(&h, |e| matches!(e, Event::TimerStarted { .. }));
    assert_non_deterministic(
        replay_history(changed, &h),
        seq,
        &["the history has timer (command 0) but the workflow did not issue it"],
    );
}

#[test]
fn malformed_histories_are_refused() {
    let h = stored("saga_ok");
    assert!(matches!(
        replay_history(saga, &h[1..]),
        Err(ReplayError::BadHistory(_))
    ));
    let mut gap = h.clone();
    gap.remove(3);
    assert!(matches!(
        replay_history(saga, &gap),
        Err(ReplayError::BadHistory(_))
    ));
    assert!(matches!(
        replay_history(saga, &[]),
        Err(ReplayError::BadHistory(_))
    ));
}

#[test]
fn a_panicking_workflow_is_reported() {
    async fn boom(_ctx: WorkflowContext, _: Order) -> Result<String, WorkflowError> {
        panic!("bug in workflow code");
    }
    let h = stored("saga_ok");
    match replay_history(boom, &h) {
        Err(ReplayError::Panicked(m)) => assert!(m.contains("bug in workflow code")),
        other => panic!("expected a panic report, got {other:?}"),
    }
}

/// Several results arriving in one batch reach a `FuturesUnordered` in the same order on every
/// replay, so what the workflow does in reaction (here: the order of follow-up activities) is
/// replayed exactly.
#[test]
fn completion_order_inside_a_batch_is_replay_stable() {
    use futures::StreamExt;
    use futures::stream::FuturesUnordered;
    use sundial::{Backoff, TaskId, Timestamp};

    async fn fan_out(ctx: WorkflowContext, n: u32) -> Result<Vec<u32>, WorkflowError> {
        let mut pending: FuturesUnordered<_> =
            (0..n).map(|i| ctx.activity::<_, u32>("work", &i)).collect();
        let mut order = Vec::new();
        while let Some(r) = pending.next().await {
            let i = r?;
            let _: () = ctx.activity(&format!("after-{i}"), &i).await?;
            order.push(i);
        }
        Ok(order)
    }
    let n = 8u32;
    let ev = |seq: u64, event: Event| WorkflowEvent {
        seq,
        at: Timestamp(1_000 + seq as i64),
        event,
    };
    let mut history = vec![
        ev(
            0,
            Event::WorkflowStarted {
                workflow_type: "fan_out".into(),
                input: json!(n),
                continued_from: None,
                parent_workflow_id: None,
                seed: 1,
            },
        ),
        ev(
            1,
            Event::WorkflowTaskCompleted {
                continue_as_new_suggested: false,
            },
        ),
    ];
    for i in 0..n {
        history.push(ev(
            history.len() as u64,
            Event::ActivityScheduled {
                cmd: i,
                name: "work".into(),
                input: json!(i),
                task: TaskId::from_bytes([i as u8; 16]),
                max_attempts: 5,
                timeout_ms: 1_000,
                backoff: Backoff::default(),
                target: None,
            },
        ));
    }
    // All results arrive before the next workflow task, in a scrambled order.
    for i in [5u32, 2, 7, 0, 3, 6, 1, 4] {
        history.push(ev(
            history.len() as u64,
            Event::ActivityCompleted {
                cmd: i,
                result: json!(i),
            },
        ));
    }
    // The workflow task that saw them: record what the workflow does, as a workflow task would.
    let live = replay_history(fan_out, &history).unwrap();
    assert_eq!(live.new_commands.len(), 1, "{:?}", live.new_commands);
    history.push(ev(
        history.len() as u64,
        Event::WorkflowTaskCompleted {
            continue_as_new_suggested: false,
        },
    ));
    for c in live.new_commands {
        history.push(ev(history.len() as u64, c));
    }
    for _ in 0..50 {
        let r = replay_history(fan_out, &history).unwrap();
        assert_eq!(r.new_commands, Vec::<Event>::new());
    }
}

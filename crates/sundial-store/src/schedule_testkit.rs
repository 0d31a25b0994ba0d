//! The schedule store conformance suite (feature `testkit`): what every [`ScheduleStore`] must do.
//! Separate from [`crate::store_conformance!`] so that a backend adds schedules when it is ready.
//!
//! ```ignore
//! async fn fresh() -> (Arc<MyStore>, TempDir) { … }
//! sundial_store::schedule_store_conformance!(fresh);
//! ```
//!
//! The factory returns a [`Fixture`](crate::testkit::Fixture): `Arc<S>` or `(Arc<S>, guard)` where
//! `S` implements both [`Store`] and [`ScheduleStore`] (the fire operation writes task rows), or
//! an `Option` of either: `None` skips the check (for backends that need an outside service this
//! environment lacks; the factory says why).

use std::collections::HashSet;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use serde_json::json;
use sundial_core::schedule::{ScheduleDef, ScheduleId, ScheduleSpec, TaskTemplate};
use sundial_core::{ExecutionId, Limits, NewTask, TaskId, TaskSpec, TaskState, Timestamp};
use uuid::Uuid;

use crate::audit_scope::AuditWrite;
use crate::testkit::in_audit_scope;
use crate::{
    Arm, ArmChange, ClaimTarget, DueClaim, FireOp, FireOutcome, FireReason, FireResult, NewFire,
    NewSchedule, ScheduleError, ScheduleFilter, ScheduleStore, Store, TICK_KIND, TICK_QUEUE,
};

/// Expands to one `#[tokio::test(flavor = "multi_thread", worker_threads = 2)]` per schedule
/// conformance check, each with a fresh store from `factory` (an async fn or closure returning a
/// [`Fixture`](crate::testkit::Fixture); `None` skips the check).
#[macro_export]
macro_rules! schedule_store_conformance {
    (@checks ($factory:expr) $($check:ident)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let fixture = ($factory)().await;
                let Some(store) = $crate::testkit::Fixture::store(&fixture) else {
                    return;
                };
                $crate::schedule_testkit::$check(store.clone(), store.clone()).await;
                drop(fixture);
            }
        )*
    };
    ($factory:expr $(,)?) => {
        $crate::schedule_store_conformance!(@checks ($factory)
            schedule_create_get_list_round_trip
            schedule_search_finds_id_fragments_in_id_order
            schedule_search_selects_one_namespace
            schedule_fire_records_task_and_arms_next
            schedule_fire_completes_its_running_tick
            schedule_repeated_fire_is_a_no_op
            schedule_failed_fire_stores_nothing
            schedule_concurrent_fires_of_one_tick_commit_once
            schedule_pause_and_unpause_keep_a_note
            schedule_update_rearms_and_cancels_the_old_tick
            schedule_delete_cancels_tick_and_removes_fires
            schedule_fires_list_newest_first_and_count
            schedule_fire_many_applies_each_op_alone
            schedule_for_fire_reads_schedules_with_their_last_task
            schedule_stranded_lists_armed_schedules_whose_tick_is_not_live
            schedule_purge_fires_deletes_old_records_and_keeps_counters
            schedule_writes_carry_their_request_audit_record
        );
    };
}

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Drives all futures at once (the store's own threads do the work in parallel) and returns
/// their outputs in order.
async fn join_all<T>(futures: Vec<BoxFuture<'_, T>>) -> Vec<T> {
    let mut futures: Vec<Option<BoxFuture<'_, T>>> = futures.into_iter().map(Some).collect();
    let mut outputs: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    poll_fn(|cx| {
        let mut pending = false;
        for (slot, out) in futures.iter_mut().zip(outputs.iter_mut()) {
            if let Some(f) = slot {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => {
                        *out = Some(v);
                        *slot = None;
                    }
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs
        .into_iter()
        .map(|o| o.expect("every future completed"))
        .collect()
}

const SHARDS: u32 = 4;
/// 2023-11-14T22:13:20Z.
const T0: i64 = 1_700_000_000_000;
const MIN: i64 = 60_000;

fn at(ms: i64) -> Timestamp {
    Timestamp(T0 + ms)
}

fn fresh_id() -> TaskId {
    TaskId(Uuid::new_v4())
}

fn sid(s: &str) -> ScheduleId {
    ScheduleId::new(s).expect("valid schedule id")
}

fn def() -> ScheduleDef {
    ScheduleDef::new(
        ScheduleSpec::cron("* * * * *"),
        TaskTemplate::new("report").payload(json!({"to": "ops"})),
    )
}

fn tick(id: &ScheduleId, nominal: Timestamp) -> NewTask {
    TaskSpec::new(TICK_KIND)
        .queue(TICK_QUEUE)
        .payload(json!({"schedule": id.as_str(), "nominal": nominal.0}))
        .run_at(nominal)
        .validate(fresh_id(), at(0), SHARDS, &Limits::default())
        .expect("valid tick")
}

fn arm(id: &ScheduleId, nominal: Timestamp) -> Arm {
    Arm {
        nominal,
        tick: tick(id, nominal),
    }
}

fn fire_task(d: &ScheduleDef, id: &ScheduleId, nominal: Timestamp) -> NewTask {
    d.task_for(id, fresh_id(), nominal, nominal, SHARDS, &Limits::default())
        .expect("valid task")
}

async fn create(s: &dyn ScheduleStore, id: &ScheduleId, first: Option<Timestamp>) -> TaskId {
    let (sch, tick) = s
        .create_schedule(NewSchedule {
            id: id.clone(),
            def: def(),
            paused: false,
            note: None,
            arm: first.map(|n| arm(id, n)),
            now: at(0),
        })
        .await
        .expect("create");
    match (first, tick) {
        (Some(n), Some(t)) => {
            assert_eq!(sch.next_fire_at, Some(n));
            assert_eq!(sch.armed_tick, Some(t.id));
            t.id
        }
        (None, None) => TaskId::MIN,
        (f, t) => panic!("armed {f:?} but tick {t:?}"),
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

/// A filter of the id fragment and the pause state only (every namespace).
fn text(fragment: &str, paused: Option<bool>) -> ScheduleFilter {
    ScheduleFilter {
        id_contains: fragment.to_string(),
        paused,
        namespace: None,
    }
}

/// `search_schedules` keeps the schedules whose id contains the fragment (case-sensitive, any
/// position) and, when asked, those paused or not, in id order after
/// the cursor, a page at a time.
pub async fn schedule_search_finds_id_fragments_in_id_order(
    _tasks: Arc<dyn Store>,
    schedules: Arc<dyn ScheduleStore>,
) {
    let s = schedules.as_ref();
    let ids = [
        "nightly-a",
        "b-nightly",
        "c-NIGHTLY",
        "hourly",
        "nightly_z",
        "u.nightly",
        "zz",
    ];
    for (i, id) in ids.iter().enumerate() {
        s.create_schedule(NewSchedule {
            id: sid(id),
            def: def(),
            paused: i % 2 == 1,
            note: None,
            arm: None,
            now: at(0),
        })
        .await
        .expect("create");
    }
    let names = |p: &crate::SchedulePage| -> Vec<String> {
        p.schedules
            .iter()
            .map(|s| s.id.as_str().to_string())
            .collect()
    };
    let all = s
        .search_schedules(&text("nightly", None), None, 100)
        .await
        .expect("search");
    assert_eq!(
        names(&all),
        ["b-nightly", "nightly-a", "nightly_z", "u.nightly"]
    );
    assert_eq!(all.next_cursor, None);
    let first = s
        .search_schedules(&text("nightly", None), None, 2)
        .await
        .expect("search");
    assert_eq!(names(&first), ["b-nightly", "nightly-a"]);
    let cursor = first.next_cursor.clone().expect("more");
    let rest = s
        .search_schedules(&text("nightly", None), Some(&cursor), 2)
        .await
        .expect("search");
    assert_eq!(names(&rest), ["nightly_z", "u.nightly"]);
    assert_eq!(rest.next_cursor, None);
    // Paused: ids 1, 3, 5 of the list above.
    let paused = s
        .search_schedules(&text("", Some(true)), None, 100)
        .await
        .expect("search");
    assert_eq!(names(&paused), ["b-nightly", "hourly", "u.nightly"]);
    let running = s
        .search_schedules(&text("nightly", Some(false)), None, 100)
        .await
        .expect("search");
    assert_eq!(names(&running), ["nightly-a", "nightly_z"]);
    let dot = s
        .search_schedules(&text(".", None), None, 100)
        .await
        .expect("search");
    assert_eq!(names(&dot), ["u.nightly"]);
    // Wildcards of LIKE are plain characters here.
    let none = s
        .search_schedules(&text("%", None), None, 100)
        .await
        .expect("search");
    assert!(none.schedules.is_empty());
    let underscore = s
        .search_schedules(&text("_", None), None, 100)
        .await
        .expect("search");
    assert_eq!(names(&underscore), ["nightly_z"]);
}

/// `namespace` selects exactly one namespace's schedules by their stored ids (see
/// `sundial_core::namespace`): the default namespace's are those without the separator, and a
/// namespace whose name is another's prefix, or holds `_` (a LIKE wildcard), selects only its
/// own. The same id in two namespaces is two schedules. The fragment is looked for in the id as
/// its namespace knows it (a namespace's name is no match), and pages keep to the namespace.
pub async fn schedule_search_selects_one_namespace(
    _tasks: Arc<dyn Store>,
    schedules: Arc<dyn ScheduleStore>,
) {
    use sundial_core::namespace::{local, qualify};
    let s = schedules.as_ref();
    let mut by_ns: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
    for (i, (ns, id)) in [
        ("default", "acme"),
        ("default", "nightly"),
        ("default", "zz"),
        ("acme", "nightly"),
        ("acme", "hourly"),
        ("acme", "a-nightly"),
        ("acm", "nightly"),
        ("a_me", "nightly"),
        ("abme", "nightly"),
        ("acmea", "nightly"),
    ]
    .into_iter()
    .enumerate()
    {
        s.create_schedule(NewSchedule {
            id: sid(&qualify(ns, id)),
            def: def(),
            paused: i % 2 == 1,
            note: None,
            arm: None,
            now: at(0),
        })
        .await
        .expect("the same id in another namespace is another schedule");
        by_ns.entry(ns).or_default().push(id.to_string());
    }
    let in_ns = |ns: &str, fragment: &str, paused: Option<bool>| ScheduleFilter {
        id_contains: fragment.to_string(),
        paused,
        namespace: Some(ns.to_string()),
    };
    let locals = |p: &crate::SchedulePage, ns: &str| -> Vec<String> {
        p.schedules
            .iter()
            .map(|s| {
                assert!(
                    sundial_core::namespace::belongs(ns, s.id.as_str()),
                    "{ns}: {}",
                    s.id
                );
                local(s.id.as_str()).to_string()
            })
            .collect()
    };
    for (ns, mut want) in by_ns {
        want.sort();
        let f = in_ns(ns, "", None);
        let all = s.search_schedules(&f, None, 100).await.expect("search");
        assert_eq!(locals(&all, ns), want, "namespace {ns}");
        assert!(all.schedules.iter().all(|x| f.matches(x)));
        // A page at a time, the cursor a stored id of the namespace.
        let mut seen = Vec::new();
        let mut after = None;
        loop {
            let page = s
                .search_schedules(&f, after.as_ref(), 1)
                .await
                .expect("page");
            seen.extend(locals(&page, ns));
            match page.next_cursor {
                Some(c) => after = Some(c),
                None => break,
            }
        }
        assert_eq!(seen, want, "pages of {ns}");
    }
    // The fragment is looked for in the id as the namespace knows it.
    let acme = s
        .search_schedules(&in_ns("acme", "acme", None), None, 100)
        .await
        .expect("search");
    assert!(acme.schedules.is_empty(), "{:?}", acme.schedules);
    let nightly = s
        .search_schedules(&in_ns("acme", "nightly", None), None, 100)
        .await
        .expect("search");
    assert_eq!(locals(&nightly, "acme"), ["a-nightly", "nightly"]);
    // Paused: acme's entries 3 and 5 above (nightly and a-nightly).
    let paused = s
        .search_schedules(&in_ns("acme", "", Some(true)), None, 100)
        .await
        .expect("search");
    assert_eq!(locals(&paused, "acme"), ["a-nightly", "nightly"]);
    let default = s
        .search_schedules(&in_ns("default", "acme", None), None, 100)
        .await
        .expect("search");
    assert_eq!(locals(&default, "default"), ["acme"]);
    let none = s
        .search_schedules(&in_ns("nowhere", "", None), None, 100)
        .await
        .expect("search");
    assert!(none.schedules.is_empty());
    // A cursor past the namespace's ids ends its list.
    let past = s
        .search_schedules(&in_ns("acme", "", None), Some(&sid("zzz")), 100)
        .await
        .expect("search");
    assert!(past.schedules.is_empty());
}

/// Create, get and list: every field round-trips; ids are unique; pages have no gaps.
pub async fn schedule_create_get_list_round_trip(
    tasks: Arc<dyn Store>,
    schedules: Arc<dyn ScheduleStore>,
) {
    let s = schedules.as_ref();
    let a = sid("a");
    let t = create(s, &a, Some(at(MIN))).await;
    let tick = tasks.get(t).await.expect("get").expect("tick stored");
    assert_eq!(
        (tick.queue.as_str(), tick.kind.as_str()),
        (TICK_QUEUE, TICK_KIND)
    );
    assert_eq!(tick.due_at, at(MIN));
    let got = s.get_schedule(&a).await.expect("get").expect("exists");
    assert_eq!(got.def, def());
    assert!(!got.paused);
    assert_eq!(got.created_at, at(0));
    assert_eq!(got.counts.fired + got.counts.skipped + got.counts.missed, 0);
    assert_eq!(got.last_task, None);
    assert!(s.get_schedule(&sid("nope")).await.expect("get").is_none());

    let dup = s
        .create_schedule(NewSchedule {
            id: a.clone(),
            def: def(),
            paused: true,
            note: None,
            arm: None,
            now: at(1),
        })
        .await;
    assert!(matches!(dup, Err(ScheduleError::AlreadyExists)), "{dup:?}");

    let paused = s
        .create_schedule(NewSchedule {
            id: sid("b"),
            def: def(),
            paused: true,
            note: Some("created paused".into()),
            arm: None,
            now: at(0),
        })
        .await
        .expect("create paused")
        .0;
    assert!(paused.paused);
    assert_eq!(paused.note.as_deref(), Some("created paused"));
    assert_eq!(paused.next_fire_at, None);

    for i in 0..10 {
        create(s, &sid(&format!("c{i:02}")), None).await;
    }
    let mut seen = Vec::new();
    let mut after: Option<ScheduleId> = None;
    loop {
        let page = s.list_schedules(after.as_ref(), 5).await.expect("list");
        assert!(page.schedules.len() <= 5);
        seen.extend(page.schedules.iter().map(|s| s.id.to_string()));
        match page.next_cursor {
            Some(c) => after = Some(c),
            None => break,
        }
    }
    let mut want: Vec<String> = ["a", "b"].iter().map(|s| s.to_string()).collect();
    want.extend((0..10).map(|i| format!("c{i:02}")));
    assert_eq!(seen, want, "id order, no gaps, no duplicates");
}

/// One op records the fire, creates its task (with the fire key) and arms the next tick; the
/// schedule row follows (last task, counts, next fire).
pub async fn schedule_fire_records_task_and_arms_next(
    tasks: Arc<dyn Store>,
    schedules: Arc<dyn ScheduleStore>,
) {
    let s = schedules.as_ref();
    let id = sid("nightly");
    let t1 = create(s, &id, Some(at(MIN))).await;
    let d = def();
    let task = fire_task(&d, &id, at(MIN));
    let task_id = task.id;
    let next = arm(&id, at(2 * MIN));
    let next_tick = next.tick.id;
    let out = s
        .fire(FireOp {
            schedule_id: id.clone(),
            expect_armed: Some(t1),
            complete_tick: None,
            fires: vec![NewFire::fired(at(MIN), FireReason::Schedule, task)],
            arm: ArmChange::arm(next),
            now: at(MIN + 5),
        })
        .await
        .expect("fire");
    assert_eq!(out.fires.len(), 1);
    match &out.fires[0] {
        FireResult::Recorded { record, task } => {
            assert_eq!(record.nominal, at(MIN));
            assert_eq!(record.outcome, FireOutcome::Fired);
            assert_eq!(record.reason, FireReason::Schedule);
            assert_eq!(record.task_id, Some(task_id));
            assert_eq!(record.recorded_at, at(MIN + 5));
            let t = task.as_ref().expect("task created");
            assert_eq!(t.id, task_id);
            assert_eq!(
                t.key.as_deref(),
                Some(sundial_core::schedule::FireKey::format(&id, at(MIN)).as_str())
            );
            assert_eq!(t.payload, json!({"to": "ops"}));
        }
        other => panic!("expected a recorded fire, got {other:?}"),
    }
    assert_eq!(out.tick.as_ref().map(|t| t.id), Some(next_tick));
    assert_eq!(out.schedule.next_fire_at, Some(at(2 * MIN)));
    assert_eq!(out.schedule.armed_tick, Some(next_tick));
    assert_eq!(out.schedule.last_task, Some(task_id));
    assert_eq!(out.schedule.last_fire_at, Some(at(MIN)));
    assert_eq!(out.schedule.counts.fired, 1);
    assert_eq!(state(tasks.as_ref(), task_id).await, TaskState::Scheduled);
    assert_eq!(state(tasks.as_ref(), next_tick).await, TaskState::Scheduled);
    // The replaced tick was still scheduled (never claimed): it is cancelled, so it cannot fire.
    assert_eq!(state(tasks.as_ref(), t1).await, TaskState::Cancelled);
    let stored = s.get_schedule(&id).await.expect("get").expect("exists");
    assert_eq!(stored, out.schedule);
}

/// An op with `complete_tick` records its running tick's success in the fire's transaction (as
/// `complete` would: `succeeded`, finished at the op's time); a tick no longer running under that
/// execution is left as it is while the fire still applies; without `complete_tick` the tick is
/// not touched.
pub async fn schedule_fire_completes_its_running_tick(
    tasks: Arc<dyn Store>,
    schedules: Arc<dyn ScheduleStore>,
) {
    let s = schedules.as_ref();
    let run = |n: u128| ExecutionId(Uuid::from_u128(n));
    let claim = |tick: TaskId, n: u128| DueClaim {
        id: tick,
        target: ClaimTarget::Run {
            execution: run(n),
            lease_until: at(2 * MIN),
            worker: None,
        },
    };
    let d = def();
    for (name, complete, want_completed, want_state) in [
        ("same-run", Some(run(1)), true, TaskState::Succeeded),
        ("other-run", Some(run(2)), false, TaskState::Running),
        ("not-asked", None, false, TaskState::Running),
    ] {
        let id = sid(name);
        let t1 = create(s, &id, Some(at(MIN))).await;
        tasks
            .claim_due(vec![claim(t1, 1)], at(MIN), None)
            .await
            .expect("claim the tick");
        assert_eq!(state(tasks.as_ref(), t1).await, TaskState::Running);
        let next = arm(&id, at(2 * MIN));
        let out = s
            .fire(FireOp {
                schedule_id: id.clone(),
                expect_armed: Some(t1),
                complete_tick: complete,
                fires: vec![NewFire::fired(
                    at(MIN),
                    FireReason::Schedule,
                    fire_task(&d, &id, at(MIN)),
                )],
                arm: ArmChange::arm(next),
                now: at(MIN + 7),
            })
            .await
            .expect("fire");
        assert_eq!(out.tick_completed, want_completed, "{name}");
        assert!(
            matches!(out.fires[0], FireResult::Recorded { .. }),
            "{name}: the fire applies either way"
        );
        assert_eq!(out.schedule.counts.fired, 1, "{name}");
        let tick = tasks.get(t1).await.expect("get").expect("the tick");
        assert_eq!(tick.state, want_state, "{name}");
        if want_completed {
            assert_eq!(tick.finished_at, Some(at(MIN + 7)), "{name}");
            assert_eq!(tick.execution_id, Some(run(1)), "{name}");
        }
    }

    // The same through `fire_many`: each op's answer says whether its own tick was recorded.
    let mut ops = Vec::new();
    let mut ticks = Vec::new();
    for (i, name) in ["many-0", "many-1", "many-2"].into_iter().enumerate() {
        let id = sid(name);
        let t = create(s, &id, Some(at(MIN))).await;
        let n = 10 + i as u128;
        tasks
            .claim_due(vec![claim(t, n)], at(MIN), None)
            .await
            .expect("claim the tick");
        ops.push(FireOp {
            schedule_id: id.clone(),
            expect_armed: Some(t),
            // The middle op names another attempt: its tick stays running.
            complete_tick: Some(run(if i == 1 { 99 } else { n })),
            fires: vec![NewFire::fired(
                at(MIN),
                FireReason::Schedule,
                fire_task(&d, &id, at(MIN)),
            )],
            arm: ArmChange::arm(arm(&id, at(2 * MIN))),
            now: at(MIN + 9),
        });
        ticks.push(t);
    }
    let out = s.fire_many(ops).await;
    let completed: Vec<bool> = out
        .iter()
        .map(|r| r.as_ref().expect("applied").tick_completed)
        .collect();
    assert_eq!(completed, vec![true, false, true]);
    for (t, want) in ticks.into_iter().zip([
        TaskState::Succeeded,
        TaskState::Running,
        TaskState::Succeeded,
    ]) {
        assert_eq!(state(tasks.as_ref(), t).await, want);
    }
}

/// A tick that fires again after its op committed is refused (stale); the same nominal time
/// recorded again is a no-op that creates no second task.
pub async fn schedule_repeated_fire_is_a_no_op(
    tasks: Arc<dyn Store>,
    schedules: Arc<dyn ScheduleStore>,
) {
    let s = schedules.as_ref();
    let id = sid("once");
    let t1 = create(s, &id, Some(at(MIN))).await;
    let d = def();
    let op = |expect: Option<TaskId>, next: Option<Arm>| FireOp {
        schedule_id: id.clone(),
        expect_armed: expect,
        complete_tick: None,
        fires: vec![NewFire::fired(
            at(MIN),
            FireReason::Schedule,
            fire_task(&d, &id, at(MIN)),
        )],
        arm: next.map_or(ArmChange::Keep, ArmChange::arm),
        now: at(MIN),
    };
    let first = s
        .fire(op(Some(t1), Some(arm(&id, at(2 * MIN)))))
        .await
        .expect("first fire");
    let armed = first.schedule.armed_tick;
    match s.fire(op(Some(t1), Some(arm(&id, at(2 * MIN))))).await {
        Err(ScheduleError::StaleTick { armed: a }) => assert_eq!(a, armed),
        other => panic!("expected StaleTick, got {other:?}"),
    }
    let again = s.fire(op(None, None)).await.expect("repeat without a tick");
    assert!(
        matches!(&again.fires[0], FireResult::AlreadyRecorded(r) if r.nominal == at(MIN)),
        "{:?}",
        again.fires
    );
    assert_eq!(again.schedule.counts.fired, 1);
    assert_eq!(
        again.schedule.armed_tick, armed,
        "keep leaves the arming alone"
    );
    let page = s.list_fires(&id, None, 10).await.expect("fires");
    assert_eq!(page.fires.len(), 1);
    let live = tasks
        .list(
            &crate::TaskFilter {
                queue: Some("default".into()),
                ..Default::default()
            },
            10,
        )
        .await
        .expect("list");
    assert_eq!(live.tasks.len(), 1, "one task for one fire");
}

/// A fire op that fails part-way (here: its next tick reuses an existing task id) leaves no
/// trace: no fire record, no task, no counter, arming unchanged.
pub async fn schedule_failed_fire_stores_nothing(
    tasks: Arc<dyn Store>,
    schedules: Arc<dyn ScheduleStore>,
) {
    let s = schedules.as_ref();
    let id = sid("atomic");
    let t1 = create(s, &id, Some(at(MIN))).await;
    let d = def();
    let task = fire_task(&d, &id, at(MIN));
    let task_id = task.id;
    let mut bad = arm(&id, at(2 * MIN));
    bad.tick.id = t1; // collides with the armed tick's row
    let r = s
        .fire(FireOp {
            schedule_id: id.clone(),
            expect_armed: Some(t1),
            complete_tick: None,
            fires: vec![NewFire::fired(at(MIN), FireReason::Schedule, task)],
            arm: ArmChange::arm(bad),
            now: at(MIN),
        })
        .await;
    assert!(r.is_err(), "{r:?}");
    assert!(
        tasks.get(task_id).await.expect("get").is_none(),
        "task rolled back"
    );
    assert!(
        s.list_fires(&id, None, 10)
            .await
            .expect("fires")
            .fires
            .is_empty()
    );
    let sch = s.get_schedule(&id).await.expect("get").expect("exists");
    assert_eq!(sch.armed_tick, Some(t1));
    assert_eq!(sch.next_fire_at, Some(at(MIN)));
    assert_eq!(sch.counts.fired, 0);
    assert_eq!(state(tasks.as_ref(), t1).await, TaskState::Scheduled);
}

/// Many ops for the same armed tick at once: exactly one commits.
pub async fn schedule_concurrent_fires_of_one_tick_commit_once(
    tasks: Arc<dyn Store>,
    schedules: Arc<dyn ScheduleStore>,
) {
    let _ = tasks;
    let id = sid("race");
    let t1 = create(schedules.as_ref(), &id, Some(at(MIN))).await;
    let d = def();
    let mut handles = Vec::new();
    for _ in 0..8 {
        let s = schedules.clone();
        let op = FireOp {
            schedule_id: id.clone(),
            expect_armed: Some(t1),
            complete_tick: None,
            fires: vec![NewFire::fired(
                at(MIN),
                FireReason::Schedule,
                fire_task(&d, &id, at(MIN)),
            )],
            arm: ArmChange::arm(arm(&id, at(2 * MIN))),
            now: at(MIN),
        };
        let fut: BoxFuture<'static, _> = Box::pin(async move { s.fire(op).await });
        handles.push(fut);
    }
    let mut ok = 0;
    for r in join_all(handles).await {
        match r {
            Ok(_) => ok += 1,
            Err(ScheduleError::StaleTick { .. }) => {}
            Err(e) => panic!("unexpected error {e:?}"),
        }
    }
    assert_eq!(ok, 1);
    let sch = schedules
        .get_schedule(&id)
        .await
        .expect("get")
        .expect("exists");
    assert_eq!(sch.counts.fired, 1);
}

/// Pause and unpause keep the note and leave the arming alone; unknown ids are NotFound.
pub async fn schedule_pause_and_unpause_keep_a_note(
    tasks: Arc<dyn Store>,
    schedules: Arc<dyn ScheduleStore>,
) {
    let s = schedules.as_ref();
    let id = sid("p");
    let t1 = create(s, &id, Some(at(MIN))).await;
    let p = s
        .set_paused(&id, true, Some("maintenance".into()), at(10))
        .await
        .expect("pause");
    assert!(p.paused);
    assert_eq!(p.note.as_deref(), Some("maintenance"));
    assert_eq!(p.updated_at, at(10));
    assert_eq!(p.armed_tick, Some(t1));
    assert_eq!(state(tasks.as_ref(), t1).await, TaskState::Scheduled);
    let u = s
        .set_paused(&id, false, None, at(20))
        .await
        .expect("unpause");
    assert!(!u.paused);
    assert_eq!(u.note, None);
    let missing = s.set_paused(&sid("nope"), true, None, at(0)).await;
    assert!(
        matches!(missing, Err(ScheduleError::NotFound)),
        "{missing:?}"
    );
}

/// Updating the definition with a new arming cancels the old (scheduled) tick; disarming leaves
/// nothing armed.
pub async fn schedule_update_rearms_and_cancels_the_old_tick(
    tasks: Arc<dyn Store>,
    schedules: Arc<dyn ScheduleStore>,
) {
    let s = schedules.as_ref();
    let id = sid("u");
    let t1 = create(s, &id, Some(at(MIN))).await;
    let mut d = def();
    d.spec = ScheduleSpec::cron("*/5 * * * *");
    let next = arm(&id, at(5 * MIN));
    let t2 = next.tick.id;
    let (sch, tick) = s
        .update_schedule(&id, d.clone(), ArmChange::arm(next), at(30))
        .await
        .expect("update");
    assert_eq!(sch.def, d);
    assert_eq!(sch.armed_tick, Some(t2));
    assert_eq!(sch.next_fire_at, Some(at(5 * MIN)));
    assert_eq!(tick.map(|t| t.id), Some(t2));
    assert_eq!(state(tasks.as_ref(), t1).await, TaskState::Cancelled);
    let (sch, tick) = s
        .update_schedule(&id, d.clone(), ArmChange::Disarm, at(40))
        .await
        .expect("disarm");
    assert!(tick.is_none());
    assert_eq!((sch.armed_tick, sch.next_fire_at), (None, None));
    assert_eq!(state(tasks.as_ref(), t2).await, TaskState::Cancelled);
    let missing = s
        .update_schedule(&sid("nope"), d, ArmChange::Keep, at(0))
        .await;
    assert!(
        matches!(missing, Err(ScheduleError::NotFound)),
        "{missing:?}"
    );
}

/// Delete removes the schedule and its fire records and cancels its tick; the tasks its fires
/// created stay.
pub async fn schedule_delete_cancels_tick_and_removes_fires(
    tasks: Arc<dyn Store>,
    schedules: Arc<dyn ScheduleStore>,
) {
    let s = schedules.as_ref();
    let id = sid("d");
    let t1 = create(s, &id, Some(at(MIN))).await;
    let d = def();
    let task = fire_task(&d, &id, at(0));
    let task_id = task.id;
    s.fire(FireOp {
        schedule_id: id.clone(),
        expect_armed: None,
        complete_tick: None,
        fires: vec![NewFire::fired(at(0), FireReason::Trigger, task)],
        arm: ArmChange::Keep,
        now: at(0),
    })
    .await
    .expect("trigger");
    s.delete_schedule(&id, at(1)).await.expect("delete");
    assert!(s.get_schedule(&id).await.expect("get").is_none());
    assert!(
        s.list_fires(&id, None, 10)
            .await
            .expect("fires")
            .fires
            .is_empty()
    );
    assert_eq!(state(tasks.as_ref(), t1).await, TaskState::Cancelled);
    assert_eq!(state(tasks.as_ref(), task_id).await, TaskState::Scheduled);
    let again = s.delete_schedule(&id, at(2)).await;
    assert!(matches!(again, Err(ScheduleError::NotFound)), "{again:?}");
}

/// Fire records list newest first by nominal time, page without gaps, and the schedule's
/// counters add them up (a collapsed run of missed fires counts as many).
pub async fn schedule_fires_list_newest_first_and_count(
    tasks: Arc<dyn Store>,
    schedules: Arc<dyn ScheduleStore>,
) {
    let _ = tasks;
    let s = schedules.as_ref();
    let id = sid("f");
    create(s, &id, None).await;
    let other = sid("other");
    create(s, &other, None).await;
    let d = def();
    let mut fires = vec![NewFire::missed(at(0), 5, Some(at(4 * MIN)))];
    for i in 5..25 {
        let n = at(i * MIN);
        fires.push(match i % 3 {
            0 => NewFire::skipped(n, FireReason::Overlap),
            1 => NewFire::skipped(n, FireReason::Paused),
            _ => NewFire::fired(n, FireReason::Schedule, fire_task(&d, &id, n)),
        });
    }
    let applied = s
        .fire(FireOp {
            schedule_id: id.clone(),
            expect_armed: None,
            complete_tick: None,
            fires,
            arm: ArmChange::Keep,
            now: at(30 * MIN),
        })
        .await
        .expect("fire");
    s.fire(FireOp {
        schedule_id: other.clone(),
        expect_armed: None,
        complete_tick: None,
        fires: vec![NewFire::skipped(at(MIN), FireReason::Paused)],
        arm: ArmChange::Keep,
        now: at(0),
    })
    .await
    .expect("other fire");
    let c = applied.schedule.counts;
    let fired = (5..25).filter(|i| i % 3 == 2).count() as u64;
    assert_eq!(c.fired, fired);
    assert_eq!(c.skipped, 20 - fired);
    assert_eq!(c.missed, 5);
    assert_eq!(applied.schedule.last_fire_at, Some(at(24 * MIN)));

    let mut seen = Vec::new();
    let mut before = None;
    loop {
        let page = s.list_fires(&id, before, 7).await.expect("fires");
        assert!(page.fires.len() <= 7);
        for f in &page.fires {
            assert_eq!(f.schedule_id, id);
        }
        seen.extend(page.fires.iter().map(|f| f.nominal));
        match page.next_cursor {
            Some(c) => before = Some(c),
            None => break,
        }
    }
    let mut want: Vec<Timestamp> = (5..25).map(|i| at(i * MIN)).collect();
    want.push(at(0));
    want.sort_by(|a, b| b.cmp(a));
    assert_eq!(seen, want);
    let unique: HashSet<Timestamp> = seen.iter().copied().collect();
    assert_eq!(unique.len(), seen.len());
    let missed = s
        .list_fires(&id, Some(at(MIN)), 10)
        .await
        .expect("fires")
        .fires;
    assert_eq!(missed.len(), 1);
    assert_eq!(
        (
            missed[0].outcome,
            missed[0].reason,
            missed[0].count,
            missed[0].through
        ),
        (
            FireOutcome::Missed,
            FireReason::OutsideCatchupWindow,
            5,
            Some(at(4 * MIN))
        )
    );
}

/// `fire_many` applies each op as `fire` would, answers in op order, and one refused or failed
/// op leaves no trace while the others commit.
pub async fn schedule_fire_many_applies_each_op_alone(
    tasks: Arc<dyn Store>,
    schedules: Arc<dyn ScheduleStore>,
) {
    let s = schedules.as_ref();
    let d = def();
    // Ids out of order on purpose (a backend may sort them to lock in order).
    let ids = [sid("m-c"), sid("m-a"), sid("m-d"), sid("m-b")];
    let mut armed = Vec::new();
    for id in &ids {
        armed.push(create(s, id, Some(at(MIN))).await);
    }
    let op = |i: usize, expect: TaskId, next: Arm| FireOp {
        schedule_id: ids[i].clone(),
        expect_armed: Some(expect),
        complete_tick: None,
        fires: vec![NewFire::fired(
            at(MIN),
            FireReason::Schedule,
            fire_task(&d, &ids[i], at(MIN)),
        )],
        arm: ArmChange::arm(next),
        now: at(MIN),
    };
    let mut collide = arm(&ids[2], at(2 * MIN));
    collide.tick.id = armed[2]; // its next tick reuses the armed tick's id: fails part-way
    let failed_task = fire_task(&d, &ids[2], at(MIN));
    let failed_task_id = failed_task.id;
    let mut failing = op(2, armed[2], collide);
    failing.fires[0].task = Some(failed_task);
    let ops = vec![
        op(0, armed[0], arm(&ids[0], at(2 * MIN))),
        op(1, fresh_id(), arm(&ids[1], at(2 * MIN))), // stale: another tick is armed
        failing,
        op(3, armed[3], arm(&ids[3], at(2 * MIN))),
        FireOp {
            schedule_id: sid("m-missing"),
            expect_armed: None,
            complete_tick: None,
            fires: Vec::new(),
            arm: ArmChange::Keep,
            now: at(MIN),
        },
    ];
    let out = s.fire_many(ops).await;
    assert_eq!(out.len(), 5);
    for i in [0usize, 3] {
        let applied = out[i].as_ref().expect("op commits");
        assert_eq!(applied.schedule.id, ids[i]);
        assert_eq!(applied.schedule.counts.fired, 1);
        assert_eq!(applied.schedule.next_fire_at, Some(at(2 * MIN)));
        let tick = applied.tick.as_ref().expect("next tick armed");
        assert_eq!(applied.schedule.armed_tick, Some(tick.id));
        assert_eq!(state(tasks.as_ref(), tick.id).await, TaskState::Scheduled);
        match &applied.fires[0] {
            FireResult::Recorded {
                task: Some(task), ..
            } => assert_eq!(state(tasks.as_ref(), task.id).await, TaskState::Scheduled),
            other => panic!("expected a recorded fire with its task, got {other:?}"),
        }
        let stored = s.get_schedule(&ids[i]).await.expect("get").expect("exists");
        assert_eq!(&stored, &applied.schedule);
    }
    assert!(
        matches!(&out[1], Err(ScheduleError::StaleTick { armed: a }) if *a == Some(armed[1])),
        "{:?}",
        out[1]
    );
    assert!(out[2].is_err(), "{:?}", out[2]);
    assert!(
        matches!(&out[4], Err(ScheduleError::NotFound)),
        "{:?}",
        out[4]
    );
    for i in [1usize, 2] {
        let sch = s.get_schedule(&ids[i]).await.expect("get").expect("exists");
        assert_eq!(sch.armed_tick, Some(armed[i]), "arming unchanged");
        assert_eq!(sch.next_fire_at, Some(at(MIN)));
        assert_eq!(sch.counts.fired, 0);
        assert!(
            s.list_fires(&ids[i], None, 10)
                .await
                .expect("fires")
                .fires
                .is_empty()
        );
    }
    assert!(
        tasks.get(failed_task_id).await.expect("get").is_none(),
        "the failed op's task rolled back"
    );
    assert!(s.fire_many(Vec::new()).await.is_empty());

    // Refusals without a failure among them: the others commit all the same.
    let next0 = out[0]
        .as_ref()
        .expect("committed")
        .schedule
        .armed_tick
        .expect("armed");
    let ops = vec![
        FireOp {
            schedule_id: ids[1].clone(),
            expect_armed: Some(fresh_id()),
            complete_tick: None,
            fires: Vec::new(),
            arm: ArmChange::Disarm,
            now: at(2 * MIN),
        },
        FireOp {
            schedule_id: ids[0].clone(),
            expect_armed: Some(next0),
            complete_tick: None,
            fires: vec![NewFire::fired(
                at(2 * MIN),
                FireReason::Schedule,
                fire_task(&d, &ids[0], at(2 * MIN)),
            )],
            arm: ArmChange::arm(arm(&ids[0], at(3 * MIN))),
            now: at(2 * MIN),
        },
        FireOp {
            schedule_id: sid("m-missing"),
            expect_armed: None,
            complete_tick: None,
            fires: Vec::new(),
            arm: ArmChange::Keep,
            now: at(2 * MIN),
        },
    ];
    let out = s.fire_many(ops).await;
    assert!(
        matches!(&out[0], Err(ScheduleError::StaleTick { .. })),
        "{:?}",
        out[0]
    );
    assert!(
        matches!(&out[2], Err(ScheduleError::NotFound)),
        "{:?}",
        out[2]
    );
    let applied = out[1].as_ref().expect("commits beside the refusals");
    assert_eq!(applied.schedule.counts.fired, 2);
    assert_eq!(applied.schedule.next_fire_at, Some(at(3 * MIN)));
    let sch = s.get_schedule(&ids[1]).await.expect("get").expect("exists");
    assert_eq!(
        sch.armed_tick,
        Some(armed[1]),
        "the refused op changed nothing"
    );
}

/// `schedules_for_fire` returns the schedules that exist among the ids asked for, each with the
/// state of its previous fire's task.
pub async fn schedule_for_fire_reads_schedules_with_their_last_task(
    tasks: Arc<dyn Store>,
    schedules: Arc<dyn ScheduleStore>,
) {
    let s = schedules.as_ref();
    for id in ["g-1", "g-2", "g-3"] {
        create(s, &sid(id), Some(at(MIN))).await;
    }
    let d = def();
    let task = fire_task(&d, &sid("g-3"), at(0));
    let task_id = task.id;
    s.fire(FireOp {
        schedule_id: sid("g-3"),
        expect_armed: None,
        complete_tick: None,
        fires: vec![NewFire::fired(at(0), FireReason::Trigger, task)],
        arm: ArmChange::Keep,
        now: at(0),
    })
    .await
    .expect("trigger");
    tasks.cancel(task_id, at(1)).await.expect("cancel");
    let mut got = s
        .schedules_for_fire(&[sid("g-3"), sid("nope"), sid("g-1")])
        .await
        .expect("read");
    got.sort_by(|a, b| a.0.id.as_str().cmp(b.0.id.as_str()));
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(
        got[0].0,
        s.get_schedule(&sid("g-1"))
            .await
            .expect("get")
            .expect("exists")
    );
    assert_eq!(got[0].1, None, "no fire yet: no last task");
    assert_eq!(
        got[1].0,
        s.get_schedule(&sid("g-3"))
            .await
            .expect("get")
            .expect("exists")
    );
    assert_eq!(
        got[1].1,
        Some(crate::LastTask {
            id: task_id,
            state: TaskState::Cancelled,
            attempt: 0,
        })
    );
    assert!(s.schedules_for_fire(&[]).await.expect("none").is_empty());
}

/// A schedule is stranded when it is armed but its armed tick is no longer live (cancelled,
/// dead, finished, or gone); scheduled and running ticks and unarmed schedules are not.
pub async fn schedule_stranded_lists_armed_schedules_whose_tick_is_not_live(
    tasks: Arc<dyn Store>,
    schedules: Arc<dyn ScheduleStore>,
) {
    let s = schedules.as_ref();
    let scheduled = create(s, &sid("s-scheduled"), Some(at(MIN))).await;
    let _ = scheduled;
    create(s, &sid("s-unarmed"), None).await;
    let mut cancelled = Vec::new();
    for id in ["s-cancelled-1", "s-cancelled-2", "s-cancelled-3"] {
        let t = create(s, &sid(id), Some(at(MIN))).await;
        tasks.cancel(t, at(10)).await.expect("cancel the tick");
        cancelled.push(t);
    }
    let running = create(s, &sid("s-running"), Some(at(MIN))).await;
    let succeeded = create(s, &sid("s-succeeded"), Some(at(MIN))).await;
    let exec = |n: u128| ExecutionId(Uuid::from_u128(n));
    let claims = [(running, 1u128), (succeeded, 2)]
        .into_iter()
        .map(|(id, n)| DueClaim {
            id,
            target: ClaimTarget::Run {
                execution: exec(n),
                lease_until: at(2 * MIN),
                worker: None,
            },
        })
        .collect();
    tasks.claim_due(claims, at(MIN), None).await.expect("claim");
    assert_eq!(state(tasks.as_ref(), running).await, TaskState::Running);
    tasks
        .complete(succeeded, exec(2), at(MIN), None)
        .await
        .expect("complete");

    let mut seen = Vec::new();
    let mut after: Option<ScheduleId> = None;
    loop {
        let page = s
            .stranded_schedules(after.as_ref(), 2)
            .await
            .expect("stranded");
        assert!(page.schedules.len() <= 2);
        seen.extend(page.schedules.iter().map(|x| x.id.as_str().to_string()));
        match page.next_cursor {
            Some(c) => after = Some(c),
            None => break,
        }
    }
    assert_eq!(
        seen,
        [
            "s-cancelled-1",
            "s-cancelled-2",
            "s-cancelled-3",
            "s-succeeded"
        ]
    );
    let page = s.stranded_schedules(None, 10).await.expect("stranded");
    assert_eq!(page.schedules[0].armed_tick, Some(cancelled[0]));
    assert!(page.next_cursor.is_none());
}

/// `purge_fires` deletes at most `limit` fire records recorded before the cutoff (of any
/// schedule), leaves newer ones, and leaves the schedules' counters as they were.
pub async fn schedule_purge_fires_deletes_old_records_and_keeps_counters(
    tasks: Arc<dyn Store>,
    schedules: Arc<dyn ScheduleStore>,
) {
    let _ = tasks;
    let s = schedules.as_ref();
    let id = sid("retained");
    create(s, &id, None).await;
    let other = sid("retained-2");
    create(s, &other, None).await;
    for (sched, recorded, nominals) in [
        (&id, at(10 * MIN), 0..3),
        (&other, at(10 * MIN), 3..5),
        (&id, at(20 * MIN), 5..7),
    ] {
        s.fire(FireOp {
            schedule_id: sched.clone(),
            expect_armed: None,
            complete_tick: None,
            fires: nominals
                .map(|i| NewFire::skipped(at(i * MIN), FireReason::Paused))
                .collect(),
            arm: ArmChange::Keep,
            now: recorded,
        })
        .await
        .expect("fire");
    }
    let before = s
        .get_schedule(&id)
        .await
        .expect("get")
        .expect("exists")
        .counts;
    assert_eq!(s.purge_fires(at(10 * MIN), 100).await.expect("purge"), 0);
    assert_eq!(s.purge_fires(at(15 * MIN), 3).await.expect("purge"), 3);
    assert_eq!(s.purge_fires(at(15 * MIN), 100).await.expect("purge"), 2);
    assert_eq!(s.purge_fires(at(15 * MIN), 100).await.expect("purge"), 0);
    let left = s.list_fires(&id, None, 100).await.expect("list").fires;
    assert_eq!(
        left.iter().map(|f| f.nominal).collect::<Vec<_>>(),
        vec![at(6 * MIN), at(5 * MIN)]
    );
    assert!(
        s.list_fires(&other, None, 100)
            .await
            .expect("list")
            .fires
            .is_empty()
    );
    let after = s
        .get_schedule(&id)
        .await
        .expect("get")
        .expect("exists")
        .counts;
    assert_eq!(after, before, "counters are kept on the schedule");
}

/// Every schedule write a request makes (create, update, pause, manual trigger, delete) commits
/// the request's audit record with the write itself; a refused write leaves it pending for the
/// caller.
pub async fn schedule_writes_carry_their_request_audit_record(
    _tasks: Arc<dyn Store>,
    schedules: Arc<dyn ScheduleStore>,
) {
    let s = schedules.as_ref();
    let id = sid("audited");
    let written = |w: AuditWrite| matches!(w, AuditWrite::Written { .. });
    let (r, w) = in_audit_scope(
        "POST /v1/schedules",
        s.create_schedule(NewSchedule {
            id: id.clone(),
            def: def(),
            paused: false,
            note: None,
            arm: Some(arm(&id, at(MIN))),
            now: at(0),
        }),
    )
    .await;
    r.expect("create");
    assert!(written(w), "create: {w:?}");
    let (r, w) = in_audit_scope(
        "POST /v1/schedules",
        s.create_schedule(NewSchedule {
            id: id.clone(),
            def: def(),
            paused: false,
            note: None,
            arm: None,
            now: at(0),
        }),
    )
    .await;
    assert!(matches!(r, Err(ScheduleError::AlreadyExists)), "{r:?}");
    assert_eq!(w, AuditWrite::Pending, "a refused create writes no record");

    let (r, w) = in_audit_scope(
        "PUT /v1/schedules/{id}",
        s.update_schedule(&id, def(), ArmChange::Keep, at(1)),
    )
    .await;
    r.expect("update");
    assert!(written(w), "update: {w:?}");
    let (r, w) = in_audit_scope(
        "POST /v1/schedules/{id}/pause",
        s.set_paused(&id, true, None, at(2)),
    )
    .await;
    r.expect("pause");
    assert!(written(w), "pause: {w:?}");
    let (r, w) = in_audit_scope(
        "POST /v1/schedules/{id}/pause",
        s.set_paused(&sid("nope"), true, None, at(2)),
    )
    .await;
    assert!(matches!(r, Err(ScheduleError::NotFound)), "{r:?}");
    assert_eq!(w, AuditWrite::Pending);

    let trigger = || {
        let task = fire_task(&def(), &id, at(3));
        FireOp {
            schedule_id: id.clone(),
            expect_armed: None,
            complete_tick: None,
            fires: vec![NewFire::fired(at(3), FireReason::Trigger, task)],
            arm: ArmChange::Keep,
            now: at(3),
        }
    };
    let (r, w) = in_audit_scope("POST /v1/schedules/{id}/trigger", s.fire(trigger())).await;
    r.expect("trigger");
    assert!(written(w), "trigger: {w:?}");

    let (r, w) = in_audit_scope("DELETE /v1/schedules/{id}", s.delete_schedule(&id, at(4))).await;
    r.expect("delete");
    assert!(written(w), "delete: {w:?}");
}

//! The schedule store conformance suite against PostgreSQL, and what concurrency adds here: fires
//! of one tick from several nodes (separate stores, separate pools) commit once.
//!
//! The environment rules (`SUNDIAL_TEST_DATABASE_URL`, skipping, `SUNDIAL_REQUIRE_POSTGRES=1`) and
//! the fresh schemas are described in `common/mod.rs`.
#![allow(clippy::unwrap_used)] // test code: a panic is a failed test

use sundial_core::schedule::{ScheduleDef, ScheduleId, ScheduleSpec, TaskTemplate};
use sundial_core::{Limits, TaskId, TaskSpec, TaskState, Timestamp};
use sundial_store::{
    Arm, ArmChange, FireOp, FireReason, NewFire, NewSchedule, ScheduleError, ScheduleStore, Store,
    TICK_KIND, TICK_QUEUE,
};

mod common;

sundial_store::schedule_store_conformance!(common::fresh_postgres);

const SHARDS: u32 = 8;

fn tick(nominal: Timestamp) -> sundial_core::NewTask {
    TaskSpec::new(TICK_KIND)
        .queue(TICK_QUEUE)
        .run_at(nominal)
        .validate(
            TaskId(uuid::Uuid::new_v4()),
            Timestamp(0),
            SHARDS,
            &Limits::default(),
        )
        .unwrap()
}

/// Nodes racing to fire one armed tick, each through its own store: exactly one fire commits,
/// one task is created, and the tick armed afterwards is the winner's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fires_of_one_tick_from_several_nodes_commit_once() {
    let Some((first, guard)) = common::fresh_postgres().await else {
        return;
    };
    let mut nodes = vec![first];
    for _ in 0..3 {
        nodes.push(std::sync::Arc::new(
            common::connect(&guard.url, &guard.schema).await.unwrap(),
        ));
    }
    let id = ScheduleId::new("race").unwrap();
    let def = ScheduleDef::new(ScheduleSpec::cron("* * * * *"), TaskTemplate::new("report"));
    let t0 = Timestamp(1_700_000_040_000);
    let (_, armed) = nodes[0]
        .create_schedule(NewSchedule {
            id: id.clone(),
            def: def.clone(),
            paused: false,
            note: None,
            arm: Some(Arm {
                nominal: t0,
                tick: tick(t0),
            }),
            now: Timestamp(0),
        })
        .await
        .unwrap();
    let armed = armed.unwrap().id;
    let next = Timestamp(t0.0 + 60_000);
    let mut handles = Vec::new();
    for round in 0..4 {
        for node in &nodes {
            let node = node.clone();
            let (id, def) = (id.clone(), def.clone());
            handles.push(tokio::spawn(async move {
                let task = def
                    .task_for(
                        &id,
                        TaskId(uuid::Uuid::new_v4()),
                        t0,
                        t0,
                        SHARDS,
                        &Limits::default(),
                    )
                    .unwrap();
                let next_tick = tick(next);
                let next_id = next_tick.id;
                let r = node
                    .fire(FireOp {
                        schedule_id: id,
                        expect_armed: Some(armed),
                        complete_tick: None,
                        fires: vec![NewFire::fired(t0, FireReason::Schedule, task)],
                        arm: ArmChange::arm(Arm {
                            nominal: next,
                            tick: next_tick,
                        }),
                        now: Timestamp(t0.0 + round),
                    })
                    .await;
                (r, next_id)
            }));
        }
    }
    let mut winners = Vec::new();
    for h in handles {
        match h.await.unwrap() {
            (Ok(applied), next_id) => {
                assert_eq!(applied.schedule.armed_tick, Some(next_id));
                winners.push(next_id);
            }
            (Err(ScheduleError::StaleTick { .. }), _) => {}
            (Err(e), _) => panic!("unexpected error {e:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one fire commits");
    let sch = nodes[1].get_schedule(&id).await.unwrap().unwrap();
    assert_eq!(sch.counts.fired, 1);
    assert_eq!(sch.armed_tick, Some(winners[0]));
    assert_eq!(
        nodes[2].get(armed).await.unwrap().unwrap().state,
        TaskState::Cancelled,
        "the fired tick was still scheduled, so it was cancelled when replaced"
    );
    let fires = nodes[3].list_fires(&id, None, 10).await.unwrap().fires;
    assert_eq!(fires.len(), 1);
    let task = fires[0].task_id.unwrap();
    assert_eq!(
        nodes[0].get(task).await.unwrap().unwrap().state,
        TaskState::Scheduled
    );
    drop(nodes);
    drop(guard);
}

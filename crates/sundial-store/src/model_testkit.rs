//! A model-based test of any [`Store`]: random sequences of operations (create, cancel, trigger,
//! claim due, claim ready, heartbeat, complete, fail, lease expiry, clock advance) applied to the
//! store and to a small in-memory reference model side by side. After every step the two must
//! agree on every task (state, due time, attempt, execution id, lease, start and finish), on the
//! counts per state, on what each shard's due scan returns and on the next lease expiry; and no
//! execution id is ever handed out twice.
//!
//! Operations name tasks by index (taken modulo the tasks created so far), so every generated
//! sequence is valid whatever came before, and proptest shrinks a failing sequence by dropping
//! and simplifying operations like any vector. That is why this is plain proptest over a vector
//! of operations rather than a state-machine framework: no operation needs a precondition.
//!
//! Backends run it from their own tests with a fresh store per case: see [`run`] and
//! [`ops_strategy`].

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use proptest::prelude::*;
use sundial_core::{
    Backoff, ExecutionId, Limits, Task, TaskId, TaskSpec, TaskState, Timestamp, shard_for,
};
use uuid::Uuid;

use crate::{
    ClaimOutcome, ClaimTarget, DueClaim, Inserted, ReadyClaim, Retry, Store, TransitionError,
};

const SHARDS: u32 = 2;
const QUEUE: &str = "model";
const T0: i64 = 1_700_000_000_000;
const RETRY_MS: i64 = 1_000;

/// One step of a sequence.
#[derive(Debug, Clone)]
pub enum Op {
    /// A task due `due_in_ms` from now, keyed `k<key>` when `key` is given (a small set, so live
    /// keys collide).
    Create {
        key: Option<u8>,
        due_in_ms: u32,
        max_attempts: u8,
        timeout_ms: u32,
    },
    Cancel(u8),
    Trigger(u8),
    /// `claim_due` of one task, to run it (`run`) or to make it ready.
    ClaimDue {
        task: u8,
        run: bool,
    },
    /// `claim_ready` of up to `n` tasks.
    ClaimReady(u8),
    /// With the task's current execution id, or (`stale`) a fresh one.
    Heartbeat {
        task: u8,
        stale: bool,
    },
    Complete {
        task: u8,
        stale: bool,
    },
    /// `retry`: back to scheduled `RETRY_MS` later while attempts remain; else dead.
    Fail {
        task: u8,
        stale: bool,
        retry: bool,
    },
    ExpireLeases,
    Advance(u32),
}

/// Sequences of up to `max_len` operations, weighted towards the ones that move tasks along.
pub fn ops_strategy(max_len: usize) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        4 => (
            proptest::option::of(0u8..4),
            prop_oneof![Just(0u32), 0u32..3_000],
            1u8..4,
            500u32..3_000
        )
            .prop_map(
            |(key, due_in_ms, max_attempts, timeout_ms)| Op::Create {
                key,
                due_in_ms,
                max_attempts,
                timeout_ms,
            }
        ),
        1 => any::<u8>().prop_map(Op::Cancel),
        1 => any::<u8>().prop_map(Op::Trigger),
        3 => (any::<u8>(), any::<bool>()).prop_map(|(task, run)| Op::ClaimDue { task, run }),
        2 => (1u8..4).prop_map(Op::ClaimReady),
        1 => (any::<u8>(), proptest::bool::weighted(0.2))
            .prop_map(|(task, stale)| Op::Heartbeat { task, stale }),
        2 => (any::<u8>(), proptest::bool::weighted(0.2))
            .prop_map(|(task, stale)| Op::Complete { task, stale }),
        2 => (any::<u8>(), proptest::bool::weighted(0.2), any::<bool>())
            .prop_map(|(task, stale, retry)| Op::Fail { task, stale, retry }),
        1 => Just(Op::ExpireLeases),
        3 => (0u32..4_000).prop_map(Op::Advance),
    ];
    proptest::collection::vec(op, 1..max_len)
}

/// What the model holds of a task: the fields the store must agree on.
#[derive(Debug, Clone, PartialEq)]
struct ModelTask {
    id: TaskId,
    shard: u32,
    key: Option<String>,
    state: TaskState,
    due_at: i64,
    attempt: u32,
    max_attempts: u32,
    timeout_ms: u64,
    execution_id: Option<ExecutionId>,
    lease: Option<i64>,
    started_at: Option<i64>,
    finished_at: Option<i64>,
    has_error: bool,
}

impl ModelTask {
    fn live(&self) -> bool {
        matches!(
            self.state,
            TaskState::Scheduled | TaskState::Ready | TaskState::Running
        )
    }

    fn view(t: &Task) -> ModelTask {
        ModelTask {
            id: t.id,
            shard: t.shard,
            key: t.key.clone(),
            state: t.state,
            due_at: t.due_at.0,
            attempt: t.attempt,
            max_attempts: t.max_attempts,
            timeout_ms: t.timeout_ms,
            execution_id: t.execution_id,
            lease: t.lease_expires_at.map(|l| l.0),
            started_at: t.started_at.map(|s| s.0),
            finished_at: t.finished_at.map(|f| f.0),
            has_error: t.last_error.is_some(),
        }
    }
}

/// How many operations of each kind changed something (the rest were refusals the model also
/// predicted), for a run's summary.
#[derive(Debug, Default, Clone)]
pub struct Applied(pub BTreeMap<&'static str, usize>);

impl Applied {
    fn note(&mut self, what: &'static str) {
        *self.0.entry(what).or_default() += 1;
    }
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &Applied) {
        for (k, v) in &other.0 {
            *self.0.entry(k).or_default() += v;
        }
    }
}

impl std::fmt::Display for Applied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
        write!(f, "{}", parts.join(" "))
    }
}

#[derive(Default)]
struct Model {
    applied: Applied,
    now: i64,
    /// In creation order.
    order: Vec<TaskId>,
    tasks: BTreeMap<TaskId, ModelTask>,
    executions: HashSet<ExecutionId>,
}

fn fresh_execution() -> ExecutionId {
    ExecutionId(Uuid::new_v4())
}

impl Model {
    fn pick(&self, i: u8) -> Option<TaskId> {
        (!self.order.is_empty()).then(|| self.order[i as usize % self.order.len()])
    }

    /// Mostly a task in `state` (so that the operation has something to act on), sometimes
    /// (`i` odd past 200) any task, for the refusals.
    fn pick_in(&self, i: u8, state: TaskState) -> Option<TaskId> {
        let matching: Vec<TaskId> = self
            .order
            .iter()
            .copied()
            .filter(|id| self.tasks[id].state == state)
            .collect();
        if matching.is_empty() || (i > 200 && i % 2 == 1) {
            self.pick(i)
        } else {
            Some(matching[i as usize % matching.len()])
        }
    }

    fn task(&self, id: TaskId) -> &ModelTask {
        &self.tasks[&id]
    }

    fn task_mut(&mut self, id: TaskId) -> &mut ModelTask {
        self.tasks.get_mut(&id).expect("a model task")
    }

    /// Refusal of an attempt call with `execution` on `id`, or `None` when it applies.
    fn attempt_refusal(&self, id: TaskId, execution: ExecutionId) -> Option<TaskState> {
        let t = self.task(id);
        (t.state != TaskState::Running || t.execution_id != Some(execution)).then_some(t.state)
    }

    /// Records a newly handed-out execution id; an id seen before is an error.
    fn hand_out(&mut self, e: ExecutionId) -> Result<(), String> {
        if self.executions.insert(e) {
            Ok(())
        } else {
            Err(format!("execution id {} handed out twice", e.0))
        }
    }
}

fn refused_state(e: &TransitionError) -> Option<TaskState> {
    match e {
        TransitionError::WrongState { state } | TransitionError::StaleExecution { state } => {
            Some(*state)
        }
        _ => None,
    }
}

/// Runs `ops` against `store` (fresh and empty) and the model; the first disagreement, as a
/// readable message, or what was applied.
pub async fn run(store: &dyn Store, ops: &[Op]) -> Result<Applied, String> {
    let mut m = Model {
        now: T0,
        ..Model::default()
    };
    for (step, op) in ops.iter().enumerate() {
        apply(store, &mut m, op)
            .await
            .map_err(|e| format!("step {step} {op:?}: {e}"))?;
        compare(store, &m)
            .await
            .map_err(|e| format!("after step {step} {op:?}: {e}"))?;
    }
    Ok(m.applied)
}

async fn apply(store: &dyn Store, m: &mut Model, op: &Op) -> Result<(), String> {
    let now = Timestamp(m.now);
    let store_err = |e: &dyn std::fmt::Display| format!("store error: {e}");
    match op {
        Op::Create {
            key,
            due_in_ms,
            max_attempts,
            timeout_ms,
        } => {
            let mut spec = TaskSpec::new("k")
                .queue(QUEUE)
                .run_at(Timestamp(m.now + i64::from(*due_in_ms)))
                .max_attempts(u32::from(*max_attempts))
                .timeout(Duration::from_millis(u64::from(*timeout_ms)))
                .backoff(Backoff::fixed(Duration::from_millis(RETRY_MS as u64)));
            if let Some(k) = key {
                spec = spec.key(format!("k{k}"));
            }
            let id = TaskId(Uuid::now_v7());
            let new = spec
                .validate(id, now, SHARDS, &Limits::default())
                .map_err(|e| format!("invalid spec: {e}"))?;
            let holder = new.key.as_ref().and_then(|k| {
                m.tasks
                    .values()
                    .find(|t| t.live() && t.key.as_ref() == Some(k))
                    .map(|t| t.id)
            });
            let got = store
                .insert(vec![new.clone()])
                .await
                .map_err(|e| store_err(&e))?;
            match (got.as_slice(), holder) {
                ([Inserted::Duplicate { existing }], Some(h)) if *existing == h => {
                    m.applied.note("duplicate");
                }
                ([Inserted::Created(t)], None) => {
                    let expected = ModelTask {
                        id,
                        shard: shard_for(QUEUE, new.key.as_deref(), &id, SHARDS),
                        key: new.key.clone(),
                        state: TaskState::Scheduled,
                        due_at: new.due_at.0,
                        attempt: 0,
                        max_attempts: new.max_attempts,
                        timeout_ms: new.timeout_ms,
                        execution_id: None,
                        lease: None,
                        started_at: None,
                        finished_at: None,
                        has_error: false,
                    };
                    if ModelTask::view(t) != expected {
                        return Err(format!("created {t:?}, model {expected:?}"));
                    }
                    m.order.push(id);
                    m.tasks.insert(id, expected);
                    m.applied.note("create");
                }
                (other, holder) => {
                    return Err(format!("insert gave {other:?}, model holder {holder:?}"));
                }
            }
        }
        Op::Cancel(i) => {
            let Some(id) = m.pick(*i) else { return Ok(()) };
            let got = store.cancel(id, now).await;
            if m.task(id).live() {
                let t = got.map_err(|e| format!("cancel refused: {e}"))?;
                m.applied.note("cancel");
                let mt = m.task_mut(id);
                mt.state = TaskState::Cancelled;
                mt.lease = None;
                mt.finished_at = Some(now.0);
                check_row(&t, mt)?;
            } else {
                expect_refusal(got, m.task(id).state)?;
            }
        }
        Op::Trigger(i) => {
            let Some(id) = m.pick(*i) else { return Ok(()) };
            let got = store.trigger(id, now).await;
            if m.task(id).state == TaskState::Scheduled {
                let t = got.map_err(|e| format!("trigger refused: {e}"))?;
                m.applied.note("trigger");
                let mt = m.task_mut(id);
                mt.due_at = mt.due_at.min(now.0);
                check_row(&t, mt)?;
            } else {
                expect_refusal(got, m.task(id).state)?;
            }
        }
        Op::ClaimDue { task, run } => {
            let Some(id) = m.pick_in(*task, TaskState::Scheduled) else {
                return Ok(());
            };
            let execution = fresh_execution();
            let lease_until = Timestamp(now.0 + m.task(id).timeout_ms as i64);
            let target = if *run {
                ClaimTarget::Run {
                    execution,
                    lease_until,
                    worker: None,
                }
            } else {
                ClaimTarget::Ready
            };
            let got = store
                .claim_due(vec![DueClaim { id, target }], now, None)
                .await
                .map_err(|e| store_err(&e))?;
            let claimable = {
                let t = m.task(id);
                t.state == TaskState::Scheduled && t.due_at <= now.0
            };
            match (got.as_slice(), claimable, run) {
                ([ClaimOutcome::Started(t)], true, true) => {
                    m.hand_out(execution)?;
                    m.applied.note("claim_due_run");
                    let mt = m.task_mut(id);
                    mt.state = TaskState::Running;
                    mt.attempt += 1;
                    mt.execution_id = Some(execution);
                    mt.lease = Some(lease_until.0);
                    mt.started_at = Some(now.0);
                    check_row(t, mt)?;
                }
                ([ClaimOutcome::Readied(t)], true, false) => {
                    m.applied.note("claim_due_ready");
                    let mt = m.task_mut(id);
                    mt.state = TaskState::Ready;
                    check_row(t, mt)?;
                }
                ([ClaimOutcome::NotClaimable], false, _) => {}
                (other, claimable, _) => {
                    return Err(format!(
                        "claim_due gave {other:?}, model claimable {claimable}"
                    ));
                }
            }
        }
        Op::ClaimReady(n) => {
            let executions: Vec<ExecutionId> = (0..*n).map(|_| fresh_execution()).collect();
            let got = store
                .claim_ready(ReadyClaim {
                    queue: QUEUE.to_string(),
                    kinds: None,
                    execution_ids: executions.clone(),
                    worker: Some("w".into()),
                    now,
                })
                .await
                .map_err(|e| store_err(&e))?
                .tasks;
            // By rank (the model's tasks all have the default priority: the due time), then id.
            let mut ready: Vec<(i64, TaskId)> = m
                .tasks
                .values()
                .filter(|t| t.state == TaskState::Ready)
                .map(|t| (t.due_at, t.id))
                .collect();
            ready.sort();
            let mut expected: Vec<TaskId> = ready
                .into_iter()
                .map(|(_, id)| id)
                .take(usize::from(*n))
                .collect();
            expected.sort();
            let mut got_ids: Vec<TaskId> = got.iter().map(|t| t.id).collect();
            got_ids.sort();
            if got_ids != expected {
                return Err(format!(
                    "claim_ready took {got_ids:?}, model (earliest due first) {expected:?}"
                ));
            }
            for t in &got {
                let e = t
                    .execution_id
                    .ok_or_else(|| format!("claimed {} without an execution id", t.id))?;
                if !executions.contains(&e) {
                    return Err(format!("claimed {} with an execution id not given", t.id));
                }
                m.hand_out(e)?;
                m.applied.note("claim_ready");
                let mt = m.task_mut(t.id);
                let start = now.0.max(mt.due_at);
                mt.state = TaskState::Running;
                mt.attempt += 1;
                mt.execution_id = Some(e);
                mt.lease = Some(start + mt.timeout_ms as i64);
                mt.started_at = Some(start);
                check_row(t, mt)?;
            }
        }
        Op::Heartbeat { task, stale } => {
            let Some(id) = m.pick_in(*task, TaskState::Running) else {
                return Ok(());
            };
            let execution = attempt_execution(m, id, *stale);
            let until = Timestamp(now.0 + m.task(id).timeout_ms as i64);
            let got = store.heartbeat(id, execution, now).await;
            match m.attempt_refusal(id, execution) {
                None => {
                    let t = got.map_err(|e| format!("heartbeat refused: {e}"))?;
                    m.applied.note("heartbeat");
                    let mt = m.task_mut(id);
                    mt.lease = mt.lease.map(|l| l.max(until.0));
                    check_row(&t, mt)?;
                }
                Some(state) => expect_refusal(got, state)?,
            }
        }
        Op::Complete { task, stale } => {
            let Some(id) = m.pick_in(*task, TaskState::Running) else {
                return Ok(());
            };
            let execution = attempt_execution(m, id, *stale);
            let got = store
                .complete(id, execution, now, Some("{\"ok\":true}".into()))
                .await;
            match m.attempt_refusal(id, execution) {
                None => {
                    let t = got.map_err(|e| format!("complete refused: {e}"))?;
                    m.applied.note("complete");
                    let mt = m.task_mut(id);
                    mt.state = TaskState::Succeeded;
                    mt.lease = None;
                    mt.finished_at = Some(now.0);
                    check_row(&t, mt)?;
                }
                Some(state) => expect_refusal(got, state)?,
            }
        }
        Op::Fail { task, stale, retry } => {
            let Some(id) = m.pick_in(*task, TaskState::Running) else {
                return Ok(());
            };
            let execution = attempt_execution(m, id, *stale);
            let (request, retry_at) = if *retry {
                // Again while attempts remain (the store decides from the row).
                let t = m.task(id);
                let at = Timestamp(now.0 + RETRY_MS);
                (Retry::At(at), (t.attempt < t.max_attempts).then_some(at))
            } else {
                (Retry::Never, None)
            };
            let got = store.fail(id, execution, now, "boom".into(), request).await;
            match m.attempt_refusal(id, execution) {
                None => {
                    let t = got.map_err(|e| format!("fail refused: {e}"))?;
                    m.applied.note(if retry_at.is_some() {
                        "fail_retry"
                    } else {
                        "fail_dead"
                    });
                    let mt = m.task_mut(id);
                    mt.lease = None;
                    mt.has_error = true;
                    match retry_at {
                        Some(at) => {
                            mt.state = TaskState::Scheduled;
                            mt.due_at = at.0;
                        }
                        None => {
                            mt.state = TaskState::Dead;
                            mt.finished_at = Some(now.0);
                        }
                    }
                    check_row(&t, mt)?;
                }
                Some(state) => expect_refusal(got, state)?,
            }
        }
        Op::ExpireLeases => {
            let got = store
                .expire_leases(now, 1_000, None)
                .await
                .map_err(|e| store_err(&e))?;
            let expected: Vec<TaskId> = m
                .tasks
                .values()
                .filter(|t| t.state == TaskState::Running && t.lease.is_some_and(|l| l < now.0))
                .map(|t| t.id)
                .collect();
            let mut got_ids: Vec<TaskId> = got.iter().map(|t| t.id).collect();
            got_ids.sort();
            if got_ids != expected {
                return Err(format!(
                    "expire_leases changed {got_ids:?}, model {expected:?}"
                ));
            }
            for t in &got {
                m.applied.note("lease_expired");
                let mt = m.task_mut(t.id);
                mt.lease = None;
                mt.has_error = true;
                if mt.attempt < mt.max_attempts {
                    mt.state = TaskState::Scheduled;
                    mt.due_at = now.0;
                } else {
                    mt.state = TaskState::Dead;
                    mt.finished_at = Some(now.0);
                }
                check_row(t, mt)?;
            }
        }
        Op::Advance(ms) => m.now += i64::from(*ms),
    }
    Ok(())
}

/// The execution id an attempt call presents: the task's current one, or a fresh (stale) one.
fn attempt_execution(m: &Model, id: TaskId, stale: bool) -> ExecutionId {
    match (stale, m.task(id).execution_id) {
        (false, Some(e)) => e,
        _ => fresh_execution(),
    }
}

fn expect_refusal(got: Result<Task, TransitionError>, state: TaskState) -> Result<(), String> {
    match got {
        Err(e) if refused_state(&e) == Some(state) => Ok(()),
        Err(e) => Err(format!("refused with {e}, model state {state}")),
        Ok(t) => Err(format!(
            "applied ({:?}), model refuses (state {state})",
            t.state
        )),
    }
}

fn check_row(t: &Task, model: &ModelTask) -> Result<(), String> {
    let got = ModelTask::view(t);
    if &got == model {
        Ok(())
    } else {
        Err(format!("store row {got:?}\n  model {model:?}"))
    }
}

async fn compare(store: &dyn Store, m: &Model) -> Result<(), String> {
    for (id, mt) in &m.tasks {
        let t = store
            .get(*id)
            .await
            .map_err(|e| format!("get: {e}"))?
            .ok_or_else(|| format!("task {id} missing from the store"))?;
        check_row(&t, mt)?;
    }
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for c in store
        .count_by_state()
        .await
        .map_err(|e| format!("count_by_state: {e}"))?
    {
        if c.count > 0 {
            *counts
                .entry(format!("{}/{}", c.queue, c.state))
                .or_default() += c.count;
        }
    }
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    for t in m.tasks.values() {
        *expected.entry(format!("{QUEUE}/{}", t.state)).or_default() += 1;
    }
    if counts != expected {
        return Err(format!("counts {counts:?}, model {expected:?}"));
    }
    for shard in 0..SHARDS {
        let got: Vec<(i64, TaskId)> = store
            .scan_due(shard, None, Timestamp(m.now), 1_000)
            .await
            .map_err(|e| format!("scan_due: {e}"))?
            .iter()
            .map(|e| (e.key.due_at.0, e.key.id))
            .collect();
        let mut want: Vec<(i64, TaskId)> = m
            .tasks
            .values()
            .filter(|t| t.shard == shard && t.state == TaskState::Scheduled && t.due_at <= m.now)
            .map(|t| (t.due_at, t.id))
            .collect();
        want.sort();
        if got != want {
            return Err(format!("scan_due({shard}) {got:?}, model {want:?}"));
        }
    }
    let lease = store
        .next_lease_expiry(None)
        .await
        .map_err(|e| format!("next_lease_expiry: {e}"))?
        .map(|t| t.0);
    let want = m
        .tasks
        .values()
        .filter(|t| t.state == TaskState::Running)
        .filter_map(|t| t.lease)
        .min();
    if lease != want {
        return Err(format!("next_lease_expiry {lease:?}, model {want:?}"));
    }
    Ok(())
}

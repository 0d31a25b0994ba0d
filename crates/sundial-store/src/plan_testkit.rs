//! Every filter combination `list` offers (feature `testkit`), and tasks to plan them against:
//! each backend's `tests/list_plans.rs` asks its database how it would answer each combination
//! and checks that an index serves it (no scan of all tasks).

use sundial_core::{ExecutionId, Limits, NewTask, TaskId, TaskSpec, TaskState, Timestamp};
use uuid::Uuid;

use crate::{ClaimOutcome, ClaimTarget, DueClaim, Retry, Store, TaskFilter};

/// Queues, kinds and tag values the fixture tasks spread over.
const QUEUES: usize = 40;
const KINDS: usize = 40;
const TAG_VALUES: usize = 50;
/// Milliseconds between the fixture tasks' creation (and due) times.
const STEP_MS: i64 = 1_000;

/// `n` tasks spread over queues, kinds, keys, tags, due and creation times, so that each
/// value the combinations ask for selects a small part of them. Cancel those of
/// [`plan_fixture_cancelled`] after inserting them (the combinations' state is `cancelled`).
pub fn plan_fixture_tasks(n: usize, shards: u32) -> Vec<NewTask> {
    (0..n)
        .map(|i| {
            let at = Timestamp(i as i64 * STEP_MS);
            TaskSpec::new(format!("kind-{}", i % KINDS))
                .queue(format!("queue-{}", (i / 7) % QUEUES))
                .key(format!("key-{i:08}"))
                .tag("env", format!("e{}", i % TAG_VALUES))
                .tag("team", format!("t{}", (i / 3) % TAG_VALUES))
                .run_at(Timestamp(at.0 + (i % 97) as i64 * STEP_MS))
                // Ids grow with creation, as UUIDv7 ids do.
                .validate(
                    TaskId(Uuid::from_u128(((i as u128) + 1) << 64)),
                    at,
                    shards,
                    &Limits::default(),
                )
                .unwrap_or_else(|e| panic!("fixture task {i}: {e}"))
        })
        .collect()
}

/// Which of [`plan_fixture_tasks`] to cancel: one in twenty.
pub fn plan_fixture_cancelled(tasks: &[NewTask]) -> Vec<TaskId> {
    tasks.iter().step_by(20).map(|t| t.id).collect()
}

/// Error groups the dead fixture tasks spread over (in every queue).
const ERROR_GROUPS: usize = 10;

/// Which of [`plan_fixture_tasks`] die, and with which error: one in twenty (none of those
/// [`plan_fixture_cancelled`] cancels), over [`ERROR_GROUPS`] first lines, each error with a
/// trace of its own below.
pub fn plan_fixture_dead(tasks: &[NewTask]) -> Vec<(TaskId, String)> {
    tasks
        .iter()
        .enumerate()
        .skip(10)
        .step_by(20)
        .map(|(i, t)| {
            (
                t.id,
                format!("error-{}\n  at trace line {i}", (i / 20) % ERROR_GROUPS),
            )
        })
        .collect()
}

/// Starts and fails (without a retry) the tasks of [`plan_fixture_dead`] in `store`, so they
/// are dead with their errors.
pub async fn plan_fixture_kill(store: &dyn Store, dead: &[(TaskId, String)]) {
    // Past every fixture task's due time.
    let now = Timestamp(1_000_000_000);
    for chunk in dead.chunks(500) {
        let claims: Vec<(DueClaim, ExecutionId)> = chunk
            .iter()
            .map(|(id, _)| {
                let exec = crate::testkit::execution_id();
                let claim = DueClaim {
                    id: *id,
                    target: ClaimTarget::Run {
                        execution: exec,
                        lease_until: Timestamp(now.0 + 60_000),
                        worker: None,
                    },
                };
                (claim, exec)
            })
            .collect();
        let outcomes = store
            .claim_due(claims.iter().map(|(c, _)| c.clone()).collect(), now, None)
            .await
            .expect("claim_due");
        for (((_, exec), (id, error)), outcome) in claims.iter().zip(chunk).zip(outcomes) {
            assert!(
                matches!(outcome, ClaimOutcome::Started(_)),
                "fixture task {id}: {outcome:?}"
            );
            store
                .fail(*id, *exec, now, error.clone(), Retry::Never)
                .await
                .expect("fail");
        }
    }
}

/// One combination: its name (the filters it sets) and the filter.
pub struct Combination {
    pub name: String,
    pub filter: TaskFilter,
    /// Whether it sets any filter beyond the cursor and the internal queues' exclusion.
    pub selective: bool,
}

impl Combination {
    /// Whether it is one dead-letter group and nothing else (a cursor aside): queue, state dead
    /// and error group, which the index `tasks_dead_error` must serve.
    pub fn is_dead_letter_group(&self) -> bool {
        let f = &self.filter;
        f.queue.is_some()
            && f.state == Some(TaskState::Dead)
            && f.error_group.is_some()
            && TaskFilter {
                queue: None,
                state: None,
                error_group: None,
                before: None,
                ..f.clone()
            } == TaskFilter::default()
    }
}

/// Every combination of the filters `GET /v1/tasks` offers (queue, kind, state, key,
/// key prefix, none/one/two tags, due and creation ranges each open below, above or both,
/// with and without a cursor), with values that select a few of [`plan_fixture_tasks`]`(n)`.
/// Without a queue the internal queues are left out, as the API does by default.
///
/// Then the error group filter, always with state `dead` (the dead letters; alone it narrows
/// what another filter's index selects, and is not indexed by itself): with and without a
/// queue (with one, a dead-letter group), kind, key prefix, cursor, tags and a due range.
pub fn list_filter_combinations(n: usize) -> Vec<Combination> {
    let (n, step) = (n as i64, STEP_MS);
    let mid = n / 2 * step;
    // Each bound selects a few dozen tasks: the newest (after), the oldest (before), or a
    // window in the middle (both).
    let ranges = || {
        [
            ("", None, None),
            ("_after", Some(Timestamp((n - 30) * step)), None),
            ("_before", Some(Timestamp(30 * step)), None),
            (
                "_range",
                Some(Timestamp(mid)),
                Some(Timestamp(mid + 20 * step)),
            ),
        ]
    };
    let mut out = Vec::new();
    for bits in 0u32..(1 << 6) {
        for tags in 0..3 {
            for (due_name, due_a, due_b) in ranges() {
                for (cr_name, cr_a, cr_b) in ranges() {
                    let on = |b: u32| bits & (1 << b) != 0;
                    let mut f = TaskFilter::default();
                    let mut name = Vec::new();
                    if on(0) {
                        f.queue = Some("queue-3".into());
                        name.push("queue".to_string());
                    }
                    if on(1) {
                        f.kind = Some("kind-5".into());
                        name.push("kind".into());
                    }
                    if on(2) {
                        f.state = Some(TaskState::Cancelled);
                        name.push("state".into());
                    }
                    if on(3) {
                        f.key = Some("key-00000123".into());
                        name.push("key".into());
                    }
                    if on(4) {
                        f.key_prefix = Some("key-0000012".into());
                        name.push("key_prefix".into());
                    }
                    if on(5) {
                        f.before = Some(TaskId(Uuid::max()));
                        name.push("cursor".into());
                    }
                    let tag_pairs = [("env", "e7"), ("team", "t3")];
                    for (k, v) in tag_pairs.iter().take(tags) {
                        f.tags.push((k.to_string(), v.to_string()));
                    }
                    if tags > 0 {
                        name.push(format!("tags{tags}"));
                    }
                    // Due ranges: `_before` means only an upper bound.
                    match due_name {
                        "_after" => f.due_after = due_a,
                        "_before" => f.due_before = due_b.or(due_a),
                        "_range" => {
                            f.due_after = due_a;
                            f.due_before = due_b;
                        }
                        _ => {}
                    }
                    if !due_name.is_empty() {
                        name.push(format!("due{due_name}"));
                    }
                    match cr_name {
                        "_after" => f.created_after = cr_a,
                        "_before" => f.created_before = cr_b.or(cr_a),
                        "_range" => {
                            f.created_after = cr_a;
                            f.created_before = cr_b;
                        }
                        _ => {}
                    }
                    if !cr_name.is_empty() {
                        name.push(format!("created{cr_name}"));
                    }
                    f.exclude_internal = f.queue.is_none();
                    let selective = f.queue.is_some()
                        || f.kind.is_some()
                        || f.state.is_some()
                        || f.key.is_some()
                        || f.key_prefix.is_some()
                        || !f.tags.is_empty()
                        || f.due_after.is_some()
                        || f.due_before.is_some()
                        || f.created_after.is_some()
                        || f.created_before.is_some();
                    out.push(Combination {
                        name: if name.is_empty() {
                            "none".into()
                        } else {
                            name.join("+")
                        },
                        filter: f,
                        selective,
                    });
                }
            }
        }
    }
    for bits in 0u32..(1 << 4) {
        for tags in 0..2 {
            for (due_name, due_a, due_b) in ranges() {
                let on = |b: u32| bits & (1 << b) != 0;
                let mut f = TaskFilter {
                    state: Some(TaskState::Dead),
                    error_group: Some("error-3".into()),
                    ..TaskFilter::default()
                };
                let mut name = vec!["state".to_string(), "error_group".to_string()];
                if on(0) {
                    f.queue = Some("queue-3".into());
                    name.push("queue".into());
                }
                if on(1) {
                    f.kind = Some("kind-5".into());
                    name.push("kind".into());
                }
                if on(2) {
                    f.key_prefix = Some("key-0000012".into());
                    name.push("key_prefix".into());
                }
                if on(3) {
                    f.before = Some(TaskId(Uuid::max()));
                    name.push("cursor".into());
                }
                if tags > 0 {
                    f.tags.push(("env".into(), "e10".into()));
                    name.push("tags1".into());
                }
                match due_name {
                    "_after" => f.due_after = due_a,
                    "_before" => f.due_before = due_b.or(due_a),
                    "_range" => {
                        f.due_after = due_a;
                        f.due_before = due_b;
                    }
                    _ => {}
                }
                if !due_name.is_empty() {
                    name.push(format!("due{due_name}"));
                }
                f.exclude_internal = f.queue.is_none();
                out.push(Combination {
                    name: name.join("+"),
                    filter: f,
                    selective: true,
                });
            }
        }
    }
    out
}

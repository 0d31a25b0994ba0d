//! Calls waiting to share one transaction, in lanes (see `claimer.rs` and `inserter.rs`).
//!
//! A call is queued in its lane; the call that finds fewer than [`IN_FLIGHT`] group tasks
//! running for the lane starts one, which takes the lane's calls group by group until it finds
//! the lane empty (the last one to find it so drops the lane). A group holds calls in arrival
//! order up to a total weight (tasks wanted or carried), and always at least one call, however
//! heavy. One group in flight per lane: two (a call arriving while a group waits for its commit
//! starting at once) made smaller groups and cost the database more CPU than it saved in waiting
//! (drain 941–1,046/s against 1,062–1,181/s, BENCHMARKS.md).
//!
//! With one group in flight, callers that each wait for their answer before calling again fall
//! into cohorts that take turns: while one cohort's group commits, the other's calls queue and
//! form the next group, so each call waits for a whole group before its own. A lane whose calls
//! gather ([`GroupCall::GATHER`]) therefore waits, after a group, until as many calls wait as
//! that group had (its callers coming back) or the gather time has passed, and takes them as one
//! group. Only after a group of more than one call: a lone caller or a trickle never waits.
//! Callers that do not wait for each other (an open stream) pay up to the gather time per call
//! when their groups hold several.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sundial_store::StoreError;
use sundial_store::audit_scope::PendingAudit;
use tokio::sync::{Notify, oneshot};

use crate::PostgresStore;

pub(crate) struct Lanes<K, C> {
    lanes: Mutex<HashMap<K, Lane<C>>>,
    /// Groups taken so far (each one transaction), for tests.
    groups: AtomicU64,
    /// Signalled when a call is queued, for a group task that gathers (see the module doc).
    arrived: Notify,
}

/// Most group tasks running at once per lane.
pub(crate) const IN_FLIGHT: usize = 1;

/// The gather time of the inserts' and the polls' claims' lanes ([`GroupCall::GATHER`]): longer
/// than an HTTP request's way back to its caller and out again on this machine kind (about
/// 0.3 ms), short beside a group's own transaction.
pub(crate) const CALLERS_BACK: Duration = Duration::from_millis(1);

struct Lane<C> {
    calls: VecDeque<C>,
    /// Group tasks running for the lane (each takes calls until it finds none).
    running: usize,
}

impl<K, C> Default for Lanes<K, C> {
    fn default() -> Self {
        Self {
            lanes: Mutex::new(HashMap::new()),
            groups: AtomicU64::new(0),
            arrived: Notify::new(),
        }
    }
}

impl<K: Hash + Eq, C> Lanes<K, C> {
    /// Queues `call` in `key`'s lane; returns whether the caller must start a group task for
    /// the lane.
    pub fn push(&self, key: K, call: C) -> bool {
        let mut lanes = match self.lanes.lock() {
            Ok(l) => l,
            Err(p) => p.into_inner(),
        };
        let lane = lanes.entry(key).or_insert_with(|| Lane {
            calls: VecDeque::new(),
            running: 0,
        });
        lane.calls.push_back(call);
        let start = lane.running < IN_FLIGHT;
        if start {
            lane.running += 1;
        }
        drop(lanes);
        self.arrived.notify_waiters();
        start
    }

    /// Calls waiting in `key`'s lane.
    fn waiting(&self, key: &K) -> usize {
        let lanes = match self.lanes.lock() {
            Ok(l) => l,
            Err(p) => p.into_inner(),
        };
        lanes.get(key).map_or(0, |l| l.calls.len())
    }

    /// Waits until at least `calls` calls wait in `key`'s lane, or for `most` at the longest.
    async fn gather(&self, key: &K, calls: usize, most: Duration) {
        // A pause, not a due decision: the tokio timer, not the engine's clock.
        let time_up = tokio::time::sleep(most);
        tokio::pin!(time_up);
        loop {
            let arrived = self.arrived.notified();
            tokio::pin!(arrived);
            // Registered before the count is read: a call queued after the read wakes it.
            arrived.as_mut().enable();
            if self.waiting(key) >= calls {
                return;
            }
            tokio::select! {
                _ = &mut time_up => return,
                _ = arrived => {}
            }
        }
    }

    /// The lane's next group (calls up to `max_weight` in all, by `weight`), or `None` (the
    /// calling group task ends; the last one drops the lane) when no call waits.
    pub fn take(&self, key: &K, max_weight: usize, weight: impl Fn(&C) -> usize) -> Option<Vec<C>> {
        let mut lanes = match self.lanes.lock() {
            Ok(l) => l,
            Err(p) => p.into_inner(),
        };
        let lane = lanes.get_mut(key)?;
        let mut group = Vec::new();
        let mut total = 0usize;
        while let Some(next) = lane.calls.front() {
            let w = weight(next);
            if !group.is_empty() && total + w > max_weight {
                break;
            }
            total += w;
            group.extend(lane.calls.pop_front());
        }
        if group.is_empty() {
            lane.running = lane.running.saturating_sub(1);
            if lane.running == 0 {
                lanes.remove(key);
            }
            return None;
        }
        self.groups.fetch_add(1, Ordering::Relaxed);
        Some(group)
    }

    /// Groups taken so far.
    #[cfg(test)]
    pub fn groups(&self) -> u64 {
        self.groups.load(Ordering::Relaxed)
    }
}

/// A call that the groups of its lane run together (`claimer.rs`, `inserter.rs`).
pub(crate) trait GroupCall: Send + Sized + 'static {
    /// What each call is answered with.
    type Answer: Send + 'static;

    /// What a group is, for log lines and for `StoreError::NoAnswer`.
    const WORK: &'static str;

    /// How long, after a group, the lane's task waits for as many calls as that group had
    /// (see the module doc); zero takes what waits at once.
    const GATHER: Duration = Duration::ZERO;

    /// Runs `group` in one transaction and answers each call; on failure nothing is answered
    /// and the calls come back with the error.
    fn run(
        store: &PostgresStore,
        group: Vec<Self>,
    ) -> impl Future<Output = Result<(), (StoreError, Vec<Self>)>> + Send;

    /// Where the call's answer goes.
    fn into_reply(self) -> oneshot::Sender<Result<Self::Answer, StoreError>>;
}

/// Queues the call `make` builds around its reply channel in `key`'s lane, starts the lane's
/// group task when none runs (a task of its own, so a caller that gives up waiting cancels
/// nothing), and waits for the answer.
pub(crate) async fn submit<K, C>(
    store: &PostgresStore,
    lanes: &Arc<Lanes<K, C>>,
    key: K,
    make: impl FnOnce(oneshot::Sender<Result<C::Answer, StoreError>>) -> C,
    max_weight: usize,
    weight: fn(&C) -> usize,
) -> Result<C::Answer, StoreError>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: GroupCall,
{
    let (reply, rx) = oneshot::channel();
    if lanes.push(key.clone(), make(reply)) {
        tokio::spawn(run_lane(
            store.clone(),
            lanes.clone(),
            key,
            max_weight,
            weight,
        ));
    }
    match rx.await {
        Ok(r) => r,
        // The group task ended without answering (its runtime shut down): whether the group
        // committed is unknown, exactly as for a connection lost mid-statement.
        Err(_) => Err(StoreError::NoAnswer { what: C::WORK }),
    }
}

/// The group task of `key`'s lane: runs groups until it finds the lane empty. A lone call runs
/// alone; the calls of a failed group run again one by one, each in a task of its own, so one
/// call's error is never another's.
async fn run_lane<K: Hash + Eq + Sync, C: GroupCall>(
    store: PostgresStore,
    lanes: Arc<Lanes<K, C>>,
    key: K,
    max_weight: usize,
    weight: fn(&C) -> usize,
) {
    let mut last = 0;
    loop {
        // After a group of one (a trickle, or a lone caller) the next call starts at once.
        if !C::GATHER.is_zero() && last > 1 {
            lanes.gather(&key, last, C::GATHER).await;
        }
        let Some(group) = lanes.take(&key, max_weight, weight) else {
            break;
        };
        last = group.len();
        if group.len() == 1 {
            for call in group {
                run_alone(&store, call).await;
            }
            continue;
        }
        if let Err((e, group)) = C::run(&store, group).await {
            tracing::debug!(error = %e, n = group.len(), work = C::WORK, "group failed; one by one");
            for call in group {
                let store = store.clone();
                tokio::spawn(async move { run_alone(&store, call).await });
            }
        }
    }
}

/// One call as a group of its own; its error is its own.
async fn run_alone<C: GroupCall>(store: &PostgresStore, call: C) {
    if let Err((e, mut group)) = C::run(store, vec![call]).await
        && let Some(call) = group.pop()
    {
        let _ = call.into_reply().send(Err(e));
    }
}

/// Writes in `tx` the audit records of a group's calls (`(call index, record)`, for the calls that
/// changed something): the sequence number of each by call index, to mark them written
/// (`PendingAudit::written`) once the transaction has committed.
pub(crate) async fn insert_group_audits(
    store: &PostgresStore,
    tx: &deadpool_postgres::Transaction<'_>,
    audits: Vec<(usize, &PendingAudit)>,
) -> Result<HashMap<usize, i64>, StoreError> {
    if audits.is_empty() {
        return Ok(HashMap::new());
    }
    let records: Vec<&sundial_store::NewAuditRecord> =
        audits.iter().map(|(_, a)| a.record()).collect();
    let seqs = store.insert_audits_in(tx, &records).await?;
    Ok(audits.into_iter().map(|(i, _)| i).zip(seqs).collect())
}

/// Pairs the calls whose audit records one statement inserted (in the order it inserted them)
/// with the `seq`s it returned, sorted (so in that same order). The statement has committed, so
/// its changes stand whatever this finds: should the counts differ, nothing is paired (the
/// records stay pending and their requests write them on their own) and the mismatch is logged.
pub(crate) fn pair_audit_seqs<K>(work: &str, audited: Vec<K>, seqs: Vec<i64>) -> Vec<(K, i64)> {
    if audited.len() == seqs.len() {
        return audited.into_iter().zip(seqs).collect();
    }
    tracing::error!(
        work,
        audited = audited.len(),
        stored = seqs.len(),
        "a group statement stored another number of audit records than it had calls to record"
    );
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_gather_ends_when_enough_calls_wait_or_its_time_is_up() {
        let lanes: Arc<Lanes<(), u32>> = Arc::default();
        let most = Duration::from_secs(1);
        assert!(lanes.push((), 1), "the first call starts the lane's task");
        assert!(!lanes.push((), 2), "one task in flight");
        tokio::time::timeout(Duration::from_micros(1), lanes.gather(&(), 2, most))
            .await
            .expect("two calls wait: at once");
        let pushing = lanes.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(3)).await;
            pushing.push((), 3);
        });
        tokio::time::timeout(Duration::from_millis(10), lanes.gather(&(), 3, most))
            .await
            .expect("ends when the third call comes");
        assert!(
            tokio::time::timeout(most - Duration::from_millis(1), lanes.gather(&(), 4, most))
                .await
                .is_err(),
            "waits its time for a fourth call"
        );
        tokio::time::timeout(most + Duration::from_millis(1), lanes.gather(&(), 4, most))
            .await
            .expect("ends when its time is up");
        let group = lanes.take(&(), 10, |_| 1).expect("a group");
        assert_eq!(group, vec![1, 2, 3]);
    }
}

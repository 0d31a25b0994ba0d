//! Hand-off: a queue's long-polls that found nothing wait here, and a shard loop that finds a due
//! task of that queue claims it straight to `running` for the first of them (the store's
//! `claim_due` with a `Run` target naming the poll's worker, inside the poll's audit scope), then
//! hands the started task over. One durable write delivers the task, where readying it and the
//! poll's claim took two. A task due within `Config::hand_off_lead` may be started ahead for a
//! waiting poll (recorded as started at its due time); the poll answers at that time, after
//! reading the task again (`Engine::at_their_start` in `poll`) unless the store's out-of-band
//! mark tells that nothing could have ended it since the claim.
//!
//! Owns: the waiting polls of one queue and the tasks started for a poll that had gone by the time
//! they were handed (`unclaimed`: the next poll of the queue takes them first, while their lease
//! lasts; past it the reaper offers them again, as any running task whose worker went away).
//!
//! Must never: decide whether a start is allowed (the store's claim does, conditionally), or lose
//! a started task: a hand that fails keeps the task for the next poll.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};

use sundial_core::{Task, Timestamp};
use sundial_store::OutOfBandMark;
use sundial_store::audit_scope::AuditScope;
use tokio::sync::oneshot;

/// A task started for a poll, with the time of the claim that started it. One started ahead of
/// its due time (`started_at` after `claimed_at`) is read again before a poll answers with it,
/// however late the poll gets it, so that a cancel that returned before its start is honoured;
/// unless the store's out-of-band mark, read before the claim was asked for, has not moved.
#[derive(Debug)]
pub(crate) struct Started {
    pub(crate) task: Task,
    pub(crate) claimed_at: Timestamp,
    /// The store's out-of-band mark before the claim (`None`: the store cannot tell).
    pub(crate) mark: Option<OutOfBandMark>,
}

impl Started {
    /// Whether the claim recorded a start later than itself.
    pub(crate) fn ahead(&self) -> bool {
        self.task.started_at.is_some_and(|at| at > self.claimed_at)
    }

    /// Whether no write that could end the task has committed since before its claim, by the
    /// store's mark `now` (so it is still started under its execution without reading it).
    pub(crate) fn unchanged_since_claim(&self, now: Option<OutOfBandMark>) -> bool {
        OutOfBandMark::unmoved(self.mark, now)
    }
}

/// Above this many waiting entries, registering drops the entries of polls that are gone.
const PRUNE_AT: usize = 64;

/// The waiting polls of one queue (those that take any of its kinds), first come first served.
#[derive(Default)]
pub(crate) struct Waiters {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    waiting: VecDeque<Waiter>,
    /// Started for a poll that was gone when handed; taken by the next poll.
    unclaimed: VecDeque<Started>,
}

/// One waiting poll, as a shard loop takes it.
pub(crate) struct Waiter {
    id: u64,
    /// The name the poll gave, recorded on the tasks started for it.
    pub(crate) worker: Option<String>,
    /// How many tasks the poll takes.
    pub(crate) max: usize,
    /// The poll request's audit scope: the claim made for it commits its record.
    pub(crate) scope: Option<AuditScope>,
    tx: oneshot::Sender<Vec<Started>>,
}

impl Waiter {
    /// Hands `tasks` to the poll; gives them back when the poll is gone.
    pub(crate) fn hand(self, tasks: Vec<Started>) -> Result<(), Vec<Started>> {
        self.tx.send(tasks)
    }
}

/// A poll's place among the waiters; [`Waiters::withdraw`] ends it.
pub(crate) struct Registration {
    id: u64,
    rx: oneshot::Receiver<Vec<Started>>,
}

impl Registration {
    /// Resolves when a shard loop handed tasks over (`Some`) or dropped the waiter without any
    /// (`None`: the poll looks again).
    pub(crate) async fn handed(&mut self) -> Option<Vec<Started>> {
        (&mut self.rx).await.ok()
    }
}

impl Waiters {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Plain data, whole after every step: a poisoned lock's contents are still right.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a poll that found nothing to claim.
    pub(crate) fn register(
        &self,
        worker: Option<String>,
        max: usize,
        scope: Option<AuditScope>,
    ) -> Registration {
        let (tx, rx) = oneshot::channel();
        let mut inner = self.lock();
        if inner.waiting.len() >= PRUNE_AT {
            inner.waiting.retain(|w| !w.tx.is_closed());
        }
        let id = inner.next_id;
        inner.next_id += 1;
        inner.waiting.push_back(Waiter {
            id,
            worker,
            max: max.max(1),
            scope,
            tx,
        });
        Registration { id, rx }
    }

    /// Ends a poll's wait: what was handed to it (nothing when it was still waiting, or when the
    /// waiter was dropped).
    pub(crate) fn withdraw(&self, mut reg: Registration) -> Vec<Started> {
        {
            let mut inner = self.lock();
            if let Some(at) = inner.waiting.iter().position(|w| w.id == reg.id) {
                inner.waiting.remove(at);
                return Vec::new();
            }
        }
        // A shard loop took it: whatever it sent before this close is here; a later hand fails
        // and keeps its tasks as unclaimed.
        reg.rx.close();
        reg.rx.try_recv().unwrap_or_default()
    }

    /// Whether a poll is waiting (it may be gone: [`Waiters::take`] skips those).
    #[cfg(test)]
    fn any_waiting(&self) -> bool {
        !self.lock().waiting.is_empty()
    }

    /// The first waiting poll that is still there.
    pub(crate) fn take(&self) -> Option<Waiter> {
        let mut inner = self.lock();
        while let Some(w) = inner.waiting.pop_front() {
            if !w.tx.is_closed() {
                return Some(w);
            }
        }
        None
    }

    /// Keeps tasks started for a poll that was gone, for the next poll.
    pub(crate) fn keep_unclaimed(&self, tasks: Vec<Started>) {
        self.lock().unclaimed.extend(tasks);
    }

    /// Up to `max` tasks kept for the next poll whose lease still runs at `now` (one past it is
    /// the reaper's to offer again).
    pub(crate) fn take_unclaimed(&self, max: usize, now: Timestamp) -> Vec<Started> {
        let mut inner = self.lock();
        if inner.unclaimed.is_empty() {
            return Vec::new();
        }
        inner
            .unclaimed
            .retain(|s| s.task.lease_expires_at.is_some_and(|until| until > now));
        let n = max.min(inner.unclaimed.len());
        inner.unclaimed.drain(..n).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(lease: i64) -> Started {
        Started {
            task: stored(lease),
            claimed_at: Timestamp(0),
            mark: None,
        }
    }

    fn stored(lease: i64) -> Task {
        Task {
            id: sundial_core::TaskId(uuid::Uuid::now_v7()),
            shard: 0,
            queue: "q".into(),
            kind: "k".into(),
            key: None,
            payload: serde_json::Value::Null,
            due_at: Timestamp(0),
            state: sundial_core::TaskState::Running,
            attempt: 1,
            max_attempts: 1,
            backoff: sundial_core::Backoff::default(),
            timeout_ms: 10,
            exclusive: None,
            rate: None,
            priority: sundial_core::Priority::DEFAULT,
            tags: Default::default(),
            execution_id: Some(sundial_core::ExecutionId(uuid::Uuid::now_v7())),
            lease_expires_at: Some(Timestamp(lease)),
            worker: None,
            last_error: None,
            result: None,
            target: None,
            trace: None,
            created_at: Timestamp(0),
            updated_at: Timestamp(0),
            started_at: Some(Timestamp(0)),
            finished_at: None,
        }
    }

    #[tokio::test]
    async fn a_waiter_is_handed_tasks_once_and_a_gone_one_gives_them_back() {
        let w = Waiters::default();
        let mut reg = w.register(Some("w1".into()), 1, None);
        let gone = w.register(None, 1, None);
        assert!(w.any_waiting());
        let first = w.take().unwrap();
        assert_eq!(first.worker.as_deref(), Some("w1"));
        assert!(first.hand(vec![task(10)]).is_ok());
        assert_eq!(reg.handed().await.map(|v| v.len()), Some(1));
        drop(gone);
        assert!(w.take().is_none(), "a dropped registration is skipped");

        // Withdrawn while still waiting: nothing; taken first: what was sent before the close.
        let reg = w.register(None, 1, None);
        assert!(w.withdraw(reg).is_empty());
        assert!(!w.any_waiting());
        let reg = w.register(None, 1, None);
        let taken = w.take().unwrap();
        assert!(taken.hand(vec![task(10)]).is_ok());
        assert_eq!(w.withdraw(reg).len(), 1);
        let reg = w.register(None, 1, None);
        let taken = w.take().unwrap();
        assert!(w.withdraw(reg).is_empty());
        let back = taken.hand(vec![task(10), task(5)]).unwrap_err();
        w.keep_unclaimed(back);
        // The next poll takes what is kept, while its lease lasts.
        let kept = w.take_unclaimed(5, Timestamp(7));
        assert_eq!(kept.len(), 1);
        assert!(w.take_unclaimed(5, Timestamp(7)).is_empty());
    }
}

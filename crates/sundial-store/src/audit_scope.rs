//! The audit record of the request being served, carried to the store so that the request's own
//! write commits it (there is then no action without its record, and no second commit per
//! request).
//!
//! The server's access layer opens an [`AuditScope`] around a request with the record it would
//! write (everything but the final answer is known up front; the status is the route's success
//! status). Anything the request awaits runs inside the scope, as a tracing span would. A backend,
//! inside one of its write transactions, asks [`claim_pending`] for the record; when its write
//! changed something it inserts the record in that transaction and, once it committed, reports
//! [`PendingAudit::written`] with the record's `seq`. A write that changed nothing (a refusal, a
//! duplicate) or failed drops its claim, and the record stays pending for a later write of the
//! same request or, at the end, for the access layer, which writes it on its own. At most one
//! write carries a scope's record; concurrent writes of one request do not both claim it.
//!
//! After the answer the access layer compares the written record with the answer (status, target)
//! and amends it in the rare case they differ ([`crate::AccessStore::amend_audit`]).
//!
//! Code that creates the object a request acts on may name it with [`name_target`] before it
//! writes, so the record written with the object names it too.
//!
//! Must never: do I/O, or carry a record across tasks (a write on another task, such as a
//! backend's batching task, must be handed the [`PendingAudit`] explicitly). The scope is a
//! task-local made here (a thread-local set around each poll of the scoped future) rather than
//! tokio's, so this crate stays free of the runtime.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use crate::access::NewAuditRecord;

thread_local! {
    /// The scope of the future being polled on this thread, set by [`Scoped`] for the length of
    /// each poll (a task-local, without a runtime: this crate does no I/O and needs none).
    static CURRENT: RefCell<Option<AuditScope>> = const { RefCell::new(None) };
}

/// `fut` with `scope` current while it is polled.
struct Scoped<F> {
    scope: AuditScope,
    fut: Pin<Box<F>>,
}

/// Puts the previous scope back when a poll ends (a panic included).
struct Restore(Option<AuditScope>);

impl Drop for Restore {
    fn drop(&mut self) {
        let prev = self.0.take();
        CURRENT.with(|c| *c.borrow_mut() = prev);
    }
}

impl<F: Future> Future for Scoped<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // `Scoped` is `Unpin` (the inner future is boxed), so it may be reached through `&mut`.
        let this = self.get_mut();
        let prev = CURRENT.with(|c| c.borrow_mut().replace(this.scope.clone()));
        let _restore = Restore(prev);
        this.fut.as_mut().poll(cx)
    }
}

/// Runs `f` on the current scope, if there is one.
fn with_current<R>(f: impl FnOnce(&AuditScope) -> R) -> Option<R> {
    CURRENT.with(|c| c.borrow().as_ref().map(f))
}

/// Where a scope's record stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditWrite {
    /// No write has carried it (yet).
    Pending,
    /// A write carrying it is in flight.
    Claimed,
    /// Committed with the request's write, as record `seq`.
    Written { seq: i64 },
}

#[derive(Debug)]
struct ScopeState {
    record: NewAuditRecord,
    write: AuditWrite,
}

/// One request's audit record, shared between the access layer and the store writes the request
/// makes. Cheap to clone.
#[derive(Debug, Clone)]
pub struct AuditScope(Arc<Mutex<ScopeState>>);

impl AuditScope {
    pub fn new(record: NewAuditRecord) -> Self {
        AuditScope(Arc::new(Mutex::new(ScopeState {
            record,
            write: AuditWrite::Pending,
        })))
    }

    fn state(&self) -> MutexGuard<'_, ScopeState> {
        // The state is plain data, whole after every assignment: a poisoned lock's contents
        // are still right.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `fut` with this scope as the current one (for every poll of it; what it spawns
    /// onto other tasks runs outside the scope).
    pub async fn run<F: Future>(&self, fut: F) -> F::Output {
        Scoped {
            scope: self.clone(),
            fut: Box::pin(fut),
        }
        .await
    }

    /// The record as it stands (with the target named since the scope opened, if any).
    pub fn record(&self) -> NewAuditRecord {
        self.state().record.clone()
    }

    /// Whether a write of the request committed the record.
    pub fn write(&self) -> AuditWrite {
        self.state().write
    }

    fn claim(&self) -> Option<PendingAudit> {
        let mut s = self.state();
        if s.write != AuditWrite::Pending {
            return None;
        }
        s.write = AuditWrite::Claimed;
        Some(PendingAudit {
            scope: self.clone(),
            record: s.record.clone(),
            settled: false,
        })
    }
}

/// The current request's record, claimed for one write; `None` outside a scope or when another
/// write carries (or carried) it. The write inserts [`PendingAudit::record`] in its transaction
/// only when it changed something, and then reports [`PendingAudit::written`] after its commit;
/// dropping the claim otherwise leaves the record pending.
pub fn claim_pending() -> Option<PendingAudit> {
    with_current(AuditScope::claim).flatten()
}

/// The current request's scope, to hand to a write made on its behalf on another task (see
/// the module's "must never"): that write runs inside it with [`AuditScope::run`].
pub fn current() -> Option<AuditScope> {
    with_current(AuditScope::clone)
}

/// Names the object the current request acts on (for example the task it creates), when the
/// request has a scope whose record names none yet. Outside a scope it does nothing.
pub fn name_target(target: impl Into<String>) {
    with_current(|scope| {
        let mut s = scope.state();
        if s.record.target.is_none() && s.write == AuditWrite::Pending {
            s.record.target = Some(target.into());
        }
    });
}

/// A request's record claimed by one write (see [`claim_pending`]).
#[derive(Debug)]
pub struct PendingAudit {
    scope: AuditScope,
    record: NewAuditRecord,
    settled: bool,
}

impl PendingAudit {
    /// The record to insert.
    pub fn record(&self) -> &NewAuditRecord {
        &self.record
    }

    /// The write committed the record as `seq`.
    pub fn written(mut self, seq: i64) {
        self.settled = true;
        self.scope.state().write = AuditWrite::Written { seq };
    }
}

impl Drop for PendingAudit {
    fn drop(&mut self) {
        if !self.settled {
            let mut s = self.scope.state();
            if s.write == AuditWrite::Claimed {
                s.write = AuditWrite::Pending;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sundial_core::Timestamp;

    fn record() -> NewAuditRecord {
        NewAuditRecord {
            at: Timestamp(1),
            actor_id: None,
            actor: "local".into(),
            namespace: "default".into(),
            action: "POST /v1/tasks".into(),
            target: None,
            status: 201,
            request_id: "r".into(),
        }
    }

    fn block_on<F: Future>(f: F) -> F::Output {
        futures::executor::block_on(f)
    }

    #[test]
    fn the_scope_is_current_only_while_its_future_is_polled() {
        let scope = AuditScope::new(record());
        let mut inside = Box::pin(scope.run(async {
            assert!(claim_pending().is_some(), "current in its own polls");
            futures::future::pending::<()>().await;
        }));
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(inside.as_mut().poll(&mut cx).is_pending());
        assert!(claim_pending().is_none(), "not current between polls");
    }

    #[test]
    fn outside_a_scope_nothing_is_pending() {
        assert!(claim_pending().is_none());
        name_target("t"); // does nothing, and does not panic
    }

    #[test]
    fn one_write_carries_the_record_and_later_ones_do_not() {
        let scope = AuditScope::new(record());
        block_on(scope.run(async {
            let first = claim_pending().expect("pending");
            assert!(claim_pending().is_none(), "claimed by the first write");
            first.written(7);
            assert!(claim_pending().is_none(), "already written");
        }));
        assert_eq!(scope.write(), AuditWrite::Written { seq: 7 });
    }

    #[test]
    fn a_write_that_drops_its_claim_leaves_the_record_pending() {
        let scope = AuditScope::new(record());
        block_on(scope.run(async {
            drop(claim_pending().expect("pending"));
            assert!(claim_pending().is_some(), "a later write may carry it");
        }));
        assert_eq!(scope.write(), AuditWrite::Pending);
    }

    #[test]
    fn the_target_named_before_the_write_is_in_the_claimed_record() {
        let scope = AuditScope::new(record());
        block_on(scope.run(async {
            name_target("task-1");
            name_target("task-2"); // the first name stays
            let p = claim_pending().expect("pending");
            assert_eq!(p.record().target.as_deref(), Some("task-1"));
        }));
        assert_eq!(scope.record().target.as_deref(), Some("task-1"));
    }
}

//! Whether a queue was found without ready tasks since anything last made one ready: a poll
//! that would find nothing skips its first look in the store and waits at once (among the
//! queue's [`super::handoff`] waiters), which spares every such poll a store round trip (on the
//! embedded store, a turn of the single writer).
//!
//! Every event that can make a task of the queue claimable counts as a change: a task readied
//! on this node or, through the placement, on another (`Engine::wake_pollers`), a place of an
//! exclusive key or of a limited queue freed (`Engine::release_exclusive`), a resume. A poll
//! reads the count before it looks; when its look (a claim of any kind, not passed over for a
//! rate limit's turn) took nothing, it records that count as empty. The queue counts as empty
//! only while no change followed: a change made while the look ran moves the count past it.
//!
//! Never decides whether a task may be claimed, and never keeps a poll from a ready task for
//! long: a poll that skipped its first look still looks when it is woken (a change wakes it),
//! and within a second (`SKIPPED_LOOK_WITHIN` in `poll.rs`) or at the end of its wait if that
//! comes first. So a wake-up lost between nodes costs a poll at most that second.

use std::sync::atomic::{AtomicU64, Ordering};

/// A queue's change count and the count at which it was last found empty.
#[derive(Debug)]
pub(crate) struct Looked {
    changes: AtomicU64,
    /// The change count a look that found nothing had read before it looked; `u64::MAX`: never.
    empty_at: AtomicU64,
}

impl Default for Looked {
    fn default() -> Self {
        Looked {
            changes: AtomicU64::new(0),
            empty_at: AtomicU64::new(u64::MAX),
        }
    }
}

/// What a poll read before its look: pass it back to [`Looked::found_empty`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Before {
    changes: u64,
    /// Whether the queue was found empty and nothing changed since.
    pub(crate) known_empty: bool,
}

impl Looked {
    /// Something may have made a task of the queue claimable. Called after the store write that
    /// did it, so a look whose snapshot missed the write sees the count moved.
    pub(crate) fn changed(&self) {
        self.changes.fetch_add(1, Ordering::SeqCst);
    }

    /// Read before a look in the store.
    pub(crate) fn before(&self) -> Before {
        let changes = self.changes.load(Ordering::SeqCst);
        Before {
            changes,
            known_empty: self.empty_at.load(Ordering::SeqCst) == changes,
        }
    }

    /// The look that read `before` found nothing to take.
    pub(crate) fn found_empty(&self, before: Before) {
        // A later look may have stored a newer count; storing an older one over it only makes
        // the next poll look again (never wrong, only slower).
        self.empty_at.store(before.changes, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_until_a_look_finds_nothing() {
        let l = Looked::default();
        assert!(!l.before().known_empty);
        let b = l.before();
        l.found_empty(b);
        assert!(l.before().known_empty);
    }

    #[test]
    fn a_change_ends_the_emptiness() {
        let l = Looked::default();
        l.found_empty(l.before());
        l.changed();
        assert!(!l.before().known_empty);
    }

    #[test]
    fn a_change_during_the_look_is_not_lost() {
        let l = Looked::default();
        let b = l.before();
        // A task readied while the look ran, its snapshot taken before the write.
        l.changed();
        l.found_empty(b);
        assert!(!l.before().known_empty);
    }

    #[test]
    fn an_older_look_stored_late_only_makes_the_next_poll_look() {
        let l = Looked::default();
        let old = l.before();
        l.changed();
        let new = l.before();
        l.found_empty(new);
        l.found_empty(old);
        assert!(!l.before().known_empty);
    }
}

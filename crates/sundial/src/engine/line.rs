//! The line of one queue's in-process handler slots across shard loops.
//!
//! Each shard loop walks its own window, best rank first (`sundial_core::priority`), and takes a
//! queue's permit for the entry it meets. Without more, a released permit goes to whichever loop
//! turns first, so an urgent task in one shard could wait behind an ordinary one in another. The
//! line fixes that: a loop left without a permit records its best-ranked waiting entry of the
//! queue; a loop that finds permits free leaves as many of them as there are other loops whose
//! recorded entries rank ahead of its own (and wakes the loops, so that they take them).
//!
//! Only as many: leaving every free permit to a better-ranked waiter made a backlogged queue's
//! loops take turns one entry at a time (the loops' waiting entries interleave in rank), one store
//! claim per task, and an engine that fell behind its rate stayed behind (`sundial-bench fire`,
//! BENCHMARKS.md "Plans that stay put, …"). Each waiter's best entry still finds its permit.
//!
//! It owns only that record (one entry per shard and queue). It never takes or releases a permit
//! itself and never touches the store.

use std::collections::BTreeMap;
use std::sync::Mutex;

use sundial_core::TaskId;

/// A due entry's place in line: its rank (`Priority::rank`), then its id.
pub(crate) type Place = (i64, TaskId);

/// The best waiting entry of each shard loop for one queue.
#[derive(Debug, Default)]
pub(crate) struct Line {
    /// Place → shard, and the place each shard holds (so that a shard holds at most one).
    inner: Mutex<LineInner>,
}

#[derive(Debug, Default)]
struct LineInner {
    by_place: BTreeMap<Place, u32>,
    by_shard: BTreeMap<u32, Place>,
}

impl Line {
    fn lock(&self) -> std::sync::MutexGuard<'_, LineInner> {
        match self.inner.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// How many other shards' waiting entries rank ahead of `place` (which `shard` would start):
    /// the free permits it must leave to them.
    pub(crate) fn ahead_of(&self, shard: u32, place: Place) -> usize {
        let inner = self.lock();
        inner
            .by_place
            .range(..place)
            .filter(|(_, waiting)| **waiting != shard)
            .count()
    }

    /// Records `place` as `shard`'s best waiting entry (replacing the one it held).
    pub(crate) fn wait(&self, shard: u32, place: Place) {
        let mut inner = self.lock();
        if let Some(old) = inner.by_shard.insert(shard, place) {
            inner.by_place.remove(&old);
        }
        inner.by_place.insert(place, shard);
    }

    /// Forgets `shard`'s waiting entry; whether it held one.
    pub(crate) fn leave(&self, shard: u32) -> bool {
        let mut inner = self.lock();
        match inner.by_shard.remove(&shard) {
            Some(old) => {
                inner.by_place.remove(&old);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(rank: i64, id: u8) -> Place {
        (rank, TaskId(uuid::Uuid::from_bytes([id; 16])))
    }

    #[test]
    fn another_shards_better_waiting_entry_is_ahead_and_ones_own_is_not() {
        let line = Line::default();
        assert_eq!(line.ahead_of(0, place(10, 1)), 0);
        line.wait(1, place(5, 2));
        assert_eq!(line.ahead_of(0, place(10, 1)), 1);
        assert_eq!(line.ahead_of(0, place(4, 1)), 0);
        assert_eq!(line.ahead_of(1, place(10, 1)), 0, "its own entry");
        line.wait(2, place(7, 3));
        line.wait(3, place(12, 4));
        assert_eq!(line.ahead_of(0, place(10, 1)), 2, "two of three rank ahead");
    }

    #[test]
    fn a_shard_holds_one_place_and_leaving_frees_it() {
        let line = Line::default();
        line.wait(1, place(5, 2));
        line.wait(1, place(20, 3));
        assert_eq!(line.ahead_of(0, place(10, 1)), 0, "replaced, not added");
        assert!(line.leave(1));
        assert!(!line.leave(1));
        assert_eq!(line.ahead_of(0, place(30, 1)), 0);
    }
}

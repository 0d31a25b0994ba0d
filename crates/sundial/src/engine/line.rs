//! The line of one queue's in-process handler slots across shard loops.
//!
//! Each shard loop walks its own window, best rank first (`sundial_core::priority`), and takes a
//! queue's permit for the entry it meets. Without more, a released permit goes to whichever loop
//! turns first, so an urgent task in one shard could wait behind an ordinary one in another. The
//! line fixes that: a loop left without a permit records its best-ranked waiting entry of the
//! queue; a loop that finds a permit free still leaves it to another loop whose recorded entry
//! ranks ahead of its own (and wakes the loops, so that one takes it).
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

    /// Whether another shard's waiting entry ranks ahead of `place` (which `shard` would start).
    pub(crate) fn ahead_of(&self, shard: u32, place: Place) -> bool {
        let inner = self.lock();
        inner
            .by_place
            .range(..place)
            .any(|(_, waiting)| *waiting != shard)
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
        assert!(!line.ahead_of(0, place(10, 1)));
        line.wait(1, place(5, 2));
        assert!(line.ahead_of(0, place(10, 1)));
        assert!(!line.ahead_of(0, place(4, 1)));
        assert!(!line.ahead_of(1, place(10, 1)), "its own entry");
    }

    #[test]
    fn a_shard_holds_one_place_and_leaving_frees_it() {
        let line = Line::default();
        line.wait(1, place(5, 2));
        line.wait(1, place(20, 3));
        assert!(!line.ahead_of(0, place(10, 1)), "replaced, not added");
        assert!(line.leave(1));
        assert!(!line.leave(1));
        assert!(!line.ahead_of(0, place(30, 1)));
    }
}

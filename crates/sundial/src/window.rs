//! The look-ahead window of one shard: the due tasks it has loaded from the store, ordered by
//! `(due_at, id)`, and the cursor that says how far the loading has got.
//!
//! **Invariant (the cursor):** every task that was scheduled with a key at or before `cursor` when
//! it was scanned is either in the window or has been handed out. Tasks that become scheduled later
//! with a key at or before the cursor reach the window through the notify path (the engine tells the
//! shard about every write that makes a task scheduled). So a scan never needs to look behind the
//! cursor, and a task is never forgotten: at worst it is seen twice, and the window is a set.
//!
//! **Bound:** the window never holds more than `capacity` entries. When an insert overflows it, the
//! entries furthest in the future are dropped and the cursor moves back to the last entry kept:
//! those tasks are still in the store and the next scan reads them again. Memory is therefore
//! proportional to `capacity`, never to the number of pending tasks.
//!
//! The window holds no payloads: a key, a queue and a kind (shared strings) per entry.
//!
//! **Parked entries:** the due entries of a push receiver whose slots were all taken, or of a
//! queue whose in-process permits were all taken, are moved aside into that receiver's or
//! queue's lane ([`Window::park`]), and entries of a receiver or queue with a lane go straight
//! into it. A walk of the due entries ([`Window::due`]) no longer passes them, so a receiver that
//! is slow or down, or a queue with a burst of work, however long its backlog, costs the others
//! nothing: neither the walk's time nor its bound; its lane is read from the front when it has
//! free slots ([`Window::lanes`]). Entries with a priority other than the default are never
//! parked in a queue's lane (a lane is in due order, which is rank order only among equals).
//! Parked entries are still in the window: they count against its capacity and the cursor
//! invariant covers them.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use sundial_core::{Priority, TaskId, Timestamp};
use sundial_store::{DueEntry, DueKey};

/// What the window knows of a task besides its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    pub queue: Arc<str>,
    pub kind: Arc<str>,
    pub timeout_ms: u64,
    /// A push task's destination (interned), by which its calls are limited.
    pub push_host: Option<Arc<str>>,
    /// Its order among due entries competing for the same slots (`sundial_core::priority`).
    pub priority: Priority,
}

/// What a lane of parked entries waits for (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Lane {
    /// A push receiver's slots.
    Push(Arc<str>),
    /// A queue's in-process permits.
    Queue(Arc<str>),
}

impl Lane {
    /// The lane an entry goes to once its receiver or queue has one: its push receiver's, else
    /// its queue's when it has the default priority, else none.
    pub fn of(meta: &Meta) -> Option<Lane> {
        match &meta.push_host {
            Some(host) => Some(Lane::Push(host.clone())),
            None if meta.priority == Priority::DEFAULT => Some(Lane::Queue(meta.queue.clone())),
            None => None,
        }
    }
}

#[derive(Debug)]
pub struct Window {
    entries: BTreeMap<DueKey, Meta>,
    /// Parked entries, by push receiver or queue (see the module docs). No lane is empty.
    lanes: HashMap<Lane, BTreeMap<DueKey, Meta>>,
    parked: usize,
    capacity: usize,
    cursor: Option<DueKey>,
}

impl Window {
    pub fn new(capacity: usize) -> Self {
        Window {
            entries: BTreeMap::new(),
            lanes: HashMap::new(),
            parked: 0,
            capacity,
            cursor: None,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len() + self.parked
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many entries are parked in receivers' lanes.
    #[cfg(test)]
    pub fn parked(&self) -> usize {
        self.parked
    }

    pub fn cursor(&self) -> Option<DueKey> {
        self.cursor
    }

    /// Room for this many more entries.
    pub fn room(&self) -> usize {
        self.capacity.saturating_sub(self.len())
    }

    /// Forgets how far scanning got, so the next scan starts from the front of the shard. Used by
    /// the idle backstop to find anything a lost notification would have hidden.
    pub fn reset_cursor(&mut self) {
        self.cursor = None;
    }

    /// When the look-ahead should be refilled: once half of what the cursor covers beyond now has
    /// been used. `None` when the window is full (firing makes room first).
    pub fn refill_at(&self, lookahead: std::time::Duration) -> Option<Timestamp> {
        if self.room() == 0 {
            return None;
        }
        let half = (lookahead.as_millis() / 2) as i64;
        Some(match self.cursor {
            Some(c) => Timestamp(c.due_at.0.saturating_sub(half)),
            None => Timestamp(i64::MIN),
        })
    }

    /// Whether a scan is due at `now`.
    pub fn needs_refill(&self, now: Timestamp, lookahead: std::time::Duration) -> bool {
        self.refill_at(lookahead).is_some_and(|t| t <= now)
    }

    /// Adds one entry (from a notification or a scan).
    pub fn insert(&mut self, key: DueKey, meta: Meta) {
        self.put(key, meta);
        self.trim();
    }

    /// Adds an entry to its receiver's or queue's lane when it has one, else to the walked
    /// entries.
    fn put(&mut self, key: DueKey, meta: Meta) {
        if !self.lanes.is_empty()
            && let Some(lane) = Lane::of(&meta)
            && let Some(lane) = self.lanes.get_mut(&lane)
        {
            if lane.insert(key, meta).is_none() {
                self.parked += 1;
            }
            return;
        }
        self.entries.insert(key, meta);
    }

    /// Takes the result of `scan(after = cursor, until, limit)`. When the scan returned fewer than
    /// `limit` rows it saw everything up to `until`, and the cursor moves there; otherwise it moves
    /// to the last row read.
    pub fn absorb_scan(
        &mut self,
        rows: Vec<DueEntry>,
        until: Timestamp,
        limit: usize,
        intern: &mut impl FnMut(&str) -> Arc<str>,
    ) {
        let complete = rows.len() < limit;
        let last = rows.last().map(|r| r.key);
        for r in rows {
            let meta = Meta {
                queue: intern(&r.queue),
                kind: intern(&r.kind),
                timeout_ms: r.timeout_ms,
                push_host: r.push_host.as_deref().map(&mut *intern),
                priority: r.priority,
            };
            self.put(r.key, meta);
        }
        let reached = if complete {
            Some(DueKey {
                due_at: until,
                id: TaskId::MAX,
            })
        } else {
            last
        };
        if let Some(r) = reached
            && self.cursor.is_none_or(|c| r > c)
        {
            self.cursor = Some(r);
        }
        self.trim();
    }

    fn trim(&mut self) {
        while self.len() > self.capacity {
            self.pop_last();
            if let Some(last) = self.last_key()
                && self.cursor.is_none_or(|c| c > last)
            {
                self.cursor = Some(last);
            }
        }
    }

    /// The latest key held, walked or parked.
    fn last_key(&self) -> Option<DueKey> {
        let walked = self.entries.last_key_value().map(|(k, _)| *k);
        let parked = self
            .lanes
            .values()
            .filter_map(|l| l.last_key_value().map(|(k, _)| *k))
            .max();
        walked.max(parked)
    }

    /// Drops the latest entry held, walked or parked.
    fn pop_last(&mut self) {
        let Some(last) = self.last_key() else {
            return;
        };
        if self.entries.remove(&last).is_none() {
            self.remove_parked(&last);
        }
    }

    /// The earliest due time held.
    pub fn first_due(&self) -> Option<Timestamp> {
        let walked = self.entries.first_key_value().map(|(k, _)| k.due_at);
        let parked = self
            .lanes
            .values()
            .filter_map(|l| l.first_key_value().map(|(k, _)| k.due_at))
            .min();
        match (walked, parked) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The earliest due time strictly after `now`.
    pub fn first_due_after(&self, now: Timestamp) -> Option<Timestamp> {
        let from = DueKey {
            due_at: Timestamp(now.0.saturating_add(1)),
            id: TaskId::MIN,
        };
        std::iter::once(&self.entries)
            .chain(self.lanes.values())
            .filter_map(|m| m.range(from..).next().map(|(k, _)| k.due_at))
            .min()
    }

    /// The earliest due time strictly after `now` of an entry that `wanted` accepts, looking at
    /// no more than `limit` entries of each part of the window (the walk and each lane): `None`
    /// when none of those is accepted.
    pub fn first_due_after_where(
        &self,
        now: Timestamp,
        limit: usize,
        mut wanted: impl FnMut(&Meta) -> bool,
    ) -> Option<Timestamp> {
        let from = DueKey {
            due_at: Timestamp(now.0.saturating_add(1)),
            id: TaskId::MIN,
        };
        std::iter::once(&self.entries)
            .chain(self.lanes.values())
            .filter_map(|m| {
                m.range(from..)
                    .take(limit)
                    .find(|(_, meta)| wanted(meta))
                    .map(|(k, _)| k.due_at)
            })
            .min()
    }

    /// Entries due at or before `now`, oldest first, without removing them.
    pub fn due(&self, now: Timestamp) -> impl Iterator<Item = (&DueKey, &Meta)> {
        let to = DueKey {
            due_at: now,
            id: TaskId::MAX,
        };
        self.entries.range(..=to)
    }

    /// The receivers and queues with parked entries, each with its parked entries due at or
    /// before `now`, oldest first.
    pub fn lanes(
        &self,
        now: Timestamp,
    ) -> impl Iterator<Item = (&Lane, impl Iterator<Item = (&DueKey, &Meta)>)> {
        let to = DueKey {
            due_at: now,
            id: TaskId::MAX,
        };
        self.lanes.iter().map(move |(h, l)| (h, l.range(..=to)))
    }

    /// Moves a walked entry into its receiver's or queue's lane (its slots or permits are all
    /// taken). Entries without a lane (see [`Lane::of`]), and keys not walked, are left as they
    /// are.
    pub fn park(&mut self, key: &DueKey) {
        let Some(lane) = self.entries.get(key).and_then(Lane::of) else {
            return;
        };
        if let Some(meta) = self.entries.remove(key)
            && self
                .lanes
                .entry(lane)
                .or_default()
                .insert(*key, meta)
                .is_none()
        {
            self.parked += 1;
        }
    }

    pub fn remove(&mut self, key: &DueKey) -> Option<Meta> {
        self.entries.remove(key).or_else(|| self.remove_parked(key))
    }

    fn remove_parked(&mut self, key: &DueKey) -> Option<Meta> {
        if self.lanes.is_empty() {
            return None;
        }
        let (host, meta) = self
            .lanes
            .iter_mut()
            .find_map(|(h, l)| l.remove(key).map(|m| (h.clone(), m)))?;
        self.parked -= 1;
        if self.lanes.get(&host).is_some_and(BTreeMap::is_empty) {
            self.lanes.remove(&host);
        }
        Some(meta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(due: i64, id: u8) -> DueKey {
        DueKey {
            due_at: Timestamp(due),
            id: TaskId::from_bytes([id; 16]),
        }
    }
    fn meta() -> Meta {
        Meta {
            queue: Arc::from("q"),
            kind: Arc::from("k"),
            timeout_ms: 1_000,
            push_host: None,
            priority: Priority::DEFAULT,
        }
    }
    fn row(due: i64, id: u8) -> DueEntry {
        DueEntry {
            key: key(due, id),
            queue: "q".into(),
            kind: "k".into(),
            timeout_ms: 1_000,
            push_host: None,
            priority: Priority::DEFAULT,
        }
    }
    fn intern() -> impl FnMut(&str) -> Arc<str> {
        |s: &str| Arc::from(s)
    }

    #[test]
    fn complete_scan_moves_cursor_to_horizon() {
        let mut w = Window::new(10);
        w.absorb_scan(
            vec![row(5, 1), row(7, 2)],
            Timestamp(100),
            10,
            &mut intern(),
        );
        assert_eq!(w.len(), 2);
        assert_eq!(w.cursor().map(|c| c.due_at), Some(Timestamp(100)));
    }

    #[test]
    fn truncated_scan_moves_cursor_to_last_row() {
        let mut w = Window::new(10);
        w.absorb_scan(vec![row(5, 1), row(7, 2)], Timestamp(100), 2, &mut intern());
        assert_eq!(w.cursor(), Some(key(7, 2)));
    }

    #[test]
    fn overflow_drops_the_latest_and_pulls_the_cursor_back() {
        let mut w = Window::new(2);
        w.absorb_scan(
            vec![row(5, 1), row(7, 2)],
            Timestamp(100),
            10,
            &mut intern(),
        );
        w.insert(key(6, 3), meta());
        assert_eq!(w.len(), 2);
        assert_eq!(w.cursor(), Some(key(6, 3)));
        assert_eq!(w.first_due(), Some(Timestamp(5)));
    }

    #[test]
    fn due_and_next_wake() {
        let mut w = Window::new(10);
        for (d, i) in [(5, 1), (5, 2), (9, 3), (20, 4)] {
            w.insert(key(d, i), meta());
        }
        let due: Vec<_> = w.due(Timestamp(9)).map(|(k, _)| *k).collect();
        assert_eq!(due, vec![key(5, 1), key(5, 2), key(9, 3)]);
        assert_eq!(w.first_due_after(Timestamp(9)), Some(Timestamp(20)));
        assert_eq!(w.first_due_after(Timestamp(20)), None);
    }

    #[test]
    fn refills_when_half_the_lookahead_is_used_and_there_is_room() {
        let la = std::time::Duration::from_millis(1_000);
        let mut w = Window::new(2);
        assert!(w.needs_refill(Timestamp(0), la));
        w.absorb_scan(vec![row(5, 1)], Timestamp(1_000), 2, &mut intern());
        assert!(!w.needs_refill(Timestamp(499), la));
        assert!(w.needs_refill(Timestamp(500), la));
        w.insert(key(6, 2), meta());
        assert_eq!(w.refill_at(la), None, "full");
    }

    fn push(host: &str) -> Meta {
        Meta {
            push_host: Some(Arc::from(host)),
            ..meta()
        }
    }

    #[test]
    fn parked_entries_leave_the_walk_but_stay_in_the_window() {
        let mut w = Window::new(4);
        w.insert(key(5, 1), push("slow"));
        w.insert(key(6, 2), push("fast"));
        w.insert(key(7, 3), urgent());
        w.park(&key(5, 1));
        w.park(&key(7, 3)); // a priority of its own: never parked, stays walked
        let walked: Vec<_> = w.due(Timestamp(10)).map(|(k, _)| *k).collect();
        assert_eq!(walked, vec![key(6, 2), key(7, 3)]);
        assert_eq!((w.len(), w.parked()), (3, 1));
        assert_eq!(w.first_due(), Some(Timestamp(5)));
        // A later entry of the parked receiver goes straight into its lane.
        w.insert(key(8, 4), push("slow"));
        let lanes: Vec<(String, Vec<DueKey>)> = w
            .lanes(Timestamp(10))
            .map(|(h, l)| (format!("{h:?}"), l.map(|(k, _)| *k).collect()))
            .collect();
        assert_eq!(
            lanes,
            vec![(r#"Push("slow")"#.into(), vec![key(5, 1), key(8, 4)])]
        );
        assert_eq!(w.first_due_after(Timestamp(7)), Some(Timestamp(8)));
        // Over capacity, the latest entry goes, parked or not, and the cursor follows.
        w.insert(key(9, 5), meta());
        assert_eq!(w.len(), 4);
        w.insert(key(4, 6), meta());
        assert_eq!(w.len(), 4);
        assert_eq!(w.cursor(), Some(key(7, 3)));
        // Removing a lane's last entries removes the lane.
        assert!(w.remove(&key(5, 1)).is_some());
        assert!(w.remove(&key(8, 4)).is_none(), "dropped by the overflow");
        assert_eq!(w.parked(), 0);
        assert_eq!(w.lanes(Timestamp(10)).count(), 0);
        // Entries of a receiver without a lane are walked again.
        w.insert(key(8, 7), push("slow"));
        assert!(w.due(Timestamp(10)).any(|(k, _)| *k == key(8, 7)));
    }

    fn urgent() -> Meta {
        Meta {
            priority: Priority::MAX,
            ..meta()
        }
    }

    fn in_queue(q: &str) -> Meta {
        Meta {
            queue: Arc::from(q),
            ..meta()
        }
    }

    /// A queue whose permits ran out parks its entries; the walk then reaches another queue's
    /// later entries at once, and the parked queue's later entries go straight to its lane.
    #[test]
    fn a_starved_queue_is_parked_and_the_walk_reaches_the_others() {
        let mut w = Window::new(100);
        for i in 0..50u8 {
            w.insert(key(i64::from(i), i), in_queue("busy"));
        }
        w.insert(key(60, 200), in_queue("other"));
        let walked: Vec<DueKey> = w.due(Timestamp(100)).take(10).map(|(k, _)| *k).collect();
        for k in &walked {
            w.park(k);
        }
        assert_eq!(w.parked(), 10);
        // A later entry of the parked queue joins its lane, not the walk.
        w.insert(key(70, 201), in_queue("busy"));
        assert_eq!(w.parked(), 11);
        // An urgent entry of that queue is never parked.
        w.insert(
            key(71, 202),
            Meta {
                priority: Priority::MAX,
                ..in_queue("busy")
            },
        );
        let lanes: Vec<(Lane, usize)> = w
            .lanes(Timestamp(100))
            .map(|(l, e)| (l.clone(), e.count()))
            .collect();
        assert_eq!(lanes, vec![(Lane::Queue(Arc::from("busy")), 11)]);
        assert!(w.due(Timestamp(100)).any(|(k, _)| *k == key(71, 202)));
        assert_eq!(w.len(), 53);
    }

    #[test]
    fn entries_are_a_set() {
        let mut w = Window::new(10);
        w.insert(key(5, 1), meta());
        w.absorb_scan(vec![row(5, 1)], Timestamp(10), 10, &mut intern());
        assert_eq!(w.len(), 1);
    }
}

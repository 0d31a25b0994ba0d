//! Decoded histories of recently replayed runs, kept so that a workflow task reads and decodes only
//! the events appended since the previous workflow task of its run.
//!
//! Correctness never depends on it: a history only grows and a recorded event never changes (the
//! store's invariant), so a cached history is always a prefix of the stored one, and the loader
//! checks that the first event it reads next carries the expected sequence number. A miss (never
//! cached, evicted, or taken by a concurrent workflow task of the same run) just loads the whole
//! history from the store.
//!
//! A workflow task *takes* its run's entry out for the length of its replay and *puts* it back
//! afterwards, so no event is copied and two tasks never share a vector. The cache is bounded by
//! the total number of events it holds ([`crate::WorkflowConfig::history_cache_events`]); the
//! least recently put runs go first. It owns no I/O and never decides anything about a run.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use sundial_core::RunId;

use crate::event::WorkflowEvent;

pub(crate) struct HistoryCache {
    max_events: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Each run's history and the stamp of its last put.
    runs: HashMap<RunId, (Vec<WorkflowEvent>, u64)>,
    /// Puts in order, `(run, stamp)`; an entry whose stamp is no longer the run's is skipped.
    order: VecDeque<(RunId, u64)>,
    events: usize,
    stamp: u64,
}

impl HistoryCache {
    /// A cache of at most `max_events` events in all (0 keeps nothing).
    pub fn new(max_events: usize) -> Self {
        HistoryCache {
            max_events,
            state: Mutex::new(State::default()),
        }
    }

    /// Takes the run's cached history out, or an empty one.
    pub fn take(&self, run: RunId) -> Vec<WorkflowEvent> {
        let Ok(mut st) = self.state.lock() else {
            return Vec::new();
        };
        match st.runs.remove(&run) {
            Some((h, _)) => {
                st.events -= h.len();
                h
            }
            None => Vec::new(),
        }
    }

    /// Puts a run's history back (replacing any entry a concurrent task put meanwhile), then
    /// evicts the least recently put runs while over the bound.
    pub fn put(&self, run: RunId, history: Vec<WorkflowEvent>) {
        if history.len() > self.max_events {
            return;
        }
        let Ok(mut st) = self.state.lock() else {
            return;
        };
        st.stamp += 1;
        let stamp = st.stamp;
        st.events += history.len();
        if let Some((old, _)) = st.runs.insert(run, (history, stamp)) {
            st.events -= old.len();
        }
        st.order.push_back((run, stamp));
        while st.events > self.max_events {
            let Some((victim, s)) = st.order.pop_front() else {
                break;
            };
            if st.runs.get(&victim).is_some_and(|(_, cur)| *cur == s)
                && let Some((h, _)) = st.runs.remove(&victim)
            {
                st.events -= h.len();
            }
        }
        // Stale order entries of runs put again accumulate; drop them once they dominate.
        if st.order.len() > 2 * st.runs.len() + 64 {
            let State { runs, order, .. } = &mut *st;
            order.retain(|(r, s)| runs.get(r).is_some_and(|(_, cur)| cur == s));
        }
    }

    /// Forgets a run (closed: no workflow task will replay it again).
    pub fn forget(&self, run: RunId) {
        drop(self.take(run));
    }

    #[cfg(test)]
    fn cached_events(&self) -> usize {
        self.state.lock().map(|s| s.events).unwrap_or(0)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::event::Event;
    use sundial_core::Timestamp;

    fn history(n: usize) -> Vec<WorkflowEvent> {
        (0..n)
            .map(|i| WorkflowEvent {
                seq: i as u64,
                at: Timestamp(i as i64),
                event: Event::SignalReceived {
                    name: "s".into(),
                    input: serde_json::Value::Null,
                },
            })
            .collect()
    }

    fn run(i: u128) -> RunId {
        RunId(uuid::Uuid::from_u128(i))
    }

    #[test]
    fn take_returns_what_was_put_once() {
        let c = HistoryCache::new(100);
        c.put(run(1), history(5));
        assert_eq!(c.take(run(1)).len(), 5);
        assert!(c.take(run(1)).is_empty(), "taken out: a second take misses");
        assert_eq!(c.cached_events(), 0);
    }

    #[test]
    fn evicts_least_recently_put_within_the_bound() {
        let c = HistoryCache::new(10);
        c.put(run(1), history(4));
        c.put(run(2), history(4));
        c.put(run(1), history(5)); // run 1 is now the most recent
        c.put(run(3), history(4)); // 5 + 4 + 4 > 10: run 2 goes
        assert!(c.take(run(2)).is_empty());
        assert_eq!(c.take(run(1)).len(), 5);
        assert_eq!(c.take(run(3)).len(), 4);
        assert_eq!(c.cached_events(), 0);
    }

    #[test]
    fn a_history_over_the_bound_is_not_kept() {
        let c = HistoryCache::new(3);
        c.put(run(1), history(4));
        assert!(c.take(run(1)).is_empty());
        let off = HistoryCache::new(0);
        off.put(run(1), history(1));
        assert!(off.take(run(1)).is_empty());
    }

    #[test]
    fn forget_and_order_bookkeeping_stay_bounded() {
        let c = HistoryCache::new(1_000);
        for _ in 0..1_000 {
            c.put(run(7), history(3));
        }
        assert_eq!(c.cached_events(), 3);
        assert!(c.state.lock().unwrap().order.len() <= 2 + 64 + 1);
        c.forget(run(7));
        assert_eq!(c.cached_events(), 0);
    }
}

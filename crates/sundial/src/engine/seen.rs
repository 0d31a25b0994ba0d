//! The workers this node has seen poll: per worker name and queue, the last poll's time and how
//! many polls, for the operator's overview. In memory and per node (a worker polling another
//! node is that node's to report), bounded by [`MAX_SEEN`] entries: when full, the entry seen
//! longest ago makes room.

use std::collections::HashMap;
use std::sync::Mutex;

use sundial_core::Timestamp;

/// Worker and queue pairs remembered at most.
pub const MAX_SEEN: usize = 1_000;

/// A worker that polled a queue of this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSeen {
    /// The name the worker gave (`None`: it gave none).
    pub worker: Option<String>,
    pub queue: String,
    /// When its last poll of the queue began.
    pub last_seen: Timestamp,
    /// Polls of the queue by this worker since this node started (or since the entry was last
    /// made room for).
    pub polls: u64,
}

/// A worker name (if it gave one) and a queue.
type Pair = (Option<String>, String);

#[derive(Default)]
pub(crate) struct SeenWorkers {
    /// Per pair: the last poll's time and the number of polls.
    entries: Mutex<HashMap<Pair, (Timestamp, u64)>>,
}

impl SeenWorkers {
    /// Records a poll of `queue` by `worker` at `now`.
    pub(crate) fn record(&self, worker: Option<&str>, queue: &str, now: Timestamp) {
        let Ok(mut m) = self.entries.lock() else {
            return;
        };
        let key = (worker.map(str::to_string), queue.to_string());
        if let Some(e) = m.get_mut(&key) {
            e.0 = e.0.max(now);
            e.1 += 1;
            return;
        }
        if m.len() >= MAX_SEEN {
            // O(n) only when a new pair arrives at a full table.
            let oldest = m
                .iter()
                .min_by_key(|(_, (t, _))| *t)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                m.remove(&k);
            }
        }
        m.insert(key, (now, 1));
    }

    /// Every remembered pair seen at or after `since`, the most recent first (ties by queue,
    /// then worker).
    pub(crate) fn since(&self, since: Timestamp) -> Vec<WorkerSeen> {
        let Ok(m) = self.entries.lock() else {
            return Vec::new();
        };
        let mut out: Vec<WorkerSeen> = m
            .iter()
            .filter(|(_, (t, _))| *t >= since)
            .map(|((w, q), (t, n))| WorkerSeen {
                worker: w.clone(),
                queue: q.clone(),
                last_seen: *t,
                polls: *n,
            })
            .collect();
        out.sort_by(|a, b| {
            b.last_seen
                .cmp(&a.last_seen)
                .then_with(|| a.queue.cmp(&b.queue))
                .then_with(|| a.worker.cmp(&b.worker))
        });
        out
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().map(|m| m.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polls_are_counted_per_worker_and_queue_newest_first() {
        let s = SeenWorkers::default();
        s.record(Some("w1"), "emails", Timestamp(10));
        s.record(Some("w1"), "emails", Timestamp(20));
        s.record(Some("w2"), "emails", Timestamp(15));
        s.record(None, "reports", Timestamp(30));
        let all = s.since(Timestamp(0));
        assert_eq!(
            all.iter()
                .map(|w| (
                    w.worker.as_deref(),
                    w.queue.as_str(),
                    w.last_seen.0,
                    w.polls
                ))
                .collect::<Vec<_>>(),
            vec![
                (None, "reports", 30, 1),
                (Some("w1"), "emails", 20, 2),
                (Some("w2"), "emails", 15, 1),
            ]
        );
        assert_eq!(s.since(Timestamp(16)).len(), 2, "older ones are left out");
    }

    #[test]
    fn the_table_is_bounded_and_forgets_the_oldest() {
        let s = SeenWorkers::default();
        for i in 0..(MAX_SEEN as i64 + 50) {
            s.record(Some(&format!("w{i}")), "q", Timestamp(i));
        }
        assert_eq!(s.len(), MAX_SEEN);
        let all = s.since(Timestamp(0));
        assert_eq!(all.len(), MAX_SEEN);
        assert_eq!(all.last().map(|w| w.last_seen), Some(Timestamp(50)));
        assert_eq!(
            all.first().map(|w| w.worker.clone()),
            Some(Some(format!("w{}", MAX_SEEN + 49)))
        );
    }
}

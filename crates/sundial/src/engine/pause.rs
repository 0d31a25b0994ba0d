//! Paused and limited queues: which queues this engine holds back, and which have a concurrency
//! limit, kept in step with the store.
//!
//! The pause state lives in the store (`queue_settings.paused`); every engine keeps a copy. A
//! pause or resume through this engine's facade changes the copy at once; the store is read
//! again every `Config::pause_refresh` (and before the first claim or poll), so a pause made on
//! another node holds here within that time, and a restarted node holds it before it starts
//! anything.
//!
//! While a queue is paused its due entries are dropped from the shard windows (they stay in the
//! store, scheduled and visible as due) and its pollers wait. A resume marks every shard to scan
//! from the front at its next turn and wakes the queue's pollers, so the waiting tasks start in
//! due order.
//!
//! The limited queues (`QueueConfig::concurrency`) are read with the pause state. The store
//! enforces each limit at every start whatever this copy says; the copy only tells which
//! finishes free a place worth announcing (to this node's waiting starts and, through the
//! placement, every node's pollers).

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};

use sundial_store::StoreError;

use super::Engine;

/// The paused queues, as last read or set.
#[derive(Default)]
pub(crate) struct PausedQueues {
    set: RwLock<Arc<HashSet<String>>>,
    /// The queues with a concurrency limit.
    limited: RwLock<Arc<HashSet<String>>>,
    /// Whether the store has been read at least once.
    loaded: std::sync::atomic::AtomicBool,
}

impl PausedQueues {
    /// A snapshot (cheap: an `Arc`).
    pub(crate) fn snapshot(&self) -> Arc<HashSet<String>> {
        self.set
            .read()
            .map(|s| s.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// Whether `queue` has a concurrency limit, as last read or set.
    pub(crate) fn is_limited(&self, queue: &str) -> bool {
        let set = match self.limited.read() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        !set.is_empty() && set.contains(queue)
    }

    fn replace_limited(&self, next: HashSet<String>) {
        let mut guard = match self.limited.write() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        *guard = Arc::new(next);
    }

    pub(crate) fn loaded(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
    }

    /// Replaces the set; returns the queues that were resumed.
    fn replace(&self, next: HashSet<String>) -> Vec<String> {
        let mut guard = match self.set.write() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let resumed = guard.difference(&next).cloned().collect();
        *guard = Arc::new(next);
        self.loaded.store(true, Ordering::Release);
        resumed
    }
}

impl Engine {
    pub(crate) fn is_paused(&self, queue: &str) -> bool {
        self.paused.snapshot().contains(queue)
    }

    /// Applies a pause or resume made through this engine at once.
    pub(crate) fn set_paused(&self, queue: &str, paused: bool) {
        let mut next: HashSet<String> = (*self.paused.snapshot()).clone();
        if paused {
            next.insert(queue.to_string());
        } else {
            next.remove(queue);
        }
        let resumed = self.paused.replace(next);
        self.resumed(&resumed);
    }

    /// Applies a queue's concurrency limit set (or removed) through this engine at once.
    pub(crate) fn set_limited(&self, queue: &str, limited: bool) {
        let mut next: HashSet<String> = match self.paused.limited.read() {
            Ok(s) => (**s).clone(),
            Err(p) => (**p.into_inner()).clone(),
        };
        if limited {
            next.insert(queue.to_string());
        } else {
            next.remove(queue);
        }
        self.paused.replace_limited(next);
        // A raised or removed limit may free places at once.
        self.ready_changed(queue);
        self.wake_queue_waiters(queue);
    }

    /// Reads the paused and the limited queues from the store.
    pub(crate) async fn refresh_paused(&self) -> Result<(), StoreError> {
        let settings = self.store.list_queue_settings().await?;
        let limited: HashSet<String> = settings
            .iter()
            .filter(|s| s.config.concurrency.is_some())
            .map(|s| s.queue.clone())
            .collect();
        self.paused.replace_limited(limited);
        let next: HashSet<String> = settings
            .into_iter()
            .filter(|s| s.paused)
            .map(|s| s.queue)
            .collect();
        let resumed = self.paused.replace(next);
        self.resumed(&resumed);
        Ok(())
    }

    /// Queues that were resumed: every shard scans from the front at its next turn (their due
    /// entries were dropped while paused), and their pollers look again.
    fn resumed(&self, queues: &[String]) {
        if queues.is_empty() {
            return;
        }
        for s in &self.shards {
            s.rescan.store(true, Ordering::Release);
            s.wake.notify_one();
        }
        for q in queues {
            self.ready_changed(q);
        }
    }
}

/// Reads the pause state every `Config::pause_refresh` on the engine's clock until shutdown.
pub(crate) async fn drive(engine: Arc<Engine>) {
    let mut stopping = engine.stopping_rx();
    loop {
        if *stopping.borrow() {
            break;
        }
        if let Err(e) = engine.refresh_paused().await {
            tracing::warn!(error = %e, "reading the paused queues failed; retrying");
        }
        let next = engine
            .clock
            .now()
            .saturating_add(engine.config.pause_refresh);
        tokio::select! {
            _ = engine.clock.sleep_until(next) => {}
            _ = stopping.changed() => {}
        }
    }
}

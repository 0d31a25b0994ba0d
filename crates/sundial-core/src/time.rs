//! Time: the [`Timestamp`] type (milliseconds since the Unix epoch, UTC) and the [`Clock`] through
//! which every due decision reads the current time.
//!
//! Sundial keeps three notions of "timer" apart: a task's due time is a *value* (a `Timestamp` on a
//! row), not a running timer; the store's ordered index finds what is due; and the engine keeps one
//! resettable alarm per shard, armed through [`Clock::sleep_until`]. Because all three go through a
//! `Clock`, tests swap in a [`ManualClock`] and move time by hand: nothing in a test waits for real
//! time to pass for a timer to fire.
//!
//! Resolution is one millisecond. A sleep never ends before its deadline on the clock it was armed
//! on (it may end later: that lateness is what Sundial measures and keeps small).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A point in time: milliseconds since 1970-01-01T00:00:00Z.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(transparent)]
pub struct Timestamp(pub i64);

impl Timestamp {
    /// The earliest time Sundial accepts: the Unix epoch.
    pub const MIN: Timestamp = Timestamp(0);
    /// The latest time Sundial accepts: 9999-12-31T23:59:59.999Z.
    pub const MAX: Timestamp = Timestamp(253_402_300_799_999);

    pub fn from_millis(ms: i64) -> Self {
        Timestamp(ms)
    }
    pub fn as_millis(&self) -> i64 {
        self.0
    }
    /// `self + d`, saturating at the representable range.
    pub fn saturating_add(self, d: Duration) -> Timestamp {
        let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        Timestamp(self.0.saturating_add(ms))
    }
    /// `self - d`, saturating.
    pub fn saturating_sub(self, d: Duration) -> Timestamp {
        let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        Timestamp(self.0.saturating_sub(ms))
    }
    /// How long from `earlier` to `self`; zero when `earlier` is not earlier.
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(u64::try_from(self.0.saturating_sub(earlier.0)).unwrap_or(0))
    }
    pub fn is_in_range(&self) -> bool {
        *self >= Self::MIN && *self <= Self::MAX
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Timestamp({}ms)", self.0)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

/// A future that completes once the clock reaches a deadline.
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// The one source of time for due decisions.
///
/// Implementations: `sundial::clock::SystemClock` (the wall clock and tokio's timer; the only place
/// that reads the wall clock) and [`ManualClock`] (moved by hand, for tests and simulations).
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> Timestamp;
    /// Completes when `now() >= deadline`. Never completes earlier.
    fn sleep_until(&self, deadline: Timestamp) -> Sleep;
    /// [`Clock::sleep_until`] for a start that is due at `deadline` (a run or a poll's answer
    /// claimed ahead): a clock whose timer is coarse may end it with a finer wait, so it ends
    /// closer after the deadline. Never completes earlier. By default, `sleep_until`.
    fn sleep_until_on_time(&self, deadline: Timestamp) -> Sleep {
        self.sleep_until(deadline)
    }
}

/// A clock that only moves when told to. Sleepers wake when [`ManualClock::advance`] or
/// [`ManualClock::set`] reaches their deadline.
#[derive(Clone, Default)]
pub struct ManualClock {
    inner: Arc<ManualInner>,
}

#[derive(Default)]
struct ManualInner {
    now: AtomicI64,
    next_sleeper: AtomicU64,
    sleepers: Mutex<HashMap<u64, (Timestamp, Waker)>>,
}

impl ManualClock {
    pub fn new(start: Timestamp) -> Self {
        let c = ManualClock::default();
        c.inner.now.store(start.0, Ordering::SeqCst);
        c
    }

    /// Moves time forward by `d` and wakes every sleeper whose deadline has come.
    pub fn advance(&self, d: Duration) {
        let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        let now = self
            .inner
            .now
            .fetch_add(ms, Ordering::SeqCst)
            .saturating_add(ms);
        self.wake_due(Timestamp(now));
    }

    /// Sets the time (forward or backward) and wakes every sleeper whose deadline has come.
    pub fn set(&self, t: Timestamp) {
        self.inner.now.store(t.0, Ordering::SeqCst);
        self.wake_due(t);
    }

    /// How many sleepers are waiting (for tests that want to know an engine is parked).
    pub fn sleepers(&self) -> usize {
        self.inner.sleepers.lock().map(|s| s.len()).unwrap_or(0)
    }

    fn wake_due(&self, now: Timestamp) {
        let due: Vec<Waker> = match self.inner.sleepers.lock() {
            Ok(mut s) => {
                let ids: Vec<u64> = s
                    .iter()
                    .filter(|(_, (d, _))| *d <= now)
                    .map(|(id, _)| *id)
                    .collect();
                ids.into_iter()
                    .filter_map(|id| s.remove(&id).map(|(_, w)| w))
                    .collect()
            }
            Err(_) => Vec::new(),
        };
        for w in due {
            w.wake();
        }
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.inner.now.load(Ordering::SeqCst))
    }

    fn sleep_until(&self, deadline: Timestamp) -> Sleep {
        let id = self.inner.next_sleeper.fetch_add(1, Ordering::Relaxed);
        Box::pin(ManualSleep {
            inner: self.inner.clone(),
            id,
            deadline,
        })
    }
}

struct ManualSleep {
    inner: Arc<ManualInner>,
    id: u64,
    deadline: Timestamp,
}

impl Future for ManualSleep {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.inner.now.load(Ordering::SeqCst) >= self.deadline.0 {
            if let Ok(mut s) = self.inner.sleepers.lock() {
                s.remove(&self.id);
            }
            return Poll::Ready(());
        }
        if let Ok(mut s) = self.inner.sleepers.lock() {
            s.insert(self.id, (self.deadline, cx.waker().clone()));
        }
        // Re-check: an advance between the load and the insert would otherwise be missed.
        if self.inner.now.load(Ordering::SeqCst) >= self.deadline.0 {
            if let Ok(mut s) = self.inner.sleepers.lock() {
                s.remove(&self.id);
            }
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

impl Drop for ManualSleep {
    fn drop(&mut self) {
        if let Ok(mut s) = self.inner.sleepers.lock() {
            s.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::task::Wake;

    struct Flag(AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn manual_sleep_wakes_only_at_deadline() {
        let clock = ManualClock::new(Timestamp(1_000));
        let mut sleep = clock.sleep_until(Timestamp(1_500));
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        let waker = Waker::from(flag.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(sleep.as_mut().poll(&mut cx).is_pending());
        clock.advance(Duration::from_millis(499));
        assert!(!flag.0.load(Ordering::SeqCst), "woken early");
        assert!(sleep.as_mut().poll(&mut cx).is_pending());
        clock.advance(Duration::from_millis(1));
        assert!(flag.0.load(Ordering::SeqCst));
        assert!(sleep.as_mut().poll(&mut cx).is_ready());
        assert_eq!(clock.sleepers(), 0);
    }

    #[test]
    fn dropped_sleep_unregisters() {
        let clock = ManualClock::new(Timestamp(0));
        let mut sleep = clock.sleep_until(Timestamp(10));
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        let waker = Waker::from(flag);
        let mut cx = Context::from_waker(&waker);
        assert!(sleep.as_mut().poll(&mut cx).is_pending());
        assert_eq!(clock.sleepers(), 1);
        drop(sleep);
        assert_eq!(clock.sleepers(), 0);
    }

    #[test]
    fn timestamp_arithmetic_saturates() {
        assert_eq!(Timestamp(5).since(Timestamp(10)), Duration::ZERO);
        assert_eq!(Timestamp(10).since(Timestamp(4)), Duration::from_millis(6));
        assert_eq!(
            Timestamp(i64::MAX - 1).saturating_add(Duration::from_secs(10)),
            Timestamp(i64::MAX)
        );
        assert!(!Timestamp(-1).is_in_range());
        assert!(Timestamp::MAX.is_in_range());
        assert!(!Timestamp(Timestamp::MAX.0 + 1).is_in_range());
    }
}

//! The wall clock. [`SystemClock`] is the only place in Sundial that reads the system time
//! (`SystemTime::now`); everything else asks a [`Clock`]. Its sleeps are tokio timers, re-checked
//! against the wall clock on waking so that a sleep never ends before its deadline even when the
//! timer rounds or the wall clock steps.
//!
//! A tokio timer measures elapsed (monotonic) time, so it does not notice the wall clock being
//! stepped while it sleeps. A sleep is therefore cut into timers of at most [`MAX_TIMER`], each
//! followed by a fresh reading: when the wall clock steps forward past a deadline (an NTP
//! correction, a resumed virtual machine), the sleep ends within that much, however far the
//! deadline was when it was armed. (A step back makes a sleep last longer by the step, as it must:
//! it never ends before its deadline by the clock.)

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sundial_core::{Clock, Timestamp, time::Sleep};

/// The system's wall clock (UTC milliseconds) with tokio's timer for sleeping.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

/// The longest single timer of a sleep: a step of the wall clock (or of an [`OffsetClock`]'s
/// offset) is noticed within this.
pub const MAX_TIMER: Duration = Duration::from_secs(1);

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)] // the one sanctioned wall-clock read
    fn now(&self) -> Timestamp {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        Timestamp(ms)
    }

    fn sleep_until(&self, deadline: Timestamp) -> Sleep {
        Box::pin(async move {
            loop {
                // The timer is armed for what is left to the microsecond, not from a reading
                // rounded down to the millisecond: that would sleep up to a millisecond too long
                // before tokio's own rounding up to its next tick.
                let left = timer_left(wall_micros(), deadline);
                if left.is_zero() {
                    return;
                }
                tokio::time::sleep(left.min(MAX_TIMER)).await;
            }
        })
    }

    /// The timer until a millisecond before the deadline, then a thread of tokio's blocking pool
    /// sleeps out the rest, to the microsecond: tokio's timer wakes on its millisecond ticks and
    /// its driver parks for whole milliseconds, so a sleep on it alone ends up to a millisecond
    /// or two after the deadline.
    fn sleep_until_on_time(&self, deadline: Timestamp) -> Sleep {
        Box::pin(async move {
            self::SystemClock
                .sleep_until(Timestamp(deadline.0.saturating_sub(FINE_WAIT_MS)))
                .await;
            loop {
                let left = timer_left(wall_micros(), deadline);
                if left.is_zero() {
                    return;
                }
                if left > Duration::from_millis(FINE_WAIT_MS as u64 + 1) {
                    // The wall clock stepped back meanwhile: the coarse timer again.
                    self::SystemClock.sleep_until(deadline).await;
                    return;
                }
                if tokio::task::spawn_blocking(move || std::thread::sleep(left))
                    .await
                    .is_err()
                {
                    // No blocking thread (the runtime is shutting down): the coarse timer.
                    self::SystemClock.sleep_until(deadline).await;
                    return;
                }
            }
        })
    }
}

/// How long before a deadline [`SystemClock::sleep_until_on_time`] hands over from tokio's
/// timer to a finer sleep (ms).
const FINE_WAIT_MS: i64 = 1;

/// The wall clock in microseconds since the epoch (the sleeps' finer reading).
#[allow(clippy::disallowed_methods)] // the one sanctioned wall-clock read
fn wall_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// How soon after a millisecond boundary of the wall clock [`align_timer_ticks`] returns (µs).
const ALIGNED_WITHIN_US: i64 = 50;

/// The longest [`align_timer_ticks`] spins (µs): a millisecond and then some, should the thread
/// be descheduled right at the window.
const ALIGN_GIVE_UP_US: i64 = 3_000;

/// Whether `now_us` (µs since the epoch) lies just after a millisecond boundary.
fn just_after_a_millisecond(now_us: i64) -> bool {
    now_us.rem_euclid(1_000) < ALIGNED_WITHIN_US
}

/// Waits, spinning for at most about a millisecond, until the wall clock has just passed a
/// millisecond boundary. Call it right before building the tokio runtime that runs Sundial.
///
/// tokio's timer counts whole milliseconds from the moment its runtime was built, and ends a
/// sleep at the first of those ticks at or after its deadline. Due times are whole milliseconds
/// of the wall clock, so with ticks at a random phase every timed start (a run or a poll's answer
/// at its due time) ends up to a millisecond late, by the same amount for the whole life of the
/// process. Built right after a boundary, the ticks fall just after the wall clock's
/// milliseconds, and a sleep until a due time ends in the tick that follows it.
pub fn align_timer_ticks() {
    let start = wall_micros();
    loop {
        let now = wall_micros();
        if just_after_a_millisecond(now) || now.saturating_sub(start) > ALIGN_GIVE_UP_US {
            return;
        }
        std::hint::spin_loop();
    }
}

/// How long a timer armed at `now_us` (microseconds) must run for the clock to read `deadline`
/// (milliseconds, which `now` reaches at the deadline's first microsecond): zero once there.
fn timer_left(now_us: i64, deadline: Timestamp) -> Duration {
    let left = deadline.0.saturating_mul(1_000).saturating_sub(now_us);
    Duration::from_micros(left.max(0) as u64)
}

/// A clock corrected by a measured offset: `inner.now() + offset`.
///
/// With several nodes, each node's engine runs on the database's time rather than its own wall
/// clock: at start, and again every `Config::clock_check_interval`, the node reads the
/// database's clock, and the offset is
/// the difference minus half the round trip and one more millisecond, so the corrected clock is
/// never ahead of the database's. Due decisions on every node therefore agree with one clock to
/// within a round trip, and a node never fires early because its own clock runs fast.
pub struct OffsetClock {
    inner: Arc<dyn Clock>,
    offset_ms: Arc<AtomicI64>,
}

impl OffsetClock {
    pub fn new(inner: Arc<dyn Clock>, offset_ms: i64) -> Self {
        OffsetClock {
            inner,
            offset_ms: Arc::new(AtomicI64::new(offset_ms)),
        }
    }
    /// The uncorrected clock.
    pub fn inner(&self) -> &Arc<dyn Clock> {
        &self.inner
    }
    pub fn offset_ms(&self) -> i64 {
        self.offset_ms.load(Ordering::Acquire)
    }
    pub fn set_offset_ms(&self, ms: i64) {
        self.offset_ms.store(ms, Ordering::Release);
    }
    /// The conservative offset from one measurement: the database said `db` somewhere between the
    /// local readings `before` and `after`.
    pub fn estimate(before: Timestamp, db: Timestamp, after: Timestamp) -> i64 {
        // The reading was taken at some local time in [before, after]; the smallest offset that
        // fits is `db - after`, and one more millisecond covers truncation to milliseconds.
        let _ = before;
        db.0 - after.0 - 1
    }
}

impl Clock for OffsetClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.inner.now().0.saturating_add(self.offset_ms()))
    }

    fn sleep_until(&self, deadline: Timestamp) -> Sleep {
        let inner = self.inner.clone();
        let offset = self.offset_ms.clone();
        Box::pin(async move {
            // Re-checked against the corrected time on waking: an offset change between arming
            // and waking must not end the sleep early. Each inner sleep lasts at most
            // `MAX_TIMER` by the inner clock, so a change that brings the deadline closer is
            // noticed within that.
            loop {
                let off = offset.load(Ordering::Acquire);
                let now = inner.now();
                if now.0.saturating_add(off) >= deadline.0 {
                    return;
                }
                let until =
                    Timestamp(deadline.0.saturating_sub(off)).min(now.saturating_add(MAX_TIMER));
                inner.sleep_until(until).await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sundial_core::ManualClock;

    /// A sleep for a start on time never ends before its deadline, on the multi-thread runtime
    /// the binaries use and on a current-thread one, and ends within the fine wait of it on a
    /// machine that is not starved (the bound here is loose: a test is no benchmark).
    #[test]
    fn a_sleep_on_time_never_ends_early() {
        for multi in [true, false] {
            let rt = if multi {
                tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .build()
            } else {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
            }
            .unwrap();
            rt.block_on(async {
                for ahead in [0, 1, 2, 7] {
                    let deadline = Timestamp(SystemClock.now().0 + ahead);
                    SystemClock.sleep_until_on_time(deadline).await;
                    let woke = wall_micros();
                    assert!(woke >= deadline.0 * 1_000, "ended before {deadline:?}");
                    assert!(woke < deadline.0 * 1_000 + 1_000_000);
                }
            });
        }
    }

    #[test]
    fn the_timer_is_aligned_just_after_a_millisecond_boundary() {
        assert!(just_after_a_millisecond(1_700_000_000_000_000));
        assert!(just_after_a_millisecond(1_700_000_000_000_049));
        assert!(!just_after_a_millisecond(1_700_000_000_000_050));
        assert!(!just_after_a_millisecond(1_700_000_000_000_999));
        // Before the epoch too (a clock set back that far still spins no longer than its bound).
        assert!(just_after_a_millisecond(-1_000));
        assert!(!just_after_a_millisecond(-1));
        // It returns within its bound whatever the phase.
        let before = wall_micros();
        align_timer_ticks();
        assert!(wall_micros() - before <= ALIGN_GIVE_UP_US + 100_000);
    }

    #[test]
    fn a_sleep_is_armed_for_what_is_left_to_the_microsecond() {
        // 0.1 ms before the deadline: 100 µs, not the 1 ms a millisecond reading would give.
        assert_eq!(
            timer_left(999_900, Timestamp(1_000)),
            Duration::from_micros(100)
        );
        assert_eq!(timer_left(1_000_000, Timestamp(1_000)), Duration::ZERO);
        assert_eq!(timer_left(1_000_999, Timestamp(1_000)), Duration::ZERO);
        assert_eq!(
            timer_left(0, Timestamp(2_500)),
            Duration::from_millis(2_500)
        );
    }

    #[test]
    fn estimate_is_never_ahead_of_the_database() {
        // Local clock 500 ms behind the database; round trip 4 ms.
        let before = Timestamp(1_000);
        let after = Timestamp(1_004);
        let db = Timestamp(1_502); // taken mid-way
        let off = OffsetClock::estimate(before, db, after);
        assert!(
            after.0 + off <= db.0,
            "corrected time ahead of the database"
        );
        assert!(off >= 495, "{off}");
    }

    #[test]
    fn offset_applies_to_now() {
        let m = ManualClock::new(Timestamp(10_000));
        let c = OffsetClock::new(Arc::new(m.clone()), -250);
        assert_eq!(c.now(), Timestamp(9_750));
        m.advance(Duration::from_millis(5));
        assert_eq!(c.now(), Timestamp(9_755));
    }
}

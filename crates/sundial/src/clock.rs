//! The wall clock. [`SystemClock`] is the only place in Sundial that reads the system time
//! (`SystemTime::now`); everything else asks a [`Clock`]. Its sleeps are tokio timers, re-checked
//! against the wall clock on waking so that a sleep never ends before its deadline even when the
//! timer rounds or the wall clock steps.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sundial_core::{Clock, Timestamp, time::Sleep};

/// The system's wall clock (UTC milliseconds) with tokio's timer for sleeping.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

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
        let clock = *self;
        Box::pin(async move {
            loop {
                let now = clock.now();
                if now >= deadline {
                    return;
                }
                tokio::time::sleep(Duration::from_millis((deadline.0 - now.0) as u64)).await;
            }
        })
    }
}

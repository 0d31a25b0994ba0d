//! Retry policy: exponential backoff with jitter.
//!
//! The delay before attempt `n + 1`, after attempt `n` failed, is
//! `min(initial * factor^(n-1), max)` shortened by up to `jitter` of itself (so retries of many
//! tasks that failed together spread out, and no delay ever exceeds `max`). The random draw is a
//! parameter: this module stays deterministic.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ValidationError;

/// How long to wait between attempts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Backoff {
    /// Delay after the first failed attempt, in milliseconds (read also from a duration string,
    /// `"5s"`; written as the number).
    #[serde(deserialize_with = "crate::duration::millis")]
    pub initial_ms: u64,
    /// Multiplier applied for every further attempt (>= 1).
    pub factor: f64,
    /// Upper bound for any delay, in milliseconds (read also from a duration string, `"1h"`).
    #[serde(deserialize_with = "crate::duration::millis")]
    pub max_ms: u64,
    /// Fraction (0..=1) of the delay that is randomised away.
    pub jitter: f64,
}

impl Default for Backoff {
    /// 5 s, then ×5 per attempt (5 s, 25 s, 125 s, 625 s…), capped at one hour, 20 % jitter.
    fn default() -> Self {
        Backoff {
            initial_ms: 5_000,
            factor: 5.0,
            max_ms: 3_600_000,
            jitter: 0.2,
        }
    }
}

impl Backoff {
    /// A fixed delay with no growth and no jitter.
    pub fn fixed(delay: Duration) -> Self {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        Backoff {
            initial_ms: ms,
            factor: 1.0,
            max_ms: ms,
            jitter: 0.0,
        }
    }

    /// Exponential growth from `initial` by `factor`, capped at `max`, with the default jitter.
    pub fn exponential(initial: Duration, factor: f64, max: Duration) -> Self {
        Backoff {
            initial_ms: u64::try_from(initial.as_millis()).unwrap_or(u64::MAX),
            factor,
            max_ms: u64::try_from(max.as_millis()).unwrap_or(u64::MAX),
            jitter: 0.2,
        }
    }

    pub fn validate(&self) -> Result<(), ValidationError> {
        let bad = |reason: &str| {
            Err(ValidationError::OutOfRange {
                field: "backoff",
                reason: reason.to_string(),
            })
        };
        if !self.factor.is_finite() || self.factor < 1.0 || self.factor > 100.0 {
            return bad("factor must be between 1 and 100");
        }
        if !self.jitter.is_finite() || !(0.0..=1.0).contains(&self.jitter) {
            return bad("jitter must be between 0 and 1");
        }
        if self.max_ms < self.initial_ms {
            return bad("max must not be smaller than initial");
        }
        // Ten years: long enough for anything, small enough to keep due times in range.
        if self.max_ms > 315_360_000_000 {
            return bad("max must be at most ten years");
        }
        Ok(())
    }

    /// The delay after failed attempt number `attempt` (1-based). `random` is a draw in `[0, 1)`.
    pub fn delay(&self, attempt: u32, random: f64) -> Duration {
        let exp = attempt.saturating_sub(1).min(1_000) as i32;
        let raw = (self.initial_ms as f64) * self.factor.powi(exp);
        let capped = if raw.is_finite() {
            raw.min(self.max_ms as f64)
        } else {
            self.max_ms as f64
        };
        let r = random.clamp(0.0, 1.0);
        let jittered = capped * (1.0 - self.jitter * r);
        Duration::from_millis(jittered.max(0.0).round() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_schedule_without_jitter() {
        let b = Backoff::default();
        let secs: Vec<u64> = (1..=6).map(|a| b.delay(a, 0.0).as_secs()).collect();
        assert_eq!(secs, vec![5, 25, 125, 625, 3125, 3600]);
    }

    #[test]
    fn jitter_only_shortens_within_bounds() {
        let b = Backoff::default();
        for i in 0..100 {
            let r = f64::from(i) / 100.0;
            let d = b.delay(2, r).as_millis() as u64;
            assert!((20_000..=25_000).contains(&d), "{d}");
        }
        assert_eq!(b.delay(1_000_000, 0.0).as_millis() as u64, b.max_ms);
    }

    #[test]
    fn rejects_nonsense() {
        for b in [
            Backoff {
                factor: 0.5,
                ..Backoff::default()
            },
            Backoff {
                jitter: 1.5,
                ..Backoff::default()
            },
            Backoff {
                max_ms: 1,
                ..Backoff::default()
            },
        ] {
            assert!(b.validate().is_err(), "{b:?}");
        }
        assert!(Backoff::fixed(Duration::from_secs(1)).validate().is_ok());
    }
}

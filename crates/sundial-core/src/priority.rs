//! Task priorities and the rule that orders due work by them.
//!
//! A task's priority is 0 to 9 (default 5; 9 the most urgent). Priority never changes *when* a
//! task may start (never before its due time); it changes the order in which tasks that are all
//! due compete for what is free (a handler's concurrency, a receiver's slots, a worker's poll).
//!
//! **The rule (time credit):** among due tasks, a task's place in line is its due time moved
//! earlier by `(priority − 5) ×` [`Priority::STEP_MS`] (one minute): priority 9 is served as if it
//! were due four minutes earlier, priority 0 as if five minutes later. So among tasks due at the
//! same time (or within a minute of each other), higher priority starts first; and a task is never
//! passed by higher-priority work that became due more than `(9 − 0) × STEP` = nine minutes after
//! it, so a steady stream of urgent work cannot starve the rest forever: an older task's rank
//! comes first once the stream's due times have moved on by that much. Ties go to the smaller id.
//!
//! This module is pure: no I/O, no clock.

use serde::{Deserialize, Serialize};

use crate::error::ValidationError;
use crate::time::Timestamp;

/// A task's priority, 0..=9 ([`Priority::DEFAULT`] is 5, [`Priority::MAX`] the most urgent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "u8", into = "u8")]
pub struct Priority(u8);

impl Priority {
    pub const MIN: Priority = Priority(0);
    pub const DEFAULT: Priority = Priority(5);
    pub const MAX: Priority = Priority(9);
    /// How far one priority level moves a task's place in line, in milliseconds of due time.
    pub const STEP_MS: i64 = 60_000;

    /// The priority `p`, refused outside 0..=9.
    pub fn new(p: u8) -> Result<Priority, ValidationError> {
        if p > Self::MAX.0 {
            return Err(ValidationError::OutOfRange {
                field: "priority",
                reason: "must be between 0 and 9 (9 the most urgent)".into(),
            });
        }
        Ok(Priority(p))
    }

    /// The priority as stored (0..=9). A stored value outside the range reads as the nearest
    /// bound; the stores' column checks keep it from happening.
    pub fn from_stored(p: i64) -> Priority {
        Priority(p.clamp(0, i64::from(Self::MAX.0)) as u8)
    }

    pub fn get(self) -> u8 {
        self.0
    }

    /// Whether this is [`Priority::DEFAULT`] (stored forms leave the default out).
    pub fn is_default(&self) -> bool {
        *self == Self::DEFAULT
    }

    /// How many milliseconds earlier than its due time a task of this priority ranks (negative
    /// for priorities below the default).
    pub fn credit_ms(self) -> i64 {
        (i64::from(self.0) - i64::from(Self::DEFAULT.0)) * Self::STEP_MS
    }

    /// The place in line of a task of this priority due at `due_at` (smaller goes first). The
    /// stores order ready tasks by the same expression: `due_at - (priority - 5) * 60000`.
    pub fn rank(self, due_at: Timestamp) -> i64 {
        due_at.0.saturating_sub(self.credit_ms())
    }
}

impl Default for Priority {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl TryFrom<u8> for Priority {
    type Error = ValidationError;
    fn try_from(p: u8) -> Result<Self, Self::Error> {
        Priority::new(p)
    }
}

impl From<Priority> for u8 {
    fn from(p: Priority) -> u8 {
        p.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priorities_outside_zero_to_nine_are_refused() {
        assert!(Priority::new(0).is_ok());
        assert!(Priority::new(9).is_ok());
        let err = Priority::new(10).unwrap_err();
        assert!(err.to_string().contains("priority"), "{err}");
        assert!(serde_json::from_str::<Priority>("10").is_err());
        assert_eq!(serde_json::from_str::<Priority>("7").unwrap(), Priority(7));
    }

    #[test]
    fn among_tasks_due_together_higher_priority_ranks_first() {
        let at = Timestamp(1_000_000);
        let urgent = Priority::new(9).unwrap().rank(at);
        let normal = Priority::DEFAULT.rank(at);
        let low = Priority::MIN.rank(at);
        assert!(urgent < normal && normal < low);
        assert_eq!(normal, at.0);
    }

    #[test]
    fn urgent_work_due_nine_steps_later_no_longer_passes_the_lowest() {
        let old_low = Priority::MIN.rank(Timestamp(0));
        let just_within = Priority::MAX.rank(Timestamp(9 * Priority::STEP_MS - 1));
        let past = Priority::MAX.rank(Timestamp(9 * Priority::STEP_MS + 1));
        assert!(just_within < old_low, "still passes");
        assert!(past > old_low, "no longer passes");
    }
}

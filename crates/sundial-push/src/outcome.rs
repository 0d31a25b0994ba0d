//! What a push call's answer means for the task: a pure function of the status, the headers
//! that matter and the target's wishes.
//!
//! | answer | attempt |
//! | --- | --- |
//! | 2xx | succeeded; body (up to 64 KiB) and content type kept as the result |
//! | 429, 5xx, timeout, connection error | failed, retryable; `Retry-After` honoured within the backoff cap |
//! | 410 Gone | the task ends `dead` with the reason |
//! | other 4xx (and 1xx, 3xx) | failed, not retryable, unless the status is in the target's `retry_statuses` |

use std::time::Duration;

/// How one call ended, as far as the task is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Succeeded,
    Retry {
        /// The receiver's `Retry-After`, when it gave one (the engine caps it by the backoff cap).
        after: Option<Duration>,
    },
    /// Not retryable: the task ends `dead`.
    Dead,
}

/// Classifies an HTTP status. `retry_statuses` are the target's extra retryable 4xx statuses.
pub fn classify_status(
    status: u16,
    retry_after: Option<Duration>,
    retry_statuses: &[u16],
) -> Verdict {
    match status {
        200..=299 => Verdict::Succeeded,
        429 | 500..=599 => Verdict::Retry { after: retry_after },
        410 => Verdict::Dead,
        s if retry_statuses.contains(&s) => Verdict::Retry { after: retry_after },
        _ => Verdict::Dead,
    }
}

/// Parses a `Retry-After` value: delay seconds, or an HTTP date relative to `now_unix_ms`.
/// Anything else is ignored (the task's own backoff applies).
pub fn parse_retry_after(value: &str, now_unix_ms: i64) -> Option<Duration> {
    let v = value.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = jiff::fmt::rfc2822::parse(v).ok()?;
    let ms = at.timestamp().as_millisecond() - now_unix_ms;
    Some(Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        let s = Duration::from_secs;
        assert_eq!(classify_status(200, None, &[]), Verdict::Succeeded);
        assert_eq!(classify_status(204, None, &[]), Verdict::Succeeded);
        assert_eq!(
            classify_status(429, Some(s(3)), &[]),
            Verdict::Retry { after: Some(s(3)) }
        );
        assert_eq!(
            classify_status(500, None, &[]),
            Verdict::Retry { after: None }
        );
        assert_eq!(
            classify_status(503, None, &[]),
            Verdict::Retry { after: None }
        );
        assert_eq!(classify_status(410, None, &[410]), Verdict::Dead);
        assert_eq!(classify_status(404, None, &[]), Verdict::Dead);
        assert_eq!(classify_status(400, None, &[]), Verdict::Dead);
        assert_eq!(
            classify_status(404, None, &[404]),
            Verdict::Retry { after: None }
        );
        assert_eq!(classify_status(302, None, &[]), Verdict::Dead);
    }

    #[test]
    fn retry_after_forms() {
        let now = 784_111_777_000; // Sun, 06 Nov 1994 08:49:37 GMT
        assert_eq!(
            parse_retry_after("120", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:50:37 GMT", now),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:40:37 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-5", now), None);
    }
}

//! How the pages write times, durations and JSON.

use std::time::Duration;

use sundial::Timestamp;

use crate::duration::WireDuration;

/// `2026-12-01 13:30:05Z` (UTC, to the second; the title attribute carries the full RFC 3339).
pub(crate) fn at(t: Timestamp) -> String {
    let full = crate::time::format(t);
    // RFC 3339 with milliseconds: `2026-12-01T13:30:05.123Z`.
    match full.get(..19) {
        Some(s) => format!("{}Z", s.replace('T', " ")),
        None => full,
    }
}

/// The full RFC 3339 form (for `title` and `datetime` attributes).
pub(crate) fn rfc3339(t: Timestamp) -> String {
    crate::time::format(t)
}

/// `in 5m` or `3m ago`, relative to `now`.
pub(crate) fn relative(t: Timestamp, now: Timestamp) -> String {
    if t.0 >= now.0 {
        format!("in {}", short(Duration::from_millis((t.0 - now.0) as u64)))
    } else {
        format!("{} ago", short(Duration::from_millis((now.0 - t.0) as u64)))
    }
}

/// A duration in the API's form, rounded to what a reader needs (`1h30m`, `4.2s`, `350ms`).
pub(crate) fn short(d: Duration) -> String {
    let ms = d.as_millis() as u64;
    if ms < 1_000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else {
        WireDuration(Duration::from_secs(ms / 1000)).to_string()
    }
}

/// Pretty JSON for `<pre>`.
pub(crate) fn json(v: &serde_json::Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
}

/// The first line of an error, at most 160 characters (for lists and grouping).
pub(crate) fn first_line(s: &str) -> String {
    let line = s.lines().next().unwrap_or("");
    if line.chars().count() > 160 {
        let cut: String = line.chars().take(159).collect();
        format!("{cut}…")
    } else {
        line.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_well() {
        let t = Timestamp(1_764_595_805_123);
        assert_eq!(at(t), "2025-12-01 13:30:05Z");
        assert_eq!(relative(Timestamp(t.0 + 90_000), t), "in 1m30s");
        assert_eq!(relative(Timestamp(t.0 - 500), t), "500ms ago");
        assert_eq!(short(Duration::from_millis(4_250)), "4.2s");
    }
}

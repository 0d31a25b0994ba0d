//! Next-fire tables across DST transitions, leap days, month ends and the cron extensions, plus the
//! validation errors. Each row lists the fire times as local time with its UTC offset, so a reader
//! can check them against a wall clock.
#![allow(clippy::unwrap_used)]

use sundial_core::Timestamp;
use sundial_core::schedule::{
    RepeatedTime, ScheduleSpec, SkippedTime, SpecErrorKind, from_jiff, to_jiff,
};

/// The first `n` fire times strictly after `from` (RFC 3339 with offset, or a zoned datetime
/// `2024-03-10T00:00[America/New_York]`), formatted as local time with offset.
fn fires(spec: &ScheduleSpec, from: &str, n: usize) -> Vec<String> {
    let compiled = spec.compile().unwrap();
    let tz = sundial_core::schedule::time_zone(&spec.timezone).unwrap();
    let start: jiff::Timestamp = match from.parse::<jiff::Zoned>() {
        Ok(z) => z.timestamp(),
        Err(_) => from.parse().unwrap(),
    };
    compiled
        .fires_after(from_jiff(start))
        .take(n)
        .map(|t| {
            to_jiff(t)
                .unwrap()
                .to_zoned(tz.clone())
                .strftime("%Y-%m-%dT%H:%M:%S%:z")
                .to_string()
        })
        .collect()
}

fn cron(expr: &str, tz: &str) -> ScheduleSpec {
    ScheduleSpec::cron(expr).timezone(tz)
}

fn check(spec: ScheduleSpec, from: &str, expected: &[&str]) {
    let got = fires(&spec, from, expected.len());
    assert_eq!(
        got, expected,
        "{:?} in {} ({:?}) from {from}",
        spec.recurrence, spec.timezone, spec.dst
    );
}

const NY: &str = "America/New_York";
const BERLIN: &str = "Europe/Berlin";
const LORD_HOWE: &str = "Australia/Lord_Howe";
const SHANGHAI: &str = "Asia/Shanghai";

// ---- America/New_York: 2024-03-10 02:00 → 03:00, 2024-11-03 02:00 → 01:00 --------------------

#[test]
fn new_york_hourly_spring_forward() {
    check(
        cron("0 * * * *", NY),
        "2024-03-10T00:30[America/New_York]",
        &[
            "2024-03-10T01:00:00-05:00",
            "2024-03-10T03:00:00-04:00",
            "2024-03-10T04:00:00-04:00",
        ],
    );
    // Skip changes nothing for an every-hour expression: 03:00 is a match of its own.
    check(
        cron("0 * * * *", NY).dst(SkippedTime::Skip, RepeatedTime::First),
        "2024-03-10T00:30[America/New_York]",
        &["2024-03-10T01:00:00-05:00", "2024-03-10T03:00:00-04:00"],
    );
}

#[test]
fn new_york_hourly_fall_back_fires_every_real_hour() {
    for repeated in [RepeatedTime::First, RepeatedTime::Last, RepeatedTime::Both] {
        check(
            cron("0 * * * *", NY).dst(SkippedTime::Shift, repeated),
            "2024-11-03T00:30[America/New_York]",
            &[
                "2024-11-03T01:00:00-04:00",
                "2024-11-03T01:00:00-05:00",
                "2024-11-03T02:00:00-05:00",
            ],
        );
    }
}

#[test]
fn new_york_daily_in_the_gap() {
    // 02:30 does not exist on 2024-03-10.
    check(
        cron("30 2 * * *", NY),
        "2024-03-09T12:00[America/New_York]",
        &["2024-03-10T03:00:00-04:00", "2024-03-11T02:30:00-04:00"],
    );
    check(
        cron("30 2 * * *", NY).dst(SkippedTime::Skip, RepeatedTime::First),
        "2024-03-09T12:00[America/New_York]",
        &["2024-03-11T02:30:00-04:00"],
    );
}

#[test]
fn new_york_daily_in_the_repeated_hour() {
    let from = "2024-11-02T12:00[America/New_York]";
    check(
        cron("30 1 * * *", NY),
        from,
        &["2024-11-03T01:30:00-04:00", "2024-11-04T01:30:00-05:00"],
    );
    check(
        cron("30 1 * * *", NY).dst(SkippedTime::Shift, RepeatedTime::Last),
        from,
        &["2024-11-03T01:30:00-05:00", "2024-11-04T01:30:00-05:00"],
    );
    check(
        cron("30 1 * * *", NY).dst(SkippedTime::Shift, RepeatedTime::Both),
        from,
        &[
            "2024-11-03T01:30:00-04:00",
            "2024-11-03T01:30:00-05:00",
            "2024-11-04T01:30:00-05:00",
        ],
    );
}

#[test]
fn new_york_every_minute_through_both_transitions() {
    check(
        cron("* * * * *", NY),
        "2024-03-10T01:57:30[America/New_York]",
        &[
            "2024-03-10T01:58:00-05:00",
            "2024-03-10T01:59:00-05:00",
            "2024-03-10T03:00:00-04:00",
            "2024-03-10T03:01:00-04:00",
        ],
    );
    check(
        cron("* * * * *", NY),
        "2024-11-03T01:58:00-04:00",
        &[
            "2024-11-03T01:59:00-04:00",
            "2024-11-03T01:00:00-05:00",
            "2024-11-03T01:01:00-05:00",
        ],
    );
    // Starting inside the second copy of the repeated hour.
    check(
        cron("* * * * *", NY),
        "2024-11-03T01:58:30-05:00",
        &["2024-11-03T01:59:00-05:00", "2024-11-03T02:00:00-05:00"],
    );
}

#[test]
fn new_york_every_second_through_both_transitions() {
    check(
        cron("* * * * * *", NY),
        "2024-03-10T01:59:58-05:00",
        &[
            "2024-03-10T01:59:59-05:00",
            "2024-03-10T03:00:00-04:00",
            "2024-03-10T03:00:01-04:00",
        ],
    );
    check(
        cron("* * * * * *", NY),
        "2024-11-03T01:59:58-04:00",
        &[
            "2024-11-03T01:59:59-04:00",
            "2024-11-03T01:00:00-05:00",
            "2024-11-03T01:00:01-05:00",
        ],
    );
}

#[test]
fn croner_doubles_fixed_hour_lists() {
    // Regression: croner's own instant resolution treats `0 1,13 * * *` as an interval job (an
    // hour list) and fires 01:00 twice on the fall-back day. The policy here fires it once.
    use std::str::FromStr;
    let c = croner::Cron::from_str("0 1,13 * * *").unwrap();
    let start: jiff::Zoned = "2024-11-03T00:30[America/New_York]".parse().unwrap();
    let first = c.find_next_occurrence(&start, false).unwrap();
    let second = c.find_next_occurrence(&first, false).unwrap();
    assert_eq!(first.hour(), 1);
    assert_eq!(second.hour(), 1, "croner fires the repeated 01:00 twice");
    check(
        cron("0 1,13 * * *", NY),
        "2024-11-03T00:30[America/New_York]",
        &["2024-11-03T01:00:00-04:00", "2024-11-03T13:00:00-05:00"],
    );
}

#[test]
fn hour_restricted_steps_follow_the_repeated_policy() {
    // Every 20 minutes during the 1 o'clock hour: `first` runs that hour once.
    check(
        cron("*/20 1 * * *", NY),
        "2024-11-03T00:30[America/New_York]",
        &[
            "2024-11-03T01:00:00-04:00",
            "2024-11-03T01:20:00-04:00",
            "2024-11-03T01:40:00-04:00",
            "2024-11-04T01:00:00-05:00",
        ],
    );
    check(
        cron("*/20 1 * * *", NY).dst(SkippedTime::Shift, RepeatedTime::Last),
        "2024-11-03T00:30[America/New_York]",
        &[
            "2024-11-03T01:00:00-05:00",
            "2024-11-03T01:20:00-05:00",
            "2024-11-03T01:40:00-05:00",
            "2024-11-04T01:00:00-05:00",
        ],
    );
    // Starting in the second copy with `first`: the rest of that copy is skipped.
    check(
        cron("*/20 1 * * *", NY),
        "2024-11-03T01:10:00-05:00",
        &["2024-11-04T01:00:00-05:00"],
    );
}

// ---- Europe/Berlin: 2024-03-31 02:00 → 03:00, 2024-10-27 03:00 → 02:00 --------------------------

#[test]
fn berlin_hourly_and_daily() {
    check(
        cron("0 * * * *", BERLIN),
        "2024-03-31T00:30[Europe/Berlin]",
        &["2024-03-31T01:00:00+01:00", "2024-03-31T03:00:00+02:00"],
    );
    check(
        cron("0 * * * *", BERLIN),
        "2024-10-27T01:30[Europe/Berlin]",
        &[
            "2024-10-27T02:00:00+02:00",
            "2024-10-27T02:00:00+01:00",
            "2024-10-27T03:00:00+01:00",
        ],
    );
    check(
        cron("15 2 * * *", BERLIN),
        "2024-03-30T12:00[Europe/Berlin]",
        &["2024-03-31T03:00:00+02:00", "2024-04-01T02:15:00+02:00"],
    );
    check(
        cron("15 2 * * *", BERLIN),
        "2024-10-26T12:00[Europe/Berlin]",
        &["2024-10-27T02:15:00+02:00", "2024-10-28T02:15:00+01:00"],
    );
    check(
        cron("15 2 * * *", BERLIN).dst(SkippedTime::Skip, RepeatedTime::Both),
        "2024-10-26T12:00[Europe/Berlin]",
        &[
            "2024-10-27T02:15:00+02:00",
            "2024-10-27T02:15:00+01:00",
            "2024-10-28T02:15:00+01:00",
        ],
    );
}

#[test]
fn berlin_every_minute_and_second() {
    check(
        cron("* * * * *", BERLIN),
        "2024-03-31T01:58:30+01:00",
        &["2024-03-31T01:59:00+01:00", "2024-03-31T03:00:00+02:00"],
    );
    check(
        cron("* * * * *", BERLIN),
        "2024-10-27T02:58:30+02:00",
        &["2024-10-27T02:59:00+02:00", "2024-10-27T02:00:00+01:00"],
    );
    check(
        cron("*/30 * * * * *", BERLIN),
        "2024-10-27T02:59:00+02:00",
        &[
            "2024-10-27T02:59:30+02:00",
            "2024-10-27T02:00:00+01:00",
            "2024-10-27T02:00:30+01:00",
        ],
    );
}

// ---- Australia/Lord_Howe: half-hour shifts. 2024-04-07 02:00 → 01:30, 2024-10-06 02:00 → 02:30 --

#[test]
fn lord_howe_half_hour_gap() {
    check(
        cron("* * * * *", LORD_HOWE),
        "2024-10-06T01:58:30+10:30",
        &[
            "2024-10-06T01:59:00+10:30",
            "2024-10-06T02:30:00+11:00",
            "2024-10-06T02:31:00+11:00",
        ],
    );
    check(
        cron("0 * * * *", LORD_HOWE),
        "2024-10-06T00:30[Australia/Lord_Howe]",
        &[
            "2024-10-06T01:00:00+10:30",
            "2024-10-06T02:30:00+11:00",
            "2024-10-06T03:00:00+11:00",
        ],
    );
    check(
        cron("0 * * * *", LORD_HOWE).dst(SkippedTime::Skip, RepeatedTime::First),
        "2024-10-06T00:30[Australia/Lord_Howe]",
        &["2024-10-06T01:00:00+10:30", "2024-10-06T03:00:00+11:00"],
    );
    check(
        cron("15 2 * * *", LORD_HOWE),
        "2024-10-05T12:00[Australia/Lord_Howe]",
        &["2024-10-06T02:30:00+11:00", "2024-10-07T02:15:00+11:00"],
    );
}

#[test]
fn lord_howe_half_hour_repeat() {
    check(
        cron("* * * * *", LORD_HOWE),
        "2024-04-07T01:58:30+11:00",
        &[
            "2024-04-07T01:59:00+11:00",
            "2024-04-07T01:30:00+10:30",
            "2024-04-07T01:31:00+10:30",
        ],
    );
    check(
        cron("45 1 * * *", LORD_HOWE),
        "2024-04-06T12:00[Australia/Lord_Howe]",
        &["2024-04-07T01:45:00+11:00", "2024-04-08T01:45:00+10:30"],
    );
    check(
        cron("45 1 * * *", LORD_HOWE).dst(SkippedTime::Shift, RepeatedTime::Last),
        "2024-04-06T12:00[Australia/Lord_Howe]",
        &["2024-04-07T01:45:00+10:30", "2024-04-08T01:45:00+10:30"],
    );
    // 01:15 happens once: not in the repeated half hour.
    check(
        cron("15 1 * * *", LORD_HOWE).dst(SkippedTime::Shift, RepeatedTime::Both),
        "2024-04-06T12:00[Australia/Lord_Howe]",
        &["2024-04-07T01:15:00+11:00", "2024-04-08T01:15:00+10:30"],
    );
}

// ---- Asia/Shanghai: no DST -----------------------------------------------------------------

#[test]
fn shanghai_without_dst() {
    check(
        cron("0 10 * * *", SHANGHAI),
        "2024-03-10T00:00:00Z",
        &["2024-03-10T10:00:00+08:00", "2024-03-11T10:00:00+08:00"],
    );
    check(
        cron("0 * * * *", SHANGHAI),
        "2024-11-03T00:30:00+08:00",
        &["2024-11-03T01:00:00+08:00", "2024-11-03T02:00:00+08:00"],
    );
    check(
        cron("* * * * * *", SHANGHAI),
        "2024-12-31T23:59:58+08:00",
        &["2024-12-31T23:59:59+08:00", "2025-01-01T00:00:00+08:00"],
    );
    check(
        cron("* * * * *", SHANGHAI),
        "2024-12-31T23:59:00+08:00",
        &["2025-01-01T00:00:00+08:00", "2025-01-01T00:01:00+08:00"],
    );
}

// ---- Calendar edges ---------------------------------------------------------------------------

#[test]
fn leap_days() {
    check(
        cron("0 12 29 2 *", "UTC"),
        "2023-01-01T00:00:00Z",
        &[
            "2024-02-29T12:00:00+00:00",
            "2028-02-29T12:00:00+00:00",
            "2032-02-29T12:00:00+00:00",
        ],
    );
    // 2100 is not a leap year.
    check(
        cron("0 0 29 2 *", "UTC"),
        "2096-03-01T00:00:00Z",
        &["2104-02-29T00:00:00+00:00"],
    );
}

#[test]
fn last_day_of_month() {
    check(
        cron("0 0 L * *", BERLIN),
        "2024-01-15T00:00[Europe/Berlin]",
        &[
            "2024-01-31T00:00:00+01:00",
            "2024-02-29T00:00:00+01:00",
            "2024-03-31T00:00:00+01:00", // the clock changes at 02:00
            "2024-04-30T00:00:00+02:00",
        ],
    );
    check(
        cron("0 0 L 2 *", "UTC"),
        "2025-01-01T00:00:00Z",
        &["2025-02-28T00:00:00+00:00", "2026-02-28T00:00:00+00:00"],
    );
    // Last Friday of the month.
    check(
        cron("0 9 * * 5L", "UTC"),
        "2024-01-01T00:00:00Z",
        &["2024-01-26T09:00:00+00:00", "2024-02-23T09:00:00+00:00"],
    );
}

#[test]
fn nth_weekday_and_nearest_weekday() {
    // Second Monday of each month.
    check(
        cron("0 9 * * MON#2", "UTC"),
        "2024-01-01T00:00:00Z",
        &["2024-01-08T09:00:00+00:00", "2024-02-12T09:00:00+00:00"],
    );
    // The weekday nearest the 15th: 2024-06-15 is a Saturday → Friday the 14th.
    check(
        cron("0 0 15W * *", "UTC"),
        "2024-06-01T00:00:00Z",
        &["2024-06-14T00:00:00+00:00", "2024-07-15T00:00:00+00:00"],
    );
}

#[test]
fn macros_names_ranges_steps_lists() {
    check(
        cron("@daily", SHANGHAI),
        "2024-01-01T00:00:00+08:00",
        &["2024-01-02T00:00:00+08:00"],
    );
    check(
        cron("@hourly", "UTC"),
        "2024-01-01T00:00:00Z",
        &["2024-01-01T01:00:00+00:00"],
    );
    check(
        cron("@weekly", "UTC"),
        "2024-01-01T00:00:00Z",
        &["2024-01-07T00:00:00+00:00"],
    );
    check(
        cron("@monthly", "UTC"),
        "2024-01-01T00:00:00Z",
        &["2024-02-01T00:00:00+00:00"],
    );
    check(
        cron("@yearly", "UTC"),
        "2024-01-01T00:00:00Z",
        &["2025-01-01T00:00:00+00:00"],
    );
    check(
        cron("0 9-17/4 * JAN,FEB MON-FRI", "UTC"),
        "2024-01-05T12:00:00Z",
        &[
            "2024-01-05T13:00:00+00:00",
            "2024-01-05T17:00:00+00:00",
            "2024-01-08T09:00:00+00:00",
        ],
    );
    check(
        cron("10,20 */30 * * * *", "UTC"),
        "2024-01-01T00:00:00Z",
        &[
            "2024-01-01T00:00:10+00:00",
            "2024-01-01T00:00:20+00:00",
            "2024-01-01T00:30:10+00:00",
        ],
    );
    // Day of month and day of week both restricted: either one fires (Vixie cron).
    check(
        cron("0 0 13 * FRI", "UTC"),
        "2024-09-01T00:00:00Z",
        &[
            "2024-09-06T00:00:00+00:00",
            "2024-09-13T00:00:00+00:00",
            "2024-09-20T00:00:00+00:00",
        ],
    );
}

#[test]
fn fire_times_are_strictly_after() {
    let spec = cron("0 * * * *", "UTC").compile().unwrap();
    let t = Timestamp(1_704_067_200_000); // 2024-01-01T00:00:00Z, itself a match
    assert_eq!(spec.next_fire_after(t), Some(Timestamp(t.0 + 3_600_000)));
    assert_eq!(
        spec.next_fire_after(Timestamp(t.0 - 1)),
        Some(t),
        "a millisecond before a match"
    );
}

#[test]
fn intervals() {
    use std::time::Duration;
    let every = ScheduleSpec::every(Duration::from_secs(15 * 60))
        .compile()
        .unwrap();
    let t = Timestamp(1_704_067_200_000); // 2024-01-01T00:00:00Z
    assert_eq!(every.next_fire_after(t), Some(Timestamp(t.0 + 900_000)));
    assert_eq!(every.next_fire_after(Timestamp(t.0 - 1)), Some(t));
    let anchored = ScheduleSpec::every(Duration::from_secs(3600))
        .anchor(Timestamp(t.0 + 7 * 60_000))
        .compile()
        .unwrap();
    let got: Vec<i64> = anchored.fires_after(t).take(2).map(|x| x.0 - t.0).collect();
    assert_eq!(got, vec![7 * 60_000, 67 * 60_000]);
    // Anchors in the future still align fire times before them.
    let future = ScheduleSpec::every(Duration::from_secs(10))
        .anchor(Timestamp(t.0 + 1_000_000))
        .compile()
        .unwrap();
    assert_eq!(future.next_fire_after(t), Some(Timestamp(t.0 + 10_000)));
    // DST does not bend intervals: one hour apart in absolute time across the NY change.
    let hourly = ScheduleSpec::every(Duration::from_secs(3600))
        .timezone(NY)
        .compile()
        .unwrap();
    let from: jiff::Timestamp = "2024-03-10T06:00:00Z".parse().unwrap();
    let got: Vec<i64> = hourly
        .fires_after(from_jiff(from))
        .take(3)
        .map(|x| x.0)
        .collect();
    assert_eq!(got[1] - got[0], 3_600_000);
    assert_eq!(got[2] - got[1], 3_600_000);
    // The end of time.
    assert_eq!(every.next_fire_after(Timestamp::MAX), None);
}

// ---- Validation --------------------------------------------------------------------------------

fn err(spec: ScheduleSpec) -> sundial_core::SpecError {
    spec.compile().unwrap_err()
}

#[test]
fn rejects_bad_specs_with_field_and_reason() {
    let e = err(ScheduleSpec::cron("0 0 0 30 2 *"));
    assert_eq!((e.field(), e.kind()), ("cron", SpecErrorKind::NeverFires));
    assert!(e.reason().contains("never fire"), "{e}");

    let e = err(ScheduleSpec::cron("61 * * * * *"));
    assert_eq!(
        (e.field(), e.kind()),
        ("cron", SpecErrorKind::OutOfRange),
        "{e}"
    );
    assert!(e.reason().contains("second field"), "{e}");

    let e = err(ScheduleSpec::cron("* 25 * * *"));
    assert!(e.reason().contains("hour field"), "{e}");
    // The allowed range is named, not only "out of bounds".
    assert!(e.reason().contains("it takes 0-23"), "{e}");
    let e = err(ScheduleSpec::cron("* * * 13 *"));
    assert!(e.reason().contains("month field"), "{e}");
    let e = err(ScheduleSpec::cron("* * * * * * *"));
    assert_eq!(e.kind(), SpecErrorKind::Syntax, "{e}");
    assert!(e.reason().contains("7 fields"), "{e}");
    let e = err(ScheduleSpec::cron("* * *"));
    assert_eq!(e.kind(), SpecErrorKind::Syntax);
    let e = err(ScheduleSpec::cron(""));
    assert_eq!(e.kind(), SpecErrorKind::Syntax);
    let e = err(ScheduleSpec::cron("@reboot"));
    assert!(e.reason().contains("unknown macro"), "{e}");
    let e = err(ScheduleSpec::cron("x * * * *"));
    assert!(e.reason().contains("minute field"), "{e}");
    let e = err(ScheduleSpec::cron("0 0 31 4,6,9,11 *"));
    assert_eq!(e.kind(), SpecErrorKind::NeverFires);

    let e = err(ScheduleSpec::cron("0 * * * *").timezone("Mars/Olympus"));
    assert_eq!(
        (e.field(), e.kind()),
        ("timezone", SpecErrorKind::UnknownTimeZone)
    );
    let e = err(ScheduleSpec::every(std::time::Duration::ZERO));
    assert_eq!((e.field(), e.kind()), ("every", SpecErrorKind::OutOfRange));
    let e = err(ScheduleSpec::every(std::time::Duration::from_millis(999)));
    assert_eq!(e.field(), "every");
}

#[test]
fn accepts_rare_but_real_dates() {
    // The 5th Monday of February happens (2016, 2044): rare, not never.
    assert!(ScheduleSpec::cron("0 0 * 2 MON#5").compile().is_ok());
    assert!(ScheduleSpec::cron("0 0 29 2 *").compile().is_ok());
    assert!(ScheduleSpec::cron("0 0 ? * MON").compile().is_ok());
    assert!(ScheduleSpec::cron("0 0 * * 7").compile().is_ok());
}

// ---- Regression: a walk that starts exactly at a spring-forward transition -----------------------

#[test]
fn shift_fires_when_the_walk_starts_at_the_transition() {
    // America/St_Johns, 2020-03-08: 02:00 (-03:30) → 03:00 (-02:30). From one second before the
    // transition the next whole second *is* the transition; the skipped 02:xx seconds shift there.
    check(
        cron("* * 1,2 * * *", "America/St_Johns"),
        "2020-03-08T01:59:59-03:30",
        &["2020-03-08T03:00:00-02:30", "2020-03-09T01:00:00-02:30"],
    );
    // With `skip` nothing fires in the gap.
    check(
        cron("* * 1,2 * * *", "America/St_Johns").dst(SkippedTime::Skip, RepeatedTime::First),
        "2020-03-08T01:59:59-03:30",
        &["2020-03-09T01:00:00-02:30"],
    );
}

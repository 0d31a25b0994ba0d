//! Property test: for random cron expressions, zones, DST policies and start times near a DST
//! transition, the fire times are strictly increasing and equal to what an independent brute-force
//! walk finds. The walk steps through real instants one minute (or one second) at a time, reads the
//! local time with jiff, matches it with its own small field matcher (not croner's), and applies
//! the DST policy as documented in `sundial_core::schedule`.
#![allow(clippy::unwrap_used)]

use jiff::civil::DateTime;
use jiff::tz::{AmbiguousOffset, TimeZone};
use jiff::{SignedDuration, Timestamp as JTs};
use proptest::prelude::*;
use sundial_core::Timestamp;
use sundial_core::schedule::{
    RepeatedTime, ScheduleSpec, SkippedTime, from_jiff, time_zone, to_jiff,
};

const ZONES: [&str; 9] = [
    "America/New_York",
    "Europe/Berlin",
    "Australia/Lord_Howe",
    "Asia/Shanghai",
    "Australia/Sydney",
    "Pacific/Chatham",
    "America/St_Johns",
    "Asia/Kolkata",
    "Europe/London",
];

/// One cron field: `*`, `*/k`, `a`, `a-b`, `a-b/k` or a list of values.
fn field(min: u32, max: u32, star: bool) -> BoxedStrategy<String> {
    let span = max - min;
    let mut options: Vec<BoxedStrategy<String>> = vec![
        (min..=max).prop_map(|v| v.to_string()).boxed(),
        (min..=max, min..=max)
            .prop_map(|(a, b)| format!("{}-{}", a.min(b), a.max(b)))
            .boxed(),
        (min..=max, min..=max, 1..=span.clamp(1, 12))
            .prop_map(|(a, b, k)| format!("{}-{}/{k}", a.min(b), a.max(b)))
            .boxed(),
        prop::collection::vec(min..=max, 2..4)
            .prop_map(|v| {
                v.iter()
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .boxed(),
        (1..=span.clamp(1, 20))
            .prop_map(|k| format!("*/{k}"))
            .boxed(),
    ];
    if star {
        options.push(Just("*".to_string()).boxed());
        options.push(Just("*".to_string()).boxed());
    }
    proptest::strategy::Union::new(options).boxed()
}

fn maybe_star(min: u32, max: u32, star_weight: u32) -> BoxedStrategy<String> {
    prop_oneof![
        star_weight => Just("*".to_string()),
        1 => field(min, max, false),
    ]
    .boxed()
}

#[derive(Debug, Clone)]
struct Case {
    fields: [String; 6],
    zone: &'static str,
    skipped: SkippedTime,
    repeated: RepeatedTime,
    year: i16,
    transition: usize,
    offset_secs: i64,
    millis: i64,
    /// Aim at the transition: hours around it, every day.
    aim: bool,
}

fn case() -> impl Strategy<Value = Case> {
    let seconds = prop_oneof![4 => Just("0".to_string()), 1 => field(0, 59, true)];
    let fields = (
        seconds,
        field(0, 59, true),
        field(0, 23, true),
        maybe_star(1, 31, 4),
        maybe_star(1, 12, 6),
        maybe_star(0, 6, 4),
    );
    (
        fields,
        0..ZONES.len(),
        prop_oneof![Just(SkippedTime::Shift), Just(SkippedTime::Skip)],
        prop_oneof![
            Just(RepeatedTime::First),
            Just(RepeatedTime::Last),
            Just(RepeatedTime::Both)
        ],
        2020i16..2031,
        0usize..2,
        -30 * 3600i64..6 * 3600,
        0i64..1000,
        any::<bool>(),
    )
        .prop_map(
            |((s, m, h, dom, mon, dow), z, skipped, repeated, year, transition, off, ms, aim)| {
                Case {
                    fields: [s, m, h, dom, mon, dow],
                    zone: ZONES[z],
                    skipped,
                    repeated,
                    year,
                    transition,
                    offset_secs: off,
                    millis: ms,
                    aim,
                }
            },
        )
}

/// The values a field matches, as a bitmap over `0..=max`.
fn values(field: &str, min: u32, max: u32) -> Vec<bool> {
    let mut set = vec![false; max as usize + 1];
    for part in field.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => (r, s.parse::<u32>().unwrap()),
            None => (part, 1),
        };
        let (lo, hi) = if range == "*" {
            (min, max)
        } else if let Some((a, b)) = range.split_once('-') {
            (a.parse().unwrap(), b.parse().unwrap())
        } else {
            let v: u32 = range.parse().unwrap();
            (v, v)
        };
        let mut v = lo;
        while v <= hi {
            set[v as usize] = true;
            v += step;
        }
    }
    set
}

struct Oracle {
    sec: Vec<bool>,
    min: Vec<bool>,
    hour: Vec<bool>,
    dom: Vec<bool>,
    mon: Vec<bool>,
    dow: Vec<bool>,
    star_dom: bool,
    star_dow: bool,
}

impl Oracle {
    fn new(f: &[String; 6]) -> Self {
        Oracle {
            sec: values(&f[0], 0, 59),
            min: values(&f[1], 0, 59),
            hour: values(&f[2], 0, 23),
            dom: values(&f[3], 1, 31),
            mon: values(&f[4], 1, 12),
            dow: values(&f[5], 0, 6),
            star_dom: f[3] == "*",
            star_dow: f[5] == "*",
        }
    }

    fn every_hour(&self) -> bool {
        self.hour.iter().all(|b| *b)
    }

    fn matches(&self, c: DateTime) -> bool {
        let dom = self.dom[c.day() as usize];
        let dow = self.dow[c.weekday().to_sunday_zero_offset() as usize];
        let day = match (self.star_dom, self.star_dow) {
            (true, true) => true,
            (true, false) => dow,
            (false, true) => dom,
            (false, false) => dom || dow,
        };
        self.sec[c.second() as usize]
            && self.min[c.minute() as usize]
            && self.hour[c.hour() as usize]
            && self.mon[c.month() as usize]
            && day
    }

    /// Every fire time in `(from, until]`, by walking instants `step` seconds apart.
    fn walk(
        &self,
        tz: &TimeZone,
        skipped: SkippedTime,
        repeated: RepeatedTime,
        from: JTs,
        until: JTs,
        step: i64,
    ) -> Vec<JTs> {
        let mut out = Vec::new();
        let first = (from.as_second().div_euclid(step) + 1) * step;
        let mut s = first;
        while s <= until.as_second() {
            let at = JTs::from_second(s).unwrap();
            let civil = tz.to_datetime(at);
            let mut fire = false;
            if self.matches(civil) {
                let amb = tz.to_ambiguous_timestamp(civil);
                fire = match amb.offset() {
                    AmbiguousOffset::Unambiguous { .. } => true,
                    AmbiguousOffset::Fold { .. } => {
                        let is_first = amb.earlier().unwrap() == at;
                        self.every_hour()
                            || match repeated {
                                RepeatedTime::First => is_first,
                                RepeatedTime::Last => !is_first,
                                RepeatedTime::Both => true,
                            }
                    }
                    AmbiguousOffset::Gap { .. } => {
                        panic!("an instant's own local time is never in a gap")
                    }
                };
            }
            if !fire && skipped == SkippedTime::Shift {
                // Did the clock jump forward just before this instant? Then every local time it
                // jumped over that matches fires here, once.
                let before = tz.to_datetime(JTs::from_second(s - step).unwrap());
                let mut c = before + SignedDuration::from_secs(step);
                while c < civil {
                    if self.matches(c) {
                        fire = true;
                        break;
                    }
                    c += SignedDuration::from_secs(step);
                }
            }
            if fire {
                out.push(at);
            }
            s += step;
        }
        out
    }
}

/// The `n`th transition of `year` (or a day in `year` for zones without any).
fn anchor(tz: &TimeZone, c: &Case) -> JTs {
    let jan1 = DateTime::constant(c.year, 1, 1, 0, 0, 0, 0)
        .to_zoned(tz.clone())
        .unwrap()
        .timestamp();
    tz.following(jan1)
        .nth(c.transition)
        .map(|t| t.timestamp())
        .unwrap_or(jan1 + SignedDuration::from_hours(24 * 100))
}

/// The local hours around a transition: the hour just before it, the hours it skips or repeats,
/// and the hour just after it.
fn hours_around(tz: &TimeZone, at: JTs) -> String {
    let mut hours: Vec<i8> = Vec::new();
    let mut c = tz.to_datetime(at - SignedDuration::from_secs(1));
    let end = tz.to_datetime(at).max(c) + SignedDuration::from_secs(1);
    let lo = tz.to_datetime(at).min(c);
    c = lo;
    while c <= end {
        if !hours.contains(&c.hour()) {
            hours.push(c.hour());
        }
        c += SignedDuration::from_mins(30);
    }
    hours
        .iter()
        .map(|h| h.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn fire_times_agree_with_a_brute_force_walk(mut c in case()) {
        let tz = time_zone(c.zone).unwrap();
        let at = anchor(&tz, &c);
        if c.aim {
            c.fields[2] = hours_around(&tz, at);
            c.fields[3] = "*".into();
            c.fields[4] = "*".into();
            c.fields[5] = "*".into();
        }
        let expr = c.fields.join(" ");
        let spec = ScheduleSpec::cron(expr.clone())
            .timezone(c.zone)
            .dst(c.skipped, c.repeated);
        let compiled = match spec.compile() {
            Ok(s) => s,
            Err(e) => {
                // Only a date that never exists may be refused.
                prop_assert_eq!(e.kind(), sundial_core::SpecErrorKind::NeverFires, "{}: {}", expr, e);
                return Ok(());
            }
        };
        let (step, horizon, offset) = if c.fields[0] == "0" {
            (60, 50 * 3600, c.offset_secs)
        } else {
            // Second by second: a shorter walk, starting at most 3 hours before the transition.
            (1, 4 * 3600, c.offset_secs.rem_euclid(4 * 3600) - 3 * 3600)
        };
        let from = at + SignedDuration::from_secs(offset) + SignedDuration::from_millis(c.millis);
        let until = from + SignedDuration::from_secs(horizon);

        let mut got = Vec::new();
        let mut cursor = from_jiff(from);
        while let Some(next) = compiled.next_fire_after(cursor) {
            prop_assert!(next > cursor, "{}: {:?} is not after {:?}", expr, next, cursor);
            if next > from_jiff(until) {
                break;
            }
            got.push(to_jiff(next).unwrap());
            cursor = next;
        }
        let want = Oracle::new(&c.fields).walk(&tz, c.skipped, c.repeated, from, until, step);
        let show = |v: &[JTs]| v.iter().map(|t| t.to_zoned(tz.clone()).strftime("%F %T%:z").to_string()).collect::<Vec<_>>();
        prop_assert_eq!(show(&got), show(&want), "{} in {} {:?}/{:?} from {}", expr, c.zone, c.skipped, c.repeated, from.to_zoned(tz.clone()));
    }

    #[test]
    fn interval_fire_times_are_aligned_and_increasing(
        period in 1_000u64..(3 * 86_400_000),
        anchor in 0i64..4_000_000_000_000,
        t in 0i64..4_000_000_000_000,
    ) {
        let spec = ScheduleSpec::every(std::time::Duration::from_millis(period))
            .anchor(Timestamp(anchor))
            .compile()
            .unwrap();
        let mut prev = Timestamp(t);
        for next in spec.fires_after(Timestamp(t)).take(5) {
            prop_assert!(next > prev);
            prop_assert!(next.0 - prev.0 <= period as i64);
            prop_assert_eq!((next.0 - anchor).rem_euclid(period as i64), 0);
            prev = next;
        }
    }
}

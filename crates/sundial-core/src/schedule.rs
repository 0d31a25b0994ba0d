//! Recurrence: when a schedule fires. A [`ScheduleSpec`] (a cron expression or a fixed interval, an
//! IANA time zone and a DST policy) is validated once into a [`CompiledSpec`], whose
//! [`CompiledSpec::next_fire_after`] answers "the first fire time strictly after `t`".
//!
//! # Cron
//!
//! Expressions have 5 fields (minute first: `m h dom mon dow`) or 6 (second first:
//! `s m h dom mon dow`), or are one of the macros `@yearly` (`@annually`), `@monthly`, `@weekly`,
//! `@daily`, `@hourly`. Fields take `*`, values, ranges (`1-5`), steps (`*/15`, `10-50/10`), lists
//! (`1,15,30`), month and weekday names (`JAN`, `MON-FRI`), `?` as `*` in the day fields, `L` (last
//! day of the month; `5L` the last Friday), `W` (`15W`: the weekday nearest the 15th; `LW`) and `#`
//! (`1#2`: the second Monday). Day of month and day of week combine like Vixie cron: when both are
//! restricted (neither is exactly `*`), a day matching either fires; a leading `+` on the day of
//! week (`+MON#1`) requires both. Parsing and field matching are croner's; Sundial validates the
//! result (5 or 6 fields, every value in range, at least one fire time in a full 400-year Gregorian
//! cycle) and names the offending field when it refuses one.
//!
//! # Time zones and DST
//!
//! Expressions are evaluated on the wall clock of the schedule's time zone, read from the IANA time
//! zone database bundled into the binary (jiff's `tzdb-bundle-always`), never from the machine: two
//! nodes, or a node and its tests, always agree on every fire time. Matching happens on the *civil*
//! (local) calendar; turning a matching local time into an instant is done here, by hand, segment by
//! segment between the zone's transitions, so the DST rules below are Sundial's and not a side
//! effect of a library:
//!
//! - **A local time that does not exist** (spring forward): [`SkippedTime::Shift`] (default) fires
//!   once at the first instant after the gap (the transition itself); [`SkippedTime::Skip`] does not
//!   fire. Several skipped local times collapse into that one instant.
//! - **A local time that occurs twice** (fall back): [`RepeatedTime::First`] (default) fires at the
//!   first occurrence, [`RepeatedTime::Last`] at the second, [`RepeatedTime::Both`] at both.
//! - **Every-hour expressions**: when the hour field matches all 24 hours (`* * * * *`,
//!   `*/5 * * * *`, `30 * * * *`, `* * * * * *`), the expression names a position inside every hour
//!   rather than a time of day, and a repeated hour is a real, distinct hour: such an expression
//!   fires in both copies whatever `repeated` says. This is what keeps an every-minute or
//!   every-second expression matching real minutes and seconds through both transitions (the
//!   "wildcard job" rule of classic cron). `repeated` governs expressions that name hours
//!   (`0 1 * * *`, `*/10 1 * * *`, `0 1,13 * * *`).
//!
//! Croner can resolve instants itself, but classifies any hour list or step (`0 1,13 * * *`) as an
//! interval job and fires it in both halves of a repeated hour, with no policy; hence the mapping
//! here (see the `croner_doubles_fixed_hour_lists` regression test).
//!
//! # Intervals
//!
//! `every` fires at `anchor + k × period` for every integer `k`, in absolute time (a period is a
//! real duration; days are 24 hours and DST does not apply). The anchor defaults to the Unix epoch,
//! so `every 15m` fires at :00, :15, :30 and :45 UTC, predictably and without stored state.
//!
//! Resolution: cron fire times are whole seconds; intervals are whole milliseconds. No fire time
//! lies past [`Timestamp::MAX`] (or past croner's year 5000 for cron).

mod def;

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;
use std::time::Duration;

use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use jiff::civil::DateTime;
use jiff::tz::{AmbiguousOffset, Offset, TimeZone, TimeZoneDatabase};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::Timestamp;

pub use def::{
    DEFAULT_CATCHUP_WINDOW, FireKey, MAX_SCHEDULE_ID_LEN, OverlapPolicy, ScheduleDef, ScheduleId,
    TaskTemplate,
};

/// The time zone used when a schedule names none.
pub const DEFAULT_TIMEZONE: &str = "UTC";
/// The shortest interval accepted for `every`.
pub const MIN_PERIOD: Duration = Duration::from_secs(1);
/// The longest interval accepted for `every` (100 years of 365 days).
pub const MAX_PERIOD: Duration = Duration::from_secs(100 * 365 * 86_400);
/// The longest cron expression accepted, in bytes.
pub const MAX_CRON_LEN: usize = 256;

/// What to do with a local fire time that does not exist because the clock jumped forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SkippedTime {
    /// Fire once at the first instant after the gap.
    #[default]
    Shift,
    /// Do not fire.
    Skip,
}

/// What to do with a local fire time that occurs twice because the clock went back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RepeatedTime {
    /// Fire at the first occurrence only.
    #[default]
    First,
    /// Fire at the second occurrence only.
    Last,
    /// Fire at both occurrences.
    Both,
}

/// A schedule's daylight-saving policy. See the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DstPolicy {
    #[serde(default)]
    pub skipped: SkippedTime,
    #[serde(default)]
    pub repeated: RepeatedTime,
}

/// How a schedule recurs.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Recurrence {
    /// A cron expression, evaluated on the schedule's wall clock.
    Cron(String),
    /// A fixed period in absolute time, aligned on `anchor` (the Unix epoch when `None`).
    Every {
        period_ms: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        anchor: Option<Timestamp>,
    },
}

/// When a schedule fires: what a caller hands in. [`ScheduleSpec::compile`] validates it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleSpec {
    pub recurrence: Recurrence,
    /// IANA time zone name (`Europe/Berlin`); `UTC` by default.
    #[serde(default = "default_timezone")]
    pub timezone: String,
    #[serde(default)]
    pub dst: DstPolicy,
}

fn default_timezone() -> String {
    DEFAULT_TIMEZONE.to_string()
}

impl ScheduleSpec {
    /// A cron schedule in UTC with the default DST policy.
    pub fn cron(expression: impl Into<String>) -> Self {
        ScheduleSpec {
            recurrence: Recurrence::Cron(expression.into()),
            timezone: default_timezone(),
            dst: DstPolicy::default(),
        }
    }

    /// A fixed interval aligned on the Unix epoch.
    pub fn every(period: Duration) -> Self {
        ScheduleSpec {
            recurrence: Recurrence::Every {
                period_ms: u64::try_from(period.as_millis()).unwrap_or(u64::MAX),
                anchor: None,
            },
            timezone: default_timezone(),
            dst: DstPolicy::default(),
        }
    }

    /// Aligns an interval on `anchor` (no effect on a cron schedule).
    pub fn anchor(mut self, anchor: Timestamp) -> Self {
        if let Recurrence::Every { anchor: a, .. } = &mut self.recurrence {
            *a = Some(anchor);
        }
        self
    }

    pub fn timezone(mut self, tz: impl Into<String>) -> Self {
        self.timezone = tz.into();
        self
    }

    pub fn dst(mut self, skipped: SkippedTime, repeated: RepeatedTime) -> Self {
        self.dst = DstPolicy { skipped, repeated };
        self
    }

    /// Validates the spec. Errors name the field (`cron`, `every`, `anchor`, `timezone`) and why.
    pub fn compile(&self) -> Result<CompiledSpec, SpecError> {
        let tz = time_zone(&self.timezone)?;
        let inner = match &self.recurrence {
            Recurrence::Cron(expr) => Inner::Cron(Box::new(CronEval::new(expr, tz, self.dst)?)),
            Recurrence::Every { period_ms, anchor } => {
                let period = Duration::from_millis(*period_ms);
                if period < MIN_PERIOD || period > MAX_PERIOD {
                    return Err(SpecError::new(
                        "every",
                        SpecErrorKind::OutOfRange,
                        format!(
                            "must be between {}s and {} days",
                            MIN_PERIOD.as_secs(),
                            MAX_PERIOD.as_secs() / 86_400
                        ),
                    ));
                }
                let anchor = anchor.unwrap_or(Timestamp::MIN);
                if !anchor.is_in_range() {
                    return Err(SpecError::new(
                        "anchor",
                        SpecErrorKind::OutOfRange,
                        "must be between 1970-01-01 and 9999-12-31",
                    ));
                }
                Inner::Every {
                    period_ms: *period_ms as i64,
                    anchor_ms: anchor.0,
                }
            }
        };
        Ok(CompiledSpec { inner })
    }
}

/// What kind of problem a [`SpecError`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SpecErrorKind {
    /// The expression does not parse (unknown character, wrong number of fields, bad macro).
    Syntax,
    /// A value lies outside its field's range (second 61, month 13, an interval of 0).
    OutOfRange,
    /// The expression parses but matches no date at all (`0 0 0 30 2 *`).
    NeverFires,
    /// Fields that cannot go together (an end before the start).
    Conflict,
    /// A field is malformed or refused for another reason (an empty kind, a bad id).
    Invalid,
    /// The time zone is not in the IANA database.
    UnknownTimeZone,
}

/// Why a [`ScheduleSpec`] was refused: the field it is about and a reason a person can act on.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{field}: {reason}")]
pub struct SpecError {
    field: Cow<'static, str>,
    kind: SpecErrorKind,
    reason: String,
}

impl SpecError {
    pub fn new(
        field: impl Into<Cow<'static, str>>,
        kind: SpecErrorKind,
        reason: impl Into<String>,
    ) -> Self {
        SpecError {
            field: field.into(),
            kind,
            reason: reason.into(),
        }
    }
    /// The wire name of the offending field (`cron`, `timezone`, `task.kind`, …).
    pub fn field(&self) -> &str {
        &self.field
    }
    pub fn kind(&self) -> SpecErrorKind {
        self.kind
    }
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

/// The bundled IANA time zone database (see the module documentation for why not the system's).
fn tzdb() -> &'static TimeZoneDatabase {
    static DB: OnceLock<TimeZoneDatabase> = OnceLock::new();
    DB.get_or_init(TimeZoneDatabase::bundled)
}

/// The names of the bundled database's time zones, sorted (what [`time_zone`] takes, spelled as
/// the database spells them).
pub fn time_zone_names() -> Vec<String> {
    let mut names: Vec<String> = tzdb().available().map(|n| n.as_str().to_string()).collect();
    names.sort_unstable();
    names
}

/// Looks an IANA time zone name up in the bundled database.
pub fn time_zone(name: &str) -> Result<TimeZone, SpecError> {
    if name.is_empty() || name.len() > 64 {
        return Err(SpecError::new(
            "timezone",
            SpecErrorKind::UnknownTimeZone,
            "must be an IANA time zone name such as \"Europe/Berlin\" or \"UTC\"",
        ));
    }
    tzdb().get(name).map_err(|_| {
        SpecError::new(
            "timezone",
            SpecErrorKind::UnknownTimeZone,
            format!("unknown time zone {name:?}; use an IANA name such as \"America/New_York\""),
        )
    })
}

/// A validated spec, ready to answer "when next".
#[derive(Debug, Clone)]
pub struct CompiledSpec {
    inner: Inner,
}

#[derive(Debug, Clone)]
enum Inner {
    Cron(Box<CronEval>),
    Every { period_ms: i64, anchor_ms: i64 },
}

impl CompiledSpec {
    /// The first fire time strictly after `t`, or `None` when there is none (before
    /// [`Timestamp::MAX`]).
    pub fn next_fire_after(&self, t: Timestamp) -> Option<Timestamp> {
        let next = match &self.inner {
            Inner::Cron(c) => c.next_after(t),
            Inner::Every {
                period_ms,
                anchor_ms,
            } => {
                let (p, a) = (i128::from(*period_ms), i128::from(*anchor_ms));
                let k = (i128::from(t.0) - a).div_euclid(p) + 1;
                i64::try_from(a + k * p).ok().map(Timestamp)
            }
        }?;
        (next <= Timestamp::MAX).then_some(next)
    }

    /// Fire times strictly after `t`, in increasing order.
    pub fn fires_after(&self, t: Timestamp) -> FireTimes<'_> {
        FireTimes {
            spec: self,
            cursor: Some(t),
        }
    }

    /// Whether this is a cron expression whose hour field matches every hour (see the module
    /// documentation); `false` for intervals.
    pub fn is_every_hour(&self) -> bool {
        matches!(&self.inner, Inner::Cron(c) if c.every_hour)
    }
}

/// Iterator over fire times, strictly increasing. See [`CompiledSpec::fires_after`].
#[derive(Debug, Clone)]
pub struct FireTimes<'a> {
    spec: &'a CompiledSpec,
    cursor: Option<Timestamp>,
}

impl Iterator for FireTimes<'_> {
    type Item = Timestamp;
    fn next(&mut self) -> Option<Timestamp> {
        let next = self.spec.next_fire_after(self.cursor?);
        self.cursor = next;
        next
    }
}

/// Names of the fields of a 6-field expression, for error messages.
/// What each cron field accepts, in the order of [`FIELD_NAMES`] (for error messages).
const FIELD_RANGES: [&str; 6] = [
    "0-59",
    "0-59",
    "0-23",
    "1-31 (or L, W)",
    "1-12 or JAN-DEC",
    "0-7 or SUN-SAT (0 and 7 are Sunday; L, #)",
];

const FIELD_NAMES: [&str; 6] = [
    "second",
    "minute",
    "hour",
    "day-of-month",
    "month",
    "day-of-week",
];

/// The year from which the never-fires check looks for a first match, and the span it covers.
/// The Gregorian calendar (dates and weekdays together) repeats every 400 years, so a pattern with
/// no match in 400 consecutive years has none at all.
const CHECK_FROM_YEAR: i16 = 2000;
const GREGORIAN_CYCLE_YEARS: i16 = 400;

#[derive(Debug, Clone)]
struct CronEval {
    cron: Cron,
    tz: TimeZone,
    dst: DstPolicy,
    /// The hour field matches all 24 hours: repeated hours fire in both copies.
    every_hour: bool,
}

fn parser() -> CronParser {
    CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .build()
}

fn cron_err(kind: SpecErrorKind, reason: impl Into<String>) -> SpecError {
    SpecError::new("cron", kind, reason)
}

impl CronEval {
    fn new(expr: &str, tz: TimeZone, dst: DstPolicy) -> Result<Self, SpecError> {
        let cron = parse_cron(expr)?;
        let every_hour = cron.pattern.hours.values().len() == 24;
        // At least one match in a whole Gregorian cycle, or never.
        let from = DateTime::constant(CHECK_FROM_YEAR, 1, 1, 0, 0, 0, 0);
        let fires = cron
            .find_next_occurrence(&from, true)
            .is_ok_and(|d: DateTime| d.year() < CHECK_FROM_YEAR + GREGORIAN_CYCLE_YEARS);
        if !fires {
            return Err(cron_err(
                SpecErrorKind::NeverFires,
                format!(
                    "{expr:?} matches no date (for example the 30th of February): it would never fire"
                ),
            ));
        }
        Ok(CronEval {
            cron,
            tz,
            dst,
            every_hour,
        })
    }

    /// The first fire time strictly after `t`. Walks the zone's offset segments forward from `t`:
    /// inside a segment the offset is constant, so local time and instants correspond one to one.
    fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        // Fire times are whole seconds: start at the first whole second after `t`.
        let mut lo = t.0.div_euclid(1_000).checked_add(1)?;
        let max = Timestamp::MAX.0.div_euclid(1_000);
        // A spring-forward transition exactly at `lo`: the loop below only sees gaps at the end of
        // a segment, so the gap that ends where the walk starts is checked here (its shifted fire
        // is at `lo` itself, which is after `t`).
        if self.dst.skipped == SkippedTime::Shift
            && let Some(at) = self.gap_fire_at(lo)
        {
            return Some(Timestamp(at.checked_mul(1_000)?));
        }
        loop {
            if lo > max {
                return None;
            }
            let lo_ts = jiff::Timestamp::from_second(lo).ok()?;
            let offset = self.tz.to_offset(lo_ts);
            let transition = self.tz.following(lo_ts).next();
            let seg_end = transition.as_ref().map(|tr| tr.timestamp().as_second());
            if let Some(found) = self.in_segment(lo_ts, offset, seg_end)? {
                return Some(Timestamp(found.checked_mul(1_000)?));
            }
            // Nothing in this segment: cross the transition at its end.
            let tr = transition?;
            let at = tr.timestamp();
            if tr.offset() > offset && self.dst.skipped == SkippedTime::Shift {
                // The clock jumps forward: local times in [at + before, at + after) never happen.
                // Any of them that matches fires once, at the transition.
                let gap_start = offset.to_datetime(at);
                let gap_end = tr.offset().to_datetime(at);
                if let Ok(c) = self.cron.find_next_occurrence(&gap_start, true)
                    && c < gap_end
                {
                    return Some(Timestamp(at.as_second().checked_mul(1_000)?));
                }
            }
            lo = at.as_second();
        }
    }

    /// When a forward transition happens exactly at second `at` and some local time in the gap it
    /// skips matches the expression: `Some(at)` (the shifted fire).
    fn gap_fire_at(&self, at: i64) -> Option<i64> {
        let at_ts = jiff::Timestamp::from_second(at).ok()?;
        let probe = at_ts.checked_add(jiff::SignedDuration::from_secs(1)).ok()?;
        let tr = self.tz.preceding(probe).next()?;
        if tr.timestamp() != at_ts {
            return None;
        }
        let before = self
            .tz
            .to_offset(at_ts.checked_sub(jiff::SignedDuration::from_secs(1)).ok()?);
        if tr.offset() <= before {
            return None;
        }
        let gap_start = before.to_datetime(at_ts);
        let gap_end = tr.offset().to_datetime(at_ts);
        match self.cron.find_next_occurrence(&gap_start, true) {
            Ok(c) if c < gap_end => Some(at),
            _ => None,
        }
    }

    /// The first fire time (in seconds) in the segment `[lo, seg_end)` where the offset is
    /// `offset`. `Some(None)`: none in this segment; `None`: none at all (no further match within
    /// croner's range).
    fn in_segment(
        &self,
        lo: jiff::Timestamp,
        offset: Offset,
        seg_end: Option<i64>,
    ) -> Option<Option<i64>> {
        let mut civil_lo = offset.to_datetime(lo);
        loop {
            let c: DateTime = match self.cron.find_next_occurrence(&civil_lo, true) {
                Ok(c) => c,
                Err(_) => return None,
            };
            let instant = offset.to_timestamp(c).ok()?;
            let secs = instant.as_second();
            if seg_end.is_some_and(|end| secs >= end) {
                return Some(None);
            }
            match self.tz.to_ambiguous_timestamp(c).offset() {
                AmbiguousOffset::Unambiguous { .. } => return Some(Some(secs)),
                AmbiguousOffset::Fold { before, .. } => {
                    let first_copy = offset == before;
                    let fires = self.every_hour
                        || match self.dst.repeated {
                            RepeatedTime::Both => true,
                            RepeatedTime::First => first_copy,
                            RepeatedTime::Last => !first_copy,
                        };
                    if fires {
                        return Some(Some(secs));
                    }
                    if first_copy {
                        // From here to the segment's end every local time is repeated later.
                        return Some(None);
                    }
                    // Second copy, refused: resume where the repeated range ends, at the
                    // transition that started this copy plus the offset before it.
                    let probe = instant
                        .checked_add(jiff::SignedDuration::from_secs(1))
                        .ok()?;
                    let start = self.tz.preceding(probe).next()?;
                    civil_lo = before.to_datetime(start.timestamp());
                }
                AmbiguousOffset::Gap { .. } => {
                    // Cannot happen for an instant inside a segment; step past it regardless.
                    civil_lo = c.checked_add(jiff::SignedDuration::from_secs(1)).ok()?;
                }
            }
        }
    }
}

/// Parses a cron expression, naming the offending field on failure.
fn parse_cron(expr: &str) -> Result<Cron, SpecError> {
    let trimmed = expr.trim();
    if trimmed.is_empty() {
        return Err(cron_err(SpecErrorKind::Syntax, "must not be empty"));
    }
    if trimmed.len() > MAX_CRON_LEN {
        return Err(cron_err(
            SpecErrorKind::Syntax,
            format!(
                "is {} bytes long; the limit is {MAX_CRON_LEN}",
                trimmed.len()
            ),
        ));
    }
    if trimmed.starts_with('@') {
        const MACROS: [&str; 6] = [
            "@yearly",
            "@annually",
            "@monthly",
            "@weekly",
            "@daily",
            "@hourly",
        ];
        if !MACROS.iter().any(|m| m.eq_ignore_ascii_case(trimmed)) {
            return Err(cron_err(
                SpecErrorKind::Syntax,
                format!(
                    "unknown macro {trimmed:?}; use one of @yearly, @annually, @monthly, @weekly, @daily, @hourly"
                ),
            ));
        }
    } else {
        if trimmed.contains('@') {
            return Err(cron_err(
                SpecErrorKind::Syntax,
                "a macro (@daily, …) must stand alone",
            ));
        }
        let fields: Vec<&str> = trimmed.split_whitespace().collect();
        if fields.len() != 5 && fields.len() != 6 {
            return Err(cron_err(
                SpecErrorKind::Syntax,
                format!(
                    "has {} fields; use 5 (minute hour day-of-month month day-of-week) or 6 (second first)",
                    fields.len()
                ),
            ));
        }
        // Find the field croner refuses by parsing it alone, the others left as `*`.
        let skip = 6 - fields.len();
        for (i, field) in fields.iter().enumerate() {
            let mut probe = ["*"; 6];
            probe[i + skip] = field;
            if let Err(e) = parser().parse(&probe.join(" ")) {
                let name = FIELD_NAMES[i + skip];
                let (kind, why) = describe(&e);
                return Err(cron_err(
                    kind,
                    format!(
                        "the {name} field {field:?} is invalid: {why}; it takes {}",
                        FIELD_RANGES[i + skip]
                    ),
                ));
            }
        }
    }
    parser().parse(trimmed).map_err(|e| {
        let (kind, why) = describe(&e);
        cron_err(kind, format!("{trimmed:?} is invalid: {why}"))
    })
}

fn describe(e: &croner::errors::CronError) -> (SpecErrorKind, String) {
    use croner::errors::CronError as E;
    match e {
        E::ComponentError(m) if m.contains("out of bounds") || m.contains("range") => {
            (SpecErrorKind::OutOfRange, m.clone())
        }
        E::ComponentError(m) | E::InvalidPattern(m) | E::IllegalCharacters(m) => {
            (SpecErrorKind::Syntax, m.clone())
        }
        other => (SpecErrorKind::Syntax, other.to_string()),
    }
}

impl fmt::Display for SkippedTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SkippedTime::Shift => "shift",
            SkippedTime::Skip => "skip",
        })
    }
}

impl fmt::Display for RepeatedTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RepeatedTime::First => "first",
            RepeatedTime::Last => "last",
            RepeatedTime::Both => "both",
        })
    }
}

impl FromStr for SkippedTime {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        match s {
            "shift" => Ok(SkippedTime::Shift),
            "skip" => Ok(SkippedTime::Skip),
            _ => Err(SpecError::new(
                "dst.skipped",
                SpecErrorKind::Syntax,
                format!("unknown value {s:?}; expected \"shift\" or \"skip\""),
            )),
        }
    }
}

impl FromStr for RepeatedTime {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        match s {
            "first" => Ok(RepeatedTime::First),
            "last" => Ok(RepeatedTime::Last),
            "both" => Ok(RepeatedTime::Both),
            _ => Err(SpecError::new(
                "dst.repeated",
                SpecErrorKind::Syntax,
                format!("unknown value {s:?}; expected \"first\", \"last\" or \"both\""),
            )),
        }
    }
}

/// Converts a Sundial timestamp to jiff's (for formatting and civil conversions).
pub fn to_jiff(t: Timestamp) -> Option<jiff::Timestamp> {
    jiff::Timestamp::from_millisecond(t.0).ok()
}

/// Converts a jiff timestamp to Sundial's (truncating below the millisecond).
pub fn from_jiff(t: jiff::Timestamp) -> Timestamp {
    Timestamp(t.as_millisecond())
}

//! Durations on the wire: a whole number followed by a unit, optionally several in a row from the
//! largest unit down: `"1500ms"`, `"30s"`, `"5m"`, `"2h"`, `"3d"`, `"1h30m"`.
//!
//! Units: `ms` (milliseconds), `s`, `m` (minutes), `h`, `d` (days of 24 hours). Resolution is one
//! millisecond, like the rest of Sundial. Signs, fractions, spaces, a missing unit, an empty string
//! and values past `u64` milliseconds are refused: a typo must never become a default.
//!
//! The task API's fields are such strings ([`opt`]). The workflow worker protocol's fields were
//! numbers of milliseconds (`wait_ms`, `timeout_ms`); they take both forms ([`millis`],
//! [`opt_millis`]: `300000` or `"5m"`) and are still written as numbers. Shared by the server and
//! the workflow crate, so this module lives in the core (pure: no I/O).

use std::fmt;
use std::time::Duration;

/// Why a duration string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DurationError(String);

const UNITS: [(&str, u64); 5] = [
    ("d", 86_400_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1_000),
    ("ms", 1),
];

const HINT: &str = "use a whole number and a unit (ms, s, m, h, d), e.g. \"1500ms\", \"30s\", \"5m\", \"1h30m\", \"3d\"";

/// Parses a wire duration.
pub fn parse(input: &str) -> Result<Duration, DurationError> {
    let err = |what: &str| DurationError(format!("invalid duration {input:?}: {what}; {HINT}"));
    if input.is_empty() {
        return Err(err("empty"));
    }
    if input.starts_with('-') {
        return Err(err("negative durations are not allowed"));
    }
    if input.chars().any(char::is_whitespace) {
        return Err(err("spaces are not allowed"));
    }
    let bytes = input.as_bytes();
    let mut i = 0;
    let mut total: u64 = 0;
    // Index into UNITS of the last unit used: units must go from largest to smallest, once each.
    let mut last_unit: Option<usize> = None;
    while i < bytes.len() {
        let start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return Err(err("expected a digit"));
        }
        let number: u64 = input[start..i]
            .parse()
            .map_err(|_| err("the number is too large"))?;
        let ustart = i;
        while i < bytes.len() && bytes[i].is_ascii_alphabetic() {
            i += 1;
        }
        let unit = &input[ustart..i];
        if unit.is_empty() {
            return Err(err("missing unit"));
        }
        let Some(pos) = UNITS.iter().position(|(u, _)| *u == unit) else {
            return Err(err(&match unit_for_word(unit) {
                Some(u) => format!("unknown unit {unit:?} (write {u:?})"),
                None => format!("unknown unit {unit:?}"),
            }));
        };
        if last_unit.is_some_and(|l| pos <= l) {
            return Err(err(
                "units must go from largest to smallest, each at most once",
            ));
        }
        last_unit = Some(pos);
        let ms = number
            .checked_mul(UNITS[pos].1)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(|| err("too large"))?;
        total = ms;
    }
    Ok(Duration::from_millis(total))
}

/// The unit a spelt-out word means (`"minutes"` → `"m"`), for error messages.
fn unit_for_word(word: &str) -> Option<&'static str> {
    let lower = word.to_ascii_lowercase();
    if let Some((u, _)) = UNITS.iter().find(|(u, _)| *u == lower) {
        return Some(u);
    }
    match lower.strip_suffix('s').unwrap_or(&lower) {
        "millisecond" | "milli" | "msec" => Some("ms"),
        "second" | "sec" => Some("s"),
        "minute" | "min" => Some("m"),
        "hour" | "hr" => Some("h"),
        "day" => Some("d"),
        _ => None,
    }
}

/// What a duration field says when it is given something other than a string (`300`, `true`):
/// serde's "invalid type: integer `300`, expected …" ends with this.
pub const EXPECTING: &str =
    "a duration string with a unit, such as \"300s\", \"5m\" or \"1h30m\" (units ms, s, m, h, d)";

/// Serde support for optional wire durations kept as strings: `null` or absent is `None`, a
/// string is kept as it is (checked later by [`parse`], which names the field), and anything
/// else is refused with [`EXPECTING`] rather than serde's bare "expected a string".
/// Use with `#[serde(default, deserialize_with = "duration::opt")]`.
pub fn opt<'de, D>(de: D) -> Result<Option<String>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    struct V;
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = Option<String>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(EXPECTING)
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D2: serde::Deserializer<'de>>(self, d: D2) -> Result<Self::Value, D2::Error> {
            d.deserialize_any(V)
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
        fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
            Ok(Some(v))
        }
    }
    de.deserialize_option(V)
}

/// Like [`opt`], for a duration that must be given: `null` is refused like any other
/// non-string. Use with `#[serde(deserialize_with = "duration::required")]`.
pub fn required<'de, D>(de: D) -> Result<String, D::Error>
where
    D: serde::Deserializer<'de>,
{
    opt(de)?.ok_or_else(|| serde::de::Error::custom(format!("expected {EXPECTING}")))
}

/// What a millisecond field says when it is given something else.
pub const EXPECTING_MILLIS: &str = "a whole number of milliseconds (300000) or a duration string with a unit, such as \"300s\", \"5m\" or \"1h30m\" (units ms, s, m, h, d)";

struct MillisVisitor;

impl serde::de::Visitor<'_> for MillisVisitor {
    type Value = u64;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(EXPECTING_MILLIS)
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<u64, E> {
        Ok(v)
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<u64, E> {
        u64::try_from(v).map_err(|_| {
            E::custom(format!(
                "invalid duration {v}: negative durations are not allowed"
            ))
        })
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<u64, E> {
        Err(E::custom(format!(
            "invalid duration {v}: use whole milliseconds, or a string such as \"1500ms\""
        )))
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<u64, E> {
        let d = parse(v).map_err(E::custom)?;
        u64::try_from(d.as_millis())
            .map_err(|_| E::custom(format!("invalid duration {v:?}: too large")))
    }
}

/// Deserialises a `u64` millisecond field from a number (`300000`) or a duration string (`"5m"`).
/// Use with `#[serde(deserialize_with = "…::duration::millis")]`; it serialises as the number.
pub fn millis<'de, D: serde::Deserializer<'de>>(de: D) -> Result<u64, D::Error> {
    de.deserialize_any(MillisVisitor)
}

/// [`millis`] for an optional field: `null` or absent is `None`. Use with
/// `#[serde(default, deserialize_with = "…::duration::opt_millis")]`.
pub fn opt_millis<'de, D: serde::Deserializer<'de>>(de: D) -> Result<Option<u64>, D::Error> {
    struct V;
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = Option<u64>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(EXPECTING_MILLIS)
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D2: serde::Deserializer<'de>>(self, d: D2) -> Result<Self::Value, D2::Error> {
            millis(d).map(Some)
        }
    }
    de.deserialize_option(V)
}

/// Formats a duration the way [`parse`] reads it: the largest units that represent it exactly
/// (`"5m"`, `"1h30m"`, `"1500ms"`, `"0s"`). Sub-millisecond parts are dropped.
pub fn format(d: Duration) -> String {
    WireDuration(d).to_string()
}

/// Displays a duration in wire form.
pub struct WireDuration(pub Duration);

impl fmt::Display for WireDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ms = u64::try_from(self.0.as_millis()).unwrap_or(u64::MAX);
        if ms == 0 {
            return f.write_str("0s");
        }
        // Whole seconds print as d/h/m/s; anything with milliseconds prints entirely as
        // milliseconds, which reads better than "1s500ms".
        if ms % 1_000 != 0 {
            return write!(f, "{ms}ms");
        }
        for (unit, size) in UNITS.iter().take(4) {
            if ms >= *size {
                write!(f, "{}{unit}", ms / size)?;
                ms %= size;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn parses_single_units() {
        assert_eq!(parse("1500ms"), Ok(ms(1_500)));
        assert_eq!(parse("30s"), Ok(ms(30_000)));
        assert_eq!(parse("5m"), Ok(ms(300_000)));
        assert_eq!(parse("2h"), Ok(ms(7_200_000)));
        assert_eq!(parse("3d"), Ok(ms(259_200_000)));
        assert_eq!(parse("0s"), Ok(ms(0)));
        assert_eq!(parse("0ms"), Ok(ms(0)));
    }

    #[test]
    fn parses_compound() {
        assert_eq!(parse("1h30m"), Ok(ms(5_400_000)));
        assert_eq!(parse("1d2h3m4s5ms"), Ok(ms(93_784_005)));
        assert_eq!(parse("1m500ms"), Ok(ms(60_500)));
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "", "-5s", "-0s", "+5s", "5", "s", "5 s", " 5s", "5s ", "1.5s", "5sec", "5S", "5us",
            "1m1h", "1s1s", "5mss", "abc", "1_000ms", "٣s",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn rejects_overflow() {
        assert!(parse("18446744073709551616ms").is_err());
        assert!(parse("213503982334602d").is_err());
        assert_eq!(parse("18446744073709551615ms"), Ok(ms(u64::MAX)));
    }

    #[test]
    fn spelt_out_units_and_spaces_get_a_useful_reason() {
        let e = parse("5 minutes").unwrap_err().to_string();
        assert!(e.contains("spaces are not allowed"), "{e}");
        let e = parse("5minutes").unwrap_err().to_string();
        assert!(e.contains("write \"m\""), "{e}");
        let e = parse("2hours").unwrap_err().to_string();
        assert!(e.contains("write \"h\""), "{e}");
        assert!(parse("5").unwrap_err().to_string().contains("missing unit"));
    }

    #[test]
    fn a_number_for_a_duration_is_refused_with_the_format() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct T {
            #[serde(default, deserialize_with = "opt")]
            d: Option<String>,
        }
        let e = serde_json::from_str::<T>(r#"{"d": 300}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"300s\""), "{e}");
        assert_eq!(
            serde_json::from_str::<T>(r#"{"d": "5m"}"#)
                .unwrap()
                .d
                .as_deref(),
            Some("5m")
        );
        assert_eq!(serde_json::from_str::<T>(r#"{"d": null}"#).unwrap().d, None);
        assert_eq!(serde_json::from_str::<T>(r#"{}"#).unwrap().d, None);
    }

    #[test]
    fn error_names_the_input() {
        let e = parse("-5s").unwrap_err().to_string();
        assert!(e.contains("\"-5s\"") && e.contains("negative"), "{e}");
    }

    #[test]
    fn formats_exactly_and_round_trips() {
        let cases = [
            (0, "0s"),
            (1, "1ms"),
            (1_500, "1500ms"),
            (30_000, "30s"),
            (300_000, "5m"),
            (5_400_000, "1h30m"),
            (86_400_000, "1d"),
            (90_061_000, "1d1h1m1s"),
        ];
        for (v, s) in cases {
            assert_eq!(format(ms(v)), s);
            assert_eq!(parse(s), Ok(ms(v)));
        }
        for v in [7, 999, 1_001, 59_999, 3_600_001, 123_456_789, u64::MAX] {
            assert_eq!(parse(&format(ms(v))), Ok(ms(v)), "{v}");
        }
    }

    #[test]
    fn millisecond_fields_take_numbers_and_duration_strings() {
        #[derive(Debug, serde::Deserialize)]
        struct T {
            #[serde(deserialize_with = "millis")]
            t: u64,
            #[serde(default, deserialize_with = "opt_millis")]
            w: Option<u64>,
        }
        let t = |s: &str| serde_json::from_str::<T>(s).map(|t| (t.t, t.w));
        assert_eq!(t(r#"{"t": 1500}"#).unwrap(), (1_500, None));
        assert_eq!(
            t(r#"{"t": "1500ms", "w": "5m"}"#).unwrap(),
            (1_500, Some(300_000))
        );
        assert_eq!(
            t(r#"{"t": "1h30m", "w": 20000}"#).unwrap(),
            (5_400_000, Some(20_000))
        );
        assert_eq!(t(r#"{"t": 0, "w": null}"#).unwrap(), (0, None));
        for (bad, says) in [
            (r#"{"t": -5}"#, "negative"),
            (r#"{"t": 1.5}"#, "whole milliseconds"),
            (r#"{"t": "5"}"#, "missing unit"),
            (r#"{"t": "5 minutes"}"#, "spaces are not allowed"),
            (r#"{"t": true}"#, "a whole number of milliseconds"),
            (r#"{"t": 1, "w": "-1s"}"#, "negative"),
            (r#"{"t": 1, "w": [1]}"#, "a whole number of milliseconds"),
        ] {
            let e = t(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}

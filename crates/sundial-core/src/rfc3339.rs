//! Times on the wire: RFC 3339 with an explicit offset (`"2030-01-02T03:04:05Z"`,
//! `"2030-01-02T05:04:05.250+02:00"`). Sundial keeps milliseconds; finer digits are refused rather
//! than rounded. Output is always UTC with `Z`, with milliseconds only when they are not zero.
//!
//! The task API's times are such strings. The workflow worker protocol's times were milliseconds
//! since the epoch (a timer command's `fire_at`); they take both forms ([`millis_or_rfc3339`]) and
//! are still written as numbers. Shared by the server and the workflow crate (pure: no I/O).

use crate::Timestamp;

/// Formats a timestamp as RFC 3339 in UTC (`2030-01-02T03:04:05Z`, or `...05.250Z` when the
/// milliseconds are not zero). Covers Sundial's whole range, year 1970 to 9999, and beyond.
pub fn format(t: Timestamp) -> String {
    let ms = t.as_millis();
    let days = ms.div_euclid(86_400_000);
    let in_day = ms.rem_euclid(86_400_000);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss, milli) = (
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1_000 % 60,
        in_day % 1_000,
    );
    if milli == 0 {
        format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}Z")
    } else {
        format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}.{milli:03}Z")
    }
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day) (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// 0000-01-01T00:00:00Z in milliseconds since the epoch: the earliest time RFC 3339 can write.
const YEAR_0_MS: i64 = -62_167_219_200_000;

/// Parses an RFC 3339 time with an offset.
pub fn parse(input: &str) -> Result<Timestamp, String> {
    let ts: jiff::Timestamp = input.parse().map_err(|e| {
        format!("invalid time {input:?}: {e}; use RFC 3339 with an offset, e.g. \"2030-01-02T03:04:05Z\"")
    })?;
    // RFC 3339 has four-digit years; jiff also reads signed six-digit ones (`-000200-04-24`),
    // which `format` cannot write back, so they are refused here.
    if ts.as_millisecond() < YEAR_0_MS {
        return Err(format!(
            "invalid time {input:?}: the year must be 0000 to 9999, e.g. \"2030-01-02T03:04:05Z\""
        ));
    }
    if ts.subsec_nanosecond() % 1_000_000 != 0 {
        return Err(format!(
            "invalid time {input:?}: Sundial keeps milliseconds; drop the finer digits"
        ));
    }
    Ok(Timestamp::from_millis(ts.as_millisecond()))
}

/// Deserialises a [`Timestamp`] field from milliseconds since the epoch (`1900000000000`) or an
/// RFC 3339 string (`"2030-03-17T17:46:40Z"`). Use with
/// `#[serde(deserialize_with = "…::rfc3339::millis_or_rfc3339")]`; it serialises as the number.
pub fn millis_or_rfc3339<'de, D: serde::Deserializer<'de>>(de: D) -> Result<Timestamp, D::Error> {
    struct V;
    impl serde::de::Visitor<'_> for V {
        type Value = Timestamp;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("milliseconds since the Unix epoch or an RFC 3339 time with an offset, e.g. \"2030-01-02T03:04:05Z\"")
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Timestamp, E> {
            Ok(Timestamp::from_millis(v))
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Timestamp, E> {
            i64::try_from(v)
                .map(Timestamp::from_millis)
                .map_err(|_| E::custom(format!("invalid time {v}: too large")))
        }
        fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Timestamp, E> {
            Err(E::custom(format!(
                "invalid time {v}: use whole milliseconds since the epoch, or RFC 3339"
            )))
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Timestamp, E> {
            parse(v).map_err(E::custom)
        }
    }
    de.deserialize_any(V)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn years_before_0000_are_refused() {
        // Found by the `rfc3339` fuzz target: accepted, but formatted as "-200-04-24T00:00:00Z",
        // which does not parse back.
        let err = parse("-0002000424 00+00").unwrap_err();
        assert!(err.contains("the year must be 0000 to 9999"), "{err}");
        assert!(parse("-000001-12-31T23:59:59Z").is_err());
        let first = parse("0000-01-01T00:00:00Z").unwrap();
        assert_eq!(first, Timestamp::from_millis(YEAR_0_MS));
        assert_eq!(parse(&format(first)), Ok(first));
    }

    #[test]
    fn round_trips() {
        for ms in [
            0,
            1,
            1_500,
            951_782_400_000,
            1_700_000_000_000,
            1_700_000_000_123,
        ] {
            let s = format(Timestamp::from_millis(ms));
            assert_eq!(parse(&s), Ok(Timestamp::from_millis(ms)), "{s}");
        }
        assert_eq!(format(Timestamp::from_millis(0)), "1970-01-01T00:00:00Z");
        assert_eq!(
            format(Timestamp::from_millis(1_500)),
            "1970-01-01T00:00:01.500Z"
        );
        assert_eq!(
            format(Timestamp::from_millis(951_782_400_000)),
            "2000-02-29T00:00:00Z"
        );
        assert_eq!(format(Timestamp::MAX), "9999-12-31T23:59:59.999Z");
    }

    #[test]
    fn agrees_with_jiff_across_the_range() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..20_000 {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let ms = ((x >> 11) % 253_402_000_000_000) as i64;
            let ours = format(Timestamp::from_millis(ms));
            let theirs: jiff::Timestamp = ours.parse().unwrap();
            assert_eq!(theirs.as_millisecond(), ms, "{ours}");
        }
    }

    #[test]
    fn accepts_offsets() {
        assert_eq!(
            parse("1970-01-01T02:00:01+02:00"),
            Ok(Timestamp::from_millis(1_000))
        );
        assert_eq!(
            parse("1970-01-01T00:00:00.250Z"),
            Ok(Timestamp::from_millis(250))
        );
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            "tomorrow",
            "2030-01-02",
            "2030-01-02T03:04:05",
            "2030-13-02T03:04:05Z",
            "1700000000",
            "2030-01-02T03:04:05.0001Z",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn timestamp_fields_take_millis_and_rfc3339() {
        #[derive(Debug, serde::Deserialize)]
        struct T {
            #[serde(deserialize_with = "millis_or_rfc3339")]
            at: Timestamp,
        }
        let at = |s: &str| serde_json::from_str::<T>(s).map(|t| t.at);
        assert_eq!(
            at(r#"{"at": 1500}"#).unwrap(),
            Timestamp::from_millis(1_500)
        );
        assert_eq!(
            at(r#"{"at": "1970-01-01T00:00:01.500Z"}"#).unwrap(),
            Timestamp::from_millis(1_500)
        );
        assert_eq!(
            at(r#"{"at": "1970-01-01T02:00:01+02:00"}"#).unwrap(),
            Timestamp::from_millis(1_000)
        );
        for (bad, says) in [
            (r#"{"at": "tomorrow"}"#, "use RFC 3339"),
            (r#"{"at": "2030-01-02T03:04:05"}"#, "use RFC 3339"),
            (r#"{"at": 1.5}"#, "whole milliseconds"),
            (r#"{"at": true}"#, "RFC 3339"),
        ] {
            let e = at(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}

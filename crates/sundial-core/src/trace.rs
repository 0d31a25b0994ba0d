//! W3C Trace Context: the `traceparent` (and `tracestate`) a task carries from the request that
//! created it to every step that runs it.
//!
//! This module only parses, checks and formats the two header values
//! (<https://www.w3.org/TR/trace-context/>); spans and export are the engine's and the server's.
//!
//! A malformed `traceparent` is not an error: as the recommendation asks of a receiver, it is
//! ignored (the task is stored without a trace context, and the server starts a new trace when it
//! exports spans), and so is the `tracestate` that came with it. A malformed `tracestate` beside a
//! valid `traceparent` is dropped alone.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The longest `tracestate` kept (the recommendation's lower bound for what must be propagated).
pub const MAX_TRACESTATE_LEN: usize = 512;
/// The most list members a `tracestate` may have.
pub const MAX_TRACESTATE_MEMBERS: usize = 32;

/// A checked W3C trace context: `traceparent` in its version-00 form (lowercase hex), and the
/// vendor `tracestate` when one came with it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TraceContext {
    traceparent: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tracestate: Option<String>,
}

impl TraceContext {
    /// Parses header values. `None` when `traceparent` is malformed (then `tracestate` is not
    /// looked at); a malformed `tracestate` is dropped. A traceparent of a later version is read
    /// by its version-00 prefix, as the recommendation says, and kept in the version-00 form.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<TraceContext> {
        let (trace_id, span_id, flags) = parse_traceparent(traceparent.trim_matches([' ', '\t']))?;
        let tracestate = tracestate
            .map(|s| s.trim_matches([' ', '\t']))
            .filter(|s| valid_tracestate(s))
            .map(str::to_string);
        Some(TraceContext {
            traceparent: format!("00-{}-{}-{flags:02x}", hex(&trace_id), hex(&span_id)),
            tracestate,
        })
    }

    /// A context from its parts (`flags`: bit 0 is "sampled"). `None` for an all-zero id.
    pub fn from_parts(
        trace_id: [u8; 16],
        span_id: [u8; 8],
        flags: u8,
        tracestate: Option<String>,
    ) -> Option<TraceContext> {
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(TraceContext {
            traceparent: format!("00-{}-{}-{flags:02x}", hex(&trace_id), hex(&span_id)),
            tracestate: tracestate.filter(|s| !s.is_empty() && valid_tracestate(s)),
        })
    }

    /// The `traceparent` header value (`00-<trace id>-<parent id>-<flags>`).
    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }
    /// The `tracestate` header value, when there is one.
    pub fn tracestate(&self) -> Option<&str> {
        self.tracestate.as_deref()
    }
    /// The trace id (16 bytes, never all zero).
    pub fn trace_id(&self) -> [u8; 16] {
        // The string was checked when the value was made.
        parse_traceparent(&self.traceparent)
            .map(|(t, _, _)| t)
            .unwrap_or_default()
    }
    /// The id of the span this context names as the parent of the next one (8 bytes).
    pub fn span_id(&self) -> [u8; 8] {
        parse_traceparent(&self.traceparent)
            .map(|(_, s, _)| s)
            .unwrap_or_default()
    }
    /// The trace flags (bit 0: sampled).
    pub fn flags(&self) -> u8 {
        parse_traceparent(&self.traceparent)
            .map(|(_, _, f)| f)
            .unwrap_or_default()
    }
    /// The trace id as 32 lowercase hex digits.
    pub fn trace_id_hex(&self) -> &str {
        &self.traceparent[3..35]
    }
}

impl fmt::Display for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.traceparent)
    }
}

fn hex(bytes: &[u8]) -> String {
    use fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn lower_hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    let b = s.as_bytes();
    if b.len() != N * 2 {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = (digit(b[2 * i])? << 4) | digit(b[2 * i + 1])?;
    }
    Some(out)
}

/// `version-traceid-parentid-flags`, lowercase hex; version `ff` and all-zero ids are invalid; a
/// version-00 value has exactly four fields, a later version may have more after a `-`.
fn parse_traceparent(s: &str) -> Option<([u8; 16], [u8; 8], u8)> {
    if s.len() < 55 {
        return None;
    }
    let [version] = lower_hex::<1>(s.get(0..2)?)?;
    if version == 0xff {
        return None;
    }
    let b = s.as_bytes();
    if b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
        return None;
    }
    let trace_id = lower_hex::<16>(s.get(3..35)?)?;
    let span_id = lower_hex::<8>(s.get(36..52)?)?;
    let [flags] = lower_hex::<1>(s.get(53..55)?)?;
    if version == 0 && s.len() != 55 {
        return None;
    }
    if version != 0 && s.len() > 55 && b[55] != b'-' {
        return None;
    }
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    // A later version's flags other than "sampled" are not ours to pass on.
    let flags = if version == 0 { flags } else { flags & 0x01 };
    Some((trace_id, span_id, flags))
}

/// `key=value` list members separated by commas (empty members allowed), at most 32 members and
/// 512 bytes, keys unique; keys `[a-z0-9_\-*/@]` starting with a letter or digit (256 bytes at
/// most), values printable ASCII without `,` and `=`, not ending in a space (256 bytes at most).
fn valid_tracestate(s: &str) -> bool {
    if s.is_empty() || s.len() > MAX_TRACESTATE_LEN {
        return false;
    }
    let mut keys: Vec<&str> = Vec::new();
    for member in s.split(',') {
        let member = member.trim_matches([' ', '\t']);
        if member.is_empty() {
            continue;
        }
        let Some((key, value)) = member.split_once('=') else {
            return false;
        };
        let key_ok = !key.is_empty()
            && key.len() <= 256
            && (key.as_bytes()[0].is_ascii_lowercase() || key.as_bytes()[0].is_ascii_digit())
            && key
                .bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"_-*/@".contains(&c))
            && key.bytes().filter(|&c| c == b'@').count() <= 1;
        let value_ok = !value.is_empty()
            && value.len() <= 256
            && value
                .bytes()
                .all(|c| (0x20..=0x7e).contains(&c) && c != b',' && c != b'=')
            && !value.ends_with(' ');
        if !key_ok || !value_ok || keys.contains(&key) {
            return false;
        }
        keys.push(key);
    }
    !keys.is_empty() && keys.len() <= MAX_TRACESTATE_MEMBERS
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_version_00_traceparent_round_trips() {
        let t = TraceContext::parse(GOOD, Some("congo=t61rcWkgMzE")).unwrap();
        assert_eq!(t.traceparent(), GOOD);
        assert_eq!(t.tracestate(), Some("congo=t61rcWkgMzE"));
        assert_eq!(t.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.span_id()[0], 0x00);
        assert_eq!(t.span_id()[7], 0xb7);
        assert_eq!(t.flags(), 1);
        assert_eq!(
            TraceContext::from_parts(t.trace_id(), t.span_id(), 1, None)
                .unwrap()
                .traceparent(),
            GOOD
        );
    }

    #[test]
    fn malformed_traceparents_are_ignored() {
        for bad in [
            "",
            "00",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", // uppercase
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01", // zero trace id
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", // zero parent id
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", // version ff
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", // 00 with more
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-011",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0ü",
        ] {
            assert_eq!(TraceContext::parse(bad, Some("a=b")), None, "{bad:?}");
        }
    }

    #[test]
    fn a_later_version_is_read_by_its_00_prefix() {
        let later = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03-whatever";
        let t = TraceContext::parse(later, None).unwrap();
        assert_eq!(t.traceparent(), GOOD);
        assert_eq!(
            TraceContext::parse(
                "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
                None
            ),
            None
        );
    }

    #[test]
    fn a_malformed_tracestate_is_dropped_alone() {
        for bad in [
            "=b",
            "A=b",
            "a",
            "a=b,a=c",
            "a=b=c",
            "a=\u{7f}",
            &"k=v,".repeat(33),
            &format!("a={}", "x".repeat(600)),
        ] {
            let t = TraceContext::parse(GOOD, Some(bad)).unwrap();
            assert_eq!(t.tracestate(), None, "{bad:?}");
        }
        let t =
            TraceContext::parse(GOOD, Some("rojo=00f067aa0ba902b7, congo=t61rcWkgMzE,,")).unwrap();
        assert_eq!(
            t.tracestate(),
            Some("rojo=00f067aa0ba902b7, congo=t61rcWkgMzE,,")
        );
        let t = TraceContext::parse(GOOD, Some("tenant@vendor=1")).unwrap();
        assert_eq!(t.tracestate(), Some("tenant@vendor=1"));
    }
}

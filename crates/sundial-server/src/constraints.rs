//! The checks the server makes on request fields, written into the OpenAPI document as JSON Schema
//! keywords (`pattern`, `minLength`, `maxLength`, `minimum`, `maximum`, `enum`, `format`), so that
//! a client generated from the document, or a fuzzer reading it, knows what is accepted.
//!
//! Each entry says no more than the server checks: every value the keywords refuse, the server
//! refuses too. Some checks go further than the keywords can say (a byte length for text that may
//! be non-ASCII, a duration's upper bound, a cron expression's grammar, cross-field rules such as
//! "cron or every"); those stay in the fields' descriptions.

use serde_json::{Value, json};
use utoipa::Number;
use utoipa::openapi::path::ParameterIn;
use utoipa::openapi::schema::{KnownFormat, Schema, SchemaFormat, SchemaType, Type};
use utoipa::openapi::{OpenApi, RefOr};

/// Names of queues and kinds (`sundial_core`'s rule): ASCII letters, digits and `. _ : / -`,
/// starting with a letter or digit.
const NAME: &str = "^[A-Za-z0-9][A-Za-z0-9._:/-]*$";

/// A wire duration (`crate::duration`): whole numbers with units, largest unit first, each unit
/// at most once.
const DURATION: &str = "^(?:[0-9]+d(?:[0-9]+h)?(?:[0-9]+m)?(?:[0-9]+s)?(?:[0-9]+ms)?|[0-9]+h(?:[0-9]+m)?(?:[0-9]+s)?(?:[0-9]+ms)?|[0-9]+m(?:[0-9]+s)?(?:[0-9]+ms)?|[0-9]+s(?:[0-9]+ms)?|[0-9]+ms)$";

/// Keys (task keys, idempotency and exclusive keys, tag keys and values): no control characters
/// and no leading or trailing white space (Unicode's `White_Space`, as Rust's `str::trim`).
const KEY: &str = "^[^\\u0000-\\u0020\\u007f-\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000](?:[^\\u0000-\\u001f\\u007f-\\u009f]*[^\\u0000-\\u0020\\u007f-\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000])?$";

/// Worker and token names: no control characters (at most 128 bytes).
const NO_CONTROL: &str = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$";

/// Namespaces (`admin::check_namespace_name`).
const NAMESPACE: &str = "^[a-z][a-z0-9_-]{0,62}$";

fn name(max: usize) -> Value {
    json!({"minLength": 1, "maxLength": max, "pattern": NAME})
}

fn duration() -> Value {
    json!({"pattern": DURATION})
}

fn key() -> Value {
    json!({"minLength": 1, "pattern": KEY})
}

fn no_control() -> Value {
    json!({"minLength": 1, "pattern": NO_CONTROL})
}

/// A `u32` (which utoipa writes as `int32`, refusing the upper half the server takes).
fn u32_count() -> Value {
    json!({"format": "int64", "minimum": 0, "maximum": u32::MAX})
}

/// A `u32` the server refuses at 0.
fn u32_positive() -> Value {
    json!({"format": "int64", "minimum": 1, "maximum": u32::MAX})
}

/// A schedule's or a backfill's overlap rule (`sundial_schedules::Overlap`).
fn overlap() -> Value {
    json!({"enum": ["skip", "buffer_one", "buffer_all", "allow_all", "cancel_other", null]})
}

/// A `u64` (which utoipa writes as `int64`, refusing the upper half the server takes).
fn u64_count() -> Value {
    json!({"format": "none", "minimum": 0, "maximum": u64::MAX})
}

/// An optional millisecond field of the workflow worker protocol that also takes a duration
/// string (`sundial_core::duration::opt_millis`): `minimum`/`maximum` bind the number, `pattern`
/// the string.
fn opt_millis_or_duration() -> Value {
    json!({"type": ["integer", "string", "null"], "format": "none", "minimum": 0, "maximum": u64::MAX, "pattern": DURATION})
}

fn date_time() -> Value {
    json!({"format": "date-time"})
}

/// `(component schema, property, keywords)`: the keywords are merged into the property's schema.
fn properties() -> Vec<(&'static str, &'static str, Value)> {
    let limits = sundial::Limits::default();
    let n = limits.max_name_len;
    vec![
        ("CreateTask", "kind", name(n)),
        ("CreateTask", "queue", name(n)),
        ("CreateTask", "delay", duration()),
        ("CreateTask", "timeout", duration()),
        ("CreateTask", "key", key()),
        ("CreateTask", "idempotency_version", u64_count()),
        ("CreateTask", "idempotency_key", key()),
        ("ExclusiveSpec", "key", key()),
        ("TargetSpec", "timeout", duration()),
        ("BackoffSpec", "initial", duration()),
        ("BackoffSpec", "max", duration()),
        ("PollRequest", "worker", no_control()),
        ("PollRequest", "wait", duration()),
        ("PollRequest", "max", u32_positive()),
        ("NamespaceWire", "max_creates_per_second", u32_positive()),
        ("PollWorkflowTasks", "max", u32_count()),
        ("PollWorkflowTasks", "wait_ms", opt_millis_or_duration()),
        ("PollWorkflowTasks", "wait", duration()),
        ("PollActivities", "max", u32_count()),
        ("PollActivities", "wait_ms", opt_millis_or_duration()),
        ("PollActivities", "wait", duration()),
        ("NamespaceWire", "max_live_tasks", u64_count()),
        ("RetentionView", "succeeded", duration()),
        ("RetentionView", "cancelled", duration()),
        ("RetentionView", "dead", duration()),
        ("RotateSecret", "overlap", duration()),
        ("AddSecret", "secret", json!({"pattern": "^whsec_"})),
        ("RotateSecret", "secret", json!({"pattern": "^whsec_"})),
        ("CreateToken", "expires_in", duration()),
        ("CreateToken", "name", no_control()),
        (
            "CreateToken",
            "scope",
            json!({"enum": ["admin", "producer", "worker", "reader"]}),
        ),
        ("CreateToken", "namespace", json!({"pattern": NAMESPACE})),
        ("NamespaceWire", "name", json!({"pattern": NAMESPACE})),
        ("ScheduleRequest", "every", duration()),
        ("ScheduleRequest", "jitter", duration()),
        ("ScheduleRequest", "catchup_window", duration()),
        ("ScheduleRequest", "anchor", date_time()),
        ("ScheduleRequest", "start_at", date_time()),
        ("ScheduleRequest", "end_at", date_time()),
        ("PreviewRequest", "every", duration()),
        ("PreviewRequest", "anchor", date_time()),
        ("PreviewRequest", "from", date_time()),
        (
            "PreviewRequest",
            "count",
            json!({"minimum": 1, "maximum": sundial_schedules::MAX_PREVIEW}),
        ),
        ("ScheduleRequest", "overlap", overlap()),
        ("BackfillRequest", "overlap", overlap()),
        ("BackfillRequest", "from", date_time()),
        ("BackfillRequest", "to", date_time()),
        ("StartRequest", "type", name(sundial_workflow::MAX_NAME_LEN)),
        (
            "StartRequest",
            "id_reuse",
            json!({"enum": ["allow_duplicate", "allow_duplicate_failed_only", "reject_duplicate", null]}),
        ),
    ]
}

/// `(path, parameter, keywords)` for path and query parameters (`*`: the path parameter of that
/// name on every path).
fn parameters() -> Vec<(&'static str, &'static str, Value)> {
    let n = sundial::Limits::default().max_name_len;
    vec![
        ("*", "queue", name(n)),
        ("/v1/audit", "limit", json!({"minimum": 1, "maximum": 1000})),
        ("/v1/schedules/{id}/fires", "before", date_time()),
        ("/v1/tasks", "due_after", date_time()),
        ("/v1/tasks", "due_before", date_time()),
        ("/v1/tasks", "created_after", date_time()),
        ("/v1/tasks", "created_before", date_time()),
        (
            "/v1/tasks",
            "state",
            json!({"enum": ["scheduled", "ready", "running", "succeeded", "dead", "cancelled"]}),
        ),
        (
            "/v1/workflows",
            "status",
            json!({"enum": ["running", "completed", "failed", "cancelled", "terminated", "continued_as_new"]}),
        ),
    ]
}

/// Sets the keywords on an object schema (other shapes are left as they are).
fn merge(target: &mut RefOr<Schema>, keywords: &Value) {
    let RefOr::T(Schema::Object(o)) = target else {
        return;
    };
    let Some(k) = keywords.as_object() else {
        return;
    };
    let count = |v: &Value| v.as_u64().and_then(|n| usize::try_from(n).ok());
    for (key, v) in k {
        match key.as_str() {
            "pattern" => o.pattern = v.as_str().map(str::to_string),
            "minLength" => o.min_length = count(v),
            "maxLength" => o.max_length = count(v),
            "minimum" => o.minimum = count(v).map(Number::UInt),
            "maximum" => o.maximum = count(v).map(Number::UInt),
            "format" => {
                o.format = match v.as_str() {
                    Some("int64") => Some(SchemaFormat::KnownFormat(KnownFormat::Int64)),
                    Some("none") => None,
                    _ => Some(SchemaFormat::KnownFormat(KnownFormat::DateTime)),
                }
            }
            "enum" => o.enum_values = v.as_array().cloned(),
            "type" => {
                let types = v
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|t| match t.as_str() {
                        Some("integer") => Some(Type::Integer),
                        Some("string") => Some(Type::String),
                        Some("null") => Some(Type::Null),
                        _ => None,
                    });
                o.schema_type = SchemaType::from_iter(types);
            }
            _ => {}
        }
    }
}

/// Writes the constraints into `doc`.
pub fn apply(doc: &mut OpenApi) {
    if let Some(components) = doc.components.as_mut() {
        for (schema, property, keywords) in properties() {
            if let Some(RefOr::T(Schema::Object(o))) = components.schemas.get_mut(schema)
                && let Some(p) = o.properties.get_mut(property)
            {
                merge(p, &keywords);
            }
        }
    }
    let params = parameters();
    for (path, item) in doc.paths.paths.iter_mut() {
        let ops = [
            item.get.as_mut(),
            item.put.as_mut(),
            item.post.as_mut(),
            item.delete.as_mut(),
            item.patch.as_mut(),
        ];
        for op in ops.into_iter().flatten() {
            for p in op.parameters.iter_mut().flatten() {
                let RefOr::T(p) = p else { continue };
                let keywords = params
                    .iter()
                    .find(|(at, n, _)| {
                        let here = if *at == "*" {
                            p.parameter_in == ParameterIn::Path
                        } else {
                            at == path
                        };
                        here && *n == p.name
                    })
                    .map(|(_, _, k)| k);
                if let (Some(k), Some(s)) = (keywords, p.schema.as_mut()) {
                    merge(s, k);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `pattern` matches `s`, read by the `regex` crate (the patterns use only what it
    /// reads as ECMA 262 does, once `\uXXXX` is spelled `\x{XXXX}`).
    fn matches(pattern: &str, s: &str) -> bool {
        let mut p = String::new();
        let mut rest = pattern;
        while let Some(i) = rest.find("\\u") {
            p.push_str(&rest[..i]);
            p.push_str(&format!("\\x{{{}}}", &rest[i + 2..i + 6]));
            rest = &rest[i + 6..];
        }
        p.push_str(rest);
        regex::Regex::new(&p).expect("pattern").is_match(s)
    }

    #[test]
    fn the_duration_pattern_is_the_parser() {
        for s in [
            "1500ms",
            "30s",
            "5m",
            "2h",
            "3d",
            "1h30m",
            "1d2h3m4s5ms",
            "0s",
            "5m1ms",
            "",
            "5",
            "m",
            "1m1h",
            "1s1s",
            "1 s",
            "-1s",
            "1.5s",
            "1ms1s",
            "5M",
            "1w",
            "5mins",
            "1d1ms",
        ] {
            assert_eq!(
                matches(DURATION, s),
                crate::duration::parse(s).is_ok(),
                "{s:?}"
            );
        }
    }

    #[test]
    fn the_key_pattern_is_the_check() {
        for (s, ok) in [
            ("a", true),
            ("a b", true),
            (" a", false),
            ("a ", false),
            ("a\u{3000}", false),
            ("a\u{7}b", false),
            ("\u{feff}a", true),
            ("é", true),
            ("", false),
        ] {
            assert_eq!(matches(KEY, s), ok, "{s:?}");
        }
    }
}

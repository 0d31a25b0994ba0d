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
use utoipa::openapi::extensions::Extensions;
use utoipa::openapi::path::{Operation, ParameterIn, PathItem};
use utoipa::openapi::schema::{
    AdditionalProperties, AllOf, ArrayItems, KnownFormat, Object, Schema, SchemaFormat, SchemaType,
    Type,
};
use utoipa::openapi::{OpenApi, RefOr};

/// Names of queues and kinds (`sundial_core`'s rule): ASCII letters, digits and `. _ : / -`,
/// starting with a letter or digit.
const NAME: &str = "^[A-Za-z0-9][A-Za-z0-9._:/-]*$";

/// A wire duration (`crate::duration`): whole numbers with units, largest unit first, each unit
/// at most once.
///
/// The numbers have at most 9 digits of days, 10 of hours, 11 of minutes, 13 of seconds and 16
/// of milliseconds, so that every duration the pattern admits fits the parser's range (a longer
/// number with leading zeros is read by the server too, but is not in the document).
const DURATION: &str = "^(?:[0-9]{1,9}d(?:[0-9]{1,10}h)?(?:[0-9]{1,11}m)?(?:[0-9]{1,13}s)?(?:[0-9]{1,16}ms)?|[0-9]{1,10}h(?:[0-9]{1,11}m)?(?:[0-9]{1,13}s)?(?:[0-9]{1,16}ms)?|[0-9]{1,11}m(?:[0-9]{1,13}s)?(?:[0-9]{1,16}ms)?|[0-9]{1,13}s(?:[0-9]{1,16}ms)?|[0-9]{1,16}ms)$";

/// A validity (`crate::duration::parse_validity`: a token's `expires_in`, a rotation's
/// `overlap`): a [`DURATION`] with at most 4 digits of days, 5 of hours, 6 of minutes, 8 of
/// seconds and 11 of milliseconds. The longest it admits, `9999d99999h999999m99999999s
/// 99999999999ms`, is about 17,200 days, within the server's bound of 36,500 days, so every value
/// it admits is taken. (The server also takes longer spellings up to its bound, such as `20000d`.)
const VALIDITY: &str = "^(?:[0-9]{1,4}d(?:[0-9]{1,5}h)?(?:[0-9]{1,6}m)?(?:[0-9]{1,8}s)?(?:[0-9]{1,11}ms)?|[0-9]{1,5}h(?:[0-9]{1,6}m)?(?:[0-9]{1,8}s)?(?:[0-9]{1,11}ms)?|[0-9]{1,6}m(?:[0-9]{1,8}s)?(?:[0-9]{1,11}ms)?|[0-9]{1,8}s(?:[0-9]{1,11}ms)?|[0-9]{1,11}ms)$";

/// Keys (task keys, idempotency and exclusive keys, tag keys and values): no control characters
/// and no leading or trailing white space (Unicode's `White_Space`, as Rust's `str::trim`).
const KEY: &str = "^[^\\u0000-\\u0020\\u007f-\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000](?:[^\\u0000-\\u001f\\u007f-\\u009f]*[^\\u0000-\\u0020\\u007f-\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000])?$";

/// Worker and token names: no control characters (at most 128 bytes).
const NO_CONTROL: &str = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$";

/// Namespaces (`admin::check_namespace_name`).
const NAMESPACE: &str = "^[a-z][a-z0-9_-]{0,62}$";

/// RFC 3339 times keep at most millisecond digits (the server refuses finer ones rather than
/// round them); `format: date-time` says the rest of the grammar.
/// (Finer digits that are all zero are read as the milliseconds they spell.)
const MILLIS: &str = "^[^.]*(?:\\.[0-9]{1,3}0{0,6}(?:[^0-9.][^.]*)?)?$";

/// A task's due time: as [`MILLIS`], in the years 1970 to 9999 (`sundial_core::task`'s range).
const DUE_TIME: &str =
    "^(?:19[7-9][0-9]|[2-9][0-9]{3})-[^.]*(?:\\.[0-9]{1,3}0{0,6}(?:[^0-9.][^.]*)?)?$";

/// A push target's method (`wire::TargetSpec`): one of five, in any case.
const METHOD: &str = "^(?:[Pp][Oo][Ss][Tt]|[Pp][Uu][Tt]|[Pp][Aa][Tt][Cc][Hh]|[Dd][Ee][Ll][Ee][Tt][Ee]|[Gg][Ee][Tt])$";

/// A push target's URL, a part of what the server takes (`sundial_core::target`): `http` or
/// `https`, a host name whose every label starts with a letter, an optional port, a path.
const URL: &str = "^[Hh][Tt][Tt][Pp][Ss]?://[A-Za-z][A-Za-z0-9-]*(?:\\.[A-Za-z][A-Za-z0-9-]*)*(?::[1-9][0-9]{0,3})?(?:/[A-Za-z0-9._~/-]*)?$";

/// A header name a target may set: an HTTP token.
const HEADER_NAME: &str = "^[!#$%&'*+.^_`|~0-9A-Za-z-]+$";

/// A header value: visible ASCII, spaces and tabs.
const HEADER_VALUE: &str = "^[\\t\\u0020-\\u007e]*$";

/// Sundial's own queues and kinds (`sundial_core::INTERNAL_QUEUE_PREFIX`), which clients may
/// not use.
const INTERNAL: &str = "^sundial\\.";

/// A retention under one second (`ops::retention`'s floor): every unit zero and fewer than
/// 1,000 milliseconds.
const SUB_SECOND: &str = "^(?:0+d)?(?:0+h)?(?:0+m)?(?:0+s)?(?:0*[0-9]{1,3}ms)?$";

/// A tag filter (`ops::parse_tags`): a key without `:`, then `:`, then a value.
const TAG_FILTER: &str = "^[^:]+:[\\s\\S]+$";

/// A task id as `uuid::Uuid::parse_str` reads it: hyphenated, simple, braced or URN, hex digits
/// in either case.
const UUID: &str = "^(?:[0-9A-Fa-f]{32}|[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}|\\{[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}\\}|urn:uuid:[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12})$";

/// A push signing secret (`sundial_push::SigningKey::parse`): `whsec_` and the padded standard
/// base64 of 24 to 64 bytes, with the unused bits of the last character zero.
const SECRET: &str = "^whsec_(?:(?:[A-Za-z0-9+/]{4}){8,21}(?:[A-Za-z0-9+/][AQgw]==)?|(?:[A-Za-z0-9+/]{4}){8,20}[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)$";

/// A workflow list's cursor: any workflow id, which holds no namespace separator.
const NO_SEPARATOR: &str = "^[^\\u001f]*$";

/// One line (an error group: the first line of a task's last error).
const ONE_LINE: &str = "^[^\\n]*$";

fn name(max: usize) -> Value {
    json!({"minLength": 1, "maxLength": max, "pattern": NAME})
}

fn duration() -> Value {
    json!({"pattern": DURATION})
}

fn validity() -> Value {
    json!({"pattern": VALIDITY})
}

fn key() -> Value {
    json!({"minLength": 1, "pattern": KEY})
}

/// A signal's name: like a key (no control characters, no whitespace at either end), 1 to `max`
/// bytes of UTF-8 (`maxLength` counts characters, so it only bounds the bytes from above).
fn signal_name(max: usize) -> Value {
    json!({"minLength": 1, "maxLength": max, "pattern": KEY})
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
    json!({"format": "date-time", "pattern": MILLIS})
}

/// `s` in any case, as a pattern (`"te"` → `"[Tt][Ee]"`).
fn any_case(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphabetic() {
                format!("[{}{}]", c.to_ascii_uppercase(), c.to_ascii_lowercase())
            } else if c == '-' {
                "-".to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// A target's headers: token names, none of them Sundial's own (`sundial_core::target`), and
/// visible ASCII values.
fn headers() -> Value {
    let reserved = sundial_core::target::RESERVED_HEADERS
        .iter()
        .map(|h| format!("{}$", any_case(h)))
        .chain(
            sundial_core::target::RESERVED_HEADER_PREFIXES
                .iter()
                .map(|p| any_case(p)),
        )
        .collect::<Vec<_>>()
        .join("|");
    json!({
        "propertyNames": {
            "pattern": HEADER_NAME,
            "not": {"pattern": format!("^(?:{reserved})")}
        },
        "additionalProperties": {"type": "string", "pattern": HEADER_VALUE}
    })
}

/// A due time (see [`DUE_TIME`]).
fn due_time() -> Value {
    json!({"format": "date-time", "pattern": DUE_TIME})
}

/// A queue or kind a client names: not one of Sundial's own.
fn client_name(max: usize) -> Value {
    let mut v = name(max);
    v["not"] = json!({"type": "string", "pattern": INTERNAL});
    v
}

/// A duration of at least one second (a retention, a schedule's period).
fn at_least_a_second() -> Value {
    json!({"pattern": DURATION, "not": {"type": "string", "pattern": SUB_SECOND}})
}

/// A time zone: a name of the bundled IANA database, or none.
fn time_zone() -> Value {
    let mut names: Vec<Value> = sundial_core::schedule::time_zone_names()
        .into_iter()
        .map(Value::String)
        .collect();
    names.push(Value::Null);
    json!({ "enum": names })
}

/// The statuses a push target may make retryable (`sundial_core::target`): 4xx other than 410
/// and 429.
fn retry_statuses() -> Value {
    let statuses: Vec<u16> = (400..=499).filter(|s| *s != 410 && *s != 429).collect();
    json!({"items": {"enum": statuses, "format": "none"}})
}

/// `(component schema, property, keywords)`: the keywords are merged into the property's schema.
fn properties() -> Vec<(&'static str, &'static str, Value)> {
    let limits = sundial::Limits::default();
    let n = limits.max_name_len;
    vec![
        ("BulkRequest", "error_group", json!({"pattern": ONE_LINE})),
        ("CreateTask", "kind", client_name(n)),
        ("CreateTask", "queue", client_name(n)),
        ("CreateTask", "run_at", due_time()),
        ("RetryRequest", "run_at", due_time()),
        ("BulkRequest", "run_at", due_time()),
        (
            "BulkRequest",
            "key_prefix",
            json!({"pattern": "^[^\\u001f]+$"}),
        ),
        ("TargetSpec", "method", json!({"pattern": METHOD})),
        ("TargetSpec", "url", json!({"pattern": URL})),
        ("Target", "url", json!({"pattern": URL})),
        ("TargetSpec", "headers", headers()),
        ("Target", "headers", headers()),
        (
            "DstWire",
            "skipped",
            json!({"enum": ["shift", "skip", null]}),
        ),
        (
            "DstWire",
            "repeated",
            json!({"enum": ["first", "last", "both", null]}),
        ),
        ("CreateTask", "delay", duration()),
        ("CreateTask", "timeout", duration()),
        ("CreateTask", "key", key()),
        ("CreateTask", "idempotency_version", u64_count()),
        (
            "CreateTask",
            "max_attempts",
            json!({"minimum": 1, "maximum": limits.max_attempts}),
        ),
        ("CreateTask", "idempotency_key", key()),
        (
            "CreateTask",
            "priority",
            json!({"minimum": 0, "maximum": 9}),
        ),
        ("ExclusiveSpec", "key", key()),
        ("ConcurrencySpec", "key", key()),
        ("ThrottleSpec", "key", key()),
        ("ThrottleSpec", "per", duration()),
        ("RateSpec", "key", key()),
        ("RateSpec", "per", duration()),
        ("RateSpec", "limit", json!({"minimum": 1, "maximum": 10000})),
        ("DebounceSpec", "key", key()),
        ("DebounceSpec", "delay", duration()),
        ("DebounceSpec", "max_wait", duration()),
        (
            "ConcurrencySpec",
            "limit",
            json!({"minimum": 1, "maximum": 10000}),
        ),
        (
            "CreateTask",
            "tags",
            json!({
                "maxProperties": limits.max_tags,
                "propertyNames": {"minLength": 1, "pattern": KEY, "not": {"pattern": ":"}},
                "additionalProperties": {"type": "string", "minLength": 1, "pattern": KEY}
            }),
        ),
        (
            "ScheduleRequest",
            "cron",
            json!({"format": "cron", "minLength": 1}),
        ),
        (
            "PreviewRequest",
            "cron",
            json!({"format": "cron", "minLength": 1}),
        ),
        ("TargetSpec", "timeout", duration()),
        ("BackoffSpec", "initial", duration()),
        ("BackoffSpec", "max", duration()),
        (
            "BackoffSpec",
            "factor",
            json!({"minimum": 1, "maximum": 100}),
        ),
        ("BackoffSpec", "jitter", json!({"minimum": 0, "maximum": 1})),
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
        ("RetentionView", "succeeded", at_least_a_second()),
        ("RetentionView", "cancelled", at_least_a_second()),
        ("RetentionView", "dead", at_least_a_second()),
        ("RotateSecret", "overlap", validity()),
        ("AddSecret", "secret", json!({"pattern": SECRET})),
        ("RotateSecret", "secret", json!({"pattern": SECRET})),
        ("PollRequest", "kinds", json!({"minItems": 1})),
        (
            "BulkRequest",
            "tag",
            json!({"items": {"pattern": TAG_FILTER}}),
        ),
        ("TargetSpec", "retry_statuses", retry_statuses()),
        ("Target", "retry_statuses", retry_statuses()),
        (
            "ScheduleRequest",
            "id",
            name(sundial_core::schedule::MAX_SCHEDULE_ID_LEN),
        ),
        ("ScheduleRequest", "timezone", time_zone()),
        ("PreviewRequest", "timezone", time_zone()),
        ("StartRequest", "id", key()),
        (
            "PollWorkflowTasks",
            "types",
            json!({"items": name(sundial_workflow::MAX_NAME_LEN)}),
        ),
        (
            "PollActivities",
            "names",
            json!({"items": name(sundial_workflow::MAX_NAME_LEN)}),
        ),
        ("CreateToken", "expires_in", validity()),
        ("CreateToken", "name", no_control()),
        (
            "CreateToken",
            "scope",
            json!({"enum": ["admin", "producer", "worker", "reader"]}),
        ),
        ("CreateToken", "namespace", json!({"pattern": NAMESPACE})),
        ("NamespaceWire", "name", json!({"pattern": NAMESPACE})),
        ("ScheduleRequest", "every", at_least_a_second()),
        ("ScheduleRequest", "jitter", duration()),
        ("ScheduleRequest", "catchup_window", duration()),
        ("ScheduleRequest", "anchor", due_time()),
        ("ScheduleRequest", "start_at", due_time()),
        ("ScheduleRequest", "end_at", due_time()),
        ("PreviewRequest", "every", at_least_a_second()),
        ("PreviewRequest", "anchor", due_time()),
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
        ("/v1/queues/{queue}/poll", "queue", client_name(n)),
        ("/v1/tasks", "error_group", json!({"pattern": ONE_LINE})),
        (
            "/v1/workflows/{id}/signals/{name}",
            "name",
            signal_name(sundial_workflow::MAX_NAME_LEN),
        ),
        ("*", "queue", name(n)),
        (
            "/v1/tasks",
            "key_prefix",
            json!({"pattern": "^[^\\u001f]+$"}),
        ),
        ("/v1/audit", "limit", json!({"minimum": 1, "maximum": 1000})),
        (
            "/v1/audit",
            "cursor",
            json!({"pattern": "^[+-]?[0-9]{1,18}$"}),
        ),
        ("/v1/tasks", "cursor", json!({"pattern": UUID})),
        (
            "/v1/tasks",
            "tag",
            json!({"items": {"pattern": TAG_FILTER}}),
        ),
        (
            "/v1/schedules",
            "cursor",
            name(sundial_core::schedule::MAX_SCHEDULE_ID_LEN),
        ),
        ("/v1/workflows", "cursor", json!({"pattern": NO_SEPARATOR})),
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

/// Sets the keywords on an object schema, or `minItems` and the items' keywords on an array
/// schema (other shapes are left as they are).
fn merge(target: &mut RefOr<Schema>, keywords: &Value) {
    let Some(k) = keywords.as_object() else {
        return;
    };
    let o = match target {
        RefOr::T(Schema::Object(o)) => o,
        RefOr::T(Schema::Array(a)) => {
            if let Some(n) = k.get("minItems").and_then(Value::as_u64) {
                a.min_items = usize::try_from(n).ok();
            }
            if let (Some(items), ArrayItems::RefOrSchema(s)) = (k.get("items"), &mut a.items) {
                merge(s, items);
            }
            return;
        }
        _ => return,
    };
    let count = |v: &Value| v.as_u64().and_then(|n| usize::try_from(n).ok());
    for (key, v) in k {
        match key.as_str() {
            "pattern" => o.pattern = v.as_str().map(str::to_string),
            "minLength" => o.min_length = count(v),
            "maxLength" => o.max_length = count(v),
            "minProperties" => o.min_properties = count(v),
            "maxProperties" => o.max_properties = count(v),
            "minimum" => o.minimum = count(v).map(Number::UInt),
            "maximum" => o.maximum = count(v).map(Number::UInt),
            "format" => {
                o.format = match v.as_str() {
                    Some("int64") => Some(SchemaFormat::KnownFormat(KnownFormat::Int64)),
                    Some("none") => None,
                    Some("cron") => Some(SchemaFormat::Custom("cron".to_string())),
                    _ => Some(SchemaFormat::KnownFormat(KnownFormat::DateTime)),
                }
            }
            "enum" => o.enum_values = v.as_array().cloned(),
            "propertyNames" => {
                let mut names = RefOr::T(Schema::Object(Object::with_type(Type::String)));
                merge(&mut names, v);
                if let RefOr::T(names) = names {
                    o.property_names = Some(Box::new(names));
                }
            }
            "additionalProperties" => {
                let mut values = RefOr::T(Schema::Object(Object::with_type(Type::String)));
                merge(&mut values, v);
                o.additional_properties = Some(Box::new(AdditionalProperties::RefOr(values)));
            }
            "not" => {
                o.extensions
                    .get_or_insert_with(Extensions::default)
                    .insert("not".to_string(), v.clone());
            }
            "type" => {
                let one = std::slice::from_ref(v);
                let types = v
                    .as_array()
                    .map_or(one, Vec::as_slice)
                    .iter()
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

/// Calls `f` on every object schema in `schema`, nested ones included.
fn each_object(schema: &mut RefOr<Schema>, f: &mut dyn FnMut(&mut Object)) {
    let RefOr::T(schema) = schema else { return };
    match schema {
        Schema::Object(o) => {
            f(o);
            for p in o.properties.values_mut() {
                each_object(p, f);
            }
        }
        Schema::Array(a) => {
            if let ArrayItems::RefOrSchema(s) = &mut a.items {
                each_object(s, f);
            }
        }
        Schema::OneOf(x) => x.items.iter_mut().for_each(|s| each_object(s, f)),
        Schema::AllOf(x) => x.items.iter_mut().for_each(|s| each_object(s, f)),
        Schema::AnyOf(x) => x.items.iter_mut().for_each(|s| each_object(s, f)),
        _ => {}
    }
}

/// Every `date-time` string keeps at most millisecond digits.
fn millisecond_times(o: &mut Object) {
    if o.format == Some(SchemaFormat::KnownFormat(KnownFormat::DateTime)) && o.pattern.is_none() {
        o.pattern = Some(MILLIS.to_string());
    }
}

/// An object schema that says the given properties are absent or `null`.
fn absent(fields: &[&str]) -> RefOr<Schema> {
    let mut o = Object::new();
    for f in fields {
        o.properties.insert(
            (*f).to_string(),
            RefOr::T(Schema::Object(Object::with_type(Type::Null))),
        );
    }
    RefOr::T(Schema::Object(o))
}

/// `schema` and `also`, both.
fn both(schema: RefOr<Schema>, also: RefOr<Schema>) -> RefOr<Schema> {
    let mut all = AllOf::new();
    all.items = vec![schema, also];
    RefOr::T(Schema::AllOf(all))
}

/// The rules that span fields:
///
/// - a task takes `run_at` or `delay`, not both, an `idempotency_version` only with an
///   `idempotency_key`, `exclusive` or `concurrency` (not both), `throttle` or
///   `idempotency_key` (not both), and `debounce` with none of `throttle`, `idempotency_key`,
///   `run_at` and `delay`;
/// - a schedule's task template has no `key`, `run_at` or `delay` (the schedule sets them);
/// - a batch's tasks have no idempotency key or version, no throttle and no debounce (single
///   creates only);
/// - `tasks:cancel` takes no `run_at` (it applies to `tasks:retry`);
/// - a workflow poll takes `wait` or `wait_ms`, not both;
/// - `PATCH /v1/schedules/{id}` takes no `id` (it cannot change).
fn cross_field_rules(doc: &mut OpenApi) {
    if let Some(components) = doc.components.as_mut() {
        if let Some(RefOr::T(Schema::Object(o))) = components.schemas.get_mut("CreateTask") {
            o.extensions.get_or_insert_with(Extensions::default).insert(
                "not".to_string(),
                json!({"anyOf": [
                    {
                        "required": ["run_at", "delay"],
                        "properties": {"run_at": {"type": "string"}, "delay": {"type": "string"}}
                    },
                    {
                        "required": ["idempotency_version"],
                        "properties": {"idempotency_version": {"type": "integer"}},
                        "not": {
                            "required": ["idempotency_key"],
                            "properties": {"idempotency_key": {"type": "string"}}
                        }
                    },
                    {
                        "required": ["exclusive", "concurrency"],
                        "properties": {
                            "exclusive": {"type": "object"},
                            "concurrency": {"type": "object"}
                        }
                    },
                    {
                        "required": ["throttle", "idempotency_key"],
                        "properties": {
                            "throttle": {"type": "object"},
                            "idempotency_key": {"type": "string"}
                        }
                    },
                    {
                        "required": ["debounce"],
                        "properties": {"debounce": {"type": "object"}},
                        "anyOf": [
                            {"required": ["throttle"], "properties": {"throttle": {"type": "object"}}},
                            {"required": ["idempotency_key"], "properties": {"idempotency_key": {"type": "string"}}},
                            {"required": ["run_at"], "properties": {"run_at": {"type": "string"}}},
                            {"required": ["delay"], "properties": {"delay": {"type": "string"}}}
                        ]
                    }
                ]}),
            );
        }
        // `anchor` aligns `every` and goes with nothing else (a change of a schedule names its
        // `every` again when it gives an `anchor`).
        let anchor_without_every = json!({
            "required": ["anchor"],
            "properties": {"anchor": {"type": "string"}},
            "not": {"required": ["every"], "properties": {"every": {"type": "string"}}}
        });
        if let Some(RefOr::T(Schema::Object(o))) = components.schemas.get_mut("ScheduleRequest") {
            o.extensions.get_or_insert_with(Extensions::default).insert(
                "not".to_string(),
                json!({"anyOf": [
                    {
                        "required": ["cron", "every"],
                        "properties": {"cron": {"type": "string"}, "every": {"type": "string"}}
                    },
                    anchor_without_every.clone()
                ]}),
            );
        }
        if let Some(RefOr::T(Schema::Object(o))) = components.schemas.get_mut("PreviewRequest") {
            o.extensions
                .get_or_insert_with(Extensions::default)
                .insert("not".to_string(), anchor_without_every);
        }
        if let Some(RefOr::T(Schema::Object(o))) = components.schemas.get_mut("ScheduleRequest")
            && let Some(RefOr::T(Schema::OneOf(one))) = o.properties.get_mut("task")
            && let Some(first) = one.items.first_mut()
        {
            *first = both(
                first.clone(),
                absent(&[
                    "key",
                    "run_at",
                    "delay",
                    "idempotency_key",
                    "idempotency_version",
                    "throttle",
                    "debounce",
                ]),
            );
        }
        if let Some(RefOr::T(Schema::Object(o))) = components.schemas.get_mut("CreateBatch")
            && let Some(RefOr::T(Schema::Array(a))) = o.properties.get_mut("tasks")
            && let ArrayItems::RefOrSchema(items) = &mut a.items
        {
            **items = both(
                (**items).clone(),
                absent(&[
                    "idempotency_key",
                    "idempotency_version",
                    "throttle",
                    "debounce",
                ]),
            );
        }
    }
    if let Some(components) = doc.components.as_mut() {
        if let Some(RefOr::T(Schema::Object(o))) = components.schemas.get_mut("BulkRequest") {
            let set =
                |f: &str| json!({"required": [f], "properties": {f: {"not": {"type": "null"}}}});
            let mut any: Vec<Value> = [
                "queue",
                "kind",
                "state",
                "key_prefix",
                "error_group",
                "created_after",
                "created_before",
                "due_after",
                "due_before",
            ]
            .into_iter()
            .map(set)
            .collect();
            any.push(json!({"required": ["tag"], "properties": {"tag": {"minItems": 1}}}));
            o.extensions
                .get_or_insert_with(Extensions::default)
                .insert("anyOf".to_string(), Value::Array(any));
        }
        for poll in ["PollWorkflowTasks", "PollActivities"] {
            if let Some(RefOr::T(Schema::Object(o))) = components.schemas.get_mut(poll) {
                o.extensions.get_or_insert_with(Extensions::default).insert(
                    "not".to_string(),
                    json!({
                        "required": ["wait", "wait_ms"],
                        "properties": {
                            "wait": {"type": "string"},
                            "wait_ms": {"not": {"type": "null"}}
                        }
                    }),
                );
            }
        }
    }
    restrict_body(
        doc,
        "/v1/schedules/{id}",
        |item| item.patch.as_mut(),
        &["id", "paused", "note"],
    );
    let cron_or_every = json!([
        {"required": ["cron"], "properties": {"cron": {"type": "string"}}},
        {"required": ["every"], "properties": {"every": {"type": "string"}}}
    ]);
    for path in ["/v1/schedules", "/v1/schedules:preview"] {
        add_to_body(
            doc,
            path,
            |item| item.post.as_mut(),
            |o| {
                o.extensions
                    .get_or_insert_with(Extensions::default)
                    .insert("oneOf".to_string(), cron_or_every.clone());
                if path == "/v1/schedules" {
                    // A create needs the task each fire creates.
                    o.required.push("task".to_string());
                    let mut set = Object::new();
                    set.extensions =
                        Some(Extensions::from_iter([("not", json!({"type": "null"}))]));
                    o.properties
                        .insert("task".to_string(), RefOr::T(Schema::Object(set)));
                }
            },
        );
    }
    restrict_body(
        doc,
        "/v1/tasks:cancel",
        |item| item.post.as_mut(),
        &["run_at"],
    );
}

/// Adds to the request body of one operation that `fields` are absent or `null`.
fn restrict_body(
    doc: &mut OpenApi,
    path: &str,
    op: impl FnOnce(&mut PathItem) -> Option<&mut Operation>,
    fields: &[&str],
) {
    add_to_body(doc, path, op, |o| {
        for f in fields {
            o.properties.insert(
                (*f).to_string(),
                RefOr::T(Schema::Object(Object::with_type(Type::Null))),
            );
        }
    });
}

/// Adds to the request body of one operation the schema `also` writes (into an empty object
/// schema), in an `allOf` with the body's own.
fn add_to_body(
    doc: &mut OpenApi,
    path: &str,
    op: impl FnOnce(&mut PathItem) -> Option<&mut Operation>,
    also: impl Fn(&mut Object),
) {
    if let Some(body) = doc
        .paths
        .paths
        .get_mut(path)
        .and_then(op)
        .and_then(|op| op.request_body.as_mut())
        && let RefOr::T(body) = body
    {
        for content in body.content.values_mut() {
            if let RefOr::T(content) = content
                && let Some(schema) = content.schema.take()
            {
                let mut extra = Object::new();
                also(&mut extra);
                content.schema = Some(both(schema, RefOr::T(Schema::Object(extra))));
            }
        }
    }
}

/// Writes the constraints into `doc`.
pub fn apply(doc: &mut OpenApi) {
    cross_field_rules(doc);
    if let Some(components) = doc.components.as_mut() {
        for schema in components.schemas.values_mut() {
            each_object(schema, &mut millisecond_times);
        }
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
                if let Some(s) = p.schema.as_mut() {
                    if let Some(k) = keywords {
                        merge(s, k);
                    }
                    each_object(s, &mut millisecond_times);
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
    fn every_duration_the_pattern_admits_parses() {
        for s in [
            "999999999d9999999999h99999999999m9999999999999s9999999999999999ms",
            "9999999999h",
            "99999999999m",
            "9999999999999s",
            "9999999999999999ms",
        ] {
            assert!(matches(DURATION, s), "{s}");
            assert!(crate::duration::parse(s).is_ok(), "{s}");
        }
        assert!(!matches(DURATION, "9999999999d"));
    }

    #[test]
    fn every_validity_the_pattern_admits_is_taken() {
        let longest = "9999d99999h999999m99999999s99999999999ms";
        for s in [
            longest,
            "99999h",
            "999999m",
            "99999999s",
            "99999999999ms",
            "24h",
            "0s",
        ] {
            assert!(matches(VALIDITY, s), "{s}");
            assert!(crate::duration::parse_validity(s).is_ok(), "{s}");
        }
        for s in ["10000d", "88000000d", "100000h", "1w", ""] {
            assert!(!matches(VALIDITY, s), "{s}");
        }
        assert!(crate::duration::parse_validity("88000000d").is_err());
    }

    #[test]
    fn a_retention_is_a_duration_of_at_least_a_second() {
        for s in [
            "999ms",
            "1000ms",
            "0s",
            "1s",
            "0d0h0m0s999ms",
            "0d0h0m1s",
            "00s",
            "0001000ms",
            "0d",
            "1m",
            "0h0m0s0ms",
            "1d",
        ] {
            let admitted = matches(DURATION, s) && !matches(SUB_SECOND, s);
            let accepted =
                crate::ops::retention_ms("r", Some(s)).is_ok_and(|v| v.is_some_and(|ms| ms > 0));
            assert_eq!(admitted, accepted, "{s:?}");
        }
    }

    #[test]
    fn the_millisecond_pattern_is_the_time_parser() {
        for s in [
            "2030-01-02T03:04:05Z",
            "2030-01-02T03:04:05.7Z",
            "2030-01-02T03:04:05.717Z",
            "2030-01-02T03:04:05.7170Z",
            "2030-01-02T03:04:05.717000Z",
            "2030-01-02T03:04:05.717000000Z",
            "2030-01-02T03:04:05.717320Z",
            "2030-01-02T03:04:05.000001Z",
            "2030-01-02T03:04:05.717+01:00",
            "2030-01-02T03:04:05.7171+01:00",
            "2030-01-02T03:04:05-05:30",
        ] {
            assert_eq!(matches(MILLIS, s), crate::time::parse(s).is_ok(), "{s:?}");
        }
        for (s, in_range) in [
            ("1970-01-01T00:00:00Z", true),
            ("9998-12-31T00:00:00.5Z", true),
            ("1969-12-31T23:59:59Z", false),
            ("0179-10-31T06:33:22.717Z", false),
        ] {
            let t = crate::time::parse(s).expect("a time");
            assert_eq!(t.is_in_range(), in_range, "{s}");
            assert_eq!(matches(DUE_TIME, s), in_range, "{s}");
        }
    }

    #[test]
    fn the_uuid_pattern_is_the_id_parser() {
        let id = "0c3ad02d-d4e8-fb96-ecde-75cee09f9a4f";
        for s in [
            id.to_string(),
            id.to_uppercase(),
            id.replace('-', ""),
            format!("{{{id}}}"),
            format!("urn:uuid:{id}"),
            format!("urn:uuid:{id}}}"),
            format!("{{{id}"),
            format!("{{{}}}", id.replace('-', "")),
            format!("urn:uuid:{}", id.replace('-', "")),
            id[1..].to_string(),
            format!("{id}0"),
            String::new(),
            "g".repeat(32),
        ] {
            assert_eq!(
                matches(UUID, &s),
                uuid::Uuid::parse_str(&s).is_ok(),
                "{s:?}"
            );
        }
    }

    #[test]
    fn the_secret_pattern_is_the_key_parser() {
        use base64::Engine;
        use base64::engine::general_purpose::STANDARD;
        const ALPHABET: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        for len in 0..=70 {
            let key: Vec<u8> = (0..len).map(|i| (i * 37 % 251) as u8).collect();
            let encoded = STANDARD.encode(&key);
            // The encoding, and every change of its last character that carries bits.
            let body = encoded.trim_end_matches('=');
            let pad = &encoded[body.len()..];
            let mut cases = vec![
                format!("whsec_{encoded}"),
                format!("whsec_{body}"),
                encoded.clone(),
            ];
            if let Some(head) = body.get(..body.len().saturating_sub(1)) {
                for c in ALPHABET.chars() {
                    cases.push(format!("whsec_{head}{c}{pad}"));
                }
            }
            for s in cases {
                assert_eq!(
                    matches(SECRET, &s),
                    sundial_push::sign::SigningKey::parse(&s).is_ok(),
                    "{s:?}"
                );
            }
        }
    }

    #[test]
    fn the_tag_filter_pattern_is_the_parser() {
        for s in ["a:b", "a::b", ":b", "a:", "ab", "", "k:v w", "k:\n"] {
            assert_eq!(
                matches(TAG_FILTER, s),
                crate::ops::parse_tags(&[s.to_string()]).is_ok(),
                "{s:?}"
            );
        }
    }

    #[test]
    fn every_url_and_header_the_patterns_admit_is_a_valid_target() {
        let timeout = std::time::Duration::from_secs(300);
        for url in [
            "http://a",
            "HTTPS://a-b.c:8080/x/y",
            "http://a1.b2/",
            "http://a:1",
            "https://example.com/hooks/~a.b_c-d/",
        ] {
            assert!(matches(URL, url), "{url}");
            let t = sundial_core::Target::new(url.to_string());
            assert!(t.validate(timeout).is_ok(), "{url}");
        }
        let names = headers();
        let refused = names["propertyNames"]["not"]["pattern"]
            .as_str()
            .expect("a pattern")
            .to_string();
        for h in [
            "Host",
            "TE",
            "content-type",
            "Webhook-Id",
            "SUNDIAL-x",
            "proxy-foo",
        ] {
            assert!(matches(&refused, h), "{h}");
        }
        for h in ["x-team", "tea", "hosts", "x-webhook-id"] {
            assert!(!matches(&refused, h), "{h}");
            let mut t = sundial_core::Target::new("http://a".to_string());
            t.headers.insert(h.to_string(), "v".to_string());
            assert!(
                matches(HEADER_NAME, h) && t.validate(timeout).is_ok(),
                "{h}"
            );
        }
    }

    #[test]
    fn the_error_group_pattern_is_the_check() {
        for g in [
            "timeout",
            "a b: c",
            "tab\there",
            "cr\rhere",
            "two\nlines",
            "\n",
            "é",
        ] {
            assert_eq!(
                matches(ONE_LINE, g),
                crate::ops::check_error_group(g).is_ok(),
                "{g:?}"
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

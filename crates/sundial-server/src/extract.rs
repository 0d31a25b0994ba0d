//! Request extractors that answer in Sundial's error format.
//!
//! [`ApiJson`] reads the whole body (bounded by the route's body limit: over it is `413`), then
//! parses it as JSON (the `Content-Type` was already checked to be JSON by [`crate::guard`],
//! which runs first, or absent with an `Authorization` header): a syntax error or a
//! truncated body is `400`; a well-formed body that does not fit the type (missing or unknown
//! field, wrong type, negative number) is `422` and names the field, and for a batch the item's
//! index. [`ApiQuery`] does the same for query strings (always `422`: a query string cannot be
//! malformed, only invalid).

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use serde_path_to_error::Segment;

use crate::error::ApiError;

/// How long a request may take to send its body (inserted by the access layer; without it,
/// [`DEFAULT_BODY_READ_TIMEOUT`]). A slower body is `408`, so a client that trickles its body
/// cannot hold a connection and a handler forever.
#[derive(Debug, Clone, Copy)]
pub struct BodyReadTimeout(pub std::time::Duration);

/// The body read timeout when none was set.
pub const DEFAULT_BODY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// A JSON body.
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let limit = req
            .extensions()
            .get::<BodyReadTimeout>()
            .map_or(DEFAULT_BODY_READ_TIMEOUT, |t| t.0);
        let read = tokio::time::timeout(limit, Bytes::from_request(req, state))
            .await
            .map_err(|_| {
                ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "timeout",
                    format!("the request body did not arrive within {limit:?}"),
                )
            })?;
        let bytes = read.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::too_large(format!("request body too large: {}", e.body_text()))
            } else {
                ApiError::malformed(format!("cannot read the request body: {}", e.body_text()))
            }
        })?;
        parse_json(&bytes).map(ApiJson)
    }
}

/// Parses `bytes` as JSON into `T`, classifying errors as described in the module doc.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    // Every request body of the API is an object: refuse an array (a batch sent as a bare list)
    // plainly. serde would read a struct whose fields are all optional from `[null, null]`.
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[')
        && serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_ok()
    {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            "the body must be a JSON object ({...}), not an array",
        ));
    }
    // The fast path: plain serde_json. Only a body that fails is parsed again, tracking the path
    // to name the field (and batch index) at fault.
    match serde_json::from_slice(bytes) {
        Ok(v) => Ok(v),
        Err(e) => {
            if e.classify() == serde_json::error::Category::Data
                && let Some(again) = whole_floats_as_integers(bytes)
            {
                return match serde_json::from_slice(&again) {
                    Ok(v) => Ok(v),
                    Err(_) => parse_json_with_path(&again),
                };
            }
            parse_json_with_path(bytes)
        }
    }
}

/// Fields whose value is any JSON the client chose (a task's payload, a result, a workflow's
/// input, a side effect's value): kept exactly as sent.
const FREE_FORM_FIELDS: [&str; 4] = ["payload", "result", "input", "value"];

/// JSON (and JSON Schema, which the OpenAPI document is written in) counts `3.0` as the integer
/// 3; serde's integer fields do not take it. A body refused for a float where an integer belongs
/// is read again with every whole number spelled as a float turned into that integer, except
/// inside [`FREE_FORM_FIELDS`]. `None` when the body holds no such number (the first error
/// stands).
fn whole_floats_as_integers(bytes: &[u8]) -> Option<Vec<u8>> {
    fn walk(v: &mut serde_json::Value, changed: &mut bool) {
        match v {
            serde_json::Value::Number(n) if n.is_f64() => {
                let Some(f) = n.as_f64() else { return };
                // The bounds are exact powers of two, so the casts below are exact.
                let whole = f.is_finite() && f.fract() == 0.0;
                if whole && (0.0..18_446_744_073_709_551_616.0).contains(&f) {
                    *v = serde_json::Value::from(f as u64);
                    *changed = true;
                } else if whole && (-9_223_372_036_854_775_808.0..0.0).contains(&f) {
                    *v = serde_json::Value::from(f as i64);
                    *changed = true;
                }
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(|i| walk(i, changed)),
            serde_json::Value::Object(fields) => {
                for (name, field) in fields.iter_mut() {
                    if !FREE_FORM_FIELDS.contains(&name.as_str()) {
                        walk(field, changed);
                    }
                }
            }
            _ => {}
        }
    }
    let mut value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    let mut changed = false;
    walk(&mut value, &mut changed);
    if !changed {
        return None;
    }
    serde_json::to_vec(&value).ok()
}

/// For a field holding a struct: accept only a JSON object (serde's derive would also read a
/// struct from an array of its fields, so `[null, null]` would pass as all-absent).
pub fn object_only<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: DeserializeOwned,
{
    use serde::Deserialize;
    use serde::de::Error;
    let map = serde_json::Map::<String, serde_json::Value>::deserialize(d)?;
    serde_json::from_value(serde_json::Value::Object(map)).map_err(D::Error::custom)
}

/// [`object_only`] for an optional field: `null` or absent is `None`.
pub fn opt_object_only<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: DeserializeOwned,
{
    use serde::Deserialize;
    use serde::de::Error;
    match Option::<serde_json::Map<String, serde_json::Value>>::deserialize(d)? {
        None => Ok(None),
        Some(map) => serde_json::from_value(serde_json::Value::Object(map))
            .map(Some)
            .map_err(D::Error::custom),
    }
}

fn parse_json_with_path<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let index = e.path().iter().find_map(|s| match s {
            Segment::Seq { index } => Some(*index),
            _ => None,
        });
        classify(e.into_inner(), path, index)
    })?;
    // Anything but whitespace after the value is a syntax error.
    de.end().map_err(|e| classify(e, ".".to_string(), None))?;
    Ok(value)
}

fn classify(inner: serde_json::Error, field: String, index: Option<usize>) -> ApiError {
    match inner.classify() {
        serde_json::error::Category::Data => {
            let at_root = field == "." || field.is_empty();
            // serde reports a missing field at its parent's path: name the field itself.
            let message = inner.to_string();
            if let Some(name) = message
                .strip_prefix("missing field `")
                .and_then(|rest| rest.split('`').next())
            {
                let full = if at_root {
                    name.to_string()
                } else {
                    format!("{field}.{name}")
                };
                let mut err = ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid",
                    format!("{full}: this field is required"),
                );
                err.detail.field = Some(full);
                err.detail.index = index;
                return err;
            }
            let mut err = ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid",
                if at_root {
                    inner.to_string()
                } else {
                    format!("{field}: {inner}")
                },
            );
            if !at_root {
                err.detail.field = Some(field);
            }
            err.detail.index = index;
            err
        }
        _ => ApiError::malformed(format!("the body is not valid JSON: {inner}")),
    }
}

/// Query-string parameters; any problem (unknown parameter, bad number) is `422`.
pub struct ApiQuery<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiQuery<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(v)| ApiQuery(v))
            .map_err(|e| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", e.body_text()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Item {
        kind: String,
        n: Option<u32>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Batch {
        tasks: Vec<Item>,
    }

    #[test]
    fn whole_numbers_spelled_as_floats_are_integers_but_free_form_values_are_kept() {
        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Body {
            n: u32,
            big: Option<u64>,
            neg: Option<i64>,
            ms: Option<Vec<u16>>,
            payload: Option<serde_json::Value>,
        }
        let b: Body = parse_json(
            br#"{"n": 3.0, "big": 9007199254740992.0, "neg": -2.0, "ms": [400.0], "payload": {"price": 1.0, "n": 2}}"#,
        )
        .expect("whole floats are integers");
        assert_eq!(
            (b.n, b.big, b.neg),
            (3, Some(9_007_199_254_740_992), Some(-2))
        );
        assert_eq!(b.ms, Some(vec![400]));
        // The payload is the client's own JSON: its float stays a float.
        assert_eq!(
            serde_json::to_string(&b.payload).expect("json"),
            r#"{"n":2,"price":1.0}"#
        );
        // A fraction is still refused, and names the field.
        let e = parse_json::<Body>(br#"{"n": 3.5}"#).unwrap_err();
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(e.detail.field.as_deref(), Some("n"));
        // A whole float out of the field's range is refused as that integer.
        let e = parse_json::<Body>(br#"{"n": 1e10}"#).unwrap_err();
        assert!(
            e.detail.message.contains("10000000000"),
            "{}",
            e.detail.message
        );
    }

    #[test]
    fn an_optional_object_field_refuses_an_array() {
        #[derive(Debug, Deserialize)]
        struct Inner {
            #[allow(dead_code)]
            a: Option<u32>,
        }
        #[derive(Debug, Deserialize)]
        struct Outer {
            #[serde(default, deserialize_with = "opt_object_only")]
            inner: Option<Inner>,
        }
        assert!(parse_json::<Outer>(br#"{"inner": [null]}"#).is_err());
        assert!(
            parse_json::<Outer>(br#"{"inner": null}"#)
                .expect("null")
                .inner
                .is_none()
        );
        assert!(
            parse_json::<Outer>(br#"{}"#)
                .expect("absent")
                .inner
                .is_none()
        );
        assert!(
            parse_json::<Outer>(br#"{"inner": {"a": 1}}"#)
                .expect("object")
                .inner
                .is_some()
        );
    }

    #[test]
    fn syntax_errors_are_400() {
        for bad in ["", "{", "{\"kind\":}", "nope", "{\"kind\":\"a\"} x"] {
            let e = parse_json::<Item>(bad.as_bytes()).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad:?}");
            assert_eq!(e.detail.code, "malformed");
        }
    }

    #[test]
    fn data_errors_are_422_and_name_the_field() {
        let e = parse_json::<Item>(br#"{"kind":"a","colour":1}"#).unwrap_err();
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(e.detail.message.contains("colour"), "{e:?}");
        let e = parse_json::<Item>(br#"{"kind":"a","n":-1}"#).unwrap_err();
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(e.detail.field.as_deref(), Some("n"));
        let e = parse_json::<Item>(br#"{}"#).unwrap_err();
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(e.detail.message.contains("kind"), "{e:?}");
    }

    #[test]
    fn a_missing_field_is_named() {
        let e = parse_json::<Item>(br#"{}"#).unwrap_err();
        assert_eq!(e.detail.field.as_deref(), Some("kind"));
        assert!(e.detail.message.contains("required"), "{e:?}");
        let e = parse_json::<Batch>(br#"{"tasks":[{"kind":"a"},{"n":1}]}"#).unwrap_err();
        assert_eq!(e.detail.field.as_deref(), Some("tasks[1].kind"));
        assert_eq!(e.detail.index, Some(1));
    }

    #[test]
    fn an_array_body_is_named_as_such() {
        let e = parse_json::<Batch>(br#" [{"kind":"a"}]"#).unwrap_err();
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(e.detail.message.contains("not an array"), "{e:?}");
        // A broken array is still a syntax error.
        let e = parse_json::<Batch>(b"[").unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn batch_errors_name_the_index() {
        let e =
            parse_json::<Batch>(br#"{"tasks":[{"kind":"a"},{"kind":"b","typo":1}]}"#).unwrap_err();
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(e.detail.index, Some(1));
        assert!(e.detail.message.contains("tasks[1]"), "{e:?}");
    }
}

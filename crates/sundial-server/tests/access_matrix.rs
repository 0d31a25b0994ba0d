//! The route matrix: every route of `/openapi.json` × {no token, a bad token, a revoked token,
//! each scope, a token of another namespace} gets the status the access rules promise, and every
//! write leaves exactly one audit record, on success and on refusal alike. Built from the
//! document, so a new route cannot be forgotten: it gets checked with the rule its method and
//! path give it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

mod common;

use axum::body::{Body, to_bytes};
use axum::http::{Method, Request, StatusCode};
use serde_json::{Value, json};
use sundial::Sundial;
use sundial_server::ServerConfig;
use sundial_server::access::{
    AccessConfig, AuthMode, Requirement, Scoping, requirement, scope_allows, scoping,
};
use sundial_store::Scope;
use tower::ServiceExt;

async fn send(
    app: &axum::Router,
    method: &str,
    uri: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (StatusCode, Value, axum::http::HeaderMap) {
    let mut req = Request::builder()
        .method(method.to_ascii_uppercase().as_str())
        .uri(uri)
        .header("content-type", "application/json");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let req = req
        .body(
            body.map(|b| Body::from(b.to_string()))
                .unwrap_or_else(Body::empty),
        )
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = to_bytes(resp.into_body(), 1 << 22).await.unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        headers,
    )
}

/// Every (method, template, concrete path) of the document.
fn routes() -> Vec<(String, String, String)> {
    let doc = serde_json::to_value(sundial_server::openapi()).unwrap();
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, _) in item.as_object().unwrap() {
            let concrete = path
                .replace("{id}", "0190a4c8-0000-7000-8000-000000000000")
                .replace("{task}", "0190a4c8-0000-7000-8000-000000000000")
                .replace("{queue}", "q")
                .replace("{name}", "sig");
            assert!(!concrete.contains('{'), "a parameter to fill in: {path}");
            out.push((method.clone(), path.clone(), concrete));
        }
    }
    out
}

/// Short polls, so that worker routes answer at once.
fn body_for(method: &str, template: &str) -> Option<Value> {
    if method == "get" {
        return None;
    }
    Some(match template {
        "/v1/queues/{queue}/poll" => json!({"worker": "w", "wait": "0s"}),
        "/v1/workflow-tasks/poll" => json!({"worker": "w", "types": ["t"], "wait": "0s"}),
        "/v1/workflow-activities/poll" => json!({"worker": "w", "names": ["a"], "wait": "0s"}),
        _ => json!({}),
    })
}

async fn audit_count(app: &axum::Router, admin: &str) -> usize {
    let mut n = 0;
    let mut cursor: Option<String> = None;
    loop {
        let uri = match &cursor {
            Some(c) => format!("/v1/audit?limit=1000&cursor={c}"),
            None => "/v1/audit?limit=1000".to_string(),
        };
        let (st, b, _) = send(app, "get", &uri, Some(admin), None).await;
        assert_eq!(st, StatusCode::OK, "{b}");
        n += b["records"].as_array().unwrap().len();
        match b["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return n,
        }
    }
}

async fn create_token(app: &axum::Router, admin: &str, scope: &str, ns: Option<&str>) -> String {
    let mut body = json!({"name": format!("{scope}-{}", ns.unwrap_or("all")), "scope": scope});
    if let Some(ns) = ns {
        body["namespace"] = json!(ns);
    }
    let (st, b, _) = send(app, "post", "/v1/tokens", Some(admin), Some(body)).await;
    assert_eq!(st, StatusCode::CREATED, "{b}");
    b["token"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_every_caller_as_the_rules_say_and_is_audited() {
    let dir = tempfile::tempdir().unwrap();
    let sundial = Sundial::open(dir.path()).await.unwrap();
    let access = AccessConfig {
        mode: AuthMode::Required,
        open_metrics: false,
        open_openapi: false,
        ..AccessConfig::default()
    };
    let app = sundial_server::router(
        sundial.clone(),
        ServerConfig {
            access: access.clone(),
            ..ServerConfig::default()
        },
    );
    let admin = common::root_token(&sundial).await;

    let mut tokens = Vec::new();
    for scope in Scope::ALL {
        tokens.push((
            format!("{scope}"),
            Some(scope),
            create_token(&app, &admin, scope.as_str(), None).await,
        ));
    }
    let other_ns = create_token(&app, &admin, "admin", Some("elsewhere")).await;
    // The namespace exists, so its own token can use it by the path prefix.
    let (st, b, _) = send(
        &app,
        "post",
        "/v1/namespaces",
        Some(&admin),
        Some(json!({"name": "elsewhere"})),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{b}");
    let default_bound = create_token(&app, &admin, "admin", Some("default")).await;
    let revoked = create_token(&app, &admin, "admin", None).await;
    let revoked_id = revoked[4..36].to_string();
    let (st, _, _) = send(
        &app,
        "post",
        &format!("/v1/tokens/{revoked_id}/revoke"),
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    let bad = format!("sdl_{}", "0".repeat(96));

    let routes = routes();
    assert!(routes.len() >= 30, "{}", routes.len());
    let mut checked = 0;
    let mut refused = std::collections::BTreeMap::<u16, usize>::new();
    for (method, template, uri) in &routes {
        // Revoking or creating tokens in the loop would change the callers; those routes are
        // covered by the admin row only with bodies that are refused (empty JSON: 422, or an
        // unknown id: 404).
        let m = Method::from_bytes(method.to_ascii_uppercase().as_bytes()).unwrap();
        let need = requirement(&m, template, &access);
        let write = !matches!(method.as_str(), "get" | "head" | "options");
        let mut callers: Vec<(String, Option<String>, String)> = vec![
            ("no token".into(), None, uri.clone()),
            ("bad token".into(), Some(bad.clone()), uri.clone()),
            ("revoked token".into(), Some(revoked.clone()), uri.clone()),
            (
                "other namespace".into(),
                Some(other_ns.clone()),
                uri.clone(),
            ),
        ];
        for (name, _, t) in &tokens {
            callers.push((name.clone(), Some(t.clone()), uri.clone()));
        }
        // The same route under the `/v1/namespaces/elsewhere` prefix: its own token may use it
        // there, a token of another namespace is told it does not exist, and a namespace that
        // does not exist does not exist for anyone.
        if let Some(rest) = uri.strip_prefix("/v1/") {
            let there = format!("/v1/namespaces/elsewhere/{rest}");
            callers.push((
                "own namespace by prefix".into(),
                Some(other_ns.clone()),
                there.clone(),
            ));
            callers.push((
                "other namespace by prefix".into(),
                Some(default_bound.clone()),
                there,
            ));
            callers.push((
                "missing namespace by prefix".into(),
                Some(admin.clone()),
                format!("/v1/namespaces/nowhere/{rest}"),
            ));
        }
        for (who, token, uri) in &callers {
            let before = if write {
                Some(audit_count(&app, &admin).await)
            } else {
                None
            };
            let (st, b, headers) = send(
                &app,
                method,
                uri.as_str(),
                token.as_deref(),
                body_for(method, template),
            )
            .await;
            let scope = tokens
                .iter()
                .find(|(n, _, _)| n == who)
                .and_then(|(_, s, _)| *s);
            let expect = match (who.as_str(), need) {
                (_, Requirement::Open) => None,
                ("no token" | "bad token" | "revoked token", _) => Some(StatusCode::UNAUTHORIZED),
                ("other namespace" | "other namespace by prefix", _) => match scoping(template) {
                    Scoping::Namespaced => Some(StatusCode::NOT_FOUND),
                    Scoping::AllNamespaces => Some(StatusCode::FORBIDDEN),
                    Scoping::Global => None,
                },
                ("own namespace by prefix", _) => match scoping(template) {
                    // Admin of its namespace: every namespace route; the shared routes are not
                    // a namespace's (and need a token of all namespaces).
                    Scoping::Namespaced => None,
                    Scoping::AllNamespaces => Some(StatusCode::FORBIDDEN),
                    Scoping::Global => None,
                },
                ("missing namespace by prefix", _) => Some(StatusCode::NOT_FOUND),
                (_, Requirement::Scope(need)) => {
                    if scope_allows(scope.unwrap(), need) {
                        None
                    } else {
                        Some(StatusCode::FORBIDDEN)
                    }
                }
            };
            if let Some(code) = expect {
                *refused.entry(code.as_u16()).or_default() += 1;
            }
            match expect {
                Some(code) => {
                    assert_eq!(st, code, "{method} {template} as {who}: {b}");
                    if code == StatusCode::UNAUTHORIZED {
                        assert_eq!(
                            headers.get("www-authenticate").unwrap(),
                            "Bearer realm=\"sundial\"",
                            "{method} {template}"
                        );
                    }
                    if code == StatusCode::NOT_FOUND {
                        assert_eq!(b["error"]["code"], "not_found");
                    }
                }
                None => {
                    assert!(
                        ![StatusCode::UNAUTHORIZED, StatusCode::FORBIDDEN].contains(&st),
                        "{method} {template} as {who} was refused: {st} {b}"
                    );
                    assert_ne!(
                        b["error"]["message"], "no such namespace",
                        "{method} {uri} as {who}"
                    );
                }
            }
            if let Some(before) = before {
                let after = audit_count(&app, &admin).await;
                assert_eq!(
                    after,
                    before + 1,
                    "{method} {template} as {who} ({st}) must leave exactly one audit record"
                );
                let (_, last, _) = send(&app, "get", "/v1/audit?limit=1", Some(&admin), None).await;
                let rec = &last["records"][0];
                assert_eq!(
                    rec["action"],
                    format!("{} {template}", method.to_ascii_uppercase())
                );
                assert_eq!(rec["status"], st.as_u16(), "{rec}");
                if uri.starts_with("/v1/namespaces/elsewhere/") {
                    assert_eq!(rec["namespace"], "elsewhere", "{rec}");
                }
            }
            checked += 1;
        }
    }
    assert!(checked >= 30 * 8);
    println!(
        "{} routes, {checked} calls, refusals by status: {refused:?}",
        routes.len()
    );
    for code in [401, 403, 404] {
        assert!(
            refused.get(&code).copied().unwrap_or(0) > 0,
            "no {code} was expected"
        );
    }

    // The open routes.
    let (st, _, _) = send(&app, "get", "/healthz", None, None).await;
    assert_eq!(st, StatusCode::OK);
}

/// A token's `expires_in` is at most 36500d: a longer one would store an end no RFC 3339 time
/// can name (a year past 9999) and make `GET /v1/tokens` answer it. Refused, nothing stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_lifetime_past_the_bound_is_refused_and_nothing_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let sundial = Sundial::open(dir.path()).await.unwrap();
    let app = sundial_server::router(
        sundial.clone(),
        ServerConfig {
            access: AccessConfig {
                mode: AuthMode::Required,
                ..AccessConfig::default()
            },
            ..ServerConfig::default()
        },
    );
    let admin = common::root_token(&sundial).await;
    for too_long in ["88000000d", "36500d1ms"] {
        let body = json!({"name": "far", "scope": "reader", "expires_in": too_long});
        let (st, b, _) = send(&app, "post", "/v1/tokens", Some(&admin), Some(body)).await;
        assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
        assert!(b.to_string().contains("expires_in"), "{b}");
    }
    let body = json!({"name": "century", "scope": "reader", "expires_in": "36500d"});
    let (st, b, _) = send(&app, "post", "/v1/tokens", Some(&admin), Some(body)).await;
    assert_eq!(st, StatusCode::CREATED, "{b}");
    let (st, b, _) = send(&app, "get", "/v1/tokens", Some(&admin), None).await;
    assert_eq!(st, StatusCode::OK, "{b}");
    let tokens = b["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 2, "{b}");
    for t in tokens {
        if let Some(end) = t["expires_at"].as_str() {
            assert!(end.len() == 24 && end.ends_with('Z'), "{end}");
        }
    }
}

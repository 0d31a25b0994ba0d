//! The web UI served in-process: pages render from the store, form posts need the CSRF token,
//! cookies carry the right flags, a token's scope decides which buttons exist and what a post
//! may do, and every post (refusals included) is in the audit log with its actor.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

mod common;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use serde_json::{Value, json};
use sundial::Sundial;
use sundial_server::access::{AccessConfig, AuthMode};
use sundial_server::ui::UiConfig;
use sundial_server::{ServerConfig, router};
use tower::ServiceExt;

struct Resp {
    status: StatusCode,
    cookies: Vec<String>,
    location: Option<String>,
    body: String,
}

async fn send(
    app: &axum::Router,
    method: &str,
    path: &str,
    cookie: Option<&str>,
    form: Option<&str>,
    json_body: Option<Value>,
    bearer: Option<&str>,
) -> Resp {
    let mut req = Request::builder().method(method).uri(path);
    if let Some(c) = cookie {
        req = req.header(header::COOKIE, c);
    }
    if let Some(t) = bearer {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let body = if let Some(f) = form {
        req = req.header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        Body::from(f.to_string())
    } else if let Some(j) = json_body {
        req = req.header(header::CONTENT_TYPE, "application/json");
        Body::from(j.to_string())
    } else {
        Body::empty()
    };
    let resp = app.clone().oneshot(req.body(body).unwrap()).await.unwrap();
    let status = resp.status();
    let cookies = resp
        .headers()
        .get_all(header::SET_COOKIE)
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    let location = resp
        .headers()
        .get(header::LOCATION)
        .map(|v| v.to_str().unwrap().to_string());
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    Resp {
        status,
        cookies,
        location,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

async fn get(app: &axum::Router, path: &str, cookie: Option<&str>) -> Resp {
    send(app, "GET", path, cookie, None, None, None).await
}

async fn post_form(app: &axum::Router, path: &str, cookie: Option<&str>, form: &str) -> Resp {
    send(app, "POST", path, cookie, Some(form), None, None).await
}

async fn api(
    app: &axum::Router,
    method: &str,
    path: &str,
    body: Value,
    token: Option<&str>,
) -> Value {
    let r = send(app, method, path, None, None, Some(body), token).await;
    assert!(
        r.status.is_success(),
        "{method} {path}: {} {}",
        r.status,
        r.body
    );
    serde_json::from_str(&r.body).unwrap_or(Value::Null)
}

/// The `name=value` part of a `Set-Cookie` named `name`.
fn cookie_pair(r: &Resp, name: &str) -> Option<String> {
    r.cookies
        .iter()
        .find(|c| c.starts_with(&format!("{name}=")))
        .map(|c| c.split(';').next().unwrap().to_string())
}

fn csrf_of(html: &str) -> String {
    let at = html
        .find("name=\"csrf\" value=\"")
        .expect("a form with a CSRF token");
    let rest = &html[at + "name=\"csrf\" value=\"".len()..];
    rest[..rest.find('"').unwrap()].to_string()
}

async fn audit_actions(sundial: &Sundial) -> Vec<(String, String, Option<String>, u16)> {
    let page = sundial
        .access_store()
        .unwrap()
        .list_audit(&sundial_store::AuditFilter::default(), 1000)
        .await
        .unwrap();
    page.records
        .into_iter()
        .map(|r| {
            (
                r.record.actor,
                r.record.action,
                r.record.target,
                r.record.status,
            )
        })
        .collect()
}

#[tokio::test]
async fn with_auth_off_pages_render_and_posts_need_the_csrf_cookie() {
    let dir = tempfile::tempdir().unwrap();
    let sundial = Sundial::open(dir.path()).await.unwrap();
    let app = router(sundial.clone(), ServerConfig::default());

    let task = api(
        &app,
        "POST",
        "/v1/tasks",
        json!({"kind": "mail", "queue": "emails", "delay": "1h", "tags": {"customer": "acme"}, "payload": {"to": "a@example.com"}}),
        None,
    )
    .await;
    let id = task["id"].as_str().unwrap().to_string();

    // The overview: no login; a CSRF cookie, HttpOnly and SameSite=Strict, not Secure on HTTP.
    let r = get(&app, "/ui", None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(r.body.contains("<h1>Overview</h1>"), "{}", r.body);
    assert!(r.body.contains("emails"));
    let set = r
        .cookies
        .iter()
        .find(|c| c.starts_with("sundial_csrf="))
        .expect("a CSRF cookie");
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    assert!(!set.contains("Secure"), "{set}");
    let cookie = cookie_pair(&r, "sundial_csrf").unwrap();
    let csrf = csrf_of(&r.body);
    assert_eq!(format!("sundial_csrf={csrf}"), cookie);

    // Filters are the API's query parameters.
    let r = get(
        &app,
        "/ui/tasks?tag=customer:acme&queue=emails",
        Some(&cookie),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.body.contains(&id), "the task is listed by its tag");
    let r = get(&app, "/ui/tasks?tag=customer:other", Some(&cookie)).await;
    assert!(!r.body.contains(&id));
    assert!(r.body.contains("No task matches."));
    let r = get(&app, "/ui/tasks?state=nonsense", Some(&cookie)).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    let r = get(&app, &format!("/ui/tasks?id={id}"), Some(&cookie)).await;
    assert_eq!(
        r.location.as_deref(),
        Some(format!("/ui/tasks/{id}").as_str())
    );

    // The task's page shows payload, tags and the actions its state allows.
    let r = get(&app, &format!("/ui/tasks/{id}"), Some(&cookie)).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.body.contains("a@example.com") && r.body.contains("customer:acme"));
    assert!(r.body.contains(&format!("/ui/tasks/{id}/cancel")));
    assert!(r.body.contains(&format!("/ui/tasks/{id}/trigger")));
    assert!(!r.body.contains(&format!("/ui/tasks/{id}/retry")));

    // A forged post (no token, a wrong one, or the token without its cookie) changes nothing.
    let cancel = format!("/ui/tasks/{id}/cancel");
    for (cookie, form) in [
        (Some(cookie.as_str()), String::new()),
        (Some(cookie.as_str()), format!("csrf={}", "0".repeat(64))),
        (None, format!("csrf={csrf}")),
    ] {
        let r = post_form(&app, &cancel, cookie, &form).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    }
    let t = sundial.get(id.parse().unwrap()).await.unwrap().unwrap();
    assert_eq!(t.state, sundial::TaskState::Scheduled);
    // A post from another origin is refused even with the token.
    let req = Request::builder()
        .method("POST")
        .uri(&cancel)
        .header(header::HOST, "127.0.0.1:7373")
        .header(header::ORIGIN, "http://evil.example")
        .header(header::COOKIE, &cookie)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(format!("csrf={csrf}")))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let t = sundial.get(id.parse().unwrap()).await.unwrap().unwrap();
    assert_eq!(t.state, sundial::TaskState::Scheduled);
    let r = post_form(&app, &cancel, Some(&cookie), &format!("csrf={csrf}")).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    let t = sundial.get(id.parse().unwrap()).await.unwrap().unwrap();
    assert_eq!(t.state, sundial::TaskState::Cancelled);

    // Every post is audited with its actor, refusals included.
    let audit = audit_actions(&sundial).await;
    let ui: Vec<_> = audit
        .iter()
        .filter(|(_, a, _, _)| a == "POST /ui/tasks/{id}/cancel")
        .collect();
    assert_eq!(ui.len(), 5, "{audit:?}");
    assert!(ui.iter().all(|(actor, _, target, _)| {
        (actor == "local" || actor == "anonymous") && target.as_deref() == Some(id.as_str())
    }));
    assert_eq!(ui.iter().filter(|r| r.3 == 303).count(), 1);
    assert_eq!(ui.iter().filter(|r| r.3 == 403).count(), 4);

    // Retry of the cancelled task from the UI; then the bulk preview counts without changing.
    let r = post_form(
        &app,
        &format!("/ui/tasks/{id}/retry"),
        Some(&cookie),
        &format!("csrf={csrf}"),
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    let r = get(
        &app,
        "/ui/tasks/bulk?action=cancel&queue=emails",
        Some(&cookie),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(
        r.body.contains("<strong id=\"matched\">1</strong>"),
        "{}",
        r.body
    );
    let t = sundial.get(id.parse().unwrap()).await.unwrap().unwrap();
    assert_eq!(
        t.state,
        sundial::TaskState::Scheduled,
        "a preview changes nothing"
    );
    let r = post_form(
        &app,
        "/ui/tasks/bulk",
        Some(&cookie),
        &format!("csrf={csrf}&action=cancel&queue=emails"),
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    assert!(r.location.unwrap().contains("Cancelled+1+of+1"));
    let t = sundial.get(id.parse().unwrap()).await.unwrap().unwrap();
    assert_eq!(t.state, sundial::TaskState::Cancelled);

    // Queue pause and resume.
    let r = post_form(
        &app,
        "/ui/queues/emails/pause",
        Some(&cookie),
        &format!("csrf={csrf}"),
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert!(sundial.queue("emails").await.unwrap().unwrap().paused);
    let r = get(&app, "/ui", Some(&cookie)).await;
    assert!(r.body.contains("/ui/queues/emails/resume"));

    // Assets are embedded; every page other pages link to renders.
    let r = get(&app, "/ui/assets/ui.css", None).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.body.contains("--fg"));
    for page in [
        "/ui/dead",
        "/ui/schedules",
        "/ui/workflows",
        "/ui/audit",
        "/ui/login",
    ] {
        let r = get(&app, page, Some(&cookie)).await;
        assert!(
            r.status == StatusCode::OK || r.status == StatusCode::SEE_OTHER,
            "{page}: {} {}",
            r.status,
            r.body
        );
    }
}

#[tokio::test]
async fn with_auth_on_a_session_decides_what_is_shown_and_done() {
    let dir = tempfile::tempdir().unwrap();
    let sundial = Sundial::open(dir.path()).await.unwrap();
    let app = router(
        sundial.clone(),
        ServerConfig {
            access: AccessConfig {
                mode: AuthMode::Required,
                ..AccessConfig::default()
            },
            ui: UiConfig {
                enabled: true,
                secure_cookies: true,
            },
            ..ServerConfig::default()
        },
    );
    let admin = common::root_token(&sundial).await;
    let mut tokens = std::collections::BTreeMap::new();
    for scope in ["reader", "producer", "worker"] {
        let b = api(
            &app,
            "POST",
            "/v1/tokens",
            json!({"name": format!("ui-{scope}"), "scope": scope}),
            Some(&admin),
        )
        .await;
        tokens.insert(scope, b["token"].as_str().unwrap().to_string());
    }
    let task = api(
        &app,
        "POST",
        "/v1/tasks",
        json!({"kind": "k", "delay": "1h"}),
        Some(&admin),
    )
    .await;
    let id = task["id"].as_str().unwrap().to_string();

    // Not signed in: pages lead to the login form; a post is 401.
    let r = get(&app, &format!("/ui/tasks/{id}"), None).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert!(
        r.location
            .as_deref()
            .unwrap()
            .starts_with("/ui/login?next=%2Fui%2Ftasks%2F")
    );
    let r = post_form(&app, &format!("/ui/tasks/{id}/cancel"), None, "csrf=x").await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);

    let login = |token: String| {
        let app = app.clone();
        async move {
            let r = get(&app, "/ui/login", None).await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.body);
            let pre = cookie_pair(&r, "sundial_csrf").unwrap();
            let csrf = csrf_of(&r.body);
            let form = format!("csrf={csrf}&next=%2Fui%2Ftasks&token={token}");
            let r = post_form(&app, "/ui/login", Some(&pre), &form).await;
            (r, pre)
        }
    };

    // A bad token, and a worker token, cannot sign in.
    let (r, _) = login(format!("sdl_{}", "0".repeat(96))).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert!(cookie_pair(&r, "sundial_session").is_none());
    let (r, _) = login(tokens["worker"].clone()).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    // The login form itself needs its CSRF cookie.
    let r = post_form(
        &app,
        "/ui/login",
        None,
        &format!("token={}", tokens["reader"]),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);

    // A reader signs in: the session cookie's flags; no action buttons; a post is refused.
    let (r, _) = login(tokens["reader"].clone()).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    assert_eq!(r.location.as_deref(), Some("/ui/tasks"));
    let set = r
        .cookies
        .iter()
        .find(|c| c.starts_with("sundial_session="))
        .unwrap();
    for flag in ["HttpOnly", "SameSite=Strict", "Secure", "Path=/ui"] {
        assert!(set.contains(flag), "{flag} in {set}");
    }
    assert!(
        !set.contains(&tokens["reader"][36..]),
        "the token's secret is not in the cookie"
    );
    let reader = cookie_pair(&r, "sundial_session").unwrap();
    let r = get(&app, &format!("/ui/tasks/{id}"), Some(&reader)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(r.body.contains("ui-reader"));
    assert!(
        !r.body.contains(&format!("/ui/tasks/{id}/cancel")),
        "no cancel button for a reader"
    );
    assert!(
        !r.body.contains("/ui/audit\""),
        "no audit link for a reader"
    );
    let reader_csrf = csrf_of(&r.body);
    let r = post_form(
        &app,
        &format!("/ui/tasks/{id}/cancel"),
        Some(&reader),
        &format!("csrf={reader_csrf}"),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r = get(&app, "/ui/audit", Some(&reader)).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);

    // A producer sees the buttons and may act, only with its own session's CSRF token.
    let (r, _) = login(tokens["producer"].clone()).await;
    let producer = cookie_pair(&r, "sundial_session").unwrap();
    let r = get(&app, &format!("/ui/tasks/{id}"), Some(&producer)).await;
    assert!(r.body.contains(&format!("/ui/tasks/{id}/cancel")));
    let producer_csrf = csrf_of(&r.body);
    assert_ne!(producer_csrf, reader_csrf);
    let r = post_form(
        &app,
        &format!("/ui/tasks/{id}/cancel"),
        Some(&producer),
        &format!("csrf={reader_csrf}"),
    )
    .await;
    assert_eq!(
        r.status,
        StatusCode::FORBIDDEN,
        "another session's token is refused"
    );
    let r = post_form(&app, &format!("/ui/tasks/{id}/cancel"), Some(&producer), "").await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "no token is refused");
    let t = sundial.get(id.parse().unwrap()).await.unwrap().unwrap();
    assert_eq!(t.state, sundial::TaskState::Scheduled);
    let r = post_form(
        &app,
        &format!("/ui/tasks/{id}/cancel"),
        Some(&producer),
        &format!("csrf={producer_csrf}"),
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    let t = sundial.get(id.parse().unwrap()).await.unwrap().unwrap();
    assert_eq!(t.state, sundial::TaskState::Cancelled);

    // A tampered session cookie is no session.
    let mut forged = producer.clone();
    let last = forged.pop().unwrap();
    forged.push(if last == '0' { '1' } else { '0' });
    let r = get(&app, "/ui", Some(&forged)).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);

    // The audit log names the signed-in actors.
    let audit = audit_actions(&sundial).await;
    let cancels: Vec<_> = audit
        .iter()
        .filter(|(_, a, _, _)| a == "POST /ui/tasks/{id}/cancel")
        .map(|(actor, _, _, status)| (actor.as_str(), *status))
        .collect();
    assert!(cancels.contains(&("ui-producer", 303)), "{cancels:?}");
    assert!(cancels.contains(&("ui-producer", 403)), "{cancels:?}");
    assert!(cancels.contains(&("ui-reader", 403)), "{cancels:?}");
    assert!(cancels.contains(&("anonymous", 401)), "{cancels:?}");
    assert!(
        audit
            .iter()
            .any(|(actor, a, _, s)| actor == "ui-reader" && a == "POST /ui/login" && *s == 303)
    );

    // Revoking the token ends its sessions.
    let token_id = &tokens["producer"][4..36];
    api(
        &app,
        "POST",
        &format!("/v1/tokens/{token_id}/revoke"),
        json!({}),
        Some(&admin),
    )
    .await;
    let r = get(&app, "/ui", Some(&producer)).await;
    assert_eq!(
        r.status,
        StatusCode::SEE_OTHER,
        "a revoked token's session is over"
    );
}

/// The overview names the workers that polled and, on a single node, says so; the dead letters
/// group every dead task by queue and error, beyond the page of tasks listed.
#[tokio::test]
async fn the_overview_shows_workers_and_the_dead_letters_group_the_whole_store() {
    let dir = tempfile::tempdir().unwrap();
    let sundial = Sundial::open(dir.path()).await.unwrap();
    let app = router(sundial.clone(), ServerConfig::default());

    let r = get(&app, "/ui", None).await;
    assert!(
        r.body.contains("No worker has polled this node"),
        "{}",
        r.body
    );
    assert!(r.body.contains("Single node"), "{}", r.body);
    let cluster = api(&app, "GET", "/v1/cluster", Value::Null, None).await;
    assert_eq!(cluster["clustered"], json!(false));

    // 130 tasks that die with one of two errors (more than the dead page lists at once), and 5
    // of another queue.
    let mut stepper = sundial.stepper();
    for (queue, n) in [("emails", 130), ("reports", 5)] {
        for _ in 0..n {
            api(
                &app,
                "POST",
                "/v1/tasks",
                json!({"kind": "mail", "queue": queue, "max_attempts": 1}),
                None,
            )
            .await;
        }
    }
    stepper.settle().await;
    let mut failed = 0;
    loop {
        let got = api(
            &app,
            "POST",
            "/v1/queues/emails/poll",
            json!({"worker": "mailer-7", "max": 100, "wait": "0s"}),
            None,
        )
        .await;
        let got2 = api(
            &app,
            "POST",
            "/v1/queues/reports/poll",
            json!({"worker": "reporter-1", "max": 100, "wait": "0s"}),
            None,
        )
        .await;
        let tasks: Vec<Value> = got["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .chain(got2["tasks"].as_array().unwrap())
            .cloned()
            .collect();
        if tasks.is_empty() {
            break;
        }
        for t in tasks {
            let error = if t["queue"] == "reports" {
                "disk full".to_string()
            } else if failed % 3 == 0 {
                format!("smtp 550: mailbox unavailable\nat attempt {failed}")
            } else {
                "timeout".to_string()
            };
            failed += 1;
            api(
                &app,
                "POST",
                &format!("/v1/tasks/{}/fail", t["id"].as_str().unwrap()),
                json!({"execution_id": t["execution_id"], "error": error, "retryable": false}),
                None,
            )
            .await;
        }
    }
    assert_eq!(failed, 135);

    // The workers that polled, on the overview and through the API.
    let r = get(&app, "/ui", None).await;
    assert!(r.body.contains("mailer-7"), "{}", r.body);
    assert!(r.body.contains("reporter-1"), "{}", r.body);
    let workers = api(&app, "GET", "/v1/workers", Value::Null, None).await;
    let names: Vec<&str> = workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["worker"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"mailer-7") && names.contains(&"reporter-1"),
        "{workers}"
    );

    // Dead letters: the groups count every dead task, not the 100 of a page; each group's error
    // links to its tasks (a shareable filtered list).
    let r = get(&app, "/ui", None).await;
    let cookie = cookie_pair(&r, "sundial_csrf").unwrap();
    let r = get(&app, "/ui/dead", Some(&cookie)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let enc = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    let group =
        |queue: &str, error: &str| format!("state=dead&queue={queue}&error_group={}", enc(error));
    let row = |queue: &str, error: &str, n: u64| {
        format!(
            "<td><a href=\"/ui/dead?queue={queue}\">{queue}</a></td><td class=\"err\"><a href=\"/ui/tasks?{}\" title=\"The tasks of this group\">{error}</a></td><td class=\"num\">{n}</td>",
            group(queue, error).replace('&', "&#38;")
        )
    };
    let smtp = "smtp 550: mailbox unavailable";
    assert!(r.body.contains(&row("emails", "timeout", 86)), "{}", r.body);
    assert!(r.body.contains(&row("emails", smtp, 44)), "{}", r.body);
    assert!(
        r.body.contains(&row("reports", "disk full", 5)),
        "{}",
        r.body
    );
    // Each group's retry is that group's (no longer its whole queue's).
    let retry =
        |queue: &str, error: &str| format!("/ui/tasks/bulk?action=retry&{}", group(queue, error));
    for (queue, error) in [
        ("emails", "timeout"),
        ("emails", smtp),
        ("reports", "disk full"),
    ] {
        let link = format!("href=\"{}\"", retry(queue, error).replace('&', "&#38;"));
        assert!(r.body.contains(&link), "{link} in {}", r.body);
    }
    assert!(r.body.contains("retry group…"), "{}", r.body);
    assert!(!r.body.contains("retry queue…"), "{}", r.body);
    let r = get(&app, "/ui/dead?queue=reports", None).await;
    assert!(r.body.contains(&row("reports", "disk full", 5)));
    assert!(!r.body.contains(&row("emails", "timeout", 86)));
    // The group's link is the task list filtered to exactly the group, its filter form filled.
    let r = get(&app, &format!("/ui/tasks?{}", group("emails", smtp)), None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body.matches("<span class=\"badge s-dead\">").count(), 44);
    assert!(
        r.body
            .contains(&format!("name=\"error_group\" value=\"{smtp}\"")),
        "{}",
        r.body
    );
    assert!(
        r.body.contains(&format!(
            "/ui/tasks/bulk?action=retry&{}",
            group("emails", smtp).replace('&', "&#38;")
        )),
        "{}",
        r.body
    );
    // The bulk retry of the whole queue still counts every dead task of it.
    let r = get(
        &app,
        "/ui/tasks/bulk?action=retry&state=dead&queue=emails",
        None,
    )
    .await;
    assert!(
        r.body.contains("<strong id=\"matched\">130</strong>"),
        "{}",
        r.body
    );
    // A group's retry counts only the group before confirming, and retries only it.
    let r = get(&app, &retry("emails", smtp), Some(&cookie)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(
        r.body.contains("<strong id=\"matched\">44</strong>"),
        "{}",
        r.body
    );
    assert!(
        r.body.contains(&format!(
            "<input type=\"hidden\" name=\"error_group\" value=\"{smtp}\">"
        )),
        "{}",
        r.body
    );
    let csrf = csrf_of(&r.body);
    let r = post_form(
        &app,
        "/ui/tasks/bulk",
        Some(&cookie),
        &format!("csrf={csrf}&action=retry&{}", group("emails", smtp)),
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    assert!(
        r.location.as_deref().unwrap().contains("Retried+44+of+44"),
        "{:?}",
        r.location
    );
    let r = get(&app, "/ui/dead", None).await;
    assert!(r.body.contains(&row("emails", "timeout", 86)), "{}", r.body);
    assert!(r.body.contains(&row("reports", "disk full", 5)));
    assert!(!r.body.contains(smtp), "{}", r.body);
}

#[tokio::test]
async fn a_token_of_one_namespace_sees_its_namespace_and_an_admin_of_all_can_switch() {
    let dir = tempfile::tempdir().unwrap();
    let sundial = Sundial::open(dir.path()).await.unwrap();
    let app = router(
        sundial.clone(),
        ServerConfig {
            access: AccessConfig {
                mode: AuthMode::Required,
                ..AccessConfig::default()
            },
            ui: UiConfig {
                enabled: true,
                secure_cookies: false,
            },
            ..ServerConfig::default()
        },
    );
    let admin = common::root_token(&sundial).await;
    api(
        &app,
        "POST",
        "/v1/namespaces",
        json!({"name": "acme"}),
        Some(&admin),
    )
    .await;
    let acme_token = api(
        &app,
        "POST",
        "/v1/tokens",
        json!({"name": "acme-ops", "scope": "producer", "namespace": "acme"}),
        Some(&admin),
    )
    .await["token"]
        .as_str()
        .unwrap()
        .to_string();
    let mine = api(
        &app,
        "POST",
        "/v1/namespaces/acme/tasks",
        json!({"kind": "acme-kind", "queue": "acme-queue", "delay": "1h"}),
        Some(&admin),
    )
    .await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let theirs = api(
        &app,
        "POST",
        "/v1/tasks",
        json!({"kind": "default-kind", "queue": "default-queue", "delay": "1h"}),
        Some(&admin),
    )
    .await["id"]
        .as_str()
        .unwrap()
        .to_string();

    for (path, id) in [
        ("/v1/namespaces/acme/workflows", "wf-acme"),
        ("/v1/workflows", "wf-default"),
    ] {
        api(
            &app,
            "POST",
            path,
            json!({"type": "order", "id": id}),
            Some(&admin),
        )
        .await;
    }

    // A dead task in each namespace, with an error of its own.
    let mut stepper = sundial.stepper();
    for base in ["/v1/namespaces/acme", "/v1"] {
        let ns = if base == "/v1" { "default" } else { "acme" };
        api(
            &app,
            "POST",
            &format!("{base}/tasks"),
            json!({"kind": "k", "queue": format!("{ns}-dead"), "max_attempts": 1}),
            Some(&admin),
        )
        .await;
        stepper.settle().await;
        let got = api(
            &app,
            "POST",
            &format!("{base}/queues/{ns}-dead/poll"),
            json!({"worker": "w", "max": 1, "wait": "0s"}),
            Some(&admin),
        )
        .await;
        let t = &got["tasks"][0];
        let failed = api(
            &app,
            "POST",
            &format!("{base}/tasks/{}/fail", t["id"].as_str().unwrap()),
            json!({"execution_id": t["execution_id"], "error": format!("{ns} boom"),
                   "retryable": false}),
            Some(&admin),
        )
        .await;
        assert_eq!(failed["state"], "dead", "{got} {failed}");
    }

    let login = |token: String| {
        let app = app.clone();
        async move {
            let r = get(&app, "/ui/login", None).await;
            let pre = cookie_pair(&r, "sundial_csrf").unwrap();
            let csrf = csrf_of(&r.body);
            let form = format!("csrf={csrf}&next=%2Fui%2Ftasks&token={token}");
            let r = post_form(&app, "/ui/login", Some(&pre), &form).await;
            assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
            cookie_pair(&r, "sundial_session").unwrap()
        }
    };

    // The namespace's own token: its tasks, by the names it knows them by, and nothing else.
    let session = login(acme_token).await;
    let r = get(&app, "/ui/tasks", Some(&session)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(
        r.body.contains(&mine) && r.body.contains("acme-queue"),
        "{}",
        r.body
    );
    assert!(!r.body.contains(&theirs) && !r.body.contains('\u{1f}'));
    assert!(
        r.body.contains("Namespace <strong>acme</strong>"),
        "no switcher for a bound token"
    );
    let r = get(&app, &format!("/ui/tasks/{theirs}"), Some(&session)).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = get(&app, &format!("/ui/tasks/{mine}"), Some(&session)).await;
    assert_eq!(r.status, StatusCode::OK);
    let r = get(&app, "/ui", Some(&session)).await;
    assert!(
        r.body.contains("acme-queue") && !r.body.contains("default-queue"),
        "{}",
        r.body
    );
    // Its dead letters: the groups of its own queues only.
    let r = get(&app, "/ui/dead", Some(&session)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(
        r.body.contains("acme boom") && !r.body.contains("default boom"),
        "{}",
        r.body
    );
    // It may act on its own task, not on the other namespace's.
    let csrf = csrf_of(&r.body);
    let r = post_form(
        &app,
        &format!("/ui/tasks/{theirs}/cancel"),
        Some(&session),
        &format!("csrf={csrf}"),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.body);
    let r = post_form(
        &app,
        &format!("/ui/tasks/{mine}/trigger"),
        Some(&session),
        &format!("csrf={csrf}"),
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    // Its workflows, not the other namespace's.
    let r = get(&app, "/ui/workflows", Some(&session)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(
        r.body.contains("wf-acme") && !r.body.contains("wf-default"),
        "{}",
        r.body
    );
    let r = get(&app, "/ui/workflow?id=wf-acme", Some(&session)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let r = get(&app, "/ui/workflow?id=wf-default", Some(&session)).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = post_form(
        &app,
        "/ui/workflow/cancel",
        Some(&session),
        &format!("csrf={csrf}&id=wf-default"),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.body);
    // And it cannot switch.
    let r = post_form(
        &app,
        "/ui/namespace",
        Some(&session),
        &format!("csrf={csrf}&namespace=default"),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);

    // An admin of every namespace starts in default and switches with the form.
    let session = login(admin).await;
    let r = get(&app, "/ui/tasks", Some(&session)).await;
    assert!(
        r.body.contains(&theirs) && !r.body.contains(&mine),
        "{}",
        r.body
    );
    let csrf = csrf_of(&r.body);
    let r = post_form(
        &app,
        "/ui/namespace",
        Some(&session),
        &format!("csrf={csrf}&namespace=nowhere"),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.body);
    let r = post_form(
        &app,
        "/ui/namespace",
        Some(&session),
        &format!("csrf={csrf}&namespace=acme"),
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    let chosen = cookie_pair(&r, "sundial_ns").expect("the namespace cookie");
    assert!(r.cookies.iter().any(|c| c.starts_with("sundial_ns=")
        && c.contains("HttpOnly")
        && c.contains("SameSite=Strict")));
    let both = format!("{session}; {chosen}");
    let r = get(&app, "/ui/tasks", Some(&both)).await;
    assert!(
        r.body.contains(&mine) && !r.body.contains(&theirs),
        "{}",
        r.body
    );
    // The switch is audited with its actor.
    let actions = audit_actions(&sundial).await;
    assert!(
        actions
            .iter()
            .any(|(actor, action, target, status)| actor == "root"
                && action == "POST /ui/namespace"
                && target.as_deref() == Some("acme")
                && *status == 303),
        "{actions:?}"
    );
}

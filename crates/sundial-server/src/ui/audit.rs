//! The audit log (admin): who did what, filtered by actor, action and target, newest first.

use askama::Template;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use sundial_store::AuditFilter;

use super::fmt;
use super::{
    Chrome, Fields, PageRequest, UiError, UiState, Viewer, enc, page_or_error, page_request, render,
};

struct Row {
    at: String,
    actor: String,
    action: String,
    target: String,
    target_href: Option<String>,
    status: u16,
    ok: bool,
    request_id: String,
}

#[derive(Template)]
#[template(path = "ui/audit.html")]
struct AuditPage {
    chrome: Chrome,
    actor: String,
    action: String,
    target: String,
    rows: Vec<Row>,
    next: Option<String>,
}

/// `GET /ui/audit?actor=&action=&target=&cursor=`.
pub(crate) async fn list(
    State(st): State<UiState>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let PageRequest { v, q, .. } =
        match page_request(&st, &headers, "/ui/audit", raw.as_deref()).await {
            Ok(p) => p,
            Err(r) => return r,
        };
    page_or_error(&v, audit_page(&st, &v, &q).await)
}

/// Where an audit target leads, when it names a task.
fn target_href(action: &str, target: &str) -> Option<String> {
    if target.parse::<sundial::TaskId>().is_ok() && action.contains("/tasks/") {
        Some(format!("/ui/tasks/{target}"))
    } else if action.contains("/schedule") && !target.contains(' ') {
        Some(format!("/ui/schedule?id={}", enc(target)))
    } else if action.contains("/workflow") && !target.contains(' ') {
        Some(format!("/ui/workflow?id={}", enc(target)))
    } else {
        None
    }
}

async fn audit_page(st: &UiState, v: &Viewer, q: &Fields) -> Result<Response, UiError> {
    if !v.is_admin() {
        return Err(UiError::new(
            StatusCode::FORBIDDEN,
            "the audit log is for admin tokens",
        ));
    }
    let store = st
        .access
        .store()
        .ok_or_else(|| UiError::not_found("this store keeps no audit log"))?;
    let before = match q.get("cursor") {
        Some(c) => Some(
            c.parse::<i64>()
                .map_err(|_| UiError::bad_request("cursor: not a cursor from a previous page"))?,
        ),
        None => None,
    };
    let page = store
        .list_audit(
            &AuditFilter {
                namespace: None,
                actor: q.get("actor"),
                action: q.get("action"),
                target: q.get("target"),
                before,
            },
            100,
        )
        .await
        .map_err(|e| UiError::from(sundial::Error::Store(e)))?;
    let next = page.next_cursor.map(|c| {
        let rest = q.query_without(&["cursor", "notice"]);
        let sep = if rest.is_empty() { "" } else { "&" };
        format!("/ui/audit?{rest}{sep}cursor={c}")
    });
    let rows = page
        .records
        .into_iter()
        .map(|r| {
            let r = r.record;
            let target = r.target.clone().unwrap_or_default();
            Row {
                at: fmt::at(r.at),
                target_href: target_href(&r.action, &target),
                actor: r.actor,
                action: r.action,
                target,
                ok: r.status < 400,
                status: r.status,
                request_id: r.request_id,
            }
        })
        .collect();
    let t = AuditPage {
        chrome: Chrome::new(v, "audit", "Audit log"),
        actor: q.get("actor").unwrap_or_default(),
        action: q.get("action").unwrap_or_default(),
        target: q.get("target").unwrap_or_default(),
        rows,
        next,
    };
    Ok(render(v, &t))
}

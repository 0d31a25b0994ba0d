//! The web UI at `/ui`: server-rendered pages over the same library calls the JSON API makes.
//!
//! ```text
//! GET  /ui                         overview: queues (counts, overdue, paused), fire lateness, nodes
//! GET  /ui/login, POST /ui/login   sign in with a token (only when auth is on); POST /ui/logout
//! GET  /ui/tasks?queue=&kind=&state=&key=&key_prefix=&tag=&error_group=&due_after=&…&cursor=&id=
//! GET  /ui/tasks/{id}              payload, tags, target, attempts, timeline
//! POST /ui/tasks/{id}/{cancel|trigger|retry}
//! GET  /ui/tasks/bulk?action=cancel|retry&<filter>   the count (a dry run) and a confirm form
//! POST /ui/tasks/bulk              the bulk action over the same filter
//! GET  /ui/dead?queue=             dead tasks by queue and error (each group links to its
//!                                  filtered list and its bulk retry)
//! POST /ui/queues/{queue}/{pause|resume}
//! GET  /ui/schedules?q=&paused=&cursor=      GET /ui/schedule?id=   (next fires, fire records)
//! POST /ui/schedule/{pause|unpause|trigger|backfill|edit}   POST /ui/schedules/bulk (pause many)
//! GET  /ui/workflows?type=&status=&cursor=   GET /ui/workflow?id=   (history timeline)
//! POST /ui/workflow/{signal|cancel|terminate}
//! GET  /ui/audit?actor=&action=&target=&cursor=   (admin)
//! GET  /ui/assets/ui.css, /ui/assets/ui.js         embedded in the binary
//! ```
//!
//! **What it owns:** turning a page request into one or a few index-backed library calls (the
//! same ones the JSON handlers make, never an HTTP call to itself) and rendering them with the
//! askama templates in `templates/ui/`; the session cookie and CSRF tokens ([`session`]).
//! **What it must never do:** change anything on a `GET`, accept a `POST` without its CSRF
//! token, show an action to a token whose scope does not allow it, or load anything from
//! outside the binary.
//!
//! The UI is merged into the router *after* the access layer ([`crate::access`]), which therefore
//! does not see it: that layer's cross-site guard refuses form bodies (`415`), and the UI's writes
//! are form posts. They are protected instead by a CSRF token in every form, checked against the
//! session (`SameSite=Strict`, `HttpOnly` cookies), and the UI writes one audit record per post
//! itself, refusals included, with the signed-in actor ([`crate::access::Access::record_audit`]).
//! The UI's routes are not in `/openapi.json` (they are pages, not API).

mod audit;
mod fmt;
mod overview;
mod schedules;
pub mod session;
mod tasks;
mod workflows;

use std::sync::{Arc, Mutex};

use askama::Template;
use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use sundial_schedules::Schedules;
use sundial_store::Scope;
use sundial_workflow::Workflows;

use crate::AppState;
use crate::access::{Access, scope_allows};
use crate::error::ApiError;

pub use session::Viewer;

/// How the UI behaves.
#[derive(Debug, Clone)]
pub struct UiConfig {
    /// Serve `/ui` at all.
    pub enabled: bool,
    /// Mark the UI's cookies `Secure` (the server speaks TLS).
    pub secure_cookies: bool,
}

impl Default for UiConfig {
    fn default() -> Self {
        UiConfig {
            enabled: true,
            secure_cookies: false,
        }
    }
}

/// What the UI's handlers share.
#[derive(Clone)]
pub struct UiState {
    pub(crate) app: AppState,
    pub(crate) access: Access,
    pub(crate) schedules: Option<Schedules>,
    pub(crate) workflows: Option<Workflows>,
    pub(crate) lateness: Arc<Mutex<overview::LatenessWindow>>,
}

impl UiState {
    pub fn new(
        app: AppState,
        access: Access,
        schedules: Option<Schedules>,
        workflows: Option<Workflows>,
    ) -> Self {
        UiState {
            app,
            access,
            schedules,
            workflows,
            lateness: Arc::new(Mutex::new(overview::LatenessWindow::default())),
        }
    }

    fn secure(&self) -> bool {
        self.app.config.ui.secure_cookies
    }
}

/// The UI's routes, with their own state. Merged into [`crate::router`] after the access layer.
pub fn router(state: UiState) -> Router {
    Router::new()
        .route("/ui", get(overview::page))
        .route("/ui/", get(|| async { Redirect::to("/ui") }))
        .route("/ui/login", get(session::login_page).post(session::login))
        .route("/ui/logout", post(session::logout))
        .route("/ui/namespace", post(overview::switch_namespace))
        .route("/ui/assets/ui.css", get(css))
        .route("/ui/assets/ui.js", get(js))
        .route("/ui/queues/{queue}/{action}", post(overview::queue_action))
        .route("/ui/tasks", get(tasks::list))
        .route(
            "/ui/tasks/bulk",
            get(tasks::bulk_preview).post(tasks::bulk_apply),
        )
        .route("/ui/tasks/{id}", get(tasks::show))
        .route("/ui/tasks/{id}/{action}", post(tasks::act))
        .route("/ui/dead", get(tasks::dead))
        .route("/ui/schedules", get(schedules::list))
        .route("/ui/schedules/bulk", post(schedules::bulk))
        .route("/ui/schedule", get(schedules::show))
        .route("/ui/schedule/{action}", post(schedules::act))
        .route("/ui/workflows", get(workflows::list))
        .route("/ui/workflow", get(workflows::show))
        .route("/ui/workflow/{action}", post(workflows::act))
        .route("/ui/audit", get(audit::list))
        .with_state(state)
}

const CSS: &str = include_str!("../../templates/ui/assets/ui.css");
const JS: &str = include_str!("../../templates/ui/assets/ui.js");

async fn css() -> Response {
    asset("text/css; charset=utf-8", CSS)
}

async fn js() -> Response {
    asset("text/javascript; charset=utf-8", JS)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "public, max-age=300"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

/// The part of every page around its content: navigation, who is signed in, the CSRF token.
pub(crate) struct Chrome {
    pub active: &'static str,
    pub title: String,
    pub signed_in: bool,
    pub actor: String,
    pub scope: String,
    pub can_act: bool,
    pub is_admin: bool,
    pub csrf: String,
    pub notice: Option<String>,
    /// The namespace shown, and whether the viewer may choose another.
    pub namespace: String,
    pub may_switch_namespace: bool,
}

impl Chrome {
    pub(crate) fn new(v: &Viewer, active: &'static str, title: impl Into<String>) -> Self {
        Chrome {
            active,
            title: title.into(),
            signed_in: v.auth_on,
            actor: v.actor.name().to_string(),
            scope: v.scope_name().to_string(),
            can_act: v.can_act(),
            is_admin: v.is_admin(),
            csrf: v.csrf.clone(),
            notice: None,
            namespace: v.ns.name().to_string(),
            may_switch_namespace: v.may_switch_namespace(),
        }
    }

    pub(crate) fn notice(mut self, notice: Option<String>) -> Self {
        self.notice = notice.filter(|n| !n.is_empty());
        self
    }

    /// Whether `section` is the page's section (for `aria-current`).
    pub(crate) fn is(&self, section: &str) -> bool {
        self.active == section
    }
}

/// A page that could not be shown, or an action that was refused.
#[derive(Debug)]
pub(crate) struct UiError {
    pub status: StatusCode,
    pub message: String,
}

impl UiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        UiError {
            status,
            message: message.into(),
        }
    }
    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        UiError::new(StatusCode::NOT_FOUND, message)
    }
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        UiError::new(StatusCode::UNPROCESSABLE_ENTITY, message)
    }
}

impl From<ApiError> for UiError {
    fn from(e: ApiError) -> Self {
        let message = match &e.detail.field {
            Some(f) if !e.detail.message.contains(f.as_str()) => {
                format!("{f}: {}", e.detail.message)
            }
            _ => e.detail.message.clone(),
        };
        UiError {
            status: e.status,
            message,
        }
    }
}

impl From<sundial::Error> for UiError {
    fn from(e: sundial::Error) -> Self {
        ApiError::from(e).into()
    }
}

#[derive(Template)]
#[template(path = "ui/error.html")]
struct ErrorPage {
    chrome: Chrome,
    status: u16,
    reason: String,
    message: String,
}

/// The error page for `e`, with the viewer's navigation.
pub(crate) fn error_page(v: &Viewer, e: UiError) -> Response {
    let t = ErrorPage {
        chrome: Chrome::new(v, "", format!("{}", e.status.as_u16())),
        status: e.status.as_u16(),
        reason: e.status.canonical_reason().unwrap_or("").to_string(),
        message: e.message,
    };
    let mut resp = render(v, &t);
    *resp.status_mut() = e.status;
    resp
}

/// A rendered page with the UI's headers (and the viewer's new cookie, if it got one).
pub(crate) fn render(v: &Viewer, t: &impl Template) -> Response {
    let mut resp = match t.render() {
        Ok(html) => Html(html).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "cannot render a UI page");
            (StatusCode::INTERNAL_SERVER_ERROR, "cannot render this page").into_response()
        }
    };
    page_headers(resp.headers_mut());
    if let Some(c) = &v.set_cookie {
        resp.headers_mut().append(header::SET_COOKIE, c.clone());
    }
    resp
}

/// Headers of every page: never cached, never framed, scripts and styles only from `/ui/assets`.
pub(crate) fn page_headers(h: &mut HeaderMap) {
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
}

/// A form post's fields (`application/x-www-form-urlencoded`; names may repeat).
#[derive(Debug, Default, Clone)]
pub(crate) struct Fields(Vec<(String, String)>);

impl Fields {
    pub(crate) fn parse(body: &[u8]) -> Self {
        Fields(
            form_urlencoded::parse(body)
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }
    /// The first non-empty value of `name` (trimmed, but see [`Fields::value`]).
    pub(crate) fn get(&self, name: &str) -> Option<String> {
        self.0
            .iter()
            .filter(|(k, _)| k == name)
            .find_map(|(k, v)| Fields::value(k, v))
            .map(str::to_string)
    }
    /// Every non-empty value of `name`.
    pub(crate) fn all(&self, name: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(k, _)| k == name)
            .filter_map(|(k, v)| Fields::value(k, v))
            .map(str::to_string)
            .collect()
    }
    /// The fields whose values are not empty, as a query string (a GET form sends every field,
    /// empty ones too; the API's parameters mean "filter by this" when present).
    pub(crate) fn query_without(&self, drop: &[&str]) -> String {
        let mut out = form_urlencoded::Serializer::new(String::new());
        for (k, v) in &self.0 {
            if let Some(v) = Fields::value(k, v).filter(|_| !drop.contains(&k.as_str())) {
                out.append_pair(k, v);
            }
        }
        out.finish()
    }
    /// A field's value as the UI uses it: `None` when blank, else trimmed, except for
    /// `error_group`, which must equal a task's error group to the character (an error's first
    /// line may begin or end with spaces).
    pub(crate) fn value<'a>(name: &str, v: &'a str) -> Option<&'a str> {
        if v.trim().is_empty() {
            None
        } else if name == "error_group" {
            Some(v)
        } else {
            Some(v.trim())
        }
    }
}

/// The query string of a page request, as [`Fields`].
pub(crate) fn query_fields(raw: Option<&str>) -> Fields {
    Fields::parse(raw.unwrap_or("").as_bytes())
}

/// A `303 See Other` to `to` (after a successful post).
pub(crate) fn see_other(to: &str) -> Response {
    let mut resp = Redirect::to(to).into_response();
    page_headers(resp.headers_mut());
    resp
}

/// `to` with `notice=…` appended: the message the next page shows.
pub(crate) fn with_notice(to: &str, notice: &str) -> String {
    let sep = if to.contains('?') { '&' } else { '?' };
    let n: String = form_urlencoded::byte_serialize(notice.as_bytes()).collect();
    format!("{to}{sep}notice={n}")
}

/// Percent-encodes one query value.
pub(crate) fn enc(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// Percent-encodes one path segment (everything but unreserved characters).
pub(crate) fn enc_path(s: &str) -> String {
    use std::fmt::Write;
    s.bytes().fold(String::new(), |mut out, b| {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
        out
    })
}

/// A post that changes something: checks the session, the CSRF token and the scope, then runs
/// `act`, and writes one audit record whatever the outcome (refusals included).
pub(crate) async fn perform<F, Fut>(
    st: &UiState,
    headers: &HeaderMap,
    body: &Bytes,
    action: String,
    target: Option<String>,
    act: F,
) -> Response
where
    F: FnOnce(Viewer, Fields) -> Fut,
    Fut: std::future::Future<Output = (Option<String>, Result<Response, UiError>)>,
{
    let fields = Fields::parse(body);
    let request_id = uuid::Uuid::now_v7().to_string();
    let mut scope = None;
    let (actor, resp, target) = match session::authorize_post(st, headers, &fields).await {
        Err((actor, resp)) => (actor, resp, target),
        Ok(v) => {
            let actor = v.actor.clone();
            let viewer = v.clone();
            // The action's own write commits the record (a successful post answers `303`).
            scope = st.access.audit_scope(
                &actor,
                format!("POST {action}"),
                target.clone(),
                StatusCode::SEE_OTHER.as_u16(),
                request_id.clone(),
            );
            let (named, result) = match &scope {
                Some(s) => s.run(act(v, fields)).await,
                None => act(v, fields).await,
            };
            let resp = match result {
                Ok(r) => r,
                Err(e) => error_page(&viewer, e),
            };
            (actor, resp, named.or(target))
        }
    };
    st.access
        .record_audit(
            scope.as_ref(),
            &actor,
            format!("POST {action}"),
            target,
            resp.status().as_u16(),
            request_id.clone(),
        )
        .await;
    let mut resp = resp;
    if let Ok(v) = HeaderValue::from_str(&request_id) {
        resp.headers_mut().insert("x-request-id", v);
    }
    resp
}

/// The action word for a post's audit route: `action` when it is one of `known`, else the
/// placeholder `{action}` (so a probe cannot write arbitrary text into the log).
pub(crate) fn action_word<'a>(action: &'a str, known: &[&str]) -> &'a str {
    if known.contains(&action) {
        action
    } else {
        "{action}"
    }
}

/// What a `GET` page starts from: its viewer, the query's fields and the page's own address
/// (`path?query`, where a visitor who must log in is sent back to).
pub(crate) struct PageRequest {
    pub v: Viewer,
    pub q: Fields,
    pub here: String,
}

/// The [`PageRequest`] of `path` with query `raw`, or the answer for a visitor without a
/// session (the login page, then back here).
pub(crate) async fn page_request(
    st: &UiState,
    headers: &HeaderMap,
    path: &str,
    raw: Option<&str>,
) -> Result<PageRequest, Response> {
    let here = format!("{path}?{}", raw.unwrap_or(""));
    let v = viewer(st, headers, &here).await?;
    Ok(PageRequest {
        v,
        q: query_fields(raw),
        here,
    })
}

/// The page, or `v`'s error page for its error.
pub(crate) fn page_or_error(v: &Viewer, page: Result<Response, UiError>) -> Response {
    page.unwrap_or_else(|e| error_page(v, e))
}

/// The viewer of a page, or the answer that replaces the page (a redirect to the login form).
pub(crate) async fn viewer(
    st: &UiState,
    headers: &HeaderMap,
    here: &str,
) -> Result<Viewer, Response> {
    session::viewer(st, headers, here).await
}

/// Whether a token of `scope` may use the UI's actions (cancel, retry, pause, …).
pub(crate) fn scope_can_act(scope: Scope) -> bool {
    scope_allows(scope, Scope::Producer)
}

#[cfg(test)]
mod tests {
    use super::action_word;

    #[test]
    fn an_unknown_action_is_audited_as_the_placeholder() {
        assert_eq!(action_word("pause", &["pause", "resume"]), "pause");
        assert_eq!(action_word("drop table", &["pause", "resume"]), "{action}");
        assert_eq!(action_word("", &["pause"]), "{action}");
    }
}

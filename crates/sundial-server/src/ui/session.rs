//! Who is looking at the UI, and whether a form post really comes from one of its pages.
//!
//! **Auth on** (tokens exist, or `--auth required`): the login form takes a token; the server
//! checks it like a bearer token and sets the cookie `sundial_session` =
//! `<token id>.<expires ms>.<nonce>.<mac>`, where `mac` is HMAC-SHA256 keyed with the token's
//! stored secret hash (which never leaves the server) over the other three parts. The cookie
//! holds no secret a script could reuse as a token (and is `HttpOnly` anyway); any node sharing
//! the store can check it, and revoking or expiring the token ends every session made with it
//! (within the token cache's 500 ms). The CSRF token of a session is HMAC-SHA256 of its nonce
//! under the same key, so it is bound to the session and cannot be made without the server.
//!
//! **Auth off** (loopback, no tokens): no login. The CSRF token is the random value of the
//! cookie `sundial_csrf` (double submit): a page of another site can neither read it nor, the
//! cookie being `SameSite=Strict`, make the browser send it with a cross-site post.
//!
//! Both cookies are `HttpOnly`, `SameSite=Strict`, `Path=/ui`, and `Secure` when the server
//! speaks TLS. A post whose `Origin` names another host is refused as well.

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use sundial_core::TokenId;
use sundial_store::Scope;

use askama::Template;

use super::{Chrome, Fields, UiError, UiState, error_page, render, see_other};
use crate::access::{Actor, hex};
use crate::namespace::Ns;

/// The session cookie's name.
pub const SESSION_COOKIE: &str = "sundial_session";
/// The double-submit CSRF cookie's name (auth off, and the login form).
pub const CSRF_COOKIE: &str = "sundial_csrf";
/// How long a session lasts.
pub const SESSION_MS: i64 = 12 * 60 * 60 * 1000;

/// Who is looking, and the CSRF token their forms carry.
#[derive(Debug, Clone)]
pub struct Viewer {
    pub actor: Actor,
    pub auth_on: bool,
    pub csrf: String,
    /// A cookie to set with the page (a fresh CSRF cookie).
    pub set_cookie: Option<HeaderValue>,
    /// The namespace the pages show and act in: a bound token's own; for a viewer of every
    /// namespace, the one chosen with `POST /ui/namespace` (cookie `sundial_ns`), else `default`.
    pub ns: Ns,
}

impl Viewer {
    /// Whether the viewer may choose the namespace (a token bound to one may not).
    pub fn may_switch_namespace(&self) -> bool {
        !matches!(
            &self.actor,
            Actor::Token {
                namespace: Some(_),
                ..
            }
        )
    }

    fn scope(&self) -> Option<Scope> {
        match &self.actor {
            Actor::Token { scope, .. } => Some(*scope),
            _ => None,
        }
    }

    /// Whether the viewer may act (producer or admin; everyone when auth is off).
    pub fn can_act(&self) -> bool {
        match (&self.actor, self.scope()) {
            (Actor::Local, _) => true,
            (_, Some(s)) => super::scope_can_act(s),
            _ => false,
        }
    }

    /// Whether the viewer may read the audit log.
    pub fn is_admin(&self) -> bool {
        matches!(self.actor, Actor::Local) || self.scope() == Some(Scope::Admin)
    }

    pub fn scope_name(&self) -> &'static str {
        match (&self.actor, self.scope()) {
            (Actor::Local, _) => "local (auth off)",
            (_, Some(Scope::Admin)) => "admin",
            (_, Some(Scope::Producer)) => "producer",
            (_, Some(Scope::Worker)) => "worker",
            (_, Some(Scope::Reader)) => "reader",
            _ => "anonymous",
        }
    }

    /// A viewer for pages shown before anyone is known (login, errors of the session itself).
    fn anonymous(auth_on: bool) -> Self {
        Viewer {
            actor: Actor::Anonymous,
            auth_on,
            csrf: String::new(),
            set_cookie: None,
            ns: Ns::default(),
        }
    }
}

/// The cookie holding the namespace a viewer of every namespace chose.
pub const NAMESPACE_COOKIE: &str = "sundial_ns";

/// The namespace `actor` sees: its own when bound to one, else the chosen one if it still
/// exists, else `default`.
async fn viewer_namespace(st: &UiState, headers: &HeaderMap, actor: &Actor) -> Ns {
    if let Actor::Token {
        namespace: Some(ns),
        ..
    } = actor
    {
        return Ns(ns.clone());
    }
    match cookie(headers, NAMESPACE_COOKIE) {
        Some(ns)
            if sundial_core::namespace::is_valid_name(&ns)
                && st.access.namespace_exists(&ns).await =>
        {
            Ns(ns)
        }
        _ => Ns::default(),
    }
}

/// The `Set-Cookie` that makes `ns` the namespace of a viewer of every namespace.
pub(crate) fn namespace_cookie(st: &UiState, ns: &str) -> Option<HeaderValue> {
    set_cookie(st, NAMESPACE_COOKIE, ns, SESSION_MS / 1000)
}

type HmacSha256 = Hmac<Sha256>;

fn mac(key: &[u8; 32], parts: &[&str]) -> [u8; 32] {
    // A 32-byte key is always a valid HMAC key; the fallback is never taken.
    let mut m = match HmacSha256::new_from_slice(key) {
        Ok(m) => m,
        Err(_) => return [0; 32],
    };
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            m.update(b"|");
        }
        m.update(p.as_bytes());
    }
    m.finalize().into_bytes().into()
}

/// Equality of two strings in time independent of where they differ.
fn same(a: &str, b: &str) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a
        .bytes()
        .zip(b.bytes())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim().to_string())
}

fn set_cookie(st: &UiState, name: &str, value: &str, max_age_s: i64) -> Option<HeaderValue> {
    let secure = if st.secure() { "; Secure" } else { "" };
    HeaderValue::from_str(&format!(
        "{name}={value}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={max_age_s}{secure}"
    ))
    .ok()
}

fn random_hex() -> String {
    let b: [u8; 32] = rand::random();
    hex(&b)
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn parse_token_id(s: &str) -> Option<TokenId> {
    if !is_hex(s, 32) {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(TokenId::from_bytes(out))
}

/// A session that checked out: the actor and the session's CSRF token.
struct Session {
    actor: Actor,
    csrf: String,
}

/// Why there is no session.
enum NoSession {
    /// No cookie, or one that does not check out (forged, expired, revoked token).
    Missing(&'static str),
    /// The store cannot be read now.
    Unavailable(String),
}

async fn session(st: &UiState, headers: &HeaderMap) -> Result<Session, NoSession> {
    let raw = cookie(headers, SESSION_COOKIE).ok_or(NoSession::Missing("not signed in"))?;
    let parts: Vec<&str> = raw.split('.').collect();
    let [id, expires, nonce, sig] = parts.as_slice() else {
        return Err(NoSession::Missing("not a session cookie"));
    };
    let id_parsed = parse_token_id(id).ok_or(NoSession::Missing("not a session cookie"))?;
    let expires_ms: i64 = expires
        .parse()
        .map_err(|_| NoSession::Missing("not a session cookie"))?;
    if !is_hex(nonce, 64) || !is_hex(sig, 64) {
        return Err(NoSession::Missing("not a session cookie"));
    }
    if expires_ms <= st.access.now().0 {
        return Err(NoSession::Missing("the session has expired; sign in again"));
    }
    let token = st
        .access
        .lookup_token(id_parsed)
        .await
        .map_err(NoSession::Unavailable)?
        .ok_or(NoSession::Missing("the session's token is gone"))?;
    let want = hex(&mac(&token.secret_hash, &["session", id, expires, nonce]));
    if !same(&want, sig) {
        return Err(NoSession::Missing("not a session cookie"));
    }
    if !token.is_live_at(st.access.now()) {
        return Err(NoSession::Missing(
            "the session's token is revoked or expired",
        ));
    }
    Ok(Session {
        csrf: hex(&mac(&token.secret_hash, &["csrf", nonce])),
        actor: Actor::Token {
            id: token.id,
            name: token.name,
            scope: token.scope,
            namespace: token.namespace,
        },
    })
}

/// Whether a token may use the UI at all: it must be able to read, and its namespace (if bound
/// to one) must be the one the UI shows.
fn may_view(actor: &Actor) -> Result<(), &'static str> {
    match actor {
        Actor::Token {
            scope: Scope::Worker,
            ..
        } => Err("a worker token cannot read; sign in with a reader, producer or admin token"),
        _ => Ok(()),
    }
}

fn login_redirect(here: &str, why: &str) -> Response {
    let to = format!(
        "/ui/login?next={}&notice={}",
        super::enc(here),
        super::enc(why)
    );
    see_other(&to)
}

fn unavailable(e: String) -> Response {
    error_page(
        &Viewer::anonymous(true),
        UiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the store cannot be read now: {e}"),
        ),
    )
}

/// The viewer of a page at `here` (path and query), or the answer instead of the page.
pub(crate) async fn viewer(
    st: &UiState,
    headers: &HeaderMap,
    here: &str,
) -> Result<Viewer, Response> {
    let auth_on = st.access.auth_is_on().await.map_err(unavailable)?;
    if !auth_on {
        let mut v = local_viewer(st, headers);
        v.ns = viewer_namespace(st, headers, &v.actor).await;
        return Ok(v);
    }
    match session(st, headers).await {
        Ok(s) => {
            if let Err(why) = may_view(&s.actor) {
                return Err(error_page(
                    &Viewer::anonymous(true),
                    UiError::new(StatusCode::FORBIDDEN, why),
                ));
            }
            let ns = viewer_namespace(st, headers, &s.actor).await;
            Ok(Viewer {
                actor: s.actor,
                auth_on: true,
                csrf: s.csrf,
                set_cookie: None,
                ns,
            })
        }
        Err(NoSession::Missing(why)) => Err(login_redirect(here, why)),
        Err(NoSession::Unavailable(e)) => Err(unavailable(e)),
    }
}

/// Auth off: everyone is `local`; the CSRF token is the `sundial_csrf` cookie (set if missing).
fn local_viewer(st: &UiState, headers: &HeaderMap) -> Viewer {
    let (csrf, set) = csrf_cookie(st, headers);
    Viewer {
        actor: Actor::Local,
        auth_on: false,
        csrf,
        set_cookie: set,
        ns: Ns::default(),
    }
}

/// The double-submit cookie's value, and a `Set-Cookie` when a fresh one was made.
fn csrf_cookie(st: &UiState, headers: &HeaderMap) -> (String, Option<HeaderValue>) {
    match cookie(headers, CSRF_COOKIE).filter(|c| is_hex(c, 64)) {
        Some(c) => (c, None),
        None => {
            let c = random_hex();
            let set = set_cookie(st, CSRF_COOKIE, &c, SESSION_MS / 1000);
            (c, set)
        }
    }
}

/// A post from another origin (a browser always sends `Origin` with a cross-site post).
fn cross_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let origin_host = origin
        .split_once("://")
        .map(|(_, rest)| rest)
        .unwrap_or(origin);
    origin == "null" || !origin_host.eq_ignore_ascii_case(host)
}

fn refused(auth_on: bool, status: StatusCode, why: &str) -> Response {
    error_page(&Viewer::anonymous(auth_on), UiError::new(status, why))
}

/// The viewer of a form post that may change something, or the refusal (with the actor for the
/// audit record): a session (when auth is on), the CSRF token, the scope.
pub(crate) async fn authorize_post(
    st: &UiState,
    headers: &HeaderMap,
    fields: &Fields,
) -> Result<Viewer, (Actor, Response)> {
    let auth_on = st
        .access
        .auth_is_on()
        .await
        .map_err(|e| (Actor::Anonymous, unavailable(e)))?;
    if cross_origin(headers) {
        return Err((
            Actor::Anonymous,
            refused(
                auth_on,
                StatusCode::FORBIDDEN,
                "a post from another origin is refused",
            ),
        ));
    }
    let sent = fields.get("csrf").unwrap_or_default();
    if !auth_on {
        let mut v = local_viewer(st, headers);
        v.ns = viewer_namespace(st, headers, &v.actor).await;
        if v.set_cookie.is_some() || !same(&v.csrf, &sent) {
            return Err((
                Actor::Local,
                refused(
                    false,
                    StatusCode::FORBIDDEN,
                    "missing or wrong CSRF token: reload the page and try again",
                ),
            ));
        }
        return Ok(v);
    }
    let s = match session(st, headers).await {
        Ok(s) => s,
        Err(NoSession::Missing(why)) => {
            return Err((
                Actor::Anonymous,
                refused(true, StatusCode::UNAUTHORIZED, why),
            ));
        }
        Err(NoSession::Unavailable(e)) => return Err((Actor::Anonymous, unavailable(e))),
    };
    if !same(&s.csrf, &sent) {
        return Err((
            s.actor,
            refused(
                true,
                StatusCode::FORBIDDEN,
                "missing or wrong CSRF token: reload the page and try again",
            ),
        ));
    }
    let ns = viewer_namespace(st, headers, &s.actor).await;
    let v = Viewer {
        actor: s.actor,
        auth_on: true,
        csrf: s.csrf,
        set_cookie: None,
        ns,
    };
    if may_view(&v.actor).is_err() || !v.can_act() {
        return Err((
            v.actor.clone(),
            error_page(
                &v,
                UiError::new(
                    StatusCode::FORBIDDEN,
                    format!("a {} token cannot do this", v.scope_name()),
                ),
            ),
        ));
    }
    Ok(v)
}

#[derive(Template)]
#[template(path = "ui/login.html")]
struct LoginPage {
    chrome: Chrome,
    next: String,
    error: Option<String>,
}

/// Where to go after signing in: a UI path, nothing else (no open redirect).
fn safe_next(next: Option<String>) -> String {
    match next {
        Some(n) if n.starts_with("/ui") && !n.starts_with("//") && !n.contains('\\') => n,
        _ => "/ui".to_string(),
    }
}

fn login_chrome(csrf: String, notice: Option<String>) -> Chrome {
    Chrome {
        active: "login",
        title: "Sign in".to_string(),
        signed_in: false,
        actor: String::new(),
        scope: String::new(),
        can_act: false,
        is_admin: false,
        csrf,
        notice,
        namespace: String::new(),
        may_switch_namespace: false,
    }
}

/// `GET /ui/login`: the form (with auth off, straight to the overview).
pub(crate) async fn login_page(
    State(st): State<UiState>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Response {
    let q = super::query_fields(q.as_deref());
    match st.access.auth_is_on().await {
        Err(e) => return unavailable(e),
        Ok(false) => return see_other("/ui"),
        Ok(true) => {}
    }
    let (csrf, set) = csrf_cookie(&st, &headers);
    let v = Viewer {
        actor: Actor::Anonymous,
        auth_on: true,
        csrf: csrf.clone(),
        set_cookie: set,
        ns: Ns::default(),
    };
    render(
        &v,
        &LoginPage {
            chrome: login_chrome(csrf, q.get("notice")),
            next: safe_next(q.get("next")),
            error: None,
        },
    )
}

/// `POST /ui/login`: checks the token and starts a session.
pub(crate) async fn login(State(st): State<UiState>, headers: HeaderMap, body: Bytes) -> Response {
    let fields = Fields::parse(&body);
    let request_id = uuid::Uuid::now_v7().to_string();
    let next = safe_next(fields.get("next"));
    let (actor, resp) = login_inner(&st, &headers, &fields, &next).await;
    st.access
        .record_audit(
            None,
            &actor,
            "POST /ui/login".to_string(),
            actor.token_id().map(|t| t.to_string()),
            resp.status().as_u16(),
            request_id,
        )
        .await;
    resp
}

async fn login_inner(
    st: &UiState,
    headers: &HeaderMap,
    fields: &Fields,
    next: &str,
) -> (Actor, Response) {
    match st.access.auth_is_on().await {
        Err(e) => return (Actor::Anonymous, unavailable(e)),
        Ok(false) => return (Actor::Local, see_other("/ui")),
        Ok(true) => {}
    }
    let (csrf, _) = csrf_cookie(st, headers);
    let form_again = |status: StatusCode, error: String| {
        let v = Viewer {
            actor: Actor::Anonymous,
            auth_on: true,
            csrf: csrf.clone(),
            set_cookie: set_cookie(st, CSRF_COOKIE, &csrf, SESSION_MS / 1000),
            ns: Ns::default(),
        };
        let mut resp = render(
            &v,
            &LoginPage {
                chrome: login_chrome(csrf.clone(), None),
                next: next.to_string(),
                error: Some(error),
            },
        );
        *resp.status_mut() = status;
        resp
    };
    let sent = fields.get("csrf").unwrap_or_default();
    if cross_origin(headers) || cookie(headers, CSRF_COOKIE).is_none() || !same(&csrf, &sent) {
        return (
            Actor::Anonymous,
            form_again(
                StatusCode::FORBIDDEN,
                "the form expired or came from elsewhere; try again".to_string(),
            ),
        );
    }
    let token = fields.get("token").unwrap_or_default();
    let actor = match st.access.actor_for_token(&token).await {
        Ok(a) => a,
        Err(why) => {
            return (
                Actor::Anonymous,
                form_again(StatusCode::UNAUTHORIZED, format!("cannot sign in: {why}")),
            );
        }
    };
    if let Err(why) = may_view(&actor) {
        return (actor, form_again(StatusCode::FORBIDDEN, why.to_string()));
    }
    let Some(id) = actor.token_id() else {
        return (
            actor,
            form_again(StatusCode::UNAUTHORIZED, "unknown token".into()),
        );
    };
    let record = match st.access.lookup_token(id).await {
        Ok(Some(r)) => r,
        Ok(None) => {
            return (
                actor,
                form_again(StatusCode::UNAUTHORIZED, "unknown token".into()),
            );
        }
        Err(e) => return (actor, unavailable(e)),
    };
    let id_hex = hex(id.as_bytes());
    let expires = (st.access.now().0 + SESSION_MS).to_string();
    let nonce = random_hex();
    let sig = hex(&mac(
        &record.secret_hash,
        &["session", &id_hex, &expires, &nonce],
    ));
    let value = format!("{id_hex}.{expires}.{nonce}.{sig}");
    let mut resp = see_other(next);
    if let Some(c) = set_cookie(st, SESSION_COOKIE, &value, SESSION_MS / 1000) {
        resp.headers_mut().append(header::SET_COOKIE, c);
    }
    (actor, resp)
}

/// `POST /ui/logout`: ends the session (the cookie is cleared).
pub(crate) async fn logout(State(st): State<UiState>, headers: HeaderMap, body: Bytes) -> Response {
    let fields = Fields::parse(&body);
    let request_id = uuid::Uuid::now_v7().to_string();
    let (actor, resp) = match authorize_logout(&st, &headers, &fields).await {
        Ok(actor) => {
            let mut resp = see_other("/ui/login?notice=signed+out");
            if let Some(c) = set_cookie(&st, SESSION_COOKIE, "", 0) {
                resp.headers_mut().append(header::SET_COOKIE, c);
            }
            (actor, resp)
        }
        Err(r) => r,
    };
    st.access
        .record_audit(
            None,
            &actor,
            "POST /ui/logout".to_string(),
            None,
            resp.status().as_u16(),
            request_id,
        )
        .await;
    resp
}

async fn authorize_logout(
    st: &UiState,
    headers: &HeaderMap,
    fields: &Fields,
) -> Result<Actor, (Actor, Response)> {
    let sent = fields.get("csrf").unwrap_or_default();
    match session(st, headers).await {
        Ok(s) if same(&s.csrf, &sent) && !cross_origin(headers) => Ok(s.actor),
        Ok(s) => Err((
            s.actor,
            refused(true, StatusCode::FORBIDDEN, "missing or wrong CSRF token"),
        )),
        Err(_) => Err((Actor::Anonymous, see_other("/ui/login"))),
    }
}

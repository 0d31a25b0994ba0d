//! Who may do what: the access layer every routed request passes through, in this order.
//!
//! 1. **Cross-site guard** ([`crate::guard`]): a write a browser could send cross-site is `415`.
//! 2. **Authentication**: when auth is on (see [`AuthMode`]), the request must carry
//!    `Authorization: Bearer sdl_…` naming a live token whose secret hashes (SHA-256, compared in
//!    constant time) to the stored hash; otherwise `401` with `WWW-Authenticate: Bearer`. When
//!    auth is off the actor is `local`.
//! 3. **Authorization**: the route's [`Requirement`] (from [`requirement`], one table keyed by
//!    method and route template, so a new route gets a rule without being listed) against the
//!    token's [`Scope`]: `403` without it. A token bound to a namespace other than the request's
//!    gets `404` on the namespace's routes, exactly as for an object that does not exist, and
//!    `403` on the routes all namespaces share (tokens, namespaces, audit; see [`scoping`]).
//! 4. The handler.
//! 5. **Audit**: every write (any method but `GET`, `HEAD`, `OPTIONS`), whatever its outcome
//!    (refusals included), has one [`NewAuditRecord`]: time, actor, namespace, action
//!    (`METHOD /route/{template}`), target (the route's first path parameter, or what the handler
//!    names with [`AuditTarget`]), status and request id (the client's `x-request-id` when it
//!    sends a sane one, else a fresh UUIDv7, echoed in the response). The handler runs inside an
//!    [`AuditScope`] holding the record with the route's success status ([`success_status`]), so
//!    the first store write of the request that changes something commits the record in its own
//!    transaction: no action without its record, and no second commit. Should the answer differ
//!    from what was written (another status, another target), the record is amended; a request
//!    whose writes changed nothing (a refusal, a duplicate) or that wrote through a path that
//!    does not carry scopes gets its record appended after the answer is known, as before.
//!
//! **The hook for new routes:** nothing to call. A new route is audited and authorized by its
//! method and path alone; a handler reads who is asking from the [`Actor`] request extension
//! (to record "who did it" in its own rows) and may name its target by inserting
//! [`AuditTarget`] into its response's extensions. Routes that only an admin may use are listed
//! in [`ADMIN_PREFIXES`]; the worker protocol's in [`requirement`].
//!
//! Tokens are cached for [`TOKEN_CACHE_MS`] on the engine's clock, so a token revoked on another
//! node is refused here within that time (and at once on the node that revoked it).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use sundial::{Sundial, Timestamp};
use sundial_core::TokenId;
use sundial_store::audit_scope::{AuditScope, AuditWrite};
use sundial_store::{AccessStore, Namespace, NewAuditRecord, Scope, TokenRecord};

use crate::error::ApiError;
use crate::guard;

/// When requests must carry a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMode {
    /// Never: every request acts as `local` (still audited). Only for loopback, or with the
    /// binary's explicit `--insecure-no-auth`.
    Off,
    /// Always (a server on a non-loopback address, or `--auth required`).
    Required,
    /// As soon as any token exists in the store (the loopback default).
    WhenTokensExist,
}

/// How the access layer behaves.
#[derive(Debug, Clone)]
pub struct AccessConfig {
    pub mode: AuthMode,
    /// `/metrics` without a token even when auth is on.
    pub open_metrics: bool,
    /// `/openapi.json` without a token even when auth is on.
    pub open_openapi: bool,
    /// Most long polls one caller (a token, or everyone when auth is off) may hold open at once;
    /// one more is `429` with `Retry-After`.
    pub max_polls_per_caller: usize,
    /// Longest a request may take to send its body; slower is `408`.
    pub body_read_timeout: std::time::Duration,
}

impl Default for AccessConfig {
    fn default() -> Self {
        AccessConfig {
            mode: AuthMode::WhenTokensExist,
            open_metrics: true,
            open_openapi: true,
            max_polls_per_caller: 64,
            body_read_timeout: std::time::Duration::from_secs(30),
        }
    }
}

/// How long a token read from the store is trusted before it is read again.
pub const TOKEN_CACHE_MS: i64 = 500;
/// How long "no token exists yet" is trusted (only for [`AuthMode::WhenTokensExist`]).
const NO_TOKENS_CACHE_MS: i64 = 500;
/// The prefix of every bearer token this server issues.
pub const TOKEN_PREFIX: &str = "sdl_";
/// The namespace of every request until namespaces are chosen per request.
pub const DEFAULT_NAMESPACE: &str = "default";

/// The push secret routes: a namespace's, but an admin's only.
pub const PUSH_SECRETS: &str = "/v1/push/secrets";

/// Routes (by template prefix) that only an admin may use, whatever the method.
pub const ADMIN_PREFIXES: &[&str] = &["/v1/tokens", "/v1/namespaces", "/v1/audit"];

/// Who is asking. Inserted into every routed request's extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Actor {
    /// Auth is off.
    Local,
    /// No valid token (only seen by the audit log: such a request is refused).
    Anonymous,
    Token {
        id: TokenId,
        name: String,
        scope: Scope,
        namespace: Option<String>,
    },
}

impl Actor {
    pub fn name(&self) -> &str {
        match self {
            Actor::Local => "local",
            Actor::Anonymous => "anonymous",
            Actor::Token { name, .. } => name,
        }
    }
    pub fn token_id(&self) -> Option<TokenId> {
        match self {
            Actor::Token { id, .. } => Some(*id),
            _ => None,
        }
    }
}

/// What a route asks of the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requirement {
    /// Anyone, auth or not (`/healthz`; `/metrics` and `/openapi.json` when configured open).
    Open,
    /// A token with this scope, or `admin`.
    Scope(Scope),
}

/// The rule for a route: admin routes; the worker protocols; other reads need `reader` (a
/// producer may read too); other writes need `producer`.
pub fn requirement(method: &Method, route: &str, config: &AccessConfig) -> Requirement {
    match route {
        "/healthz" => return Requirement::Open,
        "/metrics" if config.open_metrics => return Requirement::Open,
        "/openapi.json" if config.open_openapi => return Requirement::Open,
        _ => {}
    }
    // Push secrets sign a namespace's calls: an admin's (of the namespace, or of all).
    if ADMIN_PREFIXES.iter().any(|p| route.starts_with(p)) || route.starts_with(PUSH_SECRETS) {
        return Requirement::Scope(Scope::Admin);
    }
    let worker = route == "/v1/queues/{queue}/poll"
        || route.starts_with("/v1/workflow-tasks/")
        || route.starts_with("/v1/workflow-activities/")
        || (route.starts_with("/v1/tasks/{id}/")
            && ["heartbeat", "complete", "fail"]
                .iter()
                .any(|a| route.ends_with(&format!("/{a}"))));
    if worker {
        return Requirement::Scope(Scope::Worker);
    }
    if guard::is_mutating(method) {
        Requirement::Scope(Scope::Producer)
    } else {
        Requirement::Scope(Scope::Reader)
    }
}

/// How a route relates to namespaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scoping {
    /// Acts on one namespace's objects (every `/v1/…` route but the admin ones): a token bound
    /// to another namespace gets `404`, as for an object that does not exist.
    Namespaced,
    /// Acts on what all namespaces share (tokens, namespaces, the audit log): only a token bound
    /// to no namespace may use it (`403` otherwise).
    AllNamespaces,
    /// Not about stored objects (`/healthz`, `/metrics`, `/openapi.json`).
    Global,
}

/// The [`Scoping`] of a route template.
pub fn scoping(route: &str) -> Scoping {
    if ADMIN_PREFIXES.iter().any(|p| route.starts_with(p)) {
        Scoping::AllNamespaces
    } else if route.starts_with("/v1/") {
        Scoping::Namespaced
    } else {
        Scoping::Global
    }
}

/// Whether a token of `scope` meets `need`.
pub fn scope_allows(scope: Scope, need: Scope) -> bool {
    scope == Scope::Admin || scope == need || (scope == Scope::Producer && need == Scope::Reader)
}

/// The audit target a handler names for its request (a created object's id, a queue, a count
/// of a bulk action), inserted into the response's extensions. Without one, the route's first
/// path parameter is the target.
#[derive(Debug, Clone)]
pub struct AuditTarget(pub String);

/// A bearer token as handed to its owner: `sdl_` + the token id (32 hex digits) + the secret
/// (64 hex digits, 256 random bits).
pub struct IssuedToken {
    pub id: TokenId,
    pub secret_hash: [u8; 32],
    pub token: String,
}

impl IssuedToken {
    /// A fresh token (id and secret from the operating system's random source via `rand`).
    pub fn generate() -> IssuedToken {
        let id: [u8; 16] = rand::random();
        let secret: [u8; 32] = rand::random();
        let id = TokenId::from_bytes(id);
        IssuedToken {
            id,
            secret_hash: hash_secret(&secret),
            token: format!("{TOKEN_PREFIX}{}{}", hex(id.as_bytes()), hex(&secret)),
        }
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// SHA-256 of a token's secret: what the store keeps.
pub fn hash_secret(secret: &[u8]) -> [u8; 32] {
    Sha256::digest(secret).into()
}

/// Splits a bearer token into its id and secret; `None` when it is not one of ours.
pub fn parse_token(token: &str) -> Option<(TokenId, [u8; 32])> {
    let rest = token.strip_prefix(TOKEN_PREFIX)?;
    let id = unhex::<16>(rest.get(..32)?)?;
    let secret = unhex::<32>(rest.get(32..)?)?;
    Some((TokenId::from_bytes(id), secret))
}

/// Equality of two hashes in time independent of where they differ.
fn same_hash(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// The access layer's state: the store, the mode and its caches.
#[derive(Clone)]
pub struct Access {
    inner: Arc<AccessInner>,
}

struct AccessInner {
    sundial: Sundial,
    store: Option<Arc<dyn AccessStore>>,
    config: AccessConfig,
    tokens: Mutex<HashMap<TokenId, (Option<TokenRecord>, Timestamp)>>,
    /// `Some(t)`: no token existed when read at `t`. `None`: unknown, or tokens exist.
    tokens_exist: Mutex<TokensExist>,
    /// Namespaces as last read from the store (`None`: it did not exist), and when.
    namespaces: Mutex<HashMap<String, (Option<Namespace>, Timestamp)>>,
    polls: PollSlots,
}

/// Long polls in progress per caller (token id, or `local`), capped by
/// [`AccessConfig::max_polls_per_caller`]: one token cannot hold every connection the server has.
#[derive(Default)]
struct PollSlots {
    held: Mutex<HashMap<String, usize>>,
}

/// A poll slot; released when dropped (the poll answered, or its client went away).
struct PollSlot {
    slots: Arc<AccessInner>,
    caller: String,
}

impl Drop for PollSlot {
    fn drop(&mut self) {
        if let Ok(mut held) = self.slots.polls.held.lock()
            && let Some(n) = held.get_mut(&self.caller)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.caller);
            }
        }
    }
}

/// Whether a route template is a long poll.
pub fn is_long_poll(route: &str) -> bool {
    matches!(
        route,
        "/v1/queues/{queue}/poll" | "/v1/workflow-tasks/poll" | "/v1/workflow-activities/poll"
    )
}

#[derive(Clone, Copy)]
enum TokensExist {
    Unknown,
    NoneAt(Timestamp),
    Yes,
}

/// Why a request was refused before its handler.
enum Refusal {
    Unauthenticated(&'static str),
    Forbidden(Scope),
    OtherNamespace,
    /// A `/v1/namespaces/{ns}/…` path whose namespace does not exist, or whose route is not
    /// one of a namespace's (tokens, namespaces, the audit log, health).
    NoSuchNamespace,
    Unavailable(String),
}

impl Access {
    pub fn new(
        sundial: Sundial,
        store: Option<Arc<dyn AccessStore>>,
        config: AccessConfig,
    ) -> Self {
        Access {
            inner: Arc::new(AccessInner {
                sundial,
                store,
                config,
                tokens: Mutex::new(HashMap::new()),
                tokens_exist: Mutex::new(TokensExist::Unknown),
                namespaces: Mutex::new(HashMap::new()),
                polls: PollSlots::default(),
            }),
        }
    }

    pub fn store(&self) -> Option<&Arc<dyn AccessStore>> {
        self.inner.store.as_ref()
    }

    pub fn config(&self) -> &AccessConfig {
        &self.inner.config
    }

    pub fn now(&self) -> Timestamp {
        self.inner.sundial.clock().now()
    }

    /// Forgets what is cached about `id` (after a revocation on this node).
    pub fn forget_token(&self, id: TokenId) {
        if let Ok(mut t) = self.inner.tokens.lock() {
            t.remove(&id);
        }
    }

    /// Whether requests must carry a token now (for the web UI, which authenticates by its
    /// session cookie instead of an `Authorization` header). `Err` when the store cannot say.
    pub(crate) async fn auth_is_on(&self) -> Result<bool, String> {
        self.auth_on().await.map_err(refusal_reason)
    }

    /// The token `id` as stored (cached like every token lookup), for the web UI's session.
    pub(crate) async fn lookup_token(&self, id: TokenId) -> Result<Option<TokenRecord>, String> {
        self.token(id).await.map_err(refusal_reason)
    }

    /// The [`Actor`] a bearer token stands for, or why it is refused (the web UI's login).
    pub(crate) async fn actor_for_token(&self, token: &str) -> Result<Actor, String> {
        let Some((id, secret)) = parse_token(token.trim()) else {
            return Err("not a Sundial token".to_string());
        };
        match self.token(id).await.map_err(refusal_reason)? {
            Some(t) if same_hash(&t.secret_hash, &hash_secret(&secret)) => {
                if t.is_live_at(self.now()) {
                    Ok(Actor::Token {
                        id: t.id,
                        name: t.name,
                        scope: t.scope,
                        namespace: t.namespace,
                    })
                } else {
                    Err("the token is revoked or expired".to_string())
                }
            }
            _ => Err("unknown token".to_string()),
        }
    }

    /// The scope for a write that does not come through the access layer (the web UI's form
    /// posts), with the record it would write on success (`status`); run the action inside
    /// it ([`AuditScope::run`]) and then call [`Access::record_audit`] with the scope, so the
    /// action's own write commits the record. `None` without an access store.
    pub(crate) fn audit_scope(
        &self,
        actor: &Actor,
        action: String,
        target: Option<String>,
        status: u16,
        request_id: String,
    ) -> Option<AuditScope> {
        self.store()?;
        Some(AuditScope::new(NewAuditRecord {
            at: self.now(),
            actor_id: actor.token_id(),
            actor: actor.name().to_string(),
            namespace: DEFAULT_NAMESPACE.to_string(),
            action,
            target,
            status,
            request_id,
        }))
    }

    /// Makes sure a write that did not come through the access layer (the web UI's form posts)
    /// has one audit record: the one its action's write committed inside `scope` (amended to
    /// the answer), else one appended now. `action` is `METHOD /route/{template}`.
    pub(crate) async fn record_audit(
        &self,
        scope: Option<&AuditScope>,
        actor: &Actor,
        action: String,
        target: Option<String>,
        status: u16,
        request_id: String,
    ) {
        let Some(store) = self.store() else { return };
        if let Some(scope) = scope
            && settle_written(store.as_ref(), scope, status, target.clone()).await
        {
            return;
        }
        let record = NewAuditRecord {
            at: self.now(),
            actor_id: actor.token_id(),
            actor: actor.name().to_string(),
            namespace: DEFAULT_NAMESPACE.to_string(),
            action,
            target,
            status,
            request_id,
        };
        if let Err(e) = store.append_audit(vec![record]).await {
            tracing::error!(error = %e, "cannot write the audit record");
        }
    }

    /// A long-poll slot for `caller`, or `None` when it holds its limit already.
    fn poll_slot(&self, caller: &Actor) -> Option<PollSlot> {
        let caller = match caller.token_id() {
            Some(id) => id.to_string(),
            None => caller.name().to_string(),
        };
        let mut held = self.inner.polls.held.lock().ok()?;
        let n = held.entry(caller.clone()).or_insert(0);
        if *n >= self.inner.config.max_polls_per_caller {
            return None;
        }
        *n += 1;
        Some(PollSlot {
            slots: self.inner.clone(),
            caller,
        })
    }

    /// Notes that a token now exists (after a create on this node).
    pub fn note_token_created(&self) {
        if let Ok(mut e) = self.inner.tokens_exist.lock() {
            *e = TokensExist::Yes;
        }
    }

    async fn auth_on(&self) -> Result<bool, Refusal> {
        match self.inner.config.mode {
            AuthMode::Off => return Ok(false),
            AuthMode::Required => return Ok(true),
            AuthMode::WhenTokensExist => {}
        }
        let now = self.now();
        let cached = self
            .inner
            .tokens_exist
            .lock()
            .map(|e| *e)
            .unwrap_or(TokensExist::Unknown);
        match cached {
            TokensExist::Yes => return Ok(true),
            TokensExist::NoneAt(t) if now.0 - t.0 < NO_TOKENS_CACHE_MS => return Ok(false),
            _ => {}
        }
        let Some(store) = &self.inner.store else {
            return Ok(false);
        };
        let exist = store
            .any_tokens()
            .await
            .map_err(|e| Refusal::Unavailable(e.to_string()))?;
        if let Ok(mut e) = self.inner.tokens_exist.lock() {
            *e = if exist {
                TokensExist::Yes
            } else {
                TokensExist::NoneAt(now)
            };
        }
        Ok(exist)
    }

    async fn token(&self, id: TokenId) -> Result<Option<TokenRecord>, Refusal> {
        let now = self.now();
        if let Some((t, at)) = self
            .inner
            .tokens
            .lock()
            .ok()
            .and_then(|c| c.get(&id).cloned())
            && now.0 - at.0 < TOKEN_CACHE_MS
        {
            return Ok(t);
        }
        let Some(store) = &self.inner.store else {
            return Ok(None);
        };
        let t = store
            .get_token(id)
            .await
            .map_err(|e| Refusal::Unavailable(e.to_string()))?;
        if let Ok(mut c) = self.inner.tokens.lock() {
            if c.len() > 10_000 {
                c.clear();
            }
            c.insert(id, (t.clone(), now));
        }
        Ok(t)
    }

    /// `authorization`: the request's `Authorization` header, if it sent one.
    async fn authenticate(&self, authorization: Option<HeaderValue>) -> Result<Actor, Refusal> {
        if !self.auth_on().await? {
            return Ok(Actor::Local);
        }
        let Some(value) = authorization else {
            return Err(Refusal::Unauthenticated("a bearer token is required"));
        };
        let bearer = value
            .to_str()
            .ok()
            .and_then(|v| {
                let (scheme, rest) = v.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
            })
            .ok_or(Refusal::Unauthenticated(
                "the Authorization header must be `Bearer <token>`",
            ))?;
        let (id, secret) =
            parse_token(bearer).ok_or(Refusal::Unauthenticated("not a Sundial token"))?;
        let token = self.token(id).await?;
        let hash = hash_secret(&secret);
        match token {
            Some(t) if same_hash(&t.secret_hash, &hash) => {
                if t.is_live_at(self.now()) {
                    Ok(Actor::Token {
                        id: t.id,
                        name: t.name,
                        scope: t.scope,
                        namespace: t.namespace,
                    })
                } else {
                    Err(Refusal::Unauthenticated("the token is revoked or expired"))
                }
            }
            _ => Err(Refusal::Unauthenticated("unknown token")),
        }
    }

    /// The request's namespace, when it may be used: the default one always (it has no quotas);
    /// another only on a namespace's routes and when it exists (read again after
    /// [`TOKEN_CACHE_MS`], so a namespace added on another node is usable within a second).
    async fn namespace(&self, ns: &str, route: &str) -> Result<Option<Namespace>, Refusal> {
        if ns == DEFAULT_NAMESPACE {
            return Ok(None);
        }
        if scoping(route) != Scoping::Namespaced {
            return Err(Refusal::NoSuchNamespace);
        }
        let now = self.now();
        let cached = self
            .inner
            .namespaces
            .lock()
            .ok()
            .and_then(|c| c.get(ns).cloned());
        if let Some((known, at)) = cached
            && now.0 - at.0 < TOKEN_CACHE_MS
        {
            return known.map(Some).ok_or(Refusal::NoSuchNamespace);
        }
        let Some(store) = self.store() else {
            return Err(Refusal::NoSuchNamespace);
        };
        let read = store
            .get_namespace(ns)
            .await
            .map_err(|e| Refusal::Unavailable(e.to_string()))?;
        if let Ok(mut cache) = self.inner.namespaces.lock() {
            if cache.len() > 10_000 {
                cache.clear();
            }
            cache.insert(ns.to_string(), (read.clone(), now));
        }
        read.map(Some).ok_or(Refusal::NoSuchNamespace)
    }

    /// Whether namespace `ns` exists (`default` always does), as this node last read it.
    pub async fn namespace_exists(&self, ns: &str) -> bool {
        self.namespace(ns, "/v1/tasks").await.is_ok()
    }

    /// Drops what this node remembers of namespace `ns` (after it was added here), so that it
    /// is usable at once.
    pub fn forget_namespace(&self, ns: &str) {
        if let Ok(mut cache) = self.inner.namespaces.lock() {
            cache.remove(ns);
        }
    }

    fn authorize(
        &self,
        actor: &Actor,
        route: &str,
        need: Requirement,
        namespace: &str,
    ) -> Result<(), Refusal> {
        let Requirement::Scope(need) = need else {
            return Ok(());
        };
        let Actor::Token {
            scope,
            namespace: bound,
            ..
        } = actor
        else {
            // Local (auth off) may do everything; Anonymous never gets here.
            return Ok(());
        };
        if !scope_allows(*scope, need) {
            return Err(Refusal::Forbidden(need));
        }
        match (bound.as_deref(), scoping(route)) {
            (None, _) | (_, Scoping::Global) => Ok(()),
            // Tokens and namespaces are everyone's: a token of one namespace may not touch them.
            (Some(_), Scoping::AllNamespaces) => Err(Refusal::Forbidden(Scope::Admin)),
            (Some(b), Scoping::Namespaced) if b == namespace => Ok(()),
            (Some(_), Scoping::Namespaced) => Err(Refusal::OtherNamespace),
        }
    }
}

fn refusal_reason(r: Refusal) -> String {
    match r {
        Refusal::Unauthenticated(why) => why.to_string(),
        Refusal::Forbidden(need) => {
            format!("this token's scope does not allow this; it needs {need}")
        }
        Refusal::OtherNamespace => "no such object".to_string(),
        Refusal::NoSuchNamespace => "no such namespace".to_string(),
        Refusal::Unavailable(e) => format!("cannot read tokens: {e}"),
    }
}

fn refusal_response(r: Refusal) -> Response {
    match r {
        Refusal::Unauthenticated(why) => {
            let mut resp =
                ApiError::new(StatusCode::UNAUTHORIZED, "unauthenticated", why).into_response();
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"sundial\""),
            );
            resp
        }
        Refusal::Forbidden(need) => ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("this token's scope does not allow this; it needs {need} (or admin)"),
        )
        .into_response(),
        Refusal::OtherNamespace => ApiError::not_found("no such object").into_response(),
        Refusal::NoSuchNamespace => ApiError::not_found("no such namespace").into_response(),
        Refusal::Unavailable(e) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            format!("cannot read tokens: {e}"),
        )
        .into_response(),
    }
}

/// The value of the route's first path parameter in `path`, if the template has one.
fn first_param(template: &str, path: &str) -> Option<String> {
    template
        .split('/')
        .zip(path.split('/'))
        .find(|(t, _)| t.starts_with('{') && t.ends_with('}'))
        .map(|(_, v)| v.to_string())
}

fn request_id(req: &Request) -> String {
    req.headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_string)
        .unwrap_or_else(|| uuid::Uuid::now_v7().to_string())
}

/// The status a route answers when it succeeds: `201` for a route that documents it (a create
/// whose repeat answers `200`, as `POST /v1/tasks`, creates far more often than it repeats),
/// else its lowest documented `2xx`; `200` for a route the document does not describe. What a
/// request's audit record says when the request's own write carries it; an answer that differs
/// costs the request a second write (the amend), so this is the usual answer.
pub fn success_status(method: &Method, route: &str) -> u16 {
    type Statuses = HashMap<(String, String), u16>;
    static STATUSES: std::sync::OnceLock<Statuses> = std::sync::OnceLock::new();
    let statuses = STATUSES.get_or_init(|| {
        let mut out = HashMap::new();
        for (path, item) in crate::openapi().paths.paths {
            for (op, m) in [
                (&item.post, Method::POST),
                (&item.put, Method::PUT),
                (&item.patch, Method::PATCH),
                (&item.delete, Method::DELETE),
            ] {
                let Some(op) = op else { continue };
                let documented: Vec<u16> = op
                    .responses
                    .responses
                    .keys()
                    .filter_map(|k| k.parse::<u16>().ok())
                    .filter(|c| (200..300).contains(c))
                    .collect();
                let usual = if documented.contains(&201) {
                    Some(201)
                } else {
                    documented.iter().copied().min()
                };
                if let Some(code) = usual {
                    out.insert((m.as_str().to_string(), path.clone()), code);
                }
            }
        }
        out
    });
    statuses
        .get(&(method.as_str().to_string(), route.to_string()))
        .copied()
        .unwrap_or(200)
}

/// The middleware (installed with `route_layer`, so the route's template is known).
/// The methods a route template of the OpenAPI document has (`HEAD` wherever `GET` is), or
/// `None` for a route the document does not describe.
pub fn allowed_methods(route: &str) -> Option<&'static [Method]> {
    static ROUTES: std::sync::OnceLock<HashMap<String, Vec<Method>>> = std::sync::OnceLock::new();
    let routes = ROUTES.get_or_init(|| {
        let mut routes = HashMap::new();
        for (path, item) in crate::openapi().paths.paths {
            let mut methods = Vec::new();
            if item.get.is_some() {
                methods.extend([Method::GET, Method::HEAD]);
            }
            for (op, m) in [
                (&item.post, Method::POST),
                (&item.put, Method::PUT),
                (&item.patch, Method::PATCH),
                (&item.delete, Method::DELETE),
            ] {
                if op.is_some() {
                    methods.push(m);
                }
            }
            routes.insert(path, methods);
        }
        routes
    });
    routes.get(route).map(Vec::as_slice)
}

fn method_not_allowed(allowed: &[Method]) -> Response {
    let allow = allowed
        .iter()
        .map(Method::as_str)
        .collect::<Vec<_>>()
        .join(",");
    let mut resp = ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method not allowed on this route",
    )
    .into_response();
    if let Ok(v) = HeaderValue::from_str(&allow) {
        resp.headers_mut().insert(header::ALLOW, v);
    }
    resp
}

pub async fn access_layer(State(access): State<Access>, mut req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string())
        .unwrap_or_else(|| req.uri().path().to_string());
    let path = req.uri().path().to_string();
    let rid = request_id(&req);
    let namespace = crate::namespace::Ns::of(req.extensions()).0;
    let audited = guard::is_mutating(&method);

    let mut actor = Actor::Anonymous;
    let mut scope_written: Option<AuditScope> = None;
    // A method the route does not have is `405` with `Allow`, before anything else: the
    // cross-site guard would otherwise answer a bodiless `TRACE` with `415`.
    if let Some(allowed) = allowed_methods(&route)
        && !allowed.contains(&method)
    {
        return method_not_allowed(allowed);
    }
    let need = requirement(&method, &route, access.config());
    let resp = if let Some(err) = guard::cross_site_refusal(&req) {
        err.into_response()
    } else {
        let authenticated = match need {
            Requirement::Open => Ok(Actor::Local),
            Requirement::Scope(_) => {
                let authorization = req.headers().get(header::AUTHORIZATION).cloned();
                access.authenticate(authorization).await
            }
        };
        match authenticated {
            Err(r) => refusal_response(r),
            Ok(a) => {
                actor = a.clone();
                let allowed = match access.authorize(&a, &route, need, &namespace) {
                    Ok(()) => access.namespace(&namespace, &route).await,
                    Err(r) => Err(r),
                };
                match allowed {
                    Err(r) => refusal_response(r),
                    Ok(quota) => {
                        if let Some(q) = quota {
                            req.extensions_mut().insert(crate::quota::NamespaceQuota(q));
                        }
                        let slot = if is_long_poll(&route) {
                            match access.poll_slot(&a) {
                                Some(s) => Some(s),
                                None => {
                                    return finish(
                                        &access,
                                        too_many_polls(access.config().max_polls_per_caller),
                                        Finish {
                                            audited,
                                            actor: a,
                                            namespace,
                                            method,
                                            route,
                                            path,
                                            rid,
                                            scope: None,
                                        },
                                    )
                                    .await;
                                }
                            }
                        } else {
                            None
                        };
                        req.extensions_mut().insert(a.clone());
                        req.extensions_mut().insert(crate::extract::BodyReadTimeout(
                            access.config().body_read_timeout,
                        ));
                        // The record the request's own write carries (see
                        // `sundial_store::audit_scope`): the route's success status, amended
                        // in `finish` should the answer differ.
                        let resp = if audited && access.store().is_some() {
                            let scope = AuditScope::new(NewAuditRecord {
                                at: access.now(),
                                actor_id: a.token_id(),
                                actor: a.name().to_string(),
                                namespace: namespace.clone(),
                                action: format!("{method} {route}"),
                                target: first_param(&route, &path),
                                status: success_status(&method, &route),
                                request_id: rid.clone(),
                            });
                            let resp = scope.run(next.run(req)).await;
                            scope_written = Some(scope);
                            resp
                        } else {
                            next.run(req).await
                        };
                        drop(slot);
                        resp
                    }
                }
            }
        }
    };
    finish(
        &access,
        resp,
        Finish {
            audited,
            actor,
            namespace,
            method,
            route,
            path,
            rid,
            scope: scope_written,
        },
    )
    .await
}

/// What the audit record of a request needs besides its answer.
struct Finish {
    audited: bool,
    actor: Actor,
    namespace: String,
    method: Method,
    route: String,
    path: String,
    rid: String,
    /// The scope the handler ran in, when it had one.
    scope: Option<AuditScope>,
}

/// Echoes the request id and makes sure a write has its audit record: written with the
/// request's own write (amended when the answer differs from what was written), else now.
async fn finish(access: &Access, mut resp: Response, f: Finish) -> Response {
    let Finish {
        audited,
        actor,
        namespace,
        method,
        route,
        path,
        rid,
        scope,
    } = f;
    if let Ok(v) = HeaderValue::from_str(&rid) {
        resp.headers_mut().insert("x-request-id", v);
    }
    if audited && let Some(store) = access.store() {
        let target = resp
            .extensions()
            .get::<AuditTarget>()
            .map(|t| t.0.clone())
            .or_else(|| first_param(&route, &path));
        let status = resp.status().as_u16();
        if let Some(scope) = scope
            && settle_written(store.as_ref(), &scope, status, target.clone()).await
        {
            return resp;
        }
        let record = NewAuditRecord {
            at: access.now(),
            actor_id: actor.token_id(),
            actor: actor.name().to_string(),
            namespace,
            action: format!("{method} {route}"),
            target,
            status,
            request_id: rid,
        };
        if let Err(e) = store.append_audit(vec![record]).await {
            tracing::error!(error = %e, "cannot write the audit record");
        }
    }
    resp
}

/// When a write of the request committed `scope`'s record: amends it to the answer's status and
/// target if they differ from what was written, and says `true`. `false`: no write carried it,
/// and the caller must append the record itself.
async fn settle_written(
    store: &dyn AccessStore,
    scope: &AuditScope,
    status: u16,
    target: Option<String>,
) -> bool {
    let AuditWrite::Written { seq } = scope.write() else {
        return false;
    };
    let written = scope.record();
    if (written.status != status || written.target != target)
        && let Err(e) = store.amend_audit(seq, status, target).await
    {
        tracing::error!(error = %e, "cannot amend the audit record");
    }
    true
}

fn too_many_polls(limit: usize) -> Response {
    let mut resp = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "too_many_polls",
        format!("this caller holds {limit} long polls already; wait for one to answer"),
    )
    .into_response();
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    resp
}

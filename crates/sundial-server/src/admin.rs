//! The admin routes: tokens, namespaces and the audit log (scope `admin`, see [`crate::access`]).
//!
//! ```text
//! POST /v1/tokens               create a token; the answer carries the token, once   201 | 422
//! GET  /v1/tokens               every token (never a secret)                          200
//! POST /v1/tokens/{id}/revoke   refused on every node within a second                 200 | 404
//! POST /v1/namespaces           add a namespace with optional quotas                  201 | 409 422
//! GET  /v1/namespaces           every namespace                                       200
//! GET  /v1/audit?namespace=&actor=&action=&target=&limit=&cursor=   newest first      200 | 422
//! ```

use axum::Json;
use axum::Router;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use sundial::Timestamp;
use sundial_core::TokenId;
use sundial_store::{
    AccessStore, AuditFilter, AuditRecord, Namespace, NamespaceError, NewToken, Scope, TokenRecord,
};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::access::{Access, AuditTarget, IssuedToken};
use crate::error::{ApiError, ErrorBody};
use crate::extract::{ApiJson, ApiQuery};
use crate::{duration, time};

fn api() -> OpenApiRouter<Access> {
    OpenApiRouter::new()
        .routes(routes!(create_token, list_tokens))
        .routes(routes!(revoke_token))
        .routes(routes!(create_namespace, list_namespaces))
        .routes(routes!(list_audit))
}

/// The admin routes with their state. Merged into [`crate::router`].
pub fn router(access: Access, body_limit: usize) -> Router {
    let (router, _) = api().split_for_parts();
    router
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(access)
}

/// The OpenAPI description of the admin routes.
pub fn openapi() -> utoipa::openapi::OpenApi {
    api().into_openapi()
}

// ---- Wire types ---------------------------------------------------------------------------------

/// A new token.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// A name for people and the audit log (1 to 128 bytes).
    pub name: String,
    /// `admin`, `producer`, `worker` or `reader`.
    pub scope: String,
    /// The one namespace the token may use; omitted: every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// How long the token lasts (`"90d"`, at most `"36500d"`); omitted: until revoked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in: Option<String>,
}

/// A token as listed (never its secret).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct TokenView {
    pub id: uuid::Uuid,
    pub name: String,
    pub scope: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<String>,
}

impl From<TokenRecord> for TokenView {
    fn from(t: TokenRecord) -> Self {
        TokenView {
            id: t.id.0,
            name: t.name,
            scope: t.scope.as_str().to_string(),
            namespace: t.namespace,
            created_at: time::format(t.created_at),
            expires_at: t.expires_at.map(time::format),
            revoked_at: t.revoked_at.map(time::format),
        }
    }
}

/// A created token: the only answer that ever carries the bearer token.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CreatedToken {
    /// `Authorization: Bearer <token>`. Shown once; the server keeps only a hash.
    pub token: String,
    #[serde(flatten)]
    pub view: TokenView,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenList {
    pub tokens: Vec<TokenView>,
}

/// A namespace and its quotas.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NamespaceWire {
    /// 1 to 63 bytes of lower-case letters, digits, `-` and `_`, starting with a letter.
    pub name: String,
    /// Most live (unfinished) tasks at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_live_tasks: Option<u64>,
    /// Most creates per second; over it: `429` with `Retry-After`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_creates_per_second: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NamespaceList {
    pub namespaces: Vec<NamespaceWire>,
}

/// Audit query parameters; each one given must match exactly.
#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    pub namespace: Option<String>,
    /// A token's name or id, `local` or `anonymous`.
    pub actor: Option<String>,
    /// `METHOD /route/{template}`, e.g. `POST /v1/tasks/{id}/cancel`.
    pub action: Option<String>,
    pub target: Option<String>,
    /// 1 to 1000 (default 100).
    pub limit: Option<usize>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// One audited request.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct AuditView {
    pub seq: i64,
    pub at: String,
    /// The token's name, `local` (auth off) or `anonymous` (no valid token).
    pub actor: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor_id: Option<uuid::Uuid>,
    pub namespace: String,
    pub action: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// The answer's HTTP status (refusals included).
    pub status: u16,
    pub request_id: String,
}

impl From<AuditRecord> for AuditView {
    fn from(a: AuditRecord) -> Self {
        let r = a.record;
        AuditView {
            seq: a.seq,
            at: time::format(r.at),
            actor: r.actor,
            actor_id: r.actor_id.map(|i| i.0),
            namespace: r.namespace,
            action: r.action,
            target: r.target,
            status: r.status,
            request_id: r.request_id,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AuditList {
    pub records: Vec<AuditView>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

// ---- Validation -----------------------------------------------------------------------------

/// Namespace names: 1 to 63 bytes of `[a-z0-9_-]`, starting with a letter.
pub fn check_namespace_name(name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.as_bytes()[0].is_ascii_lowercase()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(
            "namespace",
            format!(
                "{name:?}: a namespace is 1 to 63 lower-case letters, digits, - and _, starting with a letter"
            ),
        ))
    }
}

fn store(access: &Access) -> Result<&std::sync::Arc<dyn AccessStore>, ApiError> {
    access.store().ok_or_else(|| {
        ApiError::not_found("this server has no token store (tokens and audit are unavailable)")
    })
}

fn store_error(e: sundial_store::StoreError) -> ApiError {
    ApiError::from(sundial::Error::Store(e))
}

/// Builds the token to store from a request, validating everything first.
pub fn new_token(body: CreateToken, now: Timestamp) -> Result<(NewToken, IssuedToken), ApiError> {
    if body.name.is_empty() || body.name.len() > 128 || body.name.chars().any(char::is_control) {
        return Err(ApiError::invalid(
            "name",
            "name must be 1 to 128 bytes without control characters",
        ));
    }
    let scope = Scope::parse(&body.scope).ok_or_else(|| {
        ApiError::invalid("scope", "scope must be admin, producer, worker or reader")
    })?;
    if let Some(ns) = &body.namespace {
        check_namespace_name(ns)?;
    }
    let expires_at = match &body.expires_in {
        None => None,
        Some(d) => {
            let d = duration::parse_validity(d)
                .map_err(|e| ApiError::invalid("expires_in", format!("expires_in: {e}")))?;
            let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
            Some(Timestamp(now.0.saturating_add(ms)))
        }
    };
    let issued = IssuedToken::generate();
    Ok((
        NewToken {
            id: issued.id,
            name: body.name,
            scope,
            namespace: body.namespace,
            secret_hash: issued.secret_hash,
            created_at: now,
            expires_at,
        },
        issued,
    ))
}

// ---- Handlers -------------------------------------------------------------------------------

/// Create a token. The answer carries the bearer token; it is never shown again.
#[utoipa::path(
    post, path = "/v1/tokens", tag = "admin",
    request_body = CreateToken,
    responses(
        (status = 201, description = "Created; `token` is shown only here", body = CreatedToken),
        (status = 422, description = "Invalid", body = ErrorBody),
    )
)]
pub async fn create_token(
    State(access): State<Access>,
    ApiJson(body): ApiJson<CreateToken>,
) -> Result<Response, ApiError> {
    let store = store(&access)?;
    let (token, issued) = new_token(body, access.now())?;
    // Named before the write, so the record that commits with it is final.
    sundial_store::audit_scope::name_target(issued.id.to_string());
    let record = store.create_token(token).await.map_err(store_error)?;
    access.note_token_created();
    let mut resp = (
        StatusCode::CREATED,
        Json(CreatedToken {
            token: issued.token,
            view: TokenView::from(record),
        }),
    )
        .into_response();
    resp.extensions_mut()
        .insert(AuditTarget(issued.id.to_string()));
    Ok(resp)
}

/// Every token, revoked and expired ones included (never a secret).
#[utoipa::path(
    get, path = "/v1/tokens", tag = "admin",
    responses((status = 200, description = "Oldest first", body = TokenList))
)]
pub async fn list_tokens(State(access): State<Access>) -> Result<Json<TokenList>, ApiError> {
    let tokens = store(&access)?
        .list_tokens()
        .await
        .map_err(store_error)?
        .into_iter()
        .map(TokenView::from)
        .collect();
    Ok(Json(TokenList { tokens }))
}

/// Revoke a token: refused here at once and on every other node within a second.
#[utoipa::path(
    post, path = "/v1/tokens/{id}/revoke", tag = "admin",
    params(("id" = uuid::Uuid, Path, description = "Token id")),
    responses(
        (status = 200, description = "Revoked (a second revocation keeps the first time)", body = TokenView),
        (status = 404, description = "No such token", body = ErrorBody),
    )
)]
pub async fn revoke_token(
    State(access): State<Access>,
    Path(id): Path<String>,
) -> Result<Json<TokenView>, ApiError> {
    let id: TokenId = id
        .parse()
        .map_err(|_| ApiError::not_found("no such token"))?;
    let revoked = store(&access)?
        .revoke_token(id, access.now())
        .await
        .map_err(store_error)?
        .ok_or_else(|| ApiError::not_found("no such token"))?;
    access.forget_token(id);
    Ok(Json(TokenView::from(revoked)))
}

/// Add a namespace.
#[utoipa::path(
    post, path = "/v1/namespaces", tag = "admin",
    request_body = NamespaceWire,
    responses(
        (status = 201, description = "Created", body = NamespaceWire),
        (status = 409, description = "It exists", body = ErrorBody),
        (status = 422, description = "Invalid name or quota", body = ErrorBody),
    )
)]
pub async fn create_namespace(
    State(access): State<Access>,
    ApiJson(body): ApiJson<NamespaceWire>,
) -> Result<Response, ApiError> {
    check_namespace_name(&body.name)?;
    if body.name == crate::access::DEFAULT_NAMESPACE {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "exists",
            "the default namespace always exists",
        ));
    }
    if body.max_creates_per_second == Some(0) {
        return Err(ApiError::invalid(
            "max_creates_per_second",
            "max_creates_per_second must be at least 1 when given",
        ));
    }
    sundial_store::audit_scope::name_target(body.name.clone());
    let ns = store(&access)?
        .create_namespace(Namespace {
            name: body.name.clone(),
            max_live_tasks: body.max_live_tasks,
            max_creates_per_second: body.max_creates_per_second,
            created_at: access.now(),
        })
        .await
        .map_err(|e| match e {
            NamespaceError::AlreadyExists => ApiError::new(
                StatusCode::CONFLICT,
                "exists",
                format!("namespace {:?} exists", body.name),
            ),
            NamespaceError::Store(e) => store_error(e),
            other => store_error(sundial::StoreError::backend(other)),
        })?;
    access.forget_namespace(&ns.name);
    let mut resp = (
        StatusCode::CREATED,
        Json(NamespaceWire {
            name: ns.name.clone(),
            max_live_tasks: ns.max_live_tasks,
            max_creates_per_second: ns.max_creates_per_second,
        }),
    )
        .into_response();
    resp.extensions_mut().insert(AuditTarget(ns.name));
    Ok(resp)
}

/// Every namespace (`default` first; it always exists and has no quotas).
#[utoipa::path(
    get, path = "/v1/namespaces", tag = "admin",
    responses((status = 200, description = "By name", body = NamespaceList))
)]
pub async fn list_namespaces(
    State(access): State<Access>,
) -> Result<Json<NamespaceList>, ApiError> {
    let mut namespaces = vec![NamespaceWire {
        name: crate::access::DEFAULT_NAMESPACE.to_string(),
        max_live_tasks: None,
        max_creates_per_second: None,
    }];
    if let Some(store) = access.store() {
        namespaces.extend(
            store
                .list_namespaces()
                .await
                .map_err(store_error)?
                .into_iter()
                .map(|n| NamespaceWire {
                    name: n.name,
                    max_live_tasks: n.max_live_tasks,
                    max_creates_per_second: n.max_creates_per_second,
                }),
        );
    }
    Ok(Json(NamespaceList { namespaces }))
}

/// The audit log, newest first: one record per write, refusals included.
#[utoipa::path(
    get, path = "/v1/audit", tag = "admin",
    params(AuditQuery),
    responses(
        (status = 200, description = "A page of records", body = AuditList),
        (status = 422, description = "Bad parameter", body = ErrorBody),
    )
)]
pub async fn list_audit(
    State(access): State<Access>,
    ApiQuery(q): ApiQuery<AuditQuery>,
) -> Result<Json<AuditList>, ApiError> {
    let limit = q.limit.unwrap_or(100);
    if !(1..=1_000).contains(&limit) {
        return Err(ApiError::invalid(
            "limit",
            "limit must be between 1 and 1000",
        ));
    }
    let before = match q.cursor.as_deref() {
        None => None,
        Some(c) => Some(
            c.parse::<i64>()
                .map_err(|_| ApiError::invalid("cursor", "not a cursor from a previous page"))?,
        ),
    };
    let page = store(&access)?
        .list_audit(
            &AuditFilter {
                namespace: q.namespace,
                actor: q.actor,
                action: q.action,
                target: q.target,
                before,
            },
            limit,
        )
        .await
        .map_err(store_error)?;
    Ok(Json(AuditList {
        records: page.records.into_iter().map(AuditView::from).collect(),
        next_cursor: page.next_cursor.map(|c| c.to_string()),
    }))
}

//! The push delivery routes: the signing secrets (an administrator's business).
//!
//! Secrets are per namespace: under `/v1/namespaces/{ns}/push/secrets…` the routes act on
//! namespace `ns`'s secrets, which sign the push calls of that namespace's tasks only; the
//! unprefixed paths are the default namespace's. Another namespace's secret id is `404`.
//!
//! ```text
//! GET    /v1/push/secrets             every secret (masked), oldest first, with whether it signs
//! POST   /v1/push/secrets             add one (given, or generated); shown once in full   201 | 422
//! POST   /v1/push/secrets:rotate      add one, the others stop signing after `overlap`    201 | 422
//! DELETE /v1/push/secrets/{id}        stop one signing now                                200 | 404
//! ```

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::response::Json;
use serde::{Deserialize, Serialize};
use sundial_push::{PushExecutor, SecretAddError};
use sundial_store::PushSecret;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{ApiError, ErrorBody};
use crate::extract::ApiJson;
use crate::namespace::Ns;
use crate::{duration, time};

/// How long the previous secrets keep signing after a rotation when no overlap is given.
pub const DEFAULT_ROTATION_OVERLAP: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

fn api() -> OpenApiRouter<Arc<PushExecutor>> {
    OpenApiRouter::new()
        .routes(routes!(list_secrets, add_secret))
        .routes(routes!(rotate_secret))
        .routes(routes!(revoke_secret))
}

/// The push routes, with their own state. Merged into [`crate::router`].
pub fn router(exec: Arc<PushExecutor>, body_limit: usize) -> Router {
    let (router, _) = api().split_for_parts();
    router
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(exec)
}

/// The OpenAPI description of the push routes (merged into `/openapi.json`).
pub fn openapi() -> utoipa::openapi::OpenApi {
    api().into_openapi()
}

/// A signing secret. `secret` is in full only in the answer that created it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct SecretView {
    pub id: String,
    /// `whsec_…`: in full when just created, otherwise its first characters and `…`.
    pub secret: String,
    #[schema(format = DateTime)]
    pub created_at: String,
    /// When it stops signing (none: until rotated or revoked).
    #[schema(format = DateTime)]
    pub expires_at: Option<String>,
    /// Whether calls are signed with it now.
    pub active: bool,
}

impl SecretView {
    fn new(s: PushSecret, active: bool, full: bool) -> Self {
        let secret = if full {
            s.secret
        } else {
            let shown: String = s.secret.chars().take(10).collect();
            format!("{shown}…")
        };
        SecretView {
            id: s.id,
            secret,
            created_at: time::format(s.created_at),
            expires_at: s.expires_at.map(time::format),
            active,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct SecretList {
    pub secrets: Vec<SecretView>,
}

/// A secret to add; omit `secret` to have one generated.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AddSecret {
    /// `whsec_` and the base64 of 24 to 64 random bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

/// A rotation: a new secret, and how long the current ones keep signing beside it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RotateSecret {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// Default `"24h"`; `"0s"` stops the old secrets at once; at most `"36500d"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "24h")]
    pub overlap: Option<String>,
}

fn add_error(e: SecretAddError) -> ApiError {
    match e {
        SecretAddError::Invalid(e) => ApiError::invalid("secret", e.to_string()),
        SecretAddError::Store(e) => sundial::Error::Store(e).into(),
    }
}

#[utoipa::path(
    get, path = "/v1/push/secrets", tag = "push",
    operation_id = "list_push_secrets",
    responses((status = 200, description = "Every secret, masked, oldest first", body = SecretList))
)]
pub async fn list_secrets(
    State(exec): State<Arc<PushExecutor>>,
    ns: Ns,
) -> Result<Json<SecretList>, ApiError> {
    let secrets = exec
        .secrets(ns.name())
        .await
        .map_err(|e| ApiError::from(sundial::Error::Store(e)))?
        .into_iter()
        .map(|(s, active)| SecretView::new(s, active, false))
        .collect();
    Ok(Json(SecretList { secrets }))
}

#[utoipa::path(
    post, path = "/v1/push/secrets", tag = "push",
    operation_id = "add_push_secret",
    request_body = AddSecret,
    responses(
        (status = 201, description = "Added; the secret in full, this once", body = SecretView),
        (status = 422, description = "Not a valid whsec_ secret; nothing stored", body = ErrorBody),
    )
)]
pub async fn add_secret(
    State(exec): State<Arc<PushExecutor>>,
    ns: Ns,
    ApiJson(req): ApiJson<AddSecret>,
) -> Result<(StatusCode, Json<SecretView>), ApiError> {
    let s = exec
        .add_secret(ns.name(), req.secret, None)
        .await
        .map_err(add_error)?;
    Ok((StatusCode::CREATED, Json(SecretView::new(s, true, true))))
}

#[utoipa::path(
    post, path = "/v1/push/secrets:rotate", tag = "push",
    operation_id = "rotate_push_secret",
    request_body = RotateSecret,
    responses(
        (status = 201, description = "The new secret in full, this once; the others stop signing after the overlap", body = SecretView),
        (status = 422, description = "Bad secret or overlap; nothing stored", body = ErrorBody),
    )
)]
pub async fn rotate_secret(
    State(exec): State<Arc<PushExecutor>>,
    ns: Ns,
    ApiJson(req): ApiJson<RotateSecret>,
) -> Result<(StatusCode, Json<SecretView>), ApiError> {
    let overlap = match req.overlap {
        Some(o) => duration::parse_validity(&o)
            .map_err(|e| ApiError::invalid("overlap", format!("overlap: {e}")))?,
        None => DEFAULT_ROTATION_OVERLAP,
    };
    let s = exec
        .add_secret(ns.name(), req.secret, Some(overlap))
        .await
        .map_err(add_error)?;
    Ok((StatusCode::CREATED, Json(SecretView::new(s, true, true))))
}

#[utoipa::path(
    delete, path = "/v1/push/secrets/{id}", tag = "push",
    operation_id = "revoke_push_secret",
    params(("id" = String, Path, description = "Secret id")),
    responses(
        (status = 200, description = "It no longer signs", body = SecretList),
        (status = 404, description = "No such secret", body = ErrorBody),
    )
)]
pub async fn revoke_secret(
    State(exec): State<Arc<PushExecutor>>,
    ns: Ns,
    Path(id): Path<String>,
) -> Result<Json<SecretList>, ApiError> {
    let found = exec
        .revoke_secret(ns.name(), &id)
        .await
        .map_err(|e| ApiError::from(sundial::Error::Store(e)))?;
    if !found {
        return Err(ApiError::not_found(format!("no push secret {id}")));
    }
    list_secrets(State(exec), ns).await
}

//! The access storage seam: API tokens, namespaces and the audit log ([`AccessStore`]), separate
//! from [`crate::Store`] like schedules and workflows (conformance:
//! [`crate::access_store_conformance!`]).
//!
//! - **Tokens.** A token row holds the token's id, name, scope, namespace (or all), expiry and
//!   revocation, and the SHA-256 of its secret, never the secret itself. Revocation is a
//!   timestamp: a revoked token stays listed (and keeps auth on) but is refused.
//! - **Namespaces.** A name with optional quotas; `default` always exists and is not stored.
//! - **Audit log.** One record per mutating request, numbered by the store in commit order
//!   (`seq`), read newest first with a `seq` cursor, purged by age.
//!
//! Hashing, token format and the decision who may do what live in the server; the store only
//! keeps rows. **Architecture Invariant:** as everywhere, time is a parameter.

use async_trait::async_trait;
use sundial_core::{Timestamp, TokenId};

use crate::StoreError;

/// What a token may do. `Admin` may do everything; the others are disjoint sets of routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// Everything, including tokens, namespaces and the audit log.
    Admin,
    /// Create, read, cancel and trigger tasks, schedules and workflows.
    Producer,
    /// The worker protocols: poll, heartbeat, complete, fail (tasks and workflows).
    Worker,
    /// Reads only.
    Reader,
}

impl Scope {
    pub const ALL: [Scope; 4] = [Scope::Admin, Scope::Producer, Scope::Worker, Scope::Reader];

    pub fn as_str(&self) -> &'static str {
        match self {
            Scope::Admin => "admin",
            Scope::Producer => "producer",
            Scope::Worker => "worker",
            Scope::Reader => "reader",
        }
    }

    pub fn parse(s: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A token to store. `secret_hash` is the SHA-256 of the secret part of the bearer token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewToken {
    pub id: TokenId,
    pub name: String,
    pub scope: Scope,
    /// `None`: every namespace.
    pub namespace: Option<String>,
    pub secret_hash: [u8; 32],
    pub created_at: Timestamp,
    pub expires_at: Option<Timestamp>,
}

/// A stored token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRecord {
    pub id: TokenId,
    pub name: String,
    pub scope: Scope,
    pub namespace: Option<String>,
    pub secret_hash: [u8; 32],
    pub created_at: Timestamp,
    pub expires_at: Option<Timestamp>,
    pub revoked_at: Option<Timestamp>,
}

impl TokenRecord {
    /// Neither revoked nor expired at `now`.
    pub fn is_live_at(&self, now: Timestamp) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|e| now < e)
    }
}

/// A namespace and its quotas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace {
    pub name: String,
    /// Most live (not finished) tasks at once.
    pub max_live_tasks: Option<u64>,
    /// Most creates per second.
    pub max_creates_per_second: Option<u32>,
    pub created_at: Timestamp,
}

/// One audited request, as the server hands it in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAuditRecord {
    pub at: Timestamp,
    /// The token that made the request; `None` when auth is off or no valid token was given.
    pub actor_id: Option<TokenId>,
    /// The token's name, `local` (auth off) or `anonymous` (no valid token).
    pub actor: String,
    pub namespace: String,
    /// What was asked, e.g. `POST /v1/tasks/{id}/cancel`.
    pub action: String,
    /// The object acted on, when there is one (a task, schedule or workflow id, a queue).
    pub target: Option<String>,
    /// The HTTP status of the answer.
    pub status: u16,
    pub request_id: String,
}

/// A stored audit record: what was handed in and its number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRecord {
    /// Assigned by the store, increasing in commit order.
    pub seq: i64,
    pub record: NewAuditRecord,
}

/// Which audit records to read. Every field set must match exactly.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditFilter {
    pub namespace: Option<String>,
    /// Matches the actor's name or its token id (as text).
    pub actor: Option<String>,
    pub action: Option<String>,
    pub target: Option<String>,
    /// Only records with `seq` below this (the cursor of the previous page).
    pub before: Option<i64>,
}

/// A page of audit records, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditPage {
    pub records: Vec<AuditRecord>,
    /// Pass as [`AuditFilter::before`] for the next page; `None` on the last page.
    pub next_cursor: Option<i64>,
}

impl AuditPage {
    /// A page from up to `limit + 1` records read newest first: one more than `limit` means
    /// there is a next page.
    pub fn from_overfetched(mut records: Vec<AuditRecord>, limit: usize) -> AuditPage {
        let next_cursor = if records.len() > limit {
            records.truncate(limit);
            records.last().map(|r| r.seq)
        } else {
            None
        };
        AuditPage {
            records,
            next_cursor,
        }
    }
}

/// What a namespace operation can fail with.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum NamespaceError {
    #[error("the namespace already exists")]
    AlreadyExists,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Tokens, namespaces and the audit log.
#[async_trait]
pub trait AccessStore: Send + Sync + 'static {
    /// Stores a new token. Ids are unique; a repeated id is a backend error.
    async fn create_token(&self, token: NewToken) -> Result<TokenRecord, StoreError>;

    /// Stores `token` only when the store holds no token at all (revoked ones count), as one
    /// atomic step: of concurrent calls (nodes starting together on one database) at most one
    /// stores its token. `None`: a token existed, nothing was stored.
    async fn create_first_token(&self, token: NewToken) -> Result<Option<TokenRecord>, StoreError>;

    async fn get_token(&self, id: TokenId) -> Result<Option<TokenRecord>, StoreError>;

    /// Every token, revoked and expired ones included, oldest first.
    async fn list_tokens(&self) -> Result<Vec<TokenRecord>, StoreError>;

    /// Whether any token was ever created (revoked ones count): once there is one, auth stays on.
    async fn any_tokens(&self) -> Result<bool, StoreError>;

    /// Marks the token revoked at `now` (a second revocation keeps the first time). `None`: no
    /// such token.
    async fn revoke_token(
        &self,
        id: TokenId,
        now: Timestamp,
    ) -> Result<Option<TokenRecord>, StoreError>;

    async fn create_namespace(&self, ns: Namespace) -> Result<Namespace, NamespaceError>;

    async fn get_namespace(&self, name: &str) -> Result<Option<Namespace>, StoreError>;

    /// Every stored namespace, by name.
    async fn list_namespaces(&self) -> Result<Vec<Namespace>, StoreError>;

    /// Appends the records in order, atomically; their `seq`s increase in that order.
    async fn append_audit(&self, records: Vec<NewAuditRecord>) -> Result<(), StoreError>;

    /// Sets the status and target of record `seq` (written with a request's own write, before
    /// the request's answer was known; see [`crate::audit_scope`]). No such record: nothing.
    async fn amend_audit(
        &self,
        seq: i64,
        status: u16,
        target: Option<String>,
    ) -> Result<(), StoreError>;

    /// Records matching `filter`, newest (highest `seq`) first, at most `limit`.
    async fn list_audit(&self, filter: &AuditFilter, limit: usize)
    -> Result<AuditPage, StoreError>;

    /// Deletes records older than `before`, at most `limit`; returns how many went.
    async fn purge_audit(&self, before: Timestamp, limit: usize) -> Result<u64, StoreError>;
}

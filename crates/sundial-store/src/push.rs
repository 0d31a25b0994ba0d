//! Push delivery's signing secrets: kept in the store so every node signs with the same ones.
//!
//! Separate from [`crate::Store`] like the schedule and workflow tables, with its own
//! conformance suite (`push_testkit`). A secret signs while it is active (`expires_at` unset or
//! later than now); a rotation adds a new secret and, in the same write, sets the others to
//! expire at the end of the overlap, so for that while every call carries two signatures.

use async_trait::async_trait;
use sundial_core::Timestamp;

use crate::StoreError;

/// One signing secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushSecret {
    /// A short public name (`ps_…`), never the secret itself.
    pub id: String,
    /// The `whsec_…` secret.
    pub secret: String,
    pub created_at: Timestamp,
    /// When it stops signing; `None`: until rotated or revoked.
    pub expires_at: Option<Timestamp>,
}

impl PushSecret {
    pub fn is_active(&self, now: Timestamp) -> bool {
        self.expires_at.is_none_or(|e| e > now)
    }
}

#[async_trait]
pub trait PushSecretStore: Send + Sync {
    /// Adds `secret`. With `expire_others_at`, every other secret still active at that time is
    /// set to expire then, in the same transaction (a rotation). A reused id is refused and
    /// nothing is written.
    async fn add_push_secret(
        &self,
        secret: PushSecret,
        expire_others_at: Option<Timestamp>,
    ) -> Result<(), StoreError>;

    /// Every secret, expired ones included, oldest first (by creation time, then id).
    async fn push_secrets(&self) -> Result<Vec<PushSecret>, StoreError>;

    /// Sets one secret to expire at `at` (no later than it already would). Answers whether the
    /// secret exists.
    async fn expire_push_secret(&self, id: &str, at: Timestamp) -> Result<bool, StoreError>;
}

//! Push delivery's signing secrets: kept in the store so every node signs with the same ones.
//!
//! Separate from [`crate::Store`] like the schedule and workflow tables, with its own
//! conformance suite (`push_testkit`). A secret signs while it is active (`expires_at` unset or
//! later than now); a rotation adds a new secret and, in the same write, sets the others to
//! expire at the end of the overlap, so for that while every call carries two signatures.
//!
//! Every secret belongs to one namespace (`sundial_core::namespace`): a push task is signed with
//! its own namespace's active secrets only, a rotation expires only the same namespace's others,
//! and listing and expiring see one namespace's secrets (another namespace's id is unknown).
//! Secrets stored before namespaces existed are the default namespace's.

use async_trait::async_trait;
use sundial_core::Timestamp;

use crate::StoreError;

/// One signing secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushSecret {
    /// A short public name (`ps_…`), never the secret itself.
    pub id: String,
    /// The namespace whose push calls it signs (`default` for secrets older than namespaces).
    pub namespace: String,
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
    /// Adds `secret` to its namespace. With `expire_others_at`, every other secret of the same
    /// namespace still active at that time is set to expire then, in the same transaction (a
    /// rotation); other namespaces' secrets are untouched. A reused id (in any namespace) is
    /// refused and nothing is written.
    async fn add_push_secret(
        &self,
        secret: PushSecret,
        expire_others_at: Option<Timestamp>,
    ) -> Result<(), StoreError>;

    /// Every secret of `namespace`, expired ones included, oldest first (by creation time, then
    /// id).
    async fn push_secrets(&self, namespace: &str) -> Result<Vec<PushSecret>, StoreError>;

    /// Sets one secret of `namespace` to expire at `at` (no later than it already would).
    /// Answers whether the namespace has that secret (another namespace's id: `false`, and
    /// nothing changes).
    async fn expire_push_secret(
        &self,
        namespace: &str,
        id: &str,
        at: Timestamp,
    ) -> Result<bool, StoreError>;
}

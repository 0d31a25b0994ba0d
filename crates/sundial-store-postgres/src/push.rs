//! The [`PushSecretStore`] of the PostgreSQL store: table `push_secrets` (migration 7), with its
//! `namespace` column (migration 15; rows older than it are the default namespace's).
//! A rotation is one transaction: the insert (a reused id fails it) and the expiry of the same
//! namespace's others.

use async_trait::async_trait;
use sundial_core::Timestamp;
use sundial_store::audit_scope;
use sundial_store::{PushSecret, PushSecretStore, StoreError};

use crate::rows::col;
use crate::{PostgresStore, pg, query, query_opt};

/// The statements, schema-qualified once per store.
pub(crate) struct PushSql {
    insert: String,
    expire_others: String,
    list: String,
    exists: String,
    expire_one: String,
}

impl PushSql {
    pub(crate) fn new(s: &str) -> Self {
        let t = format!("{s}.push_secrets");
        PushSql {
            insert: format!(
                "INSERT INTO {t} (id, namespace, secret, created_at, expires_at) \
                 VALUES ($1, $2, $3, $4, $5)"
            ),
            expire_others: format!(
                "UPDATE {t} SET expires_at = $2 \
                 WHERE namespace = $3 AND id <> $1 AND (expires_at IS NULL OR expires_at > $2)"
            ),
            list: format!(
                "SELECT id, namespace, secret, created_at, expires_at FROM {t} \
                 WHERE namespace = $1 ORDER BY created_at, id"
            ),
            exists: format!("SELECT 1 FROM {t} WHERE id = $1 AND namespace = $2"),
            expire_one: format!(
                "UPDATE {t} SET expires_at = $2 \
                 WHERE id = $1 AND namespace = $3 AND (expires_at IS NULL OR expires_at > $2)"
            ),
        }
    }
}

#[async_trait]
impl PushSecretStore for PostgresStore {
    async fn add_push_secret(
        &self,
        secret: PushSecret,
        expire_others_at: Option<Timestamp>,
    ) -> Result<(), StoreError> {
        let audit = audit_scope::claim_pending();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        let expires = secret.expires_at.map(|t| t.0);
        query(
            &tx,
            &self.sql.push.insert,
            &[
                &secret.id,
                &secret.namespace,
                &secret.secret,
                &secret.created_at.0,
                &expires,
            ],
        )
        .await?;
        if let Some(at) = expire_others_at {
            query(
                &tx,
                &self.sql.push.expire_others,
                &[&secret.id, &at.0, &secret.namespace],
            )
            .await?;
        }
        self.commit_audited(tx, audit).await?;
        Ok(())
    }

    async fn push_secrets(&self, namespace: &str) -> Result<Vec<PushSecret>, StoreError> {
        let client = self.client().await?;
        query(&client, &self.sql.push.list, &[&namespace])
            .await?
            .iter()
            .map(|r| {
                Ok(PushSecret {
                    id: col(r, 0)?,
                    namespace: col(r, 1)?,
                    secret: col(r, 2)?,
                    created_at: Timestamp(col(r, 3)?),
                    expires_at: col::<Option<i64>>(r, 4)?.map(Timestamp),
                })
            })
            .collect()
    }

    async fn expire_push_secret(
        &self,
        namespace: &str,
        id: &str,
        at: Timestamp,
    ) -> Result<bool, StoreError> {
        let audit = audit_scope::claim_pending();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        let exists = query_opt(&tx, &self.sql.push.exists, &[&id, &namespace])
            .await?
            .is_some();
        if !exists {
            return Ok(false);
        }
        query(&tx, &self.sql.push.expire_one, &[&id, &at.0, &namespace]).await?;
        self.commit_audited(tx, audit).await?;
        Ok(true)
    }
}

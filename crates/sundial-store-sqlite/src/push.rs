//! The [`PushSecretStore`] of the embedded store: table `push_secrets` (migration 6), with its
//! `namespace` column (migration 14; rows older than it are the default namespace's).

use async_trait::async_trait;
use rusqlite::params;
use sundial_core::Timestamp;
use sundial_store::{PushSecret, PushSecretStore, StoreError};

use crate::{SqliteStore, backend};

#[async_trait]
impl PushSecretStore for SqliteStore {
    async fn add_push_secret(
        &self,
        secret: PushSecret,
        expire_others_at: Option<Timestamp>,
    ) -> Result<(), StoreError> {
        self.writer
            .write(move |conn| {
                // Insert first: a reused id fails here, before the rotation touches anything,
                // and the savepoint of this write is rolled back.
                conn.prepare_cached(
                    "INSERT INTO push_secrets (id, namespace, secret, created_at, expires_at) \
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )
                .map_err(backend)?
                .execute(params![
                    secret.id,
                    secret.namespace,
                    secret.secret,
                    secret.created_at.0,
                    secret.expires_at.map(|t| t.0)
                ])
                .map_err(backend)?;
                if let Some(at) = expire_others_at {
                    conn.prepare_cached(
                        "UPDATE push_secrets SET expires_at = ?2 \
                         WHERE namespace = ?3 AND id <> ?1 \
                         AND (expires_at IS NULL OR expires_at > ?2)",
                    )
                    .map_err(backend)?
                    .execute(params![secret.id, at.0, secret.namespace])
                    .map_err(backend)?;
                }
                Ok(())
            })
            .await
    }

    async fn push_secrets(&self, namespace: &str) -> Result<Vec<PushSecret>, StoreError> {
        let namespace = namespace.to_string();
        self.read(move |conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT id, namespace, secret, created_at, expires_at FROM push_secrets \
                     WHERE namespace = ?1 ORDER BY created_at, id",
                )
                .map_err(backend)?;
            let rows = stmt
                .query_map(params![namespace], |r| {
                    Ok(PushSecret {
                        id: r.get(0)?,
                        namespace: r.get(1)?,
                        secret: r.get(2)?,
                        created_at: Timestamp(r.get(3)?),
                        expires_at: r.get::<_, Option<i64>>(4)?.map(Timestamp),
                    })
                })
                .map_err(backend)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(backend)
        })
        .await
    }

    async fn expire_push_secret(
        &self,
        namespace: &str,
        id: &str,
        at: Timestamp,
    ) -> Result<bool, StoreError> {
        let id = id.to_string();
        let namespace = namespace.to_string();
        self.writer
            .write(move |conn| {
                let exists = conn
                    .prepare_cached("SELECT 1 FROM push_secrets WHERE id = ?1 AND namespace = ?2")
                    .map_err(backend)?
                    .exists(params![id, namespace])
                    .map_err(backend)?;
                conn.prepare_cached(
                    "UPDATE push_secrets SET expires_at = ?2 \
                     WHERE id = ?1 AND namespace = ?3 \
                     AND (expires_at IS NULL OR expires_at > ?2)",
                )
                .map_err(backend)?
                .execute(params![id, at.0, namespace])
                .map_err(backend)?;
                Ok(exists)
            })
            .await
    }
}

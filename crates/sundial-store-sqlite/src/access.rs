//! [`AccessStore`] on SQLite: tables `api_tokens`, `namespaces` and `audit_log` (schema
//! migration 8). Writes are jobs of the group-committing writer like every other write; the audit
//! log's `seq` is the table's `INTEGER PRIMARY KEY AUTOINCREMENT`, so it increases in commit
//! order and is never reused after a purge.

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, Row, params};
use sundial_core::{Timestamp, TokenId};
use sundial_store::{
    AccessStore, AuditFilter, AuditPage, AuditRecord, Namespace, NamespaceError, NewAuditRecord,
    NewToken, Scope, StoreError, TokenRecord,
};

use crate::{SqliteStore, backend};

const TOKEN_COLUMNS: &str =
    "id, name, scope, namespace, secret_hash, created_at, expires_at, revoked_at";

fn corrupt(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::corrupt(format!("{what}: {e}"))
}

fn token_id(b: &[u8]) -> Result<TokenId, StoreError> {
    let arr: [u8; 16] = b
        .try_into()
        .map_err(|_| corrupt("token id", "not 16 bytes"))?;
    Ok(TokenId::from_bytes(arr))
}

fn token_from_row(r: &Row<'_>) -> Result<TokenRecord, StoreError> {
    let id: Vec<u8> = r.get(0).map_err(backend)?;
    let scope: String = r.get(2).map_err(backend)?;
    let hash: Vec<u8> = r.get(4).map_err(backend)?;
    Ok(TokenRecord {
        id: token_id(&id)?,
        name: r.get(1).map_err(backend)?,
        scope: Scope::parse(&scope).ok_or_else(|| corrupt("token scope", &scope))?,
        namespace: r.get(3).map_err(backend)?,
        secret_hash: hash
            .as_slice()
            .try_into()
            .map_err(|_| corrupt("token hash", "not 32 bytes"))?,
        created_at: Timestamp(r.get(5).map_err(backend)?),
        expires_at: r.get::<_, Option<i64>>(6).map_err(backend)?.map(Timestamp),
        revoked_at: r.get::<_, Option<i64>>(7).map_err(backend)?.map(Timestamp),
    })
}

fn load_token(conn: &Connection, id: TokenId) -> Result<Option<TokenRecord>, StoreError> {
    let sql = format!("SELECT {TOKEN_COLUMNS} FROM api_tokens WHERE id = ?1");
    conn.prepare_cached(&sql)
        .map_err(backend)?
        .query_row(params![id.as_bytes()], |r| Ok(token_from_row(r)))
        .optional()
        .map_err(backend)?
        .transpose()
}

fn namespace_from_row(r: &Row<'_>) -> Result<Namespace, StoreError> {
    Ok(Namespace {
        name: r.get(0).map_err(backend)?,
        max_live_tasks: r
            .get::<_, Option<i64>>(1)
            .map_err(backend)?
            .map(|n| n.max(0) as u64),
        max_creates_per_second: r
            .get::<_, Option<i64>>(2)
            .map_err(backend)?
            .map(|n| n.clamp(0, i64::from(u32::MAX)) as u32),
        created_at: Timestamp(r.get(3).map_err(backend)?),
    })
}

fn audit_from_row(r: &Row<'_>) -> Result<AuditRecord, StoreError> {
    let actor_id: Option<Vec<u8>> = r.get(2).map_err(backend)?;
    let status: i64 = r.get(8).map_err(backend)?;
    Ok(AuditRecord {
        seq: r.get(0).map_err(backend)?,
        record: NewAuditRecord {
            at: Timestamp(r.get(1).map_err(backend)?),
            actor_id: actor_id.as_deref().map(token_id).transpose()?,
            actor: r.get(3).map_err(backend)?,
            namespace: r.get(4).map_err(backend)?,
            action: r.get(5).map_err(backend)?,
            target: r.get(6).map_err(backend)?,
            request_id: r.get(7).map_err(backend)?,
            status: u16::try_from(status).map_err(|_| corrupt("audit status", status))?,
        },
    })
}

#[async_trait]
impl AccessStore for SqliteStore {
    async fn create_token(&self, t: NewToken) -> Result<TokenRecord, StoreError> {
        self.writer
            .write(move |conn| {
                insert_token(conn, &t, TokenInsert::Always)?
                    .ok_or_else(|| corrupt("token", "missing after insert"))
            })
            .await
    }

    async fn create_first_token(&self, t: NewToken) -> Result<Option<TokenRecord>, StoreError> {
        // One writer job: nothing else writes between the check and the insert.
        self.writer
            .write(move |conn| insert_token(conn, &t, TokenInsert::IntoEmptyTable))
            .await
    }

    async fn get_token(&self, id: TokenId) -> Result<Option<TokenRecord>, StoreError> {
        self.read(move |conn| load_token(conn, id)).await
    }

    async fn list_tokens(&self) -> Result<Vec<TokenRecord>, StoreError> {
        self.read(|conn| {
            let sql = format!("SELECT {TOKEN_COLUMNS} FROM api_tokens ORDER BY created_at, id");
            let mut stmt = conn.prepare_cached(&sql).map_err(backend)?;
            let mut rows = stmt.query([]).map_err(backend)?;
            let mut out = Vec::new();
            while let Some(r) = rows.next().map_err(backend)? {
                out.push(token_from_row(r)?);
            }
            Ok(out)
        })
        .await
    }

    async fn any_tokens(&self) -> Result<bool, StoreError> {
        self.read(|conn| {
            conn.prepare_cached("SELECT EXISTS (SELECT 1 FROM api_tokens)")
                .map_err(backend)?
                .query_row([], |r| r.get::<_, bool>(0))
                .map_err(backend)
        })
        .await
    }

    async fn revoke_token(
        &self,
        id: TokenId,
        now: Timestamp,
    ) -> Result<Option<TokenRecord>, StoreError> {
        self.writer
            .write(move |conn| {
                conn.prepare_cached(
                    "UPDATE api_tokens SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL",
                )
                .map_err(backend)?
                .execute(params![id.as_bytes(), now.0])
                .map_err(backend)?;
                load_token(conn, id)
            })
            .await
    }

    async fn create_namespace(&self, ns: Namespace) -> Result<Namespace, NamespaceError> {
        self.writer
            .write(move |conn| {
                let n = conn
                    .prepare_cached(
                        "INSERT INTO namespaces (name, max_live_tasks, max_creates_per_second, \
                         created_at) VALUES (?1, ?2, ?3, ?4) ON CONFLICT (name) DO NOTHING",
                    )
                    .map_err(backend)?
                    .execute(params![
                        ns.name,
                        ns.max_live_tasks.map(|n| n.min(i64::MAX as u64) as i64),
                        ns.max_creates_per_second.map(i64::from),
                        ns.created_at.0,
                    ])
                    .map_err(backend)?;
                if n == 0 {
                    return Err(NamespaceError::AlreadyExists);
                }
                Ok(ns)
            })
            .await
    }

    async fn get_namespace(&self, name: &str) -> Result<Option<Namespace>, StoreError> {
        let name = name.to_string();
        self.read(move |conn| {
            conn.prepare_cached(
                "SELECT name, max_live_tasks, max_creates_per_second, created_at FROM namespaces \
                 WHERE name = ?1",
            )
            .map_err(backend)?
            .query_row(params![name], |r| Ok(namespace_from_row(r)))
            .optional()
            .map_err(backend)?
            .transpose()
        })
        .await
    }

    async fn list_namespaces(&self) -> Result<Vec<Namespace>, StoreError> {
        self.read(|conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT name, max_live_tasks, max_creates_per_second, created_at \
                     FROM namespaces ORDER BY name",
                )
                .map_err(backend)?;
            let mut rows = stmt.query([]).map_err(backend)?;
            let mut out = Vec::new();
            while let Some(r) = rows.next().map_err(backend)? {
                out.push(namespace_from_row(r)?);
            }
            Ok(out)
        })
        .await
    }

    async fn append_audit(&self, records: Vec<NewAuditRecord>) -> Result<(), StoreError> {
        if records.is_empty() {
            return Ok(());
        }
        self.writer
            .write_audit_log(move |conn| {
                for r in &records {
                    insert_audit(conn, r)?;
                }
                Ok(())
            })
            .await
    }

    async fn amend_audit(
        &self,
        seq: i64,
        status: u16,
        target: Option<String>,
    ) -> Result<(), StoreError> {
        self.writer
            .write_audit_log(move |conn| {
                conn.prepare_cached("UPDATE audit_log SET status = ?2, target = ?3 WHERE seq = ?1")
                    .map_err(backend)?
                    .execute(params![seq, i64::from(status), target])
                    .map_err(backend)?;
                Ok(())
            })
            .await
    }

    async fn list_audit(
        &self,
        filter: &AuditFilter,
        limit: usize,
    ) -> Result<AuditPage, StoreError> {
        let f = filter.clone();
        self.read(move |conn| {
            // Each optional filter is `?n IS NULL OR column = ?n`; the actor matches the name or
            // the token id written as text.
            let actor_id = f
                .actor
                .as_deref()
                .and_then(|a| a.parse::<TokenId>().ok())
                .map(|id| id.as_bytes().to_vec());
            let mut stmt = conn
                .prepare_cached(
                    "SELECT seq, at, actor_id, actor, namespace, action, target, request_id, status \
                     FROM audit_log \
                     WHERE (?1 IS NULL OR seq < ?1) \
                       AND (?2 IS NULL OR namespace = ?2) \
                       AND (?3 IS NULL OR actor = ?3 OR actor_id = ?4) \
                       AND (?5 IS NULL OR action = ?5) \
                       AND (?6 IS NULL OR target = ?6) \
                     ORDER BY seq DESC LIMIT ?7",
                )
                .map_err(backend)?;
            let mut rows = stmt
                .query(params![
                    f.before,
                    f.namespace,
                    f.actor,
                    actor_id,
                    f.action,
                    f.target,
                    (limit.saturating_add(1)).min(i64::MAX as usize) as i64,
                ])
                .map_err(backend)?;
            let mut out = Vec::new();
            while let Some(r) = rows.next().map_err(backend)? {
                out.push(audit_from_row(r)?);
            }
            Ok(AuditPage::from_overfetched(out, limit))
        })
        .await
    }

    async fn purge_audit(&self, before: Timestamp, limit: usize) -> Result<u64, StoreError> {
        self.writer
            .write(move |conn| {
                let n = conn
                    .prepare_cached(
                        "DELETE FROM audit_log WHERE seq IN \
                         (SELECT seq FROM audit_log WHERE at < ?1 ORDER BY seq LIMIT ?2)",
                    )
                    .map_err(backend)?
                    .execute(params![before.0, limit.min(i64::MAX as usize) as i64])
                    .map_err(backend)?;
                Ok(n as u64)
            })
            .await
    }
}

/// Inserts one audit record on the writer's connection; its `seq`.
pub(crate) fn insert_audit(conn: &Connection, r: &NewAuditRecord) -> Result<i64, StoreError> {
    conn.prepare_cached(
        "INSERT INTO audit_log (at, actor_id, actor, namespace, action, target, request_id, \
         status) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )
    .map_err(backend)?
    .execute(params![
        r.at.0,
        r.actor_id.as_ref().map(|id| &id.as_bytes()[..]),
        r.actor,
        r.namespace,
        r.action,
        r.target,
        r.request_id,
        i64::from(r.status),
    ])
    .map_err(backend)?;
    Ok(conn.last_insert_rowid())
}

/// When [`insert_token`] inserts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TokenInsert {
    Always,
    /// Only when the table holds no token at all (the first-start bootstrap).
    IntoEmptyTable,
}

/// Inserts `t` on the writer's connection and reads it back; `None` when `when` kept it out.
fn insert_token(
    conn: &Connection,
    t: &NewToken,
    when: TokenInsert,
) -> Result<Option<TokenRecord>, StoreError> {
    let sql = match when {
        TokenInsert::Always => {
            "INSERT INTO api_tokens (id, name, scope, namespace, secret_hash, created_at, \
             expires_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"
        }
        TokenInsert::IntoEmptyTable => {
            "INSERT INTO api_tokens (id, name, scope, namespace, secret_hash, created_at, \
             expires_at) SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7 \
             WHERE NOT EXISTS (SELECT 1 FROM api_tokens)"
        }
    };
    let n = conn
        .prepare_cached(sql)
        .map_err(backend)?
        .execute(params![
            t.id.as_bytes(),
            t.name,
            t.scope.as_str(),
            t.namespace,
            &t.secret_hash[..],
            t.created_at.0,
            t.expires_at.map(|e| e.0),
        ])
        .map_err(backend)?;
    if n == 0 {
        return Ok(None);
    }
    load_token(conn, t.id)?
        .ok_or_else(|| corrupt("token", "missing after insert"))
        .map(Some)
}

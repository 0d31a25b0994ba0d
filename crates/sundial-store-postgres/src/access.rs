//! [`AccessStore`] on PostgreSQL: tables `api_tokens`, `namespaces` and `audit_log` (migration 9),
//! the same layout as the embedded store (`uuid` ids, `bigint` ms, the hash as `bytea`). The
//! audit log's `seq` is an identity column: it increases with insertion, which is close enough to
//! commit order for paging (a page never skips a record committed before it was read, because a
//! reader sees only committed rows and pages downward from the cursor). Each statement is built
//! from the schema's quoted name when first used (`prepare_cached` keeps the plan per connection).

use async_trait::async_trait;
use deadpool_postgres::GenericClient;
use sundial_core::{Timestamp, TokenId};
use sundial_store::audit_scope::{self, PendingAudit};
use sundial_store::{
    AccessStore, AuditFilter, AuditPage, AuditRecord, Namespace, NamespaceError, NewAuditRecord,
    NewToken, Scope, StoreError, TokenRecord,
};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use crate::rows::col;
use crate::{PostgresStore, limit_param, pg, query, query_opt, query_planned_per_call};

const TOKEN_COLUMNS: &str =
    "id, name, scope, namespace, secret_hash, created_at, expires_at, revoked_at";
const NAMESPACE_COLUMNS: &str = "name, max_live_tasks, max_creates_per_second, created_at";
const AUDIT_COLUMNS: &str =
    "seq, at, actor_id, actor, namespace, action, target, request_id, status";

fn corrupt(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::corrupt(format!("{what}: {e}"))
}

/// The audit columns a statement inserts, in [`audit_group_sql`]'s order.
pub(crate) const AUDIT_INSERT_COLUMNS: &str =
    "at, actor_id, actor, namespace, action, target, request_id, status";

/// A group's audit records as a row source for an `INSERT … SELECT`: `unnest` of the nine arrays
/// of [`AuditArrays::params`], bound from `$first` on, as `a(link, at, actor_id, actor,
/// namespace, action, target, request_id, status, ord)`. `link` is the id each record belongs
/// to (its task), `ord` its place in the group. Inserted `ORDER BY ord`, the rows take
/// increasing `seq`s in that order (see [`sorted_seqs`]).
pub(crate) fn audit_group_sql(first: usize) -> String {
    let p = |i: usize| first + i;
    format!(
        "unnest(${}::uuid[], ${}::bigint[], ${}::uuid[], ${}::text[], ${}::text[], ${}::text[], \
         ${}::text[], ${}::text[], ${}::int4[]) WITH ORDINALITY \
         AS a(link, at, actor_id, actor, namespace, action, target, request_id, status, ord)",
        p(0),
        p(1),
        p(2),
        p(3),
        p(4),
        p(5),
        p(6),
        p(7),
        p(8)
    )
}

/// The `seq`s a group insert returned, in the order of its records: the rows were inserted in
/// that order, so the sequence numbered them increasingly.
pub(crate) fn sorted_seqs(mut seqs: Vec<i64>) -> Vec<i64> {
    seqs.sort_unstable();
    seqs
}

/// A group's audit records, column by column, for [`audit_group_sql`].
pub(crate) struct AuditArrays<'a> {
    link: Vec<Uuid>,
    at: Vec<i64>,
    actor_id: Vec<Option<Uuid>>,
    actor: Vec<&'a str>,
    namespace: Vec<&'a str>,
    action: Vec<&'a str>,
    target: Vec<Option<&'a str>>,
    request_id: Vec<&'a str>,
    status: Vec<i32>,
}

impl<'a> AuditArrays<'a> {
    pub(crate) fn new(records: &[(Uuid, &'a NewAuditRecord)]) -> Self {
        AuditArrays {
            link: records.iter().map(|(l, _)| *l).collect(),
            at: records.iter().map(|(_, r)| r.at.0).collect(),
            actor_id: records
                .iter()
                .map(|(_, r)| r.actor_id.map(|id| id.0))
                .collect(),
            actor: records.iter().map(|(_, r)| r.actor.as_str()).collect(),
            namespace: records.iter().map(|(_, r)| r.namespace.as_str()).collect(),
            action: records.iter().map(|(_, r)| r.action.as_str()).collect(),
            target: records.iter().map(|(_, r)| r.target.as_deref()).collect(),
            request_id: records.iter().map(|(_, r)| r.request_id.as_str()).collect(),
            status: records.iter().map(|(_, r)| i32::from(r.status)).collect(),
        }
    }

    /// The nine parameters, in [`audit_group_sql`]'s order.
    pub(crate) fn params(&self) -> [&(dyn ToSql + Sync); 9] {
        [
            &self.link,
            &self.at,
            &self.actor_id,
            &self.actor,
            &self.namespace,
            &self.action,
            &self.target,
            &self.request_id,
            &self.status,
        ]
    }
}

fn token_from_row(r: &Row) -> Result<TokenRecord, StoreError> {
    let scope: String = col(r, 2)?;
    let hash: Vec<u8> = col(r, 4)?;
    Ok(TokenRecord {
        id: TokenId(col::<Uuid>(r, 0)?),
        name: col(r, 1)?,
        scope: Scope::parse(&scope).ok_or_else(|| corrupt("token scope", &scope))?,
        namespace: col(r, 3)?,
        secret_hash: hash
            .as_slice()
            .try_into()
            .map_err(|_| corrupt("token hash", "not 32 bytes"))?,
        created_at: Timestamp(col(r, 5)?),
        expires_at: col::<Option<i64>>(r, 6)?.map(Timestamp),
        revoked_at: col::<Option<i64>>(r, 7)?.map(Timestamp),
    })
}

fn namespace_from_row(r: &Row) -> Result<Namespace, StoreError> {
    Ok(Namespace {
        name: col(r, 0)?,
        max_live_tasks: col::<Option<i64>>(r, 1)?.map(|n| n.max(0) as u64),
        max_creates_per_second: col::<Option<i64>>(r, 2)?
            .map(|n| n.clamp(0, i64::from(u32::MAX)) as u32),
        created_at: Timestamp(col(r, 3)?),
    })
}

fn audit_from_row(r: &Row) -> Result<AuditRecord, StoreError> {
    let status: i32 = col(r, 8)?;
    Ok(AuditRecord {
        seq: col(r, 0)?,
        record: NewAuditRecord {
            at: Timestamp(col(r, 1)?),
            actor_id: col::<Option<Uuid>>(r, 2)?.map(TokenId),
            actor: col(r, 3)?,
            namespace: col(r, 4)?,
            action: col(r, 5)?,
            target: col(r, 6)?,
            request_id: col(r, 7)?,
            status: u16::try_from(status).map_err(|_| corrupt("audit status", status))?,
        },
    })
}

impl PostgresStore {
    fn access_sql(&self, body: &str) -> String {
        body.replace("{schema}", &self.schema.ident)
    }

    /// `INSERT INTO api_tokens (…) <source> RETURNING …` for `t`, where `source` is a `VALUES`
    /// or a `SELECT` of the seven parameters; the stored token, or `None` when the `SELECT`
    /// gave no row.
    async fn insert_token(
        &self,
        client: &impl GenericClient,
        t: &NewToken,
        source: &str,
    ) -> Result<Option<TokenRecord>, StoreError> {
        let sql = self.access_sql(&format!(
            "INSERT INTO {{schema}}.api_tokens (id, name, scope, namespace, secret_hash, \
             created_at, expires_at) {source} RETURNING {TOKEN_COLUMNS}"
        ));
        query_opt(
            client,
            &sql,
            &[
                &t.id.0,
                &t.name,
                &t.scope.as_str(),
                &t.namespace,
                &&t.secret_hash[..],
                &t.created_at.0,
                &t.expires_at.map(|e| e.0),
            ],
        )
        .await?
        .map(|r| token_from_row(&r))
        .transpose()
    }

    /// Inserts a request's audit record inside the caller's transaction (see
    /// [`sundial_store::audit_scope`]); its `seq`.
    pub(crate) async fn insert_audit_in(
        &self,
        tx: &impl GenericClient,
        r: &NewAuditRecord,
    ) -> Result<i64, StoreError> {
        let sql = self.access_sql(
            "INSERT INTO {schema}.audit_log (at, actor_id, actor, namespace, action, target, \
             request_id, status) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING seq",
        );
        let stmt = tx.prepare_cached(&sql).await.map_err(pg)?;
        let row = tx
            .query_one(
                &stmt,
                &[
                    &r.at.0,
                    &r.actor_id.map(|id| id.0),
                    &r.actor,
                    &r.namespace,
                    &r.action,
                    &r.target,
                    &r.request_id,
                    &i32::from(r.status),
                ],
            )
            .await
            .map_err(pg)?;
        col(&row, 0)
    }

    /// Commits `tx`, whose write changed something, with the request's claimed record (if
    /// any) inserted in it; the record is reported written once the commit succeeded.
    pub(crate) async fn commit_audited(
        &self,
        tx: deadpool_postgres::Transaction<'_>,
        audit: Option<PendingAudit>,
    ) -> Result<(), StoreError> {
        let Some(audit) = audit else {
            return tx.commit().await.map_err(pg);
        };
        let seq = self.insert_audit_in(&tx, audit.record()).await?;
        tx.commit().await.map_err(pg)?;
        audit.written(seq);
        Ok(())
    }

    /// The statement that inserts a group's audit records ([`AuditArrays`]) and returns their
    /// `seq`s (in any order: see [`sorted_seqs`]).
    pub(crate) fn audit_group_insert_sql(&self) -> String {
        self.access_sql(&format!(
            "INSERT INTO {{schema}}.audit_log ({AUDIT_INSERT_COLUMNS}) \
             SELECT {AUDIT_INSERT_COLUMNS} FROM {} ORDER BY ord RETURNING seq",
            audit_group_sql(1)
        ))
    }

    /// Inserts the audit records of a group of calls inside the caller's transaction, in one
    /// statement (one round trip however many calls the group has); their `seq`s, in order.
    pub(crate) async fn insert_audits_in(
        &self,
        tx: &impl GenericClient,
        records: &[&NewAuditRecord],
    ) -> Result<Vec<i64>, StoreError> {
        match records {
            [] => return Ok(Vec::new()),
            [one] => return Ok(vec![self.insert_audit_in(tx, one).await?]),
            _ => {}
        }
        let stmt = tx
            .prepare_cached(&self.audit_group_insert_sql())
            .await
            .map_err(pg)?;
        let linked: Vec<(Uuid, &NewAuditRecord)> =
            records.iter().map(|r| (Uuid::nil(), *r)).collect();
        let arrays = AuditArrays::new(&linked);
        let rows = tx.query(&stmt, &arrays.params()).await.map_err(pg)?;
        let seqs = rows
            .iter()
            .map(|r| col::<i64>(r, 0))
            .collect::<Result<Vec<_>, _>>()?;
        if seqs.len() != records.len() {
            return Err(corrupt(
                "audit_log",
                "the group insert returned another number of rows than it was given",
            ));
        }
        Ok(sorted_seqs(seqs))
    }

    async fn load_token(&self, id: TokenId) -> Result<Option<TokenRecord>, StoreError> {
        let client = self.client().await?;
        let sql = self.access_sql(&format!(
            "SELECT {TOKEN_COLUMNS} FROM {{schema}}.api_tokens WHERE id = $1"
        ));
        query_opt(&client, &sql, &[&id.0])
            .await?
            .map(|r| token_from_row(&r))
            .transpose()
    }
}

#[async_trait]
impl AccessStore for PostgresStore {
    async fn create_token(&self, t: NewToken) -> Result<TokenRecord, StoreError> {
        let audit = audit_scope::claim_pending();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        let record = self
            .insert_token(&tx, &t, "VALUES ($1, $2, $3, $4, $5, $6, $7)")
            .await?
            .ok_or_else(|| corrupt("token", "no row returned by the insert"))?;
        self.commit_audited(tx, audit).await?;
        Ok(record)
    }

    async fn create_first_token(&self, t: NewToken) -> Result<Option<TokenRecord>, StoreError> {
        // `NOT EXISTS` alone would let two transactions that both saw an empty table insert one
        // token each; the table lock (it conflicts with itself and with inserts, not with reads)
        // makes the second wait for the first's commit and then see its row.
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        let lock = self.access_sql("LOCK TABLE {schema}.api_tokens IN SHARE ROW EXCLUSIVE MODE");
        tx.batch_execute(&lock).await.map_err(pg)?;
        let record = self
            .insert_token(
                &tx,
                &t,
                "SELECT $1, $2, $3, $4, $5, $6, $7 \
                 WHERE NOT EXISTS (SELECT 1 FROM {schema}.api_tokens)",
            )
            .await?;
        tx.commit().await.map_err(pg)?;
        Ok(record)
    }

    async fn get_token(&self, id: TokenId) -> Result<Option<TokenRecord>, StoreError> {
        self.load_token(id).await
    }

    async fn list_tokens(&self) -> Result<Vec<TokenRecord>, StoreError> {
        let client = self.client().await?;
        let sql = self.access_sql(&format!(
            "SELECT {TOKEN_COLUMNS} FROM {{schema}}.api_tokens ORDER BY created_at, id"
        ));
        query(&client, &sql, &[])
            .await?
            .iter()
            .map(token_from_row)
            .collect()
    }

    async fn any_tokens(&self) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let sql = self.access_sql("SELECT EXISTS (SELECT 1 FROM {schema}.api_tokens)");
        let row = query_opt(&client, &sql, &[])
            .await?
            .ok_or_else(|| corrupt("token count", "no row"))?;
        col(&row, 0)
    }

    async fn revoke_token(
        &self,
        id: TokenId,
        now: Timestamp,
    ) -> Result<Option<TokenRecord>, StoreError> {
        let audit = audit_scope::claim_pending();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        let sql = self.access_sql(&format!(
            "UPDATE {{schema}}.api_tokens SET revoked_at = COALESCE(revoked_at, $2) \
             WHERE id = $1 RETURNING {TOKEN_COLUMNS}"
        ));
        let Some(row) = query_opt(&tx, &sql, &[&id.0, &now.0]).await? else {
            return Ok(None);
        };
        let record = token_from_row(&row)?;
        self.commit_audited(tx, audit).await?;
        Ok(Some(record))
    }

    async fn create_namespace(&self, ns: Namespace) -> Result<Namespace, NamespaceError> {
        let audit = audit_scope::claim_pending();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        let sql = self.access_sql(&format!(
            "INSERT INTO {{schema}}.namespaces ({NAMESPACE_COLUMNS}) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (name) DO NOTHING RETURNING {NAMESPACE_COLUMNS}"
        ));
        let row = query_opt(
            &tx,
            &sql,
            &[
                &ns.name,
                &ns.max_live_tasks.map(|n| n.min(i64::MAX as u64) as i64),
                &ns.max_creates_per_second.map(i64::from),
                &ns.created_at.0,
            ],
        )
        .await?;
        let Some(r) = row else {
            return Err(NamespaceError::AlreadyExists);
        };
        let created = namespace_from_row(&r)?;
        self.commit_audited(tx, audit).await?;
        Ok(created)
    }

    async fn get_namespace(&self, name: &str) -> Result<Option<Namespace>, StoreError> {
        let client = self.client().await?;
        let sql = self.access_sql(&format!(
            "SELECT {NAMESPACE_COLUMNS} FROM {{schema}}.namespaces WHERE name = $1"
        ));
        query_opt(&client, &sql, &[&name])
            .await?
            .map(|r| namespace_from_row(&r))
            .transpose()
    }

    async fn list_namespaces(&self) -> Result<Vec<Namespace>, StoreError> {
        let client = self.client().await?;
        let sql = self.access_sql(&format!(
            "SELECT {NAMESPACE_COLUMNS} FROM {{schema}}.namespaces ORDER BY name"
        ));
        query(&client, &sql, &[])
            .await?
            .iter()
            .map(namespace_from_row)
            .collect()
    }

    async fn append_audit(&self, records: Vec<NewAuditRecord>) -> Result<(), StoreError> {
        if records.is_empty() {
            return Ok(());
        }
        // One statement for the batch; `WITH ORDINALITY` keeps the given order for the identity.
        let mut at = Vec::with_capacity(records.len());
        let mut actor_id = Vec::with_capacity(records.len());
        let mut actor = Vec::with_capacity(records.len());
        let mut namespace = Vec::with_capacity(records.len());
        let mut action = Vec::with_capacity(records.len());
        let mut target = Vec::with_capacity(records.len());
        let mut request_id = Vec::with_capacity(records.len());
        let mut status = Vec::with_capacity(records.len());
        for r in records {
            at.push(r.at.0);
            actor_id.push(r.actor_id.map(|id| id.0));
            actor.push(r.actor);
            namespace.push(r.namespace);
            action.push(r.action);
            target.push(r.target);
            request_id.push(r.request_id);
            status.push(i32::from(r.status));
        }
        let client = self.client().await?;
        let sql = self.access_sql(
            "INSERT INTO {schema}.audit_log (at, actor_id, actor, namespace, action, target, \
             request_id, status) \
             SELECT at, actor_id, actor, namespace, action, target, request_id, status \
             FROM unnest($1::bigint[], $2::uuid[], $3::text[], $4::text[], $5::text[], \
                         $6::text[], $7::text[], $8::int[]) WITH ORDINALITY \
                  AS r(at, actor_id, actor, namespace, action, target, request_id, status, n) \
             ORDER BY n",
        );
        let stmt = client.prepare_cached(&sql).await.map_err(pg)?;
        client
            .execute(
                &stmt,
                &[
                    &at,
                    &actor_id,
                    &actor,
                    &namespace,
                    &action,
                    &target,
                    &request_id,
                    &status,
                ],
            )
            .await
            .map_err(pg)?;
        Ok(())
    }

    async fn amend_audit(
        &self,
        seq: i64,
        status: u16,
        target: Option<String>,
    ) -> Result<(), StoreError> {
        let client = self.client().await?;
        let sql = self
            .access_sql("UPDATE {schema}.audit_log SET status = $2, target = $3 WHERE seq = $1");
        let stmt = client.prepare_cached(&sql).await.map_err(pg)?;
        client
            .execute(&stmt, &[&seq, &i32::from(status), &target])
            .await
            .map_err(pg)?;
        Ok(())
    }

    async fn list_audit(
        &self,
        filter: &AuditFilter,
        limit: usize,
    ) -> Result<AuditPage, StoreError> {
        let actor_id = filter
            .actor
            .as_deref()
            .and_then(|a| a.parse::<TokenId>().ok())
            .map(|id| id.0);
        let mut client = self.client().await?;
        let sql = self.access_sql(&format!(
            "SELECT {AUDIT_COLUMNS} FROM {{schema}}.audit_log \
             WHERE ($1::bigint IS NULL OR seq < $1) \
               AND ($2::text IS NULL OR namespace = $2) \
               AND ($3::text IS NULL OR actor = $3 OR actor_id = $4) \
               AND ($5::text IS NULL OR action = $5) \
               AND ($6::text IS NULL OR target = $6) \
             ORDER BY seq DESC LIMIT $7"
        ));
        let rows = query_planned_per_call(
            &mut client,
            &sql,
            &[
                &filter.before,
                &filter.namespace,
                &filter.actor,
                &actor_id,
                &filter.action,
                &filter.target,
                &limit_param(limit.saturating_add(1)),
            ],
        )
        .await?;
        let records = rows
            .iter()
            .map(audit_from_row)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(AuditPage::from_overfetched(records, limit))
    }

    async fn purge_audit(&self, before: Timestamp, limit: usize) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let sql = self.access_sql(
            "DELETE FROM {schema}.audit_log WHERE seq IN \
             (SELECT seq FROM {schema}.audit_log WHERE at < $1 ORDER BY seq LIMIT $2)",
        );
        let stmt = client.prepare_cached(&sql).await.map_err(pg)?;
        client
            .execute(&stmt, &[&before.0, &limit_param(limit)])
            .await
            .map_err(pg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit;

    fn record(i: u16) -> NewAuditRecord {
        NewAuditRecord {
            at: Timestamp(1_700_000_000_000 + i64::from(i)),
            actor_id: i.is_multiple_of(2).then(|| TokenId(Uuid::now_v7())),
            actor: format!("actor-{i}"),
            namespace: "default".into(),
            action: format!("POST /v1/things/{i}"),
            target: (!i.is_multiple_of(3)).then(|| format!("target-{i}")),
            status: 200 + i,
            request_id: format!("req-{i}"),
        }
    }

    /// A group's records go in with one statement, and each record's `seq` is the one it was
    /// stored under, in the order given.
    #[tokio::test]
    async fn a_group_of_audit_records_is_stored_in_order_with_its_seqs() {
        let Some(test) = testkit::TestSchema::fresh() else {
            return;
        };
        let store = crate::connect_with_one_connection(&test.url, &test.schema).await;
        let records: Vec<NewAuditRecord> = (1..=5).map(record).collect();
        let refs: Vec<&NewAuditRecord> = records.iter().collect();
        let mut client = store.client().await.expect("client");
        let tx = client.transaction().await.expect("begin");
        let seqs = store.insert_audits_in(&tx, &refs).await.expect("insert");
        tx.commit().await.expect("commit");
        drop(client);
        assert_eq!(seqs.len(), records.len());
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
        let page = store
            .list_audit(&AuditFilter::default(), 100)
            .await
            .expect("list");
        for (seq, want) in seqs.iter().zip(&records) {
            let got = page
                .records
                .iter()
                .find(|r| r.seq == *seq)
                .unwrap_or_else(|| panic!("no record {seq}"));
            assert_eq!(&got.record, want);
        }
        assert_eq!(page.records.len(), records.len());
    }
}

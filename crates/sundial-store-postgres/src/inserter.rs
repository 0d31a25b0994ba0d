//! Group inserts: concurrent `insert` calls of one store share one transaction.
//!
//! A single create through the API is one `insert` call: a transaction with its multi-row
//! statement, the counter trigger and a commit (a WAL flush), for one task. Many producers
//! creating one task each make the database do that per-transaction work once per task. So a
//! call queues its tasks, and whichever call finds no group under way spawns one (a task of its
//! own, so a caller that gives up waiting cancels nothing). The group takes the calls queued (up
//! to [`MAX_GROUP_TASKS`] tasks in all, at least one call) and inserts all their tasks with one
//! `insert_in`, in call order, in one transaction; each call gets the outcomes of its own tasks.
//! Calls that arrive meanwhile form the next group; an idle store's call runs at once, alone.
//!
//! Each call is what it was alone: its tasks are stored together or not at all, and key
//! conflicts are reported per task (a key taken by an earlier call of the group is a `Duplicate`
//! naming that call's task, as if the calls had run one after the other). The audit record of
//! each call that created a task commits with the group. Should the group's transaction fail
//! (a reused id fails the whole statement), each of its calls is inserted again on its own, so
//! one call's error is never another's.
//!
//! A group none of whose tasks has a key costs one round trip: its statements are pipelined
//! (`insert_keyless`), since nothing it sends depends on an answer. A group with keys runs its
//! statements one after the other (`insert_keyed`).

use std::collections::HashMap;
use std::sync::Arc;

use sundial_core::NewTask;
use sundial_store::audit_scope::PendingAudit;
use sundial_store::{Inserted, StoreError};
use tokio::sync::oneshot;

use crate::PostgresStore;
use crate::lanes::{self, GroupCall, Lanes};

/// Most tasks one group inserts (a call with more still runs, alone).
pub(crate) const MAX_GROUP_TASKS: usize = 1000;

pub(crate) struct Call {
    tasks: Vec<NewTask>,
    /// The request's audit record, committed with the insert when it created a task (see
    /// [`sundial_store::audit_scope`]); claimed on the caller's task, since the group runs on
    /// another.
    audit: Option<PendingAudit>,
    reply: oneshot::Sender<Result<Vec<Inserted>, StoreError>>,
}

/// The calls waiting for a group (one lane), shared by the clones of one store.
pub(crate) type Inserter = Lanes<(), Call>;

/// Shared between clones of a store.
pub(crate) type SharedInserter = Arc<Inserter>;

impl GroupCall for Call {
    type Answer = Vec<Inserted>;
    const WORK: &'static str = "insert group";
    const GATHER: std::time::Duration = lanes::CALLERS_BACK;

    fn run(
        store: &PostgresStore,
        group: Vec<Self>,
    ) -> impl std::future::Future<Output = Result<(), (StoreError, Vec<Self>)>> + Send {
        store.insert_together(group)
    }

    fn into_reply(self) -> oneshot::Sender<Result<Vec<Inserted>, StoreError>> {
        self.reply
    }
}

impl PostgresStore {
    /// [`sundial_store::Store::insert`] through the group inserter.
    pub(crate) async fn insert_grouped(
        &self,
        tasks: Vec<NewTask>,
    ) -> Result<Vec<Inserted>, StoreError> {
        let audit = sundial_store::audit_scope::claim_pending();
        lanes::submit(
            self,
            &self.inserter,
            (),
            |reply| Call {
                tasks,
                audit,
                reply,
            },
            MAX_GROUP_TASKS,
            |c| c.tasks.len(),
        )
        .await
    }

    /// Stores a group none of whose tasks has a key in one round trip: `BEGIN`, the insert, its
    /// tags, the calls' audit records and `COMMIT` go out together (tokio-postgres pipelines
    /// requests that are polled together, in the order they are first polled). Without keys
    /// the insert creates every task or fails as a whole, so no statement waits for another's
    /// answer and every call creates its tasks. Should any statement fail, the server aborts
    /// the transaction and the `COMMIT` rolls it back; the failure is what this returns.
    async fn insert_keyless(
        &self,
        group: &[Call],
        tasks: &[NewTask],
    ) -> Result<(Vec<Inserted>, HashMap<usize, i64>), StoreError> {
        let client = self.client().await?;
        let refs: Vec<&NewTask> = tasks.iter().collect();
        let arrays = crate::TaskArrays::new(&refs)?;
        let tags = crate::TagArrays::of_tasks(tasks);
        let audited: Vec<(usize, &PendingAudit)> = group
            .iter()
            .enumerate()
            .filter(|(_, c)| !c.tasks.is_empty())
            .filter_map(|(i, c)| c.audit.as_ref().map(|a| (i, a)))
            .collect();
        let records: Vec<(uuid::Uuid, &sundial_store::NewAuditRecord)> = audited
            .iter()
            .map(|(_, a)| (uuid::Uuid::nil(), a.record()))
            .collect();
        let audit_arrays = crate::access::AuditArrays::new(&records);
        // Prepared before the round trip (a round trip of its own the first time only).
        let insert = client
            .prepare_cached(&self.sql.insert)
            .await
            .map_err(crate::pg)?;
        let insert_tags = match tags.is_empty() {
            true => None,
            false => Some(
                client
                    .prepare_cached(&self.sql.insert_tags)
                    .await
                    .map_err(crate::pg)?,
            ),
        };
        let insert_audits = match records.is_empty() {
            true => None,
            false => Some(
                client
                    .prepare_cached(&self.audit_group_insert_sql())
                    .await
                    .map_err(crate::pg)?,
            ),
        };
        let insert_params = arrays.params();
        let (began, rows, tagged, seqs, committed) = futures::join!(
            client.batch_execute("BEGIN"),
            client.query(&insert, &insert_params),
            async {
                match &insert_tags {
                    Some(s) => client.execute(s, &tags.params()).await.map(|_| ()),
                    None => Ok(()),
                }
            },
            async {
                match &insert_audits {
                    Some(s) => client.query(s, &audit_arrays.params()).await.map(Some),
                    None => Ok(None),
                }
            },
            client.batch_execute("COMMIT"),
        );
        // The first failure is the cause; those after it are the aborted transaction's.
        began.map_err(crate::pg)?;
        let rows = rows.map_err(crate::pg)?;
        tagged.map_err(crate::pg)?;
        let seqs = seqs.map_err(crate::pg)?;
        committed.map_err(crate::pg)?;
        // Committed: what follows reads the answers and changes nothing.
        let mut made: HashMap<uuid::Uuid, sundial_core::Task> = HashMap::with_capacity(rows.len());
        for r in &rows {
            let t = crate::rows::task_from_row(r)?;
            made.insert(t.id.0, t);
        }
        let out = tasks
            .iter()
            .map(|t| {
                made.remove(&t.id.0)
                    .map(|task| Inserted::Created(Box::new(task)))
                    .ok_or(StoreError::InsertUndecided { id: t.id })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let seqs = match seqs {
            Some(rows) => rows
                .iter()
                .map(|r| crate::rows::col::<i64>(r, 0))
                .collect::<Result<Vec<_>, _>>()?,
            None => Vec::new(),
        };
        let calls = audited.into_iter().map(|(i, _)| i).collect();
        Ok((
            out,
            lanes::pair_audit_seqs(
                "keyless insert group",
                calls,
                crate::access::sorted_seqs(seqs),
            )
            .into_iter()
            .collect(),
        ))
    }

    /// Stores a group some of whose tasks have keys in one transaction, statement after
    /// statement: what the insert returns decides what follows (a key taken is named, or tried
    /// again when its holder finished meanwhile).
    async fn insert_keyed(
        &self,
        group: &[Call],
        tasks: &[NewTask],
    ) -> Result<(Vec<Inserted>, HashMap<usize, i64>), StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(crate::pg)?;
        let out = self.insert_in(&tx, tasks).await?;
        // Which calls created a task, by their share of `out`.
        let mut created = Vec::with_capacity(group.len());
        let mut at = 0;
        for call in group {
            let mine = &out[at..at + call.tasks.len()];
            created.push(mine.iter().any(|i| matches!(i, Inserted::Created(_))));
            at += call.tasks.len();
        }
        let audits = group
            .iter()
            .enumerate()
            .filter(|(i, _)| created[*i])
            .filter_map(|(i, c)| c.audit.as_ref().map(|a| (i, a)))
            .collect();
        let seqs = lanes::insert_group_audits(self, &tx, audits).await?;
        tx.commit().await.map_err(crate::pg)?;
        Ok((out, seqs))
    }

    /// Inserts the tasks of `group` in one transaction and answers each call with its own
    /// outcomes; on failure nothing is answered and the calls come back with the error.
    async fn insert_together(&self, group: Vec<Call>) -> Result<(), (StoreError, Vec<Call>)> {
        let joined: Vec<NewTask>;
        let tasks: &[NewTask] = match group.as_slice() {
            [only] => &only.tasks,
            _ => {
                joined = group.iter().flat_map(|c| c.tasks.iter().cloned()).collect();
                &joined
            }
        };
        let committed = if tasks.iter().all(|t| t.key.is_none()) {
            self.insert_keyless(&group, tasks).await
        } else {
            self.insert_keyed(&group, tasks).await
        };
        let (out, seqs) = match committed {
            Ok(done) => done,
            Err(e) => return Err((e, group)),
        };
        let mut out = out.into_iter();
        for (i, mut call) in group.into_iter().enumerate() {
            let mine: Vec<Inserted> = out.by_ref().take(call.tasks.len()).collect();
            if let (Some(a), Some(seq)) = (call.audit.take(), seqs.get(&i)) {
                a.written(*seq);
            }
            let _ = call.reply.send(Ok(mine));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use sundial_core::{Limits, TaskId, TaskSpec, Timestamp};
    use sundial_store::Store;
    use uuid::Uuid;

    use super::*;
    use crate::testkit;

    const NOW: Timestamp = Timestamp(1_700_000_000_000);

    fn task(key: Option<&str>) -> NewTask {
        let mut spec = TaskSpec::new("k").queue("q").run_at(NOW);
        if let Some(k) = key {
            spec = spec.key(k);
        }
        spec.validate(TaskId(Uuid::now_v7()), NOW, 16, &Limits::default())
            .expect("valid")
    }

    /// Runs the calls concurrently while the pool's connection is held, then lets them go.
    async fn insert_behind_a_held_connection(
        store: &PostgresStore,
        calls: Vec<Vec<NewTask>>,
    ) -> Vec<Result<Vec<Inserted>, StoreError>> {
        let held = store.client().await.expect("client");
        let running: Vec<_> = calls
            .into_iter()
            .map(|tasks| {
                let store = store.clone();
                tokio::spawn(async move { store.insert(tasks).await })
            })
            .collect();
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        drop(held);
        let mut out = Vec::new();
        for r in running {
            out.push(r.await.expect("join"));
        }
        out
    }

    /// A loopback proxy in front of the test server that counts the client's turns: how often
    /// a client sent again after the server had answered, that is the round trips it waited
    /// for.
    struct TurnCounter {
        url: String,
        turns: Arc<std::sync::atomic::AtomicU64>,
    }

    impl TurnCounter {
        async fn start(url: &str) -> TurnCounter {
            use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let config: tokio_postgres::Config = url.parse().expect("test URL");
            let host = match config.get_hosts().first() {
                Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
                other => panic!("the turn counter needs a TCP host, not {other:?}"),
            };
            let upstream = format!(
                "{host}:{}",
                config.get_ports().first().copied().unwrap_or(5432)
            );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let at = listener.local_addr().expect("address");
            let turns = Arc::new(AtomicU64::new(0));
            let counted = turns.clone();
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let server = tokio::net::TcpStream::connect(&upstream)
                        .await
                        .expect("connect upstream");
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let answered = Arc::new(AtomicBool::new(false));
                    let (a, turns) = (answered.clone(), counted.clone());
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 1 << 16];
                        while let Ok(n @ 1..) = cr.read(&mut buf).await {
                            if a.swap(false, Ordering::SeqCst) {
                                turns.fetch_add(1, Ordering::SeqCst);
                            }
                            if sw.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    });
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 1 << 16];
                        while let Ok(n @ 1..) = sr.read(&mut buf).await {
                            answered.store(true, Ordering::SeqCst);
                            if cw.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    });
                }
            });
            let user = config.get_user().unwrap_or("postgres");
            let password = config
                .get_password()
                .map(|p| format!(":{}", String::from_utf8_lossy(p)))
                .unwrap_or_default();
            let db = config.get_dbname().unwrap_or("postgres");
            TurnCounter {
                url: format!("postgres://{user}{password}@{at}/{db}"),
                turns,
            }
        }

        fn turns(&self) -> u64 {
            self.turns.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    /// A group whose tasks have no key (tags and all) is stored in one round trip; a task with a
    /// key costs the transaction's statements one after the other.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_group_without_keys_is_one_round_trip() {
        let Some(test) = testkit::TestSchema::fresh() else {
            return;
        };
        let proxy = TurnCounter::start(&test.url).await;
        let store = crate::connect_with_one_connection(&proxy.url, &test.schema).await;
        let tagged = || {
            let mut t = task(None);
            t.tags.insert("team".into(), "a".into());
            t
        };
        // Once each, so that the statements are prepared.
        store.insert(vec![tagged()]).await.expect("insert");
        store
            .insert(vec![task(Some("warm"))])
            .await
            .expect("insert");

        let before = proxy.turns();
        let out = store
            .insert(vec![tagged(), task(None), tagged()])
            .await
            .expect("insert");
        assert_eq!(proxy.turns() - before, 1, "round trips for three tasks");
        let ids: Vec<TaskId> = out
            .iter()
            .map(|i| match i {
                Inserted::Created(t) => t.id,
                other => panic!("{other:?}"),
            })
            .collect();
        for id in &ids {
            assert!(store.get(*id).await.expect("get").is_some());
        }

        let before = proxy.turns();
        store.insert(vec![task(Some("one"))]).await.expect("insert");
        assert!(
            proxy.turns() - before >= 3,
            "a keyed insert is BEGIN, INSERT, COMMIT"
        );
    }

    /// Creates waiting behind an insert share one transaction; each call gets the outcomes of
    /// its own tasks, a key an earlier call of the group took is that call's task.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn creates_waiting_behind_an_insert_share_one_transaction() {
        let Some(test) = testkit::TestSchema::fresh() else {
            return;
        };
        let store = crate::connect_with_one_connection(&test.url, &test.schema).await;
        let mut calls: Vec<Vec<NewTask>> = (0..6).map(|_| vec![task(None)]).collect();
        calls.push(vec![task(Some("one")), task(None)]);
        calls.push(vec![task(Some("one"))]);
        let ids: Vec<Vec<TaskId>> = calls
            .iter()
            .map(|c| c.iter().map(|t| t.id).collect())
            .collect();
        let before = store.inserter.groups();
        let out = insert_behind_a_held_connection(&store, calls).await;
        let groups = store.inserter.groups() - before;
        assert!(
            groups <= crate::lanes::IN_FLIGHT as u64 + 1,
            "8 creates took {groups} transactions"
        );
        let mut keyed = Vec::new();
        for (mine, got) in ids.iter().zip(out) {
            let got = got.expect("insert");
            assert_eq!(got.len(), mine.len());
            for (id, i) in mine.iter().zip(got) {
                match i {
                    Inserted::Created(t) => assert_eq!(t.id, *id),
                    Inserted::Duplicate { existing } => keyed.push((*id, existing)),
                }
            }
        }
        // Of the two calls with key "one", the first in the group created it.
        assert_eq!(keyed.len(), 1, "{keyed:?}");
        let (dup, existing) = keyed[0];
        assert_ne!(dup, existing);
        assert!(store.get(existing).await.expect("get").is_some());
        assert!(store.get(dup).await.expect("get").is_none());
    }

    /// A call that fails the group's statement (a reused id) fails alone; the others are stored.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_group_is_inserted_call_by_call() {
        let Some(test) = testkit::TestSchema::fresh() else {
            return;
        };
        let store = crate::connect_with_one_connection(&test.url, &test.schema).await;
        let reused = task(None);
        store.insert(vec![reused.clone()]).await.expect("insert");
        let good: Vec<NewTask> = (0..4).map(|_| task(None)).collect();
        let mut calls: Vec<Vec<NewTask>> = good.iter().map(|t| vec![t.clone()]).collect();
        calls.insert(2, vec![reused]);
        let out = insert_behind_a_held_connection(&store, calls).await;
        assert!(out[2].is_err(), "{:?}", out[2]);
        for (i, r) in out.iter().enumerate().filter(|(i, _)| *i != 2) {
            assert!(
                matches!(r.as_deref(), Ok([Inserted::Created(_)])),
                "call {i}: {r:?}"
            );
        }
        for t in good {
            assert!(store.get(t.id).await.expect("get").is_some());
        }
    }

    /// Callers that each create again as soon as answered are gathered into one group per
    /// round, not two cohorts taking turns (each waiting for the other's group before its own).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn callers_coming_back_are_gathered_into_one_group() {
        let Some(test) = testkit::TestSchema::fresh() else {
            return;
        };
        let store = crate::connect_with_one_connection(&test.url, &test.schema).await;
        const CALLERS: usize = 4;
        const ROUNDS: usize = 10;
        let before = store.inserter.groups();
        crate::run_closed_loop(&store, CALLERS, ROUNDS, |store, _| async move {
            store.insert(vec![task(None)]).await.expect("insert");
        })
        .await;
        let groups = store.inserter.groups() - before;
        // Two cohorts take two groups a round (20 here); gathered, one a round after the first
        // two or three groups.
        assert!(
            groups <= (ROUNDS + ROUNDS / 2) as u64,
            "{CALLERS} callers × {ROUNDS} creates took {groups} groups"
        );
    }
}

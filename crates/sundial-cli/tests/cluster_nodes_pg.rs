//! Three `sundial server` processes on one PostgreSQL schema under a steady load of delayed tasks
//! and long-poll workers; one node is killed (SIGKILL) and started again, another is stopped
//! (SIGSTOP) past its shard leases and continued (SIGCONT). Afterwards the test checks, and prints
//! as counts:
//!
//! 1. **every created task ran**: every task whose create was answered 201, and every other task
//!    the database holds (a create whose answer was lost to the kill or the stop), ends
//!    `succeeded`, and no task had two completions accepted;
//! 2. **none before its due time**: a worker received each execution at or after the `run_at` the
//!    poll reported and the `run_at` its create returned (the test's wall clock: the poll returned
//!    after the claim, which came after the due time), and the database's own clock, read inside
//!    every due claim and every worker claim, was at or after the task's `due_at`. No tolerance:
//!    all processes share this machine's wall clock, and the nodes run on the database's clock,
//!    rounded so as never to be ahead of it;
//! 3. **no two executions of one task overlapped while a lease was valid**: of two consecutive
//!    executions of a task (from the database's record of every claim, including ones no worker
//!    saw), the first was ended by a lease expiry, under the reaper's clock past its lease end,
//!    before the second was claimed; the worker that got the second got it after the last lease end
//!    the first's worker was told; no write of the first sent after the second was claimed was
//!    accepted; and nothing was claimed after a success;
//! 4. **no write from the paused node was accepted after it lost its shards**: see "Audit".
//!
//! ## Audit (instrumentation in the test's schema only)
//!
//! The test migrates the schema itself and adds triggers before any node starts (the engine and
//! the store know nothing of them). Each node connects with its node id as `application_name`, so
//! the database knows which node wrote what:
//!
//! - `audit_owner_writes`: every write a shard owner makes as owner: a due claim (`scheduled` →
//!   `ready`) and a lease expiry (`running` → `scheduled`/`dead` with the reaper's message), with
//!   the writing node, the database's clock, the writer's `now`, and the shard's lease row (owner,
//!   `range_id`) as the writing transaction sees it. A fenced write holds a share lock on that row
//!   until it commits, so the row it sees is the lease it wrote under; an unfenced write, or one
//!   under a stale fence, would show another owner.
//! - `audit_starts`: every start of an attempt for a worker (`ready` → `running` by a poll's
//!   claim, or `scheduled` → `running` when a shard owner starts a due task straight for a
//!   waiting poll): execution id, node, database clock. (The test has no in-process handlers.)
//! - `audit_leases`: every change of a shard lease's owner or `range_id` (renewals change
//!   neither), with the database's clock: the lease history.
//!
//! Check 4 is then: no owner write anywhere came from a node other than the lease row's owner;
//! every shard the paused node held was taken over (a higher `range_id`) while it was stopped; no
//! write of the paused node carried a `range_id` it held before the stop once that shard had been
//! taken over; and its log says `shard lease lost`.
//!
//! Needs `SUNDIAL_TEST_DATABASE_URL` (skipped without it, failed without it when
//! `SUNDIAL_REQUIRE_POSTGRES=1`; see `common/pg.rs`). Takes about 40 s; every wait is bounded and
//! nothing asserts speed. `CLUSTER_TEST_DEBUG=1` also prints the late claims, the lease history and
//! the nodes' logs.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

mod common;

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use common::pg::with_application_name;
use common::{Backend, Launch, Server, Storage, now_ms, rfc3339_ms};
use rand::Rng;
use sundial_cli::Client;
use sundial_server::wire::{CreateTask, PolledTask};
use sundial_store_postgres::{PostgresOptions, PostgresStore};
use tokio::task::JoinHandle;
use uuid::Uuid;

const NODES: usize = 3;
const SHARDS: u32 = 16;
const TTL: &str = "3s";
const QUEUE: &str = "cluster";
/// One create every this many ms, round-robin over the nodes (40 tasks/s).
const CREATE_EVERY_MS: u64 = 25;
/// Each task's timeout, which is also the lease a worker's poll or heartbeat grants.
const TASK_TIMEOUT_MS: i64 = 2_000;
/// Any single HTTP call of the load gives up after this (a stopped node never answers).
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
const WORKERS_PER_NODE: usize = 2;
/// The node that is killed and restarted, and the node that is stopped and continued.
const KILLED: usize = 0;
const PAUSED: usize = 1;

fn node_id(i: usize) -> String {
    format!("n{}", i + 1)
}

// ---- What the load records --------------------------------------------------------------------

/// What a worker saw of one execution.
#[derive(Debug, Clone)]
struct Exec {
    task: Uuid,
    execution: Uuid,
    attempt: u32,
    node: usize,
    /// Test wall clock when the poll that delivered it returned.
    recv_ms: i64,
    /// `run_at` as the poll reported it (the attempt's due time).
    run_at: i64,
    /// The start the polled node recorded (its clock): the granted lease end minus the timeout.
    server_started_at: i64,
    /// The latest lease end the worker was told (by the poll or a heartbeat).
    lease_end: i64,
    /// When each accepted write (heartbeat, complete) of this execution was sent.
    acked_sent: Vec<i64>,
    outcome: Outcome,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Outcome {
    /// `complete` was accepted.
    Succeeded,
    /// A heartbeat or `complete` was refused with 409: the lease had been taken away.
    Stale,
    /// The worker dropped it on purpose, as a crashed worker would: its lease must expire.
    Abandoned,
    /// No node answered `complete` in time.
    Unanswered,
}

#[derive(Default)]
struct Record {
    /// Tasks whose create was answered 201: id → run_at.
    created: Mutex<HashMap<Uuid, i64>>,
    issued: AtomicU64,
    create_refused: AtomicU64,
    create_timed_out: AtomicU64,
    create_failed: AtomicU64,
    execs: Mutex<Vec<Exec>>,
    polls_failed: AtomicU64,
    /// Executions being worked on now.
    processing: AtomicUsize,
}

/// The servers' current addresses (a restarted node gets a new port).
type Clients = Arc<RwLock<Vec<Client>>>;

fn client_of(clients: &Clients, i: usize) -> Client {
    clients.read().unwrap()[i].clone()
}

/// A call that gives up after `CALL_TIMEOUT`.
async fn timed<T, E>(f: impl std::future::Future<Output = Result<T, E>>) -> Option<Result<T, E>> {
    tokio::time::timeout(CALL_TIMEOUT, f).await.ok()
}

// ---- The audit ------------------------------------------------------------------------------------

const AUDIT_SQL: &str = r#"
CREATE TABLE {s}.audit_owner_writes (
    at_ms bigint NOT NULL, app text NOT NULL, kind text NOT NULL, task uuid NOT NULL,
    shard bigint NOT NULL, due_at bigint NOT NULL, writer_now bigint NOT NULL,
    old_execution uuid, old_lease bigint,
    lease_owner text, lease_range bigint, lease_expires bigint
);
CREATE TABLE {s}.audit_starts (
    at_ms bigint NOT NULL, app text NOT NULL, task uuid NOT NULL, execution uuid NOT NULL,
    started_at bigint NOT NULL, due_at bigint NOT NULL, lease bigint NOT NULL, worker text
);
CREATE TABLE {s}.audit_leases (
    at_ms bigint NOT NULL, app text NOT NULL, shard bigint NOT NULL,
    old_owner text, new_owner text, old_range bigint, new_range bigint NOT NULL,
    expires_at bigint NOT NULL
);
CREATE FUNCTION {s}.audit_tasks() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
    at bigint := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    app text := current_setting('application_name');
BEGIN
    INSERT INTO {s}.audit_owner_writes
    SELECT at, app, CASE WHEN o.state = 'scheduled' THEN 'due_claim' ELSE 'lease_expiry' END,
           n.id, n.shard, o.due_at, n.updated_at, o.execution_id, o.lease_expires_at,
           l.owner, l.range_id, l.expires_at
    FROM old_rows o JOIN new_rows n ON n.id = o.id
    LEFT JOIN {s}.shard_leases l ON l.shard = n.shard
    WHERE (o.state = 'scheduled' AND n.state IN ('ready', 'running'))
       OR (o.state = 'running' AND n.state IN ('scheduled', 'dead')
           AND n.last_error LIKE 'lease expired%');
    INSERT INTO {s}.audit_starts
    SELECT at, app, n.id, n.execution_id, n.started_at, n.due_at, n.lease_expires_at, n.worker
    FROM old_rows o JOIN new_rows n ON n.id = o.id
    WHERE o.state IN ('ready', 'scheduled') AND n.state = 'running';
    RETURN NULL;
END
$fn$;
CREATE TRIGGER audit_tasks AFTER UPDATE ON {s}.tasks
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {s}.audit_tasks();
CREATE FUNCTION {s}.audit_leases() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
    at bigint := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO {s}.audit_leases VALUES (at, current_setting('application_name'),
            NEW.shard, NULL, NEW.owner, NULL, NEW.range_id, NEW.expires_at);
    ELSIF OLD.owner IS DISTINCT FROM NEW.owner OR OLD.range_id <> NEW.range_id THEN
        INSERT INTO {s}.audit_leases VALUES (at, current_setting('application_name'),
            NEW.shard, OLD.owner, NEW.owner, OLD.range_id, NEW.range_id, NEW.expires_at);
    END IF;
    RETURN NULL;
END
$fn$;
CREATE TRIGGER audit_leases AFTER INSERT OR UPDATE ON {s}.shard_leases
    FOR EACH ROW EXECUTE FUNCTION {s}.audit_leases();
"#;

/// A plain connection to the test schema, for the audit and the checks.
struct Db {
    client: tokio_postgres::Client,
    /// The quoted schema name.
    s: String,
}

impl Db {
    /// `sql` with `{s}` standing for the schema.
    async fn rows(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Vec<tokio_postgres::Row> {
        self.client
            .query(&sql.replace("{s}", &self.s), params)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    async fn count(&self, sql: &str, params: &[&(dyn tokio_postgres::types::ToSql + Sync)]) -> i64 {
        self.rows(sql, params).await[0].get(0)
    }

    /// The shards `node` holds now: shard → range_id.
    async fn shards_of(&self, node: &str) -> BTreeMap<i64, i64> {
        self.rows(
            "SELECT shard, range_id FROM {s}.shard_leases WHERE owner = $1 ORDER BY shard",
            &[&node],
        )
        .await
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
    }
}

// ---- The nodes ------------------------------------------------------------------------------------

struct Cluster {
    storage: Storage,
    logs: tempfile::TempDir,
    servers: Vec<Option<Server>>,
    clients: Clients,
    /// How often each node has been started (one log file per start).
    starts: Vec<usize>,
}

impl Cluster {
    fn new(storage: Storage) -> Cluster {
        Cluster {
            storage,
            logs: tempfile::tempdir().unwrap(),
            servers: (0..NODES).map(|_| None).collect(),
            clients: Arc::new(RwLock::new(
                (0..NODES)
                    .map(|_| Client::new("http://127.0.0.1:9").unwrap())
                    .collect(),
            )),
            starts: vec![0; NODES],
        }
    }

    fn log_path(&self, i: usize, start: usize) -> PathBuf {
        self.logs
            .path()
            .join(format!("{}-{}.log", node_id(i), start))
    }

    /// Starts node `i` (again) and points its client at it.
    fn start(&mut self, i: usize) {
        self.starts[i] += 1;
        let pg = self.storage.pg.as_ref().unwrap();
        let args: Vec<OsString> = [
            "--data-dir".to_string(),
            self.storage.dir.path().display().to_string(),
            "--database-url".to_string(),
            with_application_name(&pg.url, &node_id(i)),
            "--database-schema".to_string(),
            pg.schema.clone(),
            "--node-id".to_string(),
            node_id(i),
            "--shards".to_string(),
            SHARDS.to_string(),
            "--shard-lease-ttl".to_string(),
            TTL.to_string(),
        ]
        .map(OsString::from)
        .to_vec();
        let launch = Launch {
            extra: Vec::new(),
            rust_log: Some("warn,sundial::cluster=info".to_string()),
            log: Some(self.log_path(i, self.starts[i])),
            ..Launch::default()
        };
        let server = Server::spawn(args, &launch, self.storage.dir.path());
        self.clients.write().unwrap()[i] = server.client();
        self.servers[i] = Some(server);
    }

    fn server(&mut self, i: usize) -> &mut Server {
        self.servers[i].as_mut().unwrap()
    }

    /// Everything node `i` logged, over all its starts.
    fn log_text(&self, i: usize) -> String {
        (1..=self.starts[i])
            .map(|s| std::fs::read_to_string(self.log_path(i, s)).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Polls `cond` every 100 ms until it holds or `within` passes; returns whether it held.
async fn wait_for<F, Fut>(within: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = now_ms() + within.as_millis() as i64;
    loop {
        if cond().await {
            return true;
        }
        if now_ms() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---- The test -------------------------------------------------------------------------------------

/// What the fault phase leaves for the checks.
struct Faults {
    /// Shard → range_id the paused node held when it was stopped.
    held_before_pause: BTreeMap<i64, i64>,
    /// Test wall clock at SIGCONT.
    cont_at: i64,
    /// Sessions of the paused node inside a transaction just after SIGSTOP, and just before
    /// SIGCONT (PostgreSQL should have ended those by then: half the lease TTL idle).
    stopped_in_transaction: i64,
    still_in_transaction: i64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_survive_a_kill_and_a_pause_without_early_double_or_fenced_out_writes() {
    let Some(storage) = Storage::new(Backend::Postgres) else {
        return;
    };
    let pg = storage.pg.as_ref().unwrap();
    // Migrate first, so that the audit triggers are in place before any node writes.
    let store = PostgresStore::connect(
        &pg.url,
        PostgresOptions {
            schema: pg.schema.clone(),
            pool_size: 1,
            ..PostgresOptions::default()
        },
    )
    .await
    .expect("migrate the test schema");
    drop(store);
    let db = Db {
        client: pg.client().await,
        s: format!("\"{}\"", pg.schema),
    };
    db.client
        .batch_execute(&AUDIT_SQL.replace("{s}", &db.s))
        .await
        .expect("install the audit triggers");

    let mut cluster = Cluster::new(storage);
    for i in 0..NODES {
        cluster.start(i);
    }
    let all_owned = wait_for(Duration::from_secs(30), || async {
        db.count(
            "SELECT count(*) FROM {s}.shard_leases WHERE owner IS NOT NULL",
            &[],
        )
        .await
            == i64::from(SHARDS)
    })
    .await;
    assert!(all_owned, "the nodes did not take all {SHARDS} shards");

    let record = Arc::new(Record::default());
    let stop_creating = Arc::new(AtomicBool::new(false));
    let stop_working = Arc::new(AtomicBool::new(false));
    let creator = creator(&cluster.clients, &record, &stop_creating);
    let workers = workers(&cluster.clients, &record, &stop_working);

    let load_start = now_ms();
    let phase = |label: &str| {
        eprintln!(
            "[{:>6.1}s] {label}",
            (now_ms() - load_start) as f64 / 1_000.0
        )
    };
    let faults = faults(&mut cluster, &db, &phase).await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    phase("stop creating");
    stop_creating.store(true, Ordering::Relaxed);
    creator.await.unwrap();

    // Every task in the database finishes (bounded: a task whose wake-up died with the killed
    // node waits for its owner's backstop rescan, at most the 30 s idle interval).
    let drained = wait_for(Duration::from_secs(60), || async {
        db.count(
            "SELECT count(*) FROM {s}.tasks WHERE state IN ('scheduled', 'ready', 'running')",
            &[],
        )
        .await
            == 0
            && record.processing.load(Ordering::SeqCst) == 0
    })
    .await;
    phase(&format!("drained: {drained}"));
    stop_working.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = tokio::time::timeout(Duration::from_secs(10), w).await;
    }

    if std::env::var("CLUSTER_TEST_DEBUG").is_ok() {
        debug_dump(&db, &cluster, load_start).await;
    }
    let mut failures = Vec::new();
    failures.extend(every_task_ran(&db, &record, drained).await);
    failures.extend(none_before_due(&db, &record).await);
    failures.extend(no_overlap(&db, &record).await);
    failures.extend(no_write_after_losing_the_shards(&db, &cluster, &faults).await);
    assert!(failures.is_empty(), "{failures:#?}");
}

/// SIGKILL a node, wait for its shards to be taken over, start it again; then SIGSTOP another
/// until every shard it held has been taken over, and SIGCONT it.
async fn faults(cluster: &mut Cluster, db: &Db, phase: &impl Fn(&str)) -> Faults {
    tokio::time::sleep(Duration::from_secs(5)).await;
    let killed = node_id(KILLED);
    let held = db.shards_of(&killed).await;
    phase(&format!(
        "SIGKILL {killed}, holding shards (shard: range_id) {held:?}"
    ));
    let killed_at = now_ms();
    cluster.server(KILLED).kill9();
    let taken = wait_for(Duration::from_secs(30), || async {
        db.shards_of(&killed).await.is_empty()
    })
    .await;
    assert!(
        taken,
        "the killed node's shards were not taken over within 30 s"
    );
    phase(&format!(
        "{killed}'s shards taken over after {} ms",
        now_ms() - killed_at
    ));
    tokio::time::sleep(Duration::from_secs(2)).await;
    phase(&format!("restart {killed}"));
    tokio::task::block_in_place(|| cluster.start(KILLED));

    // Rendezvous hands shards back; the node to stop must hold some.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let paused = node_id(PAUSED);
    let holds = wait_for(Duration::from_secs(30), || async {
        !db.shards_of(&paused).await.is_empty()
    })
    .await;
    assert!(holds, "{paused} holds no shard to lose");
    let held_before_pause = db.shards_of(&paused).await;
    // The stop should land while the node is inside a transaction: the hard case, where its
    // session sits idle in the transaction holding its locks (a fenced write's share lock on a
    // lease row blocks every takeover of that shard) until PostgreSQL's idle-in-transaction
    // timeout ends it. Best effort: stop it as soon as one of its sessions is seen in a
    // transaction; if none still is 100 ms later, continue it and try again (up to 20 times; a
    // 100 ms stop is far below the lease TTL).
    let in_transaction = "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 \
                          AND xact_start IS NOT NULL AND state <> 'idle'";
    let mut stop_at = now_ms();
    let mut stopped_in_transaction = 0;
    for attempt in 0..20 {
        for _ in 0..200 {
            if db.count(in_transaction, &[&paused]).await > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop_at = now_ms();
        cluster.server(PAUSED).signal(libc::SIGSTOP);
        tokio::time::sleep(Duration::from_millis(100)).await;
        stopped_in_transaction = db.count(in_transaction, &[&paused]).await;
        if stopped_in_transaction > 0 || attempt == 19 {
            break;
        }
        cluster.server(PAUSED).signal(libc::SIGCONT);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    phase(&format!(
        "SIGSTOP {paused}, holding shards (shard: range_id) {held_before_pause:?}, \
         {stopped_in_transaction} of its sessions inside a transaction"
    ));
    // Stopped until every shard it held has another owner, and a little longer, so that its
    // windows hold due entries when it continues.
    let held: Vec<i64> = held_before_pause.keys().copied().collect();
    let taken = wait_for(Duration::from_secs(30), || async {
        db.count(
            "SELECT count(*) FROM {s}.shard_leases WHERE shard = ANY($1) \
             AND owner IS NOT NULL AND owner <> $2",
            &[&held, &paused],
        )
        .await
            == held.len() as i64
    })
    .await;
    let taken_after = now_ms() - stop_at;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let still_in_transaction = db.count(in_transaction, &[&paused]).await;
    let cont_at = now_ms();
    cluster.server(PAUSED).signal(libc::SIGCONT);
    phase(&format!(
        "SIGCONT {paused} after {} ms (its shards taken over after {taken_after} ms)",
        cont_at - stop_at
    ));
    assert!(
        taken,
        "{paused}'s shards were not all taken over within 30 s of SIGSTOP (lease TTL {TTL})"
    );
    Faults {
        held_before_pause,
        cont_at,
        stopped_in_transaction,
        still_in_transaction,
    }
}

// ---- The load -------------------------------------------------------------------------------------

/// One create every `CREATE_EVERY_MS`, round-robin over the nodes, each due 0.5–3 s later; each
/// create is its own task, so a node that does not answer does not slow the pace.
fn creator(clients: &Clients, record: &Arc<Record>, stop: &Arc<AtomicBool>) -> JoinHandle<()> {
    let (clients, record, stop) = (clients.clone(), record.clone(), stop.clone());
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(CREATE_EVERY_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut inflight: Vec<JoinHandle<()>> = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            let n = record.issued.fetch_add(1, Ordering::Relaxed);
            let node = n as usize % NODES;
            let run_at = now_ms() + rand::rng().random_range(500..=3_000);
            let req = CreateTask {
                queue: Some(QUEUE.into()),
                payload: Some(serde_json::json!({"n": n})),
                run_at: Some(sundial_server::time::format(
                    sundial::Timestamp::from_millis(run_at),
                )),
                timeout: Some(format!("{TASK_TIMEOUT_MS}ms")),
                max_attempts: Some(20),
                ..CreateTask::new("job")
            };
            let client = client_of(&clients, node);
            let record = record.clone();
            inflight.push(tokio::spawn(async move {
                match timed(client.create(&req)).await {
                    Some(Ok(t)) => {
                        let run_at = rfc3339_ms(&t.run_at);
                        record.created.lock().unwrap().insert(t.id, run_at);
                    }
                    // Connection refused: the node is down.
                    Some(Err(e)) if e.status().is_none() => {
                        record.create_refused.fetch_add(1, Ordering::Relaxed);
                    }
                    Some(Err(e)) => {
                        eprintln!("create on {} failed: {e}", node_id(node));
                        record.create_failed.fetch_add(1, Ordering::Relaxed);
                    }
                    None => {
                        record.create_timed_out.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
            inflight.retain(|h| !h.is_finished());
        }
        for h in inflight {
            let _ = h.await;
        }
    })
}

/// `WORKERS_PER_NODE` long-poll workers per node; each task they get is worked on in a task of
/// its own.
fn workers(clients: &Clients, record: &Arc<Record>, stop: &Arc<AtomicBool>) -> Vec<JoinHandle<()>> {
    let mut out = Vec::new();
    for node in 0..NODES {
        for w in 0..WORKERS_PER_NODE {
            let (clients, record, stop) = (clients.clone(), record.clone(), stop.clone());
            out.push(tokio::spawn(async move {
                let name = format!("w-{}-{w}", node_id(node));
                while !stop.load(Ordering::Relaxed) {
                    let client = client_of(&clients, node);
                    let polled = tokio::time::timeout(
                        Duration::from_secs(4),
                        client.poll(QUEUE, &name, 4, Duration::from_secs(1), None),
                    )
                    .await;
                    let recv_ms = now_ms();
                    let Ok(Ok(polled)) = polled else {
                        record.polls_failed.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(250)).await;
                        continue;
                    };
                    for t in polled.tasks {
                        let (clients, record) = (clients.clone(), record.clone());
                        record.processing.fetch_add(1, Ordering::SeqCst);
                        tokio::spawn(async move {
                            work(t, node, recv_ms, &clients, &record).await;
                            record.processing.fetch_sub(1, Ordering::SeqCst);
                        });
                    }
                }
            }));
        }
    }
    out
}

/// One execution: work for 20–300 ms (7 %: 2.5–4 s, heartbeating every third of the lease),
/// then complete; or (3 % of first attempts) drop the task like a crashed worker.
async fn work(t: PolledTask, node: usize, recv_ms: i64, clients: &Clients, record: &Record) {
    let timeout_ms = sundial_server::duration::parse(&t.timeout)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(TASK_TIMEOUT_MS);
    let lease_end = rfc3339_ms(&t.lease_expires_at);
    let mut exec = Exec {
        task: t.id,
        execution: t.execution_id,
        attempt: t.attempt,
        node,
        recv_ms,
        run_at: rfc3339_ms(&t.run_at),
        server_started_at: lease_end - timeout_ms,
        lease_end,
        acked_sent: Vec::new(),
        outcome: Outcome::Unanswered,
    };
    let (abandon, work_ms) = {
        let mut rng = rand::rng();
        let abandon = t.attempt == 1 && rng.random_bool(0.03);
        let work_ms: u64 = if rng.random_bool(0.07) {
            rng.random_range(2_500..=4_000)
        } else {
            rng.random_range(20..=300)
        };
        (abandon, work_ms)
    };
    if abandon {
        exec.outcome = Outcome::Abandoned;
        record.execs.lock().unwrap().push(exec);
        return;
    }
    let heartbeat_every = (TASK_TIMEOUT_MS / 3) as u64;
    let mut left = work_ms;
    while left > 0 {
        let step = left.min(heartbeat_every);
        tokio::time::sleep(Duration::from_millis(step)).await;
        left -= step;
        if left == 0 {
            break;
        }
        let (id, execution) = (t.id, t.execution_id);
        match on_any_node(node, clients, |c| async move {
            c.heartbeat(id, execution).await
        })
        .await
        {
            Answer::Accepted(view, sent) => {
                exec.acked_sent.push(sent);
                if let Some(l) = view.lease_expires_at.as_deref() {
                    exec.lease_end = exec.lease_end.max(rfc3339_ms(l));
                }
            }
            Answer::Conflict => {
                exec.outcome = Outcome::Stale;
                record.execs.lock().unwrap().push(exec);
                return;
            }
            Answer::Silent => {}
        }
    }
    let (id, execution) = (t.id, t.execution_id);
    exec.outcome = match on_any_node(node, clients, |c| async move {
        c.complete(id, execution, None).await
    })
    .await
    {
        Answer::Accepted(_, sent) => {
            exec.acked_sent.push(sent);
            Outcome::Succeeded
        }
        Answer::Conflict => Outcome::Stale,
        Answer::Silent => Outcome::Unanswered,
    };
    record.execs.lock().unwrap().push(exec);
}

enum Answer<T> {
    /// Accepted; the request was sent at this test wall time.
    Accepted(T, i64),
    /// Refused with 409: the execution is no longer the task's.
    Conflict,
    /// No node answered.
    Silent,
}

/// Tries the node that delivered the task, then the others, twice round, each call bounded.
async fn on_any_node<T, F, Fut>(first: usize, clients: &Clients, call: F) -> Answer<T>
where
    F: Fn(Client) -> Fut,
    Fut: std::future::Future<Output = Result<T, sundial_cli::ClientError>>,
{
    for k in 0..NODES * 2 {
        let node = (first + k) % NODES;
        let sent = now_ms();
        match timed(call(client_of(clients, node))).await {
            Some(Ok(v)) => return Answer::Accepted(v, sent),
            Some(Err(e)) if e.is_conflict() => return Answer::Conflict,
            Some(Err(e)) if e.status().is_some() => {
                eprintln!("unexpected answer from {}: {e}", node_id(node));
            }
            _ => {}
        }
    }
    Answer::Silent
}

// ---- The checks (each prints its counts and returns what failed) ---------------------------------

fn count_by<K: Ord, T>(
    items: impl IntoIterator<Item = T>,
    key: impl Fn(&T) -> K,
) -> BTreeMap<K, usize> {
    let mut m = BTreeMap::new();
    for i in items {
        *m.entry(key(&i)).or_insert(0) += 1;
    }
    m
}

/// 1. Every created task ran to success (once).
async fn every_task_ran(db: &Db, record: &Record, drained: bool) -> Vec<String> {
    let created = record.created.lock().unwrap().clone();
    let execs = record.execs.lock().unwrap().clone();
    let states: HashMap<Uuid, String> = db
        .rows("SELECT id, state FROM {s}.tasks", &[])
        .await
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    println!("== load");
    println!(
        "creates issued {}: answered 201 {}, refused (node down) {}, timed out {}, other errors {}",
        record.issued.load(Ordering::Relaxed),
        created.len(),
        record.create_refused.load(Ordering::Relaxed),
        record.create_timed_out.load(Ordering::Relaxed),
        record.create_failed.load(Ordering::Relaxed),
    );
    println!(
        "tasks in the database {} by state {:?}; {} of them stored though their create got no answer",
        states.len(),
        count_by(states.values(), |s| s.to_string()),
        states.keys().filter(|id| !created.contains_key(id)).count()
    );
    println!(
        "executions seen by workers {} by outcome {:?}, by delivering node {:?}, retries (attempt > 1) {}; failed or timed-out polls {}",
        execs.len(),
        count_by(&execs, |e| e.outcome),
        count_by(&execs, |e| node_id(e.node)),
        execs.iter().filter(|e| e.attempt > 1).count(),
        record.polls_failed.load(Ordering::Relaxed)
    );

    let not_succeeded: Vec<_> = created
        .keys()
        .filter(|id| states.get(id).map(String::as_str) != Some("succeeded"))
        .collect();
    let unfinished: Vec<_> = states
        .iter()
        .filter(|(_, st)| st.as_str() != "succeeded")
        .collect();
    let successes = count_by(
        execs.iter().filter(|e| e.outcome == Outcome::Succeeded),
        |e| e.task,
    );
    let acked = created
        .keys()
        .filter(|id| successes.contains_key(id))
        .count();
    let twice: Vec<_> = successes.iter().filter(|(_, n)| **n > 1).collect();
    println!("== 1. every created task ran");
    println!(
        "created (201) {}: succeeded {}, not succeeded {}; success acknowledged to a worker {acked}; \
         tasks with two accepted completions {}",
        created.len(),
        created.len() - not_succeeded.len(),
        not_succeeded.len(),
        twice.len()
    );
    let mut failures = Vec::new();
    if !drained {
        failures.push("tasks were still unfinished 60 s after the load".to_string());
    }
    if created.is_empty() {
        failures.push("no create was answered".to_string());
    }
    if !not_succeeded.is_empty() {
        failures.push(format!("created but not succeeded: {not_succeeded:?}"));
    }
    if !unfinished.is_empty() {
        failures.push(format!("unfinished: {unfinished:?}"));
    }
    if !twice.is_empty() {
        failures.push(format!("completed twice: {twice:?}"));
    }
    failures
}

/// 2. Nothing was claimed or received before it was due.
async fn none_before_due(db: &Db, record: &Record) -> Vec<String> {
    let created = record.created.lock().unwrap().clone();
    let execs = record.execs.lock().unwrap().clone();
    let early_recv: Vec<_> = execs.iter().filter(|e| e.recv_ms < e.run_at).collect();
    let early_vs_created: Vec<_> = execs
        .iter()
        .filter(|e| created.get(&e.task).is_some_and(|r| e.recv_ms < *r))
        .collect();
    let node_start_before_run_at = execs
        .iter()
        .filter(|e| e.server_started_at < e.run_at)
        .count();
    let c = &db
        .rows(
            "SELECT count(*), count(*) FILTER (WHERE at_ms < due_at), \
             count(*) FILTER (WHERE writer_now < due_at), \
             coalesce(percentile_disc(0.5) WITHIN GROUP (ORDER BY at_ms - due_at), 0), \
             coalesce(percentile_disc(0.99) WITHIN GROUP (ORDER BY at_ms - due_at), 0), \
             coalesce(max(at_ms - due_at), 0) \
             FROM {s}.audit_owner_writes WHERE kind = 'due_claim'",
            &[],
        )
        .await[0];
    let (claims, early_claims, early_by_writer): (i64, i64, i64) = (c.get(0), c.get(1), c.get(2));
    let (p50, p99, max): (i64, i64, i64) = (c.get(3), c.get(4), c.get(5));
    let s = &db
        .rows(
            "SELECT count(*), count(*) FILTER (WHERE at_ms < due_at) FROM {s}.audit_starts",
            &[],
        )
        .await[0];
    let (starts, early_starts): (i64, i64) = (s.get(0), s.get(1));
    // How far each node's clock reads behind the database's: its `started_at` against the
    // database's clock read in the same statement (the minimum; more is the statement's own time).
    let lag: Vec<(String, i64)> = db
        .rows(
            "SELECT app, min(at_ms - started_at) FROM {s}.audit_starts GROUP BY app ORDER BY app",
            &[],
        )
        .await
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    println!("== 2. none before its due time");
    println!(
        "executions received before the polled run_at {}, before the created run_at {}",
        early_recv.len(),
        early_vs_created.len()
    );
    println!(
        "due claims {claims}: database clock before due_at {early_claims}, writer's clock before due_at {early_by_writer}; \
         claim lateness (database clock - due_at) p50 {p50} ms, p99 {p99} ms, max {max} ms (kills and stops included)"
    );
    println!(
        "worker claims {starts}: database clock before due_at {early_starts}; \
         started_at (the polled node's clock) before run_at {node_start_before_run_at}; nodes' clocks behind the database's (ms) {lag:?}"
    );
    let mut failures = Vec::new();
    if !early_recv.is_empty() || !early_vs_created.is_empty() {
        failures.push(format!(
            "received before due: {early_recv:?} {early_vs_created:?}"
        ));
    }
    if early_claims + early_by_writer + early_starts > 0 {
        failures.push(format!(
            "claimed before due: {early_claims} due claims by the database's clock, {early_by_writer} by the writer's, {early_starts} worker claims"
        ));
    }
    if claims == 0 {
        failures.push("no due claim was recorded".to_string());
    }
    failures
}

/// 3. No two executions of one task overlapped while a lease was valid.
async fn no_overlap(db: &Db, record: &Record) -> Vec<String> {
    let execs = record.execs.lock().unwrap().clone();
    let seen: HashMap<Uuid, &Exec> = execs.iter().map(|e| (e.execution, e)).collect();
    let mut per_task: HashMap<Uuid, Vec<(Uuid, i64)>> = HashMap::new();
    let starts = db
        .rows(
            "SELECT task, execution, at_ms FROM {s}.audit_starts ORDER BY at_ms",
            &[],
        )
        .await;
    for r in &starts {
        per_task
            .entry(r.get(0))
            .or_default()
            .push((r.get(1), r.get(2)));
    }
    // Execution → (database clock, reaper's now, the lease end it expired).
    let expiries: HashMap<Uuid, (i64, i64, i64)> = db
        .rows(
            "SELECT old_execution, at_ms, writer_now, old_lease FROM {s}.audit_owner_writes \
             WHERE kind = 'lease_expiry'",
            &[],
        )
        .await
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2), r.get(3))))
        .collect();
    let succeeded_by: HashMap<Uuid, Option<Uuid>> = db
        .rows(
            "SELECT id, execution_id FROM {s}.tasks WHERE state = 'succeeded'",
            &[],
        )
        .await
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let mut pairs = 0usize;
    let mut violations: Vec<String> = Vec::new();
    for (task, list) in &per_task {
        if let Some(Some(last)) = succeeded_by.get(task)
            && list.last().map(|(x, _)| x) != Some(last)
        {
            violations.push(format!(
                "{task}: claimed again after the successful execution"
            ));
        }
        for w in list.windows(2) {
            let ((e1, _), (e2, claimed2)) = (w[0], w[1]);
            pairs += 1;
            match expiries.get(&e1) {
                Some((at, reaper_now, lease)) => {
                    if *at > claimed2 {
                        violations.push(format!("{task}: {e2} claimed before {e1} expired"));
                    }
                    if reaper_now <= lease {
                        violations.push(format!("{task}: {e1} expired before its lease ended"));
                    }
                }
                None => violations.push(format!(
                    "{task}: {e2} claimed, but {e1} never ended by lease expiry"
                )),
            }
            if let (Some(x1), Some(x2)) = (seen.get(&e1), seen.get(&e2))
                && x2.recv_ms <= x1.lease_end
            {
                violations.push(format!(
                    "{task}: {e2} received at {} within {e1}'s lease (until {})",
                    x2.recv_ms, x1.lease_end
                ));
            }
            if let Some(x1) = seen.get(&e1) {
                if x1.outcome == Outcome::Succeeded {
                    violations.push(format!("{task}: {e2} claimed after {e1} succeeded"));
                }
                if let Some(late) = x1.acked_sent.iter().find(|t| **t > claimed2) {
                    violations.push(format!(
                        "{task}: a write of {e1} sent at {late} was accepted though {e2} was claimed at {claimed2}"
                    ));
                }
            }
        }
    }
    let unseen = starts
        .iter()
        .filter(|r| !seen.contains_key(&r.get::<_, Uuid>(1)))
        .count();
    println!("== 3. no two executions of one task overlapped while a lease was valid");
    println!(
        "executions claimed {} ({unseen} never reached a worker); tasks claimed more than once {}; \
         consecutive pairs checked {pairs}; lease expiries {}; violations {}",
        starts.len(),
        per_task.values().filter(|l| l.len() > 1).count(),
        expiries.len(),
        violations.len()
    );
    violations
}

/// 4. No write from the paused node was accepted after it lost its shards.
async fn no_write_after_losing_the_shards(db: &Db, cluster: &Cluster, f: &Faults) -> Vec<String> {
    let paused = node_id(PAUSED);
    let w = &db
        .rows(
            "SELECT count(*), count(*) FILTER (WHERE lease_owner IS DISTINCT FROM app), \
             count(*) FILTER (WHERE app = $1), count(*) FILTER (WHERE app = $1 AND at_ms >= $2) \
             FROM {s}.audit_owner_writes",
            &[&paused, &f.cont_at],
        )
        .await[0];
    let (writes, not_owner, by_paused, by_paused_after): (i64, i64, i64, i64) =
        (w.get(0), w.get(1), w.get(2), w.get(3));
    let now: HashMap<i64, i64> = db
        .rows("SELECT shard, range_id FROM {s}.shard_leases", &[])
        .await
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let mut raised = 0usize;
    let mut taken_while_stopped = 0usize;
    let mut stale_fence_writes = 0i64;
    for (shard, range) in &f.held_before_pause {
        if now.get(shard).is_some_and(|r| r > range) {
            raised += 1;
        }
        let taken_at: Option<i64> = db
            .rows(
                "SELECT min(at_ms) FROM {s}.audit_leases WHERE shard = $1 AND old_range = $2 \
             AND new_range > $2",
                &[shard, range],
            )
            .await[0]
            .get(0);
        if let Some(taken_at) = taken_at {
            if taken_at < f.cont_at {
                taken_while_stopped += 1;
            }
            stale_fence_writes += db
                .count(
                    "SELECT count(*) FROM {s}.audit_owner_writes WHERE app = $1 AND shard = $2 \
                     AND lease_range = $3 AND at_ms >= $4",
                    &[&paused, shard, range, &taken_at],
                )
                .await;
        }
    }
    let changes = db.count("SELECT count(*) FROM {s}.audit_leases", &[]).await;
    let log = cluster.log_text(PAUSED);
    let lost = log.matches("shard lease lost").count();
    let lost_in_loop = log
        .matches("shard lease lost; this node stops running the shard")
        .count();

    println!("== 4. no write from the paused node after it lost its shards");
    println!(
        "owner writes (due claims and lease expiries) {writes}; by a node that was not the lease row's owner {not_owner}; \
         lease owner changes recorded {changes}"
    );
    println!(
        "{paused} held {} shards when stopped; taken over while it was stopped {taken_while_stopped}; with a higher range_id now {raised}",
        f.held_before_pause.len()
    );
    println!(
        "{paused}'s owner writes {by_paused}, {by_paused_after} of them after SIGCONT; under a range_id it held before the stop, \
         after that shard was taken over: {stale_fence_writes}"
    );
    println!(
        "{paused}'s log: 'shard lease lost' {lost} times ({lost_in_loop} from a shard loop's refused claim)"
    );
    println!(
        "{paused}'s sessions inside a transaction: {} just after SIGSTOP, {} just before SIGCONT \
         (a node's sessions end after half the lease TTL idle in a transaction, releasing their locks)",
        f.stopped_in_transaction, f.still_in_transaction
    );
    let mut failures = Vec::new();
    if not_owner != 0 {
        failures.push(format!(
            "{not_owner} owner writes by a node that did not own the shard"
        ));
    }
    if stale_fence_writes != 0 {
        failures.push(format!(
            "{stale_fence_writes} writes of {paused} under a superseded range_id"
        ));
    }
    if taken_while_stopped != f.held_before_pause.len() || raised != f.held_before_pause.len() {
        failures.push(format!(
            "of {paused}'s {} shards, {taken_while_stopped} were taken over while it was stopped and {raised} have a higher range_id",
            f.held_before_pause.len()
        ));
    }
    if f.still_in_transaction != 0 {
        failures.push(format!(
            "{} sessions of the stopped {paused} still inside a transaction after seconds",
            f.still_in_transaction
        ));
    }
    if lost == 0 {
        failures.push(format!("{paused}'s log does not mention the lost leases"));
    }
    failures
}

/// With `CLUSTER_TEST_DEBUG`: claims more than 500 ms late, the lease history, the nodes' logs.
async fn debug_dump(db: &Db, cluster: &Cluster, load_start: i64) {
    for r in db
        .rows(
            "SELECT w.at_ms - w.due_at, w.at_ms - $1::bigint, w.due_at - $1::bigint, \
             t.created_at - $1::bigint, w.shard, w.app, w.kind, w.task::text \
             FROM {s}.audit_owner_writes w JOIN {s}.tasks t ON t.id = w.task \
             WHERE w.kind = 'due_claim' AND w.at_ms - w.due_at > 500 ORDER BY 1 DESC LIMIT 40",
            &[&load_start],
        )
        .await
    {
        let v: (i64, i64, i64, i64, i64, String, String, String) = (
            r.get(0),
            r.get(1),
            r.get(2),
            r.get(3),
            r.get(4),
            r.get(5),
            r.get(6),
            r.get(7),
        );
        eprintln!("late claim (late, at, due, created, shard, node, kind, task): {v:?}");
    }
    for r in db
        .rows(
            "SELECT at_ms - $1::bigint, app, shard, old_owner, new_owner, old_range, new_range \
             FROM {s}.audit_leases ORDER BY at_ms",
            &[&load_start],
        )
        .await
    {
        let v: (
            i64,
            String,
            i64,
            Option<String>,
            Option<String>,
            Option<i64>,
            i64,
        ) = (
            r.get(0),
            r.get(1),
            r.get(2),
            r.get(3),
            r.get(4),
            r.get(5),
            r.get(6),
        );
        eprintln!("lease change (at, by, shard, from, to, range from, range to): {v:?}");
    }
    for i in 0..NODES {
        eprintln!("---- log of {}:\n{}", node_id(i), cluster.log_text(i));
    }
}

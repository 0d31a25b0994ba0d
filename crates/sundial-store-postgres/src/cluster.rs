//! [`Cluster`] on PostgreSQL: membership, shard leases with fencing, fenced owner writes and
//! wake-ups over LISTEN/NOTIFY.
//!
//! - **Leases.** `shard_leases (shard, owner, expires_at, range_id)`. `acquire_shard` is one
//!   `INSERT … ON CONFLICT (shard) DO UPDATE … WHERE` statement: PostgreSQL evaluates the `WHERE`
//!   on the newest version of the row under its row lock, so of several nodes acquiring one
//!   shard exactly one gets it. `acquire_shards` is the same statement over many rows (in shard
//!   order), so a node renews all its leases with one statement per round. `range_id` moves whenever the holder changes; `release_shard`
//!   clears the owner and moves it too, so a released fence is dead at once and whoever takes the
//!   shard next (its previous owner included) gets a new number.
//! - **Fenced writes.** `claim_due` and `expire_leases` with a fence run in one transaction
//!   that first reads the shard's `range_id` `FOR SHARE`. A takeover updates that row, so it waits
//!   until the fenced write commits, or the fenced write (coming second) reads the new number and
//!   is refused with `LeaseLost` before it writes anything. The write itself is the unfenced code
//!   path, limited to the fence's shard.
//! - **Wake-ups.** One channel per schema ([`crate::schema::SchemaName::channel`]). A
//!   notification carries one or more wake-ups, one JSON array per line:
//!   `["d",shard,due_at,"id",timeout_ms,"queue","kind"]` (then the push host and a priority
//!   other than 5, when there are: `[…,"kind","host"|null,9]`) or `["r","queue"]`; lines it does not
//!   understand are skipped, so the format can grow. `publish` sends from a pooled connection of
//!   its own (never inside a task write: a notifying commit takes a database-wide lock), splitting
//!   at [`MAX_PAYLOAD`] bytes. `subscribe` holds a dedicated connection outside the pool that
//!   LISTENs, pings it, and reconnects with backoff when it drops; a gap loses wake-ups, which
//!   costs latency only. A subscriber also receives what its own store published: the store
//!   cannot tell which engine sharing it sent a wake-up, and a duplicate is harmless.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use sundial_core::{Priority, TaskId, Timestamp};
use sundial_store::{
    Cluster, ClusterState, DueEntry, DueKey, Fence, Member, Place, ShardLease, StoreError, Wakeup,
};
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, NoTls};

use crate::rows::col;
use crate::{PostgresStore, pg, query, query_opt};

/// Largest notification payload this store sends, in bytes (PostgreSQL's limit is 8,000).
pub(crate) const MAX_PAYLOAD: usize = 7_900;
/// Wake-ups a subscriber may fall behind by before newer ones are dropped (latency only).
const SUBSCRIBER_BUFFER: usize = 8_192;
/// How often the LISTEN connection is checked, and how long a check may take.
const PING_EVERY: Duration = Duration::from_secs(15);
const PING_TIMEOUT: Duration = Duration::from_secs(10);
/// Reconnect backoff of the LISTEN connection (capped at a second, so cross-node wake-ups flow
/// again within about a second of the database accepting connections).
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

impl PostgresStore {
    /// Checks `fence` inside `tx`: the shard's `range_id`, read with a share lock held to the end
    /// of the transaction, must be the fence's.
    pub(crate) async fn check_fence(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        fence: Fence,
    ) -> Result<(), StoreError> {
        let shard = i64::from(fence.shard);
        let row = query_opt(tx, &self.sql.cluster.fence, &[&shard]).await?;
        let current: Option<i64> = row.map(|r| col(&r, 0)).transpose()?;
        if current == Some(fence.range_id) {
            Ok(())
        } else {
            Err(StoreError::LeaseLost { shard: fence.shard })
        }
    }
}

#[async_trait]
impl Cluster for PostgresStore {
    async fn shard_count(&self, proposed: u32) -> Result<u32, StoreError> {
        if proposed == 0 {
            return Err(StoreError::ZeroShards);
        }
        let client = self.client().await?;
        // Two statements: a row a concurrent first caller inserted is visible to the second
        // one (its snapshot is taken after the insert waited for that caller's commit).
        query(
            &client,
            &self.sql.cluster.shard_count_propose,
            &[&i64::from(proposed)],
        )
        .await?;
        let row = query_opt(&client, &self.sql.cluster.shard_count, &[])
            .await?
            .ok_or_else(|| StoreError::corrupt("cluster_meta has no shard count"))?;
        let n: i64 = col(&row, 0)?;
        u32::try_from(n)
            .ok()
            .filter(|n| *n >= 1)
            .ok_or_else(|| StoreError::corrupt(format!("shard count {n} is out of range")))
    }

    async fn heartbeat(
        &self,
        node: &str,
        now: Timestamp,
        live_since: Timestamp,
    ) -> Result<Vec<Member>, StoreError> {
        let client = self.client().await?;
        query(
            &client,
            &self.sql.cluster.heartbeat,
            &[&node, &now.0, &live_since.0],
        )
        .await?
        .iter()
        .map(|r| {
            Ok(Member {
                node: col(r, 0)?,
                last_seen: Timestamp(col(r, 1)?),
            })
        })
        .collect()
    }

    async fn cluster_state(&self) -> Result<ClusterState, StoreError> {
        let client = self.client().await?;
        let members = query(&client, &self.sql.cluster.members, &[])
            .await?
            .iter()
            .map(|r| {
                Ok(Member {
                    node: col(r, 0)?,
                    last_seen: Timestamp(col(r, 1)?),
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let leases = query(&client, &self.sql.cluster.leases, &[])
            .await?
            .iter()
            .map(|r| {
                let shard: i64 = col(r, 0)?;
                Ok(ShardLease {
                    shard: u32::try_from(shard)
                        .map_err(|_| StoreError::corrupt(format!("shard {shard} out of range")))?,
                    owner: col(r, 1)?,
                    expires_at: Timestamp(col(r, 2)?),
                    range_id: col(r, 3)?,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        Ok(ClusterState { members, leases })
    }

    async fn leave(&self, node: &str) -> Result<(), StoreError> {
        let client = self.client().await?;
        query(&client, &self.sql.cluster.leave, &[&node]).await?;
        Ok(())
    }

    async fn acquire_shard(
        &self,
        shard: u32,
        node: &str,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<Option<Fence>, StoreError> {
        let client = self.client().await?;
        let row = query_opt(
            &client,
            &self.sql.cluster.acquire,
            &[&i64::from(shard), &node, &now.0, &until.0],
        )
        .await?;
        row.map(|r| {
            Ok(Fence {
                shard,
                range_id: col(&r, 0)?,
            })
        })
        .transpose()
    }

    async fn acquire_shards(
        &self,
        shards: &[u32],
        node: &str,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<Vec<Option<Fence>>, StoreError> {
        if shards.is_empty() {
            return Ok(Vec::new());
        }
        let mut asked: Vec<i64> = shards.iter().map(|&s| i64::from(s)).collect();
        asked.sort_unstable();
        asked.dedup();
        let client = self.client().await?;
        let rows = query(
            &client,
            &self.sql.cluster.acquire_many,
            &[&asked, &node, &now.0, &until.0],
        )
        .await?;
        let mut got: HashMap<u32, Fence> = HashMap::with_capacity(rows.len());
        for r in &rows {
            let shard: i64 = col(r, 0)?;
            let shard = u32::try_from(shard)
                .map_err(|_| StoreError::corrupt(format!("shard {shard} is out of range")))?;
            got.insert(
                shard,
                Fence {
                    shard,
                    range_id: col(r, 1)?,
                },
            );
        }
        Ok(shards.iter().map(|s| got.get(s).copied()).collect())
    }

    async fn release_shard(&self, fence: Fence, node: &str) -> Result<(), StoreError> {
        let client = self.client().await?;
        query(
            &client,
            &self.sql.cluster.release,
            &[&i64::from(fence.shard), &node, &fence.range_id],
        )
        .await?;
        Ok(())
    }

    async fn publish(&self, wakeups: Vec<Wakeup>) -> Result<(), StoreError> {
        let payloads = encode(&wakeups);
        if payloads.is_empty() {
            return Ok(());
        }
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(&self.sql.cluster.notify)
            .await
            .map_err(pg)?;
        client
            .execute(&stmt, &[&self.channel, &payloads])
            .await
            .map_err(pg)?;
        Ok(())
    }

    async fn subscribe(&self) -> Result<BoxStream<'static, Wakeup>, StoreError> {
        let listener = Listener {
            config: self.config.clone(),
            channel: self.channel.clone(),
        };
        // The first connection is made here, so that wake-ups published after this returns
        // are received (and a database that cannot be reached is reported).
        let first = listener.connect().await.map_err(pg)?;
        let (tx, mut rx) = mpsc::channel(SUBSCRIBER_BUFFER);
        tokio::spawn(listener.run(first, tx));
        Ok(futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed())
    }

    async fn database_time(&self) -> Result<Timestamp, StoreError> {
        let client = self.client().await?;
        let row = query_opt(&client, &self.sql.cluster.database_time, &[])
            .await?
            .ok_or(StoreError::NoRow {
                what: "the database time",
            })?;
        Ok(Timestamp(col(&row, 0)?))
    }
}

/// One wake-up as a line of a notification payload.
fn encode_one(w: &Wakeup) -> String {
    let v = match w {
        // A push task's destination rides as an eighth element, a priority other than the
        // default as a ninth (the eighth then `null` when there is no destination).
        Wakeup::Due { shard, entry } => match (&entry.push_host, entry.priority) {
            (None, Priority::DEFAULT) => serde_json::json!([
                "d",
                shard,
                entry.key.due_at.0,
                entry.key.id.0.to_string(),
                entry.timeout_ms,
                entry.queue,
                entry.kind,
            ]),
            (Some(host), Priority::DEFAULT) => serde_json::json!([
                "d",
                shard,
                entry.key.due_at.0,
                entry.key.id.0.to_string(),
                entry.timeout_ms,
                entry.queue,
                entry.kind,
                host,
            ]),
            (host, priority) => serde_json::json!([
                "d",
                shard,
                entry.key.due_at.0,
                entry.key.id.0.to_string(),
                entry.timeout_ms,
                entry.queue,
                entry.kind,
                host,
                priority.get(),
            ]),
        },
        Wakeup::Ready { queue } => serde_json::json!(["r", queue]),
        Wakeup::Released { place, handed } => match place {
            Place::Group(key) => serde_json::json!(["p", "g", key, handed]),
            Place::Queue(queue) => serde_json::json!(["p", "q", queue, handed]),
        },
        Wakeup::Membership => serde_json::json!(["m"]),
    };
    v.to_string()
}

/// The payloads that carry `wakeups` (duplicates sent once), each at most [`MAX_PAYLOAD`]
/// bytes. A wake-up too large for any payload (names near their length limits) is dropped:
/// wake-ups are best effort.
pub(crate) fn encode(wakeups: &[Wakeup]) -> Vec<String> {
    let mut seen: HashSet<String> = HashSet::new();
    let mut out = Vec::new();
    let mut current = String::new();
    for w in wakeups {
        let line = encode_one(w);
        // Each release offers one place: two alike are two places, not a duplicate.
        if !matches!(w, Wakeup::Released { .. }) && !seen.insert(line.clone()) {
            continue;
        }
        if line.len() > MAX_PAYLOAD {
            tracing::warn!(bytes = line.len(), "wake-up too large to notify; dropped");
            continue;
        }
        if !current.is_empty() && current.len() + 1 + line.len() > MAX_PAYLOAD {
            out.push(std::mem::take(&mut current));
        }
        if !current.is_empty() {
            current.push('\n');
        }
        current.push_str(&line);
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// The wake-ups of one payload; lines that do not parse are skipped.
pub(crate) fn decode(payload: &str) -> Vec<Wakeup> {
    payload
        .lines()
        .filter_map(|line| {
            let w = decode_one(line);
            if w.is_none() {
                tracing::debug!(line, "ignoring a wake-up line this version does not read");
            }
            w
        })
        .collect()
}

fn decode_one(line: &str) -> Option<Wakeup> {
    let v: Vec<serde_json::Value> = serde_json::from_str(line).ok()?;
    match v.first()?.as_str()? {
        "d" => {
            let (shard, due_at, id, timeout_ms, queue, kind, push_host, priority) =
                match v.as_slice() {
                    [_, s, d, i, t, q, k] => (s, d, i, t, q, k, None, Priority::DEFAULT),
                    [_, s, d, i, t, q, k, h] => (
                        s,
                        d,
                        i,
                        t,
                        q,
                        k,
                        Some(h.as_str()?.to_string()),
                        Priority::DEFAULT,
                    ),
                    [_, s, d, i, t, q, k, h, p] => (
                        s,
                        d,
                        i,
                        t,
                        q,
                        k,
                        h.as_str().map(str::to_string),
                        Priority::new(u8::try_from(p.as_u64()?).ok()?).ok()?,
                    ),
                    _ => return None,
                };
            Some(Wakeup::Due {
                shard: u32::try_from(shard.as_u64()?).ok()?,
                entry: DueEntry {
                    key: DueKey {
                        due_at: Timestamp(due_at.as_i64()?),
                        id: TaskId(id.as_str()?.parse().ok()?),
                    },
                    queue: queue.as_str()?.to_string(),
                    kind: kind.as_str()?.to_string(),
                    timeout_ms: timeout_ms.as_u64()?,
                    push_host,
                    priority,
                },
            })
        }
        "r" => {
            let [_, queue] = v.as_slice() else {
                return None;
            };
            Some(Wakeup::Ready {
                queue: queue.as_str()?.to_string(),
            })
        }
        "p" => {
            let [_, class, name, handed] = v.as_slice() else {
                return None;
            };
            let name = name.as_str()?.to_string();
            let place = match class.as_str()? {
                "g" => Place::Group(name),
                "q" => Place::Queue(name),
                _ => return None,
            };
            let handed = if handed.is_null() {
                None
            } else {
                Some(handed.as_i64()?)
            };
            Some(Wakeup::Released { place, handed })
        }
        "m" if v.len() == 1 => Some(Wakeup::Membership),
        _ => None,
    }
}

/// Opens LISTEN connections for one subscriber.
struct Listener {
    config: tokio_postgres::Config,
    channel: String,
}

/// One LISTEN connection: its client (dropping it closes the connection) and the payloads its
/// driver task receives.
struct Listening {
    client: tokio_postgres::Client,
    payloads: mpsc::UnboundedReceiver<String>,
    driver: tokio::task::JoinHandle<()>,
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

impl Listener {
    /// Connects and LISTENs. A task drives the connection and hands over notifications; it
    /// ends when the connection does.
    async fn connect(&self) -> Result<Listening, tokio_postgres::Error> {
        let (client, mut conn) = self.config.connect(NoTls).await?;
        let (tx, payloads) = mpsc::unbounded_channel();
        let driver = tokio::spawn(async move {
            loop {
                match std::future::poll_fn(|cx| conn.poll_message(cx)).await {
                    Some(Ok(AsyncMessage::Notification(n))) => {
                        if tx.send(n.payload().to_string()).is_err() {
                            return;
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "wake-up connection failed");
                        return;
                    }
                    None => return,
                }
            }
        });
        let listening = Listening {
            client,
            payloads,
            driver,
        };
        listening
            .client
            .batch_execute(&format!("LISTEN \"{}\"", self.channel))
            .await?;
        Ok(listening)
    }

    /// Forwards wake-ups to `out` until its receiver is dropped, reconnecting whenever the
    /// connection is lost.
    async fn run(self, mut current: Listening, out: mpsc::Sender<Wakeup>) {
        let mut backoff = MIN_BACKOFF;
        let mut dropped: u64 = 0;
        loop {
            let mut ping = tokio::time::interval(PING_EVERY);
            ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ping.tick().await;
            loop {
                tokio::select! {
                    _ = out.closed() => return,
                    payload = current.payloads.recv() => {
                        let Some(payload) = payload else { break };
                        for w in decode(&payload) {
                            match out.try_send(w) {
                                Ok(()) => {}
                                Err(mpsc::error::TrySendError::Full(_)) => {
                                    dropped += 1;
                                    if dropped.is_power_of_two() {
                                        tracing::warn!(
                                            dropped,
                                            "wake-up subscriber is behind; dropping wake-ups"
                                        );
                                    }
                                }
                                Err(mpsc::error::TrySendError::Closed(_)) => return,
                            }
                        }
                    }
                    _ = ping.tick() => {
                        match tokio::time::timeout(PING_TIMEOUT, current.client.simple_query("SELECT 1")).await {
                            Ok(Ok(_)) => backoff = MIN_BACKOFF,
                            _ => break,
                        }
                    }
                }
            }
            tracing::warn!(channel = %self.channel, "wake-up connection lost; reconnecting");
            drop(current);
            current = loop {
                tokio::select! {
                    _ = out.closed() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                match self.connect().await {
                    Ok(l) => break l,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot reconnect the wake-up connection");
                    }
                }
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn due(shard: u32, due_at: i64, queue: &str) -> Wakeup {
        Wakeup::Due {
            shard,
            entry: DueEntry {
                key: DueKey {
                    due_at: Timestamp(due_at),
                    id: TaskId(uuid::Uuid::from_u128(u128::from(shard) << 64 | 7)),
                },
                queue: queue.to_string(),
                kind: "k\n\"quoted\"".to_string(),
                timeout_ms: 30_000,
                push_host: (shard % 2 == 1).then(|| "hooks.example.com:443".to_string()),
                priority: Priority::new((shard % 3 * 4) as u8).unwrap(),
            },
        }
    }

    #[test]
    fn wakeups_round_trip_and_share_payloads() {
        let ws = vec![
            due(3, 1_700_000_000_123, "q"),
            Wakeup::Ready {
                queue: "emails".to_string(),
            },
            due(0, -5, "ünïcode"),
            Wakeup::Membership,
            Wakeup::Released {
                place: Place::Group("acme:smtp".to_string()),
                handed: Some(-1_700_000_000_123),
            },
            Wakeup::Released {
                place: Place::Queue("mail".to_string()),
                handed: None,
            },
        ];
        let payloads = encode(&ws);
        assert_eq!(payloads.len(), 1);
        assert_eq!(decode(&payloads[0]), ws);
    }

    #[test]
    fn duplicates_are_sent_once() {
        let r = Wakeup::Ready {
            queue: "q".to_string(),
        };
        let payloads = encode(&[r.clone(), r.clone(), due(1, 2, "q"), r.clone()]);
        assert_eq!(decode(&payloads.concat()), vec![r, due(1, 2, "q")]);
    }

    #[test]
    fn two_alike_releases_are_two_places() {
        let r = Wakeup::Released {
            place: Place::Group("g".to_string()),
            handed: None,
        };
        let payloads = encode(&[r.clone(), r.clone()]);
        assert_eq!(decode(&payloads.concat()), vec![r.clone(), r]);
    }

    #[test]
    fn large_batches_split_under_the_limit() {
        let ws: Vec<Wakeup> = (0..1_000).map(|i| due(i, i64::from(i), "queue")).collect();
        let payloads = encode(&ws);
        assert!(payloads.len() > 1);
        assert!(payloads.iter().all(|p| p.len() <= MAX_PAYLOAD));
        let back: Vec<Wakeup> = payloads.iter().flat_map(|p| decode(p)).collect();
        assert_eq!(back, ws);
    }

    #[test]
    fn oversized_and_unknown_lines_are_skipped() {
        let huge = Wakeup::Ready {
            queue: "x".repeat(MAX_PAYLOAD),
        };
        assert!(encode(&[huge]).is_empty());
        let payload = format!(
            "[\"z\",1]\nnot json\n[\"d\",1]\n{}",
            encode_one(&Wakeup::Ready {
                queue: "q".to_string()
            })
        );
        assert_eq!(
            decode(&payload),
            vec![Wakeup::Ready {
                queue: "q".to_string()
            }]
        );
    }
}

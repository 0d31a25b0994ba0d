//! Engine settings, with defaults that suit a single process on a small machine.

use std::collections::HashMap;
use std::time::Duration;

use sundial_core::Limits;

/// How the engine runs. Every field has a sensible default ([`Config::default`]).
#[derive(Debug, Clone)]
pub struct Config {
    /// Number of shards of the due index; each has its own queue loop. Fixed when a store is
    /// created: tasks remember their shard.
    pub shard_count: u32,
    /// How far ahead of now a shard loads due tasks into memory.
    pub lookahead: Duration,
    /// Most tasks one shard keeps in memory. Memory is bounded by this, not by the pending count.
    pub window_capacity: usize,
    /// Longest a shard sleeps when it knows of nothing due: the only polling, as a backstop. Each
    /// wait is shortened by up to 10 % at random so shards do not wake in step.
    pub idle_interval: Duration,
    /// Concurrent in-process handler runs per queue, unless set in `queue_concurrency`. A slot is
    /// taken before the claim's write, so the limit also bounds starts per second to about
    /// `slots / claim latency`: 256 keeps thousands of starts a second even when fsync is slow.
    /// Lower it per queue for handlers that must not run that wide.
    pub default_concurrency: usize,
    pub queue_concurrency: HashMap<String, usize>,
    /// Added to an in-process attempt's timeout to form its lease (the engine enforces the timeout
    /// itself; the lease only matters if the process dies).
    pub lease_grace: Duration,
    /// Longest a worker's poll may wait for work.
    pub max_poll_wait: Duration,
    /// Most tasks handed to one poll.
    pub max_poll_batch: usize,
    /// Tasks moved per claim round trip.
    pub claim_batch: usize,
    pub limits: Limits,
    /// Several nodes: how long a shard lease lasts without renewal (renewed every third of it). A
    /// node that stops heartbeating loses its shards within this time.
    /// How long an idempotency key of a create is remembered after its task finished (while
    /// the task is live it always is): a retry within it answers the original task.
    pub idempotency_window: Duration,
    pub shard_lease_ttl: Duration,
    /// Several nodes: the largest difference between this node's clock and the database's that
    /// start-up accepts. Smaller differences are corrected (see `clock::OffsetClock`). The same
    /// limit applies to every later measurement (see `clock_check_interval`).
    pub max_clock_skew: Duration,
    /// Several nodes: how often a running node measures its clock against the database's again.
    /// Within `max_clock_skew` the correction follows the new measurement; beyond it the node
    /// hands its shards back and leaves the membership until its clock is within the limit again.
    pub clock_check_interval: Duration,
    /// How often the engine reads the paused queues from the store, so that a pause or resume
    /// made on another node holds here within this time (one made through this engine holds at
    /// once).
    pub pause_refresh: Duration,
    /// How long finished work is kept (see [`Retention`]).
    pub retention: Retention,
    /// Push delivery: calls under way at once on this node, all receivers together.
    pub push_concurrency: usize,
    /// Push delivery: calls under way at once to one receiver (`host:port`). A slow or dead
    /// receiver holds at most this many of the node's call slots; the rest of its due tasks
    /// wait in the store while other receivers' calls go out on time.
    pub push_host_concurrency: usize,
}

/// How long finished work is kept before it is deleted, and how the deleting runs. Task
/// retentions count from `finished_at` and can be overridden per queue (`PUT /v1/queues/{q}`).
#[derive(Debug, Clone)]
pub struct Retention {
    /// `false`: nothing is ever deleted.
    pub enabled: bool,
    pub succeeded: Duration,
    pub cancelled: Duration,
    pub dead: Duration,
    /// Schedule fire records, from when they were recorded.
    pub schedule_fires: Duration,
    /// Closed workflow runs with their histories, from when they closed. A running run is
    /// never deleted.
    pub workflow_runs: Duration,
    /// Audit records, from when they were written.
    pub audit: Duration,
    /// How often a round of deletion runs.
    pub interval: Duration,
    /// Rows deleted per statement (a round runs at most 20 batches of each kind).
    pub batch: usize,
}

impl Default for Retention {
    fn default() -> Self {
        const DAY: u64 = 24 * 3600;
        Retention {
            enabled: true,
            succeeded: Duration::from_secs(7 * DAY),
            cancelled: Duration::from_secs(7 * DAY),
            dead: Duration::from_secs(30 * DAY),
            schedule_fires: Duration::from_secs(7 * DAY),
            workflow_runs: Duration::from_secs(7 * DAY),
            audit: Duration::from_secs(30 * DAY),
            interval: Duration::from_secs(5),
            batch: 500,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            shard_count: 4,
            lookahead: Duration::from_secs(5),
            window_capacity: 16_384,
            idle_interval: Duration::from_secs(30),
            default_concurrency: 256,
            queue_concurrency: HashMap::new(),
            lease_grace: Duration::from_secs(5),
            max_poll_wait: Duration::from_secs(60),
            max_poll_batch: 256,
            claim_batch: 512,
            limits: Limits::default(),
            idempotency_window: Duration::from_secs(24 * 3600),
            shard_lease_ttl: Duration::from_secs(10),
            max_clock_skew: Duration::from_secs(2),
            clock_check_interval: Duration::from_secs(60),
            pause_refresh: Duration::from_millis(500),
            retention: Retention::default(),
            push_concurrency: 1_024,
            push_host_concurrency: 64,
        }
    }
}

impl Config {
    pub fn concurrency(&self, queue: &str) -> usize {
        self.queue_concurrency
            .get(queue)
            .copied()
            .unwrap_or(self.default_concurrency)
            .max(1)
    }
}

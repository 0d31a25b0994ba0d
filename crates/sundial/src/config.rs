//! Engine settings, with defaults that suit a single process on a small machine.
//!
//! [`Config::validate`] refuses contradictory or unusable values with a [`ConfigError`] that names
//! the fields; the builder calls it before anything opens, so the engine never clamps a value
//! silently.

use std::collections::HashMap;
use std::time::Duration;

use sundial_core::Limits;
use thiserror::Error;

/// The shortest shard lease the membership arithmetic works with: a node renews every third of
/// the TTL less up to a tenth of that as jitter, suspects a silent node after half of it, and
/// PostgreSQL ends a session idle inside a transaction after half of it, which must leave room
/// for an ordinary fenced write (500 ms).
pub const MIN_SHARD_LEASE_TTL: Duration = Duration::from_secs(1);

/// A setting that cannot work, alone or with another; the message names the fields.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A count that must be at least 1 is 0.
    #[error("{field} is 0: it must be at least 1")]
    Zero { field: &'static str },
    /// A duration that must be longer than zero is zero.
    #[error("{field} is zero: it must be longer than that")]
    ZeroDuration { field: &'static str },
    /// `shard_lease_ttl` is shorter than [`MIN_SHARD_LEASE_TTL`].
    #[error(
        "shard_lease_ttl is {ttl:?}: it must be at least {min:?} (a node renews its leases every third of it, less jitter, and PostgreSQL ends a stalled transaction after half of it)"
    )]
    LeaseTtlTooShort { ttl: Duration, min: Duration },
    /// One queue's concurrency is 0.
    #[error("queue_concurrency[{queue:?}] is 0: it must be at least 1")]
    ZeroQueueConcurrency { queue: String },
    /// One receiver may hold more call slots than the whole node has.
    #[error(
        "push_host_concurrency ({host}) is larger than push_concurrency ({node}): one receiver cannot hold more slots than the node has"
    )]
    PushHostOverNode { host: usize, node: usize },
    /// A claim batch larger than the window it claims from.
    #[error(
        "claim_batch ({claim_batch}) is larger than window_capacity ({window_capacity}): a turn claims from its window, so the batch can never fill"
    )]
    ClaimBatchOverWindow {
        claim_batch: usize,
        window_capacity: usize,
    },
    /// Tasks claimed earlier than the window looks ahead: `field` is the lead
    /// (`push_claim_lead`, `hand_off_lead` or `run_claim_lead`).
    #[error(
        "{field} ({lead:?}) is longer than lookahead ({lookahead:?}): a task is claimed from the window, which holds only what is due within the look-ahead"
    )]
    LeadOverLookahead {
        field: &'static str,
        lead: Duration,
        lookahead: Duration,
    },
}

impl Config {
    /// Checks the settings against each other. Every setting with a floor or a partner is
    /// checked; the first problem found is returned.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let counts: [(&'static str, usize); 7] = [
            ("shard_count", self.shard_count as usize),
            ("window_capacity", self.window_capacity),
            ("default_concurrency", self.default_concurrency),
            ("max_poll_batch", self.max_poll_batch),
            ("claim_batch", self.claim_batch),
            ("push_concurrency", self.push_concurrency),
            ("push_host_concurrency", self.push_host_concurrency),
        ];
        for (field, n) in counts {
            if n == 0 {
                return Err(ConfigError::Zero { field });
            }
        }
        if self.retention.enabled && self.retention.batch == 0 {
            return Err(ConfigError::Zero {
                field: "retention.batch",
            });
        }
        let durations: [(&'static str, Duration); 4] = [
            ("idle_interval", self.idle_interval),
            ("max_poll_wait", self.max_poll_wait),
            ("pause_refresh", self.pause_refresh),
            ("clock_check_interval", self.clock_check_interval),
        ];
        for (field, d) in durations {
            if d.is_zero() {
                return Err(ConfigError::ZeroDuration { field });
            }
        }
        if self.retention.enabled && self.retention.interval.is_zero() {
            return Err(ConfigError::ZeroDuration {
                field: "retention.interval",
            });
        }
        if let Some((queue, _)) = self.queue_concurrency.iter().find(|(_, n)| **n == 0) {
            return Err(ConfigError::ZeroQueueConcurrency {
                queue: queue.clone(),
            });
        }
        if self.shard_lease_ttl < MIN_SHARD_LEASE_TTL {
            return Err(ConfigError::LeaseTtlTooShort {
                ttl: self.shard_lease_ttl,
                min: MIN_SHARD_LEASE_TTL,
            });
        }
        if self.push_host_concurrency > self.push_concurrency {
            return Err(ConfigError::PushHostOverNode {
                host: self.push_host_concurrency,
                node: self.push_concurrency,
            });
        }
        if self.claim_batch > self.window_capacity {
            return Err(ConfigError::ClaimBatchOverWindow {
                claim_batch: self.claim_batch,
                window_capacity: self.window_capacity,
            });
        }
        let leads = [
            ("push_claim_lead", self.push_claim_lead),
            ("hand_off_lead", self.hand_off_lead),
            ("run_claim_lead", self.run_claim_lead),
        ];
        if let Some(&(field, lead)) = leads.iter().find(|(_, lead)| *lead > self.lookahead) {
            return Err(ConfigError::LeadOverLookahead {
                field,
                lead,
                lookahead: self.lookahead,
            });
        }
        Ok(())
    }
}

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
    /// Start a due task straight for a poll already waiting for its queue (one durable write
    /// delivers it), rather than ready it for the poll to claim (two). On by default; off, every
    /// remote delivery goes through `ready`.
    pub hand_off_to_polls: bool,
    /// Hand-off: how long before its due time a task may be started for a poll that waits. The
    /// start (the attempt recorded as started at the due time, durably) then no longer delays
    /// the delivery: the poll answers at the due time, never before, after reading the task
    /// again so that a cancel that returned in between is honoured. While it waits, the task is
    /// `running` and its poll is spoken for. Zero starts at the due time. At most the
    /// look-ahead; only with `hand_off_to_polls`.
    pub hand_off_lead: Duration,
    /// Tasks moved per claim round trip.
    pub claim_batch: usize,
    pub limits: Limits,
    /// How long an idempotency key of a create is remembered after its task finished (while
    /// the task is live it always is): a retry within it answers the original task.
    pub idempotency_window: Duration,
    /// Several nodes: how long a shard lease lasts without renewal (renewed every third of it). A
    /// node that stops heartbeating loses its shards within this time. At least
    /// [`MIN_SHARD_LEASE_TTL`].
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
    /// wait in the store while other receivers' calls go out on time. A task claimed ahead
    /// (`push_claim_lead`) holds its slot while it waits for its due time, so the slots must
    /// cover a receiver's calls/s × the lead as well as its calls under way: the default (512)
    /// covers 2,000 calls/s to one receiver at the default lead (200 ms), with room for the
    /// calls under way.
    /// Below that cover the claims trail the due times and calls go out late.
    pub push_host_concurrency: usize,
    /// Push delivery: how long before its due time a push task may be claimed. The claim (the
    /// attempt recorded as started, durably) then no longer delays the call: the call waits for
    /// the due time and goes out then, never before. Zero claims at the due time. At most the
    /// look-ahead; a task claimed early holds its receiver's slot from its claim.
    pub push_claim_lead: Duration,
    /// In-process handlers: how long before its due time a task may be claimed (its attempt
    /// recorded as started at the due time). The claim's commit, which may wait behind a large
    /// write of the store's one writer, then no longer delays the handler: the run waits for
    /// the due time, never starting before it, reads the task again (a cancel that returned
    /// meanwhile is honoured: the handler is not called) and calls the handler. The shard loop
    /// does not wait for such a claim (`engine::ahead`), so the lead is what a claim may wait
    /// behind other writes; the default (40 ms) outlasts the embedded store's 1,000-task
    /// inserts on a slow disk. A task claimed ahead holds its queue's slot from its claim (at
    /// 5,000 tasks/s, 200 slots for a 40 ms lead). Zero claims at the due time. At most the
    /// look-ahead.
    pub run_claim_lead: Duration,
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
            hand_off_to_polls: true,
            hand_off_lead: Duration::from_millis(3),
            claim_batch: 512,
            limits: Limits::default(),
            idempotency_window: Duration::from_secs(24 * 3600),
            shard_lease_ttl: Duration::from_secs(10),
            max_clock_skew: Duration::from_secs(2),
            clock_check_interval: Duration::from_secs(60),
            pause_refresh: Duration::from_millis(500),
            retention: Retention::default(),
            push_concurrency: 1_024,
            push_host_concurrency: 512,
            push_claim_lead: Duration::from_millis(200),
            run_claim_lead: Duration::from_millis(40),
        }
    }
}

impl Config {
    /// The in-process concurrency of `queue` (at least 1 in a validated config).
    pub fn concurrency(&self, queue: &str) -> usize {
        self.queue_concurrency
            .get(queue)
            .copied()
            .unwrap_or(self.default_concurrency)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid() {
        assert_eq!(Config::default().validate(), Ok(()));
    }

    #[test]
    fn a_receivers_default_slots_cover_the_claim_lead_at_2000_calls_a_second() {
        // A task claimed ahead holds its receiver's slot until its due time: slots short of
        // calls/s × lead make the claims trail the due times (64 slots did at 2,000/s).
        let c = Config::default();
        let ahead = 2_000 * c.push_claim_lead.as_millis() as usize / 1_000;
        assert!(
            c.push_host_concurrency >= ahead + ahead / 4,
            "{} slots for {ahead} calls claimed ahead",
            c.push_host_concurrency
        );
    }

    #[test]
    fn each_contradiction_is_refused_naming_its_fields() {
        let cases: Vec<(Config, &str)> = vec![
            (
                Config {
                    shard_count: 0,
                    ..Config::default()
                },
                "shard_count",
            ),
            (
                Config {
                    max_poll_wait: Duration::ZERO,
                    ..Config::default()
                },
                "max_poll_wait",
            ),
            (
                Config {
                    idle_interval: Duration::ZERO,
                    ..Config::default()
                },
                "idle_interval",
            ),
            (
                Config {
                    pause_refresh: Duration::ZERO,
                    ..Config::default()
                },
                "pause_refresh",
            ),
            (
                Config {
                    window_capacity: 0,
                    ..Config::default()
                },
                "window_capacity",
            ),
            (
                Config {
                    max_poll_batch: 0,
                    ..Config::default()
                },
                "max_poll_batch",
            ),
            (
                Config {
                    default_concurrency: 0,
                    ..Config::default()
                },
                "default_concurrency",
            ),
            (
                Config {
                    queue_concurrency: HashMap::from([("q".to_string(), 0)]),
                    ..Config::default()
                },
                "queue_concurrency[\"q\"]",
            ),
            (
                Config {
                    shard_lease_ttl: Duration::from_millis(2),
                    ..Config::default()
                },
                "shard_lease_ttl",
            ),
            (
                Config {
                    push_concurrency: 8,
                    push_host_concurrency: 9,
                    ..Config::default()
                },
                "push_host_concurrency",
            ),
            (
                Config {
                    claim_batch: 100,
                    window_capacity: 10,
                    ..Config::default()
                },
                "claim_batch",
            ),
            (
                Config {
                    push_claim_lead: Duration::from_secs(6),
                    lookahead: Duration::from_secs(5),
                    ..Config::default()
                },
                "push_claim_lead",
            ),
            (
                Config {
                    hand_off_lead: Duration::from_secs(6),
                    lookahead: Duration::from_secs(5),
                    ..Config::default()
                },
                "hand_off_lead",
            ),
            (
                Config {
                    run_claim_lead: Duration::from_secs(6),
                    lookahead: Duration::from_secs(5),
                    ..Config::default()
                },
                "run_claim_lead",
            ),
            (
                Config {
                    retention: Retention {
                        batch: 0,
                        ..Retention::default()
                    },
                    ..Config::default()
                },
                "retention.batch",
            ),
            (
                Config {
                    retention: Retention {
                        interval: Duration::ZERO,
                        ..Retention::default()
                    },
                    ..Config::default()
                },
                "retention.interval",
            ),
        ];
        for (config, field) in cases {
            let e = config.validate().expect_err(field);
            assert!(e.to_string().contains(field), "{field}: {e}");
        }
    }

    #[test]
    fn retention_settings_do_not_matter_when_it_is_off() {
        let config = Config {
            retention: Retention {
                enabled: false,
                batch: 0,
                interval: Duration::ZERO,
                ..Retention::default()
            },
            ..Config::default()
        };
        assert_eq!(config.validate(), Ok(()));
    }
}

//! Several nodes sharing one store: membership, shard leases with fencing, fenced owner writes and
//! cross-node wake-ups.
//!
//! The protocol (see ARCHITECTURE.md, "Several nodes"):
//!
//! - Each node heartbeats a row of its own ([`Cluster::heartbeat`]) and learns which nodes are live.
//! - Every shard has one lease row: owner, expiry, and `range_id`, a fencing number that increases
//!   every time the owner changes. A node acquires a shard only when it is free, expired, or
//!   already its own ([`Cluster::acquire_shard`]) and renews it well before expiry.
//! - Every write a shard owner makes because it owns the shard (claiming due tasks, expiring
//!   leases of running tasks) passes the shard's [`Fence`] to the store call
//!   ([`crate::Store::claim_due`], [`crate::Store::expire_leases`]), which checks, in the same
//!   transaction, that the shard's `range_id` is still the one the owner holds. An owner that was paused past its
//!   lease and lost the shard gets [`crate::StoreError::LeaseLost`] and writes nothing.
//! - Writes that are not an owner's (create, cancel, a worker completing its own attempt) need no
//!   fence: they are conditional on the task's state and execution id as always.
//! - Wake-ups ([`Wakeup`]) travel between nodes through the database's notification channel; a lost
//!   one costs latency, never a task (the shard loop's idle backstop rescans).
//!
//! Times are parameters here as everywhere: the store never reads a clock.

use async_trait::async_trait;
use futures::stream::BoxStream;
use sundial_core::Timestamp;

use crate::{DueEntry, StoreError};

/// Proof of shard ownership: the shard and the fencing number its owner was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fence {
    pub shard: u32,
    pub range_id: i64,
}

/// A cross-node wake-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wakeup {
    /// A task of `shard` is scheduled at `entry.key.due_at` (created, retried, triggered).
    Due { shard: u32, entry: DueEntry },
    /// Tasks of `queue` became ready for workers.
    Ready { queue: String },
    /// A place of a group key or of a limited queue was freed on one node, and handed there to
    /// the waiter ranked `handed` (its due time moved by its priority; `None`: that node had no
    /// waiter for it). Another node hands it to its own best waiter when that one ranks before
    /// `handed`, so a place freed on one node reaches a waiter on another at once, in rank order,
    /// instead of at that waiter's backstop retry. The store decides every start, so a place
    /// offered on two nodes still starts only one task.
    Released { place: Place, handed: Option<i64> },
    /// A node joined or left the membership: the others look at the shard placement now rather
    /// than at their next turn (a clean shutdown hands its shards over at once, a newcomer gets
    /// its share without waiting a third of the lease TTL).
    Membership,
}

/// What a start refused for want of a place waits for (see [`Wakeup::Released`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Place {
    /// A place of an exclusive key or group key (`ClaimOutcome::Busy`).
    Group(String),
    /// A place under the queue's concurrency limit (`ClaimOutcome::QueueFull`).
    Queue(String),
}

/// A live node as the membership records it: its name and the `now` of its last heartbeat. A node
/// renews its shard leases with the `now` of the same turn, so its leases end at `last_seen` plus
/// the lease TTL: when it drops out of the live set its shards are free to take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub node: String,
    pub last_seen: Timestamp,
}

/// A shard's lease row as it stands: its holder (`None` once released), when the lease ends and
/// its fencing number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardLease {
    pub shard: u32,
    pub owner: Option<String>,
    pub expires_at: Timestamp,
    pub range_id: i64,
}

/// The membership and the shard leases as the store holds them, for operators: every node row
/// (live or not: the reader compares `last_seen` with its own time) sorted by name, and every
/// lease row sorted by shard.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterState {
    pub members: Vec<Member>,
    pub leases: Vec<ShardLease>,
}

/// What a store must offer for several nodes to share it.
#[async_trait]
pub trait Cluster: Send + Sync + 'static {
    /// The fixed number of shards, chosen when the store was first initialised: `proposed` if this
    /// is the first call ever, else the stored number (which wins).
    async fn shard_count(&self, proposed: u32) -> Result<u32, StoreError>;

    /// Records that `node` is alive at `now` and returns the nodes (including this one) whose last
    /// heartbeat is at or after `live_since`, with that heartbeat's time, sorted by name.
    async fn heartbeat(
        &self,
        node: &str,
        now: Timestamp,
        live_since: Timestamp,
    ) -> Result<Vec<Member>, StoreError>;

    /// Reads every node row and every shard lease (for operators; it writes nothing, takes no
    /// lock and decides nothing: a lease it shows may change the next moment).
    async fn cluster_state(&self) -> Result<ClusterState, StoreError>;

    /// Removes `node` from the membership (clean shutdown).
    async fn leave(&self, node: &str) -> Result<(), StoreError>;

    /// Takes or renews the lease of `shard` for `node` until `until`, if the shard is free, its
    /// lease ended before `now`, or `node` already owns it. `range_id` increases when the owner
    /// changes and stays when `node` renews. `None` when another node holds a valid lease.
    async fn acquire_shard(
        &self,
        shard: u32,
        node: &str,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<Option<Fence>, StoreError>;

    /// [`Cluster::acquire_shard`] for each of `shards` (distinct), one answer per shard in the
    /// order given. A backend should do it in one round trip: a node renews all its leases every
    /// third of the TTL. The default asks shard by shard.
    async fn acquire_shards(
        &self,
        shards: &[u32],
        node: &str,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<Vec<Option<Fence>>, StoreError> {
        let mut out = Vec::with_capacity(shards.len());
        for &shard in shards {
            out.push(self.acquire_shard(shard, node, now, until).await?);
        }
        Ok(out)
    }

    /// Gives a shard up (its lease ends at once; the next owner's `range_id` will be higher).
    async fn release_shard(&self, fence: Fence, node: &str) -> Result<(), StoreError>;

    /// Sends wake-ups to every node (best effort; coalescing allowed).
    async fn publish(&self, wakeups: Vec<Wakeup>) -> Result<(), StoreError>;

    /// The wake-ups other nodes publish, from now on. Reconnects by itself; a gap loses wake-ups,
    /// which costs latency only.
    async fn subscribe(&self) -> Result<BoxStream<'static, Wakeup>, StoreError>;

    /// The database's own time, for the clock-skew checks (at start and every
    /// `clock_check_interval`). The only place a store may read
    /// a clock, and it decides nothing about tasks.
    async fn database_time(&self) -> Result<Timestamp, StoreError>;
}

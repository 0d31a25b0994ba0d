//! Where shards run: the one seam between "a single node runs every shard" and "several nodes
//! share the store, each running the shards it holds a lease on".
//!
//! The engine asks the placement, never the cluster directly, for the three things that differ:
//! owner writes (due claims under the shard's fence, lease expiry limited to the shards held),
//! cross-node wake-ups (whether a due time or a readiness must be published to other nodes), and
//! which shard loops run here (every shard on a single node; on several, the membership loop of
//! [`crate::cluster`] starts and stops them). A shard loop carries an [`Owner`]: only the cluster
//! placement hands out `Owner::Fenced`, so a fence without a cluster cannot be represented.
//!
//! Must never decide whether a write is allowed: the store does (the fence is checked in the
//! write's own transaction).

use std::sync::Arc;

use sundial_core::{Task, Timestamp};
use sundial_store::{ClaimOutcome, DueClaim, DueEntry, Fence, Store, StoreError, Wakeup};

use crate::cluster::ClusterNode;

/// Whose owner writes a shard loop makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    /// The single node: owns every shard, writes unfenced.
    Sole,
    /// A cluster node holding the shard's lease under this fence.
    Fenced(Fence),
}

/// Why a due claim wrote nothing.
#[derive(Debug)]
pub(crate) enum ClaimError {
    /// The fence is no longer current: the shard belongs to another node; the loop must end.
    LeaseLost,
    /// Any other failure; the entries stay in the window and are tried again.
    Store(StoreError),
}

/// A fenced claim was refused: this node no longer owns the shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaseLost;

pub(crate) enum Placement {
    Single,
    Cluster(Arc<ClusterNode>),
}

impl Placement {
    pub(crate) fn is_single(&self) -> bool {
        matches!(self, Placement::Single)
    }

    /// Claims due tasks as `owner`.
    pub(crate) async fn claim(
        &self,
        store: &Arc<dyn Store>,
        owner: Owner,
        claims: Vec<DueClaim>,
        now: Timestamp,
    ) -> Result<Vec<ClaimOutcome>, ClaimError> {
        let fence = match (owner, self) {
            (Owner::Sole, _) => None,
            (Owner::Fenced(f), Placement::Cluster(_)) => Some(f),
            // A fence from a placement that hands none out: nothing may be written.
            (Owner::Fenced(_), Placement::Single) => return Err(ClaimError::LeaseLost),
        };
        let claimed = store.claim_due(claims, now, fence).await;
        claimed.map_err(|e| match e {
            StoreError::LeaseLost { .. } => ClaimError::LeaseLost,
            e => ClaimError::Store(e),
        })
    }

    /// Expires ended task leases: every shard's on a single node, the held shards' (fenced) on
    /// several.
    pub(crate) async fn expire_leases(
        &self,
        store: &Arc<dyn Store>,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<Task>, StoreError> {
        match self {
            Placement::Single => store.expire_leases(now, limit, None).await,
            Placement::Cluster(n) => n.expire_owned(store.as_ref(), now, limit).await,
        }
    }

    /// The earliest task lease expiry the reaper must look at.
    pub(crate) async fn next_lease_expiry(
        &self,
        store: &Arc<dyn Store>,
    ) -> Result<Option<Timestamp>, StoreError> {
        match self {
            Placement::Single => store.next_lease_expiry(None).await,
            Placement::Cluster(n) => n.next_owned_lease_expiry(store.as_ref()).await,
        }
    }

    /// A task of `shard` was written as scheduled at `entry.key.due_at`; `local` and
    /// `lease_until` are what this node knows of the shard. Publishes the wake-up to the other
    /// nodes when they may need it; answers whether the local loop should hear of it.
    pub(crate) fn due_written(
        &self,
        shard: u32,
        entry: &DueEntry,
        local: bool,
        lease_until: i64,
        now: Timestamp,
        publish_horizon: Timestamp,
    ) -> bool {
        let Placement::Cluster(c) = self else {
            return true;
        };
        // A task due later than the owner's next backstop rescan plus its look-ahead needs no
        // wake-up: that rescan (from the front of the shard, at most one idle interval away)
        // finds it before it is due, and a shard's next owner scans it from the front anyway.
        let worth_publishing = entry.key.due_at <= publish_horizon;
        if !local {
            if worth_publishing {
                c.publish(Wakeup::Due {
                    shard,
                    entry: entry.clone(),
                });
            }
            return false;
        }
        // This node runs the shard as far as it knows. That knowledge is only as good as its
        // lease: once the lease may have ended (this process was paused, or its renewals
        // failed), another node may have taken the shard without this one having noticed yet,
        // and its own loop can no longer claim anything there. Tell the others too, so the real
        // owner hears of the task now rather than at its idle backstop (a duplicate is
        // harmless). While the lease holds with a margin (a third of the TTL, far beyond the
        // nodes' clock differences), no other node can have acquired the shard, so any later
        // owner acquires after this task was committed and finds it by its first scan.
        let margin = (c.lease_ttl.as_millis() / 3) as i64;
        if worth_publishing && now.0 >= lease_until.saturating_sub(margin) {
            c.publish(Wakeup::Due {
                shard,
                entry: entry.clone(),
            });
        }
        true
    }

    /// Tasks of `queue` became ready: tell the other nodes' pollers, when there are others (a node
    /// that found itself alone at its last heartbeat publishes nothing, and announces every queue
    /// it knows once its next heartbeat, a third of the lease TTL later, finds another node).
    pub(crate) fn ready_written(&self, queue: &str) {
        if let Placement::Cluster(c) = self
            && !c.is_alone()
        {
            c.publish(Wakeup::Ready {
                queue: queue.to_string(),
            });
        }
    }

    /// A place of `place` was freed here and handed to the waiter ranked `handed` (`None`: to
    /// nobody): tell the other nodes, whose waiters may rank before it, when there are others.
    pub(crate) fn place_released(&self, place: sundial_store::Place, handed: Option<i64>) {
        if let Placement::Cluster(c) = self
            && !c.is_alone()
        {
            c.publish(Wakeup::Released { place, handed });
        }
    }

    /// Retention: deletes up to `limit` expired finished tasks: of every shard on a single node,
    /// of the held shards (fenced) on several.
    pub(crate) async fn purge_tasks(
        &self,
        store: &Arc<dyn Store>,
        rules: &sundial_store::RetentionRules,
        now: Timestamp,
        limit: usize,
    ) -> Result<u64, StoreError> {
        match self {
            Placement::Single => store.purge_tasks(rules, now, limit, None).await,
            Placement::Cluster(n) => n.purge_owned(store.as_ref(), rules, now, limit).await,
        }
    }

    /// Retention of the rows that carry no shard (fire records, closed workflow runs, audit
    /// records), which the holder of shard 0 deletes: `Some(None)` on a single node (no fence),
    /// `Some(Some(fence))` while this node holds shard 0 on several, `None` otherwise.
    pub(crate) fn shard_zero_fence(&self) -> Option<Option<sundial_store::Fence>> {
        match self {
            Placement::Single => Some(None),
            Placement::Cluster(n) => n.fence_of(0).map(Some),
        }
    }

    /// The cluster as the store records it (`None` on a single node).
    pub(crate) async fn cluster_view(
        &self,
        shard_count: u32,
    ) -> Result<Option<crate::cluster::ClusterView>, StoreError> {
        match self {
            Placement::Single => Ok(None),
            Placement::Cluster(n) => n.view(shard_count).await.map(Some),
        }
    }

    /// The shards this node runs now (empty on a single node, which runs all).
    pub(crate) fn owned_shards(&self) -> Vec<u32> {
        match self {
            Placement::Single => Vec::new(),
            Placement::Cluster(n) => n.owned_shards(),
        }
    }
}

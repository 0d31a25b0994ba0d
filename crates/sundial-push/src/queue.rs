//! Queue default targets: a queue whose settings name a `target` is served by Sundial itself,
//! which delivers the queue's tasks that have no target of their own to it.
//!
//! Such tasks are ordinary tasks: at their due time the shard loop makes them `ready` (never
//! earlier), and a *queue pusher* of this node claims them through the worker protocol (`poll`,
//! worker name [`PUSH_WORKER`]), exactly as a remote worker would, then calls the target and
//! completes or fails the attempt. The target is read at delivery: every node reads the queue
//! settings every [`QueuePushConfig::refresh`], so a change reaches the tasks already waiting;
//! removing the target stops the pusher and leaves the tasks `ready` for workers (none is lost);
//! a task claimed before a change is delivered to the target it was claimed for. An attempt
//! that a node does not finish (it died) is a lease that ends like any worker's.
//!
//! Calls take the same slots as push tasks ([`Sundial::push_slot`]: per receiver and per node),
//! so a slow default target holds its own slots only.
//!
//! **Architecture Invariant:** a pusher only claims through `poll`, which never claims a task
//! before it is due, of a paused queue, or that another worker holds.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sundial::{PushSlot, Sundial, Target, Task};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::executor::PushExecutor;

/// The worker name in the attempts of tasks delivered to their queue's default target.
pub const PUSH_WORKER: &str = "sundial-push";

/// Settings of the queue pushers.
#[derive(Debug, Clone)]
pub struct QueuePushConfig {
    /// How often the queue settings are read for default targets.
    pub refresh: Duration,
    /// How long one poll waits for ready tasks (a target change is seen between polls).
    pub poll_wait: Duration,
    /// Most tasks claimed by one poll.
    pub max_batch: usize,
}

impl Default for QueuePushConfig {
    fn default() -> Self {
        QueuePushConfig {
            refresh: Duration::from_secs(1),
            poll_wait: Duration::from_secs(1),
            max_batch: 64,
        }
    }
}

/// Starts the queue pushers of this node on the current runtime: one supervisor that follows the
/// queue settings and one pusher per queue with a default target. They stop when the engine
/// stops.
pub fn spawn(sundial: Sundial, exec: Arc<PushExecutor>, config: QueuePushConfig) -> JoinHandle<()> {
    tokio::spawn(supervise(sundial, exec, config))
}

async fn supervise(sundial: Sundial, exec: Arc<PushExecutor>, config: QueuePushConfig) {
    let clock = sundial.clock().clone();
    let mut pushers: HashMap<String, (watch::Sender<Option<Target>>, JoinHandle<()>)> =
        HashMap::new();
    while !sundial.is_stopping() {
        match sundial.store().list_queue_settings().await {
            Ok(all) => {
                let mut wanted: HashMap<String, Target> = all
                    .into_iter()
                    .filter_map(|q| q.config.target.map(|t| (q.queue, t)))
                    .collect();
                pushers.retain(|queue, (tx, handle)| match wanted.remove(queue) {
                    Some(t) => {
                        tx.send_if_modified(|cur| {
                            let changed = cur.as_ref() != Some(&t);
                            *cur = Some(t.clone());
                            changed
                        });
                        !handle.is_finished()
                    }
                    None => {
                        // Removed: the pusher ends after its current poll; the tasks wait ready.
                        tx.send_replace(None);
                        false
                    }
                });
                for (queue, target) in wanted {
                    let (tx, rx) = watch::channel(Some(target));
                    let handle = tokio::spawn(serve(
                        sundial.clone(),
                        exec.clone(),
                        queue.clone(),
                        rx,
                        config.clone(),
                    ));
                    pushers.insert(queue, (tx, handle));
                }
            }
            Err(e) => tracing::warn!(error = %e, "reading the queue settings failed; retrying"),
        }
        clock
            .sleep_until(clock.now().saturating_add(config.refresh))
            .await;
    }
    for (_, (tx, _)) in pushers {
        tx.send_replace(None);
    }
}

/// Delivers the ready tasks of `queue` to its default target until the target is removed or
/// the engine stops.
async fn serve(
    sundial: Sundial,
    exec: Arc<PushExecutor>,
    queue: String,
    target: watch::Receiver<Option<Target>>,
    config: QueuePushConfig,
) {
    let clock = sundial.clock().clone();
    let mut backoff = Duration::from_millis(100);
    loop {
        if sundial.is_stopping() {
            return;
        }
        let Some(current) = target.borrow().clone() else {
            return;
        };
        let Some(host) = sundial_core::authority(&current.url) else {
            tracing::warn!(queue, url = %current.url, "default target without a host; not served");
            return;
        };
        // A slot first (so claimed tasks never wait for one), then as many more as are free.
        let Ok(first) = sundial.push_slot(&host).await else {
            return;
        };
        let mut slots = vec![first];
        while slots.len() < config.max_batch.max(1) {
            match sundial.try_push_slot(&host) {
                Some(s) => slots.push(s),
                None => break,
            }
        }
        let tasks = match sundial
            .poll(
                &queue,
                Some(PUSH_WORKER.to_string()),
                None,
                slots.len(),
                config.poll_wait,
            )
            .await
        {
            Ok(t) => {
                backoff = Duration::from_millis(100);
                t
            }
            Err(e) => {
                drop(slots);
                tracing::warn!(queue, error = %e, "polling for the queue's default target failed");
                clock.sleep_until(clock.now().saturating_add(backoff)).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        for (task, slot) in tasks.into_iter().zip(slots.drain(..)) {
            let sundial = sundial.clone();
            let exec = exec.clone();
            let target = current.clone();
            tokio::spawn(deliver(sundial, exec, target, task, slot));
        }
    }
}

/// One call under `slot`, which is released as soon as the call is over: keeping the answer
/// and the outcome (durable writes) does not hold the receiver's slots.
async fn deliver(
    sundial: Sundial,
    exec: Arc<PushExecutor>,
    target: Target,
    task: Task,
    slot: PushSlot,
) {
    let Some(execution) = task.execution_id else {
        return;
    };
    let d = exec.deliver_to(&target, &task, execution).await;
    drop(slot);
    let sundial = &sundial;
    // The answer and the outcome are written together (the answer's write issued first), so
    // they share one group commit instead of two commits one after the other.
    let keep_answer = exec.record(sundial, &task, execution, &d);
    let record_outcome = async {
        match d.outcome.clone() {
            Ok(result) => sundial.complete(task.id, execution, result).await,
            Err(e) => sundial.fail_with(task.id, execution, e).await,
        }
    };
    let ((), res) = tokio::join!(keep_answer, record_outcome);
    if let Err(e) = res {
        tracing::debug!(task = %task.id, error = %e, "push result not recorded");
    }
}

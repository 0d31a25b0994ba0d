//! The engine's metric series that exist before their first event: counters are registered at 0
//! so that a rate or an alert over them has data from the start (a series that appears only
//! with its first increment reads "no data" until then, and its first increase is lost).
//!
//! Owns the list of per-queue and per-shard counters the engine emits; never records an event.
//! Labels are bounded: a queue, a shard, never a kind, an attempt or an id.

/// Registers, at 0, the per-queue counters of the engine (created, debounced, rate-limited and
/// queue-limited claims, polls that skipped their look, succeeded, cancelled, dead,
/// failed attempts, retries, lease expiries) for `queue`. Registering again changes nothing.
pub fn register_queue_metrics(queue: &str) {
    for name in [
        "sundial_task_created_total",
        "sundial_task_debounced_total",
        "sundial_rate_limited_total",
        "sundial_queue_limited_total",
        "sundial_poll_looks_skipped_total",
        "sundial_task_succeeded_total",
        "sundial_task_cancelled_total",
        "sundial_task_dead_total",
        "sundial_task_failures_total",
        "sundial_task_retries_total",
        "sundial_lease_expiries_total",
    ] {
        metrics::counter!(name, "namespace" => sundial_core::namespace::namespace_of(queue).to_string(), "queue" => sundial_core::namespace::local(queue).to_string()).increment(0);
    }
}

/// Registers, at 0, the engine's counters without a queue: the reaper's restarts, and each
/// shard's loop restarts and due-index scans.
pub(crate) fn register_engine_metrics(shards: usize) {
    metrics::counter!("sundial_reaper_restarts_total").increment(0);
    for shard in 0..shards {
        metrics::counter!("sundial_shard_loop_restarts_total", "shard" => shard.to_string())
            .increment(0);
        metrics::counter!("sundial_store_scans_total", "shard" => shard.to_string()).increment(0);
    }
}

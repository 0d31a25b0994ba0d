//! Idle reads: with many tasks pending a day ahead and nothing due, how often does the engine ask
//! the store anything? The store is wrapped in a [`CountingStore`]; counters are reset after a
//! short warm-up and read after `--secs`. With `--database-url` the engine runs as the single node
//! of a cluster on PostgreSQL, and its cluster calls (heartbeats, shard-lease renewals, fenced
//! writes, wake-ups) are counted too.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use sundial::Sundial;
use sundial_store_postgres::{PostgresOptions, PostgresStore};

use crate::common::{Common, DataDir, PreloadOrder, Stopwatch, preload, print_rss};
use crate::counting::{Access, CountingCluster, counting_store};

#[derive(Debug, Clone, Args)]
pub struct IdleArgs {
    /// Tasks pending 24-48 hours ahead.
    #[arg(long, default_value_t = 1_000_000)]
    pub pending: u64,
    /// Seconds measured (after the warm-up).
    #[arg(long, default_value_t = 180)]
    pub secs: u64,
    /// Order of the preload's due times.
    #[arg(long, value_enum, default_value_t = PreloadOrder::Random)]
    pub preload_order: PreloadOrder,
    /// Seconds after start before counting begins.
    #[arg(long, default_value_t = 5)]
    pub warmup_secs: u64,
}

pub async fn run(common: &Common, args: &IdleArgs) -> Result<()> {
    let dir = DataDir::new(common)?;
    let (counting, sundial) = match &common.database_url {
        None => {
            println!(
                "idle: {} pending, {}s measured; data dir {}, shards {}",
                args.pending,
                args.secs,
                dir.path().display(),
                common.shards
            );
            let store = common.open_store(dir.path())?;
            let (counted, counting) = counting_store(Arc::new(store), common.shards);
            let sundial = Sundial::builder()
                .config(common.config())
                .with_store(counted)?;
            (counting, sundial)
        }
        Some(url) => {
            // The single node of a cluster on PostgreSQL: its store calls and its cluster calls
            // (membership, shard leases, fenced writes, wake-ups) are all counted.
            let store = Arc::new(
                PostgresStore::connect(
                    url,
                    PostgresOptions {
                        schema: common.database_schema.clone(),
                        ..PostgresOptions::default()
                    },
                )
                .await
                .context("connect to PostgreSQL")?,
            );
            let (counted, counting) = counting_store(store.clone(), common.shards);
            let cluster = Arc::new(CountingCluster {
                inner: store.clone(),
                counter: counting.clone(),
            });
            let sundial = Sundial::builder()
                .config(common.config())
                .join_cluster(counted, cluster, "bench-idle")
                .await
                .context("join the cluster")?;
            println!(
                "idle: {} pending, {}s measured; PostgreSQL schema {}, one node, shards {}, shard lease TTL {:?}",
                args.pending,
                args.secs,
                common.database_schema,
                sundial.config().shard_count,
                sundial.config().shard_lease_ttl
            );
            (counting, sundial)
        }
    };
    preload(&sundial, args.pending, 1_000, 4, args.preload_order).await?;
    print_rss("after the preload");

    let engine = sundial.start();
    tokio::time::sleep(Duration::from_secs(args.warmup_secs)).await;
    counting.reset();
    let watch = Stopwatch::start();
    tokio::time::sleep(Duration::from_secs(args.secs)).await;
    let counts = counting.snapshot();
    let minutes = watch.elapsed().as_secs_f64() / 60.0;
    engine.shutdown(Duration::from_secs(5)).await;

    println!("  store calls over {:.2} min while idle:", minutes);
    let mut reads = 0u64;
    let mut writes = 0u64;
    for ((m, shard), n) in &counts {
        let who = match shard {
            Some(s) => format!("shard {s}"),
            None => "engine-wide".to_string(),
        };
        println!(
            "    {:<18} {:<12} {:>6} calls  {:>6.2}/min  ({:?})",
            m.name(),
            who,
            n,
            *n as f64 / minutes,
            m.access()
        );
        match m.access() {
            Access::Read => reads += n,
            Access::Write => writes += n,
        }
    }
    let shards = sundial.config().shard_count.max(1);
    for s in 0..shards {
        let r: u64 = counts
            .iter()
            .filter(|((m, sh), _)| *sh == Some(s) && m.access() == Access::Read)
            .map(|(_, n)| n)
            .sum();
        println!("  shard {s}: {:.2} reads/min", r as f64 / minutes);
    }
    println!(
        "  total: {:.2} reads/min ({:.2} per shard), {:.2} writes/min (the lease reaper's sweeps; with PostgreSQL also the node's heartbeats and shard-lease renewals)",
        reads as f64 / minutes,
        reads as f64 / minutes / f64::from(shards),
        writes as f64 / minutes
    );
    print_rss("at the end");
    Ok(())
}

//! Embedding the kernel in a program: open the embedded store, register a handler, schedule a
//! task two seconds ahead, cancel another one, run the engine until the first has run, shut down.
//!
//! ```sh
//! cargo run -p sundial --example embed            # store in a fresh temporary directory
//! cargo run -p sundial --example embed -- ./data  # or in ./data (tasks survive a restart)
//! ```

use std::time::Duration;

use sundial::{HandlerError, Sundial, TaskContext, TaskSpec};
use tokio::sync::mpsc;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let temp = tempfile::tempdir()?;
    let dir = match std::env::args().nth(1) {
        Some(d) => d.into(),
        None => temp.path().to_path_buf(),
    };
    let sundial = Sundial::open(&dir).await?; // embedded store, no setup

    let (done_tx, mut done) = mpsc::unbounded_channel();
    sundial.register("order.close", move |task: TaskContext| {
        let done_tx = done_tx.clone();
        async move {
            println!(
                "closing order {} (attempt {})",
                task.payload()["order"],
                task.attempt()
            );
            let _ = done_tx.send(());
            Ok::<(), HandlerError>(())
        }
    });

    let id = sundial
        .schedule(
            TaskSpec::new("order.close")
                .key("order-123") // at most one live task per (queue, key)
                .payload(serde_json::json!({"order": 123}))
                .delay(Duration::from_secs(2)),
        )
        .await?; // returns once the task is on disk
    println!("scheduled {id}, due in 2s");

    let other = sundial
        .schedule(
            TaskSpec::new("order.close")
                .key("order-124")
                .payload(serde_json::json!({"order": 124}))
                .delay(Duration::from_secs(30 * 60)),
        )
        .await?;
    sundial.cancel(other).await?; // cancel wins: it never starts afterwards
    println!("cancelled {other}");

    let running = sundial.start(); // shard loops and the lease reaper
    done.recv().await;
    running.shutdown(Duration::from_secs(10)).await; // drain handlers, then stop
    println!(
        "state of {id}: {:?}",
        sundial.get(id).await?.map(|t| t.state)
    );
    Ok(())
}

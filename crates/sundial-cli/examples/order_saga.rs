//! An order fulfilment saga, run as a **remote worker** of a `sundial server`.
//!
//! ```sh
//! sundial server                                                          # terminal 1
//! cargo run --release --example order_saga -- --server http://127.0.0.1:7373   # terminal 2
//! ```
//!
//! `--server` defaults to `SUNDIAL_SERVER` (as for the `sundial` commands), then
//! `http://127.0.0.1:7373`. Activities print to stdout; logs go to stderr (`RUST_LOG`, default
//! `warn`), coloured only on a terminal.
//!
//! Workflow type `order`, input `{"order_id": "o-1", "amount": 4200, "payment_timeout": "10m"}`
//! (`amount` in cents, `payment_timeout` a duration like every other of the API: `"30s"`,
//! `"10m"`; a number is read as seconds; default `"30m"`):
//!
//! 1. `charge`: ask the payment provider for the amount (retried up to 5 times);
//! 2. wait for the signal `paid` for at most `payment_timeout`; on timeout compensate:
//!    `release_stock`, `notify`, result `{"outcome": "compensated", ...}`;
//! 3. `ship` (this demo's carrier refuses amounts over 100,000 cents, a permanent error); when
//!    shipping fails compensate the same way;
//! 4. `notify` the customer; result `{"outcome": "shipped", "tracking": ...}`.
//!
//! The server keeps all state: stop this worker at any point and start it again (or another
//! one), and the run continues where its history says it is. Activities print what they do.

use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sundial_workflow::remote::{RemoteActivityContext, RemoteWorker};
use sundial_workflow::{ActivityError, RetryPolicy, WorkflowContext, WorkflowError};

#[derive(Parser, Debug)]
#[command(about = "Remote worker for the `order` saga workflow")]
struct Args {
    /// The sundial server's base URL.
    #[arg(long, env = "SUNDIAL_SERVER", default_value = "http://127.0.0.1:7373")]
    server: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Order {
    order_id: String,
    /// Cents.
    amount: u64,
    /// How long to wait for the `paid` signal: a duration string (`"10m"`) or seconds.
    #[serde(default = "default_payment_timeout")]
    payment_timeout: PaymentTimeout,
}

/// A duration as the API writes them (`"90s"`, `"10m"`), or a number of seconds.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
enum PaymentTimeout {
    Seconds(u64),
    Text(String),
}

impl PaymentTimeout {
    fn duration(&self) -> Result<Duration, WorkflowError> {
        match self {
            PaymentTimeout::Seconds(s) => Ok(Duration::from_secs(*s)),
            PaymentTimeout::Text(t) => sundial_server::duration::parse(t)
                .map_err(|e| WorkflowError::failed(format!("payment_timeout: {e}"))),
        }
    }
}

fn default_payment_timeout() -> PaymentTimeout {
    PaymentTimeout::Text("30m".into())
}

/// What the `paid` signal may carry (anything, or nothing).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Paid {
    #[serde(default)]
    reference: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Outcome {
    order_id: String,
    /// `shipped` or `compensated`.
    outcome: String,
    payment: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    tracking: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

/// The workflow. Deterministic: everything that touches the world is an activity.
async fn order(ctx: WorkflowContext, order: Order) -> Result<Outcome, WorkflowError> {
    let payment: String = ctx
        .activity("charge", &order)
        .retry(RetryPolicy::exponential(5))
        .await?;
    let paid = ctx
        .signal::<Option<Paid>>("paid")
        .timeout(order.payment_timeout.duration()?)
        .await?;
    if paid.is_none() {
        return compensate(&ctx, order, payment, "payment timed out".into()).await;
    }
    let shipped: Result<String, WorkflowError> = ctx
        .activity("ship", &order)
        .retry(RetryPolicy::exponential(3))
        .await;
    let tracking = match shipped {
        Ok(t) => t,
        Err(e) if e.is_activity_failure() => {
            let reason = format!("shipping failed: {}", e.message());
            return compensate(&ctx, order, payment, reason).await;
        }
        Err(e) => return Err(e),
    };
    let _: () = ctx
        .activity(
            "notify",
            &json!({"order_id": order.order_id, "message": format!("shipped: {tracking}")}),
        )
        .await?;
    Ok(Outcome {
        order_id: order.order_id,
        outcome: "shipped".into(),
        payment,
        tracking: Some(tracking),
        reason: None,
    })
}

/// Undo what was done: put the stock back and tell the customer.
async fn compensate(
    ctx: &WorkflowContext,
    order: Order,
    payment: String,
    reason: String,
) -> Result<Outcome, WorkflowError> {
    let _: () = ctx.activity("release_stock", &order).await?;
    let _: () = ctx
        .activity(
            "notify",
            &json!({"order_id": order.order_id, "message": format!("cancelled: {reason}")}),
        )
        .await?;
    Ok(Outcome {
        order_id: order.order_id,
        outcome: "compensated".into(),
        payment,
        tracking: None,
        reason: Some(reason),
    })
}

fn register(worker: &mut RemoteWorker) -> anyhow::Result<()> {
    worker.register("order", order)?;
    worker.register_activity(
        "charge",
        |ctx: RemoteActivityContext, o: Order| async move {
            println!(
                "charge: {} cents for order {} (attempt {})",
                o.amount,
                o.order_id,
                ctx.attempt()
            );
            Ok::<_, ActivityError>(format!("pay-{}-{}", o.order_id, ctx.cmd()))
        },
    )?;
    worker.register_activity(
        "release_stock",
        |_ctx: RemoteActivityContext, o: Order| async move {
            println!("release_stock: order {}", o.order_id);
            Ok::<_, ActivityError>(())
        },
    )?;
    worker.register_activity("ship", |_ctx: RemoteActivityContext, o: Order| async move {
        if o.amount > 100_000 {
            println!("ship: order {} refused by the carrier", o.order_id);
            return Err(ActivityError::permanent(
                "the carrier refuses parcels worth over 1,000.00",
            ));
        }
        println!("ship: order {}", o.order_id);
        Ok(format!("TRACK-{}", o.order_id))
    })?;
    worker.register_activity(
        "notify",
        |_ctx: RemoteActivityContext, n: Value| async move {
            println!("notify: order {}: {}", n["order_id"], n["message"]);
            Ok::<_, ActivityError>(())
        },
    )?;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let args = Args::parse();
    let mut worker = RemoteWorker::new(&args.server).worker_name("order-saga-example");
    register(&mut worker)?;
    println!(
        "order_saga: serving workflow type `order` for {}",
        args.server
    );
    tokio::select! {
        r = worker.run() => r.context("worker stopped")?,
        _ = tokio::signal::ctrl_c() => println!("order_saga: stopping"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payment_timeout_takes_a_duration_string_or_seconds() {
        let o: Order =
            serde_json::from_value(json!({"order_id": "o", "amount": 1, "payment_timeout": "10m"}))
                .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            o.payment_timeout.duration().ok(),
            Some(Duration::from_secs(600))
        );
        let o: Order =
            serde_json::from_value(json!({"order_id": "o", "amount": 1, "payment_timeout": 5}))
                .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            o.payment_timeout.duration().ok(),
            Some(Duration::from_secs(5))
        );
        let o: Order = serde_json::from_value(json!({"order_id": "o", "amount": 1}))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            o.payment_timeout.duration().ok(),
            Some(Duration::from_secs(1800))
        );
        let o: Order = serde_json::from_value(
            json!({"order_id": "o", "amount": 1, "payment_timeout": "soon"}),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(o.payment_timeout.duration().is_err());
    }
}

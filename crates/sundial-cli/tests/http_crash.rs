//! `kill -9` of the server while clients are creating tasks, then a restart on the same data
//! directory: every task whose create was answered `201` is delivered to a polling worker exactly
//! as it was created, and none before its `run_at`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic on failure

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Server, now_ms, rfc3339_ms};
use serde_json::json;
use sundial_server::wire::{CreateTask, StateView, TaskView};

const CREATORS: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_under_load_loses_no_acknowledged_task() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path());
    let client = server.client();

    let acked: Arc<Mutex<HashMap<uuid::Uuid, TaskView>>> = Arc::default();
    let issued = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut creators = Vec::new();
    for w in 0..CREATORS {
        let (client, acked, issued, stop) =
            (client.clone(), acked.clone(), issued.clone(), stop.clone());
        creators.push(tokio::spawn(async move {
            let mut seed = 0x2545_F491_4F6C_DD1D_u64 ^ (w as u64 + 1);
            while !stop.load(Ordering::Relaxed) {
                let n = issued.fetch_add(1, Ordering::Relaxed);
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                // Due between now and 2.5 s from now, so that after the restart some tasks are
                // overdue and some are still in the future.
                let run_at = now_ms() + (seed % 2_500) as i64;
                let req = CreateTask {
                    queue: Some("crash".into()),
                    key: Some(format!("c-{n}")),
                    payload: Some(
                        json!({"n": n, "writer": w, "pad": "p".repeat((seed % 512) as usize)}),
                    ),
                    run_at: Some(sundial_server::time::format(
                        sundial::Timestamp::from_millis(run_at),
                    )),
                    ..CreateTask::new(if n % 2 == 0 { "even" } else { "odd" })
                };
                match client.create(&req).await {
                    Ok(t) => {
                        acked.lock().unwrap().insert(t.id, t);
                    }
                    // The server died under us: this create's fate is unknown (it may or may not
                    // have been stored), which the test allows.
                    Err(_) => break,
                }
            }
        }));
    }

    // Let a good number of creates through, then kill the server mid-stream. The bound only
    // decides when to give up waiting; the count is what matters.
    let give_up = now_ms() + 60_000;
    while acked.lock().unwrap().len() < 400 {
        assert!(now_ms() < give_up, "creates are not going through");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.kill9();
    stop.store(true, Ordering::Relaxed);
    for c in creators {
        c.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    let issued = issued.load(Ordering::Relaxed);
    assert!(acked.len() >= 400);

    // Restart on the same directory and drain the queue with a polling worker.
    let server = Server::start(dir.path());
    let client = server.client();
    let mut delivered: HashMap<uuid::Uuid, i64> = HashMap::new();
    let give_up = now_ms() + 120_000;
    while acked.keys().any(|id| !delivered.contains_key(id)) {
        assert!(
            now_ms() < give_up,
            "{} of {} acknowledged tasks were not delivered",
            acked
                .keys()
                .filter(|id| !delivered.contains_key(id))
                .count(),
            acked.len()
        );
        let polled = client
            .poll("crash", "checker", 100, Duration::from_secs(5), None)
            .await
            .unwrap();
        let received = now_ms();
        for t in polled.tasks {
            assert_eq!(t.attempt, 1, "delivered once: {t:?}");
            assert!(
                received >= rfc3339_ms(&t.run_at),
                "delivered before its run_at: {t:?}"
            );
            match acked.get(&t.id) {
                Some(a) => {
                    assert_eq!(t.kind, a.kind);
                    assert_eq!(t.key, a.key);
                    assert_eq!(t.queue, a.queue);
                    assert_eq!(t.payload, a.payload);
                    assert_eq!(t.run_at, a.run_at);
                    assert_eq!(t.max_attempts, a.max_attempts);
                }
                None => {
                    // Created by a request that was in flight at the kill: it must be one the
                    // test issued, with the right shape.
                    let n = t.payload["n"].as_u64().expect("payload n") as usize;
                    assert!(n < issued, "unknown task {t:?}");
                    assert_eq!(t.key.as_deref(), Some(format!("c-{n}").as_str()));
                }
            }
            assert!(
                delivered.insert(t.id, received).is_none(),
                "delivered twice"
            );
            client.complete(t.id, t.execution_id, None).await.unwrap();
        }
    }
    let extras = delivered.len() - acked.len();
    eprintln!(
        "acknowledged {}, issued {issued}, delivered {} ({extras} from creates in flight at the kill)",
        acked.len(),
        delivered.len()
    );
    assert!(
        extras <= CREATORS,
        "{extras} unacknowledged tasks delivered; at most one per creator was in flight"
    );

    // The server's own record agrees: each started at or after its due time.
    for (id, a) in acked.iter().take(200) {
        let t = client.get(&id.to_string()).await.unwrap();
        assert_eq!(t.state, StateView::Succeeded);
        assert_eq!(t.payload, a.payload);
        let started = rfc3339_ms(t.started_at.as_deref().unwrap());
        assert!(started >= rfc3339_ms(&a.run_at), "started early: {t:?}");
    }
}

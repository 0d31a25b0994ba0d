//! Flow control across three `sundial server` processes on one PostgreSQL schema: a group limit
//! holds for workers polling every node at once (checked by a counter of tasks in hand),
//! creates under one throttle key sent to all three nodes at once admit exactly one task,
//! creates under one debounce key leave exactly one pending task, a rate limit spaces the
//! starts of tasks created and polled on every node, and a queue's concurrency limit (set on
//! one node) holds for workers taking several tasks per poll on every node.
//!
//! Needs `SUNDIAL_TEST_DATABASE_URL` (skipped without it, failed without it when
//! `SUNDIAL_REQUIRE_POSTGRES=1`; see `common/pg.rs`). Every wait is bounded; nothing asserts
//! speed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::ffi::OsString;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{Backend, Launch, Server, Storage};
use serde_json::{Value, json};

const NODES: usize = 3;

fn nodes(storage: &Storage) -> Vec<Server> {
    (0..NODES)
        .map(|i| {
            let launch = Launch {
                extra: ["--node-id", &format!("flow-{i}")]
                    .map(OsString::from)
                    .to_vec(),
                ..Launch::default()
            };
            Server::launch(storage, &launch)
        })
        .collect()
}

async fn post(url: &str, body: Value) -> (u16, Value) {
    let http = sundial_cli::http_client_builder().build().unwrap();
    let resp = http
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("send");
    let status = resp.status().as_u16();
    let body = resp.json().await.unwrap_or(Value::Null);
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_keep_a_group_limit_a_throttle_a_debounce_a_rate_limit_and_a_queue_limit() {
    let Some(storage) = Storage::new(Backend::Postgres) else {
        return;
    };
    let servers = nodes(&storage);
    let urls: Vec<String> = servers.iter().map(|s| s.url.clone()).collect();

    // Throttle: 99 creates spread over the nodes, all at once.
    let creates = (0..99).map(|n| {
        let url = format!("{}/v1/tasks", urls[n % NODES]);
        tokio::spawn(async move {
            post(
                &url,
                json!({"kind": "digest", "queue": "mail", "delay": "1h", "payload": {"n": n},
                       "throttle": {"key": "user-42", "per": "10m"}}),
            )
            .await
        })
    });
    let mut answers = Vec::new();
    for c in creates {
        answers.push(c.await.unwrap());
    }
    let admitted: Vec<_> = answers.iter().filter(|(s, _)| *s == 201).collect();
    assert_eq!(admitted.len(), 1, "exactly one admitted: {answers:?}");
    let id = admitted[0].1["id"].clone();
    assert!(
        answers
            .iter()
            .all(|(s, t)| (*s == 200 || *s == 201) && t["id"] == id),
        "every other create answered with the admitted task: {answers:?}"
    );
    assert_eq!(common::count(&servers[0].client()).await, 1);

    // Debounce: 99 creates under one key spread over the nodes, all at once, leave one pending
    // task.
    let creates = (0..99).map(|n| {
        let url = format!("{}/v1/tasks", urls[n % NODES]);
        tokio::spawn(async move {
            post(
                &url,
                json!({"kind": "reindex", "queue": "search", "payload": {"n": n},
                       "debounce": {"key": "doc-42", "delay": "1h"}}),
            )
            .await
        })
    });
    let mut answers = Vec::new();
    for c in creates {
        answers.push(c.await.unwrap());
    }
    let stored: Vec<_> = answers.iter().filter(|(s, _)| *s == 201).collect();
    assert_eq!(stored.len(), 1, "exactly one stored: {answers:?}");
    let id = stored[0].1["id"].clone();
    assert!(
        answers
            .iter()
            .all(|(s, t)| (*s == 200 || *s == 201) && t["id"] == id),
        "every other create replaced the pending task: {answers:?}"
    );
    assert_eq!(common::count(&servers[0].client()).await, 2);

    // Group limit: 24 tasks of one group, limit 3, and four workers on each node.
    const TASKS: usize = 24;
    const LIMIT: usize = 3;
    for n in 0..TASKS {
        let (status, t) = post(
            &format!("{}/v1/tasks", urls[n % NODES]),
            json!({"kind": "work", "queue": "grp", "payload": {"n": n},
                   "concurrency": {"key": "acct", "limit": LIMIT}}),
        )
        .await;
        assert_eq!(status, 201, "{t}");
    }
    let in_hand = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for w in 0..NODES * 4 {
        let client = servers[w % NODES].client();
        let (in_hand, most, done) = (in_hand.clone(), most.clone(), done.clone());
        workers.push(tokio::spawn(async move {
            // Bounded: 60 s of polling at most.
            for _ in 0..600 {
                if done.load(Ordering::SeqCst) >= TASKS {
                    return;
                }
                let got = client
                    .poll("grp", &format!("w{w}"), 1, Duration::from_millis(100), None)
                    .await
                    .unwrap();
                for t in got.tasks {
                    let now = in_hand.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    // Out of hand before the completion is sent: a task started elsewhere after
                    // the complete commits is not counted against this one.
                    in_hand.fetch_sub(1, Ordering::SeqCst);
                    client.complete(t.id, t.execution_id, None).await.unwrap();
                    done.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
    assert_eq!(done.load(Ordering::SeqCst), TASKS, "every task ran once");
    let most = most.load(Ordering::SeqCst);
    assert!(most <= LIMIT, "{most} of the group in hand at once");
    assert!(most >= 2, "the limit let several run at once ({most})");

    // Rate limit: 8 tasks under one key, 5 per second (one per 200 ms), created on every node
    // and polled from every node: the last becomes ready at least 7 intervals after the first,
    // which became ready after `began` (read on the clock the servers read).
    const RATED: usize = 8;
    let began = sundial::Clock::now(&sundial::SystemClock);
    for n in 0..RATED {
        let (status, t) = post(
            &format!("{}/v1/tasks", urls[n % NODES]),
            json!({"kind": "call", "queue": "rated", "payload": {"n": n},
                   "rate": {"key": "api", "limit": 5, "per": "1s"}}),
        )
        .await;
        assert_eq!(status, 201, "{t}");
    }
    let done = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for w in 0..NODES * 2 {
        let client = servers[w % NODES].client();
        let done = done.clone();
        workers.push(tokio::spawn(async move {
            for _ in 0..600 {
                if done.load(Ordering::SeqCst) >= RATED {
                    return;
                }
                let got = client
                    .poll(
                        "rated",
                        &format!("r{w}"),
                        4,
                        Duration::from_millis(100),
                        None,
                    )
                    .await
                    .unwrap();
                for t in got.tasks {
                    client.complete(t.id, t.execution_id, None).await.unwrap();
                    done.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
    assert_eq!(
        done.load(Ordering::SeqCst),
        RATED,
        "every rated task ran once"
    );
    let took = sundial::Clock::now(&sundial::SystemClock).0 - began.0;
    assert!(
        took >= 1_400,
        "8 starts at 5/s over three nodes took {took} ms"
    );

    // Workers away: 5 tasks under another key, 5 per second, become ready at their turns while
    // nobody polls. Workers on every node then come back to the pile, asking for 4 per poll,
    // and still start them one turn (200 ms) apart: the turn is taken at the poll, cluster-wide.
    const AWAY: usize = 5;
    let mut away = Vec::new();
    for n in 0..AWAY {
        let (status, t) = post(
            &format!("{}/v1/tasks", urls[n % NODES]),
            json!({"kind": "call", "queue": "rated-away", "payload": {"n": n},
                   "rate": {"key": "api-away", "limit": 5, "per": "1s"}}),
        )
        .await;
        assert_eq!(status, 201, "{t}");
        away.push(t["id"].as_str().unwrap().to_string());
    }
    let http = sundial_cli::http_client_builder().build().unwrap();
    for id in &away {
        let mut state = String::new();
        for _ in 0..200 {
            let t: Value = http
                .get(format!("{}/v1/tasks/{id}", urls[0]))
                .send()
                .await
                .expect("send")
                .json()
                .await
                .unwrap();
            state = t["state"].as_str().unwrap_or_default().to_string();
            if state == "ready" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(
            state, "ready",
            "task {id} became ready with no worker polling"
        );
    }
    let starts = Arc::new(std::sync::Mutex::new(Vec::<jiff::Timestamp>::new()));
    let mut workers = Vec::new();
    for w in 0..NODES * 2 {
        let client = servers[w % NODES].client();
        let starts = starts.clone();
        workers.push(tokio::spawn(async move {
            for _ in 0..600 {
                if starts.lock().unwrap().len() >= AWAY {
                    return;
                }
                let got = client
                    .poll(
                        "rated-away",
                        &format!("a{w}"),
                        4,
                        Duration::from_millis(100),
                        None,
                    )
                    .await
                    .unwrap();
                for t in got.tasks {
                    // The lease ends the task's timeout (the same for all) after its start.
                    let started: jiff::Timestamp = t.lease_expires_at.parse().unwrap();
                    starts.lock().unwrap().push(started);
                    client.complete(t.id, t.execution_id, None).await.unwrap();
                }
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
    let mut starts = starts.lock().unwrap().clone();
    assert_eq!(starts.len(), AWAY, "every task taken once after the break");
    starts.sort();
    for pair in starts.windows(2) {
        let gap = pair[1].duration_since(pair[0]).as_millis();
        assert!(
            gap >= 200,
            "takes {gap} ms apart after the workers came back (one turn is 200 ms): {starts:?}"
        );
    }

    // Queue limit: set on one node, 3 at once for the whole queue; 24 tasks, workers on every
    // node asking for 2 per poll.
    const QUEUED: usize = 24;
    const QUEUE_LIMIT: usize = 3;
    let http = sundial_cli::http_client_builder().build().unwrap();
    let resp = http
        .put(format!("{}/v1/queues/qlim", urls[1]))
        .header("content-type", "application/json")
        .body(json!({"concurrency": QUEUE_LIMIT}).to_string())
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status().as_u16(), 200);
    for n in 0..QUEUED {
        let (status, t) = post(
            &format!("{}/v1/tasks", urls[n % NODES]),
            json!({"kind": "work", "queue": "qlim", "payload": {"n": n}}),
        )
        .await;
        assert_eq!(status, 201, "{t}");
    }
    let in_hand = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for w in 0..NODES * 3 {
        let client = servers[w % NODES].client();
        let (in_hand, most, done) = (in_hand.clone(), most.clone(), done.clone());
        workers.push(tokio::spawn(async move {
            for _ in 0..600 {
                if done.load(Ordering::SeqCst) >= QUEUED {
                    return;
                }
                let got = client
                    .poll(
                        "qlim",
                        &format!("q{w}"),
                        2,
                        Duration::from_millis(100),
                        None,
                    )
                    .await
                    .unwrap();
                let n = got.tasks.len();
                let now = in_hand.fetch_add(n, Ordering::SeqCst) + n;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(30)).await;
                in_hand.fetch_sub(n, Ordering::SeqCst);
                for t in got.tasks {
                    client.complete(t.id, t.execution_id, None).await.unwrap();
                    done.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
    assert_eq!(done.load(Ordering::SeqCst), QUEUED, "every task ran once");
    let most = most.load(Ordering::SeqCst);
    assert!(most <= QUEUE_LIMIT, "{most} of the queue in hand at once");
    assert!(most >= 2, "the limit let several run at once ({most})");
}

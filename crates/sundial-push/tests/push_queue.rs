//! Queue default targets and the HTTP answer on attempts, end to end against loopback sinks:
//! a task created without a target in a queue with one is delivered there at its due time (never
//! before), its attempts carry the status code and content type; a target changed while a task
//! waits is the one called; a target removed leaves the task `ready` for workers (not lost); a
//! bad queue target is refused with nothing stored. Activities with a target (workflows) are
//! in `push_activity.rs`.
#![allow(clippy::disallowed_methods)] // timing assertions read the wall clock

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Behaviour, Sink};
use sundial::{Backoff, QueueConfig, Running, Sundial, Task, TaskSpec, TaskState};
use sundial_core::Target;
use sundial_core::namespace::DEFAULT_NAMESPACE;
use sundial_push::{
    AddressPolicy, ClientConfig, PUSH_WORKER, PushConfig, PushExecutor, QueuePushConfig,
    StaticLookup,
};

struct Env {
    sundial: Sundial,
    running: Option<Running>,
    _dir: tempfile::TempDir,
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            tokio::spawn(r.shutdown(Duration::from_secs(1)));
        }
    }
}

async fn env() -> Env {
    let dir = tempfile::tempdir().expect("dir");
    let sundial = Sundial::open(dir.path()).await.expect("open");
    let exec = PushExecutor::new(
        PushConfig {
            client: ClientConfig {
                policy: AddressPolicy::parse(&["127.0.0.1/32"]).expect("policy"),
                lookup: Arc::new(StaticLookup::new()),
                ..ClientConfig::default()
            },
            ..PushConfig::default()
        },
        sundial.push_secret_store().expect("secrets").clone(),
        sundial.clock().clone(),
    )
    .expect("executor");
    exec.add_secret(DEFAULT_NAMESPACE, None, None)
        .await
        .expect("secret");
    sundial.set_push_handler(exec.handler(&sundial));
    sundial_push::queue::spawn(
        sundial.clone(),
        exec,
        QueuePushConfig {
            refresh: Duration::from_millis(100),
            poll_wait: Duration::from_millis(200),
            ..QueuePushConfig::default()
        },
    );
    let running = Some(sundial.start());
    Env {
        sundial,
        running,
        _dir: dir,
    }
}

async fn set_target(s: &Sundial, queue: &str, target: Option<Target>) {
    s.configure_queue(
        queue,
        QueueConfig {
            target,
            ..QueueConfig::default()
        },
    )
    .await
    .expect("configure");
}

async fn wait_state(s: &Sundial, id: sundial::TaskId, state: TaskState, limit: Duration) -> Task {
    let t0 = Instant::now();
    loop {
        let t = s.get(id).await.expect("get").expect("task");
        if t.state == state {
            return t;
        }
        assert!(t0.elapsed() < limit, "task {} after {limit:?}", t.state);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_default_target_delivers_its_tasks_on_time_with_the_answer_on_the_attempts() {
    let e = env().await;
    let sink = Sink::start(
        "127.0.0.1",
        Behaviour::Script(Arc::new(|n| match n {
            0 => (503, vec![], b"busy".to_vec()),
            _ => (
                200,
                vec![("content-type".into(), "application/json".into())],
                br#"{"ok":true}"#.to_vec(),
            ),
        })),
    )
    .await;
    set_target(
        &e.sundial,
        "hooks",
        Some(Target::new(sink.url("/q")).header("x-team", "a")),
    )
    .await;
    // Let the pushers see the target (they read the settings every 100 ms here).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let task = e
        .sundial
        .schedule_task(
            TaskSpec::new("remind")
                .queue("hooks")
                .payload(serde_json::json!({"n": 1}))
                .delay(Duration::from_millis(600))
                .backoff(Backoff::fixed(Duration::from_millis(50))),
        )
        .await
        .expect("schedule");
    assert_eq!(task.target, None, "the task keeps no target of its own");
    let done = wait_state(
        &e.sundial,
        task.id,
        TaskState::Succeeded,
        Duration::from_secs(15),
    )
    .await;
    let got = sink.requests();
    assert_eq!(got.len(), 2);
    assert!(
        got[0].at_ms >= task.due_at.0,
        "called {} ms before its due time",
        task.due_at.0 - got[0].at_ms
    );
    assert_eq!(got[0].path, "/q");
    assert_eq!(got[0].header("x-team"), Some("a"));
    assert_eq!(
        got[0].header("webhook-id"),
        Some(task.id.to_string().as_str())
    );
    assert!(
        got[0]
            .header("webhook-signature")
            .is_some_and(|s| s.starts_with("v1,"))
    );
    assert_eq!(got[1].header("sundial-attempt"), Some("2"));
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&got[1].body).expect("json"),
        serde_json::json!({"n": 1})
    );
    assert_eq!(
        done.result.expect("result")["body"],
        serde_json::json!({"ok": true})
    );
    let h = e.sundial.attempts(task.id).await.expect("attempts");
    assert_eq!(h.attempts.len(), 2);
    assert_eq!(h.attempts[0].status_code, Some(503));
    assert_eq!(h.attempts[0].worker.as_deref(), Some(PUSH_WORKER));
    assert!(
        h.attempts[0]
            .error
            .as_deref()
            .is_some_and(|e| e.starts_with("HTTP 503"))
    );
    assert_eq!(h.attempts[1].status_code, Some(200));
    assert_eq!(
        h.attempts[1].content_type.as_deref(),
        Some("application/json")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_with_its_own_target_keeps_the_answer_on_its_attempts() {
    let e = env().await;
    let sink = Sink::start(
        "127.0.0.1",
        Behaviour::Answer {
            status: 404,
            headers: vec![("content-type".into(), "text/plain".into())],
            body: b"no such hook".to_vec(),
        },
    )
    .await;
    let task = e
        .sundial
        .schedule_task(TaskSpec::new("k").target(Target::new(sink.url("/gone"))))
        .await
        .expect("schedule");
    wait_state(
        &e.sundial,
        task.id,
        TaskState::Dead,
        Duration::from_secs(10),
    )
    .await;
    let h = e.sundial.attempts(task.id).await.expect("attempts");
    assert_eq!(h.attempts.len(), 1);
    assert_eq!(h.attempts[0].status_code, Some(404));
    assert_eq!(h.attempts[0].content_type.as_deref(), Some("text/plain"));
    assert_eq!(h.attempts[0].worker, None, "the engine's own push handler");
    assert!(h.attempts[0].duration_ms().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_target_reaches_waiting_tasks_and_a_removed_one_leaves_them_ready() {
    let e = env().await;
    let ok = || Behaviour::Answer {
        status: 200,
        headers: vec![],
        body: vec![],
    };
    let (old, new) = (
        Sink::start("127.0.0.1", ok()).await,
        Sink::start("127.0.0.1", ok()).await,
    );
    set_target(&e.sundial, "q", Some(Target::new(old.url("/old")))).await;
    let task = e
        .sundial
        .schedule_task(
            TaskSpec::new("k")
                .queue("q")
                .delay(Duration::from_millis(1_000)),
        )
        .await
        .expect("schedule");
    // Changed while the task waits: the new target is the one called.
    set_target(&e.sundial, "q", Some(Target::new(new.url("/new")))).await;
    wait_state(
        &e.sundial,
        task.id,
        TaskState::Succeeded,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(old.requests().len(), 0);
    let got = new.requests();
    assert_eq!(got.len(), 1);
    assert!(got[0].at_ms >= task.due_at.0, "early");

    // Removed: the next task becomes ready at its due time and waits there for a worker.
    set_target(&e.sundial, "q", None).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let later = e
        .sundial
        .schedule_task(
            TaskSpec::new("k")
                .queue("q")
                .delay(Duration::from_millis(100)),
        )
        .await
        .expect("schedule");
    wait_state(
        &e.sundial,
        later.id,
        TaskState::Ready,
        Duration::from_secs(5),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        e.sundial
            .get(later.id)
            .await
            .expect("get")
            .expect("task")
            .state,
        TaskState::Ready,
        "nobody took it"
    );
    assert_eq!(new.requests().len(), 1);
    let polled = e
        .sundial
        .poll("q", Some("w".into()), None, 1, Duration::from_millis(100))
        .await
        .expect("poll");
    assert_eq!(polled.len(), 1, "a worker gets it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_queue_target_is_refused_and_nothing_is_stored() {
    let e = env().await;
    for bad in [
        Target::new("ftp://example.com/"),
        Target::new("https://u:p@example.com/"),
        Target::new("https://example.com/").header("webhook-signature", "x"),
    ] {
        let err = e
            .sundial
            .configure_queue(
                "q",
                QueueConfig {
                    target: Some(bad.clone()),
                    ..QueueConfig::default()
                },
            )
            .await
            .expect_err("refused");
        assert!(matches!(err, sundial::Error::Invalid(_)), "{bad:?}: {err}");
    }
    assert_eq!(
        e.sundial.store().queue_settings("q").await.expect("read"),
        None
    );
    // Sundial's own queues take none (an activity queue with a target would hijack activities).
    let err = e
        .sundial
        .configure_queue(
            "sundial.activities",
            QueueConfig {
                target: Some(Target::new("https://example.com/")),
                ..QueueConfig::default()
            },
        )
        .await
        .expect_err("refused");
    assert!(matches!(err, sundial::Error::Invalid(_)), "{err}");
}

//! Workflow activities with an HTTP target: Sundial calls the target with the activity's input
//! (signed, like a push task), a 2xx answer's body becomes the activity's result, failures follow
//! the activity's retry policy, and a 4xx ends it as a failed activity. Loopback sinks only.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Behaviour, Sink};
use serde_json::{Value, json};
use sundial::{Backoff, Running, Sundial};
use sundial_core::Target;
use sundial_core::namespace::DEFAULT_NAMESPACE;
use sundial_push::{AddressPolicy, ClientConfig, PushConfig, PushExecutor, StaticLookup};
use sundial_workflow::{
    RetryPolicy, StartWorkflow, WorkflowContext, WorkflowError, WorkflowStatus, Workflows,
};

struct Env {
    workflows: Workflows,
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

async fn env(sink: &Sink) -> Env {
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
    let workflows = Workflows::attach(&sundial).expect("workflows");
    sundial.set_push_handler(workflows.push_handler(exec.handler(&sundial)));
    let url = sink.url("/charge");
    workflows
        .register("order", move |ctx: WorkflowContext, order: Value| {
            let url = url.clone();
            async move {
                let receipt: Value = ctx
                    .activity("charge", &order)
                    .target(Target::new(url))
                    .retry(RetryPolicy {
                        max_attempts: 3,
                        backoff: Backoff::fixed(Duration::from_millis(50)),
                    })
                    .timeout(Duration::from_secs(5))
                    .await?;
                Ok::<_, WorkflowError>(json!({"receipt": receipt}))
            }
        })
        .expect("register");
    let running = Some(sundial.start());
    Env {
        workflows,
        running,
        _dir: dir,
    }
}

async fn wait_closed(w: &Workflows, id: &str) -> sundial_workflow::WorkflowRun {
    for _ in 0..1_000 {
        let r = w.get(id).await.expect("get").expect("run");
        if r.status != WorkflowStatus::Running {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("workflow {id} still running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_activity_with_a_target_is_called_and_its_answer_is_the_result() {
    // 503 first (retried under the activity's policy), then the receipt.
    let sink = Sink::start(
        "127.0.0.1",
        Behaviour::Script(Arc::new(|n| match n {
            0 => (503, vec![], b"busy".to_vec()),
            _ => (
                200,
                vec![("content-type".into(), "application/json".into())],
                br#"{"charged":42}"#.to_vec(),
            ),
        })),
    )
    .await;
    let e = env(&sink).await;
    e.workflows
        .start(StartWorkflow::new("order", json!({"order": 1, "amount": 42})).id("o-1"))
        .await
        .expect("start");
    let run = wait_closed(&e.workflows, "o-1").await;
    assert_eq!(run.status, WorkflowStatus::Completed, "{run:?}");
    let result: Value = serde_json::from_str(run.result.as_deref().expect("result")).expect("json");
    assert_eq!(result, json!({"receipt": {"charged": 42}}));
    let got = sink.requests();
    assert_eq!(got.len(), 2, "one retry");
    assert_eq!(
        serde_json::from_slice::<Value>(&got[1].body).expect("json"),
        json!({"order": 1, "amount": 42}),
        "the activity's input is the body"
    );
    assert!(
        got[1]
            .header("webhook-signature")
            .is_some_and(|s| s.starts_with("v1,"))
    );
    assert_eq!(got[0].header("webhook-id"), got[1].header("webhook-id"));
    assert_eq!(got[1].header("sundial-attempt"), Some("2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_activity_target_that_refuses_fails_the_activity() {
    let sink = Sink::start(
        "127.0.0.1",
        Behaviour::Answer {
            status: 400,
            headers: vec![],
            body: b"bad order".to_vec(),
        },
    )
    .await;
    let e = env(&sink).await;
    e.workflows
        .start(StartWorkflow::new("order", json!({"order": 2})).id("o-2"))
        .await
        .expect("start");
    let run = wait_closed(&e.workflows, "o-2").await;
    assert_eq!(run.status, WorkflowStatus::Failed, "{run:?}");
    assert_eq!(sink.requests().len(), 1, "a 4xx is not retried");
    let err = run.error.unwrap_or_default();
    assert!(err.contains("HTTP 400"), "{err}");
}

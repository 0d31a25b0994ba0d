//! The remote worker: runs registered workflows and activities for a `sundial server` over
//! HTTP (feature `remote`). See the parent module for the protocol.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use sundial_core::RunId;
use thiserror::Error;
use tokio::sync::Semaphore;

use super::{
    ActivityTaskView, CompleteActivity, CompleteWorkflowTask, FailActivity, PollActivities,
    PollWorkflowTasks, WorkflowTaskOutcome, WorkflowTaskView,
};
use crate::activity::ActivityError;
use crate::replay::{self, ReplayError, RunInfo, WorkflowFn};
use crate::{WorkflowContext, WorkflowError, check_name, erase_workflow};

/// Long-poll wait asked of the server.
const POLL_WAIT_MS: u64 = 20_000;
/// Workflow tasks claimed by one poll, replayed concurrently.
const WORKFLOW_TASKS_PER_POLL: u32 = 8;
/// Pause after a failed request before trying again.
const ERROR_PAUSE: Duration = Duration::from_secs(1);

/// Why a [`RemoteWorker`] call failed.
#[derive(Debug, Error)]
pub enum RemoteError {
    #[error("invalid {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    #[error("HTTP: {0}")]
    Http(#[from] reqwest::Error),
    /// The server answered with an error status.
    #[error("server answered {status}: {body}")]
    Status { status: u16, body: String },
    /// [`RemoteWorker::ca_file`]: the file cannot be read.
    #[error("cannot read the CA file {}: {source}", path.display())]
    ReadCaFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// [`RemoteWorker::ca_file`]: the file holds no PEM certificate, or a broken one.
    #[error("the CA file {} holds no usable PEM certificate{}", path.display(), source.as_ref().map(|e| format!(": {e}")).unwrap_or_default())]
    BadCaFile {
        path: PathBuf,
        #[source]
        source: Option<reqwest::Error>,
    },
    /// [`RemoteWorker::token`]: not a valid header value.
    #[error("the token is not a valid header value")]
    BadToken,
    /// [`RemoteWorker::namespace`]: not a namespace name.
    #[error(
        "{0:?} is not a namespace name (1 to 63 lower-case letters, digits, '-' and '_', \
         starting with a letter)"
    )]
    BadNamespace(String),
}

/// What a remote activity function is given.
#[derive(Clone)]
pub struct RemoteActivityContext {
    task: ActivityTaskView,
    client: Client,
}

impl RemoteActivityContext {
    /// The workflow run that scheduled this activity.
    pub fn run_id(&self) -> RunId {
        RunId(self.task.run_id)
    }
    /// The activity's command number in its run: `(run_id, cmd)` names the step.
    pub fn cmd(&self) -> u32 {
        self.task.cmd
    }
    /// This attempt's number, from 1.
    pub fn attempt(&self) -> u32 {
        self.task.attempt
    }
    /// This attempt's id. Effects keyed by it happen once even when an attempt is retried.
    pub fn execution_id(&self) -> uuid::Uuid {
        self.task.execution_id
    }
    /// Extends this attempt's lease by its timeout. Fails (permanently) when the activity was
    /// cancelled or the attempt no longer owns the task.
    pub async fn heartbeat(&self) -> Result<(), ActivityError> {
        let path = format!("/v1/tasks/{}/heartbeat", self.task.task_id);
        match self
            .client
            .post::<Value>(&path, &json!({"execution_id": self.task.execution_id}))
            .await
        {
            Ok(_) => Ok(()),
            Err(RemoteError::Status {
                status: 404 | 409,
                body,
            }) => Err(ActivityError::permanent(format!(
                "activity no longer owned: {body}"
            ))),
            Err(e) => Err(ActivityError::retryable(e.to_string())),
        }
    }
}

type RemoteActivityFuture = Pin<Box<dyn Future<Output = Result<Value, ActivityError>> + Send>>;
type RemoteActivityFn =
    Arc<dyn Fn(RemoteActivityContext, Value) -> RemoteActivityFuture + Send + Sync>;

#[derive(Clone)]
struct Client {
    http: reqwest::Client,
    base: Arc<str>,
    /// `/v1/namespaces/{ns}` for a worker of another namespace than `default` (every `/v1`
    /// path is sent under it); empty for the default namespace.
    namespace_prefix: Arc<str>,
}

impl Client {
    /// The URL of the API path `path` (`/v1/…`), in the worker's namespace.
    fn url(&self, path: &str) -> String {
        match path.strip_prefix("/v1/") {
            Some(rest) if !self.namespace_prefix.is_empty() => {
                format!("{}{}/{rest}", self.base, self.namespace_prefix)
            }
            _ => format!("{}{path}", self.base),
        }
    }

    async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> Result<T, RemoteError> {
        self.post_timeout(path, body, Duration::from_secs(30)).await
    }

    async fn post_timeout<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl Serialize,
        timeout: Duration,
    ) -> Result<T, RemoteError> {
        let resp = self
            .http
            .post(self.url(path))
            .timeout(timeout)
            .json(body)
            .send()
            .await?;
        let status = resp.status();
        if !status.is_success() {
            let body = resp.text().await.unwrap_or_default();
            return Err(RemoteError::Status {
                status: status.as_u16(),
                body,
            });
        }
        Ok(resp.json().await?)
    }
}

/// What the worker's HTTP client is built from.
#[derive(Default)]
struct HttpSettings {
    /// CA certificates trusted besides the system's.
    roots: Vec<reqwest::Certificate>,
    /// The `Authorization` header.
    token: Option<reqwest::header::HeaderValue>,
}

fn http_client(settings: &HttpSettings) -> Result<reqwest::Client, RemoteError> {
    // See `sundial_cli::http_client_builder`: with reqwest's rustls features a client needs a
    // provider installed (ring, as everywhere in Sundial; a second install is harmless).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(t) = &settings.token {
        headers.insert(reqwest::header::AUTHORIZATION, t.clone());
    }
    Ok(reqwest::Client::builder()
        .default_headers(headers)
        .tls_certs_merge(settings.roots.iter().cloned())
        .build()?)
}

#[derive(serde::Deserialize)]
struct Tasks<T> {
    tasks: Vec<T>,
}

/// A worker process's connection to a `sundial server`: register workflows and activities,
/// then [`run`](RemoteWorker::run). Any number of workers may serve the same types; the
/// server keeps all state, so any of them continues any run.
///
/// ```no_run
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// use sundial_workflow::{WorkflowContext, WorkflowError};
/// use sundial_workflow::remote::RemoteWorker;
///
/// let mut worker = RemoteWorker::new("http://127.0.0.1:8080");
/// worker.register("hello", |ctx: WorkflowContext, name: String| async move {
///     let greeting: String = ctx.activity("greet", &name).await?;
///     Ok::<_, WorkflowError>(greeting)
/// })?;
/// worker.register_activity("greet", |_ctx, name: String| async move {
///     Ok::<_, sundial_workflow::ActivityError>(format!("hello, {name}"))
/// })?;
/// worker.run().await?;
/// # Ok(()) }
/// ```
pub struct RemoteWorker {
    client: Client,
    http: HttpSettings,
    name: String,
    workflows: HashMap<String, WorkflowFn>,
    activities: HashMap<String, RemoteActivityFn>,
    concurrency: usize,
}

impl RemoteWorker {
    /// A worker for the server at `server_url` (e.g. `http://127.0.0.1:8080`, or `https://…`:
    /// the system's certificate authorities are trusted, and those of [`ca_file`](Self::ca_file)).
    pub fn new(server_url: &str) -> Self {
        RemoteWorker {
            client: Client {
                http: http_client(&HttpSettings::default())
                    .unwrap_or_else(|_| reqwest::Client::new()),
                base: server_url.trim_end_matches('/').into(),
                namespace_prefix: "".into(),
            },
            http: HttpSettings::default(),
            name: format!("remote-worker-{}", uuid::Uuid::new_v4().simple()),
            workflows: HashMap::new(),
            activities: HashMap::new(),
            concurrency: 16,
        }
    }

    /// Also trusts the CA certificates in the PEM file at `path` (one or more `CERTIFICATE`
    /// blocks), for a server whose HTTPS certificate a private CA signed. A file that cannot be
    /// read or holds no certificate is an error naming it.
    pub fn ca_file(mut self, path: impl AsRef<Path>) -> Result<Self, RemoteError> {
        let path = path.as_ref();
        let pem = std::fs::read(path).map_err(|source| RemoteError::ReadCaFile {
            path: path.to_path_buf(),
            source,
        })?;
        let certs =
            reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| RemoteError::BadCaFile {
                path: path.to_path_buf(),
                source: Some(e),
            })?;
        if certs.is_empty() {
            return Err(RemoteError::BadCaFile {
                path: path.to_path_buf(),
                source: None,
            });
        }
        self.http.roots.extend(certs);
        self.client.http = http_client(&self.http)?;
        Ok(self)
    }

    /// Sends `token` (from `sundial token create --scope worker`) as the bearer token of every
    /// request, for a server with auth on.
    pub fn token(mut self, token: &str) -> Result<Self, RemoteError> {
        let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {}", token.trim()))
            .map_err(|_| RemoteError::BadToken)?;
        value.set_sensitive(true);
        self.http.token = Some(value);
        self.client.http = http_client(&self.http)?;
        Ok(self)
    }

    /// Asks the server's `/healthz` once: whether the address answers, over HTTPS whether its
    /// certificate is trusted. [`run`](Self::run) retries such errors for ever (logging them); a
    /// worker that calls this first fails at start with the reason instead.
    pub async fn check(&self) -> Result<(), RemoteError> {
        let resp = self
            .client
            .http
            .get(format!("{}/healthz", self.client.base))
            .timeout(Duration::from_secs(10))
            .send()
            .await?;
        let status = resp.status();
        if !status.is_success() {
            return Err(RemoteError::Status {
                status: status.as_u16(),
                body: resp.text().await.unwrap_or_default(),
            });
        }
        Ok(())
    }

    /// Serves the workflows and activities of namespace `ns` (default: `default`): every call
    /// goes to `/v1/namespaces/{ns}/…`, so the worker polls that namespace's queues and acts on
    /// its runs only. Its token must be one of that namespace or of all namespaces.
    pub fn namespace(mut self, ns: &str) -> Result<Self, RemoteError> {
        if !sundial_core::namespace::is_valid_name(ns) {
            return Err(RemoteError::BadNamespace(ns.to_string()));
        }
        self.client.namespace_prefix = if ns == sundial_core::namespace::DEFAULT_NAMESPACE {
            "".into()
        } else {
            format!("/v1/namespaces/{ns}").into()
        };
        Ok(self)
    }

    /// The worker name the server records on the tasks it claims.
    pub fn worker_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// How many activities run at once (default 16).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// Registers the workflow function for `workflow_type` (same signature as
    /// [`crate::Workflows::register`]).
    pub fn register<I, O, F, Fut>(&mut self, workflow_type: &str, f: F) -> Result<(), RemoteError>
    where
        I: DeserializeOwned + Send + 'static,
        O: Serialize + 'static,
        F: Fn(WorkflowContext, I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, WorkflowError>> + Send + 'static,
    {
        check_name("workflow type", workflow_type).map_err(invalid)?;
        self.workflows
            .insert(workflow_type.to_string(), erase_workflow(f));
        Ok(())
    }

    /// Registers the activity function `name`.
    pub fn register_activity<I, O, F, Fut>(&mut self, name: &str, f: F) -> Result<(), RemoteError>
    where
        I: DeserializeOwned + Send + 'static,
        O: Serialize + 'static,
        F: Fn(RemoteActivityContext, I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, ActivityError>> + Send + 'static,
    {
        check_name("activity name", name).map_err(invalid)?;
        let f = Arc::new(f);
        let erased: RemoteActivityFn =
            Arc::new(
                move |ctx, input: Value| match serde_json::from_value::<I>(input) {
                    Ok(input) => {
                        let fut = f(ctx, input);
                        Box::pin(async move {
                            let out = fut.await?;
                            serde_json::to_value(out).map_err(|e| {
                                ActivityError::permanent(format!(
                                    "activity result is not serialisable: {e}"
                                ))
                            })
                        })
                    }
                    Err(e) => Box::pin(async move {
                        Err(ActivityError::permanent(format!(
                            "activity input is not of the expected type: {e}"
                        )))
                    }),
                },
            );
        self.activities.insert(name.to_string(), erased);
        Ok(())
    }

    /// Polls and runs workflow tasks and activities until the returned future is dropped.
    /// Errors reaching the server are logged and retried; it only returns when nothing is
    /// registered.
    pub async fn run(self) -> Result<(), RemoteError> {
        if self.workflows.is_empty() && self.activities.is_empty() {
            return Err(RemoteError::Invalid {
                field: "worker",
                reason: "register at least one workflow or activity".into(),
            });
        }
        let this = Arc::new(self);
        let wf = this.clone();
        let act = this.clone();
        tokio::join!(
            async move {
                if !wf.workflows.is_empty() {
                    wf.workflow_loop().await;
                }
            },
            async move {
                if !act.activities.is_empty() {
                    act.activity_loop().await;
                }
            },
        );
        Ok(())
    }

    async fn workflow_loop(&self) {
        let req = PollWorkflowTasks {
            worker: self.name.clone(),
            types: self.workflows.keys().cloned().collect(),
            max: Some(WORKFLOW_TASKS_PER_POLL),
            wait_ms: Some(POLL_WAIT_MS),
            wait: None,
        };
        loop {
            let polled: Result<Tasks<WorkflowTaskView>, _> = self
                .client
                .post_timeout("/v1/workflow-tasks/poll", &req, poll_timeout())
                .await;
            match polled {
                Ok(t) => {
                    futures::future::join_all(t.tasks.into_iter().map(|t| self.workflow_task(t)))
                        .await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "polling workflow tasks failed");
                    tokio::time::sleep(ERROR_PAUSE).await;
                }
            }
        }
    }

    /// Replays one workflow task and answers it, replaying again while the server says the
    /// history grew meanwhile.
    async fn workflow_task(&self, mut task: WorkflowTaskView) {
        loop {
            let Some(workflow) = self.workflows.get(&task.workflow_type).cloned() else {
                return; // the server only hands out registered types
            };
            let expect_len = task.history.len() as u64;
            let info = RunInfo {
                workflow_id: task.workflow_id.clone(),
                run_id: Some(RunId(task.run_id)),
                suggest_continue_after: task.suggest_continue_after,
            };
            let history = std::mem::take(&mut task.history);
            let now = task.now;
            let replayed =
                tokio::task::spawn_blocking(move || replay::replay(&workflow, &history, info, now))
                    .await
                    .map_err(|e| ReplayError::Panicked(e.to_string()))
                    .and_then(|r| r);
            let answer = match replayed {
                Ok(r) => CompleteWorkflowTask {
                    execution_id: task.execution_id,
                    expect_len,
                    commands: r.new_commands,
                    error: None,
                },
                Err(e) => CompleteWorkflowTask {
                    execution_id: task.execution_id,
                    expect_len,
                    commands: Vec::new(),
                    error: Some(e.to_string()),
                },
            };
            let path = format!("/v1/workflow-tasks/{}/complete", task.task_id);
            match self
                .client
                .post::<WorkflowTaskOutcome>(&path, &answer)
                .await
            {
                Ok(WorkflowTaskOutcome::Stale { task: fresh }) => task = *fresh,
                Ok(_) => return,
                Err(e) => {
                    // The claim's lease expires and the task is handed out again.
                    tracing::warn!(task = %task.task_id, error = %e, "answering a workflow task failed");
                    return;
                }
            }
        }
    }

    async fn activity_loop(self: &Arc<Self>) {
        let slots = Arc::new(Semaphore::new(self.concurrency));
        let names: Vec<String> = self.activities.keys().cloned().collect();
        loop {
            let Ok(first) = slots.clone().acquire_owned().await else {
                return;
            };
            let free = slots.available_permits() + 1;
            let req = PollActivities {
                worker: self.name.clone(),
                names: names.clone(),
                max: Some(u32::try_from(free).unwrap_or(1)),
                wait_ms: Some(POLL_WAIT_MS),
                wait: None,
            };
            let polled: Result<Tasks<ActivityTaskView>, _> = self
                .client
                .post_timeout("/v1/workflow-activities/poll", &req, poll_timeout())
                .await;
            let tasks = match polled {
                Ok(t) => t.tasks,
                Err(e) => {
                    tracing::warn!(error = %e, "polling activities failed");
                    drop(first);
                    tokio::time::sleep(ERROR_PAUSE).await;
                    continue;
                }
            };
            let mut first = Some(first);
            for task in tasks {
                let permit = match first.take() {
                    Some(p) => p,
                    None => match slots.clone().acquire_owned().await {
                        Ok(p) => p,
                        Err(_) => return,
                    },
                };
                let this = self.clone();
                tokio::spawn(async move {
                    this.activity(task).await;
                    drop(permit);
                });
            }
        }
    }

    async fn activity(&self, task: ActivityTaskView) {
        let Some(f) = self.activities.get(&task.name).cloned() else {
            return;
        };
        let id = task.task_id;
        let execution_id = task.execution_id;
        let ctx = RemoteActivityContext {
            task: task.clone(),
            client: self.client.clone(),
        };
        let out = f(ctx, task.input).await;
        let sent = match out {
            Ok(result) => {
                self.client
                    .post::<Value>(
                        &format!("/v1/workflow-activities/{id}/complete"),
                        &CompleteActivity {
                            execution_id,
                            result,
                        },
                    )
                    .await
            }
            Err(e) => {
                self.client
                    .post::<Value>(
                        &format!("/v1/workflow-activities/{id}/fail"),
                        &FailActivity {
                            execution_id,
                            error: e.message,
                            retryable: Some(e.retryable),
                        },
                    )
                    .await
            }
        };
        if let Err(e) = sent {
            tracing::warn!(task = %id, error = %e, "reporting an activity failed");
        }
    }
}

fn poll_timeout() -> Duration {
    Duration::from_millis(POLL_WAIT_MS) + Duration::from_secs(30)
}

fn invalid(e: crate::Error) -> RemoteError {
    match e {
        crate::Error::Invalid { field, reason } => RemoteError::Invalid { field, reason },
        other => RemoteError::Invalid {
            field: "name",
            reason: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_puts_every_api_path_under_its_prefix() {
        let w = RemoteWorker::new("http://127.0.0.1:7373/");
        assert_eq!(
            w.client.url("/v1/workflow-tasks/poll"),
            "http://127.0.0.1:7373/v1/workflow-tasks/poll"
        );
        let Ok(w) = w.namespace("acme") else {
            panic!("acme is a namespace name")
        };
        assert_eq!(
            w.client.url("/v1/workflow-tasks/poll"),
            "http://127.0.0.1:7373/v1/namespaces/acme/workflow-tasks/poll"
        );
        assert_eq!(
            w.client.url("/v1/tasks/t/heartbeat"),
            "http://127.0.0.1:7373/v1/namespaces/acme/tasks/t/heartbeat"
        );
        let Ok(w) = w.namespace("default") else {
            panic!("default is a namespace name")
        };
        assert_eq!(
            w.client.url("/v1/workflow-activities/poll"),
            "http://127.0.0.1:7373/v1/workflow-activities/poll"
        );
        for bad in ["", "Acme", "a/b", "1st"] {
            assert!(
                matches!(
                    RemoteWorker::new("http://127.0.0.1:7373").namespace(bad),
                    Err(RemoteError::BadNamespace(_))
                ),
                "{bad:?}"
            );
        }
    }
}

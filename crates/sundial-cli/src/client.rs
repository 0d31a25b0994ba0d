//! A small typed client for the v1 HTTP API, shared by the `task` and `worker` commands and the
//! load generator. It speaks the wire types of [`sundial_server::wire`].

use std::time::Duration;

use reqwest::StatusCode;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sundial_server::ErrorBody;
use sundial_server::ops::{
    AttemptList, BulkRequest, BulkResponse, ClusterStatus, QueueList, QueueSettingsView, QueueView,
    RetryRequest, WorkerList,
};
use sundial_server::wire::{
    BatchResponse, CompleteRequest, CreateBatch, CreateTask, FailRequest, HeartbeatRequest,
    ListQuery, PollCompletion, PollRequest, PollResponse, TaskList, TaskView,
};
use uuid::Uuid;

use crate::connect::{ConnectError, Credentials};

/// Percent-encodes one path segment (everything but RFC 3986's unreserved characters), so that
/// a name with `/`, spaces or `%` (a queue `team/b`, a workflow id) reaches the server as one
/// segment.
pub fn segment(s: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// What a call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with an error status and body.
    #[error("{status}: {} ({})", body.error.message, body.error.code)]
    Api {
        status: StatusCode,
        body: Box<ErrorBody>,
    },
    /// The server answered with something that is not the expected JSON.
    #[error("unexpected response ({status}): {text}")]
    Unexpected { status: StatusCode, text: String },
    /// The request did not get an answer (connection refused, timeout, ...).
    #[error("cannot reach the server: {0}")]
    Transport(#[from] reqwest::Error),
    /// The client could not be set up from its credentials.
    #[error(transparent)]
    Setup(#[from] ConnectError),
}

impl ClientError {
    /// The HTTP status, when the server answered.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            ClientError::Api { status, .. } | ClientError::Unexpected { status, .. } => {
                Some(*status)
            }
            ClientError::Transport(_) | ClientError::Setup(_) => None,
        }
    }
    pub fn is_conflict(&self) -> bool {
        self.status() == Some(StatusCode::CONFLICT)
    }
    pub fn is_not_found(&self) -> bool {
        self.status() == Some(StatusCode::NOT_FOUND)
    }
}

/// A `reqwest` client builder with the process's TLS provider installed (rustls with ring).
///
/// Push delivery turns on reqwest's `rustls-no-provider` feature, and Cargo unifies features across
/// the workspace, so every reqwest client in a process that links it needs a provider installed
/// before it is built; installing one twice is harmless.
pub fn http_client_builder() -> reqwest::ClientBuilder {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
}

/// A client for one server. Cheap to clone (connections are pooled and shared).
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    /// The namespace every request acts in (`None`: the default one).
    namespace: Option<String>,
}

impl Client {
    /// A client for the server at `base` (e.g. `http://127.0.0.1:7373`), without credentials.
    pub fn new(base: &str) -> Result<Self, ClientError> {
        Self::with_credentials(base, &Credentials::default())
    }

    /// A client for the server at `base` that sends `credentials` on every request.
    pub fn with_credentials(base: &str, credentials: &Credentials) -> Result<Self, ClientError> {
        let http = credentials
            .http_builder()?
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(30))
            .tcp_nodelay(true)
            .build()?;
        Ok(Client {
            http,
            base: base.trim_end_matches('/').to_string(),
            namespace: credentials.namespace.clone(),
        })
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    fn url(&self, path: &str) -> String {
        format!(
            "{}{}",
            self.base,
            crate::connect::in_namespace(self.namespace.as_deref(), path)
        )
    }

    async fn decode<T: DeserializeOwned>(resp: reqwest::Response) -> Result<T, ClientError> {
        let status = resp.status();
        let bytes = resp.bytes().await?;
        if status.is_success() {
            return serde_json::from_slice(&bytes).map_err(|e| ClientError::Unexpected {
                status,
                text: format!("{e}: {}", String::from_utf8_lossy(&bytes)),
            });
        }
        match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(body) => Err(ClientError::Api {
                status,
                body: Box::new(body),
            }),
            Err(_) => Err(ClientError::Unexpected {
                status,
                text: String::from_utf8_lossy(&bytes).into_owned(),
            }),
        }
    }

    async fn post<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        let resp = self.http.post(self.url(path)).json(body).send().await?;
        Self::decode(resp).await
    }

    pub async fn push_secrets(&self) -> Result<sundial_server::push::SecretList, ClientError> {
        let resp = self.http.get(self.url("/v1/push/secrets")).send().await?;
        Self::decode(resp).await
    }

    pub async fn add_push_secret(
        &self,
        req: &sundial_server::push::AddSecret,
    ) -> Result<sundial_server::push::SecretView, ClientError> {
        self.post("/v1/push/secrets", req).await
    }

    pub async fn rotate_push_secret(
        &self,
        req: &sundial_server::push::RotateSecret,
    ) -> Result<sundial_server::push::SecretView, ClientError> {
        self.post("/v1/push/secrets:rotate", req).await
    }

    pub async fn revoke_push_secret(
        &self,
        id: &str,
    ) -> Result<sundial_server::push::SecretList, ClientError> {
        // A bodiless write still says it speaks JSON: the server refuses, with 415, writes a
        // browser could send cross-site without a token.
        let resp = self
            .http
            .delete(self.url(&format!("/v1/push/secrets/{}", segment(id))))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .send()
            .await?;
        Self::decode(resp).await
    }

    pub async fn create(&self, task: &CreateTask) -> Result<TaskView, ClientError> {
        self.post("/v1/tasks", task).await
    }

    pub async fn create_batch(&self, tasks: &CreateBatch) -> Result<BatchResponse, ClientError> {
        self.post("/v1/tasks:batch", tasks).await
    }

    pub async fn get(&self, id: &str) -> Result<TaskView, ClientError> {
        let resp = self
            .http
            .get(self.url(&format!("/v1/tasks/{}", segment(id))))
            .send()
            .await?;
        Self::decode(resp).await
    }

    pub async fn list(&self, query: &ListQuery) -> Result<TaskList, ClientError> {
        // `tag` repeats, which the form encoder cannot write from a list: one pair each.
        let tags: Vec<(&str, &str)> = query.tag.iter().map(|t| ("tag", t.as_str())).collect();
        let rest = ListQuery {
            tag: Vec::new(),
            ..query.clone()
        };
        let resp = self
            .http
            .get(self.url("/v1/tasks"))
            .query(&rest)
            .query(&tags)
            .send()
            .await?;
        Self::decode(resp).await
    }

    async fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let resp = self.http.get(self.url(path)).send().await?;
        Self::decode(resp).await
    }

    /// A task's attempts, oldest first.
    pub async fn attempts(&self, id: &str) -> Result<AttemptList, ClientError> {
        self.get_json(&format!("/v1/tasks/{}/attempts", segment(id)))
            .await
    }

    /// Retries a dead or cancelled task (now, or at `run_at`).
    pub async fn retry(&self, id: &str, run_at: Option<String>) -> Result<TaskView, ClientError> {
        self.post(
            &format!("/v1/tasks/{}/retry", segment(id)),
            &RetryRequest { run_at },
        )
        .await
    }

    /// Cancels every live task matching `filter`.
    pub async fn cancel_matching(&self, filter: &BulkRequest) -> Result<BulkResponse, ClientError> {
        self.post("/v1/tasks:cancel", filter).await
    }

    /// Retries every dead or cancelled task matching `filter`.
    pub async fn retry_matching(&self, filter: &BulkRequest) -> Result<BulkResponse, ClientError> {
        self.post("/v1/tasks:retry", filter).await
    }

    pub async fn queues(&self) -> Result<QueueList, ClientError> {
        self.get_json("/v1/queues").await
    }

    /// The workers that polled the server's node recently.
    pub async fn workers(&self) -> Result<WorkerList, ClientError> {
        self.get_json("/v1/workers").await
    }

    /// The nodes sharing the server's store, with their heartbeats and shards.
    pub async fn cluster(&self) -> Result<ClusterStatus, ClientError> {
        self.get_json("/v1/cluster").await
    }

    pub async fn queue(&self, queue: &str) -> Result<QueueView, ClientError> {
        self.get_json(&format!("/v1/queues/{}", segment(queue)))
            .await
    }

    pub async fn set_queue(
        &self,
        queue: &str,
        settings: &QueueSettingsView,
    ) -> Result<QueueView, ClientError> {
        let resp = self
            .http
            .put(self.url(&format!("/v1/queues/{}", segment(queue))))
            .json(settings)
            .send()
            .await?;
        Self::decode(resp).await
    }

    pub async fn pause_queue(&self, queue: &str) -> Result<QueueView, ClientError> {
        self.post(
            &format!("/v1/queues/{}/pause", segment(queue)),
            &serde_json::json!({}),
        )
        .await
    }

    pub async fn resume_queue(&self, queue: &str) -> Result<QueueView, ClientError> {
        self.post(
            &format!("/v1/queues/{}/resume", segment(queue)),
            &serde_json::json!({}),
        )
        .await
    }

    pub async fn cancel(&self, id: &str) -> Result<TaskView, ClientError> {
        self.post(
            &format!("/v1/tasks/{}/cancel", segment(id)),
            &serde_json::json!({}),
        )
        .await
    }

    pub async fn trigger(&self, id: &str) -> Result<TaskView, ClientError> {
        self.post(
            &format!("/v1/tasks/{}/trigger", segment(id)),
            &serde_json::json!({}),
        )
        .await
    }

    /// Long-polls `queue`; the request may stay open for `wait`.
    pub async fn poll(
        &self,
        queue: &str,
        worker: &str,
        max: u32,
        wait: Duration,
        kinds: Option<Vec<String>>,
    ) -> Result<PollResponse, ClientError> {
        let body = PollRequest {
            worker: worker.to_string(),
            max: Some(max),
            wait: Some(sundial_server::duration::format(wait)),
            kinds,
            complete: None,
        };
        self.send_poll(queue, &body, wait).await
    }

    /// Records `task_id`'s attempt `execution_id` as succeeded with `result`, then long-polls
    /// `queue` in the same request (its first claim commits with the completion).
    #[allow(clippy::too_many_arguments)]
    pub async fn complete_and_poll(
        &self,
        task_id: uuid::Uuid,
        execution_id: uuid::Uuid,
        result: Option<serde_json::Value>,
        queue: &str,
        worker: &str,
        max: u32,
        wait: Duration,
    ) -> Result<PollResponse, ClientError> {
        let body = PollRequest {
            worker: worker.to_string(),
            max: Some(max),
            wait: Some(sundial_server::duration::format(wait)),
            kinds: None,
            complete: Some(PollCompletion {
                task_id,
                execution_id,
                result,
            }),
        };
        self.send_poll(queue, &body, wait).await
    }

    async fn send_poll(
        &self,
        queue: &str,
        body: &PollRequest,
        wait: Duration,
    ) -> Result<PollResponse, ClientError> {
        let resp = self
            .http
            .post(self.url(&format!("/v1/queues/{}/poll", segment(queue))))
            .timeout(wait + Duration::from_secs(30))
            .json(&body)
            .send()
            .await?;
        Self::decode(resp).await
    }

    pub async fn heartbeat(&self, id: Uuid, execution_id: Uuid) -> Result<TaskView, ClientError> {
        self.post(
            &format!("/v1/tasks/{id}/heartbeat"),
            &HeartbeatRequest { execution_id },
        )
        .await
    }

    pub async fn complete(
        &self,
        id: Uuid,
        execution_id: Uuid,
        result: Option<serde_json::Value>,
    ) -> Result<TaskView, ClientError> {
        self.complete_in_trace(id, execution_id, result, None).await
    }

    /// [`complete`](Self::complete) sending `traceparent`, the W3C context of the run (the
    /// polled task's, or the worker's own span's): the server records the result as its child.
    pub async fn complete_in_trace(
        &self,
        id: Uuid,
        execution_id: Uuid,
        result: Option<serde_json::Value>,
        traceparent: Option<&str>,
    ) -> Result<TaskView, ClientError> {
        self.post_in_trace(
            &format!("/v1/tasks/{id}/complete"),
            &CompleteRequest {
                execution_id,
                result,
            },
            traceparent,
        )
        .await
    }

    pub async fn fail(
        &self,
        id: Uuid,
        execution_id: Uuid,
        error: String,
        retryable: bool,
    ) -> Result<TaskView, ClientError> {
        self.fail_in_trace(id, execution_id, error, retryable, None)
            .await
    }

    /// [`fail`](Self::fail) sending `traceparent`, as [`complete_in_trace`](Self::complete_in_trace).
    pub async fn fail_in_trace(
        &self,
        id: Uuid,
        execution_id: Uuid,
        error: String,
        retryable: bool,
        traceparent: Option<&str>,
    ) -> Result<TaskView, ClientError> {
        self.post_in_trace(
            &format!("/v1/tasks/{id}/fail"),
            &FailRequest {
                execution_id,
                error: Some(error),
                retryable: Some(retryable),
            },
            traceparent,
        )
        .await
    }

    async fn post_in_trace<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
        traceparent: Option<&str>,
    ) -> Result<T, ClientError> {
        let mut req = self.http.post(self.url(path)).json(body);
        if let Some(tp) = traceparent {
            req = req.header("traceparent", tp);
        }
        Self::decode(req.send().await?).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_percent_encoded() {
        assert_eq!(segment("team/b"), "team%2Fb");
        assert_eq!(segment("a b%"), "a%20b%25");
        assert_eq!(segment("order.close-1_~"), "order.close-1_~");
    }
}

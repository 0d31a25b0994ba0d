//! The push executor: the in-process handler the engine runs for every task that carries a
//! target. It reads the active signing secrets of the task's namespace (the namespace of its
//! stored queue name; cached briefly per namespace, so a rotation reaches every node within
//! [`PushConfig::secret_refresh`]), makes the call and turns the answer into the attempt's
//! result or error. A namespace with no active secret sends its calls unsigned (no
//! `webhook-signature` header), whatever other namespaces have.
//!
//! Concurrency is the engine's: it claims a push task only with a free permit of the task's
//! destination (per host and port) and of the global push cap, so calls to a slow or dead
//! receiver wait in the store, not in memory, and never hold the permits of other receivers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use sundial::{
    Clock, ExecutionId, Handler, HandlerError, HandlerFuture, Sundial, Task, TaskContext,
};
use sundial_core::{Target, Timestamp};
use sundial_store::{AttemptResponse, PushSecret, PushSecretStore, StoreError};

use crate::client::{BuildError, CallError, CallRequest, CallResponse, ClientConfig, PushClient};
use crate::outcome::{Verdict, classify_status, parse_retry_after};
use crate::sign::{SecretError, SigningKey};

/// Why a secret was not added.
#[derive(Debug, thiserror::Error)]
pub enum SecretAddError {
    #[error("invalid secret: {0}")]
    Invalid(#[source] SecretError),
    #[error(transparent)]
    Store(StoreError),
}

/// Settings of push delivery.
#[derive(Clone)]
pub struct PushConfig {
    pub client: ClientConfig,
    /// How long the active secrets read from the store are used before they are read again.
    pub secret_refresh: Duration,
}

impl Default for PushConfig {
    fn default() -> Self {
        PushConfig {
            client: ClientConfig::default(),
            secret_refresh: Duration::from_secs(1),
        }
    }
}

/// One namespace's active keys as read at `read_at`.
struct KeyCache {
    read_at: Timestamp,
    keys: Arc<Vec<SigningKey>>,
    /// The read under way in the background, if any (its ticket: see [`PushExecutor::active_keys`]).
    refreshing: Option<u64>,
}

/// The active keys per namespace, each read at its own time.
#[derive(Default)]
struct KeyCaches {
    by_namespace: HashMap<String, KeyCache>,
    /// The last ticket handed to a background read.
    last_ticket: u64,
}

/// Makes the calls of push tasks. Cheap to share (`Arc`).
pub struct PushExecutor {
    client: PushClient,
    secrets: Arc<dyn PushSecretStore>,
    clock: Arc<dyn Clock>,
    refresh: Duration,
    cache: Arc<Mutex<KeyCaches>>,
}

impl PushExecutor {
    pub fn new(
        config: PushConfig,
        secrets: Arc<dyn PushSecretStore>,
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<Self>, BuildError> {
        Ok(Arc::new(PushExecutor {
            client: PushClient::new(config.client)?,
            secrets,
            clock,
            refresh: config.secret_refresh,
            cache: Arc::new(Mutex::new(KeyCaches::default())),
        }))
    }

    pub fn client(&self) -> &PushClient {
        &self.client
    }

    /// Forgets every namespace's cached secrets.
    pub fn invalidate_secrets(&self) {
        if let Ok(mut c) = self.cache.lock() {
            c.by_namespace.clear();
        }
    }

    /// Forgets one namespace's cached secrets (after a change made on this node; a background
    /// read begun before it is dropped when it ends).
    fn invalidate_namespace(&self, namespace: &str) {
        if let Ok(mut c) = self.cache.lock() {
            c.by_namespace.remove(namespace);
        }
    }

    /// Adds a signing secret to `namespace` (`secret`, or a fresh random one). With
    /// `rotate_overlap`, every other active secret of that namespace stops signing after that
    /// overlap, so receivers have that long to move to the new one (both signatures are sent
    /// meanwhile); other namespaces' secrets are untouched.
    pub async fn add_secret(
        &self,
        namespace: &str,
        secret: Option<String>,
        rotate_overlap: Option<Duration>,
    ) -> Result<PushSecret, SecretAddError> {
        let secret = match secret {
            Some(s) => {
                SigningKey::parse(&s).map_err(SecretAddError::Invalid)?;
                s
            }
            None => SigningKey::generate().to_secret_string(),
        };
        let now = self.clock.now();
        let row = PushSecret {
            id: format!("ps_{}", uuid::Uuid::now_v7().simple()),
            namespace: namespace.to_string(),
            secret,
            created_at: now,
            expires_at: None,
        };
        let until = rotate_overlap.map(|d| now.saturating_add(d));
        self.secrets
            .add_push_secret(row.clone(), until)
            .await
            .map_err(SecretAddError::Store)?;
        self.invalidate_namespace(namespace);
        Ok(row)
    }

    /// Every secret of `namespace`, oldest first, with whether it signs now.
    pub async fn secrets(&self, namespace: &str) -> Result<Vec<(PushSecret, bool)>, StoreError> {
        let now = self.clock.now();
        Ok(self
            .secrets
            .push_secrets(namespace)
            .await?
            .into_iter()
            .map(|s| {
                let active = s.is_active(now);
                (s, active)
            })
            .collect())
    }

    /// Stops a secret of `namespace` signing now. Answers whether the namespace has it
    /// (another namespace's secret: `false`, and it keeps signing).
    pub async fn revoke_secret(&self, namespace: &str, id: &str) -> Result<bool, StoreError> {
        let found = self
            .secrets
            .expire_push_secret(namespace, id, self.clock.now())
            .await?;
        self.invalidate_namespace(namespace);
        Ok(found)
    }

    /// The secrets of `namespace` that sign now, oldest first (empty: its calls go unsigned).
    ///
    /// The keys used are never older than [`PushConfig::secret_refresh`]. Past half that age
    /// the cached keys are still used and one read in the background replaces them, so a
    /// namespace with steady traffic never has a call wait for the store (whose reads queue
    /// behind its writes under load); only a namespace quiet for a whole refresh period reads
    /// before its next call.
    pub async fn active_keys(&self, namespace: &str) -> Result<Arc<Vec<SigningKey>>, StoreError> {
        let now = self.clock.now();
        let mut ticket = None;
        let cached = match self.cache.lock() {
            Ok(mut caches) => {
                let caches = &mut *caches;
                match caches.by_namespace.get_mut(namespace) {
                    Some(c) if now.0 >= c.read_at.0 && now.since(c.read_at) < self.refresh => {
                        if c.refreshing.is_none() && now.since(c.read_at) >= self.refresh / 2 {
                            caches.last_ticket = caches.last_ticket.wrapping_add(1);
                            c.refreshing = Some(caches.last_ticket);
                            ticket = c.refreshing;
                        }
                        Some(c.keys.clone())
                    }
                    _ => None,
                }
            }
            Err(_) => None,
        };
        if let Some(keys) = cached {
            if let Some(ticket) = ticket {
                self.refresh_in_background(namespace, ticket);
            }
            return Ok(keys);
        }
        let keys = read_active_keys(&*self.secrets, namespace, now).await?;
        if let Ok(mut c) = self.cache.lock() {
            c.by_namespace.insert(
                namespace.to_string(),
                KeyCache {
                    read_at: now,
                    keys: keys.clone(),
                    refreshing: None,
                },
            );
        }
        Ok(keys)
    }

    /// Reads `namespace`'s keys again without anyone waiting for it. The result replaces the
    /// cache only if the entry still carries `ticket` (an invalidation or a newer read in the
    /// meantime wins); a failed read leaves the cached keys to expire, and the next call after
    /// that reads (and reports the error) itself.
    fn refresh_in_background(&self, namespace: &str, ticket: u64) {
        let secrets = self.secrets.clone();
        let caches = self.cache.clone();
        let clock = self.clock.clone();
        let namespace = namespace.to_string();
        tokio::spawn(async move {
            let read_at = clock.now();
            let read = read_active_keys(&*secrets, &namespace, read_at).await;
            let Ok(mut caches) = caches.lock() else {
                return;
            };
            let Some(c) = caches.by_namespace.get_mut(&namespace) else {
                return;
            };
            if c.refreshing != Some(ticket) {
                return;
            }
            c.refreshing = None;
            match read {
                Ok(keys) => {
                    c.read_at = read_at;
                    c.keys = keys;
                }
                Err(e) => {
                    tracing::warn!(namespace = %namespace, error = %e, "cannot read the signing secrets again");
                }
            }
        });
    }

    /// Delivers one attempt of `task` to its own target.
    pub async fn deliver(&self, task: &Task, execution: ExecutionId) -> Delivery {
        match &task.target {
            Some(target) => self.deliver_to(target, task, execution).await,
            None => Delivery {
                outcome: Err(HandlerError::permanent("the task has no push target")),
                response: None,
            },
        }
    }

    /// Delivers one attempt of `task` to `target` (its own, its queue's default, or a workflow
    /// activity's), with the task's payload as the body, signed with the active secrets of the
    /// task's namespace.
    pub async fn deliver_to(
        &self,
        target: &Target,
        task: &Task,
        execution: ExecutionId,
    ) -> Delivery {
        let namespace = sundial_core::namespace::namespace_of(&task.queue);
        let keys = match self.active_keys(namespace).await {
            Ok(k) => k,
            Err(e) => {
                return Delivery {
                    outcome: Err(HandlerError::retryable(format!(
                        "cannot read the signing secrets: {e}"
                    ))),
                    response: None,
                };
            }
        };
        let body = match serde_json::to_vec(&task.payload) {
            Ok(b) => b,
            Err(e) => {
                return Delivery {
                    outcome: Err(HandlerError::permanent(format!("payload: {e}"))),
                    response: None,
                };
            }
        };
        let started = self.clock.now();
        let timeout = target.call_timeout(task.timeout());
        let req = CallRequest {
            webhook_id: task.id.to_string(),
            timestamp: started.0.div_euclid(1000),
            task_id: task.id.to_string(),
            attempt: task.attempt,
            execution_id: execution.to_string(),
            // The run span's context (the engine set it on the handed-over task).
            traceparent: task.trace.as_ref().map(|c| c.traceparent().to_string()),
            body,
            timeout,
        };
        let outcome = self.client.call(target, &keys, req).await;
        let took_ms = self.clock.now().0.saturating_sub(started.0).max(0);
        match outcome {
            Ok(resp) => {
                let response = Some(AttemptResponse {
                    status_code: resp.status,
                    content_type: resp.content_type.clone(),
                });
                let retry_after = resp
                    .retry_after
                    .as_deref()
                    .and_then(|v| parse_retry_after(v, self.clock.now().0));
                let outcome =
                    match classify_status(resp.status, retry_after, &target.retry_statuses) {
                        Verdict::Succeeded => Ok(Some(result_json(&resp, took_ms))),
                        Verdict::Retry { after } => {
                            let e = HandlerError::retryable(status_error(&resp, took_ms));
                            Err(match after {
                                Some(d) => e.retry_after(d),
                                None => e,
                            })
                        }
                        Verdict::Dead => Err(HandlerError::permanent(status_error(&resp, took_ms))),
                    };
                Delivery { outcome, response }
            }
            Err(e) => {
                let message = format!("{} (after {took_ms}ms)", call_error(&e));
                let outcome = if e.is_retryable() {
                    Err(HandlerError::retryable(message))
                } else {
                    Err(HandlerError::permanent(message))
                };
                Delivery {
                    outcome,
                    response: None,
                }
            }
        }
    }

    /// Keeps a delivery's HTTP answer on its attempt (a failure to keep it is logged: the
    /// attempt's outcome is recorded either way).
    pub async fn record(
        &self,
        sundial: &Sundial,
        task: &Task,
        execution: ExecutionId,
        d: &Delivery,
    ) {
        if let Some(r) = &d.response
            && let Err(e) = sundial
                .record_attempt_response(task.id, execution, r.clone())
                .await
        {
            tracing::warn!(task = %task.id, error = %e, "cannot keep the push answer on its attempt");
        }
    }

    /// The handler to give the engine ([`Sundial::set_push_handler`]): delivers each attempt
    /// and keeps its HTTP answer on the attempt through `sundial`.
    pub fn handler(self: &Arc<Self>, sundial: &Sundial) -> Arc<dyn Handler> {
        Arc::new(PushHandler {
            exec: self.clone(),
            sundial: sundial.clone(),
        })
    }
}

/// One delivery: what the attempt's outcome is, and the receiver's answer when there was one.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The attempt's result (2xx: status, content type, body) or its error.
    pub outcome: Result<Option<serde_json::Value>, HandlerError>,
    pub response: Option<AttemptResponse>,
}

impl Delivery {
    /// The body of a 2xx answer as a value: JSON when it is JSON, else text, else
    /// `{"base64": …}` (what a workflow activity with a target returns).
    pub fn body(&self) -> Option<serde_json::Value> {
        match &self.outcome {
            Ok(Some(v)) => v.get("body").cloned(),
            _ => None,
        }
    }
}

/// The secrets of `namespace` active at `now`, parsed.
async fn read_active_keys(
    secrets: &dyn PushSecretStore,
    namespace: &str,
    now: Timestamp,
) -> Result<Arc<Vec<SigningKey>>, StoreError> {
    let all = secrets.push_secrets(namespace).await?;
    let mut keys = Vec::new();
    for s in all.iter().filter(|s| s.is_active(now)) {
        match SigningKey::parse(&s.secret) {
            Ok(k) => keys.push(k),
            Err(e) => {
                return Err(StoreError::corrupt_from(format!("push secret {}", s.id), e));
            }
        }
    }
    Ok(Arc::new(keys))
}

struct PushHandler {
    exec: Arc<PushExecutor>,
    sundial: Sundial,
}

impl Handler for PushHandler {
    fn call(&self, ctx: TaskContext) -> HandlerFuture {
        let exec = self.exec.clone();
        let sundial = self.sundial.clone();
        Box::pin(async move {
            let d = exec.deliver(&ctx.task, ctx.execution_id).await;
            // The call is over: its slots go to the next due call now, not after the answer is
            // kept on the attempt (a durable write; holding a receiver's slots through it would
            // cap that receiver at `slots / commit latency` calls a second).
            ctx.slots.release();
            // The engine keeps the answer beside the outcome, in writes issued together; a
            // context without an engine behind it (a workflow activity's) keeps it here.
            if let Some(r) = d.response.clone()
                && let Some(r) = ctx.answer.hand_over(r)
                && let Err(e) = sundial
                    .record_attempt_response(ctx.task.id, ctx.execution_id, r)
                    .await
            {
                tracing::warn!(task = %ctx.task.id, error = %e, "cannot keep the push answer on its attempt");
            }
            d.outcome
        })
    }
}

fn call_error(e: &CallError) -> String {
    match e {
        CallError::Refused(r) => format!("refused: {r}"),
        other => other.to_string(),
    }
}

/// The body as JSON when it is JSON, else as text, else as base64.
fn body_value(resp: &CallResponse) -> serde_json::Value {
    let is_json = resp.content_type.as_deref().is_some_and(|c| {
        c.split(';')
            .next()
            .is_some_and(|m| m.trim().ends_with("json"))
    });
    if is_json
        && !resp.truncated
        && let Ok(v) = serde_json::from_slice::<serde_json::Value>(&resp.body)
    {
        return v;
    }
    match std::str::from_utf8(&resp.body) {
        Ok(s) => serde_json::Value::String(s.to_string()),
        Err(_) => {
            use base64::Engine;
            json!({ "base64": base64::engine::general_purpose::STANDARD.encode(&resp.body) })
        }
    }
}

fn result_json(resp: &CallResponse, took_ms: i64) -> serde_json::Value {
    json!({
        "status": resp.status,
        "content_type": resp.content_type,
        "body": body_value(resp),
        "truncated": resp.truncated,
        "duration_ms": took_ms,
    })
}

/// `HTTP 503 (12ms): <start of the body>`: the status code leads, so the attempt history shows it.
fn status_error(resp: &CallResponse, took_ms: i64) -> String {
    let text = String::from_utf8_lossy(&resp.body);
    let excerpt: String = text.chars().take(200).collect();
    if excerpt.is_empty() {
        format!("HTTP {} ({took_ms}ms)", resp.status)
    } else {
        format!("HTTP {} ({took_ms}ms): {excerpt}", resp.status)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use async_trait::async_trait;
    use sundial_core::ManualClock;

    use super::*;

    /// Secrets in memory; each read is counted and waits while the gate is closed.
    struct GatedSecrets {
        secrets: Mutex<Vec<PushSecret>>,
        reads: AtomicUsize,
        open: tokio::sync::watch::Sender<bool>,
    }

    impl GatedSecrets {
        fn new() -> Arc<Self> {
            Arc::new(GatedSecrets {
                secrets: Mutex::new(Vec::new()),
                reads: AtomicUsize::new(0),
                open: tokio::sync::watch::channel(true).0,
            })
        }

        fn put(&self, key: &SigningKey, at: Timestamp) {
            let mut all = self.secrets.lock().unwrap();
            let id = format!("ps_{}", all.len());
            all.push(PushSecret {
                id,
                namespace: "default".into(),
                secret: key.to_secret_string(),
                created_at: at,
                expires_at: None,
            });
        }

        fn reads(&self) -> usize {
            self.reads.load(Ordering::SeqCst)
        }
    }

    #[async_trait]
    impl PushSecretStore for GatedSecrets {
        async fn add_push_secret(
            &self,
            secret: PushSecret,
            _expire_others_at: Option<Timestamp>,
        ) -> Result<(), StoreError> {
            self.secrets.lock().unwrap().push(secret);
            Ok(())
        }

        async fn push_secrets(&self, namespace: &str) -> Result<Vec<PushSecret>, StoreError> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            let mut open = self.open.subscribe();
            let _ = open.wait_for(|o| *o).await;
            let all = self.secrets.lock().unwrap();
            Ok(all
                .iter()
                .filter(|s| s.namespace == namespace)
                .cloned()
                .collect())
        }

        async fn expire_push_secret(
            &self,
            _namespace: &str,
            _id: &str,
            _at: Timestamp,
        ) -> Result<bool, StoreError> {
            Ok(false)
        }
    }

    fn executor(secrets: Arc<GatedSecrets>, clock: &ManualClock) -> Arc<PushExecutor> {
        let config = PushConfig {
            secret_refresh: Duration::from_secs(1),
            ..PushConfig::default()
        };
        PushExecutor::new(config, secrets, Arc::new(clock.clone())).unwrap()
    }

    /// A manual clock, a gated store holding one secret (returned) and an executor over them.
    fn with_one_secret() -> (
        ManualClock,
        Arc<GatedSecrets>,
        SigningKey,
        Arc<PushExecutor>,
    ) {
        let clock = ManualClock::new(Timestamp(1_000_000));
        let secrets = GatedSecrets::new();
        let first = SigningKey::generate();
        secrets.put(&first, clock.now());
        let exec = executor(secrets.clone(), &clock);
        (clock, secrets, first, exec)
    }

    /// Lets background reads run until `done` holds (a bounded number of turns).
    async fn settle(done: impl Fn() -> bool) {
        for _ in 0..1_000 {
            if done() {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("background read did not finish");
    }

    #[tokio::test]
    async fn past_half_the_refresh_a_call_uses_the_cached_keys_while_one_read_runs_behind_it() {
        let (clock, secrets, first, exec) = with_one_secret();

        assert_eq!(
            *exec.active_keys("default").await.unwrap(),
            vec![first.clone()]
        );
        assert_eq!(secrets.reads(), 1);
        clock.advance(Duration::from_millis(400));
        exec.active_keys("default").await.unwrap();
        assert_eq!(secrets.reads(), 1, "young keys are used as they are");

        // Past half the refresh, with the store stalled: calls get the cached keys at once.
        let second = SigningKey::generate();
        secrets.put(&second, clock.now());
        secrets.open.send_replace(false);
        clock.advance(Duration::from_millis(200));
        for _ in 0..10 {
            assert_eq!(
                *exec.active_keys("default").await.unwrap(),
                vec![first.clone()]
            );
        }
        settle(|| secrets.reads() == 2).await;
        assert_eq!(
            secrets.reads(),
            2,
            "one read in the background, not one per call"
        );

        secrets.open.send_replace(true);
        let both = vec![first.clone(), second.clone()];
        let cached = |exec: &PushExecutor| {
            exec.cache
                .lock()
                .unwrap()
                .by_namespace
                .get("default")
                .is_some_and(|c| *c.keys == both)
        };
        settle(|| cached(&exec)).await;
        assert_eq!(*exec.active_keys("default").await.unwrap(), both);
        assert_eq!(secrets.reads(), 2);
    }

    #[tokio::test]
    async fn keys_older_than_the_refresh_are_never_used() {
        let (clock, secrets, first, exec) = with_one_secret();
        exec.active_keys("default").await.unwrap();

        // A namespace quiet for a whole refresh period reads before its next call.
        let second = SigningKey::generate();
        secrets.put(&second, clock.now());
        clock.advance(Duration::from_millis(1_000));
        assert_eq!(
            *exec.active_keys("default").await.unwrap(),
            vec![first.clone(), second.clone()]
        );
        assert_eq!(secrets.reads(), 2);
    }

    #[tokio::test]
    async fn a_change_made_here_wins_over_a_background_read_begun_before_it() {
        let clock = ManualClock::new(Timestamp(1_000_000));
        let secrets = GatedSecrets::new();
        let exec = executor(secrets.clone(), &clock);
        assert!(exec.active_keys("default").await.unwrap().is_empty());

        // A background read starts and stalls; a secret is added through this node meanwhile.
        secrets.open.send_replace(false);
        clock.advance(Duration::from_millis(600));
        exec.active_keys("default").await.unwrap();
        settle(|| secrets.reads() == 2).await;
        let added = exec.add_secret("default", None, None).await.unwrap();
        let added = SigningKey::parse(&added.secret).unwrap();

        // The next call reads again (the change dropped the cache) and sees the new secret; the
        // stalled read, once it ends, does not put the old answer back.
        secrets.open.send_replace(true);
        assert_eq!(
            *exec.active_keys("default").await.unwrap(),
            vec![added.clone()]
        );
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert_eq!(*exec.active_keys("default").await.unwrap(), vec![added]);
    }
}

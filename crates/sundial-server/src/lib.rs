//! # sundial-server
//!
//! Sundial's HTTP API (v1) as an axum [`Router`]: tasks, the long-poll worker protocol, health,
//! Prometheus metrics and the OpenAPI document, over a [`Sundial`] instance.
//!
//! ```text
//! POST /v1/tasks                  create one task                     201 | 400 409 413 422
//! POST /v1/tasks:batch            create many in one transaction      201 | 400 413 422
//! GET  /v1/tasks/{id}             one task                            200 | 404
//! GET  /v1/tasks?queue=&kind=&state=&key=&key_prefix=&tag=k:v&error_group=&due_after=
//!                 &due_before=&created_after=&created_before=&limit=&cursor=
//!                                 newest first, by cursor
//! POST /v1/tasks/{id}/cancel      cancel                              200 | 404 409
//! POST /v1/tasks/{id}/trigger     make a scheduled task due now       200 | 404 409
//! POST /v1/queues/{queue}/poll    long-poll for ready tasks           200
//! POST /v1/tasks/{id}/heartbeat   extend the lease                    200 | 404 409
//! POST /v1/tasks/{id}/complete    record success                      200 | 404 409 413
//! POST /v1/tasks/{id}/fail        record failure (retry or dead)      200 | 404 409
//! GET  /v1/tasks/{id}/attempts    the task's attempts, oldest first   200 | 404
//! POST /v1/tasks/{id}/retry       dead or cancelled → scheduled       200 | 404 409
//! POST /v1/tasks:cancel           cancel what a filter matches        200 | 422
//! POST /v1/tasks:retry            retry what a filter matches         200 | 422
//! GET  /v1/queues[/{queue}]       counts, lateness, paused            200 | 404
//! PUT  /v1/queues/{queue}         queue settings (retention)          200 | 422
//! POST /v1/queues/{queue}/pause   pause (durable); …/resume resumes   200 | 422
//! GET  /v1/workers                workers that polled this node       200
//! GET  /v1/cluster                nodes, heartbeats, shards           200
//! GET  /v1/push/secrets           push signing secrets (masked)       200
//! POST /v1/push/secrets[:rotate]  add, or rotate with an overlap      201 | 422
//! DELETE /v1/push/secrets/{id}    stop a secret signing               200 | 404
//! GET  /healthz                   liveness and the store's condition (disk full); never touches the store
//! GET  /metrics                   Prometheus text
//! GET  /openapi.json              this API, generated from the code
//! ```
//!
//! The schedules routes ([`schedules`], `/v1/schedules…`) and the workflow routes
//! ([`workflows`], `/v1/workflows…`, `/v1/workflow-tasks…`, `/v1/workflow-activities…`) are
//! merged in with their own state; `/openapi.json` describes all of them.
//!
//! Error bodies and statuses are described in [`error`]; wire types in [`wire`].
//!
//! Every write (any method but `GET`, `HEAD`, `OPTIONS`) must send `content-type:
//! application/json`, bodiless ones included, or be refused with `415` before anything else
//! happens ([`guard`]): that is what keeps a web page from writing through a browser.
//!
//! **API Boundary:** this crate only translates HTTP to calls on the [`Sundial`] facade; it never
//! reaches into the engine or the store for a state change. **Architecture Invariant:** a request
//! that is answered with an error has stored nothing.
//!
//! The library does not install a metrics recorder: the embedding program does (the `sundial`
//! binary installs the one from [`prometheus_builder`]) and hands its handle in [`ServerConfig`].

pub mod access;
pub mod admin;
pub mod api;
mod constraints;
pub mod duration;
pub mod error;
pub mod extract;
pub mod guard;
mod http_metrics;
pub mod namespace;
pub mod ops;
pub mod push;
pub mod quota;
pub mod schedules;
pub mod time;
pub mod trace;
pub mod ui;
pub mod wire;
pub mod workflows;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use sundial::{StateCount, Sundial};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use error::{ApiError, ErrorBody, ErrorDetail};

/// How the HTTP layer behaves. Engine settings live in [`sundial::Config`].
#[derive(Clone)]
pub struct ServerConfig {
    /// A poll that names no `wait` waits this long; at most the engine's
    /// [`sundial::Config::max_poll_wait`], which caps every poll (the one place that limit lives).
    pub default_poll_wait: Duration,
    /// Largest request body, except for batches.
    pub max_body_bytes: usize,
    /// Largest batch request body.
    pub max_batch_body_bytes: usize,
    /// Most tasks in one batch.
    pub max_batch_items: usize,
    /// Renders `/metrics`; `None` answers `/metrics` with 404.
    pub prometheus: Option<PrometheusHandle>,
    /// Whether `sundial_tasks{queue,state}` also counts Sundial's own queues (`sundial.…`:
    /// schedule ticks, workflow steps, activities). Default `false`.
    pub internal_queue_metrics: bool,
    /// Push delivery: the address policy (`--push-allow`) and client settings. The router
    /// installs the push executor on the `Sundial` when its store keeps push secrets.
    pub push: sundial_push::PushConfig,
    /// Queue default targets: how often queue settings are read, the poll wait, the batch.
    pub queue_push: sundial_push::QueuePushConfig,
    /// Who may do what: when tokens are required, and which service routes stay open.
    pub access: access::AccessConfig,
    /// The web UI at `/ui` (on by default).
    pub ui: ui::UiConfig,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            default_poll_wait: api::DEFAULT_POLL_WAIT,
            max_body_bytes: 1024 * 1024,
            max_batch_body_bytes: 32 * 1024 * 1024,
            max_batch_items: 1_000,
            prometheus: None,
            internal_queue_metrics: false,
            push: sundial_push::PushConfig::default(),
            queue_push: sundial_push::QueuePushConfig::default(),
            access: access::AccessConfig::default(),
            ui: ui::UiConfig::default(),
        }
    }
}

/// A server setting that cannot work, alone or with the engine's; the message names the fields.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ServerConfigError {
    /// A limit that must be at least 1 is 0.
    #[error("{field} is 0: it must be at least 1")]
    Zero { field: &'static str },
    /// A duration that must be longer than zero is zero.
    #[error("{field} is zero: it must be longer than that")]
    ZeroDuration { field: &'static str },
    /// The default poll wait is longer than the engine lets any poll wait.
    #[error(
        "default_poll_wait ({default:?}) is longer than the engine's max_poll_wait ({max:?}): a poll that names no wait could never wait that long"
    )]
    DefaultWaitOverMax { default: Duration, max: Duration },
    /// A batch body limit smaller than a single request's.
    #[error(
        "max_batch_body_bytes ({batch}) is smaller than max_body_bytes ({single}): a batch of one could be refused where the single create is accepted"
    )]
    BatchBodyUnderSingle { batch: usize, single: usize },
}

impl ServerConfig {
    /// Checks the HTTP settings, alone and against the engine's `config` (which caps every
    /// poll's wait). `sundial server` calls it before it serves, and exits non-zero with the
    /// message when it fails.
    pub fn validate(&self, engine: &sundial::Config) -> Result<(), ServerConfigError> {
        let counts: [(&'static str, usize); 4] = [
            ("max_body_bytes", self.max_body_bytes),
            ("max_batch_body_bytes", self.max_batch_body_bytes),
            ("max_batch_items", self.max_batch_items),
            (
                "access.max_polls_per_caller",
                self.access.max_polls_per_caller,
            ),
        ];
        for (field, n) in counts {
            if n == 0 {
                return Err(ServerConfigError::Zero { field });
            }
        }
        if self.access.body_read_timeout.is_zero() {
            return Err(ServerConfigError::ZeroDuration {
                field: "access.body_read_timeout",
            });
        }
        if self.default_poll_wait > engine.max_poll_wait {
            return Err(ServerConfigError::DefaultWaitOverMax {
                default: self.default_poll_wait,
                max: engine.max_poll_wait,
            });
        }
        if self.max_batch_body_bytes < self.max_body_bytes {
            return Err(ServerConfigError::BatchBodyUnderSingle {
                batch: self.max_batch_body_bytes,
                single: self.max_body_bytes,
            });
        }
        Ok(())
    }
}

/// Shared state of the handlers.
#[derive(Clone)]
pub struct AppState {
    pub sundial: Sundial,
    pub config: Arc<ServerConfig>,
    gauges: Arc<TaskGauges>,
    /// What each namespace with quotas has used on this node.
    pub quotas: Arc<quota::Quotas>,
}

/// The `sundial_tasks{queue,state}` gauges, refreshed from the store's counts on every scrape.
/// Remembers which label pairs it has set so that a pair whose count fell to zero reads 0 rather
/// than its last value.
#[derive(Default)]
struct TaskGauges {
    seen: Mutex<HashSet<(String, &'static str)>>,
    queues: Mutex<HashSet<String>>,
}

impl TaskGauges {
    fn record(&self, counts: &[StateCount], internal: bool) {
        let Ok(mut seen) = self.seen.lock() else {
            return;
        };
        let counts: Vec<&StateCount> = counts
            .iter()
            .filter(|c| internal || !sundial::is_internal_queue(&c.queue))
            .collect();
        let now: HashSet<(String, &'static str)> = counts
            .iter()
            .map(|c| (c.queue.clone(), c.state.as_str()))
            .collect();
        for (queue, state) in seen.difference(&now) {
            metrics::gauge!("sundial_tasks", "namespace" => sundial_core::namespace::namespace_of(queue).to_string(), "queue" => sundial_core::namespace::local(queue).to_string(), "state" => *state).set(0.0);
        }
        for c in &counts {
            metrics::gauge!("sundial_tasks", "namespace" => sundial_core::namespace::namespace_of(&c.queue).to_string(), "queue" => sundial_core::namespace::local(&c.queue).to_string(), "state" => c.state.as_str())
                .set(c.count as f64);
        }
        for (queue, _) in now.difference(&seen) {
            sundial::register_queue_metrics(queue);
        }
        seen.extend(now);
    }

    /// `sundial_queue_lateness_seconds{queue}` (how late the queue's oldest due task that has not
    /// started is now; 0 when none is overdue), `sundial_queue_paused{queue}` (1 while paused)
    /// and `sundial_queue_rate_limited{queue}` (due tasks waiting for their rate limit).
    fn record_queues(&self, queues: &[sundial::QueueInfo]) {
        let Ok(mut seen) = self.queues.lock() else {
            return;
        };
        let now: HashSet<String> = queues.iter().map(|q| q.queue.clone()).collect();
        for queue in now.difference(&seen) {
            sundial::register_queue_metrics(queue);
        }
        for queue in seen.difference(&now) {
            metrics::gauge!("sundial_queue_lateness_seconds", "namespace" => sundial_core::namespace::namespace_of(queue).to_string(), "queue" => sundial_core::namespace::local(queue).to_string()).set(0.0);
            metrics::gauge!("sundial_queue_paused", "namespace" => sundial_core::namespace::namespace_of(queue).to_string(), "queue" => sundial_core::namespace::local(queue).to_string()).set(0.0);
            metrics::gauge!("sundial_queue_rate_limited", "namespace" => sundial_core::namespace::namespace_of(queue).to_string(), "queue" => sundial_core::namespace::local(queue).to_string()).set(0.0);
        }
        for q in queues {
            let lateness = q.lateness.map_or(0.0, |d| d.as_secs_f64());
            metrics::gauge!("sundial_queue_lateness_seconds", "namespace" => sundial_core::namespace::namespace_of(&q.queue).to_string(), "queue" => sundial_core::namespace::local(&q.queue).to_string())
                .set(lateness);
            metrics::gauge!("sundial_queue_paused", "namespace" => sundial_core::namespace::namespace_of(&q.queue).to_string(), "queue" => sundial_core::namespace::local(&q.queue).to_string()).set(if q.paused {
                1.0
            } else {
                0.0
            });
            metrics::gauge!("sundial_queue_rate_limited", "namespace" => sundial_core::namespace::namespace_of(&q.queue).to_string(), "queue" => sundial_core::namespace::local(&q.queue).to_string())
                .set(q.rate_limited as f64);
        }
        seen.extend(now);
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Sundial",
        description = "A durable task scheduler: delayed tasks that run on time even if every process dies in between. Durations are strings such as \"1500ms\", \"30s\", \"5m\", \"3d\"; times are RFC 3339. Errors are `{\"error\": {\"code\", \"message\"}}`.",
    ),
    tags(
        (name = "tasks", description = "Create, inspect, cancel and trigger tasks"),
        (name = "workers", description = "The long-poll protocol for remote workers"),
        (name = "queues", description = "Queues: counts, lateness, pause and resume, settings"),
        (name = "service", description = "Health and metrics"),
        (name = "schedules", description = "Recurring schedules: cron and intervals with time zones, DST, overlap and catch-up policies"),
        (name = "workflows", description = "Durable workflows: start, signal, cancel, terminate, inspect"),
        (name = "workflow workers", description = "The long-poll protocol of remote workflow workers"),
        (name = "push", description = "Push delivery: the signing secrets of push calls"),
        (name = "admin", description = "Tokens, namespaces and the audit log (scope admin)"),
    )
)]
struct ApiDoc;

fn api_router(batch_body_limit: usize) -> OpenApiRouter<AppState> {
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_string();
    // The batch route has its own, larger body limit (the innermost limit wins).
    let (schemas, paths, batch) = routes!(api::create_batch);
    let batch = batch.layer(DefaultBodyLimit::max(batch_body_limit));
    OpenApiRouter::with_openapi(doc)
        .routes(routes!(api::create_task, api::list_tasks))
        .routes((schemas, paths, batch))
        .routes(routes!(api::get_task))
        .routes(routes!(api::cancel_task))
        .routes(routes!(api::trigger_task))
        .routes(routes!(api::poll_queue))
        .routes(routes!(api::heartbeat_task))
        .routes(routes!(api::complete_task))
        .routes(routes!(api::fail_task))
        .routes(routes!(ops::list_queues))
        .routes(routes!(ops::get_queue, ops::put_queue))
        .routes(routes!(ops::pause_queue))
        .routes(routes!(ops::resume_queue))
        .routes(routes!(ops::task_attempts))
        .routes(routes!(ops::retry_task))
        .routes(routes!(ops::cancel_matching))
        .routes(routes!(ops::retry_matching))
        .routes(routes!(ops::list_workers))
        .routes(routes!(ops::cluster_status))
        .routes(routes!(api::healthz))
        .routes(routes!(api::metrics))
}

/// The OpenAPI document of the v1 API, as served at `/openapi.json`: tasks, workers, service,
/// schedules and workflows.
pub fn openapi() -> utoipa::openapi::OpenApi {
    let mut doc = api_router(ServerConfig::default().max_batch_body_bytes).into_openapi();
    doc.merge(schedules::openapi());
    doc.merge(workflows::openapi());
    doc.merge(push::openapi());
    doc.merge(admin::openapi());
    document_common_errors(&mut doc);
    // The server's field checks as JSON Schema keywords.
    constraints::apply(&mut doc);
    doc
}

/// Lists on every operation the error answers that the server's shared layers give, whatever the
/// handler: `401` and `403` (the access layer) everywhere but `/healthz`, `408`, `415`, `400`,
/// `413` and `422` wherever a body is read, `422` wherever query parameters
/// are, `404` wherever a path names something, `405` (another method on the route) and `503`
/// (shutting down, store unavailable) everywhere. An answer an operation already describes is
/// kept as it is.
fn document_common_errors(doc: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::path::{Operation, ParameterIn};
    use utoipa::openapi::{Content, Ref, RefOr, ResponseBuilder};
    let error = |description: &str| {
        RefOr::T(
            ResponseBuilder::new()
                .description(description)
                .content(
                    "application/json",
                    Content::new(Some(Ref::from_schema_name("ErrorBody"))),
                )
                .build(),
        )
    };
    let add = |op: &mut Operation, status: &str, description: &str| {
        op.responses
            .responses
            .entry(status.to_string())
            .or_insert_with(|| error(description));
    };
    for (path, item) in doc.paths.paths.iter_mut() {
        let open = path == "/healthz";
        let ops = [
            item.get.as_mut(),
            item.put.as_mut(),
            item.post.as_mut(),
            item.delete.as_mut(),
            item.patch.as_mut(),
        ];
        for op in ops.into_iter().flatten() {
            let params = op.parameters.as_deref().unwrap_or(&[]);
            let located = |at: ParameterIn| {
                params
                    .iter()
                    .any(|p| matches!(p, RefOr::T(p) if p.parameter_in == at))
            };
            let (in_path, in_query) = (located(ParameterIn::Path), located(ParameterIn::Query));
            if !open {
                // The access layer (`access.rs`), when auth is on.
                add(
                    op,
                    "401",
                    "No token, or a bad, revoked or expired one (`unauthenticated`; `WWW-Authenticate: Bearer`); audited",
                );
                add(
                    op,
                    "403",
                    "The token's scope does not allow this (`forbidden`); audited",
                );
            }
            if op.request_body.is_some() {
                add(
                    op,
                    "415",
                    "Not `content-type: application/json` (`unsupported_media_type`); nothing stored",
                );
                add(
                    op,
                    "408",
                    "The body did not arrive in time (`timeout`); nothing stored",
                );
                add(op, "400", "The body is not JSON (`malformed`)");
                add(op, "413", "The body is over its limit (`too_large`)");
                add(
                    op,
                    "422",
                    "Well-formed but invalid (`invalid`, with `field`); nothing stored",
                );
            }
            if in_query {
                add(
                    op,
                    "422",
                    "Unknown parameter or bad value (`invalid`, with `field`)",
                );
            }
            if in_path {
                add(op, "404", "No such resource (`not_found`)");
            }
            add(
                op,
                "405",
                "The route exists, the method does not (`method_not_allowed`)",
            );
            add(
                op,
                "503",
                "Shutting down, or the store cannot be reached for now (`shutting_down`, `unavailable`; with `Retry-After`)",
            );
        }
    }
}

/// The whole HTTP service over `sundial`. The caller runs the engine (`sundial.start()`) and
/// serves the router (`axum::serve`).
pub fn router(sundial: Sundial, config: ServerConfig) -> Router {
    let body_limit = config.max_body_bytes;
    let batch_limit = config.max_batch_body_bytes;
    // The schedules API, when the store has schedule tables (attaching registers the tick
    // handler, so the router must be built before the engine starts).
    let schedules = sundial_schedules::Schedules::attach(&sundial).ok();
    // The workflows API, likewise (attaching registers the timer and child-start handlers).
    let workflows = sundial_workflow::Workflows::attach(&sundial).ok();
    // Push delivery, when the store keeps push secrets (installs the push handler, so this too
    // happens before the engine starts).
    let push = sundial.push_secret_store().and_then(
        |secrets| match sundial_push::PushExecutor::new(
            config.push.clone(),
            secrets.clone(),
            sundial.clock().clone(),
        ) {
            Ok(exec) => {
                // Activities with an HTTP target are push tasks whose result goes to their
                // workflow's history: the workflow runtime wraps the handler.
                let handler = exec.handler(&sundial);
                sundial.set_push_handler(match &workflows {
                    Some(w) => w.push_handler(handler),
                    None => handler,
                });
                // Queue default targets: served by pushers on this node's runtime (the router
                // is built inside one; without one there is nothing to run them on).
                if tokio::runtime::Handle::try_current().is_ok() {
                    sundial_push::queue::spawn(
                        sundial.clone(),
                        exec.clone(),
                        config.queue_push.clone(),
                    );
                }
                Some(exec)
            }
            Err(e) => {
                tracing::error!(error = %e, "push delivery is off: cannot build its HTTP client");
                None
            }
        },
    );
    let access = access::Access::new(
        sundial.clone(),
        sundial.access_store().cloned(),
        config.access.clone(),
    );
    let state = AppState {
        sundial,
        config: Arc::new(config),
        gauges: Arc::new(TaskGauges::default()),
        quotas: Arc::new(quota::Quotas::default()),
    };
    let ui_state = state.config.ui.enabled.then(|| {
        ui::UiState::new(
            state.clone(),
            access.clone(),
            schedules.clone(),
            workflows.clone(),
        )
    });
    let (router, _) = api_router(batch_limit).split_for_parts();
    let doc = openapi();
    let doc_json: Arc<str> = match doc.to_json() {
        Ok(s) => Arc::from(s),
        Err(e) => {
            tracing::error!(error = %e, "cannot serialise the OpenAPI document");
            Arc::from("{}")
        }
    };
    let router = router
        .route(
            "/openapi.json",
            get(move || {
                let doc = doc_json.clone();
                async move {
                    (
                        [(header::CONTENT_TYPE, "application/json")],
                        doc.to_string(),
                    )
                }
            }),
        )
        .fallback(|| async { ApiError::not_found("no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "method not allowed on this route",
            )
            .into_response()
        })
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state);
    let router = match schedules {
        Some(s) => router.merge(schedules::router(s, body_limit)),
        None => router,
    };
    let router = match push {
        Some(p) => router.merge(push::router(p, body_limit)),
        None => router,
    };
    let router = match workflows {
        Some(w) => router.merge(workflows::router(w, body_limit)),
        None => router,
    };
    let router = router.merge(admin::router(access.clone(), body_limit));
    // Around every route (so its template is known): the cross-site guard, authentication,
    // authorization and the audit record (see `access`).
    let router = router.route_layer(axum::middleware::from_fn_with_state(
        access,
        access::access_layer,
    ));
    // The web UI is merged after that layer: its pages authenticate by a session cookie and its
    // form posts by a CSRF token (see `ui`), and it writes its own audit records.
    let router = match ui_state {
        Some(ui_state) => router.merge(ui::router(ui_state)),
        None => router,
    };
    // Outside all that, the request metrics: the route template is marked after routing and read
    // by the outermost layer, which also sees requests no route matched.
    let router = router
        .route_layer(axum::middleware::from_fn(http_metrics::mark_route))
        .layer(axum::middleware::from_fn(http_metrics::record));
    // Outermost, before routing: a `/v1/namespaces/{ns}/…` path is routed as `/v1/…` in
    // namespace `ns` (see `namespace`). A layer of the routing router itself would run after
    // routing, so the routes sit in the fallback of a router of their own.
    Router::new()
        .fallback_service(router)
        .layer(axum::middleware::map_request(namespace::select))
}

/// A Prometheus recorder builder with Sundial's histogram buckets (seconds, from 0.5 ms to 10 min)
/// for lateness, waits and durations. The embedding program installs it
/// (`prometheus_builder().install_recorder()`) and runs the handle's upkeep periodically.
pub fn prometheus_builder() -> PrometheusBuilder {
    const BUCKETS: [f64; 16] = [
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0,
        300.0, 600.0,
    ];
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".to_string()), &BUCKETS)
        .unwrap_or_else(|_| PrometheusBuilder::new())
}

/// Registers descriptions of the metrics the engine and the server emit (shown as `# HELP`), and
/// the counters whose labels are known in advance at 0, so that an alert over them has data from
/// the start (per-queue counters are registered for the `default` queue when the engine starts
/// and for each other queue when a scrape first sees it).
///
/// Names follow the Prometheus conventions: base units (`_seconds`), `_total` on counters, one
/// subject prefix in the singular (`sundial_task_`, `sundial_schedule_`, `sundial_workflow_`,
/// `sundial_queue_`, `sundial_shard_`, `sundial_http_`); `sundial_tasks` is the number of tasks.
/// Labels are bounded: namespace (non-default namespaces have their own series), queue, state, shard, an outcome from a fixed list, a route template;
/// never a kind, an attempt or an id.
pub fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_gauge!(
        "sundial_tasks",
        "Tasks by queue and state (refreshed on scrape)"
    );
    describe_counter!(
        "sundial_task_created_total",
        "Tasks created (through the API or by a schedule's fire), by queue"
    );
    describe_counter!(
        "sundial_task_debounced_total",
        "Debounced creates that replaced a pending task of their key instead of storing one, by queue"
    );
    describe_counter!(
        "sundial_task_succeeded_total",
        "Attempts that succeeded (tasks that finished succeeded), by queue"
    );
    describe_counter!(
        "sundial_task_cancelled_total",
        "Tasks cancelled (one by one or by a filter), by queue"
    );
    describe_counter!("sundial_task_dead_total", "Tasks that went dead, by queue");
    describe_counter!("sundial_task_failures_total", "Failed attempts, by queue");
    describe_counter!(
        "sundial_task_retries_total",
        "Failed attempts that were rescheduled, by queue"
    );
    describe_counter!(
        "sundial_retention_deleted_total",
        "Rows deleted by retention, by what (tasks, schedule_fires, workflow_runs, audit)"
    );
    describe_histogram!(
        "sundial_fire_lateness_seconds",
        metrics::Unit::Seconds,
        "Start (handler, or a waiting poll's hand-off) or readiness (worker) minus when the task became due (its due time, or its creation when created already due)"
    );
    describe_histogram!(
        "sundial_dispatch_wait_seconds",
        metrics::Unit::Seconds,
        "A worker's claim minus when the task became due"
    );
    describe_histogram!(
        "sundial_poll_wait_seconds",
        metrics::Unit::Seconds,
        "How long a poll that got tasks waited for them"
    );
    describe_histogram!(
        "sundial_task_duration_seconds",
        metrics::Unit::Seconds,
        "Attempt run time, by queue (in-process handlers, and remote workers from poll to complete or fail)"
    );
    describe_counter!(
        "sundial_reaper_restarts_total",
        "Times the lease reaper was restarted after a panic"
    );
    describe_counter!(
        "sundial_shard_loop_restarts_total",
        "Times a shard loop was restarted after a panic, by shard"
    );
    describe_counter!(
        "sundial_schedule_fires_total",
        "Schedule fire times recorded, by outcome (fired, skipped, missed) and reason"
    );
    describe_counter!(
        "sundial_schedule_rearmed_total",
        "Schedules whose armed tick was gone or finished and that were armed again"
    );
    describe_histogram!(
        "sundial_schedule_fire_lateness_seconds",
        metrics::Unit::Seconds,
        "A schedule fire's task creation minus its nominal fire time (jitter included)"
    );
    describe_counter!("sundial_workflow_started_total", "Workflow runs started");
    describe_counter!(
        "sundial_workflow_closed_total",
        "Workflow runs closed, by status"
    );
    describe_counter!(
        "sundial_workflow_tasks_total",
        "Workflow tasks (replays) committed"
    );
    describe_counter!(
        "sundial_workflow_tasks_stale_total",
        "Workflow tasks refused as stale (the history grew meanwhile) and replayed again"
    );
    describe_gauge!(
        "sundial_build_info",
        "Always 1; the version label is this build's"
    );
    metrics::gauge!("sundial_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    describe_counter!(
        "sundial_lease_expiries_total",
        "Running attempts whose lease expired, by queue"
    );
    describe_gauge!(
        "sundial_shard_window_tasks",
        "Tasks held in a shard's in-memory look-ahead window (a count)"
    );
    describe_counter!(
        "sundial_store_scans_total",
        "Due-index range scans, by shard"
    );
    describe_gauge!(
        "sundial_queue_lateness_seconds",
        metrics::Unit::Seconds,
        "How late the queue's oldest due task that has not started is now (0 when none is overdue; refreshed on scrape)"
    );
    describe_gauge!(
        "sundial_queue_paused",
        "1 while the queue is paused (refreshed on scrape)"
    );
    describe_gauge!(
        "sundial_queue_rate_limited",
        "Due tasks with a rate limit that have not started: waiting for their limit's turn (refreshed on scrape)"
    );
    describe_counter!(
        "sundial_rate_limited_total",
        "Claims a rate limit refused (each retried at the limit's next turn) and worker polls that passed over a task before its take turn, by queue"
    );
    describe_counter!(
        "sundial_queue_limited_total",
        "Starts the queue's concurrency limit refused (each waits in line for a place), by queue"
    );
    describe_counter!(
        "sundial_poll_looks_skipped_total",
        "Worker polls that waited at once, without a store claim, because their queue was found empty and nothing could have readied a task since, by queue"
    );
    describe_gauge!(
        "sundial_shard_owned",
        "1 while this node runs the shard's loop (owns it), else 0; every node reports every shard, so max by (shard) over the nodes is 0 for a shard without owner"
    );
    describe_counter!(
        "sundial_http_requests_total",
        "HTTP requests answered, by route template (unmatched for no route), method and status class"
    );
    describe_histogram!(
        "sundial_http_request_duration_seconds",
        metrics::Unit::Seconds,
        "Time to answer an HTTP request (to the response head; a long poll's wait included), by route template, method and status class"
    );
    process_collector().describe();
    register_fixed_counters();
}

/// The counters whose label values are a fixed list, at 0.
fn register_fixed_counters() {
    use sundial_store::{FireOutcome, FireReason, WorkflowStatus};
    for (outcome, reason) in [
        (FireOutcome::Fired, FireReason::Schedule),
        (FireOutcome::Fired, FireReason::Trigger),
        (FireOutcome::Fired, FireReason::Backfill),
        (FireOutcome::Skipped, FireReason::Overlap),
        (FireOutcome::Skipped, FireReason::Paused),
        (FireOutcome::Missed, FireReason::OutsideCatchupWindow),
    ] {
        metrics::counter!(
            "sundial_schedule_fires_total",
            "outcome" => outcome.as_str(),
            "reason" => reason.as_str()
        )
        .increment(0);
    }
    metrics::counter!("sundial_schedule_rearmed_total").increment(0);
    metrics::counter!("sundial_workflow_started_total").increment(0);
    for status in WorkflowStatus::ALL.into_iter().filter(|s| s.is_closed()) {
        metrics::counter!("sundial_workflow_closed_total", "status" => status.as_str())
            .increment(0);
    }
    metrics::counter!("sundial_workflow_tasks_total").increment(0);
    metrics::counter!("sundial_workflow_tasks_stale_total").increment(0);
    for what in ["tasks", "schedule_fires", "workflow_runs", "audit"] {
        metrics::counter!("sundial_retention_deleted_total", "what" => what).increment(0);
    }
}

/// The `process_*` metrics (CPU seconds, resident and virtual memory, open and maximum file
/// descriptors, threads, start time), read from the operating system on each scrape.
pub(crate) fn process_collector() -> &'static metrics_process::Collector {
    static COLLECTOR: std::sync::OnceLock<metrics_process::Collector> = std::sync::OnceLock::new();
    COLLECTOR.get_or_init(metrics_process::Collector::default)
}

#[cfg(test)]
mod config_tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid_with_the_engines() {
        assert_eq!(
            ServerConfig::default().validate(&sundial::Config::default()),
            Ok(())
        );
    }

    #[test]
    fn each_contradiction_is_refused_naming_its_fields() {
        let engine = sundial::Config::default();
        let short_engine = sundial::Config {
            max_poll_wait: Duration::from_secs(5),
            ..sundial::Config::default()
        };
        let cases: Vec<(ServerConfig, &sundial::Config, &str)> = vec![
            (
                ServerConfig {
                    max_batch_items: 0,
                    ..ServerConfig::default()
                },
                &engine,
                "max_batch_items",
            ),
            (
                ServerConfig {
                    max_body_bytes: 0,
                    ..ServerConfig::default()
                },
                &engine,
                "max_body_bytes",
            ),
            (
                ServerConfig {
                    access: access::AccessConfig {
                        max_polls_per_caller: 0,
                        ..access::AccessConfig::default()
                    },
                    ..ServerConfig::default()
                },
                &engine,
                "access.max_polls_per_caller",
            ),
            (
                ServerConfig {
                    access: access::AccessConfig {
                        body_read_timeout: Duration::ZERO,
                        ..access::AccessConfig::default()
                    },
                    ..ServerConfig::default()
                },
                &engine,
                "access.body_read_timeout",
            ),
            (ServerConfig::default(), &short_engine, "max_poll_wait"),
            (
                ServerConfig {
                    max_batch_body_bytes: 10,
                    ..ServerConfig::default()
                },
                &engine,
                "max_batch_body_bytes",
            ),
        ];
        for (config, engine, field) in cases {
            let e = config.validate(engine).expect_err(field);
            assert!(e.to_string().contains(field), "{field}: {e}");
        }
    }
}

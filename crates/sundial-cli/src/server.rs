//! `sundial server`: the engine on the embedded store (or, with `--database-url`, as one node of
//! a cluster sharing PostgreSQL), served over HTTP.
//!
//! Start-up: bind (before anything touches the data directory), install the Prometheus recorder,
//! open the store, print
//! `sundial listening on http://ADDR` on stdout (scripts and tests read the address from it, which
//! is how `--listen 127.0.0.1:0` is useful), start the engine and serve.
//!
//! Shutdown (SIGTERM or Ctrl-C): stop accepting connections, stop the engine (waiting polls return
//! empty, new creates get 503), let in-process work finish within `--shutdown-grace`, let HTTP
//! requests in flight finish, exit 0.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use std::future::Future;
use std::sync::Arc;
use sundial::{Config, Durability, Retention, SqliteOptions, Sundial};
use sundial_server::ServerConfig;
use sundial_server::access::{AccessConfig, AuthMode};
use sundial_store_postgres::{PostgresOptions, PostgresStore};
use tokio::sync::watch;

/// The exit status when the embedded store cannot be opened (the data directory is in use, the
/// database is corrupt, truncated or from a newer build).
pub const EXIT_STORE_UNUSABLE: u8 = 3;

fn parse_duration(s: &str) -> Result<Duration, String> {
    sundial_server::duration::parse(s).map_err(|e| e.to_string())
}

#[derive(Args, Debug)]
#[command(
    after_help = "Environment: SUNDIAL_BOOTSTRAP_TOKEN=sdl_… (96 hex digits after sdl_, e.g. \
sdl_$(openssl rand -hex 48)) is stored as the admin token `bootstrap` when the store has no token \
yet, and ignored once any token exists."
)]
pub struct ServerArgs {
    /// Directory of the embedded store (created if missing).
    #[arg(long, env = "SUNDIAL_DATA_DIR", default_value = "./sundial-data")]
    data_dir: PathBuf,
    /// Export traces over OTLP/HTTP (protobuf) to this collector, e.g. http://127.0.0.1:4318
    /// (`/v1/traces` is appended unless the URL ends with it). Nothing is exported without it.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    /// Address to listen on, HOST:PORT (`127.0.0.1:7373`, `localhost:7373`, `[::1]:7373`); a
    /// host name is resolved and the first address that binds is used. Port 0 picks a free port
    /// (the address is printed at start).
    #[arg(long, env = "SUNDIAL_LISTEN", default_value = crate::DEFAULT_LISTEN)]
    listen: String,
    /// Longest a worker's poll may wait for tasks (the engine's `Config::max_poll_wait`, the one
    /// place this limit lives). A poll that names no wait waits 30 s, or this when it is shorter.
    #[arg(long, env = "SUNDIAL_MAX_POLL_WAIT", default_value = "60s", value_parser = parse_duration)]
    max_poll_wait: Duration,
    /// Ready every due task for the polls to claim, instead of starting it straight for a poll
    /// that already waits for its queue (the engine's `Config::hand_off_to_polls`).
    #[arg(long, env = "SUNDIAL_NO_HAND_OFF")]
    no_hand_off: bool,
    /// Hand-off: how long before its due time a task is started for a poll that already waits
    /// (its attempt recorded as started at the due time), so the start's commit does not delay
    /// the delivery; the poll still answers at the due time, never before. At most 5s (the
    /// look-ahead); 0s starts at the due time.
    #[arg(long, env = "SUNDIAL_HAND_OFF_LEAD", default_value = "3ms", value_parser = parse_duration)]
    hand_off_lead: Duration,
    /// In-process handlers (schedule ticks, workflow steps): how long before its due time a task
    /// is claimed (its attempt recorded as started at the due time), so a claim queued behind a
    /// large write does not make the handler late; the handler still runs at the due time,
    /// never before. At most 5s (the look-ahead); 0s claims at the due time. One node only.
    #[arg(long, env = "SUNDIAL_RUN_CLAIM_LEAD", default_value = "40ms", value_parser = parse_duration)]
    run_claim_lead: Duration,
    /// Most tasks in one `POST /v1/tasks:batch`.
    #[arg(long, env = "SUNDIAL_MAX_BATCH", default_value_t = 1_000)]
    max_batch: usize,
    /// On shutdown, how long in-process work may take to finish.
    #[arg(long, env = "SUNDIAL_SHUTDOWN_GRACE", default_value = "10s", value_parser = parse_duration)]
    shutdown_grace: Duration,
    /// `full`: every commit is fsynced before its reply (survives power loss). `normal`: fsync
    /// at checkpoints only (survives a process crash such as kill -9; the last commits may be
    /// lost on power loss).
    #[arg(long, env = "SUNDIAL_DURABILITY", value_enum, default_value_t = DurabilityArg::Full)]
    durability: DurabilityArg,
    /// PostgreSQL instead of the embedded store: several servers given the same URL (and schema)
    /// share the work. Example: postgres://user@127.0.0.1:5432/db
    #[arg(long, env = "SUNDIAL_DATABASE_URL")]
    database_url: Option<String>,
    /// PostgreSQL schema holding Sundial's tables (created if missing).
    #[arg(long, env = "SUNDIAL_DATABASE_SCHEMA", default_value = "sundial")]
    database_schema: String,
    /// This node's name in the cluster (default: host name and process id). Must be unique among
    /// the running nodes.
    #[arg(long, env = "SUNDIAL_NODE_ID")]
    node_id: Option<String>,
    /// Shards of the due index, recorded when the store is created (the embedded store in its
    /// data directory, PostgreSQL in the schema). A store keeps its count for good: a different
    /// value on a later start is ignored with a warning, and the server runs with the stored
    /// count (a store from a build that did not record it gets one derived from its tasks).
    #[arg(long, env = "SUNDIAL_SHARDS", default_value_t = DEFAULT_SHARDS)]
    shards: u32,
    /// Also count Sundial's own queues (`sundial.schedules`, `sundial.workflows`,
    /// `sundial.activities`, …) in the `sundial_tasks` gauge.
    #[arg(long, env = "SUNDIAL_METRICS_INTERNAL_QUEUES")]
    metrics_internal_queues: bool,
    /// How long a create's idempotency key is remembered after its task finished.
    #[arg(long, env = "SUNDIAL_IDEMPOTENCY_WINDOW", default_value = "24h", value_parser = parse_duration)]
    idempotency_window: Duration,
    /// With PostgreSQL: how long a node's shard leases last without renewal.
    #[arg(long, env = "SUNDIAL_SHARD_LEASE_TTL", default_value = "10s", value_parser = parse_duration)]
    shard_lease_ttl: Duration,
    /// How long succeeded tasks are kept after they finished (a queue may override it).
    #[arg(long, env = "SUNDIAL_RETENTION_SUCCEEDED", default_value = "7d", value_parser = parse_duration)]
    retention_succeeded: Duration,
    /// How long cancelled tasks are kept after they finished (a queue may override it).
    #[arg(long, env = "SUNDIAL_RETENTION_CANCELLED", default_value = "7d", value_parser = parse_duration)]
    retention_cancelled: Duration,
    /// How long dead tasks are kept after they finished (a queue may override it).
    #[arg(long, env = "SUNDIAL_RETENTION_DEAD", default_value = "30d", value_parser = parse_duration)]
    retention_dead: Duration,
    /// How long schedule fire records are kept.
    #[arg(long, env = "SUNDIAL_RETENTION_SCHEDULE_FIRES", default_value = "7d", value_parser = parse_duration)]
    retention_schedule_fires: Duration,
    /// How long closed workflow runs (with their histories) are kept after they closed.
    #[arg(long, env = "SUNDIAL_RETENTION_WORKFLOW_RUNS", default_value = "7d", value_parser = parse_duration)]
    retention_workflow_runs: Duration,
    /// How long audit records are kept.
    #[arg(long, env = "SUNDIAL_RETENTION_AUDIT", default_value = "30d", value_parser = parse_duration)]
    retention_audit: Duration,
    /// Keep everything: never delete finished tasks, fire records, closed workflow runs or
    /// audit records.
    #[arg(long, env = "SUNDIAL_NO_RETENTION")]
    no_retention: bool,
    /// Push delivery: a destination allowed although it is not public (loopback, private,
    /// link-local, …): a CIDR (`10.0.0.0/8`), an address, `address:port` or `host:port`.
    /// Repeat or separate with commas.
    #[arg(long = "push-allow", env = "SUNDIAL_PUSH_ALLOW", value_delimiter = ',')]
    push_allow: Vec<String>,
    /// Push delivery: calls under way at once on this node.
    #[arg(long, env = "SUNDIAL_PUSH_CONCURRENCY", default_value_t = 1_024)]
    push_concurrency: usize,
    /// Push delivery: calls under way at once to one receiver (host:port), counting the calls
    /// claimed ahead that wait for their due time (a receiver's calls/s × the claim lead).
    /// Default 512, or --push-concurrency when that is smaller.
    #[arg(long, env = "SUNDIAL_PUSH_HOST_CONCURRENCY")]
    push_host_concurrency: Option<usize>,
    /// Push delivery: how long before its due time a push task is claimed (its attempt recorded
    /// as started), so the claim's commit does not delay the call; the call still goes out at
    /// the due time. At most 5s (the look-ahead); 0s claims at the due time.
    #[arg(long, env = "SUNDIAL_PUSH_CLAIM_LEAD", default_value = "200ms", value_parser = parse_duration)]
    push_claim_lead: Duration,
    /// `auto`: tokens are required on a non-loopback address, and on loopback as soon as any
    /// token exists. `required`: always, loopback included.
    #[arg(long, env = "SUNDIAL_AUTH", value_enum, default_value_t = AuthArg::Auto)]
    auth: AuthArg,
    /// Serve without tokens even on a non-loopback address: anyone who reaches the port may do
    /// anything. Only behind something else that checks who is asking.
    #[arg(long, env = "SUNDIAL_INSECURE_NO_AUTH", conflicts_with = "auth")]
    insecure_no_auth: bool,
    /// Whether `/metrics` answers without a token when auth is on (default: on loopback only).
    #[arg(long, env = "SUNDIAL_OPEN_METRICS")]
    open_metrics: Option<bool>,
    /// Whether `/openapi.json` answers without a token when auth is on (default: on loopback
    /// only).
    #[arg(long, env = "SUNDIAL_OPEN_OPENAPI")]
    open_openapi: Option<bool>,
    /// Do not serve the web UI at /ui.
    #[arg(long, env = "SUNDIAL_NO_UI")]
    no_ui: bool,
    /// PEM certificate chain: serve HTTPS (with --tls-key).
    #[arg(long, env = "SUNDIAL_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "SUNDIAL_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// How long a client may take to send a request's headers; a slower one is disconnected, so
    /// a slow client cannot hold a connection open.
    #[arg(long, env = "SUNDIAL_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    header_read_timeout: Duration,
    /// How long a client may take to send a request's body (`408` after).
    #[arg(long, env = "SUNDIAL_BODY_READ_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    body_read_timeout: Duration,
    /// Most long polls one token (or, with auth off, all callers together) may hold open.
    #[arg(long, env = "SUNDIAL_MAX_POLLS_PER_TOKEN", default_value_t = 64)]
    max_polls_per_token: usize,
}

/// Largest request head (request line and headers) a client may send.
const MAX_HEADER_BYTES: usize = 64 * 1024;

/// The limits every connection gets, whether plain or TLS: the head must arrive within
/// `header_read_timeout` and fit in [`MAX_HEADER_BYTES`].
fn limit_connections(
    builder: &mut hyper_util::server::conn::auto::Builder<hyper_util::rt::TokioExecutor>,
    header_read_timeout: Duration,
) {
    builder
        .http1()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .max_buf_size(MAX_HEADER_BYTES);
}

/// Reads the PEM certificate and key (refusing to start on a bad pair).
async fn tls_config(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> anyhow::Result<axum_server::tls_rustls::RustlsConfig> {
    // ring, installed once for the process (a second install fails harmlessly).
    let _ = rustls::crypto::ring::default_provider().install_default();
    axum_server::tls_rustls::RustlsConfig::from_pem_file(cert, key)
        .await
        .with_context(|| {
            format!(
                "cannot load the TLS certificate {} and key {}",
                cert.display(),
                key.display()
            )
        })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum AuthArg {
    Auto,
    Required,
}

/// The auth rule (README "Security"): a non-loopback address requires tokens unless
/// `--insecure-no-auth`; on loopback tokens are required with `--auth required`, or as soon as
/// any token exists.
fn access_config(args: &ServerArgs, addr: &SocketAddr) -> AccessConfig {
    let loopback = addr.ip().is_loopback();
    let mode = if args.insecure_no_auth {
        AuthMode::Off
    } else if args.auth == AuthArg::Required || !loopback {
        AuthMode::Required
    } else {
        AuthMode::WhenTokensExist
    };
    AccessConfig {
        mode,
        open_metrics: args.open_metrics.unwrap_or(loopback),
        open_openapi: args.open_openapi.unwrap_or(loopback),
        max_polls_per_caller: args.max_polls_per_token,
        body_read_timeout: args.body_read_timeout,
    }
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum DurabilityArg {
    Full,
    Normal,
}

/// Binds `listen` (HOST:PORT, the host an IP address or a name to resolve): the first resolved
/// address that binds wins.
async fn bind(listen: &str) -> anyhow::Result<tokio::net::TcpListener> {
    let addrs: Vec<SocketAddr> = match listen.parse::<SocketAddr>() {
        Ok(a) => vec![a],
        Err(_) => tokio::net::lookup_host(listen)
            .await
            .with_context(|| {
                format!("cannot resolve --listen {listen:?}: use HOST:PORT, for example 127.0.0.1:7373 or localhost:7373")
            })?
            .collect(),
    };
    let mut last = None;
    for addr in &addrs {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => return Ok(l),
            Err(e) => last = Some((addr, e)),
        }
    }
    match last {
        Some((addr, e)) => Err(e).with_context(|| format!("cannot listen on {addr}")),
        None => anyhow::bail!("--listen {listen:?} resolves to no address"),
    }
}

/// The exit status when the settings contradict each other (the message names them).
pub const EXIT_BAD_CONFIG: u8 = 2;

impl ServerArgs {
    /// Where traces go, when configured (empty counts as not).
    pub fn otlp_endpoint(&self) -> Option<String> {
        self.otlp_endpoint.clone().filter(|e| !e.trim().is_empty())
    }
}

/// The shard count a new store gets unless `--shards` says otherwise.
pub const DEFAULT_SHARDS: u32 = 16;

pub async fn run(args: ServerArgs) -> anyhow::Result<ExitCode> {
    let config = Config {
        max_poll_wait: args.max_poll_wait,
        hand_off_to_polls: !args.no_hand_off,
        hand_off_lead: args.hand_off_lead,
        run_claim_lead: args.run_claim_lead,
        shard_count: args.shards,
        shard_lease_ttl: args.shard_lease_ttl,
        retention: Retention {
            enabled: !args.no_retention,
            succeeded: args.retention_succeeded,
            cancelled: args.retention_cancelled,
            dead: args.retention_dead,
            schedule_fires: args.retention_schedule_fires,
            workflow_runs: args.retention_workflow_runs,
            audit: args.retention_audit,
            ..Retention::default()
        },
        push_concurrency: args.push_concurrency,
        push_host_concurrency: args.push_host_concurrency.unwrap_or(
            Config::default()
                .push_host_concurrency
                .min(args.push_concurrency),
        ),
        push_claim_lead: args.push_claim_lead,
        idempotency_window: args.idempotency_window,
        ..Config::default()
    };
    if let Err(e) = config.validate() {
        eprintln!("error: invalid settings: {e}");
        return Ok(ExitCode::from(EXIT_BAD_CONFIG));
    }
    // A malformed bootstrap token stops the server before it binds or opens anything.
    let bootstrap_token = match crate::bootstrap::from_env() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: invalid settings: {e}");
            return Ok(ExitCode::from(EXIT_BAD_CONFIG));
        }
    };
    let push_policy =
        sundial_push::AddressPolicy::parse(&args.push_allow).context("invalid --push-allow")?;
    // Bind first: a refused address must not leave a freshly created, empty data directory.
    let listener = bind(&args.listen).await?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(tls_config(cert, key).await?),
        _ => None,
    };
    let prometheus = sundial_server::prometheus_builder()
        .install_recorder()
        .context("cannot install the metrics recorder")?;
    sundial_server::describe_metrics();
    let upkeep = prometheus.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });

    let addr = listener
        .local_addr()
        .context("cannot read the bound address")?;
    let access = access_config(&args, &addr);
    if access.mode == AuthMode::Off && !addr.ip().is_loopback() {
        tracing::warn!(%addr, "--insecure-no-auth: anyone who reaches this address may do anything");
    }
    let server_config = ServerConfig {
        default_poll_wait: sundial_server::api::DEFAULT_POLL_WAIT.min(args.max_poll_wait),
        max_batch_items: args.max_batch,
        prometheus: Some(prometheus),
        internal_queue_metrics: args.metrics_internal_queues,
        push: sundial_push::PushConfig {
            client: sundial_push::ClientConfig {
                policy: push_policy,
                // A receiver's calls under way reuse kept-alive connections, none reopened.
                pool_max_idle_per_host: config.push_host_concurrency,
                ..sundial_push::ClientConfig::default()
            },
            ..sundial_push::PushConfig::default()
        },
        access: access.clone(),
        // The UI's cookies are `Secure` when the server speaks TLS.
        ui: sundial_server::ui::UiConfig {
            enabled: !args.no_ui,
            secure_cookies: tls.is_some(),
        },
        ..ServerConfig::default()
    };
    if let Err(e) = server_config.validate(&config) {
        eprintln!("error: invalid settings: {e}");
        return Ok(ExitCode::from(EXIT_BAD_CONFIG));
    }
    let sqlite = SqliteOptions {
        durability: match args.durability {
            DurabilityArg::Full => Durability::Full,
            DurabilityArg::Normal => Durability::Normal,
        },
        ..SqliteOptions::default()
    };
    let sundial = match &args.database_url {
        None => match Sundial::builder()
            .config(config)
            .sqlite_options(sqlite)
            .open(&args.data_dir)
            .await
        {
            Ok(s) => s,
            Err(e) => {
                // In use, corrupt, truncated, newer than this build: nothing to retry blindly.
                eprintln!(
                    "error: cannot open the store in {}: {e}",
                    args.data_dir.display()
                );
                return Ok(ExitCode::from(EXIT_STORE_UNUSABLE));
            }
        },
        Some(url) => {
            let store = PostgresStore::connect(
                url,
                PostgresOptions {
                    schema: args.database_schema.clone(),
                    // A session stalled inside a transaction (this process stopped) must let go
                    // of its lease-row lock before its shard leases end, so that the others can
                    // take the shards over on time.
                    // `Config::validate` keeps the TTL at 1 s or more, so this is at least 500 ms.
                    idle_in_transaction_timeout: Some(args.shard_lease_ttl / 2),
                    ..PostgresOptions::default()
                },
            )
            .await
            .context("cannot connect to PostgreSQL")?;
            let store = Arc::new(store);
            let node = args.node_id.clone().unwrap_or_else(default_node_id);
            tracing::info!(node = %node, schema = %args.database_schema, "joining the cluster");
            Sundial::builder()
                .config(config)
                .schedule_store(store.clone())
                .workflow_store(store.clone())
                .push_secret_store(store.clone())
                .access_store(store.clone())
                .join_cluster(store.clone(), store, node)
                .await
                .context("cannot join the cluster")?
        }
    };

    if let Some(token) = &bootstrap_token {
        let store = sundial
            .access_store()
            .context("this store keeps no tokens, so SUNDIAL_BOOTSTRAP_TOKEN cannot be stored")?;
        let now = sundial.clock().now();
        match crate::bootstrap::store(store.as_ref(), token, now)
            .await
            .context("cannot store SUNDIAL_BOOTSTRAP_TOKEN")?
        {
            crate::bootstrap::Outcome::Stored => tracing::info!(
                token_id = %token.id,
                name = crate::bootstrap::NAME,
                "stored SUNDIAL_BOOTSTRAP_TOKEN as the first admin token"
            ),
            crate::bootstrap::Outcome::TokensExist => {
                tracing::info!("SUNDIAL_BOOTSTRAP_TOKEN ignored: the store has tokens already")
            }
        }
    }

    let app = sundial_server::router(sundial.clone(), server_config);
    let running = sundial.start();
    match &args.database_url {
        None => {
            tracing::info!(data_dir = %args.data_dir.display(), %addr, durability = ?args.durability, shards = sundial.config().shard_count, "sundial started")
        }
        Some(_) => {
            tracing::info!(%addr, schema = %args.database_schema, shards = sundial.config().shard_count, "sundial started on PostgreSQL")
        }
    }
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let scheme = if tls.is_some() { "https" } else { "http" };
        writeln!(out, "sundial listening on {scheme}://{addr}")
            .context("cannot write to stdout")?;
        out.flush().context("cannot write to stdout")?;
    }

    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        wait_for_signal().await;
        let _ = stop_tx.send(true);
    });
    let handle = axum_server::Handle::<SocketAddr>::new();
    let stopping = handle.clone();
    let mut serve_stop = stop_rx.clone();
    tokio::spawn(async move {
        let _ = serve_stop.wait_for(|v| *v).await;
        stopping.graceful_shutdown(None);
    });
    let listener = listener
        .into_std()
        .context("cannot hand the listener to the server")?;
    let serve: std::pin::Pin<Box<dyn Future<Output = std::io::Result<()>> + Send>> = match tls {
        Some(tls) => {
            let mut server = axum_server::from_tcp_rustls(listener, tls)
                .context("cannot serve")?
                .handle(handle);
            limit_connections(server.http_builder(), args.header_read_timeout);
            Box::pin(server.serve(app.into_make_service()))
        }
        None => {
            let mut server = axum_server::from_tcp(listener)
                .context("cannot serve")?
                .handle(handle);
            limit_connections(server.http_builder(), args.header_read_timeout);
            Box::pin(server.serve(app.into_make_service()))
        }
    };
    let mut serve = tokio::spawn(serve);

    let mut stop = stop_rx;
    tokio::select! {
        r = &mut serve => {
            // The server ended on its own: an accept error. Stop the engine and report it.
            running.shutdown(args.shutdown_grace).await;
            return match r {
                Ok(Ok(())) => Ok(ExitCode::SUCCESS),
                Ok(Err(e)) => Err(e).context("serving failed"),
                Err(e) => Err(e).context("the server task failed"),
            };
        }
        _ = stop.wait_for(|v| *v) => {}
    }
    tracing::info!("shutting down");
    // Stopping the engine makes waiting polls return at once, so HTTP can drain.
    let interrupted = running.shutdown(args.shutdown_grace).await;
    if interrupted > 0 {
        tracing::warn!(
            interrupted,
            "in-process work did not finish in time; it will run again"
        );
    }
    match tokio::time::timeout(Duration::from_secs(10), &mut serve).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => tracing::warn!(error = %e, "server error during shutdown"),
        Ok(Err(e)) => tracing::warn!(error = %e, "server task failed during shutdown"),
        Err(_) => {
            tracing::warn!("HTTP requests still open after 10s; closing them");
            serve.abort();
        }
    }
    tracing::info!("stopped");
    Ok(ExitCode::SUCCESS)
}

/// A node name unique among running nodes: host name and process id.
fn default_node_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "node".to_string());
    format!("{host}-{}", std::process::id())
}

/// Completes on SIGTERM or Ctrl-C (SIGINT).
pub async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

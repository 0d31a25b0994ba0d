//! `sundial token …`, `sundial namespace …`, `sundial audit`: the admin API (`/v1/tokens`,
//! `/v1/namespaces`, `/v1/audit`) from the command line, with an admin token.
//!
//! `sundial token create --bootstrap` makes the first admin token without a server: it opens
//! the store itself (the data directory, or `--database-url`), refuses when any token exists
//! (checked and stored in one step), and prints the token once. `sundial server` does the same
//! with a token the operator chose in `SUNDIAL_BOOTSTRAP_TOKEN` (`bootstrap.rs`). Run it before the server starts on a data directory (the
//! embedded store is one process's), or at any time against PostgreSQL.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Args, Subcommand};
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use sundial::AccessStore;
use sundial::Sundial;
use sundial_cli::Credentials;
use sundial_server::ErrorBody;
use sundial_server::admin::{AuditList, CreatedToken, NamespaceList, TokenList, TokenView};
use sundial_store_postgres::{PostgresOptions, PostgresStore};

#[derive(Args, Debug)]
pub struct TokenArgs {
    /// The server's base URL.
    #[arg(long, env = "SUNDIAL_SERVER", default_value = crate::DEFAULT_SERVER, global = true)]
    server: String,
    #[command(flatten)]
    credentials: Credentials,
    /// Print the API's JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: TokenCommand,
}

#[derive(Subcommand, Debug)]
enum TokenCommand {
    /// Create a token and print it (once: the server keeps only a hash).
    Create(CreateTokenArgs),
    /// List tokens (never their secrets).
    Ls,
    /// Revoke a token: refused on every node within a second.
    Revoke { id: String },
}

#[derive(Args, Debug)]
struct CreateTokenArgs {
    /// A name for people and the audit log.
    #[arg(long)]
    name: String,
    /// admin, producer, worker or reader.
    #[arg(long)]
    scope: String,
    /// The one namespace the token may use (default: all).
    #[arg(long)]
    namespace: Option<String>,
    /// Lifetime, e.g. 90d, at most 36500d (default: until revoked).
    #[arg(long)]
    expires_in: Option<String>,
    /// Write the first token straight into the store instead of asking a server (refused when
    /// any token exists).
    #[arg(long)]
    bootstrap: bool,
    /// With --bootstrap: the server's data directory.
    #[arg(long, env = "SUNDIAL_DATA_DIR", default_value = "./sundial-data")]
    data_dir: PathBuf,
    /// With --bootstrap: the PostgreSQL the servers share (instead of a data directory).
    #[arg(long, env = "SUNDIAL_DATABASE_URL")]
    database_url: Option<String>,
    /// With --bootstrap and --database-url: the schema.
    #[arg(long, env = "SUNDIAL_DATABASE_SCHEMA", default_value = "sundial")]
    database_schema: String,
    /// With --bootstrap on a data directory that does not exist yet: the shard count the new
    /// store records for good (as `sundial server --shards`).
    #[arg(long, env = "SUNDIAL_SHARDS", default_value_t = crate::server::DEFAULT_SHARDS)]
    shards: u32,
}

#[derive(Args, Debug)]
pub struct NamespaceArgs {
    /// The server's base URL.
    #[arg(long, env = "SUNDIAL_SERVER", default_value = crate::DEFAULT_SERVER, global = true)]
    server: String,
    #[command(flatten)]
    credentials: Credentials,
    /// Print the API's JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: NamespaceCommand,
}

#[derive(Subcommand, Debug)]
enum NamespaceCommand {
    /// Add a namespace.
    Add {
        name: String,
        /// Most live (unfinished) tasks at once.
        #[arg(long)]
        max_live_tasks: Option<u64>,
        /// Most creates per second (over it: 429).
        #[arg(long)]
        max_creates_per_second: Option<u32>,
    },
    /// List namespaces.
    Ls,
}

#[derive(Args, Debug)]
pub struct AuditArgs {
    /// The server's base URL.
    #[arg(long, env = "SUNDIAL_SERVER", default_value = crate::DEFAULT_SERVER)]
    server: String,
    #[command(flatten)]
    credentials: Credentials,
    /// Print the API's JSON.
    #[arg(long)]
    json: bool,
    #[arg(long)]
    namespace: Option<String>,
    /// A token's name or id, `local` or `anonymous`.
    #[arg(long)]
    actor: Option<String>,
    /// E.g. "POST /v1/tasks/{id}/cancel".
    #[arg(long)]
    action: Option<String>,
    #[arg(long)]
    target: Option<String>,
    #[arg(long, default_value_t = 50)]
    limit: usize,
    /// `next_cursor` of a previous page.
    #[arg(long)]
    cursor: Option<String>,
}

struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    fn new(server: &str, credentials: &Credentials) -> anyhow::Result<Api> {
        Ok(Api {
            http: credentials
                .http_builder()?
                .connect_timeout(std::time::Duration::from_secs(5))
                .timeout(std::time::Duration::from_secs(60))
                .build()
                .context("cannot set up the HTTP client")?,
            base: server.trim_end_matches('/').to_string(),
        })
    }

    async fn send<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Value>,
    ) -> anyhow::Result<Result<T, ErrorBody>> {
        let mut req = self
            .http
            .request(method, format!("{}{}", self.base, path))
            .query(query);
        match body {
            Some(b) => req = req.json(&b),
            None => req = req.header(reqwest::header::CONTENT_TYPE, "application/json"),
        }
        let resp = req
            .send()
            .await
            .with_context(|| format!("cannot reach {}", self.base))?;
        let status = resp.status();
        let bytes = resp.bytes().await.context("cannot read the response")?;
        if status.is_success() {
            return Ok(Ok(serde_json::from_slice(&bytes).with_context(|| {
                format!("unexpected response: {}", String::from_utf8_lossy(&bytes))
            })?));
        }
        match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(e) => Ok(Err(e)),
            Err(_) => anyhow::bail!("{status}: {}", String::from_utf8_lossy(&bytes)),
        }
    }
}

fn report(e: ErrorBody) -> ExitCode {
    let d = e.error;
    match d.field {
        Some(f) => eprintln!("error: {} ({}, field {f})", d.message, d.code),
        None => eprintln!("error: {} ({})", d.message, d.code),
    }
    ExitCode::FAILURE
}

fn print_json<T: serde::Serialize>(v: &T) {
    if let Ok(s) = serde_json::to_string_pretty(v) {
        outln!("{s}");
    }
}

/// Tokens as a table with a header, like the other `ls` commands.
fn token_table(tokens: &[TokenView]) -> String {
    let rows: Vec<Vec<String>> = tokens
        .iter()
        .map(|t| {
            vec![
                t.id.to_string(),
                t.name.clone(),
                t.scope.clone(),
                t.namespace.clone().unwrap_or_else(|| "*".to_string()),
                if t.revoked_at.is_some() {
                    "revoked"
                } else {
                    "live"
                }
                .to_string(),
                t.expires_at.clone().unwrap_or_else(|| "-".to_string()),
            ]
        })
        .collect();
    crate::output::table(
        &["ID", "NAME", "SCOPE", "NAMESPACE", "STATE", "EXPIRES"],
        &rows,
    )
}

fn print_created(c: &CreatedToken, json_out: bool) {
    if json_out {
        print_json(c);
    } else {
        outln!("{}", c.token);
        eprintln!(
            "token {} ({}, scope {}): shown once, keep it safe",
            c.view.id, c.view.name, c.view.scope
        );
    }
}

pub async fn run_token(args: TokenArgs) -> anyhow::Result<ExitCode> {
    let json_out = args.json;
    match args.command {
        TokenCommand::Create(c) if c.bootstrap => bootstrap(c, json_out).await,
        TokenCommand::Create(c) => {
            let api = Api::new(&args.server, &args.credentials)?;
            let mut body = json!({"name": c.name, "scope": c.scope});
            if let Some(ns) = c.namespace {
                body["namespace"] = json!(ns);
            }
            if let Some(e) = c.expires_in {
                body["expires_in"] = json!(e);
            }
            match api
                .send::<CreatedToken>(Method::POST, "/v1/tokens", &[], Some(body))
                .await?
            {
                Ok(t) => {
                    print_created(&t, json_out);
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => Ok(report(e)),
            }
        }
        TokenCommand::Ls => {
            let api = Api::new(&args.server, &args.credentials)?;
            match api
                .send::<TokenList>(Method::GET, "/v1/tokens", &[], None)
                .await?
            {
                Ok(list) if json_out => {
                    print_json(&list);
                    Ok(ExitCode::SUCCESS)
                }
                Ok(list) => {
                    out!("{}", token_table(&list.tokens));
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => Ok(report(e)),
            }
        }
        TokenCommand::Revoke { id } => {
            let api = Api::new(&args.server, &args.credentials)?;
            match api
                .send::<TokenView>(Method::POST, &format!("/v1/tokens/{id}/revoke"), &[], None)
                .await?
            {
                Ok(t) if json_out => {
                    print_json(&t);
                    Ok(ExitCode::SUCCESS)
                }
                Ok(t) => {
                    out!("{}", token_table(std::slice::from_ref(&t)));
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => Ok(report(e)),
            }
        }
    }
}

/// The first admin token, written into the store directly.
async fn bootstrap(c: CreateTokenArgs, json_out: bool) -> anyhow::Result<ExitCode> {
    let (store, now): (Arc<dyn AccessStore>, sundial::Timestamp) = match &c.database_url {
        Some(url) => {
            let store = PostgresStore::connect(
                url,
                PostgresOptions {
                    schema: c.database_schema.clone(),
                    pool_size: 2,
                    ..PostgresOptions::default()
                },
            )
            .await
            .context("cannot connect to PostgreSQL")?;
            (Arc::new(store), sundial::Clock::now(&sundial::SystemClock))
        }
        None => {
            // A bootstrap may create the store: with the server's shard count, not the
            // library's default, which the store would keep for good.
            let config = sundial::Config {
                shard_count: c.shards,
                ..sundial::Config::default()
            };
            let sundial = Sundial::builder()
                .config(config)
                .open(&c.data_dir)
                .await
                .with_context(|| format!("cannot open the store in {}", c.data_dir.display()))?;
            let now = sundial.clock().now();
            let store = sundial
                .access_store()
                .cloned()
                .context("this store keeps no tokens")?;
            (store, now)
        }
    };
    if store.any_tokens().await? {
        anyhow::bail!(
            "tokens exist already: create more through the server with an admin token (sundial token create --token …)"
        );
    }
    let body = sundial_server::admin::CreateToken {
        name: c.name,
        scope: c.scope,
        namespace: c.namespace,
        expires_in: c.expires_in,
    };
    let (token, issued) = match sundial_server::admin::new_token(body, now) {
        Ok(t) => t,
        Err(e) => {
            return Ok(report(ErrorBody { error: *e.detail }));
        }
    };
    // Atomic: of two bootstraps at once against one PostgreSQL, one stores its token.
    let Some(record) = store.create_first_token(token).await? else {
        anyhow::bail!(
            "tokens exist already: create more through the server with an admin token (sundial token create --token …)"
        );
    };
    print_created(
        &CreatedToken {
            token: issued.token,
            view: TokenView::from(record),
        },
        json_out,
    );
    Ok(ExitCode::SUCCESS)
}

pub async fn run_namespace(args: NamespaceArgs) -> anyhow::Result<ExitCode> {
    let api = Api::new(&args.server, &args.credentials)?;
    match args.command {
        NamespaceCommand::Add {
            name,
            max_live_tasks,
            max_creates_per_second,
        } => {
            let mut body = json!({"name": name});
            if let Some(n) = max_live_tasks {
                body["max_live_tasks"] = json!(n);
            }
            if let Some(n) = max_creates_per_second {
                body["max_creates_per_second"] = json!(n);
            }
            match api
                .send::<Value>(Method::POST, "/v1/namespaces", &[], Some(body))
                .await?
            {
                Ok(v) => {
                    if args.json {
                        print_json(&v);
                    } else {
                        outln!("{}", v["name"].as_str().unwrap_or_default());
                    }
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => Ok(report(e)),
            }
        }
        NamespaceCommand::Ls => match api
            .send::<NamespaceList>(Method::GET, "/v1/namespaces", &[], None)
            .await?
        {
            Ok(list) if args.json => {
                print_json(&list);
                Ok(ExitCode::SUCCESS)
            }
            Ok(list) => {
                let quota = |v: Option<String>| v.unwrap_or_else(|| "-".to_string());
                let rows: Vec<Vec<String>> = list
                    .namespaces
                    .iter()
                    .map(|n| {
                        vec![
                            n.name.clone(),
                            quota(n.max_live_tasks.map(|v| v.to_string())),
                            quota(n.max_creates_per_second.map(|v| v.to_string())),
                        ]
                    })
                    .collect();
                out!(
                    "{}",
                    crate::output::table(&["NAME", "MAX LIVE TASKS", "MAX CREATES/S"], &rows)
                );
                Ok(ExitCode::SUCCESS)
            }
            Err(e) => Ok(report(e)),
        },
    }
}

pub async fn run_audit(args: AuditArgs) -> anyhow::Result<ExitCode> {
    let api = Api::new(&args.server, &args.credentials)?;
    let mut query = vec![("limit", args.limit.to_string())];
    for (k, v) in [
        ("namespace", args.namespace),
        ("actor", args.actor),
        ("action", args.action),
        ("target", args.target),
        ("cursor", args.cursor),
    ] {
        if let Some(v) = v {
            query.push((k, v));
        }
    }
    match api
        .send::<AuditList>(Method::GET, "/v1/audit", &query, None)
        .await?
    {
        Ok(list) if args.json => {
            print_json(&list);
            Ok(ExitCode::SUCCESS)
        }
        Ok(list) => {
            for r in &list.records {
                outln!(
                    "{:>6}  {}  {:<16} {:<10} {} {} -> {}",
                    r.seq,
                    r.at,
                    r.actor,
                    r.namespace,
                    r.action,
                    r.target.as_deref().unwrap_or("-"),
                    r.status
                );
            }
            if let Some(c) = list.next_cursor {
                eprintln!("more: --cursor {c}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Ok(report(e)),
    }
}

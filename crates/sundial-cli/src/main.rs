//! `sundial`: the server, task commands and a ready-made remote worker.
//!
//! ```text
//! sundial server [--data-dir DIR] [--listen ADDR]      run the service (embedded store)
//! sundial task add|get|ls|cancel|trigger|attempts|retry|cancel-all|retry-all ...   tasks
//! sundial queue ls|get|pause|resume|set ...            queues: counts, lateness, pause, settings
//! sundial worker --queue Q -- CMD ARGS...              run CMD once per task of Q
//! sundial schedule add|ls|get|pause|unpause|trigger|backfill|fires|rm ...   recurring schedules
//! sundial workflow start|signal|cancel|terminate|get|ls|history ...          durable workflows
//! sundial push secret ls|add|rotate|revoke ...          push delivery's signing secrets
//! sundial token create|ls|revoke ...                   API tokens (admin; create --bootstrap: the first)
//! sundial namespace add|ls ...                         namespaces (admin)
//! sundial audit [--namespace --actor --action --target] the audit log (admin)
//! ```

#[macro_use]
mod output;
mod access;
mod bootstrap;
mod push;
mod queue;
mod schedule;
mod server;
mod task;
mod telemetry;
mod worker;
mod workflow;

use clap::{Parser, Subcommand};

/// The default address of the server; clients use it when given no `--server`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7373";
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:7373";

#[derive(Parser)]
#[command(
    name = "sundial",
    version,
    about = "Sundial: a durable task scheduler. Run this at that time, even if every process dies in between."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process: the size of the largest variant's arguments costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run the server: the engine on the embedded store, and the HTTP API.
    Server(server::ServerArgs),
    /// Create, inspect, cancel and trigger tasks on a running server.
    Task(task::TaskArgs),
    /// List queues, pause and resume them, set their retention; the workers seen and the nodes.
    Queue(queue::QueueArgs),
    /// Run a command once per task of a queue (a remote worker); --help tells what the command
    /// gets and what its exit status does.
    #[command(after_long_help = worker::LONG_HELP)]
    Worker(worker::WorkerArgs),
    /// Create, inspect, pause, trigger and backfill recurring schedules on a running server.
    Schedule(schedule::ScheduleArgs),
    /// Start, signal, cancel, terminate, inspect and list durable workflows on a running server.
    Workflow(workflow::WorkflowArgs),
    /// Push delivery: list, add, rotate and revoke the signing secrets.
    Push(push::PushArgs),
    /// Create, list and revoke API tokens (admin); `create --bootstrap` makes the first one.
    Token(access::TokenArgs),
    /// Add and list namespaces (admin).
    Namespace(access::NamespaceArgs),
    /// Read the audit log (admin): one record per write, refusals included.
    Audit(access::AuditArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // People read task commands' output: only warnings and errors go to the log there.
    let level = match cli.command {
        Command::Task(_)
        | Command::Queue(_)
        | Command::Schedule(_)
        | Command::Workflow(_)
        | Command::Push(_)
        | Command::Token(_)
        | Command::Namespace(_)
        | Command::Audit(_) => "warn",
        _ => "info",
    };
    // The runtime's timer ticks just after the wall clock's milliseconds (see the function).
    sundial::clock::align_timer_ticks();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let otlp = match &cli.command {
        Command::Server(args) => args.otlp_endpoint(),
        _ => None,
    };
    let telemetry = match telemetry::init(level, otlp.as_deref(), runtime.handle()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e:#}");
            return std::process::ExitCode::from(2);
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Server(args) => server::run(args).await,
            Command::Task(args) => task::run(args).await,
            Command::Queue(args) => queue::run(args).await,
            Command::Worker(args) => worker::run(args).await,
            Command::Schedule(args) => schedule::run(args).await,
            Command::Workflow(args) => workflow::run(args).await,
            Command::Push(args) => push::run(args).await,
            Command::Token(args) => access::run_token(args).await,
            Command::Namespace(args) => access::run_namespace(args).await,
            Command::Audit(args) => access::run_audit(args).await,
        }
    });
    telemetry.shutdown();
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

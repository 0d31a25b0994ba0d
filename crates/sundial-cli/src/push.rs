//! `sundial push secret ...`: the signing secrets of push delivery on a running server.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use sundial_cli::{Client, ClientError};
use sundial_server::push::{AddSecret, RotateSecret, SecretView};

#[derive(Args, Debug)]
pub struct PushArgs {
    /// The server's base URL.
    #[arg(long, env = "SUNDIAL_SERVER", default_value = crate::DEFAULT_SERVER, global = true)]
    server: String,
    #[command(flatten)]
    credentials: sundial_cli::Credentials,
    #[command(flatten)]
    ns: sundial_cli::connect::NamespaceArg,
    /// Print the API's JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: PushCommand,
}

#[derive(Subcommand, Debug)]
enum PushCommand {
    /// Signing secrets (`whsec_…`) of push calls.
    #[command(subcommand)]
    Secret(SecretCommand),
}

#[derive(Subcommand, Debug)]
enum SecretCommand {
    /// Every secret (masked), oldest first, and whether it signs now.
    Ls,
    /// Add a secret (generated unless given); it is shown in full once.
    Add {
        #[arg(long)]
        secret: Option<String>,
    },
    /// Add a new secret; the current ones keep signing beside it for the overlap.
    Rotate {
        /// How long the old secrets keep signing (default 24h).
        #[arg(long)]
        overlap: Option<String>,
        #[arg(long)]
        secret: Option<String>,
    },
    /// Stop a secret signing now.
    Revoke { id: String },
}

pub async fn run(mut args: PushArgs) -> anyhow::Result<ExitCode> {
    args.credentials = args.credentials.clone().in_namespace(&args.ns);
    let client = Client::with_credentials(&args.server, &args.credentials)
        .context("cannot build the HTTP client")?;
    let json = args.json;
    let PushCommand::Secret(cmd) = args.command;
    let result: Result<(), ClientError> = match cmd {
        SecretCommand::Ls => client.push_secrets().await.map(|l| {
            if json {
                crate::task::print_json(&l);
            } else {
                table(&l.secrets);
            }
        }),
        SecretCommand::Add { secret } => client
            .add_push_secret(&AddSecret { secret })
            .await
            .map(|s| show(&s, json)),
        SecretCommand::Rotate { overlap, secret } => client
            .rotate_push_secret(&RotateSecret { secret, overlap })
            .await
            .map(|s| show(&s, json)),
        SecretCommand::Revoke { id } => client.revoke_push_secret(&id).await.map(|l| {
            if json {
                crate::task::print_json(&l);
            } else {
                table(&l.secrets);
            }
        }),
    };
    match result {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            crate::task::report(&e, json);
            Ok(ExitCode::FAILURE)
        }
    }
}

fn show(s: &SecretView, json: bool) {
    if json {
        crate::task::print_json(s);
    } else {
        outln!("{}  {}", s.id, s.secret);
    }
}

fn table(secrets: &[SecretView]) {
    outln!(
        "{:<40} {:<14} {:<8} {:<25} EXPIRES",
        "ID",
        "SECRET",
        "ACTIVE",
        "CREATED"
    );
    for s in secrets {
        outln!(
            "{:<40} {:<14} {:<8} {:<25} {}",
            s.id,
            s.secret,
            if s.active { "yes" } else { "no" },
            s.created_at,
            s.expires_at.as_deref().unwrap_or("-")
        );
    }
}

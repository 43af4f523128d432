//! The `idem` command line (`docs/contract/api.md`, "Running"): the top-level
//! parser, the dispatch to one module per subcommand, the runtime, the logs and
//! the signals. Every flag also reads an environment variable. This is the
//! edge: errors here are `anyhow`, printed once, exit code 1. Starting and
//! stopping the long-running processes is `crate::app`'s.

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use tokio_util::sync::CancellationToken;

mod admin;
mod args;
mod charge;
mod charges;
mod consume;
mod events;
mod merchant;
mod migrate;
mod openapi;
mod reconcile;
mod refunds;
mod serve;
mod steps;
mod telemetry;
mod webhooks;

use args::DbArgs;
pub use args::{parse_duration, DEFAULT_AMQP_URL};

#[derive(Parser, Debug)]
#[command(
    name = "idem",
    version,
    about = "A payment charge service that charges exactly once."
)]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, env = "IDEM_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Export traces over OTLP/HTTP to this collector (a base URL; `/v1/traces`
    /// is added). Off when neither this nor OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set.
    #[arg(
        long,
        global = true,
        env = "OTEL_EXPORTER_OTLP_ENDPOINT",
        value_name = "URL"
    )]
    pub otlp_endpoint: Option<String>,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Log format on stderr: for people, or one JSON object per line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Create the database if it is missing, and create or upgrade the schema.
    Migrate(DbArgs),
    /// Manage merchants and their secrets (`tenant` is another name for it).
    #[command(alias = "tenant")]
    Merchant {
        #[command(subcommand)]
        command: merchant::Command,
    },
    /// Manage merchants' webhook endpoints.
    Webhooks {
        #[command(subcommand)]
        command: webhooks::Command,
    },
    /// Run the charge API.
    Serve(serve::Args),
    /// Run the reconciler alone (it also runs inside `serve`).
    Reconcile(reconcile::Args),
    /// Consume charge commands from RabbitMQ, and relay the outbox.
    Consume(consume::Args),
    /// Send one charge with a client that retries right; prints the final answer.
    Charge(charge::Args),
    /// Inspect charges.
    Charges {
        #[command(subcommand)]
        command: charges::Command,
    },
    /// Inspect refunds.
    Refunds {
        #[command(subcommand)]
        command: refunds::Command,
    },
    /// Retry or resolve a capture or a void of a two-step payment.
    Steps {
        #[command(subcommand)]
        command: steps::Command,
    },
    /// Access to the operator console (`serve --admin-listen`).
    Admin {
        #[command(subcommand)]
        command: admin::Command,
    },
    /// Whether the deployment writes charge events (a relay turns them on).
    Events {
        #[command(subcommand)]
        command: events::Command,
    },
    /// Print the OpenAPI 3.1 document of the API (what GET /openapi.json serves).
    Openapi,
}

/// Runs a parsed command line to its exit code.
pub fn main(cli: Cli) -> ExitCode {
    let otlp = cli.otlp_endpoint.as_deref();
    run_to_exit("idem", cli.log_format, otlp, DEFAULT_LOG_FILTER, async {
        run(cli.command).await.map(|()| ExitCode::SUCCESS)
    })
}

/// The `idem` binary's subcommands, for a binary that offers them beside its
/// own (`idem-lab`, which starts `idem serve` processes from itself). Opaque:
/// the arguments of each stay this module's.
#[derive(Debug)]
pub struct Commands(Command);

impl Commands {
    /// Runs the command (until SIGINT or SIGTERM, for the long-running ones).
    pub async fn run(self) -> anyhow::Result<()> {
        run(self.0).await
    }
}

impl clap::FromArgMatches for Commands {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        Command::from_arg_matches(matches).map(Self)
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        self.0.update_from_arg_matches(matches)
    }
}

impl Subcommand for Commands {
    fn augment_subcommands(cmd: clap::Command) -> clap::Command {
        Command::augment_subcommands(cmd)
    }

    fn augment_subcommands_for_update(cmd: clap::Command) -> clap::Command {
        Command::augment_subcommands_for_update(cmd)
    }

    fn has_subcommand(name: &str) -> bool {
        Command::has_subcommand(name)
    }
}

/// Logs set up with `default_filter` (unless `IDEM_LOG` says otherwise) and
/// traces if `otlp_endpoint` (or the standard variables) names a collector, a
/// runtime, `work` run on it, and its error printed once after `program`'s
/// name: the exit code a command line returns (`work`'s own, or 1 on an error).
pub fn run_to_exit(
    program: &str,
    log_format: LogFormat,
    otlp_endpoint: Option<&str>,
    default_filter: &str,
    work: impl std::future::Future<Output = anyhow::Result<ExitCode>>,
) -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{program}: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let telemetry = {
        let _on_runtime = runtime.enter();
        match telemetry::init(log_format, default_filter, otlp_endpoint) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("{program}: {e:#}");
                return ExitCode::FAILURE;
            }
        }
    };
    let code = match runtime.block_on(work) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{program}: {e:#}");
            ExitCode::FAILURE
        }
    };
    telemetry.shutdown();
    code
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Migrate(db) => migrate::run(&db).await,
        Command::Merchant { command } => merchant::run(command).await,
        Command::Webhooks { command } => webhooks::run(command).await,
        Command::Serve(args) => serve::run(args, shutdown_signal()).await,
        Command::Reconcile(args) => reconcile::run(args, shutdown_signal()).await,
        Command::Consume(args) => consume::run(args, shutdown_signal()).await,
        Command::Charge(args) => charge::run(args).await,
        Command::Charges { command } => charges::run(command).await,
        Command::Refunds { command } => refunds::run(command).await,
        Command::Steps { command } => steps::run(command).await,
        Command::Events { command } => events::run(command).await,
        Command::Admin { command } => admin::run(command).await,
        Command::Openapi => openapi::run(),
    }
}

/// A token cancelled on SIGINT or SIGTERM.
pub fn shutdown_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            let mut term =
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot listen for SIGTERM");
                        let _ = ctrl_c.await;
                        cancel.cancel();
                        return;
                    }
                };
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
        }
        #[cfg(not(unix))]
        let _ = ctrl_c.await;
        tracing::info!("shutting down: finishing requests in flight");
        cancel.cancel();
    });
    token
}

/// The log filter when `IDEM_LOG` is not set: a service's start-up, its
/// access lines and its warnings.
pub const DEFAULT_LOG_FILTER: &str = "info";

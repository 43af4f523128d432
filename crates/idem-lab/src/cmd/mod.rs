//! The `idem-lab` command line: the lab's subcommands (the simulator, the
//! demo, the bench, verify, a teaching server, the clients' conformance
//! environment) beside every one of `idem`'s, so that the lab can start
//! `idem serve` processes from its own binary (`crate::harness`).

use std::process::ExitCode;

use futures_util::FutureExt;

use clap::{Parser, Subcommand};
use idem::cmd::{run_to_exit, shutdown_signal, Commands, LogFormat, DEFAULT_LOG_FILTER};

mod acquirer_sim;
mod bench;
mod conformance_env;
mod demo;
mod teaching_server;
mod verify;

#[derive(Parser, Debug)]
#[command(
    name = "idem-lab",
    version,
    about = "idem's lab: the acquirer simulator, the demo, the bench and verify, beside idem's own commands."
)]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, env = "IDEM_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the acquirer simulator.
    AcquirerSim(acquirer_sim::Args),
    /// Play the article's story under three strategies and compare them.
    Demo(demo::Args),
    /// Load a deployment (one it starts, or --url) and print throughput and latency.
    Bench(bench::Args),
    /// Check the promise against a deployment: charge under faults, judge
    /// twelve invariants against the acquirer's ledger (docs/verify.md).
    Verify(verify::Args),
    /// Serve one of the article's wrong strategies on an address.
    TeachingServer(teaching_server::Args),
    /// Start what the clients' conformance suite runs against (idem, the
    /// simulator, a lossy and a refusing endpoint) and print where, as JSON.
    ConformanceEnv(conformance_env::Args),
    #[command(flatten)]
    Idem(Box<Commands>),
}

/// Runs a parsed command line to its exit code.
pub fn main(cli: Cli) -> ExitCode {
    let default_filter = match cli.command {
        Command::Demo(_) => crate::harness::LOG_FILTER,
        _ => DEFAULT_LOG_FILTER,
    };
    run_to_exit(
        "idem-lab",
        cli.log_format,
        None,
        default_filter,
        run(cli.command),
    )
}

async fn run(command: Command) -> anyhow::Result<ExitCode> {
    let done = |r: anyhow::Result<()>| r.map(|()| ExitCode::SUCCESS);
    match command {
        Command::AcquirerSim(args) => acquirer_sim::run(args, shutdown_signal()).map(done).await,
        Command::Demo(args) => demo::run(args, shutdown_signal()).map(done).await,
        Command::Bench(args) => bench::run(args).map(done).await,
        Command::Verify(args) => verify::run(args, shutdown_signal()).await,
        Command::TeachingServer(args) => {
            teaching_server::run(args, shutdown_signal())
                .map(done)
                .await
        }
        Command::ConformanceEnv(args) => {
            conformance_env::run(args, shutdown_signal())
                .map(done)
                .await
        }
        Command::Idem(commands) => commands.run().map(done).await,
    }
}

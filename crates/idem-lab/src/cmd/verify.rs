//! `idem-lab verify`: runs [`crate::verify`] against a deployment, prints the
//! verdicts (or JSON), writes the HTML report and the history; exits 0 when
//! every invariant holds, 1 when one is broken, 2 when the run could not be made.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use idem::cmd::parse_duration;

use crate::verify::{self, Outcome, VerifyConfig};

#[derive(clap::Args, Debug, Clone)]
pub(crate) struct Args {
    /// The deployment's base URLs, comma-separated (instances or load
    /// balancers); a client that gives up retries on the next one.
    #[arg(long, value_delimiter = ',', required = true)]
    url: Vec<String>,
    /// A live secret of the merchant the run charges as.
    #[arg(long, env = "IDEM_VERIFY_SECRET", hide_env_values = true)]
    secret: String,
    /// The acquirer's captures and refunds, in the simulator's /_sim/ledger
    /// format (docs/verify.md).
    #[arg(long)]
    ledger: String,
    /// Charge even though the ledger is not the simulator's: say so only for
    /// a sandbox acquirer whose charges move no money.
    #[arg(long)]
    allow_real_charges: bool,
    /// Intents to charge, once each; one captured charge in ten is also
    /// refunded, by three refund intents that race for what it has left, and
    /// one charge in ten is only authorized, then captured in parts by
    /// captures that race for it, or voided by a void that races a capture.
    #[arg(long, default_value_t = 400)]
    intents: usize,
    /// Intents sent at once.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// A client's per-attempt timeout; then it retries on the next URL.
    #[arg(long, value_parser = parse_duration, default_value = "250ms")]
    client_timeout: Duration,
    /// Simultaneous copies in each burst (one intent in eight).
    #[arg(long, default_value_t = 5)]
    duplicates: usize,
    /// A shell command (sh -c) run every --fault-every while the workload runs:
    /// restart an instance, kill a database node, cut a link.
    #[arg(long)]
    fault_cmd: Option<String>,
    #[arg(long, value_parser = parse_duration, default_value = "2s")]
    fault_every: Duration,
    /// Leave the simulator's faults alone (by default, when the ledger is the
    /// simulator's, the run scripts them and puts them back after).
    #[arg(long)]
    no_sim_faults: bool,
    /// How long the intents without a final answer are retried once the faults stop.
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    settle_within: Duration,
    /// The 409 answers' p99 latency must be under this.
    #[arg(long, value_parser = parse_duration, default_value = "100ms")]
    in_flight_p99: Duration,
    /// Where to write the HTML report.
    #[arg(long, default_value = "idem-verify.html")]
    report: PathBuf,
    /// Where to write the history (every intent, request and fault) as JSON lines.
    #[arg(long)]
    history: Option<PathBuf>,
    /// Print the report as one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// The exit status of a run that could not be made.
const COULD_NOT_RUN: u8 = 2;

pub(crate) async fn run(args: Args, shutdown: CancellationToken) -> anyhow::Result<ExitCode> {
    let config = VerifyConfig {
        urls: args.url,
        secret: args.secret,
        ledger_url: args.ledger,
        allow_real_charges: args.allow_real_charges,
        intents: args.intents,
        concurrency: args.concurrency,
        client_timeout: args.client_timeout,
        duplicates: args.duplicates.max(1),
        fault_cmd: args.fault_cmd,
        fault_every: args.fault_every.max(Duration::from_millis(10)),
        sim_faults: !args.no_sim_faults,
        settle_within: args.settle_within,
        in_flight_p99: args.in_flight_p99,
    };
    let outcome = match verify::run(&config, shutdown).await {
        Ok(outcome) => outcome,
        Err(e) => {
            eprintln!("idem-lab verify: could not run: {e:#}");
            return Ok(ExitCode::from(COULD_NOT_RUN));
        }
    };
    if let Err(e) = write(&outcome, &args.report, args.history.as_deref(), args.json) {
        eprintln!("idem-lab verify: {e:#}");
        return Ok(ExitCode::from(COULD_NOT_RUN));
    }
    Ok(if outcome.report.holds {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn write(
    outcome: &Outcome,
    report: &std::path::Path,
    history: Option<&std::path::Path>,
    json: bool,
) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(&outcome.report)?);
    } else {
        print!("{}", outcome.text());
    }
    outcome
        .write_html(report)
        .with_context(|| format!("writing {}", report.display()))?;
    eprintln!("report: {}", report.display());
    if let Some(path) = history {
        outcome
            .history
            .write_jsonl(path)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("history: {}", path.display());
    }
    Ok(())
}

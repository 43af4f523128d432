//! `idem-lab demo`: plays the article's story under three strategies
//! (`crate::demo`), prints the figures and writes the HTML report.

use std::time::Duration;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use idem::cmd::parse_duration;

#[derive(clap::Args, Debug, Clone)]
pub(crate) struct Args {
    /// `postgres://...`: the demo makes its own databases (idem_demo_*) on that
    /// server. `sqlite://path`, or none: SQLite files of its own in a scratch
    /// directory, removed afterwards.
    #[arg(long, env = "DATABASE_URL")]
    pub(crate) database_url: Option<String>,
    /// Intents whose client times out and retries on another instance.
    #[arg(long, default_value_t = 30)]
    pub(crate) intents: usize,
    /// Intents sent as bursts of simultaneous duplicates.
    #[arg(long, default_value_t = 10)]
    pub(crate) bursts: usize,
    /// Copies in each burst.
    #[arg(long, default_value_t = 5)]
    pub(crate) copies: usize,
    /// The acquirer's latency; longer than --client-timeout, so the timeout fires.
    #[arg(long, value_parser = parse_duration, default_value = "600ms")]
    pub(crate) acquirer_latency: Duration,
    /// The client's per-attempt timeout.
    #[arg(long, value_parser = parse_duration, default_value = "250ms")]
    pub(crate) client_timeout: Duration,
    /// Print the figures as one JSON object instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Where to write the HTML report.
    #[arg(long, default_value = "idem-demo.html")]
    pub(crate) report: std::path::PathBuf,
}

/// Runs the demo, prints its table (or JSON), writes the report; fails if
/// idem itself ever charged twice.
pub(crate) async fn run(args: Args, shutdown: CancellationToken) -> anyhow::Result<()> {
    let config = crate::demo::DemoConfig {
        // None: SQLite files of its own (the demo's first line says so).
        database_url: args
            .database_url
            .unwrap_or_else(|| idem_core::store::DEFAULT_DATABASE_URL.to_owned()),
        intents: args.intents,
        bursts: args.bursts,
        copies: args.copies,
        acquirer_latency: args.acquirer_latency,
        client_timeout: args.client_timeout,
    };
    let report = crate::demo::run(&config, shutdown).await?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", report.table());
    }
    crate::demo::write_html(&report, &args.report)
        .with_context(|| format!("writing {}", args.report.display()))?;
    eprintln!("report: {}", args.report.display());
    anyhow::ensure!(
        !report.idem_double_charged(),
        "idem charged an intent twice"
    );
    Ok(())
}

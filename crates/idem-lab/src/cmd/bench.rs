//! `idem-lab bench`: loads a deployment (one it starts, or `--url`) with
//! `crate::bench` and prints throughput and latency.

use std::time::Duration;

use idem::cmd::{parse_duration, DEFAULT_AMQP_URL};

#[derive(clap::Args, Debug, Clone)]
pub(crate) struct Args {
    #[arg(long, value_enum, default_value_t = crate::bench::Scenario::New)]
    pub(crate) scenario: crate::bench::Scenario,
    /// Concurrent clients, each with one request in flight.
    #[arg(long, default_value_t = 32)]
    pub(crate) concurrency: usize,
    /// How long to measure (after a 1 s warm-up).
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub(crate) duration: Duration,
    /// PostgreSQL for the deployment the bench starts (database idem_bench).
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/idem"
    )]
    pub(crate) database_url: String,
    /// A running deployment to load instead of starting one (needs --secret).
    #[arg(long, requires = "secret")]
    pub(crate) url: Option<String>,
    /// The merchant's secret for --url.
    #[arg(long, env = "IDEM_SECRET", hide_env_values = true)]
    pub(crate) secret: Option<String>,
    /// Also run pgbench with the store's statements at the same concurrency, and print the ratio.
    #[arg(long, conflicts_with = "url")]
    pub(crate) vs_pgbench: bool,
    /// RabbitMQ for the `queue` scenario.
    #[arg(long, env = "IDEM_AMQP_URL", default_value = DEFAULT_AMQP_URL)]
    pub(crate) amqp_url: String,
    /// Print the figures as one JSON object.
    #[arg(long)]
    pub(crate) json: bool,
    /// Run at each of these client counts (a fresh deployment each; with
    /// pgbench beside idem on PostgreSQL), print a table and write --report.
    #[arg(long, value_delimiter = ',', num_args = 1.., conflicts_with = "concurrency")]
    pub(crate) sweep: Option<Vec<usize>>,
    /// Where --sweep writes its chart (a self-contained HTML page).
    #[arg(long, default_value = "idem-bench-sweep.html", requires = "sweep")]
    pub(crate) report: std::path::PathBuf,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    let pgbench_can_run = args.url.is_none()
        && args.scenario != crate::bench::Scenario::Queue
        && args.scenario != crate::bench::Scenario::Refund
        && idem_core::store::Backend::of_url(&args.database_url)?
            == idem_core::store::Backend::Postgres;
    let config = crate::bench::BenchConfig {
        scenario: args.scenario,
        concurrency: args.concurrency,
        duration: args.duration,
        database_url: args.database_url,
        target: args.url.zip(args.secret),
        // A sweep sets idem beside pgbench wherever pgbench can run.
        vs_pgbench: args.vs_pgbench || (args.sweep.is_some() && pgbench_can_run),
        amqp_url: args.amqp_url,
    };
    if let Some(levels) = &args.sweep {
        let results = crate::bench::sweep(&config, levels, &args.report).await?;
        if args.json {
            println!("{}", serde_json::to_string(&results)?);
        } else {
            print!("{}", crate::bench::sweep_table(&results));
            println!("chart: {}", args.report.display());
        }
        return Ok(());
    }
    let result = crate::bench::run(&config).await?;
    if args.json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        print!("{}", result.summary());
    }
    Ok(())
}

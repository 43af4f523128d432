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
    /// The open model: new charges at each of these rates (per second),
    /// whatever the answers take, a fresh deployment each, against an
    /// acquirer with --acquirer-latency and --acquirer-faults; idem, then
    /// hold-transaction at each rate. Prints a table (the knee under it)
    /// and writes --report.
    #[arg(
        long,
        value_delimiter = ',',
        num_args = 1..,
        value_parser = crate::bench::parse_rate,
        conflicts_with_all = ["concurrency", "sweep", "url", "vs_pgbench"]
    )]
    pub(crate) arrival: Option<Vec<u32>>,
    /// The acquirer's latency for --arrival: the median and the 99th
    /// percentile of a lognormal.
    #[arg(long, default_value = "p50=120ms,p99=380ms", requires = "arrival")]
    pub(crate) acquirer_latency: crate::bench::AcquirerLatency,
    /// For --arrival: the chance that an acquirer call times out or
    /// answers a 5xx (clients retry those with the same key).
    #[arg(long, default_value = "0.7%", value_parser = crate::bench::parse_chance, requires = "arrival")]
    pub(crate) acquirer_faults: f64,
    /// For --arrival: each server's database connections.
    #[arg(long, default_value_t = 16, requires = "arrival")]
    pub(crate) db_max_connections: u32,
    /// For --arrival: the most connections the load generator opens (a
    /// request due while all are busy waits for one, on the clock).
    #[arg(long, default_value_t = 1024, requires = "arrival")]
    pub(crate) connections: usize,
    /// For --arrival: idem alone, without hold-transaction beside it.
    #[arg(long, requires = "arrival")]
    pub(crate) no_hold_transaction: bool,
    /// Where --sweep or --arrival writes its chart (a self-contained HTML
    /// page; default idem-bench-sweep.html or idem-bench-arrival.html).
    #[arg(long)]
    pub(crate) report: Option<std::path::PathBuf>,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.report.is_none() || args.sweep.is_some() || args.arrival.is_some(),
        "--report is where --sweep or --arrival writes its chart: give one of them"
    );
    if let Some(rates) = args.arrival {
        let config = crate::bench::ArrivalConfig {
            rates,
            duration: args.duration,
            database_url: args.database_url,
            latency: args.acquirer_latency,
            fault_rate: args.acquirer_faults,
            db_connections: args.db_max_connections,
            connections: args.connections,
            hold_transaction: !args.no_hold_transaction,
            report: args
                .report
                .unwrap_or_else(|| "idem-bench-arrival.html".into()),
        };
        let report = crate::bench::arrival(&config).await?;
        if args.json {
            println!("{}", serde_json::to_string(&report)?);
        } else {
            print!("{}", crate::bench::arrival_table(&report));
            println!("chart: {}", config.report.display());
        }
        return Ok(());
    }
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
        let report = args
            .report
            .unwrap_or_else(|| "idem-bench-sweep.html".into());
        let results = crate::bench::sweep(&config, levels, &report).await?;
        if args.json {
            println!("{}", serde_json::to_string(&results)?);
        } else {
            print!("{}", crate::bench::sweep_table(&results));
            println!("chart: {}", report.display());
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

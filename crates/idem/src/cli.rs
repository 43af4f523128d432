//! The `idem` command line (`../shared/spec/api.md`, "Running"): argument
//! types and the commands; `crate::app` starts and stops `serve` and `consume`.
//! Every flag also reads an environment variable. This is the edge: errors
//! here are `anyhow`, printed once, exit code 1.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use sqlx::migrate::MigrateDatabase;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::app;
use crate::domain::{parse_merchant_name, MerchantSecret};
use crate::http;
use crate::sim::{self, Fault, Faults};
use crate::store::Store;
use crate::workers::{Reconciler, ReconcilerConfig};
use crate::LOG_ENV;

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
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create the database if it is missing, and create or upgrade the schema.
    Migrate(DbArgs),
    /// Manage merchants (tenants).
    Tenant {
        #[command(subcommand)]
        command: TenantCommand,
    },
    /// Run the charge API.
    Serve(ServeArgs),
    /// Run the acquirer simulator.
    AcquirerSim(SimArgs),
    /// Run the reconciler alone (it also runs inside `serve`).
    Reconcile(ReconcileArgs),
    /// Consume charge commands from RabbitMQ, and relay the outbox.
    Consume(ConsumeArgs),
    /// Play the article's story under three strategies and compare them.
    Demo(DemoArgs),
    /// Load a deployment (one it starts, or --url) and print throughput and latency.
    Bench(BenchArgs),
    /// Send one charge with a client that retries right; prints the final answer.
    Charge(ChargeArgs),
    /// Inspect charges.
    Charges {
        #[command(subcommand)]
        command: ChargesCommand,
    },
    /// Print the OpenAPI 3.1 document of the API (what GET /openapi.json serves).
    Openapi,
}

#[derive(Subcommand, Debug)]
pub enum ChargesCommand {
    /// List the charges awaiting review: past the settle deadline without the acquirer's word.
    Stuck(DbArgs),
}

#[derive(Subcommand, Debug)]
pub enum TenantCommand {
    /// Add a merchant and print its new secret (once, alone on stdout).
    Create {
        /// The merchant's name, also sent to the acquirer: a slug, 1 to 100
        /// of a-z, 0-9, '.', '_' and '-' (it is a routing key on the broker).
        name: String,
        #[command(flatten)]
        db: DbArgs,
    },
}

#[derive(Args, Debug, Clone)]
pub struct DbArgs {
    /// `postgres://...` or `sqlite://path`; without one, the embedded store
    /// `sqlite://idem.db` in the working directory.
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: Option<String>,
    /// Connections in this process's pool.
    #[arg(long, env = "IDEM_DB_MAX_CONNECTIONS", default_value_t = 16)]
    pub db_max_connections: u32,
}

/// What the charge engine needs, shared by `serve` and `reconcile`.
#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    /// Base URL of the acquirer.
    #[arg(
        long,
        env = "IDEM_ACQUIRER_URL",
        default_value = "http://127.0.0.1:9090"
    )]
    pub acquirer_url: String,
    /// A PEM file of CA certificates to trust for an HTTPS acquirer, beside
    /// the system's roots (for an acquirer with a private CA).
    #[arg(long, env = "IDEM_ACQUIRER_CA")]
    pub acquirer_ca: Option<std::path::PathBuf>,
    /// How long one call to the acquirer may take before its outcome is unknown.
    #[arg(long, env = "IDEM_ACQUIRER_TIMEOUT", value_parser = parse_duration, default_value = "10s")]
    pub acquirer_timeout: Duration,
    /// How long a claim's holder may work before another attempt may take over.
    /// Must be longer than --acquirer-timeout.
    #[arg(long, env = "IDEM_LEASE", value_parser = parse_duration, default_value = "30s")]
    pub lease: Duration,
    /// How long a key and its stored outcome are honoured after the outcome is stored.
    #[arg(long, env = "IDEM_KEY_TTL", value_parser = parse_duration, default_value = "24h")]
    pub key_ttl: Duration,
    #[command(flatten)]
    pub db: DbArgs,
}

/// The reconciler's settings, shared by `serve` and `reconcile`.
#[derive(Args, Debug, Clone)]
pub struct ReconcilerArgs {
    /// Pause between reconciler passes.
    #[arg(long, env = "IDEM_RECONCILE_INTERVAL", value_parser = parse_duration, default_value = "1s")]
    pub reconcile_interval: Duration,
    /// Past this age, a charge without the acquirer's word is marked for review.
    #[arg(long, env = "IDEM_SETTLE_DEADLINE", value_parser = parse_duration, default_value = "24h")]
    pub settle_deadline: Duration,
}

/// The background workers beside `serve` and `consume`.
#[derive(Args, Debug, Clone)]
pub struct WorkerArgs {
    /// Do not run the reconciler and the sweeper in this process.
    #[arg(long, env = "IDEM_NO_WORKERS")]
    pub no_workers: bool,
    /// Pause between sweeps of expired keys.
    #[arg(long, env = "IDEM_SWEEP_INTERVAL", value_parser = parse_duration, default_value = "60s")]
    pub sweep_interval: Duration,
    #[command(flatten)]
    pub reconciler: ReconcilerArgs,
}

/// The queue consumer's and the outbox relay's settings.
#[derive(Args, Debug, Clone)]
pub struct QueueArgs {
    /// Commands the broker may send ahead of acks; also how many are worked at once.
    #[arg(long, env = "IDEM_PREFETCH", default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..))]
    pub prefetch: u16,
    /// Between looks at the outbox for messages that other processes wrote.
    #[arg(long, env = "IDEM_OUTBOX_POLL", value_parser = parse_duration, default_value = "250ms")]
    pub outbox_poll: Duration,
    /// How long published outbox messages are kept before they are pruned.
    #[arg(long, env = "IDEM_OUTBOX_RETENTION", value_parser = parse_duration, default_value = "24h")]
    pub outbox_retention: Duration,
}

/// RabbitMQ on this machine, as `spec/queue.md` starts it.
pub const DEFAULT_AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "IDEM_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// RabbitMQ URL: when set, this process also relays the outbox (charge events).
    #[arg(long, env = "IDEM_AMQP_URL")]
    pub amqp_url: Option<String>,
    /// Also consume charge commands from the queue (needs --amqp-url).
    #[arg(long, env = "IDEM_CONSUME", requires = "amqp_url")]
    pub consume: bool,
    /// Serve /metrics (with /healthz and /readyz) on this address instead of
    /// the API's: keep it off the public port in production.
    #[arg(long, env = "IDEM_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// How long a connection may take to send a request's head, from when it
    /// opens or its previous answer goes out; also how long an idle kept-alive
    /// connection stays open. Keep a load balancer's idle timeout below it.
    #[arg(long, env = "IDEM_HEADER_READ_TIMEOUT", value_parser = parse_duration, default_value = "30s")]
    pub header_read_timeout: Duration,
    /// /v1 requests worked at once; more are answered at once with 503 and Retry-After.
    #[arg(long, env = "IDEM_MAX_IN_FLIGHT", default_value_t = http::MAX_IN_FLIGHT, value_parser = parse_positive)]
    pub max_in_flight: usize,
    #[command(flatten)]
    pub queue: QueueArgs,
    #[command(flatten)]
    pub workers: WorkerArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

#[derive(Args, Debug, Clone)]
pub struct ConsumeArgs {
    /// RabbitMQ URL.
    #[arg(long, env = "IDEM_AMQP_URL", default_value = DEFAULT_AMQP_URL)]
    pub amqp_url: String,
    /// Serve /healthz, /readyz and /metrics on this address.
    #[arg(long, env = "IDEM_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    #[command(flatten)]
    pub queue: QueueArgs,
    #[command(flatten)]
    pub workers: WorkerArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

#[derive(Args, Debug, Clone)]
pub struct ReconcileArgs {
    /// One pass, then exit (exit code 0 whatever it found; counts on stderr).
    #[arg(long)]
    pub once: bool,
    #[command(flatten)]
    pub reconciler: ReconcilerArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// `postgres://...`: the demo makes its own databases (idem_demo_*) on that
    /// server. `sqlite://path`, or none: SQLite files of its own in a scratch
    /// directory, removed afterwards.
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: Option<String>,
    /// Intents whose client times out and retries on another instance.
    #[arg(long, default_value_t = 30)]
    pub intents: usize,
    /// Intents sent as bursts of simultaneous duplicates.
    #[arg(long, default_value_t = 10)]
    pub bursts: usize,
    /// Copies in each burst.
    #[arg(long, default_value_t = 5)]
    pub copies: usize,
    /// The acquirer's latency; longer than --client-timeout, so the timeout fires.
    #[arg(long, value_parser = parse_duration, default_value = "600ms")]
    pub acquirer_latency: Duration,
    /// The client's per-attempt timeout.
    #[arg(long, value_parser = parse_duration, default_value = "250ms")]
    pub client_timeout: Duration,
    /// Print the figures as one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Where to write the HTML report.
    #[arg(long, default_value = "idem-demo.html")]
    pub report: std::path::PathBuf,
}

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    #[arg(long, value_enum, default_value_t = crate::bench::Scenario::New)]
    pub scenario: crate::bench::Scenario,
    /// Concurrent clients, each with one request in flight.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// How long to measure (after a 1 s warm-up).
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub duration: Duration,
    /// PostgreSQL for the deployment the bench starts (database idem_bench).
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/idem"
    )]
    pub database_url: String,
    /// A running deployment to load instead of starting one (needs --secret).
    #[arg(long, requires = "secret")]
    pub url: Option<String>,
    /// The merchant's secret for --url.
    #[arg(long, env = "IDEM_SECRET", hide_env_values = true)]
    pub secret: Option<String>,
    /// Also run pgbench with the store's statements at the same concurrency, and print the ratio.
    #[arg(long, conflicts_with = "url")]
    pub vs_pgbench: bool,
    /// RabbitMQ for the `queue` scenario.
    #[arg(long, env = "IDEM_AMQP_URL", default_value = DEFAULT_AMQP_URL)]
    pub amqp_url: String,
    /// Print the figures as one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug, Clone)]
pub struct ChargeArgs {
    /// The merchant's order number.
    #[arg(long)]
    pub order: i64,
    /// The amount in cents.
    #[arg(long)]
    pub amount: i64,
    /// ISO 4217 code; the server's default (BRL) when absent.
    #[arg(long)]
    pub currency: Option<String>,
    /// The Idempotency-Key; a fresh random one when absent (one per intent).
    #[arg(long)]
    pub key: Option<String>,
    /// The API's base URL; repeat for several instances.
    #[arg(
        long = "url",
        env = "IDEM_URL",
        default_value = "http://127.0.0.1:8080",
        value_delimiter = ','
    )]
    pub urls: Vec<String>,
    /// The merchant's secret.
    #[arg(long, env = "IDEM_SECRET", hide_env_values = true)]
    pub secret: String,
}

#[derive(Args, Debug, Clone)]
pub struct SimArgs {
    /// Address to listen on.
    #[arg(long, env = "IDEM_SIM_LISTEN", default_value = "127.0.0.1:9090")]
    pub listen: SocketAddr,
    /// Delay before each capture is processed.
    #[arg(long, env = "IDEM_SIM_LATENCY", value_parser = parse_duration, default_value = "0ms")]
    pub latency: Duration,
    /// Chance, 0.0 to 1.0, that a new capture is declined.
    #[arg(long, env = "IDEM_SIM_DECLINE_RATE", default_value_t = 0.0, value_parser = parse_rate)]
    pub decline_rate: f64,
    /// Fault to inject into capture calls: none, error-before, error-after,
    /// hang, drop-after, or status:N (answer status N without capturing).
    #[arg(long, env = "IDEM_SIM_FAULT", default_value_t = Fault::None)]
    pub fault: Fault,
    /// Apply the fault to this many calls only (default: every call).
    #[arg(long, env = "IDEM_SIM_FAULT_COUNT")]
    pub fault_count: Option<u64>,
    /// How long the `hang` fault withholds its answer.
    #[arg(long, env = "IDEM_SIM_HANG", value_parser = parse_duration, default_value = "120s")]
    pub hang: Duration,
    /// Serve HTTPS with this certificate chain (PEM, the server's first); needs --tls-key.
    #[arg(long, env = "IDEM_SIM_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "IDEM_SIM_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
    /// The Retry-After, in seconds, that a status:N fault sends (e.g. with 429).
    #[arg(long, env = "IDEM_SIM_RETRY_AFTER")]
    pub retry_after_secs: Option<u64>,
}

/// `500ms`, `30s`, `24h`, `1h 30m`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (write durations like 500ms, 30s, 24h)"))
}

fn parse_positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("a whole number, at least 1".to_owned()),
    }
}

fn parse_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err("a rate is a number from 0.0 to 1.0".to_owned()),
    }
}

/// Runs a parsed command line to its exit code.
pub fn main(cli: Cli) -> ExitCode {
    let default_filter = match cli.command {
        Command::Demo(_) => crate::harness::LOG_FILTER,
        _ => DEFAULT_LOG_FILTER,
    };
    init_tracing(cli.log_format, default_filter);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("idem: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("idem: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Migrate(db) => migrate(&db).await,
        Command::Tenant {
            command: TenantCommand::Create { name, db },
        } => create_tenant(&name, &db).await,
        Command::Serve(args) => serve(args, shutdown_signal()).await,
        Command::AcquirerSim(args) => acquirer_sim(args, shutdown_signal()).await,
        Command::Reconcile(args) => reconcile(args, shutdown_signal()).await,
        Command::Consume(args) => consume(args, shutdown_signal()).await,
        Command::Demo(args) => demo(args, shutdown_signal()).await,
        Command::Charge(args) => charge(args).await,
        Command::Bench(args) => bench(args).await,
        Command::Charges {
            command: ChargesCommand::Stuck(db),
        } => stuck(&db).await,
        Command::Openapi => {
            print!("{}", http::openapi_json());
            Ok(())
        }
    }
}

impl DbArgs {
    /// The database URL given, or the embedded default (said once in the log).
    pub fn url(&self) -> String {
        database_url_or_default(self.database_url.as_deref())
    }
}

fn database_url_or_default(given: Option<&str>) -> String {
    match given {
        Some(url) => url.to_owned(),
        None => {
            tracing::info!(
                database_url = crate::store::DEFAULT_DATABASE_URL,
                "no --database-url or DATABASE_URL: using the embedded SQLite store"
            );
            crate::store::DEFAULT_DATABASE_URL.to_owned()
        }
    }
}

async fn migrate(db: &DbArgs) -> anyhow::Result<()> {
    let url = db.url();
    // SQLite creates its file on connect; PostgreSQL needs the database made.
    if crate::store::Backend::of_url(&url)? == crate::store::Backend::Postgres
        && !sqlx::Postgres::database_exists(&url)
            .await
            .context("checking the database")?
    {
        sqlx::Postgres::create_database(&url)
            .await
            .context("creating the database")?;
        tracing::info!("created the database");
    }
    let store = Store::connect(&url, 1)
        .await
        .context("connecting to the database")?;
    store.migrate().await.context("migrating the schema")?;
    tracing::info!("schema is up to date");
    Ok(())
}

async fn create_tenant(name: &str, db: &DbArgs) -> anyhow::Result<()> {
    let name =
        parse_merchant_name(name).map_err(|rule| anyhow::anyhow!("refusing {name:?}: {rule}"))?;
    let store = Store::connect(&db.url(), 1)
        .await
        .context("connecting to the database")?;
    let secret = MerchantSecret::generate();
    let merchant = store.create_merchant(name, &secret.hash()).await?;
    tracing::info!(merchant = %merchant.name, "merchant created");
    println!("{}", secret.expose());
    Ok(())
}

impl EngineArgs {
    /// The engine's settings, once the flags agree with each other; resolves
    /// the database URL (after the check, so a refusal logs nothing before it).
    pub(crate) fn settings(&self) -> anyhow::Result<app::EngineSettings> {
        anyhow::ensure!(
            self.lease > self.acquirer_timeout,
            "--lease ({}) must be longer than --acquirer-timeout ({}), or live attempts would be taken over",
            humantime::format_duration(self.lease),
            humantime::format_duration(self.acquirer_timeout)
        );
        Ok(app::EngineSettings {
            database_url: self.db.url(),
            db_max_connections: self.db.db_max_connections,
            acquirer_url: self.acquirer_url.clone(),
            acquirer_ca: self.acquirer_ca.clone(),
            acquirer_timeout: self.acquirer_timeout,
            lease: self.lease,
            key_ttl: self.key_ttl,
        })
    }
}

impl ReconcilerArgs {
    /// The reconciler's pace and deadline (its backoff is its own).
    pub(crate) fn config(&self) -> ReconcilerConfig {
        ReconcilerConfig::new(self.reconcile_interval, self.settle_deadline)
    }
}

impl WorkerArgs {
    /// The workers to run beside the process, none with `--no-workers`.
    pub(crate) fn workers(&self) -> Option<app::Workers> {
        (!self.no_workers).then(|| app::Workers {
            sweep_interval: self.sweep_interval,
            reconciler: self.reconciler.config(),
        })
    }
}

impl QueueArgs {
    /// The relay's and the consumer's settings, on the broker at `amqp_url`.
    pub(crate) fn queue(&self, amqp_url: String) -> app::Queue {
        app::Queue {
            amqp_url,
            prefetch: self.prefetch,
            outbox_poll: self.outbox_poll,
            outbox_retention: self.outbox_retention,
        }
    }
}

/// Starts the API on its configured address, with the reconciler and the
/// sweeper beside it, and runs them until `shutdown`.
pub async fn serve(args: ServeArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    let config = app::Serve {
        engine: args.engine.settings()?,
        listen: args.listen,
        metrics_listen: args.metrics_listen,
        header_read_timeout: args.header_read_timeout,
        max_in_flight: args.max_in_flight,
        queue: args.amqp_url.map(|url| args.queue.queue(url)),
        consume: args.consume,
        workers: args.workers.workers(),
    };
    app::serve(config, shutdown).await
}

/// `idem consume`: the consumer and the relay, with the workers beside them,
/// until `shutdown`.
pub async fn consume(args: ConsumeArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    let config = app::Consume {
        engine: args.engine.settings()?,
        metrics_listen: args.metrics_listen,
        queue: args.queue.queue(args.amqp_url),
        workers: args.workers.workers(),
    };
    app::consume(config, shutdown).await
}

/// The reconciler alone: one pass with `--once`, else until `shutdown`.
pub async fn reconcile(args: ReconcileArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    let engine = app::engine(&args.engine.settings()?).await?;
    let reconciler = Reconciler::new(engine, args.reconciler.config());
    if args.once {
        let report = reconciler.pass().await?;
        tracing::info!(?report, "reconciler pass");
        eprintln!(
            "settled {}, backed off {}, marked for review {}, skipped {}, errors {}",
            report.settled,
            report.backed_off,
            report.marked_for_review,
            report.skipped,
            report.errors
        );
        return Ok(());
    }
    reconciler.run(shutdown).await;
    Ok(())
}

/// Runs the demo, prints its table (or JSON), writes the report; fails if
/// idem itself ever charged twice.
async fn demo(args: DemoArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    let config = crate::demo::DemoConfig {
        // None: SQLite files of its own (the demo's first line says so).
        database_url: args
            .database_url
            .unwrap_or_else(|| crate::store::DEFAULT_DATABASE_URL.to_owned()),
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

async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    let config = crate::bench::BenchConfig {
        scenario: args.scenario,
        concurrency: args.concurrency,
        duration: args.duration,
        database_url: args.database_url,
        target: args.url.zip(args.secret),
        vs_pgbench: args.vs_pgbench,
        amqp_url: args.amqp_url,
    };
    let result = crate::bench::run(&config).await?;
    if args.json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        print!("{}", result.summary());
    }
    Ok(())
}

/// One intent through the retrying client.
async fn charge(args: ChargeArgs) -> anyhow::Result<()> {
    let client =
        idem_client::Client::new(args.urls, args.secret, idem_client::RetryPolicy::default())?;
    let request = idem_client::ChargeRequest {
        order_id: args.order,
        amount_cents: args.amount,
        currency: args.currency,
        description: None,
    };
    let answer = match &args.key {
        Some(key) => client.charge_with_key(key, &request).await?,
        None => client.charge(&request).await?,
    };
    eprintln!(
        "key {} · {} attempt(s) · status {}{}",
        answer.key,
        answer.attempts.len(),
        answer.status,
        if answer.replayed { " · replayed" } else { "" }
    );
    println!("{}", String::from_utf8_lossy(&answer.body));
    anyhow::ensure!(
        (200..300).contains(&answer.status),
        "the charge was not captured (status {})",
        answer.status
    );
    Ok(())
}

/// Prints the charges awaiting review, one per line, tab-separated.
async fn stuck(db: &DbArgs) -> anyhow::Result<()> {
    let store = Store::connect(&db.url(), 1)
        .await
        .context("connecting to the database")?;
    let stuck = store.stuck_charges().await?;
    println!("id\tmerchant\torder_id\tamount_cents\tcurrency\tacquirer_reference\tcreated_at\treview_since\treason");
    for c in &stuck {
        println!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            c.id,
            c.merchant,
            c.order_id,
            c.amount_cents,
            c.currency,
            c.acquirer_reference,
            c.created_at.to_rfc3339(),
            c.review_since.to_rfc3339(),
            c.review_reason.as_deref().unwrap_or("")
        );
    }
    eprintln!("{} charge(s) awaiting review", stuck.len());
    Ok(())
}

/// Starts the simulator on its configured address and runs it until `shutdown`.
pub async fn acquirer_sim(args: SimArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    let faults = Faults {
        latency_ms: u64::try_from(args.latency.as_millis())?,
        decline_rate: args.decline_rate,
        fault: args.fault,
        fault_count: args.fault_count,
        hang_ms: u64::try_from(args.hang.as_millis())?,
        retry_after_secs: args.retry_after_secs,
    };
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(http::Tls::from_pem_files(cert, key)?),
        _ => None,
    };
    tracing::info!(listen = %listener.local_addr()?, https = tls.is_some(), ?faults,
        "acquirer simulator listening");
    sim::serve(listener, faults, tls, shutdown).await
}

/// A token cancelled on SIGINT or SIGTERM.
fn shutdown_signal() -> CancellationToken {
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
const DEFAULT_LOG_FILTER: &str = "info";

/// Logs on stderr, filtered by `IDEM_LOG` when it is set (it always wins),
/// else by `default_filter`.
fn init_tracing(format: LogFormat, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env(LOG_ENV)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    // Colours only for a person at a terminal: escape codes in a log file are
    // noise, and colouring every request's line cost a tenth of a replay's CPU.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serve_defaults_are_the_http_layers_constants() {
        let cli = Cli::try_parse_from(["idem", "serve"]).expect("parses");
        let Command::Serve(args) = cli.command else {
            panic!("not serve")
        };
        assert_eq!(args.header_read_timeout, http::HEADER_READ_TIMEOUT);
        assert_eq!(args.max_in_flight, http::MAX_IN_FLIGHT);
        assert_eq!(args.metrics_listen, None);
    }
}

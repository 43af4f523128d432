//! `idem-lab demo`: the article's story, run for real, under three strategies.
//!
//! Each strategy gets a fresh database, a fresh acquirer simulator (so its
//! ledger counts only its own captures) and three instances on free loopback
//! ports. The same workload runs against each: intents whose client times out
//! while the first attempt is still at the acquirer and retries onto another
//! instance, plus bursts of simultaneous duplicates. Meanwhile a sampler watches
//! for busy connections and lock waits (`pg_stat_activity` on PostgreSQL; on
//! SQLite, a probe of its one write lock, and the servers' pools). The verdicts come
//! from the acquirer's ledger and the database, not from the servers' answers.
//!
//! While a strategy runs, one progress line says how far it is ([`progress`]);
//! the client side records every attempt's send and answer times, and the
//! simulator's ledger the time of every capture, so the report can draw a few
//! intents as a timeline ([`samples`], drawn by [`crate::timeline`]).

mod report;
mod samples;
pub mod teaching;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use idem_client::{Attempt, AttemptOutcome, ChargeRequest, Client, ClientError, RetryPolicy};
use serde::Serialize;
use sqlx::{ConnectOptions, Connection};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::harness::{fresh_database, remove_scratch_dir, start_idem, Started};
use crate::progress::Progress;
use crate::sim::{self, Faults, Ledger};
use crate::timeline::{self, AttemptEnd, AttemptSpan, IntentKind, IntentTrace};
use idem_core::acquirer::AcquirerClient;
use idem_core::store::Backend;
use teaching::{ServerTrace, Teaching};

pub use report::write_html;

/// How often the sampler looks (`pg_stat_activity`, or SQLite's write lock):
/// often enough to see a lock wait of a few milliseconds, cheap enough not to
/// be the load itself.
const SAMPLE_EVERY: Duration = Duration::from_millis(5);

/// How long a request must wait on a row lock to count as waiting, as a
/// share of the acquirer's latency: far less than an acquirer call (what
/// hold-transaction makes retries wait for), far more than a commit (a losing
/// claim waits for the winner's commit; on a loaded machine, with fsync, that
/// was seen to pass 50 ms).
const LOCK_WAIT_SHARE: u32 = 4;

/// The lock-wait threshold for a given acquirer latency.
fn lock_wait_threshold(acquirer_latency: Duration) -> Duration {
    acquirer_latency / LOCK_WAIT_SHARE
}

/// The acquirer timeout of every strategy's instances: well above the
/// simulator's latency, so only the *client's* timeout fires.
const ACQUIRER_TIMEOUT: Duration = Duration::from_secs(2);

/// What the demo runs.
#[derive(Debug, Clone)]
pub struct DemoConfig {
    /// A PostgreSQL URL; the demo makes its own databases on that server.
    pub database_url: String,
    /// Intents sent by a client that times out and retries on another instance.
    pub intents: usize,
    /// Intents sent as bursts of simultaneous duplicates...
    pub bursts: usize,
    /// ...of this many copies each.
    pub copies: usize,
    /// The acquirer's latency: longer than the client's timeout, so it fires.
    pub acquirer_latency: Duration,
    /// The client's per-attempt timeout.
    pub client_timeout: Duration,
}

/// One strategy's figures (`--json` prints these).
#[derive(Debug, Clone, Serialize)]
pub struct StrategyResult {
    pub name: &'static str,
    pub intents: usize,
    pub captures: usize,
    pub double_charged: usize,
    pub retry_p50_ms: f64,
    pub retry_p99_ms: f64,
    pub max_busy_connections: i64,
    pub lock_waits: usize,
    /// How long a wait on a row lock had to last to count.
    pub lock_wait_threshold_ms: u64,
    pub gave_up: usize,
    pub verdict: String,
    /// A few intents worth drawing as a timeline (the HTML report only).
    #[serde(skip)]
    pub samples: Vec<IntentTrace>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DemoReport {
    /// The store the strategies ran on: `postgres` or `sqlite`. Where the
    /// connection and lock figures come from depends on it.
    pub store: &'static str,
    pub strategies: Vec<StrategyResult>,
}

impl DemoReport {
    /// Did the real service ever charge an intent twice?
    pub fn idem_double_charged(&self) -> bool {
        self.strategies
            .iter()
            .any(|s| s.name == "idem" && s.double_charged > 0)
    }

    /// The figures as a plain table with one verdict line per strategy.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{:<17} {:>7} {:>8} {:>7} {:>10} {:>10} {:>9} {:>10}\n",
            "strategy",
            "intents",
            "captures",
            "double",
            "retry p50",
            "retry p99",
            "busy conn",
            "lock waits"
        );
        for s in &self.strategies {
            out.push_str(&format!(
                "{:<17} {:>7} {:>8} {:>7} {:>8.1}ms {:>8.1}ms {:>9} {:>10}\n",
                s.name,
                s.intents,
                s.captures,
                s.double_charged,
                s.retry_p50_ms,
                s.retry_p99_ms,
                s.max_busy_connections,
                s.lock_waits
            ));
        }
        out.push('\n');
        for s in &self.strategies {
            out.push_str(&format!("{:<17} {}\n", s.name, s.verdict));
        }
        out
    }
}

/// Runs the three strategies one after the other; stops everything it started
/// when it ends or when `shutdown` fires.
pub async fn run(config: &DemoConfig, shutdown: CancellationToken) -> anyhow::Result<DemoReport> {
    let report = run_strategies(config, shutdown).await;
    remove_scratch_dir();
    report
}

async fn run_strategies(
    config: &DemoConfig,
    shutdown: CancellationToken,
) -> anyhow::Result<DemoReport> {
    let backend = Backend::of_url(&config.database_url)?;
    anyhow::ensure!(
        backend != Backend::MariaDb,
        "idem-lab demo draws the race on PostgreSQL or SQLite; on MariaDB its teaching tables \
         and its lock sampler are not written yet (idem itself runs there: idem-lab bench)"
    );
    eprintln!("{}", store_line(backend));
    let mut strategies = Vec::new();
    for strategy in [
        Strategy::CheckThenAct,
        Strategy::HoldTransaction,
        Strategy::Idem,
    ] {
        let result = tokio::select! {
            r = run_strategy(config, strategy) => r?,
            _ = shutdown.cancelled() => anyhow::bail!("interrupted; everything started was stopped"),
        };
        strategies.push(result);
    }
    Ok(DemoReport {
        store: store_name(backend),
        strategies,
    })
}

/// The first line the demo prints: where it runs.
fn store_line(backend: Backend) -> &'static str {
    match backend {
        Backend::Sqlite => {
            "idem-lab demo on SQLite: files in a scratch directory, removed at the end \
             (DATABASE_URL=postgres://... for PostgreSQL)"
        }
        Backend::Postgres => {
            "idem-lab demo on PostgreSQL: databases idem_demo_* on the server DATABASE_URL names"
        }
        Backend::MariaDb => {
            "idem-lab demo on MariaDB: databases idem_demo_* on the server DATABASE_URL names"
        }
    }
}

fn store_name(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => "postgres",
        Backend::Sqlite => "sqlite",
        Backend::MariaDb => "mariadb",
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Strategy {
    CheckThenAct,
    HoldTransaction,
    Idem,
}

impl Strategy {
    fn name(self) -> &'static str {
        match self {
            Self::CheckThenAct => "check-then-act",
            Self::HoldTransaction => "hold-transaction",
            Self::Idem => "idem",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        [Self::CheckThenAct, Self::HoldTransaction, Self::Idem]
            .into_iter()
            .find(|s| s.name() == name)
    }
}

async fn run_strategy(config: &DemoConfig, strategy: Strategy) -> anyhow::Result<StrategyResult> {
    let db_name = format!("idem_demo_{}", strategy.name().replace('-', "_"));
    let db_url = fresh_database(&config.database_url, &db_name).await?;
    let mut started = Started {
        children: Vec::new(),
        stop: CancellationToken::new(),
    };
    let merchant = format!("demo-{}", strategy.name());

    let sim_listener = TcpListener::bind("127.0.0.1:0").await?;
    let sim_url = format!("http://{}", sim_listener.local_addr()?);
    let faults = Faults {
        latency_ms: u64::try_from(config.acquirer_latency.as_millis())?,
        ..Faults::default()
    };
    tokio::spawn(sim::serve(sim_listener, faults, None, started.stop.clone()));

    let trace = ServerTrace::default();
    let (endpoints, secret, busy) = match strategy {
        Strategy::Idem => {
            let flags = ["--acquirer-timeout", "2s", "--lease", "3s"];
            let (endpoints, secret) =
                start_idem(&db_url, &sim_url, &merchant, 3, &flags, &mut started).await?;
            let busy = BusySource::Metrics(endpoints.clone());
            (endpoints, secret, busy)
        }
        Strategy::CheckThenAct | Strategy::HoldTransaction => {
            let teaching = if strategy == Strategy::CheckThenAct {
                Teaching::CheckThenAct
            } else {
                Teaching::HoldTransaction
            };
            let (endpoints, secret, pools) =
                start_teaching(&db_url, &sim_url, &merchant, teaching, &trace, &started).await?;
            (endpoints, secret, BusySource::Pools(pools))
        }
    };

    let threshold = lock_wait_threshold(config.acquirer_latency);
    let sampler = Sampler::start(&db_url, threshold, busy).await?;
    let intents = config.intents + config.bursts;
    let progress = Progress::start(strategy.name(), intents);
    let done = Arc::new(AtomicUsize::new(0));
    let ticker = started.stop.child_token();
    if progress.is_live() {
        let mine = merchant.clone();
        tokio::spawn(crate::progress::follow(
            progress.clone(),
            done.clone(),
            format!("{sim_url}/_sim/ledger"),
            move |c| c.merchant == mine,
            ticker.clone(),
        ));
    }
    let t0 = Instant::now();
    let records = workload(config, &endpoints, &secret, &done).await;
    ticker.cancel();
    let records = records?;
    let (max_busy, lock_waits) = sampler.stop().await?;

    let asked = Instant::now();
    let ledger: Ledger = reqwest::get(format!("{sim_url}/_sim/ledger"))
        .await?
        .json()
        .await?;
    // The simulator's clock read `now_micros` about half way through that request.
    let ledger_read_ms = ms_since(t0, asked) + ms_since(asked, Instant::now()) / 2.0;
    let mine: Vec<_> = ledger
        .counts
        .iter()
        .filter(|c| c.merchant == merchant)
        .collect();
    let captures = mine.iter().map(|c| c.captures as usize).sum();
    progress.finish(done.load(Ordering::SeqCst), captures);
    let double_charged = mine.iter().filter(|c| c.captures > 1).count();
    let mut retries: Vec<f64> = records
        .iter()
        .flat_map(|r| &r.copies)
        .flat_map(|(_, attempts)| attempts.iter().skip(1))
        .map(|a| a.elapsed.as_secs_f64() * 1000.0)
        .collect();
    retries.sort_by(f64::total_cmp);
    let gave_up = records
        .iter()
        .flat_map(|r| &r.copies)
        .filter(|(final_answer, _)| !final_answer)
        .count();
    let server_steps = trace.lock().map(|t| t.clone()).unwrap_or_default();
    let traces: Vec<IntentTrace> = records
        .iter()
        .map(|r| {
            let captures_ms = ledger
                .captures
                .iter()
                .filter(|c| c.merchant == merchant && c.order_id == r.order_id)
                .map(|c| {
                    ledger_read_ms - ledger.now_micros.saturating_sub(c.at_micros) as f64 / 1000.0
                })
                .collect();
            let server = server_steps
                .iter()
                .filter(|(key, _, _)| *key == r.key)
                .map(|(_, step, at)| (*step, ms_since(t0, *at)))
                .collect();
            r.trace(t0, &endpoints, captures_ms, server)
        })
        .collect();
    let samples = samples::pick_samples(strategy, &traces);
    let (p50, p99) = (percentile(&retries, 0.50), percentile(&retries, 0.99));
    let verdict = if double_charged > 0 {
        format!(
            "charged {double_charged} of {intents} intents more than once: the check-then-act race"
        )
    } else if lock_waits > 0 {
        let what = match Backend::of_url(&db_url)? {
            Backend::Postgres | Backend::MariaDb => "requests waited over {ms} ms on a row lock",
            Backend::Sqlite => "times the write lock was held over {ms} ms, stalling every writer",
        }
        .replace("{ms}", &threshold.as_millis().to_string());
        format!("charged once, but {lock_waits} {what}, and {max_busy} connections were busy at once: retries hang, connections pile up")
    } else {
        format!("charged once; retries answered at once (p99 {p99:.1} ms), no lock waits")
    };
    drop(started);
    Ok(StrategyResult {
        name: strategy.name(),
        intents,
        captures,
        double_charged,
        retry_p50_ms: p50,
        retry_p99_ms: p99,
        max_busy_connections: max_busy,
        lock_waits,
        lock_wait_threshold_ms: u64::try_from(threshold.as_millis()).unwrap_or(u64::MAX),
        gave_up,
        verdict,
        samples,
    })
}

/// Milliseconds from `from` to `to` (0 if `to` is earlier).
fn ms_since(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64() * 1000.0
}

/// Three in-process servers of a teaching strategy on its database; returns
/// their URLs, the merchant's secret, and their pools (for the sampler).
async fn start_teaching(
    db_url: &str,
    sim_url: &str,
    merchant: &str,
    strategy: Teaching,
    trace: &ServerTrace,
    started: &Started,
) -> anyhow::Result<(Vec<String>, String, Vec<sqlx::AnyPool>)> {
    sqlx::any::install_default_drivers();
    let backend = Backend::of_url(db_url)?;
    let setup = sqlx::AnyPool::connect(db_url).await?;
    teaching::create_table(&setup, backend, strategy).await?;
    setup.close().await;
    let mut endpoints = Vec::new();
    let mut pools = Vec::new();
    for _ in 0..3 {
        // Their statements are slow by design (that is what the demo
        // measures), so sqlx's slow-statement warnings would only be noise.
        let options = <sqlx::any::AnyConnectOptions as std::str::FromStr>::from_str(db_url)?
            .log_slow_statements(log::LevelFilter::Off, Duration::from_secs(1));
        let pool = sqlx::pool::PoolOptions::<sqlx::Any>::new()
            .max_connections(20)
            .connect_with(options)
            .await?;
        pools.push(pool.clone());
        let acquirer = AcquirerClient::new(sim_url, ACQUIRER_TIMEOUT, None)?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        endpoints.push(format!("http://{}", listener.local_addr()?));
        let app = teaching::router(strategy, pool, acquirer, merchant.to_owned(), trace.clone());
        let stop = started.stop.clone();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await
        });
    }
    Ok((endpoints, "demo".to_owned(), pools))
}

/// What the client side saw of one intent.
struct IntentRecord {
    kind: IntentKind,
    order_id: i64,
    key: String,
    /// Per client that sent it (one, or a burst's copies): whether it got a
    /// final answer, and every attempt it made.
    copies: Vec<(bool, Vec<Attempt>)>,
}

impl IntentRecord {
    /// The intent on the strategy's clock, which started at `t0`.
    fn trace(
        &self,
        t0: Instant,
        endpoints: &[String],
        captures_ms: Vec<f64>,
        server: Vec<(timeline::ServerStep, f64)>,
    ) -> IntentTrace {
        let attempts = self
            .copies
            .iter()
            .enumerate()
            .flat_map(|(copy, (_, attempts))| {
                attempts.iter().enumerate().map(move |(number, a)| {
                    let sent_ms = ms_since(t0, a.sent);
                    AttemptSpan {
                        copy,
                        number,
                        instance: endpoints.iter().position(|e| *e == a.endpoint).unwrap_or(0),
                        sent_ms,
                        ended_ms: sent_ms + a.elapsed.as_secs_f64() * 1000.0,
                        end: match a.outcome {
                            AttemptOutcome::Status(s) => AttemptEnd::Status(s),
                            AttemptOutcome::Timeout => AttemptEnd::Timeout,
                            AttemptOutcome::Connection(_) => AttemptEnd::Failed,
                        },
                    }
                })
            })
            .collect();
        IntentTrace {
            kind: self.kind,
            order_id: self.order_id,
            attempts,
            captures_ms,
            server,
        }
    }
}

/// Sends the workload; `done` counts the intents whose every client has
/// finished.
async fn workload(
    config: &DemoConfig,
    endpoints: &[String],
    secret: &str,
    done: &AtomicUsize,
) -> anyhow::Result<Vec<IntentRecord>> {
    let policy = RetryPolicy {
        max_attempts: 30,
        max_elapsed: Duration::from_secs(30),
        attempt_timeout: config.client_timeout,
        base_delay: Duration::from_millis(20),
        max_delay: Duration::from_millis(500),
        // The demo draws the race as it is: a duplicate meets the 409.
        prefer_wait: Duration::ZERO,
    };
    // A client per starting instance: intent i starts on instance i % 3 and
    // retries on the next, as a load balancer would spread them.
    let clients: Vec<Client> = (0..endpoints.len())
        .map(|start| {
            let rotated: Vec<String> = endpoints
                .iter()
                .cycle()
                .skip(start)
                .take(endpoints.len())
                .cloned()
                .collect();
            Client::new(rotated, secret, policy.clone())
        })
        .collect::<Result<_, _>>()?;
    let request = |order: usize| ChargeRequest {
        order_id: i64::try_from(order).unwrap_or(i64::MAX),
        amount_cents: 25_000,
        currency: Some("BRL".to_owned()),
        description: None,
    };
    let retrying = (0..config.intents).map(|i| {
        let client = clients[i % clients.len()].clone();
        let req = request(i + 1);
        let key = random_key();
        async move {
            let copy = client_copy(client.charge_with_key(&key, &req).await);
            done.fetch_add(1, Ordering::SeqCst);
            IntentRecord {
                kind: IntentKind::Retried,
                order_id: req.order_id,
                key,
                copies: vec![copy],
            }
        }
    });
    let bursts = (0..config.bursts).map(|b| {
        let key = random_key();
        let req = request(config.intents + b + 1);
        let copies: Vec<_> = (0..config.copies)
            .map(|copy| {
                let client = clients[copy % clients.len()].clone();
                let (key, req) = (key.clone(), req.clone());
                async move { client_copy(client.charge_with_key(&key, &req).await) }
            })
            .collect();
        async move {
            let copies = join_all(copies).await;
            done.fetch_add(1, Ordering::SeqCst);
            IntentRecord {
                kind: IntentKind::Burst,
                order_id: req.order_id,
                key,
                copies,
            }
        }
    });
    let (mut records, burst_records) = tokio::join!(join_all(retrying), join_all(bursts));
    records.extend(burst_records);
    Ok(records)
}

/// Whether one client got a final answer, and its attempts.
fn client_copy(result: Result<idem_client::ChargeAnswer, ClientError>) -> (bool, Vec<Attempt>) {
    match result {
        Ok(a) => (true, a.attempts),
        Err(ClientError::GaveUp { attempts, .. }) => (false, attempts),
        Err(_) => (false, Vec::new()),
    }
}

fn random_key() -> String {
    use rand::distr::{Alphanumeric, SampleString};
    Alphanumeric.sample_string(&mut rand::rng(), 32)
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// Where the sampler reads how many connections are busy, on SQLite (on
/// PostgreSQL, `pg_stat_activity` shows every strategy's connections).
enum BusySource {
    /// The teaching servers' pools, in this process.
    Pools(Vec<sqlx::AnyPool>),
    /// The `idem serve` instances, by their `/metrics`.
    Metrics(Vec<String>),
}

/// How often a SQLite sampler reads the instances' `/metrics`: a scrape costs
/// each instance two queries, so far less often than the lock probe.
const SCRAPE_EVERY: u32 = 10;

/// Watches the strategy's database while the workload runs.
struct Sampler {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<(i64, usize)>>,
}

impl Sampler {
    async fn start(db_url: &str, threshold: Duration, busy: BusySource) -> anyhow::Result<Self> {
        let stop = CancellationToken::new();
        let flag = stop.clone();
        let task = match Backend::of_url(db_url)? {
            Backend::Postgres => {
                let conn = sqlx::PgConnection::connect(db_url).await?;
                tokio::spawn(sample_postgres(conn, threshold, flag))
            }
            Backend::Sqlite => {
                use std::str::FromStr;
                // No busy timeout: the probe must learn at once that the lock is taken.
                let options = sqlx::sqlite::SqliteConnectOptions::from_str(db_url)?
                    .busy_timeout(Duration::ZERO);
                let conn = sqlx::SqliteConnection::connect_with(&options).await?;
                tokio::spawn(sample_sqlite(conn, threshold, busy, flag))
            }
            Backend::MariaDb => anyhow::bail!("the demo's lock sampler has no MariaDB yet"),
        };
        Ok(Self { stop, task })
    }

    /// The most connections busy at once, and the lock waits that lasted at
    /// least the threshold.
    async fn stop(self) -> anyhow::Result<(i64, usize)> {
        self.stop.cancel();
        self.task.await?
    }
}

/// PostgreSQL: busy connections and requests waiting on a lock, from
/// `pg_stat_activity`.
async fn sample_postgres(
    mut conn: sqlx::PgConnection,
    threshold: Duration,
    stop: CancellationToken,
) -> anyhow::Result<(i64, usize)> {
    let mut max_busy = 0;
    let mut first_seen = std::collections::HashMap::new();
    let mut waiters = std::collections::HashSet::new();
    while !stop.is_cancelled() {
        let rows: Vec<(i32, Option<chrono::DateTime<chrono::Utc>>, bool, bool)> = sqlx::query_as(
            "select pid, query_start, wait_event_type is not distinct from 'Lock',
                    coalesce(state in ('active', 'idle in transaction'), false)
               from pg_stat_activity
              where datname = current_database() and pid <> pg_backend_pid()",
        )
        .fetch_all(&mut conn)
        .await?;
        max_busy = max_busy.max(rows.iter().filter(|r| r.3).count() as i64);
        // A wait counts once it has lasted `threshold`: an insert that
        // conflicts with a claim being committed waits for that commit
        // (milliseconds), and that is not a request hanging.
        let now = Instant::now();
        for r in rows.iter().filter(|r| r.2) {
            let since = *first_seen.entry((r.0, r.1)).or_insert(now);
            if now - since >= threshold {
                waiters.insert((r.0, r.1));
            }
        }
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
    Ok((max_busy, waiters.len()))
}

/// SQLite: one write lock covers the file, so a transaction held open makes
/// every writer wait. The probe tries to take that lock (and gives it back at
/// once); one transaction holding it for `threshold` or more counts as one
/// lock wait. `pragma data_version` tells one long holder from many short
/// ones in a row: it changes whenever another connection commits. Busy
/// connections come from `busy`.
async fn sample_sqlite(
    mut conn: sqlx::SqliteConnection,
    threshold: Duration,
    busy: BusySource,
    stop: CancellationToken,
) -> anyhow::Result<(i64, usize)> {
    let http = reqwest::Client::new();
    let (mut max_busy, mut long_holds) = (0, 0);
    // While the lock is seen taken: since when, at which data version, and
    // whether this hold was counted already.
    let mut hold: Option<(Instant, i64, bool)> = None;
    let mut tick = 0u32;
    while !stop.is_cancelled() {
        // With no busy timeout, even this read can find the file busy for a
        // moment (a checkpoint, the writer's WAL-index lock): that sample is
        // skipped, never the demo.
        let (version,): (i64,) = match sqlx::query_as("pragma data_version")
            .fetch_one(&mut conn)
            .await
        {
            Ok(v) => v,
            Err(sqlx::Error::Database(e)) if is_busy(e.as_ref()) => {
                tokio::time::sleep(SAMPLE_EVERY).await;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let taken = match sqlx::query("begin immediate").execute(&mut conn).await {
            Ok(_) => {
                sqlx::query("rollback").execute(&mut conn).await?;
                false
            }
            Err(sqlx::Error::Database(e)) if is_busy(e.as_ref()) => true,
            Err(e) => return Err(e.into()),
        };
        hold = match (taken, hold) {
            (false, _) => None,
            // A commit since the last look: the lock changed hands.
            (true, Some((since, seen, counted))) if seen == version => {
                let long = since.elapsed() >= threshold;
                if long && !counted {
                    long_holds += 1;
                }
                Some((since, seen, counted || long))
            }
            (true, _) => Some((Instant::now(), version, false)),
        };
        let now_busy = match &busy {
            BusySource::Pools(pools) => pools
                .iter()
                .map(|p| i64::from(p.size()) - p.num_idle() as i64)
                .sum(),
            BusySource::Metrics(endpoints) if tick.is_multiple_of(SCRAPE_EVERY) => {
                let mut sum = 0;
                for e in endpoints {
                    sum += scrape_in_use(&http, e).await.unwrap_or(0);
                }
                sum
            }
            BusySource::Metrics(_) => 0,
        };
        max_busy = max_busy.max(now_busy);
        tick = tick.wrapping_add(1);
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
    Ok((max_busy, long_holds))
}

/// SQLite's "another connection holds the lock": `SQLITE_BUSY` (5) or
/// `SQLITE_LOCKED` (6), extended codes included.
fn is_busy(e: &dyn sqlx::error::DatabaseError) -> bool {
    e.code()
        .and_then(|c| c.parse::<i32>().ok())
        .is_some_and(|c| matches!(c & 0xff, 5 | 6))
        || e.message().contains("locked")
}

/// An instance's busy pool connections, from its `/metrics`.
async fn scrape_in_use(http: &reqwest::Client, endpoint: &str) -> Option<i64> {
    let text = http
        .get(format!("{endpoint}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let line = text
        .lines()
        .find(|l| l.starts_with("idem_db_pool_connections{state=\"in_use\"}"))?;
    let value: f64 = line.rsplit(' ').next()?.parse().ok()?;
    Some(value as i64)
}

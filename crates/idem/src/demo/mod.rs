//! `idem demo`: the article's story, run for real, under three strategies.
//!
//! Each strategy gets a fresh database, a fresh acquirer simulator (so its
//! ledger counts only its own captures) and three instances on free loopback
//! ports. The same workload runs against each: intents whose client times out
//! while the first attempt is still at the acquirer and retries onto another
//! instance, plus bursts of simultaneous duplicates. Meanwhile a sampler watches
//! `pg_stat_activity` for busy connections and lock waits. The verdicts come
//! from the acquirer's ledger and the database, not from the servers' answers.

mod report;
mod teaching;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::future::join_all;
use idem_client::{ChargeRequest, Client, ClientError, RetryPolicy};
use serde::Serialize;
use sqlx::Connection;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::acquirer::AcquirerClient;
use crate::domain::MerchantSecret;
use crate::sim::{self, Faults, Ledger};
use crate::store::Store;
use teaching::Teaching;

pub use report::write_html;

/// How often the sampler reads `pg_stat_activity`: often enough to see a lock
/// wait of a few milliseconds, cheap enough not to be the load itself.
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
}

#[derive(Debug, Clone, Serialize)]
pub struct DemoReport {
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
    let mut strategies = Vec::new();
    for strategy in [
        Strategy::CheckThenAct,
        Strategy::HoldTransaction,
        Strategy::Idem,
    ] {
        tracing::info!(strategy = strategy.name(), "running");
        let result = tokio::select! {
            r = run_strategy(config, strategy) => r?,
            _ = shutdown.cancelled() => anyhow::bail!("interrupted; everything started was stopped"),
        };
        strategies.push(result);
    }
    Ok(DemoReport { strategies })
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
}

/// Things started for one strategy, stopped on drop (also on Ctrl-C).
pub(crate) struct Started {
    pub(crate) children: Vec<Child>,
    pub(crate) stop: CancellationToken,
}

impl Drop for Started {
    fn drop(&mut self) {
        self.stop.cancel();
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
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
    tokio::spawn(sim::serve(sim_listener, faults, started.stop.clone()));

    let (endpoints, secret) = match strategy {
        Strategy::Idem => {
            let flags = ["--acquirer-timeout", "2s", "--lease", "3s"];
            start_idem(&db_url, &sim_url, &merchant, 3, &flags, &mut started).await?
        }
        Strategy::CheckThenAct => {
            start_teaching(
                &db_url,
                &sim_url,
                &merchant,
                Teaching::CheckThenAct,
                &started,
            )
            .await?
        }
        Strategy::HoldTransaction => {
            start_teaching(
                &db_url,
                &sim_url,
                &merchant,
                Teaching::HoldTransaction,
                &started,
            )
            .await?
        }
    };

    let threshold = lock_wait_threshold(config.acquirer_latency);
    let sampler = Sampler::start(&db_url, threshold).await?;
    let answers = workload(config, &endpoints, &secret).await?;
    let (max_busy, lock_waits) = sampler.stop().await?;

    let ledger: Ledger = reqwest::get(format!("{sim_url}/_sim/ledger"))
        .await?
        .json()
        .await?;
    let mine: Vec<_> = ledger
        .counts
        .iter()
        .filter(|c| c.merchant == merchant)
        .collect();
    let captures = mine.iter().map(|c| c.captures as usize).sum();
    let double_charged = mine.iter().filter(|c| c.captures > 1).count();
    let mut retries: Vec<f64> = answers
        .iter()
        .flat_map(|a| a.retry_ms.iter().copied())
        .collect();
    retries.sort_by(f64::total_cmp);
    let gave_up = answers.iter().filter(|a| !a.final_answer).count();
    let intents = config.intents + config.bursts;
    let (p50, p99) = (percentile(&retries, 0.50), percentile(&retries, 0.99));
    let verdict = if double_charged > 0 {
        format!(
            "charged {double_charged} of {intents} intents more than once: the check-then-act race"
        )
    } else if lock_waits > 0 {
        format!("charged once, but {lock_waits} requests waited over {} ms on a row lock and {max_busy} connections were busy at once: retries hang, connections pile up", threshold.as_millis())
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
    })
}

/// Drops and recreates the database `name` on the server of `url` (connecting
/// to `url` itself, or to that server's `postgres` database); returns its URL.
pub(crate) async fn fresh_database(url: &str, name: &str) -> anyhow::Result<String> {
    let base = &url[..url
        .rfind('/')
        .context("the database URL has no database name")?];
    let mut admin = sqlx::PgConnection::connect(url)
        .await
        .or(sqlx::PgConnection::connect(&format!("{base}/postgres")).await)
        .context("connecting to PostgreSQL (is DATABASE_URL right? scripts/demo starts one)")?;
    sqlx::query(&format!("drop database if exists {name} with (force)"))
        .execute(&mut admin)
        .await?;
    sqlx::query(&format!("create database {name}"))
        .execute(&mut admin)
        .await?;
    Ok(format!("{base}/{name}"))
}

/// `instances` real `idem serve` processes on a fresh database, with a
/// merchant; returns their base URLs and the merchant's secret.
pub(crate) async fn start_idem(
    db_url: &str,
    sim_url: &str,
    merchant: &str,
    instances: usize,
    flags: &[&str],
    started: &mut Started,
) -> anyhow::Result<(Vec<String>, String)> {
    let store = Store::connect(db_url, 1).await?;
    store.migrate().await?;
    let secret = MerchantSecret::generate();
    store.create_merchant(merchant, &secret.hash()).await?;
    let exe = std::env::current_exe().context("finding the idem binary")?;
    let mut endpoints = Vec::new();
    for _ in 0..instances {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = Command::new(&exe)
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--acquirer-url",
                sim_url,
            ])
            .args(flags)
            .env("DATABASE_URL", db_url)
            .env("IDEM_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .context("starting idem serve")?;
        started.children.push(child);
        endpoints.push(format!("http://127.0.0.1:{port}"));
    }
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    for e in &endpoints {
        while http.get(format!("{e}/healthz")).send().await.is_err() {
            anyhow::ensure!(Instant::now() < deadline, "idem serve at {e} did not start");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
    Ok((endpoints, secret.expose().to_owned()))
}

/// Three in-process servers of a teaching strategy on its database.
async fn start_teaching(
    db_url: &str,
    sim_url: &str,
    merchant: &str,
    strategy: Teaching,
    started: &Started,
) -> anyhow::Result<(Vec<String>, String)> {
    let setup = sqlx::PgPool::connect(db_url).await?;
    teaching::create_table(&setup, strategy).await?;
    setup.close().await;
    let mut endpoints = Vec::new();
    for _ in 0..3 {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(20)
            .connect(db_url)
            .await?;
        let acquirer = AcquirerClient::new(sim_url, ACQUIRER_TIMEOUT)?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        endpoints.push(format!("http://{}", listener.local_addr()?));
        let app = teaching::router(strategy, pool, acquirer, merchant.to_owned());
        let stop = started.stop.clone();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await
        });
    }
    Ok((endpoints, "demo".to_owned()))
}

/// What one client saw for one intent.
struct IntentAnswer {
    final_answer: bool,
    /// Time each retry (attempt after the first) took to answer.
    retry_ms: Vec<f64>,
}

async fn workload(
    config: &DemoConfig,
    endpoints: &[String],
    secret: &str,
) -> anyhow::Result<Vec<IntentAnswer>> {
    let policy = RetryPolicy {
        max_attempts: 30,
        max_elapsed: Duration::from_secs(30),
        attempt_timeout: config.client_timeout,
        base_delay: Duration::from_millis(20),
        max_delay: Duration::from_millis(500),
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
        async move { intent_answer(client.charge(&req).await) }
    });
    let bursts = (0..config.bursts).flat_map(|b| {
        let key = random_key();
        let req = request(config.intents + b + 1);
        let clients = &clients;
        (0..config.copies).map(move |copy| {
            let client = clients[copy % clients.len()].clone();
            let (key, req) = (key.clone(), req.clone());
            async move { intent_answer(client.charge_with_key(&key, &req).await) }
        })
    });
    let (mut answers, burst_answers) = tokio::join!(join_all(retrying), join_all(bursts));
    answers.extend(burst_answers);
    Ok(answers)
}

fn intent_answer(result: Result<idem_client::ChargeAnswer, ClientError>) -> IntentAnswer {
    let (final_answer, attempts) = match result {
        Ok(a) => (true, a.attempts),
        Err(ClientError::GaveUp { attempts, .. }) => (false, attempts),
        Err(_) => (false, Vec::new()),
    };
    IntentAnswer {
        final_answer,
        retry_ms: attempts
            .iter()
            .skip(1)
            .map(|a| a.elapsed.as_secs_f64() * 1000.0)
            .collect(),
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

/// Watches the strategy's database while the workload runs.
struct Sampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<anyhow::Result<(i64, usize)>>,
}

impl Sampler {
    async fn start(db_url: &str, threshold: Duration) -> anyhow::Result<Self> {
        let mut conn = sqlx::PgConnection::connect(db_url).await?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut max_busy = 0;
            let mut first_seen = std::collections::HashMap::new();
            let mut waiters = std::collections::HashSet::new();
            while !flag.load(Ordering::SeqCst) {
                let rows: Vec<(i32, Option<chrono::DateTime<chrono::Utc>>, bool, bool)> =
                    sqlx::query_as(
                        "select pid, query_start, wait_event_type is not distinct from 'Lock',
                            coalesce(state in ('active', 'idle in transaction'), false)
                       from pg_stat_activity
                      where datname = current_database() and pid <> pg_backend_pid()",
                    )
                    .fetch_all(&mut conn)
                    .await?;
                max_busy = max_busy.max(rows.iter().filter(|r| r.3).count() as i64);
                // A wait counts once it has lasted `threshold`: an insert
                // that conflicts with a claim being committed waits for that
                // commit (milliseconds), and that is not a request hanging.
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
        });
        Ok(Self { stop, task })
    }

    /// The most connections busy at once, and the requests seen waiting on a
    /// lock for at least the threshold.
    async fn stop(self) -> anyhow::Result<(i64, usize)> {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await?
    }
}

/// Where `--report` writes by default.
pub fn default_report_path() -> PathBuf {
    PathBuf::from("idem-demo.html")
}

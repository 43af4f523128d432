//! `idem-lab bench --arrival 500,1000,2500`: the open model, as merchants meet
//! idem. New charges arrive at a constant rate whatever the answers take,
//! against an acquirer whose latency is drawn from a real one's spread and
//! whose calls now and then time out or fail; clients retry those with the
//! same key, as the article's app does.
//!
//! A closed loop (`--concurrency`) measures its clients' patience once the
//! acquirer is slow: N clients each waiting 120 ms make N/0.12 charges a
//! second whatever the server could do, and a stall delays the next request
//! instead of showing in the latency (coordinated omission). Here each
//! request has its time on a schedule, and its latency runs from that time:
//! a request that waits for a free connection, or behind a stalled server,
//! waits on the clock.
//!
//! Per rate, on a fresh deployment: the answers by status, the end-to-end
//! latency, **the server's own share** (end-to-end less what the simulator
//! spent on that request's acquirer calls, which it writes down per order),
//! the most requests in flight and database connections busy at once, and
//! the acquirer's ledger checked: one capture per intent answered `201`.
//! The same run against `idem-lab teaching-server hold-transaction`, which
//! holds its database connection across the acquirer call, shows what the
//! article's design buys: its knee is its pool over the acquirer's latency.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;
use serde::Serialize;
use sqlx::Connection as _;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::chart::{self, Axes, Series};
use super::Connection;
use crate::harness::{fresh_database, remove_scratch_dir, start_idem, Started};
use crate::sim::{self, Faults, Ledger, Watch};

/// The server's share of a request's time, at the 99th percentile, under
/// which a rate counts as served (the knee is the highest such rate).
pub const SHARE_P99_TARGET_MS: f64 = 25.0;

/// How long one acquirer call may take before its outcome is unknown, for
/// both servers; a timed-out call of the simulator's is held this long, so
/// the caller gives up first and the reference is free again soon after.
const ACQUIRER_TIMEOUT: Duration = Duration::from_secs(2);

/// Requests sent at each rate before the measured window (not measured:
/// pools fill, caches warm; their intents are checked in the ledger too).
const WARM_UP: Duration = Duration::from_secs(1);

/// How long after the window intents may still finish (their retries
/// included) before those left are counted unsettled.
const DRAIN: Duration = Duration::from_secs(15);

/// The longest a client waits before retrying, whatever `Retry-After` says,
/// and what it waits when nothing says (a transport error).
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(2);
const DEFAULT_RETRY_PAUSE: Duration = Duration::from_millis(200);

/// How often the busy database connections are counted.
const DB_SAMPLE_EVERY: Duration = Duration::from_millis(10);

/// The answers a served rate may give: charges, declines, and what the
/// acquirer's injected faults make of an intent: `503`, the outcome unknown
/// until a retry, and `409` when that retry meets the reconciler settling
/// the same charge (the bench sends no other duplicate).
const SERVED_ANSWERS: [&str; 4] = ["201", "402", "503 outcome-unknown", "409 request-in-flight"];

/// The acquirer's latency: the median and the 99th percentile of a
/// lognormal, written `p50=120ms,p99=380ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct AcquirerLatency {
    #[serde(serialize_with = "millis")]
    pub p50: Duration,
    #[serde(serialize_with = "millis")]
    pub p99: Duration,
}

fn millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl std::str::FromStr for AcquirerLatency {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = |why: String| format!("{why}: write the latency as p50=120ms,p99=380ms");
        let (mut p50, mut p99) = (None, None);
        for part in s.split(',') {
            let (name, value) = part
                .split_once('=')
                .ok_or_else(|| bad(format!("{part:?} has no '='")))?;
            let value = idem::cmd::parse_duration(value.trim()).map_err(bad)?;
            match name.trim() {
                "p50" => p50 = Some(value),
                "p99" => p99 = Some(value),
                other => return Err(bad(format!("unknown percentile {other:?}"))),
            }
        }
        let p50 = p50.ok_or_else(|| bad("no p50".into()))?;
        let p99 = p99.unwrap_or(p50);
        if p99 < p50 {
            return Err(bad("the p99 is below the p50".into()));
        }
        if p50.is_zero() {
            return Err(bad("the p50 must be above zero".into()));
        }
        Ok(Self { p50, p99 })
    }
}

/// A chance written as a percentage (`0.7%`) or a fraction (`0.007`).
pub fn parse_chance(s: &str) -> Result<f64, String> {
    let (number, scale) = match s.trim().strip_suffix('%') {
        Some(percent) => (percent, 100.0),
        None => (s.trim(), 1.0),
    };
    match number.trim().parse::<f64>() {
        Ok(n) if (0.0..=1.0).contains(&(n / scale)) => Ok(n / scale),
        _ => Err(format!(
            "{s:?} is not a chance: write 0.7% or 0.007 (from 0 to 100%)"
        )),
    }
}

/// A positive rate of new charges per second.
pub fn parse_rate(s: &str) -> Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "{s:?} is not a rate: charges per second, at least 1"
        )),
    }
}

#[derive(Debug, Clone)]
pub struct ArrivalConfig {
    /// Charges per second, one run each.
    pub rates: Vec<u32>,
    pub duration: Duration,
    pub database_url: String,
    pub latency: AcquirerLatency,
    /// Chance that an acquirer call times out or answers a 5xx.
    pub fault_rate: f64,
    /// Each server's pool of database connections.
    pub db_connections: u32,
    /// The most connections the load generator opens; a request scheduled
    /// while all are busy waits for one, on the clock.
    pub connections: usize,
    /// Also run the teaching server that holds its transaction.
    pub hold_transaction: bool,
    pub report: PathBuf,
}

/// The servers the open model loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Server {
    Idem,
    HoldTransaction,
}

impl Server {
    fn name(self) -> &'static str {
        match self {
            Self::Idem => "idem",
            Self::HoldTransaction => "hold-transaction",
        }
    }
}

/// One server at one rate.
#[derive(Debug, Clone, Serialize)]
pub struct ArrivalRow {
    pub server: Server,
    pub offered_per_s: u32,
    /// Answers received per second during the window.
    pub achieved_per_s: f64,
    /// Requests scheduled in the window (retries included).
    pub requests: u64,
    /// Answers by status, with the problem type of an error
    /// (`503 outcome-unknown`); `transport error`; `unanswered` (no answer
    /// when the run ended).
    pub statuses: BTreeMap<String, u64>,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    /// End-to-end less the acquirer's time for the same request.
    pub share_p50_ms: f64,
    pub share_p99_ms: f64,
    pub share_p999_ms: f64,
    /// Requests sent and not yet answered, at most, at once.
    pub most_in_flight: u64,
    /// The server's database connections not idle, at most, at once
    /// (PostgreSQL's `pg_stat_activity`, sampled; none on SQLite).
    pub most_db_busy: Option<u64>,
    /// Intents (keys) started, warm-up included.
    pub intents: u64,
    /// Intents with no final answer when the run ended.
    pub unsettled: u64,
    /// Intents answered `201` whose order the acquirer captured other than
    /// once, and intents captured more than once whatever they were told.
    pub not_captured_once: u64,
    /// Acquirer calls that drew a random fault.
    pub faults_injected: u64,
    /// Claims and finalizes per batch idem sent the database, on average
    /// over the run (none for hold-transaction).
    pub claim_batch_rows: Option<f64>,
    pub finalize_batch_rows: Option<f64>,
    /// Every answer a served one, and the share's p99 under the target.
    pub served: bool,
}

/// Every row, and each server's knee: the highest rate it served.
#[derive(Debug, Clone, Serialize)]
pub struct ArrivalReport {
    pub latency: AcquirerLatency,
    pub fault_rate: f64,
    pub db_connections: u32,
    pub seconds_per_rate: f64,
    pub rows: Vec<ArrivalRow>,
    pub knee_per_s: Option<u32>,
    pub hold_transaction_knee_per_s: Option<u32>,
}

/// Runs each rate against idem, and (if asked) against hold-transaction
/// right after it, a fresh deployment each; writes the chart to the report.
pub async fn arrival(config: &ArrivalConfig) -> anyhow::Result<ArrivalReport> {
    anyhow::ensure!(
        !config.rates.is_empty(),
        "--arrival needs at least one rate"
    );
    let mut servers = vec![Server::Idem];
    if config.hold_transaction {
        servers.push(Server::HoldTransaction);
    }
    let mut rows = Vec::new();
    for &rate in &config.rates {
        for &server in &servers {
            let row = run_rate(config, server, rate).await;
            remove_scratch_dir();
            let row = row?;
            eprintln!(
                "{:>16} at {rate:>5}/s: {:.0}/s answered, p99 {:.1} ms, share p99 {:.1} ms{}",
                server.name(),
                row.achieved_per_s,
                row.p99_ms,
                row.share_p99_ms,
                if row.served { "" } else { "  (not served)" }
            );
            rows.push(row);
        }
    }
    let knee = |server: Server| {
        rows.iter()
            .filter(|r| r.server == server && r.served)
            .map(|r| r.offered_per_s)
            .max()
    };
    let report = ArrivalReport {
        latency: config.latency,
        fault_rate: config.fault_rate,
        db_connections: config.db_connections,
        seconds_per_rate: config.duration.as_secs_f64(),
        knee_per_s: knee(Server::Idem),
        hold_transaction_knee_per_s: config
            .hold_transaction
            .then(|| knee(Server::HoldTransaction))
            .flatten(),
        rows,
    };
    std::fs::write(&config.report, html(&report))
        .with_context(|| format!("writing {}", config.report.display()))?;
    Ok(report)
}

/// One server at one rate, on a fresh database and a fresh simulator.
async fn run_rate(config: &ArrivalConfig, server: Server, rate: u32) -> anyhow::Result<ArrivalRow> {
    let db_url = fresh_database(&config.database_url, "idem_bench").await?;
    let mut started = Started {
        children: Vec::new(),
        stop: CancellationToken::new(),
    };
    let watch = Watch::default();
    let sim_listener = TcpListener::bind("127.0.0.1:0").await?;
    let sim_url = format!("http://{}", sim_listener.local_addr()?);
    let faults = Faults {
        latency_ms: millis_of(config.latency.p50),
        latency_p99_ms: Some(millis_of(config.latency.p99)),
        fault_rate: config.fault_rate,
        hang_ms: millis_of(ACQUIRER_TIMEOUT),
        ..Faults::default()
    };
    faults.check().map_err(anyhow::Error::msg)?;
    tokio::spawn(sim::serve_watched(
        sim_listener,
        faults,
        watch.clone(),
        started.stop.clone(),
    ));
    let timeout = humantime::format_duration(ACQUIRER_TIMEOUT).to_string();
    let pool = config.db_connections.to_string();
    let (base, secret) = match server {
        Server::Idem => {
            let flags = [
                "--acquirer-timeout",
                &timeout,
                "--db-max-connections",
                &pool,
            ];
            let (endpoints, secret) =
                start_idem(&db_url, &sim_url, "bench", 1, &flags, &mut started).await?;
            (endpoints[0].clone(), secret)
        }
        Server::HoldTransaction => {
            let base =
                start_hold_transaction(&db_url, &sim_url, &timeout, &pool, &mut started).await?;
            // It takes any bearer secret.
            (base, "teaching".to_owned())
        }
    };
    let sampler = DbSampler::start(&db_url).await?;
    let load = Load::new(format!("{base}/v1/charges"), secret, watch.clone(), config);
    let measured = load.drive(rate, config.duration).await;
    let most_db_busy = sampler.stop().await;
    let measured = measured?;
    let ledger: Ledger = reqwest::get(format!("{sim_url}/_sim/ledger"))
        .await?
        .error_for_status()?
        .json()
        .await
        .context("reading the simulator's ledger")?;
    let metrics = match server {
        Server::Idem => {
            reqwest::get(format!("{base}/metrics"))
                .await?
                .text()
                .await?
        }
        Server::HoldTransaction => String::new(),
    };
    drop(started);
    let mut row = measured.row(server, rate, config.duration, &ledger, &watch, most_db_busy);
    row.claim_batch_rows = super::mean_batch_rows(&metrics, "claim");
    row.finalize_batch_rows = super::mean_batch_rows(&metrics, "finalize");
    Ok(row)
}

fn millis_of(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `idem-lab teaching-server hold-transaction` as a process of its own, as
/// idem is; returns its base URL once it accepts connections.
async fn start_hold_transaction(
    db_url: &str,
    sim_url: &str,
    timeout: &str,
    pool: &str,
    started: &mut Started,
) -> anyhow::Result<String> {
    let exe =
        std::env::current_exe().context("finding this binary, to start the teaching server")?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let listen = format!("127.0.0.1:{port}");
    let child = Command::new(exe)
        .args(["teaching-server", "hold-transaction", "--listen", &listen])
        .args(["--database-url", db_url, "--acquirer-url", sim_url])
        .args(["--acquirer-timeout", timeout, "--db-max-connections", pool])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting idem-lab teaching-server")?;
    started.children.push(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(&listen).await.is_err() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the teaching server at {listen} did not start"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Ok(format!("http://{listen}"))
}

/// Counts, every [`DB_SAMPLE_EVERY`], the connections to the bench's
/// database that are not idle (working, or idle in a transaction: held
/// either way); PostgreSQL only.
struct DbSampler {
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<u64>>,
}

impl DbSampler {
    async fn start(db_url: &str) -> anyhow::Result<Self> {
        let stop = CancellationToken::new();
        let postgres =
            idem_core::store::Backend::of_url(db_url)? == idem_core::store::Backend::Postgres;
        let task = if postgres {
            let mut conn = sqlx::PgConnection::connect(db_url).await?;
            let stop = stop.clone();
            Some(tokio::spawn(async move {
                let mut most = 0u64;
                let mut tick = tokio::time::interval(DB_SAMPLE_EVERY);
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tick.tick() => {}
                    }
                    let busy: Result<i64, _> = sqlx::query_scalar(
                        "select count(*) from pg_stat_activity
                          where datname = current_database() and pid <> pg_backend_pid()
                            and state <> 'idle'",
                    )
                    .fetch_one(&mut conn)
                    .await;
                    if let Ok(busy) = busy {
                        most = most.max(u64::try_from(busy).unwrap_or(0));
                    }
                }
                most
            }))
        } else {
            None
        };
        Ok(Self { stop, task })
    }

    async fn stop(self) -> Option<u64> {
        self.stop.cancel();
        self.task?.await.ok()
    }
}

/// The open-model load generator: a schedule, a pool of hand-driven
/// connections, and what each intent came to.
struct Load {
    url: String,
    secret: String,
    watch: Watch,
    idle: Mutex<Vec<Connection>>,
    connections: Semaphore,
    in_flight: AtomicU64,
    most_in_flight: AtomicU64,
}

/// One request: when it was due, its answer's label, its end-to-end time and
/// the acquirer's part of it.
struct Sample {
    due: Instant,
    answered: Instant,
    label: String,
    e2e: Duration,
    acquirer: Duration,
}

/// What one intent (one key, one order) came to.
struct Intent {
    order: i64,
    /// Its final status, if it had one before the run ended.
    last: Option<u16>,
    samples: Vec<Sample>,
}

/// Every intent of one run, and the window they were measured in.
struct Measured {
    window: (Instant, Instant),
    intents: Vec<Intent>,
    most_in_flight: u64,
}

impl Load {
    fn new(url: String, secret: String, watch: Watch, config: &ArrivalConfig) -> Arc<Self> {
        Arc::new(Self {
            url,
            secret,
            watch,
            idle: Mutex::new(Vec::new()),
            connections: Semaphore::new(config.connections.max(1)),
            in_flight: AtomicU64::new(0),
            most_in_flight: AtomicU64::new(0),
        })
    }

    /// Sends intents at `rate` per second for the warm-up and `duration`,
    /// each at its own scheduled time whatever the earlier ones take, then
    /// waits (at most [`DRAIN`]) for them to settle.
    async fn drive(self: Arc<Self>, rate: u32, duration: Duration) -> anyhow::Result<Measured> {
        let origin = Instant::now();
        let window = (origin + WARM_UP, origin + WARM_UP + duration);
        let deadline = window.1 + DRAIN;
        let every = Duration::from_secs(1) / rate;
        let mut tasks = Vec::new();
        for n in 0u32.. {
            let due = origin + every * n;
            if due >= window.1 {
                break;
            }
            tokio::time::sleep_until(due.into()).await;
            let load = self.clone();
            let order = i64::from(n) + 1;
            tasks.push(tokio::spawn(async move {
                load.intent(order, due, deadline).await
            }));
        }
        let mut intents = Vec::with_capacity(tasks.len());
        for task in tasks {
            intents.push(task.await?);
        }
        Ok(Measured {
            window,
            intents,
            most_in_flight: self.most_in_flight.load(Ordering::Relaxed),
        })
    }

    /// One charge: its first request at `due`, and retries with the same key
    /// after a `503`, a `409` or a transport error, until a final answer or
    /// the deadline.
    async fn intent(&self, order: i64, due: Instant, deadline: Instant) -> Intent {
        let key = format!("open-{order}");
        let mut samples = Vec::new();
        let mut due = due;
        loop {
            let before = self.watch.acquirer_time(order);
            let answer = tokio::time::timeout_at(deadline.into(), self.send(&key, order)).await;
            let answered = Instant::now();
            let mut sample = Sample {
                due,
                answered,
                label: String::new(),
                e2e: answered.saturating_duration_since(due),
                acquirer: self.watch.acquirer_time(order).saturating_sub(before),
            };
            let pause = match answer {
                Err(_) => {
                    sample.label = "unanswered".into();
                    samples.push(sample);
                    return Intent {
                        order,
                        last: None,
                        samples,
                    };
                }
                Ok(Err(_)) => {
                    sample.label = "transport error".into();
                    DEFAULT_RETRY_PAUSE
                }
                Ok(Ok(answer)) => {
                    sample.label = match &answer.problem {
                        Some(problem) => format!("{} {problem}", answer.status),
                        None => answer.status.to_string(),
                    };
                    if !matches!(answer.status, 409 | 429 | 500..=599) {
                        samples.push(sample);
                        return Intent {
                            order,
                            last: Some(answer.status),
                            samples,
                        };
                    }
                    answer
                        .retry_after
                        .unwrap_or(DEFAULT_RETRY_PAUSE)
                        .min(MAX_RETRY_PAUSE)
                }
            };
            samples.push(sample);
            if Instant::now() + pause >= deadline {
                return Intent {
                    order,
                    last: None,
                    samples,
                };
            }
            tokio::time::sleep(pause).await;
            due = Instant::now();
        }
    }

    /// One request on a free connection (waiting for one if all are busy;
    /// opening one if none is idle).
    async fn send(&self, key: &str, order: i64) -> anyhow::Result<super::Answer> {
        let _permit = self.connections.acquire().await?;
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut conn = match idle {
            Some(conn) => conn,
            None => Connection::open(&self.url, &self.secret).await?,
        };
        let in_flight = InFlight::enter(self);
        let answer = conn.exchange(key, usize::try_from(order - 1)?).await;
        drop(in_flight);
        if answer.is_ok() {
            self.idle
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(conn);
        }
        answer
    }
}

/// A request sent and not yet answered (or given up: dropped with it).
struct InFlight<'a>(&'a AtomicU64);

impl<'a> InFlight<'a> {
    fn enter(load: &'a Load) -> Self {
        let now = load.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        load.most_in_flight.fetch_max(now, Ordering::Relaxed);
        Self(&load.in_flight)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Measured {
    /// The run's figures, its intents checked against the ledger.
    fn row(
        &self,
        server: Server,
        rate: u32,
        duration: Duration,
        ledger: &Ledger,
        watch: &Watch,
        most_db_busy: Option<u64>,
    ) -> ArrivalRow {
        let mut captures: HashMap<i64, u64> = HashMap::new();
        for c in &ledger.captures {
            *captures.entry(c.order_id).or_insert(0) += 1;
        }
        let mut e2e = histogram();
        let mut share = histogram();
        let mut statuses = BTreeMap::new();
        let (mut requests, mut answered_in_window) = (0u64, 0u64);
        let (mut unsettled, mut not_captured_once) = (0u64, 0u64);
        let (from, to) = self.window;
        for intent in &self.intents {
            let captured = captures.get(&intent.order).copied().unwrap_or(0);
            if captured > 1 || (intent.last == Some(201) && captured != 1) {
                not_captured_once += 1;
            }
            if intent.last.is_none() {
                unsettled += 1;
            }
            for s in &intent.samples {
                if s.answered >= from && s.answered < to && s.label != "unanswered" {
                    answered_in_window += 1;
                }
                if s.due < from || s.due >= to {
                    continue;
                }
                requests += 1;
                *statuses.entry(s.label.clone()).or_insert(0) += 1;
                let _ = e2e.record(micros(s.e2e));
                let _ = share.record(micros(s.e2e.saturating_sub(s.acquirer)));
            }
        }
        let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        let share_p99_ms = ms(&share, 0.99);
        let served = requests > 0
            && statuses
                .keys()
                .all(|label| SERVED_ANSWERS.contains(&label.as_str()))
            && share_p99_ms < SHARE_P99_TARGET_MS;
        ArrivalRow {
            server,
            offered_per_s: rate,
            achieved_per_s: answered_in_window as f64 / duration.as_secs_f64(),
            requests,
            statuses,
            p50_ms: ms(&e2e, 0.5),
            p99_ms: ms(&e2e, 0.99),
            p999_ms: ms(&e2e, 0.999),
            share_p50_ms: ms(&share, 0.5),
            share_p99_ms,
            share_p999_ms: ms(&share, 0.999),
            most_in_flight: self.most_in_flight,
            most_db_busy,
            intents: self.intents.len() as u64,
            unsettled,
            not_captured_once,
            faults_injected: watch.random_faults(),
            claim_batch_rows: None,
            finalize_batch_rows: None,
            served,
        }
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new(3).unwrap_or_else(|_| unreachable!("3 significant figures is valid"))
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// The rows as a text table.
pub fn table(report: &ArrivalReport) -> String {
    let mut out = String::from(
        "server            offered  answered/s  p50 ms  p99 ms  p99.9 ms  share p50  share p99  \
         in flight  db busy  rows/batch  faults  not once  unsettled  served  answers\n",
    );
    for r in &report.rows {
        let answers: Vec<String> = r
            .statuses
            .iter()
            .map(|(s, n)| format!("{s}: {n}"))
            .collect();
        let _ = writeln!(
            out,
            "{:<16} {:>8} {:>11.0} {:>7.1} {:>7.1} {:>9.1} {:>10.1} {:>10.1} {:>10} {:>8} {:>11} {:>7} {:>9} {:>10} {:>7}  {}",
            r.server.name(),
            r.offered_per_s,
            r.achieved_per_s,
            r.p50_ms,
            r.p99_ms,
            r.p999_ms,
            r.share_p50_ms,
            r.share_p99_ms,
            r.most_in_flight,
            r.most_db_busy.map_or_else(|| "-".to_owned(), |n| n.to_string()),
            r.claim_batch_rows.map_or_else(|| "-".to_owned(), |n| format!("{n:.1}")),
            r.faults_injected,
            r.not_captured_once,
            r.unsettled,
            if r.served { "yes" } else { "no" },
            answers.join(", "),
        );
    }
    let knee =
        |k: Option<u32>| k.map_or_else(|| "none of the rates".to_owned(), |k| format!("{k}/s"));
    let _ = writeln!(
        out,
        "knee (share p99 < {SHARE_P99_TARGET_MS} ms, no answer but 201, 402 and the faults' \
         503s and 409s): idem {}{}",
        knee(report.knee_per_s),
        if report
            .rows
            .iter()
            .any(|r| r.server == Server::HoldTransaction)
        {
            format!(
                ", hold-transaction {}",
                knee(report.hold_transaction_knee_per_s)
            )
        } else {
            String::new()
        }
    );
    out
}

const COLOURS: [(Server, &str); 2] = [
    (Server::Idem, "#1f6feb"),
    (Server::HoldTransaction, "#d1242f"),
];

/// The page: answered against offered, the server's share and the
/// end-to-end p99 against the rate, and the table.
fn html(report: &ArrivalReport) -> String {
    let rates: Vec<u32> = {
        let mut r: Vec<u32> = report.rows.iter().map(|r| r.offered_per_s).collect();
        r.sort_unstable();
        r.dedup();
        r
    };
    let panel =
        |title: &str, log_y: bool, rule: Option<(f64, &str)>, y: &dyn Fn(&ArrivalRow) -> f64| {
            let series: Vec<Series> = COLOURS
                .iter()
                .map(|(server, colour)| Series {
                    name: server.name(),
                    colour,
                    points: report
                        .rows
                        .iter()
                        .filter(|r| r.server == *server)
                        .map(|r| (f64::from(r.offered_per_s), y(r)))
                        .collect(),
                })
                .collect();
            chart::panel(
                &Axes {
                    title,
                    x_label: "charges offered per second",
                    x_ticks: rates
                        .iter()
                        .map(|r| (f64::from(*r), r.to_string()))
                        .collect(),
                    log_y,
                    rule,
                },
                &series,
            )
        };
    let answered = panel("Answered per second", false, None, &|r| r.achieved_per_s);
    let target = format!("{SHARE_P99_TARGET_MS} ms");
    let share = panel(
        "Server's own share, p99 (ms, log)",
        true,
        Some((SHARE_P99_TARGET_MS, &target)),
        &|r| r.share_p99_ms,
    );
    let e2e = panel("End to end, p99 (ms, log)", true, None, &|r| r.p99_ms);
    let title = format!(
        "idem-lab bench --arrival: acquirer p50 {} ms, p99 {} ms, {:.1}% faults, {} database \
         connections, {} s per rate",
        report.latency.p50.as_millis(),
        report.latency.p99.as_millis(),
        report.fault_rate * 100.0,
        report.db_connections,
        report.seconds_per_rate,
    );
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>{title}</title>\
         <style>body{{font:14px system-ui,sans-serif;margin:2em;color:#1f2328}}\
         svg{{margin:0 1em 1em 0}}pre{{background:#f6f8fa;padding:1em;overflow-x:auto}}</style>\
         </head><body><h1>{title}</h1>\
         <p>New charges arrive at a constant rate whatever the answers take; each request's \
         latency runs from its scheduled time. <b>Share</b>: end-to-end less the simulated \
         acquirer's time for that request. <b>hold-transaction</b>: the article's second \
         wrong answer, holding its database connection across the acquirer call. A rate is \
         <i>served</i> when the share's p99 stays under {target} and no answer is other than \
         201, 402 or what the injected faults make (a 503, or a 409 when the retry meets the \
         reconciler); the knee is the highest served rate.</p>\
         {answered}{share}{e2e}<pre>{}</pre></body></html>\n",
        table(report)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latency_reads_as_two_percentiles_and_refuses_nonsense() {
        let l: AcquirerLatency = "p50=120ms,p99=380ms".parse().expect("parses");
        assert_eq!(
            (l.p50, l.p99),
            (Duration::from_millis(120), Duration::from_millis(380))
        );
        let fixed: AcquirerLatency = "p50=5ms".parse().expect("a p50 alone");
        assert_eq!(fixed.p99, fixed.p50);
        for bad in [
            "p50=380ms,p99=120ms",
            "p99=10ms",
            "p50=0ms",
            "p90=1ms",
            "120ms",
        ] {
            assert!(bad.parse::<AcquirerLatency>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_chance_reads_as_a_percentage_or_a_fraction() {
        let close = |s: &str, want: f64| (parse_chance(s).expect(s) - want).abs() < 1e-12;
        assert!(close("0.7%", 0.007));
        assert_eq!(parse_chance("0.007"), Ok(0.007));
        assert_eq!(parse_chance("0"), Ok(0.0));
        for bad in ["101%", "1.5", "-1%", "x"] {
            assert!(parse_chance(bad).is_err(), "{bad}");
        }
    }

    fn sample(due: Instant, label: &str, e2e_ms: u64, acquirer_ms: u64) -> Sample {
        Sample {
            due,
            answered: due + Duration::from_millis(e2e_ms),
            label: label.into(),
            e2e: Duration::from_millis(e2e_ms),
            acquirer: Duration::from_millis(acquirer_ms),
        }
    }

    /// A window of two seconds with intents in it: the share is the time the
    /// acquirer did not account for, and the ledger is checked per intent.
    fn measured(samples: Vec<(i64, Option<u16>, &str, u64, u64)>) -> Measured {
        let from = Instant::now();
        Measured {
            window: (from, from + Duration::from_secs(2)),
            intents: samples
                .into_iter()
                .map(|(order, last, label, e2e, acquirer)| Intent {
                    order,
                    last,
                    samples: vec![sample(from, label, e2e, acquirer)],
                })
                .collect(),
            most_in_flight: 3,
        }
    }

    fn ledger(orders: &[i64]) -> Ledger {
        serde_json::from_value(serde_json::json!({
            "captures": orders.iter().map(|o| serde_json::json!({
                "capture_id": format!("cap_{o}"), "reference": format!("r{o}"),
                "merchant": "m", "order_id": o, "amount_cents": 1, "currency": "BRL",
            })).collect::<Vec<_>>(),
            "counts": [],
            "declines": 0,
        }))
        .expect("a ledger")
    }

    #[test]
    fn a_rate_is_served_when_the_share_is_small_and_only_faults_failed() {
        let m = measured(vec![
            (1, Some(201), "201", 130, 120),
            (2, Some(201), "503 outcome-unknown", 2010, 2000),
        ]);
        let row = m.row(
            Server::Idem,
            10,
            Duration::from_secs(2),
            &ledger(&[1, 2]),
            &Watch::default(),
            Some(4),
        );
        assert!(row.served, "{row:?}");
        assert_eq!(row.not_captured_once, 0);
        assert!(row.share_p99_ms < 11.0, "{row:?}");
        assert!(row.p99_ms >= 2000.0, "{row:?}");

        // A shed request is not served; neither is a share over the target.
        let shed = measured(vec![(1, None, "503 overloaded", 1, 0)]);
        let row = shed.row(
            Server::Idem,
            10,
            Duration::from_secs(2),
            &ledger(&[]),
            &Watch::default(),
            None,
        );
        assert!(!row.served && row.unsettled == 1, "{row:?}");
        let slow = measured(vec![(1, Some(201), "201", 200, 120)]);
        let row = slow.row(
            Server::Idem,
            10,
            Duration::from_secs(2),
            &ledger(&[1]),
            &Watch::default(),
            None,
        );
        assert!(!row.served, "{row:?}");
    }

    #[test]
    fn an_intent_answered_201_must_be_captured_exactly_once() {
        let m = measured(vec![
            (1, Some(201), "201", 1, 0),
            (2, Some(201), "201", 1, 0),
            (3, Some(402), "402", 1, 0),
        ]);
        // Order 1 twice, order 2 never: both counted; the decline with no
        // capture is right.
        let row = m.row(
            Server::Idem,
            10,
            Duration::from_secs(2),
            &ledger(&[1, 1]),
            &Watch::default(),
            None,
        );
        assert_eq!(row.not_captured_once, 2, "{row:?}");
    }
}

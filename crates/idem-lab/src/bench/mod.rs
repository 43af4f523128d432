//! `idem-lab bench`: load against a deployment it starts (or one given by `--url`),
//! with throughput and latency from a histogram, the server's peak memory, and
//! with `--vs-pgbench` the database's own limit for the same statements.
//!
//! Scenarios:
//! - `new`: every request a new key (claim, acquirer, finalize);
//! - `replay`: the same keys again (one statement: the claim that conflicts
//!   and reads the stored outcome);
//! - `conflict`: duplicates while the first attempts are in flight (409s);
//! - `queue`: new charges as commands through RabbitMQ (`serve --consume`),
//!   publish to result;
//! - `refund`: every request a new refund (claim with its reservation,
//!   acquirer, finalize) of 1 cent, each worker on a captured charge of its
//!   own, as merchants refund different orders.

mod chart;
mod open;
mod pgbench;
mod queue;
mod sweep;

pub use open::{
    arrival, parse_chance, parse_rate, table as arrival_table, AcquirerLatency, ArrivalConfig,
    ArrivalReport, ArrivalRow, Server,
};
pub use sweep::{sweep, table as sweep_table};

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::harness::{fresh_database, remove_scratch_dir, start_idem, Started};
use crate::sim::{self, Faults};

/// Keys the `replay` and `conflict` scenarios cycle through: enough to spread
/// over the index, few enough to create before the clock starts.
const HOT_KEYS: usize = 256;

/// Discarded first seconds: connection pools fill, caches warm.
const WARM_UP: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scenario {
    New,
    Replay,
    Conflict,
    Queue,
    Refund,
}

#[derive(Debug, Clone)]
pub struct BenchConfig {
    pub scenario: Scenario,
    pub concurrency: usize,
    pub duration: Duration,
    /// PostgreSQL to start a deployment on (ignored with `url`).
    pub database_url: String,
    /// A running deployment and its merchant's secret, instead of starting one.
    pub target: Option<(String, String)>,
    pub vs_pgbench: bool,
    /// RabbitMQ for the `queue` scenario.
    pub amqp_url: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchResult {
    pub scenario: Scenario,
    pub concurrency: usize,
    pub seconds: f64,
    pub requests: u64,
    pub per_second: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub statuses: BTreeMap<u16, u64>,
    pub errors: u64,
    /// Peak resident memory of the `serve` process (started deployments only).
    pub server_peak_rss_mib: Option<f64>,
    /// pgbench's transactions per second for the same statements.
    pub pgbench_per_second: Option<f64>,
    /// pgbench's 99th percentile latency, from its per-transaction log.
    pub pgbench_p99_ms: Option<f64>,
    /// Requests per batch the store sent to the database, on average over the
    /// run, claims and finalizes (started deployments only).
    pub claim_batch_rows: Option<f64>,
    pub finalize_batch_rows: Option<f64>,
    pub ratio_vs_pgbench: Option<f64>,
    /// The queue scenario: publish to the broker's confirm of a command, p50
    /// (part of the command's latency, which runs from publish to result).
    pub publish_confirm_p50_ms: Option<f64>,
}

impl BenchResult {
    pub fn summary(&self) -> String {
        let mut out = format!(
            "scenario {:?}, {} clients, {:.1} s: {} requests, {:.0}/s\n\
             latency p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms\n\
             statuses {:?}, transport errors {}\n",
            self.scenario,
            self.concurrency,
            self.seconds,
            self.requests,
            self.per_second,
            self.p50_ms,
            self.p99_ms,
            self.p999_ms,
            self.statuses,
            self.errors
        );
        if let Some(confirm) = self.publish_confirm_p50_ms {
            out.push_str(&format!(
                "of which publish to the broker's confirm: p50 {confirm:.2} ms\n"
            ));
        }
        if let Some(rss) = self.server_peak_rss_mib {
            out.push_str(&format!("server peak RSS {rss:.1} MiB\n"));
        }
        if let (Some(c), Some(f)) = (self.claim_batch_rows, self.finalize_batch_rows) {
            out.push_str(&format!(
                "requests per batch at the database: claims {c:.1}, finalizes {f:.1}\n"
            ));
        }
        if let (Some(pg), Some(r)) = (self.pgbench_per_second, self.ratio_vs_pgbench) {
            out.push_str(&format!(
                "pgbench, same statements, same clients: {pg:.0}/s; idem/pgbench = {r:.2}\n"
            ));
        }
        out
    }
}

pub async fn run(config: &BenchConfig) -> anyhow::Result<BenchResult> {
    let result = run_bench(config).await;
    remove_scratch_dir();
    result
}

async fn run_bench(config: &BenchConfig) -> anyhow::Result<BenchResult> {
    anyhow::ensure!(
        !config.vs_pgbench
            || idem_core::store::Backend::of_url(&config.database_url)?
                == idem_core::store::Backend::Postgres,
        "--vs-pgbench compares with PostgreSQL's own limit: it needs a postgres:// database URL"
    );
    let mut started = Started {
        children: Vec::new(),
        stop: CancellationToken::new(),
    };
    let (base, secret, db_url) = match &config.target {
        Some((url, secret)) => (url.clone(), secret.clone(), None),
        None => {
            let db_url = fresh_database(&config.database_url, "idem_bench").await?;
            // For `conflict` the first attempts must stay at the acquirer for
            // the whole run; otherwise it answers at once.
            let hold = config.duration + WARM_UP + Duration::from_secs(5);
            let latency = match config.scenario {
                Scenario::Conflict => hold,
                _ => Duration::ZERO,
            };
            let sim_listener = TcpListener::bind("127.0.0.1:0").await?;
            let sim_url = format!("http://{}", sim_listener.local_addr()?);
            let faults = Faults {
                latency_ms: u64::try_from(latency.as_millis())?,
                ..Faults::default()
            };
            tokio::spawn(sim::serve(sim_listener, faults, None, started.stop.clone()));
            let timeout = humantime::format_duration(hold + Duration::from_secs(5)).to_string();
            let lease = humantime::format_duration(hold + Duration::from_secs(30)).to_string();
            // A connection per client, and never fewer than serve takes (2).
            let pool = config.concurrency.max(2).to_string();
            let flags = [
                "--acquirer-timeout",
                &timeout,
                "--lease",
                &lease,
                "--no-workers",
                "--db-max-connections",
                &pool,
            ];
            let mut flags = flags.to_vec();
            let prefetch = config
                .concurrency
                .clamp(1, usize::from(u16::MAX))
                .to_string();
            if config.scenario == Scenario::Queue {
                flags.extend(["--amqp-url", &config.amqp_url, "--consume"]);
                flags.extend(["--prefetch", &prefetch, "--outbox-poll", "50ms"]);
            }
            let (endpoints, secret) =
                start_idem(&db_url, &sim_url, "bench", 1, &flags, &mut started).await?;
            (endpoints[0].clone(), secret, Some(db_url))
        }
    };
    if config.scenario == Scenario::Queue {
        anyhow::ensure!(
            config.target.is_none() && !config.vs_pgbench,
            "the queue scenario runs on a deployment it starts, without --vs-pgbench"
        );
        // The consumer is up once `serve` answers; give it its first connection.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut result = queue::drive(
            &config.amqp_url,
            "bench",
            config.concurrency,
            config.duration,
        )
        .await?;
        result.server_peak_rss_mib = started.children.first().and_then(|c| peak_rss_mib(c.id()));
        return Ok(result);
    }
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(config.concurrency)
        .build()?;
    let load = Load {
        http,
        url: format!("{base}/v1/charges"),
        secret,
        scenario: config.scenario,
        charges: Arc::default(),
    };
    load.prepare().await?;

    let mut result = load.drive(config).await?;
    result.server_peak_rss_mib = started.children.first().and_then(|c| peak_rss_mib(c.id()));
    if config.target.is_none() {
        let metrics = load.http.get(format!("{base}/metrics")).send().await?;
        let metrics = metrics.text().await?;
        // A refund's claim and finalize are batches of their own.
        let (claim, finalize) = match config.scenario {
            Scenario::Refund => ("refund_claim", "refund_finalize"),
            _ => ("claim", "finalize"),
        };
        result.claim_batch_rows = mean_batch_rows(&metrics, claim);
        result.finalize_batch_rows = mean_batch_rows(&metrics, finalize);
    }
    if config.vs_pgbench {
        let db_url = db_url.context("--vs-pgbench needs a deployment it starts (no --url)")?;
        let pgbench = pgbench::run(
            &db_url,
            config.scenario,
            config.concurrency,
            config.duration,
        )
        .await?;
        result.pgbench_per_second = Some(pgbench.per_second);
        result.pgbench_p99_ms = Some(pgbench.p99_ms);
        result.ratio_vs_pgbench = Some(result.per_second / pgbench.per_second);
    }
    drop(started);
    Ok(result)
}

struct Load {
    http: reqwest::Client,
    url: String,
    secret: String,
    scenario: Scenario,
    /// The captured charges the `refund` scenario refunds, one per worker.
    charges: Arc<std::sync::OnceLock<Vec<String>>>,
}

impl Load {
    fn hot_key(i: usize) -> String {
        format!("bench-hot-{i}")
    }

    /// Creates the stored outcomes (`replay`) or the in-flight attempts (`conflict`).
    async fn prepare(&self) -> anyhow::Result<()> {
        match self.scenario {
            Scenario::New | Scenario::Queue => Ok(()),
            Scenario::Refund => {
                let mut charges = Vec::with_capacity(HOT_KEYS);
                for i in 0..HOT_KEYS {
                    let r = self
                        .http
                        .post(&self.url)
                        .bearer_auth(&self.secret)
                        .header("Idempotency-Key", Self::hot_key(i))
                        .header("content-type", "application/json")
                        .body(format!(
                            r#"{{"order_id": {}, "amount_cents": 10000000000}}"#,
                            i + 1
                        ))
                        .send()
                        .await?;
                    anyhow::ensure!(
                        r.status() == 201,
                        "preparing refunds: status {}",
                        r.status()
                    );
                    let charge: serde_json::Value = r.json().await?;
                    let id = charge["id"].as_str().context("a charge's id")?;
                    charges.push(id.to_owned());
                }
                let _ = self.charges.set(charges);
                Ok(())
            }
            Scenario::Replay => {
                for i in 0..HOT_KEYS {
                    let status = self.send(&Self::hot_key(i), i).await?;
                    anyhow::ensure!(status == 201, "preparing replays: status {status}");
                }
                Ok(())
            }
            Scenario::Conflict => {
                // Fire and forget: these stay at the acquirer for the whole run.
                for i in 0..HOT_KEYS {
                    let (http, url, secret) =
                        (self.http.clone(), self.url.clone(), self.secret.clone());
                    tokio::spawn(async move {
                        let _ = http
                            .post(url)
                            .bearer_auth(secret)
                            .header("Idempotency-Key", Self::hot_key(i))
                            .header("content-type", "application/json")
                            .body(body(i))
                            .send()
                            .await;
                    });
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
                // Make sure every key is claimed before the clock starts: a probe
                // answers 409 at once, or (if its first request has not arrived yet)
                // claims the key itself and is left in flight by the timeout.
                for i in 0..HOT_KEYS {
                    let _ = self
                        .http
                        .post(&self.url)
                        .timeout(Duration::from_millis(300))
                        .bearer_auth(&self.secret)
                        .header("Idempotency-Key", Self::hot_key(i))
                        .header("content-type", "application/json")
                        .body(body(i))
                        .send()
                        .await;
                }
                Ok(())
            }
        }
    }

    async fn send(&self, key: &str, order: usize) -> anyhow::Result<u16> {
        let r = self
            .http
            .post(&self.url)
            .bearer_auth(&self.secret)
            .header("Idempotency-Key", key)
            .header("content-type", "application/json")
            .body(body(order))
            .send()
            .await?;
        let status = r.status().as_u16();
        r.bytes().await?;
        Ok(status)
    }

    async fn drive(&self, config: &BenchConfig) -> anyhow::Result<BenchResult> {
        let measuring = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..config.concurrency)
            .map(|w| {
                let (load, measuring, stop) =
                    (self.clone_handle(), measuring.clone(), stop.clone());
                tokio::spawn(async move { load.worker(w, &measuring, &stop).await })
            })
            .collect();
        tokio::time::sleep(WARM_UP).await;
        measuring.store(true, Ordering::SeqCst);
        let started = Instant::now();
        tokio::time::sleep(config.duration).await;
        stop.store(true, Ordering::SeqCst);
        let seconds = started.elapsed().as_secs_f64();
        let mut parts = Vec::with_capacity(workers.len());
        for w in workers {
            parts.push(w.await??);
        }
        combine(config.scenario, config.concurrency, seconds, parts)
    }

    fn clone_handle(&self) -> Load {
        Load {
            http: self.http.clone(),
            url: self.url.clone(),
            secret: self.secret.clone(),
            scenario: self.scenario,
            charges: self.charges.clone(),
        }
    }

    async fn worker(
        &self,
        w: usize,
        measuring: &AtomicBool,
        stop: &AtomicBool,
    ) -> anyhow::Result<Part> {
        let mut conn = Connection::open(&self.url, &self.secret).await?;
        if let Some(charges) = self.charges.get() {
            let charge = &charges[w % charges.len()];
            let base = conn.path.trim_end_matches("/v1/charges").to_owned();
            conn.path = format!("{base}/v1/charges/{charge}/refunds");
        }
        let mut part = Part::new()?;
        let mut i = 0usize;
        while !stop.load(Ordering::Relaxed) {
            i += 1;
            let (key, order) = match self.scenario {
                Scenario::New | Scenario::Queue | Scenario::Refund => (format!("bench-{w}-{i}"), i),
                // The hot key's own body, so the request is the same one.
                Scenario::Replay | Scenario::Conflict => {
                    let n = (w * 7919 + i) % HOT_KEYS;
                    (Self::hot_key(n), n)
                }
            };
            let sent = Instant::now();
            let status = conn.send(&key, order).await;
            if measuring.load(Ordering::Relaxed) {
                part.record(sent, status)?;
            }
        }
        Ok(part)
    }
}

/// One keep-alive HTTP/1 connection driven by hand: the load generator shares
/// the machine's cores with the server and PostgreSQL, so it should cost as
/// little CPU per request as it can (reqwest's pool and redirect machinery cost
/// about as much CPU as the server's whole request path).
pub(super) struct Connection {
    sender: hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>,
    path: String,
    host: String,
    authorization: String,
}

impl Connection {
    pub(super) async fn open(url: &str, secret: &str) -> anyhow::Result<Self> {
        let parsed = reqwest::Url::parse(url)?;
        let host = format!(
            "{}:{}",
            parsed.host_str().context("the URL has no host")?,
            parsed.port_or_known_default().unwrap_or(80)
        );
        let stream = tokio::net::TcpStream::connect(&host).await?;
        stream.set_nodelay(true)?;
        let (sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        Ok(Self {
            sender,
            path: parsed.path().to_owned(),
            host,
            authorization: format!("Bearer {secret}"),
        })
    }

    async fn send(&mut self, key: &str, order: usize) -> anyhow::Result<u16> {
        Ok(self.exchange(key, order).await?.status)
    }

    /// One request and its whole answer: the status, and for an error its
    /// problem type and `Retry-After`.
    pub(super) async fn exchange(&mut self, key: &str, order: usize) -> anyhow::Result<Answer> {
        use http_body_util::BodyExt;
        self.sender.ready().await?;
        let request = axum::http::Request::post(&self.path)
            .header("host", &self.host)
            .header("authorization", &self.authorization)
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from(
                if self.path.ends_with("/refunds") {
                    REFUND_BODY.to_owned()
                } else {
                    body(order)
                },
            )))?;
        let response = self.sender.send_request(request).await?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .map(Duration::from_secs);
        let body = response.into_body().collect().await?.to_bytes();
        let problem = (status >= 400)
            .then(|| serde_json::from_slice::<serde_json::Value>(&body).ok())
            .flatten()
            .and_then(|p| {
                Some(
                    p.get("type")?
                        .as_str()?
                        .rsplit([':', '/'])
                        .next()?
                        .to_owned(),
                )
            });
        Ok(Answer {
            status,
            problem,
            retry_after,
        })
    }
}

/// What a server answered one request.
pub(super) struct Answer {
    pub(super) status: u16,
    /// The last segment of a problem+json error's `type` (`outcome-unknown`).
    pub(super) problem: Option<String>,
    pub(super) retry_after: Option<Duration>,
}

/// What one load worker measured.
struct Part {
    histogram: Histogram<u64>,
    statuses: BTreeMap<u16, u64>,
    errors: u64,
    /// The queue scenario's publish-to-confirm times.
    confirms: Histogram<u64>,
}

impl Part {
    fn new() -> anyhow::Result<Self> {
        Ok(Self {
            histogram: Histogram::new(3)?,
            statuses: BTreeMap::new(),
            errors: 0,
            confirms: Histogram::new(3)?,
        })
    }

    /// One request sent at `sent`: its latency and status, or an error.
    fn record<E>(&mut self, sent: Instant, status: Result<u16, E>) -> anyhow::Result<()> {
        let micros = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
        match status {
            Ok(s) => {
                self.histogram.record(micros.max(1))?;
                *self.statuses.entry(s).or_insert(0) += 1;
            }
            Err(_) => self.errors += 1,
        }
        Ok(())
    }
}

/// The workers' figures as one result.
fn combine(
    scenario: Scenario,
    concurrency: usize,
    seconds: f64,
    parts: Vec<Part>,
) -> anyhow::Result<BenchResult> {
    let mut histogram = Histogram::<u64>::new(3)?;
    let mut statuses = BTreeMap::new();
    let mut errors = 0;
    let mut confirms = Histogram::<u64>::new(3)?;
    for part in parts {
        histogram.add(&part.histogram)?;
        confirms.add(&part.confirms)?;
        for (s, n) in part.statuses {
            *statuses.entry(s).or_insert(0) += n;
        }
        errors += part.errors;
    }
    let ms = |q: f64| histogram.value_at_quantile(q) as f64 / 1000.0;
    let requests = histogram.len();
    Ok(BenchResult {
        scenario,
        concurrency,
        seconds,
        requests,
        per_second: requests as f64 / seconds,
        p50_ms: ms(0.50),
        p99_ms: ms(0.99),
        p999_ms: ms(0.999),
        statuses,
        errors,
        server_peak_rss_mib: None,
        pgbench_per_second: None,
        pgbench_p99_ms: None,
        claim_batch_rows: None,
        finalize_batch_rows: None,
        ratio_vs_pgbench: None,
        publish_confirm_p50_ms: (!confirms.is_empty())
            .then(|| confirms.value_at_quantile(0.5) as f64 / 1000.0),
    })
}

/// What each request of the `refund` scenario gives back.
const REFUND_BODY: &str = r#"{"amount_cents": 1}"#;

fn body(order: usize) -> String {
    format!(r#"{{"order_id": {}, "amount_cents": 25000}}"#, order + 1)
}

/// The mean of `idem_store_batch_rows` for `op`, from Prometheus text.
pub(super) fn mean_batch_rows(metrics: &str, op: &str) -> Option<f64> {
    let value = |suffix: &str| {
        let prefix = format!(
            "{}_{suffix}{{op=\"{op}\"}} ",
            idem_core::metrics::STORE_BATCH_ROWS
        );
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    let (sum, count) = (value("sum")?, value("count")?);
    (count > 0.0).then(|| sum / count)
}

/// `VmHWM` of a process: the most resident memory it ever had.
fn peak_rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

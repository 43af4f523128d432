//! `idem-lab verify`: the promise checked against any deployment, from outside.
//!
//! A run makes intents (keys, order ids and descriptions carry its id), sends
//! them the way real clients do while faults run ([`workload`], [`faults`]),
//! refunds some of the charges they capture the same way, captures in parts
//! and voids some it only authorized, records every request and answer
//! ([`history`]), keeps retrying the unsettled ones once the faults stop,
//! replays the settled ones late, then reads the acquirer's ledger (its
//! captures and refunds, its authorizations, their captures and voids) and
//! judges twelve invariants on the history and the ledger alone
//! ([`invariants`]). [`report`] says the verdicts, with a
//! counterexample for each broken one. docs/verify.md is the operator's guide.

mod client;
mod faults;
pub mod history;
pub mod invariants;
mod report;
mod workload;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::progress::{self, Progress};
use crate::sim::{
    Ledger, LedgerAuthorization, LedgerAuthorizationCapture, LedgerCapture, LedgerRefund,
    LedgerVoid,
};
use client::Client;
use history::History;
use invariants::{Evidence, Verdict};

pub use report::Report;

/// The path of the simulator's ledger, whose base URL also serves `/_sim/faults`.
const SIM_LEDGER_PATH: &str = "/_sim/ledger";

/// What to verify, and how hard.
#[derive(Debug, Clone)]
pub struct VerifyConfig {
    /// The deployment's base URLs (instances, or load balancers).
    pub urls: Vec<String>,
    /// A live secret of the merchant the run charges as.
    pub secret: String,
    /// The acquirer's captures and refunds (and authorizations, their
    /// captures and voids), in the simulator's `/_sim/ledger` format.
    pub ledger_url: String,
    /// Charge even when the ledger is not the simulator's.
    pub allow_real_charges: bool,
    pub intents: usize,
    /// Intents sent at once.
    pub concurrency: usize,
    /// A client's per-attempt timeout, after which it retries on the next URL.
    pub client_timeout: Duration,
    /// Copies in each burst.
    pub duplicates: usize,
    /// A shell command run every `fault_every` while the workload runs.
    pub fault_cmd: Option<String>,
    pub fault_every: Duration,
    /// Script the simulator's faults (when the ledger is the simulator's).
    pub sim_faults: bool,
    /// How long unsettled intents are retried once the faults stop.
    pub settle_within: Duration,
    /// The `409` answers' p99 must be under this.
    pub in_flight_p99: Duration,
}

/// A finished run: the verdicts and what they were judged on.
pub struct Outcome {
    pub report: Report,
    pub history: History,
    pub ledger: Ledger,
    /// When the ledger was read, on the run's clock (ms).
    pub ledger_read_ms: f64,
}

impl Outcome {
    /// The run's captures, on the run's clock (ms), when the ledger has times.
    pub fn captures(&self) -> Vec<(&LedgerCapture, Option<f64>)> {
        runs_captures(&self.ledger, self.report.run_id)
            .map(|c| (c, self.on_runs_clock(c.at_micros)))
            .collect()
    }

    /// The refunds of the run's captures, on the run's clock (ms), when the
    /// ledger has times.
    pub fn refunds(&self) -> Vec<(&LedgerRefund, Option<f64>)> {
        let captures: Vec<&LedgerCapture> =
            runs_captures(&self.ledger, self.report.run_id).collect();
        runs_refunds(&self.ledger, &captures)
            .map(|r| (r, self.on_runs_clock(r.at_micros)))
            .collect()
    }

    /// The run's authorizations, on the run's clock (ms), when the ledger
    /// has times.
    pub fn authorizations(&self) -> Vec<(&LedgerAuthorization, Option<f64>)> {
        runs_authorizations(&self.ledger, self.report.run_id)
            .map(|a| (a, self.on_runs_clock(a.at_micros)))
            .collect()
    }

    /// The captures of the run's authorizations, on the run's clock (ms),
    /// when the ledger has times.
    pub fn authorization_captures(&self) -> Vec<(&LedgerAuthorizationCapture, Option<f64>)> {
        let authorizations = runs_authorization_references(&self.ledger, self.report.run_id);
        self.ledger
            .authorization_captures
            .iter()
            .filter(|c| authorizations.contains(c.authorization_reference.as_str()))
            .map(|c| (c, self.on_runs_clock(c.at_micros)))
            .collect()
    }

    /// The voids of the run's authorizations, on the run's clock (ms), when
    /// the ledger has times.
    pub fn voids(&self) -> Vec<(&LedgerVoid, Option<f64>)> {
        let authorizations = runs_authorization_references(&self.ledger, self.report.run_id);
        self.ledger
            .voids
            .iter()
            .filter(|v| authorizations.contains(v.authorization_reference.as_str()))
            .map(|v| (v, self.on_runs_clock(v.at_micros)))
            .collect()
    }

    /// A time on the acquirer's clock (µs since it started) on the run's (ms).
    fn on_runs_clock(&self, at_micros: u64) -> Option<f64> {
        (self.ledger.now_micros > 0).then(|| {
            let ago_ms = self.ledger.now_micros.saturating_sub(at_micros) as f64 / 1000.0;
            self.ledger_read_ms - ago_ms
        })
    }

    pub fn write_html(&self, path: &std::path::Path) -> anyhow::Result<()> {
        report::write_html(self, path)
    }

    /// The verdicts for a terminal, with counterexamples.
    pub fn text(&self) -> String {
        report::text(self)
    }
}

/// Runs the workload against the deployment and judges it. An error means the
/// run could not be made (nothing was judged); broken invariants are in the
/// report.
pub async fn run(config: &VerifyConfig, shutdown: CancellationToken) -> anyhow::Result<Outcome> {
    anyhow::ensure!(
        (1..=workload::MAX_INTENTS).contains(&config.intents),
        "--intents must be 1 to {}",
        workload::MAX_INTENTS
    );
    let run_id = workload::new_run_id();
    let client = Arc::new(Client::new(
        config.urls.clone(),
        config.secret.clone(),
        config.client_timeout,
    )?);
    let ledger = read_ledger(&config.ledger_url).await?;
    if !ledger.simulated && !config.allow_real_charges {
        anyhow::bail!(
            "the ledger at {} is not idem-lab's simulator (it does not say \"simulated\": true): \
             this run would charge a real acquirer {} times or more. If that acquirer is a \
             sandbox whose charges move no money, say so with --allow-real-charges",
            config.ledger_url,
            config.intents
        );
    }
    let sim = (ledger.simulated && config.sim_faults)
        .then(|| config.ledger_url.strip_suffix(SIM_LEDGER_PATH))
        .flatten()
        .map(str::to_owned);
    preflight(&client, run_id).await?;
    eprintln!(
        "idem-lab verify: run {run_id}, {} intents against {} URL(s); ledger {}{}",
        config.intents,
        client.instances(),
        config.ledger_url,
        if ledger.simulated {
            " (the simulator)"
        } else {
            " (not the simulator: --allow-real-charges)"
        }
    );
    let started = Instant::now();
    let driver = faults::Driver::start(
        config.fault_cmd.clone(),
        config.fault_every,
        sim,
        config.client_timeout,
        client.clone(),
    )
    .await
    .context("starting the simulator's fault script")?;
    let work = work(config, run_id, &client, driver);
    let (history, report_parts) = tokio::select! {
        r = work => r?,
        _ = shutdown.cancelled() => anyhow::bail!(
            "interrupted; the simulator's faults were not put back (PUT /_sim/faults to reset them)"
        ),
    };
    let ledger_read_ms = client.now_ms();
    let ledger = read_ledger(&config.ledger_url).await?;
    let captures: Vec<&LedgerCapture> = runs_captures(&ledger, run_id).collect();
    let refunds: Vec<LedgerRefund> = runs_refunds(&ledger, &captures).cloned().collect();
    let captures: Vec<LedgerCapture> = captures.into_iter().cloned().collect();
    let authorizations: Vec<LedgerAuthorization> =
        runs_authorizations(&ledger, run_id).cloned().collect();
    let references = runs_authorization_references(&ledger, run_id);
    let authorization_captures: Vec<LedgerAuthorizationCapture> = ledger
        .authorization_captures
        .iter()
        .filter(|c| references.contains(c.authorization_reference.as_str()))
        .cloned()
        .collect();
    let voids: Vec<LedgerVoid> = ledger
        .voids
        .iter()
        .filter(|v| references.contains(v.authorization_reference.as_str()))
        .cloned()
        .collect();
    let verdicts = invariants::judge(&Evidence {
        history: &history,
        captures: &captures,
        refunds: &refunds,
        authorizations: &authorizations,
        authorization_captures: &authorization_captures,
        voids: &voids,
        in_flight_p99: config.in_flight_p99,
    });
    let report = Report::new(
        run_id,
        config,
        &history,
        &verdicts,
        report_parts,
        started.elapsed(),
    );
    Ok(Outcome {
        report,
        history,
        ledger,
        ledger_read_ms,
    })
}

/// What the phases learnt beside the history.
#[derive(Debug, Clone, Copy, Default)]
pub struct Phases {
    pub unsettled_after_workload: usize,
    pub settled_later: usize,
    pub late_replays: usize,
    pub settle_seconds: f64,
}

/// The workload under faults, the settle phase, the late replays.
async fn work(
    config: &VerifyConfig,
    run_id: u64,
    client: &Arc<Client>,
    driver: faults::Driver,
) -> anyhow::Result<(History, Phases)> {
    let intents = workload::intents(run_id, config.intents, config.duplicates);
    let done = Arc::new(AtomicUsize::new(0));
    let bar = Progress::start("verify", config.intents);
    let ticker = CancellationToken::new();
    if bar.is_live() {
        tokio::spawn(progress::follow(
            bar.clone(),
            done.clone(),
            config.ledger_url.clone(),
            move |c| workload::is_runs(run_id, c.order_id),
            ticker.clone(),
        ));
    }
    let mut progress = workload::run(
        client,
        &intents,
        config.concurrency,
        config.duplicates,
        workload::workload_patience(config.client_timeout),
        &done,
    )
    .await;
    ticker.cancel();
    let faults = driver
        .stop()
        .await
        .context("putting the simulator's faults back")?;
    let unsettled = progress
        .iter()
        .filter(|p| p.sent && p.settled_on.is_none())
        .count();
    let captured = read_ledger(&config.ledger_url)
        .await
        .map_or(0, |l| runs_captures(&l, run_id).count());
    bar.finish(done.load(Ordering::SeqCst), captured);
    let settle_start = Instant::now();
    let settled_later = workload::settle(
        client,
        &intents,
        &mut progress,
        config.concurrency,
        settle_start + config.settle_within,
    )
    .await;
    let settle_seconds = settle_start.elapsed().as_secs_f64();
    if unsettled > 0 {
        eprintln!(
            "settle: {settled_later} of the {unsettled} intents without a final answer settled in {settle_seconds:.1} s"
        );
    }
    let late_replays = workload::replay(client, &intents, &progress, config.concurrency).await;
    let history = History {
        run: run_id.to_string(),
        intents,
        requests: client.take_log(),
        faults,
    };
    Ok((
        history,
        Phases {
            unsettled_after_workload: unsettled,
            settled_later,
            late_replays,
            settle_seconds,
        },
    ))
}

/// The captures in `ledger` of the run `run` (by their order ids).
fn runs_captures(ledger: &Ledger, run: u64) -> impl Iterator<Item = &LedgerCapture> {
    ledger
        .captures
        .iter()
        .filter(move |c| workload::is_runs(run, c.order_id))
}

/// The authorizations in `ledger` of the run `run` (by their order ids).
fn runs_authorizations(ledger: &Ledger, run: u64) -> impl Iterator<Item = &LedgerAuthorization> {
    ledger
        .authorizations
        .iter()
        .filter(move |a| workload::is_runs(run, a.order_id))
}

/// The references of the run's authorizations: what the captures of them and
/// the voids in the ledger name.
fn runs_authorization_references(ledger: &Ledger, run: u64) -> std::collections::HashSet<&str> {
    runs_authorizations(ledger, run)
        .map(|a| a.reference.as_str())
        .collect()
}

/// The refunds in `ledger` paid back from `captures` (the run's).
fn runs_refunds<'a>(
    ledger: &'a Ledger,
    captures: &[&LedgerCapture],
) -> impl Iterator<Item = &'a LedgerRefund> {
    let references: std::collections::HashSet<String> =
        captures.iter().map(|c| c.reference.clone()).collect();
    ledger
        .refunds
        .iter()
        .filter(move |r| references.contains(&r.capture_reference))
}

async fn read_ledger(url: &str) -> anyhow::Result<Ledger> {
    let response = reqwest::get(url)
        .await
        .with_context(|| format!("reading the ledger at {url}"))?;
    let status = response.status();
    anyhow::ensure!(status.is_success(), "the ledger at {url} answered {status}");
    response.json().await.with_context(|| {
        format!("the ledger at {url} is not in the simulator's format (docs/verify.md#the-ledger)")
    })
}

/// Each URL answers a key read with the secret (`404`: no such key yet), or
/// the run cannot be made.
async fn preflight(client: &Client, run_id: u64) -> anyhow::Result<()> {
    for (instance, url) in client.urls().iter().enumerate() {
        let probe = client
            .probe(instance, &format!("verify-{run_id}-probe"))
            .await;
        match probe.status {
            Some(404) => {}
            Some(401) => anyhow::bail!("{url} refused the secret (401): is it a live secret of an enabled merchant?"),
            Some(status) => anyhow::bail!(
                "{url} answered {status} to GET /v1/idempotency-keys/{{key}} (404 expected): is it idem?"
            ),
            None => anyhow::bail!(
                "{url} did not answer: {}",
                probe.error.unwrap_or_default()
            ),
        }
    }
    Ok(())
}

/// Whether every invariant held.
pub fn all_hold(verdicts: &[Verdict]) -> bool {
    verdicts.iter().all(|v| v.holds)
}

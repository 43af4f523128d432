//! The database's own limit: pgbench running the store's very statements
//! ([`CLAIM_SQL`], [`FINALIZE_SQL`]) at the same concurrency against the same
//! database, prepared as sqlx prepares them.
//!
//! pgbench variables are numbers, so the text parameters become expressions of
//! them (`'pgb-' || :client_id || '-' || :n`); the statements are otherwise the
//! same text the store sends.

use std::time::Duration;

use anyhow::Context;

use super::Scenario;
use idem_core::store::{claim_param_names, finalize_param_names, CLAIM_SQL, FINALIZE_SQL};

/// A claim's or a finalize's parameter, by the name the store gives it, as a
/// pgbench expression; the order comes from the store
/// ([`claim_param_names`], [`finalize_param_names`]). The finalize writes a
/// charge event of about the size the engine writes.
fn expression(name: &str) -> Option<&'static str> {
    Some(match name {
        "merchant_id" => ":merchant",
        "key" => "KEY",
        "fingerprint" => "sha256(convert_to(:n::text, 'UTF8'))",
        "charge_id" => "('ch_pgb' || :client_id || '_' || :n)",
        "lease_ms" => "30000",
        "key_ttl_ms" => "86400000",
        "order_id" => ":n",
        "amount_cents" => "25000",
        "currency" => "'BRL'",
        "description" | "decline_reason" | "traceparent" | "capture_method" => "null::text",
        "reference" => "('ref_pgb' || :client_id || '_' || :n)",
        "attempt" => "1",
        "response_status" => "201",
        "response_body" => "convert_to(repeat('x', 220), 'UTF8')",
        "charge_status" => "'captured'",
        "capture_id" => "'cap'",
        "event_id" => "('evt_pgb' || :client_id || '_' || :n)",
        "event_exchange" => "'idem.events'",
        "event_type" => "'charge.captured'",
        "event_tenant" => "'bench'",
        "event_body" => "convert_to(repeat('x', 330), 'UTF8')",
        "webhook_event_id" => "('evt_pgbw' || :client_id || '_' || :n)",
        "webhook_event_type" => "'charge.captured'",
        "webhook_body" => "convert_to(repeat('x', 330), 'UTF8')",
        _ => return None,
    })
}

/// Replaces each `$N` by the expression for the `N`th of `names`, longest
/// numbers first so `$1` never eats `$11`, and `KEY` by `key`.
fn substitute(sql: &str, names: &[&str], key: &str) -> String {
    let mut out = sql.to_owned();
    for (i, name) in names.iter().enumerate().rev() {
        let arg = expression(name).unwrap_or_else(|| panic!("no pgbench expression for {name}"));
        out = out.replace(&format!("${}", i + 1), &arg.replace("KEY", key));
    }
    // pgbench reads one statement per line unless told otherwise.
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The pgbench script for a scenario.
fn script(scenario: Scenario) -> String {
    match scenario {
        Scenario::New | Scenario::Queue | Scenario::Refund => {
            let key = "('pgb-' || :client_id || '-' || :n)";
            format!(
                "\\set n random(1, 2000000000)\n{};\n{};\n",
                substitute(CLAIM_SQL, &claim_param_names(), key),
                substitute(FINALIZE_SQL, &finalize_param_names(), key)
            )
        }
        // The stored keys idem's run created: the claim conflicts and reads.
        Scenario::Replay | Scenario::Conflict => {
            let key = "('bench-hot-' || :h)";
            format!(
                "\\set n random(1, 2000000000)\n\\set h random(0, {})\n{};\n",
                super::HOT_KEYS - 1,
                substitute(CLAIM_SQL, &claim_param_names(), key)
            )
        }
    }
}

/// What pgbench measured: transactions (scripts) per second, and the 99th
/// percentile of their latency from its per-transaction log.
#[derive(Debug, Clone, Copy)]
pub struct Figures {
    pub per_second: f64,
    pub p99_ms: f64,
}

/// Runs pgbench.
pub async fn run(
    db_url: &str,
    scenario: Scenario,
    clients: usize,
    duration: Duration,
) -> anyhow::Result<Figures> {
    let store = idem_core::store::Store::connect(db_url, 1).await?;
    let merchant = store
        .merchant_by_name("bench")
        .await?
        .context("the bench's merchant is missing")?
        .id;
    // One pgbench at a time per bench process.
    let dir = std::env::temp_dir().join(format!("idem-pgbench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let figures = run_in(&dir, db_url, scenario, clients, duration, merchant).await;
    let _ = std::fs::remove_dir_all(&dir);
    figures
}

async fn run_in(
    dir: &std::path::Path,
    db_url: &str,
    scenario: Scenario,
    clients: usize,
    duration: Duration,
    merchant: i64,
) -> anyhow::Result<Figures> {
    let path = dir.join("script.sql");
    std::fs::write(&path, script(scenario))?;
    let log_prefix = dir.join("log");
    let out = tokio::process::Command::new("pgbench")
        .args(["-n", "-M", "prepared", "-j", "2"])
        .args([
            "-c",
            &clients.to_string(),
            "-T",
            &duration.as_secs().max(1).to_string(),
        ])
        .args(["-D", &format!("merchant={merchant}"), "-l"])
        .arg(format!("--log-prefix={}", log_prefix.display()))
        .arg("-f")
        .arg(&path)
        .arg(db_url)
        .output()
        .await
        .context("running pgbench (install PostgreSQL's client tools)")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(
        out.status.success(),
        "pgbench failed: {}{}",
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    let per_second = stdout
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("no tps in pgbench's output: {stdout}"))?;
    Ok(Figures {
        per_second,
        p99_ms: p99_of_logs(dir)?,
    })
}

/// The 99th percentile of the latencies in pgbench's logs (one file per
/// thread; the third field of a line is the transaction's latency in µs).
fn p99_of_logs(dir: &std::path::Path) -> anyhow::Result<f64> {
    let mut histogram = hdrhistogram::Histogram::<u64>::new(3)?;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if !path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("log"))
        {
            continue;
        }
        for line in std::fs::read_to_string(&path)?.lines() {
            if let Some(micros) = line
                .split_whitespace()
                .nth(2)
                .and_then(|f| f.parse::<u64>().ok())
            {
                histogram.record(micros.max(1))?;
            }
        }
    }
    anyhow::ensure!(!histogram.is_empty(), "pgbench logged no transactions");
    Ok(histogram.value_at_quantile(0.99) as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_parameter_has_an_expression() {
        for name in claim_param_names().iter().chain(&finalize_param_names()) {
            assert!(expression(name).is_some(), "{name}");
        }
    }

    #[test]
    fn every_parameter_is_replaced() {
        for scenario in [Scenario::New, Scenario::Replay] {
            let s = script(scenario);
            assert!(!s.contains('$'), "{s}");
            assert!(s.contains("on conflict (merchant_id, idempotency_key) do nothing"));
        }
    }
}

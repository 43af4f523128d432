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
use crate::store::{CLAIM_SQL, FINALIZE_SQL};

/// The claim's parameters as pgbench expressions, `$1` first.
const CLAIM_ARGS: [&str; 11] = [
    ":merchant",
    "KEY",
    "sha256(convert_to(:n::text, 'UTF8'))",
    "('ch_pgb' || :client_id || '_' || :n)",
    "30000",
    "86400000",
    ":n",
    "25000",
    "'BRL'",
    "null::text",
    "('ref_pgb' || :client_id || '_' || :n)",
];

/// The finalize's parameters, `$1` first (`$2` and `$3` as in the claim),
/// with a charge event of about the size the engine writes.
const FINALIZE_ARGS: [&str; 15] = [
    ":merchant",
    "KEY",
    "('ch_pgb' || :client_id || '_' || :n)",
    "1",
    "201",
    "convert_to(repeat('x', 220), 'UTF8')",
    "86400000",
    "'captured'",
    "'cap'",
    "null::text",
    "('evt_pgb' || :client_id || '_' || :n)",
    "'idem.events'",
    "'charge.captured'",
    "'bench'",
    "convert_to(repeat('x', 330), 'UTF8')",
];

/// Replaces `$N` by `args[N-1]`, longest numbers first so `$1` never eats `$11`.
fn substitute(sql: &str, args: &[&str], key: &str) -> String {
    let mut out = sql.to_owned();
    for (i, arg) in args.iter().enumerate().rev() {
        out = out.replace(&format!("${}", i + 1), &arg.replace("KEY", key));
    }
    // pgbench reads one statement per line unless told otherwise.
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The pgbench script for a scenario.
fn script(scenario: Scenario) -> String {
    match scenario {
        Scenario::New | Scenario::Queue => {
            let key = "('pgb-' || :client_id || '-' || :n)";
            format!(
                "\\set n random(1, 2000000000)\n{};\n{};\n",
                substitute(CLAIM_SQL, &CLAIM_ARGS, key),
                substitute(FINALIZE_SQL, &FINALIZE_ARGS, key)
            )
        }
        // The stored keys idem's run created: the claim conflicts and reads.
        Scenario::Replay | Scenario::Conflict => {
            let key = "('bench-hot-' || :h)";
            format!(
                "\\set n random(1, 2000000000)\n\\set h random(0, {})\n{};\n",
                super::HOT_KEYS - 1,
                substitute(CLAIM_SQL, &CLAIM_ARGS, key)
            )
        }
    }
}

/// Runs pgbench; returns its transactions per second.
pub async fn run(
    db_url: &str,
    scenario: Scenario,
    clients: usize,
    duration: Duration,
) -> anyhow::Result<f64> {
    let store = crate::store::Store::connect(db_url, 1).await?;
    let merchant = store
        .merchant_by_name("bench")
        .await?
        .context("the bench's merchant is missing")?
        .id;
    let path = std::env::temp_dir().join(format!("idem-pgbench-{}.sql", std::process::id()));
    std::fs::write(&path, script(scenario))?;
    let out = tokio::process::Command::new("pgbench")
        .args(["-n", "-M", "prepared", "-j", "2"])
        .args([
            "-c",
            &clients.to_string(),
            "-T",
            &duration.as_secs().max(1).to_string(),
        ])
        .args(["-D", &format!("merchant={merchant}"), "-f"])
        .arg(&path)
        .arg(db_url)
        .output()
        .await
        .context("running pgbench (install PostgreSQL's client tools)")?;
    let _ = std::fs::remove_file(&path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(
        out.status.success(),
        "pgbench failed: {}{}",
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("no tps in pgbench's output: {stdout}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_parameter_is_replaced() {
        for scenario in [Scenario::New, Scenario::Replay] {
            let s = script(scenario);
            assert!(!s.contains('$'), "{s}");
            assert!(s.contains("on conflict (merchant_id, idempotency_key) do nothing"));
        }
    }
}

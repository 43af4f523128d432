//! `idem-lab bench --sweep 1,4,16,64`: one run over several concurrencies, idem
//! and pgbench's per-request statements side by side at each, printed as a
//! table and drawn as a self-contained HTML page (throughput and p99 against
//! concurrency), so a reader sees where batching starts to pay.

use std::fmt::Write as _;
use std::path::Path;

use super::chart::{self, Axes, Series};
use super::{run, BenchConfig, BenchResult};

/// Runs the bench at each of `levels` clients (a fresh deployment each), with
/// pgbench beside it where the database is PostgreSQL and the deployment the
/// bench's own; writes the chart to `report`.
pub async fn sweep(
    config: &BenchConfig,
    levels: &[usize],
    report: &Path,
) -> anyhow::Result<Vec<BenchResult>> {
    anyhow::ensure!(
        !levels.is_empty(),
        "--sweep needs at least one client count"
    );
    let mut results = Vec::with_capacity(levels.len());
    for &clients in levels {
        let at = BenchConfig {
            concurrency: clients,
            ..config.clone()
        };
        let result = run(&at).await?;
        eprintln!(
            "{clients:>4} clients: {:.0}/s, p99 {:.1} ms{}",
            result.per_second,
            result.p99_ms,
            result
                .pgbench_per_second
                .map(|pg| format!("; pgbench {pg:.0}/s"))
                .unwrap_or_default()
        );
        results.push(result);
    }
    std::fs::write(report, html(config, &results))?;
    Ok(results)
}

/// The sweep as a text table, one row per client count.
pub fn table(results: &[BenchResult]) -> String {
    let mut out = String::from(
        "clients   idem/s  idem p99 ms  pgbench/s  pgbench p99 ms  idem/pgbench  rows/batch\n",
    );
    let or_dash = |v: Option<f64>, digits: usize| {
        v.map_or_else(|| "-".to_owned(), |v| format!("{v:.digits$}"))
    };
    for r in results {
        let _ = writeln!(
            out,
            "{:>7} {:>8.0} {:>12.2} {:>10} {:>15} {:>13} {:>11}",
            r.concurrency,
            r.per_second,
            r.p99_ms,
            or_dash(r.pgbench_per_second, 0),
            or_dash(r.pgbench_p99_ms, 2),
            or_dash(r.ratio_vs_pgbench, 2),
            or_dash(r.claim_batch_rows, 1),
        );
    }
    out
}

const IDEM_COLOUR: &str = "#1f6feb";
const PGBENCH_COLOUR: &str = "#d1242f";

/// The page: the two panels, the table, and how it was made.
fn html(config: &BenchConfig, results: &[BenchResult]) -> String {
    let throughput = panel(
        "Throughput (requests or pgbench scripts per second)",
        results,
        |r| Some(r.per_second),
        |r| r.pgbench_per_second,
    );
    let p99 = panel(
        "p99 latency (ms)",
        results,
        |r| Some(r.p99_ms),
        |r| r.pgbench_p99_ms,
    );
    let title = format!(
        "idem-lab bench --sweep: scenario {:?}, {} s per point",
        config.scenario,
        config.duration.as_secs()
    );
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>{title}</title>\
         <style>body{{font:14px system-ui,sans-serif;margin:2em;color:#1f2328}}\
         svg{{margin:0 1em 1em 0}}pre{{background:#f6f8fa;padding:1em}}\
         .idem{{color:{IDEM_COLOUR}}}.pgbench{{color:{PGBENCH_COLOUR}}}</style></head>\
         <body><h1>{title}</h1>\
         <p><b class=\"idem\">idem</b>: closed-loop HTTP clients against one <code>idem serve</code> \
         (zero-latency acquirer). <b class=\"pgbench\">pgbench</b>: the store's own claim and \
         finalize statements, one transaction each, at the same client count, same database. \
         <i>rows/batch</i>: claims per statement idem sent (1: no batching).</p>\
         {throughput}{p99}<pre>{}</pre></body></html>\n",
        table(results)
    )
}

/// One panel: two lines (idem, pgbench) over a log-scaled client axis.
fn panel(
    title: &str,
    results: &[BenchResult],
    idem: impl Fn(&BenchResult) -> Option<f64>,
    pgbench: impl Fn(&BenchResult) -> Option<f64>,
) -> String {
    let x = |r: &BenchResult| (r.concurrency.max(1) as f64).log2();
    let line = |value: &dyn Fn(&BenchResult) -> Option<f64>| -> Vec<(f64, f64)> {
        results
            .iter()
            .filter_map(|r| value(r).map(|y| (x(r), y)))
            .collect()
    };
    let axes = Axes {
        title,
        x_label: "clients",
        x_ticks: results
            .iter()
            .map(|r| (x(r), r.concurrency.to_string()))
            .collect(),
        log_y: false,
        rule: None,
    };
    chart::panel(
        &axes,
        &[
            Series {
                name: "idem",
                colour: IDEM_COLOUR,
                points: line(&idem),
            },
            Series {
                name: "pgbench",
                colour: PGBENCH_COLOUR,
                points: line(&pgbench),
            },
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::Scenario;

    fn result(concurrency: usize, per_second: f64, pgbench: Option<f64>) -> BenchResult {
        BenchResult {
            scenario: Scenario::New,
            concurrency,
            seconds: 1.0,
            requests: 1,
            per_second,
            p50_ms: 1.0,
            p99_ms: 2.0,
            p999_ms: 3.0,
            statuses: Default::default(),
            errors: 0,
            server_peak_rss_mib: None,
            pgbench_per_second: pgbench,
            pgbench_p99_ms: pgbench.map(|_| 4.0),
            claim_batch_rows: Some(1.0),
            finalize_batch_rows: Some(1.0),
            ratio_vs_pgbench: pgbench.map(|pg| per_second / pg),
            publish_confirm_p50_ms: None,
        }
    }

    #[test]
    fn the_table_has_a_row_per_client_count_with_the_ratio() {
        let t = table(&[result(1, 500.0, Some(1000.0)), result(64, 3000.0, None)]);
        let rows: Vec<&str> = t.lines().collect();
        assert_eq!(rows.len(), 3, "{t}");
        assert!(
            rows[1].trim_start().starts_with("1 ") && rows[1].contains(" 0.50 "),
            "{t}"
        );
        assert!(
            rows[2].trim_start().starts_with("64 ") && rows[2].contains(" - "),
            "{t}"
        );
    }

    #[test]
    fn each_panel_draws_a_line_per_series_that_has_points() {
        let both = panel(
            "t",
            &[result(1, 1.0, Some(2.0)), result(4, 3.0, Some(1.0))],
            |r| Some(r.per_second),
            |r| r.pgbench_per_second,
        );
        assert_eq!(both.matches("<polyline").count(), 2, "{both}");
        assert_eq!(both.matches("<circle").count(), 4, "{both}");
        let idem_only = panel(
            "t",
            &[result(1, 1.0, None)],
            |r| Some(r.per_second),
            |r| r.pgbench_per_second,
        );
        assert_eq!(idem_only.matches("<polyline").count(), 1, "{idem_only}");
    }
}

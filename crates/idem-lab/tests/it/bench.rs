//! A short run of `idem-lab bench` in each scenario: asserts what it measured was
//! the scenario (statuses) and that it printed its figures, not the speed.

use idem_core::store::Backend;
use idem_testkit::broker::TestBroker;
use idem_testkit::run::{test_backend, timing_sensitive};

use crate::demo::demo_database_url;

/// `idem-lab bench --duration 1s --json` with `args`; what it printed.
async fn lab_bench(args: &[&std::ffi::OsStr]) -> serde_json::Value {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_idem-lab"))
        .args(["bench", "--duration", "1s", "--json"])
        .args(args)
        .env("DATABASE_URL", demo_database_url())
        .env("IDEM_LOG", "warn")
        .output()
        .await
        .expect("run idem-lab bench");
    assert!(
        out.status.success(),
        "idem-lab bench {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON value")
}

/// A scenario's run at 4 clients.
async fn bench(args: &[&str]) -> serde_json::Value {
    let args: Vec<&std::ffi::OsStr> = ["--concurrency", "4"]
        .iter()
        .chain(args)
        .map(std::ffi::OsStr::new)
        .collect();
    lab_bench(&args).await
}

/// A run that draws a chart (`--sweep`, `--arrival`) into a file of the
/// test's own: what it printed, and the page (the file removed).
async fn charted(args: &[&str]) -> (serde_json::Value, String) {
    let report = std::env::temp_dir().join(format!("idem-bench-{}.html", uuid::Uuid::new_v4()));
    let mut all = vec![std::ffi::OsStr::new("--report"), report.as_os_str()];
    all.extend(args.iter().map(std::ffi::OsStr::new));
    let printed = lab_bench(&all).await;
    let page = std::fs::read_to_string(&report).expect("the chart");
    let _ = std::fs::remove_file(&report);
    (printed, page)
}

#[tokio::test]
async fn the_bench_measures_each_scenario_and_the_pgbench_ratio() {
    let _turn = timing_sensitive().await;
    // pgbench is PostgreSQL's: on SQLite the bench runs without the comparison.
    let on_postgres = test_backend() == Backend::Postgres;
    for (scenario, status) in [("new", "201"), ("replay", "201"), ("conflict", "409")] {
        let mut args = vec!["--scenario", scenario];
        if on_postgres {
            args.push("--vs-pgbench");
        }
        let r = bench(&args).await;
        let statuses = r["statuses"].as_object().expect("statuses");
        assert_eq!(
            statuses.keys().collect::<Vec<_>>(),
            [status],
            "{scenario}: only {status}s: {r}"
        );
        assert!(r["requests"].as_u64().unwrap() > 0, "{r}");
        assert_eq!(r["errors"], 0, "{r}");
        assert!(
            r["p99_ms"].as_f64().unwrap() >= r["p50_ms"].as_f64().unwrap(),
            "{r}"
        );
        if on_postgres {
            assert!(r["pgbench_per_second"].as_f64().unwrap() > 0.0, "{r}");
            assert!(r["ratio_vs_pgbench"].as_f64().unwrap() > 0.0, "{r}");
        }
        assert!(r["server_peak_rss_mib"].as_f64().unwrap() > 1.0, "{r}");
    }
    sweep_draws_idem_beside_pgbench(on_postgres).await;
    // Commands through RabbitMQ (on a virtual host of this test's own); in the
    // same test, since every scenario recreates the bench's database.
    let broker = TestBroker::new().await;
    let r = bench(&["--scenario", "queue", "--amqp-url", &broker.url]).await;
    assert_eq!(
        r["statuses"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["201"],
        "{r}"
    );
    assert!(r["requests"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["errors"], 0, "{r}");
}

/// `--sweep`: one result per client count, pgbench's beside idem's on
/// PostgreSQL, and a chart of both with the table under it.
async fn sweep_draws_idem_beside_pgbench(on_postgres: bool) {
    let (results, page) = charted(&["--sweep", "1,3"]).await;
    let results = results.as_array().expect("a JSON array");
    let clients: Vec<u64> = results
        .iter()
        .map(|r| r["concurrency"].as_u64().unwrap())
        .collect();
    assert_eq!(clients, [1, 3]);
    for r in results {
        assert_eq!(r["statuses"].as_object().unwrap().len(), 1, "{r}");
        assert!(r["per_second"].as_f64().unwrap() > 0.0, "{r}");
        assert_eq!(r["pgbench_p99_ms"].as_f64().is_some(), on_postgres, "{r}");
    }
    assert_eq!(page.matches("<svg").count(), 2, "throughput and p99");
    let lines = if on_postgres { 4 } else { 2 };
    assert_eq!(page.matches("<polyline").count(), lines, "{page}");
    assert!(page.contains("idem/pgbench"), "the table under the chart");
}

/// The open model: each rate against idem and against hold-transaction, an
/// acquirer with a spread latency and faults; idem's answers are charges and
/// the faults' 503s only, every intent settles, and the ledger holds one
/// capture per intent answered 201.
#[tokio::test]
async fn the_open_model_runs_each_rate_against_idem_and_hold_transaction() {
    let _turn = timing_sensitive().await;
    let (r, page) = charted(&[
        "--arrival",
        "20,60",
        "--acquirer-latency",
        "p50=20ms,p99=60ms",
        "--acquirer-faults",
        "20%",
    ])
    .await;
    let rows = r["rows"].as_array().expect("rows");
    let seen: Vec<(&str, u64)> = rows
        .iter()
        .map(|row| {
            (
                row["server"].as_str().unwrap(),
                row["offered_per_s"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("idem", 20),
            ("hold-transaction", 20),
            ("idem", 60),
            ("hold-transaction", 60)
        ],
        "{r}"
    );
    let mut faults = 0;
    for row in rows.iter().filter(|row| row["server"] == "idem") {
        assert_eq!(row["unsettled"], 0, "every intent settles: {row}");
        assert_eq!(row["not_captured_once"], 0, "one capture per intent: {row}");
        let statuses = row["statuses"].as_object().expect("statuses");
        assert!(statuses["201"].as_u64().unwrap() > 0, "{row}");
        for label in statuses.keys() {
            assert!(
                ["201", "503 outcome-unknown", "409 request-in-flight"].contains(&label.as_str()),
                "idem answers charges, and only the faults' 503s (and 409s: a retry meeting \
                 the reconciler) besides: {row}"
            );
        }
        assert!(row["share_p99_ms"].as_f64().unwrap() <= row["p99_ms"].as_f64().unwrap());
        faults += row["faults_injected"].as_u64().unwrap();
    }
    assert!(faults > 0, "a fifth of the calls fail: {r}");
    for row in rows {
        if let Some(busy) = row["most_db_busy"].as_u64() {
            assert!(busy <= 16, "a pool of 16 connections: {row}");
        }
        assert_eq!(
            row["most_db_busy"].is_u64(),
            test_backend() == Backend::Postgres,
            "{row}"
        );
    }
    // The knee is the highest rate served, whatever this machine managed.
    let served = |server: &str| {
        rows.iter()
            .filter(|row| row["server"] == server && row["served"] == true)
            .map(|row| row["offered_per_s"].as_u64().unwrap())
            .max()
    };
    assert_eq!(r["knee_per_s"].as_u64(), served("idem"), "{r}");
    assert_eq!(
        r["hold_transaction_knee_per_s"].as_u64(),
        served("hold-transaction"),
        "{r}"
    );
    assert_eq!(
        page.matches("<svg").count(),
        3,
        "answered, share, end to end"
    );
    assert_eq!(
        page.matches("<polyline").count(),
        6,
        "two servers a panel: {page}"
    );
    assert!(page.contains("knee"), "the table under the chart");
}

/// Latency runs from each request's scheduled time: with one connection and
/// twice the rate it can carry, requests wait their turn, and that wait is
/// in the figures (a closed loop, or a clock started at sending, would show
/// the acquirer's 40 ms).
#[tokio::test]
async fn a_request_that_waits_for_a_connection_waits_on_the_clock() {
    let _turn = timing_sensitive().await;
    let (r, _) = charted(&[
        "--arrival",
        "50",
        "--acquirer-latency",
        "p50=40ms",
        "--acquirer-faults",
        "0",
        "--connections",
        "1",
        "--no-hold-transaction",
    ])
    .await;
    let row = &r["rows"][0];
    assert_eq!(row["most_in_flight"], 1, "{row}");
    // About 25 a second go through one connection and 50 arrive: by the
    // window's end (2 s in) a request has waited behind ~50 others.
    assert!(row["p99_ms"].as_f64().unwrap() > 500.0, "{row}");
    assert!(row["achieved_per_s"].as_f64().unwrap() < 40.0, "{row}");
    assert_eq!(row["served"], false, "{row}");
}

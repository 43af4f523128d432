//! A short run of `idem-lab bench` in each scenario: asserts what it measured was
//! the scenario (statuses) and that it printed its figures, not the speed.

use idem_core::store::Backend;
use idem_testkit::broker::TestBroker;
use idem_testkit::run::{test_backend, timing_sensitive};

use crate::demo::demo_database_url;

async fn bench(args: &[&str]) -> serde_json::Value {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_idem-lab"))
        .args(["bench", "--duration", "1s", "--concurrency", "4", "--json"])
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
    serde_json::from_slice(&out.stdout).expect("one JSON object")
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
    let report = std::env::temp_dir().join(format!("idem-sweep-{}.html", uuid::Uuid::new_v4()));
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_idem-lab"))
        .args([
            "bench",
            "--duration",
            "1s",
            "--sweep",
            "1,3",
            "--json",
            "--report",
        ])
        .arg(&report)
        .env("DATABASE_URL", demo_database_url())
        .env("IDEM_LOG", "warn")
        .output()
        .await
        .expect("run idem-lab bench --sweep");
    assert!(
        out.status.success(),
        "idem-lab bench --sweep: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let results: Vec<serde_json::Value> =
        serde_json::from_slice(&out.stdout).expect("a JSON array");
    let clients: Vec<u64> = results
        .iter()
        .map(|r| r["concurrency"].as_u64().unwrap())
        .collect();
    assert_eq!(clients, [1, 3]);
    for r in &results {
        assert_eq!(r["statuses"].as_object().unwrap().len(), 1, "{r}");
        assert!(r["per_second"].as_f64().unwrap() > 0.0, "{r}");
        assert_eq!(r["pgbench_p99_ms"].as_f64().is_some(), on_postgres, "{r}");
    }
    let page = std::fs::read_to_string(&report).expect("the chart");
    let _ = std::fs::remove_file(&report);
    assert_eq!(page.matches("<svg").count(), 2, "throughput and p99");
    let lines = if on_postgres { 4 } else { 2 };
    assert_eq!(page.matches("<polyline").count(), lines, "{page}");
    assert!(page.contains("idem/pgbench"), "the table under the chart");
}

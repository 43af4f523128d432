//! A short run of `idem bench` in each scenario: asserts what it measured was
//! the scenario (statuses) and that it printed its figures, not the speed.

use crate::broker::TestBroker;
use idem::store::Backend;

use crate::demo::demo_database_url;
use crate::helpers::{test_backend, timing_sensitive};

async fn bench(args: &[&str]) -> serde_json::Value {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["bench", "--duration", "1s", "--concurrency", "4", "--json"])
        .args(args)
        .env("DATABASE_URL", demo_database_url())
        .env("IDEM_LOG", "warn")
        .output()
        .await
        .expect("run idem bench");
    assert!(
        out.status.success(),
        "idem bench {args:?}: {}",
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

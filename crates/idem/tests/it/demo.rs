//! A short run of `idem demo` (the real binary, real processes): asserts the
//! verdicts, not the speed.

use idem::store::Backend;

use crate::helpers::{admin_url, test_backend};

/// Where the demo makes its databases: on the PostgreSQL server, or (any
/// `sqlite:` URL) in SQLite files of its own.
pub fn demo_database_url() -> String {
    match test_backend() {
        Backend::Postgres => admin_url(),
        Backend::Sqlite => "sqlite://idem.db".to_owned(),
    }
}

#[tokio::test]
async fn the_demo_shows_the_race_the_lock_waits_and_idem_charging_once() {
    let report = std::env::temp_dir().join(format!("idem-demo-{}.html", std::process::id()));
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .args([
            "demo",
            "--intents",
            "6",
            "--bursts",
            "4",
            "--copies",
            "4",
            "--json",
        ])
        .arg("--report")
        .arg(&report)
        .env("DATABASE_URL", demo_database_url())
        .env("IDEM_LOG", "warn")
        .output()
        .await
        .expect("run idem demo");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "idem demo failed: {stderr}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let by_name = |name: &str| {
        json["strategies"]
            .as_array()
            .expect("strategies")
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {json}"))
            .clone()
    };
    let check = by_name("check-then-act");
    assert!(
        check["double_charged"].as_u64().unwrap() > 0,
        "the race charged twice: {check}"
    );
    let hold = by_name("hold-transaction");
    assert_eq!(hold["double_charged"], 0, "{hold}");
    assert!(
        hold["lock_waits"].as_u64().unwrap() > 0,
        "retries waited on the lock: {hold}"
    );
    let idem = by_name("idem");
    assert_eq!(idem["double_charged"], 0, "{idem}");
    assert_eq!(idem["lock_waits"], 0, "{idem}");
    assert_eq!(
        idem["captures"], idem["intents"],
        "every intent charged exactly once: {idem}"
    );
    assert_eq!(idem["gave_up"], 0, "{idem}");
    let html = std::fs::read_to_string(&report).expect("the report was written");
    assert!(
        html.contains("<svg") && html.contains("check-then-act"),
        "a chart per figure"
    );
    let _ = std::fs::remove_file(&report);
}

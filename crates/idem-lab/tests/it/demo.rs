//! A short run of `idem-lab demo` (the real binary, real processes): asserts
//! the verdicts, not the speed.

use idem_core::store::Backend;
use idem_testkit::run::{admin_url, test_backend, timing_sensitive};

/// Where the demo makes its databases: on the PostgreSQL server, or (any
/// `sqlite:` URL) in SQLite files of its own.
pub fn demo_database_url() -> String {
    match test_backend() {
        Backend::Postgres => admin_url(),
        Backend::Sqlite => "sqlite://idem.db".to_owned(),
        Backend::MariaDb => idem_testkit::run::mariadb_admin_url(),
    }
}

#[tokio::test]
async fn the_demo_shows_the_race_the_lock_waits_and_idem_charging_once() {
    let _turn = timing_sensitive().await;
    let report = std::env::temp_dir().join(format!("idem-demo-{}.html", std::process::id()));
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_idem-lab"))
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
        .expect("run idem-lab demo");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "idem-lab demo failed: {stderr}");
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
    assert_the_timeline_tells_the_race(&html);
    assert_the_store_is_named(&html, &json);
    render_headless(&report);
    let _ = std::fs::remove_file(&report);
}

/// The report's samples, by strategy: `(order, captures, the sample's SVG)`.
fn samples<'a>(html: &'a str, strategy: &str) -> Vec<(u64, u64, &'a str)> {
    let re = regex::Regex::new(
        r#"<svg class="timeline" data-strategy="([^"]+)" data-order="(\d+)" data-captures="(\d+)"[^>]*>(?s:(.*?))</svg>"#,
    )
    .expect("a valid regex");
    re.captures_iter(html)
        .filter(|c| &c[1] == strategy)
        .map(|c| {
            let svg = c.get(4).expect("the body").as_str();
            (c[2].parse().unwrap(), c[3].parse().unwrap(), svg)
        })
        .collect()
}

fn assert_the_timeline_tells_the_race(html: &str) {
    assert!(html.contains("class=\"legend\""), "a legend");
    for strategy in ["check-then-act", "hold-transaction", "idem"] {
        let samples = samples(html, strategy);
        assert!(!samples.is_empty(), "{strategy} has sample intents drawn");
        for (order, _, svg) in &samples {
            assert!(
                svg.contains("class=\"lane attempt\"") && svg.contains("class=\"lane acquirer\""),
                "{strategy} order {order}: lanes for attempts and for the acquirer"
            );
        }
    }
    let check = samples(html, "check-then-act");
    let (order, _, svg) = check
        .iter()
        .find(|(_, captures, _)| *captures >= 2)
        .expect("a double-charged intent is drawn under check-then-act");
    assert!(
        svg.matches("class=\"capture\"").count() >= 2,
        "order {order}: each capture marked on the acquirer's lane"
    );
    assert!(
        svg.contains("class=\"lane database\"") && svg.contains("class=\"check\""),
        "order {order}: the server's checks that found no row"
    );
    let hold = samples(html, "hold-transaction");
    assert!(
        hold.iter()
            .any(|(_, captures, svg)| *captures == 1 && svg.contains(">timed out</text>")),
        "under hold-transaction, an intent charged once whose attempts timed out waiting"
    );
    let idem = samples(html, "idem");
    assert!(
        idem.iter().any(|(_, captures, svg)| *captures == 1
            && svg.contains(">409</text>")
            && svg.contains("class=\"capture\"")),
        "under idem, an intent captured once whose retry was answered 409"
    );
    for (_, captures, _) in &idem {
        assert_eq!(*captures, 1, "idem's samples are each charged once");
    }
}

/// Where the busy-connection and lock figures come from depends on the store used.
fn assert_the_store_is_named(html: &str, json: &serde_json::Value) {
    match test_backend() {
        Backend::Postgres => {
            assert_eq!(json["store"], "postgres");
            assert!(html.contains("This run used <b>PostgreSQL</b>"));
            assert!(html.contains("pg_stat_activity"));
        }
        Backend::Sqlite => {
            assert_eq!(json["store"], "sqlite");
            assert!(html.contains("This run used <b>SQLite</b>"));
            assert!(
                !html.contains("pg_stat_activity"),
                "no PostgreSQL view on a SQLite run"
            );
            assert!(html.contains("write lock"));
        }
        Backend::MariaDb => assert_eq!(json["store"], "mariadb"),
    }
}

/// Chromium, as scripts/ensure-chromium finds it (scripts/test exports it).
fn chromium() -> std::path::PathBuf {
    let path = std::env::var_os("IDEM_TEST_CHROMIUM")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "/usr/bin/chromium".into());
    assert!(
        path.exists(),
        "NO CHROMIUM at {}: the report's timeline cannot be rendered. \
         Run scripts/ensure-chromium (scripts/test and CI do) or set IDEM_TEST_CHROMIUM.",
        path.display()
    );
    path
}

/// The report renders in a headless browser at 1280 px wide.
fn render_headless(report: &std::path::Path) {
    let dir = std::env::temp_dir().join(format!("idem-demo-chromium-{}", std::process::id()));
    let png = dir.join("report.png");
    let out = std::process::Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1280,2000",
        ])
        .arg(format!("--user-data-dir={}", dir.join("profile").display()))
        .arg(format!("--screenshot={}", png.display()))
        .arg(format!("file://{}", report.display()))
        .output()
        .expect("run chromium");
    let bytes = std::fs::read(&png).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        bytes.len() > 10_000 && bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
        "chromium rendered the report to a PNG ({} bytes; exit {:?}): {}",
        bytes.len(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

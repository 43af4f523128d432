//! The alerting rules (`deploy/prometheus/idem-rules.yml`) in a real Prometheus,
//! scraping a real `idem serve` (with the queue consumer and the webhook
//! deliverer) every second: each event a counter rule watches is provoked
//! once, and its alert must leave `inactive` on that **first** event. Then
//! every query of the Grafana dashboard (`deploy/grafana/idem.json`) must
//! return a series. A counter that only appears at its first event is born
//! at 1, and `increase()` over it is 0: that is what this test catches.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use idem_core::store::Backend;
use idem_lab::sim::{Fault, Faults};
use serde_json::Value;

use crate::broker::{Amqp, Cmd, ConsumeProcess, TestBroker};
use crate::helpers::{body, free_port, latency, new_key, run_idem, Client, ServeProcess};
use crate::helpers::{TestDb, TestSim};

/// How long an alert may take to leave `inactive` after its event: a few
/// scrape and evaluation intervals (1 s each), with room for a loaded machine.
const WITHIN: Duration = Duration::from_secs(45);

/// A real Prometheus on a scratch port and data directory (killed when dropped).
struct Prometheus {
    url: String,
    child: Child,
    /// Its configuration and data, removed with it.
    dir: PathBuf,
    http: reqwest::Client,
}

impl Prometheus {
    /// Scrapes `targets` every second and evaluates idem's rules every second.
    async fn start(targets: &[&str]) -> Self {
        let bin = std::env::var("IDEM_TEST_PROMETHEUS").unwrap_or_else(|_| "prometheus".into());
        let dir = std::env::temp_dir().join(format!("idem-prometheus-{}", new_key()));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        let rules = repo().join("deploy/prometheus/idem-rules.yml");
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let config = format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
             rule_files: ['{}']\n\
             scrape_configs:\n\
             - job_name: idem\n  static_configs:\n  - targets: [{}]\n",
            rules.display(),
            targets.join(", ")
        );
        let config_path = dir.join("prometheus.yml");
        std::fs::write(&config_path, config).expect("write config");
        let listen = format!("127.0.0.1:{}", free_port());
        let child = Command::new(&bin)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={listen}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run {bin} ({e}): the alert test needs a Prometheus server \
                     (Debian's prometheus package; scripts/test finds it)"
                )
            });
        let prometheus = Self {
            url: format!("http://{listen}"),
            child,
            dir,
            http: reqwest::Client::new(),
        };
        prometheus
            .until("Prometheus is ready", || async {
                prometheus.get("/-/ready").await.is_some()
            })
            .await;
        prometheus
    }

    async fn get(&self, path: &str) -> Option<String> {
        let answer = self
            .http
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .ok()?;
        answer.status().is_success().then_some(())?;
        answer.text().await.ok()
    }

    /// The result of an instant query.
    async fn query(&self, expr: &str) -> Vec<Value> {
        let answer = self
            .http
            .get(format!("{}/api/v1/query", self.url))
            .query(&[("query", expr)])
            .send()
            .await
            .expect("query");
        let json: Value = answer.json().await.expect("query json");
        assert_eq!(json["status"], "success", "{expr}: {json}");
        json["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Each active alert's name and state (`pending` or `firing`).
    async fn alerts(&self) -> Vec<(String, String)> {
        let text = self.get("/api/v1/alerts").await.unwrap_or_default();
        let json: Value = serde_json::from_str(&text).unwrap_or_default();
        json["data"]["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| {
                let name = a["labels"]["alertname"].as_str().unwrap_or_default();
                (
                    name.to_owned(),
                    a["state"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }

    async fn state_of(&self, alert: &str) -> Option<String> {
        let alerts = self.alerts().await;
        alerts
            .into_iter()
            .find(|(name, _)| name == alert)
            .map(|(_, state)| state)
    }

    /// Waits until `done`, or fails the test saying `what` did not happen.
    async fn until<F, Fut>(&self, what: &str, mut done: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let started = Instant::now();
        while !done().await {
            assert!(started.elapsed() < WITHIN, "not within {WITHIN:?}: {what}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The lines of a live `/metrics` that name `metric`.
async fn series(metrics_url: &str, metric: &str) -> Vec<String> {
    let text = reqwest::get(metrics_url)
        .await
        .expect("scrape")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .filter(|l| l.starts_with(metric) && !l.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// The counters every alert rule watches, and one series of each that must be
/// exported at 0 before anything happened.
const AT_ZERO: [&str; 7] = [
    "idem_acquirer_contradicted_total 0",
    r#"idem_acquirer_calls_total{outcome="unknown"} 0"#,
    r#"idem_http_problems_total{type="overloaded"} 0"#,
    r#"idem_http_problems_total{type="internal"} 0"#,
    r#"idem_webhook_deliveries_total{result="failed"} 0"#,
    r#"idem_queue_commands_total{result="dead_lettered"} 0"#,
    "idem_outbox_set_aside_total 0",
];

/// Each alert whose event the scenario provokes, and the state it must reach
/// on that first event (a rule with a long `for:` stays `pending` that long).
const EXPECTED: [(&str, &str); 9] = [
    ("IdemAcquirerContradicted", "firing"),
    ("IdemChargesAwaitingReview", "firing"),
    ("IdemRefundsAwaitingReview", "firing"),
    ("IdemStepsAwaitingReview", "firing"),
    ("IdemAcquirerUnknownOutcomes", "pending"),
    ("IdemShedding", "pending"),
    ("IdemDeadLetters", "firing"),
    ("IdemOutboxSetAside", "firing"),
    ("IdemWebhooksFailed", "firing"),
];

#[tokio::test]
async fn every_counter_alert_fires_on_its_first_event_in_a_real_prometheus() {
    let db = TestDb::new().await;
    let secret = db.merchant("loja").await;
    let sim = TestSim::start(Faults::default()).await;
    let broker = TestBroker::new().await;
    let amqp = Amqp::connect(&broker).await;
    // A webhook endpoint nobody listens at, given up after one retry.
    let nowhere = format!("http://127.0.0.1:{}/hook", free_port());
    let (added, _, stderr) = run_idem(
        &db,
        &[
            "webhooks",
            "add",
            "loja",
            &nowhere,
            "--webhook-allow-private",
            "--actor",
            "ana",
        ],
    )
    .await;
    assert!(added.success(), "{stderr}");

    let metrics = format!("127.0.0.1:{}", free_port());
    let serve = ServeProcess::start(
        &db,
        &sim,
        &[
            "--metrics-listen",
            &metrics,
            "--amqp-url",
            &broker.url,
            "--consume",
            "--outbox-poll",
            "100ms",
            "--max-in-flight",
            "1",
            "--webhook-allow-private",
            "--webhook-retry-schedule",
            "100ms",
        ],
    )
    .await;
    amqp.wait_for_consumers(1).await;
    let metrics_url = format!("http://{metrics}/metrics");
    for line in AT_ZERO {
        let name = line.split([' ', '{']).next().unwrap_or_default();
        let exported = series(&metrics_url, name).await;
        assert!(
            exported.iter().any(|l| l == line),
            "a fresh idem serve must export {line}; it has {exported:?}"
        );
    }
    // `idem consume` too: it counts queue commands and outbox messages.
    let consume_metrics = format!("127.0.0.1:{}", free_port());
    let _consume = ConsumeProcess::start(
        &db,
        &sim,
        &broker,
        &["--metrics-listen", &consume_metrics, "--no-workers"],
        &[],
        2,
    )
    .await;
    // (It serves no API: the HTTP counters are `serve`'s.)
    for line in AT_ZERO.iter().filter(|l| !l.starts_with("idem_http_")) {
        let name = line.split([' ', '{']).next().unwrap_or_default();
        let exported = series(&format!("http://{consume_metrics}/metrics"), name).await;
        assert!(
            exported.iter().any(|l| l == line),
            "idem consume: {line}: {exported:?}"
        );
    }

    // Both processes scraped (either may take a command off the queue).
    let prometheus = Prometheus::start(&[&metrics, &consume_metrics]).await;
    // Two scrapes of each quiet process, so each counter has a sample before
    // its event (as it does in production, scraped long before anything).
    prometheus
        .until("two scrapes of each process", || async {
            let scraped = prometheus
                .query("count_over_time(up{job=\"idem\"}[1m]) >= 2")
                .await;
            scraped.len() == 2
        })
        .await;
    // At rest, none of them is active (a pool alert may be pending for a
    // moment, while a worker holds the pool's only connection: its `for:`
    // is there for that).
    let at_rest = prometheus.alerts().await;
    assert!(
        at_rest
            .iter()
            .all(|(name, state)| state != "firing" && !EXPECTED.iter().any(|(e, _)| e == name)),
        "active at rest: {at_rest:?}"
    );

    let client = Client::new(&serve.url, &secret);
    // A capture and its replay (the replay cache's panel), with a webhook
    // event to an endpoint that never answers.
    let key = new_key();
    let captured = client.charge(&key, &body(1, 25_000)).await;
    assert_eq!(captured.status, 201, "{captured:?}");
    let charge_id = captured.json()["id"].as_str().expect("id").to_owned();
    assert_eq!(client.charge(&key, &body(1, 25_000)).await.status, 201);
    // The acquirer lies about the amount once: a contradicted capture.
    sim.set_faults(Faults {
        fault: Fault::WrongAmount,
        fault_count: Some(1),
        ..Faults::default()
    })
    .await;
    let contradicted = client.charge(&new_key(), &body(2, 25_000)).await;
    assert_eq!(
        contradicted.problem_type(),
        "urn:idem:problem:charge-under-review"
    );
    // It lies about a refund of the first charge once: a refund awaiting review.
    sim.set_faults(Faults {
        fault: Fault::WrongAmount,
        fault_count: Some(1),
        ..Faults::default()
    })
    .await;
    let refund = client
        .refund(&charge_id, &new_key(), r#"{"amount_cents": 400}"#)
        .await;
    assert_eq!(
        refund.problem_type(),
        "urn:idem:problem:refund-under-review",
        "{refund:?}"
    );
    // It lies about a capture of an authorization once: a step awaiting review.
    let authorized = client
        .charge(
            &new_key(),
            r#"{"order_id": 3, "amount_cents": 1000, "capture": false}"#,
        )
        .await;
    assert_eq!(authorized.status, 201, "{authorized:?}");
    let authorized = authorized.json()["id"].as_str().expect("id").to_owned();
    sim.set_faults(Faults {
        fault: Fault::WrongAmount,
        fault_count: Some(1),
        ..Faults::default()
    })
    .await;
    let capture = client
        .capture(
            &authorized,
            &new_key(),
            r#"{"amount_cents": 300, "final": false}"#,
        )
        .await;
    assert_eq!(
        capture.problem_type(),
        "urn:idem:problem:step-under-review",
        "{capture:?}"
    );
    // The acquirer answers 503 once: an unknown outcome.
    sim.set_faults(Faults {
        fault: Fault::Status(503),
        fault_count: Some(1),
        ..Faults::default()
    })
    .await;
    assert_eq!(
        client.charge(&new_key(), &body(3, 25_000)).await.status,
        503
    );
    // Two charges at once on an instance that works one at a time: one shed.
    sim.set_faults(latency(1_000)).await;
    let (key_a, key_b, body_a, body_b) = (new_key(), new_key(), body(4, 100), body(5, 100));
    let (a, b) = tokio::join!(
        client.charge(&key_a, &body_a),
        client.charge(&key_b, &body_b)
    );
    let shed = [&a, &b]
        .iter()
        .filter(|x| x.status == 503 && x.problem_type().ends_with(":overloaded"))
        .count();
    assert_eq!(shed, 1, "{} {}", a.status, b.status);
    sim.set_faults(Faults::default()).await;
    // A command that is not JSON: a dead letter.
    amqp.publish(&Cmd::new("k-json", "loja", "{not json")).await;
    // A merchant whose results' routing key is over AMQP's 255 bytes (a name
    // stored before names had to be slugs): its result is set aside.
    let long = "€".repeat(90);
    db.exec(&match db.backend {
        Backend::Postgres => format!("insert into merchants (name) values ('{long}')"),
        Backend::Sqlite => format!(
            "insert into merchants (name, secret_hash, created_at) values ('{long}', randomblob(32), 0)"
        ),
        Backend::MariaDb => format!(
            "insert into merchants (name, secret_hash, created_at) values ('{long}', random_bytes(32), 0)"
        ),
    })
    .await;
    amqp.publish(&Cmd::new(&new_key(), &long, &body(6, 100)))
        .await;

    for (alert, state) in EXPECTED {
        prometheus
            .until(&format!("{alert} {state}"), || async {
                let now = prometheus.state_of(alert).await;
                now.as_deref() == Some(state) || (state == "pending" && now.is_some())
            })
            .await;
        eprintln!("alerts: {alert} reached {state}");
    }

    // Every query of the dashboard returns a series now.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("deploy/grafana/idem.json")).expect("dashboard"),
    )
    .expect("dashboard json");
    let mut empty = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("expr");
            let expr = expr
                .replace("$__rate_interval", "1m")
                .replace("$__range", "5m");
            if prometheus.query(&expr).await.is_empty() {
                empty.push(format!("{}: {expr}", panel["title"]));
            }
        }
    }
    assert!(
        empty.is_empty(),
        "dashboard queries with no series: {empty:#?}"
    );
}

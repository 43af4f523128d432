//! Webhooks: a merchant's endpoints (added only where a webhook may go,
//! listed without their secrets, rotated, disabled, enabled and removed, each
//! change audited), and the deliveries, sent by real `idem serve` processes to
//! a real receiver that checks every signature with the `standardwebhooks`
//! package from PyPI (scripts/webhook_receiver.py).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use idem_core::acquirer::Acquirer;
use idem_lab::sim::{Fault, Faults};

use crate::helpers::{
    body, free_port, new_key, python_from, run_idem, scripts, Client, ServeProcess, TestDb, TestSim,
};

/// A Python with `standardwebhooks` (scripts/ensure-webhook-venv).
fn python() -> String {
    python_from("ensure-webhook-venv")
}

/// One request the receiver took.
#[derive(Debug, Clone)]
struct Received {
    path: String,
    webhook_id: String,
    body: serde_json::Value,
}

/// A merchant's receiver on loopback (see scripts/webhook_receiver.py for how
/// each path answers); killed when dropped.
struct Receiver {
    base: String,
    log: PathBuf,
    child: Child,
}

impl Receiver {
    async fn start() -> Self {
        let port = free_port();
        let log = std::env::temp_dir().join(format!(
            "idem_hooks_{}.jsonl",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::write(&log, b"").expect("receiver log");
        let child = Command::new(python())
            .arg(scripts().join("webhook_receiver.py"))
            .args(["serve", &port.to_string()])
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the receiver");
        let base = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        while reqwest::get(&base).await.is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the receiver did not start"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        Self { base, log, child }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn received(&self) -> Vec<Received> {
        let text = std::fs::read_to_string(&self.log).expect("receiver log");
        text.lines()
            .map(|line| {
                let record: serde_json::Value = serde_json::from_str(line).expect("a record");
                use base64::Engine as _;
                let body = base64::engine::general_purpose::STANDARD
                    .decode(record["body"].as_str().expect("body"))
                    .expect("base64");
                Received {
                    path: record["path"].as_str().expect("path").to_owned(),
                    webhook_id: record["headers"]["webhook-id"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    body: serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
                }
            })
            .collect()
    }

    /// Waits until `enough` holds of what was received.
    async fn wait_for(&self, what: &str, enough: impl Fn(&[Received]) -> bool) -> Vec<Received> {
        let started = Instant::now();
        loop {
            let got = self.received();
            if enough(&got) {
                return got;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "never received {what}: {got:#?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// For each request received, in order: its path and whether `secret`
    /// verifies it, by the `standardwebhooks` package.
    fn verified_by(&self, secret: &str) -> Vec<(String, bool)> {
        let out = Command::new(python())
            .arg(scripts().join("webhook_receiver.py"))
            .arg("verify")
            .arg(&self.log)
            .arg(secret)
            .output()
            .expect("run the verifier");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|line| {
                let v: serde_json::Value = serde_json::from_str(line).expect("verdict");
                (
                    v["path"].as_str().expect("path").to_owned(),
                    v["valid"].as_bool().expect("valid"),
                )
            })
            .collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Adds an endpoint (private addresses allowed: the receiver is on loopback);
/// returns its id and secret.
async fn add_endpoint(db: &TestDb, merchant: &str, url: &str, extra: &[&str]) -> (String, String) {
    let mut args = vec![
        "webhooks",
        "add",
        merchant,
        url,
        "--webhook-allow-private",
        "--actor",
        "ana",
    ];
    args.extend_from_slice(extra);
    let (status, stdout, stderr) = run_idem(db, &args).await;
    assert!(status.success(), "{stderr}");
    let id = stderr
        .split_whitespace()
        .find(|w| w.starts_with("we_"))
        .unwrap_or_else(|| panic!("no endpoint id in {stderr}"))
        .to_owned();
    (id, stdout.trim().to_owned())
}

/// Eight retries, 200 ms apart.
const QUICK: &str = "200ms,200ms,200ms,200ms,200ms,200ms,200ms,200ms";

/// `idem serve` delivering to loopback, retrying on `schedule`, with short
/// leases and a quick reconciler.
async fn serve(db: &TestDb, sim: &TestSim, schedule: &str, extra: &[&str]) -> ServeProcess {
    let mut args = vec![
        "--webhook-allow-private",
        "--webhook-retry-schedule",
        schedule,
        "--acquirer-timeout",
        "1s",
        "--lease",
        "2s",
        "--reconcile-interval",
        "100ms",
    ];
    args.extend_from_slice(extra);
    ServeProcess::start(db, sim, &args).await
}

fn of_charge<'a>(got: &'a [Received], path: &str, charge_id: &str) -> Vec<&'a Received> {
    got.iter()
        .filter(|r| r.path == path && r.body["charge"]["id"] == charge_id)
        .collect()
}

/// A captured charge, a declined one and one answered `503` and settled by
/// the reconciler each produce one event at every endpoint that hears it,
/// signed as the specification says; an endpoint that answers `500` three
/// times gets the same `webhook-id` each time until its `200`, and the
/// delivery is settled once.
#[tokio::test]
async fn each_outcome_is_delivered_signed_once_and_retried_until_a_2xx() {
    let db = TestDb::new().await;
    let sim = TestSim::start(Faults::default()).await;
    let receiver = Receiver::start().await;
    let secret = db.merchant("loja").await;
    let (_, all_secret) = add_endpoint(&db, "loja", &receiver.url("/ok"), &[]).await;
    let (flaky_id, flaky_secret) = add_endpoint(
        &db,
        "loja",
        &receiver.url("/flaky/3"),
        &["--events", "charge.captured"],
    )
    .await;
    let server = serve(&db, &sim, QUICK, &[]).await;
    let c = Client::new(&server.url, &secret);

    let captured = c.charge(&new_key(), &body(1, 100)).await;
    assert_eq!(captured.status, 201, "{:?}", captured.body);
    sim.set_faults(Faults {
        decline_rate: 1.0,
        ..Faults::default()
    })
    .await;
    let declined = c.charge(&new_key(), &body(2, 200)).await;
    assert_eq!(declined.status, 402, "{:?}", declined.body);
    sim.set_faults(Faults {
        fault: Fault::ErrorAfter,
        fault_count: Some(1),
        ..Faults::default()
    })
    .await;
    let unknown = c.charge(&new_key(), &body(3, 300)).await;
    assert_eq!(unknown.status, 503, "{:?}", unknown.body);
    let ids: Vec<String> = [&captured, &declined]
        .iter()
        .map(|a| {
            let v = a.json();
            // A decline's body is a problem holding the charge.
            let charge = if v["charge"].is_object() {
                &v["charge"]
            } else {
                &v
            };
            charge["id"].as_str().expect("id").to_owned()
        })
        .chain(std::iter::once(
            sqlx::query_as::<_, (String,)>("select id from charges where order_id = 3")
                .fetch_one(&db.pool)
                .await
                .expect("the unknown charge")
                .0,
        ))
        .collect();

    let got = receiver
        .wait_for("every event at both endpoints", |got| {
            ids.iter().all(|id| of_charge(got, "/ok", id).len() == 1)
                && [&ids[0], &ids[2]]
                    .iter()
                    .all(|id| of_charge(got, "/flaky/3", id).len() == 4)
        })
        .await;
    for (id, event) in ids
        .iter()
        .zip(["charge.captured", "charge.declined", "charge.captured"])
    {
        let one = of_charge(&got, "/ok", id)[0];
        assert_eq!(one.body["type"], event, "{:?}", one.body);
        assert_eq!(one.body["version"], 2);
        assert_eq!(one.body["merchant"], "loja");
        assert_eq!(one.webhook_id, one.body["id"].as_str().expect("id"));
    }
    assert!(
        of_charge(&got, "/flaky/3", &ids[1]).is_empty(),
        "it hears captures only"
    );
    for id in [&ids[0], &ids[2]] {
        let tries = of_charge(&got, "/flaky/3", id);
        assert!(
            tries.iter().all(|r| r.webhook_id == tries[0].webhook_id),
            "one webhook-id on every retry: {tries:?}"
        );
    }
    for (path, valid) in receiver.verified_by(&all_secret) {
        assert_eq!(valid, path == "/ok", "{path} by the /ok endpoint's secret");
    }
    for (path, valid) in receiver.verified_by(&flaky_secret) {
        assert_eq!(
            valid,
            path == "/flaky/3",
            "{path} by the flaky endpoint's secret"
        );
    }

    // Settled once each: delivered, on the fourth attempt for the flaky one.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rows: Vec<(String, String, i32)> =
        sqlx::query_as("select endpoint_id, state, attempts from webhook_deliveries order by id")
            .fetch_all(&db.pool)
            .await
            .expect("deliveries");
    assert_eq!(rows.len(), 5, "{rows:?}");
    for (endpoint, state, attempts) in &rows {
        assert_eq!(state, "delivered", "{rows:?}");
        assert_eq!(
            *attempts,
            if *endpoint == flaky_id { 4 } else { 1 },
            "{rows:?}"
        );
    }
    assert_eq!(
        receiver.received().len(),
        3 + 8,
        "nothing sent twice once delivered"
    );
}

async fn webhooks(db: &TestDb, args: &[&str]) -> (bool, String, String) {
    let mut all = vec!["webhooks"];
    all.extend_from_slice(args);
    if !matches!(args.first(), Some(&"list")) {
        all.extend_from_slice(&["--actor", "ana"]);
    }
    let (status, stdout, stderr) = run_idem(db, &all).await;
    (status.success(), stdout, stderr)
}

#[tokio::test]
async fn endpoints_go_only_where_webhooks_may_and_never_show_their_secrets() {
    let db = TestDb::new().await;
    db.merchant("loja").await;

    for (url, why) in [
        ("https://localhost/hook", "not a public address"),
        (
            "https://169.254.169.254/latest/meta-data",
            "not a public address",
        ),
        ("https://[::1]/hook", "not a public address"),
        ("https://10.0.0.7/hook", "not a public address"),
        ("http://8.8.8.8/hook", "must use https://"),
        ("https://user:pw@8.8.8.8/hook", "user name or password"),
    ] {
        let (ok, stdout, stderr) = webhooks(&db, &["add", "loja", url]).await;
        assert!(!ok, "{url} was accepted");
        assert!(stdout.is_empty(), "{url}: {stdout}");
        assert!(stderr.contains(why), "{url}: {stderr}");
    }
    let (ok, _, stderr) = webhooks(&db, &["add", "nobody", "https://8.8.8.8/hook"]).await;
    assert!(!ok);
    assert!(stderr.contains("no merchant is named"), "{stderr}");
    let (ok, _, stderr) = webhooks(
        &db,
        &[
            "add",
            "loja",
            "https://8.8.8.8/hook",
            "--events",
            "charge.refunded",
        ],
    )
    .await;
    assert!(!ok);
    assert!(stderr.contains("unknown event"), "{stderr}");
    assert_eq!(
        db.count("webhook_endpoints").await,
        0,
        "nothing refused was stored"
    );

    // A private receiver, allowed by the flag (as an on-premises one would be).
    let (ok, secret, stderr) = webhooks(
        &db,
        &[
            "add",
            "loja",
            "http://127.0.0.1:9/hook",
            "--webhook-allow-private",
            "--events",
            "charge.captured,charge.review_required",
        ],
    )
    .await;
    assert!(ok, "{stderr}");
    let secret = secret.trim_end_matches('\n');
    assert!(
        secret.starts_with("whsec_") && !secret.contains('\n'),
        "the secret alone on stdout: {secret:?}"
    );
    let id = stderr
        .split_whitespace()
        .find(|w| w.starts_with("we_"))
        .unwrap_or_else(|| panic!("no endpoint id in {stderr}"))
        .to_owned();
    // A public one needs no flag.
    let (ok, _, stderr) = webhooks(&db, &["add", "loja", "https://8.8.8.8/hook"]).await;
    assert!(ok, "{stderr}");

    let (ok, list, _) = webhooks(&db, &["list"]).await;
    assert!(ok);
    assert!(!list.contains("whsec_"), "never a secret: {list}");
    let line = list.lines().find(|l| l.starts_with(&id)).expect("listed");
    assert!(
        line.contains(
            "\tloja\thttp://127.0.0.1:9/hook\tcharge.captured,charge.review_required\tenabled\t"
        ),
        "{line}"
    );
    assert!(
        list.lines()
            .any(|l| l.contains("https://8.8.8.8/hook\tall\t")),
        "{list}"
    );

    // Rotation with a grace: both secrets kept, the old one until then.
    let (ok, rotated, stderr) = webhooks(&db, &["rotate-secret", &id, "--grace", "1h"]).await;
    assert!(ok, "{stderr}");
    let rotated = rotated.trim_end_matches('\n');
    assert!(rotated.starts_with("whsec_") && rotated != secret);
    let (now, before): (String, Option<String>) =
        sqlx::query_as("select secret, previous_secret from webhook_endpoints where id = $1")
            .bind(&id)
            .fetch_one(&db.pool)
            .await
            .expect("endpoint");
    assert_eq!((now.as_str(), before.as_deref()), (rotated, Some(secret)));
    let (_, list, _) = webhooks(&db, &["list"]).await;
    assert!(list.contains("old secret signs until"), "{list}");

    let (ok, _, stderr) = webhooks(&db, &["disable", &id]).await;
    assert!(ok, "{stderr}");
    let (ok, _, stderr) = webhooks(&db, &["disable", &id]).await;
    assert!(!ok && stderr.contains("nothing to change"), "{stderr}");
    let (_, list, _) = webhooks(&db, &["list"]).await;
    assert!(list.contains("disabled since"), "{list}");
    let (ok, _, stderr) = webhooks(&db, &["enable", &id]).await;
    assert!(ok, "{stderr}");
    let (ok, _, stderr) = webhooks(&db, &["remove", &id]).await;
    assert!(ok, "{stderr}");
    let (_, list, _) = webhooks(&db, &["list"]).await;
    assert!(!list.contains(&id), "{list}");
    let (ok, _, _) = webhooks(&db, &["remove", &id]).await;
    assert!(!ok, "removed once");

    let actions: Vec<(String,)> = sqlx::query_as(
        "select action from audit_log where subject = $1 and actor = 'ana' order by id",
    )
    .bind(&id)
    .fetch_all(&db.pool)
    .await
    .expect("audit");
    let actions: Vec<&str> = actions.iter().map(|(a,)| a.as_str()).collect();
    assert_eq!(
        actions,
        [
            "webhook.add",
            "webhook.rotate-secret",
            "webhook.disable",
            "webhook.enable",
            "webhook.remove"
        ]
    );
}

/// The state, attempts and last error of each delivery of `endpoint`.
async fn deliveries_of(db: &TestDb, endpoint: &str) -> Vec<(String, i32, Option<String>)> {
    sqlx::query_as(
        "select state, attempts, last_error from webhook_deliveries
          where endpoint_id = $1 order by id",
    )
    .bind(endpoint)
    .fetch_all(&db.pool)
    .await
    .expect("deliveries")
}

/// Endpoints that hang, drip their answer or redirect: each attempt is
/// bounded, none is taken for delivered, each is retried, and another
/// merchant's delivery arrives meanwhile.
#[tokio::test]
async fn hanging_dripping_and_redirecting_receivers_are_bounded_retried_and_hold_nobody_else_up() {
    let db = TestDb::new().await;
    let sim = TestSim::start(Faults::default()).await;
    let receiver = Receiver::start().await;
    let loja = db.merchant("loja").await;
    let outra = db.merchant("outra").await;
    let mut hostile = Vec::new();
    for path in ["/hang", "/drip", "/redirect"] {
        hostile.push(add_endpoint(&db, "loja", &receiver.url(path), &[]).await.0);
    }
    add_endpoint(&db, "outra", &receiver.url("/ok"), &[]).await;
    let server = serve(
        &db,
        &sim,
        "300ms,300ms,300ms,300ms,300ms,300ms,300ms,300ms,300ms,300ms",
        &["--webhook-timeout", "1s"],
    )
    .await;

    // Several of loja's events, so its endpoints hold as many places as they may.
    for order in 1..=6 {
        let a = Client::new(&server.url, &loja)
            .charge(&new_key(), &body(order, 100))
            .await;
        assert_eq!(a.status, 201, "{:?}", a.body);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sent = Instant::now();
    let a = Client::new(&server.url, &outra)
        .charge(&new_key(), &body(1, 100))
        .await;
    assert_eq!(a.status, 201, "{:?}", a.body);
    receiver
        .wait_for("outra's event", |got| {
            got.iter()
                .any(|r| r.path == "/ok" && r.body["merchant"] == "outra")
        })
        .await;
    assert!(
        sent.elapsed() < Duration::from_secs(5),
        "outra waited {:?} behind loja's endpoints",
        sent.elapsed()
    );

    // Each of loja's attempts ended within its bound, and was retried.
    let started = Instant::now();
    loop {
        let mut retried = true;
        for endpoint in &hostile {
            let rows = deliveries_of(&db, endpoint).await;
            retried &= rows.iter().any(|(_, attempts, _)| *attempts >= 2);
        }
        if retried {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "never retried");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for endpoint in &hostile {
        for (state, _, error) in deliveries_of(&db, endpoint).await {
            assert_ne!(state, "delivered", "{endpoint}: {error:?}");
        }
    }
    let got = receiver.received();
    assert!(
        !got.iter()
            .any(|r| r.path == "/ok" && r.body["merchant"] == "loja"),
        "a redirect is not followed"
    );
    let errors: Vec<Option<String>> = sqlx::query_as::<_, (Option<String>,)>(
        "select last_error from webhook_deliveries where endpoint_id = $1 and attempts > 0",
    )
    .bind(&hostile[2])
    .fetch_all(&db.pool)
    .await
    .expect("errors")
    .into_iter()
    .map(|(e,)| e)
    .collect();
    assert!(
        errors.iter().flatten().any(|e| e.contains("302")),
        "the redirect's status is what counts: {errors:?}"
    );
}

/// A delivery that failed to the end of its schedule is sent again by an
/// operator, under the same `webhook-id`; a rotated secret signs beside the
/// new one during its grace, and only the new one signs after.
#[tokio::test]
async fn a_failed_delivery_is_sent_again_and_a_rotated_secret_signs_only_during_its_grace() {
    let db = TestDb::new().await;
    let sim = TestSim::start(Faults::default()).await;
    let receiver = Receiver::start().await;
    let secret = db.merchant("loja").await;
    let (flaky, _) = add_endpoint(&db, "loja", &receiver.url("/flaky/3"), &[]).await;
    // One retry: the first two attempts meet `500`s, and the delivery fails.
    let server = serve(&db, &sim, "100ms", &[]).await;
    let c = Client::new(&server.url, &secret);

    let a = c.charge(&new_key(), &body(1, 100)).await;
    assert_eq!(a.status, 201, "{:?}", a.body);
    let started = Instant::now();
    while deliveries_of(&db, &flaky).await[0].0 != "failed" {
        assert!(started.elapsed() < Duration::from_secs(20), "never failed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, listed, _) = run_idem(&db, &["webhooks", "deliveries"]).await;
    assert!(listed.contains("\tfailed\t2\t"), "{listed}");
    let event_id = receiver.received()[0].webhook_id.clone();
    let (status, _, stderr) =
        run_idem(&db, &["webhooks", "redeliver", &event_id, "--actor", "ana"]).await;
    assert!(status.success(), "{stderr}");
    let got = receiver
        .wait_for("the redelivery's 200", |got| got.len() == 4)
        .await;
    assert!(got.iter().all(|r| r.webhook_id == event_id), "{got:?}");
    let started = Instant::now();
    while deliveries_of(&db, &flaky).await[0].0 != "delivered" {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "never delivered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, _, _) = run_idem(
        &db,
        &["webhooks", "redeliver", "evt_nope", "--actor", "ana"],
    )
    .await;
    assert!(!status.success(), "no such event");
    run_idem(&db, &["webhooks", "remove", &flaky, "--actor", "ana"]).await;

    // Rotation.
    let (ok_id, first) = add_endpoint(&db, "loja", &receiver.url("/ok"), &[]).await;
    let rotate = |grace: &'static str| {
        let (db, ok_id) = (&db, ok_id.clone());
        async move {
            let (status, stdout, stderr) = run_idem(
                db,
                &[
                    "webhooks",
                    "rotate-secret",
                    &ok_id,
                    "--grace",
                    grace,
                    "--actor",
                    "ana",
                ],
            )
            .await;
            assert!(status.success(), "{stderr}");
            stdout.trim().to_owned()
        }
    };
    let second = rotate("1h").await;
    let a = c.charge(&new_key(), &body(2, 100)).await;
    assert_eq!(a.status, 201, "{:?}", a.body);
    receiver
        .wait_for("the charge during the grace", |got| {
            got.iter().filter(|r| r.path == "/ok").count() == 1
        })
        .await;
    let third = rotate("0s").await;
    let a = c.charge(&new_key(), &body(3, 100)).await;
    assert_eq!(a.status, 201, "{:?}", a.body);
    receiver
        .wait_for("the charge after the grace", |got| {
            got.iter().filter(|r| r.path == "/ok").count() == 2
        })
        .await;
    let at_ok = |secret: &str| -> Vec<bool> {
        receiver
            .verified_by(secret)
            .into_iter()
            .filter(|(path, _)| path == "/ok")
            .map(|(_, valid)| valid)
            .collect()
    };
    assert_eq!(
        at_ok(&first),
        [true, false],
        "the first secret, during its grace only"
    );
    assert_eq!(
        at_ok(&second),
        [true, false],
        "the second, rotated out without a grace"
    );
    assert_eq!(at_ok(&third), [false, true], "the third, once it was made");
}

/// An instance killed in the middle of the finalize, between the commit and
/// any POST: another instance delivers the event.
#[cfg(feature = "crash-points")]
#[tokio::test]
async fn an_instance_killed_between_the_commit_and_the_post_loses_no_webhook() {
    let db = TestDb::new().await;
    let sim = TestSim::start(Faults::default()).await;
    let receiver = Receiver::start().await;
    let secret = db.merchant("loja").await;
    add_endpoint(&db, "loja", &receiver.url("/ok"), &[]).await;
    let mut doomed = ServeProcess::start_env(
        &db,
        &sim,
        &[
            "--no-workers",
            "--webhook-allow-private",
            "--acquirer-timeout",
            "1s",
            "--lease",
            "2s",
        ],
        &[("IDEM_CRASH_AT", "mid-finalize")],
    )
    .await;
    let sent = Client::new(&doomed.url, &secret)
        .raw()
        .post(format!("{}/v1/charges", doomed.url))
        .bearer_auth(&secret)
        .header("Idempotency-Key", new_key())
        .header("content-type", "application/json")
        .body(body(1, 100))
        .send()
        .await;
    assert!(
        sent.is_err(),
        "the instance died before answering: {sent:?}"
    );
    let exit = tokio::task::spawn_blocking(move || doomed.wait_exit())
        .await
        .expect("join");
    assert!(!exit.success());
    assert!(
        receiver.received().is_empty(),
        "nothing was sent by the dead instance"
    );

    let _survivor = serve(&db, &sim, QUICK, &[]).await;
    let got = receiver
        .wait_for("the event, from the other instance", |got| !got.is_empty())
        .await;
    assert_eq!(got[0].body["type"], "charge.captured");
    assert_eq!(sim.ledger().await.captures.len(), 1);
}

/// Two instances deliver side by side: every event reaches the endpoint, and
/// none twice (each attempt is leased by one deliverer).
#[tokio::test]
async fn two_deliverers_share_the_work_and_send_no_attempt_twice() {
    let db = TestDb::new().await;
    let sim = TestSim::start(Faults::default()).await;
    let receiver = Receiver::start().await;
    let secret = db.merchant("loja").await;
    add_endpoint(&db, "loja", &receiver.url("/ok"), &[]).await;
    let (a, b) = (
        serve(&db, &sim, QUICK, &[]).await,
        serve(&db, &sim, QUICK, &[]).await,
    );
    let charges = 20;
    let mut sent = Vec::new();
    for order in 1..=charges {
        let server = if order % 2 == 0 { &a } else { &b };
        sent.push(tokio::spawn({
            let c = Client::new(&server.url, &secret);
            async move { c.charge(&new_key(), &body(order, 100)).await.status }
        }));
    }
    for s in sent {
        assert_eq!(s.await.expect("join"), 201);
    }
    receiver
        .wait_for("every event", |got| got.len() >= 20)
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let got = receiver.received();
    let mut ids: Vec<&str> = got.iter().map(|r| r.webhook_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(
        (got.len(), ids.len()),
        (20, 20),
        "each event once: {got:#?}"
    );
}

/// A refund paid, one the acquirer refused and one whose answer contradicts
/// it each tell the merchant once, signed as a charge's events are
/// (`refund.succeeded`, `refund.failed`, `refund.review_required`), to the
/// endpoints that hear them; a paid refund is also an event on `idem.events`'s
/// outbox.
#[tokio::test]
async fn each_refund_outcome_is_delivered_signed_once() {
    let db = TestDb::new().await;
    let sim = TestSim::start(Faults::default()).await;
    let receiver = Receiver::start().await;
    let secret = db.merchant("loja").await;
    let (_, all_secret) = add_endpoint(&db, "loja", &receiver.url("/ok"), &[]).await;
    add_endpoint(
        &db,
        "loja",
        &receiver.url("/flaky/0"),
        &["--events", "refund.succeeded"],
    )
    .await;
    let server = serve(&db, &sim, QUICK, &[]).await;
    let c = Client::new(&server.url, &secret);
    let charge = c.charge(&new_key(), &body(1, 1_000)).await;
    assert_eq!(charge.status, 201);
    let charge_id = charge.json()["id"].as_str().expect("id").to_owned();
    db.store.set_events_enabled(true).await.expect("events on");

    let paid = c
        .refund(&charge_id, &new_key(), r#"{"amount_cents": 100}"#)
        .await;
    assert_eq!(paid.status, 201, "{paid:?}");
    sim.set_faults(Faults {
        fault: Fault::WrongAmount,
        fault_count: Some(1),
        ..Faults::default()
    })
    .await;
    let lied = c
        .refund(&charge_id, &new_key(), r#"{"amount_cents": 200}"#)
        .await;
    assert_eq!(lied.status, 503, "{lied:?}");
    assert_eq!(lied.problem_type(), "urn:idem:problem:refund-under-review");
    // An acquirer that never captured the charge refuses to refund it.
    let stranger = TestSim::start(Faults::default()).await;
    let elsewhere = serve(&db, &stranger, QUICK, &[]).await;
    let refused = Client::new(&elsewhere.url, &secret)
        .refund(&charge_id, &new_key(), r#"{"amount_cents": 300}"#)
        .await;
    assert_eq!(refused.status, 422, "{refused:?}");

    let ids = [
        (paid.json()["id"].clone(), "refund.succeeded", 2),
        (
            lied.json()["refund_id"].clone(),
            "refund.review_required",
            1,
        ),
        (refused.json()["refund"]["id"].clone(), "refund.failed", 2),
    ];
    let of_refund = |got: &[Received], path: &str, id: &serde_json::Value| {
        got.iter()
            .filter(|r| r.path == path && r.body["refund"]["id"] == *id)
            .count()
    };
    let got = receiver
        .wait_for("each refund's event", |got| {
            ids.iter().all(|(id, _, _)| of_refund(got, "/ok", id) == 1)
                && of_refund(got, "/flaky/0", &ids[0].0) == 1
        })
        .await;
    for (id, event, version) in &ids {
        let one = got
            .iter()
            .find(|r| r.path == "/ok" && r.body["refund"]["id"] == *id)
            .expect("received");
        assert_eq!(one.body["type"], *event, "{:?}", one.body);
        assert_eq!(one.body["version"], *version);
        assert_eq!(one.body["refund"]["charge_id"], charge_id.as_str());
        assert!(one.body.get("charge").is_none(), "{:?}", one.body);
    }
    assert_eq!(
        of_refund(&got, "/flaky/0", &ids[1].0) + of_refund(&got, "/flaky/0", &ids[2].0),
        0,
        "it hears paid refunds only"
    );
    // Delivered once each (the charge's capture too): nothing sent twice.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        receiver.received().len(),
        3 + 1 + 1,
        "{:#?}",
        receiver.received()
    );
    for (path, valid) in receiver.verified_by(&all_secret) {
        assert_eq!(valid, path == "/ok", "{path} by the /ok endpoint's secret");
    }
    let (events,): (i64,) =
        sqlx::query_as("select count(*) from outbox where event_type = 'refund.succeeded'")
            .fetch_one(&db.pool)
            .await
            .expect("outbox");
    assert_eq!(events, 1, "one event for the paid refund");
}

/// An authorization past its time that the acquirer has already closed (its
/// own expiry, a void made at its console) refuses the expiry void. The
/// refusal is final for the charge's expiry key: the charge stays
/// `authorized` for a person to decide, and no later pass of the reconciler
/// asks again (the reconciler's errors stay at the one refusal while passes
/// go on every 100 ms).
#[tokio::test]
async fn an_expiry_void_the_acquirer_refuses_is_final_and_not_asked_again() {
    let db = TestDb::new().await;
    let sim = TestSim::start(Faults::default()).await;
    let secret = db.merchant("loja").await;
    let server = serve(&db, &sim, QUICK, &["--authorization-ttl", "1s"]).await;
    let c = Client::new(&server.url, &secret);
    let authorized = c
        .charge(
            &new_key(),
            r#"{"order_id": 1, "amount_cents": 100, "capture": false}"#,
        )
        .await;
    assert_eq!(authorized.status, 201, "{authorized:?}");
    let id = authorized.json()["id"].as_str().expect("id").to_owned();
    let (authorization,): (String,) =
        sqlx::query_as("select acquirer_reference from charges where id = $1")
            .bind(&id)
            .fetch_one(&db.pool)
            .await
            .expect("the charge");
    let acquirer = idem_core::acquirer::AcquirerClient::new(&sim.url, Duration::from_secs(2), None)
        .expect("acquirer client");
    acquirer
        .void(&idem_core::acquirer::protocol::VoidRequest {
            reference: "voided-at-the-acquirer".to_owned(),
            authorization_reference: authorization,
            merchant: "loja".to_owned(),
        })
        .await
        .expect("closed at the acquirer, not by idem");

    let expiry_key = format!("idem-expiry:{id}");
    let started = Instant::now();
    loop {
        let status: Option<(String,)> =
            sqlx::query_as("select status from authorization_steps where idempotency_key = $1")
                .bind(&expiry_key)
                .fetch_optional(&db.pool)
                .await
                .expect("the expiry void");
        if status.as_ref().is_some_and(|(s,)| s == "failed") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the expiry void never refused: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let errors = || async {
        let metrics = c.send(c.raw().get(format!("{}/metrics", server.url))).await;
        String::from_utf8_lossy(&metrics.body)
            .lines()
            .find_map(|l| l.strip_prefix("idem_reconciler_charges_total{result=\"error\"} "))
            .map(|n| n.parse::<u64>().expect("a count"))
            .unwrap_or(0)
    };
    // The pass counts its errors when it ends, after the step is stored.
    let after_refusal = loop {
        let n = errors().await;
        if n >= 1 {
            break n;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the refusal never counted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(errors().await, after_refusal, "asked again after a refusal");
    assert_eq!(c.get_charge(&id).await.json()["status"], "authorized");
    let voids = sim.ledger().await.voids;
    assert_eq!(voids.len(), 1, "only the acquirer's own void: {voids:?}");
}

/// An authorization past `--authorization-ttl` is voided once by the
/// workers of two instances racing on it, at the acquirer with its own
/// reference, and announced by a signed `void.succeeded`; one partly
/// captured has the rest released (and becomes `captured`); one captured in
/// full is left alone.
#[tokio::test]
async fn authorizations_past_their_time_are_voided_once_by_racing_workers_and_announced() {
    let db = TestDb::new().await;
    let sim = TestSim::start(Faults::default()).await;
    let receiver = Receiver::start().await;
    let secret = db.merchant("loja").await;
    let (_, hook_secret) = add_endpoint(&db, "loja", &receiver.url("/ok"), &[]).await;
    let ttl = ["--authorization-ttl", "2s"];
    let (a, b) = (
        serve(&db, &sim, QUICK, &ttl).await,
        serve(&db, &sim, QUICK, &ttl).await,
    );
    let c = Client::new(&a.url, &secret);
    let authorize = |order: i64| {
        let c = &c;
        async move {
            let body = format!(r#"{{"order_id": {order}, "amount_cents": 100, "capture": false}}"#);
            let a = c.charge(&new_key(), &body).await;
            assert_eq!(a.status, 201, "{a:?}");
            a.json()["id"].as_str().expect("id").to_owned()
        }
    };
    let untouched = authorize(1).await;
    let partly = authorize(2).await;
    let captured = authorize(3).await;
    let part = c
        .capture(
            &partly,
            &new_key(),
            r#"{"amount_cents": 30, "final": false}"#,
        )
        .await;
    assert_eq!(part.status, 201, "{part:?}");
    let all = c.capture(&captured, &new_key(), "").await;
    assert_eq!(all.status, 201, "{all:?}");

    let started = Instant::now();
    loop {
        let (u, p) = (
            c.get_charge(&untouched).await.json(),
            c.get_charge(&partly).await.json(),
        );
        if u["status"] == "voided" && p["status"] == "captured" {
            assert_eq!(p["amount_captured_cents"], 30);
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never expired: {u} {p}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ledger = sim.ledger().await;
    let released: Vec<i64> = ledger.voids.iter().map(|v| v.released_cents).collect();
    assert_eq!(
        released.len(),
        2,
        "one void each, whatever raced: {released:?}"
    );
    assert_eq!(released.iter().sum::<i64>(), 100 + 70);
    assert_eq!(c.get_charge(&captured).await.json()["status"], "captured");
    let got = receiver
        .wait_for("the two voids announced", |got| {
            got.iter()
                .filter(|r| r.body["type"] == "void.succeeded")
                .count()
                == 2
        })
        .await;
    let voided: Vec<_> = got
        .iter()
        .filter(|r| r.body["type"] == "void.succeeded")
        .map(|r| {
            r.body["void"]["charge_id"]
                .as_str()
                .expect("charge")
                .to_owned()
        })
        .collect();
    assert!(
        voided.contains(&untouched) && voided.contains(&partly),
        "{voided:?}"
    );
    assert!(
        receiver
            .verified_by(&hook_secret)
            .iter()
            .all(|(_, valid)| *valid),
        "every delivery verifies"
    );
    drop(b);
}

//! Recovery: the reconciler alone after a crash at each step, the capture whose
//! answer could not be saved, database outages, review past the deadline, and
//! reconcilers racing each other.

use std::time::{Duration, Instant};

use idem::workers::{Reconciler, ReconcilerConfig};
use idem_core::idempotency::EngineConfig;
use idem_core::store::{Backend, Store};
use idem_lab::sim::{Fault, Faults};

use crate::helpers::*;

/// Flags for processes whose leases a test waits out.
#[cfg(feature = "crash-points")]
const SHORT_LEASE: [&str; 4] = ["--lease", "1s", "--acquirer-timeout", "500ms"];

async fn charge_status(db: &TestDb, order_id: i64) -> String {
    let (status,): (String,) = sqlx::query_as("select status from charges where order_id = $1")
        .bind(order_id)
        .fetch_one(&db.pool)
        .await
        .expect("charge");
    status
}

/// Kill the server at each boundary of the request path; then only
/// `idem reconcile --once` runs (no client retry) until every charge is final.
#[cfg(feature = "crash-points")]
#[tokio::test]
async fn after_a_crash_at_any_step_the_reconciler_alone_settles_the_charge_once() {
    let db = TestDb::new().await;
    let sim = TestSim::start(latency(50)).await;
    let secret = db.merchant("loja").await;
    let points = ["after-claim", "after-acquirer", "mid-finalize"];
    let mut keys = Vec::new();
    for (order, point) in (1..).zip(points) {
        let mut server = ServeProcess::start_env(
            &db,
            &sim,
            &[&SHORT_LEASE[..], &["--no-workers"]].concat(),
            &[("IDEM_CRASH_AT", point)],
        )
        .await;
        let c = Client::new(&server.url, &secret);
        let key = new_key();
        let sent = c
            .raw()
            .post(format!("{}/v1/charges", c.base))
            .bearer_auth(&secret)
            .header("Idempotency-Key", &key)
            .header("content-type", "application/json")
            .body(body(order, 100 * order))
            .send()
            .await;
        let answer = sent.as_ref().map(|r| r.status());
        let exit = tokio::time::timeout(
            Duration::from_secs(30),
            tokio::task::spawn_blocking(move || server.wait_exit()),
        )
        .await
        .unwrap_or_else(|_| panic!("{point}: the server never crashed; it answered {answer:?}"))
        .expect("join");
        assert!(!exit.success(), "{point}: the server died ({exit:?})");
        assert!(
            sent.is_err() || !sent.as_ref().is_ok_and(|r| r.status().is_success()),
            "{point}: no answer"
        );
        keys.push((key, order));
    }
    assert_eq!(db.count("charges").await, 3, "each crash left its claim");

    let started = Instant::now();
    for (_, order) in &keys {
        while charge_status(&db, *order).await == "processing" {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "order {order} never settled"
            );
            let (status, _, stderr) = run_idem(
                &db,
                &[
                    &["reconcile", "--once", "--acquirer-url", &sim.url][..],
                    &SHORT_LEASE,
                ]
                .concat(),
            )
            .await;
            assert!(status.success(), "{stderr}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(charge_status(&db, *order).await, "captured");
    }
    let ledger = sim.ledger().await;
    assert_eq!(ledger.captures.len(), 3, "exactly one capture per intent");
    assert!(ledger.counts.iter().all(|c| c.captures == 1));

    // A client retrying afterwards gets the stored outcome.
    let server = ServeProcess::start(&db, &sim, &["--no-workers"]).await;
    let c = Client::new(&server.url, &secret);
    for (key, order) in &keys {
        let a = c.charge(key, &body(*order, 100 * order)).await;
        assert_eq!(a.status, 201, "{:?}", a.body);
        assert!(
            a.replayed(),
            "order {order}: the reconciler's outcome is replayed"
        );
        assert_eq!(a.json()["status"], "captured");
    }
}

/// The capture succeeded but the database went away before its answer was
/// saved: the client gets 503, nothing is lost, and once the database is back
/// a retry stores the captured outcome. One capture.
#[tokio::test]
async fn a_capture_whose_answer_could_not_be_saved_is_recovered_once() {
    if !runs_on(
        Backend::Postgres,
        "it cuts the network between idem and its database server; an embedded SQLite file has none",
    ) {
        return;
    }
    let db = TestDb::new().await;
    let sim = TestSim::start(latency(600)).await;
    let secret = db.merchant("loja").await;
    let proxy = DbProxy::start(&db).await;
    let store = Store::connect(&proxy.url, 4)
        .await
        .expect("connect via proxy");
    let config = EngineConfig {
        lease: Duration::from_secs(2),
        ..test_config()
    };
    let timeout = Duration::from_secs(1);
    let app = TestApp::start_on(
        test_engine(store.clone(), &sim, config, timeout),
        store,
        timeout,
    )
    .await;
    let c = Client::new(&app.url, &secret);
    let key = new_key();

    let first = tokio::spawn({
        let (c, key) = (c.clone(), key.clone());
        async move { c.charge(&key, &body(9, 25000)).await }
    });
    while db.count("idempotency_keys").await == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The claim is committed; give its answer time to come back through the
    // proxy (cutting it on the way would fail the claim itself, a different
    // case), well within the acquirer's 600 ms.
    tokio::time::sleep(Duration::from_millis(150)).await;
    proxy.cut(); // while the acquirer captures
    let first = first.await.expect("join");
    assert_eq!(first.status, 503, "{:?}", first.body);
    assert_eq!(first.problem_type(), "urn:idem:problem:service-unavailable");
    assert_eq!(sim.ledger().await.captures.len(), 1, "the money moved");
    assert_eq!(
        charge_status(&db, 9).await,
        "processing",
        "nothing lost, nothing invented"
    );

    let ready = c.send(c.raw().get(format!("{}/readyz", app.url))).await;
    assert_eq!(
        ready.status, 503,
        "readiness is red while the database is away"
    );
    let during = c.charge(&new_key(), &body(10, 100)).await;
    assert_eq!(during.status, 503);

    proxy.restore();
    let settled = c.charge_until_final(&key, &body(9, 25000)).await;
    assert_eq!(settled.status, 201, "{:?}", settled.body);
    assert_eq!(settled.json()["status"], "captured");
    let ready = c.send(c.raw().get(format!("{}/readyz", app.url))).await;
    assert_eq!(ready.status, 200, "recovered without a restart");
    assert_eq!(sim.ledger().await.captures.len(), 1, "one capture");
}

#[tokio::test]
async fn past_the_deadline_the_reconciler_marks_for_review_and_never_decides_alone() {
    let Env {
        db,
        sim,
        app: _app,
        client: c,
    } = Env::start_with(Faults::default(), test_config(), Duration::from_millis(300)).await;
    sim.set_faults(failing(Fault::ErrorBefore)).await;
    let key = new_key();
    let first = c.charge(&key, &body(1, 100)).await;
    assert_eq!(first.status, 503);

    let engine = test_engine(
        db.store.clone(),
        &sim,
        test_config(),
        Duration::from_millis(300),
    );
    let reconciler = Reconciler::new(
        engine.clone(),
        db.store.clone(),
        ReconcilerConfig::new(Duration::from_millis(50), Duration::from_secs(3600)),
    );
    let report = reconciler.pass().await.expect("pass");
    assert_eq!((report.backed_off, report.settled), (1, 0), "{report:?}");
    let (attempts, later): (i64, i64) = sqlx::query_as(&format!(
        "select cast(reconcile_attempts as bigint),
                case when next_reconcile_at > {} then 1 else 0 end from charges",
        db.now()
    ))
    .fetch_one(&db.pool)
    .await
    .expect("charge");
    assert_eq!((attempts, later), (1, 1), "backed off");
    assert_eq!(
        reconciler.pass().await.expect("pass"),
        Default::default(),
        "not due yet"
    );

    let impatient = Reconciler::new(
        engine,
        db.store.clone(),
        ReconcilerConfig::new(Duration::from_millis(50), Duration::ZERO),
    );
    db.exec(&format!(
        "update charges set next_reconcile_at = {}",
        db.now()
    ))
    .await;
    let report = impatient.pass().await.expect("pass");
    assert_eq!(report.marked_for_review, 1, "{report:?}");
    assert_eq!(
        charge_status(&db, 1).await,
        "processing",
        "never captured or failed without the acquirer"
    );

    let (status, stdout, _) = run_idem(&db, &["charges", "stuck"]).await;
    assert!(status.success());
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(lines[1].contains("settle deadline"), "{stdout}");

    // The charge is a person's now: a client's retry, the acquirer healthy
    // again, is told so and captures nothing behind the reviewer's back.
    sim.set_faults(Faults::default()).await;
    let retry = c.charge(&key, &body(1, 100)).await;
    assert_eq!(retry.status, 503, "{:?}", retry.body);
    assert_eq!(retry.problem_type(), "urn:idem:problem:charge-under-review");
    assert!(sim.ledger().await.captures.is_empty());
}

#[tokio::test]
async fn reconcilers_racing_each_other_settle_each_charge_once() {
    const ORPHANS: i64 = 20;
    let Env {
        db,
        sim,
        app: _app,
        client: c,
    } = Env::start_with(Faults::default(), test_config(), Duration::from_millis(300)).await;
    sim.set_faults(failing(Fault::ErrorAfter)).await;
    for order in 1..=ORPHANS {
        assert_eq!(c.charge(&new_key(), &body(order, 100)).await.status, 503);
    }
    sim.set_faults(Faults::default()).await;

    let reconcilers: Vec<_> = (0..3)
        .map(|_| test_reconciler_with(&db, &sim, Duration::from_secs(1), Duration::from_secs(3600)))
        .collect();
    let reports = futures_util::future::join_all(reconcilers.iter().map(|r| r.pass())).await;
    let settled: u32 = reports
        .iter()
        .map(|r| r.as_ref().expect("pass").settled)
        .sum();
    assert_eq!(
        settled, ORPHANS as u32,
        "each charge settled by exactly one reconciler: {reports:?}"
    );
    let (attempts,): (i64,) =
        sqlx::query_as("select cast(sum(attempt) as bigint) from idempotency_keys")
            .fetch_one(&db.pool)
            .await
            .expect("attempts");
    assert_eq!(attempts, 2 * ORPHANS, "each record taken over exactly once");
    assert_eq!(sim.ledger().await.captures.len(), ORPHANS as usize);
}

/// A key is stored unquoted, so one that starts with a quote (sent as `"\"k"`)
/// must not be read back as a header value. Found by scripts/fuzz-api: such a
/// key made every reconciler pass fail, so no orphan was settled at all.
#[tokio::test]
async fn keys_that_start_with_a_quote_do_not_stop_the_reconciler() {
    let Env {
        db,
        sim,
        app: _app,
        client: c,
    } = Env::start_with(Faults::default(), test_config(), Duration::from_millis(300)).await;
    sim.set_faults(failing(Fault::ErrorAfter)).await;
    // The keys `"k`, `"k"` (which a header parser would read as `k`) and a plain one.
    let keys = [r#""\"k""#, r#""\"k\"""#, "plain"];
    for (order, key) in (1..).zip(keys) {
        assert_eq!(c.charge(key, &body(order, 100)).await.status, 503, "{key}");
    }
    sim.set_faults(Faults::default()).await;

    let reconciler =
        test_reconciler_with(&db, &sim, Duration::from_secs(1), Duration::from_secs(3600));
    let report = reconciler
        .pass()
        .await
        .expect("the pass reads every stored key");
    assert_eq!(report.settled, 3, "{report:?}");
    for (order, key) in (1..).zip(keys) {
        assert_eq!(charge_status(&db, order).await, "captured", "{key}");
        let replay = c.charge(key, &body(order, 100)).await;
        assert_eq!((replay.status, replay.replayed()), (201, true), "{key}");
    }
    assert_eq!(sim.ledger().await.captures.len(), 3);
}

/// A server started while the database is unreachable comes up, answers 503
/// (readiness red, never a panic), and works once the database is back.
#[tokio::test]
async fn a_server_started_during_a_database_outage_recovers_by_itself() {
    if !runs_on(
        Backend::Postgres,
        "it cuts the network between idem and its database server; an embedded SQLite file has none",
    ) {
        return;
    }
    let db = TestDb::new().await;
    let sim = TestSim::start(Faults::default()).await;
    let secret = db.merchant("loja").await;
    let proxy = DbProxy::start(&db).await;
    proxy.cut();
    let server = ServeProcess::start_env(&db, &sim, &[], &[("DATABASE_URL", &proxy.url)]).await;
    let c = Client::new(&server.url, &secret);

    assert_eq!(
        c.send(c.raw().get(format!("{}/healthz", server.url)))
            .await
            .status,
        200
    );
    let ready = c.send(c.raw().get(format!("{}/readyz", server.url))).await;
    assert_eq!(ready.status, 503);
    assert_eq!(ready.problem_type(), "urn:idem:problem:service-unavailable");
    let key = new_key();
    let refused = c.charge(&key, &body(1, 100)).await;
    assert_eq!(refused.status, 503, "{:?}", refused.body);
    assert!(refused.header("retry-after").is_some());

    proxy.restore();
    let started = Instant::now();
    while c
        .send(c.raw().get(format!("{}/readyz", server.url)))
        .await
        .status
        != 200
    {
        assert!(started.elapsed() < Duration::from_secs(10), "never ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let a = c.charge(&key, &body(1, 100)).await;
    assert_eq!(a.status, 201, "{:?}", a.body);
    assert!(!a.replayed(), "the refused attempt stored nothing");
    assert_eq!(sim.ledger().await.captures.len(), 1);
}

/// A committed claim the database lost (a failover that dropped an
/// asynchronous replica's last commits, a restore from backup) cannot charge
/// twice: the retry claims again, and the reference is the intent's own
/// (merchant, key, fingerprint), so it is the one the first attempt sent, and
/// the acquirer answers with the first capture instead of moving money again.
#[tokio::test]
async fn a_claim_the_database_lost_is_made_again_under_the_same_reference_and_charges_once() {
    // Without the replay cache: an instance that remembers the outcome would
    // answer the retry from memory (the first answer, byte for byte) and never
    // reach the database this test is about (docs/deployment.md).
    let Env {
        db,
        sim,
        app: _app,
        client: c,
    } = Env::start_with(
        Faults::default(),
        EngineConfig {
            replay_cache_bytes: 0,
            ..test_config()
        },
        Duration::from_secs(2),
    )
    .await;
    let key = new_key();
    let first = c.charge(&key, &body(7, 25000)).await;
    assert_eq!(first.status, 201, "{:?}", first.body);

    // The database forgets the claim, its charge and its event.
    db.exec("delete from idempotency_keys").await;
    db.exec("delete from outbox").await;
    db.exec("delete from charges").await;

    let again = c.charge(&key, &body(7, 25000)).await;
    assert_eq!(again.status, 201, "{:?}", again.body);
    assert!(!again.replayed(), "the record was gone: a new claim");
    assert_eq!(
        again.json()["acquirer_reference"],
        first.json()["acquirer_reference"],
        "the same intent, the same reference"
    );
    assert_eq!(
        sim.ledger().await.captures.len(),
        1,
        "one capture for one intent"
    );

    // Another request under the key, once the key is free again, is another
    // intent: another reference, another capture.
    db.exec("delete from idempotency_keys").await;
    let other = c.charge(&key, &body(8, 25000)).await;
    assert_eq!(other.status, 201, "{:?}", other.body);
    assert_ne!(
        other.json()["acquirer_reference"],
        first.json()["acquirer_reference"]
    );
    assert_eq!(sim.ledger().await.captures.len(), 2);
}

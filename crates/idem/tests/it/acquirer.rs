//! The acquirer at its worst legal behaviour: statuses that are not its word,
//! a first POST that hangs while a retry arrives (`409`), `Retry-After`, and
//! the reconciler's last look before a person is asked. Only `201`, `402` and
//! `422` are final; everything else leaves the charge `processing`.

use std::time::Duration;

use idem_core::store::Backend;
use idem_lab::sim::{Fault, Faults};

use crate::helpers::*;

/// A real `idem serve` that gives up on the acquirer after 500 ms, with no
/// reconciler of its own, so only the client's retries settle a charge.
const SERVE_FLAGS: [&str; 5] = [
    "--acquirer-timeout",
    "500ms",
    "--lease",
    "3s",
    "--no-workers",
];

/// The scripted fault for the next capture only.
fn once(fault: Fault) -> Faults {
    Faults {
        fault,
        fault_count: Some(1),
        ..Faults::default()
    }
}

async fn status_of(db: &TestDb, order_id: i64) -> String {
    let (status,): (String,) = sqlx::query_as("select status from charges where order_id = $1")
        .bind(order_id)
        .fetch_one(&db.pool)
        .await
        .expect("charge");
    status
}

async fn awaiting_review(db: &TestDb) -> i64 {
    let (n,): (i64,) =
        sqlx::query_as("select count(*) from charges where review_since is not null")
            .fetch_one(&db.pool)
            .await
            .expect("review");
    n
}

async fn captures_of(sim: &TestSim, order_id: i64) -> u64 {
    sim.ledger()
        .await
        .counts
        .iter()
        .find(|n| n.order_id == order_id)
        .map_or(0, |n| n.captures)
}

/// A proxy's `408`/`429`, a wrong route's `404`, the acquirer's own `409`, a
/// redirect, a `2xx` that is not `201`, and a `201` or `402` whose body is not
/// this reference's outcome: none says whether money moved, so
/// each is a `503` with the charge still `processing`, and the retry captures
/// it exactly once. Each is counted by status in `/metrics`.
#[tokio::test]
async fn every_answer_that_is_not_the_acquirers_word_is_503_then_one_capture() {
    let db = TestDb::new().await;
    let sim = TestSim::start(Faults::default()).await;
    let server = ServeProcess::start(&db, &sim, &SERVE_FLAGS).await;
    let c = Client::new(&server.url, &db.merchant("loja").await);

    // 201 and 402 come with a text body, not this reference's outcome.
    for (order, status) in (1..).zip([404u16, 408, 409, 429, 301, 200, 201, 402]) {
        sim.set_faults(once(Fault::Status(status))).await;
        let key = new_key();
        let first = c.charge(&key, &body(order, 100)).await;
        assert_eq!(first.status, 503, "{status}: {:?}", first.body);
        assert_eq!(
            first.problem_type(),
            "urn:idem:problem:outcome-unknown",
            "{status}"
        );
        assert!(first.header("retry-after").is_some(), "{status}");
        assert_eq!(status_of(&db, order).await, "processing", "{status}");

        let retry = c.charge(&key, &body(order, 100)).await;
        assert_eq!(retry.status, 201, "{status}: {:?}", retry.body);
        assert_eq!(captures_of(&sim, order).await, 1, "{status}");
    }

    let metrics = c.send(c.raw().get(format!("{}/metrics", server.url))).await;
    let text = String::from_utf8_lossy(&metrics.body);
    for status in ["404", "408", "409", "429", "301", "200"] {
        let line = format!("idem_acquirer_unknown_total{{cause=\"{status}\"}} 1");
        assert!(text.contains(&line), "{line} in\n{text}");
    }
    let line = "idem_acquirer_unknown_total{cause=\"body\"} 2";
    assert!(text.contains(line), "{line} in\n{text}");
}

/// The article's timeout, against an acquirer that behaves like a real one:
/// the first POST hangs past idem's acquirer timeout (and captures); the
/// retry's POST of the same reference is answered `409` while the first is
/// still in flight. That `409` is no failure: idem answers `503` and keeps
/// the charge `processing` until the acquirer's word, a `201`, arrives.
#[tokio::test]
async fn a_first_post_that_hangs_then_captures_is_never_a_stored_failure() {
    let db = TestDb::new().await;
    let sim = TestSim::start(Faults {
        hang_ms: 3_000,
        ..once(Fault::Hang)
    })
    .await;
    let server = ServeProcess::start(&db, &sim, &SERVE_FLAGS).await;
    let c = Client::new(&server.url, &db.merchant("loja").await);
    let key = new_key();

    let first = c.charge(&key, &body(1, 25_000)).await;
    assert_eq!(first.status, 503, "{:?}", first.body);
    // The retry re-drives the same reference while the first POST hangs.
    let retry = c.charge(&key, &body(1, 25_000)).await;
    assert_eq!(retry.status, 503, "the acquirer's 409: {:?}", retry.body);
    assert_eq!(retry.problem_type(), "urn:idem:problem:outcome-unknown");
    assert_eq!(
        status_of(&db, 1).await,
        "processing",
        "never a stored failure"
    );

    let last = c.charge_until_final(&key, &body(1, 25_000)).await;
    assert_eq!(last.status, 201, "{:?}", last.body);
    assert_eq!(last.json()["status"], "captured");
    let replay = c.charge(&key, &body(1, 25_000)).await;
    assert_eq!((replay.status, &replay.body), (201, &last.body));
    assert_eq!(captures_of(&sim, 1).await, 1, "one capture");
    assert_eq!(status_of(&db, 1).await, "captured");
}

/// A `429` with `Retry-After: 30` is passed on to the client, and the
/// reconciler leaves the charge alone that long, on the live path and on its
/// own tries alike (where its own backoff would have been a second or two).
#[tokio::test]
async fn the_acquirers_retry_after_is_honoured_by_the_client_answer_and_the_reconciler() {
    let Env {
        db,
        sim,
        app: _app,
        client: c,
    } = Env::start_with(Faults::default(), test_config(), Duration::from_millis(500)).await;
    sim.set_faults(Faults {
        retry_after_secs: Some(30),
        ..once(Fault::Status(429))
    })
    .await;
    let first = c.charge(&new_key(), &body(1, 100)).await;
    assert_eq!(first.status, 503);
    assert_eq!(first.header("retry-after"), Some("30"));

    let reconciler = test_reconciler(&db, &sim, Duration::from_secs(3600));
    assert_eq!(
        reconciler.pass().await.expect("pass"),
        Default::default(),
        "not before the acquirer's Retry-After"
    );

    let wait_at_least = |seconds: i64| {
        let db = &db;
        async move {
            let sql = match db.backend {
                Backend::Postgres => format!(
                    "select count(*) from charges where next_reconcile_at > now() + interval '{seconds} seconds'"
                ),
                Backend::Sqlite | Backend::MariaDb => format!(
                    "select count(*) from charges where next_reconcile_at > {} + {}",
                    db.now(),
                    seconds * 1000
                ),
            };
            let (n,): (i64,) = sqlx::query_as(&sql)
                .fetch_one(&db.pool)
                .await
                .expect("schedule");
            n == 1
        }
    };
    assert!(wait_at_least(25).await, "the live answer scheduled 30 s");

    db.exec(&format!(
        "update charges set next_reconcile_at = {}",
        db.now()
    ))
    .await;
    sim.set_faults(Faults {
        retry_after_secs: Some(20),
        ..once(Fault::Status(503))
    })
    .await;
    let report = reconciler.pass().await.expect("pass");
    assert_eq!(report.backed_off, 1, "{report:?}");
    assert!(
        wait_at_least(15).await,
        "the reconciler's try waits 20 s, not 1 s"
    );

    db.exec(&format!(
        "update charges set next_reconcile_at = {}",
        db.now()
    ))
    .await;
    let report = reconciler.pass().await.expect("pass");
    assert_eq!(report.settled, 1, "{report:?}");
    assert_eq!(captures_of(&sim, 1).await, 1);
}

/// A long reconciler outage leaves charges past the settle deadline whose
/// outcome the acquirer knows. One last look settles them; only a charge the
/// acquirer has no outcome for goes to a person, and nothing is captured then.
#[tokio::test]
async fn past_the_deadline_one_last_look_settles_what_the_acquirer_knows() {
    let Env {
        db,
        sim,
        app: _app,
        client: c,
    } = Env::start_with(Faults::default(), test_config(), Duration::from_millis(500)).await;
    // Order 1: captured, answer lost. Order 2: never reached the acquirer.
    sim.set_faults(once(Fault::ErrorAfter)).await;
    let key = new_key();
    assert_eq!(c.charge(&key, &body(1, 100)).await.status, 503);
    sim.set_faults(once(Fault::ErrorBefore)).await;
    assert_eq!(c.charge(&new_key(), &body(2, 100)).await.status, 503);

    let late = test_reconciler(&db, &sim, Duration::ZERO);
    let report = late.pass().await.expect("pass");
    assert_eq!(
        (report.settled, report.marked_for_review),
        (1, 1),
        "{report:?}"
    );
    assert_eq!(status_of(&db, 1).await, "captured");
    assert_eq!(status_of(&db, 2).await, "processing");
    let replay = c.charge(&key, &body(1, 100)).await;
    assert_eq!((replay.status, replay.replayed()), (201, true));
    assert_eq!(
        captures_of(&sim, 2).await,
        0,
        "the last look never captures"
    );
    let stuck = awaiting_review(&db).await;
    assert_eq!(stuck, 1);
}

/// One charge that cannot be marked for review (here a trigger refuses it)
/// is counted as an error; the pass goes on and marks the others.
#[tokio::test]
async fn a_charge_that_cannot_be_marked_does_not_stop_the_pass() {
    let Env {
        db,
        sim,
        app: _app,
        client: c,
    } = Env::start_with(
        failing(Fault::ErrorBefore),
        test_config(),
        Duration::from_millis(500),
    )
    .await;
    for order in 1..=3 {
        assert_eq!(c.charge(&new_key(), &body(order, 100)).await.status, 503);
    }
    db.refuse(
        "refuse_review",
        "before update of review_since on charges",
        Some("new.order_id = 1"),
    )
    .await;
    let late = test_reconciler(&db, &sim, Duration::ZERO);
    let report = late.pass().await.expect("the pass itself succeeds");
    assert_eq!(
        (report.marked_for_review, report.errors),
        (2, 1),
        "{report:?}"
    );
    let stuck = awaiting_review(&db).await;
    assert_eq!(stuck, 2);
}

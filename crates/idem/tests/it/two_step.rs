//! Two-step payments over the API (issue 41): a charge authorized with
//! `"capture": false`, captured in parts or voided, each step under its own
//! key, the sum and the order decided by the database before the acquirer is
//! called, and the acquirer's ledger as the ground truth. Real `idem serve`
//! processes, a real simulator over loopback; each test runs on PostgreSQL
//! and on SQLite.

use std::sync::Arc;
use std::time::Duration;

use idem_lab::sim::{Fault, Faults, Ledger};
use tokio::sync::Barrier;

use crate::helpers::*;

/// An authorized charge of `amount` cents: its id and its reference.
async fn authorized(client: &Client, order: i64, amount: i64) -> (String, String) {
    let body = format!(r#"{{"order_id": {order}, "amount_cents": {amount}, "capture": false}}"#);
    let a = client.charge(&new_key(), &body).await;
    assert_eq!(a.status, 201, "{a:?}");
    let charge = a.json();
    assert_eq!(charge["status"], "authorized", "{charge}");
    assert_eq!(charge["amount_capturable_cents"], amount, "{charge}");
    assert_eq!(charge["amount_captured_cents"], 0, "{charge}");
    (
        charge["id"].as_str().expect("id").to_owned(),
        charge["acquirer_reference"]
            .as_str()
            .expect("reference")
            .to_owned(),
    )
}

fn partial(cents: i64) -> String {
    format!(r#"{{"amount_cents": {cents}, "final": false}}"#)
}

/// The ledger's captures of the authorization under `reference`: how many,
/// and their sum.
fn captured_in(ledger: &Ledger, reference: &str) -> (usize, i64) {
    let captures: Vec<_> = ledger
        .authorization_captures
        .iter()
        .filter(|c| c.authorization_reference == reference)
        .collect();
    (
        captures.len(),
        captures.iter().map(|c| c.amount_cents).sum(),
    )
}

fn voids_of(ledger: &Ledger, reference: &str) -> usize {
    ledger
        .voids
        .iter()
        .filter(|v| v.authorization_reference == reference)
        .count()
}

async fn instances(
    db: &TestDb,
    sim: &TestSim,
    n: usize,
    secret: &str,
) -> (Vec<ServeProcess>, Vec<Client>) {
    let mut servers = Vec::new();
    for _ in 0..n {
        servers.push(ServeProcess::start(db, sim, &[]).await);
    }
    let clients = servers
        .iter()
        .map(|s| Client::new(&s.url, secret))
        .collect();
    (servers, clients)
}

#[tokio::test]
async fn an_authorization_is_captured_in_parts_refunded_across_them_and_a_one_step_charge_is_unchanged(
) {
    let db = TestDb::new().await;
    let sim = TestSim::start(Faults::default()).await;
    let secret = db.merchant("loja").await;
    let (_servers, clients) = instances(&db, &sim, 1, &secret).await;
    let client = &clients[0];

    // The default is the one-step charge, its body as it always was.
    let one_step = client.charge(&new_key(), &body(1, 500)).await;
    assert_eq!(one_step.status, 201);
    let fields: Vec<String> = one_step
        .json()
        .as_object()
        .expect("object")
        .keys()
        .cloned()
        .collect();
    assert_eq!(
        fields,
        [
            "acquirer_reference",
            "amount_cents",
            "created_at",
            "currency",
            "decline_reason",
            "id",
            "order_id",
            "status"
        ],
        "a one-step charge's answer has no new field"
    );
    let id = one_step.json()["id"].as_str().expect("id").to_owned();
    let refused = client.capture(&id, &new_key(), "").await;
    assert_eq!(refused.status, 422, "{refused:?}");
    assert_eq!(
        refused.problem_type(),
        "urn:idem:problem:charge-not-authorized"
    );

    let (charge_id, reference) = authorized(client, 2, 100).await;
    let first = client.capture(&charge_id, &new_key(), &partial(30)).await;
    assert_eq!(first.status, 201, "{first:?}");
    let capture = first.json();
    assert_eq!(capture["status"], "succeeded");
    assert_eq!(capture["amount_cents"], 30);
    assert_eq!(capture["final"], false);
    assert!(capture["id"].as_str().expect("id").starts_with("cp_"));
    let location = first.header("location").expect("Location").to_owned();
    assert_eq!(client.get(&location).await.json(), capture);

    let charge = client.get_charge(&charge_id).await.json();
    assert_eq!(charge["status"], "authorized");
    assert_eq!(charge["amount_captured_cents"], 30);
    assert_eq!(charge["amount_capturable_cents"], 70);

    // A capture above what remains stores nothing and leaves its key free.
    let key = new_key();
    let over = client.capture(&charge_id, &key, &partial(71)).await;
    assert_eq!(over.status, 422, "{over:?}");
    assert_eq!(
        over.problem_type(),
        "urn:idem:problem:capture-exceeds-authorization"
    );
    assert_eq!(over.json()["remaining_cents"], 70);
    // The same key, now with a capture that fits, is a new claim.
    let fits = client.capture(&charge_id, &key, &partial(50)).await;
    assert_eq!(fits.status, 201, "{fits:?}");

    // Refunds give back what was captured, across captures, while the rest
    // is still authorized.
    let too_much = client
        .refund(&charge_id, &new_key(), r#"{"amount_cents": 81}"#)
        .await;
    assert_eq!(too_much.status, 422, "{too_much:?}");
    assert_eq!(too_much.json()["remaining_cents"], 80);
    let back = client
        .refund(&charge_id, &new_key(), r#"{"amount_cents": 80}"#)
        .await;
    assert_eq!(back.status, 201, "{back:?}");

    // The final capture takes what remains and closes the authorization.
    let last = client.capture(&charge_id, &new_key(), "").await;
    assert_eq!(last.status, 201, "{last:?}");
    assert_eq!(last.json()["amount_cents"], 20);
    assert_eq!(last.json()["final"], true);
    let charge = client.get_charge(&charge_id).await.json();
    assert_eq!(charge["status"], "captured");
    assert_eq!(charge["amount_captured_cents"], 100);
    assert_eq!(charge["amount_capturable_cents"], 0);
    let after = client.capture(&charge_id, &new_key(), &partial(1)).await;
    assert_eq!(
        after.problem_type(),
        "urn:idem:problem:charge-not-authorized"
    );
    let void = client.void(&charge_id, &new_key()).await;
    assert_eq!(
        void.problem_type(),
        "urn:idem:problem:charge-not-authorized"
    );

    let listed = client
        .get(&format!("/v1/charges/{charge_id}/captures"))
        .await
        .json();
    assert_eq!(listed.as_array().map(Vec::len), Some(3));
    let ledger = sim.ledger().await;
    assert_eq!(captured_in(&ledger, &reference), (3, 100));
    assert_eq!(
        ledger
            .authorizations
            .iter()
            .filter(|a| a.reference == reference)
            .count(),
        1
    );
}

#[tokio::test]
async fn thirty_partial_captures_of_ten_over_three_instances_capture_exactly_the_authorization() {
    let db = TestDb::new().await;
    let sim = TestSim::start(Faults::default()).await;
    let secret = db.merchant("loja").await;
    let (_servers, clients) = instances(&db, &sim, 3, &secret).await;
    let (charge_id, reference) = authorized(&clients[0], 1, 100).await;

    let start = Arc::new(Barrier::new(30));
    let clients = Arc::new(clients);
    let captures = (0..30)
        .map(|n| {
            let (clients, start, charge_id) = (clients.clone(), start.clone(), charge_id.clone());
            tokio::spawn(async move {
                let client = &clients[n % 3];
                start.wait().await;
                client.capture(&charge_id, &new_key(), &partial(10)).await
            })
        })
        .collect::<Vec<_>>();
    let mut succeeded = 0;
    for c in captures {
        let a = c.await.expect("join");
        match a.status {
            201 => succeeded += 1,
            422 => {
                // Refused while the authorization was still open with nothing
                // left, or once the tenth capture had closed it.
                let kind = a.problem_type();
                assert!(
                    kind == "urn:idem:problem:capture-exceeds-authorization"
                        || kind == "urn:idem:problem:charge-not-authorized",
                    "{a:?}"
                );
            }
            other => panic!("unexpected {other}: {a:?}"),
        }
    }
    assert_eq!(succeeded, 10, "exactly the authorization is captured");
    assert_eq!(captured_in(&sim.ledger().await, &reference), (10, 100));
    let charge = clients[1].get_charge(&charge_id).await.json();
    assert_eq!(charge["status"], "captured");
    assert_eq!(charge["amount_captured_cents"], 100);
    assert_eq!(
        db.count("authorization_steps").await,
        10,
        "a refusal stores nothing"
    );
}

/// A void and a capture sent at once on two instances, many times: whichever
/// the database ordered first, the answers, the charge and the acquirer's
/// ledger tell the same story, and no capture follows a void.
#[tokio::test]
async fn a_void_and_a_capture_sent_at_once_agree_on_one_order_every_time() {
    let db = TestDb::new().await;
    let sim = TestSim::start(Faults::default()).await;
    let secret = db.merchant("loja").await;
    let (_servers, clients) = instances(&db, &sim, 2, &secret).await;
    let clients = Arc::new(clients);
    let (mut capture_first, mut void_first) = (0, 0);
    for order in 1..=50 {
        let (charge_id, reference) = authorized(&clients[0], order, 100).await;
        let start = Arc::new(Barrier::new(2));
        let capture = {
            let (clients, start, charge_id) = (clients.clone(), start.clone(), charge_id.clone());
            tokio::spawn(async move {
                start.wait().await;
                clients[0]
                    .capture(&charge_id, &new_key(), &partial(60))
                    .await
            })
        };
        let void = {
            let (clients, start, charge_id) = (clients.clone(), start.clone(), charge_id.clone());
            tokio::spawn(async move {
                start.wait().await;
                clients[1].void(&charge_id, &new_key()).await
            })
        };
        let (capture, void) = (capture.await.expect("join"), void.await.expect("join"));
        let charge = clients[0].get_charge(&charge_id).await.json();
        let ledger = sim.ledger().await;
        let (captures, captured) = captured_in(&ledger, &reference);
        let voids = voids_of(&ledger, &reference);
        match (capture.status, void.status) {
            // The capture first, then the void released the rest.
            (201, 201) => {
                capture_first += 1;
                assert_eq!(void.json()["amount_cents"], 40, "{void:?}");
                assert_eq!((captures, captured, voids), (1, 60, 1));
                assert_eq!(charge["status"], "captured", "{charge}");
                assert_eq!(charge["amount_captured_cents"], 60);
                let capture_at = ledger
                    .authorization_captures
                    .iter()
                    .find(|c| c.authorization_reference == reference)
                    .expect("capture")
                    .at_micros;
                let void_at = ledger
                    .voids
                    .iter()
                    .find(|v| v.authorization_reference == reference)
                    .expect("void")
                    .at_micros;
                assert!(capture_at < void_at, "the void followed the capture");
            }
            // The capture was pending when the void came: the void refused.
            (201, 409) => {
                capture_first += 1;
                assert_eq!(void.problem_type(), "urn:idem:problem:capture-pending");
                assert_eq!((captures, captured, voids), (1, 60, 0));
                assert_eq!(charge["status"], "authorized", "{charge}");
                assert_eq!(charge["amount_capturable_cents"], 40);
            }
            // The void first: the capture refused, nothing captured.
            (409 | 422, 201) => {
                void_first += 1;
                let kind = capture.problem_type();
                assert!(
                    kind == "urn:idem:problem:authorization-closed"
                        || kind == "urn:idem:problem:charge-not-authorized",
                    "{capture:?}"
                );
                assert_eq!(void.json()["amount_cents"], 100);
                assert_eq!((captures, captured, voids), (0, 0, 1));
                assert_eq!(charge["status"], "voided", "{charge}");
                assert_eq!(charge["amount_capturable_cents"], 0);
            }
            other => panic!("no order agrees with {other:?}: {capture:?} {void:?}"),
        }
    }
    assert_eq!(
        db.count("authorization_steps").await as usize,
        ledger_steps(&sim).await
    );
    eprintln!("capture first {capture_first}, void first {void_first}");
}

async fn ledger_steps(sim: &TestSim) -> usize {
    let ledger = sim.ledger().await;
    ledger.authorization_captures.len() + ledger.voids.len()
}

/// The article's timeout, for a capture: the client gives up on instance A
/// while A's call is at the acquirer, and retries the same key on instance
/// B, which answers `409` while A works and then the capture A stored.
#[tokio::test]
async fn a_capture_retried_on_another_instance_while_the_first_is_at_the_acquirer_is_one_capture() {
    let db = TestDb::new().await;
    let sim = TestSim::start(Faults::default()).await;
    let secret = db.merchant("loja").await;
    let (_servers, clients) = instances(&db, &sim, 2, &secret).await;
    let (on_a, on_b) = (&clients[0], &clients[1]);
    let (charge_id, reference) = authorized(on_a, 1, 5_000).await;
    sim.set_faults(Faults {
        latency_ms: 3_000,
        ..Faults::default()
    })
    .await;
    let key = new_key();
    let body = partial(2_000);
    let gave_up = tokio::time::timeout(
        Duration::from_millis(800),
        on_a.capture(&charge_id, &key, &body),
    )
    .await;
    assert!(gave_up.is_err(), "the client gave up on A: {gave_up:?}");
    let started = std::time::Instant::now();
    let answer = loop {
        let a = on_b.capture(&charge_id, &key, &body).await;
        if a.status != 409 {
            break a;
        }
        assert_eq!(
            a.problem_type(),
            "urn:idem:problem:request-in-flight",
            "{a:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(20), "never final");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(answer.status, 201, "{answer:?}");
    let replay = on_a.capture(&charge_id, &key, &body).await;
    assert_eq!(replay.status, 201);
    assert_eq!(replay.body, answer.body, "replayed byte for byte");
    assert_eq!(captured_in(&sim.ledger().await, &reference), (1, 2_000));
}

/// Unknown outcomes of the authorization, a capture and a void: each is
/// settled with the same reference once the acquirer answers again, nothing
/// doubled, no reservation lost.
#[tokio::test]
async fn unknown_outcomes_of_each_step_settle_with_the_same_reference_once() {
    let db = TestDb::new().await;
    let sim = TestSim::start(Faults::default()).await;
    let secret = db.merchant("loja").await;
    let (_servers, clients) = instances(&db, &sim, 1, &secret).await;
    let client = &clients[0];
    let error_after = Faults {
        fault: Fault::ErrorAfter,
        fault_count: Some(1),
        ..Faults::default()
    };

    // The authorization: held at the acquirer, answered 502; the retry
    // finds it by its reference.
    sim.set_faults(error_after.clone()).await;
    let key = new_key();
    let body = r#"{"order_id": 7, "amount_cents": 100, "capture": false}"#;
    let first = client.charge(&key, body).await;
    assert_eq!(first.status, 503, "{first:?}");
    let settled = until_final(|| client.charge(&key, body)).await;
    assert_eq!(settled.status, 201, "{settled:?}");
    let charge_id = settled.json()["id"].as_str().expect("id").to_owned();
    let reference = settled.json()["acquirer_reference"]
        .as_str()
        .expect("ref")
        .to_owned();
    assert_eq!(settled.json()["status"], "authorized");

    // A capture, the same.
    sim.set_faults(error_after.clone()).await;
    let key = new_key();
    let unknown = client.capture(&charge_id, &key, &partial(40)).await;
    assert_eq!(unknown.status, 503, "{unknown:?}");
    assert!(
        unknown.json()["capture_id"].as_str().is_some(),
        "{unknown:?}"
    );
    // While it is unknown its amount stays reserved.
    let charge = client.get_charge(&charge_id).await.json();
    assert_eq!(charge["amount_capturable_cents"], 60, "{charge}");
    let forty = partial(40);
    let captured = until_final(|| client.capture(&charge_id, &key, &forty)).await;
    assert_eq!(captured.status, 201, "{captured:?}");

    // A void, the same.
    sim.set_faults(error_after).await;
    let key = new_key();
    let unknown = client.void(&charge_id, &key).await;
    assert_eq!(unknown.status, 503, "{unknown:?}");
    let voided = until_final(|| client.void(&charge_id, &key)).await;
    assert_eq!(voided.status, 201, "{voided:?}");
    assert_eq!(voided.json()["amount_cents"], 60);

    let ledger = sim.ledger().await;
    assert_eq!(
        ledger
            .authorizations
            .iter()
            .filter(|a| a.reference == reference)
            .count(),
        1
    );
    assert_eq!(captured_in(&ledger, &reference), (1, 40));
    assert_eq!(voids_of(&ledger, &reference), 1);
    let charge = client.get_charge(&charge_id).await.json();
    assert_eq!(charge["status"], "captured", "{charge}");
    assert_eq!(charge["amount_captured_cents"], 40);
}

async fn until_final<F, Fut>(send: F) -> Answer
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Answer>,
{
    let started = std::time::Instant::now();
    loop {
        let a = send().await;
        if a.status != 409 && a.status != 503 {
            return a;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never final: {a:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A capture the acquirer contradicts (it captured another amount) waits for
/// a person with its reservation held; `idem steps resolve` settles it from
/// the acquirer's records through the same finalize: resolved as failed, its
/// amount goes back to the authorization, and a late retry replays the
/// decision byte for byte; a final step is not resolved again.
#[tokio::test]
async fn a_person_settles_a_contradicted_capture_and_a_late_retry_replays_it() {
    let db = TestDb::new().await;
    let sim = TestSim::start(Faults::default()).await;
    let secret = db.merchant("loja").await;
    let (_servers, clients) = instances(&db, &sim, 1, &secret).await;
    let client = &clients[0];
    let (charge_id, _) = authorized(client, 1, 1_000).await;
    sim.set_faults(Faults {
        fault: Fault::WrongAmount,
        fault_count: Some(1),
        ..Faults::default()
    })
    .await;
    let key = new_key();
    let lied = client.capture(&charge_id, &key, &partial(300)).await;
    assert_eq!(
        lied.problem_type(),
        "urn:idem:problem:step-under-review",
        "{lied:?}"
    );
    let capture_id = lied.json()["capture_id"]
        .as_str()
        .expect("capture_id")
        .to_owned();
    sim.set_faults(Faults::default()).await;
    let charge = client.get_charge(&charge_id).await.json();
    assert_eq!(
        charge["amount_capturable_cents"], 700,
        "its 300 stay reserved"
    );

    let steps = |args: Vec<String>| {
        let db = &db;
        let sim_url = sim.url.clone();
        async move {
            let mut all = vec!["steps".to_owned()];
            all.extend(args);
            all.extend([
                "--acquirer-url".to_owned(),
                sim_url,
                "--actor".to_owned(),
                "ana".to_owned(),
            ]);
            let all: Vec<&str> = all.iter().map(String::as_str).collect();
            run_idem(db, &all).await
        }
    };
    let (status, _, err) = steps(vec![
        "resolve".into(),
        "cp_nope".into(),
        "--as".into(),
        "failed".into(),
        "--reason".into(),
        "x".into(),
    ])
    .await;
    assert!(!status.success() && err.contains("not a capture"), "{err}");
    let (status, stored, err) = steps(vec![
        "resolve".into(),
        capture_id.clone(),
        "--as".into(),
        "failed".into(),
        "--reason".into(),
        "acquirer ticket 9".into(),
    ])
    .await;
    assert!(status.success(), "{err}");
    let problem: serde_json::Value = serde_json::from_str(stored.trim()).expect("json");
    assert_eq!(
        problem["type"], "urn:idem:problem:capture-failed",
        "{problem}"
    );
    let charge = client.get_charge(&charge_id).await.json();
    assert_eq!(
        charge["amount_capturable_cents"], 1_000,
        "the 300 given back"
    );
    let late = client.capture(&charge_id, &key, &partial(300)).await;
    assert_eq!(late.status, 422);
    assert_eq!(late.json(), problem, "the decision replayed");
    let (status, _, err) = steps(vec![
        "resolve".into(),
        capture_id,
        "--as".into(),
        "succeeded".into(),
        "--reason".into(),
        "again".into(),
    ])
    .await;
    assert!(!status.success() && err.contains("already final"), "{err}");
}

/// `kill -9` at each crash point of a capture and of a void (after its claim,
/// after the acquirer's answer, in the middle of its finalize): the
/// reconciler alone then settles each once, with the same reference, nothing
/// doubled and no reservation lost, and the key replays the outcome.
#[cfg(feature = "crash-points")]
#[tokio::test]
async fn after_a_crash_at_any_step_of_a_capture_or_a_void_the_reconciler_settles_it_once() {
    const SHORT_LEASE: [&str; 4] = ["--lease", "1s", "--acquirer-timeout", "500ms"];
    let db = TestDb::new().await;
    let sim = TestSim::start(Faults::default()).await;
    let secret = db.merchant("loja").await;
    let healthy = ServeProcess::start(&db, &sim, &["--no-workers"]).await;
    let client = Client::new(&healthy.url, &secret);
    let mut crashed = Vec::new();
    let points = ["after-claim", "after-acquirer", "mid-finalize"];
    for (order, (point, void)) in (1..).zip(
        points
            .iter()
            .map(|p| (*p, false))
            .chain(points.iter().map(|p| (*p, true))),
    ) {
        let (charge_id, reference) = authorized(&client, order, 1_000).await;
        let mut server = ServeProcess::start_env(
            &db,
            &sim,
            &[&SHORT_LEASE[..], &["--no-workers"]].concat(),
            &[("IDEM_CRASH_AT", point)],
        )
        .await;
        let key = new_key();
        let (path, body) = if void {
            (format!("/v1/charges/{charge_id}/void"), String::new())
        } else {
            (format!("/v1/charges/{charge_id}/captures"), partial(300))
        };
        let sent = Client::new(&server.url, &secret)
            .raw()
            .post(format!("{}{path}", server.url))
            .bearer_auth(&secret)
            .header("Idempotency-Key", &key)
            .header("content-type", "application/json")
            .body(body.clone())
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
        crashed.push((point, void, charge_id, reference, key, path, body));
    }
    assert_eq!(
        db.count("authorization_steps").await,
        6,
        "each crash left its claim"
    );

    let started = std::time::Instant::now();
    loop {
        let (pending,): (i64,) =
            sqlx::query_as("select count(*) from authorization_steps where status = 'pending'")
                .fetch_one(&db.pool)
                .await
                .expect("count");
        if pending == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "steps never settled"
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
    let ledger = sim.ledger().await;
    for (point, void, charge_id, reference, key, path, body) in &crashed {
        let charge = client.get_charge(charge_id).await.json();
        if *void {
            assert_eq!(voids_of(&ledger, reference), 1, "{point}: one void");
            assert_eq!(charge["status"], "voided", "{point}: {charge}");
        } else {
            assert_eq!(
                captured_in(&ledger, reference),
                (1, 300),
                "{point}: one capture"
            );
            assert_eq!(charge["amount_captured_cents"], 300, "{point}: {charge}");
            assert_eq!(
                charge["amount_capturable_cents"], 700,
                "{point}: the reservation neither lost nor doubled"
            );
        }
        let replayed = client.post_keyed(path, key, body).await;
        assert_eq!(replayed.status, 201, "{point}: {replayed:?}");
        assert!(replayed.replayed(), "{point}");
    }
}

//! Refunds over the API (issue 39): `POST /v1/charges/{id}/refunds` under the
//! same key rules as a charge, the sum decided by the database before the
//! acquirer is called, and the acquirer's ledger as the ground truth. Each
//! test runs on PostgreSQL and on SQLite.

use std::sync::Arc;
use std::time::Duration;

use idem_lab::sim::{Fault, Faults};
use tokio::sync::Barrier;

use crate::helpers::*;

/// A captured charge of `amount` cents: its id.
async fn captured(client: &Client, order: i64, amount: i64) -> String {
    let a = client.charge(&new_key(), &body(order, amount)).await;
    assert_eq!(a.status, 201, "{a:?}");
    a.json()["id"].as_str().expect("id").to_owned()
}

fn amount(cents: i64) -> String {
    format!(r#"{{"amount_cents": {cents}}}"#)
}

/// What the acquirer's ledger refunded from the capture under `reference`.
async fn ledger_refunded(sim: &TestSim, capture_reference: &str) -> (usize, i64) {
    let ledger = sim.ledger().await;
    let refunds: Vec<_> = ledger
        .refunds
        .iter()
        .filter(|r| r.capture_reference == capture_reference)
        .collect();
    (refunds.len(), refunds.iter().map(|r| r.amount_cents).sum())
}

#[tokio::test]
async fn forty_refunds_of_ten_over_three_instances_give_back_exactly_the_capture() {
    let db = TestDb::new().await;
    let sim = TestSim::start(Faults::default()).await;
    let secret = db.merchant("loja").await;
    let mut instances = Vec::new();
    for _ in 0..3 {
        instances.push(ServeProcess::start(&db, &sim, &[]).await);
    }
    let clients: Vec<Client> = instances
        .iter()
        .map(|i| Client::new(&i.url, &secret))
        .collect();
    let charge_id = captured(&clients[0], 1, 100).await;
    let reference = clients[0].get_charge(&charge_id).await.json()["acquirer_reference"]
        .as_str()
        .expect("reference")
        .to_owned();

    let start = Arc::new(Barrier::new(40));
    let clients = Arc::new(clients);
    let refunds = (0..40)
        .map(|n| {
            let (clients, start, charge_id) = (clients.clone(), start.clone(), charge_id.clone());
            tokio::spawn(async move {
                let client = &clients[n % 3];
                start.wait().await;
                client.refund(&charge_id, &new_key(), &amount(10)).await
            })
        })
        .collect::<Vec<_>>();
    let mut succeeded = 0;
    for r in refunds {
        let a = r.await.expect("join");
        match a.status {
            201 => succeeded += 1,
            422 => {
                assert_eq!(a.problem_type(), "urn:idem:problem:refund-exceeds-captured");
                assert_eq!(a.json()["remaining_cents"], 0, "{a:?}");
            }
            other => panic!("unexpected {other}: {a:?}"),
        }
    }
    assert_eq!(succeeded, 10, "exactly the capture is refunded");
    assert_eq!(ledger_refunded(&sim, &reference).await, (10, 100));
    let charge = clients[1].get_charge(&charge_id).await.json();
    assert_eq!(charge["status"], "captured");
    assert_eq!(charge["amount_refunded_cents"], 100);
    let listed = clients[2]
        .get(&format!("/v1/charges/{charge_id}/refunds"))
        .await
        .json();
    assert_eq!(listed.as_array().map(Vec::len), Some(10));
    assert_eq!(db.count("refunds").await, 10, "a refusal stores nothing");
}

/// The article's timeout, for a refund: the client gives up on instance A
/// while A's call is still at the acquirer (3 s), and retries the same key
/// on instance B: B answers `409` while A works, then the refund A stored;
/// A replays the same bytes; the acquirer paid one refund, once.
#[tokio::test]
async fn a_refund_retried_on_another_instance_while_the_first_is_at_the_acquirer_is_one_refund() {
    let db = TestDb::new().await;
    let sim = TestSim::start(Faults::default()).await;
    let secret = db.merchant("loja").await;
    let a = ServeProcess::start(&db, &sim, &[]).await;
    let b = ServeProcess::start(&db, &sim, &[]).await;
    let (on_a, on_b) = (Client::new(&a.url, &secret), Client::new(&b.url, &secret));
    let charge_id = captured(&on_a, 1, 5_000).await;
    sim.set_faults(Faults {
        latency_ms: 3_000,
        ..Faults::default()
    })
    .await;
    let key = new_key();
    let body = amount(2_000);
    let gave_up = tokio::time::timeout(
        Duration::from_millis(800),
        on_a.refund(&charge_id, &key, &body),
    )
    .await;
    assert!(gave_up.is_err(), "the client gave up on A: {gave_up:?}");
    // A claimed the refund (committed before its call) and is at the acquirer.
    let started = std::time::Instant::now();
    while db.count("refunds").await == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "A never claimed the refund"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let on_b_first = on_b.refund(&charge_id, &key, &body).await;
    assert!(
        on_b_first.status == 409 || (on_b_first.status == 201 && on_b_first.replayed()),
        "A holds it (or, on a very slow machine, has stored it): {on_b_first:?}"
    );
    let from_b = on_b.refund_until_final(&charge_id, &key, &body).await;
    assert_eq!(from_b.status, 201, "{from_b:?}");
    let from_a = on_a.refund(&charge_id, &key, &body).await;
    assert_eq!(from_a.status, 201);
    assert!(from_a.replayed());
    assert_eq!(
        from_a.body, from_b.body,
        "both answers agree, byte for byte"
    );
    let reference = on_a.get_charge(&charge_id).await.json()["acquirer_reference"]
        .as_str()
        .expect("reference")
        .to_owned();
    assert_eq!(ledger_refunded(&sim, &reference).await, (1, 2_000));
    assert_eq!(db.count("refunds").await, 1);
}

#[tokio::test]
async fn a_refund_is_answered_once_and_replayed_byte_for_byte() {
    let env = Env::start(Faults::default()).await;
    let charge_id = captured(&env.client, 1, 5_000).await;
    let key = new_key();
    let first = env
        .client
        .refund(
            &charge_id,
            &key,
            r#"{"amount_cents": 1200, "reason": "requested_by_customer"}"#,
        )
        .await;
    assert_eq!(first.status, 201, "{first:?}");
    let refund = first.json();
    let id = refund["id"].as_str().expect("id");
    assert!(id.starts_with("re_"));
    assert_eq!(refund["charge_id"], charge_id.as_str());
    assert_eq!(refund["status"], "succeeded");
    assert_eq!(refund["amount_cents"], 1200);
    assert_eq!(refund["currency"], "BRL");
    assert_eq!(refund["reason"], "requested_by_customer");
    assert_eq!(
        first.header("location"),
        Some(&*format!("/v1/refunds/{id}"))
    );
    assert!(!first.replayed());

    // The same request, its fields in another order: the stored answer.
    let again = env
        .client
        .refund(
            &charge_id,
            &key,
            r#"{"reason": "requested_by_customer", "amount_cents": 1200}"#,
        )
        .await;
    assert_eq!(again.status, 201);
    assert!(again.replayed());
    assert_eq!(again.body, first.body, "byte for byte");

    let got = env.client.get(&format!("/v1/refunds/{id}")).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.json()["status"], "succeeded");
    let reference = env.client.get_charge(&charge_id).await.json()["acquirer_reference"]
        .as_str()
        .expect("reference")
        .to_owned();
    assert_eq!(ledger_refunded(&env.sim, &reference).await, (1, 1200));

    // The key names this refund: another amount, another charge, or a
    // charge's request under it is refused, and nothing is made.
    let other_amount = env.client.refund(&charge_id, &key, &amount(1300)).await;
    assert_eq!(other_amount.status, 422);
    assert_eq!(
        other_amount.problem_type(),
        "urn:idem:problem:idempotency-key-reused"
    );
    assert_eq!(other_amount.json()["refund_id"], id);
    assert_eq!(other_amount.json()["differing_fields"][0], "amount_cents");
    let other_charge = captured(&env.client, 2, 5_000).await;
    let elsewhere = env
        .client
        .refund(
            &other_charge,
            &key,
            r#"{"amount_cents": 1200, "reason": "requested_by_customer"}"#,
        )
        .await;
    assert_eq!(elsewhere.status, 422);
    assert_eq!(elsewhere.json()["differing_fields"][0], "charge_id");
    let as_charge = env.client.charge(&key, &body(3, 1200)).await;
    assert_eq!(as_charge.status, 422, "{as_charge:?}");
    assert_eq!(as_charge.json()["differing_fields"][0], "operation");
    assert_eq!(as_charge.json()["refund_id"], id);

    // And a charge's key is not a refund's.
    let charge_key = new_key();
    let charge = env.client.charge(&charge_key, &body(4, 700)).await;
    assert_eq!(charge.status, 201);
    let as_refund = env.client.refund(&charge_id, &charge_key, "{}").await;
    assert_eq!(as_refund.status, 422, "{as_refund:?}");
    assert_eq!(as_refund.json()["differing_fields"][0], "operation");
    assert_eq!(as_refund.json()["charge_id"], charge.json()["id"]);
    assert_eq!(env.db.count("refunds").await, 1);
    assert_eq!(ledger_refunded(&env.sim, &reference).await, (1, 1200));
}

#[tokio::test]
async fn a_refund_the_charge_cannot_give_stores_nothing_and_leaves_its_key_free() {
    let env = Env::start(Faults::default()).await;
    let charge_id = captured(&env.client, 1, 1_000).await;
    let key = new_key();
    // Bad requests: each its documented problem, before anything is claimed.
    for (body, status, kind) in [
        (amount(0), 400, "invalid-body"),
        (amount(-5), 400, "invalid-body"),
        (r#"{"amount_cents": 1.5}"#.to_owned(), 400, "invalid-body"),
        (amount(10_000_000_001), 400, "invalid-body"),
        (r#"{"reason": "because"}"#.to_owned(), 400, "invalid-body"),
        (amount(1_001), 422, "refund-exceeds-captured"),
    ] {
        let a = env.client.refund(&charge_id, &key, &body).await;
        assert_eq!(a.status, status, "{body}: {a:?}");
        assert_eq!(
            a.problem_type(),
            format!("urn:idem:problem:{kind}"),
            "{body}"
        );
    }
    let exceeds = env.client.refund(&charge_id, &key, &amount(1_001)).await;
    assert_eq!(exceeds.json()["remaining_cents"], 1_000);

    // No such charge, a malformed id, another merchant's charge: 404.
    let theirs = Client::new(&env.app.url, &env.db.merchant("outra").await);
    let their_charge = captured(&theirs, 1, 1_000).await;
    for id in [
        their_charge.as_str(),
        "ch_000000000000000000000000",
        "nonsense",
    ] {
        let a = env.client.refund(id, &key, &amount(10)).await;
        assert_eq!(a.status, 404, "{id}: {a:?}");
    }

    // A declined charge, and one still processing: not refundable.
    env.sim
        .set_faults(Faults {
            decline_rate: 1.0,
            ..Faults::default()
        })
        .await;
    let declined = env.client.charge(&new_key(), &body(2, 1_000)).await;
    assert_eq!(declined.status, 402);
    let declined_id = declined.json()["charge"]["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let a = env.client.refund(&declined_id, &key, "{}").await;
    assert_eq!(a.status, 422, "{a:?}");
    assert_eq!(a.problem_type(), "urn:idem:problem:charge-not-refundable");
    env.sim.set_faults(failing(Fault::Status(503))).await;
    let unknown = env.client.charge(&new_key(), &body(3, 1_000)).await;
    assert_eq!(unknown.status, 503);
    let processing_id = env
        .db
        .store
        .charges(&idem_core::store::ChargeFilter {
            limit: 100,
            ..Default::default()
        })
        .await
        .expect("charges")
        .into_iter()
        .find(|c| c.status == "processing")
        .expect("a processing charge")
        .id;
    let a = env.client.refund(&processing_id, &key, "{}").await;
    assert_eq!(a.problem_type(), "urn:idem:problem:charge-not-refundable");
    env.sim.set_faults(Faults::default()).await;

    assert_eq!(env.db.count("refunds").await, 0, "nothing stored");
    // The key is still free: the corrected request is a refund.
    let ok = env.client.refund(&charge_id, &key, &amount(1_000)).await;
    assert_eq!(ok.status, 201, "{ok:?}");
    let none_left = env.client.refund(&charge_id, &new_key(), "{}").await;
    assert_eq!(
        none_left.problem_type(),
        "urn:idem:problem:refund-exceeds-captured"
    );
    assert_eq!(none_left.json()["remaining_cents"], 0);
}

#[tokio::test]
async fn a_refund_the_acquirer_refuses_is_final_for_its_key_and_gives_its_amount_back() {
    let env = Env::start(Faults::default()).await;
    let charge_id = captured(&env.client, 1, 2_500).await;
    // An acquirer that never captured this charge refuses to refund it
    // (`unknown_capture`): another simulator, behind another instance.
    let stranger = TestSim::start(Faults::default()).await;
    let elsewhere = TestApp::start(&env.db, &stranger).await;
    let refusing = Client::new(&elsewhere.url, &env.client.secret);
    let key = new_key();
    let refused = refusing.refund(&charge_id, &key, "{}").await;
    assert_eq!(refused.status, 422, "{refused:?}");
    assert_eq!(refused.problem_type(), "urn:idem:problem:refund-failed");
    let refund = &refused.json()["refund"];
    assert_eq!(refund["status"], "failed");
    assert_eq!(refund["failure_reason"], "unknown_capture");
    assert_eq!(refund["amount_cents"], 2_500);
    // Stored: the same key is answered the same, even where the acquirer
    // would pay now.
    let again = env.client.refund(&charge_id, &key, "{}").await;
    assert_eq!(again.status, 422);
    assert!(again.replayed());
    assert_eq!(again.body, refused.body);
    // Its amount went back to the charge: the whole of it, with a new key.
    let ok = env.client.refund(&charge_id, &new_key(), "{}").await;
    assert_eq!(ok.status, 201, "{ok:?}");
    assert_eq!(ok.json()["amount_cents"], 2_500);
    assert_eq!(
        env.client.get_charge(&charge_id).await.json()["amount_refunded_cents"],
        2_500
    );
}

#[tokio::test]
async fn an_unknown_refund_outcome_is_settled_with_the_same_reference_once() {
    for fault in [Fault::ErrorAfter, Fault::DropAfter, Fault::Status(409)] {
        let env = Env::start(Faults::default()).await;
        let charge_id = captured(&env.client, 1, 900).await;
        let reference = env.client.get_charge(&charge_id).await.json()["acquirer_reference"]
            .as_str()
            .expect("reference")
            .to_owned();
        env.sim
            .set_faults(Faults {
                fault_count: Some(1),
                ..failing(fault)
            })
            .await;
        let key = new_key();
        let first = env.client.refund(&charge_id, &key, &amount(300)).await;
        assert_eq!(first.status, 503, "{fault:?}: {first:?}");
        assert_eq!(first.problem_type(), "urn:idem:problem:outcome-unknown");
        let refund_id = first.json()["refund_id"]
            .as_str()
            .expect("refund_id")
            .to_owned();
        let pending = env.client.get(&format!("/v1/refunds/{refund_id}")).await;
        assert_eq!(pending.json()["status"], "pending");
        // Pending, its amount stays reserved.
        let too_much = env
            .client
            .refund(&charge_id, &new_key(), &amount(601))
            .await;
        assert_eq!(too_much.json()["remaining_cents"], 600, "{fault:?}");
        // The retry drives it to its end with the same reference.
        let retried = env
            .client
            .refund_until_final(&charge_id, &key, &amount(300))
            .await;
        assert_eq!(retried.status, 201, "{fault:?}: {retried:?}");
        assert_eq!(retried.json()["id"], refund_id.as_str());
        assert_eq!(
            ledger_refunded(&env.sim, &reference).await,
            (1, 300),
            "{fault:?}: one refund in the ledger"
        );
    }
}

#[tokio::test]
async fn the_reconciler_settles_a_refund_nobody_retries() {
    let env = Env::start(Faults::default()).await;
    let charge_id = captured(&env.client, 1, 900).await;
    let reference = env.client.get_charge(&charge_id).await.json()["acquirer_reference"]
        .as_str()
        .expect("reference")
        .to_owned();
    env.sim
        .set_faults(Faults {
            fault_count: Some(1),
            ..failing(Fault::ErrorAfter)
        })
        .await;
    let first = env.client.refund(&charge_id, &new_key(), "{}").await;
    assert_eq!(first.status, 503, "{first:?}");
    let refund_id = first.json()["refund_id"]
        .as_str()
        .expect("refund_id")
        .to_owned();
    let reconciler = test_reconciler(&env.db, &env.sim, Duration::from_secs(3600));
    let report = reconciler.pass().await.expect("pass");
    assert_eq!(report.settled, 1, "{report:?}");
    let refund = env
        .client
        .get(&format!("/v1/refunds/{refund_id}"))
        .await
        .json();
    assert_eq!(refund["status"], "succeeded");
    assert_eq!(ledger_refunded(&env.sim, &reference).await, (1, 900));
    assert_eq!(
        env.client.get_charge(&charge_id).await.json()["amount_refunded_cents"],
        900
    );
}

/// Kill the server at each boundary of a refund's path (after its claim and
/// reservation, after the acquirer's answer, mid-finalize); then only
/// `idem reconcile --once` runs: each refund settles once, its reservation
/// neither lost nor doubled, and a retry replays the reconciler's outcome.
#[cfg(feature = "crash-points")]
#[tokio::test]
async fn after_a_crash_at_any_step_of_a_refund_the_reconciler_alone_settles_it_once() {
    const SHORT_LEASE: [&str; 4] = ["--lease", "1s", "--acquirer-timeout", "500ms"];
    let db = TestDb::new().await;
    let sim = TestSim::start(Faults::default()).await;
    let secret = db.merchant("loja").await;
    let healthy = ServeProcess::start(&db, &sim, &["--no-workers"]).await;
    let client = Client::new(&healthy.url, &secret);
    let mut refunds = Vec::new();
    for (order, point) in (1..).zip(["after-claim", "after-acquirer", "mid-finalize"]) {
        let charge_id = captured(&client, order, 1_000).await;
        let mut server = ServeProcess::start_env(
            &db,
            &sim,
            &[&SHORT_LEASE[..], &["--no-workers"]].concat(),
            &[("IDEM_CRASH_AT", point)],
        )
        .await;
        let key = new_key();
        let sent = Client::new(&server.url, &secret)
            .raw()
            .post(format!("{}/v1/charges/{charge_id}/refunds", server.url))
            .bearer_auth(&secret)
            .header("Idempotency-Key", &key)
            .header("content-type", "application/json")
            .body(amount(300))
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
        refunds.push((point, charge_id, key));
    }
    assert_eq!(db.count("refunds").await, 3, "each crash left its claim");

    let pending = async |db: &TestDb| {
        let (n,): (i64,) = sqlx::query_as("select count(*) from refunds where status = 'pending'")
            .fetch_one(&db.pool)
            .await
            .expect("count");
        n
    };
    let started = std::time::Instant::now();
    while pending(&db).await > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "refunds never settled"
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
    for (point, charge_id, key) in &refunds {
        let charge = client.get_charge(charge_id).await.json();
        let reference = charge["acquirer_reference"].as_str().expect("reference");
        assert_eq!(
            ledger_refunded(&sim, reference).await,
            (1, 300),
            "{point}: one refund at the acquirer"
        );
        assert_eq!(charge["amount_refunded_cents"], 300, "{point}");
        let (reserved,): (i64,) =
            sqlx::query_as("select refunded_cents from charges where id = $1")
                .bind(charge_id)
                .fetch_one(&db.pool)
                .await
                .expect("charge");
        assert_eq!(
            reserved, 300,
            "{point}: the reservation neither lost nor doubled"
        );
        let replayed = client.refund(charge_id, key, &amount(300)).await;
        assert_eq!(replayed.status, 201, "{point}: {replayed:?}");
        assert!(replayed.replayed(), "{point}");
    }
}

/// A refund the acquirer pays otherwise than asked (one cent more) is set
/// aside for a person at once: `503 refund-under-review`, no retry calls the
/// acquirer again, its amount stays reserved, and `idem refunds stuck` lists
/// it with why.
#[tokio::test]
async fn a_contradicted_refund_awaits_a_person_and_is_listed_as_stuck() {
    let env = Env::start(Faults::default()).await;
    let charge_id = captured(&env.client, 1, 1_000).await;
    env.sim
        .set_faults(Faults {
            fault_count: Some(1),
            ..failing(Fault::WrongAmount)
        })
        .await;
    let key = new_key();
    let lied = env.client.refund(&charge_id, &key, &amount(400)).await;
    assert_eq!(lied.status, 503, "{lied:?}");
    assert_eq!(lied.problem_type(), "urn:idem:problem:refund-under-review");
    assert_eq!(lied.header("retry-after"), Some("60"));
    let refund_id = lied.json()["refund_id"]
        .as_str()
        .expect("refund_id")
        .to_owned();
    // A retry does not call the acquirer again.
    let again = env.client.refund(&charge_id, &key, &amount(400)).await;
    assert_eq!(again.problem_type(), "urn:idem:problem:refund-under-review");
    assert_eq!(env.sim.ledger().await.refunds.len(), 1);
    // Its amount stays reserved until a person settles it.
    let more = env
        .client
        .refund(&charge_id, &new_key(), &amount(601))
        .await;
    assert_eq!(more.json()["remaining_cents"], 600, "{more:?}");
    let (status, stdout, stderr) = run_idem(&env.db, &["refunds", "stuck"]).await;
    assert!(status.success(), "{stderr}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with(&refund_id))
        .unwrap_or_else(|| panic!("{refund_id} not listed: {stdout}"));
    assert!(line.contains(&charge_id), "{line}");
    assert!(line.contains("contradicts the refund"), "{line}");
    assert!(stderr.contains("1 refund(s) awaiting review"), "{stderr}");
}

/// Runs `idem refunds ARGS` against the simulator, as the actor `ana`.
async fn refunds_cli(env: &Env, args: &[&str]) -> (bool, String, String) {
    let mut all = vec!["refunds"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--acquirer-url", &env.sim.url, "--actor", "ana"]);
    let (status, stdout, stderr) = run_idem(&env.db, &all).await;
    (status.success(), stdout, stderr)
}

/// What the charge has left to refund, as an over-refund's refusal says.
async fn remaining(env: &Env, charge_id: &str) -> i64 {
    let refused = env
        .client
        .refund(charge_id, &new_key(), &amount(1_000_000))
        .await;
    refused.json()["remaining_cents"]
        .as_i64()
        .expect("remaining_cents")
}

/// The charges and the refunds awaiting review, as the store counts them for
/// the `/metrics` gauges (`idem_charges_awaiting_review`,
/// `idem_refunds_awaiting_review`).
async fn awaiting_review(env: &Env) -> (i64, i64) {
    let stats = env.db.store.processing_stats().await.expect("stats");
    (stats.awaiting_review, stats.refunds_awaiting_review)
}

/// A refund the acquirer contradicted (it paid another amount): `503`
/// refund-under-review; its id.
async fn contradicted(env: &Env, charge_id: &str, key: &str, cents: i64) -> String {
    env.sim
        .set_faults(Faults {
            fault_count: Some(1),
            ..failing(Fault::WrongAmount)
        })
        .await;
    let lied = env.client.refund(charge_id, key, &amount(cents)).await;
    assert_eq!(lied.problem_type(), "urn:idem:problem:refund-under-review");
    env.sim.set_faults(Faults::default()).await;
    lied.json()["refund_id"]
        .as_str()
        .expect("refund_id")
        .to_owned()
}

/// A person settles the refunds awaiting review with `idem refunds retry`
/// and `resolve`, through the same take-over and finalize as every attempt:
/// a retry that meets the same contradiction leaves it for review; resolved
/// as failed, its amount goes back to the charge; resolved as succeeded,
/// its event goes out; a late retry replays the decision byte for byte;
/// each decision is audited once and told the merchant (`refund.resolved`),
/// and a final refund is not resolved again.
#[tokio::test]
async fn a_person_settles_a_refund_awaiting_review_and_a_late_retry_replays_it() {
    let env = Env::start(Faults::default()).await;
    env.db.store.set_events_enabled(true).await.unwrap();
    let (status, _, err) = run_idem(
        &env.db,
        &[
            "webhooks",
            "add",
            "loja",
            "http://127.0.0.1:9/hooks",
            "--webhook-allow-private",
            "--actor",
            "ana",
        ],
    )
    .await;
    assert!(status.success(), "{err}");
    let charge_id = captured(&env.client, 1, 1_000).await;
    let (first_key, second_key) = (new_key(), new_key());
    let first = contradicted(&env, &charge_id, &first_key, 300).await;
    let second = contradicted(&env, &charge_id, &second_key, 200).await;
    assert!(remaining(&env, &charge_id).await == 500, "both reserved");
    assert_eq!(
        awaiting_review(&env).await,
        (0, 2),
        "both counted, no charge"
    );

    // A retry asks the acquirer, which still says another amount.
    let (ok, _, err) = refunds_cli(&env, &["retry", &first]).await;
    assert!(!ok && err.contains("awaits review"), "{err}");
    assert_eq!(awaiting_review(&env).await, (0, 2));
    let (ok, _, err) = refunds_cli(
        &env,
        &[
            "resolve",
            "re_000000000000000000000000",
            "--as",
            "failed",
            "--reason",
            "x",
        ],
    )
    .await;
    assert!(!ok && err.contains("no refund has the id"), "{err}");

    // Failed: the stored answer is the refusal, the amount given back.
    let (ok, stored, err) = refunds_cli(
        &env,
        &[
            "resolve",
            &first,
            "--as",
            "failed",
            "--reason",
            "acquirer ticket 7",
        ],
    )
    .await;
    assert!(ok, "{err}");
    let problem: serde_json::Value = serde_json::from_str(stored.trim()).expect("json");
    assert_eq!(
        problem["type"], "urn:idem:problem:refund-failed",
        "{problem}"
    );
    assert!(
        remaining(&env, &charge_id).await == 800,
        "the failed refund's 300 given back"
    );
    assert_eq!(
        awaiting_review(&env).await,
        (0, 1),
        "the failed one settled"
    );
    let late = env
        .client
        .refund(&charge_id, &first_key, &amount(300))
        .await;
    assert_eq!(late.status, 422);
    assert!(late.replayed());
    assert_eq!(late.body.as_ref(), stored.trim_end().as_bytes());

    // Succeeded: 201 stored, its event in the outbox.
    let (ok, stored, err) = refunds_cli(
        &env,
        &[
            "resolve",
            &second,
            "--as",
            "succeeded",
            "--reason",
            "paid per the acquirer's report",
        ],
    )
    .await;
    assert!(ok, "{err}");
    let refund: serde_json::Value = serde_json::from_str(stored.trim()).expect("json");
    assert_eq!(
        (refund["id"].as_str(), refund["status"].as_str()),
        (Some(second.as_str()), Some("succeeded"))
    );
    let late = env
        .client
        .refund(&charge_id, &second_key, &amount(200))
        .await;
    assert_eq!(late.status, 201);
    assert!(late.replayed());
    assert_eq!(late.body.as_ref(), stored.trim_end().as_bytes());
    assert!(
        remaining(&env, &charge_id).await == 800,
        "the succeeded refund's 200 kept"
    );
    assert_eq!(awaiting_review(&env).await, (0, 0), "none left to review");
    let (events,): (i64,) = sqlx::query_as(
        "select count(*) from outbox where kind = 'event' and event_type = 'refund.succeeded'",
    )
    .fetch_one(&env.db.pool)
    .await
    .unwrap();
    assert_eq!(events, 1);

    let (ok, _, err) = refunds_cli(
        &env,
        &["resolve", &second, "--as", "failed", "--reason", "oops"],
    )
    .await;
    assert!(!ok && err.contains("already final (succeeded)"), "{err}");
    let (status, stuck, err) = run_idem(&env.db, &["refunds", "stuck"]).await;
    assert!(status.success(), "{err}");
    assert_eq!(stuck.lines().count(), 1, "only the header: {stuck}");
    for (id, detail) in [
        (&first, "resolved as failed"),
        (&second, "resolved as succeeded"),
    ] {
        let trail = env.db.store.audit_trail(Some(id), 10).await.unwrap();
        let resolved: Vec<_> = trail
            .iter()
            .filter(|a| a.action == "refund.resolve")
            .collect();
        assert_eq!(resolved.len(), 1, "{trail:?}");
        assert_eq!(
            (resolved[0].actor.as_str(), resolved[0].detail.as_deref()),
            ("ana", Some(detail))
        );
    }
    assert!(env
        .db
        .store
        .audit_trail(Some(&first), 10)
        .await
        .unwrap()
        .iter()
        .any(|a| a.action == "refund.retry"));
    let told: Vec<(String, i64)> = sqlx::query_as(
        "select event_type, count(*) from webhook_deliveries group by event_type order by 1",
    )
    .fetch_all(&env.db.pool)
    .await
    .unwrap();
    assert_eq!(
        told,
        [
            ("charge.captured".to_owned(), 1),
            ("refund.resolved".to_owned(), 2),
            ("refund.review_required".to_owned(), 2)
        ]
    );
    let (unnamed,): (i64,) = sqlx::query_as(
        "select count(*) from webhook_deliveries where charge_id is null or charge_id <> $1",
    )
    .bind(&charge_id)
    .fetch_one(&env.db.pool)
    .await
    .unwrap();
    assert_eq!(
        unnamed, 0,
        "each delivery names the charge its event is about"
    );
}

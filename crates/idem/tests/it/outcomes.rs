//! Every row of `docs/contract/api.md`'s outcome table, against the real simulator.

use std::time::{Duration, Instant};

use idem_lab::sim::{Fault, Faults};

use crate::helpers::*;

#[tokio::test]
async fn a_capture_is_stored_and_replayed_byte_for_byte_under_both_key_forms() {
    let Env {
        db: _db,
        sim,
        app: _app,
        client: c,
    } = Env::start(Faults::default()).await;
    let key = new_key();

    let first = c.charge(&key, &body(123, 25000)).await;
    assert_eq!(first.status, 201, "{:?}", first.body);
    assert!(!first.replayed());
    let charge = first.json();
    assert_eq!(charge["status"], "captured");
    assert_eq!(charge["order_id"], 123);
    assert_eq!(charge["amount_cents"], 25000);
    assert_eq!(charge["currency"], "BRL");
    let id = charge["id"].as_str().unwrap();
    assert_eq!(
        first.header("location"),
        Some(format!("/v1/charges/{id}").as_str())
    );

    // The IETF form of the same key, the body in another layout, the default
    // currency spelled out: the same request, so a replay.
    let again = c
        .charge(
            &format!("\"{key}\""),
            r#"{ "currency": "BRL", "amount_cents": 25000, "order_id": 123 }"#,
        )
        .await;
    assert_eq!(again.status, 201);
    assert!(again.replayed());
    assert_eq!(again.body, first.body, "byte-identical body");
    assert_eq!(again.header("location"), first.header("location"));
    assert_eq!(again.header("content-type"), Some("application/json"));

    let ledger = sim.ledger().await;
    assert_eq!(ledger.captures.len(), 1);
    assert_eq!(ledger.captures[0].reference, charge["acquirer_reference"]);
}

#[tokio::test]
async fn a_decline_is_final_stored_and_replayed() {
    let Env {
        db: _db,
        sim,
        app: _app,
        client: c,
    } = Env::start(Faults {
        decline_rate: 1.0,
        ..Faults::default()
    })
    .await;
    let key = new_key();

    let first = c.charge(&key, &body(5, 100)).await;
    assert_eq!(first.status, 402);
    assert_eq!(first.problem_type(), "urn:idem:problem:charge-declined");
    let p = first.json();
    assert_eq!(p["charge"]["status"], "declined");
    assert_eq!(p["charge"]["decline_reason"], "insufficient_funds");

    // Even once the acquirer would accept, the stored decline is the answer.
    sim.set_faults(Faults::default()).await;
    let again = c.charge(&key, &body(5, 100)).await;
    assert_eq!(again.status, 402);
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert!(
        sim.ledger().await.captures.is_empty(),
        "a decline moves no money"
    );

    let id = p["charge"]["id"].as_str().unwrap();
    assert_eq!(c.get_charge(id).await.json()["status"], "declined");

    // A new attempt is a new intent: a new key.
    assert_eq!(c.charge(&new_key(), &body(5, 100)).await.status, 201);
}

#[tokio::test]
async fn a_reused_key_with_another_request_is_422_naming_the_charge_and_the_fields() {
    let Env {
        db,
        sim,
        app: _app,
        client: c,
    } = Env::start(Faults::default()).await;
    let key = new_key();
    let first = c.charge(&key, &body(123, 25000)).await;
    assert_eq!(first.status, 201);

    let a = c
        .charge(
            &key,
            r#"{"order_id":123,"amount_cents":30000,"currency":"USD"}"#,
        )
        .await;
    assert_eq!(a.status, 422);
    assert_eq!(a.problem_type(), "urn:idem:problem:idempotency-key-reused");
    assert_eq!(
        a.json()["differing_fields"],
        serde_json::json!(["amount_cents", "currency"])
    );
    assert_eq!(
        a.json()["charge_id"],
        first.json()["id"],
        "names the key's charge"
    );
    let a = c
        .charge(
            &key,
            r#"{"order_id":123,"amount_cents":25000,"description":"x"}"#,
        )
        .await;
    assert_eq!(a.status, 422);
    assert_eq!(
        a.json()["differing_fields"],
        serde_json::json!(["description"])
    );
    assert_eq!(sim.ledger().await.captures.len(), 1);
    assert_eq!(db.count("charges").await, 1, "a 422 stores nothing");
}

/// Each way the acquirer can leave the outcome unknown: 503 with Retry-After,
/// the charge stays processing, and a retry with the same key finishes it with
/// exactly one capture. (A hang, whose retry meets the acquirer's `409` while
/// the first POST is still in flight, and every other status that is not the
/// acquirer's word: `acquirer.rs`.)
#[tokio::test]
async fn every_unknown_outcome_is_503_then_a_retry_settles_it_once() {
    let Env {
        db,
        sim,
        app: _app,
        client: c,
    } = Env::start_with(Faults::default(), test_config(), Duration::from_millis(500)).await;

    let faults = [
        (Fault::ErrorBefore, false),
        (Fault::ErrorAfter, true),
        (Fault::DropAfter, true),
    ];
    for (order, (fault, captures_anyway)) in (1..).zip(faults) {
        sim.set_faults(Faults {
            fault,
            fault_count: Some(1),
            ..Faults::default()
        })
        .await;
        let key = new_key();
        let first = c.charge(&key, &body(order, 100)).await;
        assert_eq!(first.status, 503, "{fault:?}: {:?}", first.body);
        assert_eq!(
            first.problem_type(),
            "urn:idem:problem:outcome-unknown",
            "{fault:?}"
        );
        assert!(first.header("retry-after").is_some(), "{fault:?}");
        let captured_so_far = sim.ledger().await.captures.len();
        assert_eq!(
            captured_so_far,
            order as usize - 1 + usize::from(captures_anyway),
            "{fault:?}"
        );

        let (id,): (String,) =
            sqlx::query_as("select id from charges where order_id = $1 and status = 'processing'")
                .bind(order)
                .fetch_one(&db.pool)
                .await
                .expect("the charge stays processing");
        assert_eq!(c.get_charge(&id).await.json()["status"], "processing");

        let retry = c.charge(&key, &body(order, 100)).await;
        assert_eq!(retry.status, 201, "{fault:?}: {:?}", retry.body);
        assert_eq!(retry.json()["id"], id.as_str(), "{fault:?}: same charge");
        let replay = c.charge(&key, &body(order, 100)).await;
        assert_eq!(replay.body, retry.body);

        let ledger = sim.ledger().await;
        let count = ledger
            .counts
            .iter()
            .find(|n| n.order_id == order)
            .map(|n| n.captures);
        assert_eq!(count, Some(1), "{fault:?}: exactly one capture");
    }
}

/// A replay may be answered from the instance's memory, but only while the
/// key surely lives on the database's clock: the memory ends a margin (at
/// least a second) before the key, so past that the database answers, and
/// past the key's expiry the late retry hears `410`, never the old answer.
#[tokio::test]
async fn a_replay_from_memory_ends_before_the_key_expires() {
    let Env {
        db,
        sim: _sim,
        app: _app,
        client: c,
    } = Env::with_key_ttl(Duration::from_secs(3), Duration::from_millis(500)).await;
    let key = new_key();
    let first = c.charge(&key, &body(1, 100)).await;
    let answered = std::time::Instant::now();
    assert_eq!(first.status, 201, "{:?}", first.body);

    // A mark only the database holds: a replay that shows it was read there.
    db.exec("update idempotency_keys set response_status = 299")
        .await;
    let remembered = c.charge(&key, &body(1, 100)).await;
    assert_eq!(remembered.status, 201, "answered from memory");
    assert!(remembered.replayed());
    assert_eq!(remembered.body, first.body, "byte for byte");
    assert_eq!(
        c.charge(&key, &body(2, 100)).await.status,
        422,
        "another request under the key is the database's to refuse"
    );

    // The memory lives at most ttl - 1 s from before the finalize; the key
    // at least ttl from it.
    tokio::time::sleep_until((answered + Duration::from_millis(2_200)).into()).await;
    let read = c.charge(&key, &body(1, 100)).await;
    assert_eq!(
        read.status, 299,
        "the memory ended first: the database answered"
    );
    assert!(read.replayed());

    tokio::time::sleep_until((answered + Duration::from_millis(3_300)).into()).await;
    let late = c.charge(&key, &body(1, 100)).await;
    assert_eq!(late.status, 410, "{:?}", late.body);
    assert_eq!(late.problem_type(), "urn:idem:problem:key-expired");
}

#[tokio::test]
async fn after_the_ttl_a_key_is_a_new_intent_but_never_while_processing() {
    let Env {
        db,
        sim,
        app: _app,
        client: c,
    } = Env::with_key_ttl(Duration::from_millis(300), Duration::from_millis(500)).await;

    let key = new_key();
    let first = c.charge(&key, &body(1, 100)).await;
    assert_eq!(first.status, 201);
    assert!(
        c.charge(&key, &body(1, 100)).await.replayed(),
        "honoured within the ttl"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let later = c.charge(&key, &body(2, 200)).await;
    assert_eq!(later.status, 201, "{:?}", later.body);
    assert!(!later.replayed(), "a new intent, even with another body");
    assert_ne!(later.json()["id"], first.json()["id"]);
    let old_id = first.json()["id"].as_str().unwrap().to_owned();
    assert_eq!(
        c.get_charge(&old_id).await.json()["status"],
        "captured",
        "expiry never deletes a charge"
    );

    // An unsettled key outlives its ttl: the retry finishes the same charge.
    sim.set_faults(Faults {
        fault: Fault::ErrorBefore,
        fault_count: Some(1),
        ..Faults::default()
    })
    .await;
    let key = new_key();
    let unknown = c.charge(&key, &body(3, 300)).await;
    assert_eq!(unknown.status, 503);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let settled = c.charge(&key, &body(3, 300)).await;
    assert_eq!(settled.status, 201);
    assert_eq!(db.count("charges").await, 3);
    assert_eq!(sim.ledger().await.captures.len(), 3);
}

/// A `503` idem decides on (here: the acquirer failed after moving the
/// money, so the outcome is unknown) is an answer, logged as one in the access
/// line: not an `ERROR`, which an operator's log alert pages on (an error with
/// a cause, a bug, is logged where it happens). Read from a real `idem serve`'s
/// log: a subscriber of the test's own would share the process's global level
/// with every other test running beside it.
#[tokio::test]
async fn an_unknown_outcome_is_logged_as_an_answer_not_as_an_error() {
    let db = TestDb::new().await;
    let sim = TestSim::start(Faults {
        fault: Fault::ErrorAfter,
        fault_count: Some(1),
        ..Faults::default()
    })
    .await;
    let log = std::env::temp_dir().join(format!("idem-log-{}.txt", new_key()));
    let server = ServeProcess::start_logged(&db, &sim, &[], &log).await;
    let c = Client::new(&server.url, &db.merchant("loja").await);

    let answer = c.charge(&new_key(), &body(1, 100)).await;
    assert_eq!(answer.status, 503, "{:?}", answer.body);
    assert_eq!(answer.problem_type(), "urn:idem:problem:outcome-unknown");
    // The access line is written as the answer leaves; the file may lag it.
    let started = Instant::now();
    let logged = loop {
        let logged = std::fs::read_to_string(&log).unwrap_or_default();
        if logged.lines().any(|line| line.contains("status=503")) {
            break logged;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no access line with the answer: {logged}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let _ = std::fs::remove_file(&log);
    let errors: Vec<&str> = logged
        .lines()
        .filter(|line| line.contains(" ERROR "))
        .collect();
    assert!(errors.is_empty(), "{errors:#?}");
}

//! `idem charges list | show | retry | resolve`, the real binary against a
//! real database and the simulator: a person settles what the reconciler gave
//! up on, through the same take-over and finalize as every attempt, audited.

use std::time::Duration;

use idem_core::domain::IdempotencyKey;
use idem_lab::sim::{Fault, Faults};

use crate::helpers::*;

/// Runs `idem charges ARGS`; the acquirer is the simulator, the actor `ana`.
async fn charges(env: &Env, args: &[&str]) -> (bool, String, String) {
    let mut all = vec!["charges"];
    all.extend_from_slice(args);
    if matches!(args.first(), Some(&"retry" | &"resolve")) {
        all.extend_from_slice(&["--acquirer-url", &env.sim.url, "--actor", "ana"]);
    }
    let (status, stdout, stderr) = run_idem(&env.db, &all).await;
    (status.success(), stdout, stderr)
}

/// One charge whose capture failed before the acquirer saw it (`503`), then
/// past the settle deadline with no outcome at the acquirer: awaiting review.
/// Returns its key, body and id.
async fn awaiting_review(env: &Env) -> (String, String, String) {
    env.sim.set_faults(failing(Fault::ErrorBefore)).await;
    let (key, body) = (new_key(), body(1, 25_000));
    let first = env.client.charge(&key, &body).await;
    assert_eq!(first.status, 503, "{:?}", first.body);
    let id = charge_id_of(&env.db, 1).await;
    env.sim.set_faults(Faults::default()).await;
    let impatient = test_reconciler_with(&env.db, &env.sim, Duration::from_secs(2), Duration::ZERO);
    // The lease was released on the 503: the reconciler may look at once.
    let report = impatient.pass().await.expect("pass");
    assert_eq!(report.marked_for_review, 1, "{report:?}");
    (key, body, id)
}

/// The id of the charge for `order`.
async fn charge_id_of(db: &TestDb, order: i64) -> String {
    let (id,): (String,) = sqlx::query_as("select id from charges where order_id = $1")
        .bind(order)
        .fetch_one(&db.pool)
        .await
        .expect("the charge");
    id
}

#[tokio::test]
async fn a_person_resolves_a_charge_awaiting_review_and_a_late_retry_replays_the_decision() {
    let env = Env::start(Faults::default()).await;
    let (key, body, id) = awaiting_review(&env).await;
    env.db.store.set_events_enabled(true).await.unwrap();

    // Found by the common questions.
    let (ok, list, err) = charges(&env, &["list", "--status", "review"]).await;
    assert!(ok, "{err}");
    assert_eq!(list.lines().count(), 2, "{list}");
    assert!(
        list.lines()
            .nth(1)
            .unwrap()
            .starts_with(&format!("{id}\tloja\t1\t25000\tBRL\tprocessing\t")),
        "{list}"
    );
    let (_, none, _) = charges(&env, &["list", "--status", "captured"]).await;
    assert_eq!(none.lines().count(), 1, "{none}");
    let (_, by_order, _) = charges(&env, &["list", "--order-id", "1", "--since", "1h"]).await;
    assert_eq!(by_order.lines().count(), 2, "{by_order}");
    let (_, not_since, _) = charges(&env, &["list", "--since", "2999-01-01T00:00:00Z"]).await;
    assert_eq!(not_since.lines().count(), 1, "{not_since}");
    let (_, by_key, _) = charges(&env, &["list", "--merchant", "loja", "--key", &key]).await;
    assert_eq!(by_key.lines().count(), 2, "{by_key}");
    let (_, elsewhere, _) =
        charges(&env, &["list", "--merchant", "outra", "--order-id", "1"]).await;
    assert_eq!(
        elsewhere.lines().count(),
        1,
        "another merchant's: none: {elsewhere}"
    );

    // Shown whole: the charge, its key record, the reconciler's history.
    let (ok, shown, err) = charges(&env, &["show", &id]).await;
    assert!(ok, "{err}");
    let shown: serde_json::Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(shown["charge"]["status"], "processing");
    assert!(shown["charge"]["review_since"].is_string(), "{shown}");
    assert_eq!(shown["key"]["idempotency_key"], key.as_str());
    assert_eq!(shown["key"]["state"], "in_flight");
    assert!(shown["key"]["attempt"].as_i64().unwrap() >= 2, "{shown}");
    let history = shown["history"].as_array().unwrap();
    assert!(
        history.iter().any(|h| h["actor"] == "reconciler"
            && h["action"] == "charge.reconcile"
            && h["detail"].as_str().unwrap().contains("marked for review")),
        "{shown}"
    );

    // Resolved as captured: the answer the engine would have stored.
    let (ok, stored, err) = charges(
        &env,
        &[
            "resolve",
            &id,
            "--as",
            "captured",
            "--reason",
            "acquirer ticket 42",
        ],
    )
    .await;
    assert!(ok, "{err}");
    let charge: serde_json::Value = serde_json::from_str(stored.trim()).unwrap();
    assert_eq!(
        (charge["id"].as_str(), charge["status"].as_str()),
        (Some(id.as_str()), Some("captured"))
    );

    // The late retry replays it byte for byte; no money moved at idem's hand.
    let late = env.client.charge(&key, &body).await;
    assert_eq!(late.status, 201);
    assert!(late.replayed());
    assert_eq!(late.body.as_ref(), stored.trim_end().as_bytes());
    assert!(env.sim.ledger().await.captures.is_empty());

    // Its event is in the outbox; the decision in the audit trail; once only.
    let (events,): (i64,) = sqlx::query_as(
        "select count(*) from outbox where kind = 'event' and event_type = 'charge.captured'",
    )
    .fetch_one(&env.db.pool)
    .await
    .unwrap();
    assert_eq!(events, 1);
    let trail = env.db.store.audit_trail(Some(&id), 10).await.unwrap();
    let resolve = trail
        .iter()
        .find(|a| a.action == "charge.resolve")
        .expect("audited");
    assert_eq!(
        (
            resolve.actor.as_str(),
            resolve.reason.as_deref(),
            resolve.detail.as_deref()
        ),
        (
            "ana",
            Some("acquirer ticket 42"),
            Some("resolved as captured")
        )
    );
    let (ok, _, err) = charges(
        &env,
        &["resolve", &id, "--as", "failed", "--reason", "oops"],
    )
    .await;
    assert!(!ok && err.contains("already final (captured)"), "{err}");
    assert_eq!(
        env.db
            .store
            .audit_trail(Some(&id), 10)
            .await
            .unwrap()
            .iter()
            .filter(|a| a.action == "charge.resolve")
            .count(),
        1
    );
}

#[tokio::test]
async fn resolve_as_failed_stores_the_acquirer_rejected_answer() {
    let env = Env::start(Faults::default()).await;
    let (key, body, id) = awaiting_review(&env).await;
    let (ok, stored, err) = charges(
        &env,
        &[
            "resolve",
            &id,
            "--as",
            "failed",
            "--reason",
            "never reached them",
        ],
    )
    .await;
    assert!(ok, "{err}");
    let late = env.client.charge(&key, &body).await;
    assert_eq!(late.status, 502);
    assert_eq!(late.problem_type(), "urn:idem:problem:acquirer-rejected");
    assert_eq!(late.body.as_ref(), stored.trim_end().as_bytes());
    assert_eq!(late.json()["charge"]["status"], "failed");
}

#[tokio::test]
async fn retry_re_drives_now_and_nothing_acts_on_a_charge_another_attempt_holds() {
    let env = Env::start(Faults::default()).await;
    env.sim.set_faults(failing(Fault::ErrorBefore)).await;
    let (key, body) = (new_key(), body(7, 999));
    let first = env.client.charge(&key, &body).await;
    assert_eq!(first.status, 503);
    let id = charge_id_of(&env.db, 7).await;
    env.sim.set_faults(Faults::default()).await;

    // Not awaiting review: resolve refuses and points to retry.
    let (ok, _, err) = charges(&env, &["resolve", &id, "--as", "captured", "--reason", "x"]).await;
    assert!(
        !ok && err.contains("not awaiting review") && err.contains("retry"),
        "{err}"
    );

    // Held by another attempt: neither acts.
    let merchant = env.db.merchant_id("loja").await;
    let parsed = IdempotencyKey::parse(key.as_bytes()).unwrap();
    let record = env
        .db
        .store
        .key_record(merchant, &parsed)
        .await
        .unwrap()
        .unwrap();
    let held = env
        .db
        .store
        .take_over(merchant, &parsed, record.attempt, Duration::from_secs(2))
        .await
        .unwrap()
        .expect("taken");
    let (ok, _, err) = charges(&env, &["retry", &id]).await;
    assert!(
        !ok && err.contains("being worked on by another attempt"),
        "{err}"
    );
    assert!(env.sim.ledger().await.captures.is_empty());

    // Once that lease is over: looked up (nothing), captured once, stored.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let (ok, stored, err) = charges(&env, &["retry", &id]).await;
    assert!(ok, "{err}");
    assert_eq!(env.sim.ledger().await.captures.len(), 1);
    let late = env.client.charge(&key, &body).await;
    assert_eq!((late.status, late.replayed()), (201, true));
    assert_eq!(late.body.as_ref(), stored.trim_end().as_bytes());
    drop(held);

    let (ok, _, err) = charges(&env, &["retry", &id]).await;
    assert!(!ok && err.contains("already final"), "{err}");
    let (ok, _, err) = charges(&env, &["retry", "ch_nothing"]).await;
    assert!(!ok && err.contains("no charge has the id"), "{err}");
    let trail = env.db.store.audit_trail(Some(&id), 10).await.unwrap();
    assert_eq!(trail.len(), 1, "{trail:?}");
    assert_eq!(
        (trail[0].actor.as_str(), trail[0].action.as_str()),
        ("ana", "charge.retry")
    );
}

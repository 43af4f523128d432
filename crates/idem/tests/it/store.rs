//! The store's fencing: a stale holder whose lease was taken over can never
//! write the outcome.

use std::time::Duration;

use bytes::Bytes;
use idem_core::domain::{ChargeRequest, ChargeStatus};
use idem_core::domain::{IdempotencyKey, MessageId, StoredResponse};
use idem_core::store::{
    Backend, Claim, KeyState, NewResult, Reschedule, ResultAnswer, Settlement, Store, StoreError,
};

use crate::helpers::*;

#[tokio::test]
async fn a_stale_holder_cannot_finalize_after_a_take_over() {
    let db = TestDb::new().await;
    db.merchant("loja").await;
    let merchant_id = db.merchant_id("loja").await;
    let key = IdempotencyKey::parse(b"fence-me").expect("key");
    let request = ChargeRequest::from_json(body(1, 100).as_bytes()).expect("request");
    let claim = new_claim(
        merchant_id,
        &key,
        &request,
        Duration::from_millis(50),
        Duration::from_secs(60),
    );
    let Claim::Won(stale) = db.store.claim(&claim).await.expect("claim") else {
        panic!("first claim wins")
    };
    let Claim::Lost(seen) = db.store.claim(&claim).await.expect("claim") else {
        panic!("second claim loses")
    };
    assert!(
        matches!(seen.state, KeyState::InFlight { lease_remaining } if !lease_remaining.is_zero())
    );
    assert!(
        db.store
            .take_over(merchant_id, &key, seen.attempt, Duration::from_secs(5))
            .await
            .expect("take over")
            .is_none(),
        "a live lease cannot be taken"
    );

    tokio::time::sleep(Duration::from_millis(80)).await;
    let fresh = db
        .store
        .take_over(merchant_id, &key, stale.attempt, Duration::from_secs(5))
        .await
        .expect("take over")
        .expect("an expired lease can be taken");
    assert_eq!(fresh.attempt, stale.attempt + 1);
    assert!(
        db.store
            .take_over(merchant_id, &key, stale.attempt, Duration::from_secs(5))
            .await
            .expect("again")
            .is_none(),
        "only one attempt takes over a given token"
    );

    let response = |text: &'static str| StoredResponse {
        status: 201,
        body: Bytes::from_static(text.as_bytes()),
    };
    let settle = |r: &'static StoredResponse| Settlement {
        status: ChargeStatus::Captured,
        capture_id: Some("cap_1"),
        decline_reason: None,
        response: r,
        event: None,
        webhook: None,
        audit: None,
    };
    let stale_answer: &'static StoredResponse = Box::leak(Box::new(response("stale")));
    let fresh_answer: &'static StoredResponse = Box::leak(Box::new(response("fresh")));
    let ttl = Duration::from_secs(60);
    assert!(!db
        .store
        .finalize(merchant_id, &key, &stale, &settle(stale_answer), ttl)
        .await
        .expect("fin"));
    assert!(db
        .store
        .finalize(merchant_id, &key, &fresh, &settle(fresh_answer), ttl)
        .await
        .expect("fin"));
    assert!(
        !db.store
            .finalize(merchant_id, &key, &fresh, &settle(fresh_answer), ttl)
            .await
            .expect("fin"),
        "written once"
    );

    let record = db
        .store
        .key_record(merchant_id, &key)
        .await
        .expect("read")
        .expect("exists");
    match record.state {
        KeyState::Completed { response, .. } => assert_eq!(response.body, "fresh"),
        other => panic!("{other:?}"),
    }
    assert_eq!(record.subject.status, ChargeStatus::Captured);
}

/// A key reused at the moment the sweeper deletes its expired record: the claim
/// starts over instead of failing, every round.
#[tokio::test]
async fn a_claim_racing_the_sweeper_on_an_expired_key_never_fails() {
    let db = TestDb::new().await;
    db.merchant("loja").await;
    let merchant_id = db.merchant_id("loja").await;
    let sweeping = tokio::spawn({
        let store = db.store.clone();
        async move {
            for _ in 0..300 {
                store
                    .sweep_expired_keys(10, Duration::from_secs(60))
                    .await
                    .expect("sweep");
            }
        }
    });
    let key = IdempotencyKey::parse(b"reused-at-expiry").expect("key");
    let mut won = 0;
    for order in 1..=150 {
        let request = ChargeRequest::from_json(body(order, 100).as_bytes()).expect("request");
        let claim = new_claim(
            merchant_id,
            &key,
            &request,
            Duration::from_secs(5),
            Duration::ZERO,
        );
        match db
            .store
            .claim(&claim)
            .await
            .expect("a claim never fails on a swept key")
        {
            Claim::Won(record) => {
                won += 1;
                let response = StoredResponse {
                    status: 201,
                    body: Bytes::from_static(b"{}"),
                };
                let settlement = Settlement {
                    status: ChargeStatus::Captured,
                    capture_id: None,
                    decline_reason: None,
                    response: &response,
                    event: None,
                    webhook: None,
                    audit: None,
                };
                // Expired the moment it is stored: the next round reuses the key.
                assert!(db
                    .store
                    .finalize(merchant_id, &key, &record, &settlement, Duration::ZERO)
                    .await
                    .expect("finalize"));
            }
            Claim::Lost(record) => panic!("an expired key is free, got {:?}", record.state),
            Claim::Expired(charge) => panic!("another request each round, yet expired: {charge}"),
            Claim::Other(subject) => panic!("only charges here, yet {subject}"),
        }
    }
    sweeping.await.expect("sweeper");
    assert_eq!(won, 150);
    assert_eq!(
        db.count("charges").await,
        150,
        "each reuse after expiry is a new charge"
    );
}

/// A relay that dies holding a batch (its task dropped before it finishes)
/// must not leave the batch's connection, with its open transaction and row
/// locks, in the pool: on PostgreSQL the connection is closed, the server
/// rolls back, and another relay takes the rows at once. On SQLite the batch
/// is a lease instead, and the rows wait for it to run out.
#[tokio::test]
async fn a_batch_dropped_unfinished_frees_its_rows_and_its_connection() {
    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let db = TestDb::new().await;
    let key = IdempotencyKey::parse(b"dropped-batch").expect("key");
    let answer = StoredResponse {
        status: 201,
        body: Bytes::from_static(b"{}"),
    };
    db.store
        .enqueue_result(&NewResult {
            message_id: &MessageId::result(),
            exchange: "idem.results",
            routing_key: "nowhere",
            tenant: "loja",
            correlation_id: None,
            key: &key,
            replayed: false,
            answer: ResultAnswer::Now(&answer),
            traceparent: Some(TRACEPARENT),
        })
        .await
        .expect("enqueue");

    // One connection only: if the dropped batch kept it, nothing else could run.
    let relay = Store::connect(&db.url, 1).await.expect("connect");
    let batch = relay.outbox_batch(10).await.expect("batch");
    assert_eq!(batch.messages.len(), 1);
    assert_eq!(
        batch.messages[0].traceparent.as_deref(),
        Some(TRACEPARENT),
        "a result keeps its command's trace context"
    );
    drop(batch);
    relay
        .ping()
        .await
        .expect("the pool's only connection slot is free again");

    let other = Store::connect(&db.url, 1).await.expect("connect");
    match db.backend {
        Backend::Postgres => {
            // The server notices the closed socket and rolls back on its own time.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            loop {
                let batch = other.outbox_batch(10).await.expect("batch");
                if batch.messages.len() == 1 {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the dropped batch's row locks were never released"
                );
                batch.finish(&[], &[]).await.expect("finish");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Backend::Sqlite => {
            let batch = other.outbox_batch(10).await.expect("batch");
            assert!(batch.messages.is_empty(), "the lease still holds the row");
        }
    }
}

/// Another process holds the SQLite file's write lock and does not let go:
/// every writer of this process gives up after one busy timeout (5 s) with a
/// 503-class error, instead of the ones queued behind the first waiting one
/// busy timeout after another.
#[tokio::test]
async fn writers_stuck_behind_another_process_give_up_together() {
    if !runs_on(
        Backend::Sqlite,
        "it holds SQLite's one write lock; PostgreSQL has row locks and no write turn",
    ) {
        return;
    }
    use sqlx::Connection;
    let db = TestDb::new().await;
    db.merchant("loja").await;
    let merchant_id = db.merchant_id("loja").await;
    let mut other_process = sqlx::SqliteConnection::connect(&db.url)
        .await
        .expect("connect");
    sqlx::query("begin immediate")
        .execute(&mut other_process)
        .await
        .expect("take the write lock");

    let started = std::time::Instant::now();
    let claims = (1..=3).map(|order| {
        let store = db.store.clone();
        tokio::spawn(async move {
            let key = IdempotencyKey::parse(format!("stuck-{order}").as_bytes()).expect("key");
            let request = ChargeRequest::from_json(body(order, 100).as_bytes()).expect("request");
            let claim = new_claim(
                merchant_id,
                &key,
                &request,
                Duration::from_secs(5),
                Duration::from_secs(60),
            );
            let outcome = store.claim(&claim).await;
            (outcome.map(|_| ()), started.elapsed())
        })
    });
    for claim in futures_util::future::join_all(claims).await {
        let (outcome, took) = claim.expect("claim task");
        assert!(
            matches!(outcome, Err(StoreError::Unavailable(_))),
            "a writer behind a stuck lock gets a retryable error, got {outcome:?}"
        );
        assert!(
            took < Duration::from_secs(8),
            "every writer gives up after about one busy timeout, this one after {took:?}"
        );
    }

    sqlx::query("rollback")
        .execute(&mut other_process)
        .await
        .expect("let go");
    assert_eq!(db.count("charges").await, 0, "nothing was half-stored");
}

/// Releasing after an unknown outcome frees the key and writes the
/// reconciler's wait together, and only for the attempt that holds the key;
/// renewing a lease is fenced the same way.
#[tokio::test]
async fn release_and_renew_are_fenced_and_release_schedules_in_the_same_write() {
    let db = TestDb::new().await;
    db.merchant("loja").await;
    let merchant_id = db.merchant_id("loja").await;
    let key = IdempotencyKey::parse(b"release-me").expect("key");
    let request = ChargeRequest::from_json(body(1, 100).as_bytes()).expect("request");
    let claim = new_claim(
        merchant_id,
        &key,
        &request,
        Duration::from_secs(30),
        Duration::from_secs(60),
    );
    let Claim::Won(held) = db.store.claim(&claim).await.expect("claim") else {
        panic!("first claim wins")
    };
    let stale = held.attempt - 1;
    let wait = Reschedule {
        not_before: Some(Duration::from_secs(60)),
        reconciler_try: true,
    };
    let schedule = || async {
        let (tries, waits): (i64, i64) = sqlx::query_as(&format!(
            "select cast(c.reconcile_attempts as bigint),
                    case when c.next_reconcile_at > {now} then 1 else 0 end
               from charges c",
            now = db.now()
        ))
        .fetch_one(&db.pool)
        .await
        .expect("charge");
        (tries, waits)
    };
    let lease_left = || async {
        match db.store.key_record(merchant_id, &key).await.expect("read") {
            Some(record) => match record.state {
                KeyState::InFlight { lease_remaining } => lease_remaining,
                KeyState::Completed { .. } => panic!("not completed"),
            },
            None => panic!("the record is there"),
        }
    };

    assert!(!db
        .store
        .renew(merchant_id, &key, stale, Duration::from_secs(90))
        .await
        .expect("renew"));
    db.store
        .release(merchant_id, &key, stale, &wait)
        .await
        .expect("release");
    assert!(
        lease_left().await > Duration::from_secs(20),
        "a stale release is a no-op"
    );
    assert_eq!(schedule().await, (0, 0), "and schedules nothing");

    assert!(db
        .store
        .renew(merchant_id, &key, held.attempt, Duration::from_secs(90))
        .await
        .expect("renew"));
    assert!(lease_left().await > Duration::from_secs(60), "renewed");

    db.store
        .release(merchant_id, &key, held.attempt, &wait)
        .await
        .expect("release");
    assert_eq!(lease_left().await, Duration::ZERO, "released");
    assert_eq!(
        schedule().await,
        (1, 1),
        "one try counted, the wait written"
    );
    let orphans = db
        .store
        .orphans(10, Duration::from_secs(3600))
        .await
        .expect("orphans");
    assert!(orphans.is_empty(), "no reconciler looks before the wait");
}

#[tokio::test]
async fn a_statement_stuck_behind_a_lock_ends_at_the_statement_timeout_as_unavailable() {
    if !runs_on(
        Backend::Postgres,
        "statement_timeout is PostgreSQL's; SQLite has its busy timeout",
    ) {
        return;
    }
    let db = TestDb::new().await;
    // Another session holds a lock every outbox statement waits for.
    let mut tx = db.pool.begin().await.expect("begin");
    sqlx::query("lock table outbox in access exclusive mode")
        .execute(&mut *tx)
        .await
        .expect("lock the outbox");

    let started = std::time::Instant::now();
    let answer = tokio::time::timeout(Duration::from_secs(10), db.store.outbox_backlog())
        .await
        .expect("the statement ends by itself, not when the lock is released");
    let waited = started.elapsed();
    match answer {
        Err(StoreError::Unavailable(e)) => {
            assert!(e.to_string().contains("statement timeout"), "{e}")
        }
        other => panic!("a transient error (57014), not {other:?}"),
    }
    assert!(
        (Duration::from_millis(1_900)..Duration::from_secs(4)).contains(&waited),
        "ended after {waited:?}"
    );
    tx.rollback().await.expect("rollback");
    // The store works on, and migrating (no timeout for it) still works.
    db.store.outbox_backlog().await.expect("works again");
    db.store.migrate().await.expect("migrate again");
}

//! Keys: insert first (one winner however the claims arrive), the stored
//! answer, fencing, late retries (through the record, its tombstone, then the
//! charge), the sweeper racing a reuse, and the lease's release and renewal.

use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use bytes::Bytes;
use idem_core::domain::{ChargeId, ChargeRequest, ChargeStatus, IdempotencyKey, StoredResponse};
use idem_core::store::{Claim, KeyState, KeyStatus, NewClaim, Reschedule, Settlement};
use idem_testkit::db::*;
use tokio::sync::Barrier;

crate::on_every_backend!(
    sixteen_claims_of_one_key_at_once_make_one_charge,
    a_stored_answer_is_replayed_and_another_request_under_its_key_is_told_apart,
    a_late_retry_finds_its_charge_through_the_record_the_tombstone_and_the_charge,
    a_stale_holder_cannot_finalize_after_a_take_over,
    a_claim_racing_the_sweeper_on_an_expired_key_never_fails,
    release_and_renew_are_fenced_and_release_schedules_in_the_same_write,
    sixteen_claims_of_a_new_request_on_an_expired_key_make_one_charge
);

async fn a_stale_holder_cannot_finalize_after_a_take_over(db: TestDb) {
    db.merchant("loja").await;
    let merchant_id = db.merchant_id("loja").await;
    let key = IdempotencyKey::parse(b"fence-me").expect("key");
    let request = ChargeRequest::from_json(body(1, 100).as_bytes()).expect("request");
    let claim = new_claim(merchant_id, &key, &request, LEASE, Duration::from_secs(60));
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

    end_leases(&db).await;
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
async fn a_claim_racing_the_sweeper_on_an_expired_key_never_fails(db: TestDb) {
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

/// Releasing after an unknown outcome frees the key and writes the
/// reconciler's wait together, and only for the attempt that holds the key;
/// renewing a lease is fenced the same way.
async fn release_and_renew_are_fenced_and_release_schedules_in_the_same_write(db: TestDb) {
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
            "select cast(c.reconcile_attempts as {int}),
                    cast(case when c.next_reconcile_at > {now} then 1 else 0 end as {int})
               from charges c",
            now = db.now(),
            int = db.bigint()
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

/// Claims `claim` and stores `answer` as its outcome, honoured for `key_ttl`.
async fn charge(
    db: &TestDb,
    claim: &NewClaim<'_>,
    body: &'static str,
    key_ttl: Duration,
) -> ChargeId {
    let Claim::Won(record) = db.store.claim(claim).await.expect("claim") else {
        panic!("a fresh key wins")
    };
    let response = answer(body.as_bytes());
    assert!(db
        .store
        .finalize(
            claim.merchant_id,
            claim.key,
            &record,
            &captured(&response),
            key_ttl
        )
        .await
        .expect("finalize"));
    record.subject.id
}

/// The article's retry, sixteen times at once, through each of the store's
/// ways in (alone, the engine's, and batches, one of them holding the same
/// claim twice): one claim wins, every other finds its charge.
async fn sixteen_claims_of_one_key_at_once_make_one_charge(db: TestDb) {
    db.merchant("loja").await;
    let m = db.merchant_id("loja").await;
    let start = Arc::new(Barrier::new(16));
    let claims = (0..16).map(|i| {
        let (store, start) = (db.store.clone(), start.clone());
        tokio::spawn(async move {
            let key = IdempotencyKey::parse(b"one-intent").expect("key");
            let request = ChargeRequest::from_json(body(1, 25_000).as_bytes()).expect("request");
            let claim = new_claim(m, &key, &request, LEASE, TTL);
            start.wait().await;
            match i % 4 {
                0 => vec![store.claim_alone(&claim).await],
                1 => vec![store.claim(&claim).await],
                2 => store.claim_batch(std::slice::from_ref(&claim)).await,
                _ => {
                    let twice = new_claim(m, &key, &request, LEASE, TTL);
                    store.claim_batch(&[claim, twice]).await
                }
            }
        })
    });
    let (mut winners, mut losers) = (Vec::new(), Vec::new());
    for answers in futures_util::future::join_all(claims).await {
        for answer in answers.expect("task") {
            match answer.expect("claim") {
                Claim::Won(record) => winners.push(record.subject.id),
                Claim::Lost(record) => losers.push(record.subject.id),
                other => panic!("{other:?}"),
            }
        }
    }
    assert_eq!(winners.len(), 1, "one claim wins");
    assert_eq!(losers.len(), 19);
    assert!(
        losers.iter().all(|id| *id == winners[0]),
        "every other finds its charge"
    );
    assert_eq!(db.count("charges").await, 1);
    assert_eq!(db.count("idempotency_keys").await, 1);
}

/// A completed key answers the same request with its stored answer, and
/// another request with its own record (the engine's `422`): never a second
/// charge, and the answer written once.
async fn a_stored_answer_is_replayed_and_another_request_under_its_key_is_told_apart(db: TestDb) {
    db.merchant("loja").await;
    let m = db.merchant_id("loja").await;
    let key = IdempotencyKey::parse(b"replay-me").expect("key");
    let request = ChargeRequest::from_json(body(1, 100).as_bytes()).expect("request");
    let claim = new_claim(m, &key, &request, LEASE, TTL);
    let id = charge(&db, &claim, "first", TTL).await;

    let Claim::Lost(again) = db.store.claim(&claim).await.expect("claim") else {
        panic!("a completed key is not claimed again")
    };
    assert_eq!(again.subject.id, id);
    assert_eq!(again.fingerprint, claim.fingerprint);
    assert_eq!(again.subject.status, ChargeStatus::Captured);
    match &again.state {
        KeyState::Completed {
            response,
            expires_in,
        } => {
            assert_eq!(
                (response.status, response.body.as_ref()),
                (201, &b"first"[..])
            );
            assert!(*expires_in > Duration::from_secs(3000), "{expires_in:?}");
        }
        other => panic!("{other:?}"),
    }
    let second = StoredResponse {
        status: 201,
        body: Bytes::from_static(b"second"),
    };
    assert!(
        !db.store
            .finalize(m, &key, &again, &captured(&second), TTL)
            .await
            .expect("finalize"),
        "an outcome is written once"
    );

    let other = ChargeRequest::from_json(body(2, 100).as_bytes()).expect("request");
    let reuse = new_claim(m, &key, &other, LEASE, TTL);
    let Claim::Lost(found) = db.store.claim(&reuse).await.expect("claim") else {
        panic!("a key in use is not another request's")
    };
    assert_eq!(found.subject.id, id);
    assert_ne!(
        found.fingerprint, reuse.fingerprint,
        "the engine tells them apart"
    );
    match db.store.key_status(m, &key).await.expect("status") {
        Some(KeyStatus::Completed { status: 201, .. }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(db.count("charges").await, 1);
}

/// The same request after its key expired is a late retry, not a new intent,
/// at every stage of the key's end: its record past its time, its tombstone,
/// and, the tombstone gone too, the charge's own reference. Another request
/// under the expired key is a new intent.
async fn a_late_retry_finds_its_charge_through_the_record_the_tombstone_and_the_charge(db: TestDb) {
    db.merchant("loja").await;
    let m = db.merchant_id("loja").await;
    let late = |key: &'static [u8], order: i64| async move {
        let key = IdempotencyKey::parse(key).expect("key");
        let request = ChargeRequest::from_json(body(order, 100).as_bytes()).expect("request");
        (key, request)
    };

    let (tombstoned, a) = late(b"late-a", 1).await;
    let claim_a = new_claim(m, &tombstoned, &a, LEASE, TTL);
    let charge_a = charge(&db, &claim_a, "a", Duration::ZERO).await;
    match db.store.claim(&claim_a).await.expect("claim") {
        Claim::Expired(id) => assert_eq!(id, charge_a),
        other => panic!("through its record: {other:?}"),
    }
    assert!(matches!(
        db.store.key_status(m, &tombstoned).await.expect("status"),
        Some(KeyStatus::Expired { until: None, .. })
    ));
    assert_eq!(
        db.store
            .sweep_expired_keys(10, Duration::from_secs(600))
            .await
            .expect("sweep"),
        1
    );
    assert_eq!(db.count("idempotency_keys").await, 0);
    match db.store.claim(&claim_a).await.expect("claim") {
        Claim::Expired(id) => assert_eq!(id, charge_a),
        other => panic!("through its tombstone: {other:?}"),
    }
    assert!(matches!(
        db.store.key_status(m, &tombstoned).await.expect("status"),
        Some(KeyStatus::Expired { until: Some(_), .. })
    ));

    let (forgotten, b) = late(b"late-b", 2).await;
    let claim_b = new_claim(m, &forgotten, &b, LEASE, TTL);
    let charge_b = charge(&db, &claim_b, "b", Duration::ZERO).await;
    db.store
        .sweep_expired_keys(10, Duration::ZERO)
        .await
        .expect("sweep");
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        db.store.sweep_tombstones(10).await.expect("sweep"),
        1,
        "b's only"
    );
    assert!(db
        .store
        .key_status(m, &forgotten)
        .await
        .expect("status")
        .is_none());
    match db.store.claim(&claim_b).await.expect("claim") {
        Claim::Expired(id) => assert_eq!(id, charge_b),
        other => panic!("through the charge's reference: {other:?}"),
    }

    let (_, other) = late(b"late-a", 3).await;
    let reuse = new_claim(m, &tombstoned, &other, LEASE, TTL);
    match db.store.claim(&reuse).await.expect("claim") {
        Claim::Won(record) => assert_ne!(record.subject.id, charge_a),
        other => panic!("another request under an expired key is a new intent: {other:?}"),
    }
    assert_eq!(db.count("charges").await, 3);
}

fn captured(response: &StoredResponse) -> Settlement<'_> {
    settlement(ChargeStatus::Captured, response)
}

/// Sixteen claims of a new request under a key whose record expired: one
/// reclaims it, the others find its claim (on MariaDB the losers of the insert
/// deadlock on the reclaim, and run again).
async fn sixteen_claims_of_a_new_request_on_an_expired_key_make_one_charge(db: TestDb) {
    db.merchant("loja").await;
    let m = db.merchant_id("loja").await;
    let key = IdempotencyKey::parse(b"reused").expect("key");
    let old = ChargeRequest::from_json(body(1, 100).as_bytes()).expect("request");
    let claim = new_claim(m, &key, &old, LEASE, Duration::ZERO);
    let Claim::Won(record) = db.store.claim(&claim).await.expect("claim") else {
        panic!("wins")
    };
    let response = answer(b"{}");
    assert!(db
        .store
        .finalize(
            m,
            &key,
            &record,
            &settlement(ChargeStatus::Captured, &response),
            Duration::ZERO
        )
        .await
        .expect("finalize"));
    let start = Arc::new(Barrier::new(16));
    let claims = (0..16).map(|_| {
        let (store, start) = (db.store.clone(), start.clone());
        tokio::spawn(async move {
            let key = IdempotencyKey::parse(b"reused").expect("key");
            let request = ChargeRequest::from_json(body(2, 200).as_bytes()).expect("request");
            let claim = new_claim(m, &key, &request, LEASE, TTL);
            start.wait().await;
            store.claim_alone(&claim).await
        })
    });
    let (mut won, mut lost, mut errors) = (0, 0, Vec::new());
    for answer in futures_util::future::join_all(claims).await {
        match answer.expect("task") {
            Ok(Claim::Won(_)) => won += 1,
            Ok(Claim::Lost(_)) => lost += 1,
            Ok(other) => panic!("{other:?}"),
            Err(e) => errors.push(e.to_string()),
        }
    }
    assert!(
        errors.is_empty(),
        "won {won}, lost {lost}, errors {errors:?}"
    );
    assert_eq!((won, lost), (1, 15));
}

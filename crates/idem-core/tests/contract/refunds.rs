//! Refunds in the store (issue 39, its foundation): the database decides the
//! sum. A refund's claim inserts its key, reserves its amount against the
//! charge with a guarded update and makes the refund, in one transaction
//! committed before any acquirer call; a refusal leaves nothing behind.

use std::time::Duration;

use bytes::Bytes;
use idem_core::domain::{
    ChargeId, ChargeRequest, ChargeStatus, Fingerprint, IdempotencyKey, RefundRequest,
    RefundStatus, StoredResponse,
};
use idem_core::store::{
    Claim, NewRefundClaim, RefundClaim, RefundRecord, RefundSettlement, Refusal, Store, Taken,
};

use crate::support::*;
use idem_testkit::db::*;

crate::on_every_backend!(
    forty_refunds_of_ten_at_once_reserve_exactly_the_hundred_captured,
    one_key_sent_ten_times_at_once_is_one_refund,
    a_refused_refund_gives_its_amount_back_and_a_success_keeps_it,
    refunds_of_charges_that_cannot_refund_are_refused_and_leave_nothing,
    a_key_is_one_operations_whatever_it_is_sent_to,
    an_expired_refund_key_is_swept_and_its_tombstone_names_the_refund,
    an_expired_refund_key_is_made_anew_only_by_a_refund_the_charge_can_give,
    a_refunds_lease_is_taken_over_once_and_released_onto_the_refunds_schedule,
    ten_copies_of_a_new_request_on_an_expired_key_make_one_refund,
    a_small_refund_sent_ten_times_at_once_is_one_refund,
    different_requests_racing_on_an_expired_key_make_one_refund
);

/// A charge of `amount` for `merchant`, claimed and stored with `status`.
async fn charge(
    db: &TestDb,
    merchant_id: i64,
    order: i64,
    amount: i64,
    status: ChargeStatus,
) -> ChargeId {
    settled_charge(db, merchant_id, &body(order, amount), status).await
}

fn refund_body(amount: Option<i64>) -> RefundRequest {
    let body = match amount {
        Some(a) => format!(r#"{{"amount_cents": {a}}}"#),
        None => "{}".to_owned(),
    };
    RefundRequest::from_json(body.as_bytes()).expect("refund request")
}

async fn claim_refund(
    store: &Store,
    merchant_id: i64,
    key: &str,
    charge_id: &ChargeId,
    request: &RefundRequest,
) -> RefundClaim {
    let key = IdempotencyKey::parse(key.as_bytes()).expect("key");
    store
        .claim_refund(&NewRefundClaim {
            merchant_id,
            key: &key,
            fingerprint: Fingerprint::of_refund(charge_id, request),
            charge_id,
            request,
            lease: LEASE,
            key_ttl: TTL,
            traceparent: None,
        })
        .await
        .expect("claim refund")
}

async fn refunded_cents(db: &TestDb, charge_id: &ChargeId) -> i64 {
    let (n,): (i64,) = sqlx::query_as(&format!(
        "select refunded_cents from charges where id = '{}'",
        charge_id.as_str()
    ))
    .fetch_one(&db.pool)
    .await
    .expect("refunded_cents");
    n
}

async fn count(db: &TestDb, sql: &str) -> i64 {
    let (n,): (i64,) = sqlx::query_as(sql).fetch_one(&db.pool).await.expect(sql);
    n
}

/// Stores `record`'s outcome as `status`.
async fn settle(
    db: &TestDb,
    merchant_id: i64,
    key: &str,
    record: &RefundRecord,
    status: RefundStatus,
) -> bool {
    settle_for(db, merchant_id, key, record, status, TTL).await
}

/// [`settle`], the key honoured for `ttl`.
async fn settle_for(
    db: &TestDb,
    merchant_id: i64,
    key: &str,
    record: &RefundRecord,
    status: RefundStatus,
    ttl: Duration,
) -> bool {
    let response = StoredResponse {
        status: if status == RefundStatus::Succeeded {
            201
        } else {
            402
        },
        body: Bytes::from_static(b"{}"),
    };
    let key = IdempotencyKey::parse(key.as_bytes()).expect("key");
    db.store
        .finalize_refund(
            merchant_id,
            &key,
            record,
            &RefundSettlement {
                status,
                acquirer_refund_id: (status == RefundStatus::Succeeded).then_some("rf_1"),
                failure_reason: (status == RefundStatus::Failed).then_some("exceeds_capture"),
                response: &response,
                event: None,
                webhook: None,
                audit: None,
            },
            ttl,
        )
        .await
        .expect("finalize refund")
}

/// The issue's race: 40 refunds of 10 at once on a charge of 100, each its
/// own key, through three stores (three instances' pools) on one database.
/// Exactly 10 reserve; the other 30 are refused, naming nothing left; the
/// charge's reservations sum to 100. With the guard replaced by a read of
/// `refunded_cents` and a write of read + 10, PostgreSQL lets more through.
async fn forty_refunds_of_ten_at_once_reserve_exactly_the_hundred_captured(db: TestDb) {
    db.merchant("loja").await;
    let merchant_id = db.merchant_id("loja").await;
    let charge_id = charge(&db, merchant_id, 1, 100, ChargeStatus::Captured).await;
    let mut stores = vec![db.store.clone()];
    for _ in 0..2 {
        stores.push(Store::connect(&db.url, 8).await.expect("another instance"));
    }
    let request = refund_body(Some(10));
    let claims = (0..40).map(|n| {
        let store = stores[n % 3].clone();
        let (charge_id, request) = (charge_id.clone(), request.clone());
        tokio::spawn(async move {
            claim_refund(
                &store,
                merchant_id,
                &format!("refund-{n}"),
                &charge_id,
                &request,
            )
            .await
        })
    });
    let mut won = 0;
    let mut refused = 0;
    for claim in futures_util::future::join_all(claims).await {
        match claim.expect("task") {
            RefundClaim::Won(record) => {
                assert_eq!(record.subject.amount_cents.get(), 10);
                assert_eq!(record.subject.status, RefundStatus::Pending);
                won += 1;
            }
            RefundClaim::Refused(Refusal::Exceeds { remaining: 0 }) => refused += 1,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((won, refused), (10, 30));
    assert_eq!(refunded_cents(&db, &charge_id).await, 100);
    assert_eq!(count(&db, "select count(*) from refunds").await, 10);
    assert_eq!(
        count(
            &db,
            "select count(*) from idempotency_keys where refund_id is not null"
        )
        .await,
        10,
        "a refused claim leaves no key behind"
    );
}

/// Duplicates of one refund (one key, sent at once): one claim, the rest
/// find it, whatever the amount left; never a refusal for a duplicate.
async fn one_key_sent_ten_times_at_once_is_one_refund(db: TestDb) {
    db.merchant("loja").await;
    let merchant_id = db.merchant_id("loja").await;
    let charge_id = charge(&db, merchant_id, 1, 100, ChargeStatus::Captured).await;
    let request = refund_body(None);
    let claims = (0..10).map(|_| {
        let store = db.store.clone();
        let (charge_id, request) = (charge_id.clone(), request.clone());
        tokio::spawn(async move {
            claim_refund(&store, merchant_id, "one-refund", &charge_id, &request).await
        })
    });
    let (mut won, mut lost) = (Vec::new(), 0);
    for claim in futures_util::future::join_all(claims).await {
        match claim.expect("task") {
            RefundClaim::Won(record) => won.push(record),
            RefundClaim::Lost(taken) => match *taken {
                Taken::Refund(_) => lost += 1,
                Taken::Charge(_) | Taken::Step(_) => panic!("a refund's key"),
            },
            RefundClaim::Refused(refusal) => panic!("a duplicate was refused: {refusal:?}"),
            RefundClaim::Expired(id) => panic!("a live key expired: {id}"),
        }
    }
    assert_eq!((won.len(), lost), (1, 9));
    assert_eq!(
        won[0].subject.amount_cents.get(),
        100,
        "the whole remainder"
    );
    assert_eq!(refunded_cents(&db, &charge_id).await, 100);
}

async fn a_refused_refund_gives_its_amount_back_and_a_success_keeps_it(db: TestDb) {
    db.merchant("loja").await;
    let merchant_id = db.merchant_id("loja").await;
    let charge_id = charge(&db, merchant_id, 1, 100, ChargeStatus::Captured).await;
    let all = refund_body(Some(100));
    let RefundClaim::Won(first) =
        claim_refund(&db.store, merchant_id, "r-1", &charge_id, &all).await
    else {
        panic!("the first refund reserves")
    };
    assert!(matches!(
        claim_refund(
            &db.store,
            merchant_id,
            "r-2",
            &charge_id,
            &refund_body(Some(1))
        )
        .await,
        RefundClaim::Refused(Refusal::Exceeds { remaining: 0 })
    ));
    assert!(settle(&db, merchant_id, "r-1", &first, RefundStatus::Failed).await);
    assert!(
        !settle(&db, merchant_id, "r-1", &first, RefundStatus::Succeeded).await,
        "an outcome is stored once"
    );
    assert_eq!(
        refunded_cents(&db, &charge_id).await,
        0,
        "the refusal gave it back"
    );

    let RefundClaim::Won(second) =
        claim_refund(&db.store, merchant_id, "r-3", &charge_id, &all).await
    else {
        panic!("a new key refunds it again")
    };
    assert!(settle(&db, merchant_id, "r-3", &second, RefundStatus::Succeeded).await);
    assert_eq!(refunded_cents(&db, &charge_id).await, 100);
    let refunds = db
        .store
        .refunds_of(merchant_id, &charge_id)
        .await
        .expect("refunds");
    let statuses: Vec<_> = refunds.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [RefundStatus::Failed, RefundStatus::Succeeded]);
    let shown = db
        .store
        .refund(merchant_id, &second.subject.id)
        .await
        .expect("read")
        .expect("the refund");
    assert_eq!(shown.status, RefundStatus::Succeeded);
    assert_eq!(shown.capture_reference, second.subject.capture_reference);
    assert!(matches!(
        claim_refund(
            &db.store,
            merchant_id,
            "r-4",
            &charge_id,
            &refund_body(None)
        )
        .await,
        RefundClaim::Refused(Refusal::Exceeds { remaining: 0 })
    ));
}

/// A charge that cannot give money back refuses, and leaves the key free.
async fn refunds_of_charges_that_cannot_refund_are_refused_and_leave_nothing(db: TestDb) {
    db.merchant("loja").await;
    db.merchant("outra").await;
    let merchant_id = db.merchant_id("loja").await;
    let other_merchant = db.merchant_id("outra").await;
    let captured = charge(&db, merchant_id, 1, 100, ChargeStatus::Captured).await;
    let processing = charge(&db, merchant_id, 2, 100, ChargeStatus::Processing).await;
    let declined = charge(&db, merchant_id, 3, 100, ChargeStatus::Declined).await;
    let theirs = charge(&db, other_merchant, 4, 100, ChargeStatus::Captured).await;
    let some = refund_body(Some(10));
    let cases = [
        (
            &processing,
            Refusal::NotRefundable {
                status: ChargeStatus::Processing,
                under_review: false,
            },
        ),
        (
            &declined,
            Refusal::NotRefundable {
                status: ChargeStatus::Declined,
                under_review: false,
            },
        ),
        (&theirs, Refusal::NoSuchCharge),
        (&ChargeId::generate(), Refusal::NoSuchCharge),
    ];
    for (charge_id, refusal) in cases {
        match claim_refund(&db.store, merchant_id, "free", charge_id, &some).await {
            RefundClaim::Refused(got) => assert_eq!(got, refusal),
            other => panic!("{other:?}"),
        }
    }
    match claim_refund(
        &db.store,
        merchant_id,
        "free",
        &captured,
        &refund_body(Some(101)),
    )
    .await
    {
        RefundClaim::Refused(got) => assert_eq!(got, Refusal::Exceeds { remaining: 100 }),
        other => panic!("{other:?}"),
    }
    db.exec(&format!(
        "update charges set review_since = updated_at where id = '{}'",
        captured.as_str()
    ))
    .await;
    match claim_refund(&db.store, merchant_id, "free", &captured, &some).await {
        RefundClaim::Refused(got) => assert_eq!(
            got,
            Refusal::NotRefundable {
                status: ChargeStatus::Captured,
                under_review: true
            }
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(count(&db, "select count(*) from refunds").await, 0);
    assert_eq!(
        count(
            &db,
            "select count(*) from idempotency_keys where refund_id is not null"
        )
        .await,
        0
    );
    db.exec(&format!(
        "update charges set review_since = null where id = '{}'",
        captured.as_str()
    ))
    .await;
    assert!(
        matches!(
            claim_refund(&db.store, merchant_id, "free", &captured, &some).await,
            RefundClaim::Won(_)
        ),
        "the key stayed free"
    );
    assert_eq!(refunded_cents(&db, &theirs).await, 0);
}

/// One key names one operation: a charge's key sent to a refund finds the
/// charge; a refund's key sent to a refund of another charge finds the
/// refund, under another fingerprint (the engine answers 422 for both).
async fn a_key_is_one_operations_whatever_it_is_sent_to(db: TestDb) {
    db.merchant("loja").await;
    let merchant_id = db.merchant_id("loja").await;
    let key = IdempotencyKey::parse(b"shared").expect("key");
    let request = ChargeRequest::from_json(body(9, 100).as_bytes()).expect("request");
    let Claim::Won(charged) = db
        .store
        .claim(&new_claim(merchant_id, &key, &request, LEASE, TTL))
        .await
        .expect("claim")
    else {
        panic!("won")
    };
    let other = charge(&db, merchant_id, 1, 100, ChargeStatus::Captured).await;
    let some = refund_body(Some(10));
    match claim_refund(&db.store, merchant_id, "shared", &other, &some).await {
        RefundClaim::Lost(taken) => match *taken {
            Taken::Charge(record) => assert_eq!(record.subject.id, charged.subject.id),
            Taken::Refund(_) | Taken::Step(_) => panic!("the charge's key"),
        },
        claim => panic!("{claim:?}"),
    }
    let RefundClaim::Won(refund) = claim_refund(&db.store, merchant_id, "r", &other, &some).await
    else {
        panic!("won")
    };
    let third = charge(&db, merchant_id, 2, 100, ChargeStatus::Captured).await;
    match claim_refund(&db.store, merchant_id, "r", &third, &some).await {
        RefundClaim::Lost(taken) => match *taken {
            Taken::Refund(record) => {
                assert_eq!(record.subject.id, refund.subject.id);
                assert_ne!(record.fingerprint, Fingerprint::of_refund(&third, &some));
            }
            Taken::Charge(_) | Taken::Step(_) => panic!("the refund's key"),
        },
        claim => panic!("{claim:?}"),
    }
    // And a charge's claim of the refund's key makes no charge. (It is an
    // error today, as the charge path reads records through charges; the
    // engine must answer it 422 before refunds reach the API.)
    let refund_key = IdempotencyKey::parse(b"r").expect("key");
    let charges_before = db.count("charges").await;
    let lost = db
        .store
        .claim(&new_claim(merchant_id, &refund_key, &request, LEASE, TTL))
        .await;
    assert!(!matches!(lost, Ok(Claim::Won(_))), "{lost:?}");
    assert_eq!(db.count("charges").await, charges_before);
}

/// An expired refund's key is swept like a charge's, and its tombstone
/// names the refund.
async fn an_expired_refund_key_is_swept_and_its_tombstone_names_the_refund(db: TestDb) {
    db.merchant("loja").await;
    let merchant_id = db.merchant_id("loja").await;
    let charge_id = charge(&db, merchant_id, 1, 100, ChargeStatus::Captured).await;
    let RefundClaim::Won(record) = claim_refund(
        &db.store,
        merchant_id,
        "old",
        &charge_id,
        &refund_body(Some(5)),
    )
    .await
    else {
        panic!("won")
    };
    assert!(
        settle_for(
            &db,
            merchant_id,
            "old",
            &record,
            RefundStatus::Succeeded,
            Duration::ZERO
        )
        .await
    );
    let swept = db
        .store
        .sweep_expired_keys(100, Duration::from_secs(60))
        .await
        .expect("the sweeper takes a refund's record");
    assert_eq!(swept, 1);
    let (refund_id,): (Option<String>,) =
        sqlx::query_as("select refund_id from key_tombstones where idempotency_key = 'old'")
            .fetch_one(&db.pool)
            .await
            .expect("a tombstone");
    assert_eq!(refund_id.as_deref(), Some(record.subject.id.as_str()));
    assert_eq!(
        refunded_cents(&db, &charge_id).await,
        5,
        "expiry refunds nothing back"
    );
}

/// An expired refund's key, not yet swept: the same request again is told
/// its refund (a late retry, nothing claimed); another request that the
/// charge cannot give is refused and leaves the old record as it was;
/// another that it can give makes the key its own, a new refund under the
/// next attempt. The record a won claim answers is the one stored.
async fn an_expired_refund_key_is_made_anew_only_by_a_refund_the_charge_can_give(db: TestDb) {
    db.merchant("loja").await;
    let merchant_id = db.merchant_id("loja").await;
    let charge_id = charge(&db, merchant_id, 1, 100, ChargeStatus::Captured).await;
    let first = refund_body(Some(5));
    let RefundClaim::Won(old) = claim_refund(&db.store, merchant_id, "k", &charge_id, &first).await
    else {
        panic!("won")
    };
    let key = IdempotencyKey::parse(b"k").expect("key");
    let stored = db
        .store
        .refund_record(merchant_id, &key)
        .await
        .expect("read")
        .expect("a record");
    assert_eq!(
        format!("{:?}", old.subject),
        format!("{:?}", stored.subject)
    );
    assert_eq!(
        (old.attempt, &old.fingerprint),
        (stored.attempt, &stored.fingerprint)
    );
    assert!(
        settle_for(
            &db,
            merchant_id,
            "k",
            &old,
            RefundStatus::Succeeded,
            Duration::ZERO
        )
        .await
    );

    let late = claim_refund(&db.store, merchant_id, "k", &charge_id, &first).await;
    assert!(
        matches!(&late, RefundClaim::Expired(id) if *id == old.subject.id),
        "{late:?}"
    );
    let too_much = claim_refund(
        &db.store,
        merchant_id,
        "k",
        &charge_id,
        &refund_body(Some(96)),
    )
    .await;
    assert!(
        matches!(
            too_much,
            RefundClaim::Refused(Refusal::Exceeds { remaining: 95 })
        ),
        "{too_much:?}"
    );
    let kept = db
        .store
        .refund_record(merchant_id, &key)
        .await
        .expect("read")
        .expect("the old record, kept");
    assert_eq!(kept.subject.id, old.subject.id);
    assert!(kept.expired);

    let RefundClaim::Won(new) =
        claim_refund(&db.store, merchant_id, "k", &charge_id, &refund_body(None)).await
    else {
        panic!("a new request under the expired key wins")
    };
    assert_ne!(new.subject.id, old.subject.id);
    assert_eq!(new.attempt, old.attempt + 1);
    assert_eq!(new.subject.amount_cents.get(), 95, "what remained");
    let stored = db
        .store
        .refund_record(merchant_id, &key)
        .await
        .expect("read")
        .expect("the new record");
    assert_eq!(
        format!("{:?}", new.subject),
        format!("{:?}", stored.subject)
    );
    assert_eq!(stored.attempt, new.attempt);
    assert_eq!(refunded_cents(&db, &charge_id).await, 100);
    assert_eq!(count(&db, "select count(*) from refunds").await, 2);
}

/// A refund's record is fenced as a charge's: a lease over can be taken
/// once, a stale holder stores nothing, and a release schedules the
/// reconciler on the refund in the same write; the reservation stays.
async fn a_refunds_lease_is_taken_over_once_and_released_onto_the_refunds_schedule(db: TestDb) {
    use idem_core::store::Reschedule;

    db.merchant("loja").await;
    let merchant_id = db.merchant_id("loja").await;
    let charge_id = charge(&db, merchant_id, 1, 100, ChargeStatus::Captured).await;
    let key = IdempotencyKey::parse(b"slow").expect("key");
    let request = refund_body(Some(40));
    let RefundClaim::Won(stale) = db
        .store
        .claim_refund(&NewRefundClaim {
            merchant_id,
            key: &key,
            fingerprint: Fingerprint::of_refund(&charge_id, &request),
            charge_id: &charge_id,
            request: &request,
            lease: LEASE,
            key_ttl: TTL,
            traceparent: None,
        })
        .await
        .expect("claim")
    else {
        panic!("won")
    };
    assert!(
        db.store
            .take_over_refund(merchant_id, &key, stale.attempt, LEASE)
            .await
            .expect("take over")
            .is_none(),
        "a live lease cannot be taken"
    );
    end_leases(&db).await;
    let fresh = db
        .store
        .take_over_refund(merchant_id, &key, stale.attempt, LEASE)
        .await
        .expect("take over")
        .expect("a lease over is taken");
    assert_eq!(fresh.attempt, stale.attempt + 1);
    assert_eq!(fresh.subject.id, stale.subject.id);
    assert!(db
        .store
        .take_over_refund(merchant_id, &key, stale.attempt, LEASE)
        .await
        .expect("again")
        .is_none());
    assert!(
        !settle(&db, merchant_id, "slow", &stale, RefundStatus::Failed).await,
        "the stale holder stores nothing"
    );

    let wait = Reschedule {
        not_before: Some(Duration::from_secs(60)),
        reconciler_try: true,
    };
    db.store
        .release_refund(merchant_id, &key, stale.attempt, &wait)
        .await
        .expect("a stale release");
    assert_eq!(
        count(&db, "select reconcile_attempts from refunds").await,
        0,
        "a stale holder's release does nothing"
    );
    db.store
        .release_refund(merchant_id, &key, fresh.attempt, &wait)
        .await
        .expect("release");
    assert_eq!(
        count(&db, "select reconcile_attempts from refunds").await,
        1
    );
    let scheduled = match db.backend {
        idem_core::store::Backend::Postgres => {
            "select count(*) from refunds where next_reconcile_at > now() + interval '50 seconds'"
        }
        idem_core::store::Backend::Sqlite => {
            "select count(*) from refunds
              where next_reconcile_at > cast(unixepoch('subsec') * 1000 as integer) + 50000"
        }
        idem_core::store::Backend::MariaDb => {
            "select count(*) from refunds
              where next_reconcile_at > cast(unix_timestamp(now(3)) * 1000 as signed) + 50000"
        }
    };
    assert_eq!(
        count(&db, scheduled).await,
        1,
        "the refund waits for the reconciler"
    );
    assert_eq!(
        count(
            &db,
            "select count(*) from charges where next_reconcile_at is not null"
        )
        .await,
        0,
        "nothing scheduled on the charge"
    );
    assert_eq!(
        refunded_cents(&db, &charge_id).await,
        40,
        "an unknown outcome keeps it"
    );
    // Released: taken over at once by the next attempt.
    assert!(db
        .store
        .take_over_refund(merchant_id, &key, fresh.attempt, LEASE)
        .await
        .expect("take over")
        .is_some());
}

/// One new refund request sent ten times at once under a key whose record
/// expired: one refund, the other nine find it.
async fn ten_copies_of_a_new_request_on_an_expired_key_make_one_refund(db: TestDb) {
    db.merchant("loja").await;
    let merchant_id = db.merchant_id("loja").await;
    let charge_id = charge(&db, merchant_id, 1, 100, ChargeStatus::Captured).await;
    let first = refund_body(Some(5));
    let RefundClaim::Won(old) = claim_refund(&db.store, merchant_id, "k", &charge_id, &first).await
    else {
        panic!("won")
    };
    assert!(
        settle_for(
            &db,
            merchant_id,
            "k",
            &old,
            RefundStatus::Succeeded,
            Duration::ZERO
        )
        .await
    );
    let (won, lost) = race_refunds(
        &db,
        merchant_id,
        &charge_id,
        "k",
        vec![refund_body(Some(10)); 10],
    )
    .await;
    assert_eq!((won, lost), (1, 9));
    assert_eq!(refunded_cents(&db, &charge_id).await, 15);
}

/// A refund of ten cents sent ten times at once under one key, with room for
/// all ten: one refund (each copy's reservation would hold; the key decides).
async fn a_small_refund_sent_ten_times_at_once_is_one_refund(db: TestDb) {
    db.merchant("loja").await;
    let merchant_id = db.merchant_id("loja").await;
    let charge_id = charge(&db, merchant_id, 1, 100, ChargeStatus::Captured).await;
    let (won, lost) = race_refunds(
        &db,
        merchant_id,
        &charge_id,
        "fresh",
        vec![refund_body(Some(10)); 10],
    )
    .await;
    assert_eq!((won, lost), (1, 9));
    assert_eq!(refunded_cents(&db, &charge_id).await, 10);
}

/// Eight different refunds racing for a key whose record expired: one takes
/// it, the others find it taken; none fails.
async fn different_requests_racing_on_an_expired_key_make_one_refund(db: TestDb) {
    db.merchant("loja").await;
    let merchant_id = db.merchant_id("loja").await;
    let charge_id = charge(&db, merchant_id, 1, 100, ChargeStatus::Captured).await;
    let first = refund_body(Some(5));
    let RefundClaim::Won(old) = claim_refund(&db.store, merchant_id, "k", &charge_id, &first).await
    else {
        panic!("won")
    };
    assert!(
        settle_for(
            &db,
            merchant_id,
            "k",
            &old,
            RefundStatus::Succeeded,
            Duration::ZERO
        )
        .await
    );
    let (won, lost) = race_refunds(
        &db,
        merchant_id,
        &charge_id,
        "k",
        (0..8).map(|i| refund_body(Some(10 + i))).collect(),
    )
    .await;
    assert_eq!((won, lost), (1, 7));
}

/// `requests` claimed under `key` on the charge all at once: how many won and
/// how many lost; none may fail.
async fn race_refunds(
    db: &TestDb,
    merchant_id: i64,
    charge_id: &ChargeId,
    key: &'static str,
    requests: Vec<RefundRequest>,
) -> (usize, usize) {
    let claims = requests.into_iter().map(|request| {
        let (store, charge_id) = (db.store.clone(), charge_id.clone());
        tokio::spawn(async move {
            let key = IdempotencyKey::parse(key.as_bytes()).expect("key");
            store
                .claim_refund(&NewRefundClaim {
                    merchant_id,
                    key: &key,
                    fingerprint: Fingerprint::of_refund(&charge_id, &request),
                    charge_id: &charge_id,
                    request: &request,
                    lease: LEASE,
                    key_ttl: TTL,
                    traceparent: None,
                })
                .await
        })
    });
    let (mut won, mut lost, mut errors) = (0, 0, Vec::new());
    for claim in futures_util::future::join_all(claims).await {
        match claim.expect("task") {
            Ok(RefundClaim::Won(_)) => won += 1,
            Ok(RefundClaim::Lost(_)) => lost += 1,
            Ok(other) => panic!("{other:?}"),
            Err(e) => errors.push(e.to_string()),
        }
    }
    assert!(
        errors.is_empty(),
        "won {won}, lost {lost}, errors {errors:?}"
    );
    (won, lost)
}

//! The steps of a two-step charge: a capture reserves its amount against the
//! authorization, and a void closes it, each by a guarded update of the
//! charge's row in the claim's own committed transaction. Captures never sum
//! above the authorization, a void never releases what a pending capture is
//! taking, and a refused step gives back what it reserved.

use std::sync::Arc;

use crate::support::*;
use idem_core::domain::{
    AmountCents, CaptureRequest, ChargeId, ChargeStatus, Fingerprint, IdempotencyKey, StepKind,
    StepStatus,
};
use idem_core::store::{
    NewStepClaim, Refusal, StepClaim, StepRecord, StepSettlement, Store, Taken,
};
use idem_testkit::db::*;
use tokio::sync::Barrier;

crate::on_every_backend!(
    ten_captures_of_thirty_at_once_reserve_at_most_the_hundred_authorized,
    one_capture_key_sent_ten_times_at_once_is_one_capture,
    a_void_waits_for_pending_captures_and_closes_the_authorization,
    a_refused_final_capture_gives_back_its_amount_and_reopens_the_authorization,
    a_half_capture_leaves_the_rest_capturable,
    a_refused_expiry_void_is_not_found_again,
    a_small_capture_sent_ten_times_at_once_is_one_capture,
    sixty_then_forty_of_a_hundred_is_captured_and_not_expired,
);

/// A two-step charge of `amount`, authorized.
async fn authorization(db: &TestDb, merchant_id: i64, amount: i64) -> ChargeId {
    let json = format!(r#"{{"order_id": 7, "amount_cents": {amount}, "capture": false}}"#);
    settled_charge(db, merchant_id, &json, ChargeStatus::Authorized).await
}

/// A claim of a capture (`Some(amount)`, or `None` for what remains) or, with
/// `kind` a void, of the void.
async fn claim_step(
    store: &Store,
    merchant_id: i64,
    key: &str,
    charge_id: &ChargeId,
    kind: StepKind,
    amount: Option<i64>,
    final_capture: bool,
) -> StepClaim {
    let key = IdempotencyKey::parse(key.as_bytes()).expect("key");
    let amount = amount.map(|a| AmountCents::parse(a).expect("amount"));
    let fingerprint = match kind {
        StepKind::Capture => Fingerprint::of_capture(
            charge_id,
            &CaptureRequest {
                amount_cents: amount,
                final_capture,
            },
        ),
        StepKind::Void => Fingerprint::of_void(charge_id),
    };
    store
        .claim_step(&NewStepClaim {
            merchant_id,
            key: &key,
            fingerprint,
            charge_id,
            kind,
            amount,
            final_capture: kind == StepKind::Void || final_capture,
            lease: LEASE,
            key_ttl: TTL,
            traceparent: None,
        })
        .await
        .expect("claim step")
}

async fn capture(
    db: &TestDb,
    m: i64,
    key: &str,
    id: &ChargeId,
    amount: i64,
    last: bool,
) -> StepClaim {
    claim_step(&db.store, m, key, id, StepKind::Capture, Some(amount), last).await
}

async fn void(db: &TestDb, m: i64, key: &str, id: &ChargeId) -> StepClaim {
    claim_step(&db.store, m, key, id, StepKind::Void, None, true).await
}

/// Stores a step's outcome as the acquirer's `status`.
async fn settle(db: &TestDb, merchant_id: i64, key: &str, record: &StepRecord, status: StepStatus) {
    let key = IdempotencyKey::parse(key.as_bytes()).expect("key");
    let response = answer(b"{}");
    let settled = StepSettlement {
        status,
        acquirer_id: (status == StepStatus::Succeeded).then_some("acq_1"),
        failure_reason: (status == StepStatus::Failed).then_some("refused"),
        response: &response,
        event: None,
        webhook: None,
        audit: None,
    };
    assert!(db
        .store
        .finalize_step(merchant_id, &key, record, &settled, TTL)
        .await
        .expect("finalize step"));
}

fn won(claim: StepClaim) -> StepRecord {
    match claim {
        StepClaim::Won(record) => *record,
        other => panic!("the step should have been claimed, got {other:?}"),
    }
}

fn refused(claim: StepClaim) -> Refusal {
    match claim {
        StepClaim::Refused(why) => why,
        other => panic!("the step should have been refused, got {other:?}"),
    }
}

/// (status, captured, capturable) of the charge, as clients read it.
async fn charge_state(db: &TestDb, merchant_id: i64, id: &ChargeId) -> (ChargeStatus, i64, i64) {
    let charge = db
        .store
        .charge(merchant_id, id)
        .await
        .expect("read")
        .expect("the charge");
    let a = charge.authorization.expect("a two-step charge");
    (
        charge.status,
        a.amount_captured_cents,
        a.amount_capturable_cents,
    )
}

async fn ten_captures_of_thirty_at_once_reserve_at_most_the_hundred_authorized(db: TestDb) {
    db.merchant("loja").await;
    let m = db.merchant_id("loja").await;
    let id = authorization(&db, m, 100).await;
    let start = Arc::new(Barrier::new(10));
    let claims = (0..10).map(|i| {
        let (store, id, start) = (db.store.clone(), id.clone(), start.clone());
        tokio::spawn(async move {
            start.wait().await;
            let key = format!("capture-{i}");
            claim_step(&store, m, &key, &id, StepKind::Capture, Some(30), false).await
        })
    });
    let (mut made, mut refusals) = (0, Vec::new());
    for claim in futures_util::future::join_all(claims).await {
        match claim.expect("task") {
            StepClaim::Won(_) => made += 1,
            StepClaim::Refused(why) => refusals.push(why),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(made, 3, "three captures of 30 fit in 100");
    assert!(
        refusals
            .iter()
            .all(|r| *r == Refusal::ExceedsAuthorization { remaining: 10 }),
        "each refusal says what was left when it was refused: {refusals:?}"
    );
    assert_eq!(
        charge_state(&db, m, &id).await,
        (ChargeStatus::Authorized, 0, 10)
    );
    assert_eq!(
        db.count("authorization_steps").await,
        3,
        "a refusal leaves nothing"
    );
}

async fn one_capture_key_sent_ten_times_at_once_is_one_capture(db: TestDb) {
    db.merchant("loja").await;
    let m = db.merchant_id("loja").await;
    let id = authorization(&db, m, 100).await;
    let start = Arc::new(Barrier::new(10));
    let claims = (0..10).map(|_| {
        let (store, id, start) = (db.store.clone(), id.clone(), start.clone());
        tokio::spawn(async move {
            start.wait().await;
            claim_step(
                &store,
                m,
                "ship-it",
                &id,
                StepKind::Capture,
                Some(60),
                false,
            )
            .await
        })
    });
    let (mut winners, mut seen) = (Vec::new(), Vec::new());
    for claim in futures_util::future::join_all(claims).await {
        match claim.expect("task") {
            StepClaim::Won(record) => winners.push(record.subject.id),
            StepClaim::Lost(taken) => match *taken {
                Taken::Step(record) => seen.push(record.subject.id),
                other => panic!("the key is the capture's, got {other:?}"),
            },
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "one capture");
    assert!(seen.iter().all(|s| *s == winners[0]), "every other sees it");
    assert_eq!(
        charge_state(&db, m, &id).await,
        (ChargeStatus::Authorized, 0, 40)
    );
}

async fn a_void_waits_for_pending_captures_and_closes_the_authorization(db: TestDb) {
    db.merchant("loja").await;
    let m = db.merchant_id("loja").await;
    let id = authorization(&db, m, 100).await;

    let part = won(capture(&db, m, "part", &id, 40, false).await);
    assert_eq!(
        refused(void(&db, m, "void", &id).await),
        Refusal::CapturePending,
        "a void would release what the pending capture is taking"
    );
    settle(&db, m, "part", &part, StepStatus::Succeeded).await;
    assert_eq!(
        charge_state(&db, m, &id).await,
        (ChargeStatus::Authorized, 40, 60)
    );

    let voiding = won(void(&db, m, "void", &id).await);
    assert_eq!(
        refused(capture(&db, m, "late", &id, 10, false).await),
        Refusal::AuthorizationClosed,
        "nothing is captured behind a pending void"
    );
    settle(&db, m, "void", &voiding, StepStatus::Succeeded).await;
    let (status, captured, _) = charge_state(&db, m, &id).await;
    assert_eq!(
        (status, captured),
        (ChargeStatus::Captured, 40),
        "a void after a capture leaves the charge captured for what it took"
    );
    assert!(matches!(
        refused(capture(&db, m, "later", &id, 10, false).await),
        Refusal::NotAuthorized {
            status: ChargeStatus::Captured,
            under_review: false
        }
    ));
}

async fn a_refused_final_capture_gives_back_its_amount_and_reopens_the_authorization(db: TestDb) {
    db.merchant("loja").await;
    let m = db.merchant_id("loja").await;
    let id = authorization(&db, m, 100).await;

    let whole = won(capture(&db, m, "whole", &id, 100, true).await);
    assert_eq!(
        refused(capture(&db, m, "more", &id, 1, false).await),
        Refusal::AuthorizationClosed
    );
    settle(&db, m, "whole", &whole, StepStatus::Failed).await;
    assert_eq!(
        charge_state(&db, m, &id).await,
        (ChargeStatus::Authorized, 0, 100),
        "the refused capture's reservation and its close are given back"
    );
    won(capture(&db, m, "again", &id, 60, false).await);
    assert_eq!(
        charge_state(&db, m, &id).await,
        (ChargeStatus::Authorized, 0, 40)
    );
}

/// A non-final capture of half the authorization leaves it authorized, the
/// other half capturable.
async fn a_half_capture_leaves_the_rest_capturable(db: TestDb) {
    db.merchant("loja").await;
    let m = db.merchant_id("loja").await;
    let id = authorization(&db, m, 100).await;
    let half = won(capture(&db, m, "half", &id, 50, false).await);
    settle(&db, m, "half", &half, StepStatus::Succeeded).await;
    assert_eq!(
        charge_state(&db, m, &id).await,
        (ChargeStatus::Authorized, 50, 50),
        "half of a non-final capture leaves the rest capturable"
    );
}

/// Expiry's void refused for good: expiry does not find the authorization
/// again.
async fn a_refused_expiry_void_is_not_found_again(db: TestDb) {
    db.merchant("loja").await;
    let m = db.merchant_id("loja").await;
    let id = authorization(&db, m, 100).await;
    let key = format!("{}{}", idem_core::domain::EXPIRY_KEY_PREFIX, id.as_str());
    let voiding = won(void(&db, m, &key, &id).await);
    settle(&db, m, &key, &voiding, StepStatus::Failed).await;
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let due = db
        .store
        .expired_authorizations(std::time::Duration::from_millis(1), 10)
        .await
        .expect("expired");
    assert!(due.is_empty(), "a refused expiry void is final: {due:?}");
}

/// A capture of ten sent ten times at once under one key, with room for all
/// ten: one capture.
async fn a_small_capture_sent_ten_times_at_once_is_one_capture(db: TestDb) {
    db.merchant("loja").await;
    let m = db.merchant_id("loja").await;
    let id = authorization(&db, m, 100).await;
    let claims = (0..10).map(|_| {
        let (store, id) = (db.store.clone(), id.clone());
        tokio::spawn(async move {
            let key = IdempotencyKey::parse(b"cap").expect("key");
            let amount = Some(AmountCents::parse(10).expect("amount"));
            store
                .claim_step(&NewStepClaim {
                    merchant_id: m,
                    key: &key,
                    fingerprint: Fingerprint::of_capture(
                        &id,
                        &CaptureRequest {
                            amount_cents: amount,
                            final_capture: false,
                        },
                    ),
                    charge_id: &id,
                    kind: StepKind::Capture,
                    amount,
                    final_capture: false,
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
            Ok(StepClaim::Won(_)) => won += 1,
            Ok(StepClaim::Lost(_)) => lost += 1,
            Ok(other) => panic!("{other:?}"),
            Err(e) => errors.push(e.to_string()),
        }
    }
    assert!(
        errors.is_empty(),
        "won {won}, lost {lost}, errors {errors:?}"
    );
    assert_eq!((won, lost), (1, 9));
}

/// Two non-final captures that take the whole authorization make the charge
/// captured, with nothing for expiry to void.
async fn sixty_then_forty_of_a_hundred_is_captured_and_not_expired(db: TestDb) {
    db.merchant("loja").await;
    let m = db.merchant_id("loja").await;
    let id = authorization(&db, m, 100).await;
    let a = won(capture(&db, m, "a", &id, 60, false).await);
    settle(&db, m, "a", &a, StepStatus::Succeeded).await;
    let b = won(capture(&db, m, "b", &id, 40, false).await);
    settle(&db, m, "b", &b, StepStatus::Succeeded).await;
    assert_eq!(
        charge_state(&db, m, &id).await,
        (ChargeStatus::Captured, 100, 0)
    );
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let due = db
        .store
        .expired_authorizations(std::time::Duration::from_millis(1), 10)
        .await
        .expect("expired");
    assert!(due.is_empty(), "nothing left to void: {due:?}");
}

//! Charges as operators find them: the console's filters (merchant, status,
//! order, key, time, review), one charge with its key record, a charge set
//! aside for review, and the authorizations expiry voids.

use std::time::Duration;

use bytes::Bytes;
use idem_core::domain::{ChargeId, ChargeStatus, IdempotencyKey, MessageId, StepKind};
use idem_core::store::{ChargeFilter, NewStepClaim, NewWebhook, StepClaim};
use idem_testkit::db::*;

use crate::support::*;

crate::on_every_backend!(
    the_console_finds_any_charge_by_what_an_operator_knows,
    a_charge_set_aside_for_review_is_listed_and_its_key_says_so,
    expiry_finds_old_authorizations_with_nothing_pending,
);

fn filter() -> ChargeFilter {
    ChargeFilter {
        limit: 100,
        ..ChargeFilter::default()
    }
}

/// The ids `filter` lists, sorted (charges made in one millisecond have no
/// order between them).
async fn listed(db: &TestDb, filter: ChargeFilter) -> Vec<String> {
    let mut ids: Vec<String> = db
        .store
        .charges(&filter)
        .await
        .expect("list")
        .into_iter()
        .map(|c| c.id)
        .collect();
    ids.sort();
    ids
}

fn sorted(ids: &[&ChargeId]) -> Vec<String> {
    let mut ids: Vec<String> = ids.iter().map(|id| id.as_str().to_owned()).collect();
    ids.sort();
    ids
}

async fn the_console_finds_any_charge_by_what_an_operator_knows(db: TestDb) {
    db.merchant("loja").await;
    db.merchant("outra").await;
    let (loja, outra) = (db.merchant_id("loja").await, db.merchant_id("outra").await);
    let captured = settled_charge(&db, loja, &body(1, 100), ChargeStatus::Captured).await;
    let declined = settled_charge(&db, loja, &body(2, 200), ChargeStatus::Declined).await;
    let processing = settled_charge(&db, loja, &body(3, 300), ChargeStatus::Processing).await;
    let theirs = settled_charge(&db, outra, &body(1, 100), ChargeStatus::Captured).await;

    let of = |merchant: &str| ChargeFilter {
        merchant: Some(merchant.to_owned()),
        ..filter()
    };
    assert_eq!(
        listed(&db, of("loja")).await,
        sorted(&[&captured, &declined, &processing])
    );
    assert_eq!(
        listed(
            &db,
            ChargeFilter {
                status: Some(ChargeStatus::Captured),
                ..filter()
            }
        )
        .await,
        sorted(&[&captured, &theirs])
    );
    assert_eq!(
        listed(
            &db,
            ChargeFilter {
                order_id: Some(1),
                ..of("outra")
            }
        )
        .await,
        sorted(&[&theirs])
    );
    let key_of_declined = db
        .store
        .charge_record(declined.as_str())
        .await
        .expect("read")
        .expect("the charge")
        .key
        .expect("its key record")
        .idempotency_key;
    assert_eq!(
        listed(
            &db,
            ChargeFilter {
                idempotency_key: Some(key_of_declined),
                ..of("loja")
            }
        )
        .await,
        sorted(&[&declined])
    );
    let newest = db
        .store
        .charges(&ChargeFilter {
            limit: 1,
            ..filter()
        })
        .await
        .expect("list");
    assert_eq!(newest.len(), 1);
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    assert!(listed(
        &db,
        ChargeFilter {
            since: Some(later),
            ..filter()
        }
    )
    .await
    .is_empty());

    assert!(
        db.store
            .charge(outra, &captured)
            .await
            .expect("read")
            .is_none(),
        "another merchant's"
    );
    let mine = db
        .store
        .charge(loja, &captured)
        .await
        .expect("read")
        .expect("mine");
    assert_eq!(
        (mine.status, mine.amount_cents.get()),
        (ChargeStatus::Captured, 100)
    );
    assert!(db
        .store
        .charge_record("ch_nothing")
        .await
        .expect("read")
        .is_none());
}

async fn a_charge_set_aside_for_review_is_listed_and_its_key_says_so(db: TestDb) {
    db.merchant("loja").await;
    let m = db.merchant_id("loja").await;
    let key = IdempotencyKey::parse(b"contradicted").expect("key");
    let request =
        idem_core::domain::ChargeRequest::from_json(body(1, 100).as_bytes()).expect("request");
    let claim = new_claim(m, &key, &request, LEASE, TTL);
    let idem_core::store::Claim::Won(record) = db.store.claim(&claim).await.expect("claim") else {
        panic!("a fresh key wins")
    };
    let id = record.subject.id;
    let webhook = || NewWebhook {
        event_id: MessageId::event(),
        event_type: "charge.review_required",
        body: Bytes::from_static(b"{}"),
    };
    assert!(db.store.stuck_charges().await.expect("stuck").is_empty());
    db.store
        .mark_for_review(&id, "the acquirer contradicted itself", &webhook())
        .await
        .expect("mark");
    db.store
        .mark_for_review(&id, "again", &webhook())
        .await
        .expect("mark again");

    let stuck = db.store.stuck_charges().await.expect("stuck");
    assert_eq!(stuck.len(), 1);
    assert_eq!(
        (stuck[0].id.as_str(), stuck[0].review_reason.as_deref()),
        (id.as_str(), Some("the acquirer contradicted itself")),
        "marked once: the first reason stays"
    );
    assert_eq!(
        listed(
            &db,
            ChargeFilter {
                awaiting_review: true,
                ..filter()
            }
        )
        .await,
        sorted(&[&id])
    );
    let found = db
        .store
        .key_record(m, &key)
        .await
        .expect("read")
        .expect("the record");
    assert!(found.under_review, "no attempt calls the acquirer for it");
    assert_eq!(
        found.subject.status,
        ChargeStatus::Processing,
        "only the acquirer's word settles it"
    );
}

async fn expiry_finds_old_authorizations_with_nothing_pending(db: TestDb) {
    db.merchant("loja").await;
    let m = db.merchant_id("loja").await;
    let json =
        |order: i64| format!(r#"{{"order_id": {order}, "amount_cents": 100, "capture": false}}"#);
    let idle = settled_charge(&db, m, &json(1), ChargeStatus::Authorized).await;
    let capturing = settled_charge(&db, m, &json(2), ChargeStatus::Authorized).await;
    settled_charge(&db, m, &body(3, 100), ChargeStatus::Captured).await;
    let key = IdempotencyKey::parse(b"capture-some").expect("key");
    let amount = idem_core::domain::AmountCents::parse(40).expect("amount");
    let claimed = db
        .store
        .claim_step(&NewStepClaim {
            merchant_id: m,
            key: &key,
            fingerprint: idem_core::domain::Fingerprint::of_capture(
                &capturing,
                &idem_core::domain::CaptureRequest {
                    amount_cents: Some(amount),
                    final_capture: false,
                },
            ),
            charge_id: &capturing,
            kind: StepKind::Capture,
            amount: Some(amount),
            final_capture: false,
            lease: LEASE,
            key_ttl: TTL,
            traceparent: None,
        })
        .await
        .expect("claim");
    assert!(matches!(claimed, StepClaim::Won(_)));

    tokio::time::sleep(Duration::from_millis(20)).await;
    let due = db
        .store
        .expired_authorizations(Duration::from_millis(1), 10)
        .await
        .expect("expired");
    let ids: Vec<&str> = due.iter().map(|(_, id)| id.as_str()).collect();
    assert_eq!(
        ids,
        [idle.as_str()],
        "not the one with a capture pending, not a captured charge"
    );
    assert_eq!(due[0].0.name, "loja");
    assert!(db
        .store
        .expired_authorizations(Duration::from_secs(3600), 10)
        .await
        .expect("expired")
        .is_empty());
}

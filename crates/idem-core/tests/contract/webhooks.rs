//! Webhook deliveries: written with the outcome that makes their event, then
//! leased to one deliverer at a time (at most so many in flight per
//! endpoint), each attempt settled only by the deliverer that holds it.

use std::time::Duration;

use crate::support::*;
use bytes::Bytes;
use idem_core::domain::{ChargeStatus, MessageId};
use idem_core::store::{AttemptOutcome, Audit, DueDelivery, NewEndpoint, NewWebhook, Settlement};
use idem_testkit::db::*;

crate::on_every_backend!(
    a_delivery_is_leased_to_one_deliverer_and_settled_by_its_attempt_only,
    an_endpoint_has_at_most_its_share_of_deliveries_in_flight,
);

const BY: Audit<'static> = Audit {
    actor: "ops",
    reason: None,
};
const LONG: Duration = Duration::from_secs(30);

/// A merchant `loja` with one endpoint hearing every event; its id.
async fn merchant_with_endpoint(db: &TestDb) -> i64 {
    db.merchant("loja").await;
    db.store
        .add_webhook_endpoint(
            &NewEndpoint {
                id: "we_contract",
                merchant: "loja",
                url: "https://example.test/hooks",
                events: None,
                secret: "whsec_contract",
            },
            &BY,
        )
        .await
        .expect("endpoint");
    db.merchant_id("loja").await
}

/// A captured charge whose outcome writes a `charge.captured` webhook; its id.
async fn captured_charge(db: &TestDb, merchant_id: i64, order: i64) -> String {
    let response = answer(b"{}");
    let webhook = NewWebhook {
        event_id: MessageId::event(),
        event_type: "charge.captured",
        body: Bytes::from_static(b"{\"type\": \"charge.captured\"}"),
    };
    let settled = Settlement {
        webhook: Some(&webhook),
        ..settlement(ChargeStatus::Captured, &response)
    };
    let id = settle_new(db, merchant_id, &body(order, 100), settled).await;
    id.as_str().to_owned()
}

async fn take(db: &TestDb, lease: Duration, per_endpoint: i64) -> Vec<DueDelivery> {
    db.store
        .take_webhook_deliveries(10, lease, per_endpoint)
        .await
        .expect("take")
}

async fn finish(db: &TestDb, d: &DueDelivery, attempt: i32, outcome: AttemptOutcome) -> bool {
    db.store
        .finish_webhook_delivery(d.id, attempt, &outcome)
        .await
        .expect("finish")
}

fn retry_now() -> AttemptOutcome {
    AttemptOutcome::Retry {
        status: Some(500),
        error: "the endpoint answered 500".to_owned(),
        after: Duration::ZERO,
    }
}

async fn a_delivery_is_leased_to_one_deliverer_and_settled_by_its_attempt_only(db: TestDb) {
    let m = merchant_with_endpoint(&db).await;
    let charge = captured_charge(&db, m, 1).await;

    let first = take(&db, LONG, 10).await;
    assert_eq!(first.len(), 1, "the outcome wrote its delivery");
    let d = &first[0];
    assert_eq!(
        (d.attempt, d.event_type.as_str(), d.endpoint_id.as_str()),
        (1, "charge.captured", "we_contract")
    );
    assert!(
        take(&db, LONG, 10).await.is_empty(),
        "leased: no second deliverer"
    );
    assert!(!finish(&db, d, 2, retry_now()).await, "not its attempt");
    assert!(finish(&db, d, 1, retry_now()).await);

    // Due again at once; this deliverer's lease runs out before it finishes.
    let second = take(&db, Duration::from_millis(50), 10).await;
    assert_eq!(second.iter().map(|d| d.attempt).collect::<Vec<_>>(), [2]);
    tokio::time::sleep(Duration::from_millis(120)).await;
    let third = take(&db, LONG, 10).await;
    assert_eq!(
        third.iter().map(|d| d.attempt).collect::<Vec<_>>(),
        [3],
        "a lease run out is another deliverer's"
    );
    assert!(
        !finish(&db, d, 2, AttemptOutcome::Delivered { status: 200 }).await,
        "the deliverer whose lease ran out settles nothing"
    );
    assert!(finish(&db, d, 3, AttemptOutcome::Delivered { status: 204 }).await);
    assert!(take(&db, LONG, 10).await.is_empty(), "delivered is done");

    assert_eq!(db.store.webhook_backlog().await.expect("backlog").0, 0);
    let shown = db
        .store
        .charge_deliveries(&charge, 10)
        .await
        .expect("deliveries");
    assert_eq!(shown.len(), 1);
    assert_eq!(
        (
            shown[0].state.as_str(),
            shown[0].attempts,
            shown[0].last_status
        ),
        ("delivered", 3, Some(204))
    );
}

async fn an_endpoint_has_at_most_its_share_of_deliveries_in_flight(db: TestDb) {
    let m = merchant_with_endpoint(&db).await;
    for order in 1..=3 {
        captured_charge(&db, m, order).await;
    }
    assert_eq!(db.store.webhook_backlog().await.expect("backlog").0, 3);
    let one = take(&db, LONG, 1).await;
    assert_eq!(one.len(), 1, "one in flight for this endpoint");
    assert!(take(&db, LONG, 1).await.is_empty(), "its share is taken");
    assert_eq!(
        take(&db, LONG, 3).await.len(),
        2,
        "a larger share takes the rest"
    );
    assert!(finish(&db, &one[0], 1, AttemptOutcome::Delivered { status: 200 }).await);
    assert_eq!(db.store.webhook_backlog().await.expect("backlog").0, 2);
}

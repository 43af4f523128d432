//! The acquirer's refunds (docs/contract/acquirer.md, "POST /v1/refunds"):
//! idem's client against the simulator over loopback, with its faults, and
//! against an acquirer that refuses a retry of a refund it has already paid.

use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::{get, post};
use idem_core::acquirer::protocol::{CaptureRequest, RefundRequest};
use idem_core::acquirer::{Acquirer, AcquirerClient, AcquirerError, Refunded};
use idem_lab::sim::Fault;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::sim_on_loopback::Sim;

fn client(url: &str) -> AcquirerClient {
    AcquirerClient::new(url, Duration::from_secs(2), None).expect("client")
}

async fn captured(client: &AcquirerClient, reference: &str, amount_cents: i64) {
    let capture = CaptureRequest {
        reference: reference.into(),
        merchant: "loja".into(),
        order_id: 1,
        amount_cents,
        currency: "BRL".into(),
    };
    client.capture(&capture).await.expect("captured");
}

fn refund(reference: &str, capture_reference: &str, amount_cents: i64) -> RefundRequest {
    RefundRequest {
        reference: reference.into(),
        capture_reference: capture_reference.into(),
        merchant: "loja".into(),
        amount_cents,
        currency: "BRL".into(),
    }
}

fn refused_for(settled: &Result<Refunded, AcquirerError>) -> Option<&str> {
    match settled {
        Err(AcquirerError::Rejected { reason, .. }) => reason.as_deref(),
        _ => None,
    }
}

#[tokio::test]
async fn refunds_are_paid_once_per_reference_and_never_above_the_capture() {
    let sim = Sim::start().await;
    let acquirer = client(&sim.url);
    captured(&acquirer, "cap-1", 100).await;
    let before = acquirer.lookup_refund(&refund("rf-1", "cap-1", 60)).await;
    assert!(matches!(before, Ok(None)), "{before:?}");

    let first = acquirer
        .refund(&refund("rf-1", "cap-1", 60))
        .await
        .expect("refunded");
    let again = acquirer
        .refund(&refund("rf-1", "cap-1", 60))
        .await
        .expect("the same");
    assert_eq!(first, again, "a known reference repeats its outcome");
    let looked_up = acquirer.lookup_refund(&refund("rf-1", "cap-1", 60)).await;
    assert!(matches!(looked_up, Ok(Some(Ok(r))) if r == first));
    let too_much = acquirer.refund(&refund("rf-2", "cap-1", 41)).await;
    assert_eq!(refused_for(&too_much), Some("exceeds_capture"));
    acquirer
        .refund(&refund("rf-3", "cap-1", 40))
        .await
        .expect("the rest");
    let unknown = acquirer.refund(&refund("rf-4", "nowhere", 1)).await;
    assert_eq!(refused_for(&unknown), Some("unknown_capture"));

    let ledger = sim.ledger().await;
    assert_eq!(ledger.refunds.len(), 2);
    assert_eq!(
        ledger.refunds.iter().map(|r| r.amount_cents).sum::<i64>(),
        100
    );
}

#[tokio::test]
async fn an_unknown_refund_is_settled_by_the_same_reference_and_a_lie_is_a_contradiction() {
    let sim = Sim::start().await;
    let acquirer = client(&sim.url);
    captured(&acquirer, "cap-1", 1_000).await;
    for (n, fault) in [
        Fault::ErrorAfter,
        Fault::DropAfter,
        Fault::Status(409),
        Fault::Status(503),
    ]
    .into_iter()
    .enumerate()
    {
        let request = refund(&format!("rf-{n}"), "cap-1", 100);
        sim.once(fault).await;
        let first = acquirer.refund(&request).await;
        assert!(
            matches!(first, Err(AcquirerError::Unknown(_))),
            "{fault:?}: {first:?}"
        );
        acquirer.refund(&request).await.expect("settled by a retry");
    }
    // error-after and drop-after paid on the first call, the statuses on the
    // retry: four refunds, one per reference.
    let ledger = sim.ledger().await;
    assert_eq!(ledger.refunds.len(), 4);

    sim.once(Fault::WrongAmount).await;
    let lie = acquirer.refund(&refund("rf-lie", "cap-1", 100)).await;
    assert!(
        matches!(&lie, Err(AcquirerError::Contradicted(c)) if c.differences == ["amount_cents 101 (asked 100)"]),
        "{lie:?}"
    );
}

/// An acquirer that answers every refund POST `422` ("nothing left to
/// refund") and every lookup with `lookup`: the worst a real one does to a
/// retry of a refund it has already paid.
async fn refusing_acquirer(lookup: (StatusCode, &'static str)) -> (String, CancellationToken) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let router = axum::Router::new()
        .route(
            "/v1/refunds",
            post(|| async {
                (
                    StatusCode::UNPROCESSABLE_ENTITY,
                    r#"{"status":"refused","reference":"rf-1","reason":"exceeds_capture"}"#,
                )
            }),
        )
        .route(
            "/v1/refunds/{reference}",
            get(move || async move { lookup }),
        );
    let stop = CancellationToken::new();
    let token = stop.clone();
    tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(token.cancelled_owned())
            .await
    });
    (url, stop)
}

#[tokio::test]
async fn a_refusal_is_looked_up_before_it_is_believed() {
    let paid = r#"{"status":"refunded","refund_id":"rf_9","reference":"rf-1","amount_cents":100,"currency":"BRL"}"#;
    let (url, stop) = refusing_acquirer((StatusCode::OK, paid)).await;
    let settled = client(&url).refund(&refund("rf-1", "cap-1", 100)).await;
    assert_eq!(
        settled.expect("the lookup found it paid"),
        Refunded {
            refund_id: "rf_9".into()
        }
    );
    stop.cancel();

    let (url, stop) = refusing_acquirer((StatusCode::NOT_FOUND, "")).await;
    let settled = client(&url).refund(&refund("rf-1", "cap-1", 100)).await;
    assert_eq!(
        refused_for(&settled),
        Some("exceeds_capture"),
        "{settled:?}"
    );
    stop.cancel();

    let (url, stop) = refusing_acquirer((StatusCode::SERVICE_UNAVAILABLE, "")).await;
    let settled = client(&url).refund(&refund("rf-1", "cap-1", 100)).await;
    assert!(
        matches!(settled, Err(AcquirerError::Unknown(_))),
        "a refusal the lookup cannot confirm is no answer: {settled:?}"
    );
    stop.cancel();
}

/// The simulator's `refuse-paid`: a retry of a paid refund is answered `422`,
/// as some acquirers do; idem's client looks it up and takes it as paid.
#[tokio::test]
async fn the_simulator_can_refuse_a_refund_it_has_paid_and_the_client_is_not_fooled() {
    let sim = Sim::start().await;
    let acquirer = client(&sim.url);
    captured(&acquirer, "cap-1", 100).await;
    let request = refund("rf-1", "cap-1", 100);
    let paid = acquirer.refund(&request).await.expect("paid");
    sim.once(Fault::RefusePaid).await;
    assert_eq!(
        sim.raw_post("/v1/refunds", "rf-1", &request).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "the lie itself"
    );
    sim.once(Fault::RefusePaid).await;
    assert_eq!(acquirer.refund(&request).await.expect("not fooled"), paid);
    assert_eq!(sim.ledger().await.refunds.len(), 1);
}

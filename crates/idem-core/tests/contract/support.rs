//! What the contract's tests share: a stored answer, a charge's settlement,
//! and a charge claimed and settled as the engine would.

use std::time::Duration;

use bytes::Bytes;
use idem_core::domain::{ChargeId, ChargeRequest, ChargeStatus, IdempotencyKey, StoredResponse};
use idem_core::store::{Backend, Claim, Settlement};
use idem_testkit::db::*;

/// The lease a claim asks for, longer than any test.
pub const LEASE: Duration = Duration::from_secs(30);
/// How long a completed key is honoured, longer than any test.
pub const TTL: Duration = Duration::from_secs(3600);

/// A `201` answer with `body`, as the engine stores one.
pub fn answer(body: &'static [u8]) -> StoredResponse {
    StoredResponse {
        status: 201,
        body: Bytes::from_static(body),
    }
}

/// A charge's outcome as `status`, answering `response`, with nothing else
/// written beside it (no event, no webhook, no audit).
pub fn settlement(status: ChargeStatus, response: &StoredResponse) -> Settlement<'_> {
    Settlement {
        status,
        capture_id: Some("cap_1"),
        decline_reason: None,
        response,
        event: None,
        webhook: None,
        audit: None,
    }
}

/// A charge of the request `json` for `merchant_id`, under a fresh key,
/// claimed and, unless `status` is `processing`, stored as `status`.
pub async fn settled_charge(
    db: &TestDb,
    merchant_id: i64,
    json: &str,
    status: ChargeStatus,
) -> ChargeId {
    let response = answer(b"{}");
    settle_new(db, merchant_id, json, settlement(status, &response)).await
}

/// A charge of the request `json` under a fresh key, claimed and stored with
/// `settled` (unless it says `processing`).
pub async fn settle_new(
    db: &TestDb,
    merchant_id: i64,
    json: &str,
    settled: Settlement<'_>,
) -> ChargeId {
    let key = IdempotencyKey::parse(new_key().as_bytes()).expect("key");
    let request = ChargeRequest::from_json(json.as_bytes()).expect("request");
    let claim = new_claim(merchant_id, &key, &request, LEASE, TTL);
    let Claim::Won(record) = db.store.claim(&claim).await.expect("claim") else {
        panic!("a fresh key wins")
    };
    if settled.status != ChargeStatus::Processing {
        assert!(db
            .store
            .finalize(merchant_id, &key, &record, &settled, TTL)
            .await
            .expect("finalize"));
    }
    record.subject.id
}

/// Ends every in-flight lease now, as the clock would once it ran out: the
/// tests see a lease live (a long one, whatever the machine's load), then
/// over, without sleeping on a short one.
pub async fn end_leases(db: &TestDb) {
    let past = match db.backend {
        Backend::Postgres => "now() - interval '1 second'".to_owned(),
        Backend::Sqlite | Backend::MariaDb => format!("{} - 1000", db.now()),
    };
    db.exec(&format!(
        "update idempotency_keys set locked_until = {past} where state = 'in_flight'"
    ))
    .await;
}

//! A refund through the engine's paths: paid once and replayed, its amount
//! reserved while its outcome is unknown and settled by a lookup, refused
//! for good (the amount given back), taken over and fenced, and sent to
//! review when the acquirer contradicts it.

use idem_core::domain::{ChargeId, RefundId, RefundIntent, RefundRequest, SubjectId};
use idem_core::idempotency::{Outcome, Reconciled};
use idem_core::store::Refusal;

use crate::charges::settle_orphans;
use crate::fake::{Call, Gate, Says};
use crate::support::*;

/// A refund of `charge_id`: of `amount_cents`, or of what remains.
fn refund(charge_id: &ChargeId, amount_cents: Option<i64>) -> RefundIntent {
    let body = amount_cents.map_or_else(String::new, |a| format!(r#"{{"amount_cents": {a}}}"#));
    RefundIntent {
        charge_id: charge_id.clone(),
        request: RefundRequest::from_json(body.as_bytes()).expect("refund request"),
    }
}

fn refund_id(subject: SubjectId) -> RefundId {
    match subject {
        SubjectId::Refund(id) => id,
        other => panic!("expected a refund, got {other}"),
    }
}

async fn refund_reference(h: &Harness, id: &RefundId) -> String {
    h.db.store
        .refund(h.merchant.id, id)
        .await
        .expect("read")
        .expect("the refund")
        .acquirer_reference
        .as_str()
        .to_owned()
}

/// A refund is paid once under its own reference, stored and replayed; with
/// all of the charge refunded, a refund under another key is refused before
/// anything is claimed or called.
#[tokio::test]
async fn a_refund_is_paid_once_under_its_own_reference_stored_and_replayed() {
    let h = Harness::new().await;
    let charge_id = h.captured_charge(2_500).await;
    h.acquirer.script(Call::Refund, [Says::Done("ref_1")]);
    let (key, intent) = (fresh_key(), refund(&charge_id, None));

    let (subject, response, replayed) = completed(
        h.engine
            .submit(&h.merchant, &key, &intent)
            .await
            .expect("refund"),
    );
    assert!(!replayed);
    assert_eq!(response.status, 201, "{}", text(&response));
    assert_eq!(json(&response)["status"], "succeeded");
    assert_eq!(json(&response)["amount_cents"], 2_500);
    let reference = refund_reference(&h, &refund_id(subject)).await;
    assert_eq!(h.acquirer.references(Call::Refund), vec![reference.clone()]);
    assert_ne!(reference, h.reference_of(&charge_id).await);
    assert_eq!(h.events().await, ["charge.captured", "refund.succeeded"]);

    let (_, again, replayed) = completed(
        h.another_instance()
            .submit(&h.merchant, &key, &intent)
            .await
            .expect("again"),
    );
    assert!(replayed);
    assert_eq!(again, response);

    let more = h
        .engine
        .submit(&h.merchant, &fresh_key(), &refund(&charge_id, Some(1)))
        .await
        .expect("more");
    assert!(
        matches!(more, Outcome::Refused(Refusal::Exceeds { remaining: 0 })),
        "{more:?}"
    );
    assert_eq!(h.acquirer.calls(Call::Refund), 1);
    h.all_answers_used();
}

/// A refund whose outcome is unknown keeps its amount reserved (another
/// refund finds nothing left) until the reconciler's lookup finds it paid;
/// no second POST, and the client's retry replays it.
#[tokio::test]
async fn an_unknown_refund_keeps_its_amount_and_the_reconciler_settles_it_by_a_lookup() {
    let h = Harness::new().await;
    let charge_id = h.captured_charge(2_500).await;
    h.acquirer.script(Call::Refund, [Says::timeout()]);
    h.acquirer.script(Call::LookupRefund, [Says::Done("ref_1")]);
    let (key, intent) = (fresh_key(), refund(&charge_id, None));

    let unknown = h
        .engine
        .submit(&h.merchant, &key, &intent)
        .await
        .expect("refund");
    assert!(matches!(unknown, Outcome::Unknown { .. }), "{unknown:?}");
    let more = h
        .engine
        .submit(&h.merchant, &fresh_key(), &refund(&charge_id, Some(1)))
        .await
        .expect("more");
    assert!(
        matches!(more, Outcome::Refused(Refusal::Exceeds { remaining: 0 })),
        "reserved while unknown: {more:?}"
    );

    let Reconciled::Outcome(outcome) = settle_orphans(&h, KEY_TTL).await else {
        panic!("not settled")
    };
    let (_, response, _) = completed(outcome);
    assert_eq!(response.status, 201, "{}", text(&response));
    assert_eq!(h.acquirer.calls(Call::Refund), 1, "no second POST");
    assert_eq!(h.acquirer.calls(Call::LookupRefund), 1);
    let (_, again, replayed) = completed(
        h.engine
            .submit(&h.merchant, &key, &intent)
            .await
            .expect("retry"),
    );
    assert!(replayed);
    assert_eq!(again, response);
    h.all_answers_used();
}

/// A refusal is final for its key (`422 refund-failed`, replayed) and gives
/// its amount back: a refund of all of it under a new key is paid.
#[tokio::test]
async fn a_refused_refund_is_final_for_its_key_and_gives_its_amount_back() {
    let h = Harness::new().await;
    let charge_id = h.captured_charge(2_500).await;
    h.acquirer.script(
        Call::Refund,
        [Says::Refused("unknown_capture"), Says::Done("ref_2")],
    );
    let (key, intent) = (fresh_key(), refund(&charge_id, Some(2_500)));

    let (subject, response, _) = completed(
        h.engine
            .submit(&h.merchant, &key, &intent)
            .await
            .expect("refund"),
    );
    assert_eq!(response.status, 422, "{}", text(&response));
    assert_eq!(json(&response)["type"], "urn:idem:problem:refund-failed");
    assert!(text(&response).contains("unknown_capture"));
    let (_, again, replayed) = completed(
        h.engine
            .submit(&h.merchant, &key, &intent)
            .await
            .expect("again"),
    );
    assert!(replayed);
    assert_eq!(again, response);

    let (other, paid, _) = completed(
        h.engine
            .submit(&h.merchant, &fresh_key(), &refund(&charge_id, Some(2_500)))
            .await
            .expect("new key"),
    );
    assert_eq!(paid.status, 201, "{}", text(&paid));
    assert_ne!(other, subject);
    let references = h.acquirer.references(Call::Refund);
    assert_eq!(references.len(), 2);
    assert_ne!(
        references[0], references[1],
        "a new refund, a new reference"
    );
    h.all_answers_used();
}

/// A refund's first attempt hangs at the acquirer: a duplicate meanwhile is
/// `409`; past the lease a retry takes it over and pays it under the same
/// reference, and the stale holder, answered at last, is fenced out.
#[tokio::test]
async fn a_refund_taken_over_after_its_lease_re_drives_its_reference_and_fences_the_stale_holder() {
    let h = Harness::new().await;
    let charge_id = h.captured_charge(2_500).await;
    let gate = Gate::new();
    h.acquirer.script(
        Call::Refund,
        [
            Says::held(&gate, Says::Refused("heard_by_the_stale_holder")),
            Says::Done("ref_1"),
        ],
    );
    let (key, intent) = (fresh_key(), refund(&charge_id, None));
    let stale = tokio::spawn({
        let (engine, merchant, key, intent) = (
            h.engine.clone(),
            h.merchant.clone(),
            key.clone(),
            intent.clone(),
        );
        async move { engine.submit(&merchant, &key, &intent).await }
    });
    gate.reached().await;
    let duplicate = h
        .engine
        .submit(&h.merchant, &key, &intent)
        .await
        .expect("dup");
    assert!(
        matches!(duplicate, Outcome::InFlight { .. }),
        "{duplicate:?}"
    );

    h.end_leases().await;
    let (subject, fresh, replayed) = completed(
        h.another_instance()
            .submit(&h.merchant, &key, &intent)
            .await
            .expect("take over"),
    );
    assert!(!replayed);
    assert_eq!(fresh.status, 201, "{}", text(&fresh));
    let reference = refund_reference(&h, &refund_id(subject)).await;
    assert_eq!(h.acquirer.references(Call::Refund), vec![reference; 2]);

    gate.open();
    let (_, answered, replayed) = completed(stale.await.expect("task").expect("stale"));
    assert!(replayed, "fenced out, it answers with the stored outcome");
    assert_eq!(answered, fresh);
    assert_eq!(h.attempt(&key).await, (2, true));
    assert_eq!(h.events().await, ["charge.captured", "refund.succeeded"]);
    h.all_answers_used();
}

/// A refund the acquirer made otherwise than asked goes to a person: `503`
/// under review, the refund marked, and no retry calls the acquirer again.
#[tokio::test]
async fn a_contradicted_refund_goes_to_review_and_is_not_called_again() {
    let h = Harness::new().await;
    let charge_id = h.captured_charge(2_500).await;
    h.acquirer.script(
        Call::Refund,
        [Says::Contradicted("amount_cents 2400 (asked 2500)")],
    );
    let (key, intent) = (fresh_key(), refund(&charge_id, None));

    let outcome = h
        .engine
        .submit(&h.merchant, &key, &intent)
        .await
        .expect("refund");
    let Outcome::UnderReview { subject, .. } = outcome else {
        panic!("expected under review, got {outcome:?}")
    };
    let detail =
        h.db.store
            .refund_detail(refund_id(subject).as_str())
            .await
            .expect("read")
            .expect("the refund");
    assert!(detail.awaiting_review());
    assert_eq!(detail.status, "pending");

    h.end_leases().await;
    let again = h
        .engine
        .submit(&h.merchant, &key, &intent)
        .await
        .expect("retry");
    assert!(matches!(again, Outcome::UnderReview { .. }), "{again:?}");
    assert_eq!(h.acquirer.calls(Call::Refund), 1);
    h.all_answers_used();
}

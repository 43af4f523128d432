//! A two-step payment through the engine's paths: the authorization (its own
//! call, declined for good too), a capture of it (once, replayed, taken over
//! and fenced), a void whose outcome is unknown until its lookup, and a void
//! refused for good.

use idem_core::domain::{CaptureIntent, CaptureRequest, ChargeId, StepId, SubjectId, VoidIntent};
use idem_core::idempotency::{Outcome, Reconciled};

use crate::charges::settle_orphans;
use crate::fake::{Call, Gate, Says};
use crate::support::*;

/// A capture of `charge_id`'s authorization: of `amount_cents` (not final),
/// or of what remains (final).
fn capture(charge_id: &ChargeId, amount_cents: Option<i64>) -> CaptureIntent {
    let body = amount_cents.map_or_else(String::new, |a| {
        format!(r#"{{"amount_cents": {a}, "final": false}}"#)
    });
    CaptureIntent {
        charge_id: charge_id.clone(),
        request: CaptureRequest::from_json(body.as_bytes()).expect("capture request"),
    }
}

fn void(charge_id: &ChargeId) -> VoidIntent {
    VoidIntent {
        charge_id: charge_id.clone(),
    }
}

fn step_id(subject: SubjectId) -> StepId {
    match subject {
        SubjectId::Step(id) => id,
        other => panic!("expected a capture or a void, got {other}"),
    }
}

async fn step_reference(h: &Harness, id: &StepId) -> String {
    h.db.store
        .step(h.merchant.id, id)
        .await
        .expect("read")
        .expect("the step")
        .acquirer_reference
        .as_str()
        .to_owned()
}

/// A charge made with `"capture": false` is an authorization (its own call,
/// never a capture); a capture of it is one call under the capture's own
/// reference, stored and replayed.
#[tokio::test]
async fn an_authorization_then_its_capture_each_call_once_and_the_capture_is_replayed() {
    let h = Harness::new().await;
    let charge_id = h.authorized_charge(2_500).await;
    assert_eq!(h.acquirer.calls(Call::Authorize), 1);
    assert_eq!(
        h.acquirer.calls(Call::Capture),
        0,
        "authorized, not captured"
    );
    assert_eq!(h.charge(&charge_id).await.status.as_str(), "authorized");

    h.acquirer
        .script(Call::CaptureAuthorization, [Says::Done("cap_1")]);
    let (key, intent) = (fresh_key(), capture(&charge_id, None));
    let (subject, response, replayed) = completed(
        h.engine
            .submit(&h.merchant, &key, &intent)
            .await
            .expect("capture"),
    );
    assert!(!replayed);
    assert_eq!(response.status, 201, "{}", text(&response));
    assert_eq!(json(&response)["status"], "succeeded");
    let reference = step_reference(&h, &step_id(subject)).await;
    assert_eq!(
        h.acquirer.references(Call::CaptureAuthorization),
        vec![reference.clone()]
    );
    assert_ne!(reference, h.reference_of(&charge_id).await);
    assert_eq!(h.charge(&charge_id).await.status.as_str(), "captured");
    assert_eq!(h.events().await, ["charge.authorized", "capture.succeeded"]);

    let (_, again, replayed) = completed(
        h.another_instance()
            .submit(&h.merchant, &key, &intent)
            .await
            .expect("again"),
    );
    assert!(replayed);
    assert_eq!(again, response);
    assert_eq!(h.acquirer.calls(Call::CaptureAuthorization), 1);
    h.all_answers_used();
}

/// A declined authorization is final: `402`, stored and replayed, asked once.
#[tokio::test]
async fn a_declined_authorization_is_final_stored_and_replayed() {
    let h = Harness::new().await;
    h.acquirer
        .script(Call::Authorize, [Says::Declined("do_not_honor")]);
    let (key, request) = (fresh_key(), authorization(1, 2_500));
    let (subject, response, _) = completed(
        h.engine
            .submit(&h.merchant, &key, &request)
            .await
            .expect("submit"),
    );
    assert_eq!(response.status, 402, "{}", text(&response));
    assert_eq!(
        h.charge(&charge_id(subject)).await.status.as_str(),
        "declined"
    );
    let (_, again, replayed) = completed(
        h.engine
            .submit(&h.merchant, &key, &request)
            .await
            .expect("again"),
    );
    assert!(replayed);
    assert_eq!(again, response);
    assert_eq!(h.acquirer.calls(Call::Authorize), 1);
    h.all_answers_used();
}

/// A capture's first attempt hangs at the acquirer past its lease: a retry
/// takes it over and captures under the same reference; the stale holder,
/// answered at last, is fenced out and answers with the stored outcome.
#[tokio::test]
async fn a_capture_taken_over_after_its_lease_re_drives_its_reference_and_fences_the_stale_holder()
{
    let h = Harness::new().await;
    let charge_id = h.authorized_charge(2_500).await;
    let gate = Gate::new();
    h.acquirer.script(
        Call::CaptureAuthorization,
        [
            Says::held(&gate, Says::Refused("heard_by_the_stale_holder")),
            Says::Done("cap_1"),
        ],
    );
    let (key, intent) = (fresh_key(), capture(&charge_id, Some(1_000)));
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
    h.end_leases().await;

    let (subject, fresh, replayed) = completed(
        h.another_instance()
            .submit(&h.merchant, &key, &intent)
            .await
            .expect("take over"),
    );
    assert!(!replayed);
    assert_eq!(fresh.status, 201, "{}", text(&fresh));
    let reference = step_reference(&h, &step_id(subject)).await;
    assert_eq!(
        h.acquirer.references(Call::CaptureAuthorization),
        vec![reference; 2]
    );

    gate.open();
    let (_, answered, replayed) = completed(stale.await.expect("task").expect("stale"));
    assert!(replayed, "fenced out, it answers with the stored outcome");
    assert_eq!(answered, fresh);
    assert_eq!(h.attempt(&key).await, (2, true));
    let authorization = h.charge(&charge_id).await.authorization.expect("two-step");
    assert_eq!(authorization.amount_captured_cents, 1_000);
    assert_eq!(h.events().await, ["charge.authorized", "capture.succeeded"]);
    h.all_answers_used();
}

/// A void whose outcome is unknown leaves the authorization as it was until
/// the reconciler's lookup finds it voided: no second POST, the charge
/// voided, the client's retry replays it.
#[tokio::test]
async fn an_unknown_void_is_settled_by_its_lookup_without_a_second_void() {
    let h = Harness::new().await;
    let charge_id = h.authorized_charge(2_500).await;
    h.acquirer.script(Call::Void, [Says::timeout()]);
    h.acquirer.script(Call::LookupVoid, [Says::Done("void_1")]);
    let (key, intent) = (fresh_key(), void(&charge_id));

    let unknown = h
        .engine
        .submit(&h.merchant, &key, &intent)
        .await
        .expect("void");
    assert!(matches!(unknown, Outcome::Unknown { .. }), "{unknown:?}");
    assert_eq!(h.charge(&charge_id).await.status.as_str(), "authorized");

    let Reconciled::Outcome(outcome) = settle_orphans(&h, KEY_TTL).await else {
        panic!("not settled")
    };
    let (_, response, _) = completed(outcome);
    assert_eq!(response.status, 201, "{}", text(&response));
    assert_eq!(h.acquirer.calls(Call::Void), 1, "no second POST");
    assert_eq!(h.acquirer.calls(Call::LookupVoid), 1);
    assert_eq!(h.charge(&charge_id).await.status.as_str(), "voided");
    assert_eq!(h.events().await, ["charge.authorized", "void.succeeded"]);
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

/// A void refused for good is final for its key (`422 void-failed`,
/// replayed), and the authorization stays open: a capture of it is made.
#[tokio::test]
async fn a_refused_void_is_final_and_the_authorization_stays_open() {
    let h = Harness::new().await;
    let charge_id = h.authorized_charge(2_500).await;
    h.acquirer
        .script(Call::Void, [Says::Refused("authorization_closed")]);
    h.acquirer
        .script(Call::CaptureAuthorization, [Says::Done("cap_1")]);
    let (key, intent) = (fresh_key(), void(&charge_id));

    let (_, response, _) = completed(
        h.engine
            .submit(&h.merchant, &key, &intent)
            .await
            .expect("void"),
    );
    assert_eq!(response.status, 422, "{}", text(&response));
    assert_eq!(json(&response)["type"], "urn:idem:problem:void-failed");
    let (_, again, replayed) = completed(
        h.engine
            .submit(&h.merchant, &key, &intent)
            .await
            .expect("again"),
    );
    assert!(replayed);
    assert_eq!(again, response);
    assert_eq!(h.charge(&charge_id).await.status.as_str(), "authorized");

    let (_, captured, _) = completed(
        h.engine
            .submit(&h.merchant, &fresh_key(), &capture(&charge_id, None))
            .await
            .expect("capture"),
    );
    assert_eq!(captured.status, 201, "{}", text(&captured));
    assert_eq!(h.acquirer.calls(Call::Void), 1);
    h.all_answers_used();
}

//! A one-step charge through each of the engine's paths: the winner, the
//! replay, the duplicate in flight, the take-over and its fence, the unknown
//! outcome settled later, the contradiction sent to review, the late retry,
//! and the acquirer's final refusals.

use std::time::Duration;

use idem_core::domain::ChargeRequest;
use idem_core::idempotency::{Outcome, Reconciled, Resolution};
use idem_core::store::{Audit, KeyStatus};

use crate::fake::{Call, Gate, Says};
use crate::support::*;

/// The winner of a fresh key calls the acquirer once, and stores the answer
/// it returns.
#[tokio::test]
async fn a_winner_calls_the_acquirer_once_and_stores_its_answer() {
    let h = Harness::new().await;
    h.acquirer.script(Call::Capture, [Says::Done("cap_1")]);
    let key = fresh_key();

    let outcome = h
        .engine
        .submit(&h.merchant, &key, &charge(1, 2_500))
        .await
        .expect("submit");

    let (subject, response, replayed) = completed(outcome);
    assert!(!replayed);
    assert_eq!(response.status, 201, "{}", text(&response));
    let id = charge_id(subject);
    assert_eq!(json(&response)["id"], id.as_str());
    assert_eq!(json(&response)["status"], "captured");
    let reference = h.reference_of(&id).await;
    assert_eq!(h.acquirer.references(Call::Capture), vec![reference]);
    assert_eq!(
        h.attempt(&key).await,
        (1, true),
        "stored by the first attempt"
    );
    let record =
        h.db.store
            .charge_record(id.as_str())
            .await
            .expect("read")
            .expect("the charge");
    assert_eq!(record.charge.acquirer_capture_id.as_deref(), Some("cap_1"));
    assert_eq!(h.events().await, ["charge.captured"]);
    h.all_answers_used();
}

/// The same request again is answered with the stored bytes, from this
/// instance's memory and from another instance's read of the database,
/// and the acquirer is not asked again.
#[tokio::test]
async fn a_replay_answers_the_stored_bytes_and_calls_nothing() {
    let h = Harness::new().await;
    h.acquirer.script(Call::Capture, [Says::Done("cap_1")]);
    let (key, request) = (fresh_key(), charge(1, 2_500));
    let (_, first, _) = completed(
        h.engine
            .submit(&h.merchant, &key, &request)
            .await
            .expect("first"),
    );

    for engine in [&h.engine, &h.another_instance()] {
        let (_, again, replayed) = completed(
            engine
                .submit(&h.merchant, &key, &request)
                .await
                .expect("again"),
        );
        assert!(replayed);
        assert_eq!(again, first, "byte for byte");
    }
    assert_eq!(h.acquirer.calls(Call::Capture), 1);
    h.all_answers_used();
}

/// While the first attempt waits on the acquirer, a duplicate is told `409`
/// at once, on this instance (from the database, then from memory) and on
/// another; a different request under the key is told apart. None of them
/// calls the acquirer; once the first stores its answer, they replay it.
#[tokio::test]
async fn a_duplicate_while_the_first_is_at_the_acquirer_is_409_and_calls_nothing() {
    let h = Harness::new().await;
    let gate = Gate::new();
    h.acquirer
        .script(Call::Capture, [Says::held(&gate, Says::Done("cap_1"))]);
    let (key, request) = (fresh_key(), charge(1, 2_500));
    let first = tokio::spawn({
        let (engine, merchant, key, request) = (
            h.engine.clone(),
            h.merchant.clone(),
            key.clone(),
            request.clone(),
        );
        async move { engine.submit(&merchant, &key, &request).await }
    });
    gate.reached().await;

    let other = h.another_instance();
    for engine in [&h.engine, &h.engine, &other] {
        match engine
            .submit(&h.merchant, &key, &request)
            .await
            .expect("dup")
        {
            Outcome::InFlight { retry_after, .. } => {
                assert_eq!(retry_after, IN_FLIGHT_RETRY_AFTER)
            }
            different => panic!("expected 409, got {different:?}"),
        }
    }
    match h
        .engine
        .submit(&h.merchant, &key, &charge(1, 2_600))
        .await
        .expect("reuse")
    {
        Outcome::Mismatch { fields, .. } => assert_eq!(fields, vec!["amount_cents"]),
        different => panic!("expected 422, got {different:?}"),
    }
    assert_eq!(h.acquirer.calls(Call::Capture), 1, "only the first called");

    gate.open();
    let (_, stored, replayed) = completed(first.await.expect("task").expect("first"));
    assert!(!replayed);
    // The holder's instance forgets the key as it stores the answer; `other`
    // may still answer 409 from its memory for a second (memo.rs says why),
    // so a third instance stands for the database's answer.
    for engine in [&h.engine, &h.another_instance()] {
        let (_, again, replayed) = completed(
            engine
                .submit(&h.merchant, &key, &request)
                .await
                .expect("again"),
        );
        assert!(replayed);
        assert_eq!(again, stored);
    }
    assert_eq!(h.acquirer.calls(Call::Capture), 1);
    h.all_answers_used();
}

/// The first attempt hangs at the acquirer past its lease. A retry on
/// another instance takes the record over (attempt 2), calls the acquirer
/// with the same reference and stores its answer. When the stale holder's
/// call finally returns, its finalize is fenced out: it answers with what
/// the current holder stored, and what it heard is written nowhere. (The
/// real acquirer would repeat its first outcome for the reference; the fake
/// tells the stale holder a decline, so that a write of its answer would
/// show.)
#[tokio::test]
async fn a_take_over_after_the_lease_re_drives_the_same_reference_and_fences_the_stale_holder() {
    let h = Harness::new().await;
    let gate = Gate::new();
    h.acquirer.script(
        Call::Capture,
        [
            Says::held(&gate, Says::Declined("heard_by_the_stale_holder")),
            Says::Done("cap_1"),
        ],
    );
    let (key, request) = (fresh_key(), charge(1, 2_500));
    let stale = tokio::spawn({
        let (engine, merchant, key, request) = (
            h.engine.clone(),
            h.merchant.clone(),
            key.clone(),
            request.clone(),
        );
        async move { engine.submit(&merchant, &key, &request).await }
    });
    gate.reached().await;
    h.end_leases().await;

    let (subject, fresh, replayed) = completed(
        h.another_instance()
            .submit(&h.merchant, &key, &request)
            .await
            .expect("take over"),
    );
    assert!(!replayed, "the take-over stored its own answer");
    assert_eq!(fresh.status, 201, "{}", text(&fresh));
    assert_eq!(h.attempt(&key).await, (2, true));
    let id = charge_id(subject);
    let reference = h.reference_of(&id).await;
    assert_eq!(
        h.acquirer.references(Call::Capture),
        vec![reference.clone(), reference],
        "the same reference both times"
    );

    gate.open();
    let (_, answered, replayed) = completed(stale.await.expect("task").expect("stale"));
    assert!(replayed, "the stale holder answers with the stored outcome");
    assert_eq!(answered, fresh);
    assert_eq!(h.charge(&id).await.status.as_str(), "captured");
    assert_eq!(h.attempt(&key).await, (2, true));
    assert_eq!(
        h.events().await,
        ["charge.captured"],
        "nothing of the stale holder's"
    );
    h.all_answers_used();
}

/// An unknown outcome (a timeout, or a 503 with the acquirer's
/// `Retry-After`) leaves the charge processing and the key free at once;
/// the retry re-drives the acquirer with the same reference and stores its
/// answer.
#[tokio::test]
async fn an_unknown_outcome_leaves_the_charge_pending_and_a_retry_settles_it_with_the_same_reference(
) {
    let h = Harness::new().await;
    let unavailable = Says::Unknown {
        cause: "503",
        retry_after: Some(Duration::from_secs(7)),
    };
    h.acquirer.script(
        Call::Capture,
        [Says::timeout(), unavailable, Says::Done("cap_1")],
    );
    let (key, request) = (fresh_key(), charge(1, 2_500));

    let mut subject = None;
    for expected_wait in [Duration::from_secs(1), Duration::from_secs(7)] {
        match h
            .engine
            .submit(&h.merchant, &key, &request)
            .await
            .expect("submit")
        {
            Outcome::Unknown {
                subject: s,
                retry_after,
            } => {
                assert_eq!(retry_after, expected_wait);
                subject = Some(s);
            }
            other => panic!("expected an unknown outcome, got {other:?}"),
        }
        let id = charge_id(subject.clone().expect("subject"));
        assert_eq!(h.charge(&id).await.status.as_str(), "processing");
        match h
            .db
            .store
            .key_status(h.merchant.id, &key)
            .await
            .expect("status")
        {
            Some(KeyStatus::InFlight {
                lease_remaining, ..
            }) => assert!(lease_remaining.is_zero(), "released at once"),
            other => panic!("{other:?}"),
        }
    }

    let (settled, response, replayed) = completed(
        h.engine
            .submit(&h.merchant, &key, &request)
            .await
            .expect("retry"),
    );
    assert!(!replayed);
    assert_eq!(response.status, 201);
    assert_eq!(Some(settled.clone()), subject, "the same charge");
    assert_eq!(h.attempt(&key).await, (3, true), "each retry took over");
    let reference = h.reference_of(&charge_id(settled)).await;
    assert_eq!(h.acquirer.references(Call::Capture), vec![reference; 3]);
    h.all_answers_used();
}

/// After an unknown outcome the reconciler asks the acquirer first: a
/// lookup that finds the capture settles the charge without a second POST,
/// and the client's retry replays it.
#[tokio::test]
async fn the_reconciler_settles_an_unknown_outcome_by_a_lookup_without_a_second_capture() {
    let h = Harness::new().await;
    h.acquirer.script(Call::Capture, [Says::timeout()]);
    h.acquirer.script(Call::Lookup, [Says::Done("cap_1")]);
    let (key, request) = (fresh_key(), charge(1, 2_500));
    let unknown = h
        .engine
        .submit(&h.merchant, &key, &request)
        .await
        .expect("submit");
    assert!(matches!(unknown, Outcome::Unknown { .. }), "{unknown:?}");

    let settled = settle_orphans(&h, KEY_TTL).await;
    let Reconciled::Outcome(outcome) = settled else {
        panic!("settled: {settled:?}")
    };
    let (subject, response, _) = completed(outcome);
    assert_eq!(response.status, 201);
    assert_eq!(h.acquirer.calls(Call::Capture), 1, "no second POST");
    assert_eq!(h.acquirer.calls(Call::Lookup), 1);
    let reference = h.reference_of(&charge_id(subject)).await;
    assert_eq!(h.acquirer.calls_for(&reference), 2);

    let (_, again, replayed) = completed(
        h.engine
            .submit(&h.merchant, &key, &request)
            .await
            .expect("retry"),
    );
    assert!(replayed);
    assert_eq!(again, response);
    h.all_answers_used();
}

/// Where the acquirer has nothing for the reference, the reconciler POSTs
/// it again, the same reference; past the settle deadline it only looks,
/// and a charge the acquirer still has nothing for goes to a person.
#[tokio::test]
async fn the_reconciler_posts_the_same_reference_where_the_acquirer_has_nothing_and_gives_up_at_the_deadline(
) {
    let h = Harness::new().await;
    h.acquirer
        .script(Call::Capture, [Says::timeout(), Says::timeout()]);
    h.acquirer
        .script(Call::Lookup, [Says::Nothing, Says::Nothing]);
    let (key, request) = (fresh_key(), charge(1, 2_500));
    let unknown = h
        .engine
        .submit(&h.merchant, &key, &request)
        .await
        .expect("submit");
    let Outcome::Unknown { subject, .. } = unknown else {
        panic!("{unknown:?}")
    };
    let id = charge_id(subject);
    let reference = h.reference_of(&id).await;

    // Before the deadline: looked up, found nothing, POSTed again (unknown).
    let settled = settle_orphans(&h, KEY_TTL).await;
    assert!(
        matches!(settled, Reconciled::Outcome(Outcome::Unknown { .. })),
        "{settled:?}"
    );
    assert_eq!(
        h.acquirer.references(Call::Capture),
        vec![reference.clone(); 2]
    );

    // Past it (a deadline of zero): one last look, no POST, then a person.
    h.end_leases().await;
    h.db.exec("update charges set next_reconcile_at = null")
        .await;
    let settled = settle_orphans(&h, Duration::ZERO).await;
    assert!(matches!(settled, Reconciled::NoOutcome), "{settled:?}");
    assert_eq!(
        h.acquirer.calls(Call::Capture),
        2,
        "the last look POSTs nothing"
    );
    assert_eq!(h.acquirer.calls(Call::Lookup), 2);
    assert!(awaiting_review(&h, &id).await);
    match h
        .engine
        .submit(&h.merchant, &key, &request)
        .await
        .expect("retry")
    {
        Outcome::UnderReview { .. } => {}
        other => panic!("expected under review, got {other:?}"),
    }
    assert_eq!(h.acquirer.calls_for(&reference), 4, "and nothing after");
    h.all_answers_used();
}

/// A capture whose echo contradicts the request goes to a person at once:
/// `503` under review, the charge processing and marked, and no retry, no
/// instance and no reconciler calls the acquirer for it again. A person's
/// resolve stores the answer a late retry then replays.
#[tokio::test]
async fn a_contradicted_capture_goes_to_review_and_nothing_calls_the_acquirer_again() {
    let h = Harness::new().await;
    h.acquirer.script(
        Call::Capture,
        [Says::Contradicted("amount_cents 2501 (asked 2500)")],
    );
    let (key, request) = (fresh_key(), charge(1, 2_500));

    let outcome = h
        .engine
        .submit(&h.merchant, &key, &request)
        .await
        .expect("submit");
    let Outcome::UnderReview {
        subject,
        retry_after,
    } = outcome
    else {
        panic!("expected under review, got {outcome:?}")
    };
    assert_eq!(retry_after, Duration::from_secs(60));
    let id = charge_id(subject);
    assert!(awaiting_review(&h, &id).await);
    assert_eq!(h.charge(&id).await.status.as_str(), "processing");

    h.end_leases().await;
    for engine in [&h.engine, &h.another_instance()] {
        let again = engine
            .submit(&h.merchant, &key, &request)
            .await
            .expect("retry");
        assert!(matches!(again, Outcome::UnderReview { .. }), "{again:?}");
    }
    let orphans = h.db.store.orphans(10, KEY_TTL).await.expect("orphans");
    assert!(orphans.is_empty(), "the reconciler leaves it: {orphans:?}");
    assert_eq!(h.acquirer.calls(Call::Capture), 1, "asked once, ever");
    assert!(h.events().await.is_empty(), "nothing final to announce");

    let resolved = h
        .engine
        .resolve::<ChargeRequest>(
            id.as_str(),
            Resolution::Succeeded,
            Audit {
                actor: "test",
                reason: Some("the acquirer's records"),
            },
        )
        .await
        .expect("resolve");
    let (_, decided, _) = completed(resolved);
    assert_eq!(decided.status, 201);
    let (_, late, replayed) = completed(
        h.engine
            .submit(&h.merchant, &key, &request)
            .await
            .expect("late"),
    );
    assert!(replayed);
    assert_eq!(late, decided);
    assert_eq!(
        h.events().await,
        ["charge.captured"],
        "the person's decision"
    );
    assert_eq!(h.acquirer.calls(Call::Capture), 1);
    h.all_answers_used();
}

/// The same request after its key expired is a late retry: `410` naming its
/// charge, through the record past its time and, once the record and its
/// tombstone are swept, through the charge's reference; nothing is claimed
/// and the acquirer is not called. Another request under the key is a new
/// charge, with a reference of its own.
#[tokio::test]
async fn a_late_retry_after_the_key_expired_names_its_charge_and_calls_nothing() {
    let h = Harness::with(idem_core::idempotency::EngineConfig {
        key_ttl: Duration::ZERO,
        ..CONFIG
    })
    .await;
    h.acquirer
        .script(Call::Capture, [Says::Done("cap_1"), Says::Done("cap_2")]);
    let (key, request) = (fresh_key(), charge(1, 2_500));
    let (subject, _, _) = completed(
        h.engine
            .submit(&h.merchant, &key, &request)
            .await
            .expect("first"),
    );

    let late = h
        .engine
        .submit(&h.merchant, &key, &request)
        .await
        .expect("late");
    assert!(
        matches!(&late, Outcome::Expired { subject: s } if *s == subject),
        "through its record: {late:?}"
    );
    h.db.store
        .sweep_expired_keys(10, Duration::ZERO)
        .await
        .expect("sweep keys");
    // The tombstone lives until the key's expiry: past it by a little.
    tokio::time::sleep(Duration::from_millis(20)).await;
    h.db.store
        .sweep_tombstones(10)
        .await
        .expect("sweep tombstones");
    assert!(h
        .db
        .store
        .key_status(h.merchant.id, &key)
        .await
        .expect("status")
        .is_none());
    let later = h
        .engine
        .submit(&h.merchant, &key, &request)
        .await
        .expect("later");
    assert!(
        matches!(&later, Outcome::Expired { subject: s } if *s == subject),
        "through the charge's reference: {later:?}"
    );
    assert_eq!(h.acquirer.calls(Call::Capture), 1);

    let (other, response, _) = completed(
        h.engine
            .submit(&h.merchant, &key, &charge(2, 2_500))
            .await
            .expect("new intent"),
    );
    assert_eq!(response.status, 201);
    assert_ne!(other, subject);
    let references = h.acquirer.references(Call::Capture);
    assert_eq!(references.len(), 2);
    assert_ne!(references[0], references[1]);
    h.all_answers_used();
}

/// A decline is the acquirer's final word: `402` with its reason, stored
/// and replayed, the charge declined, the acquirer asked once.
#[tokio::test]
async fn a_decline_is_final_stored_and_replayed() {
    let h = Harness::new().await;
    h.acquirer
        .script(Call::Capture, [Says::Declined("insufficient_funds")]);
    let (key, request) = (fresh_key(), charge(1, 2_500));

    let (subject, response, _) = completed(
        h.engine
            .submit(&h.merchant, &key, &request)
            .await
            .expect("submit"),
    );
    assert_eq!(response.status, 402, "{}", text(&response));
    assert!(text(&response).contains("insufficient_funds"));
    let charge = h.charge(&charge_id(subject)).await;
    assert_eq!(charge.status.as_str(), "declined");
    assert_eq!(charge.decline_reason.as_deref(), Some("insufficient_funds"));
    assert_eq!(h.events().await, ["charge.declined"]);

    let (_, again, replayed) = completed(
        h.another_instance()
            .submit(&h.merchant, &key, &request)
            .await
            .expect("again"),
    );
    assert!(replayed);
    assert_eq!(again, response);
    assert_eq!(h.acquirer.calls(Call::Capture), 1);
    h.all_answers_used();
}

/// A refusal (`422` at the acquirer) is final too: the charge failed, the
/// answer `502 acquirer-rejected`, stored and replayed.
#[tokio::test]
async fn a_refusal_is_final_stored_and_replayed() {
    let h = Harness::new().await;
    h.acquirer
        .script(Call::Capture, [Says::Refused("reference_reused")]);
    let (key, request) = (fresh_key(), charge(1, 2_500));

    let (subject, response, _) = completed(
        h.engine
            .submit(&h.merchant, &key, &request)
            .await
            .expect("submit"),
    );
    assert_eq!(response.status, 502, "{}", text(&response));
    assert_eq!(
        json(&response)["type"],
        "urn:idem:problem:acquirer-rejected"
    );
    assert_eq!(
        h.charge(&charge_id(subject)).await.status.as_str(),
        "failed"
    );
    assert!(
        h.events().await.is_empty(),
        "a refusal moves nothing to announce"
    );

    let (_, again, replayed) = completed(
        h.engine
            .submit(&h.merchant, &key, &request)
            .await
            .expect("again"),
    );
    assert!(replayed);
    assert_eq!(again, response);
    assert_eq!(h.acquirer.calls(Call::Capture), 1);
    h.all_answers_used();
}

/// Runs the reconciler's turn at the one orphan due, as `idem reconcile`
/// does, with `settle_deadline`.
pub async fn settle_orphans(h: &Harness, settle_deadline: Duration) -> Reconciled {
    let orphans =
        h.db.store
            .orphans(10, settle_deadline)
            .await
            .expect("orphans");
    let [orphan] = orphans.as_slice() else {
        panic!("expected one orphan, got {orphans:?}")
    };
    h.engine
        .settle_orphan(orphan, Duration::from_secs(1))
        .await
        .expect("settle")
        .expect("the reconciler took it")
}

/// Whether the charge is set aside for a person.
async fn awaiting_review(h: &Harness, id: &idem_core::domain::ChargeId) -> bool {
    h.db.store
        .charge_record(id.as_str())
        .await
        .expect("read")
        .expect("the charge")
        .charge
        .awaiting_review()
}

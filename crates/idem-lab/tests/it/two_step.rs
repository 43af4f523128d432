//! The acquirer's two-step payments (docs/contract/acquirer.md,
//! "Two-step payments"): idem's client against the simulator over loopback,
//! authorizing, capturing in parts and voiding, with the simulator's faults
//! and lies, and 30 captures racing on one authorization.

use std::time::Duration;

use crate::sim_on_loopback::Sim;
use axum::http::StatusCode;
use idem_core::acquirer::protocol::{
    AuthorizationCaptureRequest, AuthorizationRequest, VoidRequest,
};
use idem_core::acquirer::{
    Acquirer, AcquirerClient, AcquirerError, AuthorizationCaptured, Authorized,
};
use idem_lab::sim::{Fault, Faults};

/// What the ledger's captures of the authorization under `reference` add
/// up to, and how many they are.
async fn captured_of(sim: &Sim, reference: &str) -> (i64, usize) {
    let ledger = sim.ledger().await;
    let captures: Vec<_> = ledger
        .authorization_captures
        .iter()
        .filter(|c| c.authorization_reference == reference)
        .collect();
    (
        captures.iter().map(|c| c.amount_cents).sum(),
        captures.len(),
    )
}

/// A client whose timeout no call here should reach, however busy the
/// machine: an unknown outcome in these tests comes from a fault, never from
/// the clock (but for `hang`'s, which has a client of its own).
fn client(url: &str) -> AcquirerClient {
    AcquirerClient::new(url, Duration::from_secs(30), None).expect("client")
}

fn authorization(reference: &str, amount_cents: i64) -> AuthorizationRequest {
    AuthorizationRequest {
        reference: reference.into(),
        merchant: "loja".into(),
        order_id: 41,
        amount_cents,
        currency: "BRL".into(),
    }
}

fn capture(
    reference: &str,
    authorization_reference: &str,
    amount_cents: i64,
    final_capture: bool,
) -> AuthorizationCaptureRequest {
    AuthorizationCaptureRequest {
        reference: reference.into(),
        authorization_reference: authorization_reference.into(),
        merchant: "loja".into(),
        amount_cents,
        currency: "BRL".into(),
        final_capture,
    }
}

fn void(reference: &str, authorization_reference: &str) -> VoidRequest {
    VoidRequest {
        reference: reference.into(),
        authorization_reference: authorization_reference.into(),
        merchant: "loja".into(),
    }
}

/// The acquirer's reason when `settled` is a refusal.
fn refused_for<T>(settled: &Result<T, AcquirerError>) -> Option<&str> {
    match settled {
        Err(AcquirerError::Rejected { reason, .. }) => reason.as_deref(),
        _ => None,
    }
}

#[tokio::test]
async fn an_authorization_is_captured_in_parts_and_a_final_capture_releases_the_rest() {
    let sim = Sim::start().await;
    let acquirer = client(&sim.url);
    let auth = authorization("auth-1", 100);
    let before = acquirer.lookup_authorization(&auth).await;
    assert!(matches!(before, Ok(None)), "{before:?}");
    let authorized = acquirer.authorize(&auth).await.expect("authorized");
    let looked_up = acquirer.lookup_authorization(&auth).await;
    assert!(
        matches!(&looked_up, Ok(Some(Ok(a))) if *a == authorized),
        "{looked_up:?}"
    );

    let first = capture("cap-1", "auth-1", 30, false);
    assert!(matches!(
        acquirer.lookup_authorization_capture(&first).await,
        Ok(None)
    ));
    let first_captured = acquirer.capture_authorization(&first).await.expect("30");
    assert_eq!(
        first_captured.released_cents,
        Some(0),
        "a partial capture releases nothing"
    );
    let second = acquirer
        .capture_authorization(&capture("cap-2", "auth-1", 20, false))
        .await
        .expect("20");
    let last = capture("cap-3", "auth-1", 10, true);
    let last_captured = acquirer
        .capture_authorization(&last)
        .await
        .expect("10, final");
    assert_eq!(
        last_captured.released_cents,
        Some(40),
        "the final capture releases the rest"
    );
    let looked_up = acquirer.lookup_authorization_capture(&last).await;
    assert!(
        matches!(&looked_up, Ok(Some(Ok(c))) if *c == last_captured),
        "{looked_up:?}"
    );
    let looked_up = acquirer.lookup_authorization_capture(&first).await;
    assert!(
        matches!(&looked_up, Ok(Some(Ok(c))) if *c == first_captured),
        "{looked_up:?}"
    );
    assert_ne!(first_captured.capture_id, second.capture_id);

    let after_final = acquirer
        .capture_authorization(&capture("cap-4", "auth-1", 1, false))
        .await;
    assert_eq!(
        refused_for(&after_final),
        Some("authorization_captured"),
        "{after_final:?}"
    );
    let void_after_final = acquirer.void(&void("void-1", "auth-1")).await;
    assert_eq!(
        refused_for(&void_after_final),
        Some("authorization_captured"),
        "{void_after_final:?}"
    );
    let looked_up = acquirer.lookup_void(&void("void-1", "auth-1")).await;
    assert!(
        matches!(&looked_up, Ok(Some(Err(AcquirerError::Rejected { reason: Some(r), .. }))) if r == "authorization_captured"),
        "the refusal is that reference's outcome: {looked_up:?}"
    );

    assert_eq!(captured_of(&sim, "auth-1").await, (60, 3));
    let ledger = sim.ledger().await;
    assert_eq!(ledger.authorizations.len(), 1);
    assert_eq!(
        ledger.authorizations[0].authorization_id,
        authorized.authorization_id
    );
    assert_eq!(ledger.authorizations[0].amount_cents, 100);
    let finals: Vec<(bool, i64)> = ledger
        .authorization_captures
        .iter()
        .map(|c| (c.final_capture, c.released_cents))
        .collect();
    assert_eq!(finals, [(false, 0), (false, 0), (true, 40)]);
    assert!(ledger.voids.is_empty());
    assert!(ledger.captures.is_empty(), "no one-step capture was made");
}

#[tokio::test]
async fn a_declined_or_refused_authorization_holds_nothing_to_capture() {
    let sim = Sim::start().await;
    let acquirer = client(&sim.url);
    sim.set(&Faults {
        decline_rate: 1.0,
        ..Faults::default()
    })
    .await;
    let auth = authorization("auth-1", 100);
    let declined = acquirer.authorize(&auth).await;
    assert!(
        matches!(&declined, Err(AcquirerError::Declined(d)) if d.reason == "insufficient_funds"),
        "{declined:?}"
    );
    let looked_up = acquirer.lookup_authorization(&auth).await;
    assert!(
        matches!(&looked_up, Ok(Some(Err(AcquirerError::Declined(_))))),
        "{looked_up:?}"
    );
    let captured = acquirer
        .capture_authorization(&capture("cap-1", "auth-1", 10, false))
        .await;
    assert_eq!(
        refused_for(&captured),
        Some("unknown_authorization"),
        "a capture of an authorization is never declined: {captured:?}"
    );
    sim.set(&Faults::default()).await;
    let nothing = acquirer.authorize(&authorization("auth-2", 0)).await;
    assert_eq!(refused_for(&nothing), Some("invalid_amount"), "{nothing:?}");
    let ledger = sim.ledger().await;
    assert!(ledger.authorizations.is_empty());
    assert!(ledger.authorization_captures.is_empty());
}

#[tokio::test]
async fn a_capture_above_what_remains_is_refused_and_moves_nothing() {
    let sim = Sim::start().await;
    let acquirer = client(&sim.url);
    acquirer
        .authorize(&authorization("auth-1", 100))
        .await
        .expect("authorized");
    acquirer
        .capture_authorization(&capture("cap-1", "auth-1", 70, false))
        .await
        .expect("70");
    let above = acquirer
        .capture_authorization(&capture("cap-2", "auth-1", 31, false))
        .await;
    assert_eq!(
        refused_for(&above),
        Some("exceeds_authorization"),
        "{above:?}"
    );
    let above_final = acquirer
        .capture_authorization(&capture("cap-3", "auth-1", 31, true))
        .await;
    assert_eq!(refused_for(&above_final), Some("exceeds_authorization"));
    acquirer
        .capture_authorization(&capture("cap-4", "auth-1", 30, false))
        .await
        .expect("what remains");
    let unknown = acquirer
        .capture_authorization(&capture("cap-5", "nowhere", 1, false))
        .await;
    assert_eq!(refused_for(&unknown), Some("unknown_authorization"));
    assert_eq!(captured_of(&sim, "auth-1").await, (100, 2));
}

#[tokio::test]
async fn a_void_releases_what_remains_and_no_capture_follows_it() {
    let sim = Sim::start().await;
    let acquirer = client(&sim.url);
    acquirer
        .authorize(&authorization("auth-1", 100))
        .await
        .expect("authorized");
    acquirer
        .capture_authorization(&capture("cap-1", "auth-1", 40, false))
        .await
        .expect("40");
    let request = void("void-1", "auth-1");
    assert!(matches!(acquirer.lookup_void(&request).await, Ok(None)));
    let voided = acquirer.void(&request).await.expect("voided");
    assert_eq!(voided.released_cents, Some(60));
    assert_eq!(acquirer.void(&request).await.expect("the same"), voided);
    let looked_up = acquirer.lookup_void(&request).await;
    assert!(
        matches!(&looked_up, Ok(Some(Ok(v))) if *v == voided),
        "{looked_up:?}"
    );

    let after_void = acquirer
        .capture_authorization(&capture("cap-2", "auth-1", 10, false))
        .await;
    assert_eq!(
        refused_for(&after_void),
        Some("authorization_voided"),
        "{after_void:?}"
    );
    let again = acquirer.void(&void("void-2", "auth-1")).await;
    assert_eq!(refused_for(&again), Some("authorization_voided"));
    let unknown = acquirer.void(&void("void-3", "nowhere")).await;
    assert_eq!(refused_for(&unknown), Some("unknown_authorization"));

    let ledger = sim.ledger().await;
    assert_eq!(
        ledger.voids.len(),
        1,
        "one void, however often it was asked"
    );
    assert_eq!(ledger.voids[0].reference, "void-1");
    assert_eq!(ledger.voids[0].released_cents, 60);
    assert_eq!(captured_of(&sim, "auth-1").await, (40, 1));
    let after = &ledger.voids[0].at_micros;
    assert!(
        ledger
            .authorization_captures
            .iter()
            .all(|c| c.at_micros <= *after),
        "nothing captured after the void"
    );
}

#[tokio::test]
async fn each_reference_is_made_once_and_another_body_under_it_is_a_mismatch() {
    let sim = Sim::start().await;
    let acquirer = client(&sim.url);
    let auth = authorization("auth-1", 100);
    let first = acquirer.authorize(&auth).await.expect("authorized");
    assert_eq!(acquirer.authorize(&auth).await.expect("the same"), first);
    let other = authorization("auth-1", 99);
    assert_eq!(
        sim.raw_post("/v1/authorizations", "auth-1", &other).await,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    let mismatch = acquirer.authorize(&other).await;
    assert!(
        matches!(mismatch, Err(AcquirerError::Rejected { status: 422, .. })),
        "as a one-step capture's mismatch: {mismatch:?}"
    );

    let part = capture("cap-1", "auth-1", 30, false);
    let captured = acquirer.capture_authorization(&part).await.expect("30");
    assert_eq!(
        acquirer
            .capture_authorization(&part)
            .await
            .expect("the same"),
        captured
    );
    let other_amount = capture("cap-1", "auth-1", 31, false);
    assert_eq!(
        sim.raw_post("/v1/captures", "cap-1", &other_amount).await,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    // The client looks the refusal up, as a refund's: the acquirer's outcome
    // for the reference is a capture of 30, which is not what was asked.
    let mismatch = acquirer.capture_authorization(&other_amount).await;
    assert!(
        matches!(&mismatch, Err(AcquirerError::Contradicted(c)) if c.differences == ["amount_cents 30 (asked 31)"]),
        "{mismatch:?}"
    );
    let other_final = capture("cap-1", "auth-1", 30, true);
    let mismatch = acquirer.capture_authorization(&other_final).await;
    assert!(
        matches!(&mismatch, Err(AcquirerError::Contradicted(c)) if c.differences == ["final false (asked true)"]),
        "{mismatch:?}"
    );

    let request = void("void-1", "auth-1");
    let voided = acquirer.void(&request).await.expect("voided");
    assert_eq!(acquirer.void(&request).await.expect("the same"), voided);
    let mismatch = acquirer.void(&void("void-1", "auth-2")).await;
    assert!(
        matches!(&mismatch, Err(AcquirerError::Contradicted(c)) if c.differences == ["authorization_reference auth-1 (asked auth-2)"]),
        "{mismatch:?}"
    );

    let ledger = sim.ledger().await;
    assert_eq!(ledger.authorizations.len(), 1);
    assert_eq!(ledger.authorization_captures.len(), 1);
    assert_eq!(ledger.voids.len(), 1);
}

#[tokio::test]
async fn an_unknown_outcome_is_settled_by_a_lookup_of_the_same_reference() {
    let sim = Sim::start().await;
    let acquirer = client(&sim.url);
    for (n, fault) in [Fault::ErrorAfter, Fault::DropAfter]
        .into_iter()
        .enumerate()
    {
        let auth = authorization(&format!("auth-{n}"), 100);
        sim.once(fault).await;
        let first = acquirer.authorize(&auth).await;
        assert!(
            matches!(first, Err(AcquirerError::Unknown(_))),
            "{fault}: {first:?}"
        );
        let looked_up = acquirer.lookup_authorization(&auth).await;
        let Ok(Some(Ok(authorized))) = looked_up else {
            panic!("{fault}: the authorization was made: {looked_up:?}")
        };
        assert_eq!(
            acquirer.authorize(&auth).await.expect("the same"),
            authorized
        );

        let part = capture(&format!("cap-{n}"), &auth.reference, 60, true);
        sim.once(fault).await;
        let first = acquirer.capture_authorization(&part).await;
        assert!(
            matches!(first, Err(AcquirerError::Unknown(_))),
            "{fault}: {first:?}"
        );
        let looked_up = acquirer.lookup_authorization_capture(&part).await;
        assert!(
            matches!(
                &looked_up,
                Ok(Some(Ok(AuthorizationCaptured {
                    released_cents: Some(40),
                    ..
                })))
            ),
            "{fault}: the capture was made: {looked_up:?}"
        );
        acquirer
            .capture_authorization(&part)
            .await
            .expect("a retry: the same");

        let auth_to_void = authorization(&format!("auth-void-{n}"), 100);
        acquirer.authorize(&auth_to_void).await.expect("authorized");
        let request = void(&format!("void-{n}"), &auth_to_void.reference);
        sim.once(fault).await;
        let first = acquirer.void(&request).await;
        assert!(
            matches!(first, Err(AcquirerError::Unknown(_))),
            "{fault}: {first:?}"
        );
        let looked_up = acquirer.lookup_void(&request).await;
        assert!(
            matches!(&looked_up, Ok(Some(Ok(_)))),
            "{fault}: voided: {looked_up:?}"
        );
        acquirer.void(&request).await.expect("a retry: the same");
    }
    // error-before and a status: nothing made, the lookup finds nothing, and
    // a retry of the same reference makes it.
    for (n, fault) in [Fault::ErrorBefore, Fault::Status(503)]
        .into_iter()
        .enumerate()
    {
        let auth = authorization(&format!("late-auth-{n}"), 100);
        let part = capture(&format!("late-cap-{n}"), &auth.reference, 10, false);
        let request = void(&format!("late-void-{n}"), &auth.reference);
        sim.once(fault).await;
        let first = acquirer.authorize(&auth).await;
        assert!(
            matches!(first, Err(AcquirerError::Unknown(_))),
            "{fault}: {first:?}"
        );
        assert!(matches!(
            acquirer.lookup_authorization(&auth).await,
            Ok(None)
        ));
        acquirer.authorize(&auth).await.expect("made by the retry");

        sim.once(fault).await;
        let first = acquirer.capture_authorization(&part).await;
        assert!(
            matches!(first, Err(AcquirerError::Unknown(_))),
            "{fault}: {first:?}"
        );
        assert!(matches!(
            acquirer.lookup_authorization_capture(&part).await,
            Ok(None)
        ));
        acquirer
            .capture_authorization(&part)
            .await
            .expect("made by the retry");

        sim.once(fault).await;
        let first = acquirer.void(&request).await;
        assert!(
            matches!(first, Err(AcquirerError::Unknown(_))),
            "{fault}: {first:?}"
        );
        assert!(matches!(acquirer.lookup_void(&request).await, Ok(None)));
        let voided = acquirer.void(&request).await.expect("made by the retry");
        assert_eq!(voided.released_cents, Some(90));
    }
    let ledger = sim.ledger().await;
    assert_eq!(
        ledger.authorizations.len(),
        6,
        "each reference authorized once"
    );
    assert_eq!(
        ledger.authorization_captures.len(),
        4,
        "each capture made once"
    );
    assert_eq!(ledger.voids.len(), 4, "each void made once");
}

/// `hang`: the capture is made, its answer withheld past the client's
/// timeout, and a POST of it meanwhile is answered `409`; the lookup settles it.
#[tokio::test]
async fn a_capture_whose_answer_never_comes_is_settled_by_its_lookup() {
    let sim = Sim::start().await;
    // Long enough for the POST to reach the simulator on a busy machine: the
    // hang, not the machine, is what the timeout must come from.
    let acquirer = AcquirerClient::new(&sim.url, Duration::from_secs(10), None).expect("client");
    acquirer
        .authorize(&authorization("auth-1", 100))
        .await
        .expect("authorized");
    sim.set(&Faults {
        fault: Fault::Hang,
        fault_count: Some(1),
        hang_ms: 600_000,
        ..Faults::default()
    })
    .await;
    let part = capture("cap-1", "auth-1", 100, true);
    let first = acquirer.capture_authorization(&part).await;
    assert!(
        matches!(&first, Err(AcquirerError::Unknown(u)) if u.cause == "timeout"),
        "{first:?}"
    );
    let retried = acquirer.capture_authorization(&part).await;
    assert!(
        matches!(&retried, Err(AcquirerError::Unknown(u)) if u.cause == "409"),
        "still in flight: {retried:?}"
    );
    let looked_up = acquirer.lookup_authorization_capture(&part).await;
    assert!(
        matches!(
            &looked_up,
            Ok(Some(Ok(AuthorizationCaptured {
                released_cents: Some(0),
                ..
            })))
        ),
        "{looked_up:?}"
    );
    assert_eq!(captured_of(&sim, "auth-1").await, (100, 1));
}

#[tokio::test]
async fn a_lie_in_an_echo_is_a_contradiction() {
    let sim = Sim::start().await;
    let acquirer = client(&sim.url);
    for (fault, said) in [
        (Fault::WrongAmount, "amount_cents 101 (asked 100)"),
        (Fault::WrongCurrency, "currency USD (asked BRL)"),
        (Fault::WrongOrder, "order_id 42 (asked 41)"),
    ] {
        let auth = authorization(&format!("lie-{fault}"), 100);
        sim.once(fault).await;
        let lie = acquirer.authorize(&auth).await;
        assert!(
            matches!(&lie, Err(AcquirerError::Contradicted(c)) if c.differences == [said]),
            "{fault}: {lie:?}"
        );
        let looked_up = acquirer.lookup_authorization(&auth).await;
        assert!(
            matches!(&looked_up, Ok(Some(Err(AcquirerError::Contradicted(_))))),
            "the lookup tells the same lie: {looked_up:?}"
        );
    }

    acquirer
        .authorize(&authorization("auth-1", 100))
        .await
        .expect("authorized");
    for (n, (fault, said)) in [
        (Fault::WrongAmount, "amount_cents 11 (asked 10)"),
        (Fault::WrongCurrency, "currency USD (asked BRL)"),
    ]
    .into_iter()
    .enumerate()
    {
        sim.once(fault).await;
        let lie = acquirer
            .capture_authorization(&capture(&format!("cap-lie-{n}"), "auth-1", 10, false))
            .await;
        assert!(
            matches!(&lie, Err(AcquirerError::Contradicted(c)) if c.differences == [said]),
            "{fault}: {lie:?}"
        );
    }
    // A capture names no order: wrong-order moves it as asked.
    sim.once(Fault::WrongOrder).await;
    acquirer
        .capture_authorization(&capture("cap-honest", "auth-1", 10, false))
        .await
        .expect("as asked");
    let ledger = sim.ledger().await;
    let moved: Vec<(i64, &str)> = ledger
        .authorization_captures
        .iter()
        .map(|c| (c.amount_cents, c.currency.as_str()))
        .collect();
    assert_eq!(
        moved,
        [(11, "BRL"), (10, "USD"), (10, "BRL")],
        "the ledger has what moved"
    );
}

/// `refuse-paid` on a capture of an authorization and on a void: a retry of
/// one already made is answered `422`, as some acquirers do; the client looks
/// it up and takes it as made.
#[tokio::test]
async fn a_refused_retry_is_looked_up_before_it_is_believed() {
    let sim = Sim::start().await;
    let acquirer = client(&sim.url);
    acquirer
        .authorize(&authorization("auth-1", 100))
        .await
        .expect("authorized");
    let part = capture("cap-1", "auth-1", 100, false);
    let captured = acquirer.capture_authorization(&part).await.expect("100");
    sim.once(Fault::RefusePaid).await;
    assert_eq!(
        sim.raw_post("/v1/captures", "cap-1", &part).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "the lie itself"
    );
    sim.once(Fault::RefusePaid).await;
    assert_eq!(
        acquirer
            .capture_authorization(&part)
            .await
            .expect("not fooled"),
        captured
    );

    let request = void("void-1", "auth-1");
    let voided = acquirer.void(&request).await.expect("voided");
    assert_eq!(voided.released_cents, Some(0));
    sim.once(Fault::RefusePaid).await;
    assert_eq!(acquirer.void(&request).await.expect("not fooled"), voided);
    let ledger = sim.ledger().await;
    assert_eq!(
        (ledger.authorization_captures.len(), ledger.voids.len()),
        (1, 1)
    );
}

/// The sum rule under a race: 30 captures of 10, each its own reference, all
/// at once on an authorization of 100. Exactly 10 are made, the other 20
/// refused, and the ledger's captures of it add up to 100.
#[tokio::test]
async fn thirty_concurrent_captures_of_ten_on_an_authorization_of_a_hundred() {
    let sim = Sim::start().await;
    let acquirer = client(&sim.url);
    let Authorized { .. } = acquirer
        .authorize(&authorization("auth-1", 100))
        .await
        .expect("authorized");
    let calls: Vec<_> = (0..30)
        .map(|n| {
            let acquirer = acquirer.clone();
            tokio::spawn(async move {
                acquirer
                    .capture_authorization(&capture(&format!("cap-{n}"), "auth-1", 10, false))
                    .await
            })
        })
        .collect();
    let mut made = 0;
    let mut refused = 0;
    for call in calls {
        match call.await.expect("joined") {
            Ok(_) => made += 1,
            settled => {
                assert_eq!(
                    refused_for(&settled),
                    Some("exceeds_authorization"),
                    "{settled:?}"
                );
                refused += 1;
            }
        }
    }
    assert_eq!((made, refused), (10, 20));
    assert_eq!(captured_of(&sim, "auth-1").await, (100, 10));
}

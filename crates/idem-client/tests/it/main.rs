//! Integration tests: the client against a real HTTP server on port 0.
//!
//! Timings are scaled down (1 ms backoff, sub-second timeouts) so the whole
//! binary runs in a few seconds; assertions on time leave wide margins.

mod server;

use std::time::{Duration, Instant};

use idem_client::{
    AttemptOutcome, CaptureRequest, ChargeAnswer, ChargeRequest, Client, ClientError, RetryPolicy,
};
use server::{closed_endpoint, Scripted, Step};

const SECRET: &str = "sk_test_idem";

fn fast_policy() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 5,
        max_elapsed: Duration::from_secs(5),
        attempt_timeout: Duration::from_secs(2),
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
        prefer_wait: Duration::ZERO,
    }
}

fn client(endpoints: &[&str], policy: RetryPolicy) -> Client {
    let endpoints = endpoints.iter().map(|e| e.to_string()).collect();
    Client::new(endpoints, SECRET, policy).unwrap()
}

fn request() -> ChargeRequest {
    ChargeRequest {
        order_id: 123,
        amount_cents: 25_000,
        currency: Some("BRL".into()),
        description: Some("pedido 123".into()),
    }
}

fn outcomes(answer: &ChargeAnswer) -> Vec<AttemptOutcome> {
    answer.attempts.iter().map(|a| a.outcome.clone()).collect()
}

const CHARGE: &str = r#"{"id":"ch_1","status":"captured"}"#;

#[tokio::test]
async fn retries_503_then_returns_the_capture() {
    let server = Scripted::start(vec![
        Step::status(503).header("retry-after", "0"),
        Step::status(201).body(CHARGE),
    ])
    .await;
    let answer = client(&[&server.base], fast_policy())
        .charge(&request())
        .await
        .unwrap();
    assert_eq!(answer.status, 201);
    assert_eq!(&answer.body[..], CHARGE.as_bytes());
    assert!(!answer.replayed);
    assert_eq!(
        outcomes(&answer),
        [AttemptOutcome::Status(503), AttemptOutcome::Status(201)]
    );
    assert_eq!(server.received().len(), 2);
}

#[tokio::test]
async fn retries_409_in_flight_then_returns_the_capture() {
    let server = Scripted::start(vec![
        Step::status(409).header("retry-after", "0"),
        Step::status(201).body(CHARGE),
    ])
    .await;
    let answer = client(&[&server.base], fast_policy())
        .charge(&request())
        .await
        .unwrap();
    assert_eq!(answer.status, 201);
    assert_eq!(
        outcomes(&answer),
        [AttemptOutcome::Status(409), AttemptOutcome::Status(201)]
    );
}

/// 502 and 504 come from a gateway that lost the answer: unknown, so
/// retried; 429 asks the client to slow down.
#[tokio::test]
async fn retries_gateway_errors_and_throttling() {
    let server = Scripted::start(vec![
        Step::status(502),
        Step::status(504),
        Step::status(429).header("retry-after", "0"),
        Step::status(201),
    ])
    .await;
    let answer = client(&[&server.base], fast_policy())
        .charge(&request())
        .await
        .unwrap();
    assert_eq!(
        outcomes(&answer),
        [
            AttemptOutcome::Status(502),
            AttemptOutcome::Status(504),
            AttemptOutcome::Status(429),
            AttemptOutcome::Status(201)
        ]
    );
}

/// idem's own 502 is a stored outcome (the acquirer refused the charge): the
/// result, not a lost answer.
#[tokio::test]
async fn an_acquirer_rejected_502_is_final() {
    let problem = r#"{"type":"urn:idem:problem:acquirer-rejected","status":502}"#;
    let server = Scripted::start(vec![
        Step::status(502)
            .header("content-type", "application/problem+json")
            .header("idempotency-ttl", "86399")
            .body(problem),
        Step::status(201),
    ])
    .await;
    let answer = client(&[&server.base], fast_policy())
        .charge(&request())
        .await
        .unwrap();
    assert_eq!(answer.status, 502);
    assert_eq!(&answer.body[..], problem.as_bytes());
    assert_eq!(answer.idempotency_ttl, Some(Duration::from_secs(86_399)));
    assert_eq!(server.received().len(), 1);
}

/// The first attempt hangs past attempt_timeout; the client cuts it off and
/// the retry gets the answer, long before the hang would have ended.
#[tokio::test]
async fn a_hung_attempt_times_out_and_is_retried() {
    let server = Scripted::start(vec![
        Step::status(201).after(Duration::from_secs(5)),
        Step::status(201).body(CHARGE),
    ])
    .await;
    let policy = RetryPolicy {
        attempt_timeout: Duration::from_millis(150),
        ..fast_policy()
    };
    let started = Instant::now();
    let answer = client(&[&server.base], policy)
        .charge(&request())
        .await
        .unwrap();
    assert_eq!(answer.status, 201);
    assert_eq!(&answer.body[..], CHARGE.as_bytes());
    assert_eq!(
        outcomes(&answer),
        [AttemptOutcome::Timeout, AttemptOutcome::Status(201)]
    );
    assert!(answer.attempts[0].elapsed >= Duration::from_millis(150));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

/// 422 (key reused with another body) is final: exactly one attempt, even
/// though the server would answer 201 to a second one.
#[tokio::test]
async fn key_reuse_422_is_final() {
    let problem = r#"{"status":422,"detail":"amount_cents differs"}"#;
    let server = Scripted::start(vec![Step::status(422).body(problem), Step::status(201)]).await;
    let answer = client(&[&server.base], fast_policy())
        .charge(&request())
        .await
        .unwrap();
    assert_eq!(answer.status, 422);
    assert_eq!(&answer.body[..], problem.as_bytes());
    assert_eq!(outcomes(&answer), [AttemptOutcome::Status(422)]);
    assert_eq!(server.received().len(), 1);
}

/// A decline is the stored outcome of the intent, not a failure to retry.
#[tokio::test]
async fn decline_402_is_final() {
    let server = Scripted::start(vec![Step::status(402), Step::status(201)]).await;
    let answer = client(&[&server.base], fast_policy())
        .charge(&request())
        .await
        .unwrap();
    assert_eq!(answer.status, 402);
    assert_eq!(outcomes(&answer), [AttemptOutcome::Status(402)]);
    assert_eq!(server.received().len(), 1);
}

/// Every other status is final too, including 500 and redirects (not followed).
#[tokio::test]
async fn other_statuses_are_final_after_one_attempt() {
    for status in [200, 302, 400, 401, 404, 410, 413, 415, 500] {
        let mut first = Step::status(status);
        if status == 302 {
            first = first.header("location", "/elsewhere");
        }
        let server = Scripted::start(vec![first, Step::status(201)]).await;
        let answer = client(&[&server.base], fast_policy())
            .charge(&request())
            .await
            .unwrap();
        assert_eq!(answer.status, status);
        assert_eq!(answer.attempts.len(), 1, "status {status} was retried");
        assert_eq!(server.received().len(), 1, "status {status} was retried");
    }
}

/// Endpoint 0 refuses connections; attempt 1 goes to endpoint 1 and succeeds.
#[tokio::test]
async fn connection_refused_moves_on_to_the_next_endpoint() {
    let closed = closed_endpoint();
    let server = Scripted::start(vec![Step::status(201).body(CHARGE)]).await;
    let answer = client(&[&closed, &server.base], fast_policy())
        .charge(&request())
        .await
        .unwrap();
    assert_eq!(answer.status, 201);
    assert_eq!(answer.attempts.len(), 2);
    assert!(
        matches!(&answer.attempts[0].outcome, AttemptOutcome::Connection(_)),
        "{:?}",
        answer.attempts[0].outcome
    );
    assert_eq!(answer.attempts[0].endpoint, closed);
    assert_eq!(answer.attempts[1].endpoint, server.base);
    assert_eq!(answer.attempts[1].outcome, AttemptOutcome::Status(201));
    assert_eq!(server.received().len(), 1);
}

/// Attempts rotate over the endpoints: i goes to endpoints[i % len].
#[tokio::test]
async fn attempts_rotate_over_endpoints() {
    let a = Scripted::start(vec![Step::status(503)]).await;
    let b = Scripted::start(vec![Step::status(503)]).await;
    let policy = RetryPolicy {
        max_attempts: 5,
        ..fast_policy()
    };
    let err = client(&[&a.base, &b.base], policy)
        .charge(&request())
        .await
        .unwrap_err();
    let ClientError::GaveUp { attempts, .. } = err else {
        panic!("expected GaveUp, got {err:?}");
    };
    let landed: Vec<&str> = attempts.iter().map(|x| x.endpoint.as_str()).collect();
    assert_eq!(landed, [&a.base, &b.base, &a.base, &b.base, &a.base]);
    assert_eq!(a.received().len(), 3);
    assert_eq!(b.received().len(), 2);
}

/// Every attempt of one intent carries the same quoted key, the same bytes,
/// the secret and the JSON content type; the key is a fresh UUID v4.
#[tokio::test]
async fn every_attempt_sends_the_same_key_and_body() {
    let server = Scripted::start(vec![
        Step::status(503).header("retry-after", "0"),
        Step::status(409).header("retry-after", "0"),
        Step::status(201).after(Duration::from_secs(5)),
        Step::status(201),
    ])
    .await;
    let policy = RetryPolicy {
        attempt_timeout: Duration::from_millis(150),
        ..fast_policy()
    };
    let answer = client(&[&server.base], policy)
        .charge(&request())
        .await
        .unwrap();
    assert_eq!(answer.status, 201);

    let received = server.received();
    assert_eq!(received.len(), 4);
    let quoted = format!("\"{}\"", answer.key);
    let expected_body = serde_json::to_vec(&request()).unwrap();
    for r in &received {
        assert_eq!(r.idempotency_key.as_deref(), Some(quoted.as_str()));
        assert_eq!(&r.body[..], &expected_body[..]);
        assert_eq!(r.authorization.as_deref(), Some("Bearer sk_test_idem"));
        assert_eq!(r.content_type.as_deref(), Some("application/json"));
    }
    let json: serde_json::Value = serde_json::from_slice(&received[0].body).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"order_id": 123, "amount_cents": 25000,
                           "currency": "BRL", "description": "pedido 123"})
    );
    let key = uuid::Uuid::parse_str(&answer.key).unwrap();
    assert_eq!(key.get_version_num(), 4);
}

/// Every attempt asks to wait for an in-flight duplicate's outcome, a second
/// short of its timeout (the last one's shortened by `max_elapsed`).
#[tokio::test]
async fn attempts_ask_to_wait_within_their_timeout() {
    let server = Scripted::start(vec![
        Step::status(409).header("retry-after", "0"),
        Step::status(201),
    ])
    .await;
    let policy = RetryPolicy {
        attempt_timeout: Duration::from_millis(4_500),
        max_elapsed: Duration::from_secs(30),
        prefer_wait: Duration::from_secs(5),
        ..fast_policy()
    };
    client(&[&server.base], policy)
        .charge(&request())
        .await
        .unwrap();
    let asked: Vec<_> = server.received().into_iter().map(|r| r.prefer).collect();
    assert_eq!(
        asked,
        [Some("wait=3".to_owned()), Some("wait=3".to_owned())]
    );

    let server = Scripted::start(vec![Step::status(201)]).await;
    client(&[&server.base], fast_policy())
        .charge(&request())
        .await
        .unwrap();
    assert_eq!(
        server.received()[0].prefer,
        None,
        "a zero wait is not asked for"
    );
}

/// Two intents are two keys; absent optional fields are left out of the body.
#[tokio::test]
async fn each_intent_gets_its_own_key() {
    let server = Scripted::start(vec![Step::status(201)]).await;
    let client = client(&[&server.base], fast_policy());
    let bare = ChargeRequest {
        currency: None,
        description: None,
        ..request()
    };
    let first = client.charge(&bare).await.unwrap();
    let second = client.charge(&bare).await.unwrap();
    assert_ne!(first.key, second.key);
    let received = server.received();
    assert_eq!(
        &received[0].body[..],
        br#"{"order_id":123,"amount_cents":25000}"#
    );
}

/// A caller-chosen key is used as is, quoted with RFC 8941 escapes.
#[tokio::test]
async fn charge_with_key_sends_the_callers_key() {
    let server = Scripted::start(vec![Step::status(503), Step::status(201)]).await;
    let key = r#"order-123/"try"\1"#;
    let answer = client(&[&server.base], fast_policy())
        .charge_with_key(key, &request())
        .await
        .unwrap();
    assert_eq!(answer.key, key);
    for r in server.received() {
        assert_eq!(
            r.idempotency_key.as_deref(),
            Some(r#""order-123/\"try\"\\1""#)
        );
    }
}

#[tokio::test]
async fn replayed_reflects_the_servers_header() {
    let server = Scripted::start(vec![
        Step::status(503).header("idempotent-replayed", "true"),
        Step::status(201)
            .header("idempotent-replayed", "true")
            .body(CHARGE),
    ])
    .await;
    let answer = client(&[&server.base], fast_policy())
        .charge(&request())
        .await
        .unwrap();
    assert!(answer.replayed);
    assert_eq!(&answer.body[..], CHARGE.as_bytes());

    let fresh = Scripted::start(vec![
        Step::status(201).header("idempotent-replayed", "false")
    ])
    .await;
    let answer = client(&[&fresh.base], fast_policy())
        .charge(&request())
        .await
        .unwrap();
    assert!(!answer.replayed);
}

#[tokio::test]
async fn gives_up_after_max_attempts() {
    let server = Scripted::start(vec![Step::status(503).header("retry-after", "0")]).await;
    let policy = RetryPolicy {
        max_attempts: 3,
        ..fast_policy()
    };
    let err = client(&[&server.base], policy)
        .charge_with_key("k-503", &request())
        .await
        .unwrap_err();
    let ClientError::GaveUp {
        key,
        attempts,
        last,
    } = &err
    else {
        panic!("expected GaveUp, got {err:?}");
    };
    assert_eq!(key, "k-503");
    assert_eq!(attempts.len(), 3);
    assert!(attempts
        .iter()
        .all(|a| a.outcome == AttemptOutcome::Status(503)));
    assert!(last.contains("max_attempts"), "{last}");
    assert_eq!(server.received().len(), 3);
    assert!(
        err.to_string()
            .starts_with("gave up on key k-503 after 3 attempts"),
        "{err}"
    );
}

/// A Retry-After longer than the remaining budget: give up at once rather
/// than sleep past max_elapsed.
#[tokio::test]
async fn gives_up_when_retry_after_would_pass_max_elapsed() {
    let server = Scripted::start(vec![Step::status(503).header("retry-after", "30")]).await;
    let policy = RetryPolicy {
        max_elapsed: Duration::from_millis(500),
        max_attempts: 100,
        ..fast_policy()
    };
    let started = Instant::now();
    let err = client(&[&server.base], policy)
        .charge(&request())
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    let ClientError::GaveUp { attempts, last, .. } = &err else {
        panic!("expected GaveUp, got {err:?}");
    };
    assert_eq!(attempts.len(), 1);
    assert!(last.contains("max_elapsed"), "{last}");
}

/// Retry-After is honoured as a minimum wait between attempts.
#[tokio::test]
async fn retry_after_is_waited_out() {
    let server = Scripted::start(vec![
        Step::status(503).header("retry-after", "1"),
        Step::status(201),
    ])
    .await;
    let started = Instant::now();
    let answer = client(&[&server.base], fast_policy())
        .charge(&request())
        .await
        .unwrap();
    assert_eq!(answer.status, 201);
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
}

/// A server that always hangs: the budget, not attempt_timeout (10 s here),
/// bounds the intent; the last attempt is cut short to fit.
#[tokio::test]
async fn gives_up_when_max_elapsed_is_spent() {
    let server = Scripted::start(vec![Step::status(201).after(Duration::from_secs(30))]).await;
    let policy = RetryPolicy {
        max_attempts: 100,
        max_elapsed: Duration::from_millis(400),
        attempt_timeout: Duration::from_secs(10),
        ..fast_policy()
    };
    let started = Instant::now();
    let err = client(&[&server.base], policy)
        .charge(&request())
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(400), "{took:?}");
    assert!(took < Duration::from_millis(1500), "{took:?}");
    let ClientError::GaveUp { attempts, last, .. } = &err else {
        panic!("expected GaveUp, got {err:?}");
    };
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].outcome, AttemptOutcome::Timeout);
    assert!(last.contains("max_elapsed"), "{last}");
}

// --- Two-step payments: the same discipline, their own paths and bodies ---

const CHARGE_ID: &str = "ch_4f9QzXk2LmP8rT1vWb6yNc3d";

fn problem(status: u16, kind: &str) -> Step {
    Step::status(status)
        .header("content-type", "application/problem+json")
        .body(format!(
            r#"{{"type":"urn:idem:problem:{kind}","status":{status}}}"#
        ))
}

/// An authorization is `POST /v1/charges` with the charge's fields and
/// `"capture": false`, the same key and bytes on every attempt; its `201`
/// (the charge, `authorized`) is the answer.
#[tokio::test]
async fn an_authorization_is_a_charge_with_capture_false_retried_as_one() {
    let authorized = r#"{"id":"ch_1","status":"authorized","amount_capturable_cents":25000}"#;
    let server = Scripted::start(vec![
        problem(503, "outcome-unknown").header("retry-after", "0"),
        Step::status(201).body(authorized),
    ])
    .await;
    let answer = client(&[&server.base], fast_policy())
        .authorize_with_key("auth-1", &request())
        .await
        .unwrap();
    assert_eq!((answer.status, answer.key.as_str()), (201, "auth-1"));
    assert_eq!(&answer.body[..], authorized.as_bytes());
    let received = server.received();
    assert_eq!(received.len(), 2);
    for r in &received {
        assert_eq!(
            (r.method.as_str(), r.path.as_str()),
            ("POST", "/v1/charges")
        );
        assert_eq!(r.idempotency_key.as_deref(), Some("\"auth-1\""));
        assert_eq!(
            &r.body[..],
            br#"{"order_id":123,"amount_cents":25000,"currency":"BRL","description":"pedido 123","capture":false}"#
        );
    }
}

/// A capture goes to its charge's captures with its amount and `final`
/// (always sent; `true` unless asked otherwise), a void to its charge's void
/// with `{}`; each is one key, made once, on every attempt, retried on `503`
/// and an in-flight `409` as a charge is.
#[tokio::test]
async fn captures_and_voids_go_to_their_charge_with_one_key_and_one_body() {
    let capture = r#"{"id":"cp_1","charge_id":"ch_1","amount_cents":10000,"final":false}"#;
    let server = Scripted::start(vec![
        problem(503, "outcome-unknown").header("retry-after", "0"),
        problem(409, "request-in-flight").header("retry-after", "0"),
        Step::status(201).body(capture),
    ])
    .await;
    let c = client(&[&server.base], fast_policy());
    let part = CaptureRequest {
        amount_cents: Some(10_000),
        final_capture: false,
    };
    let answer = c.capture(CHARGE_ID, &part).await.unwrap();
    assert_eq!(answer.status, 201);
    assert_eq!(&answer.body[..], capture.as_bytes());
    assert_eq!(
        uuid::Uuid::parse_str(&answer.key)
            .unwrap()
            .get_version_num(),
        4
    );
    let received = server.received();
    assert_eq!(received.len(), 3);
    for r in &received {
        assert_eq!(r.path, format!("/v1/charges/{CHARGE_ID}/captures"));
        assert_eq!(r.idempotency_key, Some(format!("\"{}\"", answer.key)));
        assert_eq!(&r.body[..], br#"{"amount_cents":10000,"final":false}"#);
        assert_eq!(r.content_type.as_deref(), Some("application/json"));
    }

    // A final capture of what remains, and a void: each its own key.
    let all = c
        .capture_with_key("cap-2", CHARGE_ID, &CaptureRequest::default())
        .await
        .unwrap();
    let void = c.void_with_key("void-1", CHARGE_ID).await.unwrap();
    let another = c.void(CHARGE_ID).await.unwrap();
    assert_ne!(void.key, another.key);
    let received = server.received();
    let tail: Vec<(&str, Option<&str>, &[u8])> = received[3..]
        .iter()
        .map(|r| (r.path.as_str(), r.idempotency_key.as_deref(), &r.body[..]))
        .collect();
    let void_path = format!("/v1/charges/{CHARGE_ID}/void");
    let another_key = format!("\"{}\"", another.key);
    assert_eq!(
        tail,
        [
            (
                format!("/v1/charges/{CHARGE_ID}/captures").as_str(),
                Some("\"cap-2\""),
                &br#"{"final":true}"#[..]
            ),
            (void_path.as_str(), Some("\"void-1\""), &b"{}"[..]),
            (void_path.as_str(), Some(another_key.as_str()), &b"{}"[..]),
        ]
    );
    assert_eq!((all.key.as_str(), all.attempts.len()), ("cap-2", 1));
}

/// A `409` that another step of the authorization settles is retried under
/// the same key: a void that meets a pending capture (`capture-pending`) or
/// a pending final capture (`authorization-closed`) goes through once it
/// settles; a capture that meets a settled void then gets the final `422`.
#[tokio::test]
async fn a_conflict_with_another_step_is_retried_until_it_settles() {
    let void = r#"{"id":"vd_1","charge_id":"ch_1","amount_cents":15000}"#;
    let server = Scripted::start(vec![
        problem(409, "capture-pending"),
        problem(409, "authorization-closed"),
        Step::status(201).body(void),
    ])
    .await;
    let answer = client(&[&server.base], fast_policy())
        .void_with_key("v-1", CHARGE_ID)
        .await
        .unwrap();
    assert_eq!(answer.status, 201);
    assert_eq!(
        outcomes(&answer),
        [
            AttemptOutcome::Status(409),
            AttemptOutcome::Status(409),
            AttemptOutcome::Status(201)
        ]
    );
    assert!(server
        .received()
        .iter()
        .all(|r| r.idempotency_key.as_deref() == Some("\"v-1\"")));

    let server = Scripted::start(vec![
        problem(409, "authorization-closed"),
        problem(422, "charge-not-authorized"),
        Step::status(201),
    ])
    .await;
    let answer = client(&[&server.base], fast_policy())
        .capture(CHARGE_ID, &CaptureRequest::default())
        .await
        .unwrap();
    assert_eq!(answer.status, 422);
    assert_eq!(answer.attempts.len(), 2);
    assert_eq!(server.received().len(), 2);
}

/// A conflict that never settles within the policy ends as a give-up with
/// the key (nothing is stored under it: the same key later gets the answer).
#[tokio::test]
async fn a_conflict_that_never_settles_gives_up_with_the_key() {
    let server = Scripted::start(vec![problem(409, "capture-pending")]).await;
    let err = client(&[&server.base], fast_policy())
        .void_with_key("v-2", CHARGE_ID)
        .await
        .unwrap_err();
    let ClientError::GaveUp {
        key,
        attempts,
        last,
    } = &err
    else {
        panic!("expected GaveUp, got {err:?}");
    };
    assert_eq!((key.as_str(), attempts.len()), ("v-2", 5));
    assert!(last.contains("status 409"), "{last}");
}

/// A step the charge cannot take, and one the acquirer refused for good
/// (stored), are final answers after one attempt, though a second would
/// have been a `201`.
#[tokio::test]
async fn step_refusals_are_final_after_one_attempt() {
    for kind in [
        "capture-exceeds-authorization",
        "charge-not-authorized",
        "capture-failed",
        "idempotency-key-reused",
    ] {
        let server = Scripted::start(vec![problem(422, kind), Step::status(201)]).await;
        let answer = client(&[&server.base], fast_policy())
            .capture(
                CHARGE_ID,
                &CaptureRequest {
                    amount_cents: Some(25_001),
                    final_capture: true,
                },
            )
            .await
            .unwrap();
        assert_eq!((answer.status, answer.attempts.len()), (422, 1), "{kind}");
        assert_eq!(server.received().len(), 1, "{kind} was retried");
    }
    for kind in ["void-failed", "charge-not-authorized"] {
        let server = Scripted::start(vec![problem(422, kind), Step::status(201)]).await;
        let answer = client(&[&server.base], fast_policy())
            .void(CHARGE_ID)
            .await
            .unwrap();
        assert_eq!((answer.status, answer.attempts.len()), (422, 1), "{kind}");
    }
}

/// A charge id that could name another route is refused before any attempt.
#[tokio::test]
async fn a_bad_charge_id_makes_no_attempt() {
    let server = Scripted::start(vec![Step::status(201)]).await;
    let c = client(&[&server.base], fast_policy());
    for bad in ["", "ch_1/../refunds", "ch_1?x"] {
        let capture = c.capture(bad, &CaptureRequest::default()).await;
        assert!(matches!(capture, Err(ClientError::Build(_))), "{bad:?}");
        assert!(
            matches!(c.void(bad).await, Err(ClientError::Build(_))),
            "{bad:?}"
        );
    }
    assert!(server.received().is_empty());
}

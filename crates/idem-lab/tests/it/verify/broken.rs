//! A small idempotent charge and refund server in memory, correct unless told
//! to break one promise: what shows that each of verify's invariants can
//! fail. It captures and refunds at the real simulator over loopback, so the
//! ledger is true.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tokio::net::TcpListener;

/// The one promise a server breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Break {
    Nothing,
    /// Replays add a field that changes: other bytes.
    ReplayOtherBytes,
    /// Every third order's first request is answered `500`.
    Answer500,
    /// Every fifth order is answered `201` without a capture.
    CreatedWithoutCapture,
    /// Every fifth order is in flight forever.
    NeverSettles,
    /// A key reused with another body gets the stored answer, not `422`.
    ReuseReplays,
    /// `409` takes 150 ms.
    SlowConflict,
    /// A refund reads what the charge has left, checks its amount against
    /// it, calls the acquirer, and only then counts what it paid back: two
    /// refunds at once both pass the check.
    RefundCheckThenInsert,
    /// A refund's acquirer reference is made per attempt, not per refund,
    /// and a request whose refund is in flight takes it over at once (no
    /// `409`), as if the first attempt had died: a burst's copies each pay
    /// it back. The first outcome stored is every copy's answer, so only the
    /// ledger shows it.
    RefundReferencePerAttempt,
}

/// How long its acquirer call takes: long enough that a burst's copies find
/// the key in flight.
const CAPTURE_TAKES: Duration = Duration::from_millis(100);

#[derive(Clone)]
enum Entry {
    InFlight,
    Done {
        request: String,
        status: u16,
        body: String,
    },
}

/// A captured charge: what its refunds are paid back from.
struct Charge {
    reference: String,
    amount: i64,
    /// What its refunds paid back, and reserve while at the acquirer.
    refunded: i64,
}

/// A refund claimed and not yet settled, held by its key: a retry after an
/// unknown outcome sends the same refund again, its amount still reserved.
#[derive(Clone)]
struct Refund {
    id: String,
    charge_id: String,
    capture_reference: String,
    amount: i64,
}

#[derive(Clone)]
struct Server {
    broken: Break,
    sim: String,
    http: reqwest::Client,
    /// Charges' and refunds' keys: one key space.
    keys: Arc<Mutex<HashMap<String, Entry>>>,
    answered_500: Arc<Mutex<HashSet<i64>>>,
    posts: Arc<Mutex<usize>>,
    replays: Arc<Mutex<u64>>,
    /// Locked after `keys` when both are held.
    charges: Arc<Mutex<HashMap<String, Charge>>>,
    /// Locked after `keys` and before `charges` when they are held together.
    refunds: Arc<Mutex<HashMap<String, Refund>>>,
    /// Numbers refund ids and acquirer calls.
    counter: Arc<AtomicUsize>,
}

/// A running broken server: its URL and how many charges it was sent.
pub struct Running {
    pub url: String,
    posts: Arc<Mutex<usize>>,
}

impl Running {
    pub fn posts(&self) -> usize {
        *self.posts.lock().unwrap()
    }
}

/// Serves a server that breaks `broken` on a port of its own; it captures at
/// the simulator at `sim`.
pub async fn start(broken: Break, sim: &str) -> Running {
    let posts = Arc::new(Mutex::new(0));
    let server = Server {
        broken,
        sim: sim.to_owned(),
        http: reqwest::Client::new(),
        keys: Arc::default(),
        answered_500: Arc::default(),
        posts: posts.clone(),
        replays: Arc::default(),
        charges: Arc::default(),
        refunds: Arc::default(),
        counter: Arc::default(),
    };
    let app = Router::new()
        .route("/v1/charges", post(charge))
        .route("/v1/charges/{charge_id}/refunds", post(refund))
        .route("/v1/idempotency-keys/{key}", get(read_key))
        .with_state(server);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    Running { url, posts }
}

fn json(status: u16, body: String) -> Response {
    (
        StatusCode::from_u16(status).unwrap(),
        [("content-type", "application/json")],
        body,
    )
        .into_response()
}

fn in_flight() -> Response {
    let mut r = json(
        409,
        r#"{"type":"urn:idem:problem:request-in-flight"}"#.to_owned(),
    );
    r.headers_mut()
        .insert("retry-after", axum::http::HeaderValue::from(1));
    r
}

async fn charge(State(s): State<Server>, headers: HeaderMap, body: Bytes) -> Response {
    *s.posts.lock().unwrap() += 1;
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let request = String::from_utf8_lossy(&body).into_owned();
    let parsed: serde_json::Value = serde_json::from_str(&request).unwrap();
    let order_id = parsed["order_id"].as_i64().unwrap();
    let amount = parsed["amount_cents"].as_i64().unwrap();
    if s.broken == Break::Answer500
        && order_id % 3 == 0
        && s.answered_500.lock().unwrap().insert(order_id)
    {
        return json(500, r#"{"type":"urn:idem:problem:internal"}"#.to_owned());
    }
    if s.broken == Break::NeverSettles && order_id % 5 == 0 {
        return in_flight();
    }
    let found = {
        let mut keys = s.keys.lock().unwrap();
        let found = keys.get(&key).cloned();
        if found.is_none() {
            keys.insert(key.clone(), Entry::InFlight);
        }
        found
    };
    match found {
        Some(Entry::InFlight) => {
            if s.broken == Break::SlowConflict {
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
            in_flight()
        }
        Some(Entry::Done { request: first, .. })
            if first != request && s.broken != Break::ReuseReplays =>
        {
            reused()
        }
        Some(Entry::Done { status, body, .. }) => {
            let body = if s.broken == Break::ReplayOtherBytes {
                let mut n = s.replays.lock().unwrap();
                *n += 1;
                body.replacen('{', &format!("{{\"replayed\":{},", *n), 1)
            } else {
                body
            };
            json(status, body)
        }
        None => {
            let (status, body) = if s.broken == Break::CreatedWithoutCapture && order_id % 5 == 0 {
                (
                    201,
                    format!(
                        r#"{{"id":"ch_{order_id}","acquirer_reference":"ref_never_sent","status":"captured"}}"#
                    ),
                )
            } else {
                match capture(&s, &key, order_id, amount).await {
                    Some(outcome) => outcome,
                    None => {
                        s.keys.lock().unwrap().remove(&key);
                        return outcome_unknown();
                    }
                }
            };
            s.keys.lock().unwrap().insert(
                key,
                Entry::Done {
                    request,
                    status,
                    body: body.clone(),
                },
            );
            json(status, body)
        }
    }
}

fn reused() -> Response {
    json(
        422,
        r#"{"type":"urn:idem:problem:idempotency-key-reused"}"#.to_owned(),
    )
}

fn outcome_unknown() -> Response {
    json(
        503,
        r#"{"type":"urn:idem:problem:outcome-unknown"}"#.to_owned(),
    )
}

/// The acquirer's word: `201` with the charge, `402`, or `None` when it had none.
async fn capture(s: &Server, key: &str, order_id: i64, amount: i64) -> Option<(u16, String)> {
    tokio::time::sleep(CAPTURE_TAKES).await;
    let reference = format!("ref_{key}");
    let answer = s
        .http
        .post(format!("{}/v1/captures", s.sim))
        .header("idempotency-key", &reference)
        .json(&serde_json::json!({
            "reference": reference, "merchant": "broken", "order_id": order_id,
            "amount_cents": amount, "currency": "BRL",
        }))
        .send()
        .await
        .ok()?;
    match answer.status().as_u16() {
        201 => {
            let charge = Charge {
                reference: reference.clone(),
                amount,
                refunded: 0,
            };
            let id = format!("ch_{order_id}");
            s.charges.lock().unwrap().insert(id.clone(), charge);
            Some((
                201,
                format!(
                    r#"{{"id":"{id}","acquirer_reference":"{reference}","status":"captured"}}"#
                ),
            ))
        }
        402 => Some((
            402,
            r#"{"type":"urn:idem:problem:charge-declined"}"#.to_owned(),
        )),
        _ => None,
    }
}

async fn read_key(State(s): State<Server>, Path(key): Path<String>) -> Response {
    let entry = s.keys.lock().unwrap().get(&key).cloned();
    match entry {
        None => StatusCode::NOT_FOUND.into_response(),
        Some(Entry::InFlight) => json(200, format!(r#"{{"key":"{key}","state":"in_flight"}}"#)),
        Some(Entry::Done { status, .. }) => json(
            200,
            format!(r#"{{"key":"{key}","state":"completed","status":{status}}}"#),
        ),
    }
}

/// `POST /v1/charges/{id}/refunds`: the key claimed and the amount reserved
/// against the charge at once, then the acquirer; its word stored.
async fn refund(
    State(s): State<Server>,
    Path(charge_id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let request = format!("{charge_id} {}", String::from_utf8_lossy(&body));
    let parsed: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let refund = match begin_refund(
        &s,
        &key,
        &request,
        &charge_id,
        parsed["amount_cents"].as_i64(),
    ) {
        Begun::Send(refund) => refund,
        Begun::Answer(answer) => return answer,
    };
    let attempt = s.counter.fetch_add(1, Ordering::SeqCst);
    let reference = if s.broken == Break::RefundReferencePerAttempt {
        format!("ref_{key}_{attempt}")
    } else {
        format!("ref_{key}")
    };
    match pay_back(&s, &reference, &refund).await {
        Some((status, body)) => {
            let (status, body) = store_refund(&s, &key, &request, &refund, status, body);
            json(status, body)
        }
        None => {
            // The refund stays claimed, its amount reserved; the key is free
            // for a retry, which sends the same refund again.
            s.keys.lock().unwrap().remove(&key);
            outcome_unknown()
        }
    }
}

/// What a refund request comes to before the acquirer.
enum Begun {
    /// A refund to send: its key claimed, its amount reserved.
    Send(Refund),
    /// Nothing to send: in flight, a stored outcome, a refusal.
    Answer(Response),
}

/// Claims the key for a refund of `asked` cents (what the charge has left when
/// `None`): the refund its key already holds, or a new one whose amount is
/// reserved against the charge in the same step.
fn begin_refund(
    s: &Server,
    key: &str,
    request: &str,
    charge_id: &str,
    asked: Option<i64>,
) -> Begun {
    let mut keys = s.keys.lock().unwrap();
    match keys.get(key) {
        Some(Entry::InFlight) if s.broken != Break::RefundReferencePerAttempt => {
            return Begun::Answer(in_flight())
        }
        Some(Entry::Done { request: first, .. }) if first != request => {
            return Begun::Answer(reused())
        }
        Some(Entry::Done { status, body, .. }) => {
            return Begun::Answer(json(*status, body.clone()))
        }
        Some(Entry::InFlight) | None => {}
    }
    let mut refunds = s.refunds.lock().unwrap();
    if let Some(held) = refunds.get(key) {
        keys.insert(key.to_owned(), Entry::InFlight);
        return Begun::Send(held.clone());
    }
    let mut charges = s.charges.lock().unwrap();
    let Some(charge) = charges.get_mut(charge_id) else {
        return Begun::Answer(json(
            404,
            r#"{"type":"urn:idem:problem:not-found"}"#.to_owned(),
        ));
    };
    let left = charge.amount - charge.refunded;
    let amount = asked.unwrap_or(left);
    if amount > left || amount < 1 {
        return Begun::Answer(json(
            422,
            format!(
                r#"{{"type":"urn:idem:problem:refund-exceeds-captured","remaining_cents":{left}}}"#
            ),
        ));
    }
    if s.broken != Break::RefundCheckThenInsert {
        charge.refunded += amount;
    }
    let refund = Refund {
        id: format!("re_{}", s.counter.fetch_add(1, Ordering::SeqCst)),
        charge_id: charge_id.to_owned(),
        capture_reference: charge.reference.clone(),
        amount,
    };
    refunds.insert(key.to_owned(), refund.clone());
    keys.insert(key.to_owned(), Entry::InFlight);
    Begun::Send(refund)
}

/// The acquirer's word on a refund: `201` with the refund, `422`
/// `refund-failed`, or `None` when it had none.
async fn pay_back(s: &Server, reference: &str, refund: &Refund) -> Option<(u16, String)> {
    tokio::time::sleep(CAPTURE_TAKES).await;
    let answer = s
        .http
        .post(format!("{}/v1/refunds", s.sim))
        .header("idempotency-key", reference)
        .json(&serde_json::json!({
            "reference": reference, "capture_reference": refund.capture_reference,
            "merchant": "broken", "amount_cents": refund.amount, "currency": "BRL",
        }))
        .send()
        .await
        .ok()?;
    let Refund {
        id,
        charge_id,
        amount,
        ..
    } = refund;
    match answer.status().as_u16() {
        201 => Some((
            201,
            format!(
                r#"{{"id":"{id}","charge_id":"{charge_id}","amount_cents":{amount},"currency":"BRL","status":"succeeded","acquirer_reference":"{reference}"}}"#
            ),
        )),
        422 => Some((
            422,
            format!(
                r#"{{"type":"urn:idem:problem:refund-failed","refund":{{"id":"{id}","amount_cents":{amount},"status":"failed"}}}}"#
            ),
        )),
        _ => None,
    }
}

/// Stores a refund's outcome unless one is already stored (a taken-over
/// attempt's), settles its amount against the charge once, and returns the
/// outcome stored.
fn store_refund(
    s: &Server,
    key: &str,
    request: &str,
    refund: &Refund,
    status: u16,
    body: String,
) -> (u16, String) {
    let mut keys = s.keys.lock().unwrap();
    if let Some(Entry::Done { status, body, .. }) = keys.get(key) {
        return (*status, body.clone());
    }
    s.refunds.lock().unwrap().remove(key);
    if let Some(charge) = s.charges.lock().unwrap().get_mut(&refund.charge_id) {
        match (status, s.broken) {
            // Check-then-insert counts the refund only now it is paid.
            (201, Break::RefundCheckThenInsert) => charge.refunded += refund.amount,
            (201, _) | (_, Break::RefundCheckThenInsert) => {}
            // A refusal gives its reserved amount back.
            _ => charge.refunded -= refund.amount,
        }
    }
    keys.insert(
        key.to_owned(),
        Entry::Done {
            request: request.to_owned(),
            status,
            body: body.clone(),
        },
    );
    (status, body)
}

//! A small idempotent charge, refund and two-step server in memory, correct
//! unless told to break one promise: what shows that each of verify's
//! invariants can fail. It captures, refunds, authorizes, captures
//! authorizations and voids at the real simulator over loopback, so the
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
    /// A capture of an authorization reads what it has left, checks its
    /// amount against it, calls the acquirer, and only then counts what it
    /// took: two captures at once both pass the check. (A void still waits
    /// for the captures at the acquirer, and nothing is captured once the
    /// authorization is closed.)
    CaptureCheckThenAct,
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

/// An authorized charge: what its captures take from, and whether a final
/// capture or a void has closed it.
struct Held {
    reference: String,
    amount: i64,
    /// What its captures took, and reserve while at the acquirer.
    captured: i64,
    /// Its captures at the acquirer now: a void waits for them.
    pending: usize,
    /// A final capture or a void of it is at the acquirer: every other step
    /// waits.
    closing: bool,
    /// A final capture or a void closed it.
    closed: bool,
}

/// A capture or a void claimed and not yet settled, held by its key, as a
/// refund is.
#[derive(Clone)]
struct StepClaim {
    id: String,
    charge_id: String,
    authorization_reference: String,
    /// A capture's amount; `None` for a void.
    capture: Option<i64>,
    final_capture: bool,
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
    /// Authorized charges, by id. Locked after `keys` and `steps`.
    authorizations: Arc<Mutex<HashMap<String, Held>>>,
    /// Captures and voids claimed and not yet settled, by key. Locked after
    /// `keys` and before `authorizations`.
    steps: Arc<Mutex<HashMap<String, StepClaim>>>,
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
        authorizations: Arc::default(),
        steps: Arc::default(),
        counter: Arc::default(),
    };
    let app = Router::new()
        .route("/v1/charges", post(charge))
        .route("/v1/charges/{charge_id}/refunds", post(refund))
        .route("/v1/charges/{charge_id}/captures", post(capture_step))
        .route("/v1/charges/{charge_id}/void", post(void_step))
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
    try_later("request-in-flight")
}

/// A `409` of `kind` with `Retry-After: 1`.
fn try_later(kind: &str) -> Response {
    let mut r = json(409, format!(r#"{{"type":"urn:idem:problem:{kind}"}}"#));
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
    let authorize_only = parsed["capture"].as_bool() == Some(false);
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
                let outcome = if authorize_only {
                    authorize(&s, &key, order_id, amount).await
                } else {
                    capture(&s, &key, order_id, amount).await
                };
                match outcome {
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

/// The acquirer's word on an authorization: `201` with the charge
/// (`authorized`), `402`, or `None` when it had none.
async fn authorize(s: &Server, key: &str, order_id: i64, amount: i64) -> Option<(u16, String)> {
    tokio::time::sleep(CAPTURE_TAKES).await;
    let reference = format!("ref_{key}");
    let answer = s
        .http
        .post(format!("{}/v1/authorizations", s.sim))
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
            let held = Held {
                reference: reference.clone(),
                amount,
                captured: 0,
                pending: 0,
                closing: false,
                closed: false,
            };
            let id = format!("ch_{order_id}");
            s.authorizations.lock().unwrap().insert(id.clone(), held);
            Some((
                201,
                format!(
                    r#"{{"id":"{id}","acquirer_reference":"{reference}","status":"authorized","amount_captured_cents":0,"amount_capturable_cents":{amount}}}"#
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

/// `POST /v1/charges/{id}/captures`: the key claimed and the amount
/// reserved against the authorization at once (unless the server checks
/// then acts), then the acquirer; its word stored.
async fn capture_step(
    State(s): State<Server>,
    Path(charge_id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let parsed: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let ask = Ask::Capture {
        amount: parsed["amount_cents"].as_i64(),
        final_capture: parsed["final"].as_bool().unwrap_or(true),
    };
    step(&s, charge_id, &headers, &body, ask).await
}

/// `POST /v1/charges/{id}/void`: the key claimed and the authorization
/// closed at once, while no capture of it is at the acquirer; then the
/// acquirer; its word stored.
async fn void_step(
    State(s): State<Server>,
    Path(charge_id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    step(&s, charge_id, &headers, &body, Ask::Void).await
}

/// What a step asks of an authorization.
#[derive(Clone, Copy)]
enum Ask {
    Capture {
        amount: Option<i64>,
        final_capture: bool,
    },
    Void,
}

async fn step(
    s: &Server,
    charge_id: String,
    headers: &HeaderMap,
    body: &[u8],
    ask: Ask,
) -> Response {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let what = if matches!(ask, Ask::Void) {
        "void"
    } else {
        "capture"
    };
    let request = format!("{what} {charge_id} {}", String::from_utf8_lossy(body));
    let claim = match begin_step(s, &key, &request, &charge_id, ask) {
        StepBegun::Send(claim) => claim,
        StepBegun::Answer(answer) => return answer,
    };
    let reference = format!("ref_{key}");
    match call_step(s, &reference, &claim).await {
        Some((status, body)) => {
            let (status, body) = store_step(s, &key, &request, &claim, status, body);
            json(status, body)
        }
        None => {
            // The step stays claimed (its amount reserved, the authorization
            // closing for a void): a retry sends the same step again.
            s.keys.lock().unwrap().remove(&key);
            outcome_unknown()
        }
    }
}

/// What a step request comes to before the acquirer.
enum StepBegun {
    Send(StepClaim),
    Answer(Response),
}

/// Claims the key for a step: the claim its key already holds, or a new one
/// decided against the authorization in the same step (a capture's amount
/// reserved, unless the server checks then acts; a void's closing).
fn begin_step(s: &Server, key: &str, request: &str, charge_id: &str, ask: Ask) -> StepBegun {
    let mut keys = s.keys.lock().unwrap();
    match keys.get(key) {
        Some(Entry::InFlight) => return StepBegun::Answer(in_flight()),
        Some(Entry::Done { request: first, .. }) if first != request => {
            return StepBegun::Answer(reused())
        }
        Some(Entry::Done { status, body, .. }) => {
            return StepBegun::Answer(json(*status, body.clone()))
        }
        None => {}
    }
    let mut steps = s.steps.lock().unwrap();
    if let Some(held) = steps.get(key) {
        keys.insert(key.to_owned(), Entry::InFlight);
        return StepBegun::Send(held.clone());
    }
    let mut authorizations = s.authorizations.lock().unwrap();
    let Some(held) = authorizations.get_mut(charge_id) else {
        return StepBegun::Answer(json(
            404,
            r#"{"type":"urn:idem:problem:not-found"}"#.to_owned(),
        ));
    };
    if held.closed {
        return StepBegun::Answer(json(
            422,
            r#"{"type":"urn:idem:problem:charge-not-authorized"}"#.to_owned(),
        ));
    }
    if held.closing {
        return StepBegun::Answer(try_later("authorization-closed"));
    }
    let (capture, final_capture) = match ask {
        Ask::Capture {
            amount,
            final_capture,
        } => {
            let left = held.amount - held.captured;
            let amount = amount.unwrap_or(left);
            if amount > left || amount < 1 {
                return StepBegun::Answer(json(
                    422,
                    format!(
                        r#"{{"type":"urn:idem:problem:capture-exceeds-authorization","remaining_cents":{left}}}"#
                    ),
                ));
            }
            if s.broken != Break::CaptureCheckThenAct {
                held.captured += amount;
            }
            held.pending += 1;
            held.closing = final_capture;
            (Some(amount), final_capture)
        }
        Ask::Void => {
            if held.pending > 0 {
                return StepBegun::Answer(try_later("capture-pending"));
            }
            held.closing = true;
            (None, false)
        }
    };
    let prefix = if capture.is_some() { "cp" } else { "vd" };
    let claim = StepClaim {
        id: format!("{prefix}_{}", s.counter.fetch_add(1, Ordering::SeqCst)),
        charge_id: charge_id.to_owned(),
        authorization_reference: held.reference.clone(),
        capture,
        final_capture,
    };
    steps.insert(key.to_owned(), claim.clone());
    keys.insert(key.to_owned(), Entry::InFlight);
    StepBegun::Send(claim)
}

/// The acquirer's word on a step: `201` with the capture or the void (a
/// void's amount what the acquirer released), `422` `capture-failed` or
/// `void-failed`, or `None` when it had none.
async fn call_step(s: &Server, reference: &str, claim: &StepClaim) -> Option<(u16, String)> {
    tokio::time::sleep(CAPTURE_TAKES).await;
    let (path, body) = match claim.capture {
        Some(amount) => (
            "captures",
            serde_json::json!({
                "reference": reference, "authorization_reference": claim.authorization_reference,
                "merchant": "broken", "amount_cents": amount, "currency": "BRL",
                "final": claim.final_capture,
            }),
        ),
        None => (
            "voids",
            serde_json::json!({
                "reference": reference, "authorization_reference": claim.authorization_reference,
                "merchant": "broken",
            }),
        ),
    };
    let answer = s
        .http
        .post(format!("{}/v1/{path}", s.sim))
        .header("idempotency-key", reference)
        .json(&body)
        .send()
        .await
        .ok()?;
    let status = answer.status().as_u16();
    let said: serde_json::Value = answer.json().await.unwrap_or_default();
    let StepClaim { id, charge_id, .. } = claim;
    let (amount, kind, field, fin) = match claim.capture {
        Some(amount) => (
            amount,
            "capture-failed",
            "capture",
            format!(r#","final":{}"#, claim.final_capture),
        ),
        None => (
            said["released_cents"].as_i64().unwrap_or(0),
            "void-failed",
            "void",
            String::new(),
        ),
    };
    match status {
        201 => Some((
            201,
            format!(
                r#"{{"id":"{id}","charge_id":"{charge_id}","amount_cents":{amount},"currency":"BRL"{fin},"status":"succeeded","acquirer_reference":"{reference}"}}"#
            ),
        )),
        422 => Some((
            422,
            format!(
                r#"{{"type":"urn:idem:problem:{kind}","{field}":{{"id":"{id}","amount_cents":{amount},"status":"failed"}}}}"#
            ),
        )),
        _ => None,
    }
}

/// Stores a step's outcome unless one is already stored, settles it against
/// the authorization once (what a capture took, or gives back; a final
/// capture's or a void's closing, made or undone), and returns the outcome
/// stored.
fn store_step(
    s: &Server,
    key: &str,
    request: &str,
    claim: &StepClaim,
    status: u16,
    body: String,
) -> (u16, String) {
    let mut keys = s.keys.lock().unwrap();
    if let Some(Entry::Done { status, body, .. }) = keys.get(key) {
        return (*status, body.clone());
    }
    s.steps.lock().unwrap().remove(key);
    if let Some(held) = s.authorizations.lock().unwrap().get_mut(&claim.charge_id) {
        let made = status == 201;
        if let Some(amount) = claim.capture {
            held.pending -= 1;
            match (made, s.broken) {
                // Check-then-act counts the capture only now it is made.
                (true, Break::CaptureCheckThenAct) => held.captured += amount,
                (true, _) | (false, Break::CaptureCheckThenAct) => {}
                // A refusal gives its reserved amount back.
                (false, _) => held.captured -= amount,
            }
        }
        if claim.capture.is_none() || claim.final_capture {
            held.closing = false;
            held.closed = made;
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

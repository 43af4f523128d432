//! A small idempotent charge server in memory, correct unless told to break
//! one promise: what shows that each of verify's invariants can fail. It
//! captures at the real simulator over loopback, so the ledger is true.

use std::collections::{HashMap, HashSet};
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

#[derive(Clone)]
struct Server {
    broken: Break,
    sim: String,
    http: reqwest::Client,
    keys: Arc<Mutex<HashMap<String, Entry>>>,
    answered_500: Arc<Mutex<HashSet<i64>>>,
    posts: Arc<Mutex<usize>>,
    replays: Arc<Mutex<u64>>,
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
    };
    let app = Router::new()
        .route("/v1/charges", post(charge))
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
            json(
                422,
                r#"{"type":"urn:idem:problem:idempotency-key-reused"}"#.to_owned(),
            )
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
                        return json(
                            503,
                            r#"{"type":"urn:idem:problem:outcome-unknown"}"#.to_owned(),
                        );
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
        201 => Some((
            201,
            format!(
                r#"{{"id":"ch_{order_id}","acquirer_reference":"{reference}","status":"captured"}}"#
            ),
        )),
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

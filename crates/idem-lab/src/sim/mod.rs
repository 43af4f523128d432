//! The acquirer simulator (`idem-lab acquirer-sim`): the protocol of
//! `docs/contract/acquirer.md`, deduplicating by reference, with fault
//! injection and a ledger.
//!
//! The ledger is the ground truth for "charged exactly once": it lists every
//! capture the simulator made and counts them per `(merchant, order_id)`.
//! State lives in memory; a restart forgets it.
//!
//! Like a real acquirer, it finishes a capture even when the caller hangs up:
//! the work runs on its own task, so a client timeout never undoes a capture.
//! And like a real acquirer, it answers `409` to a POST of a reference whose
//! first POST is still being processed, and can be told to answer any status
//! (`--fault status:429`), so tests can script what the real world does.

mod book;
mod faults;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use book::{Ledger, LedgerCapture};
pub use faults::{Fault, Faults};

use book::{Book, Recorded};
use idem::http::{Tls, HEADER_READ_TIMEOUT};
use idem_core::acquirer::protocol::{CaptureOutcome, CaptureRequest};

#[derive(Clone)]
struct Sim {
    /// Std mutexes: held only for map operations, never across an await.
    faults: Arc<Mutex<Faults>>,
    book: Arc<Mutex<Book>>,
    /// References whose POST is being processed now: another POST of one of
    /// them is answered `409`, as a real acquirer does.
    in_flight: Arc<Mutex<HashSet<String>>>,
}

/// The simulator's routes: the protocol under `/v1`, its extras under `/_sim`.
pub fn router(faults: Faults) -> Router {
    let sim = Sim {
        faults: Arc::new(Mutex::new(faults)),
        book: Arc::new(Mutex::new(Book::default())),
        in_flight: Arc::default(),
    };
    Router::new()
        .route("/v1/captures", post(capture))
        .route("/v1/captures/{reference}", get(lookup))
        .route("/_sim/faults", get(get_faults).put(put_faults))
        .route("/_sim/ledger", get(ledger))
        .with_state(sim)
}

/// Serves on a bound listener until `shutdown` fires: plain HTTP, or HTTPS
/// with `tls` (`idem-lab acquirer-sim --tls-cert FILE --tls-key FILE`), as real
/// acquirers speak only HTTPS.
pub async fn serve(
    listener: TcpListener,
    faults: Faults,
    tls: Option<Tls>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    idem::http::run_server(listener, router(faults), HEADER_READ_TIMEOUT, tls, shutdown).await;
    Ok(())
}

async fn capture(State(sim): State<Sim>, headers: HeaderMap, body: Bytes) -> Response {
    let request: CaptureRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return (StatusCode::BAD_REQUEST, format!("bad capture request: {e}")).into_response()
        }
    };
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok());
    let traceparent = headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if key != Some(request.reference.as_str()) {
        return (
            StatusCode::BAD_REQUEST,
            "the Idempotency-Key header must equal the reference",
        )
            .into_response();
    }
    let Some(in_flight) = InFlight::enter(&sim.in_flight, &request.reference) else {
        return (
            StatusCode::CONFLICT,
            "a POST for this reference is still being processed",
        )
            .into_response();
    };
    // The capture runs to the end even if the caller hangs up meanwhile, and
    // the reference stays in flight until its answer is ready.
    let work = tokio::spawn(async move {
        let _in_flight = in_flight;
        let plan = sim.lock_faults().take();
        if !plan.latency.is_zero() {
            tokio::time::sleep(plan.latency).await;
        }
        let answer = match plan.fault {
            Fault::ErrorBefore => Answer::ErrorBefore,
            Fault::Status(status) => Answer::Status(status, plan.retry_after_secs),
            Fault::None
            | Fault::ErrorAfter
            | Fault::Hang
            | Fault::DropAfter
            | Fault::WrongAmount
            | Fault::WrongCurrency
            | Fault::WrongOrder => {
                let moved = plan.fault.captures(&request);
                match sim
                    .lock_book()
                    .capture(request, plan.decline, moved, traceparent)
                {
                    Recorded::Mismatch => Answer::Mismatch,
                    Recorded::Outcome(outcome) => Answer::Outcome(outcome, plan.fault),
                }
            }
        };
        if let Answer::Outcome(_, Fault::Hang) = answer {
            tokio::time::sleep(plan.hang).await;
        }
        answer
    });
    match work.await {
        Ok(answer) => answer.into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// What a capture call comes to, decided on the capture's own task.
enum Answer {
    ErrorBefore,
    /// A scripted status, with its `Retry-After` seconds.
    Status(u16, Option<u64>),
    Mismatch,
    /// The reference's outcome, and the fault that shapes its delivery.
    Outcome(CaptureOutcome, Fault),
}

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        match self {
            Self::ErrorBefore => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "injected: error before capture",
            )
                .into_response(),
            Self::Status(status, retry_after) => {
                let status =
                    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                let mut r = (status, format!("injected: status {status}")).into_response();
                if let Some(seconds) = retry_after {
                    r.headers_mut()
                        .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
                }
                r
            }
            Self::Mismatch => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "the reference is known with a different amount, currency or order",
            )
                .into_response(),
            Self::Outcome(_, Fault::ErrorAfter) => {
                (StatusCode::BAD_GATEWAY, "injected: error after capture").into_response()
            }
            Self::Outcome(_, Fault::DropAfter) => dropped_connection(),
            Self::Outcome(outcome, _) => outcome_response(&outcome, true),
        }
    }
}

/// A reference whose POST is being processed, held until dropped.
struct InFlight {
    set: Arc<Mutex<HashSet<String>>>,
    reference: String,
}

impl InFlight {
    /// `None` if a POST of the same reference is already in flight.
    fn enter(set: &Arc<Mutex<HashSet<String>>>, reference: &str) -> Option<Self> {
        let fresh = set
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(reference.to_owned());
        fresh.then(|| Self {
            set: set.clone(),
            reference: reference.to_owned(),
        })
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.set
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.reference);
    }
}

async fn lookup(State(sim): State<Sim>, Path(reference): Path<String>) -> Response {
    match sim.lock_book().outcome(&reference) {
        Some(outcome) => outcome_response(&outcome, false),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn get_faults(State(sim): State<Sim>) -> Json<Faults> {
    Json(sim.lock_faults().clone())
}

async fn put_faults(State(sim): State<Sim>, Json(faults): Json<Faults>) -> Json<Faults> {
    *sim.lock_faults() = faults.clone();
    Json(faults)
}

async fn ledger(State(sim): State<Sim>) -> Json<Ledger> {
    Json(sim.lock_book().ledger())
}

/// `201`/`402` for a POST, `200` for a GET, with the outcome body.
fn outcome_response(outcome: &CaptureOutcome, post: bool) -> Response {
    let status = match (outcome, post) {
        (_, false) => StatusCode::OK,
        (CaptureOutcome::Captured { .. }, true) => StatusCode::CREATED,
        (CaptureOutcome::Declined { .. }, true) => StatusCode::PAYMENT_REQUIRED,
    };
    (status, Json(outcome)).into_response()
}

/// A response whose body fails at once: hyper aborts the connection, so the
/// client sees the connection drop without a complete answer.
fn dropped_connection() -> Response {
    let failing = futures_util::stream::once(async {
        Err::<Bytes, _>(std::io::Error::other(
            "injected: connection dropped after capture",
        ))
    });
    (StatusCode::CREATED, Body::from_stream(failing)).into_response()
}

impl Sim {
    fn lock_faults(&self) -> std::sync::MutexGuard<'_, Faults> {
        self.faults.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }
}

//! The acquirer simulator (`idem acquirer-sim`): the protocol of acquirer.md,
//! deduplicating by reference, with fault injection and a ledger.
//!
//! The ledger is the ground truth for "charged exactly once": it lists every
//! capture the simulator made and counts them per `(merchant, order_id)`.
//! State lives in memory; a restart forgets it.
//!
//! Like a real acquirer, it finishes a capture even when the caller hangs up:
//! the work runs on its own task, so a client timeout never undoes a capture.

mod book;
mod faults;

use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use book::{Ledger, LedgerCapture, LedgerCount};
pub use faults::{Fault, Faults};

use crate::acquirer::protocol::{CaptureOutcome, CaptureRequest};
use book::{Book, Recorded};

#[derive(Clone)]
struct Sim {
    /// Std mutexes: held only for map operations, never across an await.
    faults: Arc<Mutex<Faults>>,
    book: Arc<Mutex<Book>>,
}

/// The simulator's routes: the protocol under `/v1`, its extras under `/_sim`.
pub fn router(faults: Faults) -> Router {
    let sim = Sim {
        faults: Arc::new(Mutex::new(faults)),
        book: Arc::new(Mutex::new(Book::default())),
    };
    Router::new()
        .route("/v1/captures", post(capture))
        .route("/v1/captures/{reference}", get(lookup))
        .route("/_sim/faults", get(get_faults).put(put_faults))
        .route("/_sim/ledger", get(ledger))
        .with_state(sim)
}

/// Serves on a bound listener until `shutdown` fires.
pub async fn serve(
    listener: TcpListener,
    faults: Faults,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    axum::serve(listener, router(faults))
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await?;
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
    if key != Some(request.reference.as_str()) {
        return (
            StatusCode::BAD_REQUEST,
            "the Idempotency-Key header must equal the reference",
        )
            .into_response();
    }
    // The capture runs to the end even if the caller hangs up meanwhile.
    let work = tokio::spawn(async move {
        let plan = sim.lock_faults().take();
        if !plan.latency.is_zero() {
            tokio::time::sleep(plan.latency).await;
        }
        if plan.fault == Fault::ErrorBefore {
            return (plan, None);
        }
        let recorded = sim.lock_book().capture(request, plan.decline);
        (plan, Some(recorded))
    });
    let Ok((plan, recorded)) = work.await else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let outcome = match recorded {
        None => {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                "injected: error before capture",
            )
                .into_response()
        }
        Some(Recorded::Mismatch) => {
            return (
                StatusCode::UNPROCESSABLE_ENTITY,
                "the reference is known with a different amount, currency or order",
            )
                .into_response()
        }
        Some(Recorded::Outcome(outcome)) => outcome,
    };
    match plan.fault {
        Fault::ErrorAfter => {
            (StatusCode::BAD_GATEWAY, "injected: error after capture").into_response()
        }
        Fault::DropAfter => dropped_connection(),
        Fault::Hang => {
            tokio::time::sleep(plan.hang).await;
            outcome_response(&outcome, true)
        }
        Fault::None | Fault::ErrorBefore => outcome_response(&outcome, true),
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

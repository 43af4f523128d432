//! The acquirer simulator (`idem-lab acquirer-sim`): the protocol of
//! `docs/contract/acquirer.md`, deduplicating by reference, with fault
//! injection and a ledger.
//!
//! The ledger is the ground truth for "charged exactly once": it lists every
//! capture the simulator made and counts them per `(merchant, order_id)`, and
//! every refund with the capture it paid back from ("refunded exactly once",
//! "never more than captured"). For two-step payments it lists every
//! authorization, every capture of one (with its authorization) and every
//! void ("never captured more than authorized", "nothing captured after a
//! void"). State lives in memory; a restart forgets it.
//!
//! Like a real acquirer, it finishes a capture even when the caller hangs up:
//! the work runs on its own task, so a client timeout never undoes a capture.
//! And like a real acquirer, it answers `409` to a POST of a reference whose
//! first POST is still being processed, and can be told to answer any status
//! (`--fault status:429`), so tests can script what the real world does.

mod book;
mod faults;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use book::{
    refusal, Ledger, LedgerAuthorization, LedgerAuthorizationCapture, LedgerCapture, LedgerRefund,
    LedgerVoid,
};
pub use faults::{Fault, Faults};

use book::{Book, Recorded};
use faults::Plan;
use idem::http::{Tls, HEADER_READ_TIMEOUT};
use idem_core::acquirer::protocol::{
    AuthorizationCaptureOutcome, AuthorizationCaptureRequest, AuthorizationOutcome,
    AuthorizationRequest, CaptureOutcome, CaptureRequest, RefundOutcome, RefundRequest,
    VoidOutcome, VoidRequest,
};

#[derive(Clone)]
struct Sim {
    /// Std mutexes: held only for map operations, never across an await.
    faults: Arc<Mutex<Faults>>,
    book: Arc<Mutex<Book>>,
    /// References whose POST is being processed now: another POST of one of
    /// them is answered `409`, as a real acquirer does.
    in_flight: Arc<Mutex<HashSet<String>>>,
    watch: Option<Watch>,
}

/// What a program running the simulator in its own process can read of the
/// calls it took (`idem-lab bench --arrival`): how long the simulator spent
/// on each order's POSTs — the acquirer's part of a charge's time, from a
/// call's arrival to its answer (or to the caller hanging up) — and how many
/// calls drew a random fault.
#[derive(Clone, Default)]
pub struct Watch(Arc<WatchInner>);

#[derive(Default)]
struct WatchInner {
    /// A std mutex: held only for a map operation.
    by_order: Mutex<HashMap<i64, Duration>>,
    random_faults: AtomicU64,
}

impl Watch {
    /// The time the simulator spent so far on POSTs naming `order_id`.
    pub fn acquirer_time(&self, order_id: i64) -> Duration {
        let by_order = self.0.by_order.lock().unwrap_or_else(|p| p.into_inner());
        by_order.get(&order_id).copied().unwrap_or_default()
    }

    /// How many calls drew a random fault (`Faults::fault_rate`).
    pub fn random_faults(&self) -> u64 {
        self.0.random_faults.load(Ordering::Relaxed)
    }

    fn add(&self, order_id: i64, spent: Duration) {
        let mut by_order = self.0.by_order.lock().unwrap_or_else(|p| p.into_inner());
        *by_order.entry(order_id).or_default() += spent;
    }
}

/// Adds the time from its making to its drop to an order's total: dropped
/// when the call's handler ends, whether it answered or the caller left.
struct Timer {
    watch: Watch,
    order_id: i64,
    since: Instant,
}

impl Drop for Timer {
    fn drop(&mut self) {
        self.watch.add(self.order_id, self.since.elapsed());
    }
}

/// The simulator's routes: the protocol under `/v1`, its extras under `/_sim`.
pub fn router(faults: Faults) -> Router {
    routes(faults, None)
}

/// The routes, with what they do written down in `watch`.
pub fn watched_router(faults: Faults, watch: Watch) -> Router {
    routes(faults, Some(watch))
}

fn routes(faults: Faults, watch: Option<Watch>) -> Router {
    let sim = Sim {
        faults: Arc::new(Mutex::new(faults)),
        book: Arc::new(Mutex::new(Book::default())),
        in_flight: Arc::default(),
        watch,
    };
    Router::new()
        .route("/v1/captures", post(book_call::<CaptureCall>))
        .route("/v1/captures/{reference}", get(lookup::<CaptureCall>))
        .route("/v1/refunds", post(book_call::<RefundRequest>))
        .route("/v1/refunds/{reference}", get(lookup::<RefundRequest>))
        .route(
            "/v1/authorizations",
            post(book_call::<AuthorizationRequest>),
        )
        .route(
            "/v1/authorizations/{reference}",
            get(lookup::<AuthorizationRequest>),
        )
        .route("/v1/voids", post(book_call::<VoidRequest>))
        .route("/v1/voids/{reference}", get(lookup::<VoidRequest>))
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

/// Serves plain HTTP on a bound listener until `shutdown` fires, writing
/// down what it does in `watch`.
pub async fn serve_watched(
    listener: TcpListener,
    faults: Faults,
    watch: Watch,
    shutdown: CancellationToken,
) {
    let routes = watched_router(faults, watch);
    idem::http::run_server(listener, routes, HEADER_READ_TIMEOUT, None, shutdown).await;
}

/// A POST the simulator books: a capture of either kind, a refund, an
/// authorization or a void. All keep the same rules: the reference is the
/// `Idempotency-Key`, a second POST while the first is in flight is `409`, a
/// known reference repeats its first outcome, and the faults apply alike.
trait Booking: serde::de::DeserializeOwned + Send + 'static {
    type Outcome: serde::Serialize + Send + 'static;
    fn reference(&self) -> &str;
    /// The order the call names, if it names one (a one-step capture, an
    /// authorization).
    fn order_id(&self) -> Option<i64> {
        None
    }
    /// Books `self` under `plan` (its decline and its lie).
    fn book(
        self,
        book: &mut Book,
        plan: &Plan,
        traceparent: Option<String>,
    ) -> Recorded<Self::Outcome>;
    /// The outcome a lookup of `reference` finds.
    fn find(book: &Book, reference: &str) -> Option<Self::Outcome>;
    /// The status of a POST answered with `outcome`.
    fn post_status(outcome: &Self::Outcome) -> StatusCode;
}

/// A `POST /v1/captures` body: a one-step capture, or a capture of an
/// authorization (the body names one). Both kinds share the path and the
/// references, so a lookup or a refund need not know which kind it was.
enum CaptureCall {
    OneStep(CaptureRequest),
    OfAuthorization(AuthorizationCaptureRequest),
}

impl<'de> serde::Deserialize<'de> for CaptureCall {
    /// By `authorization_reference`: each kind then parses strictly, with its
    /// own error for a body that is not one.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let body = serde_json::Value::deserialize(d)?;
        let of_authorization = body.get("authorization_reference").is_some();
        let parsed = if of_authorization {
            serde_json::from_value(body).map(Self::OfAuthorization)
        } else {
            serde_json::from_value(body).map(Self::OneStep)
        };
        parsed.map_err(serde::de::Error::custom)
    }
}

/// The outcome of a capture of either kind, as its kind writes it.
#[derive(serde::Serialize)]
#[serde(untagged)]
enum CaptureCallOutcome {
    OneStep(CaptureOutcome),
    OfAuthorization(AuthorizationCaptureOutcome),
}

impl Booking for CaptureCall {
    type Outcome = CaptureCallOutcome;
    fn reference(&self) -> &str {
        match self {
            Self::OneStep(r) => &r.reference,
            Self::OfAuthorization(r) => &r.reference,
        }
    }
    fn order_id(&self) -> Option<i64> {
        match self {
            Self::OneStep(r) => Some(r.order_id),
            Self::OfAuthorization(_) => None,
        }
    }
    fn book(
        self,
        book: &mut Book,
        plan: &Plan,
        traceparent: Option<String>,
    ) -> Recorded<CaptureCallOutcome> {
        match self {
            Self::OneStep(request) => {
                let moved = plan.fault.captures(&request);
                book.capture(request, plan.decline, moved, traceparent)
                    .map(CaptureCallOutcome::OneStep)
            }
            Self::OfAuthorization(request) => {
                if plan.fault == Fault::RefusePaid {
                    if let Some(AuthorizationCaptureOutcome::Captured { reference, .. }) =
                        book.authorization_capture_outcome(&request.reference)
                    {
                        return Recorded::Outcome(CaptureCallOutcome::OfAuthorization(
                            AuthorizationCaptureOutcome::Refused {
                                reference,
                                reason: refusal::EXCEEDS_AUTHORIZATION.to_owned(),
                            },
                        ));
                    }
                }
                let moved = plan.fault.captures_of_authorization(&request);
                let lenient = plan.fault == Fault::LenientCaptures;
                book.capture_authorization(request, moved, lenient, traceparent)
                    .map(CaptureCallOutcome::OfAuthorization)
            }
        }
    }
    fn find(book: &Book, reference: &str) -> Option<CaptureCallOutcome> {
        book.outcome(reference)
            .map(CaptureCallOutcome::OneStep)
            .or_else(|| {
                book.authorization_capture_outcome(reference)
                    .map(CaptureCallOutcome::OfAuthorization)
            })
    }
    fn post_status(outcome: &CaptureCallOutcome) -> StatusCode {
        match outcome {
            CaptureCallOutcome::OneStep(CaptureOutcome::Captured { .. })
            | CaptureCallOutcome::OfAuthorization(AuthorizationCaptureOutcome::Captured {
                ..
            }) => StatusCode::CREATED,
            CaptureCallOutcome::OneStep(CaptureOutcome::Declined { .. }) => {
                StatusCode::PAYMENT_REQUIRED
            }
            CaptureCallOutcome::OfAuthorization(AuthorizationCaptureOutcome::Refused {
                ..
            }) => StatusCode::UNPROCESSABLE_ENTITY,
        }
    }
}

impl Booking for AuthorizationRequest {
    type Outcome = AuthorizationOutcome;
    fn reference(&self) -> &str {
        &self.reference
    }
    fn order_id(&self) -> Option<i64> {
        Some(self.order_id)
    }
    fn book(
        self,
        book: &mut Book,
        plan: &Plan,
        traceparent: Option<String>,
    ) -> Recorded<AuthorizationOutcome> {
        let held = plan.fault.authorizes(&self);
        book.authorize(self, plan.decline, held, traceparent)
    }
    fn find(book: &Book, reference: &str) -> Option<AuthorizationOutcome> {
        book.authorization_outcome(reference)
    }
    fn post_status(outcome: &AuthorizationOutcome) -> StatusCode {
        match outcome {
            AuthorizationOutcome::Authorized { .. } => StatusCode::CREATED,
            AuthorizationOutcome::Declined { .. } => StatusCode::PAYMENT_REQUIRED,
            AuthorizationOutcome::Refused { .. } => StatusCode::UNPROCESSABLE_ENTITY,
        }
    }
}

impl Booking for VoidRequest {
    type Outcome = VoidOutcome;
    fn reference(&self) -> &str {
        &self.reference
    }
    /// A void names no amount, currency or order: the lies leave it as
    /// asked, and it is never declined.
    fn book(
        self,
        book: &mut Book,
        plan: &Plan,
        traceparent: Option<String>,
    ) -> Recorded<VoidOutcome> {
        if plan.fault == Fault::RefusePaid {
            if let Some(VoidOutcome::Voided { reference, .. }) = book.void_outcome(&self.reference)
            {
                return Recorded::Outcome(VoidOutcome::Refused {
                    reference,
                    reason: refusal::AUTHORIZATION_VOIDED.to_owned(),
                });
            }
        }
        book.void(self, traceparent)
    }
    fn find(book: &Book, reference: &str) -> Option<VoidOutcome> {
        book.void_outcome(reference)
    }
    fn post_status(outcome: &VoidOutcome) -> StatusCode {
        match outcome {
            VoidOutcome::Voided { .. } => StatusCode::CREATED,
            VoidOutcome::Refused { .. } => StatusCode::UNPROCESSABLE_ENTITY,
        }
    }
}

impl Booking for RefundRequest {
    type Outcome = RefundOutcome;
    fn reference(&self) -> &str {
        &self.reference
    }
    fn book(
        self,
        book: &mut Book,
        plan: &Plan,
        traceparent: Option<String>,
    ) -> Recorded<RefundOutcome> {
        if plan.fault == Fault::RefusePaid {
            if let Some(RefundOutcome::Refunded { reference, .. }) =
                book.refund_outcome(&self.reference)
            {
                return Recorded::Outcome(RefundOutcome::Refused {
                    reference,
                    reason: refusal::EXCEEDS_CAPTURE.to_owned(),
                });
            }
        }
        let moved = plan.fault.refunds(&self);
        let lenient = plan.fault == Fault::LenientRefunds;
        book.refund(self, moved, lenient, traceparent)
    }
    fn find(book: &Book, reference: &str) -> Option<RefundOutcome> {
        book.refund_outcome(reference)
    }
    fn post_status(outcome: &RefundOutcome) -> StatusCode {
        match outcome {
            RefundOutcome::Refunded { .. } => StatusCode::CREATED,
            RefundOutcome::Refused { .. } => StatusCode::UNPROCESSABLE_ENTITY,
        }
    }
}

async fn book_call<B: Booking>(
    State(sim): State<Sim>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request: B = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("bad request: {e}")).into_response(),
    };
    let _timer = sim
        .watch
        .clone()
        .zip(request.order_id())
        .map(|(watch, order_id)| Timer {
            watch,
            order_id,
            since: Instant::now(),
        });
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok());
    let traceparent = headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if key != Some(request.reference()) {
        return (
            StatusCode::BAD_REQUEST,
            "the Idempotency-Key header must equal the reference",
        )
            .into_response();
    }
    let Some(in_flight) = InFlight::enter(&sim.in_flight, request.reference()) else {
        return (
            StatusCode::CONFLICT,
            "a POST for this reference is still being processed",
        )
            .into_response();
    };
    // The call runs to the end even if the caller hangs up meanwhile, and
    // the reference stays in flight until its answer is ready.
    let work = tokio::spawn(async move {
        let _in_flight = in_flight;
        let plan = sim.lock_faults().take();
        if let (true, Some(watch)) = (plan.random_fault, &sim.watch) {
            watch.0.random_faults.fetch_add(1, Ordering::Relaxed);
        }
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
            | Fault::WrongOrder
            | Fault::RefusePaid
            | Fault::LenientRefunds
            | Fault::LenientCaptures => {
                match request.book(&mut sim.lock_book(), &plan, traceparent) {
                    Recorded::Mismatch => Answer::Mismatch,
                    Recorded::Outcome(outcome) => Answer::Outcome(
                        B::post_status(&outcome),
                        serde_json::to_vec(&outcome).unwrap_or_default(),
                        plan.fault,
                    ),
                }
            }
        };
        if let Answer::Outcome(_, _, Fault::Hang) = answer {
            tokio::time::sleep(plan.hang).await;
        }
        answer
    });
    match work.await {
        Ok(answer) => answer.into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// What a call that POSTs comes to, decided on the call's own task.
enum Answer {
    ErrorBefore,
    /// A scripted status, with its `Retry-After` seconds.
    Status(u16, Option<u64>),
    Mismatch,
    /// The reference's outcome (its POST status and JSON body), and the
    /// fault that shapes its delivery.
    Outcome(StatusCode, Vec<u8>, Fault),
}

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        match self {
            Self::ErrorBefore => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "injected: error before the call",
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
                "the reference is known with other parameters",
            )
                .into_response(),
            Self::Outcome(_, _, Fault::ErrorAfter) => {
                (StatusCode::BAD_GATEWAY, "injected: error after the call").into_response()
            }
            Self::Outcome(_, _, Fault::DropAfter) => dropped_connection(),
            Self::Outcome(status, body, _) => json_response(status, body),
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

async fn lookup<B: Booking>(State(sim): State<Sim>, Path(reference): Path<String>) -> Response {
    match B::find(&sim.lock_book(), &reference) {
        Some(outcome) => json_response(
            StatusCode::OK,
            serde_json::to_vec(&outcome).unwrap_or_default(),
        ),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn get_faults(State(sim): State<Sim>) -> Json<Faults> {
    Json(sim.lock_faults().clone())
}

async fn put_faults(State(sim): State<Sim>, Json(faults): Json<Faults>) -> Response {
    if let Err(e) = faults.check() {
        return (StatusCode::UNPROCESSABLE_ENTITY, e).into_response();
    }
    *sim.lock_faults() = faults.clone();
    Json(faults).into_response()
}

async fn ledger(State(sim): State<Sim>) -> Json<Ledger> {
    Json(sim.lock_book().ledger())
}

fn json_response(status: StatusCode, body: Vec<u8>) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
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

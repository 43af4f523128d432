//! The HTTP layer: routes, middleware and the server loop.
//!
//! Handlers parse and map; the idempotency engine decides. Every error leaves
//! as problem+json, including the framework's own (unknown route, wrong
//! method, timeouts, panics, load shedding), through [`problemize`]. The
//! limits a hostile client meets (head deadline, requests in flight) are the
//! server loop's, in [`server`].

mod auth;
mod charges;
mod console;
mod error;
mod keys;
mod openapi;
mod ops;
mod refunds;
mod schemas;
mod server;
mod steps;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{self as http, header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{BoxError, Router};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::limit::GlobalConcurrencyLimitLayer;
use tower::load_shed::LoadShedLayer;
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::classify::ServerErrorsFailureClass;
use tower_http::request_id::{
    MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::{DefaultOnResponse, OnResponse, TraceLayer};

pub use auth::SecretCache;
pub use console::serve_console;
pub use error::ApiError;
pub use openapi::document_json as openapi_json;
pub use server::{run as run_server, Limits, Tls, HEADER_READ_TIMEOUT, MAX_IN_FLIGHT, MAX_WAITERS};

use idem_core::idempotency::Engine;
use idem_core::problem::{Problem, ProblemKind, PROBLEM_JSON};
use idem_core::store::{Store, STORE_BOUND};

/// The largest request body accepted: a charge request is well under 1 KiB,
/// so 16 KiB leaves room for any description and refuses junk early.
pub const BODY_LIMIT: usize = 16 * 1024;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    /// Charges: claim, call, finalize, replay.
    pub engine: Engine,
    /// What is not the engine's: key lookups, readiness, secrets.
    pub store: Store,
    pub merchants: SecretCache,
    /// Charge attempts in progress, awaited on shutdown so none is cut short.
    pub tasks: TaskTracker,
    /// Room for requests waiting on a duplicate's outcome (`Prefer: wait`);
    /// [`router_with`] sizes it from its limits.
    pub waiters: Arc<tokio::sync::Semaphore>,
}

impl AppState {
    pub fn new(engine: Engine, store: Store) -> Self {
        idem_core::metrics::handle();
        Self {
            engine,
            store,
            merchants: SecretCache::default(),
            tasks: TaskTracker::new(),
            waiters: Arc::new(tokio::sync::Semaphore::new(MAX_WAITERS)),
        }
    }
}

/// The routes and middleware under `limits`, with `GET /metrics` unless it is
/// served on a listener of its own ([`serve_ops`]).
pub fn router_with(mut state: AppState, limits: &Limits, with_metrics: bool) -> Router {
    let request_timeout = limits.request_timeout;
    state.waiters = Arc::new(tokio::sync::Semaphore::new(limits.max_waiters));
    // `LoadShed` answers at once when the limit has no permit left, instead
    // of waiting for one; its error becomes the 503. A *global* limit: a
    // route layer is applied once per route and method, so a plain
    // `ConcurrencyLimit` would give each of them a cap of its own.
    let shed = ServiceBuilder::new()
        .layer(HandleErrorLayer::new(|_: BoxError| async {
            ApiError::Overloaded
        }))
        .layer(LoadShedLayer::new())
        .layer(GlobalConcurrencyLimitLayer::new(limits.max_in_flight));
    let api = Router::new()
        .route("/v1/charges", post(charges::create))
        .route("/v1/charges/{id}", get(charges::get))
        .route(
            "/v1/charges/{id}/refunds",
            post(refunds::create).get(refunds::list),
        )
        .route("/v1/refunds/{id}", get(refunds::get))
        .route(
            "/v1/charges/{id}/captures",
            post(steps::capture).get(steps::list),
        )
        .route("/v1/charges/{id}/void", post(steps::void))
        .route("/v1/captures/{id}", get(steps::get_capture))
        .route("/v1/voids/{id}", get(steps::get_void))
        .route("/v1/idempotency-keys/{key}", get(keys::get))
        .route_layer(shed);
    let mut ops = Router::new()
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/openapi.json", get(openapi::openapi_json));
    if with_metrics {
        ops = ops.route("/metrics", get(ops::metrics));
    }
    let request_id =
        HeaderName::from_bytes(schemas::REQUEST_ID.as_bytes()).expect("a valid header name");
    let span_header = request_id.clone();
    let access_line = DefaultOnResponse::new().level(tracing::Level::INFO);
    let middleware = ServiceBuilder::new()
        .layer(SetRequestIdLayer::new(
            request_id.clone(),
            RequestIds::new(),
        ))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(move |request: &Request| request_span(request, &span_header))
                .on_response(
                    move |response: &Response, latency: Duration, span: &tracing::Span| {
                        if idem_core::trace::is_on() {
                            let status = response.status();
                            span.record("http.response.status_code", i64::from(status.as_u16()));
                            if status.is_server_error() {
                                span.record("otel.status_code", "ERROR");
                            }
                        }
                        access_line.clone().on_response(response, latency, span);
                    },
                )
                // A 5xx is a failure to tower-http, logged at ERROR; here most
                // are answers by design (an unknown outcome, the database
                // away), which the access line and the problems' counter
                // carry. A bug is logged where it happens, with its cause
                // (`ApiError::Internal`, the panic handler below); what is left
                // for this hook is a response that failed outright.
                .on_failure(
                    |class: ServerErrorsFailureClass, latency: Duration, _span: &tracing::Span| {
                        if let ServerErrorsFailureClass::Error(error) = class {
                            tracing::warn!(%error, ?latency, "response failed");
                        }
                    },
                ),
        )
        .layer(PropagateRequestIdLayer::new(request_id))
        .layer(axum::middleware::map_response(problemize))
        .layer(CatchPanicLayer::custom(|_| {
            tracing::error!("handler panicked");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::GATEWAY_TIMEOUT,
            request_timeout,
        ))
        .layer(DefaultBodyLimit::max(BODY_LIMIT));

    register_http_series(|route| with_metrics || route != "/metrics");
    api.merge(ops)
        .route_layer(axum::middleware::from_fn(count_requests))
        .with_state(state)
        .layer(middleware)
}

/// A request's span: its fields are in every log line written for it. With
/// tracing on, it is also the trace's server span (OpenTelemetry's HTTP
/// conventions), the child of the client's `traceparent` if it sent one.
fn request_span(request: &Request, request_id_header: &HeaderName) -> tracing::Span {
    let request_id = request
        .headers()
        .get(request_id_header)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let (method, path) = (request.method(), request.uri().path());
    if !idem_core::trace::is_on() {
        return tracing::info_span!("request", %method, %path, request_id,
            merchant = tracing::field::Empty, idempotency_key = tracing::field::Empty,
            charge_id = tracing::field::Empty, refund_id = tracing::field::Empty);
    }
    // Routed already (the middleware is the router's layer): the route, not
    // the path, names the span, so that a charge id does not make a name.
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or("", |m| m.as_str());
    let name = if route.is_empty() {
        method.to_string()
    } else {
        format!("{method} {route}")
    };
    let span = tracing::info_span!("request", %method, %path, request_id,
        merchant = tracing::field::Empty, idempotency_key = tracing::field::Empty,
        charge_id = tracing::field::Empty, refund_id = tracing::field::Empty,
        otel.name = name, otel.kind = "server",
        http.request.method = %method, url.path = %path, http.route = route,
        http.response.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty);
    idem_core::trace::continue_from(&span, &idem_core::trace::HeaderExtractor(request.headers()));
    span
}

/// Only the operational routes (`/healthz`, `/readyz`, `/metrics`): what a
/// process without the API (`idem consume`) offers its operators.
pub fn ops_router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .with_state(state)
}

/// How long a request may take before it is answered `504`, for an acquirer
/// timeout: a backstop that no working path reaches. Each step of a charge has
/// its own bound (the acquirer call its timeout, each store operation
/// [`STORE_BOUND`], past which it is a `503`), and a charge makes at most
/// three store operations around the call (the claim, a take-over, the
/// finalize or release; a read of the merchant or the record after).
pub fn request_timeout(acquirer_timeout: Duration) -> Duration {
    acquirer_timeout + 3 * STORE_BOUND
}

/// Serves on an already-bound listener until `shutdown` fires, then finishes
/// the requests and charge attempts in flight.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    request_timeout: Duration,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    serve_with(
        listener,
        state,
        Limits::new(request_timeout),
        true,
        shutdown,
    )
    .await
}

/// [`serve`] under `limits`; without `GET /metrics` when `with_metrics` is
/// false (it is then on a listener of its own, through [`serve_ops`]).
pub async fn serve_with(
    listener: TcpListener,
    state: AppState,
    limits: Limits,
    with_metrics: bool,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let tasks = state.tasks.clone();
    let app = router_with(state, &limits, with_metrics);
    server::run(listener, app, limits.header_read_timeout, None, shutdown).await;
    tasks.close();
    tasks.wait().await;
    Ok(())
}

/// Serves [`ops_router`] (`/healthz`, `/readyz`, `/metrics`) on its own
/// listener until `shutdown` fires: `--metrics-listen`.
pub async fn serve_ops(listener: TcpListener, state: AppState, shutdown: CancellationToken) {
    server::run(
        listener,
        ops_router(state),
        HEADER_READ_TIMEOUT,
        None,
        shutdown,
    )
    .await;
}

/// Request ids for requests that come without one: this process's random
/// prefix and a counter (`q3Fz9aK0cT1x-42`). Unique across instances and
/// restarts like a UUID, in practice, without asking the kernel for random
/// bytes on every request.
#[derive(Clone)]
struct RequestIds {
    prefix: Arc<str>,
    next: Arc<AtomicU64>,
}

impl RequestIds {
    fn new() -> Self {
        use rand::distr::{Alphanumeric, SampleString};
        Self {
            prefix: Alphanumeric.sample_string(&mut rand::rng(), 12).into(),
            next: Arc::default(),
        }
    }
}

impl MakeRequestId for RequestIds {
    fn make_request_id<B>(&mut self, _: &http::Request<B>) -> Option<RequestId> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        HeaderValue::try_from(format!("{}-{n}", self.prefix))
            .ok()
            .map(RequestId::new)
    }
}

/// Makes the HTTP counters exist at 0 (see `idem_core::metrics`): a problem
/// counter per problem type, and a request counter per documented route that
/// `serves` (by route template) and status it may answer, so that a rule's
/// denominator exists before the first request too.
fn register_http_series(serves: impl Fn(&str) -> bool) {
    for kind in ProblemKind::ALL {
        idem_core::metrics::register(
            idem_core::metrics::HTTP_PROBLEMS,
            &[("type", kind.slug().to_owned())],
        );
    }
    for (route, method, statuses) in openapi::answers() {
        if !serves(&route) {
            continue;
        }
        for status in statuses {
            idem_core::metrics::register(
                idem_core::metrics::HTTP_REQUESTS,
                &[
                    ("route", route.clone()),
                    ("method", method.clone()),
                    ("status", status.to_string()),
                ],
            );
        }
    }
}

/// Counts every routed request by its route template, method and status.
async fn count_requests(request: Request, next: axum::middleware::Next) -> Response {
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    let method = request.method().to_string();
    let response = next.run(request).await;
    metrics::counter!(idem_core::metrics::HTTP_REQUESTS, "route" => route, "method" => method,
        "status" => response.status().as_u16().to_string())
    .increment(1);
    response
}

/// Turns any error response that is not already problem+json (the framework's
/// 404/405, a timeout, a caught panic) into one, so clients see one error shape.
async fn problemize<B>(response: axum::http::Response<B>) -> Response
where
    B: http_body::Body<Data = axum::body::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    let response = response.map(axum::body::Body::new);
    let status = response.status();
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(PROBLEM_JSON.as_bytes()));
    if !(status.is_client_error() || status.is_server_error()) || is_problem {
        return response;
    }
    let kind = ProblemKind::for_status(status.as_u16());
    // Counted here as `ApiError`s count themselves: a timeout's 504 and a
    // panic's 500 come only this way, and an alert watches them.
    metrics::counter!(idem_core::metrics::HTTP_PROBLEMS, "type" => kind.slug()).increment(1);
    let mut problem = Problem::new(kind, kind.title());
    problem.status = status.as_u16();
    let mut out = error::problem_response(&problem);
    *out.status_mut() = status;
    // Keep headers such as Allow on a 405.
    for (name, value) in response.headers() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            out.headers_mut().insert(name.clone(), value.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems_counted(kind: &str) -> u64 {
        let rendered = idem_core::metrics::handle().expect("recorder").render();
        let series = format!("{}{{type=\"{kind}\"}} ", idem_core::metrics::HTTP_PROBLEMS);
        rendered
            .lines()
            .find_map(|l| l.strip_prefix(&series))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The timeout layer's 504 and a caught panic's 500 become problems here,
    /// not in `ApiError`: the server-error alert must see them too.
    #[tokio::test]
    async fn a_timeout_and_a_panic_are_counted_as_problems() {
        let before = (problems_counted("timeout"), problems_counted("internal"));
        for status in [
            StatusCode::GATEWAY_TIMEOUT,
            StatusCode::INTERNAL_SERVER_ERROR,
        ] {
            let answer = problemize(status.into_response()).await;
            assert_eq!(answer.status(), status);
        }
        assert!(problems_counted("timeout") > before.0);
        assert!(problems_counted("internal") > before.1);
    }
}

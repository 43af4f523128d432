//! Operational endpoints: liveness, readiness and metrics.

use std::time::Duration;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use super::schemas::RetryAfter;
use super::{ApiError, AppState};
use idem_core::problem::{Problem, PROBLEM_JSON};

/// Readiness must answer quickly even when the database hangs, so a load
/// balancer can take the instance out instead of queueing behind it.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// The body of `/healthz` and `/readyz`.
#[derive(Serialize, ToSchema)]
pub struct Health {
    /// `ok` from `/healthz`, `ready` from `/readyz`.
    #[schema(value_type = String)]
    status: &'static str,
}

/// The process is up and serving.
#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "healthz",
    tag = "operations",
    responses((status = OK, description = "Up: `{\"status\":\"ok\"}`.", body = Health,
        content_type = "application/json")),
)]
pub async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// The database answers and, as far as the last writes found, can write.
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    tag = "operations",
    responses(
        (status = OK, description = "Ready: `{\"status\":\"ready\"}`.", body = Health,
            content_type = "application/json"),
        (status = INTERNAL_SERVER_ERROR, description = "`internal`: the database answered with an error.",
            body = Problem, content_type = PROBLEM_JSON),
        (status = SERVICE_UNAVAILABLE, description = "`service-unavailable`: the database cannot be \
            reached, or did not answer within 2 s. `store-unwritable`: the last write failed because \
            the database cannot write (a full disk, read-only), and no write since has succeeded \
            (while so, a check probes with one small write at most once a second).",
            body = Problem, content_type = PROBLEM_JSON,
            headers(("Retry-After" = inline(RetryAfter), description = "Seconds to wait before asking again."))),
    ),
)]
pub async fn readyz(State(state): State<AppState>) -> Result<Json<Health>, ApiError> {
    match tokio::time::timeout(READY_TIMEOUT, state.store.ready()).await {
        Ok(Ok(())) => Ok(Json(Health { status: "ready" })),
        Ok(Err(e)) => Err(e.into()),
        Err(_) => Err(ApiError::Unavailable),
    }
}

/// Prometheus metrics, in the text exposition format.
///
/// The database gauges are read at scrape time. docs/operations.md lists every metric.
/// Served here unless the instance runs with `--metrics-listen ADDR`: then only on
/// that address (with `/healthz` and `/readyz`), and this port answers `404`.
#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    tag = "operations",
    responses((status = OK, description = "The metrics.", body = String,
        content_type = "text/plain; version=0.0.4")),
)]
pub async fn metrics(State(state): State<AppState>) -> Response {
    use idem_core::metrics as m;
    let store = &state.store;
    if let Ok(Ok(stats)) = tokio::time::timeout(READY_TIMEOUT, store.processing_stats()).await {
        metrics::gauge!(m::OLDEST_PROCESSING).set(stats.oldest_processing_seconds);
        metrics::gauge!(m::AWAITING_REVIEW).set(stats.awaiting_review as f64);
        metrics::gauge!(m::REFUNDS_AWAITING_REVIEW).set(stats.refunds_awaiting_review as f64);
        metrics::gauge!(m::STEPS_AWAITING_REVIEW).set(stats.steps_awaiting_review as f64);
    }
    if let Ok(Ok((pending, oldest))) =
        tokio::time::timeout(READY_TIMEOUT, store.outbox_backlog()).await
    {
        metrics::gauge!(m::OUTBOX_PENDING).set(pending as f64);
        metrics::gauge!(m::OUTBOX_OLDEST).set(oldest);
    }
    if let Ok(Ok((pending, oldest))) =
        tokio::time::timeout(READY_TIMEOUT, store.webhook_backlog()).await
    {
        metrics::gauge!(m::WEBHOOK_PENDING).set(pending as f64);
        metrics::gauge!(m::WEBHOOK_OLDEST_PENDING).set(oldest);
    }
    let pool = store.pool_stats();
    let idle = pool.idle as f64;
    metrics::gauge!(m::POOL_CONNECTIONS, "state" => "idle").set(idle);
    metrics::gauge!(m::POOL_CONNECTIONS, "state" => "in_use").set(f64::from(pool.size) - idle);
    let body = m::handle().map(|h| h.render()).unwrap_or_default();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

//! Operational endpoints: liveness, readiness and metrics.

use std::time::Duration;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::{ApiError, AppState};

/// Readiness must answer quickly even when the database hangs, so a load
/// balancer can take the instance out instead of queueing behind it.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// `GET /healthz`: the process is up and serving.
pub async fn healthz() -> Response {
    json_ok(r#"{"status":"ok"}"#)
}

/// `GET /readyz`: the database answers.
pub async fn readyz(State(state): State<AppState>) -> Result<Response, ApiError> {
    match tokio::time::timeout(READY_TIMEOUT, state.engine.store().ping()).await {
        Ok(Ok(())) => Ok(json_ok(r#"{"status":"ready"}"#)),
        Ok(Err(e)) => Err(e.into()),
        Err(_) => Err(ApiError::Unavailable),
    }
}

/// `GET /metrics`: Prometheus text. The database gauges are read now.
pub async fn metrics(State(state): State<AppState>) -> Response {
    use crate::metrics as m;
    let store = state.engine.store();
    if let Ok(Ok(stats)) = tokio::time::timeout(READY_TIMEOUT, store.processing_stats()).await {
        metrics::gauge!(m::OLDEST_PROCESSING).set(stats.oldest_processing_seconds);
        metrics::gauge!(m::AWAITING_REVIEW).set(stats.awaiting_review as f64);
    }
    if let Ok(Ok((pending, oldest))) =
        tokio::time::timeout(READY_TIMEOUT, store.outbox_backlog()).await
    {
        metrics::gauge!(m::OUTBOX_PENDING).set(pending as f64);
        metrics::gauge!(m::OUTBOX_OLDEST).set(oldest);
    }
    let pool = store.pool();
    let idle = pool.num_idle() as f64;
    metrics::gauge!(m::POOL_CONNECTIONS, "state" => "idle").set(idle);
    metrics::gauge!(m::POOL_CONNECTIONS, "state" => "in_use").set(f64::from(pool.size()) - idle);
    let body = m::handle().map(|h| h.render()).unwrap_or_default();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

fn json_ok(body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

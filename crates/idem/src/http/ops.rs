//! Operational endpoints: liveness and readiness.

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

fn json_ok(body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

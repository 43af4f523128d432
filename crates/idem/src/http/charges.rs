//! `POST /v1/charges` and `GET /v1/charges/{id}`.
//!
//! The handler only parses: everything that can be refused is refused here,
//! before the key is claimed, so a bad request stores nothing and its key can be
//! used again with a corrected body. The engine then runs on its own task, so a
//! client that hangs up mid-call (the article's timeout) cannot cut the attempt
//! short between claim and finalize.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use tracing::Instrument;

use super::auth::Authenticated;
use super::{ApiError, AppState, BODY_LIMIT};
use crate::domain::{ChargeId, ChargeRequest};
use crate::idempotency::{IdempotencyKey, KeyError, Outcome};
use crate::problem::PROBLEM_JSON;

pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

pub async fn create(
    State(state): State<AppState>,
    Authenticated(merchant): Authenticated,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    if !is_json(&headers) {
        return Err(ApiError::UnsupportedMediaType);
    }
    let key = idempotency_key(&headers)?;
    tracing::Span::current().record("idempotency_key", key.as_str());
    let body = body.map_err(|e| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::BodyTooLarge(BODY_LIMIT),
        _ => ApiError::Internal(format!("reading the body: {e}")),
    })?;
    let request = ChargeRequest::from_json(&body).map_err(ApiError::InvalidBody)?;

    let engine = state.engine.clone();
    // The request's span goes along, so the engine's log lines carry its fields.
    let task = state.tasks.spawn(
        async move { engine.submit(&merchant, &key, &request).await }
            .instrument(tracing::Span::current()),
    );
    let outcome = task
        .await
        .map_err(|e| ApiError::Internal(format!("charge task failed: {e}")))??;

    metrics::counter!(crate::metrics::CHARGE_OUTCOMES, "outcome" => outcome.label()).increment(1);
    match outcome {
        Outcome::Completed {
            charge_id,
            response,
            replayed,
        } => {
            tracing::Span::current().record("charge_id", charge_id.as_str());
            let status = StatusCode::from_u16(response.status)
                .map_err(|_| ApiError::Internal(format!("stored status {}", response.status)))?;
            let content_type = if status.is_success() {
                "application/json"
            } else {
                PROBLEM_JSON
            };
            let mut r = (
                status,
                [(header::CONTENT_TYPE, content_type)],
                response.body,
            )
                .into_response();
            if status == StatusCode::CREATED {
                if let Ok(location) = HeaderValue::try_from(format!("/v1/charges/{charge_id}")) {
                    r.headers_mut().insert(header::LOCATION, location);
                }
            }
            if replayed {
                r.headers_mut()
                    .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
            }
            Ok(r)
        }
        Outcome::InFlight { retry_after, .. } => Err(ApiError::InFlight { retry_after }),
        Outcome::Mismatch { fields } => Err(ApiError::KeyReused(fields)),
        Outcome::Unknown {
            charge_id,
            retry_after,
        } => {
            tracing::Span::current().record("charge_id", charge_id.as_str());
            Err(ApiError::OutcomeUnknown {
                charge_id,
                retry_after,
            })
        }
    }
}

pub async fn get(
    State(state): State<AppState>,
    Authenticated(merchant): Authenticated,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = ChargeId::parse(&id).ok_or(ApiError::NotFound)?;
    let charge = state
        .engine
        .store()
        .charge(merchant.id, &id)
        .await?
        .ok_or(ApiError::NotFound)?;
    tracing::Span::current().record("charge_id", id.as_str());
    let body = serde_json::to_vec(&charge).map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// `application/json`, with or without parameters such as `charset=utf-8`.
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"))
}

fn idempotency_key(headers: &HeaderMap) -> Result<IdempotencyKey, ApiError> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let value = values.next().ok_or(ApiError::MissingKey)?;
    if values.next().is_some() {
        return Err(ApiError::MalformedKey(KeyError::Repeated));
    }
    IdempotencyKey::parse(value.as_bytes()).map_err(ApiError::MalformedKey)
}

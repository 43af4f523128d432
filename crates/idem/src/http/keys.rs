//! `GET /v1/idempotency-keys/{key}`: the state of a key, without sending the
//! request again (issue 13, part 4).

use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use super::auth::Authenticated;
use super::error::ApiError;
use super::schemas::RetryAfter;
use super::AppState;
use idem_core::domain::{IdempotencyKey, StepKind, SubjectId};
use idem_core::problem::{self, Problem, PROBLEM_JSON};
use idem_core::store::KeyStatus;

/// What a key stands for now.
#[derive(Debug, Serialize, ToSchema)]
#[schema(
    description = "The state of an Idempotency-Key. Fields that do not apply to the \
    state are absent."
)]
pub struct KeyState {
    /// The key, as stored (unquoted).
    pub key: String,
    /// `in_flight`: an attempt holds it; ask again after `retry_after_seconds`.
    /// `completed`: its outcome is stored and replayed to the same request.
    /// `expired`: its time to live is over, and a late retry of the same
    /// request is answered `410 key-expired`.
    #[schema(pattern = "^(in_flight|completed|expired)$")]
    pub state: &'static str,
    /// The charge the key made (a charge's key only).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub charge_id: Option<String>,
    /// The refund the key made (a refund's key only).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub refund_id: Option<String>,
    /// The capture the key made (a capture's key only).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub capture_id: Option<String>,
    /// The void the key made (a void's key only).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub void_id: Option<String>,
    /// `completed`: the status of the stored outcome (201, 402, 502).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// `in_flight`: seconds to wait before asking again (at least 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<u64>,
    /// `completed`: when the key expires. `expired`: when its tombstone goes
    /// (absent while the expired record is not yet swept). Absent while in
    /// flight: a key never expires before its outcome is stored.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String, format = DateTime)]
    pub expires_at: Option<String>,
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// The state of an Idempotency-Key of the calling merchant.
#[utoipa::path(
    get,
    path = "/v1/idempotency-keys/{key}",
    operation_id = "getIdempotencyKey",
    tag = "charges",
    security(("bearer" = [])),
    params(("key" = String, Path, description = "The key as sent in `Idempotency-Key` (either \
        form; the structured-field quotes may be left out), URL-encoded.")),
    responses(
        (status = OK, description = "The key's state.", body = KeyState, content_type = "application/json"),
        (status = BAD_REQUEST, description = "`malformed-idempotency-key`: not a key idem would \
            accept. Or `invalid-body`: not UTF-8 once percent-decoded.", body = Problem,
            content_type = PROBLEM_JSON),
        (status = UNAUTHORIZED, description = "`unauthorized`: no `Authorization: Bearer` secret, \
            or not a merchant's.", body = Problem, content_type = PROBLEM_JSON,
            headers(("WWW-Authenticate" = String, description = "`Bearer`."))),
        (status = NOT_FOUND, description = "`not-found`: the merchant has no such key, nor a \
            tombstone of one.", body = Problem, content_type = PROBLEM_JSON),
        (status = INTERNAL_SERVER_ERROR, description = "`internal`: a bug.", body = Problem,
            content_type = PROBLEM_JSON),
        (status = SERVICE_UNAVAILABLE, description = "`service-unavailable` or `overloaded`.",
            body = Problem, content_type = PROBLEM_JSON,
            headers(("Retry-After" = inline(RetryAfter), description = "Seconds to wait before retrying."))),
        (status = GATEWAY_TIMEOUT, description = "`timeout`: the database did not answer in time.",
            body = Problem, content_type = PROBLEM_JSON),
    ),
)]
pub async fn get(
    State(state): State<AppState>,
    Authenticated(merchant): Authenticated,
    Path(raw): Path<String>,
) -> Result<Response, ApiError> {
    let key = IdempotencyKey::parse(raw.as_bytes()).map_err(ApiError::MalformedKey)?;
    let status = state
        .store
        .key_status(merchant.id, &key)
        .await?
        .ok_or(ApiError::NotFound)?;
    let key = key.as_str().to_owned();
    let (state, subject, status, retry_after_seconds, expires_at) = match status {
        KeyStatus::InFlight {
            subject,
            lease_remaining,
        } => (
            "in_flight",
            subject,
            None,
            Some(lease_remaining.as_secs_f64().ceil().max(1.0) as u64),
            None,
        ),
        KeyStatus::Completed {
            subject,
            status,
            expires_at,
        } => (
            "completed",
            subject,
            Some(status),
            None,
            Some(rfc3339(expires_at)),
        ),
        KeyStatus::Expired { subject, until } => {
            ("expired", subject, None, None, until.map(rfc3339))
        }
    };
    let (charge_id, refund_id, capture_id, void_id) = match subject {
        SubjectId::Charge(id) => (Some(id.as_str().to_owned()), None, None, None),
        SubjectId::Refund(id) => (None, Some(id.as_str().to_owned()), None, None),
        SubjectId::Step(id) => match id.kind() {
            StepKind::Capture => (None, None, Some(id.as_str().to_owned()), None),
            StepKind::Void => (None, None, None, Some(id.as_str().to_owned())),
        },
    };
    let body = KeyState {
        key,
        state,
        charge_id,
        refund_id,
        capture_id,
        void_id,
        status,
        retry_after_seconds,
        expires_at,
    };
    let body = serde_json::to_vec(&body).map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(([(header::CONTENT_TYPE, problem::JSON)], body).into_response())
}

//! `POST /v1/charges/{id}/refunds`, `GET /v1/charges/{id}/refunds` and
//! `GET /v1/refunds/{id}`.
//!
//! A refund runs under the same engine and the same key rules as a charge
//! (its own `Idempotency-Key`, replayed byte for byte); what is its own is
//! decided by the store in the claim: the refund's amount reserved against
//! the charge by a guarded update, so refunds racing on one charge can never
//! together give back more than it captured.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};

use super::auth::Authenticated;
use super::charges::{key_and_body, run, INTERNAL_DESCRIPTION, UNAUTHORIZED_DESCRIPTION};
use super::schemas::{Replayed, RetryAfter};
use super::{ApiError, AppState};
use idem_core::domain::{ChargeId, IdempotencyKey, Refund, RefundId, RefundIntent, RefundRequest};
use idem_core::problem::{self, Problem, PROBLEM_JSON};

/// Refund a captured charge, once per `Idempotency-Key`.
///
/// The amount (all the charge has left, when absent) is reserved against
/// the charge in the same committed transaction that claims the key, before
/// the acquirer is called: refunds of one charge, however many at once and
/// on whichever instances, never together exceed its capture. A refund the
/// charge cannot give (not captured, awaiting review, more than it has left,
/// no such charge) stores nothing and leaves the key free.
#[utoipa::path(
    post,
    path = "/v1/charges/{id}/refunds",
    operation_id = "createRefund",
    tag = "refunds",
    security(("bearer" = [])),
    params(
        ("id" = inline(ChargeId), Path, description = "The charge to refund."),
        ("Idempotency-Key" = inline(IdempotencyKey), Header,
            description = "One key per refund intent, chosen by the client and sent again, \
                unchanged, on every retry of that refund. The same key space as charges: a key \
                names one operation."),
        ("Prefer" = Option<String>, Header,
            description = "`wait=N`, as for a charge."),
    ),
    request_body(content = RefundRequest, content_type = "application/json"),
    responses(
        (status = CREATED, description = "Refunded: the refund (`status: succeeded`). Stored as \
            the key's outcome.",
            body = Refund, content_type = "application/json",
            headers(
                ("Location" = String, description = "`/v1/refunds/{id}` of the refund."),
                ("Idempotent-Replayed" = inline(Replayed), description = "`true` when this is a stored outcome answered again."),
                ("Idempotency-TTL" = u64, description = "Seconds for which, at least, the key is still honoured."),
                ("Preference-Applied" = String, description = "`wait=N` when the request waited for a duplicate's outcome."),
            )),
        (status = BAD_REQUEST, description = "`missing-idempotency-key`, \
            `malformed-idempotency-key` or `invalid-body` (`field` names the field: an amount \
            that is not a whole number of cents from 1 to 10^10, an unknown reason). Nothing stored.",
            body = Problem, content_type = PROBLEM_JSON),
        (status = UNAUTHORIZED, description = UNAUTHORIZED_DESCRIPTION, body = Problem,
            content_type = PROBLEM_JSON, headers(("WWW-Authenticate" = String, description = "`Bearer`."))),
        (status = NOT_FOUND, description = "`not-found`: no such charge, or another merchant's. \
            Nothing stored.", body = Problem, content_type = PROBLEM_JSON),
        (status = CONFLICT, description = "`request-in-flight`: another attempt with this key is \
            at the acquirer. Nothing stored.", body = Problem, content_type = PROBLEM_JSON,
            headers(("Retry-After" = inline(RetryAfter), description = "A short hint (1 s)."))),
        (status = GONE, description = "`key-expired`: a late retry of a refund whose key \
            expired; `refund_id` names it. Nothing refunded again.",
            body = Problem, content_type = PROBLEM_JSON),
        (status = PAYLOAD_TOO_LARGE, description = "`body-too-large`. Nothing stored.",
            body = Problem, content_type = PROBLEM_JSON),
        (status = UNSUPPORTED_MEDIA_TYPE, description = "`unsupported-media-type`. Nothing stored.",
            body = Problem, content_type = PROBLEM_JSON),
        (status = UNPROCESSABLE_ENTITY, description = "`charge-not-refundable`: the charge is not \
            `captured` (processing, declined, failed) or awaits review. \
            `refund-exceeds-captured`: more than the charge has left to refund \
            (`remaining_cents`; succeeded and pending refunds count). Both store nothing and \
            leave the key free; retrying the same request cannot help until the charge changes. \
            `idempotency-key-reused`: the key was first used with another request (`charge_id` or \
            `refund_id` names what it made; `differing_fields` is `[\"operation\"]` for a key of \
            another operation). `refund-failed`: the acquirer refused the refund for good; \
            `refund` holds it (`status: failed`, `failure_reason`), its amount is the charge's \
            to refund again with a new key. Stored as the key's outcome.",
            body = Problem, content_type = PROBLEM_JSON),
        (status = INTERNAL_SERVER_ERROR, description = INTERNAL_DESCRIPTION, body = Problem,
            content_type = PROBLEM_JSON),
        (status = SERVICE_UNAVAILABLE, description = "`outcome-unknown`: the acquirer gave no \
            answer that is its word; the refund stays `pending` (`refund_id`), its amount \
            reserved; retry with the same key, which cannot refund twice. \
            `refund-under-review`: the acquirer's answer contradicts the refund, or it had none \
            by the settle deadline; a person decides. Or `service-unavailable`, \
            `store-unwritable`, `overloaded`, as for a charge.",
            body = Problem, content_type = PROBLEM_JSON,
            headers(("Retry-After" = inline(RetryAfter), description = "Seconds to wait before retrying."))),
        (status = GATEWAY_TIMEOUT, description = "`timeout`: a backstop no working path reaches.",
            body = Problem, content_type = PROBLEM_JSON),
    ),
)]
pub async fn create(
    State(state): State<AppState>,
    Authenticated(merchant): Authenticated,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let charge_id = ChargeId::parse(&id).ok_or(ApiError::NotFound)?;
    tracing::Span::current().record("charge_id", charge_id.as_str());
    let (key, body) = key_and_body(&headers, body)?;
    let request = RefundRequest::from_json(&body).map_err(ApiError::InvalidBody)?;
    let intent = RefundIntent { charge_id, request };
    run(
        &state,
        merchant,
        key,
        intent,
        &headers,
        idem_core::metrics::REFUND_OUTCOMES,
    )
    .await
}

/// A refund as it is now, also while `pending`.
#[utoipa::path(
    get,
    path = "/v1/refunds/{id}",
    operation_id = "getRefund",
    tag = "refunds",
    security(("bearer" = [])),
    params(("id" = inline(RefundId), Path, description = "The refund's id.")),
    responses(
        (status = OK, description = "The refund.", body = Refund, content_type = "application/json"),
        (status = UNAUTHORIZED, description = UNAUTHORIZED_DESCRIPTION, body = Problem,
            content_type = PROBLEM_JSON, headers(("WWW-Authenticate" = String, description = "`Bearer`."))),
        (status = NOT_FOUND, description = "`not-found`: no such refund, or another merchant's.",
            body = Problem, content_type = PROBLEM_JSON),
        (status = INTERNAL_SERVER_ERROR, description = INTERNAL_DESCRIPTION, body = Problem,
            content_type = PROBLEM_JSON),
        (status = SERVICE_UNAVAILABLE, description = "`service-unavailable` or `overloaded`.",
            body = Problem, content_type = PROBLEM_JSON,
            headers(("Retry-After" = inline(RetryAfter), description = "Seconds to wait before retrying."))),
        (status = GATEWAY_TIMEOUT, description = "`timeout`: a backstop.", body = Problem,
            content_type = PROBLEM_JSON),
    ),
)]
pub async fn get(
    State(state): State<AppState>,
    Authenticated(merchant): Authenticated,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = RefundId::parse(&id).ok_or(ApiError::NotFound)?;
    tracing::Span::current().record("refund_id", id.as_str());
    let refund = state
        .store
        .refund(merchant.id, &id)
        .await?
        .ok_or(ApiError::NotFound)?;
    json(&refund)
}

/// A charge's refunds, oldest first.
#[utoipa::path(
    get,
    path = "/v1/charges/{id}/refunds",
    operation_id = "listRefunds",
    tag = "refunds",
    security(("bearer" = [])),
    params(("id" = inline(ChargeId), Path, description = "The charge.")),
    responses(
        (status = OK, description = "The charge's refunds, oldest first (none: `[]`).",
            body = Vec<Refund>, content_type = "application/json"),
        (status = UNAUTHORIZED, description = UNAUTHORIZED_DESCRIPTION, body = Problem,
            content_type = PROBLEM_JSON, headers(("WWW-Authenticate" = String, description = "`Bearer`."))),
        (status = NOT_FOUND, description = "`not-found`: no such charge, or another merchant's.",
            body = Problem, content_type = PROBLEM_JSON),
        (status = INTERNAL_SERVER_ERROR, description = INTERNAL_DESCRIPTION, body = Problem,
            content_type = PROBLEM_JSON),
        (status = SERVICE_UNAVAILABLE, description = "`service-unavailable` or `overloaded`.",
            body = Problem, content_type = PROBLEM_JSON,
            headers(("Retry-After" = inline(RetryAfter), description = "Seconds to wait before retrying."))),
        (status = GATEWAY_TIMEOUT, description = "`timeout`: a backstop.", body = Problem,
            content_type = PROBLEM_JSON),
    ),
)]
pub async fn list(
    State(state): State<AppState>,
    Authenticated(merchant): Authenticated,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = ChargeId::parse(&id).ok_or(ApiError::NotFound)?;
    tracing::Span::current().record("charge_id", id.as_str());
    if state.store.charge(merchant.id, &id).await?.is_none() {
        return Err(ApiError::NotFound);
    }
    let refunds = state.store.refunds_of(merchant.id, &id).await?;
    json(&refunds)
}

pub(super) fn json<T: serde::Serialize>(value: &T) -> Result<Response, ApiError> {
    let body = serde_json::to_vec(value).map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(([(header::CONTENT_TYPE, problem::JSON)], body).into_response())
}

//! The steps of a two-step payment: `POST /v1/charges/{id}/captures`,
//! `POST /v1/charges/{id}/void`, `GET /v1/charges/{id}/captures`,
//! `GET /v1/captures/{id}` and `GET /v1/voids/{id}`.
//!
//! A capture and a void run under the same engine and key rules as a charge
//! and a refund; what is their own is decided by the store in the claim: a
//! capture's amount reserved against the authorization, a void's closing of
//! it, each by a guarded update of the charge's row committed before the
//! acquirer is called, so captures racing on one authorization never take
//! more than it holds, and a void and a capture racing are ordered once.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;

use super::auth::Authenticated;
use super::charges::{key_and_body, run, INTERNAL_DESCRIPTION, UNAUTHORIZED_DESCRIPTION};
use super::refunds::json;
use super::schemas::{Replayed, RetryAfter};
use super::{ApiError, AppState};
use idem_core::domain::{
    parse_void_body, CaptureIntent, CaptureRequest, ChargeId, IdempotencyKey, Step, StepId,
    StepKind, VoidIntent,
};
use idem_core::problem::{Problem, PROBLEM_JSON};

/// Capture part or all of an authorized charge, once per `Idempotency-Key`.
///
/// The amount (all the authorization has left, when absent) is reserved
/// against it in the same committed transaction that claims the key, before
/// the acquirer is called: captures of one authorization, however many at
/// once and on whichever instances, never together exceed it. `final`
/// (the default) closes the authorization and releases what remains;
/// `"final": false` leaves the rest capturable.
#[utoipa::path(
    post,
    path = "/v1/charges/{id}/captures",
    operation_id = "createCapture",
    tag = "two-step",
    security(("bearer" = [])),
    params(
        ("id" = inline(ChargeId), Path, description = "The authorized charge to capture."),
        ("Idempotency-Key" = inline(IdempotencyKey), Header,
            description = "One key per capture intent, sent again unchanged on every retry of \
                it. The same key space as charges and refunds: a key names one operation."),
        ("Prefer" = Option<String>, Header, description = "`wait=N`, as for a charge."),
    ),
    request_body(content = CaptureRequest, content_type = "application/json"),
    responses(
        (status = CREATED, description = "Captured: the capture (`status: succeeded`). Stored \
            as the key's outcome.", body = Step, content_type = "application/json",
            headers(
                ("Location" = String, description = "`/v1/captures/{id}` of the capture."),
                ("Idempotent-Replayed" = inline(Replayed), description = "`true` when this is a stored outcome answered again."),
                ("Idempotency-TTL" = u64, description = "Seconds for which, at least, the key is still honoured."),
            )),
        (status = BAD_REQUEST, description = "`missing-idempotency-key`, \
            `malformed-idempotency-key` or `invalid-body` (`field` names the field). Nothing \
            stored.", body = Problem, content_type = PROBLEM_JSON),
        (status = UNAUTHORIZED, description = UNAUTHORIZED_DESCRIPTION, body = Problem,
            content_type = PROBLEM_JSON, headers(("WWW-Authenticate" = String, description = "`Bearer`."))),
        (status = NOT_FOUND, description = "`not-found`: no such charge, or another merchant's. \
            Nothing stored.", body = Problem, content_type = PROBLEM_JSON),
        (status = CONFLICT, description = "`request-in-flight`: another attempt with this key \
            is at the acquirer. `authorization-closed`: a final capture or a void of this \
            authorization is pending at the acquirer. Nothing stored.", body = Problem,
            content_type = PROBLEM_JSON,
            headers(("Retry-After" = inline(RetryAfter), description = "A short hint (1 s)."))),
        (status = GONE, description = "`key-expired`: a late retry of a capture whose key \
            expired; `capture_id` names it. Nothing captured again.",
            body = Problem, content_type = PROBLEM_JSON),
        (status = UNPROCESSABLE_ENTITY, description = "`charge-not-authorized`: the charge is \
            not an open authorization (captured in one step, captured or voided already, \
            declined, processing, or awaiting review). `capture-exceeds-authorization`: more \
            than the authorization has left (`remaining_cents`; captures made and pending \
            count). Both store nothing and leave the key free. `idempotency-key-reused`: the \
            key was first used with another request. `capture-failed`: the acquirer refused \
            the capture for good; `capture` holds it, its amount is the authorization's again. \
            Stored as the key's outcome.", body = Problem, content_type = PROBLEM_JSON),
        (status = PAYLOAD_TOO_LARGE, description = "`body-too-large`. Nothing stored.",
            body = Problem, content_type = PROBLEM_JSON),
        (status = UNSUPPORTED_MEDIA_TYPE, description = "`unsupported-media-type`. Nothing stored.",
            body = Problem, content_type = PROBLEM_JSON),
        (status = GATEWAY_TIMEOUT, description = "`timeout`: a backstop no working path reaches.",
            body = Problem, content_type = PROBLEM_JSON),
        (status = INTERNAL_SERVER_ERROR, description = INTERNAL_DESCRIPTION, body = Problem,
            content_type = PROBLEM_JSON),
        (status = SERVICE_UNAVAILABLE, description = "`outcome-unknown`: the capture stays \
            `pending` (`capture_id`), its amount reserved; retry with the same key, which cannot \
            capture twice. `step-under-review`: a person decides. Or `service-unavailable`, \
            `store-unwritable`, `overloaded`, as for a charge.",
            body = Problem, content_type = PROBLEM_JSON,
            headers(("Retry-After" = inline(RetryAfter), description = "Seconds to wait before retrying."))),
    ),
)]
pub async fn capture(
    State(state): State<AppState>,
    Authenticated(merchant): Authenticated,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let charge_id = ChargeId::parse(&id).ok_or(ApiError::NotFound)?;
    tracing::Span::current().record("charge_id", charge_id.as_str());
    let (key, body) = key_and_body(&headers, body)?;
    let request = CaptureRequest::from_json(&body).map_err(ApiError::InvalidBody)?;
    let intent = CaptureIntent { charge_id, request };
    run(
        &state,
        merchant,
        key,
        intent,
        &headers,
        idem_core::metrics::CAPTURE_OUTCOMES,
    )
    .await
}

/// Void an authorized charge: release what it still holds, once per
/// `Idempotency-Key`.
///
/// The void closes the authorization in the same committed transaction that
/// claims the key, before the acquirer is called, and only while no capture
/// of it is pending: a void and a capture sent at once are ordered by the
/// database, and the second is refused, whichever it is. A charge with
/// nothing captured becomes `voided`; one partly captured becomes
/// `captured` (what was not captured is released).
#[utoipa::path(
    post,
    path = "/v1/charges/{id}/void",
    operation_id = "createVoid",
    tag = "two-step",
    security(("bearer" = [])),
    params(
        ("id" = inline(ChargeId), Path, description = "The authorized charge to void."),
        ("Idempotency-Key" = inline(IdempotencyKey), Header,
            description = "One key per void intent, as for a capture."),
        ("Prefer" = Option<String>, Header, description = "`wait=N`, as for a charge."),
    ),
    request_body(description = "Empty, or `{}`: a void names no amount.",
        content_type = "application/json"),
    responses(
        (status = CREATED, description = "Voided: the void (`status: succeeded`, \
            `amount_cents`: what it released). Stored as the key's outcome.", body = Step,
            content_type = "application/json",
            headers(("Location" = String, description = "`/v1/voids/{id}` of the void."))),
        (status = BAD_REQUEST, description = "`missing-idempotency-key`, \
            `malformed-idempotency-key` or `invalid-body` (a body other than empty or `{}`). \
            Nothing stored.", body = Problem, content_type = PROBLEM_JSON),
        (status = UNAUTHORIZED, description = UNAUTHORIZED_DESCRIPTION, body = Problem,
            content_type = PROBLEM_JSON, headers(("WWW-Authenticate" = String, description = "`Bearer`."))),
        (status = NOT_FOUND, description = "`not-found`: no such charge, or another merchant's.",
            body = Problem, content_type = PROBLEM_JSON),
        (status = CONFLICT, description = "`request-in-flight`, `authorization-closed` (a final \
            capture or another void is pending), or `capture-pending`: captures of the \
            authorization are pending at the acquirer; void once they settle. Nothing stored.",
            body = Problem, content_type = PROBLEM_JSON),
        (status = GONE, description = "`key-expired`: a late retry; `void_id` names the void.",
            body = Problem, content_type = PROBLEM_JSON),
        (status = UNPROCESSABLE_ENTITY, description = "`charge-not-authorized` (nothing \
            stored), `idempotency-key-reused`, or `void-failed`: the acquirer refused the void \
            for good (`void` holds it); the authorization is open again.",
            body = Problem, content_type = PROBLEM_JSON),
        (status = PAYLOAD_TOO_LARGE, description = "`body-too-large`. Nothing stored.",
            body = Problem, content_type = PROBLEM_JSON),
        (status = UNSUPPORTED_MEDIA_TYPE, description = "`unsupported-media-type`. Nothing stored.",
            body = Problem, content_type = PROBLEM_JSON),
        (status = GATEWAY_TIMEOUT, description = "`timeout`: a backstop no working path reaches.",
            body = Problem, content_type = PROBLEM_JSON),
        (status = INTERNAL_SERVER_ERROR, description = INTERNAL_DESCRIPTION, body = Problem,
            content_type = PROBLEM_JSON),
        (status = SERVICE_UNAVAILABLE, description = "`outcome-unknown` (the void stays \
            `pending`, the authorization closed; retry with the same key), `step-under-review`, \
            or `service-unavailable`, `store-unwritable`, `overloaded`.",
            body = Problem, content_type = PROBLEM_JSON,
            headers(("Retry-After" = inline(RetryAfter), description = "Seconds to wait before retrying."))),
    ),
)]
pub async fn void(
    State(state): State<AppState>,
    Authenticated(merchant): Authenticated,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let charge_id = ChargeId::parse(&id).ok_or(ApiError::NotFound)?;
    tracing::Span::current().record("charge_id", charge_id.as_str());
    let (key, body) = key_and_body(&headers, body)?;
    parse_void_body(&body).map_err(ApiError::InvalidBody)?;
    run(
        &state,
        merchant,
        key,
        VoidIntent { charge_id },
        &headers,
        idem_core::metrics::VOID_OUTCOMES,
    )
    .await
}

/// A capture as it is now, also while `pending`.
#[utoipa::path(
    get,
    path = "/v1/captures/{id}",
    operation_id = "getCapture",
    tag = "two-step",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The capture's id, `cp_...`.")),
    responses(
        (status = OK, description = "The capture.", body = Step, content_type = "application/json"),
        (status = UNAUTHORIZED, description = UNAUTHORIZED_DESCRIPTION, body = Problem,
            content_type = PROBLEM_JSON),
        (status = NOT_FOUND, description = "`not-found`: no such capture, or another merchant's.",
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
pub async fn get_capture(
    state: State<AppState>,
    merchant: Authenticated,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    get(state, merchant, &id, StepKind::Capture).await
}

/// A void as it is now, also while `pending`.
#[utoipa::path(
    get,
    path = "/v1/voids/{id}",
    operation_id = "getVoid",
    tag = "two-step",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The void's id, `vd_...`.")),
    responses(
        (status = OK, description = "The void.", body = Step, content_type = "application/json"),
        (status = UNAUTHORIZED, description = UNAUTHORIZED_DESCRIPTION, body = Problem,
            content_type = PROBLEM_JSON),
        (status = NOT_FOUND, description = "`not-found`: no such void, or another merchant's.",
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
pub async fn get_void(
    state: State<AppState>,
    merchant: Authenticated,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    get(state, merchant, &id, StepKind::Void).await
}

async fn get(
    State(state): State<AppState>,
    Authenticated(merchant): Authenticated,
    id: &str,
    kind: StepKind,
) -> Result<Response, ApiError> {
    let id = StepId::parse(id, kind).ok_or(ApiError::NotFound)?;
    let step = state
        .store
        .step(merchant.id, &id)
        .await?
        .ok_or(ApiError::NotFound)?;
    json(&step)
}

/// A charge's captures and voids, oldest first.
#[utoipa::path(
    get,
    path = "/v1/charges/{id}/captures",
    operation_id = "listSteps",
    tag = "two-step",
    security(("bearer" = [])),
    params(("id" = inline(ChargeId), Path, description = "The charge.")),
    responses(
        (status = OK, description = "The charge's captures and voids, oldest first (none: \
            `[]`); a void has no `final`.", body = Vec<Step>, content_type = "application/json"),
        (status = UNAUTHORIZED, description = UNAUTHORIZED_DESCRIPTION, body = Problem,
            content_type = PROBLEM_JSON),
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
    if state.store.charge(merchant.id, &id).await?.is_none() {
        return Err(ApiError::NotFound);
    }
    json(&state.store.steps_of(merchant.id, &id).await?)
}

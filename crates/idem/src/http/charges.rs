//! `POST /v1/charges` and `GET /v1/charges/{id}`.
//!
//! The handler only parses: everything that can be refused is refused here,
//! before the key is claimed, so a bad request stores nothing and its key can be
//! used again with a corrected body. The engine then runs on its own task, so a
//! client that hangs up mid-call (the article's timeout) cannot cut the attempt
//! short between claim and finalize.

use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use tracing::Instrument;

use super::auth::Authenticated;
use super::schemas::{ChargeProblem, Replayed, RetryAfter};
use super::{ApiError, AppState, BODY_LIMIT};
use idem_core::domain::{Charge, ChargeId, ChargeRequest, Merchant, RefundStatus, SubjectId};
use idem_core::domain::{IdempotencyKey, KeyError};
use idem_core::idempotency::{Operation, Outcome};
use idem_core::metrics as metrics_name;
use idem_core::problem::{self, Problem, PROBLEM_JSON};

pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
/// Seconds for which, at least, this answer's key is still honoured: a
/// retry within them gets this same answer. The name issue 49 of the IETF
/// draft's tracker proposes (`Idempotency-TTL: 3600`) for what issue 35 asks
/// for: a response header that tells the client how long its key is honoured.
/// Seconds from now rather than a date, so that no clock but the client's
/// own is involved (a replay says what is left, not the key's first TTL).
pub const IDEMPOTENCY_TTL: HeaderName = HeaderName::from_static("idempotency-ttl");
pub const PREFER: HeaderName = HeaderName::from_static("prefer");
pub const PREFERENCE_APPLIED: HeaderName = HeaderName::from_static("preference-applied");

/// The longest `Prefer: wait` honoured: a duplicate that waits longer would
/// hold its request slot past any client's patience; it retries instead.
pub const MAX_WAIT: Duration = Duration::from_secs(10);

/// Charge once per `Idempotency-Key`.
///
/// The first attempt with a key claims it, calls the acquirer and stores its
/// final outcome (`201`, `402` or `502`); every later request with the same key
/// and the same request gets that outcome again, byte for byte, with
/// `Idempotent-Replayed: true`. "The same request" is the same parsed body: field
/// order and whitespace do not matter, and an absent `currency` equals `"BRL"`.
/// Everything refused before the key is claimed (`400`, `401`, `413`, `415`)
/// stores nothing, so the key can be sent again with a corrected request.
#[utoipa::path(
    post,
    path = "/v1/charges",
    operation_id = "createCharge",
    tag = "charges",
    security(("bearer" = [])),
    params(
        ("Idempotency-Key" = inline(IdempotencyKey), Header,
            description = "One key per intent, chosen by the client (a UUID is a good choice) and \
                sent again, unchanged, on every retry of that intent. Scoped to the merchant."),
        ("Prefer" = Option<String>, Header,
            description = "`wait=N` (RFC 7240): if another attempt with this key is in flight, wait \
                up to N seconds (at most 10) for its outcome and answer with it, instead of `409` at \
                once. Other preferences are ignored."),
    ),
    request_body(content = ChargeRequest, content_type = "application/json"),
    responses(
        (status = CREATED, description = "Captured: the charge. Stored as the key's outcome.",
            body = Charge, content_type = "application/json",
            headers(
                ("Location" = String, description = "`/v1/charges/{id}` of the charge."),
                ("Idempotent-Replayed" = inline(Replayed), description = "`true` when this is a stored outcome answered again; absent on the first answer."),
                ("Idempotency-TTL" = u64, description = "Seconds for which, at least, the key is still honoured: a retry within them gets this answer again (`--key-ttl` from when the outcome was stored, less the time since)."),
                ("Preference-Applied" = String, description = "`wait=N` when the request waited (up to N seconds) for a duplicate's outcome (`Prefer: wait`)."),
            )),
        (status = BAD_REQUEST, description = "`missing-idempotency-key`, `malformed-idempotency-key` \
            or `invalid-body` (`field` names the field at fault; also a body with anything but \
            whitespace after its JSON object, or one that could not be read whole, such as bad \
            chunked framing). Nothing stored.",
            body = Problem, content_type = PROBLEM_JSON),
        (status = UNAUTHORIZED, description = UNAUTHORIZED_DESCRIPTION, body = Problem,
            content_type = PROBLEM_JSON, headers(("WWW-Authenticate" = String, description = "`Bearer`."))),
        (status = PAYMENT_REQUIRED, description = "`charge-declined`: the acquirer declined; `charge` \
            holds the charge (`status: declined`, `decline_reason`). Stored as the key's outcome: a new \
            attempt needs a new key.",
            body = inline(ChargeProblem), content_type = PROBLEM_JSON,
            headers(
                ("Idempotent-Replayed" = inline(Replayed), description = "`true` when this is a stored outcome answered again; absent on the first answer."),
                ("Idempotency-TTL" = u64, description = "Seconds for which, at least, the key is still honoured: a retry within them gets this answer again (`--key-ttl` from when the outcome was stored, less the time since)."),
                ("Preference-Applied" = String, description = "`wait=N` when the request waited (up to N seconds) for a duplicate's outcome (`Prefer: wait`)."),
            )),
        (status = CONFLICT, description = "`request-in-flight`: another attempt with this key is at the \
            acquirer. Answered at once, never after waiting on a lock; with `Prefer: wait=N`, after \
            waiting N seconds for its outcome in vain. Nothing stored.",
            body = Problem, content_type = PROBLEM_JSON,
            headers(
                ("Retry-After" = inline(RetryAfter), description = "A short hint (1 s): about one acquirer call."),
                ("Preference-Applied" = String, description = "`wait=N` when the request waited (up to N seconds) for a duplicate's outcome (`Prefer: wait`)."),
            )),
        (status = PAYLOAD_TOO_LARGE, description = "`body-too-large`: the body is over 16 KiB. Nothing stored.",
            body = Problem, content_type = PROBLEM_JSON),
        (status = UNSUPPORTED_MEDIA_TYPE, description = "`unsupported-media-type`: `Content-Type` is not \
            `application/json`. Nothing stored.", body = Problem, content_type = PROBLEM_JSON),
        (status = UNPROCESSABLE_ENTITY, description = "`idempotency-key-reused`: the key was first used \
            with another request; `differing_fields` lists the fields that differ. Nothing stored.",
            body = Problem, content_type = PROBLEM_JSON),
        (status = GONE, description = "`key-expired`: the key expired (`--key-ttl`) after storing the \
            outcome of this same request, and its tombstone (`--tombstone-ttl`, 30 days by default) is \
            still kept: a late retry, not a new intent. `charge_id` names the charge it made; nothing \
            is charged again. A new charge needs a new key; the same key with another request is one.",
            body = Problem, content_type = PROBLEM_JSON),
        (status = INTERNAL_SERVER_ERROR, description = INTERNAL_DESCRIPTION, body = Problem,
            content_type = PROBLEM_JSON),
        (status = BAD_GATEWAY, description = "`acquirer-rejected`: the acquirer answered `422` (it knows \
            the reference with other data) and refused the request; `charge` holds the charge \
            (`status: failed`), no money moved. Stored as the key's outcome.",
            body = inline(ChargeProblem), content_type = PROBLEM_JSON,
            headers(
                ("Idempotent-Replayed" = inline(Replayed), description = "`true` when this is a stored outcome answered again; absent on the first answer."),
                ("Idempotency-TTL" = u64, description = "Seconds for which, at least, the key is still honoured: a retry within them gets this answer again (`--key-ttl` from when the outcome was stored, less the time since)."),
                ("Preference-Applied" = String, description = "`wait=N` when the request waited (up to N seconds) for a duplicate's outcome (`Prefer: wait`)."),
            )),
        (status = SERVICE_UNAVAILABLE, description = "`outcome-unknown`: the acquirer gave no answer that \
            is its word (a timeout, a dropped connection, or any status but `201`, `402` and `422`, such as \
            `409` while a POST of the reference is in flight, `429` or a `5xx`), and the charge stays \
            `processing`; retry with the same key, which cannot charge twice. Or `service-unavailable`: \
            the database cannot be reached, or gave no answer within 8 s (a partition). Or \
            `store-unwritable`: the database cannot take writes now (a full disk, read-only). Or \
            `overloaded`: this instance has as many requests in flight as it works at once, and \
            refused this one before reading it, or as many waiting for a duplicate's outcome \
            (`Prefer: wait`) as it lets wait. Or `charge-under-review`: the charge awaits a \
            person's decision (the acquirer's capture contradicted it, or it had no outcome by the \
            settle deadline); `charge_id` names it, no retry calls the acquirer for it, and once an \
            operator resolves it the key replays that decision (`Retry-After: 60`). Nothing stored.",
            body = Problem, content_type = PROBLEM_JSON,
            headers(("Retry-After" = inline(RetryAfter), description = "Seconds to wait before retrying."))),
        (status = GATEWAY_TIMEOUT, description = "`timeout`: a backstop no working path reaches: no \
            answer within the acquirer timeout plus 24 s (every database step is a `503` within 8 s). \
            The attempt carries on; retry with the same key.", body = Problem,
            content_type = PROBLEM_JSON),
    ),
)]
pub async fn create(
    State(state): State<AppState>,
    Authenticated(merchant): Authenticated,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (key, body) = key_and_body(&headers, body)?;
    let request = ChargeRequest::from_json(&body).map_err(ApiError::InvalidBody)?;
    run(
        &state,
        merchant,
        key,
        request,
        &headers,
        metrics_name::CHARGE_OUTCOMES,
    )
    .await
}

/// The headers and body every operation's `POST` checks first: JSON, and an
/// `Idempotency-Key`; then the body, read whole within the limit. Nothing is
/// stored for a request refused here.
pub(super) fn key_and_body(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(IdempotencyKey, Bytes), ApiError> {
    if !is_json(headers) {
        return Err(ApiError::UnsupportedMediaType);
    }
    let key = idempotency_key(headers)?;
    tracing::Span::current().record("idempotency_key", key.as_str());
    // Any other rejection is the body failing to arrive whole (bad chunked
    // framing, a client that hung up mid-body): the client's fault, not ours.
    let body = body.map_err(|e| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::BodyTooLarge(BODY_LIMIT),
        _ => ApiError::UnreadableBody(e.body_text()),
    })?;
    Ok((key, body))
}

/// Runs one attempt of an operation (a charge, a refund) on its own task
/// and answers with its outcome, counted under `outcomes`.
pub(super) async fn run<O: Operation>(
    state: &AppState,
    merchant: Merchant,
    key: IdempotencyKey,
    request: O,
    headers: &HeaderMap,
    outcomes: &'static str,
) -> Result<Response, ApiError> {
    let wait = preferred_wait(headers);
    let engine = state.engine.clone();
    let waiters = state.waiters.clone();
    // The request's span goes along, so the engine's log lines carry its fields.
    // Boxed: the attempt's future is large, and tokio moves a task's whole
    // state several times as it spawns and completes it; a box moves as a pointer.
    // A wait runs on the task too: a look that finds the key free may claim it.
    let task = state.tasks.spawn(Box::pin(
        async move {
            let outcome = engine.submit(&merchant, &key, &request).await?;
            let (Some(wait), Outcome::InFlight { .. }) = (wait, &outcome) else {
                return Ok((outcome, None));
            };
            let Ok(_waiting) = waiters.try_acquire_owned() else {
                return Err(ApiError::Overloaded);
            };
            let until = Instant::now() + wait;
            let outcome = engine
                .await_outcome(&merchant, &key, &request, outcome, until)
                .await?;
            Ok((outcome, Some(wait)))
        }
        .instrument(tracing::Span::current()),
    ));
    let (outcome, waited) = task
        .await
        .map_err(|e| ApiError::Internal(format!("attempt task failed: {e}")))??;
    metrics::counter!(outcomes, "outcome" => outcome.label()).increment(1);
    let mut response = answer(outcome).into_response();
    if let Some(waited) = waited {
        if let Ok(applied) = HeaderValue::try_from(format!("wait={}", waited.as_secs())) {
            response.headers_mut().insert(PREFERENCE_APPLIED, applied);
        }
    }
    Ok(response)
}

/// The answer to an attempt's outcome.
fn answer(outcome: Outcome) -> Result<Response, ApiError> {
    if let Some(subject) = outcome.subject() {
        tracing::Span::current().record(subject_field(subject), subject.as_str());
    }
    match outcome {
        Outcome::Completed {
            subject,
            response,
            replayed,
            honoured_until,
        } => {
            let status = StatusCode::from_u16(response.status)
                .map_err(|_| ApiError::Internal(format!("stored status {}", response.status)))?;
            let content_type = problem::media_type_of(response.status);
            let mut r = (
                status,
                [(header::CONTENT_TYPE, content_type)],
                response.body,
            )
                .into_response();
            if status == StatusCode::CREATED {
                if let Ok(location) = HeaderValue::try_from(subject.location()) {
                    r.headers_mut().insert(header::LOCATION, location);
                }
            }
            if replayed {
                r.headers_mut()
                    .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
            }
            let ttl = honoured_until.saturating_duration_since(Instant::now());
            r.headers_mut()
                .insert(IDEMPOTENCY_TTL, HeaderValue::from(ttl.as_secs()));
            Ok(r)
        }
        Outcome::InFlight { retry_after, .. } => Err(ApiError::InFlight { retry_after }),
        Outcome::Mismatch { subject, fields } => Err(ApiError::KeyReused(subject, fields)),
        Outcome::Expired { subject } => Err(ApiError::KeyExpired(subject)),
        Outcome::Unknown {
            subject,
            retry_after,
        } => Err(ApiError::OutcomeUnknown {
            subject,
            retry_after,
        }),
        Outcome::UnderReview {
            subject,
            retry_after,
        } => Err(ApiError::UnderReview {
            subject,
            retry_after,
        }),
        Outcome::Refused(refusal) => Err(ApiError::RefundRefused(refusal)),
    }
}

/// The request span's field that names `subject`.
fn subject_field(subject: &SubjectId) -> &'static str {
    match subject {
        SubjectId::Charge(_) => "charge_id",
        SubjectId::Refund(_) => "refund_id",
        SubjectId::Step(_) => "step_id",
    }
}

/// A charge as it is now.
///
/// Also while it is `processing`. No idempotency key needed.
#[utoipa::path(
    get,
    path = "/v1/charges/{id}",
    operation_id = "getCharge",
    tag = "charges",
    security(("bearer" = [])),
    params(("id" = inline(ChargeId), Path, description = "The charge's id, as `POST /v1/charges` answered it.")),
    responses(
        (status = OK, description = "The charge, with what its refunds gave back.", body = ChargeNow, content_type = "application/json"),
        (status = BAD_REQUEST, description = "`invalid-body`: the id is not UTF-8 once percent-decoded \
            (the framework's path rejection).", body = Problem, content_type = PROBLEM_JSON),
        (status = UNAUTHORIZED, description = UNAUTHORIZED_DESCRIPTION, body = Problem,
            content_type = PROBLEM_JSON, headers(("WWW-Authenticate" = String, description = "`Bearer`."))),
        (status = NOT_FOUND, description = "`not-found`: no such charge, or another merchant's.",
            body = Problem, content_type = PROBLEM_JSON),
        (status = INTERNAL_SERVER_ERROR, description = INTERNAL_DESCRIPTION, body = Problem,
            content_type = PROBLEM_JSON),
        (status = SERVICE_UNAVAILABLE, description = "`service-unavailable`: the database cannot be \
            reached, or gave no answer within 8 s. Or `overloaded`: this instance has as many requests \
            in flight as it works at once.",
            body = Problem, content_type = PROBLEM_JSON,
            headers(("Retry-After" = inline(RetryAfter), description = "Seconds to wait before retrying."))),
        (status = GATEWAY_TIMEOUT, description = "`timeout`: a backstop no working path reaches: no \
            answer within the acquirer timeout plus 24 s.", body = Problem, content_type = PROBLEM_JSON),
    ),
)]
pub async fn get(
    State(state): State<AppState>,
    Authenticated(merchant): Authenticated,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = ChargeId::parse(&id).ok_or(ApiError::NotFound)?;
    let charge = state
        .store
        .charge(merchant.id, &id)
        .await?
        .ok_or(ApiError::NotFound)?;
    tracing::Span::current().record("charge_id", id.as_str());
    let refunds = state.store.refunds_of(merchant.id, &id).await?;
    let now = ChargeNow {
        amount_refunded_cents: refunds
            .iter()
            .filter(|r| r.status == RefundStatus::Succeeded)
            .map(|r| r.amount_cents.get())
            .sum(),
        charge,
    };
    let body = serde_json::to_vec(&now).map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(([(header::CONTENT_TYPE, problem::JSON)], body).into_response())
}

/// A charge as `GET` shows it: the charge, and what its refunds gave back.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct ChargeNow {
    #[serde(flatten)]
    charge: Charge,
    /// What the charge's succeeded refunds gave back, in cents (pending
    /// refunds not counted; the charge stays `captured`).
    amount_refunded_cents: i64,
}

pub(super) const UNAUTHORIZED_DESCRIPTION: &str =
    "`unauthorized`: no `Authorization: Bearer` secret, or not a merchant's. Nothing stored.";
pub(super) const INTERNAL_DESCRIPTION: &str =
    "`internal`: a bug; details are in the server log only. Retrying with the same key is safe.";

/// Whether the request's `Content-Type` is JSON ([`problem::is_json`]).
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(problem::is_json)
}

/// How long the client asks to wait for a duplicate's outcome (RFC 7240
/// `Prefer: wait=N`, in seconds), at most [`MAX_WAIT`]; `None` when it does
/// not ask, or asks for 0. Preferences idem does not know, and a `wait` it
/// cannot read, are ignored, as RFC 7240 says a server may.
fn preferred_wait(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get_all(PREFER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|preference| {
            let preference = preference.split(';').next()?;
            let (name, value) = preference.split_once('=')?;
            let value = value.trim().trim_matches('"');
            let digits = !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit());
            (name.trim().eq_ignore_ascii_case("wait") && digits)
                .then(|| value.parse::<u64>().unwrap_or(u64::MAX))
        })
        .next()
        .filter(|&seconds| seconds > 0)
        .map(|seconds| Duration::from_secs(seconds.min(MAX_WAIT.as_secs())))
}

fn idempotency_key(headers: &HeaderMap) -> Result<IdempotencyKey, ApiError> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let value = values.next().ok_or(ApiError::MissingKey)?;
    if values.next().is_some() {
        return Err(ApiError::MalformedKey(KeyError::Repeated));
    }
    IdempotencyKey::parse(value.as_bytes()).map_err(ApiError::MalformedKey)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait_of(values: &[&str]) -> Option<u64> {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(PREFER, HeaderValue::from_str(v).unwrap());
        }
        preferred_wait(&headers).map(|d| d.as_secs())
    }

    #[test]
    fn prefer_wait_is_read_as_rfc_7240_writes_it() {
        assert_eq!(wait_of(&["wait=5"]), Some(5));
        assert_eq!(wait_of(&["respond-async, WAIT = 3"]), Some(3));
        assert_eq!(wait_of(&["return=minimal", "wait=\"2\"; x=y"]), Some(2));
        assert_eq!(wait_of(&["wait=600"]), Some(10), "at most ten seconds");
        assert_eq!(wait_of(&["wait=99999999999999999999999"]), Some(10));
        for ignored in [
            "wait=0",
            "wait=abc",
            "wait=-1",
            "wait",
            "handling=lenient",
            "",
        ] {
            assert_eq!(wait_of(&[ignored]), None, "{ignored}");
        }
        assert_eq!(wait_of(&[]), None);
    }
}

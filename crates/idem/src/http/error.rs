//! The HTTP layer's error: every way a request can fail, each variant's status
//! documented, all rendered as problem+json. Internal causes are logged, never shown.

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use idem_core::domain::KeyError;
use idem_core::domain::{FieldError, SubjectId};
use idem_core::idempotency::EngineError;
use idem_core::problem::{Problem, ProblemKind, PROBLEM_JSON};
use idem_core::store::{Refusal, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 401: no bearer secret, or not a merchant's.
    #[error("missing or invalid bearer secret")]
    Unauthorized,
    /// 400: the `Idempotency-Key` header is absent.
    #[error("missing Idempotency-Key")]
    MissingKey,
    /// 400: the `Idempotency-Key` header is not a valid key.
    #[error("{0}")]
    MalformedKey(KeyError),
    /// 415: the body is not declared as JSON.
    #[error("Content-Type must be application/json")]
    UnsupportedMediaType,
    /// 413: the body is over the limit.
    #[error("the request body is larger than {0} bytes")]
    BodyTooLarge(usize),
    /// 400: the body is not a valid charge request.
    #[error("{0}")]
    InvalidBody(FieldError),
    /// 400: the body could not be read whole (bad chunked framing, a client
    /// that hung up mid-body).
    #[error("the request body could not be read: {0}")]
    UnreadableBody(String),
    /// 422: the key was first used for another request (or operation),
    /// which made the charge or the refund.
    #[error("{}", idem_core::problem::key_reused_detail(.1))]
    KeyReused(SubjectId, Vec<&'static str>),
    #[error("{}", idem_core::problem::key_expired_detail(.0))]
    KeyExpired(SubjectId),
    /// 409: another attempt with this key is still working.
    #[error("a request with this Idempotency-Key is still being processed")]
    InFlight { retry_after: Duration },
    /// 503: the acquirer's answer is not yet known; the charge stays
    /// processing (a refund, pending).
    #[error("{} {subject} is {}: the acquirer's outcome is not yet known", subject.kind(), pending(subject))]
    OutcomeUnknown {
        subject: SubjectId,
        retry_after: Duration,
    },
    /// 503: the charge (or refund) awaits a person's review; no retry
    /// settles it before an operator does.
    #[error(
        "{} {subject} awaits review by a person (the acquirer's answer could not settle it: \
         see GET {}); it stays {} until it is resolved, and no retry \
         calls the acquirer meanwhile", subject.kind(), subject.location(), pending(subject)
    )]
    UnderReview {
        subject: SubjectId,
        retry_after: Duration,
    },
    /// 404 or 422: the charge cannot give this refund back; nothing stored.
    #[error("the charge cannot give this refund: {0:?}")]
    RefundRefused(Refusal),
    /// 404: no such resource for this merchant.
    #[error("not found")]
    NotFound,
    /// 503: more requests are in flight than this instance works at once;
    /// this one was refused at once, before anything was read or stored.
    #[error("this instance has too many requests in flight; retry shortly")]
    Overloaded,
    /// 503: a dependency (the database) cannot be reached now.
    #[error("the service cannot reach its database")]
    Unavailable,
    /// 503: the database answers but cannot take a write now (its disk is
    /// full, it is read-only).
    #[error(
        "the service's database cannot take writes now (its disk is full or it is read-only); \
         retry with the same Idempotency-Key: a retry finishes whatever this attempt began, \
         and never charges twice"
    )]
    Unwritable,
    /// 500: a bug. The cause goes to the log only.
    #[error("internal error")]
    Internal(String),
}

/// What a pending subject is called: a charge `processing`, a refund `pending`.
fn pending(subject: &SubjectId) -> &'static str {
    match subject {
        SubjectId::Charge(_) => "processing",
        SubjectId::Refund(_) | SubjectId::Step(_) => "pending",
    }
}

/// `Retry-After` after a database outage.
const UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// `Retry-After` while the database cannot write: space is freed by a person
/// or a job, in seconds to minutes, not in one.
const UNWRITABLE_RETRY_AFTER: Duration = Duration::from_secs(5);

/// `Retry-After` on a shed request: a second lets the requests in flight
/// (most answered within the acquirer's latency) make room, and a shed retry
/// costs the instance next to nothing if it comes too early.
const OVERLOADED_RETRY_AFTER: Duration = Duration::from_secs(1);

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(cause) => {
                tracing::warn!(error = %cause, "database unavailable");
                Self::Unavailable
            }
            // Logged once by the store when it turns unwritable (and again
            // when it writes again), not once per request.
            StoreError::Unwritable(cause) => {
                tracing::debug!(error = %cause, "database cannot write");
                Self::Unwritable
            }
            other => Self::Internal(other.to_string()),
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Store(s) => s.into(),
        }
    }
}

impl ApiError {
    fn kind(&self) -> ProblemKind {
        match self {
            Self::Unauthorized => ProblemKind::Unauthorized,
            Self::MissingKey => ProblemKind::MissingIdempotencyKey,
            Self::MalformedKey(_) => ProblemKind::MalformedIdempotencyKey,
            Self::UnsupportedMediaType => ProblemKind::UnsupportedMediaType,
            Self::BodyTooLarge(_) => ProblemKind::BodyTooLarge,
            Self::InvalidBody(_) | Self::UnreadableBody(_) => ProblemKind::InvalidBody,
            Self::KeyReused(..) => ProblemKind::KeyReused,
            Self::KeyExpired(_) => ProblemKind::KeyExpired,
            Self::InFlight { .. } => ProblemKind::RequestInFlight,
            Self::OutcomeUnknown { .. } => ProblemKind::OutcomeUnknown,
            Self::UnderReview {
                subject: SubjectId::Charge(_),
                ..
            } => ProblemKind::UnderReview,
            Self::UnderReview {
                subject: SubjectId::Refund(_),
                ..
            } => ProblemKind::RefundUnderReview,
            Self::UnderReview { .. } => ProblemKind::StepUnderReview,
            Self::RefundRefused(refusal) => idem_core::idempotency::refusal_kind(refusal),
            Self::NotFound => ProblemKind::NotFound,
            Self::Unavailable => ProblemKind::ServiceUnavailable,
            Self::Unwritable => ProblemKind::StoreUnwritable,
            Self::Overloaded => ProblemKind::Overloaded,
            Self::Internal(_) => ProblemKind::Internal,
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::InFlight { retry_after }
            | Self::OutcomeUnknown { retry_after, .. }
            | Self::UnderReview { retry_after, .. } => Some(*retry_after),
            Self::Unavailable => Some(UNAVAILABLE_RETRY_AFTER),
            Self::Unwritable => Some(UNWRITABLE_RETRY_AFTER),
            Self::Overloaded => Some(OVERLOADED_RETRY_AFTER),
            _ => None,
        }
    }
}

impl ApiError {
    /// The problem document this error answers with, as status and bytes
    /// (also what a queue command's result carries).
    pub fn problem_body(&self) -> (u16, Vec<u8>) {
        if let Self::RefundRefused(refusal) = self {
            let answer = idem_core::idempotency::refusal_response(refusal);
            return (answer.status, answer.body.to_vec());
        }
        let kind = self.kind();
        let detail = match self {
            Self::Internal(cause) => {
                tracing::error!(%cause, "internal error");
                "The request could not be completed; it is safe to retry with the same Idempotency-Key.".to_owned()
            }
            other => other.to_string(),
        };
        let mut problem = match self {
            Self::KeyReused(subject, fields) => Problem::key_reused(subject, fields),
            Self::KeyExpired(subject) => Problem::key_expired(subject),
            Self::UnderReview { subject, .. } => Problem::new(kind, detail).naming(subject),
            Self::OutcomeUnknown {
                subject: subject @ (SubjectId::Refund(_) | SubjectId::Step(_)),
                ..
            } => Problem::new(kind, detail).naming(subject),
            _ => Problem::new(kind, detail),
        };
        if let Self::InvalidBody(e) = self {
            problem.field = e.field.as_deref();
        }
        (problem.status, problem.to_bytes())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        metrics::counter!(idem_core::metrics::HTTP_PROBLEMS, "type" => self.kind().slug())
            .increment(1);
        let (status, body) = self.problem_body();
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (
            status,
            [(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON))],
            body,
        )
            .into_response();
        if let Some(after) = self.retry_after() {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, retry_after_value(after));
        }
        if matches!(self, Self::Unauthorized) {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// A problem document as a response with its own status.
pub fn problem_response(problem: &Problem<'_>) -> Response {
    let status = StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        status,
        [(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON))],
        problem.to_bytes(),
    )
        .into_response()
}

/// Whole seconds, rounded up, at least one.
pub fn retry_after_value(after: Duration) -> HeaderValue {
    let secs = after.as_millis().div_ceil(1000).max(1);
    HeaderValue::from(u64::try_from(secs).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_value(Duration::from_millis(1)), "1");
        assert_eq!(retry_after_value(Duration::from_millis(1000)), "1");
        assert_eq!(retry_after_value(Duration::from_millis(1001)), "2");
        assert_eq!(retry_after_value(Duration::ZERO), "1");
    }
}

//! Problem details (RFC 9457): the one shape of every error idem answers, and
//! the catalog of its kinds, each with a stable `type` URI.
//!
//! The catalog lives here rather than in the HTTP layer because some problems
//! are *stored outcomes* (a decline is replayed byte for byte), written by the
//! idempotency engine and, later, by the queue consumer.

use serde::Serialize;
use utoipa::openapi::{ObjectBuilder, RefOr, Schema, Type};
use utoipa::ToSchema;

use crate::domain::{Charge, Refund, Step, StepKind, SubjectId};

/// Every kind of problem idem reports. The URI of each is part of the contract:
/// clients branch on it, so it never changes once published (docs/errors.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProblemKind {
    Unauthorized,
    MissingIdempotencyKey,
    MalformedIdempotencyKey,
    InvalidBody,
    UnsupportedMediaType,
    BodyTooLarge,
    KeyReused,
    KeyExpired,
    RequestInFlight,
    OutcomeUnknown,
    UnderReview,
    Declined,
    AcquirerRejected,
    ChargeNotRefundable,
    RefundExceedsCaptured,
    RefundFailed,
    RefundUnderReview,
    ChargeNotAuthorized,
    AuthorizationClosed,
    CapturePending,
    CaptureExceedsAuthorization,
    CaptureFailed,
    VoidFailed,
    StepUnderReview,
    NotFound,
    MethodNotAllowed,
    ServiceUnavailable,
    StoreUnwritable,
    Overloaded,
    Timeout,
    Internal,
}

impl ProblemKind {
    /// Every kind, for docs and tests.
    pub const ALL: [ProblemKind; 31] = [
        Self::Unauthorized,
        Self::MissingIdempotencyKey,
        Self::MalformedIdempotencyKey,
        Self::InvalidBody,
        Self::UnsupportedMediaType,
        Self::BodyTooLarge,
        Self::KeyReused,
        Self::KeyExpired,
        Self::RequestInFlight,
        Self::OutcomeUnknown,
        Self::UnderReview,
        Self::Declined,
        Self::AcquirerRejected,
        Self::ChargeNotRefundable,
        Self::RefundExceedsCaptured,
        Self::RefundFailed,
        Self::RefundUnderReview,
        Self::ChargeNotAuthorized,
        Self::AuthorizationClosed,
        Self::CapturePending,
        Self::CaptureExceedsAuthorization,
        Self::CaptureFailed,
        Self::VoidFailed,
        Self::StepUnderReview,
        Self::NotFound,
        Self::MethodNotAllowed,
        Self::ServiceUnavailable,
        Self::StoreUnwritable,
        Self::Overloaded,
        Self::Timeout,
        Self::Internal,
    ];

    pub fn slug(self) -> &'static str {
        match self {
            Self::Unauthorized => "unauthorized",
            Self::MissingIdempotencyKey => "missing-idempotency-key",
            Self::MalformedIdempotencyKey => "malformed-idempotency-key",
            Self::InvalidBody => "invalid-body",
            Self::UnsupportedMediaType => "unsupported-media-type",
            Self::BodyTooLarge => "body-too-large",
            Self::KeyReused => "idempotency-key-reused",
            Self::KeyExpired => "key-expired",
            Self::RequestInFlight => "request-in-flight",
            Self::OutcomeUnknown => "outcome-unknown",
            Self::UnderReview => "charge-under-review",
            Self::Declined => "charge-declined",
            Self::AcquirerRejected => "acquirer-rejected",
            Self::ChargeNotRefundable => "charge-not-refundable",
            Self::RefundExceedsCaptured => "refund-exceeds-captured",
            Self::RefundFailed => "refund-failed",
            Self::RefundUnderReview => "refund-under-review",
            Self::ChargeNotAuthorized => "charge-not-authorized",
            Self::AuthorizationClosed => "authorization-closed",
            Self::CapturePending => "capture-pending",
            Self::CaptureExceedsAuthorization => "capture-exceeds-authorization",
            Self::CaptureFailed => "capture-failed",
            Self::VoidFailed => "void-failed",
            Self::StepUnderReview => "step-under-review",
            Self::NotFound => "not-found",
            Self::MethodNotAllowed => "method-not-allowed",
            Self::ServiceUnavailable => "service-unavailable",
            Self::StoreUnwritable => "store-unwritable",
            Self::Overloaded => "overloaded",
            Self::Timeout => "timeout",
            Self::Internal => "internal",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Self::Unauthorized => "Missing or invalid credentials",
            Self::MissingIdempotencyKey => "Idempotency-Key header required",
            Self::MalformedIdempotencyKey => "Malformed Idempotency-Key header",
            Self::InvalidBody => "Invalid request body",
            Self::UnsupportedMediaType => "Unsupported media type",
            Self::BodyTooLarge => "Request body too large",
            Self::KeyReused => "Idempotency-Key reused with a different request",
            Self::KeyExpired => "Idempotency-Key expired; this request was already answered",
            Self::RequestInFlight => "A request with this Idempotency-Key is in flight",
            Self::OutcomeUnknown => "Outcome not yet known",
            Self::UnderReview => "Charge awaiting review",
            Self::Declined => "Charge declined",
            Self::AcquirerRejected => "Charge rejected by the acquirer",
            Self::ChargeNotRefundable => "Charge cannot be refunded",
            Self::RefundExceedsCaptured => "Refund exceeds what the charge has left",
            Self::RefundFailed => "Refund refused by the acquirer",
            Self::RefundUnderReview => "Refund awaiting review",
            Self::ChargeNotAuthorized => "Charge is not an open authorization",
            Self::AuthorizationClosed => "Authorization closed by a final capture or a void",
            Self::CapturePending => "A capture of this authorization is pending",
            Self::CaptureExceedsAuthorization => "Capture exceeds what the authorization has left",
            Self::CaptureFailed => "Capture refused by the acquirer",
            Self::VoidFailed => "Void refused by the acquirer",
            Self::StepUnderReview => "Capture or void awaiting review",
            Self::NotFound => "Not found",
            Self::MethodNotAllowed => "Method not allowed",
            Self::ServiceUnavailable => "Service unavailable",
            Self::StoreUnwritable => "The database cannot take writes now",
            Self::Overloaded => "Too many requests in flight",
            Self::Timeout => "Request timed out",
            Self::Internal => "Internal error",
        }
    }

    pub fn status(self) -> u16 {
        match self {
            Self::Unauthorized => 401,
            Self::MissingIdempotencyKey | Self::MalformedIdempotencyKey | Self::InvalidBody => 400,
            Self::UnsupportedMediaType => 415,
            Self::BodyTooLarge => 413,
            Self::KeyReused
            | Self::ChargeNotRefundable
            | Self::RefundExceedsCaptured
            | Self::RefundFailed
            | Self::ChargeNotAuthorized
            | Self::CaptureExceedsAuthorization
            | Self::CaptureFailed
            | Self::VoidFailed => 422,
            Self::AuthorizationClosed | Self::CapturePending => 409,
            Self::KeyExpired => 410,
            Self::RequestInFlight => 409,
            Self::OutcomeUnknown
            | Self::UnderReview
            | Self::RefundUnderReview
            | Self::StepUnderReview
            | Self::ServiceUnavailable
            | Self::StoreUnwritable
            | Self::Overloaded => 503,
            Self::Declined => 402,
            Self::AcquirerRejected => 502,
            Self::NotFound => 404,
            Self::MethodNotAllowed => 405,
            Self::Timeout => 504,
            Self::Internal => 500,
        }
    }

    /// The stable `type` URI. A URN: it names the kind without pretending to be
    /// a page that resolves; docs/errors.md describes each.
    pub fn type_uri(self) -> String {
        format!("urn:idem:problem:{}", self.slug())
    }

    /// The kind whose status this is, for bare error responses from the framework.
    pub fn for_status(status: u16) -> Self {
        match status {
            401 => Self::Unauthorized,
            404 => Self::NotFound,
            405 => Self::MethodNotAllowed,
            408 | 504 => Self::Timeout,
            413 => Self::BodyTooLarge,
            415 => Self::UnsupportedMediaType,
            503 => Self::ServiceUnavailable,
            400..=499 => Self::InvalidBody,
            _ => Self::Internal,
        }
    }
}

/// A problem+json document.
#[derive(Debug, Serialize, ToSchema)]
#[schema(description = "An error, as `application/problem+json` (RFC 9457). \
    `field`, `differing_fields`, `charge` and `charge_id` are present only where they apply.")]
pub struct Problem<'a> {
    /// The kind of error: branch on this, not on `title` or `detail`.
    #[serde(rename = "type")]
    #[schema(schema_with = type_uri_schema)]
    pub type_uri: String,
    /// A short summary of the kind, the same for every problem of that `type`.
    #[schema(value_type = String)]
    pub title: &'static str,
    /// The HTTP status of the response.
    #[schema(minimum = 400, maximum = 599)]
    pub status: u16,
    /// What happened in this case, for a person to read.
    pub detail: String,
    /// The field a validation error is about.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String)]
    pub field: Option<&'a str>,
    /// The fields in which a reused key's request differs from the first.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Vec<String>)]
    pub differing_fields: Option<&'a [&'static str]>,
    /// The charge this problem is about (declines, acquirer rejections).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Charge)]
    pub charge: Option<&'a Charge>,
    /// The charge the key made: an expired key's request (`key-expired`), the
    /// first request of a reused key (`idempotency-key-reused`), a charge
    /// awaiting review.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String)]
    pub charge_id: Option<&'a str>,
    /// The refund this problem is about (a refund the acquirer refused).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Refund)]
    pub refund: Option<&'a Refund>,
    /// The refund the key made: as `charge_id` for a key that made a refund.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String)]
    pub refund_id: Option<&'a str>,
    /// The capture this problem is about (a capture the acquirer refused).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Step)]
    pub capture: Option<&'a Step>,
    /// The void this problem is about (a void the acquirer refused).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Step)]
    pub void: Option<&'a Step>,
    /// The capture the key made: as `charge_id` for a key that made a capture.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String)]
    pub capture_id: Option<&'a str>,
    /// The void the key made: as `charge_id` for a key that made a void.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String)]
    pub void_id: Option<&'a str>,
    /// What the charge has left to refund (`refund-exceeds-captured`), or
    /// the authorization to capture (`capture-exceeds-authorization`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remaining_cents: Option<i64>,
}

/// Every `type` URI of the catalog.
fn type_uri_schema() -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(ProblemKind::ALL.map(ProblemKind::type_uri)))
        .into()
}

impl<'a> Problem<'a> {
    pub fn new(kind: ProblemKind, detail: impl Into<String>) -> Self {
        Self {
            type_uri: kind.type_uri(),
            title: kind.title(),
            status: kind.status(),
            detail: detail.into(),
            field: None,
            differing_fields: None,
            charge: None,
            charge_id: None,
            refund: None,
            refund_id: None,
            capture: None,
            void: None,
            capture_id: None,
            void_id: None,
            remaining_cents: None,
        }
    }

    /// The `410` of a late retry: the key expired after it stored the outcome
    /// of this very request, so nothing is charged again; names the charge.
    pub fn key_expired(subject: &'a SubjectId) -> Self {
        Self::new(ProblemKind::KeyExpired, key_expired_detail(subject)).naming(subject)
    }

    /// The problem naming `subject` as the charge or the refund a key made.
    pub fn naming(mut self, subject: &'a SubjectId) -> Self {
        match subject {
            SubjectId::Charge(id) => self.charge_id = Some(id.as_str()),
            SubjectId::Refund(id) => self.refund_id = Some(id.as_str()),
            SubjectId::Step(id) => match id.kind() {
                StepKind::Capture => self.capture_id = Some(id.as_str()),
                StepKind::Void => self.void_id = Some(id.as_str()),
            },
        }
        self
    }

    /// The `422` of a key first used for another request, naming the charge
    /// that request made and the fields that differ: the same body over HTTP
    /// and in a queue command's result.
    pub fn key_reused(subject: &'a SubjectId, fields: &'a [&'static str]) -> Self {
        Self {
            differing_fields: Some(fields),
            ..Self::new(ProblemKind::KeyReused, key_reused_detail(fields))
        }
        .naming(subject)
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        crate::domain::to_json(self)
    }
}

/// The `detail` of an expired key's problem.
pub fn key_expired_detail(subject: &SubjectId) -> String {
    let (kind, location) = (subject.kind(), subject.location());
    let done = match subject {
        SubjectId::Charge(_) => "charged",
        SubjectId::Refund(_) => "refunded",
        SubjectId::Step(id) => match id.kind() {
            StepKind::Capture => "captured",
            StepKind::Void => "voided",
        },
    };
    format!(
        "the Idempotency-Key expired after storing the outcome of this same request, \
         {kind} {subject} (GET {location}); nothing was {done} again. \
         A new {kind} needs a new key"
    )
}

/// The `detail` of a reused key's problem.
pub fn key_reused_detail(fields: &[&str]) -> String {
    if fields == ["operation"] {
        return "the Idempotency-Key was first used for another operation (a charge's key \
                sent to a refund, or a refund's to a charge)"
            .to_owned();
    }
    format!(
        "the Idempotency-Key was first used with different {}",
        fields.join(", ")
    )
}

pub const PROBLEM_JSON: &str = "application/problem+json";

/// The media type of every request body idem takes and every success it answers.
pub const JSON: &str = "application/json";

/// Whether a `Content-Type` (HTTP) or `content_type` (AMQP) value is
/// [`JSON`], with or without parameters such as `charset=utf-8`.
pub fn is_json(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|mime| mime.trim().eq_ignore_ascii_case(JSON))
}

/// The media type of an answer with `status`, as stored and replayed:
/// a success is [`JSON`], anything else a problem ([`PROBLEM_JSON`]).
pub fn media_type_of(status: u16) -> &'static str {
    if (200..300).contains(&status) {
        JSON
    } else {
        PROBLEM_JSON
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_are_unique() {
        let all = ProblemKind::ALL;
        let mut slugs: Vec<_> = all.iter().map(|k| k.slug()).collect();
        slugs.sort();
        slugs.dedup();
        assert_eq!(slugs.len(), all.len());
    }
}

//! A refund request as parsed from a client, and a refund as shown back to it.
//!
//! A refund is an operation on a captured charge: money back, partly or whole,
//! several times, never more in all than the charge captured. The sum is the
//! store's to keep (a guarded update in the refund's claim); what lives here is
//! what a refund *is*: its values, each valid once held.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize, Serializer};
use utoipa::openapi::{ObjectBuilder, RefOr, Schema, Type};
use utoipa::{PartialSchema, ToSchema};

use super::charge::{from_json_object, AmountCents, Currency, Description, FieldError};
use super::{AcquirerReference, ChargeId};

/// The public id of a refund, `re_...`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RefundId(String);

impl RefundId {
    pub const PREFIX: &'static str = "re_";

    pub fn generate() -> Self {
        Self(super::ids::mint(Self::PREFIX))
    }

    /// Accepts only ids of idem's own shape (a malformed one is a plain 404).
    pub fn parse(s: &str) -> Option<Self> {
        super::ids::has_shape(s, Self::PREFIX).then(|| Self(s.to_owned()))
    }

    /// Wraps a value read back from the store, where only valid ids are written.
    pub fn from_trusted(s: String) -> Self {
        Self(s)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for RefundId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why the merchant refunds: the reasons card schemes and every payments API
/// a merchant knows use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RefundReason {
    RequestedByCustomer,
    Duplicate,
    Fraudulent,
    Other,
}

impl RefundReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RequestedByCustomer => "requested_by_customer",
            Self::Duplicate => "duplicate",
            Self::Fraudulent => "fraudulent",
            Self::Other => "other",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "requested_by_customer" => Self::RequestedByCustomer,
            "duplicate" => Self::Duplicate,
            "fraudulent" => Self::Fraudulent,
            "other" => Self::Other,
            _ => return None,
        })
    }
}

/// The wire shape of `POST /v1/charges/{id}/refunds`, before validation.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(
    as = RefundRequest,
    description = "A refund to make. Every field is optional (an empty body refunds what \
        remains); unknown fields are refused (`400 invalid-body`)."
)]
struct RawRefundRequest {
    /// What to give back; absent or `null`: all the charge has left to refund.
    #[schema(value_type = Option<AmountCents>)]
    amount_cents: Option<i64>,
    #[schema(value_type = Option<RefundReason>)]
    reason: Option<String>,
    #[schema(value_type = Option<Description>)]
    description: Option<String>,
}

/// The request body's schema is that of its wire shape.
impl PartialSchema for RefundRequest {
    fn schema() -> RefOr<Schema> {
        RawRefundRequest::schema()
    }
}
impl ToSchema for RefundRequest {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        RawRefundRequest::schemas(schemas);
    }
}

impl PartialSchema for RefundId {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(format!(
                "^{}[A-Za-z0-9]{{{}}}$",
                Self::PREFIX,
                super::ids::RANDOM_LEN
            )))
            .description(Some("The refund's public id."))
            .examples(["re_7kLmQ2xZ9pR4tV8bN1cW6yHd"])
            .into()
    }
}
impl ToSchema for RefundId {}

/// One intent to refund, fully validated. Without an amount it refunds
/// whatever the charge has left when the refund is claimed.
///
/// Its serialized form is canonical (fixed field order, absent fields as
/// `null`): what the request fingerprint hashes, with the charge it refunds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RefundRequest {
    pub amount_cents: Option<AmountCents>,
    pub reason: Option<RefundReason>,
    pub description: Option<Description>,
}

impl RefundRequest {
    /// Parses a JSON body (one object, nothing after it but whitespace); an
    /// empty body is a refund of what remains. Every error names its field.
    pub fn from_json(body: &[u8]) -> Result<Self, FieldError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self {
                amount_cents: None,
                reason: None,
                description: None,
            });
        }
        let raw: RawRefundRequest = from_json_object(body)?;
        let reason = match raw.reason.as_deref() {
            None => None,
            Some(r) => Some(RefundReason::parse(r).ok_or_else(|| {
                FieldError::new(
                    "reason",
                    "must be one of requested_by_customer, duplicate, fraudulent, other",
                )
            })?),
        };
        Ok(Self {
            amount_cents: raw.amount_cents.map(AmountCents::parse).transpose()?,
            reason,
            description: raw.description.map(Description::parse).transpose()?,
        })
    }

    /// The names of the fields in which `self` differs from `other`.
    pub fn differing_fields(&self, other: &RefundRequest) -> Vec<&'static str> {
        let mut fields = Vec::new();
        if self.amount_cents != other.amount_cents {
            fields.push("amount_cents");
        }
        if self.reason != other.reason {
            fields.push("reason");
        }
        if self.description != other.description {
            fields.push("description");
        }
        fields
    }
}

/// One intent to refund a charge: the charge, and what the client asked.
/// What the engine runs under a refund's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundIntent {
    pub charge_id: ChargeId,
    pub request: RefundRequest,
}

impl RefundIntent {
    /// The intent that made `refund`, as near as the refund tells it: its
    /// amount is the one reserved, which a request without an amount did not
    /// name.
    pub fn of(refund: &Refund) -> Self {
        Self {
            charge_id: refund.charge_id.clone(),
            request: RefundRequest {
                amount_cents: Some(refund.amount_cents),
                reason: refund.reason,
                description: refund.description.clone(),
            },
        }
    }

    /// The names of the fields in which `self` differs from `other`.
    pub fn differing_fields(&self, other: &RefundIntent) -> Vec<&'static str> {
        let mut fields = Vec::new();
        if self.charge_id != other.charge_id {
            fields.push("charge_id");
        }
        fields.extend(self.request.differing_fields(&other.request));
        fields
    }
}

/// Where a refund is in its life. Only `pending` ever changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum RefundStatus {
    /// Claimed, its amount reserved against the charge; the acquirer's outcome
    /// is not yet known.
    Pending,
    /// The acquirer paid the money back.
    Succeeded,
    /// The acquirer refused it for good; no money moved, and its amount is
    /// the charge's to refund again.
    Failed,
}

impl RefundStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => Self::Pending,
            "succeeded" => Self::Succeeded,
            "failed" => Self::Failed,
            _ => return None,
        })
    }
}

/// A refund as the API shows it (`GET /v1/refunds/{id}` and the stored
/// responses). Every field is always present (`null` when it does not apply).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Refund {
    #[serde(serialize_with = "display")]
    pub id: RefundId,
    #[serde(serialize_with = "display")]
    pub charge_id: ChargeId,
    pub amount_cents: AmountCents,
    pub currency: Currency,
    pub status: RefundStatus,
    #[schema(required = true)]
    pub reason: Option<RefundReason>,
    #[schema(required = true, value_type = Option<Description>)]
    pub description: Option<Description>,
    /// The refund's own reference at the acquirer, the same on every call.
    #[serde(serialize_with = "reference")]
    #[schema(value_type = String)]
    pub acquirer_reference: AcquirerReference,
    /// The acquirer's reason when `status` is `failed`, else `null`.
    #[schema(required = true)]
    pub failure_reason: Option<String>,
    /// When the refund was claimed, UTC, to the second.
    #[serde(serialize_with = "rfc3339_seconds")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: DateTime<Utc>,
    /// The charge's reference: the capture the acquirer refunds from.
    #[serde(skip)]
    pub capture_reference: AcquirerReference,
}

fn display<S: Serializer, T: std::fmt::Display>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

fn reference<S: Serializer>(r: &AcquirerReference, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(r.as_str())
}

fn rfc3339_seconds<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&t.to_rfc3339_opts(SecondsFormat::Secs, true))
}

/// The refund of `charge`'s request as the fingerprint sees it: the refunded
/// charge is part of the request, so one key sent to refunds of two charges
/// is two requests.
#[derive(Serialize)]
pub(super) struct RefundOfCharge<'a> {
    pub(super) charge_id: &'a str,
    #[serde(flatten)]
    pub(super) request: &'a RefundRequest,
}

impl<'a> RefundOfCharge<'a> {
    pub(super) fn new(charge_id: &'a ChargeId, request: &'a RefundRequest) -> Self {
        Self {
            charge_id: charge_id.as_str(),
            request,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<RefundRequest, FieldError> {
        RefundRequest::from_json(body.as_bytes())
    }

    #[test]
    fn every_field_is_optional_and_an_empty_body_refunds_what_remains() {
        for body in ["", "  ", "{}", r#"{"amount_cents": null}"#] {
            let r = parse(body).unwrap_or_else(|e| panic!("{body:?}: {e}"));
            assert_eq!(r.amount_cents, None, "{body:?}");
        }
        let r = parse(r#"{"amount_cents": 1000, "reason": "duplicate", "description": "x"}"#)
            .expect("a full refund request");
        assert_eq!(r.amount_cents.map(AmountCents::get), Some(1000));
        assert_eq!(r.reason, Some(RefundReason::Duplicate));
    }

    #[test]
    fn each_bad_field_is_named() {
        for (body, field) in [
            (r#"{"amount_cents": 0}"#, "amount_cents"),
            (r#"{"amount_cents": -5}"#, "amount_cents"),
            (r#"{"amount_cents": 10000000001}"#, "amount_cents"),
            (r#"{"amount_cents": 1.5}"#, "amount_cents"),
            (r#"{"amount_cents": "10"}"#, "amount_cents"),
            (r#"{"reason": "because"}"#, "reason"),
            (r#"{"description": "a\u0000b"}"#, "description"),
        ] {
            let e = parse(body).expect_err(body);
            assert_eq!(e.field.as_deref(), Some(field), "{body}: {e}");
        }
        for body in [r#"{"amount": 1}"#, "{}{}", "[]", "{"] {
            assert!(parse(body).is_err(), "{body}");
        }
    }

    #[test]
    fn ids_have_one_shape() {
        let id = RefundId::generate();
        assert!(id.as_str().starts_with("re_"));
        assert_eq!(RefundId::parse(id.as_str()), Some(id));
        assert_eq!(RefundId::parse("re_short"), None);
        assert_eq!(RefundId::parse(ChargeId::generate().as_str()), None);
    }
}

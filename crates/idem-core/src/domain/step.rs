//! The steps of a two-step payment: a capture of an authorized charge, in
//! part or whole, and a void that releases what it still holds.
//!
//! A step is an operation on a charge as a refund is (its own key, its own
//! reference at the acquirer, a reservation against the charge decided by the
//! store before the call); what lives here is what a step *is*: its request,
//! its values, and how the API shows it.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize, Serializer};
use utoipa::openapi::{ObjectBuilder, RefOr, Schema, Type};
use utoipa::{PartialSchema, ToSchema};

use super::charge::{from_json_object, AmountCents, Currency, FieldError};
use super::{AcquirerReference, ChargeId};

/// The key of the void that expires an authorization past its time:
/// this prefix and the charge's id, one key per charge, whichever instance's
/// workers send it.
pub const EXPIRY_KEY_PREFIX: &str = "idem-expiry:";

/// What a step does to its authorization.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum StepKind {
    /// Takes part or all of what the authorization holds.
    Capture,
    /// Releases what it still holds, and closes it.
    Void,
}

impl StepKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Capture => "capture",
            Self::Void => "void",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "capture" => Self::Capture,
            "void" => Self::Void,
            _ => return None,
        })
    }

    /// The prefix of its public ids: `cp_`, `vd_`.
    pub fn prefix(self) -> &'static str {
        match self {
            Self::Capture => "cp_",
            Self::Void => "vd_",
        }
    }
}

/// The public id of a step, `cp_...` (a capture) or `vd_...` (a void).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StepId(String);

impl StepId {
    pub fn generate(kind: StepKind) -> Self {
        Self(super::ids::mint(kind.prefix()))
    }

    /// Accepts only ids of idem's own shape and of this kind (a malformed
    /// one is a plain 404).
    pub fn parse(s: &str, kind: StepKind) -> Option<Self> {
        super::ids::has_shape(s, kind.prefix()).then(|| Self(s.to_owned()))
    }

    /// Wraps a value read back from the store, where only valid ids are written.
    pub fn from_trusted(s: String) -> Self {
        Self(s)
    }

    /// Which kind of step the id names, by its prefix.
    pub fn kind(&self) -> StepKind {
        if self.0.starts_with(StepKind::Void.prefix()) {
            StepKind::Void
        } else {
            StepKind::Capture
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for StepId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialSchema for StepId {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(format!(
                "^(cp|vd)_[A-Za-z0-9]{{{}}}$",
                super::ids::RANDOM_LEN
            )))
            .description(Some(
                "The step's public id: `cp_...` for a capture, `vd_...` for a void.",
            ))
            .examples(["cp_7kLmQ2xZ9pR4tV8bN1cW6yHd"])
            .into()
    }
}
impl ToSchema for StepId {}

/// The wire shape of `POST /v1/charges/{id}/captures`, before validation.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(
    as = CaptureRequest,
    description = "A capture to make of an authorized charge. Every field is optional (an \
        empty body captures what remains and closes the authorization); unknown fields are \
        refused (`400 invalid-body`)."
)]
struct RawCaptureRequest {
    /// What to capture; absent or `null`: all the authorization has left.
    #[schema(value_type = Option<AmountCents>)]
    amount_cents: Option<i64>,
    /// `true` (the default): this capture closes the authorization and
    /// releases what remains; `false` leaves the rest capturable.
    #[serde(rename = "final")]
    #[schema(default = true)]
    final_capture: Option<bool>,
}

/// One capture asked for, fully validated. Without an amount it captures
/// whatever the authorization has left when the capture is claimed.
///
/// Its serialized form is canonical: what the request fingerprint hashes,
/// with the charge it captures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CaptureRequest {
    pub amount_cents: Option<AmountCents>,
    #[serde(rename = "final")]
    pub final_capture: bool,
}

impl CaptureRequest {
    /// Parses a JSON body (one object, nothing after it but whitespace); an
    /// empty body is a final capture of what remains.
    pub fn from_json(body: &[u8]) -> Result<Self, FieldError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self {
                amount_cents: None,
                final_capture: true,
            });
        }
        let raw: RawCaptureRequest = from_json_object(body)?;
        Ok(Self {
            amount_cents: raw.amount_cents.map(AmountCents::parse).transpose()?,
            final_capture: raw.final_capture.unwrap_or(true),
        })
    }
}

impl PartialSchema for CaptureRequest {
    fn schema() -> RefOr<Schema> {
        RawCaptureRequest::schema()
    }
}
impl ToSchema for CaptureRequest {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        RawCaptureRequest::schemas(schemas);
    }
}

/// A void's body: nothing, or an empty object (a void names no amount: it
/// releases whatever the authorization still holds).
pub fn parse_void_body(body: &[u8]) -> Result<(), FieldError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(());
    }
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Empty {}
    from_json_object::<Empty>(body).map(|_| ())
}

/// One intent to capture a charge: the charge, and what the client asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureIntent {
    pub charge_id: ChargeId,
    pub request: CaptureRequest,
}

/// One intent to void a charge's authorization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VoidIntent {
    pub charge_id: ChargeId,
}

/// Where a step is in its life. Only `pending` ever changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum StepStatus {
    /// Claimed, its amount reserved against the authorization; the
    /// acquirer's outcome is not yet known.
    Pending,
    /// The acquirer did it.
    Succeeded,
    /// The acquirer refused it for good; nothing moved, and the reservation
    /// is the authorization's again.
    Failed,
}

impl StepStatus {
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

/// A capture or a void as the API shows it (`GET /v1/captures/{id}`,
/// `GET /v1/voids/{id}` and the stored responses). A void has no `final`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Step {
    #[serde(serialize_with = "display")]
    #[schema(value_type = StepId)]
    pub id: StepId,
    #[serde(serialize_with = "display")]
    #[schema(value_type = String)]
    pub charge_id: ChargeId,
    /// A capture's amount; a void's, what it released of the authorization.
    pub amount_cents: AmountCents,
    pub currency: Currency,
    /// A capture's: whether it closed the authorization (absent on a void).
    #[serde(rename = "final", skip_serializing_if = "Option::is_none")]
    pub final_capture: Option<bool>,
    pub status: StepStatus,
    /// The step's own reference at the acquirer, the same on every call.
    #[serde(serialize_with = "reference")]
    #[schema(value_type = String)]
    pub acquirer_reference: AcquirerReference,
    /// The acquirer's reason when `status` is `failed`, else `null`.
    #[schema(required = true)]
    pub failure_reason: Option<String>,
    /// When the step was claimed, UTC, to the second.
    #[serde(serialize_with = "rfc3339_seconds")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: DateTime<Utc>,
    /// The charge's reference: the authorization the step acts on.
    #[serde(skip)]
    pub authorization_reference: AcquirerReference,
}

impl Step {
    pub fn kind(&self) -> StepKind {
        self.id.kind()
    }
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

/// A step's request as the fingerprint sees it: its charge is part of it, so
/// one key sent to captures of two charges is two requests.
#[derive(Serialize)]
pub(super) struct StepOfCharge<'a> {
    pub(super) charge_id: &'a str,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub(super) capture: Option<&'a CaptureRequest>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<CaptureRequest, FieldError> {
        CaptureRequest::from_json(body.as_bytes())
    }

    #[test]
    fn an_empty_capture_is_final_and_takes_what_remains() {
        for body in ["", " ", "{}", r#"{"amount_cents": null}"#] {
            let r = parse(body).unwrap_or_else(|e| panic!("{body:?}: {e}"));
            assert_eq!(r.amount_cents, None, "{body:?}");
            assert!(r.final_capture, "{body:?}");
        }
        let r = parse(r#"{"amount_cents": 10, "final": false}"#).expect("a partial capture");
        assert_eq!(r.amount_cents.map(AmountCents::get), Some(10));
        assert!(!r.final_capture);
    }

    #[test]
    fn each_bad_field_is_named() {
        for (body, field) in [
            (r#"{"amount_cents": 0}"#, "amount_cents"),
            (r#"{"amount_cents": 1.5}"#, "amount_cents"),
            (r#"{"final": "yes"}"#, "final"),
        ] {
            let e = parse(body).expect_err(body);
            assert_eq!(e.field.as_deref(), Some(field), "{body}: {e}");
        }
        for body in [r#"{"amount": 1}"#, "{}{}", "[]", "{"] {
            assert!(parse(body).is_err(), "{body}");
        }
        assert!(parse_void_body(b"").is_ok());
        assert!(parse_void_body(b"{}").is_ok());
        assert!(parse_void_body(br#"{"amount_cents": 1}"#).is_err());
    }

    #[test]
    fn ids_name_their_kind() {
        let capture = StepId::generate(StepKind::Capture);
        let void = StepId::generate(StepKind::Void);
        assert_eq!(capture.kind(), StepKind::Capture);
        assert_eq!(void.kind(), StepKind::Void);
        assert_eq!(
            StepId::parse(capture.as_str(), StepKind::Capture),
            Some(capture.clone())
        );
        assert_eq!(StepId::parse(capture.as_str(), StepKind::Void), None);
    }
}

//! A charge request as parsed from a client, and a charge as shown back to it.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize, Serializer};
use utoipa::openapi::{KnownFormat, ObjectBuilder, RefOr, Schema, SchemaFormat, Type};
use utoipa::{PartialSchema, ToSchema};

use super::{AcquirerReference, ChargeId};

/// Why a request body was refused, naming the field when there is one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", field.as_deref().map(|f| format!("{f}: ")).unwrap_or_default())]
pub struct FieldError {
    pub field: Option<String>,
    pub message: String,
}

impl FieldError {
    pub(super) fn new(field: &str, message: impl Into<String>) -> Self {
        Self {
            field: Some(field.to_owned()),
            message: message.into(),
        }
    }
}

/// The merchant's order number: a positive `i64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct OrderId(i64);

impl OrderId {
    pub fn parse(value: i64) -> Result<Self, FieldError> {
        if value >= 1 {
            Ok(Self(value))
        } else {
            Err(FieldError::new("order_id", "must be a positive integer"))
        }
    }

    pub fn get(self) -> i64 {
        self.0
    }
}

/// An amount in the currency's minor unit, `1 ..= 10_000_000_000`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct AmountCents(i64);

impl AmountCents {
    /// The contract's ceiling (R$ 100 million): larger is a typo, not a charge.
    pub const MAX: i64 = 10_000_000_000;

    pub fn parse(value: i64) -> Result<Self, FieldError> {
        if (1..=Self::MAX).contains(&value) {
            Ok(Self(value))
        } else {
            Err(FieldError::new(
                "amount_cents",
                format!("must be an integer from 1 to {}", Self::MAX),
            ))
        }
    }

    pub fn get(self) -> i64 {
        self.0
    }
}

/// An ISO 4217 alpha-3 code, upper case.
///
/// The shape is checked, not membership in the ISO list: the acquirer is the
/// authority on which currencies it settles, and it declines the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Currency([u8; 3]);

impl Currency {
    /// The article's currency, and the contract's default when none is sent.
    pub const BRL: Currency = Currency(*b"BRL");

    pub fn parse(value: &str) -> Result<Self, FieldError> {
        match value.as_bytes() {
            &[a, b, c] if [a, b, c].iter().all(u8::is_ascii_uppercase) => Ok(Self([a, b, c])),
            _ => Err(FieldError::new(
                "currency",
                "must be an ISO 4217 alpha-3 code in upper case, such as \"BRL\"",
            )),
        }
    }

    pub fn as_str(&self) -> &str {
        // Only ASCII upper-case letters are ever stored.
        std::str::from_utf8(&self.0).unwrap_or("???")
    }
}

impl Serialize for Currency {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// A free-text note for the merchant's own records.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct Description(String);

impl Description {
    /// Long enough for any order summary, short enough that a stored key stays small.
    pub const MAX_CHARS: usize = 500;

    pub fn parse(value: String) -> Result<Self, FieldError> {
        if value.chars().count() > Self::MAX_CHARS {
            return Err(FieldError::new(
                "description",
                format!("must be at most {} characters", Self::MAX_CHARS),
            ));
        }
        if value.chars().any(char::is_control) {
            return Err(FieldError::new(
                "description",
                "must not contain control characters",
            ));
        }
        Ok(Self(value))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The wire shape of `POST /v1/charges`, before validation. Its schema is the
/// request body's in the OpenAPI document, each field with the limits its
/// `parse` enforces; unknown fields are refused (`additionalProperties: false`).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(
    as = ChargeRequest,
    description = "A charge to make. Unknown fields are refused (`400 invalid-body`)."
)]
struct RawChargeRequest {
    #[schema(value_type = OrderId)]
    order_id: i64,
    #[schema(value_type = AmountCents)]
    amount_cents: i64,
    /// `BRL` when absent or `null`.
    #[schema(value_type = Option<Currency>, default = "BRL")]
    currency: Option<String>,
    #[schema(value_type = Option<Description>)]
    description: Option<String>,
    /// `true` (the default): the charge is captured at once. `false`: it is
    /// only authorized (the amount held on the card), to be captured later
    /// (`POST /v1/charges/{id}/captures`) or released
    /// (`POST /v1/charges/{id}/void`).
    #[schema(default = true)]
    capture: Option<bool>,
}

/// One intent to charge, fully validated.
///
/// Its serialized form is canonical (fixed field order, the default currency
/// filled in), which is what the request fingerprint hashes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChargeRequest {
    pub order_id: OrderId,
    pub amount_cents: AmountCents,
    pub currency: Currency,
    pub description: Option<Description>,
    /// Captured at once (the default) or only authorized. Left out of the
    /// canonical form when `true`, so a one-step charge's fingerprint is what
    /// it always was.
    #[serde(skip_serializing_if = "is_true")]
    pub capture: bool,
}

fn is_true(b: &bool) -> bool {
    *b
}

impl ChargeRequest {
    /// Parses a JSON body: one JSON object and nothing after it but
    /// whitespace. Every error names the field it is about.
    pub fn from_json(body: &[u8]) -> Result<Self, FieldError> {
        let raw: RawChargeRequest = from_json_object(body)?;
        Ok(Self {
            order_id: OrderId::parse(raw.order_id)?,
            amount_cents: AmountCents::parse(raw.amount_cents)?,
            currency: match raw.currency {
                Some(c) => Currency::parse(&c)?,
                None => Currency::BRL,
            },
            description: raw.description.map(Description::parse).transpose()?,
            capture: raw.capture.unwrap_or(true),
        })
    }

    /// The names of the fields in which `self` differs from `other`.
    pub fn differing_fields(&self, other: &ChargeRequest) -> Vec<&'static str> {
        let mut fields = Vec::new();
        if self.order_id != other.order_id {
            fields.push("order_id");
        }
        if self.amount_cents != other.amount_cents {
            fields.push("amount_cents");
        }
        if self.currency != other.currency {
            fields.push("currency");
        }
        if self.description != other.description {
            fields.push("description");
        }
        if self.capture != other.capture {
            fields.push("capture");
        }
        fields
    }
}

/// A request body's one JSON object, with nothing after it but whitespace;
/// an error names the field it is about.
///
/// `deserialize` stops at the end of the object, so `de.end()` is what
/// refuses `{...}garbage` and `{...}{...}` (`serde_json::from_slice` makes
/// the same call; going through `serde_path_to_error` skipped it).
pub(super) fn from_json_object<T: serde::de::DeserializeOwned>(
    body: &[u8],
) -> Result<T, FieldError> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    let raw: T = serde_path_to_error::deserialize(&mut *de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        FieldError {
            field: (path != ".").then_some(path),
            message: json_message(&inner),
        }
    })?;
    de.end().map_err(|e| FieldError {
        field: None,
        message: json_message(&e),
    })?;
    Ok(raw)
}

/// serde_json's message without its "at line 1 column 7" tail when that adds nothing.
fn json_message(e: &serde_json::Error) -> String {
    let text = e.to_string();
    if e.line() == 0 {
        return text;
    }
    match text.rfind(" at line ") {
        Some(i) if e.is_data() => text[..i].to_owned(),
        _ => text,
    }
}

/// Where a charge is in its life. Only `processing` and `authorized` ever
/// change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ChargeStatus {
    /// Claimed; the acquirer's outcome is not yet known.
    Processing,
    /// The acquirer moved the money.
    Captured,
    /// The acquirer refused; no money moved.
    Declined,
    /// The acquirer rejected the request itself (not a decline); no money moved.
    Failed,
    /// Authorized only (`"capture": false`): the amount is held on the card,
    /// to be captured or voided.
    Authorized,
    /// The authorization was voided with nothing captured; no money moved.
    Voided,
}

impl ChargeStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Processing => "processing",
            Self::Captured => "captured",
            Self::Declined => "declined",
            Self::Failed => "failed",
            Self::Authorized => "authorized",
            Self::Voided => "voided",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "processing" => Self::Processing,
            "captured" => Self::Captured,
            "declined" => Self::Declined,
            "failed" => Self::Failed,
            "authorized" => Self::Authorized,
            "voided" => Self::Voided,
            _ => return None,
        })
    }
}

/// A charge as the API shows it (`GET /v1/charges/{id}` and the stored responses).
///
/// Every field is always present; clients should ignore fields they do not know,
/// so the schema leaves room for new ones.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Charge {
    #[serde(serialize_with = "as_str")]
    pub id: ChargeId,
    pub order_id: OrderId,
    pub amount_cents: AmountCents,
    pub currency: Currency,
    pub status: ChargeStatus,
    #[serde(serialize_with = "as_str_ref")]
    pub acquirer_reference: AcquirerReference,
    /// The acquirer's reason when `status` is `declined`, else `null`.
    #[schema(required = true)]
    pub decline_reason: Option<String>,
    /// When the charge was claimed, UTC, to the second.
    #[serde(serialize_with = "rfc3339_seconds")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: DateTime<Utc>,
    #[serde(skip)]
    pub description: Option<Description>,
    /// A two-step charge's captures (absent on a one-step charge).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    #[schema(inline, value_type = Authorization)]
    pub authorization: Option<Authorization>,
}

/// What a two-step charge (`"capture": false`) has captured, and what it can
/// still capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct Authorization {
    /// The sum of its captures made (a two-step charge only).
    #[schema(required = false)]
    pub amount_captured_cents: i64,
    /// What a capture may still take: the authorized amount less the
    /// captures made or pending; 0 once the authorization is closed (a final
    /// capture, a void, expiry). A two-step charge only.
    #[schema(required = false)]
    pub amount_capturable_cents: i64,
}

impl Authorization {
    /// A new authorization of `amount`: nothing captured yet.
    pub fn new(amount: AmountCents) -> Self {
        Self {
            amount_captured_cents: 0,
            amount_capturable_cents: amount.get(),
        }
    }
}

impl Charge {
    /// The request this charge was created from, to compare a reused key against.
    pub fn request(&self) -> ChargeRequest {
        ChargeRequest {
            order_id: self.order_id,
            amount_cents: self.amount_cents,
            currency: self.currency,
            description: self.description.clone(),
            capture: self.authorization.is_none(),
        }
    }
}

fn as_str<S: Serializer>(id: &ChargeId, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(id.as_str())
}

fn as_str_ref<S: Serializer>(r: &AcquirerReference, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(r.as_str())
}

fn rfc3339_seconds<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&t.to_rfc3339_opts(SecondsFormat::Secs, true))
}

// The OpenAPI schemas of the values, beside the `parse` whose limits they state.

impl PartialSchema for OrderId {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
            .minimum(Some(1))
            .maximum(Some(i64::MAX))
            .description(Some(
                "The merchant's order number, a positive 64-bit integer.",
            ))
            .examples([123])
            .into()
    }
}
impl ToSchema for OrderId {}

impl PartialSchema for AmountCents {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
            .minimum(Some(1))
            .maximum(Some(Self::MAX))
            .description(Some(
                "The amount in the currency's minor unit (cents), written as a JSON integer \
                 (`25000`, not `25000.0` or `2.5e4`).",
            ))
            .examples([25000])
            .into()
    }
}
impl ToSchema for AmountCents {}

impl PartialSchema for Currency {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some("^[A-Z]{3}$"))
            .description(Some(
                "An ISO 4217 alpha-3 code in upper case. Only the shape is checked; \
                 the acquirer declines currencies it does not settle.",
            ))
            .examples(["BRL"])
            .into()
    }
}
impl ToSchema for Currency {}

impl PartialSchema for Description {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .max_length(Some(Self::MAX_CHARS))
            // `char::is_control`: the C0 and C1 controls and DEL.
            .pattern(Some("^[^\\u0000-\\u001F\\u007F-\\u009F]*$"))
            .description(Some(format!(
                "A note for the merchant's own records: at most {} characters, no control characters.",
                Self::MAX_CHARS
            )))
            .into()
    }
}
impl ToSchema for Description {}

/// The request body's schema is that of its wire shape.
impl PartialSchema for ChargeRequest {
    fn schema() -> RefOr<Schema> {
        RawChargeRequest::schema()
    }
}
impl ToSchema for ChargeRequest {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        RawChargeRequest::schemas(schemas);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<ChargeRequest, FieldError> {
        ChargeRequest::from_json(body.as_bytes())
    }

    #[test]
    fn parses_the_articles_charge_with_default_currency() {
        let r = parse(r#"{"order_id": 123, "amount_cents": 25000}"#).unwrap();
        assert_eq!(r.order_id.get(), 123);
        assert_eq!(r.amount_cents.get(), 25000);
        assert_eq!(r.currency, Currency::BRL);
        assert_eq!(r.description, None);
    }

    #[test]
    fn every_bad_field_is_named() {
        let cases = [
            (r#"{"order_id": 0, "amount_cents": 1}"#, Some("order_id")),
            (r#"{"order_id": -5, "amount_cents": 1}"#, Some("order_id")),
            (
                r#"{"order_id": 1, "amount_cents": 0}"#,
                Some("amount_cents"),
            ),
            (
                r#"{"order_id": 1, "amount_cents": -1}"#,
                Some("amount_cents"),
            ),
            (
                r#"{"order_id": 1, "amount_cents": 10000000001}"#,
                Some("amount_cents"),
            ),
            (
                r#"{"order_id": 1, "amount_cents": 2.5}"#,
                Some("amount_cents"),
            ),
            (
                r#"{"order_id": 1, "amount_cents": "250"}"#,
                Some("amount_cents"),
            ),
            (
                r#"{"order_id": 1, "amount_cents": 1, "currency": "brl"}"#,
                Some("currency"),
            ),
            (
                r#"{"order_id": 1, "amount_cents": 1, "currency": "BRLX"}"#,
                Some("currency"),
            ),
            (
                r#"{"order_id": 1, "amount_cents": 1, "currency": 986}"#,
                Some("currency"),
            ),
            (r#"{"order_id": "1", "amount_cents": 1}"#, Some("order_id")),
        ];
        for (body, field) in cases {
            let err = parse(body).unwrap_err();
            assert_eq!(err.field.as_deref(), field, "{body}: {err}");
        }
    }

    #[test]
    fn unknown_and_missing_fields_are_named_in_the_message() {
        let err = parse(r#"{"order_id": 1, "amount_cents": 1, "amount": 2}"#).unwrap_err();
        assert!(err.to_string().contains("amount"), "{err}");
        let err = parse(r#"{"amount_cents": 1}"#).unwrap_err();
        assert!(err.to_string().contains("order_id"), "{err}");
    }

    #[test]
    fn bad_json_is_an_error() {
        for body in ["", "{", "[]", "null", r#"{"order_id": 1,}"#] {
            assert!(parse(body).is_err(), "{body}");
        }
    }

    #[test]
    fn anything_after_the_object_but_whitespace_is_an_error() {
        let good = r#"{"order_id": 1, "amount_cents": 1}"#;
        assert!(parse(&format!("{good} \n\t")).is_ok());
        for tail in ["garbage", "{}", good, "]", "x", "\u{0}"] {
            let err = parse(&format!("{good}{tail}")).unwrap_err();
            assert_eq!(err.field, None, "{tail:?}: {err}");
            assert!(err.message.contains("trailing"), "{tail:?}: {err}");
        }
    }

    #[test]
    fn differing_fields_lists_exactly_the_changes() {
        let a = parse(r#"{"order_id": 1, "amount_cents": 100}"#).unwrap();
        let b = parse(r#"{"order_id": 1, "amount_cents": 200, "currency": "USD"}"#).unwrap();
        assert_eq!(a.differing_fields(&b), vec!["amount_cents", "currency"]);
        assert!(a.differing_fields(&a).is_empty());
    }
}

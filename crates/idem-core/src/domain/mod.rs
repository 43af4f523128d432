//! The charge domain: the values a charge is made of, each a type that can only
//! hold a valid value (parse, don't validate), and the charge itself as clients see it.
//!
//! Nothing here knows about HTTP, SQL or the acquirer; those layers convert to and
//! from these types at their edge. What the domain does own is its values' JSON
//! shape: their serde form, and the JSON Schema (utoipa's `ToSchema`) that
//! states each value's limits beside the `parse` that enforces them, so the two
//! cannot drift apart. The API's own document (paths, headers, problem bodies)
//! is `http`'s.

mod charge;
mod event;
mod fingerprint;
mod ids;
mod key;
mod merchant;
mod refund;
mod response;
mod step;
mod subject;
mod webhook;

pub use charge::{
    AmountCents, Authorization, Charge, ChargeRequest, ChargeStatus, Currency, Description,
    FieldError, OrderId,
};
pub use event::{ChargeEvent, EventType, EVENTS_EXCHANGE};
pub use fingerprint::Fingerprint;
pub use ids::{AcquirerReference, ChargeId, EndpointId, MessageId};
pub use key::{IdempotencyKey, KeyError};
pub use merchant::{parse_merchant_name, Merchant, MerchantSecret, SecretHash};
pub use refund::{Refund, RefundId, RefundIntent, RefundReason, RefundRequest, RefundStatus};
pub use response::StoredResponse;
pub use step::{
    parse_void_body, CaptureIntent, CaptureRequest, Step, StepId, StepKind, StepStatus, VoidIntent,
    EXPIRY_KEY_PREFIX,
};
pub use subject::SubjectId;
pub use webhook::{signature_header, WebhookBody, WebhookEvent, WebhookSecret};

/// The JSON of a domain value: a stored response's body, an event, a
/// fingerprint's canonical form. serde_json fails only on a map with
/// non-string keys or a `Serialize` impl that returns an error, and the types
/// here have neither (plain strings, numbers, options, and formatting of
/// their own that cannot fail), so a failure is a bug to stop at, never an
/// empty body to store, publish or hash.
pub fn to_json<T: serde::Serialize + ?Sized>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("domain values serialize without error")
}

//! Identifiers idem mints: the public charge id, the acquirer reference, and the
//! ids of the messages it publishes.
//!
//! The charge id and the message ids are random, so they reveal nothing and
//! never collide across merchants. The acquirer reference is derived from the
//! intent instead (see [`AcquirerReference::for_intent`]), so that a claim
//! lost by the database can only ever be re-made under the same reference.

use rand::distr::{Alphanumeric, SampleString};
use sha2::{Digest, Sha256};
use utoipa::openapi::{ObjectBuilder, RefOr, Schema, Type};
use utoipa::{PartialSchema, ToSchema};

use super::{Fingerprint, IdempotencyKey};

/// Random characters after the prefix: 24 alphanumerics are ~142 bits, far beyond
/// any chance of collision, and short enough to read in a log line.
pub(super) const RANDOM_LEN: usize = 24;

pub(super) fn mint(prefix: &str) -> String {
    let random = Alphanumeric.sample_string(&mut rand::rng(), RANDOM_LEN);
    format!("{prefix}{random}")
}

/// Whether `s` is an id [`mint`] makes with `prefix`.
pub(super) fn has_shape(s: &str, prefix: &str) -> bool {
    s.strip_prefix(prefix).is_some_and(|rest| {
        rest.len() == RANDOM_LEN && rest.bytes().all(|b| b.is_ascii_alphanumeric())
    })
}

/// The public id of a charge, `ch_...`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ChargeId(String);

impl ChargeId {
    pub const PREFIX: &'static str = "ch_";

    pub fn generate() -> Self {
        Self(mint(Self::PREFIX))
    }

    /// Accepts only ids of idem's own shape, so a malformed path segment is a
    /// plain 404 without a query.
    pub fn parse(s: &str) -> Option<Self> {
        has_shape(s, Self::PREFIX).then(|| Self(s.to_owned()))
    }

    /// Wraps a value read back from the store, where only valid ids are written.
    pub fn from_trusted(s: String) -> Self {
        Self(s)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ChargeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The reference idem sends to the acquirer for one charge, `ref_...`.
///
/// Made when the charge is claimed, stored before the first call, and sent
/// unchanged on every later call: the acquirer deduplicates by it, which is what
/// makes a re-drive after a crash or timeout unable to move money twice.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AcquirerReference(String);

impl AcquirerReference {
    /// Domain separation: this hash is a reference, version 1, and nothing else.
    const TAG: &'static [u8] = b"idem acquirer reference v1\n";

    /// The reference of one intent: `ref_` and the first 128 bits, in hex, of
    /// SHA-256 over a tag, the merchant's id (8 bytes, big-endian), the key's
    /// length (8 bytes, big-endian) and bytes, and the request's fingerprint.
    ///
    /// The same intent always gets the same reference, whatever the database
    /// remembers: if a committed claim is lost (a failover that drops the last
    /// commits of an asynchronous replica, a restore from backup), the retry
    /// claims again and sends the reference the first attempt sent, and the
    /// acquirer's own deduplication answers with the first outcome instead of
    /// moving money again. Another request under the same key (a new intent
    /// after the key expired) has another fingerprint, so another reference.
    pub fn for_intent(merchant_id: i64, key: &IdempotencyKey, fingerprint: &Fingerprint) -> Self {
        let key = key.as_str().as_bytes();
        let mut hasher = Sha256::new();
        hasher.update(Self::TAG);
        hasher.update(merchant_id.to_be_bytes());
        hasher.update((key.len() as u64).to_be_bytes());
        hasher.update(key);
        hasher.update(fingerprint.as_bytes());
        let digest = hasher.finalize();
        let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        Self(format!("ref_{hex}"))
    }

    /// A random reference, for the demo's teaching strategies, which have no
    /// idempotency key.
    pub fn generate() -> Self {
        Self(mint("ref_"))
    }

    pub fn from_trusted(s: String) -> Self {
        Self(s)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The AMQP `message_id` of a message idem publishes: `evt_...` for a charge
/// event, `res_...` for a command's result. Unique per message, so a subscriber
/// that sees one twice (delivery is at-least-once) can drop the copy.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MessageId(String);

impl MessageId {
    pub fn event() -> Self {
        Self(mint("evt_"))
    }

    pub fn result() -> Self {
        Self(mint("res_"))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The id of a merchant's webhook endpoint, `we_...`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EndpointId(String);

impl EndpointId {
    pub fn generate() -> Self {
        Self(mint("we_"))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl PartialSchema for ChargeId {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(format!(
                "^{}[A-Za-z0-9]{{{RANDOM_LEN}}}$",
                Self::PREFIX
            )))
            .description(Some("The charge's public id."))
            .examples(["ch_4f9QzXk2LmP8rT1vWb6yNc3d"])
            .into()
    }
}
impl ToSchema for ChargeId {}

impl PartialSchema for AcquirerReference {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(
                "The reference idem sends the acquirer for this charge, the same on every call.",
            ))
            .into()
    }
}
impl ToSchema for AcquirerReference {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ChargeRequest;

    fn intent(merchant_id: i64, key: &str, body: &str) -> AcquirerReference {
        let key = IdempotencyKey::from_unquoted(key).unwrap();
        let request = ChargeRequest::from_json(body.as_bytes()).unwrap();
        AcquirerReference::for_intent(merchant_id, &key, &Fingerprint::of_charge(&request))
    }

    #[test]
    fn an_intent_always_gets_the_same_reference_and_the_derivation_never_changes() {
        let body = r#"{"order_id":123,"amount_cents":25000}"#;
        let a = intent(1, "order-123", body);
        assert_eq!(a, intent(1, "order-123", body));
        // Pinned: a deploy that changed the derivation would give a claim lost
        // before it a new reference, and the acquirer could charge twice.
        // (Computed independently from the documented formula, in Python.)
        assert_eq!(a.as_str(), "ref_548c1ec5ea695c2469185dfd194534fc");
    }

    #[test]
    fn another_merchant_key_or_request_is_another_reference() {
        let body = r#"{"order_id":123,"amount_cents":25000}"#;
        let a = intent(1, "order-123", body);
        assert_ne!(a, intent(2, "order-123", body));
        assert_ne!(a, intent(1, "order-124", body));
        assert_ne!(
            a,
            intent(1, "order-123", r#"{"order_id":123,"amount_cents":25001}"#)
        );
    }

    #[test]
    fn generated_ids_parse_back_and_differ() {
        let a = ChargeId::generate();
        let b = ChargeId::generate();
        assert_ne!(a, b);
        assert_eq!(ChargeId::parse(a.as_str()), Some(a));
    }

    #[test]
    fn foreign_ids_do_not_parse() {
        for bad in [
            "",
            "ch_",
            "ch_short",
            "xx_abcdefghijklmnopqrstuvwx",
            "ch_abcdefghijklmnopqrstuv-x",
        ] {
            assert_eq!(ChargeId::parse(bad), None, "{bad}");
        }
    }
}

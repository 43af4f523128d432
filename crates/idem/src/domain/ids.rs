//! Identifiers idem mints: the public charge id, the acquirer reference, and the
//! ids of the messages it publishes.
//!
//! Both are random (not derived from the key or the order) so they reveal nothing
//! and never collide across merchants.

use rand::distr::{Alphanumeric, SampleString};
use utoipa::openapi::{ObjectBuilder, RefOr, Schema, Type};
use utoipa::{PartialSchema, ToSchema};

/// Random characters after the prefix: 24 alphanumerics are ~142 bits, far beyond
/// any chance of collision, and short enough to read in a log line.
const RANDOM_LEN: usize = 24;

fn mint(prefix: &str) -> String {
    let random = Alphanumeric.sample_string(&mut rand::rng(), RANDOM_LEN);
    format!("{prefix}{random}")
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
        let rest = s.strip_prefix(Self::PREFIX)?;
        (rest.len() == RANDOM_LEN && rest.bytes().all(|b| b.is_ascii_alphanumeric()))
            .then(|| Self(s.to_owned()))
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
/// Chosen once when the charge is claimed, stored before the first call, and sent
/// unchanged on every later call: the acquirer deduplicates by it, which is what
/// makes a re-drive after a crash or timeout unable to move money twice.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AcquirerReference(String);

impl AcquirerReference {
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

//! The request fingerprint: what "the same request" means for a reused key.
//!
//! Same merchant (the key's scope), same method and path, and the same *parsed*
//! body: the hash covers the canonical serialization of [`ChargeRequest`], so
//! field order, whitespace and an omitted default currency never change it.

use sha2::{Digest, Sha256};

use crate::domain::ChargeRequest;

/// SHA-256 of the operation and its canonical parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The only idempotent operation; part of the hash so that a future one can
    /// never be confused with it under the same key.
    const OPERATION: &'static [u8] = b"POST /v1/charges\n";

    pub fn of_charge(request: &ChargeRequest) -> Self {
        let canonical = serde_json::to_vec(request).unwrap_or_default();
        let mut hasher = Sha256::new();
        hasher.update(Self::OPERATION);
        hasher.update(&canonical);
        Self(hasher.finalize().into())
    }

    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(body: &str) -> Fingerprint {
        Fingerprint::of_charge(&ChargeRequest::from_json(body.as_bytes()).unwrap())
    }

    #[test]
    fn layout_and_default_currency_do_not_matter() {
        let a = fp(r#"{"order_id":123,"amount_cents":25000}"#);
        let b = fp(r#"{ "amount_cents" : 25000,
                        "currency": "BRL", "order_id": 123 }"#);
        assert_eq!(a, b);
    }

    #[test]
    fn any_field_change_does() {
        let base = fp(r#"{"order_id":123,"amount_cents":25000}"#);
        for other in [
            r#"{"order_id":124,"amount_cents":25000}"#,
            r#"{"order_id":123,"amount_cents":25001}"#,
            r#"{"order_id":123,"amount_cents":25000,"currency":"USD"}"#,
            r#"{"order_id":123,"amount_cents":25000,"description":"x"}"#,
        ] {
            assert_ne!(base, fp(other), "{other}");
        }
    }
}

//! Merchants (tenants) and their bearer secrets.
//!
//! A secret is 190 random bits, so a single SHA-256 is the right hash: slow
//! password hashes exist to stretch guessable secrets, and this one is not
//! guessable. The hash is what the store indexes; the secret is shown once.

use rand::distr::{Alphanumeric, SampleString};
use sha2::{Digest, Sha256};

/// Characters after the `sk_` prefix: 32 alphanumerics are ~190 bits.
const SECRET_RANDOM_LEN: usize = 32;

/// A merchant as the rest of the service knows it once authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Merchant {
    /// The store's id; every key and charge is scoped by it.
    pub id: i64,
    /// Sent to the acquirer as `merchant`.
    pub name: String,
}

/// A merchant's name: 1..=100 characters, no control characters.
pub fn parse_merchant_name(name: &str) -> Result<&str, &'static str> {
    let n = name.chars().count();
    if n == 0 || n > 100 {
        Err("a merchant name is 1 to 100 characters")
    } else if name.chars().any(char::is_control) {
        Err("a merchant name has no control characters")
    } else {
        Ok(name)
    }
}

/// A freshly minted bearer secret. Not `Debug`, so it cannot reach a log by accident.
pub struct MerchantSecret(String);

impl MerchantSecret {
    pub fn generate() -> Self {
        Self(format!(
            "sk_{}",
            Alphanumeric.sample_string(&mut rand::rng(), SECRET_RANDOM_LEN)
        ))
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn hash(&self) -> SecretHash {
        SecretHash::of(self.0.as_bytes())
    }
}

/// SHA-256 of a presented or minted secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SecretHash([u8; 32]);

impl SecretHash {
    pub fn of(secret: &[u8]) -> Self {
        Self(Sha256::digest(secret).into())
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_distinct_and_hash_stably() {
        let a = MerchantSecret::generate();
        let b = MerchantSecret::generate();
        assert_ne!(a.expose(), b.expose());
        assert_eq!(a.hash(), SecretHash::of(a.expose().as_bytes()));
        assert_ne!(a.hash(), b.hash());
    }

    #[test]
    fn names_are_bounded() {
        assert!(parse_merchant_name("loja").is_ok());
        assert!(parse_merchant_name("").is_err());
        assert!(parse_merchant_name(&"x".repeat(101)).is_err());
        assert!(parse_merchant_name("a\nb").is_err());
    }
}

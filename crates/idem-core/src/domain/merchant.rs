//! Merchants and their bearer secrets. (The queue's messages name a merchant
//! `tenant`, the contract's word there; it is the same thing.)
//!
//! A merchant's name is a slug (`[a-z0-9._-]`, 1 to 100 bytes): it is also a
//! routing key on the broker (results go to `idem.results` under it), and a slug
//! is safe there, in logs and in URLs alike. Names stored before this rule (the
//! schema only bounds their length) still work; the outbox relay sets aside a
//! message whose routing key the broker cannot take (see `queue::relay`).
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

/// The longest merchant name, in bytes: the schema's bound, and well inside
/// AMQP's 255-byte routing keys.
pub const MERCHANT_NAME_MAX: usize = 100;

/// The rule, as `idem merchant create` states it when it refuses a name.
pub const MERCHANT_NAME_RULE: &str =
    "a merchant name is a slug: 1 to 100 of a-z, 0-9, '.', '_' and '-' \
     (it is also a routing key on the broker)";

/// A merchant's name: a slug, `[a-z0-9._-]`, 1..=[`MERCHANT_NAME_MAX`] bytes.
pub fn parse_merchant_name(name: &str) -> Result<&str, &'static str> {
    let slug = name
        .bytes()
        .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-'));
    if slug && (1..=MERCHANT_NAME_MAX).contains(&name.len()) {
        Ok(name)
    } else {
        Err(MERCHANT_NAME_RULE)
    }
}

/// A freshly minted bearer secret. Not `Debug`, so it cannot reach a log by accident.
pub struct MerchantSecret(String);

impl MerchantSecret {
    pub fn generate() -> Self {
        Self::with_prefix("sk_")
    }

    /// A token for the operator console (`idem admin token`): minted and
    /// hashed as a merchant's secret is, told apart by its prefix.
    pub fn admin_token() -> Self {
        Self::with_prefix("adm_")
    }

    fn with_prefix(prefix: &str) -> Self {
        Self(format!(
            "{prefix}{}",
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
    fn names_are_slugs_of_at_most_100_bytes() {
        for good in [
            "loja",
            "loja-a",
            "demo-check-then-act",
            "a.b_c-9",
            &"x".repeat(100),
        ] {
            assert_eq!(parse_merchant_name(good), Ok(good));
        }
        for bad in [
            "",
            &"x".repeat(101),
            "a\nb",
            "a\0b",
            "Loja",
            "loja centro",
            "caf\u{e9}",
            "a/b",
            "a*",
            "a#",
        ] {
            assert_eq!(parse_merchant_name(bad), Err(MERCHANT_NAME_RULE), "{bad:?}");
        }
    }
}

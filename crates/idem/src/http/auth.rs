//! Bearer authentication: `Authorization: Bearer <secret>` to a [`Merchant`].
//!
//! Positive answers are cached briefly ([`MerchantCache`]) so a request does
//! not pay a query for its merchant; unknown secrets are never cached, so a
//! merchant created a moment ago is accepted on its first request.

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;

use super::{ApiError, AppState};
use crate::domain::{Merchant, SecretHash};
use crate::store::MerchantCache;

/// Verified secrets by hash (positive answers only, for a minute).
pub type SecretCache = MerchantCache<SecretHash>;

/// The authenticated merchant of a `/v1` request.
pub struct Authenticated(pub Merchant);

impl FromRequestParts<AppState> for Authenticated {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let secret = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|v| bearer_secret(v.as_bytes()))
            .ok_or(ApiError::Unauthorized)?;
        let store = state.engine.store();
        let hash = SecretHash::of(secret);
        match state
            .merchants
            .get_or_load(&hash, || store.merchant_by_secret(&hash))
            .await?
        {
            Some(merchant) => {
                tracing::Span::current().record("merchant", merchant.name.as_str());
                Ok(Self(merchant))
            }
            None => Err(ApiError::Unauthorized),
        }
    }
}

/// The secret of a `Bearer` credential; the scheme is case-insensitive (RFC 9110).
fn bearer_secret(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let secret = rest.trim_ascii();
    (!secret.is_empty()).then_some(secret)
}

#[cfg(test)]
mod tests {
    use super::bearer_secret;

    #[test]
    fn parses_bearer_credentials() {
        assert_eq!(bearer_secret(b"Bearer sk_1"), Some(&b"sk_1"[..]));
        assert_eq!(bearer_secret(b"bearer  sk_1 "), Some(&b"sk_1"[..]));
        assert_eq!(bearer_secret(b"Basic abc"), None);
        assert_eq!(bearer_secret(b"Bearer "), None);
        assert_eq!(bearer_secret(b"Bearer"), None);
    }
}

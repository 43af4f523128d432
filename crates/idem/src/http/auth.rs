//! Bearer authentication: `Authorization: Bearer <secret>` to a [`Merchant`].
//!
//! A secret is looked up by its hash, and what the lookups cost is bounded so
//! that a flood of made-up secrets cannot take the database pool from real
//! merchants ([`SecretCache`]):
//!
//! - **Found** secrets are cached ([`MerchantCache`]) for up to a minute, and
//!   forgotten within about a second of a rotation, disable or enable on any
//!   instance, so a merchant's requests do not pay a query each. A secret
//!   once found is *known*: looking it up again when its entry is stale is
//!   never limited.
//! - **Refused** secrets are remembered for [`UNKNOWN_TTL`] (2 s), at most
//!   [`UNKNOWN_CAPACITY`] of them, so a client repeating a wrong secret costs
//!   one query per 2 s, not one per request.
//! - **Unknown** secrets (never found, not just refused) are looked up at most
//!   [`UNKNOWN_LOOKUPS`] at a time. A request that cannot get its turn within
//!   [`UNKNOWN_LOOKUP_WAIT`] is answered `503 overloaded` with `Retry-After`,
//!   never `401`: it may be a real merchant's first request.
//!
//! "A merchant created a moment ago is accepted on its first request" stays
//! true: a secret is made when its merchant is created, so no real secret can
//! have been refused, and remembered as refused, before it existed. What the
//! negative entries trade is the case of a secret refused and then made valid
//! (a merchant re-enabled): it stays refused for up to 2 s on an instance that
//! refused it. What the limit trades: during a flood, a merchant's *first*
//! request to an instance (before its secret is known there) waits its turn
//! among the flood's lookups, and may get a `503` to retry; merchants already
//! known to the instance are not slowed at all by the lookups, though a flood
//! larger than `--max-in-flight` still takes their places in flight (the cap
//! is counted before authentication) and gets some of them shed with `503`.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use tokio::sync::Semaphore;

use super::{ApiError, AppState};
use idem_core::domain::{Merchant, SecretHash};
use tokio_util::sync::CancellationToken;

use idem_core::store::{MerchantCache, Store, StoreError};

/// How long a refused secret is refused without asking the database: a client
/// retrying a wrong secret in a loop costs one query per 2 s per instance,
/// while a secret refused and then made valid is accepted 2 s later at most.
pub const UNKNOWN_TTL: Duration = Duration::from_secs(2);

/// Refused secrets remembered at once: about 1 MiB of hashes. Past it the
/// memory is cleared and starts over: a flood of ever-new secrets gains
/// nothing from it anyway, and repeated ones are back in it at once.
pub const UNKNOWN_CAPACITY: usize = 10_000;

/// Lookups of never-found secrets running at once, each holding one pooled
/// connection: two is an eighth of the default pool (16), so a flood of
/// made-up secrets leaves the rest to charges, and a lookup takes about a
/// millisecond, so two still clear hundreds of first requests a second.
pub const UNKNOWN_LOOKUPS: usize = 2;

/// How long a never-found secret waits for its turn to be looked up before
/// the request is answered `503`: a burst of real first requests (after a
/// deploy) clears in that time, while a flood's requests give up quickly and
/// free their place among the requests in flight.
pub const UNKNOWN_LOOKUP_WAIT: Duration = Duration::from_millis(250);

/// Secrets by hash: found ones, refused ones, and the turns to look up the rest.
#[derive(Clone)]
pub struct SecretCache {
    found: MerchantCache<SecretHash>,
    /// When each refused secret was refused. A std lock: never held across an await.
    refused: Arc<Mutex<HashMap<SecretHash, Instant>>>,
    lookups: Arc<Semaphore>,
    limits: UnknownLimits,
}

/// The limits on never-found secrets (the constants above, shorter in tests).
#[derive(Debug, Clone, Copy)]
struct UnknownLimits {
    ttl: Duration,
    capacity: usize,
    wait: Duration,
}

impl Default for SecretCache {
    fn default() -> Self {
        Self::with_limits(
            UNKNOWN_LOOKUPS,
            UnknownLimits {
                ttl: UNKNOWN_TTL,
                capacity: UNKNOWN_CAPACITY,
                wait: UNKNOWN_LOOKUP_WAIT,
            },
        )
    }
}

impl SecretCache {
    fn with_limits(lookups: usize, limits: UnknownLimits) -> Self {
        Self {
            found: MerchantCache::default(),
            refused: Arc::default(),
            lookups: Arc::new(Semaphore::new(lookups)),
            limits,
        }
    }

    /// The merchant whose secret hashes to `hash`, asking `load` only as the
    /// rules above allow. `Err(Overloaded)` when it was not its turn in time.
    pub async fn merchant<F, Fut>(
        &self,
        hash: &SecretHash,
        load: F,
    ) -> Result<Option<Merchant>, ApiError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Option<(Merchant, Option<Duration>)>, StoreError>>,
    {
        if self.found.knows(hash) {
            return Ok(self.found.get_or_load(hash, load).await?);
        }
        if self.recently_refused(hash) {
            return Ok(None);
        }
        let _turn = tokio::time::timeout(self.limits.wait, self.lookups.acquire())
            .await
            .map_err(|_| ApiError::Overloaded)?
            .map_err(|_| ApiError::Overloaded)?;
        // Another request may have settled it while this one waited.
        if self.recently_refused(hash) {
            return Ok(None);
        }
        let merchant = self.found.get_or_load(hash, load).await?;
        if merchant.is_none() {
            self.refuse(hash);
        }
        Ok(merchant)
    }

    /// Keeps the found secrets fresh until `shutdown` ([`MerchantCache::keep_fresh`]):
    /// without it, every request looks its secret up.
    pub async fn keep_fresh(self, store: Store, shutdown: CancellationToken) {
        self.found.keep_fresh(store, shutdown).await;
    }

    fn recently_refused(&self, hash: &SecretHash) -> bool {
        let refused = self.refused.lock().ok();
        refused
            .and_then(|r| r.get(hash).copied())
            .is_some_and(|at| at.elapsed() < self.limits.ttl)
    }

    fn refuse(&self, hash: &SecretHash) {
        if let Ok(mut refused) = self.refused.lock() {
            if refused.len() >= self.limits.capacity {
                refused.clear();
            }
            refused.insert(*hash, Instant::now());
        }
    }
}

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
        let store = &state.store;
        let hash = SecretHash::of(secret);
        match state
            .merchants
            .merchant(&hash, || async {
                let found = store.merchant_by_secret(&hash).await?;
                Ok(found.map(|m| (m.merchant, m.expires_in)))
            })
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
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn parses_bearer_credentials() {
        assert_eq!(bearer_secret(b"Bearer sk_1"), Some(&b"sk_1"[..]));
        assert_eq!(bearer_secret(b"bearer  sk_1 "), Some(&b"sk_1"[..]));
        assert_eq!(bearer_secret(b"Basic abc"), None);
        assert_eq!(bearer_secret(b"Bearer "), None);
        assert_eq!(bearer_secret(b"Bearer"), None);
    }

    fn cache(lookups: usize, capacity: usize) -> SecretCache {
        SecretCache::with_limits(
            lookups,
            UnknownLimits {
                ttl: Duration::from_millis(200),
                capacity,
                wait: Duration::from_millis(50),
            },
        )
    }

    fn merchant() -> Merchant {
        Merchant {
            id: 1,
            name: "loja".to_owned(),
        }
    }

    /// A loader that counts its calls and answers `found`.
    async fn lookup(
        cache: &SecretCache,
        secret: &str,
        calls: &AtomicUsize,
        found: bool,
    ) -> Result<Option<Merchant>, ApiError> {
        cache
            .merchant(&SecretHash::of(secret.as_bytes()), || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok(found.then(|| (merchant(), None)))
            })
            .await
    }

    #[tokio::test]
    async fn a_refused_secret_is_refused_from_memory_until_its_entry_expires() {
        let cache = cache(1, 100);
        let calls = AtomicUsize::new(0);
        for _ in 0..5 {
            assert!(lookup(&cache, "sk_wrong", &calls, false)
                .await
                .unwrap()
                .is_none());
        }
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "one query for five refusals"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
        // Valid now (say, re-enabled): found once the refusal has expired.
        assert!(lookup(&cache, "sk_wrong", &calls, true)
            .await
            .unwrap()
            .is_some());
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn the_memory_of_refusals_is_bounded() {
        let cache = cache(1, 3);
        let calls = AtomicUsize::new(0);
        for i in 0..10 {
            lookup(&cache, &format!("sk_{i}"), &calls, false)
                .await
                .unwrap();
            assert!(cache.refused.lock().unwrap().len() <= 3);
        }
    }

    #[tokio::test]
    async fn unknown_secrets_take_turns_but_known_ones_never_wait() {
        let cache = cache(1, 100);
        let calls = AtomicUsize::new(0);
        lookup(&cache, "sk_real", &calls, true).await.unwrap();
        // A lookup of an unknown secret that hangs holds the only turn.
        let hung = cache.clone();
        let holder = tokio::spawn(async move {
            hung.merchant(&SecretHash::of(b"sk_slow"), std::future::pending)
                .await
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let waited = lookup(&cache, "sk_other", &calls, false).await;
        assert!(
            matches!(waited, Err(ApiError::Overloaded)),
            "no turn in time: {waited:?}"
        );
        // The known merchant is not held up by the hung lookup.
        let known = lookup(&cache, "sk_real", &calls, true).await.unwrap();
        assert!(known.is_some());
        holder.abort();
    }
}
